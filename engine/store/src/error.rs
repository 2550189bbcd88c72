use gitplane_api::ObjectKey;

/// Why a store operation failed. Each variant names the object it concerns.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{key} not found")]
    NotFound { key: ObjectKey },
    #[error("{key} already exists")]
    AlreadyExists { key: ObjectKey },
    #[error(
        "conflict on {key}: the update was based on resourceVersion {expected}, the object is now at {current}; read it again and retry"
    )]
    Conflict { key: ObjectKey, expected: i64, current: i64 },
    #[error(
        "revision {requested} has been compacted (history starts after {compacted}): list again and watch from the list's revision"
    )]
    Expired { requested: i64, compacted: i64 },
    #[error("{key} is {size} bytes, over the limit of {limit} bytes")]
    TooLarge { key: ObjectKey, size: usize, limit: usize },
    #[error("invalid object: {0}")]
    Invalid(String),
    #[error("corrupt store data for {key}: {source}")]
    Corrupt {
        key: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("storage backend: {0}")]
    Backend(#[from] sqlx::Error),
    #[error("migrating the store schema: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

impl StoreError {
    pub fn is_conflict(&self) -> bool {
        matches!(self, StoreError::Conflict { .. })
    }

    pub fn is_not_found(&self) -> bool {
        matches!(self, StoreError::NotFound { .. })
    }
}

pub type Result<T, E = StoreError> = std::result::Result<T, E>;
