//! What the Ingress proxy lets its clients cost the node. The proxy listens on every node's
//! address for anyone who can reach it, in the agent's process (the node's kubelet, proxy and
//! DNS), so every connection and every byte it holds for a client is bounded: in all, and per
//! client address, so that one client cannot take what the others need. The figures follow
//! ingress-nginx's defaults where it has one, and are explained where they differ.

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

/// Connections served at once. Each costs at most a request head's buffer ([`MAX_HEADER_BYTES`])
/// and a response's write buffer of the same size, besides its share of the bodies below;
/// ingress-nginx allows 16,384 per worker, but it runs on a machine of its own.
pub const MAX_CONNECTIONS: usize = 4096;
/// Connections one client address holds at once: a browser opens 6 per host, so this is
/// dozens of users behind one NAT, and a sixteenth of [`MAX_CONNECTIONS`].
pub const MAX_CONNECTIONS_PER_CLIENT: usize = 256;
/// The largest request head (request line and header fields). ingress-nginx's default
/// `large-client-header-buffers` (4 x 8k) refuses heads over 32 KiB; twice that leaves room for
/// the large cookies and tokens users raise it for. Larger: 431.
pub const MAX_HEADER_BYTES: usize = 64 << 10;
/// The most header fields in a request head (hyper's default, and Go's and Envoy's order of
/// magnitude). More: 431.
pub const MAX_HEADERS: usize = 100;
/// How long a connection may go without sending a complete request head: idle between requests
/// (ingress-nginx's `keep-alive`, 75 s) or sending one slowly (`client-header-timeout`, 60 s).
/// One timer covers both, as hyper runs it from the end of the previous answer.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a request body may take to arrive whole (ingress-nginx's `client-body-timeout` is
/// 60 s between two reads; a deadline for the whole body also ends a body trickled a byte at a
/// time). Later: 408.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(60);
/// Request bodies held in memory at once (bodies are read whole so that a retry can resend
/// them): 64 bodies of the largest size. ingress-nginx spools larger bodies to disk instead; the
/// agent answers 503 while the budget is spent.
pub const MAX_BUFFERED_BODIES: usize = 64 << 20;
/// What one client address may hold of [`MAX_BUFFERED_BODIES`]: eight bodies of the largest size.
pub const MAX_BUFFERED_BODIES_PER_CLIENT: usize = 8 << 20;
/// How long a client may take to complete a TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The proxy's limits; [`Default`] is the constants above (tests shorten them).
#[derive(Clone, Debug)]
pub struct Limits {
    pub max_connections: usize,
    pub max_connections_per_client: usize,
    pub idle_timeout: Duration,
    pub body_timeout: Duration,
    /// Bytes of request bodies held at once, in all and per client address.
    pub max_buffered_bodies: usize,
    pub max_buffered_bodies_per_client: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: MAX_CONNECTIONS,
            max_connections_per_client: MAX_CONNECTIONS_PER_CLIENT,
            idle_timeout: IDLE_TIMEOUT,
            body_timeout: BODY_TIMEOUT,
            max_buffered_bodies: MAX_BUFFERED_BODIES,
            max_buffered_bodies_per_client: MAX_BUFFERED_BODIES_PER_CLIENT,
        }
    }
}

/// Units of something bounded (connections, bytes of bodies) held in all and per client
/// address: at most `total`, and `per_client` for each address.
pub(crate) struct Shares {
    total: usize,
    per_client: usize,
    held: Mutex<Held>,
}

#[derive(Default)]
struct Held {
    total: usize,
    by_client: HashMap<IpAddr, usize>,
}

/// What one holder took; given back when dropped.
pub(crate) struct Share {
    shares: Arc<Shares>,
    client: IpAddr,
    units: usize,
}

impl Shares {
    pub(crate) fn new(total: usize, per_client: usize) -> Arc<Shares> {
        Arc::new(Shares { total, per_client, held: Mutex::default() })
    }

    /// `units` for `client`, or `None` when that would pass either bound.
    pub(crate) fn take(self: &Arc<Self>, client: IpAddr, units: usize) -> Option<Share> {
        let mut share = Share { shares: self.clone(), client, units: 0 };
        share.grow(units).then_some(share)
    }

    fn add(&self, client: IpAddr, units: usize) -> bool {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let mine = held.by_client.get(&client).copied().unwrap_or(0);
        if held.total + units > self.total || mine + units > self.per_client {
            return false;
        }
        held.total += units;
        held.by_client.insert(client, mine + units);
        true
    }

    fn release(&self, client: IpAddr, units: usize) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        held.total -= units;
        if let Some(mine) = held.by_client.get_mut(&client) {
            *mine -= units;
            if *mine == 0 {
                held.by_client.remove(&client);
            }
        }
    }
}

impl Share {
    /// Takes `units` more, if both bounds allow it.
    pub(crate) fn grow(&mut self, units: usize) -> bool {
        if units == 0 {
            return true;
        }
        let added = self.shares.add(self.client, units);
        if added {
            self.units += units;
        }
        added
    }

    pub(crate) fn units(&self) -> usize {
        self.units
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        if self.units > 0 {
            self.shares.release(self.client, self.units);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_are_bounded_in_all_and_per_client() {
        let shares = Shares::new(5, 3);
        let (a, b): (IpAddr, IpAddr) = ([192, 0, 2, 1].into(), [192, 0, 2, 2].into());
        let mut first = shares.take(a, 2).unwrap();
        assert!(!first.grow(2), "a would hold 4 of its 3");
        assert!(first.grow(1));
        assert!(shares.take(a, 1).is_none(), "a holds its share");
        let second = shares.take(b, 2).unwrap();
        assert!(shares.take(b, 1).is_none(), "5 are held in all");
        drop(first);
        assert!(shares.take(a, 3).is_some(), "given back when dropped");
        drop(second);
        let held = shares.held.lock().unwrap();
        assert_eq!((held.total, held.by_client.len()), (0, 0));
    }
}
