//! The node's side of exec, attach and port-forward streams (the kubelet's `/exec`, `/attach`
//! and `/portForward` handlers): the container (or the Pod's sandbox) found, the runtime asked
//! for a streaming URL, and the request proxied there with [`gitplane_kubelet::streaming`].

use super::reply::{Body, text};
use crate::kubelet::{
    cri::{Cri, pb},
    runtime::spec::{LABEL_CONTAINER_NAME, LABEL_POD_NAME, LABEL_POD_NAMESPACE, LABEL_POD_UID},
};
use gitplane_kubelet::streaming::{Kind, RESPONSE_TIMEOUT, StreamOptions, is_upgrade, options, proxy};
use http_body_util::{BodyExt as _, Full};
use hyper::{Request, Response, StatusCode};
use std::{collections::HashMap, net::SocketAddr, sync::Arc};
use tokio::sync::Semaphore;

/// Streams one node serves at once; more are refused with 429.
pub const MAX_STREAMS: usize = 64;

/// The node's side of streams: the runtime, and the streams open ([`MAX_STREAMS`] at most).
pub(super) struct Streams<'a> {
    pub cri: &'a Cri,
    pub open: &'a Arc<Semaphore>,
}

/// Finds the container (or the Pod's sandbox), asks the runtime for a streaming URL and proxies
/// the request there.
impl Streams<'_> {
    pub(super) async fn stream<B>(&self, mut request: Request<B>, kind: Kind, target: Target<'_>) -> Response<Body> {
        let query = gitplane_kubelet::query_pairs(request.uri().query().unwrap_or(""));
        let options = match options(kind, &query) {
            Ok(options) => options,
            Err(message) => return text(StatusCode::BAD_REQUEST, &message),
        };
        if !is_upgrade(request.headers()) {
            return text(StatusCode::BAD_REQUEST, "Upgrade request required");
        }
        let Ok(slot) = self.open.clone().try_acquire_owned() else {
            return text(StatusCode::TOO_MANY_REQUESTS, &format!("this node serves {MAX_STREAMS} streams at once"));
        };
        let url = match self.runtime_url(kind, &target, &options).await {
            Ok(url) => url,
            Err(refusal) => return refusal,
        };
        let Some((addr, path)) = stream_server(&url) else {
            return text(StatusCode::BAD_GATEWAY, "the runtime's streaming URL is not http://<ip>:<port>/…");
        };
        let io = match tokio::time::timeout(RESPONSE_TIMEOUT, tokio::net::TcpStream::connect(addr)).await {
            Ok(Ok(io)) => io,
            _ => {
                return text(
                    StatusCode::BAD_GATEWAY,
                    &format!("the runtime's streaming server at {addr} is unreachable"),
                );
            }
        };
        let client = hyper::upgrade::on(&mut request);
        let answer = proxy(io, client, request.method(), request.headers(), path, &addr.to_string(), None, slot).await;
        match answer {
            Ok(response) => response.map(|b| Full::new(b).boxed()),
            Err(e) => text(StatusCode::BAD_GATEWAY, &format!("the runtime's streaming server: {e}")),
        }
    }

    async fn runtime_url(
        &self,
        kind: Kind,
        target: &Target<'_>,
        options: &StreamOptions,
    ) -> Result<String, Response<Body>> {
        let mut selector = HashMap::from([
            (LABEL_POD_NAMESPACE.to_owned(), target.namespace.to_owned()),
            (LABEL_POD_NAME.to_owned(), target.pod.to_owned()),
            (LABEL_POD_UID.to_owned(), target.uid.to_owned()),
        ]);
        let runtime_error = |s: tonic::Status| {
            text(StatusCode::SERVICE_UNAVAILABLE, &format!("the container runtime: {}", s.message()))
        };
        let mut runtime = self.cri.runtime();
        if kind == Kind::PortForward {
            let filter = pb::PodSandboxFilter {
                state: Some(pb::PodSandboxStateValue { state: pb::PodSandboxState::SandboxReady as i32 }),
                label_selector: selector,
                ..Default::default()
            };
            let sandboxes = runtime
                .list_pod_sandbox(pb::ListPodSandboxRequest { filter: Some(filter) })
                .await
                .map_err(runtime_error)?;
            let Some(sandbox) = sandboxes.into_inner().items.into_iter().max_by_key(|s| s.created_at) else {
                return Err(text(
                    StatusCode::NOT_FOUND,
                    &format!("pod {}/{} has no ready sandbox on this node", target.namespace, target.pod),
                ));
            };
            let ports = options.ports.iter().map(|p| i32::from(*p)).collect();
            let request = pb::PortForwardRequest { pod_sandbox_id: sandbox.id, port: ports };
            return Ok(runtime.port_forward(request).await.map_err(runtime_error)?.into_inner().url);
        }
        let container = target.container.unwrap_or_default();
        selector.insert(LABEL_CONTAINER_NAME.to_owned(), container.to_owned());
        let filter = pb::ContainerFilter {
            state: Some(pb::ContainerStateValue { state: pb::ContainerState::ContainerRunning as i32 }),
            label_selector: selector,
            ..Default::default()
        };
        let containers =
            runtime.list_containers(pb::ListContainersRequest { filter: Some(filter) }).await.map_err(runtime_error)?;
        let Some(found) = containers.into_inner().containers.into_iter().max_by_key(|c| c.created_at) else {
            return Err(text(
                StatusCode::NOT_FOUND,
                &format!(
                    "container {container} of pod {}/{} is not running on this node",
                    target.namespace, target.pod
                ),
            ));
        };
        let url = if kind == Kind::Exec {
            let request = pb::ExecRequest {
                container_id: found.id,
                cmd: options.command.clone(),
                tty: options.tty,
                stdin: options.stdin,
                stdout: options.stdout,
                stderr: options.stderr,
            };
            runtime.exec(request).await.map_err(runtime_error)?.into_inner().url
        } else {
            let request = pb::AttachRequest {
                container_id: found.id,
                stdin: options.stdin,
                tty: options.tty,
                stdout: options.stdout,
                stderr: options.stderr,
            };
            runtime.attach(request).await.map_err(runtime_error)?.into_inner().url
        };
        Ok(url)
    }
}

/// What a node's stream request names: `/{kind}/{namespace}/{pod}/{uid}[/{container}]`.
pub struct Target<'a> {
    pub namespace: &'a str,
    pub pod: &'a str,
    pub uid: &'a str,
    pub container: Option<&'a str>,
}

/// `http://<ip>:<port>/<path>` (what containerd's streaming server answers with) split.
fn stream_server(url: &str) -> Option<(SocketAddr, &str)> {
    let rest = url.strip_prefix("http://")?;
    let slash = rest.find('/')?;
    let addr = rest[..slash].parse().ok()?;
    Some((addr, &rest[slash..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streaming_urls_are_recognised() {
        assert_eq!(
            stream_server("http://127.0.0.1:41235/exec/Ab_c"),
            Some(("127.0.0.1:41235".parse().unwrap(), "/exec/Ab_c"))
        );
        for bad in ["https://127.0.0.1:1/x", "http://localhost:1/x", "http://127.0.0.1:1"] {
            assert_eq!(stream_server(bad), None, "{bad}");
        }
    }
}
