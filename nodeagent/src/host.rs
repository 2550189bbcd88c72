//! Network-namespace hosts: the machines of a cluster that runs on one machine, as
//! `gitplane up --nodes N` makes them and the end-to-end tests use them (one code path for both).
//!
//! A [`NetnsHost`] is a network namespace (`ip netns`) and a pinned mount namespace of its own,
//! in which a node's containerd and agent run ([`NetnsHost::launcher`]). A [`HostNetwork`] is
//! the wire between hosts: a network namespace holding a bridge, with a veth into each host.
//! Nothing is added to the namespaces of the machine itself: Pod and Service addresses and
//! routes exist only inside hosts. Everything is undone on drop, also after a failure:
//! processes in a host's mount namespace or under its cgroup parent are killed, cgroups
//! removed, mounts detached, the host's directory and the namespaces deleted.
//!
//! Why the mount namespace is pinned (shared/ENVIRONMENT.md): every `ip netns exec` makes a
//! fresh mount namespace, so a containerd restarted that way would lose sight of its Pods'
//! netns, rootfs and shm mounts. And `/sys` must be a sysfs of the host's netns, with the
//! cgroup hierarchies mounted again below it, or runc finds no cgroup mounts.
//!
//! Needs root, `ip` (iproute2), `unshare`, `nsenter` and `mount` (util-linux). The topology is
//! made with iproute2 commands, once; what nodes keep in step at run time (routes) goes over
//! netlink (`routes::netlink`).

use gitplane_kubelet::netns::in_netns;
use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Where `ip netns` keeps its namespaces.
const NETNS_DIR: &str = "/run/netns";
/// The bridge in a [`HostNetwork`]'s namespace.
const BRIDGE: &str = "br0";

#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error(
        "network namespace {name} exists already: another cluster uses the name, or a run that was killed left it \
         (remove it with `ip netns del {name}`, or choose another name)"
    )]
    Exists { name: String },
    #[error("{command} failed ({status}): {stderr}")]
    Command { command: String, status: String, stderr: String },
    #[error("{what}: {source}")]
    Io { what: String, source: std::io::Error },
}

fn io_error(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> HostError {
    let what = what.into();
    move |source| HostError::Io { what, source }
}

/// Runs a command to completion; its stderr goes into the error.
fn run(command: &mut Command) -> Result<(), HostError> {
    let text = format!("{command:?}");
    let out = command.stdin(Stdio::null()).output().map_err(io_error(format!("running {text}")))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr).trim().to_owned();
        return Err(HostError::Command { command: text, status: out.status.to_string(), stderr });
    }
    Ok(())
}

fn ip(args: &[&str]) -> Result<(), HostError> {
    run(Command::new("ip").args(args))
}

fn add_netns(name: &str) -> Result<(), HostError> {
    if Path::new(NETNS_DIR).join(name).exists() {
        return Err(HostError::Exists { name: name.to_owned() });
    }
    ip(&["netns", "add", name])?;
    ip(&["-n", name, "link", "set", "lo", "up"])
}

/// One network-namespace host. See the module docs.
#[derive(Debug)]
pub struct NetnsHost {
    name: String,
    dir: PathBuf,
    cgroup_parent: String,
    /// The bind mount that pins the host's mount namespace.
    mount_ns: PathBuf,
    netns_created: bool,
    dir_mounted: bool,
    mount_ns_pinned: bool,
}

impl NetnsHost {
    /// Makes host `name` (also its netns's name). `dir` holds the pin of its mount namespace and
    /// whatever the caller puts there; it is removed on drop. Pods of the host get cgroups below
    /// `cgroup_parent`, which is removed on drop too.
    pub fn create(name: &str, dir: PathBuf, cgroup_parent: String) -> Result<NetnsHost, HostError> {
        let mut host = NetnsHost {
            name: name.to_owned(),
            mount_ns: dir.join("mnt"),
            dir,
            cgroup_parent,
            netns_created: false,
            dir_mounted: false,
            mount_ns_pinned: false,
        };
        host.setup()?;
        Ok(host)
    }

    /// The host a killed process left (its netns, the pin in `dir`, its cgroups): dropping it
    /// removes whatever remains of it; if it [`survives`](Self::survives), it may be used again.
    pub fn adopt(name: &str, dir: PathBuf, cgroup_parent: String) -> NetnsHost {
        let mount_ns = dir.join("mnt");
        NetnsHost {
            name: name.to_owned(),
            netns_created: Path::new(NETNS_DIR).join(name).exists(),
            dir_mounted: mount_ns.exists(),
            mount_ns_pinned: mount_ns.exists(),
            mount_ns,
            dir,
            cgroup_parent,
        }
    }

    /// Whether the host is whole: its network namespace is there and its mount namespace is
    /// still pinned (a reboot leaves neither, a deleted netns only the latter).
    pub fn survives(&self) -> bool {
        let pinned = std::fs::read_to_string("/proc/self/mountinfo")
            .is_ok_and(|m| m.lines().any(|l| l.split(' ').nth(4) == Some(&*self.mount_ns.to_string_lossy())));
        pinned && self.netns_path().exists()
    }

    /// The identity of the host's network namespace (device and inode of its `ip netns` file):
    /// what [`Self::netns_is`] compares, to notice the namespace deleted or replaced.
    pub fn netns_id(&self) -> Option<(u64, u64)> {
        std::fs::metadata(self.netns_path()).ok().map(|m| (m.dev(), m.ino()))
    }

    /// Whether `ip netns` still names the namespace `id` was taken from.
    pub fn netns_is(&self, id: (u64, u64)) -> bool {
        self.netns_id() == Some(id)
    }

    /// The processes in the host's mount namespace (containerd, shims, the agent; containers
    /// have mount namespaces of their own).
    pub fn processes(&self) -> Vec<u32> {
        let Ok(ours) = std::fs::metadata(&self.mount_ns).map(|m| (m.dev(), m.ino())) else { return Vec::new() };
        let Ok(procs) = std::fs::read_dir("/proc") else { return Vec::new() };
        procs
            .flatten()
            .filter_map(|entry| {
                let pid = entry.file_name().to_str()?.parse::<u32>().ok()?;
                let ns = std::fs::metadata(entry.path().join("ns/mnt")).ok()?;
                ((ns.dev(), ns.ino()) == ours).then_some(pid)
            })
            .collect()
    }

    fn setup(&mut self) -> Result<(), HostError> {
        add_netns(&self.name)?;
        self.netns_created = true;

        std::fs::create_dir_all(&self.dir).map_err(io_error(format!("mkdir {}", self.dir.display())))?;
        // `unshare --mount=<file>` needs the file on a private mount.
        run(Command::new("mount").arg("--bind").arg(&self.dir).arg(&self.dir))?;
        self.dir_mounted = true;
        run(Command::new("mount").arg("--make-private").arg(&self.dir))?;
        std::fs::write(&self.mount_ns, b"").map_err(io_error(format!("creating {}", self.mount_ns.display())))?;
        let mut pin = Command::new("unshare");
        pin.arg(format!("--mount={}", self.mount_ns.display())).args(["--propagation", "slave", "true"]);
        run(&mut pin)?;
        self.mount_ns_pinned = true;

        // Inside: a sysfs of this netns, and the machine's cgroup hierarchies below it again.
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").map_err(io_error("reading mountinfo"))?;
        let mut script =
            String::from("set -e\nmount -t sysfs sysfs /sys\nmount -t tmpfs -o mode=755 cgroup /sys/fs/cgroup\n");
        for (mount_point, fstype, options) in cgroup_mounts(&mountinfo) {
            let Some(name) = mount_point.strip_prefix("/sys/fs/cgroup/") else {
                continue;
            };
            let target = format!("/sys/fs/cgroup/{name}");
            script.push_str(&format!("mkdir -p '{target}'\n"));
            if fstype == "cgroup2" {
                script.push_str(&format!("mount -t cgroup2 cgroup2 '{target}'\n"));
            } else {
                script.push_str(&format!("mount -t cgroup -o '{options}' cgroup '{target}'\n"));
            }
        }
        run(self.command("sh").args(["-c", &script]))
    }

    /// The netns name (`ip netns`), also the host's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The host's private directory; removed on drop.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn netns_path(&self) -> PathBuf {
        Path::new(NETNS_DIR).join(&self.name)
    }

    /// The cgroupfs parent of this host's Pods; whatever is below it is killed and removed on
    /// drop.
    pub fn cgroup_parent(&self) -> &str {
        &self.cgroup_parent
    }

    /// The command prefix that runs a program inside the host: its mount namespace and netns.
    /// `nsenter` execs the program, so the spawned pid is the program's own.
    pub fn launcher(&self) -> Vec<String> {
        vec![
            "nsenter".into(),
            format!("--mount={}", self.mount_ns.display()),
            format!("--net={}", self.netns_path().display()),
            "--".into(),
        ]
    }

    /// `program` run inside the host.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let launcher = self.launcher();
        let mut command = Command::new(&launcher[0]);
        command.args(&launcher[1..]).arg(program);
        command
    }

    /// Runs `f` on a thread in this host's netns (see [`in_netns`]).
    pub fn in_netns<T: Send>(&self, f: impl FnOnce() -> std::io::Result<T> + Send) -> std::io::Result<T> {
        in_netns(&self.netns_path(), f)
    }

    /// Kills what runs in this host: processes under its cgroup parent (containers) and any
    /// process in its mount namespace (containerd, shims, the agent).
    fn kill_all(&self) {
        let mut victims: HashSet<u32> = HashSet::new();
        if let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") {
            for (mount_point, _, _) in cgroup_mounts(&mountinfo) {
                collect_cgroup_procs(&Path::new(&mount_point).join(self.cgroup_dir()), &mut victims);
            }
        }
        if self.mount_ns_pinned {
            victims.extend(self.processes());
        }
        victims.remove(&std::process::id());
        for pid in &victims {
            if let Ok(pid) = libc::pid_t::try_from(*pid) {
                // SAFETY: kill(2) on a process of this host; no memory effects.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        poll(Duration::from_secs(5), || {
            victims.retain(|pid| {
                if let Ok(p) = libc::pid_t::try_from(*pid) {
                    // Reap it if it is our child; harmless otherwise.
                    // SAFETY: waitpid with WNOHANG and a null status pointer.
                    unsafe { libc::waitpid(p, std::ptr::null_mut(), libc::WNOHANG) };
                }
                is_alive(*pid)
            });
            victims.is_empty()
        });
    }

    fn cgroup_dir(&self) -> &str {
        self.cgroup_parent.trim_start_matches('/')
    }
}

impl NetnsHost {
    /// Removes the host now (what dropping it does): kills what runs in it, removes its cgroups,
    /// mounts, directory and namespace.
    pub fn remove(&mut self) {
        self.kill_all();
        if let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") {
            // One deadline for every hierarchy: a teardown takes seconds, not seconds each.
            let deadline = Instant::now() + Duration::from_secs(2);
            for (mount_point, _, _) in cgroup_mounts(&mountinfo) {
                let parent = Path::new(&mount_point).join(self.cgroup_dir());
                let left = deadline.saturating_duration_since(Instant::now());
                if !poll(left, || remove_cgroup_tree(&parent).is_ok()) {
                    tracing::warn!(host = %self.name, cgroup = %parent.display(), "cgroup left behind");
                }
            }
        }
        if self.mount_ns_pinned {
            detach(&self.mount_ns);
        }
        if self.dir_mounted {
            detach(&self.dir);
        }
        if let Err(e) = std::fs::remove_dir_all(&self.dir)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(host = %self.name, dir = %self.dir.display(), error = %e, "removing the host's directory");
        }
        // A namespace deleted under it (`ip netns del`) is gone already.
        if self.netns_created
            && self.netns_path().exists()
            && let Err(e) = ip(&["netns", "del", &self.name])
        {
            tracing::warn!(host = %self.name, error = %e, "removing the host's network namespace");
        }
        (self.netns_created, self.dir_mounted, self.mount_ns_pinned) = (false, false, false);
    }
}

impl Drop for NetnsHost {
    fn drop(&mut self) {
        self.remove();
    }
}

/// The wire between [`NetnsHost`]s: a bridge in a network namespace of its own, whose address
/// (the gateway) is where the hosts reach whatever listens in that namespace (the control
/// plane). Removed on drop.
#[derive(Debug)]
pub struct HostNetwork {
    name: String,
    gateway: Ipv4Addr,
    prefix: u8,
}

/// Removes network namespace `name` when it exists (the [`HostNetwork`] of a killed process).
pub fn remove_netns(name: &str) -> Result<(), HostError> {
    if !Path::new(NETNS_DIR).join(name).exists() {
        return Ok(());
    }
    ip(&["netns", "del", name])
}

impl HostNetwork {
    /// Makes namespace `name` with a bridge holding `gateway`/`prefix`.
    pub fn create(name: &str, gateway: Ipv4Addr, prefix: u8) -> Result<HostNetwork, HostError> {
        add_netns(name)?;
        let network = HostNetwork { name: name.to_owned(), gateway, prefix };
        let address = format!("{gateway}/{prefix}");
        ip(&["-n", name, "link", "add", BRIDGE, "type", "bridge"])?;
        ip(&["-n", name, "addr", "add", &address, "dev", BRIDGE])?;
        ip(&["-n", name, "link", "set", BRIDGE, "up"])?;
        Ok(network)
    }

    /// The network a killed process left as `name`, if its bridge still holds `gateway`/`prefix`:
    /// its hosts are still wired to it.
    pub fn adopt(name: &str, gateway: Ipv4Addr, prefix: u8) -> Option<HostNetwork> {
        if !Path::new(NETNS_DIR).join(name).exists() {
            return None;
        }
        let out = Command::new("ip").args(["-n", name, "-o", "-4", "addr", "show", "dev", BRIDGE]).output().ok()?;
        let held = String::from_utf8_lossy(&out.stdout).contains(&format!("inet {gateway}/{prefix} "));
        held.then(|| HostNetwork { name: name.to_owned(), gateway, prefix })
    }

    pub fn gateway(&self) -> Ipv4Addr {
        self.gateway
    }

    pub fn netns_path(&self) -> PathBuf {
        Path::new(NETNS_DIR).join(&self.name)
    }

    /// Wires `host` to the bridge: its `eth0` gets `address` (in the bridge's subnet) and a
    /// default route through the gateway, as a machine has one; the bridge's namespace forwards
    /// nothing, so traffic for anywhere else ends there. The bridge's side is `port` (an
    /// interface name, unique in this network).
    pub fn attach(&self, host: &NetnsHost, port: &str, address: Ipv4Addr) -> Result<(), HostError> {
        let net = self.name.as_str();
        ip(&["-n", net, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", host.name()])?;
        ip(&["-n", net, "link", "set", port, "master", BRIDGE, "up"])?;
        ip(&["-n", host.name(), "addr", "add", &format!("{address}/{}", self.prefix), "dev", "eth0"])?;
        ip(&["-n", host.name(), "link", "set", "eth0", "up"])?;
        ip(&["-n", host.name(), "route", "add", "default", "via", &self.gateway.to_string()])
    }

    /// A TCP listener on the gateway address, made inside this namespace: the hosts reach it,
    /// the machine's own namespaces do not.
    pub fn listen(&self, port: u16) -> Result<std::net::TcpListener, HostError> {
        let addr = (self.gateway, port);
        in_netns(&self.netns_path(), || {
            let listener = std::net::TcpListener::bind(addr)?;
            listener.set_nonblocking(true)?;
            Ok(listener)
        })
        .map_err(io_error(format!("listening on {}:{port} in network namespace {}", self.gateway, self.name)))
    }
}

impl Drop for HostNetwork {
    fn drop(&mut self) {
        // The veths go with it; a listener made in it keeps the namespace until it is closed.
        if let Err(e) = ip(&["netns", "del", &self.name]) {
            tracing::warn!(network = %self.name, error = %e, "removing the host network's namespace");
        }
    }
}

/// Polls `done` every 20 ms until it holds or `timeout` passes; whether it held.
fn poll(timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// (mount point, fstype, super options without `rw`) of every cgroup mount in a mountinfo.
fn cgroup_mounts(mountinfo: &str) -> Vec<(String, String, String)> {
    let mut mounts = Vec::new();
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let mut right = right.split(' ');
        let (Some(fstype), Some(_source), Some(options)) = (right.next(), right.next(), right.next()) else {
            continue;
        };
        let Some(mount_point) = left.split(' ').nth(4) else {
            continue;
        };
        if fstype == "cgroup" || fstype == "cgroup2" {
            let options: Vec<&str> = options.split(',').filter(|o| !matches!(*o, "rw" | "ro")).collect();
            mounts.push((mount_point.to_string(), fstype.to_string(), options.join(",")));
        }
    }
    mounts
}

fn collect_cgroup_procs(dir: &Path, pids: &mut HashSet<u32>) {
    if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        pids.extend(procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                collect_cgroup_procs(&entry.path(), pids);
            }
        }
    }
}

fn remove_cgroup_tree(dir: &Path) -> std::io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_cgroup_tree(&entry.path())?;
        }
    }
    match std::fs::remove_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// Lazy unmount (MNT_DETACH): whatever still uses it keeps it until done.
fn detach(path: &Path) {
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return;
    };
    // SAFETY: umount2 with a valid NUL-terminated path.
    if unsafe { libc::umount2(c_path.as_ptr(), libc::MNT_DETACH) } != 0 {
        tracing::warn!(path = %path.display(), error = %std::io::Error::last_os_error(), "unmounting");
    }
}

fn is_alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // A zombie is dead for our purposes (its parent reaps it).
    stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next()) != Some("Z")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_mounts_keep_subsystem_options() {
        let mountinfo = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
        assert_eq!(
            cgroup_mounts(mountinfo),
            [
                ("/sys/fs/cgroup/cpu".into(), "cgroup".into(), "cpu".into()),
                ("/sys/fs/cgroup/systemd".into(), "cgroup".into(), "name=systemd".into()),
                ("/sys/fs/cgroup/unified".into(), "cgroup2".into(), String::new()),
            ]
        );
    }

    #[test]
    fn a_zombie_or_missing_process_is_not_alive() {
        assert!(is_alive(std::process::id()));
        assert!(!is_alive(u32::MAX));
    }
}
