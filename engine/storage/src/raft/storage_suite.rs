//! openraft's own storage suite (`testing::Suite::test_all`) against the Raft log store and the
//! state machine, each instance in a fresh temporary directory that its guard removes.

use super::{NodeId, TypeConfig, log_store::LogStore, state_machine::StateMachine};
use crate::sqlite::{Durability, SqliteStore};
use openraft::{
    AnyError, StorageError, StorageIOError,
    testing::{StoreBuilder, Suite},
};

struct Builder;

fn setup<E: std::error::Error + 'static>(e: E) -> StorageError<NodeId> {
    StorageIOError::write(AnyError::new(&e)).into()
}

impl StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for Builder {
    async fn build(&self) -> Result<(tempfile::TempDir, LogStore, StateMachine), StorageError<NodeId>> {
        let dir = tempfile::tempdir().map_err(setup)?;
        let store = SqliteStore::open(&dir.path().join("store.db"), Durability::Replicated).await.map_err(setup)?;
        let log =
            LogStore::open(&dir.path().join("raft.db"), crate::encryption::Keyring::identity()).await.map_err(setup)?;
        let state_machine = StateMachine::open(store, &dir.path().join("snapshots")).await.map_err(setup)?;
        Ok((dir, log, state_machine))
    }
}

#[test]
fn openraft_storage_suite() {
    Suite::test_all(Builder).unwrap();
}
