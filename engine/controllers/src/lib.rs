//! The controller manager: level-triggered reconcilers over the informer cache.
//!
//! Each controller is a [`Reconciler`] (`reconcile(key, ctx) -> Action`) run by
//! [`runtime::Controller`]: a `gitplane_workqueue::WorkQueue` fed by the informer (one entry per
//! key, the earliest requeue wins, per-key error backoff, a [`ReconcileReason`] per request), one
//! tracing span per reconcile. The workload controllers decide in a pure `plan` (their object and
//! its dependents in, [`plan::Op`]s out) and the runtime commits the plan: one transaction,
//! compare-and-swap on every object read. After a write a controller waits for the cache to reach
//! its commit, so the next reconcile never acts on a state older than its own writes.

pub mod admission;
pub mod bootstrap_roles;
pub mod cronjob;
pub mod daemonset;
pub mod deployment;
pub mod disruption;
pub mod endpoints;
pub mod garbage_collector;
pub mod horizontal;
pub mod ingress;
pub mod job;
pub mod kubernetes_service;
pub mod loadbalancer;
pub mod names;
pub mod node_ipam;
pub mod node_lifecycle;
pub mod owner;
pub mod persistent_volume;
pub mod plan;
pub mod replicaset;
pub mod replication;
pub mod resource_quota;
pub mod runtime;
pub mod serviceaccounts;
pub mod statefulset;
pub mod taint_eviction;

pub use runtime::{Action, Context, Controller, ReconcileError, ReconcileReason, Reconciler};

use gitplane_store::{Store, informer::Informer};
use k8s_openapi::api::{apps::v1::ReplicaSet, core::v1::ReplicationController};
use std::sync::Arc;

/// The group kinds the controllers need in the informer cache.
pub fn watched_kinds() -> Vec<String> {
    use gitplane_api::object::kind_of;
    use k8s_openapi::api::{
        apps::v1::{ControllerRevision, DaemonSet, Deployment, StatefulSet},
        autoscaling::v2::HorizontalPodAutoscaler,
        batch::v1::{CronJob, Job},
        coordination::v1::Lease,
        core::v1::{Endpoints, Node, PersistentVolume, PersistentVolumeClaim, Pod, Service},
        discovery::v1::EndpointSlice,
        networking::v1::{Ingress, IngressClass},
        policy::v1::PodDisruptionBudget,
        storage::v1::StorageClass,
    };
    // Namespaces, ServiceAccounts and ConfigMaps are accepted from Git: the source watches them.
    let mut kinds = vec![
        kind_of::<Deployment>(),
        kind_of::<ReplicaSet>(),
        kind_of::<StatefulSet>(),
        kind_of::<ControllerRevision>(),
        kind_of::<PersistentVolumeClaim>(),
        kind_of::<DaemonSet>(),
        kind_of::<ReplicationController>(),
        kind_of::<PodDisruptionBudget>(),
        kind_of::<Job>(),
        kind_of::<CronJob>(),
        kind_of::<HorizontalPodAutoscaler>(),
        kind_of::<Pod>(),
        kind_of::<Node>(),
        kind_of::<Lease>(),
        kind_of::<Service>(),
        kind_of::<EndpointSlice>(),
        kind_of::<Endpoints>(),
        kind_of::<Ingress>(),
        kind_of::<IngressClass>(),
        kind_of::<PersistentVolume>(),
        kind_of::<StorageClass>(),
    ];
    kinds.extend(admission::watched_kinds());
    kinds
}

/// What the controllers read from the informer cache without reacting to its changes: the
/// nodes' Leases, renewed every 10 s each and read on the node lifecycle controller's own clock.
pub fn unannounced() -> gitplane_store::informer::Unannounced {
    use k8s_openapi::api::coordination::v1::Lease;
    let kind = gitplane_api::object::kind_of::<Lease>();
    gitplane_store::informer::Unannounced::of(kind, gitplane_api::object::NODE_LEASE_NAMESPACE)
}

/// What the controllers are configured with.
#[derive(Clone)]
pub struct Settings {
    /// Where the HorizontalPodAutoscaler controller reads Pod usage; none: it does not run.
    pub pod_metrics: Option<Arc<dyn horizontal::PodMetrics>>,
    /// Where LoadBalancer Services get their addresses; none: they stay `<pending>`.
    pub load_balancer_pool: Option<loadbalancer::AddressPool>,
    /// How long Pods that say nothing stay on a node that is not ready or unreachable.
    pub default_tolerations: taint_eviction::DefaultTolerations,
    /// How long a node may go without renewing its Lease before it is Ready=Unknown.
    pub node_monitor_grace_period: std::time::Duration,
    /// The cluster CA (PEM) every namespace's `kube-root-ca.crt` holds.
    pub root_ca: Option<String>,
    /// Where the `kubernetes` Service points.
    pub api_endpoints: kubernetes_service::ApiEndpoints,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            pod_metrics: None,
            load_balancer_pool: None,
            default_tolerations: Default::default(),
            node_monitor_grace_period: node_lifecycle::NodeLifecycleController::default().grace_period,
            root_ca: None,
            api_endpoints: Default::default(),
        }
    }
}

/// Starts every controller; the handles end them on drop of the runtime or abort.
pub fn spawn_all(store: Arc<dyn Store>, informer: Informer, settings: &Settings) -> Vec<tokio::task::JoinHandle<()>> {
    let ctx = Context::new(store, informer);
    let mut tasks = vec![
        tokio::spawn(Controller::new(deployment::DeploymentController, ctx.clone()).run()),
        tokio::spawn(Controller::new(replicaset::ReplicaSetController::<ReplicaSet>::default(), ctx.clone()).run()),
        tokio::spawn(
            Controller::new(replicaset::ReplicaSetController::<ReplicationController>::default(), ctx.clone()).run(),
        ),
        tokio::spawn(Controller::new(disruption::DisruptionController, ctx.clone()).run()),
        tokio::spawn(Controller::new(daemonset::DaemonSetController::default(), ctx.clone()).run()),
        tokio::spawn(Controller::new(statefulset::StatefulSetController, ctx.clone()).run()),
        tokio::spawn(Controller::new(job::JobController, ctx.clone()).run()),
        tokio::spawn(Controller::new(cronjob::CronJobController, ctx.clone()).run()),
        tokio::spawn(Controller::new(garbage_collector::GarbageCollector, ctx.clone()).run()),
        tokio::spawn(Controller::new(endpoints::EndpointsController::default(), ctx.clone()).run()),
        tokio::spawn(
            Controller::new(
                node_lifecycle::NodeLifecycleController { grace_period: settings.node_monitor_grace_period },
                ctx.clone(),
            )
            .run(),
        ),
        tokio::spawn(Controller::new(node_ipam::NodeIpamController, ctx.clone()).run()),
        tokio::spawn(
            Controller::new(
                taint_eviction::TaintEvictionController { defaults: settings.default_tolerations },
                ctx.clone(),
            )
            .run(),
        ),
        tokio::spawn(Controller::new(ingress::IngressController::default(), ctx.clone()).run()),
        tokio::spawn(Controller::new(bootstrap_roles::BootstrapRolesController, ctx.clone()).run()),
        tokio::spawn(
            Controller::new(
                serviceaccounts::ServiceAccountsController { root_ca: settings.root_ca.clone() },
                ctx.clone(),
            )
            .run(),
        ),
        tokio::spawn(
            Controller::new(
                kubernetes_service::KubernetesServiceController { endpoints: settings.api_endpoints.clone() },
                ctx.clone(),
            )
            .run(),
        ),
        tokio::spawn(Controller::new(persistent_volume::PersistentVolumeController, ctx.clone()).run()),
        tokio::spawn(Controller::new(resource_quota::ResourceQuotaController, ctx.clone()).run()),
    ];
    if let Some(metrics) = &settings.pod_metrics {
        let controller = horizontal::HorizontalController::new(metrics.clone());
        tasks.push(tokio::spawn(Controller::new(controller, ctx.clone()).run()));
    }
    if let Some(pool) = settings.load_balancer_pool {
        tasks.push(tokio::spawn(Controller::new(loadbalancer::LoadBalancerController::new(pool), ctx).run()));
    }
    tasks
}
