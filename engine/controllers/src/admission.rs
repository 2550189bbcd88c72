//! The admission the API server gives the objects controllers create: a claim's defaults
//! ([`default_claim`], on the controllers' creates), LimitRanger's defaults and bounds on a Pod ([`gitplane_api::limitrange`]), then the ResourceQuota plugin
//! ([`gitplane_api::quota`]) on anything counted. A refused create is left out of the
//! transaction and its controller records the API server's error as upstream's controllers do:
//! a `FailedCreate` Warning on the owner, `Error creating: pods "x" is forbidden: ...`.

use gitplane_api::{
    k8s_openapi::api::core::v1::{LimitRange, ObjectReference, PersistentVolumeClaim, Pod, ResourceQuota},
    k8s_openapi::api::storage::v1::StorageClass,
    kinds, limitrange,
    object::{from_value, kind_of, to_value},
    quota::{self, Usage},
    volumes,
};
use gitplane_store::informer::Cache;
use serde_json::Value;
use std::sync::Arc;

/// Where admission reads the namespace's LimitRanges, ResourceQuotas and what the quotas count:
/// the informer's cache, or what a Git sync would leave stored.
pub trait Objects {
    /// The objects of a group kind in `namespace`.
    fn list(&self, kind: &str, namespace: &str) -> Vec<Arc<Value>>;
}

impl Objects for Cache {
    fn list(&self, kind: &str, namespace: &str) -> Vec<Arc<Value>> {
        Cache::list(self, kind, Some(namespace))
    }
}

fn list_typed<K: serde::de::DeserializeOwned>(objects: &dyn Objects, kind: &str, namespace: &str) -> Vec<K> {
    objects.list(kind, namespace).iter().filter_map(|o| serde_json::from_value(o.as_ref().clone()).ok()).collect()
}

/// A create the API server refused: who asked (the object's controller) and why.
#[derive(Debug, PartialEq)]
pub struct Refusal {
    pub owner: Option<Box<ObjectReference>>,
    pub message: String,
}

/// The plural and group quota counts an object of this apiVersion and kind under.
fn resource_of(object: &Value) -> Option<(&'static str, &'static str, String)> {
    let (api_version, kind) = (object["apiVersion"].as_str()?, object["kind"].as_str()?);
    let info = kinds::lookup(api_version, kind)?;
    let group = api_version.rsplit_once('/').map_or("", |(g, _)| g).to_owned();
    Some((info.kind.as_str(), info.plural.as_str(), group))
}

/// Admits the creates of one transaction in order, each counted against the quotas with the
/// ones admitted before it. Returns the objects as they are to be stored (a Pod with its
/// defaults) or the refusal.
pub struct Admission<'c> {
    objects: &'c dyn Objects,
    admitted: Vec<(String, Value)>,
}

impl<'c> Admission<'c> {
    pub fn new(objects: &'c dyn Objects) -> Self {
        Admission { objects, admitted: Vec::new() }
    }

    pub fn admit(&mut self, object: Value) -> Result<Value, Refusal> {
        let namespace = object["metadata"]["namespace"].as_str().unwrap_or("").to_owned();
        let name = object["metadata"]["name"].as_str().unwrap_or("").to_owned();
        let Some((kind, plural, group)) = resource_of(&object) else { return Ok(object) };
        let refuse = |message: String| Refusal {
            owner: controller_of(&object),
            message: format!("{plural} {name:?} is forbidden: {message}"),
        };
        let mut object = object.clone();
        let ranges: Vec<LimitRange> = list_typed(self.objects, &kind_of::<LimitRange>(), &namespace);
        let quotas: Vec<ResourceQuota> = list_typed(self.objects, &kind_of::<ResourceQuota>(), &namespace);
        if kind == "Pod" && (!ranges.is_empty() || !quotas.is_empty()) {
            let mut pod: Pod = from_value(object.clone()).map_err(|e| refuse(e.to_string()))?;
            limitrange::admit(&mut pod, &ranges).map_err(refuse)?;
            for q in quotas.iter().filter(|q| quota::applies_to(q, kind, &object)) {
                if let Some(missing) = quota::missing_constraints(q, &pod) {
                    let quota_name = q.metadata.name.as_deref().unwrap_or("");
                    return Err(refuse(format!("failed quota: {quota_name}: {missing}")));
                }
            }
            object = to_value(&pod);
        }
        let requested = quota::usage_of(&object, kind, plural, &group);
        for q in quotas.iter().filter(|q| quota::applies_to(q, kind, &object)) {
            let used = quota::used(q, usages(self.objects, q, &namespace, &self.admitted).iter());
            quota::check(q, &used, &requested).map_err(refuse)?;
        }
        self.admitted.push((namespace, object.clone()));
        Ok(object)
    }
}

/// A new claim as the API server stores it: the default class when it names none (the
/// DefaultStorageClass plugin) and phase Pending (its defaulting). Made at creation, the claim
/// needs no write from the binder before the scheduler's write of its selected node, which
/// would otherwise lose its compare-and-swap and back off a second.
pub fn default_claim(claim: &mut Value, classes: &[StorageClass]) {
    let named = from_value::<PersistentVolumeClaim>(claim.clone()).is_ok_and(|c| volumes::claim_class(&c).is_some());
    if !named && let Some(name) = volumes::default_class(classes).and_then(|c| c.metadata.name.clone()) {
        claim["spec"]["storageClassName"] = Value::String(name);
    }
    if claim["status"]["phase"].as_str().is_none_or(str::is_empty) {
        claim["status"]["phase"] = Value::String("Pending".into());
    }
}

/// What a quota counts in its namespace: the cache's objects and `pending`, the creates admitted
/// so far in a transaction.
pub fn usages(objects: &dyn Objects, q: &ResourceQuota, namespace: &str, pending: &[(String, Value)]) -> Vec<Usage> {
    let hard = quota::hard(q);
    let mut usages = Vec::new();
    for info in kinds::stored().filter(|k| k.namespaced) {
        let group = info.api_version.rsplit_once('/').map_or("", |(g, _)| g);
        if !quota::counts(&hard, &info.kind, &info.plural, group) {
            continue;
        }
        let live = objects.list(&info.group_kind(), namespace);
        let added = pending.iter().filter(|(ns, o)| ns == namespace && o["kind"] == info.kind.as_str()).map(|(_, o)| o);
        for o in live.iter().map(|o| o.as_ref()).chain(added) {
            if (info.kind != "Pod" || quota::pod_counts(o)) && quota::applies_to(q, &info.kind, o) {
                usages.push(quota::usage_of(o, &info.kind, &info.plural, group));
            }
        }
    }
    usages
}

/// The reference of an object's controller (its controller owner), for the Event.
fn controller_of(object: &Value) -> Option<Box<ObjectReference>> {
    let owners = object["metadata"]["ownerReferences"].as_array()?;
    let owner = owners.iter().find(|o| o["controller"] == true)?;
    Some(Box::new(ObjectReference {
        api_version: owner["apiVersion"].as_str().map(Into::into),
        kind: owner["kind"].as_str().map(Into::into),
        name: owner["name"].as_str().map(Into::into),
        uid: owner["uid"].as_str().map(Into::into),
        namespace: object["metadata"]["namespace"].as_str().map(Into::into),
        ..Default::default()
    }))
}

/// The kinds admission reads from the cache.
pub fn watched_kinds() -> [String; 2] {
    [kind_of::<LimitRange>(), kind_of::<ResourceQuota>()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn class(name: &str, default: bool) -> StorageClass {
        serde_json::from_value(json!({"metadata": {"name": name,
            "annotations": {volumes::DEFAULT_CLASS: default.to_string()}}, "provisioner": "p"}))
        .unwrap()
    }

    #[test]
    fn a_new_claim_gets_the_default_class_and_phase_pending() {
        let classes = [class("slow", false), class("local-path", true)];
        let cases: Vec<(&str, Value, &[StorageClass], Value, &str)> = vec![
            ("no class: the default", json!({}), &classes, json!("local-path"), "Pending"),
            ("no default class", json!({}), &classes[..1], Value::Null, "Pending"),
            ("a class named", json!({"storageClassName": "slow"}), &classes, json!("slow"), "Pending"),
            ("no class asked for", json!({"storageClassName": ""}), &classes, json!(""), "Pending"),
        ];
        for (what, spec, classes, want_class, want_phase) in cases {
            let mut claim = json!({"metadata": {"name": "data"}, "spec": spec});
            default_claim(&mut claim, classes);
            assert_eq!(claim["spec"]["storageClassName"], want_class, "{what}");
            assert_eq!(claim["status"]["phase"], want_phase, "{what}");
        }
        let mut beta =
            json!({"metadata": {"annotations": {"volume.beta.kubernetes.io/storage-class": "slow"}}, "spec": {}});
        default_claim(&mut beta, &classes);
        assert_eq!(beta["spec"]["storageClassName"], Value::Null, "the beta annotation names a class");
    }
}
