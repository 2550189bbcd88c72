//! The control plane's side of the node agent contract (`proto/node.proto`): registration with
//! podCIDR allocation, Lease heartbeats, the per-node Pod watch and Pod status reports.

use futures::{Stream, StreamExt};
use gitplane_api::object::{NODE_LEASE_NAMESPACE, revision_of, to_value};
use gitplane_proto::node::{
    EventType as WireEventType, HeartbeatRequest, HeartbeatResponse, PodEvent, RegisterRequest, RegisterResponse,
    UpdatePodStatusRequest, UpdatePodStatusResponse, WatchPodsRequest, node_service_server,
};
use gitplane_store::{Api, EventType, ListOptions, Op, Rejection, Store, StoreError, WatchOptions};
use k8s_openapi::api::{
    coordination::v1::{Lease, LeaseSpec},
    core::v1::{Node, NodeCondition, NodeSpec, Pod, PodStatus},
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use std::{net::Ipv4Addr, pin::Pin, sync::Arc};
use tonic::{Request, Response, Status};

/// The cluster's Pod range; each node gets a /24 of it.
pub const CLUSTER_CIDR: (Ipv4Addr, u8) = (Ipv4Addr::new(10, 244, 0, 0), 16);
const LEASE_DURATION_SECONDS: i32 = 40;
/// Compare-and-swap retries before giving up on a contended object.
const CAS_ATTEMPTS: usize = 10;

pub struct NodeService {
    store: Arc<dyn Store>,
}

impl NodeService {
    pub fn new(store: Arc<dyn Store>) -> Self {
        NodeService { store }
    }

    pub fn into_server(self) -> node_service_server::NodeServiceServer<Self> {
        node_service_server::NodeServiceServer::new(self)
    }
}

fn store_status(e: StoreError) -> Status {
    match &e {
        StoreError::Rejected(Rejection::NotFound { .. }) => Status::not_found(e.to_string()),
        StoreError::Rejected(Rejection::Conflict { .. } | Rejection::AlreadyExists { .. }) => {
            Status::aborted(e.to_string())
        }
        StoreError::Expired { .. } => Status::out_of_range(e.to_string()),
        StoreError::Rejected(_) | StoreError::BadRequest(_) => Status::invalid_argument(e.to_string()),
        _ => Status::unavailable(e.to_string()),
    }
}

fn decode<T: serde::de::DeserializeOwned>(what: &str, bytes: &[u8]) -> Result<T, Status> {
    serde_json::from_slice(bytes).map_err(|e| Status::invalid_argument(format!("{what} is not valid JSON: {e}")))
}

fn ready_condition(now: Timestamp) -> NodeCondition {
    NodeCondition {
        type_: "Ready".into(),
        status: "True".into(),
        reason: Some("AgentReady".into()),
        message: Some("node agent is posting ready status".into()),
        last_heartbeat_time: Some(Time(now)),
        last_transition_time: Some(Time(now)),
    }
}

fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The first /24 of the cluster range that no node holds.
pub fn allocate_pod_cidr(used: &[String]) -> Option<String> {
    let base = u32::from(CLUSTER_CIDR.0);
    let count = 1u32 << (24 - CLUSTER_CIDR.1);
    (0..count).map(|i| format!("{}/24", Ipv4Addr::from(base + (i << 8)))).find(|cidr| !used.contains(cidr))
}

fn pod_cidr(node: &Node) -> Option<String> {
    node.spec.as_ref()?.pod_cidr.clone()
}

impl NodeService {
    async fn register_node(&self, reported: Node) -> Result<String, StoreError> {
        let nodes = Api::<Node>::new(self.store.clone());
        let name = reported.metadata.name.clone().unwrap_or_default();
        let mut status = reported.status.clone().unwrap_or_default();
        status.conditions = Some(vec![ready_condition(Timestamp::now())]);
        for _ in 0..CAS_ATTEMPTS {
            let (mut node, create) = match nodes.get("", &name).await? {
                Some(node) => (node, false),
                None => {
                    let (all, _) = nodes.list(None).await?;
                    let used: Vec<String> = all.iter().filter_map(pod_cidr).collect();
                    let cidr = allocate_pod_cidr(&used)
                        .ok_or_else(|| StoreError::Unavailable("the cluster Pod range has no free /24 left".into()))?;
                    let spec =
                        NodeSpec { pod_cidr: Some(cidr.clone()), pod_cidrs: Some(vec![cidr]), ..Default::default() };
                    (Node { metadata: reported.metadata.clone(), spec: Some(spec), status: None }, true)
                }
            };
            node.metadata.labels = reported.metadata.labels.clone();
            let cidr = pod_cidr(&node).unwrap_or_default();
            let mut with_status = node.clone();
            with_status.metadata.resource_version = None; // ordered after the write above
            with_status.status = Some(status.clone());
            let first = if create { Op::Create(to_value(&node)) } else { Op::Update(to_value(&node)) };
            match self.store.txn(vec![first, Op::UpdateStatus(to_value(&with_status))]).await {
                Err(e) if e.is_conflict() || e.is_already_exists() => continue,
                other => return other.map(|_| cidr),
            }
        }
        Err(StoreError::Unavailable(format!("node {name} is being registered concurrently; retry")))
    }

    async fn renew_lease(&self, name: &str) -> Result<(), StoreError> {
        let leases = Api::<Lease>::new(self.store.clone());
        let now = MicroTime(Timestamp::now());
        for _ in 0..CAS_ATTEMPTS {
            let result = match leases.get(NODE_LEASE_NAMESPACE, name).await? {
                Some(mut lease) => {
                    lease.spec.get_or_insert_with(Default::default).renew_time = Some(now.clone());
                    leases.update(&lease).await
                }
                None => {
                    leases
                        .create(&Lease {
                            metadata: ObjectMeta {
                                name: Some(name.to_owned()),
                                namespace: Some(NODE_LEASE_NAMESPACE.into()),
                                ..Default::default()
                            },
                            spec: Some(LeaseSpec {
                                holder_identity: Some(name.to_owned()),
                                lease_duration_seconds: Some(LEASE_DURATION_SECONDS),
                                renew_time: Some(now.clone()),
                                ..Default::default()
                            }),
                        })
                        .await
                }
            };
            match result {
                Err(e) if e.is_conflict() || e.is_already_exists() => continue,
                other => {
                    other?;
                    break;
                }
            }
        }
        // A node that was marked Unknown is Ready again once it heartbeats.
        let nodes = Api::<Node>::new(self.store.clone());
        if let Some(mut node) = nodes.get("", name).await?
            && !is_ready(&node)
        {
            let status = node.status.get_or_insert_with(Default::default);
            let mut conditions = status.conditions.take().unwrap_or_default();
            conditions.retain(|c| c.type_ != "Ready");
            conditions.push(ready_condition(Timestamp::now()));
            status.conditions = Some(conditions);
            nodes.update_status(&node).await?;
        }
        Ok(())
    }
}

fn pod_event(kind: WireEventType, revision: i64, pod: &serde_json::Value) -> PodEvent {
    PodEvent { r#type: kind as i32, resource_version: revision, pod: serde_json::to_vec(pod).unwrap_or_default() }
}

fn bound_to(pod: &serde_json::Value, node: &str) -> bool {
    pod["spec"]["nodeName"].as_str() == Some(node)
}

type PodEventStream = Pin<Box<dyn Stream<Item = Result<PodEvent, Status>> + Send>>;

#[tonic::async_trait]
impl node_service_server::NodeService for NodeService {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<RegisterResponse>, Status> {
        let node: Node = decode("node", &request.get_ref().node)?;
        let name = node.metadata.name.clone().unwrap_or_default();
        if name.is_empty() {
            return Err(Status::invalid_argument("node has no metadata.name"));
        }
        let pod_cidr = self.register_node(node).await.map_err(store_status)?;
        self.renew_lease(&name).await.map_err(store_status)?;
        tracing::info!(node = %name, %pod_cidr, "node registered");
        Ok(Response::new(RegisterResponse { pod_cidr }))
    }

    async fn heartbeat(&self, request: Request<HeartbeatRequest>) -> Result<Response<HeartbeatResponse>, Status> {
        let name = &request.get_ref().node_name;
        if Api::<Node>::new(self.store.clone()).get("", name).await.map_err(store_status)?.is_none() {
            return Err(Status::not_found(format!("node {name} is not registered: register it first")));
        }
        self.renew_lease(name).await.map_err(store_status)?;
        Ok(Response::new(HeartbeatResponse {}))
    }

    type WatchPodsStream = PodEventStream;

    async fn watch_pods(&self, request: Request<WatchPodsRequest>) -> Result<Response<PodEventStream>, Status> {
        let WatchPodsRequest { node_name, resource_version } = request.into_inner();
        let mut initial = Vec::new();
        let from = if resource_version == 0 {
            let list = self.store.list("Pod", &ListOptions::default()).await.map_err(store_status)?;
            initial.extend(
                list.items
                    .iter()
                    .filter(|p| bound_to(p, &node_name))
                    .map(|p| Ok(pod_event(WireEventType::Added, list.revision, p))),
            );
            initial.push(Ok(PodEvent {
                r#type: WireEventType::Bookmark as i32,
                resource_version: list.revision,
                pod: Vec::new(),
            }));
            list.revision
        } else {
            resource_version
        };
        let options = WatchOptions { kinds: Some(vec!["Pod".into()]), bookmarks: true };
        let events = self.store.watch(from, options).await.map_err(store_status)?;
        let node = node_name.clone();
        let changes = events.filter_map(move |event| {
            let result = match event {
                Err(e) => Some(Err(store_status(e))),
                // Bookmarks let an agent resume from a recent revision after a reconnect.
                Ok(e) if e.event_type == EventType::Bookmark => Some(Ok(PodEvent {
                    r#type: WireEventType::Bookmark as i32,
                    resource_version: e.revision,
                    pod: Vec::new(),
                })),
                Ok(e) if bound_to(&e.object, &node) => {
                    let kind = match e.event_type {
                        EventType::Added => WireEventType::Added,
                        EventType::Modified => WireEventType::Modified,
                        _ => WireEventType::Deleted,
                    };
                    Some(Ok(pod_event(kind, e.revision, &e.object)))
                }
                Ok(_) => None,
            };
            std::future::ready(result)
        });
        tracing::info!(node = %node_name, from, "pod watch started");
        Ok(Response::new(Box::pin(futures::stream::iter(initial).chain(changes))))
    }

    async fn update_pod_status(
        &self,
        request: Request<UpdatePodStatusRequest>,
    ) -> Result<Response<UpdatePodStatusResponse>, Status> {
        let req = request.into_inner();
        let status: PodStatus = decode("pod status", &req.status)?;
        let pods = Api::<Pod>::new(self.store.clone());
        for _ in 0..CAS_ATTEMPTS {
            let Some(mut pod) = pods.get(&req.namespace, &req.name).await.map_err(store_status)? else {
                return Err(Status::not_found(format!("pod {}/{} no longer exists", req.namespace, req.name)));
            };
            if pod.metadata.uid.as_deref() != Some(req.uid.as_str()) {
                return Err(Status::not_found(format!(
                    "pod {}/{} was replaced (uid changed)",
                    req.namespace, req.name
                )));
            }
            pod.status = Some(merge_status(pod.status.take(), status.clone()));
            let revision = revision_of(&pod);
            match pods.update_status(&pod).await {
                Err(e) if e.is_conflict() => continue,
                Err(e) => return Err(store_status(e)),
                Ok(_) => {
                    tracing::debug!(pod = %req.name, ?revision, "pod status updated");
                    return Ok(Response::new(UpdatePodStatusResponse {}));
                }
            }
        }
        Err(Status::aborted("pod status is contended; retry"))
    }
}

/// The agent's status, keeping the scheduler's PodScheduled condition when the agent has none.
fn merge_status(current: Option<PodStatus>, mut reported: PodStatus) -> PodStatus {
    let scheduled = current.and_then(|s| s.conditions).into_iter().flatten().find(|c| c.type_ == "PodScheduled");
    if let Some(scheduled) = scheduled {
        let conditions = reported.conditions.get_or_insert_with(Vec::new);
        if !conditions.iter().any(|c| c.type_ == "PodScheduled") {
            conditions.insert(0, scheduled);
        }
    }
    reported
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_cidrs_are_the_first_free_24() {
        assert_eq!(allocate_pod_cidr(&[]).as_deref(), Some("10.244.0.0/24"));
        let used = vec!["10.244.0.0/24".to_owned(), "10.244.2.0/24".to_owned()];
        assert_eq!(allocate_pod_cidr(&used).as_deref(), Some("10.244.1.0/24"));
        let all: Vec<String> = (0..256).map(|i| format!("10.244.{i}.0/24")).collect();
        assert_eq!(allocate_pod_cidr(&all), None);
    }
}
