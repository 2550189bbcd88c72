//! What only the leader runs: the source, the scheduler and the controllers. A replica starts
//! them when it becomes the acting leader and stops them the moment it is not.

use crate::{
    bootstrap,
    mirror::Mirrors,
    source::{SourceController, apply::RecordKey},
};
use gitplane_store::{Store, informer::Informer};
use std::{path::PathBuf, sync::Arc};
use tokio::{sync::watch, task::JoinHandle};

/// The running leader-only loops; dropping it stops them.
pub struct ControlPlane {
    tasks: Vec<JoinHandle<()>>,
}

impl ControlPlane {
    pub async fn start(
        store: Arc<dyn Store>,
        repos_dir: PathBuf,
        mirrors: Mirrors,
        root: Option<String>,
        record_key: RecordKey,
    ) -> ControlPlane {
        if let Err(e) = bootstrap::namespaces(&store).await {
            tracing::warn!(error = %e, "creating the system namespaces failed");
        }
        if let Some(repo) = root
            && let Err(e) = bootstrap::root_application(&store, &repo).await
        {
            tracing::warn!(error = %e, "creating the root Application failed");
        }
        let informer = Informer::spawn(store.clone(), gitplane_controllers::watched_kinds());
        let mut tasks = gitplane_controllers::spawn_all(store.clone(), informer.clone());
        tasks.push(tokio::spawn(gitplane_scheduler::Scheduler::new(store.clone(), informer, Default::default()).run()));
        tasks.push(tokio::spawn(SourceController::new(store, repos_dir, mirrors, record_key).run()));
        ControlPlane { tasks }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Runs the control plane whenever `leading` is true.
pub async fn run_while_leading(
    mut leading: watch::Receiver<bool>,
    store: Arc<dyn Store>,
    repos_dir: PathBuf,
    mirrors: Mirrors,
    root: Option<String>,
    record_key: RecordKey,
) {
    loop {
        if leading.wait_for(|l| *l).await.is_err() {
            return;
        }
        tracing::info!("acting leader: starting the source, the scheduler and the controllers");
        let running =
            ControlPlane::start(store.clone(), repos_dir.clone(), mirrors.clone(), root.clone(), record_key.clone())
                .await;
        if leading.wait_for(|l| !*l).await.is_err() {
            return;
        }
        tracing::warn!("no longer the leader: stopping the source, the scheduler and the controllers");
        drop(running);
    }
}
