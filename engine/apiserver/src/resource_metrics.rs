//! The resource metrics API, `metrics.k8s.io/v1beta1` (what metrics-server serves and
//! `kubectl top` reads): NodeMetrics and PodMetrics, answered at request time from the nodes'
//! Summary API (`GET /stats/summary` on each agent's kubelet endpoint, see
//! `gitplane_kubelet::stats`), asked of every node concurrently. Nothing is scraped in the
//! background and nothing is stored. A node that does not answer is left out, as
//! metrics-server leaves out a node it could not scrape, and so are Pods whose containers have
//! no CPU rate yet.

use super::status;
use crate::kubelet_client::KubeletClient;
use axum::{
    Json,
    http::{Method, StatusCode},
    response::{IntoResponse as _, Response},
};
use gitplane_kubelet::stats::{CpuStats, MemoryStats, Summary};
use gitplane_store::{ListOptions, Store, StoreError};
use http_body_util::BodyExt as _;
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::{Value, json};
use std::{collections::HashMap, time::Duration};

pub const GROUP: &str = "metrics.k8s.io";
pub const VERSION: &str = "v1beta1";
/// How long one node may take to answer (it samples for a second when asked cold).
const NODE_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest Summary read from a node.
const MAX_SUMMARY_BYTES: usize = 16 << 20;

/// The group's discovery entry for `/apis`.
pub fn api_group() -> Value {
    let gv = json!({"groupVersion": format!("{GROUP}/{VERSION}"), "version": VERSION});
    json!({"name": GROUP, "versions": [gv.clone()], "preferredVersion": gv})
}

/// The group's entry in aggregated discovery (`/apis` as kubectl asks for it).
pub fn aggregated_group() -> Value {
    let resource = |name: &str, kind: &str, scope: &str| {
        let kind = json!({"group": GROUP, "version": VERSION, "kind": kind});
        json!({"resource": name, "responseKind": kind, "scope": scope, "verbs": ["get", "list"]})
    };
    let resources = [resource("nodes", "NodeMetrics", "Cluster"), resource("pods", "PodMetrics", "Namespaced")];
    json!({"metadata": {"name": GROUP}, "versions": [{"version": VERSION, "resources": resources, "freshness": "Current"}]})
}

fn resource_list() -> Value {
    let resource = |name: &str, kind: &str, namespaced: bool| json!({"name": name, "singularName": "", "namespaced": namespaced, "kind": kind, "verbs": ["get", "list"]});
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": format!("{GROUP}/{VERSION}"),
           "resources": [resource("nodes", "NodeMetrics", false), resource("pods", "PodMetrics", true)]})
}

/// `CPU` in nanocores and memory in KiB, as metrics-server writes them.
fn usage(cpu: Option<&CpuStats>, memory: Option<&MemoryStats>) -> Value {
    json!({
        "cpu": format!("{}n", cpu.map_or(0, |c| c.usage_nano_cores)),
        "memory": format!("{}Ki", memory.map_or(0, |m| m.working_set_bytes) / 1024),
    })
}

fn window(summary: &Summary) -> String {
    format!("{}ms", summary.window_milliseconds)
}

/// The NodeMetrics of one node's Summary.
pub fn node_metrics(node: &Node, summary: &Summary) -> Value {
    let stats = &summary.node;
    json!({
        "kind": "NodeMetrics", "apiVersion": format!("{GROUP}/{VERSION}"),
        "metadata": {"name": node.metadata.name, "labels": node.metadata.labels},
        "timestamp": stats.cpu.as_ref().map(|c| c.time.clone()),
        "window": window(summary),
        "usage": usage(stats.cpu.as_ref(), stats.memory.as_ref()),
    })
}

/// The PodMetrics of the Pods in `summary` that `wanted` holds (by namespace and name, with
/// their labels); a Pod of the same name but another uid (replaced meanwhile) is not it.
pub fn pod_metrics(summary: &Summary, wanted: &HashMap<(String, String), &Pod>) -> Vec<Value> {
    summary
        .pods
        .iter()
        .filter_map(|p| {
            let pod = wanted.get(&(p.pod_ref.namespace.clone(), p.pod_ref.name.clone()))?;
            (pod.metadata.uid.as_deref() == Some(p.pod_ref.uid.as_str())).then_some(())?;
            let containers: Vec<Value> = p
                .containers
                .iter()
                .map(|c| json!({"name": c.name, "usage": usage(c.cpu.as_ref(), c.memory.as_ref())}))
                .collect();
            Some(json!({
                "kind": "PodMetrics", "apiVersion": format!("{GROUP}/{VERSION}"),
                "metadata": {"name": p.pod_ref.name, "namespace": p.pod_ref.namespace, "labels": pod.metadata.labels},
                "timestamp": p.containers.first().and_then(|c| c.cpu.as_ref()).map(|c| c.time.clone()),
                "window": window(summary),
                "containers": containers,
            }))
        })
        .collect()
}

/// `metrics.k8s.io/…` below `/apis/`.
pub async fn serve(
    store: &dyn Store,
    kubelet: &KubeletClient,
    method: Method,
    path: &str,
    params: &HashMap<String, String>,
) -> Response {
    if method != Method::GET {
        return status(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed", "the metrics API is read-only");
    }
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let selector = params.get("labelSelector").filter(|s| !s.is_empty()).cloned();
    match segments.as_slice() {
        [GROUP] => Json(api_group()).into_response(),
        [GROUP, VERSION] => Json(resource_list()).into_response(),
        [GROUP, VERSION, "nodes"] => nodes(store, kubelet, None, selector).await,
        [GROUP, VERSION, "nodes", name] => nodes(store, kubelet, Some(name), None).await,
        [GROUP, VERSION, "pods"] => pods(store, kubelet, None, None, selector).await,
        [GROUP, VERSION, "namespaces", ns, "pods"] => pods(store, kubelet, Some(ns), None, selector).await,
        [GROUP, VERSION, "namespaces", ns, "pods", name] => pods(store, kubelet, Some(ns), Some(name), None).await,
        _ => status(StatusCode::NOT_FOUND, "NotFound", format!("the server could not find /apis/{path}")),
    }
}

async fn list<K: serde::de::DeserializeOwned>(
    store: &dyn Store,
    kind: &str,
    namespace: Option<&str>,
    label_selector: Option<String>,
) -> Result<Vec<K>, Response> {
    let options = ListOptions { namespace: namespace.map(str::to_owned), label_selector, ..Default::default() };
    let list = store.list(kind, &options).await.map_err(|e| match e {
        StoreError::BadRequest(_) | StoreError::Rejected(_) => {
            status(StatusCode::BAD_REQUEST, "BadRequest", e.to_string())
        }
        e => status(StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable", e.to_string()),
    })?;
    Ok(list.items.into_iter().filter_map(|v| serde_json::from_value(v).ok()).collect())
}

/// The Summaries of `nodes`, asked concurrently; nodes that do not answer are left out.
pub async fn summaries<'a>(kubelet: &KubeletClient, nodes: &'a [Node]) -> Vec<(&'a Node, Summary)> {
    let asked = nodes.iter().map(|node| async move {
        let answer = tokio::time::timeout(NODE_TIMEOUT, async {
            let response = kubelet.get(node, "/stats/summary").await.map_err(|e| e.to_string())?;
            if !response.status().is_success() {
                return Err(format!("answered {}", response.status()));
            }
            let body = http_body_util::Limited::new(response.into_body(), MAX_SUMMARY_BYTES)
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            serde_json::from_slice::<Summary>(&body).map_err(|e| format!("an unreadable Summary: {e}"))
        })
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {} s", NODE_TIMEOUT.as_secs())));
        match answer {
            Ok(summary) => Some((node, summary)),
            Err(why) => {
                let name = node.metadata.name.as_deref().unwrap_or_default();
                tracing::warn!(node = name, %why, "no resource metrics from the node");
                None
            }
        }
    });
    futures::future::join_all(asked).await.into_iter().flatten().collect()
}

fn metrics_list(kind: &str, items: Vec<Value>) -> Response {
    Json(json!({"kind": kind, "apiVersion": format!("{GROUP}/{VERSION}"), "metadata": {}, "items": items}))
        .into_response()
}

fn not_found(resource: &str, name: &str) -> Response {
    status(StatusCode::NOT_FOUND, "NotFound", format!("{resource}.{GROUP} \"{name}\" not found"))
}

async fn nodes(store: &dyn Store, kubelet: &KubeletClient, name: Option<&str>, selector: Option<String>) -> Response {
    let mut nodes: Vec<Node> = match list(store, "Node", None, selector).await {
        Ok(nodes) => nodes,
        Err(response) => return response,
    };
    if let Some(name) = name {
        nodes.retain(|n| n.metadata.name.as_deref() == Some(name));
    }
    let items: Vec<Value> = summaries(kubelet, &nodes).await.iter().map(|(node, s)| node_metrics(node, s)).collect();
    match (name, items.into_iter()) {
        (Some(name), mut items) => {
            items.next().map(|i| Json(i).into_response()).unwrap_or_else(|| not_found("nodes", name))
        }
        (None, items) => metrics_list("NodeMetricsList", items.collect()),
    }
}

async fn pods(
    store: &dyn Store,
    kubelet: &KubeletClient,
    namespace: Option<&str>,
    name: Option<&str>,
    selector: Option<String>,
) -> Response {
    let mut pods: Vec<Pod> = match list(store, "Pod", namespace, selector).await {
        Ok(pods) => pods,
        Err(response) => return response,
    };
    if let Some(name) = name {
        pods.retain(|p| p.metadata.name.as_deref() == Some(name));
    }
    let on_nodes: std::collections::BTreeSet<&str> =
        pods.iter().filter_map(|p| p.spec.as_ref()?.node_name.as_deref()).collect();
    let nodes: Vec<Node> = match list::<Node>(store, "Node", None, None).await {
        Ok(nodes) => {
            nodes.into_iter().filter(|n| n.metadata.name.as_deref().is_some_and(|n| on_nodes.contains(n))).collect()
        }
        Err(response) => return response,
    };
    let wanted: HashMap<(String, String), &Pod> =
        pods.iter().filter_map(|p| Some(((p.metadata.namespace.clone()?, p.metadata.name.clone()?), p))).collect();
    let mut items: Vec<Value> =
        summaries(kubelet, &nodes).await.iter().flat_map(|(_, summary)| pod_metrics(summary, &wanted)).collect();
    items.sort_by(|a, b| {
        let key = |v: &Value| (v["metadata"]["namespace"].to_string(), v["metadata"]["name"].to_string());
        key(a).cmp(&key(b))
    });
    match name {
        Some(name) => items.pop().map(|i| Json(i).into_response()).unwrap_or_else(|| not_found("pods", name)),
        None => metrics_list("PodMetricsList", items),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gitplane_kubelet::stats::{ContainerStats, NodeStats, PodReference, PodStats};

    fn summary() -> Summary {
        let cpu =
            |n| Some(CpuStats { time: "2026-12-03T10:00:00Z".into(), usage_nano_cores: n, usage_core_nano_seconds: 9 });
        let memory = |b| Some(MemoryStats { time: "2026-12-03T10:00:00Z".into(), working_set_bytes: b });
        let pod = |name: &str, uid: &str| PodStats {
            pod_ref: PodReference { namespace: "default".into(), name: name.into(), uid: uid.into() },
            containers: vec![ContainerStats { name: "web".into(), cpu: cpu(2_000_000), memory: memory(3 << 20) }],
        };
        Summary {
            node: NodeStats { node_name: "n1".into(), cpu: cpu(250_000_000), memory: memory(1 << 30) },
            pods: vec![pod("web-1", "u1"), pod("web-2", "old-uid")],
            window_milliseconds: 1003,
        }
    }

    #[test]
    fn node_and_pod_metrics_are_written_as_metrics_server_writes_them() {
        let node: Node = serde_json::from_value(json!({"metadata": {"name": "n1", "labels": {"a": "b"}}})).unwrap();
        let metrics = node_metrics(&node, &summary());
        assert_eq!(metrics["usage"], json!({"cpu": "250000000n", "memory": "1048576Ki"}));
        assert_eq!((metrics["kind"].as_str(), metrics["window"].as_str()), (Some("NodeMetrics"), Some("1003ms")));
        assert_eq!(metrics["metadata"]["labels"]["a"], "b");

        let pod = |name: &str, uid: &str| -> Pod {
            serde_json::from_value(json!({"metadata": {"name": name, "namespace": "default", "uid": uid}})).unwrap()
        };
        let (one, two) = (pod("web-1", "u1"), pod("web-2", "u2"));
        let wanted = HashMap::from([
            (("default".to_owned(), "web-1".to_owned()), &one),
            (("default".to_owned(), "web-2".to_owned()), &two),
        ]);
        // web-2 was replaced by a Pod of the same name: the node's figures are not its.
        let items = pod_metrics(&summary(), &wanted);
        assert_eq!(items.len(), 1);
        assert_eq!(items[0]["containers"][0], json!({"name": "web", "usage": {"cpu": "2000000n", "memory": "3072Ki"}}));
    }
}
