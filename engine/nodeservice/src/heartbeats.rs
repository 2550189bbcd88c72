//! Node Lease renewals written together, as a group commit: renewals that arrive within a few
//! milliseconds of each other share one store transaction (one Raft entry, one SQLite commit).
//! 5,000 nodes renewing every 10 s are 500 renewals a second; one write each made the store's
//! per-write cost, not the renewal, what heartbeats cost.
//!
//! A batch is all or nothing: when it fails (a Lease changed or deleted since this replica wrote
//! it, a leader change), each of its renewals is answered `None` and goes the single-write way,
//! which reads the Lease and reports its own error.

use gitplane_api::object::{from_value, to_value};
use gitplane_store::{Op, Store};
use k8s_openapi::api::coordination::v1::Lease;
use std::{sync::Arc, time::Duration};
use tokio::sync::{mpsc, oneshot};

/// How long the first renewal of a batch waits for others: nothing next to the 10 s period.
const LINGER: Duration = Duration::from_millis(10);
/// The most renewals in one transaction.
const MAX_BATCH: usize = 512;

struct Renewal {
    lease: Lease,
    done: oneshot::Sender<Option<Lease>>,
}

#[derive(Clone)]
pub(crate) struct Heartbeats {
    queue: mpsc::UnboundedSender<Renewal>,
}

impl Heartbeats {
    /// Starts the batching task (within a tokio runtime); it ends with the last handle.
    pub fn spawn(store: Arc<dyn Store>) -> Self {
        let (queue, renewals) = mpsc::unbounded_channel();
        tokio::spawn(gather(store, renewals));
        Heartbeats { queue }
    }

    /// Writes `lease` (a compare-and-swap on its resourceVersion) with the renewals around it:
    /// the stored Lease, or `None` when the batch failed.
    pub async fn renew(&self, lease: Lease) -> Option<Lease> {
        let (done, written) = oneshot::channel();
        self.queue.send(Renewal { lease, done }).ok()?;
        written.await.ok().flatten()
    }
}

async fn gather(store: Arc<dyn Store>, mut renewals: mpsc::UnboundedReceiver<Renewal>) {
    while let Some(first) = renewals.recv().await {
        let mut batch = vec![first];
        let deadline = tokio::time::Instant::now() + LINGER;
        while batch.len() < MAX_BATCH {
            match tokio::time::timeout_at(deadline, renewals.recv()).await {
                Ok(Some(renewal)) => batch.push(renewal),
                Ok(None) | Err(_) => break,
            }
        }
        // The next batch gathers while this one is written.
        tokio::spawn(write(store.clone(), batch));
    }
}

async fn write(store: Arc<dyn Store>, batch: Vec<Renewal>) {
    let ops = batch.iter().map(|r| Op::Update(to_value(&r.lease))).collect();
    let written = match store.txn(ops).await {
        Ok(committed) => committed.objects,
        Err(e) => {
            tracing::debug!(renewals = batch.len(), error = %e, "batched Lease renewals failed; renewing one by one");
            Vec::new()
        }
    };
    let mut written = written.into_iter();
    for renewal in batch {
        let lease = written.next().and_then(|v| from_value::<Lease>(v).ok());
        let _ = renewal.done.send(lease);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gitplane_api::object::NODE_LEASE_NAMESPACE;
    use gitplane_storage::sqlite::SqliteStore;
    use gitplane_store::{Api, ObjectKey};
    use k8s_openapi::{api::coordination::v1::LeaseSpec, apimachinery::pkg::apis::meta::v1::ObjectMeta};

    fn lease(name: &str) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(NODE_LEASE_NAMESPACE.into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec { holder_identity: Some(name.into()), ..Default::default() }),
        }
    }

    #[tokio::test]
    async fn renewals_together_share_a_revision_and_a_stale_one_fails_its_batch() {
        let store: Arc<dyn Store> = Arc::new(SqliteStore::memory().await.unwrap());
        let api = Api::<Lease>::new(store.clone());
        let mut created = Vec::new();
        for name in ["n1", "n2", "n3"] {
            created.push(api.create(&lease(name)).await.unwrap());
        }
        let heartbeats = Heartbeats::spawn(store.clone());
        let renewed = futures::future::join_all(created.iter().cloned().map(|l| heartbeats.renew(l))).await;
        let revisions: Vec<_> =
            renewed.iter().map(|l| l.as_ref().and_then(|l| l.metadata.resource_version.clone())).collect();
        assert!(revisions.iter().all(|r| r.is_some() && *r == revisions[0]), "one transaction: {revisions:?}");

        // n1 as first written is stale now: its batch fails whole and nothing of it is applied.
        let stale = created[0].clone();
        let fresh = renewed[1].clone().unwrap();
        let (a, b) = tokio::join!(heartbeats.renew(stale), heartbeats.renew(fresh.clone()));
        assert!(a.is_none() && b.is_none(), "all or nothing");
        let stored = store.get(&ObjectKey::of::<Lease>(NODE_LEASE_NAMESPACE, "n2")).await.unwrap().unwrap();
        assert_eq!(stored["metadata"]["resourceVersion"], fresh.metadata.resource_version.unwrap());
    }
}
