//! ValidatingWebhookConfiguration and MutatingWebhookConfiguration: what kube-apiserver refuses
//! of them beyond their schema (`ValidateValidatingWebhookConfiguration`), and the warning that
//! gitplane calls no admission webhooks (its only writer is Git, checked by its schemas and its
//! built-in admission), so the configuration is stored and served but never consulted.

use super::{DnsName, Problem};
use serde_json::Value;
use std::collections::HashSet;

fn items(v: &Value) -> impl Iterator<Item = (usize, &Value)> {
    v.as_array().into_iter().flatten().enumerate()
}

/// `value` at `at` must be one of `allowed` when set.
fn one_of(value: &Value, at: String, allowed: &[&str], problems: &mut Vec<Problem>) {
    if let Some(v) = value.as_str()
        && !allowed.contains(&v)
    {
        let supported: Vec<String> = allowed.iter().map(|a| format!("{a:?}")).collect();
        problems.push(Problem::at(at, format!("Unsupported value: {v:?}: supported values: {}", supported.join(", "))));
    }
}

pub(super) fn problems(value: &Value, mutating: bool) -> Vec<Problem> {
    let mut problems = Vec::new();
    let mut names = HashSet::new();
    for (i, webhook) in items(&value["webhooks"]) {
        let at = format!("/webhooks/{i}");
        if let Some(name) = webhook["name"].as_str() {
            // Kubernetes: a fully qualified name (at least three segments), unique in the object.
            if DnsName::Subdomain.check(name).is_err() || name.split('.').count() < 3 {
                problems.push(Problem::at(
                    format!("{at}/name"),
                    format!(
                        "{name:?} is not a fully qualified webhook name: use a domain with at least three \
                         segments, e.g. validate.example.com"
                    ),
                ));
            }
            if !names.insert(name) {
                problems.push(Problem::at(format!("{at}/name"), format!("Duplicate value: {name:?}")));
            }
        }
        let client = &webhook["clientConfig"];
        if client.get("url").is_some() == client.get("service").is_some() {
            problems.push(Problem::at(format!("{at}/clientConfig"), "exactly one of url or service is required"));
        }
        let port = &client["service"]["port"];
        if port.as_i64().is_some_and(|p| !(1..=65535).contains(&p)) {
            problems.push(Problem::at(format!("{at}/clientConfig/service/port"), "must be between 1 and 65535"));
        }
        if webhook["admissionReviewVersions"].as_array().is_some_and(|v| !v.iter().any(|v| v == "v1" || v == "v1beta1"))
        {
            problems.push(Problem::at(
                format!("{at}/admissionReviewVersions"),
                "must include at least one of v1, v1beta1: add v1",
            ));
        }
        one_of(&webhook["sideEffects"], format!("{at}/sideEffects"), &["None", "NoneOnDryRun"], &mut problems);
        one_of(&webhook["failurePolicy"], format!("{at}/failurePolicy"), &["Ignore", "Fail"], &mut problems);
        one_of(&webhook["matchPolicy"], format!("{at}/matchPolicy"), &["Exact", "Equivalent"], &mut problems);
        if mutating {
            let at = format!("{at}/reinvocationPolicy");
            one_of(&webhook["reinvocationPolicy"], at, &["Never", "IfNeeded"], &mut problems);
        }
        if webhook["timeoutSeconds"].as_i64().is_some_and(|t| !(1..=30).contains(&t)) {
            problems.push(Problem::at(
                format!("{at}/timeoutSeconds"),
                "the timeout value must be between 1 and 30 seconds",
            ));
        }
    }
    problems
}

/// The warning of a configuration with webhooks, naming each webhook and where it is served.
pub(super) fn not_called(value: &Value) -> Option<Problem> {
    let webhooks: Vec<String> = items(&value["webhooks"])
        .map(|(_, w)| {
            let name = w["name"].as_str().unwrap_or("");
            let client = &w["clientConfig"];
            match (client["service"]["name"].as_str(), client["url"].as_str()) {
                (Some(service), _) => {
                    format!(
                        "webhook {name}: Service {}/{service}",
                        client["service"]["namespace"].as_str().unwrap_or("")
                    )
                }
                (None, Some(url)) => format!("webhook {name}: {url}"),
                (None, None) => format!("webhook {name}"),
            }
        })
        .collect();
    if webhooks.is_empty() {
        return None;
    }
    Some(Problem::at(
        "/webhooks",
        format!(
            "stored but not called: gitplane calls no admission webhooks: objects its rules match are checked by \
             gitplane's schemas and built-in admission only; the webhook's Service still runs ({})",
            webhooks.join(", ")
        ),
    ))
}
