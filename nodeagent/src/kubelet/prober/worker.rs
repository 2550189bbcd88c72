//! One probe of one container, as the kubelet's prober `worker`: the pure decisions of each
//! period (whether to probe at all, what a run of results means). The I/O shell in
//! [`super::PodProber`] runs the probe when this says so.

use std::time::Duration;

use k8s_openapi::api::core::v1::Probe;

use super::results::{ProbeResult, ProbeType, Results};

/// A probe's timing fields with Kubernetes' defaults (`SetDefaults_Probe`: a zero or unset
/// field takes the default; negative values are refused at validation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    pub initial_delay: Duration,
    pub period: Duration,
    pub timeout: Duration,
    pub success_threshold: u32,
    pub failure_threshold: u32,
}

impl Timing {
    pub fn of(probe: &Probe, probe_type: ProbeType) -> Timing {
        let positive =
            |v: Option<i32>, default: u32| v.and_then(|v| u32::try_from(v).ok()).filter(|v| *v > 0).unwrap_or(default);
        let seconds = |v: Option<i32>, default: u32| Duration::from_secs(u64::from(positive(v, default)));
        Timing {
            initial_delay: Duration::from_secs(u64::from(
                probe.initial_delay_seconds.and_then(|v| u32::try_from(v).ok()).unwrap_or(0),
            )),
            period: seconds(probe.period_seconds, 10),
            timeout: seconds(probe.timeout_seconds, 1),
            // Must be 1 for liveness and startup (validation says so; the agent holds to it).
            success_threshold: match probe_type {
                ProbeType::Readiness => positive(probe.success_threshold, 1),
                ProbeType::Liveness | ProbeType::Startup => 1,
            },
            failure_threshold: positive(probe.failure_threshold, 3),
        }
    }
}

/// What the Pod's last status says of the probed container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    /// Empty until the container is created.
    pub container_id: String,
    pub state: State,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Running for this long.
    Running(Duration),
    Waiting,
    Terminated,
}

/// What the worker knows of the Pod around its container.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PodContext {
    /// The Pod is being deleted (graceful termination has begun).
    pub deleting: bool,
    /// The Pod has finished (Succeeded or Failed).
    pub finished: bool,
    /// `restartPolicy: Never`: a terminated container will not run again.
    pub restart_never: bool,
    /// The container has a startup probe, which gates the others.
    pub has_startup_probe: bool,
}

/// What to do this period.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Run the probe, then report its result with [`Worker::after_probe`].
    Probe,
    /// Nothing to probe now; look again next period.
    Wait,
    /// Never probe again (the container will not run again, or the Pod is going away).
    Stop,
}

/// Whether the container has passed its startup probe (kubelet's `isContainerStarted`).
pub fn started(results: &Results, container_id: &str, running: bool, has_startup_probe: bool) -> bool {
    if !running {
        return false;
    }
    match results.get(container_id, ProbeType::Startup) {
        Some(result) => result == ProbeResult::Success,
        None => !has_startup_probe,
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Worker {
    pub probe_type: ProbeType,
    pub timing: Timing,
    /// The container run the results are about.
    container_id: String,
    /// After a liveness or startup failure, nothing is probed until a new run of the container.
    on_hold: bool,
    last_result: Option<ProbeResult>,
    /// How many times in a row `last_result` came out.
    result_run: u32,
}

impl Worker {
    pub fn new(probe_type: ProbeType, timing: Timing) -> Worker {
        Worker { probe_type, timing, container_id: String::new(), on_hold: false, last_result: None, result_run: 0 }
    }

    pub fn container_id(&self) -> &str {
        &self.container_id
    }

    /// The kubelet's `doProbe` up to the probe itself. Updates `results`; the bool says whether
    /// a published result changed (the Pod's worker must then sync).
    pub fn before_probe(
        &mut self,
        pod: PodContext,
        container: Option<&Observed>,
        results: &mut Results,
    ) -> (Step, bool) {
        if pod.finished {
            return (Step::Stop, false);
        }
        let Some(container) = container.filter(|c| !c.container_id.is_empty()) else {
            return (Step::Wait, false);
        };
        let mut changed = false;
        if self.container_id != container.container_id {
            if !self.container_id.is_empty() {
                results.remove(&self.container_id, self.probe_type);
                changed = true;
            }
            self.container_id.clone_from(&container.container_id);
            changed |= results.set(&self.container_id, self.probe_type, self.probe_type.initial());
            self.on_hold = false;
            self.last_result = None;
            self.result_run = 0;
        }
        if self.on_hold {
            return (Step::Wait, changed);
        }
        let State::Running(running_for) = container.state else {
            changed |= results.set(&self.container_id, self.probe_type, ProbeResult::Failure);
            let stop = container.state == State::Terminated && pod.restart_never;
            return (if stop { Step::Stop } else { Step::Wait }, changed);
        };
        if pod.deleting && matches!(self.probe_type, ProbeType::Liveness | ProbeType::Startup) {
            // A quiet shutdown: the Pod is going away, nothing is restarted for failing now.
            changed |= results.set(&self.container_id, self.probe_type, ProbeResult::Success);
            return (Step::Stop, changed);
        }
        // Whole seconds, as the kubelet compares them.
        if running_for.as_secs() < self.timing.initial_delay.as_secs() {
            return (Step::Wait, changed);
        }
        let started = started(results, &self.container_id, true, pod.has_startup_probe);
        // A startup probe stops once the container has started; the others wait for it.
        if started == (self.probe_type == ProbeType::Startup) {
            return (Step::Wait, changed);
        }
        (Step::Probe, changed)
    }

    /// Counts a probe's result against the thresholds and publishes it once one is reached.
    /// `Unknown` (the probe could not be run) is thrown away. Whether a published result changed.
    pub fn after_probe(&mut self, result: ProbeResult, results: &mut Results) -> bool {
        if result == ProbeResult::Unknown || self.container_id.is_empty() {
            return false;
        }
        if self.last_result == Some(result) {
            self.result_run = self.result_run.saturating_add(1);
        } else {
            self.last_result = Some(result);
            self.result_run = 1;
        }
        let threshold = match result {
            ProbeResult::Failure => self.timing.failure_threshold,
            _ => self.timing.success_threshold,
        };
        if self.result_run < threshold {
            return false;
        }
        let changed = results.set(&self.container_id, self.probe_type, result);
        if result == ProbeResult::Failure && matches!(self.probe_type, ProbeType::Liveness | ProbeType::Startup) {
            // The container will be killed: probing it meanwhile could only disturb that.
            self.on_hold = true;
            self.result_run = 0;
        }
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ProbeResult::{Failure, Success, Unknown};
    use serde_json::json;

    fn timing(probe: serde_json::Value, probe_type: ProbeType) -> Timing {
        Timing::of(&serde_json::from_value(probe).expect("a probe"), probe_type)
    }

    #[test]
    fn timing_takes_kubernetes_defaults() {
        let s = Duration::from_secs;
        let defaults = timing(json!({ "exec": { "command": ["true"] } }), ProbeType::Readiness);
        assert_eq!(
            defaults,
            Timing { initial_delay: s(0), period: s(10), timeout: s(1), success_threshold: 1, failure_threshold: 3 }
        );
        let zeros = json!({ "periodSeconds": 0, "timeoutSeconds": 0, "successThreshold": 0, "failureThreshold": 0 });
        assert_eq!(
            timing(zeros, ProbeType::Readiness),
            defaults,
            "zero means the default, as the API server defaults it"
        );
        let set = json!({ "initialDelaySeconds": 5, "periodSeconds": 2, "timeoutSeconds": 3, "successThreshold": 2, "failureThreshold": 7 });
        assert_eq!(
            timing(set.clone(), ProbeType::Readiness),
            Timing { initial_delay: s(5), period: s(2), timeout: s(3), success_threshold: 2, failure_threshold: 7 }
        );
        assert_eq!(timing(set, ProbeType::Liveness).success_threshold, 1, "liveness needs one success");
    }

    fn running(id: &str, secs: u64) -> Observed {
        Observed { container_id: id.into(), state: State::Running(Duration::from_secs(secs)) }
    }

    fn worker(probe_type: ProbeType, success: u32, failure: u32, initial_delay: u64) -> Worker {
        let timing = Timing {
            initial_delay: Duration::from_secs(initial_delay),
            period: Duration::from_secs(1),
            timeout: Duration::from_secs(1),
            success_threshold: success,
            failure_threshold: failure,
        };
        Worker::new(probe_type, timing)
    }

    /// Runs a worker over a sequence of periods; each is (observed container, probe result if
    /// probed). Returns, per period, the step and the published result afterwards.
    fn run(
        w: &mut Worker,
        pod: PodContext,
        periods: &[(Option<Observed>, ProbeResult)],
    ) -> Vec<(Step, Option<ProbeResult>)> {
        let mut results = Results::default();
        periods
            .iter()
            .map(|(container, result)| {
                let (step, _) = w.before_probe(pod, container.as_ref(), &mut results);
                if step == Step::Probe {
                    w.after_probe(*result, &mut results);
                }
                let id = container.as_ref().map(|c| c.container_id.as_str()).unwrap_or("");
                (step, results.get(id, w.probe_type))
            })
            .collect()
    }

    use Step::{Probe, Stop, Wait};

    #[test]
    fn readiness_starts_as_failure_and_needs_its_success_threshold() {
        let mut w = worker(ProbeType::Readiness, 2, 3, 0);
        let c = || Some(running("c1", 5));
        let got = run(
            &mut w,
            PodContext::default(),
            &[(None, Success), (c(), Success), (c(), Success), (c(), Failure), (c(), Failure), (c(), Failure)],
        );
        assert_eq!(
            got,
            [
                (Wait, None),
                (Probe, Some(Failure)),
                (Probe, Some(Success)),
                (Probe, Some(Success)),
                (Probe, Some(Success)),
                (Probe, Some(Failure)),
            ]
        );
    }

    #[test]
    fn a_result_between_failures_restarts_the_count() {
        let mut w = worker(ProbeType::Liveness, 1, 3, 0);
        let c = || Some(running("c1", 5));
        let got: Vec<_> = run(
            &mut w,
            PodContext::default(),
            &[
                (c(), Failure),
                (c(), Failure),
                (c(), Success),
                (c(), Failure),
                (c(), Failure),
                (c(), Unknown),
                (c(), Failure),
            ],
        )
        .into_iter()
        .map(|(_, r)| r)
        .collect();
        let s = Some(Success);
        assert_eq!(got, [s, s, s, s, s, s, Some(Failure)], "an error is thrown away, not counted");
    }

    #[test]
    fn a_liveness_failure_holds_the_worker_until_a_new_container() {
        let mut w = worker(ProbeType::Liveness, 1, 1, 0);
        let got = run(
            &mut w,
            PodContext::default(),
            &[(Some(running("c1", 5)), Failure), (Some(running("c1", 6)), Success), (Some(running("c2", 0)), Success)],
        );
        assert_eq!(got, [(Probe, Some(Failure)), (Wait, Some(Failure)), (Probe, Some(Success))]);
    }

    #[test]
    fn initial_delay_counts_whole_seconds_of_running() {
        let mut w = worker(ProbeType::Readiness, 1, 3, 3);
        let steps: Vec<Step> = run(
            &mut w,
            PodContext::default(),
            &[(Some(running("c1", 0)), Success), (Some(running("c1", 2)), Success), (Some(running("c1", 3)), Success)],
        )
        .into_iter()
        .map(|(s, _)| s)
        .collect();
        assert_eq!(steps, [Wait, Wait, Probe]);
    }

    #[test]
    fn the_startup_probe_gates_the_others() {
        let pod = PodContext { has_startup_probe: true, ..PodContext::default() };
        let mut results = Results::default();
        let c = running("c1", 1);
        let mut startup = worker(ProbeType::Startup, 1, 3, 0);
        let mut liveness = worker(ProbeType::Liveness, 1, 3, 0);
        let mut readiness = worker(ProbeType::Readiness, 1, 3, 0);
        assert_eq!(liveness.before_probe(pod, Some(&c), &mut results).0, Wait);
        assert_eq!(readiness.before_probe(pod, Some(&c), &mut results).0, Wait);
        assert_eq!(startup.before_probe(pod, Some(&c), &mut results).0, Probe);
        assert!(!started(&results, "c1", true, true), "unknown until the startup probe says");
        assert!(startup.after_probe(Success, &mut results));
        assert!(started(&results, "c1", true, true));
        assert_eq!(startup.before_probe(pod, Some(&c), &mut results).0, Wait, "startup is done");
        assert_eq!(liveness.before_probe(pod, Some(&c), &mut results).0, Probe);
        assert_eq!(readiness.before_probe(pod, Some(&c), &mut results).0, Probe);
        assert!(started(&results, "c9", true, false), "no startup probe: started once running");
        assert!(!started(&results, "c9", false, false));
    }

    #[test]
    fn a_startup_failure_holds_like_a_liveness_failure() {
        let pod = PodContext { has_startup_probe: true, ..PodContext::default() };
        let mut w = worker(ProbeType::Startup, 1, 2, 0);
        let c = || Some(running("c1", 1));
        let got = run(&mut w, pod, &[(c(), Failure), (c(), Failure), (c(), Success)]);
        assert_eq!(got, [(Probe, Some(Unknown)), (Probe, Some(Failure)), (Wait, Some(Failure))]);
    }

    #[test]
    fn containers_that_do_not_run() {
        let waiting = Observed { container_id: "c1".into(), state: State::Waiting };
        let terminated = Observed { container_id: "c1".into(), state: State::Terminated };
        let mut w = worker(ProbeType::Readiness, 1, 3, 0);
        let created = Observed { container_id: String::new(), state: State::Waiting };
        assert_eq!(run(&mut w, PodContext::default(), &[(Some(created), Success)]), [(Wait, None)]);
        let mut w = worker(ProbeType::Liveness, 1, 3, 0);
        assert_eq!(run(&mut w, PodContext::default(), &[(Some(waiting), Success)]), [(Wait, Some(Failure))]);
        let never = PodContext { restart_never: true, ..PodContext::default() };
        let mut w = worker(ProbeType::Readiness, 1, 3, 0);
        assert_eq!(run(&mut w, never, &[(Some(terminated.clone()), Success)]), [(Stop, Some(Failure))]);
        let mut w = worker(ProbeType::Readiness, 1, 3, 0);
        assert_eq!(run(&mut w, PodContext::default(), &[(Some(terminated), Success)]), [(Wait, Some(Failure))]);
        let finished = PodContext { finished: true, ..PodContext::default() };
        assert_eq!(run(&mut w, finished, &[(Some(running("c1", 9)), Success)]), [(Stop, None)]);
    }

    #[test]
    fn a_deleted_pod_is_never_restarted_for_failing() {
        let deleting = PodContext { deleting: true, ..PodContext::default() };
        let mut w = worker(ProbeType::Liveness, 1, 1, 0);
        assert_eq!(run(&mut w, deleting, &[(Some(running("c1", 9)), Failure)]), [(Stop, Some(Success))]);
        let mut w = worker(ProbeType::Readiness, 1, 1, 0);
        assert_eq!(run(&mut w, deleting, &[(Some(running("c1", 9)), Failure)]), [(Probe, Some(Failure))]);
    }

    #[test]
    fn a_new_container_resets_the_count_and_the_results() {
        let mut w = worker(ProbeType::Readiness, 1, 2, 0);
        let mut results = Results::default();
        let c1 = running("c1", 5);
        assert_eq!(w.before_probe(PodContext::default(), Some(&c1), &mut results), (Probe, true));
        w.after_probe(Success, &mut results);
        w.after_probe(Failure, &mut results);
        let c2 = running("c2", 0);
        assert_eq!(w.before_probe(PodContext::default(), Some(&c2), &mut results), (Probe, true));
        assert_eq!(results.get("c1", ProbeType::Readiness), None, "the old run's result is gone");
        assert_eq!(results.get("c2", ProbeType::Readiness), Some(Failure));
        assert!(!w.after_probe(Failure, &mut results), "one failure of the new run is below the threshold");
    }
}
