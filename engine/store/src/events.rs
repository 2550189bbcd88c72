//! The Event writer every control-plane component shares (client-go's `EventBroadcaster` and
//! its sink): components hand [`Record`]s to a [`Recorder`] without waiting, one task correlates
//! them ([`gitplane_api::events::Correlator`]) and writes what changed once a second, in one
//! transaction. A record repeated many times within a second costs one write; a flood from one
//! object is cut by the spam filter; a full queue drops records rather than slow a component.
//! [`collect_garbage`] is the TTL: the leader deletes Events nothing happened to for that long.

use crate::{ListOptions, ObjectKey, Op, Result, Revision, Store};
use gitplane_api::events::{self, Correlator, Outcome, Record, Source};
use gitplane_api::k8s_openapi::{
    api::core::v1::{Event, ObjectReference},
    jiff::Timestamp,
};
use gitplane_api::object::{from_value, to_value};
use std::{collections::HashMap, sync::Arc, time::Duration};
use tokio::sync::mpsc;

/// How long records gather before one write.
const FLUSH_INTERVAL: Duration = Duration::from_secs(1);
/// Records waiting for the writer; beyond, new ones are dropped (with a log line).
const QUEUE: usize = 4096;
/// Events written in one transaction.
const BATCH: usize = 256;
/// Names this writer remembers having written; beyond, it forgets them all and relearns.
const KNOWN: usize = 8192;
/// Events deleted in one transaction of the garbage pass.
const DELETE_BATCH: usize = 500;

/// A component's handle; cheap to clone. Dropping every clone ends the writer.
#[derive(Clone, Debug)]
pub struct Recorder {
    source: Source,
    tx: mpsc::Sender<Record>,
}

impl Recorder {
    /// Starts the writer of `source`'s Events into `store`.
    pub fn spawn(store: Arc<dyn Store>, source: Source) -> Recorder {
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(write(store, rx));
        Recorder { source, tx }
    }

    /// Records an Event about `involved` from this recorder's source (client-go's `Event`).
    pub fn event(&self, involved: ObjectReference, type_: &str, reason: &str, message: &str) {
        self.record(Record::new(self.source.clone(), involved, type_, reason, message));
    }

    /// Records an Event with its own source (the node service writes for every node).
    pub fn record(&self, record: Record) {
        if let Err(mpsc::error::TrySendError::Full(r)) = self.tx.try_send(record) {
            tracing::warn!(reason = %r.reason, object = ?r.involved.name, "event queue full: event dropped");
        }
    }
}

/// What this writer knows of a name it wrote: nothing more (it made the Event), or the Event a
/// previous writer had left there, whose count its own adds to.
type Known = HashMap<String, Option<Event>>;

async fn write(store: Arc<dyn Store>, mut rx: mpsc::Receiver<Record>) {
    let mut correlator = Correlator::new(Default::default());
    let mut known = Known::new();
    while let Some(first) = rx.recv().await {
        let mut pending: HashMap<String, Event> = HashMap::new();
        take(&mut correlator, &mut pending, first);
        let deadline = tokio::time::Instant::now() + FLUSH_INTERVAL;
        while pending.len() < BATCH {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(record)) => take(&mut correlator, &mut pending, record),
                Ok(None) | Err(_) => break,
            }
        }
        if known.len() > KNOWN {
            known.clear();
        }
        flush(&*store, pending.into_values().collect(), &mut known).await;
    }
}

/// The record's Event joins the batch, replacing an earlier state of the same Event.
fn take(correlator: &mut Correlator, pending: &mut HashMap<String, Event>, record: Record) {
    if let Outcome::Write(event) = correlator.observe(&record) {
        pending.insert(event.metadata.name.clone().unwrap_or_default(), *event);
    }
}

fn adopted(mut event: Event, known: &Known) -> Event {
    if let Some(Some(base)) = event.metadata.name.as_ref().and_then(|n| known.get(n)) {
        events::adopt(&mut event, base);
    }
    event
}

/// One transaction for the batch; when it fails (an Event this writer took for new exists, or
/// one it wrote was collected), each Event on its own.
async fn flush(store: &dyn Store, batch: Vec<Event>, known: &mut Known) {
    if batch.is_empty() {
        return;
    }
    let ops = batch
        .iter()
        .map(|e| {
            let name = e.metadata.name.as_deref().unwrap_or_default();
            if known.contains_key(name) {
                Op::Update(to_value(&adopted(e.clone(), known)))
            } else {
                Op::Create(to_value(e))
            }
        })
        .collect();
    if store.txn(ops).await.is_ok() {
        for e in &batch {
            known.entry(e.metadata.name.clone().unwrap_or_default()).or_insert(None);
        }
        return;
    }
    for event in batch {
        if let Err(e) = write_one(store, event, known).await {
            tracing::warn!(error = %e, "recording an event failed");
        }
    }
}

async fn write_one(store: &dyn Store, event: Event, known: &mut Known) -> Result<()> {
    let name = event.metadata.name.clone().unwrap_or_default();
    let key = ObjectKey::of::<Event>(events::namespace_of(&event.involved_object), &name);
    for _ in 0..3 {
        let op = if known.contains_key(&name) {
            Op::Update(to_value(&adopted(event.clone(), known)))
        } else {
            Op::Create(to_value(&event))
        };
        match store.txn(vec![op]).await {
            Ok(_) => {
                known.entry(name).or_insert(None);
                return Ok(());
            }
            Err(e) if e.is_not_found() => {
                known.remove(&name);
            }
            Err(e) if e.is_already_exists() => {
                let stored = store.get(&key).await?.map(from_value::<Event>).transpose();
                let stored = stored.map_err(|e| crate::Rejection::Invalid(e.to_string()))?;
                known.insert(name.clone(), stored);
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Deletes the Events that nothing happened to for `ttl`, a page at a time (kube-apiserver's
/// `--event-ttl`, there an etcd lease). An Event written meanwhile is kept (the delete compares
/// its revision). Returns how many went.
pub async fn collect_garbage(store: &dyn Store, ttl: Duration, now: Timestamp) -> Result<usize> {
    let mut deleted = 0;
    let mut options = ListOptions { limit: Some(DELETE_BATCH), ..Default::default() };
    loop {
        let page = store.list("Event", &options).await?;
        let expired: Vec<(ObjectKey, Revision)> = page
            .items
            .into_iter()
            .filter_map(|v| {
                let key = ObjectKey::from_value(&v).ok()?;
                let event = from_value::<Event>(v).ok()?;
                let revision = event.metadata.resource_version.as_deref()?.parse().ok()?;
                events::expired(&event, now, ttl).then_some((key, revision))
            })
            .collect();
        let ops = expired.iter().map(|(key, revision)| Op::Delete { key: key.clone(), revision: Some(*revision) });
        if !expired.is_empty() {
            if store.txn(ops.collect()).await.is_ok() {
                deleted += expired.len();
            } else {
                // One was renewed or deleted meanwhile: the others go one by one.
                for (key, revision) in expired {
                    if store.txn(vec![Op::Delete { key, revision: Some(revision) }]).await.is_ok() {
                        deleted += 1;
                    }
                }
            }
        }
        match page.continue_token {
            Some(token) => options.continue_token = Some(token),
            None => return Ok(deleted),
        }
    }
}

/// The garbage pass every `ttl / 2` (at least every second, at most every minute), until dropped.
pub async fn run_garbage_collector(store: Arc<dyn Store>, ttl: Duration) {
    let period = (ttl / 2).clamp(Duration::from_secs(1), Duration::from_secs(60));
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        match collect_garbage(&*store, ttl, Timestamp::now()).await {
            Ok(0) => {}
            Ok(n) => tracing::debug!(deleted = n, "expired events collected"),
            Err(e) => tracing::warn!(error = %e, "collecting expired events failed"),
        }
    }
}
