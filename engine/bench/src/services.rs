//! Services across nodes on the real `gitplane up --nodes N`:
//!
//! - **programming latency**: a selector-less Service (which no controller manages) and its one
//!   EndpointSlice are written straight to the store; each change moves the endpoint to a new
//!   address, and an `nft monitor` in every node's network namespace timestamps the moment the
//!   new `endpoints` map element is committed there;
//! - **traffic**: `hey` against the demo's busybox httpd Pod, straight to its Pod IP and through
//!   its ClusterIP (scaled to one replica, so both reach the same Pod), alternating, from a
//!   client Pod's network namespace and from node 1's.
//!
//! Every process is owned by a guard that stops it by its PID; `gitplane up` removes its
//! namespaces when it stops, and the guard removes what a killed one left. No packet leaves the
//! namespaces `gitplane up` makes (the endpoints of the latency Service are never sent to).

use crate::{
    load::Latencies,
    monitor::{self, Monitors},
    procs,
    up::{self, Up, git, git_in, load_average},
};
use anyhow::{Context as _, Result, ensure};
use gitplane_storage::remote::{PeerToken, RemoteStore};
use gitplane_store::{Op, Store as _};
use serde_json::{Value, json};
use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::Stdio,
    time::{Duration, Instant},
};

#[derive(clap::Args, Clone)]
pub struct ServicesArgs {
    /// EndpointSlice changes timed for the programming latency.
    #[arg(long, default_value_t = 100)]
    changes: usize,
    /// Nodes of `gitplane up --nodes`.
    #[arg(long, default_value_t = 3)]
    nodes: u16,
    /// hey runs against each of the Pod IP and the ClusterIP, alternating.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Seconds of each hey run.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// hey's concurrent clients.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// The `gitplane` binary (default: next to this one).
    #[arg(long)]
    gitplane: Option<PathBuf>,
}

/// The latency Service's address: in the Service range, far from what the allocator hands out
/// first, set by hand because only Services from Git are allocated.
const LATENCY_CLUSTER_IP: &str = "10.100.0.1";
const LATENCY_SERVICE: &str = "bench-latency";
/// The pause between two timed changes, so that each is a sync of its own.
const CHANGE_INTERVAL: Duration = Duration::from_millis(100);
/// A change not live on every node by then counts as missing.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(10);
const DEADLINE: Duration = Duration::from_secs(180);

pub fn main(args: ServicesArgs) -> Result<()> {
    for (tool, package) in [("/usr/bin/hey", "hey"), ("/usr/sbin/nft", "nftables")] {
        ensure!(Path::new(tool).exists(), "no {tool}: apt-get install -y {package}");
    }
    let args = &args;
    up::main(args.gitplane.as_deref(), |gitplane| async move { run(args, &gitplane).await })
}

async fn run(args: &ServicesArgs, gitplane: &Path) -> Result<()> {
    let load_before = load_average();
    eprintln!("starting gitplane up --nodes {}", args.nodes);
    let up = Up::start(gitplane, args.nodes).await?;
    // One replica behind the demo's Service first, so that the latency runs on a settled cluster
    // and the traffic compares like with like.
    eprintln!("scaling the demo's web Deployment to 1 replica (git push)");
    scale_demo_to_one(&up).await?;
    let (pod_ip, pod_node, cluster_ip) = up.wait_for_one_web_endpoint().await.with_context(|| up.log_tail())?;
    eprintln!("web: Pod {pod_ip} on {pod_node}, ClusterIP {cluster_ip}");

    eprintln!("programming latency: {} EndpointSlice changes", args.changes);
    let latency = programming_latency(&up, args.changes).await.with_context(|| up.log_tail())?;

    let (client_node, client_pid) = up.wait_for_client_pod().await.with_context(|| up.log_tail())?;
    // From a Pod first: its source is in the Pod range, so the ClusterIP rule only DNATs. From
    // the node's namespace the rule also masquerades (the node's address is outside that range).
    let clients = [
        Client {
            name: format!("a Pod on {client_node}"),
            enter: vec!["nsenter".into(), format!("--net=/proc/{client_pid}/ns/net")],
        },
        Client {
            name: format!("node {}'s namespace", up.nodes[0]),
            enter: vec!["ip".into(), "netns".into(), "exec".into(), up.nodes[0].clone()],
        },
    ];
    let mut traffic_results = Vec::new();
    for client in &clients {
        eprintln!(
            "traffic: {} rounds of {} s, {} clients, from {}",
            args.rounds, args.seconds, args.concurrency, client.name
        );
        traffic_results.push(traffic(client, args, pod_ip, cluster_ip).await.with_context(|| up.log_tail())?);
    }

    let status = up.stop().await?;
    ensure!(status.success(), "gitplane up --nodes exited with {status}");
    let load_after = load_average();
    print_table(args, &latency, &traffic_results, &pod_node, (&load_before, &load_after));
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Programming latency

struct LatencyResult {
    nodes: Vec<String>,
    /// From the txn call to the element's commit on each node.
    per_node: Vec<Latencies>,
    /// The same to the last of the nodes.
    all: Latencies,
    /// The txn's own round trip (the commit).
    commit: Latencies,
    missing: usize,
}

fn latency_service() -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": LATENCY_SERVICE, "namespace": "default"},
        "spec": {
            "type": "ClusterIP",
            "clusterIP": LATENCY_CLUSTER_IP,
            "clusterIPs": [LATENCY_CLUSTER_IP],
            "ports": [{"port": 80, "targetPort": 8080, "protocol": "TCP"}],
        },
    })
}

/// The Service's one EndpointSlice with its one endpoint at `ip`. Without the managed-by label
/// of the endpoints controller, which leaves selector-less Services' slices alone.
fn latency_slice(ip: Ipv4Addr) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": format!("{LATENCY_SERVICE}-1"),
            "namespace": "default",
            "labels": {"kubernetes.io/service-name": LATENCY_SERVICE},
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [ip.to_string()], "conditions": {"ready": true}}],
        "ports": [{"port": 8080, "protocol": "TCP"}],
    })
}

/// The endpoint address of timed change `i`: never a Pod's (the nodes' ranges start at 10.244.0.0)
/// and never sent to.
fn endpoint_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 244, 200 + (i / 250) as u8, (i % 250) as u8 + 1)
}

/// Whether an `nft monitor` line is the add of an `endpoints` element pointing at `ip`.
fn is_endpoint_add(line: &str, ip: Ipv4Addr) -> bool {
    line.starts_with("add element ip gitplane-proxy endpoints ") && line.contains(&format!(": {ip} . 8080"))
}

async fn programming_latency(up: &Up, changes: usize) -> Result<LatencyResult> {
    let token = std::fs::read_to_string(up.data_dir.join("peer-token")).context("the cluster's peer token")?;
    let store = RemoteStore::with_token(&[format!("http://{}", up.listen)], PeerToken::new(token.trim())?)?;
    let (mut monitors, mut lines) = Monitors::start(&up.nodes, "new elements")?;
    // nft monitor subscribes right after it starts; the first element below would show a
    // monitor that missed it.
    tokio::time::sleep(Duration::from_secs(1)).await;
    ensure!(monitors.all_running(), "an nft monitor exited at once");

    // Warm-up changes (10.244.199.x) until every monitor has shown one: on a loaded machine a
    // monitor can subscribe only after the first change was committed.
    store.txn(vec![Op::Create(latency_service()), Op::Create(latency_slice(Ipv4Addr::new(10, 244, 199, 1)))]).await?;
    for attempt in 1u8.. {
        let ip = Ipv4Addr::new(10, 244, 199, attempt);
        if attempt > 1 {
            store.txn(vec![Op::Update(latency_slice(ip))]).await?;
        }
        let seen = monitor::wait(&mut lines, up.nodes.len(), Instant::now(), Duration::from_secs(3), |l| {
            is_endpoint_add(l, ip)
        })
        .await;
        if seen.iter().all(Option::is_some) {
            break;
        }
        ensure!(attempt < 20, "the latency Service's endpoint {ip} was not programmed on every node: {seen:?}");
    }

    let (mut per_node, mut all, mut commit, mut missing) =
        (vec![Vec::new(); up.nodes.len()], Vec::new(), Vec::new(), 0);
    for i in 1..=changes {
        tokio::time::sleep(CHANGE_INTERVAL).await;
        while lines.try_recv().is_ok() {}
        let ip = endpoint_ip(i);
        let sent = Instant::now();
        store.txn(vec![Op::Update(latency_slice(ip))]).await?;
        commit.push(sent.elapsed());
        let seen = monitor::wait(&mut lines, up.nodes.len(), sent, CHANGE_TIMEOUT, |l| is_endpoint_add(l, ip)).await;
        for (node, latency) in seen.iter().enumerate() {
            if let Some(latency) = latency {
                per_node[node].push(*latency);
            }
        }
        match seen.iter().copied().collect::<Option<Vec<Duration>>>() {
            Some(each) => all.push(each.into_iter().max().unwrap_or_default()),
            None => missing += 1,
        }
        if i % 20 == 0 {
            eprintln!("  {i}/{changes}");
        }
    }
    drop(monitors);
    Ok(LatencyResult {
        nodes: up.nodes.clone(),
        per_node: per_node.into_iter().map(Latencies::new).collect(),
        all: Latencies::new(all),
        commit: Latencies::new(commit),
        missing,
    })
}

// ---------------------------------------------------------------------------------------------
// Traffic

struct TrafficRun {
    requests_per_second: f64,
    /// Answers other than 200 plus connection errors.
    failed: u64,
    ok: u64,
}

/// Where hey runs, and the command that puts it in that network namespace.
struct Client {
    name: String,
    enter: Vec<String>,
}

struct TrafficResult {
    client: String,
    pod: Vec<TrafficRun>,
    cluster: Vec<TrafficRun>,
}

async fn traffic(
    client: &Client,
    args: &ServicesArgs,
    pod_ip: Ipv4Addr,
    cluster_ip: Ipv4Addr,
) -> Result<TrafficResult> {
    // The ClusterIP rule reaches the client's node a little after the slice: wait for a clean
    // short run.
    procs::wait_for("the ClusterIP answering", Duration::from_secs(60), || async {
        let run = hey(client, cluster_ip, 1, 4).await.ok()?;
        (run.failed == 0 && run.ok > 0).then_some(())
    })
    .await?;
    let mut result = TrafficResult { client: client.name.clone(), pod: Vec::new(), cluster: Vec::new() };
    for round in 1..=args.rounds {
        for (name, ip) in [("Pod IP", pod_ip), ("ClusterIP", cluster_ip)] {
            let run = hey(client, ip, args.seconds, args.concurrency).await?;
            eprintln!("  round {round}, {name} {ip}: {:.0} requests/s, {} failed", run.requests_per_second, run.failed);
            if ip == pod_ip { &mut result.pod } else { &mut result.cluster }.push(run);
        }
    }
    Ok(result)
}

/// `hey` in `client`'s network namespace for `seconds` against `http://ip/`, without
/// keep-alive (busybox httpd closes every connection anyway).
async fn hey(client: &Client, ip: Ipv4Addr, seconds: u64, concurrency: usize) -> Result<TrafficRun> {
    let output = tokio::process::Command::new(&client.enter[0])
        .args(&client.enter[1..])
        .args(["hey", "-z", &format!("{seconds}s"), "-c", &concurrency.to_string()])
        .args(["-t", "5", "-disable-keepalive", &format!("http://{ip}/")])
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .context("running hey")?;
    let text = String::from_utf8_lossy(&output.stdout);
    ensure!(output.status.success(), "hey against {ip} failed: {}{}", text, String::from_utf8_lossy(&output.stderr));
    parse_hey(&text).with_context(|| format!("hey's output: {text}"))
}

/// Requests/s, the 200s and everything else from hey's summary.
fn parse_hey(text: &str) -> Result<TrafficRun> {
    let requests_per_second =
        text.lines().find_map(|l| l.trim().strip_prefix("Requests/sec:")).context("no Requests/sec")?.trim().parse()?;
    // `  [200]\t1234 responses` under the status codes; `  [12]\tGet ...` under the errors.
    let (mut ok, mut failed) = (0, 0);
    let mut section = "";
    for line in text.lines() {
        if !line.starts_with(' ') {
            section = line.trim();
            continue;
        }
        let Some((code, rest)) = line.trim().strip_prefix('[').and_then(|l| l.split_once(']')) else { continue };
        let count: u64 = match section {
            "Status code distribution:" => rest.split_whitespace().next().unwrap_or("0").parse()?,
            "Error distribution:" => code.parse()?,
            _ => continue,
        };
        if section.starts_with("Status") && code == "200" { ok += count } else { failed += count }
    }
    Ok(TrafficRun { requests_per_second, failed, ok })
}

/// A client Pod that only sleeps: hey runs in its network namespace (from the machine's
/// filesystem), so its traffic has a Pod's source address, as Pod-to-Service traffic has.
const CLIENT_POD: &str = "apiVersion: apps/v1
kind: Deployment
metadata:
  name: bench-client
spec:
  replicas: 1
  selector:
    matchLabels:
      app: bench-client
  template:
    metadata:
      labels:
        app: bench-client
    spec:
      terminationGracePeriodSeconds: 1
      containers:
        - name: sleep
          image: gitplane.local/httpd:1
          command: [/bin/busybox, sleep, \"86400\"]
          resources:
            requests:
              cpu: 10m
              memory: 8Mi
";

/// Pushes the demo repository with `replicas: 1` and the client Pod, as a user would.
async fn scale_demo_to_one(up: &Up) -> Result<()> {
    let work = up.dir().join("demo-work");
    git(tokio::process::Command::new("git").arg("clone").arg("--quiet").arg(up.repos_dir.join("demo.git")).arg(&work))
        .await?;
    let file = work.join("web.yaml");
    let yaml = std::fs::read_to_string(&file)?;
    ensure!(yaml.contains("replicas: 2"), "the demo's web.yaml has no `replicas: 2`");
    std::fs::write(&file, yaml.replace("replicas: 2", "replicas: 1"))?;
    std::fs::write(work.join("bench-client.yaml"), CLIENT_POD)?;
    git(git_in(&work).args(["add", "--all"])).await?;
    git(git_in(&work).args(["commit", "--quiet", "-m", "web: 1 replica; a client Pod"])).await?;
    git(git_in(&work).args(["push", "--quiet", "origin", "HEAD:main"])).await
}

// ---------------------------------------------------------------------------------------------
// What this benchmark waits for in the cluster

impl Up {
    /// Waits until `web` has exactly one Pod, Running, and its EndpointSlice that one endpoint;
    /// (Pod IP, its node, the Service's ClusterIP).
    async fn wait_for_one_web_endpoint(&self) -> Result<(Ipv4Addr, String, Ipv4Addr)> {
        let (pod_ip, node) = procs::wait_for("one Running web Pod and its endpoint", DEADLINE, || async {
            let pods = self.get("/api/v1/namespaces/default/pods?labelSelector=app%3Dweb").await.ok()?;
            let [pod] = pods["items"].as_array()?.as_slice() else { return None };
            if pod["status"]["phase"] != "Running" || !pod["metadata"]["deletionTimestamp"].is_null() {
                return None;
            }
            let ip: Ipv4Addr = pod["status"]["podIP"].as_str()?.parse().ok()?;
            let slices = self
                .get("/apis/discovery.k8s.io/v1/namespaces/default/endpointslices?labelSelector=kubernetes.io%2Fservice-name%3Dweb")
                .await
                .ok()?;
            let ready: Vec<&str> = slices["items"]
                .as_array()?
                .iter()
                .flat_map(|s| s["endpoints"].as_array().into_iter().flatten())
                .filter(|e| e["conditions"]["ready"] != false)
                .filter_map(|e| e["addresses"][0].as_str())
                .collect();
            (ready == [ip.to_string().as_str()]).then(|| (ip, pod["spec"]["nodeName"].as_str().unwrap_or_default().to_owned()))
        })
        .await?;
        let service = self.get("/api/v1/namespaces/default/services/web").await?;
        let cluster_ip = service["spec"]["clusterIP"].as_str().context("web has a clusterIP")?.parse()?;
        Ok((pod_ip, node, cluster_ip))
    }

    /// The node and the PID of the client Pod's `sleep`, once it runs.
    async fn wait_for_client_pod(&self) -> Result<(String, u32)> {
        procs::wait_for("the Running client Pod", DEADLINE, || async {
            let pods = self.get("/api/v1/namespaces/default/pods?labelSelector=app%3Dbench-client").await.ok()?;
            let [pod] = pods["items"].as_array()?.as_slice() else { return None };
            if pod["status"]["phase"] != "Running" {
                return None;
            }
            let node = pod["spec"]["nodeName"].as_str()?.to_owned();
            // Its only process, found by its exact command line; read, never signalled.
            let pid = std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
                let pid: u32 = e.file_name().to_str()?.parse().ok()?;
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
                (cmdline == b"/bin/busybox\0sleep\086400\0").then_some(pid)
            })?;
            Some((node, pid))
        })
        .await
    }
}

// ---------------------------------------------------------------------------------------------
// The table

/// Milliseconds with one decimal, "–" for none.
pub(crate) fn ms(d: Option<Duration>) -> String {
    d.map_or("–".into(), |d| format!("{:.1}", d.as_secs_f64() * 1e3))
}

fn median(runs: &[TrafficRun]) -> f64 {
    let mut rates: Vec<f64> = runs.iter().map(|r| r.requests_per_second).collect();
    rates.sort_by(f64::total_cmp);
    rates.get(rates.len() / 2).copied().unwrap_or(0.0)
}

fn rates(runs: &[TrafficRun]) -> String {
    runs.iter().map(|r| format!("{:.0}", r.requests_per_second)).collect::<Vec<_>>().join(", ")
}

fn print_table(
    args: &ServicesArgs,
    latency: &LatencyResult,
    traffic: &[TrafficResult],
    pod_node: &str,
    (load_before, load_after): (&str, &str),
) {
    println!(
        "`gitplane up --nodes {}` (nftables), 2 CPUs shared by everything; load average {load_before} before, \
         {load_after} after.\n",
        args.nodes
    );
    println!("| Measurement | What | Samples | p50 ms | p99 ms | max ms | Requests/s | Notes |");
    println!("|---|---|--:|--:|--:|--:|--:|---|");
    let commit = format!(
        "from the txn call; the txn itself (commit) p50 {} / p99 {} ms",
        ms(latency.commit.quantile(0.5)),
        ms(latency.commit.quantile(0.99))
    );
    for (node, samples) in latency.nodes.iter().zip(&latency.per_node) {
        println!(
            "| programming latency | node {node} | {} | {} | {} | {} | | {commit} |",
            samples.len(),
            ms(samples.quantile(0.5)),
            ms(samples.quantile(0.99)),
            ms(samples.max()),
        );
    }
    println!(
        "| programming latency | all {} nodes (the last one to have it) | {} | {} | {} | {} | | {}{} |",
        latency.nodes.len(),
        latency.all.len(),
        ms(latency.all.quantile(0.5)),
        ms(latency.all.quantile(0.99)),
        ms(latency.all.max()),
        commit,
        if latency.missing > 0 {
            format!("; {} changes not live everywhere within 10 s", latency.missing)
        } else {
            String::new()
        },
    );
    println!(
        "| programming latency, reference | kube-proxy partial sync at 5,000 nodes (published, not measured) | | about 5000 | | | | |"
    );
    let failed = |runs: &[TrafficRun]| runs.iter().map(|r| r.failed).sum::<u64>();
    for result in traffic {
        for (what, runs) in [("straight to the Pod IP", &result.pod), ("through the ClusterIP", &result.cluster)] {
            println!(
                "| traffic | hey from {} {what}, server Pod on {pod_node} | {} runs of {} s | | | | {:.0} | median; runs {}; {} failed requests; {} clients, no keep-alive |",
                result.client,
                runs.len(),
                args.seconds,
                median(runs),
                rates(runs),
                failed(runs),
                args.concurrency,
            );
        }
    }
    println!();
    let p99 = latency.all.quantile(0.99).unwrap_or(Duration::MAX);
    println!(
        "- Programming latency, all {} nodes: p99 {} ms (goal p99 < 100 ms: {})",
        latency.nodes.len(),
        ms(Some(p99)),
        if p99 < Duration::from_millis(100) && latency.missing == 0 { "met" } else { "NOT met" }
    );
    for result in traffic {
        let ratio = median(&result.cluster) / median(&result.pod);
        println!(
            "- From {}: ClusterIP / Pod IP requests/s {ratio:.3}× (the rules cost {:.1}%; goal < 5%: {})",
            result.client,
            (1.0 - ratio) * 100.0,
            if ratio > 0.95 { "met" } else { "NOT met" }
        );
    }
}
