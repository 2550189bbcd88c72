//! The proxy against real traffic, as root, in network namespaces these tests make (see
//! `gitplane_testkit::topology`). Every test runs for both backends: the same objects, the same checks.

#[path = "proxy/cases.rs"]
mod cases;

use gitplane_nodeagent::network::proxy::{Backend, Ipv4Cidr, NodeContext, Proxier, SyncReport};
use gitplane_testkit::topology::{BACKEND_PORT, CLIENT_IP, NODE_IP, Outcome, Topology, connect, in_netns};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

const BACKENDS: [Backend; 2] = [Backend::Nftables, Backend::Iptables];

fn node() -> NodeContext {
    NodeContext {
        node_name: "node-a".into(),
        node_ips: vec![NODE_IP],
        cluster_cidr: "10.244.0.0/16".parse::<Ipv4Cidr>().unwrap(),
        service_cidr: "10.96.0.0/12".parse::<Ipv4Cidr>().unwrap(),
    }
}

fn service(name: &str, cluster_ip: &str, extra: serde_json::Value) -> Service {
    let mut spec = json!({"clusterIP": cluster_ip, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]});
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"namespace": "default", "name": name},
        "spec": spec,
    }))
    .unwrap()
}

/// The slice of Service `name` with Pods `pods` (numbers of the topology), all on this node.
fn slice(name: &str, pods: &[usize]) -> EndpointSlice {
    let endpoints: Vec<_> = pods
        .iter()
        .map(|i| json!({"addresses": [Topology::pod_ip(*i).to_string()], "nodeName": "node-a", "conditions": {"ready": true}}))
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"namespace": "default", "name": format!("{name}-1"), "labels": {"kubernetes.io/service-name": name}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": BACKEND_PORT, "protocol": "TCP"}],
        "endpoints": endpoints,
    }))
    .unwrap()
}

fn sync(topo: &Topology, proxier: &mut Proxier) -> SyncReport {
    in_netns(&topo.node, || proxier.sync()).unwrap_or_else(|e| panic!("sync failed: {e}"))
}

fn addr(ip: &str, port: u16) -> SocketAddr {
    SocketAddr::new(ip.parse::<Ipv4Addr>().unwrap().into(), port)
}

/// `n` connections from namespace `ns` to `to`: answers per backend, and anything else.
fn tally(ns: &str, to: SocketAddr, n: usize) -> (BTreeMap<String, usize>, Vec<Outcome>) {
    in_netns(ns, || {
        let mut answered = BTreeMap::new();
        let mut other = Vec::new();
        for _ in 0..n {
            match connect(to) {
                Outcome::Answered { backend, .. } => *answered.entry(backend).or_default() += 1,
                o => other.push(o),
            }
        }
        (answered, other)
    })
}

fn names(pods: &[usize]) -> BTreeSet<String> {
    pods.iter().map(|i| format!("pod-{i}")).collect()
}

#[test]
fn t50_clusterip_spreads_and_follows_endpoint_changes() {
    for backend in BACKENDS {
        let topo = Topology::new(4);
        let mut proxier = Proxier::new(node(), backend);
        proxier.update_service(service("web", "10.96.0.20", json!({})));
        proxier.update_endpoint_slice(slice("web", &[1, 2, 3]));
        assert!(sync(&topo, &mut proxier).full);
        let to = addr("10.96.0.20", 80);
        let (answered, other) = tally(topo.pod(4), to, 60);
        assert!(other.is_empty(), "{backend:?}: {other:?}");
        assert_eq!(answered.keys().cloned().collect::<BTreeSet<_>>(), names(&[1, 2, 3]), "{backend:?}: {answered:?}");

        // Removing an endpoint is a partial sync; the removed Pod gets no new connection.
        proxier.update_endpoint_slice(slice("web", &[1, 2]));
        let report = sync(&topo, &mut proxier);
        assert!(!report.full && report.services == 1, "{backend:?}: {report:?}");
        let (answered, other) = tally(topo.pod(4), to, 40);
        assert!(other.is_empty(), "{backend:?}: {other:?}");
        assert_eq!(answered.keys().cloned().collect::<BTreeSet<_>>(), names(&[1, 2]), "{backend:?}: {answered:?}");

        // A new endpoint takes its share.
        proxier.update_endpoint_slice(slice("web", &[1, 2, 4]));
        sync(&topo, &mut proxier);
        let (answered, other) = tally(topo.pod(3), to, 60);
        assert!(other.is_empty(), "{backend:?}: {other:?}");
        assert_eq!(answered.keys().cloned().collect::<BTreeSet<_>>(), names(&[1, 2, 4]), "{backend:?}: {answered:?}");
    }
}

#[test]
fn t50_a_service_without_endpoints_refuses_at_once() {
    for backend in BACKENDS {
        let topo = Topology::new(1);
        let mut proxier = Proxier::new(node(), backend);
        proxier.update_service(service("empty", "10.96.0.30", json!({})));
        proxier.update_service(service(
            "nodeport",
            "10.96.0.31",
            json!({"type": "NodePort", "ports": [{"name": "http", "port": 80, "nodePort": 30031}]}),
        ));
        sync(&topo, &mut proxier);
        // From a Pod (forward), from the node itself (output), from outside (a NodePort), and to
        // an address of the Service range that no Service has.
        for (ns, to) in [
            (topo.pod(1), addr("10.96.0.30", 80)),
            (topo.node.as_str(), addr("10.96.0.30", 80)),
            (topo.client.as_str(), addr(&NODE_IP.to_string(), 30031)),
            (topo.pod(1), addr("10.96.0.99", 80)),
        ] {
            let start = Instant::now();
            let outcome = in_netns(ns, || connect(to));
            assert_eq!(outcome, Outcome::Refused, "{backend:?}: {ns} -> {to}");
            assert!(start.elapsed() < Duration::from_secs(1), "{backend:?}: {ns} -> {to} took {:?}", start.elapsed());
        }
        // The first endpoint makes it answer.
        proxier.update_endpoint_slice(slice("empty", &[1]));
        assert!(!sync(&topo, &mut proxier).full);
        let (answered, other) = tally(topo.node.as_str(), addr("10.96.0.30", 80), 3);
        assert!(other.is_empty() && answered.get("pod-1") == Some(&3), "{backend:?}: {answered:?} {other:?}");
    }
}

#[test]
fn t50_nodeport_masquerades_unless_external_traffic_policy_is_local() {
    for backend in BACKENDS {
        let topo = Topology::new(2);
        let mut proxier = Proxier::new(node(), backend);
        let np = |port: u16| json!([{"name": "http", "port": 80, "targetPort": "http", "nodePort": port}]);
        proxier.update_service(service("cluster", "10.96.0.40", json!({"type": "NodePort", "ports": np(30040)})));
        proxier.update_endpoint_slice(slice("cluster", &[1, 2]));
        proxier.update_service(service(
            "local",
            "10.96.0.41",
            json!({"type": "NodePort", "ports": np(30041), "externalTrafficPolicy": "Local"}),
        ));
        proxier.update_endpoint_slice(slice("local", &[2]));
        sync(&topo, &mut proxier);

        let outcomes: Vec<Outcome> =
            in_netns(&topo.client, || (0..30).map(|_| connect(addr(&NODE_IP.to_string(), 30040))).collect());
        let mut seen = BTreeSet::new();
        for o in &outcomes {
            let Outcome::Answered { backend: b, seen_source } = o else { panic!("{backend:?}: {o:?}") };
            assert_ne!(seen_source, &CLIENT_IP.to_string(), "{backend:?}: Cluster policy must masquerade");
            seen.insert(b.clone());
        }
        assert_eq!(seen, names(&[1, 2]), "{backend:?}");

        let o = in_netns(&topo.client, || connect(addr(&NODE_IP.to_string(), 30041)));
        assert_eq!(
            o,
            Outcome::Answered { backend: "pod-2".into(), seen_source: CLIENT_IP.to_string() },
            "{backend:?}: Local policy keeps the client's address"
        );
    }
}

#[test]
fn t50_session_affinity_sticks_to_one_endpoint() {
    for backend in BACKENDS {
        let topo = Topology::new(4);
        let mut proxier = Proxier::new(node(), backend);
        let affinity =
            json!({"sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}}});
        proxier.update_service(service("sticky", "10.96.0.50", affinity));
        proxier.update_endpoint_slice(slice("sticky", &[1, 2, 3]));
        sync(&topo, &mut proxier);
        let to = addr("10.96.0.50", 80);
        let (answered, other) = tally(topo.pod(4), to, 20);
        assert!(other.is_empty(), "{backend:?}: {other:?}");
        assert_eq!(answered.len(), 1, "{backend:?}: {answered:?}");
        let chosen: usize = answered.keys().next().unwrap().trim_start_matches("pod-").parse().unwrap();

        // Its endpoint goes: the client moves to another one and sticks there.
        let rest: Vec<usize> = [1, 2, 3].into_iter().filter(|i| *i != chosen).collect();
        proxier.update_endpoint_slice(slice("sticky", &rest));
        sync(&topo, &mut proxier);
        let (answered, other) = tally(topo.pod(4), to, 20);
        assert!(other.is_empty(), "{backend:?}: {other:?}");
        assert_eq!(answered.len(), 1, "{backend:?}: {answered:?}");
        assert!(!answered.contains_key(&format!("pod-{chosen}")), "{backend:?}: {answered:?}");
    }
}

#[test]
fn t50_a_pod_reaches_itself_through_its_service() {
    for backend in BACKENDS {
        let topo = Topology::new(1);
        let mut proxier = Proxier::new(node(), backend);
        proxier.update_service(service("self", "10.96.0.60", json!({})));
        proxier.update_endpoint_slice(slice("self", &[1]));
        sync(&topo, &mut proxier);
        let o = in_netns(topo.pod(1), || connect(addr("10.96.0.60", 80)));
        let Outcome::Answered { backend: b, seen_source } = o else { panic!("{backend:?}: {o:?}") };
        assert_eq!(b, "pod-1");
        assert_ne!(seen_source, Topology::pod_ip(1).to_string(), "{backend:?}: hairpin traffic must be masqueraded");
    }
}

/// What our rules in the node namespace amount to, order aside: duplicates would show.
fn installed(topo: &Topology, backend: Backend) -> Vec<String> {
    in_netns(&topo.node, || {
        let out = match backend {
            Backend::Nftables => {
                std::process::Command::new("nft").args(["-s", "list", "table", "ip", "gitplane-proxy"]).output()
            }
            Backend::Iptables => std::process::Command::new("iptables-save").output(),
        }
        .unwrap();
        assert!(out.status.success());
        let mut lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.starts_with('#') && !l.starts_with(':'))
            .flat_map(|l| {
                l.split(", ").map(|e| e.trim().trim_start_matches("elements = { ").trim_end_matches(" }").to_owned())
            })
            .collect();
        lines.sort();
        lines
    })
}

#[test]
fn t50_a_restarted_proxier_adopts_the_rules_in_place() {
    for backend in BACKENDS {
        let topo = Topology::new(3);
        let objects = |pods: &[usize]| (vec![service("web", "10.96.0.70", json!({}))], vec![slice("web", pods)]);
        let mut first = Proxier::new(node(), backend);
        let (services, slices) = objects(&[1, 2]);
        first.replace_all(services, slices);
        sync(&topo, &mut first);
        let before = installed(&topo, backend);
        drop(first);

        // A new process with the same objects: the same rules, nothing twice.
        let mut second = Proxier::new(node(), backend);
        let (services, slices) = objects(&[1, 2]);
        second.replace_all(services, slices);
        assert!(sync(&topo, &mut second).full);
        assert_eq!(installed(&topo, backend), before, "{backend:?}");
        let (answered, other) = tally(topo.pod(3), addr("10.96.0.70", 80), 30);
        assert!(other.is_empty() && answered.len() == 2, "{backend:?}: {answered:?} {other:?}");

        // A restart into a different state removes what the old state needed (its chains).
        let mut third = Proxier::new(node(), backend);
        let (services, slices) = objects(&[3]);
        third.replace_all(services, slices);
        sync(&topo, &mut third);
        assert_eq!(installed(&topo, backend), third_state_rules(backend), "{backend:?}");
        let (answered, _) = tally(topo.pod(1), addr("10.96.0.70", 80), 10);
        assert_eq!(answered.keys().cloned().collect::<BTreeSet<_>>(), names(&[3]), "{backend:?}");
    }
}

/// The rules a fresh namespace gets for the third state of the restart test.
fn third_state_rules(backend: Backend) -> Vec<String> {
    let topo = Topology::new(0);
    let mut p = Proxier::new(node(), backend);
    p.update_service(service("web", "10.96.0.70", json!({})));
    p.update_endpoint_slice(slice("web", &[3]));
    sync(&topo, &mut p);
    installed(&topo, backend)
}

#[test]
fn t50_every_snapshot_case_applies_in_full_and_as_an_update() {
    for backend in BACKENDS {
        for case in cases::all() {
            let topo = Topology::new(0);
            let mut proxier = Proxier::new(case.node.clone(), backend);
            proxier.replace_all(case.services.clone(), case.slices.clone());
            let report = sync(&topo, &mut proxier);
            assert!(report.full, "{backend:?} {}", case.name);
            proxier.replace_all(case.updated_services.clone(), case.updated_slices.clone());
            let report = sync(&topo, &mut proxier);
            assert!(!report.full && report.services > 0, "{backend:?} {}: {report:?}", case.name);
        }
    }
}
