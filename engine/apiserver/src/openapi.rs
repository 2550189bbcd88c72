//! The OpenAPI documents kubectl reads for `explain` and validation: `/openapi/v2` (Swagger
//! 2.0, JSON) and `/openapi/v3` (an index of group-versions, each at
//! `/openapi/v3/api/v1` or `/openapi/v3/apis/{group}/{version}?hash=…`). The definitions are
//! `gitplane_api::openapi`'s, from the same types as `schemas/`; each document is built once,
//! on first use, and kept.

use super::{RESOURCES, discovery, status};
use axum::{
    Router,
    body::Bytes,
    extract::Path,
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use gitplane_api::openapi::{Definitions, Dialect, definitions};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha512};
use std::sync::LazyLock;

/// `/openapi/v2` as JSON.
static V2: LazyLock<Bytes> = LazyLock::new(|| {
    let d = definitions(Dialect::V2);
    let doc = json!({
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": discovery::git_version()},
        "paths": paths(&d, Dialect::V2, |_| true),
        "definitions": d.schemas,
    });
    Bytes::from(serde_json::to_vec(&doc).expect("documents serialize"))
});

/// One OpenAPI v3 document per group-version: (`api/v1` or `apis/{group}/{version}`, its hash, its body).
static V3: LazyLock<Vec<(String, String, Bytes)>> = LazyLock::new(|| {
    let d = definitions(Dialect::V3);
    let mut docs = Vec::new();
    let mut served: Vec<(&str, &str)> = Vec::new();
    for r in RESOURCES {
        if !served.contains(&(r.group, r.version)) {
            served.push((r.group, r.version));
        }
    }
    for (group, version) in served {
        let in_gv = |root: &gitplane_api::openapi::Root| root.group == group && root.version == version;
        let names = d.reachable(d.roots.iter().filter(|r| in_gv(r)), Dialect::V3);
        let schemas: Map<String, Value> =
            names.iter().filter_map(|n| Some((n.clone(), d.schemas.get(n)?.clone()))).collect();
        let doc = json!({
            "openapi": "3.0.0",
            "info": {"title": "Kubernetes", "version": discovery::git_version()},
            "paths": paths(&d, Dialect::V3, in_gv),
            "components": {"schemas": schemas},
        });
        let body = serde_json::to_vec(&doc).expect("documents serialize");
        let hash = hex::encode_upper(Sha512::digest(&body));
        let path = if group.is_empty() { format!("api/{version}") } else { format!("apis/{group}/{version}") };
        docs.push((path, hash, Bytes::from(body)));
    }
    docs
});

/// The read operations of the served kinds that `keep` keeps, as the API server lists them.
fn paths(d: &Definitions, dialect: Dialect, keep: impl Fn(&gitplane_api::openapi::Root) -> bool) -> Value {
    let mut paths = Map::new();
    for root in d.roots.iter().filter(|r| keep(r)) {
        let Some(r) = RESOURCES.iter().find(|r| r.group == root.group && r.kind == root.kind) else { continue };
        let prefix =
            if r.group.is_empty() { format!("/api/{}", r.version) } else { format!("/apis/{}/{}", r.group, r.version) };
        let scope = if r.namespaced { "/namespaces/{namespace}" } else { "" };
        let gvk = json!({"group": r.group, "version": r.version, "kind": r.kind});
        let reference = json!({"$ref": format!("{}{}", dialect.ref_prefix(), root.definition)});
        let ok = match dialect {
            Dialect::V2 => json!({"description": "OK", "schema": reference}),
            Dialect::V3 => json!({"description": "OK", "content": {"application/json": {"schema": reference}}}),
        };
        let operation = |action: &str, id: String| {
            json!({"get": {
                "operationId": id, "responses": {"200": ok},
                "x-kubernetes-action": action, "x-kubernetes-group-version-kind": gvk,
            }})
        };
        let id = |verb: &str| format!("{verb}{}", r.kind);
        paths.insert(format!("{prefix}{scope}/{}", r.plural), operation("list", id("list")));
        paths.insert(format!("{prefix}{scope}/{}/{{name}}", r.plural), operation("get", id("read")));
    }
    Value::Object(paths)
}

fn json_body(body: Bytes) -> Response {
    let mut response = body.into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// Whether the client takes JSON: client-go asks for the protobuf form of `/openapi/v2` only,
/// which gitplane does not serve; it gets a 406 rather than bytes it cannot parse.
fn takes_json(headers: &HeaderMap) -> bool {
    let accept: Vec<&str> = headers.get_all(header::ACCEPT).iter().filter_map(|v| v.to_str().ok()).collect();
    accept.is_empty()
        || accept.iter().flat_map(|v| v.split(',')).any(|m| {
            let base = m.split(';').next().unwrap_or("").trim();
            matches!(base, "application/json" | "*/*" | "application/*" | "")
        })
}

fn not_acceptable() -> Response {
    status(StatusCode::NOT_ACCEPTABLE, "NotAcceptable", "only application/json is served for the OpenAPI documents")
}

async fn v2(headers: HeaderMap) -> Response {
    if !takes_json(&headers) {
        return not_acceptable();
    }
    json_body(V2.clone())
}

async fn v3_index() -> Response {
    let paths: Map<String, Value> = V3
        .iter()
        .map(|(path, hash, _)| (path.clone(), json!({"serverRelativeURL": format!("/openapi/v3/{path}?hash={hash}")})))
        .collect();
    axum::Json(json!({"paths": paths})).into_response()
}

async fn v3_document(headers: HeaderMap, Path(path): Path<String>) -> Response {
    let Some((_, hash, body)) = V3.iter().find(|(p, _, _)| *p == path) else {
        return status(StatusCode::NOT_FOUND, "NotFound", format!("no OpenAPI v3 document for {path}"));
    };
    if !takes_json(&headers) {
        return not_acceptable();
    }
    let mut response = json_body(body.clone());
    if let Ok(etag) = HeaderValue::from_str(&format!("\"{hash}\"")) {
        response.headers_mut().insert(header::ETAG, etag);
    }
    response
}

/// The OpenAPI routes.
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route("/openapi/v2", get(v2))
        .route("/openapi/v3", get(v3_index))
        .route("/openapi/v3/{*path}", get(v3_document))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v3(path: &str) -> Value {
        let (_, _, body) = V3.iter().find(|(p, _, _)| p == path).unwrap_or_else(|| panic!("{path}"));
        serde_json::from_slice(body).unwrap()
    }

    #[test]
    fn every_served_group_version_has_a_v3_document_with_its_kinds() {
        let paths: Vec<&str> = V3.iter().map(|(p, _, _)| p.as_str()).collect();
        assert_eq!(
            paths,
            [
                "api/v1",
                "apis/apps/v1",
                "apis/batch/v1",
                "apis/autoscaling/v2",
                "apis/discovery.k8s.io/v1",
                "apis/networking.k8s.io/v1",
                "apis/coordination.k8s.io/v1",
                "apis/policy/v1",
                "apis/rbac.authorization.k8s.io/v1",
                "apis/storage.k8s.io/v1",
                "apis/apiregistration.k8s.io/v1",
                "apis/admissionregistration.k8s.io/v1",
                "apis/gitplane.io/v1"
            ]
        );
        let apps = v3("apis/apps/v1");
        let schemas = apps["components"]["schemas"].as_object().unwrap();
        let deployment = &schemas["io.k8s.api.apps.v1.Deployment"];
        assert_eq!(deployment["x-kubernetes-group-version-kind"][0]["kind"], "Deployment");
        assert!(schemas.contains_key("io.k8s.api.core.v1.PodSpec"), "referenced definitions are included");
        assert!(!schemas.contains_key("io.k8s.api.core.v1.Service"), "other groups' kinds are not");
        assert!(apps["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["get"].is_object());
        let core = v3("api/v1");
        assert!(core["paths"]["/api/v1/nodes"]["get"].is_object());
        assert!(v3("apis/gitplane.io/v1")["components"]["schemas"]["io.gitplane.v1.Application"].is_object());
    }

    #[test]
    fn v2_holds_every_definition_and_refuses_protobuf_only_clients() {
        let doc: Value = serde_json::from_slice(&V2).unwrap();
        assert_eq!(doc["swagger"], "2.0");
        assert!(doc["definitions"]["io.k8s.api.apps.v1.DeploymentSpec"]["properties"]["replicas"].is_object());
        let mut headers = HeaderMap::new();
        assert!(takes_json(&headers));
        headers.insert(
            header::ACCEPT,
            HeaderValue::from_static("application/com.github.proto-openapi.spec.v2@v1.0+protobuf"),
        );
        assert!(!takes_json(&headers));
        headers.insert(header::ACCEPT, HeaderValue::from_static("application/json, */*"));
        assert!(takes_json(&headers));
    }
}
