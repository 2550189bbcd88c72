//! `gitplane-bench page`: the status page with 1,000 Applications and 10,000 Pods. The
//! Applications (each a path of one hosted repository, `bench.git`, holding one ConfigMap) and the
//! Pods (bound to 100 Nodes that have no agent, so nothing runs them) are written straight into a
//! replica's SQLite store before `gitplane server` starts on it; the server's source then syncs
//! every Application for real. Measured over loopback HTTP/1.0 with a read token: the time to
//! render each view (what a browser waits for before it can paint; the page's CSS and script
//! are small, embedded and cached), and the update latency after a push: from `git push`
//! returning to the moment the list's fragment shows the new commit, fetched the way the page's
//! script does it (follow the Applications' watch; fetch the view at an event, at most one fetch
//! starting every 50 ms, one more after the last event).

use crate::procs::{self, Child, READ_TOKEN};
use anyhow::{Context as _, Result, bail};
use gitplane_storage::sqlite::{Durability, SqliteStore};
use gitplane_store::{Op, Store};
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};
use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};

#[derive(clap::Args, Clone)]
pub struct PageArgs {
    #[arg(long, default_value_t = 1_000)]
    applications: usize,
    #[arg(long, default_value_t = 10_000)]
    pods: usize,
    /// Renders of each view.
    #[arg(long, default_value_t = 20)]
    renders: usize,
    /// Pushes measured.
    #[arg(long, default_value_t = 5)]
    pushes: usize,
    /// The `gitplane` binary (default: next to this one).
    #[arg(long)]
    gitplane: Option<PathBuf>,
    /// Log the server's source at debug level into this file and print, per push, when each
    /// step of the update happened (the server's timeline from the log, the page's from here).
    #[arg(long)]
    trace: Option<PathBuf>,
}

/// The source's debug lines a push's update passes through, in order: (message, whether the
/// line names the pushed Application).
const TIMELINE: [(&str, bool); 6] = [
    ("a ref moved", false),
    ("a push's Applications queued", false),
    ("sync started", true),
    ("commit loaded", true),
    ("plan committed", true),
    ("status written", true),
];

/// The time of the first line of `log` after `after` with `message` (and `application`, when
/// given) for each step of [`TIMELINE`].
fn timeline(log: &str, after: Timestamp, application: &str) -> Vec<Option<Timestamp>> {
    let lines: Vec<(Timestamp, String)> = log
        .lines()
        .filter_map(|line| {
            let plain = strip_ansi(line);
            let time: Timestamp = plain.split_whitespace().next()?.parse().ok()?;
            (time >= after).then_some((time, plain))
        })
        .collect();
    TIMELINE
        .iter()
        .map(|(message, named)| {
            lines
                .iter()
                .find(|(_, l)| l.contains(message) && (!named || l.contains(&format!("application={application}"))))
                .map(|(t, _)| *t)
        })
        .collect()
}

/// A log line without its colours.
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            chars.by_ref().find(|c| c.is_ascii_alphabetic());
        } else {
            out.push(c);
        }
    }
    out
}

fn since(from: Timestamp, to: Timestamp) -> String {
    format!("{:+.0}", (to.as_microsecond() - from.as_microsecond()) as f64 / 1e3)
}

const NAMESPACES: usize = 100;
const NODES: usize = 100;
const BATCH: usize = 2_000;

fn app(i: usize) -> Value {
    json!({
        "apiVersion": "gitplane.io/v1", "kind": "Application",
        "metadata": {"name": format!("app-{i:04}"), "namespace": "gitplane-system"},
        "spec": {"repo": "bench", "branch": "main", "path": format!("apps/app-{i:04}"),
                 "namespace": format!("ns-{}", i % NAMESPACES)},
    })
}

fn pod(i: usize) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("web-{i:05}"), "namespace": format!("ns-{}", i % NAMESPACES),
                     "labels": {"app": format!("web-{}", i % 1_000)}, "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"nodeName": format!("node-{}", i % NODES), "containers": [{"name": "web", "image": "gitplane.local/httpd:1",
                 "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]},
        "status": {"phase": "Running", "podIP": format!("10.244.{}.{}", (i / 250) % 256, i % 250 + 2),
                   "conditions": [{"type": "Ready", "status": "True"}],
                   "containerStatuses": [{"name": "web", "ready": true, "restartCount": 0,
                                          "state": {"running": {"startedAt": "2026-01-01T00:00:02Z"}}}]},
    })
}

/// A node that reports capacity but runs nothing (no agent, no Lease: it goes Ready=Unknown).
fn node(i: usize) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": format!("node-{i}"), "creationTimestamp": "2026-01-01T00:00:00Z"},
        "status": {"capacity": {"cpu": "16", "memory": "64Gi", "pods": "110"},
                   "allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110"},
                   "conditions": [{"type": "Ready", "status": "True"}]},
    })
}

fn git(dir: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_AUTHOR_NAME", "bench")
        .env("GIT_AUTHOR_EMAIL", "bench@localhost")
        .env("GIT_COMMITTER_NAME", "bench")
        .env("GIT_COMMITTER_EMAIL", "bench@localhost")
        .output()?;
    if !out.status.success() {
        bail!("git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Application `i`'s one object (ten Applications share each namespace).
fn config_map(i: usize, round: usize) -> String {
    format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings-{i}\ndata:\n  round: \"{round}\"\n")
}

async fn get(addr: SocketAddr, path: &str) -> Result<String> {
    gitplane_testkit::http_get_async(addr, path, Some(READ_TOKEN), procs::GET_TIMEOUT).await
}

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1]
}

/// `page.js`'s GAP: at most one fetch of the view starts in this time.
const GAP: Duration = Duration::from_millis(50);

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

pub fn main(args: PageArgs) -> Result<()> {
    let gitplane = procs::prepare(args.gitplane.as_deref(), None)?;
    if !gitplane.exists() {
        bail!("no gitplane binary at {}: build it or pass --gitplane", gitplane.display());
    }
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(run(args, gitplane))
}

async fn run(args: PageArgs, gitplane: PathBuf) -> Result<()> {
    let dir = tempfile::Builder::new().prefix("gitplane-bench-page-").tempdir()?;
    let (data, repos, work) = (dir.path().join("replica-1"), dir.path().join("repos"), dir.path().join("work"));
    std::fs::create_dir_all(data.join("store"))?;
    std::fs::create_dir_all(&repos)?;
    let bare = repos.join("bench.git");
    let out = Command::new("git").args(["init", "--quiet", "--bare", "--initial-branch=main"]).arg(&bare).status()?;
    if !out.success() {
        bail!("git init --bare failed");
    }
    std::fs::create_dir_all(&work)?;
    git(&work, &["init", "--quiet", "--initial-branch=main"])?;
    for i in 0..args.applications {
        let path = work.join(format!("apps/app-{i:04}"));
        std::fs::create_dir_all(&path)?;
        std::fs::write(path.join("settings.yaml"), config_map(i, 0))?;
    }
    git(&work, &["add", "--all"])?;
    git(&work, &["commit", "--quiet", "-m", "1,000 applications"])?;
    git(&work, &["push", "--quiet", bare.to_str().context("path")?, "HEAD:main"])?;
    {
        let store = SqliteStore::open(&data.join("store/store.db"), Durability::Replicated).await?;
        let namespaces = (0..NAMESPACES).map(|i| {
            Op::Create(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": format!("ns-{i}")}}))
        });
        store.txn(namespaces.collect()).await?;
        store.txn((0..args.applications).map(|i| Op::Create(app(i))).collect()).await?;
        store.txn((0..NODES).map(|i| Op::Create(node(i))).collect()).await?;
        for start in (0..args.pods).step_by(BATCH) {
            store.txn((start..(start + BATCH).min(args.pods)).map(|i| Op::Create(pod(i))).collect()).await?;
        }
    }
    let addr = gitplane_testkit::free_port()?;
    std::fs::write(dir.path().join("peer-token"), procs::PEER_TOKEN)?;
    std::fs::write(dir.path().join("join-token"), format!("join-{}", procs::PEER_TOKEN))?;
    std::fs::write(dir.path().join("tokens.csv"), format!("{READ_TOKEN},bench,bench,\"read\"\n"))?;
    let mut command = Command::new(&gitplane);
    command
        .arg("server")
        .args(["--id", "1", "--peers", &format!("1={addr}")])
        .arg("--data-dir")
        .arg(&data)
        .arg("--repos-dir")
        .arg(&repos)
        .arg("--peer-token-file")
        .arg(dir.path().join("peer-token"))
        .arg("--join-token-file")
        .arg(dir.path().join("join-token"))
        .arg("--tokens-file")
        .arg(dir.path().join("tokens.csv"))
        .env_remove("RUST_LOG");
    if args.trace.is_some() {
        command.env("RUST_LOG", "info,sqlx=warn,tower=warn,h2=warn,openraft=warn,gitplane::source=debug");
    }
    let log = args.trace.clone().unwrap_or_else(|| dir.path().join("server.log"));
    let _server = Child::spawn("gitplane server", command, &log)?;
    let logs = || std::fs::read_to_string(&log).unwrap_or_default();
    procs::wait_for("the server ready", Duration::from_secs(120), || async move {
        gitplane_testkit::http_get_async(addr, "/readyz", None, procs::GET_TIMEOUT).await.ok()
    })
    .await
    .with_context(logs)?;
    let head = git(&bare, &["rev-parse", "main"])?;
    let started = Instant::now();
    let apps = args.applications;
    let head_ref = head.clone();
    procs::wait_for("every Application synced", Duration::from_secs(900), || {
        let head = head_ref.clone();
        async move {
            let body = get(addr, "/apis/gitplane.io/v1/applications").await.ok()?;
            let list: Value = serde_json::from_str(&body).ok()?;
            let synced =
                list["items"].as_array()?.iter().filter(|a| a["status"]["sync"]["revision"] == head.as_str()).count();
            (synced == apps).then_some(())
        }
    })
    .await
    .with_context(logs)?;
    eprintln!("{apps} Applications synced in {:.1} s", started.elapsed().as_secs_f64());

    println!(
        "| View ({} Applications, {} Pods, loopback HTTP/1.0) | First | Renders | p50 | p99 | Bytes | Goal |",
        args.applications, args.pods
    );
    println!("|---|---|---|---|---|---|---|");
    for (name, path) in [
        ("Application list, first page of 50 (`/`)", "/".to_owned()),
        ("Application list, live fragment (`/?fragment=1`)", "/?fragment=1".to_owned()),
        (
            "One Application: errors, tree (100 Pods in its namespace), timeline",
            "/ui/applications/gitplane-system/app-0000".to_owned(),
        ),
        ("Nodes: allocation and Pod count per node (Pod index)", "/ui/nodes".to_owned()),
        ("One node: allocation, first page of its Pods", "/ui/nodes/node-0".to_owned()),
    ] {
        // The first render: the first visit of `/` starts the nodes view's Pod index.
        let t = Instant::now();
        get(addr, &path).await?;
        let first = t.elapsed();
        let mut took = Vec::new();
        let mut bytes = 0;
        for _ in 0..args.renders {
            let t = Instant::now();
            bytes = get(addr, &path).await?.len();
            took.push(t.elapsed());
        }
        took.sort();
        println!(
            "| {name} | {} | {} | {} | {} | {:.0} KiB | first render 1 s |",
            ms(first),
            args.renders,
            ms(quantile(&took, 0.5)),
            ms(quantile(&took, 0.99)),
            bytes as f64 / 1024.0
        );
    }

    let mut latencies = Vec::new();
    for round in 1..=args.pushes {
        // The watch the page's script opens, from the revision its view was rendered at.
        let fragment = get(addr, "/?fragment=1").await?;
        let rv = fragment.split("data-rv=\"").nth(1).and_then(|r| r.split('"').next()).context("data-rv")?.to_owned();
        let (events_tx, mut events) = tokio::sync::mpsc::unbounded_channel();
        // When the watch delivered app-0000's status with the pushed commit (set once known).
        let (sha_tx, sha_rx) = tokio::sync::watch::channel(String::new());
        let (delivered_tx, delivered) = tokio::sync::oneshot::channel::<Timestamp>();
        let watch = tokio::spawn(async move {
            let mut delivered_tx = Some(delivered_tx);
            let mut stream = tokio::net::TcpStream::connect(addr).await?;
            let request = format!(
                "GET /ui/apis/gitplane.io/v1/applications?watch=1&resourceVersion={rv} HTTP/1.0\r\nHost: {addr}\r\n\
                 Authorization: Bearer {READ_TOKEN}\r\n\r\n"
            );
            stream.write_all(request.as_bytes()).await?;
            let mut lines = BufReader::new(stream).lines();
            while let Some(line) = lines.next_line().await? {
                if !line.starts_with('{') {
                    continue;
                }
                let sha = sha_rx.borrow().clone();
                if !sha.is_empty()
                    && line.contains("\"app-0000\"")
                    && line.contains(&sha)
                    && let Some(tx) = delivered_tx.take()
                {
                    let _ = tx.send(Timestamp::now());
                }
                if events_tx.send(()).is_err() {
                    break;
                }
            }
            anyhow::Ok(())
        });
        std::fs::write(work.join("apps/app-0000/settings.yaml"), config_map(0, round))?;
        git(&work, &["commit", "--quiet", "-am", &format!("round {round}")])?;
        let sha = git(&work, &["rev-parse", "HEAD"])?;
        sha_tx.send_replace(sha.clone());
        // The ref moves before `git push` returns: the server's lines are read from here on.
        let pushing = Timestamp::now();
        git(&work, &["push", "--quiet", bare.to_str().context("path")?, "HEAD:main"])?;
        let pushed = Instant::now();
        let pushed_at = Timestamp::now();
        let mut requested = pushed_at;
        let shown = async {
            let mut last_start: Option<Instant> = None;
            loop {
                events.recv().await.context("the watch ended")?;
                if let Some(last) = last_start {
                    tokio::time::sleep_until((last + GAP).into()).await;
                }
                while events.try_recv().is_ok() {}
                last_start = Some(Instant::now());
                requested = Timestamp::now();
                if get(addr, "/?fragment=1").await?.contains(&sha[..8]) {
                    return anyhow::Ok(pushed.elapsed());
                }
            }
        };
        let took = tokio::time::timeout(Duration::from_secs(120), shown).await.context("no update within 120 s")??;
        let shown_at = Timestamp::now();
        watch.abort();
        eprintln!("push {round} ({}): shown after {}", &sha[..8], ms(took));
        if args.trace.is_some() {
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            let steps = timeline(&log, pushing, "gitplane-system/app-0000");
            let mut line = format!("  timeline (ms after `git push` returned, {pushed_at}):");
            for ((message, _), at) in TIMELINE.iter().zip(steps) {
                let at = at.map_or("?".to_owned(), |t| since(pushed_at, t));
                line.push_str(&format!(" {message} {at},"));
            }
            let delivered = delivered.await.map_or("?".to_owned(), |t| since(pushed_at, t));
            eprintln!(
                "{line} watch event {delivered}, fragment requested {}, shown {}",
                since(pushed_at, requested),
                since(pushed_at, shown_at)
            );
        }
        latencies.push(took);
    }
    latencies.sort();
    println!(
        "| Update after `git push` (watch event, fragment fetched at once, at most every 50 ms, shows the commit) | | {} | {} | {} | | update 500 ms |",
        args.pushes,
        ms(quantile(&latencies, 0.5)),
        ms(quantile(&latencies, 0.99))
    );
    Ok(())
}
