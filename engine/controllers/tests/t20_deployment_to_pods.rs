//! The controllers against a real (SQLite) store: Deployment -> ReplicaSet -> Pods, a deleted
//! Pod comes back, scaling, cascading deletion.

use gitplane_storage::sqlite::SqliteStore;
use gitplane_store::{Api, Op, Store, informer::Informer};
use k8s_openapi::api::{apps::v1::Deployment, apps::v1::ReplicaSet, core::v1::Pod};
use std::{sync::Arc, time::Duration};

async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn deployment(replicas: i32) -> Deployment {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "web", "image": "gitplane.local/httpd:1"}]}}}
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployment_replicaset_pods() {
    let store: Arc<dyn Store> = Arc::new(SqliteStore::memory().await.unwrap());
    let informer = Informer::spawn(store.clone(), gitplane_controllers::watched_kinds());
    let handles = gitplane_controllers::spawn_all(store.clone(), informer, &Default::default());
    let pods = Api::<Pod>::new(store.clone());
    let deployments = Api::<Deployment>::new(store.clone());
    let count = || async { pods.list(Some("default")).await.unwrap().0.len() };

    deployments.create(&deployment(2)).await.unwrap();
    eventually("2 pods", || async { count().await == 2 }).await;
    let (rs, _) = Api::<ReplicaSet>::new(store.clone()).list(Some("default")).await.unwrap();
    assert_eq!(rs.len(), 1);
    let (listed, _) = pods.list(Some("default")).await.unwrap();
    assert!(
        listed.iter().all(|p| p.metadata.name.as_deref().unwrap().starts_with(rs[0].metadata.name.as_deref().unwrap()))
    );

    // A deleted Pod is recreated.
    let victim = listed[0].metadata.name.clone().unwrap();
    pods.delete("default", &victim, None).await.unwrap();
    eventually("a replacement pod", || async {
        let (now, _) = pods.list(Some("default")).await.unwrap();
        now.len() == 2 && now.iter().all(|p| p.metadata.name.as_deref() != Some(victim.as_str()))
    })
    .await;

    // Scaling down keeps exactly one, and stays there.
    let mut one = deployments.get("default", "web").await.unwrap().unwrap();
    one.spec.as_mut().unwrap().replicas = Some(1);
    deployments.update(&one).await.unwrap();
    eventually("1 pod", || async { count().await == 1 }).await;
    eventually("deployment status", || async {
        let d = deployments.get("default", "web").await.unwrap().unwrap();
        d.status.is_some_and(|s| s.replicas == Some(1) && s.observed_generation == Some(2))
    })
    .await;

    // Deleting the Deployment removes its ReplicaSet and Pods.
    store.txn(vec![Op::Delete { key: Api::<Deployment>::key("default", "web"), revision: None }]).await.unwrap();
    eventually("no pods and no replicasets", || async {
        count().await == 0 && Api::<ReplicaSet>::new(store.clone()).list(None).await.unwrap().0.is_empty()
    })
    .await;
    handles.into_iter().for_each(|h| h.abort());
}
