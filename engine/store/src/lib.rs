//! The cluster's store: the role etcd plays in Kubernetes.
//!
//! Objects are Kubernetes JSON keyed by (group kind, namespace, name). Every committed
//! transaction bumps one global revision, which becomes the `resourceVersion` of every object it
//! wrote. Updates compare-and-swap on `resourceVersion`; `watch(from)` replays the history after a
//! revision and then follows new commits, in commit order.
//!
//! Backends implement [`Store`]; the rules that turn an [`Op`] into a stored object live in
//! [`stage`] so every backend applies them identically (a requirement once Raft replays the same
//! transaction on every replica).

pub mod api;
#[cfg(test)]
mod conformance;
mod error;
pub mod informer;
pub mod sqlite;
pub mod stage;

pub use api::Api;
pub use error::{Result, StoreError};
pub use gitplane_api::ObjectKey;

use futures::stream::BoxStream;
use serde_json::Value;

/// The global revision; also every object's `resourceVersion`.
pub type Revision = i64;

/// Largest accepted object, as etcd's default request limit.
pub const MAX_OBJECT_BYTES: usize = 1536 * 1024;

/// One write inside a transaction.
#[derive(Clone, Debug)]
pub enum Op {
    /// Create an object; fails with `AlreadyExists`.
    Create(Value),
    /// Replace an object's metadata and spec, keeping its stored status. Compare-and-swap when the
    /// value carries `metadata.resourceVersion`.
    Update(Value),
    /// Replace only an object's status (the status subresource). Compare-and-swap as `Update`.
    UpdateStatus(Value),
    /// Delete an object, when `revision` is given only if it is still at that revision.
    Delete { key: ObjectKey, revision: Option<Revision> },
}

impl Op {
    pub fn key(&self) -> Result<ObjectKey> {
        match self {
            Op::Create(v) | Op::Update(v) | Op::UpdateStatus(v) => {
                ObjectKey::from_value(v).map_err(|e| StoreError::Invalid(e.to_string()))
            }
            Op::Delete { key, .. } => Ok(key.clone()),
        }
    }
}

/// A committed transaction: its revision and the resulting objects, in op order (for a delete,
/// the object as it was).
#[derive(Clone, Debug)]
pub struct Committed {
    pub revision: Revision,
    pub objects: Vec<Value>,
}

/// What to list.
#[derive(Clone, Debug, Default)]
pub struct ListOptions {
    /// Only this namespace; `None` lists every namespace.
    pub namespace: Option<String>,
}

/// A consistent list: every item as of `revision`.
#[derive(Clone, Debug)]
pub struct List {
    pub revision: Revision,
    pub items: Vec<Value>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    fn code(self) -> i64 {
        match self {
            EventType::Added => 0,
            EventType::Modified => 1,
            EventType::Deleted => 2,
        }
    }

    fn from_code(code: i64) -> Self {
        match code {
            0 => EventType::Added,
            1 => EventType::Modified,
            _ => EventType::Deleted,
        }
    }

    /// The Kubernetes watch event type.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change, as a watcher sees it. For `Deleted`, `object` is the last state with
/// `resourceVersion` set to the deleting revision.
#[derive(Clone, Debug)]
pub struct Event {
    pub revision: Revision,
    pub event_type: EventType,
    pub key: ObjectKey,
    pub object: Value,
}

pub type WatchStream = BoxStream<'static, Result<Event>>;

/// The store contract every backend fulfils (and the conformance tests check).
#[async_trait::async_trait]
pub trait Store: Send + Sync + 'static {
    async fn get(&self, key: &ObjectKey) -> Result<Option<Value>>;

    /// Every object of a group kind, optionally in one namespace, as of one revision.
    async fn list(&self, kind: &str, options: &ListOptions) -> Result<List>;

    /// Applies the ops atomically under one new revision: all or nothing.
    async fn txn(&self, ops: Vec<Op>) -> Result<Committed>;

    /// The events after `from`, in order, then every later commit. `Expired` when `from` is
    /// older than the compacted history.
    async fn watch(&self, from: Revision) -> Result<WatchStream>;

    /// The latest committed revision.
    async fn revision(&self) -> Result<Revision>;

    /// Forgets the history at and below `revision`.
    async fn compact(&self, revision: Revision) -> Result<()>;
}
