//! The kubelet's eviction signals and the node conditions they decide: MemoryPressure,
//! DiskPressure and PIDPressure, each True while its signal is below its hard threshold
//! (`--eviction-hard`, the kubelet's syntax: `memory.available<100Mi,nodefs.available<10%`).
//! Pure: the host is read by [`super::signals`].

use gitplane_api::quantity::parse_units;
use k8s_openapi::api::core::v1::NodeCondition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// A threshold: an amount, or a share of the signal's capacity.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Threshold {
    Amount(u64),
    Percent(f64),
}

impl Threshold {
    /// The amount below which the signal is under pressure, given its capacity.
    pub fn amount(self, capacity: u64) -> u64 {
        match self {
            Threshold::Amount(a) => a,
            Threshold::Percent(p) => (capacity as f64 * p / 100.0) as u64,
        }
    }
}

/// Hard eviction thresholds: the kubelet's default for memory; 1 GiB free for the node's file
/// system where the kubelet has 10% (an appliance shares its disk with everything else on the
/// machine, and 10% of a large, well-used disk would keep Pods off a node with tens of GiB
/// free); 5% of the PID space (the kubelet sets none by default, leaving PIDPressure False).
#[derive(Clone, Debug, PartialEq)]
pub struct EvictionHard {
    pub memory_available: Threshold,
    pub nodefs_available: Threshold,
    pub pid_available: Threshold,
}

impl Default for EvictionHard {
    fn default() -> Self {
        EvictionHard {
            memory_available: Threshold::Amount(100 << 20),
            nodefs_available: Threshold::Amount(1 << 30),
            pid_available: Threshold::Percent(5.0),
        }
    }
}

impl std::str::FromStr for EvictionHard {
    type Err = String;

    /// `signal<threshold` items, comma-separated; signals not named keep their default.
    fn from_str(text: &str) -> Result<Self, String> {
        let mut out = EvictionHard::default();
        for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (signal, value) = item
                .split_once('<')
                .ok_or_else(|| format!("{item:?}: expected <signal><<threshold>, e.g. memory.available<100Mi"))?;
            let threshold = match value.strip_suffix('%') {
                Some(p) => Threshold::Percent(
                    p.parse()
                        .ok()
                        .filter(|p| (0.0..=100.0).contains(p))
                        .ok_or_else(|| format!("{item:?}: bad percentage"))?,
                ),
                None => Threshold::Amount(
                    parse_units(value)
                        .and_then(|v| u64::try_from(v).ok())
                        .ok_or_else(|| format!("{item:?}: {value:?} is not a quantity"))?,
                ),
            };
            match signal {
                "memory.available" => out.memory_available = threshold,
                "nodefs.available" => out.nodefs_available = threshold,
                "pid.available" => out.pid_available = threshold,
                other => {
                    return Err(format!(
                        "{other:?} is not a signal this agent knows: memory.available, nodefs.available, pid.available"
                    ));
                }
            }
        }
        Ok(out)
    }
}

/// What the host has left, with the capacity each share is taken of. `None`: not readable.
#[derive(Clone, Copy, Debug, Default)]
pub struct Signals {
    pub memory_available: Option<u64>,
    pub memory_capacity: Option<u64>,
    pub nodefs_available: Option<u64>,
    pub nodefs_capacity: Option<u64>,
    pub pid_available: Option<u64>,
    pub pid_capacity: Option<u64>,
}

struct Kind {
    condition: &'static str,
    pressure: (&'static str, &'static str),
    fine: (&'static str, &'static str),
}

const KINDS: [Kind; 3] = [
    Kind {
        condition: "MemoryPressure",
        pressure: ("KubeletHasInsufficientMemory", "kubelet has insufficient memory available"),
        fine: ("KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
    },
    Kind {
        condition: "DiskPressure",
        pressure: ("KubeletHasDiskPressure", "kubelet has disk pressure"),
        fine: ("KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
    },
    Kind {
        condition: "PIDPressure",
        pressure: ("KubeletHasInsufficientPID", "kubelet has insufficient PID available"),
        fine: ("KubeletHasSufficientPID", "kubelet has sufficient PID available"),
    },
];

fn under(available: Option<u64>, capacity: Option<u64>, threshold: Threshold) -> bool {
    match (available, threshold) {
        (Some(a), Threshold::Amount(t)) => a < t,
        (Some(a), Threshold::Percent(_)) => capacity.is_some_and(|c| a < threshold.amount(c)),
        (None, _) => false,
    }
}

/// The three pressure conditions. A condition whose status is what `previous` says keeps its
/// times, so that an unchanged node reports an unchanged status.
pub fn conditions(signals: &Signals, hard: &EvictionHard, previous: &[NodeCondition], now: Time) -> Vec<NodeCondition> {
    let pressed = [
        under(signals.memory_available, signals.memory_capacity, hard.memory_available),
        under(signals.nodefs_available, signals.nodefs_capacity, hard.nodefs_available),
        under(signals.pid_available, signals.pid_capacity, hard.pid_available),
    ];
    KINDS
        .iter()
        .zip(pressed)
        .map(|(kind, pressed)| {
            let status = if pressed { "True" } else { "False" };
            if let Some(same) = previous.iter().find(|c| c.type_ == kind.condition && c.status == status) {
                return same.clone();
            }
            let (reason, message) = if pressed { kind.pressure } else { kind.fine };
            NodeCondition {
                type_: kind.condition.into(),
                status: status.into(),
                reason: Some(reason.into()),
                message: Some(message.into()),
                last_heartbeat_time: Some(now.clone()),
                last_transition_time: Some(now.clone()),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;

    fn at(seconds: i64) -> Time {
        Time(Timestamp::from_second(seconds).unwrap())
    }

    fn statuses(conditions: &[NodeCondition]) -> Vec<(&str, &str)> {
        conditions.iter().map(|c| (c.type_.as_str(), c.status.as_str())).collect()
    }

    #[test]
    fn parses_the_kubelets_syntax() {
        let hard: EvictionHard = "memory.available<1Gi, nodefs.available<15%".parse().unwrap();
        assert_eq!(hard.memory_available, Threshold::Amount(1 << 30));
        assert_eq!(hard.nodefs_available, Threshold::Percent(15.0));
        assert_eq!(hard.pid_available, EvictionHard::default().pid_available);
        for bad in ["memory.available=1Gi", "imagefs.available<10%", "memory.available<lots", "nodefs.available<120%"] {
            assert!(bad.parse::<EvictionHard>().is_err(), "{bad}");
        }
    }

    #[test]
    fn pressure_is_a_signal_below_its_threshold() {
        let signals = Signals {
            memory_available: Some(50 << 20),
            memory_capacity: Some(8 << 30),
            nodefs_available: Some(50 << 30),
            nodefs_capacity: Some(100 << 30),
            pid_available: None,
            pid_capacity: None,
        };
        let now = conditions(&signals, &EvictionHard::default(), &[], at(10));
        assert_eq!(statuses(&now), [("MemoryPressure", "True"), ("DiskPressure", "False"), ("PIDPressure", "False")]);
        assert_eq!(now[0].reason.as_deref(), Some("KubeletHasInsufficientMemory"));
    }

    #[test]
    fn unchanged_conditions_keep_their_times() {
        let signals = Signals { memory_available: Some(1 << 30), ..Default::default() };
        let first = conditions(&signals, &EvictionHard::default(), &[], at(10));
        assert_eq!(conditions(&signals, &EvictionHard::default(), &first, at(20)), first);
        let low = Signals { memory_available: Some(1), ..signals };
        let changed = conditions(&low, &EvictionHard::default(), &first, at(30));
        assert_eq!(changed[0].last_transition_time, Some(at(30)));
        assert_eq!(changed[1], first[1]);
    }
}
