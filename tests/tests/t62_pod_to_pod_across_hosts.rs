//! Pod to Pod across hosts, on `gitplane up --nodes 3` (three network-namespace hosts on a
//! bridge, each with its own containerd and agent) with a cluster Pod range other than the
//! default, which the agents learn at registration: a Deployment spread over the three; a Pod on
//! one node reaches the Pods on the other two by pod IP, and they see its own address (no NAT);
//! its traffic to the control plane, outside the cluster's ranges, is masqueraded; every node
//! routes each other node's podCIDR through that node's address, and the machine's own
//! namespace has no such route; a node that leaves has its route removed on the others; stopping
//! removes every namespace. All traffic stays in namespaces `gitplane up` made.

use anyhow::{Context, Result, ensure};
use gitplane_api::ObjectKey;
use gitplane_e2e::{LocalCluster, RunningPod, Worktree, require_root, wait_for};
use gitplane_nodeagent::network::cidr::Ipv4Cidr;
use gitplane_storage::remote::{PeerToken, RemoteStore};
use gitplane_store::{Op, Store};
use std::{
    collections::{BTreeMap, BTreeSet},
    net::Ipv4Addr,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

const DEADLINE: Duration = Duration::from_secs(120);

/// busybox httpd with a CGI that answers the address the connection came from.
const WHOAMI: &str = r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: whoami
spec:
  replicas: 3
  selector:
    matchLabels:
      app: whoami
  template:
    metadata:
      labels:
        app: whoami
    spec:
      terminationGracePeriodSeconds: 5
      containers:
        - name: httpd
          image: gitplane.local/httpd:1
          command:
            - /bin/busybox
            - sh
            - -c
            - |
              /bin/busybox mkdir -p /www/cgi-bin
              /bin/busybox printf '#!/bin/sh\necho Content-Type: text/plain\necho\necho "$REMOTE_ADDR"\n' > /www/cgi-bin/peer
              /bin/busybox chmod 755 /www/cgi-bin/peer
              trap 'kill $pid; exit 0' TERM INT
              /bin/busybox httpd -f -p 80 -h /www & pid=$!
              wait $pid
          ports:
            - containerPort: 80
          resources:
            requests:
              cpu: 500m
              memory: 16Mi
"#;

fn running_pods(cluster: &LocalCluster) -> Result<Vec<RunningPod>> {
    cluster.running_pods("app=whoami")
}

/// Node name -> (podCIDR, InternalIP).
fn nodes(cluster: &LocalCluster) -> Result<BTreeMap<String, (Ipv4Cidr, Ipv4Addr)>> {
    let list = cluster.get("/api/v1/nodes")?;
    let mut out = BTreeMap::new();
    for node in list["items"].as_array().context("NodeList has items")? {
        let name = node["metadata"]["name"].as_str().context("a Node's name")?;
        let cidr = node["spec"]["podCIDR"].as_str().with_context(|| format!("{name}'s podCIDR"))?.parse()?;
        let addresses = node["status"]["addresses"].as_array().with_context(|| format!("{name}'s addresses"))?;
        let ip = addresses
            .iter()
            .find(|a| a["type"] == "InternalIP")
            .and_then(|a| a["address"].as_str()?.parse().ok())
            .with_context(|| format!("{name} has no InternalIP: {addresses:?}"))?;
        out.insert(name.to_owned(), (cidr, ip));
    }
    Ok(out)
}

/// gitplane's routes in a node's namespace, as (destination, gateway), read with iproute2.
fn routes_in(netns: &str) -> Result<BTreeSet<(String, String)>> {
    let out = Command::new("ip").args(["-n", netns, "-4", "route", "show", "proto", "103"]).output()?;
    ensure!(out.status.success(), "ip -n {netns} route: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            let via = words.iter().position(|w| *w == "via")?;
            Some((words.first()?.to_string(), words.get(via + 1)?.to_string()))
        })
        .collect())
}

/// The cluster's Pod range: not the default, which the agents would assume.
const CLUSTER_CIDR: &str = "10.246.0.0/16";

/// The routes node `me` should have: every other node's podCIDR through its address.
fn expected_routes(me: &str, nodes: &BTreeMap<String, (Ipv4Cidr, Ipv4Addr)>) -> BTreeSet<(String, String)> {
    nodes.iter().filter(|(name, _)| *name != me).map(|(_, (cidr, ip))| (cidr.to_string(), ip.to_string())).collect()
}

/// `wget` from inside `pod`.
fn fetch(cluster: &LocalCluster, pod: &RunningPod, url: &str) -> Result<String> {
    cluster.fetch(&pod.node, &pod.container, url)
}

/// The machine's own routes into the Pod or Service range (the nodes must add none).
fn machine_routes_into_cluster_ranges() -> Result<Vec<String>> {
    let out = Command::new("ip").args(["-4", "route", "show", "table", "all"]).output()?;
    let ranges = [CLUSTER_CIDR.parse::<Ipv4Cidr>()?, Ipv4Cidr::SERVICE_DEFAULT];
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|line| {
            let dst = line.split_whitespace().find(|w| w.chars().next().is_some_and(|c| c.is_ascii_digit()));
            let addr = dst.and_then(|d| d.split('/').next()?.parse::<Ipv4Addr>().ok());
            addr.is_some_and(|a| ranges.iter().any(|r| r.contains(a)))
        })
        .map(str::to_owned)
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t62_pods_reach_pods_on_other_hosts_by_pod_ip_without_nat() -> Result<()> {
    require_root()?;
    let started = Instant::now();
    let before = machine_routes_into_cluster_ranges()?;
    let flags = [format!("--cluster-cidr={CLUSTER_CIDR}"), "--node-cidr-mask-size=25".into()];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let cluster = tokio::task::block_in_place(|| LocalCluster::up_with("gp62", 3, &flags))?;
    println!("3 nodes Ready in {:?}", started.elapsed());
    let after = machine_routes_into_cluster_ranges()?;
    ensure!(
        before == after,
        "the nodes added Pod or Service routes to the machine's own namespace: {before:?} -> {after:?}"
    );

    // A Deployment of 3 spreads over the 3 nodes (the scheduler scores least-allocated).
    let work_dir = tempfile::tempdir()?;
    let work = Worktree::clone(cluster.demo_repo(), work_dir.path().join("demo"))?;
    work.remove("web.yaml")?;
    work.write("whoami.yaml", WHOAMI)?;
    work.commit_and_push("whoami: 3 replicas")?;
    let pods = tokio::task::block_in_place(|| {
        wait_for(DEADLINE, || running_pods(&cluster).ok().filter(|p| p.len() == 3))
            .with_context(|| format!("3 Running whoami Pods: {:?}\n{}", running_pods(&cluster), cluster.log_text()))
    })?;
    let spread: BTreeSet<&str> = pods.iter().map(|p| p.node.as_str()).collect();
    ensure!(spread.len() == 3, "the Pods are not spread over the 3 nodes: {pods:?}");
    let nodes = nodes(&cluster)?;
    ensure!(nodes.len() == 3, "nodes: {nodes:?}");
    let range = CLUSTER_CIDR.parse::<Ipv4Cidr>()?;
    for (name, (cidr, _)) in &nodes {
        ensure!(range.covers(cidr) && cidr.prefix() == 25, "{name}'s podCIDR {cidr} is not a /25 of {range}");
    }
    for pod in &pods {
        ensure!(nodes[&pod.node].0.contains(pod.ip), "{} has {} outside its node's podCIDR", pod.name, pod.ip);
    }

    // Every node routes the others' podCIDRs through their addresses.
    for name in nodes.keys() {
        let want = expected_routes(name, &nodes);
        tokio::task::block_in_place(|| wait_for(DEADLINE, || routes_in(name).ok().filter(|r| *r == want)))
            .with_context(|| format!("{name}'s routes: {:?}, want {want:?}", routes_in(name)))?;
    }

    // A Pod on node 1 reaches the Pods on nodes 2 and 3 by pod IP, and they see its own address.
    let client = pods.iter().find(|p| p.node == cluster.nodes[0]).context("a Pod on node 1")?;
    for server in pods.iter().filter(|p| p.node != client.node) {
        let url = format!("http://{}/cgi-bin/peer", server.ip);
        let mut last = None;
        let seen = tokio::task::block_in_place(|| {
            wait_for(DEADLINE, || fetch(&cluster, client, &url).map_err(|e| last = Some(e)).ok())
        })
        .with_context(|| format!("{} on {} never reached {url}: {last:?}", client.name, client.node))?;
        // busybox httpd listens on IPv6 too and reports an IPv4 peer as `[::ffff:a.b.c.d]`.
        let seen = seen.trim().trim_start_matches('[').trim_end_matches(']').trim_start_matches("::ffff:").to_owned();
        ensure!(
            seen == client.ip.to_string(),
            "{} on {} saw {} connect from {:?}, not its pod IP {}: traffic between Pods is NATed",
            server.name,
            server.node,
            client.name,
            seen,
            client.ip
        );
        println!("{} ({}) -> {} ({}): seen as {seen}", client.name, client.node, server.name, server.node);
    }

    // Traffic that leaves the cluster's ranges is masqueraded: the control plane's address on the
    // bridge has no route to any Pod, so only the node's address can get an answer back. That
    // address serves HTTPS (busybox's wget speaks none): cleartext gets the listener's 400.
    let control_plane = format!("http://172.29.0.1:{}/healthz", cluster.listen.port());
    let answered = || match fetch(&cluster, client, &control_plane) {
        Err(e) if e.to_string().contains("400 Bad Request") => Some(()),
        _ => None,
    };
    tokio::task::block_in_place(|| wait_for(DEADLINE, answered)).with_context(|| {
        format!(
            "{} never had an answer from {control_plane}: {:?}",
            client.name,
            fetch(&cluster, client, &control_plane)
        )
    })?;

    // Node 3 leaves: its agent stops (removing its Pods) and its Node is deleted; the others drop
    // their route to it and keep the one between them.
    let gone = cluster.nodes[2].clone();
    let pid = cluster.agent_pid(&gone).with_context(|| format!("{gone}'s agent process"))?;
    // SAFETY: kill(2) on the agent process found above.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    tokio::task::block_in_place(|| wait_for(DEADLINE, || cluster.agent_pid(&gone).is_none().then_some(())))
        .with_context(|| format!("{gone}'s agent did not stop"))?;
    let token = std::fs::read_to_string(cluster.data_dir.join("peer-token"))?;
    let store = RemoteStore::with_token(&[format!("http://{}", cluster.listen)], PeerToken::new(token.trim())?)?;
    store.txn(vec![Op::Delete { key: ObjectKey::new("Node", "", &gone), revision: None }]).await?;
    let remaining: BTreeMap<_, _> = nodes.iter().filter(|(n, _)| **n != gone).map(|(n, v)| (n.clone(), *v)).collect();
    for name in remaining.keys() {
        let want = expected_routes(name, &remaining);
        tokio::task::block_in_place(|| wait_for(DEADLINE, || routes_in(name).ok().filter(|r| *r == want)))
            .with_context(|| format!("{name} kept a route to {gone}: {:?}, want {want:?}", routes_in(name)))?;
    }
    println!("{gone} left; its route is gone from the others");

    // Ctrl-C (SIGTERM) stops everything and leaves no namespace behind.
    let (base, names) = (cluster.base.clone(), cluster.nodes.clone());
    let status = tokio::task::block_in_place(|| cluster.stop(DEADLINE))?;
    ensure!(status.success(), "gitplane up --nodes exited with {status}");
    for netns in names.iter().cloned().chain([format!("{base}-net")]) {
        ensure!(!Path::new("/run/netns").join(&netns).exists(), "network namespace {netns} left behind");
    }
    Ok(())
}
