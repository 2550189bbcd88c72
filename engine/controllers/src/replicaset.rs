//! ReplicaSet controller: keeps `spec.replicas` Pods of the template alive.

use crate::{
    Action, Context, ReconcileError, Reconciler, names,
    owner::{controller_ref, controllers_of, is_controlled_by},
    runtime::all_of,
};
use gitplane_api::object::{kind_of, to_value};
use gitplane_store::{Event, ObjectKey, Op, informer::Cache};
use k8s_openapi::api::{
    apps::v1::{ReplicaSet, ReplicaSetStatus},
    core::v1::Pod,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

pub struct ReplicaSetController;

/// Pods created or deleted per transaction, as the upstream controller's burst.
const BURST: usize = 500;

/// The Pod's phase, Pending until the kubelet reports one.
pub(crate) fn phase(pod: &Pod) -> &str {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending")
}

pub(crate) fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Running or yet to run: not Succeeded or Failed.
pub(crate) fn is_active(pod: &Pod) -> bool {
    !matches!(phase(pod), "Succeeded" | "Failed")
}

/// The order in which surplus Pods go: unscheduled, then pending, then not ready, then newest.
fn deletion_rank(pod: &Pod) -> (u8, u8, u8, std::cmp::Reverse<String>) {
    let bound = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_some_and(|n| !n.is_empty());
    let created = pod.metadata.creation_timestamp.as_ref().map(|t| t.0.to_string()).unwrap_or_default();
    (u8::from(bound), u8::from(phase(pod) == "Running"), u8::from(is_ready(pod)), std::cmp::Reverse(created))
}

/// How many Pods to add (positive) or remove (negative) to reach `desired` from `active`.
pub fn replica_diff(desired: i32, active: usize) -> i64 {
    i64::from(desired.max(0)) - active as i64
}

fn new_pod(rs: &ReplicaSet) -> Result<Pod, ReconcileError> {
    let spec = rs.spec.as_ref().ok_or_else(|| ReconcileError::Invalid("ReplicaSet has no spec".into()))?;
    let template =
        spec.template.as_ref().ok_or_else(|| ReconcileError::Invalid("ReplicaSet has no template".into()))?;
    let template_meta = template.metadata.clone().unwrap_or_default();
    Ok(Pod {
        metadata: ObjectMeta {
            name: Some(names::generate(rs.metadata.name.as_deref().unwrap_or("pod"))),
            namespace: rs.metadata.namespace.clone(),
            labels: template_meta.labels,
            annotations: template_meta.annotations,
            owner_references: Some(vec![controller_ref("apps/v1", "ReplicaSet", &rs.metadata)]),
            ..Default::default()
        },
        spec: template.spec.clone(),
        status: None,
    })
}

#[async_trait::async_trait]
impl Reconciler for ReplicaSetController {
    fn name(&self) -> &'static str {
        "replicaset"
    }

    fn keys_for(&self, event: &Event, _: &Cache) -> Vec<ObjectKey> {
        if event.key.kind == kind_of::<ReplicaSet>() {
            return vec![event.key.clone()];
        }
        if event.key.kind == kind_of::<Pod>() {
            return controllers_of::<ReplicaSet>(event);
        }
        Vec::new()
    }

    fn all_keys(&self, cache: &Cache) -> Vec<ObjectKey> {
        all_of::<ReplicaSet>(cache)
    }

    async fn reconcile(&self, key: &ObjectKey, ctx: &Context) -> Result<Action, ReconcileError> {
        let Some(rs) = ctx.cache().get_typed::<ReplicaSet>(&key.namespace, &key.name) else {
            return Ok(Action::AwaitChange); // gone: the garbage collector removes its Pods
        };
        let uid = rs.metadata.uid.clone().unwrap_or_default();
        let desired = rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        let owned = |cache: &Cache| -> Vec<Pod> {
            cache.list_typed_where::<Pod>(Some(&key.namespace), |p| is_controlled_by(p, &uid))
        };
        let pods = owned(ctx.cache());
        let (mut active, finished): (Vec<Pod>, Vec<Pod>) = pods.into_iter().partition(is_active);
        let mut ops: Vec<Op> = finished
            .iter()
            .map(|p| Op::Delete {
                key: ObjectKey::of::<Pod>(&key.namespace, p.metadata.name.as_deref().unwrap_or("")),
                revision: gitplane_api::object::revision_of(p),
            })
            .collect();
        let diff = replica_diff(desired, active.len());
        if diff > 0 {
            for _ in 0..diff.min(BURST as i64) {
                ops.push(Op::Create(to_value(&new_pod(&rs)?)));
            }
            tracing::info!(creating = diff, desired, "scaling up");
        } else if diff < 0 {
            active.sort_by_key(deletion_rank);
            for pod in active.iter().take((-diff as usize).min(BURST)) {
                ops.push(Op::Delete {
                    key: ObjectKey::of::<Pod>(&key.namespace, pod.metadata.name.as_deref().unwrap_or("")),
                    revision: gitplane_api::object::revision_of(pod),
                });
            }
            tracing::info!(deleting = -diff, desired, "scaling down");
        }
        ctx.commit(ops).await?;

        let pods: Vec<Pod> = owned(ctx.cache()).into_iter().filter(is_active).collect();
        let ready = pods.iter().filter(|p| is_ready(p)).count() as i32;
        let status = ReplicaSetStatus {
            replicas: pods.len() as i32,
            fully_labeled_replicas: Some(pods.len() as i32),
            ready_replicas: Some(ready),
            available_replicas: Some(ready),
            observed_generation: rs.metadata.generation,
            ..Default::default()
        };
        if rs.status.as_ref() != Some(&status) {
            let mut updated = rs.clone();
            updated.status = Some(status);
            ctx.commit(vec![Op::UpdateStatus(to_value(&updated))]).await?;
        }
        Ok(Action::AwaitChange)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replica_math() {
        assert_eq!(replica_diff(3, 1), 2);
        assert_eq!(replica_diff(1, 3), -2);
        assert_eq!(replica_diff(0, 0), 0);
        assert_eq!(replica_diff(-1, 2), -2, "negative replicas mean none");
    }
}
