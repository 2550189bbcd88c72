//! PodDisruptionBudgets: the disruption controller, which keeps each budget's status (upstream's
//! `pkg/controller/disruption`), and eviction, the one way gitplane's controllers disrupt a Pod
//! that a budget covers (the eviction subresource's rule, `pkg/registry/core/pod/storage/eviction.go`).
//!
//! An eviction deletes the Pod and takes one disruption off its budget's status in one
//! transaction, compare-and-swap on the budget: two evictions that race for the last allowed
//! disruption cannot both succeed. One that the budget does not allow is refused, and the
//! caller retries it later. Rollouts (Deployments, DaemonSets, through [`disruptions_allowed`])
//! take no more available Pods down than the budgets allow, and their unavailable ones only as
//! `spec.unhealthyPodEvictionPolicy` lets them; a held one records upstream's refusal as a
//! Warning Event on the workload.

use crate::{Action, Context, ReconcileError, Reconciler, plan::Op, runtime::all_of};
use gitplane_api::labels::{Labels, matches};
use gitplane_api::object::{kind_of, revision_of, to_value};
use gitplane_store::{Event, ObjectKey, informer::Cache};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{Node, Pod, ReplicationController};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use k8s_openapi::jiff::Timestamp;
use std::collections::BTreeSet;

pub struct DisruptionController;

/// The reason of the Warning Event a workload or a Pod's owner gets when a budget holds back a
/// rollout or an eviction; its message is the eviction API's refusal.
pub const HELD: &str = "DisruptionBudget";

/// The condition a budget's status carries.
pub const DISRUPTION_ALLOWED: &str = "DisruptionAllowed";

/// Whether the budget selects the Pod: same namespace and its selector matches (an empty
/// selector selects every Pod of the namespace, a missing one none, as in policy/v1).
pub fn selects(pdb: &PodDisruptionBudget, pod: &Pod) -> bool {
    let Some(selector) = pdb.spec.as_ref().and_then(|s| s.selector.as_ref()) else { return false };
    let empty = Labels::new();
    pdb.metadata.namespace == pod.metadata.namespace
        && matches(selector, pod.metadata.labels.as_ref().unwrap_or(&empty))
}

/// Ready on a node that is Ready and not terminating, as the budget counts a Pod healthy
/// (upstream's `countHealthyPods`): a Pod on a node that stopped reporting still says Ready,
/// which upstream's node lifecycle controller would have turned NotReady. A terminating Pod
/// still counts among the expected ones.
fn healthy(cache: &Cache, pod: &Pod) -> bool {
    let node_ready = || {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) else { return false };
        cache.get(&ObjectKey::new(kind_of::<Node>(), "", node)).is_some_and(|n| {
            n["status"]["conditions"]
                .as_array()
                .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
        })
    };
    !crate::replicaset::is_terminating(pod) && crate::replicaset::is_ready(pod) && node_ready()
}

/// What a budget says of the Pods it selects (upstream's `getExpectedPodCount` and
/// `updatePdbStatus`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    pub expected_pods: i32,
    pub desired_healthy: i32,
    pub current_healthy: i32,
    pub disruptions_allowed: i32,
}

/// The budget over `pods` (those it selects), `healthy` of them healthy. `scale` is the Pods' controllers' replicas
/// (counted once per controller; Pods without one count for nothing), which maxUnavailable and
/// a percentage of minAvailable are measured against; an integer minAvailable is measured
/// against the Pods themselves. Percentages round up. No disruption is allowed while no Pod is
/// expected, so a budget whose Pods appear before its status does is safe.
pub fn budget(pdb: &PodDisruptionBudget, pods: &[&Pod], healthy: usize, scale: i32) -> Result<Budget, ReconcileError> {
    let spec = pdb.spec.as_ref();
    let percent_of = |value: &IntOrString, of: i32, field: &str| -> Result<i32, ReconcileError> {
        match value {
            IntOrString::Int(n) => Ok(*n),
            IntOrString::String(s) => {
                let p = s.strip_suffix('%').and_then(|p| p.parse::<i64>().ok()).ok_or_else(|| {
                    ReconcileError::Invalid(format!(
                        "spec.{field} {s:?} is neither a number nor a percentage such as \"50%\""
                    ))
                })?;
                Ok(i32::try_from((p * i64::from(of) + 99) / 100).unwrap_or(i32::MAX))
            }
        }
    };
    let (expected_pods, desired_healthy) =
        match (spec.and_then(|s| s.max_unavailable.as_ref()), spec.and_then(|s| s.min_available.as_ref())) {
            (Some(max_unavailable), _) => {
                (scale, (scale - percent_of(max_unavailable, scale, "maxUnavailable")?).max(0))
            }
            (None, Some(IntOrString::Int(n))) => (i32::try_from(pods.len()).unwrap_or(i32::MAX), *n),
            (None, Some(percent)) => (scale, percent_of(percent, scale, "minAvailable")?),
            (None, None) => (i32::try_from(pods.len()).unwrap_or(i32::MAX), 0),
        };
    let current_healthy = i32::try_from(healthy).unwrap_or(i32::MAX);
    let allowed = current_healthy - desired_healthy;
    let disruptions_allowed = if expected_pods <= 0 || allowed <= 0 { 0 } else { allowed };
    Ok(Budget { expected_pods, desired_healthy, current_healthy, disruptions_allowed })
}

/// The replicas the controllers of `pods` want, each controller once (upstream's
/// `getExpectedScale`): a ReplicaSet's Deployment's, a ReplicaSet's, a ReplicationController's,
/// a StatefulSet's, and a DaemonSet's desiredNumberScheduled.
pub fn expected_scale(cache: &Cache, pods: &[&Pod]) -> i32 {
    let mut seen = BTreeSet::new();
    let mut total = 0i32;
    for pod in pods {
        let Some(owner) = pod.metadata.owner_references.iter().flatten().find(|o| o.controller == Some(true)) else {
            continue;
        };
        let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
        let get = |kind: String, name: &str| cache.get(&ObjectKey::new(kind, namespace, name));
        let (key, replicas) = match owner.kind.as_str() {
            "ReplicaSet" => {
                let Some(rs) = get(kind_of::<ReplicaSet>(), &owner.name) else { continue };
                let deployment = rs["metadata"]["ownerReferences"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|o| o["kind"] == "Deployment" && o["controller"] == true)
                    .and_then(|o| get(kind_of::<Deployment>(), o["name"].as_str()?));
                match deployment {
                    Some(d) => (format!("Deployment/{}", d["metadata"]["name"]), d["spec"]["replicas"].as_i64()),
                    None => (format!("ReplicaSet/{}", owner.name), rs["spec"]["replicas"].as_i64()),
                }
            }
            "ReplicationController" => {
                let Some(rc) = get(kind_of::<ReplicationController>(), &owner.name) else { continue };
                (format!("ReplicationController/{}", owner.name), rc["spec"]["replicas"].as_i64())
            }
            "StatefulSet" => {
                let Some(sts) = get(kind_of::<StatefulSet>(), &owner.name) else { continue };
                (format!("StatefulSet/{}", owner.name), sts["spec"]["replicas"].as_i64())
            }
            "DaemonSet" => {
                let Some(ds) = get(kind_of::<DaemonSet>(), &owner.name) else { continue };
                (format!("DaemonSet/{}", owner.name), ds["status"]["desiredNumberScheduled"].as_i64())
            }
            _ => continue,
        };
        if seen.insert(key) {
            total = total.saturating_add(i32::try_from(replicas.unwrap_or(1)).unwrap_or(i32::MAX));
        }
    }
    total
}

/// The budget of `pdb` as the cache shows its Pods now.
fn current_budget(cache: &Cache, pdb: &PodDisruptionBudget) -> Result<Budget, ReconcileError> {
    let namespace = pdb.metadata.namespace.as_deref().unwrap_or_default();
    let all: Vec<Pod> = cache.list_typed(Some(namespace));
    let pods: Vec<&Pod> = all.iter().filter(|p| selects(pdb, p)).collect();
    let healthy_pods = pods.iter().filter(|p| healthy(cache, p)).count();
    budget(pdb, &pods, healthy_pods, expected_scale(cache, &pods))
}

/// What the PodDisruptionBudgets covering a workload's Pods allow now: what rollouts cap their
/// deletions by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allowance {
    /// How many more healthy Pods may go: the fewest any budget allows.
    pub healthy: i32,
    /// Whether Pods that are not healthy may go: every budget lets them ([`unhealthy_may_go`]).
    pub unhealthy: bool,
    /// Why the budget that holds them back refuses, in the eviction API's words.
    pub refusal: String,
}

/// Whether a budget lets a Pod that is not healthy go (`spec.unhealthyPodEvictionPolicy`):
/// `AlwaysAllow` always; `IfHealthyBudget`, the default, only while the budget has the healthy
/// Pods it wants, so that an application already short of them is not disrupted further.
pub fn unhealthy_may_go(pdb: &PodDisruptionBudget, current_healthy: i32, desired_healthy: i32) -> bool {
    pdb.spec.as_ref().and_then(|s| s.unhealthy_pod_eviction_policy.as_deref()) == Some("AlwaysAllow")
        || current_healthy >= desired_healthy
}

/// The eviction API's refusal when `name` allows no disruption.
pub fn refusal(name: &str, desired_healthy: i32, current_healthy: i32) -> String {
    format!(
        "Cannot evict pod as it would violate the pod's disruption budget. The disruption budget {name} needs \
         {desired_healthy} healthy pods and has {current_healthy} currently"
    )
}

/// What `budgets` (each with its budget now) allow together; `None` when there are none.
pub fn allowance(budgets: &[(&PodDisruptionBudget, Budget)]) -> Option<Allowance> {
    let healthy = budgets.iter().map(|(_, b)| b.disruptions_allowed).min()?;
    let held = budgets.iter().find(|(pdb, b)| !unhealthy_may_go(pdb, b.current_healthy, b.desired_healthy));
    let (pdb, b) = held.or_else(|| budgets.iter().find(|(_, b)| b.disruptions_allowed == healthy))?;
    Some(Allowance {
        healthy,
        unhealthy: held.is_none(),
        refusal: refusal(pdb.metadata.name.as_deref().unwrap_or_default(), b.desired_healthy, b.current_healthy),
    })
}

/// What the budgets covering any of `pods` allow now; `None` when no budget covers them.
pub fn disruptions_allowed(cache: &Cache, pods: &[Pod]) -> Option<Allowance> {
    let namespace = pods.first()?.metadata.namespace.clone()?;
    let budgets: Vec<PodDisruptionBudget> = cache.list_typed(Some(&namespace));
    let covering: Vec<(&PodDisruptionBudget, Budget)> = budgets
        .iter()
        .filter(|pdb| pods.iter().any(|p| selects(pdb, p)))
        .map(|pdb| {
            // A malformed percentage allows nothing until it is fixed.
            let none = Budget { expected_pods: 0, desired_healthy: 1, current_healthy: 0, disruptions_allowed: 0 };
            (pdb, current_budget(cache, pdb).unwrap_or(none))
        })
        .collect();
    allowance(&covering)
}

/// The budget's status for `budget`: the DisruptionAllowed condition keeps its
/// lastTransitionTime while its status stays.
pub fn status(pdb: &PodDisruptionBudget, budget: Budget, now: Timestamp) -> PodDisruptionBudgetStatus {
    let allowed = budget.disruptions_allowed > 0;
    let (status, reason) = if allowed { ("True", "SufficientPods") } else { ("False", "InsufficientPods") };
    let before = pdb.status.as_ref().and_then(|s| s.conditions.as_ref()).and_then(|c| {
        c.iter().find(|c| c.type_ == DISRUPTION_ALLOWED && c.status == status).map(|c| c.last_transition_time.clone())
    });
    PodDisruptionBudgetStatus {
        current_healthy: budget.current_healthy,
        desired_healthy: budget.desired_healthy,
        expected_pods: budget.expected_pods,
        disruptions_allowed: budget.disruptions_allowed,
        observed_generation: pdb.metadata.generation,
        disrupted_pods: None,
        conditions: Some(vec![Condition {
            type_: DISRUPTION_ALLOWED.into(),
            status: status.into(),
            reason: reason.into(),
            message: String::new(),
            observed_generation: pdb.metadata.generation,
            last_transition_time: before.unwrap_or(Time(now)),
        }]),
    }
}

/// What became of an eviction.
#[derive(Debug, PartialEq, Eq)]
pub enum Evicted {
    /// The Pod is gone.
    Yes,
    /// A budget does not allow it now: the message says which and why.
    Refused(String),
}

/// Evicts `pod` as the eviction subresource does: with no budget covering it, it is deleted;
/// with one, only if its status (observed, up to date) allows a disruption (or the Pod is not
/// healthy while the budget has its healthy Pods, as `IfHealthyBudget`), and then the deletion
/// and the budget's one disruption less are one transaction; with more than one, never. The
/// deletion is the API server's (`gitplane_store::deletion`: a bound Pod gracefully), or, when
/// `forced` (its node is unreachable and cannot stop it), the object's removal at once. A Pod
/// already terminating is on its way out: nothing is written.
pub async fn evict(ctx: &Context, pod: &Pod, forced: bool) -> Result<Evicted, ReconcileError> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    let budgets: Vec<PodDisruptionBudget> = ctx
        .cache()
        .list_typed::<PodDisruptionBudget>(Some(namespace))
        .into_iter()
        .filter(|b| selects(b, pod))
        .collect();
    let delete = if forced { Some(force_delete(pod)) } else { Op::Delete(pod.clone()).into_store_op(Timestamp::now()) };
    let Some(delete) = delete else { return Ok(Evicted::Yes) };
    let pdb = match budgets.as_slice() {
        [] => {
            ctx.commit(vec![delete]).await?;
            return Ok(Evicted::Yes);
        }
        [pdb] => pdb,
        _ => {
            return Ok(Evicted::Refused(
                "this pod has more than one PodDisruptionBudget, which the eviction API does not allow".into(),
            ));
        }
    };
    let name = pdb.metadata.name.as_deref().unwrap_or_default();
    let Some(status) = pdb.status.as_ref().filter(|s| s.observed_generation >= pdb.metadata.generation) else {
        return Ok(Evicted::Refused(format!("the disruption budget {name} is still being processed by the server")));
    };
    if !healthy(ctx.cache(), pod) && unhealthy_may_go(pdb, status.current_healthy, status.desired_healthy) {
        ctx.commit(vec![delete]).await?;
        return Ok(Evicted::Yes);
    }
    if status.disruptions_allowed <= 0 {
        return Ok(Evicted::Refused(refusal(name, status.desired_healthy, status.current_healthy)));
    }
    let mut spent = pdb.clone();
    if let Some(s) = spent.status.as_mut() {
        s.disruptions_allowed -= 1;
    }
    ctx.commit(vec![delete, gitplane_store::Op::UpdateStatus(to_value(&spent))]).await?;
    Ok(Evicted::Yes)
}

/// The delete of a Pod whatever its state, compare-and-swap on what was read.
pub(crate) fn force_delete(pod: &Pod) -> gitplane_store::Op {
    let meta = &pod.metadata;
    let key = ObjectKey::of::<Pod>(meta.namespace.as_deref().unwrap_or(""), meta.name.as_deref().unwrap_or(""));
    gitplane_store::Op::Delete { key, revision: revision_of(pod) }
}

#[async_trait::async_trait]
impl Reconciler for DisruptionController {
    fn name(&self) -> &'static str {
        "disruption"
    }

    fn keys_for(&self, event: &Event, cache: &Cache) -> Vec<ObjectKey> {
        if event.key.kind == kind_of::<PodDisruptionBudget>() {
            return vec![event.key.clone()];
        }
        let scales = [kind_of::<Pod>(), kind_of::<ReplicaSet>(), kind_of::<Deployment>(), kind_of::<DaemonSet>()];
        if !scales.contains(&event.key.kind) && event.key.kind != kind_of::<ReplicationController>() {
            return Vec::new();
        }
        // A Pod's or a controller's change may move any budget of its namespace.
        cache
            .list(&kind_of::<PodDisruptionBudget>(), Some(&event.key.namespace))
            .iter()
            .filter_map(|v| ObjectKey::from_value(v).ok())
            .collect()
    }

    fn all_keys(&self, cache: &Cache) -> Vec<ObjectKey> {
        all_of::<PodDisruptionBudget>(cache)
    }

    async fn reconcile(&self, key: &ObjectKey, ctx: &Context) -> Result<Action, ReconcileError> {
        let Some(pdb) = ctx.cache().get_typed::<PodDisruptionBudget>(&key.namespace, &key.name) else {
            return Ok(Action::await_change());
        };
        let budget = match current_budget(ctx.cache(), &pdb) {
            Ok(budget) => budget,
            Err(e) => {
                // A malformed percentage: no disruption is allowed until it is fixed.
                tracing::warn!(error = %e, "cannot compute the disruption budget");
                Budget { expected_pods: 0, desired_healthy: 0, current_healthy: 0, disruptions_allowed: 0 }
            }
        };
        let status = status(&pdb, budget, Timestamp::now());
        if pdb.status.as_ref() != Some(&status) {
            let mut updated = pdb.clone();
            updated.status = Some(status);
            ctx.update_status(&updated).await?;
        }
        Ok(Action::await_change())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn pdb(spec: Value) -> PodDisruptionBudget {
        let mut spec = spec;
        spec["selector"] = json!({"matchLabels": {"app": "web"}});
        serde_json::from_value(
            json!({"metadata": {"name": "web", "namespace": "default", "generation": 2}, "spec": spec}),
        )
        .unwrap()
    }

    fn pods(ready: usize, not_ready: usize) -> Vec<Pod> {
        (0..ready + not_ready)
            .map(|i| {
                serde_json::from_value(
                    json!({"metadata": {"name": format!("p{i}"), "namespace": "default", "labels": {"app": "web"}},
                    "status": {"conditions": [{"type": "Ready", "status": if i < ready { "True" } else { "False" }}]}}),
                )
                .unwrap()
            })
            .collect()
    }

    #[test]
    fn budget_arithmetic() {
        // (what, spec, ready Pods, not ready Pods, the controllers' scale,
        //  (expected, desired healthy, current healthy, disruptions allowed))
        #[rustfmt::skip]
        let cases = [
            ("minAvailable 2 of 3 ready", json!({"minAvailable": 2}), 3, 0, 3, (3, 2, 3, 1)),
            ("minAvailable 2, one not ready", json!({"minAvailable": 2}), 2, 1, 3, (3, 2, 2, 0)),
            ("minAvailable counts the Pods, not the scale", json!({"minAvailable": 1}), 2, 0, 5, (2, 1, 2, 1)),
            ("minAvailable 50% of 3 rounds up to 2", json!({"minAvailable": "50%"}), 3, 0, 3, (3, 2, 3, 1)),
            ("minAvailable 100%", json!({"minAvailable": "100%"}), 3, 0, 3, (3, 3, 3, 0)),
            ("maxUnavailable 1 of 3", json!({"maxUnavailable": 1}), 3, 0, 3, (3, 2, 3, 1)),
            ("maxUnavailable 1 while one is missing", json!({"maxUnavailable": 1}), 2, 0, 3, (3, 2, 2, 0)),
            ("maxUnavailable 34% of 3 rounds up to 2", json!({"maxUnavailable": "34%"}), 3, 0, 3, (3, 1, 3, 2)),
            ("maxUnavailable 0", json!({"maxUnavailable": 0}), 3, 0, 3, (3, 3, 3, 0)),
            ("maxUnavailable more than the scale", json!({"maxUnavailable": 5}), 3, 0, 3, (3, 0, 3, 3)),
            ("no Pod expected: nothing allowed", json!({"maxUnavailable": 1}), 0, 0, 0, (0, 0, 0, 0)),
            ("neither: every disruption allowed", json!({}), 2, 0, 2, (2, 0, 2, 2)),
        ];
        for (
            what,
            spec,
            ready,
            not_ready,
            scale,
            (expected_pods, desired_healthy, current_healthy, disruptions_allowed),
        ) in cases
        {
            let all = pods(ready, not_ready);
            let refs: Vec<&Pod> = all.iter().collect();
            assert_eq!(
                budget(&pdb(spec), &refs, ready, scale).unwrap(),
                Budget { expected_pods, desired_healthy, current_healthy, disruptions_allowed },
                "{what}"
            );
        }
        let err = budget(&pdb(json!({"minAvailable": "half"})), &[], 0, 3).unwrap_err().to_string();
        assert!(err.contains("spec.minAvailable \"half\" is neither"), "{err}");
    }

    #[test]
    fn unhealthy_pods_go_as_the_policy_says_and_budgets_combine() {
        let with_policy = |policy: Option<&str>| {
            let mut b = pdb(json!({"minAvailable": 2}));
            b.spec.as_mut().unwrap().unhealthy_pod_eviction_policy = policy.map(str::to_owned);
            b
        };
        // (what, policy, current healthy, desired healthy, may an unhealthy Pod go)
        #[rustfmt::skip]
        let cases = [
            ("IfHealthyBudget by default, the budget healthy", None, 2, 2, true),
            ("IfHealthyBudget by default, short of healthy Pods", None, 1, 2, false),
            ("IfHealthyBudget, short", Some("IfHealthyBudget"), 1, 2, false),
            ("AlwaysAllow, short", Some("AlwaysAllow"), 0, 2, true),
        ];
        for (what, policy, current, desired, want) in cases {
            assert_eq!(unhealthy_may_go(&with_policy(policy), current, desired), want, "{what}");
        }

        let (loose, strict) = (with_policy(Some("AlwaysAllow")), with_policy(None));
        let b = |current_healthy, desired_healthy, disruptions_allowed| Budget {
            expected_pods: 3,
            desired_healthy,
            current_healthy,
            disruptions_allowed,
        };
        assert_eq!(allowance(&[]), None, "no budget");
        let both = allowance(&[(&loose, b(3, 1, 2)), (&strict, b(3, 2, 1))]).unwrap();
        assert_eq!((both.healthy, both.unhealthy), (1, true), "the fewest allowed");
        assert_eq!(
            both.refusal,
            "Cannot evict pod as it would violate the pod's disruption budget. The disruption budget web needs 2 \
             healthy pods and has 3 currently"
        );
        let short = allowance(&[(&loose, b(0, 1, 0)), (&strict, b(1, 2, 0))]).unwrap();
        assert_eq!((short.healthy, short.unhealthy), (0, false), "IfHealthyBudget short of healthy Pods holds them");
        assert!(short.refusal.ends_with("needs 2 healthy pods and has 1 currently"), "{}", short.refusal);
    }

    #[test]
    fn selection_and_status() {
        let budget_of = pdb(json!({"minAvailable": 1}));
        let all = pods(1, 0);
        assert!(selects(&budget_of, &all[0]));
        let mut elsewhere = all[0].clone();
        elsewhere.metadata.namespace = Some("other".into());
        assert!(!selects(&budget_of, &elsewhere));
        let mut no_selector = budget_of.clone();
        no_selector.spec.as_mut().unwrap().selector = None;
        assert!(!selects(&no_selector, &all[0]), "policy/v1: no selector selects nothing");
        let mut everything = budget_of.clone();
        everything.spec.as_mut().unwrap().selector = Some(Default::default());
        assert!(selects(&everything, &all[0]), "policy/v1: an empty selector selects the namespace");

        let then = Timestamp::from_second(10).unwrap();
        let allowed = Budget { expected_pods: 3, desired_healthy: 2, current_healthy: 3, disruptions_allowed: 1 };
        let first = status(&budget_of, allowed, then);
        let condition = &first.conditions.as_ref().unwrap()[0];
        assert_eq!(
            (condition.type_.as_str(), condition.status.as_str(), condition.reason.as_str()),
            (DISRUPTION_ALLOWED, "True", "SufficientPods")
        );
        assert_eq!((first.disruptions_allowed, first.observed_generation), (1, Some(2)));
        let mut observed = budget_of.clone();
        observed.status = Some(first);
        let later = Timestamp::from_second(20).unwrap();
        let same = status(&observed, Budget { current_healthy: 4, disruptions_allowed: 2, ..allowed }, later);
        assert_eq!(same.conditions.as_ref().unwrap()[0].last_transition_time.0, then, "unchanged: its time stays");
        let none = status(&observed, Budget { current_healthy: 2, disruptions_allowed: 0, ..allowed }, later);
        let condition = &none.conditions.as_ref().unwrap()[0];
        assert_eq!(
            (condition.status.as_str(), condition.reason.as_str(), condition.last_transition_time.0),
            ("False", "InsufficientPods", later)
        );
    }
}
