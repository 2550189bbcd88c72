//! The scheduler's throughput through its real loop, as kube-scheduler's scheduler_perf
//! SchedulingBasic measures it: `--pods` pending Pods over `--nodes` nodes, every plugin on.
//!
//! `cargo bench -p gitplane-scheduler --bench throughput [-- --nodes 5000 --pods 10000 --percentage 0]`
//!
//! The store is SQLite in a temporary directory with every commit synced (a single replica's
//! store). The nodes (in 3 zones) and the Pods (replicas of 50 ReplicaSets, 10m CPU and 16Mi
//! each) are written first; the clock starts when the scheduler starts over an informer already
//! synced, and stops when a watch has seen every Pod bound. `--percentage` is
//! percentageOfNodesToScore (0: kube-scheduler's adaptive default). Prints one Markdown row on
//! stdout: Pods/s, Pods per CPU-second of the process (on a shared machine, what one core of its
//! own would give, store and informer included), and the p50 and p99 of
//! `scheduler_scheduling_attempt_duration_seconds` (algorithm and binding), interpolated within
//! its buckets as Prometheus' histogram_quantile.

use futures::StreamExt;
use gitplane_scheduler::{Profile, Scheduler};
use gitplane_storage::sqlite::{Durability, SqliteStore};
use gitplane_store::{EventType, Op, Store, WatchOptions, informer::Informer};
use serde_json::{Value, json};
use std::{collections::HashSet, sync::Arc, time::Instant};

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)?.parse().ok()).unwrap_or(default)
}

fn node(i: usize) -> Value {
    let name = format!("node-{i:05}");
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name, "topology.kubernetes.io/zone": format!("zone-{}", i % 3)
        }},
        "status": {
            "allocatable": {"cpu": "64", "memory": "256Gi", "pods": "250"},
            "conditions": [{"type": "Ready", "status": "True"}],
            "images": [{"names": ["docker.io/library/nginx:1.27"], "sizeBytes": 70 << 20}]
        }
    })
}

fn pod(i: usize) -> Value {
    let set = i % 50;
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("pod-{i:05}"), "namespace": "default", "labels": {"app": format!("app-{set}")},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": format!("rs-{set}"),
                "uid": format!("rs-{set}"), "controller": true}]},
        "spec": {"containers": [{"name": "c", "image": "nginx:1.27",
            "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}
    })
}

async fn create(store: &dyn Store, objects: impl Iterator<Item = Value>) {
    let objects: Vec<Value> = objects.collect();
    for chunk in objects.chunks(500) {
        store.txn(chunk.iter().cloned().map(Op::Create).collect()).await.expect("created");
    }
}

/// The `q` quantile of a histogram's cumulative `(le, count)` buckets.
fn quantile(q: f64, buckets: &[(f64, f64)]) -> f64 {
    let Some(&(_, total)) = buckets.last() else { return f64::NAN };
    let rank = q * total;
    let mut below = (0.0, 0.0);
    for &(le, count) in buckets {
        if count >= rank {
            if le.is_infinite() {
                return below.0;
            }
            return below.0 + (le - below.0) * (rank - below.1) / (count - below.1).max(1.0);
        }
        below = (le, count);
    }
    f64::NAN
}

/// The CPU time this process used so far, from /proc (Linux' 100 ticks a second).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> =
        stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(f64::NAN);
    // utime and stime are the 14th and 15th fields, the 12th and 13th after the command.
    (ticks(11) + ticks(12)) / 100.0
}

fn attempt_buckets() -> Vec<(f64, f64)> {
    let scrape = gitplane_metrics::parse::parse(&gitplane_metrics::registry().encode()).expect("metrics parse");
    let mut buckets: Vec<(f64, f64)> = scrape
        .matching("scheduler_scheduling_attempt_duration_seconds_bucket", &[("result", "scheduled")])
        .map(|s| (s.labels["le"].parse::<f64>().unwrap_or(f64::INFINITY), s.value))
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    buckets
}

#[tokio::main]
async fn main() {
    let (nodes, pods, percentage) = (arg("--nodes", 500), arg("--pods", 1000), arg("--percentage", 0));
    let dir = std::env::temp_dir().join(format!("gitplane-scheduler-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    let store: Arc<dyn Store> =
        Arc::new(SqliteStore::open(&dir.join("store.db"), Durability::Full).await.expect("the store opens"));
    create(&*store, std::iter::once(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default"}})))
        .await;
    create(&*store, (0..nodes).map(node)).await;
    create(&*store, (0..pods).map(pod)).await;
    gitplane_scheduler::metrics::register();

    let mut watch = store.watch(store.revision().await.expect("a revision"), WatchOptions::default()).await.unwrap();
    let informer = Informer::spawn(store.clone(), vec!["Pod".into(), "Node".into(), "Namespace".into()]);
    informer.wait_synced().await;
    let profile = Profile::default().with_percentage_of_nodes_to_score(percentage as u32);
    let (started, cpu) = (Instant::now(), cpu_seconds());
    let scheduler = tokio::spawn(Scheduler::new(store.clone(), informer, profile).run());
    let mut bound = HashSet::new();
    while bound.len() < pods {
        let event = watch.next().await.expect("the watch goes on").expect("a watch event");
        if event.event_type == EventType::Modified
            && event.key.kind == "Pod"
            && event.object["spec"]["nodeName"].as_str().is_some()
        {
            bound.insert(event.key.name);
        }
    }
    let (elapsed, cpu) = (started.elapsed().as_secs_f64(), cpu_seconds() - cpu);
    scheduler.abort();
    let buckets = attempt_buckets();
    println!(
        "| {nodes} nodes, {pods} Pods | {:.0} | {:.0} | {:.1} | {:.1} |",
        pods as f64 / elapsed,
        pods as f64 / cpu,
        1e3 * quantile(0.5, &buckets),
        1e3 * quantile(0.99, &buckets)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
