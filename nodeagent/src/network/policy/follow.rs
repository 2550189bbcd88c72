//! NetworkPolicy fed from the agent's view of the network ([`Network`]), as `proxy::follow`
//! feeds the proxy: each change of a policy, Namespace or Pod into the [`Policier`], then one
//! sync on a blocking thread; changes that arrive meanwhile go into the next one; a failed sync
//! is retried with back-off as a full one.

use super::{CompiledPolicy, Key, Policier, PolicyPod};
use crate::network::view::{Change, Network, View, next_changes};
use gitplane_api::ObjectKey;
use std::collections::BTreeSet;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

const RETRY_MIN: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// Keeps the node's policy sets in step with `network` until `shutdown`; gives the Policier
/// back (to remove its table, if the node is leaving).
pub async fn run(mut policier: Policier, network: &Network, mut shutdown: watch::Receiver<bool>) -> Policier {
    let mut changes = network.subscribe();
    tokio::select! {
        _ = shutdown.wait_for(|s| *s) => return policier,
        _ = network.synced() => {}
    }
    relist(&mut policier, &network.view());
    let mut retry = RETRY_MIN;
    loop {
        let (back, result) = tokio::task::spawn_blocking(move || {
            let result = policier.sync();
            (policier, result)
        })
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        policier = back;
        let next_retry = match result {
            Ok(report) => {
                retry = RETRY_MIN;
                if report.full {
                    tracing::info!(pods = report.pods, took = ?report.duration, "network policy programmed");
                } else if report.pods > 0 {
                    tracing::debug!(pods = report.pods, took = ?report.duration, "network policy updated");
                }
                None
            }
            Err(error) => {
                tracing::warn!(%error, retry_in = ?retry, "network policy not programmed");
                let at = Instant::now() + retry;
                retry = (retry * 2).min(RETRY_MAX);
                Some(at)
            }
        };
        let batch = tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return policier,
            _ = tokio::time::sleep_until(next_retry.unwrap_or_else(Instant::now)), if next_retry.is_some() => continue,
            batch = next_changes(&mut changes) => batch,
        };
        let Some(batch) = batch else { return policier };
        apply(&mut policier, &network.view(), &batch);
    }
}

fn key(k: &ObjectKey) -> Key {
    (k.namespace.clone(), k.name.clone())
}

/// Feeds every object of the view: what is gone goes, the rest is set (unchanged objects
/// change nothing).
pub fn relist(policier: &mut Policier, view: &View) {
    let policies = &mut policier.policies;
    for name in policies.namespace_names() {
        if !view.namespaces.contains_key(&name) {
            policies.set_namespace(&name, None);
        }
    }
    for (name, ns) in &view.namespaces {
        policies.set_namespace(name, Some(ns.metadata.labels.clone().unwrap_or_default()));
    }
    let listed: BTreeSet<Key> = view.pods.keys().map(key).collect();
    for k in policies.pod_keys().into_iter().filter(|k| !listed.contains(k)) {
        policies.set_pod(k, None);
    }
    for (k, pod) in &view.pods {
        policies.set_pod(key(k), PolicyPod::from_pod(pod));
    }
    let listed: BTreeSet<Key> = view.policies.keys().map(key).collect();
    for k in policies.policy_keys().into_iter().filter(|k| !listed.contains(k)) {
        policies.set_policy(k, None);
    }
    for (k, policy) in &view.policies {
        policies.set_policy(key(k), Some(CompiledPolicy::new(policy)));
    }
}

/// Feeds one batch of changes, read from the view as it is now.
fn apply(policier: &mut Policier, view: &View, batch: &[Change]) {
    if batch.contains(&Change::Relisted) {
        return relist(policier, view);
    }
    let policies = &mut policier.policies;
    for change in batch {
        match change {
            Change::NetworkPolicy(k) => {
                policies.set_policy(key(k), view.policies.get(k).map(|p| CompiledPolicy::new(p)))
            }
            Change::Namespace(name) => policies.set_namespace(
                name,
                view.namespaces.get(name).map(|ns| ns.metadata.labels.clone().unwrap_or_default()),
            ),
            Change::Pod(k) => policies.set_pod(key(k), view.pods.get(k).and_then(|p| PolicyPod::from_pod(p))),
            Change::Service(_)
            | Change::EndpointSlice(_)
            | Change::Node(_)
            | Change::DnsConfig
            | Change::Ingress
            | Change::Relisted => {}
        }
    }
}
