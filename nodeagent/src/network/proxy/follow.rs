//! The proxy fed from the agent's view of the network ([`Network`]): every change of a Service
//! or EndpointSlice goes into the [`Proxier`], then one sync on a blocking thread programs what
//! changed; changes that arrive during a sync are taken together by the next one. A failed sync
//! is retried with back-off (and is a full one, as the Proxier decides).

use super::Proxier;
use crate::network::view::{Change, Network, View, next_changes};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

const RETRY_MIN: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// Keeps the node's Service rules in step with `network` until `shutdown`; gives the Proxier
/// back (to remove its rules, if the node is leaving).
pub async fn run(mut proxier: Proxier, network: &Network, mut shutdown: watch::Receiver<bool>) -> Proxier {
    let mut changes = network.subscribe();
    tokio::select! {
        _ = shutdown.wait_for(|s| *s) => return proxier,
        _ = network.synced() => {}
    }
    relist(&mut proxier, &network.view());
    let mut retry = RETRY_MIN;
    loop {
        let (back, result) = tokio::task::spawn_blocking(move || {
            let result = proxier.sync();
            (proxier, result)
        })
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        proxier = back;
        let next_retry = match result {
            Ok(report) => {
                retry = RETRY_MIN;
                crate::metrics::proxy_synced(report.duration);
                if report.full {
                    tracing::info!(services = report.services, took = ?report.duration, "service rules programmed");
                } else if report.services > 0 {
                    tracing::debug!(services = report.services, took = ?report.duration, "service rules updated");
                }
                None
            }
            Err(error) => {
                tracing::warn!(%error, retry_in = ?retry, "service rules not programmed");
                let at = Instant::now() + retry;
                retry = (retry * 2).min(RETRY_MAX);
                Some(at)
            }
        };
        let batch = tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return proxier,
            _ = tokio::time::sleep_until(next_retry.unwrap_or_else(Instant::now)), if next_retry.is_some() => continue,
            batch = next_changes(&mut changes) => batch,
        };
        let Some(batch) = batch else { return proxier };
        apply(&mut proxier, &network.view(), &batch);
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
