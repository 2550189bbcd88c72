//! The pure core: NetworkPolicies, Pods and Namespaces in, for each Pod of this node what it
//! may receive and send ([`PodRules`]) out, with the semantics of `networking.k8s.io/v1`:
//!
//! - A Pod selected by no policy of a type (Ingress, Egress) is unrestricted for that type;
//!   selected by any, it is isolated for it: everything is denied but what some rule of some
//!   policy selecting it allows (the union; rules only ever allow).
//! - `policyTypes` absent: Ingress always, Egress when the policy has egress rules.
//! - A peer's `podSelector` picks Pods of the policy's namespace, `namespaceSelector` every Pod
//!   of the namespaces it picks, both together the Pods matching the first in the namespaces
//!   matching the second; `ipBlock` a CIDR less its `except`s. No peers: every address.
//! - A port by number (with `endPort`, a range), by name (resolved on the Pod that serves it:
//!   the selected Pod for ingress, each destination Pod for egress), or absent (every port of
//!   the protocol, TCP by default). No ports: every protocol and port.
//!
//! Every namespace carries `kubernetes.io/metadata.name`, as the API server labels it.
//! IPv6 ipBlocks are ignored: the agent's Pod network is IPv4.
//!
//! [`Policies`] holds the inputs and, per policy, the Pods of this node it selects and each
//! rule's peer Pods, kept up to date as objects change, and each local Pod's allows with a
//! count per allow ([`Allows`]). A peer Pod that comes, goes or changes adds or takes away its
//! own contributions to the rules it is a peer in, at its own address, so its cost is the
//! rules it matches, not the local Pods times their peers; a local Pod that changes, or one a
//! changed policy selects, is computed afresh ([`Policies::pod_rules`]).
//! [`Policies::take_changes`] says which local Pods' allows changed, and at which addresses.

use super::allows::{Allow, Allows, Ports};
use gitplane_api::labels::{self as selector, Labels};
use k8s_openapi::api::{core::v1::Pod, networking::v1::NetworkPolicy};
use k8s_openapi::apimachinery::pkg::{apis::meta::v1::LabelSelector, util::intstr::IntOrString};
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

/// `namespace/name`.
pub type Key = (String, String);

pub const TCP: u8 = 6;
pub const UDP: u8 = 17;
pub const SCTP: u8 = 132;

/// The label the API server puts on every Namespace.
const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

/// A Pod as policy sees it: only Pods with an address of the Pod network (not hostNetwork,
/// not finished) take part.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyPod {
    pub namespace: String,
    pub name: String,
    pub labels: Labels,
    pub node: String,
    pub ip: Ipv4Addr,
    /// Named container ports: (name, protocol, port).
    pub ports: Vec<(String, u8, u16)>,
}

impl PolicyPod {
    pub fn from_pod(pod: &Pod) -> Option<PolicyPod> {
        let spec = pod.spec.as_ref()?;
        let status = pod.status.as_ref()?;
        if spec.host_network == Some(true) || matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")) {
            return None;
        }
        let ip = status.pod_ip.as_deref()?.parse().ok()?;
        let ports = spec
            .containers
            .iter()
            .flat_map(|c| c.ports.iter().flatten())
            .filter_map(|p| {
                let port = u16::try_from(p.container_port).ok()?;
                Some((p.name.clone()?, protocol(p.protocol.as_deref())?, port))
            })
            .collect();
        Some(PolicyPod {
            namespace: pod.metadata.namespace.clone().unwrap_or_else(|| "default".into()),
            name: pod.metadata.name.clone().unwrap_or_default(),
            labels: pod.metadata.labels.clone().unwrap_or_default(),
            node: spec.node_name.clone().unwrap_or_default(),
            ip,
            ports,
        })
    }

    pub fn key(&self) -> Key {
        (self.namespace.clone(), self.name.clone())
    }

    fn named_port(&self, name: &str, protocol: u8) -> Option<u16> {
        self.ports.iter().find(|(n, p, _)| n == name && *p == protocol).map(|(_, _, port)| *port)
    }
}

fn protocol(name: Option<&str>) -> Option<u8> {
    match name.unwrap_or("TCP") {
        "TCP" => Some(TCP),
        "UDP" => Some(UDP),
        "SCTP" => Some(SCTP),
        _ => None,
    }
}

/// What one local Pod may receive and send. `None`: not isolated for that direction.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodRules {
    pub ingress: Option<Allows>,
    pub egress: Option<Allows>,
}

impl PodRules {
    pub fn get(&self, direction: Direction) -> Option<&Allows> {
        match direction {
            Direction::Ingress => self.ingress.as_ref(),
            Direction::Egress => self.egress.as_ref(),
        }
    }

    fn get_mut(&mut self, direction: Direction) -> &mut Option<Allows> {
        match direction {
            Direction::Ingress => &mut self.ingress,
            Direction::Egress => &mut self.egress,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Ingress,
    Egress,
}

#[derive(Clone, Debug)]
enum Peer {
    /// `namespace`: `None` for the policy's own namespace. `pods`: `None` for every Pod.
    Pods { namespace: Option<LabelSelector>, pods: Option<LabelSelector> },
    /// Address ranges (a CIDR less its excepts).
    Block(Vec<(u32, u32)>),
}

#[derive(Clone, Debug)]
enum PortSpec {
    Numbers { protocol: u8, first: u16, last: u16 },
    Named { protocol: u8, name: String },
}

#[derive(Clone, Debug)]
struct Rule {
    /// Empty: every address.
    peers: Vec<Peer>,
    /// Empty: every protocol and port.
    ports: Vec<PortSpec>,
}

/// One NetworkPolicy, read into what the core evaluates.
#[derive(Clone, Debug)]
pub struct CompiledPolicy {
    namespace: String,
    pod_selector: LabelSelector,
    /// `None`: the policy does not isolate for this direction.
    ingress: Option<Vec<Rule>>,
    egress: Option<Vec<Rule>>,
}

impl CompiledPolicy {
    pub fn new(policy: &NetworkPolicy) -> CompiledPolicy {
        let spec = policy.spec.clone().unwrap_or_default();
        let egress_rules = spec.egress.unwrap_or_default();
        let (ingress_type, egress_type) = match &spec.policy_types {
            Some(types) => (types.iter().any(|t| t == "Ingress"), types.iter().any(|t| t == "Egress")),
            None => (true, !egress_rules.is_empty()),
        };
        let ingress = spec
            .ingress
            .unwrap_or_default()
            .into_iter()
            .map(|r| Rule::new(r.from.unwrap_or_default(), r.ports.unwrap_or_default()))
            .collect();
        let egress = egress_rules
            .into_iter()
            .map(|r| Rule::new(r.to.unwrap_or_default(), r.ports.unwrap_or_default()))
            .collect();
        CompiledPolicy {
            namespace: policy.metadata.namespace.clone().unwrap_or_else(|| "default".into()),
            pod_selector: spec.pod_selector.unwrap_or_default(),
            ingress: ingress_type.then_some(ingress),
            egress: egress_type.then_some(egress),
        }
    }

    fn rules(&self, direction: Direction) -> Option<&[Rule]> {
        match direction {
            Direction::Ingress => self.ingress.as_deref(),
            Direction::Egress => self.egress.as_deref(),
        }
    }

    pub fn selects(&self, pod: &PolicyPod) -> bool {
        pod.namespace == self.namespace && selector::matches(&self.pod_selector, &pod.labels)
    }
}

impl Rule {
    fn new(
        peers: Vec<k8s_openapi::api::networking::v1::NetworkPolicyPeer>,
        ports: Vec<k8s_openapi::api::networking::v1::NetworkPolicyPort>,
    ) -> Rule {
        let peers = peers
            .into_iter()
            .filter_map(|p| match p.ip_block {
                Some(block) => Some(Peer::Block(block_ranges(&block.cidr, block.except.as_deref().unwrap_or(&[])))),
                None if p.namespace_selector.is_none() && p.pod_selector.is_none() => None,
                None => Some(Peer::Pods { namespace: p.namespace_selector, pods: p.pod_selector }),
            })
            .collect();
        let ports = ports
            .into_iter()
            .filter_map(|p| {
                let protocol = protocol(p.protocol.as_deref())?;
                Some(match p.port {
                    None => PortSpec::Numbers { protocol, first: 0, last: u16::MAX },
                    Some(IntOrString::Int(n)) => {
                        let first = u16::try_from(n).ok()?;
                        let last = p.end_port.and_then(|e| u16::try_from(e).ok()).unwrap_or(first).max(first);
                        PortSpec::Numbers { protocol, first, last }
                    }
                    Some(IntOrString::String(name)) => PortSpec::Named { protocol, name },
                })
            })
            .collect();
        Rule { peers, ports }
    }

    fn named_ports(&self) -> bool {
        self.ports.iter().any(|p| matches!(p, PortSpec::Named { .. }))
    }

    /// Whether `pod` is one of this rule's peer Pods: one a selector picks, or, for an egress
    /// rule with named ports (resolved on each destination Pod), any Pod inside its addresses.
    fn has_peer(&self, policy_namespace: &str, pod: &PolicyPod, namespaces: &Namespaces, direction: Direction) -> bool {
        let named_egress = direction == Direction::Egress && self.named_ports();
        if named_egress && self.peers.is_empty() {
            return true;
        }
        let ip = u32::from(pod.ip);
        self.peers.iter().any(|peer| match peer {
            Peer::Pods { namespace, pods } => {
                let in_namespace = match namespace {
                    None => pod.namespace == policy_namespace,
                    Some(s) => selector::matches(s, &namespaces.labels(&pod.namespace)),
                };
                in_namespace && pods.as_ref().is_none_or(|s| selector::matches(s, &pod.labels))
            }
            Peer::Block(ranges) => named_egress && ranges.iter().any(|(a, b)| (*a..=*b).contains(&ip)),
        })
    }

    /// What this rule allows `target` (a local Pod it applies to) whatever its peer Pods: its
    /// ipBlocks, or every address when it names no peer.
    fn fixed_allows(&self, direction: Direction, target: &PolicyPod, mut out: impl FnMut(Allow)) {
        if self.peers.is_empty() {
            return self.port_allows(direction, target, (0, u32::MAX), &mut out);
        }
        for peer in &self.peers {
            if let Peer::Block(ranges) = peer {
                for &range in ranges {
                    self.port_allows(direction, target, range, &mut out);
                }
            }
        }
    }

    /// What one of its peer Pods ([`Rule::has_peer`]) adds: the peer's own address on the
    /// rule's ports, and for egress the named ports the peer serves. A peer inside a block adds
    /// what the block gives already; counted, it keeps nothing alive the block does not.
    fn peer_allows(&self, direction: Direction, target: &PolicyPod, peer: &PolicyPod, mut out: impl FnMut(Allow)) {
        let ip = u32::from(peer.ip);
        if !self.peers.is_empty() {
            self.port_allows(direction, target, (ip, ip), &mut out);
        }
        if direction == Direction::Egress {
            for port in &self.ports {
                if let PortSpec::Named { protocol, name } = port
                    && let Some(p) = peer.named_port(name, *protocol)
                {
                    out(Allow { first: ip, last: ip, ports: Ports::Range { protocol: *protocol, first: p, last: p } });
                }
            }
        }
    }

    /// Addresses `first..=last` on the rule's ports that need no peer Pod to resolve: numbers,
    /// and for ingress names served by the target; every port when the rule names none.
    fn port_allows(
        &self,
        direction: Direction,
        target: &PolicyPod,
        (first, last): (u32, u32),
        out: &mut impl FnMut(Allow),
    ) {
        if self.ports.is_empty() {
            return out(Allow { first, last, ports: Ports::All });
        }
        for port in &self.ports {
            let ports = match (port, direction) {
                (&PortSpec::Numbers { protocol, first, last }, _) => Ports::Range { protocol, first, last },
                (PortSpec::Named { protocol, name }, Direction::Ingress) => {
                    let Some(p) = target.named_port(name, *protocol) else { continue };
                    Ports::Range { protocol: *protocol, first: p, last: p }
                }
                // Resolved on each destination Pod: `peer_allows`.
                (PortSpec::Named { .. }, Direction::Egress) => continue,
            };
            out(Allow { first, last, ports });
        }
    }
}

/// A CIDR less its excepts, as address ranges; IPv6 or unreadable CIDRs: nothing.
pub fn block_ranges(cidr: &str, except: &[String]) -> Vec<(u32, u32)> {
    let Some(block) = v4_range(cidr) else { return Vec::new() };
    let mut ranges = vec![block];
    for e in except {
        let Some((ea, eb)) = v4_range(e) else { continue };
        ranges = ranges
            .into_iter()
            .flat_map(|(a, b)| {
                let mut left = Vec::new();
                if ea > a {
                    left.push((a, b.min(ea - 1)));
                }
                if eb < b {
                    left.push((a.max(eb + 1), b));
                }
                if eb < a || ea > b { vec![(a, b)] } else { left }
            })
            .collect();
    }
    ranges
}

/// `10.0.0.0/8` as its first and last address (host bits ignored, as Go's ParseCIDR does).
fn v4_range(cidr: &str) -> Option<(u32, u32)> {
    let (address, prefix) = cidr.split_once('/')?;
    let address: Ipv4Addr = address.parse().ok()?;
    let prefix: u32 = prefix.parse().ok().filter(|p| *p <= 32)?;
    let mask = u32::MAX.checked_shl(32 - prefix).unwrap_or(0);
    let first = u32::from(address) & mask;
    Some((first, first | !mask))
}

/// Namespace labels, by name, each with the name label the API server always sets.
#[derive(Clone, Debug, Default)]
pub struct Namespaces(BTreeMap<String, Labels>);

impl Namespaces {
    /// A namespace's labels (only the name label for one not seen).
    pub fn labels(&self, namespace: &str) -> Cow<'_, Labels> {
        match self.0.get(namespace) {
            Some(labels) => Cow::Borrowed(labels),
            None => Cow::Owned([(NAMESPACE_NAME_LABEL.to_owned(), namespace.to_owned())].into()),
        }
    }
}

/// A policy and what it picks now.
#[derive(Clone, Debug)]
struct Entry {
    policy: CompiledPolicy,
    /// The Pods of this node it selects.
    targets: BTreeSet<Key>,
    /// Per rule, the peer Pods ([`Rule::has_peer`]).
    ingress_peers: Vec<BTreeSet<Key>>,
    egress_peers: Vec<BTreeSet<Key>>,
}

impl Entry {
    fn peers(&self, direction: Direction) -> &[BTreeSet<Key>] {
        match direction {
            Direction::Ingress => &self.ingress_peers,
            Direction::Egress => &self.egress_peers,
        }
    }
}

/// Per local Pod: the addresses its allows changed at since [`Policies::take_changes`], or
/// `None` when they were computed afresh.
pub type Changes = BTreeMap<Key, Option<Vec<(u32, u32)>>>;

/// The inputs and their cross-references, kept up to date as objects change.
#[derive(Clone, Debug, Default)]
pub struct Policies {
    node: String,
    pods: BTreeMap<Key, PolicyPod>,
    namespaces: Namespaces,
    policies: BTreeMap<Key, Entry>,
    /// The allows of the local Pods some policy selects, kept up to date by the changes of
    /// their peers; those in `stale` are computed afresh by the next `take_changes`.
    kept: BTreeMap<Key, PodRules>,
    stale: BTreeSet<Key>,
    /// Per local Pod in `kept`: the addresses of the peers whose contributions changed.
    touched: BTreeMap<Key, Vec<u32>>,
}

impl Policies {
    pub fn new(node: impl Into<String>) -> Policies {
        Policies { node: node.into(), ..Default::default() }
    }

    fn local(&self, pod: &PolicyPod) -> bool {
        pod.node == self.node
    }

    /// Adds, changes (`Some`) or removes (`None`) a Pod.
    pub fn set_pod(&mut self, key: Key, pod: Option<PolicyPod>) {
        let old = self.pods.get(&key).cloned();
        if old == pod {
            return;
        }
        let Policies { node, pods, namespaces, policies, kept, stale, touched } = self;
        let local = |p: &PolicyPod| p.node == *node;
        if old.as_ref().is_some_and(local) || pod.as_ref().is_some_and(local) {
            // Its own allows: computed afresh.
            stale.insert(key.clone());
        }
        for entry in policies.values_mut() {
            if pod.as_ref().is_some_and(|p| local(p) && entry.policy.selects(p)) {
                entry.targets.insert(key.clone());
            } else {
                entry.targets.remove(&key);
            }
            for direction in [Direction::Ingress, Direction::Egress] {
                let (rules, peers) = match direction {
                    Direction::Ingress => (entry.policy.ingress.as_deref(), &mut entry.ingress_peers),
                    Direction::Egress => (entry.policy.egress.as_deref(), &mut entry.egress_peers),
                };
                for (rule, set) in rules.unwrap_or_default().iter().zip(peers.iter_mut()) {
                    let was = old.as_ref().filter(|_| set.contains(&key));
                    let now = pod.as_ref().filter(|p| rule.has_peer(&entry.policy.namespace, p, namespaces, direction));
                    if was.is_none() && now.is_none() {
                        continue;
                    }
                    if now.is_some() {
                        set.insert(key.clone());
                    } else {
                        set.remove(&key);
                    }
                    // Out with the peer's old contributions to each target, in with the new.
                    for t in &entry.targets {
                        if stale.contains(t) {
                            continue;
                        }
                        let target = pods.get(t);
                        let Some((target, allows)) =
                            target.zip(kept.get_mut(t).and_then(|r| r.get_mut(direction).as_mut()))
                        else {
                            // Not kept as it should be: compute it afresh.
                            stale.insert(t.clone());
                            continue;
                        };
                        let addresses = touched.entry(t.clone()).or_default();
                        if let Some(peer) = was {
                            rule.peer_allows(direction, target, peer, |a| {
                                allows.remove(a);
                            });
                            addresses.push(u32::from(peer.ip));
                        }
                        if let Some(peer) = now {
                            rule.peer_allows(direction, target, peer, |a| {
                                allows.add(a);
                            });
                            addresses.push(u32::from(peer.ip));
                        }
                    }
                }
            }
        }
        match pod {
            Some(pod) => pods.insert(key, pod),
            None => pods.remove(&key),
        };
    }

    /// Adds or changes (`Some`) a Namespace's labels, or removes it.
    pub fn set_namespace(&mut self, name: &str, labels: Option<Labels>) {
        let labels = labels.map(|mut l| {
            l.insert(NAMESPACE_NAME_LABEL.into(), name.into());
            l
        });
        if self.namespaces.0.get(name) == labels.as_ref() {
            return;
        }
        match labels {
            Some(labels) => self.namespaces.0.insert(name.to_owned(), labels),
            None => self.namespaces.0.remove(name),
        };
        // Namespace selectors may now pick other Pods: rarely happens, evaluate everything.
        let keys: Vec<Key> = self.policies.keys().cloned().collect();
        for key in keys {
            let policy = self.policies[&key].policy.clone();
            self.set_policy(key, Some(policy));
        }
    }

    /// Adds, changes (`Some`) or removes a NetworkPolicy.
    pub fn set_policy(&mut self, key: Key, policy: Option<CompiledPolicy>) {
        if let Some(old) = self.policies.remove(&key) {
            self.stale.extend(old.targets);
        }
        let Some(policy) = policy else { return };
        let targets: BTreeSet<Key> =
            self.pods.iter().filter(|(_, p)| self.local(p) && policy.selects(p)).map(|(k, _)| k.clone()).collect();
        let peers = |direction| -> Vec<BTreeSet<Key>> {
            policy
                .rules(direction)
                .unwrap_or_default()
                .iter()
                .map(|rule| {
                    self.pods
                        .iter()
                        .filter(|(_, p)| rule.has_peer(&policy.namespace, p, &self.namespaces, direction))
                        .map(|(k, _)| k.clone())
                        .collect()
                })
                .collect()
        };
        let (ingress_peers, egress_peers) = (peers(Direction::Ingress), peers(Direction::Egress));
        self.stale.extend(targets.iter().cloned());
        self.policies.insert(key, Entry { policy, targets, ingress_peers, egress_peers });
    }

    /// Brings every kept allow up to date and says which local Pods' allows changed since the
    /// last call.
    pub fn take_changes(&mut self) -> Changes {
        let mut changes = Changes::new();
        for key in std::mem::take(&mut self.stale) {
            let rules = self.pod_rules(&key);
            if rules.ingress.is_some() || rules.egress.is_some() {
                self.kept.insert(key.clone(), rules);
            } else {
                self.kept.remove(&key);
            }
            self.touched.remove(&key);
            changes.insert(key, None);
        }
        for (key, mut addresses) in std::mem::take(&mut self.touched) {
            addresses.sort_unstable();
            addresses.dedup();
            changes.insert(key, Some(addresses.into_iter().map(|a| (a, a)).collect()));
        }
        changes
    }

    /// A local Pod's allows as kept (`None`: no policy isolates it), up to date after
    /// [`Policies::take_changes`].
    pub fn rules(&self, key: &Key) -> Option<&PodRules> {
        self.kept.get(key)
    }

    pub fn namespace_names(&self) -> Vec<String> {
        self.namespaces.0.keys().cloned().collect()
    }

    pub fn pod_keys(&self) -> Vec<Key> {
        self.pods.keys().cloned().collect()
    }

    pub fn policy_keys(&self) -> Vec<Key> {
        self.policies.keys().cloned().collect()
    }

    /// A Pod of this node.
    pub fn local_pod(&self, key: &Key) -> Option<&PolicyPod> {
        self.pods.get(key).filter(|p| self.local(p))
    }

    /// Every Pod of this node.
    pub fn local_pods(&self) -> impl Iterator<Item = &PolicyPod> {
        self.pods.values().filter(|p| self.local(p))
    }

    /// What the policies allow one local Pod, computed afresh from the cross-references.
    pub fn pod_rules(&self, key: &Key) -> PodRules {
        let mut rules = PodRules::default();
        let Some(target) = self.local_pod(key) else { return rules };
        for entry in self.policies.values().filter(|e| e.targets.contains(key)) {
            for direction in [Direction::Ingress, Direction::Egress] {
                let Some(policy_rules) = entry.policy.rules(direction) else { continue };
                let out = rules.get_mut(direction).get_or_insert_with(Allows::default);
                for (rule, peer_keys) in policy_rules.iter().zip(entry.peers(direction)) {
                    rule.fixed_allows(direction, target, |a| {
                        out.add(a);
                    });
                    for peer in peer_keys.iter().filter_map(|k| self.pods.get(k)) {
                        rule.peer_allows(direction, target, peer, |a| {
                            out.add(a);
                        });
                    }
                }
            }
        }
        rules
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::network::policy::random::{self, NODE, Random};
    use serde_json::{Value, json};

    fn pod(ns: &str, name: &str, labels: &[(&str, &str)], node: &str, ip: &str) -> PolicyPod {
        PolicyPod {
            namespace: ns.into(),
            name: name.into(),
            labels: labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            node: node.into(),
            ip: ip.parse().unwrap(),
            ports: vec![("http".into(), TCP, 8080), ("dns".into(), UDP, 53)],
        }
    }

    /// Three namespaces: a (team=a), b (team=b), c; Pods a1 (app=web), a2 (app=db) on this
    /// node, b1 (app=web, role=client) and c1 (app=web) elsewhere.
    fn world(policies: &[Value]) -> Policies {
        let mut p = Policies::new(NODE);
        for (ns, team) in [("a", Some("a")), ("b", Some("b")), ("c", None)] {
            let labels = team.map(|t| [("team".to_string(), t.to_string())].into()).unwrap_or_default();
            p.set_namespace(ns, Some(labels));
        }
        for pod in [
            pod("a", "a1", &[("app", "web")], NODE, "10.244.1.2"),
            pod("a", "a2", &[("app", "db")], NODE, "10.244.1.3"),
            pod("b", "b1", &[("app", "web"), ("role", "client")], "n2", "10.244.2.2"),
            pod("c", "c1", &[("app", "web")], "n2", "10.244.2.3"),
        ] {
            p.set_pod(pod.key(), Some(pod));
        }
        for (i, policy) in policies.iter().enumerate() {
            let mut policy = policy.clone();
            policy["metadata"]["name"] = json!(format!("p{i}"));
            policy["metadata"]["namespace"].as_str().unwrap_or_else(|| panic!("namespace: {policy}"));
            let policy: NetworkPolicy = serde_json::from_value(policy).unwrap();
            let key = (policy.metadata.namespace.clone().unwrap(), policy.metadata.name.clone().unwrap());
            p.set_policy(key, Some(CompiledPolicy::new(&policy)));
        }
        p
    }

    fn ip(s: &str) -> u32 {
        u32::from(s.parse::<Ipv4Addr>().unwrap())
    }

    fn range(protocol: u8, first: u16, last: u16) -> Ports {
        Ports::Range { protocol, first, last }
    }

    fn from(addr: &str, ports: Ports) -> Allow {
        let (first, last) = match addr.split_once('-') {
            Some((a, b)) => (ip(a), ip(b)),
            None if addr == "*" => (0, u32::MAX),
            None => (ip(addr), ip(addr)),
        };
        Allow { first, last, ports }
    }

    /// A Pod's allows as sets: the semantics (how often each is given is bookkeeping).
    #[derive(Debug, Default, PartialEq)]
    struct Sets {
        ingress: Option<BTreeSet<Allow>>,
        egress: Option<BTreeSet<Allow>>,
    }

    /// Local Pod `a/name`'s allows, computed afresh and checked against the kept ones.
    fn rules_of(p: &mut Policies, name: &str) -> Sets {
        let key = ("a".to_string(), name.to_string());
        p.take_changes();
        let rules = p.pod_rules(&key);
        assert_eq!(p.rules(&key).cloned().unwrap_or_default(), rules, "kept and afresh");
        let set = |a: Option<Allows>| a.map(|a| a.iter().collect());
        Sets { ingress: set(rules.ingress), egress: set(rules.egress) }
    }

    fn np(spec: Value) -> Value {
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"namespace": "a"}, "spec": spec})
    }

    #[test]
    fn semantics_table() {
        let all = |addr: &str| from(addr, Ports::All);
        let cases: Vec<(&str, Vec<Value>, &str, Sets)> = vec![
            ("no policy: unrestricted", vec![], "a1", Sets::default()),
            (
                "default deny ingress",
                vec![np(json!({"podSelector": {}}))],
                "a1",
                Sets { ingress: Some([].into()), egress: None },
            ),
            (
                "default deny egress only",
                vec![np(json!({"podSelector": {}, "policyTypes": ["Egress"]}))],
                "a1",
                Sets { ingress: None, egress: Some([].into()) },
            ),
            (
                "egress rules imply the Egress type",
                vec![np(json!({"podSelector": {}, "egress": [{}]}))],
                "a1",
                Sets { ingress: Some([].into()), egress: Some([all("*")].into()) },
            ),
            (
                "allow all ingress",
                vec![np(json!({"podSelector": {}, "ingress": [{}]}))],
                "a2",
                Sets { ingress: Some([all("*")].into()), egress: None },
            ),
            (
                "a policy selecting other Pods leaves this one alone",
                vec![np(json!({"podSelector": {"matchLabels": {"app": "db"}}}))],
                "a1",
                Sets::default(),
            ),
            (
                "podSelector picks Pods of the policy's namespace only",
                vec![np(
                    json!({"podSelector": {}, "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}]}]}),
                )],
                "a2",
                Sets { ingress: Some([all("10.244.1.2")].into()), egress: None },
            ),
            (
                "namespaceSelector picks every Pod of the namespaces",
                vec![np(
                    json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "b"}}}]}]}),
                )],
                "a1",
                Sets { ingress: Some([all("10.244.2.2")].into()), egress: None },
            ),
            (
                "both selectors in one peer: AND",
                vec![np(json!({"podSelector": {}, "ingress": [{"from": [{
                    "namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "DoesNotExist"}]},
                    "podSelector": {"matchLabels": {"app": "web"}}}]}]}))],
                "a1",
                Sets { ingress: Some([all("10.244.2.3")].into()), egress: None },
            ),
            (
                "two peers: OR; the name label of a namespace",
                vec![np(json!({"podSelector": {}, "ingress": [{"from": [
                    {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "c"}}},
                    {"podSelector": {"matchLabels": {"role": "client"}}}]}]}))],
                "a1",
                Sets { ingress: Some([all("10.244.2.3")].into()), egress: None },
            ),
            (
                "ipBlock with except",
                vec![np(json!({"podSelector": {"matchLabels": {"app": "web"}}, "ingress": [{"from": [
                    {"ipBlock": {"cidr": "10.244.0.0/16", "except": ["10.244.2.0/24"]}}]}]}))],
                "a1",
                Sets {
                    ingress: Some([all("10.244.0.0-10.244.1.255"), all("10.244.3.0-10.244.255.255")].into()),
                    egress: None,
                },
            ),
            (
                "ports: number, endPort range, name resolved on the selected Pod, protocol only",
                vec![np(json!({"podSelector": {}, "ingress": [{"ports": [
                    {"port": 80}, {"port": 9000, "endPort": 9100, "protocol": "UDP"}, {"port": "http"}, {"port": "missing"},
                    {"protocol": "SCTP"}]}]}))],
                "a1",
                Sets {
                    ingress: Some(
                        [
                            from("*", range(TCP, 80, 80)),
                            from("*", range(UDP, 9000, 9100)),
                            from("*", range(TCP, 8080, 8080)),
                            from("*", range(SCTP, 0, 65535)),
                        ]
                        .into(),
                    ),
                    egress: None,
                },
            ),
            (
                "egress deny but DNS",
                vec![np(json!({"podSelector": {}, "policyTypes": ["Egress"], "egress": [{"ports": [
                    {"port": 53, "protocol": "UDP"}, {"port": 53, "protocol": "TCP"}]}]}))],
                "a1",
                Sets {
                    ingress: None,
                    egress: Some([from("*", range(UDP, 53, 53)), from("*", range(TCP, 53, 53))].into()),
                },
            ),
            (
                "egress named port resolved on each destination Pod",
                vec![np(json!({"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Egress"],
                    "egress": [{"to": [{"namespaceSelector": {}}], "ports": [{"port": "http"}]}]}))],
                "a1",
                Sets {
                    ingress: None,
                    egress: Some(
                        ["10.244.1.2", "10.244.1.3", "10.244.2.2", "10.244.2.3"]
                            .iter()
                            .map(|a| from(a, range(TCP, 8080, 8080)))
                            .collect(),
                    ),
                },
            ),
            (
                "the union of every policy selecting the Pod",
                vec![
                    np(
                        json!({"podSelector": {}, "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "db"}}}], "ports": [{"port": 80}]}]}),
                    ),
                    np(
                        json!({"podSelector": {"matchLabels": {"app": "web"}}, "ingress": [{"from": [{"ipBlock": {"cidr": "192.168.0.0/24"}}]}]}),
                    ),
                ],
                "a1",
                Sets {
                    ingress: Some([from("10.244.1.3", range(TCP, 80, 80)), all("192.168.0.0-192.168.0.255")].into()),
                    egress: None,
                },
            ),
            (
                "a policy of another namespace selects nothing here",
                vec![json!({"metadata": {"namespace": "b"}, "spec": {"podSelector": {}}})],
                "a1",
                Sets::default(),
            ),
        ];
        for (what, policies, pod, expected) in cases {
            assert_eq!(rules_of(&mut world(&policies), pod), expected, "{what}");
        }
    }

    fn key(ns: &str, name: &str) -> Key {
        (ns.to_string(), name.to_string())
    }

    /// Whatever the order of changes, the kept cross-references and allows give what a fresh
    /// build gives; a peer's change is reported at its address.
    #[test]
    fn incremental_changes_agree_with_a_fresh_build() {
        let policies = [
            np(json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "b"}},
                                                             "podSelector": {"matchLabels": {"app": "web"}}}]}]})),
            np(
                json!({"podSelector": {"matchLabels": {"app": "web"}}, "egress": [{"to": [{"podSelector": {}}], "ports": [{"port": "http"}]}]}),
            ),
        ];
        let mut p = world(&policies);
        p.take_changes();
        let b2 = pod("b", "b2", &[("app", "web")], "n3", "10.244.3.2");
        p.set_pod(b2.key(), Some(b2));
        let at_b2 = Some(vec![(ip("10.244.3.2"), ip("10.244.3.2"))]);
        assert_eq!(p.take_changes(), [(key("a", "a1"), at_b2.clone()), (key("a", "a2"), at_b2)].into());
        let a3 = pod("a", "a3", &[("app", "web")], NODE, "10.244.1.4");
        p.set_pod(a3.key(), Some(a3));
        let changes = p.take_changes();
        assert_eq!(changes[&key("a", "a3")], None, "a new local Pod is computed afresh");
        assert_eq!(changes[&key("a", "a1")], Some(vec![(ip("10.244.1.4"), ip("10.244.1.4"))]), "a3 is a1's peer");
        p.set_namespace("c", Some([("team".to_string(), "b".to_string())].into()));
        p.set_pod(("b".into(), "b1".into()), None);
        p.take_changes();
        // The same objects fed in one go, policies last.
        let mut rebuilt = Policies::new(NODE);
        rebuilt.namespaces = p.namespaces.clone();
        for pod in p.pods.values() {
            rebuilt.set_pod(pod.key(), Some(pod.clone()));
        }
        for (k, e) in &p.policies {
            rebuilt.set_policy(k.clone(), Some(e.policy.clone()));
        }
        rebuilt.take_changes();
        for local in ["a1", "a2", "a3"] {
            let key = key("a", local);
            assert_eq!(p.rules(&key), rebuilt.rules(&key), "{local}");
        }
        let a1 = rules_of(&mut p, "a1");
        assert_eq!(
            a1.ingress.unwrap(),
            [from("10.244.2.3", Ports::All), from("10.244.3.2", Ports::All)].into(),
            "b2 and c1 (c now team=b), b1 gone"
        );
    }

    /// After any sequence of Pods, policies and Namespaces coming, changing and going, the
    /// kept allows are exactly (counts too) those computed afresh, and every Pod whose allows
    /// changed is reported, at addresses that cover the change.
    #[test]
    fn kept_allows_follow_random_changes() {
        let mut random = Random(0x2545_f491_4f6c_dd1d);
        for _ in 0..40 {
            let mut p = Policies::new(NODE);
            let mut before: BTreeMap<Key, PodRules> = BTreeMap::new();
            for step in 0..150 {
                random::change(&mut p, &mut random);
                if random.below(3) != 0 {
                    continue;
                }
                let changes = p.take_changes();
                let local: BTreeSet<Key> = p.local_pods().map(|p| p.key()).chain(before.keys().cloned()).collect();
                for k in local {
                    let now = p.rules(&k).cloned().unwrap_or_default();
                    assert_eq!(now, p.pod_rules(&k), "step {step}: {k:?} kept and afresh");
                    let was = before.remove(&k).unwrap_or_default();
                    if now == was {
                        continue;
                    }
                    let change = changes.get(&k).unwrap_or_else(|| panic!("step {step}: {k:?} changed unreported"));
                    let Some(addresses) = change else { continue };
                    for direction in [Direction::Ingress, Direction::Egress] {
                        let (was, now) = (was.get(direction), now.get(direction));
                        assert_eq!(was.is_some(), now.is_some(), "step {step}: {k:?} isolation changed at addresses");
                        let set = |a: Option<&Allows>| a.map(|a| a.iter().collect::<BTreeSet<_>>()).unwrap_or_default();
                        for a in set(was).symmetric_difference(&set(now)) {
                            assert!(
                                addresses.iter().any(|&(x, y)| a.first <= y && a.last >= x),
                                "step {step}: {k:?} {a:?} changed outside {addresses:?}"
                            );
                        }
                    }
                }
                before = p.kept.clone();
            }
        }
    }

    #[test]
    fn pods_without_a_pod_network_address_take_no_part() {
        let base = json!({"metadata": {"name": "p", "namespace": "a"}, "spec": {"nodeName": "n1", "containers": [
            {"name": "c", "ports": [{"name": "http", "containerPort": 80}, {"containerPort": 81}]}]},
            "status": {"phase": "Running", "podIP": "10.244.1.9"}});
        let read = |v: &Value| PolicyPod::from_pod(&serde_json::from_value(v.clone()).unwrap());
        assert_eq!(read(&base).unwrap().ports, [("http".to_string(), TCP, 80)]);
        let mut host = base.clone();
        host["spec"]["hostNetwork"] = json!(true);
        let mut done = base.clone();
        done["status"]["phase"] = json!("Succeeded");
        let mut pending = base.clone();
        pending["status"] = json!({"phase": "Pending"});
        for v in [host, done, pending] {
            assert_eq!(read(&v), None, "{v}");
        }
    }

    #[test]
    fn block_ranges_cut_out_excepts() {
        assert_eq!(block_ranges("10.0.0.0/8", &[]), [(ip("10.0.0.0"), ip("10.255.255.255"))]);
        assert_eq!(block_ranges("10.0.0.7/24", &["10.0.0.0/25".into()]), [(ip("10.0.0.128"), ip("10.0.0.255"))]);
        assert_eq!(
            block_ranges("0.0.0.0/0", &["0.0.0.0/1".into(), "255.0.0.0/8".into()]),
            [(ip("128.0.0.0"), ip("254.255.255.255"))]
        );
        assert_eq!(block_ranges("fd00::/64", &[]), []);
    }
}
