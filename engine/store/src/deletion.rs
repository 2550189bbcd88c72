//! How a delete lands, as the API server's Pod strategy decides it (`CheckGracefulDelete`): a Pod
//! bound to a node is deleted gracefully (`metadata.deletionTimestamp` and
//! `deletionGracePeriodSeconds` set; its node stops it and then removes the object), anything
//! else at once. The controllers and the source controller's prune delete through [`delete`];
//! what must remove a Pod whatever its state (its node is gone or unreachable, its node
//! finalizes it) writes [`Op::Delete`] itself.

use crate::{ObjectKey, Op};
use gitplane_api::k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::Time,
    jiff::{SignedDuration, Timestamp},
};
use gitplane_api::object::resource_version;
use serde_json::{Value, json};

/// The grace a Pod gets when its spec says none (the API server's default).
pub const DEFAULT_GRACE_PERIOD_SECONDS: i64 = 30;

/// What a delete of an object does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deletion {
    /// The object is removed at once.
    Now,
    /// The Pod is marked terminating with this grace period; its node finalizes the delete.
    Graceful { grace_period_seconds: i64 },
    /// Already terminating: nothing more to do.
    InProgress,
}

/// Whether a graceful delete of the object has begun.
pub fn is_terminating(object: &Value) -> bool {
    object["metadata"]["deletionTimestamp"].is_string()
}

/// The decision for `object` (JSON, as stored): a Pod that is not yet terminating, is bound to a
/// node, has not finished and has a grace period above zero is deleted gracefully; the grace is
/// its `spec.terminationGracePeriodSeconds` (30 when unset).
pub fn deletion(object: &Value) -> Deletion {
    if object["kind"] != "Pod" || object["apiVersion"].as_str().is_some_and(|v| v != "v1") {
        return Deletion::Now;
    }
    if is_terminating(object) {
        return Deletion::InProgress;
    }
    let bound = object["spec"]["nodeName"].as_str().is_some_and(|n| !n.is_empty());
    let finished = matches!(object["status"]["phase"].as_str(), Some("Succeeded" | "Failed"));
    let grace = object["spec"]["terminationGracePeriodSeconds"].as_i64().unwrap_or(DEFAULT_GRACE_PERIOD_SECONDS);
    if !bound || finished || grace <= 0 {
        return Deletion::Now;
    }
    Deletion::Graceful { grace_period_seconds: grace }
}

/// The write that deletes `object` (as read: it compares-and-swaps on its resourceVersion) at
/// `now`, or `None` when its delete is already under way. A graceful
/// delete sets `deletionTimestamp` to when the grace ends, as the API server does.
pub fn delete(object: &Value, now: Timestamp) -> Option<Op> {
    match deletion(object) {
        Deletion::InProgress => None,
        Deletion::Now => {
            let key = ObjectKey::from_value(object).ok()?;
            Some(Op::Delete { key, revision: resource_version(object) })
        }
        Deletion::Graceful { grace_period_seconds } => {
            let mut marked = object.clone();
            let at = now.saturating_add(SignedDuration::from_secs(grace_period_seconds)).unwrap_or(Timestamp::MAX);
            marked["metadata"]["deletionTimestamp"] = json!(Time(at));
            marked["metadata"]["deletionGracePeriodSeconds"] = json!(grace_period_seconds);
            Some(Op::Update(marked))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(node: Option<&str>, grace: Option<i64>, phase: Option<&str>, deleting: bool) -> Value {
        let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "default", "resourceVersion": "7"},
            "spec": {"nodeName": node, "terminationGracePeriodSeconds": grace, "containers": []},
            "status": {"phase": phase}});
        if deleting {
            pod["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:30Z");
        }
        pod
    }

    #[test]
    fn which_deletes_are_graceful() {
        let graceful = |s| Deletion::Graceful { grace_period_seconds: s };
        #[rustfmt::skip]
        let cases = [
            ("bound, grace unset: the default", pod(Some("n1"), None, Some("Running"), false), graceful(30)),
            ("bound, its own grace", pod(Some("n1"), Some(5), Some("Running"), false), graceful(5)),
            ("bound, pending", pod(Some("n1"), Some(5), None, false), graceful(5)),
            ("unbound: nothing runs it", pod(None, Some(5), None, false), Deletion::Now),
            ("an empty nodeName is unbound", pod(Some(""), Some(5), None, false), Deletion::Now),
            ("grace zero", pod(Some("n1"), Some(0), Some("Running"), false), Deletion::Now),
            ("succeeded: nothing left to stop", pod(Some("n1"), None, Some("Succeeded"), false), Deletion::Now),
            ("failed", pod(Some("n1"), None, Some("Failed"), false), Deletion::Now),
            ("already terminating", pod(Some("n1"), None, Some("Running"), true), Deletion::InProgress),
            ("not a Pod", json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "spec": {"nodeName": "n1"}}), Deletion::Now),
        ];
        for (what, object, expected) in cases {
            assert_eq!(deletion(&object), expected, "{what}");
        }
    }

    fn second(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    #[test]
    fn the_write_of_each_decision() {
        let Some(Op::Update(marked)) = delete(&pod(Some("n1"), Some(5), Some("Running"), false), second(1_767_225_600))
        else {
            panic!("a bound Pod is marked")
        };
        assert_eq!(marked["metadata"]["deletionTimestamp"], "2026-01-01T00:00:05Z", "when the grace ends");
        assert_eq!(marked["metadata"]["deletionGracePeriodSeconds"], 5);
        assert_eq!(marked["metadata"]["resourceVersion"], "7", "compare-and-swap on what was read");
        let Some(Op::Delete { key, revision }) = delete(&pod(None, None, None, false), second(0)) else {
            panic!("removed")
        };
        assert_eq!((key.to_string(), revision), ("Pod default/p".to_owned(), Some(7)));
        assert!(delete(&pod(Some("n1"), None, Some("Running"), true), second(0)).is_none());
    }
}
