//! Which Pods and claims a StatefulSet sync writes (upstream's `stateful_set_control.go` and
//! `stateful_set_utils.go`): Pods named `<set>-<ordinal>` with a stable identity, claims
//! `<template>-<set>-<ordinal>` made before their Pod and kept after it as the retention policy
//! says, OrderedReady (one Pod at a time, in order, each Running and available before the next;
//! scale down from the highest ordinal) or Parallel, then RollingUpdate (from the highest
//! ordinal down to the partition, at most maxUnavailable unavailable at a time) or OnDelete.
//! Available is Ready for `minReadySeconds` (upstream's `isRunningAndAvailable`). Pure.

use super::revisions::{self, REVISION_LABEL};
use crate::{
    ReconcileError,
    endpoints::pods::is_terminating,
    owner::controller_ref,
    plan::Op,
    replicaset::{availability, is_active, is_finished, is_ready, phase},
};
use k8s_openapi::api::{
    apps::v1::{StatefulSet, StatefulSetSpec, StatefulSetStatus},
    core::v1::{PersistentVolumeClaim, PersistentVolumeClaimVolumeSource, Pod, PodTemplateSpec, Volume},
};
use k8s_openapi::apimachinery::pkg::{
    apis::meta::v1::ObjectMeta, apis::meta::v1::OwnerReference, util::intstr::IntOrString,
};
use k8s_openapi::jiff::Timestamp;
use std::collections::BTreeMap;

/// The label naming a set's Pod, for a Service per Pod.
pub const POD_NAME_LABEL: &str = "statefulset.kubernetes.io/pod-name";
/// The label holding a Pod's ordinal.
pub const POD_INDEX_LABEL: &str = "apps.kubernetes.io/pod-index";
/// Pods (and their claims) created per transaction in Parallel, as the ReplicaSet's burst.
const BURST: usize = 500;

/// A revision's name and the Pod template it holds.
pub struct Revision<'a> {
    pub name: &'a str,
    pub template: &'a PodTemplateSpec,
}

/// The set's current revision (Pods below the partition) and update revision (its template).
pub struct Revisions<'a> {
    pub current: Revision<'a>,
    pub update: Revision<'a>,
}

/// What a sync writes: claims first, then Pods, in one transaction.
#[derive(Debug, Default, PartialEq)]
pub struct Writes {
    pub claims: Vec<Op<PersistentVolumeClaim>>,
    pub pods: Vec<Op<Pod>>,
}

fn spec(set: &StatefulSet) -> Result<&StatefulSetSpec, ReconcileError> {
    set.spec.as_ref().ok_or_else(|| ReconcileError::Invalid("StatefulSet has no spec".into()))
}

fn set_name(set: &StatefulSet) -> &str {
    set.metadata.name.as_deref().unwrap_or("")
}

/// The first ordinal (`spec.ordinals.start`).
pub fn start(set: &StatefulSet) -> i32 {
    set.spec.as_ref().and_then(|s| s.ordinals.as_ref()).and_then(|o| o.start).unwrap_or(0).max(0)
}

fn replicas(set: &StatefulSet) -> i32 {
    set.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1).max(0)
}

/// The ordinal of a Pod of `set` named `<set>-<ordinal>`.
pub fn ordinal_of(set: &str, pod: &str) -> Option<i32> {
    let digits = pod.strip_prefix(set)?.strip_prefix('-')?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

pub fn pod_name(set: &str, ordinal: i32) -> String {
    format!("{set}-{ordinal}")
}

pub fn claim_name(template: &str, set: &str, ordinal: i32) -> String {
    format!("{template}-{set}-{ordinal}")
}

/// Running and Ready, and not being deleted (upstream's `isHealthy`).
fn is_healthy(pod: &Pod) -> bool {
    phase(pod) == "Running" && is_ready(pod) && !is_terminating(pod)
}

fn min_ready(set: &StatefulSet) -> i32 {
    set.spec.as_ref().and_then(|s| s.min_ready_seconds).unwrap_or(0)
}

/// Healthy and Ready for the set's `minReadySeconds`: what OrderedReady and a RollingUpdate wait
/// for.
fn is_available(set: &StatefulSet, pod: &Pod, now: Timestamp) -> bool {
    is_healthy(pod) && availability(pod, min_ready(set), now).is_ok()
}

/// When the first of `owned` that is Ready but not yet available will be: the set's next sync.
pub fn next_available(set: &StatefulSet, owned: &[Pod], now: Timestamp) -> Option<Timestamp> {
    owned.iter().filter(|p| is_healthy(p)).filter_map(|p| availability(p, min_ready(set), now).err().flatten()).min()
}

/// The Pod of `ordinal` from `template`, labelled with its name, index and revision, its
/// hostname its name, its subdomain the governing Service, its claim templates as volumes.
pub fn new_pod(set: &StatefulSet, template: &PodTemplateSpec, revision: &str, ordinal: i32) -> Pod {
    let set_name = set_name(set);
    let name = pod_name(set_name, ordinal);
    let template_meta = template.metadata.clone().unwrap_or_default();
    let mut labels = template_meta.labels.unwrap_or_default();
    labels.insert(POD_NAME_LABEL.into(), name.clone());
    labels.insert(POD_INDEX_LABEL.into(), ordinal.to_string());
    labels.insert(REVISION_LABEL.into(), revision.into());
    let mut spec = template.spec.clone().unwrap_or_default();
    spec.hostname = Some(name.clone());
    if let Some(service) = set.spec.as_ref().and_then(|s| s.service_name.as_deref()).filter(|s| !s.is_empty()) {
        spec.subdomain = Some(service.into());
    }
    // A claim template replaces a template volume of the same name.
    let claims = claim_templates(set);
    let volumes = spec.volumes.get_or_insert_with(Vec::new);
    volumes.retain(|v| !claims.iter().any(|c| c.metadata.name.as_deref() == Some(v.name.as_str())));
    for claim in claims {
        let template_name = claim.metadata.name.clone().unwrap_or_default();
        volumes.push(Volume {
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim_name(&template_name, set_name, ordinal),
                read_only: None,
            }),
            name: template_name,
            ..Default::default()
        });
    }
    if volumes.is_empty() {
        spec.volumes = None;
    }
    Pod {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: set.metadata.namespace.clone(),
            labels: Some(labels),
            annotations: template_meta.annotations,
            owner_references: Some(vec![controller_ref("apps/v1", "StatefulSet", &set.metadata)]),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    }
}

fn claim_templates(set: &StatefulSet) -> &[PersistentVolumeClaim] {
    set.spec.as_ref().and_then(|s| s.volume_claim_templates.as_deref()).unwrap_or_default()
}

/// `persistentVolumeClaimRetentionPolicy`: (whenDeleted, whenScaled) is Delete.
fn deletes_claims(set: &StatefulSet) -> (bool, bool) {
    let policy = set.spec.as_ref().and_then(|s| s.persistent_volume_claim_retention_policy.as_ref());
    let delete = |p: Option<&String>| p.is_some_and(|p| p == "Delete");
    (delete(policy.and_then(|p| p.when_deleted.as_ref())), delete(policy.and_then(|p| p.when_scaled.as_ref())))
}

/// The owners a claim of `pod` should have (upstream's `updateClaimOwnerRefForSetAndPod`): the
/// Pod alone when whenScaled is Delete and the Pod is condemned by a scale down, else the set
/// when whenDeleted is Delete. The garbage collector deletes a claim once all its owners are
/// gone; owners that are neither are kept.
fn claim_owners(set: &StatefulSet, claim: &PersistentVolumeClaim, pod: &Pod, condemned: bool) -> Vec<OwnerReference> {
    let (when_deleted, when_scaled) = deletes_claims(set);
    let set_uid = set.metadata.uid.as_deref().unwrap_or("");
    let pod_uid = pod.metadata.uid.as_deref().unwrap_or("");
    let mut owners: Vec<OwnerReference> = claim
        .metadata
        .owner_references
        .iter()
        .flatten()
        .filter(|r| {
            let set_or_pod =
                (r.kind == "StatefulSet" && r.uid == set_uid) || (r.kind == "Pod" && r.api_version == "v1");
            !set_or_pod
        })
        .cloned()
        .collect();
    let scaled_away = when_scaled && condemned && !pod_uid.is_empty();
    if when_deleted && !scaled_away {
        owners.push(controller_ref("apps/v1", "StatefulSet", &set.metadata));
    }
    if scaled_away {
        owners.push(OwnerReference {
            api_version: "v1".into(),
            kind: "Pod".into(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid: pod_uid.into(),
            controller: None,
            block_owner_deletion: None,
        });
    }
    owners
}

/// The claims `ordinal` needs, from the claim templates, with the set's owner reference when
/// whenDeleted is Delete.
pub fn new_claims(set: &StatefulSet, ordinal: i32) -> Vec<PersistentVolumeClaim> {
    let set_name = set_name(set);
    let selector_labels = set.spec.as_ref().and_then(|s| s.selector.match_labels.clone()).unwrap_or_default();
    claim_templates(set)
        .iter()
        .map(|template| {
            let mut labels = template.metadata.labels.clone().unwrap_or_default();
            labels.extend(selector_labels.clone());
            let name = claim_name(template.metadata.name.as_deref().unwrap_or(""), set_name, ordinal);
            let owners = deletes_claims(set).0.then(|| vec![controller_ref("apps/v1", "StatefulSet", &set.metadata)]);
            PersistentVolumeClaim {
                metadata: ObjectMeta {
                    name: Some(name),
                    namespace: set.metadata.namespace.clone(),
                    labels: Some(labels),
                    annotations: template.metadata.annotations.clone(),
                    owner_references: owners,
                    ..Default::default()
                },
                spec: template.spec.clone(),
                status: None,
            }
        })
        .collect()
}

/// maxUnavailable as a Pod count: a percentage of replicas rounded up, at least 1.
fn max_unavailable(set: &StatefulSet) -> Result<i32, ReconcileError> {
    let value = set
        .spec
        .as_ref()
        .and_then(|s| s.update_strategy.as_ref())
        .and_then(|s| s.rolling_update.as_ref())
        .and_then(|r| r.max_unavailable.as_ref());
    let count = match value {
        None => 1,
        Some(IntOrString::Int(n)) => *n,
        Some(IntOrString::String(s)) => {
            let percent = s.strip_suffix('%').and_then(|p| p.parse::<i64>().ok()).ok_or_else(|| {
                ReconcileError::Invalid(format!(
                    "spec.updateStrategy.rollingUpdate.maxUnavailable {s:?} is neither a number nor a percentage such as \"25%\""
                ))
            })?;
            i32::try_from((percent.max(0) * i64::from(replicas(set)) + 99) / 100).unwrap_or(i32::MAX)
        }
    };
    Ok(count.max(1))
}

/// The writes that move the set's Pods (`owned`: the ones it controls) and claims (`claims`, by
/// name, any in its namespace) toward its spec.
pub fn plan(
    set: &StatefulSet,
    revisions: &Revisions<'_>,
    owned: &[Pod],
    claims: &BTreeMap<String, PersistentVolumeClaim>,
    now: Timestamp,
) -> Result<Writes, ReconcileError> {
    let spec = spec(set)?;
    let set_name = set_name(set);
    let ordered = spec.pod_management_policy.as_deref() != Some("Parallel");
    let (first, count) = (start(set), replicas(set));
    let strategy = spec.update_strategy.as_ref();
    let rolling = strategy.and_then(|s| s.type_.as_deref()).unwrap_or("RollingUpdate") == "RollingUpdate";
    let partition = strategy.and_then(|s| s.rolling_update.as_ref()).and_then(|r| r.partition).unwrap_or(0).max(0);

    // Slots for the ordinals first .. first+count; Pods beyond them are condemned.
    let mut slots: Vec<Option<&Pod>> = vec![None; count as usize];
    let mut condemned: Vec<(i32, &Pod)> = Vec::new();
    for pod in owned {
        let Some(ordinal) = pod.metadata.name.as_deref().and_then(|n| ordinal_of(set_name, n)) else { continue };
        match ordinal.checked_sub(first).filter(|i| (0..count).contains(i)) {
            Some(i) => slots[i as usize] = Some(pod),
            None => condemned.push((ordinal, pod)),
        }
    }
    condemned.sort_by_key(|(ordinal, _)| *ordinal);

    let mut writes = Writes::default();
    let mut healthy = vec![false; slots.len()];
    let mut created = 0;
    for (i, slot) in slots.iter().enumerate() {
        let ordinal = first + i as i32;
        match slot {
            None => {
                if created >= BURST {
                    return Ok(writes);
                }
                created += 1;
                let claims_of = new_claims(set, ordinal);
                let missing =
                    claims_of.into_iter().filter(|c| !claims.contains_key(c.metadata.name.as_deref().unwrap_or("")));
                writes.claims.extend(missing.map(Op::Create));
                // Below the partition a Pod is made from the current revision.
                let revision = if rolling && (i as i32) < partition { &revisions.current } else { &revisions.update };
                writes.pods.push(Op::Create(new_pod(set, revision.template, revision.name, ordinal)));
                if ordered {
                    return Ok(writes);
                }
            }
            Some(pod) => {
                sync_claims(set, pod, false, claims, &mut writes);
                if is_finished(pod) && !is_terminating(pod) {
                    // A finished Pod is replaced: deleted now, made again in the next sync.
                    writes.pods.push(Op::Delete((*pod).clone()));
                } else {
                    // A terminating one is waited for: its name is taken until it is gone.
                    healthy[i] = is_available(set, pod, now);
                }
                if ordered && !healthy[i] {
                    return Ok(writes);
                }
            }
        }
    }

    // Scale down from the highest ordinal; OrderedReady one at a time, once every Pod it keeps
    // is healthy (and then only the lowest unhealthy condemned Pod may go before the healthy).
    let first_unhealthy = condemned.iter().find(|(_, p)| !is_healthy(p)).map(|(o, _)| *o);
    for (ordinal, pod) in condemned.iter().rev() {
        if is_terminating(pod) {
            if ordered {
                return Ok(writes);
            }
            continue;
        }
        if ordered && !is_healthy(pod) && first_unhealthy != Some(*ordinal) {
            return Ok(writes);
        }
        sync_claims(set, pod, true, claims, &mut writes);
        writes.pods.push(Op::Delete((*pod).clone()));
        if ordered {
            return Ok(writes);
        }
    }

    if !rolling {
        return Ok(writes); // OnDelete: a Pod takes the update revision when it is deleted.
    }
    // RollingUpdate: the highest ordinals first, down to the partition, while at most
    // maxUnavailable Pods are unavailable (not yet Ready for minReadySeconds counts).
    let budget = max_unavailable(set)? - healthy.iter().filter(|h| !**h).count() as i32;
    let mut deleted = 0;
    for i in (partition as usize..slots.len()).rev() {
        if deleted >= budget {
            break;
        }
        let Some(pod) = slots[i] else { continue };
        if revisions::of(pod) != Some(revisions.update.name) && !is_terminating(pod) {
            writes.pods.push(Op::Delete(pod.clone()));
            deleted += 1;
        }
    }
    Ok(writes)
}

/// Brings the owner references of `pod`'s existing claims to the retention policy.
fn sync_claims(
    set: &StatefulSet,
    pod: &Pod,
    condemned: bool,
    claims: &BTreeMap<String, PersistentVolumeClaim>,
    writes: &mut Writes,
) {
    let Some(ordinal) = pod.metadata.name.as_deref().and_then(|n| ordinal_of(set_name(set), n)) else { return };
    for wanted in new_claims(set, ordinal) {
        let Some(claim) = claims.get(wanted.metadata.name.as_deref().unwrap_or("")) else { continue };
        let owners = claim_owners(set, claim, pod, condemned);
        if claim.metadata.owner_references.as_deref().unwrap_or_default() != owners.as_slice() {
            let mut updated = claim.clone();
            updated.metadata.owner_references = (!owners.is_empty()).then_some(owners);
            writes.claims.push(Op::Update(updated));
        }
    }
}

/// The set's status from its Pods after a sync (upstream's `updateStatefulSetStatus`): available
/// ones are Ready for minReadySeconds; a RollingUpdate is complete, and the update revision
/// becomes current, once every Pod is updated and ready.
pub fn status(
    set: &StatefulSet,
    owned: &[Pod],
    current: &str,
    update: &str,
    collision_count: i32,
    now: Timestamp,
) -> StatefulSetStatus {
    let set_name = set_name(set);
    let pods: Vec<&Pod> =
        owned.iter().filter(|p| p.metadata.name.as_deref().and_then(|n| ordinal_of(set_name, n)).is_some()).collect();
    let count = |f: &dyn Fn(&Pod) -> bool| pods.iter().filter(|p| f(p)).count() as i32;
    let replicas = count(&|_| true);
    let ready = count(&|p| is_active(p) && is_ready(p));
    let mut status = StatefulSetStatus {
        observed_generation: set.metadata.generation,
        replicas,
        ready_replicas: Some(ready),
        available_replicas: Some(count(&|p| {
            is_active(p) && is_ready(p) && availability(p, min_ready(set), now).is_ok()
        })),
        current_replicas: Some(count(&|p| revisions::of(p) == Some(current))),
        updated_replicas: Some(count(&|p| revisions::of(p) == Some(update))),
        current_revision: Some(current.into()),
        update_revision: Some(update.into()),
        collision_count: Some(collision_count),
        conditions: set.status.as_ref().and_then(|s| s.conditions.clone()),
    };
    let rolling =
        set.spec.as_ref().and_then(|s| s.update_strategy.as_ref()).and_then(|s| s.type_.as_deref()) != Some("OnDelete");
    if rolling && status.updated_replicas == Some(replicas) && ready == replicas {
        status.current_replicas = status.updated_replicas;
        status.current_revision = status.update_revision.clone();
    }
    status
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    const OLD: &str = "web-old";
    const NEW: &str = "web-new";

    /// The `web` set: `replicas`, a policy, an update strategy, claim templates `www`.
    fn set(replicas: i32, policy: &str, strategy: Value, retention: Value) -> StatefulSet {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default", "uid": "s1", "generation": 2},
            "spec": {"replicas": replicas, "serviceName": "nginx", "podManagementPolicy": policy,
                     "selector": {"matchLabels": {"app": "nginx"}}, "updateStrategy": strategy,
                     "persistentVolumeClaimRetentionPolicy": retention,
                     "template": {"metadata": {"labels": {"app": "nginx"}},
                                  "spec": {"containers": [{"name": "nginx", "image": "nginx-slim:0.21"}]}},
                     "volumeClaimTemplates": [{"metadata": {"name": "www"},
                                               "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}]}
        }))
        .unwrap()
    }

    fn rolling(partition: i32, max_unavailable: Value) -> Value {
        json!({"type": "RollingUpdate", "rollingUpdate": {"partition": partition, "maxUnavailable": max_unavailable}})
    }

    fn retain() -> Value {
        json!({"whenDeleted": "Retain", "whenScaled": "Retain"})
    }

    /// Pod `web-<ordinal>` at `revision`, in a state: `ready`, `running` (not ready), `pending`,
    /// `failed`, `terminating`.
    fn pod(ordinal: i32, revision: &str, state: &str) -> Pod {
        let (phase, ready) = match state {
            "ready" | "terminating" => ("Running", true),
            "running" => ("Running", false),
            "pending" => ("Pending", false),
            "failed" => ("Failed", false),
            other => panic!("{other}"),
        };
        let mut meta = json!({"name": format!("web-{ordinal}"), "namespace": "default", "uid": format!("p{ordinal}"),
                              "resourceVersion": "3", "labels": {REVISION_LABEL: revision}});
        if state == "terminating" {
            meta["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        serde_json::from_value(json!({"metadata": meta, "spec": {"containers": [{"name": "nginx", "image": "i"}]},
            "status": {"phase": phase, "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}}))
        .unwrap()
    }

    fn claim(ordinal: i32) -> PersistentVolumeClaim {
        serde_json::from_value(json!({"metadata": {"name": format!("www-web-{ordinal}"), "namespace": "default",
                                                   "resourceVersion": "2"}}))
        .unwrap()
    }

    fn describe(writes: &Writes) -> Vec<String> {
        let name = |m: &ObjectMeta| m.name.clone().unwrap();
        let claims = writes.claims.iter().map(|op| match op {
            Op::Create(c) => format!("create {}", name(&c.metadata)),
            Op::Update(c) => {
                let owners: Vec<String> =
                    c.metadata.owner_references.iter().flatten().map(|r| format!("{}/{}", r.kind, r.name)).collect();
                format!("own {} by [{}]", name(&c.metadata), owners.join(","))
            }
            Op::Delete(c) => format!("delete {}", name(&c.metadata)),
        });
        let pods = writes.pods.iter().map(|op| match op {
            Op::Create(p) => format!("create {} at {}", name(&p.metadata), revisions::of(p).unwrap()),
            Op::Update(p) => format!("update {}", name(&p.metadata)),
            Op::Delete(p) => format!("delete {}", name(&p.metadata)),
        });
        claims.chain(pods).collect()
    }

    fn run(set: &StatefulSet, pods: &[Pod], claims: &[PersistentVolumeClaim]) -> Vec<String> {
        let template = set.spec.as_ref().unwrap().template.clone();
        let revisions = Revisions {
            current: Revision { name: OLD, template: &template },
            update: Revision { name: NEW, template: &template },
        };
        let claims = claims.iter().map(|c| (c.metadata.name.clone().unwrap(), c.clone())).collect();
        describe(&plan(set, &revisions, pods, &claims, Timestamp::UNIX_EPOCH).unwrap())
    }

    /// (what, set, Pods, the claims that exist (by ordinal), the writes in words)
    type Case = (&'static str, StatefulSet, Vec<Pod>, Vec<i32>, Vec<&'static str>);

    #[test]
    fn t10_plan_table() {
        let ordered = |n| set(n, "OrderedReady", rolling(0, json!(1)), retain());
        let parallel = |n| set(n, "Parallel", rolling(0, json!(1)), retain());
        let partitioned = |n, p| set(n, "OrderedReady", rolling(p, json!(1)), retain());
        let ready = |o| pod(o, NEW, "ready");
        let old = |o| pod(o, OLD, "ready");
        #[rustfmt::skip]
        let cases: Vec<Case> = vec![
            ("OrderedReady creates web-0 and its claim first", ordered(3), vec![], vec![],
             vec!["create www-web-0", "create web-0 at web-new"]),
            ("OrderedReady waits for web-0 to be Running and Ready", ordered(3), vec![pod(0, NEW, "running")], vec![0], vec![]),
            ("then web-1; an existing claim is reused", ordered(3), vec![ready(0)], vec![0, 1], vec!["create web-1 at web-new"]),
            ("a gap is filled in order", ordered(3), vec![ready(0), ready(2)], vec![0, 1, 2], vec!["create web-1 at web-new"]),
            ("Parallel creates every missing Pod at once", parallel(3), vec![pod(0, NEW, "pending")], vec![0],
             vec!["create www-web-1", "create www-web-2", "create web-1 at web-new", "create web-2 at web-new"]),
            ("steady", ordered(2), vec![ready(0), ready(1)], vec![0, 1], vec![]),
            ("a failed Pod is deleted, to be made again", ordered(2), vec![pod(0, NEW, "failed"), ready(1)], vec![0, 1],
             vec!["delete web-0"]),
            ("OrderedReady scales down from the highest ordinal, one at a time", ordered(1),
             vec![ready(0), ready(1), ready(2)], vec![0, 1, 2], vec!["delete web-2"]),
            ("Parallel scales down at once", parallel(1), vec![ready(0), ready(1), ready(2)], vec![], vec!["delete web-2", "delete web-1"]),
            ("OrderedReady does not scale down while a kept Pod is unhealthy", ordered(1),
             vec![pod(0, NEW, "running"), ready(1)], vec![], vec![]),
            ("nor while a Pod terminates", ordered(1), vec![ready(0), ready(1), pod(2, NEW, "terminating")], vec![], vec![]),
            ("a healthy condemned Pod goes before a lower unhealthy one", ordered(1),
             vec![ready(0), pod(1, NEW, "running"), ready(2)], vec![], vec!["delete web-2"]),
            ("an unhealthy condemned Pod waits for a lower unhealthy one", ordered(1),
             vec![ready(0), pod(1, NEW, "running"), pod(2, NEW, "running")], vec![], vec![]),
            ("an unhealthy highest condemned Pod goes", ordered(1), vec![ready(0), ready(1), pod(2, NEW, "running")], vec![],
             vec!["delete web-2"]),
            ("RollingUpdate deletes the highest old Pod", ordered(3), vec![old(0), old(1), old(2)], vec![], vec!["delete web-2"]),
            ("and waits while one is unavailable", ordered(3), vec![old(0), old(1), pod(2, NEW, "running")], vec![], vec![]),
            ("then the next", ordered(3), vec![old(0), old(1), ready(2)], vec![], vec!["delete web-1"]),
            ("partition 2 of 3 updates web-2 only", partitioned(3, 2), vec![old(0), old(1), ready(2)], vec![], vec![]),
            ("below the partition a Pod is made at the current revision", partitioned(3, 2), vec![ready(1), ready(2)], vec![0],
             vec!["create web-0 at web-old"]),
            ("a partition above replicas updates nothing", partitioned(2, 5), vec![old(0), old(1)], vec![], vec![]),
            ("maxUnavailable 2 deletes two at once", set(3, "Parallel", rolling(0, json!(2)), retain()),
             vec![old(0), old(1), old(2)], vec![], vec!["delete web-2", "delete web-1"]),
            ("maxUnavailable 50% of 3 rounds up to 2, one already down", set(3, "Parallel", rolling(0, json!("50%")), retain()),
             vec![old(0), old(1), pod(2, NEW, "pending")], vec![], vec!["delete web-1"]),
            ("OnDelete leaves old Pods", set(2, "OrderedReady", json!({"type": "OnDelete"}), retain()), vec![old(0), old(1)], vec![], vec![]),
            ("OnDelete makes a deleted Pod at the update revision", set(2, "OrderedReady", json!({"type": "OnDelete"}), retain()),
             vec![old(0)], vec![1], vec!["create web-1 at web-new"]),
            ("spec.ordinals.start shifts the names", {
                let mut s = ordered(2);
                s.spec.as_mut().unwrap().ordinals = Some(k8s_openapi::api::apps::v1::StatefulSetOrdinals { start: Some(5) });
                s
            }, vec![ready(4)], vec![], vec!["create www-web-5", "create web-5 at web-new"]),
            ("whenScaled Delete: the condemned Pod owns its claim before it goes",
             set(1, "OrderedReady", rolling(0, json!(1)), json!({"whenDeleted": "Retain", "whenScaled": "Delete"})),
             vec![ready(0), ready(1)], vec![0, 1], vec!["own www-web-1 by [Pod/web-1]", "delete web-1"]),
            ("both Delete: the condemned Pod alone owns its claim",
             set(1, "OrderedReady", rolling(0, json!(1)), json!({"whenDeleted": "Delete", "whenScaled": "Delete"})),
             vec![ready(0), ready(1)], vec![0, 1],
             vec!["own www-web-0 by [StatefulSet/web]", "own www-web-1 by [Pod/web-1]", "delete web-1"]),
            ("whenDeleted Delete: the set owns every claim",
             set(1, "OrderedReady", rolling(0, json!(1)), json!({"whenDeleted": "Delete", "whenScaled": "Retain"})),
             vec![ready(0)], vec![0], vec!["own www-web-0 by [StatefulSet/web]"]),
        ];
        for (what, set, pods, claims, expected) in cases {
            let claims: Vec<PersistentVolumeClaim> = claims.into_iter().map(claim).collect();
            assert_eq!(run(&set, &pods, &claims), expected, "{what}");
        }
    }

    #[test]
    fn t10_pods_have_a_stable_identity_and_their_claims() {
        let set =
            set(2, "OrderedReady", rolling(0, json!(1)), json!({"whenDeleted": "Delete", "whenScaled": "Retain"}));
        let template = &set.spec.as_ref().unwrap().template;
        let pod = new_pod(&set, template, NEW, 1);
        let labels = pod.metadata.labels.as_ref().unwrap();
        assert_eq!(pod.metadata.name.as_deref(), Some("web-1"));
        assert_eq!((labels["app"].as_str(), labels[POD_NAME_LABEL].as_str()), ("nginx", "web-1"));
        assert_eq!((labels[POD_INDEX_LABEL].as_str(), labels[REVISION_LABEL].as_str()), ("1", NEW));
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!((spec.hostname.as_deref(), spec.subdomain.as_deref()), (Some("web-1"), Some("nginx")));
        let volume = &spec.volumes.as_ref().unwrap()[0];
        assert_eq!(volume.name, "www");
        assert_eq!(volume.persistent_volume_claim.as_ref().unwrap().claim_name, "www-web-1");
        assert_eq!(pod.metadata.owner_references.as_ref().unwrap()[0].kind, "StatefulSet");
        let claim = &new_claims(&set, 1)[0];
        assert_eq!(claim.metadata.name.as_deref(), Some("www-web-1"));
        assert_eq!(claim.metadata.labels.as_ref().unwrap()["app"], "nginx");
        assert_eq!(claim.metadata.owner_references.as_ref().unwrap()[0].uid, "s1", "whenDeleted: Delete");
        assert_eq!(ordinal_of("web", "web-12"), Some(12));
        for other in ["web-", "web-a", "web-1-2", "webx-1", "web--1", "web-+1"] {
            assert_eq!(ordinal_of("web", other), None, "{other}");
        }
    }

    #[test]
    fn t10_min_ready_seconds_holds_ordered_creation_and_rollouts_and_counts_availability() {
        let now = Timestamp::from_second(1_000).unwrap();
        // A Pod Ready since `ago` seconds.
        let ready_for = |ordinal, revision, ago: i64| {
            let mut p = pod(ordinal, revision, "ready");
            let since = now.checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(ago)).unwrap();
            p.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].last_transition_time =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(since));
            p
        };
        let with_min_ready = |mut set: StatefulSet| {
            set.spec.as_mut().unwrap().min_ready_seconds = Some(10);
            set
        };
        let ordered = with_min_ready(set(2, "OrderedReady", rolling(0, json!(1)), retain()));
        let parallel = with_min_ready(set(3, "Parallel", rolling(0, json!(1)), retain()));
        let plan_at = |set: &StatefulSet, pods: &[Pod]| {
            let template = set.spec.as_ref().unwrap().template.clone();
            let revisions = Revisions {
                current: Revision { name: OLD, template: &template },
                update: Revision { name: NEW, template: &template },
            };
            let claims = [0, 1, 2].map(claim).into_iter().map(|c| (c.metadata.name.clone().unwrap(), c)).collect();
            describe(&plan(set, &revisions, pods, &claims, now).unwrap())
        };
        #[rustfmt::skip]
        let cases: Vec<(&str, &StatefulSet, Vec<Pod>, Vec<&str>)> = vec![
            ("OrderedReady: the next waits while web-0 is Ready for 5 s of 10", &ordered,
             vec![ready_for(0, NEW, 5)], vec![]),
            ("... and comes once it is available", &ordered, vec![ready_for(0, NEW, 15)], vec!["create web-1 at web-new"]),
            ("a rollout waits while an updated Pod is not yet available", &parallel,
             vec![ready_for(0, OLD, 60), ready_for(1, OLD, 60), ready_for(2, NEW, 5)], vec![]),
            ("... and goes on once it is", &parallel,
             vec![ready_for(0, OLD, 60), ready_for(1, OLD, 60), ready_for(2, NEW, 15)], vec!["delete web-1"]),
        ];
        for (what, set, pods, want) in cases {
            assert_eq!(plan_at(set, &pods), want, "{what}");
        }
        let pods = [ready_for(0, NEW, 60), ready_for(1, NEW, 5), pod(2, NEW, "running")];
        let counted = status(&parallel, &pods, NEW, NEW, 0, now);
        assert_eq!((counted.ready_replicas, counted.available_replicas), (Some(2), Some(1)));
        assert_eq!(next_available(&parallel, &pods, now), Some(now + k8s_openapi::jiff::SignedDuration::from_secs(5)));
        assert_eq!(next_available(&parallel, &pods[..1], now), None);
    }

    #[test]
    fn t10_status_counts_revisions_and_completes_a_rollout() {
        let set = set(3, "OrderedReady", rolling(0, json!(1)), retain());
        let now = Timestamp::UNIX_EPOCH;
        let during =
            status(&set, &[pod(0, OLD, "ready"), pod(1, OLD, "ready"), pod(2, NEW, "running")], OLD, NEW, 0, now);
        assert_eq!((during.replicas, during.ready_replicas, during.available_replicas), (3, Some(2), Some(2)));
        assert_eq!((during.current_replicas, during.updated_replicas), (Some(2), Some(1)));
        assert_eq!((during.current_revision.as_deref(), during.update_revision.as_deref()), (Some(OLD), Some(NEW)));
        assert_eq!((during.observed_generation, during.collision_count), (Some(2), Some(0)));
        let done = status(&set, &[pod(0, NEW, "ready"), pod(1, NEW, "ready"), pod(2, NEW, "ready")], OLD, NEW, 0, now);
        assert_eq!((done.current_revision.as_deref(), done.current_replicas), (Some(NEW), Some(3)));
    }
}
