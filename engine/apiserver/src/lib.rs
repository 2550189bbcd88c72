//! The API server: the read-only status API on Kubernetes paths (discovery, get, list, watch,
//! Tables, the LIST cache), the status page, the exec / attach / port-forward proxy to the
//! nodes, authentication, authorization and audit, and the listener every replica serves on.
//!
//! Every write answers 405 and names what owns the object ([`owner`]: its Application and
//! repository, or that nothing in Git does). [`logs`] is the pod log subresource, streamed from
//! the node that runs the Pod; [`resource_metrics`] is the resource metrics API (`kubectl top`),
//! asked of the nodes; [`proxy`] is the node proxy for the nodes' `/metrics` and
//! `/stats/summary`; [`watch`] serves `?watch=1`; [`list`] serves lists, from [`cacher`]'s watch
//! cache when it can; [`head`] is where an Application's branch points now (the one read of a
//! hosted repository here); [`fields`] parses and matches field selectors; [`discovery`],
//! [`openapi`] and [`health`] are what clients read about the server itself; [`exec`] serves
//! `exec`, `attach` and `portforward` to debug tokens; [`metrics`] holds the API server's own
//! metric families.

pub mod audit;
pub mod authn;
pub mod authz;
mod cacher;
mod discovery;
mod exec;
mod fields;
pub mod head;
pub mod health;
pub mod kubelet_client;
mod list;
pub mod listener;
mod logs;
pub mod metrics;
mod openapi;
mod owner;
pub mod page;
mod proxy;
pub mod rbac;
pub mod resource_metrics;
mod resource_version;
pub mod serviceaccount;
mod table;
mod watch;

use crate::{
    kubelet_client::KubeletClient,
    listener::{ClientAddr, PerClient},
};
use axum::{
    Json, Router,
    extract::{Path, Query as Query_, State},
    http::{HeaderMap, Method, StatusCode},
    response::{IntoResponse, Response},
    routing::{any, get},
};
use gitplane_store::{ListOptions, ObjectKey, Store};
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};
use std::{collections::HashMap, sync::Arc, time::Duration};

/// The most items one list answer holds; larger limits get a continue token here.
pub const MAX_PAGE: usize = 5_000;
/// The longest a read may take before it is cancelled (freeing its store connection).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// One served resource.
struct Resource {
    group: &'static str,
    version: &'static str,
    plural: &'static str,
    kind: &'static str,
    namespaced: bool,
}

const RBAC: &str = "rbac.authorization.k8s.io";

const RESOURCES: &[Resource] = &[
    Resource { group: "", version: "v1", plural: "pods", kind: "Pod", namespaced: true },
    Resource { group: "", version: "v1", plural: "services", kind: "Service", namespaced: true },
    Resource { group: "", version: "v1", plural: "endpoints", kind: "Endpoints", namespaced: true },
    Resource { group: "", version: "v1", plural: "configmaps", kind: "ConfigMap", namespaced: true },
    Resource { group: "", version: "v1", plural: "secrets", kind: "Secret", namespaced: true },
    Resource { group: "", version: "v1", plural: "limitranges", kind: "LimitRange", namespaced: true },
    Resource { group: "", version: "v1", plural: "resourcequotas", kind: "ResourceQuota", namespaced: true },
    Resource { group: "", version: "v1", plural: "serviceaccounts", kind: "ServiceAccount", namespaced: true },
    Resource { group: "", version: "v1", plural: "events", kind: "Event", namespaced: true },
    Resource { group: "", version: "v1", plural: "nodes", kind: "Node", namespaced: false },
    Resource { group: "", version: "v1", plural: "namespaces", kind: "Namespace", namespaced: false },
    Resource {
        group: "",
        version: "v1",
        plural: "replicationcontrollers",
        kind: "ReplicationController",
        namespaced: true,
    },
    Resource { group: "apps", version: "v1", plural: "deployments", kind: "Deployment", namespaced: true },
    Resource { group: "apps", version: "v1", plural: "replicasets", kind: "ReplicaSet", namespaced: true },
    Resource { group: "apps", version: "v1", plural: "daemonsets", kind: "DaemonSet", namespaced: true },
    Resource { group: "apps", version: "v1", plural: "statefulsets", kind: "StatefulSet", namespaced: true },
    Resource {
        group: "apps",
        version: "v1",
        plural: "controllerrevisions",
        kind: "ControllerRevision",
        namespaced: true,
    },
    Resource { group: "batch", version: "v1", plural: "jobs", kind: "Job", namespaced: true },
    Resource { group: "batch", version: "v1", plural: "cronjobs", kind: "CronJob", namespaced: true },
    Resource {
        group: "autoscaling",
        version: "v2",
        plural: "horizontalpodautoscalers",
        kind: "HorizontalPodAutoscaler",
        namespaced: true,
    },
    Resource {
        group: "discovery.k8s.io",
        version: "v1",
        plural: "endpointslices",
        kind: "EndpointSlice",
        namespaced: true,
    },
    Resource {
        group: "networking.k8s.io",
        version: "v1",
        plural: "networkpolicies",
        kind: "NetworkPolicy",
        namespaced: true,
    },
    Resource { group: "coordination.k8s.io", version: "v1", plural: "leases", kind: "Lease", namespaced: true },
    Resource {
        group: "policy",
        version: "v1",
        plural: "poddisruptionbudgets",
        kind: "PodDisruptionBudget",
        namespaced: true,
    },
    Resource { group: "networking.k8s.io", version: "v1", plural: "ingresses", kind: "Ingress", namespaced: true },
    Resource {
        group: "networking.k8s.io",
        version: "v1",
        plural: "ingressclasses",
        kind: "IngressClass",
        namespaced: false,
    },
    Resource { group: RBAC, version: "v1", plural: "roles", kind: "Role", namespaced: true },
    Resource { group: RBAC, version: "v1", plural: "clusterroles", kind: "ClusterRole", namespaced: false },
    Resource { group: RBAC, version: "v1", plural: "rolebindings", kind: "RoleBinding", namespaced: true },
    Resource {
        group: RBAC,
        version: "v1",
        plural: "clusterrolebindings",
        kind: "ClusterRoleBinding",
        namespaced: false,
    },
    Resource {
        group: "",
        version: "v1",
        plural: "persistentvolumeclaims",
        kind: "PersistentVolumeClaim",
        namespaced: true,
    },
    Resource { group: "", version: "v1", plural: "persistentvolumes", kind: "PersistentVolume", namespaced: false },
    Resource {
        group: "storage.k8s.io",
        version: "v1",
        plural: "storageclasses",
        kind: "StorageClass",
        namespaced: false,
    },
    Resource {
        group: "apiregistration.k8s.io",
        version: "v1",
        plural: "apiservices",
        kind: "APIService",
        namespaced: false,
    },
    Resource {
        group: "admissionregistration.k8s.io",
        version: "v1",
        plural: "validatingwebhookconfigurations",
        kind: "ValidatingWebhookConfiguration",
        namespaced: false,
    },
    Resource {
        group: "admissionregistration.k8s.io",
        version: "v1",
        plural: "mutatingwebhookconfigurations",
        kind: "MutatingWebhookConfiguration",
        namespaced: false,
    },
    Resource { group: "gitplane.io", version: "v1", plural: "applications", kind: "Application", namespaced: true },
];

/// Whether the status API serves `resource` of `group` (the metrics API's included).
pub(crate) fn serves(group: &str, resource: &str) -> bool {
    RESOURCES.iter().any(|r| r.group == group && r.plural == resource)
        || (group == resource_metrics::GROUP && matches!(resource, "nodes" | "pods"))
}

impl Resource {
    fn api_version(&self) -> String {
        if self.group.is_empty() { self.version.to_owned() } else { format!("{}/{}", self.group, self.version) }
    }

    fn group_kind(&self) -> String {
        gitplane_api::object::group_kind(&self.api_version(), self.kind)
    }
}

#[derive(Clone)]
struct ApiState {
    store: Arc<dyn Store>,
    /// Where desired state is written, for the 405 answer.
    push_hint: Arc<str>,
    /// Reads container logs from the nodes.
    kubelet: KubeletClient,
    /// Open watches per client address.
    watches: PerClient,
    /// Exec, attach and port-forward streams per user.
    sessions: exec::Sessions,
    /// Records who opened which stream.
    events: gitplane_store::events::Recorder,
    /// The watch cache lists are served from.
    cacher: Arc<cacher::Cacher>,
}

/// The status API router.
pub fn router(store: Arc<dyn Store>, push_hint: String, kubelet: KubeletClient) -> Router {
    let state = ApiState::new(store, push_hint, kubelet);
    // Filled now, as kube-apiserver fills its watch cache at start-up: the first LIST of every
    // Pod does not wait for a read of all of them (2.7-5 s at 150,000 Pods).
    state.cacher.start(&["Pod", "Node"]);
    routes(state)
}

impl ApiState {
    fn new(store: Arc<dyn Store>, push_hint: String, kubelet: KubeletClient) -> ApiState {
        let watches = PerClient::new(watch::MAX_WATCHES_PER_CLIENT);
        let events = gitplane_store::events::Recorder::spawn(
            store.clone(),
            gitplane_api::events::Source::component("gitplane-apiserver"),
        );
        let cacher = Arc::new(cacher::Cacher::new(store.clone()));
        ApiState { store, push_hint: push_hint.into(), kubelet, watches, sessions: Default::default(), events, cacher }
    }
}

fn routes(state: ApiState) -> Router {
    let pod = "/api/v1/namespaces/{namespace}/pods/{name}";
    Router::new()
        .route("/version", get(|| async { Json(discovery::version()) }))
        .route(&format!("{pod}/exec"), any(exec::exec))
        .route(&format!("{pod}/attach"), any(exec::attach))
        .route(&format!("{pod}/portforward"), any(exec::port_forward))
        .route("/api", any(core_versions))
        .route("/apis", any(group_list))
        .merge(openapi::router())
        .route("/api/{*path}", any(core))
        .route("/apis/{*path}", any(grouped))
        .with_state(state)
}

/// What answers a path nothing serves: a Kubernetes Status, as the API server answers.
pub async fn not_found(uri: axum::http::Uri) -> Response {
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        format!("the server could not find the requested resource {}", uri.path()),
    )
}

fn status_body(code: StatusCode, reason: &str, message: impl Into<String>) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message.into(), "reason": reason, "code": code.as_u16(),
    })
}

pub(crate) fn status(code: StatusCode, reason: &str, message: impl Into<String>) -> Response {
    (code, Json(status_body(code, reason, message))).into_response()
}

fn read_only(state: &ApiState) -> Response {
    status(
        StatusCode::METHOD_NOT_ALLOWED,
        "MethodNotAllowed",
        format!(
            "gitplane's API is read-only: desired state comes only from Git. Commit your change and push it to {}",
            state.push_hint
        ),
    )
}

async fn core_versions(State(state): State<ApiState>, method: Method, headers: HeaderMap) -> Response {
    if method != Method::GET {
        return read_only(&state);
    }
    discovery::root(true, &headers)
}

async fn group_list(State(state): State<ApiState>, method: Method, headers: HeaderMap) -> Response {
    if method != Method::GET {
        return read_only(&state);
    }
    discovery::root(false, &headers)
}

/// What a request asks for beyond its path: the Kubernetes list parameters and the format.
#[derive(Default)]
struct Query {
    list: ListOptions,
    /// `Accept: application/json;as=Table;...`, as kubectl sends for `get`, with what each row
    /// carries (`?includeObject=`).
    table: Option<table::IncludeObject>,
    /// `?consistency=linearizable`: read after a quorum-confirmed read point.
    linearizable: bool,
    /// `?fieldSelector=`, checked against the kind once the path names it.
    fields: fields::FieldSelector,
    /// `?watch=1`.
    watch: Option<watch::Params>,
    /// `?resourceVersion=` and `?resourceVersionMatch=` of a list.
    revision: resource_version::ListRevision,
}

fn query(headers: &HeaderMap, params: &HashMap<String, String>) -> Result<Query, Box<Response>> {
    let table = headers
        .get_all(axum::http::header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.split(',').next().is_some_and(|first| first.contains("as=Table")));
    let bad = |message: String| Box::new(status(StatusCode::BAD_REQUEST, "BadRequest", message));
    let include = table::IncludeObject::parse(params.get("includeObject").map_or("", String::as_str)).map_err(bad)?;
    let table = table.then_some(include);
    // A page larger than MAX_PAGE is cut there with a continue token, as a smaller limit would
    // be: the answer stays correct and one request stays bounded.
    let limit = match params.get("limit").filter(|l| !l.is_empty()) {
        Some(l) => match l.parse::<u64>() {
            Ok(0) => None,
            Ok(l) => Some(usize::try_from(l).unwrap_or(MAX_PAGE).min(MAX_PAGE)),
            Err(_) => return Err(bad(format!("limit {l:?} is not a non-negative integer"))),
        },
        None => None,
    };
    let watch = watch::params(params).map_err(bad)?;
    let fields = fields::FieldSelector::parse(params.get("fieldSelector").map_or("", String::as_str)).map_err(bad)?;
    let list = ListOptions {
        label_selector: params.get("labelSelector").filter(|s| !s.is_empty()).cloned(),
        limit,
        continue_token: params.get("continue").filter(|s| !s.is_empty()).cloned(),
        ..Default::default()
    };
    let linearizable = params.get("consistency").is_some_and(|c| c == "linearizable");
    let revision = resource_version::list_revision(params, watch.is_some()).map_err(|r| Box::new(r.response()))?;
    Ok(Query { list, table, linearizable, fields, watch, revision })
}

async fn core(
    state: State<ApiState>,
    client: ClientAddr,
    method: Method,
    headers: HeaderMap,
    Query_(params): Query_<HashMap<String, String>>,
    Path(path): Path<String>,
) -> Response {
    if let Some((namespace, name)) = logs::log_path(&path) {
        return logs::serve(state.store.as_ref(), &state.kubelet, method, namespace, name, &params).await;
    }
    if let Some((node, kubelet_path)) = proxy::proxy_path(&path) {
        return proxy::serve(state.store.as_ref(), &state.kubelet, method, node, kubelet_path).await;
    }
    match query(&headers, &params) {
        Ok(q) => serve(state, client, method, q, "", &path).await,
        Err(response) => *response,
    }
}

async fn grouped(
    state: State<ApiState>,
    client: ClientAddr,
    method: Method,
    headers: HeaderMap,
    Query_(params): Query_<HashMap<String, String>>,
    Path(path): Path<String>,
) -> Response {
    if path.split('/').next() == Some(resource_metrics::GROUP) {
        return resource_metrics::serve(state.store.as_ref(), &state.kubelet, method, &path, &params).await;
    }
    let q = match query(&headers, &params) {
        Ok(q) => q,
        Err(response) => return *response,
    };
    match path.split_once('/') {
        Some((group, rest)) => serve(state, client, method, q, group, rest).await,
        None if method == Method::GET => match discovery::group(&path) {
            Some(group) => Json(group).into_response(),
            None => status(StatusCode::NOT_FOUND, "NotFound", format!("the server could not find /apis/{path}")),
        },
        None => read_only(&state),
    }
}

/// A Secret's values replaced, as every output of gitplane shows them.
fn masked(mut object: Value) -> Value {
    if object["kind"] == "Secret" {
        for field in ["data", "stringData"] {
            if let Some(values) = object.get_mut(field).and_then(Value::as_object_mut) {
                for v in values.values_mut() {
                    *v = Value::String(MASK.to_owned());
                }
            }
        }
    }
    object
}

/// What stands for a Secret's value.
const MASK: &str = "<masked>";

/// `{version}/[namespaces/{ns}/]{plural}[/{name}]` within one group.
async fn serve(
    State(state): State<ApiState>,
    client: ClientAddr,
    method: Method,
    q: Query,
    group: &str,
    path: &str,
) -> Response {
    if method != Method::GET {
        return refuse_write(&state, group, path).await;
    }
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let Some((version, rest)) = segments.split_first() else {
        return status(StatusCode::NOT_FOUND, "NotFound", "no version in the path");
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(*ns), rest),
        _ => (None, rest),
    };
    let (plural, name) = match rest {
        [] => {
            return discovery::resource_list(group, version).map(|l| Json(l).into_response()).unwrap_or_else(|| {
                status(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    format!("the server has no API group version {group}/{version}"),
                )
            });
        }
        [plural] => (*plural, None),
        // A `status` subresource reads as the whole object, as the API server answers it.
        [plural, name] | [plural, name, "status"] => (*plural, Some(*name)),
        _ => return status(StatusCode::NOT_FOUND, "NotFound", format!("the server could not find {path}")),
    };
    let Some(resource) = RESOURCES.iter().find(|r| r.group == group && r.version == *version && r.plural == plural)
    else {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("the server doesn't have a resource type \"{plural}\""),
        );
    };
    if let Err(message) = q.fields.check(resource.kind) {
        return status(StatusCode::BAD_REQUEST, "BadRequest", message);
    }
    if let Some(params) = q.watch {
        let Some(held) = state.watches.try_take(client) else {
            return status(
                StatusCode::TOO_MANY_REQUESTS,
                "TooManyRequests",
                format!("this client holds {} watches already: close some", watch::MAX_WATCHES_PER_CLIENT),
            );
        };
        let fields = match name {
            Some(name) => q.fields.with_name(name),
            None => q.fields,
        };
        let target = watch::Target {
            resource,
            namespace: namespace.map(str::to_owned),
            labels: q.list.label_selector,
            fields,
            table: q.table,
        };
        return watch::serve(state.store.clone(), held, target, params).await;
    }
    let read = async {
        if q.linearizable
            && let Err(e) = state.store.barrier().await
        {
            return status(StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable", e.to_string());
        }
        match name {
            Some(name) => get_one(&state, resource, namespace.unwrap_or(""), name, q.table).await,
            None => list(&state, resource, namespace, q).await,
        }
    };
    // Dropping the read on time-out cancels its store query and frees the connection.
    tokio::time::timeout(REQUEST_TIMEOUT, read).await.unwrap_or_else(|_| {
        status(
            StatusCode::GATEWAY_TIMEOUT,
            "Timeout",
            format!(
                "the read did not finish within {} s: narrow it (limit, labelSelector, namespace)",
                REQUEST_TIMEOUT.as_secs()
            ),
        )
    })
}

/// The 405 of a write to `{version}/[namespaces/{ns}/]{plural}[/{name}[/{subresource}]]`: it
/// names the Application and repository that own the object, or says that nothing in Git does.
/// A write to a collection, or to an object that does not exist, says where to push.
async fn refuse_write(state: &ApiState, group: &str, path: &str) -> Response {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let (namespace, rest) = match segments.as_slice() {
        [_version, "namespaces", ns, rest @ ..] if !rest.is_empty() => (*ns, rest),
        [_version, rest @ ..] => ("", rest),
        [] => return read_only(state),
    };
    let (plural, name) = match rest {
        // Debugging is no write of desired state: its refusal stays the general one.
        [_, _, "exec" | "attach" | "portforward", ..] => return read_only(state),
        [plural, name] | [plural, name, _] => (*plural, *name),
        _ => return read_only(state),
    };
    let Some(resource) = RESOURCES.iter().find(|r| r.group == group && r.plural == plural) else {
        return read_only(state);
    };
    let namespace = if resource.namespaced { namespace } else { "" };
    let key = ObjectKey::new(resource.group_kind(), namespace, name);
    let Ok(Some(object)) = state.store.get(&key).await else {
        return read_only(state);
    };
    let what = if namespace.is_empty() {
        format!("{} {name}", resource.kind)
    } else {
        format!("{} {namespace}/{name}", resource.kind)
    };
    let owner = owner::resolve(state.store.as_ref(), &object).await;
    status(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed", owner::message(&what, &owner))
}

async fn get_one(
    state: &ApiState,
    resource: &Resource,
    namespace: &str,
    name: &str,
    as_table: Option<table::IncludeObject>,
) -> Response {
    let key = ObjectKey::new(resource.group_kind(), namespace, name);
    match state.store.get(&key).await {
        Ok(Some(object)) if let Some(include) = as_table => {
            let revision = object["metadata"]["resourceVersion"].as_str().unwrap_or("").to_owned();
            Json(table::table(resource.kind, &[masked(object)], &revision, Timestamp::now(), include)).into_response()
        }
        Ok(Some(object)) => Json(masked(object)).into_response(),
        Ok(None) => status(StatusCode::NOT_FOUND, "NotFound", format!("{} \"{name}\" not found", resource.plural)),
        Err(e) => status(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", e.to_string()),
    }
}

async fn list(state: &ApiState, resource: &Resource, namespace: Option<&str>, q: Query) -> Response {
    let mut options = ListOptions { namespace: namespace.map(str::to_owned), ..q.list };
    if let resource_version::ListRevision::Exact(at) | resource_version::ListRevision::NotOlderThan(at) = q.revision {
        if let Err(unservable) = resource_version::reach(state.store.as_ref(), at).await {
            return unservable.response();
        }
        if q.revision == resource_version::ListRevision::Exact(at) {
            options.at_revision = Some(at);
        }
    }
    // Secrets stay out of the cache (their values are masked from parsed objects, and a cache
    // of them would hold the plaintext); what the cache cannot serve goes to the store.
    if resource.kind != "Secret" && options.at_revision.is_none() {
        let cached = state.cacher.list(&resource.group_kind(), &options, q.revision).await;
        crate::metrics::cache_list(resource.plural, cached.is_some());
        if let Some(list) = cached {
            return list::from_cache(resource, list, &q.fields, q.table, Timestamp::now());
        }
    }
    list::serve(state.store.as_ref(), resource, &options, &q.fields, q.table).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use gitplane_storage::sqlite::SqliteStore;
    use gitplane_store::Op;
    use tower::ServiceExt;

    fn kubelet() -> KubeletClient {
        KubeletClient::for_tests()
    }

    async fn call(router: &Router, method: Method, uri: &str) -> (StatusCode, Value) {
        let request = axum::http::Request::builder().method(method).uri(uri).body(Body::empty()).unwrap();
        let response = router.clone().oneshot(request).await.unwrap();
        let code = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
        (code, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    #[tokio::test]
    async fn lists_and_gets_pods_and_refuses_writes() {
        let store = Arc::new(SqliteStore::memory().await.unwrap());
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "a"},
                         "spec": {"nodeName": "n1"}, "status": {"phase": "Running", "podIP": "10.244.0.5"}});
        store.txn(vec![Op::Create(pod)]).await.unwrap();
        let router = router(store, "/srv/repos/demo.git".into(), kubelet());

        let (code, all) = call(&router, Method::GET, "/api/v1/pods").await;
        assert_eq!(code, StatusCode::OK);
        assert_eq!(all["kind"], "PodList");
        assert_eq!(all["items"][0]["spec"]["nodeName"], "n1");
        let (_, in_ns) = call(&router, Method::GET, "/api/v1/namespaces/b/pods").await;
        assert_eq!(in_ns["items"].as_array().unwrap().len(), 0);
        let (code, one) = call(&router, Method::GET, "/api/v1/namespaces/a/pods/p").await;
        assert_eq!((code, one["metadata"]["name"].as_str()), (StatusCode::OK, Some("p")));
        let (code, missing) = call(&router, Method::GET, "/api/v1/namespaces/a/pods/q").await;
        assert_eq!((code, missing["reason"].as_str()), (StatusCode::NOT_FOUND, Some("NotFound")));
        let (code, refused) = call(&router, Method::DELETE, "/api/v1/namespaces/a/pods/p").await;
        assert_eq!(code, StatusCode::METHOD_NOT_ALLOWED);
        assert!(refused["message"].as_str().unwrap().starts_with("nothing in Git owns Pod a/p"), "{refused}");
        let (code, refused) = call(&router, Method::PATCH, "/api/v1/namespaces/a/pods/p/status").await;
        assert_eq!(code, StatusCode::METHOD_NOT_ALLOWED);
        assert!(refused["message"].as_str().unwrap().starts_with("nothing in Git owns Pod a/p"), "{refused}");
        let (code, refused) = call(&router, Method::POST, "/api/v1/namespaces/a/pods").await;
        assert_eq!(code, StatusCode::METHOD_NOT_ALLOWED);
        assert!(refused["message"].as_str().unwrap().contains("/srv/repos/demo.git"));
        let (code, _) = call(&router, Method::GET, "/apis/apps/v1/namespaces/a/deployments").await;
        assert_eq!(code, StatusCode::OK);
        let (code, _) = call(&router, Method::GET, "/api/v1/widgets").await;
        assert_eq!(code, StatusCode::NOT_FOUND);
    }

    #[tokio::test]
    async fn secrets_are_masked_tables_and_selectors_work() {
        let store = Arc::new(SqliteStore::memory().await.unwrap());
        let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": "a", "labels": {"x": "1"}},
                            "data": {"password": "aHVudGVyMg=="}});
        store.txn(vec![Op::Create(secret)]).await.unwrap();
        let router = router(store, "repo".into(), kubelet());
        let (_, one) = call(&router, Method::GET, "/api/v1/namespaces/a/secrets/s").await;
        assert_eq!(one["data"]["password"], MASK);
        let (_, list) = call(&router, Method::GET, "/api/v1/secrets?labelSelector=x%3D1").await;
        assert_eq!(list["items"][0]["data"]["password"], MASK);
        let (_, none) = call(&router, Method::GET, "/api/v1/secrets?labelSelector=x%3D2").await;
        assert_eq!(none["items"].as_array().unwrap().len(), 0);
        let (code, _) = call(&router, Method::GET, "/api/v1/secrets?labelSelector=%3Dx").await;
        assert_eq!(code, StatusCode::BAD_REQUEST);
        let request = axum::http::Request::builder()
            .uri("/api/v1/secrets")
            .header("accept", "application/json;as=Table;v=v1;g=meta.k8s.io,application/json")
            .body(Body::empty())
            .unwrap();
        let response = router.clone().oneshot(request).await.unwrap();
        let body: Value =
            serde_json::from_slice(&axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap()).unwrap();
        assert_eq!(body["kind"], "Table");
        assert!(!body.to_string().contains("aHVudGVyMg=="));
    }

    #[tokio::test]
    async fn serves_endpoints_and_endpoint_slices_with_kubectls_columns() {
        let store = Arc::new(SqliteStore::memory().await.unwrap());
        let endpoints = json!({"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "web", "namespace": "default"},
                               "subsets": [{"addresses": [{"ip": "10.244.0.5"}], "ports": [{"port": 8080}]}]});
        let slice = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                           "metadata": {"name": "web-x2k9f", "namespace": "default", "labels": {"kubernetes.io/service-name": "web"}},
                           "addressType": "IPv4", "ports": [{"name": "", "port": 8080, "protocol": "TCP"}],
                           "endpoints": [{"addresses": ["10.244.0.5"], "conditions": {"ready": true}}]});
        store.txn(vec![Op::Create(endpoints), Op::Create(slice)]).await.unwrap();
        let router = router(store, "repo".into(), kubelet());

        let (_, groups) = call(&router, Method::GET, "/apis").await;
        let discovery = groups["groups"].as_array().unwrap().iter().find(|g| g["name"] == "discovery.k8s.io").unwrap();
        assert_eq!(discovery["preferredVersion"]["groupVersion"], "discovery.k8s.io/v1");
        let (_, resources) = call(&router, Method::GET, "/apis/discovery.k8s.io/v1").await;
        assert_eq!(resources["resources"][0]["name"], "endpointslices");
        let (_, core) = call(&router, Method::GET, "/api/v1").await;
        let core_endpoints = core["resources"].as_array().unwrap().iter().find(|r| r["name"] == "endpoints").unwrap();
        assert_eq!((&core_endpoints["kind"], &core_endpoints["shortNames"]), (&json!("Endpoints"), &json!(["ep"])));

        let (code, list) = call(&router, Method::GET, "/api/v1/namespaces/default/endpoints").await;
        assert_eq!((code, list["kind"].as_str()), (StatusCode::OK, Some("EndpointsList")));
        let (_, one) =
            call(&router, Method::GET, "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/web-x2k9f").await;
        assert_eq!(one["endpoints"][0]["addresses"][0], "10.244.0.5");
        let (_, selected) = call(
            &router,
            Method::GET,
            "/apis/discovery.k8s.io/v1/endpointslices?labelSelector=kubernetes.io%2Fservice-name%3Dweb",
        )
        .await;
        assert_eq!(selected["kind"], "EndpointSliceList");
        assert_eq!(selected["items"].as_array().unwrap().len(), 1);

        let table = |uri: &str| {
            let request = axum::http::Request::builder()
                .uri(uri)
                .header("accept", "application/json;as=Table;v=v1;g=meta.k8s.io,application/json")
                .body(Body::empty())
                .unwrap();
            let router = router.clone();
            async move {
                let response = router.oneshot(request).await.unwrap();
                let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
                serde_json::from_slice::<Value>(&bytes).unwrap()
            }
        };
        let t = table("/api/v1/namespaces/default/endpoints").await;
        assert_eq!(t["rows"][0]["cells"][1], "10.244.0.5:8080");
        let t = table("/apis/discovery.k8s.io/v1/namespaces/default/endpointslices").await;
        assert_eq!(
            t["rows"][0]["cells"].as_array().unwrap()[..4],
            [json!("web-x2k9f"), json!("IPv4"), json!("8080"), json!("10.244.0.5")]
        );
    }

    /// Query strings (list parameters, selectors, continue tokens) and Accept headers from
    /// outside: each ends in a Kubernetes answer, never a panic or a server error.
    #[test]
    fn t30_fuzz_query_parameters_and_continue_tokens() {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let router = runtime.block_on(async {
            let store = Arc::new(SqliteStore::memory().await.unwrap());
            for name in ["a", "b", "c"] {
                let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default",
                                 "labels": {"app": name, "tier": "web"}}});
                store.txn(vec![Op::Create(pod)]).await.unwrap();
            }
            router(store, "repo".into(), kubelet())
        });
        let (_, page) = runtime.block_on(call(&router, Method::GET, "/api/v1/pods?limit=1"));
        let token = page["metadata"]["continue"].as_str().unwrap().to_owned();
        let with_token = format!("limit=1&continue={token}");
        let seeds: [&[u8]; 5] = [
            b"limit=2&labelSelector=app%3Da",
            b"labelSelector=tier+in+(web,db),!x,app!=b",
            with_token.as_bytes(),
            b"limit=18446744073709551615",
            b"consistency=linearizable&watch=0&resourceVersion=1",
        ];
        let dictionary: &[&[u8]] = &[
            b"&",
            b"=",
            b"%",
            b"%2C",
            b"%3D",
            b"%21",
            b"+in+",
            b"+notin+",
            b"(",
            b")",
            b",",
            b"!",
            b"==",
            b"!=",
            b"limit=",
            b"continue=",
            b"labelSelector=",
            b"fieldSelector=",
            b"watch=1",
            b"-1",
            b"99999999999999999999",
            b"%00",
            token.as_bytes(),
        ];
        let target = gitplane_fuzz::Target { name: "query", seeds: &seeds, dictionary, max_len: 2 << 10 };
        gitplane_fuzz::fuzz(target, |input| {
            let Ok(query) = std::str::from_utf8(input) else { return };
            let Ok(uri) = format!("/api/v1/pods?{query}").parse::<axum::http::Uri>() else { return };
            let table = input.first().is_some_and(|b| b % 2 == 0);
            let mut request = axum::http::Request::builder().uri(uri);
            if table {
                request = request.header("accept", "application/json;as=Table;v=v1;g=meta.k8s.io");
            }
            let response = runtime.block_on(router.clone().oneshot(request.body(Body::empty()).unwrap())).unwrap();
            // 504 is Kubernetes' own answer to a resourceVersion the store has not reached
            // ("Too large resource version"), after its 3 s wait.
            let code = response.status();
            assert!(!code.is_server_error() || code == StatusCode::GATEWAY_TIMEOUT, "{query}: {code}");
        });
    }
}
