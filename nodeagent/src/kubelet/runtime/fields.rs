//! What the translations of a Pod share: its namespace, file-safe names, the downward API's
//! fields, `$(VAR)` expansion, and the error of a spec this node cannot run.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;

use super::config::RuntimeConfig;

/// Why a container's config cannot be made: shown as waiting reason
/// `CreateContainerConfigError` with this message, as kubelet does.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("pod has no metadata.uid")]
    MissingUid,
    #[error("{what} {value:?} cannot name a file on the node (empty, \"/\", \".\" or \"..\")")]
    UnsafeName { what: &'static str, value: String },
    #[error("pod has no spec")]
    MissingSpec,
    #[error("container {container:?} has no image")]
    MissingImage { container: String },
    #[error("{field}: {value:?} is not a quantity")]
    InvalidQuantity { field: String, value: String },
    #[error("{what} is not supported by this node yet")]
    Unsupported { what: String },
    /// A persistentVolumeClaim volume whose claim or volume the node does not hold (yet).
    #[error("volume {volume:?}: {why}")]
    UnboundClaim { volume: String, why: String },
    #[error(
        "volume {volume:?}: {kind} volumes are not supported by this node yet (emptyDir, hostPath, configMap, secret, \
         downwardAPI, projected and persistentVolumeClaim are)"
    )]
    UnsupportedVolume { volume: String, kind: String },
    #[error("container {container:?}: volumeMount {volume:?} names no volume of the pod")]
    UnknownVolume { container: String, volume: String },
    /// The kubelet's messages, word for word (`pod` is `name_namespace(uid)`).
    #[error("container's runAsUser breaks non-root policy (pod: {pod:?}, container: {container})")]
    RunAsUserRoot { pod: String, container: String },
    #[error("container has runAsNonRoot and image will run as root (pod: {pod:?}, container: {container})")]
    ImageRunsAsRoot { pod: String, container: String },
    #[error(
        "container has runAsNonRoot and image has non-numeric user ({user}), cannot verify user is non-root (pod: \
         {pod:?}, container: {container})"
    )]
    NonNumericUser { user: String, pod: String, container: String },
    /// A ConfigMap or Secret (or a key of one) that the container's environment reads.
    #[error("{message}")]
    MissingConfig { message: String },
}

pub fn pod_namespace(pod: &Pod) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or("default")
}

/// Names that become path components on the node (uid, namespace, pod, container, volume) come
/// from outside: refuse anything that could leave the directory it is joined to.
pub fn safe_name<'a>(what: &'static str, value: &'a str) -> Result<&'a str, SpecError> {
    let unsafe_name = value.is_empty() || value == "." || value == ".." || value.contains(['/', '\0']);
    if unsafe_name { Err(SpecError::UnsafeName { what, value: value.to_string() }) } else { Ok(value) }
}

/// The downward API fields an environment variable may reference.
pub(super) fn field_value(pod: &Pod, path: &str, cfg: &RuntimeConfig, pod_ips: &[String]) -> Option<String> {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    let from_map = |map: &Option<BTreeMap<String, String>>, key: &str| map.as_ref()?.get(key).cloned();
    if let Some(key) = path.strip_prefix("metadata.labels['").and_then(|k| k.strip_suffix("']")) {
        return Some(from_map(&meta.labels, key).unwrap_or_default());
    }
    if let Some(key) = path.strip_prefix("metadata.annotations['").and_then(|k| k.strip_suffix("']")) {
        return Some(from_map(&meta.annotations, key).unwrap_or_default());
    }
    Some(match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => pod_namespace(pod).to_string(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()).unwrap_or_default(),
        "spec.serviceAccountName" => spec.and_then(|s| s.service_account_name.clone()).unwrap_or_default(),
        "status.podIP" => pod_ips.first().cloned().unwrap_or_default(),
        "status.podIPs" => pod_ips.join(","),
        "status.hostIP" | "status.hostIPs" => cfg.node_ip.clone().unwrap_or_default(),
        _ => return None,
    })
}

/// Kubernetes' `$(VAR)` expansion: defined variables are replaced, undefined references are
/// kept verbatim, and `$$` escapes a `$`.
pub fn expand<'a>(input: &str, lookup: impl Fn(&str) -> Option<&'a str>) -> String {
    let mut out = String::with_capacity(input.len());
    let mut rest = input;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(')
            && let Some(close) = inner.find(')')
        {
            let name = &inner[..close];
            match lookup(name) {
                Some(value) => out.push_str(value),
                None => {
                    out.push_str("$(");
                    out.push_str(name);
                    out.push(')');
                }
            }
            rest = &inner[close + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}
