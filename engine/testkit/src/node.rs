//! A node host: a [`NetnsHost`] with a containerd of its own, as `gitplane up --nodes` makes each
//! node and the end-to-end tests and benchmarks make theirs (one code path for all of them).

use crate::NetnsHost;
use anyhow::{Context as _, Result};
use gitplane_nodeagent::{
    kubelet::containerd::{Containerd, ContainerdConfig},
    kubelet::cri::Cri,
    kubelet::images,
};
use std::net::Ipv4Addr;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};

/// The address of the bridge `gitplane up --nodes` wires its nodes to, in the bridge's own
/// namespace (`<base>-net`): where the nodes reach the control plane, and a test's registry.
pub const GATEWAY: Ipv4Addr = Ipv4Addr::new(172, 29, 0, 1);

static NAMES_MADE: AtomicU32 = AtomicU32::new(0);

/// A name no other host or cluster of this process (nor of another run) has: `<prefix><pid>x<n>`,
/// cut to at most 15 characters (a network interface's limit) by shortening `prefix`.
pub fn unique_name(prefix: &str) -> String {
    let suffix = format!("{}x{}", std::process::id(), NAMES_MADE.fetch_add(1, Ordering::Relaxed));
    let keep = 15usize.saturating_sub(suffix.len()).min(prefix.len());
    format!("{}{suffix}", &prefix[..keep])
}

/// A host for one test: named [`unique_name`]`(prefix)`, in a directory under the temp dir, its
/// Pods' cgroups under `/gitplane-e2e-<name>`.
pub fn netns_host(prefix: &str) -> Result<NetnsHost> {
    let name = unique_name(prefix);
    let dir = std::env::temp_dir().join("gitplane-e2e").join(&name);
    let cgroup_parent = format!("/gitplane-e2e-{name}");
    NetnsHost::create(&name, dir, cgroup_parent).with_context(|| format!("creating network-namespace host {name}"))
}

/// The containerd of a node whose files are in `node_dir`, run inside `host`: its state in
/// `node_dir/containerd`, the CNI configuration it reads in `node_dir/cni/net.d`.
pub fn containerd_config(host: &NetnsHost, node_dir: &Path) -> ContainerdConfig {
    let mut config = ContainerdConfig::new(node_dir.join("containerd"));
    config.launcher = host.launcher();
    config.cni_conf_dir = node_dir.join("cni/net.d");
    config
}

/// Starts node `name`'s containerd and makes sure it has the Pods' images (built once into
/// `images`); the running containerd and a CRI client of it.
pub async fn start_containerd(name: &str, config: ContainerdConfig, images: &Path) -> Result<(Containerd, Cri)> {
    let containerd = Containerd::start(config).await.with_context(|| format!("starting {name}'s containerd"))?;
    let socket = containerd.socket();
    let cri = Cri::connect(&socket).await.with_context(|| format!("connecting to {name}'s containerd"))?;
    images::ensure_images(&cri, &socket, images).await?;
    Ok((containerd, cri))
}

/// Removes a cluster's cgroup parent from every hierarchy once nothing is left in it.
pub fn remove_cgroup(cgroup_parent: &str) {
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else { return };
    for hierarchy in hierarchies.flatten() {
        let _ = std::fs::remove_dir(hierarchy.path().join(cgroup_parent.trim_start_matches('/')));
    }
}
