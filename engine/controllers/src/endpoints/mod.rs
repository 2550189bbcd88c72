//! Endpoints controller: keeps each Service's EndpointSlices (discovery.k8s.io/v1, what node
//! agents program rules from) and its legacy Endpoints (core/v1, what `kubectl get endpoints`
//! reads) from the Pods its selector matches, as kube-controller-manager's endpointslice and
//! endpoint controllers do. One reconcile per Service plans both from the same Pods ([`slices`],
//! [`legacy`]; [`pods`] is what a Pod contributes) and commits them in one transaction.
//!
//! Services without a selector, and ExternalName Services, get no managed endpoints (any left
//! from before are removed); a selector-less Service's hand-written Endpoints (from Git) is
//! mirrored into EndpointSlices ([`mirroring`]). EndpointSlices are owned by their Service, so the garbage collector
//! removes them with it; the Endpoints object has no owner, as upstream, and is deleted here
//! when its Service goes. Endpoints that came from Git (an Application's annotation) are never
//! touched.

pub mod legacy;
pub mod mirroring;
pub mod pods;
pub mod slices;

use crate::{Action, Context, ReconcileError, Reconciler, plan::Op, runtime::all_of};
use gitplane_api::object::{APPLICATION_ANNOTATION, from_value, kind_of};
use gitplane_store::{Event, EventType, ObjectKey, informer::Cache};
use k8s_openapi::api::core::v1::{Endpoints, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::Value;
use std::{
    collections::{BTreeSet, HashMap},
    sync::Mutex,
};

#[derive(Default)]
pub struct EndpointsController {
    /// The labels each Pod had at its last event: a Pod whose labels change must requeue the
    /// Services it no longer matches too, and an event carries only the new state.
    pod_labels: Mutex<HashMap<ObjectKey, Value>>,
}

/// The Services of `namespace` whose selector matches any of these label sets.
fn services_selecting(cache: &Cache, namespace: &str, label_sets: &[&Value]) -> Vec<ObjectKey> {
    cache
        .list(&kind_of::<Service>(), Some(namespace))
        .iter()
        .filter(|s| pods::selector_of(s).is_some_and(|sel| label_sets.iter().any(|l| pods::selects(sel, l))))
        .filter_map(|s| ObjectKey::from_value(s).ok())
        .collect()
}

/// The Service a managed slice (as JSON) belongs to.
fn service_of_slice(slice: &Value, namespace: &str) -> Option<ObjectKey> {
    let labels = &slice["metadata"]["labels"];
    if labels[slices::LABEL_MANAGED_BY] != slices::MANAGED_BY
        && labels[slices::LABEL_MANAGED_BY] != mirroring::MANAGED_BY
    {
        return None;
    }
    Some(ObjectKey::of::<Service>(namespace, labels[slices::LABEL_SERVICE_NAME].as_str()?))
}

fn is_external_name(service: &Service) -> bool {
    service.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("ExternalName")
}

fn decode<K: gitplane_api::kube_core::Resource<DynamicType = ()> + serde::de::DeserializeOwned>(
    value: &Value,
) -> Result<K, ReconcileError> {
    from_value(value.clone()).map_err(|e| ReconcileError::Invalid(e.to_string()))
}

#[async_trait::async_trait]
impl Reconciler for EndpointsController {
    fn name(&self) -> &'static str {
        "endpoints"
    }

    fn workers(&self) -> usize {
        crate::runtime::CONCURRENT_SYNCS
    }

    fn keys_for(&self, event: &Event, cache: &Cache) -> Vec<ObjectKey> {
        let (kind, namespace) = (&event.key.kind, event.key.namespace.as_str());
        if *kind == kind_of::<Service>() {
            vec![event.key.clone()]
        } else if *kind == kind_of::<Pod>() {
            let labels = &event.object["metadata"]["labels"];
            let mut index = self.pod_labels.lock().unwrap_or_else(|e| e.into_inner());
            let before = match event.event_type {
                EventType::Deleted => index.remove(&event.key),
                _ => index.insert(event.key.clone(), labels.clone()),
            };
            drop(index);
            let sets: Vec<&Value> = std::iter::once(labels).chain(before.as_ref().filter(|b| *b != labels)).collect();
            services_selecting(cache, namespace, &sets)
        } else if *kind == kind_of::<EndpointSlice>() {
            service_of_slice(&event.object, namespace).into_iter().collect()
        } else if *kind == kind_of::<Endpoints>() {
            vec![ObjectKey::of::<Service>(namespace, &event.key.name)]
        } else {
            Vec::new()
        }
    }

    fn all_keys(&self, cache: &Cache) -> Vec<ObjectKey> {
        let index = cache
            .list(&kind_of::<Pod>(), None)
            .iter()
            .filter_map(|p| Some((ObjectKey::from_value(p).ok()?, p["metadata"]["labels"].clone())))
            .collect();
        *self.pod_labels.lock().unwrap_or_else(|e| e.into_inner()) = index;
        // Services, and the ones whose endpoints outlived them (upstream's
        // checkLeftoverEndpoints).
        let mut keys: BTreeSet<ObjectKey> = all_of::<Service>(cache).into_iter().collect();
        for slice in cache.list(&kind_of::<EndpointSlice>(), None) {
            let namespace = slice["metadata"]["namespace"].as_str().unwrap_or_default();
            keys.extend(service_of_slice(&slice, namespace));
        }
        for endpoints in cache.list(&kind_of::<Endpoints>(), None) {
            if let Ok(key) = ObjectKey::from_value(&endpoints) {
                keys.insert(ObjectKey::of::<Service>(&key.namespace, &key.name));
            }
        }
        keys.into_iter().collect()
    }

    async fn reconcile(&self, key: &ObjectKey, ctx: &Context) -> Result<Action, ReconcileError> {
        let cache = ctx.cache();
        let namespace = key.namespace.as_str();
        let service_json = cache.get(key);
        let service: Option<Service> = service_json.as_deref().map(decode).transpose()?;
        let selector = service_json.as_deref().and_then(pods::selector_of);
        let pods: Vec<Pod> = match selector {
            Some(selector) => {
                cache.list_typed_where(Some(namespace), |p| pods::selects(selector, &p["metadata"]["labels"]))
            }
            None => Vec::new(),
        };
        let managed = service.as_ref().filter(|_| selector.is_some());
        let existing: Vec<EndpointSlice> =
            cache.list_typed_where(Some(namespace), |s| slices::is_managed_for(s, &key.name));
        let slice_ops = match (managed, &service) {
            (Some(service), _) => slices::plan(service, &pods, &existing),
            (None, Some(_)) => existing.into_iter().map(Op::Delete).collect(),
            // Gone: the garbage collector removes the slices it owned.
            (None, None) => Vec::new(),
        };
        let endpoints: Option<Endpoints> = cache
            .get(&ObjectKey::of::<Endpoints>(namespace, &key.name))
            .filter(|e| e["metadata"]["annotations"][APPLICATION_ANNOTATION].is_null())
            .as_deref()
            .map(decode)
            .transpose()?;
        let legacy_op = legacy::plan(managed, &pods, endpoints.as_ref());
        // A Service without a selector routes to the addresses its Endpoints from Git lists.
        let written: Option<Endpoints> = cache
            .get(&ObjectKey::of::<Endpoints>(namespace, &key.name))
            .filter(|e| !e["metadata"]["annotations"][APPLICATION_ANNOTATION].is_null())
            .filter(|_| service.as_ref().is_some_and(|s| selector.is_none() && !is_external_name(s)))
            .as_deref()
            .map(decode)
            .transpose()?;
        let mirrored: Vec<EndpointSlice> =
            cache.list_typed_where(Some(namespace), |s| mirroring::is_mirrored_for(s, &key.name));
        let mirror_ops = mirroring::plan(written.as_ref(), &mirrored);
        let now = gitplane_api::k8s_openapi::jiff::Timestamp::now();
        let ops: Vec<gitplane_store::Op> = slice_ops
            .into_iter()
            .filter_map(|op| op.into_store_op(now))
            .chain(legacy_op.and_then(|op| op.into_store_op(now)))
            .chain(mirror_ops.into_iter().filter_map(|op| op.into_store_op(now)))
            .collect();
        if !ops.is_empty() {
            tracing::debug!(writes = ops.len(), pods = pods.len(), "syncing endpoints");
            ctx.commit(ops).await?;
        }
        Ok(Action::await_change())
    }
}
