//! Health of what an Application applied, per kind, as Argo CD assesses it: a Deployment by
//! its rollout, a Pod by its readiness, a Service by its ready endpoints. The Application's
//! health is the worst of its objects'.

use serde::{Deserialize, Serialize};
use serde_json::Value;

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

/// Waiting reasons that will not fix themselves.
const BROKEN: [&str; 6] = [
    "ErrImagePull",
    "ImagePullBackOff",
    "ErrImageNeverPull",
    "CrashLoopBackOff",
    "CreateContainerConfigError",
    "InvalidImageName",
];

/// A Pod: Running and Ready, or Succeeded, is healthy; Failed or stuck on a broken container is
/// degraded; anything else is progressing.
pub fn pod(pod: &Value) -> (Health, String) {
    let status = &pod["status"];
    let phase = status["phase"].as_str().unwrap_or("Pending");
    let broken = status["containerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
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

/// A Deployment: healthy once the controller saw its latest spec and every replica is updated
/// and available.
pub fn deployment(d: &Value) -> (Health, String) {
    let generation = d["metadata"]["generation"].as_i64().unwrap_or(0);
    let status = &d["status"];
    let observed = status["observedGeneration"].as_i64().unwrap_or(0);
    let want = d["spec"]["replicas"].as_i64().unwrap_or(1);
    let num = |f: &str| status[f].as_i64().unwrap_or(0);
    if observed < generation {
        return (Health::Progressing, "waiting for the rollout to start".into());
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
    if num("availableReplicas") < want {
        return (Health::Progressing, format!("{} of {want} updated replicas available", num("availableReplicas")));
    }
    (Health::Healthy, String::new())
}

/// A Service: healthy when it selects nothing (headless, external) or at least one ready Pod.
pub fn service(s: &Value, pods: &[&Value]) -> (Health, String) {
    let Some(selector) = s["spec"]["selector"].as_object().filter(|m| !m.is_empty()) else {
        return (Health::Healthy, String::new());
    };
    let selected: Vec<&&Value> =
        pods.iter().filter(|p| selector.iter().all(|(k, v)| p["metadata"]["labels"][k] == *v)).collect();
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
        json!({"metadata": {"labels": {"app": "web"}}, "status": {"phase": "Running",
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}})
    }

    #[test]
    fn pods() {
        assert_eq!(pod(&running(true)).0, Health::Healthy);
        assert_eq!(pod(&running(false)).0, Health::Progressing);
        let pulling = json!({"status": {"phase": "Pending", "containerStatuses": [
            {"name": "web", "state": {"waiting": {"reason": "ErrImagePull"}}}]}});
        assert_eq!(pod(&pulling), (Health::Degraded, "container web: ErrImagePull".into()));
        assert_eq!(pod(&json!({"status": {"phase": "Succeeded"}})).0, Health::Healthy);
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
    }

    #[test]
    fn services_and_aggregation() {
        let svc = json!({"spec": {"selector": {"app": "web"}}});
        let (ready, unready) = (running(true), running(false));
        assert_eq!(service(&svc, &[&ready, &unready]).0, Health::Healthy);
        assert_eq!(service(&svc, &[&unready]).0, Health::Progressing);
        assert_eq!(service(&json!({"spec": {}}), &[]).0, Health::Healthy);
        assert_eq!([Health::Healthy, Health::Degraded, Health::Progressing].into_iter().max(), Some(Health::Degraded));
    }
}
