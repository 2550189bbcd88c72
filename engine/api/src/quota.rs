//! ResourceQuota arithmetic, as the quota controller and the ResourceQuota admission plugin
//! count: what an object uses of each quota resource, a namespace's usage, whether a quota
//! applies to a Pod (scopes), and the API server's refusals. Quantities are thousandths
//! ([`crate::quantity::parse_milli`]). Pure.

use crate::quantity::{format_milli, is_binary, parse_milli};
use k8s_openapi::api::core::v1::{Pod, ResourceQuota};
use serde_json::Value;
use std::collections::BTreeMap;

/// Resource name -> amount in thousandths.
pub type Usage = BTreeMap<String, i128>;

/// Core kinds counted under their own name (`services`), besides `count/<plural>`.
const COUNTED: &[(&str, &str)] = &[
    ("Service", "services"),
    ("ConfigMap", "configmaps"),
    ("Secret", "secrets"),
    ("PersistentVolumeClaim", "persistentvolumeclaims"),
    ("ReplicationController", "replicationcontrollers"),
    ("ResourceQuota", "resourcequotas"),
];

/// Whether a Pod still uses quota: not finished and not being deleted past its grace.
pub fn pod_counts(pod: &Value) -> bool {
    !matches!(pod["status"]["phase"].as_str(), Some("Succeeded" | "Failed"))
}

/// What one object (JSON) of `plural` in `group` uses: `count/<plural>[.<group>]`, the core
/// counts, and for a Pod its compute resources (requests and limits, the larger of the
/// containers' sum and any init container).
pub fn usage_of(object: &Value, kind: &str, plural: &str, group: &str) -> Usage {
    let mut usage = Usage::new();
    let count = if group.is_empty() { format!("count/{plural}") } else { format!("count/{plural}.{group}") };
    usage.insert(count, 1000);
    if let Some((_, name)) = COUNTED.iter().find(|(k, _)| *k == kind) {
        usage.insert((*name).into(), 1000);
    }
    match kind {
        "Service" => match object["spec"]["type"].as_str() {
            Some("NodePort") => {
                usage.insert("services.nodeports".into(), ports(object));
            }
            Some("LoadBalancer") => {
                usage.insert("services.loadbalancers".into(), 1000);
                usage.insert("services.nodeports".into(), ports(object));
            }
            _ => {}
        },
        "Pod" => {
            usage.insert("pods".into(), 1000);
            for (what, amount) in pod_compute(&object["spec"]) {
                usage.insert(what, amount);
            }
        }
        _ => {}
    }
    usage
}

/// Whether any of these hard limits counts objects of this kind (what is worth listing).
pub fn counts(hard: &Usage, kind: &str, plural: &str, group: &str) -> bool {
    let count = if group.is_empty() { format!("count/{plural}") } else { format!("count/{plural}.{group}") };
    let core = COUNTED.iter().find(|(k, _)| *k == kind).map(|(_, name)| *name);
    hard.keys().any(|k| {
        *k == count
            || Some(k.as_str()) == core
            || (kind == "Pod" && !k.starts_with("count/"))
            || (kind == "Service" && k.starts_with("services."))
    })
}

fn ports(service: &Value) -> i128 {
    service["spec"]["ports"].as_array().map_or(0, |p| p.len() as i128 * 1000)
}

/// `requests.cpu`, `cpu` (the same), `limits.cpu`, ... for a Pod spec.
fn pod_compute(spec: &Value) -> Usage {
    let mut usage = Usage::new();
    for (field, prefix) in [("requests", "requests."), ("limits", "limits.")] {
        let mut sum: Usage = Usage::new();
        for c in spec["containers"].as_array().into_iter().flatten() {
            for (k, v) in c["resources"][field].as_object().into_iter().flatten() {
                *sum.entry(k.clone()).or_default() += v.as_str().and_then(parse_milli).unwrap_or(0);
            }
        }
        for c in spec["initContainers"].as_array().into_iter().flatten() {
            for (k, v) in c["resources"][field].as_object().into_iter().flatten() {
                let m = v.as_str().and_then(parse_milli).unwrap_or(0);
                let entry = sum.entry(k.clone()).or_default();
                *entry = (*entry).max(m);
            }
        }
        // Pod-level resources replace the containers' sum of the same resource, as upstream's
        // quota counts them.
        for (k, v) in spec["resources"][field].as_object().into_iter().flatten() {
            sum.insert(k.clone(), v.as_str().and_then(parse_milli).unwrap_or(0));
        }
        for (k, m) in sum {
            if field == "requests" && !k.starts_with("hugepages-") {
                usage.insert(k.clone(), m);
            }
            usage.insert(format!("{prefix}{k}"), m);
        }
    }
    usage
}

/// Whether a quota's scopes and scope selector take in this Pod (JSON). Other objects are in
/// every quota without scopes.
pub fn applies_to(quota: &ResourceQuota, kind: &str, object: &Value) -> bool {
    let Some(spec) = &quota.spec else { return true };
    let scopes = spec.scopes.iter().flatten().map(|s| (s.as_str(), "Exists", Vec::new()));
    let selector = spec
        .scope_selector
        .iter()
        .flat_map(|s| s.match_expressions.iter().flatten())
        .map(|e| (e.scope_name.as_str(), e.operator.as_str(), e.values.clone().unwrap_or_default()));
    let mut all = scopes.chain(selector).peekable();
    if all.peek().is_none() {
        return true;
    }
    if kind != "Pod" {
        return false;
    }
    let spec = &object["spec"];
    all.all(|(scope, operator, values)| {
        let terminating = spec["activeDeadlineSeconds"].is_i64();
        let best_effort = pod_compute(spec).is_empty();
        let priority = spec["priorityClassName"].as_str();
        match (scope, operator) {
            ("Terminating", _) => terminating,
            ("NotTerminating", _) => !terminating,
            ("BestEffort", _) => best_effort,
            ("NotBestEffort", _) => !best_effort,
            ("PriorityClass", "In") => priority.is_some_and(|p| values.iter().any(|v| v == p)),
            ("PriorityClass", "NotIn") => priority.is_none_or(|p| !values.iter().any(|v| v == p)),
            ("PriorityClass", "Exists") => priority.is_some(),
            ("PriorityClass", "DoesNotExist") => priority.is_none(),
            _ => false,
        }
    })
}

/// The quota's hard limits in thousandths (unparsable ones are left out: validation refuses
/// them).
pub fn hard(quota: &ResourceQuota) -> Usage {
    let hard = quota.spec.as_ref().and_then(|s| s.hard.as_ref());
    hard.into_iter().flatten().filter_map(|(k, v)| Some((k.clone(), parse_milli(&v.0)?))).collect()
}

/// `status.used` for the quota's hard resources from everything it counts.
pub fn used<'a>(quota: &ResourceQuota, usages: impl IntoIterator<Item = &'a Usage>) -> Usage {
    let hard = hard(quota);
    let mut used: Usage = hard.keys().map(|k| (k.clone(), 0)).collect();
    for usage in usages {
        for (k, v) in usage {
            if let Some(total) = used.get_mut(k) {
                *total += v;
            }
        }
    }
    used
}

/// Quantities as the status and messages write them: in the hard limit's format.
pub fn render(quota: &ResourceQuota, usage: &Usage) -> BTreeMap<String, String> {
    let hard = quota.spec.as_ref().and_then(|s| s.hard.as_ref());
    let binary = |k: &str| hard.and_then(|h| h.get(k)).is_some_and(|q| is_binary(&q.0));
    usage.iter().map(|(k, v)| (k.clone(), format_milli(*v, binary(k)))).collect()
}

/// The resources the quota's cpu / memory limits make every container name (upstream's
/// backward-compatible rule): `must specify limits.cpu for: web; requests.memory for: web`.
pub fn missing_constraints(quota: &ResourceQuota, pod: &Pod) -> Option<String> {
    const VALIDATED: &[&str] = &["cpu", "memory", "requests.cpu", "requests.memory", "limits.cpu", "limits.memory"];
    let hard = hard(quota);
    let required: Vec<&str> = VALIDATED.iter().copied().filter(|r| hard.contains_key(*r)).collect();
    let spec = pod.spec.as_ref()?;
    let mut missing: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for c in spec.containers.iter().chain(spec.init_containers.iter().flatten()) {
        let r = c.resources.as_ref();
        let has = |field: &str| match field.split_once('.') {
            Some(("limits", k)) => r.and_then(|r| r.limits.as_ref()).is_some_and(|l| l.contains_key(k)),
            Some(("requests", k)) => r.and_then(|r| r.requests.as_ref()).is_some_and(|l| l.contains_key(k)),
            _ => r.and_then(|r| r.requests.as_ref()).is_some_and(|l| l.contains_key(field)),
        };
        for resource in &required {
            if !has(resource) {
                missing.entry(resource).or_default().push(&c.name);
            }
        }
    }
    if missing.is_empty() {
        return None;
    }
    let parts: Vec<String> = missing
        .into_iter()
        .map(|(resource, mut names)| {
            names.sort();
            format!("{resource} for: {}", names.join(","))
        })
        .collect();
    Some(format!("must specify {}", parts.join("; ")))
}

/// Admits an object that uses `requested` against a quota that has `used` counted: the
/// refusal names the exceeded resources (`exceeded quota: q, requested: memory=700Mi, used:
/// memory=600Mi, limited: memory=1Gi`).
pub fn check(quota: &ResourceQuota, used: &Usage, requested: &Usage) -> Result<(), String> {
    let hard = hard(quota);
    let exceeded: Vec<&String> = requested
        .iter()
        .filter(|(k, v)| **v > 0 && hard.get(*k).is_some_and(|h| used.get(*k).copied().unwrap_or(0) + **v > *h))
        .map(|(k, _)| k)
        .collect();
    if exceeded.is_empty() {
        return Ok(());
    }
    let pick =
        |u: &Usage| -> Usage { exceeded.iter().map(|k| ((*k).clone(), u.get(*k).copied().unwrap_or(0))).collect() };
    let pretty =
        |u: &Usage| render(quota, &pick(u)).into_iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",");
    Err(format!(
        "exceeded quota: {}, requested: {}, used: {}, limited: {}",
        quota.metadata.name.as_deref().unwrap_or(""),
        pretty(requested),
        pretty(used),
        pretty(&hard)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn quota(spec: Value) -> ResourceQuota {
        serde_json::from_value(json!({"metadata": {"name": "mem-cpu-demo"}, "spec": spec})).unwrap()
    }

    fn pod(resources: Value) -> Value {
        json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "web", "image": "nginx", "resources": resources}]}})
    }

    /// One mebibyte in thousandths.
    const MI: i128 = 1000 << 20;

    /// (what, object, kind, plural, group, its usage)
    type UsageCase = (&'static str, Value, &'static str, &'static str, &'static str, Vec<(&'static str, i128)>);

    #[test]
    fn usage_table() {
        #[rustfmt::skip]
        let cases: Vec<UsageCase> = vec![
            ("a Pod's compute resources and counts",
             pod(json!({"requests": {"cpu": "500m", "memory": "600Mi"}, "limits": {"cpu": "1", "memory": "800Mi"}})),
             "Pod", "pods", "",
             vec![("count/pods", 1000), ("cpu", 500), ("limits.cpu", 1000), ("limits.memory", 800 * MI),
                  ("memory", 600 * MI), ("pods", 1000), ("requests.cpu", 500), ("requests.memory", 600 * MI)]),
            ("ephemeral storage is counted as any resource",
             pod(json!({"requests": {"ephemeral-storage": "1Gi"}, "limits": {"ephemeral-storage": "2Gi"}})),
             "Pod", "pods", "",
             vec![("count/pods", 1000), ("ephemeral-storage", 1024 * MI), ("limits.ephemeral-storage", 2048 * MI),
                  ("pods", 1000), ("requests.ephemeral-storage", 1024 * MI)]),
            ("Pod-level requests replace the containers' sum",
             {
                 let mut p = pod(json!({"requests": {"cpu": "100m", "memory": "64Mi"}}));
                 p["spec"]["resources"] = json!({"requests": {"cpu": "1"}});
                 p
             },
             "Pod", "pods", "",
             vec![("count/pods", 1000), ("cpu", 1000), ("memory", 64 * MI), ("pods", 1000), ("requests.cpu", 1000),
                  ("requests.memory", 64 * MI)]),
            ("a NodePort Service", json!({"spec": {"type": "NodePort", "ports": [{"port": 80}, {"port": 443}]}}),
             "Service", "services", "",
             vec![("count/services", 1000), ("services", 1000), ("services.nodeports", 2000)]),
            ("a Deployment is counted by group", json!({}), "Deployment", "deployments", "apps",
             vec![("count/deployments.apps", 1000)]),
        ];
        for (what, object, kind, plural, group, expected) in cases {
            let expected: Usage = expected.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
            assert_eq!(usage_of(&object, kind, plural, group), expected, "{what}");
        }
    }

    #[test]
    fn admission_table() {
        let q = quota(
            json!({"hard": {"requests.cpu": "1", "requests.memory": "1Gi", "limits.cpu": "2", "limits.memory": "2Gi"}}),
        );
        let first = usage_of(
            &pod(json!({"requests": {"cpu": "400m", "memory": "600Mi"}, "limits": {"cpu": "800m", "memory": "800Mi"}})),
            "Pod",
            "pods",
            "",
        );
        let used = used(&q, [&first]);
        #[rustfmt::skip]
        let cases: Vec<(&str, Value, Result<(), &str>)> = vec![
            ("fits", json!({"requests": {"cpu": "100m", "memory": "100Mi"}, "limits": {"cpu": "100m", "memory": "100Mi"}}), Ok(())),
            ("memory over", json!({"requests": {"cpu": "100m", "memory": "700Mi"}, "limits": {"cpu": "100m", "memory": "1Gi"}}),
             Err("exceeded quota: mem-cpu-demo, requested: requests.memory=700Mi, used: requests.memory=600Mi, limited: requests.memory=1Gi")),
            ("both over", json!({"requests": {"cpu": "700m", "memory": "700Mi"}, "limits": {"cpu": "700m", "memory": "700Mi"}}),
             Err("exceeded quota: mem-cpu-demo, requested: requests.cpu=700m,requests.memory=700Mi, used: requests.cpu=400m,requests.memory=600Mi, limited: requests.cpu=1,requests.memory=1Gi")),
        ];
        for (what, resources, expected) in cases {
            let requested = usage_of(&pod(resources), "Pod", "pods", "");
            assert_eq!(check(&q, &used, &requested), expected.map_err(String::from), "{what}");
        }
    }

    #[test]
    fn cpu_and_memory_quotas_make_containers_name_them() {
        let q = quota(json!({"hard": {"requests.cpu": "1", "limits.memory": "1Gi", "pods": "2"}}));
        let bare: Pod = serde_json::from_value(pod(json!({}))).unwrap();
        assert_eq!(
            missing_constraints(&q, &bare).as_deref(),
            Some("must specify limits.memory for: web; requests.cpu for: web")
        );
        let named: Pod =
            serde_json::from_value(pod(json!({"requests": {"cpu": "1"}, "limits": {"memory": "1Gi"}}))).unwrap();
        assert_eq!(missing_constraints(&q, &named), None);
    }

    #[test]
    fn scopes_pick_the_pods_a_quota_counts() {
        let by_priority = quota(json!({"hard": {"pods": "10"}, "scopeSelector": {"matchExpressions": [
            {"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]}}));
        let high = json!({"spec": {"priorityClassName": "high", "containers": []}});
        let plain = json!({"spec": {"containers": []}});
        assert!(applies_to(&by_priority, "Pod", &high));
        assert!(!applies_to(&by_priority, "Pod", &plain));
        assert!(!applies_to(&by_priority, "Service", &plain));
        let best_effort = quota(json!({"hard": {"pods": "1"}, "scopes": ["BestEffort"]}));
        assert!(applies_to(&best_effort, "Pod", &plain));
        assert!(!applies_to(&best_effort, "Pod", &pod(json!({"requests": {"cpu": "1"}}))));
    }
}
