//! What the agent knows of the cluster's networking, followed from the control plane's
//! `WatchNetwork`: Services, EndpointSlices, Nodes, cluster DNS's settings, Ingresses with their
//! classes and TLS Secrets, and for NetworkPolicy the policies, Namespaces and every Pod (slimmed
//! by the control plane). The proxy, cluster DNS, the routes to other nodes, the Ingress
//! controller and policy read it ([`Network::view`]) and are told what changed
//! ([`Network::subscribe`]), in batches: one per event, or one `Relisted` when the view was
//! listed anew (at start, after a compaction), after which a reader syncs from scratch.

use crate::controlplane::{Client, Follower, Servers, follow};
use gitplane_api::ObjectKey;
use gitplane_proto::node::{EventType, ObjectEvent, WatchNetworkRequest};
use k8s_openapi::api::{
    core::v1::{ConfigMap, Namespace, Node, Pod, Secret, Service},
    discovery::v1::EndpointSlice,
    networking::v1::{Ingress, IngressClass, NetworkPolicy},
};
use std::{
    collections::BTreeMap,
    sync::{Arc, PoisonError, RwLock, RwLockReadGuard},
};
use tokio::sync::{broadcast, watch};
use tonic::{Response, Status, Streaming};

const SERVICE: &str = "Service";
const ENDPOINT_SLICE: &str = "EndpointSlice.discovery.k8s.io";
const NODE: &str = "Node";
const CONFIG_MAP: &str = "ConfigMap";
const INGRESS: &str = "Ingress.networking.k8s.io";
const INGRESS_CLASS: &str = "IngressClass.networking.k8s.io";
/// Only the TLS Secrets Ingresses name come in this watch.
const SECRET: &str = "Secret";
const NETWORK_POLICY: &str = "NetworkPolicy.networking.k8s.io";
const NAMESPACE: &str = "Namespace";
const POD: &str = "Pod";

/// The cluster's networking objects as of one revision.
#[derive(Clone, Debug, Default)]
pub struct View {
    pub services: BTreeMap<ObjectKey, Arc<Service>>,
    pub slices: BTreeMap<ObjectKey, Arc<EndpointSlice>>,
    pub nodes: BTreeMap<String, Arc<Node>>,
    /// `kube-system/kube-dns`: stub domains and upstream servers.
    pub dns_config: Option<Arc<ConfigMap>>,
    pub ingresses: BTreeMap<ObjectKey, Arc<Ingress>>,
    pub ingress_classes: BTreeMap<String, Arc<IngressClass>>,
    pub tls_secrets: BTreeMap<ObjectKey, Arc<Secret>>,
    pub policies: BTreeMap<ObjectKey, Arc<NetworkPolicy>>,
    pub namespaces: BTreeMap<String, Arc<Namespace>>,
    /// Every Pod of the cluster, as policy needs it (labels, node, address, named ports).
    pub pods: BTreeMap<ObjectKey, Arc<Pod>>,
    pub revision: i64,
}

/// One change of the view.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    Service(ObjectKey),
    EndpointSlice(ObjectKey),
    Node(String),
    DnsConfig,
    /// An Ingress, an IngressClass or a TLS Secret: the Ingress routes are rebuilt.
    Ingress,
    NetworkPolicy(ObjectKey),
    Namespace(String),
    Pod(ObjectKey),
    /// Listed anew: read everything.
    Relisted,
}

impl View {
    /// Applies one watch event; the change it made, if any.
    fn apply(&mut self, event: &ObjectEvent) -> Result<Option<Change>, serde_json::Error> {
        let kind = EventType::try_from(event.r#type).unwrap_or(EventType::Unspecified);
        self.revision = self.revision.max(event.resource_version);
        let deleted = match kind {
            EventType::Added | EventType::Modified => false,
            EventType::Deleted => true,
            EventType::Bookmark | EventType::Unspecified => return Ok(None),
        };
        let value: serde_json::Value = serde_json::from_slice(&event.object)?;
        let Ok(key) = ObjectKey::from_value(&value) else { return Ok(None) };
        fn put<K: Ord, T>(map: &mut BTreeMap<K, Arc<T>>, key: K, object: Option<T>) {
            match object {
                Some(object) => map.insert(key, Arc::new(object)),
                None => map.remove(&key),
            };
        }
        let change = match event.kind.as_str() {
            SERVICE => {
                let service = (!deleted).then(|| serde_json::from_value(value)).transpose()?;
                put(&mut self.services, key.clone(), service);
                Change::Service(key)
            }
            ENDPOINT_SLICE => {
                let slice = (!deleted).then(|| serde_json::from_value(value)).transpose()?;
                put(&mut self.slices, key.clone(), slice);
                Change::EndpointSlice(key)
            }
            NODE => {
                let node = (!deleted).then(|| serde_json::from_value(value)).transpose()?;
                put(&mut self.nodes, key.name.clone(), node);
                Change::Node(key.name)
            }
            CONFIG_MAP => {
                self.dns_config = (!deleted).then(|| serde_json::from_value(value)).transpose()?.map(Arc::new);
                Change::DnsConfig
            }
            INGRESS => {
                let ingress = (!deleted).then(|| serde_json::from_value(value)).transpose()?;
                put(&mut self.ingresses, key, ingress);
                Change::Ingress
            }
            INGRESS_CLASS => {
                let class = (!deleted).then(|| serde_json::from_value(value)).transpose()?;
                put(&mut self.ingress_classes, key.name, class);
                Change::Ingress
            }
            SECRET => {
                let secret = (!deleted).then(|| serde_json::from_value(value)).transpose()?;
                put(&mut self.tls_secrets, key, secret);
                Change::Ingress
            }
            NETWORK_POLICY => {
                let policy = (!deleted).then(|| serde_json::from_value(value)).transpose()?;
                put(&mut self.policies, key.clone(), policy);
                Change::NetworkPolicy(key)
            }
            NAMESPACE => {
                let namespace = (!deleted).then(|| serde_json::from_value(value)).transpose()?;
                put(&mut self.namespaces, key.name.clone(), namespace);
                Change::Namespace(key.name)
            }
            POD => {
                let pod = (!deleted).then(|| serde_json::from_value(value)).transpose()?;
                put(&mut self.pods, key.clone(), pod);
                Change::Pod(key)
            }
            _ => return Ok(None),
        };
        Ok(Some(change))
    }
}

/// Waits for the next batch of changes and takes every batch queued behind it, so a reader
/// catches up in one step; a reader that fell behind gets `Relisted`. `None`: the feed ended.
pub async fn next_changes(changes: &mut broadcast::Receiver<Arc<[Change]>>) -> Option<Vec<Change>> {
    let mut out: Vec<Change> = match changes.recv().await {
        Ok(batch) => batch.to_vec(),
        Err(broadcast::error::RecvError::Lagged(_)) => vec![Change::Relisted],
        Err(broadcast::error::RecvError::Closed) => return None,
    };
    loop {
        match changes.try_recv() {
            Ok(batch) => out.extend(batch.iter().cloned()),
            Err(broadcast::error::TryRecvError::Lagged(_)) => out.push(Change::Relisted),
            Err(_) => return Some(out),
        }
    }
}

/// The followed view and its subscribers.
pub struct Network {
    view: RwLock<View>,
    changes: broadcast::Sender<Arc<[Change]>>,
    /// Whether the first list has arrived.
    synced: watch::Sender<bool>,
}

impl Default for Network {
    fn default() -> Self {
        Network { view: RwLock::default(), changes: broadcast::channel(1024).0, synced: watch::channel(false).0 }
    }
}

impl Network {
    pub fn view(&self) -> RwLockReadGuard<'_, View> {
        self.view.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Changes from now on. A reader that lags behind gets `RecvError::Lagged` and should read
    /// the whole view again, as after `Relisted`.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<[Change]>> {
        self.changes.subscribe()
    }

    /// Resolves once the first list has arrived.
    pub async fn synced(&self) {
        let _ = self.synced.subscribe().wait_for(|s| *s).await;
    }

    fn publish(&self, changes: Vec<Change>) {
        if !changes.is_empty() {
            let _ = self.changes.send(changes.into());
        }
    }

    /// Follows the control plane until `shutdown` (see [`follow`]).
    pub(crate) async fn follow(&self, servers: Servers, mut shutdown: watch::Receiver<bool>) {
        follow(&mut Following { network: self, listing: None }, &servers, &mut shutdown).await;
    }

    fn observe(&self, event: &ObjectEvent, listing: &mut Option<View>) {
        let bookmark = event.r#type == EventType::Bookmark as i32;
        if let Some(view) = listing {
            if let Err(e) = view.apply(event) {
                tracing::warn!(kind = %event.kind, error = %e, "undecodable object in the network watch, skipped");
            }
            if bookmark && let Some(view) = listing.take() {
                *self.view.write().unwrap_or_else(PoisonError::into_inner) = view;
                self.synced.send_replace(true);
                self.publish(vec![Change::Relisted]);
            }
            return;
        }
        let change = self.view.write().unwrap_or_else(PoisonError::into_inner).apply(event);
        match change {
            Ok(change) => self.publish(change.into_iter().collect()),
            Err(e) => {
                tracing::warn!(kind = %event.kind, error = %e, "undecodable object in the network watch, skipped")
            }
        }
    }
}

/// The state of one follow: a list in progress, collected aside and swapped in whole at its
/// bookmark.
struct Following<'a> {
    network: &'a Network,
    listing: Option<View>,
}

impl Follower for Following<'_> {
    type Event = ObjectEvent;
    const WHAT: &'static str = "network watch";

    async fn open(&self, mut client: Client, from: i64) -> Result<Streaming<ObjectEvent>, Status> {
        client.watch_network(WatchNetworkRequest { resource_version: from }).await.map(Response::into_inner)
    }

    fn started(&mut self, from: i64) {
        self.listing = (from == 0).then(View::default);
    }

    async fn observe(&mut self, event: ObjectEvent) {
        self.network.observe(&event, &mut self.listing);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(kind: EventType, revision: i64, group_kind: &str, object: serde_json::Value) -> ObjectEvent {
        ObjectEvent {
            r#type: kind as i32,
            resource_version: revision,
            kind: group_kind.into(),
            object: serde_json::to_vec(&object).unwrap(),
        }
    }

    fn bookmark(revision: i64) -> ObjectEvent {
        ObjectEvent { r#type: EventType::Bookmark as i32, resource_version: revision, ..Default::default() }
    }

    #[test]
    fn a_list_is_swapped_in_at_its_bookmark_then_changes_apply_one_by_one() {
        let network = Network::default();
        let mut changes = network.subscribe();
        let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "default"}});
        let slice = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
                           "endpoints": [], "metadata": {"name": "web-1", "namespace": "default"}});
        let node = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n2"}});
        let mut listing = Some(View::default());
        for e in [event(EventType::Added, 7, SERVICE, svc.clone()), event(EventType::Added, 7, ENDPOINT_SLICE, slice)] {
            network.observe(&e, &mut listing);
        }
        assert!(network.view().services.is_empty(), "nothing shows before the list is complete");
        network.observe(&bookmark(7), &mut listing);
        assert!(listing.is_none());
        assert_eq!(*changes.try_recv().unwrap(), [Change::Relisted]);
        assert_eq!((network.view().services.len(), network.view().slices.len(), network.view().revision), (1, 1, 7));

        network.observe(&event(EventType::Added, 8, NODE, node), &mut listing);
        assert_eq!(*changes.try_recv().unwrap(), [Change::Node("n2".into())]);
        network.observe(&event(EventType::Deleted, 9, SERVICE, svc), &mut listing);
        let key = ObjectKey::new("Service", "default", "web");
        assert_eq!(*changes.try_recv().unwrap(), [Change::Service(key)]);
        assert!(network.view().services.is_empty());
        network.observe(&bookmark(12), &mut listing);
        assert!(changes.try_recv().is_err(), "a bookmark changes nothing");
        assert_eq!(network.view().revision, 12);
        let bad = ObjectEvent { object: b"{not json".to_vec(), ..event(EventType::Added, 13, SERVICE, json!({})) };
        network.observe(&bad, &mut listing);
        assert!(changes.try_recv().is_err(), "an undecodable object is skipped");
    }
}
