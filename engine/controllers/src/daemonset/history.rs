//! A DaemonSet's revision history (upstream's `constructHistory`, `snapshot` and
//! `cleanupHistory`): one ControllerRevision per distinct Pod template, named `<ds>-<hash>`,
//! labelled with that hash (the `controller-revision-hash` its Pods carry) and numbered in the
//! order each became current. Its data is the patch that restores the template, as upstream
//! stores it, so `kubectl rollout history daemonset/<ds> --revision=N` shows the template. A
//! template that comes back (a `git revert`) reuses its revision, renumbered as the newest. Pure.

use crate::statefulset::revisions::patch;
use crate::{ReconcileError, names, owner::controller_ref, plan::Op};
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::{apis::meta::v1::ObjectMeta, runtime::RawExtension};
use serde_json::Value;
use std::collections::BTreeSet;

/// The label that ties a daemon Pod, and its revision, to the template it was made from.
pub const CONTROLLER_REVISION_HASH: &str = "controller-revision-hash";
const DEFAULT_HISTORY_LIMIT: i32 = 10;
/// How many hash collisions a sync resolves before it gives up on the DaemonSet.
const MAX_COLLISIONS: i32 = 16;

/// What a sync of the history decides: the revisions to write, the hash of the current
/// revision (the label of the Pods it makes), and the collisionCount that hash was made with.
#[derive(Debug)]
pub struct History {
    pub ops: Vec<Op<ControllerRevision>>,
    pub hash: String,
    pub collision_count: i32,
}

/// The hash of the template with `collision_count`: with none, the template's own hash, which
/// daemon Pods carried before their revisions were stored, so they stay current.
fn hash(ds: &DaemonSet, collision_count: i32) -> String {
    let template = ds.spec.as_ref().map(|s| serde_json::to_vec(&s.template).unwrap_or_default()).unwrap_or_default();
    match collision_count {
        0 => names::hash(&template),
        n => names::hash(&[template, format!("/{n}").into_bytes()].concat()),
    }
}

fn name(revision: &ControllerRevision) -> &str {
    revision.metadata.name.as_deref().unwrap_or("")
}

fn label(revision: &ControllerRevision) -> Option<&str> {
    revision.metadata.labels.as_ref()?.get(CONTROLLER_REVISION_HASH).map(String::as_str)
}

/// The DaemonSet's history after this sync, from the revisions it controls (`owned`), whether
/// a name is taken in its namespace, and its Pods: the revision holding the template now
/// reused (renumbered as the newest if an older one is newer), else created under the first
/// free name; old revisions beyond `revisionHistoryLimit` that no Pod runs deleted, oldest
/// first.
pub fn plan(
    ds: &DaemonSet,
    owned: &[ControllerRevision],
    taken: impl Fn(&str) -> bool,
    pods: &[Pod],
) -> Result<History, ReconcileError> {
    let data = patch(ds.spec.as_ref().map(|s| &s.template));
    let mut collision_count = ds.status.as_ref().and_then(|s| s.collision_count).unwrap_or(0);
    let matches = |r: &ControllerRevision| r.data.as_ref().is_some_and(|d| d.0 == data);
    let current = owned.iter().filter(|r| matches(r)).max_by_key(|r| r.revision);
    let old: Vec<&ControllerRevision> = owned.iter().filter(|r| current.is_none_or(|c| name(c) != name(r))).collect();
    let next = old.iter().map(|r| r.revision).max().unwrap_or(0) + 1;
    let mut ops = Vec::new();
    let hash = match current {
        Some(current) => {
            if current.revision < next {
                ops.push(Op::Update(ControllerRevision { revision: next, ..current.clone() }));
            }
            label(current).map_or_else(|| hash(ds, collision_count), str::to_owned)
        }
        None => {
            let ds_name = ds.metadata.name.as_deref().unwrap_or("daemonset");
            loop {
                let hash = hash(ds, collision_count);
                let candidate = format!("{}-{hash}", names::truncate(ds_name, 242));
                if !taken(&candidate) {
                    ops.push(Op::Create(new_revision(ds, candidate, &hash, data, next)));
                    break hash;
                }
                collision_count += 1;
                if collision_count > MAX_COLLISIONS {
                    return Err(ReconcileError::Invalid(format!(
                        "DaemonSet {ds_name}: no free ControllerRevision name after {MAX_COLLISIONS} hash collisions"
                    )));
                }
            }
        }
    };
    let limit = ds.spec.as_ref().and_then(|s| s.revision_history_limit).unwrap_or(DEFAULT_HISTORY_LIMIT).max(0);
    let live: BTreeSet<&str> = pods
        .iter()
        .filter_map(|p| p.metadata.labels.as_ref()?.get(CONTROLLER_REVISION_HASH))
        .map(String::as_str)
        .collect();
    let mut old = old;
    old.sort_by_key(|r| r.revision);
    let surplus = old.len().saturating_sub(limit as usize);
    let unused = old.into_iter().filter(|r| label(r).is_none_or(|h| !live.contains(h)));
    ops.extend(unused.take(surplus).map(|r| Op::Delete(r.clone())));
    Ok(History { ops, hash, collision_count })
}

/// A revision of the template: its labels and the hash, the DaemonSet's annotations (a
/// `kubernetes.io/change-cause` shows in `kubectl rollout history`) but gitplane's own, which
/// would make it look applied from Git.
fn new_revision(ds: &DaemonSet, name: String, hash: &str, data: Value, revision: i64) -> ControllerRevision {
    let template = ds.spec.as_ref().and_then(|s| s.template.metadata.as_ref());
    let mut labels = template.and_then(|m| m.labels.clone()).unwrap_or_default();
    labels.insert(CONTROLLER_REVISION_HASH.into(), hash.into());
    let annotations = ds.metadata.annotations.as_ref().map(|a| {
        a.iter().filter(|(k, _)| !k.starts_with("gitplane.io/")).map(|(k, v)| (k.clone(), v.clone())).collect()
    });
    ControllerRevision {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: ds.metadata.namespace.clone(),
            labels: Some(labels),
            annotations,
            owner_references: Some(vec![controller_ref("apps/v1", "DaemonSet", &ds.metadata)]),
            ..Default::default()
        },
        data: Some(RawExtension(data)),
        revision,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ds(image: &str, limit: i32, collisions: Option<i32>) -> DaemonSet {
        serde_json::from_value(json!({
            "metadata": {"name": "agent", "namespace": "kube-system", "uid": "ds-1",
                         "annotations": {"kubernetes.io/change-cause": "image", "gitplane.io/application": "gitplane-system/demo"}},
            "spec": {"selector": {"matchLabels": {"app": "agent"}}, "revisionHistoryLimit": limit,
                     "template": {"metadata": {"labels": {"app": "agent"}}, "spec": {"containers": [{"name": "a", "image": image}]}}},
            "status": {"currentNumberScheduled": 0, "desiredNumberScheduled": 0, "numberMisscheduled": 0, "numberReady": 0,
                       "collisionCount": collisions}
        }))
        .unwrap()
    }

    /// The revision `plan` would create for `image`, stored as number `revision`.
    fn stored(image: &str, revision: i64) -> ControllerRevision {
        let history = plan(&ds(image, 10, None), &[], |_| false, &[]).unwrap();
        let Some(Op::Create(created)) = history.ops.into_iter().next() else { panic!("no revision made") };
        ControllerRevision { revision, ..created }
    }

    fn pod_at(hash: &str) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "agent-x", "labels": {CONTROLLER_REVISION_HASH: hash}}}))
            .unwrap()
    }

    fn describe(ops: &[Op<ControllerRevision>]) -> Vec<String> {
        let image = |r: &ControllerRevision| {
            r.data.as_ref().unwrap().0["spec"]["template"]["spec"]["containers"][0]["image"]
                .as_str()
                .unwrap()
                .to_owned()
        };
        ops.iter()
            .map(|op| match op {
                Op::Create(r) => format!("create {} #{}", image(r), r.revision),
                Op::Update(r) => format!("renumber {} #{}", image(r), r.revision),
                Op::Delete(r) => format!("delete {} #{}", image(r), r.revision),
            })
            .collect()
    }

    /// (what, the DaemonSet, the revisions it controls, its Pods, the writes in words)
    type Case = (&'static str, DaemonSet, Vec<ControllerRevision>, Vec<Pod>, &'static [&'static str]);

    #[test]
    fn history_table() {
        let hash_of = |image: &str| label(&stored(image, 1)).unwrap().to_owned();
        #[rustfmt::skip]
        let cases: Vec<Case> = vec![
            ("the first template is revision 1", ds("a:1", 10, None), vec![], vec![], &["create a:1 #1"]),
            ("steady", ds("a:1", 10, None), vec![stored("a:1", 1)], vec![], &[]),
            ("a new template is the next revision", ds("a:2", 10, None), vec![stored("a:1", 1)], vec![], &["create a:2 #2"]),
            ("a template back from the history (a revert) is renumbered as the newest", ds("a:1", 10, None),
             vec![stored("a:1", 1), stored("a:2", 2)], vec![], &["renumber a:1 #3"]),
            ("history beyond the limit goes, oldest first", ds("a:4", 1, None),
             vec![stored("a:1", 1), stored("a:2", 2), stored("a:3", 3)], vec![], &["create a:4 #4", "delete a:1 #1", "delete a:2 #2"]),
            ("... but not one a Pod still runs: the next goes in its place", ds("a:4", 1, None),
             vec![stored("a:1", 1), stored("a:2", 2), stored("a:3", 3)], vec![pod_at(&hash_of("a:1"))],
             &["create a:4 #4", "delete a:2 #2", "delete a:3 #3"]),
            ("a limit of 0 keeps the current revision only", ds("a:1", 0, None), vec![stored("a:1", 2), stored("a:2", 1)], vec![],
             &["delete a:2 #1"]),
        ];
        for (what, ds, owned, pods, expected) in cases {
            let taken = |n: &str| owned.iter().any(|r| name(r) == n);
            let history = plan(&ds, &owned, taken, &pods).unwrap();
            assert_eq!(describe(&history.ops), expected, "{what}");
        }
    }

    #[test]
    fn a_revision_is_named_labelled_and_owned_as_upstream_makes_it() {
        let history = plan(&ds("a:1", 10, None), &[], |_| false, &[]).unwrap();
        let Op::Create(revision) = &history.ops[0] else { panic!("{:?}", history.ops) };
        assert_eq!(name(revision), format!("agent-{}", history.hash));
        let labels = revision.metadata.labels.as_ref().unwrap();
        assert_eq!(
            (labels["app"].as_str(), labels[CONTROLLER_REVISION_HASH].as_str()),
            ("agent", history.hash.as_str())
        );
        let annotations = revision.metadata.annotations.as_ref().unwrap();
        assert_eq!(annotations.keys().collect::<Vec<_>>(), ["kubernetes.io/change-cause"], "none of gitplane's own");
        assert_eq!(revision.metadata.owner_references.as_ref().unwrap()[0].kind, "DaemonSet");
        let template = crate::statefulset::revisions::template(revision).unwrap();
        assert_eq!(template, ds("a:1", 10, None).spec.unwrap().template, "the data restores the template");
        assert_eq!(history.hash, hash(&ds("a:1", 10, None), 0), "Pods made before revisions were stored stay current");
    }

    #[test]
    fn a_name_taken_by_another_object_bumps_the_collision_count() {
        let first = format!("agent-{}", hash(&ds("a:1", 10, None), 0));
        let history = plan(&ds("a:1", 10, None), &[], |n| n == first, &[]).unwrap();
        assert_eq!(history.collision_count, 1);
        assert_eq!(history.hash, hash(&ds("a:1", 10, None), 1));
        let resumed = plan(&ds("a:1", 10, Some(1)), &[], |_| false, &[]).unwrap();
        assert_eq!((resumed.collision_count, resumed.hash), (1, history.hash), "the status' count is where it starts");
        let all = plan(&ds("a:1", 10, None), &[], |_| true, &[]).unwrap_err();
        assert!(all.to_string().contains("no free ControllerRevision name"), "{all}");
    }
}
