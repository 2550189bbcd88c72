//! Which nodes a Pod may run on by its own choice (upstream's `nodeaffinity.GetRequiredNodeAffinity`):
//! `spec.nodeSelector` and the required node affinity, both of which must hold. Shared by the
//! scheduler's NodeAffinity filter and the DaemonSet controller, which pins each daemon Pod to its
//! node with a `metadata.name` field term as upstream does. Pure.

use k8s_openapi::api::core::v1::{Node, NodeSelectorRequirement, NodeSelectorTerm, Pod, PodSpec};

/// The only node field a term may match (`matchFields`), as upstream allows.
pub const NAME_FIELD: &str = "metadata.name";

/// Whether the node satisfies the Pod spec's nodeSelector and required node affinity: every
/// nodeSelector label, and at least one of the required terms (a term with no requirement
/// matches no node, as upstream's).
pub fn required_matches(spec: &PodSpec, node: &Node) -> bool {
    let labels = node.metadata.labels.as_ref();
    let label = |key: &str| labels.and_then(|l| l.get(key)).map(String::as_str);
    let selected = spec.node_selector.iter().flatten().all(|(k, v)| label(k) == Some(v.as_str()));
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| n.required_during_scheduling_ignored_during_execution.as_ref());
    let name = node.metadata.name.as_deref().unwrap_or_default();
    selected && required.is_none_or(|r| r.node_selector_terms.iter().any(|t| term_matches(t, &label, name)))
}

fn term_matches<'a>(term: &NodeSelectorTerm, label: &impl Fn(&str) -> Option<&'a str>, name: &str) -> bool {
    let expressions = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if expressions.is_empty() && fields.is_empty() {
        return false;
    }
    expressions.iter().all(|r| requirement_matches(r, label(&r.key)))
        && fields.iter().all(|r| r.key == NAME_FIELD && requirement_matches(r, Some(name)))
}

/// One requirement against the value the node has for its key (`None`: no such label).
fn requirement_matches(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let listed = || value.is_some_and(|v| values.iter().any(|x| x == v));
    let compare = |ordering: std::cmp::Ordering| {
        let (Some(have), [bound]) = (value.and_then(|v| v.parse::<i64>().ok()), values) else { return false };
        bound.parse::<i64>().is_ok_and(|bound| have.cmp(&bound) == ordering)
    };
    match r.operator.as_str() {
        "In" => listed(),
        "NotIn" => !listed(),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" => compare(std::cmp::Ordering::Greater),
        "Lt" => compare(std::cmp::Ordering::Less),
        _ => false,
    }
}

/// The node a Pod is bound to, or else the one its required affinity pins it to by name (the
/// DaemonSet controller's `GetTargetNodeName`): a single term whose `metadata.name` is `In` one
/// node.
pub fn target_node(pod: &Pod) -> Option<&str> {
    let spec = pod.spec.as_ref()?;
    if let Some(node) = spec.node_name.as_deref().filter(|n| !n.is_empty()) {
        return Some(node);
    }
    let required =
        spec.affinity.as_ref()?.node_affinity.as_ref()?.required_during_scheduling_ignored_during_execution.as_ref()?;
    let [term] = required.node_selector_terms.as_slice() else { return None };
    term.match_fields.iter().flatten().find_map(|r| match (r.key.as_str(), r.operator.as_str(), r.values.as_deref()) {
        (NAME_FIELD, "In", Some([node])) => Some(node.as_str()),
        _ => None,
    })
}

/// Pins a Pod spec to `node` (upstream's `ReplaceDaemonSetPodNodeNameNodeAffinity`): its required
/// node affinity becomes the one term `metadata.name In [node]`, the rest of its affinity kept.
pub fn pin_to_node(spec: &mut PodSpec, node: &str) {
    let term = NodeSelectorTerm {
        match_expressions: None,
        match_fields: Some(vec![NodeSelectorRequirement {
            key: NAME_FIELD.into(),
            operator: "In".into(),
            values: Some(vec![node.to_owned()]),
        }]),
    };
    let affinity = spec.affinity.get_or_insert_with(Default::default);
    let node_affinity = affinity.node_affinity.get_or_insert_with(Default::default);
    node_affinity
        .required_during_scheduling_ignored_during_execution
        .get_or_insert_with(Default::default)
        .node_selector_terms = vec![term];
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn node(name: &str, labels: Value) -> Node {
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap()
    }

    fn spec(value: Value) -> PodSpec {
        let mut value = value;
        value["containers"] = json!([]);
        serde_json::from_value(value).unwrap()
    }

    fn required(terms: Value) -> PodSpec {
        spec(
            json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}}),
        )
    }

    #[test]
    fn selector_and_required_terms() {
        let ssd = node("n1", json!({"disk": "ssd", "cores": "8"}));
        #[rustfmt::skip]
        let cases = [
            ("nothing asked", spec(json!({})), true),
            ("nodeSelector matches", spec(json!({"nodeSelector": {"disk": "ssd"}})), true),
            ("nodeSelector differs", spec(json!({"nodeSelector": {"disk": "hdd"}})), false),
            ("In", required(json!([{"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd", "nvme"]}]}])), true),
            ("NotIn", required(json!([{"matchExpressions": [{"key": "disk", "operator": "NotIn", "values": ["ssd"]}]}])), false),
            ("DoesNotExist", required(json!([{"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}])), true),
            ("Gt", required(json!([{"matchExpressions": [{"key": "cores", "operator": "Gt", "values": ["4"]}]}])), true),
            ("Lt", required(json!([{"matchExpressions": [{"key": "cores", "operator": "Lt", "values": ["4"]}]}])), false),
            ("Gt on a label that is no number", required(json!([{"matchExpressions": [{"key": "disk", "operator": "Gt", "values": ["1"]}]}])), false),
            ("terms are ORed", required(json!([{"matchExpressions": [{"key": "gpu", "operator": "Exists"}]},
                                               {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}])), true),
            ("another node's name", required(json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2"]}]}])), false),
            ("an empty term matches nothing", required(json!([{}])), false),
            ("both must hold", {
                let mut s = required(json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]));
                s.node_selector = Some([("disk".to_owned(), "hdd".to_owned())].into());
                s
            }, false),
        ];
        for (what, spec, expected) in cases {
            assert_eq!(required_matches(&spec, &ssd), expected, "{what}");
        }
    }

    #[test]
    fn a_pinned_pod_targets_its_node() {
        let mut s = required(json!([{"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}]));
        pin_to_node(&mut s, "n2");
        let pod = Pod { spec: Some(s.clone()), ..Default::default() };
        assert_eq!(target_node(&pod), Some("n2"));
        assert!(required_matches(&s, &node("n2", json!({}))), "the old terms were replaced");
        assert!(!required_matches(&s, &node("n1", json!({"disk": "ssd"}))));
        let mut bound = pod.clone();
        bound.spec.as_mut().unwrap().node_name = Some("n3".into());
        assert_eq!(target_node(&bound), Some("n3"));
        assert_eq!(target_node(&Pod { spec: Some(spec(json!({}))), ..Default::default() }), None);
    }
}
