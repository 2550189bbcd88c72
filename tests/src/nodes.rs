//! The real `gitplane up --nodes N`: the same namespace hosts and bridge a user gets, made by the
//! product. The control plane listens on a free loopback port of the machine; everything else
//! (nodes, Pods, their traffic) lives in the namespaces `gitplane up` made, which it removes
//! when stopped, and which this harness removes with the product's own code if it had to be
//! killed.

use crate::{binary, wait_for};
use anyhow::{Context, Result, bail, ensure};
use gitplane_nodeagent::host::{NetnsHost, remove_netns};
use serde_json::Value;
use std::{
    fs::File,
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus},
    sync::atomic::{AtomicU32, Ordering},
    time::Duration,
};

static CLUSTERS_MADE: AtomicU32 = AtomicU32::new(0);
static EXECS: AtomicU32 = AtomicU32::new(0);

/// A Running Pod (not being deleted) and its first container.
#[derive(Clone, Debug)]
pub struct RunningPod {
    pub name: String,
    pub node: String,
    pub ip: std::net::Ipv4Addr,
    pub container: String,
}

/// `gitplane up --nodes N` running as a child of the test.
pub struct LocalCluster {
    child: Option<Child>,
    /// Nodes are `<base>-1` … `<base>-N`, each in a network namespace of that name.
    pub base: String,
    pub nodes: Vec<String>,
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    pub repos_dir: PathBuf,
    pub log: PathBuf,
    cgroup_parent: String,
    /// More flags for `gitplane up`.
    flags: Vec<String>,
    /// Holds the data and repositories; removed last.
    _dir: tempfile::TempDir,
}

impl LocalCluster {
    /// Starts `count` nodes named after `prefix` and waits until the API answers and every node
    /// is Ready.
    pub fn up(prefix: &str, count: u16) -> Result<LocalCluster> {
        Self::up_with(prefix, count, &[])
    }

    /// [`Self::up`] with more flags for `gitplane up`, e.g. `--proxy-mode=iptables`.
    pub fn up_with(prefix: &str, count: u16, flags: &[&str]) -> Result<LocalCluster> {
        let base = format!("{prefix}{}x{}", std::process::id(), CLUSTERS_MADE.fetch_add(1, Ordering::Relaxed));
        let dir = tempfile::Builder::new().prefix("gp-nodes").tempdir()?;
        let data_dir = dir.path().join("data");
        let repos_dir = dir.path().join("repos");
        let log = dir.path().join("gitplane.log");
        // A free port of this machine's loopback (the window until gitplane binds it is short).
        let listen = TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let cgroup_parent = format!("/gitplane-e2e-{base}");
        let nodes = (1..=count).map(|i| format!("{base}-{i}")).collect();
        let mut cluster = LocalCluster {
            child: None,
            base,
            nodes,
            listen,
            data_dir,
            repos_dir,
            log,
            cgroup_parent,
            flags: flags.iter().map(|f| f.to_string()).collect(),
            _dir: dir,
        };
        cluster.start()?;
        Ok(cluster)
    }

    /// Starts `gitplane up --nodes` (appending to its log) and waits until every node is Ready.
    fn start(&mut self) -> Result<()> {
        let out = File::options().create(true).append(true).open(&self.log)?;
        let count = self.nodes.len();
        let mut command = Command::new(binary("gitplane")?);
        command
            .arg("up")
            .arg(format!("--nodes={count}"))
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
            .stdout(out.try_clone()?)
            .stderr(out)
            .process_group(0);
        // Its banner comes once every node was started: the Nodes may be Ready from a run before.
        let starts = self.log_text().matches("gitplane is up.").count() + 1;
        self.child = Some(command.spawn().context("starting gitplane up --nodes")?);
        let ready = wait_for(Duration::from_secs(180), || {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                return Some(Err(status));
            }
            if self.log_text().matches("gitplane is up.").count() < starts {
                return None;
            }
            let ready = self.ready_nodes().ok()?;
            (ready.len() == count).then_some(Ok(()))
        });
        match ready {
            Some(Ok(())) => Ok(()),
            Some(Err(status)) => bail!("gitplane up --nodes exited with {status}:\n{}", self.log_text()),
            None => bail!("{count} nodes were not Ready within 180 s:\n{}", self.log_text()),
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
        self.start()
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
        let Ok(procs) = std::fs::read_dir("/proc") else { return Vec::new() };
        procs
            .flatten()
            .filter_map(|entry| {
                let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
                let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
                let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
                let shim = args.first().is_some_and(|a| a.ends_with(b"containerd-shim-runc-v2"))
                    && args.windows(2).any(|w| w[0] == b"-address" && w[1] == socket.as_bytes());
                shim.then_some(pid)
            })
            .collect()
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
        std::fs::read_dir("/proc").ok()?.flatten().find_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            let is_agent = args.get(1) == Some(&&b"agent"[..]) && args.contains(&wanted.as_bytes());
            is_agent.then_some(pid)
        })
    }

    /// The pid of node `name`'s containerd (`containerd --config <its directory>/config.toml`).
    pub fn containerd_pid(&self, name: &str) -> Option<i32> {
        let config = self.data_dir.join("nodes").join(name).join("containerd/config.toml");
        let wanted = config.to_string_lossy().into_owned();
        std::fs::read_dir("/proc").ok()?.flatten().find_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            let is_containerd = args.first().is_some_and(|a| a.ends_with(b"containerd"))
                && args.windows(2).any(|w| w[0] == b"--config" && w[1] == wanted.as_bytes());
            is_containerd.then_some(pid)
        })
    }

    /// Runs `cmd` in a container through its node's containerd (as `kubectl exec`); its stdout.
    pub fn exec(&self, node: &str, container_id: &str, cmd: &[&str]) -> Result<String> {
        let exec_id = format!("e2e-{}", EXECS.fetch_add(1, Ordering::Relaxed));
        let out = Command::new("ctr")
            .arg("-a")
            .arg(self.containerd_socket(node))
            .args(["-n", "k8s.io", "tasks", "exec", "--exec-id", &exec_id, container_id])
            .args(cmd)
            .output()?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            bail!("exec {cmd:?} in {container_id} on {node}: {} {}", out.status, stderr.trim());
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
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

    /// GET a status API path on the machine's loopback, as JSON.
    pub fn get(&self, path: &str) -> Result<Value> {
        let timeout = Duration::from_secs(5);
        let mut stream = TcpStream::connect_timeout(&self.listen, timeout)?;
        stream.set_read_timeout(Some(timeout))?;
        write!(stream, "GET {path} HTTP/1.0\r\nHost: {}\r\nConnection: close\r\n\r\n", self.listen)?;
        let mut response = String::new();
        stream.read_to_string(&mut response)?;
        let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
        if head.lines().next().is_none_or(|status| status.split(' ').nth(1) != Some("200")) {
            bail!("GET {path}: {head}");
        }
        serde_json::from_str(body).with_context(|| format!("GET {path}: not JSON: {body}"))
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

    /// Replaces the demo repository's workload with one Pod `name` that prints `line` and
    /// sleeps, pushes it (a working copy under `work_dir`), and waits until `kubectl logs` reads
    /// the line through the replica, which reaches the node's kubelet endpoint.
    pub fn run_printing_pod(&self, work_dir: &Path, name: &str, line: &str) -> Result<()> {
        let work = crate::Worktree::clone(self.demo_repo(), work_dir.join("demo"))?;
        work.remove("web.yaml")?;
        let script = format!("echo {line}; exec /bin/busybox sleep 3600");
        work.write(&format!("{name}.yaml"), &crate::manifests::shell_pod(name, &script))?;
        work.commit_and_push(&format!("a Pod that prints {line:?}"))?;
        let printed = || self.kubectl_logs(name).filter(|out| out.contains(line));
        wait_for(Duration::from_secs(120), printed)
            .map(drop)
            .with_context(|| format!("kubectl logs {name} never printed {line:?}:\n{}", self.log_text()))
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

    /// SIGTERM (as Ctrl-C would): it must exit cleanly within `within` and leave nothing of
    /// the cluster behind (see [`Self::leftovers`]). How long it took.
    pub fn stop_within(mut self, within: Duration) -> Result<Duration> {
        let mut child = self.child.take().context("stopped already")?;
        let started = std::time::Instant::now();
        terminate(&child);
        // Past the bound, the wait goes on for the log, then the verdict.
        let status = wait_for(within + Duration::from_secs(60), || child.try_wait().ok().flatten());
        let took = started.elapsed();
        let Some(status) = status else {
            let _ = child.kill();
            let _ = child.wait();
            bail!("gitplane up --nodes did not stop within {took:?} of SIGTERM:\n{}", self.log_text());
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
        let dir = self._dir.path().to_string_lossy().into_owned();
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
        let mut child = self.child.take().context("stopped already")?;
        terminate(&child);
        match wait_for(timeout, || child.try_wait().ok().flatten()) {
            Some(status) => Ok(status),
            None => {
                let _ = child.kill();
                let _ = child.wait();
                bail!("gitplane up --nodes did not stop within {timeout:?} of SIGTERM:\n{}", self.log_text())
            }
        }
    }
}

fn terminate(child: &Child) {
    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: kill(2) on our own child, not yet reaped.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            terminate(&child);
            if wait_for(Duration::from_secs(120), || child.try_wait().ok().flatten()).is_none() {
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
            eprintln!("LocalCluster {}: {e}", self.base);
        }
        for hierarchy in std::fs::read_dir("/sys/fs/cgroup").into_iter().flatten().flatten() {
            let _ = std::fs::remove_dir(hierarchy.path().join(self.cgroup_parent.trim_start_matches('/')));
        }
    }
}
