//! `gitplane-bench api`: reads of the status API with many Pods stored. The Pods are written
//! straight into a replica's SQLite store before `gitplane server` starts on it (no Raft, no
//! controllers on the way: the reads are what is measured), bound to nodes that do not exist so
//! that nothing schedules or runs them. Then over HTTP/1.1 keep-alive connections on loopback:
//! a cluster-wide LIST unpaged and as kubectl pages it (`limit=500`, as JSON and as the Table
//! kubectl asks for), one at a time; and GET of one Pod by 100 concurrent readers. Anchors:
//! Kubernetes' API call latency SLOs (p99 of a read of one object under 1 s, of a cluster-wide
//! list under 30 s) and the goal (a cluster-wide LIST under 1 s at p99).
//!
//! The LIST and GET rows run with a static read token (the token file's role) and again with a
//! ServiceAccount's token, which RBAC authorizes (a ClusterRoleBinding of a ClusterRole that
//! lists Pods, among 43 other bindings: `api_rbac`). A second table times one RBAC decision on
//! the snapshot the API server builds of those objects.
//!
//! Every request carries a token (the API refuses anonymous callers); `--https` reads over
//! the server's TLS listener, verifying it with the cluster CA (`<data-dir>/ca.crt`). Before the
//! rows are timed the bench waits until the API server's watch cache serves Pod lists (a `hit`
//! in `apiserver_cache_list_total` on `/metrics`) and prints how long the fill took, and the
//! server's RSS before the fill, after it and at the end; then until the server is settled
//! (under a tenth of a core for a second: its controllers' informer lists every Pod at start-up
//! too), so that the rows time a steady server, as Kubernetes' SLOs are measured. `--push` then
//! pushes one commit, so the push verdicts read the informer too, and prints the RSS again.

use crate::{
    api_rbac,
    procs::{self, Child},
    up::{git, git_in},
};
use anyhow::{Context as _, Result, bail};
use gitplane_storage::sqlite::{Durability, SqliteStore};
use gitplane_store::{Op, Store};
use serde_json::{Value, json};
use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};
use tokio::{
    io::{AsyncBufReadExt as _, AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, BufReader},
    net::TcpStream,
};
use tokio_rustls::{TlsConnector, rustls::pki_types::ServerName};

/// A connection's byte stream: TCP, or TLS over it.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// How the readers reach the server: its address and, with `--https`, the TLS connector.
#[derive(Clone)]
struct Target {
    addr: SocketAddr,
    tls: Option<TlsConnector>,
}

#[derive(clap::Args, Clone)]
pub struct ApiArgs {
    /// Pods stored.
    #[arg(long, default_value_t = 150_000)]
    pods: usize,
    /// Runs of each LIST row.
    #[arg(long, default_value_t = 10)]
    lists: usize,
    /// Concurrent readers of the GET row.
    #[arg(long, default_value_t = 100)]
    readers: usize,
    /// The GET row's window, in seconds.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// The `gitplane` binary (default: next to this one).
    #[arg(long)]
    gitplane: Option<PathBuf>,
    /// Read over HTTPS (the server's TLS listener, verified with its CA) instead of cleartext.
    #[arg(long)]
    https: bool,
    /// Keep the server's log here (default: in the run's temporary directory, removed after).
    #[arg(long)]
    server_log: Option<PathBuf>,
    /// Once the server has settled, push one commit over HTTP to a hosted repository (its push
    /// verdict starts this replica's informer if the leader's loops have not), then print the
    /// RSS once it settles again.
    #[arg(long)]
    push: bool,
}

const NAMESPACES: usize = 100;
const NODES: usize = 1_000;
const BATCH: usize = 2_000;
const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";

/// A Running Pod of a Deployment, about 1.5 KiB of JSON: what a LIST carries per item.
fn pod(i: usize) -> Value {
    let (namespace, node) = (format!("ns-{}", i % NAMESPACES), format!("node-{}", i % NODES));
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": format!("web-{i:06}"), "namespace": namespace,
            "labels": {"app": format!("web-{}", i % 500), "pod-template-hash": "5d4f8c7b9"},
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": {
            "nodeName": node, "restartPolicy": "Always", "terminationGracePeriodSeconds": 30,
            "containers": [{
                "name": "web", "image": "gitplane.local/httpd:1", "imagePullPolicy": "IfNotPresent",
                "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}},
                "readinessProbe": {"httpGet": {"path": "/healthz", "port": 8080}, "periodSeconds": 10},
            }],
        },
        "status": {
            "phase": "Running", "podIP": format!("10.244.{}.{}", (i / 250) % 256, i % 250 + 2),
            "hostIP": format!("172.29.{}.{}", (i % NODES) / 250, (i % NODES) % 250 + 2),
            "startTime": "2026-01-01T00:00:01Z",
            "conditions": [
                {"type": "Initialized", "status": "True"}, {"type": "Ready", "status": "True"},
                {"type": "ContainersReady", "status": "True"}, {"type": "PodScheduled", "status": "True"},
            ],
            "containerStatuses": [{
                "name": "web", "ready": true, "started": true, "restartCount": 0,
                "image": "gitplane.local/httpd:1", "imageID": "sha256:0123456789abcdef",
                "containerID": format!("containerd://{i:064x}"),
                "state": {"running": {"startedAt": "2026-01-01T00:00:02Z"}},
            }],
        },
    })
}

/// One HTTP/1.1 keep-alive connection, whose requests carry `token`.
struct Connection {
    stream: BufReader<Box<dyn Io>>,
    addr: SocketAddr,
    token: String,
}

impl Connection {
    async fn open(target: &Target, token: &str) -> Result<Connection> {
        let addr = target.addr;
        let tcp = TcpStream::connect(addr).await.with_context(|| format!("connecting to {addr}"))?;
        tcp.set_nodelay(true)?;
        let stream: Box<dyn Io> = match &target.tls {
            None => Box::new(tcp),
            Some(tls) => {
                let name = ServerName::from(addr.ip());
                Box::new(tls.connect(name, tcp).await.with_context(|| format!("TLS to {addr}"))?)
            }
        };
        Ok(Connection { stream: BufReader::with_capacity(64 * 1024, stream), addr, token: token.to_owned() })
    }

    /// `GET path`: the body of a 200 answer (the server sends a Content-Length).
    async fn get(&mut self, path: &str, accept: &str) -> Result<Vec<u8>> {
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: {}\r\nAccept: {accept}\r\nAuthorization: Bearer {}\r\n\r\n",
            self.addr, self.token
        );
        self.stream.get_mut().write_all(request.as_bytes()).await?;
        self.stream.get_mut().flush().await?;
        let (mut status, mut length) = (String::new(), None);
        self.stream.read_line(&mut status).await?;
        loop {
            let mut line = String::new();
            if self.stream.read_line(&mut line).await? == 0 {
                bail!("GET {path}: the connection closed");
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some((name, value)) = line.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse::<usize>().ok();
            }
        }
        let length = length.with_context(|| format!("GET {path}: no Content-Length"))?;
        let mut body = vec![0; length];
        self.stream.read_exact(&mut body).await?;
        if status.split(' ').nth(1) != Some("200") {
            bail!("GET {path}: {} {}", status.trim_end(), String::from_utf8_lossy(&body));
        }
        Ok(body)
    }
}

/// What a client reads of a list page: every item is checked to be JSON and counted, not kept
/// (client-go decodes into typed structs, not a tree of maps; the server's time is measured).
#[derive(serde::Deserialize)]
struct Page {
    #[serde(default)]
    items: Vec<serde::de::IgnoredAny>,
    #[serde(default)]
    rows: Vec<serde::de::IgnoredAny>,
    metadata: PageMetadata,
}

#[derive(serde::Deserialize)]
struct PageMetadata {
    #[serde(rename = "continue")]
    continue_: Option<String>,
}

/// A whole cluster-wide LIST, following continue tokens when `limit` is set: (items, bytes).
async fn list_all(c: &mut Connection, limit: Option<usize>, accept: &str) -> Result<(usize, usize)> {
    let (mut items, mut bytes, mut token) = (0, 0, None::<String>);
    loop {
        let mut path = "/api/v1/pods".to_owned();
        if let Some(limit) = limit {
            path.push_str(&format!("?limit={limit}"));
            if let Some(t) = &token {
                path.push_str(&format!("&continue={t}"));
            }
        }
        let body = c.get(&path, accept).await?;
        bytes += body.len();
        let page: Page = serde_json::from_slice(&body).with_context(|| format!("GET {path}: not a list"))?;
        items += page.items.len() + page.rows.len();
        token = page.metadata.continue_.filter(|t| !t.is_empty());
        if token.is_none() || limit.is_none() {
            return Ok((items, bytes));
        }
    }
}

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> String {
    if d < Duration::from_millis(10) {
        format!("{:.2} ms", d.as_secs_f64() * 1e3)
    } else {
        format!("{:.0} ms", d.as_secs_f64() * 1e3)
    }
}

pub fn main(args: ApiArgs) -> Result<()> {
    let gitplane = procs::prepare(args.gitplane.as_deref(), None)?;
    if !gitplane.exists() {
        bail!(
            "no gitplane binary at {}: build it (cargo build --release --bin gitplane) or pass --gitplane",
            gitplane.display()
        );
    }
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(run(args, gitplane))
}

async fn run(args: ApiArgs, gitplane: PathBuf) -> Result<()> {
    let dir = tempfile::Builder::new().prefix("gitplane-bench-api-").tempdir()?;
    let data = dir.path().join("replica-1");
    std::fs::create_dir_all(&data)?;
    let started = Instant::now();
    let rbac = api_rbac::objects();
    let account_token = {
        // Where `gitplane server` keeps the replica's store: `<data-dir>/store/store.db`.
        std::fs::create_dir_all(data.join("store"))?;
        let store = SqliteStore::open(&data.join("store/store.db"), Durability::Replicated).await?;
        let mut first = None;
        for start in (0..args.pods).step_by(BATCH) {
            let ops = (start..(start + BATCH).min(args.pods)).map(|i| Op::Create(pod(i))).collect();
            let committed = store.txn(ops).await.with_context(|| format!("writing Pods from {start}"))?;
            first = first.or(committed.objects.into_iter().next());
        }
        let committed = store.txn(rbac.iter().cloned().map(Op::Create).collect()).await.context("writing RBAC")?;
        let key = api_rbac::write_key(&data)?;
        api_rbac::token(&key, &first.context("no Pod stored")?, &committed.objects[0])?
    };
    eprintln!("stored {} Pods in {:.1} s", args.pods, started.elapsed().as_secs_f64());

    if args.push {
        let bare = dir.path().join("repos/bench.git");
        git(tokio::process::Command::new("git").args(["init", "--quiet", "--bare"]).arg(&bare)).await?;
    }

    let addr = gitplane_testkit::free_port()?;
    std::fs::write(dir.path().join("peer-token"), procs::PEER_TOKEN)?;
    std::fs::write(dir.path().join("tokens.csv"), format!("{},bench,bench,\"read\"\n", procs::READ_TOKEN))?;
    std::fs::write(dir.path().join("join-token"), format!("join-{}", procs::PEER_TOKEN))?;
    let mut command = Command::new(&gitplane);
    command
        .arg("server")
        .args(["--id", "1", "--peers", &format!("1={addr}")])
        .arg("--data-dir")
        .arg(&data)
        .arg("--repos-dir")
        .arg(dir.path().join("repos"))
        .arg("--peer-token-file")
        .arg(dir.path().join("peer-token"))
        .arg("--join-token-file")
        .arg(dir.path().join("join-token"))
        .arg("--tokens-file")
        .arg(dir.path().join("tokens.csv"))
        .env_remove("RUST_LOG");
    let log = args.server_log.clone().unwrap_or_else(|| dir.path().join("server.log"));
    let server = Child::spawn("gitplane server", command, &log)?;
    procs::wait_for("the server ready", Duration::from_secs(120), || async move {
        gitplane_testkit::http_get_async(addr, "/readyz", None, procs::GET_TIMEOUT).await.ok()
    })
    .await
    .with_context(|| std::fs::read_to_string(&log).unwrap_or_default())?;
    let tls = match args.https {
        true => {
            let ca = std::fs::read_to_string(data.join("ca.crt")).context("the cluster CA, <data-dir>/ca.crt")?;
            Some(gitplane::status::tls_connector(&ca)?)
        }
        false => None,
    };
    let target = Target { addr, tls };
    let mut c = Connection::open(&target, procs::READ_TOKEN).await?;
    eprintln!("server RSS before the first LIST: {}", rss(server.pid()));
    let filled = wait_for_cache(&mut c, addr).await?;
    eprintln!("list cache serving after {:.2} s; server RSS {}", filled.as_secs_f64(), rss(server.pid()));
    if let Ok(text) = std::fs::read_to_string(&log)
        && let Some(line) = text.lines().find(|l| l.contains("list cache: filled"))
    {
        // Without the log's colours (ESC [ ... m).
        let (mut plain, mut escaped) = (String::new(), false);
        for ch in line.chars() {
            match (escaped, ch) {
                (false, '\u{1b}') => escaped = true,
                (false, ch) => plain.push(ch),
                (true, 'm') => escaped = false,
                (true, _) => {}
            }
        }
        eprintln!("server: {plain}");
    }

    let settled = wait_until_settled(server.pid()).await?;
    eprintln!("server settled after {:.1} s more; server RSS {}", settled.as_secs_f64(), rss(server.pid()));
    if args.push {
        let token = std::fs::read_to_string(data.join("git-token")).context("<data-dir>/git-token")?;
        let pushed = Instant::now();
        push(dir.path(), addr, token.trim()).await?;
        eprintln!("pushed one commit over HTTP in {:.1} s", pushed.elapsed().as_secs_f64());
        let settled = wait_until_settled(server.pid()).await?;
        eprintln!("server settled after {:.1} s more; server RSS {}", settled.as_secs_f64(), rss(server.pid()));
    }

    let transport = if args.https { "loopback HTTPS/1.1" } else { "loopback HTTP/1.1" };
    println!("| Read ({} Pods, {transport}) | Runs | p50 | p99 | Items | Bytes per LIST | Anchor |", args.pods);
    println!("|---|---|---|---|---|---|---|");
    for (name, limit, accept, account) in [
        ("LIST cluster-wide, unpaged (JSON)", None, "application/json", false),
        ("LIST cluster-wide, unpaged (JSON), ServiceAccount token (RBAC)", None, "application/json", true),
        ("LIST cluster-wide, limit=500 pages (JSON, client-go)", Some(500), "application/json", false),
        ("LIST cluster-wide, limit=500 pages (JSON), ServiceAccount token (RBAC)", Some(500), "application/json", true),
        ("LIST cluster-wide, limit=500 pages (Table, kubectl get -A)", Some(500), TABLE, false),
    ] {
        // A connection of its own per row: the server closes one idle for 10 s.
        let token = if account { account_token.as_str() } else { procs::READ_TOKEN };
        let c = &mut Connection::open(&target, token).await?;
        let mut took = Vec::new();
        let mut last = (0, 0);
        list_all(c, limit, accept).await?; // warm-up: SQLite's page cache, the allocator
        for _ in 0..args.lists {
            let t = Instant::now();
            last = list_all(c, limit, accept).await?;
            took.push(t.elapsed());
        }
        if last.0 != args.pods {
            bail!("{name}: {} items, not {}", last.0, args.pods);
        }
        took.sort();
        println!(
            "| {name} | {} | {} | {} | {} | {:.1} MiB | SLO 30 s; goal 1 s |",
            args.lists,
            ms(quantile(&took, 0.5)),
            ms(quantile(&took, 0.99)),
            last.0,
            last.1 as f64 / (1 << 20) as f64
        );
        eprintln!("{name}: done");
    }

    for (what, token) in [("", procs::READ_TOKEN), (", ServiceAccount token (RBAC)", account_token.as_str())] {
        get_row(&args, &target, token, what).await?;
    }
    eprintln!("server RSS at the end: {}", rss(server.pid()));
    println!();
    println!("| Authorization decision (in process) | Decisions | Mean |");
    println!("|---|---|---|");
    for row in api_rbac::decision_rows(&rbac, 1_000_000)? {
        println!("{row}");
    }
    Ok(())
}

/// The GET row: `args.readers` concurrent readers of one Pod each, for `args.duration`.
async fn get_row(args: &ApiArgs, target: &Target, token: &str, what: &str) -> Result<()> {
    let window = Duration::from_secs_f64(args.duration);
    let (mut readers, pods) = (Vec::new(), args.pods);
    for r in 0..args.readers {
        let (target, token, step) = (target.clone(), token.to_owned(), args.readers);
        readers.push(tokio::spawn(async move {
            let mut c = Connection::open(&target, &token).await?;
            let mut took = Vec::new();
            let end = Instant::now() + window;
            let mut i = r;
            while Instant::now() < end {
                let n = (i * 7_919) % pods;
                let path = format!("/api/v1/namespaces/ns-{}/pods/web-{n:06}", n % NAMESPACES);
                let t = Instant::now();
                c.get(&path, "application/json").await?;
                took.push(t.elapsed());
                i += step;
            }
            anyhow::Ok(took)
        }));
    }
    let mut took = Vec::new();
    for reader in readers {
        took.extend(reader.await??);
    }
    took.sort();
    println!(
        "| GET one Pod, {} concurrent readers ({:.0} reads/s){what} | {} | {} | {} | 1 | | SLO 1 s |",
        args.readers,
        took.len() as f64 / args.duration,
        took.len(),
        ms(quantile(&took, 0.5)),
        ms(quantile(&took, 0.99)),
    );
    Ok(())
}

/// Pushes one commit with one ConfigMap over HTTP to the hosted repository `bench`, which no
/// Application follows: the verdict only has to read this replica's informer cache.
async fn push(dir: &Path, addr: SocketAddr, token: &str) -> Result<()> {
    let work = dir.join("bench-work");
    std::fs::create_dir_all(&work)?;
    std::fs::write(work.join("settings.yaml"), "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\n")?;
    git(git_in(&work).args(["init", "--quiet"])).await?;
    git(git_in(&work).args(["add", "-A"])).await?;
    git(git_in(&work).args(["commit", "--quiet", "-m", "one ConfigMap"])).await?;
    let remote = format!("http://git:{token}@{addr}/git/bench.git");
    git(git_in(&work).args(["push", "--quiet", &remote, "HEAD:refs/heads/main"])).await
}

/// A process's resident set size, from `/proc/PID/status`.
fn rss(pid: u32) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok());
    kib.map_or_else(|| "?".into(), |k| format!("{:.0} MiB", k as f64 / 1024.0))
}

/// Waits until `pid` uses under a tenth of a core over one second. How long that took.
async fn wait_until_settled(pid: u32) -> Result<Duration> {
    let started = Instant::now();
    let mut before = procs::cpu_time(&[pid]);
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = procs::cpu_time(&[pid]);
        if now.saturating_sub(before) < Duration::from_millis(100) {
            return Ok(started.elapsed());
        }
        if started.elapsed() > Duration::from_secs(300) {
            bail!("the server still used {:?} of CPU per second after 5 minutes", now.saturating_sub(before));
        }
        before = now;
    }
}

/// Asks for Pod lists (one item) until the API server's watch cache serves them: the first
/// LIST starts its fill, the store answers until it is in. How long that took.
async fn wait_for_cache(c: &mut Connection, addr: SocketAddr) -> Result<Duration> {
    let started = Instant::now();
    loop {
        c.get("/api/v1/pods?limit=1", "application/json").await?;
        let metrics = gitplane_testkit::http_get_async(addr, "/metrics", Some(procs::READ_TOKEN), procs::GET_TIMEOUT)
            .await
            .unwrap_or_default();
        let hits = metrics
            .lines()
            .filter(|l| l.starts_with("apiserver_cache_list_total{") && l.contains("resource=\"pods\""))
            .filter(|l| l.contains("result=\"hit\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>();
        if hits > 0.0 {
            return Ok(started.elapsed());
        }
        if started.elapsed() > Duration::from_secs(600) {
            bail!("the API server's list cache did not serve Pods within 10 minutes");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
