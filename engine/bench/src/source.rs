//! The GitOps source: render + validate + diff of a generated repository of many manifests,
//! next to the bare YAML parse of the same bytes (the floor) and `kubectl kustomize` over the
//! same files (a reference), then push-to-applied for one-file commits through a real
//! `gitplane server`.
//!
//! Each offline measurement runs in a child process of its own (`gitplane-bench source-step`),
//! so its peak RSS (from `wait4`) is its own and no run warms another's allocator.

use crate::{
    load::Latencies,
    procs::{self, Gitplane},
};
use anyhow::{Context as _, Result, bail, ensure};
use futures::StreamExt as _;
use gitplane_gitops::source::{
    allocate::ServiceRanges,
    apply::{self, Cluster, Inventory, Policy},
};
use gitplane_source::{AppSource, Limits, LoadError, Manifest, SourceCache, Validator, load_commit, read_head};
use gitplane_storage::remote::pb;
use gitplane_store::{ObjectKey, Op};
use serde::Deserialize as _;
use serde_json::{Value, json};
use std::{
    collections::{BTreeMap, HashSet},
    fmt::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

/// Where the plain manifests are in the generated repository; `templated/` holds the same with
/// the ConfigMaps as templates.
const PLAIN: &str = "manifests";
const TEMPLATED: &str = "templated";
/// The branch that differs from `main` in one ConfigMap.
const ONE_FILE: &str = "one-file";
/// The ConfigMap the one-file commits change.
const CHANGED: &str = "manifests/team-00/app-0000-configmap.yaml";
const APP: &str = "gitplane-system/bench";
/// Runs of each offline step; the median is reported.
const RUNS: usize = 3;
/// The pause before each timed push.
const PUSH_INTERVAL: Duration = Duration::from_millis(500);

#[derive(clap::Args, Clone)]
pub struct SourceArgs {
    /// Manifests in the generated repository: a quarter each of Deployments, Services,
    /// ConfigMaps and Secrets, one per file.
    #[arg(long, default_value_t = 10_000)]
    manifests: usize,
    /// One-file commits timed in process and pushed to the server.
    #[arg(long, default_value_t = 100)]
    rounds: usize,
    /// Skip `kubectl kustomize` (minutes for 10,000 resources).
    #[arg(long)]
    skip_kustomize: bool,
    /// Only push-to-applied (no offline rows, no kustomize): to iterate on the server's part.
    #[arg(long)]
    push_only: bool,
    /// Only the first sync and the controllers' settling after it (no offline rows, no pushes).
    #[arg(long)]
    settle_only: bool,
    /// Hollow Nodes registered before the first sync (Ready, with room for every Pod, a Lease
    /// that the server's grace period outlasts, no agent): the scheduler binds the Pods instead
    /// of marking them unschedulable.
    #[arg(long, default_value_t = 0)]
    nodes: usize,
    #[arg(long, default_value = "/usr/bin/kubectl")]
    kubectl: PathBuf,
    /// The `gitplane` binary (default: next to this one).
    #[arg(long)]
    gitplane: Option<PathBuf>,
    /// Keep the server's log in this directory.
    #[arg(long)]
    logs: Option<PathBuf>,
    /// Generate the repository here (a new directory, kept afterwards: to profile a step with
    /// `gitplane-bench source-step --repo DIR`) instead of in a temporary directory.
    #[arg(long)]
    dir: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct StepArgs {
    #[arg(long, value_enum)]
    step: Step,
    /// The generated repository (a work tree: its files and its `.git`).
    #[arg(long)]
    repo: PathBuf,
    #[arg(long, default_value_t = 100)]
    rounds: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Step {
    /// serde_yaml into JSON values, every document of every file: the floor.
    Parse,
    /// Read from Git, render, parse, validate; cold.
    Load,
    /// Load, then the three-way diff of every object against the applied state; cold.
    Diff,
    /// As `diff`, with the ConfigMaps as templates.
    Templates,
    /// One-file commits against a warm cache, as the server syncs them.
    OneFile,
}

/// What a step prints, as one JSON line.
#[derive(serde::Serialize, serde::Deserialize, Default)]
struct StepResult {
    seconds: f64,
    /// CPU time (user + system, all threads) of the timed part.
    #[serde(default)]
    cpu_seconds: f64,
    objects: usize,
    /// RSS when the timed part started (the diff steps hold the stored objects by then).
    rss_before_kib: u64,
    #[serde(default)]
    samples_ms: Vec<f64>,
}

pub fn main(args: SourceArgs) -> Result<()> {
    let gitplane = procs::prepare(args.gitplane.as_deref(), args.logs.as_deref())?;
    let dir = tempfile::Builder::new().prefix("gitplane-bench-source-").tempdir()?;
    let repo = args.dir.clone().unwrap_or_else(|| dir.path().join("repo"));
    if repo.exists() {
        bail!("{} exists: --dir takes a new directory", repo.display());
    }
    eprintln!("generating {} manifests in {}", args.manifests, repo.display());
    let bytes = generate(&repo, args.manifests)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    if args.settle_only {
        let load_before = crate::up::load_average();
        let Served { first_sync, settled, .. } = runtime.block_on(serve(&gitplane, &repo, args.nodes))?;
        println!("{}", settle_header());
        println!("{}", settle_row(args.manifests, args.nodes, first_sync, &settled, &load_before));
        return Ok(());
    }
    let mut rows = Vec::new();
    let steps = if args.push_only {
        &[][..]
    } else {
        &[
            (Step::Parse, "bare YAML parse (serde_yaml → JSON), the floor"),
            (Step::Load, "gitplane: read from Git + render + validate, cold"),
            (Step::Diff, "gitplane: read + render + validate + three-way diff against the applied state, cold"),
            (Step::Templates, "the same, with the 2,500 ConfigMaps as templates"),
        ][..]
    };
    for &(step, name) in steps {
        eprintln!("{name} ({RUNS} runs)");
        // The median run by time (runs on a shared 2-vCPU machine vary by ±20%), with the
        // highest peak RSS of all runs.
        let mut runs = (0..RUNS).map(|_| run_step(step, &repo, args.rounds)).collect::<Result<Vec<_>>>()?;
        let peak = runs.iter().map(|(_, peak)| *peak).max().unwrap_or(0);
        runs.sort_by(|a, b| a.0.seconds.total_cmp(&b.0.seconds));
        let (result, _) = runs.swap_remove(RUNS / 2);
        rows.push((name.to_owned(), result, peak));
    }
    let one_file = if args.push_only {
        None
    } else {
        eprintln!("one-file commits, in process");
        Some(run_step(Step::OneFile, &repo, args.rounds)?)
    };
    let kustomize = if args.skip_kustomize || args.push_only {
        None
    } else {
        eprintln!("kubectl kustomize (minutes)");
        Some(kustomize(&args.kubectl, &repo)?)
    };
    eprintln!("push-to-applied through gitplane server");
    let load_before = crate::up::load_average();
    let pushed = runtime.block_on(push_to_applied(&gitplane, &repo, args.rounds, args.nodes))?;
    let judged = Latencies::new(pushed.judged.applied.clone());
    let unjudged = Latencies::new(pushed.unjudged.applied.clone());

    println!(
        "{} manifests ({} Deployments, Services, ConfigMaps and Secrets each), one per file, {:.1} MiB of YAML; \
         {} CPUs.\n",
        args.manifests,
        args.manifests / 4,
        bytes as f64 / (1 << 20) as f64,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    println!(
        "| Benchmark | Objects | Time (median of {RUNS} runs) | vs bare parse | CPU time | CPU vs bare parse | \
         Peak RSS MiB | Notes |"
    );
    println!("|---|--:|--:|--:|--:|--:|--:|---|");
    let floor = rows.first().map_or(0.0, |(_, r, _)| r.seconds);
    let cpu_floor = rows.first().map_or(0.0, |(_, r, _)| r.cpu_seconds);
    for (name, r, peak) in &rows {
        let notes = if r.rss_before_kib > 0 && name.contains("diff") {
            format!("{} MiB of it held before the timed part (the stored objects)", r.rss_before_kib / 1024)
        } else {
            String::new()
        };
        println!(
            "| {name} | {} | {:.0} ms | {:.2}× | {:.0} ms | {:.2}× | {} | {notes} |",
            r.objects,
            r.seconds * 1e3,
            r.seconds / floor,
            r.cpu_seconds * 1e3,
            r.cpu_seconds / cpu_floor,
            peak / 1024
        );
    }
    if let Some((seconds, cpu_seconds, objects, peak)) = kustomize {
        println!(
            "| `kubectl kustomize` over the same files, the reference | {objects} | {:.1} s | {:.0}× | {:.1} s | \
             {:.0}× | {} | one run |",
            seconds,
            seconds / floor,
            cpu_seconds,
            cpu_seconds / cpu_floor,
            peak / 1024
        );
    }
    if let Some((one_file, _)) = one_file {
        let in_process =
            Latencies::new(one_file.samples_ms.iter().map(|ms| Duration::from_secs_f64(ms / 1e3)).collect());
        println!(
            "| one-file commit, in process: read head + load (warm cache) + diff | {} | p50 {} ms, p99 {} ms | | | | | \
             {} commits, alternating two branch heads |",
            one_file.objects,
            crate::ms(in_process.quantile(0.5)),
            crate::ms(in_process.quantile(0.99)),
            in_process.len(),
        );
    }
    println!(
        "| push-to-applied, one-file commit, `gitplane server` (1 replica, SQLite), verdict on | {} | p50 {} ms, \
         p99 {} ms, max {} ms | | | | | {} pushes over HTTP, 0.5 s apart, alternating with as many with the verdict \
         off (p50 {} ms, p99 {} ms, max {} ms); from `git push` starting to the watch event of the changed \
         ConfigMap; first sync of the whole repository {:.1} s, then {:.0} s until the controllers had made its \
         ReplicaSets and Pods |",
        args.manifests,
        crate::ms(judged.quantile(0.5)),
        crate::ms(judged.quantile(0.99)),
        crate::ms(judged.max()),
        judged.len(),
        crate::ms(unjudged.quantile(0.5)),
        crate::ms(unjudged.quantile(0.99)),
        crate::ms(unjudged.max()),
        pushed.first_sync.as_secs_f64(),
        pushed.settled.took.as_secs_f64(),
    );
    println!("\n{}", settle_header());
    println!("{}", settle_row(args.manifests, args.nodes, pushed.first_sync, &pushed.settled, &load_before));
    println!();
    print_pushes(&pushed, args.manifests);
    Ok(())
}

fn settle_header() -> String {
    "| First sync, then settling | Nodes | First sync | Settled after it | Revisions while settling | Writes/s \
     | Load average before |\n|---|--:|--:|--:|--:|--:|---|"
        .to_owned()
}

fn settle_row(manifests: usize, nodes: usize, first_sync: Duration, settled: &Settled, load: &str) -> String {
    format!(
        "| {manifests} manifests, `gitplane server` (1 replica, SQLite) | {nodes} | {:.1} s | {:.1} s | {} | {:.0} | {load} |",
        first_sync.as_secs_f64(),
        settled.took.as_secs_f64(),
        settled.revisions,
        settled.revisions as f64 / settled.took.as_secs_f64().max(1e-3),
    )
}

/// The push-to-applied table: with the verdict and without, and where `git push`'s time went.
fn print_pushes(pushed: &Pushed, manifests: usize) {
    println!(
        "Push-to-applied of a one-file commit ({manifests} manifests), {} pushes with the verdict and {} without, \
         alternating, 0.5 s apart; load average {} before, {} after.\n",
        pushed.judged.applied.len(),
        pushed.unjudged.applied.len(),
        pushed.load.0,
        pushed.load.1
    );
    println!("| | verdict on p50 | p99 | max | verdict off p50 | p99 | max |");
    println!("|---|--:|--:|--:|--:|--:|--:|");
    let row = |name: &str, on: Option<&Vec<Duration>>, off: Option<&Vec<Duration>>| {
        let cells = |samples: Option<&Vec<Duration>>| match samples {
            Some(samples) => {
                let l = Latencies::new(samples.clone());
                format!(
                    "{} ms | {} ms | {} ms",
                    crate::ms(l.quantile(0.5)),
                    crate::ms(l.quantile(0.99)),
                    crate::ms(l.max())
                )
            }
            None => "– | – | –".to_owned(),
        };
        println!("| {name} | {} | {} |", cells(on), cells(off));
    };
    let (on, off) = (&pushed.judged, &pushed.unjudged);
    row("**push-to-applied**", Some(&on.applied), Some(&off.applied));
    row("`git push`", Some(&on.push), Some(&off.push));
    row("after `git push` returned, until applied", Some(&on.after_push), Some(&off.after_push));
    for part in PARTS {
        row(&format!("`git push` part: {part}"), on.parts.get(part), off.parts.get(part));
        if part == "POST git-receive-pack" {
            let verdicts = pushed.verdicts.samples().to_vec();
            row("&nbsp;&nbsp;of which the verdict in the server (its log's `elapsed`)", Some(&verdicts), None);
            let hook = pushed.hook.samples().to_vec();
            row("&nbsp;&nbsp;of which the hook's process (measured alone, no server)", Some(&hook), None);
        }
    }
    println!(
        "\nSyncs of judged pushes that committed the verdict's plan: {} of {}.",
        pushed.verdict_plans.0, pushed.verdict_plans.1
    );
}

/// Runs one step in a child process: its result and its peak RSS in KiB.
fn run_step(step: Step, repo: &Path, rounds: usize) -> Result<(StepResult, u64)> {
    let step_name = clap::ValueEnum::to_possible_value(&step).context("every step has a name")?.get_name().to_owned();
    let mut command = Command::new(std::env::current_exe()?);
    command.args(["source-step", "--step", &step_name, "--rounds", &rounds.to_string(), "--repo"]).arg(repo);
    let (status, stdout, _, peak) = run_measured(command)?;
    ensure!(status == 0, "source-step {step_name} failed (exit {status})");
    let result: StepResult = serde_json::from_slice(&stdout).context("source-step output")?;
    Ok((result, peak))
}

/// Runs `command` to the end: its exit code, its stdout, its CPU seconds and its peak RSS in KiB
/// (`wait4`).
fn run_measured(mut command: Command) -> Result<(i32, Vec<u8>, f64, u64)> {
    let out = tempfile::tempfile()?;
    command.stdin(Stdio::null()).stdout(out.try_clone()?).stderr(Stdio::inherit());
    let child = command.spawn().context("starting a step")?;
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid, and wait4 reaps only our own child, by its PID.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = unsafe { libc::wait4(child.id() as libc::pid_t, &mut status, 0, &mut usage) };
    ensure!(pid > 0, "waiting for a step: {}", std::io::Error::last_os_error());
    let code = if libc::WIFEXITED(status) { libc::WEXITSTATUS(status) } else { -1 };
    let mut out = out;
    let mut stdout = Vec::new();
    use std::io::{Read as _, Seek as _};
    out.rewind()?;
    out.read_to_end(&mut stdout)?;
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Ok((code, stdout, seconds(usage.ru_utime) + seconds(usage.ru_stime), usage.ru_maxrss as u64))
}

/// `kubectl kustomize` over the generated files: seconds, CPU seconds, objects printed, peak RSS
/// in KiB.
fn kustomize(kubectl: &Path, repo: &Path) -> Result<(f64, f64, usize, u64)> {
    let mut command = Command::new(kubectl);
    command.arg("kustomize").arg(repo);
    let started = Instant::now();
    let (status, stdout, cpu_seconds, peak) = run_measured(command)?;
    let seconds = started.elapsed().as_secs_f64();
    ensure!(status == 0, "kubectl kustomize failed (exit {status})");
    let objects = String::from_utf8_lossy(&stdout).lines().filter(|l| l.starts_with("kind: ")).count();
    Ok((seconds, cpu_seconds, objects, peak))
}

/// `gitplane-bench source-step`: one measurement, its result on stdout as JSON.
pub fn step(args: StepArgs) -> Result<()> {
    let result = match args.step {
        Step::Parse => parse_floor(&args.repo.join(PLAIN))?,
        Step::Load => {
            let validator = Validator::new();
            let head = read_head(&args.repo, "main")?;
            let rss_before_kib = rss_kib();
            let (started, cpu) = (Instant::now(), cpu_seconds());
            let manifests = load(&head, &app_source(PLAIN), &validator, &mut SourceCache::new())?;
            StepResult {
                seconds: started.elapsed().as_secs_f64(),
                cpu_seconds: cpu_seconds() - cpu,
                objects: manifests.len(),
                rss_before_kib,
                ..Default::default()
            }
        }
        Step::Diff | Step::Templates => {
            let path = if args.step == Step::Diff { PLAIN } else { TEMPLATED };
            let mut state = State::applied(&args.repo, path)?;
            let rss_before_kib = rss_kib();
            let (started, cpu) = (Instant::now(), cpu_seconds());
            // Cold: no cache, and no inventory, so every object is compared.
            let mut cache = SourceCache::new();
            state.inventory = Inventory::default();
            let head = read_head(&args.repo, "main")?;
            let manifests = load(&head, &state.app, &state.validator, &mut cache)?;
            let plan = state.plan(&manifests)?;
            let (seconds, cpu_seconds) = (started.elapsed().as_secs_f64(), cpu_seconds() - cpu);
            ensure!(plan.ops.is_empty() && plan.unchanged() == manifests.len(), "the diff found changes");
            StepResult { seconds, cpu_seconds, objects: manifests.len(), rss_before_kib, ..Default::default() }
        }
        Step::OneFile => {
            let mut state = State::applied(&args.repo, PLAIN)?;
            let rss_before_kib = rss_kib();
            let mut samples_ms = Vec::new();
            let mut objects = 0;
            for round in 0..args.rounds {
                let branch = if round % 2 == 0 { ONE_FILE } else { "main" };
                let started = Instant::now();
                let head = read_head(&args.repo, branch)?;
                let manifests = load(&head, &state.app, &state.validator, &mut state.cache)?;
                let plan = state.plan(&manifests)?;
                ensure!(plan.ops.len() == 1, "a one-file commit planned {} ops", plan.ops.len());
                state.commit(plan);
                samples_ms.push(started.elapsed().as_secs_f64() * 1e3);
                objects = manifests.len();
            }
            StepResult { objects, rss_before_kib, samples_ms, ..Default::default() }
        }
    };
    println!("{}", serde_json::to_string(&result)?);
    Ok(())
}

/// The floor: every document of every file under `dir` parsed by serde_yaml into JSON, the
/// bytes read before the clock starts.
fn parse_floor(dir: &Path) -> Result<StepResult> {
    let mut paths = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.is_dir() { stack.push(path) } else { paths.push(path) }
        }
    }
    paths.sort();
    let contents: Vec<Vec<u8>> = paths.iter().map(std::fs::read).collect::<std::io::Result<_>>()?;
    let rss_before_kib = rss_kib();
    let (started, cpu) = (Instant::now(), cpu_seconds());
    let mut values = Vec::with_capacity(contents.len());
    for content in &contents {
        for document in serde_yaml::Deserializer::from_slice(content) {
            values.push(Value::deserialize(document)?);
        }
    }
    let (seconds, cpu_seconds) = (started.elapsed().as_secs_f64(), cpu_seconds() - cpu);
    let objects = std::hint::black_box(values).len();
    Ok(StepResult { seconds, cpu_seconds, objects, rss_before_kib, ..Default::default() })
}

fn app_source(path: &str) -> AppSource {
    let values = [("mode".to_owned(), json!("production")), ("replicas".to_owned(), json!(2))];
    AppSource { path: path.into(), default_namespace: "default".into(), values: values.into(), ..AppSource::default() }
}

fn load(
    head: &gitplane_source::Head,
    app: &AppSource,
    validator: &Validator,
    cache: &mut SourceCache,
) -> Result<Vec<Arc<Manifest>>> {
    load_commit(head, app, validator, &Limits::default(), cache).map_err(|e| match e {
        LoadError::Invalid(errors) => {
            let first: Vec<String> = errors.iter().take(3).map(ToString::to_string).collect();
            anyhow::anyhow!("{} error(s) in the generated manifests: {}", errors.len(), first.join("; "))
        }
        LoadError::Source(e) => e.into(),
    })
}

/// What the source controller holds for one Application, without the server around it: the
/// stored objects (as its informer would), what it applied last, its cache.
struct State {
    app: AppSource,
    validator: Validator,
    cache: SourceCache,
    stored: BTreeMap<ObjectKey, Arc<Value>>,
    inventory: Inventory,
    namespaces: HashSet<String>,
    nodes: HashSet<String>,
    revision: i64,
    record_key: apply::RecordKey,
    service_ranges: ServiceRanges,
}

impl State {
    /// After a first sync of `path` at `main` into an empty store.
    fn applied(repo: &Path, path: &str) -> Result<State> {
        let mut state = State {
            app: app_source(path),
            validator: Validator::new(),
            cache: SourceCache::new(),
            stored: BTreeMap::new(),
            inventory: Inventory::default(),
            namespaces: HashSet::from(["default".to_owned()]),
            nodes: HashSet::new(),
            revision: 0,
            record_key: apply::RecordKey::new([7; 32]),
            service_ranges: ServiceRanges::default(),
        };
        let head = read_head(repo, "main")?;
        let manifests = load(&head, &state.app, &state.validator, &mut state.cache)?;
        let plan = state.plan(&manifests)?;
        ensure!(plan.created == manifests.len(), "the first sync created {} objects", plan.created);
        state.commit(plan);
        Ok(state)
    }

    fn plan(&self, manifests: &[Arc<Manifest>]) -> Result<apply::Plan> {
        let cluster = Cluster {
            stored: &self.stored,
            inventory: &self.inventory,
            namespaces: &self.namespaces,
            nodes: &self.nodes,
            service_ranges: &self.service_ranges,
        };
        let policy = Policy { app: APP, prune: true, allow_empty: false, record_key: &self.record_key };
        apply::plan(manifests, &cluster, &policy)
            .map_err(|errors| anyhow::anyhow!("{} plan error(s), the first: {}", errors.len(), errors[0]))
    }

    /// What the store and the controller do with a plan: each written object gets the next
    /// revision (and server fields when new), pruned ones go, and the inventory follows.
    fn commit(&mut self, mut plan: apply::Plan) {
        let mut committed = Vec::new();
        for op in std::mem::take(&mut plan.ops) {
            let mut object = match op {
                Op::Create(object) | Op::Update(object) => object,
                Op::Delete { key, .. } => {
                    self.stored.remove(&key);
                    continue;
                }
                _ => continue,
            };
            self.revision += 1;
            let meta = &mut object["metadata"];
            meta["resourceVersion"] = json!(self.revision.to_string());
            if meta["uid"].is_null() {
                meta["uid"] = json!(format!("00000000-0000-4000-8000-{:012}", self.revision));
                meta["creationTimestamp"] = json!("2026-12-02T00:00:00Z");
                meta["generation"] = json!(1);
            }
            let Ok(key) = ObjectKey::from_value(&object) else { continue };
            let object = Arc::new(object);
            self.stored.insert(key, object.clone());
            committed.push(object);
        }
        self.inventory.record(&plan, committed.iter().map(|o| &**o), true);
    }
}

/// CPU time this process has used (user + system, every thread), in seconds.
fn cpu_seconds() -> f64 {
    // SAFETY: an all-zero rusage is valid, and getrusage only writes into it.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// This process's resident set, in KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap_or("");
    line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// Writes the repository: `manifests/team-NN/app-NNNN-<kind>.yaml`, the same under `templated/`
/// with the ConfigMaps as `*.yaml.j2`, a `kustomization.yaml` listing `manifests/` for
/// kustomize, committed on `main`; and the branch `one-file` that changes one ConfigMap.
/// Returns the bytes under `manifests/`.
fn generate(repo: &Path, manifests: usize) -> Result<u64> {
    let mut kustomization =
        String::from("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n");
    let mut bytes = 0;
    for i in 0..manifests {
        let (app, kind) = (i / 4, ["deployment", "service", "configmap", "secret"][i % 4]);
        let team = format!("team-{:02}", app % 100);
        let file = format!("{team}/app-{app:04}-{kind}.yaml");
        let content = manifest(app, &team, kind, false);
        for (dir, name, content) in [
            (PLAIN, file.clone(), content.clone()),
            (
                TEMPLATED,
                if kind == "configmap" { format!("{file}.j2") } else { file.clone() },
                manifest(app, &team, kind, true),
            ),
        ] {
            let path = repo.join(dir).join(&name);
            std::fs::create_dir_all(path.parent().context("a file has a directory")?)?;
            std::fs::write(&path, content)?;
        }
        bytes += content.len() as u64;
        writeln!(kustomization, "  - {PLAIN}/{file}")?;
    }
    std::fs::write(repo.join("kustomization.yaml"), kustomization)?;
    git(repo, &["init", "-q", "-b", "main"])?;
    git(repo, &["add", "-A"])?;
    git(repo, &["commit", "-q", "-m", "generated manifests"])?;
    git(repo, &["checkout", "-q", "-b", ONE_FILE])?;
    change_one_file(repo, "changed")?;
    git(repo, &["commit", "-q", "-am", "one ConfigMap changed"])?;
    git(repo, &["checkout", "-q", "main"])?;
    // Packed, as a clone is: pushes then cost what they send, not a walk of loose objects.
    git(repo, &["repack", "-adq"])?;
    Ok(bytes)
}

/// The generated manifest of `kind` for app number `app`; a templated ConfigMap takes `mode`
/// and `replicas` from the values.
fn manifest(app: usize, team: &str, kind: &str, templated: bool) -> String {
    let name = format!("app-{app:04}");
    match kind {
        "deployment" => format!(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {name}\n  namespace: default\n  labels:\n    app: {name}\n    team: {team}\nspec:\n  replicas: 1\n  selector:\n    matchLabels:\n      app: {name}\n  template:\n    metadata:\n      labels:\n        app: {name}\n        team: {team}\n    spec:\n      containers:\n        - name: web\n          image: gitplane.local/httpd:1\n          ports:\n            - containerPort: 80\n              name: http\n          env:\n            - name: APP\n              value: {name}\n            - name: POD_NAME\n              valueFrom:\n                fieldRef:\n                  fieldPath: metadata.name\n          resources:\n            requests:\n              cpu: 10m\n              memory: 16Mi\n            limits:\n              memory: 64Mi\n"
        ),
        "service" => format!(
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: default\n  labels:\n    app: {name}\n    team: {team}\nspec:\n  selector:\n    app: {name}\n  ports:\n    - name: http\n      port: 80\n      targetPort: 80\n"
        ),
        "configmap" => {
            let (mode, replicas) = if templated { ("{{ mode }}", "{{ replicas }}") } else { ("production", "2") };
            format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: default\n  labels:\n    app: {name}\n    team: {team}\ndata:\n  MODE: \"{mode}\"\n  REPLICAS: \"{replicas}\"\n  LOG_LEVEL: info\n  LISTEN: \":80\"\n  UPSTREAM: http://{name}.default.svc.cluster.local\n  TIMEOUT: 30s\n  RETRIES: \"3\"\n  FEATURE_FLAGS: alpha,beta\n"
            )
        }
        _ => format!(
            "apiVersion: v1\nkind: Secret\nmetadata:\n  name: {name}\n  namespace: default\n  labels:\n    app: {name}\n    team: {team}\ntype: Opaque\ndata:\n  token: c2VjcmV0LXRva2VuLXthcHB9\n  username: YWRtaW4=\n  password: cGFzc3dvcmQtMTIzNDU2Nzg5MA==\n"
        ),
    }
}

/// Sets the changed ConfigMap's LOG_LEVEL to `level`.
fn change_one_file(repo: &Path, level: &str) -> Result<()> {
    let path = repo.join(CHANGED);
    let content = std::fs::read_to_string(&path)?;
    let start = content.find("LOG_LEVEL: ").context("the changed ConfigMap has a LOG_LEVEL")?;
    let end = start + content[start..].find('\n').context("a line")?;
    std::fs::write(&path, format!("{}LOG_LEVEL: {level}{}", &content[..start], &content[end..]))?;
    Ok(())
}

fn git(dir: &Path, args: &[&str]) -> Result<()> {
    let output = Command::new("git")
        .arg("-C")
        .arg(dir)
        // No background `gc --auto`: it would race the explicit repack and the timed pushes.
        .args(["-c", "user.name=bench", "-c", "user.email=bench@gitplane.invalid", "-c", "gc.auto=0"])
        .args(args)
        .output()
        .context("running git")?;
    if !output.status.success() {
        bail!("git {}: {}", args.join(" "), String::from_utf8_lossy(&output.stderr));
    }
    Ok(())
}

struct Pushed {
    /// Pushes judged by the verdict, and pushes of the same run with it turned off.
    judged: Pushes,
    unjudged: Pushes,
    /// From pushing the whole repository to the Application synced at it.
    first_sync: Duration,
    /// From then until the controllers stopped writing.
    settled: Settled,
    /// The server's verdicts (their log's `elapsed`), one per judged push.
    verdicts: Latencies,
    /// Syncs of judged pushes that committed the verdict's plan, of all syncs of judged pushes.
    verdict_plans: (usize, usize),
    /// The hook's own process (no server), as git starts it.
    hook: Latencies,
    /// Load average before and after the timed pushes.
    load: (String, String),
}

/// One kind of timed push.
#[derive(Default)]
struct Pushes {
    /// From `git push` starting to the changed ConfigMap's watch event.
    applied: Vec<Duration>,
    /// `git push` alone.
    push: Vec<Duration>,
    /// From `git push` returning (the ref was updated before) to the watch event.
    after_push: Vec<Duration>,
    /// Where each `git push`'s time went ([`push_parts`]), in the order of [`PARTS`].
    parts: BTreeMap<&'static str, Vec<Duration>>,
}

/// A `gitplane server` whose bootstrap repository names one Application (`bench`) for the
/// generated repository, pushed whole, synced, and at rest.
struct Served {
    cluster: Gitplane,
    addr: std::net::SocketAddr,
    token: String,
    first_sync: Duration,
    settled: Settled,
}

/// Starts the server (with `nodes` hollow Nodes) and brings the generated repository to it.
async fn serve(gitplane: &Path, repo: &Path, nodes: usize) -> Result<Served> {
    // Hollow Nodes renew no Lease: the grace period outlasts the run instead.
    let args = ["--bootstrap", "bootstrap", "--node-monitor-grace-period", "1h"].map(String::from);
    let cluster = Gitplane::start(gitplane, 1, &args).await?;
    let addr = cluster.addrs[&1];
    let token = std::fs::read_to_string(cluster.dir().join("replica-1/git-token"))?.trim().to_owned();
    if nodes > 0 {
        register_hollow_nodes(addr, nodes).await?;
    }
    let remote = |name: &str| format!("http://git:{token}@{addr}/git/{name}.git");
    let repos = cluster.dir().join("repos");
    procs::wait_for("the bootstrap repository", Duration::from_secs(60), || async {
        repos.join("bootstrap.git").exists().then_some(())
    })
    .await?;

    let apps = cluster.dir().join("apps");
    std::fs::create_dir_all(&apps)?;
    std::fs::write(
        apps.join("bench.yaml"),
        "apiVersion: gitplane.io/v1\nkind: Application\nmetadata:\n  name: bench\n  namespace: gitplane-system\n\
         spec:\n  repo: bench\n  path: manifests\n  namespace: default\n  prune: true\n",
    )?;
    git(&apps, &["init", "-q", "-b", "main"])?;
    git(&apps, &["add", "-A"])?;
    git(&apps, &["commit", "-q", "-m", "the bench Application"])?;
    git(&apps, &["push", "-q", "--force", &remote("bootstrap"), "main"])?;
    procs::wait_for("the bench repository", Duration::from_secs(60), || async {
        repos.join("bench.git").exists().then_some(())
    })
    .await?;

    let started = Instant::now();
    git(repo, &["push", "-q", "--force", &remote("bench"), "main"])?;
    let head = String::from_utf8(Command::new("git").arg("-C").arg(repo).args(["rev-parse", "main"]).output()?.stdout)?;
    let head = head.trim().to_owned();
    let status = "/apis/gitplane.io/v1/namespaces/gitplane-system/applications/bench";
    procs::wait_for("the first sync", Duration::from_secs(300), || async {
        let body =
            gitplane_testkit::http_get_async(addr, status, Some(procs::READ_TOKEN), procs::GET_TIMEOUT).await.ok()?;
        let app: Value = serde_json::from_str(&body).ok()?;
        (app["status"]["sync"]["revision"] == head.as_str() && app["status"]["sync"]["status"] == "Synced")
            .then_some(())
    })
    .await
    .with_context(|| cluster.logs())?;
    let first_sync = started.elapsed();
    eprintln!("first sync of the whole repository: {first_sync:?}");
    // The controllers then make a ReplicaSet and a Pod per Deployment (the Pods stay Pending:
    // no node, or hollow ones that run nothing) and each Service's endpoints; the rounds measure
    // a cluster at rest.
    let settled = settle(&cluster).await;
    Ok(Served { cluster, addr, token, first_sync, settled })
}

/// The longest [`settle`] waits before measuring regardless.
const SETTLE_LIMIT: Duration = Duration::from_secs(900);
/// The window over which [`settle`] measures the rate of writes.
const SETTLE_WINDOW: Duration = Duration::from_secs(10);

/// Registers `count` Nodes that run nothing (kubemark's hollow nodes, without even a hollow
/// agent): Ready, room for every Pod of the bench, and a Lease renewed now.
async fn register_hollow_nodes(addr: std::net::SocketAddr, count: usize) -> Result<()> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?.connect().await?;
    let mut client = crate::procs::store_client(channel);
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let mut ops = Vec::new();
    for i in 0..count {
        let name = format!("hollow-{i}");
        let resources = json!({"cpu": "256", "memory": "1Ti", "pods": "10000", "ephemeral-storage": "1Ti"});
        let node = json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "status": {
                "capacity": resources, "allocatable": resources,
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                "lastHeartbeatTime": now, "lastTransitionTime": now}],
            },
        });
        let lease = json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": now},
        });
        ops.extend([Op::Create(node.clone()), Op::UpdateStatus(node), Op::Create(lease)]);
    }
    let json = serde_json::to_vec(&ops)?;
    let reply = client.txn(tonic::Request::new(pb::Payload { json, data: Vec::new() })).await?.into_inner();
    ensure!(
        matches!(reply.outcome, Some(pb::txn_reply::Outcome::Committed(_))),
        "registering {count} hollow Nodes: {:?}",
        reply.outcome
    );
    Ok(())
}

/// How the store settled: how long until its last write, and how many revisions that took.
struct Settled {
    took: Duration,
    revisions: i64,
}

/// Waits until the store's writes stop (no new revision for 3 s) or slow to a trickle (under
/// one a second over [`SETTLE_WINDOW`]: periodic writes never stop, the controllers' burst of
/// thousands does), printing progress every 10 s; after [`SETTLE_LIMIT`] it goes on anyway and
/// says so. Returns the time until the last write (until the window began, for a trickle) and
/// the revisions written meanwhile.
async fn settle(cluster: &Gitplane) -> Settled {
    let started = Instant::now();
    let first = cluster.status(1).await.map_or(0, |s| s.revision);
    let mut samples: std::collections::VecDeque<(Instant, i64)> = Default::default();
    let (mut last, mut still_since, mut reported) = (-1, Instant::now(), Instant::now());
    loop {
        let now = Instant::now();
        if let Some(revision) = cluster.status(1).await.map(|s| s.revision) {
            if revision != last {
                (last, still_since) = (revision, now);
            }
            samples.push_back((now, revision));
        }
        while samples.front().is_some_and(|(at, _)| now - *at > SETTLE_WINDOW) {
            samples.pop_front();
        }
        // Writes per second over the window, once the window is (nearly) full.
        let rate = match (samples.front(), samples.back()) {
            (Some((from, oldest)), Some((to, newest))) if *to - *from >= SETTLE_WINDOW.mul_f64(0.9) => {
                Some((newest - oldest) as f64 / (*to - *from).as_secs_f64())
            }
            _ => None,
        };
        let shown = rate.map_or("-".to_owned(), |r| format!("{r:.1}"));
        if still_since.elapsed() >= Duration::from_secs(3) {
            eprintln!("settled after {:.0?}: no write for 3 s, at revision {last}", started.elapsed());
            return Settled { took: still_since - started, revisions: last - first };
        }
        if rate.is_some_and(|r| r < 1.0) {
            eprintln!(
                "settled after {:.0?}: {shown} writes/s over the last 10 s, at revision {last}",
                started.elapsed()
            );
            let took = started.elapsed().saturating_sub(SETTLE_WINDOW);
            return Settled { took, revisions: samples.front().map_or(last, |(_, r)| *r) - first };
        }
        if started.elapsed() >= SETTLE_LIMIT {
            eprintln!(
                "warning: not settled after {SETTLE_LIMIT:?} ({shown} writes/s, revision {last}): measuring anyway"
            );
            return Settled { took: started.elapsed(), revisions: last - first };
        }
        if reported.elapsed() >= Duration::from_secs(10) {
            eprintln!("settling: {:.0?}, revision {last}, {shown} writes/s", started.elapsed());
            reported = now;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One `gitplane server` with a bootstrap repository naming one Application for the generated
/// repository, which is pushed whole, then changed one file per commit: `rounds` pushes with
/// the verdict and as many with it turned off, alternating.
async fn push_to_applied(gitplane: &Path, repo: &Path, rounds: usize, nodes: usize) -> Result<Pushed> {
    let Served { cluster, addr, token, first_sync, settled } = serve(gitplane, repo, nodes).await?;
    let remote = format!("http://git:{token}@{addr}/git/bench.git");
    let config = cluster.dir().join("repos/bench.git/config");
    let log = cluster.log_path(1);
    let judged_before = server_verdicts(&log).len();
    let synced_before = synced_lines(&log).len();
    let trace = cluster.dir().join("push.trace");
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?.connect().await?;
    let mut client = crate::procs::store_client(channel);
    let from = client.revision(pb::Empty {}).await?.into_inner().index as i64;
    let request = pb::WatchRequest {
        from_revision: from,
        kinds: vec!["ConfigMap".into()],
        bookmarks: false,
        ..Default::default()
    };
    let mut events = client.watch(request).await?.into_inner();
    let (mut judged, mut unjudged) = (Pushes::default(), Pushes::default());
    let load_before = crate::up::load_average();
    eprintln!("timed pushes start; load average {load_before}");
    for round in 0..2 * rounds {
        let verdict = round % 2 == 0;
        let status = Command::new("git")
            .args(["config", "-f"])
            .arg(&config)
            .args(["gitplane.pushVerdicts", if verdict { "true" } else { "false" }])
            .status()?;
        ensure!(status.success(), "git config");
        // Pushes are paced, as people push: each one meets a server done with the last one.
        tokio::time::sleep(PUSH_INTERVAL).await;
        let level = format!("round-{round}");
        change_one_file(repo, &level)?;
        git(repo, &["commit", "-q", "-am", &format!("one-file change {round}")])?;
        let _ = std::fs::remove_file(&trace);
        let started = Instant::now();
        let output = Command::new("git")
            .arg("-C")
            .arg(repo)
            .args(["push", "-q", &remote, "main"])
            .env("GIT_TRACE", &trace)
            .env("GIT_TRACE_CURL", &trace)
            .output()?;
        let returned = Instant::now();
        ensure!(output.status.success(), "git push: {}", String::from_utf8_lossy(&output.stderr));
        let seen = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(event) = events.next().await {
                let event = event?;
                let object: Value = serde_json::from_slice(&event.object)?;
                if event.name == "app-0000" && object["data"]["LOG_LEVEL"] == level.as_str() {
                    return Ok(());
                }
            }
            bail!("the watch ended")
        })
        .await;
        match seen {
            Ok(result) => result?,
            Err(_) => bail!("round {round}: the change was not applied within 30 s\n{}", cluster.logs()),
        }
        let pushes = if verdict { &mut judged } else { &mut unjudged };
        pushes.applied.push(started.elapsed());
        pushes.push.push(returned - started);
        pushes.after_push.push(returned.elapsed());
        let parts = push_parts(&std::fs::read_to_string(&trace).unwrap_or_default(), returned - started);
        for (part, took) in parts {
            pushes.parts.entry(part).or_default().push(took);
        }
        if round % 20 == 0 {
            eprintln!("push {round} of {}: {:.1?}", 2 * rounds, returned - started);
        }
    }
    let load_after = crate::up::load_average();
    eprintln!("timed pushes done; load average {load_after}");
    let verdicts: Vec<Duration> =
        server_verdicts(&log).into_iter().skip(judged_before).filter_map(|v| v.get("elapsed").copied()).collect();
    ensure!(verdicts.len() == rounds, "{} verdicts in the server's log for {rounds} judged pushes", verdicts.len());
    // Every other sync is of a judged push (the first timed one is).
    let synced: Vec<bool> = synced_lines(&log).into_iter().skip(synced_before).step_by(2).collect();
    let verdict_plans = (synced.iter().filter(|reused| **reused).count(), synced.len());
    Ok(Pushed {
        judged,
        unjudged,
        first_sync,
        settled,
        verdicts: Latencies::new(verdicts),
        verdict_plans,
        hook: hook_process(gitplane, rounds)?,
        load: (load_before, load_after),
    })
}

/// Per `synced` line of the bench Application in the server's log: whether it committed the
/// push verdict's plan.
fn synced_lines(log: &Path) -> Vec<bool> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .map(without_ansi)
        .filter(|l| l.contains(" synced") && l.contains(APP))
        .map(|l| l.contains("verdict_plan=true"))
        .collect()
}

/// The parts [`push_parts`] names, in the order they happen.
const PARTS: [&str; 7] = [
    "git's start until its first request",
    "GET without credentials (401)",
    "between the requests",
    "GET info/refs",
    "making the pack",
    "POST git-receive-pack",
    "the rest: process start before git's first trace line, exit",
];

/// The parts of one `git push` from its `GIT_TRACE` and `GIT_TRACE_CURL` lines (each starts with
/// the time of day, to the microsecond): git's start until its first request, each HTTP
/// request from its first header sent to the last byte received, the gaps between them (the
/// pack is made before the POST), and the rest of `total` (the process's start before its
/// first trace line, its exit after the last response).
fn push_parts(trace: &str, total: Duration) -> Vec<(&'static str, Duration)> {
    let stamp = |line: &str| -> Option<f64> {
        let time = line.split_whitespace().next()?;
        let mut fields = time.split(':');
        let (h, m, s) = (fields.next()?, fields.next()?, fields.next()?);
        Some(h.parse::<f64>().ok()? * 3600.0 + m.parse::<f64>().ok()? * 60.0 + s.parse::<f64>().ok()?)
    };
    let lines: Vec<(f64, &str)> = trace.lines().filter_map(|l| Some((stamp(l)?, l))).collect();
    let Some(&(first, _)) = lines.first() else { return Vec::new() };
    // (name, sent, last received)
    let mut requests: Vec<(&'static str, f64, f64)> = Vec::new();
    for &(at, line) in &lines {
        // Each header is a line of its own; a request starts with its request line.
        let request = line.split("=> Send header: ").nth(1).filter(|r| r.starts_with("GET ") || r.starts_with("POST "));
        if let Some(request) = request {
            let name = if request.starts_with("POST ") { "POST git-receive-pack" } else { "GET info/refs" };
            requests.push((name, at, at));
        } else if line.contains("<= Recv")
            && let Some(last) = requests.last_mut()
        {
            last.2 = at;
            if line.contains("<= Recv header: HTTP/1.1 401") {
                last.0 = "GET without credentials (401)";
            }
        }
    }
    let secs = |s: f64| Duration::from_secs_f64(s.max(0.0));
    let mut parts = Vec::new();
    let mut at = first;
    for (i, (name, sent, received)) in requests.iter().enumerate() {
        let gap = match (i, *name) {
            (0, _) => "git's start until its first request",
            (_, "POST git-receive-pack") => "making the pack",
            _ => "between the requests",
        };
        parts.push((gap, secs(sent - at)));
        parts.push((*name, secs(received - sent)));
        at = *received;
    }
    let traced = secs(at - first);
    parts.push(("the rest: process start before git's first trace line, exit", total.saturating_sub(traced)));
    parts
}

#[derive(clap::Args)]
pub struct PushVerdictArgs {
    /// Manifests in the generated repository (as `source`).
    #[arg(long, default_value_t = 10_000)]
    manifests: usize,
    /// Timed pushes of each kind, with and without the verdict, alternating.
    #[arg(long, default_value_t = 50)]
    rounds: usize,
    /// The `gitplane` binary (default: next to this one).
    #[arg(long)]
    gitplane: Option<PathBuf>,
    /// Keep the server's log in this directory.
    #[arg(long)]
    logs: Option<PathBuf>,
}

/// `gitplane-bench push-verdict`: the time the push verdict adds to `git push` of a one-file
/// commit to a repository of many manifests, against the same pushes with the repository's
/// verdict turned off (`gitplane.pushVerdicts false`: no hook at all), alternating in one run.
pub fn push_verdict(args: PushVerdictArgs) -> Result<()> {
    let gitplane = procs::prepare(args.gitplane.as_deref(), args.logs.as_deref())?;
    let dir = tempfile::Builder::new().prefix("gitplane-bench-verdict-").tempdir()?;
    let repo = dir.path().join("repo");
    eprintln!("generating {} manifests in {}", args.manifests, repo.display());
    generate(&repo, args.manifests)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let (with, without, server) = runtime.block_on(async {
        let Served { cluster, addr, token, .. } = serve(&gitplane, &repo, 0).await?;
        let remote = format!("http://git:{token}@{addr}/git/bench.git");
        let log = cluster.log_path(1);
        let judged_before = server_verdicts(&log).len();
        let config = cluster.dir().join("repos/bench.git/config");
        let (mut with, mut without) = (Vec::new(), Vec::new());
        eprintln!("timed pushes start; load average {}", crate::up::load_average());
        // Round 0 warms the verdict's cache (its first load of the repository) and is not timed.
        for round in 0..=2 * args.rounds {
            let judged = round % 2 == 0;
            let status = Command::new("git")
                .args(["config", "-f"])
                .arg(&config)
                .args(["gitplane.pushVerdicts", if judged { "true" } else { "false" }])
                .status()?;
            ensure!(status.success(), "git config");
            tokio::time::sleep(PUSH_INTERVAL).await;
            change_one_file(&repo, &format!("verdict-{round}"))?;
            git(&repo, &["commit", "-q", "-am", &format!("one-file change {round}")])?;
            let started = Instant::now();
            git(&repo, &["push", "-q", &remote, "main"])?;
            let took = started.elapsed();
            if round > 0 {
                if judged { with.push(took) } else { without.push(took) }
            }
            if round % 10 == 0 {
                eprintln!("push {round} of {}: {took:.1?}", 2 * args.rounds);
            }
        }
        eprintln!("timed pushes done; load average {}", crate::up::load_average());
        // Skipping the verdicts before the rounds and the warm-up's.
        let server: Vec<BTreeMap<String, Duration>> =
            server_verdicts(&log).into_iter().skip(judged_before + 1).collect();
        ensure!(server.len() == with.len(), "{} verdicts in the server's log for {} pushes", server.len(), with.len());
        Ok::<_, anyhow::Error>((Latencies::new(with), Latencies::new(without), server))
    })?;
    let phase = |name: &str| Latencies::new(server.iter().filter_map(|v| v.get(name).copied()).collect());
    // What the phases do not account for: scheduling, the socket, reading the repository's
    // settings and branch.
    let other = Latencies::new(
        server
            .iter()
            .filter_map(|v| {
                let parts = PHASES.iter().filter_map(|p| v.get(*p)).sum::<Duration>();
                Some(v.get("elapsed")?.saturating_sub(parts))
            })
            .collect(),
    );
    let server = phase("elapsed");
    let hook = hook_process(&gitplane, 2 * args.rounds)?;
    let p50 = |l: &Latencies| l.quantile(0.5).unwrap_or_default();
    println!("{} manifests, one per file; one-file commits pushed over HTTP 0.5 s apart.\n", args.manifests);
    println!("| `git push` of a one-file commit | Pushes | p50 | p99 | max |");
    println!("|---|--:|--:|--:|--:|");
    for (name, l) in [
        ("verdict off (no hook)", &without),
        ("with the verdict", &with),
        ("the verdict inside the server", &server),
        ("the hook's process alone (`pre-receive`, a link to `gitplane`; no server)", &hook),
    ] {
        println!(
            "| {name} | {} | {} ms | {} ms | {} ms |",
            l.len(),
            crate::ms(l.quantile(0.5)),
            crate::ms(l.quantile(0.99)),
            crate::ms(l.max())
        );
    }
    println!("\n| The verdict inside the server, by phase | p50 | p99 | max |");
    println!("|---|--:|--:|--:|");
    for (name, l) in PHASES.iter().map(|p| (*p, phase(p))).chain([("other", other)]) {
        println!(
            "| {name} | {} ms | {} ms | {} ms |",
            crate::ms(l.quantile(0.5)),
            crate::ms(l.quantile(0.99)),
            crate::ms(l.max())
        );
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let added = ms(p50(&with)) - ms(p50(&without));
    // The added time's tail, from the sorted pushes of each kind paired by rank.
    println!(
        "Added p99 (p99 with minus p99 without): {:.1} ms.",
        ms(with.quantile(0.99).unwrap_or_default()) - ms(without.quantile(0.99).unwrap_or_default())
    );
    println!("\nAdded by the verdict: p50 {added:.1} ms (goal under 100 ms).");
    println!(
        "Of which the verdict inside the server {:.1} ms, the rest (git running the hook, its process, the \
         socket, the quarantine) {:.1} ms; the hook's process alone {:.1} ms.",
        ms(p50(&server)),
        added - ms(p50(&server)),
        ms(p50(&hook))
    );
    Ok(())
}

/// The phases of a verdict as its log line names them (`source::verdict::Phases`).
const PHASES: [&str; 10] =
    ["informer", "open", "parent", "walk", "read", "render", "validate", "inventory", "plan", "output"];

/// The timings (`elapsed` and each phase) of each `push verdict` line of bench.git in the
/// server's log, in order.
fn server_verdicts(log: &Path) -> Vec<BTreeMap<String, Duration>> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .map(without_ansi)
        .filter(|l| l.contains("push verdict") && l.contains("bench.git"))
        .map(|l| {
            l.split_whitespace()
                .filter_map(|field| {
                    let (name, value) = field.split_once('=')?;
                    Some((name.to_owned(), parse_duration(value)?))
                })
                .collect::<BTreeMap<_, _>>()
        })
        .filter(|fields| fields.contains_key("elapsed"))
        .collect()
}

/// The line without terminal colours (the server's log has them: tracing colours by default).
fn without_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // CSI: ESC [ parameters, ended by a letter.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The hook's own process as git starts it (`pre-receive`, a link to the gitplane binary),
/// without a server to ask: it warns and accepts.
fn hook_process(gitplane: &Path, rounds: usize) -> Result<Latencies> {
    let dir = tempfile::tempdir()?;
    let hook = dir.path().join("pre-receive");
    std::os::unix::fs::symlink(std::path::absolute(gitplane)?, &hook)?;
    let mut took = Vec::new();
    for _ in 0..rounds {
        let started = Instant::now();
        let status = Command::new(&hook).stdin(Stdio::null()).stderr(Stdio::null()).status()?;
        took.push(started.elapsed());
        ensure!(status.success(), "the hook failed");
    }
    Ok(Latencies::new(took))
}

/// A `Debug` duration as tracing prints it: `12.3ms`, `950µs`, `1.2s`.
fn parse_duration(text: &str) -> Option<Duration> {
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let seconds = match unit {
        "s" => number,
        "ms" => number / 1e3,
        "µs" | "us" => number / 1e6,
        "ns" => number / 1e9,
        _ => return None,
    };
    Some(Duration::from_secs_f64(seconds))
}
