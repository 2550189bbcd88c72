//! A failover run shared by the store backends' process-level tests: steady load from clients
//! that record their history, SIGKILL of the leader, checks that every acknowledged write is on
//! every replica and that the history is linearizable, then SIGKILL of all at once; first, that a
//! client without the cluster's peer token is refused.

use crate::{
    cluster::Cluster,
    linearizability::{CheckOptions, History, KvInput, KvModel, KvOutput, Value as KvValue, check},
    wait_for,
};
use anyhow::{Context, Result, ensure};
use gitplane_storage::remote::RemoteStore;
use gitplane_store::{ListOptions, ObjectKey, Op, Store, StoreError};
use serde_json::{Value, json};
use std::{
    collections::BTreeSet,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

const KEYS: usize = 8;
const CLIENTS: u64 = 8;

fn config_map(name: &str, value: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "load"}, "data": {"v": value}})
}

fn key(name: &str) -> ObjectKey {
    ObjectKey::new("ConfigMap", "load", name)
}

/// Records the outcome of a write: a rejection or a NotLeader certainly did not apply it;
/// anything else may have.
fn record_write(history: &History, id: crate::linearizability::OpId, result: &Result<(), StoreError>) {
    match result {
        Ok(()) => history.ok(id, KvOutput::PutOk),
        Err(StoreError::Rejected(_) | StoreError::NotLeader(_)) => history.fail(id),
        Err(_) => history.unknown(id),
    }
}

/// One client: puts and linearizable gets on shared keys, and creates of keys of its own.
async fn client(
    store: RemoteStore,
    n: u64,
    history: History,
    acked: Arc<Mutex<BTreeSet<String>>>,
    stop: Arc<AtomicBool>,
) {
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let name = format!("k{}", (n as usize * 7 + i as usize) % KEYS);
        match i % 3 {
            0 => {
                let value = format!("c{n}-{i}");
                let id = history.invoke(n, KvInput::put(&name, value.as_str()));
                let result = store.txn(vec![Op::Update(config_map(&name, &value))]).await.map(|_| ());
                record_write(&history, id, &result);
            }
            1 => {
                let id = history.invoke(n, KvInput::get(&name));
                match store.get_linearizable(&key(&name)).await {
                    Ok(v) => {
                        let seen = v.and_then(|o| o["data"]["v"].as_str().map(KvValue::from));
                        history.ok(id, KvOutput::Got(seen));
                    }
                    Err(_) => history.fail(id), // a read that failed observed nothing
                }
            }
            _ => {
                let own = format!("own-{n}-{i}");
                if store.txn(vec![Op::Create(config_map(&own, "x"))]).await.is_ok() {
                    acked.lock().unwrap().insert(own);
                }
            }
        }
    }
}

/// Waits until every running replica holds every acknowledged key, with the same revision.
async fn converged(cluster: &Cluster, acked: &BTreeSet<String>) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    for id in cluster.running() {
        let replica = cluster.replica_client(id)?;
        loop {
            let list =
                replica.list("ConfigMap", &ListOptions { namespace: Some("load".into()), ..Default::default() }).await;
            let names: BTreeSet<String> = list
                .map(|l| l.items.iter().filter_map(|o| o["metadata"]["name"].as_str().map(str::to_owned)).collect())
                .unwrap_or_default();
            let missing: Vec<_> = acked.difference(&names).take(5).collect();
            if missing.is_empty() {
                break;
            }
            ensure!(
                Instant::now() < deadline,
                "replica {id} lacks acknowledged writes {missing:?}\n{}",
                cluster.logs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let revisions = wait_for(Duration::from_secs(60), || {
        let revs: BTreeSet<i64> =
            cluster.running().iter().filter_map(|id| cluster.status(*id)?["revision"].as_i64()).collect();
        (revs.len() == 1).then_some(revs)
    });
    ensure!(revisions.is_some(), "replicas did not converge to one revision\n{}", cluster.logs());
    Ok(())
}

/// Runs the scenario on a started cluster of three replicas.
pub async fn leader_kill_under_load(cluster: &mut Cluster) -> Result<()> {
    cluster.leader(Duration::from_secs(30))?;
    // The replicas share a peer token: a client without it is refused by every one of them.
    let intruder = cluster.client_with_wrong_token()?.txn(vec![Op::Create(config_map("intruder", "x"))]).await;
    ensure!(
        intruder.as_ref().is_err_and(|e| e.to_string().contains("peer token")),
        "a client without the peer token was served: {intruder:?}"
    );
    let store = cluster.client()?;
    let history: History = History::new();
    for k in 0..KEYS {
        let name = format!("k{k}");
        let id = history.invoke(100, KvInput::put(&name, "initial"));
        store.txn(vec![Op::Create(config_map(&name, "initial"))]).await.context("creating the keys")?;
        history.ok(id, KvOutput::PutOk);
    }

    let acked = Arc::new(Mutex::new(BTreeSet::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|n| tokio::spawn(client(store.clone(), n, history.clone(), acked.clone(), stop.clone())))
        .collect();

    tokio::time::sleep(Duration::from_secs(1)).await; // load before the fault (not waiting for a condition)
    let before = acked.lock().unwrap().len();
    let old = cluster.leader(Duration::from_secs(10))?;
    let killed = Instant::now();
    cluster.kill(old)?;
    // A new leader serves writes: count acknowledgements made after the kill.
    let recovered = wait_for(Duration::from_secs(30), || (acked.lock().unwrap().len() > before + 10).then_some(()));
    ensure!(recovered.is_some(), "no writes acknowledged after the leader was killed\n{}", cluster.logs());
    let new = cluster.leader(Duration::from_secs(10))?;
    ensure!(new != old, "the killed replica cannot lead");
    println!("leader {old} killed; writes acknowledged again within {:?}; new leader {new}", killed.elapsed());
    tokio::time::sleep(Duration::from_secs(1)).await; // more load on the new leader
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await?;
    }

    cluster.restart(old)?;
    let acked = acked.lock().unwrap().clone();
    converged(cluster, &acked).await?;

    let operations = history.operations();
    let stats = check(&KvModel, &operations, &CheckOptions::default());
    if let Err(e) = &stats {
        let path = std::env::temp_dir().join("gitplane-t70-history.json");
        let _ = history.save(&path);
        anyhow::bail!("the history is not linearizable (saved to {}):\n{e:?}", path.display());
    }
    println!("{} operations, {} acknowledged creates; linearizable: {:?}", operations.len(), acked.len(), stats.ok());

    // SIGKILL of every replica at once, then a restart: nothing acknowledged is lost.
    for id in cluster.running() {
        cluster.kill(id)?;
    }
    for id in [1, 2, 3] {
        cluster.restart(id)?;
    }
    cluster.leader(Duration::from_secs(30))?;
    converged(cluster, &acked).await?;
    cluster.client()?.txn(vec![Op::Create(config_map("after-restart", "x"))]).await?;
    Ok(())
}
