//! The `pods/exec`, `pods/attach` and `pods/portforward` subresources (`kubectl exec`,
//! `attach`, `port-forward`): a person at a terminal, not desired state, so they are served
//! only to tokens with the `debug` role (checked by [`crate::authz`] before this runs), and
//! each stream opened is recorded as an Event on the Pod naming the user (never what flows).
//!
//! As kube-apiserver does, the options are validated here, the Pod, its node and container
//! looked up, and the upgrade request proxied to the node's kubelet endpoint, which proxies it
//! on to the runtime's streaming server ([`gitplane_kubelet::streaming`]): the
//! client and containerd negotiate the protocol. containerd 1.6 speaks SPDY/3.1 and the
//! WebSocket channel protocols up to `v4.channel.k8s.io`, so two WebSocket offers are refused
//! with 400 before anything is proxied: a `v5.channel.k8s.io` offer (kubectl 1.30+, which then
//! falls back to SPDY, whose streams can half-close stdin as v4 cannot) and port-forward's SPDY
//! tunneled in WebSocket (kubectl falls back to plain SPDY). Older WebSocket clients (v4 and
//! below) pass through.

use super::{ApiState, logs, status};
use crate::authn::User;
use axum::{
    body::Body,
    extract::{Path, Request, State},
    http::{Method, StatusCode},
    response::Response,
};
use gitplane_api::events::{NORMAL, reference};
use gitplane_kubelet::{
    query_pairs,
    streaming::{self, Kind, StreamOptions},
};
use gitplane_store::ObjectKey;
use k8s_openapi::api::core::v1::{Node, Pod};
use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
};

/// Streams one user may hold open at once; more are refused with 429.
pub const MAX_STREAMS_PER_USER: usize = 16;

/// The streams each user holds.
#[derive(Clone, Default)]
pub struct Sessions {
    held: Arc<Mutex<HashMap<String, usize>>>,
}

/// One stream of one user; released on drop (when the stream ends).
pub struct Session {
    user: String,
    held: Arc<Mutex<HashMap<String, usize>>>,
}

impl Sessions {
    fn try_take(&self, user: &str) -> Option<Session> {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let count = held.entry(user.to_owned()).or_default();
        if *count >= MAX_STREAMS_PER_USER {
            return None;
        }
        *count += 1;
        Some(Session { user: user.to_owned(), held: self.held.clone() })
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = held.get_mut(&self.user) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.user);
            }
        }
    }
}

type Refusal = (StatusCode, &'static str, String);

pub async fn exec(state: State<ApiState>, path: Path<(String, String)>, request: Request) -> Response {
    serve(state, path, request, Kind::Exec).await
}

pub async fn attach(state: State<ApiState>, path: Path<(String, String)>, request: Request) -> Response {
    serve(state, path, request, Kind::Attach).await
}

pub async fn port_forward(state: State<ApiState>, path: Path<(String, String)>, request: Request) -> Response {
    serve(state, path, request, Kind::PortForward).await
}

async fn serve(
    State(state): State<ApiState>,
    Path((namespace, name)): Path<(String, String)>,
    request: Request,
    kind: Kind,
) -> Response {
    match open(&state, &namespace, &name, request, kind).await {
        Ok(response) => response,
        Err((code, reason, message)) => status(code, reason, message),
    }
}

/// Whether the protocol offered is one the streaming server behind can speak (see the module
/// comment); a refusal says what to use instead.
fn check_protocol(kind: Kind, request: &Request) -> Result<(), Refusal> {
    let bad = |message: String| (StatusCode::BAD_REQUEST, "BadRequest", message);
    // HTTP/2 has no Upgrade (kubectl opens streams over HTTP/1.1 always).
    if !streaming::is_upgrade(request.headers()) || request.version() != axum::http::Version::HTTP_11 {
        return Err(bad("Upgrade request required".into()));
    }
    let Some(offered) = streaming::websocket_protocols(request.headers()) else { return Ok(()) };
    if kind == Kind::PortForward {
        return Err(bad("port-forward is served over SPDY/3.1, not tunneled in WebSocket".into()));
    }
    if offered.iter().any(|p| p == "v5.channel.k8s.io") {
        return Err(bad(format!(
            "{} is served over SPDY/3.1 or WebSocket v4.channel.k8s.io, not v5.channel.k8s.io",
            kind.subresource()
        )));
    }
    Ok(())
}

async fn open(
    state: &ApiState,
    namespace: &str,
    name: &str,
    mut request: Request,
    kind: Kind,
) -> Result<Response, Refusal> {
    let bad = |message: String| (StatusCode::BAD_REQUEST, "BadRequest", message);
    let internal = |e: String| (StatusCode::INTERNAL_SERVER_ERROR, "InternalError", e);
    let unavailable = |message: String| (StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable", message);
    if !matches!(*request.method(), Method::GET | Method::POST) {
        let message = format!("pods/{} is opened with POST (SPDY) or GET (WebSocket)", kind.subresource());
        return Err((StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed", message));
    }
    // Only set once authorization passed; its absence is a request that bypassed it.
    let Some(user) = request.extensions().get::<Arc<User>>().cloned() else {
        return Err((StatusCode::FORBIDDEN, "Forbidden", "no authenticated user".into()));
    };
    let mut options = streaming::options(kind, &query_pairs(request.uri().query().unwrap_or(""))).map_err(bad)?;
    check_protocol(kind, &request)?;
    let pod = state.store.get(&ObjectKey::new("Pod", namespace, name)).await.map_err(|e| internal(e.to_string()))?;
    let Some(pod) = pod else {
        return Err((StatusCode::NOT_FOUND, "NotFound", format!("pods {name:?} not found")));
    };
    let pod: Pod = serde_json::from_value(pod).map_err(|e| internal(format!("pod {namespace}/{name}: {e}")))?;
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
    if matches!(phase, "Succeeded" | "Failed") {
        let verb = kind.subresource();
        return Err(bad(format!("cannot {verb} into a container in a completed pod; current phase is {phase}")));
    }
    let node_name = pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
    if node_name.is_empty() {
        return Err(bad(format!("pod {name} does not have a host assigned")));
    }
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    if kind != Kind::PortForward {
        let container = logs::container(&pod, name, options.container.as_deref())?;
        running(&pod, &container)?;
        options.container = Some(container);
    }
    let Some(session) = state.sessions.try_take(&user.name) else {
        return Err((
            StatusCode::TOO_MANY_REQUESTS,
            "TooManyRequests",
            format!("user {} holds {MAX_STREAMS_PER_USER} streams already: close some", user.name),
        ));
    };
    let node = state.store.get(&ObjectKey::new("Node", "", &node_name)).await.map_err(|e| internal(e.to_string()))?;
    let node: Node = match node.map(serde_json::from_value) {
        Some(Ok(node)) => node,
        Some(Err(e)) => return Err(internal(format!("node {node_name}: {e}"))),
        None => return Err(unavailable(format!("node {node_name:?} that pod {name:?} is bound to is not registered"))),
    };
    let mut path = format!("/{}/{namespace}/{name}/{uid}", kind.kubelet_path());
    if let Some(container) = &options.container {
        path.push('/');
        path.push_str(container);
    }
    path.push('?');
    path.push_str(&streaming::query(&options));
    let client = hyper::upgrade::on(&mut request);
    let answer = state
        .kubelet
        .upgrade(&node, request.method(), &path, request.headers(), client, session)
        .await
        .map_err(|e| unavailable(format!("opening the stream: {e}")))?;
    let (parts, body) = answer.into_parts();
    if parts.status == StatusCode::SWITCHING_PROTOCOLS {
        let (reason, message) = describe(kind, &user.name, name, &options);
        state.events.event(reference(&pod), NORMAL, reason, &message);
        return Ok(Response::from_parts(parts, Body::empty()));
    }
    // The node's (or the runtime's) refusal: said with the Kubernetes status.
    let message = format!("node {node_name}: {}", String::from_utf8_lossy(&body).trim());
    Err(match parts.status {
        StatusCode::BAD_REQUEST => bad(message),
        StatusCode::NOT_FOUND => (StatusCode::NOT_FOUND, "NotFound", message),
        StatusCode::TOO_MANY_REQUESTS => (StatusCode::TOO_MANY_REQUESTS, "TooManyRequests", message),
        StatusCode::UNAUTHORIZED => internal(format!("{message} (the node refused this replica's token)")),
        _ => (StatusCode::BAD_GATEWAY, "InternalError", message),
    })
}

/// A container must be running to exec in or attach to.
fn running(pod: &Pod, container: &str) -> Result<(), Refusal> {
    let status = pod.status.as_ref();
    let statuses = [
        status.and_then(|s| s.container_statuses.as_deref()),
        status.and_then(|s| s.init_container_statuses.as_deref()),
    ];
    let found = statuses.into_iter().flatten().flatten().find(|s| s.name == container);
    if found.and_then(|s| s.state.as_ref()).is_some_and(|s| s.running.is_some()) {
        return Ok(());
    }
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    Err((StatusCode::BAD_REQUEST, "BadRequest", format!("container {container} in pod {name} is not running")))
}

/// The Event's reason and message: who opened what (the command, never the data).
fn describe(kind: Kind, user: &str, pod: &str, options: &StreamOptions) -> (&'static str, String) {
    let container = options.container.as_deref().unwrap_or_default();
    match kind {
        Kind::Exec => {
            ("Exec", format!("user {user} started exec of [{}] in container {container}", options.command.join(" ")))
        }
        Kind::Attach => ("Attach", format!("user {user} attached to container {container}")),
        Kind::PortForward if options.ports.is_empty() => {
            ("PortForward", format!("user {user} started port-forward to pod {pod}"))
        }
        Kind::PortForward => {
            let ports: Vec<String> = options.ports.iter().map(u16::to_string).collect();
            ("PortForward", format!("user {user} started port-forward to pod {pod} ports [{}]", ports.join(" ")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::authn::Role;
    use gitplane_storage::sqlite::SqliteStore;
    use gitplane_store::{Op, Store};
    use serde_json::{Value, json};
    use tower::ServiceExt as _;

    fn user() -> Arc<User> {
        Arc::new(User { name: "alice".into(), uid: "1".into(), roles: vec![Role::Debug], groups: vec![] })
    }

    async fn call(router: &axum::Router, method: Method, uri: &str, headers: &[(&str, &str)]) -> (StatusCode, Value) {
        let mut request = axum::http::Request::builder().method(method).uri(uri).version(axum::http::Version::HTTP_11);
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        let mut request = request.body(Body::empty()).unwrap();
        request.extensions_mut().insert(user());
        let response = router.clone().oneshot(request).await.unwrap();
        let code = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
        (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    /// Every refusal that comes before a node is asked: a Kubernetes Status, never a panic.
    #[tokio::test]
    async fn requests_are_checked_before_any_node_is_asked() {
        let store: Arc<dyn Store> = Arc::new(SqliteStore::memory().await.unwrap());
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "a", "uid": "u1"},
                         "spec": {"nodeName": "n1", "containers": [{"name": "c"}, {"name": "d"}]},
                         "status": {"phase": "Running", "containerStatuses": [
                             {"name": "c", "state": {"running": {}}}, {"name": "d", "state": {"waiting": {}}}]}});
        let done = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "q", "namespace": "a"},
                          "spec": {"nodeName": "n1", "containers": [{"name": "c"}]}, "status": {"phase": "Succeeded"}});
        store.txn(vec![Op::Create(pod), Op::Create(done)]).await.unwrap();
        let kubelet = crate::kubelet_client::KubeletClient::for_tests();
        let router = super::super::router(store, "repo".into(), kubelet);
        let spdy =
            [("connection", "Upgrade"), ("upgrade", "SPDY/3.1"), ("x-stream-protocol-version", "v4.channel.k8s.io")];
        let ws_v5 = [
            ("connection", "Upgrade"),
            ("upgrade", "websocket"),
            ("sec-websocket-protocol", "v5.channel.k8s.io, v4.channel.k8s.io"),
        ];
        let exec = "/api/v1/namespaces/a/pods/p/exec";
        type Case<'a> = (Method, String, &'a [(&'a str, &'a str)], StatusCode, &'a str);
        let cases: &[Case] = &[
            (
                Method::POST,
                format!("{exec}?command=ls&stdout=true&container=c"),
                &[],
                StatusCode::BAD_REQUEST,
                "Upgrade request required",
            ),
            (
                Method::POST,
                format!("{exec}?stdout=true&container=c"),
                &spdy,
                StatusCode::BAD_REQUEST,
                "at least 1 command",
            ),
            (Method::POST, format!("{exec}?command=ls&stdout=maybe"), &spdy, StatusCode::BAD_REQUEST, "not a boolean"),
            (
                Method::POST,
                format!("{exec}?command=ls&stdout=1"),
                &spdy,
                StatusCode::BAD_REQUEST,
                "choose one of: [c d]",
            ),
            (
                Method::POST,
                format!("{exec}?command=ls&stdout=1&container=e"),
                &spdy,
                StatusCode::BAD_REQUEST,
                "not valid for pod p",
            ),
            (
                Method::POST,
                format!("{exec}?command=ls&stdout=1&container=d"),
                &spdy,
                StatusCode::BAD_REQUEST,
                "is not running",
            ),
            (
                Method::GET,
                format!("{exec}?command=ls&stdout=1&container=c"),
                &ws_v5,
                StatusCode::BAD_REQUEST,
                "not v5.channel.k8s.io",
            ),
            (
                Method::DELETE,
                format!("{exec}?command=ls&stdout=1"),
                &spdy,
                StatusCode::METHOD_NOT_ALLOWED,
                "opened with POST",
            ),
            (
                Method::POST,
                "/api/v1/namespaces/a/pods/x/exec?command=ls&stdout=1".into(),
                &spdy,
                StatusCode::NOT_FOUND,
                "not found",
            ),
            (
                Method::POST,
                "/api/v1/namespaces/a/pods/q/attach?stdout=1".into(),
                &spdy,
                StatusCode::BAD_REQUEST,
                "completed pod",
            ),
            (
                Method::GET,
                "/api/v1/namespaces/a/pods/p/portforward".into(),
                &ws_v5,
                StatusCode::BAD_REQUEST,
                "SPDY/3.1",
            ),
            (
                Method::POST,
                "/api/v1/namespaces/a/pods/p/portforward?ports=99999".into(),
                &spdy,
                StatusCode::BAD_REQUEST,
                "not a port",
            ),
            // Everything checked, the node (n1) is not registered.
            (
                Method::POST,
                format!("{exec}?command=ls&stdout=1&container=c"),
                &spdy,
                StatusCode::SERVICE_UNAVAILABLE,
                "not registered",
            ),
        ];
        for (method, uri, headers, code, says) in cases {
            let (got, body) = call(&router, method.clone(), uri, headers).await;
            assert_eq!(got, *code, "{method} {uri}: {body}");
            assert_eq!(body["kind"], "Status", "{body}");
            assert!(body["message"].as_str().unwrap().contains(says), "{uri}: {body}");
        }
        // HTTP/2 cannot upgrade.
        let mut h2 = axum::http::Request::builder()
            .method(Method::POST)
            .uri(format!("{exec}?command=ls&stdout=1&container=c"))
            .version(axum::http::Version::HTTP_2);
        for (k, v) in spdy {
            h2 = h2.header(k, v);
        }
        let mut h2 = h2.body(Body::empty()).unwrap();
        h2.extensions_mut().insert(user());
        assert_eq!(router.clone().oneshot(h2).await.unwrap().status(), StatusCode::BAD_REQUEST);
    }

    /// Query strings and upgrade headers from outside: always a Kubernetes answer, never a panic
    /// or an internal error (a valid request ends at the unregistered node: 503).
    #[test]
    fn t30_fuzz_stream_options() {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let router = runtime.block_on(async {
            let store: Arc<dyn Store> = Arc::new(SqliteStore::memory().await.unwrap());
            let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "a"},
                             "spec": {"nodeName": "n1", "containers": [{"name": "c"}]},
                             "status": {"phase": "Running", "containerStatuses": [{"name": "c", "state": {"running": {}}}]}});
            store.txn(vec![Op::Create(pod)]).await.unwrap();
            let kubelet = crate::kubelet_client::KubeletClient::for_tests();
            super::super::router(store, "repo".into(), kubelet)
        });
        let seeds: [&[u8]; 3] = [
            b"exec?command=sh&command=-c&command=ls%20-l&stdin=true&stdout=1&tty=false&container=c",
            b"attach?stdout=true&stderr=T&container=c",
            b"portforward?ports=80,8080&ports=1",
        ];
        let dictionary: &[&[u8]] = &[
            b"&",
            b"=",
            b"%",
            b"%00",
            b"%ff",
            b"+",
            b",",
            b"command=",
            b"container=",
            b"stdin=",
            b"stdout=",
            b"stderr=",
            b"tty=",
            b"ports=",
            b"true",
            b"false",
            b"0",
            b"65536",
            b"-1",
            b"exec?",
            b"attach?",
            b"portforward?",
        ];
        let target = gitplane_fuzz::Target { name: "stream-options", seeds: &seeds, dictionary, max_len: 1 << 10 };
        gitplane_fuzz::fuzz(target, |input| {
            let Ok(rest) = std::str::from_utf8(input) else { return };
            let Ok(uri) = format!("/api/v1/namespaces/a/pods/p/{rest}").parse::<axum::http::Uri>() else { return };
            let upgrade = if input.first().is_some_and(|b| b % 2 == 0) { "SPDY/3.1" } else { "websocket" };
            let mut request = axum::http::Request::builder()
                .version(axum::http::Version::HTTP_11)
                .method(Method::POST)
                .uri(uri)
                .header("connection", "Upgrade")
                .header("upgrade", upgrade)
                .header("sec-websocket-protocol", "v4.channel.k8s.io")
                .body(Body::empty())
                .unwrap();
            request.extensions_mut().insert(user());
            let response = runtime.block_on(router.clone().oneshot(request)).unwrap();
            let code = response.status();
            assert!(!code.is_server_error() || code == StatusCode::SERVICE_UNAVAILABLE, "{rest}: {code}");
        });
    }

    #[test]
    fn events_name_the_user_and_command_only() {
        let options = StreamOptions {
            command: vec!["sh".into(), "-c".into(), "cat".into()],
            container: Some("c".into()),
            stdin: true,
            ..Default::default()
        };
        assert_eq!(
            describe(Kind::Exec, "alice", "p", &options),
            ("Exec", "user alice started exec of [sh -c cat] in container c".into())
        );
        assert_eq!(describe(Kind::Attach, "bob", "p", &options).1, "user bob attached to container c");
        let forward = StreamOptions { ports: vec![80, 8080], ..Default::default() };
        assert_eq!(
            describe(Kind::PortForward, "bob", "p", &forward).1,
            "user bob started port-forward to pod p ports [80 8080]"
        );
    }

    #[test]
    fn each_user_holds_a_bounded_number_of_streams() {
        let sessions = Sessions::default();
        let held: Vec<Session> = (0..MAX_STREAMS_PER_USER).map(|_| sessions.try_take("alice").unwrap()).collect();
        assert!(sessions.try_take("alice").is_none());
        assert!(sessions.try_take("bob").is_some());
        drop(held);
        assert!(sessions.try_take("alice").is_some());
    }
}
