//! NetworkPolicy benchmark: prints one Markdown table.
//!
//! `cargo bench -p gitplane-nodeagent --bench policy` (root; well under a minute). Every nft
//! measurement runs in a fresh network namespace this process makes and removes. Options:
//! `--pods N` (1000, over 3 nodes, this node holding a third), `--policies M` (1000),
//! `--changes K` (100 Pod starts, p50 / p99); `--packet-rate SECONDS` measures traffic with
//! and without the table instead (`policy/traffic.rs`; needs `hey` and `wrk`).
//!
//! The world: 10 namespaces, Pods labelled `app` (100 values) and `tier` (5), each policy
//! selecting one `app` in its namespace and allowing from a `tier` of its namespace, from one
//! `tier` in namespaces of one team (both selectors), and on port 80, 8000-8100 and the named
//! port `http`; every tenth one also limits egress to DNS and its namespace.
//!
//! Rows: the pure core (everything fed in, every local Pod's allows computed), the full sync
//! (core, elements and text, then `nft -f` in the kernel), and a Pod start: one Pod fed into
//! the Policier and its elements programmed (`Policier::sync`, a netlink element update), for a
//! Pod of this node that policies select and for a Pod of another node that is their peer,
//! with the part spent planning (the rest is the kernel's transaction); then the same peer Pods
//! going.

#[path = "policy/traffic.rs"]
mod traffic;

use gitplane_nodeagent::network::policy::{CompiledPolicy, Plan, Policier, PolicyPod, SyncReport, desired::TCP};
use gitplane_testkit::topology::{Topology, in_netns};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use serde_json::json;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

const NODE: &str = "node-a";

struct Options {
    pods: usize,
    policies: usize,
    changes: usize,
    packet_rate: Option<u64>,
}

fn options() -> Options {
    let mut o = Options { pods: 1000, policies: 1000, changes: 100, packet_rate: None };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut num = |name: &str| -> usize {
            args.next().and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{name} takes a number"))
        };
        match a.as_str() {
            "--pods" => o.pods = num("--pods"),
            "--policies" => o.policies = num("--policies"),
            "--changes" => o.changes = num("--changes"),
            "--packet-rate" => o.packet_rate = Some(num("--packet-rate") as u64),
            _ => {}
        }
    }
    o
}

fn pod(i: usize) -> PolicyPod {
    PolicyPod {
        namespace: format!("ns-{}", i % 10),
        name: format!("pod-{i}"),
        labels: [("app".to_string(), format!("app-{}", i % 100)), ("tier".to_string(), format!("t{}", i % 5))].into(),
        node: ["node-a", "node-b", "node-c"][i % 3].into(),
        ip: Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 244, 0, 10)) + i as u32),
        ports: vec![("http".into(), TCP, 8080)],
    }
}

fn policy(j: usize) -> CompiledPolicy {
    let mut spec = json!({
        "podSelector": {"matchLabels": {"app": format!("app-{}", j % 100)}},
        "ingress": [{
            "from": [
                {"podSelector": {"matchLabels": {"tier": format!("t{}", j % 5)}}},
                {"namespaceSelector": {"matchLabels": {"team": format!("team-{}", j % 3)}},
                 "podSelector": {"matchLabels": {"tier": format!("t{}", (j + 1) % 5)}}}
            ],
            "ports": [{"port": 80}, {"port": 8000, "endPort": 8100}, {"port": "http"}]
        }]
    });
    if j.is_multiple_of(10) {
        spec["egress"] = json!([
            {"ports": [{"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]},
            {"to": [{"podSelector": {}}]}
        ]);
    }
    let policy: NetworkPolicy = serde_json::from_value(json!({
        "metadata": {"name": format!("policy-{j}"), "namespace": format!("ns-{}", j % 10)},
        "spec": spec
    }))
    .expect("a NetworkPolicy");
    CompiledPolicy::new(&policy)
}

fn world(o: &Options) -> Policier {
    let mut p = Policier::new(NODE);
    for n in 0..10 {
        let labels = [("team".to_string(), format!("team-{}", n % 3))].into();
        p.policies.set_namespace(&format!("ns-{n}"), Some(labels));
    }
    for i in 0..o.pods {
        let pod = pod(i);
        p.policies.set_pod(pod.key(), Some(pod));
    }
    for j in 0..o.policies {
        p.policies.set_policy((format!("ns-{}", j % 10), format!("policy-{j}")), Some(policy(j)));
    }
    p
}

/// Keeps a row for the table and shows it at once (a slow run still tells what it measured).
fn push(rows: &mut Vec<(String, String)>, row: (String, String)) {
    eprintln!("{}: {}", row.0, row.1);
    rows.push(row);
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted.get(((sorted.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or_default()
}

/// Feeds one Pod change and programs it; the report and the time from feeding to programmed.
fn change(policier: &mut Policier, ns: &str, key: (String, String), pod: Option<PolicyPod>) -> (SyncReport, Duration) {
    let start = Instant::now();
    policier.policies.set_pod(key, pod);
    let report = in_netns(ns, || policier.sync()).expect("element update");
    assert!(!report.full, "the netlink element update failed and fell back to a full sync");
    (report, start.elapsed())
}

fn main() {
    let o = options();
    if let Some(seconds) = o.packet_rate {
        return traffic::run(world(&o), seconds);
    }
    let mut rows: Vec<(String, String)> = Vec::new();

    let start = Instant::now();
    let mut core = world(&o);
    core.policies.take_changes();
    let keys: Vec<_> = core.policies.local_pods().map(|p| p.key()).collect();
    let isolated = keys.iter().filter(|k| core.policies.rules(k).is_some_and(|r| r.ingress.is_some())).count();
    push(
        &mut rows,
        (
            format!("pure core: {} Pods, {} policies fed in, {} local Pods' allows", o.pods, o.policies, keys.len()),
            ms(start.elapsed()),
        ),
    );
    let start = Instant::now();
    let Plan::Full { text, .. } = core.plan() else { unreachable!("a new Policier's first plan is a full one") };
    let plan = start.elapsed();
    let elements = text.matches(" . ").count() / 3;
    push(
        &mut rows,
        (
            format!(
                "full plan (elements + text): {isolated} isolated Pods, {elements} elements, {} KiB",
                text.len() / 1024
            ),
            ms(plan),
        ),
    );

    let topo = Topology::new(0);
    let mut policier = world(&o);
    let start = Instant::now();
    let report = in_netns(&topo.node, || policier.sync()).expect("full sync");
    push(&mut rows, (format!("full sync: plan + nft -f ({} Pods programmed)", report.pods), ms(start.elapsed())));

    let mut started = Vec::new();
    for (what, local) in
        [("a Pod of this node, selected by policies, starts", true), ("a peer Pod on another node starts", false)]
    {
        let (mut times, mut planned, mut pods, mut elements) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for c in 0..o.changes {
            // Pod numbers past the world's, labelled like its Pods of the same number modulo.
            let mut pod = pod(o.pods + c * 3 + if local { 0 } else { 1 });
            pod.name = format!("new-{}-{c}", if local { "local" } else { "remote" });
            if !local {
                started.push(pod.key());
            }
            let (report, took) = change(&mut policier, &topo.node, pod.key(), Some(pod));
            times.push(took);
            planned.push(report.planned);
            pods.push(report.pods);
            elements.push(report.elements);
        }
        push(&mut rows, start_row(what, o.changes, times, planned, pods, elements));
    }
    let (mut times, mut planned, mut pods, mut elements) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for key in started {
        let (report, took) = change(&mut policier, &topo.node, key, None);
        times.push(took);
        planned.push(report.planned);
        pods.push(report.pods);
        elements.push(report.elements);
    }
    push(&mut rows, start_row("the same peer Pods go", o.changes, times, planned, pods, elements));
    drop(topo);

    println!("| NetworkPolicy, {} Pods x {} policies | time |\n|---|---|", o.pods, o.policies);
    for (what, time) in rows {
        println!("| {what} | {time} |");
    }
}

/// A row of Pod changes: p50 / p99 of the whole and of its planning, with the median number
/// of local Pods and elements each changed.
fn start_row(
    what: &str,
    n: usize,
    mut times: Vec<Duration>,
    mut planned: Vec<Duration>,
    mut pods: Vec<usize>,
    mut elements: Vec<usize>,
) -> (String, String) {
    times.sort();
    planned.sort();
    pods.sort();
    elements.sort();
    (
        format!(
            "{what} ({} local Pods, {} elements changed each, median): fed in and programmed, p50 / p99 of {n} \
             (planning: {} / {})",
            pods.get(pods.len() / 2).copied().unwrap_or_default(),
            elements.get(elements.len() / 2).copied().unwrap_or_default(),
            ms(percentile(&planned, 0.5)),
            ms(percentile(&planned, 0.99)),
        ),
        format!("{} / {}", ms(percentile(&times, 0.5)), ms(percentile(&times, 0.99))),
    )
}
