//! What a Pod contributes to a Service's endpoints, as upstream's `k8s.io/endpointslice/util`
//! decides it: whether the Pod is in at all, its address, its readiness, its hostname, and each
//! Service port resolved against the Pod's own container ports.

use crate::replicaset::phase;
use k8s_openapi::api::core::v1::{Pod, Service, ServicePort};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::{Map, Value};
use std::net::Ipv4Addr;

/// The selector of a Service (as JSON) when the endpoint controllers manage its endpoints: not
/// for ExternalName Services, nor for Services without a selector (or with an empty one, which
/// would select every Pod of the namespace), whose endpoints are someone else's.
pub fn selector_of(service: &Value) -> Option<&Map<String, Value>> {
    if service["spec"]["type"] == "ExternalName" {
        return None;
    }
    service["spec"]["selector"].as_object().filter(|s| !s.is_empty())
}

/// Whether an object's `metadata.labels` (JSON) satisfy a Service's selector: a filter before
/// decoding.
pub fn selects(selector: &Map<String, Value>, labels: &Value) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// `clusterIP: None`.
pub fn is_headless(service: &Service) -> bool {
    service.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()) == Some("None")
}

/// Whether the Service has a virtual IP (upstream's `isServiceIPSet`): not headless, allocated.
pub fn has_cluster_ip(service: &Service) -> bool {
    service.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()).is_some_and(|ip| !ip.is_empty() && ip != "None")
}

pub fn publishes_not_ready(service: &Service) -> bool {
    service.spec.as_ref().and_then(|s| s.publish_not_ready_addresses).unwrap_or(false)
}

pub fn service_ports(service: &Service) -> &[ServicePort] {
    service.spec.as_ref().and_then(|s| s.ports.as_deref()).unwrap_or_default()
}

/// Being deleted (graceful termination has begun).
pub fn is_terminating(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

/// The Pod's IPv4 address (gitplane's Services are IPv4 only), from `podIPs` or `podIP`.
pub fn ipv4(pod: &Pod) -> Option<String> {
    let status = pod.status.as_ref()?;
    status
        .pod_ips
        .iter()
        .flatten()
        .map(|ip| ip.ip.as_str())
        .chain(status.pod_ip.as_deref())
        .find_map(|ip| ip.parse::<Ipv4Addr>().ok())
        .map(|ip| ip.to_string())
}

/// Upstream's `ShouldPodBeInEndpoints`: not finished, has an address, and (unless terminating
/// Pods are wanted) not terminating.
pub fn should_be_in_endpoints(pod: &Pod, include_terminating: bool) -> bool {
    !matches!(phase(pod), "Succeeded" | "Failed")
        && ipv4(pod).is_some()
        && (include_terminating || !is_terminating(pod))
}

/// Upstream's `ShouldSetHostname`: the Pod names a hostname and this Service as its subdomain.
pub fn hostname(pod: &Pod, service: &Service) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    let hostname = spec.hostname.as_deref().filter(|h| !h.is_empty())?;
    let same = spec.subdomain.as_deref() == service.metadata.name.as_deref()
        && pod.metadata.namespace == service.metadata.namespace;
    same.then(|| hostname.to_owned())
}

/// A protocol as the API server defaults it.
pub fn protocol(protocol: Option<&str>) -> &str {
    protocol.unwrap_or("TCP")
}

/// The Pod's port for a Service port (upstream's `FindPort`): a number as it is (the port
/// itself when unset, as the API server defaults it), a name looked up in the Pod's container
/// ports of the same protocol. `None` when the Pod has no such port: it then gets no endpoint
/// for that Service port.
pub fn target_port(pod: &Pod, port: &ServicePort) -> Option<i32> {
    match &port.target_port {
        None | Some(IntOrString::Int(0)) => Some(port.port),
        Some(IntOrString::String(name)) if name.is_empty() => Some(port.port),
        Some(IntOrString::Int(number)) => Some(*number),
        Some(IntOrString::String(name)) => {
            let wanted = protocol(port.protocol.as_deref());
            pod.spec
                .as_ref()?
                .containers
                .iter()
                .flat_map(|c| c.ports.iter().flatten())
                .find(|p| p.name.as_deref() == Some(name) && protocol(p.protocol.as_deref()) == wanted)
                .map(|p| p.container_port)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(value: Value) -> Pod {
        serde_json::from_value(value).unwrap()
    }

    fn port(value: Value) -> ServicePort {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn target_ports_resolve_per_pod() {
        let web = pod(json!({"metadata": {"name": "a"}, "spec": {"containers": [
            {"name": "c", "image": "i", "ports": [{"name": "http", "containerPort": 8080},
                                                   {"name": "dns", "containerPort": 5353, "protocol": "UDP"}]}]}}));
        let bare = pod(json!({"metadata": {"name": "b"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}));
        #[rustfmt::skip]
        let cases = [
            ("unset: the port itself", json!({"port": 80}), Some(80), Some(80)),
            ("a number", json!({"port": 80, "targetPort": 9376}), Some(9376), Some(9376)),
            ("a name", json!({"port": 80, "targetPort": "http"}), Some(8080), None),
            ("a name of another protocol", json!({"port": 53, "targetPort": "dns"}), None, None),
            ("a name and its protocol", json!({"port": 53, "targetPort": "dns", "protocol": "UDP"}), Some(5353), None),
            ("an unknown name", json!({"port": 80, "targetPort": "grpc"}), None, None),
        ];
        for (what, service_port, on_web, on_bare) in cases {
            let service_port = port(service_port);
            assert_eq!(target_port(&web, &service_port), on_web, "{what}");
            assert_eq!(target_port(&bare, &service_port), on_bare, "{what}");
        }
    }

    #[test]
    fn which_pods_are_in() {
        let with = |status: Value, deleting: bool| {
            let mut meta = json!({"name": "p"});
            if deleting {
                meta["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
            }
            pod(json!({"metadata": meta, "status": status}))
        };
        let running = json!({"phase": "Running", "podIP": "10.244.0.5"});
        assert!(should_be_in_endpoints(&with(running.clone(), false), false));
        assert!(!should_be_in_endpoints(&with(running.clone(), true), false), "terminating");
        assert!(should_be_in_endpoints(&with(running, true), true), "terminating, when wanted");
        assert!(!should_be_in_endpoints(&with(json!({"phase": "Pending"}), false), true), "no address yet");
        assert!(!should_be_in_endpoints(&with(json!({"phase": "Succeeded", "podIP": "10.244.0.5"}), false), true));
        let dual = with(json!({"podIPs": [{"ip": "fd00::5"}, {"ip": "10.244.0.6"}]}), false);
        assert_eq!(ipv4(&dual).as_deref(), Some("10.244.0.6"));
    }
}
