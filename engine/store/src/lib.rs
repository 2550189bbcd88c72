//! The cluster's store: the role etcd plays in Kubernetes.
//!
//! Objects are Kubernetes JSON keyed by (group kind, namespace, name). Every committed
//! transaction bumps one global revision, which becomes the `resourceVersion` of every object it
//! wrote. Updates compare-and-swap on `resourceVersion`; `watch(from)` replays the history after a
//! revision and then follows new commits, in commit order.
//!
//! This crate is the contract only: the [`Store`] trait and its types, typed access ([`Api`]),
//! the shared informer and label selectors. The backends (SQLite, Postgres, Raft, the store over
//! gRPC) live in `gitplane-storage`, so that what only reads and writes objects (the scheduler,
//! the controllers) links no database, Raft or gRPC code. The `conformance` feature exports the
//! suite every backend must pass.

pub mod api;
#[cfg(feature = "conformance")]
pub mod conformance;
pub mod deletion;
mod error;
pub mod events;
pub mod informer;
pub mod reflector;
pub mod selector;

pub use api::Api;
pub use error::{BackendError, Rejection, Result, StoreError};
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
    /// Replace an object's metadata, spec and status in one write, as a Pod's binding sets
    /// `spec.nodeName` and the PodScheduled condition together. Compare-and-swap as `Update`.
    UpdateWithStatus(Value),
    /// Delete an object, when `revision` is given only if it is still at that revision.
    Delete { key: ObjectKey, revision: Option<Revision> },
}

impl Op {
    pub fn key(&self) -> std::result::Result<ObjectKey, Rejection> {
        match self {
            Op::Create(v) | Op::Update(v) | Op::UpdateStatus(v) | Op::UpdateWithStatus(v) => {
                ObjectKey::from_value(v).map_err(|e| Rejection::Invalid(e.to_string()))
            }
            Op::Delete { key, .. } => Ok(key.clone()),
        }
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

/// A consistent list: every item as of `revision`. Items are objects, or (from
/// [`Store::list_json`]) each object's JSON text.
#[derive(Clone, Debug)]
pub struct List<T = Value> {
    pub revision: Revision,
    pub items: Vec<T>,
    /// Set when `limit` cut the list: pass it back for the next page.
    pub continue_token: Option<String>,
}

/// Where a page ends: the revision it was read at and the last key it passed. Part of the
/// contract, not a backend's secret, so that an API server's list cache and the store page the
/// same way and each can take up a list the other began (Kubernetes' cacher and etcd3 store
/// share their continue tokens likewise). On the wire: hex of its JSON.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContinueToken {
    pub revision: Revision,
    pub namespace: String,
    pub name: String,
}

impl ContinueToken {
    pub fn encode(&self) -> String {
        let json = serde_json::to_vec(self).unwrap_or_default();
        json.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// A token from outside: `BadRequest` unless it is one a list gave.
    pub fn decode(text: &str) -> Result<ContinueToken> {
        let bad =
            || StoreError::BadRequest(format!("invalid continue token {text:?}: pass back the one a list returned"));
        if !text.len().is_multiple_of(2) || text.len() > 4096 {
            return Err(bad());
        }
        // Byte pairs, not string slices: a token from outside need not be ASCII.
        let nibble = |b: u8| char::from(b).to_digit(16).map(|d| d as u8);
        let bytes: Option<Vec<u8>> =
            text.as_bytes().chunks(2).map(|pair| Some(nibble(pair[0])? << 4 | nibble(pair[1])?)).collect();
        serde_json::from_slice(&bytes.ok_or_else(bad)?).map_err(|_| bad())
    }
}

/// Which events a watch delivers.
#[derive(Clone, Debug, Default)]
pub struct WatchOptions {
    /// Only these group kinds; `None` for all.
    pub kinds: Option<Vec<String>>,
    /// Send a `Bookmark` with the latest revision when filtered-out commits move it on, so the
    /// watcher can resume from there.
    pub bookmarks: bool,
    /// At most how often a watch of some kinds reads past other kinds' commits, moving its
    /// position (and sending a bookmark); `None`: the store's 100 ms. A watch held by every node
    /// takes seconds, as kube-apiserver sends its watchers' bookmarks about once a minute.
    pub bookmark_interval: Option<std::time::Duration>,
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

    /// As [`Store::list`], each item as its JSON text: exactly the bytes `Value::to_string` gives
    /// for the item `list` returns (compact, keys sorted). Backends that store that text hand it
    /// out unparsed, so an API server can splice it into its answer (no parse, no serialize).
    async fn list_json(&self, kind: &str, options: &ListOptions) -> Result<List<String>> {
        let List { revision, items, continue_token } = self.list(kind, options).await?;
        Ok(List { revision, items: items.iter().map(Value::to_string).collect(), continue_token })
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continue_tokens_round_trip_and_refuse_garbage() {
        let token = ContinueToken { revision: 7, namespace: "a".into(), name: "p\"1".into() };
        assert_eq!(ContinueToken::decode(&token.encode()).unwrap(), token);
        for bad in ["zz", "abc", "00", &"ab".repeat(3000), "7\u{96}f", "+f7b"] {
            assert!(matches!(ContinueToken::decode(bad), Err(StoreError::BadRequest(_))), "{bad}");
        }
    }
}
