//! Starting a node's processes again when they fail, as systemd's `Restart=` does for a
//! kubelet and a containerd: after a back-off that doubles while the process keeps failing soon
//! after it started, and starts over once it ran for a while.

use std::time::{Duration, Instant};

/// The waits between the starts of one process.
#[derive(Debug)]
pub struct Backoff {
    delay: Duration,
    started: Instant,
}

impl Backoff {
    /// The first wait, and the longest.
    pub const MIN: Duration = Duration::from_secs(1);
    pub const MAX: Duration = Duration::from_secs(30);
    /// A process that ran this long before it failed is started again after [`Self::MIN`].
    pub const RESET_AFTER: Duration = Duration::from_secs(60);

    /// For a process started at `started`.
    pub fn new(started: Instant) -> Backoff {
        Backoff { delay: Self::MIN, started }
    }

    /// How long to wait before starting again a process that failed at `now`.
    pub fn failed(&mut self, now: Instant) -> Duration {
        if now.saturating_duration_since(self.started) > Self::RESET_AFTER {
            self.delay = Self::MIN;
        }
        let wait = self.delay;
        self.delay = (self.delay * 2).min(Self::MAX);
        wait
    }

    /// The process was started (again) at `now`.
    pub fn started(&mut self, now: Instant) {
        self.started = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_while_failing_soon_and_starts_over_after_a_long_run() {
        let t0 = Instant::now();
        let mut backoff = Backoff::new(t0);
        let mut now = t0;
        let mut waits = Vec::new();
        for _ in 0..7 {
            now += Duration::from_secs(1);
            let wait = backoff.failed(now);
            waits.push(wait.as_secs());
            now += wait;
            backoff.started(now);
        }
        assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30]);
        let wait = backoff.failed(now + Backoff::RESET_AFTER + Duration::from_secs(1));
        assert_eq!(wait, Backoff::MIN);
    }
}
