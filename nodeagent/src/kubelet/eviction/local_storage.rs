//! The eviction manager's local storage decision (upstream's `localStorageEviction`): a Pod's
//! limits on local ephemeral storage, what it uses, and whether it must go, with the kubelet's
//! messages. Pure.

use gitplane_api::quantity::{canonical, format_milli, is_binary, parse_units};
use k8s_openapi::api::core::v1::{Container, Pod, PodCondition, PodStatus};
use std::collections::BTreeMap;

/// The kubelet's reason on an evicted Pod and its Event.
pub const REASON: &str = "Evicted";

/// A limit as written (for the message) and in bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limit {
    pub text: String,
    pub bytes: u64,
}

/// What bounds a Pod's local ephemeral storage.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// `limits.ephemeral-storage` of each app container that sets one.
    pub containers: BTreeMap<String, Limit>,
    /// The Pod's total (upstream's `PodLimits`): the app containers' and sidecars' limits added
    /// up, or an init container's with the sidecars started before it, if larger.
    pub pod: Option<Limit>,
    /// `sizeLimit` of each emptyDir on the node's disk that sets one.
    pub empty_dirs: BTreeMap<String, Limit>,
    /// Every emptyDir on the node's disk (not `medium: Memory`): what the Pod's usage counts.
    pub disk_empty_dirs: Vec<String>,
}

impl Limits {
    /// The Pod's limits; `None` when it sets none (nothing to measure).
    pub fn of(pod: &Pod) -> Option<Limits> {
        let spec = pod.spec.as_ref()?;
        let limit = |c: &Container| {
            let q = c.resources.as_ref()?.limits.as_ref()?.get("ephemeral-storage")?;
            let bytes = u64::try_from(parse_units(&q.0)?).ok()?;
            Some(Limit { text: canonical(&q.0), bytes })
        };
        let mut limits = Limits::default();
        let mut any = false;
        let mut sum: u64 = 0;
        for c in &spec.containers {
            if let Some(l) = limit(c) {
                any = true;
                sum = sum.saturating_add(l.bytes);
                if l.bytes > 0 {
                    limits.containers.insert(c.name.clone(), l);
                }
            }
        }
        let (mut sidecars, mut init_peak): (u64, u64) = (0, 0);
        for c in spec.init_containers.iter().flatten() {
            let Some(l) = limit(c) else { continue };
            any = true;
            if c.restart_policy.as_deref() == Some("Always") {
                sidecars = sidecars.saturating_add(l.bytes);
            } else {
                init_peak = init_peak.max(sidecars.saturating_add(l.bytes));
            }
        }
        if any {
            let total = sum.saturating_add(sidecars).max(init_peak);
            let text = format_milli(i128::from(total) * 1000, binary_limits(spec));
            limits.pod = Some(Limit { text, bytes: total });
        }
        for volume in spec.volumes.iter().flatten() {
            let Some(empty) = &volume.empty_dir else { continue };
            if empty.medium.as_deref() == Some("Memory") {
                continue;
            }
            limits.disk_empty_dirs.push(volume.name.clone());
            let size = empty.size_limit.as_ref().and_then(|q| Some((q, u64::try_from(parse_units(&q.0)?).ok()?)));
            if let Some((q, bytes)) = size.filter(|(_, b)| *b > 0) {
                limits.empty_dirs.insert(volume.name.clone(), Limit { text: canonical(&q.0), bytes });
            }
        }
        (limits.pod.is_some() || !limits.empty_dirs.is_empty()).then_some(limits)
    }
}

/// Whether the containers' limits are written in binary units (a sum then prints as `1Gi`).
fn binary_limits(spec: &k8s_openapi::api::core::v1::PodSpec) -> bool {
    let all = spec.containers.iter().chain(spec.init_containers.iter().flatten());
    let texts: Vec<&str> = all
        .filter_map(|c| c.resources.as_ref()?.limits.as_ref()?.get("ephemeral-storage").map(|q| q.0.as_str()))
        .collect();
    !texts.is_empty() && texts.iter().all(|t| is_binary(t))
}

/// What a Pod uses of the node's disk, in bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Each container's writable layer and logs.
    pub containers: BTreeMap<String, u64>,
    /// Each emptyDir on the node's disk.
    pub empty_dirs: BTreeMap<String, u64>,
}

impl Usage {
    fn total(&self) -> u64 {
        self.containers.values().chain(self.empty_dirs.values()).fold(0, |a, b| a.saturating_add(*b))
    }
}

/// A decided eviction: the signal it is counted under (the kubelet's `eviction_signal`) and the
/// message the Pod and its Event carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Eviction {
    pub signal: &'static str,
    pub message: String,
}

/// Why the Pod must be evicted, in upstream's order (an emptyDir over its sizeLimit, the Pod
/// over its total, a container over its own limit) and words; `None` while it fits.
pub fn decide(limits: &Limits, usage: &Usage) -> Option<Eviction> {
    let eviction = |signal, message| Some(Eviction { signal, message });
    for (name, limit) in &limits.empty_dirs {
        if usage.empty_dirs.get(name).is_some_and(|used| *used > limit.bytes) {
            let message = format!("Usage of EmptyDir volume {name:?} exceeds the limit {:?}. ", limit.text);
            return eviction("emptydirfs.limit", message);
        }
    }
    if let Some(limit) = &limits.pod
        && usage.total() > limit.bytes
    {
        let message =
            format!("Pod ephemeral local storage usage exceeds the total limit of containers {}. ", limit.text);
        return eviction("ephemeralpodfs.limit", message);
    }
    for (name, limit) in &limits.containers {
        if usage.containers.get(name).is_some_and(|used| *used > limit.bytes) {
            let message = format!("Container {name} exceeded its local ephemeral storage limit {:?}. ", limit.text);
            return eviction("ephemeralcontainerfs.limit", message);
        }
    }
    None
}

/// The status an evicted Pod ends with: `stopped` (its status once its containers stopped)
/// made Failed with the kubelet's reason and `message`, and not ready as a finished Pod is. A
/// stopped container is terminated, not waiting to restart: nothing restarts in a finished Pod.
pub fn evicted_status(mut stopped: PodStatus, message: &str) -> PodStatus {
    let statuses = stopped.container_statuses.iter_mut().chain(stopped.init_container_statuses.iter_mut());
    for c in statuses.flatten() {
        let waiting = c.state.as_ref().is_none_or(|s| s.terminated.is_none() && s.running.is_none());
        if waiting && let Some(ran) = c.last_state.take().filter(|l| l.terminated.is_some()) {
            c.state = Some(ran);
        }
        c.ready = false;
        c.started = Some(false);
    }
    stopped.phase = Some("Failed".into());
    stopped.reason = Some(REASON.into());
    stopped.message = Some(message.into());
    let not_ready = |c: &mut PodCondition| {
        c.status = "False".into();
        c.reason = Some("PodCompleted".into());
        c.message = None;
    };
    for c in stopped.conditions.iter_mut().flatten().filter(|c| matches!(c.type_.as_str(), "Ready" | "ContainersReady"))
    {
        not_ready(c);
    }
    stopped
}

/// Whether the Pod was evicted already (by this agent before a restart): it never runs again.
pub fn is_evicted(pod: &Pod) -> bool {
    pod.status.as_ref().is_some_and(|s| s.phase.as_deref() == Some("Failed") && s.reason.as_deref() == Some(REASON))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "p", "uid": "u"}, "spec": spec})).expect("valid pod")
    }

    fn with_limit(name: &str, limit: &str) -> serde_json::Value {
        json!({"name": name, "image": "busybox", "resources": {"limits": {"ephemeral-storage": limit}}})
    }

    const MI: u64 = 1 << 20;

    /// The containers' limits, the Pod's, the emptyDirs' sizeLimits, the emptyDirs on disk.
    type Expected = Option<(
        Vec<(&'static str, &'static str)>,
        Option<&'static str>,
        Vec<(&'static str, &'static str)>,
        Vec<&'static str>,
    )>;

    #[test]
    fn limits_of_a_pod() {
        #[rustfmt::skip]
        let cases: Vec<(&str, serde_json::Value, Expected)> = vec![
            ("no limit, no sizeLimit: nothing to measure",
             json!({"containers": [{"name": "a", "image": "busybox"}], "volumes": [{"name": "v", "emptyDir": {}}]}),
             None),
            ("containers' limits add up, in binary units as written",
             json!({"containers": [with_limit("a", "512Mi"), with_limit("b", "512Mi"), {"name": "c", "image": "busybox"}]}),
             Some((vec![("a", "512Mi"), ("b", "512Mi")], Some("1Gi"), vec![], vec![]))),
            ("decimal units stay decimal",
             json!({"containers": [with_limit("a", "500M"), with_limit("b", "0.5G")]}),
             Some((vec![("a", "500M"), ("b", "500M")], Some("1G"), vec![], vec![]))),
            ("sidecars add to the total; an init container counts when larger",
             json!({"initContainers": [with_limit("side", "100Mi").as_object().cloned().map(|mut o| { o.insert("restartPolicy".into(), json!("Always")); o }).unwrap(),
                                       with_limit("init", "2Gi")],
                    "containers": [with_limit("a", "100Mi")]}),
             Some((vec![("a", "100Mi")], Some("2148Mi"), vec![], vec![]))),
            ("an emptyDir's sizeLimit; a Memory one is the tmpfs' size, not measured",
             json!({"containers": [{"name": "a", "image": "busybox"}],
                    "volumes": [{"name": "cache", "emptyDir": {"sizeLimit": "10Mi"}}, {"name": "ram", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
                                {"name": "scratch", "emptyDir": {}}]}),
             Some((vec![], None, vec![("cache", "10Mi")], vec!["cache", "scratch"]))),
        ];
        for (what, spec, expected) in cases {
            let got = Limits::of(&pod(spec)).map(|l| {
                let texts = |m: &BTreeMap<String, Limit>| {
                    m.iter().map(|(k, v)| (k.clone(), v.text.clone())).collect::<Vec<_>>()
                };
                (texts(&l.containers), l.pod.map(|p| p.text), texts(&l.empty_dirs), l.disk_empty_dirs)
            });
            let expected = expected.map(|(c, p, e, d)| {
                let owned =
                    |v: Vec<(&str, &str)>| v.into_iter().map(|(a, b)| (a.to_owned(), b.to_owned())).collect::<Vec<_>>();
                (owned(c), p.map(str::to_owned), owned(e), d.into_iter().map(str::to_owned).collect::<Vec<_>>())
            });
            assert_eq!(got, expected, "{what}");
        }
    }

    #[test]
    fn decisions_in_upstream_order_and_words() {
        let limits = Limits::of(&pod(json!({
            "containers": [with_limit("web", "1Gi"), with_limit("log", "10Mi")],
            "volumes": [{"name": "cache", "emptyDir": {"sizeLimit": "10Mi"}}],
        })))
        .expect("limits");
        let usage = |web: u64, log: u64, cache: u64| Usage {
            containers: [("web".to_owned(), web), ("log".to_owned(), log)].into(),
            empty_dirs: [("cache".to_owned(), cache)].into(),
        };
        #[rustfmt::skip]
        let cases = [
            ("under every limit", usage(100 * MI, MI, MI), None),
            ("at a limit is not over it", usage(MI << 10, 0, 0), None),
            ("a container over its own limit, its logs counted", usage(MI, 11 * MI, 0),
             Some("Container log exceeded its local ephemeral storage limit \"10Mi\". ")),
            ("an emptyDir over its sizeLimit comes first", usage(MI, 11 * MI, 11 * MI),
             Some("Usage of EmptyDir volume \"cache\" exceeds the limit \"10Mi\". ")),
            ("the Pod over the containers' total, no container over its own", usage(1020 * MI, 9 * MI, 9 * MI),
             Some("Pod ephemeral local storage usage exceeds the total limit of containers 1034Mi. ")),
        ];
        for (what, usage, expected) in cases {
            assert_eq!(decide(&limits, &usage).map(|e| e.message).as_deref(), expected, "{what}");
        }
    }

    #[test]
    fn an_evicted_pod_is_failed_and_not_ready() {
        let stopped: PodStatus = serde_json::from_value(json!({
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "False", "reason": "ContainersNotReady", "message": "containers with unready status: [web]"},
                           {"type": "PodScheduled", "status": "True"}],
            "containerStatuses": [{"name": "web", "image": "busybox", "imageID": "", "ready": false, "restartCount": 0,
                                   "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                                   "lastState": {"terminated": {"exitCode": 137, "reason": "Error"}}}],
        }))
        .expect("valid status");
        let status = evicted_status(stopped, "Usage of EmptyDir volume \"cache\" exceeds the limit \"10Mi\". ");
        assert_eq!((status.phase.as_deref(), status.reason.as_deref()), (Some("Failed"), Some(REASON)));
        let ready = &status.conditions.as_ref().expect("conditions")[0];
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_deref(), ready.message.as_deref()),
            ("False", Some("PodCompleted"), None)
        );
        let web = &status.container_statuses.as_ref().expect("container statuses")[0];
        let terminated = web.state.as_ref().and_then(|s| s.terminated.as_ref()).expect("terminated, not waiting");
        assert_eq!((terminated.exit_code, web.last_state.as_ref()), (137, None));
        let mut evicted = pod(json!({"containers": []}));
        evicted.status = Some(status);
        assert!(is_evicted(&evicted));
        evicted.status.as_mut().expect("status").reason = None;
        assert!(!is_evicted(&evicted), "a Pod failed for another reason");
    }
}
