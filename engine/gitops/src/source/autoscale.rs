//! Replicas a HorizontalPodAutoscaler owns. Git stays the source of truth for everything else,
//! but a workload an HPA targets has its `spec.replicas` set by the HPA: the source applies Git's
//! value only when it creates the object, never reports the HPA's count as drift and never
//! reverts it (what Argo CD users write as `ignoreDifferences` on `/spec/replicas`). A commit
//! that sets both gets a warning saying the HPA's count wins. Pure.

use super::Warning;
use gitplane_api::object::{APPLICATION_ANNOTATION, group_kind};
use gitplane_source::Manifest;
use gitplane_store::ObjectKey;
use serde_json::Value;
use std::{borrow::Cow, collections::HashMap, sync::Arc};

/// The group kind of HorizontalPodAutoscalers.
pub const HPA: &str = "HorizontalPodAutoscaler.autoscaling";

/// The workload an HPA (as JSON) scales, by its store key.
fn target(hpa: &Value, namespace: &str) -> Option<ObjectKey> {
    let target = &hpa["spec"]["scaleTargetRef"];
    let kind = group_kind(target["apiVersion"].as_str().unwrap_or(""), target["kind"].as_str()?);
    Some(ObjectKey::new(kind, namespace, target["name"].as_str()?))
}

/// The workloads whose replicas an HPA owns, with that HPA: the commit's HPAs, and those of the
/// `stored` ones that other Applications keep (this Application's are as the commit has them).
pub fn scaled(manifests: &[Arc<Manifest>], stored: Vec<Arc<Value>>, app: &str) -> HashMap<ObjectKey, ObjectKey> {
    let from_git = manifests.iter().filter(|m| m.key.kind == HPA).map(|m| (m.key.clone(), m.value.clone()));
    let others = stored.into_iter().filter(|v| v["metadata"]["annotations"][APPLICATION_ANNOTATION] != app);
    let from_others = others.filter_map(|v| {
        let key = ObjectKey::from_value(&v).ok()?;
        Some((key, (*v).clone()))
    });
    from_git.chain(from_others).filter_map(|(hpa, value)| Some((target(&value, &hpa.namespace)?, hpa))).collect()
}

/// Git's object without `spec.replicas`: what the source manages of a workload an HPA scales.
pub fn without_replicas(value: &Value) -> Cow<'_, Value> {
    if value["spec"].get("replicas").is_none() {
        return Cow::Borrowed(value);
    }
    let mut owned = value.clone();
    if let Some(spec) = owned.get_mut("spec").and_then(Value::as_object_mut) {
        spec.remove("replicas");
    }
    Cow::Owned(owned)
}

/// A warning for each workload that sets `spec.replicas` in Git while an HPA scales it.
pub fn warnings(manifests: &[Arc<Manifest>], scaled: &HashMap<ObjectKey, ObjectKey>) -> Vec<Warning> {
    manifests
        .iter()
        .filter_map(|m| {
            let hpa = scaled.get(&m.key)?;
            let replicas = m.value["spec"].get("replicas").filter(|r| !r.is_null())?;
            Some(Warning {
                key: m.key.clone(),
                reason: "ReplicasOwnedByHorizontalPodAutoscaler",
                message: format!(
                    "{}:{}: {} sets spec.replicas ({replicas}) and {hpa} scales it: the HorizontalPodAutoscaler's \
                     count wins (Git's is used only to create the object); remove spec.replicas from Git",
                    m.file, m.line, m.key
                ),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gitplane_store::ObjectKey;
    use serde_json::json;

    fn manifest(value: Value, line: usize) -> Arc<Manifest> {
        let key = ObjectKey::from_value(&value).unwrap();
        Arc::new(Manifest { file: "app.yaml".into(), index: 0, line, key, value, warnings: Vec::new() })
    }

    fn hpa(name: &str, target: &str) -> Value {
        json!({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": name, "namespace": "default"},
               "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target}, "maxReplicas": 5}})
    }

    fn deployment(name: &str, replicas: Option<i64>) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": "default"},
               "spec": {"replicas": replicas, "selector": {}}})
    }

    #[test]
    fn the_hpa_owns_the_replicas_of_what_it_targets() {
        let manifests = vec![
            manifest(deployment("web", Some(3)), 1),
            manifest(deployment("api", None), 12),
            manifest(deployment("db", Some(1)), 20),
            manifest(hpa("web", "web"), 30),
            manifest(hpa("api", "api"), 40),
        ];
        let mut other = hpa("db", "db");
        other["metadata"]["annotations"] = json!({APPLICATION_ANNOTATION: "gitplane/other"});
        let mut own = hpa("gone", "web");
        own["metadata"]["annotations"] = json!({APPLICATION_ANNOTATION: "gitplane/demo"});
        let scaled = scaled(&manifests, vec![Arc::new(other), Arc::new(own)], "gitplane/demo");
        let mut targets: Vec<String> = scaled.keys().map(|k| k.name.clone()).collect();
        targets.sort();
        assert_eq!(targets, ["api", "db", "web"]);
        let warnings = warnings(&manifests, &scaled);
        let messages: Vec<&str> = warnings.iter().map(|w| w.message.as_str()).collect();
        assert_eq!(messages.len(), 2, "{messages:?}");
        assert!(
            messages[0].starts_with("app.yaml:1: Deployment.apps default/web sets spec.replicas (3) and HorizontalPodAutoscaler.autoscaling default/web scales it: the HorizontalPodAutoscaler's count wins"),
            "{}",
            messages[0]
        );
        assert_eq!(without_replicas(&deployment("web", Some(3)))["spec"], json!({"selector": {}}));
    }
}
