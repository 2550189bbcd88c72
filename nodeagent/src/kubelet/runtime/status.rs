//! The pure construction of a Pod's observed status from what the runtime holds (kubelet's
//! `generateAPIPodStatus` / `getPhase`).

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting, ContainerStatus,
    HostIP, Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use super::actions::{
    CONTAINER_ID_PREFIX, ContainerRunState, RuntimeContainer, RuntimePod, restart_backoff, should_restart,
};
use super::spec::{is_sidecar, qos_class, restart_policy};
use crate::kubelet::prober::PodProbes;

/// Why a container that has no run yet is waiting (image pull failed, bad config, ...).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiting {
    pub reason: String,
    pub message: String,
}

/// The pod's status. `waiting` holds the reasons of containers that could not be created;
/// `node_ip` becomes hostIP; `probes` decide which running containers have started and are
/// ready. It depends on nothing else (not the time): an unchanged pod has an unchanged status,
/// which is not written again.
pub fn pod_status(
    pod: &Pod,
    runtime: &RuntimePod,
    waiting: &HashMap<String, Waiting>,
    node_ip: Option<&str>,
    probes: &PodProbes,
) -> PodStatus {
    let policy = restart_policy(pod);
    let containers = pod.spec.as_ref().map(|s| s.containers.as_slice()).unwrap_or_default();
    let init_containers = pod.spec.as_ref().and_then(|s| s.init_containers.as_deref()).unwrap_or_default();
    let sandbox = runtime.current_sandbox();
    // kubelet shows every container of a pod with init containers as PodInitializing until it runs.
    let default_reason = if init_containers.is_empty() { "ContainerCreating" } else { "PodInitializing" };
    let status_of = |c: &k8s_openapi::api::core::v1::Container, policy: &str| {
        let image = c.image.clone().unwrap_or_default();
        container_status(&c.name, image, &runtime.runs_of(&c.name), waiting.get(&c.name), policy, default_reason)
    };
    let mut statuses: Vec<ContainerStatus> = containers.iter().map(|c| status_of(c, policy)).collect();
    probes.update_container_statuses(&mut statuses);
    // Init containers run to success: only failures are retried, and a success is ready.
    let init_policy = if policy == "Never" { "Never" } else { "OnFailure" };
    let mut init_statuses: Vec<ContainerStatus> = init_containers
        .iter()
        .map(|c| {
            let mut status = status_of(c, init_policy);
            status.ready = succeeded(&status);
            status
        })
        .collect();
    // Sidecars run again whenever they exit, until the pod is done: then they are stopped.
    let sidecar_policy = if pod_done(policy, init_containers, &init_statuses, &statuses) { "Never" } else { "Always" };
    for (status, c) in init_statuses.iter_mut().zip(init_containers).filter(|(_, c)| is_sidecar(c)) {
        *status = status_of(c, sidecar_policy);
        probes.update_container_statuses(std::slice::from_mut(status));
    }
    let init: Vec<(&ContainerStatus, bool)> =
        init_statuses.iter().zip(init_containers).map(|(s, c)| (s, is_sidecar(c))).collect();

    let phase = phase(policy, &init, &statuses, containers.is_empty());
    // kubelet's ContainersReady: the sidecars and the app containers, in that order.
    let counted: Vec<&ContainerStatus> =
        init.iter().filter(|(_, sidecar)| *sidecar).map(|(s, _)| *s).chain(&statuses).collect();
    let all_ready = !statuses.is_empty() && counted.iter().all(|s| s.ready);
    let not_ready = |what: &str| {
        let names: Vec<&str> = counted.iter().filter(|s| !s.ready).map(|s| s.name.as_str()).collect();
        (!all_ready).then(|| format!("{what} with unready status: [{}]", names.join(" ")))
    };
    let condition = |type_: &str, ok: bool, reason: Option<&str>, message: Option<String>| PodCondition {
        type_: type_.to_string(),
        status: if ok { "True" } else { "False" }.to_string(),
        reason: reason.filter(|_| !ok).map(str::to_string),
        message: message.filter(|_| !ok),
        ..Default::default()
    };
    let finished = matches!(phase, "Succeeded" | "Failed");
    let ready_reason = if finished { "PodCompleted" } else { "ContainersNotReady" };
    let (initialized, not_initialized) = initialized(&init, &statuses, phase);
    let conditions = vec![
        // The sandbox runs with its network: containers can start (the kubelet's condition).
        condition(READY_TO_START_CONTAINERS, sandbox.is_some(), None, None),
        condition("PodScheduled", true, None, None),
        condition("Initialized", initialized, Some("ContainersNotInitialized"), not_initialized),
        condition("ContainersReady", all_ready, Some(ready_reason), not_ready("containers")),
        condition("Ready", all_ready, Some(ready_reason), not_ready("containers")),
    ];

    let ips: Vec<String> = sandbox.map(|s| s.ips.clone()).unwrap_or_default();
    PodStatus {
        phase: Some(phase.to_string()),
        conditions: Some(conditions),
        pod_ip: ips.first().cloned(),
        pod_ips: (!ips.is_empty()).then(|| ips.iter().map(|ip| PodIP { ip: ip.clone() }).collect()),
        host_ip: node_ip.map(str::to_string),
        host_ips: node_ip.map(|ip| vec![HostIP { ip: ip.to_string() }]),
        start_time: runtime.sandboxes.iter().map(|s| s.created_at).min().and_then(time),
        container_statuses: Some(statuses),
        init_container_statuses: (!init_statuses.is_empty()).then_some(init_statuses),
        qos_class: Some(qos_class(pod).to_string()),
        ..Default::default()
    }
}

/// The Pod condition that says whether its sandbox runs, and why not when it cannot be made.
pub const READY_TO_START_CONTAINERS: &str = "PodReadyToStartContainers";

/// `status` of a Pod whose sandbox could not be made: its [`READY_TO_START_CONTAINERS`]
/// condition says why, as the `FailedCreatePodSandBox` Event does (the kubelet's condition has
/// no reason; a Pod that stays Pending is told why where `kubectl describe` shows it).
pub fn sandbox_failed(status: &mut PodStatus, message: &str) {
    for c in status.conditions.iter_mut().flatten().filter(|c| c.type_ == READY_TO_START_CONTAINERS) {
        c.status = "False".into();
        c.reason = Some("FailedCreatePodSandBox".into());
        c.message = Some(message.to_owned());
    }
}

/// Whether an app container is ready. The one place that decides it: today a running container
/// is ready (no readiness probes yet).
pub fn container_ready(run: &RuntimeContainer) -> bool {
    run.state == ContainerRunState::Running
}

/// kubelet's condition times: a condition whose status is that of the same condition in
/// `previous` (the status last reported) keeps its lastTransitionTime; a new or changed one gets
/// `now`. So the time changes only with the condition, and [`pod_status`] stays free of the clock.
pub fn keep_transition_times(previous: Option<&PodStatus>, status: &mut PodStatus, now: Time) {
    let old = previous.and_then(|p| p.conditions.as_deref()).unwrap_or_default();
    for c in status.conditions.iter_mut().flatten() {
        let same = old.iter().find(|o| o.type_ == c.type_ && o.status == c.status);
        c.last_transition_time = Some(same.and_then(|o| o.last_transition_time.clone()).unwrap_or_else(|| now.clone()));
    }
}

/// Whether a container's current state is a successful exit.
fn succeeded(status: &ContainerStatus) -> bool {
    status.state.as_ref().and_then(|s| s.terminated.as_ref()).is_some_and(|t| t.exit_code == 0)
}

/// Whether any app container has run (kubelet's `HasAnyRegularContainerStarted`).
fn any_started(statuses: &[ContainerStatus]) -> bool {
    statuses.iter().any(|s| s.container_id.is_some())
}

/// Whether a container has started (and passed its startup probe).
fn has_started(status: &ContainerStatus) -> bool {
    status.started == Some(true)
}

/// Whether the pod's app containers are done for good (kubelet then stops its sidecars): each
/// has terminated and will not run again, or an init container failed under Never.
fn pod_done(policy: &str, init: &[Container], init_statuses: &[ContainerStatus], statuses: &[ContainerStatus]) -> bool {
    let terminated = |s: &ContainerStatus| s.state.as_ref().is_some_and(|s| s.terminated.is_some());
    let init_failed = init.iter().zip(init_statuses).any(|(c, s)| !is_sidecar(c) && terminated(s) && !succeeded(s));
    (policy == "Never" && init_failed)
        || (policy != "Always" && !statuses.is_empty() && statuses.iter().all(terminated))
}

/// kubelet's Initialized condition: every init container succeeded, every sidecar started (or
/// app containers ran). `init` pairs each status with whether it is a sidecar's.
fn initialized(init: &[(&ContainerStatus, bool)], statuses: &[ContainerStatus], phase: &str) -> (bool, Option<String>) {
    let complete = |(s, sidecar): &&(&ContainerStatus, bool)| if *sidecar { has_started(s) } else { succeeded(s) };
    let incomplete: Vec<&str> = init.iter().filter(|c| !complete(c)).map(|(s, _)| s.name.as_str()).collect();
    if incomplete.is_empty() || phase == "Succeeded" || any_started(statuses) {
        return (true, None);
    }
    (false, Some(format!("containers with incomplete status: [{}]", incomplete.join(" "))))
}

/// A CRI timestamp (ns since epoch, 0 = never) as a Kubernetes time.
pub fn time(nanos: i64) -> Option<Time> {
    (nanos > 0).then(|| Timestamp::from_nanosecond(i128::from(nanos)).ok().map(Time)).flatten()
}

fn terminated(run: &RuntimeContainer) -> ContainerState {
    let non_empty = |s: &str| (!s.is_empty()).then(|| s.to_string());
    let reason =
        non_empty(&run.reason).unwrap_or_else(|| if run.exit_code == 0 { "Completed" } else { "Error" }.into());
    ContainerState {
        terminated: Some(ContainerStateTerminated {
            container_id: Some(format!("{CONTAINER_ID_PREFIX}{}", run.id)),
            exit_code: run.exit_code,
            reason: Some(reason),
            message: non_empty(&run.message),
            started_at: time(run.started_at),
            finished_at: time(run.finished_at),
            signal: None,
        }),
        ..Default::default()
    }
}

fn waiting_state(reason: &str, message: Option<String>) -> ContainerState {
    ContainerState {
        waiting: Some(ContainerStateWaiting { reason: Some(reason.to_string()), message }),
        ..Default::default()
    }
}

fn container_status(
    name: &str,
    image: String,
    runs: &[&RuntimeContainer],
    pending: Option<&Waiting>,
    policy: &str,
    default_reason: &str,
) -> ContainerStatus {
    let pending_state = |w: &Waiting| waiting_state(&w.reason, Some(w.message.clone()));
    let mut status = ContainerStatus { name: name.to_string(), image, ..Default::default() };
    let Some(last) = runs.first() else {
        status.state = Some(pending.map(pending_state).unwrap_or_else(|| waiting_state(default_reason, None)));
        status.started = Some(false);
        return status;
    };
    status.container_id = Some(format!("{CONTAINER_ID_PREFIX}{}", last.id));
    status.image_id = last.image_ref.clone();
    status.restart_count = i32::try_from(last.attempt).unwrap_or(i32::MAX);
    let previous = runs.get(1).filter(|r| r.state == ContainerRunState::Exited).map(|r| terminated(r));
    match last.state {
        ContainerRunState::Running => {
            status.state = Some(ContainerState {
                running: Some(ContainerStateRunning { started_at: time(last.started_at) }),
                ..Default::default()
            });
            // Unless its probes say otherwise (`PodProbes::update_container_statuses`).
            status.ready = container_ready(last);
            status.started = Some(true);
            status.last_state = previous;
        }
        ContainerRunState::Created => {
            status.state = Some(pending.map(pending_state).unwrap_or_else(|| waiting_state(default_reason, None)));
            status.started = Some(false);
            status.last_state = previous;
        }
        ContainerRunState::Exited | ContainerRunState::Unknown => {
            status.started = Some(false);
            if should_restart(policy, last.exit_code) {
                let state = pending.map(pending_state).unwrap_or_else(|| {
                    // kubelet's message names the back-off, not the time left: it stays the same
                    // from one sync to the next.
                    let backoff = go_duration(restart_backoff(last));
                    let message = format!("back-off {backoff} restarting failed container={name}");
                    waiting_state("CrashLoopBackOff", Some(message))
                });
                status.state = Some(state);
                status.last_state = Some(terminated(last));
            } else {
                status.state = Some(terminated(last));
                status.last_state = previous;
            }
        }
    }
    status
}

/// Whole seconds as Go prints a duration: `10s`, `1m20s`, `5m0s`.
fn go_duration(d: std::time::Duration) -> String {
    let (minutes, seconds) = (d.as_secs() / 60, d.as_secs() % 60);
    if minutes == 0 { format!("{seconds}s") } else { format!("{minutes}m{seconds}s") }
}

/// kubelet's `getPhase`. `init` pairs each init container's status with whether it is a
/// sidecar's: a sidecar that runs counts as running (one not started yet keeps the pod
/// initializing), one that stopped does not count.
fn phase(
    policy: &str,
    init: &[(&ContainerStatus, bool)],
    statuses: &[ContainerStatus],
    no_containers: bool,
) -> &'static str {
    if no_containers {
        return "Pending";
    }
    let (mut pending_init, mut failed_init) = (0, 0);
    let (mut waiting, mut running, mut stopped, mut succeeded) = (0, 0, 0, 0);
    for (s, sidecar) in init {
        let state = s.state.as_ref();
        let last = s.last_state.as_ref().and_then(|l| l.terminated.as_ref());
        if *sidecar {
            if state.and_then(|s| s.running.as_ref()).is_some() {
                running += 1;
                pending_init += usize::from(!has_started(s));
            } else if state.and_then(|s| s.terminated.as_ref()).is_none() && last.is_none() {
                pending_init += 1;
                waiting += 1;
            }
        } else if let Some(t) = state.and_then(|s| s.terminated.as_ref()) {
            failed_init += usize::from(t.exit_code != 0);
        } else if state.and_then(|s| s.waiting.as_ref()).is_some()
            && let Some(t) = last
        {
            failed_init += usize::from(t.exit_code != 0);
        } else {
            pending_init += 1;
        }
    }
    if failed_init > 0 && policy == "Never" {
        return "Failed";
    }
    // Init containers that run again in a new sandbox do not send a pod that ran back to Pending.
    if pending_init > 0 && !any_started(statuses) {
        return "Pending";
    }
    for s in statuses {
        let state = s.state.as_ref();
        if state.and_then(|s| s.running.as_ref()).is_some() {
            running += 1;
        } else if let Some(t) = state.and_then(|s| s.terminated.as_ref()) {
            stopped += 1;
            if t.exit_code == 0 {
                succeeded += 1;
            }
        } else if s.last_state.as_ref().and_then(|l| l.terminated.as_ref()).is_some() {
            // Waiting to restart after having run: the pod is still running.
            stopped += 1;
        } else {
            waiting += 1;
        }
    }
    match () {
        _ if waiting > 0 => "Pending",
        _ if running > 0 => "Running",
        _ if stopped > 0 => match policy {
            "Always" => "Running",
            "OnFailure" if stopped == succeeded => "Succeeded",
            "OnFailure" => "Running",
            _ if stopped == succeeded => "Succeeded",
            _ => "Failed",
        },
        _ => "Pending",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubelet::runtime::actions::RuntimeSandbox;
    use serde_json::json;

    const SECOND: i64 = 1_000_000_000;

    fn pod(policy: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": { "name": "web", "uid": "u-1" },
            "spec": { "restartPolicy": policy, "containers": [{ "name": "web", "image": "gitplane.local/httpd:1" }] },
        }))
        .expect("valid pod")
    }

    fn run(attempt: u32, state: ContainerRunState, exit_code: i32) -> RuntimeContainer {
        RuntimeContainer {
            id: format!("c{attempt}"),
            sandbox_id: "s0".into(),
            name: "web".into(),
            attempt,
            state,
            created_at: i64::from(attempt) + 1,
            started_at: 100 * SECOND,
            finished_at: if state == ContainerRunState::Exited { 101 * SECOND } else { 0 },
            exit_code,
            reason: String::new(),
            message: String::new(),
            image_ref: "sha256:abc".into(),
            hash: String::new(),
            ..RuntimeContainer::default()
        }
    }

    fn runtime(runs: Vec<RuntimeContainer>) -> RuntimePod {
        let sandbox = RuntimeSandbox {
            id: "s0".into(),
            attempt: 0,
            ready: true,
            created_at: 99 * SECOND,
            ips: vec!["10.244.1.2".into()],
        };
        RuntimePod { sandboxes: vec![sandbox], containers: runs }
    }

    fn condition(status: &PodStatus, type_: &str) -> String {
        status.conditions.iter().flatten().find(|c| c.type_ == type_).map(|c| c.status.clone()).unwrap_or_default()
    }

    #[test]
    fn ready_to_start_containers_follows_the_sandbox() {
        let probes = PodProbes::default();
        let none = pod_status(&pod("Always"), &RuntimePod::default(), &HashMap::new(), None, &probes);
        assert_eq!(condition(&none, READY_TO_START_CONTAINERS), "False");
        let running = runtime(vec![run(0, ContainerRunState::Running, 0)]);
        assert_eq!(
            condition(&pod_status(&pod("Always"), &running, &HashMap::new(), None, &probes), READY_TO_START_CONTAINERS),
            "True"
        );

        let mut failed = none.clone();
        sandbox_failed(&mut failed, "Failed to create pod sandbox: ListPodSandbox: Connection refused");
        let c = failed.conditions.iter().flatten().find(|c| c.type_ == READY_TO_START_CONTAINERS).expect("condition");
        assert_eq!((c.status.as_str(), c.reason.as_deref()), ("False", Some("FailedCreatePodSandBox")));
        assert_eq!(c.message.as_deref(), Some("Failed to create pod sandbox: ListPodSandbox: Connection refused"));
        assert_eq!(failed.phase.as_deref(), Some("Pending"));
    }

    fn state(status: &PodStatus) -> serde_json::Value {
        let c = &status.container_statuses.as_ref().expect("statuses")[0];
        serde_json::to_value(&c.state).expect("json")
    }

    #[test]
    fn a_new_pod_is_pending_while_containers_are_created() {
        let status = pod_status(&pod("Always"), &RuntimePod::default(), &HashMap::new(), None, &PodProbes::default());
        assert_eq!(status.phase.as_deref(), Some("Pending"));
        assert_eq!(state(&status), json!({ "waiting": { "reason": "ContainerCreating" } }));
        assert_eq!(condition(&status, "PodScheduled"), "True");
        assert_eq!(condition(&status, "Ready"), "False");
        assert_eq!(status.pod_ip, None);
    }

    #[test]
    fn an_image_pull_failure_is_the_waiting_reason() {
        let waiting = HashMap::from([(
            "web".to_string(),
            Waiting { reason: "ErrImagePull".into(), message: "not found".into() },
        )]);
        let status = pod_status(&pod("Always"), &runtime(vec![]), &waiting, None, &PodProbes::default());
        assert_eq!(status.phase.as_deref(), Some("Pending"));
        assert_eq!(state(&status), json!({ "waiting": { "reason": "ErrImagePull", "message": "not found" } }));
    }

    #[test]
    fn a_running_pod_is_ready_with_its_ip() {
        let status = pod_status(
            &pod("Always"),
            &runtime(vec![run(0, ContainerRunState::Running, 0)]),
            &HashMap::new(),
            Some("192.168.1.10"),
            &PodProbes::default(),
        );
        assert_eq!(status.phase.as_deref(), Some("Running"));
        assert_eq!(status.pod_ip.as_deref(), Some("10.244.1.2"));
        assert_eq!(status.host_ip.as_deref(), Some("192.168.1.10"));
        assert_eq!(status.qos_class.as_deref(), Some("BestEffort"));
        assert_eq!(condition(&status, "ContainersReady"), "True");
        assert_eq!(condition(&status, "Ready"), "True");
        let c = &status.container_statuses.as_ref().expect("statuses")[0];
        assert!(c.ready && c.started == Some(true));
        assert_eq!(c.container_id.as_deref(), Some("containerd://c0"));
        assert_eq!((c.image.as_str(), c.image_id.as_str()), ("gitplane.local/httpd:1", "sha256:abc"));
        assert_eq!(state(&status), json!({ "running": { "startedAt": "1970-01-01T00:01:40Z" } }));
    }

    #[test]
    fn a_crashing_container_is_in_crash_loop_back_off() {
        // The second run waited 10 s after the first crash: the next wait is 20 s.
        let second =
            RuntimeContainer { backoff: std::time::Duration::from_secs(10), ..run(1, ContainerRunState::Exited, 1) };
        let runs = vec![run(0, ContainerRunState::Exited, 1), second];
        let status = pod_status(&pod("Always"), &runtime(runs), &HashMap::new(), None, &PodProbes::default());
        assert_eq!(status.phase.as_deref(), Some("Running"));
        let c = &status.container_statuses.as_ref().expect("statuses")[0];
        assert_eq!(c.restart_count, 1);
        assert_eq!(
            state(&status),
            json!({ "waiting": {
            "reason": "CrashLoopBackOff", "message": "back-off 20s restarting failed container=web"
        } })
        );
        let last = c.last_state.as_ref().and_then(|s| s.terminated.as_ref()).expect("lastState");
        assert_eq!((last.exit_code, last.reason.as_deref()), (1, Some("Error")));
        let durations = [10, 80, 300].map(|s| go_duration(std::time::Duration::from_secs(s)));
        assert_eq!(durations, ["10s", "1m20s", "5m0s"]);
    }

    #[test]
    fn phases_of_finished_pods() {
        let phase = |policy: &str, exit_code: i32| {
            let status = pod_status(
                &pod(policy),
                &runtime(vec![run(0, ContainerRunState::Exited, exit_code)]),
                &HashMap::new(),
                None,
                &PodProbes::default(),
            );
            status.phase.unwrap_or_default()
        };
        assert_eq!(phase("Never", 0), "Succeeded");
        assert_eq!(phase("Never", 2), "Failed");
        assert_eq!(phase("OnFailure", 0), "Succeeded");
        assert_eq!(phase("OnFailure", 2), "Running");
        assert_eq!(phase("Always", 0), "Running");
        let done = pod_status(
            &pod("Never"),
            &runtime(vec![run(0, ContainerRunState::Exited, 0)]),
            &HashMap::new(),
            None,
            &PodProbes::default(),
        );
        let ready = done.conditions.iter().flatten().find(|c| c.type_ == "Ready").expect("Ready");
        assert_eq!(ready.reason.as_deref(), Some("PodCompleted"));
        assert_eq!(state(&done)["terminated"]["reason"], "Completed");
    }

    #[test]
    fn exit_reasons_and_codes() {
        let reason = |code: i32, runtime_reason: &str| {
            let mut r = run(0, ContainerRunState::Exited, code);
            r.reason = runtime_reason.into();
            let status = pod_status(&pod("Never"), &runtime(vec![r]), &HashMap::new(), None, &PodProbes::default());
            let t = &state(&status)["terminated"];
            (t["reason"].as_str().unwrap_or_default().to_string(), t["exitCode"].as_i64().unwrap_or(-1))
        };
        assert_eq!(reason(0, ""), ("Completed".into(), 0));
        assert_eq!(reason(3, ""), ("Error".into(), 3));
        // containerd's own reason for a container the kernel's OOM killer ended.
        assert_eq!(reason(137, "OOMKilled"), ("OOMKilled".into(), 137));
    }

    fn init_pod(policy: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": { "name": "web", "uid": "u-1" },
            "spec": {
                "restartPolicy": policy,
                "initContainers": [{ "name": "i1", "image": "i:1" }, { "name": "i2", "image": "i:1" }],
                "containers": [{ "name": "web", "image": "i:1" }],
            },
        }))
        .expect("valid pod")
    }

    fn named(name: &str, state: ContainerRunState, exit_code: i32) -> RuntimeContainer {
        RuntimeContainer { name: name.into(), id: format!("{name}-0"), ..run(0, state, exit_code) }
    }

    /// Each init container's (state, reason or "", ready), then the app's waiting reason or
    /// state, the phase and the Initialized condition.
    fn init_view(status: &PodStatus) -> (Vec<(String, bool)>, String, String, String) {
        let describe = |c: &ContainerStatus| {
            let state = c.state.clone().unwrap_or_default();
            match (state.waiting, state.running, state.terminated) {
                (Some(w), _, _) => format!("waiting {}", w.reason.unwrap_or_default()),
                (_, Some(_), _) => "running".to_string(),
                (_, _, Some(t)) => format!("terminated {} {}", t.reason.unwrap_or_default(), t.exit_code),
                _ => String::new(),
            }
        };
        let init = status.init_container_statuses.iter().flatten().map(|c| (describe(c), c.ready)).collect();
        let app = describe(&status.container_statuses.as_ref().expect("statuses")[0]);
        let initialized = status.conditions.iter().flatten().find(|c| c.type_ == "Initialized").expect("Initialized");
        let initialized = format!("{} {}", initialized.status, initialized.message.clone().unwrap_or_default());
        (init, app, status.phase.clone().unwrap_or_default(), initialized.trim().to_string())
    }

    #[test]
    fn init_containers_in_the_status() {
        use ContainerRunState::{Exited, Running};
        let view = |policy: &str, runs: Vec<RuntimeContainer>| {
            init_view(&pod_status(&init_pod(policy), &runtime(runs), &HashMap::new(), None, &PodProbes::default()))
        };
        let s = |x: &str| x.to_string();
        assert_eq!(
            view("Always", vec![]),
            (
                vec![(s("waiting PodInitializing"), false), (s("waiting PodInitializing"), false)],
                s("waiting PodInitializing"),
                s("Pending"),
                s("False containers with incomplete status: [i1 i2]"),
            )
        );
        assert_eq!(
            view("Always", vec![named("i1", Exited, 0), named("i2", Running, 0)]),
            (
                vec![(s("terminated Completed 0"), true), (s("running"), false)],
                s("waiting PodInitializing"),
                s("Pending"),
                s("False containers with incomplete status: [i2]"),
            )
        );
        assert_eq!(
            view("Always", vec![named("i1", Exited, 0), named("i2", Exited, 0), named("web", Running, 0)]),
            (
                vec![(s("terminated Completed 0"), true), (s("terminated Completed 0"), true)],
                s("running"),
                s("Running"),
                s("True"),
            )
        );
        // A failing init container: retried (Always, OnFailure) while the pod stays Pending, or
        // the end of the pod (Never).
        let failing = view("OnFailure", vec![named("i1", Exited, 1)]);
        assert_eq!((failing.0[0].0.as_str(), failing.2.as_str()), ("waiting CrashLoopBackOff", "Pending"));
        let failed = view("Never", vec![named("i1", Exited, 1)]);
        assert_eq!((failed.0[0].0.as_str(), failed.2.as_str()), ("terminated Error 1", "Failed"));
        assert_eq!(failed.1, "waiting PodInitializing");
        // An init container that succeeded does not run again under Always.
        let status = pod_status(
            &init_pod("Always"),
            &runtime(vec![named("i1", Exited, 0)]),
            &HashMap::new(),
            None,
            &PodProbes::default(),
        );
        let i1 = &status.init_container_statuses.as_ref().expect("init statuses")[0];
        assert_eq!(i1.last_state, None);
    }

    #[test]
    fn condition_times_change_only_with_the_condition() {
        let t = |s: i64| Time(Timestamp::from_second(s).expect("time"));
        let starting = pod_status(&pod("Always"), &runtime(vec![]), &HashMap::new(), None, &PodProbes::default());
        let mut first = starting.clone();
        keep_transition_times(None, &mut first, t(100));
        let mut again = starting.clone();
        keep_transition_times(Some(&first), &mut again, t(200));
        assert_eq!(again, first, "an unchanged status keeps its times");

        let mut running = pod_status(
            &pod("Always"),
            &runtime(vec![run(0, ContainerRunState::Running, 0)]),
            &HashMap::new(),
            None,
            &PodProbes::default(),
        );
        keep_transition_times(Some(&again), &mut running, t(300));
        let times: Vec<(String, Option<Time>)> =
            running.conditions.iter().flatten().map(|c| (c.type_.clone(), c.last_transition_time.clone())).collect();
        let expected = [
            (READY_TO_START_CONTAINERS, 100),
            ("PodScheduled", 100),
            ("Initialized", 100),
            ("ContainersReady", 300),
            ("Ready", 300),
        ];
        assert_eq!(times, expected.map(|(type_, at)| (type_.to_string(), Some(t(at)))));
    }

    fn sidecar_pod(policy: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": { "name": "job", "uid": "u-1" },
            "spec": {
                "restartPolicy": policy,
                "initContainers": [
                    { "name": "i1", "image": "i:1" },
                    { "name": "side", "image": "i:1", "restartPolicy": "Always" },
                ],
                "containers": [{ "name": "web", "image": "i:1" }],
            },
        }))
        .expect("valid pod")
    }

    #[test]
    fn sidecars_in_the_status() {
        use crate::kubelet::prober::{ProbeType, Results};
        use ContainerRunState::{Exited, Running};
        struct Case {
            what: &'static str,
            policy: &'static str,
            runs: Vec<(&'static str, u32, ContainerRunState, i32)>,
            /// Whether the sidecar has a readiness probe (that has not succeeded).
            unready: bool,
            /// The sidecar's state, started, ready and restartCount.
            sidecar: (&'static str, bool, bool, i32),
            phase: &'static str,
            initialized: &'static str,
            ready: &'static str,
        }
        let case = |what, policy, runs, sidecar, phase, initialized, ready| Case {
            what,
            policy,
            runs,
            unready: false,
            sidecar,
            phase,
            initialized,
            ready,
        };
        let cases = [
            case(
                "nothing ran yet",
                "Always",
                vec![],
                ("waiting PodInitializing", false, false, 0),
                "Pending",
                "False containers with incomplete status: [i1 side]",
                "False containers with unready status: [side web]",
            ),
            case(
                "the sidecar has started: initialized",
                "Always",
                vec![("i1", 0, Exited, 0), ("side", 0, Running, 0)],
                ("running", true, true, 0),
                "Pending",
                "True",
                "False containers with unready status: [web]",
            ),
            case(
                "it runs beside the app: both count for Ready",
                "Always",
                vec![("i1", 0, Exited, 0), ("side", 0, Running, 0), ("web", 0, Running, 0)],
                ("running", true, true, 0),
                "Running",
                "True",
                "True",
            ),
            Case {
                unready: true,
                ..case(
                    "an unready sidecar makes the pod unready",
                    "Always",
                    vec![("i1", 0, Exited, 0), ("side", 0, Running, 0), ("web", 0, Running, 0)],
                    ("running", true, false, 0),
                    "Running",
                    "True",
                    "False containers with unready status: [side]",
                )
            },
            case(
                "one that exited waits to restart under Never, the pod runs on",
                "Never",
                vec![("i1", 0, Exited, 0), ("side", 1, Exited, 0), ("web", 0, Running, 0)],
                ("waiting CrashLoopBackOff", false, false, 1),
                "Running",
                "True",
                "False containers with unready status: [side]",
            ),
            case(
                "the app succeeded, the sidecar still runs: Running",
                "Never",
                vec![("i1", 0, Exited, 0), ("side", 0, Running, 0), ("web", 0, Exited, 0)],
                ("running", true, true, 0),
                "Running",
                "True",
                "False containers with unready status: [web]",
            ),
            case(
                "then it was stopped: the app's exit decides, Succeeded",
                "Never",
                vec![("i1", 0, Exited, 0), ("side", 0, Exited, 137), ("web", 0, Exited, 0)],
                ("terminated Error 137", false, false, 0),
                "Succeeded",
                "True",
                "False containers with unready status: [side web]",
            ),
            case(
                "under OnFailure as well",
                "OnFailure",
                vec![("i1", 0, Exited, 0), ("side", 0, Exited, 0), ("web", 0, Exited, 0)],
                ("terminated Completed 0", false, false, 0),
                "Succeeded",
                "True",
                "False containers with unready status: [side web]",
            ),
            case(
                "a failed app under Never fails the pod, whatever the sidecar's exit",
                "Never",
                vec![("i1", 0, Exited, 0), ("side", 0, Exited, 0), ("web", 0, Exited, 2)],
                ("terminated Completed 0", false, false, 0),
                "Failed",
                "True",
                "False containers with unready status: [side web]",
            ),
        ];
        for c in cases {
            let runs = c.runs.iter().map(|&(name, attempt, state, code)| RuntimeContainer {
                name: name.into(),
                id: format!("{name}-{attempt}"),
                ..run(attempt, state, code)
            });
            let mut runs: Vec<RuntimeContainer> = runs.collect();
            if c.runs.iter().any(|(name, attempt, ..)| *name == "side" && *attempt == 1) {
                runs.push(RuntimeContainer { name: "side".into(), id: "side-0".into(), ..run(0, Exited, 0) });
            }
            let probed = c.unready.then(|| ("side".to_string(), ProbeType::Readiness));
            let probes = PodProbes::new(probed, Results::default());
            let status = pod_status(&sidecar_pod(c.policy), &runtime(runs), &HashMap::new(), None, &probes);
            let side = &status.init_container_statuses.as_ref().expect("init statuses")[1];
            let (init, _, phase, initialized) = init_view(&status);
            let ready = status.conditions.iter().flatten().find(|c| c.type_ == "Ready").expect("Ready");
            let ready = format!("{} {}", ready.status, ready.message.clone().unwrap_or_default());
            let got = (
                (init[1].0.as_str(), side.started == Some(true), side.ready, side.restart_count),
                phase.as_str(),
                initialized.as_str(),
                ready.trim(),
            );
            assert_eq!(got, (c.sidecar, c.phase, c.initialized, c.ready), "{}", c.what);
        }
    }
}
