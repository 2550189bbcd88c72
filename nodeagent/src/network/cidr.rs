//! IPv4 prefixes: the cluster's Pod and Service ranges and the nodes' podCIDRs, as the proxy and
//! the routes use them. (Cluster DNS keeps `ipnet`: its reverse zones take IPv6 prefixes too.)

use std::{fmt, net::Ipv4Addr, str::FromStr};

/// An IPv4 network in CIDR notation, host bits zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Ipv4Cidr {
    addr: Ipv4Addr,
    prefix: u8,
}

#[derive(Debug, thiserror::Error)]
pub enum CidrError {
    #[error("{text:?} is not an IPv4 network in CIDR notation (e.g. 10.244.0.0/16)")]
    Syntax { text: String },
    #[error("{text:?} has host bits set: the network is {network}")]
    HostBits { text: String, network: Ipv4Cidr },
}

impl Ipv4Cidr {
    /// The cluster's Pod range, from which the control plane gives each node a /24.
    pub const CLUSTER_DEFAULT: Ipv4Cidr = Ipv4Cidr { addr: Ipv4Addr::new(10, 244, 0, 0), prefix: 16 };
    /// The Service range the control plane allocates ClusterIPs from by default.
    pub const SERVICE_DEFAULT: Ipv4Cidr = Ipv4Cidr { addr: Ipv4Addr::new(10, 96, 0, 0), prefix: 12 };

    pub const fn addr(&self) -> Ipv4Addr {
        self.addr
    }

    pub const fn prefix(&self) -> u8 {
        self.prefix
    }

    fn mask(prefix: u8) -> u32 {
        u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0)
    }

    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        u32::from(ip) & Self::mask(self.prefix) == u32::from(self.addr)
    }

    /// Whether the two networks share an address (one holds the other).
    pub fn overlaps(&self, other: &Ipv4Cidr) -> bool {
        self.contains(other.addr) || other.contains(self.addr)
    }

    /// The `default/kubernetes` Service's address: the first of the Service range, as the
    /// control plane keeps it.
    pub fn kubernetes_service(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.addr).wrapping_add(1))
    }

    /// Cluster DNS's address: the tenth of the Service range, as the control plane keeps it.
    pub fn cluster_dns(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.addr).wrapping_add(10))
    }

    /// Whether `other` lies wholly inside this network.
    pub fn covers(&self, other: &Ipv4Cidr) -> bool {
        self.prefix <= other.prefix && self.contains(other.addr)
    }
}

impl From<Ipv4Cidr> for ipnet::Ipv4Net {
    fn from(cidr: Ipv4Cidr) -> Self {
        // The prefix was checked to be at most 32 when the Ipv4Cidr was made.
        ipnet::Ipv4Net::new_assert(cidr.addr, cidr.prefix)
    }
}

impl FromStr for Ipv4Cidr {
    type Err = CidrError;

    fn from_str(text: &str) -> Result<Self, CidrError> {
        let syntax = || CidrError::Syntax { text: text.to_owned() };
        let (addr, prefix) = text.split_once('/').ok_or_else(syntax)?;
        let addr: Ipv4Addr = addr.parse().map_err(|_| syntax())?;
        let prefix: u8 = prefix.parse().ok().filter(|p| *p <= 32).ok_or_else(syntax)?;
        let network = Ipv4Cidr { addr: Ipv4Addr::from(u32::from(addr) & Self::mask(prefix)), prefix };
        if network.addr != addr {
            return Err(CidrError::HostBits { text: text.to_owned(), network });
        }
        Ok(network)
    }
}

impl fmt::Display for Ipv4Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr(text: &str) -> Ipv4Cidr {
        text.parse().unwrap()
    }

    #[test]
    fn cidrs_parse_strictly() {
        assert_eq!(cidr("10.244.1.0/24").to_string(), "10.244.1.0/24");
        assert_eq!(cidr("0.0.0.0/0").prefix(), 0);
        for bad in ["10.244.1.0", "10.244.1.0/33", "10.244.1/24", "::1/128", "10.244.1.0/x"] {
            assert!(matches!(bad.parse::<Ipv4Cidr>(), Err(CidrError::Syntax { .. })), "{bad}");
        }
        let err = "10.244.1.7/24".parse::<Ipv4Cidr>().unwrap_err();
        assert_eq!(err.to_string(), "\"10.244.1.7/24\" has host bits set: the network is 10.244.1.0/24");
        let cluster = cidr("10.244.0.0/16");
        assert!(cluster.covers(&cidr("10.244.3.0/24")) && !cidr("10.244.3.0/24").covers(&cluster));
        assert!(cluster.overlaps(&cidr("10.244.3.0/24")) && cidr("10.244.3.0/24").overlaps(&cluster));
        assert!(!cluster.covers(&cidr("10.96.0.0/12")) && !cluster.overlaps(&cidr("10.96.0.0/12")));
        assert!(cidr("0.0.0.0/0").contains("192.0.2.1".parse().unwrap()));
    }
}
