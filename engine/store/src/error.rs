use gitplane_api::ObjectKey;
use serde::{Deserialize, Serialize};

/// A backend's own error, whatever its type (sqlx, I/O, gRPC).
pub type BackendError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a transaction was refused. Deterministic: every replica that applies the same
/// transaction to the same state refuses it for the same reason, so it travels in Raft answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum Rejection {
    #[error("{key} not found")]
    NotFound { key: ObjectKey },
    #[error("{key} already exists")]
    AlreadyExists { key: ObjectKey },
    #[error(
        "conflict on {key}: the update was based on resourceVersion {expected}, the object is now at {current}; read it again and retry"
    )]
    Conflict { key: ObjectKey, expected: i64, current: i64 },
    #[error("{key} is {size} bytes, over the limit of {limit} bytes")]
    TooLarge { key: ObjectKey, size: usize, limit: usize },
    #[error("invalid object: {0}")]
    Invalid(String),
}

/// Why a store operation failed. Each variant names the object it concerns.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{0}")]
    Rejected(Rejection),
    #[error(
        "revision {requested} has been compacted (history starts after {compacted}): list again and watch from the list's revision"
    )]
    Expired { requested: i64, compacted: i64 },
    #[error("invalid request: {0}")]
    BadRequest(String),
    #[error("corrupt store data for {key}: {source}")]
    Corrupt {
        key: String,
        #[source]
        source: serde_json::Error,
    },
    /// The backend's own failure (a database, a file, the network), kept whole as the source: the
    /// contract names no backend's error type.
    #[error("storage backend: {0}")]
    Backend(#[source] BackendError),
    #[error("migrating the store schema: {0}")]
    Migrate(#[source] BackendError),
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// This replica cannot take writes now and did not apply the transaction: it is safe to
    /// send it again, to the leader.
    #[error("not the leader: {0}")]
    NotLeader(String),
    /// A fenced write from a leader that has been deposed: nothing of it was applied, so it is
    /// safe to send again, to the current leader.
    #[error(
        "write refused: {holder} (leader token {token}) is no longer the leader; the lease is held by {current_holder:?} with token {current_token}: send writes to the current leader"
    )]
    Fenced { holder: String, token: u64, current_holder: String, current_token: u64 },
    /// The backend could not be reached at all, so nothing was read or written.
    #[error("cannot connect to {target}: {source} ({advice})")]
    Connect {
        /// What was being connected to, e.g. `the Postgres store at /run/postgresql (...)`.
        target: String,
        #[source]
        source: BackendError,
        /// What to check.
        advice: &'static str,
    },
}

impl From<Rejection> for StoreError {
    fn from(r: Rejection) -> Self {
        StoreError::Rejected(r)
    }
}

impl StoreError {
    /// A backend's failure while reading or writing.
    pub fn backend(e: impl Into<BackendError>) -> Self {
        StoreError::Backend(e.into())
    }

    pub fn is_conflict(&self) -> bool {
        matches!(self, StoreError::Rejected(Rejection::Conflict { .. }))
    }

    pub fn is_not_found(&self) -> bool {
        matches!(self, StoreError::Rejected(Rejection::NotFound { .. }))
    }

    pub fn is_already_exists(&self) -> bool {
        matches!(self, StoreError::Rejected(Rejection::AlreadyExists { .. }))
    }

    pub fn rejection(&self) -> Option<&Rejection> {
        match self {
            StoreError::Rejected(r) => Some(r),
            _ => None,
        }
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;
