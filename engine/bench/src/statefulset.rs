//! StatefulSet rollout on the real `gitplane up --nodes N`: from `git push` of a set of
//! `replicas` busybox httpd Pods to every Pod Ready (the set's `readyReplicas`), with
//! `podManagementPolicy` OrderedReady (one Pod at a time, each Ready before the next) and
//! Parallel, without and with a claim per Pod (the default `local-path` class), against a
//! Deployment of as many Pods in the same run; and for the sets with claims, each claim's time
//! from its creation to Bound, both seen on the store's watch. Each workload is removed and its
//! Pods, claims and volumes gone before the next is pushed.

use crate::{
    ingress::percentile,
    procs::StoreClient,
    up::{self, Up, git, git_in, load_average},
};
use anyhow::{Context as _, Result, bail};
use futures::StreamExt as _;
use gitplane_storage::remote::{PeerToken, pb};
use serde_json::Value;
use std::{
    collections::HashMap,
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

/// The scheduler's annotation on a `WaitForFirstConsumer` claim: the node its Pod goes to.
const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";

/// One workload compared.
struct Workload {
    name: &'static str,
    /// The kind's API path segment.
    plural: &'static str,
    manifest: String,
    /// Whether each Pod has a claim of its own.
    claims: bool,
}

fn workloads(replicas: u32) -> [Workload; 5] {
    let pod = |mounts: &str| {
        format!(
            "    metadata:\n      labels:\n        app: bench\n    spec:\n      terminationGracePeriodSeconds: 1\n      \
             containers:\n      - name: httpd\n        image: gitplane.local/httpd:1\n{mounts}"
        )
    };
    let set = |policy: &str, claims: bool| {
        let (mounts, templates) = match claims {
            false => ("", ""),
            true => (
                "        volumeMounts:\n        - {name: data, mountPath: /data}\n",
                "  persistentVolumeClaimRetentionPolicy: {whenDeleted: Delete}\n  volumeClaimTemplates:\n  \
                 - metadata: {name: data}\n    spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Mi}}}\n",
            ),
        };
        format!(
            "apiVersion: apps/v1\nkind: StatefulSet\nmetadata:\n  name: bench\nspec:\n  serviceName: bench\n  \
             podManagementPolicy: {policy}\n  replicas: {replicas}\n  selector:\n    matchLabels:\n      app: bench\n  \
             template:\n{}{templates}",
            pod(mounts)
        )
    };
    let deployment = format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: bench\nspec:\n  replicas: {replicas}\n  selector:\n    \
         matchLabels:\n      app: bench\n  template:\n{}",
        pod("")
    );
    let workload = |name, plural, manifest, claims| Workload { name, plural, manifest, claims };
    [
        workload("Deployment", "deployments", deployment, false),
        workload("StatefulSet, Parallel", "statefulsets", set("Parallel", false), false),
        workload("StatefulSet, OrderedReady", "statefulsets", set("OrderedReady", false), false),
        workload("StatefulSet with claims, Parallel", "statefulsets", set("Parallel", true), true),
        workload("StatefulSet with claims, OrderedReady", "statefulsets", set("OrderedReady", true), true),
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
    wait_for_count(&up, PODS, 0).await?;

    let workloads = workloads(args.replicas);
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); workloads.len()];
    let mut bound: Vec<Vec<ClaimTimes>> = vec![Vec::new(); workloads.len()];
    let mut store = store_client(&up).await?;
    for round in 0..args.rounds {
        for (i, Workload { name, plural, manifest, claims }) in workloads.iter().enumerate() {
            std::fs::write(work.join("bench.yaml"), manifest)?;
            let watch = match claims {
                true => Some(ClaimWatch::start(&mut store).await?),
                false => None,
            };
            let pushed = Instant::now();
            push(&work, name).await?;
            wait_ready(&up, plural, args.replicas).await.with_context(|| format!("{name}: {}", up.log_tail()))?;
            let took = pushed.elapsed();
            if let Some(watch) = watch {
                let latencies = watch.finish().await?;
                if latencies.len() != args.replicas as usize {
                    bail!("{name}: {} of {} claims seen Bound", latencies.len(), args.replicas);
                }
                bound[i].extend(latencies);
            }
            eprintln!(
                "round {}: {name}: {} Pods Ready {:.1} s after the push",
                round + 1,
                args.replicas,
                took.as_secs_f64()
            );
            times[i].push(took);
            std::fs::remove_file(work.join("bench.yaml"))?;
            push(&work, "no workload").await?;
            wait_for_count(&up, PODS, 0).await?;
            if *claims {
                wait_for_count(&up, "/api/v1/namespaces/default/persistentvolumeclaims", 0).await?;
                wait_for_count(&up, "/api/v1/persistentvolumes", 0).await?;
            }
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
    for (Workload { name, .. }, t) in workloads.iter().zip(&times) {
        let m = median(t);
        println!(
            "| {name} | {:.1} s | {:.0} ms | {:.2}x |",
            m.as_secs_f64(),
            m.as_secs_f64() * 1000.0 / f64::from(args.replicas.max(1)),
            m.as_secs_f64() / baseline.as_secs_f64()
        );
    }
    println!(
        "\n| claims ({} a round, {} nodes) | claims | created to Bound p50 | p99 | node selected to Bound p50 | p99 | max |",
        args.replicas, args.nodes
    );
    println!("|---|---|---|---|---|---|---|");
    let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1000.0);
    for (Workload { name, .. }, claims) in workloads.iter().zip(&bound).filter(|(w, _)| w.claims) {
        let mut created: Vec<Duration> = claims.iter().map(|c| c.bound).collect();
        let mut selected: Vec<Duration> = claims.iter().map(|c| c.provisioned).collect();
        created.sort();
        selected.sort();
        println!(
            "| {name} | {} | {} | {} | {} | {} | {} |",
            claims.len(),
            ms(percentile(&created, 0.50)),
            ms(percentile(&created, 0.99)),
            ms(percentile(&selected, 0.50)),
            ms(percentile(&selected, 0.99)),
            ms(selected.last().copied().unwrap_or_default())
        );
    }
    println!("\nload average before {load_before}, after {load_after}");
    Ok(())
}

/// The store's own watch, with the cluster's peer token: its events carry every change, so a
/// claim's creation and its binding are seen on the same stream.
async fn store_client(up: &Up) -> Result<StoreClient> {
    let token = std::fs::read_to_string(up.data_dir.join("peer-token")).context("the cluster's peer-token")?;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", up.listen))?.connect().await?;
    Ok(pb::store_service_client::StoreServiceClient::with_interceptor(channel, PeerToken::new(&token)?))
}

/// The claims of one workload, from the store's watch: when each was created and when it
/// became Bound.
struct ClaimWatch {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<Vec<ClaimTimes>>>,
}

/// One claim's times to Bound.
#[derive(Clone, Copy)]
struct ClaimTimes {
    /// From the claim's creation: with `WaitForFirstConsumer`, its Pod's wait for the scheduler
    /// is part of it.
    bound: Duration,
    /// From the scheduler's choice of node (`volume.kubernetes.io/selected-node`): the
    /// provisioning and the binding.
    provisioned: Duration,
}

impl ClaimWatch {
    async fn start(store: &mut StoreClient) -> Result<ClaimWatch> {
        let from = store.revision(pb::Empty {}).await?.into_inner().index as i64;
        let request = pb::WatchRequest {
            from_revision: from,
            kinds: vec!["PersistentVolumeClaim".into()],
            bookmarks: false,
            ..Default::default()
        };
        let mut events = store.watch(request).await?.into_inner();
        let (stop, mut stopped) = tokio::sync::oneshot::channel();
        let task = tokio::spawn(async move {
            let (mut created, mut selected, mut bound) = (HashMap::new(), HashMap::new(), HashMap::new());
            loop {
                tokio::select! {
                    _ = &mut stopped => break,
                    event = events.next() => {
                        let Some(event) = event else { bail!("the store's watch ended") };
                        let event = event?;
                        let seen = Instant::now();
                        created.entry(event.name.clone()).or_insert(seen);
                        let object: Value = serde_json::from_slice(&event.object)?;
                        if object["metadata"]["annotations"][SELECTED_NODE].is_string() {
                            selected.entry(event.name.clone()).or_insert(seen);
                        }
                        if object["status"]["phase"] == "Bound" {
                            bound.entry(event.name).or_insert(seen);
                        }
                    }
                }
            }
            Ok(bound
                .iter()
                .map(|(name, at)| ClaimTimes {
                    bound: *at - created[name],
                    provisioned: *at - selected.get(name).copied().unwrap_or(created[name]),
                })
                .collect())
        });
        Ok(ClaimWatch { stop, task })
    }

    /// The times of every claim seen Bound.
    async fn finish(self) -> Result<Vec<ClaimTimes>> {
        let _ = self.stop.send(());
        self.task.await?
    }
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

/// The bench's Pods (labelled `app=bench`).
const PODS: &str = "/api/v1/namespaces/default/pods?labelSelector=app%3Dbench";

/// Waits until the list at `path` holds `count` items.
async fn wait_for_count(up: &Up, path: &str, count: usize) -> Result<()> {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Ok(list) = up.get(path).await
            && list["items"].as_array().map(Vec::len) == Some(count)
        {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("{path} did not come to {count} items within {DEADLINE:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
