//! gitplane's end-to-end test harness.
//!
//! [`NetnsHost`] is a *network-namespace host*: a stand-in for one machine of a cluster, made of
//! a network namespace (`ip netns`) and a pinned mount namespace of its own, in which a test
//! starts a node's containerd (see [`NetnsHost::launcher`]) and from which it sends traffic
//! ([`NetnsHost::http_get`]). Pod (10.244.0.0/16) and Service (10.96.0.0/12) traffic therefore
//! never leaves namespaces the test made. Everything is undone on drop, also when the test
//! panics: processes in the host's mount namespace or under its cgroup parent are killed,
//! cgroups removed, mounts detached, the directory and the netns deleted.
//!
//! Why the mount namespace is pinned (see shared/ENVIRONMENT.md): every `ip netns exec` makes a
//! fresh mount namespace, so a containerd restarted that way would lose sight of its pods'
//! netns, rootfs and shm mounts. And `/sys` must be a sysfs of the node's netns, with the cgroup
//! hierarchies mounted again below it, or runc finds no cgroup mounts.
//!
//! Needs root, `ip` (iproute2), `unshare`/`nsenter`/`mount` (util-linux).
//!
//! [`Gitplane`] runs the real `gitplane up` inside such a host, and [`Worktree`] drives a Git
//! working copy with the real `git` command, as a user pushes.

pub mod cluster;
pub mod failover;
mod gitplane;
pub mod linearizability;
pub use gitplane::{Gitplane, Worktree, binary};

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// Fails unless this process can make namespaces: an end-to-end test never passes by skipping.
pub fn require_root() -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!(
            "end-to-end tests need root (network namespaces, mounts, containerd): run the README's test command as root"
        );
    }
    Ok(())
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

/// [`wait_for`] for async probes.
pub async fn wait_for_async<T, F>(timeout: Duration, mut probe: impl FnMut() -> F) -> Option<T>
where
    F: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = probe().await {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

static HOSTS_MADE: AtomicU32 = AtomicU32::new(0);

/// One network-namespace host. See the crate docs.
#[derive(Debug)]
pub struct NetnsHost {
    name: String,
    dir: PathBuf,
    /// The bind mount that pins the host's mount namespace.
    mount_ns: PathBuf,
    netns_created: bool,
    dir_mounted: bool,
    mount_ns_pinned: bool,
    /// Processes started through [`NetnsHost::spawn`]: (pid, start time) so a reused pid is
    /// never killed.
    spawned: Mutex<Vec<(u32, u64)>>,
}

impl NetnsHost {
    /// Makes a host named `<prefix><pid>x<n>` (at most 15 characters, so it also fits interface
    /// names derived from it).
    pub fn create(prefix: &str) -> Result<NetnsHost> {
        let suffix = format!("{}x{}", std::process::id(), HOSTS_MADE.fetch_add(1, Ordering::Relaxed));
        let keep = 15usize.saturating_sub(suffix.len()).min(prefix.len());
        let name = format!("{}{suffix}", &prefix[..keep]);
        let dir = std::env::temp_dir().join("gitplane-e2e").join(&name);
        let mut host = NetnsHost {
            mount_ns: dir.join("mnt"),
            dir,
            name,
            netns_created: false,
            dir_mounted: false,
            mount_ns_pinned: false,
            spawned: Mutex::new(Vec::new()),
        };
        // Leftovers of a crashed run with the same pid: nobody else can own this name.
        if Path::new("/run/netns").join(&host.name).exists() {
            let _ = Command::new("ip").args(["netns", "del", &host.name]).status();
        }
        host.setup().with_context(|| format!("creating network-namespace host {}", host.name))?;
        Ok(host)
    }

    fn setup(&mut self) -> Result<()> {
        run(Command::new("ip").args(["netns", "add", &self.name]))?;
        self.netns_created = true;
        run(Command::new("ip").args(["-n", &self.name, "link", "set", "lo", "up"]))?;

        std::fs::create_dir_all(&self.dir).with_context(|| format!("mkdir {}", self.dir.display()))?;
        // `unshare --mount=<file>` needs the file on a private mount.
        run(Command::new("mount").arg("--bind").arg(&self.dir).arg(&self.dir))?;
        self.dir_mounted = true;
        run(Command::new("mount").arg("--make-private").arg(&self.dir))?;
        std::fs::write(&self.mount_ns, b"").with_context(|| format!("creating {}", self.mount_ns.display()))?;
        let mut pin = Command::new("unshare");
        pin.arg(format!("--mount={}", self.mount_ns.display())).args(["--propagation", "slave", "true"]);
        run(&mut pin)?;
        self.mount_ns_pinned = true;

        // Inside: a sysfs of this netns, and the host's cgroup hierarchies below it again.
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").context("reading /proc/self/mountinfo")?;
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
        run(self.command("sh").args(["-c", &script]))?;
        Ok(())
    }

    /// The netns name (`ip netns`), also the host's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A private directory for this host's state (containerd root, CNI, logs); removed on drop.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn netns_path(&self) -> PathBuf {
        Path::new("/run/netns").join(&self.name)
    }

    /// A cgroupfs parent for this host's pods; whatever is left below it is killed and removed
    /// on drop.
    pub fn cgroup_parent(&self) -> String {
        format!("/gitplane-e2e-{}", self.name)
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

    /// Spawns `command` (usually from [`NetnsHost::command`]) and remembers it to kill on drop.
    pub fn spawn(&self, command: &mut Command) -> Result<Child> {
        let child = command.spawn().with_context(|| format!("spawning {command:?}"))?;
        if let Some(start) = start_time(child.id()) {
            self.spawned.lock().unwrap_or_else(|p| p.into_inner()).push((child.id(), start));
        }
        Ok(child)
    }

    /// Runs `f` on a thread that has entered this host's netns: sockets made there keep it.
    pub fn in_netns<T: Send>(&self, f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
        let netns = std::fs::File::open(self.netns_path())
            .with_context(|| format!("opening {}", self.netns_path().display()))?;
        std::thread::scope(|scope| {
            scope
                .spawn(move || {
                    // SAFETY: setns on an open netns fd; it only affects this thread.
                    if unsafe { libc::setns(netns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                        return Err(std::io::Error::last_os_error()).context("setns(CLONE_NEWNET)");
                    }
                    f()
                })
                .join()
                .unwrap_or_else(|_| bail!("thread in netns panicked"))
        })
    }

    /// Opens (and closes) a TCP connection from inside the host.
    pub fn tcp_connect(&self, addr: SocketAddr, timeout: Duration) -> Result<()> {
        self.in_netns(|| {
            TcpStream::connect_timeout(&addr, timeout).with_context(|| format!("connecting to {addr}"))?;
            Ok(())
        })
    }

    /// `GET path` over HTTP/1.0 from inside the host; the body of a 2xx answer.
    pub fn http_get(&self, addr: SocketAddr, path: &str, timeout: Duration) -> Result<String> {
        self.in_netns(|| {
            let mut stream =
                TcpStream::connect_timeout(&addr, timeout).with_context(|| format!("connecting to {addr}"))?;
            stream.set_read_timeout(Some(timeout))?;
            stream.set_write_timeout(Some(timeout))?;
            write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\nConnection: close\r\n\r\n")?;
            let mut response = Vec::new();
            stream.read_to_end(&mut response).with_context(|| format!("reading the answer of {addr}"))?;
            let response = String::from_utf8_lossy(&response);
            let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
            let status = head.lines().next().unwrap_or("");
            if !status.split(' ').nth(1).is_some_and(|code| code.starts_with('2')) {
                bail!("GET http://{addr}{path}: {status:?}");
            }
            Ok(body.to_string())
        })
    }

    /// Kills what runs in this host: spawned processes, processes under its cgroup parent
    /// (containers) and any process in its mount namespace (containerd, shims).
    fn kill_all(&self) {
        let mut victims: HashSet<u32> = HashSet::new();
        for (pid, start) in self.spawned.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            if start_time(*pid) == Some(*start) {
                victims.insert(*pid);
            }
        }
        if let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") {
            for (mount_point, _, _) in cgroup_mounts(&mountinfo) {
                let parent = Path::new(&mount_point).join(self.cgroup_parent().trim_start_matches('/'));
                collect_cgroup_procs(&parent, &mut victims);
            }
        }
        if self.mount_ns_pinned
            && let Ok(ours) = std::fs::metadata(&self.mount_ns).map(|m| (m.dev(), m.ino()))
            && let Ok(procs) = std::fs::read_dir("/proc")
        {
            for entry in procs.flatten() {
                let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else {
                    continue;
                };
                if std::fs::metadata(entry.path().join("ns/mnt")).is_ok_and(|m| (m.dev(), m.ino()) == ours) {
                    victims.insert(pid);
                }
            }
        }
        victims.remove(&std::process::id());
        for pid in &victims {
            if let Ok(pid) = libc::pid_t::try_from(*pid) {
                // SAFETY: kill(2) on a process of this host; no memory effects.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                // Reap it if it is our child; harmless otherwise.
                // SAFETY: waitpid with WNOHANG and a null status pointer.
                unsafe { libc::waitpid(pid, std::ptr::null_mut(), libc::WNOHANG) };
            }
        }
        wait_for(Duration::from_secs(5), || {
            victims.retain(|pid| {
                if let Ok(p) = libc::pid_t::try_from(*pid) {
                    // SAFETY: as above.
                    unsafe { libc::waitpid(p, std::ptr::null_mut(), libc::WNOHANG) };
                }
                is_alive(*pid)
            });
            victims.is_empty().then_some(())
        });
    }
}

impl Drop for NetnsHost {
    fn drop(&mut self) {
        self.kill_all();
        if let Ok(mountinfo) = std::fs::read_to_string("/proc/self/mountinfo") {
            for (mount_point, _, _) in cgroup_mounts(&mountinfo) {
                let parent = Path::new(&mount_point).join(self.cgroup_parent().trim_start_matches('/'));
                let _ = wait_for(Duration::from_secs(2), || remove_cgroup_tree(&parent).ok());
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
            eprintln!("NetnsHost {}: removing {}: {e}", self.name, self.dir.display());
        }
        if self.netns_created
            && let Err(e) = run(Command::new("ip").args(["netns", "del", &self.name]))
        {
            eprintln!("NetnsHost {}: {e:#}", self.name);
        }
    }
}

/// Runs a command to completion; its stderr goes into the error.
fn run(command: &mut Command) -> Result<()> {
    let out = command.stdin(Stdio::null()).output().with_context(|| format!("running {command:?}"))?;
    if !out.status.success() {
        bail!("{command:?} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
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
        eprintln!("umount {}: {}", path.display(), std::io::Error::last_os_error());
    }
}

/// The start time (clock ticks since boot) of `pid`, to tell a process from a later one with
/// the same pid.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 22; the command name (field 2) may hold spaces, so count after its ')'.
    stat.rsplit_once(')')?.1.split_whitespace().nth(19)?.parse().ok()
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
    fn start_time_tells_processes_apart() {
        let me = std::process::id();
        assert!(start_time(me).is_some());
        assert!(is_alive(me));
    }
}
