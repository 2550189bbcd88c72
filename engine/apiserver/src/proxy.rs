//! `nodes/{name}/proxy/{path}`, kube-apiserver's node proxy, for the read-only paths of the
//! agent's kubelet endpoint only: `metrics` (what Prometheus scrapes of a kubelet through the API
//! server: `kubectl get --raw /api/v1/nodes/<node>/proxy/metrics`) and `stats/summary`. The
//! replica calls the node over mutual TLS with its own certificate; the caller needs
//! only the `read` role, since neither path carries anything a read does not already show.

use super::status;
use crate::kubelet_client::KubeletClient;
use axum::{
    body::Body,
    http::{Method, StatusCode, header::CONTENT_TYPE},
    response::{IntoResponse as _, Response},
};
use gitplane_store::{ObjectKey, Store};
use k8s_openapi::api::core::v1::Node;

/// The node and the kubelet path of `v1/nodes/{name}/proxy/{path}`, if that is the path.
pub fn proxy_path(path: &str) -> Option<(&str, &str)> {
    let rest = path.strip_prefix("v1/nodes/")?;
    let (node, path) = rest.split_once("/proxy/")?;
    (!node.is_empty() && !node.contains('/')).then_some((node, path))
}

/// The kubelet paths served through the proxy.
const ALLOWED: &[&str] = &["metrics", "stats/summary"];

pub async fn serve(
    store: &dyn Store,
    kubelet: &KubeletClient,
    method: Method,
    node_name: &str,
    path: &str,
) -> Response {
    if method != Method::GET {
        return status(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed", "the node proxy serves GET only");
    }
    if !ALLOWED.contains(&path) {
        return status(
            StatusCode::FORBIDDEN,
            "Forbidden",
            format!("the node proxy serves {} only, not {path:?}", ALLOWED.join(" and ")),
        );
    }
    let node = match store.get(&ObjectKey::new("Node", "", node_name)).await {
        Ok(Some(node)) => node,
        Ok(None) => return status(StatusCode::NOT_FOUND, "NotFound", format!("nodes {node_name:?} not found")),
        Err(e) => return status(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", e.to_string()),
    };
    let node: Node = match serde_json::from_value(node) {
        Ok(node) => node,
        Err(e) => return status(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", format!("node {node_name}: {e}")),
    };
    match kubelet.get(&node, &format!("/{path}")).await {
        Ok(answer) => {
            let code = answer.status();
            let content_type = answer.headers().get(CONTENT_TYPE).cloned();
            let mut response = Body::new(answer.into_body()).into_response();
            *response.status_mut() = code;
            if let Some(t) = content_type {
                response.headers_mut().insert(CONTENT_TYPE, t);
            }
            response
        }
        Err(e) => status(StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable", e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxy_paths() {
        assert_eq!(proxy_path("v1/nodes/n1/proxy/metrics"), Some(("n1", "metrics")));
        assert_eq!(proxy_path("v1/nodes/n1/proxy/stats/summary"), Some(("n1", "stats/summary")));
        for other in ["v1/nodes/n1", "v1/nodes//proxy/metrics", "v1/nodes/a/b/proxy/metrics", "v1/pods/proxy/metrics"] {
            assert_eq!(proxy_path(other), None, "{other}");
        }
    }
}
