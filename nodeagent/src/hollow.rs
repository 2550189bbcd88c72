//! Hollow nodes (kubemark's hollow kubelet): many nodes in one process, for scale tests. Each
//! is an agent's control-plane half without a runtime or network: it registers through the node
//! service as `agent` does (its own key, certificates and credential, the join token first),
//! renews its Lease on the agent's period (`node_status::heartbeat`), reports itself Ready, and
//! takes the Pods bound to it to Running and Ready (`pods`). Where calls carry the node's bearer
//! token (cleartext loopback) the nodes share a few connections; where each shows its client
//! certificate (TLS), each has its own.

mod addresses;
mod pods;
mod watches;

use crate::{
    agent::{self, AgentConfig, AgentError, Registered},
    controlplane::{RETRY_MAX, RETRY_MIN, Servers, channels, follow},
    kubelet::{
        node,
        node_status::{self, NodeStatusConfig},
        runtime_state::{RuntimeState, ready_condition},
    },
};
use gitplane_proto::node::UpdateNodeStatusRequest;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::{
    collections::HashMap,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
};
use tokio::sync::{Notify, Semaphore, watch};

/// The runtime a hollow node reports (kubemark's fake runtime says `fakeRuntime://...`).
const RUNTIME_VERSION: &str = "hollow://0";

/// Nodes per shared connection: each holds up to three watches open (Pods, network, Pod
/// config), and the control plane takes at most 256 streams on one connection.
const NODES_PER_CONNECTION: usize = 64;

/// Registrations under way at once (each signs a key's certificates on the control plane).
const REGISTRATIONS_AT_ONCE: usize = 16;

/// Runs `count` hollow nodes named `<cfg.node_name>-1` … `-<count>` until `shutdown`. Each
/// keeps its credential and certificates in `<credential file's directory>/<node>/`, so a
/// restarted process takes its nodes up again.
pub async fn run(
    cfg: AgentConfig,
    count: usize,
    all_watches: bool,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), AgentError> {
    let ca = cfg.certificate_authority.as_deref();
    let pools = (0..count.div_ceil(NODES_PER_CONNECTION))
        .map(|_| channels(&cfg.servers, ca, None).map(Arc::new))
        .collect::<Result<Vec<_>, _>>()?;
    let registering = Arc::new(Semaphore::new(REGISTRATIONS_AT_ONCE));
    let registered = Arc::new(AtomicUsize::new(0));
    let dir = cfg.credential_file.parent().unwrap_or(std::path::Path::new(".")).to_owned();
    let mut nodes = tokio::task::JoinSet::new();
    for (i, shared) in (1..=count).zip(pools.iter().flat_map(|p| std::iter::repeat_n(p, NODES_PER_CONNECTION))) {
        let mut node = cfg.clone();
        node.node_name = format!("{}-{i}", cfg.node_name);
        node.credential_file = dir.join(&node.node_name).join("node-credential");
        let (shared, registering, registered, shutdown) =
            (shared.clone(), registering.clone(), registered.clone(), shutdown.clone());
        nodes.spawn(async move {
            let Some(r) = register(&node, &shared, &registering, shutdown.clone()).await? else {
                return Ok(());
            };
            if registered.fetch_add(1, Ordering::Relaxed) + 1 == count {
                tracing::info!(count, "every hollow node registered");
            }
            serve(node, r, all_watches, shutdown).await
        });
    }
    tracing::info!(count, base = %cfg.node_name, "hollow nodes starting");
    let mut failed = None;
    loop {
        tokio::select! {
            _ = shutdown.wait_for(|s| *s) => break,
            done = nodes.join_next() => match done {
                None => break,
                Some(Ok(Ok(()))) => {}
                Some(Ok(Err(e))) => {
                    failed = Some(e);
                    break;
                }
                Some(Err(e)) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Some(Err(_)) => {}
            },
        }
    }
    nodes.shutdown().await;
    failed.map_or(Ok(()), Err)
}

async fn register(
    cfg: &AgentConfig,
    shared: &[tonic::transport::Channel],
    registering: &Semaphore,
    mut shutdown: watch::Receiver<bool>,
) -> Result<Option<Registered>, AgentError> {
    let _turn = registering.acquire().await;
    agent::register(cfg, RUNTIME_VERSION, Some(shared), &mut shutdown).await
}

/// One registered hollow node, until `shutdown`: Lease, status, Pods.
async fn serve(
    cfg: AgentConfig,
    registered: Registered,
    all_watches: bool,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), AgentError> {
    let pod_cidr = registered.pod_cidr.parse().map_err(AgentError::PodCidr)?;
    let client = registered.client;
    let status_cfg = NodeStatusConfig {
        node_name: cfg.node_name.clone(),
        node: cfg.node.clone(),
        heartbeat: cfg.heartbeat,
        node_status_period: cfg.node_status_period,
    };
    let resend = Arc::new(Notify::new());
    let heartbeat = tokio::spawn(node_status::heartbeat(status_cfg.clone(), client.clone(), resend.clone()));
    let status = tokio::spawn(report(status_cfg, client.clone(), resend));
    let mut others = tokio::task::JoinSet::new();
    if all_watches {
        let (servers, mut stop) = (client.clone(), shutdown.clone());
        others.spawn(async move { follow(&mut watches::Network, &servers, &mut stop).await });
        let (servers, mut stop) = (client.clone(), shutdown.clone());
        let mut config = watches::PodConfig { node_name: cfg.node_name.clone() };
        others.spawn(async move { follow(&mut config, &servers, &mut stop).await });
    }
    let mut pods = pods::HollowPods {
        node_name: cfg.node_name.clone(),
        client: client.clone(),
        addresses: addresses::PodAddresses::new(pod_cidr),
        running: HashMap::new(),
    };
    follow(&mut pods, &client, &mut shutdown).await;
    heartbeat.abort();
    status.abort();
    others.shutdown().await;
    Ok(())
}

/// Reports the node Ready, and again whenever `resend` asks (after lost heartbeats, the
/// control plane may have marked it Unknown). Nothing else of a hollow node changes.
async fn report(cfg: NodeStatusConfig, client: Servers, resend: Arc<Notify>) {
    let signals = node::host_signals(&cfg.node.nodefs);
    let mut reported = None;
    let mut delay = RETRY_MIN;
    loop {
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let mut status = node::status(&cfg.node, &signals, &[], Vec::new(), now.clone());
        let ready = ready_condition(&RuntimeState::default(), reported.as_ref(), now);
        status.conditions.get_or_insert_with(Vec::new).push(ready.clone());
        let status = serde_json::to_vec(&status).unwrap_or_default();
        let request = UpdateNodeStatusRequest { node_name: cfg.node_name.clone(), status };
        let (server, mut c) = client.get();
        match c.update_node_status(request).await {
            Ok(_) => {
                reported = Some(ready);
                delay = RETRY_MIN;
                resend.notified().await;
            }
            Err(status) => {
                tracing::warn!(node = %cfg.node_name, error = %status.message(), "node status update failed");
                client.failed(server);
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(RETRY_MAX);
            }
        }
    }
}
