//! Where a node may say it is. Its address is where the replicas reach its kubelet endpoint and
//! what its serving certificate names, so a node must not pick it freely: it is the address the
//! registration's own connection came from (registrations over loopback are the appliance's
//! own node), it is fixed at the node's first registration, and it is never an address that is
//! the control plane's or the cluster's (a replica, the Service range, the Pod range, the
//! load-balancer pool).

use gitplane_api::network::PodRanges;
use gitplane_controllers::loadbalancer::AddressPool;
use std::net::{IpAddr, Ipv4Addr};
use tonic::Status;

/// The addresses no node may take.
#[derive(Clone, Debug)]
pub struct Reserved {
    /// The replicas' own addresses.
    pub replicas: Vec<IpAddr>,
    /// The Service range: its network and prefix length.
    pub services: (Ipv4Addr, u8),
    /// The cluster Pod range, which new nodes' podCIDRs come from.
    pub pods: PodRanges,
    pub load_balancers: Option<AddressPool>,
}

impl Default for Reserved {
    /// Nothing but the default Service range and the Pod range.
    fn default() -> Reserved {
        Reserved {
            replicas: Vec::new(),
            services: (Ipv4Addr::new(10, 96, 0, 0), 12),
            pods: PodRanges::default(),
            load_balancers: None,
        }
    }
}

impl Reserved {
    /// What `ip` is, if it is not a node's to take.
    fn taken_by(&self, ip: IpAddr) -> Option<&'static str> {
        if self.replicas.contains(&ip) {
            return Some("a control-plane replica's");
        }
        let IpAddr::V4(v4) = ip else { return None };
        if self.pods.contains(v4) {
            Some("in the Pod range")
        } else if within(v4, self.services.0, self.services.1) {
            Some("in the Service range")
        } else if self.load_balancers.as_ref().is_some_and(|pool| pool.contains(v4)) {
            Some("in the load-balancer pool")
        } else {
            None
        }
    }

    /// Whether node `name` may register at `reported` (its InternalIP, if it reports one), with
    /// its registration coming from `peer` and `stored` the address of its earlier registration.
    pub fn admit(
        &self,
        name: &str,
        reported: Option<IpAddr>,
        peer: IpAddr,
        stored: Option<IpAddr>,
    ) -> Result<(), Status> {
        if let Some(stored) = stored
            && reported != Some(stored)
        {
            let now = reported.map_or("no address".to_owned(), |ip| ip.to_string());
            return Err(Status::permission_denied(format!(
                "node {name} registered at {stored} and cannot move to {now}: a node's address is fixed at its first \
                 registration; delete the Node to register it again elsewhere"
            )));
        }
        if let Some(ip) = reported
            && let Some(what) = self.taken_by(ip)
        {
            return Err(Status::permission_denied(format!(
                "node {name} may not take address {ip}: it is {what}; run the agent with its own address (--node-ip)"
            )));
        }
        if !peer.is_loopback() && reported != Some(peer) {
            let said = reported.map_or("no address".to_owned(), |ip| ip.to_string());
            return Err(Status::permission_denied(format!(
                "node {name} reports {said} but registers from {peer}: a node is reached where it registers from; \
                 run the agent with --node-ip {peer}"
            )));
        }
        Ok(())
    }
}

fn within(ip: Ipv4Addr, network: Ipv4Addr, prefix: u8) -> bool {
    let mask = u32::MAX.checked_shl(32 - u32::from(prefix.min(32))).unwrap_or(0);
    u32::from(ip) & mask == u32::from(network) & mask
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn a_node_is_where_it_registers_from_and_never_the_control_plane() {
        let reserved = Reserved {
            replicas: vec![ip("192.0.2.75"), ip("192.0.2.77")],
            services: (Ipv4Addr::new(10, 96, 0, 0), 12),
            load_balancers: Some(AddressPool::parse("198.51.100.0/28").unwrap()),
            ..Default::default()
        };
        let admit = |reported: Option<&str>, peer: &str, stored: Option<&str>| {
            reserved.admit("n1", reported.map(ip), ip(peer), stored.map(ip)).map_err(|s| s.message().to_owned())
        };
        // Where it registers from, on first registration or again.
        assert_eq!(admit(Some("172.29.0.11"), "172.29.0.11", None), Ok(()));
        assert_eq!(admit(Some("172.29.0.11"), "172.29.0.11", Some("172.29.0.11")), Ok(()));
        // The appliance's own node, over loopback, with or without an address of its own.
        assert_eq!(admit(None, "127.0.0.1", None), Ok(()));
        assert_eq!(admit(Some("10.0.0.5"), "127.0.0.1", None), Ok(()));
        let refusals = [
            (admit(Some("192.0.2.77"), "192.0.2.77", None), "it is a control-plane replica's"),
            (admit(Some("192.0.2.77"), "127.0.0.1", None), "it is a control-plane replica's"),
            (admit(Some("10.96.0.1"), "127.0.0.1", None), "in the Service range"),
            (admit(Some("10.244.3.7"), "127.0.0.1", None), "in the Pod range"),
            (admit(Some("198.51.100.5"), "127.0.0.1", None), "in the load-balancer pool"),
            (admit(Some("172.29.0.99"), "172.29.0.11", None), "reports 172.29.0.99 but registers from 172.29.0.11"),
            (admit(None, "172.29.0.11", None), "reports no address but registers from 172.29.0.11"),
            (
                admit(Some("172.29.0.12"), "172.29.0.12", Some("172.29.0.11")),
                "registered at 172.29.0.11 and cannot move",
            ),
        ];
        for (got, wanted) in refusals {
            assert!(got.as_ref().is_err_and(|m| m.contains(wanted)), "{got:?}: {wanted}");
        }
    }
}
