//! The shared backend: PostgreSQL through sqlx, for several gitplane replicas on one database.
//!
//! The tables and the rules are the SQLite backend's (the logic is shared in `backend`); what
//! differs is that other processes write too.
//!
//! # Revisions
//!
//! The global revision lives in the `meta` row `revision`. Every write transaction first takes
//! that row `FOR UPDATE`, allocates the next revisions from it, and writes it back just before
//! `COMMIT`. The row lock is held until commit, so writers in every process are serialized on it
//! and **commit order is revision order**: a transaction can only read the revision after the
//! previous holder's commit is visible. That is what lets a watcher read `events` after its
//! cursor without ever missing a revision that commits late. Writes run at READ COMMITTED, so
//! once the lock is granted every later statement sees the previous writer's objects.
//!
//! Within one process, a writer task batches queued transactions into one Postgres transaction
//! with a `SAVEPOINT` each (group commit): a refused transaction rolls back to its savepoint and
//! the others commit, one WAL flush for all of them.
//!
//! # Watching commits of other replicas
//!
//! Each writing transaction runs `pg_notify('gitplane_store', '<revision> <writer> <kinds>')`;
//! Postgres delivers it at commit, so a notification always names a visible revision. Every store
//! keeps one connection `LISTEN`ing and advances its `committed` revision with each notification
//! of another writer, waking the watches of the kinds it names (as SQLite's store wakes a watch
//! for its kinds' commits only); its own it skips, since its writer task has already filled the
//! watch cache and told its watchers (the notification can arrive first: the watchers it woke
//! would find the cache behind and query the table). A
//! notification can be lost (the listening connection drops and reconnects), so a poll of
//! `meta.revision` every second backs it up, and the listener polls once after each
//! (re)subscription. Watchers never trust the notification for content: like SQLite's, they
//! read `events` after their cursor, here in one REPEATABLE READ snapshot that also reads the
//! compaction mark and the latest revision, so a concurrent compaction yields `Expired`, never a
//! silent gap.
//!
//! Like SQLite's, the store keeps the events of its own latest commits in a watch cache, and a
//! watcher whose cursor is inside it, with nothing committed beyond it, reads memory instead of
//! the table: with one node's Pod watch per node, every commit would otherwise wake hundreds of
//! watchers into a query each. The cache holds contiguous revisions only: a batch that starts
//! past its end (another replica wrote in between) empties it first, and a watcher that has seen
//! a newer revision than the cache's end reads the table.
//!
//! # Leader election and fencing
//!
//! [`LeaderLease`] keeps a single `leader` row (holder, token, expiry by the database's `now()`).
//! A campaigner takes the row when it is free or expired and increments `token`; the holder
//! renews it. A store made with [`PostgresStore::fenced`] starts every write transaction (and
//! compaction) with `SELECT holder, token FROM leader FOR UPDATE` and refuses the whole batch with
//! [`StoreError::Fenced`] unless both match its fence. Because that row lock is held until the
//! write commits, a takeover (an `UPDATE` of the same row) waits for in-flight fenced writes and
//! every write after it sees the new token: a deposed leader can never write, however late its
//! request arrives and whatever its clock says. Expiry only decides when a takeover is allowed;
//! safety does not depend on time. Stores without a fence (one writer) skip the check.

mod lease;
mod replica;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
#[cfg(test)]
mod tests;

pub use lease::{Fence, LeaderLease, LeaseState};
pub use replica::PostgresReplica;

use crate::{
    Txn,
    backend::{
        self, EventLog, EventRead, EventRow, EventWrite, ListItem, ListRequest, ListSource, MAX_BATCH, ObjectWrite,
        TxnWriter, decode,
    },
    db,
    encryption::{AtRest, Keyring},
    migrate,
};
use gitplane_store::{
    Committed, Event, List, ListOptions, ObjectKey, Op, Rejection, Result, Revision, Store, StoreError, WatchOptions,
    WatchStream,
};
use serde_json::Value;
use sqlx::{
    Connection, PgConnection, PgPool, Row,
    migrate::Migrator,
    postgres::{PgConnectOptions, PgListener, PgPoolOptions},
};
use std::collections::HashMap;
use std::sync::{
    Arc,
    atomic::{AtomicI64, Ordering},
};
use std::time::Duration;
use tokio::{
    sync::{mpsc, oneshot, watch},
    task::JoinHandle,
};

/// The channel every write transaction notifies with its revision.
const CHANNEL: &str = "gitplane_store";
/// How often a store looks for commits whose notification it missed.
const POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Connections per store: the writer, the listener, and reads.
const POOL_SIZE: u32 = 10;
/// The longest list of kinds a notification names (Postgres refuses payloads of 8,000 bytes).
const MAX_NOTICED_KINDS: usize = 4000;
/// Events the watch cache holds (SQLite's size).
const WATCH_CACHE: usize = 8192;
/// How long a session may sit idle inside a transaction (unless the URL sets it).
const IDLE_IN_TRANSACTION: (&str, &str) = ("idle_in_transaction_session_timeout", "60s");
/// Reads that span several statements see one snapshot.
const SNAPSHOT: &str = "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY";
/// Writes: whatever the database's default, each statement after the revision lock is granted
/// must see the previous writer's commit (at REPEATABLE READ it would fail to serialize).
const WRITE: &str = "BEGIN ISOLATION LEVEL READ COMMITTED";

fn migrator() -> Migrator {
    backend::migrator(
        &[
            (1, "objects", include_str!("../../migrations/postgres/0001_objects.sql")),
            (2, "leader lease", include_str!("../../migrations/postgres/0002_leader.sql")),
        ],
        // Replicas that start together take turns (an advisory lock) instead of racing.
        true,
    )
}

/// The Postgres store. Clones share the connection pool and the writer task.
#[derive(Clone)]
pub struct PostgresStore {
    inner: Arc<Inner>,
    writer: mpsc::Sender<Request>,
    fence: Option<Arc<Fence>>,
}

struct Request {
    txn: Txn,
    fence: Option<Arc<Fence>>,
    reply: oneshot::Sender<Result<Committed>>,
}

struct Inner {
    pool: PgPool,
    /// What this process knows to be committed; watchers wake on it.
    commits: Commits,
    /// The notification listener and the poll; they only feed `commits`.
    followers: [JoinHandle<()>; 2],
    /// Seals Secrets on the way in, opens them on the way out. Every replica on the database
    /// must hold the same keys.
    secrets: Keyring,
    /// This process's latest commits' events.
    cache: backend::WatchCache,
    /// The revision up to which the cache holds every event (its end); held while the cache is
    /// filled, so the end only moves forward and never past what the cache holds.
    cached: std::sync::Mutex<Revision>,
    /// The highest compaction mark this process has seen.
    compacted: AtomicI64,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for task in &self.followers {
            task.abort();
        }
    }
}

impl PostgresStore {
    /// Connects to `url` (`postgres://user:password@host:port/database`, or
    /// `postgres:///database?host=/run/postgresql` for a unix socket) and migrates the schema.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::connect_encrypted(url, Keyring::identity()).await
    }

    /// Connects to `url` as [`PostgresStore::connect`] does; Secrets are sealed with `secrets`.
    pub async fn connect_encrypted(url: &str, secrets: Keyring) -> Result<Self> {
        let options: PgConnectOptions = url.parse().map_err(|e| {
            // The URL may hold a password: name the problem, not the URL.
            StoreError::BadRequest(format!(
                "invalid Postgres URL: {e} (expected postgres://user:password@host:port/database, \
                 or postgres:///database?host=/run/postgresql for a unix socket)"
            ))
        })?;
        Self::open(options, POLL_INTERVAL, secrets).await
    }

    /// Connects with explicit options and migrates the schema.
    pub async fn connect_with(options: PgConnectOptions) -> Result<Self> {
        Self::open(options, POLL_INTERVAL, Keyring::identity()).await
    }

    pub(crate) async fn open(mut options: PgConnectOptions, poll_interval: Duration, secrets: Keyring) -> Result<Self> {
        if options.get_application_name().is_none() {
            options = options.application_name("gitplane");
        }
        // A replica that stalls inside a write transaction (a paused VM, a lost network) holds the
        // revision row lock and, fenced, the lease row: every other replica would stall behind it.
        // Postgres ends such a session, which aborts its writes and releases the locks.
        if !options.get_options().is_some_and(|o| o.contains(IDLE_IN_TRANSACTION.0)) {
            options = options.options([IDLE_IN_TRANSACTION]);
        }
        let target = describe(&options);
        // One connection first: a pool retries a refused connection until its acquire timeout
        // and then reports only that it timed out.
        let mut probe = PgConnection::connect_with(&options).await.map_err(|source| StoreError::Connect {
            target: format!("the Postgres store at {target}"),
            source: Box::new(source),
            advice: "check the URL, that the server runs and accepts this user, and that the database exists",
        })?;
        let encoding: String = sqlx::query_scalar("SHOW server_encoding").fetch_one(&mut probe).await.map_err(db)?;
        if encoding != "UTF8" {
            return Err(StoreError::Unavailable(format!(
                "the Postgres database at {target} has encoding {encoding}; gitplane stores UTF-8 JSON: \
                 create it with ENCODING 'UTF8'"
            )));
        }
        let _ = probe.close().await;
        let pool = PgPoolOptions::new().max_connections(POOL_SIZE).connect_lazy_with(options);
        migrator().run(&pool).await.map_err(migrate)?;
        let revision = meta(&pool, "revision").await?;
        let compacted = AtomicI64::new(meta(&pool, "compacted").await?);
        let commits = Commits {
            latest: watch::channel(revision).0,
            kinds: Arc::default(),
            writer: uuid::Uuid::new_v4().simple().to_string(),
        };
        let followers = [
            tokio::spawn(listen(pool.clone(), commits.clone())),
            tokio::spawn(poll(pool.clone(), commits.clone(), poll_interval)),
        ];
        let cache = backend::WatchCache::new(WATCH_CACHE, revision);
        let cached = std::sync::Mutex::new(revision);
        let inner = Arc::new(Inner { pool, commits, followers, secrets, cache, cached, compacted });
        let (writer, queue) = mpsc::channel(MAX_BATCH);
        tokio::spawn(write_loop(inner.clone(), queue));
        Ok(PostgresStore { inner, writer, fence: None })
    }

    /// This store with every write fenced: transactions (and compactions) through the returned
    /// handle commit only while `fence` still names the leader lease's holder and token, checked
    /// inside the writing transaction. Other handles of the same store keep their own fence.
    pub fn fenced(&self, fence: Fence) -> PostgresStore {
        PostgresStore { fence: Some(Arc::new(fence)), ..self.clone() }
    }

    /// The fence of this handle's writes, if any.
    pub fn fence(&self) -> Option<&Fence> {
        self.fence.as_deref()
    }

    /// Applies transactions in order, in one Postgres transaction (fenced as this handle is):
    /// each either commits under its own new revision or is refused without effect.
    pub async fn apply_batch(&self, txns: &[Txn]) -> Result<Vec<Result<Committed, Rejection>>> {
        self.inner.apply_batch(txns, self.fence.as_deref()).await
    }

    /// Follows the latest revision this process knows to be committed, by any replica.
    pub fn committed(&self) -> watch::Receiver<Revision> {
        self.inner.commits.latest.subscribe()
    }

    /// The keys Secrets are sealed with.
    pub fn secrets(&self) -> &Keyring {
        &self.inner.secrets
    }

    /// Where the sealed objects stand against the write key.
    pub async fn at_rest(&self) -> Result<AtRest> {
        AtRest::read(&self.inner.secrets, &self.inner.pool).await
    }

    /// The connection pool (for a [`LeaderLease`] on the same database).
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }
}

/// Where a connection goes, for errors: never the password.
fn describe(options: &PgConnectOptions) -> String {
    let place = match options.get_socket() {
        Some(dir) => format!("unix socket directory {}", dir.display()),
        None if options.get_host().starts_with('/') => format!("unix socket directory {}", options.get_host()),
        None => format!("{}:{}", options.get_host(), options.get_port()),
    };
    let user = options.get_username();
    format!("{place} (database {:?}, user {user:?})", options.get_database().unwrap_or(user))
}

async fn meta<'c, E: sqlx::PgExecutor<'c>>(executor: E, key: &str) -> Result<i64> {
    sqlx::query_scalar("SELECT value FROM meta WHERE key = $1").bind(key).fetch_one(executor).await.map_err(db)
}

/// What this process knows to be committed, by any replica.
#[derive(Clone)]
struct Commits {
    /// The latest revision (own commits, notifications, polls, reads of the table).
    latest: watch::Sender<Revision>,
    /// The commits of each set of watched kinds.
    kinds: Arc<backend::KindCommits>,
    /// Names this store's commits in their notifications.
    writer: String,
}

impl Commits {
    /// Moves `latest` forward (never back: notifications and polls arrive in any order) to a
    /// commit that touched `kinds` (`None`: unknown, any kind).
    fn advance(&self, revision: Revision, kinds: Option<&[&str]>) {
        let moved = self.latest.send_if_modified(|current| {
            let newer = revision > *current;
            if newer {
                *current = revision;
            }
            newer
        });
        match kinds {
            Some(kinds) => self.kinds.publish(revision, kinds.iter().copied()),
            None if moved => self.kinds.publish_all(revision),
            None => {}
        }
    }

    /// A revision read from the database: its kinds are unknown.
    fn learn(&self, revision: Revision) {
        self.advance(revision, None);
    }

    /// The payload of a commit's notification: its revision, this writer, the kinds it touched
    /// (left out past a size well inside Postgres' 8,000 bytes: then every watch wakes).
    fn notice(&self, revision: Revision, kinds: &[&str]) -> String {
        let kinds = kinds.join(",");
        let kinds = if kinds.len() <= MAX_NOTICED_KINDS { kinds.as_str() } else { "" };
        format!("{revision} {} {kinds}", self.writer)
    }
}

/// A commit's notification, as [`Commits::notice`] writes it; an older replica's payload is the
/// revision alone.
#[derive(Debug, PartialEq, Eq)]
struct Notice<'a> {
    revision: Revision,
    writer: Option<&'a str>,
    /// `None` when the payload does not name them.
    kinds: Option<Vec<&'a str>>,
}

fn parse_notice(payload: &str) -> Option<Notice<'_>> {
    let mut fields = payload.split(' ');
    let revision = fields.next()?.parse().ok()?;
    let writer = fields.next();
    let kinds = fields.next().filter(|k| !k.is_empty()).map(|k| k.split(',').collect());
    Some(Notice { revision, writer, kinds })
}

/// Postgres text cannot hold NUL; no stored key contains one.
fn has_nul(text: &str) -> bool {
    text.contains('\0')
}

fn refuse_nul(what: &str, text: &str) -> Result<()> {
    if has_nul(text) {
        return Err(StoreError::BadRequest(format!("{what} {text:?} contains a NUL character")));
    }
    Ok(())
}

async fn write_loop(inner: Arc<Inner>, mut queue: mpsc::Receiver<Request>) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while queue.recv_many(&mut batch, MAX_BATCH).await > 0 {
        // One Postgres transaction checks one fence: split the queue into runs that share one
        // (in practice every request of a process carries the same fence).
        let mut requests = batch.drain(..).peekable();
        while let Some(first) = requests.next() {
            let fence = first.fence.clone();
            let mut run = vec![first];
            while let Some(next) = requests.next_if(|r| r.fence == fence) {
                run.push(next);
            }
            let (txns, replies): (Vec<Txn>, Vec<_>) = run.into_iter().map(|r| (r.txn, r.reply)).unzip();
            match inner.apply_batch(&txns, fence.as_deref()).await {
                Ok(results) => {
                    for (result, reply) in results.into_iter().zip(replies) {
                        let _ = reply.send(result.map_err(StoreError::from));
                    }
                }
                Err(e) => {
                    if matches!(e, StoreError::Fenced { .. }) {
                        tracing::warn!(error = %e, "refused the writes of a deposed leader");
                    } else {
                        tracing::error!(error = %e, "applying a batch of transactions failed");
                    }
                    for reply in replies {
                        let _ = reply.send(Err(for_each_waiter(&e)));
                    }
                }
            }
        }
    }
}

/// A batch's error, for each transaction in it.
fn for_each_waiter(e: &StoreError) -> StoreError {
    match e {
        StoreError::Fenced { holder, token, current_holder, current_token } => StoreError::Fenced {
            holder: holder.clone(),
            token: *token,
            current_holder: current_holder.clone(),
            current_token: *current_token,
        },
        e => StoreError::Unavailable(e.to_string()),
    }
}

impl Inner {
    async fn apply_batch(&self, txns: &[Txn], fence: Option<&Fence>) -> Result<Vec<Result<Committed, Rejection>>> {
        let mut tx = self.pool.begin_with(WRITE).await.map_err(db)?;
        // The lease row before the revision row: every transaction that takes both takes them in
        // this order, so fenced writers, compactions and campaigners cannot deadlock.
        if let Some(fence) = fence {
            lease::check(&mut tx, fence).await?;
        }
        let start: Revision = sqlx::query_scalar("SELECT value FROM meta WHERE key = 'revision' FOR UPDATE")
            .fetch_one(&mut *tx)
            .await
            .map_err(db)?;
        let backend::Applied { results, revision, events } =
            backend::apply_txns(&mut *tx, &self.secrets, txns, start).await?;
        let kinds: Vec<String> = touched(&events).into_iter().map(str::to_owned).collect();
        let kinds: Vec<&str> = kinds.iter().map(String::as_str).collect();
        if revision != start {
            sqlx::query("UPDATE meta SET value = $1 WHERE key = 'revision'")
                .bind(revision)
                .execute(&mut *tx)
                .await
                .map_err(db)?;
            // Delivered at commit, to every listening replica.
            sqlx::query("SELECT pg_notify($1, $2)")
                .bind(CHANNEL)
                .bind(self.commits.notice(revision, &kinds))
                .execute(&mut *tx)
                .await
                .map_err(db)?;
        }
        tx.commit().await.map_err(db)?;
        // The cache first, then the news: a woken watcher finds the events in memory.
        self.fill_cache(start, revision, events);
        if revision != start {
            self.commits.advance(revision, Some(&kinds));
        }
        Ok(results)
    }

    /// Adds a batch's events, committed on top of `start`, to the watch cache. After a commit of
    /// another replica (`start` past the cache's end) the cache starts over at `start`; a batch
    /// older than the cache's end (`apply_batch` racing the writer task) is left to the table.
    fn fill_cache(&self, start: Revision, revision: Revision, events: Vec<(i64, Event)>) {
        let mut end = self.cached.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match cache_step(*end, start, revision) {
            CacheStep::Skip => return,
            CacheStep::Append => {}
            CacheStep::Restart => self.cache.reset(start),
        }
        self.cache.push(events);
        *end = revision;
    }

    /// The events after `after` from the watch cache, when it holds them and everything this
    /// process knows to be committed.
    fn read_cache(&self, after: (Revision, i64), kinds: Option<&[String]>, limit: i64) -> Option<EventRead> {
        // `latest` before the cache's end: a commit of another replica seen after this point is
        // past `latest`, and a reset after it starts the cache past `latest` too, where `after`
        // cannot be.
        let latest = *self.commits.latest.borrow();
        if *self.cached.lock().unwrap_or_else(std::sync::PoisonError::into_inner) < latest {
            return None;
        }
        self.cache.read(after, kinds, limit, latest)
    }

    fn check_compacted(&self, position: Revision) -> Result<()> {
        let compacted = self.compacted.load(Ordering::SeqCst);
        if position < compacted {
            return Err(StoreError::Expired { requested: position, compacted });
        }
        Ok(())
    }
}

/// What a batch committed on top of `start` up to `revision` does to a watch cache that ends at
/// `end`.
#[derive(Debug, PartialEq, Eq)]
enum CacheStep {
    /// Nothing to add (no commit), or older than what the cache holds.
    Skip,
    /// It follows the cache's end.
    Append,
    /// Another replica committed in between: the cache starts over at `start`.
    Restart,
}

/// The kinds a batch's events touched, each once.
fn touched(events: &[(i64, Event)]) -> Vec<&str> {
    let mut kinds: Vec<&str> = events.iter().map(|(_, e)| e.key.kind.as_str()).collect();
    kinds.sort_unstable();
    kinds.dedup();
    kinds
}

fn cache_step(end: Revision, start: Revision, revision: Revision) -> CacheStep {
    if revision == start || start < end {
        CacheStep::Skip
    } else if start == end {
        CacheStep::Append
    } else {
        CacheStep::Restart
    }
}

async fn current(conn: &mut PgConnection, secrets: &Keyring, key: &ObjectKey) -> Result<Option<Value>> {
    let text: Option<String> =
        sqlx::query_scalar("SELECT value FROM objects WHERE kind = $1 AND namespace = $2 AND name = $3")
            .bind(&key.kind)
            .bind(&key.namespace)
            .bind(&key.name)
            .fetch_optional(conn)
            .await
            .map_err(db)?;
    text.map(|t| decode(secrets, key, &t)).transpose()
}

/// The writes of a transaction, in Postgres' SQL (inside the open Postgres transaction).
impl TxnWriter for PgConnection {
    async fn current_many(&mut self, keys: &[ObjectKey]) -> Result<HashMap<ObjectKey, String>> {
        let (kinds, namespaces, names) = columns(keys.iter());
        let rows = sqlx::query(
            "SELECT o.kind, o.namespace, o.name, o.value FROM objects o
             JOIN UNNEST($1::text[], $2::text[], $3::text[]) AS k(kind, namespace, name)
               ON o.kind = k.kind AND o.namespace = k.namespace AND o.name = k.name",
        )
        .bind(kinds)
        .bind(namespaces)
        .bind(names)
        .fetch_all(&mut *self)
        .await
        .map_err(db)?;
        let mut found = HashMap::with_capacity(rows.len());
        for r in rows {
            let key = ObjectKey::new(r.get::<String, _>(0), r.get::<String, _>(1), r.get::<String, _>(2));
            found.insert(key, r.get(3));
        }
        Ok(found)
    }

    async fn write(&mut self, objects: &[ObjectWrite], events: &[EventWrite]) -> Result<()> {
        let (puts, removes): (Vec<&ObjectWrite>, Vec<&ObjectWrite>) = objects.iter().partition(|o| o.value.is_some());
        if !puts.is_empty() {
            let (kinds, namespaces, names) = columns(puts.iter().map(|o| &o.key));
            let revisions: Vec<i64> = puts.iter().map(|o| o.revision).collect();
            let values: Vec<&str> = puts.iter().map(|o| o.value.as_deref().unwrap_or("")).collect();
            sqlx::query(
                "INSERT INTO objects (kind, namespace, name, revision, value)
                 SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[])
                 ON CONFLICT (kind, namespace, name) DO UPDATE SET revision = EXCLUDED.revision, value = EXCLUDED.value",
            )
            .bind(kinds)
            .bind(namespaces)
            .bind(names)
            .bind(revisions)
            .bind(values)
            .execute(&mut *self)
            .await.map_err(db)?;
        }
        if !removes.is_empty() {
            let (kinds, namespaces, names) = columns(removes.iter().map(|o| &o.key));
            sqlx::query(
                "DELETE FROM objects o USING UNNEST($1::text[], $2::text[], $3::text[]) AS k(kind, namespace, name)
                 WHERE o.kind = k.kind AND o.namespace = k.namespace AND o.name = k.name",
            )
            .bind(kinds)
            .bind(namespaces)
            .bind(names)
            .execute(&mut *self)
            .await
            .map_err(db)?;
        }
        let (kinds, namespaces, names) = columns(events.iter().map(|e| &e.key));
        sqlx::query(
            "INSERT INTO events (revision, seq, type, kind, namespace, name, value)
             SELECT * FROM UNNEST($1::bigint[], $2::bigint[], $3::bigint[], $4::text[], $5::text[], $6::text[], $7::text[])",
        )
        .bind(events.iter().map(|e| e.revision).collect::<Vec<i64>>())
        .bind(events.iter().map(|e| e.seq).collect::<Vec<i64>>())
        .bind(events.iter().map(|e| backend::event_code(e.event_type)).collect::<Vec<i64>>())
        .bind(kinds)
        .bind(namespaces)
        .bind(names)
        .bind(events.iter().map(|e| e.value.as_str()).collect::<Vec<&str>>())
        .execute(&mut *self)
        .await.map_err(db)?;
        Ok(())
    }

    /// A NUL would fail the statement, and with it every transaction of the batch: refuse just
    /// this one. (Kubernetes names never contain one.)
    fn admit(&self, key: &ObjectKey) -> Result<(), Rejection> {
        if has_nul(&key.kind) || has_nul(&key.namespace) || has_nul(&key.name) {
            return Err(Rejection::Invalid(format!("{key:?} contains a NUL character, which Postgres cannot store")));
        }
        Ok(())
    }
}

/// The key columns of some objects, as arrays for `UNNEST`.
fn columns<'a>(keys: impl Iterator<Item = &'a ObjectKey>) -> (Vec<&'a str>, Vec<&'a str>, Vec<&'a str>) {
    let mut columns = (Vec::new(), Vec::new(), Vec::new());
    for key in keys {
        columns.0.push(key.kind.as_str());
        columns.1.push(key.namespace.as_str());
        columns.2.push(key.name.as_str());
    }
    columns
}

/// A list's reads, in Postgres' SQL (inside one REPEATABLE READ snapshot).
impl ListSource for PgConnection {
    async fn bounds(&mut self) -> Result<(Revision, Revision)> {
        Ok((meta(&mut *self, "revision").await?, meta(&mut *self, "compacted").await?))
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
        // LIMIT NULL is no limit.
        let limit = (limit >= 0).then_some(limit);
        // At the latest revision the objects table is the answer; at an older one, an object
        // changed since is read from its history.
        let query = if latest {
            sqlx::query_as(
                "SELECT namespace, name, value FROM objects
                 WHERE kind = $1 AND ($2::text IS NULL OR namespace = $2) AND (namespace, name) > ($3, $4)
                 ORDER BY namespace, name LIMIT $5",
            )
            .bind(kind)
            .bind(namespace)
            .bind(after.0)
            .bind(after.1)
            .bind(limit)
        } else {
            sqlx::query_as(
                "SELECT namespace, name, value FROM objects
                 WHERE kind = $1 AND ($2::text IS NULL OR namespace = $2) AND (namespace, name) > ($3, $4)
                   AND revision <= $5
                 UNION ALL
                 SELECT e.namespace, e.name, e.value FROM events e
                 WHERE e.kind = $1 AND ($2::text IS NULL OR e.namespace = $2) AND (e.namespace, e.name) > ($3, $4)
                   AND e.revision <= $5 AND e.type != 2
                   AND NOT EXISTS (SELECT 1 FROM events later WHERE later.kind = e.kind
                         AND later.namespace = e.namespace AND later.name = e.name AND later.revision <= $5
                         AND (later.revision, later.seq) > (e.revision, e.seq))
                   AND NOT EXISTS (SELECT 1 FROM objects o WHERE o.kind = e.kind AND o.namespace = e.namespace
                         AND o.name = e.name AND o.revision <= $5)
                 ORDER BY 1, 2 LIMIT $6",
            )
            .bind(kind)
            .bind(namespace)
            .bind(after.0)
            .bind(after.1)
            .bind(revision)
            .bind(limit)
        };
        query.fetch_all(self).await.map_err(db)
    }
}

/// The history, read in one snapshot together with the compaction mark and the latest revision:
/// no commit or compaction can land between the check and the read.
impl EventLog for Inner {
    async fn read(&self, after: (Revision, i64), kinds: Option<&[String]>, limit: i64) -> Result<EventRead> {
        self.check_compacted(after.0)?;
        if let Some(read) = self.read_cache(after, kinds, limit) {
            return Ok(read);
        }
        let mut tx = self.pool.begin_with(SNAPSHOT).await.map_err(db)?;
        let (latest, compacted) = tx.bounds().await?;
        self.compacted.fetch_max(compacted, Ordering::SeqCst);
        if after.0 < compacted {
            return Err(StoreError::Expired { requested: after.0, compacted });
        }
        let rows: Vec<EventRow> = match kinds {
            Some(kinds) => sqlx::query_as(
                "SELECT revision, seq, type, kind, namespace, name, value FROM events
                     WHERE (revision, seq) > ($1, $2) AND kind = ANY($3) ORDER BY revision, seq LIMIT $4",
            )
            .bind(after.0)
            .bind(after.1)
            .bind(kinds)
            .bind(limit)
            .fetch_all(&mut *tx)
            .await
            .map_err(db)?,
            None => sqlx::query_as(
                "SELECT revision, seq, type, kind, namespace, name, value FROM events
                     WHERE (revision, seq) > ($1, $2) ORDER BY revision, seq LIMIT $3",
            )
            .bind(after.0)
            .bind(after.1)
            .bind(limit)
            .fetch_all(&mut *tx)
            .await
            .map_err(db)?,
        };
        tx.commit().await.map_err(db)?;
        self.commits.learn(latest);
        EventRead::from_rows(rows, &self.secrets, latest)
    }
}

impl PostgresStore {
    async fn read_list<T: ListItem>(&self, kind: &str, options: &ListOptions) -> Result<List<T>> {
        let request = ListRequest::parse(options)?;
        refuse_nul("kind", kind)?;
        refuse_nul("namespace", options.namespace.as_deref().unwrap_or(""))?;
        if let Some((namespace, name)) = request.after() {
            refuse_nul("continue token", &format!("{namespace}/{name}"))?;
        }
        let mut tx = self.inner.pool.begin_with(SNAPSHOT).await.map_err(db)?;
        let list = request.read(&mut *tx, &self.inner.secrets, kind).await?;
        tx.commit().await.map_err(db)?;
        Ok(list)
    }
}

#[async_trait::async_trait]
impl Store for PostgresStore {
    async fn get(&self, key: &ObjectKey) -> Result<Option<Value>> {
        if has_nul(&key.kind) || has_nul(&key.namespace) || has_nul(&key.name) {
            return Ok(None); // never stored (see `admit`)
        }
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
        let request = Request { txn: Txn::new(ops), fence: self.fence.clone(), reply };
        self.writer.send(request).await.map_err(|_| StoreError::Unavailable("the store is shutting down".into()))?;
        answer.await.map_err(|_| StoreError::Unavailable("the store is shutting down".into()))?
    }

    async fn watch(&self, from: Revision, options: WatchOptions) -> Result<WatchStream> {
        for kind in options.kinds.iter().flatten() {
            refuse_nul("watched kind", kind)?;
        }
        let mut tx = self.inner.pool.begin_with(SNAPSHOT).await.map_err(db)?;
        let (latest, compacted) = tx.bounds().await?;
        tx.commit().await.map_err(db)?;
        self.inner.compacted.fetch_max(compacted, Ordering::SeqCst);
        if from < compacted {
            return Err(StoreError::Expired { requested: from, compacted });
        }
        // Another replica's commits may not have reached us yet: without this a watch from an
        // older revision would wait for the next notification or poll before replaying them.
        self.inner.commits.learn(latest);
        let commits = &self.inner.commits;
        let kind = match options.kinds.as_deref() {
            Some(kinds) if !kinds.is_empty() => Some(commits.kinds.subscribe(kinds, &commits.latest)),
            _ => None,
        };
        Ok(backend::watch_stream(self.inner.clone(), commits.latest.subscribe(), kind, from, options))
    }

    async fn revision(&self) -> Result<Revision> {
        let revision = meta(&self.inner.pool, "revision").await?;
        self.inner.commits.learn(revision);
        Ok(revision)
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        let mut tx = self.inner.pool.begin_with(WRITE).await.map_err(db)?;
        if let Some(fence) = &self.fence {
            lease::check(&mut tx, fence).await?;
        }
        // Serializes compactions (of every replica) without blocking writers.
        let compacted: Revision = sqlx::query_scalar("SELECT value FROM meta WHERE key = 'compacted' FOR UPDATE")
            .fetch_one(&mut *tx)
            .await
            .map_err(db)?;
        let revision = revision.min(meta(&mut *tx, "revision").await?);
        if revision <= compacted {
            return Ok(());
        }
        // Superseded versions and deletions at or below the revision go; the version of every
        // object alive at it stays (what a list continued at a later revision may need).
        let deleted = sqlx::query(
            "DELETE FROM events WHERE revision <= $1 AND (type = 2 OR EXISTS (
                 SELECT 1 FROM events later WHERE later.kind = events.kind AND later.namespace = events.namespace
                 AND later.name = events.name AND later.revision <= $1
                 AND (later.revision, later.seq) > (events.revision, events.seq)))",
        )
        .bind(revision)
        .execute(&mut *tx)
        .await
        .map_err(db)?
        .rows_affected();
        sqlx::query("UPDATE meta SET value = $1 WHERE key = 'compacted'")
            .bind(revision)
            .execute(&mut *tx)
            .await
            .map_err(db)?;
        tx.commit().await.map_err(db)?;
        self.inner.compacted.fetch_max(revision, Ordering::SeqCst);
        // Autovacuum would get to the deleted rows once they pass its threshold (a fifth of the
        // table) at its next round; vacuuming now makes their space (and their TOASTed values',
        // where large objects live) reusable at once and gives empty pages at the table's end back.
        // Plain VACUUM takes no lock that blocks writers. The objects table is left to
        // autovacuum: its dead versions come from steady updates, the load it is tuned for.
        if deleted > 0
            && let Err(e) = sqlx::raw_sql("VACUUM events").execute(&self.inner.pool).await
        {
            tracing::warn!(error = %e, "vacuuming the compacted history failed; autovacuum will");
        }
        Ok(())
    }
}

/// Follows the notifications of every replica's commits; reconnects with a growing pause.
async fn listen(pool: PgPool, commits: Commits) {
    let mut pause = Duration::from_millis(100);
    loop {
        match follow_notifications(&pool, &commits, &mut pause).await {
            Ok(never) => match never {},
            Err(e) => tracing::warn!(
                error = %e,
                retry_in = ?pause,
                "listening for the commits of other replicas failed; polling covers the gap"
            ),
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_secs(10));
    }
}

async fn follow_notifications(
    pool: &PgPool,
    commits: &Commits,
    pause: &mut Duration,
) -> Result<std::convert::Infallible, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(CHANNEL).await?;
    *pause = Duration::from_millis(100);
    // Commits before the LISTEN took effect notified nobody here.
    catch_up(pool, commits).await;
    loop {
        match listener.try_recv().await? {
            Some(notification) => match parse_notice(notification.payload()) {
                // Told by the writer task, after it filled the watch cache.
                Some(notice) if notice.writer == Some(commits.writer.as_str()) => {}
                Some(notice) => commits.advance(notice.revision, notice.kinds.as_deref()),
                None => catch_up(pool, commits).await,
            },
            // The connection dropped and sqlx re-subscribed: notifications in between are lost.
            None => catch_up(pool, commits).await,
        }
    }
}

async fn catch_up(pool: &PgPool, commits: &Commits) {
    match meta(pool, "revision").await {
        Ok(revision) => commits.learn(revision),
        Err(e) => tracing::debug!(error = %e, "reading the latest revision failed"),
    }
}

/// The fallback for lost notifications: reads the latest revision every `interval`.
async fn poll(pool: PgPool, commits: Commits, interval: Duration) {
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        ticks.tick().await;
        match meta(&pool, "revision").await {
            Ok(revision) => {
                if failing {
                    tracing::info!("the Postgres store is reachable again");
                }
                failing = false;
                commits.learn(revision);
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "cannot read the latest revision from the Postgres store");
                }
                failing = true;
            }
        }
    }
}
