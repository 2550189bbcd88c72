//! The pure scheduling core: filter, then score, then pick. No I/O.

use crate::pod_index::PodIndex;
use crate::resources::{Resources, is_sidecar, node_allocatable, pod_requests, pod_score_requests};
use k8s_openapi::api::core::v1::{Node, Pod};
use std::{
    any::Any,
    collections::{BTreeMap, HashMap},
    fmt,
    sync::atomic::{AtomicUsize, Ordering},
};

pub use crate::pod_index::PodInfo;
pub use crate::terms::NamespaceLabels;

/// What a scheduling cycle sees of the cluster: every node (not only the feasible ones), sorted
/// by name, the namespaces' labels, and the index of the nodes' Pods.
#[derive(Clone, Copy)]
pub struct Cluster<'a> {
    pub nodes: &'a [NodeInfo],
    pub namespaces: &'a NamespaceLabels,
    pub pods: &'a PodIndex,
}

impl<'a> Cluster<'a> {
    /// The node of this name.
    pub fn node(&self, name: &str) -> Option<&'a NodeInfo> {
        let at = self.nodes.binary_search_by(|n| n.name().cmp(name)).ok()?;
        Some(&self.nodes[at])
    }
}

/// The index of every node's Pods at once (a snapshot keeps its own up to date instead).
pub fn index_pods(nodes: &[NodeInfo]) -> PodIndex {
    let mut index = PodIndex::default();
    for node in nodes {
        for pod in &node.pods {
            index.add(pod, node.name(), node.labels());
        }
    }
    index
}

/// A port of the node a Pod takes (`hostPort`): its address (`0.0.0.0` for all), protocol
/// and number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostPort {
    pub ip: String,
    pub protocol: String,
    pub port: i32,
}

impl HostPort {
    /// Whether two Pods could not both have these ports: same protocol and number on
    /// overlapping addresses (kube-scheduler's `HostPortInfo.CheckConflict`).
    pub fn conflicts(&self, other: &HostPort) -> bool {
        self.port == other.port
            && self.protocol == other.protocol
            && (self.ip == other.ip || self.ip == ANY_IP || other.ip == ANY_IP)
    }
}

const ANY_IP: &str = "0.0.0.0";

/// The host ports of a Pod's containers and sidecars.
pub fn host_ports(pod: &Pod) -> Vec<HostPort> {
    let Some(spec) = pod.spec.as_ref() else { return Vec::new() };
    let sidecars = spec.init_containers.iter().flatten().filter(|c| is_sidecar(c));
    spec.containers
        .iter()
        .chain(sidecars)
        .flat_map(|c| c.ports.iter().flatten())
        .filter(|p| p.host_port.is_some_and(|h| h > 0))
        .map(|p| HostPort {
            ip: p.host_ip.clone().filter(|ip| !ip.is_empty()).unwrap_or_else(|| ANY_IP.into()),
            protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
            port: p.host_port.unwrap_or_default(),
        })
        .collect()
}

/// A node as the scheduler sees it: the Node and what its bound Pods already request.
#[derive(Clone, Debug)]
pub struct NodeInfo {
    pub node: Node,
    pub allocatable: Resources,
    /// What its Pods request (what fits is decided on this).
    pub requested: Resources,
    /// The same with kube-scheduler's non-zero defaults (what scoring counts).
    pub score_requested: Resources,
    /// Its Pods by the uid of their controller (ReplicaSet, Job, ...): what spreading counts.
    pub by_controller: HashMap<String, u32>,
    /// Its Pods, for inter-Pod affinity and topology spreading by label selectors.
    pub pods: Vec<PodInfo>,
    /// The host ports its Pods take.
    pub host_ports: Vec<HostPort>,
    /// Its Ready condition is True (what NodeReady reads of every node in every cycle).
    pub ready: bool,
    /// The sizes of the images the node holds, by each of their names as the runtime names
    /// them (what ImageLocality looks up).
    pub images: HashMap<String, i64>,
}

fn is_ready(node: &Node) -> bool {
    let conditions = node.status.as_ref().and_then(|s| s.conditions.as_deref()).unwrap_or_default();
    conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True")
}

fn node_images(node: &Node) -> HashMap<String, i64> {
    let images = node.status.as_ref().and_then(|s| s.images.as_deref()).unwrap_or_default();
    let named = images.iter().flat_map(|i| i.names.iter().flatten().map(|n| (n, i.size_bytes.unwrap_or(0))));
    named.map(|(name, size)| (normalized_image(name), size)).collect()
}

/// An image reference as the runtime names it: `nginx` -> `docker.io/library/nginx:latest`.
pub fn normalized_image(image: &str) -> String {
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

impl NodeInfo {
    /// The node changed (its labels, taints, allocatable, conditions); its Pods stay counted.
    pub fn set_node(&mut self, node: Node) {
        self.allocatable = node_allocatable(&node);
        self.images = node_images(&node);
        self.ready = is_ready(&node);
        self.node = node;
    }

    pub fn new(node: Node) -> Self {
        let (allocatable, images, ready) = (node_allocatable(&node), node_images(&node), is_ready(&node));
        NodeInfo {
            node,
            allocatable,
            requested: Resources::default(),
            score_requested: Resources::default(),
            by_controller: HashMap::new(),
            pods: Vec::new(),
            host_ports: Vec::new(),
            ready,
            images,
        }
    }

    pub fn name(&self) -> &str {
        self.node.metadata.name.as_deref().unwrap_or("")
    }

    /// The value of one of the node's labels.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels()?.get(key).map(String::as_str)
    }

    /// The node's labels: its Pods' topology domains.
    pub fn labels(&self) -> Option<&gitplane_api::labels::Labels> {
        self.node.metadata.labels.as_ref()
    }

    /// Accounts for a Pod bound (or assumed bound) to this node; what the index counts of it is
    /// the last of `pods`. Returns what was counted, all [`NodeInfo::remove_pod`] needs: the
    /// snapshot keeps that instead of the Pod (a decoded Pod is several KiB, and a cluster holds
    /// 150,000 of them).
    pub fn add_pod(&mut self, pod: &Pod) -> Counted {
        let info = PodInfo::new(pod);
        let counted = Counted {
            namespace: info.namespace.clone(),
            name: info.name.clone(),
            requests: pod_requests(pod),
            score_requests: pod_score_requests(pod),
            controller: controller_uid(pod).map(str::to_owned),
            host_ports: host_ports(pod),
        };
        self.requested.add(&counted.requests);
        self.score_requested.add(&counted.score_requests);
        if let Some(uid) = &counted.controller {
            *self.by_controller.entry(uid.clone()).or_default() += 1;
        }
        self.host_ports.extend(counted.host_ports.iter().cloned());
        self.pods.push(info);
        counted
    }

    /// Takes back what [`NodeInfo::add_pod`] accounted for a Pod and returns what the index
    /// counted of it; nothing if it is not counted.
    pub fn remove_pod(&mut self, counted: &Counted) -> Option<PodInfo> {
        let at = self.pods.iter().position(|p| p.name == counted.name && p.namespace == counted.namespace)?;
        let info = self.pods.swap_remove(at);
        self.requested.sub(&counted.requests);
        self.score_requested.sub(&counted.score_requests);
        if let Some(uid) = &counted.controller
            && let Some(count) = self.by_controller.get_mut(uid)
        {
            *count -= 1;
            if *count == 0 {
                self.by_controller.remove(uid);
            }
        }
        for port in &counted.host_ports {
            if let Some(i) = self.host_ports.iter().position(|p| p == port) {
                self.host_ports.swap_remove(i);
            }
        }
        Some(info)
    }
}

/// What [`NodeInfo::add_pod`] accounted for one Pod.
#[derive(Clone, Debug)]
pub struct Counted {
    namespace: String,
    name: String,
    requests: Resources,
    score_requests: Resources,
    controller: Option<String>,
    host_ports: Vec<HostPort>,
}

/// The uid of the Pod's controller (its ownerReference with `controller: true`).
pub fn controller_uid(pod: &Pod) -> Option<&str> {
    let owners = pod.metadata.owner_references.as_deref()?;
    owners.iter().find(|o| o.controller == Some(true)).map(|o| o.uid.as_str())
}

/// What a plugin's PreFilter computed once for the Pod, handed to its Filter on every node
/// (kube-scheduler's CycleState entry); each plugin reads back its own type.
pub type CycleState = Option<Box<dyn Any + Send + Sync>>;

/// Filter: can this pod run on this node at all? `Err` carries the reasons users see
/// (`Insufficient cpu`, `Insufficient memory`), each counted in the unschedulable message.
pub trait FilterPlugin: Send + Sync {
    fn name(&self) -> &'static str;

    /// PreFilter: what the plugin needs to know of the whole cluster for this Pod, once per
    /// cycle (nothing unless a plugin says otherwise).
    fn pre_filter(&self, _pod: &Pod, _cluster: Cluster<'_>) -> CycleState {
        None
    }

    fn filter(&self, pod: &Pod, request: &Resources, node: &NodeInfo, state: &CycleState) -> Result<(), Vec<String>>;
}

/// Score: how good a feasible node is, from 0 to 100. `request` is the Pod's request as scoring
/// counts it (kube-scheduler's non-zero defaults), to set against `NodeInfo::score_requested`.
pub trait ScorePlugin: Send + Sync {
    fn name(&self) -> &'static str;
    fn score(&self, pod: &Pod, request: &Resources, node: &NodeInfo) -> i64;

    /// The scores of all feasible nodes at once, for plugins that compare nodes with each other
    /// or count Pods over the cluster (the framework's PreScore, Score and NormalizeScore in
    /// one): each node on its own unless a plugin says otherwise.
    fn score_all(&self, pod: &Pod, request: &Resources, nodes: &[&NodeInfo], _cluster: Cluster<'_>) -> Vec<i64> {
        nodes.iter().map(|node| self.score(pod, request, node)).collect()
    }
}

/// Why a Pod could not be placed, in the scheduler's usual words.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    #[error("0/{total} nodes are available: {}.", join_reasons(reasons))]
    Unschedulable { total: usize, reasons: BTreeMap<String, usize> },
    /// A PreFilter found the Pod unschedulable on every node (VolumeBinding's unbound claims).
    #[error("0/{total} nodes are available: {reason}.")]
    PreFilter { total: usize, reason: String },
    #[error("unknown scheduler plugin {0:?}")]
    UnknownPlugin(String),
}

fn join_reasons(reasons: &BTreeMap<String, usize>) -> String {
    if reasons.is_empty() {
        return "no nodes are registered".into();
    }
    // Sorted as strings, counts first, as kube-scheduler's FitError sorts them.
    let mut counted: Vec<String> = reasons.iter().map(|(r, n)| format!("{n} {r}")).collect();
    counted.sort();
    counted.join(", ")
}

/// Below this many nodes every node is filtered and scored (kube-scheduler's
/// minFeasibleNodesToFind).
const MIN_FEASIBLE_NODES_TO_FIND: usize = 100;
/// The least percentage of the nodes the adaptive default looks at (minFeasibleNodesPercentageToFind).
const MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND: usize = 5;

/// How many feasible nodes a cycle looks for before it stops filtering and scores them
/// (kube-scheduler's numFeasibleNodesToFind): `percentage` of `total`, or with 0 the adaptive
/// default, 50% less one point per 125 nodes and at least 5%; never fewer than 100.
pub fn feasible_nodes_to_find(percentage: u32, total: usize) -> usize {
    if total < MIN_FEASIBLE_NODES_TO_FIND || percentage >= 100 {
        return total;
    }
    let percentage = match percentage as usize {
        0 => 50usize.saturating_sub(total / 125).max(MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND),
        p => p,
    };
    (total * percentage / 100).max(MIN_FEASIBLE_NODES_TO_FIND)
}

/// An ordered set of plugins with score weights (a scheduler profile).
pub struct Profile {
    filters: Vec<Box<dyn FilterPlugin>>,
    scores: Vec<(Box<dyn ScorePlugin>, i64)>,
    /// percentageOfNodesToScore: 0 for the adaptive default.
    percentage_of_nodes_to_score: u32,
    /// Where the next cycle starts filtering (nextStartNodeIndex): after the last node the
    /// previous one looked at, so that every node gets its turn.
    next_start_node_index: AtomicUsize,
}

impl fmt::Debug for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Profile")
            .field("filters", &self.filters.iter().map(|p| p.name()).collect::<Vec<_>>())
            .field("scores", &self.scores.iter().map(|(p, w)| (p.name(), *w)).collect::<Vec<_>>())
            .finish()
    }
}

impl Profile {
    pub fn new(filters: Vec<Box<dyn FilterPlugin>>, scores: Vec<(Box<dyn ScorePlugin>, i64)>) -> Self {
        Profile { filters, scores, percentage_of_nodes_to_score: 0, next_start_node_index: AtomicUsize::new(0) }
    }

    /// The profile looking for `percentage` of the nodes before it scores (0: adaptive).
    pub fn with_percentage_of_nodes_to_score(mut self, percentage: u32) -> Self {
        self.percentage_of_nodes_to_score = percentage;
        self
    }

    /// The plugins' names and the score weights, in order (what a configuration file made).
    pub fn plugins(&self) -> (Vec<&'static str>, Vec<(&'static str, i64)>) {
        (self.filters.iter().map(|p| p.name()).collect(), self.scores.iter().map(|(p, w)| (p.name(), *w)).collect())
    }

    /// Picks the best feasible node of `nodes`: the highest weighted score, ties to the lowest
    /// name so the result is deterministic. A node's reasons are those of the first filter it
    /// fails, as kube-scheduler stops at it. Filtering starts where the previous cycle stopped
    /// and stops once [`feasible_nodes_to_find`] nodes passed; only those are scored. PreFilter
    /// and the plugins' cluster-wide counts still see every node.
    pub fn schedule(&self, pod: &Pod, cluster: Cluster<'_>) -> Result<String, ScheduleError> {
        self.place(pod, cluster, None)
    }

    /// [`Profile::schedule`] with a filter made for this Pod after its own PreFilter (what its
    /// volumes ask of the node), run after the profile's.
    pub fn schedule_with(
        &self,
        pod: &Pod,
        cluster: Cluster<'_>,
        extra: &dyn FilterPlugin,
    ) -> Result<String, ScheduleError> {
        self.place(pod, cluster, Some(extra))
    }

    fn place(
        &self,
        pod: &Pod,
        cluster: Cluster<'_>,
        extra: Option<&dyn FilterPlugin>,
    ) -> Result<String, ScheduleError> {
        let nodes = cluster.nodes;
        let (request, score_request) = (pod_requests(pod), pod_score_requests(pod));
        let states: Vec<CycleState> = self.filters.iter().map(|f| f.pre_filter(pod, cluster)).collect();
        let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
        let to_find = feasible_nodes_to_find(self.percentage_of_nodes_to_score, nodes.len());
        let start = self.next_start_node_index.load(Ordering::Relaxed) % nodes.len().max(1);
        let mut feasible: Vec<&NodeInfo> = Vec::with_capacity(to_find);
        let mut looked_at = 0;
        for node in nodes[start..].iter().chain(&nodes[..start]) {
            looked_at += 1;
            let mut checks = self.filters.iter().map(|f| &**f).zip(&states).chain(extra.map(|f| (f, &None)));
            match checks.find_map(|(f, state)| f.filter(pod, &request, node, state).err()) {
                Some(unfit) => unfit.into_iter().for_each(|reason| *reasons.entry(reason).or_default() += 1),
                None => feasible.push(node),
            }
            if feasible.len() >= to_find {
                break;
            }
        }
        self.next_start_node_index.store((start + looked_at) % nodes.len().max(1), Ordering::Relaxed);
        if feasible.is_empty() {
            return Err(ScheduleError::Unschedulable { total: nodes.len(), reasons });
        }
        let mut totals = vec![0i64; feasible.len()];
        for (plugin, weight) in &self.scores {
            for (total, score) in totals.iter_mut().zip(plugin.score_all(pod, &score_request, &feasible, cluster)) {
                *total += weight * score.clamp(0, 100);
            }
        }
        let best = feasible
            .iter()
            .zip(totals)
            .max_by(|(a, s), (b, t)| s.cmp(t).then_with(|| b.name().cmp(a.name())))
            .map(|(node, _)| node.name().to_owned());
        best.ok_or(ScheduleError::Unschedulable { total: nodes.len(), reasons })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn feasible_nodes_to_find_as_kube_scheduler() {
        for (percentage, total, expected) in [
            (0, 0, 0),
            (0, 99, 99),
            (0, 100, 100),
            (0, 500, 230),
            (0, 1000, 420),
            (0, 5000, 500),
            (0, 6000, 300),
            (0, 20_000, 1000),
            (1, 1000, 100),
            (10, 5000, 500),
            (50, 150, 100),
            (100, 5000, 5000),
            (150, 5000, 5000),
        ] {
            assert_eq!(feasible_nodes_to_find(percentage, total), expected, "{percentage}% of {total}");
        }
    }

    fn nodes(count: usize) -> Vec<NodeInfo> {
        (0..count)
            .map(|i| {
                NodeInfo::new(
                    serde_json::from_value(json!({
                        "metadata": {"name": format!("n{i:03}")},
                        "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
                            "conditions": [{"type": "Ready", "status": "True"}]}
                    }))
                    .unwrap(),
                )
            })
            .collect()
    }

    /// Equal nodes score alike, so each cycle picks the lowest name among the nodes it looked at:
    /// which node that is shows where the cycle started.
    #[test]
    fn cycles_start_where_the_previous_one_stopped() {
        let pod: Pod =
            serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}}))
                .unwrap();
        let (namespaces, pods) = (NamespaceLabels::new(), PodIndex::default());
        for (percentage, count, expected) in [
            (50, 200, vec!["n000", "n100", "n000"]),
            (0, 250, vec!["n000", "n120", "n000"]),
            (100, 200, vec!["n000", "n000"]),
            (10, 50, vec!["n000", "n000"]),
        ] {
            let profile = Profile::default().with_percentage_of_nodes_to_score(percentage);
            let nodes = nodes(count);
            let picked: Vec<String> = expected
                .iter()
                .map(|_| {
                    profile.schedule(&pod, Cluster { nodes: &nodes, namespaces: &namespaces, pods: &pods }).unwrap()
                })
                .collect();
            assert_eq!(picked, expected, "{percentage}% of {count} nodes");
        }
    }
}
