//! Owner references: who controls whom.

use gitplane_api::{kube_core::Resource, object::kind_of};
use gitplane_store::{Event, ObjectKey};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

/// The controller reference to put on a dependent of `owner`.
pub fn controller_ref(api_version: &str, kind: &str, owner: &ObjectMeta) -> OwnerReference {
    OwnerReference {
        api_version: api_version.into(),
        kind: kind.into(),
        name: owner.name.clone().unwrap_or_default(),
        uid: owner.uid.clone().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

/// The objects of kind `K` that control the event's object (its controller owner references of
/// that kind): what a change of a dependent queues.
pub fn controllers_of<K: Resource<DynamicType = ()>>(event: &Event) -> Vec<ObjectKey> {
    let kind = K::kind(&());
    event.object["metadata"]["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["kind"] == *kind && r["controller"] == true)
        .filter_map(|r| r["name"].as_str())
        .map(|name| ObjectKey::of::<K>(&event.key.namespace, name))
        .collect()
}

/// What an event queues for the controller of `K` over dependents of kind `D`: a changed `K`
/// itself, or the `K`s controlling a changed `D`.
pub fn owner_keys_for<K, D>(event: &Event) -> Vec<ObjectKey>
where
    K: Resource<DynamicType = ()>,
    D: Resource<DynamicType = ()>,
{
    if event.key.kind == kind_of::<K>() {
        vec![event.key.clone()]
    } else if event.key.kind == kind_of::<D>() {
        controllers_of::<K>(event)
    } else {
        Vec::new()
    }
}
