//! Garbage collector: deletes objects whose owners are gone (background cascading deletion).

use crate::{Action, Context, ReconcileError, Reconciler};
use gitplane_api::k8s_openapi::jiff::Timestamp;
use gitplane_api::object::{group_kind, kind_of};
use gitplane_store::{Event, EventType, ObjectKey, deletion, informer::Cache};
use k8s_openapi::api::{
    apps::v1::{ControllerRevision, ReplicaSet},
    batch::v1::Job,
    core::v1::{PersistentVolumeClaim, Pod},
    discovery::v1::EndpointSlice,
};
use serde_json::Value;
use std::sync::LazyLock;

pub struct GarbageCollector;

/// The kinds whose orphans it deletes: the controller manager's. The informer is shared with
/// the source controller and also holds objects only Git writes (ConfigMaps, Secrets,
/// Applications): removing those is the source's prune, which an ownerReference in Git must not
/// bypass.
static COLLECTED: LazyLock<Vec<String>> = LazyLock::new(crate::watched_kinds);

/// The kinds that have owners in gitplane (a claim: its StatefulSet or Pod, as the set's
/// retention policy says).
fn dependent_kinds() -> [String; 6] {
    [
        kind_of::<ReplicaSet>(),
        kind_of::<Job>(),
        kind_of::<Pod>(),
        kind_of::<EndpointSlice>(),
        kind_of::<ControllerRevision>(),
        kind_of::<PersistentVolumeClaim>(),
    ]
}

fn owner_refs(object: &Value) -> impl Iterator<Item = &Value> {
    object["metadata"]["ownerReferences"].as_array().into_iter().flatten()
}

#[async_trait::async_trait]
impl Reconciler for GarbageCollector {
    fn name(&self) -> &'static str {
        "garbage-collector"
    }

    fn workers(&self) -> usize {
        crate::runtime::CONCURRENT_SYNCS
    }

    fn keys_for(&self, event: &Event, cache: &Cache) -> Vec<ObjectKey> {
        if !COLLECTED.contains(&event.key.kind) {
            return Vec::new();
        }
        if event.event_type == EventType::Deleted {
            // The dependents of the deleted object.
            let Some(uid) = event.object["metadata"]["uid"].as_str() else { return Vec::new() };
            return dependent_kinds()
                .iter()
                .flat_map(|kind| cache.list(kind, Some(&event.key.namespace)))
                .filter(|o| owner_refs(o).any(|r| r["uid"] == uid))
                .filter_map(|o| ObjectKey::from_value(&o).ok())
                .collect();
        }
        if owner_refs(&event.object).next().is_some() { vec![event.key.clone()] } else { Vec::new() }
    }

    fn all_keys(&self, cache: &Cache) -> Vec<ObjectKey> {
        dependent_kinds()
            .iter()
            .flat_map(|kind| cache.list(kind, None))
            .filter(|o| owner_refs(o).next().is_some())
            .filter_map(|o| ObjectKey::from_value(&o).ok())
            .collect()
    }

    async fn reconcile(&self, key: &ObjectKey, ctx: &Context) -> Result<Action, ReconcileError> {
        let Some(object) = ctx.cache().get(key) else { return Ok(Action::await_change()) };
        let refs: Vec<&Value> = owner_refs(&object).collect();
        if refs.is_empty() {
            return Ok(Action::await_change());
        }
        for r in &refs {
            let kind = group_kind(r["apiVersion"].as_str().unwrap_or(""), r["kind"].as_str().unwrap_or(""));
            let owner_key = ObjectKey::new(kind, key.namespace.clone(), r["name"].as_str().unwrap_or(""));
            // The cache may be behind (kinds are listed at different revisions): ask the store,
            // as the upstream collector verifies absence with a live lookup.
            let owner = ctx.store.get(&owner_key).await?;
            if owner.is_some_and(|o| o["metadata"]["uid"] == r["uid"]) {
                return Ok(Action::await_change());
            }
        }
        let Some(delete) = deletion::delete(&object, Timestamp::now()) else { return Ok(Action::await_change()) };
        tracing::info!("owners are gone, deleting");
        match ctx.commit(vec![delete]).await {
            Err(e) if e.is_not_found() => Ok(Action::await_change()),
            other => other.map(|_| Action::await_change()).map_err(Into::into),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::Arc;

    fn changed(kind: &str, api_version: &str) -> Event {
        let object = json!({"apiVersion": api_version, "kind": kind, "metadata": {"name": "a", "namespace": "n",
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "gone", "uid": "u"}]}});
        Event {
            revision: 2,
            event_type: EventType::Modified,
            key: ObjectKey::from_value(&object).unwrap(),
            object: Arc::new(object),
        }
    }

    #[test]
    fn t10_only_the_controller_managers_kinds_are_collected() {
        let cache = Cache::default();
        let pod = changed("Pod", "v1");
        assert_eq!(GarbageCollector.keys_for(&pod, &cache), vec![pod.key.clone()]);
        assert!(GarbageCollector.keys_for(&changed("ConfigMap", "v1"), &cache).is_empty(), "Git's to prune");
    }
}
