//! What kube-apiserver refuses of a LimitRange (`ValidateLimitRange`: an item's min <= default
//! request <= default <= max, ratios of at least 1, no defaults on a Pod item) and of a
//! ResourceQuota (`ValidateResourceQuota`: quantities that parse and are not negative, known
//! scopes) beyond their schemas.

use super::Problem;
use gitplane_api::k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use gitplane_api::{k8s_openapi::api::core::v1::LimitRange, limitrange, quantity::parse_milli};
use serde_json::Value;
use std::collections::BTreeMap;

/// A quantity of a list with its value, as the messages quote it.
fn get(list: &Option<BTreeMap<String, Quantity>>, name: &str) -> Option<(i128, String)> {
    let q = list.as_ref()?.get(name)?;
    Some((parse_milli(&q.0).unwrap_or(0), q.0.clone()))
}

pub(super) fn limit_range_problems(value: &Value) -> Vec<Problem> {
    let mut problems = Vec::new();
    let quantities = |field: &str, at: &str, item: &Value, problems: &mut Vec<Problem>| {
        for (k, v) in item[field].as_object().into_iter().flatten() {
            if v.as_str().and_then(parse_milli).is_none_or(|m| m < 0) {
                problems.push(Problem::at(
                    format!("{at}/{field}/{k}"),
                    format!("{v} is not a non-negative quantity (e.g. 500m, 1, 256Mi)"),
                ));
            }
        }
    };
    let items = value["spec"]["limits"].as_array().into_iter().flatten().enumerate();
    for (i, raw) in items {
        let at = format!("/spec/limits/{i}");
        for field in ["min", "max", "default", "defaultRequest", "maxLimitRequestRatio"] {
            quantities(field, &at, raw, &mut problems);
        }
        let type_ = raw["type"].as_str().unwrap_or("");
        if !matches!(type_, "Pod" | "Container" | "PersistentVolumeClaim") {
            problems.push(Problem::at(
                format!("{at}/type"),
                format!(
                    "Unsupported value: {:?}: supported values: \"Container\", \"PersistentVolumeClaim\", \"Pod\"",
                    type_
                ),
            ));
        }
        if type_ == "Pod" {
            for field in ["default", "defaultRequest"] {
                if raw[field].as_object().is_some_and(|d| !d.is_empty()) {
                    problems.push(Problem::at(
                        format!("{at}/{field}"),
                        "may not be specified when `type` is 'Pod': remove it (defaults are per Container)",
                    ));
                }
            }
        }
    }
    if !problems.is_empty() {
        return problems;
    }
    let Ok(range) = serde_json::from_value::<LimitRange>(value.clone()) else { return problems };
    for (i, item) in range.spec.iter().flat_map(|s| s.limits.iter()).enumerate() {
        let item = limitrange::with_defaults(item);
        let at = format!("/spec/limits/{i}");
        let mut names: Vec<&String> =
            [&item.min, &item.max, &item.default, &item.default_request, &item.max_limit_request_ratio]
                .into_iter()
                .flatten()
                .flat_map(|m| m.keys())
                .collect();
        names.sort();
        names.dedup();
        for k in names {
            let (min, max) = (get(&item.min, k), get(&item.max, k));
            let (default, request) = (get(&item.default, k), get(&item.default_request, k));
            let mut order =
                |field: &str, low: &Option<(i128, String)>, high: &Option<(i128, String)>, what: (&str, &str)| {
                    if let (Some((l, lt)), Some((h, ht))) = (low, high)
                        && l > h
                    {
                        problems.push(Problem::at(
                            format!("{at}/{field}/{k}"),
                            format!("{} value {lt} is greater than {} value {ht}", what.0, what.1),
                        ));
                    }
                };
            order("min", &min, &max, ("min", "max"));
            order("default", &min, &default, ("min", "default"));
            order("default", &default, &max, ("default", "max"));
            order("defaultRequest", &min, &request, ("min", "default request"));
            order("defaultRequest", &request, &max, ("default request", "max"));
            order("defaultRequest", &request, &default, ("default request", "default limit"));
            if let Some((ratio, text)) = get(&item.max_limit_request_ratio, k)
                && ratio < 1000
            {
                problems.push(Problem::at(
                    format!("{at}/maxLimitRequestRatio/{k}"),
                    format!("ratio {text} is less than 1"),
                ));
            }
        }
    }
    problems.dedup_by(|a, b| a.message == b.message);
    problems
}

const SCOPES: &[&str] =
    &["Terminating", "NotTerminating", "BestEffort", "NotBestEffort", "PriorityClass", "CrossNamespacePodAffinity"];

pub(super) fn resource_quota_problems(value: &Value) -> Vec<Problem> {
    let mut problems = Vec::new();
    for (k, v) in value["spec"]["hard"].as_object().into_iter().flatten() {
        if v.as_str().and_then(parse_milli).is_none_or(|m| m < 0) {
            problems.push(Problem::at(
                format!("/spec/hard/{k}"),
                format!("{v} is not a non-negative quantity (e.g. 10, 500m, 1Gi): must be greater than or equal to 0"),
            ));
        }
    }
    let scopes = value["spec"]["scopes"].as_array().into_iter().flatten().enumerate();
    let selected = value["spec"]["scopeSelector"]["matchExpressions"].as_array().into_iter().flatten().enumerate();
    for (at, scope) in scopes
        .map(|(i, s)| (format!("/spec/scopes/{i}"), s))
        .chain(selected.map(|(i, e)| (format!("/spec/scopeSelector/matchExpressions/{i}/scopeName"), &e["scopeName"])))
    {
        let scope = scope.as_str().unwrap_or("");
        if !SCOPES.contains(&scope) {
            problems.push(Problem::at(at, format!("unsupported scope {scope:?}: use one of {}", SCOPES.join(", "))));
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn messages(problems: Vec<Problem>) -> Vec<String> {
        problems.into_iter().map(|p| format!("{}: {}", p.pointer.unwrap_or_default(), p.message)).collect()
    }

    #[test]
    fn limit_range_table() {
        #[rustfmt::skip]
        let cases: Vec<(&str, Value, Vec<&str>)> = vec![
            ("the documentation's memory defaults", json!([{"type": "Container", "default": {"memory": "512Mi"}, "defaultRequest": {"memory": "256Mi"}}]), vec![]),
            ("min over max", json!([{"type": "Container", "min": {"cpu": "1"}, "max": {"cpu": "500m"}}]),
             // The max is also the default limit and request, as the API server defaults them.
             vec!["/spec/limits/0/min/cpu: min value 1 is greater than max value 500m",
                  "/spec/limits/0/default/cpu: min value 1 is greater than default value 500m",
                  "/spec/limits/0/defaultRequest/cpu: min value 1 is greater than default request value 500m"]),
            ("default request over the default", json!([{"type": "Container", "default": {"cpu": "1"}, "defaultRequest": {"cpu": "2"}}]),
             vec!["/spec/limits/0/defaultRequest/cpu: default request value 2 is greater than default limit value 1"]),
            ("a ratio under 1", json!([{"type": "Container", "maxLimitRequestRatio": {"cpu": "500m"}}]),
             vec!["/spec/limits/0/maxLimitRequestRatio/cpu: ratio 500m is less than 1"]),
            ("defaults on a Pod item", json!([{"type": "Pod", "default": {"cpu": "1"}}]),
             vec!["/spec/limits/0/default: may not be specified when `type` is 'Pod': remove it (defaults are per Container)"]),
            ("an unknown type", json!([{"type": "Node"}]),
             vec!["/spec/limits/0/type: Unsupported value: \"Node\": supported values: \"Container\", \"PersistentVolumeClaim\", \"Pod\""]),
        ];
        for (what, limits, expected) in cases {
            let got = messages(limit_range_problems(&json!({"metadata": {"name": "r"}, "spec": {"limits": limits}})));
            assert_eq!(got, expected, "{what}");
        }
    }

    #[test]
    fn resource_quota_table() {
        #[rustfmt::skip]
        let cases: Vec<(&str, Value, Vec<&str>)> = vec![
            ("the documentation's mem-cpu quota", json!({"hard": {"requests.cpu": "1", "requests.memory": "1Gi", "limits.cpu": "2", "limits.memory": "2Gi"}}), vec![]),
            ("a negative quantity", json!({"hard": {"pods": "-1"}}),
             vec!["/spec/hard/pods: \"-1\" is not a non-negative quantity (e.g. 10, 500m, 1Gi): must be greater than or equal to 0"]),
            ("an unknown scope", json!({"hard": {"pods": "1"}, "scopes": ["Cheap"]}),
             vec!["/spec/scopes/0: unsupported scope \"Cheap\": use one of Terminating, NotTerminating, BestEffort, NotBestEffort, PriorityClass, CrossNamespacePodAffinity"]),
        ];
        for (what, spec, expected) in cases {
            assert_eq!(messages(resource_quota_problems(&json!({"spec": spec}))), expected, "{what}");
        }
    }
}
