//! What the runtime holds for a pod, and the pure decision of what to change (kubelet's
//! `computePodActions`): the I/O shell in [`super::RuntimeManager`] observes, this decides.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod};

use super::spec::{container_hash, is_sidecar, restart_policy};

/// The runtime prefix of container IDs in pod status (`containerd://<id>`).
pub const CONTAINER_ID_PREFIX: &str = "containerd://";

/// One pod sandbox as the runtime reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeSandbox {
    pub id: String,
    pub attempt: u32,
    pub ready: bool,
    /// Nanoseconds since the Unix epoch.
    pub created_at: i64,
    /// The pod IPs (only known for a ready sandbox).
    pub ips: Vec<String>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ContainerRunState {
    Created,
    Running,
    Exited,
    #[default]
    Unknown,
}

/// One container as the runtime reports it (CRI `ContainerStatus`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuntimeContainer {
    pub id: String,
    pub sandbox_id: String,
    pub name: String,
    pub attempt: u32,
    pub state: ContainerRunState,
    /// Nanoseconds since the Unix epoch; 0 when not (yet) happened.
    pub created_at: i64,
    pub started_at: i64,
    pub finished_at: i64,
    pub exit_code: i32,
    pub reason: String,
    pub message: String,
    pub image_ref: String,
    /// [`super::spec::ANNOTATION_CONTAINER_HASH`] of the spec it was created from.
    pub hash: String,
    /// The crash-loop back-off waited before this run ([`super::spec::ANNOTATION_RESTART_BACKOFF`]).
    pub backoff: Duration,
    /// Its preStop exec hook ([`super::spec::ANNOTATION_PRE_STOP`]).
    pub pre_stop: Option<Vec<String>>,
}

/// Everything the runtime holds for one pod uid, across all its sandboxes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuntimePod {
    pub sandboxes: Vec<RuntimeSandbox>,
    pub containers: Vec<RuntimeContainer>,
}

impl RuntimePod {
    /// The newest ready sandbox: the one the pod's containers run in.
    pub fn current_sandbox(&self) -> Option<&RuntimeSandbox> {
        self.sandboxes.iter().filter(|s| s.ready).max_by_key(|s| (s.attempt, s.created_at))
    }

    /// The runs of container `name`, newest first.
    pub fn runs_of(&self, name: &str) -> Vec<&RuntimeContainer> {
        let mut runs: Vec<_> = self.containers.iter().filter(|c| c.name == name).collect();
        runs.sort_by_key(|c| std::cmp::Reverse((c.attempt, c.created_at)));
        runs
    }
}

/// The changes that make the runtime match the pod, in the order they are carried out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodActions {
    /// Sandboxes to stop: extra ready ones, and the current one once the pod has finished.
    pub stop_sandboxes: Vec<String>,
    /// Dead sandboxes no longer needed for status.
    pub remove_sandboxes: Vec<String>,
    /// Running containers to stop (spec changed, or left in a replaced sandbox).
    pub kill_containers: Vec<String>,
    /// Dead containers no longer needed for status (kubelet keeps one previous run).
    pub remove_containers: Vec<String>,
    /// Start a new sandbox with this attempt number.
    pub create_sandbox: Option<u32>,
    /// Containers created but never started (e.g. the agent stopped in between).
    pub start_created: Vec<String>,
    /// Containers to create and start: spec name (of an app or init container) and attempt
    /// (= restartCount).
    pub start_containers: Vec<(String, u32)>,
    /// Containers that will restart once their crash-loop back-off ends.
    pub backing_off: Vec<String>,
}

/// Whether a container that exited with `exit_code` runs again under the pod's restartPolicy.
pub fn should_restart(policy: &str, exit_code: i32) -> bool {
    match policy {
        "Never" => false,
        "OnFailure" => exit_code != 0,
        _ => true,
    }
}

/// Whether a finished init container runs again: init containers run to success, so only a
/// failure is retried, unless the pod never restarts anything.
pub fn should_restart_init(policy: &str, exit_code: i32) -> bool {
    policy != "Never" && exit_code != 0
}

/// kubelet's crash-loop back-off: 10 s doubling to 5 min, reset after 10 min of running. The
/// wait before `previous` ran is kept on it, so a reset holds for the runs after it (the run
/// count alone would jump back to 5 min on the next crash).
pub fn restart_backoff(previous: &RuntimeContainer) -> Duration {
    const INITIAL: Duration = Duration::from_secs(10);
    const MAX: Duration = Duration::from_secs(300);
    let ran_for = Duration::from_nanos(u64::try_from(previous.finished_at - previous.started_at).unwrap_or(0));
    if ran_for > 2 * MAX || previous.backoff.is_zero() {
        return INITIAL;
    }
    (previous.backoff * 2).min(MAX)
}

/// The back-off a new run of `container` waits for, to be kept on it: that after its newest
/// run if that one ended, none after a change of its spec (kubelet keys back-off by spec hash).
pub fn backoff_before_run(runtime: &RuntimePod, container: &Container) -> Duration {
    match runtime.runs_of(&container.name).first() {
        Some(last) if last.state == ContainerRunState::Exited && last.hash == container_hash(container) => {
            restart_backoff(last)
        }
        _ => Duration::ZERO,
    }
}

/// When (ns since epoch) the dead run `previous` may be replaced.
pub fn restart_allowed_at(previous: &RuntimeContainer) -> i64 {
    let backoff = i64::try_from(restart_backoff(previous).as_nanos()).unwrap_or(i64::MAX);
    previous.finished_at.saturating_add(backoff)
}

/// Decides what to change so the runtime runs `pod`. `now` is nanoseconds since the epoch;
/// `started` says whether a running container has passed its startup probe (a sidecar must,
/// before the next init container starts).
pub fn compute_pod_actions(
    pod: &Pod,
    runtime: &RuntimePod,
    now: i64,
    started: &dyn Fn(&RuntimeContainer) -> bool,
) -> PodActions {
    let mut actions = PodActions::default();
    let policy = restart_policy(pod);
    let containers = pod.spec.as_ref().map(|s| s.containers.as_slice()).unwrap_or_default();
    let init_containers = pod.spec.as_ref().and_then(|s| s.init_containers.as_deref()).unwrap_or_default();
    let current = runtime.current_sandbox();

    for sandbox in runtime.sandboxes.iter().filter(|s| s.ready) {
        if Some(sandbox.id.as_str()) != current.map(|c| c.id.as_str()) {
            actions.stop_sandboxes.push(sandbox.id.clone());
        }
    }

    match current {
        None => {
            // kubelet does not give a Never pod whose containers ran a second sandbox.
            let ran_before = !runtime.containers.is_empty();
            let to_start: Vec<(String, u32)> = containers
                .iter()
                .filter_map(|c| {
                    let runs = runtime.runs_of(&c.name);
                    match runs.first() {
                        None => Some((c.name.clone(), 0)),
                        Some(last) if last.state == ContainerRunState::Running => {
                            Some((c.name.clone(), last.attempt + 1))
                        }
                        Some(last) => {
                            should_restart(policy, last.exit_code).then(|| (c.name.clone(), last.attempt + 1))
                        }
                    }
                })
                .collect();
            let done = to_start.is_empty() || (policy == "Never" && ran_before);
            if !done {
                let attempt = runtime.sandboxes.iter().map(|s| s.attempt + 1).max().unwrap_or(0);
                actions.create_sandbox = Some(attempt);
                // A new sandbox runs the init containers again, from the first.
                actions.start_containers = match init_containers.first() {
                    Some(first) => vec![(first.name.clone(), next_attempt(runtime, &first.name))],
                    None => to_start,
                };
                actions.kill_containers = running_ids(runtime, None);
            }
        }
        Some(sandbox) => {
            actions.kill_containers = running_ids(runtime, Some(&sandbox.id));
            let mut init_actions = PodActions::default();
            let here = InitContext { runtime, sandbox: &sandbox.id, policy, now, started };
            let init = init_step(init_containers, containers, &here, &mut init_actions);
            let mut finished = init != Init::Running;
            let containers_now = if init == Init::Done { containers } else { &[] };
            for c in containers_now {
                let runs = runtime.runs_of(&c.name);
                let Some(last) = runs.first() else {
                    finished = false;
                    actions.start_containers.push((c.name.clone(), 0));
                    continue;
                };
                let in_current = last.sandbox_id == sandbox.id;
                match last.state {
                    ContainerRunState::Running if in_current => {
                        finished = false;
                        if last.hash != container_hash(c) {
                            actions.kill_containers.push(last.id.clone());
                            actions.start_containers.push((c.name.clone(), last.attempt + 1));
                        }
                    }
                    ContainerRunState::Created if in_current => {
                        finished = false;
                        actions.start_created.push(last.id.clone());
                    }
                    _ if !in_current => {
                        finished = false;
                        actions.start_containers.push((c.name.clone(), last.attempt + 1));
                    }
                    _ => {
                        if should_restart(policy, last.exit_code) {
                            finished = false;
                            if now >= restart_allowed_at(last) {
                                actions.start_containers.push((c.name.clone(), last.attempt + 1));
                            } else {
                                actions.backing_off.push(c.name.clone());
                            }
                        }
                    }
                }
            }
            if finished {
                // kubelet's KillPod once the app containers are done: the sidecars stop too
                // (the last first), and none is restarted.
                for c in init_containers.iter().rev().filter(|c| is_sidecar(c)) {
                    let alive = |r: &&&RuntimeContainer| {
                        r.sandbox_id == sandbox.id
                            && matches!(r.state, ContainerRunState::Running | ContainerRunState::Created)
                    };
                    actions.kill_containers.extend(runtime.runs_of(&c.name).iter().filter(alive).map(|r| r.id.clone()));
                }
            } else {
                // The init containers' changes come first, as they are found in the spec's order.
                actions.kill_containers.append(&mut init_actions.kill_containers);
                init_actions.start_created.append(&mut actions.start_created);
                actions.start_created = init_actions.start_created;
                init_actions.start_containers.append(&mut actions.start_containers);
                actions.start_containers = init_actions.start_containers;
                init_actions.backing_off.append(&mut actions.backing_off);
                actions.backing_off = init_actions.backing_off;
            }
            // Containers the spec no longer has (kubelet kills unknown containers too).
            for c in &runtime.containers {
                let known = containers.iter().chain(init_containers).any(|spec| spec.name == c.name);
                let alive = matches!(c.state, ContainerRunState::Running | ContainerRunState::Created);
                if !known && alive && c.sandbox_id == sandbox.id {
                    actions.kill_containers.push(c.id.clone());
                }
            }
            // A finished pod gives its IP back, as kubelet stops the sandbox of a done pod.
            if finished && (!containers.is_empty() || init == Init::Failed) {
                actions.stop_sandboxes.push(sandbox.id.clone());
            }
        }
    }

    // Keep the newest run and the one before it of each container (status shows lastState).
    let mut keep: Vec<&str> = Vec::new();
    for c in containers.iter().chain(init_containers) {
        keep.extend(runtime.runs_of(&c.name).iter().take(2).map(|r| r.id.as_str()));
    }
    for c in &runtime.containers {
        let dead = matches!(c.state, ContainerRunState::Exited | ContainerRunState::Unknown);
        if dead && !keep.contains(&c.id.as_str()) {
            actions.remove_containers.push(c.id.clone());
        }
    }
    let newest = runtime.sandboxes.iter().max_by_key(|s| (s.attempt, s.created_at)).map(|s| s.id.as_str());
    for s in runtime.sandboxes.iter().filter(|s| !s.ready) {
        let holds_kept = runtime.containers.iter().any(|c| c.sandbox_id == s.id && keep.contains(&c.id.as_str()));
        if Some(s.id.as_str()) != newest && !holds_kept {
            actions.remove_sandboxes.push(s.id.clone());
        }
    }
    actions
}

/// Where a pod's init containers are in sandbox `sandbox`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Init {
    /// Every one succeeded, or has started for a sidecar (or there are none): the app
    /// containers run.
    Done,
    /// One is starting, running, or waiting to be retried.
    Running,
    /// One failed under restartPolicy Never: the pod has failed.
    Failed,
}

/// What [`init_step`] reads: the runtime's view of the current sandbox.
struct InitContext<'a> {
    runtime: &'a RuntimePod,
    sandbox: &'a str,
    policy: &'a str,
    now: i64,
    started: &'a dyn Fn(&RuntimeContainer) -> bool,
}

impl InitContext<'_> {
    fn ran_here(&self, name: &str) -> bool {
        self.runtime.runs_of(name).iter().any(|r| r.sandbox_id == self.sandbox)
    }

    /// The newest run of `name` in the current sandbox.
    fn last_here(&self, name: &str) -> Option<&RuntimeContainer> {
        self.runtime.runs_of(name).into_iter().find(|r| r.sandbox_id == self.sandbox)
    }
}

/// kubelet's `computeInitContainerActions`: init containers run one at a time, in order, each
/// to success in the current sandbox (a failed one is retried with the crash-loop back-off); a
/// sidecar counts once it runs and has passed its startup probe, and is restarted whenever it
/// exits, whatever the pod's restartPolicy. Once a later container has run here (the pod was
/// initialized), only sidecars are looked after.
fn init_step(
    init_containers: &[Container],
    containers: &[Container],
    here: &InitContext,
    actions: &mut PodActions,
) -> Init {
    for (i, c) in init_containers.iter().enumerate() {
        let initialized = init_containers[i + 1..].iter().chain(containers).any(|later| here.ran_here(&later.name));
        let sidecar = is_sidecar(c);
        if initialized && !sidecar {
            continue;
        }
        let Some(last) = here.last_here(&c.name) else {
            actions.start_containers.push((c.name.clone(), next_attempt(here.runtime, &c.name)));
            if initialized {
                continue;
            }
            return Init::Running;
        };
        let waiting = match last.state {
            ContainerRunState::Running if !sidecar => true,
            ContainerRunState::Running => {
                if last.hash != container_hash(c) {
                    actions.kill_containers.push(last.id.clone());
                    actions.start_containers.push((c.name.clone(), last.attempt + 1));
                    true
                } else {
                    !(here.started)(last)
                }
            }
            ContainerRunState::Created => {
                actions.start_created.push(last.id.clone());
                true
            }
            ContainerRunState::Exited if last.exit_code == 0 && !sidecar => false,
            ContainerRunState::Exited | ContainerRunState::Unknown => {
                if here.policy == "Never" && !sidecar {
                    return Init::Failed;
                }
                if here.now >= restart_allowed_at(last) {
                    actions.start_containers.push((c.name.clone(), last.attempt + 1));
                } else {
                    actions.backing_off.push(c.name.clone());
                }
                true
            }
        };
        if waiting && !initialized {
            return Init::Running;
        }
    }
    Init::Done
}

/// How a pod's containers stop (the kubelet's termination with sidecars): every other
/// container at once, then the sidecars one after the other, the last of the spec first, each
/// once those before it have stopped. `sidecars` are the sidecars' names in the spec's order.
pub fn stop_order<'a>(containers: &[&'a RuntimeContainer], sidecars: &[String]) -> Vec<Vec<&'a RuntimeContainer>> {
    let others: Vec<&RuntimeContainer> = containers.iter().copied().filter(|c| !sidecars.contains(&c.name)).collect();
    let sidecars = sidecars.iter().rev().map(|name| containers.iter().copied().filter(|c| &c.name == name).collect());
    std::iter::once(others).chain(sidecars).filter(|group: &Vec<_>| !group.is_empty()).collect()
}

/// The attempt number of the next run of container `name`.
fn next_attempt(runtime: &RuntimePod, name: &str) -> u32 {
    runtime.runs_of(name).first().map_or(0, |last| last.attempt + 1)
}

/// Running or created containers, except those in sandbox `keep`.
fn running_ids(runtime: &RuntimePod, keep: Option<&str>) -> Vec<String> {
    runtime
        .containers
        .iter()
        .filter(|c| matches!(c.state, ContainerRunState::Running | ContainerRunState::Created))
        .filter(|c| Some(c.sandbox_id.as_str()) != keep)
        .map(|c| c.id.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const SECOND: i64 = 1_000_000_000;

    /// The actions with every running container started (no startup probes).
    fn compute(pod: &Pod, runtime: &RuntimePod, now: i64) -> PodActions {
        compute_pod_actions(pod, runtime, now, &|_| true)
    }

    fn pod(policy: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": { "name": "web", "uid": "u-1" },
            "spec": { "restartPolicy": policy, "containers": [{ "name": "a", "image": "i:1" }, { "name": "b", "image": "i:1" }] },
        }))
        .expect("valid pod")
    }

    fn sandbox(id: &str, attempt: u32, ready: bool) -> RuntimeSandbox {
        RuntimeSandbox { id: id.into(), attempt, ready, created_at: i64::from(attempt) + 1, ips: vec![] }
    }

    fn container(
        pod: &Pod,
        id: &str,
        name: &str,
        attempt: u32,
        state: ContainerRunState,
        exit_code: i32,
    ) -> RuntimeContainer {
        let spec = pod
            .spec
            .as_ref()
            .and_then(|s| s.containers.iter().chain(s.init_containers.iter().flatten()).find(|c| c.name == name));
        RuntimeContainer {
            id: id.into(),
            sandbox_id: "s0".into(),
            name: name.into(),
            attempt,
            state,
            created_at: i64::from(attempt) + 1,
            started_at: 100 * SECOND,
            finished_at: if state == ContainerRunState::Exited { 101 * SECOND } else { 0 },
            exit_code,
            reason: String::new(),
            message: String::new(),
            image_ref: "sha256:1".into(),
            hash: spec.map(container_hash).unwrap_or_default(),
            ..RuntimeContainer::default()
        }
    }

    use ContainerRunState::{Created, Exited, Running};

    #[test]
    fn a_new_pod_gets_a_sandbox_and_all_containers() {
        let actions = compute(&pod("Always"), &RuntimePod::default(), 0);
        assert_eq!(actions.create_sandbox, Some(0));
        assert_eq!(actions.start_containers, [("a".to_string(), 0), ("b".to_string(), 0)]);
        assert!(actions.kill_containers.is_empty() && actions.stop_sandboxes.is_empty());
    }

    #[test]
    fn a_running_pod_is_left_alone() {
        let pod = pod("Always");
        let runtime = RuntimePod {
            sandboxes: vec![sandbox("s0", 0, true)],
            containers: vec![container(&pod, "a0", "a", 0, Running, 0), container(&pod, "b0", "b", 0, Running, 0)],
        };
        assert_eq!(compute(&pod, &runtime, 200 * SECOND), PodActions::default());
    }

    #[test]
    fn a_crashed_container_restarts_after_its_backoff() {
        let pod = pod("Always");
        let mut a1 = container(&pod, "a1", "a", 1, Exited, 1);
        a1.backoff = Duration::from_secs(10);
        let runtime = RuntimePod {
            sandboxes: vec![sandbox("s0", 0, true)],
            containers: vec![a1, container(&pod, "b0", "b", 0, Running, 0)],
        };
        // The second restart (after a first wait of 10 s) waits 20 s after the exit at 101 s.
        let early = compute(&pod, &runtime, 110 * SECOND);
        assert_eq!(early.backing_off, ["a"]);
        assert!(early.start_containers.is_empty());
        let later = compute(&pod, &runtime, 121 * SECOND);
        assert_eq!(later.start_containers, [("a".to_string(), 2)]);
    }

    #[test]
    fn a_changed_spec_replaces_the_container() {
        let pod = pod("Always");
        let mut stale = container(&pod, "a0", "a", 0, Running, 0);
        stale.hash = "old".into();
        let runtime = RuntimePod {
            sandboxes: vec![sandbox("s0", 0, true)],
            containers: vec![stale, container(&pod, "b0", "b", 0, Running, 0)],
        };
        let actions = compute(&pod, &runtime, 200 * SECOND);
        assert_eq!(actions.kill_containers, ["a0"]);
        assert_eq!(actions.start_containers, [("a".to_string(), 1)]);
    }

    #[test]
    fn a_finished_pod_gives_back_its_sandbox_and_gets_no_new_one() {
        let pod = pod("Never");
        let mut runtime = RuntimePod {
            sandboxes: vec![sandbox("s0", 0, true)],
            containers: vec![container(&pod, "a0", "a", 0, Exited, 0), container(&pod, "b0", "b", 0, Exited, 3)],
        };
        let actions = compute(&pod, &runtime, 200 * SECOND);
        assert_eq!(actions.stop_sandboxes, ["s0"]);
        assert!(actions.start_containers.is_empty());

        runtime.sandboxes[0].ready = false;
        let actions = compute(&pod, &runtime, 200 * SECOND);
        assert_eq!(actions, PodActions::default(), "a Never pod that ran is not started again");
    }

    #[test]
    fn on_failure_restarts_only_failed_containers_in_a_new_sandbox() {
        let pod = pod("OnFailure");
        let runtime = RuntimePod {
            sandboxes: vec![sandbox("s0", 0, false)],
            containers: vec![container(&pod, "a0", "a", 0, Exited, 0), container(&pod, "b0", "b", 0, Exited, 2)],
        };
        let actions = compute(&pod, &runtime, 200 * SECOND);
        assert_eq!(actions.create_sandbox, Some(1));
        assert_eq!(actions.start_containers, [("b".to_string(), 1)]);
    }

    #[test]
    fn created_containers_are_started_and_old_runs_collected() {
        let pod = pod("Always");
        let runtime = RuntimePod {
            sandboxes: vec![sandbox("s0", 0, true)],
            containers: vec![
                container(&pod, "a0", "a", 0, Exited, 1),
                container(&pod, "a1", "a", 1, Exited, 1),
                container(&pod, "a2", "a", 2, Running, 0),
                container(&pod, "b0", "b", 0, Created, 0),
            ],
        };
        let actions = compute(&pod, &runtime, 200 * SECOND);
        assert_eq!(actions.start_created, ["b0"]);
        assert_eq!(actions.remove_containers, ["a0"], "the newest run and the one before are kept");
    }

    #[test]
    fn extra_ready_sandboxes_are_stopped() {
        let pod = pod("Always");
        let mut old = container(&pod, "a0", "a", 0, Running, 0);
        old.sandbox_id = "s0".into();
        let runtime =
            RuntimePod { sandboxes: vec![sandbox("s0", 0, true), sandbox("s1", 1, true)], containers: vec![old] };
        let actions = compute(&pod, &runtime, 200 * SECOND);
        assert_eq!(actions.stop_sandboxes, ["s0"]);
        assert_eq!(actions.kill_containers, ["a0"]);
        assert_eq!(actions.start_containers, [("a".to_string(), 1), ("b".to_string(), 0)]);
    }

    #[test]
    fn backoff_doubles_to_five_minutes_and_a_long_run_resets_it() {
        let pod = pod("Always");
        let spec = &pod.spec.as_ref().expect("spec").containers[0];
        // Each run crashes after 1 s; its successor keeps the back-off it waited for.
        let mut run = container(&pod, "a0", "a", 0, Exited, 1);
        let mut waits = Vec::new();
        for attempt in 1..=8 {
            let wait = backoff_before_run(&RuntimePod { containers: vec![run.clone()], ..Default::default() }, spec);
            waits.push(wait.as_secs());
            run.attempt = attempt;
            run.backoff = wait;
            if attempt == 6 {
                run.finished_at = run.started_at + 601 * SECOND; // ran for more than 10 minutes
            } else {
                run.finished_at = run.started_at + SECOND;
            }
        }
        // The reset holds: the crash after it waits 10 s, the next 20 s, not 5 min again.
        assert_eq!(waits, [10, 20, 40, 80, 160, 300, 10, 20]);

        let mut changed = container(&pod, "a0", "a", 3, Exited, 1);
        changed.backoff = Duration::from_secs(80);
        changed.hash = "old".into();
        let runtime = RuntimePod { containers: vec![changed], ..Default::default() };
        assert_eq!(backoff_before_run(&runtime, spec), Duration::ZERO, "a new spec starts a new back-off");
        let running = RuntimePod { containers: vec![container(&pod, "a0", "a", 0, Running, 0)], ..Default::default() };
        assert_eq!(backoff_before_run(&running, spec), Duration::ZERO);
    }

    fn init_pod(policy: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": { "name": "web", "uid": "u-1" },
            "spec": {
                "restartPolicy": policy,
                "initContainers": [{ "name": "i1", "image": "i:1" }, { "name": "i2", "image": "i:1" }],
                "containers": [{ "name": "a", "image": "i:1" }],
            },
        }))
        .expect("valid pod")
    }

    /// A run of an init or app container of [`init_pod`] in sandbox `sandbox`.
    fn run_in(
        pod: &Pod,
        sandbox: &str,
        name: &str,
        attempt: u32,
        state: ContainerRunState,
        code: i32,
    ) -> RuntimeContainer {
        let mut run = container(pod, &format!("{name}-{sandbox}-{attempt}"), name, attempt, state, code);
        run.sandbox_id = sandbox.into();
        run
    }

    #[test]
    fn init_containers_run_in_order_each_to_success_before_the_app() {
        let start = |name: &str, attempt: u32| vec![(name.to_string(), attempt)];
        let none: Vec<(String, u32)> = Vec::new();
        struct Case {
            what: &'static str,
            policy: &'static str,
            runs: Vec<(&'static str, u32, ContainerRunState, i32)>,
            now: i64,
            start: Vec<(String, u32)>,
            backing_off: Vec<&'static str>,
            stop_sandbox: bool,
        }
        let case = |what, policy, runs, now, start, backing_off, stop_sandbox| Case {
            what,
            policy,
            runs,
            now,
            start,
            backing_off,
            stop_sandbox,
        };
        let cases = [
            case("nothing ran yet", "Always", vec![], 0, start("i1", 0), vec![], false),
            case("the first runs", "Always", vec![("i1", 0, Running, 0)], 0, none.clone(), vec![], false),
            case("the first succeeded", "Always", vec![("i1", 0, Exited, 0)], 0, start("i2", 0), vec![], false),
            case(
                "both succeeded: the app starts",
                "Always",
                vec![("i1", 0, Exited, 0), ("i2", 0, Exited, 0)],
                0,
                start("a", 0),
                vec![],
                false,
            ),
            case(
                "a failed init container backs off",
                "Always",
                vec![("i1", 0, Exited, 1)],
                105 * SECOND,
                none.clone(),
                vec!["i1"],
                false,
            ),
            case(
                "then runs again",
                "OnFailure",
                vec![("i1", 0, Exited, 1)],
                111 * SECOND,
                start("i1", 1),
                vec![],
                false,
            ),
            case("under Never the pod fails", "Never", vec![("i1", 0, Exited, 1)], 0, none.clone(), vec![], true),
            case(
                "the app's own restarts do not rerun init",
                "Always",
                vec![("i1", 0, Exited, 0), ("i2", 0, Exited, 0), ("a", 0, Exited, 1)],
                200 * SECOND,
                start("a", 1),
                vec![],
                false,
            ),
        ];
        for c in cases {
            let pod = init_pod(c.policy);
            let containers =
                c.runs.iter().map(|&(name, attempt, state, code)| run_in(&pod, "s0", name, attempt, state, code));
            let runtime = RuntimePod { sandboxes: vec![sandbox("s0", 0, true)], containers: containers.collect() };
            let actions = compute(&pod, &runtime, c.now);
            assert_eq!(actions.start_containers, c.start, "{}", c.what);
            assert_eq!(actions.backing_off, c.backing_off, "{}", c.what);
            assert_eq!(actions.stop_sandboxes == ["s0"], c.stop_sandbox, "{}", c.what);
        }

        // A new pod's sandbox starts with the first init container only.
        let actions = compute(&init_pod("Always"), &RuntimePod::default(), 0);
        assert_eq!((actions.create_sandbox, actions.start_containers), (Some(0), start("i1", 0)));
        // A created init container is started; app containers wait.
        let pod = init_pod("Always");
        let runtime = RuntimePod {
            sandboxes: vec![sandbox("s0", 0, true)],
            containers: vec![run_in(&pod, "s0", "i1", 0, Created, 0)],
        };
        let actions = compute(&pod, &runtime, 0);
        assert_eq!((actions.start_created, actions.start_containers), (vec!["i1-s0-0".to_string()], none.clone()));
        // A failed Never pod gets no new sandbox once its own is stopped.
        let runtime = RuntimePod {
            sandboxes: vec![sandbox("s0", 0, false)],
            containers: vec![run_in(&init_pod("Never"), "s0", "i1", 0, Exited, 1)],
        };
        assert_eq!(compute(&init_pod("Never"), &runtime, 0), PodActions::default());
        // A new sandbox runs the init containers again, even those that succeeded in the old one.
        let pod = init_pod("Always");
        let runtime = RuntimePod {
            sandboxes: vec![sandbox("s0", 0, false), sandbox("s1", 1, true)],
            containers: vec![
                run_in(&pod, "s0", "i1", 0, Exited, 0),
                run_in(&pod, "s0", "i2", 0, Exited, 0),
                run_in(&pod, "s0", "a", 0, Exited, 137),
            ],
        };
        let actions = compute(&pod, &runtime, 200 * SECOND);
        assert_eq!(actions.start_containers, start("i1", 1));
        assert!(actions.remove_containers.is_empty(), "init runs are kept: {actions:?}");
    }

    fn sidecar_pod(policy: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": { "name": "job", "uid": "u-1" },
            "spec": {
                "restartPolicy": policy,
                "initContainers": [
                    { "name": "i1", "image": "i:1" },
                    { "name": "side", "image": "i:1", "restartPolicy": "Always" },
                    { "name": "i2", "image": "i:1" },
                ],
                "containers": [{ "name": "a", "image": "i:1" }],
            },
        }))
        .expect("valid pod")
    }

    #[test]
    fn sidecars_start_in_order_run_beside_the_app_and_stop_after_it() {
        struct Case {
            what: &'static str,
            policy: &'static str,
            runs: Vec<(&'static str, ContainerRunState, i32)>,
            /// Whether the sidecar has passed its startup probe.
            started: bool,
            now: i64,
            start: Vec<&'static str>,
            backing_off: Vec<&'static str>,
            kill: Vec<&'static str>,
            stop_sandbox: bool,
        }
        let ok = |name| (name, Exited, 0);
        let running = |name| (name, Running, 0);
        let case = |what, policy, runs, start| Case {
            what,
            policy,
            runs,
            started: true,
            now: 200 * SECOND,
            start,
            backing_off: vec![],
            kill: vec![],
            stop_sandbox: false,
        };
        let cases = [
            case("the first init container runs first", "Always", vec![], vec!["i1"]),
            case("then the sidecar", "Always", vec![ok("i1")], vec!["side"]),
            case(
                "the next init container once the sidecar has started",
                "Always",
                vec![ok("i1"), running("side")],
                vec!["i2"],
            ),
            Case {
                started: false,
                ..case("not before its startup probe passed", "Always", vec![ok("i1"), running("side")], vec![])
            },
            case("the app beside the sidecar", "Never", vec![ok("i1"), running("side"), ok("i2")], vec!["a"]),
            case(
                "a running pod is left alone",
                "Never",
                vec![ok("i1"), running("side"), ok("i2"), running("a")],
                vec![],
            ),
            case(
                "an exited sidecar restarts under restartPolicy Never",
                "Never",
                vec![ok("i1"), ("side", Exited, 0), ok("i2"), running("a")],
                vec!["side"],
            ),
            Case {
                now: 105 * SECOND,
                backing_off: vec!["side"],
                ..case(
                    "after its crash-loop back-off",
                    "Always",
                    vec![ok("i1"), ("side", Exited, 1), ok("i2"), running("a")],
                    vec![],
                )
            },
            case(
                "one that exits before the next init container ran restarts first",
                "Never",
                vec![ok("i1"), ("side", Exited, 1)],
                vec!["side"],
            ),
            Case {
                kill: vec!["side"],
                stop_sandbox: true,
                ..case(
                    "the app succeeded: the sidecar stops with the pod",
                    "Never",
                    vec![ok("i1"), running("side"), ok("i2"), ok("a")],
                    vec![],
                )
            },
            Case {
                stop_sandbox: true,
                ..case(
                    "a stopped sidecar of a done pod stays stopped",
                    "OnFailure",
                    vec![ok("i1"), ("side", Exited, 137), ok("i2"), ok("a")],
                    vec![],
                )
            },
            case(
                "an app that fails under OnFailure restarts beside the sidecar",
                "OnFailure",
                vec![ok("i1"), running("side"), ok("i2"), ("a", Exited, 1)],
                vec!["a"],
            ),
            Case {
                kill: vec!["side"],
                stop_sandbox: true,
                ..case(
                    "an init container that fails under Never stops the sidecar",
                    "Never",
                    vec![ok("i1"), running("side"), ("i2", Exited, 1)],
                    vec![],
                )
            },
        ];
        for c in cases {
            let pod = sidecar_pod(c.policy);
            let runs = c.runs.iter().map(|&(name, state, code)| run_in(&pod, "s0", name, 0, state, code));
            let runtime = RuntimePod { sandboxes: vec![sandbox("s0", 0, true)], containers: runs.collect() };
            let actions = compute_pod_actions(&pod, &runtime, c.now, &|_| c.started);
            let started: Vec<&str> = actions.start_containers.iter().map(|(name, _)| name.as_str()).collect();
            assert_eq!(started, c.start, "{}", c.what);
            assert_eq!(actions.backing_off, c.backing_off, "{}", c.what);
            let killed: Vec<String> = c.kill.iter().map(|name| format!("{name}-s0-0")).collect();
            assert_eq!(actions.kill_containers, killed, "{}", c.what);
            assert_eq!(actions.stop_sandboxes == ["s0"], c.stop_sandbox, "{}", c.what);
        }

        // A sidecar whose spec changed is replaced in place; a new run keeps counting restarts.
        let pod = sidecar_pod("Always");
        let mut stale = run_in(&pod, "s0", "side", 2, Running, 0);
        stale.hash = "old".into();
        let runtime = RuntimePod {
            sandboxes: vec![sandbox("s0", 0, true)],
            containers: vec![run_in(&pod, "s0", "i1", 0, Exited, 0), stale, run_in(&pod, "s0", "i2", 0, Exited, 0)],
        };
        let actions = compute(&pod, &runtime, 200 * SECOND);
        assert_eq!(actions.kill_containers, ["side-s0-2"]);
        assert_eq!(actions.start_containers, [("side".to_string(), 3), ("a".to_string(), 0)]);
    }

    #[test]
    fn sidecars_stop_after_the_other_containers_the_last_first() {
        let run = |name: &str| RuntimeContainer { id: format!("{name}-0"), name: name.into(), ..Default::default() };
        let (app, log, proxy, init) = (run("app"), run("log"), run("proxy"), run("init"));
        let sidecars = vec!["log".to_string(), "proxy".to_string()];
        let cases = [
            ("no sidecars: all at once", vec![&app, &init], vec![], vec![vec!["app", "init"]]),
            (
                "the app, then the sidecars in reverse",
                vec![&log, &app, &proxy],
                sidecars.clone(),
                vec![vec!["app"], vec!["proxy"], vec!["log"]],
            ),
            ("only sidecars left", vec![&log], sidecars.clone(), vec![vec!["log"]]),
            ("nothing to stop", vec![], sidecars, vec![]),
        ];
        for (what, alive, sidecars, expected) in cases {
            let groups: Vec<Vec<&str>> =
                stop_order(&alive, &sidecars).iter().map(|g| g.iter().map(|c| c.name.as_str()).collect()).collect();
            assert_eq!(groups, expected, "{what}");
        }
    }
}
