//! The cluster's address plan that both the control plane and the nodes hold to.

use std::net::Ipv4Addr;

/// The cluster's Pod range; each node gets a /24 of it.
pub const CLUSTER_CIDR: (Ipv4Addr, u8) = (Ipv4Addr::new(10, 244, 0, 0), 16);
