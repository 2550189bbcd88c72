//! A shared informer, as client-go's: list the watched kinds, then follow the store's watch into
//! an in-memory cache, and fan every change out to subscribers. Controllers and the scheduler
//! read the cache and write through the store with compare-and-swap.
//!
//! A watch that falls behind compaction re-lists; subscribers then receive `Resync` and should
//! re-enqueue everything (level-triggered, as Kubernetes controllers are).

use crate::{Event, EventType, ListOptions, ObjectKey, Revision, Store, StoreError, WatchOptions};
use futures::{FutureExt, StreamExt};
use gitplane_api::kube_core::Resource;
use gitplane_api::object::{from_value, kind_of};
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, RwLock},
    time::Duration,
};
use tokio::sync::{broadcast, watch};

/// What subscribers receive.
#[derive(Clone, Debug)]
pub enum Notification {
    Changed(Arc<Event>),
    /// The cache was rebuilt from a fresh list: reconcile everything.
    Resync,
}

type Objects = HashMap<String, BTreeMap<(String, String), Arc<Value>>>;

/// The cached objects of the watched kinds.
#[derive(Default)]
pub struct Cache {
    objects: RwLock<Objects>,
}

impl Cache {
    pub fn get(&self, key: &ObjectKey) -> Option<Arc<Value>> {
        let objects = self.objects.read().unwrap_or_else(|e| e.into_inner());
        objects.get(&key.kind)?.get(&(key.namespace.clone(), key.name.clone())).cloned()
    }

    /// Objects of a kind, optionally in one namespace, ordered by namespace and name.
    pub fn list(&self, kind: &str, namespace: Option<&str>) -> Vec<Arc<Value>> {
        let objects = self.objects.read().unwrap_or_else(|e| e.into_inner());
        let Some(of_kind) = objects.get(kind) else { return Vec::new() };
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
        let mut objects = self.objects.write().unwrap_or_else(|e| e.into_inner());
        let Some(of_kind) = objects.get_mut(&event.key.kind) else { return };
        let id = (event.key.namespace.clone(), event.key.name.clone());
        match event.event_type {
            EventType::Deleted => {
                of_kind.remove(&id);
            }
            EventType::Added | EventType::Modified => {
                of_kind.insert(id, event.object.clone());
            }
            EventType::Bookmark => {}
        }
    }

    fn replace(&self, kind: &str, items: Vec<Value>) {
        let fresh = items
            .into_iter()
            .filter_map(|v| {
                let key = ObjectKey::from_value(&v).ok()?;
                Some(((key.namespace, key.name), Arc::new(v)))
            })
            .collect();
        let mut objects = self.objects.write().unwrap_or_else(|e| e.into_inner());
        objects.insert(kind.to_owned(), fresh);
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

/// A running informer: its cache, its subscribers, and the revision the cache has reached
/// (0 until the first list of every kind is in).
#[derive(Clone)]
pub struct Informer {
    cache: Arc<Cache>,
    notifications: broadcast::Sender<Notification>,
    revision: watch::Receiver<Revision>,
    /// The list + watch task stops when the last clone is dropped.
    _task: Arc<AbortOnDrop>,
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
        let cache = Arc::new(Cache::default());
        let (notifications, _) = broadcast::channel(16 * 1024);
        let (revision_tx, revision) = watch::channel(0);
        let (task_cache, task_notifications) = (cache.clone(), notifications.clone());
        let task = tokio::spawn(async move {
            let (cache, notifications) = (task_cache, task_notifications);
            let mut resume: Option<Revision> = None;
            loop {
                match run(&*store, &kinds, &cache, &notifications, &revision_tx, &mut resume).await {
                    Err(StoreError::Expired { .. }) => {
                        tracing::info!("informer watch expired, re-listing");
                        resume = None;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, ?resume, "informer watch failed, resuming");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    Ok(()) => return, // the store has shut down
                }
            }
        });
        Informer { cache, notifications, revision, _task: Arc::new(AbortOnDrop(task.abort_handle())) }
    }

    pub fn cache(&self) -> &Arc<Cache> {
        &self.cache
    }

    /// Subscribe before reading the cache so no change between the two is missed.
    pub fn subscribe(&self) -> broadcast::Receiver<Notification> {
        self.notifications.subscribe()
    }

    /// Waits until the first list of every kind is in the cache.
    pub async fn wait_synced(&self) {
        self.wait_for(1).await;
    }

    /// Waits until the cache reflects every commit up to `revision`: a controller that waits for
    /// its own write reads its own write (no duplicate Pods from a stale cache).
    pub async fn wait_for(&self, revision: Revision) {
        let mut seen = self.revision.clone();
        let _ = seen.wait_for(|r| *r >= revision).await;
    }
}

/// Lists every kind at one revision (unless resuming), then follows the watch. `resume` holds
/// the revision the cache has reached, so a broken watch (a replica gone, a leader change)
/// continues from there without a new list; only an expired revision makes it list again.
async fn run(
    store: &dyn Store,
    kinds: &[String],
    cache: &Cache,
    notifications: &broadcast::Sender<Notification>,
    revision: &watch::Sender<Revision>,
    resume: &mut Option<Revision>,
) -> Result<(), StoreError> {
    let from = match *resume {
        Some(from) => from,
        None => {
            let mut at = None;
            for kind in kinds {
                let list = store.list(kind, &ListOptions { at_revision: at, ..Default::default() }).await?;
                at = Some(list.revision);
                cache.replace(kind, list.items);
            }
            let listed = at.unwrap_or(0);
            revision.send_replace(listed.max(1));
            let _ = notifications.send(Notification::Resync);
            listed
        }
    };
    *resume = Some(from);
    let options = WatchOptions { kinds: Some(kinds.to_vec()), bookmarks: true };
    let mut events = store.watch(from, options).await?;
    while let Some(event) = events.next().await {
        let mut last = apply(event?, cache, notifications);
        // Publish the revision once the events that are already here (a whole transaction,
        // usually) are applied, so a waiter never sees half a transaction.
        while let Some(Some(event)) = events.next().now_or_never() {
            last = apply(event?, cache, notifications);
        }
        *resume = Some(last);
        revision.send_if_modified(|r| {
            let advanced = last > *r;
            *r = (*r).max(last);
            advanced
        });
    }
    Ok(())
}

fn apply(event: Event, cache: &Cache, notifications: &broadcast::Sender<Notification>) -> Revision {
    let revision = event.revision;
    if event.event_type != EventType::Bookmark {
        cache.apply(&event);
        let _ = notifications.send(Notification::Changed(Arc::new(event)));
    }
    revision
}
