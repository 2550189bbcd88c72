//! Deployment controller: one ReplicaSet per pod template, scaled to the Deployment's replicas.
//!
//! RollingUpdate steps as Kubernetes' (`rolling.go`): the new ReplicaSet grows while all Pods
//! stay within `replicas + maxSurge`, and the old ones shrink while `replicas - maxUnavailable`
//! stay available, their unavailable Pods first. Recreate scales the old ones to zero first and
//! brings up the new one when their Pods are gone.

use crate::{
    Action, Context, ReconcileError, Reconciler,
    disruption::{self, Allowance},
    names,
    owner::{controller_ref, owner_keys_for},
    plan::Op,
    runtime::all_of,
};
use gitplane_api::events::{NORMAL, WARNING};
use gitplane_store::{Event, ObjectKey, informer::Cache};
use k8s_openapi::api::apps::v1::{Deployment, DeploymentCondition, DeploymentStatus, ReplicaSet, ReplicaSetSpec};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

pub struct DeploymentController;

/// The label that ties a ReplicaSet and its Pods to one pod template.
pub const POD_TEMPLATE_HASH: &str = "pod-template-hash";
const DEFAULT_HISTORY_LIMIT: i32 = 10;

fn replicas(rs: &ReplicaSet) -> i32 {
    rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0)
}

/// (replicas, ready, available) as the ReplicaSet's status reports them.
fn status_of(rs: &ReplicaSet) -> (i32, i32, i32) {
    let s = rs.status.as_ref();
    (
        s.map_or(0, |s| s.replicas),
        s.and_then(|s| s.ready_replicas).unwrap_or(0),
        s.and_then(|s| s.available_replicas).unwrap_or(0),
    )
}

fn scaled(rs: &ReplicaSet, to: i32) -> Op<ReplicaSet> {
    let mut rs = rs.clone();
    if let Some(spec) = rs.spec.as_mut() {
        spec.replicas = Some(to);
    }
    Op::Update(rs)
}

fn desired(d: &Deployment) -> i32 {
    d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1).max(0)
}

fn is_current(rs: &ReplicaSet, hash: &str) -> bool {
    rs.metadata.labels.as_ref().and_then(|l| l.get(POD_TEMPLATE_HASH)).is_some_and(|h| h == hash)
}

/// The writes that move a Deployment's ReplicaSets (`owned`: the ones it controls) toward its
/// spec: the ReplicaSet of the current template toward `replicas` and the old ones toward zero,
/// a step at a time (RollingUpdate) or old ones first (Recreate), and `revisionHistoryLimit`
/// old ones kept. A RollingUpdate takes no more available Pods down than `disruptions` allows
/// (its PodDisruptionBudgets', if any cover its Pods), and unavailable ones only if it lets them go.
pub fn plan(
    d: &Deployment,
    owned: &[ReplicaSet],
    disruptions: Option<&Allowance>,
) -> Result<Vec<Op<ReplicaSet>>, ReconcileError> {
    let spec = d.spec.as_ref().ok_or_else(|| ReconcileError::Invalid("Deployment has no spec".into()))?;
    let desired = desired(d);
    let recreate = spec.strategy.as_ref().and_then(|s| s.type_.as_deref()) == Some("Recreate");
    let hash = template_hash(d);
    let (new, mut old): (Vec<&ReplicaSet>, Vec<&ReplicaSet>) = owned.iter().partition(|rs| is_current(rs, &hash));
    let new = new.first().copied();
    old.sort_by_key(|rs| rs.metadata.creation_timestamp.as_ref().map(|t| t.0));
    let rollout = Rollout { d, hash: &hash, desired, new, old: &old, disruptions };
    let mut ops = if recreate { rollout.recreate()? } else { rollout.rolling()? };
    // Keep revisionHistoryLimit scaled-down ReplicaSets, oldest deleted first.
    let limit = spec.revision_history_limit.unwrap_or(DEFAULT_HISTORY_LIMIT).max(0) as usize;
    let history: Vec<&ReplicaSet> = old.into_iter().filter(|rs| replicas(rs) == 0 && status_of(rs).0 == 0).collect();
    let surplus = history.len().saturating_sub(limit);
    ops.extend(history.into_iter().take(surplus).map(|rs| Op::Delete(rs.clone())));
    Ok(ops)
}

/// A Deployment's ReplicaSets, split into the one of its current template and the old ones
/// (sorted oldest first).
struct Rollout<'a> {
    d: &'a Deployment,
    hash: &'a str,
    desired: i32,
    new: Option<&'a ReplicaSet>,
    old: &'a [&'a ReplicaSet],
    disruptions: Option<&'a Allowance>,
}

impl Rollout<'_> {
    /// Recreate: every old ReplicaSet to zero, then the new one up once their Pods are gone.
    fn recreate(&self) -> Result<Vec<Op<ReplicaSet>>, ReconcileError> {
        let mut ops: Vec<_> = self.old.iter().filter(|rs| replicas(rs) > 0).map(|rs| scaled(rs, 0)).collect();
        // Old Pods still terminating count too: Recreate never runs old and new at once.
        let terminating = |rs: &ReplicaSet| rs.status.as_ref().and_then(|s| s.terminating_replicas).unwrap_or(0);
        if self.old.iter().any(|rs| status_of(rs).0 > 0 || terminating(rs) > 0) {
            return Ok(ops);
        }
        match self.new {
            None => ops.push(Op::Create(new_replica_set(self.d, self.hash, self.desired)?)),
            Some(rs) if replicas(rs) != self.desired => ops.push(scaled(rs, self.desired)),
            Some(_) => {}
        }
        Ok(ops)
    }

    /// One RollingUpdate step (Kubernetes' `rolloutRolling`): the new ReplicaSet up within
    /// maxSurge (a changed scale ends the step, as there), else old ones down within
    /// maxUnavailable, their unavailable Pods first, the oldest ReplicaSet first.
    fn rolling(&self) -> Result<Vec<Op<ReplicaSet>>, ReconcileError> {
        let (desired, new, old) = (self.desired, self.new, self.old);
        let (max_surge, max_unavailable) = fenceposts(self.d, desired)?;
        let old_replicas: i32 = old.iter().map(|rs| replicas(rs)).sum();
        let new_replicas = new.map_or(0, replicas);
        let target = if new_replicas >= desired {
            desired
        } else {
            let room = (desired + max_surge - old_replicas - new_replicas).max(0);
            new_replicas + room.min(desired - new_replicas)
        };
        let mut ops = Vec::new();
        match new {
            None => ops.push(Op::Create(new_replica_set(self.d, self.hash, target)?)),
            Some(rs) if target != new_replicas => return Ok(vec![scaled(rs, target)]),
            Some(_) => {}
        }
        if old_replicas == 0 {
            return Ok(ops);
        }
        let min_available = desired - max_unavailable;
        let new_unavailable = target - new.map_or(0, |rs| status_of(rs).2);
        let mut scaled_down: Vec<i32> = old.iter().map(|rs| replicas(rs)).collect();
        // Unavailable old Pods go first: removing them costs no availability (but a budget's
        // IfHealthyBudget keeps them while it is short of healthy Pods).
        let mut cleanup = old_replicas + target - min_available - new_unavailable;
        if self.disruptions.is_some_and(|a| !a.unhealthy) {
            cleanup = 0;
        }
        for (rs, to) in old.iter().zip(scaled_down.iter_mut()) {
            let unavailable = (*to - status_of(rs).2).max(0).min(cleanup.max(0));
            *to -= unavailable;
            cleanup -= unavailable;
        }
        // Then available ones, as far as availability stays at min_available and the
        // PodDisruptionBudgets allow.
        let available: i32 = old.iter().chain(new.iter()).map(|rs| status_of(rs).2).sum();
        let mut budget = (available - min_available).min(self.disruptions.map_or(i32::MAX, |a| a.healthy));
        for to in scaled_down.iter_mut() {
            let down = (*to).min(budget.max(0));
            *to -= down;
            budget -= down;
        }
        ops.extend(old.iter().zip(scaled_down).filter(|(rs, to)| replicas(rs) != *to).map(|(rs, to)| scaled(rs, to)));
        Ok(ops)
    }
}

/// maxSurge and maxUnavailable as Pod counts for `desired` replicas (`ResolveFenceposts`): a
/// percentage rounds surge up and unavailability down, both 25% when unset, and when both come
/// to zero one Pod may be unavailable, so a rollout can always progress.
fn fenceposts(d: &Deployment, desired: i32) -> Result<(i32, i32), ReconcileError> {
    let rolling = d.spec.as_ref().and_then(|s| s.strategy.as_ref()).and_then(|s| s.rolling_update.as_ref());
    let surge = pod_count(rolling.and_then(|r| r.max_surge.as_ref()), "maxSurge", desired, true)?;
    let unavailable = pod_count(rolling.and_then(|r| r.max_unavailable.as_ref()), "maxUnavailable", desired, false)?;
    Ok(if surge == 0 && unavailable == 0 { (0, 1) } else { (surge, unavailable) })
}

fn pod_count(value: Option<&IntOrString>, field: &str, desired: i32, round_up: bool) -> Result<i32, ReconcileError> {
    let percent = match value {
        None => 25,
        Some(IntOrString::Int(n)) => return Ok((*n).max(0)),
        Some(IntOrString::String(s)) => s.strip_suffix('%').and_then(|p| p.parse::<i32>().ok()).ok_or_else(|| {
            ReconcileError::Invalid(format!(
                "spec.strategy.rollingUpdate.{field} {s:?} is neither a number nor a percentage such as \"25%\""
            ))
        })?,
    };
    let scaled = i64::from(percent.max(0)) * i64::from(desired);
    let count = if round_up { (scaled + 99) / 100 } else { scaled / 100 };
    Ok(i32::try_from(count).unwrap_or(i32::MAX))
}

/// The Deployment's status from the ReplicaSets it controls.
pub fn status(d: &Deployment, owned: &[ReplicaSet]) -> DeploymentStatus {
    let desired = desired(d);
    let hash = template_hash(d);
    let total = |f: fn(&ReplicaSet) -> i32| owned.iter().map(f).sum::<i32>();
    let updated = owned.iter().filter(|rs| is_current(rs, &hash)).map(|rs| status_of(rs).0).sum();
    let ready = total(|rs| status_of(rs).1);
    let available = total(|rs| status_of(rs).2);
    let replicas_now = total(|rs| status_of(rs).0);
    let complete = updated == desired && replicas_now == desired && available >= desired;
    DeploymentStatus {
        observed_generation: d.metadata.generation,
        replicas: Some(replicas_now),
        updated_replicas: Some(updated),
        ready_replicas: Some(ready),
        available_replicas: Some(available),
        unavailable_replicas: Some((desired - available).max(0)),
        conditions: Some(vec![
            condition("Available", available >= desired, "MinimumReplicasAvailable", "MinimumReplicasUnavailable"),
            condition("Progressing", true, if complete { "NewReplicaSetAvailable" } else { "ReplicaSetUpdated" }, ""),
        ]),
        ..Default::default()
    }
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

    fn workers(&self) -> usize {
        crate::runtime::CONCURRENT_SYNCS
    }

    fn keys_for(&self, event: &Event, _: &Cache) -> Vec<ObjectKey> {
        owner_keys_for::<Deployment, ReplicaSet>(event)
    }

    fn all_keys(&self, cache: &Cache) -> Vec<ObjectKey> {
        all_of::<Deployment>(cache)
    }

    async fn reconcile(&self, key: &ObjectKey, ctx: &Context) -> Result<Action, ReconcileError> {
        let Some(d) = ctx.cache().get_typed::<Deployment>(&key.namespace, &key.name) else {
            return Ok(Action::await_change());
        };
        let uid = d.metadata.uid.clone().unwrap_or_default();
        let owned = |cache: &Cache| -> Vec<ReplicaSet> { cache.controlled_by::<ReplicaSet>(&key.namespace, &uid) };
        let before = owned(ctx.cache());
        let mut pods: Vec<Pod> = before
            .iter()
            .filter_map(|rs| rs.metadata.uid.as_deref())
            .flat_map(|uid| ctx.cache().controlled_by::<Pod>(&key.namespace, uid))
            .collect();
        pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        let disruptions = disruption::disruptions_allowed(ctx.cache(), &pods);
        let ops = plan(&d, &before, disruptions.as_ref())?;
        if let Some(held) = disruptions.filter(|_| plan(&d, &before, None).is_ok_and(|free| free != ops)) {
            ctx.event("deployment-controller", &d, WARNING, disruption::HELD, &held.refusal);
        }
        let scalings = scaling_messages(&ops, &before);
        ctx.apply(ops).await?;
        for message in scalings {
            ctx.event("deployment-controller", &d, NORMAL, "ScalingReplicaSet", &message);
        }
        let status = status(&d, &owned(ctx.cache()));
        if d.status.as_ref() != Some(&status) {
            let mut updated = d.clone();
            updated.status = Some(status);
            ctx.update_status(&updated).await?;
        }
        Ok(Action::await_change())
    }
}

/// The deployment controller's ScalingReplicaSet messages for a plan (`Scaled up replica set
/// web-5d8f from 0 to 3`), a created ReplicaSet counting as scaled from 0.
fn scaling_messages(ops: &[Op<ReplicaSet>], owned: &[ReplicaSet]) -> Vec<String> {
    ops.iter()
        .filter_map(|op| {
            let (rs, from) = match op {
                Op::Create(rs) => (rs, 0),
                Op::Update(rs) => (rs, owned.iter().find(|o| o.metadata.name == rs.metadata.name).map_or(0, replicas)),
                Op::Delete(_) => return None,
            };
            let to = replicas(rs);
            let direction = match to.cmp(&from) {
                std::cmp::Ordering::Greater => "up",
                std::cmp::Ordering::Less => "down",
                std::cmp::Ordering::Equal => return None,
            };
            Some(format!(
                "Scaled {direction} replica set {} from {from} to {to}",
                rs.metadata.name.as_deref().unwrap_or("")
            ))
        })
        .collect()
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
    use k8s_openapi::api::apps::v1::ReplicaSetStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
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

    /// A Deployment of `replicas` with the given strategy and history limit.
    fn spec(replicas: Option<i32>, strategy: Option<&str>, history: Option<i32>) -> Deployment {
        let mut d = deployment("a:1");
        let spec = d.spec.as_mut().unwrap();
        spec.replicas = replicas;
        spec.revision_history_limit = history;
        spec.strategy = strategy
            .map(|t| k8s_openapi::api::apps::v1::DeploymentStrategy { type_: Some(t.into()), ..Default::default() });
        d
    }

    /// A RollingUpdate Deployment of `replicas` with the given maxSurge and maxUnavailable.
    fn rolling(replicas: i32, surge: IntOrString, unavailable: IntOrString) -> Deployment {
        let mut d = spec(Some(replicas), Some("RollingUpdate"), None);
        d.spec.as_mut().unwrap().strategy.as_mut().unwrap().rolling_update =
            Some(k8s_openapi::api::apps::v1::RollingUpdateDeployment {
                max_surge: Some(surge),
                max_unavailable: Some(unavailable),
            });
        d
    }

    #[test]
    fn a_malformed_percentage_is_the_deployments_error() {
        let d = rolling(3, IntOrString::String("a lot".into()), IntOrString::Int(0));
        let err = plan(&d, &[], None).unwrap_err().to_string();
        assert!(err.contains("maxSurge \"a lot\" is neither a number nor a percentage"), "{err}");
    }

    /// A ReplicaSet of the current template (`new`) or an old one (any other name) that wants
    /// `replicas`, has `pods` of which `available` are available, created at second `created`.
    fn rs(d: &Deployment, name: &str, replicas: i32, pods: i32, available: i32, created: i64) -> ReplicaSet {
        let hash = if name == "new" { template_hash(d) } else { format!("{name}-hash") };
        let mut rs = new_replica_set(d, &hash, replicas).unwrap();
        rs.metadata.name = Some(name.into());
        rs.metadata.resource_version = Some("7".into());
        rs.metadata.creation_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::from_second(created).unwrap()));
        rs.status = Some(ReplicaSetStatus {
            replicas: pods,
            ready_replicas: Some(available),
            available_replicas: Some(available),
            ..Default::default()
        });
        rs
    }

    /// The plan in words: `create 3` (the new ReplicaSet), `scale old 0`, `delete old`.
    fn describe(ops: &[Op<ReplicaSet>]) -> Vec<String> {
        ops.iter()
            .map(|op| match op {
                Op::Create(rs) => format!("create {}", replicas(rs)),
                Op::Update(rs) => format!("scale {} {}", rs.metadata.name.as_deref().unwrap(), replicas(rs)),
                Op::Delete(rs) => format!("delete {}", rs.metadata.name.as_deref().unwrap()),
            })
            .collect()
    }

    #[test]
    fn plan_table() {
        type Owned = fn(&Deployment) -> Vec<ReplicaSet>;
        let none: Owned = |_| vec![];
        #[rustfmt::skip]
        let cases: Vec<(&str, Deployment, Owned, &[&str])> = vec![
            ("first rollout", spec(Some(3), None, None), none, &["create 3"]),
            ("replicas default to 1", spec(None, None, None), none, &["create 1"]),
            ("zero replicas still make the ReplicaSet", spec(Some(0), None, None), none, &["create 0"]),
            ("scale up", spec(Some(3), None, None), |d| vec![rs(d, "new", 2, 2, 2, 1)], &["scale new 3"]),
            ("scale down", spec(Some(3), None, None), |d| vec![rs(d, "new", 5, 5, 5, 1)], &["scale new 3"]),
            ("steady", spec(Some(3), None, None), |d| vec![rs(d, "new", 3, 3, 3, 1)], &[]),
            ("rolling: the new one comes up within maxSurge (25% of 3, rounded up)",
             spec(Some(3), None, None), |d| vec![rs(d, "old", 3, 3, 3, 1)], &["create 1"]),
            ("rolling: nothing goes while the surge Pod is not available (maxUnavailable 0)",
             spec(Some(3), None, None), |d| vec![rs(d, "old", 3, 3, 3, 1), rs(d, "new", 1, 1, 0, 2)], &[]),
            ("rolling: an old Pod goes once the new one is available",
             spec(Some(3), None, None), |d| vec![rs(d, "old", 3, 3, 3, 1), rs(d, "new", 1, 1, 1, 2)], &["scale old 2"]),
            ("rolling: then the new one grows again",
             spec(Some(3), None, None), |d| vec![rs(d, "old", 2, 2, 2, 1), rs(d, "new", 1, 1, 1, 2)], &["scale new 2"]),
            ("rolling: the last old ones go once the new one is available",
             spec(Some(3), None, None), |d| vec![rs(d, "old", 3, 3, 3, 1), rs(d, "new", 3, 3, 3, 2)], &["scale old 0"]),
            ("rolling: a scale-up with a new template stays within replicas + maxSurge",
             spec(Some(3), None, None), |d| vec![rs(d, "old", 2, 2, 2, 1)], &["create 2"]),
            ("rolling: a new image that never becomes available leaves the old Pods running",
             spec(Some(3), None, None), |d| vec![rs(d, "old", 2, 2, 2, 1), rs(d, "new", 2, 2, 0, 2)], &[]),
            ("rolling: unavailable old Pods go first (25% of 4: one may be unavailable)",
             spec(Some(4), None, None),
             |d| vec![rs(d, "old2", 2, 2, 2, 2), rs(d, "old1", 2, 2, 0, 1), rs(d, "new", 1, 1, 1, 3)],
             &["scale old1 0"]),
            ("rolling: then available ones, the oldest ReplicaSet first",
             spec(Some(4), None, None),
             |d| vec![rs(d, "old2", 2, 2, 2, 2), rs(d, "old1", 2, 2, 2, 1), rs(d, "new", 1, 1, 1, 3)],
             &["scale old1 0"]),
            ("rolling: maxSurge 0 and maxUnavailable 1 scale the old one down first",
             rolling(4, IntOrString::Int(0), IntOrString::Int(1)), |d| vec![rs(d, "old", 4, 4, 4, 1)], &["create 0", "scale old 3"]),
            ("rolling: 100% maxSurge brings the whole new ReplicaSet up at once",
             rolling(3, IntOrString::String("100%".into()), IntOrString::Int(0)), |d| vec![rs(d, "old", 3, 3, 3, 1)], &["create 3"]),
            ("rolling: both zero leave one Pod unavailable, so the rollout progresses",
             rolling(2, IntOrString::Int(0), IntOrString::String("0%".into())), |d| vec![rs(d, "old", 2, 2, 2, 1)], &["create 0", "scale old 1"]),
            ("Recreate: the old ones go first",
             spec(Some(3), Some("Recreate"), None), |d| vec![rs(d, "old", 3, 3, 3, 1)], &["scale old 0"]),
            ("Recreate: the new one waits for the old Pods to be gone",
             spec(Some(3), Some("Recreate"), None), |d| vec![rs(d, "old", 0, 2, 2, 1)], &[]),
            ("Recreate: ... and for its terminating Pods",
             spec(Some(3), Some("Recreate"), None),
             |d| { let mut old = rs(d, "old", 0, 0, 0, 1); old.status.as_mut().unwrap().terminating_replicas = Some(1); vec![old] },
             &[]),
            ("Recreate: then the new one comes up",
             spec(Some(3), Some("Recreate"), None), |d| vec![rs(d, "old", 0, 0, 0, 1)], &["create 3"]),
            ("Recreate: a scale-up of the new one also waits",
             spec(Some(3), Some("Recreate"), None), |d| vec![rs(d, "old", 0, 1, 0, 1), rs(d, "new", 1, 1, 1, 2)], &[]),
            ("revisionHistoryLimit: the oldest scaled-down ones go",
             spec(Some(1), None, Some(1)),
             |d| vec![rs(d, "old2", 0, 0, 0, 2), rs(d, "old1", 0, 0, 0, 1), rs(d, "old3", 0, 0, 0, 3), rs(d, "new", 1, 1, 1, 4)],
             &["delete old1", "delete old2"]),
            ("revisionHistoryLimit: an old one with Pods left is not history yet",
             spec(Some(1), None, Some(0)),
             |d| vec![rs(d, "old1", 0, 1, 1, 1), rs(d, "old2", 0, 0, 0, 2), rs(d, "new", 1, 1, 1, 3)],
             &["delete old2"]),
            ("revisionHistoryLimit defaults to 10",
             spec(Some(1), None, None),
             |d| (0..11).map(|i| rs(d, &format!("old{i:02}"), 0, 0, 0, i)).chain([rs(d, "new", 1, 1, 1, 20)]).collect(),
             &["delete old00"]),
        ];
        for (name, d, owned, expected) in cases {
            let ops = plan(&d, &owned(&d), None).unwrap();
            assert_eq!(describe(&ops), expected, "{name}");
        }
    }

    #[test]
    fn rolling_updates_stay_within_the_disruption_budget() {
        let d = rolling(4, IntOrString::Int(0), IntOrString::Int(2));
        let healthy = |d: &Deployment| vec![rs(d, "old", 4, 4, 4, 1), rs(d, "new", 0, 0, 0, 2)];
        // Unavailable old Pods cost no availability: only IfHealthyBudget on a short budget holds them.
        let broken = |d: &Deployment| vec![rs(d, "old", 4, 4, 0, 1), rs(d, "new", 0, 0, 0, 2)];
        let allows = |healthy: i32, unhealthy: bool| Some(Allowance { healthy, unhealthy, refusal: String::new() });
        type Owned = fn(&Deployment) -> Vec<ReplicaSet>;
        #[rustfmt::skip]
        let cases: [(&str, Owned, Option<Allowance>, &[&str]); 7] = [
            ("no budget: maxUnavailable alone", healthy, None, &["scale old 2"]),
            ("a budget allowing one", healthy, allows(1, true), &["scale old 3"]),
            ("a budget allowing none", healthy, allows(0, true), &[]),
            ("a budget allowing more than maxUnavailable", healthy, allows(5, true), &["scale old 2"]),
            ("unavailable Pods, AlwaysAllow or a healthy budget", broken, allows(0, true), &["scale old 2"]),
            ("unavailable Pods, IfHealthyBudget short of healthy Pods", broken, allows(0, false), &[]),
            ("unavailable Pods, no budget", broken, None, &["scale old 2"]),
        ];
        for (what, owned, allowance, expected) in cases {
            assert_eq!(describe(&plan(&d, &owned(&d), allowance.as_ref()).unwrap()), expected, "{what}");
        }
    }

    #[test]
    fn plan_writes_compare_and_swap_on_what_was_read() {
        let d = spec(Some(3), None, Some(0));
        let owned = [rs(&d, "old", 3, 3, 3, 1), rs(&d, "new", 3, 3, 3, 2)];
        let ops = plan(&d, &owned, None).unwrap();
        let now = gitplane_api::k8s_openapi::jiff::Timestamp::UNIX_EPOCH;
        let Some(gitplane_store::Op::Update(scaled)) = ops[0].clone().into_store_op(now) else { panic!("{ops:?}") };
        assert_eq!(scaled["metadata"]["resourceVersion"], "7");
        let new = plan(&d, &[], None).unwrap().remove(0);
        let Op::Create(new) = new else { panic!("{new:?}") };
        assert_eq!(new.metadata.name, Some(format!("web-{}", template_hash(&d))));
        assert!(plan(&Deployment::default(), &[], None).is_err(), "no spec");
    }

    #[test]
    fn scaling_is_recorded_as_the_deployment_controller_says_it() {
        let d = spec(Some(3), None, Some(0));
        let owned = [rs(&d, "old", 3, 3, 3, 1), rs(&d, "new", 1, 1, 1, 2)];
        let ops = [scaled(&owned[1], 3), scaled(&owned[0], 0), Op::Delete(owned[0].clone())];
        assert_eq!(
            scaling_messages(&ops, &owned),
            ["Scaled up replica set new from 1 to 3", "Scaled down replica set old from 3 to 0"]
        );
        let created = plan(&d, &[], None).unwrap();
        assert_eq!(
            scaling_messages(&created, &[]),
            [format!("Scaled up replica set web-{} from 0 to 3", template_hash(&d))]
        );
        assert!(scaling_messages(&[scaled(&owned[0], 3)], &owned).is_empty(), "no change, no Event");
    }

    #[test]
    fn status_counts_the_replica_sets() {
        let d = spec(Some(3), None, None);
        let rollout = status(&d, &[rs(&d, "old", 3, 3, 3, 1), rs(&d, "new", 3, 3, 1, 2)]);
        assert_eq!(
            (rollout.replicas, rollout.updated_replicas, rollout.available_replicas, rollout.unavailable_replicas),
            (Some(6), Some(3), Some(4), Some(0))
        );
        assert_eq!(rollout.conditions.as_ref().unwrap()[1].reason.as_deref(), Some("ReplicaSetUpdated"));
        let done = status(&d, &[rs(&d, "new", 3, 3, 3, 2)]);
        let conditions = done.conditions.unwrap();
        assert_eq!((conditions[0].type_.as_str(), conditions[0].status.as_str()), ("Available", "True"));
        assert_eq!(conditions[1].reason.as_deref(), Some("NewReplicaSetAvailable"));
        let short = status(&d, &[rs(&d, "new", 3, 3, 1, 2)]);
        assert_eq!(short.unavailable_replicas, Some(2));
        assert_eq!(short.conditions.unwrap()[0].reason.as_deref(), Some("MinimumReplicasUnavailable"));
    }
}
