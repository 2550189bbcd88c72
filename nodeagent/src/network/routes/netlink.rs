//! The routing table over rtnetlink (the `rtnetlink` crate): gitplane's routes are IPv4 unicast
//! routes in the main table with protocol [`RTPROT_GITPLANE`], in the network namespace the
//! agent runs in.

use super::{
    Installed, Ipv4Cidr, PodNetwork, PodNetworkConfig, RTPROT_GITPLANE, RouteError, RouteOp, RouteTable, StartError,
    masquerade,
};
use futures::TryStreamExt as _;
use rtnetlink::{
    Handle, RouteMessageBuilder,
    packet_route::route::{RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteType},
};
use std::net::Ipv4Addr;

/// A netlink connection to the routing table of the agent's network namespace.
pub struct Netlink {
    handle: Handle,
    connection: tokio::task::JoinHandle<()>,
}

impl Netlink {
    /// Opens the socket and turns on IPv4 forwarding, without which this node passes no Pod
    /// traffic to or from other nodes (the bridge plugin turns it on only with a first Pod).
    pub fn connect() -> Result<Netlink, RouteError> {
        std::fs::write("/proc/sys/net/ipv4/ip_forward", b"1").map_err(RouteError::Forwarding)?;
        let (connection, handle, _) = rtnetlink::new_connection().map_err(RouteError::Socket)?;
        Ok(Netlink { handle, connection: tokio::spawn(connection) })
    }
}

impl Drop for Netlink {
    fn drop(&mut self) {
        self.connection.abort();
    }
}

fn io_error(e: rtnetlink::Error) -> std::io::Error {
    match e {
        rtnetlink::Error::NetlinkError(message) => message.to_io(),
        other => std::io::Error::other(other.to_string()),
    }
}

/// The message that adds, replaces or deletes a route of ours.
fn message(dst: Ipv4Cidr, gateway: Option<Ipv4Addr>, priority: u32) -> RouteMessage {
    let mut builder = RouteMessageBuilder::<Ipv4Addr>::new()
        .destination_prefix(dst.addr(), dst.prefix())
        .protocol(RouteProtocol::from(RTPROT_GITPLANE));
    if let Some(gateway) = gateway {
        builder = builder.gateway(gateway);
    }
    if priority != 0 {
        builder = builder.priority(priority);
    }
    builder.build()
}

/// The route as [`Installed`] when it is one of gitplane's in the main table.
fn ours(route: &RouteMessage) -> Option<Installed> {
    let header = &route.header;
    let mut table = u32::from(header.table);
    let (mut dst, mut gateway, mut priority) = (None, None, 0);
    for attribute in &route.attributes {
        match attribute {
            RouteAttribute::Table(t) => table = *t,
            RouteAttribute::Destination(RouteAddress::Inet(a)) => dst = Some(*a),
            RouteAttribute::Gateway(RouteAddress::Inet(a)) => gateway = Some(*a),
            RouteAttribute::Priority(p) => priority = *p,
            _ => {}
        }
    }
    if u8::from(header.protocol) != RTPROT_GITPLANE
        || table != u32::from(RouteHeader::RT_TABLE_MAIN)
        || header.kind != RouteType::Unicast
    {
        return None;
    }
    let dst = format!("{}/{}", dst.unwrap_or(Ipv4Addr::UNSPECIFIED), header.destination_prefix_length);
    Some(Installed { dst: dst.parse().ok()?, gateway, priority })
}

impl RouteTable for Netlink {
    async fn installed(&self) -> Result<Vec<Installed>, RouteError> {
        let dump = self.handle.route().get(RouteMessageBuilder::<Ipv4Addr>::new().build()).execute();
        let routes: Vec<RouteMessage> = dump.try_collect().await.map_err(|e| RouteError::List(io_error(e)))?;
        Ok(routes.iter().filter_map(ours).collect())
    }

    async fn apply(&self, op: &RouteOp) -> Result<(), RouteError> {
        let routes = self.handle.route();
        let result = match op {
            RouteOp::Add(r) => routes.add(message(r.dst, Some(r.gateway), 0)).execute().await,
            RouteOp::Replace(r) => routes.add(message(r.dst, Some(r.gateway), 0)).replace().execute().await,
            // The protocol in the request makes the kernel delete only a route of ours.
            RouteOp::Delete(r) => routes.del(message(r.dst, r.gateway, r.priority)).execute().await,
        };
        result.map_err(|e| RouteError::Apply { op: op.clone(), source: io_error(e) })
    }
}

impl PodNetwork<Netlink> {
    /// Programs the masquerade and opens the routing table: what a node cannot run Pods without,
    /// so a failure here stops the agent with the reason.
    pub async fn start(cfg: PodNetworkConfig) -> Result<Self, StartError> {
        masquerade::apply(&cfg.masquerade()).await?;
        let table = Netlink::connect()?;
        Ok(PodNetwork::new(cfg, table))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rtnetlink::packet_route::{AddressFamily, route::RouteScope};

    /// The netlink message, field by field: what `ip route add 10.244.2.0/24 via 172.29.0.13
    /// proto 103` sends.
    #[test]
    fn a_route_of_ours_is_a_main_table_unicast_route_with_our_protocol() {
        let dst: Ipv4Cidr = "10.244.2.0/24".parse().unwrap();
        let gateway: Ipv4Addr = "172.29.0.13".parse().unwrap();
        let m = message(dst, Some(gateway), 0);
        assert_eq!(m.header.address_family, AddressFamily::Inet);
        assert_eq!(m.header.destination_prefix_length, 24);
        assert_eq!(m.header.table, RouteHeader::RT_TABLE_MAIN);
        assert_eq!(u8::from(m.header.protocol), 103);
        assert_eq!(m.header.scope, RouteScope::Universe);
        assert_eq!(m.header.kind, RouteType::Unicast);
        assert_eq!(
            m.attributes,
            [
                RouteAttribute::Destination(RouteAddress::Inet(dst.addr())),
                RouteAttribute::Gateway(RouteAddress::Inet(gateway)),
            ]
        );
        assert_eq!(ours(&m), Some(Installed { dst, gateway: Some(gateway), priority: 0 }));

        let mut theirs = message(dst, Some(gateway), 0);
        theirs.header.protocol = RouteProtocol::Static;
        assert_eq!(ours(&theirs), None, "another protocol's route is not ours");
        let mut other_table = message(dst, Some(gateway), 0);
        other_table.attributes.push(RouteAttribute::Table(1000));
        assert_eq!(ours(&other_table), None, "only the main table is ours");
        assert!(message(dst, None, 7).attributes.contains(&RouteAttribute::Priority(7)));
    }
}
