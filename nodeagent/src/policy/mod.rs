//! NetworkPolicy (`networking.k8s.io/v1`), enforced on this node's Pods with nftables, as a
//! CNI plugin's policy agent does.
//!
//! `desired` is the pure core (policies, Pods and Namespaces in, each local Pod's allows out);
//! `elements` turns a Pod's allows into disjoint set elements; `nft` is the layout (a table of
//! fixed rules and named sets, so a Pod that comes or goes is a few element changes). The
//! [`Policier`] here keeps the elements the kernel holds per local Pod address: a full sync
//! (`nft -f`) at start-up and after a failure, otherwise the element changes around the
//! addresses at which a Pod's allows changed (`elements::update`), as one netlink transaction.
//!
//! Same-node Pod traffic crosses the CNI bridge; the `forward` hook sees it only with
//! `net.bridge.bridge-nf-call-iptables` = 1 (br_netfilter's default), which a full sync checks.

pub mod allows;
pub mod desired;
pub mod elements;
pub mod follow;
pub mod nft;
#[cfg(test)]
mod random;
mod selector;

pub use desired::{CompiledPolicy, Direction, Key, Policies, PolicyPod};
pub use nft::{PodSets, SetChange};

use crate::proxy::ProxyError;
use std::collections::{BTreeMap, BTreeSet, btree_map};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

const BRIDGE_NF: &str = "/proc/sys/net/bridge/bridge-nf-call-iptables";

/// What one [`Policier::sync`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyncReport {
    pub full: bool,
    /// Local Pod addresses whose elements changed (all isolated ones on a full sync).
    pub pods: usize,
    /// Elements deleted and added (all of them on a full sync).
    pub elements: usize,
    /// The part of `duration` spent working out what to change.
    pub planned: Duration,
    pub duration: Duration,
}

/// What a sync is to do.
#[derive(Clone, Debug)]
pub enum Plan {
    /// Rewrite the table: every isolated local Pod address's sets, as `nft -f` text.
    Full { sets: BTreeMap<Ipv4Addr, PodSets>, text: String },
    /// Element changes.
    Changes(Vec<SetChange>),
}

/// The NetworkPolicy enforcement of one node.
pub struct Policier {
    pub policies: Policies,
    /// What the kernel holds, per local Pod address.
    applied: BTreeMap<Ipv4Addr, PodSets>,
    /// The address each local Pod had when last looked at, and the local Pods of each address:
    /// two share one only while one is finishing; the first decides the address's sets.
    addresses: BTreeMap<Key, Ipv4Addr>,
    owners: BTreeMap<Ipv4Addr, BTreeSet<Key>>,
    full_pending: bool,
}

impl Policier {
    pub fn new(node: &str) -> Policier {
        Policier {
            policies: Policies::new(node),
            applied: BTreeMap::new(),
            addresses: BTreeMap::new(),
            owners: BTreeMap::new(),
            full_pending: true,
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

    fn owner(&self, ip: &Ipv4Addr) -> Option<&Key> {
        self.owners.get(ip).and_then(|keys| keys.first())
    }

    fn set_address(&mut self, key: &Key, ip: Option<Ipv4Addr>) {
        if let Some(old) = self.addresses.remove(key)
            && let btree_map::Entry::Occupied(mut keys) = self.owners.entry(old)
        {
            keys.get_mut().remove(key);
            if keys.get().is_empty() {
                keys.remove();
            }
        }
        if let Some(ip) = ip {
            self.addresses.insert(key.clone(), ip);
            self.owners.entry(ip).or_default().insert(key.clone());
        }
    }

    /// What the next sync is to do (pure: for benchmarks and tests; [`Policier::commit`]
    /// records that it was done).
    pub fn plan(&mut self) -> Plan {
        let changes = self.policies.take_changes();
        if self.full_pending {
            let local: Vec<(Key, Ipv4Addr)> = self.policies.local_pods().map(|p| (p.key(), p.ip)).collect();
            self.addresses.clear();
            self.owners.clear();
            for (key, ip) in local {
                self.set_address(&key, Some(ip));
            }
            let sets: BTreeMap<Ipv4Addr, PodSets> = self
                .owners
                .iter()
                .filter_map(|(ip, keys)| {
                    let rules = self.policies.rules(keys.first()?)?;
                    let sets = PodSets {
                        ingress: rules.ingress.as_ref().map(elements::elements),
                        egress: rules.egress.as_ref().map(elements::elements),
                    };
                    Some((*ip, sets))
                })
                .collect();
            let text = nft::full(sets.iter().map(|(ip, s)| (*ip, s)));
            return Plan::Full { sets, text };
        }
        // Per address: where its owner's allows changed, `None` for anywhere.
        let mut dirty: BTreeMap<Ipv4Addr, Option<Vec<(u32, u32)>>> = BTreeMap::new();
        for (key, at) in changes {
            let old = self.addresses.get(&key).copied();
            let new = self.policies.local_pod(&key).map(|p| p.ip);
            if old != new {
                self.set_address(&key, new);
                dirty.extend(old.into_iter().chain(new).map(|ip| (ip, None)));
                continue;
            }
            // Another Pod of the address decides its sets.
            let Some(ip) = new.filter(|ip| self.owner(ip) == Some(&key)) else { continue };
            match (dirty.entry(ip), at) {
                (btree_map::Entry::Vacant(e), at) => {
                    e.insert(at);
                }
                (btree_map::Entry::Occupied(mut e), Some(at)) => e.get_mut().iter_mut().for_each(|v| v.extend(&at)),
                (btree_map::Entry::Occupied(mut e), None) => *e.get_mut() = None,
            }
        }
        let mut changes = Vec::new();
        for (ip, at) in dirty {
            let rules = self.owner(&ip).and_then(|k| self.policies.rules(k));
            let applied = self.applied.get(&ip);
            for direction in [Direction::Ingress, Direction::Egress] {
                let before = applied.and_then(|s| s.get(direction));
                let after = rules.and_then(|r| r.get(direction));
                let (gone, came) = match (before, after, &at) {
                    (Some(old), Some(allows), Some(at)) => elements::update(old, allows, at),
                    _ => {
                        let old = before.map_or(&[][..], Vec::as_slice);
                        let new = after.map(elements::elements).unwrap_or_default();
                        let gone = old.iter().filter(|e| new.binary_search(e).is_err()).copied().collect();
                        let came = new.iter().filter(|e| old.binary_search(e).is_err()).copied().collect();
                        (gone, came)
                    }
                };
                let isolated = (before.is_some(), after.is_some());
                if isolated.0 != isolated.1 || !gone.is_empty() || !came.is_empty() {
                    changes.push(SetChange { pod: ip, direction, isolated, gone, came });
                }
            }
        }
        Plan::Changes(changes)
    }

    /// Records that a plan was carried out.
    pub fn commit(&mut self, plan: Plan) {
        let changes = match plan {
            Plan::Full { sets, .. } => {
                self.applied = sets;
                self.full_pending = false;
                return;
            }
            Plan::Changes(changes) => changes,
        };
        for c in changes {
            let sets = self.applied.entry(c.pod).or_default();
            let slot = sets.get_mut(c.direction);
            if c.isolated.1 {
                let mut elements = slot.take().unwrap_or_default();
                elements.retain(|e| c.gone.binary_search(e).is_err());
                elements.extend(c.came);
                elements.sort_unstable();
                *slot = Some(elements);
            } else {
                *slot = None;
            }
            if sets.ingress.is_none() && sets.egress.is_none() {
                self.applied.remove(&c.pod);
            }
        }
    }

    /// Brings the kernel in step. Blocks on `nft`: call it from a blocking thread. The rules go
    /// to the network namespace of the calling thread.
    pub fn sync(&mut self) -> Result<SyncReport, ProxyError> {
        let start = Instant::now();
        let plan = self.plan();
        let planned = start.elapsed();
        let (full, pods, elements) = match &plan {
            Plan::Full { sets, .. } => {
                let elements = sets.values().flat_map(|s| [&s.ingress, &s.egress]).flatten().map(Vec::len).sum();
                (true, sets.len(), elements)
            }
            Plan::Changes(changes) => {
                let pods: BTreeSet<Ipv4Addr> = changes.iter().map(|c| c.pod).collect();
                (false, pods.len(), changes.iter().map(|c| c.gone.len() + c.came.len()).sum())
            }
        };
        match &plan {
            Plan::Full { text, .. } => {
                if std::fs::read_to_string(BRIDGE_NF).is_ok_and(|v| v.trim() != "1") {
                    tracing::warn!(
                        "{BRIDGE_NF} is not 1: traffic between Pods of this node bypasses NetworkPolicy; set it to 1"
                    );
                }
                if let Err(e) = crate::proxy::run_nft(text) {
                    // The kernel kept its old state; ours ran ahead: repair with a full sync.
                    self.full_pending = true;
                    return Err(e);
                }
            }
            // Element changes go over netlink: `nft -f` reads a large interval set back for its
            // checks (0.2-0.45 s per change at 15,000 elements), the kernel does not.
            Plan::Changes(changes) => {
                if let Err(e) = nft::transaction(changes).commit() {
                    // The transaction was all or nothing; rewrite the whole table with `nft -f`.
                    tracing::warn!("network policy element update failed ({e}); rewriting the whole table");
                    self.full_pending = true;
                    return self.sync();
                }
            }
        }
        self.commit(plan);
        let report = SyncReport { full, pods, elements, planned, duration: start.elapsed() };
        tracing::debug!(
            full,
            pods,
            elements,
            duration_ms = report.duration.as_millis() as u64,
            "network policy synced"
        );
        Ok(report)
    }

    /// Removes the table (the node stops enforcing); the next sync is a full one.
    pub fn remove_rules(&mut self) -> Result<(), ProxyError> {
        self.full_pending = true;
        self.applied.clear();
        crate::proxy::run_nft(&nft::removal())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use random::{NODE, Random};

    /// The sets each local Pod address should have, computed afresh from the inputs.
    fn afresh(p: &Policies) -> BTreeMap<Ipv4Addr, PodSets> {
        let mut seen = BTreeSet::new();
        let mut out = BTreeMap::new();
        // In key order: the first Pod of an address decides its sets.
        for pod in p.local_pods().filter(|pod| seen.insert(pod.ip)) {
            let rules = p.pod_rules(&pod.key());
            if rules.ingress.is_some() || rules.egress.is_some() {
                let sets = PodSets {
                    ingress: rules.ingress.as_ref().map(elements::elements),
                    egress: rules.egress.as_ref().map(elements::elements),
                };
                out.insert(pod.ip, sets);
            }
        }
        out
    }

    /// Through random changes, every partial plan deletes only elements the kernel holds and
    /// adds only ones it lacks, and leaves it with what a fresh computation gives.
    #[test]
    fn element_changes_follow_random_changes() {
        let mut random = Random(0x853c_49e6_748f_ea9b);
        for _ in 0..30 {
            let mut policier = Policier::new(NODE);
            let plan = policier.plan();
            policier.commit(plan);
            for step in 0..150 {
                random::change(&mut policier.policies, &mut random);
                if random.below(3) != 0 {
                    continue;
                }
                let plan = policier.plan();
                let Plan::Changes(changes) = &plan else { panic!("step {step}: a full plan") };
                for c in changes {
                    let held = policier.applied.get(&c.pod).and_then(|s| s.get(c.direction));
                    assert_eq!(held.is_some(), c.isolated.0, "step {step}: {c:?}");
                    let held = held.map_or(&[][..], Vec::as_slice);
                    assert!(c.gone.iter().all(|e| held.contains(e)), "step {step}: deletes what is not there: {c:?}");
                    assert!(
                        c.came.iter().all(|e| !held.contains(e) || c.gone.contains(e)),
                        "step {step}: adds what is there: {c:?}"
                    );
                }
                policier.commit(plan);
                assert_eq!(policier.applied, afresh(&policier.policies), "step {step}");
            }
        }
    }
}
