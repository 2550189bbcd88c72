//! `gitplane-bench ingress`: the agent's Ingress data plane against Debian's nginx configured by
//! hand as a reverse proxy to the same upstreams, in the same run, and route propagation.
//!
//! - Throughput: one load generator (HTTP/1.1 keep-alive, `--connections` connections, a fixed
//!   window) sends `GET /` for `shop.example` through each proxy to the same two upstream
//!   servers (keep-alive HTTP servers on loopback standing in for two Pods): requests/s, p50,
//!   p99, and errors.
//! - Propagation: with `--routes` Ingress paths loaded, `--changes` Ingress changes each add a
//!   new path; the time from the changed view reaching the agent's Ingress controller (what the
//!   network watch delivers) to the new path answering through the proxy, p50 / p99, while the
//!   load generator keeps sending to an existing path and counts every non-2xx.
//!
//! With `--baseline`, the throughput is measured instead with `wrk` against three proxies in
//! processes of their own, each in turn over several rounds: the proxy of another build of this
//! binary (`ingress-serve` of the commit to compare with), this build's, and nginx. Then one
//! client opens `--attack-connections` connections to each agent proxy, each sending a large
//! request head and all but the last byte of a 1 MiB body, and the proxy's resident memory is
//! read before and while they are held.
//!
//! Everything runs on loopback; nginx is started with a configuration of ours in a temporary
//! directory and stopped by its pid, the proxies' processes likewise.

use anyhow::{Context as _, Result, bail, ensure};
use bytes::Bytes;
use gitplane_nodeagent::{
    network::ingress::{Routes, Snapshot, proxy::Proxy},
    network::view::View,
};
use http_body_util::{BodyExt, Empty, Full};
use hyper::{Request, Response, body::Incoming, service::service_fn};
use hyper_util::rt::TokioIo;
use serde_json::json;
use std::{
    net::SocketAddr,
    process::{Child, Command},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};
use tokio::net::{TcpListener, TcpStream};

#[derive(clap::Args)]
pub struct IngressArgs {
    /// Concurrent keep-alive connections of the load generator.
    #[arg(long, default_value_t = 64)]
    connections: usize,
    /// How long each throughput window lasts, in seconds.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Ingress paths loaded before the propagation changes.
    #[arg(long, default_value_t = 5000)]
    routes: usize,
    /// Route changes measured.
    #[arg(long, default_value_t = 100)]
    changes: usize,
    /// The nginx binary.
    #[arg(long, default_value = "/usr/sbin/nginx")]
    nginx: std::path::PathBuf,
    /// A `gitplane-bench` binary of another commit: its proxy (`ingress-serve`) is measured
    /// beside this build's and nginx with `wrk`, each in a process of its own.
    #[arg(long)]
    baseline: Option<std::path::PathBuf>,
    /// Windows per proxy with `--baseline`, taken in turn (base, this, nginx; then backwards).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// The wrk binary (Debian's `wrk`), used with `--baseline`.
    #[arg(long, default_value = "/usr/bin/wrk")]
    wrk: std::path::PathBuf,
    /// wrk's threads, used with `--baseline`.
    #[arg(long, default_value_t = 1)]
    wrk_threads: usize,
    /// Connections one client opens to each agent proxy to measure what they cost it (0: skip).
    #[arg(long, default_value_t = 400)]
    attack_connections: usize,
}

#[derive(clap::Args)]
pub struct IngressServeArgs {
    /// Where the proxy listens.
    #[arg(long)]
    listen: SocketAddr,
    /// The upstreams `shop.example` is routed to (one Service each, as `ingress` sets up).
    #[arg(long, required = true)]
    upstream: Vec<SocketAddr>,
}

/// The agent's proxy alone, in front of `--upstream`, until killed: what `ingress --baseline`
/// measures in a process of its own, for this build and for another.
pub fn serve(args: IngressServeArgs) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread().thread_name("agent").enable_all().build()?;
    runtime.block_on(async {
        let routes = Arc::new(Routes::default());
        swap(&routes, &view(&args.upstream, 0)?);
        let listener = TcpListener::bind(args.listen).await?;
        let (_stop, stopped) = tokio::sync::watch::channel(false);
        eprintln!("the proxy listens on {}", args.listen);
        Proxy::new(routes).serve_http(listener, stopped).await;
        Ok(())
    })
}

pub fn main(args: IngressArgs) -> Result<()> {
    // The proxy runs on a runtime of its own, as in the agent's process (`#[tokio::main]`: a
    // worker per core), not on the load generator's and the upstreams' threads; nginx likewise
    // runs its own worker processes.
    let agent = tokio::runtime::Builder::new_multi_thread().thread_name("agent").enable_all().build()?;
    let bench = tokio::runtime::Builder::new_multi_thread().thread_name("bench").enable_all().build()?;
    bench.block_on(run(args, agent.handle().clone()))
}

/// A keep-alive HTTP server answering every request with a short body, as a Pod would.
async fn upstream() -> Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let service = service_fn(|_: Request<Incoming>| async {
                    Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from_static(b"shop\n"))))
                });
                let _ =
                    hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service).await;
            });
        }
    });
    Ok(addr)
}

/// The view the agent would hold: Services `shop` and `route-N` (each with both upstreams as
/// ready endpoints) and an Ingress with `/` and `routes` more paths for shop.example.
fn view(upstreams: &[SocketAddr], routes: usize) -> Result<View> {
    let mut view = View::default();
    let endpoints: Vec<_> =
        upstreams.iter().map(|a| json!({"addresses": [a.ip().to_string()], "conditions": {"ready": true}})).collect();
    // One Service per upstream port: the upstreams share an address and differ by port.
    for (i, upstream) in upstreams.iter().enumerate() {
        let name = format!("shop-{i}");
        let service = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "default"},
                             "spec": {"ports": [{"name": "http", "port": 80}]}});
        let slice = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("{name}-x"), "namespace": "default", "labels": {"kubernetes.io/service-name": name}},
            "addressType": "IPv4", "ports": [{"name": "http", "port": upstream.port()}], "endpoints": [endpoints[i].clone()]});
        let key = gitplane_store::ObjectKey::from_value(&service)?;
        view.services.insert(key, Arc::new(serde_json::from_value(service)?));
        let key = gitplane_store::ObjectKey::from_value(&slice)?;
        view.slices.insert(key, Arc::new(serde_json::from_value(slice)?));
    }
    set_ingress(&mut view, routes, upstreams.len())?;
    Ok(view)
}

/// The Ingress `shop` with `/` and `paths` more paths, spread over the Services.
fn set_ingress(view: &mut View, paths: usize, services: usize) -> Result<()> {
    let path = |p: &str, service: usize| {
        json!({"path": p, "pathType": "Prefix",
               "backend": {"service": {"name": format!("shop-{service}"), "port": {"number": 80}}}})
    };
    let mut all = vec![path("/", 0)];
    all.extend((0..paths).map(|n| path(&format!("/route-{n}"), n % services)));
    let ingress = json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
        "metadata": {"name": "shop", "namespace": "default", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"rules": [{"host": "shop.example", "http": {"paths": all}}]}});
    let key = gitplane_store::ObjectKey::from_value(&ingress)?;
    view.ingresses.insert(key, Arc::new(serde_json::from_value(ingress)?));
    Ok(())
}

fn swap(routes: &Routes, view: &View) {
    routes
        .store(Snapshot { table: gitplane_nodeagent::network::ingress::table(view), certificates: Default::default() });
}

/// What one load generator run saw.
#[derive(Default)]
pub(crate) struct Counts {
    pub(crate) latencies: Vec<Duration>,
    pub(crate) errors: u64,
}

/// `connections` keep-alive connections sending `GET path` to `addr` until `stop`.
pub(crate) async fn load(addr: SocketAddr, path: &'static str, connections: usize, stop: Arc<AtomicBool>) -> Counts {
    let tasks: Vec<_> = (0..connections)
        .map(|_| {
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut counts = Counts::default();
                let mut sender = None;
                while !stop.load(Ordering::Relaxed) {
                    if sender.is_none() {
                        match connect(addr).await {
                            Ok(s) => sender = Some(s),
                            Err(_) => {
                                counts.errors += 1;
                                tokio::time::sleep(Duration::from_millis(10)).await;
                                continue;
                            }
                        }
                    }
                    let Some(s) = sender.as_mut() else { continue };
                    let request = Request::get(path).header("host", "shop.example").body(Empty::<Bytes>::new());
                    let Ok(request) = request else { break };
                    let start = Instant::now();
                    let ok = match s.send_request(request).await {
                        Ok(response) => {
                            let status = response.status();
                            response.into_body().collect().await.is_ok() && status.is_success()
                        }
                        Err(_) => false,
                    };
                    if ok {
                        counts.latencies.push(start.elapsed());
                    } else {
                        counts.errors += 1;
                        sender = None;
                    }
                    if sender.as_ref().is_some_and(|s| s.is_closed()) {
                        sender = None;
                    }
                }
                counts
            })
        })
        .collect();
    let mut all = Counts::default();
    for t in tasks {
        if let Ok(c) = t.await {
            all.latencies.extend(c.latencies);
            all.errors += c.errors;
        }
    }
    all
}

async fn connect(addr: SocketAddr) -> Result<hyper::client::conn::http1::SendRequest<Empty<Bytes>>> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    sender.ready().await?;
    Ok(sender)
}

pub(crate) fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let index = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[index]
}

/// One throughput window against `addr`: (requests/s, p50, p99, errors).
async fn throughput(addr: SocketAddr, args: &IngressArgs) -> (f64, Duration, Duration, u64) {
    let stop = Arc::new(AtomicBool::new(false));
    let running = tokio::spawn(load(addr, "/", args.connections, stop.clone()));
    let window = Duration::from_secs(args.seconds);
    tokio::time::sleep(window).await;
    stop.store(true, Ordering::Relaxed);
    let mut counts = running.await.unwrap_or_default();
    counts.latencies.sort();
    let rate = counts.latencies.len() as f64 / window.as_secs_f64();
    (rate, percentile(&counts.latencies, 0.5), percentile(&counts.latencies, 0.99), counts.errors)
}

/// Debian's nginx as ingress-nginx configures it for one host: upstream keep-alive, the
/// balancer round robin over both upstreams, the same forwarded headers.
struct Nginx {
    child: Child,
    _dir: tempfile::TempDir,
}

impl Nginx {
    fn start(binary: &std::path::Path, listen: SocketAddr, upstreams: &[SocketAddr]) -> Result<Nginx> {
        ensure!(binary.exists(), "{} not found: install Debian's nginx (apt-get install nginx)", binary.display());
        let dir = tempfile::tempdir()?;
        let servers: String = upstreams.iter().map(|u| format!("    server {u};\n")).collect();
        let root = dir.path().display();
        let config = format!(
            "worker_processes auto;\ndaemon off;\npid {root}/nginx.pid;\nerror_log {root}/error.log warn;\n\
             events {{ worker_connections 4096; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {root}/body;\n  proxy_temp_path {root}/proxy;\n  \
             fastcgi_temp_path {root}/fastcgi;\n  uwsgi_temp_path {root}/uwsgi;\n  scgi_temp_path {root}/scgi;\n  \
             keepalive_requests 10000;\n  upstream shop {{\n{servers}    keepalive 320;\n  }}\n  \
             server {{\n    listen {listen};\n    server_name shop.example;\n    location / {{\n      \
             proxy_pass http://shop;\n      proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n      \
             proxy_set_header Host $host;\n      proxy_set_header X-Real-IP $remote_addr;\n      \
             proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;\n      \
             proxy_set_header X-Forwarded-Proto $scheme;\n      proxy_set_header X-Forwarded-Host $host;\n      \
             proxy_next_upstream error timeout;\n    }}\n  }}\n}}\n"
        );
        let file = dir.path().join("nginx.conf");
        std::fs::write(&file, config)?;
        let child = Command::new(binary)
            .arg("-c")
            .arg(&file)
            .arg("-p")
            .arg(dir.path())
            .stderr(std::process::Stdio::null())
            .spawn()
            .context("starting nginx")?;
        Ok(Nginx { child, _dir: dir })
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SIGQUIT: nginx's graceful stop, to the master we started.
        if let Ok(pid) = libc::pid_t::try_from(self.child.id()) {
            // SAFETY: kill(2) on our own child, not yet reaped.
            unsafe { libc::kill(pid, libc::SIGQUIT) };
        }
        let _ = self.child.wait();
    }
}

async fn wait_listening(addr: SocketAddr) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(addr).await.is_err() {
        if Instant::now() > deadline {
            bail!("nothing listens on {addr}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

pub(crate) fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
}

async fn run(args: IngressArgs, agent: tokio::runtime::Handle) -> Result<()> {
    let upstreams = vec![upstream().await?, upstream().await?];
    let mut view = view(&upstreams, 0)?;
    let routes = Arc::new(Routes::default());
    swap(&routes, &view);
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    let ingress_addr = listener.local_addr()?;
    let (_stop_proxy, stopped) = tokio::sync::watch::channel(false);
    let proxy = Proxy::new(routes.clone());
    agent.spawn(async move {
        match TcpListener::from_std(listener) {
            Ok(listener) => proxy.serve_http(listener, stopped).await,
            Err(error) => eprintln!("the proxy cannot listen: {error}"),
        }
    });

    if let Some(baseline) = &args.baseline {
        compare(&args, baseline, &upstreams).await?;
    } else {
        eprintln!("throughput through the agent's proxy ({} connections, {} s)...", args.connections, args.seconds);
        let ours = throughput(ingress_addr, &args).await;
        let nginx_addr = gitplane_testkit::free_port()?;
        let nginx = Nginx::start(&args.nginx, nginx_addr, &upstreams)?;
        wait_listening(nginx_addr).await?;
        eprintln!("throughput through nginx...");
        let theirs = throughput(nginx_addr, &args).await;
        drop(nginx);
        eprintln!("throughput through the agent's proxy again...");
        let ours_again = throughput(ingress_addr, &args).await;

        println!("| Proxy | Connections | Requests/s | p50 ms | p99 ms | Errors | vs nginx (rate) |");
        println!("|---|---|---|---|---|---|---|");
        for (name, (rate, p50, p99, errors)) in
            [("gitplane agent (run 1)", ours), ("Debian nginx", theirs), ("gitplane agent (run 2)", ours_again)]
        {
            println!(
                "| {name} | {} | {rate:.0} | {} | {} | {errors} | {:.2}× |",
                args.connections,
                ms(p50),
                ms(p99),
                rate / theirs.0.max(1.0)
            );
        }
    }

    // Propagation with `routes` paths loaded and the load running on `/`.
    set_ingress(&mut view, args.routes, upstreams.len())?;
    swap(&routes, &view);
    // The table build alone, with no load running: what a change costs the agent's CPU.
    let mut builds: Vec<Duration> = (0..20)
        .map(|_| {
            let start = Instant::now();
            std::hint::black_box(gitplane_nodeagent::network::ingress::table(&view));
            start.elapsed()
        })
        .collect();
    builds.sort();
    eprintln!(
        "building the table of {} paths alone: p50 {} ms, max {} ms",
        args.routes + 1,
        ms(percentile(&builds, 0.5)),
        ms(*builds.last().unwrap_or(&Duration::ZERO))
    );
    let stop = Arc::new(AtomicBool::new(false));
    let running = tokio::spawn(load(ingress_addr, "/", args.connections / 4 + 1, stop.clone()));
    let (mut times, mut rebuilds) = (Vec::with_capacity(args.changes), Vec::with_capacity(args.changes));
    let mut probe = connect(ingress_addr).await?;
    for change in 0..args.changes {
        let path = format!("/new-{change}");
        let exact = gitplane_nodeagent::network::ingress::PathMatch::Exact(path.clone());
        let service = format!("shop-{}", change % upstreams.len());
        let mut ingress = (**view.ingresses.values().next().context("the Ingress")?).clone();
        if let Some(rule) = ingress.spec.as_mut().and_then(|s| s.rules.as_mut()).and_then(|r| r.first_mut())
            && let Some(http) = rule.http.as_mut()
        {
            http.paths.push(serde_json::from_value(json!({"path": path, "pathType": "Exact",
                "backend": {"service": {"name": service, "port": {"number": 80}}}}))?);
        }
        let key = view.ingresses.keys().next().context("the Ingress")?.clone();
        let start = Instant::now();
        view.ingresses.insert(key, Arc::new(ingress));
        swap(&routes, &view);
        rebuilds.push(start.elapsed());
        // The first request after the swap must take the new route (`/` would answer it too,
        // so the table is asked which route it took).
        loop {
            let request = Request::get(path.as_str()).header("host", "shop.example").body(Empty::<Bytes>::new())?;
            let response = match probe.send_request(request).await {
                Ok(r) => r,
                Err(_) => {
                    probe = connect(ingress_addr).await?;
                    continue;
                }
            };
            let ok = response.status().is_success() && response.into_body().collect().await.is_ok();
            let routed = routes.load().table.route("shop.example", &path).is_some_and(|r| r.path == exact);
            ensure!(routed, "the new path {path} is not in the routing table");
            if ok {
                break;
            }
        }
        times.push(start.elapsed());
    }
    stop.store(true, Ordering::Relaxed);
    let counts = running.await.unwrap_or_default();
    times.sort();
    rebuilds.sort();
    println!();
    println!(
        "| Routes loaded | Changes | Propagation p50 ms | p99 ms | max ms | of which table rebuild p50 ms | p99 ms | Requests during | Errors during |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    println!(
        "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
        args.routes + 1,
        args.changes,
        ms(percentile(&times, 0.5)),
        ms(percentile(&times, 0.99)),
        ms(*times.last().unwrap_or(&Duration::ZERO)),
        ms(percentile(&rebuilds, 0.5)),
        ms(percentile(&rebuilds, 0.99)),
        counts.latencies.len(),
        counts.errors
    );
    Ok(())
}

/// One wrk window: requests/s, p50, p99 and errors (non-2xx answers and socket errors).
struct Window {
    rate: f64,
    p50: Duration,
    p99: Duration,
    errors: u64,
}

/// Runs wrk against `addr` for one window and reads its report.
fn wrk(args: &IngressArgs, addr: SocketAddr) -> Result<Window> {
    let output = Command::new(&args.wrk)
        .args(["-t", &args.wrk_threads.to_string(), "-c", &args.connections.to_string()])
        .args(["-d", &format!("{}s", args.seconds), "--latency", "-H", "Host: shop.example"])
        .arg(format!("http://{addr}/"))
        .output()
        .with_context(|| format!("running {} (apt-get install wrk)", args.wrk.display()))?;
    let report = String::from_utf8_lossy(&output.stdout);
    ensure!(output.status.success(), "wrk failed: {report}{}", String::from_utf8_lossy(&output.stderr));
    parse_wrk(&report).with_context(|| format!("reading wrk's report:\n{report}"))
}

fn parse_wrk(report: &str) -> Option<Window> {
    let duration = |text: &str| -> Option<Duration> {
        let split = text.find(|c: char| c.is_ascii_alphabetic())?;
        let (number, unit) = text.split_at(split);
        let number: f64 = number.parse().ok()?;
        let seconds = match unit {
            "us" => number / 1e6,
            "ms" => number / 1e3,
            "s" => number,
            "m" => number * 60.0,
            _ => return None,
        };
        Some(Duration::from_secs_f64(seconds))
    };
    let (mut rate, mut p50, mut p99, mut errors) = (None, None, None, 0);
    for line in report.lines().map(str::trim) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields.as_slice() {
            ["Requests/sec:", r] => rate = r.parse().ok(),
            ["50%", d] => p50 = duration(d),
            ["99%", d] => p99 = duration(d),
            ["Non-2xx", "or", "3xx", "responses:", n] => errors += n.parse::<u64>().ok()?,
            ["Socket", "errors:", rest @ ..] => {
                errors += rest.iter().filter_map(|f| f.trim_end_matches(',').parse::<u64>().ok()).sum::<u64>();
            }
            _ => {}
        }
    }
    Some(Window { rate: rate?, p50: p50?, p99: p99?, errors })
}

/// The proxy of `binary` (`gitplane-bench ingress-serve`) in a process of its own.
fn spawn_proxy(
    name: &str,
    binary: &std::path::Path,
    upstreams: &[SocketAddr],
    log: &std::path::Path,
) -> Result<(crate::procs::Child, SocketAddr)> {
    let addr = gitplane_testkit::free_port()?;
    let mut command = Command::new(binary);
    command.args(["ingress-serve", "--listen", &addr.to_string()]);
    for upstream in upstreams {
        command.args(["--upstream", &upstream.to_string()]);
    }
    Ok((crate::procs::Child::spawn(name, command, log)?, addr))
}

/// A process's resident memory, in bytes.
fn rss(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .context("VmRSS")?;
    Ok(kb * 1024)
}

/// The resident memory once it stops growing (unchanged within 1 MiB for 1 s, at most 20 s).
async fn settled_rss(pid: u32) -> Result<u64> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let (mut last, mut since) = (rss(pid)?, Instant::now());
    while Instant::now() < deadline && since.elapsed() < Duration::from_secs(1) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = rss(pid)?;
        if now.abs_diff(last) > 1 << 20 {
            (last, since) = (now, Instant::now());
        }
    }
    Ok(last)
}

/// What one client's held connections cost a proxy: resident memory before and while
/// `connections` connections each send a 60 KiB request head (under any header limit of 64 KiB)
/// and all but the last byte of a 1 MiB body, then wait; and how many were still open then.
async fn attack(pid: u32, addr: SocketAddr, connections: usize) -> Result<(u64, u64, usize)> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    const BODY: usize = 1 << 20;
    let before = settled_rss(pid).await?;
    let head = format!(
        "POST / HTTP/1.1\r\nHost: shop.example\r\nContent-Length: {BODY}\r\nX-Pad: {}\r\n\r\n",
        "a".repeat(60 << 10)
    );
    let (sent, mut sending) = tokio::sync::mpsc::channel::<bool>(connections.max(1));
    let mut tasks = Vec::new();
    for _ in 0..connections {
        let (head, sent) = (head.clone(), sent.clone());
        tasks.push(tokio::spawn(async move {
            let Ok(mut stream) = TcpStream::connect(addr).await else {
                let _ = sent.send(false).await;
                return;
            };
            let body = vec![b'b'; BODY - 1];
            let written = async { stream.write_all(head.as_bytes()).await.and(stream.write_all(&body).await) };
            let written = tokio::time::timeout(Duration::from_secs(10), written).await;
            // Open: nothing answered and the connection not closed within a moment.
            let mut byte = [0u8; 1];
            let open = matches!(written, Ok(Ok(())))
                && tokio::time::timeout(Duration::from_millis(500), stream.read(&mut byte)).await.is_err();
            let _ = sent.send(open).await;
            drop(sent);
            // Held until the measurement is taken (the task is then aborted).
            std::future::pending::<()>().await;
        }));
    }
    drop(sent);
    let mut open = 0;
    while let Some(held) = sending.recv().await {
        open += usize::from(held);
    }
    let during = settled_rss(pid).await?;
    for task in tasks {
        task.abort();
    }
    Ok((before, during, open))
}

/// The comparison with `--baseline`: base proxy, this build's, nginx, each in a process of its
/// own under wrk, in turn; then the memory one client's connections cost each agent proxy.
async fn compare(args: &IngressArgs, baseline: &std::path::Path, upstreams: &[SocketAddr]) -> Result<()> {
    let logs = tempfile::tempdir()?;
    let this = std::env::current_exe()?;
    let (base, base_addr) = spawn_proxy("base proxy", baseline, upstreams, &logs.path().join("base.log"))?;
    let (ours, our_addr) = spawn_proxy("this proxy", &this, upstreams, &logs.path().join("this.log"))?;
    let nginx_addr = gitplane_testkit::free_port()?;
    let nginx = Nginx::start(&args.nginx, nginx_addr, upstreams)?;
    for addr in [base_addr, our_addr, nginx_addr] {
        wait_listening(addr).await?;
    }
    let targets =
        [("gitplane agent, base", base_addr), ("gitplane agent, this build", our_addr), ("Debian nginx", nginx_addr)];
    let mut windows: Vec<Vec<Window>> = targets.iter().map(|_| Vec::new()).collect();
    for round in 0..args.rounds {
        let order: Vec<usize> = if round % 2 == 0 { vec![0, 1, 2] } else { vec![2, 1, 0] };
        for i in order {
            let (name, addr) = targets[i];
            // wrk blocks this thread only: the upstreams run on the runtime's workers.
            let window = wrk(args, addr)?;
            eprintln!(
                "round {}: {name}: {:.0} requests/s, p50 {} ms, p99 {} ms, {} errors",
                round + 1,
                window.rate,
                ms(window.p50),
                ms(window.p99),
                window.errors
            );
            windows[i].push(window);
        }
    }
    drop(nginx);
    let mean = |w: &[Window], f: &dyn Fn(&Window) -> f64| w.iter().map(f).sum::<f64>() / w.len().max(1) as f64;
    let rates: Vec<f64> = windows.iter().map(|w| mean(w, &|w| w.rate)).collect();
    println!(
        "| Proxy | Load | Connections | Requests/s (mean of {}) | each window | p50 ms | p99 ms | Errors | vs base (rate) | vs nginx (rate) |",
        args.rounds
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for ((name, _), (w, rate)) in targets.iter().zip(windows.iter().zip(&rates)) {
        let each: Vec<String> = w.iter().map(|w| format!("{:.0}", w.rate)).collect();
        println!(
            "| {name} | wrk -t{} | {} | {rate:.0} | {} | {:.2} | {:.2} | {} | {:.3}× | {:.2}× |",
            args.wrk_threads,
            args.connections,
            each.join(" / "),
            mean(w, &|w| w.p50.as_secs_f64() * 1e3),
            mean(w, &|w| w.p99.as_secs_f64() * 1e3),
            w.iter().map(|w| w.errors).sum::<u64>(),
            rate / rates[0].max(1.0),
            rate / rates[2].max(1.0),
        );
    }
    if args.attack_connections > 0 {
        println!();
        println!(
            "| Proxy | Connections one client opened | Still open, unanswered | RSS before MiB | RSS while held MiB | Growth MiB |"
        );
        println!("|---|---|---|---|---|---|");
        for (name, child, addr) in
            [("gitplane agent, base", &base, base_addr), ("gitplane agent, this build", &ours, our_addr)]
        {
            eprintln!("{name}: {} connections with 60 KiB heads and 1 MiB bodies...", args.attack_connections);
            let (before, during, open) = attack(child.pid(), addr, args.attack_connections).await?;
            let mib = |b: u64| b as f64 / f64::from(1 << 20);
            println!(
                "| {name} | {} | {open} | {:.0} | {:.0} | {:.0} |",
                args.attack_connections,
                mib(before),
                mib(during),
                mib(during.saturating_sub(before))
            );
        }
    }
    drop((base, ours));
    Ok(())
}
