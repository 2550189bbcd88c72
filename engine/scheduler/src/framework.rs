//! The pure scheduling core: filter, then score, then pick. No I/O.

use crate::resources::{Resources, node_allocatable, pod_requests, pod_score_requests};
use k8s_openapi::api::core::v1::{Node, Pod};
use std::{collections::BTreeMap, fmt};

/// A node as the scheduler sees it: the Node and what its bound Pods already request.
#[derive(Clone, Debug)]
pub struct NodeInfo {
    pub node: Node,
    pub allocatable: Resources,
    /// What its Pods request (what fits is decided on this).
    pub requested: Resources,
    /// The same with kube-scheduler's non-zero defaults (what scoring counts).
    pub score_requested: Resources,
}

impl NodeInfo {
    pub fn new(node: Node) -> Self {
        let allocatable = node_allocatable(&node);
        NodeInfo { node, allocatable, requested: Resources::default(), score_requested: Resources::default() }
    }

    pub fn name(&self) -> &str {
        self.node.metadata.name.as_deref().unwrap_or("")
    }

    /// Accounts for a Pod bound (or assumed bound) to this node.
    pub fn add_pod(&mut self, pod: &Pod) {
        self.requested.add(pod_requests(pod));
        self.score_requested.add(pod_score_requests(pod));
    }
}

/// Filter: can this pod run on this node at all? `Err` carries the reason users see
/// (`Insufficient cpu`), counted per reason in the unschedulable message.
pub trait FilterPlugin: Send + Sync {
    fn name(&self) -> &'static str;
    fn filter(&self, pod: &Pod, request: &Resources, node: &NodeInfo) -> Result<(), String>;
}

/// Score: how good a feasible node is, from 0 to 100. `request` is the Pod's request as scoring
/// counts it (kube-scheduler's non-zero defaults), to set against `NodeInfo::score_requested`.
pub trait ScorePlugin: Send + Sync {
    fn name(&self) -> &'static str;
    fn score(&self, pod: &Pod, request: &Resources, node: &NodeInfo) -> i64;
}

/// Why a Pod could not be placed, in the scheduler's usual words.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    #[error("0/{total} nodes are available: {}.", join_reasons(reasons))]
    Unschedulable { total: usize, reasons: BTreeMap<String, usize> },
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
        let (request, score_request) = (pod_requests(pod), pod_score_requests(pod));
        let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
        let mut best: Option<(i64, &str)> = None;
        for node in nodes {
            if let Some(reason) = self.filters.iter().find_map(|f| f.filter(pod, &request, node).err()) {
                *reasons.entry(reason).or_default() += 1;
                continue;
            }
            let score: i64 =
                self.scores.iter().map(|(p, w)| w * p.score(pod, &score_request, node).clamp(0, 100)).sum();
            let better = match best {
                None => true,
                Some((s, name)) => score > s || (score == s && node.name() < name),
            };
            if better {
                best = Some((score, node.name()));
            }
        }
        best.map(|(_, name)| name.to_owned()).ok_or(ScheduleError::Unschedulable { total: nodes.len(), reasons })
    }
}
