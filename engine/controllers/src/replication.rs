//! ReplicationControllers on the ReplicaSet controller, as upstream's replication manager runs
//! them (`pkg/controller/replication/conversion.go`): an RC is the ReplicaSet whose selector is
//! `matchLabels` of the RC's plain label map, and its status is the ReplicaSet's, field for
//! field.

use crate::replicaset::Replicated;
use k8s_openapi::api::apps::v1::{ReplicaSet, ReplicaSetSpec, ReplicaSetStatus};
use k8s_openapi::api::core::v1::{ReplicationController, ReplicationControllerCondition, ReplicationControllerStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

impl Replicated for ReplicationController {
    const CONTROLLER: &'static str = "replicationcontroller";
    const COMPONENT: &'static str = "replication-controller";

    fn as_replica_set(&self) -> ReplicaSet {
        let spec = self.spec.clone().unwrap_or_default();
        ReplicaSet {
            metadata: self.metadata.clone(),
            spec: Some(ReplicaSetSpec {
                replicas: spec.replicas,
                min_ready_seconds: spec.min_ready_seconds,
                selector: selector(self),
                template: spec.template,
            }),
            status: None,
        }
    }

    fn with_status(&self, status: ReplicaSetStatus) -> Self {
        let conditions = status.conditions.map(|c| {
            c.into_iter()
                .map(|c| ReplicationControllerCondition {
                    type_: c.type_,
                    status: c.status,
                    reason: c.reason,
                    message: c.message,
                    last_transition_time: c.last_transition_time,
                })
                .collect()
        });
        ReplicationController {
            status: Some(ReplicationControllerStatus {
                replicas: status.replicas,
                fully_labeled_replicas: status.fully_labeled_replicas,
                ready_replicas: status.ready_replicas,
                available_replicas: status.available_replicas,
                observed_generation: status.observed_generation,
                conditions,
            }),
            ..self.clone()
        }
    }
}

/// The RC's selector as a ReplicaSet's: its label map as `matchLabels`, the template's labels
/// when it has none (as the API server defaults it).
pub fn selector(rc: &ReplicationController) -> LabelSelector {
    let spec = rc.spec.as_ref();
    let own = spec.and_then(|s| s.selector.clone()).filter(|s| !s.is_empty());
    let template = || spec.and_then(|s| s.template.as_ref()?.metadata.as_ref()?.labels.clone());
    LabelSelector { match_labels: own.or_else(template), match_expressions: None }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{plan::Op, replicaset::plan};
    use serde_json::{Value, json};

    fn rc(selector: Value) -> ReplicationController {
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ReplicationController",
            "metadata": {"name": "nginx", "namespace": "default", "uid": "rc-1", "generation": 4},
            "spec": {"replicas": 3, "selector": selector,
                     "template": {"metadata": {"labels": {"app": "nginx", "tier": "web"}},
                                  "spec": {"containers": [{"name": "nginx", "image": "nginx"}]}}}
        }))
        .unwrap()
    }

    #[test]
    fn the_selector_is_a_plain_map_of_match_labels() {
        let labels = |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        #[rustfmt::skip]
        let cases = [
            ("its own map", json!({"app": "nginx"}), labels(&[("app", "nginx")])),
            ("none: the template's labels", Value::Null, labels(&[("app", "nginx"), ("tier", "web")])),
            ("empty: the template's labels", json!({}), labels(&[("app", "nginx"), ("tier", "web")])),
        ];
        for (what, selector_map, expected) in cases {
            let rs = rc(selector_map).as_replica_set();
            let selector = rs.spec.unwrap().selector;
            assert_eq!(selector.match_labels, Some(expected), "{what}");
            assert_eq!(selector.match_expressions, None, "{what}");
        }
    }

    #[test]
    fn an_rc_is_planned_as_a_replica_set_and_owns_its_pods_as_itself() {
        let rc = rc(json!({"app": "nginx"}));
        let rs = rc.as_replica_set();
        assert_eq!((rs.metadata.name.as_deref(), rs.spec.as_ref().unwrap().replicas), (Some("nginx"), Some(3)));
        let owner = crate::owner::controller_ref("v1", "ReplicationController", &rc.metadata);
        let ops = plan(&rs, &owner, &[]).unwrap();
        assert_eq!(ops.len(), 3);
        let Op::Create(pod) = &ops[0] else { panic!("{ops:?}") };
        let owners = pod.metadata.owner_references.as_ref().unwrap();
        assert_eq!((owners[0].kind.as_str(), owners[0].api_version.as_str()), ("ReplicationController", "v1"));
        assert!(pod.metadata.name.as_deref().unwrap().starts_with("nginx-"));
        let status = crate::replicaset::status(&rs, &[]);
        let written = rc.with_status(status).status.unwrap();
        assert_eq!((written.replicas, written.ready_replicas, written.observed_generation), (0, Some(0), Some(4)));
    }
}
