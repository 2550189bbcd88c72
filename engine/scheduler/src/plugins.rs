//! The built-in plugins and the registry that names them.

use crate::framework::{FilterPlugin, NodeInfo, Profile, ScheduleError, ScorePlugin};
use crate::resources::Resources;
use k8s_openapi::api::core::v1::Pod;

/// Only nodes whose Ready condition is True and that are not cordoned.
pub struct NodeReady;

impl FilterPlugin for NodeReady {
    fn name(&self) -> &'static str {
        "NodeReady"
    }

    fn filter(&self, _: &Pod, _: &Resources, node: &NodeInfo) -> Result<(), String> {
        if node.node.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false) {
            return Err("node(s) were unschedulable".into());
        }
        let ready = node
            .node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
            .is_some_and(|c| c.status == "True");
        if ready { Ok(()) } else { Err("node(s) were not ready".into()) }
    }
}

/// `spec.nodeSelector` must match the node's labels.
pub struct NodeSelector;

impl FilterPlugin for NodeSelector {
    fn name(&self) -> &'static str {
        "NodeSelector"
    }

    fn filter(&self, pod: &Pod, _: &Resources, node: &NodeInfo) -> Result<(), String> {
        let Some(selector) = pod.spec.as_ref().and_then(|s| s.node_selector.as_ref()) else { return Ok(()) };
        let labels = node.node.metadata.labels.as_ref();
        if selector.iter().all(|(k, v)| labels.and_then(|l| l.get(k)) == Some(v)) {
            Ok(())
        } else {
            Err("node(s) didn't match Pod's node affinity/selector".into())
        }
    }
}

/// The node's free CPU, memory and pod slots must cover the pod's requests.
pub struct NodeResourcesFit;

impl FilterPlugin for NodeResourcesFit {
    fn name(&self) -> &'static str {
        "NodeResourcesFit"
    }

    fn filter(&self, _: &Pod, request: &Resources, node: &NodeInfo) -> Result<(), String> {
        let (a, r) = (&node.allocatable, &node.requested);
        if r.pods + request.pods > a.pods {
            Err("Too many pods".into())
        } else if r.cpu_milli + request.cpu_milli > a.cpu_milli {
            Err("Insufficient cpu".into())
        } else if r.memory + request.memory > a.memory {
            Err("Insufficient memory".into())
        } else {
            Ok(())
        }
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

/// Plugins by name, as the profile configuration refers to them.
pub enum Plugin {
    Filter(Box<dyn FilterPlugin>),
    Score(Box<dyn ScorePlugin>),
}

pub fn registry(name: &str) -> Option<Plugin> {
    Some(match name {
        "NodeReady" => Plugin::Filter(Box::new(NodeReady)),
        "NodeSelector" => Plugin::Filter(Box::new(NodeSelector)),
        "NodeResourcesFit" => Plugin::Filter(Box::new(NodeResourcesFit)),
        "LeastAllocated" => Plugin::Score(Box::new(LeastAllocated)),
        "BalancedAllocation" => Plugin::Score(Box::new(BalancedAllocation)),
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
            }
        }
        Ok(Profile::new(filters, scores))
    }
}

impl Default for Profile {
    fn default() -> Self {
        Profile::from_names(&[
            ("NodeReady", 1),
            ("NodeSelector", 1),
            ("NodeResourcesFit", 1),
            ("LeastAllocated", 1),
            ("BalancedAllocation", 1),
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

    #[test]
    fn unknown_plugins_are_named() {
        let err = Profile::from_names(&[("Nope", 1)]).unwrap_err();
        assert_eq!(err.to_string(), "unknown scheduler plugin \"Nope\"");
    }
}
