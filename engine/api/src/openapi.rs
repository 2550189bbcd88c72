//! The OpenAPI definitions of every kind the status API serves, from the same Rust types (and
//! the same schemars generator) as `schemas/`, in the two dialects the API server publishes:
//! v2 (`#/definitions/…`) and v3 (`#/components/schemas/…`). Each served kind's definition
//! carries `x-kubernetes-group-version-kind`, which `kubectl explain` looks kinds up by.

use k8s_openapi::api::{
    admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration},
    apps::v1::{ControllerRevision, DaemonSet, Deployment, ReplicaSet, StatefulSet},
    autoscaling::v2::HorizontalPodAutoscaler,
    batch::v1::{CronJob, Job},
    coordination::v1::Lease,
    core::v1::{
        ConfigMap, Endpoints, Event, Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod,
        ReplicationController, Secret, Service, ServiceAccount,
    },
    discovery::v1::EndpointSlice,
    networking::v1::{Ingress, IngressClass, NetworkPolicy},
    policy::v1::PodDisruptionBudget,
    rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding},
    storage::v1::StorageClass,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use kube_core::Resource;
use schemars::{
    JsonSchema,
    generate::{SchemaGenerator, SchemaSettings},
};
use serde_json::{Map, Value, json};

/// Which OpenAPI document the definitions are for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    /// Swagger 2.0: `/openapi/v2`.
    V2,
    /// OpenAPI 3.0: `/openapi/v3/...`.
    V3,
}

impl Dialect {
    /// Where a `$ref` points in this dialect.
    pub fn ref_prefix(self) -> &'static str {
        match self {
            Dialect::V2 => "#/definitions/",
            Dialect::V3 => "#/components/schemas/",
        }
    }
}

/// A served kind and the name of its definition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Root {
    pub group: String,
    pub version: String,
    pub kind: String,
    /// `io.k8s.api.apps.v1.Deployment`.
    pub definition: String,
}

/// Every served kind's definition and all they reference, keyed by definition name.
pub struct Definitions {
    pub schemas: Map<String, Value>,
    pub roots: Vec<Root>,
}

impl Definitions {
    /// The names of `roots`' definitions and every definition they reach through `$ref`.
    pub fn reachable<'a>(&self, roots: impl IntoIterator<Item = &'a Root>, dialect: Dialect) -> Vec<String> {
        let mut seen: Vec<String> = Vec::new();
        let mut pending: Vec<String> = roots.into_iter().map(|r| r.definition.clone()).collect();
        while let Some(name) = pending.pop() {
            if seen.contains(&name) {
                continue;
            }
            if let Some(schema) = self.schemas.get(&name) {
                refs(schema, dialect.ref_prefix(), &mut pending);
            }
            seen.push(name);
        }
        seen.sort();
        seen
    }
}

fn refs(value: &Value, prefix: &str, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            if let Some(name) = map.get("$ref").and_then(Value::as_str).and_then(|r| r.strip_prefix(prefix)) {
                out.push(name.to_owned());
            }
            map.values().for_each(|v| refs(v, prefix, out));
        }
        Value::Array(items) => items.iter().for_each(|v| refs(v, prefix, out)),
        _ => {}
    }
}

struct Builder {
    generator: SchemaGenerator,
    roots: Vec<Root>,
}

impl Builder {
    fn add<K: Resource<DynamicType = ()> + JsonSchema>(&mut self) {
        let reference = self.generator.subschema_for::<K>().to_value();
        let definition = reference["$ref"]
            .as_str()
            .and_then(|r| r.rsplit('/').next())
            .map(str::to_owned)
            .unwrap_or_else(|| K::schema_name().into_owned());
        self.roots.push(Root {
            group: K::group(&()).into_owned(),
            version: K::version(&()).into_owned(),
            kind: K::kind(&()).into_owned(),
            definition,
        });
    }
}

/// The definitions of the served kinds in `dialect`.
pub fn definitions(dialect: Dialect) -> Definitions {
    let settings = match dialect {
        Dialect::V2 => SchemaSettings::draft07().with(|s| {
            s.definitions_path = "/definitions".into();
            s.meta_schema = None;
        }),
        Dialect::V3 => SchemaSettings::openapi3().with(|s| s.meta_schema = None),
    };
    let mut b = Builder { generator: settings.into_generator(), roots: Vec::new() };
    b.add::<Pod>();
    b.add::<Service>();
    b.add::<Endpoints>();
    b.add::<ConfigMap>();
    b.add::<Secret>();
    b.add::<ServiceAccount>();
    b.add::<Event>();
    b.add::<Node>();
    b.add::<Namespace>();
    b.add::<Deployment>();
    b.add::<ReplicaSet>();
    b.add::<StatefulSet>();
    b.add::<ControllerRevision>();
    b.add::<DaemonSet>();
    b.add::<ReplicationController>();
    b.add::<Job>();
    b.add::<CronJob>();
    b.add::<HorizontalPodAutoscaler>();
    b.add::<EndpointSlice>();
    b.add::<Lease>();
    b.add::<Ingress>();
    b.add::<IngressClass>();
    b.add::<NetworkPolicy>();
    b.add::<PodDisruptionBudget>();
    b.add::<Role>();
    b.add::<ClusterRole>();
    b.add::<RoleBinding>();
    b.add::<ClusterRoleBinding>();
    b.add::<PersistentVolumeClaim>();
    b.add::<PersistentVolume>();
    b.add::<StorageClass>();
    b.add::<APIService>();
    b.add::<ValidatingWebhookConfiguration>();
    b.add::<MutatingWebhookConfiguration>();
    b.add::<crate::Application>();
    let metadata = b.generator.subschema_for::<ObjectMeta>().to_value();
    let mut schemas = b.generator.take_definitions(true);
    for root in &b.roots {
        let Some(schema) = schemas.get_mut(&root.definition).and_then(Value::as_object_mut) else { continue };
        // kube-derive leaves `metadata` out of custom resource schemas, as in `schemas/`.
        if let Some(properties) = schema.get_mut("properties").and_then(Value::as_object_mut) {
            properties.entry("metadata").or_insert_with(|| metadata.clone());
        }
        schema.insert(
            "x-kubernetes-group-version-kind".into(),
            json!([{"group": root.group, "version": root.version, "kind": root.kind}]),
        );
    }
    let mut schemas: Map<String, Value> = schemas.into_iter().map(|(name, s)| (qualified(&name), s)).collect();
    for root in &mut b.roots {
        root.definition = qualified(&root.definition);
    }
    for schema in schemas.values_mut() {
        tidy(schema, dialect);
    }
    Definitions { schemas, roots: b.roots }
}

/// gitplane's own definitions are named as the API server names a custom resource's:
/// `io.gitplane.v1.Application`, beside `io.k8s.api.apps.v1.Deployment`.
fn qualified(name: &str) -> String {
    if name.starts_with("io.k8s.") { name.to_owned() } else { format!("io.gitplane.v1.{name}") }
}

/// Qualifies gitplane's references, and leaves one `type` per schema as OpenAPI has it: derived
/// `Option`s come out as `["string", "null"]` or `anyOf: [{$ref}, {type: null}]`.
fn tidy(value: &mut Value, dialect: Dialect) {
    match value {
        Value::Object(map) => {
            if let Some(Value::String(r)) = map.get_mut("$ref")
                && let Some(name) = r.strip_prefix(dialect.ref_prefix())
            {
                *r = format!("{}{}", dialect.ref_prefix(), qualified(name));
            }
            if let Some(Value::Array(any_of)) = map.get("anyOf")
                && any_of.len() == 2
                && let Some(other) = any_of.iter().find(|s| s["type"] != "null")
                && any_of.iter().any(|s| s["type"] == "null")
            {
                let other = other.clone();
                map.remove("anyOf");
                // A reference keeps its siblings (the description) beside it, as `allOf`.
                map.insert("allOf".into(), json!([other]));
                if dialect == Dialect::V3 {
                    map.insert("nullable".into(), Value::Bool(true));
                }
            }
            if let Some(Value::Array(types)) = map.get("type") {
                let kept: Vec<Value> = types.iter().filter(|t| *t != "null").cloned().collect();
                let nullable = kept.len() < types.len();
                if kept.len() == 1 {
                    map.insert("type".into(), kept[0].clone());
                    if nullable && dialect == Dialect::V3 {
                        map.insert("nullable".into(), Value::Bool(true));
                    }
                }
            }
            map.values_mut().for_each(|v| tidy(v, dialect));
        }
        Value::Array(items) => items.iter_mut().for_each(|v| tidy(v, dialect)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_served_kind_carries_its_group_version_kind() {
        for dialect in [Dialect::V2, Dialect::V3] {
            let d = definitions(dialect);
            assert_eq!(d.roots.len(), 35);
            for root in &d.roots {
                let gvk = &d.schemas[&root.definition]["x-kubernetes-group-version-kind"][0];
                assert_eq!((gvk["kind"].as_str(), gvk["version"].as_str()), (Some(&*root.kind), Some(&*root.version)));
            }
            let deployment = &d.schemas["io.k8s.api.apps.v1.Deployment"];
            assert_eq!(deployment["x-kubernetes-group-version-kind"][0]["group"], "apps");
            let replicas = &d.schemas["io.k8s.api.apps.v1.DeploymentSpec"]["properties"]["replicas"];
            assert!(replicas["description"].as_str().unwrap().contains("desired pods"), "{replicas}");
        }
    }

    #[test]
    fn every_reference_resolves_in_its_dialect() {
        for dialect in [Dialect::V2, Dialect::V3] {
            let d = definitions(dialect);
            let all = d.reachable(&d.roots, dialect);
            for name in &all {
                assert!(d.schemas.contains_key(name), "{dialect:?}: {name} is referenced but not defined");
            }
            let text = serde_json::to_string(&d.schemas).unwrap();
            let other = if dialect == Dialect::V2 { Dialect::V3 } else { Dialect::V2 };
            assert!(!text.contains(other.ref_prefix()) && !text.contains("\"#/$defs/"), "{dialect:?}");
            assert!(!text.contains("\"null\""), "{dialect:?}: a null type is left");
        }
    }

    #[test]
    fn applications_have_metadata_and_their_own_group() {
        let d = definitions(Dialect::V3);
        let app = d.roots.iter().find(|r| r.kind == "Application").unwrap();
        assert_eq!(app.group, "gitplane.io");
        let schema = &d.schemas[&app.definition];
        assert!(schema["properties"]["metadata"].is_object(), "{schema}");
        assert!(schema["properties"]["spec"].is_object());
        let core: Vec<&str> = d.roots.iter().filter(|r| r.group.is_empty()).map(|r| r.kind.as_str()).collect();
        let reached = d.reachable(d.roots.iter().filter(|r| r.group.is_empty()), Dialect::V3);
        assert!(reached.iter().any(|n| n == "io.k8s.api.core.v1.PodSpec"), "{core:?}");
        assert!(!reached.iter().any(|n| n == "io.k8s.api.apps.v1.DeploymentSpec"));
    }
}
