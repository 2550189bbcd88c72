//! The embedded backend: SQLite in WAL mode through sqlx.
//!
//! One writer at a time (an in-process lock) allocates revisions, so commit order is revision
//! order; watchers are woken through a `watch` channel and read the `events` table from their
//! cursor, so a slow watcher never blocks writers and never misses an event.

use crate::{
    Committed, Event, EventType, List, ListOptions, ObjectKey, Op, Result, Revision, Store, StoreError, WatchStream,
    stage,
};
use futures::StreamExt;
use serde_json::Value;
use sqlx::{
    Row, SqlitePool,
    migrate::{Migration, MigrationType, Migrator},
    sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous},
};
use std::{
    borrow::Cow,
    collections::VecDeque,
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicI64, Ordering},
    },
    time::Duration,
};
use tokio::sync::{Mutex, watch};

const WATCH_BATCH: i64 = 1000;

fn migrator() -> Migrator {
    let migrations = [(1, "objects", include_str!("../migrations/sqlite/0001_objects.sql"))];
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

/// The SQLite store.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
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
    pub async fn open(path: &Path) -> Result<Self> {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(10));
        Self::connect(options).await
    }

    /// A private in-memory store, for tests.
    pub async fn memory() -> Result<Self> {
        let options = SqliteConnectOptions::new().in_memory(true).shared_cache(false);
        // One connection: each in-memory connection would be its own database.
        Self::connect_with(options, 1).await
    }

    async fn connect(options: SqliteConnectOptions) -> Result<Self> {
        Self::connect_with(options, 4).await
    }

    async fn connect_with(options: SqliteConnectOptions, connections: u32) -> Result<Self> {
        let pool = SqlitePoolOptions::new().max_connections(connections).connect_with(options).await?;
        let check: String = sqlx::query_scalar("PRAGMA quick_check").fetch_one(&pool).await?;
        if check != "ok" {
            return Err(StoreError::Invalid(format!("database failed its integrity check: {check}")));
        }
        migrator().run(&pool).await?;
        let revision = meta(&pool, "revision").await?;
        let compacted = meta(&pool, "compacted").await?;
        let (committed, _) = watch::channel(revision);
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                pool,
                write: Mutex::new(()),
                revision: AtomicI64::new(revision),
                compacted: AtomicI64::new(compacted),
                committed,
            }),
        })
    }
}

async fn meta(pool: &SqlitePool, key: &str) -> Result<i64> {
    Ok(sqlx::query_scalar("SELECT value FROM meta WHERE key = ?").bind(key).fetch_one(pool).await?)
}

fn parse(key: &ObjectKey, text: &str) -> Result<Value> {
    serde_json::from_str(text).map_err(|source| StoreError::Corrupt { key: key.to_string(), source })
}

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .round(k8s_openapi::jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

#[async_trait::async_trait]
impl Store for SqliteStore {
    async fn get(&self, key: &ObjectKey) -> Result<Option<Value>> {
        let row: Option<String> =
            sqlx::query_scalar("SELECT value FROM objects WHERE kind = ? AND namespace = ? AND name = ?")
                .bind(&key.kind)
                .bind(&key.namespace)
                .bind(&key.name)
                .fetch_optional(&self.inner.pool)
                .await?;
        row.map(|text| parse(key, &text)).transpose()
    }

    async fn list(&self, kind: &str, options: &ListOptions) -> Result<List> {
        let mut tx = self.inner.pool.begin().await?;
        let revision: i64 =
            sqlx::query_scalar("SELECT value FROM meta WHERE key = 'revision'").fetch_one(&mut *tx).await?;
        let rows = match &options.namespace {
            Some(ns) => {
                sqlx::query("SELECT namespace, name, value FROM objects WHERE kind = ? AND namespace = ? ORDER BY name")
                    .bind(kind)
                    .bind(ns)
                    .fetch_all(&mut *tx)
                    .await?
            }
            None => {
                sqlx::query("SELECT namespace, name, value FROM objects WHERE kind = ? ORDER BY namespace, name")
                    .bind(kind)
                    .fetch_all(&mut *tx)
                    .await?
            }
        };
        tx.commit().await?;
        let items = rows
            .iter()
            .map(|row| {
                let key = ObjectKey::new(kind, row.get::<String, _>(0), row.get::<String, _>(1));
                parse(&key, row.get(2))
            })
            .collect::<Result<_>>()?;
        Ok(List { revision, items })
    }

    async fn txn(&self, ops: Vec<Op>) -> Result<Committed> {
        let _writer = self.inner.write.lock().await;
        let revision = self.inner.revision.load(Ordering::SeqCst) + 1;
        let now = now();
        let mut tx = self.inner.pool.begin().await?;
        let mut objects = Vec::with_capacity(ops.len());
        for (seq, op) in ops.into_iter().enumerate() {
            let key = op.key()?;
            let current: Option<String> =
                sqlx::query_scalar("SELECT value FROM objects WHERE kind = ? AND namespace = ? AND name = ?")
                    .bind(&key.kind)
                    .bind(&key.namespace)
                    .bind(&key.name)
                    .fetch_optional(&mut *tx)
                    .await?;
            let current = current.map(|text| parse(&key, &text)).transpose()?;
            let (event_type, value) = match (op, current) {
                (Op::Create(_), Some(_)) => return Err(StoreError::AlreadyExists { key }),
                (Op::Create(value), None) => {
                    (EventType::Added, stage::create(value, revision, uuid::Uuid::new_v4().to_string(), &now)?)
                }
                (Op::Update(_) | Op::UpdateStatus(_) | Op::Delete { .. }, None) => {
                    return Err(StoreError::NotFound { key });
                }
                (Op::Update(value), Some(old)) => {
                    check_revision(&key, stage::expected_revision(&value), &old)?;
                    (EventType::Modified, stage::update(&old, value, revision)?)
                }
                (Op::UpdateStatus(value), Some(old)) => {
                    check_revision(&key, stage::expected_revision(&value), &old)?;
                    (EventType::Modified, stage::update_status(&old, &value, revision)?)
                }
                (Op::Delete { revision: expected, .. }, Some(old)) => {
                    check_revision(&key, expected, &old)?;
                    (EventType::Deleted, stage::delete(&old, revision)?)
                }
            };
            let text = value.to_string();
            stage::check_size(&key, &text)?;
            if event_type == EventType::Deleted {
                sqlx::query("DELETE FROM objects WHERE kind = ? AND namespace = ? AND name = ?")
                    .bind(&key.kind)
                    .bind(&key.namespace)
                    .bind(&key.name)
                    .execute(&mut *tx)
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
                .execute(&mut *tx)
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
            .execute(&mut *tx)
            .await?;
            objects.push(value);
        }
        if objects.is_empty() {
            return Ok(Committed { revision: revision - 1, objects });
        }
        sqlx::query("UPDATE meta SET value = ? WHERE key = 'revision'").bind(revision).execute(&mut *tx).await?;
        tx.commit().await?;
        self.inner.revision.store(revision, Ordering::SeqCst);
        self.inner.committed.send_replace(revision);
        Ok(Committed { revision, objects })
    }

    async fn watch(&self, from: Revision) -> Result<WatchStream> {
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
        sqlx::query("DELETE FROM events WHERE revision <= ?").bind(revision).execute(&mut *tx).await?;
        sqlx::query("UPDATE meta SET value = ? WHERE key = 'compacted'").bind(revision).execute(&mut *tx).await?;
        tx.commit().await?;
        self.inner.compacted.store(revision, Ordering::SeqCst);
        Ok(())
    }
}

fn check_revision(key: &ObjectKey, expected: Option<Revision>, old: &Value) -> Result<()> {
    let current = gitplane_api::object::resource_version(old).unwrap_or(0);
    match expected {
        Some(expected) if expected != current => Err(StoreError::Conflict { key: key.clone(), expected, current }),
        _ => Ok(()),
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
        let rows = sqlx::query(
            "SELECT revision, seq, type, kind, namespace, name, value FROM events \
             WHERE revision > ?1 OR (revision = ?1 AND seq > ?2) ORDER BY revision, seq LIMIT ?3",
        )
        .bind(revision)
        .bind(seq)
        .bind(WATCH_BATCH)
        .fetch_all(&self.inner.pool)
        .await?;
        self.more = rows.len() as i64 == WATCH_BATCH;
        if rows.is_empty() {
            // Nothing after our position although a later revision is committed: compaction
            // removed it between our check and the read.
            self.check_compacted()?;
            self.position = (*self.committed.borrow(), i64::MAX);
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
        let store = SqliteStore::open(&path).await.unwrap();
        let pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "a"}});
        let revision = store.txn(vec![Op::Create(pod)]).await.unwrap().revision;
        drop(store);
        let store = SqliteStore::open(&path).await.unwrap();
        assert_eq!(store.revision().await.unwrap(), revision);
        assert!(store.get(&ObjectKey::new("Pod", "a", "p")).await.unwrap().is_some());
    }

    #[tokio::test]
    async fn a_corrupt_file_is_reported_not_recreated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db");
        std::fs::write(&path, b"this is not a database, but it is somebody's data").unwrap();
        let err = SqliteStore::open(&path).await.err().expect("a corrupt file is an error");
        assert!(err.to_string().contains("not a database"), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), b"this is not a database, but it is somebody's data");
    }
}
