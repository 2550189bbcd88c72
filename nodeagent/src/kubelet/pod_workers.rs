//! The kubelet's pod workers: one task per Pod bound to this node, driving the runtime towards
//! the Pod's spec and reporting its status, woken by the Pod's changes, by the PLEG
//! ([`super::pleg`]), by its probes and by the ConfigMaps and Secrets it references.

use super::{
    admission,
    eviction::{
        EVICTION_GRACE, Evictions,
        local_storage::{REASON as EVICTED, evicted_status, is_evicted},
    },
    podconfig::PodConfig,
    prober::{PodProber, Prober},
    runtime::{
        RuntimeManager,
        spec::{is_sidecar, sidecar_names},
    },
};
use crate::controlplane::{Client, Follower, Servers};
use gitplane_proto::node::{DeletePodRequest, EventType, PodEvent, UpdatePodStatusRequest, WatchPodsRequest};
use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;
use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, PoisonError},
    time::{Duration, Instant},
};
use tokio::{
    sync::{Notify, watch},
    task::JoinHandle,
};
use tonic::{Code, Response, Status, Streaming};

/// What the pod workers are told of the node.
#[derive(Clone, Debug)]
pub(crate) struct PodWorkersConfig {
    pub node_name: String,
    /// How often a worker re-checks a Pod that is still changing, unwoken.
    pub resync: Duration,
    /// How often it re-checks a steady Pod (the relist wakes it at once on a runtime change).
    pub resync_steady: Duration,
}

/// One worker per Pod, as the kubelet's pod workers.
pub(crate) struct PodWorkers {
    cfg: PodWorkersConfig,
    runtime: Arc<RuntimeManager>,
    prober: Prober,
    client: Servers,
    workers: HashMap<String, (watch::Sender<Option<Pod>>, JoinHandle<()>)>,
    /// Each worker's wake-up, for the relist.
    wakers: Wakers,
    /// During an initial list, the uids it named so far: at its bookmark, anything else running
    /// here is an orphan.
    initial: Option<HashSet<String>>,
    /// Wakes the workers of Pods whose ConfigMaps or Secrets change.
    config: Arc<PodConfig>,
    /// The Pods the eviction manager measures, and the evictions it decided.
    evictions: Evictions,
}

impl Follower for PodWorkers {
    type Event = PodEvent;
    const WHAT: &'static str = "pod watch";

    async fn open(&self, mut client: Client, from: i64) -> Result<Streaming<PodEvent>, Status> {
        let request = WatchPodsRequest { node_name: self.cfg.node_name.clone(), resource_version: from };
        client.watch_pods(request).await.map(Response::into_inner)
    }

    fn started(&mut self, from: i64) {
        self.initial = (from == 0).then(HashSet::new);
    }

    /// Applies one watch event; at the bookmark that ends an initial list, what runs here
    /// without being in it is an orphan and is removed.
    async fn observe(&mut self, event: PodEvent) {
        let kind = EventType::try_from(event.r#type).unwrap_or(EventType::Unspecified);
        if kind == EventType::Bookmark {
            if let Some(listed) = self.initial.take() {
                self.remove_orphans(&listed).await;
            }
            return;
        }
        let pod: Pod = match serde_json::from_slice(&event.pod) {
            Ok(pod) => pod,
            Err(e) => {
                tracing::warn!(error = %e, "undecodable pod in the watch, skipping");
                return;
            }
        };
        let uid = uid_of(&pod);
        match kind {
            EventType::Added | EventType::Modified => {
                if let Some(listed) = self.initial.as_mut() {
                    listed.insert(uid.clone());
                }
                self.update(uid, pod);
            }
            EventType::Deleted => self.delete(&uid, pod),
            _ => {}
        }
    }
}

fn uid_of(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

impl PodWorkers {
    pub(crate) fn new(
        cfg: PodWorkersConfig,
        runtime: Arc<RuntimeManager>,
        prober: Prober,
        client: Servers,
        config: Arc<PodConfig>,
        evictions: Evictions,
    ) -> Self {
        PodWorkers {
            cfg,
            runtime,
            prober,
            client,
            workers: HashMap::new(),
            wakers: Wakers::default(),
            initial: None,
            config,
            evictions,
        }
    }

    /// Each worker's wake-up, for the PLEG.
    pub(crate) fn wakers(&self) -> Wakers {
        self.wakers.clone()
    }

    fn update(&mut self, uid: String, pod: Pod) {
        if let Some((tx, _)) = self.workers.get(&uid) {
            if let Some(wake) = self.wakers.lock().unwrap_or_else(PoisonError::into_inner).get(&uid) {
                self.config.register(&uid, &pod, wake.clone());
                self.evictions.update(&uid, &pod, wake.clone());
            }
            // The worker always gets the newest Pod, but is woken only by what it acts on: its
            // own status writes come back through the watch, and once woke it at once, so every
            // status that differed from the last one started the next sync (70 a second).
            tx.send_if_modified(|current| {
                let wake = current.as_ref().is_none_or(|current| needs_sync(current, &pod));
                *current = Some(pod);
                wake
            });
            return;
        }
        let key = format!(
            "{}/{}",
            pod.metadata.namespace.as_deref().unwrap_or(""),
            pod.metadata.name.as_deref().unwrap_or("")
        );
        let wake = Arc::new(Notify::new());
        self.config.register(&uid, &pod, wake.clone());
        self.evictions.update(&uid, &pod, wake.clone());
        let involved = gitplane_api::events::reference(&pod);
        let (tx, rx) = watch::channel(Some(pod));
        self.wakers.lock().unwrap_or_else(PoisonError::into_inner).insert(uid.clone(), wake.clone());
        let worker = PodWorker {
            uid: uid.clone(),
            runtime: self.runtime.clone(),
            probes: self.prober.pod(key, involved, wake.clone()),
            client: self.client.clone(),
            resync: self.cfg.resync,
            resync_steady: self.cfg.resync_steady,
            wake,
            config: self.config.clone(),
            evictions: self.evictions.clone(),
        };
        self.workers.insert(uid, (tx, tokio::spawn(worker.run(rx))));
    }

    fn delete(&mut self, uid: &str, last: Pod) {
        self.wakers.lock().unwrap_or_else(PoisonError::into_inner).remove(uid);
        self.config.unregister(uid);
        self.evictions.forget(uid);
        match self.workers.remove(uid) {
            Some((tx, _)) => {
                tx.send_replace(None);
            }
            None => {
                // Never ran here under this agent, but may have under a previous one.
                let runtime = self.runtime.clone();
                let uid = uid.to_owned();
                let sidecars = sidecar_names(&last);
                tokio::spawn(async move { kill(&runtime, &uid, grace_period(&last), &sidecars).await });
            }
        }
    }

    /// Kills what runs here but was not in the initial list (deleted while the agent was away).
    async fn remove_orphans(&mut self, listed: &HashSet<String>) {
        let gone: Vec<String> = self.workers.keys().filter(|uid| !listed.contains(*uid)).cloned().collect();
        for uid in gone {
            self.wakers.lock().unwrap_or_else(PoisonError::into_inner).remove(&uid);
            self.config.unregister(&uid);
            self.evictions.forget(&uid);
            if let Some((tx, _)) = self.workers.remove(&uid) {
                tx.send_replace(None);
            }
        }
        match self.runtime.pod_uids().await {
            Ok(uids) => {
                for uid in uids.into_iter().filter(|u| !listed.contains(u)) {
                    tracing::info!(%uid, "removing orphaned pod");
                    kill(&self.runtime, &uid, Duration::from_secs(30), &[]).await;
                }
            }
            Err(e) => tracing::warn!(error = %e, "listing pods in the runtime failed"),
        }
    }

    /// Stops every worker; with `remove`, also stops and removes every Pod of this node, all at
    /// once, each container given [`EXIT_GRACE`] and the whole at most [`EXIT_DEADLINE`]: a
    /// stop must end whatever state the runtime is in, and what is left (a runtime that does
    /// not answer) is the host's to kill.
    pub(crate) async fn stop(self, remove: bool) {
        for (_, (_, handle)) in self.workers {
            handle.abort();
            let _ = handle.await;
        }
        if !remove {
            return;
        }
        let runtime = &self.runtime;
        let removing = async {
            // A runtime that is down may be on its way back (`gitplane up` starts it again).
            let uids = loop {
                match runtime.pod_uids().await {
                    Ok(uids) => break uids,
                    Err(error) => {
                        tracing::warn!(%error, "listing the pods to remove failed; trying again");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                }
            };
            let kills = uids.iter().map(|uid| async move {
                if let Err(error) = runtime.kill_pod(uid, EXIT_GRACE, &[]).await {
                    tracing::warn!(%uid, %error, "removing the pod failed");
                }
            });
            futures::future::join_all(kills).await;
        };
        if tokio::time::timeout(EXIT_DEADLINE, removing).await.is_err() {
            tracing::warn!(deadline = ?EXIT_DEADLINE, "the pods were not all removed in time");
        }
    }
}

/// What each container gets after SIGTERM when the agent removes its Pods on exit: the kubelet's
/// minimum grace period, so that a stop is quick.
const EXIT_GRACE: Duration = Duration::from_secs(2);
/// How long removing every Pod on exit may take.
pub const EXIT_DEADLINE: Duration = Duration::from_secs(4);

fn grace_period(pod: &Pod) -> Duration {
    let seconds = pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds).unwrap_or(30);
    Duration::from_secs(seconds.max(0) as u64)
}

/// The grace a Pod being deleted gets: the delete's `deletionGracePeriodSeconds`, else its own.
fn deletion_grace_period(pod: &Pod) -> Duration {
    match pod.metadata.deletion_grace_period_seconds {
        Some(seconds) => Duration::from_secs(seconds.max(0) as u64),
        None => grace_period(pod),
    }
}

/// Kills the pod (its `sidecars` after its other containers), retrying with back-off: a runtime
/// call cut off mid-way leaves a container that containerd is still starting, which cannot be
/// removed until it has started. What is left after the last attempt, the orphan removal of
/// the agent's next start removes. `false` when no attempt succeeded.
async fn kill(runtime: &RuntimeManager, uid: &str, grace: Duration, sidecars: &[String]) -> bool {
    const ATTEMPTS: u32 = 5;
    let mut delay = Duration::from_secs(1);
    for attempt in 1..=ATTEMPTS {
        match runtime.kill_pod(uid, grace, sidecars).await {
            Ok(()) => {
                tracing::info!(%uid, "pod stopped and removed");
                return true;
            }
            Err(e) => tracing::warn!(%uid, error = %e, attempt, "removing pod failed"),
        }
        if attempt < ATTEMPTS {
            tokio::time::sleep(delay).await;
            delay *= 2;
        }
    }
    false
}

struct PodWorker {
    uid: String,
    runtime: Arc<RuntimeManager>,
    /// The Pod's probe workers; they wake this worker when a verdict changes.
    probes: PodProber,
    client: Servers,
    resync: Duration,
    resync_steady: Duration,
    /// Notified by the relist when the runtime's view of this Pod changed, and when a ConfigMap
    /// or Secret it references changed.
    wake: Arc<Notify>,
    config: Arc<PodConfig>,
    evictions: Evictions,
}

impl PodWorker {
    async fn run(mut self, mut updates: watch::Receiver<Option<Pod>>) {
        let mut reported: Option<Value> = None;
        let mut budget = WriteBudget::new(Instant::now());
        let mut last: Option<Pod> = None;
        // Syncs that failed in a row: the next one waits longer.
        let mut failures = 0u32;
        // `kubelet_pod_start_duration_seconds`: from now to the first Running status, unless the
        // Pod already ran when first seen (adopted by a restarted agent).
        let seen = Instant::now();
        let mut start_recorded = false;
        // Whether a sync here found the Pod started: the store's copy may still say Pending when
        // the runtime goes away before the echo of that status arrives.
        let mut started_here = false;
        if self.rejects(&mut updates).await {
            return;
        }
        // Evicted: the Pod never runs again; the worker waits for its deletion.
        let mut evicted = false;
        loop {
            let pod = updates.borrow_and_update().clone();
            let Some(pod) = pod else {
                let grace = last.as_ref().map_or(Duration::from_secs(30), grace_period);
                if let Some(last) = last.as_ref().filter(|_| !evicted) {
                    self.killing(last);
                }
                let sidecars = last.as_ref().map(sidecar_names).unwrap_or_default();
                kill(&self.runtime, &self.uid, grace, &sidecars).await;
                return;
            };
            if pod.metadata.deletion_timestamp.is_some() {
                self.terminate(&pod).await;
                return;
            }
            if !evicted && let Some(message) = self.evictions.decided(&self.uid) {
                self.evict(&pod, &message).await;
                evicted = true;
            } else if !evicted && is_evicted(&pod) {
                // Evicted before this agent started: what is left of it goes.
                kill(&self.runtime, &self.uid, EVICTION_GRACE, &sidecar_names(&pod)).await;
                evicted = true;
            }
            if evicted {
                last = Some(pod);
                if updates.changed().await.is_err() {
                    return;
                }
                continue;
            }
            // What this version of the Pod references is here before it is read (once per version).
            if last.as_ref().is_none_or(|l| l.metadata.resource_version != pod.metadata.resource_version) {
                self.config.wait_for(&pod).await;
            }
            let mut next_sync = self.resync;
            self.probes.update(&pod);
            // The store may still show the Pod running at the address of a sandbox that is gone
            // (the node restarted): the status without it goes out first, before the sandbox is
            // made again (which may take long, or fail).
            if last.is_none()
                && pod.status.as_ref().is_some_and(|s| s.pod_ip.is_some())
                && let Ok(status) = self.runtime.pod_status(&pod, &self.probes.snapshot()).await
                && status.pod_ip.is_none()
                && self.report(&pod, &status).await
            {
                reported = Some(comparable(&status));
            }
            let status = match self.runtime.sync_pod(&pod, &self.probes.snapshot()).await {
                Ok(status) => {
                    failures = 0;
                    if !start_recorded {
                        let was_running =
                            |p: &Pod| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
                        if last.is_none() && was_running(&pod) {
                            start_recorded = true;
                        } else if status.phase.as_deref() == Some("Running") {
                            crate::metrics::pod_started(seen.elapsed());
                            start_recorded = true;
                        }
                    }
                    self.probes.observe(&status);
                    started_here |= started_status(&status);
                    if steady(&status) {
                        next_sync = self.resync_steady;
                    }
                    Some(status)
                }
                Err(e) => {
                    failures = failures.saturating_add(1);
                    next_sync = sync_backoff(failures);
                    if failures == 1 {
                        tracing::warn!(pod = %pod.metadata.name.as_deref().unwrap_or(""), error = %e, retry_in = ?next_sync, "pod sync failed");
                    }
                    // A Pod that never ran here says why it does not; one that runs keeps its
                    // status (its containers may well run on in their shims).
                    if started_here || started(&pod) {
                        None
                    } else {
                        self.runtime.sandbox_failed(&pod, &self.probes.snapshot(), &e)
                    }
                }
            };
            if let Some(status) = status {
                let comparable = comparable(&status);
                if reported.as_ref() != Some(&comparable) {
                    match budget.take(Instant::now()) {
                        Ok(()) => {
                            if self.report(&pod, &status).await {
                                reported = Some(comparable);
                            }
                        }
                        // Coalesced, not dropped: the sync when the budget allows reports
                        // the status of that moment.
                        Err(allowed_at) => {
                            next_sync = next_sync.min(allowed_at.saturating_duration_since(Instant::now()));
                        }
                    }
                }
            }
            last = Some(pod);
            tokio::select! {
                changed = updates.changed() => if changed.is_err() { return },
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(next_sync) => {}
            }
        }
    }

    /// The kubelet's admission before the first sync: a Pod the node cannot run as written is
    /// reported Failed with the reason, once, and never started; its worker then only waits for
    /// its deletion. Whether the Pod was rejected (the worker is done).
    async fn rejects(&self, updates: &mut watch::Receiver<Option<Pod>>) -> bool {
        let Some(pod) = updates.borrow_and_update().clone() else {
            return false;
        };
        if !admission::was_rejected(&pod) {
            let Err(rejection) = admission::admit(&pod, self.runtime.config().host) else {
                return false;
            };
            let name = pod.metadata.name.as_deref().unwrap_or("");
            tracing::info!(pod = %name, reason = rejection.reason, message = %rejection.message, "pod rejected");
            self.runtime.events().pod(&pod, gitplane_api::events::WARNING, rejection.reason, &rejection.message);
            let mut failures = 0;
            while !self.report(&pod, &rejection.status(&pod)).await {
                failures += 1;
                tokio::time::sleep(sync_backoff(failures)).await;
            }
        }
        loop {
            let pod = updates.borrow_and_update().clone();
            match pod {
                None => return true,
                Some(pod) if pod.metadata.deletion_timestamp.is_some() => {
                    self.terminate(&pod).await;
                    return true;
                }
                Some(_) => {}
            }
            if updates.changed().await.is_err() {
                return true;
            }
        }
    }

    /// A `Killing` Event for each of the Pod's containers.
    fn killing(&self, pod: &Pod) {
        // The app containers first, then the sidecars, as they stop.
        let sidecars = pod.spec.iter().flat_map(|s| s.init_containers.iter().flatten().rev()).filter(|c| is_sidecar(c));
        for c in pod.spec.iter().flat_map(|s| &s.containers).chain(sidecars) {
            let message = format!("Stopping container {}", c.name);
            self.runtime.events().pod(pod, gitplane_api::events::NORMAL, "Killing", &message);
        }
    }

    /// The kubelet's eviction of the Pod (`message` says why): a Warning `Evicted` Event, its
    /// containers stopped within [`EVICTION_GRACE`], its status Failed with reason `Evicted`,
    /// then the rest of it (sandbox, emptyDirs, logs) removed, which frees the disk. The object
    /// stays for its owner to replace and delete.
    async fn evict(&self, pod: &Pod, message: &str) {
        let name = pod.metadata.name.as_deref().unwrap_or("");
        self.runtime.events().pod(pod, gitplane_api::events::WARNING, EVICTED, message);
        self.killing(pod);
        let mut stopped = None;
        for failures in 1..=STOP_ATTEMPTS {
            match self.runtime.stop_pod(pod, EVICTION_GRACE, &self.probes.snapshot()).await {
                Ok(status) => {
                    stopped = Some(status);
                    break;
                }
                Err(error) => {
                    tracing::warn!(pod = %name, %error, "stopping the evicted pod failed");
                    tokio::time::sleep(sync_backoff(failures)).await;
                }
            }
        }
        // Without the runtime's word, the last status reported is the one to end from.
        let status = evicted_status(stopped.or_else(|| pod.status.clone()).unwrap_or_default(), message);
        self.probes.observe(&status);
        let mut failures = 0;
        while !self.report(pod, &status).await {
            failures += 1;
            tokio::time::sleep(sync_backoff(failures)).await;
        }
        kill(&self.runtime, &self.uid, EVICTION_GRACE, &sidecar_names(pod)).await;
        tracing::info!(pod = %name, %message, "pod evicted");
    }

    /// The kubelet's graceful termination of a Pod being deleted: its containers stopped
    /// (preStop hooks, SIGTERM, SIGKILL once the delete's grace period is over), its sandbox
    /// removed, then the object removed through the node service. Nothing restarts meanwhile.
    async fn terminate(&self, pod: &Pod) {
        let grace = deletion_grace_period(pod);
        let name = pod.metadata.name.as_deref().unwrap_or("");
        tracing::info!(pod = %name, ?grace, "pod is being deleted: stopping it");
        self.killing(pod);
        let mut failures = 0;
        while !kill(&self.runtime, &self.uid, grace, &sidecar_names(pod)).await {
            failures += 1;
            tokio::time::sleep(sync_backoff(failures)).await;
        }
        let mut failures = 0;
        loop {
            let request = DeletePodRequest {
                namespace: pod.metadata.namespace.clone().unwrap_or_default(),
                name: name.to_owned(),
                uid: self.uid.clone(),
            };
            let (server, mut client) = self.client.get();
            match client.delete_pod(request).await {
                Ok(_) => return tracing::info!(pod = %name, "pod stopped and deleted"),
                Err(s) if s.code() == Code::NotFound => return, // force-deleted meanwhile
                Err(s) if s.code() == Code::PermissionDenied => {
                    return tracing::warn!(pod = %name, error = %s.message(), "deleting the pod was refused");
                }
                Err(s) => {
                    failures += 1;
                    tracing::warn!(pod = %name, error = %s.message(), "deleting the pod failed; retrying");
                    self.client.failed(server);
                    tokio::time::sleep(sync_backoff(failures)).await;
                }
            }
        }
    }

    /// Sends the status; `false` when it should be sent again.
    async fn report(&self, pod: &Pod, status: &k8s_openapi::api::core::v1::PodStatus) -> bool {
        let request = UpdatePodStatusRequest {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid: self.uid.clone(),
            status: serde_json::to_vec(status).unwrap_or_default(),
        };
        let (server, mut client) = self.client.get();
        match client.update_pod_status(request).await {
            Ok(_) => true,
            Err(s) if s.code() == Code::NotFound => true, // deleted or replaced; the watch will say
            Err(s) => {
                tracing::warn!(pod = %pod.metadata.name.as_deref().unwrap_or(""), error = %s.message(), "status report failed");
                self.client.failed(server);
                false
            }
        }
    }
}

/// How often an evicted Pod's containers are asked to stop before its last status stands.
const STOP_ATTEMPTS: u32 = 3;

/// When a pod worker syncs again after `failures` failed syncs in a row: 1 s, doubling, at most
/// 10 s (the kubelet's pod worker back-off). The runtime's return wakes every worker sooner.
fn sync_backoff(failures: u32) -> Duration {
    Duration::from_secs(1).saturating_mul(1 << failures.saturating_sub(1).min(4)).min(Duration::from_secs(10))
}

/// Whether the Pod's status says it got a sandbox (an address) or got past Pending: a sync that
/// fails then leaves its status as it is.
fn started(pod: &Pod) -> bool {
    pod.status.as_ref().is_some_and(started_status)
}

fn started_status(status: &k8s_openapi::api::core::v1::PodStatus) -> bool {
    status.pod_ip.is_some() || status.phase.as_deref().is_some_and(|p| p != "Pending")
}

/// A Pod that only a change in the runtime (which the relist reports) or in its spec can move:
/// finished, or running with every container running.
fn steady(status: &k8s_openapi::api::core::v1::PodStatus) -> bool {
    match status.phase.as_deref() {
        Some("Succeeded" | "Failed") => true,
        Some("Running") => status
            .container_statuses
            .as_ref()
            .is_some_and(|statuses| statuses.iter().all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))),
        _ => false,
    }
}

/// The pod workers' wake-ups by pod uid.
pub(crate) type Wakers = Arc<std::sync::Mutex<HashMap<String, Arc<Notify>>>>;

/// Whether a pod worker must sync again for this new version of its Pod: anything but the
/// status and the bookkeeping of the write itself (resourceVersion, managedFields).
fn needs_sync(current: &Pod, new: &Pod) -> bool {
    let meta = |pod: &Pod| {
        let mut meta = pod.metadata.clone();
        meta.resource_version = None;
        meta.managed_fields = None;
        meta
    };
    current.spec != new.spec || meta(current) != meta(new)
}

/// Status writes one Pod may make: a burst of [`WriteBudget::BURST`] (a Pod's start is a few
/// changes in a row), then one per [`WriteBudget::EVERY`]. A status that keeps changing for any
/// reason costs the store at most that.
#[derive(Debug)]
struct WriteBudget {
    tokens: u32,
    /// When the tokens were last counted.
    at: Instant,
}

impl WriteBudget {
    const BURST: u32 = 5;
    const EVERY: Duration = Duration::from_secs(1);

    fn new(now: Instant) -> Self {
        WriteBudget { tokens: Self::BURST, at: now }
    }

    /// Takes one write; when none is left, the time the next one is.
    fn take(&mut self, now: Instant) -> Result<(), Instant> {
        let earned = now.saturating_duration_since(self.at).as_nanos() / Self::EVERY.as_nanos();
        let earned = u32::try_from(earned).unwrap_or(u32::MAX).min(Self::BURST);
        self.tokens = (self.tokens + earned).min(Self::BURST);
        self.at = if self.tokens == Self::BURST { now } else { self.at + Self::EVERY * earned };
        if self.tokens == 0 {
            return Err(self.at + Self::EVERY);
        }
        self.tokens -= 1;
        Ok(())
    }
}

/// A status without the timestamps that change on every look, to report only real changes.
fn comparable(status: &k8s_openapi::api::core::v1::PodStatus) -> Value {
    let mut v = serde_json::to_value(status).unwrap_or(Value::Null);
    if let Some(conditions) = v.get_mut("conditions").and_then(Value::as_array_mut) {
        for c in conditions {
            if let Some(c) = c.as_object_mut() {
                c.remove("lastProbeTime");
                c.remove("lastTransitionTime");
            }
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(rv: &str, image: &str, phase: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": { "name": "web", "uid": "u-1", "resourceVersion": rv, "labels": { "app": "web" } },
            "spec": { "containers": [{ "name": "web", "image": image }] },
            "status": { "phase": phase },
        }))
        .expect("valid pod")
    }

    #[test]
    fn only_what_the_worker_acts_on_wakes_it() {
        let current = pod("1", "httpd:1", "Pending");
        assert!(!needs_sync(&current, &pod("2", "httpd:1", "Running")), "its own status write");
        assert!(needs_sync(&current, &pod("2", "httpd:2", "Pending")), "a new image");
        let mut relabeled = pod("2", "httpd:1", "Pending");
        relabeled.metadata.labels = Some([("app".to_owned(), "api".to_owned())].into());
        assert!(needs_sync(&current, &relabeled), "labels reach the containers' environment");
        let mut deleting = pod("2", "httpd:1", "Pending");
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        assert!(needs_sync(&current, &deleting));
    }

    #[test]
    fn the_write_budget_is_a_burst_then_one_a_second() {
        let t0 = Instant::now();
        let mut budget = WriteBudget::new(t0);
        for _ in 0..WriteBudget::BURST {
            assert_eq!(budget.take(t0), Ok(()));
        }
        assert_eq!(budget.take(t0), Err(t0 + Duration::from_secs(1)));
        assert_eq!(budget.take(t0 + Duration::from_millis(999)), Err(t0 + Duration::from_secs(1)));
        assert_eq!(budget.take(t0 + Duration::from_secs(1)), Ok(()));
        assert_eq!(budget.take(t0 + Duration::from_millis(1500)), Err(t0 + Duration::from_secs(2)));
        // A status changing at every chance for a minute: the burst, then one a second.
        let mut budget = WriteBudget::new(t0);
        let writes = (0..6000).filter(|i| budget.take(t0 + Duration::from_millis(10 * i)).is_ok()).count();
        assert_eq!(writes, WriteBudget::BURST as usize + 59);
        // Idle time refills the burst, and no more.
        let later = t0 + Duration::from_secs(3600);
        let burst = (0..10).filter(|_| budget.take(later).is_ok()).count();
        assert_eq!(burst, WriteBudget::BURST as usize);
    }

    #[test]
    fn the_grace_of_a_pod_being_deleted() {
        let with = |own: Option<i64>, delete: Option<i64>| {
            let mut p = pod("1", "httpd:1", "Running");
            p.spec.as_mut().unwrap().termination_grace_period_seconds = own;
            p.metadata.deletion_grace_period_seconds = delete;
            deletion_grace_period(&p).as_secs()
        };
        #[rustfmt::skip]
        let cases = [
            ("the delete's grace", Some(30), Some(5), 5),
            ("the Pod's own when the delete says none", Some(7), None, 7),
            ("the default", None, None, 30),
            ("never negative", None, Some(-1), 0),
        ];
        for (what, own, delete, expected) in cases {
            assert_eq!(with(own, delete), expected, "{what}");
        }
    }

    #[test]
    fn failed_syncs_back_off_to_ten_seconds() {
        let waits: Vec<u64> = (1..=7).map(|n| sync_backoff(n).as_secs()).collect();
        assert_eq!(waits, [1, 2, 4, 8, 10, 10, 10]);
    }

    #[test]
    fn a_pod_that_got_an_address_or_ran_has_started() {
        assert!(!started(&pod("1", "httpd:1", "Pending")));
        assert!(started(&pod("1", "httpd:1", "Running")));
        assert!(started(&pod("1", "httpd:1", "Failed")));
        let mut waiting = pod("1", "httpd:1", "Pending");
        waiting.status.as_mut().unwrap().pod_ip = Some("10.244.0.2".into());
        assert!(started(&waiting));
        let mut fresh = pod("1", "httpd:1", "Pending");
        fresh.status = None;
        assert!(!started(&fresh));
    }

    #[test]
    fn timestamps_alone_are_no_change() {
        let status = |time: &str| {
            serde_json::from_value::<k8s_openapi::api::core::v1::PodStatus>(json!({
                "phase": "Running",
                "conditions": [{ "type": "Ready", "status": "True", "lastTransitionTime": time }],
            }))
            .expect("valid status")
        };
        assert_eq!(comparable(&status("2025-01-01T00:00:00Z")), comparable(&status("2025-01-01T00:00:09Z")));
    }
}
