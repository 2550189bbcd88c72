//! NodePorts (kube-scheduler's `PodFitsHostPorts`): a Pod's host ports must be free on the node,
//! per protocol and address (`0.0.0.0` overlaps every address).

use crate::framework::{CycleState, FilterPlugin, HostPort, NodeInfo, host_ports};
use crate::resources::Resources;
use k8s_openapi::api::core::v1::Pod;

pub struct NodePorts;

pub const REASON: &str = "node(s) didn't have free ports for the requested pod ports";

impl FilterPlugin for NodePorts {
    fn name(&self) -> &'static str {
        "NodePorts"
    }

    fn pre_filter(&self, pod: &Pod, _: crate::framework::Cluster<'_>) -> CycleState {
        let wanted = host_ports(pod);
        (!wanted.is_empty()).then(|| Box::new(wanted) as _)
    }

    fn filter(&self, _: &Pod, _: &Resources, node: &NodeInfo, state: &CycleState) -> Result<(), Vec<String>> {
        let Some(wanted) = state.as_ref().and_then(|s| s.downcast_ref::<Vec<HostPort>>()) else { return Ok(()) };
        if wanted.iter().any(|w| node.host_ports.iter().any(|used| used.conflicts(w))) {
            Err(vec![REASON.into()])
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::Cluster;
    use k8s_openapi::api::core::v1::Node;
    use serde_json::{Value, json};

    fn pod(ports: Value) -> Pod {
        serde_json::from_value(json!({"spec": {"containers": [{"name": "c", "ports": ports}]}})).unwrap()
    }

    #[test]
    fn host_ports_conflict_by_protocol_and_address() {
        for (used, wanted, free) in [
            (json!([{"containerPort": 80, "hostPort": 8080}]), json!([{"containerPort": 80, "hostPort": 8080}]), false),
            (json!([{"containerPort": 80, "hostPort": 8080}]), json!([{"containerPort": 80, "hostPort": 8081}]), true),
            (
                json!([{"containerPort": 53, "hostPort": 53}]),
                json!([{"containerPort": 53, "hostPort": 53, "protocol": "UDP"}]),
                true,
            ),
            (
                json!([{"containerPort": 80, "hostPort": 80, "hostIP": "10.0.0.1"}]),
                json!([{"containerPort": 80, "hostPort": 80, "hostIP": "10.0.0.2"}]),
                true,
            ),
            (
                json!([{"containerPort": 80, "hostPort": 80, "hostIP": "10.0.0.1"}]),
                json!([{"containerPort": 80, "hostPort": 80}]),
                false,
            ),
            // A containerPort without a hostPort takes nothing of the node.
            (json!([{"containerPort": 80}]), json!([{"containerPort": 80}]), true),
        ] {
            let mut node = NodeInfo::new(serde_json::from_value::<Node>(json!({"metadata": {"name": "n"}})).unwrap());
            node.add_pod(&pod(used.clone()));
            let p = pod(wanted.clone());
            let state = NodePorts
                .pre_filter(&p, Cluster { nodes: &[], namespaces: &Default::default(), pods: &Default::default() });
            let result = NodePorts.filter(&p, &Resources::default(), &node, &state);
            assert_eq!(result.is_ok(), free, "{used} / {wanted}");
            if !free {
                assert_eq!(result.unwrap_err(), [REASON]);
            }
        }
    }
}
