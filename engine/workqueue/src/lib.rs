//! The one work queue every control loop uses: the controllers, the scheduler and the source
//! controller.
//!
//! It behaves as client-go's workqueue and kube-runtime's scheduler:
//! - **one entry per key**: a key queued again before it ran is still processed once;
//! - **the earliest request wins**: a key keeps the earliest time any request asked for, so a
//!   change that arrives during a backoff runs at once, and a later requeue never postpones an
//!   earlier one (nor leaves a second entry behind);
//! - **per-key backoff**: failures of a key delay its retries exponentially until it is
//!   forgotten (it succeeded) or removed (its object is gone);
//! - **a reason with each entry** ([`Reason`]), for the loop's logs and tracing spans.
//!
//! One consumer pops a key, processes it and pops the next, so the queue keeps no in-flight
//! state: a key queued while it is processed simply runs again. Time is tokio's, so tests drive
//! the queue with a paused clock instead of sleeping. A queue given a name
//! ([`WorkQueue::named`]) exports client-go's `workqueue_depth` and `workqueue_adds_total`.
//!
//! [`runner`] is the loop around it that the controllers and the scheduler share.

pub mod runner;

use gitplane_metrics::{Counter, Family, Gauge};
use std::{
    collections::{BTreeMap, HashMap},
    future::Future,
    hash::Hash,
    sync::{Arc, LazyLock},
    time::Duration,
};
use tokio::time::Instant;

/// Why a key is queued.
pub trait Reason {
    /// The reason of the one entry left when two requests for the same key meet. `first` is the
    /// request that runs first (for equal times, the one queued first); by default it names the
    /// entry, as kube-runtime keeps the earlier request.
    fn merge(first: Self, second: Self) -> Self
    where
        Self: Sized,
    {
        let _ = second;
        first
    }
}

/// Exponential backoff: `initial` after the first failure, doubled per further failure, at most
/// `max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
}

/// client-go's per-item default: 5 ms, doubling, at most 1000 s.
impl Default for Backoff {
    fn default() -> Self {
        Backoff { initial: Duration::from_millis(5), max: Duration::from_secs(1000) }
    }
}

impl Backoff {
    /// The delay after `failures` consecutive failures (at least one).
    pub fn delay(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(31);
        self.initial.saturating_mul(1 << doublings).min(self.max)
    }
}

struct Entry<R> {
    due: Instant,
    /// Arrival order: entries due at the same time run first in, first out.
    seq: u64,
    reason: R,
}

struct Failures {
    count: u32,
    /// When the backoff of the last failure ends.
    until: Instant,
}

/// Keys waiting to be processed, each once, in order of due time.
pub struct WorkQueue<K, R> {
    entries: HashMap<K, Entry<R>>,
    /// The same entries by (due time, arrival).
    order: BTreeMap<(Instant, u64), K>,
    seq: u64,
    /// When the queue was made: no entry is due earlier, so [`WorkQueue::add_first`] queues
    /// there, numbered by `first_seq`, which stays below every `seq` (entries due at `origin` too
    /// still come after).
    origin: Instant,
    first_seq: u64,
    backoff: Backoff,
    failures: HashMap<K, Failures>,
    /// `workqueue_depth` and `workqueue_adds_total` of this queue's name, once named.
    metrics: Option<QueueMetrics>,
}

struct QueueMetrics {
    depth: Arc<Gauge>,
    adds: Arc<Counter>,
}

/// client-go's workqueue metrics, one series per queue name (a fixed set: the components).
struct Families {
    depth: Arc<Family<Gauge>>,
    adds: Arc<Family<Counter>>,
}

static METRICS: LazyLock<Families> = LazyLock::new(|| Families {
    depth: gitplane_metrics::gauge("workqueue_depth", "Current depth of workqueue", &["name"]),
    adds: gitplane_metrics::counter("workqueue_adds_total", "Total number of adds handled by workqueue", &["name"]),
});

/// Registers the queues' metric families (they show before any queue is named).
pub fn register_metrics() {
    LazyLock::force(&METRICS);
}

impl<K: Clone + Eq + Hash, R: Reason> WorkQueue<K, R> {
    pub fn new(backoff: Backoff) -> Self {
        WorkQueue {
            entries: HashMap::new(),
            order: BTreeMap::new(),
            seq: 1 << 63,
            origin: Instant::now(),
            first_seq: 0,
            backoff,
            failures: HashMap::new(),
            metrics: None,
        }
    }

    /// Exports this queue's depth and adds under `name` (a component's name, not a key's).
    pub fn named(mut self, name: &str) -> Self {
        let metrics = QueueMetrics { depth: METRICS.depth.with(&[name]), adds: METRICS.adds.with(&[name]) };
        metrics.depth.set(self.len() as i64);
        self.metrics = Some(metrics);
        self
    }

    fn depth_changed(&self) {
        if let Some(m) = &self.metrics {
            m.depth.set(self.entries.len() as i64);
        }
    }

    /// Queues `key` to run now.
    pub fn add(&mut self, key: K, reason: R) {
        self.add_at(key, reason, Instant::now());
    }

    /// Queues `key` to run after `delay`, unless it is queued to run earlier.
    pub fn add_after(&mut self, key: K, reason: R, delay: Duration) {
        self.add_at(key, reason, Instant::now() + delay);
    }

    /// Queues `key` for `at`, unless it is queued to run earlier: one entry per key, at the
    /// earliest time asked for.
    pub fn add_at(&mut self, key: K, reason: R, at: Instant) {
        self.seq += 1;
        if let Some(m) = &self.metrics {
            m.adds.inc();
        }
        let entry = match self.entries.remove(&key) {
            Some(old) if at < old.due => {
                self.order.remove(&(old.due, old.seq));
                self.order.insert((at, self.seq), key.clone());
                Entry { due: at, seq: self.seq, reason: R::merge(reason, old.reason) }
            }
            Some(old) => Entry { reason: R::merge(old.reason, reason), ..old },
            None => {
                self.order.insert((at, self.seq), key.clone());
                Entry { due: at, seq: self.seq, reason }
            }
        };
        self.entries.insert(key, entry);
        self.depth_changed();
    }

    /// Queues `key` ahead of every entry that is not queued first too (those keep their arrival
    /// order): for work someone waits for, such as the Application a push changed, when a
    /// burst of routine work is queued.
    pub fn add_first(&mut self, key: K, reason: R) {
        self.first_seq += 1;
        if let Some(m) = &self.metrics {
            m.adds.inc();
        }
        let reason = match self.entries.remove(&key) {
            Some(old) => {
                self.order.remove(&(old.due, old.seq));
                R::merge(reason, old.reason)
            }
            None => reason,
        };
        self.order.insert((self.origin, self.first_seq), key.clone());
        self.entries.insert(key, Entry { due: self.origin, seq: self.first_seq, reason });
        self.depth_changed();
    }

    /// Records a failure of `key` and queues it for when its backoff ends; returns the backoff.
    pub fn add_with_backoff(&mut self, key: K, reason: R) -> Duration {
        let delay = self.record_failure(&key);
        self.add_after(key, reason, delay);
        delay
    }

    /// Records a failure of `key` without queuing it (something else will: an event, a timer);
    /// returns the backoff that [`WorkQueue::add_after_backoff`] then respects.
    pub fn record_failure(&mut self, key: &K) -> Duration {
        let count = self.failures.get(key).map_or(0, |f| f.count).saturating_add(1);
        let delay = self.backoff.delay(count);
        self.failures.insert(key.clone(), Failures { count, until: Instant::now() + delay });
        delay
    }

    /// The backoff the next failure of `key` gets.
    pub fn next_backoff(&self, key: &K) -> Duration {
        self.backoff.delay(self.failures.get(key).map_or(0, |f| f.count).saturating_add(1))
    }

    /// Queues `key` for when the backoff of its last failure ends, or now if it has none.
    pub fn add_after_backoff(&mut self, key: K, reason: R) {
        let now = Instant::now();
        let at = self.failures.get(&key).map_or(now, |f| f.until.max(now));
        self.add_at(key, reason, at);
    }

    /// `key` succeeded: its next failure backs off from the start again.
    pub fn forget(&mut self, key: &K) {
        self.failures.remove(key);
    }

    /// `key`'s object is gone: no entry and no failures are kept.
    pub fn remove(&mut self, key: &K) {
        if let Some(old) = self.entries.remove(key) {
            self.order.remove(&(old.due, old.seq));
        }
        self.failures.remove(key);
        self.depth_changed();
    }

    /// Whether `key` is queued, due or not.
    pub fn contains(&self, key: &K) -> bool {
        self.entries.contains_key(key)
    }

    /// The number of queued keys, due or not.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Removes and returns the entry that is due first, if one is due.
    pub fn pop(&mut self) -> Option<(K, R)> {
        let first = self.order.first_entry()?;
        if first.key().0 > Instant::now() {
            return None;
        }
        let key = first.remove();
        let entry = self.entries.remove(&key)?;
        self.depth_changed();
        Some((key, entry.reason))
    }

    /// When the next entry is due; `None` when the queue is empty.
    pub fn next_due(&self) -> Option<Instant> {
        self.order.first_key_value().map(|((at, _), _)| *at)
    }

    /// Resolves when the next entry is due, never while the queue is empty. The future owns its
    /// deadline, so a loop can wait on it in `select!` and change the queue in another branch.
    pub fn due(&self) -> impl Future<Output = ()> + Send + use<K, R> {
        let at = self.next_due();
        async move {
            match at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
    enum Why {
        Change,
        Requeue,
        Resync,
    }

    impl Reason for Why {}

    /// A reason where the stronger request wins, as the source controller's.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
    enum Strength {
        Weak,
        Strong,
    }

    impl Reason for Strength {
        fn merge(first: Self, second: Self) -> Self {
            first.max(second)
        }
    }

    const BACKOFF: Backoff = Backoff { initial: Duration::from_secs(1), max: Duration::from_secs(10) };

    fn queue<R: Reason>() -> WorkQueue<&'static str, R> {
        WorkQueue::new(BACKOFF)
    }

    fn drain<R: Reason>(q: &mut WorkQueue<&'static str, R>) -> Vec<(&'static str, R)> {
        std::iter::from_fn(|| q.pop()).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_queued_twice_runs_once_in_arrival_order() {
        let mut q = queue();
        q.add("a", Why::Change);
        q.add("b", Why::Change);
        q.add("a", Why::Resync);
        assert_eq!(q.len(), 2);
        assert_eq!(drain(&mut q), [("a", Why::Change), ("b", Why::Change)], "the first request names the entry");
        assert!(q.is_empty() && q.next_due().is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn the_earliest_requeue_wins_and_leaves_no_second_entry() {
        let mut q = queue();
        let start = Instant::now();
        q.add_after("a", Why::Requeue, Duration::from_secs(10));
        q.add_after("a", Why::Requeue, Duration::from_secs(2));
        q.add_after("a", Why::Resync, Duration::from_secs(5));
        assert_eq!(q.next_due(), Some(start + Duration::from_secs(2)));
        assert_eq!(q.pop(), None, "not due yet");
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(drain(&mut q), [("a", Why::Requeue)]);
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(q.pop(), None, "the later requests went with the earlier one");
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_during_a_backoff_runs_at_once() {
        let mut q = queue();
        assert_eq!(q.add_with_backoff("a", Why::Requeue), Duration::from_secs(1));
        q.add("a", Why::Change);
        assert_eq!(drain(&mut q), [("a", Why::Change)], "the request that runs first names the entry");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(q.pop(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn failures_back_off_per_key_until_forgotten() {
        let mut q = queue::<Why>();
        let delays: Vec<u64> = (0..6).map(|_| q.add_with_backoff("a", Why::Requeue).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 10, 10]);
        assert_eq!(q.add_with_backoff("b", Why::Requeue), Duration::from_secs(1), "each key has its own");
        q.forget(&"a");
        q.remove(&"b");
        assert_eq!(q.add_with_backoff("a", Why::Requeue), Duration::from_secs(1));
        assert_eq!(q.record_failure(&"b"), Duration::from_secs(1), "removed keys start over");
    }

    #[tokio::test(start_paused = true)]
    async fn add_after_backoff_waits_only_while_backing_off() {
        let mut q = queue();
        q.record_failure(&"a");
        q.record_failure(&"a");
        q.add_after_backoff("a", Why::Change);
        q.add_after_backoff("b", Why::Change);
        assert_eq!(drain(&mut q), [("b", Why::Change)]);
        tokio::time::advance(Duration::from_secs(2)).await;
        assert_eq!(drain(&mut q), [("a", Why::Change)]);
        assert!(!q.contains(&"a"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_reason_type_may_keep_the_stronger_request() {
        let mut q = queue();
        q.add("a", Strength::Strong);
        q.add("a", Strength::Weak);
        q.add("b", Strength::Weak);
        q.add("b", Strength::Strong);
        assert_eq!(drain(&mut q), [("a", Strength::Strong), ("b", Strength::Strong)]);
    }

    #[tokio::test(start_paused = true)]
    async fn add_first_jumps_the_queue_in_arrival_order() {
        let mut q = queue::<Why>();
        q.add("a", Why::Change);
        q.add("b", Why::Change);
        q.add_after("later", Why::Change, Duration::from_secs(60));
        q.add_first("b", Why::Resync);
        q.add_first("c", Why::Change);
        q.add_first("later", Why::Change);
        assert_eq!(q.len(), 4);
        assert_eq!(
            drain(&mut q),
            vec![("b", Why::Resync), ("c", Why::Change), ("later", Why::Change), ("a", Why::Change)]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn due_entries_run_in_due_order() {
        let mut q = queue();
        q.add_after("late", Why::Requeue, Duration::from_secs(3));
        q.add_after("early", Why::Requeue, Duration::from_secs(1));
        q.add("now", Why::Change);
        tokio::time::advance(Duration::from_secs(5)).await;
        q.add("newest", Why::Change);
        let order: Vec<_> = drain(&mut q).into_iter().map(|(k, _)| k).collect();
        assert_eq!(order, ["now", "early", "late", "newest"]);
    }

    #[tokio::test(start_paused = true)]
    async fn due_waits_for_the_next_entry_and_never_on_an_empty_queue() {
        let mut q = queue();
        let start = Instant::now();
        q.add_after("a", Why::Requeue, Duration::from_secs(3));
        let due = q.due();
        q.remove(&"a");
        due.await;
        assert_eq!(start.elapsed(), Duration::from_secs(3), "the future keeps the deadline it was made with");
        assert!(tokio::time::timeout(Duration::from_secs(3600), q.due()).await.is_err());
    }
}
