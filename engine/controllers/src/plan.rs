//! What a reconciler decides, as data. Each workload controller has a pure `plan` (its object
//! and the dependents it controls in, [`Op`]s out) that table tests drive directly; the runtime
//! commits a plan as one transaction ([`crate::Context::apply`]).

use gitplane_api::{k8s_openapi::jiff::Timestamp, kube_core::Resource, object::to_value};
use gitplane_store::deletion;
use serde::Serialize;

/// One write a plan decides on. Updates and deletes carry the object as it was read, so they
/// compare-and-swap on its resourceVersion: a plan made from a stale cache fails instead of
/// undoing someone else's write.
#[derive(Clone, Debug, PartialEq)]
pub enum Op<K> {
    Create(K),
    /// Replaces metadata and spec.
    Update(K),
    /// Deletes as the API server does ([`deletion::delete`]): a bound Pod gracefully.
    Delete(K),
}

impl<K: Resource<DynamicType = ()> + Serialize> Op<K> {
    /// The store's write at `now`; `None` for a delete already under way.
    pub fn into_store_op(self, now: Timestamp) -> Option<gitplane_store::Op> {
        match self {
            Op::Create(object) => Some(gitplane_store::Op::Create(to_value(&object))),
            Op::Update(object) => Some(gitplane_store::Op::Update(to_value(&object))),
            Op::Delete(object) => deletion::delete(&to_value(&object), now),
        }
    }
}
