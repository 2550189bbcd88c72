//! Prometheus `/metrics` on the real `gitplane up --nodes 1`: the replica's,
//! scraped with the real `curl` over HTTPS with the read token (and refused without one on the
//! bridge address, where reads are not anonymous), and the agent's, refused on its kubelet
//! endpoint without a replica's client certificate and scraped through the replica's node proxy
//! (`/api/v1/nodes/<node>/proxy/metrics`, as Prometheus scrapes kubelets through the API
//! server). Both are parsed as the text format, and every family the issue lists exists and
//! has moved after a push: syncs, push-to-applied, scheduling attempts, queue adds, store
//! writes, Raft's commit and apply index, an open watch, a Pod's start and the proxy's syncs.
//! Then every replica of three `gitplane server`s serves its own Raft view: one term, one
//! leader, and every replica's commit and apply index past the cluster's first writes. And on
//! the Postgres backend (three `gitplane server --store postgres` on one private PostgreSQL), each
//! replica serves the store's metrics: its writes' latency, the lease's leader, the revision.

use anyhow::{Context, Result, bail, ensure};
use gitplane_e2e::{
    LocalCluster, Worktree,
    cluster::{Cluster, READ_BEARER, loopback_get, loopback_request},
    require_root, wait_for,
};
use gitplane_metrics::parse::{Scrape, parse};
use gitplane_storage::postgres::testing::PgCluster;
use std::{
    process::{Command, Stdio},
    time::Duration,
};

const DEADLINE: Duration = Duration::from_secs(180);

const OBJECTS: &str = "apiVersion: v1
kind: ConfigMap
metadata:
  name: metrics-config
data:
  greeting: hello
---
apiVersion: v1
kind: Pod
metadata:
  name: metrics-pod
  labels: {app: metrics}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: web
    image: gitplane.local/httpd:1
    imagePullPolicy: IfNotPresent
";

/// `curl` (in network namespace `netns`, if given): the status code and the body.
fn curl(netns: Option<&str>, args: &[&str]) -> Result<(u16, String)> {
    let mut command = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, "curl"]);
            c
        }
        None => Command::new("curl"),
    };
    let out = command
        .args(["-sS", "--max-time", "20", "-w", "\n%{http_code}"])
        .args(args)
        .output()
        .context("running curl (apt-get install curl)")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').context("curl wrote no status")?;
    let code = code.trim().parse().with_context(|| format!("curl: {}", String::from_utf8_lossy(&out.stderr)))?;
    Ok((code, body.to_owned()))
}

/// The `read` token `gitplane up` made (`<data-dir>/tokens.csv`: token,user,uid,"roles").
fn read_token(cluster: &LocalCluster) -> Result<String> {
    let tokens = std::fs::read_to_string(cluster.data_dir.join("tokens.csv"))?;
    tokens
        .lines()
        .find(|l| !l.starts_with('#') && l.contains("read"))
        .and_then(|l| l.split(',').next())
        .map(str::to_owned)
        .context("no read token in tokens.csv")
}

/// A check of a scrape: what it says and whether it holds.
type Check = (&'static str, fn(&Scrape) -> bool);

const REPLICA_CHECKS: &[Check] = &[
    ("apiserver_request_total counts LISTs of pods", |s| {
        s.sum("apiserver_request_total", &[("verb", "LIST"), ("resource", "pods")]) >= 1.0
    }),
    ("apiserver_cache_list_total counts the watch cache's answers to LISTs of pods", |s| {
        s.sum("apiserver_cache_list_total", &[("resource", "pods")]) >= 1.0
    }),
    ("apiserver_request_duration_seconds is a histogram", |s| {
        s.kind("apiserver_request_duration_seconds") == Some("histogram")
    }),
    ("apiserver_longrunning_requests shows the open watch", |s| {
        s.value("apiserver_longrunning_requests", &[("verb", "WATCH"), ("resource", "pods")]).unwrap_or(0.0) >= 1.0
    }),
    ("a Synced sync of the demo Application", |s| {
        s.sum("gitplane_application_sync_duration_seconds_count", &[("application", "demo"), ("result", "Synced")])
            >= 1.0
    }),
    ("push-to-applied latency of the demo Application", |s| {
        s.sum("gitplane_push_to_applied_seconds_count", &[("application", "demo")]) >= 1.0
    }),
    ("git fetch duration family", |s| s.kind("gitplane_git_fetch_duration_seconds") == Some("histogram")),
    ("push verdict duration family", |s| s.kind("gitplane_push_verdict_duration_seconds") == Some("histogram")),
    ("scheduling attempts", |s| s.sum("scheduler_schedule_attempts_total", &[("result", "scheduled")]) >= 1.0),
    ("scheduling latency", |s| s.sum("scheduler_scheduling_attempt_duration_seconds_count", &[]) >= 1.0),
    ("the scheduler's queue depth", |s| s.value("workqueue_depth", &[("name", "scheduler")]).is_some()),
    ("the source's and a controller's queue adds", |s| {
        s.sum("workqueue_adds_total", &[("name", "source")]) >= 1.0
            && s.sum("workqueue_adds_total", &[("name", "replicaset")]) >= 1.0
    }),
    ("store write latency", |s| s.sum("gitplane_store_txn_duration_seconds_count", &[("result", "ok")]) >= 1.0),
    ("Raft term", |s| s.value("gitplane_raft_term", &[]).unwrap_or(0.0) >= 1.0),
    ("Raft leader", |s| {
        s.value("gitplane_raft_is_leader", &[]) == Some(1.0) && s.value("gitplane_raft_has_leader", &[]) == Some(1.0)
    }),
    ("Raft commit index", |s| s.value("gitplane_raft_commit_index", &[]).unwrap_or(0.0) > 0.0),
    ("Raft apply index", |s| s.value("gitplane_raft_applied_index", &[]).unwrap_or(0.0) > 0.0),
    ("Raft commit index never behind the apply index", |s| {
        s.value("gitplane_raft_commit_index", &[]) >= s.value("gitplane_raft_applied_index", &[])
    }),
];

const AGENT_CHECKS: &[Check] = &[
    ("pod start latency", |s| s.sum("kubelet_pod_start_duration_seconds_count", &[]) >= 1.0),
    ("proxy rule syncs", |s| s.sum("kubeproxy_sync_proxy_rules_duration_seconds_count", &[]) >= 1.0),
];

fn failing(scrape: &Scrape, checks: &[Check]) -> Vec<&'static str> {
    checks.iter().filter(|(_, holds)| !holds(scrape)).map(|(what, _)| *what).collect()
}

#[test]
fn t78_prometheus_metrics_on_replicas_and_agents() -> Result<()> {
    require_root()?;
    let cluster = LocalCluster::up("gp78", 1)?;
    let node = cluster.nodes[0].clone();
    let token = read_token(&cluster)?;
    let bearer = format!("Authorization: Bearer {token}");
    let ca = cluster.data_dir.join("ca.crt").to_string_lossy().into_owned();
    let port = cluster.listen.port();
    let https = |path: &str| format!("https://127.0.0.1:{port}{path}");

    let work_dir = tempfile::tempdir()?;
    let work = Worktree::clone(cluster.demo_repo(), work_dir.path().join("demo"))?;
    work.write("metrics.yaml", OBJECTS)?;
    work.commit_and_push("a ConfigMap and a Pod")?;
    wait_for(DEADLINE, || cluster.running_pods("app=metrics").ok().filter(|p| p.len() == 1))
        .with_context(|| format!("the Pod never ran:\n{}", cluster.log_text()))?;

    // A watch held open while scraping (ended below, by its PID).
    let mut watch = Command::new("curl")
        .args(["-sSN", "--cacert", &ca, "-H", &bearer, &https("/api/v1/pods?watch=1&timeoutSeconds=300")])
        .stdout(Stdio::null())
        .spawn()
        .context("running curl")?;
    let replica = wait_for(DEADLINE, || {
        let (code, body) = curl(None, &["--cacert", &ca, "-H", &bearer, &https("/metrics")]).ok()?;
        let scrape = parse(&body).ok()?;
        (code == 200 && failing(&scrape, REPLICA_CHECKS).is_empty()).then_some(body)
    });
    let last = curl(None, &["--cacert", &ca, "-H", &bearer, &https("/metrics")]);
    let _ = watch.kill();
    let _ = watch.wait();
    let Some(replica) = replica else {
        let (code, body) = last?;
        let missing = parse(&body).map(|s| failing(&s, REPLICA_CHECKS));
        bail!("the replica's /metrics ({code}) never showed {missing:?}:\n{body}");
    };
    println!("replica /metrics: {} bytes, {} lines", replica.len(), replica.lines().count());

    // Refusals: a wrong token on loopback; no token on the bridge, where reads need one.
    let (code, _) = curl(None, &["--cacert", &ca, "-H", "Authorization: Bearer wrong-token", &https("/metrics")])?;
    ensure!(code == 401, "a wrong token got {code}");
    let bridge = format!("https://172.29.0.1:{port}/metrics");
    let (code, body) = curl(Some(&node), &["--cacert", &ca, &bridge])?;
    ensure!(code == 401, "no token on the bridge got {code}: {body}");
    let (code, body) = curl(Some(&node), &["--cacert", &ca, "-H", &bearer, &bridge])?;
    ensure!(code == 200 && parse(&body).is_ok(), "the read token on the bridge got {code}");

    // The agent's kubelet endpoint refuses a caller without the node-derived token...
    let node_object = cluster.get(&format!("/api/v1/nodes/{node}"))?;
    let addresses = node_object["status"]["addresses"].as_array().context("node addresses")?;
    let ip = addresses
        .iter()
        .find(|a| a["type"] == "InternalIP")
        .and_then(|a| a["address"].as_str())
        .context("InternalIP")?;
    let kubelet_port = node_object["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"].as_u64().unwrap_or(10250);
    // The kubelet endpoint takes only a replica's client certificate: without one the TLS
    // handshake fails (curl's code 000), a status API token notwithstanding.
    let direct = format!("https://{ip}:{kubelet_port}/metrics");
    let kubelet_ca = cluster.data_dir.join("kubelet-ca.crt").to_string_lossy().into_owned();
    let (code, body) = curl(Some(&node), &["--cacert", &kubelet_ca, &direct])?;
    ensure!(code == 0, "the agent's /metrics without a client certificate got {code}: {body}");
    let (code, _) = curl(Some(&node), &["--cacert", &kubelet_ca, "-H", &bearer, &direct])?;
    ensure!(code == 0, "the agent's /metrics with a status API token got {code}");
    // ... and answers the replica, which proxies it to a reader.
    let proxied = https(&format!("/api/v1/nodes/{node}/proxy/metrics"));
    let agent = wait_for(DEADLINE, || {
        let (code, body) = curl(None, &["--cacert", &ca, "-H", &bearer, &proxied]).ok()?;
        let scrape = parse(&body).ok()?;
        (code == 200 && failing(&scrape, AGENT_CHECKS).is_empty()).then_some(body)
    });
    let Some(agent) = agent else {
        let (code, body) = curl(None, &["--cacert", &ca, "-H", &bearer, &proxied])?;
        bail!(
            "the agent's /metrics ({code}) never showed {:?}:\n{body}",
            parse(&body).map(|s| failing(&s, AGENT_CHECKS))
        );
    };
    println!("agent /metrics: {} bytes, {} lines", agent.len(), agent.lines().count());
    // The agent's process holds no control-plane families.
    ensure!(!agent.contains("apiserver_request_total"), "the agent exports the replica's families");
    let (code, _) = curl(None, &["--cacert", &ca, &https(&format!("/api/v1/nodes/{node}/proxy/metrics"))])?;
    ensure!(code == 200, "gitplane up reads anonymously on loopback: got {code}");
    let (code, _) = curl(None, &["--cacert", &ca, "-H", &bearer, &https(&format!("/api/v1/nodes/{node}/proxy/pods"))])?;
    ensure!(code == 403, "the node proxy serves metrics and stats/summary only: got {code}");
    cluster.stop(DEADLINE)?;
    Ok(())
}

#[test]
fn t78_every_replica_serves_its_raft_view() -> Result<()> {
    let cluster = Cluster::start(3, &[])?;
    let leader = cluster.leader(DEADLINE)?;
    let gauge = |scrape: &Scrape, name: &str| scrape.value(name, &[]).unwrap_or(-1.0);
    let views = wait_for(DEADLINE, || {
        let scrapes: Vec<Scrape> =
            (1..=3).map(|id| parse(&loopback_get(cluster.addrs[&id], "/metrics").ok()?).ok()).collect::<Option<_>>()?;
        let settled = scrapes.iter().all(|s| {
            gauge(s, "gitplane_raft_commit_index") > 0.0
                && gauge(s, "gitplane_raft_applied_index") > 0.0
                && gauge(s, "gitplane_raft_leader_id") == leader as f64
        });
        settled.then_some(scrapes)
    })
    .with_context(|| format!("three replicas agreeing on leader {leader}:\n{}", cluster.logs()))?;
    let terms: Vec<f64> = views.iter().map(|s| gauge(s, "gitplane_raft_term")).collect();
    ensure!(terms.iter().all(|t| *t >= 1.0 && *t == terms[0]), "one term: {terms:?}");
    let leaders: Vec<f64> = views.iter().map(|s| gauge(s, "gitplane_raft_is_leader")).collect();
    ensure!(leaders.iter().sum::<f64>() == 1.0 && leaders[leader as usize - 1] == 1.0, "one leader: {leaders:?}");
    let (code, _) = loopback_request(cluster.addrs[&1], "GET", "/metrics", &[], b"")?;
    ensure!(code == 401, "a replica of gitplane server without a token: {code}");
    let (code, _) = loopback_request(cluster.addrs[&1], "GET", "/metrics", &[READ_BEARER], b"")?;
    ensure!(code == 200, "with the read token: {code}");
    Ok(())
}

#[test]
fn t78_postgres_replicas_serve_the_store_metrics() -> Result<()> {
    let postgres = PgCluster::start();
    let url = postgres.url("postgres");
    let cluster = Cluster::start(3, &["--store", "postgres", "--postgres-url", &url])?;
    let leader = cluster.leader(DEADLINE)?;
    // Writes through the leader's store, timed as every write is: a node registers (its Node,
    // its podCIDR record and its Lease).
    let join = std::fs::read_to_string(cluster.dir.path().join("join-token"))?;
    let register = async {
        use gitplane_proto::node::{RegisterRequest, node_service_client::NodeServiceClient};
        let mut client = NodeServiceClient::connect(format!("http://{}", cluster.addrs[&leader])).await?;
        let node = serde_json::json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "t78-node"},
            "status": {"addresses": [{"type": "InternalIP", "address": "192.0.2.78"}]}});
        let mut request = tonic::Request::new(RegisterRequest { node: serde_json::to_vec(&node)?, csr: Vec::new() });
        request.metadata_mut().insert("authorization", format!("Bearer {}", join.trim()).parse()?);
        client.register(request).await?;
        anyhow::Ok(())
    };
    tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(register)?;
    let gauge = |scrape: &Scrape, name: &str| scrape.value(name, &[]).unwrap_or(-1.0);
    let views = wait_for(DEADLINE, || {
        let scrapes: Vec<Scrape> =
            (1..=3).map(|id| parse(&loopback_get(cluster.addrs[&id], "/metrics").ok()?).ok()).collect::<Option<_>>()?;
        let settled = scrapes.iter().all(|s| gauge(s, "gitplane_store_has_leader") == 1.0)
            && scrapes[leader as usize - 1].sum("gitplane_store_txn_duration_seconds_count", &[("result", "ok")])
                >= 1.0;
        settled.then_some(scrapes)
    })
    .with_context(|| format!("the store metrics of three Postgres replicas:\n{}", cluster.logs()))?;
    let leaders: Vec<f64> = views.iter().map(|s| gauge(s, "gitplane_store_is_leader")).collect();
    ensure!(leaders.iter().sum::<f64>() == 1.0 && leaders[leader as usize - 1] == 1.0, "one leader: {leaders:?}");
    for (i, scrape) in views.iter().enumerate() {
        ensure!(gauge(scrape, "gitplane_store_revision") > 0.0, "replica {}: no revision", i + 1);
        ensure!(scrape.value("gitplane_raft_term", &[]).is_none(), "replica {}: Raft metrics without Raft", i + 1);
        let kind = scrape.kind("gitplane_store_txn_duration_seconds");
        ensure!(kind == Some("histogram"), "replica {}: the write latency is a {kind:?}", i + 1);
    }
    Ok(())
}
