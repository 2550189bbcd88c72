//! The controller runtime against a real (SQLite) store and informer, with a scripted
//! reconciler: changes that arrive while a key is reconciled coalesce into one more reconcile,
//! failures are retried with a growing backoff, and requeues run without any change.

use gitplane_controllers::{Action, Context, Controller, ReconcileError, Reconciler, runtime::all_of};
use gitplane_storage::sqlite::SqliteStore;
use gitplane_store::{Event, ObjectKey, Op, Store, informer::Cache, informer::Informer};
use k8s_openapi::api::core::v1::ConfigMap;
use serde_json::json;
use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};
use tokio::{sync::Semaphore, time::Instant};

/// Reconciles ConfigMaps by name: `busy` waits for the gate on its first reconcile, `flaky`
/// fails three times, `periodic` asks to be requeued; every reconcile is recorded.
#[derive(Clone)]
struct Scripted {
    calls: Arc<Mutex<HashMap<String, Vec<Instant>>>>,
    gate: Arc<Semaphore>,
}

impl Scripted {
    fn calls(&self, name: &str) -> Vec<Instant> {
        self.calls.lock().unwrap().get(name).cloned().unwrap_or_default()
    }
}

#[async_trait::async_trait]
impl Reconciler for Scripted {
    fn name(&self) -> &'static str {
        "scripted"
    }

    fn keys_for(&self, event: &Event, _: &Cache) -> Vec<ObjectKey> {
        vec![event.key.clone()]
    }

    fn all_keys(&self, cache: &Cache) -> Vec<ObjectKey> {
        all_of::<ConfigMap>(cache)
    }

    async fn reconcile(&self, key: &ObjectKey, _: &Context) -> Result<Action, ReconcileError> {
        let attempt = {
            let mut calls = self.calls.lock().unwrap();
            let calls = calls.entry(key.name.clone()).or_default();
            calls.push(Instant::now());
            calls.len()
        };
        match key.name.as_str() {
            "busy" if attempt == 1 => {
                let _permit = self.gate.acquire().await;
                Ok(Action::await_change())
            }
            "flaky" if attempt <= 3 => Err(ReconcileError::Invalid("not yet".into())),
            "periodic" => Ok(Action::requeue(Duration::from_millis(50))),
            _ => Ok(Action::await_change()),
        }
    }
}

fn config_map(name: &str, value: usize) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "default"},
           "data": {"value": value.to_string()}})
}

async fn eventually(what: &str, check: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

struct Running {
    store: Arc<dyn Store>,
    informer: Informer,
    reconciler: Scripted,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn start(names: &[&str]) -> Running {
    let store: Arc<dyn Store> = Arc::new(SqliteStore::memory().await.unwrap());
    store.txn(names.iter().map(|n| Op::Create(config_map(n, 0))).collect()).await.unwrap();
    let informer = Informer::spawn(store.clone(), vec!["ConfigMap".into()]);
    let reconciler = Scripted { calls: Default::default(), gate: Arc::new(Semaphore::new(0)) };
    let controller = Controller::new(reconciler.clone(), Context::new(store.clone(), informer.clone()));
    Running { store, informer, reconciler, task: tokio::spawn(controller.run()) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t10_changes_during_a_reconcile_coalesce_into_one() {
    let run = start(&["busy"]).await;
    eventually("the first reconcile", || run.reconciler.calls("busy").len() == 1).await;
    let mut revision = 0;
    for i in 1..=20 {
        revision = run.store.txn(vec![Op::Update(config_map("busy", i))]).await.unwrap().revision;
    }
    // Every change is in the controller's channel before the first reconcile returns.
    run.informer.wait_for(revision).await;
    run.reconciler.gate.add_permits(1);
    eventually("the second reconcile", || run.reconciler.calls("busy").len() == 2).await;
    // Sleeping only to show that nothing more happens.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(run.reconciler.calls("busy").len(), 2, "twenty changes, one reconcile");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t10_failures_back_off_and_requeues_need_no_change() {
    let run = start(&["flaky", "periodic", "quiet"]).await;
    eventually("flaky to succeed", || run.reconciler.calls("flaky").len() == 4).await;
    let calls = run.reconciler.calls("flaky");
    let gaps: Vec<Duration> = calls.windows(2).map(|w| w[1] - w[0]).collect();
    for (gap, backoff) in gaps.iter().zip([100, 200, 400]) {
        assert!(*gap >= Duration::from_millis(backoff), "retries wait for the backoff: {gaps:?}");
    }
    eventually("periodic requeues", || run.reconciler.calls("periodic").len() >= 5).await;
    assert_eq!(run.reconciler.calls("quiet").len(), 1, "an unchanged object is reconciled once");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(run.reconciler.calls("flaky").len(), 4, "a success ends the retries");
}
