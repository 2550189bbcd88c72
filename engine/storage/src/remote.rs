//! The store over gRPC: [`StoreServer`] serves any [`Store`] (a replica's), [`RemoteStore`] is a
//! [`Store`] that talks to one or more replicas and fails over between them.
//!
//! Failures keep their meaning across the wire: a rejection is a `TxnReply.rejected`;
//! `NotLeader` (safe to resend) and `Expired` travel as status codes with metadata. A transport
//! failure after a transaction was sent is an unknown outcome and is never retried here.
//!
//! With a [`PeerToken`], the store and Raft services admit only requests that carry it
//! (`authorization: Bearer <token>`), and the clients here send it: the token is what the
//! replicas of a cluster share. Over TLS the clients also present the replica's certificate
//! (mutual TLS, as etcd's peers do), which the replica's listener requires of these services.

use futures::StreamExt;
use gitplane_store::{
    Committed, Event, EventType, List, ListOptions, ObjectKey, Op, Rejection, Result, Revision, Store, StoreError,
    WatchOptions, WatchStream,
};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};
use subtle::ConstantTimeEq;
use tonic::{
    Code, Request, Response, Status,
    metadata::{Ascii, MetadataValue},
    service::{Interceptor, interceptor::InterceptedService},
    transport::Channel,
};

pub mod pb {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("gitplane.store.v1");
}

use pb::{store_service_client::StoreServiceClient, store_service_server};

const NOT_LEADER: &str = "gitplane-not-leader";
const EXPIRED: &str = "gitplane-expired";

fn to_status(e: StoreError) -> Status {
    match e {
        StoreError::Fenced { .. } => {
            let mut status = Status::unavailable(e.to_string());
            status.metadata_mut().insert(NOT_LEADER, MetadataValue::from_static("1"));
            status
        }
        StoreError::NotLeader(message) => {
            let mut status = Status::unavailable(message);
            status.metadata_mut().insert(NOT_LEADER, MetadataValue::from_static("1"));
            status
        }
        StoreError::Expired { requested, compacted } => {
            let mut status = Status::out_of_range(e.to_string());
            if let Ok(v) = format!("{requested},{compacted}").parse() {
                status.metadata_mut().insert(EXPIRED, v);
            }
            status
        }
        StoreError::BadRequest(m) => Status::invalid_argument(m),
        StoreError::Rejected(r) => Status::failed_precondition(r.to_string()),
        other => Status::unavailable(other.to_string()),
    }
}

fn from_status(status: Status) -> StoreError {
    if status.metadata().get(NOT_LEADER).is_some() {
        return StoreError::NotLeader(status.message().to_owned());
    }
    if let Some((requested, compacted)) = status
        .metadata()
        .get(EXPIRED)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(','))
        .and_then(|(r, c)| Some((r.parse().ok()?, c.parse().ok()?)))
    {
        return StoreError::Expired { requested, compacted };
    }
    match status.code() {
        Code::InvalidArgument => StoreError::BadRequest(status.message().to_owned()),
        _ => StoreError::Unavailable(format!("{}: {}", status.code(), status.message())),
    }
}

fn json<T: serde::Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).unwrap_or_default()
}

fn parse<T: serde::de::DeserializeOwned>(what: &str, bytes: &[u8]) -> Result<T, Status> {
    serde_json::from_slice(bytes).map_err(|e| Status::invalid_argument(format!("{what} is not valid JSON: {e}")))
}

/// The secret a cluster's replicas (and its operators' tools) share to use the store and Raft
/// services. There is no open mode: every replica has one (`gitplane` makes it on first start).
///
/// It also carries the cluster CA's certificate, which peers verify each other's serving
/// certificates against: whoever holds the token talks to the replicas, so it goes with it.
#[derive(Clone)]
pub struct PeerToken {
    /// `Bearer <token>`, as clients send it.
    header: MetadataValue<Ascii>,
    /// Its SHA-256, which servers compare in constant time.
    digest: [u8; 32],
    /// The cluster CA's certificate (PEM), for `https://` endpoints.
    ca: Option<Arc<str>>,
    /// The client certificate (chain) and key (PEM) presented to `https://` endpoints.
    identity: Option<(Arc<str>, Arc<str>)>,
}

/// Whether a replica serves `host` (an address or a name) over TLS: every address but loopback,
/// which stays plain HTTP (the local appliance's, and what only this machine reaches). The
/// replica's listener and its peers' clients decide with this one rule.
pub fn serves_tls(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    match host.parse::<std::net::IpAddr>() {
        Ok(ip) => !ip.is_loopback(),
        Err(_) => host != "localhost",
    }
}

impl PeerToken {
    /// A token of printable ASCII, without spaces (as a generated hex string is).
    pub fn new(token: &str) -> Result<PeerToken> {
        let token = token.trim();
        if token.len() < 16 || !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(StoreError::BadRequest(
                "the peer token must be at least 16 printable ASCII characters without spaces \
                 (e.g. the output of `openssl rand -hex 32`)"
                    .into(),
            ));
        }
        let header = format!("Bearer {token}");
        let digest = Sha256::digest(header.as_bytes()).into();
        let header = header.parse().map_err(|_| StoreError::BadRequest("the peer token is not valid ASCII".into()))?;
        Ok(PeerToken { header, digest, ca: None, identity: None })
    }

    /// The cluster CA (PEM) that `https://` endpoints are verified against.
    pub fn with_ca(mut self, ca_pem: &str) -> PeerToken {
        self.ca = Some(ca_pem.into());
        self
    }

    /// The certificate (PEM chain) and key (PEM) that `https://` endpoints are shown: a
    /// replica's own, which its peers require.
    pub fn with_identity(mut self, chain_pem: &str, key_pem: &str) -> PeerToken {
        self.identity = Some((chain_pem.into(), key_pem.into()));
        self
    }

    /// The URL of a replica at `host:port`, by [`serves_tls`].
    pub fn url(addr: &str) -> String {
        let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
        let scheme = if serves_tls(host) { "https" } else { "http" };
        format!("{scheme}://{addr}")
    }

    /// A channel endpoint for `url`: an `https://` one trusts the cluster CA only.
    pub fn endpoint(&self, url: &str) -> Result<tonic::transport::Endpoint> {
        let endpoint = tonic::transport::Endpoint::from_shared(url.to_owned())
            .map_err(|err| StoreError::BadRequest(format!("store endpoint {url:?}: {err}")))?;
        if !url.starts_with("https://") {
            return Ok(endpoint);
        }
        let ca = self.ca.as_deref().ok_or_else(|| {
            StoreError::BadRequest(format!("store endpoint {url:?} is HTTPS but no cluster CA certificate was given"))
        })?;
        let mut tls =
            tonic::transport::ClientTlsConfig::new().ca_certificate(tonic::transport::Certificate::from_pem(ca));
        if let Some((chain, key)) = &self.identity {
            tls = tls.identity(tonic::transport::Identity::from_pem(chain.as_bytes(), key.as_bytes()));
        }
        endpoint.tls_config(tls).map_err(|err| StoreError::BadRequest(format!("store endpoint {url:?}: {err}")))
    }

    /// The server side: `service` admits only requests that carry this token.
    pub fn require<S>(&self, service: S) -> InterceptedService<S, RequireToken> {
        InterceptedService::new(service, self.checker())
    }

    /// The check [`PeerToken::require`] runs on every request (benchmarks measure it alone).
    pub fn checker(&self) -> RequireToken {
        RequireToken(self.digest)
    }
}

// Never print the token.
impl std::fmt::Debug for PeerToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PeerToken(***)")
    }
}

/// The client side: every request carries the token.
impl Interceptor for PeerToken {
    fn call(&mut self, mut request: Request<()>) -> std::result::Result<Request<()>, Status> {
        request.metadata_mut().insert("authorization", self.header.clone());
        Ok(request)
    }
}

/// Refuses requests without the cluster's token (see [`PeerToken::require`]).
#[derive(Clone)]
pub struct RequireToken([u8; 32]);

impl Interceptor for RequireToken {
    fn call(&mut self, request: Request<()>) -> std::result::Result<Request<()>, Status> {
        let expected = &self.0;
        let given = request.metadata().get("authorization").map(|v| v.as_bytes()).unwrap_or_default();
        // Comparing digests keeps the comparison constant-time whatever the lengths.
        if bool::from(Sha256::digest(given).ct_eq(expected)) {
            Ok(request)
        } else {
            Err(Status::unauthenticated(
                "this replica's store and Raft services need the cluster's peer token \
                 (authorization: Bearer <token>, the content of --peer-token-file)",
            ))
        }
    }
}

/// A store service client that sends the peer token.
pub type StoreClient = StoreServiceClient<InterceptedService<Channel, PeerToken>>;

/// Serves a store to clients and to follower replicas forwarding writes.
pub struct StoreServer {
    store: Arc<dyn Store>,
}

impl StoreServer {
    pub fn new(store: Arc<dyn Store>) -> store_service_server::StoreServiceServer<StoreServer> {
        store_service_server::StoreServiceServer::new(StoreServer { store })
            .max_decoding_message_size(64 << 20)
            .max_encoding_message_size(64 << 20)
    }
}

type EventStream = std::pin::Pin<Box<dyn futures::Stream<Item = Result<pb::WatchEvent, Status>> + Send>>;

#[tonic::async_trait]
impl store_service_server::StoreService for StoreServer {
    async fn txn(&self, request: Request<pb::Payload>) -> Result<Response<pb::TxnReply>, Status> {
        let ops: Vec<Op> = parse("transaction", &request.get_ref().json)?;
        let outcome = match self.store.txn(ops).await {
            Ok(committed) => pb::txn_reply::Outcome::Committed(json(&committed)),
            Err(StoreError::Rejected(r)) => pb::txn_reply::Outcome::Rejected(json(&r)),
            Err(e) => return Err(to_status(e)),
        };
        Ok(Response::new(pb::TxnReply { outcome: Some(outcome) }))
    }

    async fn get(&self, request: Request<pb::GetRequest>) -> Result<Response<pb::Payload>, Status> {
        let r = request.into_inner();
        if r.linearizable {
            self.store.barrier().await.map_err(to_status)?;
        }
        let object = self.store.get(&ObjectKey::new(r.kind, r.namespace, r.name)).await.map_err(to_status)?;
        Ok(Response::new(pb::Payload { json: object.map(|o| json(&o)).unwrap_or_default(), data: Vec::new() }))
    }

    async fn list(&self, request: Request<pb::ListRequest>) -> Result<Response<pb::ListReply>, Status> {
        let r = request.into_inner();
        if r.linearizable {
            self.store.barrier().await.map_err(to_status)?;
        }
        let options = ListOptions {
            namespace: r.namespace,
            label_selector: r.label_selector,
            limit: r.limit.map(|l| usize::try_from(l).unwrap_or(usize::MAX)),
            continue_token: r.continue_token,
            at_revision: r.at_revision,
        };
        let list = self.store.list(&r.kind, &options).await.map_err(to_status)?;
        Ok(Response::new(pb::ListReply {
            revision: list.revision,
            items: list.items.iter().map(json).collect(),
            continue_token: list.continue_token,
        }))
    }

    type WatchStream = EventStream;

    async fn watch(&self, request: Request<pb::WatchRequest>) -> Result<Response<EventStream>, Status> {
        let r = request.into_inner();
        let kinds = (!r.kinds.is_empty()).then_some(r.kinds);
        let bookmark_interval = (r.bookmark_interval_ms > 0).then(|| Duration::from_millis(r.bookmark_interval_ms));
        let events = self
            .store
            .watch(r.from_revision, WatchOptions { kinds, bookmarks: r.bookmarks, bookmark_interval })
            .await
            .map_err(to_status)?;
        let stream = events.map(|event| {
            event.map_err(to_status).map(|e| pb::WatchEvent {
                revision: e.revision,
                r#type: e.event_type.as_str().to_owned(),
                kind: e.key.kind,
                namespace: e.key.namespace,
                name: e.key.name,
                object: if e.object.is_null() { Vec::new() } else { json(&e.object) },
            })
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn revision(&self, _: Request<pb::Empty>) -> Result<Response<pb::ReadIndexReply>, Status> {
        let revision = self.store.revision().await.map_err(to_status)?;
        Ok(Response::new(pb::ReadIndexReply { index: revision.max(0) as u64 }))
    }

    async fn read_index(&self, _: Request<pb::Empty>) -> Result<Response<pb::ReadIndexReply>, Status> {
        self.store.barrier().await.map_err(to_status)?;
        let revision = self.store.revision().await.map_err(to_status)?;
        Ok(Response::new(pb::ReadIndexReply { index: revision.max(0) as u64 }))
    }
}

/// A store reached over the network, at one or more replicas (`http://host:port`).
#[derive(Clone)]
pub struct RemoteStore {
    clients: Arc<Vec<StoreClient>>,
    current: Arc<AtomicUsize>,
}

impl RemoteStore {
    pub fn with_token(endpoints: &[String], token: PeerToken) -> Result<RemoteStore> {
        if endpoints.is_empty() {
            return Err(StoreError::BadRequest("no store endpoints given".into()));
        }
        let clients = endpoints
            .iter()
            .map(|e| {
                let channel =
                    token.endpoint(e)?.connect_timeout(Duration::from_secs(2)).tcp_nodelay(true).connect_lazy();
                Ok(StoreServiceClient::with_interceptor(channel, token.clone())
                    .max_decoding_message_size(64 << 20)
                    .max_encoding_message_size(64 << 20))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(RemoteStore { clients: Arc::new(clients), current: Arc::new(AtomicUsize::new(0)) })
    }

    fn client(&self) -> (usize, StoreClient) {
        let i = self.current.load(Ordering::Relaxed) % self.clients.len();
        (i, self.clients[i].clone())
    }

    /// Moves to the next replica after `failed` failed (unless another call already moved on).
    fn fail_over(&self, failed: usize) {
        let _ = self.current.compare_exchange(
            failed,
            (failed + 1) % self.clients.len(),
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    /// Runs a read on the current replica, failing over to the others on transport errors.
    async fn read<T, F, Fut>(&self, call: F) -> Result<T>
    where
        F: Fn(StoreClient) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        let mut last = None;
        for _ in 0..self.clients.len() {
            let (i, client) = self.client();
            match call(client).await {
                Ok(v) => return Ok(v),
                Err(s) if matches!(s.code(), Code::Unavailable | Code::Unknown | Code::Cancelled) => {
                    self.fail_over(i);
                    last = Some(s);
                }
                Err(s) => return Err(from_status(s)),
            }
        }
        Err(last.map(from_status).unwrap_or_else(|| StoreError::Unavailable("no replica answered".into())))
    }

    /// A read that observes every write committed before it (the server waits for a quorum-
    /// confirmed read index first).
    pub async fn get_linearizable(&self, key: &ObjectKey) -> Result<Option<Value>> {
        self.get_with(key, true).await
    }

    async fn get_with(&self, key: &ObjectKey, linearizable: bool) -> Result<Option<Value>> {
        let request = pb::GetRequest {
            kind: key.kind.clone(),
            namespace: key.namespace.clone(),
            name: key.name.clone(),
            linearizable,
        };
        let payload = self
            .read(|mut c| {
                let request = request.clone();
                async move { c.get(request).await.map(Response::into_inner) }
            })
            .await?;
        if payload.json.is_empty() {
            return Ok(None);
        }
        serde_json::from_slice(&payload.json)
            .map(Some)
            .map_err(|source| StoreError::Corrupt { key: key.to_string(), source })
    }
}

#[async_trait::async_trait]
impl Store for RemoteStore {
    async fn get(&self, key: &ObjectKey) -> Result<Option<Value>> {
        self.get_with(key, false).await
    }

    async fn list(&self, kind: &str, options: &ListOptions) -> Result<List> {
        let request = pb::ListRequest {
            kind: kind.to_owned(),
            namespace: options.namespace.clone(),
            label_selector: options.label_selector.clone(),
            limit: options.limit.map(|l| l as u64),
            continue_token: options.continue_token.clone(),
            at_revision: options.at_revision,
            linearizable: false,
        };
        let reply = self
            .read(|mut c| {
                let request = request.clone();
                async move { c.list(request).await.map(Response::into_inner) }
            })
            .await?;
        let items = reply
            .items
            .iter()
            .map(|bytes| {
                serde_json::from_slice(bytes).map_err(|source| StoreError::Corrupt { key: kind.to_owned(), source })
            })
            .collect::<Result<_>>()?;
        Ok(List { revision: reply.revision, items, continue_token: reply.continue_token })
    }

    /// Sends the transaction to the current replica. `NotLeader` and connections that were never
    /// established (nothing was sent) move on to the next replica, or come back as `NotLeader` when there is no other;
    /// any other failure is returned as it is, since its outcome is unknown.
    async fn txn(&self, ops: Vec<Op>) -> Result<Committed> {
        let body = pb::Payload { json: json(&ops), data: Vec::new() };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let (i, mut client) = self.client();
            let error = match client.txn(body.clone()).await {
                Ok(reply) => {
                    return match reply.into_inner().outcome {
                        Some(pb::txn_reply::Outcome::Committed(c)) => serde_json::from_slice(&c)
                            .map_err(|source| StoreError::Corrupt { key: "transaction result".into(), source }),
                        Some(pb::txn_reply::Outcome::Rejected(r)) => {
                            let rejection: Rejection = serde_json::from_slice(&r)
                                .map_err(|source| StoreError::Corrupt { key: "transaction result".into(), source })?;
                            Err(rejection.into())
                        }
                        None => Err(StoreError::Unavailable("empty transaction reply".into())),
                    };
                }
                Err(status) => status,
            };
            let not_applied = error.metadata().get(NOT_LEADER).is_some() || is_connect_error(&error);
            if !not_applied {
                return Err(from_status(error));
            }
            // With one replica to try, the caller decides where to send it next.
            if self.clients.len() == 1 || tokio::time::Instant::now() >= deadline {
                return Err(StoreError::NotLeader(error.message().to_owned()));
            }
            self.fail_over(i);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn watch(&self, from: Revision, options: WatchOptions) -> Result<WatchStream> {
        let request = pb::WatchRequest {
            from_revision: from,
            kinds: options.kinds.unwrap_or_default(),
            bookmarks: options.bookmarks,
            bookmark_interval_ms: options.bookmark_interval.map_or(0, |d| d.as_millis() as u64),
        };
        let stream = self
            .read(|mut c| {
                let request = request.clone();
                async move { c.watch(request).await.map(Response::into_inner) }
            })
            .await?;
        Ok(stream
            .map(|event| {
                let e = event.map_err(from_status)?;
                let event_type = match e.r#type.as_str() {
                    "ADDED" => EventType::Added,
                    "MODIFIED" => EventType::Modified,
                    "DELETED" => EventType::Deleted,
                    _ => return Ok(Event::bookmark(e.revision)),
                };
                let key = ObjectKey::new(e.kind, e.namespace, e.name);
                let object = serde_json::from_slice(&e.object)
                    .map_err(|source| StoreError::Corrupt { key: key.to_string(), source })?;
                Ok(Event { revision: e.revision, event_type, key, object: Arc::new(object) })
            })
            .boxed())
    }

    async fn revision(&self) -> Result<Revision> {
        let reply = self.read(|mut c| async move { c.revision(pb::Empty {}).await.map(Response::into_inner) }).await?;
        Ok(reply.index as Revision)
    }

    async fn barrier(&self) -> Result<()> {
        self.read(|mut c| async move { c.read_index(pb::Empty {}).await.map(Response::into_inner) }).await?;
        Ok(())
    }

    async fn compact(&self, _revision: Revision) -> Result<()> {
        Err(StoreError::BadRequest("compaction is done by each replica, not over the network".into()))
    }
}

/// Whether the request never left this client: tonic marks every failure to establish the
/// connection (refused, unreachable, timed out while connecting) with a `ConnectError` in the
/// source chain. A request that failed on a connection that was established may have been
/// applied, whatever its error says.
fn is_connect_error(status: &Status) -> bool {
    status.code() == Code::Unavailable
        && std::iter::successors(std::error::Error::source(status), |e| e.source())
            .any(|e| e.is::<tonic::ConnectError>())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::Notify;

    #[test]
    fn peers_off_loopback_are_reached_over_https_with_the_cluster_ca() {
        assert_eq!(PeerToken::url("127.0.0.1:8080"), "http://127.0.0.1:8080");
        assert_eq!(PeerToken::url("localhost:8080"), "http://localhost:8080");
        assert_eq!(PeerToken::url("[::1]:8080"), "http://[::1]:8080");
        assert_eq!(PeerToken::url("192.0.2.1:8080"), "https://192.0.2.1:8080");
        assert_eq!(PeerToken::url("cp-1.example:8080"), "https://cp-1.example:8080");
        let without_ca = token().endpoint("https://192.0.2.1:8080").map(|_| ()).unwrap_err().to_string();
        assert!(without_ca.contains("no cluster CA"), "{without_ca}");
        assert!(token().endpoint("http://127.0.0.1:1").is_ok());
    }

    /// A store whose transactions arrive and never finish.
    struct Stall(Arc<Notify>);

    #[async_trait::async_trait]
    impl Store for Stall {
        async fn get(&self, _: &ObjectKey) -> Result<Option<Value>> {
            Err(StoreError::Unavailable("not in this test".into()))
        }
        async fn list(&self, _: &str, _: &ListOptions) -> Result<List> {
            Err(StoreError::Unavailable("not in this test".into()))
        }
        async fn txn(&self, _: Vec<Op>) -> Result<Committed> {
            self.0.notify_one();
            std::future::pending().await
        }
        async fn watch(&self, _: Revision, _: WatchOptions) -> Result<WatchStream> {
            Err(StoreError::Unavailable("not in this test".into()))
        }
        async fn revision(&self) -> Result<Revision> {
            Err(StoreError::Unavailable("not in this test".into()))
        }
        async fn compact(&self, _: Revision) -> Result<()> {
            Err(StoreError::Unavailable("not in this test".into()))
        }
    }

    fn pod() -> Op {
        Op::Create(serde_json::json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "a"}}))
    }

    fn token() -> PeerToken {
        PeerToken::new("0123456789abcdef0123456789abcdef").unwrap()
    }

    #[tokio::test]
    async fn only_a_connection_never_established_makes_a_write_safe_to_resend() {
        // Nothing listens: the connection is refused, the write was certainly not applied.
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", closed.local_addr().unwrap());
        drop(closed);
        let mut client = RemoteStore::with_token(std::slice::from_ref(&endpoint), token()).unwrap().client().1;
        let refused = client.txn(pb::Payload { json: json(&vec![pod()]), data: Vec::new() }).await.unwrap_err();
        assert!(is_connect_error(&refused), "{refused:?}");
        let err = RemoteStore::with_token(&[endpoint], token()).unwrap().txn(vec![pod()]).await.unwrap_err();
        assert!(matches!(err, StoreError::NotLeader(_)), "refused: safe to send elsewhere: {err}");

        // A listener whose accept queue is full drops new connections' SYNs: the connection times
        // out before it is established (no refusal, no io::ErrorKind::ConnectionRefused).
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let full = socket.listen(0).unwrap();
        let address = full.local_addr().unwrap();
        let mut queued = Vec::new();
        while let Ok(Ok(stream)) =
            tokio::time::timeout(Duration::from_millis(200), tokio::net::TcpStream::connect(address)).await
        {
            queued.push(stream);
        }
        let mut client = RemoteStore::with_token(&[format!("http://{address}")], token()).unwrap().client().1;
        let timed_out = client.txn(pb::Payload { json: json(&vec![pod()]), data: Vec::new() }).await.unwrap_err();
        assert!(is_connect_error(&timed_out), "{timed_out:?}");

        // The server took the request, then the connection broke: the outcome is unknown.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let arrived = Arc::new(Notify::new());
        let server = StoreServer::new(Arc::new(Stall(arrived.clone())));
        let (cut_tx, cut_rx) = tokio::sync::oneshot::channel();
        let serving = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let stream = stream.into_std().unwrap();
            let _ = cut_tx.send(stream.try_clone().unwrap());
            let stream = tokio::net::TcpStream::from_std(stream).unwrap();
            let incoming = tokio_stream::once(Ok::<_, std::io::Error>(stream));
            let _ = tonic::transport::Server::builder().add_service(server).serve_with_incoming(incoming).await;
        });
        let store = RemoteStore::with_token(std::slice::from_ref(&endpoint), token()).unwrap();
        let write = tokio::spawn(async move { store.txn(vec![pod()]).await });
        let cut = cut_rx.await.unwrap();
        arrived.notified().await;
        cut.shutdown(std::net::Shutdown::Both).unwrap();
        let err = write.await.unwrap().unwrap_err();
        assert!(!matches!(err, StoreError::NotLeader(_)), "sent, then broken: never resent: {err}");
        serving.abort();
    }
}
