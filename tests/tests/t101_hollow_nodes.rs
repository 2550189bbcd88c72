//! 100 hollow nodes (`gitplane agent --hollow`) beside the real `gitplane up --nodes 1`, whose
//! one real node is tainted so that the Deployment's Pods go to the hollow ones. Each holds an
//! agent's three watches (Pods, network, Pod config), so the control plane serves them all.
//! Every hollow node registers through the node service and is Ready in kubectl, each with its own /26 of the
//! cluster's `--cluster-cidr`; a Lease renewal leaves the Node object as it was; a Deployment of
//! 300 replicas pushed to Git runs Running and Ready over the nodes, each Pod with an address of
//! its node's podCIDR. Then the process holding 20 of the nodes stops: they become NotReady once
//! the grace period passes (`--node-monitor-grace-period=12s` here), and their Pods, which
//! tolerate that for 2 s (`--default-unreachable-toleration-seconds=2`), are made anew on the
//! other 80. A deleted Node's podCIDR is released (its record deleted).

use anyhow::{Context, Result, ensure};
use gitplane_api::ObjectKey;
use gitplane_e2e::{LocalCluster, Worktree, manifests, require_root, wait_for};
use gitplane_storage::remote::{PeerToken, RemoteStore};
use gitplane_store::{Op, Store};
use serde_json::Value;
use std::{
    collections::{BTreeMap, BTreeSet},
    net::Ipv4Addr,
    os::unix::process::CommandExt as _,
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

const DEADLINE: Duration = Duration::from_secs(240);
const REPLICAS: usize = 300;

/// A `gitplane agent --hollow` process, stopped with SIGTERM when dropped.
struct Hollow {
    child: Child,
    log: std::path::PathBuf,
}

impl Hollow {
    fn start(cluster: &LocalCluster, base: &str, count: usize) -> Result<Hollow> {
        let dir = cluster.dir().join(base);
        std::fs::create_dir_all(&dir)?;
        let log = dir.join("hollow.log");
        let out = std::fs::File::create(&log)?;
        let child = Command::new(gitplane_testkit::binary("gitplane")?)
            .arg("agent")
            .arg(format!("--hollow={count}"))
            .arg("--hollow-all-watches")
            .arg(format!("--node-name={base}"))
            .arg(format!("--server=http://{}", cluster.listen))
            .arg("--join-token-file")
            .arg(cluster.data_dir.join("join-token"))
            .arg("--credential-file")
            .arg(dir.join("node-credential"))
            .arg("--pod-dir")
            .arg(&dir)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .process_group(0)
            .spawn()
            .context("starting gitplane agent --hollow")?;
        Ok(Hollow { child, log })
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines().rev().take(30).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    /// SIGTERM, then waits for it (a hollow node leaves its Pods, as an agent does).
    fn stop(&mut self) -> Result<()> {
        if self.child.try_wait()?.is_none() {
            // SAFETY: a plain kill(2) of the child this guard started.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        }
        let status = self.child.wait()?;
        ensure!(status.success(), "gitplane agent --hollow exited with {status}:\n{}", self.log_tail());
        Ok(())
    }
}

impl Drop for Hollow {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// The Ready condition's status of each Node.
fn readiness(cluster: &LocalCluster) -> Result<BTreeMap<String, String>> {
    let list = cluster.get("/api/v1/nodes")?;
    Ok(list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| {
            let ready = n["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == "Ready")?;
            Some((n["metadata"]["name"].as_str()?.to_owned(), ready["status"].as_str()?.to_owned()))
        })
        .collect())
}

/// The Running, Ready Pods of the Deployment that are not being deleted, as (name, node, IP).
fn ready_pods(cluster: &LocalCluster) -> Result<Vec<(String, String, String)>> {
    let list = cluster.get("/api/v1/namespaces/default/pods?labelSelector=app%3Dwide")?;
    let ready = |p: &Value| {
        p["status"]["phase"] == "Running"
            && p["metadata"]["deletionTimestamp"].is_null()
            && p["status"]["conditions"]
                .as_array()
                .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
    };
    Ok(list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| ready(p))
        .map(|p| {
            let field = |v: &Value| v.as_str().unwrap_or_default().to_owned();
            (field(&p["metadata"]["name"]), field(&p["spec"]["nodeName"]), field(&p["status"]["podIP"]))
        })
        .collect())
}

/// Each Node's podCIDR.
fn pod_cidrs(cluster: &LocalCluster) -> Result<BTreeMap<String, String>> {
    let list = cluster.get("/api/v1/nodes")?;
    Ok(list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|n| Some((n["metadata"]["name"].as_str()?.to_owned(), n["spec"]["podCIDR"].as_str()?.to_owned())))
        .collect())
}

/// Whether `ip` lies in `cidr`.
fn within(ip: &str, cidr: &str) -> bool {
    let Some((network, prefix)) = cidr.split_once('/') else { return false };
    let (Ok(network), Ok(prefix), Ok(ip)) =
        (network.parse::<Ipv4Addr>(), prefix.parse::<u32>(), ip.parse::<Ipv4Addr>())
    else {
        return false;
    };
    let mask = u32::MAX.checked_shl(32 - prefix.min(32)).unwrap_or(0);
    u32::from(network) & mask == u32::from(ip) & mask
}

fn kubectl_ready_nodes(cluster: &LocalCluster, kubectl_dir: &Path) -> Result<BTreeSet<String>> {
    let out = Command::new("kubectl")
        .args(["--server", &format!("http://{}", cluster.listen), "get", "nodes", "--no-headers"])
        .env("KUBECONFIG", kubectl_dir.join("none"))
        .env("HOME", kubectl_dir)
        .output()?;
    ensure!(out.status.success(), "kubectl get nodes: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut fields = l.split_whitespace();
            let name = fields.next()?;
            (fields.next()? == "Ready").then(|| name.to_owned())
        })
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t101_hollow_nodes_register_run_a_deployment_and_go_not_ready_when_stopped() -> Result<()> {
    require_root()?;
    let flags = [
        "--node-monitor-grace-period=12s",
        "--default-unreachable-toleration-seconds=2",
        "--cluster-cidr=10.240.0.0/16",
        "--node-cidr-mask-size=26",
        "--agent-arg=--register-with-taints=gitplane.io/real-node=true:NoSchedule",
    ];
    let cluster = tokio::task::block_in_place(|| LocalCluster::up_with("gp101", 1, &flags))?;
    let (kept_base, stopped_base) = (format!("{}-h", cluster.base), format!("{}-s", cluster.base));
    let started = Instant::now();
    let kept = Hollow::start(&cluster, &kept_base, 80)?;
    let mut stopped = Hollow::start(&cluster, &stopped_base, 20)?;
    let hollow: BTreeSet<String> =
        (1..=80).map(|i| format!("{kept_base}-{i}")).chain((1..=20).map(|i| format!("{stopped_base}-{i}"))).collect();

    // Every hollow node Ready, as kubectl shows it.
    let kubectl_dir = tempfile::tempdir()?;
    tokio::task::block_in_place(|| {
        wait_for(DEADLINE, || kubectl_ready_nodes(&cluster, kubectl_dir.path()).ok().filter(|r| hollow.is_subset(r)))
    })
    .with_context(|| {
        format!("hollow nodes not Ready: {:?}\n{}\n{}", readiness(&cluster), kept.log_tail(), stopped.log_tail())
    })?;
    println!("100 hollow nodes Ready in kubectl {:.1} s after they started", started.elapsed().as_secs_f64());
    // Each its own /26 of the cluster range, the real node's too.
    let cidrs = pod_cidrs(&cluster)?;
    let distinct: BTreeSet<&String> = cidrs.values().collect();
    ensure!(distinct.len() == cidrs.len() && cidrs.len() == 101, "podCIDRs not one per node: {cidrs:?}");
    for (node, cidr) in &cidrs {
        ensure!(
            cidr.ends_with("/26") && within(cidr.split('/').next().unwrap_or_default(), "10.240.0.0/16"),
            "{node}'s podCIDR {cidr} is not a /26 of 10.240.0.0/16"
        );
    }

    // Lease renewals write the Lease alone: the Node keeps its resourceVersion.
    let node = format!("{kept_base}-1");
    let node_path = format!("/api/v1/nodes/{node}");
    let lease_path = format!("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{node}");
    let (before, lease_before) = (cluster.get(&node_path)?, cluster.get(&lease_path)?);
    let renewals = tokio::task::block_in_place(|| {
        wait_for(Duration::from_secs(60), || {
            let lease = cluster.get(&lease_path).ok()?;
            let renewed = lease["metadata"]["resourceVersion"] != lease_before["metadata"]["resourceVersion"];
            renewed.then_some(lease)
        })
    })
    .context("the Lease was never renewed")?;
    let after = cluster.get(&node_path)?;
    ensure!(
        after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"],
        "a Lease renewal ({} -> {}) rewrote the Node: {} -> {}",
        lease_before["spec"]["renewTime"],
        renewals["spec"]["renewTime"],
        before["metadata"]["resourceVersion"],
        after["metadata"]["resourceVersion"]
    );

    // A wide Deployment runs over the hollow nodes.
    let work_dir = tempfile::tempdir()?;
    let work = Worktree::clone(cluster.demo_repo(), work_dir.path().join("demo"))?;
    work.remove("web.yaml")?;
    work.write("wide.yaml", &manifests::deployment("wide", REPLICAS as u32))?;
    let pushed = Instant::now();
    work.commit_and_push("a Deployment of 300 replicas")?;
    let pods = tokio::task::block_in_place(|| {
        wait_for(DEADLINE, || ready_pods(&cluster).ok().filter(|p| p.len() == REPLICAS))
    })
    .with_context(|| format!("{} of {REPLICAS} Pods Running and Ready", ready_pods(&cluster).map_or(0, |p| p.len())))?;
    println!("{REPLICAS} Pods Running and Ready {:.1} s after the push", pushed.elapsed().as_secs_f64());
    let cidrs = pod_cidrs(&cluster)?;
    let on: BTreeSet<&str> = pods.iter().map(|(_, node, _)| node.as_str()).collect();
    ensure!(on.iter().all(|n| hollow.contains(*n)), "Pods on nodes that are not hollow: {on:?}");
    ensure!(on.len() >= 50, "{REPLICAS} Pods on {} nodes only: {on:?}", on.len());
    let ips: BTreeSet<&str> = pods.iter().map(|(_, _, ip)| ip.as_str()).collect();
    ensure!(ips.len() == REPLICAS, "Pod IPs are not unique: {} for {REPLICAS} Pods", ips.len());
    for (name, node, ip) in &pods {
        let cidr = cidrs.get(node).map(String::as_str).unwrap_or_default();
        ensure!(within(ip, cidr), "{name}'s IP {ip} is not in {node}'s podCIDR {cidr:?}");
    }

    // 20 nodes stop: NotReady after the grace period, their Pods made anew on the others.
    let moved = pods.iter().filter(|(_, node, _)| node.starts_with(&format!("{stopped_base}-"))).count();
    stopped.stop()?;
    let stop = Instant::now();
    tokio::task::block_in_place(|| {
        wait_for(DEADLINE, || {
            let ready = readiness(&cluster).ok()?;
            let gone = |n: &String| n.starts_with(&format!("{stopped_base}-"));
            let all = hollow.iter().all(|n| {
                let status = ready.get(n).map(String::as_str);
                if gone(n) { status == Some("Unknown") } else { status == Some("True") }
            });
            all.then_some(())
        })
    })
    .with_context(|| format!("the stopped nodes never went NotReady alone: {:?}", readiness(&cluster)))?;
    println!("20 stopped hollow nodes NotReady {:.1} s after their process stopped", stop.elapsed().as_secs_f64());
    tokio::task::block_in_place(|| {
        wait_for(DEADLINE, || {
            let pods = ready_pods(&cluster).ok()?;
            let kept_only = pods.iter().all(|(_, node, _)| node.starts_with(&format!("{kept_base}-")));
            (pods.len() == REPLICAS && kept_only).then_some(())
        })
    })
    .with_context(|| format!("the stopped nodes' Pods never moved: {:?}", ready_pods(&cluster).map(|p| p.len())))?;
    println!("{moved} Pods of the stopped nodes ran elsewhere {:.1} s after", stop.elapsed().as_secs_f64());

    // A stopped node's Node deleted: its podCIDR's record goes with it.
    let gone = format!("{stopped_base}-1");
    let record = format!("pod-cidr-{}", cidrs[&gone].replace('/', "-"));
    let records = || -> Result<BTreeMap<String, String>> {
        let list = cluster.get("/api/v1/namespaces/kube-system/configmaps?labelSelector=gitplane.io%2Fpod-cidr")?;
        let items = list["items"].as_array().cloned().unwrap_or_default();
        Ok(items
            .iter()
            .filter_map(|c| Some((c["metadata"]["name"].as_str()?.into(), c["data"]["node"].as_str()?.into())))
            .collect())
    };
    ensure!(records()?.get(&record) == Some(&gone), "no record {record} of {gone}: {:?}", records());
    let token = std::fs::read_to_string(cluster.data_dir.join("peer-token"))?;
    let store = RemoteStore::with_token(&[format!("http://{}", cluster.listen)], PeerToken::new(token.trim())?)?;
    store.txn(vec![Op::Delete { key: ObjectKey::new("Node", "", &gone), revision: None }]).await?;
    tokio::task::block_in_place(|| {
        wait_for(DEADLINE, || records().ok().filter(|r| !r.contains_key(&record) && r.len() == 100).map(|_| ()))
    })
    .with_context(|| format!("{gone}'s podCIDR record {record} outlived its Node"))?;
    println!("{gone}'s podCIDR released");
    drop(kept);
    tokio::task::block_in_place(|| cluster.stop_within(Duration::from_secs(20)))?;
    Ok(())
}
