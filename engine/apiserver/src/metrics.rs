//! The API server's metric families, under kube-apiserver's names: requests by verb, group,
//! resource and code, their latency, the watches open, and what the LIST cache served.

use crate::audit::RequestInfo;
use gitplane_metrics::{Counter, Family, Gauge, Histogram, LATENCY_BUCKETS};
use std::{
    sync::{Arc, LazyLock},
    time::Duration,
};

struct Families {
    requests: Arc<Family<Counter>>,
    request_duration: Arc<Family<Histogram>>,
    longrunning: Arc<Family<Gauge>>,
    cache_lists: Arc<Family<Counter>>,
}

static METRICS: LazyLock<Families> = LazyLock::new(|| Families {
    requests: gitplane_metrics::counter(
        "apiserver_request_total",
        "Counter of apiserver requests broken out for each verb, group, resource and HTTP response code.",
        &["verb", "group", "resource", "code"],
    ),
    request_duration: gitplane_metrics::histogram(
        "apiserver_request_duration_seconds",
        "Response latency distribution in seconds for each verb, group and resource (to the response's head).",
        &["verb", "group", "resource"],
        LATENCY_BUCKETS,
    ),
    longrunning: gitplane_metrics::gauge(
        "apiserver_longrunning_requests",
        "Gauge of all active long-running apiserver requests broken out by verb, group and resource (watches open).",
        &["verb", "group", "resource"],
    ),
    cache_lists: gitplane_metrics::counter(
        "apiserver_cache_list_total",
        "LIST requests by whether the API server's watch cache served them (hit) or the store did (miss: not filled yet, behind, an exact revision, or a continue token whose snapshot is gone).",
        &["resource", "result"],
    ),
});

/// Registers the API server's families, so each shows before it first moves.
pub fn register() {
    LazyLock::force(&METRICS);
}

/// kube-apiserver's verb label for a request's verb; anything else is `other` (a method is
/// outside input and labels must stay bounded).
fn verb_label(verb: &str) -> &'static str {
    match verb {
        "get" => "GET",
        "list" => "LIST",
        "watch" => "WATCH",
        "create" => "POST",
        "update" => "PUT",
        "patch" => "PATCH",
        "delete" | "deletecollection" => "DELETE",
        _ => "other",
    }
}

/// The group and resource labels of a request: a resource the status API serves, else empty
/// (a path that names none, or one it does not serve: outside input, kept out of labels).
fn resource_labels(info: &RequestInfo) -> (&str, &str) {
    if crate::serves(&info.api_group, &info.resource) { (&info.api_group, &info.resource) } else { ("", "") }
}

/// One status API request, answered with `code` after `took`.
pub(crate) fn request(info: &RequestInfo, code: u16, took: Duration) {
    let verb = verb_label(&info.verb);
    let (group, resource) = resource_labels(info);
    METRICS.requests.with(&[verb, group, resource, &code.to_string()]).inc();
    METRICS.request_duration.with(&[verb, group, resource]).observe_duration(took);
}

/// Counts an open watch until dropped.
pub(crate) struct WatchOpen(Arc<Gauge>);

impl WatchOpen {
    pub(crate) fn new(group: &str, resource: &str) -> WatchOpen {
        let gauge = METRICS.longrunning.with(&["WATCH", group, resource]);
        gauge.add(1);
        WatchOpen(gauge)
    }
}

impl Drop for WatchOpen {
    fn drop(&mut self) {
        self.0.add(-1);
    }
}

/// One LIST the watch cache could serve (`hit`) or not (`miss`).
pub(crate) fn cache_list(resource: &str, hit: bool) {
    METRICS.cache_lists.with(&[resource, if hit { "hit" } else { "miss" }]).inc();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_stay_bounded_whatever_the_path_and_method() {
        let info = RequestInfo::new("GET", "/api/v1/namespaces/a/pods", None);
        assert_eq!((verb_label(&info.verb), resource_labels(&info)), ("LIST", ("", "pods")));
        let info = RequestInfo::new("GET", "/apis/apps/v1/deployments/x", None);
        assert_eq!((verb_label(&info.verb), resource_labels(&info)), ("GET", ("apps", "deployments")));
        let info = RequestInfo::new("GET", "/api/v1/pods", Some("watch=1"));
        assert_eq!(verb_label(&info.verb), "WATCH");
        for (method, path) in [("GET", "/api/v1/made-up-1234"), ("BREW", "/api/v1/pods"), ("GET", "/apis/evil/v1/pods")]
        {
            let info = RequestInfo::new(method, path, None);
            assert_eq!(resource_labels(&info), ("", ""), "{method} {path}");
        }
        assert_eq!(verb_label(&RequestInfo::new("BREW", "/x", None).verb), "other");
    }
}
