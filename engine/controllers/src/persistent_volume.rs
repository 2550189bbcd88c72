//! The PersistentVolume controller (kube-controller-manager's `persistentvolume-binder`) with
//! gitplane's local-path provisioner in it: binds each claim to a matching volume (pre-bound,
//! else the smallest that fits), provisions a `hostPath` volume under the selected node's
//! local-path directory once the scheduler picked the node of a WaitForFirstConsumer claim's
//! first Pod, keeps both phases as upstream does (Pending, Available, Bound, Released, Lost,
//! Failed) and reclaims a released volume: `Delete` removes a provisioned volume (its node's
//! agent then removes the directory), `Retain` keeps it Released. Decide in [`plan_claim`] and
//! [`plan_volume`], pure; [`PersistentVolumeController::reconcile`] commits one transaction.

use crate::{Action, Context, ReconcileError, Reconciler};
use gitplane_api::{
    events::{NORMAL, WARNING},
    object::{from_value, kind_of, to_value},
    volumes::{self, LOCAL_PATH_DIR, LOCAL_PATH_PROVISIONER, NO_PROVISIONER},
};
use gitplane_store::{Event, ObjectKey, Op, informer::Cache};
use k8s_openapi::api::{
    core::v1::{Node, ObjectReference, PersistentVolume, PersistentVolumeClaim},
    storage::v1::StorageClass,
};
use serde_json::{Value, json};

const COMPONENT: &str = "persistentvolume-controller";

pub struct PersistentVolumeController;

/// What a claim needs now.
#[derive(Debug, PartialEq)]
pub enum ClaimPlan {
    /// Bound as it should be, or gone.
    Nothing,
    /// A claim that names no class gets the default one (the retroactive assignment).
    AssignDefaultClass(String),
    /// Bind to this existing volume.
    Bind(Box<PersistentVolume>),
    /// Create this volume, bound to the claim.
    Provision(Box<PersistentVolume>),
    /// The bound volume is gone.
    Lost,
    /// Stay Pending, telling why in an Event of this type and reason.
    Wait { type_: &'static str, reason: &'static str, message: String },
}

fn name(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> &str {
    meta.name.as_deref().unwrap_or("")
}

fn phase_of_claim(claim: &PersistentVolumeClaim) -> &str {
    claim.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending")
}

fn phase_of_volume(volume: &PersistentVolume) -> &str {
    volume.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending")
}

fn claim_ref_matches(volume: &PersistentVolume, claim: &PersistentVolumeClaim) -> bool {
    volume.spec.as_ref().and_then(|s| s.claim_ref.as_ref()).is_some_and(|r| {
        r.name == claim.metadata.name
            && r.namespace == claim.metadata.namespace
            && r.uid.as_deref().is_none_or(|u| u.is_empty() || Some(u) == claim.metadata.uid.as_deref())
    })
}

/// The plan for `claim` given the cluster's volumes, classes and nodes.
pub fn plan_claim(
    claim: &PersistentVolumeClaim,
    volumes: &[PersistentVolume],
    classes: &[StorageClass],
    nodes: &[Node],
) -> ClaimPlan {
    if claim.metadata.deletion_timestamp.is_some() {
        return ClaimPlan::Nothing;
    }
    let Some(class_name) = volumes::claim_class(claim) else {
        return match volumes::default_class(classes) {
            Some(default) => ClaimPlan::AssignDefaultClass(name(&default.metadata).to_owned()),
            None => find_static(claim, "", volumes, None),
        };
    };
    let volume_name = claim.spec.as_ref().and_then(|s| s.volume_name.as_deref()).filter(|n| !n.is_empty());
    if let Some(volume_name) = volume_name {
        return match volumes.iter().find(|v| name(&v.metadata) == volume_name) {
            None if phase_of_claim(claim) == "Bound" => ClaimPlan::Lost,
            None => ClaimPlan::Wait {
                type_: NORMAL,
                reason: "FailedBinding",
                message: format!("volume \"{volume_name}\" not found"),
            },
            Some(v) if claim_ref_matches(v, claim) || v.spec.as_ref().is_some_and(|s| s.claim_ref.is_none()) => {
                let bound =
                    phase_of_claim(claim) == "Bound" && phase_of_volume(v) == "Bound" && claim_ref_matches(v, claim);
                if bound { ClaimPlan::Nothing } else { ClaimPlan::Bind(Box::new(v.clone())) }
            }
            Some(_) => ClaimPlan::Wait {
                type_: WARNING,
                reason: "FailedBinding",
                message: format!("volume \"{volume_name}\" already bound to a different claim."),
            },
        };
    }
    let class = classes.iter().find(|c| name(&c.metadata) == class_name);
    let waits = volumes::waits_for_first_consumer(class);
    let selected = claim.metadata.annotations.as_ref().and_then(|a| a.get(volumes::SELECTED_NODE));
    let node = selected.and_then(|s| nodes.iter().find(|n| name(&n.metadata) == s));
    if waits && node.is_none() {
        if let Some(selected) = selected {
            return ClaimPlan::Wait {
                type_: WARNING,
                reason: "ProvisioningFailed",
                message: format!("the selected node \"{selected}\" is not a node of the cluster"),
            };
        }
        return ClaimPlan::Wait {
            type_: NORMAL,
            reason: "WaitForFirstConsumer",
            message: "waiting for first consumer to be created before binding".into(),
        };
    }
    if let ClaimPlan::Bind(v) = find_static(claim, class_name, volumes, node) {
        return ClaimPlan::Bind(v);
    }
    let Some(class) = class else {
        if class_name.is_empty() {
            return find_static(claim, class_name, volumes, node);
        }
        return ClaimPlan::Wait {
            type_: WARNING,
            reason: "ProvisioningFailed",
            message: format!("storageclass.storage.k8s.io \"{class_name}\" not found"),
        };
    };
    match class.provisioner.as_str() {
        LOCAL_PATH_PROVISIONER => match node {
            Some(node) => match provisioned_volume(claim, class, node) {
                Ok(volume) => ClaimPlan::Provision(Box::new(volume)),
                Err(message) => ClaimPlan::Wait { type_: WARNING, reason: "ProvisioningFailed", message },
            },
            None => ClaimPlan::Wait {
                type_: WARNING,
                reason: "ProvisioningFailed",
                message: format!(
                    "{LOCAL_PATH_PROVISIONER} makes a directory on the node of the claim's first Pod: \
                     set volumeBindingMode: WaitForFirstConsumer on StorageClass \"{class_name}\""
                ),
            },
        },
        NO_PROVISIONER => find_static(claim, class_name, volumes, node),
        other => ClaimPlan::Wait {
            type_: NORMAL,
            reason: "ExternalProvisioning",
            message: format!(
                "Waiting for a volume to be created either by the external provisioner '{other}' or manually by \
                 the system administrator. If volume creation is delayed, please verify that the provisioner is \
                 running and correctly registered."
            ),
        },
    }
}

fn find_static(
    claim: &PersistentVolumeClaim,
    class: &str,
    volumes: &[PersistentVolume],
    node: Option<&Node>,
) -> ClaimPlan {
    match volumes::find_volume(claim, class, volumes, node) {
        Some(v) => ClaimPlan::Bind(Box::new(v.clone())),
        None if class.is_empty() => ClaimPlan::Wait {
            type_: NORMAL,
            reason: "FailedBinding",
            message: "no persistent volumes available for this claim and no storage class is set".into(),
        },
        None => ClaimPlan::Wait {
            type_: NORMAL,
            reason: "FailedBinding",
            message: format!("no persistent volumes available for this claim and storage class \"{class}\""),
        },
    }
}

/// The volume local-path provisions for `claim` on `node`: a `hostPath` directory under the
/// node's local-path directory (`pvc-<uid>_<namespace>_<name>`, as local-path-provisioner names
/// it), pinned to the node, with the requested capacity and the class's reclaim policy.
pub fn provisioned_volume(
    claim: &PersistentVolumeClaim,
    class: &StorageClass,
    node: &Node,
) -> Result<PersistentVolume, String> {
    let node_name = name(&node.metadata);
    let Some(dir) = node.metadata.annotations.as_ref().and_then(|a| a.get(LOCAL_PATH_DIR)) else {
        return Err(format!("node \"{node_name}\" does not report its local-path directory ({LOCAL_PATH_DIR})"));
    };
    let uid = claim.metadata.uid.as_deref().unwrap_or_default();
    let (namespace, claim_name) = (claim.metadata.namespace.as_deref().unwrap_or("default"), name(&claim.metadata));
    let spec = claim.spec.clone().unwrap_or_default();
    let request = spec.resources.as_ref().and_then(|r| r.requests.as_ref()).and_then(|r| r.get("storage")).cloned();
    let value = json!({
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": format!("pvc-{uid}"),
            "annotations": {volumes::PROVISIONED_BY: LOCAL_PATH_PROVISIONER},
        },
        "spec": {
            "capacity": {"storage": request},
            "accessModes": spec.access_modes,
            "persistentVolumeReclaimPolicy": class.reclaim_policy.as_deref().unwrap_or("Delete"),
            "storageClassName": name(&class.metadata),
            "volumeMode": spec.volume_mode.as_deref().unwrap_or("Filesystem"),
            "claimRef": claim_reference(claim),
            "hostPath": {"path": format!("{}/pvc-{uid}_{namespace}_{claim_name}", dir.trim_end_matches('/')),
                         "type": "DirectoryOrCreate"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [node_name]}]}]}},
        },
        "status": {"phase": "Bound"},
    });
    serde_json::from_value(value).map_err(|e| format!("building the volume: {e}"))
}

fn claim_reference(claim: &PersistentVolumeClaim) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("PersistentVolumeClaim".into()),
        namespace: claim.metadata.namespace.clone(),
        name: claim.metadata.name.clone(),
        uid: claim.metadata.uid.clone(),
        resource_version: claim.metadata.resource_version.clone(),
        ..Default::default()
    }
}

/// The ops that bind `claim` and `volume` both ways (`created`: the volume is new and made
/// in the same transaction), each write compare-and-swap on what was read.
pub fn bind_ops(claim: &PersistentVolumeClaim, volume: &PersistentVolume, created: bool) -> Vec<Op> {
    let volume_name = name(&volume.metadata).to_owned();
    let mut ops = Vec::new();
    if created {
        ops.push(Op::Create(to_value(volume)));
    } else {
        let mut bound = volume.clone();
        if !claim_ref_matches(volume, claim)
            || volume.spec.as_ref().and_then(|s| s.claim_ref.as_ref()).is_some_and(|r| r.uid.is_none())
        {
            bound.spec.get_or_insert_with(Default::default).claim_ref = Some(claim_reference(claim));
            annotate(&mut bound.metadata, volumes::BOUND_BY_CONTROLLER);
            ops.push(Op::Update(to_value(&bound)));
            bound.metadata.resource_version = None; // ordered after the write above
        }
        if phase_of_volume(volume) != "Bound" {
            bound.status.get_or_insert_with(Default::default).phase = Some("Bound".into());
            ops.push(Op::UpdateStatus(to_value(&bound)));
        }
    }
    let mut bound = claim.clone();
    let spec = bound.spec.get_or_insert_with(Default::default);
    if spec.volume_name.as_deref() != Some(&volume_name) {
        spec.volume_name = Some(volume_name);
        annotate(&mut bound.metadata, volumes::BOUND_BY_CONTROLLER);
    }
    if created {
        let annotations = bound.metadata.annotations.get_or_insert_with(Default::default);
        annotations.insert(volumes::STORAGE_PROVISIONER.into(), LOCAL_PATH_PROVISIONER.into());
    }
    annotate(&mut bound.metadata, volumes::BIND_COMPLETED);
    if bound.spec != claim.spec || bound.metadata.annotations != claim.metadata.annotations {
        ops.push(Op::Update(to_value(&bound)));
        bound.metadata.resource_version = None;
    }
    let vspec = volume.spec.clone().unwrap_or_default();
    let status = bound.status.get_or_insert_with(Default::default);
    status.phase = Some("Bound".into());
    status.access_modes = vspec.access_modes;
    status.capacity = vspec.capacity;
    ops.push(Op::UpdateStatus(to_value(&bound)));
    ops
}

fn annotate(meta: &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta, key: &str) {
    meta.annotations.get_or_insert_with(Default::default).insert(key.into(), "yes".into());
}

/// What a volume needs now.
#[derive(Debug, PartialEq)]
pub enum VolumePlan {
    Nothing,
    /// Set this phase (and reason, for Failed).
    Phase(&'static str, Option<String>),
    /// Its claim is gone and its policy is Delete: remove it.
    Delete,
}

/// The plan for `volume`, given the claim its `claimRef` names (if it exists).
pub fn plan_volume(volume: &PersistentVolume, claim: Option<&PersistentVolumeClaim>) -> VolumePlan {
    let Some(spec) = volume.spec.as_ref() else { return VolumePlan::Nothing };
    if volume.metadata.deletion_timestamp.is_some() {
        return VolumePlan::Nothing;
    }
    let phase = phase_of_volume(volume);
    let wanted = match (&spec.claim_ref, claim) {
        (None, _) => "Available",
        (Some(_), Some(claim)) if claim_ref_matches(volume, claim) => {
            let claims_it =
                claim.spec.as_ref().and_then(|s| s.volume_name.as_deref()) == volume.metadata.name.as_deref();
            // Pre-bound and waiting for the claim to take it: still Available.
            if claims_it { "Bound" } else { "Available" }
        }
        // Pre-bound by name to a claim not made yet.
        (Some(r), None) if r.uid.as_deref().is_none_or(str::is_empty) => "Available",
        (Some(_), _) => "Released",
    };
    if wanted != "Released" {
        return if phase == wanted { VolumePlan::Nothing } else { VolumePlan::Phase(wanted, None) };
    }
    let provisioned = volume.metadata.annotations.as_ref().and_then(|a| a.get(volumes::PROVISIONED_BY));
    match spec.persistent_volume_reclaim_policy.as_deref() {
        Some("Delete") if provisioned.is_some_and(|p| p == LOCAL_PATH_PROVISIONER) => VolumePlan::Delete,
        Some("Delete") if phase != "Failed" => VolumePlan::Phase(
            "Failed",
            Some(format!(
                "no deleter for volume \"{}\": only volumes {LOCAL_PATH_PROVISIONER} provisioned are deleted; \
                 remove it from Git",
                name(&volume.metadata)
            )),
        ),
        Some("Delete") => VolumePlan::Nothing,
        _ if phase == "Released" => VolumePlan::Nothing,
        _ => VolumePlan::Phase("Released", None),
    }
}

#[async_trait::async_trait]
impl Reconciler for PersistentVolumeController {
    fn name(&self) -> &'static str {
        "persistentvolume-binder"
    }

    /// Claims bind and provision on several workers so a hundred claims at once share the
    /// store's commits. Two claims racing for one volume cannot both have it: every bind writes
    /// the volume compare-and-swap on the resourceVersion it read, and the loser retries.
    fn workers(&self) -> usize {
        crate::runtime::CONCURRENT_SYNCS
    }

    fn keys_for(&self, event: &Event, cache: &Cache) -> Vec<ObjectKey> {
        let kind = &event.key.kind;
        let object = &event.object;
        if *kind == kind_of::<PersistentVolumeClaim>() {
            let mut keys = vec![event.key.clone()];
            if let Some(volume) = object["spec"]["volumeName"].as_str().filter(|v| !v.is_empty()) {
                keys.push(ObjectKey::of::<PersistentVolume>("", volume));
            }
            return keys;
        }
        if *kind == kind_of::<PersistentVolume>() {
            let mut keys = vec![event.key.clone()];
            let claim = &object["spec"]["claimRef"];
            if let (Some(ns), Some(name)) = (claim["namespace"].as_str(), claim["name"].as_str()) {
                keys.push(ObjectKey::of::<PersistentVolumeClaim>(ns, name));
            }
            // A volume that names no claim may satisfy a waiting one. A volume with a claim is
            // that claim's alone: waking every pending claim for it (a provisioning of each of
            // a hundred claims) made the binder's work quadratic.
            if claim.is_null() {
                keys.extend(pending_claims(cache));
            }
            return keys;
        }
        if *kind == kind_of::<StorageClass>()
            || *kind == kind_of::<Node>() && event.event_type != gitplane_store::EventType::Modified
        {
            return pending_claims(cache);
        }
        Vec::new()
    }

    fn all_keys(&self, cache: &Cache) -> Vec<ObjectKey> {
        let mut keys = crate::runtime::all_of::<PersistentVolumeClaim>(cache);
        keys.extend(crate::runtime::all_of::<PersistentVolume>(cache));
        keys
    }

    async fn reconcile(&self, key: &ObjectKey, ctx: &Context) -> Result<Action, ReconcileError> {
        let invalid = |e: gitplane_api::object::ObjectError| ReconcileError::Invalid(e.to_string());
        let Some(value) = ctx.cache().get(key) else { return Ok(Action::await_change()) };
        if key.kind == kind_of::<PersistentVolume>() {
            let volume: PersistentVolume = from_value(Value::clone(&value)).map_err(invalid)?;
            let claim = volume.spec.as_ref().and_then(|s| s.claim_ref.as_ref()).and_then(|r| {
                let key = ObjectKey::of::<PersistentVolumeClaim>(r.namespace.as_deref()?, r.name.as_deref()?);
                let claim = ctx.cache().get(&key)?;
                from_value::<PersistentVolumeClaim>(Value::clone(&claim)).ok()
            });
            return reconcile_volume(ctx, volume, claim.as_ref()).await;
        }
        let claim: PersistentVolumeClaim = from_value(Value::clone(&value)).map_err(invalid)?;
        let volumes: Vec<PersistentVolume> = ctx.cache().list_typed(None);
        let classes: Vec<StorageClass> = ctx.cache().list_typed(None);
        let nodes: Vec<Node> = ctx.cache().list_typed(None);
        let plan = plan_claim(&claim, &volumes, &classes, &nodes);
        let claim_name = format!("{}/{}", key.namespace, key.name);
        match plan {
            ClaimPlan::Nothing => {}
            ClaimPlan::AssignDefaultClass(class) => {
                let mut assigned = claim;
                assigned.spec.get_or_insert_with(Default::default).storage_class_name = Some(class);
                ctx.commit(vec![Op::Update(to_value(&assigned))]).await?;
            }
            ClaimPlan::Bind(volume) => {
                tracing::info!(claim = %claim_name, volume = name(&volume.metadata), "binding");
                ctx.commit(bind_ops(&claim, &volume, false)).await?;
            }
            ClaimPlan::Provision(volume) => {
                let message = format!("Successfully provisioned volume {}", name(&volume.metadata));
                tracing::info!(claim = %claim_name, volume = name(&volume.metadata), "provisioned");
                ctx.commit(bind_ops(&claim, &volume, true)).await?;
                ctx.event(COMPONENT, &claim, NORMAL, "ProvisioningSucceeded", &message);
            }
            ClaimPlan::Lost => {
                let mut lost = claim;
                lost.status.get_or_insert_with(Default::default).phase = Some("Lost".into());
                let message = "Bound claim has lost its PersistentVolume. Data on the volume is lost!";
                ctx.event(COMPONENT, &lost, WARNING, "ClaimLost", message);
                ctx.update_status(&lost).await?;
            }
            ClaimPlan::Wait { type_, reason, message } => {
                ctx.event(COMPONENT, &claim, type_, reason, &message);
                if phase_of_claim(&claim) != "Pending" || claim.status.as_ref().and_then(|s| s.phase.as_ref()).is_none()
                {
                    let mut pending = claim;
                    pending.status.get_or_insert_with(Default::default).phase = Some("Pending".into());
                    ctx.update_status(&pending).await?;
                }
            }
        }
        Ok(Action::await_change())
    }
}

async fn reconcile_volume(
    ctx: &Context,
    volume: PersistentVolume,
    claim: Option<&PersistentVolumeClaim>,
) -> Result<Action, ReconcileError> {
    match plan_volume(&volume, claim) {
        VolumePlan::Nothing => {}
        VolumePlan::Phase(phase, reason) => {
            if let Some(message) = &reason {
                ctx.event(COMPONENT, &volume, WARNING, "VolumeFailedDelete", message);
            }
            let mut updated = volume;
            let status = updated.status.get_or_insert_with(Default::default);
            status.phase = Some(phase.into());
            status.message = reason;
            ctx.update_status(&updated).await?;
        }
        VolumePlan::Delete => {
            tracing::info!(volume = name(&volume.metadata), "deleting the released volume");
            let key = ObjectKey::of::<PersistentVolume>("", name(&volume.metadata));
            let revision = gitplane_api::object::revision_of(&volume);
            ctx.commit(vec![Op::Delete { key, revision }]).await?;
        }
    }
    Ok(Action::await_change())
}

fn pending_claims(cache: &Cache) -> Vec<ObjectKey> {
    cache
        .list(&kind_of::<PersistentVolumeClaim>(), None)
        .iter()
        .filter(|c| c["status"]["phase"] != "Bound")
        .filter_map(|c| ObjectKey::from_value(c).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(spec: Value, annotations: Value, phase: &str) -> PersistentVolumeClaim {
        serde_json::from_value(json!({"metadata": {"name": "data", "namespace": "default", "uid": "u1",
            "annotations": annotations}, "spec": spec, "status": {"phase": phase}}))
        .unwrap()
    }

    fn rwo(class: Option<&str>) -> Value {
        let mut spec = json!({"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}});
        if let Some(class) = class {
            spec["storageClassName"] = json!(class);
        }
        spec
    }

    fn class(name: &str, provisioner: &str, mode: &str, default: bool) -> StorageClass {
        serde_json::from_value(json!({"metadata": {"name": name,
            "annotations": {volumes::DEFAULT_CLASS: default.to_string()}},
            "provisioner": provisioner, "volumeBindingMode": mode, "reclaimPolicy": "Delete"}))
        .unwrap()
    }

    fn volume(name: &str, class: &str, claim_ref: Value, phase: &str, policy: &str) -> PersistentVolume {
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": {"capacity": {"storage": "2Gi"},
            "accessModes": ["ReadWriteOnce"], "storageClassName": class, "hostPath": {"path": "/mnt/data"},
            "claimRef": claim_ref, "persistentVolumeReclaimPolicy": policy}, "status": {"phase": phase}}))
        .unwrap()
    }

    fn node(name: &str) -> Node {
        serde_json::from_value(
            json!({"metadata": {"name": name, "annotations": {LOCAL_PATH_DIR: "/data/n1/storage/"}}}),
        )
        .unwrap()
    }

    fn outcome(plan: &ClaimPlan) -> String {
        match plan {
            ClaimPlan::Nothing => "nothing".into(),
            ClaimPlan::AssignDefaultClass(c) => format!("class {c}"),
            ClaimPlan::Bind(v) => format!("bind {}", name(&v.metadata)),
            ClaimPlan::Provision(v) => format!("provision {}", name(&v.metadata)),
            ClaimPlan::Lost => "lost".into(),
            ClaimPlan::Wait { reason, message, .. } => format!("{reason}: {message}"),
        }
    }

    #[test]
    fn claims_bind_wait_or_are_provisioned_as_upstream() {
        let local = class("local-path", LOCAL_PATH_PROVISIONER, "WaitForFirstConsumer", true);
        let immediate = class("now", LOCAL_PATH_PROVISIONER, "Immediate", false);
        let external = class("ebs", "ebs.csi.aws.com", "Immediate", false);
        let classes = [local, immediate, external];
        let manual = volume("task-pv-volume", "manual", Value::Null, "Available", "Retain");
        let selected = json!({volumes::SELECTED_NODE: "n1"});
        let mut named = rwo(Some("manual"));
        named["volumeName"] = json!("gone");
        let bound_ref = json!({"namespace": "default", "name": "data", "uid": "u1"});
        let mut bound_spec = rwo(Some("manual"));
        bound_spec["volumeName"] = json!("task-pv-volume");
        let cases: Vec<(&str, PersistentVolumeClaim, Vec<PersistentVolume>, &str)> = vec![
            ("no class: the default", claim(rwo(None), json!({}), "Pending"), vec![], "class local-path"),
            (
                "static volume by class",
                claim(rwo(Some("manual")), json!({}), "Pending"),
                vec![manual.clone()],
                "bind task-pv-volume",
            ),
            (
                "waits for its first Pod",
                claim(rwo(Some("local-path")), json!({}), "Pending"),
                vec![],
                "WaitForFirstConsumer: waiting for first consumer to be created before binding",
            ),
            (
                "provisioned on the selected node",
                claim(rwo(Some("local-path")), selected.clone(), "Pending"),
                vec![],
                "provision pvc-u1",
            ),
            (
                "unknown class",
                claim(rwo(Some("fast")), json!({}), "Pending"),
                vec![],
                "ProvisioningFailed: storageclass.storage.k8s.io \"fast\" not found",
            ),
            (
                "local-path needs the first Pod",
                claim(rwo(Some("now")), json!({}), "Pending"),
                vec![],
                "ProvisioningFailed: gitplane.io/local-path makes a directory on the node of the claim's first Pod: \
                 set volumeBindingMode: WaitForFirstConsumer on StorageClass \"now\"",
            ),
            (
                "an external provisioner",
                claim(rwo(Some("ebs")), json!({}), "Pending"),
                vec![],
                "ExternalProvisioning: Waiting for a volume to be created either by the external provisioner \
                 'ebs.csi.aws.com' or manually by the system administrator. If volume creation is delayed, please \
                 verify that the provisioner is running and correctly registered.",
            ),
            (
                "no class, no volume",
                claim(rwo(Some("")), json!({}), "Pending"),
                vec![],
                "FailedBinding: no persistent volumes available for this claim and no storage class is set",
            ),
            ("its volume is gone", claim(named.clone(), json!({}), "Bound"), vec![], "lost"),
            (
                "bound both ways",
                claim(bound_spec, json!({}), "Bound"),
                vec![volume("task-pv-volume", "manual", bound_ref, "Bound", "Retain")],
                "nothing",
            ),
        ];
        for (what, claim, volumes, want) in cases {
            let plan = plan_claim(&claim, &volumes, &classes, &[node("n1")]);
            assert_eq!(outcome(&plan), want, "{what}");
        }
    }

    #[test]
    fn a_provisioned_volume_is_pinned_to_its_node_with_the_requested_capacity() {
        let claim = claim(rwo(Some("local-path")), json!({volumes::SELECTED_NODE: "n1"}), "Pending");
        let class = class("local-path", LOCAL_PATH_PROVISIONER, "WaitForFirstConsumer", true);
        let volume = to_value(&provisioned_volume(&claim, &class, &node("n1")).unwrap());
        assert_eq!(volume["spec"]["hostPath"]["path"], "/data/n1/storage/pvc-u1_default_data");
        assert_eq!(volume["spec"]["capacity"]["storage"], "1Gi");
        assert_eq!(volume["spec"]["persistentVolumeReclaimPolicy"], "Delete");
        assert_eq!(volume["spec"]["claimRef"]["uid"], "u1");
        let term = &volume["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"][0]["matchExpressions"][0];
        assert_eq!(term["values"], json!(["n1"]));
        let ops = bind_ops(&claim, &from_value(volume).unwrap(), true);
        let kinds: Vec<&str> = ops
            .iter()
            .map(|op| match op {
                Op::Create(_) => "create",
                Op::Update(_) | Op::UpdateWithStatus(_) => "update",
                Op::UpdateStatus(_) => "status",
                Op::Delete { .. } => "delete",
            })
            .collect();
        assert_eq!(kinds, ["create", "update", "status"]);
        let Op::UpdateStatus(status) = &ops[2] else { unreachable!() };
        assert_eq!(
            status["status"],
            json!({"phase": "Bound", "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"}})
        );
        let mut unnamed = node("n2");
        unnamed.metadata.annotations = None;
        assert!(provisioned_volume(&claim, &class, &unnamed).unwrap_err().contains("local-path directory"));
    }

    #[test]
    fn released_volumes_are_reclaimed_by_their_policy() {
        let claim_ref = json!({"namespace": "default", "name": "data", "uid": "u1"});
        let mut provisioned = volume("pvc-u1", "local-path", claim_ref.clone(), "Bound", "Delete");
        provisioned.metadata.annotations =
            Some([(volumes::PROVISIONED_BY.to_owned(), LOCAL_PATH_PROVISIONER.to_owned())].into());
        let mut live_spec = rwo(Some("manual"));
        live_spec["volumeName"] = json!("pv");
        let live = claim(live_spec, json!({}), "Bound");
        let cases: Vec<(&str, PersistentVolume, Option<&PersistentVolumeClaim>, VolumePlan)> = vec![
            (
                "new static",
                volume("pv", "manual", Value::Null, "Pending", "Retain"),
                None,
                VolumePlan::Phase("Available", None),
            ),
            ("available", volume("pv", "manual", Value::Null, "Available", "Retain"), None, VolumePlan::Nothing),
            (
                "bound",
                volume("pv", "manual", claim_ref.clone(), "Available", "Retain"),
                Some(&live),
                VolumePlan::Phase("Bound", None),
            ),
            (
                "retained",
                volume("pv", "manual", claim_ref.clone(), "Bound", "Retain"),
                None,
                VolumePlan::Phase("Released", None),
            ),
            (
                "stays released",
                volume("pv", "manual", claim_ref.clone(), "Released", "Retain"),
                None,
                VolumePlan::Nothing,
            ),
            ("deleted", provisioned, None, VolumePlan::Delete),
            (
                "pre-bound by name",
                volume("pv", "manual", json!({"namespace": "default", "name": "later"}), "Pending", "Retain"),
                None,
                VolumePlan::Phase("Available", None),
            ),
        ];
        for (what, volume, claim, want) in cases {
            assert_eq!(plan_volume(&volume, claim), want, "{what}");
        }
    }
}
