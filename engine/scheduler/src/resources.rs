//! What a Pod asks for and what a Node offers: milli-CPU, bytes of memory and of ephemeral
//! storage, pod slots, and the counts of extended resources (`nvidia.com/gpu`).

use gitplane_api::quantity::{parse_milli, parse_units};
use k8s_openapi::{
    api::core::v1::{Container, Node, Pod},
    apimachinery::pkg::api::resource::Quantity,
};
use std::collections::BTreeMap;

/// CPU in millicores, memory and ephemeral storage in bytes, a pod count, and extended
/// resources (kube-scheduler's scalar resources) by name, in units.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resources {
    pub cpu_milli: i128,
    pub memory: i128,
    pub ephemeral_storage: i128,
    pub pods: i128,
    pub extended: BTreeMap<String, i128>,
}

impl Resources {
    pub fn add(&mut self, other: &Resources) {
        self.cpu_milli += other.cpu_milli;
        self.memory += other.memory;
        self.ephemeral_storage += other.ephemeral_storage;
        self.pods += other.pods;
        for (name, amount) in &other.extended {
            *self.extended.entry(name.clone()).or_default() += amount;
        }
    }

    /// Takes back what [`Resources::add`] added.
    pub fn sub(&mut self, other: &Resources) {
        self.cpu_milli -= other.cpu_milli;
        self.memory -= other.memory;
        self.ephemeral_storage -= other.ephemeral_storage;
        self.pods -= other.pods;
        for (name, amount) in &other.extended {
            if let Some(mine) = self.extended.get_mut(name) {
                *mine -= amount;
                if *mine == 0 {
                    self.extended.remove(name);
                }
            }
        }
    }

    /// The larger of each amount (an init container's request against the Pod's).
    fn max(&mut self, other: &Resources) {
        self.cpu_milli = self.cpu_milli.max(other.cpu_milli);
        self.memory = self.memory.max(other.memory);
        self.ephemeral_storage = self.ephemeral_storage.max(other.ephemeral_storage);
        for (name, amount) in &other.extended {
            let mine = self.extended.entry(name.clone()).or_default();
            *mine = (*mine).max(*amount);
        }
    }
}

/// Resources a node has that are not extended ones (hugepages are not offered by gitplane's
/// nodes, so a request for them finds none, as an extended resource no node advertises).
fn is_extended(name: &str) -> bool {
    !matches!(name, "cpu" | "memory" | "ephemeral-storage" | "pods" | "storage")
}

fn extended(map: Option<&BTreeMap<String, Quantity>>) -> BTreeMap<String, i128> {
    map.into_iter()
        .flatten()
        .filter(|(name, _)| is_extended(name))
        .filter_map(|(name, q)| Some((name.clone(), parse_units(&q.0)?)))
        .collect()
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
    let mut named = extended(limits);
    named.extend(extended(requests));
    Resources {
        cpu_milli: get("cpu", parse_milli),
        memory: get("memory", parse_units),
        ephemeral_storage: get("ephemeral-storage", parse_units),
        pods: 0,
        extended: named,
    }
}

/// A sidecar: an init container that keeps running beside the Pod's containers.
pub fn is_sidecar(container: &Container) -> bool {
    container.restart_policy.as_deref() == Some("Always")
}

/// The effective request of a Pod, as kube-scheduler's `PodRequests`: its containers and its
/// sidecars together, or what an init container needs beside the sidecars started before it if
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
        ..c
    })
}

fn requests(pod: &Pod, of_container: impl Fn(Resources) -> Resources) -> Resources {
    let Some(spec) = pod.spec.as_ref() else { return Resources { pods: 1, ..Default::default() } };
    let mut total = Resources::default();
    for c in &spec.containers {
        total.add(&of_container(container_requests(c)));
    }
    // Sidecars run beside everything that starts after them.
    let mut sidecars = Resources::default();
    let mut init_peak = Resources::default();
    for c in spec.init_containers.iter().flatten() {
        let request = of_container(container_requests(c));
        if is_sidecar(c) {
            sidecars.add(&request);
            init_peak.max(&sidecars);
        } else {
            let mut during = sidecars.clone();
            during.add(&request);
            init_peak.max(&during);
        }
    }
    total.add(&sidecars);
    total.max(&init_peak);
    // Pod-level requests replace what the containers add up to, resource by resource
    // (kube-scheduler's `PodRequests` with PodLevelResources; cpu and memory only).
    let pod_level = spec.resources.as_ref().and_then(|r| r.requests.as_ref());
    if let Some(cpu) = amount(pod_level, "cpu", parse_milli) {
        total.cpu_milli = cpu;
    }
    if let Some(memory) = amount(pod_level, "memory", parse_units) {
        total.memory = memory;
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
        ephemeral_storage: amount(map, "ephemeral-storage", parse_units).unwrap_or(0),
        pods: amount(map, "pods", parse_units).unwrap_or(110),
        extended: extended(map),
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
        let expected = Resources { cpu_milli: 2000, memory: (64 << 20) + (1 << 30), pods: 1, ..Default::default() };
        assert_eq!(pod_requests(&pod), expected);
    }

    /// kube-scheduler's `PodRequests` with sidecars: they add to the containers, and an init
    /// container after a sidecar runs beside it.
    #[test]
    fn sidecars_count_beside_containers_and_later_init_containers() {
        let container = |name: &str, cpu: &str, sidecar: bool| {
            let mut c = json!({"name": name, "resources": {"requests": {"cpu": cpu}}});
            if sidecar {
                c["restartPolicy"] = json!("Always");
            }
            c
        };
        for (init, containers, cpu) in [
            (vec![container("s", "100m", true)], vec![container("a", "200m", false)], 300),
            (vec![container("s", "500m", true), container("i", "1", false)], vec![container("a", "200m", false)], 1500),
            (vec![container("i", "1", false), container("s", "500m", true)], vec![container("a", "200m", false)], 1000),
            (vec![container("i", "100m", false)], vec![container("a", "200m", false)], 200),
        ] {
            let pod: Pod =
                serde_json::from_value(json!({"spec": {"initContainers": init, "containers": containers}})).unwrap();
            assert_eq!(pod_requests(&pod).cpu_milli, cpu, "{:?}", pod.spec);
        }
    }

    /// Pod-level requests replace the containers' sum of the same resource, for fitting and
    /// for scoring alike; a resource the Pod level leaves out is the containers'.
    #[test]
    fn pod_level_requests_replace_the_containers_sum() {
        let containers = json!([
            {"name": "a", "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}},
            {"name": "b"},
        ]);
        for (pod_level, fit, score) in [
            (json!(null), (100, 64 << 20), (200, (64 << 20) + NON_ZERO_MEMORY)),
            (json!({"requests": {"cpu": "1"}}), (1000, 64 << 20), (1000, (64 << 20) + NON_ZERO_MEMORY)),
            (json!({"requests": {"cpu": "500m", "memory": "1Gi"}}), (500, 1 << 30), (500, 1 << 30)),
        ] {
            let pod: Pod =
                serde_json::from_value(json!({"spec": {"resources": pod_level, "containers": containers}})).unwrap();
            let (requests, scored) = (pod_requests(&pod), pod_score_requests(&pod));
            assert_eq!((requests.cpu_milli, requests.memory), fit, "{pod_level}");
            assert_eq!((scored.cpu_milli, scored.memory), score, "{pod_level}");
        }
    }

    #[test]
    fn ephemeral_storage_and_extended_resources() {
        let pod: Pod = serde_json::from_value(json!({"spec": {"containers": [
            {"name": "a", "resources": {
                "requests": {"ephemeral-storage": "1Gi", "nvidia.com/gpu": "1"},
                "limits": {"nvidia.com/gpu": "1", "example.com/foo": "2"}
            }},
            {"name": "b", "resources": {"limits": {"example.com/foo": "1"}}},
        ]}}))
        .unwrap();
        let requested = pod_requests(&pod);
        assert_eq!(requested.ephemeral_storage, 1 << 30);
        assert_eq!(requested.extended, [("example.com/foo".into(), 3), ("nvidia.com/gpu".into(), 1)].into());
        let node: Node = serde_json::from_value(json!({"status": {"allocatable": {
            "cpu": "2", "memory": "1Gi", "ephemeral-storage": "10Gi", "pods": "110", "nvidia.com/gpu": "1"
        }}}))
        .unwrap();
        let offered = node_allocatable(&node);
        assert_eq!((offered.ephemeral_storage, offered.extended), (10 << 30, [("nvidia.com/gpu".into(), 1)].into()));
    }
}
