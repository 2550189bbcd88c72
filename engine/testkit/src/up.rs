//! The real `gitplane up --nodes N`: the same namespace hosts and bridge a user gets, made by the
//! product. The control plane listens on a free loopback port of the machine; everything else
//! (nodes, Pods, their traffic) lives in the namespaces `gitplane up` made, which it removes
//! when stopped, and which [`LocalCluster`] removes with the product's own code if it had to be
//! killed.

use crate::{NetnsHost, http, node, wait_for};
use anyhow::{Context as _, Result, bail, ensure};
use gitplane_nodeagent::host::remove_netns;
use serde_json::Value;
use std::{
    fs::File,
    net::SocketAddr,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    time::Duration,
};

static EXECS: AtomicU32 = AtomicU32::new(0);

/// How long starting (every node Ready) and stopping may take.
pub const DEADLINE: Duration = Duration::from_secs(180);

/// How to start a [`LocalCluster`].
pub struct UpCommand {
    binary: PathBuf,
    base: String,
    count: u16,
    owner: &'static str,
    flags: Vec<String>,
    die_with_parent: bool,
}

impl UpCommand {
    /// `binary up --nodes=<count>`, its nodes named `<base>-1` … `<base>-N`; `owner` (`e2e`,
    /// `bench`) names its cgroup parent and directory.
    pub fn new(binary: PathBuf, base: String, count: u16, owner: &'static str) -> UpCommand {
        UpCommand { binary, base, count, owner, flags: Vec::new(), die_with_parent: false }
    }

    /// More flags for `gitplane up`, e.g. `--proxy-mode=iptables`.
    pub fn flags(mut self, flags: &[&str]) -> UpCommand {
        self.flags = flags.iter().map(|f| f.to_string()).collect();
        self
    }

    /// SIGTERM to `gitplane up` when the thread that starts it exits, so that a benchmark killed
    /// with SIGKILL still lets it remove its namespaces. Only from a thread that lives as long as
    /// the cluster (a process's main thread).
    pub fn die_with_parent(mut self) -> UpCommand {
        self.die_with_parent = true;
        self
    }

    /// Starts it, without waiting for the nodes: see [`LocalCluster::started`].
    pub fn spawn(self) -> Result<LocalCluster> {
        let dir = tempfile::Builder::new().prefix(&format!("gitplane-{}-nodes-", self.owner)).tempdir()?;
        let mut cluster = LocalCluster {
            child: None,
            banners_before: 0,
            nodes: (1..=self.count).map(|i| format!("{}-{i}", self.base)).collect(),
            listen: http::free_port()?,
            data_dir: dir.path().join("data"),
            repos_dir: dir.path().join("repos"),
            log: dir.path().join("gitplane.log"),
            cgroup_parent: format!("/gitplane-{}-{}", self.owner, self.base),
            base: self.base,
            binary: self.binary,
            flags: self.flags,
            die_with_parent: self.die_with_parent,
            dir,
        };
        cluster.spawn_child()?;
        Ok(cluster)
    }
}

/// A Running Pod (not being deleted) and its first container.
#[derive(Clone, Debug)]
pub struct RunningPod {
    pub name: String,
    pub node: String,
    pub ip: std::net::Ipv4Addr,
    pub container: String,
}

/// `gitplane up --nodes N` running as a child process: SIGTERM and a wait when dropped, then the
/// product's own code removes whatever a killed one left.
pub struct LocalCluster {
    child: Option<Child>,
    /// How many banners the log held when this start began: the Nodes may be Ready from a run
    /// before, the banner comes once every node was started.
    banners_before: usize,
    /// Nodes are `<base>-1` … `<base>-N`, each in a network namespace of that name.
    pub base: String,
    pub nodes: Vec<String>,
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    pub repos_dir: PathBuf,
    pub log: PathBuf,
    cgroup_parent: String,
    binary: PathBuf,
    flags: Vec<String>,
    die_with_parent: bool,
    /// Holds the data, the repositories and the log; removed last.
    dir: tempfile::TempDir,
}

const BANNER: &str = "gitplane is up.";

impl LocalCluster {
    /// Starts `count` nodes named after `prefix` and waits until the API answers and every node
    /// is Ready.
    pub fn up(prefix: &str, count: u16) -> Result<LocalCluster> {
        Self::up_with(prefix, count, &[])
    }

    /// [`Self::up`] with more flags for `gitplane up`, e.g. `--proxy-mode=iptables`.
    pub fn up_with(prefix: &str, count: u16, flags: &[&str]) -> Result<LocalCluster> {
        let binary = crate::binary("gitplane")?;
        let mut cluster = UpCommand::new(binary, node::unique_name(prefix), count, "e2e").flags(flags).spawn()?;
        cluster.wait_started()?;
        Ok(cluster)
    }

    /// Starts `gitplane up --nodes` (appending to its log).
    fn spawn_child(&mut self) -> Result<()> {
        let out = File::options().create(true).append(true).open(&self.log)?;
        let mut command = Command::new(&self.binary);
        command
            .arg("up")
            .arg(format!("--nodes={}", self.nodes.len()))
            .arg(format!("--node-name={}", self.base))
            .arg(format!("--listen={}", self.listen))
            .arg(format!("--cgroup-parent={}", self.cgroup_parent))
            .arg("--data-dir")
            .arg(&self.data_dir)
            .arg("--repos-dir")
            .arg(&self.repos_dir)
            .args(&self.flags)
            .env("RUST_LOG", "info,sqlx=warn,h2=warn,tower=warn")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            // Not in the terminal's group: Ctrl-C reaches the test or bench, whose guard stops it.
            .process_group(0);
        if self.die_with_parent {
            // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
            unsafe {
                command.pre_exec(|| {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        self.banners_before = self.log_text().matches(BANNER).count();
        self.child = Some(command.spawn().context("starting gitplane up --nodes")?);
        Ok(())
    }

    /// Whether this start printed its banner and every node is Ready; an error once `gitplane up`
    /// exited.
    pub fn started(&mut self) -> Result<bool> {
        if let Some(status) = self.try_wait()? {
            bail!("gitplane up --nodes exited with {status}");
        }
        if self.log_text().matches(BANNER).count() <= self.banners_before {
            return Ok(false);
        }
        Ok(self.ready_nodes().is_ok_and(|ready| ready.len() == self.nodes.len()))
    }

    /// Waits until [`Self::started`], at most [`DEADLINE`].
    pub fn wait_started(&mut self) -> Result<()> {
        let started = wait_for(DEADLINE, || match self.started() {
            Ok(false) => None,
            done => Some(done),
        });
        match started {
            Some(Ok(_)) => Ok(()),
            Some(Err(e)) => bail!("{e}:\n{}", self.log_text()),
            None => bail!("{} nodes were not Ready within {DEADLINE:?}:\n{}", self.nodes.len(), self.log_text()),
        }
    }

    /// The pid of `gitplane up`, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Its exit status once it exited (it is reaped then).
    pub fn try_wait(&mut self) -> Result<Option<ExitStatus>> {
        let Some(child) = self.child.as_mut() else { bail!("gitplane up --nodes is not running") };
        let status = child.try_wait()?;
        if status.is_some() {
            self.child = None;
        }
        Ok(status)
    }

    /// SIGTERM (as Ctrl-C would), if it runs.
    pub fn terminate(&self) {
        // Only our own child, not yet reaped (so its pid cannot have been reused).
        if let Some(pid) = self.pid().and_then(|p| libc::pid_t::try_from(p).ok()) {
            // SAFETY: kill(2) has no memory-safety preconditions.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
    }

    /// SIGKILL of `gitplane up` itself, as a crash would end it: its nodes' agents, containerds
    /// and Pods run on without it.
    pub fn kill(&mut self) -> Result<()> {
        let mut child = self.child.take().context("not running")?;
        child.kill()?;
        child.wait()?;
        Ok(())
    }

    /// Starts `gitplane up` again with the same flags and data, and waits until every node is
    /// Ready.
    pub fn restart(&mut self) -> Result<()> {
        ensure!(self.child.is_none(), "gitplane up runs already");
        self.spawn_child()?;
        self.wait_started()
    }

    /// The directory holding the data, the repositories and the log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The Running Pods of namespace `default` that match a label selector (`app=web`).
    pub fn running_pods(&self, selector: &str) -> Result<Vec<RunningPod>> {
        let list =
            self.get(&format!("/api/v1/namespaces/default/pods?labelSelector={}", selector.replace('=', "%3D")))?;
        let items = list["items"].as_array().context("PodList has items")?;
        Ok(items
            .iter()
            .filter(|p| p["status"]["phase"] == "Running" && p["metadata"]["deletionTimestamp"].is_null())
            .filter_map(|p| {
                let container = p["status"]["containerStatuses"][0]["containerID"].as_str()?;
                Some(RunningPod {
                    name: p["metadata"]["name"].as_str()?.to_owned(),
                    node: p["spec"]["nodeName"].as_str()?.to_owned(),
                    ip: p["status"]["podIP"].as_str()?.parse().ok()?,
                    container: container.strip_prefix("containerd://")?.to_owned(),
                })
            })
            .collect())
    }

    /// The pids of node `name`'s containerd shims (one per Pod).
    pub fn shim_pids(&self, name: &str) -> Vec<i32> {
        let socket = self.containerd_socket(name).to_string_lossy().into_owned();
        processes(|args| {
            args.first().is_some_and(|a| a.ends_with(b"containerd-shim-runc-v2"))
                && args.windows(2).any(|w| w[0] == b"-address" && w[1] == socket.as_bytes())
        })
    }

    /// The uids of the Pods node `name`'s containerd runs, one per ready sandbox (a uid twice is
    /// a duplicated Pod), sorted.
    pub async fn runtime_pods(&self, name: &str) -> Result<Vec<String>> {
        use gitplane_nodeagent::kubelet::cri::{Cri, pb};
        let cri = Cri::connect(&self.containerd_socket(name)).await?;
        let listed = cri.runtime().list_pod_sandbox(pb::ListPodSandboxRequest { filter: None }).await?.into_inner();
        let ready = pb::PodSandboxState::SandboxReady as i32;
        let mut uids: Vec<String> = listed
            .items
            .into_iter()
            .filter(|s| s.state == ready)
            .filter_map(|s| s.labels.get(gitplane_nodeagent::kubelet::runtime::spec::LABEL_POD_UID).cloned())
            .collect();
        uids.sort();
        Ok(uids)
    }

    /// The uids of the Pods bound to node `name` that have not finished, sorted.
    pub fn bound_pods(&self, name: &str) -> Result<Vec<String>> {
        let list = self.get("/api/v1/pods")?;
        let mut uids: Vec<String> = list["items"]
            .as_array()
            .context("PodList has items")?
            .iter()
            .filter(|p| p["spec"]["nodeName"] == name)
            .filter(|p| !matches!(p["status"]["phase"].as_str(), Some("Succeeded" | "Failed")))
            .filter_map(|p| p["metadata"]["uid"].as_str().map(str::to_owned))
            .collect();
        uids.sort();
        Ok(uids)
    }

    /// The pid of node `name`'s agent process (`gitplane agent --node-name=<name>`).
    pub fn agent_pid(&self, name: &str) -> Option<i32> {
        let wanted = format!("--node-name={name}");
        processes(|args| args.get(1) == Some(&&b"agent"[..]) && args.contains(&wanted.as_bytes())).first().copied()
    }

    /// The pid of node `name`'s containerd (`containerd --config <its directory>/config.toml`).
    pub fn containerd_pid(&self, name: &str) -> Option<i32> {
        let config = self.data_dir.join("nodes").join(name).join("containerd/config.toml");
        let wanted = config.to_string_lossy().into_owned();
        processes(|args| {
            args.first().is_some_and(|a| a.ends_with(b"containerd"))
                && args.windows(2).any(|w| w[0] == b"--config" && w[1] == wanted.as_bytes())
        })
        .first()
        .copied()
    }

    /// Runs `cmd` in a container through its node's containerd (as `kubectl exec`); its stdout.
    ///
    /// containerd may lose what a process wrote just before it exited, so `cmd` runs under the
    /// image's busybox shell, which ends the output with a marker, and runs again when the
    /// marker is missing.
    pub fn exec(&self, node: &str, container_id: &str, cmd: &[&str]) -> Result<String> {
        const END: &str = "\ngitplane-exec-end\n";
        const WRAPPER: &str = "\"$@\"; status=$?; echo; echo gitplane-exec-end; exit $status";
        for _ in 0..3 {
            let exec_id = format!("e2e-{}", EXECS.fetch_add(1, Ordering::Relaxed));
            let out = Command::new("ctr")
                .arg("-a")
                .arg(self.containerd_socket(node))
                .args(["-n", "k8s.io", "tasks", "exec", "--exec-id", &exec_id, container_id])
                .args(["/bin/busybox", "sh", "-c", WRAPPER, "sh"])
                .args(cmd)
                .output()?;
            if !out.status.success() {
                let stderr = String::from_utf8_lossy(&out.stderr);
                bail!("exec {cmd:?} in {container_id} on {node}: {} {}", out.status, stderr.trim());
            }
            if let Some(stdout) = String::from_utf8_lossy(&out.stdout).strip_suffix(END) {
                return Ok(stdout.to_owned());
            }
        }
        bail!("exec {cmd:?} in {container_id} on {node}: containerd lost its output three times")
    }

    /// `wget -O - url` from inside a container, bounded (Debian's busybox has no `wget -T`).
    pub fn fetch(&self, node: &str, container_id: &str, url: &str) -> Result<String> {
        let cmd = ["/bin/busybox", "timeout", "5", "/bin/busybox", "wget", "-q", "-O", "-", url];
        self.exec(node, container_id, &cmd)
    }

    /// The names of the Nodes whose Ready condition is True.
    pub fn ready_nodes(&self) -> Result<Vec<String>> {
        let list = self.get("/api/v1/nodes")?;
        let items = list["items"].as_array().context("NodeList has items")?;
        Ok(items
            .iter()
            .filter(|n| {
                n["status"]["conditions"]
                    .as_array()
                    .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
            })
            .filter_map(|n| n["metadata"]["name"].as_str().map(str::to_owned))
            .collect())
    }

    /// GET a status API path on the machine's loopback (no token needed there), as JSON.
    pub fn get(&self, path: &str) -> Result<Value> {
        let body = http::http_get(self.listen, path, None, Duration::from_secs(5))?;
        serde_json::from_str(&body).with_context(|| format!("GET {path}: not JSON: {body}"))
    }

    /// Node `name`'s network namespace.
    pub fn netns(&self, name: &str) -> PathBuf {
        Path::new("/run/netns").join(name)
    }

    /// Node `name`'s containerd socket.
    pub fn containerd_socket(&self, name: &str) -> PathBuf {
        self.data_dir.join("nodes").join(name).join("containerd/containerd.sock")
    }

    /// The hosted demo repository, `repos/demo.git`.
    pub fn demo_repo(&self) -> PathBuf {
        self.repos_dir.join("demo.git")
    }

    /// What `kubectl <args>` against this cluster prints; its stderr in the error when it fails.
    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        let out = Command::new("kubectl")
            .args(["--server", &format!("http://{}", self.listen)])
            .args(args)
            .output()
            .context("running kubectl (apt-get install kubectl)")?;
        ensure!(out.status.success(), "kubectl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// What `kubectl logs <pod>` prints, when it succeeds.
    pub fn kubectl_logs(&self, pod: &str) -> Option<String> {
        let out = Command::new("kubectl")
            .args(["--server", &format!("http://{}", self.listen), "logs", pod])
            .output()
            .ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The log's last lines, for error messages.
    pub fn log_tail(&self) -> String {
        let log = self.log_text();
        let tail: Vec<&str> = log.lines().rev().take(30).collect();
        format!("--- gitplane up, last lines:\n{}", tail.into_iter().rev().collect::<Vec<_>>().join("\n"))
    }

    /// SIGTERM (as Ctrl-C would): it must exit cleanly within `within` and leave nothing of
    /// the cluster behind (see [`Self::leftovers`]). How long it took.
    pub fn stop_within(mut self, within: Duration) -> Result<Duration> {
        let started = std::time::Instant::now();
        self.terminate();
        // Past the bound, the wait goes on for the log, then the verdict.
        let status = wait_for(within + Duration::from_secs(60), || self.try_wait().transpose());
        let took = started.elapsed();
        let status = match status {
            Some(status) => status?,
            None => {
                let _ = self.kill();
                bail!("gitplane up --nodes did not stop within {took:?} of SIGTERM:\n{}", self.log_text())
            }
        };
        if !status.success() || took > within {
            bail!("gitplane up --nodes stopped with {status} {took:?} after SIGTERM:\n{}", self.log_text());
        }
        let left = self.leftovers();
        if !left.is_empty() {
            bail!("gitplane up --nodes left behind: {left:#?}\n{}", self.log_text());
        }
        Ok(took)
    }

    /// What of the cluster exists: its network namespaces, mounts under its directory, processes
    /// that name its directory (containerd, agents, shims) and its cgroups (the Pods').
    pub fn leftovers(&self) -> Vec<String> {
        let dir = self.dir.path().to_string_lossy().into_owned();
        let mut left: Vec<String> = std::fs::read_dir("/run/netns")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|name| name.starts_with(&format!("{}-", self.base)))
            .map(|name| format!("network namespace {name}"))
            .collect();
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        left.extend(mountinfo.lines().filter(|l| l.contains(&dir)).map(|l| format!("mount {l}")));
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if cmdline.contains(&dir) {
                left.push(format!("process {}: {cmdline}", entry.file_name().to_string_lossy()));
            }
        }
        for hierarchy in std::fs::read_dir("/sys/fs/cgroup").into_iter().flatten().flatten() {
            let cgroup = hierarchy.path().join(self.cgroup_parent.trim_start_matches('/'));
            if cgroup.exists() {
                left.push(format!("cgroup {}", cgroup.display()));
            }
        }
        left
    }

    /// SIGTERM (as Ctrl-C would), then waits for a clean exit.
    pub fn stop(mut self, timeout: Duration) -> Result<ExitStatus> {
        ensure!(self.child.is_some(), "stopped already");
        self.terminate();
        match wait_for(timeout, || self.try_wait().transpose()) {
            Some(status) => status,
            None => {
                let _ = self.kill();
                bail!("gitplane up --nodes did not stop within {timeout:?} of SIGTERM:\n{}", self.log_text())
            }
        }
    }
}

/// The pids of the processes whose command line (its arguments) `matches`.
fn processes(matches: impl Fn(&[&[u8]]) -> bool) -> Vec<i32> {
    let Ok(procs) = std::fs::read_dir("/proc") else { return Vec::new() };
    procs
        .flatten()
        .filter_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            matches(&args).then_some(pid)
        })
        .collect()
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.terminate();
            if wait_for(DEADLINE, || self.try_wait().ok().flatten()).is_none()
                && let Some(mut child) = self.child.take()
            {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        // What a killed (or failed) gitplane up left, removed with the product's own code.
        for name in &self.nodes {
            let dir = self.data_dir.join("nodes").join(name).join("host");
            if self.netns(name).exists() || dir.exists() {
                drop(NetnsHost::adopt(name, dir, format!("{}/{name}", self.cgroup_parent)));
            }
        }
        if let Err(e) = remove_netns(&format!("{}-net", self.base)) {
            eprintln!("gitplane up --nodes {}: {e}", self.base);
        }
        node::remove_cgroup(&self.cgroup_parent);
    }
}
