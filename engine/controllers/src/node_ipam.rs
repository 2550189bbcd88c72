//! Node IPAM controller: releases a deleted Node's podCIDR, as kube-controller-manager's range
//! allocator does. The node service records each range it gives a node in a ConfigMap named
//! after the range ([`gitplane_api::network`]); this deletes the record once its Node is gone or
//! holds another range, so the range can be given again.

use crate::{Action, Context, ReconcileError, Reconciler};
use gitplane_api::network::{RANGE_LABEL, RANGE_NAMESPACE, RANGE_NODE_KEY, range_object_name, range_of_object};
use gitplane_api::object::{kind_of, resource_version};
use gitplane_store::{Event, EventType, ObjectKey, Op, informer::Cache};
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use serde_json::Value;

pub struct NodeIpamController;

/// The record of the range `node` holds, if any.
fn record_of(node: &Value) -> Option<ObjectKey> {
    let cidr = node["spec"]["podCIDR"].as_str()?;
    Some(ObjectKey::of::<ConfigMap>(RANGE_NAMESPACE, &range_object_name(cidr)))
}

/// Whether `node` (a Node, if it exists) holds `cidr`.
fn holds(node: Option<&Value>, cidr: &str) -> bool {
    node.is_some_and(|n| n["spec"]["podCIDR"] == cidr)
}

#[async_trait::async_trait]
impl Reconciler for NodeIpamController {
    fn name(&self) -> &'static str {
        "node-ipam"
    }

    fn keys_for(&self, event: &Event, _: &Cache) -> Vec<ObjectKey> {
        if event.key.kind == kind_of::<Node>() && event.event_type == EventType::Deleted {
            return record_of(&event.object).into_iter().collect();
        }
        Vec::new()
    }

    /// Every record (the ConfigMaps the source watches are in the cache): those of Nodes deleted
    /// while no leader ran.
    fn all_keys(&self, cache: &Cache) -> Vec<ObjectKey> {
        cache
            .list(&kind_of::<ConfigMap>(), Some(RANGE_NAMESPACE))
            .iter()
            .filter(|c| c["metadata"]["labels"][RANGE_LABEL].is_string())
            .filter_map(|c| ObjectKey::from_value(c).ok())
            .collect()
    }

    async fn reconcile(&self, key: &ObjectKey, ctx: &Context) -> Result<Action, ReconcileError> {
        let Some(cidr) = range_of_object(&key.name) else { return Ok(Action::await_change()) };
        let Some(record) = ctx.store.get(key).await? else { return Ok(Action::await_change()) };
        let Some(node) = record["data"][RANGE_NODE_KEY].as_str() else { return Ok(Action::await_change()) };
        let node_key = ObjectKey::of::<Node>("", node);
        if holds(ctx.cache().get(&node_key).as_deref(), &cidr) {
            return Ok(Action::await_change());
        }
        // The cache may not have the Node yet (it was committed with the record): ask the store,
        // after the record was read.
        if holds(ctx.store.get(&node_key).await?.as_ref(), &cidr) {
            return Ok(Action::await_change());
        }
        let revision = resource_version(&record);
        match ctx.store.txn(vec![Op::Delete { key: key.clone(), revision }]).await {
            Err(e) if e.is_not_found() || e.is_conflict() => Ok(Action::await_change()),
            other => other.map(|_| Action::await_change()).map_err(Into::into),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_deleted_nodes_record() {
        let node = json!({"metadata": {"name": "n1"}, "spec": {"podCIDR": "10.128.0.64/26"}});
        let key = record_of(&node).unwrap();
        assert_eq!((key.namespace.as_str(), key.name.as_str()), ("kube-system", "pod-cidr-10.128.0.64-26"));
        assert_eq!(record_of(&json!({"metadata": {"name": "n2"}})), None);
        let cases = [
            (Some(&node), "10.128.0.64/26", true),
            (Some(&node), "10.128.0.0/26", false),
            (None, "10.128.0.64/26", false),
        ];
        for (node, cidr, want) in cases {
            assert_eq!(holds(node, cidr), want, "{node:?} {cidr}");
        }
    }
}
