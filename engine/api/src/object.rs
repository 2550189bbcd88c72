//! Object identity and the untyped <-> typed boundary.
//!
//! The store holds objects as Kubernetes JSON; controllers work on k8s-openapi types. The key of
//! an object is (group kind, namespace, name), the group kind written as Kubernetes writes it
//! (`Deployment.apps`, `Pod` for the core group).

use kube_core::Resource;
use serde::{Serialize, de::DeserializeOwned};
use serde_json::Value;
use std::fmt;

/// The namespace of namespaced objects that name none.
pub const DEFAULT_NAMESPACE: &str = "default";
/// The namespace of gitplane's own objects (Applications, node Leases).
pub const SYSTEM_NAMESPACE: &str = "gitplane-system";
/// The namespace of the node Leases that node agents renew, as in Kubernetes.
pub const NODE_LEASE_NAMESPACE: &str = "kube-node-lease";
/// Annotation naming the Application that applied an object: the inventory used by prune.
pub const APPLICATION_ANNOTATION: &str = "gitplane.io/application";

/// Errors at the boundary between JSON and typed objects.
#[derive(Debug, thiserror::Error)]
pub enum ObjectError {
    #[error("object has no {0}")]
    Missing(&'static str),
    #[error("{kind}: {source}")]
    Decode {
        kind: String,
        #[source]
        source: serde_json::Error,
    },
}

/// The identity of a stored object.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct ObjectKey {
    /// Group kind, e.g. `Deployment.apps` or `Pod`.
    pub kind: String,
    /// Empty for cluster-scoped objects.
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub fn new(kind: impl Into<String>, namespace: impl Into<String>, name: impl Into<String>) -> Self {
        ObjectKey { kind: kind.into(), namespace: namespace.into(), name: name.into() }
    }

    /// The key of a typed object of kind `K`.
    pub fn of<K: Resource<DynamicType = ()>>(namespace: &str, name: &str) -> Self {
        ObjectKey::new(kind_of::<K>(), namespace, name)
    }

    /// The key of a JSON object, read from its apiVersion, kind and metadata.
    pub fn from_value(value: &Value) -> Result<Self, ObjectError> {
        let api_version = value["apiVersion"].as_str().ok_or(ObjectError::Missing("apiVersion"))?;
        let kind = value["kind"].as_str().ok_or(ObjectError::Missing("kind"))?;
        let name = value["metadata"]["name"].as_str().ok_or(ObjectError::Missing("metadata.name"))?;
        let namespace = value["metadata"]["namespace"].as_str().unwrap_or("");
        Ok(ObjectKey::new(group_kind(api_version, kind), namespace, name))
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{} {}", self.kind, self.name)
        } else {
            write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
        }
    }
}

/// `Deployment.apps` for (`apps/v1`, `Deployment`), `Pod` for (`v1`, `Pod`).
pub fn group_kind(api_version: &str, kind: &str) -> String {
    match api_version.split_once('/') {
        Some((group, _)) if !group.is_empty() => format!("{kind}.{group}"),
        _ => kind.to_owned(),
    }
}

/// The group kind of a typed resource.
pub fn kind_of<K: Resource<DynamicType = ()>>() -> String {
    group_kind(&K::api_version(&()), &K::kind(&()))
}

/// Serializes a typed object to the JSON the store holds (apiVersion and kind included).
pub fn to_value<K: Serialize>(object: &K) -> Value {
    serde_json::to_value(object).expect("k8s-openapi types always serialize")
}

/// Decodes a stored JSON object into its typed form.
pub fn from_value<K: Resource<DynamicType = ()> + DeserializeOwned>(value: Value) -> Result<K, ObjectError> {
    serde_json::from_value(value).map_err(|source| ObjectError::Decode { kind: kind_of::<K>(), source })
}

/// The resourceVersion of a JSON object as the store's revision.
pub fn resource_version(value: &Value) -> Option<i64> {
    value["metadata"]["resourceVersion"].as_str()?.parse().ok()
}

/// The resourceVersion of a typed object as the store's revision.
pub fn revision_of<K: Resource<DynamicType = ()>>(object: &K) -> Option<i64> {
    object.meta().resource_version.as_deref()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::{apps::v1::Deployment, core::v1::Pod};

    #[test]
    fn group_kinds_follow_kubernetes() {
        assert_eq!(kind_of::<Deployment>(), "Deployment.apps");
        assert_eq!(kind_of::<Pod>(), "Pod");
        assert_eq!(kind_of::<crate::Application>(), "Application.gitplane.io");
    }

    #[test]
    fn key_from_json() {
        let v = serde_json::json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "ns"}});
        assert_eq!(ObjectKey::from_value(&v).unwrap(), ObjectKey::new("Deployment.apps", "ns", "web"));
        let e = ObjectKey::from_value(&serde_json::json!({"apiVersion": "v1", "kind": "Pod"})).unwrap_err();
        assert_eq!(e.to_string(), "object has no metadata.name");
    }
}
