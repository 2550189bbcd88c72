//! The kubelet's Events (Pulling, Pulled, Created, Started, Killing, BackOff, Unhealthy,
//! FailedMount, ...). The pod workers, the runtime manager and the prober hand them to a
//! [`Recorder`] without waiting; one task passes them through client-go's spam filter (a burst of
//! 25 per object, then one per 5 minutes) and sends what is left to the node service in batches
//! (`CreateEvents`), where the control plane counts repeats on one Event. A full queue or an
//! unreachable control plane drops Events rather than slow a Pod.

use crate::controlplane::Servers;
use gitplane_api::events::{Correlator, Record, Source, reference};
use gitplane_proto::node::{CreateEventsRequest, NodeEvent};
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use std::{collections::HashMap, time::Duration};
use tokio::sync::mpsc;

/// Records waiting to be sent.
const QUEUE: usize = 1024;
/// How long records gather before one call.
const BATCH_INTERVAL: Duration = Duration::from_secs(1);
/// The node service's limit per call.
const BATCH: usize = 256;

/// Where the agent's components record Events; cheap to clone.
#[derive(Clone, Debug)]
pub struct Recorder {
    tx: mpsc::Sender<Record>,
}

impl Recorder {
    /// A recorder whose Events go nowhere (a runtime without a control plane: tests, benchmarks).
    pub fn disabled() -> Recorder {
        Recorder { tx: mpsc::channel(1).0 }
    }

    /// Starts the sender to the control plane for node `node_name`.
    pub(crate) fn spawn(servers: Servers, node_name: String) -> Recorder {
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(send(rx, servers, node_name));
        Recorder { tx }
    }

    /// An Event about `pod`.
    pub fn pod(&self, pod: &Pod, type_: &str, reason: &str, message: &str) {
        self.object(reference(pod), type_, reason, message);
    }

    /// An Event about `involved` (a Pod or the node's own Node).
    pub fn object(&self, involved: ObjectReference, type_: &str, reason: &str, message: &str) {
        // The control plane sets the source from the caller's credential.
        let record = Record::new(Source::component("kubelet"), involved, type_, reason, message);
        if let Err(mpsc::error::TrySendError::Full(r)) = self.tx.try_send(record) {
            tracing::debug!(reason = %r.reason, "event queue full: event dropped");
        }
    }
}

async fn send(mut rx: mpsc::Receiver<Record>, servers: Servers, node_name: String) {
    let mut spam = Correlator::new(Default::default());
    while let Some(first) = rx.recv().await {
        let mut batch = Vec::new();
        let mut take = |record: Record, batch: &mut Vec<NodeEvent>| {
            if spam.allow(&record) {
                batch.push(NodeEvent {
                    involved_object: serde_json::to_vec(&record.involved).unwrap_or_default(),
                    r#type: record.type_,
                    reason: record.reason,
                    message: record.message,
                    time_unix_millis: record.time.as_millisecond(),
                });
            }
        };
        take(first, &mut batch);
        let deadline = tokio::time::Instant::now() + BATCH_INTERVAL;
        while batch.len() < BATCH {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(record)) => take(record, &mut batch),
                Ok(None) | Err(_) => break,
            }
        }
        if batch.is_empty() {
            continue;
        }
        if create(&servers, &node_name, batch.clone()).await == Err(tonic::Code::PermissionDenied) {
            // A Pod deleted meanwhile refuses the whole batch: the other Pods' Events go on
            // their own, a call per Pod.
            let mut by_object: HashMap<Vec<u8>, Vec<NodeEvent>> = HashMap::new();
            for event in batch {
                by_object.entry(event.involved_object.clone()).or_default().push(event);
            }
            if by_object.len() > 1 {
                for events in by_object.into_values() {
                    let _ = create(&servers, &node_name, events).await;
                }
            }
        }
    }
}

/// One `CreateEvents`, on a second replica if the first fails; then the Events are dropped
/// (they are best effort).
async fn create(servers: &Servers, node_name: &str, events: Vec<NodeEvent>) -> Result<(), tonic::Code> {
    let mut outcome = Ok(());
    for _ in 0..2 {
        let (server, mut client) = servers.get();
        let request = CreateEventsRequest { node_name: node_name.to_owned(), events: events.clone() };
        match client.create_events(request).await {
            Ok(_) => return Ok(()),
            Err(status) => {
                tracing::info!(error = %status.message(), events = events.len(), "recording events failed");
                outcome = Err(status.code());
                if matches!(status.code(), tonic::Code::PermissionDenied | tonic::Code::InvalidArgument) {
                    break; // another replica answers the same
                }
                servers.failed(server);
            }
        }
    }
    outcome
}
