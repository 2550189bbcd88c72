//! `gitplane-bench`: benchmarks that print ratios against a baseline measured in the same run.
//!
//! `gitplane-bench store` compares gitplane's store with etcd, driven by one load generator:
//! write throughput and latency, a cluster's write mix, leader failover, and watch fan-out. `gitplane-bench source`
//! measures the GitOps source against the bare YAML parse and `kubectl kustomize`;
//! `gitplane-bench services` Services across the nodes of `gitplane up --nodes`; `gitplane-bench
//! statefulset` StatefulSet rollouts against a Deployment's there; `gitplane-bench
//! podstart` Pod start on one node against bare CRI calls; `gitplane-bench api` reads of the status
//! API with 150,000 Pods stored; `gitplane-bench scale` scheduling, rest and a Deployment on
//! hundreds of hollow nodes. Progress goes to
//! stderr, one Markdown table to stdout.

mod api;
mod api_rbac;
mod apiwatch;
mod auth;
mod encryption;
mod etcd;
mod failover;
mod idle;
mod ingress;
mod ingresspush;
mod load;
mod monitor;
mod netpol;
mod page;
mod podstart;
mod procs;
mod scale;
mod services;
mod source;
mod statefulset;
mod up;
mod watch;
mod write_mix;

use anyhow::{Context as _, Result, bail};
use clap::{Parser, Subcommand};
use load::{Api, Measured};
use procs::{Etcd, Gitplane, Postgres};
use std::{net::SocketAddr, path::PathBuf, time::Duration};

#[derive(Parser)]
#[command(about = "gitplane benchmarks: each prints ratios against a baseline measured in the same run")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The store against etcd: writes, failover, watch fan-out. Prints one Markdown table.
    Store(StoreArgs),
    /// The GitOps source against the bare YAML parse and `kubectl kustomize`, and push-to-applied
    /// through a server. Prints one Markdown table.
    Source(source::SourceArgs),
    /// Services across nodes on `gitplane up --nodes 3`: EndpointSlice-to-rule latency on every
    /// node, and requests/s through a ClusterIP against straight to the Pod. Prints one
    /// Markdown table.
    Services(services::ServicesArgs),
    /// NetworkPolicy on `gitplane up --nodes 3`: from a peer Pod's store write to its element
    /// in the policy maps of every node isolating a Pod, p50 / p99, and its removal. Prints
    /// one Markdown table.
    Netpol(netpol::NetpolArgs),
    /// The idle CPU of `gitplane up --nodes 3` with 100 Applications and 300 Pods, per process
    /// kind, with the store's and the log's growth. Prints one Markdown table.
    Idle(idle::IdleArgs),
    /// Pod start on one node: the agent's runtime manager from a bound Pod to Running, against
    /// the same CRI calls made bare, one by one and all at once. Prints Markdown tables.
    Podstart(podstart::PodStartArgs),
    /// Reads of the status API with 150,000 Pods stored: cluster-wide LIST (unpaged, and in
    /// kubectl's pages of 500) and GET of one Pod by 100 concurrent readers. Prints one Markdown
    /// table.
    Api(api::ApiArgs),
    /// The status API's WATCH: 1,000 watches of Pods over HTTP while Pods are created at 100/s,
    /// event delivery p50 / p99 against the store's own watch. Prints one Markdown table.
    ApiWatch(apiwatch::ApiWatchArgs),
    /// The agent's Ingress proxy against Debian's nginx as a reverse proxy to the same upstreams
    /// (requests/s, p50, p99 at 64 connections), and route propagation with 5,000 paths loaded
    /// while a load generator counts errors. Prints Markdown tables.
    Ingress(ingress::IngressArgs),
    /// The agent's Ingress proxy alone in front of the given upstreams, until killed (what
    /// `ingress --baseline` runs for each build it compares).
    #[command(hide = true)]
    IngressServe(ingress::IngressServeArgs),
    /// Ingress route propagation on `gitplane up --nodes N`: from `git push` of an Ingress
    /// change to the new route answering, p50 / p99, with 5,000 paths loaded and a load
    /// generator counting errors throughout. Prints one Markdown table.
    IngressPush(ingresspush::IngressPushArgs),
    /// What encrypting Secrets at rest costs a write: Secret write p50 / p99 on the same SQLite
    /// store with and without keys, and one seal and open alone. Prints one Markdown table.
    Encryption(encryption::EncryptionArgs),
    /// The status page with 1,000 Applications and 10,000 Pods: time to render each view, and
    /// the update latency after a `git push`. Prints one Markdown table.
    Page(page::PageArgs),
    /// The time the push verdict adds to `git push` of a one-file commit in a repository of
    /// 10,000 manifests, against the same pushes without it, in one run. Prints one Markdown
    /// table.
    PushVerdict(source::PushVerdictArgs),
    /// StatefulSet rollout on `gitplane up --nodes 3`: from `git push` to every Pod Ready, with
    /// OrderedReady and Parallel, against a Deployment of as many Pods in the same run. Prints
    /// one Markdown table.
    Statefulset(statefulset::StatefulSetArgs),
    /// Hollow nodes (`gitplane agent --hollow`) beside one `gitplane server`: SchedulingBasic at
    /// 100 and 250 nodes by default (up to as many as `--cluster-cidr` holds), the control
    /// plane's CPU and RSS while the nodes renew their Leases, and a Deployment of 1,000 replicas
    /// from `git push` to Running. Prints one Markdown table.
    Scale(scale::ScaleArgs),
    /// One measurement of `source`, in a process of its own (run by `source`).
    #[command(hide = true)]
    SourceStep(source::StepArgs),
}

#[derive(clap::Args, Clone)]
struct StoreArgs {
    /// Short windows and few rounds: a smoke run, not numbers to quote.
    #[arg(long)]
    quick: bool,
    /// The measurement window of each write row, in seconds (default 10, 2 with --quick).
    #[arg(long)]
    duration: Option<f64>,
    /// The warm-up before each write window, in seconds (default 3, 0.5 with --quick).
    #[arg(long)]
    warmup: Option<f64>,
    /// Run only the rows whose id contains one of these (comma-separated or repeated); see
    /// --list.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Print the row ids and exit.
    #[arg(long)]
    list: bool,
    /// The concurrent clients of each write row (comma-separated). The follower and
    /// all-members rows always use 256.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 16, 256])]
    clients: Vec<usize>,
    /// gRPC connections of the load generator, for every system.
    #[arg(long, default_value_t = 16)]
    connections: usize,
    /// An extra argument for every `gitplane server` (repeat it), e.g.
    /// `--server-arg=--election-timeout-max-ms=500`: to try settings, not for the headline table.
    #[arg(long = "server-arg", allow_hyphen_values = true)]
    server_args: Vec<String>,
    /// The `gitplane` binary (default: next to this one).
    #[arg(long)]
    gitplane: Option<PathBuf>,
    /// Keep the servers' logs in this directory (otherwise they go with the servers' temporary
    /// directories).
    #[arg(long)]
    logs: Option<PathBuf>,
    /// The `etcd` binary.
    #[arg(long, default_value = "/usr/bin/etcd")]
    etcd: PathBuf,
}

/// Every row id, in run order.
const ROWS: &[&str] = &[
    "write/gitplane-sqlite-1",
    "auth/peer-token",
    "write/etcd-1",
    "write/gitplane-postgres-1",
    "write/gitplane-sqlite-3",
    "write/gitplane-sqlite-3-via-follower",
    "write/etcd-3",
    "write/etcd-3-all-members",
    "mix/gitplane-sqlite-3",
    "mix/etcd-3",
    "failover/gitplane-sqlite-3",
    "failover/etcd-3",
    "watch/gitplane-sqlite-1",
    "watch/etcd-1",
    "watch/gitplane-sqlite-3",
    "watch/etcd-3",
];

/// One line of the table.
#[derive(Default)]
struct Row {
    benchmark: &'static str,
    system: String,
    load: String,
    throughput: Option<f64>,
    p50: Option<Duration>,
    p99: Option<Duration>,
    max: Option<Duration>,
    cpu: Option<Duration>,
    baseline: String,
    notes: String,
}

struct Settings {
    args: StoreArgs,
    gitplane: PathBuf,
    warmup: Duration,
    window: Duration,
    failover_rounds: usize,
    watchers: usize,
    watch_rate: u32,
    watch_duration: Duration,
}

impl Settings {
    fn wants(&self, id: &str) -> bool {
        self.args.only.is_empty() || self.args.only.iter().any(|o| id.contains(o.as_str()))
    }
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Command::Store(args) => store_main(args),
        Command::Source(args) => source::main(args),
        Command::SourceStep(args) => source::step(args),
        Command::PushVerdict(args) => source::push_verdict(args),
        Command::Services(args) => services::main(args),
        Command::Netpol(args) => netpol::main(args),
        Command::Idle(args) => idle::main(args),
        Command::Statefulset(args) => statefulset::main(args),
        Command::Scale(args) => scale::main(args),
        Command::Podstart(args) => podstart::main(args),
        Command::Api(args) => api::main(args),
        Command::Page(args) => page::main(args),
        Command::ApiWatch(args) => apiwatch::main(args),
        Command::Encryption(args) => encryption::main(args),
        Command::Ingress(args) => ingress::main(args),
        Command::IngressServe(args) => ingress::serve(args),
        Command::IngressPush(args) => ingresspush::main(args),
    }
}

fn store_main(args: StoreArgs) -> Result<()> {
    if args.list {
        for id in ROWS {
            println!("{id}");
        }
        return Ok(());
    }
    let gitplane = procs::prepare(args.gitplane.as_deref(), args.logs.as_deref())?;
    let settings = Settings {
        gitplane,
        warmup: Duration::from_secs_f64(args.warmup.unwrap_or(if args.quick { 0.5 } else { 3.0 })),
        window: Duration::from_secs_f64(args.duration.unwrap_or(if args.quick { 2.0 } else { 10.0 })),
        failover_rounds: if args.quick { 2 } else { 10 },
        watchers: 100,
        watch_rate: 200,
        watch_duration: Duration::from_secs(if args.quick { 1 } else { 5 }),
        args,
    };
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(async {
        // Dropping the run (Ctrl-C, SIGTERM) drops its process guards: every server started so
        // far is killed and its directory removed.
        let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            result = store(&settings) => result,
            _ = tokio::signal::ctrl_c() => bail!("interrupted"),
            _ = terminate.recv() => bail!("terminated"),
        }
    })
}

async fn store(s: &Settings) -> Result<()> {
    for (what, path) in [("gitplane", &s.gitplane), ("etcd", &s.args.etcd)] {
        if !path.exists() {
            bail!(
                "no {what} binary at {}: build it (cargo build --release --bin gitplane) or pass --{what}",
                path.display()
            );
        }
    }
    let mut rows = Vec::new();
    let mut results = Results::default();
    if s.wants("write/gitplane-sqlite-1") {
        let cluster = Gitplane::start(&s.gitplane, 1, &s.args.server_args).await?;
        let addr = cluster.addrs[&1];
        results.gp1 = write_rows(s, "gitplane, SQLite, 1 replica", Api::Gitplane, &[addr], &cluster.pids()).await?;
    }
    if s.wants("write/etcd-1") {
        let cluster = Etcd::start(&s.args.etcd, 1).await?;
        let addr = cluster.clients[&1];
        results.etcd1 = write_rows(s, "etcd 3.4, 1 member", Api::Etcd, &[addr], &cluster.pids()).await?;
    }
    if s.wants("write/gitplane-postgres-1") {
        results.pg1 = postgres_rows(s).await?;
    }
    let (gp3_leader, gp3_follower) =
        (s.wants("write/gitplane-sqlite-3"), s.wants("write/gitplane-sqlite-3-via-follower"));
    if gp3_leader || gp3_follower {
        let cluster = Gitplane::start(&s.gitplane, 3, &s.args.server_args).await?;
        let leader = cluster.wait_ready_leader().await?;
        if gp3_leader {
            let system = format!("gitplane, SQLite, 3 replicas, to the leader (replica {leader})");
            results.gp3 = write_rows(s, &system, Api::Gitplane, &[cluster.addrs[&leader]], &cluster.pids()).await?;
        }
        if gp3_follower {
            let follower = cluster.ids().into_iter().find(|id| *id != leader).context("no follower")?;
            let system = format!("gitplane, SQLite, 3 replicas, via a follower (replica {follower})");
            let measured =
                measure(s, &system, Api::Gitplane, &[cluster.addrs[&follower]], 256, &cluster.pids()).await?;
            results.gp3_follower = vec![(256, measured)];
        }
    }
    let (etcd3_leader, etcd3_all) = (s.wants("write/etcd-3"), s.wants("write/etcd-3-all-members"));
    if etcd3_leader || etcd3_all {
        let cluster = Etcd::start(&s.args.etcd, 3).await?;
        let leader = cluster.leader().await.context("etcd lost its leader")?;
        if etcd3_leader {
            let system = format!("etcd 3.4, 3 members, to the leader (member {leader})");
            results.etcd3 = write_rows(s, &system, Api::Etcd, &[cluster.clients[&leader]], &cluster.pids()).await?;
        }
        if etcd3_all {
            let addrs: Vec<SocketAddr> = cluster.clients.values().copied().collect();
            let system = "etcd 3.4, 3 members, connections over all members";
            let measured = measure(s, system, Api::Etcd, &addrs, 256, &cluster.pids()).await?;
            results.etcd3_all = vec![(256, measured)];
        }
    }
    if s.wants("mix/gitplane-sqlite-3") {
        let cluster = Gitplane::start(&s.gitplane, 3, &s.args.server_args).await?;
        let leader = cluster.wait_ready_leader().await?;
        let system = format!("gitplane, SQLite, 3 replicas, to the leader (replica {leader})");
        results.gp3_mix =
            mix_rows(s, &system, Api::Gitplane, cluster.addrs[&leader], &cluster.pids(), &mut results.mix_sizes)
                .await?;
    }
    if s.wants("mix/etcd-3") {
        let cluster = Etcd::start(&s.args.etcd, 3).await?;
        let leader = cluster.leader().await.context("etcd lost its leader")?;
        let system = format!("etcd 3.4, 3 members, to the leader (member {leader})");
        results.etcd3_mix =
            mix_rows(s, &system, Api::Etcd, cluster.clients[&leader], &cluster.pids(), &mut results.mix_sizes).await?;
    }
    write_table_rows(&results, &mut rows);
    if s.wants("auth/peer-token") {
        rows.push(auth_row(&results));
    }

    let mut failovers = (None, None);
    if s.wants("failover/gitplane-sqlite-3") {
        eprintln!("failover: gitplane, SQLite, 3 replicas ({} rounds)", s.failover_rounds);
        let mut cluster = Gitplane::start(&s.gitplane, 3, &s.args.server_args).await?;
        failovers.0 = Some(failover::run(&mut cluster, s.failover_rounds, 16, s.args.connections).await?);
    }
    if s.wants("failover/etcd-3") {
        eprintln!("failover: etcd 3.4, 3 members ({} rounds)", s.failover_rounds);
        let mut cluster = Etcd::start(&s.args.etcd, 3).await?;
        failovers.1 = Some(failover::run(&mut cluster, s.failover_rounds, 16, s.args.connections).await?);
    }
    let etcd_failover = failovers.1.as_ref().map(|b| b.failover.quantile(0.5));
    for (system, result, baseline) in [
        ("gitplane, SQLite, 3 replicas", &failovers.0, Some(etcd_failover.flatten())),
        ("etcd 3.4, 3 members", &failovers.1, None),
    ] {
        let Some(r) = result else { continue };
        let p50 = r.failover.quantile(0.5);
        rows.push(Row {
            benchmark: "failover",
            system: system.into(),
            load: format!("16 clients, leader killed {} times", r.failover.len()),
            p50,
            max: r.failover.max(),
            baseline: ratio_text(p50, baseline, "etcd p50"),
            notes: format!(
                "new leader seen p50 {}; restarted member caught up p50 {}",
                ms(r.election.quantile(0.5)),
                ms(r.catch_up.quantile(0.5))
            ),
            ..Row::default()
        });
    }

    let mut watches: Vec<(&str, String, watch::WatchResult)> = Vec::new();
    for (id, replicas) in
        [("watch/gitplane-sqlite-1", 1), ("watch/etcd-1", 1), ("watch/gitplane-sqlite-3", 3), ("watch/etcd-3", 3)]
    {
        if !s.wants(id) {
            continue;
        }
        let api = if id.contains("etcd") { Api::Etcd } else { Api::Gitplane };
        let (result, system) = match api {
            Api::Gitplane => {
                let cluster = Gitplane::start(&s.gitplane, replicas, &s.args.server_args).await?;
                let leader = cluster.wait_ready_leader().await?;
                let on = cluster.ids().into_iter().find(|i| *i != leader).unwrap_or(leader);
                let system = if replicas == 1 {
                    "gitplane, SQLite, 1 replica".to_owned()
                } else {
                    "gitplane, SQLite, 3 replicas, watchers on a follower".to_owned()
                };
                eprintln!("watch: {system}");
                (watch_row(s, api, cluster.addrs[&leader], cluster.addrs[&on]).await?, system)
            }
            Api::Etcd => {
                let cluster = Etcd::start(&s.args.etcd, replicas).await?;
                let leader = cluster.leader().await.context("etcd lost its leader")?;
                let on = cluster.ids().into_iter().find(|i| *i != leader).unwrap_or(leader);
                let system = if replicas == 1 {
                    "etcd 3.4, 1 member".to_owned()
                } else {
                    "etcd 3.4, 3 members, watchers on a follower".to_owned()
                };
                eprintln!("watch: {system}");
                (watch_row(s, api, cluster.clients[&leader], cluster.clients[&on]).await?, system)
            }
        };
        watches.push((id, system, result));
    }
    for (id, system, result) in &watches {
        let baseline_id = if id.ends_with("-1") { "watch/etcd-1" } else { "watch/etcd-3" };
        let baseline = (*id != baseline_id)
            .then(|| watches.iter().find(|(b, ..)| *b == baseline_id).and_then(|(.., r)| r.delivery.quantile(0.99)));
        let p99 = result.delivery.quantile(0.99);
        let missing = result.expected - result.delivery.len() as u64;
        rows.push(Row {
            benchmark: "watch fan-out",
            system: system.clone(),
            load: format!("{} watchers, {} writes/s for {} s", s.watchers, s.watch_rate, s.watch_duration.as_secs()),
            p50: result.delivery.quantile(0.5),
            p99,
            max: result.delivery.max(),
            baseline: ratio_text(p99, baseline, "etcd p99"),
            notes: format!(
                "{} deliveries; the write's commit p50 {} / p99 {} ms; delivery after the write's \
                 acknowledgement p50 {} / p99 {} ms{}{}",
                result.delivery.len(),
                ms(result.commit.quantile(0.5)),
                ms(result.commit.quantile(0.99)),
                ms(result.after_ack.quantile(0.5)),
                ms(result.after_ack.quantile(0.99)),
                if missing > 0 { format!(", {missing} missing") } else { String::new() },
                if result.write_errors > 0 {
                    format!(", {} writes failed", result.write_errors)
                } else {
                    String::new()
                }
            ),
            ..Row::default()
        });
    }

    print_table(s, &rows);
    print_goals(&results, &failovers.0, &watches);
    Ok(())
}

impl Gitplane {
    async fn wait_ready_leader(&self) -> Result<u64> {
        procs::wait_for("a gitplane leader", Duration::from_secs(60), || self.leader()).await
    }
}

#[derive(Default)]
struct Results {
    gp1: Vec<(usize, Measured)>,
    etcd1: Vec<(usize, Measured)>,
    /// `Err` when the Postgres backend could not run: the reason.
    pg1: Option<std::result::Result<Vec<(usize, Measured)>, String>>,
    gp3: Vec<(usize, Measured)>,
    gp3_follower: Vec<(usize, Measured)>,
    etcd3: Vec<(usize, Measured)>,
    etcd3_all: Vec<(usize, Measured)>,
    gp3_mix: Vec<(usize, Measured)>,
    etcd3_mix: Vec<(usize, Measured)>,
    /// The write mix's JSON sizes: a Lease, a Pod Running.
    mix_sizes: (usize, usize),
}

async fn measure(
    s: &Settings,
    system: &str,
    api: Api,
    addrs: &[SocketAddr],
    clients: usize,
    pids: &[u32],
) -> Result<Measured> {
    eprintln!("write: {system}, {clients} client(s) over {} connections", s.args.connections);
    let channels = load::connections(addrs, s.args.connections).await?;
    // Names never repeat within a run, whichever rows share a cluster.
    static MEASUREMENTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = MEASUREMENTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let prefix = format!("m{n}-c{clients}");
    let writers = load::creates(api, &channels, clients, &prefix);
    let (m, _) = load::closed_loop(writers, s.warmup, s.window, pids).await?;
    report(&m);
    Ok(m)
}

fn report(m: &Measured) {
    eprintln!(
        "  {:.0} writes/s, p50 {} ms, p99 {} ms, {} errors{}; CPU per write: servers {} µs, load generator {} µs",
        m.writes_per_second,
        ms(m.latencies.quantile(0.5)),
        ms(m.latencies.quantile(0.99)),
        m.errors,
        m.first_error.as_deref().map(|e| format!(" (first: {e})")).unwrap_or_default(),
        us(m.server_cpu_per_write),
        us(m.client_cpu_per_write),
    );
}

/// The write mix (`write_mix`) on one system: its objects created once, then each client count.
async fn mix_rows(
    s: &Settings,
    system: &str,
    api: Api,
    addr: SocketAddr,
    pids: &[u32],
    sizes: &mut (usize, usize),
) -> Result<Vec<(usize, Measured)>> {
    let channels = load::connections(&[addr], s.args.connections).await?;
    eprintln!("write mix: {system}: creating {} Leases and {} Pods", write_mix::LEASES, write_mix::PODS);
    let mut objects = write_mix::create(&mut load::Writer::new(api, channels[0].clone())).await?;
    *sizes = objects.sizes();
    let mut out = Vec::new();
    for clients in s.args.clients.iter().copied() {
        eprintln!("write mix: {system}, {clients} client(s) over {} connections", s.args.connections);
        let writers = write_mix::clients(|c| load::Writer::new(api, c), &channels, clients, objects);
        let (m, writers) = load::closed_loop(writers, s.warmup, s.window, pids).await?;
        report(&m);
        objects = write_mix::objects(writers);
        out.push((clients, m));
    }
    Ok(out)
}

async fn write_rows(
    s: &Settings,
    system: &str,
    api: Api,
    addrs: &[SocketAddr],
    pids: &[u32],
) -> Result<Vec<(usize, Measured)>> {
    let mut out = Vec::new();
    for clients in s.args.clients.iter().copied() {
        out.push((clients, measure(s, system, api, addrs, clients, pids).await?));
    }
    Ok(out)
}

/// The Postgres backend, once `gitplane server` has it: a private PostgreSQL server, one replica
/// on it. `Err(reason)` when it cannot run here.
async fn postgres_rows(s: &Settings) -> Result<Option<std::result::Result<Vec<(usize, Measured)>, String>>> {
    let help = std::process::Command::new(&s.gitplane)
        .args(["server", "--help"])
        .output()
        .with_context(|| format!("running {} server --help", s.gitplane.display()))?;
    let help = String::from_utf8_lossy(&help.stdout);
    if !(help.contains("--store") && help.contains("--postgres-url")) {
        let reason = "`gitplane server` has no --store/--postgres-url flags yet".to_owned();
        eprintln!("write: gitplane, Postgres: not run: {reason}");
        return Ok(Some(Err(reason)));
    }
    let postgres = match Postgres::start().await {
        Ok(p) => p,
        Err(e) => {
            eprintln!("write: gitplane, Postgres: not run: {e:#}");
            return Ok(Some(Err(format!("PostgreSQL did not start: {e}"))));
        }
    };
    let mut args = vec!["--store".to_owned(), "postgres".to_owned(), "--postgres-url".to_owned(), postgres.url.clone()];
    args.extend(s.args.server_args.iter().cloned());
    let cluster = Gitplane::start(&s.gitplane, 1, &args).await?;
    // The server CPU includes PostgreSQL's (its backends are the postmaster's children).
    let mut pids = cluster.pids();
    pids.extend(postgres.pids());
    let rows = write_rows(s, "gitplane, Postgres, 1 replica", Api::Gitplane, &[cluster.addrs[&1]], &pids).await?;
    drop(cluster);
    drop(postgres);
    Ok(Some(Ok(rows)))
}

async fn watch_row(s: &Settings, api: Api, write_to: SocketAddr, watch_on: SocketAddr) -> Result<watch::WatchResult> {
    let r = watch::run(api, write_to, watch_on, s.watchers, s.args.connections, s.watch_rate, s.watch_duration).await?;
    eprintln!(
        "  {} of {} deliveries, p50 {} ms, p99 {} ms, max {} ms",
        r.delivery.len(),
        r.expected,
        ms(r.delivery.quantile(0.5)),
        ms(r.delivery.quantile(0.99)),
        ms(r.delivery.max())
    );
    Ok(r)
}

/// What authentication costs per write, beside the server's CPU per write on one replica at the
/// most clients measured in this run.
fn auth_row(r: &Results) -> Row {
    let (client, server) = auth::cost();
    eprintln!("auth: peer token per request: client {client:?}, server {server:?}");
    let per_write =
        r.gp1.iter().max_by_key(|(clients, _)| *clients).and_then(|(c, m)| Some((*c, m.server_cpu_per_write?)));
    let baseline = match per_write {
        Some((clients, cpu)) if !cpu.is_zero() => format!(
            "{:.2}% of gitplane-1's server CPU per write at {clients} clients ({} µs)",
            100.0 * (client + server).as_secs_f64() / cpu.as_secs_f64(),
            us(Some(cpu))
        ),
        _ => "– (run write/gitplane-sqlite-1 for the ratio)".to_owned(),
    };
    Row {
        benchmark: "auth",
        system: "peer token: client header + server check".into(),
        load: "per request".into(),
        cpu: Some(client + server),
        baseline,
        notes: format!("client {} ns, server {} ns", client.as_nanos(), server.as_nanos()),
        ..Row::default()
    }
}

/// The row of one closed-loop load, with its `baseline` and `notes` as the caller words them.
fn measured_row(
    benchmark: &'static str,
    system: &str,
    clients: usize,
    m: &Measured,
    baseline: String,
    notes: String,
) -> Row {
    Row {
        benchmark,
        system: system.to_owned(),
        load: format!("{clients} client{}", if clients == 1 { "" } else { "s" }),
        throughput: Some(m.writes_per_second),
        p50: m.latencies.quantile(0.5),
        p99: m.latencies.quantile(0.99),
        max: m.latencies.max(),
        cpu: m.server_cpu_per_write,
        baseline,
        notes,
    }
}

/// How many writes failed, and the first one's error.
fn errors(m: &Measured) -> Option<String> {
    (m.errors > 0).then(|| format!("{} errors (first: {})", m.errors, m.first_error.as_deref().unwrap_or("")))
}

fn write_table_rows(r: &Results, rows: &mut Vec<Row>) {
    let rate_at = |set: &[(usize, Measured)], clients: usize| {
        set.iter().find(|(c, _)| *c == clients).map(|(_, m)| m.writes_per_second)
    };
    let mut push = |system: &str, set: &[(usize, Measured)], baseline: Option<(&[(usize, Measured)], &str)>| {
        for (clients, m) in set {
            let base = baseline.and_then(|(b, name)| Some((rate_at(b, *clients)?, name)));
            let baseline = match (baseline, base) {
                (None, _) => "baseline".to_owned(),
                (Some(_), Some((b, name))) if b > 0.0 => format!("{:.2}× {name}", m.writes_per_second / b),
                (Some(_), _) => "–".to_owned(),
            };
            rows.push(measured_row("writes", system, *clients, m, baseline, errors(m).unwrap_or_default()));
        }
    };
    push("gitplane, SQLite, 1 replica", &r.gp1, Some((&r.etcd1, "etcd-1")));
    if let Some(Ok(pg)) = &r.pg1 {
        push("gitplane, Postgres, 1 replica", pg, Some((&r.etcd1, "etcd-1")));
    }
    push("etcd 3.4, 1 member", &r.etcd1, None);
    push("gitplane, SQLite, 3 replicas, to the leader", &r.gp3, Some((&r.etcd3, "etcd-3")));
    push("gitplane, SQLite, 3 replicas, via a follower", &r.gp3_follower, Some((&r.etcd3, "etcd-3")));
    push("etcd 3.4, 3 members, to the leader", &r.etcd3, None);
    push("etcd 3.4, 3 members, over all members", &r.etcd3_all, Some((&r.etcd3, "etcd-3")));
    let (lease, pod) = r.mix_sizes;
    let notes = format!(
        "Lease renewals : binds : Pod status updates = 1 : 6 : 6, compare-and-swap; {} Leases ({lease} bytes), {} Pods ({pod} bytes Running)",
        write_mix::LEASES,
        write_mix::PODS
    );
    for (system, set, baseline) in [
        ("gitplane, SQLite, 3 replicas, to the leader", &r.gp3_mix, Some(&r.etcd3_mix)),
        ("etcd 3.4, 3 members, to the leader", &r.etcd3_mix, None),
    ] {
        for (clients, m) in set {
            let base = baseline.and_then(|b| b.iter().find(|(c, _)| c == clients)?.1.server_cpu_per_write);
            let baseline = match (baseline, base, m.server_cpu_per_write) {
                (None, ..) => "baseline".to_owned(),
                (Some(_), Some(b), Some(cpu)) if !b.is_zero() => {
                    format!("{:.2}× etcd-3 CPU/write", cpu.as_secs_f64() / b.as_secs_f64())
                }
                _ => "–".to_owned(),
            };
            let notes = errors(m).map_or_else(|| notes.clone(), |errors| format!("{notes}; {errors}"));
            rows.push(measured_row("write mix", system, *clients, m, baseline, notes));
        }
    }
    if let Some(Err(reason)) = &r.pg1 {
        rows.push(Row {
            benchmark: "writes",
            system: "gitplane, Postgres, 1 replica".into(),
            notes: format!("not run: {reason}"),
            ..Row::default()
        });
    }
}

fn ms(d: Option<Duration>) -> String {
    match d {
        None => "–".into(),
        Some(d) if d < Duration::from_millis(10) => format!("{:.2}", d.as_secs_f64() * 1e3),
        Some(d) => format!("{:.1}", d.as_secs_f64() * 1e3),
    }
}

fn us(d: Option<Duration>) -> String {
    d.map_or("–".into(), |d| format!("{:.0}", d.as_secs_f64() * 1e6))
}

/// "0.42× etcd p50": ours over the baseline (for times, below 1 is better). `baseline` is `None`
/// for the baseline's own row, `Some(None)` when the baseline was not measured.
fn ratio_text(ours: Option<Duration>, baseline: Option<Option<Duration>>, name: &str) -> String {
    match (ours, baseline) {
        (_, None) => "baseline".into(),
        (Some(o), Some(Some(b))) if !b.is_zero() => format!("{:.2}× {name}", o.as_secs_f64() / b.as_secs_f64()),
        _ => "–".into(),
    }
}

fn print_table(s: &Settings, rows: &[Row]) {
    println!(
        "Loopback, {} CPUs; load generator: {} gRPC connections per system, 1 KiB ConfigMaps to distinct keys; \
         write windows {} s after {} s warm-up.\n",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        s.args.connections,
        s.window.as_secs_f64(),
        s.warmup.as_secs_f64(),
    );
    println!(
        "| Benchmark | System | Load | Writes/s | p50 ms | p99 ms | max ms | Server CPU µs/write | vs baseline | Notes |"
    );
    println!("|---|---|---|--:|--:|--:|--:|--:|---|---|");
    for r in rows {
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.benchmark,
            r.system,
            r.load,
            r.throughput.map_or("–".into(), |t| format!("{t:.0}")),
            ms(r.p50),
            ms(r.p99),
            ms(r.max),
            us(r.cpu),
            r.baseline,
            r.notes.replace('|', "\\|"),
        );
    }
}

fn print_goals(
    r: &Results,
    failover: &Option<failover::FailoverResult>,
    watches: &[(&str, String, watch::WatchResult)],
) {
    let at = |set: &[(usize, Measured)], c: usize| set.iter().find(|(n, _)| *n == c).map(|(_, m)| m.writes_per_second);
    let verdict = |met: bool| if met { "met" } else { "NOT met" };
    println!();
    if let (Some(gp), Some(etcd)) = (at(&r.gp3, 256), at(&r.etcd3, 256)) {
        let ratio = gp / etcd;
        println!(
            "- Writes, 3 replicas, 256 clients, to the leader: gitplane / etcd = {ratio:.2}× (goal ≥ 2×: {})",
            verdict(ratio >= 2.0)
        );
    }
    let cpu_at = |set: &[(usize, Measured)]| {
        set.iter().max_by_key(|(c, _)| *c).and_then(|(c, m)| Some((*c, m.server_cpu_per_write?)))
    };
    if let (Some((clients, gp)), Some((_, etcd))) = (cpu_at(&r.gp3_mix), cpu_at(&r.etcd3_mix))
        && !etcd.is_zero()
    {
        let ratio = gp.as_secs_f64() / etcd.as_secs_f64();
        println!(
            "- Write mix, 3 replicas, {clients} clients, to the leader: server CPU per write gitplane / etcd = {ratio:.2}× ({} / {} µs; goal ≤ 1.0×: {})",
            us(Some(gp)),
            us(Some(etcd)),
            verdict(ratio <= 1.0)
        );
    }
    if let Some(f) = failover
        && let Some(p50) = f.failover.quantile(0.5)
    {
        println!(
            "- Failover, kill -9 of the leader: p50 {:.0} ms, max {} ms (goal p50 < 1500 ms: {})",
            p50.as_secs_f64() * 1e3,
            ms(f.failover.max()),
            verdict(p50 < Duration::from_millis(1500))
        );
    }
    for (id, system, w) in watches {
        if id.contains("gitplane")
            && let Some(p99) = w.delivery.quantile(0.99)
        {
            let complete = w.delivery.len() as u64 == w.expected;
            println!(
                "- Watch fan-out, {system}: p99 {} ms{} (goal p99 < 10 ms: {})",
                ms(Some(p99)),
                if complete { "" } else { ", with deliveries missing" },
                verdict(p99 < Duration::from_millis(10) && complete)
            );
        }
    }
}
