//! Whether the Ingress can still reach the Pods a commit's NetworkPolicies isolate. The Ingress
//! proxy runs on every node: a Pod's own node always reaches it, but a request that arrives on
//! another node comes from that node's address, which a policy must allow. A policy that
//! isolates Pods behind an Ingress without allowing the node addresses makes those requests
//! time out; the plan warns about it (the push prints it, the sync records it as an Event).
//! Pure: the commit's objects and the nodes' addresses in, warnings out.

use super::Warning;
use gitplane_api::labels::{self, Labels};
use gitplane_source::Manifest;
use k8s_openapi::api::{
    core::v1::Service,
    networking::v1::{Ingress, NetworkPolicy, NetworkPolicyPeer},
};
use serde_json::Value;
use std::{collections::BTreeSet, net::Ipv4Addr, sync::Arc};

/// The Event reason of a [`Warning`].
pub const REASON: &str = "IngressBlockedByPolicy";

/// The warnings for `manifests` on a cluster whose nodes have `node_ips` (asked for only when
/// the commit has both a NetworkPolicy and an Ingress).
pub fn ingress_blocked(manifests: &[Arc<Manifest>], node_ips: impl FnOnce() -> Vec<Ipv4Addr>) -> Vec<Warning> {
    let of = |kind: &'static str| manifests.iter().filter(move |m| m.key.kind == kind);
    // Most commits have no NetworkPolicy or no Ingress: nothing is decoded for them.
    if of("NetworkPolicy.networking.k8s.io").next().is_none() || of("Ingress.networking.k8s.io").next().is_none() {
        return Vec::new();
    }
    let node_ips = &node_ips();
    let ingresses: Vec<(String, Ingress)> =
        of("Ingress.networking.k8s.io").filter_map(|m| Some((m.key.namespace.clone(), decode(m)?))).collect();
    let services: Vec<(String, Service)> =
        of("Service").filter_map(|m| Some((m.key.namespace.clone(), decode(m)?))).collect();
    let pods: Vec<(String, Labels)> = manifests.iter().filter_map(|m| pod_labels(m)).collect();
    let mut warnings = Vec::new();
    for policy_manifest in of("NetworkPolicy.networking.k8s.io") {
        let Some(policy) = decode::<NetworkPolicy>(policy_manifest) else { continue };
        let namespace = &policy_manifest.key.namespace;
        let Some(spec) = policy.spec.as_ref() else { continue };
        let isolates_ingress = spec.policy_types.as_ref().is_none_or(|types| types.iter().any(|t| t == "Ingress"));
        if !isolates_ingress || allows_nodes(spec.ingress.as_deref().unwrap_or_default(), node_ips) {
            continue;
        }
        let mut blocked: BTreeSet<(String, String)> = BTreeSet::new();
        for (ns, ingress) in ingresses.iter().filter(|(ns, _)| ns == namespace) {
            for service in backends(ingress) {
                let Some(selector) = services
                    .iter()
                    .find(|(s_ns, s)| s_ns == ns && s.metadata.name.as_deref() == Some(service.as_str()))
                    .and_then(|(_, s)| s.spec.as_ref()?.selector.clone())
                else {
                    continue;
                };
                let isolated = pods.iter().any(|(pod_ns, pod)| {
                    pod_ns == namespace
                        && !selector.is_empty()
                        && selector.iter().all(|(k, v)| pod.get(k) == Some(v))
                        && labels::matches(&spec.pod_selector.clone().unwrap_or_default(), pod)
                });
                if isolated {
                    blocked.insert((ingress.metadata.name.clone().unwrap_or_default(), service));
                }
            }
        }
        if let Some((ingress, service)) = blocked.first() {
            warnings.push(Warning {
                key: policy_manifest.key.clone(),
                reason: REASON,
                message: format!(
                    "NetworkPolicy {namespace}/{} isolates the Pods of Service {service}, which Ingress {ingress} \
                     routes to, and allows no traffic from the node addresses{}: requests that reach the \
                     Ingress on another node than the Pod's will time out. Allow the nodes in an ingress \
                     rule, e.g. `from: [{{ipBlock: {{cidr: {}}}}}]`",
                    policy_manifest.key.name,
                    shown(node_ips),
                    covering(node_ips),
                ),
            });
        }
    }
    warnings
}

fn decode<T: serde::de::DeserializeOwned>(m: &Arc<Manifest>) -> Option<T> {
    serde_json::from_value(m.value.clone()).ok()
}

/// The Services an Ingress routes to.
fn backends(ingress: &Ingress) -> BTreeSet<String> {
    let Some(spec) = ingress.spec.as_ref() else { return BTreeSet::new() };
    let paths = spec.rules.iter().flatten().filter_map(|r| r.http.as_ref()).flat_map(|h| &h.paths);
    paths
        .map(|p| &p.backend)
        .chain(spec.default_backend.as_ref())
        .filter_map(|b| b.service.as_ref().map(|s| s.name.clone()))
        .collect()
}

/// The labels of the Pods a manifest makes (a Pod, or a workload's Pod template).
fn pod_labels(m: &Manifest) -> Option<(String, Labels)> {
    let metadata = match m.key.kind.as_str() {
        "Pod" => &m.value["metadata"],
        "Deployment.apps" | "ReplicaSet.apps" | "StatefulSet.apps" | "DaemonSet.apps" | "Job.batch" => {
            &m.value["spec"]["template"]["metadata"]
        }
        "CronJob.batch" => &m.value["spec"]["jobTemplate"]["spec"]["template"]["metadata"],
        _ => return None,
    };
    let labels: Labels = serde_json::from_value(metadata["labels"].clone()).unwrap_or_default();
    Some((m.key.namespace.clone(), labels))
}

/// Whether some ingress rule admits every node address: a rule without peers (every source) or
/// with ipBlocks that hold each node. With no node known, only a rule for every source.
fn allows_nodes(rules: &[k8s_openapi::api::networking::v1::NetworkPolicyIngressRule], nodes: &[Ipv4Addr]) -> bool {
    rules.iter().any(|rule| {
        let peers = rule.from.as_deref().unwrap_or_default();
        peers.is_empty() || (!nodes.is_empty() && nodes.iter().all(|ip| peers.iter().any(|p| holds(p, *ip))))
    })
}

/// Whether a peer's ipBlock holds `ip` (outside its exceptions).
fn holds(peer: &NetworkPolicyPeer, ip: Ipv4Addr) -> bool {
    let Some(block) = peer.ip_block.as_ref() else { return false };
    let within = |cidr: &str| {
        let Some((address, prefix)) = cidr.split_once('/') else { return false };
        let (Ok(address), Ok(prefix)) = (address.parse::<Ipv4Addr>(), prefix.parse::<u32>()) else { return false };
        let mask = u32::MAX.checked_shl(32u32.saturating_sub(prefix)).unwrap_or(0);
        prefix <= 32 && u32::from(ip) & mask == u32::from(address) & mask
    };
    within(&block.cidr) && !block.except.iter().flatten().any(|e| within(e))
}

fn shown(nodes: &[Ipv4Addr]) -> String {
    match nodes {
        [] => String::new(),
        _ => format!(" ({})", nodes.iter().map(Ipv4Addr::to_string).collect::<Vec<_>>().join(", ")),
    }
}

/// The smallest CIDR that holds every node address (`<node address>/32` for one node).
fn covering(nodes: &[Ipv4Addr]) -> String {
    let Some(first) = nodes.first() else { return "<the nodes' addresses>/32".into() };
    let first = u32::from(*first);
    let differ = nodes.iter().fold(0u32, |acc, ip| acc | (u32::from(*ip) ^ first));
    let prefix = differ.leading_zeros();
    let mask = if prefix == 0 { 0 } else { u32::MAX << (32 - prefix) };
    format!("{}/{prefix}", Ipv4Addr::from(first & mask))
}

/// The InternalIPs of the stored Nodes.
pub fn node_ips(nodes: &[Arc<Value>]) -> Vec<Ipv4Addr> {
    let mut ips: Vec<Ipv4Addr> = nodes
        .iter()
        .flat_map(|n| n["status"]["addresses"].as_array().cloned().unwrap_or_default())
        .filter(|a| a["type"] == "InternalIP")
        .filter_map(|a| a["address"].as_str()?.parse().ok())
        .collect();
    ips.sort();
    ips.dedup();
    ips
}

#[cfg(test)]
mod tests {
    use super::*;
    use gitplane_source::{Limits, ManifestFile, Validator};

    fn manifests(yaml: &str) -> Vec<Arc<Manifest>> {
        let files = [ManifestFile::new("app.yaml", yaml.as_bytes().to_vec())];
        let loaded = gitplane_source::load(&files, &Validator::new(), "default", &Limits::default());
        loaded.expect("valid").into_iter().map(Arc::new).collect()
    }

    const APP: &str = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec:\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n    spec: {containers: [{name: web, image: httpd}]}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec:\n  selector: {app: web}\n  ports: [{port: 80}]\n---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: shop}\nspec:\n  rules: [{http: {paths: [{path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}]}}]\n";

    fn policy(ingress: &str) -> String {
        format!(
            "---\napiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: lock}}\nspec:\n  podSelector: {{matchLabels: {{app: web}}}}\n  policyTypes: [Ingress]\n{ingress}"
        )
    }

    #[test]
    fn a_policy_that_shuts_the_ingress_out_is_named_with_what_to_allow() {
        let nodes: Vec<Ipv4Addr> = vec!["172.29.0.11".parse().unwrap(), "172.29.0.12".parse().unwrap()];
        let only_clients = "  ingress: [{from: [{podSelector: {matchLabels: {role: client}}}]}]\n";
        let warnings = ingress_blocked(&manifests(&format!("{APP}{}", policy(only_clients))), || nodes.clone());
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert_eq!(warnings[0].key.to_string(), "NetworkPolicy.networking.k8s.io default/lock");
        let message = &warnings[0].message;
        assert!(message.contains("Service web, which Ingress shop routes to"), "{message}");
        assert!(message.contains("(172.29.0.11, 172.29.0.12)") && message.contains("cidr: 172.29.0.8/29"), "{message}");
        // Allowed: the nodes' block, every source, or a policy for other Pods.
        for fine in [
            policy("  ingress: [{from: [{ipBlock: {cidr: 172.29.0.0/24}}]}]\n"),
            policy("  ingress: [{}]\n"),
            policy("").replace("app: web}}", "app: db}}"),
        ] {
            assert_eq!(ingress_blocked(&manifests(&format!("{APP}{fine}")), || nodes.clone()), [], "{fine}");
        }
        // A block with the nodes as exceptions does not admit them.
        let except = policy("  ingress: [{from: [{ipBlock: {cidr: 172.29.0.0/24, except: [172.29.0.12/32]}}]}]\n");
        assert_eq!(ingress_blocked(&manifests(&format!("{APP}{except}")), || nodes.clone()).len(), 1);
    }

    #[test]
    fn the_covering_block() {
        let ips = |list: &[&str]| list.iter().map(|s| s.parse().unwrap()).collect::<Vec<Ipv4Addr>>();
        assert_eq!(covering(&ips(&["10.0.0.5"])), "10.0.0.5/32");
        assert_eq!(covering(&ips(&["172.29.0.11", "172.29.0.12"])), "172.29.0.8/29");
        assert_eq!(covering(&ips(&["10.0.0.1", "10.0.1.1"])), "10.0.0.0/23");
    }
}
