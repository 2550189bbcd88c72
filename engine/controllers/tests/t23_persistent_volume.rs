//! The PersistentVolume controller on its several workers against a real (SQLite) store: claims
//! created at once race for fewer static volumes, and each volume ends bound to one claim, both
//! ways, the other claims Pending.

use gitplane_controllers::{Context, Controller, persistent_volume::PersistentVolumeController};
use gitplane_storage::sqlite::SqliteStore;
use gitplane_store::{Api, Op, Store, informer::Informer};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use serde_json::json;
use std::{collections::BTreeMap, sync::Arc, time::Duration};

const VOLUMES: usize = 3;
const CLAIMS: usize = 12;

fn phase(status: Option<&str>) -> &str {
    status.unwrap_or("Pending")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t20_claims_racing_for_a_volume_never_share_it() {
    let store: Arc<dyn Store> = Arc::new(SqliteStore::memory().await.unwrap());
    let informer = Informer::spawn(store.clone(), gitplane_controllers::watched_kinds());
    let ctx = Context::new(store.clone(), informer);
    let binder = tokio::spawn(Controller::new(PersistentVolumeController, ctx).run());

    let volumes_made: Vec<Op> = (0..VOLUMES)
        .map(|i| {
            Op::Create(json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": format!("pv-{i}")},
                "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                         "storageClassName": "manual", "hostPath": {"path": format!("/mnt/{i}")}}}))
        })
        .collect();
    store.txn(volumes_made).await.unwrap();
    let claims: Vec<Op> = (0..CLAIMS)
        .map(|i| {
            Op::Create(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": format!("data-{i}"), "namespace": "default"},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "manual",
                         "resources": {"requests": {"storage": "1Gi"}}}}))
        })
        .collect();
    store.txn(claims).await.unwrap();

    let (volumes, claims) =
        (Api::<PersistentVolume>::new(store.clone()), Api::<PersistentVolumeClaim>::new(store.clone()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let (bound_volumes, bound_claims) = loop {
        let all_volumes = volumes.list(None).await.unwrap().0;
        let all_claims = claims.list(Some("default")).await.unwrap().0;
        let bound_volumes: Vec<PersistentVolume> = all_volumes
            .into_iter()
            .filter(|v| phase(v.status.as_ref().and_then(|s| s.phase.as_deref())) == "Bound")
            .collect();
        let bound_claims: Vec<PersistentVolumeClaim> = all_claims
            .into_iter()
            .filter(|c| phase(c.status.as_ref().and_then(|s| s.phase.as_deref())) == "Bound")
            .collect();
        if bound_volumes.len() == VOLUMES && bound_claims.len() >= VOLUMES {
            break (bound_volumes, bound_claims);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} volumes and {} claims Bound",
            bound_volumes.len(),
            bound_claims.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };

    // Each volume names one claim, and that claim (and no other) names it.
    let holders: BTreeMap<String, String> = bound_claims
        .iter()
        .map(|c| (c.spec.as_ref().unwrap().volume_name.clone().unwrap(), c.metadata.name.clone().unwrap()))
        .collect();
    assert_eq!((holders.len(), bound_claims.len()), (VOLUMES, VOLUMES), "two claims name one volume: {bound_claims:?}");
    for volume in &bound_volumes {
        let name = volume.metadata.name.clone().unwrap();
        let claim_ref = volume.spec.as_ref().unwrap().claim_ref.as_ref().unwrap();
        assert_eq!(claim_ref.name.as_ref(), holders.get(&name), "{name} and its claim disagree");
    }
    binder.abort();
}
