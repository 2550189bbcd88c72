//! The node's Ingress controller: the routing table of `gitplane_api::ingress` (the pure core)
//! built from the agent's view of the network, and an HTTP / HTTPS reverse proxy that serves it
//! on the node's address ([`proxy`]), with certificates picked by SNI ([`tls`]) and upgraded
//! connections passed through until closed or idle ([`tunnel`]), within the bounds of
//! [`limits`].
//!
//! A change of an Ingress, Service, EndpointSlice, IngressClass or TLS Secret rebuilds the table
//! and swaps it in whole ([`Routes::store`]): a request routes by the table it started with, so a
//! route change never drops a request in flight nor answers one with an error.

pub mod limits;
pub mod proxy;
pub mod tls;
mod tunnel;

use crate::network::view::{Change, Network, View, next_changes};
pub use gitplane_api::ingress::PathMatch;
use gitplane_api::ingress::{Inputs, Problem, RouteTable};
use std::{
    collections::BTreeSet,
    net::IpAddr,
    sync::{Arc, PoisonError, RwLock},
};
use tokio::sync::watch;

/// Where the Ingress controller listens; a port of 0 turns that listener off.
#[derive(Clone, Debug)]
pub struct IngressConfig {
    pub address: IpAddr,
    pub http_port: u16,
    pub https_port: u16,
}

/// What requests are routed by, as of one view of the cluster.
#[derive(Default)]
pub struct Snapshot {
    pub table: RouteTable,
    pub certificates: tls::Certificates,
}

/// The current snapshot, swapped whole on every change.
#[derive(Default)]
pub struct Routes {
    current: RwLock<Arc<Snapshot>>,
}

impl Routes {
    pub fn load(&self) -> Arc<Snapshot> {
        self.current.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    pub fn store(&self, snapshot: Snapshot) {
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(snapshot);
    }
}

/// The routing table of a view.
pub fn table(view: &View) -> RouteTable {
    let mut inputs = Inputs {
        ingresses: view.ingresses.values().map(|i| &**i).collect(),
        classes: view.ingress_classes.values().map(|c| &**c).collect(),
        ..Default::default()
    };
    view.services.values().for_each(|s| inputs.add_service(s));
    view.slices.values().for_each(|s| inputs.add_slice(s));
    RouteTable::build(&inputs)
}

/// Keeps `routes` in step with `network` until `shutdown`.
pub async fn follow(routes: &Routes, network: &Network, mut shutdown: watch::Receiver<bool>) {
    let mut changes = network.subscribe();
    tokio::select! {
        _ = shutdown.wait_for(|s| *s) => return,
        _ = network.synced() => {}
    }
    let mut reported = BTreeSet::new();
    let mut cache = tls::CertificateCache::default();
    rebuild(routes, &network.view(), &mut cache, &mut reported);
    loop {
        let batch = tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return,
            batch = next_changes(&mut changes) => batch,
        };
        let Some(batch) = batch else { return };
        let relevant = batch
            .iter()
            .any(|c| matches!(c, Change::Ingress | Change::Service(_) | Change::EndpointSlice(_) | Change::Relisted));
        if relevant {
            rebuild(routes, &network.view(), &mut cache, &mut reported);
        }
    }
}

fn rebuild(routes: &Routes, view: &View, cache: &mut tls::CertificateCache, reported: &mut BTreeSet<Problem>) {
    let started = std::time::Instant::now();
    let table = table(view);
    let (certificates, broken) = cache.certificates(&table, &view.tls_secrets);
    // Each problem is logged once, when it appears (the control plane records it as an Event).
    let now: BTreeSet<Problem> = table.problems.iter().cloned().chain(broken).collect();
    for p in now.difference(reported) {
        tracing::warn!(ingress = %format!("{}/{}", p.ingress.0, p.ingress.1), reason = p.reason, "{}", p.message);
    }
    *reported = now;
    let paths = table.len();
    routes.store(Snapshot { table, certificates });
    tracing::debug!(paths, took = ?started.elapsed(), "ingress routes swapped in");
}
