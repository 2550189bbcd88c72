//! `gitplane up --nodes N`: N nodes on this machine, like kind but with real network namespaces.
//!
//! The control plane stays in the machine's namespaces (its `--listen` address, as with one
//! node) and listens also on the gateway of a [`HostNetwork`], a bridge in a network namespace
//! of its own (`<base>-net`, [`GATEWAY`]). Node `i` is a [`NetnsHost`] named `<base>-i`,
//! wired to that bridge at `172.29.0.(10+i)`, running its own containerd and its own agent
//! process (`gitplane agent`, inside the host's namespaces), which joins with the join token
//! like any other node. Its files are in `<data-dir>/nodes/<base>-i/` (containerd, CNI,
//! Pods, `agent.log`, the node credential). Nothing is added to the machine's own network
//! namespace: Pod and Service addresses and routes exist only inside the hosts.
//!
//! While it runs, a node's agent or containerd that exits is started again with a back-off
//! ([`Backoff`]), as systemd restarts a kubelet or a containerd: Pods outlive both (in their
//! shims), and the new agent or containerd takes them up again.
//!
//! Stopping (Ctrl-C) stops each agent, which removes its Pods, then each containerd, then
//! removes the hosts (processes, cgroups, mounts, namespaces) and the bridge's namespace.

use anyhow::Context as _;
use gitplane_nodeagent::{
    host::{HostError, HostNetwork, NetnsHost, remove_netns},
    kubelet::containerd::{Containerd, ContainerdConfig},
    kubelet::restart::Backoff,
    network::cidr::Ipv4Cidr,
    network::proxy,
};
use std::{
    collections::BTreeMap,
    net::Ipv4Addr,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};
use tokio::{process::Child, sync::watch};

/// The bridge's address, where the nodes reach the control plane.
pub use gitplane_testkit::node::GATEWAY;
const PREFIX: u8 = 24;
/// How long an agent may take to remove its Pods once asked to stop (it gives itself
/// `agent::EXIT_DEADLINE`); then it is killed and the host's teardown kills what is left, so a
/// stop ends within seconds whatever state a node is in.
const AGENT_STOP: Duration = Duration::from_secs(6);

/// Node `i`'s address on the bridge.
pub fn node_address(i: u16) -> Ipv4Addr {
    let [a, b, c, _] = GATEWAY.octets();
    // --nodes is at most 100, so this stays inside the /24.
    Ipv4Addr::new(a, b, c, (10 + i).min(254) as u8)
}

/// The namespace and bridge the nodes share; also where the control plane listens for them.
/// What a killed run with the same data directory left is taken up again: its network and the
/// hosts of nodes `1..=count` that survive, whose Pods go on running in them (their agents and
/// containerds are replaced by this run's, which adopt the Pods); the rest of it is removed.
pub async fn create_network(
    base: &str,
    data_dir: &Path,
    cgroup_parent: &str,
    count: u16,
) -> anyhow::Result<(HostNetwork, Survivors)> {
    let name = format!("{base}-net");
    let (base, data_dir, cgroup_parent) = (base.to_owned(), data_dir.to_owned(), cgroup_parent.to_owned());
    blocking(move || {
        let mut survivors = leftovers(&base, &data_dir, &cgroup_parent);
        if let Some(network) = HostNetwork::adopt(&name, GATEWAY, PREFIX) {
            survivors.retain(|i, host| {
                let keep = *i <= count && host.survives();
                if keep {
                    tracing::info!(node = %host.name(), "taking up the node a killed gitplane up left, with its Pods");
                } else {
                    tracing::warn!(node = %host.name(), "removing what a killed gitplane up left of this node");
                }
                keep
            });
            return Ok((network, Survivors(survivors)));
        }
        for host in survivors.values() {
            tracing::warn!(node = %host.name(), "removing what a killed gitplane up left of this node");
        }
        drop(survivors);
        remove_netns(&name)?;
        Ok((HostNetwork::create(&name, GATEWAY, PREFIX)?, Survivors::default()))
    })
    .await
    .context("creating the nodes' network")
}

/// The hosts a killed run left, by node number, for [`run`] to take up again.
#[derive(Default)]
pub struct Survivors(BTreeMap<u16, NetnsHost>);

/// Hosts of this data directory whose mount namespace is still pinned: a run that was killed
/// before it could remove them left them.
fn leftovers(base: &str, data_dir: &Path, cgroup_parent: &str) -> BTreeMap<u16, NetnsHost> {
    let Ok(entries) = std::fs::read_dir(data_dir.join("nodes")) else { return BTreeMap::new() };
    let mut found = BTreeMap::new();
    for entry in entries.flatten() {
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else { continue };
        let dir = entry.path().join("host");
        let Some(i) = name.strip_prefix(&format!("{base}-")).and_then(|i| i.parse::<u16>().ok()) else { continue };
        if dir.join("mnt").exists() {
            found.insert(i, NetnsHost::adopt(&name, dir, format!("{cgroup_parent}/{name}")));
        }
    }
    found
}

/// Kills what the last run left running in a host it takes up: its agent (SIGKILL, so that it
/// does not remove its Pods on the way out) and its containerd; the shims, and the Pods in them,
/// stay for the new containerd.
fn replace_processes(host: &NetnsHost) {
    let ours: Vec<u32> = host
        .processes()
        .into_iter()
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            let agent = args.get(1) == Some(&&b"agent"[..]);
            let containerd = args.first().is_some_and(|a| a.ends_with(b"containerd"));
            agent || containerd
        })
        .collect();
    for pid in &ours {
        tracing::info!(node = %host.name(), pid, "stopping what the last run left running");
        if let Ok(pid) = libc::pid_t::try_from(*pid) {
            // SAFETY: kill(2) on a process of this node's host; no memory effects.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while ours.iter().any(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What every node is started with.
pub struct NodesConfig {
    pub count: u16,
    /// Nodes are `<base>-1` … `<base>-N`.
    pub base: String,
    pub data_dir: PathBuf,
    /// Node `<name>`'s Pods get cgroups below `<cgroup_parent>/<name>`.
    pub cgroup_parent: String,
    /// The control plane's port on the gateway.
    pub port: u16,
    pub service_cidr: Ipv4Cidr,
    pub proxy_mode: proxy::Backend,
    /// More flags for every agent.
    pub agent_args: Vec<String>,
    /// The agents' kubelet endpoint port and container log rotation (`gitplane agent` flags).
    pub kubelet_port: u16,
    pub container_log_max_size: String,
    pub container_log_max_files: u16,
    /// The registries file every agent is given (`--registries`).
    pub registries: Option<PathBuf>,
}

/// One node: its host, containerd and agent.
struct LocalNode {
    agent: Option<Child>,
    containerd: Option<Containerd>,
    /// Last, so that it is dropped last: dropping it kills what is left in the host.
    place: Place,
}

/// Where a node lives and what its agent is started with.
struct Place {
    name: String,
    address: Ipv4Addr,
    dir: PathBuf,
    /// The node's containerd (its socket and CNI directory are the agent's too).
    runtime: ContainerdConfig,
    host: NetnsHost,
}

/// Starts the nodes, prints `banner` with them, waits for `stop`, then removes everything it
/// made (also when starting fails half-way).
pub async fn run(
    cfg: NodesConfig,
    network: HostNetwork,
    Survivors(mut survivors): Survivors,
    banner: String,
    stop: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let mut nodes = Vec::new();
    let result = async {
        for i in 1..=cfg.count {
            nodes.push(start_node(&cfg, &network, i, survivors.remove(&i)).await?);
        }
        let list: Vec<String> = nodes
            .iter()
            .map(|n| &n.place)
            .map(|n| {
                format!(
                    "{} {} (ip netns exec {} …; log {})",
                    n.name,
                    n.address,
                    n.name,
                    n.dir.join("agent.log").display()
                )
            })
            .collect();
        println!("{banner}\n  nodes:  {}", list.join("\n          "));
        let (stopping, stopped) = watch::channel(false);
        let supervisors = futures::future::join_all(nodes.iter_mut().map(|n| supervise(&cfg, n, stopped.clone())));
        tokio::pin!(supervisors);
        tokio::select! {
            _ = stop => {}
            _ = &mut supervisors => {}
        }
        let _ = stopping.send(true);
        supervisors.await;
        anyhow::Ok(())
    }
    .await;
    tracing::info!("stopping the nodes: removing their pods");
    stop_nodes(nodes, &cfg.cgroup_parent).await;
    drop_blocking(network).await;
    result
}

/// Starts node `i`: in `survivor`, the host a killed run left (wired to the network still), or
/// in a new host.
async fn start_node(
    cfg: &NodesConfig,
    network: &HostNetwork,
    i: u16,
    survivor: Option<NetnsHost>,
) -> anyhow::Result<LocalNode> {
    let name = format!("{}-{i}", cfg.base);
    let dir = cfg.data_dir.join("nodes").join(&name);
    let address = node_address(i);
    let fresh = survivor.is_none();
    let host = match survivor {
        Some(host) => {
            blocking(move || {
                replace_processes(&host);
                Ok(host)
            })
            .await?
        }
        None => {
            let (name, host_dir, cgroup) = (name.clone(), dir.join("host"), format!("{}/{name}", cfg.cgroup_parent));
            blocking(move || NetnsHost::create(&name, host_dir, cgroup)).await?
        }
    };
    let runtime = gitplane_testkit::node::containerd_config(&host, &dir);
    // From here on, dropping `node` removes what was made for it.
    let place = Place { name: name.clone(), address, dir: dir.clone(), runtime, host };
    let mut node = LocalNode { agent: None, containerd: None, place };
    if fresh {
        network.attach(&node.place.host, &format!("veth{i}"), address)?;
    }

    let images = cfg.data_dir.join("images");
    let (containerd, _) = gitplane_testkit::node::start_containerd(&name, node.place.runtime.clone(), &images).await?;
    // Its paths made absolute, as the agent gets them.
    node.place.runtime = containerd.config().clone();
    node.containerd = Some(containerd);

    node.agent = Some(spawn_agent(cfg, &node.place)?);
    tracing::info!(node = %name, %address, "node started");
    Ok(node)
}

/// Starts `node`'s agent inside its host, appending to its `agent.log`.
fn spawn_agent(cfg: &NodesConfig, node: &Place) -> anyhow::Result<Child> {
    let (name, address, dir) = (&node.name, node.address, &node.dir);
    let (socket, cni_conf_dir) = (node.runtime.socket(), &node.runtime.cni_conf_dir);
    let exe = std::env::current_exe().context("finding the gitplane binary to run the agents")?;
    let log = std::fs::File::options()
        .create(true)
        .append(true)
        .open(dir.join("agent.log"))
        .context("opening the agent's log")?;
    let mut agent = node.host.command(exe);
    agent
        .arg("agent")
        // The bridge is not loopback: the replica serves TLS there, with the cluster CA.
        .arg(format!("--server=https://{GATEWAY}:{}", cfg.port))
        .arg("--certificate-authority")
        .arg(cfg.data_dir.join("ca.crt"))
        .arg(format!("--node-name={name}"))
        .arg(format!("--node-ip={address}"))
        .arg(format!("--service-cidr={}", cfg.service_cidr))
        .arg(format!("--proxy-mode={}", cfg.proxy_mode))
        .arg(format!("--kubelet-port={}", cfg.kubelet_port))
        .arg(format!("--container-log-max-size={}", cfg.container_log_max_size))
        .arg(format!("--container-log-max-files={}", cfg.container_log_max_files))
        .arg(format!("--cgroup-parent={}", node.host.cgroup_parent()))
        .arg("--remove-pods-on-exit")
        .arg("--containerd-socket")
        .arg(&socket)
        .arg("--cni-conf-dir")
        .arg(cni_conf_dir)
        .arg("--cni-data-dir")
        .arg(dir.join("cni/ipam"))
        .arg("--pod-dir")
        .arg(dir.join("pods"))
        .arg("--pod-log-dir")
        .arg(dir.join("pods/logs"))
        .arg("--local-path-dir")
        .arg(dir.join("storage"))
        .arg("--seccomp-profile-root")
        .arg(dir.join("seccomp"))
        .arg("--join-token-file")
        .arg(cfg.data_dir.join("join-token"))
        .arg("--credential-file")
        .arg(dir.join("node-credential"))
        .args(&cfg.agent_args)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(log.try_clone().context("the agent's log")?)
        .stderr(log)
        // Its own process group: a Ctrl-C in the terminal reaches `gitplane up`, which stops
        // the agents in order, not every process at once.
        .process_group(0);
    if let Some(file) = &cfg.registries {
        agent.arg("--registries").arg(file).arg("--registry-config-path").arg(node.runtime.registry_config_path());
    }
    let agent = tokio::process::Command::from(agent).spawn().with_context(|| format!("starting {name}'s agent"))?;
    tracing::info!(node = %name, pid = agent.id(), "agent started");
    Ok(agent)
}

/// Keeps `node`'s containerd and agent running until `stop`: each that exits is started again
/// after its [`Backoff`], as systemd's `Restart=` does, except an agent that exits cleanly (it
/// was asked to stop), which leaves its node down until the next start. A node whose network
/// namespace is deleted (`ip netns del`) has lost its network for good: it is removed, its
/// processes killed, and the control plane finds it unreachable and moves its Pods.
async fn supervise(cfg: &NodesConfig, node: &mut LocalNode, mut stop: watch::Receiver<bool>) {
    let LocalNode { agent, containerd, place } = node;
    let (stopping, stopped) = watch::channel(false);
    let netns = place.host.netns_id();
    let control = async {
        let lost = tokio::select! {
            _ = stop.wait_for(|s| *s) => false,
            _ = netns_lost(&place.host, netns) => true,
        };
        let _ = stopping.send(true);
        lost
    };
    let runtime = async {
        match containerd.take() {
            Some(running) => running.supervise(stopped.clone()).await,
            None => None,
        }
    };
    let (lost, running, ()) = tokio::join!(control, runtime, supervise_agent(cfg, place, agent, stopped.clone()));
    *containerd = running;
    if !lost {
        return;
    }
    tracing::error!(
        node = %place.name,
        "the node's network namespace was deleted: removing the node (its Pods move once the control plane finds it \
         unreachable; start gitplane up again to make it anew)"
    );
    if let Some(mut running) = agent.take() {
        let _ = running.kill().await;
    }
    if let Some(running) = containerd.take()
        && let Err(e) = running.stop().await
    {
        tracing::warn!(node = %place.name, error = %e, "stopping containerd");
    }
    // Blocking (it waits for processes to die), on this multi-threaded runtime's own thread.
    tokio::task::block_in_place(|| place.host.remove());
    let _ = stop.wait_for(|s| *s).await;
}

/// Until `ip netns` no longer names the namespace `netns` identifies (checked every second).
async fn netns_lost(host: &NetnsHost, netns: Option<(u64, u64)>) {
    let Some(netns) = netns else { return std::future::pending().await };
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        if !host.netns_is(netns) {
            return;
        }
    }
}

async fn supervise_agent(cfg: &NodesConfig, place: &Place, agent: &mut Option<Child>, mut stop: watch::Receiver<bool>) {
    let name = &place.name;
    let mut backoff = Backoff::new(Instant::now());
    loop {
        let Some(running) = agent.as_mut() else {
            let _ = stop.wait_for(|s| *s).await;
            return;
        };
        let status = tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            status = running.wait() => status,
        };
        *agent = None;
        if status.as_ref().is_ok_and(|s| s.success()) {
            tracing::warn!(node = %name, "the node's agent stopped; the node stays down until gitplane up restarts");
            continue;
        }
        let delay = backoff.failed(Instant::now());
        tracing::warn!(node = %name, ?status, restart_in = ?delay, "the node's agent failed; restarting it");
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            _ = tokio::time::sleep(delay) => {}
        }
        backoff.started(Instant::now());
        match spawn_agent(cfg, place) {
            Ok(started) => *agent = Some(started),
            Err(e) => tracing::error!(node = %name, error = %e, "restarting the agent failed; the node stays down"),
        }
    }
}

/// Asks every agent to stop (they remove their Pods), then stops each containerd and removes
/// the hosts.
async fn stop_nodes(nodes: Vec<LocalNode>, cgroup_parent: &str) {
    let stops = nodes.into_iter().map(|mut node| async move {
        if let Some(mut agent) = node.agent.take() {
            if let Some(pid) = agent.id().and_then(|p| libc::pid_t::try_from(p).ok()) {
                // SAFETY: kill(2) on our own child, not yet reaped.
                unsafe { libc::kill(pid, libc::SIGTERM) };
            }
            if tokio::time::timeout(AGENT_STOP, agent.wait()).await.is_err() {
                tracing::warn!(node = %node.place.name, "the agent did not stop in time; killing it");
                let _ = agent.kill().await;
            }
        }
        if let Some(containerd) = node.containerd.take()
            && let Err(e) = containerd.stop().await
        {
            tracing::warn!(node = %node.place.name, error = %e, "stopping containerd");
        }
        // Kills whatever is left in the host and removes it.
        drop_blocking(node).await;
    });
    futures::future::join_all(stops).await;
    gitplane_testkit::node::remove_cgroup(cgroup_parent);
}

/// Runs blocking host set-up off the async threads.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, HostError> + Send + 'static) -> anyhow::Result<T> {
    Ok(tokio::task::spawn_blocking(f).await.context("a host set-up task panicked")??)
}

/// Drops (tears down) a host or network off the async threads: it waits for processes to die.
async fn drop_blocking<T: Send + 'static>(value: T) {
    let _ = tokio::task::spawn_blocking(move || drop(value)).await;
}
