//! `gitplane-bench scale`: clusters of hollow nodes (`gitplane agent --hollow N`, one process)
//! beside one `gitplane server` replica on loopback. Rows: scheduler_perf's SchedulingBasic
//! (unbound Pods created at once, in store transactions of 1,000, to bound: Pods/s, and p50 /
//! p99 from each Pod's creation to its binding, both seen on the store's watch), per cluster
//! size; on the largest cluster, the control plane's and the hollow process's CPU and RSS at rest
//! while every node renews its Lease, a Deployment pushed to Git until every replica is Running,
//! and its rollout of a new Pod template until the new ReplicaSet's Pods replaced every old one.
//! The hollow nodes take every bound Pod to Running meanwhile, as kubelets would.
//! With `--hold N`, the largest cluster then takes BestEffort Pods up to N in all and is measured
//! holding them: CPU and RSS at rest, the store's size, LIST of every Pod, and a Pod watch's
//! delivery while Pods are created.
//! `--backend` runs each cluster on SQLite (Raft's replica store), on a PostgreSQL server of its
//! own (`--store postgres`), or on both, size by size.

use crate::{
    procs::{self, Child, Gitplane, Postgres, READ_TOKEN, StoreClient},
    up::{git, git_in},
};
use anyhow::{Context as _, Result, bail, ensure};
use futures::StreamExt as _;
use gitplane_api::network::PodRanges;
use gitplane_storage::remote::pb;
use gitplane_store::Op;
use serde_json::{Value, json};
use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

#[derive(clap::Args, Clone)]
pub struct ScaleArgs {
    /// SchedulingBasic's clusters, `<nodes>x<pods>`, smallest first; the last one also measures
    /// the cluster at rest and the Deployment. At most as many nodes as `--cluster-cidr` holds.
    #[arg(long, value_delimiter = ',', default_values = ["100x1000", "250x2500"])]
    scheduling: Vec<String>,
    /// Replicas of the Deployment pushed to Git.
    #[arg(long, default_value_t = 1000)]
    replicas: usize,
    /// How long the largest cluster rests after every node is Ready before its CPU is measured,
    /// in seconds.
    #[arg(long, default_value_t = 30)]
    settle: u64,
    /// The CPU measurement window at rest, in seconds.
    #[arg(long, default_value_t = 60)]
    window: u64,
    /// The `gitplane` binary (default: next to this one).
    #[arg(long)]
    gitplane: Option<PathBuf>,
    /// The server's `--cluster-cidr`: hollow nodes take no address, so a large range costs
    /// nothing on the host.
    #[arg(long, default_value = "10.128.0.0/12")]
    cluster_cidr: String,
    /// The server's `--node-cidr-mask-size` (/26 of a /12: 16,384 nodes of 62 Pods).
    #[arg(long, default_value_t = 26)]
    node_cidr_mask_size: u8,
    /// The store the clusters run on; `both` runs each size on SQLite, then on Postgres.
    #[arg(long, value_enum, default_value_t = Backends::Sqlite)]
    backend: Backends,
    /// Pods the largest cluster holds for the steady rows, SchedulingBasic's included (the rest
    /// BestEffort, as scheduler_perf's nodes fit only so many of its Pods); 0: no steady rows.
    #[arg(long, default_value_t = 0)]
    hold: usize,
    /// The hollow nodes also hold the network and Pod config watches an agent holds (kubemark's
    /// hollow proxy), besides their Pod watches.
    #[arg(long)]
    all_watches: bool,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Backends {
    Sqlite,
    Postgres,
    Both,
}

impl Backends {
    fn each(self) -> Vec<Backend> {
        match self {
            Backends::Sqlite => vec![Backend::Sqlite],
            Backends::Postgres => vec![Backend::Postgres],
            Backends::Both => vec![Backend::Sqlite, Backend::Postgres],
        }
    }
}

/// One cluster's store: the server's default (SQLite under Raft), or a PostgreSQL server of its
/// own, started as the store bench starts it, behind `--store postgres`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "SQLite",
            Backend::Postgres => "Postgres",
        }
    }
}

/// How long registration, scheduling and the Deployment may take on a loaded 2-core machine.
const DEADLINE: Duration = Duration::from_secs(900);
/// Pods per store transaction (the whole burst is sent back to back).
const PODS_PER_TXN: usize = 1000;
/// LISTs of every Pod timed while the cluster holds its Pods.
const LISTS: usize = 10;
/// Pod watches, and Pods created a second, while a Pod watch's delivery is timed.
const WATCHES: usize = 100;
const CHURN: u32 = 100;

pub fn main(args: ScaleArgs) -> Result<()> {
    let gitplane = procs::prepare(args.gitplane.as_deref(), None)?;
    ensure!(gitplane.exists(), "no gitplane binary at {}: build it or pass --gitplane", gitplane.display());
    let sizes = args
        .scheduling
        .iter()
        .map(|s| {
            let (nodes, pods) = s.split_once('x').context("a size is <nodes>x<pods>, e.g. 500x1000")?;
            Ok((nodes.parse::<usize>()?, pods.parse::<usize>()?))
        })
        .collect::<Result<Vec<_>>>()?;
    ensure!(!sizes.is_empty(), "no cluster size given");
    let pods = PodRanges::new(&args.cluster_cidr, args.node_cidr_mask_size).map_err(anyhow::Error::msg)?;
    if let Some((nodes, _)) = sizes.iter().find(|(nodes, _)| *nodes > pods.count() as usize) {
        bail!(
            "{nodes} nodes: the cluster's Pod range {pods} holds {} nodes' /{} podCIDRs",
            pods.count(),
            pods.node_mask
        );
    }
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(run(&args, &gitplane, &sizes))
}

/// One SchedulingBasic measurement.
struct Scheduling {
    nodes: usize,
    pods: usize,
    registered: Duration,
    pods_per_second: f64,
    p50: Duration,
    p99: Duration,
}

/// The largest cluster at rest, and its Deployment.
struct Rest {
    nodes: usize,
    server_cpu: f64,
    server_rss_mib: f64,
    /// PostgreSQL's server and backends, on Postgres.
    postgres: Option<(f64, f64)>,
    hollow_cpu: f64,
    hollow_rss_mib: f64,
    revisions_per_second: f64,
    node_writes: i64,
    deployment: Duration,
    rollout: Duration,
}

/// The largest cluster holding `--hold` Pods.
struct Steady {
    pods: usize,
    /// Placing the Pods beyond SchedulingBasic's.
    placed: Scheduling,
    cpu: f64,
    revisions_per_second: f64,
    server_rss_mib: f64,
    hollow_rss_mib: f64,
    store_mib: f64,
    /// The first LIST of every Pod, then the next ones, sorted.
    first_list: Duration,
    lists: Vec<Duration>,
    watch: crate::watch::WatchResult,
}

/// What one backend measured over every size.
struct Run {
    backend: Backend,
    rows: Vec<Scheduling>,
    rest: Option<Rest>,
    steady: Option<Steady>,
}

async fn run(args: &ScaleArgs, gitplane: &Path, sizes: &[(usize, usize)]) -> Result<()> {
    let mut runs: Vec<Run> = args
        .backend
        .each()
        .into_iter()
        .map(|backend| Run { backend, rows: Vec::new(), rest: None, steady: None })
        .collect();
    for (i, &(nodes, pods)) in sizes.iter().enumerate() {
        let largest = i + 1 == sizes.len();
        for run in &mut runs {
            let mut cluster =
                Cluster::start(gitplane, nodes, &server_args(args), run.backend, args.all_watches).await?;
            eprintln!(
                "{}: {nodes} hollow nodes Ready after {:.1} s",
                run.backend.name(),
                cluster.registered.as_secs_f64()
            );
            if largest {
                run.rest = Some(cluster.rest(args).await?);
            }
            run.rows.push(cluster.scheduling_basic(pods).await?);
            if largest && args.hold > pods {
                run.steady = Some(cluster.steady(args, pods).await?);
            }
            cluster.stop();
        }
    }
    print_table(args, &runs);
    Ok(())
}

/// The server's flags.
fn server_args(args: &ScaleArgs) -> Vec<String> {
    vec![
        "--bootstrap=bootstrap".into(),
        format!("--cluster-cidr={}", args.cluster_cidr),
        format!("--node-cidr-mask-size={}", args.node_cidr_mask_size),
    ]
}

/// A `gitplane server` and its hollow nodes.
struct Cluster {
    // The hollow nodes go before the server they call.
    hollow: Child,
    server: Gitplane,
    // The database after the server that writes to it.
    postgres: Option<Postgres>,
    nodes: usize,
    registered: Duration,
    store: StoreClient,
}

impl Cluster {
    async fn start(
        gitplane: &Path,
        nodes: usize,
        server_args: &[String],
        backend: Backend,
        all_watches: bool,
    ) -> Result<Cluster> {
        let postgres = match backend {
            Backend::Sqlite => None,
            Backend::Postgres => Some(Postgres::start().await.context("PostgreSQL for --backend postgres")?),
        };
        let mut args = server_args.to_vec();
        if let Some(postgres) = &postgres {
            args.extend([
                "--store".to_owned(),
                "postgres".to_owned(),
                "--postgres-url".to_owned(),
                postgres.url.clone(),
            ]);
        }
        let server = Gitplane::start(gitplane, 1, &args).await?;
        let addr = server.addrs[&1];
        let dir = server.dir().join("hollow");
        std::fs::create_dir_all(&dir)?;
        let mut command = Command::new(gitplane);
        command
            .arg("agent")
            .arg(format!("--hollow={nodes}"))
            .arg("--node-name=hollow")
            .arg(format!("--server=http://{addr}"))
            .arg("--join-token-file")
            .arg(server.dir().join("join-token"))
            .arg("--credential-file")
            .arg(dir.join("node-credential"))
            .arg("--pod-dir")
            .arg(&dir)
            .env("RUST_LOG", "warn");
        if all_watches {
            command.arg("--hollow-all-watches");
        }
        let started = Instant::now();
        let hollow = Child::spawn("gitplane agent --hollow", command, &server.dir().join("hollow.log"))?;
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?.connect().await?;
        let store = procs::store_client(channel);
        let mut cluster = Cluster { hollow, server, postgres, nodes, registered: Duration::ZERO, store };
        procs::wait_for("every hollow node Ready", DEADLINE, || async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            (cluster.ready_nodes().await.ok()? >= nodes).then_some(())
        })
        .await
        .with_context(|| cluster.logs())?;
        cluster.registered = started.elapsed();
        Ok(cluster)
    }

    fn logs(&self) -> String {
        let hollow = std::fs::read_to_string(self.server.dir().join("hollow.log")).unwrap_or_default();
        let tail: Vec<&str> = hollow.lines().rev().take(20).collect();
        format!("{}--- hollow\n{}", self.server.logs(), tail.into_iter().rev().collect::<Vec<_>>().join("\n"))
    }

    async fn get(&self, path: &str) -> Result<Value> {
        let addr = self.server.addrs[&1];
        let body = gitplane_testkit::http_get_async(addr, path, Some(READ_TOKEN), Duration::from_secs(30)).await?;
        Ok(serde_json::from_str(&body)?)
    }

    async fn ready_nodes(&self) -> Result<usize> {
        let list = self.get("/api/v1/nodes").await?;
        Ok(list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|n| {
                n["status"]["conditions"]
                    .as_array()
                    .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
            })
            .count())
    }

    async fn revision(&mut self) -> Result<i64> {
        Ok(self.store.revision(pb::Empty {}).await?.into_inner().index as i64)
    }

    /// The store's watch of Pods from now.
    async fn watch_pods(&mut self) -> Result<tonic::Streaming<pb::WatchEvent>> {
        let from = self.revision().await?;
        let request =
            pb::WatchRequest { from_revision: from, kinds: vec!["Pod".into()], bookmarks: false, ..Default::default() };
        Ok(self.store.watch(request).await?.into_inner())
    }

    /// SchedulingBasic: `pods` unbound Pods, created back to back, until each is bound.
    async fn scheduling_basic(&mut self, pods: usize) -> Result<Scheduling> {
        eprintln!("SchedulingBasic: {pods} Pods on {} nodes", self.nodes);
        self.place(pods, "basic-", basic_pod).await
    }

    /// `pods` unbound Pods named `prefix<i>`, created back to back, until each is bound.
    async fn place(&mut self, pods: usize, prefix: &str, pod: fn(usize) -> Value) -> Result<Scheduling> {
        let mut events = self.watch_pods().await?;
        let batches: Vec<Vec<Op>> = (0..pods)
            .map(|i| Op::Create(pod(i)))
            .collect::<Vec<_>>()
            .chunks(PODS_PER_TXN)
            .map(<[Op]>::to_vec)
            .collect();
        for ops in batches {
            let json = serde_json::to_vec(&ops)?;
            let reply = self.store.txn(tonic::Request::new(pb::Payload { json, data: Vec::new() })).await?;
            ensure!(
                matches!(reply.into_inner().outcome, Some(pb::txn_reply::Outcome::Committed(_))),
                "creating the Pods was not committed"
            );
        }
        let (mut created, mut bound) = (HashMap::new(), HashMap::new());
        let deadline = Instant::now() + DEADLINE;
        while bound.len() < pods {
            let event = tokio::time::timeout_at(deadline.into(), events.next())
                .await
                .with_context(|| format!("{} of {pods} Pods bound within {DEADLINE:?}", bound.len()))?
                .context("the store's watch ended")??;
            let seen = Instant::now();
            if !event.name.starts_with(prefix) {
                continue;
            }
            created.entry(event.name.clone()).or_insert(seen);
            let object: Value = serde_json::from_slice(&event.object)?;
            if object["spec"]["nodeName"].is_string() {
                bound.entry(event.name).or_insert(seen);
            }
        }
        let first = created.values().min().copied().unwrap_or_else(Instant::now);
        let last = bound.values().max().copied().unwrap_or(first);
        let mut latencies: Vec<Duration> = bound.iter().map(|(name, at)| *at - created[name]).collect();
        latencies.sort();
        let at = |q: f64| latencies[((latencies.len() as f64 * q).ceil() as usize).clamp(1, latencies.len()) - 1];
        Ok(Scheduling {
            nodes: self.nodes,
            pods,
            registered: self.registered,
            pods_per_second: pods as f64 / (last - first).as_secs_f64().max(1e-3),
            p50: at(0.50),
            p99: at(0.99),
        })
    }

    /// CPU and RSS at rest, then the Deployment.
    async fn rest(&mut self, args: &ScaleArgs) -> Result<Rest> {
        eprintln!("at rest: {} s to settle, {} s measured", args.settle, args.window);
        tokio::time::sleep(Duration::from_secs(args.settle)).await;
        let (server, hollow) = (self.server.pids(), vec![self.hollow.pid()]);
        let postgres = self.postgres.as_ref().map(Postgres::pids).unwrap_or_default();
        let node_before = self.node_revisions().await?;
        let (revision, server_cpu, hollow_cpu, postgres_cpu) =
            (self.revision().await?, procs::cpu_time(&server), procs::cpu_time(&hollow), procs::cpu_time(&postgres));
        let started = Instant::now();
        tokio::time::sleep(Duration::from_secs(args.window)).await;
        let window = started.elapsed().as_secs_f64();
        let server_cpu = (procs::cpu_time(&server) - server_cpu).as_secs_f64() / window;
        let hollow_cpu = (procs::cpu_time(&hollow) - hollow_cpu).as_secs_f64() / window;
        let postgres_cpu = (procs::cpu_time(&postgres) - postgres_cpu).as_secs_f64() / window;
        let postgres_rss: f64 = procs::with_children(&postgres).into_iter().map(pss_mib).sum();
        let revisions_per_second = (self.revision().await? - revision) as f64 / window;
        let node_writes = self.node_revisions().await? - node_before;
        let (deployment, rollout) = self.deployment(args.replicas).await?;
        Ok(Rest {
            nodes: self.nodes,
            server_cpu,
            server_rss_mib: server.iter().map(|p| rss_mib(*p)).sum(),
            postgres: self.postgres.is_some().then_some((postgres_cpu, postgres_rss)),
            hollow_cpu,
            hollow_rss_mib: rss_mib(self.hollow.pid()),
            revisions_per_second,
            node_writes,
            deployment,
            rollout,
        })
    }

    /// Holding `--hold` Pods (`scheduled` of them SchedulingBasic's): BestEffort Pods up to it,
    /// then CPU and RSS at rest, the store's size, LIST of every Pod, and a Pod watch's delivery
    /// while Pods are created.
    async fn steady(&mut self, args: &ScaleArgs, scheduled: usize) -> Result<Steady> {
        let pods = args.hold;
        eprintln!("holding {pods} Pods: {} more", pods - scheduled);
        let placed = self.place(pods - scheduled, "held-", held_pod).await?;
        eprintln!("holding {pods} Pods: {} s to settle, {} s measured", args.settle, args.window);
        tokio::time::sleep(Duration::from_secs(args.settle)).await;
        let mut pids = self.server.pids();
        pids.extend(self.postgres.as_ref().map(Postgres::pids).unwrap_or_default());
        let (revision, cpu) = (self.revision().await?, procs::cpu_time(&pids));
        let started = Instant::now();
        tokio::time::sleep(Duration::from_secs(args.window)).await;
        let window = started.elapsed().as_secs_f64();
        let cpu = (procs::cpu_time(&pids) - cpu).as_secs_f64() / window;
        let revisions_per_second = (self.revision().await? - revision) as f64 / window;
        let store_dir = match &self.postgres {
            Some(postgres) => postgres.data_dir(),
            None => self.server.dir().join("replica-1"),
        };
        let store_mib = dir_bytes(&store_dir) as f64 / (1024.0 * 1024.0);
        let addr = self.server.addrs[&1];
        // The first LIST is timed apart: it would include filling a cache the API server had not
        // filled at start-up.
        let mut lists = Vec::new();
        for _ in 0..=LISTS {
            let started = Instant::now();
            let body =
                gitplane_testkit::http_get_async(addr, "/api/v1/pods", Some(READ_TOKEN), Duration::from_secs(60))
                    .await?;
            lists.push(started.elapsed());
            ensure!(body.contains("\"kind\":\"PodList\""), "LIST of every Pod: {}", &body[..body.len().min(200)]);
        }
        let first_list = lists.remove(0);
        lists.sort();
        eprintln!("holding {pods} Pods: {WATCHES} watches while {CHURN} Pods/s are created");
        let transport = crate::apiwatch::Transport::Http2 { connections: 1 };
        let watch = crate::apiwatch::run(addr, transport, WATCHES, CHURN, Duration::from_secs(10)).await?;
        Ok(Steady {
            pods,
            placed,
            cpu,
            revisions_per_second,
            server_rss_mib: self.server.pids().iter().map(|p| rss_mib(*p)).sum(),
            hollow_rss_mib: rss_mib(self.hollow.pid()),
            store_mib,
            first_list,
            lists,
            watch,
        })
    }

    /// The sum of the Nodes' resourceVersions: it moves only when a Node is written.
    async fn node_revisions(&self) -> Result<i64> {
        let list = self.get("/api/v1/nodes").await?;
        Ok(list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|n| n["metadata"]["resourceVersion"].as_str()?.parse::<i64>().ok())
            .sum())
    }

    /// From `git push` of a Deployment of `replicas` to every one of its Pods Running; then from
    /// `git push` of a new Pod template (`kubectl rollout restart`'s annotation) to every Pod of
    /// the new ReplicaSet Running and no old Pod left. The rollout is RollingUpdate's default
    /// (25% surge, 25% unavailable); the hollow nodes finalize the old Pods' graceful deletes.
    async fn deployment(&mut self, replicas: usize) -> Result<(Duration, Duration)> {
        let addr = self.server.addrs[&1];
        let token = std::fs::read_to_string(self.server.dir().join("replica-1/git-token"))?.trim().to_owned();
        let remote = |name: &str| format!("http://git:{token}@{addr}/git/{name}.git");
        let work = self.server.dir().join("work");
        for (repo, file, content) in
            [("bootstrap", "scale.yaml", application()), ("scale", "manifests/scale.yaml", deployment(replicas, None))]
        {
            let dir = work.join(repo);
            std::fs::create_dir_all(dir.join("manifests"))?;
            std::fs::write(dir.join(file), content)?;
            git(git_in(&dir).args(["init", "-q", "-b", "main"])).await?;
            git(git_in(&dir).args(["add", "-A"])).await?;
            git(git_in(&dir).args(["commit", "-q", "-m", repo])).await?;
            if repo == "bootstrap" {
                git(git_in(&dir).args(["push", "-q", "--force", &remote(repo), "main"])).await?;
                let repos = self.server.dir().join("repos");
                procs::wait_for("the scale repository", Duration::from_secs(60), || async {
                    repos.join("scale.git").exists().then_some(())
                })
                .await?;
            }
        }
        let mut events = self.watch_pods().await?;
        let mut pods = DeploymentPods::default();
        eprintln!("a Deployment of {replicas} replicas pushed");
        let scale = work.join("scale");
        let pushed = Instant::now();
        git(git_in(&scale).args(["push", "-q", &remote("scale"), "main"])).await?;
        pods.follow(&mut events, replicas, None).await?;
        let created = pushed.elapsed();

        let restarted_at = k8s_openapi::jiff::Timestamp::now().to_string();
        std::fs::write(scale.join("manifests/scale.yaml"), deployment(replicas, Some(&restarted_at)))?;
        git(git_in(&scale).args(["commit", "-q", "-a", "-m", "restart"])).await?;
        eprintln!("its rollout of a new Pod template pushed");
        let pushed = Instant::now();
        git(git_in(&scale).args(["push", "-q", &remote("scale"), "main"])).await?;
        pods.follow(&mut events, replicas, Some(&restarted_at)).await?;
        Ok((created, pushed.elapsed()))
    }

    fn stop(self) {
        // The hollow process first (field order), then the server.
        drop(self);
    }
}

/// The Deployment's Pods on the store's watch, by name: the template's restart annotation, and
/// whether the Pod is Running.
#[derive(Default)]
struct DeploymentPods(HashMap<String, (Option<String>, bool)>);

impl DeploymentPods {
    /// Follows the watch until `replicas` Pods of the template restarted at `restarted_at` are
    /// Running and no other Pod of the Deployment is left.
    async fn follow(
        &mut self,
        events: &mut tonic::Streaming<pb::WatchEvent>,
        replicas: usize,
        restarted_at: Option<&str>,
    ) -> Result<()> {
        let deadline = Instant::now() + DEADLINE;
        loop {
            let current = self.0.values().filter(|(at, _)| at.as_deref() == restarted_at);
            let running = current.clone().filter(|(_, running)| *running).count();
            if running >= replicas && current.count() == self.0.len() {
                return Ok(());
            }
            let Ok(event) = tokio::time::timeout_at(deadline.into(), events.next()).await else {
                bail!(
                    "{running} of {replicas} Pods of the template Running, {} Pods in all, within {DEADLINE:?}",
                    self.0.len()
                );
            };
            let event = event.context("the store's watch ended")??;
            let object: Value = serde_json::from_slice(&event.object)?;
            if object["metadata"]["labels"]["app"] != "scale" {
                continue;
            }
            if event.r#type == "DELETED" {
                self.0.remove(&event.name);
                continue;
            }
            let at = object["metadata"]["annotations"][RESTARTED_AT].as_str().map(str::to_owned);
            self.0.insert(event.name, (at, object["status"]["phase"] == "Running"));
        }
    }
}

/// The Pod template annotation `kubectl rollout restart` sets.
const RESTARTED_AT: &str = "kubectl.kubernetes.io/restartedAt";

/// scheduler_perf's default Pod (`pod-default.yaml`): one pause container asking 100m CPU and
/// 500Mi of memory.
fn basic_pod(i: usize) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("basic-{i}"), "namespace": "default"},
        "spec": {"containers": [{
            "name": "pause", "image": "registry.k8s.io/pause:3.10",
            "resources": {"requests": {"cpu": "100m", "memory": "500Mi"}, "limits": {"cpu": "100m", "memory": "500Mi"}}
        }]}
    })
}

/// A Pod that requests nothing: nodes hold as many as their Pod count allows.
fn held_pod(i: usize) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("held-{i}"), "namespace": "default"},
        "spec": {"containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10"}]}
    })
}

/// The bytes of the files under `dir`.
fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

fn application() -> String {
    "apiVersion: gitplane.io/v1\nkind: Application\nmetadata:\n  name: scale\n  namespace: gitplane-system\n\
     spec:\n  repo: scale\n  path: manifests\n  namespace: default\n  prune: true\n"
        .to_owned()
}

fn deployment(replicas: usize, restarted_at: Option<&str>) -> String {
    let annotations =
        restarted_at.map(|at| format!("      annotations:\n        {RESTARTED_AT}: \"{at}\"\n")).unwrap_or_default();
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: scale\nspec:\n  replicas: {replicas}\n  \
         selector:\n    matchLabels:\n      app: scale\n  template:\n    metadata:\n{annotations}      labels:\n        app: scale\n    \
         spec:\n      containers:\n        - name: pause\n          image: registry.k8s.io/pause:3.10\n"
    )
}

fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:")?.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

/// Proportional set size: a PostgreSQL backend's RSS counts the shared buffers it touched, which
/// every backend shares.
fn pss_mib(pid: u32) -> f64 {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    let kib = rollup
        .lines()
        .find_map(|l| l.strip_prefix("Pss:")?.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

fn steady(run: &Run) -> &Steady {
    run.steady.as_ref().expect("every backend holds the Pods")
}

fn at_rest(run: &Run) -> &Rest {
    run.rest.as_ref().expect("every backend measures the largest cluster at rest")
}

/// One column per backend: `| What | SQLite | Postgres | Goal |`.
fn print_table(args: &ScaleArgs, runs: &[Run]) {
    let names: Vec<&str> = runs.iter().map(|r| r.backend.name()).collect();
    println!("| What | {} | Goal |", names.join(" | "));
    println!("|---|{}---|", "---|".repeat(runs.len()));
    let row = |what: String, cell: &dyn Fn(&Run) -> String, goal: &str| {
        let cells: Vec<String> = runs.iter().map(cell).collect();
        println!("| {what} | {} | {goal} |", cells.join(" | "));
    };
    for (i, first) in runs[0].rows.iter().enumerate() {
        row(
            format!("SchedulingBasic, {} hollow nodes / {} Pods", first.nodes, first.pods),
            &|run| {
                let r = &run.rows[i];
                format!(
                    "{:.0} Pods/s; creation to bound p50 {:.2} s, p99 {:.2} s (nodes Ready {:.0} s after start)",
                    r.pods_per_second,
                    r.p50.as_secs_f64(),
                    r.p99.as_secs_f64(),
                    r.registered.as_secs_f64()
                )
            },
            "",
        );
    }
    let Some(nodes) = runs[0].rest.as_ref().map(|r| r.nodes) else { return };
    row(
        format!("Control plane at rest, {nodes} nodes renewing Leases ({} s window)", args.window),
        &|run| {
            let r = at_rest(run);
            let postgres = r.postgres.map_or(0.0, |(cpu, _)| cpu);
            let split = match r.postgres {
                Some((cpu, _)) => format!(" (gitplane {:.0}%, PostgreSQL {:.0}%)", r.server_cpu * 100.0, cpu * 100.0),
                None => String::new(),
            };
            // Every node renews its Lease every 10 s.
            let renewals = r.nodes as f64 / 10.0;
            format!(
                "{:.1}% of one core{split}, {:.0} revisions/s ({:.0} µs of CPU per Lease renewal), Node writes {}",
                (r.server_cpu + postgres) * 100.0,
                r.revisions_per_second,
                (r.server_cpu + postgres) * 1e6 / renewals,
                r.node_writes
            )
        },
        "< 25% of one core",
    );
    row(
        format!("Control plane RSS, {nodes} nodes"),
        &|run| {
            let r = at_rest(run);
            match r.postgres {
                Some((_, pss)) => format!("{:.0} MiB; PostgreSQL {pss:.0} MiB (PSS)", r.server_rss_mib),
                None => format!("{:.0} MiB", r.server_rss_mib),
            }
        },
        "< 2 GiB",
    );
    row(
        format!("Hollow process, {nodes} nodes"),
        &|run| {
            format!("{:.0}% of one core, {:.0} MiB RSS", at_rest(run).hollow_cpu * 100.0, at_rest(run).hollow_rss_mib)
        },
        "",
    );
    row(
        format!("Deployment of {} replicas, `git push` to every Pod Running ({nodes} nodes)", args.replicas),
        &|run| format!("{:.1} s", at_rest(run).deployment.as_secs_f64()),
        "< 5 s",
    );
    row(
        format!(
            "Rollout of its new Pod template (RollingUpdate 25% / 25%), `git push` to every new Pod Running and \
             no old Pod left ({nodes} nodes)"
        ),
        &|run| format!("{:.1} s", at_rest(run).rollout.as_secs_f64()),
        "",
    );
    let Some(pods) = runs[0].steady.as_ref().map(|s| s.pods) else { return };

    row(
        format!("Placing BestEffort Pods up to {pods} ({nodes} nodes)"),
        &|run| {
            let p = &steady(run).placed;
            format!(
                "{} Pods, {:.0} Pods/s; p50 {:.2} s, p99 {:.2} s",
                p.pods,
                p.pods_per_second,
                p.p50.as_secs_f64(),
                p.p99.as_secs_f64()
            )
        },
        "",
    );
    row(
        format!("Control plane holding {pods} Pods on {nodes} nodes: CPU at rest ({} s window), RSS", args.window),
        &|run| {
            let s = steady(run);
            format!(
                "{:.1}% of one core, {:.0} revisions/s; server RSS {:.0} MiB; hollow process {:.0} MiB",
                s.cpu * 100.0,
                s.revisions_per_second,
                s.server_rss_mib,
                s.hollow_rss_mib
            )
        },
        "RSS < 2 GiB",
    );
    row(format!("Store size holding {pods} Pods"), &|run| format!("{:.0} MiB", steady(run).store_mib), "");
    row(
        format!("LIST of all {pods} Pods through the API ({LISTS} in a row, after the first)"),
        &|run| {
            let (first, lists) = (steady(run).first_list, &steady(run).lists);
            let ms = |d: &Duration| d.as_secs_f64() * 1e3;
            format!(
                "p50 {:.0} ms, p99 {:.0} ms; the first {:.0} ms",
                ms(&lists[lists.len() / 2]),
                ms(&lists[lists.len() - 1]),
                ms(&first)
            )
        },
        "p99 < 1 s",
    );
    row(
        format!("A Pod watch's delivery holding {pods} Pods, {WATCHES} watches, {CHURN} Pods/s created for 10 s"),
        &|run| {
            let w = &steady(run).watch;
            let ms = |d: Option<Duration>| d.map_or("-".into(), |d| format!("{:.1} ms", d.as_secs_f64() * 1e3));
            format!(
                "p50 {}, p99 {}, max {} ({} of {} delivered)",
                ms(w.delivery.quantile(0.5)),
                ms(w.delivery.quantile(0.99)),
                ms(w.delivery.max()),
                w.delivery.len(),
                w.expected
            )
        },
        "p99 < 100 ms",
    );
}
