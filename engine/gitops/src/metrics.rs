//! The GitOps side's metric families: syncs, push to applied, push verdicts and mirror fetches.

use gitplane_metrics::{Family, Histogram, LATENCY_BUCKETS, SLOW_BUCKETS};
use std::{
    sync::{Arc, LazyLock},
    time::{Duration, Instant},
};

struct Families {
    sync_duration: Arc<Family<Histogram>>,
    push_to_applied: Arc<Family<Histogram>>,
    verdict_duration: Arc<Family<Histogram>>,
    fetch_duration: Arc<Family<Histogram>>,
}

static METRICS: LazyLock<Families> = LazyLock::new(|| Families {
    sync_duration: gitplane_metrics::histogram(
        "gitplane_application_sync_duration_seconds",
        "Duration of an Application's sync (read the branch head, render, validate, plan, commit) by result: Synced, Unchanged or Failed.",
        &["namespace", "application", "result"],
        SLOW_BUCKETS,
    ),
    push_to_applied: gitplane_metrics::histogram(
        "gitplane_push_to_applied_seconds",
        "From a branch moving (a push to a hosted repository, or a mirror fetch that brought commits) to its commit applied in the store.",
        &["namespace", "application"],
        SLOW_BUCKETS,
    ),
    verdict_duration: gitplane_metrics::histogram(
        "gitplane_push_verdict_duration_seconds",
        "Time a push to a hosted repository waited for its verdict (load, render, validate and plan of the pushed commits), by result: accepted or refused.",
        &["result"],
        LATENCY_BUCKETS,
    ),
    fetch_duration: gitplane_metrics::histogram(
        "gitplane_git_fetch_duration_seconds",
        "Duration of a fetch of a remote repository's mirror, by result: changed, unchanged or failed.",
        &["result"],
        SLOW_BUCKETS,
    ),
});

/// Registers the GitOps side's families, so each shows before it first moves.
pub fn register() {
    LazyLock::force(&METRICS);
}

/// One sync of an Application.
pub(crate) fn sync(namespace: &str, application: &str, result: &str, took: Duration) {
    METRICS.sync_duration.with(&[namespace, application, result]).observe_duration(took);
}

/// A branch that moved at `moved` is applied now.
pub(crate) fn applied(namespace: &str, application: &str, moved: Instant) {
    METRICS.push_to_applied.with(&[namespace, application]).observe_duration(moved.elapsed());
}

/// One push verdict.
pub(crate) fn verdict(accepted: bool, took: Duration) {
    METRICS.verdict_duration.with(&[if accepted { "accepted" } else { "refused" }]).observe_duration(took);
}

/// One fetch of a mirror.
pub(crate) fn fetched(result: &str, took: Duration) {
    METRICS.fetch_duration.with(&[result]).observe_duration(took);
}
