//! What kube-apiserver's Ingress validation refuses beyond the schema: a rule's host (a DNS
//! subdomain, a wildcard only as a leading `*.`, never an IP address), each path's pathType
//! (required; Exact and Prefix paths absolute and clean), each backend (a Service or a resource,
//! not both; a Service port by number or by name, not both), and an Ingress with nothing to
//! route (neither rules nor a default backend).

use super::{DnsName, Problem};
use serde_json::Value;

pub(super) fn problems(ingress: &Value) -> Vec<Problem> {
    let mut problems = Vec::new();
    let spec = &ingress["spec"];
    let rules = spec["rules"].as_array().map(Vec::as_slice).unwrap_or_default();
    if spec["defaultBackend"].is_null() && rules.is_empty() {
        problems.push(Problem::at(
            "/spec",
            "either defaultBackend or rules must be specified: add a rule with a host and paths, or a defaultBackend",
        ));
    }
    if !spec["defaultBackend"].is_null() {
        backend(&spec["defaultBackend"], "/spec/defaultBackend", &mut problems);
    }
    for (i, rule) in rules.iter().enumerate() {
        if let Some(h) = rule["host"].as_str() {
            host(h, &format!("/spec/rules/{i}/host"), &mut problems);
        }
        let paths = rule["http"]["paths"].as_array().map(Vec::as_slice).unwrap_or_default();
        for (j, p) in paths.iter().enumerate() {
            let at = format!("/spec/rules/{i}/http/paths/{j}");
            path(p, &at, &mut problems);
            backend(&p["backend"], &format!("{at}/backend"), &mut problems);
        }
    }
    for (i, tls) in spec["tls"].as_array().into_iter().flatten().enumerate() {
        for (j, h) in tls["hosts"].as_array().into_iter().flatten().enumerate() {
            if let Some(h) = h.as_str() {
                host(h, &format!("/spec/tls/{i}/hosts/{j}"), &mut problems);
            }
        }
    }
    problems
}

/// An IngressClass names the controller that implements it, as a domain-prefixed path.
pub(super) fn class_problems(class: &Value) -> Vec<Problem> {
    match class["spec"]["controller"].as_str() {
        Some(c)
            if c.split_once('/')
                .is_some_and(|(domain, path)| DnsName::Subdomain.check(domain).is_ok() && !path.is_empty()) =>
        {
            Vec::new()
        }
        Some(c) => vec![Problem::at(
            "/spec/controller",
            format!("{c:?} is not a domain-prefixed path: write e.g. gitplane.io/ingress-controller (gitplane's)"),
        )],
        None => vec![Problem::at(
            "/spec/controller",
            "controller is required: set it to gitplane.io/ingress-controller for gitplane's Ingress controller",
        )],
    }
}

fn host(h: &str, at: &str, problems: &mut Vec<Problem>) {
    if h.parse::<std::net::IpAddr>().is_ok() {
        problems.push(Problem::at(
            at,
            format!("{h:?} is an IP address: a host must be a DNS name (leave it out to match every host)"),
        ));
        return;
    }
    let (name, wildcard) = match h.strip_prefix("*.") {
        Some(rest) => (rest, true),
        None => (h, false),
    };
    if name.contains('*') {
        problems.push(Problem::at(
            at,
            format!("{h:?}: a wildcard is allowed only as the whole first label, as in *.example.com"),
        ));
    } else if let Err(rule) = DnsName::Subdomain.check(name) {
        let what =
            if wildcard { "a wildcard DNS-1123 subdomain (*. then a subdomain)" } else { "a DNS-1123 subdomain" };
        problems.push(Problem::at(at, format!("{h:?} is not {what}: {rule}")));
    }
}

/// Segments kube-apiserver refuses in an Exact or Prefix path (`invalidPathSequences`).
const INVALID_SEQUENCES: [&str; 5] = ["//", "/./", "/../", "%2f", "%2F"];
const INVALID_SUFFIXES: [&str; 2] = ["/..", "/."];

fn path(p: &Value, at: &str, problems: &mut Vec<Problem>) {
    let text = p["path"].as_str().unwrap_or("");
    match p["pathType"].as_str() {
        // The schema requires it (and says so).
        None => {}
        Some(kind @ ("Exact" | "Prefix")) => {
            if !text.starts_with('/') {
                problems.push(Problem::at(
                    format!("{at}/path"),
                    format!("{text:?} must be an absolute path (begin with /) for pathType {kind}"),
                ));
            } else if let Some(bad) = INVALID_SEQUENCES.iter().find(|s| text.contains(*s)) {
                problems.push(Problem::at(
                    format!("{at}/path"),
                    format!("{text:?} must not contain {bad:?} for pathType {kind}"),
                ));
            } else if let Some(bad) = INVALID_SUFFIXES.iter().find(|s| text.ends_with(*s)) {
                problems.push(Problem::at(
                    format!("{at}/path"),
                    format!("{text:?} must not end with {bad:?} for pathType {kind}"),
                ));
            }
        }
        Some("ImplementationSpecific") if !text.is_empty() && !text.starts_with('/') => problems
            .push(Problem::at(format!("{at}/path"), format!("{text:?} must be an absolute path (begin with /)"))),
        Some("ImplementationSpecific") => {}
        Some(other) => problems.push(Problem::at(
            format!("{at}/pathType"),
            format!("{other:?} is not a pathType: use Prefix, Exact or ImplementationSpecific"),
        )),
    }
}

fn backend(b: &Value, at: &str, problems: &mut Vec<Problem>) {
    match (b["service"].is_null(), b["resource"].is_null()) {
        (false, false) => {
            problems.push(Problem::at(at, "a backend is either a service or a resource, not both: remove one"));
            return;
        }
        (true, true) => {
            problems.push(Problem::at(at, "a backend needs a service (name and port) or a resource"));
            return;
        }
        (true, false) => return,
        (false, true) => {}
    }
    let service = &b["service"];
    if let Some(name) = service["name"].as_str()
        && let Err(rule) = DnsName::Rfc1035Label.check(name)
    {
        problems.push(Problem::at(format!("{at}/service/name"), format!("{name:?} is not a Service name: {rule}")));
    }
    let port = &service["port"];
    match (port["number"].as_i64(), port["name"].as_str()) {
        (Some(_), Some(_)) => problems.push(Problem::at(
            format!("{at}/service/port"),
            "a Service port is a number or a name, not both: remove one",
        )),
        (None, None) => problems.push(Problem::at(
            format!("{at}/service/port"),
            "a Service port is required: set port.number (e.g. 80) or port.name (e.g. http)",
        )),
        (Some(n), None) if !(1..=65535).contains(&n) => problems.push(Problem::at(
            format!("{at}/service/port/number"),
            format!("{n} is not a port number: use 1 to 65535"),
        )),
        (None, Some(name)) if !is_port_name(name) => problems.push(Problem::at(
            format!("{at}/service/port/name"),
            format!(
                "{name:?} is not a port name: at most 15 lower case letters, digits and '-', with a letter, \
                 neither beginning nor ending with '-' nor holding '--'"
            ),
        )),
        _ => {}
    }
}

/// An IANA service name, as a named port is (`IsValidPortName`).
fn is_port_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 15
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && name.bytes().any(|b| b.is_ascii_lowercase())
        && !name.starts_with('-')
        && !name.ends_with('-')
        && !name.contains("--")
}
