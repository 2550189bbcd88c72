//! The Ingress data plane: an HTTP/1.1 reverse proxy (hyper) in front of the Services' Pods.
//! Each request is routed by the snapshot current when it arrives, sent straight to one of the
//! Service's ready endpoints (round robin, as ingress-nginx balances), and tried on the next
//! endpoint when a connection cannot be made (ingress-nginx's `proxy_next_upstream error`).
//! Clients and upstreams keep their connections alive; idle upstream connections wait in a small
//! pool per endpoint. Request bodies are read whole first (at most [`MAX_BODY`], ingress-nginx's
//! default `client_max_body_size`), so a retry can send them again.
//!
//! Everything a client can make the proxy hold is bounded by [`Limits`]: connections (in all and
//! per client address; more are closed at once, unanswered), request heads (size and fields:
//! 431), the time to send a head or to stay idle, the time to send a body (408), and the bodies
//! held in memory (in all and per client address: 503).

use super::{
    Routes,
    limits::{HANDSHAKE_TIMEOUT, Limits, MAX_HEADER_BYTES, MAX_HEADERS, Share, Shares},
    sni,
    tunnel::{self, Ended, tunnel},
};
use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, Either, Full};
use hyper::{
    Request, Response, StatusCode,
    body::{Body, Frame, Incoming},
    client::conn::http1::SendRequest,
    header::{self, HeaderMap, HeaderName, HeaderValue},
    service::service_fn,
    upgrade::OnUpgrade,
};
use hyper_util::rt::TokioIo;
use std::{
    collections::HashMap,
    net::{IpAddr, SocketAddr},
    pin::Pin,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicUsize, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::{TcpListener, TcpStream},
    sync::watch,
};

/// The largest request body proxied (ingress-nginx's default `client_max_body_size`, 1m).
pub const MAX_BODY: usize = 1 << 20;
/// How long connecting to an endpoint may take before the next one is tried. Shorter than
/// ingress-nginx's 5 s `proxy-connect-timeout`: endpoints are a hop away, where a connection
/// takes well under a millisecond, and one a NetworkPolicy drops silently would otherwise hold
/// every request to it for 5 s.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// How many endpoints a request is tried on (ingress-nginx's `proxy-next-upstream-tries`: 3).
const TRIES: usize = 3;
/// Idle connections kept per endpoint: enough for every request in flight to give its
/// connection back (a smaller pool closes and reopens connections under load; ingress-nginx
/// keeps 320 per worker).
const IDLE_PER_ENDPOINT: usize = 320;

type Sender = SendRequest<Full<Bytes>>;
pub type ProxyBody = Either<PooledBody, Full<Bytes>>;

/// Idle keep-alive connections to endpoints.
#[derive(Default)]
pub struct Pool {
    idle: Mutex<HashMap<SocketAddr, Vec<Sender>>>,
}

impl Pool {
    fn take(&self, endpoint: SocketAddr) -> Option<Sender> {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let senders = idle.get_mut(&endpoint)?;
        while let Some(sender) = senders.pop() {
            if !sender.is_closed() {
                return Some(sender);
            }
        }
        None
    }

    fn put(&self, endpoint: SocketAddr, sender: Sender) {
        if sender.is_closed() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let senders = idle.entry(endpoint).or_default();
        if senders.len() < IDLE_PER_ENDPOINT {
            senders.push(sender);
        }
    }
}

/// A response body that gives its connection back to the pool once it has been read.
pub struct PooledBody {
    inner: Incoming,
    giving_back: Option<(Arc<Pool>, SocketAddr, Sender)>,
}

impl PooledBody {
    fn give_back(&mut self) {
        if let Some((pool, endpoint, sender)) = self.giving_back.take() {
            pool.put(endpoint, sender);
        }
    }
}

impl Body for PooledBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => self.give_back(),
            Poll::Ready(Some(Ok(_))) if self.inner.is_end_stream() => self.give_back(),
            Poll::Ready(Some(Err(_))) => self.giving_back = None,
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// What the proxy shares between connections.
pub struct Proxy {
    pub routes: Arc<Routes>,
    pool: Arc<Pool>,
    next: AtomicUsize,
    limits: Limits,
    /// Connections open, in all and per client address.
    connections: Arc<Shares>,
    /// Bytes of request bodies held, in all and per client address.
    bodies: Arc<Shares>,
}

impl Proxy {
    pub fn new(routes: Arc<Routes>) -> Arc<Proxy> {
        Proxy::with_limits(routes, Limits::default())
    }

    pub fn with_limits(routes: Arc<Routes>, limits: Limits) -> Arc<Proxy> {
        Arc::new(Proxy {
            routes,
            pool: Arc::default(),
            next: AtomicUsize::new(0),
            connections: Shares::new(limits.max_connections, limits.max_connections_per_client),
            bodies: Shares::new(limits.max_buffered_bodies, limits.max_buffered_bodies_per_client),
            limits,
        })
    }

    /// Serves plain HTTP on `listener` until `shutdown`.
    pub async fn serve_http(self: Arc<Self>, listener: TcpListener, shutdown: watch::Receiver<bool>) {
        self.accept(listener, None, shutdown).await
    }

    /// Serves HTTPS on `listener` until `shutdown`.
    pub async fn serve_https(self: Arc<Self>, listener: TcpListener, shutdown: watch::Receiver<bool>) {
        let config = match sni::server_config(self.routes.clone()) {
            Ok(config) => config,
            Err(error) => return tracing::error!(%error, "the Ingress HTTPS listener cannot start"),
        };
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        self.accept(listener, Some(acceptor), shutdown).await
    }

    async fn accept(
        self: Arc<Self>,
        listener: TcpListener,
        tls: Option<tokio_rustls::TlsAcceptor>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        loop {
            let accepted = tokio::select! {
                _ = shutdown.wait_for(|s| *s) => break,
                accepted = listener.accept() => accepted,
            };
            let (stream, peer) = match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors, most likely: give connections time to close.
                    tracing::warn!(%error, "accepting an Ingress connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            // Over either bound the connection is closed at once, before anything is read: the
            // client sees a reset, and a flood costs an accept and a close.
            let Some(slot) = self.connections.take(peer.ip(), 1) else {
                tracing::debug!(%peer, "Ingress connection refused: too many connections");
                continue;
            };
            let _ = stream.set_nodelay(true);
            let (proxy, tls) = (self.clone(), tls.clone());
            tokio::spawn(async move {
                let _slot = slot;
                match tls {
                    None => proxy.serve_connection(stream, peer, "http").await,
                    Some(acceptor) => match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(stream)) => proxy.serve_connection(stream, peer, "https").await,
                        Ok(Err(error)) => tracing::debug!(%peer, %error, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    },
                }
            });
        }
    }

    async fn serve_connection<S>(self: Arc<Self>, stream: S, peer: SocketAddr, scheme: &'static str)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let idle_timeout = self.limits.idle_timeout;
        let service = service_fn(move |request| {
            let proxy = self.clone();
            async move { Ok::<_, std::convert::Infallible>(proxy.handle(request, peer, scheme).await) }
        });
        // hyper runs the head's timer from the end of the previous answer: it is the idle
        // timeout too. The read and write buffers are capped at the largest head, so a client
        // that stops reading holds no more than that of a response.
        let served = hyper::server::conn::http1::Builder::new()
            .timer(hyper_util::rt::TokioTimer::new())
            .keep_alive(true)
            .header_read_timeout(idle_timeout)
            .max_header_size(MAX_HEADER_BYTES)
            .max_headers(MAX_HEADERS)
            .max_buf_size(MAX_HEADER_BYTES)
            .serve_connection(TokioIo::new(stream), service)
            .with_upgrades()
            .await;
        if let Err(error) = served {
            tracing::debug!(%peer, %error, "Ingress connection ended with an error");
        }
    }

    /// Routes and proxies one request.
    pub async fn handle(
        &self,
        mut request: Request<Incoming>,
        peer: SocketAddr,
        scheme: &'static str,
    ) -> Response<ProxyBody> {
        // An HTTP/1.1 Upgrade (WebSocket): the handshake goes to an endpoint on a connection of
        // its own and, once the endpoint switched protocols, the two connections are joined.
        let mut upgrade = upgrade_protocol(request.headers()).map(|p| (p, hyper::upgrade::on(&mut request)));
        let (mut parts, body) = request.into_parts();
        // The Host header, else the authority of an absolute-form target (RFC 9112 section 3.2.2).
        let host = match parts.headers.get(header::HOST) {
            Some(value) => value.clone(),
            None => match parts.uri.authority().and_then(|a| HeaderValue::from_str(a.as_str()).ok()) {
                Some(value) => value,
                None => HeaderValue::from_static(""),
            },
        };
        let backend = {
            let name = strip_port(host.to_str().unwrap_or(""));
            let snapshot = self.routes.load();
            let route = if name.bytes().any(|b| b.is_ascii_uppercase()) {
                snapshot.table.route(&name.to_ascii_lowercase(), parts.uri.path())
            } else {
                snapshot.table.route(name, parts.uri.path())
            };
            match route {
                Some(route) => route.backend.clone(),
                None => return error(StatusCode::NOT_FOUND, "no Ingress rule matches this host and path"),
            }
        };
        if backend.endpoints.is_empty() {
            return error(StatusCode::SERVICE_UNAVAILABLE, &format!("{} has no ready endpoints", backend.name));
        }
        // Most requests have no body: nothing to read or to keep for a retry. The share of the
        // bodies' budget is held until the answer's head is returned.
        let (body, _share) = if body.is_end_stream() {
            (Bytes::new(), None)
        } else {
            match self.read_body(body, peer.ip()).await {
                Ok((body, share)) => (body, Some(share)),
                Err(response) => return response,
            }
        };
        // Upstreams get the origin form (`/path?query`), whatever form the client sent.
        if parts.uri.authority().is_some() {
            let origin = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
            match origin.parse() {
                Ok(uri) => parts.uri = uri,
                Err(_) => return error(StatusCode::BAD_REQUEST, "the request target cannot be forwarded"),
            }
        }
        forward_headers(&mut parts.headers, peer, scheme, host);
        if let Some((protocol, _)) = &upgrade {
            parts.headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
            parts.headers.insert(header::UPGRADE, protocol.clone());
        }
        let endpoints = &backend.endpoints;
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let idempotent = parts.method.is_idempotent();
        let tries = endpoints.len().min(TRIES);
        let mut last_error = String::new();
        for attempt in 0..tries {
            let endpoint = endpoints[(start + attempt) % endpoints.len()];
            // The last try takes the request; earlier ones send a copy, kept for the next.
            let mut upstream = Request::new(Full::new(body.clone()));
            *upstream.method_mut() = parts.method.clone();
            *upstream.uri_mut() = parts.uri.clone();
            *upstream.headers_mut() =
                if attempt + 1 == tries { std::mem::take(&mut parts.headers) } else { parts.headers.clone() };
            match self.send(endpoint, upstream, idempotent, upgrade.is_some()).await {
                Ok((response, sender)) => {
                    return match upgrade.take() {
                        Some((_, client)) => switch(endpoint, response, client),
                        None => self.pooled(endpoint, sender, response),
                    };
                }
                Err(why) => {
                    tracing::debug!(%endpoint, backend = %backend.name, %why, "endpoint failed; trying the next");
                    last_error = why;
                }
            }
        }
        tracing::warn!(backend = %backend.name, error = %last_error, "no endpoint answered");
        error(StatusCode::BAD_GATEWAY, &format!("no endpoint of {} answered", backend.name))
    }

    /// Reads a request body whole, within the body timeout and the bodies' budget (a declared
    /// length is taken from it at once, so a body that cannot be held is refused unread).
    async fn read_body(&self, mut body: Incoming, client: IpAddr) -> Result<(Bytes, Share), Response<ProxyBody>> {
        let declared = body.size_hint().exact().and_then(|n| usize::try_from(n).ok());
        let too_large = || closing(error(StatusCode::PAYLOAD_TOO_LARGE, "the request body is larger than 1 MiB"));
        if declared.is_some_and(|n| n > MAX_BODY) {
            return Err(too_large());
        }
        let busy = || {
            let message = "too many request bodies are being received: try again";
            closing(error(StatusCode::SERVICE_UNAVAILABLE, message))
        };
        let mut share = self.bodies.take(client, declared.unwrap_or(0)).ok_or_else(busy)?;
        let read = async {
            let mut buf = BytesMut::with_capacity(declared.unwrap_or(0));
            while let Some(frame) = body.frame().await {
                let Ok(frame) = frame else {
                    return Err(error(StatusCode::BAD_REQUEST, "the request body could not be read"));
                };
                // Trailers are not forwarded (the body is sent with a length).
                let Ok(data) = frame.into_data() else { continue };
                let len = buf.len() + data.len();
                if len > MAX_BODY {
                    return Err(too_large());
                }
                if len > share.units() && !share.grow(len - share.units()) {
                    return Err(busy());
                }
                buf.extend_from_slice(&data);
            }
            Ok(buf.freeze())
        };
        match tokio::time::timeout(self.limits.body_timeout, read).await {
            Ok(Ok(body)) => Ok((body, share)),
            Ok(Err(response)) => Err(response),
            Err(_) => {
                let message = format!("the request body did not arrive within {:?}", self.limits.body_timeout);
                Err(closing(error(StatusCode::REQUEST_TIMEOUT, &message)))
            }
        }
    }

    /// Sends a request to one endpoint: on an idle pooled connection, else (and always for an
    /// upgrade) a new one. `Err`: the request was not answered and may be sent elsewhere.
    async fn send(
        &self,
        endpoint: SocketAddr,
        request: Request<Full<Bytes>>,
        idempotent: bool,
        upgrade: bool,
    ) -> Result<(Response<Incoming>, Sender), String> {
        let mut request = request;
        // A pooled connection the endpoint closed meanwhile fails before the request leaves; it
        // is sent again on a new connection. One that fails after may have been acted on: only
        // idempotent requests are sent again (as nginx does).
        while let Some(mut sender) = if upgrade { None } else { self.pool.take(endpoint) } {
            if sender.ready().await.is_err() {
                continue;
            }
            match sender.try_send_request(request).await {
                Ok(response) => return Ok((response, sender)),
                Err(mut failed) => match failed.take_message() {
                    Some(unsent) => request = unsent,
                    None if idempotent => return Err(format!("{}", failed.error())),
                    None => return Err(format!("{} (not retried: the method is not idempotent)", failed.error())),
                },
            }
        }
        let stream = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(endpoint)).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => return Err(format!("connecting: {e}")),
            Err(_) => return Err("connecting timed out".into()),
        };
        let _ = stream.set_nodelay(true);
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| e.to_string())?;
        tokio::spawn(async move {
            if let Err(error) = connection.with_upgrades().await {
                tracing::debug!(%endpoint, %error, "upstream connection ended with an error");
            }
        });
        match sender.try_send_request(request).await {
            Ok(response) => Ok((response, sender)),
            Err(failed) => Err(failed.error().to_string()),
        }
    }

    fn pooled(&self, endpoint: SocketAddr, sender: Sender, response: Response<Incoming>) -> Response<ProxyBody> {
        let (mut parts, inner) = response.into_parts();
        remove_hop_by_hop(&mut parts.headers);
        let mut body = PooledBody { inner, giving_back: Some((self.pool.clone(), endpoint, sender)) };
        if body.is_end_stream() {
            body.give_back();
        }
        Response::from_parts(parts, Either::Left(body))
    }
}

/// The protocol a request asks to switch to (`Connection: upgrade` and `Upgrade: <protocol>`).
fn upgrade_protocol(headers: &HeaderMap) -> Option<HeaderValue> {
    let asks = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|token| token.trim().eq_ignore_ascii_case("upgrade"));
    asks.then(|| headers.get(header::UPGRADE).cloned()).flatten()
}

/// The endpoint's answer to an upgrade: when it switched protocols (101), the client gets the
/// 101 and, once both connections are handed over, they are joined by a [`tunnel`]; any other
/// answer is passed on as usual (its connection is not pooled).
fn switch(endpoint: SocketAddr, mut response: Response<Incoming>, client: OnUpgrade) -> Response<ProxyBody> {
    let switched = response.status() == StatusCode::SWITCHING_PROTOCOLS;
    let protocol = response.headers().get(header::UPGRADE).cloned();
    if switched {
        let upstream = hyper::upgrade::on(&mut response);
        tokio::spawn(async move {
            match tokio::try_join!(client, upstream) {
                Ok((client, upstream)) => {
                    match tunnel(TokioIo::new(client), TokioIo::new(upstream), tunnel::IDLE_TIMEOUT).await {
                        Ok(Ended::Closed) => {}
                        Ok(Ended::Idle) => {
                            tracing::debug!(%endpoint, "upgraded connection closed after its idle timeout")
                        }
                        Err(error) => tracing::debug!(%endpoint, %error, "upgraded connection ended with an error"),
                    }
                }
                Err(error) => tracing::debug!(%endpoint, %error, "an upgrade was not completed"),
            }
        });
    }
    let (mut parts, inner) = response.into_parts();
    remove_hop_by_hop(&mut parts.headers);
    if let (true, Some(protocol)) = (switched, protocol) {
        parts.headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        parts.headers.insert(header::UPGRADE, protocol);
    }
    Response::from_parts(parts, Either::Left(PooledBody { inner, giving_back: None }))
}

fn strip_port(host: &str) -> &str {
    match host.rsplit_once(':') {
        Some((name, port)) if !name.ends_with(']') && port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

/// Headers that belong to one connection, not to the request (RFC 9110 section 7.6.1).
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "upgrade",
];

fn remove_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    headers.remove(header::TRANSFER_ENCODING);
}

/// The request's headers as the upstream gets them: hop-by-hop ones removed, and the client's
/// address, scheme and host in X-Forwarded-For (appended), X-Forwarded-Proto, X-Forwarded-Host
/// and X-Real-IP, as ingress-nginx sets them.
fn forward_headers(headers: &mut HeaderMap, peer: SocketAddr, scheme: &'static str, host: HeaderValue) {
    remove_hop_by_hop(headers);
    let client = peer.ip().to_string();
    let forwarded_for = match headers.get("x-forwarded-for").and_then(|v| v.to_str().ok()) {
        Some(earlier) if !earlier.is_empty() => HeaderValue::from_str(&format!("{earlier}, {client}")).ok(),
        _ => None,
    };
    let client = HeaderValue::from_str(&client).unwrap_or(HeaderValue::from_static(""));
    headers.insert("x-forwarded-for", forwarded_for.unwrap_or_else(|| client.clone()));
    headers.insert("x-forwarded-proto", HeaderValue::from_static(scheme));
    headers.insert("x-forwarded-host", host);
    headers.insert("x-real-ip", client);
}

/// An answer after which the connection is closed (the rest of its request was not read).
fn closing(mut response: Response<ProxyBody>) -> Response<ProxyBody> {
    response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

fn error(status: StatusCode, message: &str) -> Response<ProxyBody> {
    let mut response = Response::new(Either::Right(Full::new(Bytes::from(format!("{message}\n")))));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwarded_headers_are_set_and_hop_by_hop_ones_dropped() {
        let mut out = HeaderMap::new();
        out.insert("x-forwarded-for", HeaderValue::from_static("192.0.2.1"));
        out.insert(header::CONNECTION, HeaderValue::from_static("keep-alive, x-secret"));
        out.insert("x-secret", HeaderValue::from_static("s"));
        out.insert("accept", HeaderValue::from_static("*/*"));
        let host = HeaderValue::from_static("shop.example");
        forward_headers(&mut out, "172.29.0.9:50000".parse().unwrap(), "https", host);
        assert_eq!(out["x-forwarded-for"], "192.0.2.1, 172.29.0.9");
        assert_eq!(out["x-forwarded-proto"], "https");
        assert_eq!(out["x-forwarded-host"], "shop.example");
        assert_eq!(out["x-real-ip"], "172.29.0.9");
        assert_eq!(out["accept"], "*/*");
        assert!(out.get("x-secret").is_none() && out.get(header::CONNECTION).is_none());
    }

    #[test]
    fn ports_are_stripped_from_hosts() {
        assert_eq!(strip_port("shop.example:8080"), "shop.example");
        assert_eq!(strip_port("shop.example"), "shop.example");
        assert_eq!(strip_port("[::1]"), "[::1]");
    }
}
