//! Discovery as the API server publishes it: `/version`, `/api` and `/apis` (the legacy
//! `APIVersions` / `APIGroupList` and aggregated discovery, `apidiscovery.k8s.io/v2`, which
//! kubectl asks for first), the group documents and each group-version's `APIResourceList`.
//! What kubectl's short names (`po`, `deploy`), `get all` (the `all` category) and
//! `api-resources` read comes from here. Pure: documents from the [`RESOURCES`] table.

use super::{RESOURCES, Resource, resource_metrics};
use axum::{
    Json,
    http::{HeaderMap, HeaderValue, header},
    response::{IntoResponse, Response},
};
use serde_json::{Value, json};

/// The Kubernetes release whose API gitplane serves (its k8s-openapi types).
pub const KUBERNETES: (u32, u32, u32) = (1, 33, 0);

/// What every served resource allows: reading, and watching.
const VERBS: [&str; 3] = ["get", "list", "watch"];

/// `v1.33.0-gitplane.0.1.0`: the Kubernetes API version served, and gitplane's own.
pub fn git_version() -> String {
    let (major, minor, patch) = KUBERNETES;
    format!("v{major}.{minor}.{patch}-gitplane.{}", env!("CARGO_PKG_VERSION"))
}

/// `/version`, the `version.Info` kubectl prints as the server's.
pub fn version() -> Value {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    json!({
        "major": KUBERNETES.0.to_string(),
        "minor": KUBERNETES.1.to_string(),
        "gitVersion": git_version(),
        "gitCommit": "",
        "gitTreeState": "",
        "buildDate": "",
        // gitplane is built with rustc, not Go: the field is there for clients that read it.
        "goVersion": "",
        "compiler": "rustc",
        "platform": format!("{}/{arch}", std::env::consts::OS),
    })
}

/// The short names the API server gives its resources (`kubectl get po`).
fn short_names(r: &Resource) -> &'static [&'static str] {
    match r.plural {
        "pods" => &["po"],
        "services" => &["svc"],
        "endpoints" => &["ep"],
        "configmaps" => &["cm"],
        "limitranges" => &["limits"],
        "resourcequotas" => &["quota"],
        "serviceaccounts" => &["sa"],
        "events" => &["ev"],
        "nodes" => &["no"],
        "namespaces" => &["ns"],
        "deployments" => &["deploy"],
        "replicasets" => &["rs"],
        "cronjobs" => &["cj"],
        "horizontalpodautoscalers" => &["hpa"],
        "statefulsets" => &["sts"],
        "daemonsets" => &["ds"],
        "replicationcontrollers" => &["rc"],
        "poddisruptionbudgets" => &["pdb"],
        "ingresses" => &["ing"],
        "networkpolicies" => &["netpol"],
        "persistentvolumeclaims" => &["pvc"],
        "persistentvolumes" => &["pv"],
        "storageclasses" => &["sc"],
        // As Argo CD names its Applications.
        "applications" => &["app"],
        _ => &[],
    }
}

/// The `all` category holds the workloads and Services, as in Kubernetes (`kubectl get all`).
fn categories(r: &Resource) -> &'static [&'static str] {
    match r.plural {
        "pods"
        | "services"
        | "deployments"
        | "replicasets"
        | "statefulsets"
        | "daemonsets"
        | "replicationcontrollers"
        | "jobs"
        | "cronjobs"
        | "horizontalpodautoscalers" => &["all"],
        _ => &[],
    }
}

/// The subresources served: every object's `status` (the object itself, read-only), Pods' `log`,
/// and Pods' `exec`, `attach`, `portforward` (for debug tokens).
fn subresources(r: &Resource) -> &'static [&'static str] {
    match r.plural {
        "pods" => &["attach", "exec", "log", "portforward", "status"],
        "configmaps" | "secrets" | "endpoints" | "events" | "limitranges" | "endpointslices" | "leases"
        | "ingressclasses" | "storageclasses" => &[],
        _ => &["status"],
    }
}

/// A subresource's kind and verbs, as the API server lists them (the streams take options
/// kinds and are opened with `create`, or `get` over WebSocket).
fn subresource_kind(r: &Resource, sub: &str) -> (&'static str, &'static [&'static str]) {
    match sub {
        "exec" => ("PodExecOptions", &["create", "get"]),
        "attach" => ("PodAttachOptions", &["create", "get"]),
        "portforward" => ("PodPortForwardOptions", &["create", "get"]),
        _ => (r.kind, &["get"]),
    }
}

fn singular(r: &Resource) -> String {
    r.kind.to_lowercase()
}

/// The served group-versions, core first, each once, in the order of [`RESOURCES`].
fn group_versions() -> Vec<(&'static str, &'static str)> {
    let mut out: Vec<(&str, &str)> = Vec::new();
    for r in RESOURCES {
        if !out.contains(&(r.group, r.version)) {
            out.push((r.group, r.version));
        }
    }
    out
}

fn group_version(group: &str, version: &str) -> String {
    if group.is_empty() { version.to_owned() } else { format!("{group}/{version}") }
}

/// `/apis/{group}/{version}` (or `/api/v1`): the `APIResourceList`, subresources as
/// `pods/log` entries as the API server lists them.
pub fn resource_list(group: &str, version: &str) -> Option<Value> {
    let mut resources = Vec::new();
    for r in RESOURCES.iter().filter(|r| r.group == group && r.version == version) {
        resources.push(json!({
            "name": r.plural, "singularName": singular(r), "namespaced": r.namespaced, "kind": r.kind,
            "verbs": VERBS, "shortNames": short_names(r), "categories": categories(r),
        }));
        for sub in subresources(r) {
            let (kind, verbs) = subresource_kind(r, sub);
            resources.push(json!({
                "name": format!("{}/{sub}", r.plural), "singularName": "", "namespaced": r.namespaced,
                "kind": kind, "verbs": verbs,
            }));
        }
    }
    if resources.is_empty() {
        return None;
    }
    Some(json!({
        "kind": "APIResourceList", "apiVersion": "v1",
        "groupVersion": group_version(group, version), "resources": resources,
    }))
}

/// `/apis/{group}`: the `APIGroup`.
pub fn group(name: &str) -> Option<Value> {
    let versions: Vec<Value> = group_versions()
        .into_iter()
        .filter(|(g, _)| *g == name && !g.is_empty())
        .map(|(g, v)| json!({"groupVersion": group_version(g, v), "version": v}))
        .collect();
    let preferred = versions.first()?.clone();
    Some(
        json!({"kind": "APIGroup", "apiVersion": "v1", "name": name, "versions": versions, "preferredVersion": preferred}),
    )
}

fn group_list() -> Value {
    let mut names: Vec<&str> = group_versions().into_iter().map(|(g, _)| g).filter(|g| !g.is_empty()).collect();
    names.dedup();
    let groups: Vec<Value> = names
        .into_iter()
        .filter_map(|name| {
            let mut g = group(name)?;
            let object = g.as_object_mut()?;
            object.remove("kind");
            object.remove("apiVersion");
            Some(g)
        })
        .chain([resource_metrics::api_group()])
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// Which discovery document a client asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Format {
    /// `APIVersions` / `APIGroupList`.
    Legacy,
    /// `APIGroupDiscoveryList` of `apidiscovery.k8s.io/{version}`: `v2` or `v2beta1`.
    Aggregated(&'static str),
}

/// The first media type of `Accept` that names a format served (kubectl lists aggregated v2,
/// then v2beta1, then plain JSON).
fn format(headers: &HeaderMap) -> Format {
    let accepted = headers.get_all(header::ACCEPT).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(','));
    for media in accepted {
        let mut parts = media.split(';').map(str::trim);
        let base = parts.next().unwrap_or("");
        let params: Vec<(&str, &str)> = parts.filter_map(|p| p.split_once('=')).collect();
        let param = |name: &str| params.iter().find(|(k, _)| *k == name).map(|(_, v)| *v);
        let aggregated = param("g") == Some("apidiscovery.k8s.io") && param("as") == Some("APIGroupDiscoveryList");
        match (base, aggregated, param("v")) {
            ("application/json", true, Some("v2")) => return Format::Aggregated("v2"),
            ("application/json", true, Some("v2beta1")) => return Format::Aggregated("v2beta1"),
            ("application/json" | "*/*" | "application/*", false, _) if param("as").is_none() => return Format::Legacy,
            _ => {}
        }
    }
    Format::Legacy
}

/// The aggregated discovery of the core group (`core`) or of every other group.
fn aggregated(core: bool, version: &str) -> Value {
    let mut names: Vec<&str> = group_versions().into_iter().map(|(g, _)| g).filter(|g| g.is_empty() == core).collect();
    names.dedup();
    let items: Vec<Value> = names
        .into_iter()
        .map(|name| {
            let versions: Vec<Value> = group_versions()
                .into_iter()
                .filter(|(g, _)| *g == name)
                .map(|(g, v)| {
                    let resources: Vec<Value> = RESOURCES
                        .iter()
                        .filter(|r| r.group == g && r.version == v)
                        .map(|r| {
                            let kind = json!({"group": r.group, "version": r.version, "kind": r.kind});
                            let subresources: Vec<Value> = subresources(r)
                                .iter()
                                .map(|s| {
                                    let (sub_kind, verbs) = subresource_kind(r, s);
                                    let response_kind =
                                        json!({"group": r.group, "version": r.version, "kind": sub_kind});
                                    json!({"subresource": s, "responseKind": response_kind, "verbs": verbs})
                                })
                                .collect();
                            json!({
                                "resource": r.plural, "responseKind": kind, "singularResource": singular(r),
                                "scope": if r.namespaced { "Namespaced" } else { "Cluster" },
                                "verbs": VERBS, "shortNames": short_names(r), "categories": categories(r),
                                "subresources": subresources,
                            })
                        })
                        .collect();
                    json!({"version": v, "resources": resources, "freshness": "Current"})
                })
                .collect();
            let metadata = if name.is_empty() { json!({}) } else { json!({"name": name}) };
            json!({"metadata": metadata, "versions": versions})
        })
        .chain((!core).then(resource_metrics::aggregated_group))
        .collect();
    json!({
        "kind": "APIGroupDiscoveryList", "apiVersion": format!("apidiscovery.k8s.io/{version}"),
        "metadata": {}, "items": items,
    })
}

/// `/api` (`core`) or `/apis`, in the format the client asked for.
pub fn root(core: bool, headers: &HeaderMap) -> Response {
    match format(headers) {
        Format::Aggregated(version) => {
            let content_type = format!("application/json;g=apidiscovery.k8s.io;v={version};as=APIGroupDiscoveryList");
            let mut response = Json(aggregated(core, version)).into_response();
            if let Ok(value) = HeaderValue::from_str(&content_type) {
                response.headers_mut().insert(header::CONTENT_TYPE, value);
            }
            // Tells clients (and caches) that the answer depends on Accept.
            response.headers_mut().insert(header::VARY, HeaderValue::from_static("Accept"));
            response
        }
        Format::Legacy if core => {
            let versions = json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []});
            Json(versions).into_response()
        }
        Format::Legacy => Json(group_list()).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KUBECTL: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";

    fn accept(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::ACCEPT, HeaderValue::from_str(value).unwrap());
        headers
    }

    fn resource<'a>(doc: &'a Value, name: &str) -> &'a Value {
        doc["items"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|g| g["versions"][0]["resources"].as_array().unwrap())
            .find(|r| r["resource"] == name)
            .unwrap_or_else(|| panic!("{name} in {doc}"))
    }

    #[test]
    fn kubectls_accept_header_gets_aggregated_discovery() {
        assert_eq!(format(&accept(KUBECTL)), Format::Aggregated("v2"));
        assert_eq!(
            format(&accept("application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList")),
            Format::Aggregated("v2beta1")
        );
        assert_eq!(format(&accept("application/json, */*")), Format::Legacy);
        assert_eq!(format(&HeaderMap::new()), Format::Legacy);
        assert_eq!(format(&accept("application/json;as=Table;v=v1;g=meta.k8s.io,application/json")), Format::Legacy);
    }

    #[test]
    fn aggregated_discovery_carries_short_names_categories_verbs_and_subresources() {
        let core = aggregated(true, "v2");
        assert_eq!(core["kind"], "APIGroupDiscoveryList");
        assert_eq!(core["items"].as_array().unwrap().len(), 1, "one core group");
        let pods = resource(&core, "pods");
        assert_eq!(pods["shortNames"], json!(["po"]));
        assert_eq!(pods["categories"], json!(["all"]));
        assert_eq!(pods["verbs"], json!(["get", "list", "watch"]));
        assert_eq!((pods["scope"].as_str(), pods["singularResource"].as_str()), (Some("Namespaced"), Some("pod")));
        let subs: Vec<&str> =
            pods["subresources"].as_array().unwrap().iter().map(|s| s["subresource"].as_str().unwrap()).collect();
        assert_eq!(subs, ["attach", "exec", "log", "portforward", "status"]);
        let exec = &pods["subresources"][1];
        assert_eq!(
            (&exec["responseKind"]["kind"], &exec["verbs"]),
            (&json!("PodExecOptions"), &json!(["create", "get"]))
        );
        assert_eq!(resource(&core, "nodes")["scope"], "Cluster");
        for (plural, short) in [
            ("services", "svc"),
            ("endpoints", "ep"),
            ("configmaps", "cm"),
            ("namespaces", "ns"),
            ("nodes", "no"),
            ("events", "ev"),
            ("persistentvolumeclaims", "pvc"),
            ("persistentvolumes", "pv"),
        ] {
            assert_eq!(resource(&core, plural)["shortNames"][0], short, "{plural}");
        }
        assert_eq!(resource(&core, "configmaps")["categories"], json!([]));

        let groups = aggregated(false, "v2");
        let names: Vec<&str> =
            groups["items"].as_array().unwrap().iter().map(|g| g["metadata"]["name"].as_str().unwrap()).collect();
        assert_eq!(
            names,
            [
                "apps",
                "batch",
                "autoscaling",
                "discovery.k8s.io",
                "networking.k8s.io",
                "coordination.k8s.io",
                "policy",
                "rbac.authorization.k8s.io",
                "storage.k8s.io",
                "apiregistration.k8s.io",
                "admissionregistration.k8s.io",
                "gitplane.io",
                "metrics.k8s.io"
            ]
        );
        assert_eq!(resource(&groups, "daemonsets")["shortNames"], json!(["ds"]));
        assert_eq!(resource(&groups, "poddisruptionbudgets")["shortNames"], json!(["pdb"]));
        assert_eq!(resource(&groups, "networkpolicies")["shortNames"], json!(["netpol"]));
        assert_eq!(resource(&groups, "storageclasses")["shortNames"], json!(["sc"]));
        let deployments = resource(&groups, "deployments");
        assert_eq!((&deployments["shortNames"], &deployments["categories"]), (&json!(["deploy"]), &json!(["all"])));
        assert_eq!(deployments["responseKind"], json!({"group": "apps", "version": "v1", "kind": "Deployment"}));
        assert_eq!(resource(&groups, "replicasets")["shortNames"], json!(["rs"]));
        assert_eq!(resource(&groups, "jobs")["categories"], json!(["all"]));
    }

    #[test]
    fn legacy_documents_list_every_group_version() {
        let list = group_list();
        let apps = list["groups"].as_array().unwrap().iter().find(|g| g["name"] == "apps").unwrap();
        assert_eq!(apps["preferredVersion"]["groupVersion"], "apps/v1");
        assert_eq!(list["groups"].as_array().unwrap().len(), 13);
        assert_eq!(list["groups"][12]["preferredVersion"]["groupVersion"], "metrics.k8s.io/v1beta1");
        assert_eq!(group("batch").unwrap()["versions"][0]["groupVersion"], "batch/v1");
        assert!(group("widgets.example.com").is_none());
        let core = resource_list("", "v1").unwrap();
        let names: Vec<&str> =
            core["resources"].as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap()).collect();
        assert!(names.contains(&"pods/log") && names.contains(&"pods/status") && names.contains(&"pods"), "{names:?}");
        assert!(resource_list("apps", "v2").is_none());
    }

    #[test]
    fn version_reads_as_kubernetes_with_gitplanes_own() {
        let v = version();
        assert_eq!((v["major"].as_str(), v["minor"].as_str()), (Some("1"), Some("33")));
        assert!(v["gitVersion"].as_str().unwrap().starts_with("v1.33.0-gitplane."));
        assert!(v.get("goVersion").is_some() && v["platform"].as_str().unwrap().contains('/'));
    }

    /// Through the router as a replica serves it (with its fallback): content types, group
    /// documents, the status subresource, and a Status 404 for paths nothing serves.
    #[tokio::test]
    async fn the_router_serves_discovery_and_answers_unknown_paths_with_a_status() {
        use axum::body::Body;
        use gitplane_store::{Op, Store};
        use tower::ServiceExt;
        let store = std::sync::Arc::new(gitplane_storage::sqlite::SqliteStore::memory().await.unwrap());
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "a"}});
        store.txn(vec![Op::Create(pod)]).await.unwrap();
        let kubelet = crate::kubelet_client::KubeletClient::for_tests();
        let router = super::super::router(store, "repo".into(), kubelet).fallback(super::super::not_found);
        let call = |uri: &str, accept: Option<&str>| {
            let mut request = axum::http::Request::builder().uri(uri);
            if let Some(accept) = accept {
                request = request.header("accept", accept);
            }
            let router = router.clone();
            let request = request.body(Body::empty()).unwrap();
            async move {
                let response = router.oneshot(request).await.unwrap();
                let (code, headers) = (response.status(), response.headers().clone());
                let bytes = axum::body::to_bytes(response.into_body(), 1 << 24).await.unwrap();
                (code, headers, serde_json::from_slice::<Value>(&bytes).unwrap_or(Value::Null))
            }
        };
        let (_, headers, body) = call("/apis", Some(KUBECTL)).await;
        assert_eq!(headers["content-type"], "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList");
        assert_eq!(body["kind"], "APIGroupDiscoveryList");
        let (_, headers, body) = call("/api", None).await;
        assert_eq!(
            (headers["content-type"].to_str().unwrap(), body["kind"].as_str()),
            ("application/json", Some("APIVersions"))
        );
        let (code, _, body) = call("/apis/apps", None).await;
        assert_eq!((code.as_u16(), body["kind"].as_str()), (200, Some("APIGroup")));
        let (code, _, body) = call("/api/v1/namespaces/a/pods/p/status", None).await;
        assert_eq!((code.as_u16(), body["metadata"]["name"].as_str()), (200, Some("p")));
        let (_, _, body) = call("/version", None).await;
        assert_eq!(body["major"], "1");
        for path in ["/metrics", "/openapi/v9", "/readyz-not", "/apis/widgets.example.com", "/"] {
            let (code, _, body) = call(path, None).await;
            assert_eq!(
                (code.as_u16(), body["kind"].as_str(), body["code"].as_u64()),
                (404, Some("Status"), Some(404)),
                "{path}"
            );
        }
    }
}
