//! The Job controller against a real (SQLite) store: Pods run one at a time until enough
//! succeed; a Job whose Pods keep failing stops at its backoff limit. Nothing runs the Pods
//! here: the test reports their phase as a kubelet would.

use gitplane_controllers::job::JOB_NAME_LABEL;
use gitplane_storage::sqlite::SqliteStore;
use gitplane_store::{Api, Op, Store, informer::Informer};
use k8s_openapi::api::{batch::v1::Job, core::v1::Pod};
use std::{sync::Arc, time::Duration};

async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(found) = check().await {
            return found;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn job(name: &str, completions: i32, backoff_limit: i32) -> Job {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"completions": completions, "parallelism": 1, "backoffLimit": backoff_limit,
                 "template": {"spec": {"restartPolicy": "Never",
                                       "containers": [{"name": "work", "image": "gitplane.local/busybox:1"}]}}}
    }))
    .unwrap()
}

/// The one Pod of `job` still running, once there is exactly one.
async fn running_pod(pods: &Api<Pod>, job: &str) -> Pod {
    eventually("one running pod", || async {
        let (all, _) = pods.list(Some("default")).await.unwrap();
        let mut running: Vec<Pod> = all
            .into_iter()
            .filter(|p| {
                p.metadata.labels.as_ref().is_some_and(|l| l.get(JOB_NAME_LABEL).map(String::as_str) == Some(job))
            })
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()).is_none())
            .collect();
        (running.len() == 1).then(|| running.remove(0))
    })
    .await
}

async fn finish(store: &Arc<dyn Store>, mut pod: Pod, phase: &str) {
    pod.status = Some(k8s_openapi::api::core::v1::PodStatus { phase: Some(phase.into()), ..Default::default() });
    store.txn(vec![Op::UpdateStatus(serde_json::to_value(&pod).unwrap())]).await.unwrap();
}

/// The type of the Job's finishing condition, with its status, once it has one.
async fn finished(jobs: &Api<Job>, name: &str) -> (String, k8s_openapi::api::batch::v1::JobStatus) {
    eventually("a finished job", || async {
        let status = jobs.get("default", name).await.unwrap()?.status?;
        let done = status.conditions.iter().flatten().find(|c| c.status == "True")?.type_.clone();
        Some((done, status))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_run_to_completion_or_to_their_backoff_limit() {
    let store: Arc<dyn Store> = Arc::new(SqliteStore::memory().await.unwrap());
    let informer = Informer::spawn(store.clone(), gitplane_controllers::watched_kinds());
    let handles = gitplane_controllers::spawn_all(store.clone(), informer, &Default::default());
    let (pods, jobs) = (Api::<Pod>::new(store.clone()), Api::<Job>::new(store.clone()));

    // Two completions, one at a time, and a failure on the way (within the limit).
    jobs.create(&job("twice", 2, 1)).await.unwrap();
    finish(&store, running_pod(&pods, "twice").await, "Failed").await;
    finish(&store, running_pod(&pods, "twice").await, "Succeeded").await;
    finish(&store, running_pod(&pods, "twice").await, "Succeeded").await;
    let (condition, status) = finished(&jobs, "twice").await;
    assert_eq!(condition, "Complete");
    assert_eq!((status.succeeded, status.failed, status.active), (Some(2), Some(1), Some(0)));
    assert!(status.completion_time.is_some());

    // No retries allowed: the first failure fails the Job, and no Pod is started again.
    jobs.create(&job("once", 1, 0)).await.unwrap();
    finish(&store, running_pod(&pods, "once").await, "Failed").await;
    let (condition, status) = finished(&jobs, "once").await;
    assert_eq!(condition, "Failed");
    assert_eq!(status.conditions.unwrap()[0].reason.as_deref(), Some("BackoffLimitExceeded"));
    let (all, _) = pods.list(Some("default")).await.unwrap();
    let of_once = all.iter().filter(|p| p.metadata.name.as_deref().unwrap().starts_with("once-")).count();
    assert_eq!(of_once, 1, "a failed Job starts nothing more");

    // Deleting a Job removes its Pods.
    store.txn(vec![Op::Delete { key: Api::<Job>::key("default", "twice"), revision: None }]).await.unwrap();
    eventually("the job's pods gone", || async {
        let (all, _) = pods.list(Some("default")).await.unwrap();
        (!all.iter().any(|p| p.metadata.name.as_deref().unwrap().starts_with("twice-"))).then_some(())
    })
    .await;
    handles.into_iter().for_each(|h| h.abort());
}
