//! Typed access to the store, in the manner of kube-rs' `Api<K>`.

use crate::{ListOptions, ObjectKey, Op, Rejection, Result, Revision, Store};
use gitplane_api::kube_core::Resource;
use gitplane_api::object::{from_value, kind_of, to_value};
use serde::{Serialize, de::DeserializeOwned};
use std::{marker::PhantomData, sync::Arc};

/// Typed reads and writes of one kind.
pub struct Api<K> {
    store: Arc<dyn Store>,
    kind: PhantomData<fn() -> K>,
}

impl<K> Clone for Api<K> {
    fn clone(&self) -> Self {
        Api { store: self.store.clone(), kind: PhantomData }
    }
}

fn decode<K: Resource<DynamicType = ()> + DeserializeOwned>(value: serde_json::Value) -> Result<K> {
    from_value(value).map_err(|e| Rejection::Invalid(e.to_string()).into())
}

impl<K: Resource<DynamicType = ()> + Serialize + DeserializeOwned> Api<K> {
    pub fn new(store: Arc<dyn Store>) -> Self {
        Api { store, kind: PhantomData }
    }

    pub fn key(namespace: &str, name: &str) -> ObjectKey {
        ObjectKey::of::<K>(namespace, name)
    }

    pub async fn get(&self, namespace: &str, name: &str) -> Result<Option<K>> {
        self.store.get(&Self::key(namespace, name)).await?.map(decode).transpose()
    }

    /// Every object of the kind (in one namespace, or all), with the list's revision.
    pub async fn list(&self, namespace: Option<&str>) -> Result<(Vec<K>, Revision)> {
        let options = ListOptions { namespace: namespace.map(str::to_owned), ..Default::default() };
        let list = self.store.list(&kind_of::<K>(), &options).await?;
        let items = list.items.into_iter().map(decode).collect::<Result<_>>()?;
        Ok((items, list.revision))
    }

    pub async fn create(&self, object: &K) -> Result<K> {
        self.one(Op::Create(to_value(object))).await
    }

    /// Replaces metadata and spec; compare-and-swap when `object` carries a resourceVersion.
    pub async fn update(&self, object: &K) -> Result<K> {
        self.one(Op::Update(to_value(object))).await
    }

    /// Replaces the status only; compare-and-swap when `object` carries a resourceVersion.
    pub async fn update_status(&self, object: &K) -> Result<K> {
        self.one(Op::UpdateStatus(to_value(object))).await
    }

    /// Deletes, when `revision` is given only if the object is still at it. Returns the last state.
    pub async fn delete(&self, namespace: &str, name: &str, revision: Option<Revision>) -> Result<K> {
        self.one(Op::Delete { key: Self::key(namespace, name), revision }).await
    }

    async fn one(&self, op: Op) -> Result<K> {
        let committed = self.store.txn(vec![op]).await?;
        let value = committed.objects.into_iter().next().ok_or_else(|| Rejection::Invalid("empty commit".into()))?;
        decode(value)
    }
}
