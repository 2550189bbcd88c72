//! The kubelet's prober (`pkg/kubelet/prober`): liveness, readiness and startup probes. One
//! worker per (Pod, container, probe type) runs its probe every period; its verdicts go to the
//! Pod's results cache ([`results`]) and a changed verdict wakes the Pod's worker, which reads
//! them ([`PodProbes`]) when it syncs: readiness becomes the container's `ready` (and so the
//! Pod's Ready condition, which the EndpointSlice controller reads), a liveness or startup
//! failure kills the container ([`pod::kill_unhealthy`]).
//!
//! The decisions are pure ([`worker`]: thresholds, gating, holds; [`pod`]: what results mean);
//! this is the I/O shell. A worker is one long-lived task with its own buffer; a probe run
//! allocates little beyond the request it sends. The handlers: [`http`] (hand-written
//! HTTP/1.1), TCP connect, exec (CRI `ExecSync`: every run is a process started in the
//! container, which costs containerd far more than a network probe), [`grpc`] (the health
//! protocol over tonic).

pub mod grpc;
pub mod http;
pub mod pod;
pub mod results;
mod tls;
pub mod worker;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{Container, Pod, PodStatus, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::events::Recorder;
use crate::kubelet::cri::{Cri, pb::ExecSyncRequest};
use crate::kubelet::runtime::spec::is_sidecar;
use k8s_openapi::api::core::v1::ObjectReference;
pub use pod::{PodProbes, Unhealthy, kill_unhealthy};
pub use results::{ProbeResult, ProbeType, Results};
use worker::{Observed, PodContext, State, Step, Timing, Worker};

/// Makes each Pod's prober, with what their probes share (the runtime, for exec probes).
#[derive(Clone, Debug)]
pub struct Prober {
    cri: Cri,
    /// Unhealthy, on every failed probe, as the kubelet records it.
    events: Recorder,
}

impl Prober {
    pub fn new(cri: Cri, events: Recorder) -> Prober {
        Prober { cri, events }
    }

    /// The prober of one Pod (`involved`, for its Events); `wake` wakes the Pod's worker when a
    /// probe's verdict changes.
    pub fn pod(&self, pod_key: String, involved: ObjectReference, wake: Arc<Notify>) -> PodProber {
        let events = self.events.clone();
        PodProber {
            cri: self.cri.clone(),
            shared: Arc::new(Shared { pod_key, involved, events, wake, state: Mutex::default() }),
            workers: HashMap::new(),
        }
    }
}

/// The probe workers of one Pod, owned by its pod worker; dropping it stops them.
pub struct PodProber {
    cri: Cri,
    shared: Arc<Shared>,
    workers: HashMap<(String, ProbeType), WorkerHandle>,
}

struct WorkerHandle {
    /// The probe it runs, to replace the worker when the spec changes.
    probe: Probe,
    /// Makes it probe now rather than at its next period (a new container run).
    trigger: Arc<Notify>,
    task: JoinHandle<()>,
}

/// What the Pod's workers share: its last observed status and the results.
struct Shared {
    pod_key: String,
    involved: ObjectReference,
    events: Recorder,
    /// The pod worker's wake-up.
    wake: Arc<Notify>,
    state: Mutex<PodState>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, PodState> {
        // Plain data; a panicking holder leaves nothing half-done that matters.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[derive(Default)]
struct PodState {
    context: PodContext,
    /// The Pod's IP, else the node's (a host-network Pod): where network probes go.
    ip: Option<String>,
    /// Each container's current run, from the last status, by container name.
    containers: HashMap<String, Seen>,
    /// The containers that have a startup probe.
    startup: HashSet<String>,
    /// The sidecars: they run again whatever the Pod's restartPolicy.
    sidecars: HashSet<String>,
    results: Results,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Seen {
    container_id: String,
    running_since: Option<SystemTime>,
    terminated: bool,
}

impl PodState {
    fn observed(&self, container: &str) -> Option<Observed> {
        let seen = self.containers.get(container)?;
        let state = match seen.running_since {
            Some(since) => State::Running(SystemTime::now().duration_since(since).unwrap_or_default()),
            None if seen.terminated => State::Terminated,
            None => State::Waiting,
        };
        Some(Observed { container_id: seen.container_id.clone(), state })
    }
}

impl PodProber {
    /// Makes the workers match the Pod's probes (the kubelet's `AddPod`, on every sync): new
    /// ones start, changed ones are replaced, removed ones stop.
    pub fn update(&mut self, pod: &Pod) {
        let spec = pod.spec.as_ref();
        let containers = spec.map(|s| s.containers.as_slice()).unwrap_or_default();
        let init = spec.and_then(|s| s.init_containers.as_deref()).unwrap_or_default();
        let sidecars: Vec<&Container> = init.iter().filter(|c| is_sidecar(c)).collect();
        let mut wanted: HashMap<(String, ProbeType), (&Container, &Probe)> = HashMap::new();
        for container in containers.iter().chain(sidecars.iter().copied()) {
            let probes = [
                (ProbeType::Liveness, &container.liveness_probe),
                (ProbeType::Readiness, &container.readiness_probe),
                (ProbeType::Startup, &container.startup_probe),
            ];
            for (probe_type, probe) in probes {
                if let Some(probe) = probe {
                    wanted.insert((container.name.clone(), probe_type), (container, probe));
                }
            }
        }
        {
            let mut state = self.shared.lock();
            state.context.deleting = pod.metadata.deletion_timestamp.is_some();
            state.context.restart_never = spec.and_then(|s| s.restart_policy.as_deref()) == Some("Never");
            state.startup = wanted.keys().filter(|(_, t)| *t == ProbeType::Startup).map(|(n, _)| n.clone()).collect();
            state.sidecars = sidecars.iter().map(|c| c.name.clone()).collect();
        }
        self.workers.retain(|key, handle| {
            let keep = wanted.get(key).is_some_and(|(_, probe)| **probe == handle.probe);
            if !keep {
                handle.task.abort();
            }
            keep
        });
        for (key, (container, probe)) in wanted {
            if self.workers.contains_key(&key) {
                continue;
            }
            let (name, probe_type) = key.clone();
            let trigger = Arc::new(Notify::new());
            let run = ProbeRun {
                shared: self.shared.clone(),
                cri: self.cri.clone(),
                container: name,
                worker: Worker::new(probe_type, Timing::of(probe, probe_type)),
                handler: Handler::of(probe, container),
                trigger: trigger.clone(),
            };
            self.workers.insert(key, WorkerHandle { probe: probe.clone(), trigger, task: tokio::spawn(run.run()) });
        }
    }

    /// The probes and their results now, for a sync of the Pod.
    pub fn snapshot(&self) -> PodProbes {
        PodProbes::new(self.workers.keys().cloned(), self.shared.lock().results.clone())
    }

    /// Takes in the Pod's status after a sync: where its containers are now. A container run the
    /// workers have not seen is probed at once (the kubelet's manual trigger), so a new run
    /// becomes ready without waiting for a period.
    pub fn observe(&self, status: &PodStatus) {
        let mut fresh: Vec<String> = Vec::new();
        {
            let mut state = self.shared.lock();
            state.ip = status.pod_ip.clone().or_else(|| status.host_ip.clone());
            state.context.finished = matches!(status.phase.as_deref(), Some("Succeeded" | "Failed"));
            // Init containers too: sidecars are probed.
            for c in status.container_statuses.iter().chain(&status.init_container_statuses).flatten() {
                let Some(id) = c.container_id.as_deref().map(pod::bare_id) else {
                    continue;
                };
                let s = c.state.as_ref();
                let seen = Seen {
                    container_id: id.to_owned(),
                    running_since: s
                        .and_then(|s| s.running.as_ref())
                        .map(|r| r.started_at.as_ref().map_or(SystemTime::now(), |t| SystemTime::from(t.0))),
                    terminated: s.is_some_and(|s| s.terminated.is_some()),
                };
                let before = state.containers.get(&c.name);
                let became_running = seen.running_since.is_some()
                    && before.is_none_or(|b| b.container_id != seen.container_id || b.running_since.is_none());
                if became_running {
                    fresh.push(c.name.clone());
                }
                if before != Some(&seen) {
                    state.containers.insert(c.name.clone(), seen);
                }
            }
        }
        for ((name, _), handle) in &self.workers {
            if fresh.contains(name) {
                handle.trigger.notify_one();
            }
        }
    }
}

impl Drop for PodProber {
    fn drop(&mut self) {
        for handle in self.workers.values() {
            handle.task.abort();
        }
    }
}

/// A probe's handler, resolved against its container once.
#[derive(Clone, Debug)]
enum Handler {
    Exec(Vec<String>),
    Http(http::HttpGet),
    Tcp {
        host: Option<String>,
        port: u16,
    },
    Grpc {
        port: u16,
        service: String,
    },
    /// What cannot be probed (a port name the container lacks): an error at every period, as
    /// the kubelet's prober errs.
    Invalid(String),
}

impl Handler {
    fn of(probe: &Probe, container: &Container) -> Handler {
        let resolved = || -> Result<Handler, String> {
            if let Some(exec) = &probe.exec {
                return Ok(Handler::Exec(exec.command.clone().unwrap_or_default()));
            }
            if let Some(get) = &probe.http_get {
                let https = match get.scheme.as_deref() {
                    None | Some("HTTP") => false,
                    Some("HTTPS") => true,
                    Some(other) => return Err(format!("unsupported scheme {other:?}: use HTTP or HTTPS")),
                };
                return Ok(Handler::Http(http::HttpGet {
                    https,
                    host: get.host.clone().filter(|h| !h.is_empty()),
                    port: resolve_port(&get.port, container)?,
                    path: get.path.clone().unwrap_or_default(),
                    headers: get.http_headers.iter().flatten().map(|h| (h.name.clone(), h.value.clone())).collect(),
                }));
            }
            if let Some(tcp) = &probe.tcp_socket {
                let host = tcp.host.clone().filter(|h| !h.is_empty());
                return Ok(Handler::Tcp { host, port: resolve_port(&tcp.port, container)? });
            }
            if let Some(grpc) = &probe.grpc {
                let port = u16::try_from(grpc.port).ok().filter(|p| *p > 0).ok_or("invalid port number")?;
                return Ok(Handler::Grpc { port, service: grpc.service.clone().unwrap_or_default() });
            }
            Err("the probe has no handler".into())
        };
        resolved().unwrap_or_else(Handler::Invalid)
    }
}

/// The kubelet's `ResolveContainerPort`: a number, or the name of one of the container's ports.
fn resolve_port(port: &IntOrString, container: &Container) -> Result<u16, String> {
    let number = match port {
        IntOrString::Int(n) => *n,
        IntOrString::String(name) => container
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name))
            .map(|p| p.container_port)
            .or_else(|| name.parse().ok())
            .ok_or_else(|| format!("port {name} not found in container {}", container.name))?,
    };
    u16::try_from(number).ok().filter(|p| *p > 0).ok_or_else(|| format!("invalid port number: {number}"))
}

/// One worker's task.
struct ProbeRun {
    shared: Arc<Shared>,
    cri: Cri,
    container: String,
    worker: Worker,
    handler: Handler,
    trigger: Arc<Notify>,
}

impl ProbeRun {
    async fn run(mut self) {
        let mut ticker = tokio::time::interval(self.worker.timing.period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut buf = Vec::new();
        // Log the first of a run of failures or errors, not each one.
        let mut last = ProbeResult::Success;
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = self.trigger.notified() => {}
            }
            let (step, changed, ip) = {
                let mut state = self.shared.lock();
                let observed = state.observed(&self.container);
                let context = PodContext {
                    has_startup_probe: state.startup.contains(&self.container),
                    restart_never: state.context.restart_never && !state.sidecars.contains(&self.container),
                    ..state.context
                };
                let (step, changed) = self.worker.before_probe(context, observed.as_ref(), &mut state.results);
                (step, changed, state.ip.clone())
            };
            if changed {
                self.shared.wake.notify_one();
            }
            match step {
                Step::Stop => return,
                Step::Wait => continue,
                Step::Probe => {}
            }
            let timeout = self.worker.timing.timeout;
            let (result, message) = self.probe(ip.as_deref(), timeout, &mut buf).await;
            let probe = self.worker.probe_type;
            if result == ProbeResult::Failure {
                let message = format!("{} probe failed: {message}", probe.title());
                self.shared.events.object(
                    self.shared.involved.clone(),
                    gitplane_api::events::WARNING,
                    "Unhealthy",
                    &message,
                );
            }
            match result {
                ProbeResult::Failure if last != ProbeResult::Failure => {
                    tracing::info!(pod = %self.shared.pod_key, container = %self.container, probe = %probe, "{} probe failed: {message}", probe.title());
                }
                ProbeResult::Unknown if last != ProbeResult::Unknown => {
                    tracing::warn!(pod = %self.shared.pod_key, container = %self.container, probe = %probe, "{} probe errored: {message}", probe.title());
                }
                _ => {}
            }
            last = result;
            let changed = self.worker.after_probe(result, &mut self.shared.lock().results);
            if changed {
                tracing::info!(pod = %self.shared.pod_key, container = %self.container, probe = %probe, ?result, "probe result changed");
                self.shared.wake.notify_one();
            }
        }
    }

    async fn probe(&self, ip: Option<&str>, timeout: Duration, buf: &mut Vec<u8>) -> (ProbeResult, String) {
        let no_ip = || (ProbeResult::Unknown, "the Pod has no IP yet".to_owned());
        match &self.handler {
            Handler::Invalid(why) => (ProbeResult::Unknown, why.clone()),
            Handler::Exec(command) => exec(&self.cri, self.worker.container_id(), command, timeout).await,
            Handler::Http(get) => match (get.host.as_deref(), ip) {
                (Some(_), _) => http::probe(get, "", timeout, buf).await,
                (None, Some(ip)) => http::probe(get, ip, timeout, buf).await,
                (None, None) => no_ip(),
            },
            Handler::Tcp { host, port } => match host.as_deref().or(ip) {
                Some(host) => tcp(host, *port, timeout).await,
                None => no_ip(),
            },
            Handler::Grpc { port, service } => match ip {
                Some(ip) => grpc::probe(ip, *port, service, timeout).await,
                None => no_ip(),
            },
        }
    }
}

/// The kubelet's TCP probe: a connection opened within the timeout is a success.
async fn tcp(host: &str, port: u16, timeout: Duration) -> (ProbeResult, String) {
    let addr = if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") };
    match tokio::time::timeout(timeout, TcpStream::connect((host, port))).await {
        Ok(Ok(_)) => (ProbeResult::Success, String::new()),
        Ok(Err(e)) => (ProbeResult::Failure, format!("dial tcp {addr}: connect: {}", http::os_message(&e))),
        Err(_) => (ProbeResult::Failure, format!("dial tcp {addr}: i/o timeout")),
    }
}

/// What the kubelet keeps of an exec probe's output.
const MAX_EXEC_OUTPUT: usize = 10 * 1024;

/// The kubelet's exec probe: CRI `ExecSync` in the container; exit code 0 is a success, and a
/// command that outlives the timeout a failure.
async fn exec(cri: &Cri, container_id: &str, command: &[String], timeout: Duration) -> (ProbeResult, String) {
    let timed_out = || (ProbeResult::Failure, format!("command {:?} timed out", command.join(" ")));
    let request = ExecSyncRequest {
        container_id: container_id.to_owned(),
        cmd: command.to_vec(),
        timeout: i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
    };
    // The runtime enforces the timeout; the margin covers the call itself.
    match tokio::time::timeout(timeout + Duration::from_secs(5), cri.runtime().exec_sync(request)).await {
        Ok(Ok(response)) => {
            let response = response.into_inner();
            let mut output = response.stdout;
            output.extend_from_slice(&response.stderr);
            output.truncate(MAX_EXEC_OUTPUT);
            let mut output = String::from_utf8_lossy(&output).trim_end().to_owned();
            if response.exit_code == 0 {
                return (ProbeResult::Success, output);
            }
            if output.is_empty() {
                output = format!("command {:?} exited with {}", command.join(" "), response.exit_code);
            }
            (ProbeResult::Failure, output)
        }
        // containerd 1.6 answers a timed-out exec with `timeout 1s exceeded: …` as Unknown.
        Ok(Err(status))
            if status.code() == tonic::Code::DeadlineExceeded
                || (status.message().starts_with("timeout ") && status.message().contains("exceeded")) =>
        {
            timed_out()
        }
        Ok(Err(status)) => (ProbeResult::Unknown, format!("ExecSync: {}", status.message())),
        Err(_) => timed_out(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn container() -> Container {
        serde_json::from_value(
            json!({ "name": "web", "image": "i", "ports": [{ "name": "http", "containerPort": 8080 }] }),
        )
        .expect("a container")
    }

    fn handler(probe: serde_json::Value) -> String {
        format!("{:?}", Handler::of(&serde_json::from_value(probe).expect("a probe"), &container()))
    }

    #[test]
    fn handlers_resolve_against_their_container() {
        assert_eq!(
            handler(json!({ "httpGet": { "port": "http", "path": "/ready" } })),
            r#"Http(HttpGet { host: None, port: 8080, path: "/ready", headers: [], https: false })"#
        );
        assert_eq!(handler(json!({ "tcpSocket": { "port": 81, "host": "" } })), "Tcp { host: None, port: 81 }");
        assert_eq!(handler(json!({ "tcpSocket": { "port": "9090" } })), "Tcp { host: None, port: 9090 }");
        assert_eq!(handler(json!({ "grpc": { "port": 9000 } })), r#"Grpc { port: 9000, service: "" }"#);
        assert_eq!(handler(json!({ "exec": { "command": ["cat", "/ok"] } })), r#"Exec(["cat", "/ok"])"#);
        assert_eq!(
            handler(json!({ "tcpSocket": { "port": "nope" } })),
            r#"Invalid("port nope not found in container web")"#
        );
        assert_eq!(handler(json!({ "tcpSocket": { "port": 70000 } })), r#"Invalid("invalid port number: 70000")"#);
        assert!(handler(json!({ "httpGet": { "port": 443, "scheme": "HTTPS" } })).contains("https: true"));
        assert_eq!(
            handler(json!({ "httpGet": { "port": 443, "scheme": "FTP" } })),
            r#"Invalid("unsupported scheme \"FTP\": use HTTP or HTTPS")"#
        );
    }

    #[tokio::test]
    async fn tcp_probes_connect() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("address").port();
        assert_eq!(tcp("127.0.0.1", port, Duration::from_secs(1)).await, (ProbeResult::Success, String::new()));
        drop(listener);
        let (result, message) = tcp("127.0.0.1", port, Duration::from_secs(1)).await;
        assert_eq!(result, ProbeResult::Failure);
        assert_eq!(message, format!("dial tcp 127.0.0.1:{port}: connect: connection refused"));
    }
}
