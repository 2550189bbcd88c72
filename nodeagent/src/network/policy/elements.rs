//! A Pod's allows as nftables elements, in two parts.
//!
//! Allows of one address (peer Pods, nearly all of them) become one element per peer in a hash
//! map, the peer's [`Reach`] (the merged ports it may use): a peer Pod that comes or goes is one
//! element per local Pod it may talk to, and a hash map's insertion costs the same whatever it
//! holds. Allows of more addresses (ipBlocks, "every address") become elements of an interval
//! set keyed `peer . protocol . port`; the kernel refuses overlapping elements in such a set, so
//! their union is cut into disjoint boxes along the address axis: it is split where any of them
//! begins or ends, each piece gets the merged port ranges of those covering it (per protocol;
//! `Ports::All`: every protocol and port), and neighbouring pieces that allow the same are
//! joined again. A peer allowed by both is allowed: the kernel looks in either.
//!
//! Cut this way, an allow that comes or goes changes only the pieces around its addresses:
//! [`update`] recomputes those alone.

use super::allows::Allows;
use super::allows::Ports;
use super::desired::{SCTP, TCP, UDP};
use std::collections::BTreeMap;

/// One set element (bounds inclusive).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Element {
    pub peer: (u32, u32),
    pub protocol: (u8, u8),
    pub port: (u16, u16),
}

/// What a peer or a piece of the address axis may reach: (protocols, ports) boxes, sorted.
pub type Reach = Vec<((u8, u8), (u16, u16))>;

/// The reach of the allows counted in `active`.
fn reach(active: &BTreeMap<Ports, u32>) -> Reach {
    if active.contains_key(&Ports::All) {
        return everything();
    }
    let mut out: Reach = Vec::new();
    for protocol in [TCP, UDP, SCTP] {
        // `Ports` sort by protocol, then first port: the ranges of one protocol come in order.
        let mut merged: Vec<(u16, u16)> = Vec::new();
        for ports in active.keys() {
            let Ports::Range { protocol: p, first, last } = *ports else { continue };
            if p != protocol {
                continue;
            }
            match merged.last_mut() {
                Some(prev) if u32::from(first) <= u32::from(prev.1) + 1 => prev.1 = prev.1.max(last),
                _ => merged.push((first, last)),
            }
        }
        out.extend(merged.into_iter().map(|r| ((protocol, protocol), r)));
    }
    out
}

/// Every protocol and port.
pub fn everything() -> Reach {
    vec![((0, u8::MAX), (0, u16::MAX))]
}

/// The peers of one address in `lo..=hi` with what each may reach, by address.
pub fn peers(allows: &Allows, (lo, hi): (u32, u32)) -> Vec<(u32, Reach)> {
    let mut out = Vec::new();
    let mut points = allows.points(lo, hi).peekable();
    while let Some((address, ports)) = points.next() {
        let mut active = BTreeMap::from([(ports, 1)]);
        while let Some((_, ports)) = points.next_if(|(a, _)| *a == address) {
            active.insert(ports, 1);
        }
        out.push((address, reach(&active)));
    }
    out
}

/// The disjoint elements covering exactly what the allows of more than one address allow
/// between addresses `lo..=hi`.
fn within(allows: &Allows, (lo, hi): (u32, u32)) -> Vec<Element> {
    // (address, +1 begins / -1 ends, ports); an end is at the address after the last.
    let mut events: Vec<(u64, i32, Ports)> = Vec::new();
    for a in allows.spans(lo, hi) {
        events.push((u64::from(a.first.max(lo)), 1, a.ports));
        events.push((u64::from(a.last.min(hi)) + 1, -1, a.ports));
    }
    events.sort_unstable_by_key(|e| e.0);
    let mut active: BTreeMap<Ports, u32> = BTreeMap::new();
    let mut pieces: Vec<((u32, u32), Reach)> = Vec::new();
    let mut i = 0;
    while i < events.len() {
        let at = events[i].0;
        while i < events.len() && events[i].0 == at {
            let (_, delta, ports) = events[i];
            let count = active.entry(ports).or_default();
            if delta > 0 {
                *count += 1;
            } else {
                *count -= 1;
                if *count == 0 {
                    active.remove(&ports);
                }
            }
            i += 1;
        }
        if active.is_empty() || i == events.len() {
            continue;
        }
        let (first, last) = (at as u32, (events[i].0 - 1) as u32);
        let r = reach(&active);
        match pieces.last_mut() {
            Some(prev) if prev.1 == r && u64::from(prev.0.1) + 1 == u64::from(first) => prev.0.1 = last,
            _ => pieces.push(((first, last), r)),
        }
    }
    pieces
        .into_iter()
        .flat_map(|(peer, r)| r.into_iter().map(move |(protocol, port)| Element { peer, protocol, port }))
        .collect()
}

/// The disjoint elements covering exactly what the allows of more than one address allow, sorted.
pub fn elements(allows: &Allows) -> Vec<Element> {
    within(allows, (0, u32::MAX))
}

/// The element changes (gone, came) that take `old`, the [`elements`] of some allows, to the
/// elements of `allows`, when the allows changed only at the addresses of `changed`.
pub fn update(old: &[Element], allows: &Allows, changed: &[(u32, u32)]) -> (Vec<Element>, Vec<Element>) {
    // Each change's addresses and one more on each side (a piece there may now join it),
    // widened to the old pieces they touch, so that no old element straddles a window's edge.
    let mut windows: Vec<(u32, u32)> = changed
        .iter()
        .map(|&(first, last)| {
            let (mut lo, mut hi) = (first.saturating_sub(1), last.saturating_add(1));
            let i = old.partition_point(|e| e.peer.1 < lo);
            if let Some(e) = old.get(i).filter(|e| e.peer.0 <= lo) {
                lo = e.peer.0;
            }
            let j = old.partition_point(|e| e.peer.0 <= hi);
            if let Some(e) = j.checked_sub(1).map(|j| &old[j]).filter(|e| e.peer.1 >= hi) {
                hi = e.peer.1;
            }
            (lo, hi)
        })
        .collect();
    windows.sort_unstable();
    let mut merged: Vec<(u32, u32)> = Vec::with_capacity(windows.len());
    for (lo, hi) in windows {
        match merged.last_mut() {
            // Overlapping or adjacent: pieces on both sides may join.
            Some(prev) if u64::from(lo) <= u64::from(prev.1) + 1 => prev.1 = prev.1.max(hi),
            _ => merged.push((lo, hi)),
        }
    }
    let mut gone = Vec::new();
    let mut came = Vec::new();
    for (lo, hi) in merged {
        let before = &old[old.partition_point(|e| e.peer.1 < lo)..old.partition_point(|e| e.peer.0 <= hi)];
        let after = within(allows, (lo, hi));
        // Both sorted: keep what stays.
        gone.extend(before.iter().filter(|e| after.binary_search(e).is_err()));
        came.extend(after.iter().filter(|e| before.binary_search(e).is_err()));
    }
    (gone, came)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::network::policy::allows::Allow;
    use crate::network::policy::random::Random;

    fn allow(first: u32, last: u32, ports: Ports) -> Allow {
        Allow { first, last, ports }
    }

    fn tcp(first: u16, last: u16) -> Ports {
        Ports::Range { protocol: TCP, first, last }
    }

    /// Whether the elements or the peers allow (peer, protocol, port), by brute force.
    fn allowed(elements: &[Element], peers: &[(u32, Reach)], peer: u32, protocol: u8, port: u16) -> bool {
        let inside = |(protocols, ports): &((u8, u8), (u16, u16))| {
            (protocols.0..=protocols.1).contains(&protocol) && (ports.0..=ports.1).contains(&port)
        };
        elements.iter().any(|e| (e.peer.0..=e.peer.1).contains(&peer) && inside(&(e.protocol, e.port)))
            || peers.iter().any(|(address, reach)| *address == peer && reach.iter().any(inside))
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
        let allows = [
            allow(10, 20, tcp(80, 80)),
            allow(15, 30, tcp(70, 90)),
            allow(21, 25, tcp(80, 80)),
            allow(100, 100, Ports::All),
            allow(40, 40, tcp(0, 65535)),
            allow(40, 41, Ports::Range { protocol: UDP, first: 53, last: 53 }),
            allow(100, 100, tcp(5, 6)),
        ];
        let kept: Allows = allows.iter().copied().collect();
        let (elements, peers) = (elements(&kept), peers(&kept, (0, u32::MAX)));
        // 40 and 100 alone: peers, not elements; 40 reaches UDP 53 through the span 40-41 too.
        assert_eq!(
            peers,
            [(40, vec![((TCP, TCP), (0, 65535))]), (100, everything())],
            "one entry per address, its ports merged"
        );
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
                assert_eq!(allowed(&elements, &peers, peer, protocol, port), expected, "peer {peer} {protocol}/{port}");
            }
        }
        // 15-30 reaches 70-90 throughout (80 of 15-25 inside it): one element.
        assert!(elements.contains(&Element { peer: (10, 14), protocol: (TCP, TCP), port: (80, 80) }));
        assert!(elements.contains(&Element { peer: (15, 30), protocol: (TCP, TCP), port: (70, 90) }));
    }

    #[test]
    fn allow_all_is_one_element() {
        let elements = elements(&[allow(0, u32::MAX, Ports::All), allow(5, 9, tcp(80, 80))].into_iter().collect());
        assert_eq!(elements, [Element { peer: (0, u32::MAX), protocol: (0, u8::MAX), port: (0, u16::MAX) }]);
    }

    fn random_allow(random: &mut Random) -> Allow {
        let first = 100 + random.below(40) as u32;
        // Mostly single addresses (peer Pods), some blocks.
        let last = if random.below(4) == 0 { first + random.below(20) as u32 } else { first };
        let ports = match random.below(8) {
            0 => Ports::All,
            1 => Ports::Range { protocol: UDP, first: 53, last: 53 },
            n => {
                let first = [80, 81, 8000, 8080, 79, 8100][n as usize - 2];
                tcp(first, first + [0, 0, 100, 0, 1, 5][n as usize - 2])
            }
        };
        Allow { first, last, ports }
    }

    /// Allows coming and going one by one and in groups (the same allow given more than once
    /// too): the changes from `update` applied to the old elements give exactly the elements of
    /// the new allows.
    #[test]
    fn update_agrees_with_a_full_recomputation() {
        let mut random = Random(0x9e37_79b9_7f4a_7c15);
        for _ in 0..300 {
            // Every allow given, as often as it is given.
            let mut given: Vec<Allow> = (0..random.below(30)).map(|_| random_allow(&mut random)).collect();
            let mut allows: Allows = given.iter().copied().collect();
            let mut old = elements(&allows);
            for _ in 0..10 {
                let mut changed = Vec::new();
                for _ in 0..1 + random.below(3) {
                    let a = if !given.is_empty() && random.below(2) == 0 {
                        let a = given.swap_remove(random.below(given.len() as u64) as usize);
                        allows.remove(a);
                        a
                    } else {
                        let a = random_allow(&mut random);
                        given.push(a);
                        allows.add(a);
                        a
                    };
                    changed.push((a.first, a.last));
                }
                let (gone, came) = update(&old, &allows, &changed);
                let mut next: Vec<Element> = old.iter().filter(|e| !gone.contains(e)).copied().collect();
                assert_eq!(next.len() + gone.len(), old.len(), "only elements it had go");
                next.extend(&came);
                next.sort_unstable();
                assert_eq!(next, elements(&allows), "changed {changed:?}");
                old = next;
            }
        }
    }
}
