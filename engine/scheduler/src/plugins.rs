//! The built-in plugins and the registry that names them; the plugins that look beyond one node
//! and one Pod have modules of their own.

pub mod inter_pod_affinity;
pub mod node_affinity;
pub mod node_ports;
pub mod topology_spread;

use crate::framework::{
    Cluster, CycleState, FilterPlugin, NodeInfo, Profile, ScheduleError, ScorePlugin, normalized_image,
};
use crate::resources::Resources;
use gitplane_api::taints::{NO_SCHEDULE, UNSCHEDULABLE, tolerates};
use inter_pod_affinity::InterPodAffinity;
use k8s_openapi::api::core::v1::{Pod, Taint};
use node_affinity::NodeAffinity;
use node_ports::NodePorts;
use topology_spread::PodTopologySpread;

/// Only nodes whose Ready condition is True and that are not cordoned, unless the Pod tolerates
/// the `node.kubernetes.io/unschedulable` taint (upstream's NodeUnschedulable: daemon Pods do).
pub struct NodeReady;

impl FilterPlugin for NodeReady {
    fn name(&self) -> &'static str {
        "NodeReady"
    }

    fn filter(&self, pod: &Pod, _: &Resources, node: &NodeInfo, _: &CycleState) -> Result<(), Vec<String>> {
        let tolerations = pod.spec.as_ref().and_then(|s| s.tolerations.as_deref()).unwrap_or_default();
        let cordon = || Taint { key: UNSCHEDULABLE.into(), effect: NO_SCHEDULE.into(), ..Default::default() };
        if node.node.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false)
            && !tolerations.iter().any(|t| tolerates(t, &cordon()))
        {
            return Err(vec!["node(s) were unschedulable".into()]);
        }
        if node.ready { Ok(()) } else { Err(vec!["node(s) were not ready".into()]) }
    }
}

/// `spec.nodeSelector` must match the node's labels.
pub struct NodeSelector;

impl FilterPlugin for NodeSelector {
    fn name(&self) -> &'static str {
        "NodeSelector"
    }

    fn filter(&self, pod: &Pod, _: &Resources, node: &NodeInfo, _: &CycleState) -> Result<(), Vec<String>> {
        let Some(selector) = pod.spec.as_ref().and_then(|s| s.node_selector.as_ref()) else { return Ok(()) };
        if selector.iter().all(|(k, v)| node.label(k) == Some(v.as_str())) {
            Ok(())
        } else {
            Err(vec![node_affinity::REASON.into()])
        }
    }
}

/// The node's free CPU, memory, ephemeral storage, pod slots and extended resources must cover
/// the pod's requests; a node short of several is counted under each, as kube-scheduler does
/// (`3 Insufficient cpu, 3 Insufficient memory`).
pub struct NodeResourcesFit;

impl FilterPlugin for NodeResourcesFit {
    fn name(&self) -> &'static str {
        "NodeResourcesFit"
    }

    fn filter(&self, _: &Pod, request: &Resources, node: &NodeInfo, _: &CycleState) -> Result<(), Vec<String>> {
        let (a, r) = (&node.allocatable, &node.requested);
        let short = [
            (r.pods + request.pods > a.pods, "Too many pods"),
            (request.cpu_milli > 0 && r.cpu_milli + request.cpu_milli > a.cpu_milli, "Insufficient cpu"),
            (request.memory > 0 && r.memory + request.memory > a.memory, "Insufficient memory"),
        ];
        let storage =
            request.ephemeral_storage > 0 && r.ephemeral_storage + request.ephemeral_storage > a.ephemeral_storage;
        let mut reasons: Vec<String> = short.iter().filter(|(s, _)| *s).map(|(_, r)| (*r).to_owned()).collect();
        if storage {
            reasons.push("Insufficient ephemeral-storage".into());
        }
        for (name, wanted) in request.extended.iter().filter(|(_, n)| **n > 0) {
            let has = a.extended.get(name).copied().unwrap_or(0);
            if r.extended.get(name).copied().unwrap_or(0) + wanted > has {
                reasons.push(format!("Insufficient {name}"));
            }
        }
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

fn untolerated<'a>(pod: &'a Pod, node: &'a NodeInfo, effects: &'a [&str]) -> impl Iterator<Item = &'a Taint> {
    let tolerations = pod.spec.as_ref().and_then(|s| s.tolerations.as_deref()).unwrap_or_default();
    let taints = node.node.spec.as_ref().and_then(|s| s.taints.as_deref()).unwrap_or_default();
    taints
        .iter()
        .filter(move |t| effects.contains(&t.effect.as_str()))
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

    fn filter(&self, pod: &Pod, _: &Resources, node: &NodeInfo, _: &CycleState) -> Result<(), Vec<String>> {
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

impl ScorePlugin for ImageLocality {
    fn name(&self) -> &'static str {
        "ImageLocality"
    }

    fn score(&self, pod: &Pod, request: &Resources, node: &NodeInfo) -> i64 {
        let cluster = Cluster { nodes: &[], namespaces: &Default::default(), pods: &Default::default() };
        self.score_all(pod, request, &[node], cluster)[0]
    }

    /// The Pod's images are named as the runtime names them once, the nodes' when they enter
    /// the snapshot ([`NodeInfo::images`]).
    fn score_all(&self, pod: &Pod, _: &Resources, nodes: &[&NodeInfo], _: Cluster<'_>) -> Vec<i64> {
        let Some(spec) = pod.spec.as_ref() else { return vec![0; nodes.len()] };
        let wanted: Vec<String> =
            spec.containers.iter().filter_map(|c| c.image.as_deref()).map(normalized_image).collect();
        let max = IMAGE_MAX_BYTES_PER_CONTAINER * spec.containers.len().max(1) as i64;
        let score = |node: &&NodeInfo| {
            let present: i64 = wanted.iter().filter_map(|w| node.images.get(w)).sum();
            ((present.clamp(IMAGE_MIN_BYTES, max) - IMAGE_MIN_BYTES) * 100) / (max - IMAGE_MIN_BYTES)
        };
        nodes.iter().map(score).collect()
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
        "NodeSelector" => Plugin::Filter(Box::new(NodeSelector)),
        "NodeResourcesFit" => Plugin::Filter(Box::new(NodeResourcesFit)),
        "NodeAffinity" => Plugin::FilterAndScore(Box::new(NodeAffinity), Box::new(NodeAffinity)),
        "NodePorts" => Plugin::Filter(Box::new(NodePorts)),
        "InterPodAffinity" => Plugin::FilterAndScore(Box::new(InterPodAffinity), Box::new(InterPodAffinity)),
        "TaintToleration" => Plugin::FilterAndScore(Box::new(TaintToleration), Box::new(TaintToleration)),
        "ImageLocality" => Plugin::Score(Box::new(ImageLocality)),
        "LeastAllocated" => Plugin::Score(Box::new(LeastAllocated)),
        "BalancedAllocation" => Plugin::Score(Box::new(BalancedAllocation)),
        "PodTopologySpread" => Plugin::FilterAndScore(Box::new(PodTopologySpread), Box::new(PodTopologySpread)),
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

/// The default profile's plugins in the order they run, with kube-scheduler's default score
/// weights.
pub const DEFAULT_PLUGINS: [(&str, i64); 11] = [
    ("NodeReady", 1),
    ("NodeSelector", 1),
    ("NodeAffinity", 2),
    ("NodePorts", 1),
    ("NodeResourcesFit", 1),
    ("TaintToleration", 3),
    ("PodTopologySpread", 2),
    ("InterPodAffinity", 2),
    ("LeastAllocated", 1),
    ("BalancedAllocation", 1),
    ("ImageLocality", 1),
];

impl Default for Profile {
    fn default() -> Self {
        Profile::from_names(&DEFAULT_PLUGINS).expect("the default plugins are registered")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::{Cluster, NamespaceLabels, NodeInfo, index_pods};
    use k8s_openapi::api::core::v1::Node;
    use serde_json::json;
    use std::sync::LazyLock;

    static NONE: LazyLock<NamespaceLabels> = LazyLock::new(NamespaceLabels::new);

    /// The default profile's pick among `nodes` (sorted by name), with their Pods.
    fn schedule(pod: &Pod, nodes: &[NodeInfo]) -> Result<String, ScheduleError> {
        Profile::default().schedule(pod, Cluster { nodes, namespaces: &NONE, pods: &index_pods(nodes) })
    }

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
        assert_eq!(schedule(&pod("1", "64Mi"), &nodes), Ok("c".into()));
    }

    #[test]
    fn prefers_the_least_allocated_node() {
        let mut busy = node("a", "4", "8Gi", true);
        busy.add_pod(&pod("3", "6Gi"));
        let nodes = [busy, node("b", "4", "8Gi", true)];
        assert_eq!(schedule(&pod("100m", "64Mi"), &nodes), Ok("b".into()));
    }

    #[test]
    fn pods_without_requests_spread() {
        let bare = || serde_json::from_value::<Pod>(json!({"spec": {"containers": [{"name": "c"}]}})).unwrap();
        let mut one = node("a", "4", "8Gi", true);
        one.add_pod(&bare());
        let nodes = [one, node("b", "4", "8Gi", true)];
        assert_eq!(schedule(&bare(), &nodes), Ok("b".into()));
    }

    #[test]
    fn explains_why_nothing_fits() {
        let mut full = node("a", "2", "8Gi", true);
        full.add_pod(&pod("1500m", "1Gi"));
        let nodes = [full, node("b", "4", "64Mi", true), node("c", "4", "8Gi", false)];
        let err = schedule(&pod("1", "128Mi"), &nodes).unwrap_err();
        assert_eq!(
            err.to_string(),
            "0/3 nodes are available: 1 Insufficient cpu, 1 Insufficient memory, 1 node(s) were not ready."
        );
        let none = schedule(&pod("1", "1"), &[]).unwrap_err();
        assert_eq!(none.to_string(), "0/0 nodes are available: no nodes are registered.");
    }

    #[test]
    fn node_selector_filters() {
        let mut p = pod("0", "0");
        p.spec.as_mut().unwrap().node_selector = Some([("disk".to_owned(), "hdd".to_owned())].into());
        let err = schedule(&p, &[node("a", "1", "1Gi", true)]).unwrap_err();
        assert!(err.to_string().contains("node affinity/selector"));
    }

    /// A daemon Pod pinned to its node by name lands there and nowhere else, and only if the
    /// node fits it otherwise; it may land on a cordoned node, as it tolerates that.
    #[test]
    fn a_pod_pinned_by_name_lands_only_on_its_node() {
        let mut p = pod("100m", "64Mi");
        gitplane_api::nodeaffinity::pin_to_node(p.spec.as_mut().unwrap(), "b");
        let nodes = [node("a", "4", "8Gi", true), node("b", "4", "8Gi", true)];
        assert_eq!(schedule(&p, &nodes), Ok("b".into()));
        let err = schedule(&p, &nodes[..1]).unwrap_err();
        assert!(err.to_string().contains("node affinity/selector"), "{err}");
        let small = [node("a", "4", "8Gi", true), node("b", "50m", "8Gi", true)];
        let err = schedule(&p, &small).unwrap_err();
        assert!(err.to_string().contains("1 Insufficient cpu"), "{err}");
        let mut cordoned = node("b", "4", "8Gi", true);
        cordoned.node.spec = Some(serde_json::from_value(json!({"unschedulable": true})).unwrap());
        let cordoned = [cordoned];
        assert!(schedule(&p, &cordoned).is_err());
        p.spec.as_mut().unwrap().tolerations = Some(
            serde_json::from_value(json!([{"key": UNSCHEDULABLE, "operator": "Exists", "effect": "NoSchedule"}]))
                .unwrap(),
        );
        assert_eq!(schedule(&p, &cordoned), Ok("b".into()));
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
        let err = schedule(&pod("100m", "64Mi"), &nodes).unwrap_err();
        assert_eq!(err.to_string(), "0/1 nodes are available: 1 node(s) had untolerated taint {dedicated: db}.");
        for tolerations in [
            json!([{"key": "dedicated", "operator": "Equal", "value": "db", "effect": "NoSchedule"}]),
            json!([{"key": "dedicated", "operator": "Exists"}]),
            json!([{"operator": "Exists"}]),
        ] {
            assert_eq!(schedule(&tolerating(tolerations.clone()), &nodes), Ok("a".into()), "{tolerations}");
        }
        for tolerations in [
            json!([{"key": "dedicated", "value": "web", "effect": "NoSchedule"}]),
            json!([{"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}]),
        ] {
            assert!(schedule(&tolerating(tolerations.clone()), &nodes).is_err(), "{tolerations}");
        }
    }

    #[test]
    fn prefer_no_schedule_is_a_preference() {
        let nodes = [tainted("a", json!([{"key": "spot", "effect": "PreferNoSchedule"}])), tainted("b", json!([]))];
        assert_eq!(schedule(&pod("100m", "64Mi"), &nodes), Ok("b".into()));
        let only = [tainted("a", json!([{"key": "spot", "effect": "PreferNoSchedule"}]))];
        assert_eq!(schedule(&pod("100m", "64Mi"), &only), Ok("a".into()));
    }

    #[test]
    fn image_locality_prefers_nodes_holding_big_images() {
        let with_images = |name: &str, images: serde_json::Value| {
            let mut info = node(name, "4", "8Gi", true);
            let mut changed = info.node.clone();
            changed.status.as_mut().unwrap().images = serde_json::from_value(images).unwrap();
            info.set_node(changed);
            info
        };
        let mut p = pod("100m", "64Mi");
        p.spec.as_mut().unwrap().containers[0].image = Some("postgres:16".into());
        let big = json!([{"names": ["docker.io/library/postgres:16"], "sizeBytes": 400 << 20}]);
        let nodes = [with_images("a", json!([])), with_images("b", big)];
        assert!(ImageLocality.score(&p, &Resources::default(), &nodes[1]) > 30);
        assert_eq!(ImageLocality.score(&p, &Resources::default(), &nodes[0]), 0);
        assert_eq!(schedule(&p, &nodes), Ok("b".into()));
        assert_eq!(normalized_image("gitplane.local/httpd:1"), "gitplane.local/httpd:1");
        assert_eq!(normalized_image("me/app"), "docker.io/me/app:latest");
    }

    #[test]
    fn a_node_short_of_several_resources_counts_under_each() {
        let nodes = [node("a", "1", "1Gi", true), node("b", "1", "1Gi", true), node("c", "1", "1Gi", true)];
        let err = schedule(&pod("2", "2Gi"), &nodes).unwrap_err();
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
            let name = schedule(&pod, &nodes).unwrap();
            nodes.iter_mut().find(|n| n.name() == name).unwrap().add_pod(&pod);
            placed.push(name);
        }
        placed.sort();
        assert_eq!(placed, ["a", "b", "c"]);
        // Another controller's Pods do not count against this one's.
        assert_eq!(schedule(&replica("rs-2"), &nodes[..2]), Ok("a".into()));
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
        let scores = PodTopologySpread.score_all(
            &replica("rs-1"),
            &Resources::default(),
            &nodes.iter().collect::<Vec<_>>(),
            Cluster { nodes: &nodes, namespaces: &NONE, pods: &index_pods(&nodes) },
        );
        // b1 is in the zone without a replica: the best; a2 shares a1's zone, a1 has one itself.
        assert_eq!(scores[2], 100, "{scores:?}");
        assert!(scores[0] < scores[1] && scores[1] < scores[2], "{scores:?}");
        // Without a controller there is nothing to spread.
        let pods = index_pods(&nodes);
        let cluster = Cluster { nodes: &nodes, namespaces: &NONE, pods: &pods };
        assert_eq!(PodTopologySpread.score_all(&pod("1", "1"), &Resources::default(), &[&nodes[0]], cluster), [100]);
    }

    #[test]
    fn unknown_plugins_are_named() {
        let err = Profile::from_names(&[("Nope", 1)]).unwrap_err();
        assert_eq!(err.to_string(), "unknown scheduler plugin \"Nope\"");
    }

    /// kube-scheduler's message for a Pod refused by several plugins: each node counted under
    /// the first filter it fails.
    #[test]
    fn reasons_of_several_plugins_are_counted_per_node() {
        let mut nodes = [node("a", "4", "8Gi", true), node("b", "4", "8Gi", true), node("c", "4", "8Gi", true)];
        nodes[0].node.metadata.labels.as_mut().unwrap().insert("disk".into(), "hdd".into());
        let taken: Pod = serde_json::from_value(json!({"spec": {"containers": [
            {"name": "c", "ports": [{"containerPort": 80, "hostPort": 8080}]}
        ]}}))
        .unwrap();
        nodes[1].add_pod(&taken);
        nodes[2].add_pod(&taken);
        let p: Pod = serde_json::from_value(json!({"spec": {
            "containers": [{"name": "c", "ports": [{"containerPort": 80, "hostPort": 8080}]}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}
            ]}}}
        }}))
        .unwrap();
        let err = schedule(&p, &nodes).unwrap_err();
        assert_eq!(
            err.to_string(),
            "0/3 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, \
             2 node(s) didn't have free ports for the requested pod ports."
        );
    }

    #[test]
    fn ephemeral_storage_and_extended_resources_must_fit() {
        let with = |name: &str, extra: serde_json::Value| {
            let mut info = node(name, "4", "8Gi", true);
            let status = info.node.status.as_mut().unwrap();
            for (k, v) in extra.as_object().unwrap() {
                let quantity = k8s_openapi::apimachinery::pkg::api::resource::Quantity(v.as_str().unwrap().into());
                status.allocatable.as_mut().unwrap().insert(k.clone(), quantity);
            }
            NodeInfo::new(info.node)
        };
        let nodes = [
            with("a", json!({"ephemeral-storage": "1Gi"})),
            with("b", json!({"ephemeral-storage": "10Gi"})),
            with("c", json!({"ephemeral-storage": "10Gi", "nvidia.com/gpu": "2"})),
        ];
        let asking = |resources: serde_json::Value| -> Pod {
            serde_json::from_value(json!({"spec": {"containers": [{"name": "c", "resources": resources}]}})).unwrap()
        };
        for (resources, expected) in [
            (
                json!({"requests": {"ephemeral-storage": "2Gi"}}),
                Err("0/3 nodes are available: 1 Insufficient ephemeral-storage."),
            ),
            (json!({"limits": {"nvidia.com/gpu": "2"}}), Ok("c")),
            (
                json!({"requests": {"nvidia.com/gpu": "3"}, "limits": {"nvidia.com/gpu": "3"}}),
                Err("0/3 nodes are available: 3 Insufficient nvidia.com/gpu."),
            ),
            (
                json!({"limits": {"example.com/foo": "1"}}),
                Err("0/3 nodes are available: 3 Insufficient example.com/foo."),
            ),
        ] {
            let placed = schedule(&asking(resources.clone()), &nodes);
            match expected {
                Ok(node) => assert_eq!(placed, Ok(node.into()), "{resources}"),
                Err(message) if message.contains("ephemeral") => {
                    // a is short of storage; b and c fit, so only a is counted.
                    assert!(placed.is_ok(), "{resources}");
                    let only_a = schedule(&asking(resources.clone()), &nodes[..1]);
                    assert_eq!(only_a.unwrap_err().to_string(), message.replace("0/3", "0/1"), "{resources}");
                }
                Err(message) => assert_eq!(placed.unwrap_err().to_string(), message, "{resources}"),
            }
        }
        // What is bound counts: two GPUs taken leave none.
        let mut full = nodes[2].clone();
        full.add_pod(&asking(json!({"limits": {"nvidia.com/gpu": "2"}})));
        let err = schedule(&asking(json!({"limits": {"nvidia.com/gpu": "1"}})), &[full]);
        assert_eq!(err.unwrap_err().to_string(), "0/1 nodes are available: 1 Insufficient nvidia.com/gpu.");
    }
}
