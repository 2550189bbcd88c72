//! The Raft log, durable in its own SQLite file (fsync on every append: a committed entry must
//! survive a crash of a majority). The latest entries are also kept in memory: replication and
//! apply read what was just appended, and reading it back would cost a query and a JSON parse
//! per entry for each reader.
//!
//! An append returns at once and a writer task makes it durable, reporting through openraft's
//! flush callback: Raft's loop goes on (the leader replicates while its own disk syncs), and
//! appends that queue meanwhile share one SQLite transaction and one fsync. Truncation and purge
//! go through the same writer, in order.
//!
//! An entry that carries an object of an encrypted kind (a Secret) is stored with its payload
//! sealed under the store's write key, bound to the entry's index; its log id stays readable, so
//! the log's state is known without the keys. When the write key changes, a task re-seals the
//! entries sealed under other keys (and seals the ones written before encryption was on), so an
//! old key can be dropped without losing the log.
//!
//! The commit index is not saved (openraft's default): the state machine stores its applied
//! position in the same transaction as the state, and a restarted replica learns the commit
//! index from the leader. Saving it cost a synced write on every replica for every commit.

use super::{Batch, NodeId, TypeConfig};
use crate::encryption::{self, Keyring};
use openraft::{
    AnyError, Entry, EntryPayload, LogId, LogState, OptionalSend, RaftLogReader, StorageError, StorageIOError, Vote,
    storage::{LogFlushed, RaftLogStorage},
};
use sqlx::{
    Row, SqlitePool,
    sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous},
};
use std::{
    collections::VecDeque,
    fmt::Debug,
    ops::RangeBounds,
    path::Path,
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};
use tokio::sync::{mpsc, oneshot};

type StoreResult<T> = Result<T, StorageError<NodeId>>;

#[derive(Clone)]
pub struct LogStore {
    pool: SqlitePool,
    recent: Arc<Mutex<Recent>>,
    writer: mpsc::UnboundedSender<Write>,
    secrets: Keyring,
    /// The highest index known committed (openraft's `save_committed`), for `/metrics`; in
    /// memory only: openraft re-derives it after a restart.
    committed: Arc<AtomicU64>,
}

/// An entry as the log table holds it when its payload is sealed (`sealed` first: the text
/// starts with [`SEALED`]).
#[derive(serde::Serialize, serde::Deserialize)]
struct SealedEntry {
    sealed: String,
    log_id: LogId<NodeId>,
}

/// When the second pass of a re-seal runs.
const RESEAL_AGAIN: Duration = Duration::from_secs(2);

const SEALED: &str = "{\"sealed\":";

/// What a sealed payload is bound to.
fn entry_aad(index: u64) -> Vec<u8> {
    format!("gitplane raft log entry {index}").into_bytes()
}

/// Whether an entry carries an object of an encrypted kind.
fn carries_secrets(entry: &Entry<TypeConfig>) -> bool {
    match &entry.payload {
        EntryPayload::Normal(Batch(txns)) => {
            txns.iter().flat_map(|t| &t.ops).any(|op| op.key().is_ok_and(|k| encryption::encrypts(&k.kind)))
        }
        _ => false,
    }
}

/// The log table's text for `entry`.
fn encode(secrets: &Keyring, entry: &Entry<TypeConfig>) -> Result<String, serde_json::Error> {
    if carries_secrets(entry) {
        let payload = serde_json::to_vec(&entry.payload)?;
        if let Some(sealed) = secrets.seal_bytes(&entry_aad(entry.log_id.index), &payload) {
            return serde_json::to_string(&SealedEntry { sealed, log_id: entry.log_id });
        }
    }
    serde_json::to_string(entry)
}

fn decode_error(e: impl std::fmt::Display) -> StorageError<NodeId> {
    StorageIOError::read_logs(AnyError::error(e.to_string())).into()
}

/// An entry from the log table's text.
fn decode(secrets: &Keyring, text: &str) -> StoreResult<Entry<TypeConfig>> {
    if !text.starts_with(SEALED) {
        return serde_json::from_str(text).map_err(decode_error);
    }
    let SealedEntry { sealed, log_id } = serde_json::from_str(text).map_err(decode_error)?;
    let payload = secrets
        .open_bytes(&entry_aad(log_id.index), &sealed)
        .map_err(|(_, reason)| decode_error(format!("cannot decrypt Raft log entry {}: {reason}", log_id.index)))?;
    Ok(Entry { log_id, payload: serde_json::from_slice(&payload).map_err(decode_error)? })
}

/// Re-seals, under the current write key, every entry sealed under another key or carrying a
/// Secret in clear; at start and after every change of the write key, while the log lives.
/// Each row is replaced only if it still holds what was read, so appends, truncations and
/// purges meanwhile win.
async fn reseal(pool: SqlitePool, secrets: Keyring) {
    let mut changes = secrets.write_key_changes();
    loop {
        let write = changes.borrow_and_update().clone();
        // Twice: an entry encoded under the old key just before the change may be written after
        // the first pass has read the log.
        for pause in [Duration::ZERO, RESEAL_AGAIN] {
            tokio::time::sleep(pause).await;
            let Some(write) = &write else { break };
            match reseal_once(&pool, &secrets, write).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(entries = n, key = %write, "re-sealed Raft log entries under the write key"),
                Err(e) => {
                    tracing::warn!(error = %e, "re-sealing the Raft log failed; it is retried at the next key change")
                }
            }
        }
        if changes.changed().await.is_err() {
            return;
        }
    }
}

async fn reseal_once(
    pool: &SqlitePool,
    secrets: &Keyring,
    write: &str,
) -> Result<usize, Box<dyn std::error::Error + Send + Sync>> {
    let current = format!("{SEALED}\"{}{write}:", encryption::PREFIX);
    let rows: Vec<(i64, String)> = sqlx::query_as(
        "SELECT idx, entry FROM log WHERE substr(entry, 1, length(?1)) != ?1
           AND (entry LIKE '{\"sealed\":%' OR instr(entry, '\"kind\":\"Secret\"') > 0)",
    )
    .bind(&current)
    .fetch_all(pool)
    .await?;
    let mut count = 0;
    for (idx, text) in rows {
        let entry = decode(secrets, &text).map_err(|e| e.to_string())?;
        let new = encode(secrets, &entry)?;
        if new != text {
            sqlx::query("UPDATE log SET entry = ? WHERE idx = ? AND entry = ?")
                .bind(new)
                .bind(idx)
                .bind(&text)
                .execute(pool)
                .await?;
            count += 1;
        }
    }
    Ok(count)
}

type Done = oneshot::Sender<Result<(), sqlx::Error>>;

/// The writer task's work, done in the order queued.
enum Write {
    /// Entries (already in `recent`) to make durable; the callback tells openraft.
    Append(Vec<Entry<TypeConfig>>, LogFlushed<TypeConfig>),
    Truncate(u64, Done),
    Purge(LogId<NodeId>, Done),
    /// Answered once everything queued before it is on disk.
    Flush(Done),
}

/// Entries in memory: the newest appended ones (on disk or queued for it), at consecutive indexes.
const RECENT: usize = 1024;

#[derive(Default)]
struct Recent(VecDeque<Entry<TypeConfig>>);

impl Recent {
    /// Entries `[start, end)`, if all are here.
    fn range(&self, start: u64, end: u64) -> Option<Vec<Entry<TypeConfig>>> {
        let first = self.0.front()?.log_id.index;
        let last = self.0.back()?.log_id.index;
        if start < first || end > last + 1 {
            return None;
        }
        Some(self.0.range((start - first) as usize..(end.max(start) - first) as usize).cloned().collect())
    }

    /// Appends, replacing whatever was at or after the first new index (a conflicting suffix).
    fn append(&mut self, entries: Vec<Entry<TypeConfig>>) {
        if let Some(first) = entries.first() {
            self.truncate(first.log_id.index);
        }
        for entry in entries {
            // Only a run of consecutive indexes can answer a range.
            if self.0.back().is_some_and(|last| last.log_id.index + 1 != entry.log_id.index) {
                self.0.clear();
            }
            self.0.push_back(entry);
        }
        while self.0.len() > RECENT {
            self.0.pop_front();
        }
    }

    /// Drops entries at `index` and after.
    fn truncate(&mut self, index: u64) {
        while self.0.back().is_some_and(|e| e.log_id.index >= index) {
            self.0.pop_back();
        }
    }

    /// Drops entries up to `index`.
    fn purge(&mut self, index: u64) {
        while self.0.front().is_some_and(|e| e.log_id.index <= index) {
            self.0.pop_front();
        }
    }
}

fn writer_stopped() -> StorageError<NodeId> {
    StorageIOError::write_logs(AnyError::error("the log writer stopped")).into()
}

fn io<E: std::error::Error + 'static>(
    make: fn(AnyError) -> StorageIOError<NodeId>,
) -> impl Fn(E) -> StorageError<NodeId> {
    move |e| make(AnyError::new(&e)).into()
}

impl LogStore {
    pub async fn open(path: &Path, secrets: Keyring) -> Result<LogStore, sqlx::Error> {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .pragma("temp_store", "memory")
            .busy_timeout(Duration::from_secs(10));
        let pool = SqlitePoolOptions::new().max_connections(2).connect_with(options).await?;
        sqlx::query("CREATE TABLE IF NOT EXISTS log (idx INTEGER PRIMARY KEY, entry TEXT NOT NULL)")
            .execute(&pool)
            .await?;
        sqlx::query("CREATE TABLE IF NOT EXISTS raft_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            .execute(&pool)
            .await?;
        let (writer, queue) = mpsc::unbounded_channel();
        tokio::spawn(write_loop(pool.clone(), secrets.clone(), queue));
        tokio::spawn(reseal(pool.clone(), secrets.clone()));
        Ok(LogStore { pool, recent: Arc::default(), writer, secrets, committed: Arc::default() })
    }

    /// The highest index known committed, as it moves.
    pub fn commit_index(&self) -> Arc<AtomicU64> {
        self.committed.clone()
    }

    /// Queues `write` and waits for it to be done.
    async fn write(&self, write: impl FnOnce(Done) -> Write) -> StoreResult<()> {
        let (done, result) = oneshot::channel();
        self.writer.send(write(done)).map_err(|_| writer_stopped())?;
        result.await.map_err(|_| writer_stopped())?.map_err(io(StorageIOError::write_logs))
    }

    fn recent(&self) -> MutexGuard<'_, Recent> {
        self.recent.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn meta<T: serde::de::DeserializeOwned>(&self, key: &str) -> StoreResult<Option<T>> {
        let value: Option<String> = sqlx::query_scalar("SELECT value FROM raft_meta WHERE key = ?")
            .bind(key)
            .fetch_optional(&self.pool)
            .await
            .map_err(io(StorageIOError::read))?;
        value.map(|v| serde_json::from_str(&v).map_err(io(StorageIOError::read))).transpose()
    }
}

async fn set_meta<T: serde::Serialize>(pool: &SqlitePool, key: &str, value: &T) -> Result<(), sqlx::Error> {
    let text = serde_json::to_string(value).map_err(|e| sqlx::Error::Encode(Box::new(e)))?;
    sqlx::query("INSERT OR REPLACE INTO raft_meta (key, value) VALUES (?, ?)")
        .bind(key)
        .bind(text)
        .execute(pool)
        .await?;
    Ok(())
}

async fn write_loop(pool: SqlitePool, secrets: Keyring, mut queue: mpsc::UnboundedReceiver<Write>) {
    let mut queued = Vec::new();
    let mut appends = Vec::new();
    while queue.recv_many(&mut queued, 256).await > 0 {
        for write in queued.drain(..) {
            let (result, done) = match write {
                Write::Append(entries, flushed) => {
                    appends.push((entries, flushed));
                    continue;
                }
                // Whatever was appended before goes first.
                Write::Truncate(index, done) => {
                    commit(&pool, &secrets, &mut appends).await;
                    (sqlx::query("DELETE FROM log WHERE idx >= ?").bind(index as i64).execute(&pool).await, done)
                }
                Write::Purge(log_id, done) => {
                    commit(&pool, &secrets, &mut appends).await;
                    let purged = async {
                        set_meta(&pool, "purged", &log_id).await?;
                        sqlx::query("DELETE FROM log WHERE idx <= ?").bind(log_id.index as i64).execute(&pool).await
                    };
                    (purged.await, done)
                }
                Write::Flush(done) => {
                    commit(&pool, &secrets, &mut appends).await;
                    let _ = done.send(Ok(()));
                    continue;
                }
            };
            let _ = done.send(result.map(|_| ()));
        }
        commit(&pool, &secrets, &mut appends).await;
    }
}

/// Writes the queued appends in one transaction (one fsync) and reports each to openraft.
async fn commit(
    pool: &SqlitePool,
    secrets: &Keyring,
    appends: &mut Vec<(Vec<Entry<TypeConfig>>, LogFlushed<TypeConfig>)>,
) {
    if appends.is_empty() {
        return;
    }
    let result = async {
        let mut tx = pool.begin().await?;
        for entry in appends.iter().flat_map(|(entries, _)| entries) {
            let text = encode(secrets, entry).map_err(|e| sqlx::Error::Encode(Box::new(e)))?;
            sqlx::query("INSERT OR REPLACE INTO log (idx, entry) VALUES (?, ?)")
                .bind(entry.log_id.index as i64)
                .bind(text)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await
    }
    .await;
    if let Err(e) = &result {
        tracing::error!(error = %e, "writing the Raft log failed");
    }
    for (_, flushed) in appends.drain(..) {
        flushed.log_io_completed(result.as_ref().map(|_| ()).map_err(|e| std::io::Error::other(e.to_string())));
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
        if let Some(entries) = self.recent().range(start, end) {
            return Ok(entries);
        }
        self.write(Write::Flush).await?;
        let rows = sqlx::query("SELECT entry FROM log WHERE idx >= ? AND idx < ? ORDER BY idx")
            .bind(start as i64)
            .bind(end.min(i64::MAX as u64) as i64)
            .fetch_all(&self.pool)
            .await
            .map_err(io(StorageIOError::read_logs))?;
        rows.iter().map(|row| decode(&self.secrets, row.get::<&str, _>(0))).collect()
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> StoreResult<LogState<TypeConfig>> {
        self.write(Write::Flush).await?;
        let purged: Option<LogId<NodeId>> = self.meta("purged").await?;
        let last: Option<String> = sqlx::query_scalar("SELECT entry FROM log ORDER BY idx DESC LIMIT 1")
            .fetch_optional(&self.pool)
            .await
            .map_err(io(StorageIOError::read_logs))?;
        // The log id only: a sealed entry's is readable without the keys.
        #[derive(serde::Deserialize)]
        struct LogIdOnly {
            log_id: LogId<NodeId>,
        }
        let last = last
            .map(|e| serde_json::from_str::<LogIdOnly>(&e).map_err(io(StorageIOError::read_logs)))
            .transpose()?
            .map(|e| e.log_id);
        Ok(LogState { last_purged_log_id: purged, last_log_id: last.or(purged) })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> StoreResult<()> {
        set_meta(&self.pool, "vote", vote).await.map_err(io(StorageIOError::write))
    }

    async fn read_vote(&mut self) -> StoreResult<Option<Vote<NodeId>>> {
        self.meta("vote").await
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> StoreResult<()>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry<TypeConfig>> = entries.into_iter().collect();
        self.recent().append(entries.clone());
        self.writer.send(Write::Append(entries, callback)).map_err(|_| writer_stopped())
    }

    async fn save_committed(&mut self, committed: Option<LogId<NodeId>>) -> StoreResult<()> {
        self.committed.store(committed.map_or(0, |c| c.index), Ordering::Relaxed);
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> StoreResult<()> {
        self.recent().truncate(log_id.index);
        self.write(|done| Write::Truncate(log_id.index, done)).await
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> StoreResult<()> {
        self.recent().purge(log_id.index);
        self.write(|done| Write::Purge(log_id, done)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::{CommittedLeaderId, EntryPayload};

    fn entry(index: u64) -> Entry<TypeConfig> {
        Entry { log_id: LogId::new(CommittedLeaderId::new(1, 1), index), payload: EntryPayload::Blank }
    }

    fn indexes(entries: Option<Vec<Entry<TypeConfig>>>) -> Option<Vec<u64>> {
        entries.map(|e| e.iter().map(|e| e.log_id.index).collect())
    }

    #[test]
    fn recent_entries_answer_only_ranges_they_hold_whole() {
        let mut recent = Recent::default();
        assert_eq!(indexes(recent.range(1, 2)), None);
        recent.append((5..10).map(entry).collect());
        assert_eq!(indexes(recent.range(6, 9)), Some(vec![6, 7, 8]));
        assert_eq!(indexes(recent.range(5, 10)), Some(vec![5, 6, 7, 8, 9]));
        assert_eq!(indexes(recent.range(4, 6)), None, "index 4 is not here");
        assert_eq!(indexes(recent.range(9, 11)), None, "index 10 is not here");

        // A conflicting suffix is replaced; purge drops the front.
        recent.append(vec![entry(8)]);
        assert_eq!(indexes(recent.range(8, 10)), None, "index 9 went with the replaced suffix");
        assert_eq!(indexes(recent.range(5, 9)), Some(vec![5, 6, 7, 8]));
        recent.purge(6);
        assert_eq!(indexes(recent.range(6, 8)), None);
        assert_eq!(indexes(recent.range(7, 9)), Some(vec![7, 8]));

        // A gap (a snapshot installed past the log) starts the run again.
        recent.append(vec![entry(20)]);
        assert_eq!(indexes(recent.range(7, 9)), None);
        assert_eq!(indexes(recent.range(20, 21)), Some(vec![20]));

        recent.append((21..21 + RECENT as u64).map(entry).collect());
        assert_eq!(indexes(recent.range(20, 21)), None, "the oldest left when the cache filled");
        assert_eq!(recent.0.len(), RECENT);
    }
}
