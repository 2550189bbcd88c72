//! A Pod's allows as elements of an nftables interval set keyed `peer . protocol . port`. The
//! kernel refuses overlapping elements in such a set, so the union of the allows is cut into
//! disjoint boxes: per protocol with ports (TCP, UDP, SCTP), the port axis is split where any
//! allow begins or ends and each piece gets the merged peer ranges covering it (neighbouring
//! pieces with the same ranges joined again); `Ports::All` adds every other protocol whole.

use super::desired::{Allow, Ports, SCTP, TCP, UDP};
use std::collections::BTreeSet;

/// One set element (bounds inclusive).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Element {
    pub peer: (u32, u32),
    pub protocol: (u8, u8),
    pub port: (u16, u16),
}

/// Address ranges (bounds inclusive).
type Ranges = Vec<(u32, u32)>;

/// The protocols other than TCP, UDP and SCTP, as ranges.
const OTHER_PROTOCOLS: [(u8, u8); 4] = [(0, TCP - 1), (TCP + 1, UDP - 1), (UDP + 1, SCTP - 1), (SCTP + 1, u8::MAX)];

/// Sorted, overlapping or adjacent ranges joined.
fn merge(mut ranges: Ranges) -> Ranges {
    ranges.sort_unstable();
    let mut out: Vec<(u32, u32)> = Vec::with_capacity(ranges.len());
    for (a, b) in ranges {
        match out.last_mut() {
            Some(last) if a <= last.1.saturating_add(1) => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

/// The disjoint elements covering exactly what `allows` allow.
pub fn elements(allows: &BTreeSet<Allow>) -> Vec<Element> {
    let everything: Ranges =
        merge(allows.iter().filter(|a| a.ports == Ports::All).map(|a| (a.first, a.last)).collect());
    let mut out = Vec::new();
    for protocol in [TCP, UDP, SCTP] {
        // (peer range, first port, last port) boxes of this protocol.
        let boxes: Vec<((u32, u32), u16, u16)> = allows
            .iter()
            .filter_map(|a| match a.ports {
                Ports::Range { protocol: p, first, last } if p == protocol => Some(((a.first, a.last), first, last)),
                _ => None,
            })
            .chain(everything.iter().map(|r| (*r, 0, u16::MAX)))
            .collect();
        if boxes.is_empty() {
            continue;
        }
        let mut cuts: Vec<u32> =
            boxes.iter().flat_map(|(_, first, last)| [u32::from(*first), u32::from(*last) + 1]).collect();
        cuts.sort_unstable();
        cuts.dedup();
        // (first port, last port, peers) pieces, neighbours with equal peers joined.
        let mut pieces: Vec<(u16, u16, Ranges)> = Vec::new();
        for w in cuts.windows(2) {
            let (first, last) = (w[0] as u16, (w[1] - 1) as u16);
            let peers = merge(boxes.iter().filter(|(_, f, l)| *f <= first && last <= *l).map(|(r, _, _)| *r).collect());
            if peers.is_empty() {
                continue;
            }
            match pieces.last_mut() {
                Some(prev) if prev.2 == peers && u32::from(prev.1) + 1 == u32::from(first) => prev.1 = last,
                _ => pieces.push((first, last, peers)),
            }
        }
        for (first, last, peers) in pieces {
            out.extend(peers.into_iter().map(|peer| Element {
                peer,
                protocol: (protocol, protocol),
                port: (first, last),
            }));
        }
    }
    for protocol in OTHER_PROTOCOLS {
        out.extend(everything.iter().map(|&peer| Element { peer, protocol, port: (0, u16::MAX) }));
    }
    out.sort_unstable();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allow(first: u32, last: u32, ports: Ports) -> Allow {
        Allow { first, last, ports }
    }

    fn tcp(first: u16, last: u16) -> Ports {
        Ports::Range { protocol: TCP, first, last }
    }

    /// Whether the elements allow (peer, protocol, port), by brute force over the elements.
    fn allowed(elements: &[Element], peer: u32, protocol: u8, port: u16) -> bool {
        elements.iter().any(|e| {
            (e.peer.0..=e.peer.1).contains(&peer)
                && (e.protocol.0..=e.protocol.1).contains(&protocol)
                && (e.port.0..=e.port.1).contains(&port)
        })
    }

    fn overlap(a: &Element, b: &Element) -> bool {
        a.peer.0 <= b.peer.1
            && b.peer.0 <= a.peer.1
            && a.protocol.0 <= b.protocol.1
            && b.protocol.0 <= a.protocol.1
            && a.port.0 <= b.port.1
            && b.port.0 <= a.port.1
    }

    #[test]
    fn disjoint_and_exactly_the_union() {
        let allows: BTreeSet<Allow> = [
            allow(10, 20, tcp(80, 80)),
            allow(15, 30, tcp(70, 90)),
            allow(21, 25, tcp(80, 80)),
            allow(100, 100, Ports::All),
            allow(40, 40, tcp(0, 65535)),
            allow(40, 41, Ports::Range { protocol: UDP, first: 53, last: 53 }),
            allow(100, 100, tcp(5, 6)),
        ]
        .into();
        let elements = elements(&allows);
        for (i, a) in elements.iter().enumerate() {
            for b in &elements[i + 1..] {
                assert!(!overlap(a, b), "{a:?} overlaps {b:?}");
            }
        }
        for peer in [9, 10, 14, 15, 20, 21, 25, 26, 30, 31, 40, 41, 99, 100, 101] {
            for (protocol, port) in
                [(TCP, 69), (TCP, 70), (TCP, 80), (TCP, 90), (TCP, 91), (UDP, 53), (UDP, 54), (1, 0), (SCTP, 7)]
            {
                let expected = allows.iter().any(|a| {
                    (a.first..=a.last).contains(&peer)
                        && match a.ports {
                            Ports::All => true,
                            Ports::Range { protocol: p, first, last } => {
                                p == protocol && (first..=last).contains(&port)
                            }
                        }
                });
                assert_eq!(allowed(&elements, peer, protocol, port), expected, "peer {peer} {protocol}/{port}");
            }
        }
        // 10-30 on 80 joins into one range; 15-30 on 70-79 and 81-90.
        assert!(elements.contains(&Element { peer: (10, 30), protocol: (TCP, TCP), port: (80, 80) }));
    }

    #[test]
    fn allow_all_is_one_element_per_protocol_range() {
        let elements = elements(&[allow(0, u32::MAX, Ports::All)].into());
        assert_eq!(elements.len(), 7);
        assert!(elements.iter().all(|e| e.peer == (0, u32::MAX) && e.port == (0, u16::MAX)));
    }
}
