//! A Service's EndpointSlices (discovery.k8s.io/v1), planned as kube-controller-manager's
//! endpointslice reconciler plans them (`k8s.io/endpointslice/reconciler.go`):
//!
//! - Pods are grouped by the set of ports they resolve (a named target port is looked up in each
//!   Pod), and each group fills slices of at most [`MAX_ENDPOINTS_PER_SLICE`] endpoints;
//! - an existing slice keeps the endpoints still wanted, updated in place, and is written only
//!   if one of them changed, one went, or the Service's labels changed: a resync, or a Pod
//!   change that alters no endpoint, writes nothing, and a change touches only its slice;
//! - new endpoints go first into slices being written anyway (fullest first), then into the
//!   unchanged slice they would fill most, then into new slices;
//! - a slice to create reuses the name of one to delete (an update instead of a delete and a
//!   create); a Service without endpoints keeps one empty placeholder slice.

use super::pods;
use crate::{names, owner::controller_ref, plan::Op, replicaset::is_ready};
use k8s_openapi::api::core::v1::{ObjectReference, Pod, Service};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// The label naming a slice's Service.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// The label naming the controller that manages a slice.
pub const LABEL_MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
/// This controller's value of [`LABEL_MANAGED_BY`], upstream's.
pub const MANAGED_BY: &str = "endpointslice-controller.k8s.io";
/// The label on the endpoints of a Service without a ClusterIP.
pub const LABEL_HEADLESS: &str = "service.kubernetes.io/headless";
/// Upstream's default `--max-endpoints-per-slice`.
pub const MAX_ENDPOINTS_PER_SLICE: usize = 100;
/// gitplane's Services are IPv4 only.
const IPV4: &str = "IPv4";

/// Whether a slice (as JSON) is one this controller manages for the Service named `service`:
/// a filter before decoding.
pub fn is_managed_for(slice: &Value, service: &str) -> bool {
    let labels = &slice["metadata"]["labels"];
    labels[LABEL_MANAGED_BY] == MANAGED_BY && labels[LABEL_SERVICE_NAME] == service
}

/// The Service's ports as this Pod serves them, in the Service's order; a port the Pod lacks is
/// left out (upstream's `getEndpointPorts`).
pub fn endpoint_ports(service: &Service, pod: &Pod) -> Vec<EndpointPort> {
    pods::service_ports(service)
        .iter()
        .filter_map(|p| {
            Some(EndpointPort {
                name: Some(p.name.clone().unwrap_or_default()),
                port: Some(pods::target_port(pod, p)?),
                protocol: Some(pods::protocol(p.protocol.as_deref()).to_owned()),
                app_protocol: p.app_protocol.clone(),
            })
        })
        .collect()
}

/// The Pod as an endpoint of the Service (upstream's `podToEndpoint`): `serving` is the Pod's
/// readiness, `ready` the same but never while terminating (unless the Service publishes
/// not-ready addresses).
pub fn endpoint(service: &Service, pod: &Pod) -> Endpoint {
    let serving = is_ready(pod);
    let terminating = pods::is_terminating(pod);
    let ready = pods::publishes_not_ready(service) || (serving && !terminating);
    Endpoint {
        addresses: pods::ipv4(pod).into_iter().collect(),
        conditions: Some(EndpointConditions {
            ready: Some(ready),
            serving: Some(serving),
            terminating: Some(terminating),
        }),
        hostname: pods::hostname(pod, service),
        node_name: pod.spec.as_ref().and_then(|s| s.node_name.clone()).filter(|n| !n.is_empty()),
        target_ref: Some(ObjectReference {
            kind: Some("Pod".into()),
            namespace: pod.metadata.namespace.clone(),
            name: pod.metadata.name.clone(),
            uid: pod.metadata.uid.clone(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A set of ports, whatever their order: the slices of a Service are grouped by it.
type PortsKey = Vec<(Option<String>, Option<i32>, Option<String>, Option<String>)>;

fn ports_key(ports: &[EndpointPort]) -> PortsKey {
    let mut key: PortsKey =
        ports.iter().map(|p| (p.name.clone(), p.port, p.protocol.clone(), p.app_protocol.clone())).collect();
    key.sort();
    key
}

/// What makes an endpoint the same one across syncs (upstream's endpoint hash): its addresses,
/// hostname and Pod. Everything else about it may change in place.
type EndpointKey = (Vec<String>, Option<String>, Option<String>, Option<String>);

fn endpoint_key(e: &Endpoint) -> EndpointKey {
    let mut addresses = e.addresses.clone();
    addresses.sort();
    let pod = e.target_ref.as_ref();
    (addresses, e.hostname.clone(), pod.and_then(|r| r.namespace.clone()), pod.and_then(|r| r.name.clone()))
}

/// The endpoints still to place, in a stable order (by address).
type Wanted = BTreeMap<EndpointKey, Endpoint>;

fn slice_ports(slice: &EndpointSlice) -> &[EndpointPort] {
    slice.ports.as_deref().unwrap_or_default()
}

fn owned_by(slice: &EndpointSlice, service: &Service) -> bool {
    slice
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| Some(&o.uid) == service.metadata.uid.as_ref() && o.kind == "Service" && o.api_version == "v1")
}

fn is_reserved(label: &str) -> bool {
    matches!(label, LABEL_SERVICE_NAME | LABEL_MANAGED_BY | LABEL_HEADLESS)
}

/// The labels of a slice of the Service (the Service's own, then the reserved ones), and whether
/// the slice's own non-reserved labels differ from the Service's (upstream's
/// `setEndpointSliceLabels`).
fn slice_labels(slice: Option<&EndpointSlice>, service: &Service) -> (BTreeMap<String, String>, bool) {
    let unreserved = |labels: Option<&BTreeMap<String, String>>| -> BTreeMap<String, String> {
        labels.into_iter().flatten().filter(|(k, _)| !is_reserved(k)).map(|(k, v)| (k.clone(), v.clone())).collect()
    };
    let mut labels = unreserved(service.metadata.labels.as_ref());
    let changed = unreserved(slice.and_then(|s| s.metadata.labels.as_ref())) != labels;
    if !pods::has_cluster_ip(service) {
        labels.insert(LABEL_HEADLESS.into(), String::new());
    }
    labels.insert(LABEL_SERVICE_NAME.into(), service.metadata.name.clone().unwrap_or_default());
    labels.insert(LABEL_MANAGED_BY.into(), MANAGED_BY.into());
    (labels, changed)
}

/// An empty slice of the Service for these ports, named when it is written.
fn new_slice(service: &Service, ports: &[EndpointPort]) -> EndpointSlice {
    EndpointSlice {
        metadata: ObjectMeta {
            namespace: service.metadata.namespace.clone(),
            labels: Some(slice_labels(None, service).0),
            owner_references: Some(vec![controller_ref("v1", "Service", &service.metadata)]),
            ..Default::default()
        },
        address_type: IPV4.into(),
        endpoints: Vec::new(),
        ports: (!ports.is_empty()).then(|| ports.to_vec()),
    }
}

/// Whether `slice` is the placeholder a Service without endpoints keeps.
fn is_placeholder(slice: &EndpointSlice, placeholder: &EndpointSlice) -> bool {
    slice.endpoints.is_empty()
        && slice_ports(slice).is_empty()
        && slice.address_type == placeholder.address_type
        && slice.metadata.namespace == placeholder.metadata.namespace
        && slice.metadata.labels == placeholder.metadata.labels
        && slice.metadata.owner_references == placeholder.metadata.owner_references
}

/// The slices to write, sorted by what happens to them.
#[derive(Default)]
struct Changes {
    create: Vec<EndpointSlice>,
    update: Vec<EndpointSlice>,
    delete: Vec<EndpointSlice>,
}

fn fill(slice: &mut EndpointSlice, wanted: &mut Wanted) {
    while slice.endpoints.len() < MAX_ENDPOINTS_PER_SLICE
        && let Some((_, endpoint)) = wanted.pop_first()
    {
        slice.endpoints.push(endpoint);
    }
}

/// The writes for one set of ports (upstream's `reconcileByPortMapping`).
fn plan_ports(
    service: &Service,
    existing: &[&EndpointSlice],
    mut wanted: Wanted,
    ports: &[EndpointPort],
    changes: &mut Changes,
) {
    let mut by_name: BTreeMap<String, EndpointSlice> = BTreeMap::new();
    let (mut unchanged, mut to_update) = (BTreeSet::new(), BTreeSet::new());
    // 1. Keep the endpoints still wanted, updated in place; drop the others.
    for slice in existing {
        let name = slice.metadata.name.clone().unwrap_or_default();
        let mut kept = Vec::new();
        let mut endpoint_changed = false;
        for e in &slice.endpoints {
            if let Some(want) = wanted.remove(&endpoint_key(e)) {
                endpoint_changed |= want != *e;
                kept.push(want);
            }
        }
        let (labels, labels_changed) = slice_labels(Some(slice), service);
        let mut slice = (*slice).clone();
        if endpoint_changed || kept.len() != slice.endpoints.len() {
            if kept.is_empty() {
                changes.delete.push(slice);
                continue;
            }
            slice.endpoints = kept;
            slice.metadata.labels = Some(labels);
            to_update.insert(name.clone());
        } else if labels_changed {
            slice.metadata.labels = Some(labels);
            to_update.insert(name.clone());
        } else {
            unchanged.insert(name.clone());
        }
        by_name.insert(name, slice);
    }
    // 2. New endpoints go first into slices written anyway, the fullest first.
    let mut filling: Vec<&String> = to_update.iter().collect();
    filling.sort_by_key(|name| std::cmp::Reverse(by_name[*name].endpoints.len()));
    for name in filling {
        if let Some(slice) = by_name.get_mut(name) {
            fill(slice, &mut wanted);
        }
    }
    // 3. Then into the unchanged slice they fill most, if they all fit; else into new slices.
    while !wanted.is_empty() {
        let closest = (wanted.len() < MAX_ENDPOINTS_PER_SLICE)
            .then(|| {
                unchanged
                    .iter()
                    .filter(|name| by_name[*name].endpoints.len() + wanted.len() <= MAX_ENDPOINTS_PER_SLICE)
                    .max_by_key(|name| (by_name[*name].endpoints.len(), std::cmp::Reverse(*name)))
                    .cloned()
            })
            .flatten();
        match closest.and_then(|name| Some((by_name.get_mut(&name)?, name))) {
            Some((slice, name)) => {
                fill(slice, &mut wanted);
                unchanged.remove(&name);
                to_update.insert(name);
            }
            None => {
                let mut slice = new_slice(service, ports);
                fill(&mut slice, &mut wanted);
                changes.create.push(slice);
            }
        }
    }
    changes.update.extend(to_update.iter().filter_map(|name| by_name.remove(name)));
}

/// The writes that bring the EndpointSlices the controller manages for `service` (`existing`)
/// to the Pods it selects (`pods`). Creates get generated names (`<service>-xxxxx`), updates and
/// deletes compare-and-swap on the slices as read.
pub fn plan(service: &Service, pods: &[Pod], existing: &[EndpointSlice]) -> Vec<Op<EndpointSlice>> {
    // Slices of another address type go at the end; upstream's placeholder logic counts only
    // the slices of the address type it reconciles.
    let (ipv4, other_types): (Vec<&EndpointSlice>, Vec<&EndpointSlice>) =
        existing.iter().partition(|s| s.address_type == IPV4);
    let mut changes = Changes::default();
    let mut existing_by_ports: BTreeMap<PortsKey, Vec<&EndpointSlice>> = BTreeMap::new();
    for slice in &ipv4 {
        if owned_by(slice, service) {
            existing_by_ports.entry(ports_key(slice_ports(slice))).or_default().push(slice);
        } else {
            changes.delete.push((*slice).clone());
        }
    }
    let mut desired: BTreeMap<PortsKey, (Vec<EndpointPort>, Wanted)> = BTreeMap::new();
    for pod in pods.iter().filter(|p| pods::should_be_in_endpoints(p, true)) {
        let ports = endpoint_ports(service, pod);
        let endpoint = endpoint(service, pod);
        desired
            .entry(ports_key(&ports))
            .or_insert_with(|| (ports, Wanted::new()))
            .1
            .insert(endpoint_key(&endpoint), endpoint);
    }
    for (key, (ports, wanted)) in desired {
        let slices = existing_by_ports.remove(&key).unwrap_or_default();
        plan_ports(service, &slices, wanted, &ports, &mut changes);
    }
    // Sets of ports no Pod resolves any more.
    changes.delete.extend(existing_by_ports.into_values().flatten().cloned());
    if ipv4.len() == changes.delete.len() && changes.create.is_empty() {
        let placeholder = new_slice(service, &[]);
        match changes.delete.as_slice() {
            [only] if is_placeholder(only, &placeholder) => changes.delete.clear(),
            _ => changes.create.push(placeholder),
        }
    }
    finalize(service, changes, other_types)
}

/// Creates turned into updates of slices about to be deleted (fewer writes, stable names), then
/// the ops: creates, updates, deletes.
fn finalize(service: &Service, changes: Changes, other_types: Vec<&EndpointSlice>) -> Vec<Op<EndpointSlice>> {
    let Changes { mut create, mut update, delete } = changes;
    let mut deleted = Vec::new();
    for doomed in delete {
        if doomed.address_type == IPV4
            && owned_by(&doomed, service)
            && let Some(mut slice) = create.pop()
        {
            slice.metadata.name = doomed.metadata.name;
            slice.metadata.resource_version = doomed.metadata.resource_version;
            update.push(slice);
        } else {
            deleted.push(doomed);
        }
    }
    let service_name = service.metadata.name.as_deref().unwrap_or("service");
    create
        .into_iter()
        .map(|mut slice| {
            slice.metadata.name = Some(names::generate(service_name));
            Op::Create(slice)
        })
        .chain(update.into_iter().map(Op::Update))
        .chain(deleted.into_iter().chain(other_types.into_iter().cloned()).map(Op::Delete))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn service(spec: Value) -> Service {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "svc-1", "labels": {"app": "web"}},
            "spec": spec,
        }))
        .unwrap()
    }

    fn web() -> Service {
        service(json!({"clusterIP": "10.96.0.7", "selector": {"app": "web"},
                       "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}))
    }

    /// Pod `n` at 10.244.<n/200>.<n%200+1> on node n<n%3>, ready or not, serving `http` on 8080.
    fn pod(n: u32, ready: bool) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": format!("web-{n:03}"), "namespace": "default", "uid": format!("pod-{n}"),
                         "labels": {"app": "web"}, "resourceVersion": "5"},
            "spec": {"nodeName": format!("n{}", n % 3),
                     "containers": [{"name": "c", "image": "i", "ports": [{"name": "http", "containerPort": 8080}]}]},
            "status": {"phase": "Running", "podIP": format!("10.244.{}.{}", n / 200, n % 200 + 1),
                       "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}
        }))
        .unwrap()
    }

    fn pods(n: u32) -> Vec<Pod> {
        (0..n).map(|i| pod(i, true)).collect()
    }

    /// The store's view after applying `ops` to `existing`: names and resourceVersions kept.
    fn apply(existing: &[EndpointSlice], ops: Vec<Op<EndpointSlice>>) -> Vec<EndpointSlice> {
        let mut slices: BTreeMap<String, EndpointSlice> =
            existing.iter().map(|s| (s.metadata.name.clone().unwrap(), s.clone())).collect();
        for op in ops {
            match op {
                Op::Create(s) | Op::Update(s) => {
                    slices.insert(s.metadata.name.clone().unwrap(), s);
                }
                Op::Delete(s) => {
                    slices.remove(s.metadata.name.as_deref().unwrap());
                }
            }
        }
        slices.into_values().collect()
    }

    /// `create 80 x3`: what each op does, the slice's ports and how many endpoints it holds.
    fn describe(ops: &[Op<EndpointSlice>]) -> Vec<String> {
        let what = |s: &EndpointSlice| {
            let ports: Vec<String> = slice_ports(s).iter().map(|p| p.port.unwrap().to_string()).collect();
            format!("{} x{}", if ports.is_empty() { "-".into() } else { ports.join(",") }, s.endpoints.len())
        };
        ops.iter()
            .map(|op| match op {
                Op::Create(s) => format!("create {}", what(s)),
                Op::Update(s) => format!("update {} {}", s.metadata.name.as_deref().unwrap(), what(s)),
                Op::Delete(s) => format!("delete {}", s.metadata.name.as_deref().unwrap()),
            })
            .collect()
    }

    /// Slices as a fresh sync makes them, the fullest first, named `web-0`, `web-1`, … for the tests.
    fn synced(service: &Service, pods: &[Pod]) -> Vec<EndpointSlice> {
        let mut slices = apply(&[], plan(service, pods, &[]));
        slices.sort_by_key(|s| std::cmp::Reverse(s.endpoints.len()));
        for (i, s) in slices.iter_mut().enumerate() {
            s.metadata.name = Some(format!("web-{i}"));
            s.metadata.resource_version = Some("9".into());
        }
        slices
    }

    #[test]
    fn a_new_service_gets_kubernetes_shaped_slices() {
        let ops = plan(&web(), &[pod(1, true), pod(2, false)], &[]);
        assert_eq!(describe(&ops), ["create 8080 x2"]);
        let Op::Create(slice) = &ops[0] else { unreachable!() };
        let value = serde_json::to_value(slice).unwrap();
        assert!(value["metadata"]["name"].as_str().unwrap().starts_with("web-"));
        assert_eq!(
            value["metadata"]["labels"],
            json!({"app": "web", LABEL_SERVICE_NAME: "web", LABEL_MANAGED_BY: MANAGED_BY})
        );
        assert_eq!(
            value["metadata"]["ownerReferences"],
            json!([{"apiVersion": "v1", "kind": "Service", "name": "web", "uid": "svc-1",
                    "controller": true, "blockOwnerDeletion": true}])
        );
        assert_eq!(value["addressType"], "IPv4");
        assert_eq!(value["ports"], json!([{"name": "http", "port": 8080, "protocol": "TCP"}]));
        assert_eq!(
            value["endpoints"][0],
            json!({"addresses": ["10.244.0.2"], "conditions": {"ready": true, "serving": true, "terminating": false},
                   "nodeName": "n1", "targetRef": {"kind": "Pod", "namespace": "default", "name": "web-001", "uid": "pod-1"}})
        );
        assert_eq!(
            value["endpoints"][1]["conditions"],
            json!({"ready": false, "serving": false, "terminating": false})
        );
    }

    #[test]
    fn nothing_changed_writes_nothing() {
        let pods = pods(250);
        let slices = synced(&web(), &pods);
        assert_eq!(slices.iter().map(|s| s.endpoints.len()).collect::<Vec<_>>(), [100, 100, 50]);
        assert_eq!(describe(&plan(&web(), &pods, &slices)), Vec::<String>::new(), "a resync");
        let mut touched = pods.clone();
        touched[7].metadata.resource_version = Some("6".into());
        touched[7].metadata.annotations = Some([("note".to_owned(), "x".to_owned())].into());
        assert_eq!(describe(&plan(&web(), &touched, &slices)), Vec::<String>::new(), "an unrelated Pod change");
    }

    #[test]
    fn plan_table() {
        let pods250 = pods(250);
        let slices = synced(&web(), &pods250);
        // Which slice holds Pod 7, and which holds Pod 200.
        let holder = |n: u32| {
            let ip = format!("10.244.{}.{}", n / 200, n % 200 + 1);
            slices
                .iter()
                .find(|s| s.endpoints.iter().any(|e| e.addresses[0] == ip))
                .unwrap()
                .metadata
                .name
                .clone()
                .unwrap()
        };
        let (h7, h200) = (holder(7), holder(200));
        let unready: Vec<Pod> =
            pods250.iter().enumerate().map(|(i, p)| if i == 7 { pod(7, false) } else { p.clone() }).collect();
        let without_7: Vec<Pod> =
            pods250.iter().filter(|p| p.metadata.name.as_deref() != Some("web-007")).cloned().collect();
        let with_new: Vec<Pod> = pods250.iter().cloned().chain([pod(250, true)]).collect();
        let small = holder(200); // the slice of 50
        #[rustfmt::skip]
        let cases: Vec<(&str, Vec<Pod>, Vec<String>)> = vec![
            ("a Pod turns unready: only its slice", unready, vec![format!("update {h7} 8080 x100")]),
            ("a Pod goes: only its slice", without_7, vec![format!("update {h7} 8080 x99")]),
            ("a new Pod fills the unchanged slice it fits best", with_new, vec![format!("update {small} 8080 x51")]),
            ("every Pod goes: one slice stays as the empty placeholder", vec![],
             vec!["update web-0 - x0".into(), "delete web-1".into(), "delete web-2".into()]),
        ];
        assert_eq!(h200, small);
        for (what, pods, expected) in cases {
            let mut ops = describe(&plan(&web(), &pods, &slices));
            ops.sort();
            let mut expected = expected;
            expected.sort();
            assert_eq!(ops, expected, "{what}");
        }
    }

    #[test]
    fn named_ports_resolve_per_pod_and_group_pods() {
        let service = service(json!({"clusterIP": "10.96.0.7", "selector": {"app": "web"}, "ports": [
            {"name": "http", "port": 80, "targetPort": "http"}, {"name": "metrics", "port": 9090}]}));
        let mut other = pod(3, true);
        other.spec.as_mut().unwrap().containers[0].ports.as_mut().unwrap()[0].container_port = 8081;
        let mut bare = pod(4, true);
        bare.spec.as_mut().unwrap().containers[0].ports = None;
        let mut ops = describe(&plan(&service, &[pod(1, true), pod(2, true), other, bare], &[]));
        ops.sort();
        assert_eq!(ops, ["create 8080,9090 x2", "create 8081,9090 x1", "create 9090 x1"]);
        let only_named = web();
        let mut bare = pod(4, true);
        bare.spec.as_mut().unwrap().containers[0].ports = None;
        assert_eq!(
            describe(&plan(&only_named, &[pod(1, true), bare], &[])),
            ["create - x1", "create 8080 x1"],
            "a Pod without the named port is in a slice without ports, as upstream"
        );
    }

    #[test]
    fn placeholders_stale_owners_and_labels() {
        let empty = plan(&web(), &[], &[]);
        assert_eq!(describe(&empty), ["create - x0"], "a Service without Pods gets a placeholder");
        let placeholder = synced(&web(), &[]);
        assert_eq!(describe(&plan(&web(), &[], &placeholder)), Vec::<String>::new(), "and keeps it");
        assert_eq!(describe(&plan(&web(), &[pod(1, true)], &placeholder)), ["update web-0 8080 x1"]);

        let slices = synced(&web(), &pods(3));
        let mut recreated = web();
        recreated.metadata.uid = Some("svc-2".into());
        assert_eq!(
            describe(&plan(&recreated, &pods(3), &slices)),
            ["create 8080 x3", "delete web-0"],
            "slices of a Service of the same name that was deleted are not reused"
        );
        let mut relabelled = web();
        relabelled.metadata.labels =
            Some([("app".to_owned(), "web".to_owned()), ("tier".into(), "front".into())].into());
        let ops = plan(&relabelled, &pods(3), &slices);
        assert_eq!(describe(&ops), ["update web-0 8080 x3"]);
        let Op::Update(s) = &ops[0] else { unreachable!() };
        assert_eq!(s.metadata.labels.as_ref().unwrap()["tier"], "front");
    }

    #[test]
    fn terminating_and_headless_endpoints() {
        let mut leaving = pod(1, true);
        leaving.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::from_second(1).unwrap(),
        ));
        let e = endpoint(&web(), &leaving);
        let c = e.conditions.unwrap();
        assert_eq!((c.ready, c.serving, c.terminating), (Some(false), Some(true), Some(true)));

        let headless = service(json!({"clusterIP": "None", "selector": {"app": "web"}}));
        let mut named = pod(2, true);
        let spec = named.spec.as_mut().unwrap();
        spec.hostname = Some("db-0".into());
        spec.subdomain = Some("web".into());
        let ops = plan(&headless, &[named], &[]);
        let Op::Create(slice) = &ops[0] else { unreachable!() };
        assert_eq!(slice.endpoints[0].hostname.as_deref(), Some("db-0"));
        assert_eq!(slice.ports, None, "a headless Service without ports");
        assert_eq!(slice.metadata.labels.as_ref().unwrap()[LABEL_HEADLESS], "");
    }
}
