//! Node lifecycle controller: a node whose Lease is not renewed in time becomes Ready=Unknown,
//! so the scheduler stops placing Pods on it.

use crate::{Action, Context, ReconcileError, Reconciler};
use gitplane_api::object::{NODE_LEASE_NAMESPACE, kind_of, to_value};
use gitplane_store::{Event, ObjectKey, Op, informer::Cache};
use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{Node, NodeCondition},
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

#[async_trait::async_trait]
impl Reconciler for NodeLifecycleController {
    fn name(&self) -> &'static str {
        "node-lifecycle"
    }

    fn keys_for(&self, event: &Event, _: &Cache) -> Vec<ObjectKey> {
        if event.key.kind == kind_of::<Node>() {
            vec![event.key.clone()]
        } else if event.key.kind == kind_of::<Lease>() && event.key.namespace == NODE_LEASE_NAMESPACE {
            vec![ObjectKey::of::<Node>("", &event.key.name)]
        } else {
            Vec::new()
        }
    }

    fn all_keys(&self, cache: &Cache) -> Vec<ObjectKey> {
        crate::runtime::all_of::<Node>(cache)
    }

    async fn reconcile(&self, key: &ObjectKey, ctx: &Context) -> Result<Action, ReconcileError> {
        let Some(node) = ctx.cache().get_typed::<Node>("", &key.name) else { return Ok(Action::await_change()) };
        // A node that has not renewed yet is measured from its registration.
        let renewed = ctx
            .cache()
            .get_typed::<Lease>(NODE_LEASE_NAMESPACE, &key.name)
            .and_then(|l| l.spec?.renew_time)
            .map(|t| t.0)
            .or_else(|| node.metadata.creation_timestamp.as_ref().map(|t| t.0));
        let grace = SignedDuration::try_from(self.grace_period).unwrap_or(SignedDuration::from_secs(40));
        let now = Timestamp::now();
        let expired = renewed.is_none_or(|t| now.duration_since(t) > grace);
        if !expired {
            let left = renewed.map_or(grace, |t| grace - now.duration_since(t));
            return Ok(Action::requeue(Duration::try_from(left).unwrap_or_default() + Duration::from_millis(100)));
        }
        let ready = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"));
        if ready.is_some_and(|c| c.status == "Unknown") {
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
            message: Some("Node agent stopped posting node status.".into()),
            last_transition_time: Some(Time(now)),
            last_heartbeat_time: renewed.map(Time),
        });
        ctx.commit(vec![Op::UpdateStatus(to_value(&updated))]).await?;
        Ok(Action::await_change())
    }
}
