//! Strict JSON Schemas generated from the Rust types.
//!
//! k8s-openapi's schemas follow the OpenAPI document, which allows unknown fields and leaves
//! int-or-string values untyped. `kubectl --validate=strict` rejects unknown fields, and so do
//! we: every object schema with declared properties gets `additionalProperties: false`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube_core::Resource;
use schemars::{JsonSchema, generate::SchemaSettings};
use serde_json::{Map, Value, json};

/// The strict schema of kind `K`, pinned to its apiVersion and kind, with a required name.
pub fn strict_schema<K: Resource<DynamicType = ()> + JsonSchema>() -> Value {
    let mut generator = SchemaSettings::draft2020_12().into_generator();
    // kube-derive leaves `metadata` out of custom resource schemas; every kind has one.
    let metadata = generator.subschema_for::<ObjectMeta>().to_value();
    let mut schema = generator.root_schema_for::<K>().to_value();
    if let Some(properties) = schema.get_mut("properties").and_then(Value::as_object_mut) {
        properties.entry("metadata").or_insert(metadata);
    }
    make_strict(&mut schema);
    let root = schema.as_object_mut().expect("a root schema is an object");
    root.insert("title".into(), Value::String(K::kind(&()).into_owned()));
    let properties =
        root.entry("properties").or_insert_with(|| json!({})).as_object_mut().expect("properties is an object");
    properties.insert("apiVersion".into(), json!({ "const": K::api_version(&()) }));
    properties.insert("kind".into(), json!({ "const": K::kind(&()) }));
    if let Some(metadata) = properties.get_mut("metadata").and_then(Value::as_object_mut) {
        metadata.insert("required".into(), json!(["name"]));
    }
    root.insert("required".into(), json!(["apiVersion", "kind", "metadata"]));
    schema
}

fn make_strict(value: &mut Value) {
    match value {
        Value::Object(map) => {
            tighten(map);
            map.values_mut().for_each(make_strict);
        }
        Value::Array(items) => items.iter_mut().for_each(make_strict),
        _ => {}
    }
}

fn tighten(map: &mut Map<String, Value>) {
    if map.contains_key("properties") && !map.contains_key("additionalProperties") {
        map.insert("additionalProperties".into(), Value::Bool(false));
    }
    // Quantities are written `cpu: 1`, `cpu: 0.5` or `memory: 64Mi`; ports `8080` or `http`.
    if map.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true)) && !map.contains_key("type") {
        let numeric = if is_quantity(map) { "number" } else { "integer" };
        map.insert("type".into(), json!([numeric, "string"]));
    }
}

fn is_quantity(map: &Map<String, Value>) -> bool {
    map.get("description").and_then(Value::as_str).is_some_and(|d| d.starts_with("Quantity is a fixed-point"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::apps::v1::Deployment;

    fn errors(instance: Value) -> Vec<String> {
        let schema = strict_schema::<Deployment>();
        let validator = jsonschema::validator_for(&schema).unwrap();
        validator.iter_errors(&instance).map(|e| format!("{}: {}", e.instance_path(), e)).collect()
    }

    fn deployment(spec: Value) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}, "spec": spec})
    }

    #[test]
    fn accepts_a_valid_deployment() {
        let spec = json!({
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{
                "name": "web", "image": "gitplane.local/httpd:1",
                "ports": [{"containerPort": 80}],
                "resources": {"requests": {"cpu": 0.5, "memory": "64Mi"}, "limits": {"cpu": "1"}}
            }]}}
        });
        assert_eq!(errors(deployment(spec)), Vec::<String>::new());
    }

    #[test]
    fn rejects_wrong_types_and_unknown_fields() {
        let spec = json!({"replicas": "two", "selector": {}, "replicass": 1, "template": {}});
        let errs = errors(deployment(spec));
        assert!(
            errs.iter().any(|e| e.starts_with("/spec/replicas: ") && e.contains("\"two\" is not of type \"integer\"")),
            "{errs:?}"
        );
        assert!(errs.iter().any(|e| e.starts_with("/spec: ") && e.contains("replicass")), "{errs:?}");
    }

    #[test]
    fn applications_have_metadata() {
        let schema = strict_schema::<crate::Application>();
        let validator = jsonschema::validator_for(&schema).unwrap();
        let app = json!({"apiVersion": "gitplane.io/v1", "kind": "Application",
                         "metadata": {"name": "demo", "namespace": "gitplane-system"}, "spec": {"repo": "demo"}});
        assert!(
            validator.is_valid(&app),
            "{:?}",
            validator.iter_errors(&app).map(|e| e.to_string()).collect::<Vec<_>>()
        );
        let nameless =
            json!({"apiVersion": "gitplane.io/v1", "kind": "Application", "metadata": {}, "spec": {"repo": "x"}});
        assert!(!validator.is_valid(&nameless));
    }

    #[test]
    fn pins_kind_and_requires_a_name() {
        let errs = errors(json!({"apiVersion": "v1", "kind": "Deployment", "metadata": {}}));
        assert!(errs.iter().any(|e| e.starts_with("/apiVersion")), "{errs:?}");
        assert!(errs.iter().any(|e| e.starts_with("/metadata") && e.contains("name")), "{errs:?}");
    }
}
