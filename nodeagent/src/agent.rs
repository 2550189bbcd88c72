//! The node agent's main loop (the kubelet's role): register the node, renew its Lease, follow
//! the Pods bound to it, and run one pod worker per Pod that drives the runtime towards the Pod's
//! spec and reports its status.

use crate::{
    certificate::{self, KeyAndCertificate},
    controlplane::{ControlPlaneError, Credentials, RETRY_MIN, Servers, Token, follow, sleep_or_shutdown},
    kubelet::{
        cri::Cri,
        eviction,
        logs::rotate::{self, LogRotation},
        node,
        node_status::{self, NodeStatusConfig},
        pleg,
        pod_workers::{PodWorkers, PodWorkersConfig},
        podconfig::PodConfig,
        prober::Prober,
        runtime::{RuntimeConfig, RuntimeManager},
        runtime_state::{self, RuntimeState},
        server::{self, KubeletServer},
    },
    network::{
        cidr::{CidrError, Ipv4Cidr},
        cni,
        dns::{self, Dns, ResolvConf, ServerConfig, ZoneConfig, node_local},
        follow::run as follow_network,
        ingress,
        policy::Policier,
        proxy::{self, NodeContext, Proxier},
        routes::{PodNetwork, PodNetworkConfig},
        view::Network,
    },
    supervisor::{AtStop, Supervisor, TaskError},
};
use gitplane_proto::node::{RegisterRequest, RegisterResponse};
use std::{path::PathBuf, sync::Arc, time::Duration};
use tokio::sync::{Notify, watch};
use tonic::Code;

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
    /// The cluster's Service range: Pod traffic to it is not masqueraded (nor to the cluster's
    /// Pod range, which registration tells).
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
    /// change in the runtime wakes its worker at once through the relist ([`pleg::PLEG_PERIOD`]).
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
    /// containerd's `config_path`, where the registries' `hosts.toml` files are written (when
    /// `runtime.registries` came from a file).
    pub registry_config_path: Option<PathBuf>,
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
            service_cidr: Ipv4Cidr::SERVICE_DEFAULT,
            proxy_backend: proxy::Backend::Nftables,
            resolv_conf: PathBuf::from("/etc/resolv.conf"),
            runtime: RuntimeConfig::default(),
            node: node::NodeConfig {
                nodefs: PathBuf::from("/var/lib/gitplane/pods"),
                local_path_dir: PathBuf::from("/var/lib/gitplane/storage"),
                ..Default::default()
            },
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
            registry_config_path: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("container runtime at {socket}: {source}")]
    Runtime { socket: PathBuf, source: crate::kubelet::cri::CriError },
    #[error("the cluster CA's certificate {file}: {why}")]
    BadCertificateAuthority { file: PathBuf, why: String },
    #[error(transparent)]
    ControlPlane(#[from] ControlPlaneError),
    #[error("the node's certificates: {0}")]
    Certificate(String),
    #[error(transparent)]
    Cni(#[from] cni::CniError),
    #[error("the podCIDR the control plane gave: {0}")]
    PodCidr(#[source] CidrError),
    #[error("the cluster Pod range the control plane gave: {0}")]
    ClusterCidr(#[source] CidrError),
    #[error("the node's Pod network: {0}")]
    PodNetwork(#[from] crate::network::routes::StartError),
    #[error("the node's address {0:?} is not an IPv4 address")]
    NodeIp(String),
    #[error("cluster DNS: {0}")]
    Dns(String),
    #[error("the kubelet endpoint on {addr}: {source} (another process holds the port? pass --kubelet-port)")]
    KubeletPort { addr: std::net::SocketAddr, source: std::io::Error },
    #[error("the registries file: {0}")]
    Registries(#[from] crate::kubelet::registries::RegistriesError),
    #[error("writing the registries' hosts.toml files under {dir}: {source}")]
    RegistryHosts { dir: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Task(#[from] TaskError),
}

/// Runs the agent until `shutdown` becomes true.
pub async fn run(cfg: AgentConfig, mut shutdown: watch::Receiver<bool>) -> Result<(), AgentError> {
    let (cri, version) = Cri::connect_and_check(&cfg.containerd_socket)
        .await
        .map_err(|source| AgentError::Runtime { socket: cfg.containerd_socket.clone(), source })?;
    let runtime_version = format!("{}://{}", version.runtime_name, version.runtime_version);
    if let Some(dir) = &cfg.registry_config_path {
        crate::kubelet::containerd::write_registry_hosts(dir, &cfg.runtime.registries)
            .map_err(|source| AgentError::RegistryHosts { dir: dir.clone(), source })?;
    }
    let Some(Registered { pod_cidr, cluster_cidr, client, client_pair, serving, certificate_authority }) =
        register(&cfg, &runtime_version, None, &mut shutdown).await?
    else {
        return Ok(());
    };
    // Control planes that send none had only the default range.
    let cluster_cidr = match cluster_cidr.as_str() {
        "" => Ipv4Cidr::CLUSTER_DEFAULT,
        text => text.parse().map_err(AgentError::ClusterCidr)?,
    };
    let conflist = cni::write_conflist(&cfg.cni_conf_dir, "gitplane", &cfg.bridge, &pod_cidr, &cfg.cni_data_dir)?;
    tracing::info!(node = %cfg.node_name, %pod_cidr, conflist = %conflist.display(), "node registered");
    let pod_network = Arc::new(
        PodNetwork::start(PodNetworkConfig {
            node_name: cfg.node_name.clone(),
            pod_cidr: pod_cidr.parse().map_err(AgentError::PodCidr)?,
            cluster_cidr,
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
            pod_cidrs: vec![ipnet::Ipv4Net::from(cluster_cidr).into()],
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
    allow_recursion.push(ipnet::Ipv4Net::from(cluster_cidr).into());
    allow_recursion.extend(
        node_ips(&cfg)?.into_iter().chain([cluster_dns]).map(|ip| ipnet::IpNet::from(std::net::IpAddr::V4(ip))),
    );
    let dns_config = ServerConfig { allow_recursion, ..ServerConfig::default() };
    let dns_server = dns.serve(listeners, dns_config).map_err(|e| AgentError::Dns(e.to_string()))?;

    let mut runtime_cfg = cfg.runtime.clone();
    runtime_cfg.cluster_dns = vec![cluster_dns.to_string()];
    runtime_cfg.kubernetes_service = Some(cfg.service_cidr.kubernetes_service());
    runtime_cfg.host_dns = Some(host_dns.clone());
    runtime_cfg.node_ip = runtime_cfg.node_ip.or(cfg.node_ip.clone());
    runtime_cfg.node_memory_bytes = runtime_cfg.node_memory_bytes.or_else(node::memory_bytes);
    // resourceFieldRef without a limit reads the node's allocatable, as the kubelet does.
    runtime_cfg.node_cpu_milli = runtime_cfg
        .node_cpu_milli
        .or(u64::try_from(node::cpu_count() * 1000).ok().map(|c| c.saturating_sub(cfg.node.reserved.cpu_milli)));
    // The ConfigMaps and Secrets this node's Pods reference, for env and volumes.
    let pod_config = Arc::new(PodConfig::with_local_path_dir(cfg.node.local_path_dir.clone()));
    pod_config.request_tokens_from(client.clone());
    let events = crate::events::Recorder::spawn(client.clone(), cfg.node_name.clone());
    let prober = Prober::new(cri.clone(), events.clone());
    let runtime = Arc::new(
        RuntimeManager::new(cri.clone(), runtime_cfg)
            .await
            .with_config_source(pod_config.clone())
            .with_events(events.clone()),
    );
    // Every long-running task of the agent; the pod workers are the Pod watch's own.
    let mut tasks = Supervisor::<Leftover>::new();
    tasks.restarting("ConfigMap and Secret watch", AtStop::Abort, {
        let (pod_config, client, node_name) = (pod_config.clone(), client.clone(), cfg.node_name.clone());
        move |stop| {
            let (pod_config, client, node_name) = (pod_config.clone(), client.clone(), node_name.clone());
            async move { pod_config.follow(client, node_name, stop).await }
        }
    });
    // Container logs: the endpoint the control plane reads them from, and their rotation.
    let kubelet_addr = std::net::SocketAddr::from((kubelet_ip(&cfg)?, cfg.kubelet_port));
    let kubelet_listener = tokio::net::TcpListener::bind(kubelet_addr)
        .await
        .map_err(|source| AgentError::KubeletPort { addr: kubelet_addr, source })?;
    let certificate_authority = cfg.certificate_authority.clone().unwrap_or(certificate_authority);
    let serving_tls = Arc::new(std::sync::RwLock::new(server::auth::acceptor(&certificate_authority, serving.clone())));
    let renewal = crate::certificate_manager::Manager {
        node_name: cfg.node_name.clone(),
        files: certificate::Files::next_to(&cfg.credential_file),
        certificate_authority,
        servers: client.clone(),
        serving_tls: serving_tls.clone(),
        client: client_pair,
        serving,
    };
    tasks.finite("certificate renewal", renewal.run(tasks.stopping()));
    let kubelet = KubeletServer {
        cri: cri.clone(),
        tls: serving_tls,
        node_name: cfg.node_name.clone(),
        stats: Arc::default(),
        streams: Arc::new(tokio::sync::Semaphore::new(crate::kubelet::server::streaming::MAX_STREAMS)),
    };
    tasks.critical("kubelet endpoint", kubelet.serve(kubelet_listener));
    tasks.restarting("container log rotation", AtStop::Abort, {
        let (pod_log_dir, rotation) = (cfg.runtime.pod_log_dir.clone(), cfg.log_rotation);
        move |_| rotate::run(cri.clone(), pod_log_dir.clone(), rotation)
    });
    // The runtime's health, checked on the kubelet's cadence and at once when a relist fails;
    // the node's Ready condition follows it.
    let (runtime_state, runtime_states) = watch::channel(RuntimeState::default());
    let check_runtime = Arc::new(Notify::new());
    tasks.critical("runtime state", runtime_state::run(runtime.clone(), runtime_state, check_runtime.clone()));
    // After lost heartbeats the control plane may have marked the node Unknown: the whole status
    // is sent again.
    let resend_status = Arc::new(Notify::new());
    let status_cfg = NodeStatusConfig {
        node_name: cfg.node_name.clone(),
        node: cfg.node.clone(),
        heartbeat: cfg.heartbeat,
        node_status_period: cfg.node_status_period,
    };
    tasks.restarting("heartbeat", AtStop::Abort, {
        let (status_cfg, client, resend_status) = (status_cfg.clone(), client.clone(), resend_status.clone());
        move |_| node_status::heartbeat(status_cfg.clone(), client.clone(), resend_status.clone())
    });
    tasks.restarting("node status", AtStop::Abort, {
        let (client, runtime) = (client.clone(), runtime.clone());
        move |_| {
            let (cfg, states, resend) = (status_cfg.clone(), runtime_states.clone(), resend_status.clone());
            node_status::report(cfg, client.clone(), runtime.clone(), states, resend)
        }
    });
    // Services, EndpointSlices and Nodes, for the node's networking.
    let network = Arc::new(Network::default());
    tasks.restarting("network watch", AtStop::Abort, {
        let (network, client) = (network.clone(), client.clone());
        move |stop| {
            let (network, client) = (network.clone(), client.clone());
            async move { network.follow(client, stop).await }
        }
    });
    // Routes to the other nodes' Pods, from the Nodes in that view.
    tasks.restarting("pod routes", AtStop::Abort, {
        let (pod_network, network) = (pod_network.clone(), network.clone());
        move |stop| {
            let (pod_network, network) = (pod_network.clone(), network.clone());
            async move { pod_network.run(&network, stop).await }
        }
    });
    // A Proxier started again programs the rules afresh over the ones in place.
    let node_context = NodeContext {
        node_name: cfg.node_name.clone(),
        node_ips: node_ips(&cfg)?,
        cluster_cidr,
        service_cidr: cfg.service_cidr,
    };
    tasks.restarting("Service proxy", AtStop::Await, {
        let (network, backend) = (network.clone(), cfg.proxy_backend);
        move |stop| {
            let (proxier, network) = (Proxier::new(node_context.clone(), backend), network.clone());
            async move { follow_network(proxier, &network, stop).await }
        }
    });
    // The Ingress controller: its routes from that view, served on the node's address.
    let routes = Arc::new(ingress::Routes::default());
    tasks.restarting("Ingress routes", AtStop::Abort, {
        let (routes, network) = (routes.clone(), network.clone());
        move |stop| {
            let (routes, network) = (routes.clone(), network.clone());
            async move {
                follow_network(ingress::Feed::new(routes), &network, stop).await;
            }
        }
    });
    serve_ingress(&cfg, routes, &mut tasks).await?;
    tasks.restarting("NetworkPolicy", AtStop::Await, {
        let (network, node_name) = (network.clone(), cfg.node_name.clone());
        move |stop| {
            let (policier, network) = (Policier::new(&node_name), network.clone());
            async move { follow_network(policier, &network, stop).await }
        }
    });
    tasks.restarting("cluster DNS", AtStop::Abort, {
        let (dns, network, events) = (dns.clone(), network.clone(), events.clone());
        move |stop| {
            let feed = dns::follow::Feed { dns: dns.clone(), host: host_dns.clone(), events: events.clone() };
            let network = network.clone();
            async move {
                follow_network(feed, &network, stop).await;
            }
        }
    });
    let pods_cfg =
        PodWorkersConfig { node_name: cfg.node_name.clone(), resync: cfg.resync, resync_steady: cfg.resync_steady };
    let evictions = eviction::Evictions::default();
    let mut pods = PodWorkers::new(pods_cfg, runtime.clone(), prober, client.clone(), pod_config, evictions.clone());
    tasks.restarting("PLEG", AtStop::Abort, {
        let (runtime, wakers) = (runtime.clone(), pods.wakers());
        move |_| pleg::run(runtime.clone(), wakers.clone(), check_runtime.clone())
    });
    tasks.restarting("eviction manager", AtStop::Abort, {
        let runtime = runtime.clone();
        move |_| eviction::run(runtime.clone(), evictions.clone())
    });
    let failed = tokio::select! {
        () = follow(&mut pods, &client, &mut shutdown) => None,
        failed = tasks.watch() => Some(failed),
    };
    let (mut proxier, mut policier) = (None, None);
    for left in tasks.stop(STOP_DEADLINE).await {
        match left {
            Leftover::Proxier(p) => proxier = Some(p),
            Leftover::Policier(p) => policier = Some(p),
            Leftover::Nothing => {}
        }
    }
    pods.stop(cfg.remove_pods_on_exit).await;
    drop(dns_server);
    if cfg.remove_pods_on_exit {
        pod_network.clean_up().await;
        if let Some(mut proxier) = proxier
            && let Err(error) = tokio::task::spawn_blocking(move || proxier.remove_rules()).await.unwrap_or(Ok(()))
        {
            tracing::warn!(%error, "removing the Service rules failed");
        }
        if let Some(mut policier) = policier
            && let Err(error) = tokio::task::spawn_blocking(move || policier.remove_rules()).await.unwrap_or(Ok(()))
        {
            tracing::warn!(%error, "removing the NetworkPolicy table failed");
        }
        if let Err(error) = node_local::remove(cluster_dns).await {
            tracing::warn!(%error, "removing cluster DNS's address failed");
        }
    }
    match failed {
        Some(error) => Err(error.into()),
        None => Ok(()),
    }
}

/// How long the tasks whose result the stop needs (the proxy's and policy's, for their rules)
/// may take to end.
const STOP_DEADLINE: Duration = Duration::from_secs(5);

/// What a task leaves for the agent's stop.
enum Leftover {
    Nothing,
    Proxier(Proxier),
    Policier(Policier),
}

impl From<()> for Leftover {
    fn from((): ()) -> Self {
        Leftover::Nothing
    }
}

impl From<Proxier> for Leftover {
    fn from(proxier: Proxier) -> Self {
        Leftover::Proxier(proxier)
    }
}

impl From<Policier> for Leftover {
    fn from(policier: Policier) -> Self {
        Leftover::Policier(policier)
    }
}

/// Starts the Ingress controller's listeners on the node's address (loopback without one). A
/// port already taken leaves that listener off, with a warning: the node's other work goes on.
async fn serve_ingress(
    cfg: &AgentConfig,
    routes: Arc<ingress::Routes>,
    tasks: &mut Supervisor<Leftover>,
) -> Result<(), AgentError> {
    let ip = kubelet_ip(cfg)?;
    let proxy = ingress::proxy::Proxy::new(routes);
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
        let (proxy, stop) = (proxy.clone(), tasks.stopping());
        if https {
            // Without a usable TLS configuration it logs why and ends: HTTP is still served.
            tasks.finite("Ingress HTTPS listener", proxy.serve_https(listener, stop));
        } else {
            tasks.critical("Ingress HTTP listener", proxy.serve_http(listener, stop));
        }
    }
    Ok(())
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
pub(crate) struct Registered {
    pub pod_cidr: String,
    /// The cluster Pod range (empty from control planes before it was configurable).
    pub cluster_cidr: String,
    /// The node service's clients from now on (showing the node's new client certificate).
    pub client: Servers,
    pub client_pair: Option<KeyAndCertificate>,
    pub serving: Option<KeyAndCertificate>,
    /// The cluster CA's certificate, as the control plane sent it.
    pub certificate_authority: String,
}

/// Registers until it succeeds (`None` when shut down first), with a new key's certificate
/// signing request, and keeps what it returns: the client and serving certificates, and the
/// node credential when there is one (registrations over cleartext). The call authenticates
/// with the kept client certificate if every server is HTTPS, else with the kept credential,
/// else with the join token, and falls back to the join token when refused. Calls go over
/// `shared` connections where no certificate is shown on them ([`Servers::connect`]).
pub(crate) async fn register(
    cfg: &AgentConfig,
    runtime_version: &str,
    shared: Option<&[tonic::transport::Channel]>,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<Option<Registered>, AgentError> {
    let ca = cfg.certificate_authority.as_deref();
    let files = certificate::Files::next_to(&cfg.credential_file);
    let tls_only = cfg.servers.iter().all(|s| s.starts_with("https://"));
    let mut identity = ca.filter(|_| tls_only).and_then(|ca| certificate::load_client(&files.client, ca));
    let credentials = Credentials { join_token: cfg.join_token.clone(), credential_file: cfg.credential_file.clone() };
    let token = match identity {
        Some(_) => Token::none(),
        None => Token::load(&credentials)?,
    };
    let mut client = Servers::connect(&cfg.servers, token.clone(), ca, identity.as_ref(), shared)?;
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
                        let client = Servers::connect(&cfg.servers, token, ca, client_pair.as_ref(), shared)?;
                        let certificate_authority = r.certificate_authority;
                        let (pod_cidr, cluster_cidr) = (r.pod_cidr, r.cluster_cidr);
                        let registered =
                            Registered { pod_cidr, cluster_cidr, client, client_pair, serving, certificate_authority };
                        return Ok(Some(registered));
                    }
                    Err(e) => tracing::error!(error = %e, "keeping what registration returned failed, retrying"),
                }
            }
            Err(status) if matches!(status.code(), Code::Unauthenticated | Code::PermissionDenied) => {
                // A credential or certificate from another cluster (or a rotated key): join
                // again, if we can.
                let fallback = token.fall_back_to_join(&credentials);
                if identity.take().is_some() {
                    client = Servers::connect(&cfg.servers, token.clone(), ca, None, shared)?;
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
