//! Random snapshots for the tests that hold the indexed plugins to a reference that reads every
//! placed Pod: nodes in zones and racks (some without), Pods with random labels, inter-Pod
//! affinity terms and spread constraints, then Pods removed, nodes relabelled and deleted.

use crate::snapshot::Snapshot;
use gitplane_store::informer::Cache;
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

/// A small deterministic generator (64-bit LCG), so a failing case is one seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407))
    }

    pub fn below(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 33) % n as u64) as usize
    }

    pub fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

pub const KEYS: [&str; 3] = ["kubernetes.io/hostname", "topology.kubernetes.io/zone", "rack"];
const NAMESPACES: [&str; 2] = ["shop", "blog"];

fn node(rng: &mut Rng, name: &str) -> Value {
    let mut labels = json!({"kubernetes.io/hostname": name});
    if rng.chance(80) {
        labels["topology.kubernetes.io/zone"] = json!(*rng.pick(&["a", "b", "c"]));
    }
    if rng.chance(50) {
        labels["rack"] = json!(*rng.pick(&["r1", "r2"]));
    }
    let taints = if rng.chance(20) { json!([{"key": "k", "effect": "NoSchedule"}]) } else { json!([]) };
    json!({"metadata": {"name": name, "labels": labels}, "spec": {"taints": taints},
        "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}]}})
}

fn labels(rng: &mut Rng) -> Value {
    let mut labels = json!({});
    if rng.chance(90) {
        labels["app"] = json!(*rng.pick(&["web", "db", "cache"]));
    }
    if rng.chance(50) {
        labels["tier"] = json!(*rng.pick(&["front", "back"]));
    }
    labels
}

fn selector(rng: &mut Rng) -> Value {
    match rng.below(5) {
        0 => json!({"matchLabels": {"app": *rng.pick(&["web", "db", "cache"])}}),
        1 => json!({"matchExpressions": [{"key": "app", "operator": "In", "values": ["web", "db"]}]}),
        2 => json!({"matchLabels": {"tier": *rng.pick(&["front", "back"])}}),
        3 => json!({"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}),
        _ => json!({}),
    }
}

fn term(rng: &mut Rng) -> Value {
    let mut term = json!({"topologyKey": *rng.pick(&KEYS)});
    if rng.chance(90) {
        term["labelSelector"] = selector(rng);
    }
    match rng.below(5) {
        0 => term["namespaces"] = json!([*rng.pick(&NAMESPACES)]),
        1 => term["namespaceSelector"] = json!({"matchLabels": {"team": *rng.pick(&["a", "b"])}}),
        2 => term["namespaceSelector"] = json!({}),
        _ => {}
    }
    if rng.chance(15) {
        term["matchLabelKeys"] = json!(["tier"]);
    }
    term
}

fn terms(rng: &mut Rng, weighted: bool) -> Value {
    let count = rng.below(3);
    let terms = (0..count).map(|_| match weighted {
        true => json!({"weight": 1 + rng.below(100), "podAffinityTerm": term(rng)}),
        false => term(rng),
    });
    Value::Array(terms.collect())
}

/// A Pod with random labels and, as `affinity` (percent) says, random inter-Pod affinity; the
/// incoming ones (`spread`) also get spread constraints, a nodeSelector or a node affinity.
pub fn pod(rng: &mut Rng, name: &str, affinity: usize, spread: bool) -> Pod {
    let mut pod = json!({"metadata": {"name": name, "namespace": *rng.pick(&NAMESPACES), "labels": labels(rng)},
        "spec": {"containers": [{"name": "c"}]}});
    if rng.chance(affinity) {
        pod["spec"]["affinity"] = json!({
            "podAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": if rng.chance(30) { terms(rng, false) } else { json!([]) },
                "preferredDuringSchedulingIgnoredDuringExecution": terms(rng, true)},
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": terms(rng, false),
                "preferredDuringSchedulingIgnoredDuringExecution": terms(rng, true)}});
    }
    if spread {
        let constraints = (0..rng.below(3)).map(|_| {
            let mut c = json!({"maxSkew": 1 + rng.below(2), "topologyKey": *rng.pick(&KEYS),
                "whenUnsatisfiable": *rng.pick(&["DoNotSchedule", "ScheduleAnyway"]), "labelSelector": selector(rng)});
            if rng.chance(20) {
                c["minDomains"] = json!(3);
            }
            if rng.chance(30) {
                c["nodeAffinityPolicy"] = json!("Ignore");
            }
            if rng.chance(30) {
                c["nodeTaintsPolicy"] = json!("Honor");
            }
            if rng.chance(20) {
                c["matchLabelKeys"] = json!(["tier"]);
            }
            c
        });
        pod["spec"]["topologySpreadConstraints"] = Value::Array(constraints.collect());
        if rng.chance(20) {
            pod["spec"]["nodeSelector"] = json!({"rack": "r1"});
        }
    }
    serde_json::from_value(pod).expect("a pod")
}

/// What a test looks at after each step of a case.
pub type Check<'a> = dyn FnMut(&str, &Snapshot) + 'a;

/// `nodes` nodes and `pods` Pods placed at random, then: half the Pods removed, a node
/// relabelled, a node deleted; `check` runs after placing and after each of those steps.
pub fn random_snapshots(seed: u64, nodes: usize, pods: usize, check: &mut Check<'_>) {
    let mut rng = Rng::new(seed);
    let mut snapshot = Snapshot::default();
    let names: Vec<String> = (0..nodes).map(|i| format!("n{i:02}")).collect();
    for name in &names {
        snapshot.node_changed(name, Some(&node(&mut rng, name)), &Cache::default());
    }
    for (team, namespace) in ["a", "b"].iter().zip(NAMESPACES) {
        let value = json!({"metadata": {"name": namespace, "labels": {"team": team}}});
        snapshot.namespace_changed(namespace, Some(&value));
    }
    let mut placed = Vec::new();
    for i in 0..pods {
        let pod = pod(&mut rng, &format!("p{i}"), 40, false);
        let id = (pod.metadata.namespace.clone().unwrap_or_default(), format!("p{i}"));
        snapshot.count(id.clone(), rng.pick(&names).clone(), pod);
        placed.push(id);
    }
    check("placed", &snapshot);
    for id in placed.iter().filter(|_| rng.chance(50)) {
        snapshot.pod_changed(id, None, None);
    }
    check("half removed", &snapshot);
    let relabelled = rng.pick(&names).clone();
    snapshot.node_changed(&relabelled, Some(&node(&mut rng, &relabelled)), &Cache::default());
    check("a node relabelled", &snapshot);
    let deleted = rng.pick(&names).clone();
    snapshot.node_changed(&deleted, None, &Cache::default());
    check("a node deleted", &snapshot);
}
