//! NodeAffinity: `requiredDuringSchedulingIgnoredDuringExecution` as a filter (any of the
//! node selector terms, each term's expressions and fields all), `preferred…` as a score (the
//! weights of the terms a node matches, normalized so the best node scores 100).

use crate::framework::{Cluster, CycleState, FilterPlugin, NodeInfo, ScorePlugin};
use crate::resources::Resources;
use k8s_openapi::api::core::v1::{NodeAffinity as Affinity, NodeSelectorRequirement, NodeSelectorTerm, Pod};

pub struct NodeAffinity;

/// kube-scheduler's `ErrReasonPod`, shared with NodeSelector.
pub const REASON: &str = "node(s) didn't match Pod's node affinity/selector";

fn node_affinity(pod: &Pod) -> Option<&Affinity> {
    pod.spec.as_ref()?.affinity.as_ref()?.node_affinity.as_ref()
}

/// A node selector requirement against the node's labels (`matchExpressions`).
fn label_requirement(r: &NodeSelectorRequirement, node: &NodeInfo) -> bool {
    let value = node.label(&r.key);
    let values = r.values.as_deref().unwrap_or_default();
    let number = |text: &str| text.parse::<i64>().ok();
    let compare = |ordering: std::cmp::Ordering| match (value.and_then(number), values) {
        (Some(have), [bound]) => number(bound).is_some_and(|bound| have.cmp(&bound) == ordering),
        _ => false,
    };
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| values.iter().all(|x| x != v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => compare(std::cmp::Ordering::Greater),
        "Lt" => compare(std::cmp::Ordering::Less),
        _ => false,
    }
}

/// A node selector requirement against the node's fields (`matchFields`): only `metadata.name`
/// with In or NotIn, as the API server allows.
fn field_requirement(r: &NodeSelectorRequirement, node: &NodeInfo) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let listed = r.key == "metadata.name" && values.iter().any(|v| v == node.name());
    match r.operator.as_str() {
        "In" => listed,
        "NotIn" => r.key == "metadata.name" && !listed,
        _ => false,
    }
}

/// A term matches when all its requirements do; a term without any matches no node.
pub fn term_matches(term: &NodeSelectorTerm, node: &NodeInfo) -> bool {
    let expressions = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    (!expressions.is_empty() || !fields.is_empty())
        && expressions.iter().all(|r| label_requirement(r, node))
        && fields.iter().all(|r| field_requirement(r, node))
}

/// Whether the node satisfies the Pod's required node affinity (true without one).
pub fn required_affinity_matches(pod: &Pod, node: &NodeInfo) -> bool {
    match node_affinity(pod).and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref()) {
        Some(selector) => selector.node_selector_terms.iter().any(|term| term_matches(term, node)),
        None => true,
    }
}

/// Whether the node satisfies the Pod's `nodeSelector` and required node affinity: the nodes
/// topology spreading counts under `nodeAffinityPolicy: Honor`.
pub fn pod_matches_node(pod: &Pod, node: &NodeInfo) -> bool {
    let selector = pod.spec.as_ref().and_then(|s| s.node_selector.as_ref());
    selector.into_iter().flatten().all(|(k, v)| node.label(k) == Some(v.as_str()))
        && required_affinity_matches(pod, node)
}

impl FilterPlugin for NodeAffinity {
    fn name(&self) -> &'static str {
        "NodeAffinity"
    }

    fn filter(&self, pod: &Pod, _: &Resources, node: &NodeInfo, _: &CycleState) -> Result<(), Vec<String>> {
        if required_affinity_matches(pod, node) { Ok(()) } else { Err(vec![REASON.into()]) }
    }
}

impl ScorePlugin for NodeAffinity {
    fn name(&self) -> &'static str {
        "NodeAffinity"
    }

    fn score(&self, pod: &Pod, _: &Resources, node: &NodeInfo) -> i64 {
        let preferred =
            node_affinity(pod).and_then(|a| a.preferred_during_scheduling_ignored_during_execution.as_ref());
        let matching = preferred.into_iter().flatten().filter(|p| term_matches(&p.preference, node));
        matching.map(|p| i64::from(p.weight)).sum()
    }

    fn score_all(&self, pod: &Pod, request: &Resources, nodes: &[&NodeInfo], _: Cluster<'_>) -> Vec<i64> {
        if node_affinity(pod).is_none_or(|a| a.preferred_during_scheduling_ignored_during_execution.is_none()) {
            return vec![0; nodes.len()];
        }
        let raw: Vec<i64> = nodes.iter().map(|node| self.score(pod, request, node)).collect();
        normalize(&raw)
    }
}

/// The framework's `DefaultNormalizeScore`: the highest becomes 100, the others in proportion.
pub fn normalize(raw: &[i64]) -> Vec<i64> {
    let max = raw.iter().copied().max().unwrap_or(0);
    raw.iter().map(|s| if max > 0 { s * 100 / max } else { 0 }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Node;
    use serde_json::{Value, json};

    fn node(name: &str, labels: Value) -> NodeInfo {
        NodeInfo::new(serde_json::from_value::<Node>(json!({"metadata": {"name": name, "labels": labels}})).unwrap())
    }

    fn pod(node_affinity: Value) -> Pod {
        serde_json::from_value(
            json!({"spec": {"containers": [{"name": "c"}], "affinity": {"nodeAffinity": node_affinity}}}),
        )
        .unwrap()
    }

    fn required(terms: Value) -> Pod {
        pod(json!({"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}))
    }

    #[test]
    fn required_terms_filter() {
        let gpu = node("n1", json!({"gpu": "a100", "cores": "64", "zone": "a"}));
        let plain = node("n2", json!({"zone": "b"}));
        for (terms, on_gpu, on_plain) in [
            (json!([{"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}]), true, false),
            (json!([{"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}]), false, true),
            (
                json!([{"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["a100", "h100"]}]}]),
                true,
                false,
            ),
            (json!([{"matchExpressions": [{"key": "gpu", "operator": "NotIn", "values": ["a100"]}]}]), false, true),
            (json!([{"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["32"]}]}]), true, false),
            (json!([{"matchExpressions": [{"key": "cores", "operator": "Lt", "values": ["32"]}]}]), false, false),
            (json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]}]), false, true),
            (json!([{"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n2"]}]}]), true, false),
            // Terms are ORed; a term's requirements ANDed; an empty term matches nothing.
            (
                json!([{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
                       {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}]),
                true,
                true,
            ),
            (
                json!([{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}],
                        "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]}]),
                false,
                false,
            ),
            (json!([{}]), false, false),
        ] {
            let p = required(terms.clone());
            let fits = |n: &NodeInfo| NodeAffinity.filter(&p, &Resources::default(), n, &None).is_ok();
            assert_eq!((fits(&gpu), fits(&plain)), (on_gpu, on_plain), "{terms}");
        }
        let err = NodeAffinity.filter(&required(json!([{}])), &Resources::default(), &gpu, &None).unwrap_err();
        assert_eq!(err, [REASON]);
    }

    #[test]
    fn preferred_terms_score_by_weight() {
        let nodes =
            [node("a", json!({"disk": "ssd"})), node("b", json!({"disk": "ssd", "zone": "x"})), node("c", json!({}))];
        let p = pod(json!({"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 20, "preference": {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}},
            {"weight": 60, "preference": {"matchExpressions": [{"key": "zone", "operator": "Exists"}]}},
        ]}));
        let refs: Vec<&NodeInfo> = nodes.iter().collect();
        let cluster = Cluster { nodes: &nodes, namespaces: &Default::default(), pods: &Default::default() };
        assert_eq!(NodeAffinity.score_all(&p, &Resources::default(), &refs, cluster), [25, 100, 0]);
        assert_eq!(NodeAffinity.score_all(&pod(json!({})), &Resources::default(), &refs, cluster), [0, 0, 0]);
    }
}
