//! The LimitRanger admission plugin on Pod creation: a namespace's LimitRanges give containers
//! that lack them their default requests and limits, then refuse a Pod outside `min`, `max` or
//! `maxLimitRequestRatio`, with the API server's messages. Pure: the caller brings the
//! namespace's LimitRanges.

use crate::quantity::{canonical, parse_milli};
use k8s_openapi::api::core::v1::{Container, LimitRange, LimitRangeItem, Pod, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use std::collections::BTreeMap;

/// The annotation the plugin leaves on a Pod whose containers it gave defaults.
pub const ANNOTATION: &str = "kubernetes.io/limit-ranger";

type Resources = BTreeMap<String, Quantity>;

/// An item as the API server stores it (`SetDefaults_LimitRangeItem`): for a Container item, a
/// missing default limit is the max, a missing default request the default limit, then the min.
pub fn with_defaults(item: &LimitRangeItem) -> LimitRangeItem {
    let mut item = item.clone();
    if item.type_ != "Container" {
        return item;
    }
    let mut default = item.default.take().unwrap_or_default();
    let mut default_request = item.default_request.take().unwrap_or_default();
    for (k, v) in item.max.iter().flatten() {
        default.entry(k.clone()).or_insert_with(|| v.clone());
    }
    for (k, v) in default.iter().chain(item.min.iter().flatten()) {
        default_request.entry(k.clone()).or_insert_with(|| v.clone());
    }
    item.default = Some(default);
    item.default_request = Some(default_request);
    item
}

/// Admits a Pod being created: its containers get the defaults of every Container item, then
/// the Pod is checked against every item. The error is what follows `pods "x" is forbidden: `.
pub fn admit(pod: &mut Pod, ranges: &[LimitRange]) -> Result<(), String> {
    let items: Vec<LimitRangeItem> =
        ranges.iter().filter_map(|r| r.spec.as_ref()).flat_map(|s| s.limits.iter().map(with_defaults)).collect();
    if items.is_empty() {
        return Ok(());
    }
    let Some(spec) = pod.spec.as_mut() else { return Ok(()) };
    let mut set = Vec::new();
    for item in items.iter().filter(|i| i.type_ == "Container") {
        for container in spec.containers.iter_mut().chain(spec.init_containers.iter_mut().flatten()) {
            set.extend(apply_defaults(container, item));
        }
    }
    if !set.is_empty() {
        let annotations = pod.metadata.annotations.get_or_insert_with(Default::default);
        annotations.insert(ANNOTATION.into(), format!("LimitRanger plugin set: {}", set.join("; ")));
    }
    let spec = pod.spec.as_ref().expect("checked above");
    let mut errors = Vec::new();
    for item in &items {
        match item.type_.as_str() {
            "Container" => {
                for c in spec.containers.iter().chain(spec.init_containers.iter().flatten()) {
                    let (requests, limits) = requirements(c);
                    errors.extend(check(item, "Container", &requests, &limits));
                }
            }
            "Pod" => {
                let (requests, limits) = pod_totals(spec);
                errors.extend(check(item, "Pod", &requests, &limits));
            }
            _ => {}
        }
    }
    errors.dedup();
    match errors.len() {
        0 => Ok(()),
        1 => Err(errors.remove(0)),
        _ => Err(format!("[{}]", errors.join(", "))),
    }
}

/// Sets a container's missing requests and limits from an item; says what it set, as the
/// annotation does (`cpu, memory request for container web`).
fn apply_defaults(container: &mut Container, item: &LimitRangeItem) -> Vec<String> {
    let resources = container.resources.get_or_insert_with(ResourceRequirements::default);
    // The API server's defaulting ran first: a limit without a request makes the request.
    if let Some(limits) = &resources.limits {
        let requests = resources.requests.get_or_insert_with(Default::default);
        for (k, v) in limits {
            requests.entry(k.clone()).or_insert_with(|| v.clone());
        }
    }
    let mut said = Vec::new();
    for (what, from, to) in
        [("request", &item.default_request, &mut resources.requests), ("limit", &item.default, &mut resources.limits)]
    {
        let mut names = Vec::new();
        for (k, v) in from.iter().flatten() {
            let to = to.get_or_insert_with(Default::default);
            if !to.contains_key(k) {
                to.insert(k.clone(), v.clone());
                names.push(k.as_str());
            }
        }
        if !names.is_empty() {
            said.push(format!("{} {what} for container {}", names.join(", "), container.name));
        }
    }
    if resources.requests.as_ref().is_some_and(|r| r.is_empty()) {
        resources.requests = None;
    }
    said
}

fn requirements(c: &Container) -> (Resources, Resources) {
    let r = c.resources.as_ref();
    (r.and_then(|r| r.requests.clone()).unwrap_or_default(), r.and_then(|r| r.limits.clone()).unwrap_or_default())
}

/// A Pod's requests and limits: the sum over its containers, or the largest init container's
/// when that is more; a limit counts only when every container sets it.
fn pod_totals(spec: &k8s_openapi::api::core::v1::PodSpec) -> (Resources, Resources) {
    let total = |pick: fn(&Container) -> Resources, all_must_set: bool| {
        let mut sum: BTreeMap<String, i128> = BTreeMap::new();
        let mut missing = std::collections::BTreeSet::new();
        let each: Vec<Resources> = spec.containers.iter().map(pick).collect();
        for r in &each {
            for (k, v) in r {
                *sum.entry(k.clone()).or_default() += parse_milli(&v.0).unwrap_or(0);
            }
        }
        if all_must_set {
            for r in &each {
                missing.extend(sum.keys().filter(|k| !r.contains_key(*k)).cloned());
            }
        }
        for init in spec.init_containers.iter().flatten() {
            for (k, v) in pick(init) {
                let m = parse_milli(&v.0).unwrap_or(0);
                let entry = sum.entry(k).or_default();
                *entry = (*entry).max(m);
            }
        }
        sum.into_iter()
            .filter(|(k, _)| !missing.contains(k))
            .map(|(k, m)| {
                let binary = k.contains("memory") || k.contains("storage");
                (k, Quantity(crate::quantity::format_milli(m, binary)))
            })
            .collect::<Resources>()
    };
    (total(|c| requirements(c).0, false), total(|c| requirements(c).1, true))
}

/// The item's min, max and ratio against one container's or Pod's requests and limits.
fn check(item: &LimitRangeItem, of: &str, requests: &Resources, limits: &Resources) -> Vec<String> {
    let mut errors = Vec::new();
    let value = |q: Option<&Quantity>| q.and_then(|q| parse_milli(&q.0));
    for (name, enforced) in item.min.iter().flatten() {
        let (req, lim, min) = (value(requests.get(name)), value(limits.get(name)), value(Some(enforced)));
        let e = canonical(&enforced.0);
        match (req, lim) {
            (None, _) => errors.push(format!("minimum {name} usage per {of} is {e}.  No request is specified")),
            (Some(r), _) if Some(r) < min => errors
                .push(format!("minimum {name} usage per {of} is {e}, but request is {}", canonical(&requests[name].0))),
            (_, Some(l)) if Some(l) < min => errors
                .push(format!("minimum {name} usage per {of} is {e}, but limit is {}", canonical(&limits[name].0))),
            _ => {}
        }
    }
    for (name, enforced) in item.max.iter().flatten() {
        let (req, lim, max) = (value(requests.get(name)), value(limits.get(name)), value(Some(enforced)));
        let e = canonical(&enforced.0);
        match (req, lim) {
            (_, None) => errors.push(format!("maximum {name} usage per {of} is {e}.  No limit is specified")),
            (_, Some(l)) if Some(l) > max => errors
                .push(format!("maximum {name} usage per {of} is {e}, but limit is {}", canonical(&limits[name].0))),
            (Some(r), _) if Some(r) > max => errors
                .push(format!("maximum {name} usage per {of} is {e}, but request is {}", canonical(&requests[name].0))),
            _ => {}
        }
    }
    for (name, enforced) in item.max_limit_request_ratio.iter().flatten() {
        let (req, lim) = (value(requests.get(name)).unwrap_or(0), value(limits.get(name)).unwrap_or(0));
        let e = canonical(&enforced.0);
        if req == 0 {
            errors.push(format!(
                "{name} max limit to request ratio per {of} is {e}, but no request is specified or request is 0"
            ));
        } else if lim == 0 {
            errors.push(format!(
                "{name} max limit to request ratio per {of} is {e}, but no limit is specified or limit is 0"
            ));
        } else {
            let ratio = lim as f64 / req as f64;
            let max = value(Some(enforced)).unwrap_or(0) as f64 / 1000.0;
            if ratio > max {
                errors.push(format!(
                    "{name} max limit to request ratio per {of} is {e}, but provided ratio is {ratio:.6}"
                ));
            }
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn range(items: serde_json::Value) -> LimitRange {
        serde_json::from_value(json!({"metadata": {"name": "r"}, "spec": {"limits": items}})).unwrap()
    }

    fn pod(resources: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p"},
            "spec": {"containers": [{"name": "web", "image": "nginx", "resources": resources}]}}))
        .unwrap()
    }

    fn resources(pod: &Pod) -> serde_json::Value {
        serde_json::to_value(pod.spec.as_ref().unwrap().containers[0].resources.clone()).unwrap()
    }

    /// (what, LimitRange items, container resources, outcome: the resources after, or the error)
    type Case = (&'static str, serde_json::Value, serde_json::Value, Result<serde_json::Value, &'static str>);

    #[test]
    fn admission_table() {
        #[rustfmt::skip]
        let cases: Vec<Case> = vec![
            ("defaults fill a container without resources",
             json!([{"type": "Container", "default": {"memory": "512Mi"}, "defaultRequest": {"memory": "256Mi"}}]), json!({}),
             Ok(json!({"limits": {"memory": "512Mi"}, "requests": {"memory": "256Mi"}}))),
            ("a default limit alone is the request too",
             json!([{"type": "Container", "default": {"cpu": "1"}}]), json!({}),
             Ok(json!({"limits": {"cpu": "1"}, "requests": {"cpu": "1"}}))),
            ("a limit without a request makes the request before defaults",
             json!([{"type": "Container", "default": {"memory": "512Mi"}, "defaultRequest": {"memory": "256Mi"}}]),
             json!({"limits": {"memory": "1Gi"}}),
             Ok(json!({"limits": {"memory": "1Gi"}, "requests": {"memory": "1Gi"}}))),
            ("max becomes the default limit",
             json!([{"type": "Container", "max": {"cpu": "800m"}, "min": {"cpu": "200m"}}]), json!({}),
             Ok(json!({"limits": {"cpu": "800m"}, "requests": {"cpu": "800m"}}))),
            ("a limit over max is refused",
             json!([{"type": "Container", "max": {"cpu": "800m"}, "min": {"cpu": "200m"}}]),
             json!({"limits": {"cpu": "1.5"}, "requests": {"cpu": "500m"}}),
             Err("maximum cpu usage per Container is 800m, but limit is 1500m")),
            ("a request under min is refused",
             json!([{"type": "Container", "max": {"cpu": "800m"}, "min": {"cpu": "200m"}}]),
             json!({"limits": {"cpu": "800m"}, "requests": {"cpu": "100m"}}),
             Err("minimum cpu usage per Container is 200m, but request is 100m")),
            ("min and max both broken: both said",
             json!([{"type": "Container", "max": {"memory": "1Gi"}, "min": {"memory": "500Mi"}}]),
             json!({"limits": {"memory": "1.5Gi"}, "requests": {"memory": "100Mi"}}),
             Err("[minimum memory usage per Container is 500Mi, but request is 100Mi, maximum memory usage per Container is 1Gi, but limit is 1536Mi]")),
            ("a ratio over the maximum is refused",
             json!([{"type": "Container", "maxLimitRequestRatio": {"memory": "2"}}]),
             json!({"limits": {"memory": "1Gi"}, "requests": {"memory": "256Mi"}}),
             Err("memory max limit to request ratio per Container is 2, but provided ratio is 4.000000")),
            ("a Pod item checks the sum of the containers",
             json!([{"type": "Pod", "max": {"cpu": "500m"}}]),
             json!({"limits": {"cpu": "600m"}, "requests": {"cpu": "100m"}}),
             Err("maximum cpu usage per Pod is 500m, but limit is 600m")),
            ("ephemeral storage is defaulted and bounded as any resource",
             json!([{"type": "Container", "default": {"ephemeral-storage": "1Gi"}, "max": {"ephemeral-storage": "2Gi"}}]), json!({}),
             Ok(json!({"limits": {"ephemeral-storage": "1Gi"}, "requests": {"ephemeral-storage": "1Gi"}}))),
            ("ephemeral storage over the maximum is refused",
             json!([{"type": "Container", "max": {"ephemeral-storage": "2Gi"}}]),
             json!({"limits": {"ephemeral-storage": "4Gi"}}),
             Err("maximum ephemeral-storage usage per Container is 2Gi, but limit is 4Gi")),
        ];
        for (what, items, given, outcome) in cases {
            let mut p = pod(given);
            match (admit(&mut p, &[range(items)]), outcome) {
                (Ok(()), Ok(expected)) => assert_eq!(resources(&p), expected, "{what}"),
                (Err(e), Err(expected)) => assert_eq!(e, expected, "{what}"),
                (got, _) => panic!("{what}: {got:?}"),
            }
        }
    }

    #[test]
    fn defaults_are_annotated_as_the_plugin_does() {
        let mut p = pod(json!({}));
        let items = json!([{"type": "Container", "default": {"cpu": "1", "memory": "512Mi"}}]);
        admit(&mut p, &[range(items)]).unwrap();
        assert_eq!(
            p.metadata.annotations.unwrap()[ANNOTATION],
            "LimitRanger plugin set: cpu, memory request for container web; cpu, memory limit for container web"
        );
    }
}
