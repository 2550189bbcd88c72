//! The watch cache for LIST, as kube-apiserver's cacher: per kind, filled at start-up (Pods and
//! Nodes, [`Cacher::start`]) or on the first LIST of that kind with one unpaged
//! [`Store::list_json`] at the latest revision, then kept current by the store's
//! `watch(from = that revision)`. It holds each object's stored JSON text (never a
//! parsed `Value`: a parsed Pod takes several times its text), in (namespace, name) order, so a
//! LIST is spliced from it exactly as from the store, with no query. A cluster-wide LIST of
//! 150,000 Pods costs the store 1-2.5 s of CPU per request; from here it costs a walk over the
//! entries. Beside the text it keeps what a Table row needs ([`Cached`]): the row's cells made
//! once as the object arrives ([`table::Row`], the durations printed per request) and where
//! the text holds the object's metadata, so a Table is spliced as well: rendering a Pod's row
//! from its parsed text cost about 17 µs, a page of 500 rows 8 ms.
//!
//! Which lists it serves, with Kubernetes' semantics:
//! - `resourceVersion` unset (most recent) is a consistent read: the store's current revision
//!   (cheap) is read and the cache waited for until it has seen it (at most
//!   [`FRESHNESS_WAIT`]); `"0"` takes the cache as it is; "not older than N" waits for N.
//! - `Exact` (and a limit with a resourceVersion), Secrets, and a cache not filled yet go to the
//!   store.
//! - A paged list's first page is cut from the cache at its revision, and that revision's
//!   snapshot (an O(1) clone of [`Objects`]) is kept while the client pages ([`SNAPSHOT_TTL`]
//!   after its last use), so every continue page comes from the same revision. A token whose
//!   snapshot is gone, or that the store issued, goes to the store, which pages the same way
//!   (the contract's [`ContinueToken`]).
//!
//! A failed fill or a broken watch is retried after 200 ms, doubling to 30 s (back to 200 ms once
//! events arrive or a watch has run 30 s); an expired revision fills again. Until its watch is
//! open the cache does not count as following, so reads that need newer revisions go to the store. Nothing runs while nothing changes: the watch waits on the store's commits.

use super::resource_version::{FRESHNESS_WAIT, ListRevision};
use crate::table;
use futures::{FutureExt as _, StreamExt as _};
use gitplane_store::{
    ContinueToken, EventType, List, ListOptions, Revision, Store, StoreError, WatchOptions, WatchStream,
    informer::AbortOnDrop, selector::Selector,
};
use serde_json::{Value, value::RawValue};
use std::{
    collections::HashMap,
    ops::Range,
    sync::{
        Arc, Mutex, Weak,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};
use tokio::sync::watch;

/// How long a paged list's snapshot is kept after its last page was served.
pub const SNAPSHOT_TTL: Duration = Duration::from_secs(60);
/// At most this many paged-list snapshots per kind (the least recently used goes first).
const MAX_SNAPSHOTS: usize = 16;
/// Retries of a failed fill or watch start here and double up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Entries per chunk of [`Objects`]: a chunk is split in two past twice this.
const CHUNK: usize = 512;

/// One cached object: its key and what is kept of it, all shared, so copying a chunk for a
/// write under a snapshot copies pointers, never text.
#[derive(Clone)]
struct Entry {
    namespace: Arc<str>,
    name: Arc<str>,
    object: Cached,
}

/// An object as the cache keeps it: its stored JSON text, its Table row, and where the text
/// holds its `metadata` (a Table's PartialObjectMetadata row object is that slice).
#[derive(Clone)]
pub struct Cached(Arc<CachedObject>);

struct CachedObject {
    text: Box<str>,
    row: table::Row,
    metadata: Option<Range<usize>>,
}

impl Cached {
    /// `object` of `kind` (a group kind, `Deployment.apps`) and `text`, its stored JSON.
    fn new(kind: &str, object: &Value, text: String) -> Cached {
        let row = table::Row::new(kind.split('.').next().unwrap_or(kind), object);
        #[derive(serde::Deserialize)]
        struct Object<'a> {
            #[serde(borrow)]
            metadata: Option<&'a RawValue>,
        }
        let metadata = serde_json::from_str::<Object>(&text).ok().and_then(|o| o.metadata).map(|m| {
            let start = m.get().as_ptr() as usize - text.as_ptr() as usize;
            start..start + m.get().len()
        });
        Cached(Arc::new(CachedObject { text: text.into(), row, metadata }))
    }

    pub fn row(&self) -> &table::Row {
        &self.0.row
    }

    /// The object's `metadata` as JSON (`null` without).
    pub fn metadata(&self) -> &str {
        self.0.metadata.clone().map_or("null", |m| &self.0.text[m])
    }

    /// The bytes held beside the text, for the fill's log line.
    fn row_size(&self) -> usize {
        self.0.row.heap_size() + size_of::<CachedObject>()
    }
}

impl AsRef<str> for Cached {
    fn as_ref(&self) -> &str {
        &self.0.text
    }
}

impl Entry {
    fn key(&self) -> (&str, &str) {
        (&self.namespace, &self.name)
    }
}

/// The objects of one kind in (namespace, name) order: a persistent sorted sequence, chunks of
/// entries behind `Arc`s. A clone (a snapshot) is O(1); a write copies only the outer vector
/// (one pointer per chunk) and the chunk it touches, when a snapshot still shares them.
#[derive(Clone, Default)]
pub struct Objects {
    chunks: Arc<Vec<Arc<Vec<Entry>>>>,
    len: usize,
}

impl Objects {
    /// From entries already in key order (a list's).
    fn from_sorted(entries: Vec<Entry>) -> Objects {
        let len = entries.len();
        let chunks = entries.chunks(CHUNK).map(|c| Arc::new(c.to_vec())).collect();
        Objects { chunks: Arc::new(chunks), len }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// The chunk that holds `key` or where it would go: the first whose last key is not below it.
    fn chunk_of(&self, key: (&str, &str)) -> usize {
        let i = self.chunks.partition_point(|c| c.last().is_some_and(|e| e.key() < key));
        i.min(self.chunks.len().saturating_sub(1))
    }

    fn upsert(&mut self, namespace: &str, name: &str, object: Cached) {
        let key = (namespace, name);
        let chunks = Arc::make_mut(&mut self.chunks);
        if chunks.is_empty() {
            chunks.push(Arc::new(Vec::new()));
        }
        let i = chunks.partition_point(|c| c.last().is_some_and(|e| e.key() < key)).min(chunks.len() - 1);
        let chunk = Arc::make_mut(&mut chunks[i]);
        match chunk.binary_search_by(|e| e.key().cmp(&key)) {
            Ok(at) => chunk[at].object = object,
            Err(at) => {
                // Share the namespace's text with a neighbour when it has the same.
                let near = chunk.get(at).or_else(|| at.checked_sub(1).and_then(|p| chunk.get(p)));
                let namespace = match near {
                    Some(e) if &*e.namespace == namespace => e.namespace.clone(),
                    _ => namespace.into(),
                };
                chunk.insert(at, Entry { namespace, name: name.into(), object });
                self.len += 1;
                if chunk.len() > 2 * CHUNK {
                    let upper = chunk.split_off(CHUNK);
                    chunks.insert(i + 1, Arc::new(upper));
                }
            }
        }
    }

    fn remove(&mut self, namespace: &str, name: &str) {
        let key = (namespace, name);
        if self.chunks.is_empty() {
            return;
        }
        let i = self.chunk_of(key);
        let Ok(at) = self.chunks[i].binary_search_by(|e| e.key().cmp(&key)) else { return };
        let chunks = Arc::make_mut(&mut self.chunks);
        let chunk = Arc::make_mut(&mut chunks[i]);
        chunk.remove(at);
        self.len -= 1;
        if chunk.is_empty() {
            chunks.remove(i);
        }
    }

    /// The entries after `after` (all when `None`), in key order.
    fn iter_after(&self, after: Option<(&str, &str)>) -> impl Iterator<Item = &Entry> {
        let (first, skip) = match after {
            None => (0, 0),
            Some(key) => {
                let i = self.chunk_of(key);
                let at = self.chunks.get(i).map_or(0, |c| c.partition_point(|e| e.key() <= key));
                (i, at)
            }
        };
        self.chunks.iter().skip(first).flat_map(|c| c.iter()).skip(skip)
    }

    /// A page as the store cuts it ([`gitplane_store::Store::list`]): the objects after the
    /// token's key in `namespace` that match `selector`, at most `limit`; and, when another
    /// matching object follows, the key the next page starts after (the last one looked at).
    fn page(
        &self,
        namespace: Option<&str>,
        after: Option<(&str, &str)>,
        selector: &Selector,
        limit: Option<usize>,
    ) -> (Vec<Cached>, Option<(String, String)>) {
        let want = limit.map_or(usize::MAX, |l| l.max(1));
        // Start at the namespace when the token's key is before it: after `(ns, "")`, which is
        // the namespace's first object (names are never empty).
        let start = match (namespace, after) {
            (Some(ns), None) => Some((ns, "")),
            (Some(ns), Some(key)) if key.0 < ns => Some((ns, "")),
            (_, key) => key,
        };
        let mut items = Vec::new();
        let mut last: Option<&Entry> = None;
        for entry in self.iter_after(start) {
            if namespace.is_some_and(|ns| *entry.namespace != *ns) {
                break;
            }
            if !selector.is_empty() && !labels_match(selector, entry.object.as_ref()) {
                last = Some(entry);
                continue;
            }
            if items.len() == want {
                let next = last.map(|e| (e.namespace.to_string(), e.name.to_string()));
                return (items, next);
            }
            items.push(entry.object.clone());
            last = Some(entry);
        }
        (items, None)
    }
}

/// Whether an object's labels satisfy `selector`, reading only its `metadata.labels` from the
/// text.
fn labels_match(selector: &Selector, text: &str) -> bool {
    #[derive(serde::Deserialize)]
    struct Object {
        #[serde(default)]
        metadata: Metadata,
    }
    #[derive(serde::Deserialize, Default)]
    struct Metadata {
        #[serde(default)]
        labels: Value,
    }
    match serde_json::from_str::<Object>(text) {
        Ok(object) => selector.matches(&serde_json::json!({"metadata": {"labels": object.metadata.labels}})),
        Err(_) => false,
    }
}

/// The cache of one kind as of one revision.
pub struct Snapshot {
    pub revision: Revision,
    pub objects: Objects,
}

/// One kind's cache: the latest snapshot (None until filled), the snapshots paged lists read,
/// and the task that fills and follows.
struct KindCache {
    current: watch::Receiver<Option<Arc<Snapshot>>>,
    /// Whether the store's watch is followed now: while it is broken, a read that needs a newer
    /// revision goes to the store at once instead of waiting for one that cannot come.
    following: Arc<AtomicBool>,
    paged: Mutex<HashMap<Revision, (Arc<Snapshot>, Instant)>>,
    _task: AbortOnDrop,
}

impl KindCache {
    /// Keeps `snapshot` for the continue pages of a list that began on it.
    fn retain(self: &Arc<Self>, snapshot: &Arc<Snapshot>) {
        let mut paged = self.paged.lock().unwrap_or_else(|e| e.into_inner());
        let was_empty = paged.is_empty();
        paged.insert(snapshot.revision, (snapshot.clone(), Instant::now()));
        expire(&mut paged);
        while paged.len() > MAX_SNAPSHOTS {
            let Some(oldest) = paged.iter().min_by_key(|(_, (_, used))| *used).map(|(r, _)| *r) else { break };
            paged.remove(&oldest);
        }
        if was_empty {
            // Drops the snapshots once unused, then ends: nothing runs while none is kept.
            let cache = Arc::downgrade(self);
            tokio::spawn(reap(cache));
        }
    }

    /// The snapshot a continue token at `revision` reads, when still kept.
    fn paged(&self, revision: Revision) -> Option<Arc<Snapshot>> {
        let mut paged = self.paged.lock().unwrap_or_else(|e| e.into_inner());
        expire(&mut paged);
        let (snapshot, used) = paged.get_mut(&revision)?;
        *used = Instant::now();
        Some(snapshot.clone())
    }
}

fn expire(paged: &mut HashMap<Revision, (Arc<Snapshot>, Instant)>) {
    paged.retain(|_, (_, used)| used.elapsed() < SNAPSHOT_TTL);
}

async fn reap(cache: Weak<KindCache>) {
    loop {
        tokio::time::sleep(SNAPSHOT_TTL).await;
        let Some(cache) = cache.upgrade() else { return };
        let mut paged = cache.paged.lock().unwrap_or_else(|e| e.into_inner());
        expire(&mut paged);
        if paged.is_empty() {
            return;
        }
    }
}

/// The list caches of every kind listed so far.
pub struct Cacher {
    store: Arc<dyn Store>,
    kinds: Mutex<HashMap<String, Arc<KindCache>>>,
}

impl Cacher {
    pub fn new(store: Arc<dyn Store>) -> Cacher {
        Cacher { store, kinds: Mutex::default() }
    }

    /// The cache of `kind`, started by the first call.
    fn kind(&self, kind: &str) -> Arc<KindCache> {
        let mut kinds = self.kinds.lock().unwrap_or_else(|e| e.into_inner());
        kinds
            .entry(kind.to_owned())
            .or_insert_with(|| {
                let (tx, current) = watch::channel(None);
                let following = Arc::new(AtomicBool::new(false));
                let task = tokio::spawn(follow(self.store.clone(), kind.to_owned(), tx, following.clone()));
                let task = AbortOnDrop(task.abort_handle());
                Arc::new(KindCache { current, following, paged: Mutex::default(), _task: task })
            })
            .clone()
    }

    /// Starts filling and following the caches of `kinds` now, not at their first LIST.
    pub fn start(&self, kinds: &[&str]) {
        for kind in kinds {
            self.kind(kind);
        }
    }

    /// The list of `kind` under `options` from the cache, or `None` when the store must answer
    /// (see the module's table). The items are the stored JSON texts with their Table rows.
    pub async fn list(&self, kind: &str, options: &ListOptions, revision: ListRevision) -> Option<List<Cached>> {
        if options.at_revision.is_some() || matches!(revision, ListRevision::Exact(_)) {
            return None;
        }
        let selector = Selector::parse(options.label_selector.as_deref().unwrap_or("")).ok()?;
        let cache = self.kind(kind);
        let token = match options.continue_token.as_deref() {
            Some(text) => Some(ContinueToken::decode(text).ok()?),
            None => None,
        };
        let snapshot = match &token {
            Some(token) => cache.paged(token.revision)?,
            None => {
                let wanted = match revision {
                    ListRevision::Any => 0,
                    ListRevision::NotOlderThan(at) => at,
                    ListRevision::MostRecent => self.store.revision().await.ok()?,
                    ListRevision::Exact(_) => return None,
                };
                let mut current = cache.current.clone();
                // Not filled yet: the store answers while the fill runs.
                let at = current.borrow().as_ref()?.revision;
                if at < wanted && !cache.following.load(Ordering::Relaxed) {
                    return None;
                }
                let reached = current.wait_for(|s| s.as_ref().is_some_and(|s| s.revision >= wanted));
                let snapshot = tokio::time::timeout(FRESHNESS_WAIT, reached).await.ok()?.ok()?;
                snapshot.as_ref()?.clone()
            }
        };
        let after = token.as_ref().map(|t| (t.namespace.as_str(), t.name.as_str()));
        let (items, next) = snapshot.objects.page(options.namespace.as_deref(), after, &selector, options.limit);
        let continue_token = next.map(|(namespace, name)| {
            cache.retain(&snapshot);
            ContinueToken { revision: snapshot.revision, namespace, name }.encode()
        });
        Some(List { revision: snapshot.revision, items, continue_token })
    }

    /// Waits until `kind` is filled and has seen `revision` (tests).
    #[cfg(test)]
    pub async fn wait_for(&self, kind: &str, revision: Revision) {
        let mut current = self.kind(kind).current.clone();
        let _ = current.wait_for(|s| s.as_ref().is_some_and(|s| s.revision >= revision)).await;
    }
}

/// Fills the cache of `kind` and follows the store's watch, for as long as the cache exists.
async fn follow(
    store: Arc<dyn Store>,
    kind: String,
    tx: watch::Sender<Option<Arc<Snapshot>>>,
    following: Arc<AtomicBool>,
) {
    let mut backoff = MIN_BACKOFF;
    // What the cache holds and the revision it is at, once filled.
    let mut held: Option<(Objects, Revision)> = None;
    loop {
        let (objects, revision) = match held.take() {
            Some(held) => held,
            None => match fill(store.as_ref(), &kind).await {
                Ok((objects, revision)) => {
                    tx.send_replace(Some(Arc::new(Snapshot { revision, objects: objects.clone() })));
                    (objects, revision)
                }
                Err(e) => {
                    tracing::warn!(%kind, error = %e, retry_in = ?backoff, "list cache: fill failed");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    continue;
                }
            },
        };
        let mut state = (objects, revision);
        let started = Instant::now();
        // Following only once the store's watch is open: until then a read that needs a newer
        // revision goes to the store, not waiting for one this cache cannot get.
        let result =
            match store.watch(state.1, WatchOptions { kinds: None, bookmarks: true, ..Default::default() }).await {
                Ok(events) => {
                    following.store(true, Ordering::Relaxed);
                    let result = watch_into(events, &kind, &tx, &mut state, &mut backoff).await;
                    following.store(false, Ordering::Relaxed);
                    result
                }
                Err(e) => Err(e),
            };
        if started.elapsed() >= MAX_BACKOFF {
            // A watch that ran a while was healthy, with or without events (an idle kind).
            backoff = MIN_BACKOFF;
        }
        match result {
            Err(StoreError::Expired { .. }) => {
                tracing::info!(%kind, revision = state.1, "list cache: watch expired, filling again");
                continue; // `held` stays None: fill again
            }
            Err(e) => tracing::warn!(%kind, error = %e, retry_in = ?backoff, "list cache: watch failed"),
            Ok(()) => tracing::info!(%kind, retry_in = ?backoff, "list cache: watch ended"),
        }
        held = Some(state);
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// One unpaged list at the latest revision, keyed from each text's metadata. Making the rows
/// parses every object, seconds for 150,000 Pods: a blocking thread does it, not the runtime's.
async fn fill(store: &dyn Store, kind: &str) -> Result<(Objects, Revision), StoreError> {
    let started = Instant::now();
    let list = store.list_json(kind, &ListOptions::default()).await?;
    let listed = started.elapsed();
    let revision = list.revision;
    let owned_kind = kind.to_owned();
    let entries = tokio::task::spawn_blocking(move || entries(&owned_kind, list.items))
        .await
        .map_err(|e| StoreError::Unavailable(format!("list cache fill of {kind}: {e}")))??;
    // What the cache holds: the texts, and per object an entry, two small key strings and a row.
    let text_bytes: usize = entries.iter().map(|e| e.object.as_ref().len()).sum();
    let row_bytes: usize = entries.iter().map(|e| e.object.row_size()).sum();
    let objects = Objects::from_sorted(entries);
    tracing::info!(
        %kind, objects = objects.len(), revision, listed_ms = listed.as_millis() as u64,
        took_ms = started.elapsed().as_millis() as u64, text_mib = text_bytes >> 20, rows_mib = row_bytes >> 20,
        "list cache: filled"
    );
    Ok((objects, revision))
}

/// The entries of a list's texts, in key order.
fn entries(kind: &str, texts: Vec<String>) -> Result<Vec<Entry>, StoreError> {
    #[derive(serde::Deserialize)]
    struct Metadata<'a> {
        #[serde(borrow)]
        name: std::borrow::Cow<'a, str>,
        #[serde(borrow, default)]
        namespace: std::borrow::Cow<'a, str>,
    }
    let corrupt = |source| StoreError::Corrupt { key: format!("a {kind} in a list"), source };
    let mut entries = Vec::with_capacity(texts.len());
    let mut namespace: Arc<str> = Arc::from("");
    for text in texts {
        let object: Value = serde_json::from_str(&text).map_err(corrupt)?;
        let metadata: Metadata = serde::Deserialize::deserialize(&object["metadata"]).map_err(corrupt)?;
        if *namespace != *metadata.namespace {
            namespace = Arc::from(&*metadata.namespace);
        }
        let name = Arc::from(&*metadata.name);
        entries.push(Entry { namespace: namespace.clone(), name, object: Cached::new(kind, &object, text) });
    }
    // The store lists in key order; sorting again costs nothing then and guards a backend that
    // would not.
    if !entries.is_sorted_by(|a, b| a.key() < b.key()) {
        entries.sort_by(|a, b| a.key().cmp(&b.key()));
        entries.dedup_by(|a, b| a.key() == b.key());
    }
    Ok(entries)
}

/// Follows the store's watch from `state`'s revision, publishing a snapshot after each batch of
/// events that had arrived together (a whole transaction, usually, so a reader never sees half
/// of one). Every kind is watched: the other kinds' events only move the revision, which a
/// consistent read waits for (a watch of one kind would learn of other commits only through
/// rate-limited bookmarks).
async fn watch_into(
    mut events: WatchStream,
    kind: &str,
    tx: &watch::Sender<Option<Arc<Snapshot>>>,
    state: &mut (Objects, Revision),
    backoff: &mut Duration,
) -> Result<(), StoreError> {
    while let Some(event) = events.next().await {
        let mut next = Some(event);
        let mut changed = false;
        while let Some(event) = next {
            let event = event?;
            state.1 = state.1.max(event.revision);
            if event.key.kind == kind {
                match event.event_type {
                    EventType::Added | EventType::Modified => {
                        let object = Cached::new(kind, &event.object, event.object.to_string());
                        state.0.upsert(&event.key.namespace, &event.key.name, object);
                    }
                    EventType::Deleted => state.0.remove(&event.key.namespace, &event.key.name),
                    EventType::Bookmark => {}
                }
            }
            changed = true;
            next = events.next().now_or_never().flatten();
        }
        if changed {
            *backoff = MIN_BACKOFF;
            tx.send_replace(Some(Arc::new(Snapshot { revision: state.1, objects: state.0.clone() })));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gitplane_storage::postgres::{PostgresStore, testing::PgCluster};
    use gitplane_storage::sqlite::SqliteStore;
    use gitplane_store::{Committed, List, ObjectKey, Op, WatchStream};
    use serde_json::json;
    use std::{future::Future, sync::atomic::AtomicUsize};

    fn pod(namespace: &str, name: &str, app: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace,
               "labels": {"app": app}}, "spec": {"nodeName": "n1"}})
    }

    fn text(text: &str) -> Cached {
        Cached::new("Pod", &Value::Null, text.to_owned())
    }

    fn entry(namespace: &str, name: &str) -> Entry {
        Entry { namespace: namespace.into(), name: name.into(), object: text(&format!("{namespace}/{name}")) }
    }

    fn texts(objects: &Objects) -> Vec<String> {
        objects.iter_after(None).map(|e| e.object.as_ref().to_owned()).collect()
    }

    #[test]
    fn objects_stay_ordered_and_snapshots_do_not_move() {
        let mut objects = Objects::from_sorted((0..1500).map(|i| entry("b", &format!("p{i:05}"))).collect());
        let snapshot = objects.clone();
        // Inserts before, inside (splitting a chunk) and after; replaces; removes.
        for i in 0..1200 {
            objects.upsert("b", &format!("p{:05}x", i % 1500), text("new"));
        }
        objects.upsert("a", "first", text("a/first"));
        objects.upsert("c", "last", text("c/last"));
        objects.upsert("b", "p00007", text("replaced"));
        objects.remove("b", "p00008");
        objects.remove("b", "missing");
        assert_eq!(objects.len(), 1500 + 1200 + 2 - 1);
        let keys: Vec<(String, String)> =
            objects.iter_after(None).map(|e| (e.namespace.to_string(), e.name.to_string())).collect();
        assert!(keys.is_sorted_by(|a, b| a < b), "ordered, no duplicates");
        assert_eq!(keys.len(), objects.len());
        assert!(objects.chunks.iter().all(|c| !c.is_empty() && c.len() <= 2 * CHUNK));
        // The snapshot is as it was.
        assert_eq!(snapshot.len(), 1500);
        assert_eq!(texts(&snapshot), (0..1500).map(|i| format!("b/p{i:05}")).collect::<Vec<_>>());
        // Iteration after a key, present or not.
        let after: Vec<_> = objects.iter_after(Some(("b", "p01499x"))).map(|e| e.object.as_ref().to_owned()).collect();
        assert_eq!(after, ["c/last"]);
        let after: Vec<_> =
            objects.iter_after(Some(("a", "zzz"))).take(1).map(|e| e.object.as_ref().to_owned()).collect();
        assert_eq!(after, ["b/p00000"]);
        // Removing everything leaves an empty, usable sequence.
        let all: Vec<_> = keys.clone();
        for (ns, name) in &all {
            objects.remove(ns, name);
        }
        assert_eq!((objects.len(), objects.chunks.len()), (0, 0));
        objects.upsert("z", "again", text("z/again"));
        assert_eq!(texts(&objects), ["z/again"]);
    }

    /// The cache's answer for every list shape is the store's, item for item and token for
    /// token, including the continue pages and a token taken up by the other side.
    #[tokio::test]
    async fn serves_what_sqlite_would_and_follows_changes() {
        serves_what_the_store_would_and_follows_changes(Arc::new(SqliteStore::memory().await.unwrap())).await;
    }

    /// As above on the Postgres store, in a private server (`PgCluster`): its texts, its tokens
    /// and its watch are its own code, not SQLite's.
    #[tokio::test]
    async fn serves_what_postgres_would_and_follows_changes() {
        let cluster = PgCluster::start();
        let store = PostgresStore::connect_with(cluster.empty_database().await).await.unwrap();
        serves_what_the_store_would_and_follows_changes(Arc::new(store)).await;
    }

    async fn serves_what_the_store_would_and_follows_changes(store: Arc<dyn Store>) {
        let pods =
            (0..300).map(|i| Op::Create(pod(["a", "b", "c"][i % 3], &format!("p{i:03}"), &format!("w{}", i % 4))));
        store.txn(pods.collect()).await.unwrap();
        let cacher = Cacher::new(store.clone());
        assert!(cacher.list("Pod", &ListOptions::default(), ListRevision::Any).await.is_none(), "not filled yet");
        let revision = store.revision().await.unwrap();
        cacher.wait_for("Pod", revision).await;

        // Changes after the fill: an update, a delete, a create, and a commit of another kind.
        let mut changed = pod("b", "p001", "w9");
        changed["spec"]["nodeName"] = json!("n2");
        store.txn(vec![Op::Update(changed)]).await.unwrap();
        store.txn(vec![Op::Delete { key: ObjectKey::new("Pod", "c", "p002"), revision: None }]).await.unwrap();
        store.txn(vec![Op::Create(pod("a", "p999", "w1"))]).await.unwrap();
        let config = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "a"}});
        store.txn(vec![Op::Create(config)]).await.unwrap();

        let options = |namespace: Option<&str>, labels: Option<&str>, limit: Option<usize>| ListOptions {
            namespace: namespace.map(str::to_owned),
            label_selector: labels.map(str::to_owned),
            limit,
            ..Default::default()
        };
        for options in [
            options(None, None, None),
            options(Some("b"), None, None),
            options(Some("none"), None, None),
            options(None, Some("app in (w1,w9)"), None),
            options(None, None, Some(40)),
            options(Some("c"), None, Some(7)),
            options(None, Some("app=w2"), Some(10)),
            options(Some("a"), Some("app!=w1"), Some(1)),
        ] {
            let pages = answers_as_the_store(&cacher, store.as_ref(), &options).await.unwrap();
            if options.limit.is_none() {
                assert_eq!(pages, 0, "{options:?}");
            }
        }

        // A paged list keeps its revision while writes go on; a token from the store at a
        // revision the cache kept no snapshot of goes back to the store.
        let first = cacher.list("Pod", &options(None, None, Some(100)), ListRevision::MostRecent).await.unwrap();
        store.txn(vec![Op::Delete { key: ObjectKey::new("Pod", "c", "p299"), revision: None }]).await.unwrap();
        let next = ListOptions { continue_token: first.continue_token.clone(), ..options(None, None, Some(1000)) };
        let rest = cacher.list("Pod", &next, ListRevision::MostRecent).await.unwrap();
        assert_eq!(rest.revision, first.revision);
        assert!(rest.items.iter().any(|t| t.as_ref().contains("\"p299\"")), "the deleted Pod is in the old revision");
        let from_store = store.list_json("Pod", &options(None, None, Some(5))).await.unwrap();
        let token = ListOptions { continue_token: from_store.continue_token, ..Default::default() };
        assert!(cacher.list("Pod", &token, ListRevision::MostRecent).await.is_none());
        let garbage = ListOptions { continue_token: Some("zz".into()), ..Default::default() };
        assert!(cacher.list("Pod", &garbage, ListRevision::MostRecent).await.is_none());
        // Exact and at_revision go to the store; "0" serves what the cache has.
        assert!(cacher.list("Pod", &ListOptions::default(), ListRevision::Exact(revision)).await.is_none());
        let any = cacher.list("Pod", &ListOptions::default(), ListRevision::Any).await.unwrap();
        assert!(any.revision >= revision);
    }

    /// Whether the cache's consistent read of `options`, and of each continue page, is the
    /// store's: the same revision, the same texts byte for byte, the same tokens. The pages
    /// after the first, or a description of the first difference (or of a list the cache left
    /// to the store).
    async fn answers_as_the_store(cacher: &Cacher, store: &dyn Store, options: &ListOptions) -> Result<usize, String> {
        let (mut from_store, mut from_cache) = (options.clone(), options.clone());
        let mut pages = 0;
        loop {
            let want = store.list_json("Pod", &from_store).await.map_err(|e| e.to_string())?;
            // A consistent read: served once the cache has seen the store's revision.
            let Some(got) = cacher.list("Pod", &from_cache, ListRevision::MostRecent).await else {
                return Err(format!("{options:?} page {pages}: not served from the cache"));
            };
            let got_items: Vec<&str> = got.items.iter().map(AsRef::as_ref).collect();
            if got.revision != want.revision || got_items != want.items || got.continue_token != want.continue_token {
                return Err(format!(
                    "{options:?} page {pages}: the cache answered {:?} at {} (next {:?}), the store {:?} at {} (next {:?})",
                    got_items, got.revision, got.continue_token, want.items, want.revision, want.continue_token
                ));
            }
            let Some(token) = got.continue_token else { return Ok(pages) };
            from_store.continue_token = Some(token.clone());
            from_cache.continue_token = Some(token);
            pages += 1;
        }
    }

    /// Polls `check` until it succeeds (wait, never sleep); panics with its last answer after
    /// a deadline well past the longest backoff a test reaches.
    async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, String>>,
    {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match check().await {
                Ok(value) => return value,
                Err(last) if Instant::now() > deadline => panic!("timed out waiting for {what}: {last}"),
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }

    /// A real store whose watches the test breaks, as a dropped connection or a restarted
    /// server would: [`Breakable::cut`] ends every open watch (with an error, or as a stream
    /// that simply ends) and refuses new ones until [`Breakable::restore`]. Only the failure is
    /// faked; every answer is the real store's. It counts the fills (only the cacher lists
    /// through it) and records when each watch was asked for.
    struct Breakable {
        inner: Arc<dyn Store>,
        down: AtomicBool,
        /// Sent to end the open watches; the value says whether with an error.
        cut: watch::Sender<bool>,
        fills: AtomicUsize,
        watches: Mutex<Vec<Instant>>,
        /// New watches never answer (a database that stopped responding).
        hang: AtomicBool,
    }

    impl Breakable {
        fn new(inner: Arc<dyn Store>) -> Arc<Breakable> {
            let (cut, _) = watch::channel(false);
            Arc::new(Breakable {
                inner,
                down: AtomicBool::new(false),
                cut,
                fills: AtomicUsize::new(0),
                watches: Mutex::default(),
                hang: AtomicBool::new(false),
            })
        }

        fn cut(&self, with_error: bool) {
            self.down.store(true, Ordering::SeqCst);
            self.cut.send_replace(with_error);
        }

        fn restore(&self) {
            self.down.store(false, Ordering::SeqCst);
        }

        fn fills(&self) -> usize {
            self.fills.load(Ordering::SeqCst)
        }

        fn watches(&self) -> Vec<Instant> {
            self.watches.lock().unwrap().clone()
        }
    }

    #[async_trait::async_trait]
    impl Store for Breakable {
        async fn get(&self, key: &ObjectKey) -> Result<Option<Value>, StoreError> {
            self.inner.get(key).await
        }

        async fn list(&self, kind: &str, options: &ListOptions) -> Result<List, StoreError> {
            self.inner.list(kind, options).await
        }

        async fn list_json(&self, kind: &str, options: &ListOptions) -> Result<List<String>, StoreError> {
            self.fills.fetch_add(1, Ordering::SeqCst);
            self.inner.list_json(kind, options).await
        }

        async fn txn(&self, ops: Vec<Op>) -> Result<Committed, StoreError> {
            self.inner.txn(ops).await
        }

        async fn watch(&self, from: Revision, options: WatchOptions) -> Result<WatchStream, StoreError> {
            self.watches.lock().unwrap().push(Instant::now());
            if self.hang.load(Ordering::SeqCst) {
                std::future::pending::<()>().await;
            }
            if self.down.load(Ordering::SeqCst) {
                return Err(StoreError::Unavailable("the test broke the watch".into()));
            }
            let cut = self.cut.subscribe();
            let events = self.inner.watch(from, options).await?;
            let events = futures::stream::unfold(Some((events, cut)), |state| async move {
                let (mut events, mut cut) = state?;
                tokio::select! {
                    biased;
                    _ = cut.changed() => {
                        let with_error = *cut.borrow_and_update();
                        with_error.then(|| (Err(StoreError::Unavailable("the test cut the watch".into())), None))
                    }
                    event = events.next() => event.map(|event| (event, Some((events, cut)))),
                }
            });
            Ok(events.boxed())
        }

        async fn revision(&self) -> Result<Revision, StoreError> {
            self.inner.revision().await
        }

        async fn compact(&self, revision: Revision) -> Result<(), StoreError> {
            self.inner.compact(revision).await
        }
    }

    /// A broken watch: while it is down the cache serves no consistent read (the store
    /// answers) and "0" or an older "not older than" only as of the revision it holds, whose
    /// texts are the store's at that revision; it asks again after 200 ms, then 400, 800 (never
    /// spinning); restored, it follows on from its revision with the changes made meanwhile,
    /// without a fill. Cut again and the history compacted past it meanwhile, it fills again.
    /// A store whose new watch hangs: the cache does not count as following while it waits for
    /// it, so a consistent read goes to the store at once instead of waiting [`FRESHNESS_WAIT`]
    /// for a revision the cache cannot get.
    #[tokio::test]
    async fn a_hanging_watch_sends_consistent_reads_to_the_store_at_once() {
        let inner: Arc<dyn Store> = Arc::new(SqliteStore::memory().await.unwrap());
        inner.txn(vec![Op::Create(pod("a", "p0", "w0"))]).await.unwrap();
        let store = Breakable::new(inner.clone());
        let cacher = Cacher::new(store.clone());
        let all = ListOptions::default();
        assert!(cacher.list("Pod", &all, ListRevision::Any).await.is_none(), "not filled yet");
        eventually("the fill", || answers_as_the_store(&cacher, inner.as_ref(), &all)).await;
        store.hang.store(true, Ordering::SeqCst);
        let watches = store.watches().len();
        store.cut(false);
        eventually("a hanging watch", || async {
            let n = store.watches().len();
            if n > watches { Ok(()) } else { Err(format!("{n} watches")) }
        })
        .await;
        inner.txn(vec![Op::Create(pod("a", "p1", "w0"))]).await.unwrap();
        let asked = Instant::now();
        assert!(cacher.list("Pod", &all, ListRevision::MostRecent).await.is_none(), "answered by the store");
        assert!(asked.elapsed() < FRESHNESS_WAIT, "waited {:?} for a watch that hangs", asked.elapsed());
    }

    #[tokio::test]
    async fn a_broken_watch_on_sqlite_backs_off_and_catches_up() {
        a_broken_watch_backs_off_and_catches_up(Arc::new(SqliteStore::memory().await.unwrap())).await;
    }

    #[tokio::test]
    async fn a_broken_watch_on_postgres_backs_off_and_catches_up() {
        let cluster = PgCluster::start();
        let store = PostgresStore::connect_with(cluster.empty_database().await).await.unwrap();
        a_broken_watch_backs_off_and_catches_up(Arc::new(store)).await;
    }

    async fn a_broken_watch_backs_off_and_catches_up(inner: Arc<dyn Store>) {
        let pods = (0..30).map(|i| Op::Create(pod(["a", "b"][i % 2], &format!("p{i:02}"), &format!("w{}", i % 3))));
        inner.txn(pods.collect()).await.unwrap();
        let store = Breakable::new(inner.clone());
        let cacher = Cacher::new(store.clone());
        let all = ListOptions::default();
        let paged = ListOptions { limit: Some(7), ..Default::default() };
        let in_b =
            ListOptions { namespace: Some("b".into()), label_selector: Some("app!=w1".into()), ..Default::default() };
        let same = || async {
            for options in [&all, &paged, &in_b] {
                answers_as_the_store(&cacher, inner.as_ref(), options).await?;
            }
            Ok::<(), String>(())
        };
        assert!(cacher.list("Pod", &all, ListRevision::Any).await.is_none(), "not filled yet");
        eventually("the fill", same).await;
        assert_eq!((store.fills(), store.watches().len()), (1, 1));

        // Cut with an error; every new watch is refused while down.
        let held = inner.revision().await.unwrap();
        let cut_at = Instant::now();
        store.cut(true);
        let watches = store.watches().len();
        eventually("two refused watches", || async {
            let n = store.watches().len();
            if n >= watches + 2 { Ok(()) } else { Err(format!("{n} watches")) }
        })
        .await;
        let mut changed = pod("b", "p01", "w9");
        changed["spec"]["nodeName"] = json!("n2");
        inner.txn(vec![Op::Update(changed)]).await.unwrap();
        inner.txn(vec![Op::Delete { key: ObjectKey::new("Pod", "a", "p02"), revision: None }]).await.unwrap();
        inner.txn(vec![Op::Create(pod("a", "p99", "w1"))]).await.unwrap();
        let latest = inner.revision().await.unwrap();

        // Down: a read that needs the new revisions goes to the store at once (no 3 s wait for a
        // watch that cannot bring them); "0" and "not older than" what it holds are served as of
        // its revision, with the store's texts at that revision.
        assert!(!cacher.kind("Pod").following.load(Ordering::SeqCst), "no wait for a revision that cannot come");
        assert!(cacher.list("Pod", &all, ListRevision::MostRecent).await.is_none(), "a consistent read while down");
        assert!(cacher.list("Pod", &all, ListRevision::NotOlderThan(latest)).await.is_none());
        let at_held =
            inner.list_json("Pod", &ListOptions { at_revision: Some(held), ..Default::default() }).await.unwrap();
        for revision in [ListRevision::Any, ListRevision::NotOlderThan(held)] {
            let stale = cacher.list("Pod", &all, revision).await.expect("served as of the cache's revision");
            let texts: Vec<&str> = stale.items.iter().map(AsRef::as_ref).collect();
            assert_eq!((stale.revision, texts), (held, at_held.items.iter().map(String::as_str).collect()));
        }

        // Backing off: 200 ms, then doubling; never faster, so never spinning.
        eventually("a third refused watch", || async {
            let n = store.watches().len();
            if n >= watches + 3 { Ok(()) } else { Err(format!("{n} watches")) }
        })
        .await;
        let times = store.watches();
        let mut previous = cut_at;
        for (i, at) in times[watches..watches + 3].iter().enumerate() {
            let least = MIN_BACKOFF * 2u32.pow(i as u32);
            assert!(*at - previous >= least - Duration::from_millis(5), "retry {i} after {:?}", *at - previous);
            previous = *at;
        }
        assert_eq!(store.fills(), 1, "a refused watch is retried, not filled again");

        // Restored: the next retry follows on from the held revision, with what changed meanwhile.
        store.restore();
        eventually("the cache caught up after the watch came back", same).await;
        assert_eq!(store.fills(), 1, "the watch went on from its revision: no fill");
        inner.txn(vec![Op::Create(pod("b", "p98", "w2"))]).await.unwrap();
        eventually("a change after the watch came back", same).await;

        // Ended cleanly this time, and the history compacted past the cache's revision while
        // down: the watch from it is Expired, and the cache fills again.
        let watches = store.watches().len();
        store.cut(false);
        eventually("a refused watch", || async {
            let n = store.watches().len();
            if n > watches { Ok(()) } else { Err(format!("{n} watches")) }
        })
        .await;
        inner.txn(vec![Op::Delete { key: ObjectKey::new("Pod", "b", "p03"), revision: None }]).await.unwrap();
        inner.txn(vec![Op::Create(pod("a", "p97", "w0"))]).await.unwrap();
        inner.compact(inner.revision().await.unwrap()).await.unwrap();
        assert!(cacher.list("Pod", &all, ListRevision::MostRecent).await.is_none(), "a consistent read while down");
        store.restore();
        eventually("the fill after the history was compacted", same).await;
        assert_eq!(store.fills(), 2, "filled once more, for the compacted history");
        inner.txn(vec![Op::Create(pod("b", "p96", "w2"))]).await.unwrap();
        eventually("a change after the fill", same).await;
        assert_eq!(store.fills(), 2);
    }

    #[tokio::test]
    async fn a_read_ahead_of_the_cache_waits_then_gives_way() {
        let store = Arc::new(SqliteStore::memory().await.unwrap());
        store.txn(vec![Op::Create(pod("a", "p", "w"))]).await.unwrap();
        let cacher = Cacher::new(store.clone());
        cacher.wait_for("Pod", store.revision().await.unwrap()).await;
        let ahead = store.revision().await.unwrap() + 10;
        let answer = cacher.list("Pod", &ListOptions::default(), ListRevision::NotOlderThan(ahead)).await;
        assert!(answer.is_none(), "not reached within the wait: the store path answers");
    }
}
