//! The embedded backend: SQLite in WAL mode through sqlx.
//!
//! Writes go through one writer task that applies every queued transaction in one SQLite
//! transaction (a savepoint each, so one refused transaction does not affect the others) and
//! one fsync: group commit, as etcd batches puts per WAL sync. Revisions are allocated in apply
//! order, so commit order is revision order. Watchers are woken through a `watch` channel and read
//! the `events` table from their cursor, so a slow watcher never blocks writers and never misses
//! an event. Lists at past revisions (continue tokens) read the `events` history, which
//! compaction trims the way etcd does: the version of every live object at the compaction
//! revision stays.

use crate::{
    Committed, Event, EventType, List, ListOptions, ObjectKey, Op, Rejection, Result, Revision, Store, StoreError, Txn,
    WatchOptions, WatchStream, selector::Selector, stage,
};
use futures::StreamExt;
use serde_json::Value;
use sqlx::{
    Row, Sqlite, SqliteConnection, SqlitePool,
    migrate::{Migration, MigrationType, Migrator},
    sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow, SqliteSynchronous},
};
use std::{
    borrow::Cow,
    collections::VecDeque,
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicI64, Ordering},
    },
    time::{Duration, Instant},
};
use tokio::sync::{Mutex, mpsc, oneshot, watch};

const WATCH_BATCH: i64 = 1000;
/// Transactions applied together in one SQLite transaction, at most.
const MAX_BATCH: usize = 1024;
/// Rows read per query while a label selector filters a page.
const LIST_BATCH: i64 = 512;
/// Bookmarks for a filtered watch are sent at most this often.
const BOOKMARK_INTERVAL: Duration = Duration::from_millis(100);

fn migrator() -> Migrator {
    let migrations = [
        (1, "objects", include_str!("../migrations/sqlite/0001_objects.sql")),
        (2, "events by key", include_str!("../migrations/sqlite/0002_events_by_key.sql")),
    ];
    Migrator {
        migrations: Cow::Owned(
            migrations
                .into_iter()
                .map(|(v, d, sql)| {
                    Migration::new(v, Cow::Borrowed(d), MigrationType::Simple, Cow::Borrowed(sql), false)
                })
                .collect(),
        ),
        ignore_missing: false,
        locking: false,
        no_tx: false,
    }
}

/// How much a commit waits for the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// fsync every commit: the store is the only copy (single replica).
    Full,
    /// fsync at checkpoints: a durable Raft log holds every committed transaction anyway.
    Replicated,
}

/// The SQLite store.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
    writer: mpsc::Sender<(Txn, oneshot::Sender<Result<Committed>>)>,
}

struct Inner {
    pool: SqlitePool,
    write: Mutex<()>,
    revision: AtomicI64,
    compacted: AtomicI64,
    committed: watch::Sender<Revision>,
}

impl SqliteStore {
    /// Opens (creating if absent) the database file. A file that exists but is not a valid
    /// gitplane store is an error, never silently recreated.
    pub async fn open(path: &Path, durability: Durability) -> Result<Self> {
        let synchronous = match durability {
            Durability::Full => SqliteSynchronous::Full,
            Durability::Replicated => SqliteSynchronous::Normal,
        };
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(synchronous)
            .busy_timeout(Duration::from_secs(10));
        Self::connect(options, 4).await
    }

    /// A private in-memory store, for tests.
    pub async fn memory() -> Result<Self> {
        // One connection: each in-memory connection would be its own database.
        Self::connect(SqliteConnectOptions::new().in_memory(true), 1).await
    }

    async fn connect(options: SqliteConnectOptions, connections: u32) -> Result<Self> {
        let pool = SqlitePoolOptions::new().max_connections(connections).connect_with(options).await?;
        let check: String = sqlx::query_scalar("PRAGMA quick_check").fetch_one(&pool).await?;
        if check != "ok" {
            return Err(StoreError::Unavailable(format!("the database failed its integrity check: {check}")));
        }
        migrator().run(&pool).await?;
        let revision = meta(&pool, "revision").await?;
        let compacted = meta(&pool, "compacted").await?;
        let (committed, _) = watch::channel(revision);
        let inner = Arc::new(Inner {
            pool,
            write: Mutex::new(()),
            revision: AtomicI64::new(revision),
            compacted: AtomicI64::new(compacted),
            committed,
        });
        let (writer, queue) = mpsc::channel(MAX_BATCH);
        tokio::spawn(write_loop(inner.clone(), queue));
        Ok(SqliteStore { inner, writer })
    }

    /// Applies transactions in order, in one SQLite transaction: each either commits under its
    /// own new revision or is refused without effect. `after` runs inside the same SQLite
    /// transaction (a Raft state machine records its applied log position there).
    pub async fn apply_batch<F>(&self, txns: &[Txn], after: F) -> Result<Vec<Result<Committed, Rejection>>>
    where
        F: for<'c> FnOnce(&'c mut SqliteConnection) -> futures::future::BoxFuture<'c, Result<(), sqlx::Error>>,
    {
        self.inner.apply_batch(txns, after).await
    }

    /// The revision of the last applied transaction.
    pub fn current_revision(&self) -> Revision {
        self.inner.revision.load(Ordering::SeqCst)
    }

    /// Follows the latest applied revision.
    pub fn committed(&self) -> watch::Receiver<Revision> {
        self.inner.committed.subscribe()
    }

    /// The connection pool, for a Raft state machine's own tables in the same database.
    pub fn pool(&self) -> &SqlitePool {
        &self.inner.pool
    }

    /// Replaces the whole contents with those of another store file (a Raft snapshot), atomically,
    /// then tells watchers: those behind the snapshot's history get `Expired` and re-list.
    pub async fn install(&self, path: &Path, tables: &[&str]) -> Result<()> {
        let _writer = self.inner.write.lock().await;
        let mut conn = self.inner.pool.acquire().await?;
        sqlx::query("ATTACH DATABASE ? AS snapshot").bind(path.to_string_lossy().as_ref()).execute(&mut *conn).await?;
        let copied = async {
            sqlx::query("BEGIN IMMEDIATE").execute(&mut *conn).await?;
            for table in ["objects", "events", "meta"].iter().chain(tables) {
                sqlx::query(&format!("DELETE FROM main.{table}")).execute(&mut *conn).await?;
                sqlx::query(&format!("INSERT INTO main.{table} SELECT * FROM snapshot.{table}"))
                    .execute(&mut *conn)
                    .await?;
            }
            sqlx::query("COMMIT").execute(&mut *conn).await
        }
        .await;
        if copied.is_err() {
            let _ = sqlx::query("ROLLBACK").execute(&mut *conn).await;
        }
        sqlx::query("DETACH DATABASE snapshot").execute(&mut *conn).await?;
        copied?;
        let revision = meta(&self.inner.pool, "revision").await?;
        self.inner.compacted.store(meta(&self.inner.pool, "compacted").await?, Ordering::SeqCst);
        self.inner.revision.store(revision, Ordering::SeqCst);
        self.inner.committed.send_replace(revision);
        Ok(())
    }
}

async fn meta(pool: &SqlitePool, key: &str) -> Result<i64> {
    Ok(sqlx::query_scalar("SELECT value FROM meta WHERE key = ?").bind(key).fetch_one(pool).await?)
}

fn parse(key: &ObjectKey, text: &str) -> Result<Value> {
    serde_json::from_str(text).map_err(|source| StoreError::Corrupt { key: key.to_string(), source })
}

async fn write_loop(inner: Arc<Inner>, mut queue: mpsc::Receiver<(Txn, oneshot::Sender<Result<Committed>>)>) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while queue.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let (txns, replies): (Vec<Txn>, Vec<_>) = batch.drain(..).unzip();
        match inner.apply_batch(&txns, |_| Box::pin(async { Ok(()) })).await {
            Ok(results) => {
                for (result, reply) in results.into_iter().zip(replies) {
                    let _ = reply.send(result.map_err(StoreError::from));
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "applying a batch of transactions failed");
                for reply in replies {
                    let _ = reply.send(Err(StoreError::Unavailable(e.to_string())));
                }
            }
        }
    }
}

async fn current(conn: &mut SqliteConnection, key: &ObjectKey) -> Result<Option<Value>> {
    let text: Option<String> =
        sqlx::query_scalar("SELECT value FROM objects WHERE kind = ? AND namespace = ? AND name = ?")
            .bind(&key.kind)
            .bind(&key.namespace)
            .bind(&key.name)
            .fetch_optional(conn)
            .await?;
    text.map(|t| parse(key, &t)).transpose()
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
    current: Option<Value>,
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
        (Op::Update(_) | Op::UpdateStatus(_) | Op::Delete { .. }, None) => {
            Err(Rejection::NotFound { key: key.clone() })
        }
        (Op::Update(value), Some(old)) => {
            check_revision(key, stage::expected_revision(value), &old)?;
            Ok((EventType::Modified, stage::update(&old, value.clone(), revision)?))
        }
        (Op::UpdateStatus(value), Some(old)) => {
            check_revision(key, stage::expected_revision(value), &old)?;
            Ok((EventType::Modified, stage::update_status(&old, value, revision)?))
        }
        (Op::Delete { revision: expected, .. }, Some(old)) => {
            check_revision(key, *expected, &old)?;
            Ok((EventType::Deleted, stage::delete(&old, revision)?))
        }
    }
}

/// Outcome of one transaction inside a batch: refused, or committed (the store changed).
enum Applied {
    Refused(Rejection),
    Committed(Committed),
}

impl Inner {
    async fn apply_batch<F>(&self, txns: &[Txn], after: F) -> Result<Vec<Result<Committed, Rejection>>>
    where
        F: for<'c> FnOnce(&'c mut SqliteConnection) -> futures::future::BoxFuture<'c, Result<(), sqlx::Error>>,
    {
        let _writer = self.write.lock().await;
        let mut revision = self.revision.load(Ordering::SeqCst);
        let mut conn = self.pool.acquire().await?;
        sqlx::query("BEGIN IMMEDIATE").execute(&mut *conn).await?;
        let result = async {
            let mut results = Vec::with_capacity(txns.len());
            for txn in txns {
                sqlx::query("SAVEPOINT txn").execute(&mut *conn).await?;
                match apply_one(&mut conn, txn, revision + 1).await? {
                    Applied::Committed(c) => {
                        sqlx::query("RELEASE txn").execute(&mut *conn).await?;
                        if !c.objects.is_empty() {
                            revision += 1;
                        }
                        results.push(Ok(c));
                    }
                    Applied::Refused(r) => {
                        sqlx::query("ROLLBACK TO txn").execute(&mut *conn).await?;
                        sqlx::query("RELEASE txn").execute(&mut *conn).await?;
                        results.push(Err(r));
                    }
                }
            }
            sqlx::query("UPDATE meta SET value = ? WHERE key = 'revision'").bind(revision).execute(&mut *conn).await?;
            after(&mut conn).await?;
            sqlx::query("COMMIT").execute(&mut *conn).await?;
            Ok::<_, StoreError>(results)
        }
        .await;
        match result {
            Ok(results) => {
                self.revision.store(revision, Ordering::SeqCst);
                self.committed.send_replace(revision);
                Ok(results)
            }
            Err(e) => {
                let _ = sqlx::query("ROLLBACK").execute(&mut *conn).await;
                Err(e)
            }
        }
    }
}

/// Applies one transaction at `revision` inside the open SQLite transaction. A refusal leaves
/// partial writes that the caller rolls back to its savepoint.
async fn apply_one(conn: &mut SqliteConnection, txn: &Txn, revision: Revision) -> Result<Applied> {
    let mut objects = Vec::with_capacity(txn.ops.len());
    let mut uids = txn.uids.iter();
    for (seq, op) in txn.ops.iter().enumerate() {
        let key = match op.key() {
            Ok(key) => key,
            Err(r) => return Ok(Applied::Refused(r)),
        };
        let existing = current(conn, &key).await?;
        let (event_type, value) = match stage_op(op, &key, existing, revision, &mut uids, &txn.time) {
            Ok(staged) => staged,
            Err(r) => return Ok(Applied::Refused(r)),
        };
        let text = value.to_string();
        if let Err(r) = stage::check_size(&key, &text) {
            return Ok(Applied::Refused(r));
        }
        if event_type == EventType::Deleted {
            sqlx::query("DELETE FROM objects WHERE kind = ? AND namespace = ? AND name = ?")
                .bind(&key.kind)
                .bind(&key.namespace)
                .bind(&key.name)
                .execute(&mut *conn)
                .await?;
        } else {
            sqlx::query(
                "INSERT OR REPLACE INTO objects (kind, namespace, name, revision, value) VALUES (?, ?, ?, ?, ?)",
            )
            .bind(&key.kind)
            .bind(&key.namespace)
            .bind(&key.name)
            .bind(revision)
            .bind(&text)
            .execute(&mut *conn)
            .await?;
        }
        sqlx::query(
            "INSERT INTO events (revision, seq, type, kind, namespace, name, value) VALUES (?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(revision)
        .bind(seq as i64)
        .bind(event_type.code())
        .bind(&key.kind)
        .bind(&key.namespace)
        .bind(&key.name)
        .bind(&text)
        .execute(&mut *conn)
        .await?;
        objects.push(value);
    }
    let revision = if objects.is_empty() { revision - 1 } else { revision };
    Ok(Applied::Committed(Committed { revision, objects }))
}

/// Where a page ends: the revision it was read at and the last key in it.
#[derive(serde::Serialize, serde::Deserialize)]
struct ContinueToken {
    revision: Revision,
    namespace: String,
    name: String,
}

fn encode_token(token: &ContinueToken) -> String {
    let json = serde_json::to_vec(token).unwrap_or_default();
    json.iter().map(|b| format!("{b:02x}")).collect()
}

fn decode_token(text: &str) -> Result<ContinueToken> {
    let bad = || StoreError::BadRequest(format!("invalid continue token {text:?}: pass back the one a list returned"));
    if !text.len().is_multiple_of(2) || text.len() > 4096 {
        return Err(bad());
    }
    let bytes: Option<Vec<u8>> =
        (0..text.len()).step_by(2).map(|i| u8::from_str_radix(&text[i..i + 2], 16).ok()).collect();
    serde_json::from_slice(&bytes.ok_or_else(bad)?).map_err(|_| bad())
}

/// Rows `(namespace, name, value)` of a kind after a key, as of `revision`, in key order.
async fn page_rows(
    conn: &mut SqliteConnection,
    kind: &str,
    namespace: Option<&str>,
    after: (&str, &str),
    revision: Revision,
    latest: bool,
    limit: i64,
) -> Result<Vec<SqliteRow>> {
    // At the latest revision the objects table is the answer; at an older one, an object changed
    // since is read from its history.
    let sql = if latest {
        "SELECT namespace, name, value FROM objects
         WHERE kind = ?1 AND (?2 IS NULL OR namespace = ?2) AND (namespace, name) > (?3, ?4)
         ORDER BY namespace, name LIMIT ?6"
    } else {
        "SELECT namespace, name, value FROM objects
         WHERE kind = ?1 AND (?2 IS NULL OR namespace = ?2) AND (namespace, name) > (?3, ?4) AND revision <= ?5
         UNION ALL
         SELECT e.namespace, e.name, e.value FROM events e
         WHERE e.kind = ?1 AND (?2 IS NULL OR e.namespace = ?2) AND (e.namespace, e.name) > (?3, ?4)
           AND e.revision <= ?5 AND e.type != 2
           AND NOT EXISTS (SELECT 1 FROM events later WHERE later.kind = e.kind AND later.namespace = e.namespace
                 AND later.name = e.name AND later.revision <= ?5 AND (later.revision, later.seq) > (e.revision, e.seq))
           AND NOT EXISTS (SELECT 1 FROM objects o WHERE o.kind = e.kind AND o.namespace = e.namespace
                 AND o.name = e.name AND o.revision <= ?5)
         ORDER BY 1, 2 LIMIT ?6"
    };
    Ok(sqlx::query(sql)
        .bind(kind)
        .bind(namespace)
        .bind(after.0)
        .bind(after.1)
        .bind(revision)
        .bind(limit)
        .fetch_all(conn)
        .await?)
}

#[async_trait::async_trait]
impl Store for SqliteStore {
    async fn get(&self, key: &ObjectKey) -> Result<Option<Value>> {
        let mut conn = self.inner.pool.acquire().await?;
        current(&mut conn, key).await
    }

    async fn list(&self, kind: &str, options: &ListOptions) -> Result<List> {
        let selector = Selector::parse(options.label_selector.as_deref().unwrap_or(""))
            .map_err(|e| StoreError::BadRequest(e.to_string()))?;
        let token = options.continue_token.as_deref().map(decode_token).transpose()?;
        let namespace = options.namespace.as_deref();
        let mut tx = self.inner.pool.begin().await?;
        let latest: i64 =
            sqlx::query_scalar("SELECT value FROM meta WHERE key = 'revision'").fetch_one(&mut *tx).await?;
        let compacted: i64 =
            sqlx::query_scalar("SELECT value FROM meta WHERE key = 'compacted'").fetch_one(&mut *tx).await?;
        let (revision, mut after) = match (&token, options.at_revision) {
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
        let want = options.limit.map_or(usize::MAX, |l| l.max(1));
        let batch = if selector.is_empty() { options.limit.map_or(-1, |l| l.max(1) as i64 + 1) } else { LIST_BATCH };
        let mut items = Vec::new();
        let mut more = false;
        loop {
            let rows =
                page_rows(&mut tx, kind, namespace, (&after.0, &after.1), revision, revision == latest, batch).await?;
            let exhausted = batch < 0 || (rows.len() as i64) < batch;
            for row in &rows {
                let key = ObjectKey::new(kind, row.get::<String, _>(0), row.get::<String, _>(1));
                let value = parse(&key, row.get(2))?;
                if !selector.matches(&value) {
                    after = (key.namespace, key.name);
                    continue;
                }
                if items.len() == want {
                    more = true;
                    break;
                }
                after = (key.namespace, key.name);
                items.push(value);
            }
            if more || exhausted {
                break;
            }
        }
        tx.commit().await?;
        let continue_token = more.then(|| encode_token(&ContinueToken { revision, namespace: after.0, name: after.1 }));
        Ok(List { revision, items, continue_token })
    }

    async fn txn(&self, ops: Vec<Op>) -> Result<Committed> {
        let (reply, answer) = oneshot::channel();
        self.writer
            .send((Txn::new(ops), reply))
            .await
            .map_err(|_| StoreError::Unavailable("the store is shutting down".into()))?;
        answer.await.map_err(|_| StoreError::Unavailable("the store is shutting down".into()))?
    }

    async fn watch(&self, from: Revision, options: WatchOptions) -> Result<WatchStream> {
        let compacted = self.inner.compacted.load(Ordering::SeqCst);
        if from < compacted {
            return Err(StoreError::Expired { requested: from, compacted });
        }
        let cursor = Cursor {
            inner: self.inner.clone(),
            committed: self.inner.committed.subscribe(),
            position: (from, i64::MAX),
            buffer: VecDeque::new(),
            more: false,
            failed: false,
            options,
            last_bookmark: None,
        };
        Ok(futures::stream::unfold(cursor, |mut cursor| async move {
            let next = cursor.next().await?;
            Some((next, cursor))
        })
        .boxed())
    }

    async fn revision(&self) -> Result<Revision> {
        Ok(self.inner.revision.load(Ordering::SeqCst))
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        let _writer = self.inner.write.lock().await;
        let revision = revision.min(self.inner.revision.load(Ordering::SeqCst));
        if revision <= self.inner.compacted.load(Ordering::SeqCst) {
            return Ok(());
        }
        let mut tx = self.inner.pool.begin().await?;
        // Superseded versions and deletions at or below the revision go; the version of every
        // object alive at it stays (what a list continued at a later revision may need).
        sqlx::query(
            "DELETE FROM events WHERE revision <= ?1 AND (type = 2 OR EXISTS (
                 SELECT 1 FROM events later WHERE later.kind = events.kind AND later.namespace = events.namespace
                 AND later.name = events.name AND later.revision <= ?1
                 AND (later.revision, later.seq) > (events.revision, events.seq)))",
        )
        .bind(revision)
        .execute(&mut *tx)
        .await?;
        sqlx::query("UPDATE meta SET value = ? WHERE key = 'compacted'").bind(revision).execute(&mut *tx).await?;
        tx.commit().await?;
        self.inner.compacted.store(revision, Ordering::SeqCst);
        Ok(())
    }
}

/// A watcher's position in the history: (revision, seq) of the last event it delivered.
struct Cursor {
    inner: Arc<Inner>,
    committed: watch::Receiver<Revision>,
    position: (Revision, i64),
    buffer: VecDeque<Event>,
    /// The last read filled a whole batch: more history may follow at the same revision.
    more: bool,
    failed: bool,
    options: WatchOptions,
    last_bookmark: Option<Instant>,
}

impl Cursor {
    /// The next event; `None` ends the stream (after an error has been delivered).
    async fn next(&mut self) -> Option<Result<Event>> {
        if self.failed {
            return None;
        }
        loop {
            if let Some(event) = self.buffer.pop_front() {
                return Some(Ok(event));
            }
            if self.more || *self.committed.borrow_and_update() > self.position.0 {
                if let Err(e) = self.fill().await {
                    self.failed = true;
                    return Some(Err(e));
                }
                continue;
            }
            if self.committed.changed().await.is_err() {
                return None; // the store is gone
            }
        }
    }

    async fn fill(&mut self) -> Result<()> {
        self.check_compacted()?;
        let (revision, seq) = self.position;
        let kinds = self.options.kinds.as_deref();
        let filter = match kinds {
            Some(kinds) => format!(" AND kind IN ({})", vec!["?"; kinds.len()].join(", ")),
            None => String::new(),
        };
        let sql = format!(
            "SELECT revision, seq, type, kind, namespace, name, value FROM events \
             WHERE (revision > ? OR (revision = ? AND seq > ?)){filter} ORDER BY revision, seq LIMIT ?"
        );
        let mut query = sqlx::query::<Sqlite>(&sql).bind(revision).bind(revision).bind(seq);
        for kind in kinds.into_iter().flatten() {
            query = query.bind(kind);
        }
        let rows = query.bind(WATCH_BATCH).fetch_all(&self.inner.pool).await?;
        self.more = rows.len() as i64 == WATCH_BATCH;
        if rows.is_empty() {
            // Nothing for us up to the latest commit (filtered out, or compacted away between our
            // check and the read).
            self.check_compacted()?;
            let latest = *self.committed.borrow();
            self.position = (latest, i64::MAX);
            let due = self.last_bookmark.is_none_or(|t| t.elapsed() >= BOOKMARK_INTERVAL);
            if self.options.bookmarks && due {
                self.last_bookmark = Some(Instant::now());
                self.buffer.push_back(Event::bookmark(latest));
            }
        }
        for row in rows {
            let key = ObjectKey::new(row.get::<String, _>(3), row.get::<String, _>(4), row.get::<String, _>(5));
            let object = parse(&key, row.get(6))?;
            self.position = (row.get(0), row.get(1));
            self.buffer.push_back(Event {
                revision: self.position.0,
                event_type: EventType::from_code(row.get(2)),
                key,
                object,
            });
        }
        Ok(())
    }

    fn check_compacted(&self) -> Result<()> {
        let compacted = self.inner.compacted.load(Ordering::SeqCst);
        if self.position.0 < compacted {
            return Err(StoreError::Expired { requested: self.position.0, compacted });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn conformance() {
        crate::conformance::run_all(|| async { SqliteStore::memory().await.unwrap() }).await;
    }

    #[tokio::test]
    async fn reopening_keeps_objects_and_revision() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db");
        let store = SqliteStore::open(&path, Durability::Full).await.unwrap();
        let pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "a"}});
        let revision = store.txn(vec![Op::Create(pod)]).await.unwrap().revision;
        drop(store);
        let store = SqliteStore::open(&path, Durability::Full).await.unwrap();
        assert_eq!(store.revision().await.unwrap(), revision);
        assert!(store.get(&ObjectKey::new("Pod", "a", "p")).await.unwrap().is_some());
    }

    #[tokio::test]
    async fn a_corrupt_file_is_reported_not_recreated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db");
        std::fs::write(&path, b"this is not a database, but it is somebody's data").unwrap();
        let err = SqliteStore::open(&path, Durability::Full).await.err().expect("a corrupt file is an error");
        assert!(err.to_string().contains("not a database"), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), b"this is not a database, but it is somebody's data");
    }

    #[tokio::test]
    async fn a_truncated_file_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db");
        let store = SqliteStore::open(&path, Durability::Full).await.unwrap();
        for i in 0..50 {
            let pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": format!("p{i}"), "namespace": "a"},
                                         "spec": {"blob": "x".repeat(4000)}});
            store.txn(vec![Op::Create(pod)]).await.unwrap();
        }
        sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)").execute(store.pool()).await.unwrap();
        drop(store);
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
        let _ = std::fs::remove_file(dir.path().join("store.db-wal"));
        let err = SqliteStore::open(&path, Durability::Full).await.err().expect("a truncated file is an error");
        assert!(err.to_string().contains("integrity") || err.to_string().contains("malformed"), "{err}");
    }
}
