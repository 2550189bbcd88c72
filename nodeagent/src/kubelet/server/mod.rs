//! The agent's kubelet endpoint (the kubelet's server on port 10250), which the control plane's
//! replicas call for `kubectl top` (`GET /stats/summary`, see [`crate::kubelet::stats`]), for the
//! agent's Prometheus metrics (`GET /metrics`, see [`crate::metrics`]) and for
//! `kubectl logs`: `GET /containerLogs/{namespace}/{pod}/{container}` with
//! `containerID` (which run: the replica chose it from the Pod's status, as the kubelet's
//! `validateContainerLogStatus`), `follow`, `tailLines`, `sinceSeconds`, `sinceTime`,
//! `timestamps` and `limitBytes`. The answer is the log, streamed (chunked), or a plain-text
//! error with its status code. `/exec/{namespace}/{pod}/{uid}/{container}`,
//! `/attach/…` and `/portForward/{namespace}/{pod}/{uid}` (GET or POST, an upgrade request)
//! are proxied to the runtime's streaming server ([`streaming`], [`gitplane_kubelet::streaming`]).
//!
//! HTTPS only, with the serving certificate the cluster CA signed for this node, and mutual:
//! the handshake requires a client certificate from the cluster CA, and only a replica's is
//! answered ([`auth`]), before anything of the request is looked at. HTTP/1.1 only, at most
//! [`MAX_CONNECTIONS`] connections, of which a client address holds at most
//! [`MAX_UNVERIFIED_PER_CLIENT`] until it shows a replica's certificate ([`slots`]),
//! [`HANDSHAKE_TIMEOUT`] for the handshake and 10 s to send a request head.

pub mod auth;
mod reply;
pub mod slots;
pub mod streaming;

use crate::{
    kubelet::cri::{Cri, pb},
    kubelet::logs::{cri_log::LogOptions, read::read_logs},
    kubelet::runtime::spec::{LABEL_CONTAINER_NAME, LABEL_POD_NAME, LABEL_POD_NAMESPACE},
    kubelet::stats::StatsProvider,
};
use bytes::Bytes;
use gitplane_kubelet::{query_pairs, streaming::Kind};
use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper::{
    Request, Response, StatusCode,
    body::{Frame, Incoming},
};
use hyper_util::rt::{TokioIo, TokioTimer};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use reply::{Body, text};
pub use slots::{MAX_CONNECTIONS, MAX_UNVERIFIED_PER_CLIENT};
use std::{convert::Infallible, future::Future, sync::Arc, time::Duration};
use tokio::sync::{Semaphore, mpsc};
use tokio_stream::{StreamExt as _, wrappers::ReceiverStream};

/// How long a client may take to complete the TLS handshake: as long as a replica waits for it
/// (the control plane's kubelet client gives up after 5 s).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a connection may go without sending a complete request head (idle between
/// requests, too: hyper runs the timer from the end of the previous answer).
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);

/// What the endpoint needs: the runtime, and its TLS (none: it answers no one).
#[derive(Clone)]
pub(crate) struct KubeletServer {
    pub cri: Cri,
    pub tls: auth::ServingTls,
    pub node_name: String,
    pub stats: Arc<StatsProvider>,
    /// Exec, attach and port-forward streams open ([`streaming::MAX_STREAMS`]).
    pub streams: Arc<Semaphore>,
}

impl KubeletServer {
    /// Serves `listener` until dropped.
    pub async fn serve(self, listener: tokio::net::TcpListener) {
        crate::metrics::register();
        let server = Arc::new(self);
        let slots = slots::Slots::new(MAX_CONNECTIONS, MAX_UNVERIFIED_PER_CLIENT);
        let tls = server.tls.clone();
        accept(listener, tls, slots, move |request, authorized| {
            let server = server.clone();
            async move { server.handle(request, authorized).await }
        })
        .await
    }

    async fn handle<B>(&self, request: Request<B>, authorized: bool) -> Response<Body> {
        if !authorized {
            return text(
                StatusCode::FORBIDDEN,
                "the node's kubelet endpoint answers the control plane's replicas only (their client certificates)",
            );
        }
        let path = request.uri().path().to_owned();
        let segments: Vec<&str> = path.split('/').skip(1).collect();
        let streams = matches!(request.method(), &hyper::Method::GET | &hyper::Method::POST);
        match segments.as_slice() {
            ["exec", namespace, pod, uid, container] if streams => {
                let target = streaming::Target { namespace, pod, uid, container: Some(container) };
                return self.streams().stream(request, Kind::Exec, target).await;
            }
            ["attach", namespace, pod, uid, container] if streams => {
                let target = streaming::Target { namespace, pod, uid, container: Some(container) };
                return self.streams().stream(request, Kind::Attach, target).await;
            }
            ["portForward", namespace, pod, uid] if streams => {
                let target = streaming::Target { namespace, pod, uid, container: None };
                return self.streams().stream(request, Kind::PortForward, target).await;
            }
            _ if request.method() != hyper::Method::GET => {
                return text(StatusCode::METHOD_NOT_ALLOWED, "only GET, and POST for streams");
            }
            ["stats", "summary"] => return self.summary().await,
            _ => {}
        }
        if segments == ["metrics"] {
            return Response::builder()
                .header(hyper::header::CONTENT_TYPE, gitplane_metrics::CONTENT_TYPE)
                .body(Full::new(Bytes::from(gitplane_metrics::registry().encode())).boxed())
                .unwrap_or_else(|_| text(StatusCode::INTERNAL_SERVER_ERROR, "building the answer"));
        }
        let ["containerLogs", namespace, pod, container] = segments.as_slice() else {
            return text(
                StatusCode::NOT_FOUND,
                "not found: the node serves /containerLogs/{namespace}/{pod}/{container}, /stats/summary, /metrics, /exec, /attach and /portForward",
            );
        };
        let query = query_pairs(request.uri().query().unwrap_or(""));
        let (id, options) = match log_request(&query, Timestamp::now()) {
            Ok(parsed) => parsed,
            Err(message) => return text(StatusCode::BAD_REQUEST, &message),
        };
        self.container_logs(namespace, pod, container, id, options).await
    }

    fn streams(&self) -> streaming::Streams<'_> {
        streaming::Streams { cri: &self.cri, open: &self.streams }
    }

    async fn summary(&self) -> Response<Body> {
        match self.stats.summary(&self.cri, &self.node_name).await {
            Ok(summary) => match serde_json::to_vec(&summary) {
                Ok(json) => Response::builder()
                    .header(hyper::header::CONTENT_TYPE, "application/json")
                    .body(Full::new(Bytes::from(json)).boxed())
                    .unwrap_or_else(|_| text(StatusCode::INTERNAL_SERVER_ERROR, "building the answer")),
                Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
            },
            Err(e) => text(StatusCode::SERVICE_UNAVAILABLE, &e.to_string()),
        }
    }

    async fn container_logs(
        &self,
        namespace: &str,
        pod: &str,
        container: &str,
        id: String,
        options: LogOptions,
    ) -> Response<Body> {
        let request = pb::ContainerStatusRequest { container_id: id.clone(), verbose: false };
        let status = match self.cri.runtime().container_status(request).await {
            Ok(status) => status.into_inner().status.unwrap_or_default(),
            Err(s) if s.code() == tonic::Code::NotFound => {
                return text(
                    StatusCode::NOT_FOUND,
                    &format!("container {id} of pod {namespace}/{pod} is not on this node any more (removed)"),
                );
            }
            Err(s) => {
                return text(StatusCode::SERVICE_UNAVAILABLE, &format!("the container runtime: {}", s.message()));
            }
        };
        let label = |key: &str| status.labels.get(key).map(String::as_str);
        if (label(LABEL_POD_NAMESPACE), label(LABEL_POD_NAME), label(LABEL_CONTAINER_NAME))
            != (Some(namespace), Some(pod), Some(container))
        {
            return text(
                StatusCode::NOT_FOUND,
                &format!("container {id} is not container {container} of pod {namespace}/{pod}"),
            );
        }
        if status.log_path.is_empty() {
            return text(StatusCode::NOT_FOUND, &format!("container {id} of pod {namespace}/{pod} has no log file"));
        }
        let path = std::path::PathBuf::from(&status.log_path);
        let (tx, rx) = mpsc::channel(8);
        let cri = self.cri.clone();
        tokio::spawn(async move {
            let running = || {
                let (cri, id) = (cri.clone(), id.clone());
                async move {
                    let request = pb::ContainerStatusRequest { container_id: id, verbose: false };
                    cri.runtime().container_status(request).await.is_ok_and(|s| {
                        s.into_inner().status.is_some_and(|s| s.state == pb::ContainerState::ContainerRunning as i32)
                    })
                }
            };
            if let Err(e) = read_logs(&path, &options, tx, running).await {
                tracing::warn!(file = %path.display(), error = %e, "reading a container log failed");
            }
        });
        let body = StreamBody::new(ReceiverStream::new(rx).map(|chunk| Ok(Frame::data(chunk))));
        Response::builder()
            .header(hyper::header::CONTENT_TYPE, "text/plain")
            .body(body.boxed())
            .unwrap_or_else(|_| text(StatusCode::INTERNAL_SERVER_ERROR, "building the answer"))
    }
}

/// Accepts connections on `listener` into `slots`, completes each one's mutual TLS handshake
/// with `tls` and has `handle` answer its requests (with whether the client is a replica).
/// A connection that has not shown a replica's certificate is closed when its slot is needed.
async fn accept<H, F>(listener: tokio::net::TcpListener, tls: auth::ServingTls, slots: Arc<slots::Slots>, handle: H)
where
    H: Fn(Request<Incoming>, bool) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::warn!(error = %e, "accepting a kubelet endpoint connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Some(slot) = slots.admit(peer.ip()) else {
            tracing::warn!(%peer, "every kubelet endpoint connection is a replica's: closing a new one");
            continue;
        };
        let (tls, handle) = (tls.clone(), handle.clone());
        tokio::spawn(async move {
            let tls = tls.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
            let Some(tls) = tls else { return };
            let handshake = tokio::select! {
                () = slot.evicted() => return tracing::debug!(%peer, "kubelet endpoint connection closed to make room"),
                handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(stream)) => handshake,
            };
            let stream = match handshake {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => return tracing::debug!(%peer, error = %e, "kubelet endpoint handshake refused"),
                Err(_) => return tracing::debug!(%peer, "kubelet endpoint handshake timed out"),
            };
            let client = stream.get_ref().1.peer_certificates().and_then(|c| c.first());
            let authorized = auth::authorized(client.map(|c| c.as_ref()));
            if authorized {
                slot.verified();
            }
            let service = hyper::service::service_fn(move |request| {
                let answer = handle(request, authorized);
                async move { Ok::<_, Infallible>(answer.await) }
            });
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEAD_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service)
                .with_upgrades();
            // Anyone else's connection (a node's certificate: answered 403) still gives way.
            let served = tokio::select! {
                () = slot.evicted(), if !authorized => {
                    return tracing::debug!(%peer, "kubelet endpoint connection closed to make room");
                }
                served = connection => served,
            };
            if let Err(e) = served {
                tracing::debug!(%peer, error = %e, "kubelet endpoint connection ended");
            }
        });
    }
}

/// Puts the endpoint's port in the Node (`status.daemonEndpoints.kubeletEndpoint.Port`), where
/// the control plane looks for it.
pub fn advertise(node: &mut k8s_openapi::api::core::v1::Node, port: u16) {
    use k8s_openapi::api::core::v1::{DaemonEndpoint, NodeDaemonEndpoints};
    let endpoints = NodeDaemonEndpoints { kubelet_endpoint: Some(DaemonEndpoint { port: i32::from(port) }) };
    node.status.get_or_insert_with(Default::default).daemon_endpoints = Some(endpoints);
}

/// The container id and the options of a `/containerLogs` request, or why it is bad.
pub fn log_request(query: &[(String, String)], now: Timestamp) -> Result<(String, LogOptions), String> {
    let get = |key: &str| query.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
    let flag = |key: &str| get(key).is_some_and(|v| v == "true" || v == "1");
    let number = |key: &str| -> Result<Option<u64>, String> {
        get(key).map(|v| v.parse::<u64>().map_err(|_| format!("{key} {v:?} is not a non-negative integer"))).transpose()
    };
    let id = get("containerID").unwrap_or_default();
    let id = id.split_once("://").map_or(id, |(_, id)| id);
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err("containerID must name a container of the runtime".into());
    }
    let since_time = get("sinceTime")
        .map(|t| t.parse::<Timestamp>().map_err(|_| format!("sinceTime {t:?} is not an RFC 3339 time")))
        .transpose()?;
    let since_seconds = number("sinceSeconds")?.map(|s| {
        now.checked_sub(SignedDuration::from_secs(i64::try_from(s).unwrap_or(i64::MAX))).unwrap_or(Timestamp::MIN)
    });
    let options = LogOptions {
        since: since_time.or(since_seconds),
        timestamps: flag("timestamps"),
        tail: number("tailLines")?,
        limit_bytes: number("limitBytes")?,
        follow: flag("follow"),
    };
    Ok((id.to_owned(), options))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gitplane_proto::x509;
    use std::net::{Ipv4Addr, SocketAddr};
    use tokio::{io::AsyncWriteExt as _, net::TcpStream};

    /// The endpoint's TLS (serving 127.0.0.1) and a replica's and a node's client TLS, all
    /// under a CA of the test's.
    struct Pki {
        serving: tokio_rustls::TlsAcceptor,
        replica: tokio_rustls::TlsConnector,
        node: tokio_rustls::TlsConnector,
    }

    fn pki() -> Pki {
        let mut params = rcgen::CertificateParams::default();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap()).unwrap();
        let ca_pem = x509::pem("CERTIFICATE", ca.der());
        let sign = |organization: Option<&str>| {
            let key = rcgen::KeyPair::generate().unwrap();
            let mut params = rcgen::CertificateParams::default();
            match organization {
                None => {
                    params.subject_alt_names = vec![rcgen::SanType::IpAddress(Ipv4Addr::LOCALHOST.into())];
                    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
                }
                Some(organization) => {
                    params.distinguished_name.push(rcgen::DnType::OrganizationName, organization);
                    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
                }
            }
            crate::certificate::with_key(x509::pem("CERTIFICATE", params.signed_by(&key, &ca).unwrap().der()), &key)
        };
        let client = |organization: &str| {
            let pair = sign(Some(organization));
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let mut config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(crate::certificate::roots(&ca_pem).unwrap())
                .with_client_auth_cert(vec![pair.certificate_der().unwrap()], pair.key_der().unwrap())
                .unwrap();
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            tokio_rustls::TlsConnector::from(Arc::new(config))
        };
        Pki {
            serving: auth::acceptor(&ca_pem, Some(sign(None))).unwrap(),
            replica: client(x509::REPLICAS_GROUP),
            node: client(x509::NODES_GROUP),
        }
    }

    /// An endpoint on 127.0.0.1 with `max` slots and `per_client` unverified ones per client,
    /// answering a replica 200 and anyone else 403.
    async fn endpoint(serving: tokio_rustls::TlsAcceptor, max: usize, per_client: usize) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let tls = Arc::new(std::sync::RwLock::new(Some(serving)));
        tokio::spawn(accept(listener, tls, slots::Slots::new(max, per_client), |_, authorized| async move {
            if authorized { text(StatusCode::OK, "ok") } else { text(StatusCode::FORBIDDEN, "replicas only") }
        }));
        addr
    }

    async fn connect_from(host: u8, to: SocketAddr) -> TcpStream {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::from((Ipv4Addr::new(127, 0, 0, host), 0))).unwrap();
        socket.connect(to).await.unwrap()
    }

    type Sender = hyper::client::conn::http1::SendRequest<http_body_util::Empty<Bytes>>;

    /// A keep-alive connection from 127.0.0.`host` over `tls`.
    async fn open(tls: &tokio_rustls::TlsConnector, host: u8, to: SocketAddr) -> Option<Sender> {
        let stream = connect_from(host, to).await;
        let name = rustls::pki_types::ServerName::IpAddress(Ipv4Addr::LOCALHOST.into());
        let stream = tls.connect(name, stream).await.ok()?;
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.ok()?;
        tokio::spawn(connection);
        Some(sender)
    }

    async fn get(sender: &mut Sender) -> Option<StatusCode> {
        let request = Request::get("/stats/summary").body(http_body_util::Empty::new()).ok()?;
        Some(sender.send_request(request).await.ok()?.status())
    }

    /// One request on a new connection, within a deadline.
    async fn status(tls: &tokio_rustls::TlsConnector, host: u8, to: SocketAddr) -> Option<StatusCode> {
        let request = async { get(&mut open(tls, host, to).await?).await };
        tokio::time::timeout(Duration::from_secs(10), request).await.ok().flatten()
    }

    /// `count` connections from 127.0.0.`host` that send one byte of a handshake and then wait.
    async fn idle(host: u8, to: SocketAddr, count: usize) -> Vec<TcpStream> {
        let mut idle = Vec::new();
        for _ in 0..count {
            let mut stream = connect_from(host, to).await;
            stream.write_all(&[0x16]).await.unwrap();
            idle.push(stream);
        }
        idle
    }

    #[tokio::test]
    async fn t10_clients_holding_idle_connections_do_not_keep_a_replica_out() {
        let pki = pki();
        let addr = endpoint(pki.serving, 8, 4).await;
        // A replica keeps two connections open, answered.
        let mut held = Vec::new();
        for _ in 0..2 {
            let mut sender = open(&pki.replica, 3, addr).await.unwrap();
            assert_eq!(get(&mut sender).await, Some(StatusCode::OK));
            held.push(sender);
        }
        // A neighbour opens 20 connections that never finish a handshake; another node
        // completes handshakes with its own certificate and keeps them open.
        let _idle = idle(2, addr, 20).await;
        for _ in 0..4 {
            assert_eq!(status(&pki.node, 4, addr).await, Some(StatusCode::FORBIDDEN));
        }
        // The replica is served on a new connection, and on the ones it held.
        assert_eq!(status(&pki.replica, 3, addr).await, Some(StatusCode::OK));
        for sender in &mut held {
            assert_eq!(get(sender).await, Some(StatusCode::OK), "a replica's open connection is never closed");
        }
        // From the neighbour's own address too (clients on loopback share one).
        assert_eq!(status(&pki.replica, 2, addr).await, Some(StatusCode::OK));
        // Idle connections from many addresses (4 each, 24 in all) fill every slot they can.
        let mut crowd = Vec::new();
        for host in 10..16 {
            crowd.push(idle(host, addr, 4).await);
        }
        assert_eq!(status(&pki.replica, 3, addr).await, Some(StatusCode::OK));
    }

    #[test]
    fn parses_log_requests() {
        let now: Timestamp = "2026-12-03T16:00:00Z".parse().unwrap();
        let q = query_pairs(
            "containerID=containerd%3A%2F%2Fabc123&follow=true&tailLines=5&sinceTime=2026-12-03T15%3A00%3A00Z&timestamps=1&limitBytes=10",
        );
        let (id, options) = log_request(&q, now).unwrap();
        assert_eq!(id, "abc123");
        assert_eq!(
            options,
            LogOptions {
                since: Some("2026-12-03T15:00:00Z".parse().unwrap()),
                timestamps: true,
                tail: Some(5),
                limit_bytes: Some(10),
                follow: true,
            }
        );
        let (_, options) = log_request(&query_pairs("containerID=abc&sinceSeconds=60"), now).unwrap();
        assert_eq!(options.since, Some("2026-12-03T15:59:00Z".parse().unwrap()));
        assert!(!options.follow && !options.timestamps);
        for bad in [
            "",
            "containerID=",
            "containerID=../etc",
            "containerID=abc&tailLines=-1",
            "containerID=abc&limitBytes=x",
            "containerID=abc&sinceTime=yesterday",
            "containerID=abc&sinceSeconds=99999999999999999999999",
        ] {
            assert!(log_request(&query_pairs(bad), now).is_err(), "{bad}");
        }
        assert!(log_request(&query_pairs("containerID=abc&sinceSeconds=9999999999999"), now).is_ok());
        assert_eq!(
            query_pairs("a=%zz&b=%4&c=x+y"),
            [("a".into(), "%zz".into()), ("b".into(), "%4".into()), ("c".into(), "x y".into())]
        );
    }
}
