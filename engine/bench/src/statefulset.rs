//! StatefulSet rollout on the real `gitplane up --nodes N`: from `git push` of a set of
//! `replicas` busybox httpd Pods to every Pod Ready (the set's `readyReplicas`), with
//! `podManagementPolicy` OrderedReady (one Pod at a time, each Ready before the next) and
//! Parallel, against a Deployment of as many Pods in the same run. Each workload is removed and
//! its Pods gone before the next is pushed.

use crate::up::{self, Up, git, git_in, load_average};
use anyhow::{Context as _, Result, bail};
use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

#[derive(clap::Args, Clone)]
pub struct StatefulSetArgs {
    /// Pods of each workload.
    #[arg(long, default_value_t = 100)]
    replicas: u32,
    /// Nodes of `gitplane up --nodes`.
    #[arg(long, default_value_t = 3)]
    nodes: u16,
    /// Rounds of the three workloads, interleaved.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// The `gitplane` binary (default: next to this one).
    #[arg(long)]
    gitplane: Option<PathBuf>,
}

/// How long one workload may take to be Ready, and its Pods to go.
const DEADLINE: Duration = Duration::from_secs(1800);

pub fn main(args: StatefulSetArgs) -> Result<()> {
    let args = &args;
    up::main(args.gitplane.as_deref(), |gitplane| async move { run(args, &gitplane).await })
}

/// The workloads compared: (row name, kind's API path, manifest).
fn workloads(replicas: u32) -> [(&'static str, &'static str, String); 3] {
    let pod = "    metadata:\n      labels:\n        app: bench\n    spec:\n      terminationGracePeriodSeconds: 1\n      \
               containers:\n      - name: httpd\n        image: gitplane.local/httpd:1\n";
    let set = |policy: &str| {
        format!(
            "apiVersion: apps/v1\nkind: StatefulSet\nmetadata:\n  name: bench\nspec:\n  serviceName: bench\n  \
             podManagementPolicy: {policy}\n  replicas: {replicas}\n  selector:\n    matchLabels:\n      app: bench\n  \
             template:\n{pod}"
        )
    };
    let deployment = format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: bench\nspec:\n  replicas: {replicas}\n  selector:\n    \
         matchLabels:\n      app: bench\n  template:\n{pod}"
    );
    [
        ("Deployment", "deployments", deployment),
        ("StatefulSet, Parallel", "statefulsets", set("Parallel")),
        ("StatefulSet, OrderedReady", "statefulsets", set("OrderedReady")),
    ]
}

async fn run(args: &StatefulSetArgs, gitplane: &Path) -> Result<()> {
    let load_before = load_average();
    eprintln!("starting gitplane up --nodes {}", args.nodes);
    let up = Up::start(gitplane, args.nodes).await?;
    let work = up.dir().join("bench-work");
    git(tokio::process::Command::new("git").arg("clone").arg("--quiet").arg(up.repos_dir.join("demo.git")).arg(&work))
        .await?;
    std::fs::remove_file(work.join("web.yaml")).context("the demo's web.yaml")?;
    // Something stays, so that removing a workload is not an empty render (which is refused).
    std::fs::write(work.join("keep.yaml"), "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: bench-keep\n")?;
    push(&work, "no demo workload").await?;
    wait_for_pods(&up, 0).await?;

    let workloads = workloads(args.replicas);
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); workloads.len()];
    for round in 0..args.rounds {
        for (i, (name, plural, manifest)) in workloads.iter().enumerate() {
            std::fs::write(work.join("bench.yaml"), manifest)?;
            let pushed = Instant::now();
            push(&work, name).await?;
            wait_ready(&up, plural, args.replicas).await.with_context(|| format!("{name}: {}", up.log_tail()))?;
            let took = pushed.elapsed();
            eprintln!(
                "round {}: {name}: {} Pods Ready {:.1} s after the push",
                round + 1,
                args.replicas,
                took.as_secs_f64()
            );
            times[i].push(took);
            std::fs::remove_file(work.join("bench.yaml"))?;
            push(&work, "no workload").await?;
            wait_for_pods(&up, 0).await?;
        }
    }
    let load_after = load_average();
    up.stop().await?;

    let median = |t: &[Duration]| {
        let mut t = t.to_vec();
        t.sort();
        t[t.len() / 2]
    };
    let baseline = median(&times[0]);
    println!(
        "| workload ({} Pods, {} nodes, median of {}) | push to all Ready | per Pod | against the Deployment |",
        args.replicas, args.nodes, args.rounds
    );
    println!("|---|---|---|---|");
    for ((name, _, _), t) in workloads.iter().zip(&times) {
        let m = median(t);
        println!(
            "| {name} | {:.1} s | {:.0} ms | {:.2}x |",
            m.as_secs_f64(),
            m.as_secs_f64() * 1000.0 / f64::from(args.replicas.max(1)),
            m.as_secs_f64() / baseline.as_secs_f64()
        );
    }
    println!("\nload average before {load_before}, after {load_after}");
    Ok(())
}

async fn push(work: &Path, message: &str) -> Result<()> {
    git(git_in(work).args(["add", "--all"])).await?;
    git(git_in(work).args(["commit", "--quiet", "--allow-empty", "-m", message])).await?;
    git(git_in(work).args(["push", "--quiet", "origin", "HEAD:main"])).await
}

/// Waits until the workload `bench` of `plural` reports `replicas` ready.
async fn wait_ready(up: &Up, plural: &str, replicas: u32) -> Result<()> {
    let path = format!("/apis/apps/v1/namespaces/default/{plural}/bench");
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Ok(object) = up.get(&path).await
            && object["status"]["readyReplicas"].as_u64() == Some(u64::from(replicas))
        {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("{plural}/bench was not Ready within {DEADLINE:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until `count` Pods labelled `app=bench` exist.
async fn wait_for_pods(up: &Up, count: usize) -> Result<()> {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Ok(list) = up.get("/api/v1/namespaces/default/pods?labelSelector=app%3Dbench").await
            && list["items"].as_array().map_or(0, Vec::len) == count
        {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("the bench Pods did not come to {count} within {DEADLINE:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
