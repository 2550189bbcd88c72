//! The replicated store: openraft over the SQLite store.
//!
//! A log entry is a batch of transactions: the leader's proposer takes every transaction that
//! queued while the previous proposals were in flight and proposes them as one entry, so one
//! fsync and one replication round carry many writes (as etcd batches puts per WAL sync). Each
//! transaction still commits or is refused on its own, under its own revision, identically on
//! every replica. Reads are served locally (serializable); [`Store::barrier`] gives a
//! linearizable read point (ReadIndex through the leader). Followers forward writes to the leader.
//! A leader that has not heard from a quorum within its lease steps down: it refuses writes and
//! gives up the roles only the leader runs.

// openraft's traits fix their (large) error types; we return what they ask for.
#![allow(clippy::result_large_err)]

pub(crate) mod log_store;
mod network;
mod state_machine;
#[cfg(test)]
mod storage_suite;
#[cfg(test)]
mod tests;

pub use network::Faults;

use crate::{
    Txn, db,
    encryption::Keyring,
    remote::{PeerToken, RemoteStore, StoreServer},
    sqlite::{Durability, SqliteStore},
};
use gitplane_store::{
    Committed, List, ListOptions, ObjectKey, Op, Rejection, Result, Revision, Store, StoreError, WatchOptions,
    WatchStream,
};
use openraft::{BasicNode, Config, Raft, ServerState, SnapshotPolicy, error::ClientWriteError, error::RaftError};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};
use tokio::sync::{Semaphore, mpsc, oneshot, watch};

pub type NodeId = u64;

/// The transactions of one log entry, shared: the log's readers (replication, apply) get the
/// entry without copying its objects.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Batch(pub Arc<[Txn]>);

/// The outcome of each transaction of an entry, in order.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct BatchResult(pub Vec<std::result::Result<Committed, Rejection>>);

openraft::declare_raft_types!(
    /// gitplane's Raft: entries are batches of store transactions.
    pub TypeConfig: D = Batch, R = BatchResult, SnapshotData = std::io::Cursor<Vec<u8>>
);

/// Proposals in flight at once; while they are, new transactions queue into the next batch.
const MAX_IN_FLIGHT: usize = 4;
const MAX_BATCH: usize = 1024;
/// How long a write waits for a leader before giving up.
const WRITE_DEADLINE: Duration = Duration::from_secs(10);

/// One replica's settings.
#[derive(Clone, Debug)]
pub struct ReplicaConfig {
    pub id: NodeId,
    /// Every replica, this one included: id -> `host:port` of its gRPC listener.
    pub peers: BTreeMap<NodeId, String>,
    /// Holds `store.db`, `raft.db` and `snapshots/`.
    pub dir: PathBuf,
    pub heartbeat: Duration,
    pub election_timeout: (Duration, Duration),
    /// Take a snapshot after this many entries, and keep this many entries behind it for
    /// followers that lag a little.
    pub snapshot_every: u64,
    pub logs_to_keep: u64,
    /// What the replicas present to each other's store and Raft services, and require.
    pub peer_token: PeerToken,
    /// Seals Secrets in the store and in the log (none by default: set it). The same keys on
    /// every replica: snapshots carry the sealed values from one replica to another.
    pub secrets: Keyring,
}

impl ReplicaConfig {
    pub fn new(id: NodeId, peers: BTreeMap<NodeId, String>, dir: PathBuf, peer_token: PeerToken) -> Self {
        ReplicaConfig {
            id,
            peers,
            dir,
            heartbeat: Duration::from_millis(100),
            // openraft 0.9 followers wait out election_timeout_max as a leader lease, then their own
            // random timeout: failover takes about max + a random draw in [min, max).
            election_timeout: (Duration::from_millis(300), Duration::from_millis(500)),
            // etcd's default (--snapshot-count): a snapshot copies the whole database.
            snapshot_every: 100_000,
            logs_to_keep: 5_000,
            peer_token,
            secrets: Keyring::identity(),
        }
    }

    /// How long a leader may go without a quorum acknowledging it before it steps down.
    fn lease(&self) -> Duration {
        self.election_timeout.0
    }
}

/// A replica of the store.
#[derive(Clone)]
pub struct RaftStore {
    inner: Arc<Inner>,
}

struct Inner {
    id: NodeId,
    raft: Raft<TypeConfig>,
    local: SqliteStore,
    peers: BTreeMap<NodeId, RemoteStore>,
    proposals: mpsc::Sender<(Vec<Op>, oneshot::Sender<Result<Committed>>)>,
    leading: watch::Receiver<bool>,
    faults: Faults,
    token: PeerToken,
    committed: Arc<AtomicU64>,
}

fn fatal(e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(format!("raft: {e}"))
}

impl RaftStore {
    /// Opens (or creates) this replica's state and joins the cluster of `config.peers`.
    pub async fn start(config: ReplicaConfig) -> Result<RaftStore> {
        std::fs::create_dir_all(&config.dir).map_err(|e| fatal(format!("creating {}: {e}", config.dir.display())))?;
        let local =
            SqliteStore::open_encrypted(&config.dir.join("store.db"), Durability::Replicated, config.secrets.clone())
                .await?;
        let log = log_store::LogStore::open(&config.dir.join("raft.db"), config.secrets.clone()).await.map_err(db)?;
        let committed = log.commit_index();
        let state_machine =
            state_machine::StateMachine::open(local.clone(), &config.dir.join("snapshots")).await.map_err(db)?;
        let raft_config = Config {
            cluster_name: "gitplane".into(),
            heartbeat_interval: config.heartbeat.as_millis() as u64,
            election_timeout_min: config.election_timeout.0.as_millis() as u64,
            election_timeout_max: config.election_timeout.1.as_millis() as u64,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(config.snapshot_every),
            max_in_snapshot_log_to_keep: config.logs_to_keep,
            ..Default::default()
        }
        .validate()
        .map_err(fatal)?;
        let faults = Faults::default();
        let network = network::Network { id: config.id, faults: faults.clone(), token: config.peer_token.clone() };
        let raft = Raft::new(config.id, Arc::new(raft_config), network, log, state_machine).await.map_err(fatal)?;
        if !raft.is_initialized().await.map_err(fatal)? {
            let members: BTreeMap<NodeId, BasicNode> =
                config.peers.iter().map(|(id, addr)| (*id, BasicNode::new(addr))).collect();
            // Every replica starts from the same membership; the ones already initialized refuse.
            if let Err(e) = raft.initialize(members).await {
                tracing::debug!(error = %e, "cluster already initialized");
            }
        }
        let peers = config
            .peers
            .iter()
            .filter(|(id, _)| **id != config.id)
            .map(|(id, addr)| Ok((*id, RemoteStore::with_token(&[PeerToken::url(addr)], config.peer_token.clone())?)))
            .collect::<Result<_>>()?;
        let (proposals, queue) = mpsc::channel(MAX_BATCH * MAX_IN_FLIGHT);
        tokio::spawn(propose(raft.clone(), queue));
        let (leading_tx, leading) = watch::channel(false);
        tokio::spawn(track_leadership(raft.clone(), config.clone(), leading_tx));
        let token = config.peer_token.clone();
        let inner = Inner { id: config.id, raft, local, peers, proposals, leading, faults, token, committed };
        Ok(RaftStore { inner: Arc::new(inner) })
    }

    pub fn id(&self) -> NodeId {
        self.inner.id
    }

    pub fn raft(&self) -> &Raft<TypeConfig> {
        &self.inner.raft
    }

    /// The highest Raft log index this replica knows committed (0 before the first).
    pub fn commit_index(&self) -> u64 {
        self.inner.committed.load(Ordering::Relaxed)
    }

    /// The gRPC services this replica serves, behind its peer token: the store (clients,
    /// followers' forwarded writes) and Raft (peers).
    pub fn routes(&self) -> tonic::service::Routes {
        let store: Arc<dyn Store> = Arc::new(self.clone());
        let raft = network::RaftServer::new(self.inner.raft.clone(), self.inner.id, self.inner.faults.clone());
        let token = &self.inner.token;
        tonic::service::Routes::new(token.require(StoreServer::new(store))).add_service(token.require(raft))
    }

    /// True while this replica is the leader and a quorum has acknowledged it within its lease:
    /// the time to run what only one replica may run (source, scheduler, controllers).
    pub fn leading(&self) -> watch::Receiver<bool> {
        self.inner.leading.clone()
    }

    /// This replica's own SQLite store (its applied state).
    pub fn local(&self) -> &SqliteStore {
        &self.inner.local
    }

    /// Fault injection for tests: cut replicas off from the others.
    pub fn faults(&self) -> &Faults {
        &self.inner.faults
    }

    pub async fn shutdown(&self) {
        let _ = self.inner.raft.shutdown().await;
    }

    /// Waits (bounded) until this replica has applied `revision`; `false` on timeout.
    async fn wait_applied(&self, revision: Revision) -> bool {
        let mut committed = self.inner.local.committed();
        matches!(tokio::time::timeout(WRITE_DEADLINE, committed.wait_for(|r| *r >= revision)).await, Ok(Ok(_)))
    }

    async fn propose(&self, ops: Vec<Op>) -> Result<Committed> {
        if !*self.inner.leading.borrow() {
            return Err(StoreError::NotLeader("this replica has no quorum lease".into()));
        }
        let (reply, answer) = oneshot::channel();
        self.inner.proposals.send((ops, reply)).await.map_err(|_| fatal("proposer stopped"))?;
        answer.await.map_err(|_| StoreError::Unavailable("the proposal was dropped; its outcome is unknown".into()))?
    }
}

/// Turns queued transactions into log entries, [`MAX_IN_FLIGHT`] entries at a time.
async fn propose(raft: Raft<TypeConfig>, mut queue: mpsc::Receiver<(Vec<Op>, oneshot::Sender<Result<Committed>>)>) {
    let in_flight = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while queue.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let Ok(permit) = in_flight.clone().acquire_owned().await else { return };
        // Whatever queued while we waited for a slot joins this entry.
        while batch.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(p) => batch.push(p),
                Err(_) => break,
            }
        }
        let (ops, replies): (Vec<_>, Vec<_>) = batch.drain(..).unzip();
        let txns: Arc<[Txn]> = ops.into_iter().map(Txn::new).collect();
        let raft = raft.clone();
        let idle = in_flight.clone();
        tokio::spawn(async move {
            let outcome = raft.client_write(Batch(txns)).await;
            drop(permit);
            match outcome {
                Ok(response) => {
                    // When no other entry is in flight to carry it, send the new commit index to
                    // the followers now rather than at the next heartbeat: a write they forwarded,
                    // and a read index they wait for, complete a heartbeat sooner.
                    if idle.available_permits() == MAX_IN_FLIGHT {
                        let _ = raft.trigger().heartbeat().await;
                    }
                    for (result, reply) in response.data.0.into_iter().zip(replies) {
                        let _ = reply.send(result.map_err(StoreError::from));
                    }
                }
                Err(e) => {
                    // ForwardToLeader: the entry was never accepted, or was truncated: not applied.
                    let not_applied = matches!(e, RaftError::APIError(ClientWriteError::ForwardToLeader(_)));
                    for reply in replies {
                        let error = if not_applied {
                            StoreError::NotLeader(e.to_string())
                        } else {
                            StoreError::Unavailable(format!("raft: {e}; the outcome is unknown"))
                        };
                        let _ = reply.send(Err(error));
                    }
                }
            }
        });
    }
}

/// Publishes whether this replica may act as leader: Raft says it leads, and a quorum
/// acknowledged it within the lease. openraft keeps a leader without quorum in its Leader state
/// (it cannot commit anything); we stop acting on its behalf within the lease: writes are
/// refused and the roles only the leader runs stop.
async fn track_leadership(raft: Raft<TypeConfig>, config: ReplicaConfig, leading: watch::Sender<bool>) {
    let lease = config.lease().as_millis() as u64;
    let single = config.peers.len() == 1;
    let mut metrics = raft.metrics();
    let mut tick = tokio::time::interval(config.heartbeat);
    loop {
        tokio::select! {
            changed = metrics.changed() => if changed.is_err() { return },
            _ = tick.tick() => {}
        }
        let m = metrics.borrow_and_update().clone();
        let acting =
            m.state == ServerState::Leader && (single || m.millis_since_quorum_ack.is_some_and(|ms| ms < lease));
        leading.send_if_modified(|l| {
            if *l == acting {
                return false;
            }
            if acting {
                tracing::info!(term = m.current_term, "leading");
            } else {
                tracing::warn!(term = m.current_term, "stepping down: not the leader, or no quorum within the lease");
            }
            *l = acting;
            true
        });
    }
}

#[async_trait::async_trait]
impl Store for RaftStore {
    async fn get(&self, key: &ObjectKey) -> Result<Option<Value>> {
        self.inner.local.get(key).await
    }

    async fn list(&self, kind: &str, options: &ListOptions) -> Result<List> {
        self.inner.local.list(kind, options).await
    }

    async fn list_json(&self, kind: &str, options: &ListOptions) -> Result<List<String>> {
        self.inner.local.list_json(kind, options).await
    }

    /// On the leader, proposes; elsewhere forwards to the leader, following leader changes
    /// while nothing was applied.
    async fn txn(&self, ops: Vec<Op>) -> Result<Committed> {
        // Refuse oversized objects at the door, as etcd limits requests: never replicate them.
        for op in &ops {
            if let Op::Create(v) | Op::Update(v) | Op::UpdateStatus(v) | Op::UpdateWithStatus(v) = op {
                crate::stage::check_size(&op.key()?, &v.to_string())?;
            }
        }
        let deadline = tokio::time::Instant::now() + WRITE_DEADLINE;
        let mut metrics = self.inner.raft.metrics();
        loop {
            let leader = metrics.borrow_and_update().current_leader;
            let result = match leader {
                Some(l) if l == self.inner.id => self.propose(ops.clone()).await,
                Some(l) => match self.inner.peers.get(&l) {
                    Some(peer) => match peer.txn(ops.clone()).await {
                        // Read your writes on the replica you wrote through.
                        Ok(committed) => {
                            self.wait_applied(committed.revision).await;
                            Ok(committed)
                        }
                        other => other,
                    },
                    None => Err(StoreError::NotLeader(format!("leader {l} is not a known peer"))),
                },
                None => Err(StoreError::NotLeader("no leader elected yet".into())),
            };
            match result {
                Err(StoreError::NotLeader(reason)) => {
                    if tokio::time::Instant::now() >= deadline {
                        return Err(StoreError::Unavailable(format!("no leader took the write in time: {reason}")));
                    }
                    // Wait for a leadership change, or retry shortly (a lease may come back).
                    let _ = tokio::time::timeout(Duration::from_millis(50), metrics.changed()).await;
                }
                other => return other,
            }
        }
    }

    async fn watch(&self, from: Revision, options: WatchOptions) -> Result<WatchStream> {
        self.inner.local.watch(from, options).await
    }

    async fn revision(&self) -> Result<Revision> {
        self.inner.local.revision().await
    }

    /// ReadIndex: the leader confirms its leadership with a quorum and waits until it has applied
    /// what was committed; a follower asks the leader for that point and waits to reach it.
    async fn barrier(&self) -> Result<()> {
        let leader = self.inner.raft.metrics().borrow().current_leader;
        match leader {
            Some(l) if l == self.inner.id => {
                self.inner.raft.ensure_linearizable().await.map_err(|e| StoreError::NotLeader(e.to_string()))?;
                Ok(())
            }
            Some(l) => {
                let peer =
                    self.inner.peers.get(&l).ok_or_else(|| StoreError::NotLeader(format!("unknown leader {l}")))?;
                peer.barrier().await?;
                let target = peer.revision().await?;
                if self.wait_applied(target).await {
                    Ok(())
                } else {
                    Err(StoreError::Unavailable(format!("this replica did not reach revision {target} in time")))
                }
            }
            None => Err(StoreError::NotLeader("no leader elected yet".into())),
        }
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        self.inner.local.compact(revision).await
    }
}
