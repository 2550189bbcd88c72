//! The Raft state machine: the SQLite store itself. An entry's batch of transactions is applied
//! with the entry's log id in the same SQLite transaction, so after a crash the store and its
//! applied position agree. A snapshot is a consistent copy of the database (`VACUUM INTO`),
//! installed on a lagging replica by replacing its tables in one transaction.

use super::{Batch, BatchResult, NodeId, TypeConfig};
use crate::{Txn, sqlite::SqliteStore};
use openraft::{
    AnyError, BasicNode, Entry, EntryPayload, LogId, OptionalSend, RaftSnapshotBuilder, Snapshot, SnapshotMeta,
    StorageError, StorageIOError, StoredMembership, storage::RaftStateMachine,
};
use sqlx::{Row, SqliteConnection};
use std::{
    io::Cursor,
    path::{Path, PathBuf},
    sync::Arc,
};
use tokio::sync::Mutex;

type StoreResult<T> = Result<T, StorageError<NodeId>>;
type Membership = StoredMembership<NodeId, BasicNode>;

/// gitplane's own table in the store database: where the state machine stands.
const APPLIED_TABLE: &str = "raft_applied";

fn sm_err<E: std::error::Error + 'static>(e: E) -> StorageError<NodeId> {
    StorageIOError::write_state_machine(AnyError::new(&e)).into()
}

fn snap_err<E: std::error::Error + 'static>(e: E) -> StorageError<NodeId> {
    StorageIOError::write_snapshot(None, AnyError::new(&e)).into()
}

/// The latest snapshot: its metadata and its database file.
#[derive(Clone)]
struct StoredSnapshot {
    meta: SnapshotMeta<NodeId, BasicNode>,
    path: PathBuf,
}

#[derive(Clone)]
pub struct StateMachine {
    store: SqliteStore,
    dir: PathBuf,
    current: Arc<Mutex<Option<StoredSnapshot>>>,
}

async fn read_applied(conn: &mut SqliteConnection) -> Result<(Option<LogId<NodeId>>, Membership), sqlx::Error> {
    let rows = sqlx::query(&format!("SELECT key, value FROM {APPLIED_TABLE}")).fetch_all(&mut *conn).await?;
    let mut applied = None;
    let mut membership = Membership::default();
    for row in rows {
        let value: &str = row.get(1);
        let decode = |e: serde_json::Error| sqlx::Error::Decode(Box::new(e));
        match row.get::<&str, _>(0) {
            "applied" => applied = serde_json::from_str(value).map_err(decode)?,
            "membership" => membership = serde_json::from_str(value).map_err(decode)?,
            _ => {}
        }
    }
    Ok((applied, membership))
}

impl StateMachine {
    /// `dir` keeps the latest snapshot file.
    pub async fn open(store: SqliteStore, dir: &Path) -> Result<StateMachine, sqlx::Error> {
        sqlx::query(&format!("CREATE TABLE IF NOT EXISTS {APPLIED_TABLE} (key TEXT PRIMARY KEY, value TEXT NOT NULL)"))
            .execute(store.pool())
            .await?;
        std::fs::create_dir_all(dir).map_err(sqlx::Error::Io)?;
        let current = load_current(dir);
        Ok(StateMachine { store, dir: dir.to_path_buf(), current: Arc::new(Mutex::new(current)) })
    }
}

/// The snapshot kept on disk by a previous run, if any.
fn load_current(dir: &Path) -> Option<StoredSnapshot> {
    let meta = std::fs::read(dir.join("current.json")).ok()?;
    let meta: SnapshotMeta<NodeId, BasicNode> = serde_json::from_slice(&meta).ok()?;
    let path = dir.join(format!("{}.db", meta.snapshot_id));
    path.exists().then_some(StoredSnapshot { meta, path })
}

async fn make_current(
    current: &Mutex<Option<StoredSnapshot>>,
    dir: &Path,
    meta: SnapshotMeta<NodeId, BasicNode>,
    path: PathBuf,
) -> std::io::Result<()> {
    let json = serde_json::to_vec(&meta).map_err(std::io::Error::other)?;
    let tmp = dir.join("current.json.tmp");
    std::fs::write(&tmp, json)?;
    std::fs::rename(&tmp, dir.join("current.json"))?;
    let mut current = current.lock().await;
    if let Some(old) = current.replace(StoredSnapshot { meta, path }) {
        let _ = std::fs::remove_file(old.path);
    }
    Ok(())
}

fn open_snapshot(stored: &StoredSnapshot) -> StoreResult<Snapshot<TypeConfig>> {
    let data = std::fs::read(&stored.path).map_err(snap_err)?;
    Ok(Snapshot { meta: stored.meta.clone(), snapshot: Box::new(Cursor::new(data)) })
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    async fn build_snapshot(&mut self) -> StoreResult<Snapshot<TypeConfig>> {
        let id = uuid::Uuid::new_v4().to_string();
        let path = self.dir.join(format!("{id}.db"));
        // A consistent copy, applied position included: the copy's own raft_applied says where it is.
        sqlx::query("VACUUM INTO ?")
            .bind(path.to_string_lossy().as_ref())
            .execute(self.store.pool())
            .await
            .map_err(snap_err)?;
        let options = sqlx::sqlite::SqliteConnectOptions::new().filename(&path).read_only(true);
        let mut conn = sqlx::ConnectOptions::connect(&options).await.map_err(snap_err)?;
        let (last_log_id, last_membership) = read_applied(&mut conn).await.map_err(snap_err)?;
        sqlx::Connection::close(conn).await.map_err(snap_err)?;
        let meta = SnapshotMeta { last_log_id, last_membership, snapshot_id: id };
        make_current(&self.current, &self.dir, meta.clone(), path.clone()).await.map_err(snap_err)?;
        tracing::info!(last_log_id = ?meta.last_log_id, "built a snapshot");
        open_snapshot(&StoredSnapshot { meta, path })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = StateMachine;

    async fn applied_state(&mut self) -> StoreResult<(Option<LogId<NodeId>>, Membership)> {
        let mut conn = self.store.pool().acquire().await.map_err(sm_err)?;
        read_applied(&mut conn).await.map_err(sm_err)
    }

    async fn apply<I>(&mut self, entries: I) -> StoreResult<Vec<BatchResult>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut batches: Vec<Arc<[Txn]>> = Vec::new();
        let mut count = 0;
        // Per entry, the range of its transactions in `txns` (none for blank and membership entries).
        let mut spans: Vec<Option<(usize, usize)>> = Vec::new();
        let mut last: Option<LogId<NodeId>> = None;
        let mut membership: Option<Membership> = None;
        for entry in entries {
            last = Some(entry.log_id);
            match entry.payload {
                EntryPayload::Normal(Batch(batch)) => {
                    spans.push(Some((count, batch.len())));
                    count += batch.len();
                    batches.push(batch);
                }
                EntryPayload::Membership(m) => {
                    membership = Some(StoredMembership::new(Some(entry.log_id), m));
                    spans.push(None);
                }
                EntryPayload::Blank => spans.push(None),
            }
        }
        let Some(last) = last else { return Ok(Vec::new()) };
        let txns: Vec<&Txn> = batches.iter().flat_map(|b| b.iter()).collect();
        let applied = serde_json::to_string(&Some(last)).map_err(sm_err)?;
        let membership = membership.map(|m| serde_json::to_string(&m)).transpose().map_err(sm_err)?;
        let results = self
            .store
            .apply_batch(&txns, move |conn| {
                Box::pin(async move {
                    let upsert = format!("INSERT OR REPLACE INTO {APPLIED_TABLE} (key, value) VALUES (?, ?)");
                    sqlx::query(&upsert).bind("applied").bind(applied).execute(&mut *conn).await?;
                    if let Some(m) = membership {
                        sqlx::query(&upsert).bind("membership").bind(m).execute(&mut *conn).await?;
                    }
                    Ok(())
                })
            })
            .await
            .map_err(|e| StorageIOError::apply(last, AnyError::new(&e)))?;
        Ok(spans
            .into_iter()
            .map(|span| match span {
                Some((start, len)) => BatchResult(results[start..start + len].to_vec()),
                None => BatchResult::default(),
            })
            .collect())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> StoreResult<Box<Cursor<Vec<u8>>>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<NodeId, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> StoreResult<()> {
        let path = self.dir.join(format!("{}.db", meta.snapshot_id));
        std::fs::write(&path, snapshot.into_inner()).map_err(snap_err)?;
        self.store
            .install(&path, &[APPLIED_TABLE])
            .await
            .map_err(|e| StorageIOError::write_snapshot(None, AnyError::new(&e)))?;
        make_current(&self.current, &self.dir, meta.clone(), path).await.map_err(snap_err)?;
        tracing::info!(last_log_id = ?meta.last_log_id, "installed a snapshot from the leader");
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> StoreResult<Option<Snapshot<TypeConfig>>> {
        let current = self.current.lock().await.clone();
        current.as_ref().map(open_snapshot).transpose()
    }
}
