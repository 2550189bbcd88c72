//! `gitplane up`: the embedded appliance in one process.
//!
//! A control plane of one replica (Raft over SQLite; source, scheduler, controllers, status API,
//! node service and store service on one listener), one in-process node agent, and, unless
//! `--containerd-socket` names one, a containerd of its own configured from `templates/`, which
//! is started again if it exits (Pods outlive it). Ctrl-C (or SIGTERM) stops the agent first,
//! which removes every Pod it runs, then containerd, then the control plane.
//!
//! With `--nodes N` the control plane is the same, and the nodes are N network-namespace hosts
//! on a bridge, each with its own containerd and agent process (`crate::nodes`).

use crate::{
    backend::Backend,
    controlplane,
    credentials::{Credentials, Sources},
    nodes,
    replica::{GitServing, Replica, ReplicaTls, ServiceAccountTokens},
    security::{self, Security},
};
use anyhow::{Context as _, bail};
use gitplane_controllers::loadbalancer::AddressPool;
use gitplane_gitops::{bootstrap, source::allocate::ServiceRanges};
use gitplane_nodeagent::{
    agent::{self, AgentConfig},
    cli::stop_signal,
    kubelet::containerd::{Containerd, ContainerdConfig},
    kubelet::cri::Cri,
    kubelet::images,
    kubelet::logs::rotate::LogRotation,
    kubelet::node::hostname,
    kubelet::registries::Registries,
    kubelet::runtime::RuntimeConfig,
    network::cidr::Ipv4Cidr,
    network::proxy,
};
use gitplane_storage::{raft::ReplicaConfig, remote::PeerToken};
use gitplane_store::Store;
use std::{collections::BTreeMap, net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

#[derive(clap::Args)]
pub struct UpArgs {
    /// Where the store, containerd and the pods' files live.
    #[arg(long, default_value = "/var/lib/gitplane")]
    data_dir: PathBuf,
    /// Where the hosted bare repositories live (the `git push` targets).
    #[arg(long, default_value = "repos")]
    repos_dir: PathBuf,
    /// The status API and node service address.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Use this running containerd instead of starting one.
    #[arg(long)]
    containerd_socket: Option<PathBuf>,
    /// The node's name; defaults to the host name. With `--nodes`, the nodes are named
    /// `<node-name>-1` … `<node-name>-N`.
    #[arg(long)]
    node_name: Option<String>,
    /// Run N nodes on this machine, like kind with real network namespaces: node `<name>-i` is a
    /// network namespace of that name (and a mount namespace) wired to a bridge in namespace
    /// `<name>-net`, at 172.29.0.(10+i), with its own containerd and agent; the control plane
    /// stays here and also listens on the bridge's 172.29.0.1. Nodes' files: `<data-dir>/nodes/`.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=100), conflicts_with = "containerd_socket")]
    nodes: Option<u16>,
    /// The cgroupfs parent of the pods' cgroups (with `--nodes`: of each node's, by name).
    #[arg(long, default_value = "/gitplane")]
    cgroup_parent: String,
    /// A file holding the shared secret of webhooks from Git hosts (none: webhooks are refused).
    #[arg(long)]
    webhook_secret_file: Option<PathBuf>,
    /// The range Services get their ClusterIPs from; the tenth address is cluster DNS's.
    #[arg(long, default_value_t = Ipv4Cidr::SERVICE_DEFAULT)]
    service_cidr: Ipv4Cidr,
    /// Which rules program Services on the nodes (kube-proxy's --proxy-mode).
    #[arg(long, value_enum, default_value_t = proxy::Backend::Nftables)]
    proxy_mode: proxy::Backend,
    #[command(flatten)]
    controllers: crate::controlplane::ControllerArgs,
    /// The longest a ServiceAccount token the nodes ask for lives (kube-apiserver's flag of this
    /// name), e.g. 1h; tests shorten it to watch tokens rotate. None: as long as asked.
    #[arg(long, value_parser = crate::events::parse_ttl)]
    service_account_max_token_expiration: Option<Duration>,
    /// The addresses Services may list in `spec.externalIPs`, e.g. 198.51.100.0/28. None: every
    /// external IP is refused (Kubernetes' DenyServiceExternalIPs), as any node's own traffic
    /// to such an address would go to the Service's Pods.
    #[arg(long, value_parser = AddressPool::parse)]
    external_ip_pool: Option<AddressPool>,
    /// Let Applications name `file://` repositories on this machine (tests, single-user
    /// machines): whoever writes Applications could then read any repository here.
    #[arg(long)]
    allow_file_urls: bool,
    /// How long an Event is kept after its last occurrence (kube-apiserver's --event-ttl).
    #[arg(long, default_value = "1h", value_parser = crate::events::parse_ttl)]
    event_ttl: Duration,
    /// An extra flag for every node's agent (repeat it), e.g.
    /// `--agent-arg=--register-with-taints=dedicated=db:NoSchedule`; see `gitplane agent --help`.
    #[arg(long = "agent-arg", allow_hyphen_values = true, requires = "nodes")]
    agent_args: Vec<String>,
    /// The port of each node's kubelet endpoint (container logs), on the node's address (on
    /// 127.0.0.1 for the embedded node).
    #[arg(long, default_value_t = gitplane_kubelet::DEFAULT_PORT)]
    kubelet_port: u16,
    /// A running container's log file is rotated at this size (`gitplane agent
    /// --container-log-max-size`).
    #[arg(long, default_value = "10Mi")]
    container_log_max_size: String,
    /// Log files kept per container, the current one included.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u16).range(2..))]
    container_log_max_files: u16,
    /// The status API's bearer tokens, `token,user,uid,"role,…"` per line (roles: read, debug).
    /// Default: `<data-dir>/tokens.csv`, made on first start with one read token (written into
    /// `<data-dir>/kubeconfig`). Reads from loopback need none.
    #[arg(long)]
    tokens_file: Option<PathBuf>,
    /// Registry mirrors and credentials for every node, k3s' `registries.yaml` format
    /// (`mirrors: {docker.io: {endpoint: ["http://..."]}}`, `configs: {host: {auth: ..., tls:
    /// ...}}`, `"*"` for every registry); see `gitplane agent --registries`.
    #[arg(long)]
    registries: Option<PathBuf>,
}

pub async fn up(args: UpArgs) -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("gitplane up runs containers and programs networking: run it as root (sudo)");
    }
    let data_dir = absolute(&args.data_dir)?;
    // Checked before anything starts: a typo in it is better told now than by every node.
    let registries = match &args.registries {
        Some(file) => Some((absolute(file)?, gitplane_nodeagent::cli::read_registries(file)?)),
        None => None,
    };
    gitplane_gitops::bootstrap::private_dir(&data_dir)?;
    let demo_repo = bootstrap::demo_repo(&args.repos_dir)?;
    let bootstrap_repo = bootstrap::bootstrap_repo(&args.repos_dir)?;
    let repos_dir = demo_repo.parent().map(PathBuf::from).unwrap_or_default();

    // The embedded default is a cluster of one replica.
    let credentials = Credentials::load(Sources {
        data_dir: &data_dir,
        peer_token_file: None,
        join_token_file: None,
        makes_cluster_secrets: true,
    })?;
    let security = Security::load(&data_dir, &credentials, args.tokens_file.as_deref(), true)?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listening on {}: is another gitplane running? pass --listen", args.listen))?;
    let port = listener.local_addr().context("the listener's address")?.port();
    let names = security::serving_names(args.listen, &[nodes::GATEWAY.to_string()]);
    let mut ranges = ServiceRanges::with_cidr(&args.service_cidr.to_string()).map_err(anyhow::Error::msg)?;
    ranges.external_ips = args.external_ip_pool;
    ranges.pods = args.controllers.pod_ranges(&ranges)?;
    let certificate =
        security.ca.replica_certificate(&[&names[..], &controlplane::kubernetes_service_names(&ranges)].concat())?;
    let mut listeners = vec![security.listener(listener, &certificate)?];
    let node_base = args.node_name.clone().unwrap_or_else(hostname);
    let node_network = match args.nodes {
        Some(count) => {
            let network = nodes::create_network(&node_base, &data_dir, &args.cgroup_parent, count).await?;
            let bridge = tokio::net::TcpListener::from_std(network.0.listen(port)?)?;
            listeners.push(security.listener(bridge, &certificate)?);
            Some(network)
        }
        None => None,
    };
    let peers = BTreeMap::from([(1, args.listen.to_string())]);
    let (chain, key) = certificate.pem();
    let peer_token = PeerToken::new(&credentials.peer_token)
        .context("the peer token")?
        .with_ca(&security.ca.pem())
        .with_identity(&chain, &key);
    let mut config = ReplicaConfig::new(1, peers, data_dir.join("store"), peer_token);
    config.secrets = crate::encryption::load_keys(&data_dir, None, true)?;
    let git = GitServing::load(&data_dir, repos_dir, args.webhook_secret_file.as_deref(), args.allow_file_urls)?;
    let api_url = security::url(args.listen);
    let repo_url = format!(
        "{}://git:$(cat {})@{}/git/demo.git",
        api_url.split_once("://").map_or("http", |(scheme, _)| scheme),
        data_dir.join("git-token").display(),
        api_url.split_once("://").map_or(api_url.as_str(), |(_, addr)| addr),
    );
    let mut controllers = args.controllers.settings()?;
    controllers.controllers.root_ca = Some(security.ca.pem());
    // Pods reach the control plane where the nodes do: the bridge's gateway with --nodes, else
    // the listener's address (the embedded node's Pods cannot reach its loopback).
    let reached = if args.nodes.is_some() { SocketAddr::from((nodes::GATEWAY, port)) } else { args.listen };
    controllers.controllers.api_endpoints = controlplane::api_endpoints(&ranges, &[reached]);
    let backend = Backend::raft(config).await?;
    let nodes_netns = node_network.as_ref().map(|(n, _)| n.netns_path());
    let access = security.access.clone();
    let replica = Replica::start(
        backend,
        listeners,
        access,
        &credentials,
        ReplicaTls { ca: security.ca.clone(), certificate },
        git,
        repo_url.clone(),
        ranges,
        controllers,
        args.event_ttl,
        nodes_netns,
        names.iter().filter_map(|n| n.parse().ok()).collect(),
        ServiceAccountTokens {
            key: crate::credentials::service_account_key(&data_dir)?,
            max_expiration: args.service_account_max_token_expiration,
        },
    )
    .await?;
    let kubeconfig = security.write_kubeconfig(args.listen)?;
    let banner = banner(&repo_url, &api_url, kubeconfig.as_deref(), &bootstrap_repo);
    if !replica.wait_for_leader(Duration::from_secs(30)).await {
        bail!("the store elected no leader within 30 s");
    }
    let store: Arc<dyn Store> = replica.backend.store();
    bootstrap::root_application(&store, bootstrap::BOOTSTRAP).await.context("creating the root Application")?;

    if let (Some(count), Some((network, survivors))) = (args.nodes, node_network) {
        let cfg = nodes::NodesConfig {
            count,
            base: node_base,
            data_dir: data_dir.clone(),
            cgroup_parent: args.cgroup_parent.clone(),
            port,
            service_cidr: args.service_cidr,
            proxy_mode: args.proxy_mode,
            agent_args: args.agent_args.clone(),
            kubelet_port: args.kubelet_port,
            container_log_max_size: args.container_log_max_size.clone(),
            container_log_max_files: args.container_log_max_files,
            registries: registries.map(|(file, _)| file),
        };
        let result = nodes::run(cfg, network, survivors, banner, stop_signal()).await;
        replica.shutdown().await;
        return result;
    }

    let own_containerd = ContainerdConfig::new(data_dir.join("containerd"));
    let registries = registries.map(|(_, registries)| {
        // Another containerd's config_path is its own business: containerd's usual place.
        let dir = match &args.containerd_socket {
            Some(_) => PathBuf::from("/etc/containerd/certs.d"),
            None => own_containerd.registry_config_path(),
        };
        (dir, registries)
    });
    let (runtime, supervising) = match &args.containerd_socket {
        Some(socket) => ((socket.clone(), data_dir.join("cni/net.d")), None),
        None => {
            let cfg = own_containerd;
            let containerd = Containerd::start(cfg).await.context("starting containerd")?;
            let runtime = (containerd.socket(), containerd.config().cni_conf_dir.clone());
            let (stop, stopped) = tokio::sync::watch::channel(false);
            (runtime, Some((stop, tokio::spawn(containerd.supervise(stopped)))))
        }
    };
    let agent = AgentAccess { url: api_url, join_token: credentials.join_token.clone(), ca: security.ca.pem() };
    let result = run_node(&args, &data_dir, runtime, registries, agent, &banner).await;
    if let Some((stop, supervisor)) = supervising {
        let _ = stop.send(true);
        if let Ok(Some(containerd)) = supervisor.await
            && let Err(e) = containerd.stop().await
        {
            tracing::warn!(error = %e, "stopping containerd");
        }
    }
    replica.shutdown().await;
    result
}

/// How the embedded agent reaches the control plane.
struct AgentAccess {
    url: String,
    join_token: String,
    ca: String,
}

/// Images, the node agent, the banner, and the wait for a stop signal; `runtime` is the node's
/// containerd socket and CNI configuration directory.
async fn run_node(
    args: &UpArgs,
    data_dir: &std::path::Path,
    (socket, cni_conf_dir): (PathBuf, PathBuf),
    registries: Option<(PathBuf, Registries)>,
    access: AgentAccess,
    banner: &str,
) -> anyhow::Result<()> {
    let cri =
        Cri::connect(&socket).await.with_context(|| format!("connecting to containerd at {}", socket.display()))?;
    let imported = images::ensure_images(&cri, &socket, &data_dir.join("images")).await?;
    if !imported.is_empty() {
        tracing::info!(?imported, "imported images");
    }

    let node_name = args.node_name.clone().unwrap_or_else(hostname);
    let mut cfg = AgentConfig::new(vec![access.url], node_name, socket);
    cfg.service_cidr = args.service_cidr;
    cfg.proxy_backend = args.proxy_mode;
    cfg.cni_conf_dir = cni_conf_dir;
    cfg.cni_data_dir = data_dir.join("cni/ipam");
    cfg.remove_pods_on_exit = true;
    cfg.join_token = Some(access.join_token);
    cfg.certificate_authority = Some(access.ca);
    cfg.credential_file = data_dir.join("node-credential");
    cfg.kubelet_port = args.kubelet_port;
    cfg.log_rotation = LogRotation {
        max_size: gitplane_api::quantity::parse_units(&args.container_log_max_size)
            .and_then(|n| u64::try_from(n).ok())
            .filter(|n| *n > 0)
            .with_context(|| {
                format!("--container-log-max-size {:?} is not a size (e.g. 10Mi)", args.container_log_max_size)
            })?,
        max_files: usize::from(args.container_log_max_files),
    };
    cfg.runtime = RuntimeConfig {
        cgroup_parent: args.cgroup_parent.clone(),
        pod_log_dir: data_dir.join("pods/logs"),
        pod_dir: data_dir.join("pods"),
        seccomp_profile_root: data_dir.join("seccomp"),
        ..RuntimeConfig::default()
    };
    cfg.node.nodefs = data_dir.join("pods");
    cfg.node.local_path_dir = data_dir.join("storage");
    if let Some((dir, registries)) = registries {
        cfg.registry_config_path = Some(dir);
        cfg.runtime.registries = registries;
    }
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut agent = tokio::spawn(agent::run(cfg, stopped));

    println!("{banner}");

    tokio::select! {
        _ = stop_signal() => tracing::info!("stopping: removing pods"),
        result = &mut agent => {
            return match result {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(e).context("the node agent stopped"),
                Err(e) => Err(e).context("the node agent panicked"),
            };
        }
    }
    let _ = stop.send(true);
    match agent.await {
        Ok(result) => result.context("the node agent stopped with an error"),
        Err(e) => Err(e).context("the node agent panicked"),
    }
}

/// Where to push and where to look.
fn banner(repo_url: &str, url: &str, kubeconfig: Option<&std::path::Path>, bootstrap_repo: &std::path::Path) -> String {
    let kubeconfig = kubeconfig.map_or_else(String::new, |path| {
        format!("\n  kubeconfig: {path} (a read token: kubectl --kubeconfig {path} get pods)", path = path.display())
    });
    format!(
        "gitplane is up.\n  \
         clone:  git clone {repo_url} && cd demo   (edit, commit, then: git push)\n  \
         apps:   the Applications live in {url}/git/bootstrap.git ({apps}; app-of-apps)\n  \
         look:   kubectl --server {url} get pods   (or curl {url}/api/v1/pods)\n  \
         status: kubectl --server {url} get applications -n gitplane-system -o yaml{kubeconfig}\n\
         Ctrl-C stops gitplane and removes its pods.",
        apps = bootstrap_repo.display(),
    )
}

fn absolute(path: &std::path::Path) -> anyhow::Result<PathBuf> {
    Ok(if path.is_absolute() { path.to_path_buf() } else { std::env::current_dir()?.join(path) })
}
