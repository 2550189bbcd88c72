//! The writes of a 5,000-node cluster scheduling Pods, on the store and on etcd: node Lease
//! renewals, Pod binds and Pod status updates, each a compare-and-swap on the object's last
//! revision, as kube-apiserver's `GuaranteedUpdate` makes them. Both systems get the same JSON:
//! the store `Op::Update` / `Op::UpdateStatus` carrying `resourceVersion` (a bind is the
//! scheduler's one `Op::UpdateWithStatus`: the Pod with `spec.nodeName` and its status); etcd
//! a `Txn` that compares the key's `mod_revision`, puts the object (without `resourceVersion`, as
//! kube-apiserver stores it) and reads the key instead when the compare fails.
//!
//! The proportions: 5,000 nodes renew their Leases every 10 s (500/s) while Pods are scheduled at
//! the goal's 3,000/s, each bound once and reported Running once (as the hollow nodes report it),
//! so 500 : 3,000 : 3,000 and every client repeats one renewal, six binds and six status updates.
//! The objects exist beforehand (5,000 Leases, SchedulingBasic's 10,000 Pods), each written by
//! one client only, and a Pod is bound again to another node after it ran: the store's work per
//! write is the same whether `nodeName` was set before. Neither carries an ownerReference: there
//! are no Nodes or ReplicaSets, and the server's garbage collector would delete them.

use crate::{
    etcd::pb as etcdpb,
    load::{LoopClient, WRITE_TIMEOUT, Writer},
};
use anyhow::{Context as _, Result, ensure};
use gitplane_storage::remote::pb;
use gitplane_store::{ObjectKey, Op};
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};
use tonic::transport::Channel;

/// A 5,000-node cluster's node Leases.
pub const LEASES: usize = 5000;
/// SchedulingBasic's Pods at 5,000 nodes.
pub const PODS: usize = 10_000;
/// Objects per creating transaction (etcd refuses more than 128 operations in one).
const CREATES_PER_TXN: usize = 100;
const NAMESPACE: &str = crate::load::NAMESPACE;

#[derive(Clone, Copy)]
enum Write {
    Renew,
    Bind,
    Status,
}

/// One client's writes, repeated: 1 : 6 : 6.
const CYCLE: [Write; 13] = {
    use Write::*;
    [Renew, Bind, Status, Bind, Status, Bind, Status, Bind, Status, Bind, Status, Bind, Status]
};

/// An object and the revision it was last written at.
pub struct Object {
    value: Value,
    revision: i64,
}

/// Both kinds, created in [`create`] and dealt to the clients.
pub struct Objects {
    leases: Vec<Object>,
    pods: Vec<Object>,
}

impl Objects {
    /// The JSON sizes, in bytes: a Lease, a Pod Running.
    pub fn sizes(&self) -> (usize, usize) {
        let size = |o: Option<&Object>| o.map_or(0, |o| o.value.to_string().len());
        (size(self.leases.first()), size(self.pods.first()))
    }
}

/// Creates the Leases and the Pods (bound and Running), in transactions of [`CREATES_PER_TXN`].
pub async fn create(writer: &mut Writer) -> Result<Objects> {
    let now = now();
    let leases: Vec<Value> = (0..LEASES).map(|i| lease(i, &now)).collect();
    let pods: Vec<Value> = (0..PODS).map(|i| running(pod(i, i % LEASES), &now)).collect();
    let mut created = Vec::with_capacity(LEASES + PODS);
    for chunk in leases.into_iter().chain(pods).collect::<Vec<_>>().chunks(CREATES_PER_TXN) {
        let revision = match writer {
            Writer::Gitplane(client) => {
                let ops: Vec<Op> = chunk.iter().cloned().map(Op::Create).collect();
                let request = pb::Payload { json: serde_json::to_vec(&ops)?, data: Vec::new() };
                committed(client.txn(request).await?.into_inner()).map_err(anyhow::Error::msg)?
            }
            Writer::Etcd(client) => {
                let success: Result<Vec<_>> =
                    chunk.iter().map(|v| put(v).map(|p| request(etcd_op::Request::RequestPut(p)))).collect();
                let txn = etcdpb::TxnRequest { compare: Vec::new(), success: success?, failure: Vec::new() };
                let reply = client.txn(txn).await?.into_inner();
                ensure!(reply.succeeded, "creating the objects failed");
                reply.header.context("etcd's reply has no header")?.revision
            }
        };
        created.extend(chunk.iter().map(|value| Object { value: value.clone(), revision }));
    }
    let pods = created.split_off(LEASES);
    Ok(Objects { leases: created, pods })
}

/// `count` clients over `channels`, each with its share of the objects, their cycles staggered.
pub fn clients(
    writer: impl Fn(Channel) -> Writer,
    channels: &[Channel],
    count: usize,
    objects: Objects,
) -> Vec<Client> {
    let mut clients: Vec<Client> = (0..count)
        .map(|c| Client {
            writer: writer(channels[c % channels.len()].clone()),
            leases: Vec::new(),
            pods: Vec::new(),
            step: c % CYCLE.len(),
            lease: 0,
            pod: 0,
            binds: c,
        })
        .collect();
    for (i, lease) in objects.leases.into_iter().enumerate() {
        clients[i % count].leases.push(lease);
    }
    for (i, pod) in objects.pods.into_iter().enumerate() {
        clients[i % count].pods.push(pod);
    }
    clients
}

/// The objects back from the clients, at their last revisions.
pub fn objects(clients: Vec<Client>) -> Objects {
    let (mut leases, mut pods) = (Vec::new(), Vec::new());
    for client in clients {
        leases.extend(client.leases);
        pods.extend(client.pods);
    }
    Objects { leases, pods }
}

pub struct Client {
    writer: Writer,
    leases: Vec<Object>,
    pods: Vec<Object>,
    step: usize,
    /// The next Lease to renew; the Pod bound last (its status comes next).
    lease: usize,
    pod: usize,
    binds: usize,
}

impl LoopClient for Client {
    async fn write(&mut self) -> Result<(), String> {
        let write = CYCLE[self.step % CYCLE.len()];
        self.step += 1;
        let now = now();
        match write {
            Write::Renew => {
                let at = self.lease % self.leases.len();
                let lease = &mut self.leases[at];
                self.lease += 1;
                lease.value["spec"]["renewTime"] = now.into();
                cas(&mut self.writer, lease, Write::Renew).await
            }
            Write::Bind => {
                self.pod = (self.pod + 1) % self.pods.len();
                self.binds += 1;
                let pod = &mut self.pods[self.pod];
                pod.value["spec"]["nodeName"] = format!("node-{}", self.binds % LEASES).into();
                pod.value["status"] = json!({"phase": "Pending", "qosClass": "Guaranteed", "conditions": [
                    condition("PodScheduled", &now)
                ]});
                cas(&mut self.writer, pod, Write::Bind).await
            }
            Write::Status => {
                let pod = &mut self.pods[self.pod];
                pod.value = running(std::mem::take(&mut pod.value), &now);
                cas(&mut self.writer, pod, Write::Status).await
            }
        }
    }
}

/// One compare-and-swap of `object` on its last revision; on a conflict the revision is read
/// again (the write counts as failed).
async fn cas(writer: &mut Writer, object: &mut Object, write: Write) -> Result<(), String> {
    let error = |s: tonic::Status| format!("{:?}: {}", s.code(), s.message());
    match writer {
        Writer::Gitplane(client) => {
            let mut value = object.value.clone();
            value["metadata"]["resourceVersion"] = object.revision.to_string().into();
            let ops = match write {
                Write::Renew => vec![Op::Update(value)],
                Write::Status => vec![Op::UpdateStatus(value)],
                Write::Bind => vec![Op::UpdateWithStatus(value)],
            };
            let json = serde_json::to_vec(&ops).map_err(|e| e.to_string())?;
            let mut request = tonic::Request::new(pb::Payload { json, data: Vec::new() });
            request.set_timeout(WRITE_TIMEOUT);
            let reply = client.txn(request).await.map_err(error)?.into_inner();
            match committed(reply) {
                Ok(revision) => {
                    object.revision = revision;
                    Ok(())
                }
                Err(rejected) => {
                    let key = ObjectKey::from_value(&object.value).map_err(|e| e.to_string())?;
                    let request = pb::GetRequest {
                        kind: key.kind,
                        namespace: key.namespace,
                        name: key.name,
                        linearizable: false,
                    };
                    let mut request = tonic::Request::new(request);
                    request.set_timeout(WRITE_TIMEOUT);
                    let stored = client.get(request).await.map_err(error)?.into_inner();
                    let stored: Value = serde_json::from_slice(&stored.json).map_err(|e| e.to_string())?;
                    object.revision = gitplane_api::object::resource_version(&stored).unwrap_or(object.revision);
                    Err(rejected)
                }
            }
        }
        Writer::Etcd(client) => {
            let put = put(&object.value).map_err(|e| e.to_string())?;
            let compare = etcdpb::Compare {
                result: etcdpb::compare::CompareResult::Equal as i32,
                target: etcdpb::compare::CompareTarget::Mod as i32,
                key: put.key.clone(),
                target_union: Some(etcdpb::compare::TargetUnion::ModRevision(object.revision)),
            };
            let get = etcdpb::RangeRequest { key: put.key.clone(), range_end: Vec::new() };
            let txn = etcdpb::TxnRequest {
                compare: vec![compare],
                success: vec![request(etcd_op::Request::RequestPut(put))],
                failure: vec![request(etcd_op::Request::RequestRange(get))],
            };
            let mut request = tonic::Request::new(txn);
            request.set_timeout(WRITE_TIMEOUT);
            let reply = client.txn(request).await.map_err(error)?.into_inner();
            if reply.succeeded {
                object.revision = reply.header.map_or(object.revision, |h| h.revision);
                return Ok(());
            }
            let stored = reply.responses.into_iter().find_map(|r| match r.response? {
                etcdpb::response_op::Response::ResponseRange(range) => range.kvs.into_iter().next(),
                _ => None,
            });
            object.revision = stored.map_or(object.revision, |kv| kv.mod_revision);
            Err("conflict: mod_revision changed".into())
        }
    }
}

use etcdpb::request_op as etcd_op;

fn request(request: etcd_op::Request) -> etcdpb::RequestOp {
    etcdpb::RequestOp { request: Some(request) }
}

/// The etcd put of `value` under kube-apiserver's key (`/registry/<resource>/<namespace>/<name>`).
fn put(value: &Value) -> Result<etcdpb::PutRequest> {
    let resource = match value["kind"].as_str() {
        Some("Lease") => "leases",
        _ => "pods",
    };
    let meta = &value["metadata"];
    let (namespace, name) = (meta["namespace"].as_str().unwrap_or(""), meta["name"].as_str().unwrap_or(""));
    let key = format!("/registry/{resource}/{namespace}/{name}");
    Ok(etcdpb::PutRequest { key: key.into_bytes(), value: serde_json::to_vec(value)?, ..Default::default() })
}

/// The revision of a committed transaction; the rejection's text otherwise.
fn committed(reply: pb::TxnReply) -> Result<i64, String> {
    #[derive(serde::Deserialize)]
    struct Committed {
        revision: i64,
    }
    match reply.outcome {
        Some(pb::txn_reply::Outcome::Committed(json)) => {
            serde_json::from_slice::<Committed>(&json).map(|c| c.revision).map_err(|e| format!("unreadable reply: {e}"))
        }
        Some(pb::txn_reply::Outcome::Rejected(r)) => Err(format!("rejected: {}", String::from_utf8_lossy(&r))),
        None => Err("empty reply".into()),
    }
}

/// Now, as a MicroTime (what a Lease's renewTime and the times of a Pod's status are written as).
fn now() -> String {
    format!("{:.6}", Timestamp::now())
}

fn uid(kind: u8, i: usize) -> String {
    format!("{kind:08x}-0000-4000-8000-{i:012x}")
}

/// A node's Lease, as the kubelet creates it in `kube-node-lease`.
fn lease(i: usize, now: &str) -> Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": format!("node-{i}"), "namespace": "kube-node-lease", "uid": uid(1, i),
                     "creationTimestamp": now},
        "spec": {"holderIdentity": format!("node-{i}"), "leaseDurationSeconds": 40, "renewTime": now}
    })
}

/// scheduler_perf's Pod as kube-apiserver stores it (defaults filled in), bound to `node`.
fn pod(i: usize, node: usize) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("pod-{i}"), "namespace": NAMESPACE, "uid": uid(2, i),
                     "generateName": "pod-", "creationTimestamp": "2026-01-01T00:00:00Z",
                     "labels": {"app": "scheduling-basic", "pod-template-hash": "5d8c7b9f4"}},
        "spec": {
            "containers": [{
                "name": "pause", "image": "registry.k8s.io/pause:3.10", "imagePullPolicy": "IfNotPresent",
                "resources": {"limits": {"cpu": "100m", "memory": "500Mi"}, "requests": {"cpu": "100m", "memory": "500Mi"}},
                "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File"
            }],
            "dnsPolicy": "ClusterFirst", "enableServiceLinks": true, "nodeName": format!("node-{node}"),
            "preemptionPolicy": "PreemptLowerPriority", "priority": 0, "restartPolicy": "Always",
            "schedulerName": "default-scheduler", "securityContext": {}, "serviceAccountName": "default",
            "terminationGracePeriodSeconds": 30,
            "tolerations": [
                {"effect": "NoExecute", "key": "node.kubernetes.io/not-ready", "operator": "Exists", "tolerationSeconds": 300},
                {"effect": "NoExecute", "key": "node.kubernetes.io/unreachable", "operator": "Exists", "tolerationSeconds": 300}
            ]
        }
    })
}

fn condition(kind: &str, now: &str) -> Value {
    json!({"type": kind, "status": "True", "lastProbeTime": null, "lastTransitionTime": now})
}

/// `pod` reported Running and Ready by its node's kubelet.
fn running(mut pod: Value, now: &str) -> Value {
    let node = pod["spec"]["nodeName"].as_str().and_then(|n| n.strip_prefix("node-")?.parse().ok()).unwrap_or(0usize);
    let (host, ip) =
        (format!("10.0.{}.{}", node / 250, node % 250), format!("10.128.{}.{}", node % 250, node / 250 + 2));
    let id = format!("{:0>64}", pod["metadata"]["uid"].as_str().unwrap_or_default().replace('-', ""));
    let conditions: Vec<Value> =
        ["PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled"]
            .iter()
            .map(|c| condition(c, now))
            .collect();
    pod["status"] = json!({
        "phase": "Running", "conditions": conditions, "qosClass": "Guaranteed",
        "hostIP": host, "hostIPs": [{"ip": host}], "podIP": ip, "podIPs": [{"ip": ip}], "startTime": now,
        "containerStatuses": [{
            "name": "pause", "ready": true, "started": true, "restartCount": 0,
            "image": "registry.k8s.io/pause:3.10", "imageID": format!("registry.k8s.io/pause@sha256:{id}"),
            "containerID": format!("containerd://{id}"), "state": {"running": {"startedAt": now}}, "lastState": {}
        }]
    });
    pod
}
