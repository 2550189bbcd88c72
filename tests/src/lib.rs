//! gitplane's end-to-end test harness.
//!
//! Tests run on *network-namespace hosts*: the product's own [`NetnsHost`] (a network namespace
//! and a pinned mount namespace, see `gitplane_nodeagent::host`), made by `gitplane-testkit`'s
//! [`netns_host`] with a name and directory of the test's; a test starts a node's containerd in
//! one (`gitplane_testkit::node`) and sends traffic from it ([`HostExt::http_get`]). Pod
//! (10.244.0.0/16) and Service (10.96.0.0/12) traffic therefore never leaves namespaces the test
//! made. Everything is undone on drop, also when the test panics.
//!
//! [`Gitplane`] runs the real `gitplane up` inside such a host, [`LocalCluster`] (the kit's) runs
//! the real `gitplane up --nodes N` (which makes its hosts with the same code), and [`Worktree`]
//! drives a Git working copy with the real `git` command, as a user pushes.

pub mod browser;
pub mod cluster;
pub mod failover;
mod foreign_ca;
mod gitplane;
pub mod linearizability;
pub mod manifests;
pub use foreign_ca::{ForeignCa, foreign_ca};
pub use gitplane::{Gitplane, Worktree, run_printing_pod};
pub use gitplane_testkit::node::netns_host;
pub use gitplane_testkit::{HostExt, LocalCluster, NetnsHost, RunningPod, binary, http_get_in, wait_for};

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// What `command` printed, or its stderr as the error when it failed.
pub fn stdout_of(command: &mut std::process::Command) -> Result<String> {
    let out = command.output().with_context(|| format!("{command:?}"))?;
    if !out.status.success() {
        bail!("{command:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Fails unless this process can make namespaces: an end-to-end test never passes by skipping.
pub fn require_root() -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!(
            "end-to-end tests need root (network namespaces, mounts, containerd): run the README's test command as root"
        );
    }
    Ok(())
}

/// [`wait_for`] for async probes.
pub async fn wait_for_async<T, F>(timeout: Duration, mut probe: impl FnMut() -> F) -> Option<T>
where
    F: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = probe().await {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
