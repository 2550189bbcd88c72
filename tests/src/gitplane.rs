//! The real `gitplane up` inside a [`NetnsHost`], and a Git working copy driven with real `git`.

use crate::{HostExt, LocalCluster, NetnsHost, binary, wait_for};
use anyhow::{Context, Result, bail};
use serde_json::Value;
use std::{
    fs::File,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus},
    time::Duration,
};

/// `gitplane up` running inside a host, with its own data and repository directories.
pub struct Gitplane {
    child: Child,
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    pub repos_dir: PathBuf,
    pub log: PathBuf,
}

impl Gitplane {
    /// Starts `gitplane up` as node `node_name` and waits until its API answers.
    pub fn up(host: &NetnsHost, node_name: &str) -> Result<Gitplane> {
        Self::up_with(host, node_name, &[])
    }

    /// [`Self::up`] with more flags, e.g. `--containerd-socket` of a containerd the test runs.
    pub fn up_with(host: &NetnsHost, node_name: &str, flags: &[&str]) -> Result<Gitplane> {
        let data_dir = host.dir().join("data");
        let repos_dir = host.dir().join("repos");
        let log = host.dir().join("gitplane.log");
        let listen: SocketAddr = "127.0.0.1:8080".parse()?;
        let out = File::create(&log)?;
        let mut command = host.command(binary("gitplane")?);
        command
            .arg("up")
            .arg("--data-dir")
            .arg(&data_dir)
            .arg("--repos-dir")
            .arg(&repos_dir)
            .arg("--listen")
            .arg(listen.to_string())
            .args(["--node-name", node_name, "--cgroup-parent", host.cgroup_parent()])
            .args(flags)
            .env("RUST_LOG", "info,sqlx=warn,h2=warn,tower=warn")
            .stdout(out.try_clone()?)
            .stderr(out);
        let child = command.spawn().context("starting gitplane up")?;
        let mut up = Gitplane { child, listen, data_dir, repos_dir, log };
        let ready = wait_for(Duration::from_secs(60), || {
            if let Ok(Some(status)) = up.child.try_wait() {
                return Some(Err(status));
            }
            host.http_get(listen, "/healthz", Duration::from_secs(2)).ok().map(|_| Ok(()))
        });
        match ready {
            Some(Ok(())) => Ok(up),
            Some(Err(status)) => bail!("gitplane up exited with {status}:\n{}", up.log_text()),
            None => bail!("gitplane up did not answer within 60 s:\n{}", up.log_text()),
        }
    }

    /// GET a status API path from inside the host, as JSON.
    pub fn get(&self, host: &NetnsHost, path: &str) -> Result<Value> {
        let body = host.http_get(self.listen, path, Duration::from_secs(5))?;
        serde_json::from_str(&body).with_context(|| format!("GET {path}: not JSON: {body}"))
    }

    /// The hosted demo repository, `repos/demo.git`.
    pub fn demo_repo(&self) -> PathBuf {
        self.repos_dir.join("demo.git")
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, then waits for a clean exit.
    pub fn stop(mut self, timeout: Duration) -> Result<ExitStatus> {
        let pid = libc::pid_t::try_from(self.child.id())?;
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        match wait_for(timeout, || self.child.try_wait().ok().flatten()) {
            Some(status) => Ok(status),
            None => bail!("gitplane up did not stop within {timeout:?} of SIGTERM:\n{}", self.log_text()),
        }
    }
}

/// A working copy of a hosted repository, changed and pushed with the real `git`.
pub struct Worktree {
    pub dir: PathBuf,
}

impl Worktree {
    /// Clones a repository (a path or a URL).
    pub fn clone(url: impl AsRef<std::ffi::OsStr>, dir: PathBuf) -> Result<Worktree> {
        git(Command::new("git").arg("clone").arg("--quiet").arg(url).arg(&dir))?;
        Ok(Worktree { dir })
    }

    /// Commits everything; then `push` pushes it.
    pub fn commit(&self, message: &str) -> Result<()> {
        git(self.git().args(["add", "--all"]))?;
        git(self.git().args(["commit", "--quiet", "-m", message]))
    }

    /// Pushes HEAD to `main` of `url`; the error carries git's message.
    pub fn push(&self, url: &str) -> Result<()> {
        git(self.git().args(["push", "--quiet", url, "HEAD:main"]))
    }

    /// The commit HEAD names.
    pub fn head(&self) -> Result<String> {
        let out = self.git().args(["rev-parse", "HEAD"]).output()?;
        if !out.status.success() {
            bail!("git rev-parse HEAD: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    pub fn write(&self, file: &str, content: &str) -> Result<()> {
        std::fs::write(self.dir.join(file), content).with_context(|| format!("writing {file}"))
    }

    pub fn remove(&self, file: &str) -> Result<()> {
        std::fs::remove_file(self.dir.join(file)).with_context(|| format!("removing {file}"))
    }

    /// Commits everything and pushes `main` to `origin`.
    pub fn commit_and_push(&self, message: &str) -> Result<()> {
        self.commit(message)?;
        self.push("origin")
    }

    fn git(&self) -> Command {
        let mut command = Command::new("git");
        command
            .arg("-C")
            .arg(&self.dir)
            .env("GIT_AUTHOR_NAME", "e2e")
            .env("GIT_AUTHOR_EMAIL", "e2e@localhost")
            .env("GIT_COMMITTER_NAME", "e2e")
            .env("GIT_COMMITTER_EMAIL", "e2e@localhost")
            .env("GIT_TERMINAL_PROMPT", "0");
        command
    }
}

fn git(command: &mut Command) -> Result<()> {
    let output = command.output().with_context(|| format!("running {command:?}"))?;
    if !output.status.success() {
        bail!("{command:?} failed: {}", String::from_utf8_lossy(&output.stderr));
    }
    Ok(())
}

/// Replaces `cluster`'s demo repository workload with one Pod `name` that prints `line` and
/// sleeps, pushes it (a working copy under `work_dir`), and waits until `kubectl logs` reads
/// the line through the replica, which reaches the node's kubelet endpoint.
pub fn run_printing_pod(cluster: &LocalCluster, work_dir: &Path, name: &str, line: &str) -> Result<()> {
    let work = Worktree::clone(cluster.demo_repo(), work_dir.join("demo"))?;
    work.remove("web.yaml")?;
    let script = format!("echo {line}; exec /bin/busybox sleep 3600");
    work.write(&format!("{name}.yaml"), &crate::manifests::shell_pod(name, &script))?;
    work.commit_and_push(&format!("a Pod that prints {line:?}"))?;
    let printed = || cluster.kubectl_logs(name).filter(|out| out.contains(line));
    wait_for(Duration::from_secs(120), printed)
        .map(drop)
        .with_context(|| format!("kubectl logs {name} never printed {line:?}:\n{}", cluster.log_text()))
}
