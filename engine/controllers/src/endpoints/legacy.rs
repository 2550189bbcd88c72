//! A Service's legacy Endpoints object (core/v1, what `kubectl get endpoints` reads), planned
//! as kube-controller-manager's endpoint controller (`pkg/controller/endpoint`) keeps it: one
//! object named as the Service, with its labels; ready Pods in `addresses`, the others in
//! `notReadyAddresses` (every one in `addresses` when the Service publishes not-ready
//! addresses); terminating Pods left out unless it does; subsets packed by the set of ports
//! each Pod resolves (upstream's `RepackSubsets`), and at most [`MAX_CAPACITY`] addresses.

use super::{pods, slices::LABEL_HEADLESS};
use crate::{plan::Op, replicaset::is_ready};
use k8s_openapi::api::core::v1::{
    EndpointAddress, EndpointPort, EndpointSubset, Endpoints, ObjectReference, Pod, Service,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::BTreeMap;

/// Upstream's cap on the addresses of one Endpoints object.
pub const MAX_CAPACITY: usize = 1000;
/// The annotation that says addresses were cut at [`MAX_CAPACITY`].
pub const OVER_CAPACITY: &str = "endpoints.kubernetes.io/over-capacity";

/// Ports in a canonical order: subsets are keyed by them.
type PortsKey = Vec<(Option<String>, i32, Option<String>, Option<String>)>;

fn key_of(ports: &[EndpointPort]) -> PortsKey {
    let mut key: PortsKey =
        ports.iter().map(|p| (p.name.clone(), p.port, p.protocol.clone(), p.app_protocol.clone())).collect();
    key.sort();
    key
}

fn address(service: &Service, pod: &Pod, ip: String) -> EndpointAddress {
    EndpointAddress {
        ip,
        hostname: pods::hostname(pod, service),
        node_name: pod.spec.as_ref().and_then(|s| s.node_name.clone()).filter(|n| !n.is_empty()),
        target_ref: Some(ObjectReference {
            kind: Some("Pod".into()),
            namespace: pod.metadata.namespace.clone(),
            name: pod.metadata.name.clone(),
            uid: pod.metadata.uid.clone(),
            ..Default::default()
        }),
    }
}

/// Upstream's address order: by IP, then by Pod uid.
fn sort_addresses(addresses: &mut [EndpointAddress]) {
    addresses.sort_by(|a, b| {
        let uid = |a: &EndpointAddress| a.target_ref.as_ref().and_then(|r| r.uid.clone());
        a.ip.cmp(&b.ip).then_with(|| uid(a).cmp(&uid(b)))
    });
}

fn non_empty<T>(items: Vec<T>) -> Option<Vec<T>> {
    (!items.is_empty()).then_some(items)
}

/// One subset as it is gathered.
#[derive(Default)]
struct Subset {
    ports: Vec<EndpointPort>,
    ready: Vec<EndpointAddress>,
    not_ready: Vec<EndpointAddress>,
}

/// The subsets of the Service's Endpoints from the Pods it selects.
pub fn subsets(service: &Service, pods: &[Pod]) -> Vec<EndpointSubset> {
    let publish_not_ready = pods::publishes_not_ready(service);
    let service_ports = pods::service_ports(service);
    let mut groups: BTreeMap<PortsKey, Subset> = BTreeMap::new();
    for pod in pods.iter().filter(|p| pods::should_be_in_endpoints(p, publish_not_ready)) {
        let Some(ip) = pods::ipv4(pod) else { continue };
        let ports: Vec<EndpointPort> = service_ports
            .iter()
            .filter_map(|p| {
                Some(EndpointPort {
                    name: p.name.clone().filter(|n| !n.is_empty()),
                    port: pods::target_port(pod, p)?,
                    protocol: Some(pods::protocol(p.protocol.as_deref()).to_owned()),
                    app_protocol: p.app_protocol.clone(),
                })
            })
            .collect();
        // Only a headless Service may have no ports; a Pod that serves none of a Service's
        // ports is not an address of it.
        let portless_headless = service_ports.is_empty() && pods::is_headless(service);
        if ports.is_empty() && !portless_headless {
            continue;
        }
        let group = groups.entry(key_of(&ports)).or_insert_with(|| Subset { ports, ..Subset::default() });
        let address = address(service, pod, ip);
        if publish_not_ready || is_ready(pod) {
            group.ready.push(address);
        } else {
            group.not_ready.push(address);
        }
    }
    groups
        .into_values()
        .map(|Subset { mut ports, mut ready, mut not_ready }| {
            ports.sort_by_key(|p| (p.name.clone(), p.port, p.protocol.clone()));
            sort_addresses(&mut ready);
            sort_addresses(&mut not_ready);
            EndpointSubset {
                addresses: non_empty(ready),
                not_ready_addresses: non_empty(not_ready),
                ports: non_empty(ports),
            }
        })
        .collect()
}

fn count(subset: &EndpointSubset, ready: bool) -> usize {
    let addresses = if ready { &subset.addresses } else { &subset.not_ready_addresses };
    addresses.as_ref().map_or(0, Vec::len)
}

/// Cuts the subsets to [`MAX_CAPACITY`] addresses as upstream's `truncateEndpoints` does: ready
/// addresses first, each subset keeping its share (rounded up); whether it cut any.
fn truncate(subsets: &mut [EndpointSubset]) -> bool {
    let ready: usize = subsets.iter().map(|s| count(s, true)).sum();
    let not_ready: usize = subsets.iter().map(|s| count(s, false)).sum();
    if ready + not_ready <= MAX_CAPACITY {
        return false;
    }
    let cut_ready = ready > MAX_CAPACITY;
    let (budget, total) = if cut_ready { (MAX_CAPACITY, ready) } else { (MAX_CAPACITY - ready, not_ready) };
    let mut left = budget;
    for subset in subsets.iter_mut() {
        let share = (count(subset, cut_ready) * budget).div_ceil(total).min(left);
        let cut = |addresses: &mut Option<Vec<EndpointAddress>>, keep: usize| {
            if let Some(list) = addresses.as_mut() {
                list.truncate(keep);
            }
        };
        if cut_ready {
            cut(&mut subset.addresses, share);
            subset.not_ready_addresses = None;
            left -= count(subset, true);
        } else {
            cut(&mut subset.not_ready_addresses, share);
            left -= count(subset, false);
        }
    }
    true
}

/// The write that brings the Service's Endpoints (`existing`, if the cluster made it) to the
/// Pods it selects; `service` is `None` when it should have none (the Service is gone, or has
/// no selector). `None` when nothing needs writing.
pub fn plan(service: Option<&Service>, pods: &[Pod], existing: Option<&Endpoints>) -> Option<Op<Endpoints>> {
    let Some(service) = service else { return existing.map(|e| Op::Delete(e.clone())) };
    let mut subsets = subsets(service, pods);
    let truncated = truncate(&mut subsets);
    let mut labels = service.metadata.labels.clone().unwrap_or_default();
    if pods::has_cluster_ip(service) {
        labels.remove(LABEL_HEADLESS);
    } else {
        labels.insert(LABEL_HEADLESS.into(), String::new());
    }
    let mut annotations = existing.and_then(|e| e.metadata.annotations.clone()).unwrap_or_default();
    if truncated {
        annotations.insert(OVER_CAPACITY.into(), "truncated".into());
    } else {
        annotations.remove(OVER_CAPACITY);
    }
    let desired = Endpoints {
        metadata: ObjectMeta {
            name: service.metadata.name.clone(),
            namespace: service.metadata.namespace.clone(),
            labels: non_empty_map(labels),
            annotations: non_empty_map(annotations),
            resource_version: existing.and_then(|e| e.metadata.resource_version.clone()),
            ..Default::default()
        },
        subsets: non_empty(subsets),
    };
    match existing {
        None => Some(Op::Create(desired)),
        Some(e)
            if e.subsets.as_deref().unwrap_or_default() == desired.subsets.as_deref().unwrap_or_default()
                && e.metadata.labels.clone().unwrap_or_default()
                    == desired.metadata.labels.clone().unwrap_or_default()
                && e.metadata.annotations.clone().unwrap_or_default()
                    == desired.metadata.annotations.clone().unwrap_or_default() =>
        {
            None
        }
        Some(_) => Some(Op::Update(desired)),
    }
}

fn non_empty_map(map: BTreeMap<String, String>) -> Option<BTreeMap<String, String>> {
    (!map.is_empty()).then_some(map)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn service(spec: Value) -> Service {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "svc-1", "labels": {"app": "web"}},
            "spec": spec,
        }))
        .unwrap()
    }

    fn web() -> Service {
        service(json!({"clusterIP": "10.96.0.7", "selector": {"app": "web"},
                       "ports": [{"name": "http", "port": 80, "targetPort": "http"}, {"port": 9090, "name": "metrics"}]}))
    }

    fn pod(n: u32, ready: bool, http: Option<i32>) -> Pod {
        let ports: Vec<Value> = http.map(|p| json!({"name": "http", "containerPort": p})).into_iter().collect();
        serde_json::from_value(json!({
            "metadata": {"name": format!("web-{n}"), "namespace": "default", "uid": format!("pod-{n}"), "labels": {"app": "web"}},
            "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i", "ports": ports}]},
            "status": {"phase": "Running", "podIP": format!("10.244.0.{n}"),
                       "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}
        }))
        .unwrap()
    }

    /// Each subset as `ports | ready IPs | not ready IPs`.
    fn describe(subsets: &[EndpointSubset]) -> Vec<String> {
        let ips = |a: &Option<Vec<EndpointAddress>>| {
            a.iter().flatten().map(|a| a.ip.rsplit('.').next().unwrap().to_owned()).collect::<Vec<_>>().join(",")
        };
        subsets
            .iter()
            .map(|s| {
                let ports: Vec<String> = s.ports.iter().flatten().map(|p| p.port.to_string()).collect();
                format!("{} | {} | {}", ports.join(","), ips(&s.addresses), ips(&s.not_ready_addresses))
            })
            .collect()
    }

    #[test]
    fn subsets_table() {
        let headless = service(json!({"clusterIP": "None", "selector": {"app": "web"}}));
        let publish =
            service(json!({"clusterIP": "10.96.0.7", "selector": {"app": "web"}, "publishNotReadyAddresses": true,
                                      "ports": [{"port": 80}]}));
        let mut leaving = pod(9, true, Some(8080));
        leaving.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::from_second(1).unwrap(),
        ));
        #[rustfmt::skip]
        let cases: Vec<(&str, Service, Vec<Pod>, Vec<&str>)> = vec![
            ("ready and not ready", web(), vec![pod(3, true, Some(8080)), pod(2, false, Some(8080)), pod(1, true, Some(8080))],
             vec!["8080,9090 | 1,3 | 2"]),
            ("packed by the ports each Pod resolves", web(),
             vec![pod(1, true, Some(8080)), pod(2, true, Some(8081)), pod(3, true, None)],
             vec!["8080,9090 | 1 | ", "8081,9090 | 2 | ", "9090 | 3 | "]),
            ("terminating Pods are left out", web(), vec![leaving.clone()], vec![]),
            ("unless not-ready addresses are published", publish, vec![leaving, pod(2, false, None)], vec!["80 | 2,9 | "]),
            ("a headless Service without ports", headless, vec![pod(1, true, None)], vec![" | 1 | "]),
        ];
        for (what, service, pods, expected) in cases {
            assert_eq!(describe(&subsets(&service, &pods)), expected, "{what}");
        }
    }

    #[test]
    fn plan_creates_updates_only_on_change_and_deletes() {
        let pods = [pod(1, true, Some(8080)), pod(2, false, Some(8080))];
        let Some(Op::Create(created)) = plan(Some(&web()), &pods, None) else { panic!("a create") };
        let value = serde_json::to_value(&created).unwrap();
        assert_eq!(value["metadata"], json!({"name": "web", "namespace": "default", "labels": {"app": "web"}}));
        assert_eq!(
            value["subsets"][0]["addresses"][0],
            json!({"ip": "10.244.0.1", "nodeName": "n1",
                   "targetRef": {"kind": "Pod", "namespace": "default", "name": "web-1", "uid": "pod-1"}})
        );
        assert_eq!(
            value["subsets"][0]["ports"],
            json!([{"name": "http", "port": 8080, "protocol": "TCP"}, {"name": "metrics", "port": 9090, "protocol": "TCP"}])
        );
        let mut stored = created.clone();
        stored.metadata.resource_version = Some("4".into());
        assert_eq!(plan(Some(&web()), &pods, Some(&stored)), None, "nothing changed");
        let Some(Op::Update(updated)) = plan(Some(&web()), &[pod(1, true, Some(8080))], Some(&stored)) else {
            panic!("an update")
        };
        assert_eq!(updated.metadata.resource_version.as_deref(), Some("4"), "compare-and-swap on what was read");
        assert_eq!(plan(None, &[], Some(&stored)), Some(Op::Delete(stored.clone())));
        assert_eq!(plan(None, &[], None), None);
    }

    #[test]
    fn more_than_capacity_is_truncated_and_annotated() {
        let many: Vec<Pod> = (0..1200)
            .map(|n| {
                let mut p = pod(n, n % 2 == 0, Some(8080));
                p.status.as_mut().unwrap().pod_ip = Some(format!("10.244.{}.{}", n / 250, n % 250));
                p
            })
            .collect();
        let Some(Op::Create(e)) = plan(Some(&web()), &many, None) else { panic!("a create") };
        let subset = &e.subsets.as_ref().unwrap()[0];
        assert_eq!((count(subset, true), count(subset, false)), (600, 400), "ready addresses first");
        assert_eq!(e.metadata.annotations.as_ref().unwrap()[OVER_CAPACITY], "truncated");
    }
}
