//! ResourceQuota controller: keeps each quota's `status.hard` (its spec's) and `status.used`
//! (what the objects it counts in its namespace use, [`crate::admission::usages`]), as
//! kube-controller-manager's resourcequota controller does. Any change to a namespaced object
//! requeues the quotas of its namespace.

use crate::{Action, Context, ReconcileError, Reconciler, admission, runtime::all_of};
use gitplane_api::{
    k8s_openapi::api::core::v1::{ResourceQuota, ResourceQuotaStatus},
    k8s_openapi::apimachinery::pkg::api::resource::Quantity,
    object::kind_of,
    quota,
};
use gitplane_store::{Event, ObjectKey, informer::Cache};

pub struct ResourceQuotaController;

/// The status a quota should have given what its namespace uses.
pub fn status(q: &ResourceQuota, usages: &[quota::Usage]) -> ResourceQuotaStatus {
    let hard = q.spec.as_ref().and_then(|s| s.hard.clone());
    let used = quota::render(q, &quota::used(q, usages.iter()));
    ResourceQuotaStatus { hard, used: Some(used.into_iter().map(|(k, v)| (k, Quantity(v))).collect()) }
}

#[async_trait::async_trait]
impl Reconciler for ResourceQuotaController {
    fn name(&self) -> &'static str {
        "resourcequota"
    }

    fn keys_for(&self, event: &Event, cache: &Cache) -> Vec<ObjectKey> {
        if event.key.kind == kind_of::<ResourceQuota>() {
            return vec![event.key.clone()];
        }
        if event.key.namespace.is_empty() {
            return Vec::new();
        }
        cache
            .list(&kind_of::<ResourceQuota>(), Some(&event.key.namespace))
            .iter()
            .filter_map(|q| ObjectKey::from_value(q).ok())
            .collect()
    }

    fn all_keys(&self, cache: &Cache) -> Vec<ObjectKey> {
        all_of::<ResourceQuota>(cache)
    }

    async fn reconcile(&self, key: &ObjectKey, ctx: &Context) -> Result<Action, ReconcileError> {
        let Some(q) = ctx.cache().get_typed::<ResourceQuota>(&key.namespace, &key.name) else {
            return Ok(Action::await_change());
        };
        let usages = admission::usages(&**ctx.cache(), &q, &key.namespace, &[]);
        let status = status(&q, &usages);
        if q.status.as_ref() != Some(&status) {
            ctx.update_status(&ResourceQuota { status: Some(status), ..q }).await?;
        }
        Ok(Action::await_change())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn status_table() {
        let q: ResourceQuota = serde_json::from_value(json!({"metadata": {"name": "q"},
            "spec": {"hard": {"pods": "2", "requests.memory": "1Gi", "count/deployments.apps": "1"}}}))
        .unwrap();
        let pod = json!({"spec": {"containers": [{"name": "a", "resources": {"requests": {"memory": "600Mi"}}}]}});
        let pod_usage = quota::usage_of(&pod, "Pod", "pods", "");
        let deployment = quota::usage_of(&json!({}), "Deployment", "deployments", "apps");
        // (what, usages, used as the status writes it)
        #[rustfmt::skip]
        let cases: Vec<(&str, Vec<quota::Usage>, serde_json::Value)> = vec![
            ("nothing yet", vec![], json!({"count/deployments.apps": "0", "pods": "0", "requests.memory": "0"})),
            ("one Pod", vec![pod_usage.clone()], json!({"count/deployments.apps": "0", "pods": "1", "requests.memory": "600Mi"})),
            ("two Pods and a Deployment", vec![pod_usage.clone(), pod_usage, deployment],
             json!({"count/deployments.apps": "1", "pods": "2", "requests.memory": "1200Mi"})),
        ];
        for (what, usages, used) in cases {
            let s = serde_json::to_value(status(&q, &usages)).unwrap();
            assert_eq!(s["used"], used, "{what}");
            assert_eq!(s["hard"]["pods"], "2", "{what}");
        }
    }
}
