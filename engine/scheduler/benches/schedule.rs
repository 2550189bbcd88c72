//! The scheduler's time per Pod (`Profile::schedule`: filter, score, pick) on one snapshot,
//! with the plugins before NodeAffinity, NodePorts, InterPodAffinity and PodTopologySpread's own
//! constraints against all of them.
//!
//! `cargo bench -p gitplane-scheduler --bench schedule [-- --nodes 500 --pods-per-node 20 --rounds 5 --percentage 0]`
//!
//! `--percentage` is percentageOfNodesToScore (0: adaptive; 100: every node, as before it).
//!
//! The snapshot: `--nodes` nodes in 3 zones, each holding `--pods-per-node` Pods of 50
//! ReplicaSets (a tenth with a preferred anti-affinity term and a host port). Each round
//! schedules the same 200 Pods with each profile, alternating which goes first; the Pods are
//! plain replicas (what most Pods are) and, in a second row, replicas with node affinity,
//! required anti-affinity, a host port and a spread constraint, which only the full set reads.
//! Prints one Markdown table (medians over the rounds) on stdout.

use gitplane_scheduler::{Cluster, NamespaceLabels, NodeInfo, Profile, index_pods};
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::{Value, json};
use std::time::Instant;

/// The plugins of the previous default profile, with its weights.
const PREVIOUS: [(&str, i64); 8] = [
    ("NodeReady", 1),
    ("NodeSelector", 1),
    ("NodeResourcesFit", 1),
    ("TaintToleration", 3),
    ("PodTopologySpread", 2),
    ("LeastAllocated", 1),
    ("BalancedAllocation", 1),
    ("ImageLocality", 1),
];

const PODS: usize = 200;

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)?.parse().ok()).unwrap_or(default)
}

fn node(i: usize) -> NodeInfo {
    let name = format!("node-{i:04}");
    NodeInfo::new(
        serde_json::from_value::<Node>(json!({
            "metadata": {"name": name, "labels": {
                "kubernetes.io/hostname": name, "topology.kubernetes.io/zone": format!("zone-{}", i % 3),
                "disk": if i.is_multiple_of(2) { "ssd" } else { "hdd" }
            }},
            "status": {
                "allocatable": {"cpu": "64", "memory": "256Gi", "pods": "250"},
                "conditions": [{"type": "Ready", "status": "True"}],
                "images": [{"names": ["docker.io/library/nginx:1.27"], "sizeBytes": 70 << 20}]
            }
        }))
        .expect("a node"),
    )
}

fn replica(set: usize, name: &str, extra: Value) -> Pod {
    let mut pod = json!({
        "metadata": {"name": name, "namespace": "shop", "labels": {"app": format!("app-{set}")},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": format!("rs-{set}"),
                "uid": format!("rs-{set}"), "controller": true}]},
        "spec": {"containers": [{"name": "c", "image": "nginx:1.27",
            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}
    });
    for (key, value) in extra.as_object().into_iter().flatten() {
        pod["spec"][key] = value.clone();
    }
    serde_json::from_value(pod).expect("a pod")
}

fn placed(set: usize, name: &str) -> Pod {
    if !set.is_multiple_of(10) {
        return replica(set, name, json!({}));
    }
    replica(
        set,
        name,
        json!({
            "containers": [{"name": "c", "image": "nginx:1.27", "ports": [{"containerPort": 80, "hostPort": 9000 + set}],
                "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}],
            "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 10,
                "podAffinityTerm": {"labelSelector": {"matchLabels": {"app": format!("app-{set}")}},
                    "topologyKey": "kubernetes.io/hostname"}}]}}
        }),
    )
}

fn constrained(set: usize, name: &str) -> Pod {
    let app = json!({"matchLabels": {"app": format!("app-{set}")}});
    replica(
        set,
        name,
        json!({
            "containers": [{"name": "c", "image": "nginx:1.27", "ports": [{"containerPort": 80, "hostPort": 8080}],
                "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}],
            "affinity": {
                "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd", "hdd"]}]}]}},
                "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": {"app": "singleton"}}, "topologyKey": "kubernetes.io/hostname"}]}
            },
            "topologySpreadConstraints": [{"maxSkew": 100, "topologyKey": "topology.kubernetes.io/zone",
                "whenUnsatisfiable": "DoNotSchedule", "labelSelector": app}]
        }),
    )
}

/// Microseconds per Pod for scheduling `pods` on `nodes` with `profile`.
fn per_pod(profile: &Profile, pods: &[Pod], cluster: Cluster<'_>) -> f64 {
    let started = Instant::now();
    for pod in pods {
        std::hint::black_box(profile.schedule(pod, cluster).expect("the pod fits"));
    }
    started.elapsed().as_secs_f64() * 1e6 / pods.len() as f64
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let (node_count, per_node, rounds) = (arg("--nodes", 500), arg("--pods-per-node", 20), arg("--rounds", 5));
    let percentage = arg("--percentage", 0) as u32;
    let mut nodes: Vec<NodeInfo> = (0..node_count).map(node).collect();
    for (i, node) in nodes.iter_mut().enumerate() {
        for j in 0..per_node {
            let set = (i * per_node + j) % 50;
            node.add_pod(&placed(set, &format!("p-{i}-{j}")));
        }
    }
    let namespaces: NamespaceLabels = [("shop".to_owned(), Default::default())].into();
    let placed_pods = index_pods(&nodes);
    let cluster = Cluster { nodes: &nodes, namespaces: &namespaces, pods: &placed_pods };
    let previous = Profile::from_names(&PREVIOUS).expect("registered").with_percentage_of_nodes_to_score(percentage);
    let all = Profile::default().with_percentage_of_nodes_to_score(percentage);
    let workloads = [
        ("plain replicas", (0..PODS).map(|i| replica(i % 50 + 1, &format!("new-{i}"), json!({}))).collect::<Vec<_>>()),
        (
            "replicas with affinity, ports, spread",
            (0..PODS).map(|i| constrained(i % 50 + 1, &format!("new-{i}"))).collect(),
        ),
    ];
    println!(
        "| {node_count} nodes x {per_node} Pods, per Pod | previous plugins (µs) | all plugins (µs) | all / previous |"
    );
    println!("|---|--:|--:|--:|");
    for (name, pods) in &workloads {
        let (mut before, mut after) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            if round.is_multiple_of(2) {
                before.push(per_pod(&previous, pods, cluster));
                after.push(per_pod(&all, pods, cluster));
            } else {
                after.push(per_pod(&all, pods, cluster));
                before.push(per_pod(&previous, pods, cluster));
            }
            eprintln!("{name}, round {round}: previous {:.0} µs, all {:.0} µs", before[round], after[round]);
        }
        let (before, after) = (median(before), median(after));
        println!("| {name} | {before:.0} | {after:.0} | {:.2}× |", after / before);
    }
}
