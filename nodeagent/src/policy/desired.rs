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
//! rule's peer Pods, kept up to date as objects change; it reports which local Pods' rules a
//! change may have touched ([`Policies::take_dirty`]), so the applier recomputes only those.

use super::selector::{self, Labels};
use k8s_openapi::api::{core::v1::Pod, networking::v1::NetworkPolicy};
use k8s_openapi::apimachinery::pkg::{apis::meta::v1::LabelSelector, util::intstr::IntOrString};
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

/// The ports an allow covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Ports {
    /// Every protocol, every port.
    All,
    /// `first..=last` of one protocol.
    Range { protocol: u8, first: u16, last: u16 },
}

/// Traffic with a peer in `first..=last` (addresses as numbers) on `ports` is allowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Allow {
    pub first: u32,
    pub last: u32,
    pub ports: Ports,
}

/// What one local Pod may receive and send. `None`: not isolated for that direction.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodRules {
    pub ingress: Option<BTreeSet<Allow>>,
    pub egress: Option<BTreeSet<Allow>>,
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

    /// What this rule allows `target` (a local Pod it applies to), given its peer Pods.
    fn allows<'a>(
        &self,
        direction: Direction,
        target: &PolicyPod,
        peers: impl Iterator<Item = &'a PolicyPod>,
        out: &mut BTreeSet<Allow>,
    ) {
        let peer_pods: Vec<&PolicyPod> = peers.collect();
        // Every address the rule's peers stand for (blocks and the peer Pods' addresses).
        let mut ranges: Vec<(u32, u32)> = Vec::new();
        if self.peers.is_empty() {
            ranges.push((0, u32::MAX));
        } else {
            for peer in &self.peers {
                if let Peer::Block(r) = peer {
                    ranges.extend(r);
                }
            }
            // A peer Pod outside every block was picked by a selector; one inside a block
            // (named egress ports pick those too) adds nothing new.
            ranges.extend(peer_pods.iter().map(|p| (u32::from(p.ip), u32::from(p.ip))));
        }
        let mut add = |first: u32, last: u32, ports: Ports| {
            out.insert(Allow { first, last, ports });
        };
        if self.ports.is_empty() {
            for &(a, b) in &ranges {
                add(a, b, Ports::All);
            }
            return;
        }
        for port in &self.ports {
            match (port, direction) {
                (&PortSpec::Numbers { protocol, first, last }, _) => {
                    for &(a, b) in &ranges {
                        add(a, b, Ports::Range { protocol, first, last });
                    }
                }
                (PortSpec::Named { protocol, name }, Direction::Ingress) => {
                    if let Some(p) = target.named_port(name, *protocol) {
                        for &(a, b) in &ranges {
                            add(a, b, Ports::Range { protocol: *protocol, first: p, last: p });
                        }
                    }
                }
                (PortSpec::Named { protocol, name }, Direction::Egress) => {
                    for pod in &peer_pods {
                        if let Some(p) = pod.named_port(name, *protocol) {
                            let ip = u32::from(pod.ip);
                            add(ip, ip, Ports::Range { protocol: *protocol, first: p, last: p });
                        }
                    }
                }
            }
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

/// Namespace labels, by name.
#[derive(Clone, Debug, Default)]
pub struct Namespaces(BTreeMap<String, Labels>);

impl Namespaces {
    /// A namespace's labels, with the name label the API server always sets.
    pub fn labels(&self, namespace: &str) -> Labels {
        let mut labels = self.0.get(namespace).cloned().unwrap_or_default();
        labels.insert(NAMESPACE_NAME_LABEL.into(), namespace.into());
        labels
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

/// The inputs and their cross-references, kept up to date as objects change.
#[derive(Clone, Debug, Default)]
pub struct Policies {
    node: String,
    pods: BTreeMap<Key, PolicyPod>,
    namespaces: Namespaces,
    policies: BTreeMap<Key, Entry>,
    /// Local Pods whose rules may have changed since [`Policies::take_dirty`].
    dirty: BTreeSet<Key>,
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
        let old = self.pods.get(&key);
        if old == pod.as_ref() {
            return;
        }
        if old.is_some_and(|p| self.local(p)) || pod.as_ref().is_some_and(|p| self.local(p)) {
            self.dirty.insert(key.clone());
        }
        let local_pod = pod.as_ref().filter(|p| p.node == self.node);
        for entry in self.policies.values_mut() {
            let selected = local_pod.is_some_and(|p| entry.policy.selects(p));
            let was = if selected { !entry.targets.insert(key.clone()) } else { entry.targets.remove(&key) };
            if selected || was {
                self.dirty.insert(key.clone());
            }
            let mut peers_changed = false;
            for direction in [Direction::Ingress, Direction::Egress] {
                let (rules, peers) = match direction {
                    Direction::Ingress => (entry.policy.ingress.as_deref(), &mut entry.ingress_peers),
                    Direction::Egress => (entry.policy.egress.as_deref(), &mut entry.egress_peers),
                };
                for (rule, set) in rules.unwrap_or_default().iter().zip(peers.iter_mut()) {
                    let now = pod
                        .as_ref()
                        .is_some_and(|p| rule.has_peer(&entry.policy.namespace, p, &self.namespaces, direction));
                    let was = if now { !set.insert(key.clone()) } else { set.remove(&key) };
                    peers_changed |= now || was;
                }
            }
            if peers_changed {
                self.dirty.extend(entry.targets.iter().cloned());
            }
        }
        match pod {
            Some(pod) => self.pods.insert(key, pod),
            None => self.pods.remove(&key),
        };
    }

    /// Adds or changes (`Some`) a Namespace's labels, or removes it.
    pub fn set_namespace(&mut self, name: &str, labels: Option<Labels>) {
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
            self.dirty.extend(old.targets);
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
        self.dirty.extend(targets.iter().cloned());
        self.policies.insert(key, Entry { policy, targets, ingress_peers, egress_peers });
    }

    /// The local Pods whose rules may have changed since the last call.
    pub fn take_dirty(&mut self) -> BTreeSet<Key> {
        std::mem::take(&mut self.dirty)
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

    /// What the policies allow one local Pod.
    pub fn pod_rules(&self, key: &Key) -> PodRules {
        let mut rules = PodRules::default();
        let Some(target) = self.pods.get(key) else { return rules };
        for entry in self.policies.values().filter(|e| e.targets.contains(key)) {
            for direction in [Direction::Ingress, Direction::Egress] {
                let Some(policy_rules) = entry.policy.rules(direction) else { continue };
                let (slot, peers) = match direction {
                    Direction::Ingress => (&mut rules.ingress, &entry.ingress_peers),
                    Direction::Egress => (&mut rules.egress, &entry.egress_peers),
                };
                let out = slot.get_or_insert_with(BTreeSet::new);
                for (rule, peer_keys) in policy_rules.iter().zip(peers) {
                    rule.allows(direction, target, peer_keys.iter().filter_map(|k| self.pods.get(k)), out);
                }
            }
        }
        rules
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    const NODE: &str = "n1";

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

    fn rules_of(p: &Policies, name: &str) -> PodRules {
        p.pod_rules(&("a".into(), name.into()))
    }

    fn np(spec: Value) -> Value {
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy", "metadata": {"namespace": "a"}, "spec": spec})
    }

    #[test]
    fn semantics_table() {
        let all = |addr: &str| from(addr, Ports::All);
        let cases: Vec<(&str, Vec<Value>, &str, PodRules)> = vec![
            ("no policy: unrestricted", vec![], "a1", PodRules::default()),
            (
                "default deny ingress",
                vec![np(json!({"podSelector": {}}))],
                "a1",
                PodRules { ingress: Some([].into()), egress: None },
            ),
            (
                "default deny egress only",
                vec![np(json!({"podSelector": {}, "policyTypes": ["Egress"]}))],
                "a1",
                PodRules { ingress: None, egress: Some([].into()) },
            ),
            (
                "egress rules imply the Egress type",
                vec![np(json!({"podSelector": {}, "egress": [{}]}))],
                "a1",
                PodRules { ingress: Some([].into()), egress: Some([all("*")].into()) },
            ),
            (
                "allow all ingress",
                vec![np(json!({"podSelector": {}, "ingress": [{}]}))],
                "a2",
                PodRules { ingress: Some([all("*")].into()), egress: None },
            ),
            (
                "a policy selecting other Pods leaves this one alone",
                vec![np(json!({"podSelector": {"matchLabels": {"app": "db"}}}))],
                "a1",
                PodRules::default(),
            ),
            (
                "podSelector picks Pods of the policy's namespace only",
                vec![np(
                    json!({"podSelector": {}, "ingress": [{"from": [{"podSelector": {"matchLabels": {"app": "web"}}}]}]}),
                )],
                "a2",
                PodRules { ingress: Some([all("10.244.1.2")].into()), egress: None },
            ),
            (
                "namespaceSelector picks every Pod of the namespaces",
                vec![np(
                    json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "b"}}}]}]}),
                )],
                "a1",
                PodRules { ingress: Some([all("10.244.2.2")].into()), egress: None },
            ),
            (
                "both selectors in one peer: AND",
                vec![np(json!({"podSelector": {}, "ingress": [{"from": [{
                    "namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "DoesNotExist"}]},
                    "podSelector": {"matchLabels": {"app": "web"}}}]}]}))],
                "a1",
                PodRules { ingress: Some([all("10.244.2.3")].into()), egress: None },
            ),
            (
                "two peers: OR; the name label of a namespace",
                vec![np(json!({"podSelector": {}, "ingress": [{"from": [
                    {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "c"}}},
                    {"podSelector": {"matchLabels": {"role": "client"}}}]}]}))],
                "a1",
                PodRules { ingress: Some([all("10.244.2.3")].into()), egress: None },
            ),
            (
                "ipBlock with except",
                vec![np(json!({"podSelector": {"matchLabels": {"app": "web"}}, "ingress": [{"from": [
                    {"ipBlock": {"cidr": "10.244.0.0/16", "except": ["10.244.2.0/24"]}}]}]}))],
                "a1",
                PodRules {
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
                PodRules {
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
                PodRules {
                    ingress: None,
                    egress: Some([from("*", range(UDP, 53, 53)), from("*", range(TCP, 53, 53))].into()),
                },
            ),
            (
                "egress named port resolved on each destination Pod",
                vec![np(json!({"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Egress"],
                    "egress": [{"to": [{"namespaceSelector": {}}], "ports": [{"port": "http"}]}]}))],
                "a1",
                PodRules {
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
                PodRules {
                    ingress: Some([from("10.244.1.3", range(TCP, 80, 80)), all("192.168.0.0-192.168.0.255")].into()),
                    egress: None,
                },
            ),
            (
                "a policy of another namespace selects nothing here",
                vec![json!({"metadata": {"namespace": "b"}, "spec": {"podSelector": {}}})],
                "a1",
                PodRules::default(),
            ),
        ];
        for (what, policies, pod, expected) in cases {
            assert_eq!(rules_of(&world(&policies), pod), expected, "{what}");
        }
    }

    /// Whatever the order of changes, the kept cross-references give what a fresh build gives.
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
        p.take_dirty();
        let b2 = pod("b", "b2", &[("app", "web")], "n3", "10.244.3.2");
        p.set_pod(b2.key(), Some(b2));
        let dirty = p.take_dirty();
        assert_eq!(dirty, [("a".to_string(), "a1".to_string()), ("a".into(), "a2".into())].into());
        let a3 = pod("a", "a3", &[("app", "web")], NODE, "10.244.1.4");
        p.set_pod(a3.key(), Some(a3));
        assert!(p.take_dirty().contains(&("a".to_string(), "a3".to_string())));
        p.set_namespace("c", Some([("team".to_string(), "b".to_string())].into()));
        p.set_pod(("b".into(), "b1".into()), None);
        // The same objects fed in one go, policies last.
        let mut rebuilt = Policies::new(NODE);
        rebuilt.namespaces = p.namespaces.clone();
        for pod in p.pods.values() {
            rebuilt.set_pod(pod.key(), Some(pod.clone()));
        }
        for (k, e) in &p.policies {
            rebuilt.set_policy(k.clone(), Some(e.policy.clone()));
        }
        for local in ["a1", "a2", "a3"] {
            let key = ("a".to_string(), local.to_string());
            assert_eq!(p.pod_rules(&key), rebuilt.pod_rules(&key), "{local}");
        }
        let a1 = rules_of(&p, "a1");
        assert_eq!(
            a1.ingress.unwrap(),
            [from("10.244.2.3", Ports::All), from("10.244.3.2", Ports::All)].into(),
            "b2 and c1 (c now team=b), b1 gone"
        );
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
