//! NetworkPolicy (`networking.k8s.io/v1`), enforced on this node's Pods with nftables, as a
//! CNI plugin's policy agent does.
//!
//! `desired` is the pure core (policies, Pods and Namespaces in, each local Pod's allows out);
//! `elements` turns a Pod's allows into elements (one per peer address, disjoint boxes for
//! address ranges); `nft` is the layout (a table of fixed rules, named sets and maps, so a Pod
//! that comes or goes is a few element changes). The [`Policier`] here keeps the elements the
//! kernel holds per local Pod address: a full sync (`nft -f`) at start-up and after a failure,
//! otherwise the element changes at the addresses where a Pod's allows changed, as one netlink
//! transaction (after `nft -f` adds the chain of any new port class).
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

pub use desired::{CompiledPolicy, Direction, Key, Policies, PolicyPod};

use allows::Allows;
pub use nft::{Classes, PodSets, SetChange, Sets};

use crate::network::netfilter::{self, CommandError};
use std::collections::{BTreeMap, BTreeSet, btree_map};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

const BRIDGE_NF: &str = "/proc/sys/net/bridge/bridge-nf-call-iptables";

/// A Pod's sets in one direction from its allows.
fn fresh(allows: &Allows, classes: &mut Classes) -> Sets {
    let peers = elements::peers(allows, (0, u32::MAX)).into_iter().map(|(peer, reach)| (peer, classes.id(reach)));
    Sets { spans: elements::elements(allows), peers: peers.collect() }
}

/// The peers map changes (gone, came) from `old` to `new`: a peer whose class changed is both.
fn diff(old: &BTreeMap<u32, u32>, new: &BTreeMap<u32, u32>) -> (Vec<u32>, Vec<(u32, u32)>) {
    let gone = old.iter().filter(|(p, c)| new.get(p) != Some(c)).map(|(p, _)| *p).collect();
    let came = new.iter().filter(|(p, c)| old.get(p) != Some(c)).map(|(p, c)| (*p, *c)).collect();
    (gone, came)
}

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
    /// Element changes, after `chains` (`nft -f` text, empty if none) adds new port classes.
    Changes { changes: Vec<SetChange>, chains: String },
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
    /// The port classes the peers maps name.
    classes: Classes,
    full_pending: bool,
}

impl Policier {
    pub fn new(node: &str) -> Policier {
        Policier {
            policies: Policies::new(node),
            applied: BTreeMap::new(),
            addresses: BTreeMap::new(),
            owners: BTreeMap::new(),
            classes: Classes::default(),
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
            // Numbered afresh: the table is rewritten with the chains of the classes in use.
            self.classes = Classes::default();
            let mut sets = BTreeMap::new();
            for (ip, keys) in &self.owners {
                let Some(rules) = keys.first().and_then(|k| self.policies.rules(k)) else { continue };
                let mut of = |allows: Option<&Allows>| allows.map(|a| fresh(a, &mut self.classes));
                let pod = PodSets { ingress: of(rules.ingress.as_ref()), egress: of(rules.egress.as_ref()) };
                sets.insert(*ip, pod);
            }
            let text = nft::full(sets.iter().map(|(ip, s)| (*ip, s)), &self.classes);
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
                let mut change = SetChange::new(ip, direction, (before.is_some(), after.is_some()));
                match (before, after, &at) {
                    (Some(old), Some(allows), Some(at)) => {
                        (change.gone, change.came) = elements::update(&old.spans, allows, at);
                        // The peers at the changed addresses, before and after.
                        let mut new = BTreeMap::new();
                        for &(lo, hi) in at {
                            for (peer, reach) in elements::peers(allows, (lo, hi)) {
                                new.insert(peer, self.classes.id(reach));
                            }
                        }
                        let old: BTreeMap<u32, u32> =
                            at.iter().flat_map(|&(lo, hi)| old.peers.range(lo..=hi).map(|(p, c)| (*p, *c))).collect();
                        (change.peers_gone, change.peers_came) = diff(&old, &new);
                    }
                    _ => {
                        let empty = Sets::default();
                        let old = before.unwrap_or(&empty);
                        let new = after.map(|a| fresh(a, &mut self.classes)).unwrap_or_default();
                        change.gone =
                            old.spans.iter().filter(|e| new.spans.binary_search(e).is_err()).copied().collect();
                        change.came =
                            new.spans.iter().filter(|e| old.spans.binary_search(e).is_err()).copied().collect();
                        (change.peers_gone, change.peers_came) = diff(&old.peers, &new.peers);
                    }
                };
                if change.isolated.0 != change.isolated.1 || !change.is_empty() {
                    changes.push(change);
                }
            }
        }
        Plan::Changes { changes, chains: self.classes.undeclared() }
    }

    /// Records that a plan was carried out.
    pub fn commit(&mut self, plan: Plan) {
        self.classes.declared();
        let changes = match plan {
            Plan::Full { sets, .. } => {
                self.applied = sets;
                self.full_pending = false;
                return;
            }
            Plan::Changes { changes, .. } => changes,
        };
        for c in changes {
            let sets = self.applied.entry(c.pod).or_default();
            let slot = sets.get_mut(c.direction);
            if c.isolated.1 {
                let mut held = slot.take().unwrap_or_default();
                held.spans.retain(|e| c.gone.binary_search(e).is_err());
                held.spans.extend(c.came);
                held.spans.sort_unstable();
                for peer in c.peers_gone {
                    held.peers.remove(&peer);
                }
                held.peers.extend(c.peers_came);
                *slot = Some(held);
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
    pub fn sync(&mut self) -> Result<SyncReport, CommandError> {
        let start = Instant::now();
        let plan = self.plan();
        let planned = start.elapsed();
        let (full, pods, elements) = match &plan {
            Plan::Full { sets, .. } => {
                let elements = sets.values().flat_map(|s| [&s.ingress, &s.egress]).flatten().map(Sets::len).sum();
                (true, sets.len(), elements)
            }
            Plan::Changes { changes, .. } => {
                let pods: BTreeSet<Ipv4Addr> = changes.iter().map(|c| c.pod).collect();
                (false, pods.len(), changes.iter().map(SetChange::len).sum())
            }
        };
        match &plan {
            Plan::Full { text, .. } => {
                if std::fs::read_to_string(BRIDGE_NF).is_ok_and(|v| v.trim() != "1") {
                    tracing::warn!(
                        "{BRIDGE_NF} is not 1: traffic between Pods of this node bypasses NetworkPolicy; set it to 1"
                    );
                }
                if let Err(e) = netfilter::nft(text) {
                    // The kernel kept its old state; ours ran ahead: repair with a full sync.
                    self.full_pending = true;
                    return Err(e);
                }
            }
            // Element changes go over netlink: `nft -f` reads a large interval set back for its
            // checks (0.2-0.45 s per change at 15,000 elements), the kernel does not.
            Plan::Changes { changes, chains } => {
                let done = match chains.is_empty() {
                    true => Ok(()),
                    false => netfilter::nft(chains).map_err(|e| e.to_string()),
                };
                if let Err(e) = done.and_then(|()| nft::transaction(changes).commit().map_err(|e| e.to_string())) {
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
    pub fn remove_rules(&mut self) -> Result<(), CommandError> {
        self.full_pending = true;
        self.applied.clear();
        netfilter::nft(&nft::removal())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use random::{NODE, Random};

    /// Per local Pod address and direction: the interval elements and each peer's reach.
    type Resolved = BTreeMap<Ipv4Addr, [Option<(Vec<elements::Element>, BTreeMap<u32, elements::Reach>)>; 2]>;

    fn resolve(sets: &BTreeMap<Ipv4Addr, PodSets>, classes: &Classes) -> Resolved {
        let of = |s: Option<&Sets>| {
            s.map(|s| (s.spans.clone(), s.peers.iter().map(|(p, c)| (*p, classes.reach(*c).clone())).collect()))
        };
        sets.iter().map(|(ip, s)| (*ip, [of(s.ingress.as_ref()), of(s.egress.as_ref())])).collect()
    }

    /// What each local Pod address should have, computed afresh from the inputs.
    fn afresh(p: &Policies) -> Resolved {
        let mut seen = BTreeSet::new();
        let mut out = BTreeMap::new();
        let mut classes = Classes::default();
        // In key order: the first Pod of an address decides its sets.
        for pod in p.local_pods().filter(|pod| seen.insert(pod.ip)) {
            let rules = p.pod_rules(&pod.key());
            if rules.ingress.is_some() || rules.egress.is_some() {
                let sets = PodSets {
                    ingress: rules.ingress.as_ref().map(|a| fresh(a, &mut classes)),
                    egress: rules.egress.as_ref().map(|a| fresh(a, &mut classes)),
                };
                out.insert(pod.ip, sets);
            }
        }
        resolve(&out, &classes)
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
                let Plan::Changes { changes, .. } = &plan else { panic!("step {step}: a full plan") };
                for c in changes {
                    let held = policier.applied.get(&c.pod).and_then(|s| s.get(c.direction));
                    assert_eq!(held.is_some(), c.isolated.0, "step {step}: {c:?}");
                    let empty = Sets::default();
                    let held = held.unwrap_or(&empty);
                    assert!(
                        c.gone.iter().all(|e| held.spans.contains(e)),
                        "step {step}: deletes what is not there: {c:?}"
                    );
                    assert!(
                        c.came.iter().all(|e| !held.spans.contains(e) || c.gone.contains(e)),
                        "step {step}: adds what is there: {c:?}"
                    );
                    assert!(c.peers_gone.iter().all(|p| held.peers.contains_key(p)), "step {step}: {c:?}");
                    assert!(
                        c.peers_came.iter().all(|(p, _)| !held.peers.contains_key(p) || c.peers_gone.contains(p)),
                        "step {step}: adds a peer that is there: {c:?}"
                    );
                }
                policier.commit(plan);
                let applied = resolve(&policier.applied, &policier.classes);
                assert_eq!(applied, afresh(&policier.policies), "step {step}");
            }
        }
    }
}
