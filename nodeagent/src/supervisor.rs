//! The agent's long-running tasks, owned in one place. A task that ends while the agent runs
//! (it returned, or panicked) is logged and started again after a back-off ([`Backoff`], as
//! for the node's processes), or, when it cannot be started again, ends the agent with an
//! error that names it. [`Supervisor::stop`] tells every task to stop through one watch
//! channel, aborts the ones whose result is not needed and waits a bounded time for the rest.

use crate::kubelet::restart::Backoff;
use futures::future::BoxFuture;
use std::{collections::HashMap, future::Future, time::Duration};
use tokio::{
    sync::watch,
    task::{AbortHandle, Id, JoinSet},
    time::Instant,
};

/// A task that ended while the agent ran and could not be started again.
#[derive(Debug, thiserror::Error)]
#[error("the agent's {task} task ended: {why}")]
pub struct TaskError {
    pub task: &'static str,
    pub why: String,
}

/// What [`Supervisor::stop`] does with a task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AtStop {
    /// Aborted at once.
    Abort,
    /// Waited for: it ends on the stop signal and its result is needed.
    Await,
}

type Start<T> = Box<dyn FnMut(watch::Receiver<bool>) -> BoxFuture<'static, T> + Send>;

/// What happens when a task ends before the agent stops.
enum OnEnd<T> {
    /// Started again after the back-off.
    Restart(Start<T>, Backoff),
    /// The agent ends.
    Fail,
    /// A return is the task being done; a panic ends the agent.
    MayFinish,
}

struct Task<T> {
    name: &'static str,
    on_end: OnEnd<T>,
    at_stop: AtStop,
    abort: AbortHandle,
}

/// The tasks, and the stop signal they are given.
pub(crate) struct Supervisor<T> {
    tasks: JoinSet<T>,
    running: HashMap<Id, Task<T>>,
    stop: watch::Sender<bool>,
}

impl<T: Send + 'static> Supervisor<T> {
    pub(crate) fn new() -> Self {
        Supervisor { tasks: JoinSet::new(), running: HashMap::new(), stop: watch::channel(false).0 }
    }

    /// The stop signal: true once [`Self::stop`] is called.
    pub(crate) fn stopping(&self) -> watch::Receiver<bool> {
        self.stop.subscribe()
    }

    /// Runs `start(stop signal)` now, and again after a back-off whenever it ends before the
    /// agent stops.
    pub(crate) fn restarting<S, F>(&mut self, name: &'static str, at_stop: AtStop, mut start: S)
    where
        S: FnMut(watch::Receiver<bool>) -> F + Send + 'static,
        F: Future<Output: Into<T>> + Send + 'static,
    {
        let mut start: Start<T> = Box::new(move |stop| {
            let task = start(stop);
            Box::pin(async move { task.await.into() })
        });
        let first = start(self.stopping());
        let on_end = OnEnd::Restart(start, Backoff::new(std::time::Instant::now()));
        self.spawn(name, on_end, at_stop, first);
    }

    /// Runs `task`, which runs until the agent stops: if it ends before, the agent ends.
    pub(crate) fn critical(&mut self, name: &'static str, task: impl Future<Output: Into<T>> + Send + 'static) {
        self.spawn(name, OnEnd::Fail, AtStop::Abort, Box::pin(async move { task.await.into() }));
    }

    /// Runs `task`, which may be done before the agent stops; a panic ends the agent.
    pub(crate) fn finite(&mut self, name: &'static str, task: impl Future<Output: Into<T>> + Send + 'static) {
        self.spawn(name, OnEnd::MayFinish, AtStop::Abort, Box::pin(async move { task.await.into() }));
    }

    fn spawn(&mut self, name: &'static str, on_end: OnEnd<T>, at_stop: AtStop, task: BoxFuture<'static, T>) {
        let abort = self.tasks.spawn(task);
        self.running.insert(abort.id(), Task { name, on_end, at_stop, abort });
    }

    /// Watches the tasks while the agent runs: starts again the ones that end, and returns the
    /// first end that the agent cannot go on without.
    pub(crate) async fn watch(&mut self) -> TaskError {
        loop {
            let Some(joined) = self.tasks.join_next_with_id().await else {
                return std::future::pending().await;
            };
            let (id, why) = match joined {
                Ok((id, _)) => (id, None),
                Err(e) => (e.id(), Some(e.to_string())),
            };
            let Some(mut task) = self.running.remove(&id) else { continue };
            match (&mut task.on_end, why) {
                (OnEnd::MayFinish, None) => tracing::debug!(task = task.name, "agent task done"),
                (OnEnd::Restart(start, backoff), why) => {
                    let why = why.unwrap_or_else(|| "it returned".into());
                    let wait = backoff.failed(std::time::Instant::now());
                    tracing::warn!(task = task.name, %why, restart_in = ?wait, "an agent task ended; starting it again");
                    let next = start(self.stopping());
                    backoff.started(std::time::Instant::now() + wait);
                    let abort = self.tasks.spawn(async move {
                        tokio::time::sleep_until(Instant::now() + wait).await;
                        next.await
                    });
                    task.abort = abort;
                    self.running.insert(task.abort.id(), task);
                }
                (OnEnd::Fail | OnEnd::MayFinish, why) => {
                    let why = why.unwrap_or_else(|| "it returned".into());
                    tracing::error!(task = task.name, %why, "an agent task ended; the agent stops");
                    return TaskError { task: task.name, why };
                }
            }
        }
    }

    /// Signals every task to stop, aborts those not [`AtStop::Await`]ed and gives back what the
    /// others return within `deadline` (the rest are aborted).
    pub(crate) async fn stop(mut self, deadline: Duration) -> Vec<T> {
        self.stop.send_replace(true);
        for task in self.running.values().filter(|t| t.at_stop == AtStop::Abort) {
            task.abort.abort();
        }
        let mut ended = Vec::new();
        let joined = async {
            while let Some(joined) = self.tasks.join_next().await {
                ended.extend(joined.ok());
            }
        };
        if tokio::time::timeout(deadline, joined).await.is_err() {
            let left: Vec<&str> = self.running.values().filter(|t| !t.abort.is_finished()).map(|t| t.name).collect();
            tracing::warn!(?deadline, ?left, "agent tasks did not stop in time; aborted");
        }
        ended
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    };

    #[tokio::test]
    async fn a_task_that_ends_is_started_again_and_a_critical_one_ends_the_agent() {
        let mut tasks = Supervisor::<u32>::new();
        let starts = Arc::new(AtomicU32::new(0));
        tasks.restarting("flaky", AtStop::Abort, {
            let starts = starts.clone();
            move |_| {
                let starts = starts.clone();
                async move {
                    if starts.fetch_add(1, Ordering::SeqCst) == 0 {
                        panic!("first run fails");
                    }
                    std::future::pending::<u32>().await
                }
            }
        });
        tasks.finite("done", async { 7u32 });
        let (fail, failed) = tokio::sync::oneshot::channel::<()>();
        tasks.critical("endpoint", async move {
            let _ = failed.await;
            0u32
        });
        let watching = tokio::time::timeout(Duration::from_secs(5), tasks.watch());
        let started_again = async {
            while starts.load(Ordering::SeqCst) < 2 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            drop(fail);
        };
        let (error, ()) = tokio::join!(watching, started_again);
        let error = error.expect("the critical task's end is reported");
        assert_eq!((error.task, error.why.as_str()), ("endpoint", "it returned"));
        assert_eq!(starts.load(Ordering::SeqCst), 2, "the panicked task was started once more");
    }

    #[tokio::test]
    async fn stop_waits_for_awaited_tasks_and_aborts_the_rest() {
        let mut tasks = Supervisor::<&str>::new();
        tasks.restarting("proxy", AtStop::Await, |mut stop: watch::Receiver<bool>| async move {
            let _ = stop.wait_for(|s| *s).await;
            "rules"
        });
        tasks.critical("heartbeat", std::future::pending::<&str>());
        let left = tokio::time::timeout(Duration::from_secs(5), tasks.stop(Duration::from_secs(5))).await;
        assert_eq!(left.expect("stop is bounded"), ["rules"]);
    }
}
