//! The Node's own status, as the kubelet keeps it: the Lease renewed every period, and the
//! status (pressure conditions, allocatable, images, Ready from the runtime's state) sent when
//! it changes.

use super::{node::NodeConfig, runtime::RuntimeManager, runtime_state::RuntimeState};
use crate::controlplane::Servers;
use gitplane_proto::node::{HeartbeatRequest, UpdateNodeStatusRequest};
use serde_json::Value;
use std::{sync::Arc, time::Duration};
use tokio::sync::{Notify, watch};

/// What the node's status reports are told.
#[derive(Clone, Debug)]
pub(crate) struct NodeStatusConfig {
    pub node_name: String,
    /// Labels, taints, reserves and eviction thresholds of the Node.
    pub node: NodeConfig,
    /// Lease renewal period.
    pub heartbeat: Duration,
    /// How often the status is checked (it is sent only when it changed).
    pub node_status_period: Duration,
}

/// Renews the Lease every period; after renewals failed, `recovered` asks for the node's status
/// to be sent again.
pub(crate) async fn heartbeat(cfg: NodeStatusConfig, client: Servers, recovered: Arc<Notify>) {
    let mut tick = tokio::time::interval(cfg.heartbeat);
    let mut failing = false;
    loop {
        tick.tick().await;
        let request = HeartbeatRequest { node_name: cfg.node_name.clone() };
        let (server, mut c) = client.get();
        match c.heartbeat(request).await {
            Ok(_) if failing => {
                failing = false;
                recovered.notify_one();
            }
            Ok(_) => {}
            Err(status) => {
                tracing::warn!(error = %status.message(), "lease renewal failed");
                client.failed(server);
                failing = true;
            }
        }
    }
}

/// Sends the node's own status when it changes: pressure conditions, allocatable, images, and
/// the Ready condition of the runtime's state, at once when that changes. `resend` sends it
/// again even if unchanged.
pub(crate) async fn report(
    cfg: NodeStatusConfig,
    client: Servers,
    runtime: Arc<RuntimeManager>,
    mut runtime_state: watch::Receiver<RuntimeState>,
    resend: Arc<Notify>,
) {
    let mut tick = tokio::time::interval(cfg.node_status_period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sent: Option<Value> = None;
    let mut conditions: Vec<k8s_openapi::api::core::v1::NodeCondition> = Vec::new();
    // A runtime that is down lists no images: the node keeps the last list.
    let mut images = Vec::new();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            changed = runtime_state.changed() => if changed.is_err() { return },
            _ = resend.notified() => sent = None,
        }
        match runtime.images().await {
            Ok(listed) => images = listed,
            Err(error) => tracing::debug!(%error, "listing images for the node status failed"),
        }
        let signals = super::node::host_signals(&cfg.node.nodefs);
        let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
        let mut status = super::node::status(&cfg.node, &signals, &conditions, images.clone(), now.clone());
        let previous = conditions.iter().find(|c| c.type_ == "Ready");
        let ready = super::runtime_state::ready_condition(&runtime_state.borrow_and_update(), previous, now);
        status.conditions.get_or_insert_with(Vec::new).push(ready);
        let value = serde_json::to_value(&status).unwrap_or_default();
        if sent.as_ref() == Some(&value) {
            continue;
        }
        for c in status.conditions.iter().flatten() {
            let bad = if c.type_ == "Ready" { c.status != "True" } else { c.status == "True" };
            if bad {
                tracing::warn!(condition = %c.type_, status = %c.status, message = ?c.message, "node condition");
            }
        }
        let request =
            UpdateNodeStatusRequest { node_name: cfg.node_name.clone(), status: value.to_string().into_bytes() };
        let (server, mut c) = client.get();
        match c.update_node_status(request).await {
            Ok(_) => {
                conditions = status.conditions.unwrap_or_default();
                sent = Some(value);
            }
            Err(status) => {
                tracing::warn!(error = %status.message(), "node status update failed");
                client.failed(server);
            }
        }
    }
}
