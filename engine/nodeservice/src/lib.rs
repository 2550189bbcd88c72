//! The node service: the control plane's side of the node agent contract (`proto/node.proto`): registration with
//! podCIDR allocation, Lease heartbeats, the per-node Pod watch and Pod status reports.
//!
//! Every call is authenticated before its body is read ([`identity`]), and a node acts only on
//! what is its own, as Kubernetes' NodeRestriction admits: its Node and Lease, the Pods bound to
//! it, and their status, with Pod addresses inside its podCIDR; and, as Kubernetes' node
//! authorizer, only the ConfigMaps and Secrets those Pods reference ([`podconfig`]). [`tls`] is
//! the cluster CA that signs the nodes' and the replicas' certificates.

pub mod addresses;
mod events;
mod heartbeats;
mod identity;
mod ingress_secrets;
mod nodestatus;
pub mod podcidr;
mod podconfig;
mod pull_secrets;
mod references;
pub mod tls;
mod token_volume;
pub mod tokens;
mod watch_cache;

pub use identity::NodeIdentity;
use identity::{CERTIFICATES_ANNOTATION, Caller, caller, node_of};
use ingress_secrets::TlsReferences;

use crate::tls::ClusterCa;
use futures::{Stream, StreamExt};
use gitplane_api::object::{NODE_LEASE_NAMESPACE, revision_of, to_value};
use gitplane_api::volumes::LOCAL_PATH_DIR;
use gitplane_apiserver::{
    kubelet_client::kubelet_address,
    listener::{ClientAddr, Transport},
};
use gitplane_proto::node::{
    CreateEventsRequest, CreateEventsResponse, DeletePodRequest, DeletePodResponse, EventType as WireEventType,
    HeartbeatRequest, HeartbeatResponse, ObjectEvent, PodEvent, RegisterRequest, RegisterResponse,
    RenewCertificatesRequest, RenewCertificatesResponse, ServiceAccountTokenRequest, ServiceAccountTokenResponse,
    UpdateNodeStatusRequest, UpdateNodeStatusResponse, UpdatePodStatusRequest, UpdatePodStatusResponse,
    WatchNetworkRequest, WatchPodConfigRequest, WatchPodsRequest, node_service_server,
};
use gitplane_store::{Api, EventType, ListOptions, ObjectKey, Op, Rejection, Store, StoreError, WatchOptions};
use k8s_openapi::api::{
    coordination::v1::{Lease, LeaseSpec},
    core::v1::{Node, NodeCondition, NodeSpec, NodeStatus, Pod, PodStatus, ServiceAccount},
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use std::{collections::HashMap, net::IpAddr, pin::Pin, sync::Arc, time::Duration};
use tonic::{Request, Response, Status, service::interceptor::InterceptedService};

const LEASE_DURATION_SECONDS: i32 = 40;
/// Compare-and-swap retries before giving up on a contended object.
const CAS_ATTEMPTS: usize = 10;
/// How long a registration retries while others take the ranges it reserves.
const REGISTRATION_DEADLINE: Duration = Duration::from_secs(20);
/// The largest message an agent sends (a Node or a Pod status is a few KiB).
const MAX_MESSAGE_BYTES: usize = 1 << 20;

pub struct NodeService {
    store: Arc<dyn Store>,
    identity: NodeIdentity,
    /// Signs the nodes' certificates at registration.
    ca: Arc<ClusterCa>,
    /// The addresses no node may take.
    reserved: addresses::Reserved,
    /// New nodes' podCIDRs.
    pod_cidrs: podcidr::Allocator,
    /// The kubelet's Events, from every node this replica serves.
    events: gitplane_store::events::Recorder,
    /// Signs the Pods' ServiceAccount tokens; none: nodes get none.
    tokens: Option<Arc<tokens::TokenIssuer>>,
    /// The Nodes calls are admitted against, and the Pods by node every Pod watch is fed from.
    cache: watch_cache::WatchCache,
    /// Each node's Lease as this replica last wrote it: the next renewal is a compare-and-swap
    /// on it, with no read first.
    leases: std::sync::Mutex<HashMap<String, Lease>>,
    heartbeats: heartbeats::Heartbeats,
}

impl NodeService {
    pub fn new(
        store: Arc<dyn Store>,
        identity: NodeIdentity,
        ca: Arc<ClusterCa>,
        reserved: addresses::Reserved,
    ) -> Self {
        let events = gitplane_store::events::Recorder::spawn(store.clone(), Default::default());
        let pod_cidrs = podcidr::Allocator::new(reserved.pods);
        let cache = watch_cache::WatchCache::spawn(store.clone());
        let heartbeats = heartbeats::Heartbeats::spawn(store.clone());
        NodeService {
            store,
            identity,
            ca,
            reserved,
            pod_cidrs,
            events,
            tokens: None,
            cache,
            leases: Default::default(),
            heartbeats,
        }
    }

    /// Nodes get their Pods' ServiceAccount tokens, signed by `issuer`.
    pub fn with_token_issuer(mut self, issuer: Arc<tokens::TokenIssuer>) -> Self {
        self.tokens = Some(issuer);
        self
    }

    /// The node a request of a node comes from, if that node may act still ([`identity::admit`]),
    /// with its stored Node: as the watch cache holds it, else (not there yet, or refused by what
    /// it holds, which may be behind) as the store does.
    async fn admitted<T>(&self, request: &Request<T>) -> Result<(String, Arc<Node>), Status> {
        let (name, proof) = node_of(request)?;
        if let Some(node) = self.cache.node(&name)
            && identity::admit(&name, &proof, Some(&node), false).is_ok()
        {
            return Ok((name, node));
        }
        let node = Api::<Node>::new(self.store.clone()).get("", &name).await.map_err(store_status)?;
        identity::admit(&name, &proof, node.as_ref(), false)?;
        Ok((name, Arc::new(node.unwrap_or_default())))
    }

    /// The service behind its authentication.
    pub fn into_server(self) -> InterceptedService<node_service_server::NodeServiceServer<Self>, NodeIdentity> {
        let identity = self.identity.clone();
        let server = node_service_server::NodeServiceServer::new(self).max_decoding_message_size(MAX_MESSAGE_BYTES);
        InterceptedService::new(server, identity)
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

/// Ready, as a node that comes back says it is until it reports otherwise.
fn ready_condition(now: Timestamp) -> NodeCondition {
    NodeCondition {
        type_: "Ready".into(),
        status: "True".into(),
        reason: Some("KubeletReady".into()),
        message: Some("kubelet is posting ready status".into()),
        last_heartbeat_time: Some(Time(now)),
        last_transition_time: Some(Time(now)),
    }
}

/// The status of the node's Ready condition, if it has one.
fn ready_status(node: &Node) -> Option<&str> {
    let conditions = node.status.as_ref()?.conditions.as_ref()?;
    conditions.iter().find(|c| c.type_ == "Ready").map(|c| c.status.as_str())
}

/// Whether the node's agent is alive: it reports Ready, True or False (its runtime may be down),
/// while Unknown means it stopped renewing its Lease.
fn is_alive(node: &Node) -> bool {
    matches!(ready_status(node), Some("True" | "False"))
}

fn pod_cidr(node: &Node) -> Option<String> {
    node.spec.as_ref()?.pod_cidr.clone()
}

/// Why a registration was refused.
#[derive(Debug, thiserror::Error)]
enum RegisterError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(
        "node {0} is registered and its agent is alive: registering it again needs that node's credential \
         (the join token may take over a name only once its node is not Ready)"
    )]
    Taken(String),
    /// Its address is not its to take ([`addresses::Reserved::admit`]).
    #[error("{}", .0.message())]
    Address(Status),
}

impl From<RegisterError> for Status {
    fn from(e: RegisterError) -> Status {
        match e {
            RegisterError::Store(e) => store_status(e),
            e @ RegisterError::Taken(_) => Status::permission_denied(e.to_string()),
            RegisterError::Address(status) => status,
        }
    }
}

/// A Node's InternalIP, if it has one.
fn node_ip(node: &Node) -> Option<IpAddr> {
    let addresses = node.status.as_ref()?.addresses.as_ref()?;
    addresses.iter().find(|a| a.type_ == "InternalIP")?.address.parse().ok()
}

/// Whether `name` is a valid Node name (a DNS subdomain).
fn valid_node_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

impl NodeService {
    /// Writes the Node (creating it and allocating its podCIDR if new), marked as holding
    /// certificates if `certificates_over_tls`; its podCIDR and uid.
    /// Registers `reported`, whose registration came from `peer`.
    async fn register_node(
        &self,
        reported: Node,
        caller: &Caller,
        peer: IpAddr,
        certificates_over_tls: bool,
    ) -> Result<(String, String), RegisterError> {
        let nodes = Api::<Node>::new(self.store.clone());
        let name = reported.metadata.name.clone().unwrap_or_default();
        let mut status = reported.status.clone().unwrap_or_default();
        // The node's own word on Ready (older agents send none: Ready, as they registered).
        let conditions = status.conditions.get_or_insert_with(Vec::new);
        if !conditions.iter().any(|c| c.type_ == "Ready") {
            conditions.push(ready_condition(Timestamp::now()));
        }
        // Registrations through other replicas may take the range this one reserved again and
        // again while many nodes join at once: retry until a deadline, not a count.
        let deadline = tokio::time::Instant::now() + REGISTRATION_DEADLINE;
        while tokio::time::Instant::now() < deadline {
            let mut ops = Vec::with_capacity(3);
            let mut reservation = None;
            let stored = nodes.get("", &name).await?;
            let at = |node: &Node| node_ip(node);
            self.reserved
                .admit(&name, at(&reported), peer, stored.as_ref().and_then(at))
                .map_err(RegisterError::Address)?;
            let mut node = match stored {
                // Checked on every attempt: a racing joiner that made the node first wins.
                Some(node) if *caller == Caller::Joiner && is_alive(&node) => {
                    return Err(RegisterError::Taken(name));
                }
                Some(node) => node,
                None => {
                    let reserved = self.pod_cidrs.reserve(&self.store, &name).await?;
                    let cidr = reserved.cidr.clone();
                    ops.push(reserved.record.clone());
                    reservation = Some(reserved);
                    // Taints come with the first registration only, as the kubelet's
                    // --register-with-taints: later changes are the cluster owner's.
                    let taints = reported.spec.as_ref().and_then(|s| s.taints.clone()).filter(|t| !t.is_empty());
                    let spec = NodeSpec {
                        pod_cidr: Some(cidr.clone()),
                        pod_cidrs: Some(vec![cidr]),
                        taints,
                        ..Default::default()
                    };
                    Node { metadata: reported.metadata.clone(), spec: Some(spec), status: None }
                }
            };
            let create = ops.len() == 1;
            node.metadata.labels = reported.metadata.labels.clone();
            // Where the node keeps provisioned volumes is the node's to say, at each start.
            let local_path_dir = reported.metadata.annotations.as_ref().and_then(|a| a.get(LOCAL_PATH_DIR));
            if let Some(dir) = local_path_dir {
                node.metadata
                    .annotations
                    .get_or_insert_with(Default::default)
                    .insert(LOCAL_PATH_DIR.into(), dir.clone());
            }
            // The mark is the control plane's to set, never the agent's to report.
            if create && let Some(annotations) = node.metadata.annotations.as_mut() {
                annotations.remove(CERTIFICATES_ANNOTATION);
            }
            if certificates_over_tls {
                let annotations = node.metadata.annotations.get_or_insert_with(Default::default);
                annotations.insert(CERTIFICATES_ANNOTATION.into(), "true".into());
            }
            let cidr = pod_cidr(&node).unwrap_or_default();
            let mut with_status = node.clone();
            with_status.metadata.resource_version = None; // ordered after the write above
            with_status.status = Some(status.clone());
            ops.push(if create { Op::Create(to_value(&node)) } else { Op::Update(to_value(&node)) });
            ops.push(Op::UpdateStatus(to_value(&with_status)));
            let committed = self.store.txn(ops).await;
            // A range another registration took stays marked taken; any other failure frees it.
            if let (Err(e), Some(reservation)) = (&committed, &reservation)
                && !e.is_already_exists()
            {
                self.pod_cidrs.unreserve(reservation).await;
            }
            match committed {
                Err(e) if e.is_conflict() || e.is_already_exists() => {
                    tokio::time::sleep(Duration::from_millis(rand::random::<u64>() % 20)).await;
                }
                Err(e) => return Err(e.into()),
                Ok(committed) => {
                    let uid = match node.metadata.uid {
                        Some(uid) => uid,
                        None => committed
                            .objects
                            .iter()
                            .filter(|o| o["kind"] == "Node")
                            .find_map(|o| o["metadata"]["uid"].as_str())
                            .unwrap_or_default()
                            .to_owned(),
                    };
                    // This replica admits the node's next calls by what it registered (its
                    // certificates' uid, the end of its credential over TLS).
                    self.cache.reached(committed.revision).await;
                    return Ok((cidr, uid));
                }
            }
        }
        Err(StoreError::Unavailable(format!("node {name} is being registered concurrently; retry")).into())
    }

    /// Stores what a node reports of itself, with the taints its pressure conditions call for.
    async fn update_node_status(&self, name: &str, reported: NodeStatus) -> Result<(), Status> {
        let nodes = Api::<Node>::new(self.store.clone());
        for _ in 0..CAS_ATTEMPTS {
            let Some(mut node) = nodes.get("", name).await.map_err(store_status)? else {
                return Err(Status::not_found(format!("node {name} is not registered: register it first")));
            };
            let status = nodestatus::merge(node.status.as_ref(), reported.clone());
            let spec = node.spec.get_or_insert_with(Default::default);
            let taints = nodestatus::condition_taints(&status, spec.taints.as_deref().unwrap_or_default());
            let mut ops = Vec::with_capacity(2);
            if taints != spec.taints.clone().unwrap_or_default() {
                spec.taints = Some(taints).filter(|t| !t.is_empty());
                ops.push(Op::Update(to_value(&node)));
            }
            let mut with_status = node;
            if !ops.is_empty() {
                with_status.metadata.resource_version = None; // ordered after the write above
            }
            with_status.status = Some(status);
            ops.push(Op::UpdateStatus(to_value(&with_status)));
            match self.store.txn(ops).await {
                Err(e) if e.is_conflict() => continue,
                other => return other.map(|_| ()).map_err(store_status),
            }
        }
        Err(Status::aborted(format!("node {name} changed concurrently {CAS_ATTEMPTS} times; retry")))
    }

    /// Renews `name`'s Lease: a compare-and-swap on the Lease this replica last wrote, in one
    /// transaction with other nodes' renewals, else (none yet, changed since, or the batch
    /// failed) on the one read. `node`: its Node as the watch cache holds it, if it does (else
    /// read when its Ready condition must be checked).
    async fn renew_lease(&self, name: &str, node: Option<&Node>) -> Result<(), StoreError> {
        let now = MicroTime(Timestamp::now());
        let cached = self.leases.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(name);
        let renewed = match cached {
            Some(mut lease) => {
                lease.spec.get_or_insert_with(Default::default).renew_time = Some(now.clone());
                self.heartbeats.renew(lease).await
            }
            None => None,
        };
        let renewed = match renewed {
            Some(lease) => lease,
            None => self.renew_read_lease(name, now).await?,
        };
        self.leases.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(name.to_owned(), renewed);
        // A node that was marked Unknown is Ready again once it heartbeats (an agent whose
        // runtime is down says so with its next status report); a node that reports Ready=False
        // itself keeps it.
        if node.is_some_and(|node| matches!(ready_status(node), Some("True" | "False"))) {
            return Ok(());
        }
        let nodes = Api::<Node>::new(self.store.clone());
        if let Some(mut node) = nodes.get("", name).await?
            && ready_status(&node).is_none_or(|status| status == "Unknown")
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

    /// Renews `name`'s Lease as stored now (creating it if there is none): the renewed Lease.
    async fn renew_read_lease(&self, name: &str, now: MicroTime) -> Result<Lease, StoreError> {
        let leases = Api::<Lease>::new(self.store.clone());
        let mut last = None;
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
                Err(e) if e.is_conflict() || e.is_already_exists() => last = Some(e),
                other => return other,
            }
        }
        Err(last.unwrap_or_else(|| StoreError::Unavailable(format!("the Lease of node {name} is contended; retry"))))
    }
}

fn pod_event(kind: WireEventType, revision: i64, pod: &serde_json::Value) -> PodEvent {
    PodEvent { r#type: kind as i32, resource_version: revision, pod: serde_json::to_vec(pod).unwrap_or_default() }
}

/// A Pod as its node receives it: with what ServiceAccount admission would add, its account's
/// image pull Secrets ([`pull_secrets`]) and, where the cluster issues tokens, the token volume
/// ([`token_volume`]).
async fn as_sent(store: &Arc<dyn Store>, pod: &serde_json::Value, mounts_tokens: bool) -> serde_json::Value {
    let mut pod = pod.clone();
    if !mounts_tokens && pull_secrets::has_own(&pod) {
        return pod;
    }
    // Unreadable for now: as if it said nothing; the Pod's next event asks again.
    let account = service_account(store, &pod).await.ok().flatten();
    pull_secrets::copy(&mut pod, account.as_ref());
    if mounts_tokens {
        let automount = account.and_then(|a| a["automountServiceAccountToken"].as_bool());
        token_volume::mount(&mut pod, automount);
    }
    pod
}

/// The ServiceAccount `pod` runs as, if it exists.
async fn service_account(
    store: &Arc<dyn Store>,
    pod: &serde_json::Value,
) -> Result<Option<serde_json::Value>, StoreError> {
    let namespace = pod["metadata"]["namespace"].as_str().unwrap_or_default();
    store.get(&ObjectKey::of::<ServiceAccount>(namespace, token_volume::service_account_name(pod))).await
}

type PodEventStream = Pin<Box<dyn Stream<Item = Result<PodEvent, Status>> + Send>>;
type ObjectEventStream = Pin<Box<dyn Stream<Item = Result<ObjectEvent, Status>> + Send>>;

/// What every node reads to program its networking (a kubelet and kube-proxy read as much, and a
/// CNI plugin's policy agent the NetworkPolicies, Namespaces and every Pod) and to serve Ingresses
/// (an ingress controller reads as much, and the TLS Secrets Ingresses name: see
/// [`ingress_secrets`]).
const NETWORK_KINDS: [&str; 9] = [
    "Service",
    "EndpointSlice.discovery.k8s.io",
    "Node",
    "ConfigMap",
    ingress_secrets::INGRESS,
    "IngressClass.networking.k8s.io",
    "NetworkPolicy.networking.k8s.io",
    "Namespace",
    "Pod",
];

/// A Pod as NetworkPolicy needs it, and no more: its labels, node, address, phase and container
/// ports (named ports). Every node sees every Pod, so nothing else of it (env, volumes) leaves.
fn policy_pod(pod: &serde_json::Value) -> serde_json::Value {
    let (meta, spec, status) = (&pod["metadata"], &pod["spec"], &pod["status"]);
    let containers: Vec<serde_json::Value> = spec["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| serde_json::json!({"name": c["name"], "ports": c["ports"]}))
        .collect();
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": meta["name"], "namespace": meta["namespace"], "labels": meta["labels"]},
        "spec": {"nodeName": spec["nodeName"], "hostNetwork": spec["hostNetwork"], "containers": containers},
        "status": {"phase": status["phase"], "podIP": status["podIP"]},
    })
}

/// A Node as the routes to other nodes need it, and no more: its name, podCIDRs and addresses.
/// Its conditions and heartbeats stay out, so one node's status reaches no other node.
fn route_node(node: &serde_json::Value) -> serde_json::Value {
    let (spec, status) = (&node["spec"], &node["status"]);
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": node["metadata"]["name"]},
        "spec": {"podCIDR": spec["podCIDR"], "podCIDRs": spec["podCIDRs"]},
        "status": {"addresses": status["addresses"]},
    })
}

/// What the network watch sends of an object, as JSON: a Pod ([`policy_pod`]) and a Node
/// ([`route_node`]) slimmed, others whole.
fn network_bytes(kind: &str, object: &serde_json::Value) -> Vec<u8> {
    let bytes = match kind {
        "Pod" => serde_json::to_vec(&policy_pod(object)),
        "Node" => serde_json::to_vec(&route_node(object)),
        _ => serde_json::to_vec(object),
    };
    bytes.unwrap_or_default()
}

/// What one network stream last sent of each object: a change that leaves what is sent alone
/// (a Pod's conditions, a Node's heartbeat) is not sent again. Every stream knows every object
/// it sent, so it keeps a hash of the bytes (SipHash under keys drawn for the stream, which
/// nobody who writes objects can aim a collision at), not the object.
#[derive(Default)]
struct Sent {
    hasher: std::hash::RandomState,
    last: HashMap<ObjectKey, u64>,
}

impl Sent {
    /// Whether `bytes` differ from what was last sent of `key`, remembering them.
    fn changed(&mut self, key: &ObjectKey, bytes: &[u8]) -> bool {
        let hash = std::hash::BuildHasher::hash_one(&self.hasher, bytes);
        self.last.insert(key.clone(), hash) != Some(hash)
    }

    fn forget(&mut self, key: &ObjectKey) {
        self.last.remove(key);
    }
}

/// The events of the network watch one store event makes: the object if the node may see it
/// (unless it is what was last sent of it), and for an Ingress the TLS Secrets it starts naming
/// (read now) or stops naming (deleted). The stream ends when `node` is removed.
async fn network_events(
    store: &dyn Store,
    node: &str,
    tls: &std::sync::Mutex<TlsReferences>,
    sent: &std::sync::Mutex<Sent>,
    event: Result<gitplane_store::Event, StoreError>,
) -> Vec<Result<ObjectEvent, Status>> {
    let e = match event {
        Err(e) => return vec![Err(store_status(e))],
        Ok(e) if identity::removes(&e, node) => return vec![Err(identity::removed(node))],
        Ok(e) => e,
    };
    let wire = match e.event_type {
        EventType::Bookmark => {
            return vec![Ok(ObjectEvent {
                r#type: WireEventType::Bookmark as i32,
                resource_version: e.revision,
                ..Default::default()
            })];
        }
        EventType::Added => WireEventType::Added,
        EventType::Modified => WireEventType::Modified,
        _ => WireEventType::Deleted,
    };
    let present = (e.event_type != EventType::Deleted).then_some(&*e.object);
    let lock = || tls.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if e.key.kind == ingress_secrets::SECRET {
        return match lock().secret_changed(&e.key, present) {
            Some(true) => vec![Ok(object_event(wire, e.revision, &e.key.kind, &e.object))],
            Some(false) => vec![Ok(object_event(WireEventType::Deleted, e.revision, &e.key.kind, &e.object))],
            None => Vec::new(),
        };
    }
    if !network_object(&e.key) {
        return Vec::new();
    }
    let object = network_bytes(&e.key.kind, &e.object);
    {
        let mut sent = sent.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if wire == WireEventType::Deleted {
            sent.forget(&e.key);
        } else if !sent.changed(&e.key, &object) {
            return Vec::new();
        }
    }
    let event = ObjectEvent { r#type: wire as i32, resource_version: e.revision, kind: e.key.kind.clone(), object };
    let mut out = vec![Ok(event)];
    if e.key.kind == ingress_secrets::INGRESS {
        let (added, removed) = lock().set_ingress(&e.key, present);
        for (namespace, name) in added {
            let key = ObjectKey::new(ingress_secrets::SECRET, namespace, name);
            match store.get(&key).await {
                Err(error) => return vec![Err(store_status(error))],
                Ok(secret) => {
                    if let Some(secret) = secret
                        && lock().secret_changed(&key, Some(&secret)) == Some(true)
                    {
                        out.push(Ok(object_event(WireEventType::Added, e.revision, &key.kind, &secret)));
                    }
                }
            }
        }
        for (namespace, name) in removed {
            let gone = serde_json::json!({"apiVersion": "v1", "kind": "Secret",
                                          "metadata": {"name": name, "namespace": namespace}});
            out.push(Ok(object_event(WireEventType::Deleted, e.revision, ingress_secrets::SECRET, &gone)));
        }
    }
    out
}

/// Of the ConfigMaps, only cluster DNS's settings: the others may hold anything.
fn network_object(key: &ObjectKey) -> bool {
    key.kind != "ConfigMap" || (key.namespace == "kube-system" && key.name == "kube-dns")
}

fn object_event(kind: WireEventType, revision: i64, group_kind: &str, object: &serde_json::Value) -> ObjectEvent {
    ObjectEvent {
        r#type: kind as i32,
        resource_version: revision,
        kind: group_kind.to_owned(),
        object: serde_json::to_vec(object).unwrap_or_default(),
    }
}

#[tonic::async_trait]
impl node_service_server::NodeService for NodeService {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<RegisterResponse>, Status> {
        let caller = caller(&request)?;
        let node: Node = decode("node", &request.get_ref().node)?;
        let name = node.metadata.name.clone().unwrap_or_default();
        if !valid_node_name(&name) {
            return Err(Status::invalid_argument(format!(
                "node name {name:?} is not a DNS subdomain (lowercase letters, digits, '-' and '.', at most 253)"
            )));
        }
        if let Caller::Node { name: own, proof } = &caller {
            if *own != name {
                return Err(Status::permission_denied(format!(
                    "this is node {own}'s credential: it cannot register {name}"
                )));
            }
            let stored = Api::<Node>::new(self.store.clone()).get("", own).await.map_err(store_status)?;
            identity::admit(own, proof, stored.as_ref(), true)?;
        }
        if let Some(why) = node.metadata.labels.as_ref().and_then(nodestatus::forbidden_label) {
            return Err(Status::permission_denied(format!("node {name}: {why}")));
        }
        // Checked before anything is written, so a bad request changes nothing; signed after,
        // for the uid of the Node written.
        let csr = &request.get_ref().csr;
        if !csr.is_empty() {
            ClusterCa::check_request(csr).map_err(|e| Status::invalid_argument(format!("node {name}: {e}")))?;
        }
        let over_tls = matches!(request.extensions().get::<Transport>(), Some(Transport::Tls(_)));
        let peer = request.extensions().get::<ClientAddr>().map_or(IpAddr::from([0, 0, 0, 0]), |c| c.0);
        let address = kubelet_address(&node).ip();
        let (pod_cidr, uid) = self.register_node(node, &caller, peer, over_tls && !csr.is_empty()).await?;
        let certificates = match csr.is_empty() {
            true => None,
            false => Some(
                self.ca
                    .sign_node(csr, &name, &uid, address)
                    .map_err(|e| Status::invalid_argument(format!("node {name}: {e}")))?,
            ),
        };
        self.renew_lease(&name, None).await.map_err(store_status)?;
        tracing::info!(node = %name, %pod_cidr, certificates = certificates.is_some(), "node registered");
        // Over TLS the client certificate replaces the credential; over cleartext (loopback) no
        // certificate can be presented, so the node keeps a credential.
        let credential = match over_tls && certificates.is_some() {
            true => String::new(),
            false => self.identity.credential(&name),
        };
        let (client_certificate, serving_certificate) = certificates.map(|c| (c.client, c.serving)).unwrap_or_default();
        Ok(Response::new(RegisterResponse {
            pod_cidr,
            credential,
            client_certificate,
            serving_certificate,
            certificate_authority: self.ca.pem(),
            cluster_cidr: self.reserved.pods.to_string(),
        }))
    }

    async fn renew_certificates(
        &self,
        request: Request<RenewCertificatesRequest>,
    ) -> Result<Response<RenewCertificatesResponse>, Status> {
        let (name, node) = self.admitted(&request).await?;
        let uid = node.metadata.uid.clone().unwrap_or_default();
        let signed = self
            .ca
            .sign_node(&request.get_ref().csr, &name, &uid, kubelet_address(&node).ip())
            .map_err(|e| Status::invalid_argument(format!("node {name}: {e}")))?;
        tracing::info!(node = %name, "node certificates renewed");
        Ok(Response::new(RenewCertificatesResponse {
            client_certificate: signed.client,
            serving_certificate: signed.serving,
        }))
    }

    async fn heartbeat(&self, request: Request<HeartbeatRequest>) -> Result<Response<HeartbeatResponse>, Status> {
        let (own, node) = self.admitted(&request).await?;
        let name = &request.get_ref().node_name;
        if *name != own {
            return Err(Status::permission_denied(format!("node {own} cannot renew the lease of {name}")));
        }
        self.renew_lease(name, Some(&node)).await.map_err(store_status)?;
        Ok(Response::new(HeartbeatResponse {}))
    }

    async fn update_node_status(
        &self,
        request: Request<UpdateNodeStatusRequest>,
    ) -> Result<Response<UpdateNodeStatusResponse>, Status> {
        let (own, _) = self.admitted(&request).await?;
        let UpdateNodeStatusRequest { node_name, status } = request.into_inner();
        if node_name != own {
            return Err(Status::permission_denied(format!("node {own} cannot update the status of {node_name}")));
        }
        let status: NodeStatus = decode("status", &status)?;
        self.update_node_status(&node_name, status).await?;
        Ok(Response::new(UpdateNodeStatusResponse {}))
    }

    async fn request_service_account_token(
        &self,
        request: Request<ServiceAccountTokenRequest>,
    ) -> Result<Response<ServiceAccountTokenResponse>, Status> {
        let (_, node) = self.admitted(&request).await?;
        let issuer = self.tokens.as_ref().ok_or_else(|| Status::unimplemented("this replica issues no tokens"))?;
        let req = request.into_inner();
        let pod = Api::<Pod>::new(self.store.clone()).get(&req.namespace, &req.pod_name).await.map_err(store_status)?;
        let account = Api::<ServiceAccount>::new(self.store.clone())
            .get(&req.namespace, &req.service_account)
            .await
            .map_err(store_status)?;
        let asked = tokens::Asked {
            namespace: &req.namespace,
            pod_name: &req.pod_name,
            pod_uid: &req.pod_uid,
            service_account: &req.service_account,
            audiences: req.audiences.clone(),
            expiration_seconds: req.expiration_seconds,
        };
        let now = Timestamp::now().as_second();
        let claims = issuer.claims(&node, &asked, pod.as_ref(), account.as_ref(), now)?;
        let token = issuer.key.sign(&claims).map_err(|e| Status::internal(e.to_string()))?;
        tracing::debug!(pod = %format!("{}/{}", req.namespace, req.pod_name), "service account token issued");
        Ok(Response::new(ServiceAccountTokenResponse {
            token,
            expiration_unix_seconds: claims.exp,
            issued_unix_seconds: claims.iat,
        }))
    }

    type WatchPodsStream = PodEventStream;

    async fn watch_pods(&self, request: Request<WatchPodsRequest>) -> Result<Response<PodEventStream>, Status> {
        let (own, _) = self.admitted(&request).await?;
        let WatchPodsRequest { node_name, resource_version } = request.into_inner();
        if node_name != own {
            return Err(Status::permission_denied(format!("node {own} cannot watch the Pods of {node_name}")));
        }
        let mounts_tokens = self.tokens.is_some();
        // From the watch cache: its index of Pods by node for a first list, its recent changes
        // for a watch that resumes; it ends the stream when the node is removed.
        let changes = self.cache.watch(&node_name, resource_version).await?;
        let store = self.store.clone();
        let events = changes.then(move |change| {
            let store = store.clone();
            async move {
                match change {
                    watch_cache::Change::Pod(e) => {
                        let kind = match e.event_type {
                            EventType::Added => WireEventType::Added,
                            EventType::Modified => WireEventType::Modified,
                            _ => WireEventType::Deleted,
                        };
                        let pod = as_sent(&store, &e.object, mounts_tokens).await;
                        Ok(pod_event(kind, e.revision, &pod))
                    }
                    // Bookmarks let an agent resume from a recent revision after a reconnect.
                    watch_cache::Change::Bookmark(revision) => Ok(PodEvent {
                        r#type: WireEventType::Bookmark as i32,
                        resource_version: revision,
                        pod: Vec::new(),
                    }),
                    watch_cache::Change::End(status) => Err(status),
                }
            }
        });
        tracing::info!(node = %node_name, from = resource_version, "pod watch started");
        Ok(Response::new(Box::pin(events)))
    }

    type WatchNetworkStream = ObjectEventStream;

    async fn watch_network(
        &self,
        request: Request<WatchNetworkRequest>,
    ) -> Result<Response<ObjectEventStream>, Status> {
        let (own, _) = self.admitted(&request).await?;
        let resource_version = request.into_inner().resource_version;
        let mut initial = Vec::new();
        let mut tls = TlsReferences::default();
        let mut sent = Sent::default();
        let from = if resource_version == 0 {
            // Every kind as of one revision: the first list's.
            let mut revision = None;
            for kind in NETWORK_KINDS {
                let options = ListOptions { at_revision: revision, ..ListOptions::default() };
                let list = self.store.list(kind, &options).await.map_err(store_status)?;
                revision = Some(list.revision);
                for o in &list.items {
                    let Ok(key) = ObjectKey::from_value(o) else { continue };
                    if kind == ingress_secrets::INGRESS {
                        tls.set_ingress(&key, Some(o));
                    }
                    if network_object(&key) {
                        let object = network_bytes(kind, o);
                        sent.changed(&key, &object);
                        let r#type = WireEventType::Added as i32;
                        initial.push(Ok(ObjectEvent {
                            r#type,
                            resource_version: list.revision,
                            kind: kind.into(),
                            object,
                        }));
                    }
                }
            }
            let revision = revision.unwrap_or_default();
            // The TLS Secrets the Ingresses name, as of the same revision.
            let options = ListOptions { at_revision: Some(revision), ..ListOptions::default() };
            let secrets = self.store.list(ingress_secrets::SECRET, &options).await.map_err(store_status)?;
            for secret in &secrets.items {
                let Ok(key) = ObjectKey::from_value(secret) else { continue };
                if tls.secret_changed(&key, Some(secret)) == Some(true) {
                    initial.push(Ok(object_event(WireEventType::Added, revision, ingress_secrets::SECRET, secret)));
                }
            }
            initial.push(Ok(ObjectEvent {
                r#type: WireEventType::Bookmark as i32,
                resource_version: revision,
                ..Default::default()
            }));
            revision
        } else {
            // Resumed: the agent holds what was sent; learn the references without sending them.
            let ingresses =
                self.store.list(ingress_secrets::INGRESS, &ListOptions::default()).await.map_err(store_status)?;
            for o in &ingresses.items {
                let Ok(key) = ObjectKey::from_value(o) else { continue };
                for (namespace, name) in tls.set_ingress(&key, Some(o)).0 {
                    let key = ObjectKey::new(ingress_secrets::SECRET, namespace, name);
                    let secret = self.store.get(&key).await.map_err(store_status)?;
                    tls.secret_changed(&key, secret.as_ref());
                }
            }
            resource_version
        };
        let kinds = NETWORK_KINDS.iter().chain([&ingress_secrets::SECRET]).map(|k| k.to_string()).collect();
        let events = self
            .store
            .watch(
                from,
                WatchOptions {
                    kinds: Some(kinds),
                    bookmarks: true,
                    bookmark_interval: Some(watch_cache::BOOKMARK_INTERVAL),
                },
            )
            .await
            .map_err(store_status)?;
        let (store, tls) = (self.store.clone(), Arc::new(std::sync::Mutex::new(tls)));
        let sent = Arc::new(std::sync::Mutex::new(sent));
        let node = Arc::new(own.clone());
        let changes = events
            .then(move |event| {
                let (store, tls, sent, node) = (store.clone(), tls.clone(), sent.clone(), node.clone());
                async move { network_events(&*store, &node, &tls, &sent, event).await }
            })
            .flat_map(futures::stream::iter);
        tracing::info!(node = %own, from, "network watch started");
        Ok(Response::new(Box::pin(futures::stream::iter(initial).chain(changes))))
    }

    type WatchPodConfigStream = ObjectEventStream;

    async fn watch_pod_config(
        &self,
        request: Request<WatchPodConfigRequest>,
    ) -> Result<Response<ObjectEventStream>, Status> {
        let (own, _) = self.admitted(&request).await?;
        let node_name = request.into_inner().node_name;
        if node_name != own {
            return Err(Status::permission_denied(format!(
                "node {own} cannot read what the Pods of {node_name} reference"
            )));
        }
        Ok(Response::new(podconfig::watch(self.store.clone(), own).await?))
    }

    async fn create_events(
        &self,
        request: Request<CreateEventsRequest>,
    ) -> Result<Response<CreateEventsResponse>, Status> {
        let (own, _) = self.admitted(&request).await?;
        let req = request.into_inner();
        if req.node_name != own {
            return Err(Status::permission_denied(format!("node {own} cannot record events as {}", req.node_name)));
        }
        for record in events::authorize(self.store.clone(), &own, req.events).await? {
            self.events.record(record);
        }
        Ok(Response::new(CreateEventsResponse {}))
    }

    async fn update_pod_status(
        &self,
        request: Request<UpdatePodStatusRequest>,
    ) -> Result<Response<UpdatePodStatusResponse>, Status> {
        let (own, node) = self.admitted(&request).await?;
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
            // Said the same way whether or not the Pod exists elsewhere: no probing of others' Pods.
            if pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(own.as_str()) {
                return Err(Status::permission_denied(format!(
                    "pod {}/{} is not bound to node {own}",
                    req.namespace, req.name
                )));
            }
            check_addresses(&pod, &status, &node)?;
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

    async fn delete_pod(&self, request: Request<DeletePodRequest>) -> Result<Response<DeletePodResponse>, Status> {
        let (own, _) = self.admitted(&request).await?;
        let req = request.into_inner();
        let pods = Api::<Pod>::new(self.store.clone());
        for _ in 0..CAS_ATTEMPTS {
            let pod = pods.get(&req.namespace, &req.name).await.map_err(store_status)?;
            let revision = finalizable(pod.as_ref(), &own, &req)?;
            let key = ObjectKey::of::<Pod>(&req.namespace, &req.name);
            match self.store.txn(vec![Op::Delete { key, revision }]).await {
                Err(e) if e.is_conflict() => continue,
                Err(e) => return Err(store_status(e)),
                Ok(_) => {
                    tracing::info!(pod = %format!("{}/{}", req.namespace, req.name), node = %own, "pod deleted by its node");
                    return Ok(Response::new(DeletePodResponse {}));
                }
            }
        }
        Err(Status::aborted("the pod is contended; retry"))
    }
}

/// NodeRestriction for a node's delete of a Pod: the Pod it stopped (same uid), bound to it, and
/// already terminating; the revision to delete it at.
fn finalizable(pod: Option<&Pod>, own: &str, req: &DeletePodRequest) -> Result<Option<i64>, Status> {
    let name = format!("{}/{}", req.namespace, req.name);
    let Some(pod) = pod.filter(|p| p.metadata.uid.as_deref() == Some(req.uid.as_str())) else {
        return Err(Status::not_found(format!("pod {name} with uid {} no longer exists", req.uid)));
    };
    // Said the same way whether or not the Pod exists elsewhere: no probing of others' Pods.
    if pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(own) {
        return Err(Status::permission_denied(format!("pod {name} is not bound to node {own}")));
    }
    if pod.metadata.deletion_timestamp.is_none() {
        return Err(Status::permission_denied(format!(
            "pod {name} is not being deleted: a node removes only the Pods it was asked to stop"
        )));
    }
    Ok(revision_of(pod))
}

/// A node reports only addresses it has: Pod IPs from its podCIDR (its own address for
/// hostNetwork Pods), and its own address as the host IP.
fn check_addresses(pod: &Pod, status: &PodStatus, node: &Node) -> Result<(), Status> {
    let node_addresses: Vec<&str> =
        node.status.iter().flat_map(|s| s.addresses.iter().flatten()).map(|a| a.address.as_str()).collect();
    let cidr = pod_cidr(node).unwrap_or_default();
    let host_network = pod.spec.as_ref().and_then(|s| s.host_network).unwrap_or(false);
    let pod_ips = status.pod_ip.iter().chain(status.pod_ips.iter().flatten().map(|p| &p.ip));
    for ip in pod_ips {
        let ok = if host_network { node_addresses.contains(&ip.as_str()) } else { podcidr::contains(&cidr, ip) };
        if !ok {
            return Err(Status::permission_denied(format!(
                "pod IP {ip} is not an address of this node (podCIDR {cidr}{})",
                if host_network { ", hostNetwork" } else { "" }
            )));
        }
    }
    if let Some(host_ip) = &status.host_ip
        && !node_addresses.is_empty()
        && !node_addresses.contains(&host_ip.as_str())
    {
        return Err(Status::permission_denied(format!("host IP {host_ip} is not an address of this node")));
    }
    Ok(())
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
    use gitplane_proto::{node::node_service_server::NodeService as _, x509};
    use gitplane_storage::sqlite::SqliteStore;
    use identity::Proof;
    use k8s_openapi::api::core::v1::{NodeAddress, NodeStatus, PodSpec};

    const JOIN: &str = "join-token-for-tests-0123";

    async fn service() -> NodeService {
        let store: Arc<dyn Store> = Arc::new(SqliteStore::memory().await.unwrap());
        NodeService::new(
            store,
            NodeIdentity::new(JOIN, [9; 32]),
            Arc::new(ClusterCa::derive([9; 32]).unwrap()),
            Default::default(),
        )
    }

    /// Two replicas' node services over one store.
    async fn two_replicas() -> [Arc<NodeService>; 2] {
        let one = service().await;
        let two = NodeService::new(one.store.clone(), one.identity.clone(), one.ca.clone(), Default::default());
        [Arc::new(one), Arc::new(two)]
    }

    /// A request of `caller` from this machine (over loopback, as `gitplane up`'s own node).
    fn as_caller<T>(message: T, caller: Caller) -> Request<T> {
        let mut request = Request::new(message);
        request.extensions_mut().insert(caller);
        request.extensions_mut().insert(ClientAddr([127, 0, 0, 1].into()));
        request
    }

    fn node(name: &str) -> RegisterRequest {
        let node = Node {
            metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
            status: Some(NodeStatus {
                addresses: Some(vec![NodeAddress { type_: "InternalIP".into(), address: "192.0.2.1".into() }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        RegisterRequest { node: serde_json::to_vec(&node).unwrap(), ..Default::default() }
    }

    fn code<T>(result: Result<T, Status>) -> tonic::Code {
        result.err().map_or(tonic::Code::Ok, |s| s.code())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn t10_concurrent_registrations_never_share_a_pod_cidr() {
        let replicas = two_replicas().await;
        let registrations = (0..50).map(|i| {
            let service = replicas[i % 2].clone();
            tokio::spawn(async move {
                let reply = service.register(as_caller(node(&format!("n{i}")), Caller::Joiner)).await.unwrap();
                reply.into_inner().pod_cidr
            })
        });
        let cidrs: Vec<String> = futures::future::try_join_all(registrations).await.unwrap();
        let distinct: std::collections::HashSet<&String> = cidrs.iter().collect();
        assert_eq!(distinct.len(), 50, "{cidrs:?}");
        let (nodes, _) = Api::<Node>::new(replicas[0].store.clone()).list(None).await.unwrap();
        let stored: std::collections::HashSet<String> = nodes.iter().filter_map(pod_cidr).collect();
        assert_eq!(stored.len(), 50, "every Node holds the CIDR its registration returned");
    }

    #[tokio::test]
    async fn t10_a_node_acts_only_for_itself() {
        let service = service().await;
        let a = service.register(as_caller(node("a"), Caller::Joiner)).await.unwrap().into_inner();
        assert_eq!(a.credential, service.identity.credential("a"));
        service.register(as_caller(node("b"), Caller::Joiner)).await.unwrap();
        let (as_a, as_b) = (Caller::node("a"), Caller::node("b"));

        // Names: the joiner cannot take a live node's name; a node re-registers only itself.
        assert_eq!(code(service.register(as_caller(node("a"), Caller::Joiner)).await), tonic::Code::PermissionDenied);
        assert_eq!(code(service.register(as_caller(node("b"), as_a.clone())).await), tonic::Code::PermissionDenied);
        let again = service.register(as_caller(node("a"), as_a.clone())).await.unwrap().into_inner();
        let ranges = (again.pod_cidr.as_str(), again.cluster_cidr.as_str());
        assert_eq!(ranges, (a.pod_cidr.as_str(), "10.244.0.0/16"), "registering again keeps the podCIDR");
        assert_eq!(
            code(service.register(as_caller(node("Bad_Name"), Caller::Joiner)).await),
            tonic::Code::InvalidArgument
        );

        // Leases and watches: its own only; the join token does neither.
        let beat = |name: &str, caller: Caller| as_caller(HeartbeatRequest { node_name: name.into() }, caller);
        assert_eq!(code(service.heartbeat(beat("a", as_a.clone())).await), tonic::Code::Ok);
        assert_eq!(code(service.heartbeat(beat("b", as_a.clone())).await), tonic::Code::PermissionDenied);
        assert_eq!(code(service.heartbeat(beat("a", Caller::Joiner)).await), tonic::Code::PermissionDenied);
        let watch = |name: &str, caller: Caller| {
            as_caller(WatchPodsRequest { node_name: name.into(), resource_version: 0 }, caller)
        };
        assert_eq!(code(service.watch_pods(watch("a", as_a.clone())).await), tonic::Code::Ok);
        assert_eq!(code(service.watch_pods(watch("b", as_a.clone())).await), tonic::Code::PermissionDenied);

        // Pod status: only for Pods bound to the node, with addresses of the node.
        let pod = Pod {
            metadata: ObjectMeta { name: Some("p".into()), namespace: Some("default".into()), ..Default::default() },
            spec: Some(PodSpec { node_name: Some("a".into()), ..Default::default() }),
            ..Default::default()
        };
        let stored = Api::<Pod>::new(service.store.clone()).create(&pod).await.unwrap();
        let uid = stored.metadata.uid.clone().unwrap();
        let report = |ip: &str, caller: Caller| {
            let status = PodStatus { phase: Some("Running".into()), pod_ip: Some(ip.into()), ..Default::default() };
            let request = UpdatePodStatusRequest {
                namespace: "default".into(),
                name: "p".into(),
                uid: uid.clone(),
                status: serde_json::to_vec(&status).unwrap(),
            };
            as_caller(request, caller)
        };
        let a_cidr = a.pod_cidr.trim_end_matches("0/24").to_owned();
        assert_eq!(
            code(service.update_pod_status(report(&format!("{a_cidr}7"), as_b.clone())).await),
            tonic::Code::PermissionDenied
        );
        assert_eq!(
            code(service.update_pod_status(report("10.9.9.9", as_a.clone())).await),
            tonic::Code::PermissionDenied
        );
        assert_eq!(code(service.update_pod_status(report(&format!("{a_cidr}7"), as_a.clone())).await), tonic::Code::Ok);

        // Deletes: only its own Pods, of the same uid, once they are terminating.
        let delete = |uid: &str, caller: Caller| {
            let request = DeletePodRequest { namespace: "default".into(), name: "p".into(), uid: uid.into() };
            as_caller(request, caller)
        };
        assert_eq!(code(service.delete_pod(delete(&uid, as_a.clone())).await), tonic::Code::PermissionDenied);
        let pods = Api::<Pod>::new(service.store.clone());
        let mut terminating = pods.get("default", "p").await.unwrap().unwrap();
        terminating.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
        pods.update(&terminating).await.unwrap();
        #[rustfmt::skip]
        let refused = [
            (delete(&uid, as_b.clone()), tonic::Code::PermissionDenied, "a Pod bound elsewhere"),
            (delete("other", as_a.clone()), tonic::Code::NotFound, "another uid"),
            (delete(&uid, Caller::Joiner), tonic::Code::PermissionDenied, "the join token"),
        ];
        for (request, expected, what) in refused {
            assert_eq!(code(service.delete_pod(request).await), expected, "{what}");
        }

        // Events: about its own Pods and Node only; a batch with one other object is refused whole.
        let event = |kind: &str, name: &str| gitplane_proto::node::NodeEvent {
            involved_object: serde_json::to_vec(
                &serde_json::json!({"kind": kind, "namespace": "default", "name": name}),
            )
            .unwrap(),
            r#type: "Normal".into(),
            reason: "Started".into(),
            message: "Started container c".into(),
            time_unix_millis: 0,
        };
        let events = |node: &str, batch: Vec<gitplane_proto::node::NodeEvent>, caller: Caller| {
            as_caller(CreateEventsRequest { node_name: node.into(), events: batch }, caller)
        };
        let ok = events("a", vec![event("Pod", "p"), event("Node", "a")], as_a.clone());
        assert_eq!(code(service.create_events(ok).await), tonic::Code::Ok);
        for (batch, caller) in [
            (events("a", vec![event("Pod", "p")], as_b.clone()), "another node's name"),
            (events("b", vec![event("Pod", "p")], as_b.clone()), "a Pod bound elsewhere"),
            (events("b", vec![event("Node", "a")], as_b.clone()), "another Node"),
            (events("a", vec![event("Pod", "p"), event("Pod", "missing")], as_a.clone()), "a Pod that is nowhere"),
            (events("a", vec![event("Secret", "s")], as_a.clone()), "another kind"),
        ] {
            assert_eq!(code(service.create_events(batch).await), tonic::Code::PermissionDenied, "{caller}");
        }

        assert_eq!(code(service.delete_pod(delete(&uid, as_a.clone())).await), tonic::Code::Ok);
        assert!(pods.get("default", "p").await.unwrap().is_none(), "removed");
        assert_eq!(code(service.delete_pod(delete(&uid, as_a.clone())).await), tonic::Code::NotFound);
    }

    fn csr() -> Vec<u8> {
        let key = rcgen::KeyPair::generate().unwrap();
        rcgen::CertificateParams::default().serialize_request(&key).unwrap().der().to_vec()
    }

    #[tokio::test]
    async fn t10_a_removed_node_is_refused_and_its_streams_end() {
        let service = service().await;
        let mut request = node("a");
        request.csr = csr();
        let registered = service.register(as_caller(request, Caller::Joiner)).await.unwrap().into_inner();
        let nodes = Api::<Node>::new(service.store.clone());
        let uid = nodes.get("", "a").await.unwrap().unwrap().metadata.uid.unwrap();
        let uid_of = |pem: &str| x509::subject(&x509::pem_blocks(pem, "CERTIFICATE")[0]).unwrap().uid;
        assert_eq!(uid_of(&registered.client_certificate), Some(uid.clone()));
        let by_certificate =
            |uid: &str| Caller::Node { name: "a".into(), proof: Proof::Certificate { uid: Some(uid.into()) } };

        // Renewal: new certificates for the same Node.
        let renew = |caller: Caller| as_caller(RenewCertificatesRequest { csr: csr() }, caller);
        let renewed = service.renew_certificates(renew(by_certificate(&uid))).await.unwrap().into_inner();
        assert_eq!(uid_of(&renewed.client_certificate), Some(uid.clone()));
        assert_eq!(uid_of(&renewed.serving_certificate), Some(uid.clone()));
        let bad = as_caller(RenewCertificatesRequest { csr: b"not a request".to_vec() }, by_certificate(&uid));
        assert_eq!(code(service.renew_certificates(bad).await), tonic::Code::InvalidArgument);

        let watch = |caller: Caller| as_caller(WatchPodsRequest { node_name: "a".into(), resource_version: 0 }, caller);
        let mut pods = service.watch_pods(watch(by_certificate(&uid))).await.unwrap().into_inner();
        let config = as_caller(WatchPodConfigRequest { node_name: "a".into() }, by_certificate(&uid));
        let mut config = service.watch_pod_config(config).await.unwrap().into_inner();
        let network = as_caller(WatchNetworkRequest { resource_version: 0 }, by_certificate(&uid));
        let mut network = service.watch_network(network).await.unwrap().into_inner();

        // Removed: every call is refused and every stream ends.
        service.store.txn(vec![Op::Delete { key: ObjectKey::new("Node", "", "a"), revision: None }]).await.unwrap();
        async fn ended<T: std::fmt::Debug>(
            stream: &mut Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>,
        ) -> Status {
            loop {
                match tokio::time::timeout(Duration::from_secs(10), stream.next()).await.unwrap() {
                    Some(Ok(_)) => continue,
                    Some(Err(status)) => return status,
                    None => panic!("the stream ended without a status"),
                }
            }
        }
        for status in [ended(&mut pods).await, ended(&mut config).await, ended(&mut network).await] {
            assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");
        }
        let beat = |caller: Caller| as_caller(HeartbeatRequest { node_name: "a".into() }, caller);
        for caller in [by_certificate(&uid), Caller::node("a")] {
            assert_eq!(code(service.heartbeat(beat(caller.clone())).await), tonic::Code::Unauthenticated);
            assert_eq!(code(service.renew_certificates(renew(caller.clone())).await), tonic::Code::Unauthenticated);
            assert_eq!(code(service.register(as_caller(node("a"), caller)).await), tonic::Code::Unauthenticated);
        }
        assert!(nodes.get("", "a").await.unwrap().is_none(), "no call of the removed node brought it back");

        // Joined again with the join token, it is another Node: the old certificate stays refused.
        service.register(as_caller(node("a"), Caller::Joiner)).await.unwrap();
        let again = nodes.get("", "a").await.unwrap().unwrap().metadata.uid.unwrap();
        assert_ne!(again, uid);
        assert_eq!(code(service.heartbeat(beat(by_certificate(&uid))).await), tonic::Code::Unauthenticated);
        assert_eq!(code(service.heartbeat(beat(by_certificate(&again))).await), tonic::Code::Ok);
    }

    #[tokio::test]
    async fn t10_a_node_records_killing_about_a_pod_deleted_since_it_saw_it() {
        let service = service().await;
        for name in ["a", "b"] {
            service.register(as_caller(node(name), Caller::Joiner)).await.unwrap();
        }
        let pods = Api::<Pod>::new(service.store.clone());
        let mut seen = Vec::new();
        for (name, node) in [("p", "a"), ("q", "b")] {
            let pod = Pod {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    namespace: Some("default".into()),
                    ..Default::default()
                },
                spec: Some(PodSpec { node_name: Some(node.into()), ..Default::default() }),
                ..Default::default()
            };
            seen.push(pods.create(&pod).await.unwrap());
            let key = ObjectKey::new("Pod", "default", name);
            service.store.txn(vec![Op::Delete { key, revision: None }]).await.unwrap();
        }
        let killing = |pod: &Pod, uid: Option<&str>| {
            let mut involved = gitplane_api::events::reference(pod);
            involved.uid = uid.map(Into::into).or(involved.uid);
            let event = gitplane_proto::node::NodeEvent {
                involved_object: serde_json::to_vec(&involved).unwrap(),
                r#type: "Normal".into(),
                reason: "Killing".into(),
                message: "Stopping container c".into(),
                time_unix_millis: 0,
            };
            as_caller(CreateEventsRequest { node_name: "a".into(), events: vec![event] }, Caller::node("a"))
        };
        assert_eq!(code(service.create_events(killing(&seen[0], None)).await), tonic::Code::Ok);
        for (pod, uid, why) in
            [(&seen[0], Some("another-uid"), "another Pod of that name"), (&seen[1], None, "a Pod of another node")]
        {
            assert_eq!(code(service.create_events(killing(pod, uid)).await), tonic::Code::PermissionDenied, "{why}");
        }
        let recorded = async {
            loop {
                let events = service.store.list("Event", &ListOptions::default()).await.unwrap();
                if let Some(event) = events.items.into_iter().find(|e| e["reason"] == "Killing") {
                    return event;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        let event = tokio::time::timeout(Duration::from_secs(10), recorded).await.unwrap();
        assert_eq!(event["involvedObject"]["name"], "p");
        assert_eq!(event["involvedObject"]["uid"].as_str(), seen[0].metadata.uid.as_deref());
    }

    #[tokio::test]
    async fn t10_a_credential_over_tls_ends_with_certificates_over_tls() {
        let service = service().await;
        service.register(as_caller(node("a"), Caller::Joiner)).await.unwrap();
        let credential_over_tls = Caller::Node { name: "a".into(), proof: Proof::Credential { over_tls: true } };
        let beat = |caller: Caller| as_caller(HeartbeatRequest { node_name: "a".into() }, caller);
        // Before certificates: the credential still works over TLS, and trades itself for them.
        assert_eq!(code(service.heartbeat(beat(credential_over_tls.clone())).await), tonic::Code::Ok);
        let mut request = node("a");
        request.csr = csr();
        let mut migrating = as_caller(request, credential_over_tls.clone());
        migrating.extensions_mut().insert(Transport::Tls(None));
        let migrated = service.register(migrating).await.unwrap().into_inner();
        assert!(migrated.credential.is_empty() && !migrated.client_certificate.is_empty());
        let stored = Api::<Node>::new(service.store.clone()).get("", "a").await.unwrap().unwrap();
        assert!(stored.metadata.annotations.unwrap().contains_key(CERTIFICATES_ANNOTATION));
        // After: refused over TLS, still taken over cleartext (loopback).
        assert_eq!(code(service.heartbeat(beat(credential_over_tls.clone())).await), tonic::Code::Unauthenticated);
        assert_eq!(
            code(service.register(as_caller(node("a"), credential_over_tls)).await),
            tonic::Code::Unauthenticated
        );
        assert_eq!(code(service.heartbeat(beat(Caller::node("a"))).await), tonic::Code::Ok);
    }

    #[tokio::test]
    async fn t10_nodes_watch_what_networking_needs_and_nothing_else() {
        let service = service().await;
        service.register(as_caller(node("a"), Caller::Joiner)).await.unwrap();
        let objects = [
            serde_json::json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "default"}}),
            serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kube-dns", "namespace": "kube-system"}}),
            serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "app-config", "namespace": "default"}}),
            serde_json::json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": "default"}}),
            serde_json::json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                               "metadata": {"name": "deny", "namespace": "default"}, "spec": {"podSelector": {}}}),
            serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default", "labels": {"app": "web"}},
                               "spec": {"nodeName": "b", "containers": [{"name": "c", "image": "i", "env": [{"name": "PASSWORD", "value": "x"}],
                                        "ports": [{"name": "http", "containerPort": 80}]}]},
                               "status": {"phase": "Running", "podIP": "10.244.2.5", "conditions": [{"type": "Ready", "status": "True"}]}}),
        ];
        service.store.txn(objects.into_iter().map(Op::Create).collect()).await.unwrap();
        let watch = |caller| as_caller(WatchNetworkRequest { resource_version: 0 }, caller);
        assert_eq!(code(service.watch_network(watch(Caller::Joiner)).await), tonic::Code::PermissionDenied);
        let mut stream = service.watch_network(watch(Caller::node("a"))).await.unwrap().into_inner();
        let mut listed = Vec::new();
        while let Some(Ok(event)) = stream.next().await {
            if event.r#type == WireEventType::Bookmark as i32 {
                break;
            }
            let object: serde_json::Value = serde_json::from_slice(&event.object).unwrap();
            if event.kind == "Pod" {
                // Slimmed to what NetworkPolicy reads: no environment, no conditions.
                assert_eq!(
                    object,
                    serde_json::json!({"apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": "p", "namespace": "default", "labels": {"app": "web"}},
                        "spec": {"nodeName": "b", "hostNetwork": null, "containers": [{"name": "c", "ports": [{"name": "http", "containerPort": 80, "protocol": "TCP"}]}]},
                        "status": {"phase": "Running", "podIP": "10.244.2.5"}})
                );
            }
            listed.push(format!("{} {}", event.kind, object["metadata"]["name"].as_str().unwrap()));
        }
        listed.sort();
        listed.retain(|l| !l.starts_with("Namespace "));
        assert_eq!(
            listed,
            ["ConfigMap kube-dns", "NetworkPolicy.networking.k8s.io deny", "Node a", "Pod p", "Service web"],
            "no other ConfigMap, no Secret"
        );
        let svc = serde_json::json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "db", "namespace": "default"}});
        let other = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "default"}});
        // A Pod status change that leaves its slimmed form alone is not sent.
        let mut pod = service.store.get(&ObjectKey::new("Pod", "default", "p")).await.unwrap().unwrap();
        pod["status"]["conditions"][0]["status"] = "False".into();
        service.store.txn(vec![Op::UpdateStatus(pod)]).await.unwrap();
        service.store.txn(vec![Op::Create(other), Op::Create(svc)]).await.unwrap();
        let next = loop {
            let event = tokio::time::timeout(Duration::from_secs(10), stream.next()).await.unwrap().unwrap().unwrap();
            if event.r#type != WireEventType::Bookmark as i32 {
                break event;
            }
        };
        assert_eq!((next.kind.as_str(), next.r#type), ("Service", WireEventType::Added as i32));
    }
}
