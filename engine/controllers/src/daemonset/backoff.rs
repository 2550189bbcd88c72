//! The back-off between deletions of a node's failed daemon Pods (upstream's
//! `failedPodsBackoff`, a client-go `flowcontrol.Backoff` of 1 s doubling to 15 min): a daemon
//! Pod the kubelet keeps failing (evicted, refused at admission) is replaced ever more slowly
//! instead of in a hot loop of create, fail, delete. Per (DaemonSet, its observed generation,
//! node), so a new template starts over. Pure: the caller gives the time.

use k8s_openapi::api::apps::v1::DaemonSet;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Each key's back-off: how long after its last failed Pod's deletion the next may go.
#[derive(Clone, Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    entries: HashMap<String, Entry>,
}

#[derive(Clone, Copy, Debug)]
struct Entry {
    backoff: Duration,
    last_update: Instant,
}

impl Default for Backoff {
    /// Upstream's failed Pods back-off: 1 s, doubling, at most 15 min.
    fn default() -> Self {
        Backoff::new(Duration::from_secs(1), Duration::from_secs(15 * 60))
    }
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Self {
        Backoff { initial, max, entries: HashMap::new() }
    }

    /// The key of a node's failed Pods of `ds` (upstream's `failedPodsBackoffKey`).
    pub fn key(ds: &DaemonSet, node: &str) -> String {
        let uid = ds.metadata.uid.as_deref().unwrap_or_default();
        let generation = ds.status.as_ref().and_then(|s| s.observed_generation).unwrap_or(0);
        format!("{uid}/{generation}/{node}")
    }

    /// An entry untouched for twice the maximum is forgotten: the next failure starts over.
    fn expired(&self, entry: &Entry, now: Instant) -> bool {
        now.saturating_duration_since(entry.last_update) > self.max * 2
    }

    /// How much longer the key waits since its last deletion, if it still does
    /// (`IsInBackOffSinceUpdate`).
    pub fn remaining(&self, key: &str, now: Instant) -> Option<Duration> {
        let entry = self.entries.get(key).filter(|e| !self.expired(e, now))?;
        entry.backoff.checked_sub(now.saturating_duration_since(entry.last_update)).filter(|d| !d.is_zero())
    }

    /// Records a deletion at `now`: the first (or the first after expiry) waits `initial`,
    /// each further one twice the last, at most `max` (`Next`).
    pub fn next(&mut self, key: &str, now: Instant) {
        let backoff = match self.entries.get(key) {
            Some(entry) if !self.expired(entry, now) => entry.backoff.saturating_mul(2).min(self.max),
            _ => self.initial,
        };
        self.entries.insert(key.to_owned(), Entry { backoff, last_update: now });
    }

    /// Forgets expired entries (upstream's periodic `GC`).
    pub fn gc(&mut self, now: Instant) {
        let max = self.max;
        self.entries.retain(|_, e| now.saturating_duration_since(e.last_update) <= max * 2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    enum Step {
        /// A failed Pod is deleted at this second.
        Next(u64),
        /// At this second the key still waits this many seconds (0: it may go).
        Wait(u64, u64),
        /// Expired entries are forgotten at this second; this many remain.
        Gc(u64, usize),
    }
    use Step::*;

    #[test]
    fn failed_pods_back_off_table() {
        #[rustfmt::skip]
        let cases: Vec<(&str, Vec<Step>)> = vec![
            ("no failure yet: no wait", vec![Wait(0, 0)]),
            ("the first deletion waits 1 s", vec![Next(0), Wait(0, 1), Wait(1, 0)]),
            ("then 2 s, 4 s, 8 s", vec![Next(0), Next(1), Wait(2, 1), Wait(3, 0), Next(3), Wait(3, 4), Next(7), Wait(10, 5)]),
            ("doubling stops at 15 min",
             vec![Next(0), Next(1), Next(3), Next(7), Next(15), Next(31), Next(63), Next(127), Next(255), Next(511),
                  Wait(511, 512), Next(1023), Wait(1023, 900), Next(1923), Wait(1923, 900)]),
            ("over 30 min (twice the cap) without one starts over at 1 s",
             vec![Next(0), Next(1), Next(3), Wait(3, 4), Next(3 + 1801), Wait(3 + 1801, 1)]),
            ("just within twice the cap it keeps doubling", vec![Next(0), Next(1800), Wait(1800, 2)]),
            ("gc forgets expired keys only", vec![Next(0), Gc(1800, 1), Gc(1801, 0), Wait(1801, 0)]),
        ];
        for (what, steps) in cases {
            let (start, key) = (Instant::now(), "ds-uid/3/node-a");
            let at = |s: u64| start + Duration::from_secs(s);
            let mut backoff = Backoff::default();
            for step in steps {
                match step {
                    Next(s) => backoff.next(key, at(s)),
                    Wait(s, wait) => assert_eq!(
                        backoff.remaining(key, at(s)),
                        (wait > 0).then(|| Duration::from_secs(wait)),
                        "{what}: at {s} s"
                    ),
                    Gc(s, left) => {
                        backoff.gc(at(s));
                        assert_eq!(backoff.entries.len(), left, "{what}: gc at {s} s");
                    }
                }
            }
            assert_eq!(backoff.remaining("ds-uid/3/node-b", at(0)), None, "{what}: another node is not held");
        }
    }

    #[test]
    fn the_key_names_the_daemon_set_its_observed_generation_and_the_node() {
        let ds: DaemonSet = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "agent", "uid": "u1", "generation": 4}, "status": {
                "observedGeneration": 3, "currentNumberScheduled": 0, "desiredNumberScheduled": 0,
                "numberMisscheduled": 0, "numberReady": 0}
        }))
        .unwrap();
        assert_eq!(Backoff::key(&ds, "n1"), "u1/3/n1");
    }
}
