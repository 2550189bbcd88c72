//! Cluster DNS in every agent (CoreDNS' role, served on the node as NodeLocal DNSCache is).
//!
//! - `records`: the pure zone, Services and EndpointSlices -> answers, updated per object.
//! - `message`: one request -> one response or a forward to carry out (hickory-proto codec).
//! - `forward`: the forwarding table and the kube-dns ConfigMap parser.
//! - `resolv`: the node's resolv.conf, and each Pod's DNS config for CRI.
//! - `server`: the sockets, threads and tasks.
//!
//! The agent owns one `Dns`, feeds it the watch's Services and EndpointSlices, and serves it
//! on the addresses it chose: `dns.serve(Listeners::bind(&["10.96.0.10:53".parse()?])?, ..)`.

pub mod follow;
pub mod forward;
pub mod message;
pub mod node_local;
pub mod records;
pub mod resolv;
pub mod server;
mod state;

use std::io;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;

pub use forward::{ConfigMapError, Forwarding};
pub use records::{Lookup, RecordsError, Zone, ZoneConfig};
pub use resolv::{PodDns, ResolvConf, pod_dns};
pub use server::{Listeners, Server, ServerConfig};
use state::{Shared, State};

/// The node's cluster DNS: cheap to clone, shared by the watch that updates it and the
/// servers that answer from it.
#[derive(Clone)]
pub struct Dns(Arc<Shared>);

impl Dns {
    pub fn new(zone: ZoneConfig, forwarding: Forwarding) -> Result<Dns, RecordsError> {
        let state = State { zone: Zone::new(zone)?, forwarding };
        Ok(Dns(Arc::new(Shared::new(state))))
    }

    /// Adds or replaces a Service; visible to the next query.
    pub fn apply_service(&self, service: &Service) -> Result<(), RecordsError> {
        self.0.write().zone.apply_service(service)
    }

    pub fn delete_service(&self, namespace: &str, name: &str) {
        self.0.write().zone.delete_service(namespace, name);
    }

    /// Adds or replaces an EndpointSlice (filed under its `kubernetes.io/service-name`).
    pub fn apply_slice(&self, slice: &EndpointSlice) -> Result<(), RecordsError> {
        self.0.write().zone.apply_slice(slice)
    }

    pub fn delete_slice(&self, namespace: &str, name: &str) {
        self.0.write().zone.delete_slice(namespace, name);
    }

    /// Replaces every Service and EndpointSlice at once (after a fresh list): the new zone is
    /// built aside and swapped in, so queries never see it half-filled. What could not be
    /// added is returned, the rest is served.
    pub fn replace_all<'a>(
        &self,
        services: impl IntoIterator<Item = &'a Service>,
        slices: impl IntoIterator<Item = &'a EndpointSlice>,
    ) -> Vec<RecordsError> {
        let cfg = self.0.read().zone.config().clone();
        // The config was accepted when this Dns was made.
        let Ok(mut zone) = Zone::new(cfg) else { return Vec::new() };
        let mut errors: Vec<RecordsError> = services.into_iter().filter_map(|s| zone.apply_service(s).err()).collect();
        errors.extend(slices.into_iter().filter_map(|s| zone.apply_slice(s).err()));
        self.0.write().zone = zone;
        errors
    }

    pub fn set_forwarding(&self, forwarding: Forwarding) {
        self.0.write().forwarding = forwarding;
    }

    /// Applies `kube-system/kube-dns` over the node's resolvers; a bad ConfigMap leaves the
    /// forwarding in force unchanged and says why.
    pub fn apply_config_map(&self, host: &ResolvConf, config_map: &ConfigMap) -> Result<(), ConfigMapError> {
        let apex = self.0.read().zone.apex().clone();
        let forwarding = Forwarding::from_config_map(host, config_map, &apex)?;
        self.set_forwarding(forwarding);
        Ok(())
    }

    /// The ConfigMap is gone: back to the node's resolvers.
    pub fn delete_config_map(&self, host: &ResolvConf) {
        self.set_forwarding(Forwarding::from_resolv_conf(host));
    }

    /// Serves UDP and TCP on the given sockets until the `Server` is dropped. Call inside a
    /// tokio runtime: TCP and forwarding run on it; UDP gets threads of its own.
    pub fn serve(&self, listeners: Listeners, cfg: ServerConfig) -> io::Result<Server> {
        server::serve(self.0.clone(), listeners, cfg)
    }
}
