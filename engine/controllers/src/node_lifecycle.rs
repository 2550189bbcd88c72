//! Node lifecycle controller: a node whose Lease is not renewed in time becomes Ready=Unknown,
//! and every node that is not Ready gets upstream's taints for it (TaintNodesByCondition's
//! NoSchedule, which keeps new Pods off, and the NoExecute one the taint eviction controller
//! evicts by): `node.kubernetes.io/not-ready` while its agent says Ready=False (its runtime is
//! down), `node.kubernetes.io/unreachable` while Ready is Unknown. They go once it is Ready. The
//! Pods of a deleted node are removed.

use crate::{Action, Context, ReconcileError, Reconciler};
use gitplane_api::object::{NODE_LEASE_NAMESPACE, kind_of, resource_version, to_value};
use gitplane_api::taints::{NO_EXECUTE, NO_SCHEDULE, NOT_READY, UNREACHABLE};
use gitplane_store::{Event, ObjectKey, Op, informer::Cache};
use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{Node, NodeCondition, Pod, Taint},
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use std::time::Duration;

pub struct NodeLifecycleController {
    /// How long a node may go without renewing its Lease (upstream's node-monitor-grace-period).
    pub grace_period: Duration,
}

impl Default for NodeLifecycleController {
    fn default() -> Self {
        NodeLifecycleController { grace_period: Duration::from_secs(40) }
    }
}

/// The node's taints for its Ready condition's status (`None`: the node has not said yet): the
/// other taints as they are, the not-ready or unreachable pair that the status calls for (an
/// unchanged one keeps its `timeAdded`, which the eviction counts from), and neither when Ready.
pub fn lifecycle_taints(ready: Option<&str>, taints: &[Taint], now: &Time) -> Vec<Taint> {
    let wanted = match ready {
        Some("False") => Some(NOT_READY),
        Some("Unknown") => Some(UNREACHABLE),
        _ => None,
    };
    let mut out: Vec<Taint> = taints.iter().filter(|t| t.key != NOT_READY && t.key != UNREACHABLE).cloned().collect();
    if let Some(key) = wanted {
        for effect in [NO_SCHEDULE, NO_EXECUTE] {
            let kept = taints.iter().find(|t| t.key == key && t.effect == effect).cloned();
            // Upstream stamps the NoExecute taint only: its tolerationSeconds count from then.
            let time_added = (effect == NO_EXECUTE).then(|| now.clone());
            out.push(kept.unwrap_or_else(|| Taint { key: key.into(), value: None, effect: effect.into(), time_added }));
        }
    }
    out
}

#[async_trait::async_trait]
impl Reconciler for NodeLifecycleController {
    fn name(&self) -> &'static str {
        "node-lifecycle"
    }

    /// Node changes only: a Lease renewal (every node's, every 10 s) wakes nothing, as the
    /// reconcile of a node is requeued for when its Lease would expire and reads the Lease then;
    /// a node that renews again after being marked Unknown is made Ready by the node service, a
    /// Node change.
    fn keys_for(&self, event: &Event, _: &Cache) -> Vec<ObjectKey> {
        if event.key.kind == kind_of::<Node>() { vec![event.key.clone()] } else { Vec::new() }
    }

    fn all_keys(&self, cache: &Cache) -> Vec<ObjectKey> {
        crate::runtime::all_of::<Node>(cache)
    }

    async fn reconcile(&self, key: &ObjectKey, ctx: &Context) -> Result<Action, ReconcileError> {
        let Some(node) = ctx.cache().get_typed::<Node>("", &key.name) else {
            return remove_orphaned_pods(&key.name, ctx).await;
        };
        let now = Time(Timestamp::now());
        let ready = ready_status(&node);
        let taints = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
        let wanted = lifecycle_taints(ready.as_deref(), &taints, &now);
        if wanted != taints {
            tracing::info!(node = %key.name, ready = ?ready, "the node's Ready changed: updating its taints");
            let mut updated = node.clone();
            updated.spec.get_or_insert_with(Default::default).taints = Some(wanted).filter(|t| !t.is_empty());
            ctx.commit(vec![Op::Update(to_value(&updated))]).await?;
            // The reconcile that the write causes goes on with the Lease.
            return Ok(Action::await_change());
        }
        // A node that has not renewed yet is measured from its registration.
        let renewed = ctx
            .cache()
            .get_typed::<Lease>(NODE_LEASE_NAMESPACE, &key.name)
            .and_then(|l| l.spec?.renew_time)
            .map(|t| t.0)
            .or_else(|| node.metadata.creation_timestamp.as_ref().map(|t| t.0));
        let grace = SignedDuration::try_from(self.grace_period).unwrap_or(SignedDuration::from_secs(40));
        let expired = renewed.is_none_or(|t| now.0.duration_since(t) > grace);
        if !expired {
            let left = renewed.map_or(grace, |t| grace - now.0.duration_since(t));
            return Ok(Action::requeue(Duration::try_from(left).unwrap_or_default() + Duration::from_millis(100)));
        }
        if ready.as_deref() == Some("Unknown") {
            return Ok(Action::await_change());
        }
        tracing::warn!(node = %key.name, "node stopped renewing its lease, marking it NotReady");
        let mut updated = node.clone();
        let conditions = updated.status.get_or_insert_with(Default::default).conditions.get_or_insert_with(Vec::new);
        conditions.retain(|c| c.type_ != "Ready");
        conditions.push(NodeCondition {
            type_: "Ready".into(),
            status: "Unknown".into(),
            reason: Some("NodeStatusUnknown".into()),
            message: Some("Kubelet stopped posting node status.".into()),
            last_transition_time: Some(now),
            last_heartbeat_time: renewed.map(Time),
        });
        ctx.commit(vec![Op::UpdateStatus(to_value(&updated))]).await?;
        Ok(Action::await_change())
    }
}

/// The pod GC's orphan collection: the Pods bound to a Node that was deleted are removed at once,
/// terminating or not, as no agent is left to stop them and finalize their delete. Reached by
/// the Node's delete only (a resync never looks at absent nodes).
async fn remove_orphaned_pods(node: &str, ctx: &Context) -> Result<Action, ReconcileError> {
    let ops: Vec<Op> = ctx
        .cache()
        .list(&kind_of::<Pod>(), None)
        .iter()
        .filter(|p| p["spec"]["nodeName"].as_str() == Some(node))
        .filter_map(|p| ObjectKey::from_value(p).ok().map(|key| Op::Delete { key, revision: resource_version(p) }))
        .collect();
    if !ops.is_empty() {
        tracing::info!(%node, pods = ops.len(), "the node is gone: removing its Pods");
        ctx.commit(ops).await?;
    }
    Ok(Action::await_change())
}

/// The status of the node's Ready condition, if it has one.
fn ready_status(node: &Node) -> Option<String> {
    let conditions = node.status.as_ref()?.conditions.as_ref()?;
    conditions.iter().find(|c| c.type_ == "Ready").map(|c| c.status.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn taint(key: &str, effect: &str, added: Option<&Time>) -> Taint {
        Taint { key: key.into(), value: None, effect: effect.into(), time_added: added.cloned() }
    }

    #[test]
    fn taints_follow_the_ready_condition() {
        let (then, now) = (Time(Timestamp::UNIX_EPOCH), Time(Timestamp::now()));
        let own = taint("dedicated", NO_SCHEDULE, None);
        let keys = |taints: &[Taint]| taints.iter().map(|t| format!("{}:{}", t.key, t.effect)).collect::<Vec<_>>();

        let alone = [own.clone()];
        assert_eq!(lifecycle_taints(Some("True"), &alone, &now), alone);
        assert_eq!(lifecycle_taints(None, &alone, &now), alone);

        let not_ready = lifecycle_taints(Some("False"), &alone, &now);
        assert_eq!(
            keys(&not_ready),
            [
                "dedicated:NoSchedule",
                "node.kubernetes.io/not-ready:NoSchedule",
                "node.kubernetes.io/not-ready:NoExecute"
            ]
        );
        assert_eq!(not_ready[1].time_added, None);
        assert_eq!(not_ready[2].time_added, Some(now.clone()));

        // Unchanged: the eviction's clock keeps running from when the taint came.
        let held = [taint(NOT_READY, NO_SCHEDULE, None), taint(NOT_READY, NO_EXECUTE, Some(&then))];
        assert_eq!(lifecycle_taints(Some("False"), &held, &now), held);

        // Not ready -> unreachable swaps the pair; Ready again removes it.
        let unreachable = lifecycle_taints(Some("Unknown"), &held, &now);
        assert_eq!(keys(&unreachable), [format!("{UNREACHABLE}:NoSchedule"), format!("{UNREACHABLE}:NoExecute")]);
        assert_eq!(unreachable[1].time_added, Some(now.clone()));
        assert!(lifecycle_taints(Some("True"), &unreachable, &now).is_empty());
    }
}
