//! `nft monitor` in the network namespace of each node of `gitplane up --nodes`: the moment a
//! node's nftables transaction commits, as the kernel reports it.

use anyhow::{Context as _, Result};
use std::{
    io::BufRead as _,
    os::unix::process::CommandExt as _,
    process::{Command, Stdio},
    time::{Duration, Instant},
};
use tokio::sync::mpsc;

/// Each monitor's lines: (node index, when it arrived, the line).
pub(crate) type Lines = mpsc::UnboundedReceiver<(usize, Instant, String)>;

/// An `nft monitor` in each node's network namespace. A thread per monitor reads its
/// lines and stamps each as it arrives (nft flushes every event as the kernel reports the
/// commit).
pub(crate) struct Monitors {
    children: Vec<std::process::Child>,
}

impl Monitors {
    /// Starts `nft monitor <what>` (e.g. "new elements") in each node's namespace.
    pub(crate) fn start(nodes: &[String], what: &str) -> Result<(Monitors, Lines)> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut monitors = Monitors { children: Vec::new() };
        for (index, node) in nodes.iter().enumerate() {
            let mut command = Command::new("ip");
            command
                .args(["netns", "exec", node, "nft", "monitor"])
                .args(what.split_whitespace())
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::null());
            // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
            unsafe {
                command.pre_exec(|| {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
            let mut child = command.spawn().context("starting nft monitor")?;
            let stdout = child.stdout.take().context("nft monitor's stdout")?;
            monitors.children.push(child);
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in std::io::BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    if tx.send((index, Instant::now(), line)).is_err() {
                        break;
                    }
                }
            });
        }
        Ok((monitors, rx))
    }

    pub(crate) fn all_running(&mut self) -> bool {
        self.children.iter_mut().all(|c| matches!(c.try_wait(), Ok(None)))
    }
}

impl Drop for Monitors {
    fn drop(&mut self) {
        for child in &mut self.children {
            // `ip netns exec` execs nft: this PID is nft's, our own child, not yet reaped.
            // SAFETY: kill(2) has no memory-safety preconditions.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            let _ = child.wait();
        }
    }
}

/// For each of `nodes` monitors, the time from `since` to its first line that `matches`;
/// `None` for a node that had shown none by `timeout`.
pub(crate) async fn wait(
    lines: &mut Lines,
    nodes: usize,
    since: Instant,
    timeout: Duration,
    matches: impl Fn(&str) -> bool,
) -> Vec<Option<Duration>> {
    let mut seen = vec![None; nodes];
    let deadline = tokio::time::Instant::from_std(since + timeout);
    while seen.iter().any(Option::is_none) {
        match tokio::time::timeout_at(deadline, lines.recv()).await {
            Ok(Some((node, at, line))) => {
                if seen[node].is_none() && matches(&line) {
                    seen[node] = Some(at.saturating_duration_since(since));
                }
            }
            Ok(None) | Err(_) => break,
        }
    }
    seen
}
