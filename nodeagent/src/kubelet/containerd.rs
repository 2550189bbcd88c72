//! A containerd of our own: its config (rendered from `templates/containerd-config.toml.j2`)
//! and its process, started, kept running ([`Containerd::supervise`]) and stopped by
//! `gitplane up` (or a test harness).

use std::fs::OpenOptions;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use minijinja::context;

use crate::kubelet::cri::{Cri, CriError};
use crate::kubelet::registries::Registries;
use crate::kubelet::restart::Backoff;

/// How often a supervised containerd is checked for having exited.
const EXIT_POLL: Duration = Duration::from_millis(200);

const CONFIG_TEMPLATE: &str = include_str!("../../../templates/containerd-config.toml.j2");

/// Where the containerd lives and what it runs pods with.
#[derive(Clone, Debug)]
pub struct ContainerdConfig {
    /// Holds everything of this containerd: config, socket, root, state, runc root, log.
    pub dir: PathBuf,
    /// The pod sandbox ("pause") image; it must be imported, no registry is reachable.
    pub sandbox_image: String,
    /// Where the CNI conflist is (see [`crate::network::cni::write_conflist`]).
    pub cni_conf_dir: PathBuf,
    /// The CNI plugin binaries (Debian's containernetworking-plugins).
    pub cni_bin_dir: PathBuf,
    /// A command prefix to start containerd with, e.g. `nsenter --mount=… --net=… --` to run it
    /// inside a node's namespaces. Empty: run `containerd` directly. The prefix must exec
    /// containerd (not fork), so the PID we signal is containerd's.
    pub launcher: Vec<String>,
    /// The containerd binary.
    pub program: PathBuf,
    /// How long to wait for its CRI to answer before giving up.
    pub start_timeout: Duration,
    /// How long `stop` waits after SIGTERM before SIGKILL.
    pub stop_timeout: Duration,
}

impl ContainerdConfig {
    /// Defaults for a containerd living in `dir`: CNI config in `dir/cni/net.d`, plugins from
    /// `/usr/lib/cni`, gitplane's pause image.
    pub fn new(dir: impl Into<PathBuf>) -> ContainerdConfig {
        let dir = dir.into();
        ContainerdConfig {
            cni_conf_dir: dir.join("cni/net.d"),
            cni_bin_dir: PathBuf::from("/usr/lib/cni"),
            sandbox_image: crate::kubelet::images::PAUSE_IMAGE.to_string(),
            launcher: Vec::new(),
            program: PathBuf::from("containerd"),
            start_timeout: Duration::from_secs(30),
            // containerd stops in a fraction of a second; one that does not is killed (its
            // shims, and the Pods in them, live on regardless).
            stop_timeout: Duration::from_secs(2),
            dir,
        }
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.join("containerd.sock")
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.join("config.toml")
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.join("containerd.log")
    }

    /// containerd's `config_path`: the `hosts.toml` of each registry with mirrors or TLS
    /// settings, which the node agent writes ([`write_registry_hosts`]).
    pub fn registry_config_path(&self) -> PathBuf {
        self.dir.join("certs.d")
    }

    /// The config file's text.
    pub fn render(&self) -> String {
        let ctx = context! {
            dir => self.dir.to_string_lossy(),
            socket => self.socket().to_string_lossy(),
            sandbox_image => &self.sandbox_image,
            cni_conf_dir => self.cni_conf_dir.to_string_lossy(),
            cni_bin_dir => self.cni_bin_dir.to_string_lossy(),
            registry_config_path => self.registry_config_path().to_string_lossy(),
        };
        // The template is embedded and every variable is given: failure is a bug, not input.
        crate::template::render("containerd-config.toml.j2", CONFIG_TEMPLATE, ctx)
            .expect("embedded containerd config template renders")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ContainerdError {
    #[error("preparing containerd directory {path}: {source}")]
    Prepare { path: PathBuf, source: io::Error },
    #[error(
        "containerd socket path {socket} is longer than a unix socket path may be ({max} bytes): use a shorter directory"
    )]
    SocketPathTooLong { socket: PathBuf, max: usize },
    #[error("starting {program} (is the containerd package installed?): {source}")]
    Spawn { program: String, source: io::Error },
    #[error("containerd exited during start-up ({status}); its log {log} ends with:\n{tail}")]
    Exited { status: std::process::ExitStatus, log: PathBuf, tail: String },
    #[error(
        "containerd's CRI at {socket} did not answer within {timeout:?} ({last}); its log {log} ends with:\n{tail}"
    )]
    NotReady { socket: PathBuf, timeout: Duration, last: String, log: PathBuf, tail: String },
    #[error("stopping containerd (pid {pid}): {source}")]
    Stop { pid: u32, source: io::Error },
}

/// Writes `registries`' `<host>/hosts.toml` files under containerd's `config_path` and removes
/// those of registries no longer named; containerd reads them at each pull.
pub fn write_registry_hosts(config_path: &Path, registries: &Registries) -> io::Result<()> {
    let files = registries.hosts_files();
    std::fs::create_dir_all(config_path)?;
    for entry in std::fs::read_dir(config_path)? {
        let entry = entry?;
        let name = entry.file_name();
        if !files.iter().any(|(dir, _)| name.to_str() == Some(dir)) {
            std::fs::remove_dir_all(entry.path())?;
        }
    }
    for (dir, text) in files {
        let dir = config_path.join(dir);
        std::fs::create_dir_all(&dir)?;
        crate::network::cni::write_atomic(&dir.join("hosts.toml"), text.as_bytes())?;
    }
    Ok(())
}

/// A running containerd that this process started. Dropping it without [`Containerd::stop`]
/// still terminates it (SIGTERM, then SIGKILL), so a failing test leaves nothing behind.
#[derive(Debug)]
pub struct Containerd {
    cfg: ContainerdConfig,
    child: Option<Child>,
    version: String,
}

impl Containerd {
    /// Writes the config, starts containerd and waits until its CRI answers `Version`.
    pub async fn start(mut cfg: ContainerdConfig) -> Result<Containerd, ContainerdError> {
        let prepare = |path: &Path, source| ContainerdError::Prepare { path: path.to_path_buf(), source };
        // containerd resolves nothing relative to our working directory.
        for path in [&mut cfg.dir, &mut cfg.cni_conf_dir] {
            *path = std::path::absolute(&*path).map_err(|e| prepare(path, e))?;
        }
        // sun_path holds 108 bytes with the NUL; the ttrpc socket is the longer one.
        const MAX_SOCKET_PATH: usize = 107;
        let ttrpc_len = cfg.socket().as_os_str().len() + ".ttrpc".len();
        if ttrpc_len > MAX_SOCKET_PATH {
            return Err(ContainerdError::SocketPathTooLong { socket: cfg.socket(), max: MAX_SOCKET_PATH });
        }
        for dir in [&cfg.dir, &cfg.cni_conf_dir] {
            std::fs::create_dir_all(dir).map_err(|e| prepare(dir, e))?;
        }
        let config_path = cfg.config_path();
        crate::network::cni::write_atomic(&config_path, cfg.render().as_bytes())
            .map_err(|e| prepare(&config_path, e))?;
        let log_path = cfg.log_path();
        let log = OpenOptions::new().create(true).append(true).open(&log_path).map_err(|e| prepare(&log_path, e))?;
        let log_err = log.try_clone().map_err(|e| prepare(&log_path, e))?;

        let mut argv: Vec<String> = cfg.launcher.clone();
        argv.push(cfg.program.to_string_lossy().into_owned());
        argv.push("--config".into());
        argv.push(config_path.to_string_lossy().into_owned());
        let mut command = Command::new(&argv[0]);
        command.args(&argv[1..]).stdin(Stdio::null()).stdout(log).stderr(log_err);
        // Its own process group: a Ctrl-C in the terminal must reach only the agent, which
        // removes the Pods through this containerd before stopping it.
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let child = command.spawn().map_err(|source| ContainerdError::Spawn { program: argv.join(" "), source })?;
        tracing::info!(pid = child.id(), dir = %cfg.dir.display(), "started containerd");
        let mut containerd = Containerd { cfg, child: Some(child), version: String::new() };
        containerd.version = containerd.wait_ready().await?;
        Ok(containerd)
    }

    async fn wait_ready(&mut self) -> Result<String, ContainerdError> {
        let socket = self.cfg.socket();
        let deadline = Instant::now() + self.cfg.start_timeout;
        let mut last = String::from("socket not there yet");
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
                return Err(ContainerdError::Exited { status, log: self.cfg.log_path(), tail: self.log_tail() });
            }
            if socket.exists() {
                match Cri::connect_and_check(&socket).await {
                    Ok((_, v)) => return Ok(format!("{} {}", v.runtime_name, v.runtime_version)),
                    Err(CriError::Connect { source, .. }) => last = format!("connect: {source}"),
                    Err(e) => last = e.to_string(),
                }
            }
            if Instant::now() >= deadline {
                return Err(ContainerdError::NotReady {
                    socket,
                    timeout: self.cfg.start_timeout,
                    last,
                    log: self.cfg.log_path(),
                    tail: self.log_tail(),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The last lines of containerd's log, for error messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.cfg.log_path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    pub fn socket(&self) -> PathBuf {
        self.cfg.socket()
    }

    pub fn config(&self) -> &ContainerdConfig {
        &self.cfg
    }

    /// The runtime's name and version as its CRI reported them.
    pub fn version(&self) -> &str {
        &self.version
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// How it ended, once it has (it is reaped then).
    pub fn try_wait(&mut self) -> Option<std::process::ExitStatus> {
        let status = self.child.as_mut()?.try_wait().ok().flatten()?;
        self.child = None;
        Some(status)
    }

    /// Keeps containerd running until `stop` turns true, as systemd's `Restart=always` keeps a
    /// node's: one that exits (a crash, a SIGKILL) is started again with the same config after a
    /// [`Backoff`]. Pods outlive it in their shims and the new one takes them up again, so none
    /// is restarted. Returns the containerd running at the stop, for the caller to stop.
    pub async fn supervise(self, mut stop: tokio::sync::watch::Receiver<bool>) -> Option<Containerd> {
        let cfg = self.cfg.clone();
        let mut current = Some(self);
        let mut backoff = Backoff::new(Instant::now());
        let mut poll = tokio::time::interval(EXIT_POLL);
        loop {
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return current,
                _ = poll.tick() => {}
            }
            let ended = match current.as_mut() {
                Some(running) => match running.try_wait() {
                    Some(status) => status.to_string(),
                    None => continue,
                },
                None => "it did not start".to_owned(),
            };
            let wait = backoff.failed(Instant::now());
            tracing::warn!(dir = %cfg.dir.display(), %ended, restart_in = ?wait, "containerd stopped; starting it again");
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return None,
                _ = tokio::time::sleep(wait) => {}
            }
            backoff.started(Instant::now());
            // A start waits for the CRI to answer; a stop meanwhile ends it (dropping the half
            // started one stops it).
            let started = tokio::select! {
                _ = stop.wait_for(|s| *s) => return None,
                started = Containerd::start(cfg.clone()) => started,
            };
            current = match started {
                Ok(started) => Some(started),
                Err(error) => {
                    tracing::error!(dir = %cfg.dir.display(), %error, "starting containerd again failed");
                    None
                }
            };
        }
    }

    /// SIGTERM, wait up to `stop_timeout`, then SIGKILL. Containers keep running in their
    /// shims: kill pods first when they should go too.
    pub async fn stop(mut self) -> Result<(), ContainerdError> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        let pid = child.id();
        let stop = |source| ContainerdError::Stop { pid, source };
        // Whether it has exited: ECHILD means someone else reaped it (a host's teardown that
        // killed and reaped every process of its mount namespace), which is exited too.
        let exited = |child: &mut Child| match child.try_wait() {
            Ok(status) => Ok(status.is_some()),
            Err(e) if e.raw_os_error() == Some(libc::ECHILD) => Ok(true),
            Err(e) => Err(stop(e)),
        };
        // A containerd that has exited already is stopped; signalling its reaped pid would fail.
        if exited(&mut child)? {
            tracing::info!(pid, "containerd had exited already");
            return Ok(());
        }
        signal(pid, libc::SIGTERM).map_err(stop)?;
        let deadline = Instant::now() + self.cfg.stop_timeout;
        loop {
            if exited(&mut child)? {
                tracing::info!(pid, "containerd stopped");
                return Ok(());
            }
            if Instant::now() >= deadline {
                tracing::warn!(pid, "containerd ignored SIGTERM; killing it");
                child.kill().map_err(stop)?;
                child.wait().map_err(stop)?;
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let _ = signal(child.id(), libc::SIGTERM);
        let deadline = Instant::now() + self.cfg.stop_timeout;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

fn signal(pid: u32, sig: libc::c_int) -> io::Result<()> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: kill(2) has no memory effects; `pid` is our own child, not yet reaped.
    if unsafe { libc::kill(pid, sig) } == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use toml::Value;

    fn at<'a>(doc: &'a Value, path: &[&str]) -> &'a Value {
        path.iter().try_fold(doc, |v, key| v.get(key)).unwrap_or_else(|| panic!("{path:?} present"))
    }

    #[test]
    fn config_keeps_everything_under_our_dir() {
        let mut cfg = ContainerdConfig::new("/var/lib/gp/containerd");
        cfg.cni_conf_dir = PathBuf::from("/var/lib/gp/cni/net.d");
        let doc: Value = toml::from_str(&cfg.render()).expect("config is TOML");
        let s = |path: &[&str]| at(&doc, path).as_str().map(str::to_string);
        let b = |path: &[&str]| at(&doc, path).as_bool();

        assert_eq!(at(&doc, &["version"]).as_integer(), Some(2));
        assert_eq!(s(&["root"]).as_deref(), Some("/var/lib/gp/containerd/root"));
        assert_eq!(s(&["state"]).as_deref(), Some("/var/lib/gp/containerd/state"));
        assert_eq!(s(&["grpc", "address"]).as_deref(), Some("/var/lib/gp/containerd/containerd.sock"));
        assert_eq!(s(&["ttrpc", "address"]).as_deref(), Some("/var/lib/gp/containerd/containerd.sock.ttrpc"));
        assert_eq!(s(&["debug", "address"]).as_deref(), Some(""));
        assert_eq!(s(&["metrics", "address"]).as_deref(), Some(""));
        assert_eq!(
            s(&["plugins", "io.containerd.internal.v1.opt", "path"]).as_deref(),
            Some("/var/lib/gp/containerd/opt")
        );

        let cri = ["plugins", "io.containerd.grpc.v1.cri"];
        let under = |rest: &[&'static str]| [&cri[..], rest].concat();
        assert_eq!(s(&under(&["sandbox_image"])).as_deref(), Some("gitplane.local/pause:1"));
        assert_eq!(b(&under(&["restrict_oom_score_adj"])), Some(true));
        assert_eq!(b(&under(&["netns_mounts_under_state_dir"])), Some(true));
        assert_eq!(s(&under(&["cni", "bin_dir"])).as_deref(), Some("/usr/lib/cni"));
        assert_eq!(s(&under(&["cni", "conf_dir"])).as_deref(), Some("/var/lib/gp/cni/net.d"));
        assert_eq!(at(&doc, &under(&["cni", "max_conf_num"])).as_integer(), Some(1));
        assert_eq!(s(&under(&["registry", "config_path"])).as_deref(), Some("/var/lib/gp/containerd/certs.d"));
        assert_eq!(s(&under(&["containerd", "snapshotter"])).as_deref(), Some("overlayfs"));
        let runc = under(&["containerd", "runtimes", "runc"]);
        assert_eq!(s(&[&runc[..], &["runtime_type"]].concat()).as_deref(), Some("io.containerd.runc.v2"));
        assert_eq!(b(&[&runc[..], &["options", "SystemdCgroup"]].concat()), Some(false));
        assert_eq!(s(&[&runc[..], &["options", "Root"]].concat()).as_deref(), Some("/var/lib/gp/containerd/runc"));

        let disabled: Vec<&str> = at(&doc, &["disabled_plugins"])
            .as_array()
            .expect("disabled_plugins is an array")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        for snapshotter in ["aufs", "btrfs", "devmapper", "zfs"] {
            assert!(disabled.contains(&format!("io.containerd.snapshotter.v1.{snapshotter}").as_str()));
        }
    }

    #[test]
    fn a_too_long_socket_path_is_refused_before_starting() {
        let cfg = ContainerdConfig::new(format!("/tmp/{}", "d".repeat(100)));
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let err = runtime.block_on(Containerd::start(cfg)).expect_err("refused");
        assert!(matches!(err, ContainerdError::SocketPathTooLong { .. }), "{err}");
    }

    #[test]
    fn config_quotes_odd_paths() {
        let mut cfg = ContainerdConfig::new("/tmp/with \"quote\" and \\");
        cfg.sandbox_image = "registry.local/pause:3".into();
        let doc: Value = toml::from_str(&cfg.render()).expect("config is TOML");
        assert_eq!(at(&doc, &["root"]).as_str(), Some("/tmp/with \"quote\" and \\/root"));
        assert_eq!(
            at(&doc, &["plugins", "io.containerd.grpc.v1.cri", "sandbox_image"]).as_str(),
            Some("registry.local/pause:3")
        );
    }
}
