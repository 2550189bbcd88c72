//! Where a node serves cluster DNS, as NodeLocal DNSCache does: cluster DNS's address (the
//! tenth of the Service range, 10.96.0.10 by default) held by the node itself, so a Pod's query
//! goes to its own node and never crosses to another one. No Service object holds that address;
//! the proxy lets traffic to an address the node holds through.
//!
//! The address goes on the loopback interface as a /32 (NodeLocal DNSCache uses a dummy
//! interface, but the kernels here are built without the dummy driver; for routing a local
//! address is local whichever interface holds it).

use super::Listeners;
use futures::TryStreamExt as _;
use rtnetlink::Handle;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

const INTERFACE: &str = "lo";

#[derive(Debug, thiserror::Error)]
pub enum NodeLocalError {
    #[error("opening a netlink socket: {0}")]
    Socket(#[source] std::io::Error),
    #[error("{what} on {INTERFACE}: {source}")]
    Netlink { what: &'static str, source: rtnetlink::Error },
    #[error("the network namespace has no {INTERFACE} interface")]
    NoLoopback,
    #[error("listening for DNS on {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
}

fn netlink(what: &'static str) -> impl FnOnce(rtnetlink::Error) -> NodeLocalError {
    move |source| NodeLocalError::Netlink { what, source }
}

async fn with_handle<T>(f: impl AsyncFnOnce(&Handle) -> Result<T, NodeLocalError>) -> Result<T, NodeLocalError> {
    let (connection, handle, _) = rtnetlink::new_connection().map_err(NodeLocalError::Socket)?;
    let connection = tokio::spawn(connection);
    let result = f(&handle).await;
    connection.abort();
    result
}

async fn loopback(handle: &Handle) -> Result<u32, NodeLocalError> {
    let mut links = handle.link().get().match_name(INTERFACE.to_owned()).execute();
    let link = links.try_next().await.map_err(netlink("looking the interface up"))?;
    link.map(|l| l.header.index).ok_or(NodeLocalError::NoLoopback)
}

/// Puts `address` on the node (kept if a previous run left it) and binds UDP and TCP port 53
/// on it.
pub async fn listen(address: Ipv4Addr) -> Result<Listeners, NodeLocalError> {
    with_handle(async |handle| {
        let index = loopback(handle).await?;
        let add = handle.address().add(index, IpAddr::V4(address), 32).replace();
        add.execute().await.map_err(netlink("adding cluster DNS's address"))
    })
    .await?;
    let addr = SocketAddr::from((address, 53));
    Listeners::bind(&[addr]).map_err(|source| NodeLocalError::Bind { addr, source })
}

/// Takes `address` off the node again (it stops serving).
pub async fn remove(address: Ipv4Addr) -> Result<(), NodeLocalError> {
    with_handle(async |handle| {
        let index = loopback(handle).await?;
        let mut found = handle
            .address()
            .get()
            .set_link_index_filter(index)
            .set_address_filter(IpAddr::V4(address))
            .set_prefix_length_filter(32)
            .execute();
        while let Some(message) = found.try_next().await.map_err(netlink("listing addresses"))? {
            handle.address().del(message).execute().await.map_err(netlink("removing cluster DNS's address"))?;
        }
        Ok(())
    })
    .await
}
