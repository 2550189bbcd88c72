//! The agent's Prometheus metrics, served on the kubelet endpoint (`GET /metrics`, see
//! [`crate::kubelet::server`]) with the kubelet's and kube-proxy's names.

use gitplane_metrics::{Counter, Family, Histogram, LATENCY_BUCKETS, SLOW_BUCKETS};
use std::{
    sync::{Arc, LazyLock},
    time::Duration,
};

struct Families {
    pod_start: Arc<Family<Histogram>>,
    proxy_sync: Arc<Family<Histogram>>,
    evictions: Arc<Family<Counter>>,
}

static METRICS: LazyLock<Families> = LazyLock::new(|| Families {
    pod_start: gitplane_metrics::histogram(
        "kubelet_pod_start_duration_seconds",
        "Duration in seconds from the agent seeing a pod for the first time to the pod starting to run",
        &[],
        SLOW_BUCKETS,
    ),
    proxy_sync: gitplane_metrics::histogram(
        "kubeproxy_sync_proxy_rules_duration_seconds",
        "SyncProxyRules latency in seconds",
        &[],
        LATENCY_BUCKETS,
    ),
    evictions: gitplane_metrics::counter(
        "kubelet_evictions",
        "Cumulative number of pod evictions by eviction signal",
        &["eviction_signal"],
    ),
});

/// Registers the families, so each shows before it first moves.
pub fn register() {
    LazyLock::force(&METRICS);
}

/// A Pod first seen `took` ago runs now.
pub(crate) fn pod_started(took: Duration) {
    METRICS.pod_start.with(&[]).observe_duration(took);
}

/// One sync of the Service rules.
pub(crate) fn proxy_synced(took: Duration) {
    METRICS.proxy_sync.with(&[]).observe_duration(took);
}

/// A Pod evicted for `signal` (`ephemeralcontainerfs.limit`, ...).
pub(crate) fn evicted(signal: &str) {
    METRICS.evictions.with(&[signal]).inc();
}
