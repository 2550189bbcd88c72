//! A local Pod's allows in one direction, each counted by the (rule, peer) pairs that give it.
//!
//! Counting is what lets a peer Pod come or go as a change at its own address: its
//! contributions are added or taken away, and an allow that another rule or policy also gives
//! stays. The allows of one address (peer Pods, nearly all of them) are kept by address, so the
//! pieces around one address are found without a scan; wider ones (ipBlocks, "every address")
//! are few and kept apart.

use std::collections::BTreeMap;

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

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Allows {
    /// Allows of one address: (address, ports) -> count.
    points: BTreeMap<(u32, Ports), u32>,
    /// Allows of more addresses -> count.
    spans: BTreeMap<Allow, u32>,
}

impl Allows {
    /// Counts `allow` once more; true if it was not allowed before.
    pub fn add(&mut self, allow: Allow) -> bool {
        let count = if allow.first == allow.last {
            self.points.entry((allow.first, allow.ports)).or_default()
        } else {
            self.spans.entry(allow).or_default()
        };
        *count += 1;
        *count == 1
    }

    /// Counts `allow` once less; true if nothing gives it any more.
    pub fn remove(&mut self, allow: Allow) -> bool {
        let gone = if allow.first == allow.last {
            decrement(&mut self.points, (allow.first, allow.ports))
        } else {
            decrement(&mut self.spans, allow)
        };
        debug_assert!(gone.is_some(), "{allow:?} taken away more often than given");
        gone == Some(true)
    }

    /// How many (rule, peer) pairs give `allow`.
    pub fn count(&self, allow: &Allow) -> u32 {
        let count = if allow.first == allow.last {
            self.points.get(&(allow.first, allow.ports))
        } else {
            self.spans.get(allow)
        };
        count.copied().unwrap_or(0)
    }

    /// The distinct allows touching addresses `lo..=hi`.
    pub fn overlapping(&self, lo: u32, hi: u32) -> impl Iterator<Item = Allow> + '_ {
        let points = self.points(lo, hi).map(|(address, ports)| Allow { first: address, last: address, ports });
        points.chain(self.spans(lo, hi))
    }

    /// The distinct allows of one address in `lo..=hi`, by address.
    pub fn points(&self, lo: u32, hi: u32) -> impl Iterator<Item = (u32, Ports)> + '_ {
        self.points.range((lo, Ports::All)..).take_while(move |((address, _), _)| *address <= hi).map(|(&k, _)| k)
    }

    /// The distinct allows of more than one address touching `lo..=hi`.
    pub fn spans(&self, lo: u32, hi: u32) -> impl Iterator<Item = Allow> + '_ {
        self.spans.keys().filter(move |a| a.first <= hi && a.last >= lo).copied()
    }

    /// Every distinct allow.
    pub fn iter(&self) -> impl Iterator<Item = Allow> + '_ {
        self.overlapping(0, u32::MAX)
    }

    pub fn is_empty(&self) -> bool {
        self.points.is_empty() && self.spans.is_empty()
    }
}

/// Takes one from `key`'s count, dropping it at zero: `Some(true)` if it dropped, `None` if
/// there was no count.
fn decrement<K: Ord>(map: &mut BTreeMap<K, u32>, key: K) -> Option<bool> {
    let count = map.get_mut(&key)?;
    *count -= 1;
    if *count == 0 {
        map.remove(&key);
        return Some(true);
    }
    Some(false)
}

impl FromIterator<Allow> for Allows {
    fn from_iter<I: IntoIterator<Item = Allow>>(iter: I) -> Allows {
        let mut allows = Allows::default();
        for a in iter {
            allows.add(a);
        }
        allows
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::network::policy::desired::TCP;

    #[test]
    fn counts_and_finds_by_address() {
        let tcp80 = Ports::Range { protocol: TCP, first: 80, last: 80 };
        let point = |a| Allow { first: a, last: a, ports: tcp80 };
        let span = Allow { first: 10, last: 20, ports: Ports::All };
        let mut allows = Allows::default();
        assert!(allows.add(point(5)));
        assert!(!allows.add(point(5)), "given twice");
        assert!(allows.add(span));
        assert!(allows.add(Allow { first: 30, last: 30, ports: Ports::All }));
        assert_eq!(allows.count(&point(5)), 2);
        assert_eq!(allows.overlapping(5, 5).collect::<Vec<_>>(), [point(5)]);
        assert_eq!(allows.overlapping(6, 12).collect::<Vec<_>>(), [span]);
        assert_eq!(allows.overlapping(21, 29).count(), 0);
        assert_eq!(allows.overlapping(0, 30).count(), 3);
        assert!(!allows.remove(point(5)), "still given once");
        assert!(allows.remove(point(5)));
        assert!(allows.remove(span));
        assert_eq!(allows.iter().collect::<Vec<_>>(), [Allow { first: 30, last: 30, ports: Ports::All }]);
    }
}
