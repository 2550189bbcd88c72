//! The same failover on the Postgres backend: three `gitplane server --store postgres`
//! processes share one private PostgreSQL; the lease elects the leader, whose writes are fenced.

use anyhow::Result;
use gitplane_e2e::{cluster::Cluster, failover::leader_kill_under_load};
use gitplane_storage::postgres::testing::PgCluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t71_postgres_leader_kill_under_load_is_linearizable_and_loses_nothing() -> Result<()> {
    let postgres = PgCluster::start();
    let url = postgres.url("postgres");
    let mut cluster = Cluster::start(3, &["--store", "postgres", "--postgres-url", &url])?;
    leader_kill_under_load(&mut cluster).await
}
