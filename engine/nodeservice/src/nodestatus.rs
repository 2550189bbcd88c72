//! What a node may say about itself, and what the control plane derives from it: NodeRestriction's
//! rule on a node's own labels, the merge of a reported NodeStatus, and TaintNodesByCondition's
//! taints for the pressure conditions.

use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus, Taint};
use std::collections::BTreeMap;

/// The label prefixes under `kubernetes.io` / `k8s.io` a node may set on itself (NodeRestriction's
/// allowed list); any other label in those namespaces is for the cluster's owner to set.
const ALLOWED_KUBERNETES_LABELS: [&str; 8] = [
    "kubernetes.io/hostname",
    "kubernetes.io/arch",
    "kubernetes.io/os",
    "beta.kubernetes.io/",
    "failure-domain.beta.kubernetes.io/",
    "topology.kubernetes.io/",
    "kubelet.kubernetes.io/",
    "node.kubernetes.io/",
];

/// A label a node may not give itself, with why: `node-restriction.kubernetes.io/` is reserved for
/// labels that only the cluster's owner sets (so that Pods can be kept on nodes a node cannot
/// claim), and other `kubernetes.io` / `k8s.io` labels outside the allowed list.
pub fn forbidden_label(labels: &BTreeMap<String, String>) -> Option<String> {
    labels.keys().find_map(|key| {
        let namespace = key.split_once('/').map(|(prefix, _)| prefix)?;
        if namespace == "node-restriction.kubernetes.io" || namespace.ends_with(".node-restriction.kubernetes.io") {
            return Some(format!("label {key:?}: the node-restriction.kubernetes.io/ prefix is not a node's to set"));
        }
        let kubernetes =
            ["kubernetes.io", "k8s.io"].iter().any(|d| namespace == *d || namespace.ends_with(&format!(".{d}")));
        (kubernetes && !ALLOWED_KUBERNETES_LABELS.iter().any(|allowed| key.starts_with(allowed))).then(|| {
            format!(
                "label {key:?}: a node may set only {} in the kubernetes.io and k8s.io namespaces",
                ALLOWED_KUBERNETES_LABELS.join(", ")
            )
        })
    })
}

/// The Node's status after a report: the reported one. Its Ready condition is the node's word
/// (the kubelet's: False while its runtime or the runtime's network is not ready); a report
/// without one keeps the stored Ready.
pub fn merge(stored: Option<&NodeStatus>, mut reported: NodeStatus) -> NodeStatus {
    let mut conditions: Vec<NodeCondition> = reported.conditions.take().unwrap_or_default();
    if !conditions.iter().any(|c| c.type_ == "Ready") {
        let stored = stored.and_then(|s| s.conditions.as_ref()).and_then(|c| c.iter().find(|c| c.type_ == "Ready"));
        conditions.extend(stored.cloned());
    }
    conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
    reported.conditions = Some(conditions);
    // The node's addresses and identity come with its registration.
    if let Some(stored) = stored {
        reported.addresses = stored.addresses.clone();
        reported.node_info = stored.node_info.clone().or(reported.node_info);
        reported.daemon_endpoints = reported.daemon_endpoints.or_else(|| stored.daemon_endpoints.clone());
    }
    reported
}

/// The taints for each pressure condition, as the node lifecycle controller's
/// TaintNodesByCondition sets them.
const CONDITION_TAINTS: [(&str, &str); 3] = [
    ("MemoryPressure", "node.kubernetes.io/memory-pressure"),
    ("DiskPressure", "node.kubernetes.io/disk-pressure"),
    ("PIDPressure", "node.kubernetes.io/pid-pressure"),
];

/// `taints` with a NoSchedule taint for each pressure condition that is True, and none for the
/// others; taints that are not a condition's are kept as they are.
pub fn condition_taints(status: &NodeStatus, taints: &[Taint]) -> Vec<Taint> {
    let conditions = status.conditions.as_deref().unwrap_or_default();
    let mut out: Vec<Taint> =
        taints.iter().filter(|t| !CONDITION_TAINTS.iter().any(|(_, key)| t.key == *key)).cloned().collect();
    for (condition, key) in CONDITION_TAINTS {
        if conditions.iter().any(|c| c.type_ == condition && c.status == "True") {
            out.push(Taint { key: key.into(), effect: "NoSchedule".into(), value: None, time_added: None });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn condition(type_: &str, status: &str) -> NodeCondition {
        NodeCondition { type_: type_.into(), status: status.into(), ..Default::default() }
    }

    #[test]
    fn a_node_keeps_to_its_own_labels() {
        let labels = |keys: &[&str]| keys.iter().map(|k| (k.to_string(), "x".to_string())).collect();
        assert_eq!(forbidden_label(&labels(&["kubernetes.io/hostname", "disk", "example.com/rack"])), None);
        assert_eq!(
            forbidden_label(&labels(&["topology.kubernetes.io/zone", "node.kubernetes.io/instance-type"])),
            None
        );
        let err = forbidden_label(&labels(&["node-restriction.kubernetes.io/pci"])).unwrap();
        assert!(err.contains("not a node's to set"), "{err}");
        let err = forbidden_label(&labels(&["node-role.kubernetes.io/control-plane"])).unwrap();
        assert!(err.contains("may set only"), "{err}");
        assert!(forbidden_label(&labels(&["foo.k8s.io/bar"])).is_some());
    }

    #[test]
    fn ready_is_the_nodes_word_when_it_gives_one() {
        let stored = NodeStatus { conditions: Some(vec![condition("Ready", "True")]), ..Default::default() };
        let reported = NodeStatus {
            conditions: Some(vec![condition("Ready", "False"), condition("MemoryPressure", "False")]),
            ..Default::default()
        };
        let merged = merge(Some(&stored), reported);
        let types: Vec<_> = merged.conditions.iter().flatten().map(|c| (c.type_.as_str(), c.status.as_str())).collect();
        assert_eq!(types, [("MemoryPressure", "False"), ("Ready", "False")]);
        let silent = NodeStatus { conditions: Some(vec![condition("MemoryPressure", "False")]), ..Default::default() };
        let merged = merge(Some(&stored), silent);
        let types: Vec<_> = merged.conditions.iter().flatten().map(|c| (c.type_.as_str(), c.status.as_str())).collect();
        assert_eq!(types, [("MemoryPressure", "False"), ("Ready", "True")]);
    }

    #[test]
    fn pressure_taints_follow_the_conditions() {
        let status = NodeStatus {
            conditions: Some(vec![condition("DiskPressure", "True"), condition("MemoryPressure", "False")]),
            ..Default::default()
        };
        let own =
            Taint { key: "dedicated".into(), value: Some("db".into()), effect: "NoSchedule".into(), time_added: None };
        let stale =
            Taint { key: "node.kubernetes.io/memory-pressure".into(), effect: "NoSchedule".into(), ..own.clone() };
        let taints = condition_taints(&status, &[own.clone(), stale]);
        let keys: Vec<_> = taints.iter().map(|t| t.key.as_str()).collect();
        assert_eq!(keys, ["dedicated", "node.kubernetes.io/disk-pressure"]);
    }
}
