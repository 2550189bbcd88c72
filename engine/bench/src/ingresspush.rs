//! `gitplane-bench ingress-push`: route propagation from `git push` to the new route answering,
//! on the real `gitplane up --nodes N`.
//!
//! `--routes` Ingress paths for `shop.example` (Ingresses of 100 paths each, to the demo's `web`
//! Service) and `/` are pushed and load; then each of `--changes` commits adds a host
//! `new-<i>.shop.example` to the Ingress `bench-change` and is pushed. A prober times from the
//! push starting (and from it returning) until `GET /` for the new host answers 2xx through
//! node 1's Ingress controller (before the change that host has no rule: 404), while a load
//! generator keeps sending `GET /` for `shop.example` and counts every non-2xx or failed
//! request. Prober and load generator run on threads moved into the namespace `gitplane up` made
//! for its bridge, so every packet stays inside the namespaces it made.

use crate::{
    ingress::{Counts, load, ms, percentile},
    up::{self, Up, git, git_in, load_average},
};
use anyhow::{Context as _, Result, ensure};
use std::{
    fmt::Write as _,
    io::{Read as _, Write as _},
    net::{Ipv4Addr, SocketAddr, TcpStream},
    os::fd::AsRawFd as _,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    time::{Duration, Instant},
};

#[derive(clap::Args)]
pub struct IngressPushArgs {
    /// Ingress paths loaded before the changes (in Ingresses of 100 paths).
    #[arg(long, default_value_t = 5000)]
    routes: usize,
    /// Pushed Ingress changes timed.
    #[arg(long, default_value_t = 100)]
    changes: usize,
    /// Nodes of `gitplane up --nodes`.
    #[arg(long, default_value_t = 1)]
    nodes: u16,
    /// Keep-alive connections of the load generator.
    #[arg(long, default_value_t = 8)]
    connections: usize,
    /// The `gitplane` binary (default: next to this one).
    #[arg(long)]
    gitplane: Option<PathBuf>,
}

const PATHS_PER_INGRESS: usize = 100;
/// A change not answering by then counts as missing.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(30);
const DEADLINE: Duration = Duration::from_secs(300);
/// How often the prober asks while it waits for a new route.
const PROBE_INTERVAL: Duration = Duration::from_millis(2);

pub fn main(args: IngressPushArgs) -> Result<()> {
    let args = &args;
    up::main(args.gitplane.as_deref(), |gitplane| async move { run(args, &gitplane).await })
}

fn ingress(name: &str, rules: &str) -> String {
    format!("apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: {name}\nspec:\n  rules:\n{rules}")
}

fn path(path: &str) -> String {
    format!(
        "          - path: {path}\n            pathType: Prefix\n            backend:\n              service:\n                \
         name: web\n                port:\n                  number: 80\n"
    )
}

fn shop_rule(paths: &str) -> String {
    format!("    - host: shop.example\n      http:\n        paths:\n{paths}")
}

/// The Ingress `bench-change` after change `last`: hosts new-0 .. new-`last`, `/` to web.
fn change_ingress(last: usize) -> String {
    let rules: String = (0..=last)
        .map(|i| format!("    - host: new-{i}.shop.example\n      http:\n        paths:\n{}", path("/")))
        .collect();
    ingress("bench-change", &rules)
}

async fn run(args: &IngressPushArgs, gitplane: &Path) -> Result<()> {
    let load_before = load_average();
    eprintln!("starting gitplane up --nodes {}", args.nodes);
    let up = Up::start(gitplane, args.nodes).await?;
    let work = up.dir().join("demo-work");
    git(tokio::process::Command::new("git").arg("clone").arg("--quiet").arg(up.repos_dir.join("demo.git")).arg(&work))
        .await?;
    std::fs::write(work.join("bench-root.yaml"), ingress("bench-root", &shop_rule(&path("/"))))?;
    // The demo's httpd answers 404 for the paths: the host `loaded.shop.example`, in the same
    // commit, answering says the commit's routes are in.
    let loaded = format!("    - host: loaded.shop.example\n      http:\n        paths:\n{}", path("/"));
    std::fs::write(work.join("bench-loaded.yaml"), ingress("bench-loaded", &loaded))?;
    for (file, first) in (0..args.routes).step_by(PATHS_PER_INGRESS).enumerate() {
        let paths: String =
            (first..(first + PATHS_PER_INGRESS).min(args.routes)).map(|n| path(&format!("/route-{n}"))).collect();
        std::fs::write(
            work.join(format!("bench-routes-{file}.yaml")),
            ingress(&format!("bench-routes-{file}"), &shop_rule(&paths)),
        )?;
    }
    eprintln!("pushing {} Ingress paths", args.routes + 1);
    git(git_in(&work).args(["add", "--all"])).await?;
    git(git_in(&work).args(["commit", "--quiet", "-m", "bench: Ingress paths"])).await?;
    git(git_in(&work).args(["push", "--quiet", "origin", "HEAD:main"])).await?;

    let node = up.nodes.first().context("a node")?;
    let ip = node_ip(&up, node).await?;
    let addr = SocketAddr::from((ip, 80));
    let netns = Path::new("/run/netns").join(format!("{}-net", up.base));
    let prober = Prober::start(netns.clone(), addr)?;
    for (host, path) in [("shop.example", "/"), ("loaded.shop.example", "/")] {
        prober
            .wait(host, path, DEADLINE)
            .await
            .with_context(|| format!("{host}{path} never answered\n{}", up.log_tail()))?;
    }
    eprintln!("{} paths answer through {node} ({ip})", args.routes + 1);

    let stop = Arc::new(AtomicBool::new(false));
    let loader = {
        let (stop, netns, connections) = (stop.clone(), netns.clone(), args.connections);
        std::thread::spawn(move || -> Result<Counts> {
            enter(&netns)?;
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            Ok(runtime.block_on(load(addr, "/", connections, stop)))
        })
    };
    let (mut from_push, mut from_return, mut pushes, mut missing) = (Vec::new(), Vec::new(), Vec::new(), 0);
    for change in 0..args.changes {
        std::fs::write(work.join("bench-change.yaml"), change_ingress(change))?;
        git(git_in(&work).args(["add", "--all"])).await?;
        git(git_in(&work).args(["commit", "--quiet", "-m", &format!("bench: new-{change}.shop.example")])).await?;
        let host = format!("new-{change}.shop.example");
        let started = Instant::now();
        git(git_in(&work).args(["push", "--quiet", "origin", "HEAD:main"])).await?;
        let returned = Instant::now();
        match prober.wait(&host, "/", CHANGE_TIMEOUT).await {
            Ok(answered) => {
                from_push.push(answered - started);
                from_return.push(answered.saturating_duration_since(returned));
                pushes.push(returned - started);
            }
            Err(e) => {
                eprintln!("  change {change}: {e:#}");
                missing += 1;
            }
        }
        if (change + 1) % 20 == 0 {
            eprintln!("  {}/{}", change + 1, args.changes);
        }
    }
    stop.store(true, Ordering::Relaxed);
    let counts = loader.join().map_err(|_| anyhow::anyhow!("the load generator panicked"))??;
    let status = up.stop().await?;
    ensure!(status.success(), "gitplane up --nodes exited with {status}");
    for times in [&mut from_push, &mut from_return, &mut pushes] {
        times.sort();
    }
    let mut out = String::new();
    writeln!(
        out,
        "| Routes loaded | Changes | From push start p50 ms | p99 ms | max ms | From push return p50 ms | p99 ms | git push p50 ms | Missing | Requests during | Errors during |"
    )?;
    writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|")?;
    writeln!(
        out,
        "| {} | {} | {} | {} | {} | {} | {} | {} | {missing} | {} | {} |",
        args.routes + 1,
        args.changes,
        ms(percentile(&from_push, 0.5)),
        ms(percentile(&from_push, 0.99)),
        ms(from_push.last().copied().unwrap_or_default()),
        ms(percentile(&from_return, 0.5)),
        ms(percentile(&from_return, 0.99)),
        ms(percentile(&pushes, 0.5)),
        counts.latencies.len(),
        counts.errors
    )?;
    println!("{out}");
    println!("load average before / after: {load_before} / {}", load_average());
    Ok(())
}

async fn node_ip(up: &Up, node: &str) -> Result<Ipv4Addr> {
    let node = up.get(&format!("/api/v1/nodes/{node}")).await?;
    node["status"]["addresses"]
        .as_array()
        .and_then(|a| a.iter().find(|a| a["type"] == "InternalIP"))
        .and_then(|a| a["address"].as_str()?.parse().ok())
        .context("the node's InternalIP")
}

/// Moves this thread into the network namespace at `netns`.
fn enter(netns: &Path) -> Result<()> {
    let file = std::fs::File::open(netns).with_context(|| format!("opening {}", netns.display()))?;
    // SAFETY: setns on an open namespace fd; it affects this thread only.
    ensure!(
        unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } == 0,
        "setns {}: {}",
        netns.display(),
        std::io::Error::last_os_error()
    );
    Ok(())
}

/// Host, path, timeout, and where to say when it answered.
type Ask = (String, String, Duration, tokio::sync::oneshot::Sender<Result<Instant>>);

/// A thread in the bridge's namespace that, asked for a host and path, sends `GET` until one
/// answers 2xx and says when.
struct Prober {
    asks: Option<mpsc::Sender<Ask>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Prober {
    fn start(netns: PathBuf, addr: SocketAddr) -> Result<Prober> {
        let (asks, asked) = mpsc::channel::<Ask>();
        let (entered, entering) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            let _ = entered.send(enter(&netns));
            while let Ok((host, path, timeout, answer)) = asked.recv() {
                let deadline = Instant::now() + timeout;
                let result = loop {
                    match get(addr, &host, &path) {
                        Ok(200..=299) => break Ok(Instant::now()),
                        _ if Instant::now() >= deadline => {
                            break Err(anyhow::anyhow!("{host}{path}: no 2xx within {timeout:?}"));
                        }
                        _ => std::thread::sleep(PROBE_INTERVAL),
                    }
                };
                let _ = answer.send(result);
            }
        });
        entering.recv().context("the prober thread")??;
        Ok(Prober { asks: Some(asks), thread: Some(thread) })
    }

    /// When `GET path` for `host` first answered 2xx.
    async fn wait(&self, host: &str, path: &str, timeout: Duration) -> Result<Instant> {
        let (answer, answered) = tokio::sync::oneshot::channel();
        let asks = self.asks.as_ref().context("the prober stopped")?;
        asks.send((host.into(), path.into(), timeout, answer)).map_err(|_| anyhow::anyhow!("the prober stopped"))?;
        answered.await?
    }
}

impl Drop for Prober {
    fn drop(&mut self) {
        self.asks = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One `GET path` for `host` on a new connection: the status.
fn get(addr: SocketAddr, host: &str, path: &str) -> std::io::Result<u16> {
    let timeout = Duration::from_secs(5);
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    let head = String::from_utf8_lossy(&response[..response.len().min(64)]).into_owned();
    Ok(head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0))
}
