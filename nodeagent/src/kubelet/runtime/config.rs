//! How this node runs Pods: what the runtime manager and its translations are told.

use std::{path::PathBuf, time::Duration};

/// How this node runs pods.
#[derive(Clone, Debug)]
pub struct RuntimeConfig {
    /// The cgroupfs parent of every pod's cgroup (`<parent>/pod<uid>`), e.g. `/gitplane`.
    pub cgroup_parent: String,
    /// Container logs: `<pod_log_dir>/<namespace>_<name>_<uid>/<container>/<attempt>.log`.
    pub pod_log_dir: PathBuf,
    /// Per-pod data on the node (emptyDir volumes): `<pod_dir>/<uid>/volumes/…`.
    pub pod_dir: PathBuf,
    /// The node's address, reported as hostIP.
    pub node_ip: Option<String>,
    /// Cluster DNS servers for `dnsPolicy: ClusterFirst`; empty: the node's resolv.conf.
    pub cluster_dns: Vec<String>,
    pub cluster_domain: String,
    /// The `default/kubernetes` Service's ClusterIP, given to every container as
    /// `KUBERNETES_SERVICE_HOST`; none: no such variables.
    pub kubernetes_service: Option<std::net::Ipv4Addr>,
    /// The node's resolv.conf (`dnsPolicy: Default` and the search path's tail); unknown:
    /// the runtime copies the node's file for Pods that use it unchanged.
    pub host_dns: Option<crate::network::dns::ResolvConf>,
    /// The node's memory, for the oom_score_adj of Burstable containers (and the memory limit
    /// `resourceFieldRef` gives a container without one).
    pub node_memory_bytes: Option<u64>,
    /// The node's allocatable CPU in millicores: the CPU limit `resourceFieldRef` gives a
    /// container without one.
    pub node_cpu_milli: Option<u64>,
    /// A pull that takes longer fails with ErrImagePull rather than holding the pod.
    pub image_pull_timeout: Duration,
    /// The longest any other CRI call may take (plus the grace period for StopContainer).
    pub cri_timeout: Duration,
    /// The node's registry mirrors and credentials (`--registries`).
    pub registries: crate::kubelet::registries::Registries,
    /// Where `Localhost` seccomp profiles are read (the kubelet's `<root-dir>/seccomp`).
    pub seccomp_profile_root: PathBuf,
    /// What the node can enforce (read from the kernel when the runtime manager starts).
    pub host: crate::kubelet::admission::Host,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            cgroup_parent: "/gitplane".into(),
            pod_log_dir: PathBuf::from("/var/log/gitplane/pods"),
            pod_dir: PathBuf::from("/var/lib/gitplane/pods"),
            node_ip: None,
            cluster_dns: Vec::new(),
            cluster_domain: "cluster.local".into(),
            kubernetes_service: None,
            host_dns: None,
            node_memory_bytes: None,
            node_cpu_milli: None,
            image_pull_timeout: Duration::from_secs(60),
            cri_timeout: Duration::from_secs(120),
            registries: Default::default(),
            seccomp_profile_root: PathBuf::from("/var/lib/gitplane/seccomp"),
            host: Default::default(),
        }
    }
}
