//! The scheduling loop against a real (SQLite) store: Pods are bound to nodes that fit, Pods
//! that fit nowhere wait for a change of the cluster, finished Pods free their node, a Pod
//! whose binding fails is retried rather than dropped, and Pods placed by node affinity, host
//! ports, inter-Pod anti-affinity and topology spread constraints see the Pods bound before them.

use gitplane_scheduler::Scheduler;
use gitplane_storage::sqlite::SqliteStore;
use gitplane_store::{
    Committed, List, ListOptions, Op, Revision, Store, StoreError, WatchOptions, WatchStream, informer::Informer,
};
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};
use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

fn node(name: &str, pods: u32, ready: bool) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name},
        "status": {
            "allocatable": {"cpu": "4", "memory": "8Gi", "pods": pods.to_string()},
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]
        }
    })
}

fn pod(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "gitplane.local/busybox:1"}]}
    })
}

/// A Pod already bound to `node`, in `phase`.
fn bound_pod(name: &str, node: &str, phase: &str) -> Value {
    let mut pod = pod(name);
    pod["spec"]["nodeName"] = json!(node);
    pod["status"] = json!({"phase": phase});
    pod
}

struct Cluster {
    store: Arc<dyn Store>,
    scheduler: tokio::task::JoinHandle<()>,
}

impl Cluster {
    /// Starts the scheduler over `store` after writing `objects`.
    async fn start(store: Arc<dyn Store>, objects: Vec<Value>) -> Cluster {
        if !objects.is_empty() {
            store.txn(objects.into_iter().map(Op::Create).collect()).await.unwrap();
        }
        let informer = Informer::spawn(store.clone(), vec!["Pod".into(), "Node".into(), "Namespace".into()]);
        let scheduler = tokio::spawn(Scheduler::new(store.clone(), informer, Default::default()).run());
        Cluster { store, scheduler }
    }

    async fn pod(&self, name: &str) -> Pod {
        let value = self.store.get(&gitplane_store::ObjectKey::of::<Pod>("default", name)).await.unwrap();
        serde_json::from_value(value.expect("the pod exists")).unwrap()
    }

    /// Waits until the Pod is bound and returns its node.
    async fn bound(&self, name: &str) -> String {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let pod = self.pod(name).await;
            if let Some(node) = pod.spec.and_then(|s| s.node_name) {
                return node;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {name} to be bound: {:?}",
                pod.status
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until the Pod's PodScheduled condition says it fits nowhere; returns the message.
    async fn unschedulable(&self, name: &str) -> String {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let pod = self.pod(name).await;
            let condition = pod.status.as_ref().and_then(|s| s.conditions.as_ref()).and_then(|c| {
                c.iter().find(|c| c.type_ == "PodScheduled" && c.reason.as_deref() == Some("Unschedulable"))
            });
            if let Some(message) = condition.and_then(|c| c.message.clone()) {
                assert!(pod.spec.unwrap().node_name.is_none());
                return message;
            }
            assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {name} to be unschedulable");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn set_phase(&self, name: &str, phase: &str) {
        let mut pod = serde_json::to_value(self.pod(name).await).unwrap();
        pod["status"]["phase"] = json!(phase);
        self.store.txn(vec![Op::UpdateStatus(pod)]).await.unwrap();
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.scheduler.abort();
    }
}

async fn sqlite() -> Arc<dyn Store> {
    Arc::new(SqliteStore::memory().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t20_pods_go_to_ready_nodes_that_fit_and_wait_for_room() {
    let objects = vec![node("a", 2, true), node("b", 1, false), pod("p1"), pod("p2"), pod("p3")];
    let cluster = Cluster::start(sqlite().await, objects).await;
    assert_eq!(cluster.bound("p1").await, "a");
    assert_eq!(cluster.bound("p2").await, "a");
    assert_eq!(
        cluster.unschedulable("p3").await,
        "0/2 nodes are available: 1 Too many pods, 1 node(s) were not ready."
    );
    // A node that becomes Ready is a change of the cluster: the waiting Pod is tried again.
    cluster.store.txn(vec![Op::UpdateStatus(node("b", 1, true))]).await.unwrap();
    assert_eq!(cluster.bound("p3").await, "b");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t20_a_deleted_pod_makes_room() {
    let cluster = Cluster::start(sqlite().await, vec![node("a", 1, true), pod("p1")]).await;
    assert_eq!(cluster.bound("p1").await, "a");
    cluster.store.txn(vec![Op::Create(pod("p2"))]).await.unwrap();
    cluster.unschedulable("p2").await;
    let key = gitplane_store::ObjectKey::of::<Pod>("default", "p1");
    cluster.store.txn(vec![Op::Delete { key, revision: None }]).await.unwrap();
    assert_eq!(cluster.bound("p2").await, "a");
}

/// Succeeded and Failed Pods no longer hold their node's capacity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_pods_free_their_node() {
    let objects = vec![node("a", 2, true), bound_pod("done", "a", "Succeeded"), bound_pod("crashed", "a", "Failed")];
    let cluster = Cluster::start(sqlite().await, objects).await;
    cluster.store.txn(vec![Op::Create(pod("p1"))]).await.unwrap();
    assert_eq!(cluster.bound("p1").await, "a", "a node full of finished Pods has room");

    // A Pod that finishes is a change of the cluster: a Pod waiting for room is tried again.
    cluster.store.txn(vec![Op::Create(bound_pod("running", "a", "Running"))]).await.unwrap();
    cluster.store.txn(vec![Op::Create(pod("p2"))]).await.unwrap();
    assert_eq!(cluster.unschedulable("p2").await, "0/1 nodes are available: 1 Too many pods.");
    cluster.set_phase("running", "Succeeded").await;
    assert_eq!(cluster.bound("p2").await, "a");
}

/// A store whose first `failures` binding transactions fail, as a replica that loses its
/// leadership or a full disk would make them fail.
struct FailingBinds {
    inner: Arc<dyn Store>,
    failures: AtomicUsize,
    attempts: AtomicUsize,
}

fn is_binding(ops: &[Op]) -> bool {
    matches!(ops.first(), Some(Op::UpdateWithStatus(pod)) if pod["kind"] == "Pod" && pod["spec"]["nodeName"].is_string())
}

#[async_trait::async_trait]
impl Store for FailingBinds {
    async fn get(&self, key: &gitplane_store::ObjectKey) -> gitplane_store::Result<Option<Value>> {
        self.inner.get(key).await
    }

    async fn list(&self, kind: &str, options: &ListOptions) -> gitplane_store::Result<List> {
        self.inner.list(kind, options).await
    }

    async fn txn(&self, ops: Vec<Op>) -> gitplane_store::Result<Committed> {
        if is_binding(&ops) {
            self.attempts.fetch_add(1, Ordering::SeqCst);
            let fail = self.failures.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
            if fail {
                return Err(StoreError::Unavailable("injected: the binding was not written".into()));
            }
        }
        self.inner.txn(ops).await
    }

    async fn watch(&self, from: Revision, options: WatchOptions) -> gitplane_store::Result<WatchStream> {
        self.inner.watch(from, options).await
    }

    async fn revision(&self) -> gitplane_store::Result<Revision> {
        self.inner.revision().await
    }

    async fn compact(&self, revision: Revision) -> gitplane_store::Result<()> {
        self.inner.compact(revision).await
    }
}

/// A binding that fails (not a conflict) is retried with backoff.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_binding_is_retried() {
    let store =
        Arc::new(FailingBinds { inner: sqlite().await, failures: AtomicUsize::new(2), attempts: AtomicUsize::new(0) });
    let cluster = Cluster::start(store.clone(), vec![node("a", 10, true), pod("p1")]).await;
    assert_eq!(cluster.bound("p1").await, "a");
    assert_eq!(store.attempts.load(Ordering::SeqCst), 3, "two failed bindings, then the one that was written");
    // Nothing else is held back by the Pod's failures.
    cluster.store.txn(vec![Op::Create(pod("p2"))]).await.unwrap();
    assert_eq!(cluster.bound("p2").await, "a");
}

/// A store where another writer gets to some Pods just before the scheduler's binding of them
/// commits: `gone` is deleted, `taken` is bound to node `b`.
struct Interfering {
    inner: Arc<dyn Store>,
}

#[async_trait::async_trait]
impl Store for Interfering {
    async fn get(&self, key: &gitplane_store::ObjectKey) -> gitplane_store::Result<Option<Value>> {
        self.inner.get(key).await
    }

    async fn list(&self, kind: &str, options: &ListOptions) -> gitplane_store::Result<List> {
        self.inner.list(kind, options).await
    }

    async fn txn(&self, ops: Vec<Op>) -> gitplane_store::Result<Committed> {
        if let Some(Op::UpdateWithStatus(pod)) = ops.first().filter(|_| is_binding(&ops)) {
            let key = gitplane_store::ObjectKey::of::<Pod>("default", pod["metadata"]["name"].as_str().unwrap());
            match key.name.as_str() {
                "gone" => {
                    self.inner.txn(vec![Op::Delete { key, revision: None }]).await?;
                }
                "taken" => {
                    let mut current = self.inner.get(&key).await?.unwrap();
                    current["spec"]["nodeName"] = json!("b");
                    self.inner.txn(vec![Op::Update(current)]).await?;
                }
                _ => {}
            }
        }
        self.inner.txn(ops).await
    }

    async fn watch(&self, from: Revision, options: WatchOptions) -> gitplane_store::Result<WatchStream> {
        self.inner.watch(from, options).await
    }

    async fn revision(&self) -> gitplane_store::Result<Revision> {
        self.inner.revision().await
    }

    async fn compact(&self, revision: Revision) -> gitplane_store::Result<()> {
        self.inner.compact(revision).await
    }
}

/// Bindings commit together but each on its own: a Pod deleted or bound by another writer
/// meanwhile fails alone, and the loop goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binding_that_conflicts_fails_alone() {
    let mut objects = vec![node("a", 110, true), node("b", 110, false), pod("gone"), pod("taken")];
    objects.extend((0..20).map(|i| pod(&format!("p{i}"))));
    let cluster = Cluster::start(Arc::new(Interfering { inner: sqlite().await }), objects).await;
    for i in 0..20 {
        assert_eq!(cluster.bound(&format!("p{i}")).await, "a");
    }
    assert_eq!(cluster.bound("taken").await, "b", "the other writer's binding stays");
    let gone = cluster.store.get(&gitplane_store::ObjectKey::of::<Pod>("default", "gone")).await.unwrap();
    assert!(gone.is_none());
    cluster.store.txn(vec![Op::Create(pod("later"))]).await.unwrap();
    assert_eq!(cluster.bound("later").await, "a");
}

fn zoned(name: &str, zone: &str) -> Value {
    let mut node = node(name, 110, true);
    node["metadata"]["labels"] = json!({"kubernetes.io/hostname": name, "topology.kubernetes.io/zone": zone});
    node
}

fn with_spec(name: &str, labels: Value, spec: Value) -> Value {
    let mut pod = pod(name);
    pod["metadata"]["labels"] = labels;
    for (key, value) in spec.as_object().unwrap() {
        pod["spec"][key] = value.clone();
    }
    pod
}

/// Each plugin over what the loop bound before: the cache and the Pods it assumed bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t20_plugins_see_the_pods_bound_before() {
    let objects = vec![
        zoned("a1", "a"),
        zoned("a2", "a"),
        zoned("b1", "b"),
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default", "labels": {"team": "web"}}}),
    ];
    let cluster = Cluster::start(sqlite().await, objects).await;

    // Anti-affinity per zone over namespaces selected by label: one per zone, the third waits.
    let anti = json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
        "labelSelector": {"matchLabels": {"app": "db"}},
        "namespaceSelector": {"matchLabels": {"team": "web"}},
        "topologyKey": "topology.kubernetes.io/zone"
    }]}}});
    let db = |name: &str| with_spec(name, json!({"app": "db"}), anti.clone());
    cluster.store.txn(vec![Op::Create(db("db-0")), Op::Create(db("db-1")), Op::Create(db("db-2"))]).await.unwrap();
    let mut zones = Vec::new();
    for name in ["db-0", "db-1", "db-2"] {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let pod = cluster.pod(name).await;
            if pod.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some() {
                zones.push(cluster.bound(name).await[..1].to_owned());
                break;
            }
            let unschedulable = pod.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|c| {
                c.iter().any(|c| c.type_ == "PodScheduled" && c.reason.as_deref() == Some("Unschedulable"))
            });
            if unschedulable {
                assert_eq!(
                    cluster.unschedulable(name).await,
                    "0/3 nodes are available: 3 node(s) didn't match pod anti-affinity rules."
                );
                zones.push("-".into());
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {name}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    zones.sort();
    assert_eq!(zones, ["-", "a", "b"]);

    // Host ports and node affinity: a2 is the only node left with the port and in zone a.
    let port = |name: &str, node_affinity: Value| {
        with_spec(
            name,
            json!({}),
            json!({
                "containers": [{"name": "c", "image": "gitplane.local/busybox:1",
                    "ports": [{"containerPort": 80, "hostPort": 8080}]}],
                "affinity": {"nodeAffinity": node_affinity}
            }),
        )
    };
    let required_zone_a = json!({"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}]}
    ]}});
    let on = |node: &str| {
        json!({"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        ]}})
    };
    cluster.store.txn(vec![Op::Create(port("web-0", on("a1")))]).await.unwrap();
    assert_eq!(cluster.bound("web-0").await, "a1");
    cluster.store.txn(vec![Op::Create(port("web-1", required_zone_a.clone()))]).await.unwrap();
    assert_eq!(cluster.bound("web-1").await, "a2");
    cluster.store.txn(vec![Op::Create(port("web-2", required_zone_a))]).await.unwrap();
    assert_eq!(
        cluster.unschedulable("web-2").await,
        "0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, \
         2 node(s) didn't have free ports for the requested pod ports."
    );

    // Topology spread: zone a holds two "spread" Pods, so with maxSkew 1 the next goes to b.
    let spread = |name: &str| {
        with_spec(
            name,
            json!({"app": "spread"}),
            json!({"topologySpreadConstraints": [{
                "maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "whenUnsatisfiable": "DoNotSchedule",
                "labelSelector": {"matchLabels": {"app": "spread"}}
            }]}),
        )
    };
    let mut pinned = spread("spread-0");
    pinned["spec"]["nodeName"] = json!("a1");
    let mut second = spread("spread-1");
    second["spec"]["nodeName"] = json!("a2");
    cluster.store.txn(vec![Op::Create(pinned), Op::Create(second)]).await.unwrap();
    cluster.store.txn(vec![Op::Create(spread("spread-2"))]).await.unwrap();
    assert_eq!(cluster.bound("spread-2").await, "b1");
}
