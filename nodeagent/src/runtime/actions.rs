//! What the runtime holds for a pod, and the pure decision of what to change (kubelet's
//! `computePodActions`): the I/O shell in [`super::RuntimeManager`] observes, this decides.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

use super::spec::{container_hash, restart_policy};

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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContainerRunState {
    Created,
    Running,
    Exited,
    Unknown,
}

/// One container as the runtime reports it (CRI `ContainerStatus`).
#[derive(Clone, Debug, PartialEq, Eq)]
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
    /// Containers to create and start: spec name and attempt (= restartCount).
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

/// kubelet's crash-loop back-off: 10 s doubling to 5 min, reset after 10 min of running.
pub fn restart_backoff(previous: &RuntimeContainer) -> Duration {
    const INITIAL: u64 = 10;
    const MAX: u64 = 300;
    let ran_for = Duration::from_nanos(u64::try_from(previous.finished_at - previous.started_at).unwrap_or(0));
    if ran_for > Duration::from_secs(2 * MAX) {
        return Duration::from_secs(INITIAL);
    }
    Duration::from_secs(INITIAL.saturating_mul(1 << previous.attempt.min(5)).min(MAX))
}

/// When (ns since epoch) the dead run `previous` may be replaced.
pub fn restart_allowed_at(previous: &RuntimeContainer) -> i64 {
    let backoff = i64::try_from(restart_backoff(previous).as_nanos()).unwrap_or(i64::MAX);
    previous.finished_at.saturating_add(backoff)
}

/// Decides what to change so the runtime runs `pod`. `now` is nanoseconds since the epoch.
pub fn compute_pod_actions(pod: &Pod, runtime: &RuntimePod, now: i64) -> PodActions {
    let mut actions = PodActions::default();
    let policy = restart_policy(pod);
    let containers = pod.spec.as_ref().map(|s| s.containers.as_slice()).unwrap_or_default();
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
                actions.start_containers = to_start;
                actions.kill_containers = running_ids(runtime, None);
            }
        }
        Some(sandbox) => {
            actions.kill_containers = running_ids(runtime, Some(&sandbox.id));
            let mut finished = true;
            for c in containers {
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
            // Containers the spec no longer has (kubelet kills unknown containers too).
            for c in &runtime.containers {
                let known = containers.iter().any(|spec| spec.name == c.name);
                let alive = matches!(c.state, ContainerRunState::Running | ContainerRunState::Created);
                if !known && alive && c.sandbox_id == sandbox.id {
                    actions.kill_containers.push(c.id.clone());
                }
            }
            // A finished pod gives its IP back, as kubelet stops the sandbox of a done pod.
            if finished && !containers.is_empty() {
                actions.stop_sandboxes.push(sandbox.id.clone());
            }
        }
    }

    // Keep the newest run and the one before it of each container (status shows lastState).
    let mut keep: Vec<&str> = Vec::new();
    for c in containers {
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
        let spec = pod.spec.as_ref().and_then(|s| s.containers.iter().find(|c| c.name == name));
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
        }
    }

    use ContainerRunState::{Created, Exited, Running};

    #[test]
    fn a_new_pod_gets_a_sandbox_and_all_containers() {
        let actions = compute_pod_actions(&pod("Always"), &RuntimePod::default(), 0);
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
        assert_eq!(compute_pod_actions(&pod, &runtime, 200 * SECOND), PodActions::default());
    }

    #[test]
    fn a_crashed_container_restarts_after_its_backoff() {
        let pod = pod("Always");
        let runtime = RuntimePod {
            sandboxes: vec![sandbox("s0", 0, true)],
            containers: vec![container(&pod, "a1", "a", 1, Exited, 1), container(&pod, "b0", "b", 0, Running, 0)],
        };
        // The second restart waits 20 s after the exit at 101 s.
        let early = compute_pod_actions(&pod, &runtime, 110 * SECOND);
        assert_eq!(early.backing_off, ["a"]);
        assert!(early.start_containers.is_empty());
        let later = compute_pod_actions(&pod, &runtime, 121 * SECOND);
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
        let actions = compute_pod_actions(&pod, &runtime, 200 * SECOND);
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
        let actions = compute_pod_actions(&pod, &runtime, 200 * SECOND);
        assert_eq!(actions.stop_sandboxes, ["s0"]);
        assert!(actions.start_containers.is_empty());

        runtime.sandboxes[0].ready = false;
        let actions = compute_pod_actions(&pod, &runtime, 200 * SECOND);
        assert_eq!(actions, PodActions::default(), "a Never pod that ran is not started again");
    }

    #[test]
    fn on_failure_restarts_only_failed_containers_in_a_new_sandbox() {
        let pod = pod("OnFailure");
        let runtime = RuntimePod {
            sandboxes: vec![sandbox("s0", 0, false)],
            containers: vec![container(&pod, "a0", "a", 0, Exited, 0), container(&pod, "b0", "b", 0, Exited, 2)],
        };
        let actions = compute_pod_actions(&pod, &runtime, 200 * SECOND);
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
        let actions = compute_pod_actions(&pod, &runtime, 200 * SECOND);
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
        let actions = compute_pod_actions(&pod, &runtime, 200 * SECOND);
        assert_eq!(actions.stop_sandboxes, ["s0"]);
        assert_eq!(actions.kill_containers, ["a0"]);
        assert_eq!(actions.start_containers, [("a".to_string(), 1), ("b".to_string(), 0)]);
    }

    #[test]
    fn backoff_doubles_to_five_minutes() {
        let pod = pod("Always");
        let mut run = container(&pod, "a", "a", 0, Exited, 1);
        let backoffs: Vec<u64> = (0..7)
            .map(|attempt| {
                run.attempt = attempt;
                restart_backoff(&run).as_secs()
            })
            .collect();
        assert_eq!(backoffs, [10, 20, 40, 80, 160, 300, 300]);
        run.finished_at = run.started_at + 700 * SECOND;
        assert_eq!(restart_backoff(&run).as_secs(), 10, "a long run resets the back-off");
    }
}
