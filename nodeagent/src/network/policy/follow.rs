//! NetworkPolicy fed from the agent's view of the network ([`crate::network::follow`]), as the
//! proxy is: each change of a policy, Namespace or Pod into the [`Policier`], then one sync on
//! a blocking thread (a failed one is retried as a full sync).

use super::{CompiledPolicy, Key, Policier, PolicyPod};
use crate::network::{
    follow::Consumer,
    netfilter::CommandError,
    view::{Change, View},
};
use gitplane_api::ObjectKey;
use std::collections::BTreeSet;

impl Consumer for Policier {
    const SYNCS: bool = true;
    const NOT_SYNCED: &'static str = "network policy not programmed";
    type Error = CommandError;

    fn relist(&mut self, view: &View) {
        relist(self, view)
    }

    fn apply(&mut self, view: &View, batch: &[Change]) {
        apply(self, view, batch)
    }

    fn sync(&mut self) -> Result<(), CommandError> {
        let report = Policier::sync(self)?;
        if report.full {
            tracing::info!(pods = report.pods, took = ?report.duration, "network policy programmed");
        } else if report.pods > 0 {
            tracing::debug!(pods = report.pods, took = ?report.duration, "network policy updated");
        }
        Ok(())
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
