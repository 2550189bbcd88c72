//! The kubelet's kuberuntime manager over CRI: makes the container runtime run a Pod and reports
//! the Pod's observed status. Pure cores ([`spec`]: Pod -> CRI configs, [`actions`]: what to
//! change, [`status`]: runtime -> PodStatus) and this thin I/O shell that observes and acts.
//!
//! Callers serialize calls per pod (one worker per pod uid, as kubelet's pod workers do);
//! different pods may sync concurrently.

pub mod actions;
pub mod calls;
mod cgroups;
pub mod config;
pub mod env;
pub mod failures;
pub mod fields;
pub mod hosts;
pub mod spec;
pub mod status;
pub mod volumes;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::{Container, Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tonic::Code;

pub use actions::{ContainerRunState, PodActions, RuntimeContainer, RuntimePod, RuntimeSandbox, compute_pod_actions};
pub use config::RuntimeConfig;
pub use fields::SpecError;
pub use spec::{container_config, sandbox_config};
pub use status::{Waiting, pod_status};

use crate::events::Recorder;
use crate::kubelet::credentialprovider::Keyring;
use crate::kubelet::cri::{Cri, pb};
use crate::kubelet::prober::{PodProbes, kill_unhealthy};
use crate::kubelet::registries::AuthConfig;
use failures::Failures;
use gitplane_api::events::{NORMAL, WARNING};
use spec::{LABEL_POD_UID, image_pull_policy, pod_cgroup, pod_key, pod_log_directory, pod_spec, pod_uid};

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("pod {pod}: {op}: {}", .source.message())]
    Cri {
        pod: String,
        op: &'static str,
        #[source]
        source: tonic::Status,
    },
    #[error("pod {pod}: {op} did not answer within {timeout:?}")]
    Timeout { pod: String, op: &'static str, timeout: Duration },
    #[error("pod {pod}: {source}")]
    Spec {
        pod: String,
        #[source]
        source: SpecError,
    },
    #[error("pod {pod}: {what}: {source}")]
    Io {
        pod: String,
        what: String,
        #[source]
        source: std::io::Error,
    },
}

impl RuntimeError {
    /// What went wrong, without the Pod's name: for the Pod's own Events and status.
    pub fn cause(&self) -> String {
        match self {
            RuntimeError::Cri { op, source, .. } => format!("{op}: {}", source.message()),
            RuntimeError::Timeout { op, timeout, .. } => format!("{op} did not answer within {timeout:?}"),
            RuntimeError::Spec { source, .. } => source.to_string(),
            RuntimeError::Io { what, source, .. } => format!("{what}: {source}"),
        }
    }
}

pub struct RuntimeManager {
    cri: Cri,
    cfg: RuntimeConfig,
    /// Why containers could not be started: their waiting reasons, and the image pull back-off.
    failures: Mutex<Failures>,
    calls: calls::CriCalls,
    /// The ConfigMaps and Secrets Pods reference (env, volumes).
    objects: std::sync::Arc<dyn env::ConfigSource>,
    /// Pulling, Pulled, Created, Started, Killing, BackOff, FailedMount, as the kubelet's.
    events: Recorder,
    /// (pod uid, volume) set up since this process started: the kubelet's mounted volumes.
    mounted: Mutex<HashSet<(String, String)>>,
}

impl RuntimeManager {
    pub async fn new(cri: Cri, cfg: RuntimeConfig) -> Self {
        let mut cfg = cfg;
        if cfg.node_memory_bytes.is_none() {
            cfg.node_memory_bytes = tokio::fs::read_to_string("/proc/meminfo").await.ok().and_then(|m| mem_total(&m));
        }
        // runc's `apparmor.IsEnabled`, as the kubelet asks it.
        let apparmor = tokio::fs::read_to_string("/sys/module/apparmor/parameters/enabled").await;
        cfg.host.apparmor = apparmor.is_ok_and(|enabled| enabled.starts_with('Y'));
        RuntimeManager {
            cri,
            cfg,
            failures: Mutex::default(),
            calls: calls::CriCalls::default(),
            objects: std::sync::Arc::new(env::NoConfig),
            events: Recorder::disabled(),
            mounted: Mutex::default(),
        }
    }

    /// Where the node's Events go.
    pub fn events(&self) -> &Recorder {
        &self.events
    }

    /// Records the runtime's Events through `events` (without: none are recorded).
    pub fn with_events(mut self, events: Recorder) -> Self {
        self.events = events;
        self
    }

    /// Reads ConfigMaps and Secrets from `objects` (without: none exist).
    pub fn with_config_source(mut self, objects: std::sync::Arc<dyn env::ConfigSource>) -> Self {
        self.objects = objects;
        self
    }

    pub fn config(&self) -> &RuntimeConfig {
        &self.cfg
    }

    /// Every CRI call made so far, per operation.
    pub fn cri_calls(&self) -> std::collections::BTreeMap<&'static str, calls::CallStats> {
        self.calls.snapshot()
    }

    /// Kubelet's SyncPod: makes the runtime match `pod` (sandbox, then each container that
    /// should run under its restartPolicy; a container that failed its liveness or startup
    /// probe is killed first) and returns the observed status. Idempotent.
    pub async fn sync_pod(&self, pod: &Pod, probes: &PodProbes) -> Result<PodStatus, RuntimeError> {
        let key = pod_key(pod);
        let spec_err = |source| RuntimeError::Spec { pod: key.clone(), source };
        let uid = pod_uid(pod).map_err(spec_err)?;
        let spec = pod_spec(pod).map_err(spec_err)?;
        // Volumes before the sandbox, as the kubelet waits for them before it creates one.
        let set_up = volumes::has_volumes(pod).then(|| {
            let mounted = |volume: &str| self.lock_mounted().contains(&(uid.to_owned(), volume.to_owned()));
            volumes::set_up(pod, uid, &self.cfg, &*self.objects, &mounted)
        });
        if let Some(Ok(mounting)) = &set_up {
            self.lock_mounted().extend(mounting.iter().map(|volume| (uid.to_owned(), volume.clone())));
        }
        if let Some(Err(e)) = set_up {
            let waiting = Waiting { reason: "ContainerCreating".into(), message: e.to_string() };
            self.events.pod(pod, WARNING, "FailedMount", &waiting.message);
            {
                let mut failures = self.lock_failures();
                for c in &spec.containers {
                    failures.record(uid, &c.name, c.image.as_deref().unwrap_or_default(), waiting.clone());
                }
            }
            return self.pod_status(pod, probes).await;
        }

        let runtime = self.observe(&key, uid).await?;
        let started = |run: &RuntimeContainer| probes.started(&run.name, &run.id);
        let mut actions = compute_pod_actions(pod, &runtime, now_nanos(), &started);
        let unhealthy = kill_unhealthy(pod, &runtime, probes, now_nanos(), &mut actions);
        tracing::debug!(pod = %key, ?actions, "sync pod");
        let grace = grace_period(pod);

        for kill in &unhealthy {
            tracing::info!(pod = %key, container = %kill.name, id = %kill.id, grace = ?kill.grace, "{}", kill.message());
            self.events.pod(pod, NORMAL, "Killing", &kill.message());
            let run: Vec<&RuntimeContainer> = runtime.containers.iter().filter(|c| c.id == kill.id).collect();
            self.stop_containers(&key, &run, kill.grace).await?;
        }
        let kill: Vec<&RuntimeContainer> =
            actions.kill_containers.iter().filter_map(|id| runtime.containers.iter().find(|c| &c.id == id)).collect();
        for c in &kill {
            self.events.pod(pod, NORMAL, "Killing", &format!("Stopping container {}", c.name));
        }
        self.stop_in_order(&key, &kill, &spec::sidecar_names(pod), grace).await?;
        for id in &actions.stop_sandboxes {
            self.stop_sandbox(&key, id).await?;
        }
        for id in &actions.remove_containers {
            let req = pb::RemoveContainerRequest { container_id: id.clone() };
            ignore_not_found(self.call(&key, "RemoveContainer", None, self.cri.runtime().remove_container(req)).await)?;
        }
        for id in &actions.remove_sandboxes {
            let req = pb::RemovePodSandboxRequest { pod_sandbox_id: id.clone() };
            ignore_not_found(
                self.call(&key, "RemovePodSandbox", None, self.cri.runtime().remove_pod_sandbox(req)).await,
            )?;
        }

        let sandbox = match (actions.create_sandbox, runtime.current_sandbox()) {
            (Some(attempt), _) => Some(self.run_sandbox(pod, &key, attempt).await?),
            (None, Some(current)) => Some(current.clone()),
            (None, None) => None,
        };
        if let Some(sandbox) = sandbox {
            let sandbox_config = sandbox_config(pod, &self.cfg, sandbox.attempt).map_err(spec_err)?;
            for id in &actions.start_created {
                let req = pb::StartContainerRequest { container_id: id.clone() };
                if let Err(e) = self.call(&key, "StartContainer", None, self.cri.runtime().start_container(req)).await {
                    tracing::warn!(pod = %key, container = %id, error = %e, "start of created container failed");
                }
            }
            for (name, attempt) in &actions.start_containers {
                let mut all = spec.containers.iter().chain(spec.init_containers.iter().flatten());
                let Some(container) = all.find(|c| &c.name == name) else {
                    continue;
                };
                let backoff = actions::backoff_before_run(&runtime, container);
                let run = Run { attempt: *attempt, backoff, grace };
                self.start_container(pod, &key, uid, container, run, &sandbox, &sandbox_config).await?;
            }
        }
        let status = self.pod_status(pod, probes).await?;
        self.record_back_off(pod, &status);
        Ok(status)
    }

    /// The kubelet's BackOff Events, on every sync that finds a container waiting out a back-off
    /// (counted on one Event per container and reason by the control plane).
    fn record_back_off(&self, pod: &Pod, status: &PodStatus) {
        let statuses = status.init_container_statuses.iter().chain(status.container_statuses.iter()).flatten();
        for c in statuses {
            let reason = c.state.as_ref().and_then(|s| s.waiting.as_ref()).and_then(|w| w.reason.as_deref());
            let message = match reason {
                Some("CrashLoopBackOff") => format!(
                    "Back-off restarting failed container {} in pod {}_{}({})",
                    c.name,
                    pod.metadata.name.as_deref().unwrap_or(""),
                    pod.metadata.namespace.as_deref().unwrap_or(""),
                    pod.metadata.uid.as_deref().unwrap_or("")
                ),
                Some("ImagePullBackOff") => format!("Back-off pulling image {:?}", c.image),
                _ => continue,
            };
            let type_ = if reason == Some("CrashLoopBackOff") { WARNING } else { NORMAL };
            self.events.pod(pod, type_, "BackOff", &message);
        }
    }

    /// A Pod whose sync failed (`error`) before its sandbox ran, as the kubelet reports it: a
    /// `FailedCreatePodSandBox` Event, and the status it has without the runtime (Pending, its
    /// containers waiting) with a PodReadyToStartContainers condition that says why.
    pub fn sandbox_failed(&self, pod: &Pod, probes: &PodProbes, error: &RuntimeError) -> Option<PodStatus> {
        let message = format!("Failed to create pod sandbox: {}", error.cause());
        self.events.pod(pod, WARNING, "FailedCreatePodSandBox", &message);
        let uid = pod_uid(pod).ok()?;
        let waiting = self.lock_failures().waiting(uid);
        let mut status = pod_status(pod, &RuntimePod::default(), &waiting, self.cfg.node_ip.as_deref(), probes);
        status::sandbox_failed(&mut status, &message);
        status::keep_transition_times(pod.status.as_ref(), &mut status, Time(k8s_openapi::jiff::Timestamp::now()));
        Some(status)
    }

    /// The observed status of `pod`.
    pub async fn pod_status(&self, pod: &Pod, probes: &PodProbes) -> Result<PodStatus, RuntimeError> {
        let key = pod_key(pod);
        let uid = pod_uid(pod).map_err(|source| RuntimeError::Spec { pod: key.clone(), source })?;
        let runtime = self.observe(&key, uid).await?;
        let waiting = self.lock_failures().waiting(uid);
        let mut status = pod_status(pod, &runtime, &waiting, self.cfg.node_ip.as_deref(), probes);
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        status::keep_transition_times(pod.status.as_ref(), &mut status, now);
        Ok(status)
    }

    /// Kills the pod: stops its containers within `grace` after SIGTERM, its `sidecars` (by name,
    /// in the spec's order) after the others, stops and removes every sandbox of `uid`, then
    /// removes the pod's cgroups, emptyDirs and logs.
    pub async fn kill_pod(&self, uid: &str, grace: Duration, sidecars: &[String]) -> Result<(), RuntimeError> {
        let key = format!("uid {uid}");
        // The uid names directories that are removed below.
        fields::safe_name("uid", uid).map_err(|source| RuntimeError::Spec { pod: key.clone(), source })?;
        let selector = HashMap::from([(LABEL_POD_UID.to_string(), uid.to_string())]);
        let req = pb::ListContainersRequest {
            filter: Some(pb::ContainerFilter { label_selector: selector.clone(), ..Default::default() }),
        };
        let containers = self.call(&key, "ListContainers", None, self.cri.runtime().list_containers(req)).await?;
        let alive: Vec<RuntimeContainer> = containers
            .containers
            .into_iter()
            .filter(|c| c.state != pb::ContainerState::ContainerExited as i32)
            .map(|c| RuntimeContainer {
                pre_stop: spec::pre_stop_hook(&c.annotations),
                name: c.metadata.map(|m| m.name).unwrap_or_default(),
                id: c.id,
                ..RuntimeContainer::default()
            })
            .collect();
        self.stop_in_order(&key, &alive.iter().collect::<Vec<_>>(), sidecars, grace).await?;

        let req = pb::ListPodSandboxRequest {
            filter: Some(pb::PodSandboxFilter { label_selector: selector, ..Default::default() }),
        };
        let sandboxes = self.call(&key, "ListPodSandbox", None, self.cri.runtime().list_pod_sandbox(req)).await?;
        for sandbox in sandboxes.items {
            self.stop_sandbox(&key, &sandbox.id).await?;
            let req = pb::RemovePodSandboxRequest { pod_sandbox_id: sandbox.id.clone() };
            ignore_not_found(
                self.call(&key, "RemovePodSandbox", None, self.cri.runtime().remove_pod_sandbox(req)).await,
            )?;
        }
        self.lock_failures().forget_pod(uid);
        self.lock_mounted().retain(|(pod, _)| pod != uid);

        let cgroup = pod_cgroup(&self.cfg, uid);
        let io = |what: String| {
            let pod = key.clone();
            move |source| RuntimeError::Io { pod, what, source }
        };
        tokio::task::spawn_blocking(move || cgroups::remove_cgroup(&cgroup, Duration::from_secs(2)))
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))
            .and_then(|r| r)
            .map_err(io("removing the pod's cgroups".into()))?;
        let pod_dir = self.cfg.pod_dir.join(uid);
        volumes::tear_down(&pod_dir).map_err(io(format!("unmounting the volumes under {}", pod_dir.display())))?;
        remove_dir_all(&pod_dir).map_err(io(format!("removing {}", pod_dir.display())))?;
        if let Ok(entries) = std::fs::read_dir(&self.cfg.pod_log_dir) {
            let suffix = format!("_{uid}");
            for entry in entries.flatten() {
                if entry.file_name().to_string_lossy().ends_with(&suffix) {
                    remove_dir_all(&entry.path()).map_err(io(format!("removing {}", entry.path().display())))?;
                }
            }
        }
        tracing::info!(uid, "killed pod");
        Ok(())
    }

    /// Stops the Pod's running containers within `grace` (its sidecars last) and returns its
    /// status then, with their exit codes: the kubelet's terminating step for a Pod that must
    /// not run again (an evicted one), before [`Self::kill_pod`] removes it.
    pub async fn stop_pod(&self, pod: &Pod, grace: Duration, probes: &PodProbes) -> Result<PodStatus, RuntimeError> {
        let key = pod_key(pod);
        let uid = pod_uid(pod).map_err(|source| RuntimeError::Spec { pod: key.clone(), source })?;
        let runtime = self.observe(&key, uid).await?;
        let alive: Vec<&RuntimeContainer> = runtime
            .containers
            .iter()
            .filter(|c| matches!(c.state, ContainerRunState::Running | ContainerRunState::Created))
            .collect();
        self.stop_in_order(&key, &alive, &spec::sidecar_names(pod), grace).await?;
        self.pod_status(pod, probes).await
    }

    /// The bytes of each container's writable layer, by pod uid and container name (the newest
    /// run of each), from one CRI `ListContainerStats`; a container the runtime reports no
    /// layer for is left out.
    pub async fn writable_layers(&self) -> Result<HashMap<String, HashMap<String, u64>>, RuntimeError> {
        let req = pb::ListContainerStatsRequest { filter: None };
        let listed =
            self.call("(all)", "ListContainerStats", None, self.cri.runtime().list_container_stats(req)).await?;
        let mut newest: HashMap<(String, String), (u32, u64)> = HashMap::new();
        for stats in listed.stats {
            let (Some(attributes), Some(layer)) = (stats.attributes, stats.writable_layer) else { continue };
            let (Some(uid), Some(metadata), Some(used)) =
                (attributes.labels.get(LABEL_POD_UID), attributes.metadata, layer.used_bytes)
            else {
                continue;
            };
            let entry = newest.entry((uid.clone(), metadata.name)).or_insert((metadata.attempt, used.value));
            if metadata.attempt >= entry.0 {
                *entry = (metadata.attempt, used.value);
            }
        }
        let mut layers: HashMap<String, HashMap<String, u64>> = HashMap::new();
        for ((uid, name), (_, bytes)) in newest {
            layers.entry(uid).or_default().insert(name, bytes);
        }
        Ok(layers)
    }

    /// The kubelet's orphaned pod cgroup cleanup: removes the cgroups of pods that have no
    /// sandbox in the runtime and are not in `keep` (the pods this node runs). A runtime call
    /// cut off mid-way (a CRI deadline, an agent stopping) can still create a pod's cgroup
    /// after the pod was killed. Returns the uids removed.
    pub async fn remove_orphaned_cgroups(&self, keep: &HashSet<String>) -> Result<Vec<String>, RuntimeError> {
        let parent = self.cfg.cgroup_parent.clone();
        let io = |source| RuntimeError::Io { pod: "(all)".into(), what: "listing pod cgroups".into(), source };
        let found = tokio::task::spawn_blocking(move || cgroups::pod_cgroup_uids(&parent))
            .await
            .map_err(|e| io(std::io::Error::other(e.to_string())))?
            .map_err(io)?;
        let mut orphans: Vec<String> = found.into_iter().filter(|uid| !keep.contains(uid)).collect();
        if orphans.is_empty() {
            return Ok(orphans);
        }
        let running: HashSet<String> = self.pod_uids().await?.into_iter().collect();
        orphans.retain(|uid| !running.contains(uid) && fields::safe_name("uid", uid).is_ok());
        let cgroups: Vec<String> = orphans.iter().map(|uid| pod_cgroup(&self.cfg, uid)).collect();
        tokio::task::spawn_blocking(move || {
            for cgroup in cgroups {
                if let Err(error) = cgroups::remove_cgroup(&cgroup, Duration::from_millis(200)) {
                    tracing::warn!(%cgroup, %error, "removing an orphaned pod cgroup failed");
                }
            }
        })
        .await
        .map_err(|e| io(std::io::Error::other(e.to_string())))?;
        Ok(orphans)
    }

    /// What the runtime holds, as one fingerprint per pod uid (its sandboxes' and containers'
    /// ids and states): the kubelet's PLEG relist, two list calls for the whole node, so that
    /// pod workers are woken by a change instead of each polling the runtime.
    pub async fn relist(&self) -> Result<HashMap<String, u64>, RuntimeError> {
        use std::hash::{DefaultHasher, Hash as _, Hasher as _};
        let req = pb::ListPodSandboxRequest { filter: None };
        let sandboxes = self.call("(all)", "ListPodSandbox", None, self.cri.runtime().list_pod_sandbox(req)).await?;
        let req = pb::ListContainersRequest { filter: None };
        let containers = self.call("(all)", "ListContainers", None, self.cri.runtime().list_containers(req)).await?;
        let mut states: HashMap<String, Vec<(String, i32)>> = HashMap::new();
        let sandboxes = sandboxes.items.into_iter().map(|s| (s.labels, s.id, s.state));
        let containers = containers.containers.into_iter().map(|c| (c.labels, c.id, c.state));
        for (labels, id, state) in sandboxes.chain(containers) {
            if let Some(uid) = labels.get(LABEL_POD_UID) {
                states.entry(uid.clone()).or_default().push((id, state));
            }
        }
        Ok(states
            .into_iter()
            .map(|(uid, mut states)| {
                states.sort();
                let mut hasher = DefaultHasher::new();
                states.hash(&mut hasher);
                (uid, hasher.finish())
            })
            .collect())
    }

    /// The runtime's conditions (CRI `Status`: RuntimeReady, NetworkReady), within `timeout`.
    pub async fn status(&self, timeout: Duration) -> Result<Vec<pb::RuntimeCondition>, RuntimeError> {
        let req = pb::StatusRequest { verbose: false };
        let status = self.call("(all)", "Status", Some(timeout), self.cri.runtime().status(req)).await?;
        Ok(status.status.map(|s| s.conditions).unwrap_or_default())
    }

    /// The images the runtime holds, as a Node lists them.
    pub async fn images(&self) -> Result<Vec<k8s_openapi::api::core::v1::ContainerImage>, RuntimeError> {
        let req = pb::ListImagesRequest { filter: None };
        let listed = self.call("(all)", "ListImages", None, self.cri.images().list_images(req)).await?;
        Ok(listed
            .images
            .into_iter()
            .map(|image| k8s_openapi::api::core::v1::ContainerImage {
                names: Some(image.repo_digests.into_iter().chain(image.repo_tags).collect()),
                size_bytes: i64::try_from(image.size).ok(),
            })
            .collect())
    }

    /// The uids of pods that have any sandbox in the runtime.
    pub async fn pod_uids(&self) -> Result<Vec<String>, RuntimeError> {
        let req = pb::ListPodSandboxRequest { filter: None };
        let sandboxes = self.call("(all)", "ListPodSandbox", None, self.cri.runtime().list_pod_sandbox(req)).await?;
        let mut uids: Vec<String> =
            sandboxes.items.into_iter().filter_map(|s| s.labels.get(LABEL_POD_UID).cloned()).collect();
        uids.sort();
        uids.dedup();
        Ok(uids)
    }

    /// Reads everything the runtime holds for pod `uid`.
    async fn observe(&self, key: &str, uid: &str) -> Result<RuntimePod, RuntimeError> {
        let selector = HashMap::from([(LABEL_POD_UID.to_string(), uid.to_string())]);
        let req = pb::ListPodSandboxRequest {
            filter: Some(pb::PodSandboxFilter { label_selector: selector.clone(), ..Default::default() }),
        };
        let listed = self.call(key, "ListPodSandbox", None, self.cri.runtime().list_pod_sandbox(req)).await?;
        let mut sandboxes: Vec<RuntimeSandbox> = listed
            .items
            .into_iter()
            .map(|s| RuntimeSandbox {
                ready: s.state == pb::PodSandboxState::SandboxReady as i32,
                attempt: s.metadata.map(|m| m.attempt).unwrap_or(0),
                created_at: s.created_at,
                id: s.id,
                ips: Vec::new(),
            })
            .collect();
        let current =
            RuntimePod { sandboxes: sandboxes.clone(), containers: Vec::new() }.current_sandbox().map(|s| s.id.clone());
        if let Some(id) = current {
            let ips = self.sandbox_ips(key, &id).await?;
            if let Some(s) = sandboxes.iter_mut().find(|s| s.id == id) {
                s.ips = ips;
            }
        }

        let req = pb::ListContainersRequest {
            filter: Some(pb::ContainerFilter { label_selector: selector, ..Default::default() }),
        };
        let listed = self.call(key, "ListContainers", None, self.cri.runtime().list_containers(req)).await?;
        let statuses = futures::future::join_all(listed.containers.into_iter().map(|c| async move {
            let req = pb::ContainerStatusRequest { container_id: c.id.clone(), verbose: false };
            let status = self.call(key, "ContainerStatus", None, self.cri.runtime().container_status(req)).await;
            (c, status)
        }))
        .await;
        let mut containers = Vec::new();
        for (listed, status) in statuses {
            // A container removed between the list and its status is simply gone.
            let Some(status) = ignore_not_found(status)?.and_then(|s| s.status) else {
                continue;
            };
            containers.push(runtime_container(listed.pod_sandbox_id, status));
        }
        Ok(RuntimePod { sandboxes, containers })
    }

    async fn sandbox_ips(&self, key: &str, id: &str) -> Result<Vec<String>, RuntimeError> {
        let req = pb::PodSandboxStatusRequest { pod_sandbox_id: id.to_string(), verbose: false };
        let status = ignore_not_found(
            self.call(key, "PodSandboxStatus", None, self.cri.runtime().pod_sandbox_status(req)).await,
        )?;
        let network = status.and_then(|s| s.status).and_then(|s| s.network);
        Ok(network
            .map(|n| {
                std::iter::once(n.ip)
                    .chain(n.additional_ips.into_iter().map(|ip| ip.ip))
                    .filter(|ip| !ip.is_empty())
                    .collect()
            })
            .unwrap_or_default())
    }

    async fn run_sandbox(&self, pod: &Pod, key: &str, attempt: u32) -> Result<RuntimeSandbox, RuntimeError> {
        let config =
            sandbox_config(pod, &self.cfg, attempt).map_err(|source| RuntimeError::Spec { pod: key.into(), source })?;
        let log_dir =
            pod_log_directory(&self.cfg, pod).map_err(|source| RuntimeError::Spec { pod: key.into(), source })?;
        std::fs::create_dir_all(&log_dir).map_err(|source| RuntimeError::Io {
            pod: key.into(),
            what: format!("creating {}", log_dir.display()),
            source,
        })?;
        let started = Instant::now();
        let req = pb::RunPodSandboxRequest { config: Some(config), runtime_handler: String::new() };
        let id = self.call(key, "RunPodSandbox", None, self.cri.runtime().run_pod_sandbox(req)).await?.pod_sandbox_id;
        let ips = self.sandbox_ips(key, &id).await?;
        tracing::info!(pod = %key, sandbox = %id, attempt, ?ips, elapsed = ?started.elapsed(), "started pod sandbox");
        Ok(RuntimeSandbox { id, attempt, ready: true, created_at: now_nanos(), ips })
    }

    /// Image, CreateContainer, StartContainer for one run of a container. Failures that are the
    /// container's (image, config, start) become its waiting reason, not an error of the sync.
    #[allow(clippy::too_many_arguments)]
    async fn start_container(
        &self,
        pod: &Pod,
        key: &str,
        uid: &str,
        container: &Container,
        run: Run,
        sandbox: &RuntimeSandbox,
        sandbox_config: &pb::PodSandboxConfig,
    ) -> Result<(), RuntimeError> {
        let attempt = run.attempt;
        let image = container.image.as_deref().unwrap_or_default();
        let record = |waiting| self.lock_failures().record(uid, &container.name, image, waiting);
        let mut plan = match container_config(pod, container, &self.cfg, attempt, &sandbox.ips, &*self.objects) {
            Ok(plan) => plan,
            Err(e) => {
                let message = e.to_string();
                self.events.pod(pod, WARNING, "Failed", &format!("Error: {message}"));
                record(Waiting { reason: "CreateContainerConfigError".into(), message });
                return Ok(());
            }
        };
        let waited_for = self.lock_failures().reason(uid, &container.name);
        if let Err(waiting) = self.ensure_image(pod, key, uid, container, sandbox_config).await? {
            // Logged when the reason changes: a back-off seen again at every resync is not news.
            if waited_for.as_deref() != Some(waiting.reason.as_str()) {
                tracing::info!(pod = %key, container = %container.name, reason = %waiting.reason, message = %waiting.message, "image not available");
            }
            return Ok(());
        }
        if let Err(e) = self.verify_run_as_non_root(pod, key, container).await? {
            let message = e.to_string();
            self.events.pod(pod, WARNING, "Failed", &format!("Error: {message}"));
            record(Waiting { reason: "CreateContainerConfigError".into(), message });
            return Ok(());
        }
        for dir in &plan.host_dirs {
            std::fs::create_dir_all(dir).map_err(|source| RuntimeError::Io {
                pod: key.into(),
                what: format!("creating {}", dir.display()),
                source,
            })?;
        }
        if let Some((path, file)) = &plan.hosts_file {
            let content = file.content(|| std::fs::read_to_string(hosts::NODE_HOSTS).unwrap_or_default());
            write_hosts_file(path, &content).map_err(|source| RuntimeError::Io {
                pod: key.into(),
                what: format!("writing {}", path.display()),
                source,
            })?;
        }
        plan.config.annotations.insert(spec::ANNOTATION_RESTART_BACKOFF.into(), run.backoff.as_secs().to_string());
        let req = pb::CreateContainerRequest {
            pod_sandbox_id: sandbox.id.clone(),
            config: Some(plan.config),
            sandbox_config: Some(sandbox_config.clone()),
        };
        let id = match self.call(key, "CreateContainer", None, self.cri.runtime().create_container(req)).await {
            Ok(created) => {
                self.events.pod(pod, NORMAL, "Created", &format!("Created container: {}", container.name));
                created.container_id
            }
            Err(RuntimeError::Cri { source, .. }) => {
                self.events.pod(pod, WARNING, "Failed", &format!("Error: {}", source.message()));
                record(Waiting { reason: "CreateContainerError".into(), message: source.message().to_string() });
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        let req = pb::StartContainerRequest { container_id: id.clone() };
        match self.call(key, "StartContainer", None, self.cri.runtime().start_container(req)).await {
            Ok(_) => {
                tracing::info!(pod = %key, container = %container.name, id = %id, attempt, "started container");
                self.events.pod(pod, NORMAL, "Started", &format!("Started container {}", container.name));
                self.lock_failures().forget(uid, &container.name);
                let lifecycle = container.lifecycle.as_ref();
                if let Some(command) = spec::exec_hook(lifecycle.and_then(|l| l.post_start.as_ref()))
                    && let Err(error) = self.exec_hook(key, &id, &command, self.cfg.cri_timeout).await
                {
                    // kubelet kills a container whose postStart hook failed (FailedPostStartHook).
                    let message = format!(
                        "Exec lifecycle hook ({command:?}) for Container {:?} in Pod {key:?} failed - {error}",
                        container.name
                    );
                    tracing::info!(pod = %key, container = %container.name, %message, "postStart hook failed");
                    record(Waiting { reason: "PostStartHookError".into(), message });
                    let pre_stop = spec::exec_hook(lifecycle.and_then(|l| l.pre_stop.as_ref()));
                    let started = RuntimeContainer { id, pre_stop, ..RuntimeContainer::default() };
                    self.stop_containers(key, &[&started], run.grace).await?;
                }
                Ok(())
            }
            Err(RuntimeError::Cri { source, .. }) => {
                self.events.pod(pod, WARNING, "Failed", &format!("Error: {}", source.message()));
                record(Waiting { reason: "RunContainerError".into(), message: source.message().to_string() });
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// The kubelet's runAsNonRoot check, once the image is here: its user comes from the runtime's
    /// ImageStatus (the image config's `User`) when the container sets no `runAsUser`.
    async fn verify_run_as_non_root(
        &self,
        pod: &Pod,
        key: &str,
        container: &Container,
    ) -> Result<Result<(), SpecError>, RuntimeError> {
        let spec = pod_spec(pod).map_err(|source| RuntimeError::Spec { pod: key.into(), source })?;
        let (mut uid, mut username) = (None, String::new());
        if spec::needs_image_user(spec, container) {
            let image = container.image.clone().unwrap_or_default();
            let spec = pb::ImageSpec { image: image.clone(), user_specified_image: image, ..Default::default() };
            let req = pb::ImageStatusRequest { image: Some(spec), verbose: false };
            let status = self.call(key, "ImageStatus", None, self.cri.images().image_status(req)).await?;
            if let Some(image) = status.image {
                uid = image.uid.map(|u| u.value);
                username = image.username;
            }
        }
        Ok(spec::verify_run_as_non_root(pod, container, uid, &username))
    }

    /// kubelet's EnsureImageExists: ImageStatus first (PullImage always goes to a registry),
    /// then honour imagePullPolicy. `Ok(Err(waiting))`: the container waits for its image.
    async fn ensure_image(
        &self,
        pod: &Pod,
        key: &str,
        uid: &str,
        container: &Container,
        sandbox_config: &pb::PodSandboxConfig,
    ) -> Result<Result<(), Waiting>, RuntimeError> {
        let image = container.image.clone().unwrap_or_default();
        let record = |waiting: Waiting| {
            self.lock_failures().record(uid, &container.name, &image, waiting.clone());
            Ok(Err(waiting))
        };
        let spec = pb::ImageSpec { image: image.clone(), user_specified_image: image.clone(), ..Default::default() };
        let policy = image_pull_policy(container);
        let req = pb::ImageStatusRequest { image: Some(spec.clone()), verbose: false };
        let present = match self.call(key, "ImageStatus", None, self.cri.images().image_status(req)).await {
            Ok(status) => status.image.is_some(),
            Err(RuntimeError::Cri { source, .. }) => {
                return record(Waiting {
                    reason: "ImageInspectError".into(),
                    message: format!("Failed to inspect image {image:?}: {}", source.message()),
                });
            }
            Err(e) => return Err(e),
        };
        if present && policy != "Always" {
            let message = format!("Container image {image:?} already present on machine");
            self.events.pod(pod, NORMAL, "Pulled", &message);
            return Ok(Ok(()));
        }
        if policy == "Never" {
            return record(Waiting {
                reason: "ErrImageNeverPull".into(),
                message: format!("Container image {image:?} is not present with pull policy of Never"),
            });
        }
        if let Some(waiting) = self.lock_failures().backing_off(uid, &container.name, &image, Instant::now()) {
            return Ok(Err(waiting));
        }

        let fail = |error: String| -> Result<Result<(), Waiting>, RuntimeError> {
            self.events.pod(pod, WARNING, "Failed", &format!("Failed to pull image {image:?}: {error}"));
            Ok(Err(self.lock_failures().pull_failed(uid, &container.name, &image, &error, Instant::now())))
        };
        // The kubelet's keyring: the Pod's pull Secrets first, then the node's own credentials;
        // each is tried in turn, and without any the pull is anonymous.
        let auths = match self.pull_credentials(pod, &image) {
            Ok(auths) if auths.is_empty() => vec![None],
            Ok(auths) => auths.into_iter().map(|a| Some(cri_auth(a))).collect(),
            Err(error) => return fail(error),
        };
        let started = Instant::now();
        self.events.pod(pod, NORMAL, "Pulling", &format!("Pulling image {image:?}"));
        let timeout = self.cfg.image_pull_timeout;
        let mut errors = Vec::new();
        for auth in auths {
            let req =
                pb::PullImageRequest { image: Some(spec.clone()), auth, sandbox_config: Some(sandbox_config.clone()) };
            match self.call(key, "PullImage", Some(timeout), self.cri.images().pull_image(req)).await {
                Ok(pulled) => {
                    tracing::info!(pod = %key, image, image_ref = %pulled.image_ref, elapsed = ?started.elapsed(), "pulled image");
                    let message = format!("Successfully pulled image {image:?} in {:?}", started.elapsed());
                    self.events.pod(pod, NORMAL, "Pulled", &message);
                    return Ok(Ok(()));
                }
                Err(RuntimeError::Cri { source, .. }) => errors.push(failures::without_source_ports(source.message())),
                Err(RuntimeError::Timeout { .. }) => {
                    errors.push(format!("pulling image {image:?} did not finish within {timeout:?}"))
                }
                Err(e) => return Err(e),
            }
        }
        // As the kubelet's aggregate error says several.
        let error = match errors.len() {
            1 => errors.remove(0),
            _ => format!("[{}]", errors.join(", ")),
        };
        fail(error)
    }

    /// The credentials to pull `image` for `pod` with, in the order to try them: those of its
    /// image pull Secrets that match the image, then the node's (`--registries`). A Secret that
    /// is not here is a warning Event and the pull goes on without it, as the kubelet does; one
    /// whose data is not a Docker config fails the pull.
    fn pull_credentials(&self, pod: &Pod, image: &str) -> Result<Vec<AuthConfig>, String> {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let names = pod.spec.iter().flat_map(|s| s.image_pull_secrets.iter().flatten()).map(|r| r.name.as_str());
        let (mut secrets, mut missing) = (Vec::new(), Vec::new());
        for name in names.filter(|n| !n.is_empty()) {
            match self.objects.secret(namespace, name) {
                Some(secret) => secrets.push(secret),
                None => missing.push(name),
            }
        }
        if !missing.is_empty() {
            let message = format!(
                "Unable to retrieve some image pull secrets ({}); attempting to pull the image may not succeed.",
                missing.join(", ")
            );
            self.events.pod(pod, WARNING, "FailedToRetrieveImagePullSecret", &message);
        }
        let keyring = Keyring::from_secrets(secrets.iter().map(|s| &**s))?;
        let mut auths = keyring.lookup(image);
        auths.extend(self.cfg.registries.auth_for(image));
        Ok(auths)
    }

    fn lock_mounted(&self) -> MutexGuard<'_, HashSet<(String, String)>> {
        self.mounted.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn lock_failures(&self) -> MutexGuard<'_, Failures> {
        // The map holds no invariant a panicking holder could break; keep going.
        self.failures.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Stops `containers` in [`actions::stop_order`]: the sidecars (named in `sidecars`) after
    /// the others, the last first, all within `grace` (each group gets what is left of it, and
    /// at least the minimum).
    async fn stop_in_order(
        &self,
        key: &str,
        containers: &[&RuntimeContainer],
        sidecars: &[String],
        grace: Duration,
    ) -> Result<(), RuntimeError> {
        let started = Instant::now();
        for group in actions::stop_order(containers, sidecars) {
            self.stop_containers(key, &group, grace.saturating_sub(started.elapsed())).await?;
        }
        Ok(())
    }

    /// kubelet's killContainer, for each container at once: its preStop hook, then SIGTERM and
    /// SIGKILL once `grace` (less what the hook took, at least 2 s) is over.
    async fn stop_containers(
        &self,
        key: &str,
        containers: &[&RuntimeContainer],
        grace: Duration,
    ) -> Result<(), RuntimeError> {
        let results = futures::future::join_all(containers.iter().map(|c| async move {
            let started = Instant::now();
            if let Some(command) = c.pre_stop.as_ref().filter(|_| !grace.is_zero())
                && let Err(error) = self.exec_hook(key, &c.id, command, grace).await
            {
                tracing::info!(pod = %key, container = %c.id, ?command, %error, "preStop hook failed");
            }
            let grace = grace.saturating_sub(started.elapsed()).max(MIN_GRACE_PERIOD);
            let req = pb::StopContainerRequest { container_id: c.id.clone(), timeout: whole_seconds(grace) };
            self.call(key, "StopContainer", Some(grace + self.cfg.cri_timeout), self.cri.runtime().stop_container(req))
                .await
        }))
        .await;
        for result in results {
            ignore_not_found(result)?;
        }
        Ok(())
    }

    /// Runs a lifecycle hook's command in container `id` (CRI ExecSync), for at most `timeout`.
    /// `Err` says why it failed: the runtime's error, or the command's exit code and output.
    async fn exec_hook(&self, key: &str, id: &str, command: &[String], timeout: Duration) -> Result<(), String> {
        let req = pb::ExecSyncRequest {
            container_id: id.to_string(),
            cmd: command.to_vec(),
            timeout: whole_seconds(timeout),
        };
        // containerd ends the command at its timeout; the call's own deadline is a backstop.
        let deadline = Some(timeout + Duration::from_secs(5));
        match self.call(key, "ExecSync", deadline, self.cri.runtime().exec_sync(req)).await {
            Ok(done) if done.exit_code == 0 => Ok(()),
            Ok(done) => Err(format!(
                "error: command {:?} exited with {}: {}, message: {:?}",
                command.join(" "),
                done.exit_code,
                String::from_utf8_lossy(&done.stderr).trim(),
                String::from_utf8_lossy(&done.stdout).trim(),
            )),
            Err(RuntimeError::Cri { source, .. }) => Err(format!("error: {}", source.message())),
            Err(e) => Err(format!("error: {e}")),
        }
    }

    async fn stop_sandbox(&self, key: &str, id: &str) -> Result<(), RuntimeError> {
        let req = pb::StopPodSandboxRequest { pod_sandbox_id: id.to_string() };
        ignore_not_found(self.call(key, "StopPodSandbox", None, self.cri.runtime().stop_pod_sandbox(req)).await)?;
        Ok(())
    }

    /// One CRI call with a deadline: a stuck runtime must not hold a pod worker forever.
    async fn call<T>(
        &self,
        pod: &str,
        op: &'static str,
        timeout: Option<Duration>,
        call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, RuntimeError> {
        let timeout = timeout.unwrap_or(self.cfg.cri_timeout);
        let started = Instant::now();
        let result = tokio::time::timeout(timeout, call).await;
        self.calls.record(op, started.elapsed());
        match result {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(source)) => Err(RuntimeError::Cri { pod: pod.to_string(), op, source }),
            Err(_) => Err(RuntimeError::Timeout { pod: pod.to_string(), op, timeout }),
        }
    }
}

fn runtime_container(sandbox_id: String, status: pb::ContainerStatus) -> RuntimeContainer {
    let state = match pb::ContainerState::try_from(status.state) {
        Ok(pb::ContainerState::ContainerCreated) => ContainerRunState::Created,
        Ok(pb::ContainerState::ContainerRunning) => ContainerRunState::Running,
        Ok(pb::ContainerState::ContainerExited) => ContainerRunState::Exited,
        _ => ContainerRunState::Unknown,
    };
    let metadata = status.metadata.unwrap_or_default();
    RuntimeContainer {
        id: status.id,
        sandbox_id,
        name: metadata.name,
        attempt: metadata.attempt,
        state,
        created_at: status.created_at,
        started_at: status.started_at,
        finished_at: status.finished_at,
        exit_code: status.exit_code,
        reason: status.reason,
        message: status.message,
        image_ref: status.image_ref,
        hash: status.annotations.get(spec::ANNOTATION_CONTAINER_HASH).cloned().unwrap_or_default(),
        backoff: Duration::from_secs(
            status.annotations.get(spec::ANNOTATION_RESTART_BACKOFF).and_then(|s| s.parse().ok()).unwrap_or(0),
        ),
        pre_stop: spec::pre_stop_hook(&status.annotations),
    }
}

/// One run of a container to start: its attempt, the crash-loop back-off it waited for, and the
/// grace period it gets if a failed postStart hook kills it.
#[derive(Clone, Copy, Debug)]
struct Run {
    attempt: u32,
    backoff: Duration,
    grace: Duration,
}

/// kubelet's `minimumGracePeriodInSeconds`: a container always gets this after SIGTERM.
const MIN_GRACE_PERIOD: Duration = Duration::from_secs(2);

/// A duration as CRI's timeout seconds, rounded up.
fn whole_seconds(d: Duration) -> i64 {
    i64::try_from(d.as_secs() + u64::from(d.subsec_nanos() > 0)).unwrap_or(i64::MAX)
}

/// NotFound means "already gone", which is what stop/remove/status callers want anyway.
fn ignore_not_found<T>(result: Result<T, RuntimeError>) -> Result<Option<T>, RuntimeError> {
    match result {
        Ok(value) => Ok(Some(value)),
        Err(RuntimeError::Cri { source, .. }) if source.code() == Code::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Writes the managed hosts file whole (a container that starts reads it complete), mode 0644
/// as the kubelet leaves it.
fn write_hosts_file(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let partial = path.with_extension("tmp");
    std::fs::write(&partial, text)?;
    std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(0o644))?;
    std::fs::rename(&partial, path)
}

fn remove_dir_all(path: &std::path::Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

fn grace_period(pod: &Pod) -> Duration {
    let seconds = pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds).unwrap_or(30);
    Duration::from_secs(u64::try_from(seconds).unwrap_or(0))
}

fn now_nanos() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).ok().and_then(|d| i64::try_from(d.as_nanos()).ok()).unwrap_or(0)
}

fn mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// CRI's form of a registry credential.
fn cri_auth(auth: AuthConfig) -> pb::AuthConfig {
    pb::AuthConfig {
        username: auth.username,
        password: auth.password,
        auth: auth.auth,
        server_address: auth.server_address,
        identity_token: auth.identity_token,
        registry_token: String::new(),
    }
}
