//! Three replicas in one process over real loopback gRPC: the conformance suite through a
//! follower, leader loss, a partitioned leader, catch-up by snapshot, a full restart.

use super::*;
use crate::remote::{PeerToken, RemoteStore};
use gitplane_store::{ListOptions, ObjectKey, Op, Store};
use serde_json::json;
use std::{net::SocketAddr, time::Duration};
use tokio::task::JoinHandle;

/// A replica and its server task.
struct Replica {
    store: RaftStore,
    server: JoinHandle<()>,
    stop: tokio::sync::oneshot::Sender<()>,
}

impl Replica {
    /// Stops like a process exit: Raft first, then the server closes its connections so peers
    /// reconnect to whatever listens on the address next.
    async fn stop(self) {
        self.store.shutdown().await;
        let _ = self.stop.send(());
        let _ = tokio::time::timeout(Duration::from_secs(5), self.server).await;
    }
}

/// Replicas in one temporary directory. Dropping the cluster (also while a failed test unwinds)
/// stops every replica and then removes the directory.
struct Cluster {
    addrs: BTreeMap<NodeId, SocketAddr>,
    replicas: BTreeMap<NodeId, Replica>,
    tune: fn(&mut ReplicaConfig),
    // Last: removed once the replicas have stopped.
    dir: tempfile::TempDir,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let replicas = std::mem::take(&mut self.replicas);
        if replicas.is_empty() {
            return;
        }
        // Drop cannot await: block this thread (the tests run on a multi-threaded runtime, whose
        // workers drive the shutdown meanwhile), bounded so an unwinding test never hangs here.
        tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(async {
                for replica in replicas.into_values() {
                    if tokio::time::timeout(Duration::from_secs(10), replica.stop()).await.is_err() {
                        eprintln!("a replica did not stop within 10 s");
                    }
                }
            })
        });
    }
}

fn fast(config: &mut ReplicaConfig) {
    config.heartbeat = Duration::from_millis(50);
    config.election_timeout = (Duration::from_millis(300), Duration::from_millis(600));
}

impl Cluster {
    async fn start(n: u64, tune: fn(&mut ReplicaConfig)) -> Cluster {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let mut listeners = BTreeMap::new();
        for id in 1..=n {
            listeners.insert(id, tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap());
        }
        let addrs = listeners.iter().map(|(id, l)| (*id, l.local_addr().unwrap())).collect();
        let mut cluster = Cluster { addrs, replicas: BTreeMap::new(), tune, dir: tempfile::tempdir().unwrap() };
        for (id, listener) in listeners {
            cluster.launch(id, listener).await;
        }
        cluster
    }

    fn config(&self, id: NodeId) -> ReplicaConfig {
        let peers = self.addrs.iter().map(|(id, a)| (*id, a.to_string())).collect();
        let mut config =
            ReplicaConfig::new(id, peers, self.dir.path().join(format!("r{id}")), PeerToken::new(TOKEN).unwrap());
        (self.tune)(&mut config);
        config
    }

    async fn launch(&mut self, id: NodeId, listener: tokio::net::TcpListener) {
        let store = RaftStore::start(self.config(id)).await.unwrap();
        let routes = store.routes();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
            let _ = tonic::transport::Server::builder()
                .add_routes(routes)
                .serve_with_incoming_shutdown(incoming, async move {
                    let _ = stopped.await;
                })
                .await;
        });
        self.replicas.insert(id, Replica { store, server, stop });
    }

    async fn restart(&mut self, id: NodeId) {
        let listener = tokio::net::TcpListener::bind(self.addrs[&id]).await.unwrap();
        self.launch(id, listener).await;
    }

    async fn stop(&mut self, id: NodeId) {
        if let Some(r) = self.replicas.remove(&id) {
            r.stop().await;
        }
    }

    fn store(&self, id: NodeId) -> RaftStore {
        self.replicas[&id].store.clone()
    }

    /// The replica that acts as leader, once there is one.
    async fn leader(&self) -> NodeId {
        eventually("a leader", || async {
            self.replicas.iter().find(|(_, r)| *r.store.leading().borrow()).map(|(id, _)| *id)
        })
        .await
    }

    fn client(&self) -> RemoteStore {
        let endpoints: Vec<String> = self.addrs.values().map(|a| format!("http://{a}")).collect();
        RemoteStore::with_token(&endpoints, PeerToken::new(TOKEN).unwrap()).unwrap()
    }
}

async fn eventually<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn config_map(name: &str, value: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "t"}, "data": {"v": value}})
}

async fn count(store: &dyn Store) -> usize {
    store.list("ConfigMap", &ListOptions::default()).await.unwrap().items.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conformance_through_a_follower() {
    // A fresh 3-replica cluster per check: every write is forwarded from a follower. The cluster
    // is the check's guard: it stops and is removed when the check ends.
    gitplane_store::conformance::run_all(|| async {
        let cluster = Cluster::start(3, fast).await;
        let leader = cluster.leader().await;
        let follower = *cluster.addrs.keys().find(|id| **id != leader).unwrap();
        let store = cluster.store(follower);
        (cluster, store)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_leader_takes_writes_after_the_old_one_is_gone() {
    let mut cluster = Cluster::start(3, fast).await;
    let client = cluster.client();
    for i in 0..20 {
        client.txn(vec![Op::Create(config_map(&format!("a{i}"), "1"))]).await.unwrap();
    }
    let old = cluster.leader().await;
    cluster.stop(old).await;
    let new = cluster.leader().await;
    assert_ne!(new, old);
    for i in 0..20 {
        client.txn(vec![Op::Create(config_map(&format!("b{i}"), "1"))]).await.unwrap();
    }
    for id in cluster.replicas.keys().copied().collect::<Vec<_>>() {
        let store = cluster.store(id);
        eventually("every write on every live replica", || async { (count(&store).await == 40).then_some(()) }).await;
    }
    cluster.restart(old).await;
    let back = cluster.store(old);
    eventually("the old leader catches up", || async { (count(&back).await == 40).then_some(()) }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partitioned_leader_steps_down_and_cannot_acknowledge_writes() {
    let cluster = Cluster::start(3, fast).await;
    let old = cluster.leader().await;
    let isolated = cluster.store(old);
    for r in cluster.replicas.values() {
        r.store.faults().isolate(old);
    }
    eventually("the isolated leader steps down", || async { (!*isolated.leading().borrow()).then_some(()) }).await;
    let err = isolated.txn(vec![Op::Create(config_map("lost", "1"))]).await.unwrap_err();
    assert!(matches!(err, StoreError::Unavailable(_) | StoreError::NotLeader(_)), "{err}");
    let new = eventually("a new leader in the majority", || async {
        cluster.replicas.iter().find(|(id, r)| **id != old && *r.store.leading().borrow()).map(|(id, _)| *id)
    })
    .await;
    cluster.store(new).txn(vec![Op::Create(config_map("kept", "1"))]).await.unwrap();
    assert!(isolated.get(&ObjectKey::new("ConfigMap", "t", "lost")).await.unwrap().is_none());
    for r in cluster.replicas.values() {
        r.store.faults().heal();
    }
    eventually("the old leader rejoins", || async {
        isolated.get(&ObjectKey::new("ConfigMap", "t", "kept")).await.unwrap().map(|_| ())
    })
    .await;
    let everywhere = cluster.store(new).get(&ObjectKey::new("ConfigMap", "t", "lost")).await.unwrap();
    assert!(everywhere.is_none(), "a write the partitioned leader refused never appears");
}

const TOKEN: &str = "0123456789abcdef0123456789abcdef";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_peer_token_admits_the_replicas_and_refuses_the_rest() {
    let cluster = Cluster::start(3, fast).await;
    let leader = cluster.leader().await;
    // A write to a follower is forwarded, and replicated, with the token.
    let follower = *cluster.addrs.keys().find(|id| **id != leader).unwrap();
    cluster.store(follower).txn(vec![Op::Create(config_map("a", "1"))]).await.unwrap();
    for id in cluster.addrs.keys() {
        let store = cluster.store(*id);
        eventually("the write on every replica", || async { (count(&store).await == 1).then_some(()) }).await;
    }
    let key = ObjectKey::new("ConfigMap", "t", "a");
    let endpoints: Vec<String> = cluster.addrs.values().map(|a| format!("http://{a}")).collect();
    let wrong = RemoteStore::with_token(&endpoints, PeerToken::new(&TOKEN.replace('0', "1")).unwrap()).unwrap();
    assert!(wrong.txn(vec![Op::Create(config_map("b", "1"))]).await.unwrap_err().to_string().contains("peer token"));
    let admitted = RemoteStore::with_token(&endpoints, PeerToken::new(TOKEN).unwrap()).unwrap();
    assert!(admitted.get(&key).await.unwrap().is_some());
    assert!(PeerToken::new("short").is_err() && PeerToken::new("has a space in it here").is_err());
}

fn snapshot_often(config: &mut ReplicaConfig) {
    fast(config);
    config.snapshot_every = 50;
    config.logs_to_keep = 10;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lagging_follower_catches_up_by_snapshot_and_a_full_restart_loses_nothing() {
    let mut cluster = Cluster::start(3, snapshot_often).await;
    let leader = cluster.leader().await;
    let follower = *cluster.addrs.keys().find(|id| **id != leader).unwrap();
    cluster.stop(follower).await;
    let client = cluster.client();
    for i in 0..300 {
        client.txn(vec![Op::Create(config_map(&format!("c{i}"), &i.to_string()))]).await.unwrap();
    }
    let leader_store = cluster.store(leader);
    eventually("the leader purges its log", || async {
        leader_store.raft().metrics().borrow().purged.is_some().then_some(())
    })
    .await;
    cluster.restart(follower).await;
    let store = cluster.store(follower);
    eventually("the follower catches up", || async { (count(&store).await == 300).then_some(()) }).await;
    assert!(store.raft().metrics().borrow().snapshot.is_some(), "it caught up through a snapshot");
    let revision = leader_store.revision().await.unwrap();

    for id in [1, 2, 3] {
        cluster.stop(id).await;
    }
    for id in [1, 2, 3] {
        cluster.restart(id).await;
    }
    cluster.leader().await;
    for id in [1, 2, 3] {
        let store = cluster.store(id);
        eventually("all writes after a full restart", || async { (count(&store).await == 300).then_some(()) }).await;
        assert_eq!(store.revision().await.unwrap(), revision);
    }
    client.txn(vec![Op::Create(config_map("after", "1"))]).await.unwrap();
}
