//! `gitplane up --nodes N` for the benchmarks that need whole nodes (`services`, `idle`), the
//! kit's [`LocalCluster`] as the end-to-end tests start it, and the git commands that push to its
//! repositories.

use crate::procs;
use anyhow::{Context as _, Result, bail, ensure};
use gitplane_testkit::{self as kit, LocalCluster, http_get_async, up::DEADLINE};
use serde_json::Value;
use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

/// The entry point of a benchmark on `gitplane up --nodes`: checks root and the `gitplane`
/// binary (`arg`, or the one next to this binary), then runs `bench` on a runtime. Ctrl-C and
/// SIGTERM drop the running bench, and with it its guards: `gitplane up` is stopped and every
/// helper process killed.
pub(crate) fn main<F, Fut>(arg: Option<&Path>, bench: F) -> Result<()>
where
    F: FnOnce(PathBuf) -> Fut,
    Fut: Future<Output = Result<()>>,
{
    // SAFETY: geteuid has no preconditions.
    ensure!(unsafe { libc::geteuid() } == 0, "gitplane up --nodes needs root (namespaces, containerd)");
    let gitplane = procs::prepare(arg, None)?;
    ensure!(gitplane.exists(), "no gitplane binary at {}: build it or pass --gitplane", gitplane.display());
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(async {
        let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            result = bench(gitplane) => result,
            _ = tokio::signal::ctrl_c() => bail!("interrupted"),
            _ = terminate.recv() => bail!("terminated"),
        }
    })
}

/// `gitplane up --nodes N` of the kit, started from the bench's main thread so that a bench
/// killed with SIGKILL still stops it; its status API read on the runtime.
pub(crate) struct Up(LocalCluster);

impl std::ops::Deref for Up {
    type Target = LocalCluster;

    fn deref(&self) -> &LocalCluster {
        &self.0
    }
}

impl Up {
    pub(crate) async fn start(binary: &Path, count: u16) -> Result<Up> {
        let base = format!("gpb{}", std::process::id());
        let mut up = Up(kit::UpCommand::new(binary.to_owned(), base, count, "bench").die_with_parent().spawn()?);
        let deadline = Instant::now() + DEADLINE;
        loop {
            match up.0.started() {
                Ok(true) => return Ok(up),
                Ok(false) => {}
                Err(e) => bail!("{e}:\n{}", up.log_tail()),
            }
            if Instant::now() >= deadline {
                bail!("{count} nodes were not Ready within {DEADLINE:?}:\n{}", up.log_tail());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub(crate) async fn get(&self, path: &str) -> Result<Value> {
        Ok(serde_json::from_str(&http_get_async(self.listen, path, None, procs::GET_TIMEOUT).await?)?)
    }

    /// SIGTERM (as Ctrl-C would), then waits for it to stop.
    pub(crate) async fn stop(mut self) -> Result<std::process::ExitStatus> {
        self.0.terminate();
        let deadline = Instant::now() + DEADLINE;
        while Instant::now() < deadline {
            if let Some(status) = self.0.try_wait()? {
                return Ok(status);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!("gitplane up --nodes did not stop within {DEADLINE:?} of SIGTERM:\n{}", self.log_tail())
    }
}

/// Runs a git command to completion.
pub(crate) async fn git(command: &mut tokio::process::Command) -> Result<()> {
    let output = command.output().await.context("running git")?;
    ensure!(output.status.success(), "{command:?}: {}", String::from_utf8_lossy(&output.stderr));
    Ok(())
}

/// `git -C work` with a committer of its own and no prompts.
pub(crate) fn git_in(work: &Path) -> tokio::process::Command {
    let mut command = tokio::process::Command::new("git");
    command.arg("-C").arg(work).env("GIT_TERMINAL_PROMPT", "0");
    for var in ["GIT_AUTHOR_NAME", "GIT_COMMITTER_NAME"] {
        command.env(var, "gitplane-bench");
    }
    for var in ["GIT_AUTHOR_EMAIL", "GIT_COMMITTER_EMAIL"] {
        command.env(var, "bench@localhost");
    }
    command
}

pub(crate) fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}
