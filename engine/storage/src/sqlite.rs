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
//!
//! Only the SQL lives here: how an op is staged, how a list pages under a selector and how a
//! watch follows the history is `backend`'s, shared with the Postgres store.

use crate::{
    Txn,
    backend::{
        self, EventLog, EventRead, EventRow, EventWrite, ListItem, ListRequest, ListSource, MAX_BATCH, ObjectWrite,
        TxnWriter, decode, migrator as embedded,
    },
    db,
    encryption::{AtRest, Keyring},
    migrate,
};
use gitplane_store::{
    Committed, List, ListOptions, ObjectKey, Op, Rejection, Result, Revision, Store, StoreError, WatchOptions,
    WatchStream,
};
use serde_json::Value;
use sqlx::{
    QueryBuilder, Row, Sqlite, SqliteConnection, SqlitePool,
    migrate::Migrator,
    sqlite::{SqliteAutoVacuum, SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous},
};
use std::collections::HashMap;
use std::{
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicI64, Ordering},
    },
    time::Duration,
};
use tokio::sync::{Mutex, mpsc, oneshot, watch};

fn migrator() -> Migrator {
    embedded(
        &[
            (1, "objects", include_str!("../migrations/sqlite/0001_objects.sql")),
            (2, "events by key", include_str!("../migrations/sqlite/0002_events_by_key.sql")),
            (3, "rowid tables", include_str!("../migrations/sqlite/0003_rowid_tables.sql")),
        ],
        false,
    )
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
    /// The commits of each kind a watch of one kind follows.
    kinds: backend::KindCommits,
    cache: backend::WatchCache,
    /// Seals Secrets on the way in, opens them on the way out.
    secrets: Keyring,
}

/// Events the watch cache holds.
const WATCH_CACHE: usize = 8192;
/// Pages given back to the file system per step after a compaction (16 MiB of 4 KiB pages):
/// writers wait for one step at most.
const RECLAIM_PAGES: i64 = 4096;
/// What a WAL keeps of its size once it restarts. Without a limit it keeps its largest size
/// forever; the background checkpoint restarts it every second, so it rarely needs more.
const WAL_SIZE_LIMIT: i64 = 64 << 20;
/// `PRAGMA auto_vacuum` for INCREMENTAL.
const AUTO_VACUUM_INCREMENTAL: i64 = 2;

impl SqliteStore {
    /// Opens (creating if absent) the database file, storing Secrets in clear. A file that exists
    /// but is not a valid gitplane store is an error, never silently recreated.
    pub async fn open(path: &Path, durability: Durability) -> Result<Self> {
        Self::open_encrypted(path, durability, Keyring::identity()).await
    }

    /// Opens (creating if absent) the database file; Secrets are sealed with `secrets`.
    pub async fn open_encrypted(path: &Path, durability: Durability, secrets: Keyring) -> Result<Self> {
        let synchronous = match durability {
            Durability::Full => SqliteSynchronous::Full,
            Durability::Replicated => SqliteSynchronous::Normal,
        };
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(synchronous)
            .busy_timeout(Duration::from_secs(10))
            // Checkpoints run in the background, not inside a writer's COMMIT.
            .pragma("wal_autocheckpoint", "0")
            // A multi-row statement inside the batch's transaction keeps a statement journal; past
            // 64 KiB SQLite spills it to a temporary file, a write for every page it touches.
            .pragma("temp_store", "memory")
            // The hot B-tree pages of a growing store stay in memory, not re-read through the kernel.
            .pragma("cache_size", "-65536")
            // Pages freed by compaction can be given back (`reclaim`); takes effect on a new file.
            .auto_vacuum(SqliteAutoVacuum::Incremental)
            .pragma("journal_size_limit", WAL_SIZE_LIMIT.to_string());
        let store = Self::connect(options, 4, secrets).await?;
        if auto_vacuum(&store.inner.pool).await? != AUTO_VACUUM_INCREMENTAL {
            // A file made before incremental vacuum: a one-time rewrite switches it over.
            tracing::info!(path = %path.display(), "rewriting the store once so compaction can give space back");
            let mut conn = store.inner.pool.acquire().await.map_err(db)?;
            sqlx::query("PRAGMA auto_vacuum = INCREMENTAL").execute(&mut *conn).await.map_err(db)?;
            sqlx::query("VACUUM").execute(&mut *conn).await.map_err(db)?;
        }
        tokio::spawn(checkpoint(Arc::downgrade(&store.inner)));
        Ok(store)
    }

    /// A private in-memory store, for tests.
    pub async fn memory() -> Result<Self> {
        // One connection: each in-memory connection would be its own database.
        Self::connect(SqliteConnectOptions::new().in_memory(true), 1, Keyring::identity()).await
    }

    async fn connect(options: SqliteConnectOptions, connections: u32, secrets: Keyring) -> Result<Self> {
        let pool = SqlitePoolOptions::new().max_connections(connections).connect_with(options).await.map_err(db)?;
        let check: String = sqlx::query_scalar("PRAGMA quick_check").fetch_one(&pool).await.map_err(db)?;
        if check != "ok" {
            return Err(StoreError::Unavailable(format!("the database failed its integrity check: {check}")));
        }
        migrator().run(&pool).await.map_err(migrate)?;
        let revision = meta(&pool, "revision").await?;
        let compacted = meta(&pool, "compacted").await?;
        let (committed, _) = watch::channel(revision);
        let inner = Arc::new(Inner {
            pool,
            write: Mutex::new(()),
            revision: AtomicI64::new(revision),
            compacted: AtomicI64::new(compacted),
            committed,
            kinds: backend::KindCommits::default(),
            cache: backend::WatchCache::new(WATCH_CACHE, revision),
            secrets,
        });
        let (writer, queue) = mpsc::channel(MAX_BATCH);
        tokio::spawn(write_loop(inner.clone(), queue));
        Ok(SqliteStore { inner, writer })
    }

    /// Applies transactions in order, in one SQLite transaction: each either commits under its
    /// own new revision or is refused without effect. `after` runs inside the same SQLite
    /// transaction (a Raft state machine records its applied log position there).
    pub async fn apply_batch<T, F>(&self, txns: &[T], after: F) -> Result<Vec<Result<Committed, Rejection>>>
    where
        T: std::borrow::Borrow<Txn> + Sync,
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

    /// The keys Secrets are sealed with.
    pub fn secrets(&self) -> &Keyring {
        &self.inner.secrets
    }

    /// Where the sealed objects stand against the write key.
    pub async fn at_rest(&self) -> Result<AtRest> {
        AtRest::read(&self.inner.secrets, &self.inner.pool).await
    }

    /// The connection pool, for a Raft state machine's own tables in the same database.
    pub fn pool(&self) -> &SqlitePool {
        &self.inner.pool
    }

    /// Replaces the whole contents with those of another store file (a Raft snapshot), atomically,
    /// then tells watchers: those behind the snapshot's history get `Expired` and re-list.
    pub async fn install(&self, path: &Path, tables: &[&str]) -> Result<()> {
        self.inner.replace(path, tables).await?;
        // The rows it replaced are free pages now.
        self.inner.reclaim().await
    }
}

impl Inner {
    async fn replace(&self, path: &Path, tables: &[&str]) -> Result<()> {
        let _writer = self.write.lock().await;
        let mut conn = self.pool.acquire().await.map_err(db)?;
        sqlx::query("ATTACH DATABASE ? AS snapshot")
            .bind(path.to_string_lossy().as_ref())
            .execute(&mut *conn)
            .await
            .map_err(db)?;
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
        sqlx::query("DETACH DATABASE snapshot").execute(&mut *conn).await.map_err(db)?;
        copied.map_err(db)?;
        let revision = meta(&self.pool, "revision").await?;
        self.compacted.store(meta(&self.pool, "compacted").await?, Ordering::SeqCst);
        self.cache.reset(revision);
        self.revision.store(revision, Ordering::SeqCst);
        self.committed.send_replace(revision);
        self.kinds.publish_all(revision);
        Ok(())
    }

    /// Gives free pages back to the file system: an incremental vacuum moves live pages into the
    /// holes and cuts the file's end (in WAL mode, at the next complete checkpoint). A step at a
    /// time, with the writers held off for one step only, until no page is free or a step frees
    /// none (a store without incremental auto-vacuum, such as an in-memory one).
    async fn reclaim(&self) -> Result<()> {
        let free_pages = || sqlx::query_scalar::<_, i64>("PRAGMA freelist_count").fetch_one(&self.pool);
        let mut free = free_pages().await.map_err(db)?;
        while free > 0 {
            let _writer = self.write.lock().await;
            sqlx::query(&format!("PRAGMA incremental_vacuum({RECLAIM_PAGES})"))
                .execute(&self.pool)
                .await
                .map_err(db)?;
            let left = free_pages().await.map_err(db)?;
            if left >= free {
                break;
            }
            free = left;
        }
        Ok(())
    }
}

/// Copies the WAL into the database every second while the store lives. The bulk is copied
/// alongside the writers (a PASSIVE checkpoint never waits); then the few frames committed
/// meanwhile are copied with the writers held off, so the checkpoint reaches the end of the WAL
/// and the next commit starts it again from the beginning. Without that second step, under a
/// steady write load the WAL never restarts: it grew by hundreds of MB a minute, and every
/// frame written past its end cost the kernel a fresh, zeroed page.
async fn checkpoint(inner: std::sync::Weak<Inner>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        let checkpointed = async {
            sqlx::query("PRAGMA wal_checkpoint(PASSIVE)").execute(&inner.pool).await?;
            let _writers = inner.write.lock().await;
            sqlx::query("PRAGMA wal_checkpoint(PASSIVE)").execute(&inner.pool).await
        };
        if let Err(e) = checkpointed.await {
            tracing::warn!(error = %e, "checkpointing the store's WAL failed");
        }
    }
}

/// The file's auto-vacuum mode. Read inside a read transaction: outside one, a connection
/// answers with what it last saw (or was told), not what the file says now.
async fn auto_vacuum(pool: &SqlitePool) -> Result<i64> {
    let mut tx = pool.begin().await.map_err(db)?;
    sqlx::query("SELECT 1 FROM sqlite_master LIMIT 1").fetch_optional(&mut *tx).await.map_err(db)?;
    let mode = sqlx::query_scalar("PRAGMA auto_vacuum").fetch_one(&mut *tx).await.map_err(db)?;
    tx.commit().await.map_err(db)?;
    Ok(mode)
}

async fn meta(pool: &SqlitePool, key: &str) -> Result<i64> {
    sqlx::query_scalar("SELECT value FROM meta WHERE key = ?").bind(key).fetch_one(pool).await.map_err(db)
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

async fn current(conn: &mut SqliteConnection, secrets: &Keyring, key: &ObjectKey) -> Result<Option<Value>> {
    let text: Option<String> =
        sqlx::query_scalar("SELECT value FROM objects WHERE kind = ? AND namespace = ? AND name = ?")
            .bind(&key.kind)
            .bind(&key.namespace)
            .bind(&key.name)
            .fetch_optional(conn)
            .await
            .map_err(db)?;
    text.map(|t| decode(secrets, key, &t)).transpose()
}

impl Inner {
    async fn apply_batch<T, F>(&self, txns: &[T], after: F) -> Result<Vec<Result<Committed, Rejection>>>
    where
        T: std::borrow::Borrow<Txn> + Sync,
        F: for<'c> FnOnce(&'c mut SqliteConnection) -> futures::future::BoxFuture<'c, Result<(), sqlx::Error>>,
    {
        let _writer = self.write.lock().await;
        let mut revision = self.revision.load(Ordering::SeqCst);
        let mut conn = self.pool.acquire().await.map_err(db)?;
        sqlx::query("BEGIN IMMEDIATE").execute(&mut *conn).await.map_err(db)?;
        let result = async {
            let applied = backend::apply_txns(&mut *conn, &self.secrets, txns, revision).await?;
            revision = applied.revision;
            sqlx::query("UPDATE meta SET value = ? WHERE key = 'revision'")
                .bind(revision)
                .execute(&mut *conn)
                .await
                .map_err(db)?;
            after(&mut conn).await.map_err(db)?;
            sqlx::query("COMMIT").execute(&mut *conn).await.map_err(db)?;
            Ok::<_, StoreError>(applied)
        }
        .await;
        match result {
            Ok(applied) => {
                // The cache first, then the news: a woken watcher finds the events in memory.
                let mut kinds: Vec<String> = applied.events.iter().map(|(_, e)| e.key.kind.clone()).collect();
                kinds.sort_unstable();
                kinds.dedup();
                self.cache.push(applied.events);
                self.revision.store(revision, Ordering::SeqCst);
                self.committed.send_replace(revision);
                self.kinds.publish(revision, kinds.iter().map(String::as_str));
                Ok(applied.results)
            }
            Err(e) => {
                let _ = sqlx::query("ROLLBACK").execute(&mut *conn).await;
                Err(e)
            }
        }
    }
}

/// The writes of a transaction, in SQLite's SQL (inside the open SQLite transaction).
/// Rows per multi-row statement: SQLite allows 32,766 bound parameters.
const ROWS_PER_STATEMENT: usize = 500;

impl TxnWriter for SqliteConnection {
    async fn current_many(&mut self, keys: &[ObjectKey]) -> Result<HashMap<ObjectKey, String>> {
        let mut found = HashMap::with_capacity(keys.len());
        for chunk in keys.chunks(ROWS_PER_STATEMENT) {
            let mut query = QueryBuilder::<Sqlite>::new(
                "SELECT kind, namespace, name, value FROM objects WHERE (kind, namespace, name) IN (VALUES ",
            );
            let mut row = query.separated(", ");
            for key in chunk {
                row.push("(").push_bind_unseparated(&key.kind).push_bind(&key.namespace).push_bind(&key.name);
                row.push_unseparated(")");
            }
            query.push(")");
            for r in query.build().fetch_all(&mut *self).await.map_err(db)? {
                let key = ObjectKey::new(r.get::<String, _>(0), r.get::<String, _>(1), r.get::<String, _>(2));
                found.insert(key, r.get(3));
            }
        }
        Ok(found)
    }

    async fn write(&mut self, objects: &[ObjectWrite], events: &[EventWrite]) -> Result<()> {
        let (puts, removes): (Vec<&ObjectWrite>, Vec<&ObjectWrite>) = objects.iter().partition(|o| o.value.is_some());
        for chunk in puts.chunks(ROWS_PER_STATEMENT) {
            let mut query =
                QueryBuilder::<Sqlite>::new("INSERT OR REPLACE INTO objects (kind, namespace, name, revision, value) ");
            query.push_values(chunk, |mut row, o| {
                row.push_bind(&o.key.kind)
                    .push_bind(&o.key.namespace)
                    .push_bind(&o.key.name)
                    .push_bind(o.revision)
                    .push_bind(o.value.as_deref());
            });
            query.build().execute(&mut *self).await.map_err(db)?;
        }
        for chunk in removes.chunks(ROWS_PER_STATEMENT) {
            let mut query =
                QueryBuilder::<Sqlite>::new("DELETE FROM objects WHERE (kind, namespace, name) IN (VALUES ");
            let mut row = query.separated(", ");
            for o in chunk {
                row.push("(").push_bind_unseparated(&o.key.kind).push_bind(&o.key.namespace).push_bind(&o.key.name);
                row.push_unseparated(")");
            }
            query.push(")");
            query.build().execute(&mut *self).await.map_err(db)?;
        }
        for chunk in events.chunks(ROWS_PER_STATEMENT / 2) {
            let mut query =
                QueryBuilder::<Sqlite>::new("INSERT INTO events (revision, seq, type, kind, namespace, name, value) ");
            query.push_values(chunk, |mut row, e| {
                row.push_bind(e.revision)
                    .push_bind(e.seq)
                    .push_bind(backend::event_code(e.event_type))
                    .push_bind(&e.key.kind)
                    .push_bind(&e.key.namespace)
                    .push_bind(&e.key.name)
                    .push_bind(&e.value);
            });
            query.build().execute(&mut *self).await.map_err(db)?;
        }
        Ok(())
    }
}

/// A list's reads, in SQLite's SQL (inside one read transaction).
impl ListSource for SqliteConnection {
    async fn bounds(&mut self) -> Result<(Revision, Revision)> {
        let latest: i64 = sqlx::query_scalar("SELECT value FROM meta WHERE key = 'revision'")
            .fetch_one(&mut *self)
            .await
            .map_err(db)?;
        let compacted: i64 =
            sqlx::query_scalar("SELECT value FROM meta WHERE key = 'compacted'").fetch_one(self).await.map_err(db)?;
        Ok((latest, compacted))
    }

    async fn rows(
        &mut self,
        kind: &str,
        namespace: Option<&str>,
        after: (&str, &str),
        revision: Revision,
        latest: bool,
        limit: i64,
    ) -> Result<Vec<(String, String, String)>> {
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
        sqlx::query_as(sql)
            .bind(kind)
            .bind(namespace)
            .bind(after.0)
            .bind(after.1)
            .bind(revision)
            .bind(limit)
            .fetch_all(self)
            .await
            .map_err(db)
    }
}

impl SqliteStore {
    async fn read_list<T: ListItem>(&self, kind: &str, options: &ListOptions) -> Result<List<T>> {
        let request = ListRequest::parse(options)?;
        let mut tx = self.inner.pool.begin().await.map_err(db)?;
        let list = request.read(&mut *tx, &self.inner.secrets, kind).await?;
        tx.commit().await.map_err(db)?;
        Ok(list)
    }
}

#[async_trait::async_trait]
impl Store for SqliteStore {
    async fn get(&self, key: &ObjectKey) -> Result<Option<Value>> {
        let mut conn = self.inner.pool.acquire().await.map_err(db)?;
        current(&mut conn, &self.inner.secrets, key).await
    }

    async fn list(&self, kind: &str, options: &ListOptions) -> Result<List> {
        self.read_list(kind, options).await
    }

    async fn list_json(&self, kind: &str, options: &ListOptions) -> Result<List<String>> {
        self.read_list(kind, options).await
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
        let kind = match options.kinds.as_deref() {
            Some(kinds) if !kinds.is_empty() => Some(self.inner.kinds.subscribe(kinds, &self.inner.committed)),
            _ => None,
        };
        Ok(backend::watch_stream(self.inner.clone(), self.inner.committed.subscribe(), kind, from, options))
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
        let mut tx = self.inner.pool.begin().await.map_err(db)?;
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
        .await
        .map_err(db)?;
        sqlx::query("UPDATE meta SET value = ? WHERE key = 'compacted'")
            .bind(revision)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        tx.commit().await.map_err(db)?;
        self.inner.compacted.store(revision, Ordering::SeqCst);
        drop(_writer);
        self.inner.reclaim().await
    }
}

/// The history in SQLite's SQL. SQLite has no snapshot spanning the compaction check and the
/// read, so compaction is checked before and, when nothing came back, after.
impl EventLog for Inner {
    async fn read(&self, after: (Revision, i64), kinds: Option<&[String]>, limit: i64) -> Result<EventRead> {
        self.check_compacted(after.0)?;
        // Known committed before the query starts, so the query sees every event up to it.
        let latest = *self.committed.borrow();
        if let Some(read) = self.cache.read(after, kinds, limit, latest) {
            return Ok(read);
        }
        let (revision, seq) = after;
        let filter = match kinds {
            // `+kind`: keep SQLite on the (revision, seq) key, not the by-object index.
            Some(kinds) => format!(" AND +kind IN ({})", vec!["?"; kinds.len()].join(", ")),
            None => String::new(),
        };
        let sql = format!(
            "SELECT revision, seq, type, kind, namespace, name, value FROM events \
             WHERE revision >= ? AND (revision > ? OR seq > ?){filter} ORDER BY revision, seq LIMIT ?"
        );
        let mut query = sqlx::query_as::<Sqlite, EventRow>(&sql).bind(revision).bind(revision).bind(seq);
        for kind in kinds.into_iter().flatten() {
            query = query.bind(kind);
        }
        let rows = query.bind(limit).fetch_all(&self.pool).await.map_err(db)?;
        if rows.is_empty() {
            // Compacted away between the check and the read?
            self.check_compacted(after.0)?;
        }
        EventRead::from_rows(rows, &self.secrets, latest)
    }
}

impl Inner {
    fn check_compacted(&self, position: Revision) -> Result<()> {
        let compacted = self.compacted.load(Ordering::SeqCst);
        if position < compacted {
            return Err(StoreError::Expired { requested: position, compacted });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn conformance() {
        gitplane_store::conformance::run_all(|| async { ((), SqliteStore::memory().await.unwrap()) }).await;
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

    /// Polls `probe` until it holds (wait, never sleep), for at most 30 s.
    async fn eventually(what: &str, mut probe: impl FnMut() -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !probe() {
            assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn size(path: &Path) -> u64 {
        std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
    }

    #[tokio::test]
    async fn compaction_gives_the_space_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db");
        let store = SqliteStore::open(&path, Durability::Full).await.unwrap();
        // A status write loop: many large revisions of one object.
        let pod = |i: usize| {
            serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "a"},
                               "spec": {"message": format!("{i}{}", "x".repeat(400_000))}})
        };
        store.txn(vec![Op::Create(pod(0))]).await.unwrap();
        let mut latest = 0;
        for i in 1..100 {
            latest = store.txn(vec![Op::Update(pod(i))]).await.unwrap().revision;
        }
        // The background checkpoint moves the history from the WAL into the file.
        eventually("the history in the database file", || size(&path) > 30_000_000).await;
        let grown = size(&path);
        store.compact(latest).await.unwrap();
        eventually("the file to shrink after compaction", || size(&path) < grown / 4).await;
        assert!(store.get(&ObjectKey::new("Pod", "a", "p")).await.unwrap().is_some());
    }

    #[tokio::test]
    async fn a_store_made_before_incremental_vacuum_is_switched_over_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db");
        let options = SqliteConnectOptions::new().filename(&path).create_if_missing(true);
        let old = SqlitePool::connect_with(options).await.unwrap();
        migrator().run(&old).await.unwrap();
        let mode: i64 = sqlx::query_scalar("PRAGMA auto_vacuum").fetch_one(&old).await.unwrap();
        assert_eq!(mode, 0, "made without auto-vacuum");
        old.close().await;
        let store = SqliteStore::open(&path, Durability::Full).await.unwrap();
        assert_eq!(auto_vacuum(store.pool()).await.unwrap(), AUTO_VACUUM_INCREMENTAL);
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
