//! kube-scheduler's VolumeBinding plugin: its PreFilter ([`pre_filter`]: every claim of the Pod
//! exists, and each unbound one waits for its first consumer) and its Filter ([`PodVolumes`]: a
//! bound volume's node affinity admits the node; a delayed claim without a provisioner finds an
//! available volume there). What it reads is a snapshot of claims, volumes and classes
//! ([`Volumes`]); the loop writes the chosen node on each delayed claim
//! (`volume.kubernetes.io/selected-node`) with the binding, as its PreBind does. Pure.

use crate::framework::{CycleState, FilterPlugin, NodeInfo};
use crate::resources::Resources;
use gitplane_api::volumes::{self, NO_PROVISIONER};
use k8s_openapi::api::{
    core::v1::{PersistentVolume, PersistentVolumeClaim, Pod},
    storage::v1::StorageClass,
};
use std::collections::HashMap;

pub const UNBOUND_IMMEDIATE: &str = "pod has unbound immediate PersistentVolumeClaims";
pub const NODE_CONFLICT: &str = "node(s) had volume node affinity conflict";
pub const NO_VOLUME: &str = "node(s) didn't find available persistent volumes to bind";

/// The claims, volumes and classes scheduling reads.
#[derive(Default)]
pub struct Volumes {
    pub claims: HashMap<(String, String), PersistentVolumeClaim>,
    pub volumes: Vec<PersistentVolume>,
    pub classes: Vec<StorageClass>,
}

/// What a Pod's claims ask of its node.
#[derive(Default)]
pub struct PodVolumes {
    /// The volumes its bound claims hold: each must admit the node.
    bound: Vec<PersistentVolume>,
    /// Its unbound claims that wait for its node, with their class.
    pub delayed: Vec<(PersistentVolumeClaim, String)>,
    /// Of those, the ones no provisioner serves: a volume must be available on the node.
    static_only: Vec<(PersistentVolumeClaim, String)>,
    volumes: Vec<PersistentVolume>,
}

/// The PreFilter: the claims the Pod names must exist, not be being deleted, and be bound or
/// wait for their first consumer.
pub fn pre_filter(pod: &Pod, snapshot: &Volumes) -> Result<PodVolumes, String> {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    let mut out = PodVolumes::default();
    for claim_name in volumes::pod_claims(pod) {
        let Some(claim) = snapshot.claims.get(&(namespace.to_owned(), claim_name.to_owned())) else {
            return Err(format!("persistentvolumeclaim \"{claim_name}\" not found"));
        };
        if claim.metadata.deletion_timestamp.is_some() {
            return Err(format!("persistentvolumeclaim \"{claim_name}\" is being deleted"));
        }
        let volume_name = claim.spec.as_ref().and_then(|s| s.volume_name.as_deref()).filter(|v| !v.is_empty());
        if let Some(volume_name) = volume_name {
            match snapshot.volumes.iter().find(|v| v.metadata.name.as_deref() == Some(volume_name)) {
                Some(v) => out.bound.push(v.clone()),
                None => return Err(format!("persistentvolume \"{volume_name}\" not found")),
            }
            continue;
        }
        let class_name = match volumes::claim_class(claim) {
            Some(class) => class.to_owned(),
            None => volumes::default_class(&snapshot.classes).and_then(|c| c.metadata.name.clone()).unwrap_or_default(),
        };
        let class = snapshot.classes.iter().find(|c| c.metadata.name.as_deref() == Some(&class_name));
        if !volumes::waits_for_first_consumer(class) {
            return Err(UNBOUND_IMMEDIATE.to_owned());
        }
        if class.is_some_and(|c| c.provisioner == NO_PROVISIONER) {
            out.static_only.push((claim.clone(), class_name.clone()));
        }
        out.delayed.push((claim.clone(), class_name));
    }
    if !out.static_only.is_empty() {
        out.volumes = snapshot.volumes.clone();
    }
    Ok(out)
}

impl PodVolumes {
    pub fn is_empty(&self) -> bool {
        self.bound.is_empty() && self.delayed.is_empty()
    }
}

impl FilterPlugin for PodVolumes {
    fn name(&self) -> &'static str {
        "VolumeBinding"
    }

    fn filter(&self, _: &Pod, _: &Resources, node: &NodeInfo, _: &CycleState) -> Result<(), Vec<String>> {
        if self.bound.iter().any(|v| !volumes::node_affinity_admits(v, &node.node)) {
            return Err(vec![NODE_CONFLICT.into()]);
        }
        let found = |(claim, class): &(PersistentVolumeClaim, String)| {
            volumes::find_volume(claim, class, &self.volumes, Some(&node.node)).is_some()
        };
        if !self.static_only.iter().all(found) {
            return Err(vec![NO_VOLUME.into()]);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::{Cluster, Profile};
    use serde_json::{Value, json};

    fn claim(name: &str, spec: Value) -> PersistentVolumeClaim {
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": "default"}, "spec": spec})).unwrap()
    }

    fn node(name: &str) -> NodeInfo {
        NodeInfo::new(
            serde_json::from_value(json!({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
                "status": {"conditions": [{"type": "Ready", "status": "True"}],
                    "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}}}))
            .unwrap(),
        )
    }

    fn pinned(name: &str, node: &str, class: &str) -> PersistentVolume {
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"], "storageClassName": class, "local": {"path": "/mnt"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}}}}))
        .unwrap()
    }

    fn class(name: &str, provisioner: &str, mode: &str) -> StorageClass {
        serde_json::from_value(
            json!({"metadata": {"name": name}, "provisioner": provisioner, "volumeBindingMode": mode}),
        )
        .unwrap()
    }

    fn pod(claims: &[&str]) -> Pod {
        let volumes: Vec<Value> =
            claims.iter().map(|c| json!({"name": c, "persistentVolumeClaim": {"claimName": c}})).collect();
        serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "i"}], "volumes": volumes}}))
        .unwrap()
    }

    #[test]
    fn claims_decide_where_a_pod_may_go() {
        let rwo = |class: &str| {
            json!({"accessModes": ["ReadWriteOnce"], "storageClassName": class,
            "resources": {"requests": {"storage": "1Gi"}}})
        };
        let mut on_b = rwo("manual");
        on_b["volumeName"] = json!("pv-b");
        let snapshot = Volumes {
            claims: [
                claim("bound", on_b),
                claim("immediate", rwo("manual")),
                claim("delayed", rwo("local-path")),
                claim("local", rwo("local-disks")),
                claim("dangling", json!({"volumeName": "gone"})),
            ]
            .into_iter()
            .map(|c| (("default".to_owned(), c.metadata.name.clone().unwrap()), c))
            .collect(),
            volumes: vec![pinned("pv-b", "b", "manual"), pinned("disk-c", "c", "local-disks")],
            classes: vec![
                class("local-path", volumes::LOCAL_PATH_PROVISIONER, "WaitForFirstConsumer"),
                class("local-disks", NO_PROVISIONER, "WaitForFirstConsumer"),
            ],
        };
        let nodes = [node("a"), node("b"), node("c")];
        let cases: &[(&[&str], Result<&str, &str>)] = &[
            (&[], Ok("a")),
            (&["bound"], Ok("b")),
            (&["delayed"], Ok("a")),
            (&["local"], Ok("c")),
            (
                &["bound", "local"],
                Err(
                    "0/3 nodes are available: 1 node(s) didn't find available persistent volumes to bind, 2 node(s) had volume node affinity conflict.",
                ),
            ),
            (&["immediate"], Err("0/3 nodes are available: pod has unbound immediate PersistentVolumeClaims.")),
            (&["missing"], Err("0/3 nodes are available: persistentvolumeclaim \"missing\" not found.")),
            (&["dangling"], Err("0/3 nodes are available: persistentvolume \"gone\" not found.")),
        ];
        let profile = Profile::default();
        for (claims, want) in cases {
            let p = pod(claims);
            let got = match pre_filter(&p, &snapshot) {
                Err(reason) => Err(crate::framework::ScheduleError::PreFilter { total: nodes.len(), reason }),
                Ok(volumes) => {
                    let cluster = Cluster { nodes: &nodes, namespaces: &Default::default(), pods: &Default::default() };
                    profile.schedule_with(&p, cluster, &volumes)
                }
            };
            let got = got.map_err(|e| e.to_string());
            assert_eq!(got.as_deref().map_err(String::as_str), want.map(|n| n), "{claims:?}");
        }
        let delayed = pre_filter(&pod(&["delayed", "bound"]), &snapshot).unwrap();
        assert_eq!(delayed.delayed.len(), 1, "only the unbound claim gets the selected node");
    }
}
