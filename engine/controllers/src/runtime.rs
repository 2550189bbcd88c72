//! Running a reconciler: queue, backoff, spans.

use gitplane_store::{
    Event, ObjectKey, Op, Revision, Store, StoreError,
    informer::{Cache, Informer, Notification},
};
use std::{
    collections::{BTreeMap, HashMap, HashSet, VecDeque},
    sync::Arc,
    time::Duration,
};
use tokio::{sync::broadcast::error::RecvError, time::Instant};
use tracing::Instrument;

/// What to do with a key after a successful reconcile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Nothing until a watched object changes.
    AwaitChange,
    /// Reconcile again after this long even if nothing changes.
    RequeueAfter(Duration),
}

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    Invalid(String),
}

/// What a reconciler may use.
#[derive(Clone)]
pub struct Context {
    pub store: Arc<dyn Store>,
    pub informer: Informer,
}

impl Context {
    pub fn new(store: Arc<dyn Store>, informer: Informer) -> Self {
        Context { store, informer }
    }

    pub fn cache(&self) -> &Arc<Cache> {
        self.informer.cache()
    }

    /// Commits the ops in one transaction and waits until the cache shows them.
    pub async fn commit(&self, ops: Vec<Op>) -> Result<Revision, StoreError> {
        if ops.is_empty() {
            return Ok(0);
        }
        let revision = self.store.txn(ops).await?.revision;
        self.informer.wait_for(revision).await;
        Ok(revision)
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
}

/// Every object of kind `K` in the cache: a controller's keys for a full resync.
pub fn all_of<K: gitplane_api::kube_core::Resource<DynamicType = ()>>(cache: &Cache) -> Vec<ObjectKey> {
    cache
        .list(&gitplane_api::object::kind_of::<K>(), None)
        .iter()
        .filter_map(|v| ObjectKey::from_value(v).ok())
        .collect()
}

const BACKOFF_BASE: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// A reconciler with its work queue.
pub struct Controller<R> {
    reconciler: R,
    ctx: Context,
    queue: VecDeque<(ObjectKey, &'static str)>,
    queued: HashSet<ObjectKey>,
    delayed: BTreeMap<(Instant, u64), ObjectKey>,
    failures: HashMap<ObjectKey, u32>,
    sequence: u64,
}

impl<R: Reconciler> Controller<R> {
    pub fn new(reconciler: R, ctx: Context) -> Self {
        Controller {
            reconciler,
            ctx,
            queue: VecDeque::new(),
            queued: HashSet::new(),
            delayed: BTreeMap::new(),
            failures: HashMap::new(),
            sequence: 0,
        }
    }

    fn enqueue(&mut self, key: ObjectKey, reason: &'static str) {
        if self.queued.insert(key.clone()) {
            self.queue.push_back((key, reason));
        }
    }

    fn enqueue_after(&mut self, key: ObjectKey, after: Duration) {
        self.sequence += 1;
        self.delayed.insert((Instant::now() + after, self.sequence), key);
    }

    fn resync(&mut self) {
        for key in self.reconciler.all_keys(self.ctx.cache()) {
            self.enqueue(key, "resync");
        }
    }

    fn observe(&mut self, notification: Notification) {
        match notification {
            Notification::Resync => self.resync(),
            Notification::Changed(event) => {
                for key in self.reconciler.keys_for(&event, self.ctx.cache()) {
                    self.enqueue(key, "change");
                }
            }
        }
    }

    pub async fn run(mut self) {
        let mut notifications = self.ctx.informer.subscribe();
        self.ctx.informer.wait_synced().await;
        self.resync();
        loop {
            while let Ok(n) = notifications.try_recv() {
                self.observe(n);
            }
            let now = Instant::now();
            while let Some(entry) = self.delayed.first_entry() {
                if entry.key().0 > now {
                    break;
                }
                let key = entry.remove();
                self.enqueue(key, "requeue");
            }
            if let Some((key, reason)) = self.queue.pop_front() {
                self.queued.remove(&key);
                self.reconcile(key, reason).await;
                continue;
            }
            let wake = self.delayed.first_key_value().map(|((at, _), _)| *at);
            tokio::select! {
                n = notifications.recv() => match n {
                    Ok(n) => self.observe(n),
                    Err(RecvError::Lagged(_)) => self.resync(),
                    Err(RecvError::Closed) => return,
                },
                _ = sleep_until(wake) => {}
            }
        }
    }

    async fn reconcile(&mut self, key: ObjectKey, reason: &'static str) {
        let span = tracing::info_span!("reconcile", controller = self.reconciler.name(), object = %key, reason);
        let result = self.reconciler.reconcile(&key, &self.ctx).instrument(span.clone()).await;
        let _entered = span.enter();
        match result {
            Ok(action) => {
                self.failures.remove(&key);
                if let Action::RequeueAfter(after) = action {
                    self.enqueue_after(key, after);
                }
            }
            Err(ReconcileError::Store(e)) if e.is_conflict() => {
                // Our cache was behind a concurrent writer: retry once it has caught up.
                tracing::debug!(error = %e, "conflict, retrying");
                self.enqueue_after(key, BACKOFF_BASE);
            }
            Err(e) => {
                let failures = self.failures.entry(key.clone()).or_default();
                *failures += 1;
                let backoff = BACKOFF_BASE.saturating_mul(1 << (*failures).min(10)).min(BACKOFF_MAX);
                tracing::warn!(error = %e, ?backoff, "reconcile failed");
                self.enqueue_after(key, backoff);
            }
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
