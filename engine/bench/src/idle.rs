//! `gitplane-bench idle`: what an idle appliance costs: the CPU of `gitplane up
//! --nodes 3` once 100 Applications and their 300 Pods run and nothing changes, per process
//! kind, with the store's growth and the log volume over the same window. With `--probe`, each
//! Pod's container has a readiness probe run every second: what probing costs.

use crate::up::{Up, git, git_in};
use anyhow::{Context as _, Result, ensure};
use std::{
    collections::BTreeMap,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

#[derive(clap::Args, Clone)]
pub struct IdleArgs {
    /// Applications, each a Deployment in a directory of its own in the demo repository.
    #[arg(long, default_value_t = 100)]
    apps: usize,
    /// Replicas of each Application's Deployment.
    #[arg(long, default_value_t = 3)]
    replicas: usize,
    /// How long to wait after the last Pod runs before measuring, in seconds.
    #[arg(long, default_value_t = 60)]
    settle: u64,
    /// The measurement window, in seconds.
    #[arg(long, default_value_t = 60)]
    window: u64,
    /// Nodes of `gitplane up --nodes`.
    #[arg(long, default_value_t = 3)]
    nodes: u16,
    /// The `gitplane` binary (default: next to this one).
    #[arg(long)]
    gitplane: Option<PathBuf>,
    /// A readiness probe every container gets, run every second.
    #[arg(long, value_enum, default_value_t = Probe::None)]
    probe: Probe,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Probe {
    None,
    /// tcpSocket on the httpd's port.
    Tcp,
    /// httpGet of a small file.
    Http,
    /// exec of `busybox true` (CRI ExecSync).
    Exec,
}

impl Probe {
    /// The probe's YAML under a container, at its indentation.
    fn yaml(self) -> &'static str {
        match self {
            Probe::None => "",
            Probe::Tcp => "          readinessProbe: {tcpSocket: {port: 8080}, periodSeconds: 1}\n",
            Probe::Http => "          readinessProbe: {httpGet: {port: 8080, path: /etc/passwd}, periodSeconds: 1}\n",
            Probe::Exec => "          readinessProbe: {exec: {command: [/bin/busybox, \"true\"]}, periodSeconds: 1}\n",
        }
    }
}

/// How long the Pods may take to run (300 Pods on a 2-core machine).
const PODS_DEADLINE: Duration = Duration::from_secs(1200);

pub fn main(args: IdleArgs) -> Result<()> {
    let gitplane = match &args.gitplane {
        Some(path) => path.clone(),
        None => std::env::current_exe()?.with_file_name("gitplane"),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(run(&args, &gitplane))
}

fn deployment(i: usize, replicas: usize, probe: Probe) -> String {
    let probe = probe.yaml();
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: idle-{i}\nspec:\n  replicas: {replicas}\n  \
         selector:\n    matchLabels:\n      app: idle-{i}\n  template:\n    metadata:\n      labels:\n        app: idle-{i}\n    \
         spec:\n      terminationGracePeriodSeconds: 1\n      containers:\n        - name: httpd\n          \
         image: gitplane.local/httpd:1\n          command: [/bin/busybox, httpd, -f, -p, \"8080\", -h, /]\n{probe}"
    )
}

fn application(i: usize) -> String {
    format!(
        "apiVersion: gitplane.io/v1\nkind: Application\nmetadata:\n  name: idle-{i}\n  namespace: gitplane-system\n\
         spec:\n  repo: demo\n  branch: main\n  path: apps/idle-{i}\n  namespace: default\n"
    )
}

/// Clones `repo`, lets `edit` change the work tree, commits everything and pushes.
async fn push(up: &Up, repo: &str, message: &str, edit: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    let work = up.dir().join(format!("{repo}-work"));
    let source = up.repos_dir.join(format!("{repo}.git"));
    git(tokio::process::Command::new("git").arg("clone").arg("--quiet").arg(&source).arg(&work)).await?;
    edit(&work)?;
    git(git_in(&work).args(["add", "-A"])).await?;
    git(git_in(&work).args(["commit", "--quiet", "-m", message])).await?;
    git(git_in(&work).args(["push", "--quiet", "origin", "HEAD:main"])).await
}

/// Running Pods in namespace default: (all of them, the benchmark's own).
async fn running(up: &Up) -> Result<(usize, usize)> {
    let pods = up.get("/api/v1/namespaces/default/pods").await?;
    let items = pods["items"].as_array().context("PodList has items")?;
    let running: Vec<&str> = items
        .iter()
        .filter(|p| p["status"]["phase"] == "Running")
        .filter_map(|p| p["metadata"]["name"].as_str())
        .collect();
    Ok((running.len(), running.iter().filter(|n| n.starts_with("idle-")).count()))
}

/// One kind of process: CPU time (user + system), and resident memory (the largest process's
/// and all of them together).
#[derive(Clone, Copy, Default)]
struct Usage {
    cpu: Duration,
    rss_max: u64,
    rss_total: u64,
}

/// What every process uses, by kind.
/// The control plane is `up_pid`; the nodes' processes are those in the nodes' network
/// namespaces (`node_netns`: what `/proc/<pid>/ns/net` links to), not Pods' own namespaces.
fn usage_by_kind(up_pid: u32, node_netns: &[PathBuf]) -> BTreeMap<&'static str, Usage> {
    // SAFETY: sysconf only reads a constant of the system.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let tick = Duration::from_secs(1) / u32::try_from(hz).unwrap_or(100);
    let mut out = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir("/proc") else { return out };
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else { continue };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let exe = args.first().map(|a| Path::new(std::str::from_utf8(a).unwrap_or("")));
        let kind = if pid == up_pid {
            "gitplane up: control plane"
        } else if !std::fs::read_link(entry.path().join("ns/net")).is_ok_and(|ns| node_netns.contains(&ns)) {
            continue;
        } else if exe.is_some_and(|e| e.ends_with("gitplane")) && args.get(1) == Some(&&b"agent"[..]) {
            "gitplane agents"
        } else if exe.is_some_and(|e| e.ends_with("containerd")) {
            "containerd"
        } else if exe.is_some_and(|e| e.ends_with("containerd-shim-runc-v2")) {
            "containerd shims"
        } else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
        // Fields after the command name (which may hold spaces): utime and stime are 14 and 15.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else { continue };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks: u32 = fields.get(11..13).map(|f| f.iter().filter_map(|t| t.parse::<u32>().ok()).sum()).unwrap_or(0);
        let rss = std::fs::read_to_string(entry.path().join("status"))
            .ok()
            .and_then(|s| {
                s.lines().find_map(|l| l.strip_prefix("VmRSS:")?.split_whitespace().next()?.parse::<u64>().ok())
            })
            .unwrap_or(0)
            * 1024;
        let usage: &mut Usage = out.entry(kind).or_default();
        usage.cpu += tick * ticks;
        usage.rss_max = usage.rss_max.max(rss);
        usage.rss_total += rss;
    }
    out
}

async fn run(args: &IdleArgs, gitplane: &Path) -> Result<()> {
    let up = Up::start(gitplane, args.nodes).await?;
    let (apps, replicas) = (args.apps, args.replicas);
    push(&up, "demo", "idle: one Deployment per Application", |work| {
        for i in 0..apps {
            let dir = work.join(format!("apps/idle-{i}"));
            std::fs::create_dir_all(&dir)?;
            std::fs::write(dir.join("deployment.yaml"), deployment(i, replicas, args.probe))?;
        }
        Ok(())
    })
    .await?;
    push(&up, "bootstrap", "idle: the Applications", |work| {
        for i in 0..apps {
            std::fs::write(work.join(format!("idle-{i}.yaml")), application(i))?;
        }
        Ok(())
    })
    .await?;
    // The demo's own Deployment runs too (2 Pods).
    let want = apps * replicas;
    let started = Instant::now();
    loop {
        let (_, now) = running(&up).await.unwrap_or_default();
        if now >= want {
            break;
        }
        ensure!(started.elapsed() < PODS_DEADLINE, "only {now} of {want} Pods Running after {PODS_DEADLINE:?}");
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let to_running = started.elapsed();
    eprintln!("{want} Pods Running after {to_running:.1?}; settling {} s", args.settle);
    tokio::time::sleep(Duration::from_secs(args.settle)).await;

    // What `/proc/<pid>/ns/net` links to for a process in a node's network namespace.
    let node_netns: Vec<PathBuf> = up
        .nodes
        .iter()
        .filter_map(|n| std::fs::metadata(Path::new("/run/netns").join(n)).ok())
        .map(|m| PathBuf::from(format!("net:[{}]", m.ino())))
        .collect();
    ensure!(node_netns.len() == usize::from(args.nodes), "the nodes' network namespaces: {node_netns:?}");
    let up_pid = up.pid().context("gitplane up is not running")?;
    let store = up.data_dir.join("store");
    let (cpu0, revision0, store0, log0) =
        (usage_by_kind(up_pid, &node_netns), revision(&up).await?, dir_size(&store), log_bytes(&up));
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(args.window)).await;
    let (cpu1, revision1, store1, log1) =
        (usage_by_kind(up_pid, &node_netns), revision(&up).await?, dir_size(&store), log_bytes(&up));
    let window = t0.elapsed();
    let (pods, _) = running(&up).await?;
    up.stop().await?;

    println!(
        "`gitplane up --nodes {}` with {apps} Applications and {pods} Running Pods (probe: {:?}), idle for {window:.0?} after {}s of settling ({want} Pods ran {to_running:.0?} after the push); 2 CPUs; load average at the end: {}.\n",
        args.nodes,
        args.probe,
        args.settle,
        crate::up::load_average()
    );
    println!("| Processes | CPU, % of one core | CPU time in the window | RSS, largest process | RSS, all |");
    println!("|---|--:|--:|--:|--:|");
    let mut total = Duration::ZERO;
    let mib = |bytes: u64| format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20));
    for (kind, after) in &cpu1 {
        let used = after.cpu.saturating_sub(cpu0.get(kind).map(|u| u.cpu).unwrap_or_default());
        total += used;
        println!(
            "| {kind} | {:.2}% | {used:.2?} | {} | {} |",
            100.0 * used.as_secs_f64() / window.as_secs_f64(),
            mib(after.rss_max),
            mib(after.rss_total)
        );
    }
    println!("| all of the above | {:.2}% | {total:.2?} | | |", 100.0 * total.as_secs_f64() / window.as_secs_f64());
    println!(
        "\nStore: {} revisions in the window, {} bytes of growth; gitplane up's log: {} bytes.",
        revision1 - revision0,
        i128::from(store1) - i128::from(store0),
        log1.saturating_sub(log0)
    );
    Ok(())
}

/// The store's revision: a list's resourceVersion.
async fn revision(up: &Up) -> Result<i64> {
    let list = up.get("/api/v1/namespaces/default/configmaps?limit=1").await?;
    let version = list["metadata"]["resourceVersion"].as_str().context("a list's resourceVersion")?;
    Ok(version.parse()?)
}

/// What `gitplane up` and the agents have logged so far.
fn log_bytes(up: &Up) -> u64 {
    let agents = up.nodes.iter().map(|n| up.data_dir.join("nodes").join(n).join("agent.log"));
    std::iter::once(up.log.clone()).chain(agents).filter_map(|f| std::fs::metadata(f).ok()).map(|m| m.len()).sum()
}

fn dir_size(dir: &Path) -> u64 {
    std::fs::read_dir(dir).map(|e| e.flatten().filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum()).unwrap_or(0)
}
