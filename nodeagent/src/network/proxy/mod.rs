//! kube-proxy's role: Services and EndpointSlices to packet-filter rules on this node.
//!
//! `desired` is the pure core (objects in, [`ServicePort`]s out). `nft` and `iptables` are pure
//! layouts (ports in, rule text out, in full or as the change between two states). The
//! appliers in this file only run that text (`nft -f`, `iptables-restore`) and keep the state
//! the text was computed against. [`Proxier`] is the seam the agent calls: feed it the watch's
//! Services and EndpointSlices, call [`Proxier::sync`], and it decides between a full sync
//! (start-up, after a failure, on request) and a partial one (only the Services that changed).
//!
//! `sync` blocks on the `nft` / `iptables-restore` child (milliseconds for a partial sync):
//! call it from a blocking thread. The rules go to the network namespace of the calling
//! thread (children inherit it), which is how the tests aim it at their own namespaces.

pub mod desired;
pub mod follow;
pub mod iptables;
pub mod nft;

pub use desired::{Ipv4Cidr, NodeContext, ObjectKey, ServicePort};

use super::netfilter::{self, CommandError, NetlinkError, netlink};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

/// Which rules the proxy programs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// nftables, a table of its own (the default).
    Nftables,
    /// iptables-restore (Debian's nft-backed iptables), chains prefixed `GP-`.
    Iptables,
}

impl std::fmt::Display for Backend {
    /// As `--proxy-mode` takes it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Backend::Nftables => "nftables",
            Backend::Iptables => "iptables",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error(transparent)]
    Command(#[from] CommandError),
    #[error("reading {program}'s listing: {source}")]
    Listing { program: String, source: serde_json::Error },
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
}

/// What one [`Proxier::sync`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyncReport {
    /// A full sync (everything rewritten) rather than only the changed Services.
    pub full: bool,
    /// Services whose rules changed (all of them on a full sync).
    pub services: usize,
    pub duration: Duration,
    /// Services or ports that got no rules and why (an IPv6 address, an unknown protocol...).
    pub warnings: Vec<String>,
}

/// Carries out a layout's text and keeps the state it was computed against.
trait Applier: Send {
    fn full_sync(&mut self, services: &BTreeMap<ObjectKey, Vec<ServicePort>>) -> Result<(), ProxyError>;
    fn partial_sync(&mut self, changed: &[(&ObjectKey, &[ServicePort])]) -> Result<(), ProxyError>;
    /// Removes every rule of ours (the node stops serving Services).
    fn remove(&mut self) -> Result<(), ProxyError>;
}

struct NftApplier {
    rules: nft::NftRules,
}

impl NftApplier {
    /// Removes affinity entries of endpoints that are gone (`None`: check every entry).
    fn prune_affinity(&self, only: Option<&[String]>) -> Result<(), ProxyError> {
        // An entry may time out between the listing and the delete, which fails the whole
        // delete: list again, a few times.
        let mut last = Ok(());
        for _ in 0..3 {
            let listing = netfilter::run("nft", &["-j", "list", "map", "ip", nft::TABLE, nft::AFFINITY_MAP], None)?;
            let text = self
                .rules
                .stale_affinity(&listing, only)
                .map_err(|source| ProxyError::Listing { program: "nft".into(), source })?;
            if text.is_empty() {
                return Ok(());
            }
            last = netfilter::nft(&text).map_err(ProxyError::from);
            if last.is_ok() {
                return last;
            }
        }
        last
    }

    /// Chains of our table in the kernel now.
    fn existing_chains() -> Result<Vec<String>, ProxyError> {
        let listing = netfilter::run("nft", &["-j", "list", "chains", "ip"], None)?;
        let doc: serde_json::Value =
            serde_json::from_str(&listing).map_err(|source| ProxyError::Listing { program: "nft".into(), source })?;
        let objects = doc.get("nftables").and_then(|v| v.as_array()).cloned().unwrap_or_default();
        Ok(objects
            .iter()
            .filter_map(|o| o.get("chain"))
            .filter(|c| c.get("table").and_then(|t| t.as_str()) == Some(nft::TABLE))
            .filter_map(|c| c.get("name").and_then(|n| n.as_str()).map(str::to_owned))
            .collect())
    }
}

impl Applier for NftApplier {
    fn full_sync(&mut self, services: &BTreeMap<ObjectKey, Vec<ServicePort>>) -> Result<(), ProxyError> {
        let existing = Self::existing_chains()?;
        if existing.is_empty() {
            // Nothing programmed yet (start-up): the elements go over netlink, three times
            // cheaper than through nft's parser. Not one transaction, and there is nothing
            // a half-loaded table could break; a failure leaves a full sync pending.
            let text = self.rules.full_without_elements(services.iter().map(|(k, v)| (k, v.as_slice())));
            netfilter::nft(&text)?;
            for set in self.rules.set_elements() {
                netlink::add_elements(nft::TABLE, set.set, set.key, set.data, &set.elements)?;
            }
            return Ok(());
        }
        let text = self.rules.full(services.iter().map(|(k, v)| (k, v.as_slice())), &existing);
        netfilter::nft(&text)?;
        self.prune_affinity(None)
    }

    fn partial_sync(&mut self, changed: &[(&ObjectKey, &[ServicePort])]) -> Result<(), ProxyError> {
        let (text, removed) = self.rules.update(changed.iter().copied());
        if !text.is_empty() {
            netfilter::nft(&text)?;
        }
        if removed.is_empty() { Ok(()) } else { self.prune_affinity(Some(&removed)) }
    }

    fn remove(&mut self) -> Result<(), ProxyError> {
        Ok(netfilter::nft(&netfilter::table_removal(nft::TABLE))?)
    }
}

struct IptablesApplier {
    rules: iptables::IptablesRules,
}

impl Applier for IptablesApplier {
    fn full_sync(&mut self, services: &BTreeMap<ObjectKey, Vec<ServicePort>>) -> Result<(), ProxyError> {
        let existing = netfilter::run("iptables-save", &[], None)?;
        let text = self.rules.full(services.iter().map(|(k, v)| (k, v.as_slice())), &existing);
        netfilter::run("iptables-restore", &["-w", "--noflush"], Some(&text))?;
        Ok(())
    }

    fn partial_sync(&mut self, changed: &[(&ObjectKey, &[ServicePort])]) -> Result<(), ProxyError> {
        let text = self.rules.update(changed.iter().copied());
        if text.is_empty() {
            return Ok(());
        }
        netfilter::run("iptables-restore", &["-w", "--noflush"], Some(&text))?;
        Ok(())
    }

    fn remove(&mut self) -> Result<(), ProxyError> {
        let text = iptables::removal(&netfilter::run("iptables-save", &[], None)?);
        if text.is_empty() {
            return Ok(());
        }
        netfilter::run("iptables-restore", &["-w", "--noflush"], Some(&text))?;
        Ok(())
    }
}

/// The proxy of one node: the Services and EndpointSlices it has seen, the rules it computed
/// for each Service, and the applier that keeps the kernel in step.
pub struct Proxier {
    node: NodeContext,
    applier: Box<dyn Applier>,
    services: HashMap<ObjectKey, Service>,
    slices: HashMap<ObjectKey, EndpointSlice>,
    /// Slice -> the Service its label names, and the reverse.
    slice_service: HashMap<ObjectKey, ObjectKey>,
    service_slices: HashMap<ObjectKey, BTreeSet<ObjectKey>>,
    desired: BTreeMap<ObjectKey, Vec<ServicePort>>,
    warnings: BTreeMap<ObjectKey, Vec<String>>,
    dirty: BTreeSet<ObjectKey>,
    full_pending: bool,
}

fn object_key(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> ObjectKey {
    (meta.namespace.clone().unwrap_or_else(|| "default".into()), meta.name.clone().unwrap_or_default())
}

impl Proxier {
    pub fn new(node: NodeContext, backend: Backend) -> Self {
        let applier: Box<dyn Applier> = match backend {
            Backend::Nftables => Box::new(NftApplier { rules: nft::NftRules::new(node.clone()) }),
            Backend::Iptables => Box::new(IptablesApplier { rules: iptables::IptablesRules::new(node.clone()) }),
        };
        Proxier {
            node,
            applier,
            services: HashMap::new(),
            slices: HashMap::new(),
            slice_service: HashMap::new(),
            service_slices: HashMap::new(),
            desired: BTreeMap::new(),
            warnings: BTreeMap::new(),
            dirty: BTreeSet::new(),
            full_pending: true,
        }
    }

    /// A Service was added or changed.
    pub fn update_service(&mut self, service: Service) {
        let key = object_key(&service.metadata);
        if self.services.get(&key) != Some(&service) {
            self.dirty.insert(key.clone());
            self.services.insert(key, service);
        }
    }

    pub fn delete_service(&mut self, namespace: &str, name: &str) {
        let key = (namespace.to_owned(), name.to_owned());
        if self.services.remove(&key).is_some() {
            self.dirty.insert(key);
        }
    }

    /// An EndpointSlice was added or changed.
    pub fn update_endpoint_slice(&mut self, slice: EndpointSlice) {
        let key = object_key(&slice.metadata);
        if self.slices.get(&key) == Some(&slice) {
            return;
        }
        self.unlink_slice(&key);
        if let Some(service) = desired::slice_service(&slice) {
            self.dirty.insert(service.clone());
            self.service_slices.entry(service.clone()).or_default().insert(key.clone());
            self.slice_service.insert(key.clone(), service);
        }
        self.slices.insert(key, slice);
    }

    pub fn delete_endpoint_slice(&mut self, namespace: &str, name: &str) {
        let key = (namespace.to_owned(), name.to_owned());
        self.unlink_slice(&key);
        self.slices.remove(&key);
    }

    fn unlink_slice(&mut self, key: &ObjectKey) {
        if let Some(service) = self.slice_service.remove(key) {
            if let Some(set) = self.service_slices.get_mut(&service) {
                set.remove(key);
                if set.is_empty() {
                    self.service_slices.remove(&service);
                }
            }
            self.dirty.insert(service);
        }
    }

    /// Replaces everything seen so far (after a relist); only what differs becomes dirty.
    pub fn replace_all(&mut self, services: Vec<Service>, slices: Vec<EndpointSlice>) {
        let keep_services: BTreeSet<ObjectKey> = services.iter().map(|s| object_key(&s.metadata)).collect();
        let keep_slices: BTreeSet<ObjectKey> = slices.iter().map(|s| object_key(&s.metadata)).collect();
        let gone_services: Vec<ObjectKey> =
            self.services.keys().filter(|k| !keep_services.contains(*k)).cloned().collect();
        for (ns, name) in gone_services {
            self.delete_service(&ns, &name);
        }
        let gone_slices: Vec<ObjectKey> = self.slices.keys().filter(|k| !keep_slices.contains(*k)).cloned().collect();
        for (ns, name) in gone_slices {
            self.delete_endpoint_slice(&ns, &name);
        }
        for s in services {
            self.update_service(s);
        }
        for s in slices {
            self.update_endpoint_slice(s);
        }
    }

    /// The next sync rewrites everything (repair: someone flushed our table).
    pub fn request_full_sync(&mut self) {
        self.full_pending = true;
    }

    /// Removes every rule of ours from the kernel; the next sync is a full one.
    pub fn remove_rules(&mut self) -> Result<(), ProxyError> {
        self.full_pending = true;
        self.applier.remove()
    }

    /// What the rules say now for each Service (for status and tests).
    pub fn desired(&self) -> &BTreeMap<ObjectKey, Vec<ServicePort>> {
        &self.desired
    }

    /// Brings the kernel in step with what was fed in since the last sync.
    pub fn sync(&mut self) -> Result<SyncReport, ProxyError> {
        let start = Instant::now();
        let dirty = std::mem::take(&mut self.dirty);
        let mut changed: Vec<ObjectKey> = Vec::new();
        for key in dirty {
            let ports = match self.services.get(&key) {
                Some(service) => {
                    let slices: Vec<&EndpointSlice> = self
                        .service_slices
                        .get(&key)
                        .into_iter()
                        .flatten()
                        .filter_map(|k| self.slices.get(k))
                        .collect();
                    let rules = desired::service_rules(&self.node, service, &slices);
                    if rules.warnings.is_empty() {
                        self.warnings.remove(&key);
                    } else {
                        for w in &rules.warnings {
                            tracing::warn!(service = %format!("{}/{}", key.0, key.1), "{w}");
                        }
                        self.warnings.insert(key.clone(), rules.warnings);
                    }
                    rules.ports
                }
                None => {
                    self.warnings.remove(&key);
                    Vec::new()
                }
            };
            let old = self.desired.get(&key).map(Vec::as_slice).unwrap_or(&[]);
            if old != ports.as_slice() {
                changed.push(key.clone());
                if ports.is_empty() {
                    self.desired.remove(&key);
                } else {
                    self.desired.insert(key, ports);
                }
            }
        }
        let full = self.full_pending;
        let result = if full {
            self.applier.full_sync(&self.desired)
        } else if changed.is_empty() {
            Ok(())
        } else {
            let empty: Vec<ServicePort> = Vec::new();
            let list: Vec<(&ObjectKey, &[ServicePort])> =
                changed.iter().map(|k| (k, self.desired.get(k).unwrap_or(&empty).as_slice())).collect();
            self.applier.partial_sync(&list)
        };
        // A failed transaction left the kernel as it was but our state ahead of it: repair
        // with a full sync next time.
        self.full_pending = result.is_err();
        result?;
        let services = if full { self.desired.len() } else { changed.len() };
        let warnings = self
            .warnings
            .iter()
            .flat_map(|((ns, name), ws)| ws.iter().map(move |w| format!("Service {ns}/{name}: {w}")))
            .collect();
        let report = SyncReport { full, services, duration: start.elapsed(), warnings };
        tracing::debug!(full, services, duration_ms = report.duration.as_millis() as u64, "proxy rules synced");
        Ok(report)
    }
}
