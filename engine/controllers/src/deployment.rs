//! Deployment controller: one ReplicaSet per pod template, scaled to the Deployment's replicas.
//!
//! RollingUpdate is simplified to full surge: the new ReplicaSet is scaled up at once and the
//! old ones are scaled to zero when the new one is fully available. Recreate scales the old
//! ones to zero first and brings up the new one when their Pods are gone.

use crate::{
    Action, Context, ReconcileError, Reconciler, names,
    owner::{controller_ref, controllers_of, is_controlled_by},
    runtime::all_of,
};
use gitplane_api::object::{kind_of, revision_of, to_value};
use gitplane_store::{Event, ObjectKey, Op, informer::Cache};
use k8s_openapi::api::apps::v1::{Deployment, DeploymentCondition, DeploymentStatus, ReplicaSet, ReplicaSetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

pub struct DeploymentController;

/// The label that ties a ReplicaSet and its Pods to one pod template.
pub const POD_TEMPLATE_HASH: &str = "pod-template-hash";
const DEFAULT_HISTORY_LIMIT: i32 = 10;

fn replicas(rs: &ReplicaSet) -> i32 {
    rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0)
}

fn status_of(rs: &ReplicaSet) -> (i32, i32, i32) {
    let s = rs.status.as_ref();
    (
        s.map_or(0, |s| s.replicas),
        s.and_then(|s| s.ready_replicas).unwrap_or(0),
        s.and_then(|s| s.available_replicas).unwrap_or(0),
    )
}

fn scaled(rs: &ReplicaSet, to: i32) -> Op {
    let mut rs = rs.clone();
    if let Some(spec) = rs.spec.as_mut() {
        spec.replicas = Some(to);
    }
    Op::Update(to_value(&rs))
}

/// The ReplicaSet for the Deployment's current template.
fn new_replica_set(d: &Deployment, hash: &str, replicas: i32) -> Result<ReplicaSet, ReconcileError> {
    let spec = d.spec.as_ref().ok_or_else(|| ReconcileError::Invalid("Deployment has no spec".into()))?;
    let mut template = spec.template.clone();
    let template_meta = template.metadata.get_or_insert_with(Default::default);
    template_meta.labels.get_or_insert_with(Default::default).insert(POD_TEMPLATE_HASH.into(), hash.into());
    let mut selector: LabelSelector = spec.selector.clone();
    selector.match_labels.get_or_insert_with(Default::default).insert(POD_TEMPLATE_HASH.into(), hash.into());
    let name = format!("{}-{hash}", names::truncate(d.metadata.name.as_deref().unwrap_or("deployment"), 52));
    Ok(ReplicaSet {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: d.metadata.namespace.clone(),
            labels: template_meta.labels.clone(),
            owner_references: Some(vec![controller_ref("apps/v1", "Deployment", &d.metadata)]),
            ..Default::default()
        },
        spec: Some(ReplicaSetSpec {
            replicas: Some(replicas),
            min_ready_seconds: spec.min_ready_seconds,
            selector,
            template: Some(template),
        }),
        status: None,
    })
}

/// The pod-template-hash of a Deployment's template.
pub fn template_hash(d: &Deployment) -> String {
    let template = d.spec.as_ref().map(|s| serde_json::to_vec(&s.template).unwrap_or_default()).unwrap_or_default();
    names::hash(&template)
}

#[async_trait::async_trait]
impl Reconciler for DeploymentController {
    fn name(&self) -> &'static str {
        "deployment"
    }

    fn keys_for(&self, event: &Event, _: &Cache) -> Vec<ObjectKey> {
        if event.key.kind == kind_of::<Deployment>() {
            return vec![event.key.clone()];
        }
        if event.key.kind == kind_of::<ReplicaSet>() {
            return controllers_of::<Deployment>(event);
        }
        Vec::new()
    }

    fn all_keys(&self, cache: &Cache) -> Vec<ObjectKey> {
        all_of::<Deployment>(cache)
    }

    async fn reconcile(&self, key: &ObjectKey, ctx: &Context) -> Result<Action, ReconcileError> {
        let Some(d) = ctx.cache().get_typed::<Deployment>(&key.namespace, &key.name) else {
            return Ok(Action::AwaitChange);
        };
        let uid = d.metadata.uid.clone().unwrap_or_default();
        let spec = d.spec.clone().unwrap_or_default();
        let desired = spec.replicas.unwrap_or(1).max(0);
        let recreate = spec.strategy.as_ref().and_then(|s| s.type_.as_deref()) == Some("Recreate");
        let hash = template_hash(&d);
        let owned = |cache: &Cache| -> Vec<ReplicaSet> {
            cache.list_typed_where::<ReplicaSet>(Some(&key.namespace), |rs| is_controlled_by(rs, &uid))
        };
        let is_new =
            |rs: &ReplicaSet| rs.metadata.labels.as_ref().and_then(|l| l.get(POD_TEMPLATE_HASH)) == Some(&hash);

        let all = owned(ctx.cache());
        let (new, old): (Vec<ReplicaSet>, Vec<ReplicaSet>) = all.into_iter().partition(is_new);
        let new = new.into_iter().next();
        let old_pods: i32 = old.iter().map(|rs| status_of(rs).0).sum();
        let new_available = new.as_ref().map_or(0, |rs| status_of(rs).2);
        let mut ops = Vec::new();
        // The new ReplicaSet: with Recreate only once the old Pods are gone.
        let may_scale_new = !recreate || old_pods == 0;
        match &new {
            None if may_scale_new => ops.push(Op::Create(to_value(&new_replica_set(&d, &hash, desired)?))),
            Some(rs) if may_scale_new && replicas(rs) != desired => ops.push(scaled(rs, desired)),
            _ => {}
        }
        // Old ReplicaSets: down once the new one is fully available (or at once with Recreate).
        let retire_old = recreate || (new.is_some() && new_available >= desired);
        for rs in old.iter().filter(|rs| retire_old && replicas(rs) > 0) {
            ops.push(scaled(rs, 0));
        }
        // Keep revisionHistoryLimit scaled-down ReplicaSets, oldest deleted first.
        let limit = spec.revision_history_limit.unwrap_or(DEFAULT_HISTORY_LIMIT).max(0) as usize;
        let mut history: Vec<&ReplicaSet> = old.iter().filter(|rs| replicas(rs) == 0 && status_of(rs).0 == 0).collect();
        history.sort_by_key(|rs| rs.metadata.creation_timestamp.as_ref().map(|t| t.0));
        let surplus = history.len().saturating_sub(limit);
        for rs in history.into_iter().take(surplus) {
            ops.push(Op::Delete {
                key: ObjectKey::of::<ReplicaSet>(&key.namespace, rs.metadata.name.as_deref().unwrap_or("")),
                revision: revision_of(rs),
            });
        }
        ctx.commit(ops).await?;

        let all = owned(ctx.cache());
        let total = |f: fn(&ReplicaSet) -> i32| all.iter().map(f).sum::<i32>();
        let updated = all.iter().filter(|rs| is_new(rs)).map(|rs| status_of(rs).0).sum();
        let ready = total(|rs| status_of(rs).1);
        let available = total(|rs| status_of(rs).2);
        let replicas_now = total(|rs| status_of(rs).0);
        let complete = updated == desired && replicas_now == desired && available >= desired;
        let status = DeploymentStatus {
            observed_generation: d.metadata.generation,
            replicas: Some(replicas_now),
            updated_replicas: Some(updated),
            ready_replicas: Some(ready),
            available_replicas: Some(available),
            unavailable_replicas: Some((desired - available).max(0)),
            conditions: Some(vec![
                condition("Available", available >= desired, "MinimumReplicasAvailable", "MinimumReplicasUnavailable"),
                condition(
                    "Progressing",
                    true,
                    if complete { "NewReplicaSetAvailable" } else { "ReplicaSetUpdated" },
                    "",
                ),
            ]),
            ..Default::default()
        };
        if d.status.as_ref() != Some(&status) {
            let mut updated = d.clone();
            updated.status = Some(status);
            ctx.commit(vec![Op::UpdateStatus(to_value(&updated))]).await?;
        }
        Ok(Action::AwaitChange)
    }
}

fn condition(type_: &str, ok: bool, true_reason: &str, false_reason: &str) -> DeploymentCondition {
    DeploymentCondition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: Some(if ok { true_reason } else { false_reason }.into()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn deployment(image: &str) -> Deployment {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "d-1"},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                     "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": image}]}}}
        }))
        .unwrap()
    }

    #[test]
    fn template_hash_follows_the_template_only() {
        let a = deployment("a:1");
        let mut scaled = a.clone();
        scaled.spec.as_mut().unwrap().replicas = Some(5);
        assert_eq!(template_hash(&a), template_hash(&scaled));
        assert_ne!(template_hash(&a), template_hash(&deployment("a:2")));
    }

    #[test]
    fn new_replica_set_selects_its_template() {
        let d = deployment("a:1");
        let rs = new_replica_set(&d, "h", 2).unwrap();
        assert_eq!(rs.metadata.name.as_deref(), Some("web-h"));
        let spec = rs.spec.unwrap();
        assert_eq!(spec.selector.match_labels.unwrap().get(POD_TEMPLATE_HASH).map(String::as_str), Some("h"));
        let labels = spec.template.unwrap().metadata.unwrap().labels.unwrap();
        assert_eq!(labels.get("app").map(String::as_str), Some("web"));
        assert_eq!(rs.metadata.owner_references.unwrap()[0].uid, "d-1");
    }
}
