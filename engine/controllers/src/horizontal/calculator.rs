//! The replica count one Resource metric asks for, as upstream's replica calculator
//! (`GetResourceReplicas`, `GetRawResourceReplicas`): usage over target, within a tolerance of
//! 10% nothing changes; Pods still starting or without figures are counted so that they never
//! push a scale the wrong way. Pure: the Pods, their usage and the time are given.

use gitplane_api::quantity::parse_milli;
use k8s_openapi::{api::core::v1::Pod, jiff::Timestamp};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// A ratio this close to 1 changes nothing (`--horizontal-pod-autoscaler-tolerance`).
pub const TOLERANCE: f64 = 0.1;
/// A Pod started this recently may show its start-up CPU: its sample counts only once ready
/// for a whole window (`--horizontal-pod-autoscaler-cpu-initialization-period`).
const CPU_INITIALIZATION_PERIOD: Duration = Duration::from_secs(300);
/// A Pod that turned unready this soon after starting has never been ready
/// (`--horizontal-pod-autoscaler-initial-readiness-delay`).
const INITIAL_READINESS_DELAY: Duration = Duration::from_secs(30);

/// What an HPA aims one resource at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// Percent of the Pods' requests, on average.
    Utilization(i32),
    /// Milli-units per Pod, on average.
    AverageValue(i64),
}

/// One Pod's usage of the resource, in milli-units, as metrics.k8s.io reported it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sample {
    pub milli: i64,
    pub timestamp: Timestamp,
    pub window: Duration,
}

/// What the metric proposes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Proposal {
    pub replicas: i32,
    /// The average utilization in percent of requests (for a Utilization target).
    pub utilization: Option<i32>,
    /// The average usage per Pod, in milli-units.
    pub average_milli: i64,
}

fn condition_ready(pod: &Pod) -> Option<(bool, Option<Timestamp>)> {
    let conditions = pod.status.as_ref()?.conditions.as_ref()?;
    let ready = conditions.iter().find(|c| c.type_ == "Ready")?;
    Some((ready.status == "True", ready.last_transition_time.as_ref().map(|t| t.0)))
}

fn plus(t: Timestamp, d: Duration) -> Timestamp {
    t.checked_add(d).unwrap_or(t)
}

/// Pods by how they count: ready (with a sample), unready (pending, or CPU that may be
/// start-up noise), missing (no sample), ignored (deleted or failed): upstream's `groupPods`.
struct Groups {
    ready: usize,
    unready: BTreeSet<String>,
    missing: BTreeSet<String>,
    ignored: BTreeSet<String>,
}

fn group(pods: &[Pod], samples: &BTreeMap<String, Sample>, cpu: bool, now: Timestamp) -> Groups {
    let mut g = Groups { ready: 0, unready: BTreeSet::new(), missing: BTreeSet::new(), ignored: BTreeSet::new() };
    for pod in pods {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
        if pod.metadata.deletion_timestamp.is_some() || phase == "Failed" {
            g.ignored.insert(name);
            continue;
        }
        if phase == "Pending" {
            g.unready.insert(name);
            continue;
        }
        let Some(sample) = samples.get(&name) else {
            g.missing.insert(name);
            continue;
        };
        if cpu {
            let start = pod.status.as_ref().and_then(|s| s.start_time.as_ref()).map(|t| t.0);
            let unready = match (condition_ready(pod), start) {
                (Some((ready, changed)), Some(start)) => {
                    let changed = changed.unwrap_or(start);
                    if plus(start, CPU_INITIALIZATION_PERIOD) > now {
                        !ready || sample.timestamp < plus(changed, sample.window)
                    } else {
                        !ready && plus(start, INITIAL_READINESS_DELAY) > changed
                    }
                }
                _ => true,
            };
            if unready {
                g.unready.insert(name);
                continue;
            }
        }
        g.ready += 1;
    }
    g
}

/// The sum of the Pod's containers' requests of `resource`, in milli-units; an error names the
/// container without one (utilization has no meaning without it).
fn requests(pod: &Pod, resource: &str) -> Result<i64, String> {
    let containers = pod.spec.as_ref().map(|s| s.containers.as_slice()).unwrap_or_default();
    containers.iter().try_fold(0i64, |sum, c| {
        let request = c.resources.as_ref().and_then(|r| r.requests.as_ref()).and_then(|r| r.get(resource));
        match request.and_then(|q| parse_milli(&q.0)) {
            Some(milli) => Ok(sum.saturating_add(milli.clamp(0, i64::MAX as i128) as i64)),
            None => Err(format!(
                "missing request for {resource} in container {} of Pod {}",
                c.name,
                pod.metadata.name.as_deref().unwrap_or("")
            )),
        }
    })
}

/// The usage ratio of `values` (milli-units by Pod) against the target, with the average
/// utilization and the average value: upstream's `GetResourceUtilizationRatio` and
/// `GetMetricUsageRatio`.
fn ratio(
    values: &BTreeMap<String, i64>,
    requests: &BTreeMap<String, i64>,
    target: Target,
) -> Result<(f64, Option<i32>, i64), String> {
    match target {
        Target::Utilization(percent) => {
            let (mut used, mut requested, mut n) = (0i64, 0i64, 0i64);
            for (pod, value) in values {
                let Some(request) = requests.get(pod) else { continue };
                used = used.saturating_add(*value);
                requested = requested.saturating_add(*request);
                n += 1;
            }
            if requested == 0 {
                return Err("no metrics returned matched known pods".into());
            }
            let utilization = (used.saturating_mul(100) / requested) as i32;
            Ok((f64::from(utilization) / f64::from(percent.max(1)), Some(utilization), used / n))
        }
        Target::AverageValue(per_pod) => {
            let total: i64 = values.values().fold(0i64, |s, v| s.saturating_add(*v));
            let average = total / (values.len().max(1) as i64);
            Ok((average as f64 / per_pod.max(1) as f64, None, average))
        }
    }
}

fn within_tolerance(ratio: f64) -> bool {
    (1.0 - ratio).abs() <= TOLERANCE
}

/// The replicas `resource` (`cpu`, `memory`) asks for at `target`, from the Pods the target
/// selects and their samples (by Pod name), with `current` replicas now.
pub fn replicas(
    current: i32,
    resource: &str,
    target: Target,
    pods: &[Pod],
    samples: &BTreeMap<String, Sample>,
    now: Timestamp,
) -> Result<Proposal, String> {
    if pods.is_empty() {
        return Err("no pods returned by selector while calculating replica count".into());
    }
    let groups = group(pods, samples, resource == "cpu", now);
    let mut values: BTreeMap<String, i64> = samples
        .iter()
        .filter(|(pod, _)| !groups.ignored.contains(*pod) && !groups.unready.contains(*pod))
        .filter(|(pod, _)| pods.iter().any(|p| p.metadata.name.as_deref() == Some(pod.as_str())))
        .map(|(pod, s)| (pod.clone(), s.milli))
        .collect();
    if values.is_empty() {
        return Err("did not receive metrics for targeted pods (pods might be unready)".into());
    }
    let mut requested = BTreeMap::new();
    if matches!(target, Target::Utilization(_)) {
        for pod in pods {
            requested.insert(pod.metadata.name.clone().unwrap_or_default(), requests(pod, resource)?);
        }
    }
    let (usage_ratio, utilization, average_milli) = ratio(&values, &requested, target)?;
    let proposal = |replicas| Proposal { replicas, utilization, average_milli };
    let scale_up_with_unready = !groups.unready.is_empty() && usage_ratio > 1.0;
    if !scale_up_with_unready && groups.missing.is_empty() {
        if within_tolerance(usage_ratio) {
            return Ok(proposal(current));
        }
        return Ok(proposal((usage_ratio * groups.ready as f64).ceil() as i32));
    }
    // Missing Pods count as at their request (or the target, if above 100%) on a scale-down and
    // as idle on a scale-up; unready Pods as idle on a scale-up: never a push the wrong way.
    for pod in &groups.missing {
        let fallback = match target {
            _ if usage_ratio > 1.0 => 0,
            _ if usage_ratio >= 1.0 => continue,
            Target::Utilization(percent) => {
                requested.get(pod).copied().unwrap_or(0) * i64::from(percent.max(100)) / 100
            }
            Target::AverageValue(per_pod) => per_pod,
        };
        values.insert(pod.clone(), fallback);
    }
    if scale_up_with_unready {
        for pod in &groups.unready {
            values.insert(pod.clone(), 0);
        }
    }
    let (new_ratio, _, _) = ratio(&values, &requested, target)?;
    let flips = (usage_ratio < 1.0 && new_ratio > 1.0) || (usage_ratio > 1.0 && new_ratio < 1.0);
    if within_tolerance(new_ratio) || flips {
        return Ok(proposal(current));
    }
    let replicas = (new_ratio * values.len() as f64).ceil() as i32;
    if (new_ratio < 1.0 && replicas > current) || (new_ratio > 1.0 && replicas < current) {
        return Ok(proposal(current));
    }
    Ok(proposal(replicas))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn now() -> Timestamp {
        "2026-01-01T01:00:00Z".parse().unwrap()
    }

    /// A Pod requesting 100m CPU: `R` Running and ready since long ago, `S` started a minute
    /// ago and ready for less than a sample's window, `U` Running but unready, `P` Pending, `D` deleted, `F` failed.
    fn pod(name: &str, state: char) -> Pod {
        let (phase, ready, started, changed) = match state {
            'S' => ("Running", "True", "2026-01-01T00:59:00Z", "2026-01-01T00:59:45Z"),
            'U' => ("Running", "False", "2026-01-01T00:00:00Z", "2026-01-01T00:00:10Z"),
            'P' => ("Pending", "False", "2026-01-01T00:00:00Z", "2026-01-01T00:00:00Z"),
            'F' => ("Failed", "False", "2026-01-01T00:00:00Z", "2026-01-01T00:00:00Z"),
            _ => ("Running", "True", "2026-01-01T00:00:00Z", "2026-01-01T00:00:05Z"),
        };
        let deleted = (state == 'D').then_some("2026-01-01T00:59:00Z");
        serde_json::from_value(json!({
            "metadata": {"name": name, "deletionTimestamp": deleted},
            "spec": {"containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]},
            "status": {"phase": phase, "startTime": started,
                       "conditions": [{"type": "Ready", "status": ready, "lastTransitionTime": changed}]}
        }))
        .unwrap()
    }

    fn sample(milli: i64) -> Sample {
        Sample { milli, timestamp: "2026-01-01T00:59:50Z".parse().unwrap(), window: Duration::from_secs(10) }
    }

    /// Pods `a`, `b`, … in these states, with these CPU samples (`None`: missing).
    fn cluster(states: &str, usage: &[Option<i64>]) -> (Vec<Pod>, BTreeMap<String, Sample>) {
        let names = ["a", "b", "c", "d", "e", "f"];
        let pods = states.chars().zip(names).map(|(s, n)| pod(n, s)).collect();
        let samples = usage.iter().zip(names).filter_map(|(u, n)| Some((n.to_owned(), sample((*u)?)))).collect();
        (pods, samples)
    }

    #[test]
    fn replicas_table() {
        #[rustfmt::skip]
        /// (name, current replicas, target, Pod states, CPU samples, replicas and utilization)
        type Case<'a> = (&'a str, i32, Target, &'a str, Vec<Option<i64>>, Result<(i32, Option<i32>), &'a str>);
        let cases: Vec<Case> = vec![
            ("on target", 2, Target::Utilization(50), "RR", vec![Some(50), Some(50)], Ok((2, Some(50)))),
            ("within tolerance up", 2, Target::Utilization(50), "RR", vec![Some(55), Some(54)], Ok((2, Some(54)))),
            ("within tolerance down", 2, Target::Utilization(50), "RR", vec![Some(45), Some(46)], Ok((2, Some(45)))),
            ("just past tolerance", 2, Target::Utilization(50), "RR", vec![Some(56), Some(56)], Ok((3, Some(56)))),
            ("double load", 2, Target::Utilization(50), "RR", vec![Some(100), Some(100)], Ok((4, Some(100)))),
            ("the walkthrough's load", 1, Target::Utilization(50), "R", vec![Some(250)], Ok((5, Some(250)))),
            (
                "idle: the limits are the normalization's",
                4,
                Target::Utilization(50),
                "RRRR",
                vec![Some(0), Some(1), Some(0), Some(0)],
                Ok((0, Some(0))),
            ),
            ("half load", 4, Target::Utilization(50), "RRRR", vec![Some(25); 4], Ok((2, Some(25)))),
            // A missing Pod counts as at its request on a scale-down: less of one.
            (
                "missing on scale-down",
                3,
                Target::Utilization(50),
                "RRR",
                vec![Some(0), Some(0), None],
                Ok((2, Some(0))),
            ),
            // ... and as idle on a scale-up.
            (
                "missing on scale-up",
                3,
                Target::Utilization(50),
                "RRR",
                vec![Some(100), Some(100), None],
                Ok((4, Some(100))),
            ),
            // An unready Pod counts as idle on a scale-up and not at all otherwise.
            ("unready on scale-up", 2, Target::Utilization(50), "RU", vec![Some(100), Some(300)], Ok((2, Some(100)))),
            ("unready on scale-down", 2, Target::Utilization(50), "RU", vec![Some(10), Some(300)], Ok((1, Some(10)))),
            ("pending is unready", 2, Target::Utilization(50), "RP", vec![Some(150), None], Ok((3, Some(150)))),
            (
                "just started: its CPU is start-up noise",
                2,
                Target::Utilization(50),
                "RS",
                vec![Some(100), Some(900)],
                Ok((2, Some(100))),
            ),
            (
                "deleted and failed Pods are ignored",
                3,
                Target::Utilization(50),
                "RDF",
                vec![Some(100), Some(900), Some(900)],
                Ok((2, Some(100))),
            ),
            ("average value", 2, Target::AverageValue(200), "RR", vec![Some(400), Some(400)], Ok((4, None))),
            (
                "no Pods",
                2,
                Target::Utilization(50),
                "",
                vec![],
                Err("no pods returned by selector while calculating replica count"),
            ),
            (
                "no samples",
                2,
                Target::Utilization(50),
                "RR",
                vec![None, None],
                Err("did not receive metrics for targeted pods (pods might be unready)"),
            ),
        ];
        for (name, current, target, states, usage, want) in cases {
            let (pods, samples) = cluster(states, &usage);
            let got = replicas(current, "cpu", target, &pods, &samples, now()).map(|p| (p.replicas, p.utilization));
            assert_eq!(got, want.map_err(str::to_owned), "{name}");
        }
    }

    #[test]
    fn utilization_needs_requests() {
        let mut p = pod("a", 'R');
        p.spec.as_mut().unwrap().containers[0].resources = None;
        let samples = BTreeMap::from([("a".to_owned(), sample(10))]);
        assert_eq!(
            replicas(1, "cpu", Target::Utilization(50), &[p.clone()], &samples, now()),
            Err("missing request for cpu in container c of Pod a".to_owned())
        );
        assert!(replicas(1, "memory", Target::AverageValue(1000), &[p], &samples, now()).is_ok(), "a value needs none");
    }

    #[test]
    fn memory_is_not_filtered_for_start_up() {
        let mebibytes_64 = 64 << 20;
        let (pods, samples) = cluster("RS", &[Some(mebibytes_64 * 1000), Some(mebibytes_64 * 1000)]);
        let got = replicas(2, "memory", Target::Utilization(50), &pods, &samples, now()).unwrap();
        assert_eq!((got.replicas, got.utilization), (4, Some(100)));
    }
}
