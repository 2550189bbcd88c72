//! The node agent's main loop (the kubelet's role): register the node, renew its Lease, follow
//! the Pods bound to it, and run one pod worker per Pod that drives the runtime towards the Pod's
//! spec and reports its status.

use crate::{
    certificate::{self, KeyAndCertificate},
    cidr::{CidrError, Ipv4Cidr},
    cni,
    controlplane::{Client, Follower, RETRY_MIN, Servers, Token, follow, sleep_or_shutdown},
    cri::Cri,
    dns::{self, Dns, ResolvConf, ServerConfig, ZoneConfig, node_local},
    ingress,
    logs::rotate::{self, LogRotation},
    network::Network,
    node,
    podconfig::PodConfig,
    policy::{self, Policier},
    prober::{PodProber, Prober},
    proxy::{self, NodeContext, Proxier},
    routes::{PodNetwork, PodNetworkConfig},
    runtime::{RuntimeConfig, RuntimeManager},
    runtime_state::{self, RuntimeState},
    server::{self, KubeletServer},
};
use gitplane_proto::node::{
    EventType, HeartbeatRequest, PodEvent, RegisterRequest, RegisterResponse, UpdateNodeStatusRequest,
    UpdatePodStatusRequest, WatchPodsRequest,
};
use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;
use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
    sync::{Arc, PoisonError},
    time::{Duration, Instant},
};
use tokio::{
    sync::{Notify, watch},
    task::JoinHandle,
};
use tonic::{Code, Response, Status, Streaming};

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
    /// The cluster's Pod range (every podCIDR lies in it) and Service range: Pod traffic to
    /// them is not masqueraded.
    pub cluster_cidr: Ipv4Cidr,
    pub service_cidr: Ipv4Cidr,
    /// Which rules program Services (kube-proxy's `--proxy-mode`).
    pub proxy_backend: proxy::Backend,
    /// The node's resolv.conf: cluster DNS forwards other names to its servers, and Pods with
    /// `dnsPolicy: Default` get it.
    pub resolv_conf: PathBuf,
    pub runtime: RuntimeConfig,
    /// Labels, taints, reserves and eviction thresholds of the Node.
    pub node: node::NodeConfig,
    /// Lease renewal period (the kubelet's is 10 s for a 40 s lease).
    pub heartbeat: Duration,
    /// How often the node's own status (pressure conditions, images) is checked; it is sent
    /// only when it changed (the kubelet's nodeStatusUpdateFrequency).
    pub node_status_period: Duration,
    /// How often a pod worker re-checks a Pod that is still changing (starting, waiting in a
    /// back-off, failing) without being told.
    pub resync: Duration,
    /// How often it re-checks a steady Pod (every container running, or the Pod finished): a
    /// change in the runtime wakes its worker at once through the relist ([`PLEG_PERIOD`]).
    pub resync_steady: Duration,
    /// Stop and remove every Pod on shutdown (the appliance's `gitplane up` does; a standalone
    /// agent leaves them running, as the kubelet does).
    pub remove_pods_on_exit: bool,
    /// The cluster's join token, for the first registration (or after losing the credential).
    pub join_token: Option<String>,
    /// Where the node credential is kept (mode 0600) once registration returned it; the node's
    /// certificates go next to it (`certificate::Files`).
    pub credential_file: PathBuf,
    /// The cluster CA's certificate (PEM): `https://` servers must present a certificate it
    /// signed (the kubelet's `certificate-authority`).
    pub certificate_authority: Option<String>,
    /// The port of the node's kubelet endpoint (container logs for the control plane), on the
    /// node's address, else on loopback (`server`).
    pub kubelet_port: u16,
    /// The Ingress controller's ports on the node's address, else on loopback (0: off).
    pub ingress_http_port: u16,
    pub ingress_https_port: u16,
    /// When container logs are rotated, and how many files are kept.
    pub log_rotation: LogRotation,
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
            cluster_cidr: Ipv4Cidr::CLUSTER_DEFAULT,
            service_cidr: Ipv4Cidr::SERVICE_DEFAULT,
            proxy_backend: proxy::Backend::Nftables,
            resolv_conf: PathBuf::from("/etc/resolv.conf"),
            runtime: RuntimeConfig::default(),
            node: node::NodeConfig { nodefs: PathBuf::from("/var/lib/gitplane/pods"), ..Default::default() },
            heartbeat: Duration::from_secs(10),
            node_status_period: Duration::from_secs(10),
            resync: Duration::from_secs(2),
            resync_steady: Duration::from_secs(60),
            remove_pods_on_exit: false,
            join_token: None,
            credential_file: PathBuf::from("/var/lib/gitplane/node-credential"),
            certificate_authority: None,
            kubelet_port: gitplane_kubelet::DEFAULT_PORT,
            ingress_http_port: 80,
            ingress_https_port: 443,
            log_rotation: LogRotation::default(),
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
    #[error(
        "control plane address {server:?} is HTTPS: give the cluster CA's certificate \
         (--certificate-authority; it is <data-dir>/ca.crt on a control-plane replica)"
    )]
    NoCertificateAuthority { server: String },
    #[error("the cluster CA's certificate {file}: {why}")]
    BadCertificateAuthority { file: PathBuf, why: String },
    #[error(
        "no way to join: {file} holds no node credential and no join token was given \
         (--join-token-file; the token is <data-dir>/join-token on a control-plane replica)"
    )]
    NoCredential { file: PathBuf },
    #[error("the token in {file} is not usable: {why}")]
    BadToken { file: PathBuf, why: String },
    #[error("the node's certificates: {0}")]
    Certificate(String),
    #[error(transparent)]
    Cni(#[from] cni::CniError),
    #[error("the podCIDR the control plane gave: {0}")]
    PodCidr(#[source] CidrError),
    #[error("the node's Pod network: {0}")]
    PodNetwork(#[from] crate::routes::StartError),
    #[error("the node's address {0:?} is not an IPv4 address")]
    NodeIp(String),
    #[error("cluster DNS: {0}")]
    Dns(String),
    #[error("the kubelet endpoint on {addr}: {source} (another process holds the port? pass --kubelet-port)")]
    KubeletPort { addr: std::net::SocketAddr, source: std::io::Error },
}

/// Runs the agent until `shutdown` becomes true.
pub async fn run(cfg: AgentConfig, mut shutdown: watch::Receiver<bool>) -> Result<(), AgentError> {
    let (cri, version) = Cri::connect_and_check(&cfg.containerd_socket)
        .await
        .map_err(|source| AgentError::Runtime { socket: cfg.containerd_socket.clone(), source })?;
    let runtime_version = format!("{}://{}", version.runtime_name, version.runtime_version);
    let Some(Registered { pod_cidr, client, client_pair, serving, certificate_authority }) =
        register(&cfg, &runtime_version, &mut shutdown).await?
    else {
        return Ok(());
    };
    let conflist = cni::write_conflist(&cfg.cni_conf_dir, "gitplane", &cfg.bridge, &pod_cidr, &cfg.cni_data_dir)?;
    tracing::info!(node = %cfg.node_name, %pod_cidr, conflist = %conflist.display(), "node registered");
    let pod_network = Arc::new(
        PodNetwork::start(PodNetworkConfig {
            node_name: cfg.node_name.clone(),
            pod_cidr: pod_cidr.parse().map_err(AgentError::PodCidr)?,
            cluster_cidr: cfg.cluster_cidr,
            service_cidr: cfg.service_cidr,
        })
        .await?,
    );

    // Cluster DNS on this node: the zone and forwarding, served on the Service range's tenth
    // address, which Pods get as their nameserver.
    let cluster_dns = cfg.service_cidr.cluster_dns();
    let host_dns = ResolvConf::read(&cfg.resolv_conf).unwrap_or_else(|e| {
        tracing::warn!(file = %cfg.resolv_conf.display(), error = %e, "no resolvers to forward other names to");
        ResolvConf::parse("")
    });
    let dns = Dns::new(
        ZoneConfig {
            domain: cfg.runtime.cluster_domain.clone(),
            pod_cidrs: vec![ipnet::Ipv4Net::from(cfg.cluster_cidr).into()],
            service_cidrs: vec![ipnet::Ipv4Net::from(cfg.service_cidr).into()],
            nameservers: vec![cluster_dns.into()],
            ..ZoneConfig::default()
        },
        dns::Forwarding::from_resolv_conf(&host_dns),
    )
    .map_err(|e| AgentError::Dns(e.to_string()))?;
    let listeners = node_local::listen(cluster_dns).await.map_err(|e| AgentError::Dns(e.to_string()))?;
    // Names outside the cluster are resolved for the Pods and the node only (a query the node
    // sends to cluster DNS's address comes from that address); cluster names for anyone.
    let mut allow_recursion = dns::server::loopback();
    allow_recursion.push(ipnet::Ipv4Net::from(cfg.cluster_cidr).into());
    allow_recursion.extend(
        node_ips(&cfg)?.into_iter().chain([cluster_dns]).map(|ip| ipnet::IpNet::from(std::net::IpAddr::V4(ip))),
    );
    let dns_config = ServerConfig { allow_recursion, ..ServerConfig::default() };
    let dns_server = dns.serve(listeners, dns_config).map_err(|e| AgentError::Dns(e.to_string()))?;

    let mut runtime_cfg = cfg.runtime.clone();
    runtime_cfg.cluster_dns = vec![cluster_dns.to_string()];
    runtime_cfg.host_dns = Some(host_dns.clone());
    runtime_cfg.node_ip = runtime_cfg.node_ip.or(cfg.node_ip.clone());
    runtime_cfg.node_memory_bytes = runtime_cfg.node_memory_bytes.or_else(node::memory_bytes);
    // resourceFieldRef without a limit reads the node's allocatable, as the kubelet does.
    runtime_cfg.node_cpu_milli = runtime_cfg
        .node_cpu_milli
        .or(u64::try_from(node::cpu_count() * 1000).ok().map(|c| c.saturating_sub(cfg.node.reserved.cpu_milli)));
    // The ConfigMaps and Secrets this node's Pods reference, for env and volumes.
    let pod_config = Arc::new(PodConfig::default());
    let events = crate::events::Recorder::spawn(client.clone(), cfg.node_name.clone());
    let prober = Prober::new(cri.clone(), events.clone());
    let runtime = Arc::new(
        RuntimeManager::new(cri.clone(), runtime_cfg)
            .await
            .with_config_source(pod_config.clone())
            .with_events(events.clone()),
    );
    let following_config = tokio::spawn({
        let (pod_config, client, node_name, shutdown) =
            (pod_config.clone(), client.clone(), cfg.node_name.clone(), shutdown.clone());
        async move { pod_config.follow(client, node_name, shutdown).await }
    });
    // Container logs: the endpoint the control plane reads them from, and their rotation.
    let kubelet_addr = std::net::SocketAddr::from((kubelet_ip(&cfg)?, cfg.kubelet_port));
    let kubelet_listener = tokio::net::TcpListener::bind(kubelet_addr)
        .await
        .map_err(|source| AgentError::KubeletPort { addr: kubelet_addr, source })?;
    let certificate_authority = cfg.certificate_authority.clone().unwrap_or(certificate_authority);
    let serving_tls = Arc::new(std::sync::RwLock::new(server::auth::acceptor(&certificate_authority, serving.clone())));
    let renewing = tokio::spawn(
        crate::certificate_manager::Manager {
            node_name: cfg.node_name.clone(),
            files: certificate::Files::next_to(&cfg.credential_file),
            certificate_authority,
            servers: client.clone(),
            serving_tls: serving_tls.clone(),
            client: client_pair,
            serving,
        }
        .run(shutdown.clone()),
    );
    let kubelet = KubeletServer {
        cri: cri.clone(),
        tls: serving_tls,
        node_name: cfg.node_name.clone(),
        stats: Arc::default(),
        streams: Arc::new(tokio::sync::Semaphore::new(crate::server::streaming::MAX_STREAMS)),
    };
    let kubelet = tokio::spawn(kubelet.serve(kubelet_listener));
    let rotating = tokio::spawn(rotate::run(cri, cfg.runtime.pod_log_dir.clone(), cfg.log_rotation));
    // The runtime's health, checked on the kubelet's cadence and at once when a relist fails;
    // the node's Ready condition follows it.
    let (runtime_state, runtime_states) = watch::channel(RuntimeState::default());
    let check_runtime = Arc::new(Notify::new());
    let checking = tokio::spawn(runtime_state::run(runtime.clone(), runtime_state, check_runtime.clone()));
    // After lost heartbeats the control plane may have marked the node Unknown: the whole status
    // is sent again.
    let resend_status = Arc::new(Notify::new());
    let heartbeat = tokio::spawn(heartbeat(cfg.clone(), client.clone(), resend_status.clone()));
    let node_status =
        tokio::spawn(report_node_status(cfg.clone(), client.clone(), runtime.clone(), runtime_states, resend_status));
    // Services, EndpointSlices and Nodes, for the node's networking.
    let network = Arc::new(Network::default());
    let following = tokio::spawn({
        let (network, client, shutdown) = (network.clone(), client.clone(), shutdown.clone());
        async move { network.follow(client, shutdown).await }
    });
    // Routes to the other nodes' Pods, from the Nodes in that view.
    let routing = tokio::spawn({
        let (pod_network, network, shutdown) = (pod_network.clone(), network.clone(), shutdown.clone());
        async move { pod_network.run(&network, shutdown).await }
    });
    let proxier = Proxier::new(
        NodeContext {
            node_name: cfg.node_name.clone(),
            node_ips: node_ips(&cfg)?,
            cluster_cidr: cfg.cluster_cidr,
            service_cidr: cfg.service_cidr,
        },
        cfg.proxy_backend,
    );
    let proxying = tokio::spawn({
        let (network, shutdown) = (network.clone(), shutdown.clone());
        async move { proxy::follow::run(proxier, &network, shutdown).await }
    });
    // The Ingress controller: its routes from that view, served on the node's address.
    let routes = Arc::new(ingress::Routes::default());
    let ingress_routes = tokio::spawn({
        let (routes, network, shutdown) = (routes.clone(), network.clone(), shutdown.clone());
        async move { ingress::follow(&routes, &network, shutdown).await }
    });
    let ingress_listeners = serve_ingress(&cfg, routes, &shutdown).await?;
    let policing = tokio::spawn({
        let (policier, network, shutdown) = (Policier::new(&cfg.node_name), network.clone(), shutdown.clone());
        async move { policy::follow::run(policier, &network, shutdown).await }
    });
    let naming = tokio::spawn({
        let (dns, network, events, shutdown) = (dns.clone(), network.clone(), events.clone(), shutdown.clone());
        async move { dns::follow::run(&dns, &host_dns, &network, &events, shutdown).await }
    });
    let wakers = Wakers::default();
    let relisting = tokio::spawn(relist(runtime.clone(), wakers.clone(), check_runtime));
    let mut pods = PodWorkers {
        cfg: cfg.clone(),
        runtime: runtime.clone(),
        prober,
        client: client.clone(),
        workers: HashMap::new(),
        wakers,
        initial: None,
        config: pod_config,
    };
    follow(&mut pods, &client, &mut shutdown).await;
    heartbeat.abort();
    checking.abort();
    renewing.abort();
    node_status.abort();
    relisting.abort();
    kubelet.abort();
    rotating.abort();
    following_config.abort();
    following.abort();
    routing.abort();
    naming.abort();
    ingress_routes.abort();
    ingress_listeners.iter().for_each(tokio::task::JoinHandle::abort);
    let proxier = proxying.await;
    let policier = policing.await;
    pods.stop(cfg.remove_pods_on_exit).await;
    drop(dns_server);
    if cfg.remove_pods_on_exit {
        pod_network.clean_up().await;
        if let Ok(mut proxier) = proxier
            && let Err(error) = tokio::task::spawn_blocking(move || proxier.remove_rules()).await.unwrap_or(Ok(()))
        {
            tracing::warn!(%error, "removing the Service rules failed");
        }
        if let Ok(mut policier) = policier
            && let Err(error) = tokio::task::spawn_blocking(move || policier.remove_rules()).await.unwrap_or(Ok(()))
        {
            tracing::warn!(%error, "removing the NetworkPolicy table failed");
        }
        if let Err(error) = node_local::remove(cluster_dns).await {
            tracing::warn!(%error, "removing cluster DNS's address failed");
        }
    }
    Ok(())
}

/// Starts the Ingress controller's listeners on the node's address (loopback without one). A
/// port already taken leaves that listener off, with a warning: the node's other work goes on.
async fn serve_ingress(
    cfg: &AgentConfig,
    routes: Arc<ingress::Routes>,
    shutdown: &watch::Receiver<bool>,
) -> Result<Vec<tokio::task::JoinHandle<()>>, AgentError> {
    let ip = kubelet_ip(cfg)?;
    let proxy = ingress::proxy::Proxy::new(routes);
    let mut tasks = Vec::new();
    for (port, https) in [(cfg.ingress_http_port, false), (cfg.ingress_https_port, true)] {
        if port == 0 {
            continue;
        }
        let addr = std::net::SocketAddr::new(ip, port);
        let listener = match tokio::net::TcpListener::bind(addr).await {
            Ok(listener) => listener,
            Err(error) => {
                tracing::warn!(%addr, %error, "the Ingress controller cannot listen here; Ingresses are not served on it");
                continue;
            }
        };
        tracing::info!(%addr, https, "Ingress controller listening");
        let (proxy, shutdown) = (proxy.clone(), shutdown.clone());
        tasks.push(tokio::spawn(async move {
            if https { proxy.serve_https(listener, shutdown).await } else { proxy.serve_http(listener, shutdown).await }
        }));
    }
    Ok(tasks)
}

/// The addresses NodePorts answer on: the node's InternalIP.
fn node_ips(cfg: &AgentConfig) -> Result<Vec<std::net::Ipv4Addr>, AgentError> {
    cfg.node_ip.iter().map(|ip| ip.parse().map_err(|_| AgentError::NodeIp(ip.clone()))).collect()
}

/// Where the kubelet endpoint listens: the node's address, else loopback (the embedded
/// appliance's own node, whose control plane is in the same process).
fn kubelet_ip(cfg: &AgentConfig) -> Result<std::net::IpAddr, AgentError> {
    match &cfg.node_ip {
        Some(ip) => ip.parse().map_err(|_| AgentError::NodeIp(ip.clone())),
        None => Ok(std::net::Ipv4Addr::LOCALHOST.into()),
    }
}

/// What registration gave the node.
struct Registered {
    pod_cidr: String,
    /// The node service's clients from now on (showing the node's new client certificate).
    client: Servers,
    client_pair: Option<KeyAndCertificate>,
    serving: Option<KeyAndCertificate>,
    /// The cluster CA's certificate, as the control plane sent it.
    certificate_authority: String,
}

/// Registers until it succeeds (`None` when shut down first), with a new key's certificate
/// signing request, and keeps what it returns: the client and serving certificates, and the
/// node credential when there is one (registrations over cleartext). The call authenticates
/// with the kept client certificate if every server is HTTPS, else with the kept credential,
/// else with the join token, and falls back to the join token when refused.
async fn register(
    cfg: &AgentConfig,
    runtime_version: &str,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<Option<Registered>, AgentError> {
    let ca = cfg.certificate_authority.as_deref();
    let files = certificate::Files::next_to(&cfg.credential_file);
    let tls_only = cfg.servers.iter().all(|s| s.starts_with("https://"));
    let mut identity = ca.filter(|_| tls_only).and_then(|ca| certificate::load_client(&files.client, ca));
    let token = match identity {
        Some(_) => Token::none(),
        None => Token::load(cfg)?,
    };
    let mut client = Servers::new(&cfg.servers, token.clone(), ca, identity.as_ref())?;
    let (key, csr) = certificate::request(&cfg.node_name).map_err(|e| AgentError::Certificate(e.to_string()))?;
    let mut node = node::describe(&cfg.node_name, cfg.node_ip.as_deref(), runtime_version, &cfg.node);
    server::advertise(&mut node, cfg.kubelet_port);
    let request = RegisterRequest { node: serde_json::to_vec(&node).unwrap_or_default(), csr };
    let mut delay = RETRY_MIN;
    loop {
        let (server, mut c) = client.get();
        match c.register(request.clone()).await {
            Ok(r) => {
                let r = r.into_inner();
                match keep(cfg, &files, &token, &key, &r) {
                    Ok((client_pair, serving)) => {
                        let client = Servers::new(&cfg.servers, token, ca, client_pair.as_ref())?;
                        let certificate_authority = r.certificate_authority;
                        let pod_cidr = r.pod_cidr;
                        return Ok(Some(Registered { pod_cidr, client, client_pair, serving, certificate_authority }));
                    }
                    Err(e) => tracing::error!(error = %e, "keeping what registration returned failed, retrying"),
                }
            }
            Err(status) if matches!(status.code(), Code::Unauthenticated | Code::PermissionDenied) => {
                // A credential or certificate from another cluster (or a rotated key): join
                // again, if we can.
                let fallback = token.fall_back_to_join(cfg);
                if identity.take().is_some() {
                    client = Servers::new(&cfg.servers, token.clone(), ca, None)?;
                }
                tracing::warn!(
                    server = %cfg.servers[server],
                    error = %status.message(),
                    retry_with_join_token = fallback,
                    "registration refused"
                );
            }
            Err(status) => {
                tracing::warn!(server = %cfg.servers[server], error = %status.message(), "registration failed, retrying");
                client.failed(server);
            }
        }
        if sleep_or_shutdown(&mut delay, shutdown).await {
            return Ok(None);
        }
    }
}

/// Keeps the certificates and the credential of a registration; the client and serving pairs.
fn keep(
    cfg: &AgentConfig,
    files: &certificate::Files,
    token: &Token,
    key: &rcgen::KeyPair,
    response: &RegisterResponse,
) -> Result<(Option<KeyAndCertificate>, Option<KeyAndCertificate>), AgentError> {
    let kept = |path: &std::path::Path, pem: &str| -> Result<Option<KeyAndCertificate>, AgentError> {
        if pem.is_empty() {
            return Ok(None);
        }
        let pair = certificate::with_key(pem.to_owned(), key);
        certificate::store(path, &pair)
            .map_err(|e| AgentError::Certificate(format!("writing {}: {e}", path.display())))?;
        Ok(Some(pair))
    };
    let client = kept(&files.client, &response.client_certificate)?;
    let serving = kept(&files.serving, &response.serving_certificate)?;
    if !response.credential.is_empty() {
        token.keep(&response.credential, &cfg.credential_file)?;
    } else if client.is_some() {
        // The certificate replaces the credential of a node that registered before.
        token.clear();
        match std::fs::remove_file(&cfg.credential_file) {
            Ok(()) => {
                tracing::info!(file = %cfg.credential_file.display(), "the client certificate replaces the node credential")
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(file = %cfg.credential_file.display(), error = %e, "removing the old node credential")
            }
        }
    }
    Ok((client, serving))
}

/// Renews the Lease every period; after renewals failed, `recovered` asks for the node's status
/// to be sent again.
async fn heartbeat(cfg: AgentConfig, client: Servers, recovered: Arc<Notify>) {
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
async fn report_node_status(
    cfg: AgentConfig,
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
        let signals = node::host_signals(&cfg.node.nodefs);
        let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
        let mut status = node::status(&cfg.node, &signals, &conditions, images.clone(), now.clone());
        let previous = conditions.iter().find(|c| c.type_ == "Ready");
        let ready = runtime_state::ready_condition(&runtime_state.borrow_and_update(), previous, now);
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

/// One worker per Pod, as the kubelet's pod workers.
struct PodWorkers {
    cfg: AgentConfig,
    runtime: Arc<RuntimeManager>,
    prober: Prober,
    client: Servers,
    workers: HashMap<String, (watch::Sender<Option<Pod>>, JoinHandle<()>)>,
    /// Each worker's wake-up, for the relist.
    wakers: Wakers,
    /// During an initial list, the uids it named so far: at its bookmark, anything else running
    /// here is an orphan.
    initial: Option<HashSet<String>>,
    /// Wakes the workers of Pods whose ConfigMaps or Secrets change.
    config: Arc<PodConfig>,
}

impl Follower for PodWorkers {
    type Event = PodEvent;
    const WHAT: &'static str = "pod watch";

    async fn open(&self, mut client: Client, from: i64) -> Result<Streaming<PodEvent>, Status> {
        let request = WatchPodsRequest { node_name: self.cfg.node_name.clone(), resource_version: from };
        client.watch_pods(request).await.map(Response::into_inner)
    }

    fn started(&mut self, from: i64) {
        self.initial = (from == 0).then(HashSet::new);
    }

    /// Applies one watch event; at the bookmark that ends an initial list, what runs here
    /// without being in it is an orphan and is removed.
    async fn observe(&mut self, event: PodEvent) {
        let kind = EventType::try_from(event.r#type).unwrap_or(EventType::Unspecified);
        if kind == EventType::Bookmark {
            if let Some(listed) = self.initial.take() {
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
                if let Some(listed) = self.initial.as_mut() {
                    listed.insert(uid.clone());
                }
                self.update(uid, pod);
            }
            EventType::Deleted => self.delete(&uid, pod),
            _ => {}
        }
    }
}

fn uid_of(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

impl PodWorkers {
    fn update(&mut self, uid: String, pod: Pod) {
        if let Some((tx, _)) = self.workers.get(&uid) {
            if let Some(wake) = self.wakers.lock().unwrap_or_else(PoisonError::into_inner).get(&uid) {
                self.config.register(&uid, &pod, wake.clone());
            }
            // The worker always gets the newest Pod, but is woken only by what it acts on: its
            // own status writes come back through the watch, and once woke it at once, so every
            // status that differed from the last one started the next sync (70 a second).
            tx.send_if_modified(|current| {
                let wake = current.as_ref().is_none_or(|current| needs_sync(current, &pod));
                *current = Some(pod);
                wake
            });
            return;
        }
        let key = format!(
            "{}/{}",
            pod.metadata.namespace.as_deref().unwrap_or(""),
            pod.metadata.name.as_deref().unwrap_or("")
        );
        let wake = Arc::new(Notify::new());
        self.config.register(&uid, &pod, wake.clone());
        let involved = gitplane_api::events::reference(&pod);
        let (tx, rx) = watch::channel(Some(pod));
        self.wakers.lock().unwrap_or_else(PoisonError::into_inner).insert(uid.clone(), wake.clone());
        let worker = PodWorker {
            uid: uid.clone(),
            runtime: self.runtime.clone(),
            probes: self.prober.pod(key, involved, wake.clone()),
            client: self.client.clone(),
            resync: self.cfg.resync,
            resync_steady: self.cfg.resync_steady,
            wake,
            config: self.config.clone(),
        };
        self.workers.insert(uid, (tx, tokio::spawn(worker.run(rx))));
    }

    fn delete(&mut self, uid: &str, last: Pod) {
        self.wakers.lock().unwrap_or_else(PoisonError::into_inner).remove(uid);
        self.config.unregister(uid);
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
            self.wakers.lock().unwrap_or_else(PoisonError::into_inner).remove(&uid);
            self.config.unregister(&uid);
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

    /// Stops every worker; with `remove`, also stops and removes every Pod of this node, all at
    /// once, each container given [`EXIT_GRACE`] and the whole at most [`EXIT_DEADLINE`]: a
    /// stop must end whatever state the runtime is in, and what is left (a runtime that does
    /// not answer) is the host's to kill.
    async fn stop(self, remove: bool) {
        for (_, (_, handle)) in self.workers {
            handle.abort();
            let _ = handle.await;
        }
        if !remove {
            return;
        }
        let runtime = &self.runtime;
        let removing = async {
            // A runtime that is down may be on its way back (`gitplane up` starts it again).
            let uids = loop {
                match runtime.pod_uids().await {
                    Ok(uids) => break uids,
                    Err(error) => {
                        tracing::warn!(%error, "listing the pods to remove failed; trying again");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
            };
            let kills = uids.iter().map(|uid| async move {
                if let Err(error) = runtime.kill_pod(uid, EXIT_GRACE).await {
                    tracing::warn!(%uid, %error, "removing the pod failed");
                }
            });
            futures::future::join_all(kills).await;
        };
        if tokio::time::timeout(EXIT_DEADLINE, removing).await.is_err() {
            tracing::warn!(deadline = ?EXIT_DEADLINE, "the pods were not all removed in time");
        }
    }
}

/// What each container gets after SIGTERM when the agent removes its Pods on exit: the kubelet's
/// minimum grace period, so that a stop is quick.
const EXIT_GRACE: Duration = Duration::from_secs(2);
/// How long removing every Pod on exit may take.
pub const EXIT_DEADLINE: Duration = Duration::from_secs(4);

fn grace_period(pod: &Pod) -> Duration {
    let seconds = pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds).unwrap_or(30);
    Duration::from_secs(seconds.max(0) as u64)
}

/// Kills the pod, retrying with back-off: a runtime call cut off mid-way leaves a container
/// that containerd is still starting, which cannot be removed until it has started. What is left
/// after the last attempt, the orphan removal of the agent's next start removes.
async fn kill(runtime: &RuntimeManager, uid: &str, grace: Duration) {
    const ATTEMPTS: u32 = 5;
    let mut delay = Duration::from_secs(1);
    for attempt in 1..=ATTEMPTS {
        match runtime.kill_pod(uid, grace).await {
            Ok(()) => {
                tracing::info!(%uid, "pod stopped and removed");
                return;
            }
            Err(e) => tracing::warn!(%uid, error = %e, attempt, "removing pod failed"),
        }
        if attempt < ATTEMPTS {
            tokio::time::sleep(delay).await;
            delay *= 2;
        }
    }
}

struct PodWorker {
    uid: String,
    runtime: Arc<RuntimeManager>,
    /// The Pod's probe workers; they wake this worker when a verdict changes.
    probes: PodProber,
    client: Servers,
    resync: Duration,
    resync_steady: Duration,
    /// Notified by the relist when the runtime's view of this Pod changed, and when a ConfigMap
    /// or Secret it references changed.
    wake: Arc<Notify>,
    config: Arc<PodConfig>,
}

impl PodWorker {
    async fn run(mut self, mut updates: watch::Receiver<Option<Pod>>) {
        let mut reported: Option<Value> = None;
        let mut budget = WriteBudget::new(Instant::now());
        let mut last: Option<Pod> = None;
        // Syncs that failed in a row: the next one waits longer.
        let mut failures = 0u32;
        // `kubelet_pod_start_duration_seconds`: from now to the first Running status, unless the
        // Pod already ran when first seen (adopted by a restarted agent).
        let seen = Instant::now();
        let mut start_recorded = false;
        loop {
            let pod = updates.borrow_and_update().clone();
            let Some(pod) = pod else {
                let grace = last.as_ref().map_or(Duration::from_secs(30), grace_period);
                for (pod, c) in last.iter().flat_map(|p| p.spec.iter().flat_map(|s| &s.containers).map(move |c| (p, c)))
                {
                    let message = format!("Stopping container {}", c.name);
                    self.runtime.events().pod(pod, gitplane_api::events::NORMAL, "Killing", &message);
                }
                kill(&self.runtime, &self.uid, grace).await;
                return;
            };
            // What this version of the Pod references is here before it is read (once per version).
            if last.as_ref().is_none_or(|l| l.metadata.resource_version != pod.metadata.resource_version) {
                self.config.wait_for(&pod).await;
            }
            let mut next_sync = self.resync;
            self.probes.update(&pod);
            // The store may still show the Pod running at the address of a sandbox that is gone
            // (the node restarted): the status without it goes out first, before the sandbox is
            // made again (which may take long, or fail).
            if last.is_none()
                && pod.status.as_ref().is_some_and(|s| s.pod_ip.is_some())
                && let Ok(status) = self.runtime.pod_status(&pod, &self.probes.snapshot()).await
                && status.pod_ip.is_none()
                && self.report(&pod, &status).await
            {
                reported = Some(comparable(&status));
            }
            let status = match self.runtime.sync_pod(&pod, &self.probes.snapshot()).await {
                Ok(status) => {
                    failures = 0;
                    if !start_recorded {
                        let was_running =
                            |p: &Pod| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
                        if last.is_none() && was_running(&pod) {
                            start_recorded = true;
                        } else if status.phase.as_deref() == Some("Running") {
                            crate::metrics::pod_started(seen.elapsed());
                            start_recorded = true;
                        }
                    }
                    self.probes.observe(&status);
                    if steady(&status) {
                        next_sync = self.resync_steady;
                    }
                    Some(status)
                }
                Err(e) => {
                    failures = failures.saturating_add(1);
                    next_sync = sync_backoff(failures);
                    if failures == 1 {
                        tracing::warn!(pod = %pod.metadata.name.as_deref().unwrap_or(""), error = %e, retry_in = ?next_sync, "pod sync failed");
                    }
                    // A Pod that never ran here says why it does not; one that runs keeps its
                    // status (its containers may well run on in their shims).
                    if started(&pod) { None } else { self.runtime.sandbox_failed(&pod, &self.probes.snapshot(), &e) }
                }
            };
            if let Some(status) = status {
                let comparable = comparable(&status);
                if reported.as_ref() != Some(&comparable) {
                    match budget.take(Instant::now()) {
                        Ok(()) => {
                            if self.report(&pod, &status).await {
                                reported = Some(comparable);
                            }
                        }
                        // Coalesced, not dropped: the sync when the budget allows reports
                        // the status of that moment.
                        Err(allowed_at) => {
                            next_sync = next_sync.min(allowed_at.saturating_duration_since(Instant::now()));
                        }
                    }
                }
            }
            last = Some(pod);
            tokio::select! {
                changed = updates.changed() => if changed.is_err() { return },
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(next_sync) => {}
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

/// When a pod worker syncs again after `failures` failed syncs in a row: 1 s, doubling, at most
/// 10 s (the kubelet's pod worker back-off). The runtime's return wakes every worker sooner.
fn sync_backoff(failures: u32) -> Duration {
    Duration::from_secs(1).saturating_mul(1 << failures.saturating_sub(1).min(4)).min(Duration::from_secs(10))
}

/// Whether the Pod's status says it got a sandbox (an address) or got past Pending: a sync that
/// fails then leaves its status as it is.
fn started(pod: &Pod) -> bool {
    let status = pod.status.as_ref();
    status.is_some_and(|s| s.pod_ip.is_some() || s.phase.as_deref().is_some_and(|p| p != "Pending"))
}

/// A Pod that only a change in the runtime (which the relist reports) or in its spec can move:
/// finished, or running with every container running.
fn steady(status: &k8s_openapi::api::core::v1::PodStatus) -> bool {
    match status.phase.as_deref() {
        Some("Succeeded" | "Failed") => true,
        Some("Running") => status
            .container_statuses
            .as_ref()
            .is_some_and(|statuses| statuses.iter().all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))),
        _ => false,
    }
}

/// The pod workers' wake-ups by pod uid.
type Wakers = Arc<std::sync::Mutex<HashMap<String, Arc<Notify>>>>;

/// How often the runtime is relisted (the kubelet's PLEG period).
pub const PLEG_PERIOD: Duration = Duration::from_secs(1);

/// The kubelet's PLEG: relists the runtime every [`PLEG_PERIOD`] and wakes the worker of every
/// Pod whose sandboxes or containers changed. A relist that fails has the runtime's health
/// checked at once (`check_runtime`), and so has the first one that works again, which also wakes
/// every worker, so Pods that could not start go on without waiting out their back-off.
async fn relist(runtime: Arc<RuntimeManager>, wakers: Wakers, check_runtime: Arc<Notify>) {
    let mut seen: HashMap<String, u64> = HashMap::new();
    let mut tick = tokio::time::interval(PLEG_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_cleanup = Instant::now();
    let mut failing = false;
    loop {
        tick.tick().await;
        if last_cleanup.elapsed() >= ORPHAN_CLEANUP_PERIOD {
            last_cleanup = Instant::now();
            let keep: HashSet<String> = wakers.lock().unwrap_or_else(PoisonError::into_inner).keys().cloned().collect();
            match runtime.remove_orphaned_cgroups(&keep).await {
                Ok(removed) if !removed.is_empty() => tracing::info!(?removed, "removed orphaned pod cgroups"),
                Ok(_) => {}
                Err(error) => tracing::warn!(%error, "cleaning up orphaned pod cgroups failed"),
            }
        }
        let now = match runtime.relist().await {
            Ok(now) => now,
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "relisting the runtime failed");
                    failing = true;
                }
                check_runtime.notify_one();
                continue;
            }
        };
        {
            let wakers = wakers.lock().unwrap_or_else(PoisonError::into_inner);
            if std::mem::take(&mut failing) {
                tracing::info!("relisting the runtime works again");
                check_runtime.notify_one();
                wakers.values().for_each(|wake| wake.notify_one());
            }
            let changed = now.iter().filter(|(uid, print)| seen.get(*uid) != Some(print)).map(|(uid, _)| uid);
            let gone = seen.keys().filter(|uid| !now.contains_key(*uid));
            for uid in changed.chain(gone) {
                if let Some(wake) = wakers.get(uid) {
                    wake.notify_one();
                }
            }
        }
        seen = now;
    }
}

/// How often the relist also removes the cgroups of pods that are gone (the kubelet does it in
/// its housekeeping, every 2 s; cgroups left behind cost nothing but a directory).
const ORPHAN_CLEANUP_PERIOD: Duration = Duration::from_secs(30);

/// Whether a pod worker must sync again for this new version of its Pod: anything but the
/// status and the bookkeeping of the write itself (resourceVersion, managedFields).
fn needs_sync(current: &Pod, new: &Pod) -> bool {
    let meta = |pod: &Pod| {
        let mut meta = pod.metadata.clone();
        meta.resource_version = None;
        meta.managed_fields = None;
        meta
    };
    current.spec != new.spec || meta(current) != meta(new)
}

/// Status writes one Pod may make: a burst of [`WriteBudget::BURST`] (a Pod's start is a few
/// changes in a row), then one per [`WriteBudget::EVERY`]. A status that keeps changing for any
/// reason costs the store at most that.
#[derive(Debug)]
struct WriteBudget {
    tokens: u32,
    /// When the tokens were last counted.
    at: Instant,
}

impl WriteBudget {
    const BURST: u32 = 5;
    const EVERY: Duration = Duration::from_secs(1);

    fn new(now: Instant) -> Self {
        WriteBudget { tokens: Self::BURST, at: now }
    }

    /// Takes one write; when none is left, the time the next one is.
    fn take(&mut self, now: Instant) -> Result<(), Instant> {
        let earned = now.saturating_duration_since(self.at).as_nanos() / Self::EVERY.as_nanos();
        let earned = u32::try_from(earned).unwrap_or(u32::MAX).min(Self::BURST);
        self.tokens = (self.tokens + earned).min(Self::BURST);
        self.at = if self.tokens == Self::BURST { now } else { self.at + Self::EVERY * earned };
        if self.tokens == 0 {
            return Err(self.at + Self::EVERY);
        }
        self.tokens -= 1;
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(rv: &str, image: &str, phase: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": { "name": "web", "uid": "u-1", "resourceVersion": rv, "labels": { "app": "web" } },
            "spec": { "containers": [{ "name": "web", "image": image }] },
            "status": { "phase": phase },
        }))
        .expect("valid pod")
    }

    #[test]
    fn only_what_the_worker_acts_on_wakes_it() {
        let current = pod("1", "httpd:1", "Pending");
        assert!(!needs_sync(&current, &pod("2", "httpd:1", "Running")), "its own status write");
        assert!(needs_sync(&current, &pod("2", "httpd:2", "Pending")), "a new image");
        let mut relabeled = pod("2", "httpd:1", "Pending");
        relabeled.metadata.labels = Some([("app".to_owned(), "api".to_owned())].into());
        assert!(needs_sync(&current, &relabeled), "labels reach the containers' environment");
        let mut deleting = pod("2", "httpd:1", "Pending");
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        assert!(needs_sync(&current, &deleting));
    }

    #[test]
    fn the_write_budget_is_a_burst_then_one_a_second() {
        let t0 = Instant::now();
        let mut budget = WriteBudget::new(t0);
        for _ in 0..WriteBudget::BURST {
            assert_eq!(budget.take(t0), Ok(()));
        }
        assert_eq!(budget.take(t0), Err(t0 + Duration::from_secs(1)));
        assert_eq!(budget.take(t0 + Duration::from_millis(999)), Err(t0 + Duration::from_secs(1)));
        assert_eq!(budget.take(t0 + Duration::from_secs(1)), Ok(()));
        assert_eq!(budget.take(t0 + Duration::from_millis(1500)), Err(t0 + Duration::from_secs(2)));
        // A status changing at every chance for a minute: the burst, then one a second.
        let mut budget = WriteBudget::new(t0);
        let writes = (0..6000).filter(|i| budget.take(t0 + Duration::from_millis(10 * i)).is_ok()).count();
        assert_eq!(writes, WriteBudget::BURST as usize + 59);
        // Idle time refills the burst, and no more.
        let later = t0 + Duration::from_secs(3600);
        let burst = (0..10).filter(|_| budget.take(later).is_ok()).count();
        assert_eq!(burst, WriteBudget::BURST as usize);
    }

    #[test]
    fn failed_syncs_back_off_to_ten_seconds() {
        let waits: Vec<u64> = (1..=7).map(|n| sync_backoff(n).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 10, 10, 10]);
    }

    #[test]
    fn a_pod_that_got_an_address_or_ran_has_started() {
        assert!(!started(&pod("1", "httpd:1", "Pending")));
        assert!(started(&pod("1", "httpd:1", "Running")));
        assert!(started(&pod("1", "httpd:1", "Failed")));
        let mut waiting = pod("1", "httpd:1", "Pending");
        waiting.status.as_mut().unwrap().pod_ip = Some("10.244.0.2".into());
        assert!(started(&waiting));
        let mut fresh = pod("1", "httpd:1", "Pending");
        fresh.status = None;
        assert!(!started(&fresh));
    }

    #[test]
    fn timestamps_alone_are_no_change() {
        let status = |time: &str| {
            serde_json::from_value::<k8s_openapi::api::core::v1::PodStatus>(json!({
                "phase": "Running",
                "conditions": [{ "type": "Ready", "status": "True", "lastTransitionTime": time }],
            }))
            .expect("valid status")
        };
        assert_eq!(comparable(&status("2025-01-01T00:00:00Z")), comparable(&status("2025-01-01T00:00:09Z")));
    }
}
