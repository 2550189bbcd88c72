//! Persistent volumes as the PV controller and the scheduler's VolumeBinding plugin both read
//! them (`pkg/controller/volume/persistentvolume`, `component-helpers/storage/volume`): a
//! claim's class, the default class, whether a volume satisfies a claim, the best volume for a
//! claim, and whether a volume's node affinity admits a node. Pure.

use crate::{labels, quantity};
use k8s_openapi::api::{
    core::v1::{Node, NodeSelectorRequirement, PersistentVolume, PersistentVolumeClaim, Pod},
    storage::v1::StorageClass,
};

/// The provisioner of gitplane's built-in class: a directory on the node of the claim's first Pod.
pub const LOCAL_PATH_PROVISIONER: &str = "gitplane.io/local-path";
/// The built-in default class.
pub const LOCAL_PATH_CLASS: &str = "local-path";
/// The provisioner of classes whose volumes are written by hand (Git).
pub const NO_PROVISIONER: &str = "kubernetes.io/no-provisioner";
/// The Node annotation naming the directory where a node keeps the volumes local-path
/// provisions on it (local-path-provisioner's `nodePathMap`, reported by each node's agent).
pub const LOCAL_PATH_DIR: &str = "gitplane.io/local-path-dir";
/// The node the scheduler chose for a WaitForFirstConsumer claim's first Pod.
pub const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// Who is to provision a claim's volume.
pub const STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
/// Who provisioned a volume.
pub const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
/// The binding is complete (set on a claim once bound).
pub const BIND_COMPLETED: &str = "pv.kubernetes.io/bind-completed";
/// The controller, not the user, wrote the binding.
pub const BOUND_BY_CONTROLLER: &str = "pv.kubernetes.io/bound-by-controller";
pub const DEFAULT_CLASS: &str = "storageclass.kubernetes.io/is-default-class";
const BETA_DEFAULT_CLASS: &str = "storageclass.beta.kubernetes.io/is-default-class";
const BETA_STORAGE_CLASS: &str = "volume.beta.kubernetes.io/storage-class";
pub const WAIT_FOR_FIRST_CONSUMER: &str = "WaitForFirstConsumer";

/// The volume sources of Pods and PersistentVolumes whose plugins gitplane's nodes lack: cloud
/// disks, network file systems, CSI and FlexVolume drivers. The API server accepts them; the
/// kubelet fails to mount them when its node has no such plugin, and so does gitplane's.
pub const UNMOUNTABLE_SOURCES: [&str; 20] = [
    "awsElasticBlockStore",
    "azureDisk",
    "azureFile",
    "cephfs",
    "cinder",
    "csi",
    "fc",
    "flexVolume",
    "flocker",
    "gcePersistentDisk",
    "glusterfs",
    "iscsi",
    "nfs",
    "photonPersistentDisk",
    "portworxVolume",
    "quobyte",
    "rbd",
    "scaleIO",
    "storageos",
    "vsphereVolume",
];

/// The first of [`UNMOUNTABLE_SOURCES`] set in a Pod volume or a PersistentVolume spec (JSON).
pub fn unmountable_source(source: &serde_json::Value) -> Option<&'static str> {
    UNMOUNTABLE_SOURCES.into_iter().find(|s| source.get(*s).is_some_and(|v| !v.is_null()))
}

/// "an nfs volume", "a cinder volume": the article as the source's name is spoken (nfs, rbd and
/// fc letter by letter).
pub fn source_with_article(source: &str) -> String {
    let vowel = matches!(source, "nfs" | "rbd" | "fc") || source.starts_with(['a', 'e', 'i', 'o', 'A', 'E', 'I', 'O']);
    format!("{} {source} volume", if vowel { "an" } else { "a" })
}

fn annotation<'a>(meta: &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations.as_ref()?.get(key).map(String::as_str)
}

/// A claim's class: the beta annotation, then `storageClassName`; `None` when neither is set
/// (the default class applies), `Some("")` for "no class".
pub fn claim_class(claim: &PersistentVolumeClaim) -> Option<&str> {
    annotation(&claim.metadata, BETA_STORAGE_CLASS).or(claim.spec.as_ref()?.storage_class_name.as_deref())
}

/// A volume's class, `""` for none.
pub fn volume_class(volume: &PersistentVolume) -> &str {
    annotation(&volume.metadata, BETA_STORAGE_CLASS)
        .or(volume.spec.as_ref().and_then(|s| s.storage_class_name.as_deref()))
        .unwrap_or("")
}

pub fn is_default(class: &StorageClass) -> bool {
    annotation(&class.metadata, DEFAULT_CLASS) == Some("true")
        || annotation(&class.metadata, BETA_DEFAULT_CLASS) == Some("true")
}

/// The default class: the newest of those marked default, then by name (as the admission
/// plugin picks when several are).
pub fn default_class(classes: &[StorageClass]) -> Option<&StorageClass> {
    classes.iter().filter(|c| is_default(c)).max_by(|a, b| {
        let created = |c: &StorageClass| c.metadata.creation_timestamp.as_ref().map(|t| t.0);
        created(a).cmp(&created(b)).then_with(|| b.metadata.name.cmp(&a.metadata.name))
    })
}

/// Whether the claim waits for its first Pod to be scheduled before it binds.
pub fn waits_for_first_consumer(class: Option<&StorageClass>) -> bool {
    class.and_then(|c| c.volume_binding_mode.as_deref()) == Some(WAIT_FOR_FIRST_CONSUMER)
}

/// The storage a claim requests, in bytes.
pub fn requested(claim: &PersistentVolumeClaim) -> i128 {
    let requests = claim.spec.as_ref().and_then(|s| s.resources.as_ref()).and_then(|r| r.requests.as_ref());
    requests.and_then(|r| r.get("storage")).and_then(|q| quantity::parse_units(&q.0)).unwrap_or(0)
}

fn capacity(volume: &PersistentVolume) -> i128 {
    let capacity = volume.spec.as_ref().and_then(|s| s.capacity.as_ref());
    capacity.and_then(|c| c.get("storage")).and_then(|q| quantity::parse_units(&q.0)).unwrap_or(0)
}

fn same_claim(volume: &PersistentVolume, claim: &PersistentVolumeClaim) -> Option<bool> {
    let r = volume.spec.as_ref()?.claim_ref.as_ref()?;
    let uid_matches = r.uid.as_deref().is_none_or(|u| u.is_empty() || Some(u) == claim.metadata.uid.as_deref());
    Some(r.name == claim.metadata.name && r.namespace == claim.metadata.namespace && uid_matches)
}

/// Why `volume` cannot hold `claim`, or `None` when it can: its class, access modes, volume
/// mode, capacity and the claim's selector; a volume bound (or pre-bound) to another claim
/// never can.
pub fn mismatch(claim: &PersistentVolumeClaim, class: &str, volume: &PersistentVolume) -> Option<&'static str> {
    let (Some(spec), Some(vspec)) = (claim.spec.as_ref(), volume.spec.as_ref()) else { return Some("no spec") };
    if same_claim(volume, claim) == Some(false) {
        return Some("bound to another claim");
    }
    if volume.metadata.deletion_timestamp.is_some() {
        return Some("being deleted");
    }
    if volume_class(volume) != class {
        return Some("another storage class");
    }
    let modes = vspec.access_modes.as_deref().unwrap_or_default();
    if !spec.access_modes.iter().flatten().all(|m| modes.contains(m)) {
        return Some("lacks an access mode");
    }
    let mode = |m: Option<&String>| m.map_or("Filesystem", String::as_str).to_owned();
    if mode(spec.volume_mode.as_ref()) != mode(vspec.volume_mode.as_ref()) {
        return Some("another volume mode");
    }
    if capacity(volume) < requested(claim) {
        return Some("too small");
    }
    let labels = volume.metadata.labels.clone().unwrap_or_default();
    if spec.selector.as_ref().is_some_and(|s| !labels::matches(s, &labels)) {
        return Some("not selected");
    }
    None
}

/// The volume `claim` binds to: one pre-bound to it (its `claimRef`) if any, else the smallest
/// available volume that satisfies it (and admits `node`, when the claim waits for its first
/// Pod's node). A claim that names its volume (`volumeName`) gets only that one.
pub fn find_volume<'a>(
    claim: &PersistentVolumeClaim,
    class: &str,
    volumes: impl IntoIterator<Item = &'a PersistentVolume>,
    node: Option<&Node>,
) -> Option<&'a PersistentVolume> {
    let named = claim.spec.as_ref().and_then(|s| s.volume_name.as_deref()).filter(|n| !n.is_empty());
    let fits = |v: &&PersistentVolume| {
        mismatch(claim, class, v).is_none()
            && node.is_none_or(|n| node_affinity_admits(v, n))
            && named.is_none_or(|n| v.metadata.name.as_deref() == Some(n))
    };
    let candidates: Vec<&PersistentVolume> = volumes.into_iter().filter(fits).collect();
    if let Some(pre_bound) = candidates.iter().find(|v| same_claim(v, claim) == Some(true)) {
        return Some(pre_bound);
    }
    let available = |v: &&&PersistentVolume| {
        v.spec.as_ref().is_some_and(|s| s.claim_ref.is_none())
            && v.status.as_ref().and_then(|s| s.phase.as_deref()).is_none_or(|p| p == "Available" || p == "Pending")
    };
    candidates.iter().filter(available).min_by_key(|v| (capacity(v), v.metadata.name.clone())).copied()
}

/// Whether the volume's `nodeAffinity.required` admits `node` (no affinity admits every node).
pub fn node_affinity_admits(volume: &PersistentVolume, node: &Node) -> bool {
    let Some(required) = volume.spec.as_ref().and_then(|s| s.node_affinity.as_ref()).and_then(|a| a.required.as_ref())
    else {
        return true;
    };
    let labels = node.metadata.labels.clone().unwrap_or_default();
    let name = node.metadata.name.clone().unwrap_or_default();
    required.node_selector_terms.iter().any(|term| {
        let expressions = term.match_expressions.iter().flatten().all(|r| requirement(r, labels.get(&r.key)));
        let fields =
            term.match_fields.iter().flatten().all(|r| requirement(r, (r.key == "metadata.name").then_some(&name)));
        let empty = term.match_expressions.as_ref().is_none_or(Vec::is_empty)
            && term.match_fields.as_ref().is_none_or(Vec::is_empty);
        !empty && expressions && fields
    })
}

fn requirement(r: &NodeSelectorRequirement, value: Option<&String>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let number = |v: &str| v.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => match (value.and_then(|v| number(v)), values.first().and_then(|v| number(v))) {
            (Some(have), Some(bound)) if r.operator == "Gt" => have > bound,
            (Some(have), Some(bound)) => have < bound,
            _ => false,
        },
        _ => false,
    }
}

/// The claims a Pod's volumes name, in order.
pub fn pod_claims(pod: &Pod) -> impl Iterator<Item = &str> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .filter_map(|v| v.persistent_volume_claim.as_ref().map(|c| c.claim_name.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn claim(spec: serde_json::Value) -> PersistentVolumeClaim {
        serde_json::from_value(json!({"metadata": {"name": "data", "namespace": "default", "uid": "c1"}, "spec": spec}))
            .unwrap()
    }

    fn volume(name: &str, spec: serde_json::Value, labels: serde_json::Value) -> PersistentVolume {
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}, "spec": spec})).unwrap()
    }

    fn node(name: &str, labels: serde_json::Value) -> Node {
        serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap()
    }

    #[test]
    fn sources_the_nodes_cannot_mount_are_named() {
        let cases = [
            (json!({"name": "d", "nfs": {"server": "s", "path": "/x"}}), Some("nfs"), "an nfs volume"),
            (json!({"capacity": {"storage": "1Gi"}, "rbd": {"image": "i"}}), Some("rbd"), "an rbd volume"),
            (json!({"name": "d", "awsElasticBlockStore": {"volumeID": "v"}}), Some("awsElasticBlockStore"), ""),
            (json!({"name": "d", "csi": {"driver": "x"}}), Some("csi"), "a csi volume"),
            (json!({"name": "d", "cinder": {"volumeID": "v"}}), Some("cinder"), "a cinder volume"),
            (json!({"name": "d", "iscsi": {}}), Some("iscsi"), "an iscsi volume"),
            (json!({"name": "d", "fc": {}}), Some("fc"), "an fc volume"),
            (json!({"name": "d", "hostPath": {"path": "/x"}}), None, ""),
            (json!({"name": "d", "nfs": null, "emptyDir": {}}), None, ""),
        ];
        for (source, name, spoken) in cases {
            assert_eq!(unmountable_source(&source), name, "{source}");
            if !spoken.is_empty() {
                assert_eq!(source_with_article(name.unwrap_or_default()), spoken);
            }
        }
    }

    #[test]
    fn a_claim_binds_the_smallest_volume_that_satisfies_it() {
        let want = json!({"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "2Gi"}},
            "storageClassName": "manual", "selector": {"matchLabels": {"tier": "db"}}});
        let pv = |size: &str, modes: serde_json::Value, class: &str| {
            json!({"capacity": {"storage": size}, "accessModes": modes, "storageClassName": class,
                "hostPath": {"path": "/mnt"}})
        };
        let db = json!({"tier": "db"});
        let cases: Vec<(&str, PersistentVolume, Option<&str>)> = vec![
            ("fits", volume("a", pv("2Gi", json!(["ReadWriteOnce"]), "manual"), db.clone()), None),
            ("too small", volume("b", pv("1Gi", json!(["ReadWriteOnce"]), "manual"), db.clone()), Some("too small")),
            (
                "modes",
                volume("c", pv("5Gi", json!(["ReadOnlyMany"]), "manual"), db.clone()),
                Some("lacks an access mode"),
            ),
            (
                "class",
                volume("d", pv("5Gi", json!(["ReadWriteOnce"]), "fast"), db.clone()),
                Some("another storage class"),
            ),
            ("selector", volume("e", pv("5Gi", json!(["ReadWriteOnce"]), "manual"), json!({})), Some("not selected")),
            (
                "taken",
                volume(
                    "f",
                    json!({"capacity": {"storage": "5Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "manual",
                        "claimRef": {"namespace": "default", "name": "other"}}),
                    db.clone(),
                ),
                Some("bound to another claim"),
            ),
        ];
        let c = claim(want.clone());
        for (name, v, expected) in &cases {
            assert_eq!(mismatch(&c, "manual", v), *expected, "{name}");
        }
        let bigger = volume("g", pv("10Gi", json!(["ReadWriteOnce", "ReadWriteMany"]), "manual"), db.clone());
        let all: Vec<&PersistentVolume> = cases.iter().map(|(_, v, _)| v).chain([&bigger]).collect();
        let found = |c: &PersistentVolumeClaim| find_volume(c, "manual", all.iter().copied(), None);
        assert_eq!(found(&c).and_then(|v| v.metadata.name.as_deref()), Some("a"), "the smallest");
        let mut named = want.clone();
        named["volumeName"] = json!("g");
        assert_eq!(found(&claim(named)).and_then(|v| v.metadata.name.as_deref()), Some("g"), "volumeName");
        let mut pre_bound = bigger.clone();
        pre_bound.spec.as_mut().unwrap().claim_ref =
            Some(serde_json::from_value(json!({"namespace": "default", "name": "data"})).unwrap());
        let with_pre_bound = [&cases[0].1, &pre_bound];
        assert_eq!(
            find_volume(&c, "manual", with_pre_bound, None).and_then(|v| v.metadata.name.as_deref()),
            Some("g"),
            "a volume pre-bound to the claim wins"
        );
    }

    #[test]
    fn node_affinity_admits_the_nodes_it_names() {
        let pinned = |term: serde_json::Value| {
            volume("v", json!({"nodeAffinity": {"required": {"nodeSelectorTerms": [term]}}}), json!({}))
        };
        let n1 = node("n1", json!({"kubernetes.io/hostname": "n1", "disk": "ssd", "gen": "3"}));
        let cases = [
            (
                json!({"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}]}),
                true,
            ),
            (
                json!({"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["n2"]}]}),
                false,
            ),
            (json!({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}), true),
            (json!({"matchExpressions": [{"key": "disk", "operator": "NotIn", "values": ["hdd"]}]}), true),
            (json!({"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}), false),
            (json!({"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}), true),
            (json!({"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["2"]}]}), true),
            (json!({"matchExpressions": [{"key": "gen", "operator": "Lt", "values": ["2"]}]}), false),
            (json!({}), false),
        ];
        for (term, admits) in cases {
            assert_eq!(node_affinity_admits(&pinned(term.clone()), &n1), admits, "{term}");
        }
        assert!(node_affinity_admits(&volume("v", json!({}), json!({})), &n1), "no affinity admits every node");
    }

    #[test]
    fn classes_of_claims_and_the_default() {
        let class = |name: &str, default: bool, created: &str| -> StorageClass {
            serde_json::from_value(json!({"metadata": {"name": name, "creationTimestamp": created,
                "annotations": {DEFAULT_CLASS: default.to_string()}}, "provisioner": "p"}))
            .unwrap()
        };
        let classes = [
            class("old", true, "2026-01-01T00:00:00Z"),
            class("new", true, "2026-02-01T00:00:00Z"),
            class("plain", false, "2026-03-01T00:00:00Z"),
        ];
        assert_eq!(default_class(&classes).and_then(|c| c.metadata.name.as_deref()), Some("new"));
        assert_eq!(claim_class(&claim(json!({}))), None);
        assert_eq!(claim_class(&claim(json!({"storageClassName": ""}))), Some(""));
        let mut beta = claim(json!({"storageClassName": "b"}));
        beta.metadata.annotations = Some([(BETA_STORAGE_CLASS.to_owned(), "a".to_owned())].into());
        assert_eq!(claim_class(&beta), Some("a"));
    }
}
