//! PodTopologySpread: Pods spread over topology domains (nodes with the same value of a label).
//! A Pod's own `topologySpreadConstraints` filter (`DoNotSchedule`: the skew a node would make
//! must stay within `maxSkew`) and score (`ScheduleAnyway`); a Pod without any gets
//! kube-scheduler's system defaults, as scores only.
//!
//! The system defaults: `ScheduleAnyway` with maxSkew 3 over `kubernetes.io/hostname` and
//! maxSkew 5 over `topology.kubernetes.io/zone` where nodes carry it, counting the Pods of the
//! same controller (upstream counts those its Services' and owners' selectors select; one
//! controller's Pods are what those select in practice). Scored as upstream: a node's score grows
//! with the matching Pods in its domain, weighted by log(domains + 2), then normalized across the
//! feasible nodes so that the emptiest domain scores 100.

use super::node_affinity::pod_matches_node;
use super::untolerated;
use crate::framework::{Cluster, CycleState, FilterPlugin, NodeInfo, ScorePlugin, controller_uid, index_pods};
use crate::resources::Resources;
use gitplane_api::labels::{Labels, matches};
use k8s_openapi::api::core::v1::{Pod, TopologySpreadConstraint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use std::collections::HashMap;

pub struct PodTopologySpread;

pub const REASON: &str = "node(s) didn't match pod topology spread constraints";
pub const REASON_MISSING_LABEL: &str = "node(s) didn't match pod topology spread constraints (missing required label)";

const HOSTNAME: &str = "kubernetes.io/hostname";

/// (topology key, maxSkew) of the system default constraints.
const DEFAULT_SPREAD: [(&str, i64); 2] = [(HOSTNAME, 3), ("topology.kubernetes.io/zone", 5)];

/// One of the Pod's constraints, resolved: its selector with `matchLabelKeys` merged in, and the
/// API server's defaults (`minDomains` 1, `nodeAffinityPolicy: Honor`, `nodeTaintsPolicy: Ignore`).
struct Constraint {
    key: String,
    max_skew: i64,
    min_domains: usize,
    selector: Option<LabelSelector>,
    honor_affinity: bool,
    honor_taints: bool,
    /// The incoming Pod counts itself in the domain it goes to.
    self_match: i64,
}

impl Constraint {
    fn new(c: &TopologySpreadConstraint, pod: &Pod) -> Constraint {
        let empty = Labels::new();
        let labels = pod.metadata.labels.as_ref().unwrap_or(&empty);
        let mut selector = c.label_selector.clone();
        if let Some(selector) = selector.as_mut() {
            let keyed = c.match_label_keys.iter().flatten().filter_map(|k| Some((k, labels.get(k)?)));
            let extra = keyed.map(|(key, value)| LabelSelectorRequirement {
                key: key.clone(),
                operator: "In".into(),
                values: Some(vec![value.clone()]),
            });
            let extra: Vec<_> = extra.collect();
            if !extra.is_empty() {
                selector.match_expressions.get_or_insert_with(Vec::new).extend(extra);
            }
        }
        let self_match = i64::from(selector.as_ref().is_some_and(|s| matches(s, labels)));
        Constraint {
            key: c.topology_key.clone(),
            max_skew: i64::from(c.max_skew),
            min_domains: c.min_domains.map_or(1, |m| usize::try_from(m).unwrap_or(1)),
            selector,
            honor_affinity: c.node_affinity_policy.as_deref() != Some("Ignore"),
            honor_taints: c.node_taints_policy.as_deref() == Some("Honor"),
            self_match,
        }
    }

    /// The placed Pods this constraint counts, by node name: in the Pod's namespace, selected by
    /// its selector (none without one). Each distinct set of labels is matched once.
    fn matching<'c>(&self, namespace: &str, cluster: Cluster<'c>) -> HashMap<&'c str, i64> {
        let mut on = HashMap::new();
        let Some(selector) = &self.selector else { return on };
        for (_, on_nodes) in cluster.pods.groups_in(namespace).filter(|(labels, _)| matches(selector, labels)) {
            for (node, n) in on_nodes {
                *on.entry(node.as_str()).or_default() += n;
            }
        }
        on
    }

    /// Whether the node's Pods count at all (its node inclusion policies).
    fn includes(&self, pod: &Pod, node: &NodeInfo) -> bool {
        (!self.honor_affinity || pod_matches_node(pod, node))
            && (!self.honor_taints || untolerated(pod, node, &["NoSchedule", "NoExecute"]).next().is_none())
    }
}

fn constraints(pod: &Pod, when: &str) -> Vec<Constraint> {
    let all = pod.spec.as_ref().and_then(|s| s.topology_spread_constraints.as_deref()).unwrap_or_default();
    all.iter().filter(|c| c.when_unsatisfiable == when).map(|c| Constraint::new(c, pod)).collect()
}

fn namespace(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or("default")
}

fn has_keys(node: &NodeInfo, constraints: &[Constraint]) -> bool {
    constraints.iter().all(|c| node.label(&c.key).is_some())
}

/// Per constraint: the matching Pods of each domain among the nodes that count, and the least
/// of them (0 while fewer domains than `minDomains` exist).
struct FilterState {
    constraints: Vec<Constraint>,
    domains: Vec<HashMap<String, i64>>,
    min_match: Vec<i64>,
}

impl FilterPlugin for PodTopologySpread {
    fn name(&self) -> &'static str {
        "PodTopologySpread"
    }

    fn pre_filter(&self, pod: &Pod, cluster: Cluster<'_>) -> CycleState {
        let constraints = constraints(pod, "DoNotSchedule");
        if constraints.is_empty() {
            return None;
        }
        let matching: Vec<_> = constraints.iter().map(|c| c.matching(namespace(pod), cluster)).collect();
        let mut domains = vec![HashMap::<String, i64>::new(); constraints.len()];
        for node in cluster.nodes.iter().filter(|n| has_keys(n, &constraints)) {
            for ((c, counts), on) in constraints.iter().zip(domains.iter_mut()).zip(&matching) {
                if let Some(value) = node.label(&c.key).filter(|_| c.includes(pod, node)) {
                    let n = on.get(node.name()).copied().unwrap_or(0);
                    match counts.get_mut(value) {
                        Some(count) => *count += n,
                        None => {
                            counts.insert(value.to_owned(), n);
                        }
                    }
                }
            }
        }
        let min_match = constraints
            .iter()
            .zip(&domains)
            .map(
                |(c, counts)| {
                    if counts.len() < c.min_domains { 0 } else { counts.values().copied().min().unwrap_or(0) }
                },
            )
            .collect();
        Some(Box::new(FilterState { constraints, domains, min_match }))
    }

    fn filter(&self, _: &Pod, _: &Resources, node: &NodeInfo, state: &CycleState) -> Result<(), Vec<String>> {
        let Some(state) = state.as_ref().and_then(|s| s.downcast_ref::<FilterState>()) else { return Ok(()) };
        if !has_keys(node, &state.constraints) {
            return Err(vec![REASON_MISSING_LABEL.into()]);
        }
        for ((c, counts), min) in state.constraints.iter().zip(&state.domains).zip(&state.min_match) {
            let value = node.label(&c.key).unwrap_or_default();
            let skew = counts.get(value).copied().unwrap_or(0) + c.self_match - min;
            if skew > c.max_skew {
                return Err(vec![REASON.into()]);
            }
        }
        Ok(())
    }
}

impl ScorePlugin for PodTopologySpread {
    fn name(&self) -> &'static str {
        "PodTopologySpread"
    }

    fn score(&self, pod: &Pod, request: &Resources, node: &NodeInfo) -> i64 {
        let nodes = std::slice::from_ref(node);
        let cluster = Cluster { nodes, namespaces: &Default::default(), pods: &index_pods(nodes) };
        self.score_all(pod, request, &[node], cluster)[0]
    }

    fn score_all(&self, pod: &Pod, _: &Resources, nodes: &[&NodeInfo], cluster: Cluster<'_>) -> Vec<i64> {
        let own = pod.spec.as_ref().and_then(|s| s.topology_spread_constraints.as_ref()).is_some_and(|c| !c.is_empty());
        if !own {
            let Some(owner) = controller_uid(pod) else { return vec![100; nodes.len()] };
            return default_spread_scores(owner, nodes);
        }
        let constraints = constraints(pod, "ScheduleAnyway");
        if constraints.is_empty() {
            return vec![100; nodes.len()];
        }
        let counted: Vec<&NodeInfo> = cluster.nodes.iter().filter(|n| has_keys(n, &constraints)).collect();
        let keys: Vec<(String, i64)> = constraints.iter().map(|c| (c.key.clone(), c.max_skew)).collect();
        let matching: Vec<_> = constraints.iter().map(|c| c.matching(namespace(pod), cluster)).collect();
        let count = |i: usize, node: &NodeInfo| {
            let on = matching[i].get(node.name()).copied().unwrap_or(0);
            if constraints[i].includes(pod, node) { on as f64 } else { 0.0 }
        };
        spread_scores(&keys, &counted, nodes, NodeInfo::label, count)
    }
}

/// [`spread_scores`] of the system defaults over the feasible nodes (counted and scored alike),
/// each node's zone and Pods of the controller read once: every node is in a hostname domain
/// (its own, labelled or not), so only the zone groups nodes.
fn default_spread_scores(owner: &str, nodes: &[&NodeInfo]) -> Vec<i64> {
    let [(_, host_skew), (zone_key, zone_skew)] = DEFAULT_SPREAD;
    let mut zones: HashMap<&str, usize> = HashMap::new();
    let mut in_zone: Vec<f64> = Vec::new();
    let per_node: Vec<(f64, Option<usize>)> = nodes
        .iter()
        .map(|node| {
            let count = f64::from(node.by_controller.get(owner).copied().unwrap_or(0));
            let zone = node.label(zone_key).map(|zone| {
                let next = zones.len();
                let at = *zones.entry(zone).or_insert(next);
                if at == next {
                    in_zone.push(0.0);
                }
                in_zone[at] += count;
                at
            });
            (count, zone)
        })
        .collect();
    let host_weight = (nodes.len() as f64 + 2.0).ln();
    let zone_weight = (in_zone.len() as f64 + 2.0).ln();
    let raw: Vec<Option<f64>> = per_node
        .iter()
        .map(|(count, zone)| {
            // In spread_scores' order of additions, so the scores are the same to the bit.
            let host = 0.0 + count * host_weight + (host_skew - 1) as f64;
            match zone {
                _ if in_zone.is_empty() => Some(host),
                Some(at) => Some(host + in_zone[*at] * zone_weight + (zone_skew - 1) as f64),
                None => None,
            }
        })
        .collect();
    normalized(&raw)
}

/// upstream's scoring of `ScheduleAnyway` constraints (`constraints`: key and maxSkew): per
/// constraint, the matching Pods of each domain of the `counted` nodes weighted by log(domains +
/// 2), plus maxSkew - 1; then normalized over the `scored` nodes so the emptiest scores 100. A
/// scored node without a constraint's key scores 0, as upstream leaves it out.
fn spread_scores<'n>(
    constraints: &[(String, i64)],
    counted: &[&'n NodeInfo],
    scored: &[&'n NodeInfo],
    domain: fn(&'n NodeInfo, &str) -> Option<&'n str>,
    count: impl Fn(usize, &NodeInfo) -> f64,
) -> Vec<i64> {
    let mut raw: Vec<Option<f64>> = vec![Some(0.0); scored.len()];
    for (i, (key, max_skew)) in constraints.iter().enumerate() {
        if key == HOSTNAME {
            // Each node its own domain: counted on the node itself, as upstream does, rather
            // than through a map of every node.
            let weight = (counted.len() as f64 + 2.0).ln();
            for (score, node) in raw.iter_mut().zip(scored) {
                match domain(node, key) {
                    Some(_) => *score = score.map(|s| s + count(i, node) * weight + (max_skew - 1) as f64),
                    None => *score = None,
                }
            }
            continue;
        }
        let mut in_domain: HashMap<&str, f64> = HashMap::new();
        for node in counted {
            if let Some(d) = domain(node, key) {
                *in_domain.entry(d).or_default() += count(i, node);
            }
        }
        if in_domain.is_empty() {
            continue;
        }
        let weight = (in_domain.len() as f64 + 2.0).ln();
        for (score, node) in raw.iter_mut().zip(scored) {
            match domain(node, key) {
                Some(d) => {
                    let matching = in_domain.get(d).copied().unwrap_or(0.0);
                    *score = score.map(|s| s + matching * weight + (max_skew - 1) as f64);
                }
                None => *score = None,
            }
        }
    }
    normalized(&raw)
}

/// Raw spread scores (`None`: left out) to 0-100, the emptiest 100.
fn normalized(raw: &[Option<f64>]) -> Vec<i64> {
    let known = raw.iter().flatten();
    let (min, max) = known.fold((f64::MAX, 0.0f64), |(lo, hi), s| (lo.min(*s), hi.max(*s)));
    raw.iter()
        .map(|s| match s {
            None => 0,
            Some(_) if max == 0.0 => 100,
            Some(s) => (100.0 * (max + min - s) / max).round() as i64,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::NamespaceLabels;
    use crate::testing::{self, Rng, random_snapshots};
    use k8s_openapi::api::core::v1::Node;
    use serde_json::{Value, json};

    fn node(name: &str, labels: Value) -> NodeInfo {
        let mut labels = labels;
        labels["kubernetes.io/hostname"] = json!(name);
        NodeInfo::new(serde_json::from_value::<Node>(json!({"metadata": {"name": name, "labels": labels}})).unwrap())
    }

    fn web(constraints: Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "w", "namespace": "shop", "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "c"}], "topologySpreadConstraints": constraints}
        }))
        .unwrap()
    }

    fn constraint(key: &str, max_skew: i32, when: &str, extra: Value) -> Value {
        let mut c = json!({"maxSkew": max_skew, "topologyKey": key, "whenUnsatisfiable": when,
            "labelSelector": {"matchLabels": {"app": "web"}}});
        for (k, v) in extra.as_object().into_iter().flatten() {
            c[k] = v.clone();
        }
        c
    }

    /// Zone a holds two web Pods (on a1), zone b one (on b1), zone c none; c1 is tainted.
    fn zones() -> Vec<NodeInfo> {
        let mut nodes = vec![
            node("a1", json!({"zone": "a"})),
            node("b1", json!({"zone": "b"})),
            node("c1", json!({"zone": "c"})),
            node("x1", json!({})),
        ];
        nodes[2].node.spec =
            Some(serde_json::from_value(json!({"taints": [{"key": "k", "effect": "NoSchedule"}]})).unwrap());
        for i in [0, 0, 1] {
            nodes[i].add_pod(&web(json!([])));
        }
        nodes
    }

    fn fits(p: &Pod, nodes: &[NodeInfo]) -> Vec<Result<(), String>> {
        let cluster = Cluster { nodes, namespaces: &NamespaceLabels::new(), pods: &index_pods(nodes) };
        let state = PodTopologySpread.pre_filter(p, cluster);
        nodes
            .iter()
            .map(|n| PodTopologySpread.filter(p, &Resources::default(), n, &state).map_err(|r| r.join(",")))
            .collect()
    }

    #[test]
    fn do_not_schedule_filters_by_skew() {
        let (ok, skew, label) = (Ok(()), Err(REASON.to_owned()), Err(REASON_MISSING_LABEL.to_owned()));
        for (name, constraints, expected) in [
            // Min 0 (zone c): a would make 3, b 2, c 1.
            (
                "maxSkew 1",
                json!([constraint("zone", 1, "DoNotSchedule", json!({}))]),
                [skew.clone(), skew.clone(), ok.clone(), label.clone()],
            ),
            (
                "maxSkew 2",
                json!([constraint("zone", 2, "DoNotSchedule", json!({}))]),
                [skew.clone(), ok.clone(), ok.clone(), label.clone()],
            ),
            // Honouring the taint leaves zone c out: min 1 (zone b).
            (
                "nodeTaintsPolicy Honor",
                json!([constraint("zone", 1, "DoNotSchedule", json!({"nodeTaintsPolicy": "Honor"}))]),
                [skew.clone(), ok.clone(), ok.clone(), label.clone()],
            ),
            // Fewer domains than minDomains: the minimum counts as 0.
            (
                "minDomains",
                json!([constraint("zone", 2, "DoNotSchedule", json!({"nodeTaintsPolicy": "Honor", "minDomains": 3}))]),
                [skew.clone(), ok.clone(), ok.clone(), label.clone()],
            ),
            (
                "ScheduleAnyway does not filter",
                json!([constraint("zone", 1, "ScheduleAnyway", json!({}))]),
                [ok.clone(), ok.clone(), ok.clone(), ok.clone()],
            ),
        ] {
            assert_eq!(fits(&web(constraints), &zones()), expected, "{name}");
        }
    }

    #[test]
    fn node_affinity_policy_decides_which_nodes_count() {
        let mut nodes = zones();
        nodes.truncate(3);
        let mut honor = web(json!([constraint("zone", 1, "DoNotSchedule", json!({}))]));
        // Only zones a and b may hold it: with Honor (the default), min is b's 1.
        honor.spec.as_mut().unwrap().affinity = serde_json::from_value(json!({"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]}
        ]}}}))
        .unwrap();
        assert_eq!(fits(&honor, &nodes)[1], Ok(()));
        let mut ignore = honor.clone();
        ignore.spec.as_mut().unwrap().topology_spread_constraints.as_mut().unwrap()[0].node_affinity_policy =
            Some("Ignore".into());
        assert_eq!(fits(&ignore, &nodes)[1], Err(REASON.to_owned()));
    }

    #[test]
    fn schedule_anyway_scores_the_emptiest_domain_best() {
        let nodes = zones();
        let p = web(json!([constraint("zone", 1, "ScheduleAnyway", json!({}))]));
        let refs: Vec<&NodeInfo> = nodes.iter().collect();
        let scores = PodTopologySpread.score_all(
            &p,
            &Resources::default(),
            &refs,
            Cluster { nodes: &nodes, namespaces: &NamespaceLabels::new(), pods: &index_pods(&nodes) },
        );
        assert_eq!(scores[2], 100, "{scores:?}");
        assert!(scores[0] < scores[1] && scores[1] < scores[2], "{scores:?}");
        assert_eq!(scores[3], 0, "a node without the key is not scored: {scores:?}");
    }

    /// The plugin's counts as they were before the index: every node's Pods read. The filter
    /// and the scores must agree with what these counts give.
    fn reference(p: &Pod, nodes: &[NodeInfo]) -> (Vec<Result<(), String>>, Vec<i64>) {
        let count = |c: &Constraint, node: &NodeInfo| {
            let Some(selector) = &c.selector else { return 0 };
            node.pods.iter().filter(|o| o.namespace == namespace(p) && matches(selector, &o.labels)).count() as i64
        };
        let filtering = constraints(p, "DoNotSchedule");
        let state: CycleState = (!filtering.is_empty()).then(|| {
            let constraints = filtering;
            let mut domains = vec![HashMap::<String, i64>::new(); constraints.len()];
            for node in nodes.iter().filter(|n| has_keys(n, &constraints)) {
                for (c, counts) in constraints.iter().zip(domains.iter_mut()) {
                    if let Some(value) = node.label(&c.key).filter(|_| c.includes(p, node)) {
                        *counts.entry(value.to_owned()).or_default() += count(c, node);
                    }
                }
            }
            let min = |(c, counts): (&Constraint, &HashMap<String, i64>)| {
                if counts.len() < c.min_domains { 0 } else { counts.values().copied().min().unwrap_or(0) }
            };
            let min_match = constraints.iter().zip(&domains).map(min).collect();
            Box::new(FilterState { constraints, domains, min_match }) as _
        });
        let fits = nodes.iter().map(|n| PodTopologySpread.filter(p, &Resources::default(), n, &state));
        let refs: Vec<&NodeInfo> = nodes.iter().collect();
        let constraints = super::constraints(p, "ScheduleAnyway");
        let scores = if constraints.is_empty() {
            let cluster = Cluster { nodes, namespaces: &NamespaceLabels::new(), pods: &index_pods(nodes) };
            PodTopologySpread.score_all(p, &Resources::default(), &refs, cluster)
        } else {
            let counted: Vec<&NodeInfo> = nodes.iter().filter(|n| has_keys(n, &constraints)).collect();
            let keys: Vec<(String, i64)> = constraints.iter().map(|c| (c.key.clone(), c.max_skew)).collect();
            let c = |i: usize, node: &NodeInfo| {
                if constraints[i].includes(p, node) { count(&constraints[i], node) as f64 } else { 0.0 }
            };
            spread_scores(&keys, &counted, &refs, NodeInfo::label, c)
        };
        (fits.map(|f| f.map_err(|r| r.join(","))).collect(), scores)
    }

    /// A node's domain for the system defaults: a node without a hostname label is its own.
    fn default_domain<'n>(node: &'n NodeInfo, key: &str) -> Option<&'n str> {
        match key {
            HOSTNAME => Some(node.label(key).unwrap_or(node.name())),
            _ => node.label(key),
        }
    }

    #[test]
    fn default_spread_agrees_with_the_general_scoring() {
        // (seed, nodes, percent of nodes in a zone)
        let cases = [(1, 1, 100), (2, 6, 80), (3, 40, 100), (4, 40, 0), (5, 300, 90), (6, 300, 100)];
        let (mut left_out, mut scored) = (false, false);
        for (seed, node_count, zoned) in cases {
            let mut rng = Rng::new(seed);
            let nodes: Vec<NodeInfo> = (0..node_count)
                .map(|i| {
                    let mut labels = json!({});
                    if rng.chance(80) {
                        labels[HOSTNAME] = json!(format!("n{i}"));
                    }
                    if rng.chance(zoned) {
                        labels["topology.kubernetes.io/zone"] = json!(*rng.pick(&["a", "b", "c", "d", "e"]));
                    }
                    let node = json!({"metadata": {"name": format!("n{i}"), "labels": labels}});
                    let mut info = NodeInfo::new(serde_json::from_value::<Node>(node).unwrap());
                    for owner in ["rs-a", "rs-b"] {
                        if rng.chance(60) {
                            info.by_controller.insert(owner.into(), 1 + rng.below(5) as u32);
                        }
                    }
                    info
                })
                .collect();
            for owner in ["rs-a", "rs-b", "rs-c"] {
                let feasible: Vec<&NodeInfo> = nodes.iter().filter(|_| rng.chance(70)).collect();
                let count = |_: usize, node: &NodeInfo| f64::from(node.by_controller.get(owner).copied().unwrap_or(0));
                let keys = DEFAULT_SPREAD.map(|(k, s)| (k.to_owned(), s));
                let want = spread_scores(&keys, &feasible, &feasible, default_domain, count);
                assert_eq!(default_spread_scores(owner, &feasible), want, "seed {seed}, owner {owner}");
                left_out |= want.contains(&0);
                scored |= want.iter().any(|s| *s != want[0]);
            }
        }
        assert!(left_out && scored);
    }

    #[test]
    fn the_index_agrees_with_reading_every_pod() {
        // (seed, nodes, placed Pods)
        let cases = [(11, 4, 10), (12, 8, 40), (13, 12, 120), (14, 3, 60), (15, 20, 200), (16, 6, 0)];
        // Every reason and some preference come up, so the cases compare more than empty answers.
        let (mut reasons, mut scored) = (std::collections::BTreeSet::new(), false);
        for (seed, node_count, pod_count) in cases {
            let mut rng = Rng::new(seed + 100);
            random_snapshots(seed, node_count, pod_count, &mut |step, snapshot| {
                for i in 0..20 {
                    let p = testing::pod(&mut rng, "incoming", 0, true);
                    let cluster = snapshot.cluster();
                    let state = PodTopologySpread.pre_filter(&p, cluster);
                    let fits: Vec<_> = cluster
                        .nodes
                        .iter()
                        .map(|n| {
                            PodTopologySpread.filter(&p, &Resources::default(), n, &state).map_err(|r| r.join(","))
                        })
                        .collect();
                    let refs: Vec<&NodeInfo> = cluster.nodes.iter().collect();
                    let scores = PodTopologySpread.score_all(&p, &Resources::default(), &refs, cluster);
                    let want = reference(&p, cluster.nodes);
                    assert_eq!((fits, scores), want, "seed {seed}, {step}, incoming Pod {i}: {p:?}");
                    reasons.extend(want.0.into_iter().filter_map(Result::err));
                    scored |= want.1.iter().any(|s| *s != want.1[0]);
                }
            });
        }
        let expected: std::collections::BTreeSet<String> = [REASON, REASON_MISSING_LABEL].map(String::from).into();
        assert_eq!((reasons, scored), (expected, true));
    }
}
