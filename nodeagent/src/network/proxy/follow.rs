//! The proxy fed from the agent's view of the network ([`crate::network::follow`]): every
//! change of a Service or EndpointSlice goes into the [`Proxier`], then one sync on a blocking
//! thread programs what changed (a failed sync is a full one, as the Proxier decides).

use super::{Proxier, ProxyError};
use crate::network::{
    follow::Consumer,
    view::{Change, View},
};

impl Consumer for Proxier {
    const SYNCS: bool = true;
    const NOT_SYNCED: &'static str = "service rules not programmed";
    type Error = ProxyError;

    fn relist(&mut self, view: &View) {
        relist(self, view)
    }

    fn apply(&mut self, view: &View, batch: &[Change]) {
        apply(self, view, batch)
    }

    fn sync(&mut self) -> Result<(), ProxyError> {
        let report = Proxier::sync(self)?;
        crate::metrics::proxy_synced(report.duration);
        if report.full {
            tracing::info!(services = report.services, took = ?report.duration, "service rules programmed");
        } else if report.services > 0 {
            tracing::debug!(services = report.services, took = ?report.duration, "service rules updated");
        }
        Ok(())
    }
}

fn relist(proxier: &mut Proxier, view: &View) {
    let services = view.services.values().map(|s| (**s).clone()).collect();
    let slices = view.slices.values().map(|s| (**s).clone()).collect();
    proxier.replace_all(services, slices);
}

/// Feeds one batch of changes, read from the view as it is now.
fn apply(proxier: &mut Proxier, view: &View, batch: &[Change]) {
    if batch.contains(&Change::Relisted) {
        return relist(proxier, view);
    }
    for change in batch {
        match change {
            Change::Service(key) => match view.services.get(key) {
                Some(service) => proxier.update_service((**service).clone()),
                None => proxier.delete_service(&key.namespace, &key.name),
            },
            Change::EndpointSlice(key) => match view.slices.get(key) {
                Some(slice) => proxier.update_endpoint_slice((**slice).clone()),
                None => proxier.delete_endpoint_slice(&key.namespace, &key.name),
            },
            Change::Node(_)
            | Change::DnsConfig
            | Change::Ingress
            | Change::NetworkPolicy(_)
            | Change::Namespace(_)
            | Change::Pod(_)
            | Change::Relisted => {}
        }
    }
}
