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
mod backend;
#[cfg(test)]
mod conformance;
mod error;
pub mod informer;
pub mod postgres;
pub mod raft;
pub mod remote;
pub mod selector;
pub mod sqlite;
pub mod stage;

pub use api::Api;
pub use error::{Rejection, Result, StoreError};
pub use gitplane_api::ObjectKey;

use futures::stream::BoxStream;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::sync::Arc;

/// The global revision; also every object's `resourceVersion`.
pub type Revision = i64;

/// Largest accepted object, as etcd's default request limit.
pub const MAX_OBJECT_BYTES: usize = 1536 * 1024;

/// One write inside a transaction.
#[derive(Clone, Debug, Serialize, Deserialize)]
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
    pub fn key(&self) -> std::result::Result<ObjectKey, Rejection> {
        match self {
            Op::Create(v) | Op::Update(v) | Op::UpdateStatus(v) => {
                ObjectKey::from_value(v).map_err(|e| Rejection::Invalid(e.to_string()))
            }
            Op::Delete { key, .. } => Ok(key.clone()),
        }
    }
}

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

/// A committed transaction: its revision and the resulting objects, in op order (for a delete,
/// the object as it was).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Committed {
    pub revision: Revision,
    pub objects: Vec<Value>,
}

/// What to list.
#[derive(Clone, Debug, Default)]
pub struct ListOptions {
    /// Only this namespace; `None` lists every namespace.
    pub namespace: Option<String>,
    /// A Kubernetes label selector (`app=web,tier in (a,b)`).
    pub label_selector: Option<String>,
    /// At most this many items; the rest through `continue_token`.
    pub limit: Option<usize>,
    /// From a previous page: the next page, as of that page's revision.
    pub continue_token: Option<String>,
    /// List as of this revision instead of the latest (Kubernetes' `resourceVersionMatch=Exact`);
    /// `Expired` when compacted.
    pub at_revision: Option<Revision>,
}

/// A consistent list: every item as of `revision`.
#[derive(Clone, Debug)]
pub struct List {
    pub revision: Revision,
    pub items: Vec<Value>,
    /// Set when `limit` cut the list: pass it back for the next page.
    pub continue_token: Option<String>,
}

/// Which events a watch delivers.
#[derive(Clone, Debug, Default)]
pub struct WatchOptions {
    /// Only these group kinds; `None` for all.
    pub kinds: Option<Vec<String>>,
    /// Send a `Bookmark` with the latest revision when filtered-out commits move it on, so the
    /// watcher can resume from there.
    pub bookmarks: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
    /// No change: the watch has seen every commit up to this revision.
    Bookmark,
}

impl EventType {
    fn code(self) -> i64 {
        match self {
            EventType::Added => 0,
            EventType::Modified => 1,
            EventType::Deleted | EventType::Bookmark => Self::DELETED_CODE,
        }
    }

    fn from_code(code: i64) -> Self {
        match code {
            0 => EventType::Added,
            1 => EventType::Modified,
            _ => EventType::Deleted,
        }
    }

    pub(crate) const DELETED_CODE: i64 = 2;

    /// The Kubernetes watch event type.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
            EventType::Bookmark => "BOOKMARK",
        }
    }
}

/// One change, as a watcher sees it. For `Deleted`, `object` is the last state with
/// `resourceVersion` set to the deleting revision. A `Bookmark` has an empty key and object.
/// The object is shared: fanning an event out to watchers and informers copies no JSON.
#[derive(Clone, Debug)]
pub struct Event {
    pub revision: Revision,
    pub event_type: EventType,
    pub key: ObjectKey,
    pub object: Arc<Value>,
}

impl Event {
    pub fn bookmark(revision: Revision) -> Event {
        Event { revision, event_type: EventType::Bookmark, key: ObjectKey::default(), object: Arc::new(Value::Null) }
    }
}

pub type WatchStream = BoxStream<'static, Result<Event>>;

/// The store contract every backend fulfils (and the conformance tests check).
#[async_trait::async_trait]
pub trait Store: Send + Sync + 'static {
    async fn get(&self, key: &ObjectKey) -> Result<Option<Value>>;

    /// The objects of a group kind that match `options`, as of one revision, a page at a time.
    async fn list(&self, kind: &str, options: &ListOptions) -> Result<List>;

    /// Applies the ops atomically under one new revision: all or nothing.
    async fn txn(&self, ops: Vec<Op>) -> Result<Committed>;

    /// The events after `from`, in order, then every later commit. `Expired` when `from` is
    /// older than the compacted history.
    async fn watch(&self, from: Revision, options: WatchOptions) -> Result<WatchStream>;

    /// The latest committed revision.
    async fn revision(&self) -> Result<Revision>;

    /// After it returns, reads from this store observe every write committed anywhere before the
    /// call (a linearizable read point). A single-writer store is always there.
    async fn barrier(&self) -> Result<()> {
        Ok(())
    }

    /// Forgets the history at and below `revision`, as etcd does: the version of every object
    /// alive at `revision` stays, so lists at later revisions remain possible.
    async fn compact(&self, revision: Revision) -> Result<()>;
}
