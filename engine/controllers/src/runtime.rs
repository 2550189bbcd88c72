//! Running a reconciler on the work queue's loop runner: the error policy, a span per reconcile.

use crate::admission::{Admission, Refusal};
use crate::plan;
use gitplane_api::events::{Record, Source, WARNING, reference};
use gitplane_api::{
    k8s_openapi::api::core::v1::{ObjectReference, Pod},
    kube_core::Resource,
    object::{from_value, to_value},
};
use gitplane_store::events::Recorder;
use gitplane_store::{
    Event, ObjectKey, Op, Revision, Store, StoreError,
    informer::{Cache, Informer, Notification},
};
use gitplane_workqueue::{
    Backoff, WorkQueue,
    runner::{self, ConcurrentReconcile, Requeue},
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;
use std::{fmt, future::Future, sync::Arc, time::Duration};
use tracing::Instrument;

/// What to do with a key after a successful reconcile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Action {
    requeue_after: Option<Duration>,
}

impl Action {
    /// Reconcile again after this long even if nothing changes (sooner if something does).
    #[must_use]
    pub const fn requeue(after: Duration) -> Action {
        Action { requeue_after: Some(after) }
    }

    /// Nothing until a watched object changes.
    #[must_use]
    pub const fn await_change() -> Action {
        Action { requeue_after: None }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    Invalid(String),
}

/// Why a key is reconciled, as kube-runtime's `ReconcileReason`: for the reconcile's span only;
/// reconcilers are level-triggered and never see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReconcileReason {
    /// The object itself was created, changed or deleted.
    ObjectChanged,
    /// An object it relates to (a dependent, a Lease) changed.
    RelatedObjectChanged(ObjectKey),
    /// Every object: start-up, or the informer re-listed or events were missed.
    Resync,
    /// The last reconcile asked for it ([`Action::requeue`]).
    RequeueRequested,
    /// The last reconcile lost a compare-and-swap to a concurrent writer.
    Conflict,
    /// The last reconcile failed: retried after the key's backoff.
    ErrorBackoff,
}

impl gitplane_workqueue::Reason for ReconcileReason {}

impl fmt::Display for ReconcileReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReconcileReason::ObjectChanged => f.write_str("object changed"),
            ReconcileReason::RelatedObjectChanged(key) => write!(f, "related object {key} changed"),
            ReconcileReason::Resync => f.write_str("resync"),
            ReconcileReason::RequeueRequested => f.write_str("requeue requested"),
            ReconcileReason::Conflict => f.write_str("retry after a conflict"),
            ReconcileReason::ErrorBackoff => f.write_str("retry after an error"),
        }
    }
}

/// What a reconciler may use.
#[derive(Clone)]
pub struct Context {
    pub store: Arc<dyn Store>,
    pub informer: Informer,
    /// One Event writer for every controller; each names itself as the source.
    events: Recorder,
}

impl Context {
    pub fn new(store: Arc<dyn Store>, informer: Informer) -> Self {
        let events = Recorder::spawn(store.clone(), Source::component("controller-manager"));
        Context { store, informer, events }
    }

    /// Records an Event from `component` (`deployment-controller`, …) about `object`.
    pub fn event<K: k8s_openapi::Resource + k8s_openapi::Metadata<Ty = ObjectMeta>>(
        &self,
        component: &str,
        object: &K,
        type_: &str,
        reason: &str,
        message: &str,
    ) {
        self.events.record(Record::new(Source::component(component), reference(object), type_, reason, message));
    }

    /// Records an Event from `component` about the object `about` names (a Pod's owner).
    pub fn event_about(&self, component: &str, about: ObjectReference, type_: &str, reason: &str, message: &str) {
        self.events.record(Record::new(Source::component(component), about, type_, reason, message));
    }

    /// Records an Event about `pod`'s controller (the workload it belongs to), or the Pod itself
    /// when it has none.
    pub fn event_on_owner(&self, component: &str, pod: &Pod, type_: &str, reason: &str, message: &str) {
        let owner = pod.metadata.owner_references.iter().flatten().find(|o| o.controller == Some(true));
        let about = match owner {
            Some(o) => ObjectReference {
                api_version: Some(o.api_version.clone()),
                kind: Some(o.kind.clone()),
                namespace: pod.metadata.namespace.clone(),
                name: Some(o.name.clone()),
                uid: Some(o.uid.clone()),
                ..Default::default()
            },
            None => reference(pod),
        };
        self.event_about(component, about, type_, reason, message);
    }

    pub fn cache(&self) -> &Arc<Cache> {
        self.informer.cache()
    }

    /// Commits the ops in one transaction, less the creates admission refuses, and waits until
    /// the cache shows them.
    pub async fn commit(&self, ops: Vec<Op>) -> Result<Revision, StoreError> {
        let ops = self.admit(ops);
        if ops.is_empty() {
            return Ok(0);
        }
        let revision = self.store.txn(ops).await?.revision;
        self.informer.wait_for(revision).await;
        Ok(revision)
    }

    /// The ops with their creates as admission stores them; a refused create is left out and
    /// its controller gets the `FailedCreate` Event.
    fn admit(&self, ops: Vec<Op>) -> Vec<Op> {
        let mut admission = Admission::new(&**self.cache());
        ops.into_iter()
            .filter_map(|op| match op {
                Op::Create(mut object) => {
                    if object["kind"] == "PersistentVolumeClaim" {
                        crate::admission::default_claim(&mut object, &self.cache().list_typed(None));
                    }
                    match admission.admit(object) {
                        Ok(object) => Some(Op::Create(object)),
                        Err(refusal) => {
                            self.refused(refusal);
                            None
                        }
                    }
                }
                other => Some(other),
            })
            .collect()
    }

    /// A plan's Pods as admission leaves them, before its controller tells of them.
    pub fn admit_pods(&self, plan: Vec<plan::Op<Pod>>) -> Vec<plan::Op<Pod>> {
        let mut admission = Admission::new(&**self.cache());
        plan.into_iter()
            .filter_map(|op| match op {
                plan::Op::Create(pod) => match admission.admit(to_value(&pod)).map(from_value::<Pod>) {
                    Ok(Ok(pod)) => Some(plan::Op::Create(pod)),
                    Ok(Err(_)) => Some(plan::Op::Create(pod)),
                    Err(refusal) => {
                        self.refused(refusal);
                        None
                    }
                },
                other => Some(other),
            })
            .collect()
    }

    fn refused(&self, refusal: Refusal) {
        tracing::info!(message = %refusal.message, "create refused by admission");
        let Some(owner) = refusal.owner else { return };
        let component = match owner.kind.as_deref() {
            Some("ReplicaSet") => "replicaset-controller",
            Some("ReplicationController") => "replication-controller",
            Some("Job") => "job-controller",
            Some("CronJob") => "cronjob-controller",
            Some("DaemonSet") => "daemonset-controller",
            Some("StatefulSet") => "statefulset-controller",
            Some("Deployment") => "deployment-controller",
            _ => "controller-manager",
        };
        let message = format!("Error creating: {}", refusal.message);
        self.events.record(Record::new(Source::component(component), *owner, WARNING, "FailedCreate", &message));
    }

    /// Commits a plan in one transaction and waits until the cache shows it.
    pub async fn apply<K: Resource<DynamicType = ()> + Serialize>(
        &self,
        plan: Vec<plan::Op<K>>,
    ) -> Result<Revision, StoreError> {
        let now = gitplane_api::k8s_openapi::jiff::Timestamp::now();
        self.commit(plan.into_iter().filter_map(|op| op.into_store_op(now)).collect()).await
    }

    /// Writes an object's status (compare-and-swap on its resourceVersion) and waits until the
    /// cache shows it.
    pub async fn update_status<K: Serialize>(&self, object: &K) -> Result<Revision, StoreError> {
        self.commit(vec![Op::UpdateStatus(to_value(object))]).await
    }
}

/// A controller's logic.
#[async_trait::async_trait]
pub trait Reconciler: Send + Sync + 'static {
    fn name(&self) -> &'static str;

    /// The keys to reconcile after a change.
    fn keys_for(&self, event: &Event, cache: &Cache) -> Vec<ObjectKey>;

    /// Every key this controller owns, for a full resync.
    fn all_keys(&self, cache: &Cache) -> Vec<ObjectKey>;

    async fn reconcile(&self, key: &ObjectKey, ctx: &Context) -> Result<Action, ReconcileError>;

    /// How many different keys may be reconciled at once (kube-controller-manager's
    /// `--concurrent-*-syncs`): more than one for a controller whose reconciles of different keys
    /// write different objects, so their transactions share the store's commits.
    fn workers(&self) -> usize {
        1
    }
}

/// Every object of kind `K` in the cache: a controller's keys for a full resync.
pub fn all_of<K: gitplane_api::kube_core::Resource<DynamicType = ()>>(cache: &Cache) -> Vec<ObjectKey> {
    cache
        .list(&gitplane_api::object::kind_of::<K>(), None)
        .iter()
        .filter_map(|v| ObjectKey::from_value(v).ok())
        .collect()
}

/// Workers of the controllers whose reconciles of different keys write different objects
/// (Deployments, ReplicaSets, Services' endpoints, the garbage collector): enough reconciles in
/// flight that their transactions fill the store's group commits.
pub const CONCURRENT_SYNCS: usize = 16;

/// Retries of a failing key: 100 ms, doubling, at most 30 s.
const ERROR_BACKOFF: Backoff = Backoff { initial: Duration::from_millis(100), max: Duration::from_secs(30) };
/// A conflict heals once the cache has caught up with the other writer: retry soon, uncounted.
const CONFLICT_RETRY: Duration = Duration::from_millis(100);

type Queue = WorkQueue<ObjectKey, ReconcileReason>;

/// The error policy and requeues: what happens to a key after its reconcile.
fn requeue(result: &Result<Action, ReconcileError>) -> Requeue<ReconcileReason> {
    match result {
        Ok(Action { requeue_after: Some(after) }) => Requeue::After(*after, ReconcileReason::RequeueRequested),
        Ok(Action { requeue_after: None }) => Requeue::Done,
        Err(ReconcileError::Store(e)) if e.is_conflict() => {
            Requeue::RetryAfter(CONFLICT_RETRY, ReconcileReason::Conflict)
        }
        Err(_) => Requeue::Backoff(ReconcileReason::ErrorBackoff),
    }
}

/// A reconciler with what it reconciles with.
pub struct Controller<R> {
    reconciler: Arc<R>,
    ctx: Context,
}

impl<R: Reconciler> Controller<R> {
    pub fn new(reconciler: R, ctx: Context) -> Self {
        Controller { reconciler: Arc::new(reconciler), ctx }
    }

    pub async fn run(self) {
        let notifications = self.ctx.informer.notifications();
        self.ctx.informer.wait_synced().await;
        let queue = WorkQueue::new(ERROR_BACKOFF).named(self.reconciler.name());
        let workers = self.reconciler.workers();
        runner::run_concurrent(self, workers, queue, notifications).await;
    }
}

impl<R: Reconciler> ConcurrentReconcile for Controller<R> {
    type Key = ObjectKey;
    type Reason = ReconcileReason;
    type Notification = Notification;

    async fn resync(&mut self, queue: &mut Queue) {
        for key in self.reconciler.all_keys(self.ctx.cache()) {
            queue.add(key, ReconcileReason::Resync);
        }
    }

    async fn observe(&mut self, notification: Notification, queue: &mut Queue) {
        match notification {
            Notification::Resync => self.resync(queue).await,
            Notification::Changed(event) => {
                for key in self.reconciler.keys_for(&event, self.ctx.cache()) {
                    let reason = if key == event.key {
                        ReconcileReason::ObjectChanged
                    } else {
                        ReconcileReason::RelatedObjectChanged(event.key.clone())
                    };
                    queue.add(key, reason);
                }
            }
        }
    }

    fn reconcile(
        &self,
        key: ObjectKey,
        reason: ReconcileReason,
        backoff: Duration,
    ) -> impl Future<Output = Requeue<ReconcileReason>> + Send + 'static {
        let (reconciler, ctx) = (self.reconciler.clone(), self.ctx.clone());
        async move {
            let span = tracing::info_span!("reconcile", controller = reconciler.name(), object = %key, %reason);
            let result = reconciler.reconcile(&key, &ctx).instrument(span.clone()).await;
            let _entered = span.enter();
            match &result {
                Err(ReconcileError::Store(e)) if e.is_conflict() => tracing::debug!(error = %e, "conflict, retrying"),
                Err(e) => tracing::warn!(error = %e, ?backoff, "reconcile failed"),
                Ok(_) => {}
            }
            requeue(&result)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gitplane_store::Rejection;
    use gitplane_workqueue::runner::settle;
    use tokio::time::{Instant, advance};

    fn key(name: &str) -> ObjectKey {
        ObjectKey::new("ConfigMap", "default", name)
    }

    fn failed() -> Result<Action, ReconcileError> {
        Err(ReconcileError::Invalid("broken".into()))
    }

    fn conflict() -> Result<Action, ReconcileError> {
        Err(StoreError::from(Rejection::Conflict { key: key("a"), expected: 1, current: 2 }).into())
    }

    #[tokio::test(start_paused = true)]
    async fn t10_success_forgets_and_requeues_only_when_asked() {
        let mut queue = Queue::new(ERROR_BACKOFF);
        settle(&mut queue, key("a"), requeue(&Ok(Action::await_change())));
        assert!(queue.is_empty());
        settle(&mut queue, key("a"), requeue(&Ok(Action::requeue(Duration::from_secs(5)))));
        assert_eq!(queue.next_due(), Some(Instant::now() + Duration::from_secs(5)));
        advance(Duration::from_secs(5)).await;
        assert_eq!(queue.pop(), Some((key("a"), ReconcileReason::RequeueRequested)));
    }

    #[tokio::test(start_paused = true)]
    async fn t10_errors_back_off_per_key_and_success_resets_them() {
        let mut queue = Queue::new(ERROR_BACKOFF);
        let mut waits = Vec::new();
        for _ in 0..4 {
            settle(&mut queue, key("a"), requeue(&failed()));
            let at = queue.next_due().unwrap();
            waits.push(at - Instant::now());
            advance(at - Instant::now()).await;
            assert_eq!(queue.pop(), Some((key("a"), ReconcileReason::ErrorBackoff)));
        }
        assert_eq!(waits, [100, 200, 400, 800].map(Duration::from_millis));
        settle(&mut queue, key("a"), requeue(&Ok(Action::await_change())));
        settle(&mut queue, key("a"), requeue(&failed()));
        assert_eq!(queue.next_due(), Some(Instant::now() + Duration::from_millis(100)), "back to the first step");
    }

    #[tokio::test(start_paused = true)]
    async fn t10_conflicts_retry_soon_without_growing_the_backoff() {
        let mut queue = Queue::new(ERROR_BACKOFF);
        for _ in 0..3 {
            settle(&mut queue, key("a"), requeue(&conflict()));
            assert_eq!(queue.next_due(), Some(Instant::now() + CONFLICT_RETRY));
            advance(CONFLICT_RETRY).await;
            assert_eq!(queue.pop(), Some((key("a"), ReconcileReason::Conflict)));
        }
        settle(&mut queue, key("a"), requeue(&failed()));
        assert_eq!(queue.next_due(), Some(Instant::now() + Duration::from_millis(100)));
    }

    #[tokio::test(start_paused = true)]
    async fn t10_a_change_during_a_backoff_runs_at_once_and_once() {
        let mut queue = Queue::new(ERROR_BACKOFF);
        for _ in 0..5 {
            settle(&mut queue, key("a"), requeue(&failed()));
            advance(Duration::from_secs(30)).await;
            queue.pop();
        }
        settle(&mut queue, key("a"), requeue(&failed()));
        queue.add(key("a"), ReconcileReason::ObjectChanged);
        assert_eq!(queue.pop(), Some((key("a"), ReconcileReason::ObjectChanged)));
        advance(Duration::from_secs(30)).await;
        assert_eq!(queue.pop(), None, "the backoff entry went with the change");
    }
}
