//! The store contract as tests: every backend runs the same suite (as openraft's
//! `testing::Suite`). Each check takes a fresh, empty store. Backend crates enable the
//! `conformance` feature in their dev-dependencies.

use crate::{EventType, ListOptions, ObjectKey, Op, Rejection, Store, StoreError, WatchOptions};
use futures::{StreamExt, future::LocalBoxFuture};
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

/// Runs every check, each against a fresh store made by `new_store`. The guard that comes with
/// the store (a temporary directory, a cluster to shut down) is dropped after its check, also
/// when the check fails, as openraft's `StoreBuilder` guard is.
pub async fn run_all<S, G, F, Fut>(new_store: F)
where
    S: Store,
    F: Fn() -> Fut,
    Fut: Future<Output = (G, S)>,
{
    for check in CHECKS {
        let (_guard, store) = new_store().await;
        check(Arc::new(store)).await;
    }
}

type Check = fn(Arc<dyn Store>) -> LocalBoxFuture<'static, ()>;

const CHECKS: [Check; 18] = [
    |s| Box::pin(create_get_and_already_exists(s)),
    |s| Box::pin(revisions_are_global_and_monotonic(s)),
    |s| Box::pin(update_is_compare_and_swap(s)),
    |s| Box::pin(status_is_a_subresource(s)),
    |s| Box::pin(update_with_status_writes_both_at_once(s)),
    |s| Box::pin(delete_with_precondition(s)),
    |s| Box::pin(transactions_are_all_or_nothing(s)),
    |s| Box::pin(list_filters_namespace_at_one_revision(s)),
    |s| Box::pin(watch_replays_then_follows_in_order(s)),
    |s| Box::pin(compaction_expires_old_watches(s)),
    |s| Box::pin(oversized_objects_are_refused(s)),
    |s| Box::pin(label_selectors_filter_lists(s)),
    |s| Box::pin(pages_are_consistent_at_the_first_pages_revision(s)),
    |s| Box::pin(compaction_keeps_what_later_lists_need(s)),
    |s| Box::pin(watches_filter_kinds_and_send_bookmarks(s)),
    |s| Box::pin(concurrent_transactions_get_distinct_revisions(s)),
    |s| Box::pin(list_json_is_the_lists_text(s)),
    |s| Box::pin(one_event_per_object_per_transaction(s)),
];

async fn create_get_and_already_exists(store: Arc<dyn Store>) {
    let c = store.txn(vec![Op::Create(pod("a", "p"))]).await.unwrap();
    let got = store.get(&key("a", "p")).await.unwrap().unwrap();
    assert_eq!(got, c.objects[0]);
    assert_eq!(rv(&got), c.revision);
    assert!(got["metadata"]["uid"].as_str().is_some_and(|u| !u.is_empty()));
    assert!(got["metadata"]["creationTimestamp"].is_string());
    assert!(store.get(&key("a", "q")).await.unwrap().is_none());
    let err = store.txn(vec![Op::Create(pod("a", "p"))]).await.unwrap_err();
    assert!(err.is_already_exists(), "{err}");
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
        StoreError::Rejected(Rejection::Conflict { expected, current, .. }) => {
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

async fn update_with_status_writes_both_at_once(store: Arc<dyn Store>) {
    let created = store.txn(vec![Op::Create(pod("a", "p"))]).await.unwrap().objects.remove(0);
    let from = store.revision().await.unwrap();
    let mut watch = store.watch(from, WatchOptions::default()).await.unwrap();
    let mut bound = created.clone();
    bound["spec"]["nodeName"] = json!("n1");
    bound["status"] = json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]});
    bound["metadata"]["uid"] = json!("not-the-stores");
    let v = store.txn(vec![Op::UpdateWithStatus(bound.clone())]).await.unwrap().objects.remove(0);
    assert_eq!(v["spec"]["nodeName"], "n1");
    assert_eq!(v["status"]["conditions"][0]["type"], "PodScheduled");
    assert_eq!(v["metadata"]["generation"], 2, "the spec changed");
    assert_eq!(v["metadata"]["uid"], created["metadata"]["uid"], "managed metadata stays the store's");
    assert_eq!(store.get(&key("a", "p")).await.unwrap().unwrap(), v);
    let e = next(&mut watch).await;
    assert_eq!((e.event_type, e.revision, &*e.object), (EventType::Modified, rv(&v), &v), "one event, one write");
    // Compare-and-swap: the object moved on since `bound` was read.
    let err = store.txn(vec![Op::UpdateWithStatus(bound)]).await.unwrap_err();
    assert!(err.is_conflict(), "{err}");
    // Without a status the object has none; the spec unchanged keeps the generation.
    let mut cleared = v.clone();
    cleared.as_object_mut().unwrap().remove("status");
    let v = store.txn(vec![Op::UpdateWithStatus(cleared)]).await.unwrap().objects.remove(0);
    assert!(v.get("status").is_none());
    assert_eq!(v["metadata"]["generation"], 2);
    let missing = store.txn(vec![Op::UpdateWithStatus(pod("a", "nope"))]).await.unwrap_err();
    assert!(missing.is_not_found(), "{missing}");
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
    assert!(err.is_already_exists());
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
    let a = store.list("Pod", &ListOptions { namespace: Some("a".into()), ..Default::default() }).await.unwrap();
    let names: Vec<_> = a.items.iter().map(|o| o["metadata"]["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["p1", "p3"]);
    assert!(store.list("Deployment.apps", &ListOptions::default()).await.unwrap().items.is_empty());
}

async fn watch_replays_then_follows_in_order(store: Arc<dyn Store>) {
    let first = store.txn(vec![Op::Create(pod("a", "p"))]).await.unwrap().revision;
    let second = store.txn(vec![Op::Create(pod("a", "q"))]).await.unwrap().revision;
    let mut from_first = store.watch(first, WatchOptions::default()).await.unwrap();
    let mut from_start = store.watch(0, WatchOptions::default()).await.unwrap();
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

async fn one_event_per_object_per_transaction(store: Arc<dyn Store>) {
    let from = store.revision().await.unwrap();
    let mut watch = store.watch(from, WatchOptions::default()).await.unwrap();
    let with_status = |name: &str, phase: &str| {
        let mut p = pod("a", name);
        p["status"] = json!({"phase": phase});
        p
    };
    // Created, then its status: one ADDED carrying the status.
    let created =
        store.txn(vec![Op::Create(pod("a", "p")), Op::UpdateStatus(with_status("p", "Pending"))]).await.unwrap();
    assert_eq!(created.objects.len(), 2, "each op still answers with its object");
    // A spec change and a status change (a bind): one MODIFIED with both.
    let mut bound = created.objects[1].clone();
    bound["spec"] = json!({"nodeName": "n1"});
    let status = with_status("p", "Running"); // no resourceVersion: after the update above
    let bind = store.txn(vec![Op::Update(bound), Op::UpdateStatus(status)]).await.unwrap().revision;
    // Created and deleted: nothing to see. Deleted and created again: two objects, two events.
    store.txn(vec![Op::Create(pod("a", "gone")), Op::Delete { key: key("a", "gone"), revision: None }]).await.unwrap();
    let again =
        store.txn(vec![Op::Delete { key: key("a", "p"), revision: None }, Op::Create(pod("a", "p"))]).await.unwrap();
    let mut seen = Vec::new();
    while seen.len() < 4 {
        let e = next(&mut watch).await;
        seen.push((
            e.revision,
            e.event_type,
            e.key.name.clone(),
            e.object["spec"]["nodeName"].clone(),
            e.object["status"]["phase"].clone(),
        ));
    }
    assert_eq!(
        seen,
        [
            (created.revision, EventType::Added, "p".into(), Value::Null, json!("Pending")),
            (bind, EventType::Modified, "p".into(), json!("n1"), json!("Running")),
            (again.revision, EventType::Deleted, "p".into(), json!("n1"), json!("Running")),
            (again.revision, EventType::Added, "p".into(), Value::Null, Value::Null),
        ]
    );
    store.txn(vec![Op::Create(pod("a", "last"))]).await.unwrap();
    assert_eq!(next(&mut watch).await.key.name, "last", "the created-and-deleted object left no event");
}

async fn compaction_expires_old_watches(store: Arc<dyn Store>) {
    let r1 = store.txn(vec![Op::Create(pod("a", "p"))]).await.unwrap().revision;
    let r2 = store.txn(vec![Op::Create(pod("a", "q"))]).await.unwrap().revision;
    store.compact(r2).await.unwrap();
    let err = store.watch(r1, WatchOptions::default()).await.err().expect("a watch from before compaction expires");
    assert!(matches!(err, StoreError::Expired { requested, compacted } if requested == r1 && compacted == r2));
    let mut w = store.watch(r2, WatchOptions::default()).await.unwrap();
    store.txn(vec![Op::Create(pod("a", "r"))]).await.unwrap();
    assert_eq!(next(&mut w).await.key.name, "r");
}

async fn oversized_objects_are_refused(store: Arc<dyn Store>) {
    let mut big = pod("a", "big");
    big["metadata"]["annotations"] = json!({"blob": "x".repeat(crate::MAX_OBJECT_BYTES)});
    let err = store.txn(vec![Op::Create(big)]).await.unwrap_err();
    assert!(matches!(err, StoreError::Rejected(Rejection::TooLarge { .. })), "{err}");
    assert!(err.to_string().contains("over the limit"), "{err}");
}

fn labeled(ns: &str, name: &str, labels: Value) -> Value {
    let mut p = pod(ns, name);
    p["metadata"]["labels"] = labels;
    p
}

fn names(items: &[Value]) -> Vec<String> {
    items.iter().map(|o| o["metadata"]["name"].as_str().unwrap().to_owned()).collect()
}

async fn label_selectors_filter_lists(store: Arc<dyn Store>) {
    store
        .txn(vec![
            Op::Create(labeled("a", "web-1", json!({"app": "web", "tier": "front"}))),
            Op::Create(labeled("a", "web-2", json!({"app": "web"}))),
            Op::Create(labeled("a", "db", json!({"app": "db"}))),
        ])
        .await
        .unwrap();
    let list = |selector: &str| {
        let store = store.clone();
        let options = ListOptions { label_selector: Some(selector.to_owned()), ..Default::default() };
        async move { names(&store.list("Pod", &options).await.unwrap().items) }
    };
    assert_eq!(list("app=web").await, ["web-1", "web-2"]);
    assert_eq!(list("app in (web,db),!tier").await, ["db", "web-2"]);
    assert_eq!(list("app!=web").await, ["db"]);
    let options = ListOptions { label_selector: Some("=web".into()), ..Default::default() };
    let err = store.list("Pod", &options).await.unwrap_err();
    assert!(matches!(err, StoreError::BadRequest(_)), "{err}");
    // A selector and a limit together: pages hold matching items only.
    let options = ListOptions { label_selector: Some("app=web".into()), limit: Some(1), ..Default::default() };
    let first = store.list("Pod", &options).await.unwrap();
    assert_eq!(names(&first.items), ["web-1"]);
    let next = ListOptions { continue_token: first.continue_token, ..options };
    let second = store.list("Pod", &next).await.unwrap();
    assert_eq!((names(&second.items), second.continue_token), (vec!["web-2".to_owned()], None));
}

async fn pages_are_consistent_at_the_first_pages_revision(store: Arc<dyn Store>) {
    for i in 0..5 {
        store.txn(vec![Op::Create(pod("a", &format!("p{i}")))]).await.unwrap();
    }
    let options = ListOptions { limit: Some(2), ..Default::default() };
    let first = store.list("Pod", &options).await.unwrap();
    assert_eq!(names(&first.items), ["p0", "p1"]);
    // Changes after the first page do not show in the later pages.
    let mut changed = store.get(&key("a", "p3")).await.unwrap().unwrap();
    changed["metadata"]["labels"] = json!({"changed": "yes"});
    store
        .txn(vec![Op::Update(changed), Op::Delete { key: key("a", "p2"), revision: None }, Op::Create(pod("a", "p2b"))])
        .await
        .unwrap();
    let mut token = first.continue_token;
    let mut rest = Vec::new();
    while let Some(t) = token {
        let page = store.list("Pod", &ListOptions { continue_token: Some(t), ..options.clone() }).await.unwrap();
        assert_eq!(page.revision, first.revision, "every page is read at the first page's revision");
        rest.extend(page.items);
        token = page.continue_token;
    }
    assert_eq!(names(&rest), ["p2", "p3", "p4"]);
    assert!(rest[1]["metadata"]["labels"].is_null(), "p3 as it was at the first page's revision");
    let bad = store.list("Pod", &ListOptions { continue_token: Some("zz".into()), ..Default::default() }).await;
    assert!(matches!(bad, Err(StoreError::BadRequest(_))));
    // The largest limit there is lists everything, at once (it once wrapped to a page of none).
    let all = store.list("Pod", &ListOptions { limit: Some(usize::MAX), ..Default::default() }).await.unwrap();
    assert_eq!((all.items.len(), all.continue_token), (5, None));
}

async fn compaction_keeps_what_later_lists_need(store: Arc<dyn Store>) {
    let old = store.txn(vec![Op::Create(pod("a", "p0")), Op::Create(pod("a", "p1"))]).await.unwrap().revision;
    let options = ListOptions { limit: Some(1), ..Default::default() };
    let stale = store.list("Pod", &options).await.unwrap();
    let kept = store.txn(vec![Op::Create(pod("a", "p2"))]).await.unwrap().revision;
    let page = store.list("Pod", &options).await.unwrap();
    // p1 changes after `kept`; a page at `kept` must still see p1 as it was.
    let mut p1 = store.get(&key("a", "p1")).await.unwrap().unwrap();
    p1["metadata"]["labels"] = json!({"v": "2"});
    store.txn(vec![Op::Update(p1)]).await.unwrap();
    store.compact(kept).await.unwrap();
    let next = ListOptions { continue_token: page.continue_token, ..options.clone() };
    let rest = store.list("Pod", &ListOptions { limit: None, ..next }).await.unwrap();
    assert_eq!(names(&rest.items), ["p1", "p2"]);
    assert!(rest.items[0]["metadata"]["labels"].is_null());
    let expired = store.list("Pod", &ListOptions { continue_token: stale.continue_token, ..options }).await;
    assert!(matches!(expired, Err(StoreError::Expired { requested, .. }) if requested == old), "{expired:?}");
    let at = store.list("Pod", &ListOptions { at_revision: Some(kept), ..Default::default() }).await.unwrap();
    assert_eq!((names(&at.items), at.revision), (vec!["p0".into(), "p1".into(), "p2".into()], kept));
}

async fn watches_filter_kinds_and_send_bookmarks(store: Arc<dyn Store>) {
    let options = WatchOptions { kinds: Some(vec!["ConfigMap".into()]), bookmarks: true, ..Default::default() };
    let mut w = store.watch(0, options).await.unwrap();
    let noise = store.txn(vec![Op::Create(pod("a", "p"))]).await.unwrap().revision;
    let e = next(&mut w).await;
    assert_eq!((e.event_type, e.revision), (EventType::Bookmark, noise), "a filtered-out commit gives a bookmark");
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "a"}});
    let wanted = store.txn(vec![Op::Create(cm)]).await.unwrap().revision;
    let e = next(&mut w).await;
    assert_eq!((e.event_type, e.revision, e.key.kind.as_str()), (EventType::Added, wanted, "ConfigMap"));
}

async fn concurrent_transactions_get_distinct_revisions(store: Arc<dyn Store>) {
    store.txn(vec![Op::Create(pod("a", "taken"))]).await.unwrap();
    let writers: Vec<_> = (0..64)
        .map(|i| {
            let store = store.clone();
            // Every eighth one is refused; it must not take the others down with it.
            let name = if i % 8 == 0 { "taken".to_owned() } else { format!("p{i}") };
            tokio::spawn(async move { store.txn(vec![Op::Create(pod("a", &name))]).await })
        })
        .collect();
    let mut revisions = Vec::new();
    for (i, w) in writers.into_iter().enumerate() {
        match w.await.unwrap() {
            Ok(c) => revisions.push(c.revision),
            Err(e) => assert!(i % 8 == 0 && e.is_already_exists(), "{i}: {e}"),
        }
    }
    revisions.sort();
    revisions.dedup();
    assert_eq!(revisions.len(), 56, "each committed transaction has its own revision");
    assert_eq!(store.list("Pod", &ListOptions::default()).await.unwrap().items.len(), 57);
}

/// `list_json` hands out exactly `Value::to_string` of what `list` returns, page by page, at the
/// latest revision and at an older one, with and without a selector: what an API server splices.
async fn list_json_is_the_lists_text(store: Arc<dyn Store>) {
    let odd = json!({"note": "\u{e9}\"quoted\"\n\t<&>\u{1f600}\u{7f}", "ratio": 0.1, "big": 12345678901234567_i64, "neg": -2.5e-8});
    let mut ops: Vec<Op> =
        (0..4).map(|i| Op::Create(labeled("a", &format!("p{i}"), json!({"i": i.to_string()})))).collect();
    let mut special = labeled("b", "z", json!({"i": "odd"}));
    special["spec"]["extra"] = odd;
    ops.push(Op::Create(special));
    store.txn(ops).await.unwrap();
    let same = |options: ListOptions| {
        let store = store.clone();
        async move {
            let list = store.list("Pod", &options).await.unwrap();
            let text = store.list_json("Pod", &options).await.unwrap();
            let expected: Vec<String> = list.items.iter().map(Value::to_string).collect();
            assert_eq!(text.items, expected, "{options:?}");
            assert_eq!((text.revision, &text.continue_token), (list.revision, &list.continue_token), "{options:?}");
            text
        }
    };
    same(ListOptions::default()).await;
    same(ListOptions { namespace: Some("b".into()), ..Default::default() }).await;
    same(ListOptions { label_selector: Some("i in (1,odd)".into()), ..Default::default() }).await;
    let first = same(ListOptions { limit: Some(2), ..Default::default() }).await;
    // The next page read at the first page's revision, after the objects changed since.
    let mut changed = store.get(&key("a", "p3")).await.unwrap().unwrap();
    changed["metadata"]["labels"] = json!({"changed": "yes"});
    store.txn(vec![Op::Update(changed), Op::Delete { key: key("a", "p2"), revision: None }]).await.unwrap();
    let next = same(ListOptions { limit: Some(2), continue_token: first.continue_token, ..Default::default() }).await;
    assert_eq!(next.revision, first.revision);
    same(ListOptions { limit: Some(2), continue_token: next.continue_token, ..Default::default() }).await;
}
