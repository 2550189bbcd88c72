//! The StatefulSet controller and the garbage collector against a real (SQLite) store: Pods one
//! at a time, each with its claim made before it; a ControllerRevision per template; claims
//! kept when their Pod goes (whenScaled: Retain), deleted with the Pod of a scale down
//! (whenScaled: Delete) or with the set (whenDeleted: Delete). Nothing runs the Pods here: the test reports them
//! Running and Ready as a kubelet would.

use gitplane_storage::sqlite::SqliteStore;
use gitplane_store::{Api, Op, Store, informer::Informer};
use k8s_openapi::api::{
    apps::v1::{ControllerRevision, StatefulSet},
    core::v1::{PersistentVolumeClaim, Pod},
};
use serde_json::json;
use std::{sync::Arc, time::Duration};

async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(found) = check().await {
            return found;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn set(replicas: i32, when_scaled: &str) -> StatefulSet {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"replicas": replicas, "serviceName": "nginx", "selector": {"matchLabels": {"app": "nginx"}},
                 "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Delete", "whenScaled": when_scaled},
                 "template": {"metadata": {"labels": {"app": "nginx"}},
                              "spec": {"containers": [{"name": "nginx", "image": "registry.k8s.io/nginx-slim:0.21"}]}},
                 "volumeClaimTemplates": [{"metadata": {"name": "www"},
                                           "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}]}
    }))
    .unwrap()
}

async fn names<K>(api: &Api<K>) -> Vec<String>
where
    K: gitplane_api::kube_core::Resource<DynamicType = ()> + serde::Serialize + serde::de::DeserializeOwned,
{
    let (all, _) = api.list(Some("default")).await.unwrap();
    all.iter().filter_map(|o| o.meta().name.clone()).collect()
}

/// Reports every Pod without a status Running and Ready, as its kubelet would; how many there
/// were.
async fn run_new_pods(store: &Arc<dyn Store>, pods: &Api<Pod>) -> usize {
    let (all, _) = pods.list(Some("default")).await.unwrap();
    let new: Vec<Pod> = all.into_iter().filter(|p| p.status.is_none()).collect();
    let count = new.len();
    for mut pod in new {
        pod.status = Some(
            serde_json::from_value(json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}))
                .unwrap(),
        );
        let _ = store.txn(vec![Op::UpdateStatus(serde_json::to_value(&pod).unwrap())]).await;
    }
    count
}

/// Runs Pods as they come until the set's Pods are `wanted`; the Pods seen on the way, and the
/// most Pods ever seen not yet Ready at once.
async fn settle(store: &Arc<dyn Store>, pods: &Api<Pod>, wanted: &[&str]) -> (Vec<Vec<String>>, usize) {
    let mut seen: Vec<Vec<String>> = Vec::new();
    let mut most_unready = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let unready = run_new_pods(store, pods).await;
        most_unready = most_unready.max(unready);
        let now = names(pods).await;
        if seen.last() != Some(&now) {
            seen.push(now.clone());
        }
        if now == wanted && unready == 0 {
            return (seen, most_unready);
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for Pods {wanted:?}: {seen:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Gives the stored set `wanted`'s spec, again while the controller writes its status.
async fn change(sets: &Api<StatefulSet>, wanted: StatefulSet) {
    eventually("the set's spec changed", || async {
        let mut current = sets.get("default", "web").await.unwrap()?;
        current.spec = wanted.spec.clone();
        sets.update(&current).await.ok()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t20_claims_are_made_before_their_pods_and_kept_or_deleted_as_the_policy_says() {
    let store: Arc<dyn Store> = Arc::new(SqliteStore::memory().await.unwrap());
    let informer = Informer::spawn(store.clone(), gitplane_controllers::watched_kinds());
    let handles = gitplane_controllers::spawn_all(store.clone(), informer, &Default::default());
    let (sets, pods) = (Api::<StatefulSet>::new(store.clone()), Api::<Pod>::new(store.clone()));
    let (claims, revisions) =
        (Api::<PersistentVolumeClaim>::new(store.clone()), Api::<ControllerRevision>::new(store.clone()));

    // In order, each Pod once the one before it is Ready; its claim first.
    sets.create(&set(3, "Retain")).await.unwrap();
    let (seen, most_unready) = settle(&store, &pods, &["web-0", "web-1", "web-2"]).await;
    assert_eq!(most_unready, 1, "never two Pods not Ready at once: {seen:?}");
    assert_eq!(names(&claims).await, ["www-web-0", "www-web-1", "www-web-2"]);
    let pod = pods.get("default", "web-1").await.unwrap().unwrap();
    let volume = &pod.spec.unwrap().volumes.unwrap()[0];
    assert_eq!(volume.persistent_volume_claim.as_ref().unwrap().claim_name, "www-web-1");
    let revision = &revisions.list(Some("default")).await.unwrap().0[0];
    let labels = pod.metadata.labels.unwrap();
    assert_eq!(labels["controller-revision-hash"], revision.metadata.name.clone().unwrap());
    let status = eventually("the set's status", || async {
        let status = sets.get("default", "web").await.unwrap()?.status?;
        (status.ready_replicas == Some(3)).then_some(status)
    })
    .await;
    assert_eq!(status.current_revision, revision.metadata.name);
    assert_eq!((status.replicas, status.updated_replicas), (3, Some(3)));

    // whenScaled: Retain keeps www-web-2 when web-2 goes.
    change(&sets, set(2, "Retain")).await;
    settle(&store, &pods, &["web-0", "web-1"]).await;
    assert_eq!(names(&claims).await, ["www-web-0", "www-web-1", "www-web-2"]);

    // whenScaled: Delete: web-1's claim goes with web-1, the claim of web-0 stays.
    change(&sets, set(1, "Delete")).await;
    settle(&store, &pods, &["web-0"]).await;
    eventually("www-web-1 deleted with web-1", || async {
        (names(&claims).await == ["www-web-0", "www-web-2"]).then_some(())
    })
    .await;

    // whenDeleted: Delete: every claim the set made goes with it (the one a scale down kept
    // too), and so do its Pods and revisions.
    store.txn(vec![Op::Delete { key: Api::<StatefulSet>::key("default", "web"), revision: None }]).await.unwrap();
    eventually("the set's Pods, claims and revisions gone", || async {
        let gone = names(&pods).await.is_empty() && names(&revisions).await.is_empty();
        (gone && names(&claims).await.is_empty()).then_some(())
    })
    .await;
    handles.into_iter().for_each(|h| h.abort());
}
