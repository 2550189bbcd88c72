//! Cluster DNS next to unbound, on loopback, with dnsperf as the load.
//!
//! `cargo bench -p gitplane-nodeagent --bench dns [-- --seconds 10 --rounds 3]`
//!
//! Both servers hold the same 10,000 Service names (unbound as `local-data` in a static
//! local zone, with `.` refused so nothing is ever resolved outside). Each round runs dnsperf
//! against one server then the other: a throughput run (100 queries outstanding), then a
//! run at a fixed rate with per-query latencies (`-v`) for p50 / p99. The servers get CPU 1
//! and one thread each, dnsperf CPU 0. Prints one Markdown table on stdout (each column the
//! median over the rounds), and each run on stderr.

use std::net::{SocketAddr, UdpSocket};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use gitplane_nodeagent::network::dns::{Dns, Forwarding, Listeners, ServerConfig, ZoneConfig};
use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RecordType};
use k8s_openapi::api::core::v1::Service;

const SERVER_CPU: usize = 1;
/// tmpfs, for dnsperf's per-query output.
const SCRATCH: &str = "/dev/shm";
const CLIENT_CPU: usize = 0;
/// CoreDNS' published figure for its kubernetes plugin on 2 vCPUs.
const COREDNS_QPS: f64 = 33_669.0;

struct Args {
    services: usize,
    seconds: u32,
    rounds: usize,
    latency_qps: u32,
}

fn args() -> anyhow::Result<Args> {
    let mut args = Args { services: 10_000, seconds: 10, rounds: 3, latency_qps: 20_000 };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--services" => args.services = value()?.parse()?,
            "--seconds" => args.seconds = value()?.parse()?,
            "--rounds" => args.rounds = value()?.parse()?,
            "--latency-qps" => args.latency_qps = value()?.parse()?,
            "--bench" => {}
            other => bail!("unknown argument {other}"),
        }
    }
    Ok(args)
}

fn main() -> anyhow::Result<()> {
    let args = args()?;
    let pinned = std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2;
    if pinned {
        // Threads made from here on (the runtime, the UDP thread) inherit the CPU.
        pin_current_thread(SERVER_CPU)?;
    }
    let dir = TempDir::new()?;
    let names: Vec<(String, String, String)> = (0..args.services)
        .map(|i| (format!("ns-{}", i % 100), format!("svc-{i}"), format!("10.96.{}.{}", 1 + i / 250, 1 + i % 250)))
        .collect();
    // dnsperf walks the file in order: a stride spreads consecutive queries over the names.
    let stride = 7919 % args.services.max(1);
    let queries: String = (0..args.services)
        .map(|i| {
            let (ns, svc, _) = &names[(i * stride) % args.services];
            format!("{svc}.{ns}.svc.cluster.local A\n")
        })
        .collect();
    let query_file = dir.path().join("queries");
    std::fs::write(&query_file, queries)?;

    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    let _entered = runtime.enter();
    // Nothing outside the cluster domain is asked here; with no upstream it would be SERVFAIL.
    let dns = Dns::new(ZoneConfig::default(), Forwarding::default())?;
    let services: Vec<Service> = names.iter().map(|(ns, svc, ip)| service(ns, svc, ip)).collect();
    let started = Instant::now();
    for s in &services {
        dns.apply_service(s)?;
    }
    let load = started.elapsed();
    let server = dns.serve(
        Listeners::bind(&["127.0.0.1:0".parse()?])?,
        ServerConfig { udp_threads: 1, ..ServerConfig::default() },
    )?;
    let ours = server.udp_addrs()[0];
    let new_service = new_service_latency(&dns, ours)?;

    let unbound = Unbound::start(dir.path(), &names, pinned)?;
    for addr in [ours, unbound.addr] {
        wait_until_answered(addr, "svc-1.ns-1.svc.cluster.local.")?;
    }

    if pinned {
        // This thread only waits for dnsperf and reads its output: keep it off the servers' CPU.
        pin_current_thread(CLIENT_CPU)?;
    }
    let mut rows: Vec<(&str, Vec<Run>)> = vec![("gitplane agent", Vec::new()), ("unbound 1.17", Vec::new())];
    for round in 0..args.rounds {
        for (i, addr) in [ours, unbound.addr].into_iter().enumerate() {
            eprintln!("round {}/{}: {}", round + 1, args.rounds, rows[i].0);
            let pid = if i == 0 { std::process::id() } else { unbound.child.id() };
            let run = dnsperf(&query_file, addr, &args, pinned, pid)?;
            eprintln!(
                "  {:.0} queries/s, {:.1} µs CPU/query; at {} queries/s p50 {:.3} ms, p99 {:.3} ms",
                run.qps,
                run.cpu_per_query,
                args.latency_qps,
                run.p50 * 1e3,
                run.p99 * 1e3
            );
            rows[i].1.push(run);
        }
    }
    drop(unbound);
    server.shutdown();

    let cores = if pinned { "1 (CPU 1), 1 thread" } else { "shared, 1 thread" };
    println!(
        "| Server | Cores | Queries/s (median of {} runs, range) | Server CPU µs/query | Avg latency at that load | p50 / p99 at {} queries/s | Lost |",
        args.rounds, args.latency_qps
    );
    println!("|---|---|---|---|---|---|---|");
    for (name, runs) in &rows {
        let qps = sorted(runs.iter().map(|r| r.qps));
        println!(
            "| {name} | {cores} | {:.0} ({:.0}-{:.0}) | {:.1} | {:.2} ms | {:.3} / {:.3} ms | {} |",
            median(&qps),
            qps[0],
            qps[qps.len() - 1],
            median(&sorted(runs.iter().map(|r| r.cpu_per_query))),
            median(&sorted(runs.iter().map(|r| r.avg_latency * 1e3))),
            median(&sorted(runs.iter().map(|r| r.p50 * 1e3))),
            median(&sorted(runs.iter().map(|r| r.p99 * 1e3))),
            runs.iter().map(|r| r.lost).sum::<u64>(),
        );
    }
    println!("| CoreDNS 1.x, published | 2 vCPUs | {COREDNS_QPS:.0} | | | | |");
    let ratio = median(&sorted(rows[0].1.iter().map(|r| r.qps))) / median(&sorted(rows[1].1.iter().map(|r| r.qps)));
    println!();
    println!(
        "gitplane / unbound: {ratio:.2}x. dnsperf on CPU {CLIENT_CPU}, 100 queries outstanding, {} s per run, {} names.",
        args.seconds, args.services
    );
    println!(
        "Zone: {} Services applied in {:.1} ms ({:.1} µs each); a new Service answered {:.2} ms (p50) / {:.2} ms (max) after its apply began (20 tries).",
        args.services,
        load.as_secs_f64() * 1e3,
        load.as_secs_f64() * 1e6 / args.services.max(1) as f64,
        new_service.0 * 1e3,
        new_service.1 * 1e3,
    );
    Ok(())
}

fn sorted(values: impl Iterator<Item = f64>) -> Vec<f64> {
    let mut values: Vec<f64> = values.collect();
    values.sort_by(f64::total_cmp);
    values
}

fn median(sorted: &[f64]) -> f64 {
    sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN)
}

fn service(ns: &str, name: &str, ip: &str) -> Service {
    serde_json::from_value(serde_json::json!({
        "metadata": {"namespace": ns, "name": name},
        "spec": {"clusterIP": ip, "ports": [{"name": "http", "port": 80}]},
    }))
    .expect("a valid Service")
}

/// From the start of `apply_service` to the UDP answer naming the new address (p50, max).
fn new_service_latency(dns: &Dns, addr: SocketAddr) -> anyhow::Result<(f64, f64)> {
    let mut times = Vec::new();
    for i in 0..20 {
        let name = format!("fresh-{i}");
        let started = Instant::now();
        dns.apply_service(&service("bench", &name, &format!("10.100.0.{}", i + 1)))?;
        let answer = ask(addr, &format!("{name}.bench.svc.cluster.local."))?;
        times.push(started.elapsed().as_secs_f64());
        if answer.response_code != ResponseCode::NoError || answer.answers.is_empty() {
            bail!("{name} did not resolve: {:?}", answer.response_code);
        }
    }
    times.sort_by(f64::total_cmp);
    Ok((times[times.len() / 2], times[times.len() - 1]))
}

fn ask(addr: SocketAddr, name: &str) -> anyhow::Result<Message> {
    let socket = UdpSocket::bind("127.0.0.1:0")?;
    socket.set_read_timeout(Some(Duration::from_millis(200)))?;
    let mut q = Message::new(4242, MessageType::Query, OpCode::Query);
    q.add_query(Query::query(Name::from_ascii(name)?, RecordType::A));
    let packet = q.to_vec()?;
    let mut buf = [0u8; 4096];
    for _ in 0..5 {
        socket.send_to(&packet, addr)?;
        if let Ok((len, _)) = socket.recv_from(&mut buf) {
            return Ok(Message::from_vec(&buf[..len])?);
        }
    }
    bail!("{addr} did not answer {name}")
}

fn wait_until_answered(addr: SocketAddr, name: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if ask(addr, name).is_ok_and(|m| !m.answers.is_empty()) {
            return Ok(());
        }
    }
    bail!("{addr} never answered {name}")
}

struct Run {
    qps: f64,
    avg_latency: f64,
    lost: u64,
    /// Server CPU time (all its threads) per completed query, µs.
    cpu_per_query: f64,
    p50: f64,
    p99: f64,
}

/// CPU time of every thread of `pid` so far (schedstat: nanoseconds on a CPU).
fn cpu_ns(pid: u32) -> anyhow::Result<u64> {
    let mut total = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let stat = std::fs::read_to_string(task?.path().join("schedstat")).unwrap_or_default();
        total += stat.split_whitespace().next().and_then(|n| n.parse::<u64>().ok()).unwrap_or(0);
    }
    Ok(total)
}

fn dnsperf(queries: &Path, addr: SocketAddr, args: &Args, pinned: bool, server_pid: u32) -> anyhow::Result<Run> {
    let base = |extra: &[String]| -> anyhow::Result<String> {
        let mut cmd = if pinned {
            let mut c = Command::new("taskset");
            c.args(["-c", &CLIENT_CPU.to_string(), "dnsperf"]);
            c
        } else {
            Command::new("dnsperf")
        };
        cmd.args(["-s", &addr.ip().to_string(), "-p", &addr.port().to_string()]);
        cmd.arg("-d").arg(queries).args(["-q", "100"]).args(extra);
        // Into a file in memory, read afterwards: a pipe read during the run competes with a
        // CPU under test, and a file on disk made dnsperf's `-v` writes (and so its latencies)
        // stall for either server.
        let out_path = Path::new(SCRATCH).join(format!("gitplane-dnsperf-{}.out", std::process::id()));
        let status = cmd
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out_path)?)
            .stderr(Stdio::inherit())
            .status()
            .context("running dnsperf (Debian package dnsperf)")?;
        let out = std::fs::read_to_string(&out_path);
        let _ = std::fs::remove_file(&out_path);
        if !status.success() {
            bail!("dnsperf failed: {status}");
        }
        Ok(out?)
    };
    let cpu_before = cpu_ns(server_pid)?;
    let summary = base(&["-l".into(), args.seconds.to_string()])?;
    let cpu = cpu_ns(server_pid)? - cpu_before;
    let field = |text: &str, key: &str| -> anyhow::Result<String> {
        let line = text
            .lines()
            .find_map(|l| l.trim().strip_prefix(key))
            .with_context(|| format!("dnsperf printed no {key:?}"))?;
        Ok(line.trim().to_string())
    };
    let codes = field(&summary, "Response codes:")?;
    if !codes.starts_with("NOERROR") || codes.contains(',') {
        bail!("{addr}: not every answer was NOERROR: {codes}");
    }
    let qps: f64 = field(&summary, "Queries per second:")?.parse()?;
    let avg_latency: f64 = field(&summary, "Average Latency (s):")?.split_whitespace().next().unwrap_or("").parse()?;
    let lost: u64 = field(&summary, "Queries lost:")?.split_whitespace().next().unwrap_or("").parse()?;
    let completed: u64 = field(&summary, "Queries completed:")?.split_whitespace().next().unwrap_or("").parse()?;
    let cpu_per_query = cpu as f64 / 1e3 / completed.max(1) as f64;

    let verbose = base(&["-l".into(), "5".into(), "-Q".into(), args.latency_qps.to_string(), "-v".into()])?;
    let mut latencies: Vec<f64> = verbose
        .lines()
        .filter(|l| l.starts_with("> "))
        .filter_map(|l| l.split_whitespace().last()?.parse().ok())
        .collect();
    if latencies.is_empty() {
        bail!("dnsperf -v printed no latencies");
    }
    latencies.sort_by(f64::total_cmp);
    let at = |q: f64| latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)];
    Ok(Run { qps, avg_latency, lost, cpu_per_query, p50: at(0.5), p99: at(0.99) })
}

/// unbound with the same names, run by this process and killed by PID when dropped.
struct Unbound {
    child: Child,
    addr: SocketAddr,
}

impl Unbound {
    fn start(dir: &Path, names: &[(String, String, String)], pinned: bool) -> anyhow::Result<Unbound> {
        let port = UdpSocket::bind("127.0.0.1:0")?.local_addr()?.port();
        let mut conf = format!(
            "server:\n  interface: 127.0.0.1\n  port: {port}\n  do-daemonize: no\n  chroot: \"\"\n  username: \"\"\n  directory: \"{}\"\n  pidfile: \"\"\n  use-syslog: no\n  logfile: \"\"\n  verbosity: 0\n  num-threads: 1\n  access-control: 127.0.0.0/8 allow\n  # nothing is ever resolved outside: every other name is refused\n  local-zone: \".\" refuse\n  local-zone: \"cluster.local.\" static\n",
            dir.display()
        );
        for (ns, svc, ip) in names {
            conf.push_str(&format!("  local-data: \"{svc}.{ns}.svc.cluster.local. 5 IN A {ip}\"\n"));
        }
        let path = dir.join("unbound.conf");
        std::fs::write(&path, conf)?;
        let mut cmd = if pinned {
            let mut c = Command::new("taskset");
            c.args(["-c", &SERVER_CPU.to_string(), "unbound"]);
            c
        } else {
            Command::new("unbound")
        };
        cmd.args(["-d", "-c"]).arg(&path).stdin(Stdio::null()).stdout(Stdio::null());
        // SAFETY: prctl is async-signal-safe; it only makes the child die with this process.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd.spawn().context("starting unbound (Debian package unbound)")?;
        Ok(Unbound { child, addr: SocketAddr::from(([127, 0, 0, 1], port)) })
    }
}

impl Drop for Unbound {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct TempDir(PathBuf);

impl TempDir {
    fn new() -> anyhow::Result<TempDir> {
        let path = std::env::temp_dir().join(format!("gitplane-dns-bench-{}", std::process::id()));
        std::fs::create_dir_all(&path)?;
        Ok(TempDir(path))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn pin_current_thread(cpu: usize) -> anyhow::Result<()> {
    // SAFETY: a zeroed cpu_set_t is valid, CPU_SET writes inside it, and the call reads it.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc != 0 {
        bail!("sched_setaffinity: {}", std::io::Error::last_os_error());
    }
    Ok(())
}
