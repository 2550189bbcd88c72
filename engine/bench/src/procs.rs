//! The processes a benchmark runs against: `gitplane server` replicas, etcd members and a
//! private PostgreSQL. Each is owned by a guard that kills it (by its PID, and only it) and
//! removes its temporary directory when dropped: at the end of a row, on an error, on a panic
//! (unwinding) and on Ctrl-C (the run's future is dropped). Children also get
//! `PR_SET_PDEATHSIG`, so a benchmark killed with SIGKILL does not leave servers behind.

use anyhow::{Context as _, Result, bail};
use std::{
    collections::BTreeMap,
    fs::File,
    net::SocketAddr,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

/// A child process, killed when dropped.
pub struct Child {
    name: String,
    child: std::process::Child,
    /// SIGKILL unless set (PostgreSQL wants SIGQUIT: it stops its backends too).
    stop_signal: libc::c_int,
}

impl Child {
    /// Starts `command` with stdout and stderr appended to `log`. Call only from the run's main
    /// task: the death signal is tied to the spawning thread, and the main task stays on the
    /// thread that runs the whole benchmark.
    pub fn spawn(name: impl Into<String>, mut command: Command, log: &Path) -> Result<Child> {
        let name = name.into();
        let out = File::options().create(true).append(true).open(log).with_context(|| format!("{}", log.display()))?;
        command.stdin(Stdio::null()).stdout(out.try_clone()?).stderr(out);
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec here.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command.spawn().with_context(|| format!("starting {name}"))?;
        Ok(Child { name, child, stop_signal: libc::SIGKILL })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `kill -9` and reap.
    pub fn kill9(&mut self) -> Result<()> {
        self.signal(libc::SIGKILL);
        self.child.wait().with_context(|| format!("reaping {}", self.name))?;
        Ok(())
    }

    fn signal(&self, signal: libc::c_int) {
        // Only our own child, by its PID, and only while it has not been reaped (so the PID
        // cannot have been reused).
        // SAFETY: kill(2) has no memory-safety preconditions.
        unsafe { libc::kill(self.child.id() as libc::pid_t, signal) };
    }

    /// Whether the process has exited (and its status, reaping it).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if self.exited().is_some() {
            return;
        }
        self.signal(self.stop_signal);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if self.exited().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.signal(libc::SIGKILL);
        let _ = self.child.wait();
    }
}

/// CPU time (user + system) used so far by these processes and their direct children (a
/// PostgreSQL server's backends), from `/proc`. Processes that are gone count as zero.
pub fn cpu_time(pids: &[u32]) -> Duration {
    let ticks_per_second = match unsafe { libc::sysconf(libc::_SC_CLK_TCK) } {
        t if t > 0 => t as f64,
        _ => 100.0,
    };
    let mut ticks = 0u64;
    let Ok(entries) = std::fs::read_dir("/proc") else { return Duration::ZERO };
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        // The command name may hold spaces; the fields after it are space-separated.
        let Some((_, rest)) = stat.rsplit_once(')') else { continue };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // After the name: state(0) ppid(1) ... utime(11) stime(12).
        let parent = fields.get(1).and_then(|p| p.parse::<u32>().ok());
        if pids.contains(&pid) || parent.is_some_and(|p| pids.contains(&p)) {
            let field = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            ticks += field(11) + field(12);
        }
    }
    Duration::from_secs_f64(ticks as f64 / ticks_per_second)
}

/// These processes and their direct children (a PostgreSQL server's backends), from `/proc`.
pub fn with_children(pids: &[u32]) -> Vec<u32> {
    let mut all = pids.to_vec();
    let Ok(entries) = std::fs::read_dir("/proc") else { return all };
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let Some((_, rest)) = stat.rsplit_once(')') else { continue };
        let parent = rest.split_whitespace().nth(1).and_then(|p| p.parse::<u32>().ok());
        if parent.is_some_and(|p| pids.contains(&p)) && !all.contains(&pid) {
            all.push(pid);
        }
    }
    all
}

/// Where server logs go instead of their temporary directories (`--logs`), to be read after a run.
static LOG_DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// The `gitplane` binary the benchmarks run (`given`, or the one next to this binary), after
/// keeping the servers' logs in `logs` if asked.
pub fn prepare(given: Option<&Path>, logs: Option<&Path>) -> Result<PathBuf> {
    if let Some(logs) = logs {
        std::fs::create_dir_all(logs).with_context(|| format!("creating {}", logs.display()))?;
        let _ = LOG_DIR.set(logs.to_path_buf());
    }
    match given {
        Some(path) => Ok(path.to_path_buf()),
        None => Ok(std::env::current_exe()?.with_file_name("gitplane")),
    }
}

/// A log file name for `file` of a cluster started in `dir`: in `dir`, or under `--logs` with the
/// cluster's directory name as a prefix.
fn log_file(dir: &Path, file: &str) -> PathBuf {
    match LOG_DIR.get() {
        Some(logs) => {
            let cluster = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            logs.join(format!("{cluster}-{file}"))
        }
        None => dir.join(file),
    }
}

/// How long a GET of the status API may take.
pub const GET_TIMEOUT: Duration = Duration::from_secs(2);

/// Polls `check` every 20 ms until it returns `Some`, or fails after `timeout`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await {
            return Ok(value);
        }
        if Instant::now() >= deadline {
            bail!("{what}: not within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A replica's view, from `GET /replica`.
#[derive(Clone, Debug)]
pub struct ReplicaStatus {
    pub leading: bool,
    pub revision: i64,
}

/// The peer token of every cluster a benchmark starts, and what its load generators present.
pub const PEER_TOKEN: &str = "gitplane-bench-peer-token-0123456789abcdef";
/// The status API token (role `read`) of the replicas the benchmarks start.
pub const READ_TOKEN: &str = "gitplane-bench-read-token-0123456789abcdef";

/// A client of the store service that presents [`PEER_TOKEN`].
pub type StoreClient = gitplane_storage::remote::pb::store_service_client::StoreServiceClient<
    tonic::service::interceptor::InterceptedService<tonic::transport::Channel, gitplane_storage::remote::PeerToken>,
>;

pub fn store_client(channel: tonic::transport::Channel) -> StoreClient {
    let token = gitplane_storage::remote::PeerToken::new(PEER_TOKEN).expect("a valid constant token");
    gitplane_storage::remote::pb::store_service_client::StoreServiceClient::with_interceptor(channel, token)
}

/// `gitplane server` replicas on loopback, each in its own data directory.
pub struct Gitplane {
    // Declared before `dir`: the processes go before their files.
    children: BTreeMap<u64, Child>,
    pub addrs: BTreeMap<u64, SocketAddr>,
    extra_args: Vec<String>,
    binary: PathBuf,
    dir: tempfile::TempDir,
}

impl Gitplane {
    /// Starts `replicas` replicas with `extra_args`, and waits for an acting leader.
    pub async fn start(binary: &Path, replicas: u64, extra_args: &[String]) -> Result<Gitplane> {
        let addrs = (1..=replicas).map(|id| Ok((id, gitplane_testkit::free_port()?))).collect::<Result<_>>()?;
        let mut cluster = Gitplane {
            children: BTreeMap::new(),
            addrs,
            extra_args: extra_args.to_vec(),
            binary: binary.to_owned(),
            dir: tempfile::Builder::new().prefix("gitplane-bench-").tempdir()?,
        };
        // Every replica shares the cluster's secrets, as an operator would copy them.
        std::fs::write(cluster.dir.path().join("peer-token"), PEER_TOKEN)?;
        std::fs::write(cluster.dir.path().join("join-token"), format!("join-{PEER_TOKEN}"))?;
        std::fs::write(cluster.dir.path().join("tokens.csv"), format!("{READ_TOKEN},bench,bench,\"read\"\n"))?;
        std::fs::write(cluster.dir.path().join("encryption-keys"), format!("bench {}\n", "5e".repeat(32)))?;
        for id in 1..=replicas {
            cluster.launch(id)?;
        }
        cluster.wait_ready().await?;
        Ok(cluster)
    }

    fn launch(&mut self, id: u64) -> Result<()> {
        let mut command = Command::new(&self.binary);
        command
            .args(gitplane_testkit::replica::replica_args(self.dir.path(), id, &self.addrs))
            .args(&self.extra_args)
            // The server's own default log filter: what users run.
            .env_remove("RUST_LOG");
        let child = Child::spawn(format!("gitplane replica {id}"), command, &self.log_path(id))?;
        self.children.insert(id, child);
        Ok(())
    }

    /// Where the replicas' data directories (`replica-<id>`) and the shared `repos` are.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn log_path(&self, id: u64) -> PathBuf {
        log_file(self.dir.path(), &format!("replica-{id}.log"))
    }

    /// The tail of every replica's log, for error messages.
    pub fn logs(&self) -> String {
        self.addrs
            .keys()
            .map(|id| {
                let log = std::fs::read_to_string(self.log_path(*id)).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(20).collect();
                format!("--- replica {id}\n{}\n", tail.into_iter().rev().collect::<Vec<_>>().join("\n"))
            })
            .collect()
    }

    pub fn pids(&self) -> Vec<u32> {
        self.children.values().map(Child::pid).collect()
    }

    pub fn ids(&self) -> Vec<u64> {
        self.addrs.keys().copied().collect()
    }

    pub async fn status(&self, id: u64) -> Option<ReplicaStatus> {
        let body =
            gitplane_testkit::http_get_async(self.addrs[&id], "/replica", Some(READ_TOKEN), GET_TIMEOUT).await.ok()?;
        let value: serde_json::Value = serde_json::from_str(&body).ok()?;
        Some(ReplicaStatus { leading: value["leading"] == true, revision: value["revision"].as_i64()? })
    }

    /// The acting leader among the running replicas, if there is one now.
    pub async fn leader(&self) -> Option<u64> {
        for id in self.children.keys() {
            if self.status(*id).await.is_some_and(|s| s.leading) {
                return Some(*id);
            }
        }
        None
    }

    /// Waits until every replica answers and one of them leads.
    pub async fn wait_ready(&mut self) -> Result<u64> {
        let exited = self.children.iter_mut().find_map(|(id, c)| Some((*id, c.exited()?)));
        if let Some((id, status)) = exited {
            bail!("gitplane replica {id} exited ({status})\n{}", self.logs());
        }
        let wait = wait_for("a gitplane leader", Duration::from_secs(60), || async {
            for id in self.children.keys() {
                self.status(*id).await?;
            }
            self.leader().await
        })
        .await;
        wait.with_context(|| self.logs())
    }

    pub fn kill9(&mut self, id: u64) -> Result<()> {
        if let Some(mut child) = self.children.remove(&id) {
            child.kill9()?;
        }
        Ok(())
    }

    pub fn restart(&mut self, id: u64) -> Result<()> {
        self.kill9(id)?;
        self.launch(id)
    }

    /// Every replica's revision, `None` for one that does not answer.
    pub async fn revisions(&self) -> Vec<Option<i64>> {
        let mut revisions = Vec::new();
        for id in self.addrs.keys() {
            revisions.push(self.status(*id).await.map(|s| s.revision));
        }
        revisions
    }
}

impl Drop for Gitplane {
    fn drop(&mut self) {
        // Processes first, then (field drop) the directory they wrote in.
        self.children.clear();
    }
}

/// etcd members on loopback, defaults otherwise.
pub struct Etcd {
    children: BTreeMap<u64, Child>,
    pub clients: BTreeMap<u64, SocketAddr>,
    peers: BTreeMap<u64, SocketAddr>,
    binary: PathBuf,
    token: String,
    dir: tempfile::TempDir,
}

impl Etcd {
    pub async fn start(binary: &Path, members: u64) -> Result<Etcd> {
        let clients = (1..=members).map(|id| Ok((id, gitplane_testkit::free_port()?))).collect::<Result<_>>()?;
        let peers = (1..=members).map(|id| Ok((id, gitplane_testkit::free_port()?))).collect::<Result<_>>()?;
        let dir = tempfile::Builder::new().prefix("etcd-bench-").tempdir()?;
        let token = dir.path().file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let mut cluster = Etcd { children: BTreeMap::new(), clients, peers, binary: binary.to_owned(), token, dir };
        for id in 1..=members {
            cluster.launch(id)?;
        }
        cluster.wait_ready().await?;
        Ok(cluster)
    }

    fn launch(&mut self, id: u64) -> Result<()> {
        let initial: Vec<String> = self.peers.iter().map(|(id, a)| format!("m{id}=http://{a}")).collect();
        let client = format!("http://{}", self.clients[&id]);
        let peer = format!("http://{}", self.peers[&id]);
        let mut command = Command::new(&self.binary);
        command
            .args(["--name", &format!("m{id}")])
            .arg("--data-dir")
            .arg(self.dir.path().join(format!("m{id}")))
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &initial.join(",")])
            .args(["--initial-cluster-token", &self.token, "--initial-cluster-state", "new"])
            // etcd reads ETCD_* variables as flags: only ours count.
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
        let child = Child::spawn(format!("etcd member {id}"), command, &self.log_path(id))?;
        self.children.insert(id, child);
        Ok(())
    }

    pub fn log_path(&self, id: u64) -> PathBuf {
        log_file(self.dir.path(), &format!("etcd-m{id}.log"))
    }

    fn logs(&self) -> String {
        self.clients
            .keys()
            .map(|id| {
                let log = std::fs::read_to_string(self.log_path(*id)).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(15).collect();
                format!("--- etcd member {id}\n{}\n", tail.into_iter().rev().collect::<Vec<_>>().join("\n"))
            })
            .collect()
    }

    pub fn pids(&self) -> Vec<u32> {
        self.children.values().map(Child::pid).collect()
    }

    pub fn ids(&self) -> Vec<u64> {
        self.clients.keys().copied().collect()
    }

    /// (this member's id, the leader's member id, revision) from Maintenance.Status.
    async fn member_status(&self, id: u64) -> Option<(u64, u64, i64)> {
        let status = crate::etcd::status(self.clients[&id]).await.ok()?;
        let header = status.header?;
        Some((header.member_id, status.leader, header.revision))
    }

    /// Our id of the current leader, if the running members agree there is one.
    pub async fn leader(&self) -> Option<u64> {
        let mut members = BTreeMap::new();
        let mut leader = None;
        for id in self.children.keys() {
            let (member, lead, _) = self.member_status(*id).await?;
            members.insert(member, *id);
            if lead != 0 {
                leader = Some(lead);
            }
        }
        // A leader that is not among the running members is a stale view.
        leader.and_then(|l| members.get(&l).copied())
    }

    pub async fn wait_ready(&mut self) -> Result<u64> {
        let exited = self.children.iter_mut().find_map(|(id, c)| Some((*id, c.exited()?)));
        if let Some((id, status)) = exited {
            bail!("etcd member {id} exited ({status})\n{}", self.logs());
        }
        let wait = wait_for("an etcd leader", Duration::from_secs(60), || self.leader()).await;
        wait.with_context(|| self.logs())
    }

    pub fn kill9(&mut self, id: u64) -> Result<()> {
        if let Some(mut child) = self.children.remove(&id) {
            child.kill9()?;
        }
        Ok(())
    }

    /// Starts a killed member again on its data directory.
    pub fn restart(&mut self, id: u64) -> Result<()> {
        self.kill9(id)?;
        self.launch(id)
    }

    pub async fn revisions(&self) -> Vec<Option<i64>> {
        let mut revisions = Vec::new();
        for id in self.clients.keys() {
            revisions.push(self.member_status(*id).await.map(|s| s.2));
        }
        revisions
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.children.clear();
    }
}

/// A private PostgreSQL server: its own cluster directory, reachable only through a unix socket
/// in that directory (`listen_addresses=''`), run as the `postgres` user.
pub struct Postgres {
    child: Option<Child>,
    pub url: String,
    dir: tempfile::TempDir,
}

/// The newest PostgreSQL installed from Debian's packages.
fn postgres_bin() -> Result<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .context("PostgreSQL is not installed (no /usr/lib/postgresql)")?
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .filter(|(_, bin): &(u32, PathBuf)| bin.join("postgres").exists())
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).context("no /usr/lib/postgresql/*/bin/postgres")
}

/// The uid and gid of the `postgres` user.
fn postgres_user() -> Result<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd")?;
    passwd
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.first() == Some(&"postgres"))
        .and_then(|f| Some((f.get(2)?.parse().ok()?, f.get(3)?.parse().ok()?)))
        .context("there is no postgres user")
}

impl Postgres {
    /// The database cluster's directory.
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub async fn start() -> Result<Postgres> {
        let bin = postgres_bin()?;
        let (uid, gid) = postgres_user()?;
        let dir = tempfile::Builder::new().prefix("postgres-bench-").tempdir()?;
        std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))?;
        let data = dir.path().join("data");
        let log = dir.path().join("postgres.log");
        let root = dir.path().to_owned();
        let as_postgres = |program: &str| {
            let mut command = Command::new(bin.join(program));
            command.uid(uid).gid(gid).current_dir(&root).env_remove("PGDATA");
            command
        };
        let mut initdb = as_postgres("initdb");
        initdb.arg("-D").arg(&data).args(["-U", "postgres", "--auth=trust", "--no-sync"]);
        let status = Child::spawn("initdb", initdb, &log)?.child.wait()?;
        if !status.success() {
            bail!("initdb failed ({status}): see {}", std::fs::read_to_string(&log).unwrap_or_default());
        }
        let mut server = as_postgres("postgres");
        server.arg("-D").arg(&data).arg("-k").arg(dir.path()).args(["-c", "listen_addresses="]);
        let mut child = Child::spawn("postgres", server, &log)?;
        child.stop_signal = libc::SIGQUIT;
        let mut postgres = Postgres { child: Some(child), url: String::new(), dir };
        let socket_dir = postgres.dir.path().to_owned();
        wait_for("PostgreSQL accepting connections", Duration::from_secs(30), || async {
            let mut ready = as_postgres("pg_isready");
            ready.arg("-q").arg("-h").arg(&socket_dir).args(["-U", "postgres"]);
            ready.status().ok()?.success().then_some(())
        })
        .await?;
        let mut createdb = as_postgres("createdb");
        createdb.arg("-h").arg(postgres.dir.path()).args(["-U", "postgres", "gitplane"]);
        let status = Child::spawn("createdb", createdb, &log)?.child.wait()?;
        if !status.success() {
            bail!("createdb failed ({status}): {}", std::fs::read_to_string(&log).unwrap_or_default());
        }
        postgres.url = format!("postgres://postgres@localhost/gitplane?host={}", postgres.dir.path().display());
        Ok(postgres)
    }

    pub fn pids(&self) -> Vec<u32> {
        self.child.iter().map(Child::pid).collect()
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        self.child.take();
    }
}
