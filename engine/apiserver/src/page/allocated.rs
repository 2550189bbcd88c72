//! What `kubectl describe node` calls "Allocated resources", kept per node from the store's
//! watch, so the nodes view costs O(nodes shown) and not a read of every Pod per render.
//!
//! One list of Pods, then the watch (with bookmarks, so the revision follows commits of other
//! kinds too); an expired watch lists again. Per Pod only its node, phase and effective request
//! are kept (the scheduler's own [`pod_requests`], so the page and the scheduler agree); a
//! node's allocation is the sum over its Pods that are not Succeeded or Failed.

use futures::StreamExt as _;
use gitplane_scheduler::resources::{Resources, pod_requests};
use gitplane_store::reflector::{self, Reflect};
use gitplane_store::{Event, EventType, Revision, Store, StoreError, WatchOptions, informer::AbortOnDrop};
use k8s_openapi::api::core::v1::Pod;
use serde::Deserialize as _;
use serde_json::Value;
use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, RwLock},
    time::Duration,
};
use tokio::sync::watch;

/// A Pod as the nodes view shows it: `(namespace, name)`.
pub type PodName = (String, String);

#[derive(Clone, Debug)]
pub struct PodSummary {
    pub phase: String,
    pub requests: Resources,
}

impl PodSummary {
    /// A Succeeded or Failed Pod holds nothing of its node any more.
    pub fn terminal(&self) -> bool {
        matches!(self.phase.as_str(), "Succeeded" | "Failed")
    }
}

/// The Pods bound to one node (or, under `""`, to none yet).
#[derive(Default)]
pub struct NodePods {
    pub pods: BTreeMap<PodName, PodSummary>,
    /// The sum of the requests of the Pods that are not terminal (`pods` counts them).
    pub allocated: Resources,
}

#[derive(Default)]
struct Index {
    nodes: HashMap<String, NodePods>,
    /// Where each Pod is listed.
    node_of: HashMap<PodName, String>,
}

impl Index {
    fn remove(&mut self, pod: &PodName) {
        let Some(node) = self.node_of.remove(pod) else { return };
        let Some(on) = self.nodes.get_mut(&node) else { return };
        if let Some(old) = on.pods.remove(pod)
            && !old.terminal()
        {
            on.allocated.sub(&old.requests);
        }
        if on.pods.is_empty() {
            self.nodes.remove(&node);
        }
    }

    fn insert(&mut self, pod: &Value) {
        let meta = &pod["metadata"];
        let name: PodName =
            (meta["namespace"].as_str().unwrap_or("").to_owned(), meta["name"].as_str().unwrap_or("").to_owned());
        self.remove(&name);
        let node = pod["spec"]["nodeName"].as_str().unwrap_or("").to_owned();
        // A Pod that does not decode still counts as a Pod; it requests nothing we can read.
        let requests =
            Pod::deserialize(pod).map(|p| pod_requests(&p)).unwrap_or(Resources { pods: 1, ..Default::default() });
        let summary = PodSummary { phase: pod["status"]["phase"].as_str().unwrap_or("").to_owned(), requests };
        let on = self.nodes.entry(node.clone()).or_default();
        if !summary.terminal() {
            on.allocated.add(&summary.requests);
        }
        on.pods.insert(name.clone(), summary);
        self.node_of.insert(name, node);
    }

    fn apply(&mut self, event: &Event) {
        match event.event_type {
            EventType::Added | EventType::Modified => self.insert(&event.object),
            EventType::Deleted => self.remove(&(event.key.namespace.clone(), event.key.name.clone())),
            EventType::Bookmark => {}
        }
    }
}

/// The running index; its task stops when the last clone is dropped.
#[derive(Clone)]
pub struct Allocated {
    index: Arc<RwLock<Index>>,
    /// The revision the index has reached (0 until the first list is in).
    revision: watch::Receiver<Revision>,
    _task: Arc<AbortOnDrop>,
}

impl Allocated {
    pub fn spawn(store: Arc<dyn Store>) -> Allocated {
        let index = Arc::new(RwLock::new(Index::default()));
        let (reached, revision) = watch::channel(0);
        let feed = Feed(index.clone());
        let task = tokio::spawn(reflector::run("the nodes view's Pod index", store, vec!["Pod".into()], feed, reached));
        Allocated { index, revision, _task: Arc::new(AbortOnDrop(task.abort_handle())) }
    }

    /// Waits (at most `within`) until the index holds every Pod change committed before the
    /// call; returns the revision the view is rendered at (its watch resumes from there). The
    /// index's own revision moves on commits of other kinds only with the watch's bookmarks,
    /// which are throttled, so when it lags a fresh watch from it tells at once whether a Pod
    /// changed since (its first event) or nothing did (a bookmark at the latest revision).
    pub async fn caught_up(&self, store: &dyn Store, within: Duration) -> Result<Revision, StoreError> {
        let deadline = tokio::time::Instant::now() + within;
        let latest = store.revision().await?;
        let mut seen = self.revision.clone();
        loop {
            let at = *seen.borrow_and_update();
            if at >= latest {
                return Ok(at);
            }
            let options = WatchOptions { kinds: Some(vec!["Pod".to_owned()]), bookmarks: true, ..Default::default() };
            let first = tokio::time::timeout_at(deadline, async {
                if at == 0 {
                    return Ok(None); // the first list is not in yet
                }
                store.watch(at, options).await?.next().await.transpose()
            })
            .await;
            let pending = match first {
                Ok(Ok(Some(event))) if event.event_type == EventType::Bookmark => {
                    return Ok(event.revision.min(latest));
                }
                Ok(Ok(Some(event))) => event.revision,
                Ok(Ok(None)) => at + 1,
                // The index lists again (expired), or time is up: render what it has.
                Ok(Err(StoreError::Expired { .. })) | Err(_) => return Ok(at),
                Ok(Err(e)) => return Err(e),
            };
            if tokio::time::timeout_at(deadline, seen.wait_for(|r| *r >= pending)).await.is_err() {
                return Ok(*self.revision.borrow());
            }
        }
    }

    /// Reads a node's Pods (`""`: those not scheduled yet).
    pub fn read<T>(&self, node: &str, f: impl FnOnce(Option<&NodePods>) -> T) -> T {
        let index = self.index.read().unwrap_or_else(|e| e.into_inner());
        f(index.nodes.get(node))
    }
}

/// What the reflector lists and watches goes into the index.
struct Feed(Arc<RwLock<Index>>);

impl Reflect for Feed {
    fn replace(&mut self, lists: Vec<(String, Vec<Value>)>, _: Revision) {
        let mut fresh = Index::default();
        for pod in lists.iter().flat_map(|(_, items)| items) {
            fresh.insert(pod);
        }
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = fresh;
    }

    fn apply(&mut self, events: Vec<Event>) {
        let mut index = self.0.write().unwrap_or_else(|e| e.into_inner());
        for event in &events {
            index.apply(event);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gitplane_store::ObjectKey;
    use serde_json::json;

    fn pod(name: &str, node: &str, phase: &str, cpu: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
               "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}}}],
                        "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "2"}}}]},
               "status": {"phase": phase}})
    }

    fn event(event_type: EventType, object: Value) -> Event {
        let key = ObjectKey::from_value(&object).unwrap();
        Event { revision: 1, event_type, key, object: Arc::new(object) }
    }

    #[test]
    fn allocation_follows_binding_phase_and_deletion() {
        let mut index = Index::default();
        index.apply(&event(EventType::Added, pod("a", "", "Pending", "100m")));
        index.apply(&event(EventType::Added, pod("b", "n1", "Running", "250m")));
        assert_eq!(index.nodes[""].pods.len(), 1);
        // Bound by the scheduler: it moves from "" to n1. The init container's 2 CPUs count
        // (the effective request is the larger of the containers' sum and any init container).
        index.apply(&event(EventType::Modified, pod("a", "n1", "Running", "100m")));
        assert!(!index.nodes.contains_key(""));
        let n1 = &index.nodes["n1"];
        assert_eq!((n1.allocated.cpu_milli, n1.allocated.memory, n1.allocated.pods), (4_000, 128 << 20, 2));
        // A Succeeded Pod stays listed but holds nothing.
        index.apply(&event(EventType::Modified, pod("b", "n1", "Succeeded", "250m")));
        let n1 = &index.nodes["n1"];
        assert_eq!((n1.pods.len(), n1.allocated.cpu_milli, n1.allocated.pods), (2, 2_000, 1));
        index.apply(&event(EventType::Deleted, pod("a", "n1", "Running", "100m")));
        index.apply(&event(EventType::Deleted, pod("b", "n1", "Succeeded", "250m")));
        assert!(index.nodes.is_empty() && index.node_of.is_empty());
    }

    #[tokio::test]
    async fn a_view_waits_for_pod_changes_and_not_for_other_kinds() {
        let store: Arc<dyn Store> = Arc::new(gitplane_storage::sqlite::SqliteStore::memory().await.unwrap());
        store.txn(vec![gitplane_store::Op::Create(pod("a", "n1", "Running", "100m"))]).await.unwrap();
        let allocated = Allocated::spawn(store.clone());
        let within = Duration::from_secs(30);
        let at = allocated.caught_up(&*store, within).await.unwrap();
        assert_eq!(allocated.read("n1", |on| on.map(|on| on.pods.len())), Some(1));
        // Commits of another kind: no Pod changed, so no wait for a bookmark.
        for i in 0..3 {
            let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("c{i}"), "namespace": "default"}});
            store.txn(vec![gitplane_store::Op::Create(cm)]).await.unwrap();
        }
        let latest = store.revision().await.unwrap();
        assert_eq!(allocated.caught_up(&*store, within).await.unwrap(), latest);
        assert!(latest > at);
        // A Pod change is in the index once caught_up returns.
        store.txn(vec![gitplane_store::Op::Create(pod("b", "n1", "Running", "100m"))]).await.unwrap();
        allocated.caught_up(&*store, within).await.unwrap();
        assert_eq!(allocated.read("n1", |on| on.map(|on| on.pods.len())), Some(2));
    }
}
