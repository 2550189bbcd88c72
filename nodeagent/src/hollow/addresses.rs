//! A hollow node's Pod addresses: from its podCIDR as host-local gives them (the network's and
//! the broadcast address and the bridge's gateway, the first host, never), the lowest free first.

use crate::network::cidr::Ipv4Cidr;
use std::{collections::BTreeSet, net::Ipv4Addr};

#[derive(Debug)]
pub struct PodAddresses {
    cidr: Ipv4Cidr,
    /// Offsets in the podCIDR in use.
    used: BTreeSet<u32>,
}

impl PodAddresses {
    pub fn new(cidr: Ipv4Cidr) -> PodAddresses {
        PodAddresses { cidr, used: BTreeSet::new() }
    }

    fn offset(&self, ip: Ipv4Addr) -> Option<u32> {
        self.cidr.contains(ip).then(|| u32::from(ip) - u32::from(self.cidr.addr()))
    }

    fn size(&self) -> u32 {
        1u32.checked_shl(32 - u32::from(self.cidr.prefix())).unwrap_or(u32::MAX)
    }

    /// The lowest free address, now in use; `None` when the podCIDR is full.
    pub fn take(&mut self) -> Option<Ipv4Addr> {
        let offset = (2..self.size().saturating_sub(1)).find(|o| !self.used.contains(o))?;
        self.used.insert(offset);
        Some(Ipv4Addr::from(u32::from(self.cidr.addr()) + offset))
    }

    /// Marks `ip` in use (a Pod that already has it); whether it lies in the podCIDR.
    pub fn keep(&mut self, ip: Ipv4Addr) -> bool {
        self.offset(ip).map(|o| self.used.insert(o)).is_some()
    }

    pub fn release(&mut self, ip: Ipv4Addr) {
        if let Some(o) = self.offset(ip) {
            self.used.remove(&o);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_given_lowest_first_and_never_the_reserved_ones() {
        struct Case {
            cidr: &'static str,
            kept: &'static [&'static str],
            released: &'static [&'static str],
            taken: &'static [Option<&'static str>],
        }
        let cases = [
            Case { cidr: "10.244.3.0/24", kept: &[], released: &[], taken: &[Some("10.244.3.2"), Some("10.244.3.3")] },
            Case {
                cidr: "10.244.3.0/24",
                kept: &["10.244.3.2", "10.244.3.4", "10.9.9.9"],
                released: &[],
                taken: &[Some("10.244.3.3"), Some("10.244.3.5")],
            },
            Case {
                cidr: "10.244.3.0/24",
                kept: &["10.244.3.2", "10.244.3.3"],
                released: &["10.244.3.2"],
                taken: &[Some("10.244.3.2"), Some("10.244.3.4")],
            },
            // A /30 has one address for Pods: .2 (.0 network, .1 gateway, .3 broadcast).
            Case { cidr: "10.244.3.0/30", kept: &[], released: &[], taken: &[Some("10.244.3.2"), None] },
        ];
        for case in cases {
            let mut addresses = PodAddresses::new(case.cidr.parse().unwrap());
            for ip in case.kept {
                let inside = addresses.keep(ip.parse().unwrap());
                assert_eq!(inside, ip.starts_with("10.244.3."), "{ip} in {}", case.cidr);
            }
            for ip in case.released {
                addresses.release(ip.parse().unwrap());
            }
            let taken: Vec<Option<String>> =
                case.taken.iter().map(|_| addresses.take().map(|ip| ip.to_string())).collect();
            let expected: Vec<Option<String>> = case.taken.iter().map(|t| t.map(str::to_owned)).collect();
            assert_eq!(taken, expected, "{}", case.cidr);
        }
    }
}
