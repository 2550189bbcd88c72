//! InterPodAffinity: where a Pod may go by the Pods already there. Required affinity and
//! anti-affinity terms (and the required anti-affinity of the Pods already placed, which holds
//! both ways) filter; preferred terms, both the Pod's and the placed Pods', score. A term
//! matches Pods by its label selector in its namespaces, and applies to the topology domain
//! (nodes with the same value of `topologyKey`) of each matching Pod's node.
//!
//! The placed Pods are read through the snapshot's [`crate::pod_index::PodIndex`]: their distinct terms with
//! counts per domain, and their distinct labels with counts per node, so a cycle's work grows
//! with the distinct terms and labels rather than with the nodes and Pods.

use crate::framework::{Cluster, CycleState, FilterPlugin, NamespaceLabels, NodeInfo, ScorePlugin, index_pods};
use crate::resources::Resources;
use crate::terms::{Term, required_terms, scoring_terms};
use gitplane_api::labels::Labels;
use k8s_openapi::api::core::v1::Pod;
use std::collections::HashMap;

pub struct InterPodAffinity;

pub const REASON_AFFINITY: &str = "node(s) didn't match pod affinity rules";
pub const REASON_ANTI_AFFINITY: &str = "node(s) didn't match pod anti-affinity rules";
pub const REASON_EXISTING_ANTI_AFFINITY: &str = "node(s) didn't satisfy existing pods anti-affinity rules";

/// The incoming Pod as terms see it.
struct Incoming<'a> {
    namespace: String,
    labels: &'a Labels,
}

fn incoming(pod: &Pod) -> Incoming<'_> {
    static EMPTY: Labels = Labels::new();
    Incoming {
        namespace: pod.metadata.namespace.clone().unwrap_or_else(|| "default".into()),
        labels: pod.metadata.labels.as_ref().unwrap_or(&EMPTY),
    }
}

/// Counts of matching Pods per topology domain: by topology key, then by its value.
type Domains = HashMap<String, HashMap<String, i64>>;

fn add(domains: &mut Domains, key: &str, value: &str, amount: i64) {
    let values = match domains.get_mut(key) {
        Some(values) => values,
        None => domains.entry(key.to_owned()).or_default(),
    };
    match values.get_mut(value) {
        Some(count) => *count += amount,
        None => {
            values.insert(value.to_owned(), amount);
        }
    }
}

fn count(domains: &Domains, key: &str, value: &str) -> i64 {
    domains.get(key).and_then(|values| values.get(value)).copied().unwrap_or(0)
}

/// What the filter checks every node against (kube-scheduler's preFilterState).
struct FilterState {
    affinity: Vec<Term>,
    anti_affinity: Vec<Term>,
    /// Domains holding a Pod that matches every required affinity term.
    affinity_counts: Domains,
    /// Domains holding a Pod that a required anti-affinity term matches.
    anti_affinity_counts: Domains,
    /// Domains where a placed Pod's required anti-affinity matches the incoming Pod.
    existing_anti_affinity_counts: Domains,
    /// The incoming Pod matches all its own affinity terms (the first of a group may go).
    matches_itself: bool,
}

impl FilterPlugin for InterPodAffinity {
    fn name(&self) -> &'static str {
        "InterPodAffinity"
    }

    /// Each distinct term of the placed Pods is matched once against the incoming Pod, and each
    /// of its terms once against each distinct set of placed Pods' labels.
    fn pre_filter(&self, pod: &Pod, cluster: Cluster<'_>) -> CycleState {
        let me = incoming(pod);
        let own = pod.spec.as_ref().and_then(|s| s.affinity.as_ref());
        let affinity = required_terms(
            own.and_then(|a| a.pod_affinity.as_ref()?.required_during_scheduling_ignored_during_execution.as_ref()),
            &me.namespace,
            me.labels,
        );
        let anti_affinity = required_terms(
            own.and_then(|a| {
                a.pod_anti_affinity.as_ref()?.required_during_scheduling_ignored_during_execution.as_ref()
            }),
            &me.namespace,
            me.labels,
        );
        let mut state = FilterState {
            matches_itself: affinity.iter().all(|t| t.matches(&me.namespace, me.labels, cluster.namespaces)),
            affinity,
            anti_affinity,
            affinity_counts: Domains::new(),
            anti_affinity_counts: Domains::new(),
            existing_anti_affinity_counts: Domains::new(),
        };
        let own_terms = !state.affinity.is_empty() || !state.anti_affinity.is_empty();
        let mut any = own_terms;
        for (term, pods) in cluster.pods.required_anti_affinity() {
            if term.matches(&me.namespace, me.labels, cluster.namespaces) {
                any = true;
                for (value, n) in &pods.by_domain {
                    add(&mut state.existing_anti_affinity_counts, &term.topology_key, value, *n);
                }
            }
        }
        if own_terms {
            for (namespace, labels, on_nodes) in cluster.pods.groups() {
                let selects = |t: &&Term| t.matches(namespace, labels, cluster.namespaces);
                let affinity = !state.affinity.is_empty() && state.affinity.iter().all(|t| selects(&t));
                let anti: Vec<&Term> = state.anti_affinity.iter().filter(selects).collect();
                if !affinity && anti.is_empty() {
                    continue;
                }
                for (node, n) in on_nodes.iter().filter_map(|(name, n)| Some((cluster.node(name)?, *n))) {
                    for term in state.affinity.iter().filter(|_| affinity) {
                        if let Some(value) = node.label(&term.topology_key) {
                            add(&mut state.affinity_counts, &term.topology_key, value, n);
                        }
                    }
                    for term in &anti {
                        if let Some(value) = node.label(&term.topology_key) {
                            add(&mut state.anti_affinity_counts, &term.topology_key, value, n);
                        }
                    }
                }
            }
        }
        any.then(|| Box::new(state) as _)
    }

    fn filter(&self, _: &Pod, _: &Resources, node: &NodeInfo, state: &CycleState) -> Result<(), Vec<String>> {
        let Some(state) = state.as_ref().and_then(|s| s.downcast_ref::<FilterState>()) else { return Ok(()) };
        let in_domain = |domains: &Domains, key: &str| node.label(key).map(|value| count(domains, key, value));
        // Every topology key must be on the node; each domain must hold a matching Pod, unless
        // none matches anywhere and the Pod matches its own terms.
        let mut pods_exist = true;
        for term in &state.affinity {
            match in_domain(&state.affinity_counts, &term.topology_key) {
                None => return Err(vec![REASON_AFFINITY.into()]),
                Some(0) => pods_exist = false,
                Some(_) => {}
            }
        }
        let first_of_group = state.affinity_counts.is_empty() && state.matches_itself;
        if !(pods_exist || first_of_group) {
            return Err(vec![REASON_AFFINITY.into()]);
        }
        let anti = &state.anti_affinity_counts;
        if state.anti_affinity.iter().any(|t| in_domain(anti, &t.topology_key).unwrap_or(0) > 0) {
            return Err(vec![REASON_ANTI_AFFINITY.into()]);
        }
        let existing = &state.existing_anti_affinity_counts;
        if existing.keys().any(|key| in_domain(existing, key).unwrap_or(0) > 0) {
            return Err(vec![REASON_EXISTING_ANTI_AFFINITY.into()]);
        }
        Ok(())
    }
}

impl ScorePlugin for InterPodAffinity {
    fn name(&self) -> &'static str {
        "InterPodAffinity"
    }

    fn score(&self, pod: &Pod, request: &Resources, node: &NodeInfo) -> i64 {
        let nodes = std::slice::from_ref(node);
        let cluster = Cluster { nodes, namespaces: &NamespaceLabels::new(), pods: &index_pods(nodes) };
        self.score_all(pod, request, &[node], cluster)[0]
    }

    fn score_all(&self, pod: &Pod, _: &Resources, nodes: &[&NodeInfo], cluster: Cluster<'_>) -> Vec<i64> {
        let me = incoming(pod);
        let own = pod.spec.as_ref().and_then(|s| s.affinity.as_ref());
        let mine = scoring_terms(
            own.and_then(|a| a.pod_affinity.as_ref()),
            own.and_then(|a| a.pod_anti_affinity.as_ref()),
            &me.namespace,
            me.labels,
            false,
        );
        // Scores by topology key, then by the key's value (borrowed: no copies), so that each
        // node looks up each key once.
        let mut domains: HashMap<&str, HashMap<&str, i64>> = HashMap::new();
        for (term, pods) in cluster.pods.scoring() {
            if term.matches(&me.namespace, me.labels, cluster.namespaces) {
                let values = domains.entry(term.topology_key.as_str()).or_default();
                for (value, n) in &pods.by_domain {
                    *values.entry(value.as_str()).or_default() += term.weight * n;
                }
            }
        }
        for (namespace, labels, on_nodes) in cluster.pods.groups().filter(|_| !mine.is_empty()) {
            let ours: Vec<&Term> = mine.iter().filter(|t| t.matches(namespace, labels, cluster.namespaces)).collect();
            if ours.is_empty() {
                continue;
            }
            for (node, n) in on_nodes.iter().filter_map(|(name, n)| Some((cluster.node(name)?, *n))) {
                for term in &ours {
                    if let Some(value) = node.label(&term.topology_key) {
                        *domains.entry(term.topology_key.as_str()).or_default().entry(value).or_default() +=
                            term.weight * n;
                    }
                }
            }
        }
        if domains.is_empty() {
            return vec![0; nodes.len()];
        }
        let raw: Vec<i64> = nodes
            .iter()
            .map(|node| {
                let by_key = domains.iter().filter_map(|(key, values)| values.get(node.label(key)?));
                by_key.sum()
            })
            .collect();
        let (min, max) = (raw.iter().copied().min().unwrap_or(0), raw.iter().copied().max().unwrap_or(0));
        raw.iter().map(|s| if max > min { (s - min) * 100 / (max - min) } else { 0 }).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{self, Rng, random_snapshots};
    use k8s_openapi::api::core::v1::Node;
    use serde_json::{Value, json};

    fn node(name: &str, zone: &str) -> NodeInfo {
        NodeInfo::new(
            serde_json::from_value::<Node>(json!({"metadata": {"name": name, "labels": {
                "kubernetes.io/hostname": name, "topology.kubernetes.io/zone": zone
            }}}))
            .unwrap(),
        )
    }

    fn pod(namespace: &str, labels: Value, affinity: Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": namespace, "labels": labels},
            "spec": {"containers": [{"name": "c"}], "affinity": affinity}
        }))
        .unwrap()
    }

    fn term(selector: Value, key: &str) -> Value {
        json!({"labelSelector": selector, "topologyKey": key})
    }

    /// Nodes a1, a2 in zone a and b1 in zone b; a `cache` Pod in `shop` on a1 and, where given,
    /// the placed Pod on b1.
    fn cluster(on_b1: Option<Pod>) -> Vec<NodeInfo> {
        let mut nodes = vec![node("a1", "a"), node("a2", "a"), node("b1", "b")];
        nodes[0].add_pod(&pod("shop", json!({"app": "cache"}), json!({})));
        if let Some(p) = on_b1 {
            nodes[2].add_pod(&p);
        }
        nodes
    }

    /// Which of a1, a2, b1 the Pod may go to, and the reason on the others.
    fn fits(p: &Pod, nodes: &[NodeInfo], namespaces: &NamespaceLabels) -> Vec<Result<(), String>> {
        let state = InterPodAffinity.pre_filter(p, Cluster { nodes, namespaces, pods: &index_pods(nodes) });
        let result =
            |n: &NodeInfo| InterPodAffinity.filter(p, &Resources::default(), n, &state).map_err(|r| r.join(","));
        nodes.iter().map(result).collect()
    }

    #[test]
    fn required_terms_filter_by_topology_domain() {
        let cache = json!({"matchLabels": {"app": "cache"}});
        let (ok, no) = (Ok(()), |r: &str| Err(r.to_owned()));
        let namespaces: NamespaceLabels =
            [("shop".into(), [("team".into(), "a".into())].into()), ("blog".into(), Default::default())].into();
        let affinity = |terms: Value| json!({"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": terms}});
        let anti = |terms: Value| json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": terms}});
        for (name, incoming, on_b1, expected) in [
            (
                "affinity to a node",
                pod("shop", json!({}), affinity(json!([term(cache.clone(), "kubernetes.io/hostname")]))),
                None,
                [ok.clone(), no(REASON_AFFINITY), no(REASON_AFFINITY)],
            ),
            (
                "affinity to a zone",
                pod("shop", json!({}), affinity(json!([term(cache.clone(), "topology.kubernetes.io/zone")]))),
                None,
                [ok.clone(), ok.clone(), no(REASON_AFFINITY)],
            ),
            (
                "a missing topology key never fits",
                pod("shop", json!({}), affinity(json!([term(cache.clone(), "rack")]))),
                None,
                [no(REASON_AFFINITY), no(REASON_AFFINITY), no(REASON_AFFINITY)],
            ),
            (
                "another namespace's Pods do not count",
                pod("blog", json!({}), affinity(json!([term(cache.clone(), "kubernetes.io/hostname")]))),
                None,
                [no(REASON_AFFINITY), no(REASON_AFFINITY), no(REASON_AFFINITY)],
            ),
            (
                "unless the term names it",
                pod(
                    "blog",
                    json!({}),
                    affinity(
                        json!([{"labelSelector": cache, "topologyKey": "kubernetes.io/hostname", "namespaces": ["shop"]}]),
                    ),
                ),
                None,
                [ok.clone(), no(REASON_AFFINITY), no(REASON_AFFINITY)],
            ),
            (
                "or selects it",
                pod(
                    "blog",
                    json!({}),
                    affinity(
                        json!([{"labelSelector": cache, "topologyKey": "kubernetes.io/hostname", "namespaceSelector": {"matchLabels": {"team": "a"}}}]),
                    ),
                ),
                None,
                [ok.clone(), no(REASON_AFFINITY), no(REASON_AFFINITY)],
            ),
            (
                "the first of a group matching itself goes anywhere",
                pod(
                    "shop",
                    json!({"app": "web"}),
                    affinity(json!([term(json!({"matchLabels": {"app": "web"}}), "kubernetes.io/hostname")])),
                ),
                None,
                [ok.clone(), ok.clone(), ok.clone()],
            ),
            (
                "anti-affinity to a zone",
                pod("shop", json!({}), anti(json!([term(cache.clone(), "topology.kubernetes.io/zone")]))),
                None,
                [no(REASON_ANTI_AFFINITY), no(REASON_ANTI_AFFINITY), ok.clone()],
            ),
            (
                "a placed Pod's anti-affinity holds both ways",
                pod("shop", json!({"app": "web"}), json!({})),
                Some(pod(
                    "shop",
                    json!({}),
                    anti(json!([term(json!({"matchLabels": {"app": "web"}}), "topology.kubernetes.io/zone")])),
                )),
                [ok.clone(), ok.clone(), no(REASON_EXISTING_ANTI_AFFINITY)],
            ),
            (
                "a term without a selector selects nothing",
                pod("shop", json!({}), anti(json!([{"topologyKey": "kubernetes.io/hostname"}]))),
                None,
                [ok.clone(), ok.clone(), ok.clone()],
            ),
        ] {
            assert_eq!(fits(&incoming, &cluster(on_b1), &namespaces), expected, "{name}");
        }
    }

    #[test]
    fn preferred_terms_score_both_ways() {
        let cache = json!({"matchLabels": {"app": "cache"}});
        let nodes = cluster(None);
        let refs: Vec<&NodeInfo> = nodes.iter().collect();
        let namespaces = NamespaceLabels::new();
        let scores = |p: &Pod, nodes: &[NodeInfo]| {
            let refs: Vec<&NodeInfo> = nodes.iter().collect();
            let cluster = Cluster { nodes, namespaces: &namespaces, pods: &index_pods(nodes) };
            InterPodAffinity.score_all(p, &Resources::default(), &refs, cluster)
        };
        let near = pod(
            "shop",
            json!({}),
            json!({"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 50, "podAffinityTerm": term(cache.clone(), "topology.kubernetes.io/zone")}
            ]}}),
        );
        assert_eq!(scores(&near, &nodes), [100, 100, 0]);
        let far = pod(
            "shop",
            json!({}),
            json!({"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 50, "podAffinityTerm": term(cache.clone(), "kubernetes.io/hostname")}
            ]}}),
        );
        assert_eq!(scores(&far, &nodes), [0, 100, 100]);
        // A placed Pod that prefers the incoming one draws it to its zone.
        let placed = pod(
            "shop",
            json!({}),
            json!({"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 10, "podAffinityTerm": term(json!({"matchLabels": {"app": "web"}}), "topology.kubernetes.io/zone")}
            ]}}),
        );
        assert_eq!(scores(&pod("shop", json!({"app": "web"}), json!({})), &cluster(Some(placed))), [0, 0, 100]);
        let plain = pod("shop", json!({}), json!({}));
        let pods = index_pods(&nodes);
        let cluster = Cluster { nodes: &nodes, namespaces: &namespaces, pods: &pods };
        assert_eq!(InterPodAffinity.score_all(&plain, &Resources::default(), &refs, cluster), [0, 0, 0]);
    }

    /// The plugin as it was before the index: every placed Pod read on every node. What the
    /// indexed plugin must agree with: the filter's outcome on each node, and the scores.
    fn reference(p: &Pod, nodes: &[NodeInfo], namespaces: &NamespaceLabels) -> (Vec<Result<(), String>>, Vec<i64>) {
        type Pairs = HashMap<(String, String), i64>;
        let add = |domains: &mut Pairs, node: &NodeInfo, key: &str| {
            if let Some(value) = node.label(key) {
                *domains.entry((key.to_owned(), value.to_owned())).or_default() += 1;
            }
        };
        let me = incoming(p);
        let own = p.spec.as_ref().and_then(|s| s.affinity.as_ref());
        let required = |anti: bool| {
            let terms = own.and_then(|a| match anti {
                true => a.pod_anti_affinity.as_ref()?.required_during_scheduling_ignored_during_execution.as_ref(),
                false => a.pod_affinity.as_ref()?.required_during_scheduling_ignored_during_execution.as_ref(),
            });
            required_terms(terms, &me.namespace, me.labels)
        };
        let (affinity, anti_affinity) = (required(false), required(true));
        let (mut affinity_counts, mut anti_counts, mut existing) = (Pairs::new(), Pairs::new(), Pairs::new());
        for node in nodes {
            for placed in &node.pods {
                for term in &placed.required_anti_affinity {
                    if term.matches(&me.namespace, me.labels, namespaces) {
                        add(&mut existing, node, &term.topology_key);
                    }
                }
                let selects = |t: &Term| t.matches(&placed.namespace, &placed.labels, namespaces);
                if !affinity.is_empty() && affinity.iter().all(selects) {
                    affinity.iter().for_each(|t| add(&mut affinity_counts, node, &t.topology_key));
                }
                anti_affinity.iter().filter(|t| selects(t)).for_each(|t| add(&mut anti_counts, node, &t.topology_key));
            }
        }
        let matches_itself = affinity.iter().all(|t| t.matches(&me.namespace, me.labels, namespaces));
        let fits = |node: &NodeInfo| {
            let count = |domains: &Pairs, key: &str| {
                node.label(key).map(|value| domains.get(&(key.to_owned(), value.to_owned())).copied().unwrap_or(0))
            };
            let mut pods_exist = true;
            for term in &affinity {
                match count(&affinity_counts, &term.topology_key) {
                    None => return Err(REASON_AFFINITY.to_owned()),
                    Some(0) => pods_exist = false,
                    Some(_) => {}
                }
            }
            if !(pods_exist || (affinity_counts.is_empty() && matches_itself)) {
                return Err(REASON_AFFINITY.to_owned());
            }
            if anti_affinity.iter().any(|t| count(&anti_counts, &t.topology_key).unwrap_or(0) > 0) {
                return Err(REASON_ANTI_AFFINITY.to_owned());
            }
            if existing.iter().any(|((key, value), n)| *n > 0 && node.label(key) == Some(value)) {
                return Err(REASON_EXISTING_ANTI_AFFINITY.to_owned());
            }
            Ok(())
        };
        let mine = scoring_terms(
            own.and_then(|a| a.pod_affinity.as_ref()),
            own.and_then(|a| a.pod_anti_affinity.as_ref()),
            &me.namespace,
            me.labels,
            false,
        );
        let mut scores = Pairs::new();
        for node in nodes {
            for placed in &node.pods {
                let theirs = placed.scoring.iter().filter(|t| t.matches(&me.namespace, me.labels, namespaces));
                let ours = mine.iter().filter(|t| t.matches(&placed.namespace, &placed.labels, namespaces));
                for term in theirs.chain(ours) {
                    if let Some(value) = node.label(&term.topology_key) {
                        *scores.entry((term.topology_key.clone(), value.to_owned())).or_default() += term.weight;
                    }
                }
            }
        }
        let raw: Vec<i64> = nodes
            .iter()
            .map(|node| scores.iter().filter(|((key, value), _)| node.label(key) == Some(value)).map(|(_, s)| s).sum())
            .collect();
        let (min, max) = (raw.iter().copied().min().unwrap_or(0), raw.iter().copied().max().unwrap_or(0));
        let normalized = raw.iter().map(|s| if max > min { (s - min) * 100 / (max - min) } else { 0 }).collect();
        (nodes.iter().map(fits).collect(), normalized)
    }

    #[test]
    fn the_index_agrees_with_reading_every_pod() {
        // (seed, nodes, placed Pods)
        let cases = [(1, 4, 10), (2, 8, 40), (3, 12, 120), (4, 3, 60), (5, 20, 200), (6, 6, 0)];
        // Every reason and some preference come up, so the cases compare more than empty answers.
        let (mut reasons, mut scored) = (std::collections::BTreeSet::new(), false);
        for (seed, node_count, pod_count) in cases {
            let mut rng = Rng::new(seed + 100);
            random_snapshots(seed, node_count, pod_count, &mut |step, snapshot| {
                assert_eq!(
                    snapshot.pods,
                    index_pods(&snapshot.nodes),
                    "seed {seed}, {step}: the index kept up to date"
                );
                for i in 0..20 {
                    let p = testing::pod(&mut rng, "incoming", 90, false);
                    let cluster = snapshot.cluster();
                    let state = InterPodAffinity.pre_filter(&p, cluster);
                    let fits: Vec<_> = cluster
                        .nodes
                        .iter()
                        .map(|n| InterPodAffinity.filter(&p, &Resources::default(), n, &state).map_err(|r| r.join(",")))
                        .collect();
                    let refs: Vec<&NodeInfo> = cluster.nodes.iter().collect();
                    let scores = InterPodAffinity.score_all(&p, &Resources::default(), &refs, cluster);
                    let want = reference(&p, cluster.nodes, cluster.namespaces);
                    assert_eq!((fits, scores), want, "seed {seed}, {step}, incoming Pod {i}: {p:?}");
                    reasons.extend(want.0.into_iter().filter_map(Result::err));
                    scored |= want.1.iter().any(|s| *s != want.1[0]);
                }
            });
        }
        let expected: std::collections::BTreeSet<String> =
            [REASON_AFFINITY, REASON_ANTI_AFFINITY, REASON_EXISTING_ANTI_AFFINITY].map(String::from).into();
        assert_eq!((reasons, scored), (expected, true));
    }
}
