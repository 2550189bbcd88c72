//! The replica's one listener: every connection is bounded before a byte of its request is
//! trusted, and requests are routed to gRPC or HTTP by their content type alone.
//!
//! Bounds (all from [`Limits`]): at most `max_connections` connections, and at most
//! `max_connections_per_client` from one address (a flood from one client never takes the slots
//! of the others); a connection that has not sent a complete request head within
//! `header_read_timeout` is closed, the HTTP/2 preface included; HTTP/2 connections take at most
//! `max_concurrent_streams` streams, headers of at most [`MAX_HEADER_BYTES`], and answer pings
//! or are closed. Excess connections are closed at once, without an answer: the client sees a
//! reset and retries, and a flood costs an accept and a close.
//!
//! Every request carries its [`ClientAddr`] so that handlers can bound per-client work too
//! ([`PerClient`]).
//!
//! A listener with a TLS configuration ([`Listener::tls`]) completes the handshake within
//! `header_read_timeout` too, and then serves what ALPN chose (`h2` or `http/1.1`) exactly as
//! it serves cleartext. Every request carries its connection's [`Transport`]: over TLS, the
//! subject of the client certificate (verified against the cluster CA in the handshake), which
//! is how the node service knows a node and the store and Raft services a peer replica.

use axum::{Router, body::Body, extract::Request};
use gitplane_proto::x509::{self, Subject};
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::conn::auto,
    service::TowerToHyperService,
};
use std::{
    collections::HashMap,
    net::IpAddr,
    pin::Pin,
    sync::{Arc, Mutex, PoisonError},
    task::{Context, Poll},
    time::Duration,
};
use tokio::{
    io::{AsyncRead, AsyncReadExt as _, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    time::Instant,
};
use tower::ServiceExt as _;

/// A bound socket, and whether it serves TLS.
pub struct Listener {
    pub tcp: TcpListener,
    pub tls: Option<tokio_rustls::TlsAcceptor>,
}

/// The largest request head (HTTP/1) or header list (HTTP/2) accepted.
pub const MAX_HEADER_BYTES: usize = 64 << 10;
/// The answer to cleartext HTTP on a TLS listener.
const PLAIN_ON_TLS: &[u8] = b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n\
    Client sent an HTTP request to an HTTPS server.\n";
/// The first byte of a TLS ClientHello (a handshake record).
const TLS_HANDSHAKE_RECORD: u8 = 0x16;
/// What every HTTP/2 client sends first.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// How much one listener serves at once.
#[derive(Clone, Debug)]
pub struct Limits {
    pub max_connections: usize,
    pub max_connections_per_client: usize,
    pub header_read_timeout: Duration,
    pub max_concurrent_streams: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 4096,
            max_connections_per_client: 256,
            header_read_timeout: Duration::from_secs(10),
            max_concurrent_streams: 256,
        }
    }
}

/// The address a request came from (a request extension set by [`serve`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ClientAddr(pub IpAddr);

/// How a request's connection came (a request extension set by [`serve`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transport {
    /// Cleartext: on a loopback listener, or from loopback to a TLS one.
    Cleartext,
    /// TLS, and the subject of the client's certificate if it presented one (the handshake
    /// verified it against the cluster CA).
    Tls(Option<Subject>),
}

impl Transport {
    /// The verified client certificate's subject, if any.
    pub fn client(&self) -> Option<&Subject> {
        match self {
            Transport::Tls(subject) => subject.as_ref(),
            Transport::Cleartext => None,
        }
    }
}

/// Requests made in-process (tests) share one unspecified address.
impl<S: Send + Sync> axum::extract::FromRequestParts<S> for ClientAddr {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(parts.extensions.get::<ClientAddr>().copied().unwrap_or(ClientAddr(IpAddr::from([0, 0, 0, 0]))))
    }
}

/// Counts what each client holds of something bounded (connections, unauthenticated body
/// reads…): at most `limit` each.
#[derive(Clone)]
pub struct PerClient {
    limit: usize,
    held: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// One unit a client holds; released on drop.
pub struct Held {
    client: IpAddr,
    held: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

impl PerClient {
    pub fn new(limit: usize) -> PerClient {
        PerClient { limit, held: Arc::default() }
    }

    /// One more unit for `client`, or `None` when it holds its limit already.
    pub fn try_take(&self, client: ClientAddr) -> Option<Held> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let count = held.entry(client.0).or_default();
        if *count >= self.limit {
            return None;
        }
        *count += 1;
        Some(Held { client: client.0, held: self.held.clone() })
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = held.get_mut(&self.client) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.client);
            }
        }
    }
}

/// Whether a request is gRPC: by its content type only, never by its path.
fn is_grpc<B>(request: &axum::http::Request<B>) -> bool {
    request
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/grpc"))
}

/// Serves `grpc` and `http` on `listener` until the task is dropped.
pub async fn serve(listener: Listener, grpc: Router, http: Router, limits: Limits) {
    let Listener { tcp: listener, tls } = listener;
    let connections = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    let per_client = PerClient::new(limits.max_connections_per_client);
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(MAX_HEADER_BYTES.max(8192));
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_concurrent_streams)
        .max_header_list_size(MAX_HEADER_BYTES as u32)
        .max_pending_accept_reset_streams(64)
        .max_local_error_reset_streams(256)
        .keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(20));
    let builder = Arc::new(builder);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors and the like: wait instead of spinning.
                tracing::warn!(error = %e, "accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = connections.clone().try_acquire_owned() else {
            tracing::debug!(%peer, "connection refused: the listener is full");
            continue;
        };
        let client = ClientAddr(peer.ip());
        let Some(held) = per_client.try_take(client) else {
            tracing::debug!(%peer, "connection refused: this client holds its limit of connections");
            continue;
        };
        // Without TCP_NODELAY every small answer waits for the peer's delayed ACK (~40 ms).
        let _ = stream.set_nodelay(true);
        let (grpc, http, builder, tls) = (grpc.clone(), http.clone(), builder.clone(), tls.clone());
        let header_read_timeout = limits.header_read_timeout;
        let accepted = Instant::now();
        tokio::spawn(async move {
            let _held = (slot, held);
            let service = |transport: Transport| {
                let (grpc, http) = (grpc.clone(), http.clone());
                TowerToHyperService::new(tower::service_fn(move |mut request: Request<hyper::body::Incoming>| {
                    request.extensions_mut().insert(client);
                    request.extensions_mut().insert(transport.clone());
                    let request = request.map(Body::new);
                    let router = if is_grpc(&request) { grpc.clone() } else { http.clone() };
                    router.oneshot(request)
                }))
            };
            let result = match tls {
                None => {
                    if !request_began(&stream, header_read_timeout).await {
                        return;
                    }
                    builder.serve_connection_with_upgrades(TokioIo::new(stream), service(Transport::Cleartext)).await
                }
                // The first byte, the handshake and the request's first bytes share one allowance.
                Some(tls) => match first_byte(&stream, accepted + header_read_timeout).await {
                    None => return,
                    Some(TLS_HANDSHAKE_RECORD) => {
                        let deadline = accepted + header_read_timeout;
                        let Some(stream) = handshake(&tls, stream, deadline).await else { return };
                        let certificate = stream.inner.get_ref().1.peer_certificates().and_then(|c| c.first());
                        let transport = Transport::Tls(certificate.and_then(|c| x509::subject(c)));
                        builder.serve_connection_with_upgrades(TokioIo::new(stream), service(transport)).await
                    }
                    // Cleartext from loopback never left this machine (a wildcard listener's own
                    // clients, e.g. `gitplane up --listen 0.0.0.0:8080`'s agent): served as such.
                    Some(_) if client.0.is_loopback() => {
                        if !request_began(&stream, header_read_timeout).await {
                            return;
                        }
                        builder
                            .serve_connection_with_upgrades(TokioIo::new(stream), service(Transport::Cleartext))
                            .await
                    }
                    Some(_) => return refuse_cleartext(stream).await,
                },
            };
            if let Err(e) = result {
                tracing::trace!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
}

/// Waits (bounded) until the client has sent enough to tell HTTP/1 from HTTP/2: hyper's header
/// timeout starts only after that, so a client that connects and says nothing, or trickles the
/// HTTP/2 preface, would otherwise hold its connection forever.
async fn request_began(stream: &TcpStream, timeout: Duration) -> bool {
    let check = async {
        let mut buf = [0u8; H2_PREFACE.len()];
        loop {
            let n = match stream.peek(&mut buf).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => n,
            };
            if n == buf.len() || buf[..n] != H2_PREFACE[..n] {
                return true;
            }
            // A partial preface: wait for more to arrive (peek returns at once otherwise).
            if stream.readable().await.is_err() {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(timeout, check).await.unwrap_or(false)
}

/// The first byte a client sends, before `deadline`.
async fn first_byte(stream: &TcpStream, deadline: Instant) -> Option<u8> {
    let mut first = [0u8; 1];
    match tokio::time::timeout_at(deadline, stream.peek(&mut first)).await {
        Ok(Ok(1)) => Some(first[0]),
        _ => None,
    }
}

/// Go's answer to cleartext on a TLS port, rather than a reset. What the client sent is
/// drained (briefly) first, so that closing does not reset the connection before it reads.
async fn refuse_cleartext(mut stream: TcpStream) {
    use tokio::io::AsyncWriteExt as _;
    let _ = stream.write_all(PLAIN_ON_TLS).await;
    let _ = stream.shutdown().await;
    let mut sink = [0u8; 4096];
    let drain = async { while matches!(stream.read(&mut sink).await, Ok(n) if n > 0) {} };
    let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
}

/// The TLS handshake and the first bytes of a request, both within `timeout` (as
/// [`request_began`] bounds a cleartext client); the bytes read are served again after.
async fn handshake(
    tls: &tokio_rustls::TlsAcceptor,
    stream: TcpStream,
    deadline: Instant,
) -> Option<Replayed<tokio_rustls::server::TlsStream<TcpStream>>> {
    let began = async {
        let mut stream =
            tls.accept(stream).await.inspect_err(|e| tracing::debug!(error = %e, "TLS handshake failed")).ok()?;
        let mut first = Vec::with_capacity(H2_PREFACE.len());
        let mut buf = [0u8; H2_PREFACE.len()];
        while first.len() < H2_PREFACE.len() && H2_PREFACE.starts_with(&first) {
            let n = stream.read(&mut buf[..H2_PREFACE.len() - first.len()]).await.ok()?;
            if n == 0 {
                return None;
            }
            first.extend_from_slice(&buf[..n]);
        }
        Some(Replayed { first, at: 0, inner: stream })
    };
    tokio::time::timeout_at(deadline, began).await.ok().flatten()
}

/// A stream whose first bytes were already read: they are read again first.
struct Replayed<S> {
    first: Vec<u8>,
    at: usize,
    inner: S,
}

impl<S: AsyncRead + Unpin> AsyncRead for Replayed<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        if self.at < self.first.len() {
            let n = (self.first.len() - self.at).min(buf.remaining());
            let at = self.at;
            buf.put_slice(&self.first[at..at + n]);
            self.at += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Replayed<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_client_limits_count_each_client_alone() {
        let limit = PerClient::new(2);
        let (a, b) = (ClientAddr([127, 0, 0, 2].into()), ClientAddr([127, 0, 0, 3].into()));
        let first = limit.try_take(a).unwrap();
        let _second = limit.try_take(a).unwrap();
        assert!(limit.try_take(a).is_none(), "a third for the same client");
        assert!(limit.try_take(b).is_some(), "another client is not affected");
        drop(first);
        assert!(limit.try_take(a).is_some(), "released on drop");
    }

    #[test]
    fn grpc_is_told_by_content_type_only() {
        let request = |ct: &str| axum::http::Request::builder().uri("/x").header("content-type", ct).body(()).unwrap();
        assert!(is_grpc(&request("application/grpc")));
        assert!(is_grpc(&request("application/grpc+proto")));
        assert!(!is_grpc(&request("application/json")));
        let path_only = axum::http::Request::builder().uri("/gitplane.node.v1.NodeService/Register").body(()).unwrap();
        assert!(!is_grpc(&path_only));
    }

    #[tokio::test]
    async fn replayed_bytes_come_first() {
        let (mut a, b) = tokio::io::duplex(64);
        tokio::io::AsyncWriteExt::write_all(&mut a, b" rest").await.unwrap();
        drop(a);
        let mut replayed = Replayed { first: b"GET".to_vec(), at: 0, inner: b };
        let mut all = String::new();
        replayed.read_to_string(&mut all).await.unwrap();
        assert_eq!(all, "GET rest");
    }
}
