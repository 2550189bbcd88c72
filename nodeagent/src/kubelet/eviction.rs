//! The kubelet's eviction manager, its local storage part: every [`MONITORING_INTERVAL`] it
//! measures the local ephemeral storage of the Pods that bound it (a container's
//! `limits.ephemeral-storage`, an emptyDir's `sizeLimit`) and evicts those over a bound, as
//! upstream's `localStorageEviction` ([`local_storage`] decides). A Pod counts its containers'
//! writable layers (CRI `ContainerStats.writable_layer`, which containerd keeps current on its
//! own stats period), their logs and its emptyDirs on the node's disk, each walked as `du` does.
//!
//! The manager only decides: the Pod's worker carries the eviction out (`pod_workers`),
//! so measuring never holds up a Pod's start or sync. Pods with no bound cost nothing.

pub mod local_storage;

use super::runtime::{
    RuntimeManager,
    spec::{empty_dir_path, pod_log_directory, pod_uid},
};
use k8s_openapi::api::core::v1::Pod;
use local_storage::{Limits, Usage};
use std::{
    collections::{HashMap, HashSet},
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};
use tokio::sync::Notify;

/// How often usage is measured (the kubelet's eviction monitoring interval).
pub const MONITORING_INTERVAL: Duration = Duration::from_secs(10);

/// The grace an evicted Pod's containers get, whatever their own (upstream's
/// `immediateEvictionGracePeriodSeconds`; the runtime gives at least its minimum).
pub const EVICTION_GRACE: Duration = Duration::from_secs(1);

/// The Pods the manager measures and the evictions it decided, shared with the pod workers.
#[derive(Clone, Default)]
pub(crate) struct Evictions(Arc<Mutex<Registry>>);

struct Watched {
    pod: Pod,
    limits: Limits,
    wake: Arc<Notify>,
}

#[derive(Default)]
struct Registry {
    /// By uid: the Pods that set a bound, with their bounds and their worker's wake-up.
    watched: HashMap<String, Watched>,
    /// By uid: why the Pod is evicted, until its worker forgets it.
    decided: HashMap<String, String>,
}

impl Evictions {
    fn lock(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The newest version of a Pod of this node: measured from now on if it sets a bound, its
    /// worker woken by `wake` when it is to be evicted.
    pub(crate) fn update(&self, uid: &str, pod: &Pod, wake: Arc<Notify>) {
        let mut registry = self.lock();
        match Limits::of(pod) {
            Some(limits) => {
                registry.watched.insert(uid.to_owned(), Watched { pod: pod.clone(), limits, wake });
            }
            None => {
                registry.watched.remove(uid);
            }
        }
    }

    /// The Pod is gone from this node.
    pub(crate) fn forget(&self, uid: &str) {
        let mut registry = self.lock();
        registry.watched.remove(uid);
        registry.decided.remove(uid);
    }

    /// Why the Pod is to be evicted, once the manager decided it.
    pub(crate) fn decided(&self, uid: &str) -> Option<String> {
        self.lock().decided.get(uid).cloned()
    }

    /// The watched Pods not yet evicted.
    fn to_measure(&self) -> Vec<(String, Pod, Limits)> {
        let registry = self.lock();
        let pending = registry.watched.iter().filter(|(uid, _)| !registry.decided.contains_key(*uid));
        pending.map(|(uid, w)| (uid.clone(), w.pod.clone(), w.limits.clone())).collect()
    }

    /// Has the Pod's worker evict it; a Pod that left meanwhile is not evicted.
    fn decide(&self, uid: &str, message: String) {
        let mut registry = self.lock();
        if let Some(watched) = registry.watched.remove(uid) {
            registry.decided.insert(uid.to_owned(), message);
            watched.wake.notify_one();
        }
    }
}

/// The manager's loop: measures the watched Pods every [`MONITORING_INTERVAL`] and has the
/// worker of each one over a bound evict it.
pub(crate) async fn run(runtime: Arc<RuntimeManager>, evictions: Evictions) {
    let mut tick = tokio::time::interval(MONITORING_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let pods = evictions.to_measure();
        if pods.is_empty() {
            continue;
        }
        let started = Instant::now();
        let layers = match runtime.writable_layers().await {
            Ok(layers) => layers,
            Err(error) => {
                tracing::warn!(%error, "measuring the containers' writable layers failed");
                continue;
            }
        };
        let cfg = runtime.config().clone();
        let measured = tokio::task::spawn_blocking(move || {
            pods.into_iter()
                .map(|(uid, pod, limits)| {
                    let usage = measure(&cfg, &pod, &limits, layers.get(&uid));
                    (uid, pod, limits, usage)
                })
                .collect::<Vec<_>>()
        })
        .await;
        let Ok(measured) = measured else { continue };
        tracing::debug!(pods = measured.len(), took = ?started.elapsed(), "measured local ephemeral storage");
        for (uid, pod, limits, usage) in measured {
            let Some(eviction) = local_storage::decide(&limits, &usage) else { continue };
            tracing::info!(pod = %super::runtime::spec::pod_key(&pod), ?usage, message = %eviction.message, "evicting pod");
            crate::metrics::evicted(eviction.signal);
            evictions.decide(&uid, eviction.message);
        }
    }
}

/// One Pod's usage: each container's writable layer (from `layers`, its newest run's) and logs,
/// and each emptyDir on the node's disk.
fn measure(
    cfg: &super::runtime::RuntimeConfig,
    pod: &Pod,
    limits: &Limits,
    layers: Option<&HashMap<String, u64>>,
) -> Usage {
    let mut usage = Usage::default();
    let logs = pod_log_directory(cfg, pod).ok();
    let spec = pod.spec.as_ref();
    let containers = spec.into_iter().flat_map(|s| s.containers.iter().chain(s.init_containers.iter().flatten()));
    for c in containers {
        let layer = layers.and_then(|l| l.get(&c.name)).copied().unwrap_or(0);
        let log = logs.as_ref().map_or(0, |dir| disk_usage(&dir.join(&c.name)));
        usage.containers.insert(c.name.clone(), layer.saturating_add(log));
    }
    if let Ok(uid) = pod_uid(pod) {
        for name in &limits.disk_empty_dirs {
            usage.empty_dirs.insert(name.clone(), disk_usage(&empty_dir_path(cfg, uid, name)));
        }
    }
    usage
}

/// The bytes of disk `path` holds, as `du -s -x` counts them: allocated blocks, each inode once,
/// not crossing into other file systems. Nothing there is nothing used.
pub fn disk_usage(path: &Path) -> u64 {
    let Ok(root) = std::fs::symlink_metadata(path) else { return 0 };
    let mut seen: HashSet<u64> = HashSet::new();
    let mut total = root.blocks() * 512;
    let mut dirs: Vec<PathBuf> = if root.is_dir() { vec![path.to_owned()] } else { Vec::new() };
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            if meta.dev() != root.dev() || (meta.nlink() > 1 && !seen.insert(meta.ino())) {
                continue;
            }
            total = total.saturating_add(meta.blocks() * 512);
            if meta.is_dir() {
                dirs.push(entry.path());
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn disk_usage_counts_blocks_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(disk_usage(&dir.path().join("missing")), 0);
        let empty = disk_usage(dir.path());
        std::fs::create_dir(dir.path().join("sub")).expect("mkdir");
        std::fs::write(dir.path().join("sub/data"), vec![1u8; 1 << 20]).expect("write");
        std::fs::hard_link(dir.path().join("sub/data"), dir.path().join("link")).expect("link");
        // A sparse file holds no blocks for what it skipped.
        let sparse = std::fs::File::create(dir.path().join("sparse")).expect("create");
        sparse.set_len(100 << 20).expect("truncate");
        let used = disk_usage(dir.path()) - empty;
        assert!((1 << 20..(1 << 20) + (64 << 10)).contains(&used), "{used}");
    }

    #[test]
    fn the_registry_watches_only_pods_with_a_bound() {
        let pod = |limits: serde_json::Value| -> Pod {
            serde_json::from_value(json!({"metadata": {"name": "p", "uid": "u"},
                "spec": {"containers": [{"name": "c", "image": "busybox", "resources": {"limits": limits}}]}}))
            .expect("valid pod")
        };
        let evictions = Evictions::default();
        let wake = Arc::new(Notify::new());
        evictions.update("u", &pod(json!({"memory": "1Gi"})), wake.clone());
        assert!(evictions.to_measure().is_empty());
        evictions.update("u", &pod(json!({"ephemeral-storage": "1Gi"})), wake.clone());
        assert_eq!(evictions.to_measure().len(), 1);
        evictions.decide("u", "over".into());
        assert_eq!(evictions.decided("u").as_deref(), Some("over"));
        assert!(evictions.to_measure().is_empty(), "an evicted Pod is measured no more");
        evictions.forget("u");
        assert_eq!(evictions.decided("u"), None);
        evictions.decide("u", "over".into());
        assert_eq!(evictions.decided("u"), None, "a Pod that left is not evicted");
    }
}
