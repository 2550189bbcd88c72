//! The node agent's main loop (the kubelet's role): register the node, renew its Lease, follow
//! the Pods bound to it, and run one pod worker per Pod that drives the runtime towards the Pod's
//! spec and reports its status.

use crate::{
    cni,
    cri::Cri,
    node,
    runtime::{RuntimeConfig, RuntimeManager},
};
use gitplane_proto::node::{
    EventType, HeartbeatRequest, PodEvent, RegisterRequest, UpdatePodStatusRequest, WatchPodsRequest,
    node_service_client::NodeServiceClient,
};
use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;
use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
    sync::Arc,
    time::Duration,
};
use tokio::{sync::watch, task::JoinHandle};
use tonic::{Code, transport::Channel};

/// How an agent finds its control plane and its runtime.
#[derive(Clone, Debug)]
pub struct AgentConfig {
    /// The control plane's replicas, e.g. `http://127.0.0.1:8080`; the agent moves to the next
    /// one when the one it uses fails.
    pub servers: Vec<String>,
    pub node_name: String,
    /// The node's address, reported as InternalIP and as the Pods' hostIP.
    pub node_ip: Option<String>,
    pub containerd_socket: PathBuf,
    /// Where containerd reads its CNI conflist.
    pub cni_conf_dir: PathBuf,
    /// host-local's allocation records.
    pub cni_data_dir: PathBuf,
    /// The Linux bridge the Pods attach to.
    pub bridge: String,
    pub runtime: RuntimeConfig,
    /// Lease renewal period (the kubelet's is 10 s for a 40 s lease).
    pub heartbeat: Duration,
    /// How often a pod worker re-checks its Pod without being told (the kubelet's PLEG relist).
    pub resync: Duration,
    /// Stop and remove every Pod on shutdown (the appliance's `gitplane up` does; a standalone
    /// agent leaves them running, as the kubelet does).
    pub remove_pods_on_exit: bool,
}

impl AgentConfig {
    pub fn new(servers: Vec<String>, node_name: impl Into<String>, containerd_socket: PathBuf) -> Self {
        AgentConfig {
            servers,
            node_name: node_name.into(),
            node_ip: None,
            containerd_socket,
            cni_conf_dir: PathBuf::from("/etc/gitplane/cni/net.d"),
            cni_data_dir: PathBuf::from("/var/lib/gitplane/cni"),
            bridge: "gitplane0".into(),
            runtime: RuntimeConfig::default(),
            heartbeat: Duration::from_secs(10),
            resync: Duration::from_secs(2),
            remove_pods_on_exit: false,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("container runtime at {socket}: {source}")]
    Runtime { socket: PathBuf, source: crate::cri::CriError },
    #[error("control plane address {server:?}: {source}")]
    Server { server: String, source: tonic::transport::Error },
    #[error("no control plane address given")]
    NoServers,
    #[error(transparent)]
    Cni(#[from] cni::CniError),
}

/// Retry delays for calls to the control plane.
const RETRY_MIN: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(5);

/// Runs the agent until `shutdown` becomes true.
pub async fn run(cfg: AgentConfig, mut shutdown: watch::Receiver<bool>) -> Result<(), AgentError> {
    let (cri, version) = Cri::connect_and_check(&cfg.containerd_socket)
        .await
        .map_err(|source| AgentError::Runtime { socket: cfg.containerd_socket.clone(), source })?;
    let runtime_version = format!("{}://{}", version.runtime_name, version.runtime_version);
    let client = Servers::new(&cfg.servers)?;

    let Some(pod_cidr) = register(&cfg, &client, &runtime_version, &mut shutdown).await else { return Ok(()) };
    let conflist = cni::write_conflist(&cfg.cni_conf_dir, "gitplane", &cfg.bridge, &pod_cidr, &cfg.cni_data_dir)?;
    tracing::info!(node = %cfg.node_name, %pod_cidr, conflist = %conflist.display(), "node registered");

    let mut runtime_cfg = cfg.runtime.clone();
    runtime_cfg.node_ip = runtime_cfg.node_ip.or(cfg.node_ip.clone());
    runtime_cfg.node_memory_bytes = runtime_cfg.node_memory_bytes.or_else(node::memory_bytes);
    let runtime = Arc::new(RuntimeManager::new(cri, runtime_cfg).await);
    let heartbeat = tokio::spawn(heartbeat(cfg.clone(), client.clone()));
    let mut pods =
        PodWorkers { cfg: cfg.clone(), runtime: runtime.clone(), client: client.clone(), workers: HashMap::new() };

    let mut revision = 0;
    let mut delay = RETRY_MIN;
    loop {
        let request = WatchPodsRequest { node_name: cfg.node_name.clone(), resource_version: revision };
        let (server, mut watch_client) = client.get();
        let started = tokio::select! {
            _ = shutdown.wait_for(|s| *s) => break,
            r = watch_client.watch_pods(request) => r,
        };
        let mut stream = match started {
            Ok(r) => r.into_inner(),
            Err(status) => {
                tracing::warn!(error = %status.message(), "pod watch failed, retrying");
                client.failed(server);
                if sleep_or_shutdown(&mut delay, &mut shutdown).await {
                    break;
                }
                continue;
            }
        };
        let mut initial: Option<HashSet<String>> = (revision == 0).then(HashSet::new);
        loop {
            let message = tokio::select! {
                _ = shutdown.wait_for(|s| *s) => None,
                m = stream.message() => Some(m),
            };
            let Some(message) = message else { break };
            match message {
                Ok(Some(event)) => {
                    delay = RETRY_MIN;
                    revision = revision.max(event.resource_version);
                    pods.observe(event, &mut initial).await;
                }
                Ok(None) => {
                    tracing::info!("pod watch ended, reconnecting");
                    client.failed(server);
                    break;
                }
                Err(status) => {
                    if status.code() == Code::OutOfRange {
                        revision = 0; // compacted: list again
                    }
                    tracing::warn!(error = %status.message(), "pod watch broke, reconnecting");
                    client.failed(server);
                    break;
                }
            }
        }
        if *shutdown.borrow() || sleep_or_shutdown(&mut delay, &mut shutdown).await {
            break;
        }
    }
    heartbeat.abort();
    pods.stop(cfg.remove_pods_on_exit).await;
    Ok(())
}

/// Registers until it succeeds; `None` when shut down first.
async fn register(
    cfg: &AgentConfig,
    client: &Servers,
    runtime_version: &str,
    shutdown: &mut watch::Receiver<bool>,
) -> Option<String> {
    let node = node::describe(&cfg.node_name, cfg.node_ip.as_deref(), runtime_version);
    let request = RegisterRequest { node: serde_json::to_vec(&node).unwrap_or_default() };
    let mut delay = RETRY_MIN;
    loop {
        let (server, mut c) = client.get();
        match c.register(request.clone()).await {
            Ok(r) => return Some(r.into_inner().pod_cidr),
            Err(status) => {
                tracing::warn!(server = %cfg.servers[server], error = %status.message(), "registration failed, retrying");
                client.failed(server);
            }
        }
        if sleep_or_shutdown(&mut delay, shutdown).await {
            return None;
        }
    }
}

/// Sleeps with exponential backoff; `true` when shut down meanwhile.
async fn sleep_or_shutdown(delay: &mut Duration, shutdown: &mut watch::Receiver<bool>) -> bool {
    let wait = *delay;
    *delay = (*delay * 2).min(RETRY_MAX);
    tokio::select! {
        _ = shutdown.wait_for(|s| *s) => true,
        _ = tokio::time::sleep(wait) => false,
    }
}

async fn heartbeat(cfg: AgentConfig, client: Servers) {
    let mut tick = tokio::time::interval(cfg.heartbeat);
    loop {
        tick.tick().await;
        let request = HeartbeatRequest { node_name: cfg.node_name.clone() };
        let (server, mut c) = client.get();
        if let Err(status) = c.heartbeat(request).await {
            tracing::warn!(error = %status.message(), "lease renewal failed");
            client.failed(server);
        }
    }
}

/// The control plane's replicas; calls go to one until it fails, then to the next.
#[derive(Clone)]
struct Servers {
    clients: Arc<Vec<NodeServiceClient<Channel>>>,
    current: Arc<std::sync::atomic::AtomicUsize>,
}

impl Servers {
    fn new(servers: &[String]) -> Result<Servers, AgentError> {
        if servers.is_empty() {
            return Err(AgentError::NoServers);
        }
        let clients = servers
            .iter()
            .map(|server| {
                let channel = tonic::transport::Endpoint::from_shared(server.clone())
                    .map_err(|source| AgentError::Server { server: server.clone(), source })?
                    .connect_timeout(Duration::from_secs(5))
                    .http2_keep_alive_interval(Duration::from_secs(10))
                    .keep_alive_while_idle(true)
                    .connect_lazy();
                Ok(NodeServiceClient::new(channel))
            })
            .collect::<Result<Vec<_>, AgentError>>()?;
        Ok(Servers { clients: Arc::new(clients), current: Default::default() })
    }

    fn get(&self) -> (usize, NodeServiceClient<Channel>) {
        let i = self.current.load(std::sync::atomic::Ordering::Relaxed) % self.clients.len();
        (i, self.clients[i].clone())
    }

    /// Moves on from `server` unless another call already did.
    fn failed(&self, server: usize) {
        let next = (server + 1) % self.clients.len();
        let _ = self.current.compare_exchange(
            server,
            next,
            std::sync::atomic::Ordering::Relaxed,
            std::sync::atomic::Ordering::Relaxed,
        );
    }
}

/// One worker per Pod, as the kubelet's pod workers.
struct PodWorkers {
    cfg: AgentConfig,
    runtime: Arc<RuntimeManager>,
    client: Servers,
    workers: HashMap<String, (watch::Sender<Option<Pod>>, JoinHandle<()>)>,
}

fn uid_of(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

impl PodWorkers {
    /// Applies one watch event. `initial` collects the uids of an initial list until its
    /// BOOKMARK, after which anything else running here is an orphan.
    async fn observe(&mut self, event: PodEvent, initial: &mut Option<HashSet<String>>) {
        let kind = EventType::try_from(event.r#type).unwrap_or(EventType::Unspecified);
        if kind == EventType::Bookmark {
            if let Some(listed) = initial.take() {
                self.remove_orphans(&listed).await;
            }
            return;
        }
        let pod: Pod = match serde_json::from_slice(&event.pod) {
            Ok(pod) => pod,
            Err(e) => {
                tracing::warn!(error = %e, "undecodable pod in the watch, skipping");
                return;
            }
        };
        let uid = uid_of(&pod);
        match kind {
            EventType::Added | EventType::Modified => {
                if let Some(listed) = initial.as_mut() {
                    listed.insert(uid.clone());
                }
                self.update(uid, pod);
            }
            EventType::Deleted => self.delete(&uid, pod),
            _ => {}
        }
    }

    fn update(&mut self, uid: String, pod: Pod) {
        if let Some((tx, _)) = self.workers.get(&uid) {
            tx.send_replace(Some(pod));
            return;
        }
        let (tx, rx) = watch::channel(Some(pod));
        let worker = PodWorker {
            uid: uid.clone(),
            runtime: self.runtime.clone(),
            client: self.client.clone(),
            resync: self.cfg.resync,
        };
        self.workers.insert(uid, (tx, tokio::spawn(worker.run(rx))));
    }

    fn delete(&mut self, uid: &str, last: Pod) {
        match self.workers.remove(uid) {
            Some((tx, _)) => {
                tx.send_replace(None);
            }
            None => {
                // Never ran here under this agent, but may have under a previous one.
                let runtime = self.runtime.clone();
                let uid = uid.to_owned();
                tokio::spawn(async move { kill(&runtime, &uid, grace_period(&last)).await });
            }
        }
    }

    /// Kills what runs here but was not in the initial list (deleted while the agent was away).
    async fn remove_orphans(&mut self, listed: &HashSet<String>) {
        let gone: Vec<String> = self.workers.keys().filter(|uid| !listed.contains(*uid)).cloned().collect();
        for uid in gone {
            if let Some((tx, _)) = self.workers.remove(&uid) {
                tx.send_replace(None);
            }
        }
        match self.runtime.pod_uids().await {
            Ok(uids) => {
                for uid in uids.into_iter().filter(|u| !listed.contains(u)) {
                    tracing::info!(%uid, "removing orphaned pod");
                    kill(&self.runtime, &uid, Duration::from_secs(30)).await;
                }
            }
            Err(e) => tracing::warn!(error = %e, "listing pods in the runtime failed"),
        }
    }

    /// Stops every worker; with `remove`, also stops and removes every Pod of this node.
    async fn stop(self, remove: bool) {
        for (_, (_, handle)) in self.workers {
            handle.abort();
            let _ = handle.await;
        }
        if !remove {
            return;
        }
        match self.runtime.pod_uids().await {
            Ok(uids) => {
                let kills = uids.iter().map(|uid| kill(&self.runtime, uid, Duration::from_secs(10)));
                futures::future::join_all(kills).await;
            }
            Err(e) => tracing::warn!(error = %e, "listing pods to remove failed"),
        }
    }
}

fn grace_period(pod: &Pod) -> Duration {
    let seconds = pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds).unwrap_or(30);
    Duration::from_secs(seconds.max(0) as u64)
}

async fn kill(runtime: &RuntimeManager, uid: &str, grace: Duration) {
    match runtime.kill_pod(uid, grace).await {
        Ok(()) => tracing::info!(%uid, "pod stopped and removed"),
        Err(e) => tracing::warn!(%uid, error = %e, "removing pod failed"),
    }
}

struct PodWorker {
    uid: String,
    runtime: Arc<RuntimeManager>,
    client: Servers,
    resync: Duration,
}

impl PodWorker {
    async fn run(self, mut updates: watch::Receiver<Option<Pod>>) {
        let mut reported: Option<Value> = None;
        let mut last: Option<Pod> = None;
        loop {
            let pod = updates.borrow_and_update().clone();
            let Some(pod) = pod else {
                let grace = last.as_ref().map_or(Duration::from_secs(30), grace_period);
                kill(&self.runtime, &self.uid, grace).await;
                return;
            };
            match self.runtime.sync_pod(&pod).await {
                Ok(status) => {
                    let comparable = comparable(&status);
                    if reported.as_ref() != Some(&comparable) && self.report(&pod, &status).await {
                        reported = Some(comparable);
                    }
                }
                Err(e) => {
                    tracing::warn!(pod = %pod.metadata.name.as_deref().unwrap_or(""), error = %e, "pod sync failed")
                }
            }
            last = Some(pod);
            tokio::select! {
                changed = updates.changed() => if changed.is_err() { return },
                _ = tokio::time::sleep(self.resync) => {}
            }
        }
    }

    /// Sends the status; `false` when it should be sent again.
    async fn report(&self, pod: &Pod, status: &k8s_openapi::api::core::v1::PodStatus) -> bool {
        let request = UpdatePodStatusRequest {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid: self.uid.clone(),
            status: serde_json::to_vec(status).unwrap_or_default(),
        };
        let (server, mut client) = self.client.get();
        match client.update_pod_status(request).await {
            Ok(_) => true,
            Err(s) if s.code() == Code::NotFound => true, // deleted or replaced; the watch will say
            Err(s) => {
                tracing::warn!(pod = %pod.metadata.name.as_deref().unwrap_or(""), error = %s.message(), "status report failed");
                self.client.failed(server);
                false
            }
        }
    }
}

/// A status without the timestamps that change on every look, to report only real changes.
fn comparable(status: &k8s_openapi::api::core::v1::PodStatus) -> Value {
    let mut v = serde_json::to_value(status).unwrap_or(Value::Null);
    if let Some(conditions) = v.get_mut("conditions").and_then(Value::as_array_mut) {
        for c in conditions {
            if let Some(c) = c.as_object_mut() {
                c.remove("lastProbeTime");
                c.remove("lastTransitionTime");
            }
        }
    }
    v
}
