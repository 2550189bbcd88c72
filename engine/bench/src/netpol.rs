//! NetworkPolicy from a Pod's start to its elements on every node, on the real
//! `gitplane up --nodes N`.
//!
//! A `git push` gives the demo's `web` Deployment one Pod per node and a NetworkPolicy that
//! isolates those Pods, allowing TCP 80 from Pods labelled `role: bench-peer`. Each timed change
//! then writes one such peer Pod straight to the store (`RemoteStore::txn`, peer token) as the
//! kubelet of its node reports it: Running, with its Pod IP (10.244.200.x, never sent to) and
//! bound to a node that does not exist, so that no kubelet runs it. Every node holding a `web`
//! Pod must add `web Pod . peer` to its `ingress-peers` map; an `nft monitor elements` in each
//! node's namespace stamps the commit. 100 ms later the peer Pod is deleted and the element's
//! removal is timed the same way. Around them, `--policies` more policies isolate the `web` Pods
//! and `--pods` background Pods are their peers, so each node's maps hold what a busy node holds. Latencies run from just before the txn call (so the store's
//! commit is included) to the last node's commit: the issue's "Pod start to enforced on every
//! node", minus the kubelet's own status write.

use crate::{
    load::Latencies,
    monitor::{self, Monitors},
    procs,
    services::ms,
    up::{self, Up, git, git_in, load_average},
};
use anyhow::{Context as _, Result, ensure};
use gitplane_storage::remote::{PeerToken, RemoteStore};
use gitplane_store::{ObjectKey, Op, Store as _};
use serde_json::{Value, json};
use std::{
    collections::BTreeSet,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

#[derive(clap::Args, Clone)]
pub struct NetpolArgs {
    /// Peer Pods started (and removed) one at a time.
    #[arg(long, default_value_t = 100)]
    changes: usize,
    /// Nodes of `gitplane up --nodes`.
    #[arg(long, default_value_t = 3)]
    nodes: u16,
    /// More policies isolating the `web` Pods, each allowing one of 50 `tier`s on a port of
    /// its own, pushed with the first.
    #[arg(long, default_value_t = 1000)]
    policies: usize,
    /// Background Pods (on a node that does not exist, each of one `tier`) written to the store
    /// before the timed changes: peers of the `web` Pods through the policies above.
    #[arg(long, default_value_t = 1000)]
    pods: usize,
    /// The `gitplane` binary (default: next to this one).
    #[arg(long)]
    gitplane: Option<PathBuf>,
}

const PEER_NODE: &str = "bench-elsewhere";
const CHANGE_INTERVAL: Duration = Duration::from_millis(100);
/// A change not enforced on every node by then counts as missing.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(10);
const DEADLINE: Duration = Duration::from_secs(240);

const POLICY: &str = "apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: web-from-bench-peers
spec:
  podSelector:
    matchLabels:
      app: web
  policyTypes: [Ingress]
  ingress:
    - from:
        - podSelector:
            matchLabels:
              role: bench-peer
      ports:
        - protocol: TCP
          port: 80
";

pub fn main(args: NetpolArgs) -> Result<()> {
    ensure!(Path::new("/usr/sbin/nft").exists(), "no /usr/sbin/nft: apt-get install -y nftables");
    let args = &args;
    up::main(args.gitplane.as_deref(), |gitplane| async move { run(args, &gitplane).await })
}

async fn run(args: &NetpolArgs, gitplane: &Path) -> Result<()> {
    let load_before = load_average();
    eprintln!("starting gitplane up --nodes {}", args.nodes);
    let up = Up::start(gitplane, args.nodes).await?;
    eprintln!("pushing web with {} replicas and a NetworkPolicy isolating them", args.nodes);
    push_policy(&up, args.nodes, args.policies).await?;
    let web = up.wait_for_web_pods(usize::from(args.nodes)).await.with_context(|| up.log_tail())?;
    let nodes: BTreeSet<&str> = web.iter().map(|(_, node)| node.as_str()).collect();
    eprintln!("web Pods: {web:?}");
    let measured = measure(&up, &web, args).await.with_context(|| up.log_tail())?;
    let status = up.stop().await?;
    ensure!(status.success(), "gitplane up --nodes exited with {status}");
    let load_after = load_average();
    println!(
        "`gitplane up --nodes {}`, {} `web` Pods isolated on {} nodes by {} policies, {} background peer Pods, \
         {} peer Pods started and removed one at a time; 2 CPUs shared by everything; load average {load_before} \
         before, {load_after} after.\n",
        args.nodes,
        web.len(),
        nodes.len(),
        args.policies + 1,
        args.pods,
        args.changes
    );
    println!(
        "| From the store write of a peer Pod to its element on every node | Samples | p50 ms | p99 ms | max ms | Missing |"
    );
    println!("|---|--:|--:|--:|--:|--:|");
    for (what, latencies, missing) in [
        (
            "a peer Pod starts (Running, with its IP): `ingress-peers` element added",
            &measured.start,
            measured.missing.0,
        ),
        ("the peer Pod is deleted: element removed", &measured.stop, measured.missing.1),
        ("the store's txn alone (commit round trip)", &measured.commit, 0),
    ] {
        println!(
            "| {what} | {} | {} | {} | {} | {missing} |",
            latencies.len(),
            ms(latencies.quantile(0.5)),
            ms(latencies.quantile(0.99)),
            ms(latencies.max())
        );
    }
    let held: Vec<String> = measured.held.iter().map(|(node, n)| format!("{node} {n}")).collect();
    println!("\n`ingress-peers` elements held at the end: {}.", held.join(", "));
    let p99 = measured.start.quantile(0.99).unwrap_or(Duration::MAX);
    println!(
        "\n- Pod start to enforced on every node: p99 {} ms (goal p99 < 100 ms: {})",
        ms(Some(p99)),
        if p99 < Duration::from_millis(100) && measured.missing.0 == 0 { "met" } else { "NOT met" }
    );
    Ok(())
}

/// Pushes `web` with one replica per node and the policy, as a user would.
async fn push_policy(up: &Up, replicas: u16, policies: usize) -> Result<()> {
    let work = up.dir().join("demo-work");
    git(tokio::process::Command::new("git").arg("clone").arg("--quiet").arg(up.repos_dir.join("demo.git")).arg(&work))
        .await?;
    let file = work.join("web.yaml");
    let yaml = std::fs::read_to_string(&file)?;
    ensure!(yaml.contains("replicas: 2"), "the demo's web.yaml has no `replicas: 2`");
    std::fs::write(&file, yaml.replace("replicas: 2", &format!("replicas: {replicas}")))?;
    std::fs::write(work.join("bench-policy.yaml"), POLICY)?;
    let more: Vec<String> = (0..policies).map(background_policy).collect();
    std::fs::write(work.join("bench-policies.yaml"), more.join("---\n"))?;
    git(git_in(&work).args(["add", "--all"])).await?;
    git(git_in(&work).args(["commit", "--quiet", "-m", "web on every node, isolated"])).await?;
    git(git_in(&work).args(["push", "--quiet", "origin", "HEAD:main"])).await
}

fn background_policy(k: usize) -> String {
    format!(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata:\n  name: bench-{k}\nspec:\n  \
         podSelector:\n    matchLabels:\n      app: web\n  policyTypes: [Ingress]\n  ingress:\n    - from:\n        \
         - podSelector:\n            matchLabels:\n              tier: t{}\n      ports:\n        - protocol: TCP\n          \
         port: {}\n",
        k % TIERS,
        8000 + k % 100
    )
}

const TIERS: usize = 50;

/// Background Pod `j`: a peer of the `web` Pods through the policies of its tier.
fn background_pod(j: usize) -> Value {
    let ip = Ipv4Addr::new(10, 244, 100 + (j / 250) as u8, (j % 250) as u8 + 1).to_string();
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": format!("bench-background-{j}"), "namespace": "default", "labels": {"tier": format!("t{}", j % TIERS)}},
        "spec": {"nodeName": PEER_NODE, "containers": [{"name": "peer", "image": "gitplane.local/httpd:1"}]},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]},
    })
}

/// Peer Pod `i`'s address: outside every node's range (they start at 10.244.0.0), never sent to.
fn peer_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 244, 200 + (i / 250) as u8, (i % 250) as u8 + 1)
}

fn peer_name(i: usize) -> String {
    format!("bench-peer-{i}")
}

/// Peer Pod `i` as its kubelet reports it once it has an address.
fn peer_pod(i: usize) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": peer_name(i), "namespace": "default", "labels": {"role": "bench-peer"}},
        "spec": {
            "nodeName": PEER_NODE,
            "containers": [{"name": "peer", "image": "gitplane.local/httpd:1"}],
        },
        "status": {"phase": "Running", "podIP": peer_ip(i).to_string(), "podIPs": [{"ip": peer_ip(i).to_string()}]},
    })
}

/// Whether an `nft monitor elements` line adds (`add`) or deletes (`delete`) an `ingress-peers`
/// element with peer `peer`.
fn is_peer_change(line: &str, verb: &str, peer: Ipv4Addr) -> bool {
    line.starts_with(&format!("{verb} element ip gitplane-policy ingress-peers "))
        && line.contains(&format!(". {peer} "))
}

struct Measured {
    start: Latencies,
    stop: Latencies,
    commit: Latencies,
    /// Starts and removals not enforced everywhere within [`CHANGE_TIMEOUT`].
    missing: (usize, usize),
    /// Each node's `ingress-peers` elements at the end: what the policies made of the
    /// background Pods.
    held: Vec<(String, usize)>,
}

/// The elements of `node`'s `ingress-peers` map.
async fn peer_elements(node: &str) -> Result<usize> {
    let output = tokio::process::Command::new("ip")
        .args(["netns", "exec", node, "nft", "list", "map", "ip", "gitplane-policy", "ingress-peers"])
        .output()
        .await?;
    ensure!(output.status.success(), "nft list map on {node}: {}", String::from_utf8_lossy(&output.stderr));
    Ok(String::from_utf8_lossy(&output.stdout).matches(" : jump ").count())
}

async fn measure(up: &Up, web: &[(Ipv4Addr, String)], args: &NetpolArgs) -> Result<Measured> {
    let token = std::fs::read_to_string(up.data_dir.join("peer-token")).context("the cluster's peer token")?;
    let store = RemoteStore::with_token(&[format!("http://{}", up.listen)], PeerToken::new(token.trim())?)?;
    eprintln!("writing {} background Pods", args.pods);
    let background: Vec<usize> = (0..args.pods).collect();
    for chunk in background.chunks(100) {
        store.txn(chunk.iter().map(|j| Op::Create(background_pod(*j))).collect()).await?;
    }
    // The nodes to wait for: those holding a web Pod.
    let nodes: Vec<String> = web.iter().map(|(_, n)| n.clone()).collect::<BTreeSet<_>>().into_iter().collect();
    let (mut monitors, mut lines) = Monitors::start(&nodes, "elements")?;
    // nft monitor subscribes right after it starts; warm-up peers until every node showed one
    // (also proves that the policy is programmed).
    tokio::time::sleep(Duration::from_secs(1)).await;
    ensure!(monitors.all_running(), "an nft monitor exited at once");
    let deadline = Instant::now() + DEADLINE;
    for attempt in 0.. {
        let i = 1000 + attempt;
        store.txn(vec![Op::Create(peer_pod(i))]).await?;
        let seen = monitor::wait(&mut lines, nodes.len(), Instant::now(), Duration::from_secs(3), |l| {
            is_peer_change(l, "add", peer_ip(i))
        })
        .await;
        store.txn(vec![Op::Delete { key: pod_key(i), revision: None }]).await?;
        if seen.iter().all(Option::is_some) {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "the policy's element for {} never appeared on every node: {seen:?}",
            peer_ip(i)
        );
    }
    let (mut start, mut stop, mut commit, mut missing) = (Vec::new(), Vec::new(), Vec::new(), (0, 0));
    let changes = args.changes;
    for i in 1..=changes {
        for (verb, op) in [("add", Op::Create(peer_pod(i))), ("delete", Op::Delete { key: pod_key(i), revision: None })]
        {
            tokio::time::sleep(CHANGE_INTERVAL).await;
            while lines.try_recv().is_ok() {}
            let sent = Instant::now();
            store.txn(vec![op]).await?;
            commit.push(sent.elapsed());
            let seen =
                monitor::wait(&mut lines, nodes.len(), sent, CHANGE_TIMEOUT, |l| is_peer_change(l, verb, peer_ip(i)))
                    .await;
            let (samples, missed) =
                if verb == "add" { (&mut start, &mut missing.0) } else { (&mut stop, &mut missing.1) };
            match seen.into_iter().collect::<Option<Vec<Duration>>>() {
                Some(each) => samples.push(each.into_iter().max().unwrap_or_default()),
                None => *missed += 1,
            }
        }
        if i % 20 == 0 {
            eprintln!("  {i}/{changes}");
        }
    }
    drop(monitors);
    let mut held = Vec::new();
    for node in &nodes {
        held.push((node.clone(), peer_elements(node).await?));
    }
    Ok(Measured {
        held,
        start: Latencies::new(start),
        stop: Latencies::new(stop),
        commit: Latencies::new(commit),
        missing,
    })
}

fn pod_key(i: usize) -> ObjectKey {
    ObjectKey { kind: "Pod".into(), namespace: "default".into(), name: peer_name(i) }
}

impl Up {
    /// Waits until `web` has `count` Running Pods with their addresses; (Pod IP, node) each.
    async fn wait_for_web_pods(&self, count: usize) -> Result<Vec<(Ipv4Addr, String)>> {
        procs::wait_for("the web Pods Running", DEADLINE, || async {
            let pods = self.get("/api/v1/namespaces/default/pods?labelSelector=app%3Dweb").await.ok()?;
            let items = pods["items"].as_array()?;
            let running: Vec<(Ipv4Addr, String)> = items
                .iter()
                .filter(|p| p["status"]["phase"] == "Running" && p["metadata"]["deletionTimestamp"].is_null())
                .filter_map(|p| {
                    Some((p["status"]["podIP"].as_str()?.parse().ok()?, p["spec"]["nodeName"].as_str()?.to_owned()))
                })
                .collect();
            (running.len() == count && items.len() == count).then_some(running)
        })
        .await
    }
}
