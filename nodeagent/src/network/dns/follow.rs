//! Cluster DNS fed from the agent's view of the network ([`crate::network::follow`]): Services and
//! EndpointSlices into the zone as they change (a fresh list replaces the zone whole), and the
//! `kube-system/kube-dns` ConfigMap into the forwarding table over the node's resolvers; a
//! ConfigMap this node refuses is a Warning Event on it.

use super::{Dns, ResolvConf};
use crate::events::Recorder;
use crate::network::{
    follow::Consumer,
    view::{Change, View},
};
use gitplane_api::events::WARNING;
use k8s_openapi::api::core::v1::ObjectReference;

/// The reason of the Event on a kube-dns ConfigMap that a node does not apply.
pub const NOT_APPLIED: &str = "DNSConfigNotApplied";

/// Cluster DNS as a reader of the view: the zone, the node's resolvers (what forwarding falls
/// back to) and where a refused ConfigMap is reported.
pub struct Feed {
    pub dns: Dns,
    pub host: ResolvConf,
    pub events: Recorder,
}

impl Consumer for Feed {
    type Error = std::convert::Infallible;

    fn relist(&mut self, view: &View) {
        relist(&self.dns, &self.host, view, &self.events)
    }

    fn apply(&mut self, view: &View, batch: &[Change]) {
        apply(&self.dns, &self.host, view, batch, &self.events)
    }
}

fn relist(dns: &Dns, host: &ResolvConf, view: &View, events: &Recorder) {
    let errors = dns.replace_all(view.services.values().map(|s| &**s), view.slices.values().map(|s| &**s));
    for error in errors {
        tracing::warn!(%error, "not in cluster DNS");
    }
    config(dns, host, view, events);
}

fn config(dns: &Dns, host: &ResolvConf, view: &View, events: &Recorder) {
    match &view.dns_config {
        Some(config_map) => {
            if let Err(error) = dns.apply_config_map(host, config_map) {
                tracing::warn!(%error, "kube-system/kube-dns not applied; the forwarding in force stays");
                let involved = ObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("ConfigMap".into()),
                    namespace: config_map.metadata.namespace.clone(),
                    name: config_map.metadata.name.clone(),
                    uid: config_map.metadata.uid.clone(),
                    ..Default::default()
                };
                let message = format!("{error}; this node keeps forwarding as before");
                events.object(involved, WARNING, NOT_APPLIED, &message);
            }
        }
        None => dns.delete_config_map(host),
    }
}

fn apply(dns: &Dns, host: &ResolvConf, view: &View, batch: &[Change], events: &Recorder) {
    if batch.contains(&Change::Relisted) {
        return relist(dns, host, view, events);
    }
    for change in batch {
        let added = match change {
            Change::Service(key) => match view.services.get(key) {
                Some(service) => dns.apply_service(service),
                None => {
                    dns.delete_service(&key.namespace, &key.name);
                    Ok(())
                }
            },
            Change::EndpointSlice(key) => match view.slices.get(key) {
                Some(slice) => dns.apply_slice(slice),
                None => {
                    dns.delete_slice(&key.namespace, &key.name);
                    Ok(())
                }
            },
            Change::DnsConfig => {
                config(dns, host, view, events);
                Ok(())
            }
            Change::Node(_)
            | Change::Ingress
            | Change::NetworkPolicy(_)
            | Change::Namespace(_)
            | Change::Pod(_)
            | Change::Relisted => Ok(()),
        };
        if let Err(error) = added {
            tracing::warn!(%error, "not in cluster DNS");
        }
    }
}
