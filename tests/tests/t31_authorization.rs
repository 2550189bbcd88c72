//! The authorization matrix: every service and method of a real `gitplane server`, called with
//! each credential there is (none, a wrong one, the peer token, the join token, node A's
//! credential on A's and on B's objects, the Git token, and an anonymous reader of the status
//! API), and the expected answer of each cell.

use anyhow::{Context, Result, ensure};
use gitplane_e2e::cluster::{Cluster, READ_BEARER, loopback_request};
use gitplane_proto::node::{
    CreateEventsRequest, EventType, HeartbeatRequest, NodeEvent, RegisterRequest, UpdateNodeStatusRequest,
    UpdatePodStatusRequest, WatchNetworkRequest, WatchPodConfigRequest, WatchPodsRequest,
    node_service_client::NodeServiceClient,
};
use gitplane_storage::remote::pb::{
    self, raft_service_client::RaftServiceClient, store_service_client::StoreServiceClient,
};
use serde_json::json;
use std::{fmt, net::SocketAddr, time::Duration};
use tonic::{Code, Request, Status, transport::Channel};

const DEADLINE: Duration = Duration::from_secs(60);

/// A credential a caller presents (or not).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Who {
    Nobody,
    Wrong,
    Peer,
    Join,
    NodeA,
    Git,
}

const EVERYONE: [Who; 6] = [Who::Nobody, Who::Wrong, Who::Peer, Who::Join, Who::NodeA, Who::Git];

struct Tokens {
    peer: String,
    join: String,
    node_a: String,
    git: String,
}

impl Tokens {
    fn of(&self, who: Who) -> Option<String> {
        match who {
            Who::Nobody => None,
            Who::Wrong => Some("wrong-token-0123456789abcdef".into()),
            Who::Peer => Some(self.peer.clone()),
            Who::Join => Some(self.join.clone()),
            Who::NodeA => Some(self.node_a.clone()),
            Who::Git => Some(self.git.clone()),
        }
    }

    fn request<T>(&self, who: Who, message: T) -> Request<T> {
        let mut request = Request::new(message);
        request.set_timeout(Duration::from_secs(10));
        if let Some(token) = self.of(who) {
            request.metadata_mut().insert("authorization", format!("Bearer {token}").parse().expect("ASCII token"));
        }
        request
    }
}

/// What a gRPC cell expects.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Expect {
    Grpc(Code),
    /// Authenticated: anything but Unauthenticated / PermissionDenied (the request itself may be
    /// nonsense, as an empty Raft message is).
    Admitted,
}

impl fmt::Debug for Expect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expect::Grpc(code) => write!(f, "{code:?}"),
            Expect::Admitted => f.write_str("admitted"),
        }
    }
}

/// The cells checked and the ones that differ.
#[derive(Default)]
struct Matrix {
    cells: usize,
    failures: Vec<String>,
}

fn grpc_outcome<T>(result: Result<T, Status>) -> Code {
    result.err().map_or(Code::Ok, |s| s.code())
}

impl Matrix {
    fn grpc(&mut self, service: &str, who: Who, expected: Expect, got: Code) {
        self.cells += 1;
        let ok = match expected {
            Expect::Grpc(code) => got == code,
            Expect::Admitted => !matches!(got, Code::Unauthenticated | Code::PermissionDenied),
        };
        if !ok {
            self.failures.push(format!("{service} as {who:?}: expected {expected:?}, got {got:?}"));
        }
    }

    fn http(&mut self, request: &str, who: Who, expected: u16, got: u16) {
        self.cells += 1;
        if got != expected {
            self.failures.push(format!("{request} as {who:?}: expected HTTP {expected}, got {got}"));
        }
    }
}

fn node_json(name: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}})).unwrap()
}

async fn channel(addr: SocketAddr) -> Result<Channel> {
    Ok(tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?.connect().await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t31_every_service_and_method_by_credential() -> Result<()> {
    gitplane_e2e::require_root()?;
    let cluster = tokio::task::block_in_place(|| -> Result<Cluster> {
        let cluster = Cluster::start(1, &[])?;
        cluster.leader(DEADLINE)?;
        Ok(cluster)
    })?;
    let addr = cluster.addrs[&1];
    let read = |name: &str| std::fs::read_to_string(cluster.dir.path().join(name)).map(|s| s.trim().to_owned());
    let mut tokens = Tokens {
        peer: read("peer-token")?,
        join: read("join-token")?,
        node_a: String::new(),
        git: read("replica-1/git-token")?,
    };
    let channel = channel(addr).await?;
    let mut nodes = NodeServiceClient::new(channel.clone());
    let mut store = StoreServiceClient::new(channel.clone());
    let mut raft = RaftServiceClient::new(channel.clone());

    // Nodes A and B join with the join token; A's credential is one of the callers.
    let a = nodes
        .register(tokens.request(Who::Join, RegisterRequest { node: node_json("node-a"), ..Default::default() }))
        .await?;
    let a = a.into_inner();
    tokens.node_a = a.credential.clone();
    nodes
        .register(tokens.request(Who::Join, RegisterRequest { node: node_json("node-b"), ..Default::default() }))
        .await?;
    // A Pod bound to each, reading a Secret of its own, written as the control plane would
    // (through the store, as a peer).
    let mut uids = Vec::new();
    for node in ["node-a", "node-b"] {
        let secret = json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": format!("secret-of-{node}"), "namespace": "default"}, "data": {"k": "dg=="}});
        let env =
            json!([{"name": "S", "valueFrom": {"secretKeyRef": {"name": format!("secret-of-{node}"), "key": "k"}}}]);
        let pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("on-{node}"), "namespace": "default"},
            "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i:1", "env": env}]}});
        let txn = serde_json::to_vec(&json!([{"Create": secret}, {"Create": pod}]))?;
        let reply = store.txn(tokens.request(Who::Peer, pb::Payload { json: txn, data: Vec::new() })).await?;
        let Some(pb::txn_reply::Outcome::Committed(committed)) = reply.into_inner().outcome else {
            anyhow::bail!("creating the Pod on {node} was not committed");
        };
        let committed: serde_json::Value = serde_json::from_slice(&committed)?;
        uids.push(committed["objects"][1]["metadata"]["uid"].as_str().context("uid")?.to_owned());
    }
    let pod_ip = a.pod_cidr.replace("0/24", "5");

    let mut m = Matrix::default();
    let peer_only = |who: Who| if who == Who::Peer { Expect::Admitted } else { Expect::Grpc(Code::Unauthenticated) };
    for who in EVERYONE {
        // The store service: the peer token only.
        let empty_txn = pb::Payload { json: b"[]".to_vec(), data: Vec::new() };
        m.grpc("Store/Txn", who, peer_only(who), grpc_outcome(store.txn(tokens.request(who, empty_txn)).await));
        let get = pb::GetRequest {
            kind: "Pod".into(),
            namespace: "default".into(),
            name: "on-node-a".into(),
            linearizable: false,
        };
        m.grpc("Store/Get", who, peer_only(who), grpc_outcome(store.get(tokens.request(who, get)).await));
        let list = pb::ListRequest { kind: "Secret".into(), ..Default::default() };
        m.grpc("Store/List", who, peer_only(who), grpc_outcome(store.list(tokens.request(who, list)).await));
        let watch = pb::WatchRequest { from_revision: 0, kinds: vec![], bookmarks: false, ..Default::default() };
        m.grpc("Store/Watch", who, peer_only(who), grpc_outcome(store.watch(tokens.request(who, watch)).await));
        m.grpc(
            "Store/Revision",
            who,
            peer_only(who),
            grpc_outcome(store.revision(tokens.request(who, pb::Empty {})).await),
        );
        m.grpc(
            "Store/ReadIndex",
            who,
            peer_only(who),
            grpc_outcome(store.read_index(tokens.request(who, pb::Empty {})).await),
        );

        // Raft: the peer token only (an empty message is nonsense, but only a peer learns that).
        let nonsense = || pb::Payload { json: b"{}".to_vec(), data: Vec::new() };
        m.grpc(
            "Raft/AppendEntries",
            who,
            peer_only(who),
            grpc_outcome(raft.append_entries(tokens.request(who, nonsense())).await),
        );
        m.grpc("Raft/Vote", who, peer_only(who), grpc_outcome(raft.vote(tokens.request(who, nonsense())).await));
        m.grpc(
            "Raft/InstallSnapshot",
            who,
            peer_only(who),
            grpc_outcome(raft.install_snapshot(tokens.request(who, nonsense())).await),
        );

        // The node service: the join token registers new nodes; a node acts for itself only.
        let unauthenticated = Expect::Grpc(Code::Unauthenticated);
        let by_node = |own: Expect, joiner: Expect| match who {
            Who::NodeA => own,
            Who::Join => joiner,
            _ => unauthenticated,
        };
        let register =
            |name: &str| tokens.request(who, RegisterRequest { node: node_json(name), ..Default::default() });
        let expected = by_node(Expect::Grpc(Code::Ok), Expect::Grpc(Code::PermissionDenied));
        m.grpc("Node/Register(own name, alive)", who, expected, grpc_outcome(nodes.register(register("node-a")).await));
        let expected = by_node(Expect::Grpc(Code::PermissionDenied), Expect::Grpc(Code::PermissionDenied));
        m.grpc("Node/Register(B's name)", who, expected, grpc_outcome(nodes.register(register("node-b")).await));
        let expected = by_node(Expect::Grpc(Code::PermissionDenied), Expect::Grpc(Code::Ok));
        let new_name = format!("node-new-{who:?}").to_lowercase();
        m.grpc("Node/Register(new name)", who, expected, grpc_outcome(nodes.register(register(&new_name)).await));
        let expected = by_node(Expect::Grpc(Code::Ok), Expect::Grpc(Code::PermissionDenied));
        let network = tokens.request(who, WatchNetworkRequest { resource_version: 0 });
        m.grpc("Node/WatchNetwork", who, expected, grpc_outcome(nodes.watch_network(network).await));
        for (node, own) in [("node-a", true), ("node-b", false)] {
            let expected = by_node(
                if own { Expect::Grpc(Code::Ok) } else { Expect::Grpc(Code::PermissionDenied) },
                Expect::Grpc(Code::PermissionDenied),
            );
            let beat = tokens.request(who, HeartbeatRequest { node_name: node.into() });
            m.grpc(&format!("Node/Heartbeat({node})"), who, expected, grpc_outcome(nodes.heartbeat(beat).await));
            let report = UpdateNodeStatusRequest { node_name: node.into(), status: b"{}".to_vec() };
            let got = grpc_outcome(nodes.update_node_status(tokens.request(who, report)).await);
            m.grpc(&format!("Node/UpdateNodeStatus({node})"), who, expected, got);
            let watch = tokens.request(who, WatchPodsRequest { node_name: node.into(), resource_version: 0 });
            m.grpc(&format!("Node/WatchPods({node})"), who, expected, grpc_outcome(nodes.watch_pods(watch).await));
            let status = json!({"phase": "Running", "podIP": pod_ip});
            let report = UpdatePodStatusRequest {
                namespace: "default".into(),
                name: format!("on-{node}"),
                uid: uids[usize::from(!own)].clone(),
                status: serde_json::to_vec(&status)?,
            };
            let got = grpc_outcome(nodes.update_pod_status(tokens.request(who, report)).await);
            m.grpc(&format!("Node/UpdatePodStatus(Pod on {node})"), who, expected, got);
            // Events, as node A, about a Pod on A or on B (NodeRestriction: its own Pods only).
            let involved = json!({"kind": "Pod", "namespace": "default", "name": format!("on-{node}")});
            let event = NodeEvent {
                involved_object: serde_json::to_vec(&involved)?,
                r#type: "Normal".into(),
                reason: "Started".into(),
                message: "Started container c".into(),
                time_unix_millis: 0,
            };
            let events = CreateEventsRequest { node_name: "node-a".into(), events: vec![event] };
            let got = grpc_outcome(nodes.create_events(tokens.request(who, events)).await);
            m.grpc(&format!("Node/CreateEvents(Pod on {node})"), who, expected, got);
            let config = tokens.request(who, WatchPodConfigRequest { node_name: node.into() });
            let got = grpc_outcome(nodes.watch_pod_config(config).await);
            m.grpc(&format!("Node/WatchPodConfig({node})"), who, expected, got);
        }
    }
    // Node A reads the Secret its own Pod references, never the one only node B's Pod does
    // (the node authorizer): that Secret is not in A's stream.
    let config = tokens.request(Who::NodeA, WatchPodConfigRequest { node_name: "node-a".into() });
    let mut stream = nodes.watch_pod_config(config).await?.into_inner();
    let mut listed = Vec::new();
    while let Some(event) = tokio::time::timeout(DEADLINE, stream.message()).await?? {
        if event.r#type == EventType::Bookmark as i32 {
            break;
        }
        let object: serde_json::Value = serde_json::from_slice(&event.object)?;
        listed.push(format!("{} {}", event.kind, object["metadata"]["name"].as_str().unwrap_or_default()));
    }
    // Besides its Secret, every Pod references the cluster CA its token volume projects.
    listed.sort();
    ensure!(listed == ["ConfigMap kube-root-ca.crt", "Secret secret-of-node-a"], "node A's pod config: {listed:?}");
    let got = if listed.iter().any(|o| o.ends_with("secret-of-node-b")) { Code::Ok } else { Code::PermissionDenied };
    m.grpc(
        "Node/WatchPodConfig(a Secret only node B's Pod references)",
        Who::NodeA,
        Expect::Grpc(Code::PermissionDenied),
        got,
    );
    // A Pod IP outside the node's podCIDR is refused even to the node itself.
    let report = UpdatePodStatusRequest {
        namespace: "default".into(),
        name: "on-node-a".into(),
        uid: uids[0].clone(),
        status: serde_json::to_vec(&json!({"phase": "Running", "podIP": "10.9.9.9"}))?,
    };
    let got = grpc_outcome(nodes.update_pod_status(tokens.request(Who::NodeA, report)).await);
    m.grpc("Node/UpdatePodStatus(foreign IP)", Who::NodeA, Expect::Grpc(Code::PermissionDenied), got);

    // A node may not give itself a label reserved for the cluster's owner.
    let mut labelled: serde_json::Value = serde_json::from_slice(&node_json("node-a"))?;
    labelled["metadata"]["labels"] = json!({"node-restriction.kubernetes.io/pci": "true"});
    let register = RegisterRequest { node: serde_json::to_vec(&labelled)?, ..Default::default() };
    let got = grpc_outcome(nodes.register(tokens.request(Who::NodeA, register)).await);
    m.grpc("Node/Register(own name, reserved label)", Who::NodeA, Expect::Grpc(Code::PermissionDenied), got);

    // HTTP: Git needs the Git token for reads and pushes; the status API needs a token of its
    // own (none of the others opens it), and is read-only for that too.
    tokio::task::block_in_place(|| -> Result<()> {
        for who in EVERYONE {
            let auth = tokens.of(who).map(|t| format!("Bearer {t}"));
            let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("Authorization", a.as_str())).collect();
            for service in ["git-upload-pack", "git-receive-pack"] {
                let path = format!("/git/bootstrap.git/info/refs?service={service}");
                let (code, _) = loopback_request(addr, "GET", &path, &headers, b"")?;
                // The repository does not exist: the Git token learns that (404), nobody else does.
                m.http(&format!("GET {path}"), who, if who == Who::Git { 404 } else { 401 }, code);
            }
            let (code, _) = loopback_request(addr, "GET", "/api/v1/pods", &headers, b"")?;
            m.http("GET /api/v1/pods", who, 401, code);
            let path = "/api/v1/namespaces/default/pods/on-node-a";
            let (code, _) = loopback_request(addr, "DELETE", path, &headers, b"")?;
            m.http("DELETE a Pod", who, 401, code);
            let (code, _) = loopback_request(addr, "POST", "/hooks/generic", &headers, b"{}")?;
            m.http("POST /hooks/generic (no webhook secret configured)", who, 401, code);
        }
        Ok(())
    })?;
    tokio::task::block_in_place(|| -> Result<()> {
        let (code, _) = loopback_request(addr, "GET", "/api/v1/pods", &[READ_BEARER], b"")?;
        m.http("GET /api/v1/pods (status API read token)", Who::Nobody, 200, code);
        let (code, _) =
            loopback_request(addr, "DELETE", "/api/v1/namespaces/default/pods/on-node-a", &[READ_BEARER], b"")?;
        m.http("DELETE a Pod (status API read token)", Who::Nobody, 405, code);
        Ok(())
    })?;
    println!("authorization matrix: {} cells", m.cells);
    ensure!(m.failures.is_empty(), "{} of {} cells differ:\n{}", m.failures.len(), m.cells, m.failures.join("\n"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t31_an_unauthenticated_large_message_is_refused_before_it_is_read() -> Result<()> {
    gitplane_e2e::require_root()?;
    let cluster = tokio::task::block_in_place(|| -> Result<Cluster> {
        let cluster = Cluster::start(1, &[])?;
        cluster.leader(DEADLINE)?;
        Ok(cluster)
    })?;
    let mut raft = RaftServiceClient::new(channel(cluster.addrs[&1]).await?).max_encoding_message_size(usize::MAX);
    let big = pb::Payload { json: vec![b' '; 64 << 20], data: Vec::new() };
    let started = std::time::Instant::now();
    let code = grpc_outcome(raft.append_entries(Request::new(big)).await);
    ensure!(code == Code::Unauthenticated, "a 64 MiB AppendEntries without the peer token: {code:?}");
    ensure!(started.elapsed() < Duration::from_secs(10), "refused after {:?}", started.elapsed());
    Ok(())
}
