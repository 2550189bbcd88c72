//! The kubelet endpoint's connection slots. Only the replicas are answered, but anyone who
//! reaches the node's address can open a connection, and a slot is taken before the TLS
//! handshake says who it is. So a connection is *unverified* until its handshake shows a
//! replica's certificate, and unverified connections make room for new ones: one client address
//! holds at most [`MAX_UNVERIFIED_PER_CLIENT`] (its oldest is closed for its newest), and when
//! every slot is taken the oldest unverified connection anywhere is closed for a new one. A
//! client that opens idle connections, or completes handshakes with a node's certificate,
//! therefore never keeps a replica out; only the replicas' own connections fill the endpoint.

use std::{
    collections::BTreeMap,
    net::IpAddr,
    sync::{Arc, Mutex, PoisonError},
};
use tokio::sync::Notify;

/// Connections served at once (a follow of a log holds one for as long as it runs).
pub const MAX_CONNECTIONS: usize = 256;
/// Unverified connections one client address holds at once. A replica opens a connection per
/// request and holds it unverified only for its handshake (milliseconds), so this is far more
/// than one needs, and one client holds at most an eighth of [`MAX_CONNECTIONS`]. Clients that
/// share an address (all of this machine's on loopback) share these: a replica's new connection
/// then closes the oldest of the others.
pub const MAX_UNVERIFIED_PER_CLIENT: usize = 32;

/// The endpoint's slots.
pub(crate) struct Slots {
    max: usize,
    per_client: usize,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Connections holding a slot, those being closed to make room included.
    open: usize,
    next: u64,
    /// Unverified connections, oldest first, with what tells each to close.
    unverified: BTreeMap<u64, (IpAddr, Arc<Notify>)>,
}

impl State {
    fn evict(&mut self, id: u64) {
        if let Some((_, evicted)) = self.unverified.remove(&id) {
            evicted.notify_one();
        }
    }
}

/// One connection's slot: unverified until [`Slot::verified`]; given back when dropped.
pub(crate) struct Slot {
    slots: Arc<Slots>,
    id: u64,
    evicted: Arc<Notify>,
}

impl Slots {
    pub(crate) fn new(max: usize, per_client: usize) -> Arc<Slots> {
        Arc::new(Slots { max, per_client, state: Mutex::default() })
    }

    /// A slot for a new connection from `client`, closing an unverified connection to make room
    /// if needed; `None` when every slot is a verified connection's. Connections being closed
    /// still count until they are gone, and at most `per_client` of them are allowed beyond the
    /// bound, so a flood cannot outrun the closing.
    pub(crate) fn admit(self: &Arc<Self>, client: IpAddr) -> Option<Slot> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.open >= self.max + self.per_client {
            return None;
        }
        let mine: Vec<u64> = state.unverified.iter().filter(|(_, (c, _))| *c == client).map(|(id, _)| *id).collect();
        if mine.len() >= self.per_client {
            state.evict(mine[0]);
        } else if state.open >= self.max {
            match state.unverified.keys().next().copied() {
                Some(oldest) => state.evict(oldest),
                None => return None,
            }
        }
        state.open += 1;
        let id = state.next;
        state.next += 1;
        let evicted = Arc::new(Notify::new());
        state.unverified.insert(id, (client, evicted.clone()));
        Some(Slot { slots: self.clone(), id, evicted })
    }
}

impl Slot {
    /// The client showed a replica's certificate: its connection is no longer closed to make
    /// room.
    pub(crate) fn verified(&self) {
        let mut state = self.slots.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.unverified.remove(&self.id);
    }

    /// Resolves when the connection is to be closed to make room.
    pub(crate) async fn evicted(&self) {
        self.evicted.notified().await
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut state = self.slots.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.unverified.remove(&self.id);
        state.open -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn told_to_close(slot: &Slot) -> bool {
        tokio::time::timeout(Duration::from_millis(50), slot.evicted()).await.is_ok()
    }

    #[tokio::test]
    async fn unverified_connections_make_room_and_verified_ones_stay() {
        let slots = Slots::new(4, 2);
        let (a, b, c): (IpAddr, IpAddr, IpAddr) = ([192, 0, 2, 1].into(), [192, 0, 2, 2].into(), [192, 0, 2, 3].into());
        let a1 = slots.admit(a).unwrap();
        let a2 = slots.admit(a).unwrap();
        let a3 = slots.admit(a).unwrap();
        assert!(told_to_close(&a1).await, "a's oldest makes room for its third");
        assert!(!told_to_close(&a2).await);
        drop(a1);
        let replica = slots.admit(b).unwrap();
        replica.verified();
        let b2 = slots.admit(b).unwrap();
        b2.verified();
        // Four open (a2, a3 and b's two): c's connection closes the oldest unverified, a2.
        let c1 = slots.admit(c).unwrap();
        assert!(told_to_close(&a2).await);
        assert!(!told_to_close(&replica).await && !told_to_close(&a3).await);
        drop(a2);
        // Four again: b's third closes the oldest unverified, a3; c's second then closes c1.
        let b3 = slots.admit(b).unwrap();
        assert!(told_to_close(&a3).await);
        drop(a3);
        b3.verified();
        let c2 = slots.admit(c).unwrap();
        assert!(told_to_close(&c1).await);
        drop(c1);
        c2.verified();
        assert!(slots.admit(a).is_none(), "every slot is a verified connection's");
        drop((replica, b2, b3, c2));
        let state = slots.state.lock().unwrap();
        assert_eq!((state.open, state.unverified.len()), (0, 0));
    }
}
