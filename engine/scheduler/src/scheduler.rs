//! The scheduling loop: pending Pods from the informer cache, snapshots of the nodes, bindings
//! written with compare-and-swap.

use crate::framework::{NodeInfo, Profile};
use gitplane_api::object::{kind_of, to_value};
use gitplane_store::{
    Op, Store,
    informer::{Informer, Notification},
};
use k8s_openapi::api::core::v1::{Node, Pod, PodCondition};
use std::{
    collections::{BTreeSet, HashMap},
    sync::Arc,
    time::Duration,
};
use tokio::sync::broadcast::error::RecvError;

type PodId = (String, String);

/// Retry for Pods that fit nowhere, besides every node change and pod deletion.
const UNSCHEDULABLE_RETRY: Duration = Duration::from_secs(10);

pub struct Scheduler {
    store: Arc<dyn Store>,
    informer: Informer,
    profile: Profile,
    /// Pods waiting for a node.
    pending: BTreeSet<PodId>,
    /// Pods that fit nowhere at the last attempt.
    unschedulable: BTreeSet<PodId>,
    /// Bindings written but not yet seen in the cache: counted on their node meanwhile.
    assumed: HashMap<PodId, (String, Pod)>,
}

fn id(pod: &Pod) -> PodId {
    (pod.metadata.namespace.clone().unwrap_or_default(), pod.metadata.name.clone().unwrap_or_default())
}

fn is_unbound(pod: &Pod) -> bool {
    pod.spec.as_ref().is_some_and(|s| s.node_name.as_deref().unwrap_or("").is_empty())
}

impl Scheduler {
    /// The informer must watch `Pod` and `Node`.
    pub fn new(store: Arc<dyn Store>, informer: Informer, profile: Profile) -> Self {
        Scheduler {
            store,
            informer,
            profile,
            pending: BTreeSet::new(),
            unschedulable: BTreeSet::new(),
            assumed: HashMap::new(),
        }
    }

    pub async fn run(mut self) {
        let mut notifications = self.informer.subscribe();
        self.informer.wait_synced().await;
        self.requeue_all();
        let mut retry = tokio::time::interval(UNSCHEDULABLE_RETRY);
        loop {
            self.schedule_pending().await;
            tokio::select! {
                n = notifications.recv() => match n {
                    Ok(n) => self.observe(n),
                    Err(RecvError::Lagged(_)) => self.requeue_all(),
                    Err(RecvError::Closed) => return,
                },
                _ = retry.tick() => self.pending.append(&mut self.unschedulable),
            }
            while let Ok(n) = notifications.try_recv() {
                self.observe(n);
            }
        }
    }

    fn requeue_all(&mut self) {
        let cache = self.informer.cache();
        self.pending = cache.list_typed::<Pod>(None).iter().filter(|p| is_unbound(p)).map(id).collect();
        self.unschedulable.clear();
    }

    fn observe(&mut self, notification: Notification) {
        let event = match notification {
            Notification::Resync => return self.requeue_all(),
            Notification::Changed(event) => event,
        };
        if event.key.kind == kind_of::<Node>() {
            self.pending.append(&mut self.unschedulable);
            return;
        }
        if event.key.kind != kind_of::<Pod>() {
            return;
        }
        let pod_id = (event.key.namespace.clone(), event.key.name.clone());
        let pod = <Pod as k8s_openapi::serde::Deserialize>::deserialize(&*event.object).ok();
        match (event.event_type, pod) {
            (gitplane_store::EventType::Deleted, _) => {
                self.pending.remove(&pod_id);
                self.unschedulable.remove(&pod_id);
                self.assumed.remove(&pod_id);
                // Freed capacity may fit a waiting pod.
                self.pending.append(&mut self.unschedulable);
            }
            (_, Some(pod)) if is_unbound(&pod) => {
                if !self.unschedulable.contains(&pod_id) {
                    self.pending.insert(pod_id);
                }
            }
            (_, Some(_)) => {
                self.assumed.remove(&pod_id);
                self.pending.remove(&pod_id);
            }
            (_, None) => {}
        }
    }

    fn snapshot(&self) -> Vec<NodeInfo> {
        let cache = self.informer.cache();
        let mut nodes: HashMap<String, NodeInfo> = cache
            .list_typed::<Node>(None)
            .into_iter()
            .map(|n| (n.metadata.name.clone().unwrap_or_default(), NodeInfo::new(n)))
            .collect();
        // Only Pods bound to a known node count: the others are not decoded at all.
        let on_a_node = |p: &serde_json::Value| p["spec"]["nodeName"].as_str().is_some_and(|n| nodes.contains_key(n));
        for pod in cache.list_typed_where::<Pod>(None, on_a_node) {
            if self.assumed.contains_key(&id(&pod)) {
                continue;
            }
            if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_ref()).and_then(|n| nodes.get_mut(n)) {
                node.add_pod(&pod);
            }
        }
        for (node, pod) in self.assumed.values() {
            if let Some(node) = nodes.get_mut(node) {
                node.add_pod(pod);
            }
        }
        let mut nodes: Vec<_> = nodes.into_values().collect();
        nodes.sort_by(|a, b| a.name().cmp(b.name()));
        nodes
    }

    async fn schedule_pending(&mut self) {
        // One snapshot per batch, kept current with the Pods this batch binds: a batch of
        // thousands of Pods must not rebuild it per Pod.
        let mut nodes: Option<Vec<NodeInfo>> = None;
        while let Some(pod_id) = self.pending.pop_first() {
            if self.assumed.contains_key(&pod_id) {
                continue;
            }
            let Some(pod) = self.informer.cache().get_typed::<Pod>(&pod_id.0, &pod_id.1) else { continue };
            if !is_unbound(&pod) {
                continue;
            }
            let started = std::time::Instant::now();
            let snapshot = nodes.get_or_insert_with(|| self.snapshot());
            match self.profile.schedule(&pod, snapshot) {
                Ok(node) => match self.bind(&pod, &node).await {
                    Ok(()) => {
                        tracing::info!(pod = %format!("{}/{}", pod_id.0, pod_id.1), %node, elapsed = ?started.elapsed(), "bound");
                        if let Some(info) = nodes.iter_mut().flatten().find(|n| n.name() == node) {
                            info.add_pod(&pod);
                        }
                        self.assumed.insert(pod_id, (node, pod));
                    }
                    Err(e) => {
                        // A conflict means our cache is behind: the next event requeues the pod.
                        tracing::debug!(error = %e, pod = %pod_id.1, "binding failed");
                    }
                },
                Err(reason) => {
                    tracing::info!(pod = %format!("{}/{}", pod_id.0, pod_id.1), %reason, "unschedulable");
                    if let Err(e) = self.mark_unschedulable(&pod, &reason.to_string()).await {
                        tracing::debug!(error = %e, pod = %pod_id.1, "recording unschedulable failed");
                    }
                    self.unschedulable.insert(pod_id);
                }
            }
        }
    }

    /// Writes `spec.nodeName` (compare-and-swap on the Pod's resourceVersion) and the
    /// PodScheduled condition in one transaction.
    async fn bind(&self, pod: &Pod, node: &str) -> gitplane_store::Result<()> {
        let mut bound = pod.clone();
        if let Some(spec) = bound.spec.as_mut() {
            spec.node_name = Some(node.to_owned());
        }
        let mut status = bound.clone();
        status.metadata.resource_version = None; // ordered after the CAS above, in the same transaction
        set_scheduled_condition(&mut status, "True", None, None);
        self.store.txn(vec![Op::Update(to_value(&bound)), Op::UpdateStatus(to_value(&status))]).await?;
        Ok(())
    }

    async fn mark_unschedulable(&self, pod: &Pod, message: &str) -> gitplane_store::Result<()> {
        let mut status = pod.clone();
        if !set_scheduled_condition(&mut status, "False", Some("Unschedulable"), Some(message)) {
            return Ok(());
        }
        self.store.txn(vec![Op::UpdateStatus(to_value(&status))]).await?;
        Ok(())
    }
}

/// Sets the PodScheduled condition; `false` when it already said exactly this.
fn set_scheduled_condition(pod: &mut Pod, status: &str, reason: Option<&str>, message: Option<&str>) -> bool {
    let pod_status = pod.status.get_or_insert_with(Default::default);
    if pod_status.phase.is_none() {
        pod_status.phase = Some("Pending".into());
    }
    let conditions = pod_status.conditions.get_or_insert_with(Vec::new);
    let wanted = PodCondition {
        type_: "PodScheduled".into(),
        status: status.into(),
        reason: reason.map(str::to_owned),
        message: message.map(str::to_owned),
        last_transition_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now(),
        )),
        ..Default::default()
    };
    match conditions.iter_mut().find(|c| c.type_ == "PodScheduled") {
        Some(c) if c.status == wanted.status && c.reason == wanted.reason && c.message == wanted.message => false,
        Some(c) => {
            *c = wanted;
            true
        }
        None => {
            conditions.push(wanted);
            true
        }
    }
}
