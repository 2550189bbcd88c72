//! What a reconciler decides, as data. Each workload controller has a pure `plan` (its object
//! and the dependents it controls in, [`Op`]s out) that table tests drive directly; the runtime
//! commits a plan as one transaction ([`crate::Context::apply`]).

use gitplane_api::{
    kube_core::Resource,
    object::{revision_of, to_value},
};
use gitplane_store::ObjectKey;
use serde::Serialize;

/// One write a plan decides on. Updates and deletes carry the object as it was read, so they
/// compare-and-swap on its resourceVersion: a plan made from a stale cache fails instead of
/// undoing someone else's write.
#[derive(Clone, Debug, PartialEq)]
pub enum Op<K> {
    Create(K),
    /// Replaces metadata and spec.
    Update(K),
    Delete(K),
}

impl<K: Resource<DynamicType = ()> + Serialize> Op<K> {
    pub fn into_store_op(self) -> gitplane_store::Op {
        match self {
            Op::Create(object) => gitplane_store::Op::Create(to_value(&object)),
            Op::Update(object) => gitplane_store::Op::Update(to_value(&object)),
            Op::Delete(object) => {
                let meta = object.meta();
                let key =
                    ObjectKey::of::<K>(meta.namespace.as_deref().unwrap_or(""), meta.name.as_deref().unwrap_or(""));
                gitplane_store::Op::Delete { key, revision: revision_of(&object) }
            }
        }
    }
}
