//! The nftables layout of NetworkPolicy, as `nft -f` text. Pure.
//!
//! Table `ip gitplane-policy`, fixed rules, every Pod a matter of set elements:
//! - `ingress-isolated` / `egress-isolated`: the local Pods some policy isolates.
//! - `ingress-allowed` (`pod . peer . protocol . port`, intervals) and `egress-allowed` (the
//!   same, the peer being the destination): what they may receive and send.
//! - `forward` (filter hook, priority 0: after the proxy's DNAT at -100, so policy sees Pod
//!   addresses, never ClusterIPs) and `input` (a Pod's traffic to its node, e.g. cluster DNS on
//!   the node's loopback): established and related traffic first (the replies of allowed
//!   connections), then the egress check of an isolated source, then (forward only) the
//!   ingress check of an isolated destination; each check returns when its set allows the
//!   packet and drops otherwise.
//!
//! What the node itself sends (kubelet probes, host-network Pods) leaves through output and
//! postrouting, which this table does not hook: a Pod's own node may always reach it, as
//! Kubernetes documents. Pods that no policy isolates have no element: policies that select
//! nothing on this node cost it nothing.

use super::desired::Direction;
use super::elements::Element;
use crate::proxy::netlink::{Change, Transaction};
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

const DIRECTIONS: [(Direction, &str, &str); 2] = [
    (Direction::Ingress, "ingress-isolated", "ingress-allowed"),
    (Direction::Egress, "egress-isolated", "egress-allowed"),
];

fn declaration() -> String {
    let allowed = "type ipv4_addr . ipv4_addr . inet_proto . inet_service; flags interval;";
    let mut t = format!("table ip {TABLE} {{\n");
    for (_, isolated, allow) in DIRECTIONS {
        let _ = writeln!(t, "\tset {isolated} {{ type ipv4_addr; }}");
        let _ = writeln!(t, "\tset {allow} {{ {allowed} }}");
    }
    t.push_str(
        "\tchain forward {\n\t\ttype filter hook forward priority 0; policy accept;\n\
         \t\tct state established,related accept\n\
         \t\tip saddr @egress-isolated jump egress\n\
         \t\tip daddr @ingress-isolated jump ingress\n\t}\n\
         \tchain input {\n\t\ttype filter hook input priority 0; policy accept;\n\
         \t\tct state established,related accept\n\
         \t\tip saddr @egress-isolated jump egress\n\t}\n\
         \tchain egress {\n\t\tip saddr . ip daddr . meta l4proto . th dport @egress-allowed return\n\t\tdrop\n\t}\n\
         \tchain ingress {\n\t\tip daddr . ip saddr . meta l4proto . th dport @ingress-allowed return\n\t\tdrop\n\t}\n}\n",
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

fn isolated(out: &mut String, verb: &str, set: &str, pods: &[Ipv4Addr]) {
    for chunk in pods.chunks(CHUNK) {
        let list: Vec<String> = chunk.iter().map(Ipv4Addr::to_string).collect();
        let _ = writeln!(out, "{verb} element ip {TABLE} {set} {{ {} }}", list.join(", "));
    }
}

/// The whole table, replacing whatever of it the kernel holds, in one transaction.
pub fn full<'a>(pods: impl Iterator<Item = (Ipv4Addr, &'a PodSets)> + Clone) -> String {
    let mut out = format!("add table ip {TABLE}\ndelete table ip {TABLE}\n");
    out.push_str(&declaration());
    for (direction, isolated_set, allowed_set) in DIRECTIONS {
        let isolated_pods: Vec<Ipv4Addr> =
            pods.clone().filter(|(_, s)| s.get(direction).is_some()).map(|(ip, _)| ip).collect();
        isolated(&mut out, "add", isolated_set, &isolated_pods);
        statements(
            &mut out,
            "add",
            allowed_set,
            pods.clone().flat_map(|(ip, s)| s.get(direction).into_iter().flatten().map(move |e| (ip, e))),
        );
    }
    out
}

/// An element's key and key end as the kernel stores `pod . peer . protocol . port` (every
/// field padded to 4 bytes, addresses and ports in network order).
fn key(pod: Ipv4Addr, e: &Element) -> ([u8; 16], [u8; 16]) {
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
        for (direction, isolated_set, allowed_set) in DIRECTIONS {
            let ours = changes.iter().filter(|c| c.direction == direction);
            let isolation = if came { (false, true) } else { (true, false) };
            let pods: Vec<[u8; 4]> = ours.clone().filter(|c| c.isolated == isolation).map(|c| c.pod.octets()).collect();
            t.elements(change, isolated_set, pods.iter().map(|k| (&k[..], None)));
            let keys: Vec<([u8; 16], [u8; 16])> =
                ours.flat_map(|c| (if came { &c.came } else { &c.gone }).iter().map(move |e| key(c.pod, e))).collect();
            t.elements(change, allowed_set, keys.iter().map(|(k, end)| (&k[..], Some(&end[..]))));
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
        assert!(text.contains("add element ip gitplane-policy ingress-isolated { 10.244.1.2 }\n"));
        assert!(text.contains("add element ip gitplane-policy egress-isolated { 10.244.1.2 }\n"));
        assert!(text.contains(
            "add element ip gitplane-policy ingress-allowed { 10.244.1.2 . 10.244.2.0-10.244.2.255 . 6 . 80-90 }\n"
        ));
        assert!(!text.contains("add element ip gitplane-policy egress-allowed"), "no egress element: {text}");
        assert!(text.contains("type filter hook forward priority 0; policy accept;"));
    }
}
