//! What a Pod asks for and what a Node offers, in milli-CPU and bytes.

use gitplane_api::quantity::{parse_milli, parse_units};
use k8s_openapi::{
    api::core::v1::{Container, Node, Pod},
    apimachinery::pkg::api::resource::Quantity,
};
use std::collections::BTreeMap;

/// CPU in millicores, memory in bytes, and a pod count.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Resources {
    pub cpu_milli: i128,
    pub memory: i128,
    pub pods: i128,
}

impl Resources {
    pub fn add(&mut self, other: Resources) {
        self.cpu_milli += other.cpu_milli;
        self.memory += other.memory;
        self.pods += other.pods;
    }
}

fn amount(map: Option<&BTreeMap<String, Quantity>>, name: &str, parse: fn(&str) -> Option<i128>) -> Option<i128> {
    map?.get(name).and_then(|q| parse(&q.0))
}

/// What scoring counts for a container that requests no CPU or no memory: kube-scheduler's
/// `DefaultMilliCPURequest` and `DefaultMemoryRequest`, so that Pods without requests still
/// spread over the nodes instead of all scoring zero.
const NON_ZERO_CPU_MILLI: i128 = 100;
const NON_ZERO_MEMORY: i128 = 200 << 20;

fn container_requests(c: &Container) -> Resources {
    let res = c.resources.as_ref();
    let requests = res.and_then(|r| r.requests.as_ref());
    let limits = res.and_then(|r| r.limits.as_ref());
    // A container with limits but no requests requests its limits, as the API server defaults.
    let get = |name, parse| amount(requests, name, parse).or_else(|| amount(limits, name, parse)).unwrap_or(0);
    Resources { cpu_milli: get("cpu", parse_milli), memory: get("memory", parse_units), pods: 0 }
}

/// The effective request of a Pod: the sum of its containers, or the largest init container if
/// that is more, plus one pod slot. What fits where is decided on this.
pub fn pod_requests(pod: &Pod) -> Resources {
    requests(pod, |c| c)
}

/// The request scoring counts (kube-scheduler's non-zero requests): as [`pod_requests`], with a
/// container's zero CPU or memory counted as [`NON_ZERO_CPU_MILLI`] / [`NON_ZERO_MEMORY`].
pub fn pod_score_requests(pod: &Pod) -> Resources {
    requests(pod, |c| Resources {
        cpu_milli: if c.cpu_milli == 0 { NON_ZERO_CPU_MILLI } else { c.cpu_milli },
        memory: if c.memory == 0 { NON_ZERO_MEMORY } else { c.memory },
        pods: c.pods,
    })
}

fn requests(pod: &Pod, of_container: impl Fn(Resources) -> Resources) -> Resources {
    let Some(spec) = pod.spec.as_ref() else { return Resources { pods: 1, ..Default::default() } };
    let mut total = Resources::default();
    for c in &spec.containers {
        total.add(of_container(container_requests(c)));
    }
    for c in spec.init_containers.iter().flatten() {
        let init = container_requests(c);
        total.cpu_milli = total.cpu_milli.max(init.cpu_milli);
        total.memory = total.memory.max(init.memory);
    }
    total.pods = 1;
    total
}

/// What a Node can hold: its allocatable, or its capacity when allocatable is absent.
pub fn node_allocatable(node: &Node) -> Resources {
    let status = node.status.as_ref();
    let map = status.and_then(|s| s.allocatable.as_ref()).or_else(|| status.and_then(|s| s.capacity.as_ref()));
    Resources {
        cpu_milli: amount(map, "cpu", parse_milli).unwrap_or(0),
        memory: amount(map, "memory", parse_units).unwrap_or(0),
        pods: amount(map, "pods", parse_units).unwrap_or(110),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn requests_default_to_limits_and_include_init_containers() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "spec": {
                "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "2"}}}],
                "containers": [
                    {"name": "a", "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}},
                    {"name": "b", "resources": {"limits": {"cpu": "200m", "memory": "1Gi"}}},
                ]
            }
        }))
        .unwrap();
        assert_eq!(pod_requests(&pod), Resources { cpu_milli: 2000, memory: (64 << 20) + (1 << 30), pods: 1 });
    }
}
