//! The parts of a SQL backend that do not depend on the database: how a batch of transactions
//! is staged and applied (one read and one write per batch), how a list is paged under a label selector (the
//! continue token is the contract's [`ContinueToken`]), and how a watch follows the `events` history. Each backend supplies only
//! its SQL through the small traits here ([`TxnWriter`], [`ListSource`], [`EventLog`]), so the
//! SQLite and Postgres stores cannot drift apart in behaviour.

use crate::{Txn, encryption::Keyring, stage};
use futures::StreamExt;
use gitplane_store::{
    Committed, ContinueToken, Event, EventType, List, ListOptions, ObjectKey, Op, Rejection, Result, Revision,
    StoreError, WatchOptions, WatchStream, selector::Selector,
};
use serde_json::Value;
use sqlx::migrate::{Migration, MigrationType, Migrator};
use std::{
    borrow::{Borrow, Cow},
    collections::{BTreeMap, HashMap, VecDeque},
    future::Future,
    sync::Arc,
    time::{Duration, Instant},
};
use tokio::sync::watch;

/// Events read per query while a watch catches up.
pub(crate) const WATCH_BATCH: i64 = 1000;
/// Transactions applied together in one database transaction, at most.
pub(crate) const MAX_BATCH: usize = 1024;
/// Rows read per query while a label selector filters a page.
const LIST_BATCH: i64 = 512;
/// Bookmarks for a filtered watch are sent at most this often, unless it asks otherwise.
const BOOKMARK_INTERVAL: Duration = Duration::from_millis(100);

/// A migrator for SQL embedded in the binary: `(version, description, sql)`.
pub(crate) fn migrator(migrations: &[(i64, &'static str, &'static str)], locking: bool) -> Migrator {
    Migrator {
        migrations: Cow::Owned(
            migrations
                .iter()
                .map(|&(v, d, sql)| {
                    Migration::new(v, Cow::Borrowed(d), MigrationType::Simple, Cow::Borrowed(sql), false)
                })
                .collect(),
        ),
        ignore_missing: false,
        locking,
        no_tx: false,
    }
}

/// How the `events` table stores an event's type (2, a deletion, also appears in the SQL).
pub(crate) fn event_code(event_type: EventType) -> i64 {
    match event_type {
        EventType::Added => 0,
        EventType::Modified => 1,
        EventType::Deleted | EventType::Bookmark => 2,
    }
}

fn event_type(code: i64) -> EventType {
    match code {
        0 => EventType::Added,
        1 => EventType::Modified,
        _ => EventType::Deleted,
    }
}

/// A stored object's JSON, or `Corrupt` naming the object.
pub(crate) fn parse(key: &ObjectKey, text: &str) -> Result<Value> {
    serde_json::from_str(text).map_err(|source| StoreError::Corrupt { key: key.to_string(), source })
}

/// A stored object from its stored text: opened (when sealed) and parsed.
pub(crate) fn decode(keys: &Keyring, key: &ObjectKey, stored: &str) -> Result<Value> {
    parse(key, &keys.open(key, stored).map_err(StoreError::backend)?)
}

// ---------------------------------------------------------------------------------------------
// Writes
// ---------------------------------------------------------------------------------------------

/// The final state of one object after a batch: its revision and JSON, or gone.
pub(crate) struct ObjectWrite {
    pub key: ObjectKey,
    pub revision: Revision,
    /// `None`: deleted.
    pub value: Option<String>,
}

/// One entry of the history.
pub(crate) struct EventWrite {
    pub revision: Revision,
    pub seq: i64,
    pub event_type: EventType,
    pub key: ObjectKey,
    pub value: String,
}

/// The statements a backend runs inside its open write transaction: one read of every object a
/// batch touches, then one write of the outcome. Statements per batch, not per transaction,
/// are what make group commit pay (each statement is a round trip to the database driver).
pub(crate) trait TxnWriter: Send {
    /// The stored text of the objects among `keys` (absent ones are missing from the answer).
    fn current_many(&mut self, keys: &[ObjectKey]) -> impl Future<Output = Result<HashMap<ObjectKey, String>>> + Send;
    /// Writes the final state of every changed object and appends the events.
    fn write(&mut self, objects: &[ObjectWrite], events: &[EventWrite]) -> impl Future<Output = Result<()>> + Send;
    /// Refuses keys the database cannot store. Everything by default.
    fn admit(&self, _key: &ObjectKey) -> Result<(), Rejection> {
        Ok(())
    }
}

/// Applies transactions in order inside the caller's open database transaction, the first at
/// `revision + 1`: each commits under its own revision or is refused without effect. They are
/// staged in memory against the objects read once for the whole batch, so a refused transaction
/// simply leaves nothing behind. Objects of the encrypted kinds are sealed with `secrets`' write
/// key; a transaction that touches one that cannot be opened is refused (naming it and its key),
/// never the whole batch: on a Raft replica, a failed apply would stop the replica.
/// Returns each outcome and the revision of the last commit.
pub(crate) async fn apply_txns<W: TxnWriter, T: Borrow<Txn>>(
    writer: &mut W,
    secrets: &Keyring,
    txns: &[T],
    mut revision: Revision,
) -> Result<Applied> {
    let mut keys: Vec<ObjectKey> = txns.iter().flat_map(|t| &t.borrow().ops).filter_map(|op| op.key().ok()).collect();
    keys.sort();
    keys.dedup();
    keys.retain(|k| writer.admit(k).is_ok());
    let mut found = writer.current_many(&keys).await?;
    let mut unreadable: HashMap<ObjectKey, String> = HashMap::new();
    // Shared with the watch cache's events: an object is copied once per write, for `Committed`.
    let mut state: HashMap<ObjectKey, Option<Arc<Value>>> = HashMap::with_capacity(keys.len());
    for k in keys {
        let value = match found.remove(&k).map(|text| decode(secrets, &k, &text)).transpose() {
            Ok(v) => v,
            Err(e) => {
                unreadable.insert(k, e.to_string());
                continue;
            }
        };
        state.insert(k, value.map(Arc::new));
    }
    let mut objects: BTreeMap<ObjectKey, ObjectWrite> = BTreeMap::new();
    let mut events = Vec::new();
    let mut watched = Vec::new();
    let mut results = Vec::with_capacity(txns.len());
    for txn in txns {
        let blocked = txn.borrow().ops.iter().find_map(|op| unreadable.get(&op.key().ok()?));
        if let Some(reason) = blocked {
            results.push(Err(Rejection::Invalid(reason.clone())));
            continue;
        }
        match stage_txn(writer, txn.borrow(), revision + 1, &state) {
            Err(r) => results.push(Err(r)),
            Ok(staged) if staged.is_empty() => results.push(Ok(Committed { revision, objects: Vec::new() })),
            Ok(staged) => {
                revision += 1;
                let mut committed = Vec::with_capacity(staged.len());
                let folded = fold(&staged);
                for ((seq, op_type, key, text, value), event_type) in staged.into_iter().zip(folded) {
                    let gone = op_type == EventType::Deleted;
                    let text = secrets.seal(&key, text);
                    let value = Arc::new(value);
                    state.insert(key.clone(), (!gone).then(|| value.clone()));
                    objects.insert(
                        key.clone(),
                        ObjectWrite { key: key.clone(), revision, value: (!gone).then(|| text.clone()) },
                    );
                    if let Some(event_type) = event_type {
                        watched.push((seq, Event { revision, event_type, key: key.clone(), object: value.clone() }));
                        events.push(EventWrite { revision, seq, event_type, key, value: text });
                    }
                    committed.push(Arc::unwrap_or_clone(value));
                }
                results.push(Ok(Committed { revision, objects: committed }));
            }
        }
    }
    if !events.is_empty() {
        let objects: Vec<ObjectWrite> = objects.into_values().collect();
        writer.write(&objects, &events).await?;
    }
    Ok(Applied { results, revision, events: watched })
}

/// What a batch did: each transaction's outcome, the revision reached, and the events in order
/// (for the watch cache).
pub(crate) struct Applied {
    pub results: Vec<Result<Committed, Rejection>>,
    pub revision: Revision,
    pub events: Vec<(i64, Event)>,
}

/// The latest events in memory, as kube-apiserver's watch cache: watchers at or past its floor
/// are served from here, without a query each; the others read the `events` table. It holds
/// whole revisions: every event of a revision above `floor` is present.
pub(crate) struct WatchCache {
    ring: std::sync::RwLock<(VecDeque<(i64, Event)>, Revision)>,
    capacity: usize,
}

impl WatchCache {
    /// Empty, holding everything after `floor` (the revision the store is at).
    pub(crate) fn new(capacity: usize, floor: Revision) -> Self {
        WatchCache { ring: std::sync::RwLock::new((VecDeque::new(), floor)), capacity }
    }

    /// Appends a committed batch's events (before watchers are told of the commit).
    pub(crate) fn push(&self, events: Vec<(i64, Event)>) {
        let mut guard = self.ring.write().unwrap_or_else(|e| e.into_inner());
        let (ring, floor) = &mut *guard;
        ring.extend(events);
        while ring.len() > self.capacity {
            let Some(oldest) = ring.front().map(|(_, e)| e.revision) else { break };
            while ring.front().is_some_and(|(_, e)| e.revision == oldest) {
                ring.pop_front();
            }
            *floor = oldest;
        }
    }

    /// Forgets everything: the store now holds what another copy held (a snapshot).
    pub(crate) fn reset(&self, floor: Revision) {
        *self.ring.write().unwrap_or_else(|e| e.into_inner()) = (VecDeque::new(), floor);
    }

    /// The events after `after`, when the cache holds all of them.
    pub(crate) fn read(
        &self,
        after: (Revision, i64),
        kinds: Option<&[String]>,
        limit: i64,
        latest: Revision,
    ) -> Option<EventRead> {
        let guard = self.ring.read().unwrap_or_else(|e| e.into_inner());
        let (ring, floor) = &*guard;
        // A reader part-way through the floor revision (paging a large transaction) needs the
        // rest of it, which is gone: the table has it.
        if after.0 < *floor || (after.0 == *floor && after.1 != i64::MAX) {
            return None;
        }
        let start = ring.partition_point(|(seq, e)| (e.revision, *seq) <= after);
        let events = ring
            .range(start..)
            .filter(|(_, e)| kinds.is_none_or(|k| k.contains(&e.key.kind)))
            .take(limit.max(1) as usize)
            .cloned()
            .collect();
        Some(EventRead { events, latest })
    }
}

type Staged = (i64, EventType, ObjectKey, String, Value);

/// One transaction against the batch's state so far: what it writes, or why it is refused.
fn stage_txn<W: TxnWriter>(
    writer: &W,
    txn: &Txn,
    revision: Revision,
    state: &HashMap<ObjectKey, Option<Arc<Value>>>,
) -> Result<Vec<Staged>, Rejection> {
    // This transaction's own writes, seen by its later ops: where each object was last staged.
    let mut local: HashMap<ObjectKey, usize> = HashMap::new();
    let mut staged: Vec<Staged> = Vec::with_capacity(txn.ops.len());
    let mut uids = txn.uids.iter();
    for (seq, op) in txn.ops.iter().enumerate() {
        let key = op.key()?;
        writer.admit(&key)?;
        let existing = match local.get(&key) {
            Some(&i) => (staged[i].1 != EventType::Deleted).then_some(&staged[i].4),
            None => state.get(&key).and_then(Option::as_deref),
        };
        let (event_type, value) = stage_op(op, &key, existing, revision, &mut uids, &txn.time)?;
        let text = value.to_string();
        stage::check_size(&key, &text)?;
        local.insert(key.clone(), staged.len());
        staged.push((seq as i64, event_type, key, text, value));
    }
    Ok(staged)
}

/// One event per object per transaction, as kube-apiserver gives one per write (and etcd refuses
/// a key twice in one transaction): an op followed by another on the same object is folded into
/// the later one, whose event carries the object's change as a whole (a Node's registration writes
/// the Node and its status as two ops; a watcher sees one event, not a state that no read could
/// see). Created and deleted in one transaction: no event; deleted and
/// created again: both, as they are two objects.
fn fold(staged: &[Staged]) -> Vec<Option<EventType>> {
    let mut events: Vec<Option<EventType>> = staged.iter().map(|(_, event_type, ..)| Some(*event_type)).collect();
    let mut last: HashMap<&ObjectKey, usize> = HashMap::new();
    for (i, (_, event_type, key, ..)) in staged.iter().enumerate() {
        let Some(earlier) = last.insert(key, i) else { continue };
        events[i] = match (events[earlier], *event_type) {
            (Some(EventType::Deleted) | None, _) => continue,
            (Some(EventType::Added), EventType::Deleted) => None,
            (Some(EventType::Added), _) => Some(EventType::Added),
            (Some(_), later) => Some(later),
        };
        events[earlier] = None;
    }
    events
}

fn check_revision(key: &ObjectKey, expected: Option<Revision>, old: &Value) -> Result<(), Rejection> {
    let current = gitplane_api::object::resource_version(old).unwrap_or(0);
    match expected {
        Some(expected) if expected != current => Err(Rejection::Conflict { key: key.clone(), expected, current }),
        _ => Ok(()),
    }
}

/// What one op does to the store, decided from the current object.
fn stage_op(
    op: &Op,
    key: &ObjectKey,
    current: Option<&Value>,
    revision: Revision,
    uids: &mut std::slice::Iter<'_, String>,
    time: &str,
) -> Result<(EventType, Value), Rejection> {
    match (op, current) {
        (Op::Create(_), Some(_)) => Err(Rejection::AlreadyExists { key: key.clone() }),
        (Op::Create(value), None) => {
            let uid =
                uids.next().cloned().ok_or_else(|| Rejection::Invalid("transaction has no uid for a create".into()))?;
            Ok((EventType::Added, stage::create(value.clone(), revision, uid, time)?))
        }
        (Op::Update(_) | Op::UpdateStatus(_) | Op::UpdateWithStatus(_) | Op::Delete { .. }, None) => {
            Err(Rejection::NotFound { key: key.clone() })
        }
        (Op::Update(value), Some(old)) => {
            check_revision(key, stage::expected_revision(value), old)?;
            Ok((EventType::Modified, stage::update(old, value.clone(), revision)?))
        }
        (Op::UpdateStatus(value), Some(old)) => {
            check_revision(key, stage::expected_revision(value), old)?;
            Ok((EventType::Modified, stage::update_status(old, value, revision)?))
        }
        (Op::UpdateWithStatus(value), Some(old)) => {
            check_revision(key, stage::expected_revision(value), old)?;
            Ok((EventType::Modified, stage::update_with_status(old, value.clone(), revision)?))
        }
        (Op::Delete { revision: expected, .. }, Some(old)) => {
            check_revision(key, *expected, old)?;
            Ok((EventType::Deleted, stage::delete(old, revision)?))
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Lists
// ---------------------------------------------------------------------------------------------

/// The reads a list makes inside one read transaction (one snapshot).
pub(crate) trait ListSource: Send {
    /// The latest and the compacted revision.
    fn bounds(&mut self) -> impl Future<Output = Result<(Revision, Revision)>> + Send;
    /// Rows `(namespace, name, value)` of a kind after a key, as of `revision` (`latest` when it
    /// is the newest one), in key order, at most `limit` of them (all when negative).
    fn rows(
        &mut self,
        kind: &str,
        namespace: Option<&str>,
        after: (&str, &str),
        revision: Revision,
        latest: bool,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<(String, String, String)>>> + Send;
}

/// What a list's rows become: objects, or their stored JSON text (which `stage` wrote as
/// `Value::to_string`, so it is already the text [`gitplane_store::Store::list_json`] promises).
pub(crate) trait ListItem: Sized + Send {
    /// `text` is the opened stored JSON; `parsed`, the object when a selector parsed it already.
    fn from_stored(key: &ObjectKey, text: String, parsed: Option<Value>) -> Result<Self>;
}

impl ListItem for Value {
    fn from_stored(key: &ObjectKey, text: String, parsed: Option<Value>) -> Result<Self> {
        parsed.map_or_else(|| parse(key, &text), Ok)
    }
}

impl ListItem for String {
    fn from_stored(_: &ObjectKey, text: String, _: Option<Value>) -> Result<Self> {
        Ok(text)
    }
}

/// A list request, checked before any database work.
pub(crate) struct ListRequest<'a> {
    options: &'a ListOptions,
    selector: Selector,
    token: Option<ContinueToken>,
}

impl<'a> ListRequest<'a> {
    pub(crate) fn parse(options: &'a ListOptions) -> Result<Self> {
        let selector = Selector::parse(options.label_selector.as_deref().unwrap_or(""))
            .map_err(|e| StoreError::BadRequest(e.to_string()))?;
        let token = options.continue_token.as_deref().map(ContinueToken::decode).transpose()?;
        Ok(ListRequest { options, selector, token })
    }

    /// The key after which the page starts (a continue token's).
    pub(crate) fn after(&self) -> Option<(&str, &str)> {
        self.token.as_ref().map(|t| (t.namespace.as_str(), t.name.as_str()))
    }

    /// Reads one page from `source`, all at one revision: the continue token's, `at_revision`,
    /// or the latest.
    pub(crate) async fn read<S: ListSource, T: ListItem>(
        &self,
        source: &mut S,
        secrets: &Keyring,
        kind: &str,
    ) -> Result<List<T>> {
        let (latest, compacted) = source.bounds().await?;
        let (revision, mut after) = match (&self.token, self.options.at_revision) {
            (Some(t), _) => (t.revision, (t.namespace.clone(), t.name.clone())),
            (None, Some(at)) => (at, (String::new(), String::new())),
            (None, None) => (latest, (String::new(), String::new())),
        };
        if revision < compacted {
            return Err(StoreError::Expired { requested: revision, compacted });
        }
        if revision > latest {
            return Err(StoreError::BadRequest(format!("revision {revision} is in the future (latest is {latest})")));
        }
        let namespace = self.options.namespace.as_deref();
        let limit = self.options.limit;
        let want = limit.map_or(usize::MAX, |l| l.max(1));
        // Without a selector every row is an item, so the database can stop after one row more
        // than the page; with one, rows are filtered here, a batch at a time.
        // Checked: a limit from outside as large as usize::MAX must not wrap to a batch of 0
        // (which read nothing, forever).
        let one_more = |l: usize| i64::try_from(l.max(1)).unwrap_or(i64::MAX).saturating_add(1);
        let batch = if self.selector.is_empty() { limit.map_or(-1, one_more) } else { LIST_BATCH };
        let mut items = Vec::new();
        let mut more = false;
        loop {
            let rows = source.rows(kind, namespace, (&after.0, &after.1), revision, revision == latest, batch).await?;
            let exhausted = batch < 0 || (rows.len() as i64) < batch;
            for (namespace, name, text) in rows {
                let key = ObjectKey::new(kind, namespace, name);
                let opened = match secrets.open(&key, &text).map_err(StoreError::backend)? {
                    Cow::Owned(opened) => Some(opened),
                    Cow::Borrowed(_) => None,
                };
                let text = opened.unwrap_or(text);
                // Only a selector needs the object itself; without one, text items stay unparsed.
                let parsed = match self.selector.is_empty() {
                    true => None,
                    false => Some(parse(&key, &text)?),
                };
                if parsed.as_ref().is_some_and(|value| !self.selector.matches(value)) {
                    after = (key.namespace, key.name);
                    continue;
                }
                if items.len() == want {
                    more = true;
                    break;
                }
                items.push(T::from_stored(&key, text, parsed)?);
                after = (key.namespace, key.name);
            }
            if more || exhausted {
                break;
            }
        }
        let continue_token = more.then(|| ContinueToken { revision, namespace: after.0, name: after.1 }.encode());
        Ok(List { revision, items, continue_token })
    }
}

// ---------------------------------------------------------------------------------------------
// Watches
// ---------------------------------------------------------------------------------------------

/// One read of the history for a watcher.
pub(crate) struct EventRead {
    /// `(seq, event)` in (revision, seq) order.
    pub events: Vec<(i64, Event)>,
    /// A revision up to which the read saw every commit: when `events` is empty, the watcher
    /// moves there. It must be known *before* the events are read (or in the same snapshot), or
    /// a commit landing in between would be skipped.
    pub latest: Revision,
}

/// An event row as both backends select it: revision, seq, type, kind, namespace, name, value.
pub(crate) type EventRow = (i64, i64, i64, String, String, String, String);

impl EventRead {
    pub(crate) fn from_rows(rows: Vec<EventRow>, secrets: &Keyring, latest: Revision) -> Result<Self> {
        let events = rows
            .into_iter()
            .map(|(revision, seq, code, kind, namespace, name, value)| {
                let key = ObjectKey::new(kind, namespace, name);
                let object = decode(secrets, &key, &value)?;
                Ok((seq, Event { revision, event_type: event_type(code), key, object: Arc::new(object) }))
            })
            .collect::<Result<_>>()?;
        Ok(EventRead { events, latest })
    }
}

/// The history a watch follows.
pub(crate) trait EventLog: Send + Sync + 'static {
    /// At most `limit` events after `after` (a (revision, seq) position), of `kinds` only when
    /// given. `Expired` when the history after `after` has been compacted.
    fn read(
        &self,
        after: (Revision, i64),
        kinds: Option<&[String]>,
        limit: i64,
    ) -> impl Future<Output = Result<EventRead>> + Send;
}

/// The latest revision that touched each set of kinds some watch follows: such a watch wakes
/// for its own kinds' commits, not for every commit (a thousand watches of Pods are not woken by
/// each Event or Lease written beside them).
#[derive(Default)]
pub(crate) struct KindCommits(std::sync::Mutex<HashMap<Vec<String>, watch::Sender<Revision>>>);

impl KindCommits {
    /// A commit at `revision` touched `kinds`; called after `committed` has moved to it.
    pub(crate) fn publish<'a>(&self, revision: Revision, kinds: impl IntoIterator<Item = &'a str>) {
        let kinds: Vec<&str> = kinds.into_iter().collect();
        let senders = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for (followed, sender) in senders.iter() {
            if followed.iter().any(|f| kinds.contains(&f.as_str())) {
                sender.send_replace(revision);
            }
        }
    }

    /// Every kind may have changed (the store was replaced by a snapshot).
    pub(crate) fn publish_all(&self, revision: Revision) {
        for sender in self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).values() {
            sender.send_replace(revision);
        }
    }

    /// Follows the commits of any of `kinds`. A new set starts at the latest revision, read under
    /// the lock that [`Self::publish`] takes after `committed` moved: no commit falls between the
    /// two.
    pub(crate) fn subscribe(&self, kinds: &[String], committed: &watch::Sender<Revision>) -> watch::Receiver<Revision> {
        let mut followed = kinds.to_vec();
        followed.sort();
        followed.dedup();
        let mut senders = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        senders.retain(|_, sender| sender.receiver_count() > 0);
        senders.entry(followed).or_insert_with(|| watch::channel(*committed.borrow()).0).subscribe()
    }
}

/// A watch from `from`: reads `log` whenever `committed` moves past what it has delivered.
/// With `kind` (the commits of the watch's kinds, from [`KindCommits`]) it reads at once when
/// one of its kinds changes, and for other commits at most every [`BOOKMARK_INTERVAL`] (or its
/// own `bookmark_interval`): that keeps its position near the head (inside the watch cache,
/// ahead of compaction) and its bookmarks as fresh as before.
pub(crate) fn watch_stream<L: EventLog>(
    log: Arc<L>,
    committed: watch::Receiver<Revision>,
    kind: Option<watch::Receiver<Revision>>,
    from: Revision,
    options: WatchOptions,
) -> WatchStream {
    let cursor = Cursor {
        log,
        committed,
        kind,
        last_read: None,
        position: (from, i64::MAX),
        buffer: VecDeque::new(),
        more: false,
        failed: false,
        options,
        last_bookmark: None,
    };
    futures::stream::unfold(cursor, |mut cursor| async move {
        let next = cursor.next().await?;
        Some((next, cursor))
    })
    .boxed()
}

/// A watcher's position in the history: (revision, seq) of the last event it delivered.
struct Cursor<L> {
    log: Arc<L>,
    committed: watch::Receiver<Revision>,
    kind: Option<watch::Receiver<Revision>>,
    /// When the log was last read (with `kind`: other kinds' commits wait until a while after).
    last_read: Option<Instant>,
    position: (Revision, i64),
    buffer: VecDeque<Event>,
    /// The last read filled a whole batch: more history may follow at the same revision.
    more: bool,
    failed: bool,
    options: WatchOptions,
    last_bookmark: Option<Instant>,
}

impl<L: EventLog> Cursor<L> {
    /// The next event; `None` ends the stream (after an error has been delivered).
    async fn next(&mut self) -> Option<Result<Event>> {
        if self.failed {
            return None;
        }
        loop {
            if let Some(event) = self.buffer.pop_front() {
                return Some(Ok(event));
            }
            if self.more || self.behind() {
                if let Err(e) = self.fill().await {
                    self.failed = true;
                    return Some(Err(e));
                }
                continue;
            }
            if !self.changed().await {
                return None; // the store is gone
            }
        }
    }

    fn interval(&self) -> Duration {
        self.options.bookmark_interval.unwrap_or(BOOKMARK_INTERVAL)
    }

    /// Whether there is something to read now.
    fn behind(&mut self) -> bool {
        let (position, interval) = (self.position.0, self.interval());
        match &mut self.kind {
            None => *self.committed.borrow_and_update() > position,
            Some(kind) => {
                *kind.borrow_and_update() > position
                    || (self.last_read.is_none_or(|t| t.elapsed() >= interval)
                        && *self.committed.borrow_and_update() > position)
            }
        }
    }

    /// Waits for a commit that may be worth reading; false when the store is gone.
    async fn changed(&mut self) -> bool {
        let interval = self.interval();
        let Some(kind) = &mut self.kind else { return self.committed.changed().await.is_ok() };
        let others_after = self.last_read.map_or_else(Instant::now, |t| t + interval);
        let committed = &mut self.committed;
        tokio::select! {
            changed = kind.changed() => changed.is_ok(),
            changed = async {
                tokio::time::sleep_until(others_after.into()).await;
                committed.changed().await
            } => changed.is_ok(),
        }
    }

    async fn fill(&mut self) -> Result<()> {
        self.last_read = Some(Instant::now());
        let read = self.log.read(self.position, self.options.kinds.as_deref(), WATCH_BATCH).await?;
        self.more = read.events.len() as i64 == WATCH_BATCH;
        if read.events.is_empty() {
            // Nothing for us up to `latest` (filtered out, or compacted away under us).
            self.position = self.position.max((read.latest, i64::MAX));
            let due = self.last_bookmark.is_none_or(|t| t.elapsed() >= self.interval());
            if self.options.bookmarks && due {
                self.last_bookmark = Some(Instant::now());
                self.buffer.push_back(Event::bookmark(self.position.0));
            }
        }
        for (seq, event) in read.events {
            self.position = (event.revision, seq);
            self.buffer.push_back(event);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A history in memory; `commit_during_read` lands a commit while a read is in flight.
    struct MemoryLog {
        events: Mutex<Vec<(i64, Event)>>,
        committed: watch::Sender<Revision>,
        commit_during_read: Mutex<Option<Event>>,
        reads: std::sync::atomic::AtomicUsize,
    }

    impl EventLog for MemoryLog {
        async fn read(&self, after: (Revision, i64), kinds: Option<&[String]>, limit: i64) -> Result<EventRead> {
            self.reads.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let latest = *self.committed.borrow();
            let events: Vec<_> = self
                .events
                .lock()
                .unwrap()
                .iter()
                .filter(|(seq, e)| (e.revision, *seq) > after)
                .filter(|(_, e)| kinds.is_none_or(|k| k.contains(&e.key.kind)))
                .take(limit as usize)
                .cloned()
                .collect();
            if let Some(event) = self.commit_during_read.lock().unwrap().take() {
                let revision = event.revision;
                self.events.lock().unwrap().push((0, event));
                self.committed.send_replace(revision);
            }
            Ok(EventRead { events, latest })
        }
    }

    fn event(revision: Revision, kind: &str) -> Event {
        Event {
            revision,
            event_type: EventType::Added,
            key: ObjectKey::new(kind, "a", format!("{kind}-{revision}")),
            object: Arc::new(Value::Null),
        }
    }

    #[tokio::test]
    async fn a_commit_during_an_empty_filtered_read_is_not_skipped() {
        let (committed, _) = watch::channel(1);
        let log = Arc::new(MemoryLog {
            events: Mutex::new(vec![(0, event(1, "Pod"))]),
            committed,
            commit_during_read: Mutex::new(Some(event(2, "ConfigMap"))),
            reads: Default::default(),
        });
        let options = WatchOptions { kinds: Some(vec!["ConfigMap".into()]), bookmarks: true, ..Default::default() };
        let mut w = watch_stream(log.clone(), log.committed.subscribe(), None, 0, options);
        let bookmark = tokio::time::timeout(Duration::from_secs(5), w.next()).await.unwrap().unwrap().unwrap();
        assert_eq!((bookmark.event_type, bookmark.revision), (EventType::Bookmark, 1));
        let e = tokio::time::timeout(Duration::from_secs(5), w.next()).await.unwrap().unwrap().unwrap();
        assert_eq!((e.event_type, e.revision, e.key.kind.as_str()), (EventType::Added, 2, "ConfigMap"));
    }

    #[tokio::test]
    async fn a_watch_of_some_kinds_reads_for_other_kinds_at_most_every_interval() {
        // (the kinds followed, the commit of one of them that must wake the watch, its interval)
        let cases: [(&[&str], &str, Option<Duration>); 3] = [
            (&["ConfigMap"], "ConfigMap", None),
            (&["Node", "Pod"], "Node", None),
            (&["Node", "Pod"], "Pod", Some(Duration::from_secs(60))),
        ];
        for (followed, wakes, bookmark_interval) in cases {
            let (committed, _) = watch::channel(0);
            let log = Arc::new(MemoryLog {
                events: Mutex::new(Vec::new()),
                committed,
                commit_during_read: Mutex::new(None),
                reads: Default::default(),
            });
            let kinds = Arc::new(KindCommits::default());
            let followed: Vec<String> = followed.iter().map(|k| k.to_string()).collect();
            let follow = kinds.subscribe(&followed, &log.committed);
            let options = WatchOptions { kinds: Some(followed.clone()), bookmarks: false, bookmark_interval };
            let mut w = watch_stream(log.clone(), log.committed.subscribe(), Some(follow), 0, options);
            let watcher = tokio::spawn(async move { w.next().await });
            let commit = |revision: Revision, kind: &str| {
                log.events.lock().unwrap().push((0, event(revision, kind)));
                log.committed.send_replace(revision);
                kinds.publish(revision, [kind]);
            };
            let started = Instant::now();
            // Over several default intervals.
            for revision in 1..=200 {
                commit(revision, "Lease.coordination.k8s.io");
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            commit(201, wakes);
            let e = tokio::time::timeout(Duration::from_secs(10), watcher).await.unwrap().unwrap().unwrap().unwrap();
            assert_eq!((e.revision, e.key.kind.as_str()), (201, wakes), "{followed:?}");
            // One read for the first Lease (it moves the position), one per interval since, and
            // one for the change followed; a watch woken by every commit reads 201 times.
            let reads = log.reads.load(std::sync::atomic::Ordering::SeqCst);
            let interval = bookmark_interval.unwrap_or(BOOKMARK_INTERVAL);
            let intervals = (started.elapsed().as_millis() / interval.as_millis()) as usize;
            assert!(reads <= 2 + intervals + 1, "{followed:?}: {reads} reads in {:?}", started.elapsed());
        }
    }
}

#[cfg(test)]
mod watch_cache_tests {
    use super::*;

    fn event(revision: Revision, kind: &str) -> Event {
        Event {
            revision,
            event_type: EventType::Added,
            key: ObjectKey::new(kind, "ns", "x"),
            object: Arc::new(Value::Null),
        }
    }

    #[test]
    fn serves_what_it_holds_and_evicts_whole_revisions() {
        let cache = WatchCache::new(3, 10);
        assert!(cache.read((9, i64::MAX), None, 100, 10).is_none(), "before the floor: read the table");
        cache.push(vec![(0, event(11, "Pod")), (1, event(11, "ConfigMap"))]);
        cache.push(vec![(0, event(12, "Pod"))]);
        let all = cache.read((10, i64::MAX), None, 100, 12).unwrap();
        assert_eq!(all.events.iter().map(|(s, e)| (e.revision, *s)).collect::<Vec<_>>(), [(11, 0), (11, 1), (12, 0)]);
        let mid = cache.read((11, 0), Some(&["ConfigMap".to_owned()]), 100, 12).unwrap();
        assert_eq!(mid.events.len(), 1);
        // A fourth event evicts all of revision 11, not half of it.
        cache.push(vec![(0, event(13, "Pod"))]);
        assert!(cache.read((10, i64::MAX), None, 100, 13).is_none());
        let rest = cache.read((11, i64::MAX), None, 1, 13).unwrap();
        assert_eq!(rest.events.iter().map(|(_, e)| e.revision).collect::<Vec<_>>(), [12], "limit applies");
        cache.reset(20);
        assert!(cache.read((13, i64::MAX), None, 100, 20).is_none());
    }

    #[test]
    fn a_revision_larger_than_the_cache_is_read_from_the_table_to_its_end() {
        let cache = WatchCache::new(3, 10);
        cache.push((0..5).map(|seq| (seq, event(11, "ConfigMap"))).collect());
        assert!(cache.read((10, i64::MAX), None, 2, 11).is_none(), "none of revision 11 is held");
        assert!(cache.read((11, 1), None, 2, 11).is_none(), "a reader half-way through it goes on in the table");
        assert!(cache.read((11, i64::MAX), None, 2, 11).unwrap().events.is_empty(), "past it: nothing new");
    }
}
