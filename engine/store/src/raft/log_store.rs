//! The Raft log, durable in its own SQLite file (fsync on every append: a committed entry must
//! survive a crash of a majority).

use super::{NodeId, TypeConfig};
use openraft::{
    AnyError, Entry, LogId, LogState, OptionalSend, RaftLogReader, StorageError, StorageIOError, Vote,
    storage::{LogFlushed, RaftLogStorage},
};
use sqlx::{
    Row, SqlitePool,
    sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous},
};
use std::{fmt::Debug, ops::RangeBounds, path::Path, time::Duration};

type StoreResult<T> = Result<T, StorageError<NodeId>>;

#[derive(Clone)]
pub struct LogStore {
    pool: SqlitePool,
}

fn io<E: std::error::Error + 'static>(
    make: fn(AnyError) -> StorageIOError<NodeId>,
) -> impl Fn(E) -> StorageError<NodeId> {
    move |e| make(AnyError::new(&e)).into()
}

impl LogStore {
    pub async fn open(path: &Path) -> Result<LogStore, sqlx::Error> {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(Duration::from_secs(10));
        let pool = SqlitePoolOptions::new().max_connections(2).connect_with(options).await?;
        sqlx::query("CREATE TABLE IF NOT EXISTS log (idx INTEGER PRIMARY KEY, entry TEXT NOT NULL)")
            .execute(&pool)
            .await?;
        sqlx::query("CREATE TABLE IF NOT EXISTS raft_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            .execute(&pool)
            .await?;
        Ok(LogStore { pool })
    }

    async fn meta<T: serde::de::DeserializeOwned>(&self, key: &str) -> StoreResult<Option<T>> {
        let value: Option<String> = sqlx::query_scalar("SELECT value FROM raft_meta WHERE key = ?")
            .bind(key)
            .fetch_optional(&self.pool)
            .await
            .map_err(io(StorageIOError::read))?;
        value.map(|v| serde_json::from_str(&v).map_err(io(StorageIOError::read))).transpose()
    }

    async fn set_meta<T: serde::Serialize>(&self, key: &str, value: &T) -> StoreResult<()> {
        let text = serde_json::to_string(value).map_err(io(StorageIOError::write))?;
        sqlx::query("INSERT OR REPLACE INTO raft_meta (key, value) VALUES (?, ?)")
            .bind(key)
            .bind(text)
            .execute(&self.pool)
            .await
            .map_err(io(StorageIOError::write))?;
        Ok(())
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> StoreResult<Vec<Entry<TypeConfig>>> {
        use std::ops::Bound;
        let start = match range.start_bound() {
            Bound::Included(i) => *i,
            Bound::Excluded(i) => i + 1,
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(i) => i.saturating_add(1),
            Bound::Excluded(i) => *i,
            Bound::Unbounded => u64::MAX,
        };
        let rows = sqlx::query("SELECT entry FROM log WHERE idx >= ? AND idx < ? ORDER BY idx")
            .bind(start as i64)
            .bind(end.min(i64::MAX as u64) as i64)
            .fetch_all(&self.pool)
            .await
            .map_err(io(StorageIOError::read_logs))?;
        rows.iter()
            .map(|row| serde_json::from_str(row.get::<&str, _>(0)).map_err(io(StorageIOError::read_logs)))
            .collect()
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> StoreResult<LogState<TypeConfig>> {
        let purged: Option<LogId<NodeId>> = self.meta("purged").await?;
        let last: Option<String> = sqlx::query_scalar("SELECT entry FROM log ORDER BY idx DESC LIMIT 1")
            .fetch_optional(&self.pool)
            .await
            .map_err(io(StorageIOError::read_logs))?;
        let last = last
            .map(|e| serde_json::from_str::<Entry<TypeConfig>>(&e).map_err(io(StorageIOError::read_logs)))
            .transpose()?
            .map(|e| e.log_id);
        Ok(LogState { last_purged_log_id: purged, last_log_id: last.or(purged) })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> StoreResult<()> {
        self.set_meta("vote", vote).await
    }

    async fn read_vote(&mut self) -> StoreResult<Option<Vote<NodeId>>> {
        self.meta("vote").await
    }

    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> StoreResult<()> {
        self.set_meta("committed", &committed).await
    }

    async fn read_committed(&mut self) -> StoreResult<Option<LogId<NodeId>>> {
        Ok(self.meta::<Option<LogId<NodeId>>>("committed").await?.flatten())
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> StoreResult<()>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let result = async {
            let mut tx = self.pool.begin().await?;
            for entry in entries {
                let text = serde_json::to_string(&entry).map_err(|e| sqlx::Error::Encode(Box::new(e)))?;
                sqlx::query("INSERT OR REPLACE INTO log (idx, entry) VALUES (?, ?)")
                    .bind(entry.log_id.index as i64)
                    .bind(text)
                    .execute(&mut *tx)
                    .await?;
            }
            tx.commit().await
        }
        .await;
        match result {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                callback.log_io_completed(Err(std::io::Error::other(e.to_string())));
                Err(StorageIOError::write_logs(AnyError::new(&e)).into())
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> StoreResult<()> {
        sqlx::query("DELETE FROM log WHERE idx >= ?")
            .bind(log_id.index as i64)
            .execute(&self.pool)
            .await
            .map_err(io(StorageIOError::write_logs))?;
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> StoreResult<()> {
        self.set_meta("purged", &log_id).await?;
        sqlx::query("DELETE FROM log WHERE idx <= ?")
            .bind(log_id.index as i64)
            .execute(&self.pool)
            .await
            .map_err(io(StorageIOError::write_logs))?;
        Ok(())
    }
}
