//! HorizontalPodAutoscalers: what the API server refuses beyond the schema, what the controller
//! cannot serve (targets that have no scale, container metrics), the warning for Pods, Object and
//! External metrics (no custom or external metrics API serves them: the controller reports
//! FailedGet*Metric and scales on the Resource metrics beside them), and autoscaling/v1 read as
//! the autoscaling/v2 object the store holds.

use super::Problem;
use serde_json::{Value, json};

const SCALABLE: [(&str, &str); 3] = [("apps/v1", "Deployment"), ("apps/v1", "StatefulSet"), ("apps/v1", "ReplicaSet")];

pub(super) fn problems(value: &Value) -> Vec<Problem> {
    let spec = &value["spec"];
    let mut problems = Vec::new();
    let target = &spec["scaleTargetRef"];
    let (api_version, kind) = (target["apiVersion"].as_str().unwrap_or(""), target["kind"].as_str().unwrap_or(""));
    if !SCALABLE.contains(&(api_version, kind)) {
        problems.push(Problem::at(
            "/spec/scaleTargetRef",
            format!(
                "{kind} ({api_version}) has no scale gitplane can set: target a Deployment, StatefulSet or ReplicaSet \
                 (apiVersion apps/v1)"
            ),
        ));
    }
    let min = spec["minReplicas"].as_i64().unwrap_or(1);
    let max = spec["maxReplicas"].as_i64().unwrap_or(0);
    if min < 1 {
        problems.push(Problem::at("/spec/minReplicas", "must be greater than or equal to 1"));
    }
    if max < min.max(1) {
        problems.push(Problem::at(
            "/spec/maxReplicas",
            format!("must be greater than or equal to minReplicas ({min}) and to 1 (it is {max})"),
        ));
    }
    if let Some(percent) = spec["targetCPUUtilizationPercentage"].as_i64()
        && percent < 1
    {
        problems.push(Problem::at("/spec/targetCPUUtilizationPercentage", "must be greater than 0"));
    }
    for (i, metric) in spec["metrics"].as_array().into_iter().flatten().enumerate() {
        let at = format!("/spec/metrics/{i}");
        let type_ = metric["type"].as_str().unwrap_or("");
        if let Some((_, source, _)) = UNSERVED.iter().find(|(t, _, _)| *t == type_) {
            problems.extend(unserved_problems(&metric[*source], &format!("{at}/{source}"), type_));
            continue;
        }
        if type_ != "Resource" {
            problems.push(Problem::at(
                format!("{at}/type"),
                format!("{type_} metrics are not served by gitplane: use type Resource (cpu or memory)"),
            ));
            continue;
        }
        let resource = &metric["resource"];
        let name = resource["name"].as_str().unwrap_or("");
        if !matches!(name, "cpu" | "memory") {
            problems.push(Problem::at(
                format!("{at}/resource/name"),
                format!("{name:?} has no metrics: use cpu or memory"),
            ));
        }
        let target = &resource["target"];
        match target["type"].as_str().unwrap_or("") {
            "Utilization" if target["averageUtilization"].as_i64().is_some_and(|u| u > 0) => {}
            "Utilization" => problems.push(Problem::at(
                format!("{at}/resource/target/averageUtilization"),
                "a Utilization target needs averageUtilization greater than 0",
            )),
            "AverageValue" if target["averageValue"].is_string() => {}
            "AverageValue" => problems.push(Problem::at(
                format!("{at}/resource/target/averageValue"),
                "an AverageValue target needs averageValue (a quantity, e.g. 200m or 64Mi)",
            )),
            other => problems.push(Problem::at(
                format!("{at}/resource/target/type"),
                format!("unsupported value {other:?} for a Resource metric: use \"Utilization\" or \"AverageValue\""),
            )),
        }
    }
    problems
}

/// Metric types served by a custom or external metrics API, which gitplane has not: their field
/// and the reason the controller reports them with.
const UNSERVED: [(&str, &str, &str); 3] = [
    ("Pods", "pods", "FailedGetPodsMetric"),
    ("Object", "object", "FailedGetObjectMetric"),
    ("External", "external", "FailedGetExternalMetric"),
];

/// Upstream's `validatePodsSource`, `validateObjectSource`, `validateExternalSource` beyond the
/// schema: the source set for its type, a target with the value its type reads.
fn unserved_problems(source: &Value, at: &str, type_: &str) -> Vec<Problem> {
    let Some(source) = source.as_object() else {
        let field = at.rsplit('/').next().unwrap_or("");
        return vec![Problem::at(
            at,
            format!("{} {type_} metric must populate {field}", super::indefinite_article(type_)),
        )];
    };
    let target = &source["target"];
    let set = |field: &str| target.get(field).is_some_and(|v| !v.is_null());
    let mut problems = Vec::new();
    let needs = match (type_, target["type"].as_str().unwrap_or("")) {
        ("Pods", "AverageValue") | ("Object" | "External", "AverageValue") => Some("averageValue"),
        ("Object" | "External", "Value") => Some("value"),
        (_, other) => {
            let allowed = if type_ == "Pods" { "\"AverageValue\"" } else { "\"Value\" or \"AverageValue\"" };
            problems.push(Problem::at(
                format!("{at}/target/type"),
                format!("unsupported value {other:?} for a {type_} metric: use {allowed}"),
            ));
            None
        }
    };
    if let Some(field) = needs
        && !set(field)
    {
        problems.push(Problem::at(
            format!("{at}/target/{field}"),
            format!("a {} target needs {field} (a quantity, e.g. 100 or 1k)", target["type"].as_str().unwrap_or("")),
        ));
    }
    problems
}

/// Pods, Object and External metrics: accepted, as the API server accepts them, with a warning
/// each saying what the controller will report.
pub(super) fn warnings(value: &Value) -> Vec<Problem> {
    let metrics = value["spec"]["metrics"].as_array().into_iter().flatten().enumerate();
    let has_resource = value["spec"]["metrics"].as_array().into_iter().flatten().any(|m| m["type"] == "Resource");
    metrics
        .filter_map(|(i, metric)| {
            let type_ = metric["type"].as_str()?;
            let (_, _, reason) = UNSERVED.iter().find(|(t, _, _)| *t == type_)?;
            let api = if type_ == "External" { "an external" } else { "a custom" };
            let then = if has_resource {
                "it scales on the Resource metrics alone, up but not down while this one cannot be read"
            } else {
                "the replicas stay as they are"
            };
            Some(Problem::at(
                format!("/spec/metrics/{i}/type"),
                format!(
                    "{type_} metrics need {api} metrics API, which gitplane does not serve: the HorizontalPodAutoscaler \
                     will report ScalingActive False ({reason}) and {then}; use type Resource (cpu or memory) to scale \
                     on usage"
                ),
            ))
        })
        .collect()
}

/// An autoscaling/v1 HPA as autoscaling/v2 (the API server's conversion):
/// `targetCPUUtilizationPercentage` becomes a Resource cpu Utilization metric.
pub(super) fn to_v2(value: &mut Value) {
    value["apiVersion"] = json!("autoscaling/v2");
    let Some(spec) = value.get_mut("spec").and_then(Value::as_object_mut) else { return };
    if let Some(percent) = spec.remove("targetCPUUtilizationPercentage") {
        let cpu = json!({"name": "cpu", "target": {"type": "Utilization", "averageUtilization": percent}});
        spec.insert("metrics".into(), json!([{"type": "Resource", "resource": cpu}]));
    }
}
