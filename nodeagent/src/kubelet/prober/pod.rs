//! What a Pod's probe results mean, decided purely: for its status (the kubelet's prober manager
//! `UpdatePodStatus`: each container's `started` and `ready`) and for its containers
//! (kuberuntime's `computePodActions`: a container that failed its liveness or startup probe is
//! killed, and started again under the Pod's restartPolicy).

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, ContainerStatus, Pod};

use super::results::{ProbeResult, ProbeType, Results};
use super::worker::started;
use crate::kubelet::runtime::actions::{
    CONTAINER_ID_PREFIX, ContainerRunState, PodActions, RuntimePod, restart_allowed_at,
};
use crate::kubelet::runtime::spec::{is_sidecar, restart_policy};

/// A Pod's probes at one moment: which probes each container has, and their results. The
/// runtime manager reads it while it syncs the Pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodProbes {
    /// By container name: whether it has each [`ProbeType`] (indexed by it).
    probed: HashMap<String, [bool; 3]>,
    results: Results,
}

impl PodProbes {
    pub fn new(probed: impl IntoIterator<Item = (String, ProbeType)>, results: Results) -> PodProbes {
        let mut by_name: HashMap<String, [bool; 3]> = HashMap::new();
        for (name, probe) in probed {
            by_name.entry(name).or_default()[probe as usize] = true;
        }
        PodProbes { probed: by_name, results }
    }

    fn has(&self, container: &str, probe: ProbeType) -> bool {
        self.probed.get(container).is_some_and(|p| p[probe as usize])
    }

    /// Sets each container's `started` and `ready` from the probes (kubelet's prober manager
    /// `UpdatePodStatus`): a running container has started once its startup probe succeeded
    /// (at once without one), and is ready once started and its readiness probe succeeded (at
    /// once without one; a readiness probe that has not run yet means not ready).
    pub fn update_container_statuses(&self, statuses: &mut [ContainerStatus]) {
        for status in statuses {
            let Some(id) = status.container_id.as_deref().map(bare_id) else {
                continue;
            };
            let running = status.state.as_ref().is_some_and(|s| s.running.is_some());
            let started = started(&self.results, id, running, self.has(&status.name, ProbeType::Startup));
            status.started = Some(started);
            status.ready = started
                && match self.results.get(id, ProbeType::Readiness) {
                    Some(result) => result == ProbeResult::Success,
                    None => !self.has(&status.name, ProbeType::Readiness),
                };
        }
    }

    /// Whether running container `name`'s run `container_id` has passed its startup probe (at
    /// once without one).
    pub fn started(&self, name: &str, container_id: &str) -> bool {
        started(&self.results, container_id, true, self.has(name, ProbeType::Startup))
    }

    /// The probe a container run failed, among those that kill it (liveness, then startup).
    pub fn failed(&self, container_id: &str) -> Option<ProbeType> {
        [ProbeType::Liveness, ProbeType::Startup]
            .into_iter()
            .find(|probe| self.results.get(container_id, *probe) == Some(ProbeResult::Failure))
    }
}

/// A container id without the runtime's prefix (`containerd://`).
pub fn bare_id(id: &str) -> &str {
    id.strip_prefix(CONTAINER_ID_PREFIX).unwrap_or(id)
}

/// A container run to kill because it failed a probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unhealthy {
    pub id: String,
    pub name: String,
    pub probe: ProbeType,
    /// The probe's own `terminationGracePeriodSeconds`, else the Pod's.
    pub grace: Duration,
    /// Whether a new run starts in this sync (`actions` has it), as the kubelet restarts a
    /// killed container at once unless the restartPolicy is Never or it is in back-off.
    pub restart: bool,
}

impl Unhealthy {
    /// The kubelet's message when it kills the container.
    pub fn message(&self) -> String {
        let then = if self.restart { ", will be restarted" } else { "" };
        format!("Container {} failed {} probe{then}", self.name, self.probe)
    }
}

/// The running containers of the Pod's current sandbox that failed their liveness or startup
/// probe, to be killed (before anything else in `actions`); each one's new run is added to
/// `actions` when it may start now. A container that `actions` already replaces (its spec
/// changed) is left to that.
pub fn kill_unhealthy(
    pod: &Pod,
    runtime: &RuntimePod,
    probes: &PodProbes,
    now: i64,
    actions: &mut PodActions,
) -> Vec<Unhealthy> {
    let Some(sandbox) = runtime.current_sandbox() else {
        return Vec::new();
    };
    let never = restart_policy(pod) == "Never";
    let spec = pod.spec.as_ref();
    let containers = spec.map(|s| s.containers.as_slice()).unwrap_or_default();
    let sidecars = spec.and_then(|s| s.init_containers.as_deref()).unwrap_or_default().iter().filter(|c| is_sidecar(c));
    let mut unhealthy = Vec::new();
    for container in containers.iter().chain(sidecars) {
        let runs = runtime.runs_of(&container.name);
        let Some(last) = runs.first() else { continue };
        if last.state != ContainerRunState::Running
            || last.sandbox_id != sandbox.id
            || actions.kill_containers.contains(&last.id)
        {
            continue;
        }
        let Some(probe) = probes.failed(&last.id) else { continue };
        // The kubelet's start of the new run goes through the crash-loop back-off, which only
        // a previous run that exited can have started.
        let previous_exit = runs.iter().skip(1).find(|r| r.state == ContainerRunState::Exited);
        // A sidecar restarts whatever the Pod's restartPolicy.
        let restart = (!never || is_sidecar(container))
            && previous_exit.is_none_or(|previous| now >= restart_allowed_at(previous));
        if restart {
            actions.start_containers.push((container.name.clone(), last.attempt + 1));
        }
        unhealthy.push(Unhealthy {
            id: last.id.clone(),
            name: container.name.clone(),
            probe,
            grace: grace_period(pod, container, probe),
            restart,
        });
    }
    unhealthy
}

/// The kubelet's `setTerminationGracePeriod` for a probe's kill.
fn grace_period(pod: &Pod, container: &Container, probe: ProbeType) -> Duration {
    let spec = match probe {
        ProbeType::Liveness => container.liveness_probe.as_ref(),
        ProbeType::Startup => container.startup_probe.as_ref(),
        ProbeType::Readiness => None,
    };
    let seconds = spec
        .and_then(|p| p.termination_grace_period_seconds)
        .or_else(|| pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds))
        .unwrap_or(30);
    Duration::from_secs(u64::try_from(seconds).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubelet::runtime::actions::{RuntimeContainer, RuntimeSandbox};
    use crate::kubelet::runtime::spec::container_hash;
    use ProbeResult::{Failure, Success, Unknown};
    use serde_json::json;

    const SECOND: i64 = 1_000_000_000;

    fn pod(policy: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": { "name": "web", "uid": "u-1" },
            "spec": {
                "restartPolicy": policy,
                "terminationGracePeriodSeconds": 5,
                "initContainers": [
                    { "name": "log", "image": "i:1", "restartPolicy": "Always", "livenessProbe": { "exec": { "command": ["true"] } } },
                ],
                "containers": [
                    { "name": "web", "image": "i:1", "livenessProbe": { "tcpSocket": { "port": 80 }, "terminationGracePeriodSeconds": 2 } },
                    { "name": "side", "image": "i:1", "startupProbe": { "exec": { "command": ["true"] } } },
                ],
            },
        }))
        .expect("valid pod")
    }

    fn run(
        pod: &Pod,
        id: &str,
        name: &str,
        attempt: u32,
        state: ContainerRunState,
        finished_at: i64,
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
            finished_at,
            exit_code: if state == ContainerRunState::Exited { 137 } else { 0 },
            reason: String::new(),
            message: String::new(),
            image_ref: "sha256:1".into(),
            hash: spec.map(container_hash).unwrap_or_default(),
            ..RuntimeContainer::default()
        }
    }

    fn runtime(containers: Vec<RuntimeContainer>) -> RuntimePod {
        let sandbox = RuntimeSandbox { id: "s0".into(), attempt: 0, ready: true, created_at: 1, ips: vec![] };
        RuntimePod { sandboxes: vec![sandbox], containers }
    }

    fn probes(results: &[(&str, ProbeType, ProbeResult)]) -> PodProbes {
        let mut r = Results::default();
        for (id, probe, result) in results {
            r.set(id, *probe, *result);
        }
        PodProbes::new([("web".to_string(), ProbeType::Liveness), ("side".to_string(), ProbeType::Startup)], r)
    }

    use ContainerRunState::{Exited, Running};
    use ProbeType::{Liveness, Readiness, Startup};

    #[test]
    fn what_a_failed_probe_does_to_the_container() {
        struct Case {
            what: &'static str,
            policy: &'static str,
            runs: Vec<(&'static str, &'static str, u32, ContainerRunState, i64)>,
            results: Vec<(&'static str, ProbeType, ProbeResult)>,
            kills: Vec<(&'static str, ProbeType, u64, bool)>,
            starts: Vec<(&'static str, u32)>,
        }
        let healthy = vec![("w0", "web", 0, Running, 0), ("s0", "side", 0, Running, 0)];
        let cases = [
            Case {
                what: "healthy",
                policy: "Always",
                runs: healthy.clone(),
                results: vec![("w0", Liveness, Success), ("s0", Startup, Success)],
                kills: vec![],
                starts: vec![],
            },
            Case {
                what: "liveness failed: killed with the probe's grace, restarted at once",
                policy: "Always",
                runs: healthy.clone(),
                results: vec![("w0", Liveness, Failure), ("s0", Startup, Unknown)],
                kills: vec![("w0", Liveness, 2, true)],
                starts: vec![("web", 1)],
            },
            Case {
                what: "startup failed: killed with the Pod's grace",
                policy: "OnFailure",
                runs: healthy.clone(),
                results: vec![("s0", Startup, Failure)],
                kills: vec![("s0", Startup, 5, true)],
                starts: vec![("side", 1)],
            },
            Case {
                what: "restartPolicy Never: killed, not restarted",
                policy: "Never",
                runs: healthy.clone(),
                results: vec![("w0", Liveness, Failure)],
                kills: vec![("w0", Liveness, 2, false)],
                starts: vec![],
            },
            Case {
                what: "a sidecar restarts under restartPolicy Never",
                policy: "Never",
                runs: vec![("l0", "log", 0, Running, 0), ("w0", "web", 0, Running, 0)],
                results: vec![("l0", Liveness, Failure)],
                kills: vec![("l0", Liveness, 5, true)],
                starts: vec![("log", 1)],
            },
            Case {
                what: "a readiness failure kills nothing",
                policy: "Always",
                runs: healthy.clone(),
                results: vec![("w0", Readiness, Failure)],
                kills: vec![],
                starts: vec![],
            },
            Case {
                what: "killed before, within the back-off: no restart now",
                policy: "Always",
                runs: vec![("w1", "web", 1, Running, 0), ("w0", "web", 0, Exited, 101 * SECOND)],
                results: vec![("w1", Liveness, Failure)],
                kills: vec![("w1", Liveness, 2, false)],
                starts: vec![],
            },
            Case {
                what: "an exited run's failure is history",
                policy: "Always",
                runs: vec![("w0", "web", 0, Exited, 101 * SECOND)],
                results: vec![("w0", Liveness, Failure)],
                kills: vec![],
                starts: vec![],
            },
        ];
        for case in cases {
            let pod = pod(case.policy);
            let runs =
                case.runs.iter().map(|(id, name, attempt, state, at)| run(&pod, id, name, *attempt, *state, *at));
            let runtime = runtime(runs.collect());
            let mut actions = PodActions::default();
            let killed = kill_unhealthy(&pod, &runtime, &probes(&case.results), 105 * SECOND, &mut actions);
            let killed: Vec<_> =
                killed.iter().map(|u| (u.id.as_str(), u.probe, u.grace.as_secs(), u.restart)).collect();
            assert_eq!(killed, case.kills, "{}", case.what);
            let starts: Vec<_> = actions.start_containers.iter().map(|(n, a)| (n.as_str(), *a)).collect();
            assert_eq!(starts, case.starts, "{}", case.what);
        }
    }

    #[test]
    fn a_container_being_replaced_is_left_to_that() {
        let pod = pod("Always");
        let runtime = runtime(vec![run(&pod, "w0", "web", 0, Running, 0)]);
        let mut actions = PodActions {
            kill_containers: vec!["w0".into()],
            start_containers: vec![("web".into(), 1)],
            ..Default::default()
        };
        assert!(kill_unhealthy(&pod, &runtime, &probes(&[("w0", Liveness, Failure)]), 0, &mut actions).is_empty());
        assert_eq!(actions.start_containers.len(), 1);
    }

    #[test]
    fn kill_messages_are_the_kubelets() {
        let u =
            Unhealthy { id: "w0".into(), name: "web".into(), probe: Liveness, grace: Duration::ZERO, restart: true };
        assert_eq!(u.message(), "Container web failed liveness probe, will be restarted");
        let u = Unhealthy { restart: false, probe: Startup, ..u };
        assert_eq!(u.message(), "Container web failed startup probe");
    }

    fn status(name: &str, id: &str, running: bool) -> ContainerStatus {
        serde_json::from_value(json!({
            "name": name, "image": "i:1", "imageID": "", "restartCount": 0, "ready": running,
            "containerID": format!("containerd://{id}"),
            "state": if running { json!({ "running": {} }) } else { json!({ "waiting": { "reason": "CrashLoopBackOff" } }) },
        }))
        .expect("a container status")
    }

    #[test]
    fn started_and_ready_come_from_the_probes() {
        let probed = [("r".to_string(), Readiness), ("s".to_string(), Startup), ("s".to_string(), Readiness)];
        let flags = |results: &[(&str, ProbeType, ProbeResult)], running: bool| {
            let mut r = Results::default();
            for (id, probe, result) in results {
                r.set(id, *probe, *result);
            }
            let probes = PodProbes::new(probed.clone(), r);
            let mut statuses =
                vec![status("plain", "p", running), status("r", "r", running), status("s", "s", running)];
            probes.update_container_statuses(&mut statuses);
            statuses.iter().map(|s| (s.started == Some(true), s.ready)).collect::<Vec<_>>()
        };
        // (started, ready) of: no probes, a readiness probe, a startup and a readiness probe.
        assert_eq!(flags(&[], true), [(true, true), (true, false), (false, false)], "probes not run yet");
        assert_eq!(
            flags(&[("r", Readiness, Success), ("s", Startup, Unknown), ("s", Readiness, Success)], true),
            [(true, true), (true, true), (false, false)],
            "not started: not ready, whatever readiness says"
        );
        assert_eq!(
            flags(&[("r", Readiness, Failure), ("s", Startup, Success), ("s", Readiness, Success)], true),
            [(true, true), (true, false), (true, true)]
        );
        assert_eq!(
            flags(&[("r", Readiness, Success), ("s", Startup, Success), ("s", Readiness, Success)], false),
            [(false, false), (false, false), (false, false)],
            "a container that does not run is neither"
        );
    }
}
