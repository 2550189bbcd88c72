//! The ClusterRoles and ClusterRoleBindings every cluster has, by their upstream names, as
//! kube-apiserver's bootstrap policy makes them, so published bindings to them work:
//! `cluster-admin` (everything; here that is every read, since Git is the only writer), `view`
//! (aggregated from the roles labelled `rbac.authorization.k8s.io/aggregate-to-view`, upstream's
//! `system:aggregate-to-view` among them: reads of everything but Secrets) and
//! `system:discovery` (the discovery paths, bound to every authenticated user).
//!
//! Kept as made (annotated `rbac.authorization.kubernetes.io/autoupdate: "true"`, as upstream
//! reconciles them); one that Git owns is Git's.

use crate::{Action, Context, ReconcileError, Reconciler};
use gitplane_api::object::{APPLICATION_ANNOTATION, kind_of};
use gitplane_store::{Event, ObjectKey, Op, informer::Cache};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use serde_json::{Value, json};

const GROUP_VERSION: &str = "rbac.authorization.k8s.io/v1";

fn metadata(name: &str, labels: Value) -> Value {
    let mut labels = labels;
    labels["kubernetes.io/bootstrapping"] = json!("rbac-defaults");
    json!({"name": name, "labels": labels, "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"}})
}

/// Every bootstrap object, as it should be.
pub fn desired() -> Vec<Value> {
    let read = json!(["get", "list", "watch"]);
    let core = json!([
        "configmaps",
        "endpoints",
        "persistentvolumeclaims",
        "pods",
        "pods/log",
        "pods/status",
        "replicationcontrollers",
        "services",
        "services/status",
        "serviceaccounts",
        "events",
        "namespaces",
        "namespaces/status",
        "limitranges",
        "resourcequotas",
        "bindings"
    ]);
    vec![
        json!({"apiVersion": GROUP_VERSION, "kind": "ClusterRole", "metadata": metadata("cluster-admin", json!({})),
            "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
                      {"nonResourceURLs": ["*"], "verbs": ["*"]}]}),
        json!({"apiVersion": GROUP_VERSION, "kind": "ClusterRole", "metadata": metadata("view", json!({})),
            "aggregationRule": {"clusterRoleSelectors": [
                {"matchLabels": {"rbac.authorization.k8s.io/aggregate-to-view": "true"}}]}}),
        json!({"apiVersion": GROUP_VERSION, "kind": "ClusterRole",
        "metadata": metadata("system:aggregate-to-view", json!({"rbac.authorization.k8s.io/aggregate-to-view": "true"})),
        "rules": [
            {"apiGroups": [""], "resources": core, "verbs": read},
            {"apiGroups": ["apps"], "resources": ["daemonsets", "deployments", "deployments/scale", "replicasets",
                "replicasets/scale", "statefulsets", "statefulsets/scale"], "verbs": read},
            {"apiGroups": ["batch"], "resources": ["cronjobs", "jobs"], "verbs": read},
            {"apiGroups": ["autoscaling"], "resources": ["horizontalpodautoscalers"], "verbs": read},
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": read},
            {"apiGroups": ["networking.k8s.io"], "resources": ["ingresses", "ingresses/status", "networkpolicies"],
             "verbs": read},
            {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": read},
        ]}),
        json!({"apiVersion": GROUP_VERSION, "kind": "ClusterRole", "metadata": metadata("system:discovery", json!({})),
            "rules": [{"nonResourceURLs": ["/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi",
                                           "/openapi/*", "/readyz", "/version", "/version/"], "verbs": ["get"]}]}),
        json!({"apiVersion": GROUP_VERSION, "kind": "ClusterRoleBinding", "metadata": metadata("system:discovery", json!({})),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:discovery"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:authenticated"}]}),
    ]
}

/// The writes that make the stored bootstrap objects as [`desired`]: created when absent,
/// their rules (or roleRef and subjects) put back when changed, Git's left alone.
pub fn plan(stored: impl Fn(&ObjectKey) -> Option<Value>) -> Vec<Op> {
    let mut ops = Vec::new();
    for want in desired() {
        let Ok(key) = ObjectKey::from_value(&want) else { continue };
        match stored(&key) {
            None => ops.push(Op::Create(want)),
            Some(current) if current["metadata"]["annotations"][APPLICATION_ANNOTATION].is_string() => {}
            Some(current) => {
                let mut next = current.clone();
                for field in ["rules", "aggregationRule", "roleRef", "subjects"] {
                    match want.get(field) {
                        Some(value) => next[field] = value.clone(),
                        None => {
                            if let Some(object) = next.as_object_mut() {
                                object.remove(field);
                            }
                        }
                    }
                }
                // An aggregated role's rules are the aggregation's, not this plan's.
                if want.get("aggregationRule").is_some()
                    && let Some(rules) = current.get("rules")
                {
                    next["rules"] = rules.clone();
                }
                if next != current {
                    ops.push(Op::Update(next));
                }
            }
        }
    }
    ops
}

pub struct BootstrapRolesController;

fn is_bootstrap(key: &ObjectKey) -> bool {
    (key.kind == kind_of::<ClusterRole>() || key.kind == kind_of::<ClusterRoleBinding>())
        && desired().iter().any(|d| d["metadata"]["name"] == key.name.as_str())
}

fn the_key() -> ObjectKey {
    ObjectKey::of::<ClusterRole>("", "cluster-admin")
}

#[async_trait::async_trait]
impl Reconciler for BootstrapRolesController {
    fn name(&self) -> &'static str {
        "bootstrap-roles"
    }

    fn keys_for(&self, event: &Event, _: &Cache) -> Vec<ObjectKey> {
        if is_bootstrap(&event.key) { vec![the_key()] } else { Vec::new() }
    }

    fn all_keys(&self, _: &Cache) -> Vec<ObjectKey> {
        vec![the_key()]
    }

    async fn reconcile(&self, _: &ObjectKey, ctx: &Context) -> Result<Action, ReconcileError> {
        let ops = plan(|key| ctx.cache().get(key).map(|v| (*v).clone()));
        if !ops.is_empty() {
            tracing::info!(writes = ops.len(), "writing the bootstrap ClusterRoles");
            ctx.commit(ops).await?;
        }
        Ok(Action::await_change())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bootstrap_roles_are_made_kept_and_left_to_git() {
        let made: Vec<String> = plan(|_| None).iter().map(|op| op.key().unwrap().to_string()).collect();
        assert_eq!(made.len(), 5, "{made:?}");
        let stored =
            |key: &ObjectKey| desired().into_iter().find(|d| ObjectKey::from_value(d).ok().as_ref() == Some(key));
        assert!(plan(stored).is_empty(), "as made: nothing to do");
        let changed = |key: &ObjectKey| {
            let mut object = stored(key)?;
            if key.name == "cluster-admin" {
                object["rules"] = json!([]);
            }
            if key.name == "view" {
                object["rules"] = json!([{"verbs": ["get"]}]); // the aggregation's
            }
            Some(object)
        };
        let ops = plan(changed);
        assert_eq!(ops.len(), 1, "{ops:?}");
        let gits = |key: &ObjectKey| {
            let mut object = changed(key)?;
            object["metadata"]["annotations"][APPLICATION_ANNOTATION] = json!("gitplane-system/x");
            Some(object)
        };
        assert!(plan(gits).is_empty(), "Git's own are Git's");
    }
}
