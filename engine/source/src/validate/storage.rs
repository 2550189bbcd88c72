//! What kube-apiserver refuses of claims, volumes and classes beyond their schema
//! (`ValidatePersistentVolumeClaim`, `ValidatePersistentVolume`, `ValidateStorageClass`), and
//! the warning for volume sources gitplane's nodes cannot mount: a claim needs access modes and a
//! storage request; a volume needs a capacity, access modes and exactly one source (a `local`
//! one pinned to nodes by nodeAffinity); a class names its provisioner.

use super::Problem;
use gitplane_api::{quantity, volumes};
use serde_json::Value;

const ACCESS_MODES: [&str; 4] = ["ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod"];
/// The volume sources of a PersistentVolume the nodes mount.
const MOUNTED_SOURCES: [&str; 2] = ["hostPath", "local"];
/// Every volume source a PersistentVolume spec may carry in Kubernetes.
const SOURCES: [&str; 22] = [
    "hostPath",
    "local",
    "nfs",
    "iscsi",
    "csi",
    "fc",
    "rbd",
    "cephfs",
    "cinder",
    "flexVolume",
    "flocker",
    "glusterfs",
    "awsElasticBlockStore",
    "gcePersistentDisk",
    "azureDisk",
    "azureFile",
    "vsphereVolume",
    "quobyte",
    "photonPersistentDisk",
    "portworxVolume",
    "scaleIO",
    "storageos",
];

pub(super) fn claim_problems(claim: &Value) -> Vec<Problem> {
    let spec = &claim["spec"];
    let mut problems = access_mode_problems(&spec["accessModes"], "/spec/accessModes");
    let request = &spec["resources"]["requests"]["storage"];
    problems.extend(storage_problem(request, "/spec/resources/requests/storage", "request"));
    problems
}

pub(super) fn volume_problems(volume: &Value) -> Vec<Problem> {
    let spec = &volume["spec"];
    let mut problems = access_mode_problems(&spec["accessModes"], "/spec/accessModes");
    problems.extend(storage_problem(&spec["capacity"]["storage"], "/spec/capacity/storage", "capacity"));
    let sources: Vec<&str> = SOURCES.into_iter().filter(|s| spec.get(*s).is_some_and(|v| !v.is_null())).collect();
    match sources.as_slice() {
        [] => {
            problems.push(Problem::at("/spec", "a volume needs a source: set hostPath or local (the path on the node)"))
        }
        [_] => {}
        many => problems.push(Problem::at(
            "/spec",
            format!("a volume has exactly one source, this one has {}: keep one", many.join(", ")),
        )),
    }
    for source in MOUNTED_SOURCES {
        if let Some(path) = spec[source]["path"].as_str()
            && !path.starts_with('/')
        {
            problems.push(Problem::at(format!("/spec/{source}/path"), format!("{path:?} must be an absolute path")));
        }
    }
    if spec["local"].is_object() && spec["nodeAffinity"]["required"].is_null() {
        problems.push(Problem::at(
            "/spec/nodeAffinity",
            "a local volume requires node affinity: set nodeAffinity.required to the node that holds the directory",
        ));
    }
    problems
}

/// A PersistentVolume whose source the nodes cannot mount: the API server accepts it and the PV
/// controller binds it; a Pod using it fails at mount, so the push says so.
pub(super) fn unmountable(volume: &Value) -> Option<Problem> {
    let source = volumes::unmountable_source(&volume["spec"])?;
    Some(Problem::at(
        format!("/spec/{source}"),
        format!(
            "gitplane's nodes cannot mount {}: a Pod using this volume will not start (FailedMount); use \
             hostPath or local (a directory on the node), or a persistentVolumeClaim of the default local-path \
             StorageClass",
            volumes::source_with_article(source)
        ),
    ))
}

pub(super) fn class_problems(class: &Value) -> Vec<Problem> {
    match class["provisioner"].as_str() {
        Some(p) if !p.is_empty() => Vec::new(),
        _ => vec![Problem::at(
            "/provisioner",
            "provisioner is required: gitplane provisions gitplane.io/local-path; kubernetes.io/no-provisioner is for \
             volumes written in Git",
        )],
    }
}

fn access_mode_problems(modes: &Value, at: &str) -> Vec<Problem> {
    let modes = modes.as_array().map(Vec::as_slice).unwrap_or_default();
    let mut problems = Vec::new();
    if modes.is_empty() {
        problems.push(Problem::at(at, "at least 1 access mode is required: ReadWriteOnce for one node's Pods"));
    }
    for (i, mode) in modes.iter().enumerate() {
        if !mode.as_str().is_some_and(|m| ACCESS_MODES.contains(&m)) {
            problems.push(Problem::at(
                format!("{at}/{i}"),
                format!("Unsupported value: {mode}: supported values: {}", quoted(&ACCESS_MODES)),
            ));
        }
    }
    if modes.iter().any(|m| m == "ReadWriteOncePod") && modes.len() > 1 {
        problems.push(Problem::at(at, "may not use ReadWriteOncePod with other access modes"));
    }
    problems
}

fn storage_problem(quantity: &Value, at: &str, what: &str) -> Option<Problem> {
    let text = quantity.as_str().map(str::to_owned).or_else(|| quantity.as_number().map(|n| n.to_string()));
    match text.as_deref().map(quantity::parse_milli) {
        None => Some(Problem::at(at, format!("a storage {what} is required, e.g. 1Gi"))),
        Some(Some(milli)) if milli > 0 => None,
        Some(_) => Some(Problem::at(at, format!("{quantity} is not a positive quantity: write e.g. 1Gi"))),
    }
}

fn quoted(values: &[&str]) -> String {
    values.iter().map(|v| format!("{v:?}")).collect::<Vec<_>>().join(", ")
}
