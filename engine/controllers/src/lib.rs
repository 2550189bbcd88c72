//! The controller manager: level-triggered reconcilers over the informer cache.
//!
//! Each controller is a [`Reconciler`] (`reconcile(key, ctx) -> Action`) run by
//! [`runtime::Controller`]: a `gitplane_workqueue::WorkQueue` fed by the informer (one entry per
//! key, the earliest requeue wins, per-key error backoff, a [`ReconcileReason`] per request), one
//! tracing span per reconcile. The workload controllers decide in a pure `plan` (their object and
//! its dependents in, [`plan::Op`]s out) and the runtime commits the plan: one transaction,
//! compare-and-swap on every object read. After a write a controller waits for the cache to reach
//! its commit, so the next reconcile never acts on a state older than its own writes.

pub mod deployment;
pub mod garbage_collector;
pub mod job;
pub mod names;
pub mod node_lifecycle;
pub mod owner;
pub mod plan;
pub mod replicaset;
pub mod runtime;

pub use runtime::{Action, Context, Controller, ReconcileError, ReconcileReason, Reconciler};

use gitplane_store::{Store, informer::Informer};
use std::sync::Arc;

/// The group kinds the controllers need in the informer cache.
pub fn watched_kinds() -> Vec<String> {
    use gitplane_api::object::kind_of;
    use k8s_openapi::api::{
        apps::v1::{Deployment, ReplicaSet},
        batch::v1::Job,
        coordination::v1::Lease,
        core::v1::{Node, Pod},
    };
    vec![
        kind_of::<Deployment>(),
        kind_of::<ReplicaSet>(),
        kind_of::<Job>(),
        kind_of::<Pod>(),
        kind_of::<Node>(),
        kind_of::<Lease>(),
    ]
}

/// Starts every controller; the handles end them on drop of the runtime or abort.
pub fn spawn_all(store: Arc<dyn Store>, informer: Informer) -> Vec<tokio::task::JoinHandle<()>> {
    let ctx = Context::new(store, informer);
    vec![
        tokio::spawn(Controller::new(deployment::DeploymentController, ctx.clone()).run()),
        tokio::spawn(Controller::new(replicaset::ReplicaSetController, ctx.clone()).run()),
        tokio::spawn(Controller::new(job::JobController, ctx.clone()).run()),
        tokio::spawn(Controller::new(garbage_collector::GarbageCollector, ctx.clone()).run()),
        tokio::spawn(Controller::new(node_lifecycle::NodeLifecycleController::default(), ctx).run()),
    ]
}
