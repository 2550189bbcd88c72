//! The cost of serving one scrape: the text of a replica's registry, with the families a
//! replica registers, for a small cluster (as in t78) and for a busy one (every kind read, 100
//! Applications).
//!
//! `cargo bench -p gitplane-metrics --bench scrape`

use gitplane_metrics::{
    Counter, Family, Gauge, Histogram, LATENCY_BUCKETS, SLOW_BUCKETS, counter, gauge, histogram, registry,
};
use std::{
    sync::Arc,
    time::{Duration, Instant},
};

const RESOURCES: &[&str] = &[
    "pods",
    "services",
    "endpoints",
    "configmaps",
    "secrets",
    "events",
    "nodes",
    "namespaces",
    "deployments",
    "replicasets",
    "jobs",
    "endpointslices",
    "leases",
    "applications",
];
const QUEUES: &[&str] =
    &["scheduler", "source", "deployment", "replicaset", "job", "endpoints", "garbage-collector", "node-lifecycle"];

struct Replica {
    requests: Arc<Family<Counter>>,
    durations: Arc<Family<Histogram>>,
    watches: Arc<Family<Gauge>>,
    syncs: Arc<Family<Histogram>>,
    applied: Arc<Family<Histogram>>,
}

impl Replica {
    fn register() -> Replica {
        let depth = gauge("workqueue_depth", "depth", &["name"]);
        let adds = counter("workqueue_adds_total", "adds", &["name"]);
        for queue in QUEUES {
            depth.with(&[queue]).set(2);
            adds.with(&[queue]).inc_by(100);
        }
        let attempts = counter("scheduler_schedule_attempts_total", "attempts", &["result", "profile"]);
        let latency = histogram(
            "scheduler_scheduling_attempt_duration_seconds",
            "latency",
            &["result", "profile"],
            LATENCY_BUCKETS,
        );
        for result in ["scheduled", "unschedulable", "error"] {
            attempts.with(&[result, "default-scheduler"]).inc();
            latency.with(&[result, "default-scheduler"]).observe(0.01);
        }
        histogram("gitplane_store_txn_duration_seconds", "txn", &["result"], LATENCY_BUCKETS)
            .with(&["ok"])
            .observe(0.002);
        histogram("gitplane_git_fetch_duration_seconds", "fetch", &["result"], SLOW_BUCKETS)
            .with(&["changed"])
            .observe(0.5);
        Replica {
            requests: counter("apiserver_request_total", "requests", &["verb", "group", "resource", "code"]),
            durations: histogram(
                "apiserver_request_duration_seconds",
                "latency",
                &["verb", "group", "resource"],
                LATENCY_BUCKETS,
            ),
            watches: gauge("apiserver_longrunning_requests", "watches", &["verb", "group", "resource"]),
            syncs: histogram(
                "gitplane_application_sync_duration_seconds",
                "syncs",
                &["namespace", "application", "result"],
                SLOW_BUCKETS,
            ),
            applied: histogram("gitplane_push_to_applied_seconds", "push", &["namespace", "application"], SLOW_BUCKETS),
        }
    }

    /// Requests of the first `resources` kinds with `verbs`, and `applications` Applications.
    fn fill(&self, resources: usize, verbs: &[&str], codes: &[&str], applications: usize) {
        for resource in &RESOURCES[..resources] {
            for verb in verbs {
                for code in codes {
                    self.requests.with(&[verb, "", resource, code]).inc();
                }
                self.durations.with(&[verb, "", resource]).observe(0.003);
            }
            self.watches.with(&["WATCH", "", resource]).add(1);
        }
        for i in 0..applications {
            let app = format!("app-{i}");
            for result in ["Synced", "Unchanged"] {
                self.syncs.with(&["gitplane-system", &app, result]).observe(0.2);
            }
            self.applied.with(&["gitplane-system", &app]).observe(1.5);
        }
    }
}

fn measure(label: &str) {
    let mut times: Vec<Duration> = (0..500)
        .map(|_| {
            let started = Instant::now();
            std::hint::black_box(registry().encode());
            started.elapsed()
        })
        .collect();
    times.sort();
    let text = registry().encode();
    println!(
        "| {label} | {} | {} | {:?} | {:?} |",
        text.len(),
        text.lines().count(),
        times[times.len() / 2],
        times[times.len() * 99 / 100]
    );
}

fn main() {
    let replica = Replica::register();
    println!("| registry | bytes | lines | encode p50 | encode p99 |\n|---|---|---|---|---|");
    replica.fill(2, &["LIST", "WATCH"], &["200"], 2);
    measure("small cluster (t78's shape: 2 kinds read, 2 Applications)");
    replica.fill(RESOURCES.len(), &["GET", "LIST", "WATCH", "DELETE"], &["200", "404", "405"], 100);
    measure("busy (14 kinds x 4 verbs x 3 codes, 100 Applications)");
}
