//! StatefulSet controller: Pods with a stable name, network identity and storage per ordinal.
//!
//! Each sync decides in pure steps, as upstream's `StatefulSetControl`: the revision history
//! ([`revisions`]), then the Pods and claims ([`pods`]), committed as one transaction; the
//! status is computed from the Pods the cache then holds.

pub mod pods;
pub mod revisions;

use crate::{Action, Context, ReconcileError, Reconciler, owner::controllers_of, plan::Op, runtime::all_of};
use gitplane_api::{events::NORMAL, object::kind_of};
use gitplane_store::{Event, ObjectKey, informer::Cache};
use k8s_openapi::api::{
    apps::v1::{ControllerRevision, StatefulSet},
    core::v1::{PersistentVolumeClaim, Pod},
};
use std::collections::BTreeMap;

pub struct StatefulSetController;

/// SuccessfulCreate / SuccessfulDelete with upstream's messages, once the write succeeded.
fn events(set: &str, writes: &pods::Writes) -> Vec<(&'static str, String)> {
    let name =
        |meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| meta.name.clone().unwrap_or_default();
    let claims = writes.claims.iter().filter_map(|op| match op {
        Op::Create(c) => {
            Some(("SuccessfulCreate", format!("create Claim {} in StatefulSet {set} success", name(&c.metadata))))
        }
        _ => None,
    });
    let pods = writes.pods.iter().filter_map(|op| match op {
        Op::Create(p) => {
            Some(("SuccessfulCreate", format!("create Pod {} in StatefulSet {set} successful", name(&p.metadata))))
        }
        Op::Delete(p) => {
            Some(("SuccessfulDelete", format!("delete Pod {} in StatefulSet {set} successful", name(&p.metadata))))
        }
        Op::Update(_) => None,
    });
    claims.chain(pods).collect()
}

#[async_trait::async_trait]
impl Reconciler for StatefulSetController {
    fn name(&self) -> &'static str {
        "statefulset"
    }

    fn keys_for(&self, event: &Event, _: &Cache) -> Vec<ObjectKey> {
        if event.key.kind == kind_of::<StatefulSet>() {
            vec![event.key.clone()]
        } else if event.key.kind == kind_of::<Pod>() || event.key.kind == kind_of::<ControllerRevision>() {
            controllers_of::<StatefulSet>(event)
        } else {
            Vec::new()
        }
    }

    fn all_keys(&self, cache: &Cache) -> Vec<ObjectKey> {
        all_of::<StatefulSet>(cache)
    }

    async fn reconcile(&self, key: &ObjectKey, ctx: &Context) -> Result<Action, ReconcileError> {
        let Some(set) = ctx.cache().get_typed::<StatefulSet>(&key.namespace, &key.name) else {
            return Ok(Action::await_change()); // gone: the garbage collector removes its Pods
        };
        let uid = set.metadata.uid.clone().unwrap_or_default();
        let owned_pods = |cache: &Cache| cache.controlled_by::<Pod>(&key.namespace, &uid);
        let pods = owned_pods(ctx.cache());
        let owned_revisions = ctx.cache().controlled_by::<ControllerRevision>(&key.namespace, &uid);
        let infix = format!("-{}-", key.name);
        let claims: BTreeMap<String, PersistentVolumeClaim> = ctx
            .cache()
            .list_typed_where::<PersistentVolumeClaim>(Some(&key.namespace), |c| {
                c["metadata"]["name"].as_str().is_some_and(|n| n.contains(&infix))
            })
            .into_iter()
            .map(|c| (c.metadata.name.clone().unwrap_or_default(), c))
            .collect();

        let history = revisions::plan(&set, &owned_revisions, &pods)?;
        let (current_template, update_template) =
            (revisions::template(&history.current)?, revisions::template(&history.update)?);
        let names = |r: &ControllerRevision| r.metadata.name.clone().unwrap_or_default();
        let (current, update) = (names(&history.current), names(&history.update));
        let chosen = pods::Revisions {
            current: pods::Revision { name: &current, template: &current_template },
            update: pods::Revision { name: &update, template: &update_template },
        };
        let now = gitplane_api::k8s_openapi::jiff::Timestamp::now();
        let writes = pods::plan(&set, &chosen, &pods, &claims, now)?;
        let messages = events(&key.name, &writes);
        if !messages.is_empty() {
            tracing::info!(changes = messages.len(), "syncing Pods");
        }
        let ops = history
            .ops
            .into_iter()
            .filter_map(|op| op.into_store_op(now))
            .chain(writes.claims.into_iter().filter_map(|op| op.into_store_op(now)))
            .chain(writes.pods.into_iter().filter_map(|op| op.into_store_op(now)))
            .collect();
        ctx.commit(ops).await?;
        for (reason, message) in messages {
            ctx.event("statefulset-controller", &set, NORMAL, reason, &message);
        }
        let (after, now) = (owned_pods(ctx.cache()), gitplane_api::k8s_openapi::jiff::Timestamp::now());
        let status = pods::status(&set, &after, &current, &update, history.collision_count, now);
        if set.status.as_ref() != Some(&status) {
            let mut updated = set.clone();
            updated.status = Some(status);
            ctx.update_status(&updated).await?;
        }
        // A Pod Ready but not yet for minReadySeconds changes nothing when it becomes available.
        Ok(match pods::next_available(&set, &after, now) {
            Some(at) => Action::requeue(
                std::time::Duration::try_from(at.duration_since(now)).unwrap_or_default()
                    + std::time::Duration::from_millis(100),
            ),
            None => Action::await_change(),
        })
    }
}
