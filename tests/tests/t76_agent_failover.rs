//! A node agent survives a control-plane failover: three `gitplane server` replicas and one agent
//! with its own containerd share a network-namespace host. The agent is pointed at the leader
//! first; the leader is killed (SIGKILL). The agent moves to another replica and resumes its
//! watches there: its running Pods are not restarted or duplicated, its Node stays Ready, and a
//! Pod pushed after the failover runs and is reported Running.

use anyhow::{Context, Result, bail, ensure};
use gitplane_e2e::{
    NetnsHost, Worktree, binary,
    cluster::{READ_TOKEN, loopback_get, write_encryption_keys},
    manifests, netns_host, require_root, wait_for,
};
use gitplane_nodeagent::kubelet::cri::{Cri, pb};
use serde_json::Value;
use std::{
    collections::{BTreeMap, BTreeSet},
    fs::File,
    net::SocketAddr,
    path::PathBuf,
    process::Child,
    time::Duration,
};

const DEADLINE: Duration = Duration::from_secs(180);
const REPLICAS: u16 = 3;

/// Processes this test started in the host, ended by PID when dropped (also on failure).
struct Processes {
    host: NetnsHost,
    replicas: BTreeMap<u16, Child>,
    agent: Option<Child>,
}

impl Processes {
    fn addr(id: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 7000 + id))
    }

    fn log(&self, name: &str) -> PathBuf {
        self.host.dir().join(format!("{name}.log"))
    }

    fn logs(&self) -> String {
        let names = (1..=REPLICAS).map(|id| format!("replica-{id}")).chain(["agent".to_owned()]);
        names
            .map(|n| {
                let text = std::fs::read_to_string(self.log(&n)).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(40).collect();
                format!("--- {n}\n{}\n", tail.into_iter().rev().collect::<Vec<_>>().join("\n"))
            })
            .collect()
    }

    fn spawn(&self, name: &str, args: &[impl AsRef<std::ffi::OsStr>]) -> Result<Child> {
        let log = File::create(self.log(name))?;
        self.host
            .command(binary("gitplane")?)
            .args(args)
            .env("RUST_LOG", "info,openraft=warn,sqlx=warn,h2=warn,tower=warn")
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {name}"))
    }

    fn start_replica(&mut self, id: u16) -> Result<()> {
        let addrs = (1..=REPLICAS).map(|i| (u64::from(i), Self::addr(i))).collect();
        let mut args = gitplane_testkit::replica::replica_args(self.host.dir(), u64::from(id), &addrs);
        args.push("--bootstrap=bootstrap".into());
        let child = self.spawn(&format!("replica-{id}"), &args)?;
        self.replicas.insert(id, child);
        Ok(())
    }

    /// `GET path` with the read token, from inside the host.
    fn read(&self, id: u16, path: &str) -> Option<Value> {
        let body = self.host.in_netns(|| loopback_get(Self::addr(id), path).map_err(std::io::Error::other)).ok()?;
        serde_json::from_str(&body).ok()
    }

    fn status(&self, id: u16) -> Option<Value> {
        self.read(id, "/replica")
    }

    fn leader(&mut self) -> Result<u16> {
        let leader = wait_for(DEADLINE, || {
            self.replicas.keys().copied().find(|id| self.status(*id).is_some_and(|s| s["leading"] == true))
        });
        let exited: Vec<String> = self
            .replicas
            .iter_mut()
            .filter_map(|(id, child)| Some(format!("replica {id}: {}", child.try_wait().ok()??)))
            .collect();
        leader.with_context(|| format!("no leader (exited: {exited:?}):\n{}", self.logs()))
    }

    /// GET from whichever live replica answers.
    fn get(&self, path: &str) -> Option<Value> {
        self.replicas.keys().find_map(|id| self.read(*id, path))
    }

    fn kill(&mut self, id: u16) -> Result<()> {
        let mut child = self.replicas.remove(&id).context("no such replica")?;
        child.kill()?;
        child.wait()?;
        Ok(())
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        if let Some(mut agent) = self.agent.take() {
            // SAFETY: kill(2) on our own child, by PID: SIGTERM lets it remove its Pods.
            unsafe { libc::kill(agent.id() as i32, libc::SIGTERM) };
            let stopped = wait_for(Duration::from_secs(60), || agent.try_wait().ok().flatten());
            if stopped.is_none() {
                let _ = agent.kill();
                let _ = agent.wait();
            }
        }
        for child in self.replicas.values_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Running Pods with this label: name -> (uid, container id, restart count).
fn running(processes: &Processes, selector: &str) -> Option<BTreeMap<String, (String, String, i64)>> {
    let list = processes.get(&format!("/api/v1/namespaces/default/pods?labelSelector={selector}"))?;
    list["items"]
        .as_array()?
        .iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .map(|p| {
            let container = &p["status"]["containerStatuses"][0];
            (p["status"]["phase"] == "Running" && container["state"]["running"].is_object()).then(|| {
                let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
                let id = (text(&container["containerID"]), container["restartCount"].as_i64().unwrap_or(-1));
                (text(&p["metadata"]["name"]), (text(&p["metadata"]["uid"]), id.0, id.1))
            })
        })
        .collect()
}

fn node_ready(processes: &Processes, name: &str) -> Option<bool> {
    let node = processes.get(&format!("/api/v1/nodes/{name}"))?;
    let ready = node["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == "Ready")?.clone();
    Some(ready["status"] == "True")
}

async fn sandboxes(cri: &Cri) -> Result<BTreeSet<(String, i32)>> {
    let list = cri.runtime().list_pod_sandbox(pb::ListPodSandboxRequest { filter: None }).await?.into_inner();
    Ok(list.items.into_iter().map(|s| (s.id, s.state)).collect())
}

fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t76_the_agent_survives_a_control_plane_failover() -> Result<()> {
    require_root()?;
    let host = netns_host("gp76")?;
    let dir = host.dir().to_owned();
    let cfg = gitplane_testkit::node::containerd_config(&host, &dir);
    let (containerd, cri) = gitplane_testkit::node::start_containerd(host.name(), cfg, &dir.join("images")).await?;
    let socket = containerd.socket();

    // Tokens of at least 16 characters, as the replicas require.
    std::fs::write(dir.join("peer-token"), format!("peer-token-of-t76-{}", std::process::id()))?;
    std::fs::write(dir.join("join-token"), format!("join-token-of-t76-{}", std::process::id()))?;
    write_encryption_keys(&dir.join("encryption-keys"))?;
    std::fs::write(dir.join("tokens.csv"), format!("{READ_TOKEN},e2e,e2e,\"read\"\n"))?;
    let mut processes = Processes { host, replicas: BTreeMap::new(), agent: None };
    for id in 1..=REPLICAS {
        processes.start_replica(id)?;
    }
    let leader = blocking(|| processes.leader())?;

    // The agent talks to the leader first, so killing the leader also takes its replica away.
    let servers: Vec<String> = std::iter::once(leader)
        .chain((1..=REPLICAS).filter(|id| *id != leader))
        .map(|id| format!("http://{}", Processes::addr(id)))
        .collect();
    let node = "gp76-node";
    let path = |p: &str| dir.join(p).to_string_lossy().into_owned();
    let agent_args = [
        "agent".to_owned(),
        format!("--server={}", servers.join(",")),
        format!("--node-name={node}"),
        format!("--containerd-socket={}", socket.display()),
        format!("--cni-conf-dir={}", path("cni/net.d")),
        format!("--cni-data-dir={}", path("cni/ipam")),
        format!("--cgroup-parent={}", processes.host.cgroup_parent()),
        format!("--pod-dir={}", path("pods")),
        format!("--pod-log-dir={}", path("pods/logs")),
        format!("--join-token-file={}", path("join-token")),
        format!("--credential-file={}", path("node-credential")),
        "--remove-pods-on-exit".to_owned(),
    ];
    processes.agent = Some(processes.spawn("agent", &agent_args)?);
    blocking(|| wait_for(DEADLINE, || node_ready(&processes, node).filter(|r| *r)))
        .with_context(|| format!("the node never became Ready:\n{}", processes.logs()))?;

    // An Application and its two Pods, pushed to the hosted repositories the replicas share.
    let repos = dir.join("repos");
    blocking(|| wait_for(DEADLINE, || repos.join("bootstrap.git/HEAD").exists().then_some(())))
        .context("the leader makes the bootstrap repository")?;
    let apps = Worktree::clone(repos.join("bootstrap.git"), dir.join("work/apps"))?;
    apps.write("web.yaml", &manifests::application("web", "web"))?;
    apps.commit_and_push("the web Application")?;
    let web = blocking(|| wait_for(DEADLINE, || Worktree::clone(repos.join("web.git"), dir.join("work/web")).ok()))
        .with_context(|| format!("the web repository was not made:\n{}", processes.logs()))?;
    web.write("steady.yaml", &manifests::deployment("steady", 2))?;
    web.commit_and_push("two steady Pods")?;
    let before = blocking(|| wait_for(DEADLINE, || running(&processes, "app%3Dsteady").filter(|p| p.len() == 2)))
        .with_context(|| format!("2 Running Pods:\n{}", processes.logs()))?;
    let sandboxes_before = sandboxes(&cri).await?;
    ensure!(sandboxes_before.len() == 2, "two sandboxes expected: {sandboxes_before:?}");

    processes.kill(leader)?;
    let new_leader = blocking(|| processes.leader())?;
    println!("replica {leader} (the leader, and the agent's replica) killed; replica {new_leader} leads");

    // A Pod pushed after the failover runs: the agent's Pod watch resumed on another replica,
    // and its status reports reach the store through it.
    web.write("later.yaml", &manifests::pod("later"))?;
    web.commit_and_push("one more Pod")?;
    blocking(|| wait_for(DEADLINE, || running(&processes, "app%3Dlater").filter(|p| p.len() == 1)))
        .with_context(|| format!("the Pod pushed after the failover never ran:\n{}", processes.logs()))?;

    let after = running(&processes, "app%3Dsteady").context("listing the steady Pods")?;
    ensure!(after == before, "the steady Pods changed across the failover: {before:?} -> {after:?}");
    ensure!(after.values().all(|(_, _, restarts)| *restarts == 0), "a steady Pod restarted: {after:?}");
    let sandboxes_after = sandboxes(&cri).await?;
    ensure!(
        sandboxes_before.is_subset(&sandboxes_after) && sandboxes_after.len() == 3,
        "sandboxes were replaced or duplicated: {sandboxes_before:?} -> {sandboxes_after:?}"
    );
    ensure!(node_ready(&processes, node) == Some(true), "the node is not Ready after the failover");
    let agent_log = std::fs::read_to_string(processes.log("agent"))?;
    if agent_log.contains("panicked") {
        bail!("the agent panicked:\n{agent_log}");
    }

    drop(processes);
    containerd.stop().await?;
    Ok(())
}
