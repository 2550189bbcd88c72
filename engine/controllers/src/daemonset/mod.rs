//! DaemonSet controller: one Pod of the template on every node that should run it.
//!
//! As upstream's (`daemon_controller.go`, `update.go`): a node should run a daemon Pod when the
//! template's nodeSelector, required node affinity and tolerations (plus the tolerations every
//! daemon Pod gets, [`daemon_tolerations`]) admit it; a Pod already there keeps running while
//! its NoExecute taints are tolerated. Pods are created pinned to their node by the required
//! node affinity `metadata.name In [node]` and placed by the scheduler, which binds them only
//! where they fit. A sync first makes each node hold what it should (create, delete extras,
//! failed Pods and Pods on nodes that should not run one); only a sync with nothing of that to
//! do moves a RollingUpdate on: old Pods deleted within maxUnavailable (their replacements come
//! with the next sync), or with maxSurge a new Pod beside the old one, which goes once the new
//! one is available. OnDelete leaves old Pods until someone deletes them.
//!
//! A node's failed daemon Pod is deleted only after its [`backoff`], with a `FailedDaemonPod`
//! Warning Event, and replaced by the sync after; each template is a ControllerRevision
//! ([`history`]) whose hash labels the Pods made from it.

pub mod backoff;
pub mod history;

use crate::{
    Action, Context, ReconcileError, Reconciler,
    disruption::{self, Allowance},
    names,
    owner::{controller_ref, controllers_of},
    plan::Op,
    replicaset::{availability, is_ready, is_terminating, phase, pod_events},
    runtime::all_of,
};
use backoff::Backoff;
use gitplane_api::events::{NORMAL, WARNING};
use gitplane_api::nodeaffinity::{pin_to_node, required_matches, target_node};
use gitplane_api::object::kind_of;
use gitplane_api::taints::{
    DISK_PRESSURE, MEMORY_PRESSURE, NO_EXECUTE, NO_SCHEDULE, NOT_READY, PID_PRESSURE, UNREACHABLE, UNSCHEDULABLE,
    tolerates,
};
use gitplane_store::{Event, ObjectKey, informer::Cache};
pub use history::CONTROLLER_REVISION_HASH;
use k8s_openapi::api::apps::v1::{ControllerRevision, DaemonSet, DaemonSetStatus};
use k8s_openapi::api::core::v1::{Node, Pod, PodSpec, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

#[derive(Default)]
pub struct DaemonSetController {
    /// When each node's next failed daemon Pod may be deleted (upstream's `failedPodsBackoff`).
    failed_pods: Mutex<Backoff>,
}

/// The reason of the Warning Event a DaemonSet gets when one of its Pods failed and is deleted.
pub const FAILED_DAEMON_POD: &str = "FailedDaemonPod";

/// The tolerations upstream adds to every daemon Pod (`AddOrUpdateDaemonPodTolerations`): a
/// daemon stays on a node that is not ready or unreachable, and lands on nodes under pressure
/// or cordoned.
pub fn daemon_tolerations() -> Vec<Toleration> {
    let exists = |key: &str, effect: &str| Toleration {
        key: Some(key.into()),
        operator: Some("Exists".into()),
        effect: Some(effect.into()),
        ..Default::default()
    };
    vec![
        exists(NOT_READY, NO_EXECUTE),
        exists(UNREACHABLE, NO_EXECUTE),
        exists(DISK_PRESSURE, NO_SCHEDULE),
        exists(MEMORY_PRESSURE, NO_SCHEDULE),
        exists(PID_PRESSURE, NO_SCHEDULE),
        exists(UNSCHEDULABLE, NO_SCHEDULE),
    ]
}

/// The template's Pod spec with the daemon tolerations added where it lacks them.
fn daemon_pod_spec(ds: &DaemonSet) -> Result<PodSpec, ReconcileError> {
    let spec = ds.spec.as_ref().ok_or_else(|| ReconcileError::Invalid("DaemonSet has no spec".into()))?;
    let mut pod =
        spec.template.spec.clone().ok_or_else(|| ReconcileError::Invalid("DaemonSet has no Pod spec".into()))?;
    let tolerations = pod.tolerations.get_or_insert_with(Vec::new);
    for toleration in daemon_tolerations() {
        if !tolerations.contains(&toleration) {
            tolerations.push(toleration);
        }
    }
    Ok(pod)
}

/// Whether a node should run a daemon Pod, and whether one already there may stay
/// (upstream's `NodeShouldRunDaemonPod`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Eligibility {
    pub should_run: bool,
    pub should_continue_running: bool,
}

/// Eligibility of `node` for daemon Pods of `spec` (the template with [`daemon_tolerations`]):
/// the template's nodeName, nodeSelector and required node affinity must admit the node, and
/// every NoSchedule and NoExecute taint be tolerated; a Pod already there may stay while its
/// NoExecute taints are.
pub fn eligibility(spec: &PodSpec, node: &Node) -> Eligibility {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let pinned_elsewhere = spec.node_name.as_deref().is_some_and(|n| !n.is_empty() && n != name);
    if pinned_elsewhere || !required_matches(spec, node) {
        return Eligibility { should_run: false, should_continue_running: false };
    }
    let tolerations = spec.tolerations.as_deref().unwrap_or_default();
    let taints = node.spec.as_ref().and_then(|s| s.taints.as_deref()).unwrap_or_default();
    let untolerated =
        |effect: &str| taints.iter().any(|t| t.effect == effect && !tolerations.iter().any(|o| tolerates(o, t)));
    let stays = !untolerated(NO_EXECUTE);
    Eligibility { should_run: stays && !untolerated(NO_SCHEDULE), should_continue_running: stays }
}

fn is_updated(pod: &Pod, hash: &str) -> bool {
    pod.metadata.labels.as_ref().and_then(|l| l.get(CONTROLLER_REVISION_HASH)).is_some_and(|h| h == hash)
}

/// Finished, or terminating: no longer the node's daemon Pod.
fn is_finished(pod: &Pod) -> bool {
    !crate::replicaset::is_active(pod)
}

/// Bound Pods first, then the oldest, then by name (`podByCreationTimestampAndPhase`).
fn oldest_first(pods: &mut [&Pod]) {
    pods.sort_by_key(|p| {
        let unbound = p.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_none_or(str::is_empty);
        (unbound, p.metadata.creation_timestamp.as_ref().map(|t| t.0), p.metadata.name.clone())
    });
}

/// What the controller sees: the DaemonSet, its current revision's hash, the nodes, its Pods,
/// and the time.
pub struct View<'a> {
    pub ds: &'a DaemonSet,
    pub hash: &'a str,
    pub nodes: &'a [Node],
    pub owned: &'a [Pod],
    pub now: Timestamp,
    /// What its PodDisruptionBudgets allow (`None`: no budget covers its Pods).
    pub disruptions: Option<&'a Allowance>,
    /// The nodes whose failed Pod waits out its back-off, and for how long still.
    pub backing_off: &'a BTreeMap<String, Duration>,
}

impl View<'_> {
    fn min_ready(&self) -> i32 {
        self.ds.spec.as_ref().and_then(|s| s.min_ready_seconds).unwrap_or(0)
    }

    fn available(&self, pod: &Pod) -> bool {
        availability(pod, self.min_ready(), self.now).is_ok()
    }

    /// Each node's eligibility and its Pods, by node name; Pods targeting no known node under
    /// the empty name.
    fn by_node(&self) -> Result<BTreeMap<String, (Eligibility, Vec<&Pod>)>, ReconcileError> {
        let spec = daemon_pod_spec(self.ds)?;
        let gone = Eligibility { should_run: false, should_continue_running: false };
        let mut nodes: BTreeMap<String, (Eligibility, Vec<&Pod>)> = self
            .nodes
            .iter()
            .map(|n| (n.metadata.name.clone().unwrap_or_default(), (eligibility(&spec, n), Vec::new())))
            .collect();
        for pod in self.owned {
            let node = target_node(pod).filter(|n| nodes.contains_key(*n)).unwrap_or_default().to_owned();
            nodes.entry(node).or_insert((gone, Vec::new())).1.push(pod);
        }
        Ok(nodes)
    }

    fn surge_allowed(&self) -> bool {
        let rolling = self.rolling_update();
        rolling.is_some() && rolling.and_then(|r| r.max_surge.as_ref()).is_some_and(|s| !is_zero(s))
    }

    fn rolling_update(&self) -> Option<&k8s_openapi::api::apps::v1::RollingUpdateDaemonSet> {
        let strategy = self.ds.spec.as_ref()?.update_strategy.as_ref();
        match strategy.and_then(|s| s.type_.as_deref()) {
            Some("OnDelete") => None,
            _ => Some(strategy.and_then(|s| s.rolling_update.as_ref()).map_or(&DEFAULT_ROLLING, |r| r)),
        }
    }
}

static DEFAULT_ROLLING: k8s_openapi::api::apps::v1::RollingUpdateDaemonSet =
    k8s_openapi::api::apps::v1::RollingUpdateDaemonSet { max_surge: None, max_unavailable: None };

fn is_zero(value: &IntOrString) -> bool {
    match value {
        IntOrString::Int(n) => *n == 0,
        IntOrString::String(s) => s.trim_end_matches('%').parse::<i32>().is_ok_and(|n| n == 0),
    }
}

/// What a sync decides.
#[derive(Debug, Default, PartialEq)]
pub struct Plan {
    pub pods: Vec<Op<Pod>>,
    /// The failed Pods among the deletes, by node: each restarts its node's back-off and is
    /// told in a `FailedDaemonPod` Event.
    pub failed: Vec<(String, Pod)>,
    /// When the first failed Pod held by its back-off may go.
    pub retry_after: Option<Duration>,
}

/// The writes that bring the DaemonSet's Pods to what its nodes should run, then, if there is
/// nothing of that to do, one step of its RollingUpdate.
pub fn plan(view: &View<'_>) -> Result<Plan, ReconcileError> {
    let mut plan = manage(view)?;
    if plan.pods.is_empty() && view.rolling_update().is_some() {
        plan.pods = rolling_update(view)?;
    }
    Ok(plan)
}

/// Each node to what it should hold (upstream's `podsShouldBeOnNode`).
fn manage(view: &View<'_>) -> Result<Plan, ReconcileError> {
    let surge = view.surge_allowed();
    let mut plan = Plan::default();
    let ops = &mut plan.pods;
    for (node, (eligible, pods)) in view.by_node()? {
        // Any Pod there, even one terminating or failed, means no new one yet (upstream's
        // `exists`): two never run at once, and a failed Pod is replaced only once it is
        // deleted, which its back-off paces.
        let exists = !pods.is_empty();
        let pods = pods.into_iter().filter(|p| !is_terminating(p));
        if !eligible.should_continue_running {
            ops.extend(pods.map(|p| Op::Delete(p.clone())));
            continue;
        }
        if !exists {
            if eligible.should_run {
                ops.push(Op::Create(new_pod(view.ds, &node, view.hash)?));
            }
            continue;
        }
        let mut running = Vec::new();
        let mut held = view.backing_off.get(&node).copied();
        for pod in pods {
            match phase(pod) {
                "Failed" => match held {
                    Some(wait) => {
                        // After one deletion the node's others wait for the next back-off.
                        if !wait.is_zero() {
                            plan.retry_after = Some(plan.retry_after.map_or(wait, |r| r.min(wait)));
                        }
                    }
                    None => {
                        ops.push(Op::Delete(pod.clone()));
                        plan.failed.push((node.clone(), pod.clone()));
                        held = Some(Duration::ZERO);
                    }
                },
                "Succeeded" => ops.push(Op::Delete(pod.clone())),
                _ => running.push(pod),
            }
        }
        if running.is_empty() {
            continue;
        }
        oldest_first(&mut running);
        if !surge {
            ops.extend(running[1..].iter().map(|p| Op::Delete((*p).clone())));
            continue;
        }
        // With surge, an old Pod may stay beside the oldest new one until that one is available.
        let (mut new, mut old): (Option<&Pod>, Option<&Pod>) = (None, None);
        for pod in running {
            let slot = if is_updated(pod, view.hash) { &mut new } else { &mut old };
            match slot {
                None => *slot = Some(pod),
                Some(_) => ops.push(Op::Delete(pod.clone())),
            }
        }
        if let (Some(new), Some(old)) = (new, old)
            && (!is_ready(old) || view.available(new))
        {
            ops.push(Op::Delete(old.clone()));
        }
    }
    Ok(plan)
}

/// maxSurge and maxUnavailable as Pod counts of `desired` nodes, both rounded up; both zero
/// means one may be unavailable (upstream's `updatedDesiredNodeCounts`).
fn fenceposts(view: &View<'_>, desired: i32) -> Result<(i32, i32), ReconcileError> {
    let rolling = view.rolling_update();
    let count = |value: Option<&IntOrString>, default: i32, field: &str| -> Result<i32, ReconcileError> {
        match value {
            None => Ok(default),
            Some(IntOrString::Int(n)) => Ok((*n).max(0)),
            Some(IntOrString::String(s)) => {
                let percent = s.strip_suffix('%').and_then(|p| p.parse::<i64>().ok()).ok_or_else(|| {
                    ReconcileError::Invalid(format!(
                        "spec.updateStrategy.rollingUpdate.{field} {s:?} is neither a number nor a percentage such as \"10%\""
                    ))
                })?;
                Ok(i32::try_from((percent.max(0) * i64::from(desired) + 99) / 100).unwrap_or(i32::MAX))
            }
        }
    };
    let surge = count(rolling.and_then(|r| r.max_surge.as_ref()), 0, "maxSurge")?;
    let unavailable = count(rolling.and_then(|r| r.max_unavailable.as_ref()), 1, "maxUnavailable")?;
    Ok(if desired > 0 && surge == 0 && unavailable == 0 { (0, 1) } else { (surge, unavailable) })
}

/// One RollingUpdate step (upstream's `rollingUpdate`), nodes in name order. Without surge: old
/// Pods that are not available are replaced at once, available ones while fewer than
/// maxUnavailable nodes lack an available updated Pod. With surge: a new Pod beside an old one
/// on at most maxSurge nodes at a time (at once where the old one is not available); the old
/// one goes once the new one is available. Available old Pods are deleted only within the
/// PodDisruptionBudgets that cover them, unavailable ones as their unhealthyPodEvictionPolicy
/// lets them.
fn rolling_update(view: &View<'_>) -> Result<Vec<Op<Pod>>, ReconcileError> {
    let hash = view.hash;
    let nodes: Vec<(String, Vec<&Pod>)> =
        view.by_node()?.into_iter().filter(|(_, (e, _))| e.should_run).map(|(n, (_, pods))| (n, pods)).collect();
    let desired = i32::try_from(nodes.len()).unwrap_or(i32::MAX);
    let (max_surge, max_unavailable) = fenceposts(view, desired)?;
    let mut budget = view.disruptions.map_or(i32::MAX, |a| a.healthy);
    let unhealthy_may_go = view.disruptions.is_none_or(|a| a.unhealthy);
    let mut ops = Vec::new();
    if max_surge == 0 {
        let mut unavailable = 0;
        let mut candidates = Vec::new();
        for (_, pods) in &nodes {
            match updated_and_old(pods, hash) {
                None | Some((None, None)) | Some((Some(_), Some(_))) => unavailable += 1,
                Some((Some(new), None)) => unavailable += i32::from(!view.available(new)),
                Some((None, Some(old))) if !view.available(old) => {
                    if unhealthy_may_go {
                        ops.push(Op::Delete(old.clone()));
                    }
                    unavailable += i32::from(!unhealthy_may_go);
                }
                Some((None, Some(old))) => candidates.push(old),
            }
        }
        let room = (max_unavailable - unavailable).max(0).min(budget.max(0));
        ops.extend(candidates.into_iter().take(room as usize).map(|p| Op::Delete(p.clone())));
        return Ok(ops);
    }
    let mut surging = 0;
    let (mut replace_now, mut candidates) = (Vec::new(), Vec::new());
    for (node, pods) in &nodes {
        match updated_and_old(pods, hash) {
            None => surging += 1,
            Some((_, None)) => {}
            Some((None, Some(old))) if !view.available(old) => replace_now.push(node.as_str()),
            Some((None, Some(_))) => candidates.push(node.as_str()),
            Some((Some(new), Some(_))) if !view.available(new) => surging += 1,
            Some((Some(_), Some(old))) if budget > 0 => {
                budget -= 1;
                ops.push(Op::Delete(old.clone()));
            }
            Some((Some(_), Some(_))) => {}
        }
    }
    let room = (max_surge - surging).max(0) as usize;
    for node in replace_now.into_iter().chain(candidates.into_iter().take(room)) {
        ops.push(Op::Create(new_pod(view.ds, node, hash)?));
    }
    Ok(ops)
}

/// The node's updated and old Pod (`findUpdatedPodsOnNode`); `None` when it has more than one
/// of either, which the next sync's clean-up resolves first.
fn updated_and_old<'a>(pods: &[&'a Pod], hash: &str) -> Option<(Option<&'a Pod>, Option<&'a Pod>)> {
    let (mut new, mut old) = (None, None);
    for pod in pods.iter().filter(|p| !is_finished(p)) {
        let slot = if is_updated(pod, hash) { &mut new } else { &mut old };
        if slot.replace(*pod).is_some() {
            return None;
        }
    }
    Some((new, old))
}

/// A daemon Pod of the template for `node`: the daemon tolerations added, pinned to the node by
/// its required node affinity, labelled with the template's hash.
fn new_pod(ds: &DaemonSet, node: &str, hash: &str) -> Result<Pod, ReconcileError> {
    let mut spec = daemon_pod_spec(ds)?;
    pin_to_node(&mut spec, node);
    let template_meta = ds.spec.as_ref().and_then(|s| s.template.metadata.clone()).unwrap_or_default();
    let mut labels = template_meta.labels.unwrap_or_default();
    labels.insert(CONTROLLER_REVISION_HASH.into(), hash.into());
    Ok(Pod {
        metadata: ObjectMeta {
            name: Some(names::generate(ds.metadata.name.as_deref().unwrap_or("daemon"))),
            namespace: ds.metadata.namespace.clone(),
            labels: Some(labels),
            annotations: template_meta.annotations,
            owner_references: Some(vec![controller_ref("apps/v1", "DaemonSet", &ds.metadata)]),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    })
}

/// The DaemonSet's status (upstream's `updateDaemonSetStatus`): on each node that should run
/// it, its oldest Pod counted as scheduled, ready, available and updated; Pods on nodes that
/// should not run one as misscheduled. Also when the next Pod becomes available, if one waits
/// for minReadySeconds.
pub fn status(view: &View<'_>) -> Result<(DaemonSetStatus, Option<Timestamp>), ReconcileError> {
    let hash = view.hash;
    let mut status = DaemonSetStatus { observed_generation: view.ds.metadata.generation, ..Default::default() };
    let (mut ready, mut available, mut updated) = (0, 0, 0);
    let mut next: Option<Timestamp> = None;
    for (node, (eligible, mut pods)) in view.by_node()? {
        if node.is_empty() {
            continue;
        }
        if !eligible.should_run {
            status.number_misscheduled += i32::from(!pods.is_empty());
            continue;
        }
        status.desired_number_scheduled += 1;
        oldest_first(&mut pods);
        let Some(pod) = pods.first() else { continue };
        status.current_number_scheduled += 1;
        match availability(pod, view.min_ready(), view.now) {
            Ok(()) => (ready, available) = (ready + 1, available + 1),
            Err(Some(at)) => {
                ready += 1;
                next = Some(next.map_or(at, |n| n.min(at)));
            }
            Err(None) => {}
        }
        updated += i32::from(is_updated(pod, hash));
    }
    status.number_ready = ready;
    status.number_available = Some(available);
    status.updated_number_scheduled = Some(updated);
    status.number_unavailable = Some(status.desired_number_scheduled - available);
    Ok((status, next))
}

#[async_trait::async_trait]
impl Reconciler for DaemonSetController {
    fn name(&self) -> &'static str {
        "daemonset"
    }

    fn keys_for(&self, event: &Event, cache: &Cache) -> Vec<ObjectKey> {
        if event.key.kind == kind_of::<DaemonSet>() {
            vec![event.key.clone()]
        } else if event.key.kind == kind_of::<Pod>() || event.key.kind == kind_of::<ControllerRevision>() {
            controllers_of::<DaemonSet>(event)
        } else if event.key.kind == kind_of::<Node>() {
            // A node that comes, goes or changes its labels or taints may change where every
            // DaemonSet runs.
            all_of::<DaemonSet>(cache)
        } else {
            Vec::new()
        }
    }

    fn all_keys(&self, cache: &Cache) -> Vec<ObjectKey> {
        all_of::<DaemonSet>(cache)
    }

    async fn reconcile(&self, key: &ObjectKey, ctx: &Context) -> Result<Action, ReconcileError> {
        let Some(ds) = ctx.cache().get_typed::<DaemonSet>(&key.namespace, &key.name) else {
            return Ok(Action::await_change()); // gone: the garbage collector removes its Pods
        };
        let uid = ds.metadata.uid.clone().unwrap_or_default();
        let nodes: Vec<Node> = ctx.cache().list_typed(None);
        let owned = |cache: &Cache| -> Vec<Pod> { cache.controlled_by::<Pod>(&key.namespace, &uid) };
        let before = owned(ctx.cache());
        let revisions = ctx.cache().controlled_by::<ControllerRevision>(&key.namespace, &uid);
        let taken = |name: &str| {
            ctx.cache().get(&ObjectKey::new(kind_of::<ControllerRevision>(), &key.namespace, name)).is_some()
        };
        let history = history::plan(&ds, &revisions, taken, &before)?;
        let clock = Instant::now();
        let backing_off = self.backing_off(&ds, &before, clock);
        let allowance = disruption::disruptions_allowed(ctx.cache(), &before);
        let view = View {
            ds: &ds,
            hash: &history.hash,
            nodes: &nodes,
            owned: &before,
            now: Timestamp::now(),
            disruptions: allowance.as_ref(),
            backing_off: &backing_off,
        };
        let decided = plan(&view)?;
        if let Some(held) = &allowance
            && plan(&View { disruptions: None, ..view }).is_ok_and(|free| free.pods != decided.pods)
        {
            ctx.event("daemonset-controller", &ds, WARNING, disruption::HELD, &held.refusal);
        }
        if !history.ops.is_empty() {
            ctx.apply(history.ops).await?;
        }
        let Plan { pods: ops, failed, retry_after } = decided;
        if !failed.is_empty() {
            let mut backoff = self.failed_pods.lock().unwrap_or_else(PoisonError::into_inner);
            for (node, pod) in &failed {
                backoff.next(&Backoff::key(&ds, node), clock);
                let name = pod.metadata.name.as_deref().unwrap_or_default();
                let message =
                    format!("Found failed daemon pod {}/{name} on node {node}, will try to kill it", key.namespace);
                ctx.event("daemonset-controller", &ds, WARNING, FAILED_DAEMON_POD, &message);
            }
        }
        if !ops.is_empty() {
            let creating = ops.iter().filter(|op| matches!(op, Op::Create(_))).count();
            tracing::info!(creating, deleting = ops.len() - creating, "syncing daemon Pods");
        }
        let ops = ctx.admit_pods(ops);
        let events = pod_events(&ops);
        ctx.apply(ops).await?;
        for (reason, message) in events {
            ctx.event("daemonset-controller", &ds, NORMAL, reason, &message);
        }
        let after = owned(ctx.cache());
        let now = Timestamp::now();
        let view = View { owned: &after, now, ..view };
        let (mut status, next) = status(&view)?;
        let counted = ds.status.as_ref().and_then(|s| s.collision_count).is_some();
        status.collision_count = (counted || history.collision_count > 0).then_some(history.collision_count);
        if ds.status.as_ref() != Some(&status) {
            let mut updated = ds.clone();
            updated.status = Some(status);
            ctx.update_status(&updated).await?;
        }
        let available =
            next.map(|at| Duration::try_from(at.duration_since(now)).unwrap_or_default() + Duration::from_millis(100));
        Ok(match available.into_iter().chain(retry_after).min() {
            Some(after) => Action::requeue(after),
            None => Action::await_change(),
        })
    }
}

impl DaemonSetController {
    /// The nodes whose failed Pod of `ds` waits out its back-off at `clock`, and how much
    /// longer; expired back-offs are forgotten on the way.
    fn backing_off(&self, ds: &DaemonSet, pods: &[Pod], clock: Instant) -> BTreeMap<String, Duration> {
        let mut backoff = self.failed_pods.lock().unwrap_or_else(PoisonError::into_inner);
        backoff.gc(clock);
        pods.iter()
            .filter(|p| phase(p) == "Failed")
            .filter_map(target_node)
            .filter_map(|node| Some((node.to_owned(), backoff.remaining(&Backoff::key(ds, node), clock)?)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn node(name: &str, labels: Value, taints: Value) -> Node {
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}, "spec": {"taints": taints}}))
            .unwrap()
    }

    fn daemon_set(pod_spec: Value, strategy: Value) -> DaemonSet {
        let mut pod_spec = pod_spec;
        pod_spec["containers"] = json!([{"name": "agent", "image": "agent:1"}]);
        serde_json::from_value(json!({
            "metadata": {"name": "agent", "namespace": "kube-system", "uid": "ds-1", "generation": 3},
            "spec": {"selector": {"matchLabels": {"app": "agent"}}, "updateStrategy": strategy,
                     "template": {"metadata": {"labels": {"app": "agent"}}, "spec": pod_spec}}
        }))
        .unwrap()
    }

    fn rolling(surge: Value, unavailable: Value) -> Value {
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": surge, "maxUnavailable": unavailable}})
    }

    #[test]
    fn eligibility_table() {
        let spec = |pod: Value| daemon_pod_spec(&daemon_set(pod, json!({}))).unwrap();
        let taint = |key: &str, effect: &str| json!([{"key": key, "effect": effect}]);
        let (run, stay, off) = ((true, true), (false, true), (false, false));
        #[rustfmt::skip]
        let cases = [
            ("a plain node", spec(json!({})), node("n1", json!({}), json!([])), run),
            ("nodeSelector matches", spec(json!({"nodeSelector": {"disk": "ssd"}})), node("n1", json!({"disk": "ssd"}), json!([])), run),
            ("nodeSelector does not", spec(json!({"nodeSelector": {"disk": "ssd"}})), node("n1", json!({"disk": "hdd"}), json!([])), off),
            ("required node affinity does not",
             spec(json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                 {"matchExpressions": [{"key": "kubernetes.io/os", "operator": "In", "values": ["windows"]}]}]}}}})),
             node("n1", json!({"kubernetes.io/os": "linux"}), json!([])), off),
            ("the template names another node", spec(json!({"nodeName": "n2"})), node("n1", json!({}), json!([])), off),
            ("an untolerated NoSchedule taint: none new, the old one stays", spec(json!({})),
             node("n1", json!({}), taint("dedicated", "NoSchedule")), stay),
            ("an untolerated NoExecute taint", spec(json!({})), node("n1", json!({}), taint("dedicated", "NoExecute")), off),
            ("the template tolerates it", spec(json!({"tolerations": [{"key": "dedicated", "operator": "Exists"}]})),
             node("n1", json!({}), taint("dedicated", "NoExecute")), run),
            ("a PreferNoSchedule taint is no bar", spec(json!({})), node("n1", json!({}), taint("dedicated", "PreferNoSchedule")), run),
            ("unreachable: tolerated by every daemon Pod", spec(json!({})), node("n1", json!({}), taint(UNREACHABLE, "NoExecute")), run),
            ("not ready: stays, none new (its NoSchedule taint is not tolerated)", spec(json!({})),
             node("n1", json!({}), json!([{"key": NOT_READY, "effect": "NoSchedule"}, {"key": NOT_READY, "effect": "NoExecute"}])), stay),
            ("memory pressure", spec(json!({})), node("n1", json!({}), taint(MEMORY_PRESSURE, "NoSchedule")), run),
            ("disk pressure", spec(json!({})), node("n1", json!({}), taint(DISK_PRESSURE, "NoSchedule")), run),
            ("pid pressure", spec(json!({})), node("n1", json!({}), taint(PID_PRESSURE, "NoSchedule")), run),
            ("cordoned", spec(json!({})), node("n1", json!({}), taint(UNSCHEDULABLE, "NoSchedule")), run),
            ("the control plane, as the documentation's fluentd tolerates it",
             spec(json!({"tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}]})),
             node("cp", json!({}), taint("node-role.kubernetes.io/control-plane", "NoSchedule")), run),
        ];
        for (what, spec, node, (should_run, should_continue_running)) in cases {
            assert_eq!(eligibility(&spec, &node), Eligibility { should_run, should_continue_running }, "{what}");
        }
    }

    /// The hash of the DaemonSet's current revision.
    fn hash_of(ds: &DaemonSet) -> String {
        history::plan(ds, &[], |_| false, &[]).unwrap().hash
    }

    /// A daemon Pod `name` on `node` (bound), of the current template or an old one, ready or
    /// not, created at second `created`.
    fn pod(ds: &DaemonSet, name: &str, node: &str, current: bool, ready: bool, created: i64) -> Pod {
        let hash = if current { hash_of(ds) } else { "old".to_owned() };
        let mut pod = new_pod(ds, node, &hash).unwrap();
        pod.metadata.name = Some(name.into());
        pod.metadata.resource_version = Some("5".into());
        pod.metadata.creation_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::from_second(created).unwrap()));
        pod.spec.as_mut().unwrap().node_name = Some(node.into());
        pod.status = Some(
            serde_json::from_value(json!({"phase": "Running",
                "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" },
                                "lastTransitionTime": "1970-01-01T00:00:00Z"}]}))
            .unwrap(),
        );
        pod
    }

    /// `pod`, failed.
    fn failed(mut pod: Pod) -> Pod {
        pod.status.as_mut().unwrap().phase = Some("Failed".into());
        pod
    }

    /// `pod`, being deleted.
    fn terminating(mut pod: Pod) -> Pod {
        let at = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::from_second(100).unwrap());
        pod.metadata.deletion_timestamp = Some(at);
        pod
    }

    fn describe(ops: &[Op<Pod>]) -> Vec<String> {
        ops.iter()
            .map(|op| match op {
                Op::Create(p) => format!("create on {}", target_node(p).unwrap()),
                Op::Update(p) => format!("update {}", p.metadata.name.as_deref().unwrap()),
                Op::Delete(p) => format!("delete {}", p.metadata.name.as_deref().unwrap()),
            })
            .collect()
    }

    fn nodes(names: &[&str]) -> Vec<Node> {
        names.iter().map(|n| node(n, json!({}), json!([]))).collect()
    }

    type Pods = fn(&DaemonSet) -> Vec<Pod>;
    /// (what, updateStrategy, nodes, the DaemonSet's Pods, disruptions allowed, the plan in words)
    type Case = (&'static str, Value, Vec<Node>, Pods, Option<(i32, bool)>, &'static [&'static str]);

    #[test]
    fn plan_table() {
        let three = nodes(&["a", "b", "c"]);
        let on_delete = json!({"type": "OnDelete"});
        let default = json!({});
        #[rustfmt::skip]
        let cases: Vec<Case> = vec![
            ("a Pod for every node", default.clone(), three.clone(), |_| vec![], None,
             &["create on a", "create on b", "create on c"]),
            ("a node that joins gets one", default.clone(), three.clone(),
             |d| vec![pod(d, "pa", "a", true, true, 1), pod(d, "pb", "b", true, true, 1)], None, &["create on c"]),
            ("a node that left loses it", default.clone(), nodes(&["a"]),
             |d| vec![pod(d, "pa", "a", true, true, 1), pod(d, "pb", "b", true, true, 1)], None, &["delete pb"]),
            ("a node that should not run it loses it", default.clone(),
             vec![node("a", json!({}), json!([])), node("b", json!({}), json!([{"key": "x", "effect": "NoExecute"}]))],
             |d| vec![pod(d, "pa", "a", true, true, 1), pod(d, "pb", "b", true, true, 1)], None, &["delete pb"]),
            ("extras go, the oldest stays", default.clone(), nodes(&["a"]),
             |d| vec![pod(d, "new", "a", true, true, 2), pod(d, "old", "a", true, true, 1)], None, &["delete new"]),
            ("a failed Pod goes; its replacement comes with the next sync", default.clone(), nodes(&["a"]),
             |d| vec![failed(pod(d, "pa", "a", true, false, 1))], None, &["delete pa"]),
            ("a succeeded one too", default.clone(), nodes(&["a"]),
             |d| { let mut p = pod(d, "pa", "a", true, false, 1); p.status.as_mut().unwrap().phase = Some("Succeeded".into()); vec![p] },
             None, &["delete pa"]),
            ("steady", default.clone(), nodes(&["a"]), |d| vec![pod(d, "pa", "a", true, true, 1)], None, &[]),
            ("a terminating Pod: no second one on its node until it is gone", default.clone(), nodes(&["a"]),
             |d| vec![terminating(pod(d, "pa", "a", true, true, 1))], None, &[]),
            ("a terminating Pod is not deleted again, on a node that should not run it either", default.clone(),
             vec![node("a", json!({}), json!([{"key": "x", "effect": "NoExecute"}]))],
             |d| vec![terminating(pod(d, "pa", "a", true, true, 1))], None, &[]),
            ("rolling: an old Pod terminating is not replaced yet, nor another taken down", default.clone(), three.clone(),
             |d| vec![terminating(pod(d, "pa", "a", false, true, 1)), pod(d, "pb", "b", false, true, 1), pod(d, "pc", "c", false, true, 1)],
             None, &[]),
            ("surge: no new Pod beside a terminating one", rolling(json!(1), json!(0)), nodes(&["a"]),
             |d| vec![terminating(pod(d, "pa", "a", false, true, 1))], None, &[]),
            ("rolling: one old Pod at a time (maxUnavailable 1)", default.clone(), three.clone(),
             |d| vec![pod(d, "pa", "a", false, true, 1), pod(d, "pb", "b", false, true, 1), pod(d, "pc", "c", false, true, 1)],
             None, &["delete pa"]),
            ("rolling: the next waits while an updated Pod is not available", default.clone(), three.clone(),
             |d| vec![pod(d, "pa", "a", true, false, 2), pod(d, "pb", "b", false, true, 1), pod(d, "pc", "c", false, true, 1)],
             None, &[]),
            ("rolling: then the next one", default.clone(), three.clone(),
             |d| vec![pod(d, "pa", "a", true, true, 2), pod(d, "pb", "b", false, true, 1), pod(d, "pc", "c", false, true, 1)],
             None, &["delete pb"]),
            ("rolling: old Pods that are not available go at once", default.clone(), three.clone(),
             |d| vec![pod(d, "pa", "a", true, false, 2), pod(d, "pb", "b", false, false, 1), pod(d, "pc", "c", false, true, 1)],
             None, &["delete pb"]),
            ("rolling: maxUnavailable 2", rolling(json!(0), json!(2)), three.clone(),
             |d| vec![pod(d, "pa", "a", false, true, 1), pod(d, "pb", "b", false, true, 1), pod(d, "pc", "c", false, true, 1)],
             None, &["delete pa", "delete pb"]),
            ("rolling: a percentage rounds up (34% of 3 is 2)", rolling(json!(0), json!("34%")), three.clone(),
             |d| vec![pod(d, "pa", "a", false, true, 1), pod(d, "pb", "b", false, true, 1), pod(d, "pc", "c", false, true, 1)],
             None, &["delete pa", "delete pb"]),
            ("rolling: both zero still let one go", rolling(json!(0), json!(0)), three.clone(),
             |d| vec![pod(d, "pa", "a", false, true, 1), pod(d, "pb", "b", false, true, 1), pod(d, "pc", "c", false, true, 1)],
             None, &["delete pa"]),
            ("rolling: a PodDisruptionBudget that allows none holds it", rolling(json!(0), json!(2)), three.clone(),
             |d| vec![pod(d, "pa", "a", false, true, 1), pod(d, "pb", "b", false, true, 1), pod(d, "pc", "c", false, true, 1)],
             Some((0, true)), &[]),
            ("rolling: ... and one that allows one lets one go", rolling(json!(0), json!(2)), three.clone(),
             |d| vec![pod(d, "pa", "a", false, true, 1), pod(d, "pb", "b", false, true, 1), pod(d, "pc", "c", false, true, 1)],
             Some((1, true)), &["delete pa"]),
            ("rolling: an old Pod not available goes under AlwaysAllow or a healthy budget", default.clone(), three.clone(),
             |d| vec![pod(d, "pa", "a", false, false, 1), pod(d, "pb", "b", false, true, 1), pod(d, "pc", "c", false, true, 1)],
             Some((0, true)), &["delete pa"]),
            ("rolling: ... and stays under IfHealthyBudget short of healthy Pods", default.clone(), three.clone(),
             |d| vec![pod(d, "pa", "a", false, false, 1), pod(d, "pb", "b", false, true, 1), pod(d, "pc", "c", false, true, 1)],
             Some((1, false)), &[]),
            ("surge: a new Pod beside the old one", rolling(json!(1), json!(0)), three.clone(),
             |d| vec![pod(d, "pa", "a", false, true, 1), pod(d, "pb", "b", false, true, 1), pod(d, "pc", "c", false, true, 1)],
             None, &["create on a"]),
            ("surge: the old one stays while the new one is not available", rolling(json!(1), json!(0)), nodes(&["a", "b"]),
             |d| vec![pod(d, "pa", "a", false, true, 1), pod(d, "na", "a", true, false, 2), pod(d, "pb", "b", false, true, 1)],
             None, &[]),
            ("surge: then it goes", rolling(json!(1), json!(0)), nodes(&["a", "b"]),
             |d| vec![pod(d, "pa", "a", false, true, 1), pod(d, "na", "a", true, true, 2), pod(d, "pb", "b", false, true, 1)],
             None, &["delete pa"]),
            ("OnDelete leaves old Pods", on_delete, three.clone(),
             |d| vec![pod(d, "pa", "a", false, true, 1), pod(d, "pb", "b", false, true, 1), pod(d, "pc", "c", false, true, 1)],
             None, &[]),
        ];
        for (what, strategy, nodes, pods, allowed, expected) in cases {
            let ds = daemon_set(json!({}), strategy);
            let owned = pods(&ds);
            let allowance =
                allowed.map(|(healthy, unhealthy)| Allowance { healthy, unhealthy, refusal: String::new() });
            let view = View {
                ds: &ds,
                hash: &hash_of(&ds),
                nodes: &nodes,
                owned: &owned,
                now: Timestamp::now(),
                disruptions: allowance.as_ref(),
                backing_off: &BTreeMap::new(),
            };
            assert_eq!(describe(&plan(&view).unwrap().pods), expected, "{what}");
        }
    }

    /// (what, the DaemonSet's Pods, the nodes backing off and for how many seconds still, the
    /// plan in words, the nodes told of a failed Pod, the retry in seconds)
    type FailedCase =
        (&'static str, Pods, Vec<(&'static str, u64)>, &'static [&'static str], &'static [&'static str], Option<u64>);

    #[test]
    fn failed_pods_table() {
        let two = nodes(&["a", "b"]);
        #[rustfmt::skip]
        let cases: Vec<FailedCase> = vec![
            ("no back-off yet: deleted, and told", |d| vec![failed(pod(d, "pa", "a", true, false, 1)), pod(d, "pb", "b", true, true, 1)],
             vec![], &["delete pa"], &["a"], None),
            ("backing off: it stays, no Pod beside it, a retry when the back-off ends",
             |d| vec![failed(pod(d, "pa", "a", true, false, 1)), pod(d, "pb", "b", true, true, 1)],
             vec![("a", 4)], &[], &[], Some(4)),
            ("only the node backing off waits",
             |d| vec![failed(pod(d, "pa", "a", true, false, 1)), failed(pod(d, "pb", "b", true, false, 1))],
             vec![("a", 8), ("b", 2)], &[], &[], Some(2)),
            ("... the other's goes", |d| vec![failed(pod(d, "pa", "a", true, false, 1)), failed(pod(d, "pb", "b", true, false, 1))],
             vec![("a", 8)], &["delete pb"], &["b"], Some(8)),
            ("two failed on one node: one goes, the other waits for the back-off that starts",
             |d| vec![failed(pod(d, "pa", "a", true, false, 1)), failed(pod(d, "pa2", "a", true, false, 2)), pod(d, "pb", "b", true, true, 1)],
             vec![], &["delete pa"], &["a"], None),
            ("a failed Pod beside a running one goes (and the running one stays)",
             |d| vec![failed(pod(d, "pa", "a", true, false, 1)), pod(d, "pa2", "a", true, true, 2), pod(d, "pb", "b", true, true, 1)],
             vec![], &["delete pa"], &["a"], None),
            ("a failed Pod on a node that should not run one goes at once",
             |d| vec![pod(d, "pa", "a", true, true, 1), pod(d, "pb", "b", true, true, 1), failed(pod(d, "pc", "c", true, false, 1))],
             vec![("c", 60)], &["delete pc"], &[], None),
            ("a terminating failed Pod: nothing until it is gone",
             |d| vec![terminating(failed(pod(d, "pa", "a", true, false, 1))), pod(d, "pb", "b", true, true, 1)],
             vec![], &[], &[], None),
            ("a failed Pod backing off counts as unavailable: the rollout waits",
             |d| vec![failed(pod(d, "pa", "a", false, false, 1)), pod(d, "pb", "b", false, true, 1)],
             vec![("a", 4)], &[], &[], Some(4)),
        ];
        for (what, pods, backing_off, expected, told, retry) in cases {
            let ds = daemon_set(json!({}), json!({}));
            let owned = pods(&ds);
            let backing_off: BTreeMap<String, Duration> =
                backing_off.into_iter().map(|(n, s)| (n.to_owned(), Duration::from_secs(s))).collect();
            let view = View {
                ds: &ds,
                hash: &hash_of(&ds),
                nodes: &two,
                owned: &owned,
                now: Timestamp::now(),
                disruptions: None,
                backing_off: &backing_off,
            };
            let plan = plan(&view).unwrap();
            assert_eq!(describe(&plan.pods), expected, "{what}");
            let nodes: Vec<&str> = plan.failed.iter().map(|(n, _)| n.as_str()).collect();
            assert_eq!(nodes, told, "{what}");
            assert_eq!(plan.retry_after, retry.map(Duration::from_secs), "{what}");
        }
    }

    #[test]
    fn daemon_pods_are_pinned_and_tolerate_what_upstream_adds() {
        let ds = daemon_set(
            json!({"tolerations": [{"key": NOT_READY, "operator": "Exists", "effect": "NoExecute"}]}),
            json!({}),
        );
        let pod = new_pod(&ds, "n1", "h").unwrap();
        assert_eq!(target_node(&pod), Some("n1"));
        assert!(pod.metadata.name.as_deref().unwrap().starts_with("agent-"));
        assert_eq!(pod.metadata.labels.as_ref().unwrap()[CONTROLLER_REVISION_HASH], "h");
        assert_eq!(pod.metadata.owner_references.as_ref().unwrap()[0].kind, "DaemonSet");
        let tolerations = pod.spec.unwrap().tolerations.unwrap();
        assert_eq!(tolerations.len(), 6, "the template's own is not repeated: {tolerations:?}");
        assert!(
            plan(&View {
                ds: &DaemonSet::default(),
                hash: "h",
                nodes: &nodes(&["a"]),
                owned: &[],
                now: Timestamp::now(),
                disruptions: None,
                backing_off: &BTreeMap::new(),
            })
            .is_err()
        );
        let bad = daemon_set(json!({}), rolling(json!("lots"), json!(0)));
        let (owned, one) = ([pod_of(&bad)], nodes(&["a"]));
        let view = View {
            ds: &bad,
            hash: &hash_of(&bad),
            nodes: &one,
            owned: &owned,
            now: Timestamp::now(),
            disruptions: None,
            backing_off: &BTreeMap::new(),
        };
        assert!(plan(&view).unwrap_err().to_string().contains("maxSurge \"lots\" is neither"));
    }

    fn pod_of(ds: &DaemonSet) -> Pod {
        pod(ds, "pa", "a", false, true, 1)
    }

    #[test]
    fn status_counts_nodes_as_upstream() {
        let mut ds = daemon_set(json!({"nodeSelector": {"role": "worker"}}), json!({}));
        ds.spec.as_mut().unwrap().min_ready_seconds = Some(10);
        let worker = |n: &str| node(n, json!({"role": "worker"}), json!([]));
        let nodes = vec![worker("a"), worker("b"), worker("c"), worker("d"), node("e", json!({}), json!([]))];
        let recent = {
            let mut p = pod(&ds, "pc", "c", true, true, 3);
            p.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].last_transition_time =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::from_second(95).unwrap()));
            p
        };
        let owned = vec![
            pod(&ds, "pa", "a", true, true, 1),
            pod(&ds, "pb", "b", false, false, 2),
            recent,
            pod(&ds, "pe", "e", true, true, 4),
        ];
        let now = Timestamp::from_second(100).unwrap();
        let hash = hash_of(&ds);
        let view = View {
            ds: &ds,
            hash: &hash,
            nodes: &nodes,
            owned: &owned,
            now,
            disruptions: None,
            backing_off: &BTreeMap::new(),
        };
        let (status, next) = status(&view).unwrap();
        assert_eq!(
            (
                status.desired_number_scheduled,
                status.current_number_scheduled,
                status.number_ready,
                status.number_available,
                status.updated_number_scheduled,
                status.number_misscheduled,
                status.number_unavailable,
                status.observed_generation
            ),
            (4, 3, 2, Some(1), Some(2), 1, Some(3), Some(3))
        );
        assert_eq!(next, Some(Timestamp::from_second(105).unwrap()), "pc becomes available after minReadySeconds");
    }
}
