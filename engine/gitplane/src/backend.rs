//! Where a replica's state lives: its own SQLite replicated with Raft, or one Postgres database
//! all replicas share; and what the replica tells of it (status, health).

use anyhow::Context as _;
use gitplane_apiserver::health::{self, ReplicaHealth};
use gitplane_storage::{
    encryption::{AtRest, Keyring},
    postgres::PostgresReplica,
    raft::RaftStore,
    raft::ReplicaConfig,
    remote::StoreServer,
};
use gitplane_store::Store;
use std::sync::Arc;

/// Where a replica's state lives.
#[derive(Clone)]
pub enum Backend {
    /// Its own SQLite, replicated with Raft (the embedded default).
    Raft(RaftStore),
    /// The one Postgres database all replicas share; a lease elects the leader.
    Postgres(PostgresReplica),
}

/// The runtime the replicated store's own tasks run on (Raft, its log writer, the SQLite
/// writer, replication), as etcd runs in a process of its own beside kube-apiserver: a commit
/// waits for the CPU, never in a run queue behind the API's thousands of watch writes. The
/// store is reached from the main runtime through channels; it lives as long as the process.
fn store_runtime() -> anyhow::Result<&'static tokio::runtime::Handle> {
    // Built inside `get_or_init`: a runtime dropped in async code panics.
    static RUNTIME: std::sync::OnceLock<Result<tokio::runtime::Runtime, String>> = std::sync::OnceLock::new();
    let runtime = RUNTIME.get_or_init(|| {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(2).thread_name("store").enable_all();
        builder.build().map_err(|e| e.to_string())
    });
    match runtime {
        Ok(runtime) => Ok(runtime.handle()),
        Err(e) => anyhow::bail!("starting the store's runtime: {e}"),
    }
}

impl Backend {
    pub async fn raft(config: ReplicaConfig) -> anyhow::Result<Backend> {
        if config.secrets.write_key().is_none() {
            tracing::warn!("no encryption key: Secrets are stored in clear");
        }
        let dir = config.dir.clone();
        let store = store_runtime()?
            .spawn(RaftStore::start(config))
            .await
            .context("the store's runtime stopped")?
            .with_context(|| format!("opening the store in {}", dir.display()))?;
        Ok(Backend::Raft(store))
    }

    pub fn store(&self) -> Arc<dyn Store> {
        match self {
            Backend::Raft(s) => Arc::new(s.clone()),
            Backend::Postgres(s) => Arc::new(s.clone()),
        }
    }

    /// True while this replica may run what only the leader runs.
    pub fn leading(&self) -> tokio::sync::watch::Receiver<bool> {
        match self {
            Backend::Raft(s) => s.leading(),
            Backend::Postgres(s) => s.leading(),
        }
    }

    /// The keys Secrets are sealed with.
    pub fn secrets(&self) -> Keyring {
        match self {
            Backend::Raft(s) => s.local().secrets().clone(),
            Backend::Postgres(s) => s.store().secrets().clone(),
        }
    }

    /// Where this replica's sealed Secrets stand against the write key.
    pub async fn at_rest(&self) -> gitplane_store::Result<AtRest> {
        match self {
            Backend::Raft(s) => s.local().at_rest().await,
            Backend::Postgres(s) => s.store().at_rest().await,
        }
    }

    /// The gRPC services of the store: clients and forwarded writes, and Raft's own.
    pub fn routes(&self) -> tonic::service::Routes {
        match self {
            Backend::Raft(s) => s.routes(),
            Backend::Postgres(s) => {
                tonic::service::Routes::new(s.peer_token().require(StoreServer::new(Arc::new(s.clone()))))
            }
        }
    }

    pub async fn status(&self) -> serde_json::Value {
        let mut status = self.store_status().await;
        // Key names and counts only, never a key.
        status["encryption"] = match self.at_rest().await {
            Ok(at_rest) => serde_json::to_value(at_rest).unwrap_or_default(),
            Err(e) => serde_json::json!({"error": e.to_string()}),
        };
        status
    }

    async fn store_status(&self) -> serde_json::Value {
        match self {
            Backend::Raft(store) => {
                let m = store.raft().metrics().borrow().clone();
                serde_json::json!({
                    "id": m.id,
                    "store": "sqlite+raft",
                    "state": format!("{:?}", m.state),
                    "term": m.current_term,
                    "leader": m.current_leader,
                    "leading": *store.leading().borrow(),
                    "lastApplied": m.last_applied.map(|l| l.index),
                    "revision": store.revision().await.unwrap_or(-1),
                })
            }
            Backend::Postgres(store) => serde_json::json!({
                "id": store.id(),
                "store": "postgres",
                "leader": store.leader().await.ok().flatten(),
                "leading": *store.leading().borrow(),
                "revision": store.revision().await.unwrap_or(-1),
            }),
        }
    }

    pub async fn shutdown(&self) {
        if let Backend::Raft(store) = self {
            store.shutdown().await;
        }
    }
}

/// What `backend` knows of itself now, for the health endpoints.
pub async fn observe(backend: &Backend) -> ReplicaHealth {
    let store = match tokio::time::timeout(health::CHECK_TIMEOUT, backend.store().revision()).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("the store did not answer within {} s", health::CHECK_TIMEOUT.as_secs())),
    };
    let leading = *backend.leading().borrow();
    match backend {
        Backend::Raft(raft) => {
            let m = raft.raft().metrics().borrow().clone();
            let replication = m.running_state.as_ref().map(|_| ()).map_err(|e| format!("raft stopped: {e}"));
            let leader = match m.current_leader {
                None => Err(format!("no leader is known in term {}", m.current_term)),
                Some(id) if id == m.id && m.state.is_leader() && !leading => Err(format!(
                    "this replica leads term {} but no quorum acknowledged it within its lease",
                    m.current_term
                )),
                Some(_) => Ok(()),
            };
            let applied = m.last_applied.map_or(0, |l| l.index);
            let unapplied = m.last_log_index.unwrap_or(0).saturating_sub(applied);
            ReplicaHealth { store, replication, leader, unapplied }
        }
        Backend::Postgres(pg) => {
            let leader = match pg.leader().await {
                Ok(Some(_)) => Ok(()),
                Ok(None) => Err("no replica holds the leader lease".to_owned()),
                Err(e) => Err(format!("reading the leader lease: {e}")),
            };
            // Every replica reads the one database: nothing to apply, nothing to fall behind.
            ReplicaHealth { store, replication: Ok(()), leader, unapplied: 0 }
        }
    }
}

/// The health endpoints' view of `backend`.
pub fn health_observer(backend: Backend) -> health::Observe {
    Arc::new(move || {
        let backend = backend.clone();
        Box::pin(async move { observe(&backend).await })
    })
}
