//! The store contract as tests: every backend runs the same suite (as openraft's
//! `testing::Suite`). Each check takes a fresh, empty store.

use crate::{EventType, ListOptions, ObjectKey, Op, Store, StoreError};
use futures::StreamExt;
use serde_json::{Value, json};
use std::{future::Future, sync::Arc, time::Duration};

fn pod(ns: &str, name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns}, "spec": {"containers": []}})
}

fn key(ns: &str, name: &str) -> ObjectKey {
    ObjectKey::new("Pod", ns, name)
}

async fn next(stream: &mut crate::WatchStream) -> crate::Event {
    tokio::time::timeout(Duration::from_secs(10), stream.next()).await.unwrap().unwrap().unwrap()
}

fn rv(v: &Value) -> i64 {
    v["metadata"]["resourceVersion"].as_str().unwrap().parse().unwrap()
}

/// Runs every check against stores made by `new_store`.
pub async fn run_all<S, F, Fut>(new_store: F)
where
    S: Store,
    F: Fn() -> Fut,
    Fut: Future<Output = S>,
{
    create_get_and_already_exists(Arc::new(new_store().await)).await;
    revisions_are_global_and_monotonic(Arc::new(new_store().await)).await;
    update_is_compare_and_swap(Arc::new(new_store().await)).await;
    status_is_a_subresource(Arc::new(new_store().await)).await;
    delete_with_precondition(Arc::new(new_store().await)).await;
    transactions_are_all_or_nothing(Arc::new(new_store().await)).await;
    list_filters_namespace_at_one_revision(Arc::new(new_store().await)).await;
    watch_replays_then_follows_in_order(Arc::new(new_store().await)).await;
    compaction_expires_old_watches(Arc::new(new_store().await)).await;
    oversized_objects_are_refused(Arc::new(new_store().await)).await;
}

async fn create_get_and_already_exists(store: Arc<dyn Store>) {
    let c = store.txn(vec![Op::Create(pod("a", "p"))]).await.unwrap();
    let got = store.get(&key("a", "p")).await.unwrap().unwrap();
    assert_eq!(got, c.objects[0]);
    assert_eq!(rv(&got), c.revision);
    assert!(got["metadata"]["uid"].as_str().is_some_and(|u| !u.is_empty()));
    assert!(got["metadata"]["creationTimestamp"].is_string());
    assert!(store.get(&key("a", "q")).await.unwrap().is_none());
    let err = store.txn(vec![Op::Create(pod("a", "p"))]).await.unwrap_err();
    assert!(matches!(err, StoreError::AlreadyExists { .. }), "{err}");
}

async fn revisions_are_global_and_monotonic(store: Arc<dyn Store>) {
    assert_eq!(store.revision().await.unwrap(), 0);
    let a = store.txn(vec![Op::Create(pod("a", "p"))]).await.unwrap().revision;
    let b = store.txn(vec![Op::Create(pod("b", "p"))]).await.unwrap().revision;
    assert!(b > a);
    assert_eq!(store.revision().await.unwrap(), b);
    let failed = store.txn(vec![Op::Create(pod("b", "p"))]).await;
    assert!(failed.is_err());
    assert_eq!(store.revision().await.unwrap(), b, "a failed transaction does not bump the revision");
}

async fn update_is_compare_and_swap(store: Arc<dyn Store>) {
    let created = store.txn(vec![Op::Create(pod("a", "p"))]).await.unwrap().objects.remove(0);
    let mut first = created.clone();
    first["metadata"]["labels"] = json!({"v": "1"});
    let updated = store.txn(vec![Op::Update(first)]).await.unwrap().objects.remove(0);
    assert_eq!(updated["metadata"]["uid"], created["metadata"]["uid"]);
    let mut stale = created.clone();
    stale["metadata"]["labels"] = json!({"v": "2"});
    match store.txn(vec![Op::Update(stale)]).await.unwrap_err() {
        StoreError::Conflict { expected, current, .. } => {
            assert_eq!(expected, rv(&created));
            assert_eq!(current, rv(&updated));
        }
        e => panic!("expected a conflict, got {e}"),
    }
    let mut unconditional = pod("a", "p");
    unconditional["metadata"]["labels"] = json!({"v": "3"});
    let last = store.txn(vec![Op::Update(unconditional)]).await.unwrap().objects.remove(0);
    assert_eq!(last["metadata"]["labels"]["v"], "3");
    let missing = store.txn(vec![Op::Update(pod("a", "nope"))]).await.unwrap_err();
    assert!(missing.is_not_found(), "{missing}");
}

async fn status_is_a_subresource(store: Arc<dyn Store>) {
    let created = store.txn(vec![Op::Create(pod("a", "p"))]).await.unwrap().objects.remove(0);
    let mut with_status = created.clone();
    with_status["status"] = json!({"phase": "Running"});
    with_status["spec"] = json!({"containers": [], "nodeName": "ignored"});
    let v = store.txn(vec![Op::UpdateStatus(with_status)]).await.unwrap().objects.remove(0);
    assert_eq!(v["status"]["phase"], "Running");
    assert!(v["spec"].get("nodeName").is_none(), "a status write changes nothing else");
    assert_eq!(v["metadata"]["generation"], 1);
    let mut spec_change = v.clone();
    spec_change["spec"]["nodeName"] = json!("n1");
    spec_change["status"] = json!({"phase": "Failed"});
    let v = store.txn(vec![Op::Update(spec_change)]).await.unwrap().objects.remove(0);
    assert_eq!(v["status"]["phase"], "Running", "an update keeps the stored status");
    assert_eq!(v["metadata"]["generation"], 2);
}

async fn delete_with_precondition(store: Arc<dyn Store>) {
    let created = store.txn(vec![Op::Create(pod("a", "p"))]).await.unwrap().objects.remove(0);
    let err = store.txn(vec![Op::Delete { key: key("a", "p"), revision: Some(rv(&created) + 100) }]).await.unwrap_err();
    assert!(err.is_conflict(), "{err}");
    let c = store.txn(vec![Op::Delete { key: key("a", "p"), revision: Some(rv(&created)) }]).await.unwrap();
    assert_eq!(rv(&c.objects[0]), c.revision);
    assert!(store.get(&key("a", "p")).await.unwrap().is_none());
    let err = store.txn(vec![Op::Delete { key: key("a", "p"), revision: None }]).await.unwrap_err();
    assert!(err.is_not_found(), "{err}");
}

async fn transactions_are_all_or_nothing(store: Arc<dyn Store>) {
    store.txn(vec![Op::Create(pod("a", "exists"))]).await.unwrap();
    let err = store.txn(vec![Op::Create(pod("a", "new")), Op::Create(pod("a", "exists"))]).await.unwrap_err();
    assert!(matches!(err, StoreError::AlreadyExists { .. }));
    assert!(store.get(&key("a", "new")).await.unwrap().is_none(), "nothing of a failed transaction is applied");
    let c = store.txn(vec![Op::Create(pod("a", "x")), Op::Create(pod("a", "y"))]).await.unwrap();
    assert_eq!(c.objects.len(), 2);
    assert!(c.objects.iter().all(|o| rv(o) == c.revision), "one transaction, one revision");
}

async fn list_filters_namespace_at_one_revision(store: Arc<dyn Store>) {
    for (ns, name) in [("a", "p1"), ("b", "p2"), ("a", "p3")] {
        store.txn(vec![Op::Create(pod(ns, name))]).await.unwrap();
    }
    let all = store.list("Pod", &ListOptions::default()).await.unwrap();
    assert_eq!(all.items.len(), 3);
    assert_eq!(all.revision, store.revision().await.unwrap());
    let a = store.list("Pod", &ListOptions { namespace: Some("a".into()) }).await.unwrap();
    let names: Vec<_> = a.items.iter().map(|o| o["metadata"]["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["p1", "p3"]);
    assert!(store.list("Deployment.apps", &ListOptions::default()).await.unwrap().items.is_empty());
}

async fn watch_replays_then_follows_in_order(store: Arc<dyn Store>) {
    let first = store.txn(vec![Op::Create(pod("a", "p"))]).await.unwrap().revision;
    let second = store.txn(vec![Op::Create(pod("a", "q"))]).await.unwrap().revision;
    let mut from_first = store.watch(first).await.unwrap();
    let mut from_start = store.watch(0).await.unwrap();
    let live = {
        let store = store.clone();
        tokio::spawn(async move {
            store.txn(vec![Op::Delete { key: key("a", "p"), revision: None }]).await.unwrap();
        })
    };
    let e = next(&mut from_first).await;
    assert_eq!((e.revision, e.event_type, e.key.name.as_str()), (second, EventType::Added, "q"));
    let e = next(&mut from_first).await;
    assert_eq!((e.event_type, e.key.name.as_str()), (EventType::Deleted, "p"));
    assert_eq!(rv(&e.object), e.revision);
    live.await.unwrap();
    let names: Vec<_> = [next(&mut from_start).await, next(&mut from_start).await, next(&mut from_start).await]
        .into_iter()
        .map(|e| (e.event_type, e.key.name))
        .collect();
    assert_eq!(
        names,
        [(EventType::Added, "p".into()), (EventType::Added, "q".into()), (EventType::Deleted, "p".into())]
    );
}

async fn compaction_expires_old_watches(store: Arc<dyn Store>) {
    let r1 = store.txn(vec![Op::Create(pod("a", "p"))]).await.unwrap().revision;
    let r2 = store.txn(vec![Op::Create(pod("a", "q"))]).await.unwrap().revision;
    store.compact(r2).await.unwrap();
    let err = store.watch(r1).await.err().expect("a watch from before compaction expires");
    assert!(matches!(err, StoreError::Expired { requested, compacted } if requested == r1 && compacted == r2));
    let mut w = store.watch(r2).await.unwrap();
    store.txn(vec![Op::Create(pod("a", "r"))]).await.unwrap();
    assert_eq!(next(&mut w).await.key.name, "r");
}

async fn oversized_objects_are_refused(store: Arc<dyn Store>) {
    let mut big = pod("a", "big");
    big["metadata"]["annotations"] = json!({"blob": "x".repeat(crate::MAX_OBJECT_BYTES)});
    let err = store.txn(vec![Op::Create(big)]).await.unwrap_err();
    assert!(matches!(err, StoreError::TooLarge { .. }), "{err}");
    assert!(err.to_string().contains("over the limit"), "{err}");
}
