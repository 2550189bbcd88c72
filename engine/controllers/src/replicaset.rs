//! ReplicaSet controller: keeps `spec.replicas` Pods of the template alive.
//!
//! ReplicationControllers run on the same code, as upstream's replication manager does: a
//! [`Replicated`] kind is seen as the ReplicaSet it amounts to, planned as one, and its status
//! written back in its own shape (`crate::replication`).

use crate::{
    Action, Context, ReconcileError, Reconciler, names,
    owner::{controller_ref, controllers_of},
    plan::Op,
    runtime::all_of,
};
use gitplane_api::{events::NORMAL, kube_core::Resource, object::kind_of};
use gitplane_store::{Event, ObjectKey, informer::Cache};
use k8s_openapi::api::{
    apps::v1::{ReplicaSet, ReplicaSetStatus},
    core::v1::Pod,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde::{Serialize, de::DeserializeOwned};
use std::marker::PhantomData;

/// A kind that keeps a number of Pods of a template: a ReplicaSet, or what converts to one.
pub trait Replicated:
    Resource<DynamicType = ()>
    + k8s_openapi::Resource
    + k8s_openapi::Metadata<Ty = ObjectMeta>
    + Clone
    + PartialEq
    + Serialize
    + DeserializeOwned
    + Send
    + Sync
    + 'static
{
    /// The name of its controller, in logs and metrics (`replicaset`).
    const CONTROLLER: &'static str;
    /// Its controller as Events name it (`replicaset-controller`).
    const COMPONENT: &'static str;

    /// The ReplicaSet it amounts to: same metadata, replicas, selector and template.
    fn as_replica_set(&self) -> ReplicaSet;

    /// Itself with the status the ReplicaSet machinery computed for it.
    fn with_status(&self, status: ReplicaSetStatus) -> Self;
}

impl Replicated for ReplicaSet {
    const CONTROLLER: &'static str = "replicaset";
    const COMPONENT: &'static str = "replicaset-controller";

    fn as_replica_set(&self) -> ReplicaSet {
        self.clone()
    }

    fn with_status(&self, status: ReplicaSetStatus) -> Self {
        ReplicaSet { status: Some(status), ..self.clone() }
    }
}

/// The controller of ReplicaSets, or (`ReplicaSetController<ReplicationController>`) of
/// ReplicationControllers.
pub struct ReplicaSetController<K = ReplicaSet>(PhantomData<K>);

impl<K> Default for ReplicaSetController<K> {
    fn default() -> Self {
        ReplicaSetController(PhantomData)
    }
}

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

/// Ready for at least `min_ready` (upstream's `IsPodAvailable`): when not yet, the time it will be.
pub(crate) fn availability(pod: &Pod, min_ready: i32, now: Timestamp) -> Result<(), Option<Timestamp>> {
    if !is_ready(pod) {
        return Err(None);
    }
    if min_ready <= 0 {
        return Ok(());
    }
    let since = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .and_then(|c| c.last_transition_time.as_ref())
        .map_or(now, |t| t.0);
    let at = since.checked_add(SignedDuration::from_secs(i64::from(min_ready))).unwrap_or(since);
    if at <= now { Ok(()) } else { Err(Some(at)) }
}

/// Running or yet to run, and not being deleted (upstream's `FilterActivePods`): a terminating
/// Pod is already on its way out, so its replacement is made at once.
pub(crate) fn is_active(pod: &Pod) -> bool {
    !is_finished(pod) && !is_terminating(pod)
}

/// Succeeded or Failed.
pub(crate) fn is_finished(pod: &Pod) -> bool {
    matches!(phase(pod), "Succeeded" | "Failed")
}

/// Being deleted gracefully: its node is stopping it.
pub(crate) fn is_terminating(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
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

fn new_pod(rs: &ReplicaSet, owner: &OwnerReference) -> Result<Pod, ReconcileError> {
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
            owner_references: Some(vec![owner.clone()]),
            ..Default::default()
        },
        spec: template.spec.clone(),
        status: None,
    })
}

/// The writes that bring a ReplicaSet's Pods (`owned`: the ones it controls) to its replicas:
/// finished Pods deleted, then at most [`BURST`] Pods created or deleted, surplus Pods in
/// [`deletion_rank`] order. Terminating Pods count for nothing. New Pods name `owner` as their
/// controller.
pub fn plan(rs: &ReplicaSet, owner: &OwnerReference, owned: &[Pod]) -> Result<Vec<Op<Pod>>, ReconcileError> {
    let desired = rs.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let mut active: Vec<&Pod> = owned.iter().filter(|p| is_active(p)).collect();
    let finished = owned.iter().filter(|p| is_finished(p) && !is_terminating(p));
    let mut ops: Vec<Op<Pod>> = finished.map(|p| Op::Delete(p.clone())).collect();
    let diff = replica_diff(desired, active.len());
    if diff > 0 {
        for _ in 0..diff.min(BURST as i64) {
            ops.push(Op::Create(new_pod(rs, owner)?));
        }
    } else if diff < 0 {
        active.sort_by_key(|p| deletion_rank(p));
        ops.extend(active.into_iter().take((-diff as usize).min(BURST)).map(|p| Op::Delete(p.clone())));
    }
    Ok(ops)
}

/// The ReplicaSet's status from its active Pods, and how many of its Pods are still
/// terminating (which a Recreate rollout waits for).
pub fn status(rs: &ReplicaSet, owned: &[Pod]) -> ReplicaSetStatus {
    let active: Vec<&Pod> = owned.iter().filter(|p| is_active(p)).collect();
    let ready = active.iter().filter(|p| is_ready(p)).count() as i32;
    let terminating = owned.iter().filter(|p| is_terminating(p)).count() as i32;
    ReplicaSetStatus {
        replicas: active.len() as i32,
        fully_labeled_replicas: Some(active.len() as i32),
        ready_replicas: Some(ready),
        available_replicas: Some(ready),
        terminating_replicas: (terminating > 0).then_some(terminating),
        observed_generation: rs.metadata.generation,
        ..Default::default()
    }
}

/// The controller reference a Pod of `object` carries.
fn owner_of<K: Replicated>(object: &K) -> OwnerReference {
    controller_ref(&<K as Resource>::api_version(&()), &<K as Resource>::kind(&()), object.metadata())
}

#[async_trait::async_trait]
impl<K: Replicated> Reconciler for ReplicaSetController<K> {
    fn name(&self) -> &'static str {
        K::CONTROLLER
    }

    fn workers(&self) -> usize {
        crate::runtime::CONCURRENT_SYNCS
    }

    fn keys_for(&self, event: &Event, _: &Cache) -> Vec<ObjectKey> {
        if event.key.kind == kind_of::<K>() {
            vec![event.key.clone()]
        } else if event.key.kind == kind_of::<Pod>() {
            controllers_of::<K>(event)
        } else {
            Vec::new()
        }
    }

    fn all_keys(&self, cache: &Cache) -> Vec<ObjectKey> {
        all_of::<K>(cache)
    }

    async fn reconcile(&self, key: &ObjectKey, ctx: &Context) -> Result<Action, ReconcileError> {
        let Some(object) = ctx.cache().get_typed::<K>(&key.namespace, &key.name) else {
            return Ok(Action::await_change()); // gone: the garbage collector removes its Pods
        };
        let rs = object.as_replica_set();
        let uid = rs.metadata.uid.clone().unwrap_or_default();
        let owned = |cache: &Cache| -> Vec<Pod> { cache.controlled_by::<Pod>(&key.namespace, &uid) };
        let ops = plan(&rs, &owner_of(&object), &owned(ctx.cache()))?;
        let creating = ops.iter().filter(|op| matches!(op, Op::Create(_))).count();
        if !ops.is_empty() {
            tracing::info!(creating, deleting = ops.len() - creating, "scaling");
        }
        let ops = ctx.admit_pods(ops);
        let events = pod_events(&ops);
        ctx.apply(ops).await?;
        for (reason, message) in events {
            ctx.event(K::COMPONENT, &object, NORMAL, reason, &message);
        }
        let updated = object.with_status(status(&rs, &owned(ctx.cache())));
        if updated != object {
            ctx.update_status(&updated).await?;
        }
        Ok(Action::await_change())
    }
}

/// SuccessfulCreate / SuccessfulDelete for each Pod a plan creates or deletes, as the
/// ReplicaSet and Job controllers record them once the write succeeded.
pub(crate) fn pod_events(ops: &[Op<Pod>]) -> Vec<(&'static str, String)> {
    ops.iter()
        .filter_map(|op| match op {
            Op::Create(p) => Some(("SuccessfulCreate", format!("Created pod: {}", p.metadata.name.as_deref()?))),
            Op::Delete(p) => Some(("SuccessfulDelete", format!("Deleted pod: {}", p.metadata.name.as_deref()?))),
            Op::Update(_) => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn replica_math() {
        assert_eq!(replica_diff(3, 1), 2);
        assert_eq!(replica_diff(1, 3), -2);
        assert_eq!(replica_diff(0, 0), 0);
        assert_eq!(replica_diff(-1, 2), -2, "negative replicas mean none");
    }

    fn replica_set(replicas: Option<i32>) -> ReplicaSet {
        serde_json::from_value(json!({
            "metadata": {"name": "web-h", "namespace": "default", "uid": "rs-1", "generation": 2},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
                     "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}
        }))
        .unwrap()
    }

    /// `pod`, being deleted.
    fn terminating(mut pod: Pod) -> Pod {
        let at = k8s_openapi::jiff::Timestamp::from_second(100).unwrap();
        pod.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at));
        pod
    }

    /// A Pod named `name` in `phase` (`-` for none yet), bound to a node or not, ready or not,
    /// created at second `created`.
    fn pod(name: &str, phase: &str, bound: bool, ready: bool, created: i64) -> Pod {
        let created = k8s_openapi::jiff::Timestamp::from_second(created).unwrap().to_string();
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default", "resourceVersion": "3", "creationTimestamp": created},
            "spec": {"nodeName": bound.then_some("n1"), "containers": [{"name": "c", "image": "i"}]},
            "status": {"phase": (phase != "-").then_some(phase),
                       "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}
        }))
        .unwrap()
    }

    fn describe(ops: &[Op<Pod>]) -> Vec<String> {
        ops.iter()
            .map(|op| match op {
                Op::Create(_) => "create".to_owned(),
                Op::Update(p) => format!("update {}", p.metadata.name.as_deref().unwrap()),
                Op::Delete(p) => format!("delete {}", p.metadata.name.as_deref().unwrap()),
            })
            .collect()
    }

    /// (what, replicas, Pods, the plan in words)
    type Case = (&'static str, Option<i32>, Vec<Pod>, Vec<&'static str>);

    #[test]
    fn plan_table() {
        let running = |name, created| pod(name, "Running", true, true, created);
        #[rustfmt::skip]
        let cases: Vec<Case> = vec![
            ("scale up from nothing", Some(3), vec![], vec!["create"; 3]),
            ("replicas default to 1", None, vec![], vec!["create"]),
            ("steady", Some(2), vec![running("a", 1), running("b", 2)], vec![]),
            ("scale up the rest", Some(3), vec![running("a", 1)], vec!["create"; 2]),
            ("scale down: unscheduled, then pending, then not ready, then the newest go first", Some(1),
             vec![running("old", 1), running("new", 2), pod("unready", "Running", true, false, 3),
                  pod("pending", "Pending", true, false, 4), pod("unbound", "-", false, false, 5)],
             vec!["delete unbound", "delete pending", "delete unready", "delete new"]),
            ("finished Pods are deleted and replaced", Some(2),
             vec![pod("done", "Succeeded", true, false, 1), pod("crashed", "Failed", true, false, 2), running("a", 3)],
             vec!["delete done", "delete crashed", "create"]),
            ("negative replicas mean none", Some(-1), vec![running("a", 1)], vec!["delete a"]),
            ("a terminating Pod counts for nothing: replaced at once", Some(2),
             vec![running("a", 1), terminating(running("b", 2))], vec!["create"]),
            ("a terminating Pod is not deleted again", Some(1),
             vec![running("a", 1), terminating(running("b", 2)), terminating(pod("c", "Failed", true, false, 3))],
             vec![]),
            ("scale down skips terminating Pods", Some(1),
             vec![running("a", 1), running("b", 2), terminating(running("c", 3))], vec!["delete b"]),
        ];
        for (name, replicas, pods, expected) in cases {
            let rs = replica_set(replicas);
            assert_eq!(describe(&plan(&rs, &owner_of(&rs), &pods).unwrap()), expected, "{name}");
        }
    }

    #[test]
    fn plan_creates_pods_of_the_template_at_most_a_burst_at_a_time() {
        let (many_wanted, none_wanted) = (replica_set(Some(600)), replica_set(Some(0)));
        let ops = plan(&many_wanted, &owner_of(&many_wanted), &[]).unwrap();
        assert_eq!(ops.len(), BURST);
        let Op::Create(created) = &ops[0] else { panic!("{ops:?}") };
        assert!(created.metadata.name.as_deref().unwrap().starts_with("web-h-"));
        assert_eq!(created.metadata.labels.as_ref().unwrap()["app"], "web");
        assert_eq!(created.metadata.owner_references.as_ref().unwrap()[0].uid, "rs-1");
        let many: Vec<Pod> = (0..600).map(|i| pod(&format!("p{i}"), "Running", true, true, i)).collect();
        assert_eq!(plan(&none_wanted, &owner_of(&none_wanted), &many).unwrap().len(), BURST);
    }

    #[test]
    fn status_counts_active_and_ready_pods() {
        let (a, b) = (pod("a", "Running", true, true, 1), pod("b", "Running", true, false, 2));
        let done = pod("c", "Succeeded", true, false, 3);
        let leaving = terminating(pod("d", "Running", true, true, 4));
        // (what, Pods, replicas, ready, terminating)
        #[rustfmt::skip]
        let cases = [
            ("active and ready", vec![a.clone(), b.clone(), done], 2, 1, None),
            ("a terminating Pod is neither replica nor ready", vec![a, b, leaving.clone()], 2, 1, Some(1)),
            ("only terminating", vec![leaving], 0, 0, Some(1)),
        ];
        for (what, pods, replicas, ready, terminating) in cases {
            let status = status(&replica_set(Some(2)), &pods);
            assert_eq!(
                (status.replicas, status.ready_replicas, status.available_replicas, status.terminating_replicas),
                (replicas, Some(ready), Some(ready), terminating),
                "{what}"
            );
            assert_eq!(status.observed_generation, Some(2));
        }
    }
}
