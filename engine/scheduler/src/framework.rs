//! The pure scheduling core: filter, then score, then pick. No I/O.

use crate::resources::{Resources, node_allocatable, pod_requests, pod_score_requests};
use k8s_openapi::api::core::v1::{Node, Pod};
use std::{
    collections::{BTreeMap, HashMap},
    fmt,
};

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
}

impl NodeInfo {
    pub fn new(node: Node) -> Self {
        let allocatable = node_allocatable(&node);
        NodeInfo {
            node,
            allocatable,
            requested: Resources::default(),
            score_requested: Resources::default(),
            by_controller: HashMap::new(),
        }
    }

    pub fn name(&self) -> &str {
        self.node.metadata.name.as_deref().unwrap_or("")
    }

    /// The value of one of the node's labels.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.node.metadata.labels.as_ref()?.get(key).map(String::as_str)
    }

    /// Accounts for a Pod bound (or assumed bound) to this node.
    pub fn add_pod(&mut self, pod: &Pod) {
        self.requested.add(pod_requests(pod));
        self.score_requested.add(pod_score_requests(pod));
        if let Some(uid) = controller_uid(pod) {
            *self.by_controller.entry(uid.to_owned()).or_default() += 1;
        }
    }
}

/// The uid of the Pod's controller (its ownerReference with `controller: true`).
pub fn controller_uid(pod: &Pod) -> Option<&str> {
    let owners = pod.metadata.owner_references.as_deref()?;
    owners.iter().find(|o| o.controller == Some(true)).map(|o| o.uid.as_str())
}

/// Filter: can this pod run on this node at all? `Err` carries the reasons users see
/// (`Insufficient cpu`, `Insufficient memory`), each counted in the unschedulable message.
pub trait FilterPlugin: Send + Sync {
    fn name(&self) -> &'static str;
    fn filter(&self, pod: &Pod, request: &Resources, node: &NodeInfo) -> Result<(), Vec<String>>;
}

/// Score: how good a feasible node is, from 0 to 100. `request` is the Pod's request as scoring
/// counts it (kube-scheduler's non-zero defaults), to set against `NodeInfo::score_requested`.
pub trait ScorePlugin: Send + Sync {
    fn name(&self) -> &'static str;
    fn score(&self, pod: &Pod, request: &Resources, node: &NodeInfo) -> i64;

    /// The scores of all feasible nodes at once, for plugins that compare nodes with each other
    /// (the framework's PreScore, Score and NormalizeScore in one): each node on its own unless
    /// a plugin says otherwise.
    fn score_all(&self, pod: &Pod, request: &Resources, nodes: &[&NodeInfo]) -> Vec<i64> {
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
    reasons.iter().map(|(r, n)| format!("{n} {r}")).collect::<Vec<_>>().join(", ")
}

/// An ordered set of plugins with score weights (a scheduler profile).
pub struct Profile {
    filters: Vec<Box<dyn FilterPlugin>>,
    scores: Vec<(Box<dyn ScorePlugin>, i64)>,
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
        Profile { filters, scores }
    }

    /// Picks the best feasible node: the highest weighted score, ties to the lowest name so the
    /// result is deterministic.
    pub fn schedule(&self, pod: &Pod, nodes: &[NodeInfo]) -> Result<String, ScheduleError> {
        self.place(pod, nodes, None)
    }

    /// [`Profile::schedule`] with a filter made for this Pod after its PreFilter (what its
    /// volumes ask of the node), run after the profile's own.
    pub fn schedule_with(
        &self,
        pod: &Pod,
        nodes: &[NodeInfo],
        extra: &dyn FilterPlugin,
    ) -> Result<String, ScheduleError> {
        self.place(pod, nodes, Some(extra))
    }

    fn place(&self, pod: &Pod, nodes: &[NodeInfo], extra: Option<&dyn FilterPlugin>) -> Result<String, ScheduleError> {
        let (request, score_request) = (pod_requests(pod), pod_score_requests(pod));
        let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
        let mut feasible: Vec<&NodeInfo> = Vec::with_capacity(nodes.len());
        let filters = self.filters.iter().map(|f| &**f).chain(extra);
        for node in nodes {
            match filters.clone().find_map(|f| f.filter(pod, &request, node).err()) {
                Some(unfit) => unfit.into_iter().for_each(|reason| *reasons.entry(reason).or_default() += 1),
                None => feasible.push(node),
            }
        }
        if feasible.is_empty() {
            return Err(ScheduleError::Unschedulable { total: nodes.len(), reasons });
        }
        let mut totals = vec![0i64; feasible.len()];
        for (plugin, weight) in &self.scores {
            for (total, score) in totals.iter_mut().zip(plugin.score_all(pod, &score_request, &feasible)) {
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
