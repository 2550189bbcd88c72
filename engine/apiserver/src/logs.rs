//! `GET /api/v1/namespaces/{ns}/pods/{name}/log` (`kubectl logs`): the API server's pod log
//! subresource. The options are checked as kube-apiserver checks `PodLogOptions`, the container
//! chosen as it chooses (the only one, else the caller must name one), the run chosen from the
//! Pod's status as the kubelet's `validateContainerLogStatus` does (so `--previous` and a
//! container still waiting are answered here, with the kubelet's words), and the log is then
//! streamed from the node that runs the Pod ([`KubeletClient`]), chunk by chunk, for as long
//! as it follows.

use super::status;
use crate::kubelet_client::KubeletClient;
use axum::{
    body::Body,
    http::{Method, StatusCode},
    response::{IntoResponse as _, Response},
};
use gitplane_store::{ObjectKey, Store};
use k8s_openapi::{
    api::core::v1::{ContainerStatus, Node, Pod},
    jiff::Timestamp,
};
use std::collections::HashMap;

/// `v1/namespaces/{ns}/pods/{name}/log` -> (ns, name).
pub fn log_path(path: &str) -> Option<(&str, &str)> {
    let segments: Vec<&str> = path.split('/').collect();
    match segments.as_slice() {
        ["v1", "namespaces", ns, "pods", name, "log"] if !ns.is_empty() && !name.is_empty() => Some((ns, name)),
        _ => None,
    }
}

/// `PodLogOptions` from the query string.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodLogOptions {
    pub container: Option<String>,
    pub follow: bool,
    pub previous: bool,
    pub since_seconds: Option<i64>,
    pub since_time: Option<Timestamp>,
    pub timestamps: bool,
    pub tail_lines: Option<i64>,
    pub limit_bytes: Option<i64>,
}

/// A refusal: status code, reason and message of the Kubernetes Status.
pub type Refusal = (StatusCode, &'static str, String);

fn bad_request(message: String) -> Refusal {
    (StatusCode::BAD_REQUEST, "BadRequest", message)
}

/// Parses the query as the API server decodes `PodLogOptions`, then validates it as
/// `ValidatePodLogOptions` (an invalid value is a 422, as there).
pub fn options(name: &str, params: &HashMap<String, String>) -> Result<PodLogOptions, Refusal> {
    let flag = |key: &str| -> Result<bool, Refusal> {
        match params.get(key).map(String::as_str) {
            None | Some("" | "false" | "0") => Ok(false),
            Some("true" | "1") => Ok(true),
            Some(other) => Err(bad_request(format!("{key}: {other:?} is not a boolean"))),
        }
    };
    let number = |key: &str| -> Result<Option<i64>, Refusal> {
        params
            .get(key)
            .filter(|v| !v.is_empty())
            .map(|v| v.parse::<i64>().map_err(|_| bad_request(format!("{key}: {v:?} is not an integer"))))
            .transpose()
    };
    let since_time = params
        .get("sinceTime")
        .filter(|v| !v.is_empty())
        .map(|t| t.parse::<Timestamp>().map_err(|_| bad_request(format!("sinceTime: {t:?} is not an RFC 3339 time"))))
        .transpose()?;
    let options = PodLogOptions {
        container: params.get("container").filter(|c| !c.is_empty()).cloned(),
        follow: flag("follow")?,
        previous: flag("previous")?,
        since_seconds: number("sinceSeconds")?,
        since_time,
        timestamps: flag("timestamps")?,
        tail_lines: number("tailLines")?,
        limit_bytes: number("limitBytes")?,
    };
    let mut errors = Vec::new();
    if let Some(n) = options.tail_lines.filter(|n| *n < 0) {
        errors.push(format!("tailLines: Invalid value: {n}: must be greater than or equal to 0"));
    }
    if let Some(n) = options.limit_bytes.filter(|n| *n < 1) {
        errors.push(format!("limitBytes: Invalid value: {n}: must be greater than 0"));
    }
    if options.since_seconds.is_some() && options.since_time.is_some() {
        errors.push("[]: Forbidden: at most one of `sinceTime` or `sinceSeconds` may be specified".into());
    }
    if let Some(n) = options.since_seconds.filter(|n| *n < 1) {
        errors.push(format!("sinceSeconds: Invalid value: {n}: must be greater than 0"));
    }
    if !errors.is_empty() {
        let message = format!("PodLogOptions {name:?} is invalid: {}", errors.join(", "));
        return Err((StatusCode::UNPROCESSABLE_ENTITY, "Invalid", message));
    }
    Ok(options)
}

/// The container whose log is asked for: the one named, else the Pod's only one.
pub fn container(pod: &Pod, name: &str, asked: Option<&str>) -> Result<String, Refusal> {
    let spec = pod.spec.as_ref();
    let containers = spec.map(|s| s.containers.as_slice()).unwrap_or_default();
    let init = spec.and_then(|s| s.init_containers.as_deref()).unwrap_or_default();
    let all: Vec<&str> = init.iter().chain(containers).map(|c| c.name.as_str()).collect();
    match asked {
        Some(asked) if all.contains(&asked) => Ok(asked.to_owned()),
        Some(asked) => Err(bad_request(format!("container {asked} is not valid for pod {name}"))),
        None if containers.len() == 1 => Ok(containers[0].name.clone()),
        None if containers.is_empty() => Err(bad_request(format!("a container name must be specified for pod {name}"))),
        None => Err(bad_request(format!(
            "a container name must be specified for pod {name}, choose one of: [{}]",
            all.join(" ")
        ))),
    }
}

/// The run to read (its container ID, `containerd://…`), from the container's status: the
/// kubelet's `validateContainerLogStatus`.
pub fn container_id(pod: &Pod, container: &str, previous: bool) -> Result<String, Refusal> {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    let status = pod.status.as_ref();
    let statuses = [
        status.and_then(|s| s.container_statuses.as_deref()),
        status.and_then(|s| s.init_container_statuses.as_deref()),
    ];
    let found: Option<&ContainerStatus> = statuses.into_iter().flatten().flatten().find(|s| s.name == container);
    let Some(found) = found else {
        return Err(bad_request(format!("container {container:?} in pod {name:?} is not available")));
    };
    let id = |id: Option<&String>| id.filter(|id| !id.is_empty()).cloned();
    let last = found.last_state.as_ref().and_then(|s| s.terminated.as_ref());
    let state = found.state.as_ref();
    let (waiting, running, terminated) = (
        state.and_then(|s| s.waiting.as_ref()),
        state.and_then(|s| s.running.as_ref()),
        state.and_then(|s| s.terminated.as_ref()),
    );
    let terminated_message = || bad_request(format!("container {container:?} in pod {name:?} is terminated"));
    if previous {
        return last.and_then(|l| id(l.container_id.as_ref())).ok_or_else(|| {
            bad_request(format!("previous terminated container {container:?} in pod {name:?} not found"))
        });
    }
    if running.is_some() {
        return id(found.container_id.as_ref()).ok_or_else(terminated_message);
    }
    if let Some(terminated) = terminated {
        return id(terminated.container_id.as_ref())
            .or_else(|| last.and_then(|l| id(l.container_id.as_ref())))
            .ok_or_else(terminated_message);
    }
    if let Some(last) = last {
        return id(last.container_id.as_ref()).ok_or_else(terminated_message);
    }
    let message = match waiting.and_then(|w| w.reason.as_deref()) {
        Some("ErrImagePull") => {
            format!("container {container:?} in pod {name:?} is waiting to start: image can't be pulled")
        }
        Some("ImagePullBackOff") => {
            format!("container {container:?} in pod {name:?} is waiting to start: trying and failing to pull image")
        }
        Some(reason) => format!("container {container:?} in pod {name:?} is waiting to start: {reason}"),
        None => format!("container {container:?} in pod {name:?} is waiting to start - no logs yet"),
    };
    Err(bad_request(message))
}

/// The node's query string: which run, and the options it applies.
pub fn node_query(id: &str, options: &PodLogOptions) -> String {
    let mut query = format!("containerID={}", id.split_once("://").map_or(id, |(_, id)| id));
    let mut add = |key: &str, value: String| query.push_str(&format!("&{key}={value}"));
    if options.follow {
        add("follow", "true".into());
    }
    if options.timestamps {
        add("timestamps", "true".into());
    }
    if let Some(n) = options.tail_lines {
        add("tailLines", n.to_string());
    }
    if let Some(n) = options.limit_bytes {
        add("limitBytes", n.to_string());
    }
    if let Some(n) = options.since_seconds {
        add("sinceSeconds", n.to_string());
    }
    if let Some(t) = options.since_time {
        // RFC 3339 in UTC: digits, `-`, `:`, `.`, `T` and `Z`; only `:` needs escaping.
        add("sinceTime", t.to_string().replace(':', "%3A"));
    }
    query
}

/// Serves the pod log subresource.
pub async fn serve(
    store: &dyn Store,
    kubelet: &KubeletClient,
    method: Method,
    namespace: &str,
    name: &str,
    params: &HashMap<String, String>,
) -> Response {
    if method != Method::GET {
        return status(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed", "pods/log is read with GET");
    }
    match stream(store, kubelet, namespace, name, params).await {
        Ok(response) => response,
        Err((code, reason, message)) => status(code, reason, message),
    }
}

async fn stream(
    store: &dyn Store,
    kubelet: &KubeletClient,
    namespace: &str,
    name: &str,
    params: &HashMap<String, String>,
) -> Result<Response, Refusal> {
    let internal = |e: String| (StatusCode::INTERNAL_SERVER_ERROR, "InternalError", e);
    let options = options(name, params)?;
    let pod = store.get(&ObjectKey::new("Pod", namespace, name)).await.map_err(|e| internal(e.to_string()))?;
    let Some(pod) = pod else {
        return Err((StatusCode::NOT_FOUND, "NotFound", format!("pods {name:?} not found")));
    };
    let pod: Pod = serde_json::from_value(pod).map_err(|e| internal(format!("pod {namespace}/{name}: {e}")))?;
    let container = container(&pod, name, options.container.as_deref())?;
    let node_name = pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
    if node_name.is_empty() {
        return Err(bad_request(format!(
            "container {container:?} in pod {name:?} is waiting to start: the pod is not bound to a node yet"
        )));
    }
    let id = container_id(&pod, &container, options.previous)?;
    let unavailable = |message: String| (StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable", message);
    let node = store.get(&ObjectKey::new("Node", "", &node_name)).await.map_err(|e| internal(e.to_string()))?;
    let node: Node = match node.map(serde_json::from_value) {
        Some(Ok(node)) => node,
        Some(Err(e)) => return Err(internal(format!("node {node_name}: {e}"))),
        None => return Err(unavailable(format!("node {node_name:?} that pod {name:?} is bound to is not registered"))),
    };
    let path = format!("/containerLogs/{namespace}/{name}/{container}?{}", node_query(&id, &options));
    let answer = kubelet.get(&node, &path).await.map_err(|e| unavailable(format!("reading the log: {e}")))?;
    let code = answer.status();
    if code == StatusCode::OK {
        let mut response = Body::new(answer.into_body()).into_response();
        response.headers_mut().insert(axum::http::header::CONTENT_TYPE, "text/plain".parse().expect("a header value"));
        return Ok(response);
    }
    // The node's own refusal (its body is a short text): said with the Kubernetes status.
    let body = http_body_util::Limited::new(answer.into_body(), 64 << 10);
    let text = match http_body_util::BodyExt::collect(body).await {
        Ok(bytes) => String::from_utf8_lossy(&bytes.to_bytes()).trim().to_owned(),
        Err(e) => e.to_string(),
    };
    let message = format!("node {node_name}: {text}");
    Err(match code {
        StatusCode::BAD_REQUEST => bad_request(message),
        StatusCode::NOT_FOUND => (StatusCode::NOT_FOUND, "NotFound", message),
        StatusCode::UNAUTHORIZED => internal(format!("{message} (the node refused this replica's token)")),
        _ => (StatusCode::BAD_GATEWAY, "InternalError", message),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn params(query: &[(&str, &str)]) -> HashMap<String, String> {
        query.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn log_paths() {
        assert_eq!(log_path("v1/namespaces/default/pods/web/log"), Some(("default", "web")));
        for other in [
            "v1/namespaces/default/pods/web",
            "v1/pods/web/log",
            "v1/namespaces//pods/web/log",
            "v1/namespaces/a/pods/web/exec",
        ] {
            assert_eq!(log_path(other), None, "{other}");
        }
    }

    #[test]
    fn options_are_checked_as_kube_apiserver_does() {
        let parsed = options(
            "web",
            &params(&[
                ("container", "app"),
                ("follow", "true"),
                ("tailLines", "5"),
                ("timestamps", "true"),
                ("sinceSeconds", "60"),
            ]),
        )
        .unwrap();
        assert_eq!(
            parsed,
            PodLogOptions {
                container: Some("app".into()),
                follow: true,
                tail_lines: Some(5),
                timestamps: true,
                since_seconds: Some(60),
                ..Default::default()
            }
        );
        assert_eq!(
            node_query("containerd://abc", &parsed),
            "containerID=abc&follow=true&timestamps=true&tailLines=5&sinceSeconds=60"
        );
        let since = options("web", &params(&[("sinceTime", "2026-12-03T16:00:00+01:00")])).unwrap();
        assert_eq!(node_query("abc", &since), "containerID=abc&sinceTime=2026-12-03T15%3A00%3A00Z");

        let refused = |query: &[(&str, &str)]| options("web", &params(query)).unwrap_err();
        let (code, reason, message) = refused(&[("tailLines", "-1")]);
        assert_eq!((code, reason), (StatusCode::UNPROCESSABLE_ENTITY, "Invalid"));
        assert_eq!(
            message,
            "PodLogOptions \"web\" is invalid: tailLines: Invalid value: -1: must be greater than or equal to 0"
        );
        assert_eq!(refused(&[("limitBytes", "0")]).0, StatusCode::UNPROCESSABLE_ENTITY);
        assert!(refused(&[("sinceSeconds", "5"), ("sinceTime", "2026-12-03T16:00:00Z")]).2.contains("at most one"));
        for bad in [("tailLines", "x"), ("follow", "maybe"), ("sinceTime", "yesterday"), ("limitBytes", "1e3")] {
            assert_eq!(refused(&[bad]).0, StatusCode::BAD_REQUEST, "{bad:?}");
        }
    }

    fn pod(containers: &[&str], statuses: serde_json::Value) -> Pod {
        let containers: Vec<_> = containers.iter().map(|c| json!({"name": c, "image": "i"})).collect();
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "default"},
            "spec": {"containers": containers, "nodeName": "n1"},
            "status": {"containerStatuses": statuses},
        }))
        .unwrap()
    }

    #[test]
    fn the_container_is_the_only_one_or_the_one_named() {
        let one = pod(&["app"], json!([]));
        assert_eq!(container(&one, "web", None).unwrap(), "app");
        let two = pod(&["app", "sidecar"], json!([]));
        assert_eq!(container(&two, "web", Some("sidecar")).unwrap(), "sidecar");
        let (code, _, message) = container(&two, "web", None).unwrap_err();
        assert_eq!(
            (code, message.as_str()),
            (StatusCode::BAD_REQUEST, "a container name must be specified for pod web, choose one of: [app sidecar]")
        );
        assert_eq!(container(&two, "web", Some("db")).unwrap_err().2, "container db is not valid for pod web");
    }

    #[test]
    fn the_run_comes_from_the_status_as_the_kubelet_chooses() {
        let running = pod(
            &["app"],
            json!([{"name": "app", "image": "i", "imageID": "", "ready": true, "restartCount": 1,
            "containerID": "containerd://c2", "state": {"running": {}},
            "lastState": {"terminated": {"exitCode": 1, "containerID": "containerd://c1"}}}]),
        );
        assert_eq!(container_id(&running, "app", false).unwrap(), "containerd://c2");
        assert_eq!(container_id(&running, "app", true).unwrap(), "containerd://c1");
        // Crash-looping: the run that just ended, with or without --previous.
        let backoff = pod(
            &["app"],
            json!([{"name": "app", "image": "i", "imageID": "", "ready": false, "restartCount": 2,
            "containerID": "containerd://c2", "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"exitCode": 1, "containerID": "containerd://c2"}}}]),
        );
        assert_eq!(container_id(&backoff, "app", false).unwrap(), "containerd://c2");
        let first = pod(
            &["app"],
            json!([{"name": "app", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
            "containerID": "containerd://c1", "state": {"running": {}}}]),
        );
        assert_eq!(
            container_id(&first, "app", true).unwrap_err().2,
            "previous terminated container \"app\" in pod \"web\" not found"
        );
        let creating = pod(
            &["app"],
            json!([{"name": "app", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ContainerCreating"}}}]),
        );
        assert_eq!(
            container_id(&creating, "app", false).unwrap_err().2,
            "container \"app\" in pod \"web\" is waiting to start: ContainerCreating"
        );
        let pulling = pod(
            &["app"],
            json!([{"name": "app", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ImagePullBackOff"}}}]),
        );
        assert!(container_id(&pulling, "app", false).unwrap_err().2.ends_with("trying and failing to pull image"));
        let unreported = pod(&["app"], json!([]));
        assert_eq!(
            container_id(&unreported, "app", false).unwrap_err().2,
            "container \"app\" in pod \"web\" is not available"
        );
        let done = pod(
            &["app"],
            json!([{"name": "app", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
            "containerID": "containerd://c1", "state": {"terminated": {"exitCode": 0, "containerID": "containerd://c1"}}}]),
        );
        assert_eq!(container_id(&done, "app", false).unwrap(), "containerd://c1");
    }
}
