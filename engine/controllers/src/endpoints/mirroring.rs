//! EndpointSlices mirrored from a hand-written Endpoints of a Service without a selector, as
//! kube-controller-manager's endpointslicemirroring controller makes them: one slice per
//! subset (its addresses ready, its notReadyAddresses not), owned by the Endpoints and labelled
//! with the Service's name, so node agents route the ClusterIP to those addresses. An Endpoints
//! labelled `endpointslice.kubernetes.io/skip-mirror: "true"` is not mirrored.

use super::slices::{LABEL_MANAGED_BY, LABEL_SERVICE_NAME};
use crate::{names, owner::controller_ref, plan::Op};
use k8s_openapi::api::core::v1::{EndpointAddress, Endpoints};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

/// Upstream's value of the managed-by label on mirrored slices.
pub const MANAGED_BY: &str = "endpointslicemirroring-controller.k8s.io";
/// The label that keeps an Endpoints from being mirrored.
pub const LABEL_SKIP_MIRROR: &str = "endpointslice.kubernetes.io/skip-mirror";
/// Upstream's `--mirroring-max-endpoints-per-subset`: addresses past it are not mirrored.
pub const MAX_ENDPOINTS_PER_SUBSET: usize = 1000;

/// Whether a slice (as JSON) is mirrored for the Service named `service`.
pub fn is_mirrored_for(slice: &Value, service: &str) -> bool {
    let labels = &slice["metadata"]["labels"];
    labels[LABEL_MANAGED_BY] == MANAGED_BY && labels[LABEL_SERVICE_NAME] == service
}

/// Whether this Endpoints is to be mirrored (the Service exists and has no selector: the caller
/// knows).
pub fn mirrors(endpoints: &Endpoints) -> bool {
    endpoints.metadata.labels.as_ref().and_then(|l| l.get(LABEL_SKIP_MIRROR)).is_none_or(|v| v != "true")
}

fn endpoint(address: &EndpointAddress, ready: bool) -> Option<Endpoint> {
    // gitplane's Services are IPv4 only.
    address.ip.parse::<std::net::Ipv4Addr>().ok()?;
    Some(Endpoint {
        addresses: vec![address.ip.clone()],
        conditions: Some(EndpointConditions { ready: Some(ready), serving: Some(ready), terminating: Some(false) }),
        hostname: address.hostname.clone(),
        node_name: address.node_name.clone(),
        target_ref: address.target_ref.clone(),
        ..Default::default()
    })
}

/// The slices an Endpoints mirrors into, one per subset, without names.
pub fn desired(endpoints: &Endpoints) -> Vec<EndpointSlice> {
    let name = endpoints.metadata.name.clone().unwrap_or_default();
    let mut labels = endpoints.metadata.labels.clone().unwrap_or_default();
    labels.insert(LABEL_SERVICE_NAME.into(), name);
    labels.insert(LABEL_MANAGED_BY.into(), MANAGED_BY.into());
    let owner = controller_ref("v1", "Endpoints", &endpoints.metadata);
    endpoints
        .subsets
        .iter()
        .flatten()
        .map(|subset| {
            let ready = subset.addresses.iter().flatten().filter_map(|a| endpoint(a, true));
            let not_ready = subset.not_ready_addresses.iter().flatten().filter_map(|a| endpoint(a, false));
            let ports = subset.ports.iter().flatten().map(|p| EndpointPort {
                name: Some(p.name.clone().unwrap_or_default()),
                port: Some(p.port),
                protocol: Some(p.protocol.clone().unwrap_or_else(|| "TCP".into())),
                app_protocol: p.app_protocol.clone(),
            });
            EndpointSlice {
                metadata: ObjectMeta {
                    namespace: endpoints.metadata.namespace.clone(),
                    labels: Some(labels.clone()),
                    owner_references: Some(vec![owner.clone()]),
                    ..Default::default()
                },
                address_type: "IPv4".into(),
                endpoints: ready.chain(not_ready).take(MAX_ENDPOINTS_PER_SUBSET).collect(),
                ports: Some(ports.collect()),
            }
        })
        .collect()
}

/// The writes that make `existing` (the mirrored slices, by name) what `endpoints` mirrors:
/// slices reused in name order, updated only when they differ, the surplus deleted.
pub fn plan(endpoints: Option<&Endpoints>, existing: &[EndpointSlice]) -> Vec<Op<EndpointSlice>> {
    let wanted = endpoints.filter(|e| mirrors(e)).map(desired).unwrap_or_default();
    let mut existing: Vec<&EndpointSlice> = existing.iter().collect();
    existing.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let (count, mut ops) = (wanted.len(), Vec::new());
    let base = endpoints.and_then(|e| e.metadata.name.as_deref()).unwrap_or("endpoints");
    for (i, mut slice) in wanted.into_iter().enumerate() {
        match existing.get(i) {
            Some(old) => {
                let same = old.endpoints == slice.endpoints
                    && old.ports == slice.ports
                    && old.metadata.labels == slice.metadata.labels;
                if !same {
                    slice.metadata = ObjectMeta { labels: slice.metadata.labels, ..old.metadata.clone() };
                    ops.push(Op::Update(slice));
                }
            }
            None => {
                slice.metadata.name = Some(names::generate(base));
                ops.push(Op::Create(slice));
            }
        }
    }
    ops.extend(existing.into_iter().skip(count).map(|s| Op::Delete(s.clone())));
    ops
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn endpoints(subsets: Value, labels: Value) -> Endpoints {
        serde_json::from_value(json!({"metadata": {"name": "glusterfs-cluster", "namespace": "default", "uid": "u1",
            "labels": labels}, "subsets": subsets}))
        .unwrap()
    }

    fn describe(ops: &[Op<EndpointSlice>]) -> Vec<String> {
        ops.iter()
            .map(|op| {
                let (verb, s) = match op {
                    Op::Create(s) => ("create", s),
                    Op::Update(s) => ("update", s),
                    Op::Delete(s) => ("delete", s),
                };
                let addresses: Vec<String> = s
                    .endpoints
                    .iter()
                    .map(|e| {
                        format!(
                            "{}{}",
                            e.addresses[0],
                            if e.conditions.as_ref().unwrap().ready == Some(true) { "" } else { "?" }
                        )
                    })
                    .collect();
                let ports: Vec<i32> = s.ports.iter().flatten().filter_map(|p| p.port).collect();
                format!("{verb} {} {ports:?}", addresses.join(","))
            })
            .collect()
    }

    fn slice(name: &str, e: &Endpoints, i: usize) -> EndpointSlice {
        let mut s = desired(e).remove(i);
        s.metadata.name = Some(name.into());
        s
    }

    /// (what, endpoints, existing mirrored slices, the plan in words)
    type Case<'a> = (&'static str, Option<&'a Endpoints>, Vec<EndpointSlice>, Vec<&'static str>);

    #[test]
    fn plan_table() {
        let glusterfs = endpoints(
            json!([{"addresses": [{"ip": "192.0.2.10"}], "notReadyAddresses": [{"ip": "192.0.2.12"}], "ports": [{"port": 1}]},
                   {"addresses": [{"ip": "192.0.2.11"}], "ports": [{"port": 2}]}]),
            json!({}),
        );
        let skipped = endpoints(json!([{"addresses": [{"ip": "192.0.2.10"}]}]), json!({LABEL_SKIP_MIRROR: "true"}));
        let one = endpoints(json!([{"addresses": [{"ip": "192.0.2.10"}], "ports": [{"port": 1}]}]), json!({}));
        let current = vec![slice("a", &glusterfs, 0), slice("b", &glusterfs, 1)];
        #[rustfmt::skip]
        let cases: Vec<Case> = vec![
            ("a slice per subset, not-ready addresses not ready", Some(&glusterfs), vec![],
             vec!["create 192.0.2.10,192.0.2.12? [1]", "create 192.0.2.11 [2]"]),
            ("mirrored already: nothing to write", Some(&glusterfs), current.clone(), vec![]),
            ("a subset fewer: the surplus slice goes", Some(&one), current.clone(),
             vec!["update 192.0.2.10 [1]", "delete 192.0.2.11 [2]"]),
            ("skip-mirror", Some(&skipped), current.clone(),
             vec!["delete 192.0.2.10,192.0.2.12? [1]", "delete 192.0.2.11 [2]"]),
            ("no Endpoints (or the Service got a selector)", None, current,
             vec!["delete 192.0.2.10,192.0.2.12? [1]", "delete 192.0.2.11 [2]"]),
        ];
        for (what, e, existing, expected) in cases {
            assert_eq!(describe(&plan(e, &existing)), expected, "{what}");
        }
    }
}
