//! The node service's watch cache, as the API server's cacher serves kubelets: one store watch of
//! Pods and Nodes per replica, the Pods indexed by `spec.nodeName`, fanned out to the nodes'
//! Pod watches, and the Nodes every call of a node is admitted against ([`identity::admit`]).
//!
//! A node's first list is served from the index. A watch resumed from a revision is served from
//! the recent changes kept here, then follows; one older than those gets `OutOfRange` and lists
//! again, as after a compaction (so does every watch when this cache lists the store again).
//! A Pod that leaves a node (its `nodeName` changed) is a delete there.

use crate::identity;
use futures::Stream;
use gitplane_api::object::from_value;
use gitplane_store::informer::AbortOnDrop;
use gitplane_store::reflector::{self, Reflect};
use gitplane_store::{Event, EventType, ObjectKey, Revision, Store};
use k8s_openapi::api::core::v1::Node;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};
use tonic::Status;

/// Recent changes kept for watches that resume (Kubernetes' watch cache keeps a window too).
const RECENT: usize = 20_000;
/// How often every node's watch gets a bookmark, so an idle node resumes from a recent revision
/// (its network and Pod config watches too: each store watch held per node then wakes for other
/// kinds' commits that seldom, not ten times a second).
pub(crate) const BOOKMARK_INTERVAL: Duration = Duration::from_secs(5);
/// Changes a node's watch may have in flight before it counts as fallen behind and ends.
const WATCHER_BUFFER: usize = 1024;

/// What a node's Pod watch receives.
#[derive(Clone, Debug)]
pub enum Change {
    /// A change of one of its Pods (a delete carries the Pod as it was).
    Pod(Arc<Event>),
    Bookmark(Revision),
    /// The watch ends with this status.
    End(Status),
}

/// A change, and the node it concerns.
#[derive(Clone, Debug)]
struct Recent {
    node: String,
    change: Change,
    revision: Revision,
}

struct Watcher {
    /// Changes up to this revision were served already (by another replica, ahead of this one).
    from: Revision,
    tx: mpsc::Sender<Change>,
}

/// The index and its watchers: pure bookkeeping, fed by the store watch task.
#[derive(Default)]
pub struct State {
    /// The revision of the last change applied; 0 until the first list is in.
    revision: Revision,
    /// Every change up to this revision is applied (a transaction's changes come one by one).
    complete: Revision,
    nodes: HashMap<String, Arc<Node>>,
    /// Node name -> (namespace, name) -> the bound Pod.
    pods: HashMap<String, BTreeMap<(String, String), Arc<Value>>>,
    /// (namespace, name) -> the node a Pod is bound to.
    bound: HashMap<(String, String), String>,
    recent: VecDeque<Recent>,
    /// `recent` holds every change after this revision.
    since: Revision,
    watchers: HashMap<String, Vec<Watcher>>,
    last_bookmark: Option<Instant>,
}

fn node_name(pod: &Value) -> Option<&str> {
    pod["spec"]["nodeName"].as_str().filter(|n| !n.is_empty())
}

fn id(key: &ObjectKey) -> (String, String) {
    (key.namespace.clone(), key.name.clone())
}

fn expired(from: Revision, since: Revision) -> Status {
    Status::out_of_range(format!(
        "the Pod watch cannot resume from revision {from}: this replica keeps changes after {since} only; list again"
    ))
}

impl State {
    /// Starts over from a list of every Pod and Node at `revision`: every watch ends and lists
    /// again, as what it missed is no longer known.
    pub fn relist(&mut self, revision: Revision, pods: Vec<Value>, nodes: Vec<Value>) {
        self.nodes =
            nodes.iter().filter_map(decode_node).map(|n| (n.metadata.name.clone().unwrap_or_default(), n)).collect();
        self.pods.clear();
        self.bound.clear();
        for pod in pods {
            let (Ok(key), Some(node)) = (ObjectKey::from_value(&pod), node_name(&pod).map(str::to_owned)) else {
                continue;
            };
            self.bound.insert(id(&key), node.clone());
            self.pods.entry(node).or_default().insert(id(&key), Arc::new(pod));
        }
        self.recent.clear();
        (self.revision, self.complete, self.since) = (revision, revision, revision);
        self.last_bookmark = Some(Instant::now());
        let status = Status::out_of_range("the control plane listed its Pods again: list again");
        for (_, watchers) in self.watchers.drain() {
            for watcher in watchers {
                let _ = watcher.tx.try_send(Change::End(status.clone()));
            }
        }
    }

    /// Applies one store event and passes it on to the watches it concerns.
    pub fn apply(&mut self, event: Event) {
        let revision = event.revision;
        if event.event_type == EventType::Bookmark {
            self.complete = revision;
        } else if revision > self.revision {
            self.complete = self.revision;
        }
        match (event.event_type, event.key.kind.as_str()) {
            (EventType::Bookmark, _) => {}
            (_, "Node") => self.node_changed(event),
            (_, "Pod") => self.pod_changed(event),
            _ => {}
        }
        self.revision = self.revision.max(revision);
        while self.recent.len() > RECENT {
            if let Some(dropped) = self.recent.pop_front() {
                self.since = dropped.revision;
            }
        }
        if self.last_bookmark.is_none_or(|t| t.elapsed() >= BOOKMARK_INTERVAL) {
            self.last_bookmark = Some(Instant::now());
            self.bookmark();
        }
    }

    fn node_changed(&mut self, event: Event) {
        if event.event_type == EventType::Deleted {
            self.nodes.remove(&event.key.name);
            let end = Change::End(identity::removed(&event.key.name));
            self.send(&event.key.name, event.revision, end);
            self.watchers.remove(&event.key.name);
        } else if let Some(node) = decode_node(&event.object) {
            self.nodes.insert(event.key.name.clone(), node);
        }
    }

    fn pod_changed(&mut self, event: Event) {
        let pod = id(&event.key);
        let now = (event.event_type != EventType::Deleted).then(|| node_name(&event.object)).flatten();
        let before = self.bound.get(&pod).cloned();
        if let Some(old) = before.as_deref().filter(|old| Some(*old) != now) {
            // Gone from that node: deleted, or (against the API's rules) moved elsewhere.
            let gone = self.pods.get_mut(old).and_then(|pods| pods.remove(&pod));
            if self.pods.get(old).is_some_and(BTreeMap::is_empty) {
                self.pods.remove(old);
            }
            self.bound.remove(&pod);
            let object = match event.event_type {
                EventType::Deleted => event.object.clone(),
                _ => gone.unwrap_or_else(|| event.object.clone()),
            };
            let deleted =
                Event { revision: event.revision, event_type: EventType::Deleted, key: event.key.clone(), object };
            self.send(old, event.revision, Change::Pod(Arc::new(deleted)));
        }
        let Some(node) = now.map(str::to_owned) else { return };
        self.bound.insert(pod.clone(), node.clone());
        self.pods.entry(node.clone()).or_default().insert(pod, event.object.clone());
        let revision = event.revision;
        self.send(&node, revision, Change::Pod(Arc::new(event)));
    }

    /// Records `change` for `node` and sends it to that node's watches.
    fn send(&mut self, node: &str, revision: Revision, change: Change) {
        self.recent.push_back(Recent { node: node.to_owned(), change: change.clone(), revision });
        if let Some(watchers) = self.watchers.get_mut(node) {
            deliver(watchers, revision, &change);
            if watchers.is_empty() {
                self.watchers.remove(node);
            }
        }
    }

    /// Every watch's bookmark at the revision completed; watches whose agent went away are
    /// dropped.
    fn bookmark(&mut self) {
        let revision = self.complete;
        self.watchers.retain(|_, watchers| {
            deliver(watchers, revision, &Change::Bookmark(revision));
            !watchers.is_empty()
        });
    }

    /// The stored Node of `name`, as of the revision reached.
    pub fn node(&self, name: &str) -> Option<Arc<Node>> {
        self.nodes.get(name).cloned()
    }

    /// Opens a Pod watch of `node` from `from` (0: a list of its Pods first, then a bookmark):
    /// what to send first, and the receiver of what follows.
    pub fn watch(&mut self, node: &str, from: Revision) -> Result<(Vec<Change>, mpsc::Receiver<Change>), Status> {
        let mut first = Vec::new();
        let skip = if from == 0 {
            // The Pods as of now; the bookmark at the last whole transaction, so a watch resumed
            // from it may see the rest of the current one again, never miss it.
            let revision = self.complete;
            for pod in self.pods.get(node).into_iter().flat_map(BTreeMap::values) {
                let Ok(key) = ObjectKey::from_value(pod) else { continue };
                let event = Event { revision, event_type: EventType::Added, key, object: pod.clone() };
                first.push(Change::Pod(Arc::new(event)));
            }
            first.push(Change::Bookmark(revision));
            0
        } else if from < self.since {
            return Err(expired(from, self.since));
        } else {
            let missed = self.recent.iter().filter(|r| r.revision > from && r.node == node);
            first.extend(missed.map(|r| r.change.clone()));
            if first.iter().any(|c| matches!(c, Change::End(_))) {
                return Err(identity::removed(node));
            }
            from
        };
        let (tx, rx) = mpsc::channel(WATCHER_BUFFER);
        self.watchers.entry(node.to_owned()).or_default().push(Watcher { from: skip, tx });
        Ok((first, rx))
    }
}

/// Sends `change` to each watcher that has not seen `revision`; drops those gone or behind.
fn deliver(watchers: &mut Vec<Watcher>, revision: Revision, change: &Change) {
    watchers.retain(|w| revision <= w.from || w.tx.try_send(change.clone()).is_ok());
}

fn decode_node(value: &Value) -> Option<Arc<Node>> {
    match from_value::<Node>(value.clone()) {
        Ok(node) => Some(Arc::new(node)),
        Err(e) => {
            tracing::warn!(error = %e, "a stored Node does not decode");
            None
        }
    }
}

/// The running cache: its state and the store watch task that feeds it.
pub struct WatchCache {
    state: Arc<Mutex<State>>,
    /// The revision reached, for waiters.
    revision: watch::Receiver<Revision>,
    _task: AbortOnDrop,
}

/// How long a call waits for the cache's first list.
const SYNC_TIMEOUT: Duration = Duration::from_secs(30);

impl WatchCache {
    /// Lists and watches the store's Pods and Nodes (call it within a tokio runtime).
    pub fn spawn(store: Arc<dyn Store>) -> WatchCache {
        let state = Arc::new(Mutex::new(State::default()));
        let (revision_tx, revision) = watch::channel(0);
        let kinds = vec!["Pod".into(), "Node".into()];
        let task = tokio::spawn(reflector::run(
            "the node service's Pod watch",
            store,
            kinds,
            Feed(state.clone()),
            revision_tx,
        ));
        WatchCache { state, revision, _task: AbortOnDrop(task.abort_handle()) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The Node of `name` if the cache holds it (none before its first list).
    pub fn node(&self, name: &str) -> Option<Arc<Node>> {
        self.lock().node(name)
    }

    /// Waits (a while at most) until the cache holds every change up to `revision`.
    pub async fn reached(&self, revision: Revision) {
        let mut reached = self.revision.clone();
        let _ = tokio::time::timeout(SYNC_TIMEOUT, reached.wait_for(|r| *r >= revision)).await;
    }

    /// A Pod watch of `node` from `from` ([`State::watch`]), once the first list is in.
    pub async fn watch(
        &self,
        node: &str,
        from: Revision,
    ) -> Result<impl Stream<Item = Change> + Send + 'static, Status> {
        let mut synced = self.revision.clone();
        match tokio::time::timeout(SYNC_TIMEOUT, synced.wait_for(|r| *r > 0)).await {
            Ok(Ok(_)) => {}
            _ => return Err(Status::unavailable("the node service has not listed the cluster's Pods yet; retry")),
        }
        let (first, rx) = self.lock().watch(node, from)?;
        let node = node.to_owned();
        // A receiver whose sender went without a last word fell behind (or the cache stopped).
        let rest = futures::stream::unfold((rx, false), move |(mut rx, ended)| {
            let node = node.clone();
            async move {
                if ended {
                    return None;
                }
                match rx.recv().await {
                    Some(change @ Change::End(_)) => Some((change, (rx, true))),
                    Some(change) => Some((change, (rx, false))),
                    None => Some((
                        Change::End(Status::unavailable(format!(
                            "the Pod watch of node {node} fell behind; resume it from its last revision"
                        ))),
                        (rx, true),
                    )),
                }
            }
        });
        Ok(futures::StreamExt::chain(futures::stream::iter(first), rest))
    }
}

/// What the reflector lists and watches goes into the state.
struct Feed(Arc<Mutex<State>>);

impl Reflect for Feed {
    fn replace(&mut self, lists: Vec<(String, Vec<Value>)>, revision: Revision) {
        let mut lists = lists.into_iter().map(|(_, items)| items);
        let (pods, nodes) = (lists.next().unwrap_or_default(), lists.next().unwrap_or_default());
        self.0.lock().unwrap_or_else(PoisonError::into_inner).relist(revision, pods, nodes);
    }

    fn apply(&mut self, events: Vec<Event>) {
        let mut state = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        for event in events {
            state.apply(event);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(event_type: EventType, revision: Revision, name: &str, node: Option<&str>) -> Step {
        let object = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
                            "spec": {"nodeName": node}});
        let key = ObjectKey::new("Pod", "default", name);
        Step::Apply(Event { revision, event_type, key, object: Arc::new(object) })
    }

    fn added(revision: Revision, name: &str, node: &str) -> Step {
        pod(EventType::Added, revision, name, Some(node))
    }

    fn modified(revision: Revision, name: &str, node: Option<&str>) -> Step {
        pod(EventType::Modified, revision, name, node)
    }

    fn deleted(revision: Revision, name: &str, node: &str) -> Step {
        pod(EventType::Deleted, revision, name, Some(node))
    }

    fn node_deleted(revision: Revision, name: &str) -> Step {
        let object = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}});
        let key = ObjectKey::new("Node", "", name);
        Step::Apply(Event { revision, event_type: EventType::Deleted, key, object: Arc::new(object) })
    }

    fn bookmark(revision: Revision) -> Step {
        Step::Apply(Event::bookmark(revision))
    }

    enum Step {
        Apply(Event),
        /// The store listed again at this revision, with these (name, node) Pods.
        Relist(Revision, Vec<(&'static str, &'static str)>),
    }

    fn run(state: &mut State, steps: Vec<Step>) {
        for step in steps {
            match step {
                Step::Apply(event) => state.apply(event),
                Step::Relist(revision, pods) => {
                    let pods = pods
                        .into_iter()
                        .map(|(name, node)| {
                            json!({"kind": "Pod", "metadata": {"name": name, "namespace": "default"},
                                   "spec": {"nodeName": node}})
                        })
                        .collect();
                    state.relist(revision, pods, Vec::new());
                }
            }
        }
    }

    fn show(change: &Change) -> String {
        match change {
            Change::Pod(e) => format!("{} {} @{}", e.event_type.as_str(), e.key.name, e.revision),
            Change::Bookmark(revision) => format!("BOOKMARK @{revision}"),
            Change::End(status) => format!("END {:?}", status.code()),
        }
    }

    /// What a watch received since, bookmarks left out (they follow the clock).
    fn received(rx: &mut mpsc::Receiver<Change>) -> Vec<String> {
        std::iter::from_fn(|| rx.try_recv().ok())
            .filter(|c| !matches!(c, Change::Bookmark(_)))
            .map(|c| show(&c))
            .collect()
    }

    #[test]
    fn pod_watches_are_served_from_the_index_and_the_recent_changes() {
        struct Case {
            what: &'static str,
            before: Vec<Step>,
            /// The watch of node a from this revision.
            from: Revision,
            first: Result<Vec<&'static str>, tonic::Code>,
            after: Vec<Step>,
            then: Vec<&'static str>,
        }
        let cases = [
            Case {
                what: "a first list: the node's Pods only, then a bookmark",
                before: vec![added(2, "p", "a"), added(3, "q", "b"), modified(4, "r", None), bookmark(4)],
                from: 0,
                first: Ok(vec!["ADDED p @4", "BOOKMARK @4"]),
                after: vec![modified(5, "q", Some("b")), modified(6, "p", Some("a"))],
                then: vec!["MODIFIED p @6"],
            },
            Case {
                what: "a bookmark only at a whole transaction",
                before: vec![added(2, "p", "a"), added(3, "q", "a")],
                from: 0,
                first: Ok(vec!["ADDED p @2", "ADDED q @2", "BOOKMARK @2"]),
                after: vec![],
                then: vec![],
            },
            Case {
                what: "a binding reaches the node it binds to",
                before: vec![pod(EventType::Added, 2, "p", None), bookmark(2)],
                from: 0,
                first: Ok(vec!["BOOKMARK @2"]),
                after: vec![modified(3, "p", Some("a"))],
                then: vec!["MODIFIED p @3"],
            },
            Case {
                what: "resumed: what it missed, each delete once",
                before: vec![added(2, "p", "a"), modified(3, "p", Some("a")), added(4, "q", "b"), deleted(5, "p", "a")],
                from: 3,
                first: Ok(vec!["DELETED p @5"]),
                after: vec![deleted(6, "q", "b"), added(7, "r", "a")],
                then: vec!["ADDED r @7"],
            },
            Case {
                what: "resumed from before what is kept: list again",
                before: vec![Step::Relist(10, vec![("p", "a")]), added(11, "q", "a")],
                from: 9,
                first: Err(tonic::Code::OutOfRange),
                after: vec![],
                then: vec![],
            },
            Case {
                what: "resumed from where this replica has not come yet: nothing twice",
                before: vec![added(2, "p", "a")],
                from: 4,
                first: Ok(vec![]),
                after: vec![modified(3, "p", Some("a")), modified(4, "p", Some("a")), modified(5, "p", Some("a"))],
                then: vec!["MODIFIED p @5"],
            },
            Case {
                what: "a Pod moved elsewhere is a delete here",
                before: vec![added(2, "p", "a"), bookmark(2)],
                from: 0,
                first: Ok(vec!["ADDED p @2", "BOOKMARK @2"]),
                after: vec![modified(3, "p", Some("b"))],
                then: vec!["DELETED p @3"],
            },
            Case {
                what: "the node deleted ends its watch",
                before: vec![bookmark(1)],
                from: 0,
                first: Ok(vec!["BOOKMARK @1"]),
                after: vec![node_deleted(2, "b"), node_deleted(3, "a")],
                then: vec!["END Unauthenticated"],
            },
            Case {
                what: "resumed across its node's delete: refused",
                before: vec![added(2, "p", "a"), node_deleted(3, "a")],
                from: 2,
                first: Err(tonic::Code::Unauthenticated),
                after: vec![],
                then: vec![],
            },
            Case {
                what: "the cache listed again: every watch lists again",
                before: vec![added(2, "p", "a"), bookmark(2)],
                from: 0,
                first: Ok(vec!["ADDED p @2", "BOOKMARK @2"]),
                after: vec![Step::Relist(9, vec![("p", "a")])],
                then: vec!["END OutOfRange"],
            },
        ];
        for case in cases {
            let mut state = State::default();
            state.relist(1, Vec::new(), Vec::new());
            run(&mut state, case.before);
            let mut rx = match (state.watch("a", case.from), case.first) {
                (Ok((first, rx)), Ok(expected)) => {
                    assert_eq!(first.iter().map(show).collect::<Vec<_>>(), expected, "{}", case.what);
                    rx
                }
                (Err(status), Err(code)) => {
                    assert_eq!(status.code(), code, "{}: {status:?}", case.what);
                    continue;
                }
                (got, expected) => panic!("{}: {:?} != {expected:?}", case.what, got.map(|(first, _)| first)),
            };
            run(&mut state, case.after);
            assert_eq!(received(&mut rx), case.then, "{}", case.what);
        }
    }

    #[test]
    fn a_watch_that_falls_behind_is_dropped_and_the_others_go_on() {
        let mut state = State::default();
        state.relist(1, Vec::new(), Vec::new());
        let (_, mut slow) = state.watch("a", 0).unwrap();
        let (_, mut live) = state.watch("a", 0).unwrap();
        let mut seen = 0;
        for revision in 2..(2 + WATCHER_BUFFER as i64 + 10) {
            run(&mut state, vec![modified(revision, "p", Some("a"))]);
            seen += received(&mut live).len();
        }
        assert_eq!(seen, WATCHER_BUFFER + 10, "the live watch got every change");
        assert_eq!(received(&mut slow).len(), WATCHER_BUFFER, "the slow one what fit");
        assert_eq!(slow.try_recv().unwrap_err(), mpsc::error::TryRecvError::Disconnected, "then it was dropped");
    }
}
