//! Cluster DNS fed from the agent's view of the network ([`Network`]): Services and
//! EndpointSlices into the zone as they change (a fresh list replaces the zone whole), and the
//! `kube-system/kube-dns` ConfigMap into the forwarding table over the node's resolvers.

use super::{Dns, ResolvConf};
use crate::network::{Change, Network, View, next_changes};
use tokio::sync::watch;

/// Keeps `dns` in step with `network` until `shutdown`.
pub async fn run(dns: &Dns, host: &ResolvConf, network: &Network, mut shutdown: watch::Receiver<bool>) {
    let mut changes = network.subscribe();
    tokio::select! {
        _ = shutdown.wait_for(|s| *s) => return,
        _ = network.synced() => {}
    }
    relist(dns, host, &network.view());
    loop {
        let batch = tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return,
            batch = next_changes(&mut changes) => batch,
        };
        let Some(batch) = batch else { return };
        apply(dns, host, &network.view(), &batch);
    }
}

fn relist(dns: &Dns, host: &ResolvConf, view: &View) {
    let errors = dns.replace_all(view.services.values().map(|s| &**s), view.slices.values().map(|s| &**s));
    for error in errors {
        tracing::warn!(%error, "not in cluster DNS");
    }
    config(dns, host, view);
}

fn config(dns: &Dns, host: &ResolvConf, view: &View) {
    match &view.dns_config {
        Some(config_map) => {
            if let Err(error) = dns.apply_config_map(host, config_map) {
                tracing::warn!(%error, "kube-system/kube-dns not applied; the forwarding in force stays");
            }
        }
        None => dns.delete_config_map(host),
    }
}

fn apply(dns: &Dns, host: &ResolvConf, view: &View, batch: &[Change]) {
    if batch.contains(&Change::Relisted) {
        return relist(dns, host, view);
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
                config(dns, host, view);
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
