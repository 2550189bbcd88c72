//! Taint eviction controller (upstream's NoExecuteTaintManager): the Pods on a node with a
//! NoExecute taint they do not tolerate (and have not finished) are evicted (deleted, so their controllers make them
//! anew where they can run, within their PodDisruptionBudgets: `crate::disruption::evict`) at
//! once; those that tolerate it with `tolerationSeconds` once that much time has passed since the
//! taint came (its `timeAdded`). An eviction is a graceful delete (the node stops the Pod), except
//! from an unreachable node, whose agent cannot: there the Pod is removed at once, as are the Pods
//! already terminating on it (those without asking their budgets, as upstream's eviction does not
//! for a Pod being deleted).
//!
//! A Pod that says nothing about `node.kubernetes.io/not-ready` or `unreachable` NoExecute is
//! treated as tolerating them for [`DefaultTolerations`] (300 s each, as kube-apiserver's
//! DefaultTolerationSeconds admission plugin adds to every Pod): without it, a node whose runtime
//! stops for a moment would lose all its Pods at once. The tolerations are implied here rather
//! than written into the Pods, so that the replicas, which must store the same objects, do not
//! depend on each one's flags.

use crate::disruption::{Evicted, evict, force_delete};
use crate::{Action, Context, ReconcileError, Reconciler};
use gitplane_api::taints::{NO_EXECUTE, NOT_READY, UNREACHABLE, tolerates};
use gitplane_api::{
    events::{NORMAL, WARNING},
    object::kind_of,
};
use gitplane_store::{Event, EventType, ObjectKey, informer::Cache};
use k8s_openapi::api::core::v1::{Node, Pod, Taint, Toleration};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::Value;
use std::time::Duration;

/// How long a Pod stays on a node that is not ready or unreachable when it does not say itself
/// (kube-apiserver's `--default-not-ready-toleration-seconds` and
/// `--default-unreachable-toleration-seconds`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DefaultTolerations {
    pub not_ready: Duration,
    pub unreachable: Duration,
}

impl Default for DefaultTolerations {
    fn default() -> Self {
        DefaultTolerations { not_ready: Duration::from_secs(300), unreachable: Duration::from_secs(300) }
    }
}

/// When a Pod must leave a node with the given NoExecute taints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Eviction {
    /// Every taint is tolerated for ever.
    Never,
    /// At this time (now or past: at once).
    At(Timestamp),
}

/// When `tolerations` let a Pod stay on a node with `taints` (only the NoExecute ones count):
/// at once if one is not tolerated, else the earliest `timeAdded + tolerationSeconds` over the
/// taints (the shortest tolerationSeconds of the tolerations matching each), never if all are
/// tolerated without a limit. A taint without `timeAdded` counts from `now`.
pub fn eviction(
    tolerations: &[Toleration],
    taints: &[Taint],
    defaults: DefaultTolerations,
    now: Timestamp,
) -> Eviction {
    let mut at: Option<Timestamp> = None;
    for taint in taints.iter().filter(|t| t.effect == NO_EXECUTE) {
        let matching: Vec<&Toleration> = tolerations.iter().filter(|t| tolerates(t, taint)).collect();
        let seconds = if matching.is_empty() {
            match implied(tolerations, taint, defaults) {
                Some(seconds) => Some(seconds),
                None => return Eviction::At(now),
            }
        } else if matching.iter().any(|t| t.toleration_seconds.is_none()) {
            None
        } else {
            matching.iter().filter_map(|t| t.toleration_seconds).min().map(|s| Duration::from_secs(s.max(0) as u64))
        };
        let Some(seconds) = seconds else { continue };
        let since = taint.time_added.as_ref().map_or(now, |t| t.0);
        let due = since.checked_add(SignedDuration::try_from(seconds).unwrap_or(SignedDuration::MAX)).unwrap_or(since);
        at = Some(at.map_or(due, |at| at.min(due)));
    }
    at.map_or(Eviction::Never, Eviction::At)
}

/// The toleration DefaultTolerationSeconds gives a Pod for `taint`: only for the not-ready and
/// unreachable taints, and only when none of the Pod's tolerations is about that key's NoExecute
/// taint (a toleration of another value or of every key counts, as the admission plugin sees it).
fn implied(tolerations: &[Toleration], taint: &Taint, defaults: DefaultTolerations) -> Option<Duration> {
    let seconds = match taint.key.as_str() {
        NOT_READY => defaults.not_ready,
        UNREACHABLE => defaults.unreachable,
        _ => return None,
    };
    let said = tolerations.iter().any(|t| {
        let key = t.key.as_deref().unwrap_or_default();
        let effect = t.effect.as_deref().unwrap_or_default();
        (key.is_empty() || key == taint.key) && (effect.is_empty() || effect == NO_EXECUTE)
    });
    (!said).then_some(seconds)
}

/// How soon an eviction a PodDisruptionBudget refused is tried again.
const BUDGET_RETRY: Duration = Duration::from_secs(5);

pub struct TaintEvictionController {
    pub defaults: DefaultTolerations,
}

fn no_execute_taints(node: &Value) -> bool {
    node["spec"]["taints"].as_array().is_some_and(|t| t.iter().any(|t| t["effect"] == NO_EXECUTE))
}

#[async_trait::async_trait]
impl Reconciler for TaintEvictionController {
    fn name(&self) -> &'static str {
        "taint-eviction"
    }

    fn keys_for(&self, event: &Event, cache: &Cache) -> Vec<ObjectKey> {
        if event.key.kind == kind_of::<Node>() {
            return vec![event.key.clone()];
        }
        // A Pod that comes to (or changes on) a node with NoExecute taints: only those nodes
        // are looked at, so the Pods of healthy nodes cost a lookup each.
        if event.key.kind != kind_of::<Pod>() || event.event_type == EventType::Deleted {
            return Vec::new();
        }
        let Some(node) = event.object["spec"]["nodeName"].as_str() else { return Vec::new() };
        let key = ObjectKey::of::<Node>("", node);
        if cache.get(&key).is_some_and(|n| no_execute_taints(&n)) { vec![key] } else { Vec::new() }
    }

    fn all_keys(&self, cache: &Cache) -> Vec<ObjectKey> {
        crate::runtime::all_of::<Node>(cache)
    }

    async fn reconcile(&self, key: &ObjectKey, ctx: &Context) -> Result<Action, ReconcileError> {
        let Some(node) = ctx.cache().get_typed::<Node>("", &key.name) else { return Ok(Action::await_change()) };
        let taints: Vec<Taint> = node.spec.and_then(|s| s.taints).unwrap_or_default();
        if !taints.iter().any(|t| t.effect == NO_EXECUTE) {
            return Ok(Action::await_change());
        }
        // Finished Pods run nothing, and a Job counts its succeeded ones: they stay.
        let pods: Vec<Pod> = ctx.cache().list_typed_where(None, |p| {
            p["spec"]["nodeName"].as_str() == Some(key.name.as_str())
                && !matches!(p["status"]["phase"].as_str(), Some("Succeeded" | "Failed"))
        });
        // An unreachable node's agent cannot stop its Pods and remove them: they go at once
        // (force-deleted), those already terminating too.
        let unreachable = taints.iter().any(|t| t.key == UNREACHABLE && t.effect == NO_EXECUTE);
        let now = Timestamp::now();
        let mut next: Option<Timestamp> = None;
        let mut evicted = Vec::new();
        let mut forgotten = Vec::new();
        for pod in pods {
            if pod.metadata.deletion_timestamp.is_some() {
                if unreachable {
                    forgotten.push(pod);
                }
                continue;
            }
            let tolerations = pod.spec.as_ref().and_then(|s| s.tolerations.as_deref()).unwrap_or_default();
            match eviction(tolerations, &taints, self.defaults, now) {
                Eviction::Never => {}
                Eviction::At(at) if at <= now => evicted.push(pod),
                Eviction::At(at) => next = Some(next.map_or(at, |n| n.min(at))),
            }
        }
        for pod in &evicted {
            let name = format!(
                "{}/{}",
                pod.metadata.namespace.as_deref().unwrap_or_default(),
                pod.metadata.name.as_deref().unwrap_or_default()
            );
            tracing::info!(node = %key.name, pod = %name, "evicting a Pod from a node with a NoExecute taint");
            let message = format!("Marking for deletion Pod {name}");
            ctx.event("taint-eviction-controller", pod, NORMAL, "TaintManagerEviction", &message);
        }
        // Each Pod on its own: one that changed meanwhile is looked at again, not the others.
        // An eviction its PodDisruptionBudget does not allow yet waits and is tried again.
        for pod in evicted {
            match evict(ctx, &pod, unreachable).await {
                Ok(Evicted::Yes) => {}
                Ok(Evicted::Refused(why)) => {
                    ctx.event_on_owner("taint-eviction-controller", &pod, WARNING, crate::disruption::HELD, &why);
                    let retry = now + SignedDuration::try_from(BUDGET_RETRY).unwrap_or_default();
                    next = Some(next.map_or(retry, |n| n.min(retry)));
                }
                Err(ReconcileError::Store(e)) if e.is_conflict() || e.is_not_found() => next = Some(now),
                Err(e) => return Err(e),
            }
        }
        for pod in forgotten {
            match ctx.commit(vec![force_delete(&pod)]).await {
                Err(e) if e.is_conflict() || e.is_not_found() => next = Some(now),
                other => drop(other?),
            }
        }
        Ok(match next {
            Some(at) => Action::requeue(
                Duration::try_from(at.duration_since(now)).unwrap_or_default() + Duration::from_millis(100),
            ),
            None => Action::await_change(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn taint(key: &str, added: Timestamp) -> Taint {
        Taint { key: key.into(), value: None, effect: NO_EXECUTE.into(), time_added: Some(Time(added)) }
    }

    fn tolerations(json: serde_json::Value) -> Vec<Toleration> {
        serde_json::from_value(json).expect("tolerations")
    }

    #[test]
    fn when_a_pod_leaves_a_tainted_node() {
        let added = Timestamp::UNIX_EPOCH;
        let now = added + SignedDuration::from_secs(10);
        let after = |s: i64| Eviction::At(added + SignedDuration::from_secs(s));
        let defaults = DefaultTolerations::default();
        let not_ready = [taint(NOT_READY, added)];
        let none = tolerations(serde_json::json!([]));

        // Nothing said: DefaultTolerationSeconds.
        assert_eq!(eviction(&none, &not_ready, defaults, now), after(300));
        let short = DefaultTolerations { not_ready: Duration::from_secs(30), ..defaults };
        assert_eq!(eviction(&none, &not_ready, short, now), after(30));
        // The Pod's own tolerationSeconds, the shortest of those that match.
        let own = tolerations(serde_json::json!([
            {"key": NOT_READY, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 5},
            {"operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 60},
        ]));
        assert_eq!(eviction(&own, &not_ready, defaults, now), after(5));
        // Tolerated for ever.
        let forever = tolerations(serde_json::json!([{"operator": "Exists"}]));
        assert_eq!(eviction(&forever, &not_ready, defaults, now), Eviction::Never);
        // Another taint, not tolerated: at once; tolerated without a limit: never.
        let dedicated = [taint("dedicated", added)];
        assert_eq!(eviction(&none, &dedicated, defaults, now), Eviction::At(now));
        let tolerating = tolerations(serde_json::json!([{"key": "dedicated", "operator": "Exists"}]));
        assert_eq!(eviction(&tolerating, &dedicated, defaults, now), Eviction::Never);
        // A toleration of the key with another value says something: no default, so at once.
        let other_value = tolerations(serde_json::json!([{"key": NOT_READY, "value": "x", "effect": "NoExecute"}]));
        assert_eq!(eviction(&other_value, &not_ready, defaults, now), Eviction::At(now));
        // Only NoExecute taints count; with several, the earliest.
        let both = [taint(UNREACHABLE, added + SignedDuration::from_secs(100)), taint(NOT_READY, added)];
        assert_eq!(eviction(&none, &both, defaults, now), after(300));
        let no_schedule = [Taint { effect: "NoSchedule".into(), ..taint("dedicated", added) }];
        assert_eq!(eviction(&none, &no_schedule, defaults, now), Eviction::Never);
    }
}
