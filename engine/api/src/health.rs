//! Health of what an Application applied, per kind, as Argo CD assesses it: a Deployment,
//! ReplicaSet, StatefulSet or DaemonSet by its rollout, a Pod by its readiness, a Service by its
//! ready endpoints, a Job by its outcome, a CronJob by its last Job's, a HorizontalPodAutoscaler by
//! its conditions, a PersistentVolumeClaim by its phase. The Application's health is the worst of
//! its objects'.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::{collections::HashMap, sync::Arc};

/// Ordered from best to worst, so `max` is the aggregate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Health {
    Healthy,
    Progressing,
    Missing,
    Degraded,
}

impl Health {
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Healthy => "Healthy",
            Health::Progressing => "Progressing",
            Health::Missing => "Missing",
            Health::Degraded => "Degraded",
        }
    }
}

/// Whether objects of `kind` (`Kind.group`) have a health rule: the others are healthy once
/// they exist.
pub fn assessed(kind: &str) -> bool {
    matches!(
        kind,
        "Deployment.apps"
            | "ReplicaSet.apps"
            | "StatefulSet.apps"
            | "DaemonSet.apps"
            | "Job.batch"
            | "CronJob.batch"
            | "HorizontalPodAutoscaler.autoscaling"
            | "Pod"
            | "Service"
            | "PersistentVolumeClaim"
    )
}

/// The health of `object`, of kind `kind` (`Deployment`, …); kinds without a rule are healthy.
pub fn of(kind: &str, object: &Value, pods: &Pods<'_>) -> (Health, String) {
    match kind {
        "Deployment" => deployment(object),
        "ReplicaSet" => replica_set(object),
        "DaemonSet" => daemon_set(object),
        "StatefulSet" => stateful_set(object),
        "Job" => job(object),
        "CronJob" => cron_job(object),
        "HorizontalPodAutoscaler" => horizontal_pod_autoscaler(object),
        "Pod" => pod(object),
        "Service" => service(object, pods),
        "PersistentVolumeClaim" => persistent_volume_claim(object),
        _ => (Health::Healthy, String::new()),
    }
}

/// The condition of `type_` in an object's status.
fn condition<'a>(object: &'a Value, type_: &str) -> Option<&'a Value> {
    object["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == type_)
}

/// Waiting reasons that will not fix themselves.
const BROKEN: [&str; 6] = [
    "ErrImagePull",
    "ImagePullBackOff",
    "ErrImageNeverPull",
    "CrashLoopBackOff",
    "CreateContainerConfigError",
    "InvalidImageName",
];

/// A Pod: being deleted is progressing (Argo CD's "Pending deletion"); Running and Ready, or
/// Succeeded, is healthy; Failed or stuck on a broken container is degraded; anything else is
/// progressing.
pub fn pod(pod: &Value) -> (Health, String) {
    if pod["metadata"]["deletionTimestamp"].is_string() {
        return (Health::Progressing, "Pending deletion".into());
    }
    let status = &pod["status"];
    let phase = status["phase"].as_str().unwrap_or("Pending");
    let broken = ["initContainerStatuses", "containerStatuses"]
        .into_iter()
        .flat_map(|list| status[list].as_array().into_iter().flatten())
        .filter_map(|c| {
            let reason = c["state"]["waiting"]["reason"].as_str()?;
            BROKEN.contains(&reason).then(|| format!("container {}: {reason}", c["name"].as_str().unwrap_or("")))
        })
        .next();
    if let Some(reason) = broken {
        return (Health::Degraded, reason);
    }
    let ready =
        status["conditions"].as_array().into_iter().flatten().any(|c| c["type"] == "Ready" && c["status"] == "True");
    match phase {
        "Succeeded" => (Health::Healthy, "completed".into()),
        "Failed" => (Health::Degraded, status["message"].as_str().unwrap_or("the pod failed").to_owned()),
        "Running" if ready => (Health::Healthy, String::new()),
        other => (Health::Progressing, format!("pod is {other}{}", if ready { "" } else { ", not ready" })),
    }
}

/// A Deployment: degraded once its progress deadline is exceeded (as its controller reports);
/// healthy once the controller saw its latest spec and every replica is updated and available;
/// progressing until then.
pub fn deployment(d: &Value) -> (Health, String) {
    let generation = d["metadata"]["generation"].as_i64().unwrap_or(0);
    let status = &d["status"];
    let observed = status["observedGeneration"].as_i64().unwrap_or(0);
    let want = d["spec"]["replicas"].as_i64().unwrap_or(1);
    let num = |f: &str| status[f].as_i64().unwrap_or(0);
    if observed < generation {
        return (Health::Progressing, "waiting for the rollout to start".into());
    }
    if condition(d, "Progressing").is_some_and(|c| c["reason"] == "ProgressDeadlineExceeded") {
        return (Health::Degraded, "the rollout exceeded its progress deadline".into());
    }
    if num("updatedReplicas") < want {
        return (Health::Progressing, format!("{} of {want} replicas updated", num("updatedReplicas")));
    }
    if num("replicas") > num("updatedReplicas") {
        return (
            Health::Progressing,
            format!("{} old replicas pending termination", num("replicas") - num("updatedReplicas")),
        );
    }
    if num("availableReplicas") < want.max(num("updatedReplicas")) {
        return (Health::Progressing, format!("{} of {want} updated replicas available", num("availableReplicas")));
    }
    (Health::Healthy, String::new())
}

/// A ReplicaSet: degraded when its controller reports a ReplicaFailure, healthy once it saw its
/// latest spec and all its replicas are available.
pub fn replica_set(rs: &Value) -> (Health, String) {
    let generation = rs["metadata"]["generation"].as_i64().unwrap_or(0);
    let status = &rs["status"];
    if status["observedGeneration"].as_i64().unwrap_or(0) < generation {
        return (Health::Progressing, "waiting for the ReplicaSet controller".into());
    }
    if let Some(failure) = condition(rs, "ReplicaFailure").filter(|c| c["status"] == "True") {
        return (Health::Degraded, failure["message"].as_str().unwrap_or("replica failure").to_owned());
    }
    let want = rs["spec"]["replicas"].as_i64().unwrap_or(1);
    let available = status["availableReplicas"].as_i64().unwrap_or(0);
    if available < want {
        return (Health::Progressing, format!("{available} of {want} replicas available"));
    }
    (Health::Healthy, String::new())
}

/// A DaemonSet (Argo CD's rule, kubectl's rollout status): progressing until its controller saw
/// its latest spec and, under RollingUpdate, every node it should run on has an updated Pod that
/// is available; an OnDelete DaemonSet is healthy once observed, since only deleting its Pods
/// updates them.
pub fn daemon_set(ds: &Value) -> (Health, String) {
    let generation = ds["metadata"]["generation"].as_i64().unwrap_or(0);
    let status = &ds["status"];
    let num = |f: &str| status[f].as_i64().unwrap_or(0);
    if num("observedGeneration") < generation {
        return (Health::Progressing, "waiting for the rollout to start".into());
    }
    let (desired, updated, available) =
        (num("desiredNumberScheduled"), num("updatedNumberScheduled"), num("numberAvailable"));
    if ds["spec"]["updateStrategy"]["type"] == "OnDelete" {
        return (Health::Healthy, format!("{updated} out of {desired} new pods have been updated"));
    }
    if updated < desired {
        return (Health::Progressing, format!("{updated} out of {desired} new pods have been updated"));
    }
    if available < desired {
        return (Health::Progressing, format!("{available} of {desired} updated pods are available"));
    }
    (Health::Healthy, String::new())
}

/// A StatefulSet, as Argo CD (kubectl's rollout status): progressing until its controller saw
/// the latest spec and every replica is ready; then a RollingUpdate is healthy once the Pods
/// above the partition are updated, OnDelete at once.
pub fn stateful_set(sts: &Value) -> (Health, String) {
    let generation = sts["metadata"]["generation"].as_i64().unwrap_or(0);
    let status = &sts["status"];
    let num = |f: &str| status[f].as_i64().unwrap_or(0);
    let observed = num("observedGeneration");
    if observed == 0 || observed < generation {
        return (Health::Progressing, "Waiting for statefulset spec update to be observed...".into());
    }
    let want = sts["spec"]["replicas"].as_i64().unwrap_or(1);
    let ready = num("readyReplicas");
    if ready < want {
        return (Health::Progressing, format!("Waiting for {} pods to be ready...", want - ready));
    }
    let strategy = &sts["spec"]["updateStrategy"];
    match strategy["type"].as_str().unwrap_or("RollingUpdate") {
        "OnDelete" => (Health::Healthy, format!("statefulset has {ready} ready pods")),
        _ => {
            let updated = num("updatedReplicas");
            let partitioned = want - strategy["rollingUpdate"]["partition"].as_i64().unwrap_or(0);
            if updated < partitioned {
                return (
                    Health::Progressing,
                    format!(
                        "Waiting for partitioned roll out to finish: {updated} out of {partitioned} new pods have been updated..."
                    ),
                );
            }
            (Health::Healthy, format!("partitioned roll out complete: {updated} new pods have been updated..."))
        }
    }
}

/// A Job: healthy once Complete, degraded once Failed, progressing while its Pods run.
pub fn job(j: &Value) -> (Health, String) {
    let status = &j["status"];
    let condition = status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["status"] == "True" && matches!(c["type"].as_str(), Some("Complete" | "Failed")));
    match condition.and_then(|c| c["type"].as_str()) {
        Some("Complete") => (Health::Healthy, "completed".into()),
        Some(_) => {
            let message = condition.and_then(|c| c["message"].as_str().or(c["reason"].as_str())).unwrap_or("failed");
            (Health::Degraded, message.to_owned())
        }
        None => {
            let completions = j["spec"]["completions"].as_i64().unwrap_or(1);
            let succeeded = status["succeeded"].as_i64().unwrap_or(0);
            (Health::Progressing, format!("{succeeded} of {completions} completions"))
        }
    }
}

/// A CronJob: degraded when its last scheduled Job has ended without succeeding (as Argo CD's
/// CronJob check), healthy otherwise: one that waits for its schedule or runs a Job is fine.
pub fn cron_job(c: &Value) -> (Health, String) {
    let status = &c["status"];
    if c["spec"]["suspend"] == true {
        return (Health::Healthy, "suspended".into());
    }
    let active = status["active"].as_array().map_or(0, Vec::len);
    if active > 0 {
        return (Health::Healthy, format!("{active} active Job(s)"));
    }
    let time = |field: &str| status[field].as_str().and_then(|t| t.parse::<jiff::Timestamp>().ok());
    match (time("lastScheduleTime"), time("lastSuccessfulTime")) {
        (Some(scheduled), succeeded) if succeeded.is_none_or(|s| s < scheduled) => {
            (Health::Degraded, "the last scheduled Job did not succeed".into())
        }
        _ => (Health::Healthy, String::new()),
    }
}

/// A HorizontalPodAutoscaler, as Argo CD reads its conditions in order: degraded when it cannot
/// read its target's scale or its metrics, healthy once it scaled or its count is in range,
/// progressing until then.
pub fn horizontal_pod_autoscaler(h: &Value) -> (Health, String) {
    const DEGRADED: [(&str, &str); 4] = [
        ("AbleToScale", "FailedGetScale"),
        ("AbleToScale", "FailedUpdateScale"),
        ("ScalingActive", "FailedGetResourceMetric"),
        ("ScalingActive", "InvalidSelector"),
    ];
    const HEALTHY: [(&str, &str); 4] = [
        ("AbleToScale", "SucceededRescale"),
        ("ScalingLimited", "DesiredWithinRange"),
        ("ScalingLimited", "TooFewReplicas"),
        ("ScalingLimited", "TooManyReplicas"),
    ];
    for c in h["status"]["conditions"].as_array().into_iter().flatten() {
        let (type_, reason) = (c["type"].as_str().unwrap_or(""), c["reason"].as_str().unwrap_or(""));
        let message = c["message"].as_str().unwrap_or("").to_owned();
        if DEGRADED.contains(&(type_, reason)) {
            return (Health::Degraded, message);
        }
        if HEALTHY.contains(&(type_, reason)) {
            return (Health::Healthy, message);
        }
    }
    (Health::Progressing, "Waiting to Autoscale".into())
}

/// A claim: healthy once Bound, degraded once Lost, progressing while Pending (a
/// WaitForFirstConsumer claim waits there for its first Pod).
pub fn persistent_volume_claim(c: &Value) -> (Health, String) {
    match c["status"]["phase"].as_str() {
        Some("Bound") => (Health::Healthy, String::new()),
        Some("Lost") => (Health::Degraded, "the bound volume is gone".into()),
        _ => (Health::Progressing, "waiting for a volume to be bound".into()),
    }
}

/// Pods by (namespace, label, value), so a Service finds the Pods it selects without a scan
/// of every Pod: thousands of Services over thousands of Pods stay cheap.
pub struct Pods<'a> {
    by_label: HashMap<(&'a str, &'a str, &'a str), Vec<&'a Value>>,
}

impl<'a> Pods<'a> {
    pub fn new(pods: &'a [Arc<Value>]) -> Self {
        let mut by_label: HashMap<_, Vec<&Value>> = HashMap::new();
        for pod in pods {
            let namespace = pod["metadata"]["namespace"].as_str().unwrap_or("");
            for (label, value) in pod["metadata"]["labels"].as_object().into_iter().flatten() {
                if let Some(value) = value.as_str() {
                    by_label.entry((namespace, label.as_str(), value)).or_default().push(pod);
                }
            }
        }
        Pods { by_label }
    }

    /// The Pods of `namespace` whose labels match every pair of `selector`.
    fn selected(&self, namespace: &str, selector: &serde_json::Map<String, Value>) -> Vec<&'a Value> {
        let candidates = selector.iter().map(|(label, value)| {
            let value = value.as_str().unwrap_or("");
            self.by_label.get(&(namespace, label.as_str(), value)).map_or(&[][..], Vec::as_slice)
        });
        let Some(fewest) = candidates.min_by_key(|c| c.len()) else { return Vec::new() };
        fewest.iter().copied().filter(|p| selector.iter().all(|(k, v)| p["metadata"]["labels"][k] == *v)).collect()
    }
}

/// A Service: healthy when it selects nothing (headless, external) or at least one ready Pod.
pub fn service(s: &Value, pods: &Pods<'_>) -> (Health, String) {
    let Some(selector) = s["spec"]["selector"].as_object().filter(|m| !m.is_empty()) else {
        return (Health::Healthy, String::new());
    };
    let selected = pods.selected(s["metadata"]["namespace"].as_str().unwrap_or(""), selector);
    let ready = selected.iter().filter(|p| pod(p).0 == Health::Healthy).count();
    if ready > 0 {
        (Health::Healthy, format!("{ready} ready endpoints"))
    } else {
        (Health::Progressing, format!("no ready endpoints ({} pods selected)", selected.len()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn running(ready: bool) -> Value {
        json!({"metadata": {"namespace": "default", "labels": {"app": "web"}}, "status": {"phase": "Running",
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}})
    }

    #[test]
    fn pods() {
        assert_eq!(pod(&running(true)).0, Health::Healthy);
        assert_eq!(pod(&running(false)).0, Health::Progressing);
        let pulling = json!({"status": {"phase": "Pending", "containerStatuses": [
            {"name": "web", "state": {"waiting": {"reason": "ErrImagePull"}}}]}});
        assert_eq!(pod(&pulling), (Health::Degraded, "container web: ErrImagePull".into()));
        let init_crashing = json!({"status": {"phase": "Pending", "initContainerStatuses": [
            {"name": "migrate", "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}});
        assert_eq!(pod(&init_crashing), (Health::Degraded, "container migrate: CrashLoopBackOff".into()));
        assert_eq!(pod(&json!({"status": {"phase": "Succeeded"}})).0, Health::Healthy);
        let mut terminating = running(true);
        terminating["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:30Z");
        assert_eq!(pod(&terminating), (Health::Progressing, "Pending deletion".into()));
    }

    #[test]
    fn claims() {
        let c = |phase: &str| json!({"status": {"phase": phase}});
        for (phase, health) in
            [("Bound", Health::Healthy), ("Pending", Health::Progressing), ("Lost", Health::Degraded)]
        {
            assert_eq!(persistent_volume_claim(&c(phase)).0, health, "{phase}");
        }
    }

    #[test]
    fn jobs() {
        let j = |conditions: Value| json!({"spec": {"completions": 3}, "status": {"succeeded": 1, "conditions": conditions}});
        assert_eq!(job(&j(json!([]))), (Health::Progressing, "1 of 3 completions".into()));
        assert_eq!(job(&j(json!([{"type": "Complete", "status": "True"}]))).0, Health::Healthy);
        let failed =
            j(json!([{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "limit"}]));
        assert_eq!(job(&failed), (Health::Degraded, "limit".into()));
    }

    #[test]
    fn cron_jobs() {
        let c = |suspend: bool, status: Value| json!({"spec": {"suspend": suspend}, "status": status});
        let (t1, t2) = ("2026-01-01T00:01:00Z", "2026-01-01T00:01:05Z");
        let cases = [
            ("never scheduled", c(false, json!({})), Health::Healthy),
            (
                "last Job succeeded",
                c(false, json!({"lastScheduleTime": t1, "lastSuccessfulTime": t2})),
                Health::Healthy,
            ),
            (
                "last Job running",
                c(false, json!({"lastScheduleTime": t2, "lastSuccessfulTime": t1, "active": [{}]})),
                Health::Healthy,
            ),
            ("last Job failed", c(false, json!({"lastScheduleTime": t2, "lastSuccessfulTime": t1})), Health::Degraded),
            ("never succeeded", c(false, json!({"lastScheduleTime": t1})), Health::Degraded),
            ("suspended", c(true, json!({"lastScheduleTime": t1})), Health::Healthy),
        ];
        for (name, object, want) in cases {
            assert_eq!(cron_job(&object).0, want, "{name}");
        }
    }

    #[test]
    fn horizontal_pod_autoscalers() {
        let h = |conditions: Value| json!({"status": {"conditions": conditions}});
        let c =
            |type_: &str, reason: &str| json!({"type": type_, "status": "True", "reason": reason, "message": reason});
        let cases = [
            (h(json!([])), Health::Progressing),
            (
                h(json!([
                    c("AbleToScale", "SucceededGetScale"),
                    c("ScalingActive", "ValidMetricFound"),
                    c("ScalingLimited", "DesiredWithinRange")
                ])),
                Health::Healthy,
            ),
            (h(json!([c("AbleToScale", "SucceededRescale")])), Health::Healthy),
            (
                h(json!([c("AbleToScale", "SucceededGetScale"), c("ScalingActive", "FailedGetResourceMetric")])),
                Health::Degraded,
            ),
            (h(json!([c("AbleToScale", "FailedGetScale")])), Health::Degraded),
            (
                h(json!([c("AbleToScale", "ReadyForNewScale"), c("ScalingLimited", "ScaleUpLimit")])),
                Health::Progressing,
            ),
        ];
        for (object, want) in cases {
            assert_eq!(horizontal_pod_autoscaler(&object).0, want, "{object}");
        }
    }

    #[test]
    fn deployments() {
        let d = |generation: i64, observed: i64, updated: i64, available: i64, total: i64| {
            json!({"metadata": {"generation": generation}, "spec": {"replicas": 2},
                   "status": {"observedGeneration": observed, "updatedReplicas": updated,
                              "availableReplicas": available, "replicas": total}})
        };
        assert_eq!(deployment(&d(2, 2, 2, 2, 2)).0, Health::Healthy);
        assert_eq!(deployment(&d(3, 2, 2, 2, 2)).0, Health::Progressing);
        assert_eq!(deployment(&d(2, 2, 1, 1, 3)).0, Health::Progressing);
        assert_eq!(deployment(&d(2, 2, 2, 1, 2)).1, "1 of 2 updated replicas available");
        // A rollout that never becomes available: Progressing, until the controller reports
        // the deadline exceeded.
        let mut stuck = d(1, 1, 2, 0, 2);
        assert_eq!(of("Deployment", &stuck, &Pods::new(&[])).0, Health::Progressing);
        stuck["status"]["conditions"] = json!([
            {"type": "Available", "status": "False", "reason": "MinimumReplicasUnavailable"},
            {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}]);
        assert_eq!(deployment(&stuck).0, Health::Degraded);
        let fresh = json!({"metadata": {"generation": 1}, "spec": {"replicas": 1}});
        assert_eq!(deployment(&fresh).0, Health::Progressing, "no status yet");
    }

    #[test]
    fn daemon_sets() {
        let ds = |strategy: &str, observed: i64, updated: i64, available: i64| {
            json!({"metadata": {"generation": 2}, "spec": {"updateStrategy": {"type": strategy}},
                   "status": {"observedGeneration": observed, "desiredNumberScheduled": 3,
                              "updatedNumberScheduled": updated, "numberAvailable": available}})
        };
        assert!(assessed("DaemonSet.apps"));
        #[rustfmt::skip]
        let cases = [
            ("a spec not yet observed", ds("RollingUpdate", 1, 3, 3), Health::Progressing, "waiting for the rollout to start"),
            ("a rollout under way", ds("RollingUpdate", 2, 1, 3), Health::Progressing, "1 out of 3 new pods have been updated"),
            ("updated, not yet available", ds("RollingUpdate", 2, 3, 2), Health::Progressing, "2 of 3 updated pods are available"),
            ("rolled out", ds("RollingUpdate", 2, 3, 3), Health::Healthy, ""),
            ("OnDelete waits for no one", ds("OnDelete", 2, 1, 3), Health::Healthy, "1 out of 3 new pods have been updated"),
        ];
        for (what, object, health, message) in cases {
            assert_eq!(of("DaemonSet", &object, &Pods::new(&[])), (health, message.to_owned()), "{what}");
        }
    }

    #[test]
    fn replica_sets() {
        let rs = |available: i64| {
            json!({"metadata": {"generation": 1}, "spec": {"replicas": 2},
                   "status": {"observedGeneration": 1, "replicas": 2, "availableReplicas": available}})
        };
        assert!(assessed("ReplicaSet.apps"));
        assert_eq!(
            of("ReplicaSet", &rs(1), &Pods::new(&[])),
            (Health::Progressing, "1 of 2 replicas available".into())
        );
        assert_eq!(of("ReplicaSet", &rs(2), &Pods::new(&[])).0, Health::Healthy);
        let mut failing = rs(0);
        failing["status"]["conditions"] =
            json!([{"type": "ReplicaFailure", "status": "True", "message": "pods \"x\" is forbidden"}]);
        assert_eq!(replica_set(&failing), (Health::Degraded, "pods \"x\" is forbidden".into()));
        let unobserved =
            json!({"metadata": {"generation": 2}, "spec": {"replicas": 0}, "status": {"observedGeneration": 1}});
        assert_eq!(replica_set(&unobserved).0, Health::Progressing);
    }

    #[test]
    fn stateful_sets() {
        let sts = |observed: i64, ready: i64, updated: i64, strategy: Value| {
            json!({"metadata": {"generation": 2}, "spec": {"replicas": 3, "updateStrategy": strategy},
                   "status": {"observedGeneration": observed, "readyReplicas": ready, "updatedReplicas": updated}})
        };
        let rolling = |partition: i64| json!({"type": "RollingUpdate", "rollingUpdate": {"partition": partition}});
        #[rustfmt::skip]
        let cases = [
            ("spec not observed", sts(1, 3, 3, rolling(0)), Health::Progressing, "Waiting for statefulset spec update to be observed..."),
            ("not all ready", sts(2, 1, 3, rolling(0)), Health::Progressing, "Waiting for 2 pods to be ready..."),
            ("rolling", sts(2, 3, 1, rolling(0)), Health::Progressing,
             "Waiting for partitioned roll out to finish: 1 out of 3 new pods have been updated..."),
            ("above the partition done", sts(2, 3, 1, rolling(2)), Health::Healthy,
             "partitioned roll out complete: 1 new pods have been updated..."),
            ("OnDelete", sts(2, 3, 0, json!({"type": "OnDelete"})), Health::Healthy, "statefulset has 3 ready pods"),
        ];
        assert!(assessed("StatefulSet.apps"));
        for (what, object, health, message) in cases {
            assert_eq!(of("StatefulSet", &object, &Pods::new(&[])), (health, message.to_owned()), "{what}");
        }
    }

    #[test]
    fn services_and_aggregation() {
        let svc = json!({"metadata": {"namespace": "default"}, "spec": {"selector": {"app": "web"}}});
        let (ready, unready) = (Arc::new(running(true)), Arc::new(running(false)));
        let mut elsewhere = running(true);
        elsewhere["metadata"]["namespace"] = json!("other");
        let both = [ready, unready.clone(), Arc::new(elsewhere.clone())];
        assert_eq!(service(&svc, &Pods::new(&both)).0, Health::Healthy);
        assert_eq!(service(&svc, &Pods::new(&[unready, Arc::new(elsewhere)])).0, Health::Progressing);
        let two_labels =
            json!({"metadata": {"namespace": "default"}, "spec": {"selector": {"app": "web", "tier": "x"}}});
        assert_eq!(
            service(&two_labels, &Pods::new(&both)),
            (Health::Progressing, "no ready endpoints (0 pods selected)".into())
        );
        assert_eq!(service(&json!({"spec": {}}), &Pods::new(&[])).0, Health::Healthy);
        assert_eq!([Health::Healthy, Health::Degraded, Health::Progressing].into_iter().max(), Some(Health::Degraded));
    }
}
