//! The built-in plugins and the registry that names them.

use crate::framework::{FilterPlugin, NodeInfo, Profile, ScheduleError, ScorePlugin};
use crate::resources::Resources;
use gitplane_api::nodeaffinity::required_matches;
use gitplane_api::taints::{NO_SCHEDULE, UNSCHEDULABLE, tolerates};
use k8s_openapi::api::core::v1::{Pod, Taint};
use std::collections::HashMap;

/// Only nodes whose Ready condition is True and that are not cordoned, unless the Pod tolerates
/// the `node.kubernetes.io/unschedulable` taint (upstream's NodeUnschedulable: daemon Pods do).
pub struct NodeReady;

impl FilterPlugin for NodeReady {
    fn name(&self) -> &'static str {
        "NodeReady"
    }

    fn filter(&self, pod: &Pod, _: &Resources, node: &NodeInfo) -> Result<(), Vec<String>> {
        let cordon = Taint { key: UNSCHEDULABLE.into(), effect: NO_SCHEDULE.into(), ..Default::default() };
        let tolerations = pod.spec.as_ref().and_then(|s| s.tolerations.as_deref()).unwrap_or_default();
        if node.node.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false)
            && !tolerations.iter().any(|t| tolerates(t, &cordon))
        {
            return Err(vec!["node(s) were unschedulable".into()]);
        }
        let ready = node
            .node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
            .is_some_and(|c| c.status == "True");
        if ready { Ok(()) } else { Err(vec!["node(s) were not ready".into()]) }
    }
}

/// `spec.nodeSelector` and the required node affinity (label expressions, and the
/// `metadata.name` field a DaemonSet pins its Pods with) must match the node.
pub struct NodeAffinity;

impl FilterPlugin for NodeAffinity {
    fn name(&self) -> &'static str {
        "NodeAffinity"
    }

    fn filter(&self, pod: &Pod, _: &Resources, node: &NodeInfo) -> Result<(), Vec<String>> {
        let Some(spec) = pod.spec.as_ref() else { return Ok(()) };
        if required_matches(spec, &node.node) {
            Ok(())
        } else {
            Err(vec!["node(s) didn't match Pod's node affinity/selector".into()])
        }
    }
}

/// The node's free CPU, memory and pod slots must cover the pod's requests; a node short of
/// several is counted under each, as kube-scheduler does (`3 Insufficient cpu, 3 Insufficient
/// memory`).
pub struct NodeResourcesFit;

impl FilterPlugin for NodeResourcesFit {
    fn name(&self) -> &'static str {
        "NodeResourcesFit"
    }

    fn filter(&self, _: &Pod, request: &Resources, node: &NodeInfo) -> Result<(), Vec<String>> {
        let (a, r) = (&node.allocatable, &node.requested);
        let short = [
            (r.pods + request.pods > a.pods, "Too many pods"),
            (request.cpu_milli > 0 && r.cpu_milli + request.cpu_milli > a.cpu_milli, "Insufficient cpu"),
            (request.memory > 0 && r.memory + request.memory > a.memory, "Insufficient memory"),
        ];
        let reasons: Vec<String> = short.iter().filter(|(s, _)| *s).map(|(_, r)| (*r).to_owned()).collect();
        if reasons.is_empty() { Ok(()) } else { Err(reasons) }
    }
}

/// Prefers nodes with the most free CPU and memory after placing the pod (spreads load).
pub struct LeastAllocated;

fn free_percent(allocatable: i128, used: i128) -> i64 {
    if allocatable <= 0 { 0 } else { ((allocatable - used).max(0) * 100 / allocatable) as i64 }
}

impl ScorePlugin for LeastAllocated {
    fn name(&self) -> &'static str {
        "LeastAllocated"
    }

    fn score(&self, _: &Pod, request: &Resources, node: &NodeInfo) -> i64 {
        let (a, r) = (&node.allocatable, &node.score_requested);
        let cpu = free_percent(a.cpu_milli, r.cpu_milli + request.cpu_milli);
        let memory = free_percent(a.memory, r.memory + request.memory);
        (cpu + memory) / 2
    }
}

/// Prefers nodes whose CPU and memory would be used in similar proportions.
pub struct BalancedAllocation;

impl ScorePlugin for BalancedAllocation {
    fn name(&self) -> &'static str {
        "BalancedAllocation"
    }

    fn score(&self, _: &Pod, request: &Resources, node: &NodeInfo) -> i64 {
        let (a, r) = (&node.allocatable, &node.score_requested);
        let cpu = 100 - free_percent(a.cpu_milli, r.cpu_milli + request.cpu_milli);
        let memory = 100 - free_percent(a.memory, r.memory + request.memory);
        100 - (cpu - memory).abs()
    }
}

fn untolerated<'a>(pod: &Pod, node: &'a NodeInfo, effects: &[&str]) -> impl Iterator<Item = &'a Taint> {
    let tolerations = pod.spec.as_ref().and_then(|s| s.tolerations.clone()).unwrap_or_default();
    let taints = node.node.spec.as_ref().and_then(|s| s.taints.as_deref()).unwrap_or_default();
    let effects: Vec<String> = effects.iter().map(|e| e.to_string()).collect();
    taints
        .iter()
        .filter(move |t| effects.contains(&t.effect))
        .filter(move |t| !tolerations.iter().any(|tol| tolerates(tol, t)))
}

/// A node's NoSchedule and NoExecute taints must each be tolerated by the Pod; fewer untolerated
/// PreferNoSchedule taints score higher (100 for none, halved by the first, and so on: there is
/// no cross-node normalization as upstream's).
pub struct TaintToleration;

impl FilterPlugin for TaintToleration {
    fn name(&self) -> &'static str {
        "TaintToleration"
    }

    fn filter(&self, pod: &Pod, _: &Resources, node: &NodeInfo) -> Result<(), Vec<String>> {
        match untolerated(pod, node, &["NoSchedule", "NoExecute"]).next() {
            None => Ok(()),
            Some(t) => Err(vec![format!(
                "node(s) had untolerated taint {{{}: {}}}",
                t.key,
                t.value.as_deref().unwrap_or_default()
            )]),
        }
    }
}

impl ScorePlugin for TaintToleration {
    fn name(&self) -> &'static str {
        "TaintToleration"
    }

    fn score(&self, pod: &Pod, _: &Resources, node: &NodeInfo) -> i64 {
        100 / (1 + untolerated(pod, node, &["PreferNoSchedule"]).count() as i64)
    }
}

/// Prefers nodes that already hold the Pod's images, by their total size (upstream's
/// ImageLocality without its spread factor): below 23 MB per container scores 0, 1000 MB per
/// container scores 100, so that tiny images do not outweigh the spreading of load.
pub struct ImageLocality;

const IMAGE_MIN_BYTES: i64 = 23 << 20;
const IMAGE_MAX_BYTES_PER_CONTAINER: i64 = 1000 << 20;

/// An image reference as the runtime names it: `nginx` -> `docker.io/library/nginx:latest`.
fn normalized_image(image: &str) -> String {
    let (name, tagged) = match image.rsplit_once('/') {
        Some((_, last)) => (image.to_owned(), last.contains(':') || last.contains('@')),
        None => (image.to_owned(), image.contains(':') || image.contains('@')),
    };
    let first = name.split('/').next().unwrap_or_default();
    let has_registry = name.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost");
    let name = match (has_registry, name.contains('/')) {
        (true, _) => name,
        (false, true) => format!("docker.io/{name}"),
        (false, false) => format!("docker.io/library/{name}"),
    };
    if tagged { name } else { format!("{name}:latest") }
}

impl ScorePlugin for ImageLocality {
    fn name(&self) -> &'static str {
        "ImageLocality"
    }

    fn score(&self, pod: &Pod, _: &Resources, node: &NodeInfo) -> i64 {
        let Some(spec) = pod.spec.as_ref() else { return 0 };
        let images = node.node.status.as_ref().and_then(|s| s.images.as_deref()).unwrap_or_default();
        let present: i64 = spec
            .containers
            .iter()
            .filter_map(|c| c.image.as_deref())
            .map(normalized_image)
            .filter_map(|wanted| {
                images.iter().find(|i| i.names.iter().flatten().any(|n| normalized_image(n) == wanted))?.size_bytes
            })
            .sum();
        let max = IMAGE_MAX_BYTES_PER_CONTAINER * spec.containers.len().max(1) as i64;
        ((present.clamp(IMAGE_MIN_BYTES, max) - IMAGE_MIN_BYTES) * 100) / (max - IMAGE_MIN_BYTES)
    }
}

/// kube-scheduler's system default spreading (PodTopologySpread with no constraints of the
/// Pod's own): `ScheduleAnyway` with maxSkew 3 over `kubernetes.io/hostname` and maxSkew 5 over
/// `topology.kubernetes.io/zone` where nodes carry it, counting the Pods of the same controller
/// (upstream counts those its Services' and owners' selectors select; one controller's Pods are
/// what those select in practice). Scored as upstream: a node's score grows with the matching
/// Pods in its domain, weighted by log(domains + 2), then normalized across the feasible nodes
/// so that the emptiest domain scores 100.
pub struct PodTopologySpread;

/// (topology key, maxSkew) of the system default constraints.
const DEFAULT_SPREAD: [(&str, i64); 2] = [("kubernetes.io/hostname", 3), ("topology.kubernetes.io/zone", 5)];

impl ScorePlugin for PodTopologySpread {
    fn name(&self) -> &'static str {
        "PodTopologySpread"
    }

    fn score(&self, pod: &Pod, request: &Resources, node: &NodeInfo) -> i64 {
        self.score_all(pod, request, &[node])[0]
    }

    fn score_all(&self, pod: &Pod, _: &Resources, nodes: &[&NodeInfo]) -> Vec<i64> {
        let Some(owner) = crate::framework::controller_uid(pod) else { return vec![100; nodes.len()] };
        let count = |node: &NodeInfo| f64::from(node.by_controller.get(owner).copied().unwrap_or(0));
        // Per constraint: the matching Pods of each domain, and the domains' normalizing weight.
        let mut raw: Vec<Option<f64>> = vec![Some(0.0); nodes.len()];
        for (key, max_skew) in DEFAULT_SPREAD {
            let domain = |node: &NodeInfo| match key {
                "kubernetes.io/hostname" => Some(node.label(key).unwrap_or(node.name()).to_owned()),
                _ => node.label(key).map(str::to_owned),
            };
            let mut in_domain: HashMap<String, f64> = HashMap::new();
            for node in nodes {
                if let Some(d) = domain(node) {
                    *in_domain.entry(d).or_default() += count(node);
                }
            }
            if in_domain.is_empty() {
                continue;
            }
            let weight = (in_domain.len() as f64 + 2.0).ln();
            for (score, node) in raw.iter_mut().zip(nodes) {
                // Nodes without the key are not scored, as upstream leaves them out.
                match domain(node) {
                    Some(d) => *score = score.map(|s| s + in_domain[&d] * weight + (max_skew - 1) as f64),
                    None => *score = None,
                }
            }
        }
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
}

/// Plugins by name, as the profile configuration refers to them.
pub enum Plugin {
    Filter(Box<dyn FilterPlugin>),
    Score(Box<dyn ScorePlugin>),
    /// A plugin at both extension points (its weight is its score's).
    FilterAndScore(Box<dyn FilterPlugin>, Box<dyn ScorePlugin>),
}

pub fn registry(name: &str) -> Option<Plugin> {
    Some(match name {
        "NodeReady" => Plugin::Filter(Box::new(NodeReady)),
        "NodeAffinity" => Plugin::Filter(Box::new(NodeAffinity)),
        "NodeResourcesFit" => Plugin::Filter(Box::new(NodeResourcesFit)),
        "TaintToleration" => Plugin::FilterAndScore(Box::new(TaintToleration), Box::new(TaintToleration)),
        "ImageLocality" => Plugin::Score(Box::new(ImageLocality)),
        "LeastAllocated" => Plugin::Score(Box::new(LeastAllocated)),
        "BalancedAllocation" => Plugin::Score(Box::new(BalancedAllocation)),
        "PodTopologySpread" => Plugin::Score(Box::new(PodTopologySpread)),
        _ => return None,
    })
}

impl Profile {
    /// A profile from plugin names with weights (weights apply to score plugins).
    pub fn from_names(plugins: &[(&str, i64)]) -> Result<Profile, ScheduleError> {
        let mut filters = Vec::new();
        let mut scores = Vec::new();
        for (name, weight) in plugins {
            match registry(name).ok_or_else(|| ScheduleError::UnknownPlugin((*name).to_owned()))? {
                Plugin::Filter(f) => filters.push(f),
                Plugin::Score(s) => scores.push((s, *weight)),
                Plugin::FilterAndScore(f, s) => {
                    filters.push(f);
                    scores.push((s, *weight));
                }
            }
        }
        Ok(Profile::new(filters, scores))
    }
}

impl Default for Profile {
    fn default() -> Self {
        Profile::from_names(&[
            ("NodeReady", 1),
            ("NodeAffinity", 1),
            ("NodeResourcesFit", 1),
            ("TaintToleration", 3),
            ("PodTopologySpread", 2),
            ("LeastAllocated", 1),
            ("BalancedAllocation", 1),
            ("ImageLocality", 1),
        ])
        .expect("the default plugins are registered")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::NodeInfo;
    use k8s_openapi::api::core::v1::Node;
    use serde_json::json;

    fn node(name: &str, cpu: &str, memory: &str, ready: bool) -> NodeInfo {
        NodeInfo::new(
            serde_json::from_value::<Node>(json!({
                "metadata": {"name": name, "labels": {"disk": "ssd"}},
                "status": {
                    "allocatable": {"cpu": cpu, "memory": memory, "pods": "110"},
                    "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]
                }
            }))
            .unwrap(),
        )
    }

    fn pod(cpu: &str, memory: &str) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": {"containers": [
            {"name": "c", "resources": {"requests": {"cpu": cpu, "memory": memory}}}
        ]}}))
        .unwrap()
    }

    #[test]
    fn binds_to_a_ready_node_that_fits() {
        let nodes = [node("a", "1", "1Gi", false), node("b", "500m", "1Gi", true), node("c", "4", "8Gi", true)];
        assert_eq!(Profile::default().schedule(&pod("1", "64Mi"), &nodes), Ok("c".into()));
    }

    #[test]
    fn prefers_the_least_allocated_node() {
        let mut busy = node("a", "4", "8Gi", true);
        busy.add_pod(&pod("3", "6Gi"));
        let nodes = [busy, node("b", "4", "8Gi", true)];
        assert_eq!(Profile::default().schedule(&pod("100m", "64Mi"), &nodes), Ok("b".into()));
    }

    #[test]
    fn pods_without_requests_spread() {
        let bare = || serde_json::from_value::<Pod>(json!({"spec": {"containers": [{"name": "c"}]}})).unwrap();
        let mut one = node("a", "4", "8Gi", true);
        one.add_pod(&bare());
        let nodes = [one, node("b", "4", "8Gi", true)];
        assert_eq!(Profile::default().schedule(&bare(), &nodes), Ok("b".into()));
    }

    #[test]
    fn explains_why_nothing_fits() {
        let mut full = node("a", "2", "8Gi", true);
        full.add_pod(&pod("1500m", "1Gi"));
        let nodes = [full, node("b", "4", "64Mi", true), node("c", "4", "8Gi", false)];
        let err = Profile::default().schedule(&pod("1", "128Mi"), &nodes).unwrap_err();
        assert_eq!(
            err.to_string(),
            "0/3 nodes are available: 1 Insufficient cpu, 1 Insufficient memory, 1 node(s) were not ready."
        );
        let none = Profile::default().schedule(&pod("1", "1"), &[]).unwrap_err();
        assert_eq!(none.to_string(), "0/0 nodes are available: no nodes are registered.");
    }

    #[test]
    fn node_selector_filters() {
        let mut p = pod("0", "0");
        p.spec.as_mut().unwrap().node_selector = Some([("disk".to_owned(), "hdd".to_owned())].into());
        let err = Profile::default().schedule(&p, &[node("a", "1", "1Gi", true)]).unwrap_err();
        assert!(err.to_string().contains("node affinity/selector"));
    }

    /// A daemon Pod pinned to its node by name lands there and nowhere else, and only if the
    /// node fits it otherwise; it may land on a cordoned node, as it tolerates that.
    #[test]
    fn a_pod_pinned_by_name_lands_only_on_its_node() {
        let mut p = pod("100m", "64Mi");
        gitplane_api::nodeaffinity::pin_to_node(p.spec.as_mut().unwrap(), "b");
        let nodes = [node("a", "4", "8Gi", true), node("b", "4", "8Gi", true)];
        assert_eq!(Profile::default().schedule(&p, &nodes), Ok("b".into()));
        let err = Profile::default().schedule(&p, &nodes[..1]).unwrap_err();
        assert_eq!(err.to_string(), "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector.");
        let small = [node("a", "4", "8Gi", true), node("b", "50m", "8Gi", true)];
        let err = Profile::default().schedule(&p, &small).unwrap_err();
        assert!(err.to_string().contains("1 Insufficient cpu"), "{err}");
        let mut cordoned = node("b", "4", "8Gi", true);
        cordoned.node.spec = Some(serde_json::from_value(json!({"unschedulable": true})).unwrap());
        let cordoned = [cordoned];
        assert!(Profile::default().schedule(&p, &cordoned).is_err());
        p.spec.as_mut().unwrap().tolerations = Some(
            serde_json::from_value(json!([{"key": UNSCHEDULABLE, "operator": "Exists", "effect": "NoSchedule"}]))
                .unwrap(),
        );
        assert_eq!(Profile::default().schedule(&p, &cordoned), Ok("b".into()));
    }

    fn tainted(name: &str, taints: serde_json::Value) -> NodeInfo {
        let mut info = node(name, "4", "8Gi", true);
        info.node.spec = Some(serde_json::from_value(json!({"taints": taints})).unwrap());
        info
    }

    fn tolerating(tolerations: serde_json::Value) -> Pod {
        let mut p = pod("100m", "64Mi");
        p.spec.as_mut().unwrap().tolerations = serde_json::from_value(tolerations).unwrap();
        p
    }

    #[test]
    fn taints_keep_pods_off_unless_tolerated() {
        let nodes = [tainted("a", json!([{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]))];
        let err = Profile::default().schedule(&pod("100m", "64Mi"), &nodes).unwrap_err();
        assert_eq!(err.to_string(), "0/1 nodes are available: 1 node(s) had untolerated taint {dedicated: db}.");
        for tolerations in [
            json!([{"key": "dedicated", "operator": "Equal", "value": "db", "effect": "NoSchedule"}]),
            json!([{"key": "dedicated", "operator": "Exists"}]),
            json!([{"operator": "Exists"}]),
        ] {
            assert_eq!(
                Profile::default().schedule(&tolerating(tolerations.clone()), &nodes),
                Ok("a".into()),
                "{tolerations}"
            );
        }
        for tolerations in [
            json!([{"key": "dedicated", "value": "web", "effect": "NoSchedule"}]),
            json!([{"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}]),
        ] {
            assert!(Profile::default().schedule(&tolerating(tolerations.clone()), &nodes).is_err(), "{tolerations}");
        }
    }

    #[test]
    fn prefer_no_schedule_is_a_preference() {
        let nodes = [tainted("a", json!([{"key": "spot", "effect": "PreferNoSchedule"}])), tainted("b", json!([]))];
        assert_eq!(Profile::default().schedule(&pod("100m", "64Mi"), &nodes), Ok("b".into()));
        let only = [tainted("a", json!([{"key": "spot", "effect": "PreferNoSchedule"}]))];
        assert_eq!(Profile::default().schedule(&pod("100m", "64Mi"), &only), Ok("a".into()));
    }

    #[test]
    fn image_locality_prefers_nodes_holding_big_images() {
        let with_images = |name: &str, images: serde_json::Value| {
            let mut info = node(name, "4", "8Gi", true);
            info.node.status.as_mut().unwrap().images = serde_json::from_value(images).unwrap();
            info
        };
        let mut p = pod("100m", "64Mi");
        p.spec.as_mut().unwrap().containers[0].image = Some("postgres:16".into());
        let big = json!([{"names": ["docker.io/library/postgres:16"], "sizeBytes": 400 << 20}]);
        let nodes = [with_images("a", json!([])), with_images("b", big)];
        assert!(ImageLocality.score(&p, &Resources::default(), &nodes[1]) > 30);
        assert_eq!(ImageLocality.score(&p, &Resources::default(), &nodes[0]), 0);
        assert_eq!(Profile::default().schedule(&p, &nodes), Ok("b".into()));
        assert_eq!(normalized_image("gitplane.local/httpd:1"), "gitplane.local/httpd:1");
        assert_eq!(normalized_image("me/app"), "docker.io/me/app:latest");
    }

    #[test]
    fn a_node_short_of_several_resources_counts_under_each() {
        let nodes = [node("a", "1", "1Gi", true), node("b", "1", "1Gi", true), node("c", "1", "1Gi", true)];
        let err = Profile::default().schedule(&pod("2", "2Gi"), &nodes).unwrap_err();
        assert_eq!(err.to_string(), "0/3 nodes are available: 3 Insufficient cpu, 3 Insufficient memory.");
    }

    fn replica(owner: &str) -> Pod {
        let mut p = pod("100m", "64Mi");
        p.metadata.owner_references = Some(vec![
            serde_json::from_value(json!({
                "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": owner, "uid": owner, "controller": true
            }))
            .unwrap(),
        ]);
        p
    }

    /// Three replicas on three equal nodes, one at a time as the scheduler binds them: each goes
    /// to a node without one, even where the node without one is a little busier.
    #[test]
    fn replicas_of_one_controller_spread_over_nodes() {
        let mut nodes = vec![node("a", "4", "8Gi", true), node("b", "4", "8Gi", true), node("c", "4", "8Gi", true)];
        // Some other load on c, which LeastAllocated alone would avoid.
        nodes[2].add_pod(&pod("500m", "512Mi"));
        let mut placed = Vec::new();
        for _ in 0..3 {
            let pod = replica("rs-1");
            let name = Profile::default().schedule(&pod, &nodes).unwrap();
            nodes.iter_mut().find(|n| n.name() == name).unwrap().add_pod(&pod);
            placed.push(name);
        }
        placed.sort();
        assert_eq!(placed, ["a", "b", "c"]);
        // Another controller's Pods do not count against this one's.
        assert_eq!(Profile::default().schedule(&replica("rs-2"), &nodes[..2]), Ok("a".into()));
    }

    #[test]
    fn spreading_over_zones_where_nodes_carry_them() {
        let zoned = |name: &str, zone: &str| {
            let mut info = node(name, "4", "8Gi", true);
            info.node.metadata.labels.as_mut().unwrap().insert("topology.kubernetes.io/zone".into(), zone.into());
            info
        };
        let mut nodes = [zoned("a1", "a"), zoned("a2", "a"), zoned("b1", "b")];
        nodes[0].add_pod(&replica("rs-1"));
        let scores =
            PodTopologySpread.score_all(&replica("rs-1"), &Resources::default(), &nodes.iter().collect::<Vec<_>>());
        // b1 is in the zone without a replica: the best; a2 shares a1's zone, a1 has one itself.
        assert_eq!(scores[2], 100, "{scores:?}");
        assert!(scores[0] < scores[1] && scores[1] < scores[2], "{scores:?}");
        // Without a controller there is nothing to spread.
        assert_eq!(PodTopologySpread.score_all(&pod("1", "1"), &Resources::default(), &[&nodes[0]]), [100]);
    }

    #[test]
    fn unknown_plugins_are_named() {
        let err = Profile::from_names(&[("Nope", 1)]).unwrap_err();
        assert_eq!(err.to_string(), "unknown scheduler plugin \"Nope\"");
    }
}
