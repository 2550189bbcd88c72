//! The one loop runner, as kube-runtime's `Controller` serves every reconciler: notifications
//! queue keys, due keys are reconciled one at a time ([`run`]) or several different keys at once
//! ([`run_concurrent`], client-go's workers), and each reconcile says what happens to its key
//! next ([`Requeue`]), failures backing off per key. The controllers, the scheduler and the
//! source controller run on it; the loop stops once the notifications end (the informer is gone).

use crate::{Reason, WorkQueue};
use futures::{FutureExt, Stream, StreamExt, stream::FuturesUnordered};
use std::{
    collections::{HashMap, HashSet},
    future::Future,
    hash::Hash,
    time::Duration,
};

/// What happens to a key after its reconcile: kube-runtime's `Action` and error policy in one.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub enum Requeue<R> {
    /// Done: its failures are forgotten, and nothing runs it again until a change queues it.
    Done,
    /// Done, and run again after this long (sooner if a change queues it).
    After(Duration, R),
    /// Failed: run again once the key's backoff, which grows with each failure, ends.
    Backoff(R),
    /// Failed in a way that heals by itself (a lost compare-and-swap): run again after this long,
    /// without growing the backoff.
    RetryAfter(Duration, R),
    /// Failed and counted, then left for a change to queue it, or this long at most.
    Park(Duration, R),
}

/// Applies `requeue` to `key` in `queue`.
pub fn settle<K: Clone + Eq + Hash, R: Reason>(queue: &mut WorkQueue<K, R>, key: K, requeue: Requeue<R>) {
    match requeue {
        Requeue::Done => queue.forget(&key),
        Requeue::After(after, reason) => {
            queue.forget(&key);
            queue.add_after(key, reason, after);
        }
        Requeue::Backoff(reason) => {
            queue.add_with_backoff(key, reason);
        }
        Requeue::RetryAfter(after, reason) => queue.add_after(key, reason, after),
        Requeue::Park(after, reason) => {
            queue.record_failure(&key);
            queue.add_after(key, reason, after);
        }
    }
}

/// A control loop's logic: which keys a notification concerns, and the reconcile of one key.
pub trait Reconcile: Send {
    type Key: Clone + Eq + Hash + Send;
    type Reason: Reason + Send;
    type Notification: Send;

    /// Queues every key at start-up.
    fn resync(&mut self, queue: &mut WorkQueue<Self::Key, Self::Reason>) -> impl Future<Output = ()> + Send;

    /// Queues the keys `notification` concerns (every key when it says notifications were missed).
    fn observe(
        &mut self,
        notification: Self::Notification,
        queue: &mut WorkQueue<Self::Key, Self::Reason>,
    ) -> impl Future<Output = ()> + Send;

    /// Brings `key` to what it should be; `queue` tells what a failure would back off
    /// ([`WorkQueue::next_backoff`]).
    fn reconcile(
        &mut self,
        key: Self::Key,
        reason: Self::Reason,
        queue: &WorkQueue<Self::Key, Self::Reason>,
    ) -> impl Future<Output = Requeue<Self::Reason>> + Send;

    /// No key is due any more: the batch of reconciles that ran since the last call is over.
    fn idle(&mut self) {}
}

/// Runs `handler` over `queue` until `notifications` end. Every key is queued first (call it
/// once the notifications' source is synced); notifications already received are observed
/// before each reconcile, so a change or a deletion is seen before its key runs.
pub async fn run<H: Reconcile>(
    mut handler: H,
    mut queue: WorkQueue<H::Key, H::Reason>,
    notifications: impl Stream<Item = H::Notification>,
) {
    let mut notifications = std::pin::pin!(notifications);
    handler.resync(&mut queue).await;
    loop {
        while let Some(received) = notifications.next().now_or_never() {
            match received {
                Some(n) => handler.observe(n, &mut queue).await,
                None => return,
            }
        }
        if let Some((key, reason)) = queue.pop() {
            let requeue = handler.reconcile(key.clone(), reason, &queue).await;
            settle(&mut queue, key, requeue);
            continue;
        }
        handler.idle();
        let due = queue.due();
        tokio::select! {
            n = notifications.next() => match n {
                Some(n) => handler.observe(n, &mut queue).await,
                None => return,
            },
            () = due => {}
        }
    }
}

/// A control loop whose reconciles of different keys may run at once: each reconcile is a future
/// of its own that holds what it needs, as client-go's workers share the controller.
pub trait ConcurrentReconcile: Send {
    type Key: Clone + Eq + Hash + Send + 'static;
    type Reason: Reason + Send + 'static;
    type Notification: Send;

    /// Queues every key at start-up.
    fn resync(&mut self, queue: &mut WorkQueue<Self::Key, Self::Reason>) -> impl Future<Output = ()> + Send;

    /// Queues the keys `notification` concerns (every key when it says notifications were missed).
    fn observe(
        &mut self,
        notification: Self::Notification,
        queue: &mut WorkQueue<Self::Key, Self::Reason>,
    ) -> impl Future<Output = ()> + Send;

    /// Brings `key` to what it should be; `backoff` is what a failure would back off.
    fn reconcile(
        &self,
        key: Self::Key,
        reason: Self::Reason,
        backoff: Duration,
    ) -> impl Future<Output = Requeue<Self::Reason>> + Send + 'static;
}

/// [`run`] with up to `workers` reconciles of different keys at once. A key is never reconciled
/// twice at once: one due while it runs waits until it is done, then runs again (client-go's
/// dirty set). With one worker it is [`run`]: notifications received are observed before each
/// reconcile starts.
pub async fn run_concurrent<H: ConcurrentReconcile>(
    mut handler: H,
    workers: usize,
    mut queue: WorkQueue<H::Key, H::Reason>,
    notifications: impl Stream<Item = H::Notification>,
) {
    let workers = workers.max(1);
    let mut notifications = std::pin::pin!(notifications);
    let mut running = FuturesUnordered::new();
    let mut busy: HashSet<H::Key> = HashSet::new();
    // Keys that came due while they ran, with their reasons.
    let mut dirty: HashMap<H::Key, H::Reason> = HashMap::new();
    handler.resync(&mut queue).await;
    loop {
        while let Some(received) = notifications.next().now_or_never() {
            match received {
                Some(n) => handler.observe(n, &mut queue).await,
                None => return,
            }
        }
        if running.len() < workers
            && let Some((key, reason)) = queue.pop()
        {
            if busy.contains(&key) {
                let reason = match dirty.remove(&key) {
                    Some(earlier) => H::Reason::merge(earlier, reason),
                    None => reason,
                };
                dirty.insert(key, reason);
            } else {
                busy.insert(key.clone());
                let reconcile = handler.reconcile(key.clone(), reason, queue.next_backoff(&key));
                running.push(reconcile.map(move |requeue| (key, requeue)));
            }
            continue;
        }
        let due = queue.due();
        tokio::select! {
            Some((key, requeue)) = running.next(), if !running.is_empty() => {
                busy.remove(&key);
                settle(&mut queue, key.clone(), requeue);
                if let Some(reason) = dirty.remove(&key) {
                    queue.add(key, reason);
                }
            }
            n = notifications.next() => match n {
                Some(n) => handler.observe(n, &mut queue).await,
                None => return,
            },
            () = due, if running.len() < workers => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Backoff;
    use std::sync::{Arc, Mutex};
    use tokio::sync::mpsc;
    use tokio::time::{Instant, advance};

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Why {
        Resync,
        Changed,
        Requeued,
        Failed,
        Pushed,
    }

    impl Reason for Why {}

    const BACKOFF: Backoff = Backoff { initial: Duration::from_millis(100), max: Duration::from_secs(1) };

    type Note = (u32, Why);

    /// Keys are numbers; the notification `(n, why)` queues key `n`, first if `why` is `Pushed`.
    /// Each reconcile is recorded with its time since the start, and answers with the next of
    /// `answers` (then `Done`); the reconcile of `during.0` sends the notification `during.1`.
    struct Fake {
        keys: Vec<u32>,
        answers: Vec<Requeue<Why>>,
        during: Option<(u32, Note, mpsc::UnboundedSender<Note>)>,
        seen: Arc<Mutex<Vec<(u32, Why, Duration)>>>,
        idles: Arc<Mutex<u32>>,
        start: Instant,
    }

    impl Reconcile for Fake {
        type Key = u32;
        type Reason = Why;
        type Notification = Note;

        async fn resync(&mut self, queue: &mut WorkQueue<u32, Why>) {
            for key in &self.keys {
                queue.add(*key, Why::Resync);
            }
        }

        async fn observe(&mut self, (key, why): Note, queue: &mut WorkQueue<u32, Why>) {
            // Observing may wait (a push's diff): the next reconcile waits for it.
            tokio::task::yield_now().await;
            if why == Why::Pushed {
                queue.add_first(key, why);
            } else {
                queue.add(key, why);
            }
        }

        async fn reconcile(&mut self, key: u32, reason: Why, _: &WorkQueue<u32, Why>) -> Requeue<Why> {
            self.seen.lock().unwrap().push((key, reason, self.start.elapsed()));
            if self.during.as_ref().is_some_and(|(k, _, _)| *k == key)
                && let Some((_, notification, tx)) = self.during.take()
            {
                tx.send(notification).unwrap();
            }
            if self.answers.is_empty() { Requeue::Done } else { self.answers.remove(0) }
        }

        fn idle(&mut self) {
            *self.idles.lock().unwrap() += 1;
        }
    }

    type Seen = Arc<Mutex<Vec<(u32, Why, Duration)>>>;

    fn fake(keys: &[u32], answers: Vec<Requeue<Why>>) -> (Fake, Seen, Arc<Mutex<u32>>) {
        let seen = Seen::default();
        let idles = Arc::new(Mutex::new(0));
        let fake = Fake {
            keys: keys.to_vec(),
            answers,
            during: None,
            seen: seen.clone(),
            idles: idles.clone(),
            start: Instant::now(),
        };
        (fake, seen, idles)
    }

    /// Notifications that end once every sender is dropped.
    fn channel() -> (mpsc::UnboundedSender<Note>, impl Stream<Item = Note>) {
        let (tx, mut rx) = mpsc::unbounded_channel();
        (tx, futures::stream::poll_fn(move |cx| rx.poll_recv(cx)))
    }

    #[tokio::test(start_paused = true)]
    async fn t10_resyncs_first_then_runs_each_changed_key_once_and_stops_when_notifications_end() {
        let (handler, seen, idles) = fake(&[1, 2], Vec::new());
        let (tx, rx) = channel();
        let loop_ = tokio::spawn(run(handler, WorkQueue::new(BACKOFF), rx));
        tokio::task::yield_now().await;
        for n in [3, 3, 1] {
            tx.send((n, Why::Changed)).unwrap();
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
        drop(tx);
        loop_.await.unwrap();
        let seen: Vec<_> = seen.lock().unwrap().iter().map(|(k, r, _)| (*k, *r)).collect();
        assert_eq!(seen, [(1, Why::Resync), (2, Why::Resync), (3, Why::Changed), (1, Why::Changed)]);
        assert!(*idles.lock().unwrap() >= 1, "idle once nothing was due");
    }

    #[tokio::test(start_paused = true)]
    async fn t10_failures_back_off_per_key_and_a_requeue_runs_after_its_delay() {
        let answers = vec![
            Requeue::Backoff(Why::Failed),
            Requeue::Backoff(Why::Failed),
            Requeue::After(Duration::from_secs(5), Why::Requeued),
        ];
        let (handler, seen, _) = fake(&[7], answers);
        let (tx, rx) = channel();
        let loop_ = tokio::spawn(run(handler, WorkQueue::new(BACKOFF), rx));
        // The paused clock jumps from timer to timer, letting the loop run at each.
        tokio::time::sleep(Duration::from_secs(10)).await;
        drop(tx);
        loop_.await.unwrap();
        let seen = seen.lock().unwrap().clone();
        let at = |ms: u64| Duration::from_millis(ms);
        assert_eq!(
            seen,
            [
                (7, Why::Resync, at(0)),
                (7, Why::Failed, at(100)),
                (7, Why::Failed, at(300)),
                (7, Why::Requeued, at(5300))
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn t10_a_notification_received_during_a_burst_is_observed_before_the_next_reconcile() {
        let (mut handler, seen, _) = fake(&[1, 2, 3], Vec::new());
        let (tx, rx) = channel();
        handler.during = Some((1, (9, Why::Pushed), tx.clone()));
        let loop_ = tokio::spawn(run(handler, WorkQueue::new(BACKOFF), rx));
        tokio::time::sleep(Duration::from_millis(1)).await;
        drop(tx);
        loop_.await.unwrap();
        let seen: Vec<_> = seen.lock().unwrap().iter().map(|(k, r, _)| (*k, *r)).collect();
        assert_eq!(seen, [(1, Why::Resync), (9, Why::Pushed), (2, Why::Resync), (3, Why::Resync)]);
    }

    /// Keys are numbers; each reconcile takes `took`, is recorded with its start, and counts
    /// the reconciles running at once.
    struct Slow {
        keys: Vec<u32>,
        took: Duration,
        seen: Seen,
        /// Running now, and the most ever at once.
        running: Arc<Mutex<(usize, usize)>>,
        start: Instant,
    }

    impl ConcurrentReconcile for Slow {
        type Key = u32;
        type Reason = Why;
        type Notification = Note;

        async fn resync(&mut self, queue: &mut WorkQueue<u32, Why>) {
            for key in &self.keys {
                queue.add(*key, Why::Resync);
            }
        }

        async fn observe(&mut self, (key, why): Note, queue: &mut WorkQueue<u32, Why>) {
            queue.add(key, why);
        }

        fn reconcile(&self, key: u32, reason: Why, _: Duration) -> impl Future<Output = Requeue<Why>> + Send + 'static {
            let (seen, running, start, took) = (self.seen.clone(), self.running.clone(), self.start, self.took);
            async move {
                seen.lock().unwrap().push((key, reason, start.elapsed()));
                {
                    let mut running = running.lock().unwrap();
                    running.0 += 1;
                    running.1 = running.1.max(running.0);
                }
                tokio::time::sleep(took).await;
                running.lock().unwrap().0 -= 1;
                Requeue::Done
            }
        }
    }

    /// Runs `keys` on `workers`, each reconcile taking 10 ms, sending `notes` at their times:
    /// every reconcile (key, reason, start in ms) and the most that ran at once.
    async fn run_slow(keys: &[u32], workers: usize, notes: &[(u64, Note)]) -> (Vec<(u32, Why, u64)>, usize) {
        let seen = Seen::default();
        let running = Arc::new(Mutex::new((0, 0)));
        let start = Instant::now();
        let handler = Slow {
            keys: keys.to_vec(),
            took: Duration::from_millis(10),
            seen: seen.clone(),
            running: running.clone(),
            start,
        };
        let (tx, rx) = channel();
        let loop_ = tokio::spawn(run_concurrent(handler, workers, WorkQueue::new(BACKOFF), rx));
        for (at, note) in notes {
            tokio::time::sleep_until(start + Duration::from_millis(*at)).await;
            tx.send(*note).unwrap();
        }
        tokio::time::sleep_until(start + Duration::from_secs(1)).await;
        drop(tx);
        loop_.await.unwrap();
        let seen = seen.lock().unwrap().iter().map(|(k, r, at)| (*k, *r, at.as_millis() as u64)).collect();
        let most = running.lock().unwrap().1;
        (seen, most)
    }

    #[tokio::test(start_paused = true)]
    async fn t10_concurrent_runs_different_keys_at_once_up_to_the_workers() {
        use Why::Resync;
        type Case<'a> = (usize, &'a [(u32, Why, u64)], usize);
        let cases: [Case; 3] = [
            (1, &[(1, Resync, 0), (2, Resync, 10), (3, Resync, 20), (4, Resync, 30)], 1),
            (2, &[(1, Resync, 0), (2, Resync, 0), (3, Resync, 10), (4, Resync, 10)], 2),
            (8, &[(1, Resync, 0), (2, Resync, 0), (3, Resync, 0), (4, Resync, 0)], 4),
        ];
        for (workers, want, most) in cases {
            let (mut seen, ran_at_once) = run_slow(&[1, 2, 3, 4], workers, &[]).await;
            seen.sort_by_key(|(k, _, at)| (*at, *k));
            assert_eq!(seen, want, "{workers} workers");
            assert_eq!(ran_at_once, most, "{workers} workers");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn t10_concurrent_runs_a_key_queued_while_it_runs_once_after_it() {
        // Key 1 changes twice while its first reconcile runs: one more reconcile, when it is
        // done, named by the first change; key 2, queued meanwhile, runs at once on a free worker.
        let notes = [(3, (1, Why::Changed)), (5, (2, Why::Changed)), (7, (1, Why::Pushed))];
        let (mut seen, most) = run_slow(&[1], 3, &notes).await;
        seen.sort_by_key(|(k, _, at)| (*at, *k));
        assert_eq!(seen, [(1, Why::Resync, 0), (2, Why::Changed, 5), (1, Why::Changed, 10)]);
        assert_eq!(most, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn t10_settle_retries_without_counting_and_parks_counting() {
        let mut queue: WorkQueue<u32, Why> = WorkQueue::new(BACKOFF);
        settle(&mut queue, 1, Requeue::RetryAfter(Duration::from_millis(50), Why::Failed));
        assert_eq!(queue.next_due(), Some(Instant::now() + Duration::from_millis(50)));
        assert_eq!(queue.next_backoff(&1), Duration::from_millis(100), "a retry does not count");
        advance(Duration::from_millis(50)).await;
        assert_eq!(queue.pop(), Some((1, Why::Failed)));
        settle(&mut queue, 1, Requeue::Park(Duration::from_secs(60), Why::Failed));
        assert_eq!(queue.next_due(), Some(Instant::now() + Duration::from_secs(60)));
        assert_eq!(queue.next_backoff(&1), Duration::from_millis(200), "a park counts");
        settle(&mut queue, 1, Requeue::Done);
        assert_eq!(queue.next_backoff(&1), Duration::from_millis(100), "done forgets");
    }
}
