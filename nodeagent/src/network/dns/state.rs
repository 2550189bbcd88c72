//! What cluster DNS answers from, shared by the updates and the servers.

use super::{forward::Forwarding, records::Zone};
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// The zone and the forwarding table under one lock: a query reads both at once, and an
/// update holds the lock only while it changes one Service.
pub(crate) struct State {
    pub(crate) zone: Zone,
    pub(crate) forwarding: Forwarding,
}

pub(crate) struct Shared(RwLock<State>);

impl Shared {
    pub(super) fn new(state: State) -> Self {
        Shared(RwLock::new(state))
    }

    // A panic while updating leaves the zone consistent per Service, so serving goes on.
    pub(crate) fn read(&self) -> RwLockReadGuard<'_, State> {
        self.0.read().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn write(&self) -> RwLockWriteGuard<'_, State> {
        self.0.write().unwrap_or_else(PoisonError::into_inner)
    }
}
