//! Raft messages between replicas over tonic (JSON payloads; snapshot chunks as raw bytes), and
//! the fault injection the failover tests use: a replica can be cut off from the others.

use super::{NodeId, TypeConfig};
use crate::remote::{
    PeerToken,
    pb::{self, raft_service_client::RaftServiceClient, raft_service_server},
};
use openraft::{
    BasicNode, Raft,
    error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable},
    network::{RPCOption, RaftNetwork, RaftNetworkFactory},
    raft::{
        AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
        VoteResponse,
    },
};
use std::{
    collections::HashSet,
    sync::{Arc, RwLock},
    time::Duration,
};
use tonic::{Request, Response, Status, service::interceptor::InterceptedService, transport::Channel};

type Client = RaftServiceClient<InterceptedService<Channel, PeerToken>>;

/// Which replicas are cut off from the rest: messages to or from them are dropped, as a
/// network partition would. Empty in production.
#[derive(Clone, Default, Debug)]
pub struct Faults {
    isolated: Arc<RwLock<HashSet<NodeId>>>,
}

impl Faults {
    pub fn isolate(&self, node: NodeId) {
        self.isolated.write().unwrap_or_else(|e| e.into_inner()).insert(node);
    }

    pub fn heal(&self) {
        self.isolated.write().unwrap_or_else(|e| e.into_inner()).clear();
    }

    fn cut(&self, a: NodeId, b: NodeId) -> bool {
        let isolated = self.isolated.read().unwrap_or_else(|e| e.into_inner());
        isolated.contains(&a) || isolated.contains(&b)
    }
}

/// Makes one client per peer.
#[derive(Clone)]
pub struct Network {
    pub id: NodeId,
    pub faults: Faults,
    pub token: PeerToken,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> PeerClient {
        let endpoint = self
            .token
            .endpoint(&PeerToken::url(&node.addr))
            .map(|e| e.connect_timeout(Duration::from_millis(500)).tcp_nodelay(true).connect_lazy());
        let client = endpoint
            .inspect_err(|e| tracing::warn!(peer = target, error = %e, "cannot reach a peer"))
            .ok()
            .map(|channel| {
                RaftServiceClient::with_interceptor(channel, self.token.clone())
                    .max_decoding_message_size(256 << 20)
                    .max_encoding_message_size(256 << 20)
            });
        PeerClient { from: self.id, target, client, faults: self.faults.clone() }
    }
}

pub struct PeerClient {
    from: NodeId,
    target: NodeId,
    client: Option<Client>,
    faults: Faults,
}

type RpcResult<T, E = openraft::error::Infallible> = Result<T, RPCError<NodeId, BasicNode, RaftError<NodeId, E>>>;

impl PeerClient {
    fn client<E: std::error::Error>(&self) -> RpcResult<Client, E> {
        if self.faults.cut(self.from, self.target) {
            let e = std::io::Error::new(std::io::ErrorKind::NotConnected, "partitioned by fault injection");
            return Err(RPCError::Unreachable(Unreachable::new(&e)));
        }
        self.client.clone().ok_or_else(|| {
            let e = std::io::Error::new(std::io::ErrorKind::InvalidInput, "peer address is not a valid endpoint");
            RPCError::Unreachable(Unreachable::new(&e))
        })
    }

    /// Decodes a peer's answer: the JSON of `Result<T, RaftError<E>>`.
    fn answer<T, E>(&self, reply: Result<Response<pb::Payload>, Status>) -> RpcResult<T, E>
    where
        T: serde::de::DeserializeOwned,
        E: std::error::Error + serde::de::DeserializeOwned,
    {
        let payload = reply.map_err(|s| {
            if s.code() == tonic::Code::Unavailable {
                RPCError::Unreachable(Unreachable::new(&s))
            } else {
                RPCError::Network(NetworkError::new(&s))
            }
        })?;
        let result: Result<T, RaftError<NodeId, E>> =
            serde_json::from_slice(&payload.into_inner().json).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

fn payload<T: serde::Serialize>(value: &T) -> pb::Payload {
    pb::Payload { json: serde_json::to_vec(value).unwrap_or_default(), data: Vec::new() }
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>> {
        let mut client = self.client()?;
        let mut request = Request::new(payload(&rpc));
        request.set_timeout(option.hard_ttl());
        let reply = client.append_entries(request).await;
        self.answer(reply)
    }

    async fn install_snapshot(
        &mut self,
        mut rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, InstallSnapshotError> {
        let mut client = self.client()?;
        let data = std::mem::take(&mut rpc.data);
        let mut request = Request::new(pb::Payload { data, ..payload(&rpc) });
        request.set_timeout(option.hard_ttl());
        let reply = client.install_snapshot(request).await;
        self.answer(reply)
    }

    async fn vote(&mut self, rpc: VoteRequest<NodeId>, option: RPCOption) -> RpcResult<VoteResponse<NodeId>> {
        let mut client = self.client()?;
        let mut request = Request::new(payload(&rpc));
        request.set_timeout(option.hard_ttl());
        let reply = client.vote(request).await;
        self.answer(reply)
    }
}

/// Receives Raft messages for the local replica.
pub struct RaftServer {
    raft: Raft<TypeConfig>,
    id: NodeId,
    faults: Faults,
}

impl RaftServer {
    pub fn new(
        raft: Raft<TypeConfig>,
        id: NodeId,
        faults: Faults,
    ) -> raft_service_server::RaftServiceServer<RaftServer> {
        raft_service_server::RaftServiceServer::new(RaftServer { raft, id, faults })
            .max_decoding_message_size(256 << 20)
            .max_encoding_message_size(256 << 20)
    }

    /// An isolated replica hears nobody (the senders drop their side too; this covers senders
    /// whose fault set is not shared, such as other processes).
    fn check(&self) -> Result<(), Status> {
        if self.faults.cut(self.id, self.id) {
            return Err(Status::unavailable("partitioned by fault injection"));
        }
        Ok(())
    }
}

fn parse<T: serde::de::DeserializeOwned>(payload: &pb::Payload) -> Result<T, Status> {
    serde_json::from_slice(&payload.json).map_err(|e| Status::invalid_argument(format!("bad Raft message: {e}")))
}

#[tonic::async_trait]
impl raft_service_server::RaftService for RaftServer {
    async fn append_entries(&self, request: Request<pb::Payload>) -> Result<Response<pb::Payload>, Status> {
        self.check()?;
        let rpc: AppendEntriesRequest<TypeConfig> = parse(request.get_ref())?;
        Ok(Response::new(payload(&self.raft.append_entries(rpc).await)))
    }

    async fn vote(&self, request: Request<pb::Payload>) -> Result<Response<pb::Payload>, Status> {
        self.check()?;
        let rpc: VoteRequest<NodeId> = parse(request.get_ref())?;
        Ok(Response::new(payload(&self.raft.vote(rpc).await)))
    }

    async fn install_snapshot(&self, request: Request<pb::Payload>) -> Result<Response<pb::Payload>, Status> {
        self.check()?;
        let message = request.into_inner();
        let mut rpc: InstallSnapshotRequest<TypeConfig> = parse(&message)?;
        rpc.data = message.data;
        Ok(Response::new(payload(&self.raft.install_snapshot(rpc).await)))
    }
}
