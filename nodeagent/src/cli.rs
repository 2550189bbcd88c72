//! The node agent's command line, shared by `gitplane-agent` and `gitplane agent` (which
//! `gitplane up --nodes` starts inside each node's namespaces).

use crate::{
    agent::{self, AgentConfig, AgentError},
    controlplane::ControlPlaneError,
    kubelet::logs::rotate::LogRotation,
    kubelet::node::{self, pressure::EvictionHard},
    kubelet::registries::{Registries, RegistriesError},
    network::cidr::Ipv4Cidr,
    network::proxy,
};
use k8s_openapi::api::core::v1::Taint;
use std::{collections::BTreeMap, path::PathBuf};

#[derive(clap::Args, Debug)]
pub struct AgentArgs {
    /// The control plane's replicas, comma-separated; the agent fails over between them.
    #[arg(long, value_delimiter = ',', default_value = "http://127.0.0.1:8080")]
    pub server: Vec<String>,
    /// This node's name; defaults to the host name.
    #[arg(long)]
    pub node_name: Option<String>,
    /// This node's address (InternalIP, the Pods' hostIP, and the gateway other nodes route
    /// this node's podCIDR through).
    #[arg(long)]
    pub node_ip: Option<String>,
    /// containerd's CRI socket.
    #[arg(long, default_value = "/run/containerd/containerd.sock")]
    pub containerd_socket: PathBuf,
    /// Where containerd reads its CNI conflist.
    #[arg(long, default_value = "/etc/gitplane/cni/net.d")]
    pub cni_conf_dir: PathBuf,
    /// Where host-local keeps its address allocations.
    #[arg(long, default_value = "/var/lib/gitplane/cni")]
    pub cni_data_dir: PathBuf,
    /// The bridge Pods attach to.
    #[arg(long, default_value = "gitplane0")]
    pub bridge: String,
    /// The cluster's Service range (the control plane's `--service-cidr`).
    #[arg(long, default_value_t = Ipv4Cidr::SERVICE_DEFAULT)]
    pub service_cidr: Ipv4Cidr,
    /// Which rules program Services (kube-proxy's --proxy-mode).
    #[arg(long, value_enum, default_value_t = proxy::Backend::Nftables)]
    pub proxy_mode: proxy::Backend,
    /// The node's resolv.conf: cluster DNS forwards names outside the cluster to its servers.
    #[arg(long, default_value = "/etc/resolv.conf")]
    pub resolv_conf: PathBuf,
    /// The cgroupfs parent of the Pods' cgroups.
    #[arg(long, default_value = "/gitplane")]
    pub cgroup_parent: String,
    /// Per-Pod data on this node (emptyDir volumes).
    #[arg(long, default_value = "/var/lib/gitplane/pods")]
    pub pod_dir: PathBuf,
    /// Where the volumes gitplane.io/local-path provisions on this node live (k3s keeps them
    /// in /var/lib/rancher/k3s/storage).
    #[arg(long, default_value = "/var/lib/gitplane/storage")]
    pub local_path_dir: PathBuf,
    /// Container logs.
    #[arg(long, default_value = "/var/log/gitplane/pods")]
    pub pod_log_dir: PathBuf,
    /// Where the `Localhost` seccomp profiles Pods name live (`localhostProfile` is relative
    /// to it, as to the kubelet's `<root-dir>/seccomp`).
    #[arg(long, default_value = "/var/lib/gitplane/seccomp")]
    pub seccomp_profile_root: PathBuf,
    /// Stop and remove every Pod of this node (and its routes) when the agent exits: all at
    /// once, each container given 2 s after SIGTERM, within 4 s.
    #[arg(long)]
    pub remove_pods_on_exit: bool,
    /// A file holding the cluster's join token (`<data-dir>/join-token` on a control-plane
    /// replica), needed until the node holds its credential.
    #[arg(long)]
    pub join_token_file: Option<PathBuf>,
    /// The cluster CA's certificate (`<data-dir>/ca.crt` on a control-plane replica), which
    /// `https://` servers are verified against.
    #[arg(long)]
    pub certificate_authority: Option<PathBuf>,
    /// Labels of the Node, `key=value,…` (a node may not set node-restriction.kubernetes.io/
    /// labels, nor kubernetes.io ones outside the kubelet's allowed list).
    #[arg(long, value_parser = node::parse_labels, default_value = "")]
    pub node_labels: BTreeMap<String, String>,
    /// Taints the Node gets when it is first registered, `key[=value]:Effect,…`.
    #[arg(long, value_parser = node::parse_taints, default_value = "")]
    pub register_with_taints: ::std::vec::Vec<Taint>,
    /// Extended resources the node advertises, `nvidia.com/gpu=1,example.com/foo=4` (whole
    /// counts, in its capacity and allocatable): Pods that request them are scheduled by count.
    /// The agent only counts them; whatever they name is the node's to provide.
    #[arg(long, value_parser = node::parse_extended_resources, default_value = "")]
    pub extended_resources: BTreeMap<String, u64>,
    /// Resources kept back for the system, `cpu=100m,memory=256Mi,ephemeral-storage=1Gi`.
    #[arg(long, default_value = "")]
    pub system_reserved: node::Reserved,
    /// Resources kept back for the node agent and the runtime, same syntax.
    #[arg(long, default_value = "")]
    pub kube_reserved: node::Reserved,
    /// Hard eviction thresholds, `memory.available<100Mi,nodefs.available<1Gi,pid.available<5%`
    /// (the defaults; a threshold may also be a percentage, `nodefs.available<10%`):
    /// a signal below its threshold sets the pressure condition (and its NoSchedule taint), and
    /// the threshold is not allocatable.
    #[arg(long, default_value = "")]
    pub eviction_hard: EvictionHard,
    /// Where the node's credential is kept (mode 0600) once it has joined over cleartext; its
    /// certificates and key are kept next to it (`kubelet-client.pem`, `kubelet-server.pem`).
    #[arg(long, default_value = "/var/lib/gitplane/node-credential")]
    pub credential_file: PathBuf,
    /// Runs this many hollow nodes instead of this node (kubemark's hollow kubelet, for scale
    /// tests): `<node-name>-1` … `<node-name>-N`, each registered with its own key and
    /// credential (kept in a directory of its name beside --credential-file), renewing its
    /// Lease and taking the Pods bound to it to Running and Ready without running them. No
    /// container runtime, network or kubelet endpoint is used.
    #[arg(long, default_value_t = 0)]
    pub hollow: usize,
    /// With --hollow: each node also holds the network and Pod config watches an agent holds
    /// (kubemark's hollow proxy), reading what they carry and dropping it.
    #[arg(long)]
    pub hollow_all_watches: bool,
    /// The port of the node's kubelet endpoint, on --node-ip (else loopback), where the
    /// control plane reads container logs (the kubelet's --port).
    #[arg(long, default_value_t = gitplane_kubelet::DEFAULT_PORT)]
    pub kubelet_port: u16,
    /// The Ingress controller's HTTP port on the node's address (0: off).
    #[arg(long, default_value_t = 80)]
    pub ingress_http_port: u16,
    /// The Ingress controller's HTTPS port on the node's address (0: off).
    #[arg(long, default_value_t = 443)]
    pub ingress_https_port: u16,
    /// A running container's log file is rotated once it reaches this size (the kubelet's
    /// containerLogMaxSize).
    #[arg(long, default_value = "10Mi", value_parser = parse_size)]
    pub container_log_max_size: u64,
    /// Log files kept per container, the current one included (the kubelet's
    /// containerLogMaxFiles).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u16).range(2..))]
    pub container_log_max_files: u16,
    /// Registry mirrors and credentials for the whole node, k3s' `registries.yaml` format
    /// (`mirrors: {docker.io: {endpoint: [...]}}`, `configs: {host: {auth: ..., tls: ...}}`).
    #[arg(long)]
    pub registries: Option<PathBuf>,
    /// containerd's `config_path` (its CRI registry setting), where the registries file's
    /// `<host>/hosts.toml` files are written.
    #[arg(long, default_value = "/etc/containerd/certs.d")]
    pub registry_config_path: PathBuf,
}

/// Reads and checks a registries file (`--registries`).
pub fn read_registries(file: &std::path::Path) -> Result<Registries, RegistriesError> {
    let name = file.display().to_string();
    let text = std::fs::read_to_string(file)
        .map_err(|e| RegistriesError { file: name.clone(), why: format!("reading it: {e}") })?;
    Registries::parse(&name, &text)
}

/// A size as a Kubernetes quantity (`10Mi`, `500k`, `1048576`).
fn parse_size(text: &str) -> Result<u64, String> {
    gitplane_api::quantity::parse_units(text)
        .and_then(|n| u64::try_from(n).ok())
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("{text:?} is not a positive size (e.g. 10Mi)"))
}

impl AgentArgs {
    /// The agent's configuration; reads the join token file.
    pub fn into_config(self) -> Result<AgentConfig, AgentError> {
        let node_name = self.node_name.unwrap_or_else(crate::kubelet::node::hostname);
        let mut cfg = AgentConfig::new(self.server, node_name, self.containerd_socket);
        cfg.node_ip = self.node_ip;
        cfg.cni_conf_dir = self.cni_conf_dir;
        cfg.cni_data_dir = self.cni_data_dir;
        cfg.bridge = self.bridge;
        cfg.service_cidr = self.service_cidr;
        cfg.proxy_backend = self.proxy_mode;
        cfg.resolv_conf = self.resolv_conf;
        cfg.runtime.cgroup_parent = self.cgroup_parent;
        cfg.node = node::NodeConfig {
            labels: self.node_labels,
            taints: self.register_with_taints,
            reserved: self.system_reserved + self.kube_reserved,
            eviction_hard: self.eviction_hard,
            nodefs: self.pod_dir.clone(),
            local_path_dir: self.local_path_dir,
            extended_resources: self.extended_resources,
        };
        cfg.runtime.pod_dir = self.pod_dir;
        cfg.runtime.pod_log_dir = self.pod_log_dir;
        cfg.runtime.seccomp_profile_root = self.seccomp_profile_root;
        cfg.remove_pods_on_exit = self.remove_pods_on_exit;
        cfg.credential_file = self.credential_file;
        cfg.kubelet_port = self.kubelet_port;
        cfg.ingress_http_port = self.ingress_http_port;
        cfg.ingress_https_port = self.ingress_https_port;
        cfg.log_rotation =
            LogRotation { max_size: self.container_log_max_size, max_files: usize::from(self.container_log_max_files) };
        if let Some(file) = self.registries {
            cfg.runtime.registries = read_registries(&file)?;
            cfg.registry_config_path = Some(self.registry_config_path);
        }
        if let Some(file) = self.certificate_authority {
            let pem = std::fs::read_to_string(&file).map_err(|e| AgentError::BadCertificateAuthority {
                file: file.clone(),
                why: format!("reading it: {e}"),
            })?;
            if !pem.contains("-----BEGIN CERTIFICATE-----") {
                let why = "it holds no PEM certificate".to_owned();
                return Err(AgentError::BadCertificateAuthority { file, why });
            }
            cfg.certificate_authority = Some(pem);
        }
        if let Some(file) = self.join_token_file {
            let token = std::fs::read_to_string(&file)
                .map_err(|e| ControlPlaneError::BadToken { file: file.clone(), why: format!("reading it: {e}") })?;
            cfg.join_token = Some(token.trim().to_owned());
        }
        Ok(cfg)
    }
}

/// Runs the agent until SIGTERM or SIGINT.
pub async fn run(args: AgentArgs) -> Result<(), AgentError> {
    let (hollow, all_watches) = (args.hollow, args.hollow_all_watches);
    let cfg = args.into_config()?;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        stop_signal().await;
        let _ = stop.send(true);
    });
    if hollow > 0 {
        return crate::hollow::run(cfg, hollow, all_watches, stopped).await;
    }
    agent::run(cfg, stopped).await
}

/// SIGTERM or SIGINT.
pub async fn stop_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        return std::future::pending().await;
    };
    tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
}
