//! `gitplane up --nodes N` for the benchmarks that need whole nodes (`services`, `idle`), started
//! as `tests/src/nodes.rs` starts it, and the git commands that push to its repositories.

use crate::procs;
use anyhow::{Context as _, Result, bail, ensure};
use gitplane_nodeagent::host::{NetnsHost, remove_netns};
use serde_json::Value;
use std::{
    net::SocketAddr,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
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

/// How long starting and stopping may take.
const DEADLINE: Duration = Duration::from_secs(180);

/// `gitplane up --nodes N`, as `tests/src/nodes.rs` starts it: SIGTERM and a wait when dropped,
/// then the product's own code removes whatever a killed one left.
pub(crate) struct Up {
    pub(crate) child: Option<std::process::Child>,
    pub(crate) nodes: Vec<String>,
    pub(crate) base: String,
    pub(crate) listen: SocketAddr,
    pub(crate) data_dir: PathBuf,
    pub(crate) repos_dir: PathBuf,
    pub(crate) log: PathBuf,
    pub(crate) cgroup_parent: String,
    /// Holds the data, the repositories and the log; removed last.
    pub(crate) dir: tempfile::TempDir,
}

impl Up {
    pub(crate) async fn start(binary: &Path, count: u16) -> Result<Up> {
        let base = format!("gpb{}", std::process::id());
        let dir = tempfile::Builder::new().prefix("gitplane-bench-services-").tempdir()?;
        let (data_dir, repos_dir, log) = (dir.path().join("data"), dir.path().join("repos"), dir.path().join("up.log"));
        let listen = procs::free_addr()?;
        let cgroup_parent = format!("/gitplane-bench-{base}");
        let out = std::fs::File::create(&log)?;
        let mut command = Command::new(binary);
        command
            .arg("up")
            .arg(format!("--nodes={count}"))
            .arg(format!("--node-name={base}"))
            .arg(format!("--listen={listen}"))
            .arg(format!("--cgroup-parent={cgroup_parent}"))
            .arg("--data-dir")
            .arg(&data_dir)
            .arg("--repos-dir")
            .arg(&repos_dir)
            .env("RUST_LOG", "info,sqlx=warn,h2=warn,tower=warn")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            // Not in the terminal's group: Ctrl-C reaches the bench, whose guard stops it.
            .process_group(0);
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec. SIGTERM,
        // not SIGKILL: a killed bench still lets gitplane up remove its namespaces.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command.spawn().context("starting gitplane up --nodes")?;
        let nodes = (1..=count).map(|i| format!("{base}-{i}")).collect();
        let mut up = Up { child: Some(child), nodes, base, listen, data_dir, repos_dir, log, cgroup_parent, dir };
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Some(Ok(Some(status))) = up.child.as_mut().map(std::process::Child::try_wait) {
                bail!("gitplane up --nodes exited with {status}:\n{}", up.log_tail());
            }
            if up.ready_nodes().await.is_ok_and(|n| n == count as usize) {
                return Ok(up);
            }
            if Instant::now() >= deadline {
                bail!("{count} nodes were not Ready within {DEADLINE:?}:\n{}", up.log_tail());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub(crate) async fn get(&self, path: &str) -> Result<Value> {
        Ok(serde_json::from_str(&procs::http_get(self.listen, path).await?)?)
    }

    pub(crate) async fn ready_nodes(&self) -> Result<usize> {
        let list = self.get("/api/v1/nodes").await?;
        let items = list["items"].as_array().context("NodeList has items")?;
        Ok(items
            .iter()
            .filter(|n| {
                n["status"]["conditions"]
                    .as_array()
                    .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
            })
            .count())
    }

    pub(crate) fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(30).collect();
        format!("--- gitplane up, last lines:\n{}", tail.into_iter().rev().collect::<Vec<_>>().join("\n"))
    }

    /// SIGTERM (as Ctrl-C would), then waits for it to stop.
    pub(crate) async fn stop(mut self) -> Result<std::process::ExitStatus> {
        let mut child = self.child.take().context("stopped already")?;
        terminate(&child);
        let deadline = Instant::now() + DEADLINE;
        while Instant::now() < deadline {
            if let Some(status) = child.try_wait()? {
                return Ok(status);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.child = Some(child);
        bail!("gitplane up --nodes did not stop within {DEADLINE:?} of SIGTERM:\n{}", self.log_tail())
    }
}

fn terminate(child: &std::process::Child) {
    // SAFETY: kill(2) on our own child, by its PID, not yet reaped.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
}

impl Drop for Up {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            terminate(&child);
            let deadline = Instant::now() + DEADLINE;
            while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(100));
            }
            if matches!(child.try_wait(), Ok(None)) {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        // What a killed (or failed) gitplane up left, removed with the product's own code.
        for name in &self.nodes {
            let host_dir = self.data_dir.join("nodes").join(name).join("host");
            if Path::new("/run/netns").join(name).exists() || host_dir.exists() {
                drop(NetnsHost::adopt(name, host_dir, format!("{}/{name}", self.cgroup_parent)));
            }
        }
        if let Err(e) = remove_netns(&format!("{}-net", self.base)) {
            eprintln!("gitplane up {}: {e}", self.base);
        }
        for hierarchy in std::fs::read_dir("/sys/fs/cgroup").into_iter().flatten().flatten() {
            let _ = std::fs::remove_dir(hierarchy.path().join(self.cgroup_parent.trim_start_matches('/')));
        }
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
