//! Taints and tolerations: upstream's matching rule, shared by the scheduler (which keeps Pods
//! off tainted nodes) and the taint eviction controller (which evicts them from NoExecute ones),
//! and the taints the node lifecycle controller puts on nodes that are not ready.

use k8s_openapi::api::core::v1::{Taint, Toleration};

/// A node whose Ready condition is False (its agent says it cannot run Pods).
pub const NOT_READY: &str = "node.kubernetes.io/not-ready";
/// A node whose Ready condition is Unknown (its agent stopped renewing its Lease).
pub const UNREACHABLE: &str = "node.kubernetes.io/unreachable";

/// A cordoned node (`spec.unschedulable`), as the scheduler's NodeUnschedulable names it.
pub const UNSCHEDULABLE: &str = "node.kubernetes.io/unschedulable";
/// Node pressure conditions (TaintNodesByCondition).
pub const MEMORY_PRESSURE: &str = "node.kubernetes.io/memory-pressure";
pub const DISK_PRESSURE: &str = "node.kubernetes.io/disk-pressure";
pub const PID_PRESSURE: &str = "node.kubernetes.io/pid-pressure";

pub const NO_SCHEDULE: &str = "NoSchedule";
pub const NO_EXECUTE: &str = "NoExecute";

/// Whether `toleration` tolerates `taint` (upstream's `ToleratesTaint`): same effect (or any),
/// same key (or any, with `Exists`), and for `Equal` the same value.
pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    let effect = toleration.effect.as_deref().unwrap_or_default();
    let key = toleration.key.as_deref().unwrap_or_default();
    if (!effect.is_empty() && effect != taint.effect) || (!key.is_empty() && key != taint.key) {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        _ => toleration.value.as_deref().unwrap_or_default() == taint.value.as_deref().unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taint(key: &str, value: Option<&str>, effect: &str) -> Taint {
        Taint { key: key.into(), value: value.map(Into::into), effect: effect.into(), time_added: None }
    }

    fn toleration(json: serde_json::Value) -> Toleration {
        serde_json::from_value(json).expect("a toleration")
    }

    #[test]
    fn upstream_matching() {
        let db = taint("dedicated", Some("db"), NO_SCHEDULE);
        let cases = [
            (serde_json::json!({"key": "dedicated", "value": "db"}), true),
            (serde_json::json!({"key": "dedicated", "value": "web"}), false),
            (serde_json::json!({"key": "dedicated", "operator": "Exists"}), true),
            (serde_json::json!({"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}), false),
            (serde_json::json!({"operator": "Exists"}), true),
            (serde_json::json!({"key": "other", "operator": "Exists"}), false),
        ];
        for (t, expected) in cases {
            assert_eq!(tolerates(&toleration(t.clone()), &db), expected, "{t}");
        }
        let bare = taint(NOT_READY, None, NO_EXECUTE);
        assert!(tolerates(&toleration(serde_json::json!({"key": NOT_READY})), &bare), "Equal to no value");
    }
}
