//! NetworkPolicy (`networking.k8s.io/v1`), enforced on this node's Pods with nftables, as a
//! CNI plugin's policy agent does.
//!
//! `desired` is the pure core (policies, Pods and Namespaces in, each local Pod's allows out);
//! `elements` turns a Pod's allows into disjoint set elements; `nft` is the layout (a table of
//! fixed rules and named sets, so a Pod that comes or goes is a few element changes). The
//! [`Policier`] here keeps what the kernel was given and runs the text (`nft -f`): a full sync
//! at start-up and after a failure, otherwise only the elements of the Pods a change touched.
//!
//! Same-node Pod traffic crosses the CNI bridge; the `forward` hook sees it only with
//! `net.bridge.bridge-nf-call-iptables` = 1 (br_netfilter's default), which a full sync checks.

pub mod desired;
pub mod elements;
pub mod follow;
pub mod nft;
mod selector;

pub use desired::{CompiledPolicy, Key, Policies, PolicyPod};
pub use nft::PodSets;

use crate::proxy::ProxyError;
use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

const BRIDGE_NF: &str = "/proc/sys/net/bridge/bridge-nf-call-iptables";

/// What one [`Policier::sync`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyncReport {
    pub full: bool,
    /// Local Pods whose elements changed (all isolated ones on a full sync).
    pub pods: usize,
    pub duration: Duration,
}

/// The NetworkPolicy enforcement of one node.
pub struct Policier {
    pub policies: Policies,
    /// What the kernel holds, per local Pod address.
    applied: BTreeMap<Ipv4Addr, PodSets>,
    /// Local Pod addresses to look at again: those of dirty Pods, old and new.
    dirty: BTreeSet<Ipv4Addr>,
    /// The address each local Pod had when last looked at.
    addresses: BTreeMap<Key, Ipv4Addr>,
    full_pending: bool,
}

impl Policier {
    pub fn new(node: &str) -> Policier {
        Policier {
            policies: Policies::new(node),
            applied: BTreeMap::new(),
            dirty: BTreeSet::new(),
            addresses: BTreeMap::new(),
            full_pending: true,
        }
    }

    /// The sets each local Pod address should have now (None: no policy isolates it).
    fn desired(&self, ip: Ipv4Addr) -> Option<PodSets> {
        // Two local Pods never share an address for long (one is finishing); take the first.
        let pod = self.policies.local_pods().find(|p| p.ip == ip)?;
        let rules = self.policies.pod_rules(&pod.key());
        let sets = PodSets {
            ingress: rules.ingress.as_ref().map(elements::elements),
            egress: rules.egress.as_ref().map(elements::elements),
        };
        (sets.ingress.is_some() || sets.egress.is_some()).then_some(sets)
    }

    /// Collects the addresses of the Pods that changed since the last sync.
    fn collect_dirty(&mut self) {
        for key in self.policies.take_dirty() {
            if let Some(old) = self.addresses.remove(&key) {
                self.dirty.insert(old);
            }
            if let Some(pod) = self.policies.local_pod(&key) {
                self.dirty.insert(pod.ip);
                self.addresses.insert(key, pod.ip);
            }
        }
    }

    /// The next sync rewrites everything.
    pub fn request_full_sync(&mut self) {
        self.full_pending = true;
    }

    /// What the kernel was given for each isolated local Pod (for tests and status).
    pub fn applied(&self) -> &BTreeMap<Ipv4Addr, PodSets> {
        &self.applied
    }

    /// The text the next sync would run, and the state it leads to (pure, for benchmarks and
    /// tests): (full, text, changed addresses).
    pub fn plan(&mut self) -> (bool, String, BTreeMap<Ipv4Addr, Option<PodSets>>) {
        self.collect_dirty();
        if self.full_pending {
            self.dirty.clear();
            self.addresses = self.policies.local_pods().map(|p| (p.key(), p.ip)).collect();
            let all: BTreeMap<Ipv4Addr, Option<PodSets>> =
                self.addresses.values().map(|ip| (*ip, self.desired(*ip))).collect();
            let text = nft::full(all.iter().filter_map(|(ip, s)| Some((*ip, s.as_ref()?))));
            return (true, text, all);
        }
        let changes: BTreeMap<Ipv4Addr, Option<PodSets>> = std::mem::take(&mut self.dirty)
            .into_iter()
            .map(|ip| (ip, self.desired(ip)))
            .filter(|(ip, new)| self.applied.get(ip) != new.as_ref())
            .collect();
        let text = nft::update(changes.iter().map(|(ip, new)| (*ip, self.applied.get(ip), new.as_ref())));
        (false, text, changes)
    }

    /// Records that a plan's text was carried out.
    pub fn commit(&mut self, full: bool, state: BTreeMap<Ipv4Addr, Option<PodSets>>) {
        if full {
            self.applied.clear();
            self.full_pending = false;
        }
        for (ip, sets) in state {
            match sets {
                Some(sets) => self.applied.insert(ip, sets),
                None => self.applied.remove(&ip),
            };
        }
    }

    /// Brings the kernel in step. Blocks on `nft`: call it from a blocking thread. The rules go
    /// to the network namespace of the calling thread.
    pub fn sync(&mut self) -> Result<SyncReport, ProxyError> {
        let start = Instant::now();
        let (full, text, state) = self.plan();
        if full && std::fs::read_to_string(BRIDGE_NF).is_ok_and(|v| v.trim() != "1") {
            tracing::warn!(
                "{BRIDGE_NF} is not 1: traffic between Pods of this node bypasses NetworkPolicy; set it to 1"
            );
        }
        if full {
            if let Err(e) = crate::proxy::run_nft(&text) {
                // The kernel kept its old state; ours ran ahead: repair with a full sync.
                self.full_pending = true;
                return Err(e);
            }
        } else {
            // Element changes go over netlink: `nft -f` reads a large interval set back for its
            // checks (0.2-0.45 s per change at 15,000 elements), the kernel does not.
            let changes = nft::transaction(state.iter().map(|(ip, new)| (*ip, self.applied.get(ip), new.as_ref())));
            if let Err(e) = changes.commit() {
                // The transaction was all or nothing; rewrite the whole table with `nft -f`.
                tracing::warn!("network policy element update failed ({e}); rewriting the whole table");
                self.full_pending = true;
                return self.sync();
            }
        }
        let pods = if full { state.values().filter(|s| s.is_some()).count() } else { state.len() };
        self.commit(full, state);
        let report = SyncReport { full, pods, duration: start.elapsed() };
        tracing::debug!(full, pods, duration_ms = report.duration.as_millis() as u64, "network policy synced");
        Ok(report)
    }

    /// Removes the table (the node stops enforcing); the next sync is a full one.
    pub fn remove_rules(&mut self) -> Result<(), ProxyError> {
        self.full_pending = true;
        self.applied.clear();
        crate::proxy::run_nft(&nft::removal())
    }
}
