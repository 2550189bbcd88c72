//! kube-scheduler's metrics of scheduling attempts, by result (`scheduled`, `unschedulable`,
//! `error`) and profile.

use gitplane_metrics::{Counter, Family, Histogram, LATENCY_BUCKETS};
use std::{
    sync::{Arc, LazyLock},
    time::Duration,
};

/// The one profile gitplane runs.
pub const PROFILE: &str = "default-scheduler";

struct Families {
    attempts: Arc<Family<Counter>>,
    duration: Arc<Family<Histogram>>,
}

static METRICS: LazyLock<Families> = LazyLock::new(|| Families {
    attempts: gitplane_metrics::counter(
        "scheduler_schedule_attempts_total",
        "Number of attempts to schedule pods, by the result. 'unschedulable' means a pod could not be scheduled, while 'error' means an internal scheduler problem.",
        &["result", "profile"],
    ),
    duration: gitplane_metrics::histogram(
        "scheduler_scheduling_attempt_duration_seconds",
        "Scheduling attempt latency in seconds (scheduling algorithm + binding)",
        &["result", "profile"],
        LATENCY_BUCKETS,
    ),
});

/// Registers the families.
pub fn register() {
    LazyLock::force(&METRICS);
}

/// One attempt and how long it took.
pub(crate) fn attempt(result: &str, took: Duration) {
    METRICS.attempts.with(&[result, PROFILE]).inc();
    METRICS.duration.with(&[result, PROFILE]).observe_duration(took);
}
