//! A StatefulSet's revision history (upstream's `controller/history`): one ControllerRevision
//! per distinct Pod template, named `<set>-<hash>`, numbered in the order each became the
//! update revision. Its data is the patch that restores that template, as upstream stores it,
//! so `kubectl rollout history --revision` shows the template. Pure.

use crate::{ReconcileError, names, owner::controller_ref, plan::Op};
use k8s_openapi::api::{
    apps::v1::{ControllerRevision, StatefulSet},
    core::v1::{Pod, PodTemplateSpec},
};
use k8s_openapi::apimachinery::pkg::{apis::meta::v1::ObjectMeta, runtime::RawExtension};
use serde_json::{Value, json};
use std::collections::BTreeSet;

/// The label on a set's Pods (and claims) naming the revision they were made from.
pub const REVISION_LABEL: &str = "controller-revision-hash";
/// The label on a revision holding the hash in its name (upstream's `ControllerRevisionHashLabel`).
pub const HASH_LABEL: &str = "controller.kubernetes.io/hash";
const DEFAULT_HISTORY_LIMIT: i32 = 10;
/// How many hash collisions a sync resolves before it gives up on the set.
const MAX_COLLISIONS: i32 = 16;

/// The revision of the set's current template: the patch that restores it.
pub fn data(set: &StatefulSet) -> Value {
    patch(set.spec.as_ref().map(|s| &s.template))
}

/// The patch that restores a workload's Pod template, a ControllerRevision's data for
/// StatefulSets and DaemonSets alike (upstream's `getPatch`).
pub fn patch(template: Option<&PodTemplateSpec>) -> Value {
    let mut template = serde_json::to_value(template).unwrap_or(Value::Null);
    if let Some(t) = template.as_object_mut() {
        t.insert("$patch".into(), json!("replace"));
    }
    json!({"spec": {"template": template}})
}

/// The Pod template a revision restores.
pub fn template(revision: &ControllerRevision) -> Result<PodTemplateSpec, ReconcileError> {
    let name = revision.metadata.name.as_deref().unwrap_or("");
    let mut template = revision.data.as_ref().map(|d| d.0["spec"]["template"].clone()).unwrap_or(Value::Null);
    if let Some(t) = template.as_object_mut() {
        t.remove("$patch");
    }
    serde_json::from_value(template)
        .map_err(|e| ReconcileError::Invalid(format!("ControllerRevision {name} holds no Pod template: {e}")))
}

/// The revision name a Pod (or claim) carries.
pub fn of(pod: &Pod) -> Option<&str> {
    pod.metadata.labels.as_ref()?.get(REVISION_LABEL).map(String::as_str)
}

fn number(revision: &ControllerRevision) -> i64 {
    revision.revision
}

fn name(revision: &ControllerRevision) -> &str {
    revision.metadata.name.as_deref().unwrap_or("")
}

fn same_data(revision: &ControllerRevision, data: &Value) -> bool {
    revision.data.as_ref().is_some_and(|d| d.0 == *data)
}

/// What a sync of the set's history decides: the revisions to write, the current revision (the
/// Pods below the partition), the update revision (the set's template now), and the
/// collisionCount the names were made with.
#[derive(Debug)]
pub struct History {
    pub ops: Vec<Op<ControllerRevision>>,
    pub current: ControllerRevision,
    pub update: ControllerRevision,
    pub collision_count: i32,
}

/// The set's revisions after this sync, from the ones it controls (`owned`) and its Pods: the
/// update revision reused when a revision holds the same template (renumbered as the newest on
/// a rollback), else created; the current revision as the status names it; and history beyond
/// `revisionHistoryLimit` that no Pod uses deleted, oldest first.
pub fn plan(set: &StatefulSet, owned: &[ControllerRevision], pods: &[Pod]) -> Result<History, ReconcileError> {
    let data = data(set);
    let status = set.status.as_ref();
    let mut collision_count = status.and_then(|s| s.collision_count).unwrap_or(0);
    let newest = owned.iter().map(number).max().unwrap_or(0);
    let mut ops = Vec::new();
    let equal = owned.iter().filter(|r| same_data(r, &data)).max_by_key(|r| number(r));
    let update = match equal {
        Some(r) if number(r) == newest => r.clone(),
        Some(r) => {
            // A rollback: the old revision becomes the newest again.
            let mut renumbered = r.clone();
            renumbered.revision = newest + 1;
            ops.push(Op::Update(renumbered.clone()));
            renumbered
        }
        None => {
            let set_name = set.metadata.name.as_deref().unwrap_or("statefulset");
            let created = loop {
                let hash = names::hash(format!("{data}/{collision_count}").as_bytes());
                let candidate = format!("{}-{hash}", names::truncate(set_name, 52));
                if !owned.iter().any(|r| name(r) == candidate) {
                    break new_revision(set, candidate, &hash, data, newest + 1);
                }
                collision_count += 1;
                if collision_count > MAX_COLLISIONS {
                    return Err(ReconcileError::Invalid(format!(
                        "StatefulSet {set_name}: no free ControllerRevision name after {MAX_COLLISIONS} hash collisions"
                    )));
                }
            };
            ops.push(Op::Create(created.clone()));
            created
        }
    };
    let current = status
        .and_then(|s| s.current_revision.as_deref())
        .and_then(|n| owned.iter().find(|r| name(r) == n))
        .filter(|r| name(r) != name(&update))
        .cloned()
        .unwrap_or_else(|| update.clone());
    let limit = set.spec.as_ref().and_then(|s| s.revision_history_limit).unwrap_or(DEFAULT_HISTORY_LIMIT).max(0);
    let live: BTreeSet<&str> = pods.iter().filter_map(of).chain([name(&current), name(&update)]).collect();
    let mut history: Vec<&ControllerRevision> = owned.iter().filter(|r| !live.contains(name(r))).collect();
    history.sort_by_key(|r| number(r));
    let surplus = history.len().saturating_sub(limit as usize);
    ops.extend(history.into_iter().take(surplus).map(|r| Op::Delete(r.clone())));
    Ok(History { ops, current, update, collision_count })
}

fn new_revision(set: &StatefulSet, name: String, hash: &str, data: Value, revision: i64) -> ControllerRevision {
    let template = set.spec.as_ref().and_then(|s| s.template.metadata.as_ref());
    let mut labels = template.and_then(|m| m.labels.clone()).unwrap_or_default();
    labels.insert(HASH_LABEL.into(), hash.into());
    ControllerRevision {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: set.metadata.namespace.clone(),
            labels: Some(labels),
            owner_references: Some(vec![controller_ref("apps/v1", "StatefulSet", &set.metadata)]),
            ..Default::default()
        },
        data: Some(RawExtension(data)),
        revision,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(image: &str, current: Option<&str>, limit: i32) -> StatefulSet {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "s1"},
            "spec": {"serviceName": "nginx", "selector": {"matchLabels": {"app": "nginx"}}, "revisionHistoryLimit": limit,
                     "template": {"metadata": {"labels": {"app": "nginx"}}, "spec": {"containers": [{"name": "nginx", "image": image}]}}},
            "status": {"replicas": 0, "currentRevision": current}
        }))
        .unwrap()
    }

    fn stored(set: &StatefulSet, number: i64) -> ControllerRevision {
        let History { update, .. } = plan(set, &[], &[]).unwrap();
        ControllerRevision { revision: number, ..update }
    }

    fn pod_at(revision: &str) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "web-0", "labels": {REVISION_LABEL: revision}}})).unwrap()
    }

    fn describe(ops: &[Op<ControllerRevision>]) -> Vec<String> {
        ops.iter()
            .map(|op| match op {
                Op::Create(r) => format!("create {}", r.revision),
                Op::Update(r) => format!("renumber {} {}", name(r), r.revision),
                Op::Delete(r) => format!("delete {}", r.revision),
            })
            .collect()
    }

    #[test]
    fn t10_revisions_are_created_reused_renumbered_and_pruned() {
        let (v1, v2) = (set("nginx:1", None, 10), set("nginx:2", None, 10));
        let (r1, r2) = (stored(&v1, 1), stored(&v2, 2));
        let first = plan(&v1, &[], &[]).unwrap();
        assert_eq!(describe(&first.ops), ["create 1"]);
        assert!(name(&first.update).starts_with("web-") && name(&first.update).len() == 14, "{}", name(&first.update));
        assert_eq!(name(&first.current), name(&first.update), "no status yet: current is the update");
        let labels = first.update.metadata.labels.as_ref().unwrap();
        assert_eq!(labels["app"], "nginx");
        assert_eq!(format!("web-{}", labels[HASH_LABEL]), name(&first.update), "upstream's hash label");
        assert_eq!(template(&first.update).unwrap(), v1.spec.as_ref().unwrap().template);

        let steady = plan(&v1, std::slice::from_ref(&r1), &[]).unwrap();
        assert!(steady.ops.is_empty());

        let current = name(&r1).to_owned();
        let rolling = plan(&set("nginx:2", Some(&current), 10), std::slice::from_ref(&r1), &[]).unwrap();
        assert_eq!(describe(&rolling.ops), ["create 2"]);
        assert_eq!((name(&rolling.current), rolling.update.revision), (current.as_str(), 2));

        let back = plan(&set("nginx:1", Some(name(&r2)), 10), &[r1.clone(), r2.clone()], &[]).unwrap();
        assert_eq!(describe(&back.ops), [format!("renumber {current} 3")], "a rollback reuses revision 1");

        let pruned = plan(&set("nginx:3", Some(name(&r2)), 0), &[r1.clone(), r2.clone()], &[]).unwrap();
        assert_eq!(describe(&pruned.ops), ["create 3", "delete 1"], "limit 0 keeps current and update only");
        let in_use = plan(&set("nginx:3", Some(name(&r2)), 0), &[r1.clone(), r2], &[pod_at(&current)]).unwrap();
        assert_eq!(describe(&in_use.ops), ["create 3"], "a Pod still runs revision 1");
    }

    #[test]
    fn t10_a_name_taken_by_another_template_bumps_the_collision_count() {
        let v1 = set("nginx:1", None, 10);
        let mut squatter = stored(&v1, 1);
        squatter.data = Some(RawExtension(json!({"spec": {"template": {"other": true}}})));
        let history = plan(&v1, &[squatter], &[]).unwrap();
        assert_eq!((history.collision_count, history.update.revision), (1, 2));
        assert_eq!(describe(&history.ops), ["create 2"]);
    }
}
