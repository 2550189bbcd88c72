//! The replica's Prometheus metrics and `GET /metrics` (behind the status API's authorization:
//! the `read` role, as kube-apiserver serves `/metrics` to authorized users).
//!
//! Kubernetes' names where Kubernetes has the metric (`apiserver_request_total`,
//! `apiserver_request_duration_seconds`, `apiserver_longrunning_requests`, the scheduler's and
//! the work queues'), `gitplane_` otherwise. The families of the process's registry are
//! written first, then what the replica reads of its store when scraped (Raft's term, leader,
//! commit and apply index; the revision).

use crate::{audit::RequestInfo, replica::Backend};
use axum::{Router, http::header::CONTENT_TYPE, response::IntoResponse, routing::get};
use gitplane_metrics::{Counter, Family, Gauge, Histogram, LATENCY_BUCKETS, SLOW_BUCKETS};
use gitplane_store::{Committed, List, ListOptions, ObjectKey, Op, Revision, Store, WatchOptions, WatchStream};
use serde_json::Value;
use std::{
    sync::{Arc, LazyLock},
    time::{Duration, Instant},
};

struct Families {
    requests: Arc<Family<Counter>>,
    request_duration: Arc<Family<Histogram>>,
    longrunning: Arc<Family<Gauge>>,
    sync_duration: Arc<Family<Histogram>>,
    push_to_applied: Arc<Family<Histogram>>,
    verdict_duration: Arc<Family<Histogram>>,
    fetch_duration: Arc<Family<Histogram>>,
    txn_duration: Arc<Family<Histogram>>,
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
    sync_duration: gitplane_metrics::histogram(
        "gitplane_application_sync_duration_seconds",
        "Duration of an Application's sync (read the branch head, render, validate, plan, commit) by result: Synced, Unchanged or Failed.",
        &["namespace", "application", "result"],
        SLOW_BUCKETS,
    ),
    push_to_applied: gitplane_metrics::histogram(
        "gitplane_push_to_applied_seconds",
        "From a branch moving (a push to a hosted repository, or a mirror fetch that brought commits) to its commit applied in the store.",
        &["namespace", "application"],
        SLOW_BUCKETS,
    ),
    verdict_duration: gitplane_metrics::histogram(
        "gitplane_push_verdict_duration_seconds",
        "Time a push to a hosted repository waited for its verdict (load, render, validate and plan of the pushed commits), by result: accepted or refused.",
        &["result"],
        LATENCY_BUCKETS,
    ),
    fetch_duration: gitplane_metrics::histogram(
        "gitplane_git_fetch_duration_seconds",
        "Duration of a fetch of a remote repository's mirror, by result: changed, unchanged or failed.",
        &["result"],
        SLOW_BUCKETS,
    ),
    txn_duration: gitplane_metrics::histogram(
        "gitplane_store_txn_duration_seconds",
        "Latency of a store write (one transaction, committed by a quorum under Raft), by result: ok, conflict or error.",
        &["result"],
        LATENCY_BUCKETS,
    ),
    cache_lists: gitplane_metrics::counter(
        "apiserver_cache_list_total",
        "LIST requests by whether the API server's watch cache served them (hit) or the store did (miss: not filled yet, behind, an exact revision, or a continue token whose snapshot is gone).",
        &["resource", "result"],
    ),
});

/// Registers every family this process exports, so each shows before it first moves.
pub fn register() {
    LazyLock::force(&METRICS);
    gitplane_scheduler::metrics::register();
    gitplane_workqueue::register_metrics();
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
    if crate::apiserver::serves(&info.api_group, &info.resource) { (&info.api_group, &info.resource) } else { ("", "") }
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

/// One sync of an Application.
pub(crate) fn sync(namespace: &str, application: &str, result: &str, took: Duration) {
    METRICS.sync_duration.with(&[namespace, application, result]).observe_duration(took);
}

/// A branch that moved at `moved` is applied now.
pub(crate) fn applied(namespace: &str, application: &str, moved: Instant) {
    METRICS.push_to_applied.with(&[namespace, application]).observe_duration(moved.elapsed());
}

/// One push verdict.
pub(crate) fn verdict(accepted: bool, took: Duration) {
    METRICS.verdict_duration.with(&[if accepted { "accepted" } else { "refused" }]).observe_duration(took);
}

/// One LIST the watch cache could serve (`hit`) or not (`miss`).
pub(crate) fn cache_list(resource: &str, hit: bool) {
    METRICS.cache_lists.with(&[resource, if hit { "hit" } else { "miss" }]).inc();
}

/// One fetch of a mirror.
pub(crate) fn fetched(result: &str, took: Duration) {
    METRICS.fetch_duration.with(&[result]).observe_duration(took);
}

/// The store with its writes timed.
pub(crate) struct MeteredStore(pub Arc<dyn Store>);

#[async_trait::async_trait]
impl Store for MeteredStore {
    async fn get(&self, key: &ObjectKey) -> gitplane_store::Result<Option<Value>> {
        self.0.get(key).await
    }

    async fn list(&self, kind: &str, options: &ListOptions) -> gitplane_store::Result<List> {
        self.0.list(kind, options).await
    }

    async fn list_json(&self, kind: &str, options: &ListOptions) -> gitplane_store::Result<List<String>> {
        self.0.list_json(kind, options).await
    }

    async fn txn(&self, ops: Vec<Op>) -> gitplane_store::Result<Committed> {
        let started = Instant::now();
        let result = self.0.txn(ops).await;
        let label = match &result {
            Ok(_) => "ok",
            Err(e) if e.is_conflict() => "conflict",
            Err(_) => "error",
        };
        METRICS.txn_duration.with(&[label]).observe_duration(started.elapsed());
        result
    }

    async fn watch(&self, from: Revision, options: WatchOptions) -> gitplane_store::Result<WatchStream> {
        self.0.watch(from, options).await
    }

    async fn revision(&self) -> gitplane_store::Result<Revision> {
        self.0.revision().await
    }

    async fn barrier(&self) -> gitplane_store::Result<()> {
        self.0.barrier().await
    }

    async fn compact(&self, revision: Revision) -> gitplane_store::Result<()> {
        self.0.compact(revision).await
    }
}

/// What the replica's store says of itself when scraped.
async fn store_gauges(backend: &Backend, out: &mut String) {
    let gauge = |out: &mut String, name: &str, help: &str, v: i64| {
        gitplane_metrics::gauge_text(out, name, help, &[], &[(vec![], v)])
    };
    match backend {
        Backend::Raft(store) => {
            let m = store.raft().metrics().borrow().clone();
            let is_leader = m.current_leader == Some(m.id);
            gauge(out, "gitplane_raft_term", "The Raft term this replica is in.", m.current_term as i64);
            gauge(
                out,
                "gitplane_raft_has_leader",
                "Whether a leader exists (1) or not (0), as this replica knows.",
                i64::from(m.current_leader.is_some()),
            );
            gauge(
                out,
                "gitplane_raft_is_leader",
                "Whether this replica is the Raft leader (1) or not (0).",
                i64::from(is_leader),
            );
            gauge(
                out,
                "gitplane_raft_leader_id",
                "The id of the Raft leader this replica knows, -1 when none.",
                m.current_leader.map_or(-1, |l| l as i64),
            );
            gauge(
                out,
                "gitplane_raft_commit_index",
                "The highest Raft log index this replica knows committed.",
                // What was applied was committed: after a restart the applied index is known at
                // once, the commit index only from the next commit.
                (store.commit_index() as i64).max(m.last_applied.map_or(0, |l| l.index as i64)),
            );
            gauge(
                out,
                "gitplane_raft_applied_index",
                "The highest Raft log index applied to this replica's store.",
                m.last_applied.map_or(0, |l| l.index as i64),
            );
            gauge(
                out,
                "gitplane_raft_last_log_index",
                "The highest index in this replica's Raft log.",
                m.last_log_index.map_or(0, |i| i as i64),
            );
            gauge(
                out,
                "gitplane_store_revision",
                "The store's latest revision (resourceVersion) on this replica.",
                store.revision().await.unwrap_or(-1),
            );
        }
        Backend::Postgres(store) => {
            // One database, no log: leadership is the lease, progress is the revision.
            let leader = store.leader().await.ok().flatten();
            gauge(
                out,
                "gitplane_store_has_leader",
                "Whether a replica holds the leader lease (1) or not (0).",
                i64::from(leader.is_some()),
            );
            gauge(
                out,
                "gitplane_store_is_leader",
                "Whether this replica holds the leader lease and leads (1) or not (0).",
                i64::from(*store.leading().borrow()),
            );
            gauge(
                out,
                "gitplane_store_revision",
                "The store's latest revision (resourceVersion) on this replica.",
                store.revision().await.unwrap_or(-1),
            );
        }
    }
}

/// `GET /metrics`.
pub fn router(backend: Backend) -> Router {
    Router::new().route(
        "/metrics",
        get(move || {
            let backend = backend.clone();
            async move {
                let mut text = gitplane_metrics::registry().encode();
                store_gauges(&backend, &mut text).await;
                ([(CONTENT_TYPE, gitplane_metrics::CONTENT_TYPE)], text).into_response()
            }
        }),
    )
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
