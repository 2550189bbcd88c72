//! The nftables layout of NetworkPolicy, as `nft -f` text and netlink element changes. Pure.
//!
//! Table `ip gitplane-policy`, fixed rules, every Pod a matter of set and map elements. Three
//! base chains check a packet: `forward-egress` (forward hook, priority 0: after the proxy's
//! DNAT at -100, so policy sees Pod addresses, never ClusterIPs), `forward-ingress` (priority
//! 1: an `accept` ends only its own base chain, so a packet the source may send still meets
//! the destination's check) and `input-egress` (a Pod's traffic to its node, e.g. cluster DNS
//! on the node's loopback). Each, for its direction, with "pod" the local Pod's address (the
//! source for egress, the destination for ingress) and "peer" the other end:
//! 1. established and related traffic passes (the replies of allowed connections);
//! 2. `ingress-peers` / `egress-peers`, hash verdict maps from `pod . peer` (peer Pods and
//!    other single addresses) to `jump ports-K`, K the peer's port class ([`Classes`]): chain
//!    `ports-K` accepts the packet when its `protocol . port` is one the class allows;
//! 3. `ingress-pods` / `egress-pods`, verdict maps from each local Pod some policy isolates to
//!    `jump ingress-N` / `jump egress-N`, N its shard (its address modulo [`SHARDS`]): the
//!    chain accepts what set `ingress-allowed-N` / `egress-allowed-N` (`pod . peer . protocol
//!    . port`, intervals) holds, the allows of more than one address (ipBlocks, "every
//!    address") of the Pods of shard N, and drops the rest.
//!
//! Why the peers maps are looked up in base chains alone: adding an element that jumps makes
//! the kernel validate the table at commit, walking each verdict map once for every chain
//! that reaches it; looked up from each shard chain, a 36,000-element map was walked 334
//! times a commit (2 s for a peer Pod's start).
//!
//! Why two kinds of elements: the kernel keeps a concatenated interval set (pipapo) as bitmaps
//! as wide as the set has rules; a lookup scans them, an element's overlap check on insertion
//! too, and a deletion shifts all of them, so every change costs what the set holds (one set
//! for the node: 3.1 s for a peer Pod's start; a set per local Pod: 0.19 s, 100 sets touched).
//! A hash map's insertion costs the same whatever it holds, and a peer Pod's start is one
//! element per local Pod it may talk to, in one map. The interval sets keep what cannot be a
//! hash key: address ranges, which change with policies, not with Pods.
//!
//! What the node itself sends (kubelet probes, host-network Pods) leaves through output and
//! postrouting, which this table does not hook: a Pod's own node may always reach it, as
//! Kubernetes documents. Pods that no policy isolates have no element: policies that select
//! nothing on this node cost it nothing.

use super::desired::Direction;
use super::elements::{self, Element, Reach};
use crate::network::netfilter::{
    self,
    netlink::{Change, Transaction},
};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::net::Ipv4Addr;

pub const TABLE: &str = "gitplane-policy";

/// What the kernel holds for one local Pod in one direction.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sets {
    /// Its elements of its shard's interval set (allows of more than one address), sorted.
    pub spans: Vec<Element>,
    /// Its entries of the peers map: peer address -> port class.
    pub peers: BTreeMap<u32, u32>,
}

impl Sets {
    pub fn len(&self) -> usize {
        self.spans.len() + self.peers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What the kernel holds for one local Pod: `None` for a direction it is not isolated in.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodSets {
    pub ingress: Option<Sets>,
    pub egress: Option<Sets>,
}

impl PodSets {
    pub fn get(&self, direction: Direction) -> Option<&Sets> {
        match direction {
            Direction::Ingress => self.ingress.as_ref(),
            Direction::Egress => self.egress.as_ref(),
        }
    }

    pub fn get_mut(&mut self, direction: Direction) -> &mut Option<Sets> {
        match direction {
            Direction::Ingress => &mut self.ingress,
            Direction::Egress => &mut self.egress,
        }
    }
}

/// The element changes of one local Pod address in one direction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetChange {
    pub pod: Ipv4Addr,
    pub direction: Direction,
    /// Whether the Pod is isolated in this direction (before, after).
    pub isolated: (bool, bool),
    /// Interval set elements to delete and to add, sorted.
    pub gone: Vec<Element>,
    pub came: Vec<Element>,
    /// Peers map entries to delete (by peer) and to add (peer, port class).
    pub peers_gone: Vec<u32>,
    pub peers_came: Vec<(u32, u32)>,
}

impl SetChange {
    /// No change yet.
    pub fn new(pod: Ipv4Addr, direction: Direction, isolated: (bool, bool)) -> SetChange {
        SetChange {
            pod,
            direction,
            isolated,
            gone: Vec::new(),
            came: Vec::new(),
            peers_gone: Vec::new(),
            peers_came: Vec::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.gone.len() + self.came.len() + self.peers_gone.len() + self.peers_came.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Port classes: each distinct [`Reach`] some peer has, numbered in order of first use, with a
/// chain `ports-K` that checks it. New classes get their chain before the elements that name
/// them; unused ones stay until the next full sync (there are as many as distinct port lists
/// in policies, not Pods).
#[derive(Clone, Debug, Default)]
pub struct Classes {
    ids: BTreeMap<Reach, u32>,
    reaches: Vec<Reach>,
    /// The classes numbered below this have their chain in the kernel.
    declared: usize,
}

impl Classes {
    /// The number of `reach`'s class, numbering it if it is new.
    pub fn id(&mut self, reach: Reach) -> u32 {
        let next = self.reaches.len() as u32;
        *self.ids.entry(reach).or_insert_with_key(|reach| {
            self.reaches.push(reach.clone());
            next
        })
    }

    /// What class `id` allows (the tests resolve classes back to ports).
    #[cfg(test)]
    pub fn reach(&self, id: u32) -> &Reach {
        &self.reaches[id as usize]
    }

    /// `nft -f` text adding the chains of the classes not yet declared (empty if none).
    pub fn undeclared(&self) -> String {
        if self.declared == self.reaches.len() {
            return String::new();
        }
        let mut t = format!("table ip {TABLE} {{\n");
        for (id, reach) in self.reaches.iter().enumerate().skip(self.declared) {
            class_chain(&mut t, id, reach);
        }
        t.push_str("}\n");
        t
    }

    /// Records that every class numbered so far has its chain.
    pub fn declared(&mut self) {
        self.declared = self.reaches.len();
    }
}

fn class_chain(out: &mut String, id: usize, reach: &Reach) {
    if *reach == elements::everything() {
        let _ = writeln!(out, "\tchain ports-{id} {{\n\t\taccept\n\t}}");
        return;
    }
    let _ = write!(out, "\tchain ports-{id} {{\n\t\tmeta l4proto . th dport {{ ");
    for (i, (protocol, port)) in reach.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        range(out, *protocol);
        out.push_str(" . ");
        range(out, *port);
    }
    out.push_str(" } accept\n\t}\n");
}

/// Elements per `add element` statement: nft's parser handles long lists, but one error
/// message quoting a megabyte helps nobody.
const CHUNK: usize = 512;

/// Shards per direction: a node's Pod range is a /24, so each local Pod has its own set
/// (the kernel's cost per element change grows with the set it changes).
pub const SHARDS: u32 = 256;

const DIRECTIONS: [Direction; 2] = [Direction::Ingress, Direction::Egress];

fn name(direction: Direction) -> &'static str {
    match direction {
        Direction::Ingress => "ingress",
        Direction::Egress => "egress",
    }
}

fn shard(pod: Ipv4Addr) -> u32 {
    u32::from(pod) % SHARDS
}

/// The verdict map of the Pods isolated in `direction`.
fn pods_map(direction: Direction) -> String {
    format!("{}-pods", name(direction))
}

/// The verdict map of `pod . peer` in `direction`.
fn peers_map(direction: Direction) -> String {
    format!("{}-peers", name(direction))
}

/// The chain checking the Pods of `pod`'s shard, and its set.
fn chain(direction: Direction, pod: Ipv4Addr) -> String {
    format!("{}-{}", name(direction), shard(pod))
}

fn allowed_set(direction: Direction, pod: Ipv4Addr) -> String {
    format!("{}-allowed-{}", name(direction), shard(pod))
}

fn declaration(classes: &Classes) -> String {
    let mut t = format!("table ip {TABLE} {{\n");
    for direction in DIRECTIONS {
        let d = name(direction);
        let (pod, peer) = match direction {
            Direction::Ingress => ("daddr", "saddr"),
            Direction::Egress => ("saddr", "daddr"),
        };
        let _ = writeln!(t, "\tmap {d}-pods {{ type ipv4_addr : verdict; }}");
        let _ = writeln!(t, "\tmap {d}-peers {{ type ipv4_addr . ipv4_addr : verdict; }}");
        for n in 0..SHARDS {
            let _ = writeln!(
                t,
                "\tset {d}-allowed-{n} {{ type ipv4_addr . ipv4_addr . inet_proto . inet_service; flags interval; }}\n\
                 \tchain {d}-{n} {{\n\t\tip {pod} . ip {peer} . meta l4proto . th dport @{d}-allowed-{n} accept\n\
                 \t\tdrop\n\t}}"
            );
        }
    }
    for (id, reach) in classes.reaches.iter().enumerate() {
        class_chain(&mut t, id, reach);
    }
    // One base chain per direction and hook: `accept` ends only its own base chain, so an
    // egress accept still meets the ingress check (priority 1) of the destination.
    for (chain, hook, priority, direction) in [
        ("forward-egress", "forward", 0, Direction::Egress),
        ("forward-ingress", "forward", 1, Direction::Ingress),
        ("input-egress", "input", 0, Direction::Egress),
    ] {
        let d = name(direction);
        let (pod, peer) = match direction {
            Direction::Ingress => ("daddr", "saddr"),
            Direction::Egress => ("saddr", "daddr"),
        };
        let _ = writeln!(
            t,
            "\tchain {chain} {{\n\t\ttype filter hook {hook} priority {priority}; policy accept;\n\
             \t\tct state established,related accept\n\
             \t\tip {pod} . ip {peer} vmap @{d}-peers\n\
             \t\tip {pod} vmap @{d}-pods\n\t}}"
        );
    }
    t.push_str("}\n");
    t
}

fn range<T: PartialEq + std::fmt::Display>(out: &mut String, (a, b): (T, T)) {
    if a == b {
        let _ = write!(out, "{a}");
    } else {
        let _ = write!(out, "{a}-{b}");
    }
}

fn element(out: &mut String, pod: Ipv4Addr, e: &Element) {
    let _ = write!(out, "{pod} . ");
    range(out, (Ipv4Addr::from(e.peer.0), Ipv4Addr::from(e.peer.1)));
    out.push_str(" . ");
    range(out, e.protocol);
    out.push_str(" . ");
    range(out, e.port);
}

/// `add|delete element ip gitplane-policy <set> { ... }` lines for `items`.
fn statements<'a>(out: &mut String, verb: &str, set: &str, items: impl Iterator<Item = (Ipv4Addr, &'a Element)>) {
    let items: Vec<_> = items.collect();
    for chunk in items.chunks(CHUNK) {
        let _ = write!(out, "{verb} element ip {TABLE} {set} {{ ");
        for (i, (pod, e)) in chunk.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            element(out, *pod, e);
        }
        out.push_str(" }\n");
    }
}

/// The whole table, replacing whatever of it the kernel holds, in one transaction; `classes`
/// numbers every class the sets name.
pub fn full<'a>(pods: impl Iterator<Item = (Ipv4Addr, &'a PodSets)> + Clone, classes: &Classes) -> String {
    let mut out = format!("add table ip {TABLE}\ndelete table ip {TABLE}\n");
    out.push_str(&declaration(classes));
    for direction in DIRECTIONS {
        let isolated: Vec<(Ipv4Addr, &Sets)> =
            pods.clone().filter_map(|(ip, s)| Some((ip, s.get(direction)?))).collect();
        for chunk in isolated.chunks(CHUNK) {
            let list: Vec<String> =
                chunk.iter().map(|(ip, _)| format!("{ip} : jump {}", chain(direction, *ip))).collect();
            let _ = writeln!(out, "add element ip {TABLE} {} {{ {} }}", pods_map(direction), list.join(", "));
        }
        let mut shards: BTreeMap<String, Vec<(Ipv4Addr, &Element)>> = BTreeMap::new();
        for (ip, sets) in &isolated {
            shards.entry(allowed_set(direction, *ip)).or_default().extend(sets.spans.iter().map(|e| (*ip, e)));
        }
        for (set, items) in shards {
            statements(&mut out, "add", &set, items.into_iter());
        }
        let peers: Vec<String> = isolated
            .iter()
            .flat_map(|(ip, sets)| {
                sets.peers
                    .iter()
                    .map(move |(peer, class)| format!("{ip} . {} : jump ports-{class}", Ipv4Addr::from(*peer)))
            })
            .collect();
        for chunk in peers.chunks(CHUNK) {
            let _ = writeln!(out, "add element ip {TABLE} {} {{ {} }}", peers_map(direction), chunk.join(", "));
        }
    }
    out
}

/// An element's key and key end.
type KeyRange = ([u8; 16], [u8; 16]);

/// An element's key and key end as the kernel stores `pod . peer . protocol . port` (every
/// field padded to 4 bytes, addresses and ports in network order).
fn key(pod: Ipv4Addr, e: &Element) -> KeyRange {
    let field = |peer: u32, protocol: u8, port: u16| {
        let mut k = [0u8; 16];
        k[0..4].copy_from_slice(&pod.octets());
        k[4..8].copy_from_slice(&peer.to_be_bytes());
        k[8] = protocol;
        k[12..14].copy_from_slice(&port.to_be_bytes());
        k
    };
    (field(e.peer.0, e.protocol.0, e.port.0), field(e.peer.1, e.protocol.1, e.port.1))
}

/// Element changes as one netlink transaction: every delete first, so an element that
/// changed shape never overlaps its old self and a peer that changed class can come back.
pub(crate) fn transaction(changes: &[SetChange]) -> Transaction {
    let mut t = Transaction::new(TABLE);
    for (change, came) in [(Change::Delete, false), (Change::Add, true)] {
        for direction in DIRECTIONS {
            let ours = changes.iter().filter(|c| c.direction == direction);
            let isolation = if came { (false, true) } else { (true, false) };
            let pods: Vec<([u8; 4], String)> = ours
                .clone()
                .filter(|c| c.isolated == isolation)
                .map(|c| (c.pod.octets(), chain(direction, c.pod)))
                .collect();
            t.jumps(change, &pods_map(direction), pods.iter().map(|(k, chain)| (&k[..], chain.as_str())));
            let mut shards: BTreeMap<String, Vec<KeyRange>> = BTreeMap::new();
            for c in ours.clone() {
                let keys = (if came { &c.came } else { &c.gone }).iter().map(|e| key(c.pod, e));
                shards.entry(allowed_set(direction, c.pod)).or_default().extend(keys);
            }
            for (set, keys) in shards {
                t.elements(change, &set, keys.iter().map(|(k, end)| (&k[..], Some(&end[..]))));
            }
            let pair = |pod: Ipv4Addr, peer: u32| {
                let mut k = [0u8; 8];
                k[..4].copy_from_slice(&pod.octets());
                k[4..].copy_from_slice(&peer.to_be_bytes());
                k
            };
            let peers: Vec<([u8; 8], String)> = match came {
                true => ours
                    .flat_map(|c| {
                        c.peers_came.iter().map(|(peer, class)| (pair(c.pod, *peer), format!("ports-{class}")))
                    })
                    .collect(),
                false => {
                    ours.flat_map(|c| c.peers_gone.iter().map(|peer| (pair(c.pod, *peer), String::new()))).collect()
                }
            };
            t.jumps(change, &peers_map(direction), peers.iter().map(|(k, chain)| (&k[..], chain.as_str())));
        }
    }
    t
}

/// Removes the table.
pub fn removal() -> String {
    netfilter::table_removal(TABLE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::network::policy::desired::{TCP, UDP};

    fn e(peer: (u32, u32), protocol: (u8, u8), port: (u16, u16)) -> Element {
        Element { peer, protocol, port }
    }

    #[test]
    fn full_declares_the_layout_and_every_element() {
        let pod: Ipv4Addr = "10.244.1.2".parse().unwrap();
        let mut classes = Classes::default();
        let web = classes.id(vec![((TCP, TCP), (80, 80)), ((TCP, TCP), (8000, 8100))]);
        let any = classes.id(elements::everything());
        let sets = PodSets {
            ingress: Some(Sets {
                spans: vec![e((0x0af40200, 0x0af402ff), (TCP, TCP), (80, 90))],
                peers: BTreeMap::from([(0x0af40305, web), (0x0af40306, any)]),
            }),
            egress: Some(Sets::default()),
        };
        let text = full([(pod, &sets)].into_iter(), &classes);
        assert!(
            text.starts_with(
                "add table ip gitplane-policy\ndelete table ip gitplane-policy\ntable ip gitplane-policy {"
            )
        );
        // 10.244.1.2 is 0x0af40102: shard 2.
        assert!(text.contains("add element ip gitplane-policy ingress-pods { 10.244.1.2 : jump ingress-2 }\n"));
        assert!(text.contains("add element ip gitplane-policy egress-pods { 10.244.1.2 : jump egress-2 }\n"));
        assert!(text.contains(
            "add element ip gitplane-policy ingress-allowed-2 { 10.244.1.2 . 10.244.2.0-10.244.2.255 . 6 . 80-90 }\n"
        ));
        assert!(text.contains(
            "add element ip gitplane-policy ingress-peers { 10.244.1.2 . 10.244.3.5 : jump ports-0, 10.244.1.2 . 10.244.3.6 : jump ports-1 }\n"
        ));
        assert!(
            text.contains("\tchain ports-0 {\n\t\tmeta l4proto . th dport { 6 . 80, 6 . 8000-8100 } accept\n\t}\n")
        );
        assert!(text.contains("\tchain ports-1 {\n\t\taccept\n\t}\n"));
        assert!(!text.contains("add element ip gitplane-policy egress-allowed"), "no egress element: {text}");
        assert!(!text.contains("add element ip gitplane-policy egress-peers"), "no egress element: {text}");
        assert!(text.contains(
            "\tchain forward-ingress {\n\t\ttype filter hook forward priority 1; policy accept;\n\
             \t\tct state established,related accept\n\t\tip daddr . ip saddr vmap @ingress-peers\n\
             \t\tip daddr vmap @ingress-pods\n\t}"
        ));
        assert!(text.contains(
            "\tchain egress-63 {\n\t\tip saddr . ip daddr . meta l4proto . th dport @egress-allowed-63 accept\n\
             \t\tdrop\n\t}"
        ));
        // Every class has its chain in the full text; none is left to declare.
        classes.declared();
        assert_eq!(classes.undeclared(), "");
        let next = classes.id(vec![((UDP, UDP), (53, 53))]);
        assert_eq!(classes.id(elements::everything()), any, "a class keeps its number");
        assert_eq!(
            classes.undeclared(),
            format!(
                "table ip gitplane-policy {{\n\tchain ports-{next} {{\n\t\tmeta l4proto . th dport {{ 17 . 53 }} accept\n\t}}\n}}\n"
            )
        );
    }
}
