//! A shared informer, as client-go's: list the watched kinds, then follow the store's watch into
//! an in-memory cache, and fan every change out to subscribers. Controllers and the scheduler
//! read the cache and write through the store with compare-and-swap. A process's loops get their
//! informer from one [`SharedInformerFactory`], so each object is cached once however many loops
//! read it.
//!
//! A watch that falls behind compaction re-lists; subscribers then receive `Resync` and should
//! re-enqueue everything (level-triggered, as Kubernetes controllers are).

use crate::reflector::{self, Reflect};
use crate::{Event, EventType, ObjectKey, Revision, Store};
use gitplane_api::kube_core::Resource;
use gitplane_api::object::{APPLICATION_ANNOTATION, from_value, kind_of};
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::{Arc, Mutex, RwLock, Weak},
};
use tokio::sync::{broadcast, watch};

/// What subscribers receive.
#[derive(Clone, Debug)]
pub enum Notification {
    Changed(Arc<Event>),
    /// The cache was rebuilt from a fresh list: reconcile everything.
    Resync,
}

/// The cached objects of the watched kinds, and which of them each Application owns.
#[derive(Default)]
pub struct Cache {
    objects: RwLock<Objects>,
}

#[derive(Default)]
struct Objects {
    by_kind: HashMap<String, BTreeMap<(String, String), Arc<Value>>>,
    /// The value of the inventory annotation (an Application's `namespace/name`) -> the objects
    /// that carry it: what an Application owns without a scan of every object.
    owned: HashMap<String, BTreeSet<ObjectKey>>,
    /// Changes applied (events and relists): equal counts, equal contents.
    changes: u64,
    /// The uid of a controller (an ownerReference with `controller: true`) -> the objects it
    /// controls: a ReplicaSet's Pods without a scan of every Pod of the namespace.
    controlled: HashMap<String, BTreeSet<ObjectKey>>,
}

fn owner(object: &Value) -> Option<&str> {
    object["metadata"]["annotations"][APPLICATION_ANNOTATION].as_str()
}

/// The uids of the object's controllers (one, for anything the API accepts).
fn controllers(object: &Value) -> impl Iterator<Item = &str> {
    object["metadata"]["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["controller"] == true)
        .filter_map(|r| r["uid"].as_str())
}

impl Objects {
    fn disown(&mut self, key: &ObjectKey, object: &Value) {
        let remove = |index: &mut HashMap<String, BTreeSet<ObjectKey>>, by: &str| {
            if let Some(keys) = index.get_mut(by) {
                keys.remove(key);
                if keys.is_empty() {
                    index.remove(by);
                }
            }
        };
        if let Some(app) = owner(object) {
            remove(&mut self.owned, app);
        }
        for uid in controllers(object) {
            remove(&mut self.controlled, uid);
        }
    }

    fn own(&mut self, key: &ObjectKey, object: &Value) {
        if let Some(app) = owner(object) {
            self.owned.entry(app.to_owned()).or_default().insert(key.clone());
        }
        for uid in controllers(object) {
            self.controlled.entry(uid.to_owned()).or_default().insert(key.clone());
        }
    }
}

impl Cache {
    /// How many changes the cache has applied. Work computed from the cache between two equal
    /// readings saw one unchanged state, and that state again while it reads the same.
    pub fn changes(&self) -> u64 {
        self.objects.read().unwrap_or_else(|e| e.into_inner()).changes
    }

    pub fn get(&self, key: &ObjectKey) -> Option<Arc<Value>> {
        let objects = self.objects.read().unwrap_or_else(|e| e.into_inner());
        objects.by_kind.get(&key.kind)?.get(&(key.namespace.clone(), key.name.clone())).cloned()
    }

    /// The objects whose inventory annotation names `app` (`namespace/name`), ordered by key.
    pub fn owned_by(&self, app: &str) -> Vec<(ObjectKey, Arc<Value>)> {
        let objects = self.objects.read().unwrap_or_else(|e| e.into_inner());
        let Some(keys) = objects.owned.get(app) else { return Vec::new() };
        keys.iter()
            .filter_map(|key| {
                let object = objects.by_kind.get(&key.kind)?.get(&(key.namespace.clone(), key.name.clone()))?;
                Some((key.clone(), object.clone()))
            })
            .collect()
    }

    /// The objects of kind `K` in `namespace` that the object with this uid controls, ordered by
    /// name: what `list_typed_where` with a controller filter returns, from an index.
    pub fn controlled_by<K: Resource<DynamicType = ()> + DeserializeOwned>(
        &self,
        namespace: &str,
        uid: &str,
    ) -> Vec<K> {
        let kind = kind_of::<K>();
        let values: Vec<Arc<Value>> = {
            let objects = self.objects.read().unwrap_or_else(|e| e.into_inner());
            let (Some(keys), Some(of_kind)) = (objects.controlled.get(uid), objects.by_kind.get(&kind)) else {
                return Vec::new();
            };
            keys.iter()
                .filter(|key| key.kind == kind && key.namespace == namespace)
                .filter_map(|key| of_kind.get(&(key.namespace.clone(), key.name.clone())).cloned())
                .collect()
        };
        values.iter().filter_map(|v| decode(v)).collect()
    }

    /// Objects of a kind, optionally in one namespace, ordered by namespace and name.
    pub fn list(&self, kind: &str, namespace: Option<&str>) -> Vec<Arc<Value>> {
        let objects = self.objects.read().unwrap_or_else(|e| e.into_inner());
        let Some(of_kind) = objects.by_kind.get(kind) else { return Vec::new() };
        match namespace {
            Some(ns) => of_kind
                .range((ns.to_owned(), String::new())..)
                .take_while(|((n, _), _)| n == ns)
                .map(|(_, v)| v.clone())
                .collect(),
            None => of_kind.values().cloned().collect(),
        }
    }

    /// A typed object; objects that do not decode are skipped (and logged).
    pub fn get_typed<K: Resource<DynamicType = ()> + DeserializeOwned>(
        &self,
        namespace: &str,
        name: &str,
    ) -> Option<K> {
        decode(&*self.get(&ObjectKey::of::<K>(namespace, name))?)
    }

    pub fn list_typed<K: Resource<DynamicType = ()> + DeserializeOwned>(&self, namespace: Option<&str>) -> Vec<K> {
        self.list_typed_where(namespace, |_| true)
    }

    /// The typed objects that `keep` accepts as JSON: only those are decoded, so a controller
    /// that wants a few objects out of thousands does not pay for decoding them all.
    pub fn list_typed_where<K: Resource<DynamicType = ()> + DeserializeOwned>(
        &self,
        namespace: Option<&str>,
        keep: impl Fn(&Value) -> bool,
    ) -> Vec<K> {
        self.list(&kind_of::<K>(), namespace).iter().filter(|v| keep(v)).filter_map(|v| decode(v)).collect()
    }

    fn apply(&self, event: &Event) {
        let mut guard = self.objects.write().unwrap_or_else(|e| e.into_inner());
        let objects = &mut *guard;
        let Some(of_kind) = objects.by_kind.get_mut(&event.key.kind) else { return };
        let id = (event.key.namespace.clone(), event.key.name.clone());
        let old = match event.event_type {
            EventType::Deleted => of_kind.remove(&id),
            EventType::Added | EventType::Modified => of_kind.insert(id, event.object.clone()),
            EventType::Bookmark => return,
        };
        objects.changes += 1;
        if let Some(old) = old {
            objects.disown(&event.key, &old);
        }
        if event.event_type != EventType::Deleted {
            objects.own(&event.key, &event.object);
        }
    }

    fn replace(&self, kind: &str, items: Vec<Value>) {
        let fresh: Vec<(ObjectKey, Arc<Value>)> =
            items.into_iter().filter_map(|v| Some((ObjectKey::from_value(&v).ok()?, Arc::new(v)))).collect();
        let mut objects = self.objects.write().unwrap_or_else(|e| e.into_inner());
        objects.changes += 1;
        for ((namespace, name), old) in objects.by_kind.remove(kind).unwrap_or_default() {
            objects.disown(&ObjectKey::new(kind.to_owned(), namespace, name), &old);
        }
        for (key, object) in &fresh {
            objects.own(key, object);
        }
        let by_name = fresh.into_iter().map(|(key, object)| ((key.namespace, key.name), object)).collect();
        objects.by_kind.insert(kind.to_owned(), by_name);
    }
}

fn decode<K: Resource<DynamicType = ()> + DeserializeOwned>(value: &Value) -> Option<K> {
    match from_value(value.clone()) {
        Ok(k) => Some(k),
        Err(e) => {
            tracing::warn!(error = %e, "cached object does not decode");
            None
        }
    }
}

/// Objects of a kind in a namespace that are cached but never announced: changes no loop reacts
/// to, too frequent to wake every subscriber (node heartbeats: 5,000 nodes renew a Lease each
/// every 10 s, and the node lifecycle controller reads them on its own clock).
#[derive(Clone, Debug, Default)]
pub struct Unannounced(Vec<(String, String)>);

impl Unannounced {
    /// The objects of `kind` in `namespace`.
    pub fn of(kind: impl Into<String>, namespace: impl Into<String>) -> Self {
        Unannounced(vec![(kind.into(), namespace.into())])
    }

    fn contains(&self, key: &ObjectKey) -> bool {
        self.0.iter().any(|(kind, namespace)| *kind == key.kind && *namespace == key.namespace)
    }
}

/// A running informer: its cache, its subscribers, and the revision the cache has reached
/// (0 until the first list of every kind is in). Clones share it; the list + watch task stops
/// when the last clone is dropped.
#[derive(Clone)]
pub struct Informer(Arc<Running>);

struct Running {
    cache: Arc<Cache>,
    notifications: broadcast::Sender<Notification>,
    revision: watch::Receiver<Revision>,
    _task: AbortOnDrop,
}

/// Aborts a task when dropped: what ties a list + watch task to the last clone of its handle.
pub struct AbortOnDrop(pub tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Informer {
    /// Starts list + watch of `kinds` (group kinds such as `Pod`, `Deployment.apps`).
    pub fn spawn(store: Arc<dyn Store>, kinds: Vec<String>) -> Self {
        Self::spawn_with(store, kinds, Unannounced::default())
    }

    /// [`Informer::spawn`], with changes to the `unannounced` objects cached and not sent to
    /// subscribers.
    pub fn spawn_with(store: Arc<dyn Store>, kinds: Vec<String>, unannounced: Unannounced) -> Self {
        let cache = Arc::new(Cache::default());
        let (notifications, _) = broadcast::channel(16 * 1024);
        let (revision_tx, revision) = watch::channel(0);
        let out = Out { cache: cache.clone(), notifications: notifications.clone(), unannounced };
        let task = tokio::spawn(reflector::run("informer", store, kinds, out, revision_tx));
        Informer(Arc::new(Running { cache, notifications, revision, _task: AbortOnDrop(task.abort_handle()) }))
    }

    pub fn cache(&self) -> &Arc<Cache> {
        &self.0.cache
    }

    /// Subscribe before reading the cache so no change between the two is missed.
    pub fn subscribe(&self) -> broadcast::Receiver<Notification> {
        self.0.notifications.subscribe()
    }

    /// [`Informer::subscribe`] as a stream, which ends with the informer; notifications missed
    /// by a slow subscriber become one `Resync`.
    pub fn notifications(&self) -> impl futures::Stream<Item = Notification> + Send + 'static {
        futures::stream::unfold(self.subscribe(), |mut notifications| async move {
            match notifications.recv().await {
                Ok(n) => Some((n, notifications)),
                Err(broadcast::error::RecvError::Lagged(_)) => Some((Notification::Resync, notifications)),
                Err(broadcast::error::RecvError::Closed) => None,
            }
        })
    }

    /// The revision the cache has reached (0 until the first list of every kind is in).
    pub fn revision(&self) -> Revision {
        *self.0.revision.borrow()
    }

    /// Waits until the first list of every kind is in the cache.
    pub async fn wait_synced(&self) {
        self.wait_for(1).await;
    }

    /// Waits until the cache reflects every commit up to `revision`: a controller that waits for
    /// its own write reads its own write (no duplicate Pods from a stale cache).
    pub async fn wait_for(&self, revision: Revision) {
        let mut seen = self.0.revision.clone();
        let _ = seen.wait_for(|r| *r >= revision).await;
    }
}

/// client-go's `SharedInformerFactory`, for one informer over a fixed set of kinds: every loop
/// of a process asks it, so all of them share one cache (one copy of every object) and one
/// list + watch. The informer starts at the first request and stops when the last of its users
/// drops it, so loops that run only while this replica leads keep nothing cached once it stops
/// leading, unless another user still holds the informer.
pub struct SharedInformerFactory {
    store: Arc<dyn Store>,
    kinds: Vec<String>,
    unannounced: Unannounced,
    running: Mutex<Weak<Running>>,
}

impl SharedInformerFactory {
    pub fn new(store: Arc<dyn Store>, kinds: Vec<String>) -> Self {
        SharedInformerFactory { store, kinds, unannounced: Unannounced::default(), running: Mutex::default() }
    }

    /// Changes to these objects are cached and not sent to subscribers.
    pub fn unannounced(mut self, unannounced: Unannounced) -> Self {
        self.unannounced = unannounced;
        self
    }

    /// The running informer, or a new one (call it within a tokio runtime).
    pub fn informer(&self) -> Informer {
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(informer) = running.upgrade() {
            return Informer(informer);
        }
        let informer = Informer::spawn_with(self.store.clone(), self.kinds.clone(), self.unannounced.clone());
        *running = Arc::downgrade(&informer.0);
        informer
    }
}

/// Where the informer's list and watch go: its cache, then its subscribers.
struct Out {
    cache: Arc<Cache>,
    notifications: broadcast::Sender<Notification>,
    unannounced: Unannounced,
}

impl Reflect for Out {
    fn replace(&mut self, lists: Vec<(String, Vec<Value>)>, _: Revision) {
        for (kind, items) in lists {
            self.cache.replace(&kind, items);
        }
        let _ = self.notifications.send(Notification::Resync);
    }

    fn apply(&mut self, events: Vec<Event>) {
        for event in events {
            if event.event_type == EventType::Bookmark {
                continue;
            }
            self.cache.apply(&event);
            if !self.unannounced.contains(&event.key) {
                let _ = self.notifications.send(Notification::Changed(Arc::new(event)));
            }
        }
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config_map(name: &str, owner: Option<&str>) -> Value {
        let mut cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "n"}});
        if let Some(owner) = owner {
            cm["metadata"]["annotations"] = json!({APPLICATION_ANNOTATION: owner});
        }
        cm
    }

    fn event(event_type: EventType, object: Value) -> Event {
        Event { revision: 2, event_type, key: ObjectKey::from_value(&object).unwrap(), object: Arc::new(object) }
    }

    fn owned(cache: &Cache, app: &str) -> Vec<String> {
        cache.owned_by(app).into_iter().map(|(k, _)| k.name).collect()
    }

    #[test]
    fn the_owner_index_follows_the_objects() {
        let cache = Cache::default();
        cache.replace(
            "ConfigMap",
            vec![config_map("a", Some("s/x")), config_map("b", None), config_map("c", Some("s/x"))],
        );
        assert_eq!(owned(&cache, "s/x"), ["a", "c"]);
        // Another Application takes one over, one loses its annotation, one is deleted.
        cache.apply(&event(EventType::Modified, config_map("a", Some("s/y"))));
        cache.apply(&event(EventType::Added, config_map("b", Some("s/x"))));
        assert_eq!(
            (owned(&cache, "s/x"), owned(&cache, "s/y")),
            (vec!["b".to_owned(), "c".to_owned()], vec!["a".to_owned()])
        );
        cache.apply(&event(EventType::Deleted, config_map("c", Some("s/x"))));
        cache.apply(&event(EventType::Modified, config_map("b", None)));
        assert!(owned(&cache, "s/x").is_empty());
        // A fresh list replaces what the index knew of the kind.
        cache.replace("ConfigMap", vec![config_map("d", Some("s/x"))]);
        assert_eq!((owned(&cache, "s/x"), owned(&cache, "s/y")), (vec!["d".to_owned()], Vec::<String>::new()));
        assert_eq!(cache.objects.read().unwrap().owned.len(), 1, "no empty entries are kept");
    }

    #[test]
    fn unannounced_changes_are_cached_and_not_sent() {
        let cache = Arc::new(Cache::default());
        cache.replace("Lease.coordination.k8s.io", Vec::new());
        let (notifications, mut received) = broadcast::channel(16);
        let unannounced = Unannounced::of("Lease.coordination.k8s.io", "kube-node-lease");
        let mut out = Out { cache: cache.clone(), notifications, unannounced };
        let lease = |namespace: &str| json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "n1", "namespace": namespace}});
        out.apply(vec![event(EventType::Added, lease("kube-node-lease")), event(EventType::Added, lease("default"))]);
        assert_eq!(cache.list("Lease.coordination.k8s.io", None).len(), 2, "both cached");
        let Ok(Notification::Changed(sent)) = received.try_recv() else { panic!("one notification") };
        assert_eq!(sent.key.namespace, "default");
        assert!(received.try_recv().is_err(), "the node's heartbeat is not announced");
    }

    fn pod(name: &str, namespace: &str, controllers: &[(&str, bool)]) -> Value {
        let refs: Vec<Value> = controllers
            .iter()
            .map(|(uid, controller)| json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": uid, "controller": controller}))
            .collect();
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace, "ownerReferences": refs}})
    }

    fn controlled(cache: &Cache, namespace: &str, uid: &str) -> Vec<String> {
        let pods: Vec<k8s_openapi::api::core::v1::Pod> = cache.controlled_by(namespace, uid);
        pods.into_iter().filter_map(|p| p.metadata.name).collect()
    }

    #[test]
    fn the_controller_index_follows_the_objects() {
        let cache = Cache::default();
        cache.replace(
            "Pod",
            vec![
                pod("c", "n", &[("u1", true)]),
                pod("a", "n", &[("u1", true)]),
                pod("b", "n", &[("u1", false)]),
                pod("d", "m", &[("u1", true)]),
            ],
        );
        cache.apply(&event(EventType::Added, pod("e", "n", &[("u2", true)])));
        let cases: [(&str, &str, &[&str]); 4] =
            [("n", "u1", &["a", "c"]), ("m", "u1", &["d"]), ("n", "u2", &["e"]), ("n", "u3", &[])];
        for (namespace, uid, want) in cases {
            assert_eq!(controlled(&cache, namespace, uid), want, "{namespace} {uid}");
        }
        // Adopted by another controller, released, deleted.
        cache.apply(&event(EventType::Modified, pod("a", "n", &[("u2", true)])));
        cache.apply(&event(EventType::Modified, pod("c", "n", &[])));
        cache.apply(&event(EventType::Deleted, pod("e", "n", &[("u2", true)])));
        assert_eq!((controlled(&cache, "n", "u1"), controlled(&cache, "n", "u2")), (vec![], vec!["a".to_owned()]));
        cache.replace("Pod", Vec::new());
        assert!(cache.objects.read().unwrap().controlled.is_empty(), "no empty entries are kept");
    }
}
