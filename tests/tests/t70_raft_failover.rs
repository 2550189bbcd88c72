//! Three `gitplane server` processes (SQLite + Raft) on loopback under a steady write load: the
//! leader is killed with SIGKILL, a new leader serves writes, every acknowledged write ends up on
//! every replica, the recorded client history is linearizable, and SIGKILL of all three at once
//! loses nothing.

use anyhow::Result;
use gitplane_e2e::{cluster::Cluster, failover::leader_kill_under_load};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t70_leader_kill_under_load_is_linearizable_and_loses_nothing() -> Result<()> {
    let mut cluster = Cluster::start(3, &[])?;
    leader_kill_under_load(&mut cluster).await
}
