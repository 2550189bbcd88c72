//! gitplane's end-to-end test harness.
//!
//! Tests run on *network-namespace hosts*: the product's own [`NetnsHost`] (a network namespace
//! and a pinned mount namespace, see `gitplane_nodeagent::host`), made here by [`netns_host`] with
//! a name and directory of the test's; a test starts a node's containerd in one (see
//! [`NetnsHost::launcher`]) and sends traffic from it ([`HostExt::http_get`]). Pod
//! (10.244.0.0/16) and Service (10.96.0.0/12) traffic therefore never leaves namespaces the test
//! made. Everything is undone on drop, also when the test panics.
//!
//! [`Gitplane`] runs the real `gitplane up` inside such a host, [`LocalCluster`] runs the real
//! `gitplane up --nodes N` (which makes its hosts with the same code), and [`Worktree`] drives a
//! Git working copy with the real `git` command, as a user pushes.

pub mod browser;
pub mod cluster;
pub mod failover;
mod foreign_ca;
mod gitplane;
pub mod linearizability;
pub mod manifests;
mod nodes;
pub use foreign_ca::{ForeignCa, foreign_ca};
pub use gitplane::{Gitplane, Worktree, binary};
pub use gitplane_nodeagent::host::NetnsHost;
pub use nodes::{LocalCluster, RunningPod};

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
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

/// Polls `probe` every 20 ms until it returns `Some`, or `timeout` passes (then `None`).
pub fn wait_for<T>(timeout: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = probe() {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
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

static HOSTS_MADE: AtomicU32 = AtomicU32::new(0);

/// A host for one test: named `<prefix><pid>x<n>` (at most 15 characters), in a directory under
/// the temp dir, its Pods' cgroups under `/gitplane-e2e-<name>`.
pub fn netns_host(prefix: &str) -> Result<NetnsHost> {
    let suffix = format!("{}x{}", std::process::id(), HOSTS_MADE.fetch_add(1, Ordering::Relaxed));
    let keep = 15usize.saturating_sub(suffix.len()).min(prefix.len());
    let name = format!("{}{suffix}", &prefix[..keep]);
    let dir = std::env::temp_dir().join("gitplane-e2e").join(&name);
    let cgroup_parent = format!("/gitplane-e2e-{name}");
    NetnsHost::create(&name, dir, cgroup_parent).with_context(|| format!("creating network-namespace host {name}"))
}

/// What tests do from inside a host.
pub trait HostExt {
    /// `GET path` over HTTP/1.0 from inside the host; the body of a 2xx answer.
    fn http_get(&self, addr: SocketAddr, path: &str, timeout: Duration) -> Result<String>;
}

impl HostExt for NetnsHost {
    fn http_get(&self, addr: SocketAddr, path: &str, timeout: Duration) -> Result<String> {
        http_get_in(&self.netns_path(), addr, path, timeout)
    }
}

/// `GET path` over HTTP/1.0 from inside the network namespace at `netns`.
pub fn http_get_in(netns: &Path, addr: SocketAddr, path: &str, timeout: Duration) -> Result<String> {
    let response = gitplane_kubelet::netns::in_netns(netns, || {
        let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n")?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response)?;
        Ok(response)
    })
    .with_context(|| format!("GET http://{addr}{path} from {}", netns.display()))?;
    let response = String::from_utf8_lossy(&response);
    // A CGI's own headers (busybox httpd passes them on) may end in a bare "\n\n".
    let (head, body) =
        response.split_once("\r\n\r\n").or_else(|| response.split_once("\n\n")).unwrap_or((&response, ""));
    let status = head.lines().next().unwrap_or("");
    if !status.split(' ').nth(1).is_some_and(|code| code.starts_with('2')) {
        bail!("GET http://{addr}{path}: {status:?}");
    }
    Ok(body.to_string())
}
