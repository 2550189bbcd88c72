//! What only the leader runs: the source, the scheduler and the controllers. A replica starts
//! them when it becomes the acting leader and stops them the moment it is not.

use crate::{
    bootstrap,
    mirror::Mirrors,
    source::{SourceController, allocate::ServiceRanges, apply::RecordKey},
};
use gitplane_store::{Store, informer::Informer};
use std::{path::PathBuf, sync::Arc, time::Duration};
use tokio::{sync::watch, task::JoinHandle};

/// What the leader-only loops are configured with.
#[derive(Clone)]
pub struct Settings {
    pub repos_dir: PathBuf,
    pub mirrors: Mirrors,
    /// The hosted repository of the root Application, made if absent.
    pub root: Option<String>,
    pub record_key: RecordKey,
    pub service_ranges: ServiceRanges,
    pub controllers: gitplane_controllers::Settings,
    /// How long an Event lives after its last occurrence (`--event-ttl`).
    pub event_ttl: Duration,
}

/// The running leader-only loops; dropping it stops them.
pub struct ControlPlane {
    tasks: Vec<JoinHandle<()>>,
}

impl ControlPlane {
    pub async fn start(store: Arc<dyn Store>, settings: Settings) -> ControlPlane {
        let Settings { repos_dir, mirrors, root, record_key, service_ranges, controllers, event_ttl } = settings;
        if let Err(e) = bootstrap::namespaces(&store).await {
            tracing::warn!(error = %e, "creating the system namespaces failed");
        }
        if let Some(repo) = root
            && let Err(e) = bootstrap::root_application(&store, &repo).await
        {
            tracing::warn!(error = %e, "creating the root Application failed");
        }
        let informer = Informer::spawn(store.clone(), gitplane_controllers::watched_kinds());
        let mut tasks = gitplane_controllers::spawn_all(store.clone(), informer.clone(), &controllers);
        tasks.push(tokio::spawn(gitplane_scheduler::Scheduler::new(store.clone(), informer, Default::default()).run()));
        let store_for_events = store.clone();
        let source = SourceController::new(store, repos_dir, mirrors, record_key).with_service_ranges(service_ranges);
        tasks.push(tokio::spawn(source.run()));
        tasks.push(tokio::spawn(gitplane_store::events::run_garbage_collector(store_for_events, event_ttl)));
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
pub async fn run_while_leading(mut leading: watch::Receiver<bool>, store: Arc<dyn Store>, settings: Settings) {
    loop {
        if leading.wait_for(|l| *l).await.is_err() {
            return;
        }
        tracing::info!("acting leader: starting the source, the scheduler and the controllers");
        let running = ControlPlane::start(store.clone(), settings.clone()).await;
        if leading.wait_for(|l| !*l).await.is_err() {
            return;
        }
        tracing::warn!("no longer the leader: stopping the source, the scheduler and the controllers");
        drop(running);
    }
}
