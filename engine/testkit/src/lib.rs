//! The one place that launches local clusters, for the end-to-end tests, the benchmarks and
//! `gitplane up --nodes`.
//!
//! - [`node`]: a node host, a [`NetnsHost`] (network namespace and pinned mount namespace) with
//!   a containerd of its own, as `gitplane up --nodes` makes each node and tests make theirs.
//! - [`LocalCluster`]: the real `gitplane up --nodes N` as a child process, killed or stopped
//!   and started again, its nodes' processes and runtimes looked at, what a stop leaves checked.
//! - [`replica`]: the command line of a `gitplane server` replica on loopback.
//! - [`registry`]: a real image registry on a cluster's bridge, holding stand-ins of published
//!   images built from the host's busybox.
//! - [`topology`]: bare namespaces on a bridge (no containerd) for the proxy's tests and benches.
//! - [`http`]: a free loopback port and a minimal HTTP/1.0 GET, from here or from a namespace.
//!
//! Pod and Service traffic never leaves namespaces made here; everything is undone on drop.

pub mod http;
pub mod node;
pub mod registry;
pub mod replica;
pub mod topology;
pub mod up;

pub use gitplane_nodeagent::host::NetnsHost;
pub use http::{HostExt, free_port, http_get, http_get_async, http_get_in};
pub use up::{LocalCluster, RunningPod, UpCommand};

use anyhow::{Context as _, Result, bail};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A binary of this workspace, built next to the test executables (`cargo build --bins`).
pub fn binary(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    // target/<profile>/deps/<test> -> target/<profile>/<name>
    let dir = exe.parent().and_then(Path::parent).context("test executable has no target directory")?;
    let path = dir.join(name);
    if !path.exists() {
        bail!("{} is missing: build the binaries first (cargo build --workspace --bins)", path.display());
    }
    Ok(path)
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
