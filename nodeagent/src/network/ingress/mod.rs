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
pub mod sni;
pub mod tls;
mod tunnel;

use crate::network::{
    follow::Consumer,
    view::{Change, View},
};
pub use gitplane_api::ingress::PathMatch;
use gitplane_api::ingress::{Inputs, Problem, RouteTable};
use std::{
    collections::BTreeSet,
    net::IpAddr,
    sync::{Arc, PoisonError, RwLock},
};

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

/// The Ingress routes as a reader of the view ([`crate::network::follow`]): the table is
/// rebuilt on a change of what it is made of, and each problem logged once, when it appears.
pub struct Feed {
    pub routes: Arc<Routes>,
    cache: tls::CertificateCache,
    reported: BTreeSet<Problem>,
}

impl Feed {
    pub fn new(routes: Arc<Routes>) -> Self {
        Feed { routes, cache: tls::CertificateCache::default(), reported: BTreeSet::new() }
    }
}

impl Consumer for Feed {
    type Error = std::convert::Infallible;

    fn relist(&mut self, view: &View) {
        rebuild(&self.routes, view, &mut self.cache, &mut self.reported);
    }

    fn apply(&mut self, view: &View, batch: &[Change]) {
        let relevant = batch
            .iter()
            .any(|c| matches!(c, Change::Ingress | Change::Service(_) | Change::EndpointSlice(_) | Change::Relisted));
        if relevant {
            rebuild(&self.routes, view, &mut self.cache, &mut self.reported);
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
