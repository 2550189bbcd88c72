//! What the runtime manager's CRI calls cost, per operation: counts and time, cumulative since
//! the agent started, so that a pod start can be broken down into its calls (the pod-start
//! benchmark reads the difference of two snapshots).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

/// One CRI operation's calls so far.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CallStats {
    pub count: u64,
    pub total: Duration,
    pub max: Duration,
}

impl CallStats {
    /// The calls made between `earlier` and `self` (max is kept as the later snapshot's).
    pub fn since(&self, earlier: &CallStats) -> CallStats {
        CallStats { count: self.count - earlier.count, total: self.total.saturating_sub(earlier.total), max: self.max }
    }
}

#[derive(Default)]
pub struct CriCalls(Mutex<BTreeMap<&'static str, CallStats>>);

impl CriCalls {
    pub fn record(&self, op: &'static str, elapsed: Duration) {
        // A panicking holder cannot leave a counter half-updated in a way that matters.
        let mut ops = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let stats = ops.entry(op).or_default();
        stats.count += 1;
        stats.total += elapsed;
        stats.max = stats.max.max(elapsed);
    }

    pub fn snapshot(&self) -> BTreeMap<&'static str, CallStats> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_differences() {
        let calls = CriCalls::default();
        calls.record("RunPodSandbox", Duration::from_millis(100));
        let before = calls.snapshot();
        calls.record("RunPodSandbox", Duration::from_millis(120));
        calls.record("StartContainer", Duration::from_millis(30));
        let after = calls.snapshot();
        let sandbox = after["RunPodSandbox"].since(&before["RunPodSandbox"]);
        assert_eq!(sandbox, CallStats { count: 1, total: Duration::from_millis(120), max: Duration::from_millis(120) });
        assert_eq!(after["StartContainer"].since(&CallStats::default()).count, 1);
    }
}
