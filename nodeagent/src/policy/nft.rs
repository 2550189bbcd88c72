//! The nftables layout of NetworkPolicy, as `nft -f` text. Pure.
//!
//! Table `ip gitplane-policy`, fixed rules, every Pod a matter of set elements:
//! - `ingress-pods` / `egress-pods`: verdict maps from each local Pod some policy isolates to
//!   `jump ingress-N` / `jump egress-N`, N its shard (its address modulo [`SHARDS`]).
//! - `ingress-allowed-N` (`pod . peer . protocol . port`, intervals) and `egress-allowed-N`
//!   (the same, the peer being the destination): what the Pods of shard N may receive and send;
//!   chain `ingress-N` / `egress-N` returns when its set has the packet and drops otherwise.
//! - `forward` (filter hook, priority 0: after the proxy's DNAT at -100, so policy sees Pod
//!   addresses, never ClusterIPs) and `input` (a Pod's traffic to its node, e.g. cluster DNS on
//!   the node's loopback): established and related traffic first (the replies of allowed
//!   connections), then the egress check of an isolated source, then (forward only) the
//!   ingress check of an isolated destination.
//!
//! Why shards: the kernel keeps a concatenated interval set (pipapo) as bitmaps as wide as the
//! set has rules; a packet's lookup scans them, an element's overlap check on insertion too,
//! and a deletion shifts all of them. One set for the node made each of these cost what the
//! whole node holds; a shard holds a few Pods. The number of chains stays fixed.
//!
//! What the node itself sends (kubelet probes, host-network Pods) leaves through output and
//! postrouting, which this table does not hook: a Pod's own node may always reach it, as
//! Kubernetes documents. Pods that no policy isolates have no element: policies that select
//! nothing on this node cost it nothing.

use super::desired::Direction;
use super::elements::Element;
use crate::proxy::netlink::{Change, Transaction};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::net::Ipv4Addr;

pub const TABLE: &str = "gitplane-policy";

/// The elements of one local Pod, sorted: `None` for a direction it is not isolated in.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodSets {
    pub ingress: Option<Vec<Element>>,
    pub egress: Option<Vec<Element>>,
}

impl PodSets {
    pub fn get(&self, direction: Direction) -> Option<&Vec<Element>> {
        match direction {
            Direction::Ingress => self.ingress.as_ref(),
            Direction::Egress => self.egress.as_ref(),
        }
    }

    pub fn get_mut(&mut self, direction: Direction) -> &mut Option<Vec<Element>> {
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
    /// Elements to delete and to add, sorted.
    pub gone: Vec<Element>,
    pub came: Vec<Element>,
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

/// The chain checking the Pods of `pod`'s shard, and its set.
fn chain(direction: Direction, pod: Ipv4Addr) -> String {
    format!("{}-{}", name(direction), shard(pod))
}

fn allowed_set(direction: Direction, pod: Ipv4Addr) -> String {
    format!("{}-allowed-{}", name(direction), shard(pod))
}

fn declaration() -> String {
    let mut t = format!("table ip {TABLE} {{\n");
    for direction in DIRECTIONS {
        let d = name(direction);
        let (pod, peer) = match direction {
            Direction::Ingress => ("daddr", "saddr"),
            Direction::Egress => ("saddr", "daddr"),
        };
        let _ = writeln!(t, "\tmap {d}-pods {{ type ipv4_addr : verdict; }}");
        for n in 0..SHARDS {
            let _ = writeln!(
                t,
                "\tset {d}-allowed-{n} {{ type ipv4_addr . ipv4_addr . inet_proto . inet_service; flags interval; }}\n\
                 \tchain {d}-{n} {{\n\t\tip {pod} . ip {peer} . meta l4proto . th dport @{d}-allowed-{n} return\n\t\tdrop\n\t}}"
            );
        }
    }
    t.push_str(
        "\tchain forward {\n\t\ttype filter hook forward priority 0; policy accept;\n\
         \t\tct state established,related accept\n\
         \t\tip saddr vmap @egress-pods\n\
         \t\tip daddr vmap @ingress-pods\n\t}\n\
         \tchain input {\n\t\ttype filter hook input priority 0; policy accept;\n\
         \t\tct state established,related accept\n\
         \t\tip saddr vmap @egress-pods\n\t}\n}\n",
    );
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

/// The whole table, replacing whatever of it the kernel holds, in one transaction.
pub fn full<'a>(pods: impl Iterator<Item = (Ipv4Addr, &'a PodSets)> + Clone) -> String {
    let mut out = format!("add table ip {TABLE}\ndelete table ip {TABLE}\n");
    out.push_str(&declaration());
    for direction in DIRECTIONS {
        let isolated: Vec<(Ipv4Addr, &Vec<Element>)> =
            pods.clone().filter_map(|(ip, s)| Some((ip, s.get(direction)?))).collect();
        for chunk in isolated.chunks(CHUNK) {
            let list: Vec<String> =
                chunk.iter().map(|(ip, _)| format!("{ip} : jump {}", chain(direction, *ip))).collect();
            let _ = writeln!(out, "add element ip {TABLE} {} {{ {} }}", pods_map(direction), list.join(", "));
        }
        let mut shards: BTreeMap<String, Vec<(Ipv4Addr, &Element)>> = BTreeMap::new();
        for (ip, elements) in isolated {
            shards.entry(allowed_set(direction, ip)).or_default().extend(elements.iter().map(|e| (ip, e)));
        }
        for (set, items) in shards {
            statements(&mut out, "add", &set, items.into_iter());
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
/// changed shape never overlaps its old self.
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
            for c in ours {
                let keys = (if came { &c.came } else { &c.gone }).iter().map(|e| key(c.pod, e));
                shards.entry(allowed_set(direction, c.pod)).or_default().extend(keys);
            }
            for (set, keys) in shards {
                t.elements(change, &set, keys.iter().map(|(k, end)| (&k[..], Some(&end[..]))));
            }
        }
    }
    t
}

/// Removes the table.
pub fn removal() -> String {
    format!("add table ip {TABLE}\ndelete table ip {TABLE}\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::desired::TCP;

    fn e(peer: (u32, u32), protocol: (u8, u8), port: (u16, u16)) -> Element {
        Element { peer, protocol, port }
    }

    #[test]
    fn full_declares_the_layout_and_every_element() {
        let pod: Ipv4Addr = "10.244.1.2".parse().unwrap();
        let sets = PodSets {
            ingress: Some(vec![e((0x0af40200, 0x0af402ff), (TCP, TCP), (80, 90))]),
            egress: Some(Vec::new()),
        };
        let text = full([(pod, &sets)].into_iter());
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
        assert!(!text.contains("add element ip gitplane-policy egress-allowed"), "no egress element: {text}");
        assert!(text.contains("type filter hook forward priority 0; policy accept;"));
        assert!(text.contains(
            "\tchain egress-63 {\n\t\tip saddr . ip daddr . meta l4proto . th dport @egress-allowed-63 return\n\t\tdrop\n\t}"
        ));
    }
}
