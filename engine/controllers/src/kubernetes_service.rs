//! The `default/kubernetes` Service and its EndpointSlice, as kube-apiserver's endpoint
//! reconciler keeps them: a ClusterIP Service at the first address of the Service range (the
//! allocator keeps that address for it), port 443 `https`, whose endpoints are the API server's
//! addresses as Pods reach them. So a Pod's client finds the API at `kubernetes.default.svc`
//! (or `KUBERNETES_SERVICE_HOST`), through the node's Service rules like any other Service.
//!
//! The Service has no selector: the endpoints controller leaves it alone, and the slice carries
//! no managed-by label of its. Neither has an Application annotation: Git does not own them.

use crate::{Action, Context, ReconcileError, Reconciler};
use gitplane_api::object::kind_of;
use gitplane_store::{Event, ObjectKey, Op, informer::Cache};
use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use serde_json::{Value, json};
use std::net::{Ipv4Addr, SocketAddrV4};

pub const NAMESPACE: &str = "default";
pub const NAME: &str = "kubernetes";
/// The Service's port, as every Kubernetes cluster serves it.
pub const PORT: u16 = 443;

/// Where the API server is, for the Service.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ApiEndpoints {
    /// The first address of the Service range.
    pub cluster_ip: Option<Ipv4Addr>,
    /// The API server's addresses as Pods reach them; empty: the Service has no endpoints.
    pub addresses: Vec<SocketAddrV4>,
}

pub struct KubernetesServiceController {
    pub endpoints: ApiEndpoints,
}

fn service_key() -> ObjectKey {
    ObjectKey::of::<Service>(NAMESPACE, NAME)
}

fn slice_key() -> ObjectKey {
    ObjectKey::of::<EndpointSlice>(NAMESPACE, NAME)
}

/// The Service's managed fields.
fn desired_service(cluster_ip: Ipv4Addr, target_port: u16) -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": {"component": "apiserver", "provider": "kubernetes"}},
        "spec": {"type": "ClusterIP", "clusterIP": cluster_ip.to_string(), "clusterIPs": [cluster_ip.to_string()],
                 "sessionAffinity": "None", "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
                 "ports": [{"name": "https", "port": PORT, "protocol": "TCP", "targetPort": target_port}]}})
}

/// The slice's managed fields. Every address listens on the same port (the replicas' listener).
fn desired_slice(addresses: &[SocketAddrV4]) -> Value {
    let endpoints: Vec<Value> =
        addresses.iter().map(|a| json!({"addresses": [a.ip().to_string()], "conditions": {"ready": true}})).collect();
    let port = addresses.first().map_or(PORT, |a| a.port());
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": {"kubernetes.io/service-name": NAME}},
        "addressType": "IPv4", "endpoints": endpoints,
        "ports": [{"name": "https", "port": port, "protocol": "TCP"}]})
}

/// `current` with `desired`'s fields (its labels, its spec's fields, its other top-level
/// fields), or `None` when it has them already.
fn updated(current: &Value, desired: &Value) -> Option<Value> {
    let mut next = current.clone();
    for (field, value) in desired.as_object()?.iter().filter(|(f, _)| *f != "metadata") {
        match (field.as_str(), value.as_object()) {
            // Keep what the store defaults inside the spec; set what is managed here.
            ("spec", Some(spec)) => spec.iter().for_each(|(k, v)| next["spec"][k] = v.clone()),
            _ => next[field] = value.clone(),
        }
    }
    for (label, value) in desired["metadata"]["labels"].as_object()? {
        next["metadata"]["labels"][label] = value.clone();
    }
    // The stored resourceVersion stays: the update compares-and-swaps on what was read.
    (next != *current).then_some(next)
}

/// The writes that make the Service and its slice as `endpoints` says.
pub fn plan(endpoints: &ApiEndpoints, service: Option<&Value>, slice: Option<&Value>) -> Vec<Op> {
    let Some(cluster_ip) = endpoints.cluster_ip else { return Vec::new() };
    let target_port = endpoints.addresses.first().map_or(PORT, |a| a.port());
    let mut ops = Vec::new();
    for (desired, current) in
        [(desired_service(cluster_ip, target_port), service), (desired_slice(&endpoints.addresses), slice)]
    {
        match current {
            None => ops.push(Op::Create(desired)),
            Some(current) => ops.extend(updated(current, &desired).map(Op::Update)),
        }
    }
    ops
}

#[async_trait::async_trait]
impl Reconciler for KubernetesServiceController {
    fn name(&self) -> &'static str {
        "kubernetes-service"
    }

    fn keys_for(&self, event: &Event, _: &Cache) -> Vec<ObjectKey> {
        let key = &event.key;
        let ours = key.namespace == NAMESPACE
            && key.name == NAME
            && (key.kind == kind_of::<Service>() || key.kind == kind_of::<EndpointSlice>());
        if ours { vec![service_key()] } else { Vec::new() }
    }

    fn all_keys(&self, _: &Cache) -> Vec<ObjectKey> {
        vec![service_key()]
    }

    async fn reconcile(&self, _: &ObjectKey, ctx: &Context) -> Result<Action, ReconcileError> {
        let service = ctx.cache().get(&service_key());
        let slice = ctx.cache().get(&slice_key());
        if let Some(ip) = self.endpoints.cluster_ip
            && let Some(holder) = ctx.cache().list(&kind_of::<Service>(), None).iter().find(|s| {
                s["spec"]["clusterIP"] == ip.to_string() && ObjectKey::from_value(s).ok() != Some(service_key())
            })
        {
            // Given before the address was kept for the API server: said once a minute until
            // that Service leaves Git.
            let holder = ObjectKey::from_value(holder).map(|k| k.to_string()).unwrap_or_default();
            tracing::warn!(%ip, %holder, "the kubernetes Service's address is another Service's: it is not made");
            return Ok(Action::requeue(std::time::Duration::from_secs(60)));
        }
        let ops = plan(&self.endpoints, service.as_deref(), slice.as_deref());
        if ops.is_empty() {
            return Ok(Action::await_change());
        }
        tracing::info!(addresses = ?self.endpoints.addresses, "writing the kubernetes Service");
        ctx.commit(ops).await?;
        Ok(Action::await_change())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_service_points_at_the_api_server() {
        let endpoints = ApiEndpoints {
            cluster_ip: Some(Ipv4Addr::new(10, 96, 0, 1)),
            addresses: vec!["172.29.0.1:8443".parse().unwrap()],
        };
        let created = plan(&endpoints, None, None);
        let [Op::Create(service), Op::Create(slice)] = &created[..] else { panic!("{created:?}") };
        assert_eq!(service["spec"]["clusterIP"], "10.96.0.1");
        assert_eq!(
            service["spec"]["ports"],
            json!([{"name": "https", "port": 443, "protocol": "TCP", "targetPort": 8443}])
        );
        assert_eq!(slice["endpoints"][0]["addresses"], json!(["172.29.0.1"]));
        assert_eq!(slice["ports"][0]["port"], 8443);

        // Stored with defaults and a resourceVersion: nothing to do.
        let mut stored_service = service.clone();
        stored_service["metadata"]["resourceVersion"] = json!("7");
        stored_service["spec"]["internalTrafficPolicy"] = json!("Cluster");
        let stored_slice = slice.clone();
        assert!(plan(&endpoints, Some(&stored_service), Some(&stored_slice)).is_empty());

        // The API server moved: the slice follows, compare-and-swap on what was read.
        let moved = ApiEndpoints { addresses: vec!["172.29.0.2:8443".parse().unwrap()], ..endpoints.clone() };
        let mut stored_slice = slice.clone();
        stored_slice["metadata"]["resourceVersion"] = json!("9");
        let ops = plan(&moved, Some(&stored_service), Some(&stored_slice));
        let [Op::Update(slice)] = &ops[..] else { panic!("{ops:?}") };
        assert_eq!(slice["endpoints"][0]["addresses"], json!(["172.29.0.2"]));
        assert_eq!(slice["metadata"]["resourceVersion"], "9");

        // No Service range address known: nothing is written.
        assert!(plan(&ApiEndpoints::default(), None, None).is_empty());
    }
}
