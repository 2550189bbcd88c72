//! The replica's Prometheus metrics and `GET /metrics` (behind the status API's authorization:
//! the `read` role, as kube-apiserver serves `/metrics` to authorized users).
//!
//! Kubernetes' names where Kubernetes has the metric (`apiserver_request_total`,
//! `apiserver_request_duration_seconds`, `apiserver_longrunning_requests`, the scheduler's and
//! the work queues'), `gitplane_` otherwise. The families of the process's registry are
//! written first, then what the replica reads of its store when scraped (Raft's term, leader,
//! commit and apply index; the revision).

use crate::backend::Backend;
use axum::{Router, http::header::CONTENT_TYPE, response::IntoResponse, routing::get};
use gitplane_metrics::{Family, Histogram, LATENCY_BUCKETS};
use gitplane_store::{Committed, List, ListOptions, ObjectKey, Op, Revision, Store, WatchOptions, WatchStream};
use serde_json::Value;
use std::{
    sync::{Arc, LazyLock},
    time::Instant,
};

struct Families {
    txn_duration: Arc<Family<Histogram>>,
}

static METRICS: LazyLock<Families> = LazyLock::new(|| Families {
    txn_duration: gitplane_metrics::histogram(
        "gitplane_store_txn_duration_seconds",
        "Latency of a store write (one transaction, committed by a quorum under Raft), by result: ok, conflict or error.",
        &["result"],
        LATENCY_BUCKETS,
    ),
});

/// Registers every family this process exports, so each shows before it first moves.
pub fn register() {
    LazyLock::force(&METRICS);
    gitplane_apiserver::metrics::register();
    gitplane_gitops::metrics::register();
    gitplane_scheduler::metrics::register();
    gitplane_workqueue::register_metrics();
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
