//! The cluster's address plan that both the control plane and the nodes hold to.

use std::{fmt, net::Ipv4Addr};

/// The default cluster Pod range (kube-controller-manager's `--cluster-cidr`).
pub const CLUSTER_CIDR: (Ipv4Addr, u8) = (Ipv4Addr::new(10, 244, 0, 0), 16);
/// The default prefix length of each node's podCIDR (`--node-cidr-mask-size`).
pub const NODE_CIDR_MASK_SIZE: u8 = 24;
/// At most this many node ranges (upstream's cidrset refuses a mask 16 bits longer than the
/// cluster's prefix too): the allocator's bitmap stays 8 KiB.
pub const MAX_NODE_RANGES: u32 = 1 << 16;
/// The longest node mask: 16 addresses, the bridge's gateway and 13 Pods.
pub const LONGEST_NODE_MASK: u8 = 28;

/// The cluster's Pod range and the size of each node's share of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PodRanges {
    pub network: Ipv4Addr,
    pub prefix: u8,
    /// The prefix length of every node's podCIDR.
    pub node_mask: u8,
}

impl Default for PodRanges {
    fn default() -> Self {
        PodRanges { network: CLUSTER_CIDR.0, prefix: CLUSTER_CIDR.1, node_mask: NODE_CIDR_MASK_SIZE }
    }
}

impl fmt::Display for PodRanges {
    /// The cluster range, e.g. `10.244.0.0/16`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

impl PodRanges {
    /// Checks `--cluster-cidr` and `--node-cidr-mask-size`.
    pub fn new(cidr: &str, node_mask: u8) -> Result<PodRanges, String> {
        let bad = || format!("--cluster-cidr {cidr:?} is not an IPv4 network like 10.244.0.0/16");
        let (ip, prefix) = cidr.split_once('/').ok_or_else(bad)?;
        let ip: Ipv4Addr = ip.parse().map_err(|_| bad())?;
        let prefix: u8 = prefix.parse().ok().filter(|p| *p <= 32).ok_or_else(bad)?;
        if u32::from(ip) & !mask(prefix) != 0 {
            let network = Ipv4Addr::from(u32::from(ip) & mask(prefix));
            return Err(format!("--cluster-cidr {cidr} has host bits set: the network is {network}/{prefix}"));
        }
        if node_mask <= prefix || node_mask > LONGEST_NODE_MASK {
            return Err(format!(
                "--node-cidr-mask-size {node_mask} must be longer than --cluster-cidr's /{prefix} and at most \
                 {LONGEST_NODE_MASK}"
            ));
        }
        let ranges = PodRanges { network: ip, prefix, node_mask };
        if node_mask - prefix > 16 {
            return Err(format!(
                "--cluster-cidr {cidr} with --node-cidr-mask-size {node_mask} makes {} node ranges, more than \
                 {MAX_NODE_RANGES}: give a longer cluster prefix or a shorter node mask",
                1u64 << (node_mask - prefix)
            ));
        }
        Ok(ranges)
    }

    /// How many nodes can get a range.
    pub fn count(&self) -> u32 {
        1 << (self.node_mask - self.prefix)
    }

    /// The `index`th node range, e.g. `10.244.3.0/24`.
    pub fn range(&self, index: u32) -> String {
        let base = u32::from(self.network) + (index << (32 - u32::from(self.node_mask)));
        format!("{}/{}", Ipv4Addr::from(base), self.node_mask)
    }

    /// The index of the node range `cidr`, if it is one of them.
    pub fn index_of(&self, cidr: &str) -> Option<u32> {
        let (ip, bits) = cidr.split_once('/')?;
        let (ip, bits) = (ip.parse::<Ipv4Addr>().ok()?, bits.parse::<u8>().ok()?);
        let offset = u32::from(ip).checked_sub(u32::from(self.network))?;
        let shift = 32 - u32::from(self.node_mask);
        (bits == self.node_mask && self.contains(ip) && offset & ((1 << shift) - 1) == 0).then_some(offset >> shift)
    }

    /// Whether `ip` is in the cluster range.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        u32::from(ip) & mask(self.prefix) == u32::from(self.network)
    }
}

/// Where each allocated node range is recorded: a ConfigMap per range, named after it and
/// labelled [`RANGE_LABEL`], whose `node` entry names the Node holding it.
pub const RANGE_NAMESPACE: &str = "kube-system";
pub const RANGE_LABEL: &str = "gitplane.io/pod-cidr";
pub const RANGE_NODE_KEY: &str = "node";

/// The name of the record of node range `cidr`: `pod-cidr-10.244.3.0-24`.
pub fn range_object_name(cidr: &str) -> String {
    format!("pod-cidr-{}", cidr.replace('/', "-"))
}

/// The node range a record's name stands for.
pub fn range_of_object(name: &str) -> Option<String> {
    let (network, prefix) = name.strip_prefix("pod-cidr-")?.rsplit_once('-')?;
    Some(format!("{network}/{prefix}"))
}

fn mask(prefix: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_checked() {
        let cases: [(&str, u8, Result<u32, &str>); 8] = [
            ("10.244.0.0/16", 24, Ok(256)),
            ("10.128.0.0/12", 27, Ok(32768)),
            ("10.0.0.0/8", 24, Ok(65536)),
            ("10.0.0.0/8", 25, Err("more than 65536")),
            ("10.244.0.0/16", 16, Err("must be longer")),
            ("10.244.0.0/16", 29, Err("at most 28")),
            ("10.244.1.0/16", 24, Err("the network is 10.244.0.0/16")),
            ("fd00::/48", 64, Err("is not an IPv4 network")),
        ];
        for (cidr, mask, want) in cases {
            match (PodRanges::new(cidr, mask), want) {
                (Ok(r), Ok(count)) => assert_eq!(r.count(), count, "{cidr} /{mask}"),
                (Err(e), Err(part)) => assert!(e.contains(part), "{cidr} /{mask}: {e}"),
                (got, want) => panic!("{cidr} /{mask}: {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn ranges_and_their_indexes() {
        let r = PodRanges::new("10.128.0.0/12", 26).unwrap();
        let cases = [(0, "10.128.0.0/26"), (1, "10.128.0.64/26"), (4, "10.128.1.0/26"), (16383, "10.143.255.192/26")];
        for (index, cidr) in cases {
            assert_eq!(r.range(index), cidr);
            assert_eq!(r.index_of(cidr), Some(index), "{cidr}");
        }
        for other in ["10.128.0.32/26", "10.128.0.0/24", "10.144.0.0/26", "10.127.255.192/26", "x/26"] {
            assert_eq!(r.index_of(other), None, "{other}");
        }
        assert_eq!(PodRanges::default().range(255), "10.244.255.0/24");
        assert_eq!(PodRanges::default().to_string(), "10.244.0.0/16");
        assert_eq!(range_object_name("10.244.3.0/24"), "pod-cidr-10.244.3.0-24");
        assert_eq!(range_of_object("pod-cidr-10.244.3.0-24").as_deref(), Some("10.244.3.0/24"));
        assert_eq!(range_of_object("kube-root-ca.crt"), None);
    }
}
