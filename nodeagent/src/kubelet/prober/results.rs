//! The kubelet's probe results caches (`pkg/kubelet/prober/results`): the latest verdict of each
//! probe of each container run, keyed by container id, so a restarted container starts afresh.

use std::collections::HashMap;
use std::fmt;

/// Which probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ProbeType {
    Liveness,
    Readiness,
    Startup,
}

impl ProbeType {
    /// As Kubernetes names it in messages: `Liveness probe failed: …`.
    pub fn title(self) -> &'static str {
        match self {
            ProbeType::Liveness => "Liveness",
            ProbeType::Readiness => "Readiness",
            ProbeType::Startup => "Startup",
        }
    }

    /// The value a worker publishes when it first sees a container (kubelet's `initialValue`):
    /// not ready until proven ready, alive until proven dead, not started until proven started.
    pub fn initial(self) -> ProbeResult {
        match self {
            ProbeType::Liveness => ProbeResult::Success,
            ProbeType::Readiness => ProbeResult::Failure,
            ProbeType::Startup => ProbeResult::Unknown,
        }
    }
}

impl fmt::Display for ProbeType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ProbeType::Liveness => "liveness",
            ProbeType::Readiness => "readiness",
            ProbeType::Startup => "startup",
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeResult {
    Unknown,
    Success,
    Failure,
}

/// The verdicts of one Pod's probes, by container id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Results {
    by_container: HashMap<String, [Option<ProbeResult>; 3]>,
}

impl Results {
    pub fn get(&self, container_id: &str, probe: ProbeType) -> Option<ProbeResult> {
        self.by_container.get(container_id).and_then(|r| r[probe as usize])
    }

    /// Sets a verdict; whether it changed (the kubelet's results manager sends an update only then).
    pub fn set(&mut self, container_id: &str, probe: ProbeType, result: ProbeResult) -> bool {
        let slot = match self.by_container.get_mut(container_id) {
            Some(results) => &mut results[probe as usize],
            None => &mut self.by_container.entry(container_id.to_owned()).or_default()[probe as usize],
        };
        slot.replace(result) != Some(result)
    }

    pub fn remove(&mut self, container_id: &str, probe: ProbeType) {
        if let Some(results) = self.by_container.get_mut(container_id) {
            results[probe as usize] = None;
            if results.iter().all(Option::is_none) {
                self.by_container.remove(container_id);
            }
        }
    }
}
