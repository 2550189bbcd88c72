//! The scheduling loop: pending Pods from the informer cache, snapshots of the nodes, bindings
//! written with compare-and-swap.
//!
//! Pods wait in one [`WorkQueue`], as kube-scheduler's queues, run by the work queue's loop
//! runner: a Pod that fits nowhere is parked until a change of the cluster could make room (a
//! Node changed, a bound Pod was deleted or finished) or at most [`MAX_UNSCHEDULABLE_STAY`]; a Pod
//! whose binding fails is retried after a per-Pod backoff, one that lost a compare-and-swap
//! soon. No failure drops a Pod.

use crate::framework::{NamespaceLabels, NodeInfo, Profile, ScheduleError};
use crate::volume_binding::{self, PodVolumes};
use gitplane_api::events::{NORMAL, Source, WARNING, reference};
use gitplane_api::object::{from_value, kind_of, to_value};
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
use serde_json::Value;
use std::{
    collections::{HashMap, HashSet},
    sync::Arc,
    time::Duration,
};
use tokio::sync::Semaphore;

type PodId = (String, String);
type Queue = WorkQueue<PodId, Reason>;

/// kube-scheduler's podInitialBackoff and podMaxBackoff.
const BACKOFF: Backoff = Backoff { initial: Duration::from_secs(1), max: Duration::from_secs(10) };
/// A binding that lost its compare-and-swap is tried again after this, without growing the
/// Pod's backoff.
const CONFLICT_RETRY: Duration = Duration::from_millis(100);
/// The longest an unschedulable Pod waits for a cluster event before it is tried again. Every
/// change that can make room wakes it sooner, so this only bounds the cost of a missed one;
/// kube-scheduler waits 5 minutes, gitplane a minute, as a pass over the nodes is cheap.
pub const MAX_UNSCHEDULABLE_STAY: Duration = Duration::from_secs(60);
/// Unschedulable Pods' status writes committing at once. The loop goes on to the next Pod
/// while they commit (nothing it decides depends on them), so a burst of Pods that fit nowhere
/// shares the store's commits instead of waiting for one each.
const STATUS_WRITES_IN_FLIGHT: usize = 64;

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
    /// The binding failed; tried again after the Pod's backoff (a conflict: soon).
    BindFailed,
    /// An unschedulable Pod waited [`MAX_UNSCHEDULABLE_STAY`] without a cluster event.
    UnschedulableTimeout,
}

impl gitplane_workqueue::Reason for Reason {}

pub struct Scheduler {
    store: Arc<dyn Store>,
    informer: Informer,
    profile: Profile,
    /// The nodes as the Pods scheduled since it was taken left them, and the namespaces' labels,
    /// kept until an event other than one of its own bindings showing in the cache could change
    /// it: Pods that arrive one at a time must not rebuild it (decoding every bound Pod) each.
    snapshot: Option<(Vec<NodeInfo>, NamespaceLabels)>,
    /// The queued Pods that fit nowhere at their last attempt: a cluster event wakes them.
    unschedulable: HashSet<PodId>,
    /// Bindings written but not yet seen in the cache: counted on their node meanwhile.
    assumed: HashMap<PodId, (String, Pod)>,
    /// Scheduled and FailedScheduling, as kube-scheduler records them.
    events: Recorder,
    /// Permits for [`STATUS_WRITES_IN_FLIGHT`].
    status_writes: Arc<Semaphore>,
}

fn is_terminal(pod: &Value) -> bool {
    matches!(pod["status"]["phase"].as_str(), Some("Succeeded" | "Failed"))
}

fn node_name(pod: &Value) -> Option<&str> {
    pod["spec"]["nodeName"].as_str().filter(|n| !n.is_empty())
}

/// Unbound and not finished: what the scheduler places.
fn needs_node(pod: &Value) -> bool {
    pod["spec"].is_object() && node_name(pod).is_none() && !is_terminal(pod)
}

/// Holds room on its node: bound and not finished (kube-scheduler's informer lists Pods with
/// `status.phase!=Succeeded,status.phase!=Failed`).
fn holds_room(pod: &Value) -> bool {
    node_name(pod).is_some() && !is_terminal(pod)
}

impl Scheduler {
    /// The informer must watch `Pod`, `Node` and `Namespace` (what `namespaceSelector`s select).
    pub fn new(store: Arc<dyn Store>, informer: Informer, profile: Profile) -> Self {
        Scheduler {
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

    pub async fn run(self) {
        let notifications = self.informer.notifications();
        self.informer.wait_synced().await;
        // Pods waiting for a node: due now, backing off, or parked unschedulable.
        let queue = WorkQueue::new(BACKOFF).named("scheduler");
        runner::run(self, queue, notifications).await;
    }

    /// Tries the unschedulable Pods again, each once its backoff is over.
    fn wake(&mut self, queue: &mut Queue, reason: Reason) {
        for pod_id in self.unschedulable.drain() {
            queue.add_after_backoff(pod_id, reason);
        }
    }

    fn snapshot(&self) -> (Vec<NodeInfo>, NamespaceLabels) {
        let cache = self.informer.cache();
        let namespaces = cache
            .list_typed::<Namespace>(None)
            .into_iter()
            .map(|n| (n.metadata.name.unwrap_or_default(), n.metadata.labels.unwrap_or_default()))
            .collect();
        let mut nodes: HashMap<String, NodeInfo> = cache
            .list_typed::<Node>(None)
            .into_iter()
            .map(|n| (n.metadata.name.clone().unwrap_or_default(), NodeInfo::new(n)))
            .collect();
        // Only Pods that hold room on a known node count: the others are not decoded at all.
        let counted = |p: &Value| holds_room(p) && node_name(p).is_some_and(|n| nodes.contains_key(n));
        for pod in cache.list_typed_where::<Pod>(None, counted) {
            if self.assumed.contains_key(&id(&pod)) {
                continue;
            }
            if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_ref()).and_then(|n| nodes.get_mut(n)) {
                node.add_pod(&pod);
            }
        }
        for (node, pod) in self.assumed.values() {
            if let Some(node) = nodes.get_mut(node) {
                node.add_pod(pod);
            }
        }
        let mut nodes: Vec<_> = nodes.into_values().collect();
        nodes.sort_by(|a, b| a.name().cmp(b.name()));
        (nodes, namespaces)
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

    /// Writes `spec.nodeName` (compare-and-swap on the Pod's resourceVersion), the PodScheduled
    /// condition and the selected node of each claim that waited for it, in one transaction.
    async fn bind(&self, pod: &Pod, node: &str, volumes: &PodVolumes) -> gitplane_store::Result<()> {
        let mut bound = pod.clone();
        if let Some(spec) = bound.spec.as_mut() {
            spec.node_name = Some(node.to_owned());
        }
        let mut status = bound.clone();
        status.metadata.resource_version = None; // ordered after the CAS above, in the same transaction
        set_scheduled_condition(&mut status, "True", None, None);
        let mut ops = vec![Op::Update(to_value(&bound)), Op::UpdateStatus(to_value(&status))];
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
        self.store.txn(ops).await?;
        Ok(())
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
    type Notification = Notification;

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

    async fn observe(&mut self, notification: Notification, queue: &mut Queue) {
        let event = match notification {
            Notification::Resync => return self.resync(queue).await,
            Notification::Changed(event) => event,
        };
        if event.key.kind == kind_of::<Node>() {
            self.snapshot = None;
            return self.wake(queue, Reason::NodeChanged);
        }
        if event.key.kind == kind_of::<Namespace>() {
            self.snapshot = None;
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
        if event.event_type == EventType::Deleted {
            queue.remove(&pod_id);
            self.unschedulable.remove(&pod_id);
            let assumed = self.assumed.remove(&pod_id).is_some();
            if assumed || holds_room(pod) {
                self.snapshot = None;
                self.wake(queue, Reason::PodDeleted);
            }
        } else if needs_node(pod) {
            // A queued Pod keeps its place, its backoff or its wait for a cluster event.
            if !queue.contains(&pod_id) {
                queue.add(pod_id, Reason::PodChanged);
            }
        } else {
            // A binding of this loop showing in the cache: the snapshot counts it already.
            let ours = self.assumed.remove(&pod_id).is_some_and(|(node, _)| node_name(pod) == Some(&node));
            if !ours || !holds_room(pod) {
                self.snapshot = None;
            }
            queue.remove(&pod_id);
            self.unschedulable.remove(&pod_id);
            if node_name(pod).is_some() && is_terminal(pod) {
                self.wake(queue, Reason::PodFinished);
            }
        }
    }

    async fn reconcile(&mut self, pod_id: PodId, reason: Reason, queue: &Queue) -> Requeue<Reason> {
        self.unschedulable.remove(&pod_id);
        if self.assumed.contains_key(&pod_id) {
            return Requeue::Done;
        }
        let value = self.informer.cache().get(&ObjectKey::of::<Pod>(&pod_id.0, &pod_id.1));
        let Some(pod) = value.filter(|v| needs_node(v)).and_then(|v| from_value::<Pod>(Value::clone(&v)).ok()) else {
            return Requeue::Done;
        };
        let started = std::time::Instant::now();
        let name = format!("{}/{}", pod_id.0, pod_id.1);
        let (mut nodes, namespaces) = self.snapshot.take().unwrap_or_else(|| self.snapshot());
        let volumes = volume_binding::pre_filter(&pod, &self.volumes(&pod));
        let placed = match &volumes {
            Ok(volumes) => self.profile.schedule_with(&pod, &nodes, &namespaces, volumes),
            Err(reason) => Err(ScheduleError::PreFilter { total: nodes.len(), reason: reason.clone() }),
        };
        let volumes = volumes.unwrap_or_default();
        let requeue = match placed {
            Ok(node) => match self.bind(&pod, &node, &volumes).await {
                Ok(()) => {
                    crate::metrics::attempt("scheduled", started.elapsed());
                    tracing::info!(pod = %name, %node, ?reason, elapsed = ?started.elapsed(), "bound");
                    let message = format!("Successfully assigned {name} to {node}");
                    self.events.event(reference(&pod), NORMAL, "Scheduled", &message);
                    if let Some(info) = nodes.iter_mut().find(|n| n.name() == node) {
                        info.add_pod(&pod);
                    }
                    self.assumed.insert(pod_id, (node, pod));
                    Requeue::Done
                }
                Err(e) => {
                    crate::metrics::attempt("error", started.elapsed());
                    if e.is_conflict() {
                        // Our cache was behind a concurrent writer (the binder on a claim, a
                        // controller on the Pod): it heals once the cache catches up, so retry
                        // soon rather than after the Pod's backoff of a second or more.
                        tracing::debug!(error = %e, pod = %name, "binding conflicted, retrying");
                        Requeue::RetryAfter(CONFLICT_RETRY, Reason::BindFailed)
                    } else {
                        let backoff = queue.next_backoff(&pod_id);
                        tracing::warn!(error = %e, pod = %name, %node, ?backoff, "binding failed, retrying");
                        Requeue::Backoff(Reason::BindFailed)
                    }
                }
            },
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
        self.snapshot = Some((nodes, namespaces));
        requeue
    }
}

fn id(pod: &Pod) -> PodId {
    (pod.metadata.namespace.clone().unwrap_or_default(), pod.metadata.name.clone().unwrap_or_default())
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
