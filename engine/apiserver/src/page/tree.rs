//! An Application's resource tree, as the page draws it: Deployment -> ReplicaSet -> Pods by
//! ownerReferences, Service -> EndpointSlices (by `kubernetes.io/service-name`) -> Pods (by the
//! endpoints' targetRef), DaemonSet, ReplicationController, StatefulSet and Job -> Pods and
//! CronJob -> Jobs -> Pods by ownerReferences, a PersistentVolumeClaim with its phase's health;
//! every other object the Application
//! applied is a leaf. Health comes from the source's own rules, so the page and the
//! Application's status agree.

use gitplane_api::health::{self, Health};
use serde_json::Value;
use std::collections::HashMap;

/// One object in the tree and what it owns or selects.
#[derive(Debug)]
pub struct Node {
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub health: Health,
    pub message: String,
    pub children: Vec<Node>,
}

/// The objects the tree is built from: everything of these kinds in the namespaces the
/// Application's objects live in.
#[derive(Default)]
pub struct Objects {
    /// What the Application applied (its annotation names it), any kind.
    pub applied: Vec<Value>,
    pub replica_sets: Vec<Value>,
    pub jobs: Vec<Value>,
    pub pods: Vec<Value>,
    pub endpoint_slices: Vec<Value>,
}

fn meta<'a>(object: &'a Value, field: &str) -> &'a str {
    object["metadata"][field].as_str().unwrap_or("")
}

fn owned_by<'a>(objects: &'a [Value], uid: &str) -> impl Iterator<Item = &'a Value> {
    objects.iter().filter(move |o| {
        !uid.is_empty()
            && o["metadata"]["ownerReferences"].as_array().is_some_and(|refs| refs.iter().any(|r| r["uid"] == uid))
    })
}

fn job_node(job: &Value, pods: &[Value]) -> Node {
    let (health, message) = health::job(job);
    node(job, "Job", health, message, owned_by(pods, meta(job, "uid")).map(pod_node).collect())
}

fn pod_node(pod: &Value) -> Node {
    let (health, message) = health::pod(pod);
    node(pod, "Pod", health, message, Vec::new())
}

fn node(object: &Value, kind: &str, health: Health, message: String, children: Vec<Node>) -> Node {
    Node {
        kind: kind.to_owned(),
        namespace: meta(object, "namespace").to_owned(),
        name: meta(object, "name").to_owned(),
        health,
        message,
        children,
    }
}

/// The tree of what the Application applied, in the order it applied it (by kind, then name).
pub fn build(objects: &Objects) -> Vec<Node> {
    let pods_by_name: HashMap<(&str, &str), &Value> =
        objects.pods.iter().map(|p| ((meta(p, "namespace"), meta(p, "name")), p)).collect();
    let mut roots: Vec<Node> = objects
        .applied
        .iter()
        .map(|object| {
            let kind = object["kind"].as_str().unwrap_or("");
            let uid = meta(object, "uid");
            match kind {
                "Deployment" => {
                    let replica_sets = owned_by(&objects.replica_sets, uid)
                        .map(|rs| {
                            let (health, message) = health::replica_set(rs);
                            let pods = owned_by(&objects.pods, meta(rs, "uid")).map(pod_node).collect();
                            node(rs, "ReplicaSet", health, message, pods)
                        })
                        .collect();
                    let (health, message) = health::deployment(object);
                    node(object, kind, health, message, replica_sets)
                }
                "StatefulSet" => {
                    let (health, message) = health::stateful_set(object);
                    node(object, kind, health, message, owned_by(&objects.pods, uid).map(pod_node).collect())
                }
                "DaemonSet" | "ReplicationController" => {
                    let (health, message) = match kind {
                        "DaemonSet" => health::daemon_set(object),
                        _ => (Health::Healthy, String::new()),
                    };
                    node(object, kind, health, message, owned_by(&objects.pods, uid).map(pod_node).collect())
                }
                "CronJob" => {
                    let jobs = owned_by(&objects.jobs, uid).map(|job| job_node(job, &objects.pods)).collect();
                    let (health, message) = health::cron_job(object);
                    node(object, kind, health, message, jobs)
                }
                "Job" => job_node(object, &objects.pods),
                "Pod" => pod_node(object),
                "PersistentVolumeClaim" => {
                    let (health, message) = health::persistent_volume_claim(object);
                    node(object, kind, health, message, Vec::new())
                }
                "Service" => {
                    let namespace = meta(object, "namespace");
                    let slices: Vec<Node> = objects
                        .endpoint_slices
                        .iter()
                        .filter(|s| {
                            meta(s, "namespace") == namespace
                                && s["metadata"]["labels"]["kubernetes.io/service-name"] == meta(object, "name")
                        })
                        .map(|slice| {
                            let endpoints = slice["endpoints"].as_array().map_or(&[][..], Vec::as_slice);
                            let ready = endpoints.iter().filter(|e| e["conditions"]["ready"] != false).count();
                            let pods = endpoints
                                .iter()
                                .filter(|e| e["targetRef"]["kind"] == "Pod")
                                .filter_map(|e| {
                                    let name = e["targetRef"]["name"].as_str()?;
                                    pods_by_name.get(&(namespace, name)).map(|p| pod_node(p))
                                })
                                .collect();
                            let health =
                                if ready > 0 || endpoints.is_empty() { Health::Healthy } else { Health::Progressing };
                            node(slice, "EndpointSlice", health, format!("{ready} of {} ready", endpoints.len()), pods)
                        })
                        .collect();
                    let selects = object["spec"]["selector"].as_object().is_some_and(|s| !s.is_empty());
                    let ready_somewhere = slices.iter().any(|s| s.children.iter().any(|p| p.health == Health::Healthy));
                    let (health, message) = if !selects || ready_somewhere {
                        (Health::Healthy, String::new())
                    } else {
                        (Health::Progressing, "no ready endpoints".to_owned())
                    };
                    node(object, kind, health, message, slices)
                }
                _ => node(object, kind, Health::Healthy, String::new(), Vec::new()),
            }
        })
        .collect();
    roots.sort_by(|a, b| (rank(&a.kind), &a.namespace, &a.name).cmp(&(rank(&b.kind), &b.namespace, &b.name)));
    roots
}

/// Workloads first, then Services, then the rest by kind.
fn rank(kind: &str) -> (u8, &str) {
    match kind {
        "Deployment" | "DaemonSet" | "ReplicationController" => (0, ""),
        "StatefulSet" => (1, ""),
        "CronJob" => (1, ""),
        "Job" => (2, ""),
        "Pod" => (3, ""),
        "Service" => (4, ""),
        other => (5, other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn owned(kind: &str, name: &str, uid: &str, owner: &str) -> Value {
        json!({"kind": kind, "metadata": {"namespace": "default", "name": name, "uid": uid,
            "ownerReferences": [{"uid": owner}]}})
    }

    fn ready_pod(name: &str, uid: &str, owner: &str) -> Value {
        let mut pod = owned("Pod", name, uid, owner);
        pod["status"] = json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]});
        pod
    }

    #[test]
    fn workloads_and_services_hold_their_pods() {
        let deployment = json!({"kind": "Deployment", "metadata": {"namespace": "default", "name": "web", "uid": "d1",
            "generation": 1}, "spec": {"replicas": 1},
            "status": {"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1, "availableReplicas": 1}});
        let service = json!({"kind": "Service", "metadata": {"namespace": "default", "name": "web", "uid": "s1"},
            "spec": {"selector": {"app": "web"}}});
        let job = json!({"kind": "Job", "metadata": {"namespace": "default", "name": "once", "uid": "j1"}});
        let cron_job = json!({"kind": "CronJob", "metadata": {"namespace": "default", "name": "nightly", "uid": "c1"}});
        let config = json!({"kind": "ConfigMap", "metadata": {"namespace": "default", "name": "settings"}});
        let daemons = json!({"kind": "DaemonSet", "metadata": {"namespace": "default", "name": "agent", "uid": "ds1"}});
        let stateful = json!({"kind": "StatefulSet", "metadata": {"namespace": "default", "name": "db", "uid": "t1"}});
        let slice = json!({"kind": "EndpointSlice", "metadata": {"namespace": "default", "name": "web-x",
            "labels": {"kubernetes.io/service-name": "web"}},
            "endpoints": [{"conditions": {"ready": true}, "targetRef": {"kind": "Pod", "name": "web-a-1"}}]});
        let objects = Objects {
            applied: vec![config, service, job, stateful, daemons, deployment, cron_job],
            replica_sets: vec![owned("ReplicaSet", "web-a", "r1", "d1"), owned("ReplicaSet", "other", "r2", "x")],
            pods: vec![
                ready_pod("web-a-1", "p1", "r1"),
                ready_pod("once-1", "p2", "j1"),
                ready_pod("agent-1", "p6", "ds1"),
                ready_pod("stray", "p3", "z"),
                ready_pod("db-0", "p4", "t1"),
                ready_pod("nightly-29000000-1", "p5", "j2"),
            ],
            jobs: vec![owned("Job", "nightly-29000000", "j2", "c1")],
            endpoint_slices: vec![slice],
        };
        let tree = build(&objects);
        type Shape<'a> = (&'a str, &'a str, Vec<(&'a str, Vec<&'a str>)>);
        let shape: Vec<Shape> = tree
            .iter()
            .map(|n| {
                let children = n
                    .children
                    .iter()
                    .map(|c| (c.name.as_str(), c.children.iter().map(|g| g.name.as_str()).collect()))
                    .collect();
                (n.kind.as_str(), n.name.as_str(), children)
            })
            .collect();
        assert_eq!(
            shape,
            vec![
                ("DaemonSet", "agent", vec![("agent-1", vec![])]),
                ("Deployment", "web", vec![("web-a", vec!["web-a-1"])]),
                ("StatefulSet", "db", vec![("db-0", vec![])]),
                ("CronJob", "nightly", vec![("nightly-29000000", vec!["nightly-29000000-1"])]),
                ("Job", "once", vec![("once-1", vec![])]),
                ("Service", "web", vec![("web-x", vec!["web-a-1"])]),
                ("ConfigMap", "settings", vec![]),
            ]
        );
        assert_eq!(tree[5].health, Health::Healthy);
        assert_eq!(tree[1].children[0].children[0].health, Health::Healthy);
    }
}
