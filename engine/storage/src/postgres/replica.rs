//! One gitplane replica on the shared database: the lease decides the one active leader, whose
//! writes are fenced with its token; the other replicas read the database directly and forward
//! writes to the leader, as Raft followers do.

use super::{Fence, LeaderLease, PostgresStore};
use crate::{
    encryption::Keyring,
    remote::{PeerToken, RemoteStore},
};
use gitplane_store::{
    Committed, List, ListOptions, ObjectKey, Op, Result, Revision, Store, StoreError, WatchOptions, WatchStream,
};
use serde_json::Value;
use std::{collections::BTreeMap, sync::Arc, time::Duration};
use tokio::sync::watch;

/// How long a write waits for a leader before giving up.
const WRITE_DEADLINE: Duration = Duration::from_secs(10);

#[derive(Clone)]
pub struct PostgresReplica {
    inner: Arc<Inner>,
}

struct Inner {
    id: u64,
    holder: String,
    store: PostgresStore,
    token: watch::Receiver<Option<u64>>,
    leading: watch::Receiver<bool>,
    peers: BTreeMap<u64, RemoteStore>,
    peer_token: PeerToken,
}

/// The replica id in a lease holder name (`<id>/<incarnation>`).
fn holder_id(holder: &str) -> Option<u64> {
    holder.split_once('/')?.0.parse().ok()
}

impl PostgresReplica {
    /// Joins the election as replica `id` of `peers` (id -> `host:port`), with a lease of `ttl`;
    /// writes are forwarded to the leader with `peer_token`.
    pub async fn start(
        url: &str,
        id: u64,
        peers: &BTreeMap<u64, String>,
        ttl: Duration,
        peer_token: PeerToken,
        secrets: Keyring,
    ) -> Result<PostgresReplica> {
        let store = PostgresStore::connect_encrypted(url, secrets).await?;
        // One holder name per process incarnation: a restarted replica never mistakes an old
        // grant for its own.
        let holder = format!("{id}/{}", uuid::Uuid::new_v4());
        let token = LeaderLease::campaign(store.pool().clone(), holder.clone(), ttl, ttl / 3)?;
        let (leading_tx, leading) = watch::channel(false);
        let mut tokens = token.clone();
        tokio::spawn(async move {
            loop {
                let held = tokens.borrow_and_update().is_some();
                leading_tx.send_if_modified(|l| std::mem::replace(l, held) != held);
                if tokens.changed().await.is_err() {
                    return;
                }
            }
        });
        let peers = peers
            .iter()
            .filter(|(peer, _)| **peer != id)
            .map(|(peer, addr)| Ok((*peer, RemoteStore::with_token(&[PeerToken::url(addr)], peer_token.clone())?)))
            .collect::<Result<_>>()?;
        Ok(PostgresReplica { inner: Arc::new(Inner { id, holder, store, token, leading, peers, peer_token }) })
    }

    /// The store on the shared database.
    pub fn store(&self) -> &PostgresStore {
        &self.inner.store
    }

    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// What this replica's store service requires, and what it forwards writes with.
    pub fn peer_token(&self) -> &PeerToken {
        &self.inner.peer_token
    }

    /// True while this replica holds the lease.
    pub fn leading(&self) -> watch::Receiver<bool> {
        self.inner.leading.clone()
    }

    /// The replica that holds the lease now, by the database.
    pub async fn leader(&self) -> Result<Option<u64>> {
        let state = LeaderLease::state(self.inner.store.pool()).await?;
        Ok(state.expires_in.and_then(|_| holder_id(&state.holder)))
    }
}

#[async_trait::async_trait]
impl Store for PostgresReplica {
    async fn get(&self, key: &ObjectKey) -> Result<Option<Value>> {
        self.inner.store.get(key).await
    }

    async fn list(&self, kind: &str, options: &ListOptions) -> Result<List> {
        self.inner.store.list(kind, options).await
    }

    async fn list_json(&self, kind: &str, options: &ListOptions) -> Result<List<String>> {
        self.inner.store.list_json(kind, options).await
    }

    async fn txn(&self, ops: Vec<Op>) -> Result<Committed> {
        let deadline = tokio::time::Instant::now() + WRITE_DEADLINE;
        loop {
            let token = *self.inner.token.borrow();
            let result = match token {
                Some(token) => {
                    self.inner.store.fenced(Fence::new(self.inner.holder.clone(), token)).txn(ops.clone()).await
                }
                None => match self.leader().await? {
                    Some(id) if id == self.inner.id => Err(StoreError::NotLeader("the lease is being renewed".into())),
                    Some(id) => match self.inner.peers.get(&id) {
                        Some(peer) => peer.txn(ops.clone()).await,
                        None => Err(StoreError::NotLeader(format!("the lease holder {id} is not a known peer"))),
                    },
                    None => Err(StoreError::NotLeader("no replica holds the leader lease".into())),
                },
            };
            match result {
                Err(e @ (StoreError::NotLeader(_) | StoreError::Fenced { .. })) => {
                    if tokio::time::Instant::now() >= deadline {
                        return Err(StoreError::Unavailable(format!("no leader took the write in time: {e}")));
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                other => return other,
            }
        }
    }

    async fn watch(&self, from: Revision, options: WatchOptions) -> Result<WatchStream> {
        self.inner.store.watch(from, options).await
    }

    async fn revision(&self) -> Result<Revision> {
        self.inner.store.revision().await
    }

    /// Every replica reads the one database: a read after a commit sees it.
    async fn barrier(&self) -> Result<()> {
        Ok(())
    }

    async fn compact(&self, revision: Revision) -> Result<()> {
        // One compactor for the shared history: the leader.
        let token = *self.inner.token.borrow();
        match token {
            Some(token) => {
                self.inner.store.fenced(Fence::new(self.inner.holder.clone(), token)).compact(revision).await
            }
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holder_names_carry_the_replica_id() {
        assert_eq!(holder_id("2/9b1c"), Some(2));
        assert_eq!(holder_id(""), None);
        assert_eq!(holder_id("x/1"), None);
    }
}
