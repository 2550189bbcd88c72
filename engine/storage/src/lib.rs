//! The store's backends: SQLite (embedded), Postgres (shared), Raft (SQLite replicated with
//! openraft) and the store over gRPC (`remote`). Each implements `gitplane_store::Store`, the
//! contract; the rules that turn an [`Op`] into a stored object live in [`stage`] so every
//! backend applies them identically (a requirement once Raft replays the same transaction on
//! every replica).
//!
//! Backends convert their own errors (sqlx, tonic, openraft) into `StoreError` here, at their
//! boundary: the contract names none of their types.

mod backend;
pub mod encryption;
#[cfg(test)]
mod encryption_tests;
pub mod postgres;
pub mod raft;
pub mod remote;
pub mod sqlite;
pub mod stage;

use gitplane_store::{Op, StoreError};
use serde::{Deserialize, Serialize};

/// A transaction as every backend and replica applies it: the ops, plus what must not differ
/// between replicas (the time and the uids of created objects), decided once by the proposer.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Txn {
    pub ops: Vec<Op>,
    /// RFC 3339, for `creationTimestamp`.
    pub time: String,
    /// One per `Op::Create`, in order.
    pub uids: Vec<String>,
}

impl Txn {
    /// Stamps `ops` with the current time and fresh uids.
    pub fn new(ops: Vec<Op>) -> Txn {
        let uids =
            ops.iter().filter(|op| matches!(op, Op::Create(_))).map(|_| uuid::Uuid::new_v4().to_string()).collect();
        let time = k8s_openapi::jiff::Timestamp::now()
            .round(k8s_openapi::jiff::Unit::Second)
            .map(|t| t.to_string())
            .unwrap_or_default();
        Txn { ops, time, uids }
    }
}

/// A database error, as the store reports it.
pub(crate) fn db(e: sqlx::Error) -> StoreError {
    StoreError::backend(e)
}

/// A failed schema migration, as the store reports it.
pub(crate) fn migrate(e: sqlx::migrate::MigrateError) -> StoreError {
    StoreError::Migrate(Box::new(e))
}
