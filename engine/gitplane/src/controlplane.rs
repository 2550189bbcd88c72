//! What only the leader runs: the source, the scheduler and the controllers. A replica starts
//! them when it becomes the acting leader and stops them the moment it is not.

use anyhow::{Context as _, bail};
use gitplane_api::network::PodRanges;
use gitplane_controllers::{
    kubernetes_service::ApiEndpoints, loadbalancer::AddressPool, taint_eviction::DefaultTolerations,
};
use gitplane_gitops::{
    bootstrap,
    mirror::Mirrors,
    source::{SourceController, allocate::ServiceRanges, apply::RecordKey, planned::Plans},
};
use gitplane_store::{Store, informer::SharedInformerFactory};
use std::{path::PathBuf, sync::Arc, time::Duration};
use tokio::{sync::watch, task::JoinHandle};

/// The kinds of the replica's one informer: the controllers' and the scheduler's, and the
/// source's, which the push verdicts read too.
pub fn watched_kinds() -> Vec<String> {
    let mut kinds = gitplane_controllers::watched_kinds();
    for kind in gitplane_gitops::source::watched_kinds() {
        if !kinds.contains(&kind) {
            kinds.push(kind);
        }
    }
    kinds
}

/// The controllers' flags, the same on `gitplane up` and `gitplane server`.
#[derive(clap::Args, Clone, Debug)]
pub struct ControllerArgs {
    /// Where LoadBalancer Services get their addresses, e.g. 192.0.2.0/28 (the network and
    /// broadcast addresses are left out). None: they stay <pending>.
    #[arg(long, value_parser = AddressPool::parse)]
    load_balancer_pool: Option<AddressPool>,
    /// How long a Pod that does not tolerate the node.kubernetes.io/not-ready:NoExecute taint
    /// itself stays on a node that is not ready (its runtime is down) before it is evicted
    /// (kube-apiserver's flag of this name).
    #[arg(long, default_value_t = 300)]
    default_not_ready_toleration_seconds: u64,
    /// The same for node.kubernetes.io/unreachable (the node's agent stopped renewing its Lease).
    #[arg(long, default_value_t = 300)]
    default_unreachable_toleration_seconds: u64,
    /// How long a node may go without renewing its Lease (every 10 s) before it is Ready=Unknown
    /// and tainted unreachable (kube-controller-manager's flag of this name).
    #[arg(long, default_value = "40s", value_parser = crate::events::parse_ttl)]
    node_monitor_grace_period: Duration,
    /// The scheduler's score weights and share of nodes looked at: a YAML file modelled on
    /// kube-scheduler's KubeSchedulerConfiguration, `percentageOfNodesToScore` and
    /// `profiles[0].plugins.score.enabled[{name, weight}]` (unlisted plugins keep
    /// kube-scheduler's default weights).
    #[arg(long, value_name = "FILE")]
    scheduler_config: Option<PathBuf>,
    /// The cluster's Pod range: each node's podCIDR is a range of it, taken at its first
    /// registration and kept (kube-controller-manager's flag of this name).
    #[arg(long, default_value = "10.244.0.0/16")]
    cluster_cidr: String,
    /// The prefix length of each node's podCIDR: the cluster range holds 2^(mask - prefix) nodes,
    /// at most 65,536 (kube-controller-manager's flag of this name).
    #[arg(long, default_value_t = gitplane_api::network::NODE_CIDR_MASK_SIZE)]
    node_cidr_mask_size: u8,
}

impl ControllerArgs {
    /// The cluster Pod range, checked, and apart from the Service range `services`.
    pub fn pod_ranges(&self, services: &ServiceRanges) -> anyhow::Result<PodRanges> {
        let pods = PodRanges::new(&self.cluster_cidr, self.node_cidr_mask_size).map_err(anyhow::Error::msg)?;
        let service_cidr = format!("{}/{}", services.network, services.prefix);
        if pods.contains(services.network) || services.contains(pods.network) {
            bail!("--cluster-cidr {pods} overlaps the Service range {service_cidr}: give them ranges apart");
        }
        Ok(pods)
    }

    /// The settings, with the scheduler configuration file read and checked.
    pub fn settings(&self) -> anyhow::Result<LoopSettings> {
        let scheduler = match &self.scheduler_config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading the scheduler configuration {}", path.display()))?;
                gitplane_scheduler::config::from_yaml(&path.display().to_string(), &text).map_err(anyhow::Error::msg)?
            }
            None => Default::default(),
        };
        let controllers = gitplane_controllers::Settings {
            // The replica wires the nodes' kubelets in.
            pod_metrics: None,
            load_balancer_pool: self.load_balancer_pool,
            node_monitor_grace_period: self.node_monitor_grace_period,
            default_tolerations: DefaultTolerations {
                not_ready: Duration::from_secs(self.default_not_ready_toleration_seconds),
                unreachable: Duration::from_secs(self.default_unreachable_toleration_seconds),
            },
            ..Default::default()
        };
        Ok(LoopSettings { controllers, scheduler })
    }
}

/// What the controllers and the scheduler run with: the controllers' settings and the
/// scheduler's configuration.
#[derive(Clone)]
pub struct LoopSettings {
    pub controllers: gitplane_controllers::Settings,
    pub scheduler: gitplane_scheduler::config::SchedulerConfig,
}

/// Where the `kubernetes` Service points: the first of `candidates` (the listener's address,
/// the address nodes reach the control plane on) that a Pod can reach, i.e. IPv4 and neither
/// loopback nor unspecified (a Pod's loopback is its own); none: the Service has no endpoints.
/// Several replicas each list their own; the first address is enough, as any replica serves the
/// same reads.
pub fn api_endpoints(ranges: &ServiceRanges, candidates: &[std::net::SocketAddr]) -> ApiEndpoints {
    let addresses = candidates
        .iter()
        .filter_map(|a| match a {
            std::net::SocketAddr::V4(v4) if !v4.ip().is_loopback() && !v4.ip().is_unspecified() => Some(*v4),
            _ => None,
        })
        .take(1)
        .collect();
    ApiEndpoints { cluster_ip: Some(ranges.kubernetes()), addresses }
}

/// The names Pods verify the API server's certificate for: the `kubernetes` Service's.
pub fn kubernetes_service_names(ranges: &ServiceRanges) -> Vec<String> {
    let mut names: Vec<String> =
        ["kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"]
            .map(String::from)
            .into();
    names.push(ranges.kubernetes().to_string());
    names
}

/// What the leader-only loops are configured with.
#[derive(Clone)]
pub struct Settings {
    pub repos_dir: PathBuf,
    pub mirrors: Mirrors,
    /// The hosted repository of the root Application, made if absent.
    pub root: Option<String>,
    pub record_key: RecordKey,
    pub service_ranges: ServiceRanges,
    pub controllers: LoopSettings,
    /// How long an Event lives after its last occurrence (`--event-ttl`).
    pub event_ttl: Duration,
    /// The replica's informer, shared with its push verdicts.
    pub informers: Arc<SharedInformerFactory>,
    /// The replica's push verdicts' plans, which the source's syncs commit.
    pub plans: Arc<Plans>,
}

/// The running leader-only loops; dropping it stops them.
pub struct ControlPlane {
    tasks: Vec<JoinHandle<()>>,
}

impl ControlPlane {
    pub async fn start(store: Arc<dyn Store>, settings: Settings) -> ControlPlane {
        let Settings { repos_dir, mirrors, root, record_key, service_ranges, controllers, event_ttl, informers, plans } =
            settings;
        if let Err(e) = bootstrap::namespaces(&store).await {
            tracing::warn!(error = %e, "creating the system namespaces failed");
        }
        if let Err(e) = bootstrap::storage_class(&store).await {
            tracing::warn!(error = %e, "creating the default StorageClass failed");
        }
        if let Some(repo) = root
            && let Err(e) = bootstrap::root_application(&store, &repo).await
        {
            tracing::warn!(error = %e, "creating the root Application failed");
        }
        // Running already when this replica judged a push: the loops start from a cache at the
        // store's head, as they would from a fresh list, not behind the last leader's writes.
        let informer = informers.informer();
        if let Ok(head) = store.revision().await {
            informer.wait_for(head).await;
        }
        let mut tasks = gitplane_controllers::spawn_all(store.clone(), informer.clone(), &controllers.controllers);
        let profile = controllers.scheduler.profile().unwrap_or_default();
        tasks.push(tokio::spawn(gitplane_scheduler::Scheduler::new(store.clone(), informer.clone(), profile).run()));
        let store_for_events = store.clone();
        let source = SourceController::new(store, repos_dir, mirrors, record_key)
            .with_service_ranges(service_ranges)
            .with_plans(plans);
        tasks.push(tokio::spawn(source.run(informer)));
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

#[cfg(test)]
mod tests {
    use super::*;
    use gitplane_storage::sqlite::SqliteStore;

    #[test]
    fn the_informer_caches_every_kind_each_loop_reads_once() {
        let kinds = watched_kinds();
        for kind in gitplane_controllers::watched_kinds().into_iter().chain(gitplane_gitops::source::watched_kinds()) {
            assert!(kinds.contains(&kind), "{kind} is not cached");
        }
        let mut each = kinds.clone();
        each.sort();
        each.dedup();
        assert_eq!(each.len(), kinds.len(), "{kinds:?}");
    }

    #[tokio::test]
    async fn the_loops_share_one_informer_that_stops_with_its_last_user() {
        let store: Arc<dyn Store> = Arc::new(SqliteStore::memory().await.unwrap());
        let informers = SharedInformerFactory::new(store, watched_kinds());
        let (leader, verdicts) = (informers.informer(), informers.informer());
        assert!(Arc::ptr_eq(leader.cache(), verdicts.cache()), "one cache");
        verdicts.wait_synced().await;
        let cache = Arc::downgrade(leader.cache());
        drop(leader);
        let again = informers.informer();
        assert!(Arc::ptr_eq(again.cache(), verdicts.cache()), "still the verdicts' one");
        drop(again);
        drop(verdicts);
        // The aborted list + watch task lets go of the cache when the runtime drops it.
        tokio::time::timeout(Duration::from_secs(5), async {
            while cache.upgrade().is_some() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the cache is freed with the informer's last user");
        tokio::time::timeout(Duration::from_secs(5), informers.informer().wait_synced())
            .await
            .expect("the next user gets a new informer");
    }
}
