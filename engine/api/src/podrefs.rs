//! The ConfigMaps, Secrets and PersistentVolumeClaims a Pod reads, and the PersistentVolume a
//! claim holds: the edges of Kubernetes' node authorizer graph
//! (`plugin/pkg/auth/authorizer/node/graph_populator.go`). The control plane gives a node exactly
//! the objects its Pods reference; the node agent waits for the same set before it starts a Pod.

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use std::collections::BTreeSet;

/// The kinds a Pod may read through its spec, and the volumes its claims hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ConfigKind {
    ConfigMap,
    Secret,
    PersistentVolumeClaim,
    /// Cluster-scoped: its reference's namespace is empty.
    PersistentVolume,
}

impl ConfigKind {
    /// The store's group kind (also the object's `kind`).
    pub fn as_str(self) -> &'static str {
        match self {
            ConfigKind::ConfigMap => "ConfigMap",
            ConfigKind::Secret => "Secret",
            ConfigKind::PersistentVolumeClaim => "PersistentVolumeClaim",
            ConfigKind::PersistentVolume => "PersistentVolume",
        }
    }

    pub fn from_kind(kind: &str) -> Option<ConfigKind> {
        match kind {
            "ConfigMap" => Some(ConfigKind::ConfigMap),
            "Secret" => Some(ConfigKind::Secret),
            "PersistentVolumeClaim" => Some(ConfigKind::PersistentVolumeClaim),
            "PersistentVolume" => Some(ConfigKind::PersistentVolume),
            _ => None,
        }
    }
}

/// One referenced object, in the Pod's namespace (none for a PersistentVolume).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConfigRef {
    pub kind: ConfigKind,
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for ConfigRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}/{}", self.kind.as_str(), self.namespace, self.name)
    }
}

/// The ConfigMap of the cluster CA in every namespace.
pub const ROOT_CA_CONFIG_MAP: &str = "kube-root-ca.crt";

/// Every ConfigMap, Secret and PersistentVolumeClaim `pod` references: env valueFrom, envFrom,
/// configMap / secret / projected / persistentVolumeClaim volumes and imagePullSecrets, of all
/// containers (init and ephemeral included), and the cluster CA's `kube-root-ca.crt`, which its
/// ServiceAccount token volume projects unless the Pod turns automounting off.
pub fn config_refs(pod: &Pod) -> BTreeSet<ConfigRef> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let mut refs = BTreeSet::new();
    if let Some(spec) = &pod.spec {
        spec_refs(spec, &mut |kind, name: &str| {
            if !name.is_empty() {
                refs.insert(ConfigRef { kind, namespace: namespace.to_owned(), name: name.to_owned() });
            }
        });
        if spec.automount_service_account_token != Some(false) {
            let name = ROOT_CA_CONFIG_MAP.to_owned();
            refs.insert(ConfigRef { kind: ConfigKind::ConfigMap, namespace: namespace.to_owned(), name });
        }
    }
    refs
}

/// The volume a claim holds (its `volumeName`), the node's edge from claim to volume.
pub fn claim_volume(claim: &serde_json::Value) -> Option<ConfigRef> {
    let name = claim["spec"]["volumeName"].as_str().filter(|n| !n.is_empty())?;
    Some(ConfigRef { kind: ConfigKind::PersistentVolume, namespace: String::new(), name: name.to_owned() })
}

fn spec_refs(spec: &PodSpec, add: &mut impl FnMut(ConfigKind, &str)) {
    use ConfigKind::{ConfigMap, PersistentVolumeClaim, Secret};
    let containers = spec.containers.iter().chain(spec.init_containers.iter().flatten());
    let ephemeral = spec.ephemeral_containers.iter().flatten().map(|c| (c.env.as_ref(), c.env_from.as_ref()));
    for (env, env_from) in containers.map(|c: &Container| (c.env.as_ref(), c.env_from.as_ref())).chain(ephemeral) {
        for from in env.into_iter().flatten().filter_map(|e| e.value_from.as_ref()) {
            if let Some(r) = &from.config_map_key_ref {
                add(ConfigMap, &r.name);
            }
            if let Some(r) = &from.secret_key_ref {
                add(Secret, &r.name);
            }
        }
        for from in env_from.into_iter().flatten() {
            if let Some(r) = &from.config_map_ref {
                add(ConfigMap, &r.name);
            }
            if let Some(r) = &from.secret_ref {
                add(Secret, &r.name);
            }
        }
    }
    for volume in spec.volumes.iter().flatten() {
        if let Some(cm) = &volume.config_map {
            add(ConfigMap, &cm.name);
        }
        if let Some(name) = volume.secret.as_ref().and_then(|s| s.secret_name.as_deref()) {
            add(Secret, name);
        }
        if let Some(claim) = &volume.persistent_volume_claim {
            add(PersistentVolumeClaim, &claim.claim_name);
        }
        for source in volume.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
            if let Some(cm) = &source.config_map {
                add(ConfigMap, &cm.name);
            }
            if let Some(secret) = &source.secret {
                add(Secret, &secret.name);
            }
        }
    }
    for secret in spec.image_pull_secrets.iter().flatten() {
        add(Secret, &secret.name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_of_reference_counts_once() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "shop"},
            "spec": {
                "initContainers": [{"name": "i", "envFrom": [{"secretRef": {"name": "init-secret"}}]}],
                "containers": [{"name": "c", "env": [
                    {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "a"}}},
                    {"name": "B", "valueFrom": {"secretKeyRef": {"name": "s", "key": "b"}}},
                    {"name": "C", "value": "plain"}
                ], "envFrom": [{"configMapRef": {"name": "cm"}, "prefix": "X_"}]}],
                "volumes": [
                    {"name": "v1", "configMap": {"name": "files"}},
                    {"name": "v2", "secret": {"secretName": "tls"}},
                    {"name": "v3", "projected": {"sources": [{"configMap": {"name": "p-cm"}}, {"secret": {"name": "p-s"}}]}},
                    {"name": "v4", "emptyDir": {}},
                    {"name": "v5", "persistentVolumeClaim": {"claimName": "data"}}
                ]
            }
        }))
        .unwrap();
        let shown: Vec<String> = config_refs(&pod).iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "ConfigMap shop/cm",
                "ConfigMap shop/files",
                "ConfigMap shop/kube-root-ca.crt",
                "ConfigMap shop/p-cm",
                "Secret shop/init-secret",
                "Secret shop/p-s",
                "Secret shop/s",
                "Secret shop/tls",
                "PersistentVolumeClaim shop/data",
            ]
        );
        assert!(config_refs(&Pod::default()).is_empty());
        let no_token: Pod = serde_json::from_value(
            serde_json::json!({"spec": {"automountServiceAccountToken": false, "containers": []}}),
        )
        .unwrap();
        assert!(config_refs(&no_token).is_empty(), "no token volume, no CA");
    }
}
