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
//! Everything runs on loopback; nginx is started with a configuration of ours in a temporary
//! directory and stopped by its pid.

use anyhow::{Context as _, Result, bail, ensure};
use bytes::Bytes;
use gitplane_nodeagent::{
    ingress::{Routes, Snapshot, proxy::Proxy},
    network::View,
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
    routes.store(Snapshot { table: gitplane_nodeagent::ingress::table(view), certificates: Default::default() });
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

fn free_port() -> Result<SocketAddr> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
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

    eprintln!("throughput through the agent's proxy ({} connections, {} s)...", args.connections, args.seconds);
    let ours = throughput(ingress_addr, &args).await;
    let nginx_addr = free_port()?;
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

    // Propagation with `routes` paths loaded and the load running on `/`.
    set_ingress(&mut view, args.routes, upstreams.len())?;
    swap(&routes, &view);
    // The table build alone, with no load running: what a change costs the agent's CPU.
    let mut builds: Vec<Duration> = (0..20)
        .map(|_| {
            let start = Instant::now();
            std::hint::black_box(gitplane_nodeagent::ingress::table(&view));
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
        let exact = gitplane_nodeagent::ingress::PathMatch::Exact(path.clone());
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
