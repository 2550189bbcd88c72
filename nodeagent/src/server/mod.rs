//! The agent's kubelet endpoint (the kubelet's server on port 10250), which the control plane's
//! replicas call for `kubectl top` (`GET /stats/summary`, see [`crate::stats`]), for the
//! agent's Prometheus metrics (`GET /metrics`, see [`crate::metrics`]) and for
//! `kubectl logs`: `GET /containerLogs/{namespace}/{pod}/{container}` with
//! `containerID` (which run: the replica chose it from the Pod's status, as the kubelet's
//! `validateContainerLogStatus`), `follow`, `tailLines`, `sinceSeconds`, `sinceTime`,
//! `timestamps` and `limitBytes`. The answer is the log, streamed (chunked), or a plain-text
//! error with its status code. `/exec/{namespace}/{pod}/{uid}/{container}`,
//! `/attach/…` and `/portForward/{namespace}/{pod}/{uid}` (GET or POST, an upgrade request)
//! are proxied to the runtime's streaming server ([`streaming`]).
//!
//! HTTPS only, with the serving certificate the cluster CA signed for this node, and mutual:
//! the handshake requires a client certificate from the cluster CA, and only a replica's is
//! answered ([`auth`]), before anything of the request is looked at. HTTP/1.1 only, at most
//! [`MAX_CONNECTIONS`] connections, 10 s for the handshake and 10 s to send a request head.

pub mod auth;
pub mod streaming;

use crate::{
    cri::{Cri, pb},
    logs::{cri_log::LogOptions, read::read_logs},
    runtime::spec::{LABEL_CONTAINER_NAME, LABEL_POD_NAME, LABEL_POD_NAMESPACE},
    stats::StatsProvider,
};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, StreamBody, combinators::BoxBody};
use hyper::{Request, Response, StatusCode, body::Frame};
use hyper_util::rt::{TokioIo, TokioTimer};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use std::{convert::Infallible, sync::Arc, time::Duration};
use tokio::sync::{Semaphore, mpsc};
use tokio_stream::{StreamExt as _, wrappers::ReceiverStream};

/// The kubelet's default port.
pub const DEFAULT_PORT: u16 = 10250;
/// Connections served at once; more are closed at once.
pub const MAX_CONNECTIONS: usize = 256;
/// How long a client may take to complete the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

type Body = BoxBody<Bytes, Infallible>;

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
        let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a kubelet endpoint connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let Ok(slot) = slots.clone().try_acquire_owned() else {
                tracing::warn!(%peer, "too many kubelet endpoint connections: closing one");
                continue;
            };
            let server = server.clone();
            tokio::spawn(async move {
                let _slot = slot;
                let tls = server.tls.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
                let Some(tls) = tls else { return };
                let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(stream)).await;
                let stream = match handshake {
                    Ok(Ok(stream)) => stream,
                    Ok(Err(e)) => return tracing::debug!(%peer, error = %e, "kubelet endpoint handshake refused"),
                    Err(_) => return tracing::debug!(%peer, "kubelet endpoint handshake timed out"),
                };
                let client = stream.get_ref().1.peer_certificates().and_then(|c| c.first());
                let authorized = auth::authorized(client.map(|c| c.as_ref()));
                let service = hyper::service::service_fn(move |request| {
                    let server = server.clone();
                    async move { Ok::<_, Infallible>(server.handle(request, authorized).await) }
                });
                let connection = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(Duration::from_secs(10))
                    .serve_connection(TokioIo::new(stream), service)
                    .with_upgrades();
                if let Err(e) = connection.await {
                    tracing::debug!(%peer, error = %e, "kubelet endpoint connection ended");
                }
            });
        }
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
                return self.stream(request, streaming::Kind::Exec, target).await;
            }
            ["attach", namespace, pod, uid, container] if streams => {
                let target = streaming::Target { namespace, pod, uid, container: Some(container) };
                return self.stream(request, streaming::Kind::Attach, target).await;
            }
            ["portForward", namespace, pod, uid] if streams => {
                let target = streaming::Target { namespace, pod, uid, container: None };
                return self.stream(request, streaming::Kind::PortForward, target).await;
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

/// Puts the endpoint's port in the Node (`status.daemonEndpoints.kubeletEndpoint.Port`), where
/// the control plane looks for it.
pub fn advertise(node: &mut k8s_openapi::api::core::v1::Node, port: u16) {
    use k8s_openapi::api::core::v1::{DaemonEndpoint, NodeDaemonEndpoints};
    let endpoints = NodeDaemonEndpoints { kubelet_endpoint: Some(DaemonEndpoint { port: i32::from(port) }) };
    node.status.get_or_insert_with(Default::default).daemon_endpoints = Some(endpoints);
}

fn text(code: StatusCode, message: &str) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(message.to_owned())).boxed());
    *response.status_mut() = code;
    response.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("text/plain"));
    response
}

/// `a=1&b=x%3Ay` as pairs, percent-decoded (`+` is a space).
pub fn query_pairs(query: &str) -> Vec<(String, String)> {
    fn decode(s: &str) -> String {
        let bytes = s.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'+' => out.push(b' '),
                b'%' => match bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok())
                {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                },
                b => out.push(b),
            }
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    }
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
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
