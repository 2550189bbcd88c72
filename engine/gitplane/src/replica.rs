//! One control-plane replica: the replicated store, every service on one listener (status API,
//! node service, store service, Raft), the leader-only control plane, and compaction.

use crate::{apiserver, controlplane, nodeservice::NodeService};
use anyhow::Context as _;
use axum::{Json, routing::get};
use gitplane_store::{
    Store,
    raft::{RaftStore, ReplicaConfig},
};
use std::{path::PathBuf, sync::Arc, time::Duration};
use tokio::task::JoinHandle;

/// Revisions of history kept for watchers; older ones are compacted away.
const HISTORY: i64 = 10_000;
const COMPACTION_PERIOD: Duration = Duration::from_secs(300);

pub struct Replica {
    pub store: RaftStore,
    tasks: Vec<JoinHandle<()>>,
}

impl Replica {
    /// Starts the replica on `listener`; `push_hint` is what the read-only API tells writers.
    pub async fn start(
        config: ReplicaConfig,
        listener: tokio::net::TcpListener,
        repos_dir: PathBuf,
        push_hint: String,
    ) -> anyhow::Result<Replica> {
        let dir = config.dir.clone();
        let store =
            RaftStore::start(config).await.with_context(|| format!("opening the store in {}", dir.display()))?;
        let shared: Arc<dyn Store> = Arc::new(store.clone());
        let (store_service, raft_service) = store.services();
        let grpc = tonic::service::Routes::new(NodeService::new(shared.clone()).into_server())
            .add_service(store_service)
            .add_service(raft_service)
            .into_axum_router();
        let info = store.clone();
        let app = grpc
            .merge(apiserver::router(shared.clone(), push_hint))
            .route("/replica", get(move || replica_status(info.clone())));
        let mut tasks = vec![tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "the API server stopped");
            }
        })];
        tasks.push(tokio::spawn(controlplane::run_while_leading(store.leading(), shared.clone(), repos_dir)));
        tasks.push(tokio::spawn(compactor(shared)));
        Ok(Replica { store, tasks })
    }

    /// Waits until this replica or another one leads (the cluster can take writes).
    pub async fn wait_for_leader(&self, timeout: Duration) -> bool {
        let mut metrics = self.store.raft().metrics();
        tokio::time::timeout(timeout, metrics.wait_for(|m| m.current_leader.is_some())).await.is_ok()
    }

    pub async fn shutdown(self) {
        for task in &self.tasks {
            task.abort();
        }
        self.store.shutdown().await;
    }
}

/// `GET /replica`: this replica's view of the cluster.
async fn replica_status(store: RaftStore) -> Json<serde_json::Value> {
    let m = store.raft().metrics().borrow().clone();
    let revision = store.revision().await.unwrap_or(-1);
    Json(serde_json::json!({
        "id": m.id,
        "state": format!("{:?}", m.state),
        "term": m.current_term,
        "leader": m.current_leader,
        "leading": *store.leading().borrow(),
        "lastApplied": m.last_applied.map(|l| l.index),
        "revision": revision,
    }))
}

/// Keeps [`HISTORY`] revisions of watch history on this replica.
async fn compactor(store: Arc<dyn Store>) {
    let mut tick = tokio::time::interval(COMPACTION_PERIOD);
    loop {
        tick.tick().await;
        if let Ok(revision) = store.revision().await
            && revision > HISTORY
            && let Err(e) = store.compact(revision - HISTORY).await
        {
            tracing::warn!(error = %e, "compaction failed");
        }
    }
}
