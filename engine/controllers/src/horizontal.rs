//! HorizontalPodAutoscaler controller, as upstream's: every 15 s each HPA reads its target's
//! scale (a Deployment, StatefulSet or ReplicaSet: `spec.replicas` and `spec.selector`), the
//! CPU and memory usage of the Pods it selects (metrics.k8s.io's figures, through
//! [`PodMetrics`], which the binary wires to the nodes' kubelets), asks each Resource metric
//! for a replica count ([`calculator`]), takes the highest, normalizes it ([`behavior`]) and
//! writes the target's `spec.replicas` with its own status in one transaction.
//!
//! The replicas of a target are the HPA's from then on: the source controller leaves them as
//! the HPA set them (see docs/decisions.md).

pub mod behavior;
pub mod calculator;

use crate::{Action, Context, ReconcileError, Reconciler, runtime::all_of};
use behavior::{Behavior, History, Normalized};
use calculator::{Sample, Target};
use gitplane_api::{
    events::{NORMAL, WARNING},
    labels::{Labels, matches},
    object::{group_kind, to_value},
    quantity::parse_milli,
};
use gitplane_store::{Event, ObjectKey, Op, informer::Cache};
use k8s_openapi::{
    api::{
        autoscaling::v2::{
            HorizontalPodAutoscaler, HorizontalPodAutoscalerCondition, HorizontalPodAutoscalerStatus, MetricSpec,
            MetricStatus, MetricValueStatus, ResourceMetricStatus,
        },
        core::v1::Pod,
    },
    apimachinery::pkg::{
        api::resource::Quantity,
        apis::meta::v1::{LabelSelector, Time},
    },
    jiff::Timestamp,
};
use serde_json::Value;
use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
    time::Duration,
};

/// How often each HPA is evaluated (`--horizontal-pod-autoscaler-sync-period`).
pub const SYNC_PERIOD: Duration = Duration::from_secs(15);

/// The kinds an HPA can scale, by their `Kind.group`.
pub const SCALABLE: [&str; 3] = ["Deployment.apps", "StatefulSet.apps", "ReplicaSet.apps"];

/// One Pod's usage as the nodes' Summary API reports it (what metrics.k8s.io serves).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PodUsage {
    pub cpu_nano_cores: u64,
    pub memory_working_set_bytes: u64,
    pub timestamp: Timestamp,
    pub window: Duration,
}

/// Where the controller reads Pod usage: the binary wires the API server's kubelet client, so
/// the controllers never link the API server.
#[async_trait::async_trait]
pub trait PodMetrics: Send + Sync + 'static {
    /// The usage of those of `pods` the nodes report, by Pod name.
    async fn pod_usage(&self, pods: &[Pod]) -> Result<HashMap<String, PodUsage>, String>;
}

/// The store key of the object an HPA scales.
pub fn target_key(hpa: &HorizontalPodAutoscaler) -> Option<ObjectKey> {
    let target = &hpa.spec.as_ref()?.scale_target_ref;
    let api_version = target.api_version.as_deref().unwrap_or("");
    Some(ObjectKey::new(group_kind(api_version, &target.kind), hpa.metadata.namespace.clone()?, target.name.clone()))
}

/// The target's scale: its replicas and selector, as its `/scale` subresource would show them.
#[derive(Clone, Debug, PartialEq)]
pub struct Scale {
    pub replicas: i32,
    pub selector: LabelSelector,
}

impl Scale {
    pub fn of(target: &Value) -> Scale {
        Scale {
            replicas: target["spec"]["replicas"].as_i64().map_or(1, |r| r.clamp(0, i64::from(i32::MAX)) as i32),
            selector: serde_json::from_value(target["spec"]["selector"].clone()).unwrap_or_default(),
        }
    }
}

/// Why a metric could not be read: the Warning Event's reason and message, as upstream's
/// `getUnableComputeReplicaCountCondition` records them.
type Failure = (&'static str, String);

/// What a metric spec asks for: the resource and the target, or why it cannot be served. Pods,
/// Object and External metrics need a custom or external metrics API, which no adapter serves
/// here: they fail as on a cluster without one (`FailedGetPodsMetric`, ...).
fn resource_target(metric: &MetricSpec) -> Result<(String, Target), Failure> {
    let resource = match (metric.type_.as_str(), metric.resource.as_ref()) {
        ("Resource", Some(resource)) => resource,
        _ => return Err(unserved(metric)),
    };
    let target = match (resource.target.type_.as_str(), &resource.target) {
        ("Utilization", t) => Target::Utilization(t.average_utilization.unwrap_or(80)),
        ("AverageValue", t) => {
            let value = t.average_value.as_ref().and_then(|q| parse_milli(&q.0)).unwrap_or(0);
            Target::AverageValue(value.clamp(0, i128::from(i64::MAX)) as i64)
        }
        (other, _) => {
            let why = format!("target type {other} is not supported for a Resource metric");
            return Err((RESOURCE_FAILED, why));
        }
    };
    Ok((resource.name.clone(), target))
}

const RESOURCE_FAILED: &str = "FailedGetResourceMetric";

/// A metric of a type no metrics API here serves, with upstream's reason and the error its
/// metrics client returns when the API is not registered.
fn unserved(metric: &MetricSpec) -> Failure {
    const CUSTOM: &str = "unable to fetch metrics from custom metrics API: no custom metrics API \
                          (custom.metrics.k8s.io) registered";
    const EXTERNAL: &str = "unable to fetch metrics from external metrics API: no external metrics API \
                            (external.metrics.k8s.io) registered";
    match metric.type_.as_str() {
        "Pods" => {
            let name = metric.pods.as_ref().map_or("", |p| p.metric.name.as_str());
            ("FailedGetPodsMetric", format!("unable to get metric {name}: {CUSTOM}"))
        }
        "Object" => {
            let name = metric.object.as_ref().map_or("", |o| o.metric.name.as_str());
            let described =
                metric.object.as_ref().map(|o| format!("{} {}", o.described_object.kind, o.described_object.name));
            let on = described.map(|d| format!(" on {d}")).unwrap_or_default();
            ("FailedGetObjectMetric", format!("unable to get metric {name}{on}: {CUSTOM}"))
        }
        "External" => {
            let name = metric.external.as_ref().map_or("", |e| e.metric.name.as_str());
            ("FailedGetExternalMetric", format!("unable to get external metric {name}: {EXTERNAL}"))
        }
        other => (RESOURCE_FAILED, format!("metric type {other:?} is not supported")),
    }
}

/// `250m`, `26214400`: a milli-quantity as the API prints it.
fn milli_quantity(milli: i64) -> Quantity {
    Quantity(if milli % 1000 == 0 { (milli / 1000).to_string() } else { format!("{milli}m") })
}

fn sample(usage: &PodUsage, resource: &str) -> Option<Sample> {
    let milli = match resource {
        "cpu" => (usage.cpu_nano_cores / 1_000_000) as i64,
        "memory" => usage.memory_working_set_bytes.saturating_mul(1000).min(i64::MAX as u64) as i64,
        _ => return None,
    };
    Some(Sample { milli, timestamp: usage.timestamp, window: usage.window })
}

fn metric_name(resource: &str, target: Target) -> String {
    match target {
        Target::Utilization(_) => format!("{resource} resource utilization (percentage of request)"),
        Target::AverageValue(_) => format!("{resource} resource"),
    }
}

/// An Event the decision records: (type, reason, message).
pub type Note = (&'static str, &'static str, String);

/// What one evaluation decides.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub desired: i32,
    /// Whether the target's replicas change to `desired`.
    pub rescale: bool,
    pub status: HorizontalPodAutoscalerStatus,
    pub events: Vec<Note>,
}

/// Sets a condition, keeping its transition time while its status stays.
fn set_condition(
    conditions: &mut Vec<HorizontalPodAutoscalerCondition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: String,
    now: Timestamp,
) {
    let status = if status { "True" } else { "False" }.to_owned();
    let transition = conditions
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or(Time(now));
    conditions.retain(|c| c.type_ != type_);
    conditions.push(HorizontalPodAutoscalerCondition {
        type_: type_.into(),
        status,
        reason: Some(reason.into()),
        message: Some(message),
        last_transition_time: Some(transition),
    });
    let order = |t: &str| ["AbleToScale", "ScalingActive", "ScalingLimited"].iter().position(|o| *o == t);
    conditions.sort_by_key(|c| order(&c.type_));
}

/// One evaluation of `hpa` against its target's `scale`, the Pods it selects and their usage
/// (or why there is none): upstream's `reconcileAutoscaler`.
pub fn decide(
    hpa: &HorizontalPodAutoscaler,
    scale: &Scale,
    pods: &[Pod],
    usage: Result<&HashMap<String, PodUsage>, &str>,
    history: &mut History,
    now: Timestamp,
) -> Decision {
    let spec = hpa.spec.clone().unwrap_or_default();
    let old = hpa.status.clone().unwrap_or_default();
    let mut conditions = old.conditions.clone().unwrap_or_default();
    let mut events = Vec::new();
    let current = scale.replicas;
    let (min, max) = (spec.min_replicas.unwrap_or(1), spec.max_replicas);
    set_condition(
        &mut conditions,
        "AbleToScale",
        true,
        "SucceededGetScale",
        "the HPA controller was able to get the target's current scale".into(),
        now,
    );
    let mut current_metrics = old.current_metrics.clone();
    let (desired, reason) = if current == 0 && min != 0 {
        set_condition(
            &mut conditions,
            "ScalingActive",
            false,
            "ScalingDisabled",
            "scaling is disabled since the replica count of the target is zero".into(),
            now,
        );
        (0, String::new())
    } else if current > max {
        (max, "Current number of replicas above Spec.MaxReplicas".to_owned())
    } else if current < min {
        (min, "Current number of replicas below Spec.MinReplicas".to_owned())
    } else {
        let metrics = spec.metrics.clone().unwrap_or_default();
        let mut statuses = Vec::new();
        let mut proposed: Option<(i32, String)> = None;
        let mut failures = Vec::new();
        for metric in &metrics {
            let computed = resource_target(metric).and_then(|(resource, target)| {
                let usage = usage
                    .map_err(|e| (RESOURCE_FAILED, format!("unable to get metrics for resource {resource}: {e}")))?;
                let samples: BTreeMap<String, Sample> =
                    usage.iter().filter_map(|(pod, u)| Some((pod.clone(), sample(u, &resource)?))).collect();
                let proposal = calculator::replicas(current, &resource, target, pods, &samples, now)
                    .map_err(|e| (RESOURCE_FAILED, format!("failed to get {resource} utilization: {e}")))?;
                Ok((resource, target, proposal))
            });
            match computed {
                Ok((resource, target, proposal)) => {
                    statuses.push(MetricStatus {
                        type_: "Resource".into(),
                        resource: Some(ResourceMetricStatus {
                            name: resource.clone(),
                            current: MetricValueStatus {
                                average_utilization: proposal.utilization,
                                average_value: Some(milli_quantity(proposal.average_milli)),
                                value: None,
                            },
                        }),
                        ..Default::default()
                    });
                    if proposed.as_ref().is_none_or(|(r, _)| proposal.replicas > *r) {
                        proposed = Some((proposal.replicas, metric_name(&resource, target)));
                    }
                }
                Err(why) => failures.push(why),
            }
        }
        current_metrics = (!statuses.is_empty()).then_some(statuses);
        // Every metric that could not be read is said, each time, as upstream says it.
        events.extend(failures.iter().map(|(reason, why)| (WARNING, *reason, why.clone())));
        let invalid = !failures.is_empty();
        match proposed {
            // A metric that could not be read may be the one that keeps the replicas up.
            Some((replicas, _)) if invalid && replicas < current => (current, fail(&mut conditions, &failures, now)),
            None => {
                if failures.is_empty() {
                    events.push((WARNING, RESOURCE_FAILED, "no metrics are set".into()));
                }
                (current, fail(&mut conditions, &failures, now))
            }
            Some((replicas, metric)) => {
                let message = format!("the HPA was able to successfully calculate a replica count from {metric}");
                set_condition(&mut conditions, "ScalingActive", true, "ValidMetricFound", message, now);
                let behavior = Behavior::of(spec.behavior.as_ref());
                history.seed(current, now);
                let Normalized { replicas: normalized, able_to_scale, limited } =
                    behavior::normalize(history, behavior.as_ref(), current, replicas, (min, max), now);
                set_condition(&mut conditions, "AbleToScale", true, able_to_scale.0, able_to_scale.1.into(), now);
                set_condition(&mut conditions, "ScalingLimited", limited.0, limited.1.0, limited.1.1.into(), now);
                let reason = if normalized > current {
                    format!("{metric} above target")
                } else {
                    "All metrics below target".into()
                };
                (normalized, reason)
            }
        }
    };
    let rescale = desired != current;
    let mut last_scale_time = old.last_scale_time.clone();
    if rescale {
        set_condition(
            &mut conditions,
            "AbleToScale",
            true,
            "SucceededRescale",
            format!("the HPA controller was able to update the target scale to {desired}"),
            now,
        );
        events.push((NORMAL, "SuccessfulRescale", format!("New size: {desired}; reason: {reason}")));
        last_scale_time = Some(Time(now));
    }
    Decision {
        desired,
        rescale,
        status: HorizontalPodAutoscalerStatus {
            conditions: Some(conditions),
            current_metrics,
            current_replicas: Some(current),
            desired_replicas: desired,
            last_scale_time,
            observed_generation: hpa.metadata.generation,
        },
        events,
    }
}

/// No metric could be used, or one could not and the others would scale down: ScalingActive
/// False for the first that could not, the replicas left as they are.
fn fail(conditions: &mut Vec<HorizontalPodAutoscalerCondition>, failures: &[Failure], now: Timestamp) -> String {
    let (reason, why) = match failures.first() {
        Some((reason, why)) => (*reason, why.as_str()),
        None => (RESOURCE_FAILED, "no metrics are set"),
    };
    let message = format!("the HPA was unable to compute the replica count: {why}");
    set_condition(conditions, "ScalingActive", false, reason, message, now);
    String::new()
}

pub struct HorizontalController {
    metrics: Arc<dyn PodMetrics>,
    /// Each HPA's recommendations and scale events, as upstream keeps them in memory: a new
    /// leader starts with none, as a restarted kube-controller-manager does.
    histories: Mutex<HashMap<ObjectKey, History>>,
}

impl HorizontalController {
    pub fn new(metrics: Arc<dyn PodMetrics>) -> Self {
        HorizontalController { metrics, histories: Mutex::new(HashMap::new()) }
    }

    fn history(&self, key: &ObjectKey) -> History {
        self.histories.lock().unwrap_or_else(|e| e.into_inner()).get(key).cloned().unwrap_or_default()
    }

    fn keep(&self, key: &ObjectKey, history: Option<History>) {
        let mut histories = self.histories.lock().unwrap_or_else(|e| e.into_inner());
        match history {
            Some(history) => histories.insert(key.clone(), history),
            None => histories.remove(key),
        };
    }
}

fn selected_pods(cache: &Cache, namespace: &str, selector: &LabelSelector) -> Vec<Pod> {
    // An empty selector would select every Pod of the namespace: a target without one has none.
    if selector.match_labels.as_ref().is_none_or(|m| m.is_empty())
        && selector.match_expressions.as_ref().is_none_or(|m| m.is_empty())
    {
        return Vec::new();
    }
    cache.list_typed_where::<Pod>(Some(namespace), |p| {
        let labels: Labels = serde_json::from_value(p["metadata"]["labels"].clone()).unwrap_or_default();
        matches(selector, &labels)
    })
}

#[async_trait::async_trait]
impl Reconciler for HorizontalController {
    fn name(&self) -> &'static str {
        "horizontal-pod-autoscaler"
    }

    fn keys_for(&self, event: &Event, _: &Cache) -> Vec<ObjectKey> {
        let hpa = gitplane_api::object::kind_of::<HorizontalPodAutoscaler>();
        if event.key.kind == hpa { vec![event.key.clone()] } else { Vec::new() }
    }

    fn all_keys(&self, cache: &Cache) -> Vec<ObjectKey> {
        all_of::<HorizontalPodAutoscaler>(cache)
    }

    async fn reconcile(&self, key: &ObjectKey, ctx: &Context) -> Result<Action, ReconcileError> {
        let Some(hpa) = ctx.cache().get_typed::<HorizontalPodAutoscaler>(&key.namespace, &key.name) else {
            self.keep(key, None);
            return Ok(Action::await_change());
        };
        let now = Timestamp::now();
        let target_key = target_key(&hpa).ok_or_else(|| ReconcileError::Invalid("HPA has no spec".into()))?;
        let target = ctx.cache().get(&target_key).filter(|_| SCALABLE.contains(&target_key.kind.as_str()));
        let Some(target) = target else {
            let mut status = hpa.status.clone().unwrap_or_default();
            let conditions = status.conditions.get_or_insert_with(Vec::new);
            let why = format!(
                "the HPA controller was unable to get the target's current scale: {target_key} not found (or not a Deployment, StatefulSet or ReplicaSet)"
            );
            set_condition(conditions, "AbleToScale", false, "FailedGetScale", why.clone(), now);
            if hpa.status.as_ref() != Some(&status) {
                let mut updated = hpa.clone();
                updated.status = Some(status);
                ctx.update_status(&updated).await?;
                ctx.event("horizontal-pod-autoscaler", &hpa, WARNING, "FailedGetScale", &why);
            }
            return Ok(Action::requeue(SYNC_PERIOD));
        };
        let scale = Scale::of(&target);
        let pods = selected_pods(ctx.cache(), &key.namespace, &scale.selector);
        let usage = if pods.is_empty() { Ok(HashMap::new()) } else { self.metrics.pod_usage(&pods).await };
        let mut history = self.history(key);
        let decision = decide(&hpa, &scale, &pods, usage.as_ref().map_err(String::as_str), &mut history, now);
        let mut ops = Vec::new();
        if decision.rescale {
            let mut scaled = (*target).clone();
            scaled["spec"]["replicas"] = Value::from(decision.desired);
            ops.push(Op::Update(scaled));
        }
        if hpa.status.as_ref() != Some(&decision.status) {
            let mut updated = hpa.clone();
            updated.status = Some(decision.status.clone());
            ops.push(Op::UpdateStatus(to_value(&updated)));
        }
        ctx.commit(ops).await?;
        if decision.rescale {
            let behavior = Behavior::of(hpa.spec.as_ref().and_then(|s| s.behavior.as_ref()));
            history.record_scale(behavior.as_ref(), scale.replicas, decision.desired, now);
            tracing::info!(target = %target_key, from = scale.replicas, to = decision.desired, "rescaled");
        }
        self.keep(key, Some(history));
        for (type_, reason, message) in &decision.events {
            ctx.event("horizontal-pod-autoscaler", &hpa, type_, reason, message);
        }
        Ok(Action::requeue(SYNC_PERIOD))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn now() -> Timestamp {
        "2026-01-01T01:00:00Z".parse().unwrap()
    }

    /// The walkthrough's HPA: php-apache between 1 and 10 replicas at 50% CPU.
    fn hpa(extra: Value) -> HorizontalPodAutoscaler {
        let mut spec = json!({"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "php-apache"},
            "minReplicas": 1, "maxReplicas": 10,
            "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 50}}}]});
        for (k, v) in extra.as_object().unwrap() {
            spec[k] = v.clone();
        }
        serde_json::from_value(
            json!({"metadata": {"name": "php-apache", "namespace": "default", "generation": 1}, "spec": spec}),
        )
        .unwrap()
    }

    fn pods(n: usize) -> Vec<Pod> {
        (0..n)
            .map(|i| {
                serde_json::from_value(json!({
                    "metadata": {"name": format!("p{i}")},
                    "spec": {"containers": [{"name": "c", "image": "i", "resources": {"requests": {"cpu": "200m", "memory": "64Mi"}}}]},
                    "status": {"phase": "Running", "startTime": "2026-01-01T00:00:00Z",
                               "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-01T00:00:05Z"}]}
                }))
                .unwrap()
            })
            .collect()
    }

    /// Each Pod at this many millicores and 32 MiB.
    fn usage(n: usize, millicores: u64) -> HashMap<String, PodUsage> {
        let at = "2026-01-01T00:59:50Z".parse().unwrap();
        (0..n)
            .map(|i| {
                let u = PodUsage {
                    cpu_nano_cores: millicores * 1_000_000,
                    memory_working_set_bytes: 32 << 20,
                    timestamp: at,
                    window: Duration::from_secs(10),
                };
                (format!("p{i}"), u)
            })
            .collect()
    }

    fn scale(replicas: i32) -> Scale {
        Scale { replicas, selector: serde_json::from_value(json!({"matchLabels": {"run": "php-apache"}})).unwrap() }
    }

    fn condition<'a>(d: &'a Decision, type_: &str) -> (&'a str, &'a str) {
        let c = d.status.conditions.iter().flatten().find(|c| c.type_ == type_).unwrap();
        (c.status.as_str(), c.reason.as_deref().unwrap())
    }

    #[test]
    fn decide_table() {
        let memory = json!({"metrics": [{"type": "Resource", "resource": {"name": "memory", "target": {"type": "AverageValue", "averageValue": "16Mi"}}}]});
        let both = json!({"metrics": [
            {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 50}}},
            {"type": "Resource", "resource": {"name": "memory", "target": {"type": "Utilization", "averageUtilization": 50}}}]});
        #[rustfmt::skip]
        /// (name, HPA, current replicas, Pods, each Pod's millicores or why none, desired,
        /// ScalingActive status and reason, the rescale Event's message)
        type Case<'a> = (&'a str, HorizontalPodAutoscaler, i32, usize, Result<u64, &'a str>, i32, (&'a str, &'a str), Option<&'a str>);
        let cases: Vec<Case> = vec![
            (
                "under load: up",
                hpa(json!({})),
                1,
                1,
                Ok(500),
                4,
                ("True", "ValidMetricFound"),
                Some("New size: 4; reason: cpu resource utilization (percentage of request) above target"),
            ),
            ("on target: nothing", hpa(json!({})), 2, 2, Ok(100), 2, ("True", "ValidMetricFound"), None),
            ("idle: down waits for the window", hpa(json!({})), 4, 4, Ok(0), 4, ("True", "ValidMetricFound"), None),
            (
                "memory average value",
                hpa(memory),
                1,
                1,
                Ok(0),
                2,
                ("True", "ValidMetricFound"),
                Some("New size: 2; reason: memory resource above target"),
            ),
            ("the highest metric wins", hpa(both), 2, 2, Ok(100), 2, ("True", "ValidMetricFound"), None),
            (
                "no metrics: nothing changes",
                hpa(json!({})),
                3,
                3,
                Err("no node answered"),
                3,
                ("False", "FailedGetResourceMetric"),
                None,
            ),
            (
                "above the maximum",
                hpa(json!({"maxReplicas": 2})),
                5,
                5,
                Ok(100),
                2,
                ("", ""),
                Some("New size: 2; reason: Current number of replicas above Spec.MaxReplicas"),
            ),
            (
                "below the minimum",
                hpa(json!({"minReplicas": 3})),
                1,
                1,
                Ok(100),
                3,
                ("", ""),
                Some("New size: 3; reason: Current number of replicas below Spec.MinReplicas"),
            ),
            ("a target at zero is left alone", hpa(json!({})), 0, 0, Ok(100), 0, ("False", "ScalingDisabled"), None),
        ];
        for (name, hpa, current, n, cpu, desired, active, event) in cases {
            let usage = cpu.map(|m| usage(n, m));
            let d =
                decide(&hpa, &scale(current), &pods(n), usage.as_ref().map_err(|e| *e), &mut History::default(), now());
            assert_eq!((d.desired, d.rescale), (desired, desired != current), "{name}");
            if !active.0.is_empty() {
                assert_eq!(condition(&d, "ScalingActive"), active, "{name}");
            }
            let rescaled = d.events.iter().find(|e| e.1 == "SuccessfulRescale").map(|e| e.2.as_str());
            assert_eq!(rescaled, event, "{name}");
            assert_eq!(d.status.current_replicas, Some(current), "{name}");
            assert_eq!(d.status.last_scale_time.is_some(), desired != current, "{name}");
        }
    }

    /// Pods, Object and External metrics need a metrics API no adapter serves here: each fails
    /// with upstream's reason and a Warning; Resource metrics beside them still scale up, not
    /// down.
    #[test]
    fn metrics_without_an_api_fail_and_resource_metrics_still_scale_up() {
        let cpu = json!({"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 50}}});
        let pods_metric = json!({"type": "Pods", "pods": {"metric": {"name": "packets-per-second"},
            "target": {"type": "AverageValue", "averageValue": "1k"}}});
        let object = json!({"type": "Object", "object": {"metric": {"name": "requests-per-second"},
            "describedObject": {"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "name": "main-route"},
            "target": {"type": "Value", "value": "10k"}}});
        let external = json!({"type": "External", "external": {"metric": {"name": "queue_messages_ready"},
            "target": {"type": "AverageValue", "averageValue": "30"}}});
        let custom =
            "unable to fetch metrics from custom metrics API: no custom metrics API (custom.metrics.k8s.io) registered";
        let pods_failed = ("FailedGetPodsMetric", format!("unable to get metric packets-per-second: {custom}"));
        let object_failed = (
            "FailedGetObjectMetric",
            format!("unable to get metric requests-per-second on Ingress main-route: {custom}"),
        );
        let external_failed = (
            "FailedGetExternalMetric",
            "unable to get external metric queue_messages_ready: unable to fetch metrics from external metrics API: no \
             external metrics API (external.metrics.k8s.io) registered"
                .to_owned(),
        );
        /// (name, metrics, current replicas, each Pod's millicores, desired, ScalingActive, Warnings)
        type Case<'a> = (&'a str, Vec<Value>, i32, u64, i32, (&'a str, &'a str), Vec<(&'a str, String)>);
        let cases: Vec<Case> = vec![
            (
                "Pods alone",
                vec![pods_metric.clone()],
                2,
                100,
                2,
                ("False", "FailedGetPodsMetric"),
                vec![pods_failed.clone()],
            ),
            ("Object alone", vec![object], 2, 100, 2, ("False", "FailedGetObjectMetric"), vec![object_failed]),
            (
                "External then Pods: the first failure is the condition's",
                vec![external, pods_metric.clone()],
                2,
                100,
                2,
                ("False", "FailedGetExternalMetric"),
                vec![external_failed, pods_failed.clone()],
            ),
            (
                "with cpu above target: up",
                vec![pods_metric.clone(), cpu.clone()],
                1,
                500,
                4,
                ("True", "ValidMetricFound"),
                vec![pods_failed.clone()],
            ),
            (
                "with cpu on target: stays",
                vec![cpu.clone(), pods_metric.clone()],
                2,
                100,
                2,
                ("True", "ValidMetricFound"),
                vec![pods_failed.clone()],
            ),
            (
                "with cpu idle: not down",
                vec![cpu, pods_metric],
                4,
                0,
                4,
                ("False", "FailedGetPodsMetric"),
                vec![pods_failed],
            ),
        ];
        for (name, metrics, current, millicores, desired, active, warnings) in cases {
            let hpa = hpa(json!({"metrics": metrics}));
            let n = current as usize;
            let d = decide(&hpa, &scale(current), &pods(n), Ok(&usage(n, millicores)), &mut History::default(), now());
            assert_eq!(d.desired, desired, "{name}");
            assert_eq!(condition(&d, "ScalingActive"), active, "{name}");
            let got: Vec<(&str, String)> =
                d.events.iter().filter(|e| e.0 == WARNING).map(|e| (e.1, e.2.clone())).collect();
            assert_eq!(got, warnings, "{name}");
            if active.0 == "False" {
                let message = hpa_condition_message(&d);
                assert_eq!(
                    message,
                    format!("the HPA was unable to compute the replica count: {}", warnings[0].1),
                    "{name}"
                );
            }
        }
    }

    fn hpa_condition_message(d: &Decision) -> String {
        let conditions = d.status.conditions.as_ref().unwrap();
        let active = conditions.iter().find(|c| c.type_ == "ScalingActive").unwrap();
        active.message.clone().unwrap_or_default()
    }

    #[test]
    fn status_carries_the_current_utilization_and_the_limits() {
        let d = decide(&hpa(json!({})), &scale(1), &pods(1), Ok(&usage(1, 500)), &mut History::default(), now());
        let current = &d.status.current_metrics.as_ref().unwrap()[0];
        let resource = current.resource.as_ref().unwrap();
        assert_eq!((resource.name.as_str(), resource.current.average_utilization), ("cpu", Some(250)));
        assert_eq!(resource.current.average_value, Some(Quantity("500m".into())));
        assert_eq!(condition(&d, "AbleToScale"), ("True", "SucceededRescale"));
        assert_eq!(condition(&d, "ScalingLimited"), ("True", "ScaleUpLimit"), "5 wanted, 4 at most from 1");
        let types: Vec<&str> = d.status.conditions.iter().flatten().map(|c| c.type_.as_str()).collect();
        assert_eq!(types, ["AbleToScale", "ScalingActive", "ScalingLimited"]);
    }

    #[test]
    fn a_condition_keeps_its_transition_time_while_its_status_stays() {
        let mut conditions = Vec::new();
        let (t1, t2) = (now(), now().checked_add(Duration::from_secs(60)).unwrap());
        set_condition(&mut conditions, "ScalingActive", true, "ValidMetricFound", "a".into(), t1);
        set_condition(&mut conditions, "ScalingActive", true, "ValidMetricFound", "b".into(), t2);
        assert_eq!(conditions[0].last_transition_time, Some(Time(t1)));
        set_condition(&mut conditions, "ScalingActive", false, "FailedGetResourceMetric", "c".into(), t2);
        assert_eq!((conditions.len(), conditions[0].last_transition_time.clone()), (1, Some(Time(t2))));
    }

    #[test]
    fn targets_are_found_by_group_kind() {
        let key = target_key(&hpa(json!({}))).unwrap();
        assert_eq!(key, ObjectKey::new("Deployment.apps", "default", "php-apache"));
        assert_eq!(Scale::of(&json!({"spec": {}})).replicas, 1, "replicas default to 1");
    }
}
