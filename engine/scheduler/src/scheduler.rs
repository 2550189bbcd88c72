//! The scheduling loop: pending Pods from the informer cache, snapshots of the nodes, bindings
//! written with compare-and-swap.
//!
//! A Pod is bound asynchronously, as kube-scheduler's binding cycle: the loop counts it on its
//! node at once and goes on to the next Pod while up to [`BINDS_IN_FLIGHT`] bindings commit. Each
//! binding is a transaction of its own, so a Pod deleted or bound elsewhere meanwhile fails alone;
//! the store commits the bindings waiting together in one write (SQLite's writer: one transaction
//! and one fsync per batch, each binding accepted or rejected on its own).
//!
//! Pods wait in one [`WorkQueue`], as kube-scheduler's queues, run by the work queue's loop
//! runner: a Pod that fits nowhere is parked until a change of the cluster could make room (a
//! Node changed, a bound Pod was deleted or finished) or at most [`MAX_UNSCHEDULABLE_STAY`]; a Pod
//! whose binding fails is retried after a per-Pod backoff. No failure drops a Pod.

use crate::framework::{Profile, ScheduleError};
use crate::snapshot::{PodId, Snapshot, holds_room, is_terminal, node_name};
use crate::volume_binding::{self, PodVolumes};
use futures::StreamExt;
use gitplane_api::events::{NORMAL, Source, WARNING, reference};
use gitplane_api::object::{kind_of, to_value};
use gitplane_store::events::Recorder;
use gitplane_store::{
    EventType, ObjectKey, Op, Store,
    informer::{Informer, Notification},
};
use gitplane_workqueue::{
    Backoff, WorkQueue,
    runner::{self, Reconcile, Requeue},
};
use k8s_openapi::api::core::v1::{Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod, PodCondition};
use k8s_openapi::api::storage::v1::StorageClass;
use serde::Deserialize;
use serde_json::Value;
use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::{Duration, Instant},
};
use tokio::sync::{Semaphore, mpsc};

type Queue = WorkQueue<PodId, Reason>;

/// kube-scheduler's podInitialBackoff and podMaxBackoff.
const BACKOFF: Backoff = Backoff { initial: Duration::from_secs(1), max: Duration::from_secs(10) };
/// The longest an unschedulable Pod waits for a cluster event before it is tried again. Every
/// change that can make room wakes it sooner, so this only bounds the cost of a missed one;
/// kube-scheduler waits 5 minutes, gitplane a minute, as a pass over the nodes is cheap.
pub const MAX_UNSCHEDULABLE_STAY: Duration = Duration::from_secs(60);
/// Unschedulable Pods' status writes committing at once. The loop goes on to the next Pod
/// while they commit (nothing it decides depends on them), so a burst of Pods that fit nowhere
/// shares the store's commits instead of waiting for one each.
const STATUS_WRITES_IN_FLIGHT: usize = 64;
/// Bindings committing at once: what one commit of the store takes in at most.
const BINDS_IN_FLIGHT: usize = 100;

/// Why a Pod is tried (again).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// An unbound Pod was created or changed.
    PodChanged,
    /// Every Pod again: start-up, or events were missed.
    Resync,
    /// A Node appeared, changed or left.
    NodeChanged,
    /// A claim, volume or class changed: an unbound claim may have bound.
    VolumeChanged,
    /// A Pod that held room on a node was deleted.
    PodDeleted,
    /// A bound Pod Succeeded or Failed, which frees its room.
    PodFinished,
    /// The binding failed; tried again after the Pod's backoff.
    BindFailed,
    /// An unschedulable Pod waited [`MAX_UNSCHEDULABLE_STAY`] without a cluster event.
    UnschedulableTimeout,
}

impl gitplane_workqueue::Reason for Reason {}

/// A binding's outcome, back to the loop.
pub struct Binding {
    pod_id: PodId,
    /// The Pod as bound (for the Scheduled Event's reference).
    pod: Pod,
    node: String,
    /// When its scheduling attempt started.
    started: Instant,
    result: gitplane_store::Result<()>,
}

/// What the loop observes: the informer's changes and its own bindings' outcomes.
pub enum Input {
    Cache(Notification),
    Bound(Box<Binding>),
}

pub struct Scheduler {
    store: Arc<dyn Store>,
    informer: Informer,
    profile: Profile,
    /// The nodes with the Pods they hold and the namespaces' labels, built at the first Pod and
    /// kept up to date from then on (none until then: a cluster with nothing pending keeps none).
    snapshot: Option<Snapshot>,
    /// The queued Pods that fit nowhere at their last attempt: a cluster event wakes them.
    unschedulable: HashSet<PodId>,
    /// Bindings written but not yet seen in the cache: counted on their node meanwhile (the
    /// snapshot shares the Pod).
    assumed: HashMap<PodId, (String, Arc<Pod>)>,
    /// Scheduled and FailedScheduling, as kube-scheduler records them.
    events: Recorder,
    /// Permits for [`STATUS_WRITES_IN_FLIGHT`].
    status_writes: Arc<Semaphore>,
    /// Permits for [`BINDS_IN_FLIGHT`].
    binds: Arc<Semaphore>,
    /// Where bindings report, and where the loop reads them (taken by [`Scheduler::run`]).
    bound: mpsc::UnboundedSender<Binding>,
    bindings: Option<mpsc::UnboundedReceiver<Binding>>,
}

/// Unbound and not finished: what the scheduler places.
fn needs_node(pod: &Value) -> bool {
    pod["spec"].is_object() && node_name(pod).is_none() && !is_terminal(pod)
}

impl Scheduler {
    /// The informer must watch `Pod`, `Node` and `Namespace` (what `namespaceSelector`s select).
    pub fn new(store: Arc<dyn Store>, informer: Informer, profile: Profile) -> Self {
        let (bound, bindings) = mpsc::unbounded_channel();
        Scheduler {
            binds: Arc::new(Semaphore::new(BINDS_IN_FLIGHT)),
            bound,
            bindings: Some(bindings),
            informer,
            profile,
            snapshot: None,
            unschedulable: HashSet::new(),
            assumed: HashMap::new(),
            events: Recorder::spawn(store.clone(), Source::component("default-scheduler")),
            status_writes: Arc::new(Semaphore::new(STATUS_WRITES_IN_FLIGHT)),
            store,
        }
    }

    pub async fn run(mut self) {
        let notifications = Box::pin(self.informer.notifications());
        let Some(bindings) = self.bindings.take() else { return };
        self.informer.wait_synced().await;
        // Ends with the informer's notifications.
        let inputs = futures::stream::unfold((notifications, bindings), |(mut cache, mut bound)| async move {
            let input = tokio::select! {
                Some(binding) = bound.recv() => Input::Bound(Box::new(binding)),
                notification = cache.next() => Input::Cache(notification?),
            };
            Some((input, (cache, bound)))
        });
        // Pods waiting for a node: due now, backing off, or parked unschedulable.
        let queue = WorkQueue::new(BACKOFF).named("scheduler");
        runner::run(self, queue, inputs).await;
    }

    /// Tries the unschedulable Pods again, each once its backoff is over.
    fn wake(&mut self, queue: &mut Queue, reason: Reason) {
        for pod_id in self.unschedulable.drain() {
            queue.add_after_backoff(pod_id, reason);
        }
    }

    /// The claims, volumes and classes of a Pod that names claims (nothing is read otherwise).
    fn volumes(&self, pod: &Pod) -> volume_binding::Volumes {
        if gitplane_api::volumes::pod_claims(pod).next().is_none() {
            return Default::default();
        }
        let cache = self.informer.cache();
        let namespace = pod.metadata.namespace.as_deref();
        volume_binding::Volumes {
            claims: cache
                .list_typed::<PersistentVolumeClaim>(namespace)
                .into_iter()
                .map(|c| {
                    ((c.metadata.namespace.clone().unwrap_or_default(), c.metadata.name.clone().unwrap_or_default()), c)
                })
                .collect(),
            volumes: cache.list_typed::<PersistentVolume>(None),
            classes: cache.list_typed::<StorageClass>(None),
        }
    }

    /// Binds `pod` in the background, waiting only while [`BINDS_IN_FLIGHT`] are committing; the
    /// outcome comes back as an [`Input::Bound`].
    async fn start_binding(&self, pod_id: PodId, pod: Arc<Pod>, node: String, volumes: PodVolumes, started: Instant) {
        let Ok(permit) = self.binds.clone().acquire_owned().await else { return };
        let (store, bound) = (self.store.clone(), self.bound.clone());
        tokio::spawn(async move {
            let (pod, result) = bind(&*store, &pod, &node, &volumes).await;
            drop(permit);
            // Measured at the commit, not when the loop gets to the outcome.
            crate::metrics::attempt(if result.is_ok() { "scheduled" } else { "error" }, started.elapsed());
            let _ = bound.send(Binding { pod_id, pod, node, started, result });
        });
    }

    /// A binding committed or failed: the first is recorded, the second un-counted and retried.
    fn bound(&mut self, binding: Binding, queue: &mut Queue) {
        let Binding { pod_id, pod, node, started, result } = binding;
        let name = format!("{}/{}", pod_id.0, pod_id.1);
        match result {
            Ok(()) => {
                tracing::info!(pod = %name, %node, elapsed = ?started.elapsed(), "bound");
                let message = format!("Successfully assigned {name} to {node}");
                self.events.event(reference(&pod), NORMAL, "Scheduled", &message);
            }
            Err(e) => {
                // Still assumed: the cache has not shown it bound, deleted or finished since.
                if self.assumed.get(&pod_id).is_some_and(|(n, _)| *n == node) {
                    self.assumed.remove(&pod_id);
                    if let Some(snapshot) = self.snapshot.as_mut() {
                        snapshot.uncount(&pod_id);
                    }
                }
                let backoff = queue.add_with_backoff(pod_id, Reason::BindFailed);
                if e.is_conflict() || e.is_not_found() {
                    // Our cache was behind a concurrent writer.
                    tracing::debug!(error = %e, pod = %name, ?backoff, "binding conflicted, retrying");
                } else {
                    tracing::warn!(error = %e, pod = %name, %node, ?backoff, "binding failed, retrying");
                }
            }
        }
    }

    /// Writes the PodScheduled=False condition in the background (compare-and-swap on the Pod
    /// as read, so it never overwrites a binding that came after), waiting only while
    /// [`STATUS_WRITES_IN_FLIGHT`] are committing.
    async fn mark_unschedulable(&self, pod: &Pod, name: &str, message: &str) {
        let mut status = pod.clone();
        if !set_scheduled_condition(&mut status, "False", Some("Unschedulable"), Some(message)) {
            return;
        }
        let Ok(permit) = self.status_writes.clone().acquire_owned().await else { return };
        let (store, name) = (self.store.clone(), name.to_owned());
        tokio::spawn(async move {
            if let Err(e) = store.txn(vec![Op::UpdateStatus(to_value(&status))]).await {
                tracing::debug!(error = %e, pod = %name, "recording unschedulable failed");
            }
            drop(permit);
        });
    }
}

impl Reconcile for Scheduler {
    type Key = PodId;
    type Reason = Reason;
    type Notification = Input;

    async fn resync(&mut self, queue: &mut Queue) {
        self.unschedulable.clear();
        self.snapshot = None;
        let pods = self.informer.cache().list(&kind_of::<Pod>(), None);
        for pod in pods.iter().filter(|p| needs_node(p)) {
            if let Ok(key) = ObjectKey::from_value(pod) {
                queue.add_after_backoff((key.namespace, key.name), Reason::Resync);
            }
        }
    }

    async fn observe(&mut self, input: Input, queue: &mut Queue) {
        let event = match input {
            Input::Bound(binding) => return self.bound(*binding, queue),
            Input::Cache(Notification::Resync) => return self.resync(queue).await,
            Input::Cache(Notification::Changed(event)) => event,
        };
        let object = (event.event_type != EventType::Deleted).then_some(&*event.object);
        if event.key.kind == kind_of::<Node>() {
            if let Some(snapshot) = self.snapshot.as_mut() {
                snapshot.node_changed(&event.key.name, object, self.informer.cache());
            }
            return self.wake(queue, Reason::NodeChanged);
        }
        if event.key.kind == kind_of::<Namespace>() {
            if let Some(snapshot) = self.snapshot.as_mut() {
                snapshot.namespace_changed(&event.key.name, object);
            }
            return;
        }
        let volume_kinds =
            [kind_of::<PersistentVolumeClaim>(), kind_of::<PersistentVolume>(), kind_of::<StorageClass>()];
        if volume_kinds.contains(&event.key.kind) {
            return self.wake(queue, Reason::VolumeChanged);
        }
        if event.key.kind != kind_of::<Pod>() {
            return;
        }
        let pod_id = (event.key.namespace.clone(), event.key.name.clone());
        let pod = &*event.object;
        if let Some(snapshot) = self.snapshot.as_mut() {
            let assumed = self.assumed.get(&pod_id).map(|(node, _)| node.as_str());
            snapshot.pod_changed(&pod_id, object, assumed);
        }
        if event.event_type == EventType::Deleted {
            queue.remove(&pod_id);
            self.unschedulable.remove(&pod_id);
            let assumed = self.assumed.remove(&pod_id).is_some();
            if assumed || holds_room(pod) {
                self.wake(queue, Reason::PodDeleted);
            }
        } else if needs_node(pod) {
            // A queued Pod keeps its place, its backoff or its wait for a cluster event.
            if !queue.contains(&pod_id) {
                queue.add(pod_id, Reason::PodChanged);
            }
        } else {
            // Bound (by this loop or another writer) or finished: no longer assumed.
            self.assumed.remove(&pod_id);
            queue.remove(&pod_id);
            self.unschedulable.remove(&pod_id);
            if node_name(pod).is_some() && is_terminal(pod) {
                self.wake(queue, Reason::PodFinished);
            }
        }
    }

    async fn reconcile(&mut self, pod_id: PodId, reason: Reason, _: &Queue) -> Requeue<Reason> {
        self.unschedulable.remove(&pod_id);
        if self.assumed.contains_key(&pod_id) {
            return Requeue::Done;
        }
        let value = self.informer.cache().get(&ObjectKey::of::<Pod>(&pod_id.0, &pod_id.1));
        // Decoded from the cached object as it is, without a copy of it first.
        let Some(pod) = value.filter(|v| needs_node(v)).and_then(|v| Pod::deserialize(&*v).ok()) else {
            return Requeue::Done;
        };
        let started = Instant::now();
        let name = format!("{}/{}", pod_id.0, pod_id.1);
        let mut snapshot = match self.snapshot.take() {
            Some(snapshot) => snapshot,
            None => Snapshot::build(self.informer.cache(), self.assumed.iter()),
        };
        let volumes = volume_binding::pre_filter(&pod, &self.volumes(&pod));
        let placed = match &volumes {
            Ok(volumes) => self.profile.schedule_with(&pod, snapshot.cluster(), volumes),
            Err(reason) => Err(ScheduleError::PreFilter { total: snapshot.nodes.len(), reason: reason.clone() }),
        };
        let volumes = volumes.unwrap_or_default();
        let requeue = match placed {
            Ok(node) => {
                tracing::debug!(pod = %name, %node, ?reason, "assumed");
                let pod = Arc::new(pod);
                snapshot.count(pod_id.clone(), node.clone(), pod.clone());
                self.assumed.insert(pod_id.clone(), (node.clone(), pod.clone()));
                self.start_binding(pod_id, pod, node, volumes, started).await;
                Requeue::Done
            }
            Err(unschedulable) => {
                crate::metrics::attempt("unschedulable", started.elapsed());
                tracing::info!(pod = %name, reason = %unschedulable, "unschedulable");
                self.events.event(reference(&pod), WARNING, "FailedScheduling", &unschedulable.to_string());
                self.mark_unschedulable(&pod, &name, &unschedulable.to_string()).await;
                // Parked until a cluster event (no sooner than its backoff) or the longest stay.
                self.unschedulable.insert(pod_id);
                Requeue::Park(MAX_UNSCHEDULABLE_STAY, Reason::UnschedulableTimeout)
            }
        };
        self.snapshot = Some(snapshot);
        requeue
    }
}

/// Writes `spec.nodeName` and the PodScheduled condition (one write of the Pod, compare-and-swap
/// on its resourceVersion) and the selected node of each claim that waited for it, in one
/// transaction. The Pod comes back as bound, for the Scheduled Event.
async fn bind(store: &dyn Store, pod: &Pod, node: &str, volumes: &PodVolumes) -> (Pod, gitplane_store::Result<()>) {
    let mut bound = pod.clone();
    if let Some(spec) = bound.spec.as_mut() {
        spec.node_name = Some(node.to_owned());
    }
    set_scheduled_condition(&mut bound, "True", None, None);
    // One write of the node and the condition, compare-and-swap on the Pod the cycle placed (the
    // binding subresource's one update, not a spec and a status write of the same Pod).
    let mut ops = vec![Op::UpdateWithStatus(to_value(&bound))];
    for (claim, _) in &volumes.delayed {
        let annotations = claim.metadata.annotations.as_ref();
        if annotations.and_then(|a| a.get(gitplane_api::volumes::SELECTED_NODE)).map(String::as_str) == Some(node) {
            continue;
        }
        let mut selected = claim.clone();
        selected
            .metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(gitplane_api::volumes::SELECTED_NODE.into(), node.into());
        ops.push(Op::Update(to_value(&selected)));
    }
    let result = store.txn(ops).await.map(drop);
    (bound, result)
}

/// Sets the PodScheduled condition; `false` when it already said exactly this.
fn set_scheduled_condition(pod: &mut Pod, status: &str, reason: Option<&str>, message: Option<&str>) -> bool {
    let pod_status = pod.status.get_or_insert_with(Default::default);
    if pod_status.phase.is_none() {
        pod_status.phase = Some("Pending".into());
    }
    let conditions = pod_status.conditions.get_or_insert_with(Vec::new);
    let wanted = PodCondition {
        type_: "PodScheduled".into(),
        status: status.into(),
        reason: reason.map(str::to_owned),
        message: message.map(str::to_owned),
        last_transition_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now(),
        )),
        ..Default::default()
    };
    match conditions.iter_mut().find(|c| c.type_ == "PodScheduled") {
        Some(c) if c.status == wanted.status && c.reason == wanted.reason && c.message == wanted.message => false,
        Some(c) => {
            *c = wanted;
            true
        }
        None => {
            conditions.push(wanted);
            true
        }
    }
}
