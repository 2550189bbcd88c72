//! LIST answers. A JSON list is spliced from the objects' stored JSON text
//! ([`Store::list_json`]): no object is parsed or serialized again unless a field selector must
//! read it or it is a Secret (masked), and the answer is copied out a chunk at a time behind an
//! exact Content-Length instead of being built whole. The stored text is what `Value::to_string`
//! gives for the object, so the bytes are the same as serializing the parsed list would give
//! (the tests hold the two against each other). A Table is still rendered from parsed objects.
//! The same splice serves the list cache's texts ([`super::cacher`]): [`from_text`].

use super::{Resource, fields::FieldSelector, masked, status};
use crate::table;
use axum::{
    Json,
    body::{Body, Bytes},
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use gitplane_store::{List, ListOptions, Store, StoreError};
use http_body::{Frame, SizeHint};
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;
use std::{
    convert::Infallible,
    pin::Pin,
    task::{Context, Poll},
};

/// Bytes copied per body frame.
const CHUNK: usize = 64 * 1024;

/// The LIST of `resource` under `options`, filtered by `fields`, as JSON or as a Table.
pub(super) async fn serve(
    store: &dyn Store,
    resource: &Resource,
    options: &ListOptions,
    fields: &FieldSelector,
    as_table: Option<table::IncludeObject>,
) -> Response {
    let kind = resource.group_kind();
    // Field selectors filter each page; a page may come out short, its continue token still
    // right (Kubernetes allows short pages).
    if as_table.is_some() || resource.kind == "Secret" {
        let list = match store.list(&kind, options).await {
            Ok(list) => list,
            Err(e) => return error(e),
        };
        let items = list.items.into_iter().filter(|o| fields.matches(o)).map(masked);
        if let Some(include) = as_table {
            let items: Vec<Value> = items.collect();
            let mut t = table::table(resource.kind, &items, &list.revision.to_string(), Timestamp::now(), include);
            if let Some(token) = list.continue_token {
                t["metadata"]["continue"] = Value::String(token);
            }
            return Json(t).into_response();
        }
        let items = items.map(|o| o.to_string()).collect();
        return json_list(resource, List { revision: list.revision, items, continue_token: list.continue_token });
    }
    match store.list_json(&kind, options).await {
        Ok(list) => from_text(resource, list, fields, None),
        Err(e) => error(e),
    }
}

/// A list of stored JSON texts (the store's or the list cache's, never Secrets), filtered by
/// `fields` and answered as JSON (spliced) or as a Table.
pub(super) fn from_text<T: AsRef<str> + Send + Unpin + 'static>(
    resource: &Resource,
    mut list: List<T>,
    fields: &FieldSelector,
    as_table: Option<table::IncludeObject>,
) -> Response {
    // As `list` answers a stored object that is not JSON.
    let corrupt =
        |source: serde_json::Error| error(StoreError::Corrupt { key: format!("a {}", resource.group_kind()), source });
    let parse = |text: &T| serde_json::from_str::<Value>(text.as_ref());
    if let Some(include) = as_table {
        let mut items = Vec::with_capacity(list.items.len());
        for text in &list.items {
            let object = match parse(text) {
                Ok(object) => object,
                Err(source) => return corrupt(source),
            };
            if fields.matches(&object) {
                items.push(object);
            }
        }
        let mut t = table::table(resource.kind, &items, &list.revision.to_string(), Timestamp::now(), include);
        if let Some(token) = list.continue_token {
            t["metadata"]["continue"] = Value::String(token);
        }
        return Json(t).into_response();
    }
    if !fields.is_empty() {
        let mut kept = Vec::new();
        for text in list.items {
            match parse(&text) {
                Ok(object) if fields.matches(&object) => kept.push(text),
                Ok(_) => {}
                Err(source) => return corrupt(source),
            }
        }
        list.items = kept;
    }
    json_list(resource, list)
}

fn error(e: StoreError) -> Response {
    match e {
        e @ (StoreError::BadRequest(_) | StoreError::Rejected(_)) => {
            status(StatusCode::BAD_REQUEST, "BadRequest", e.to_string())
        }
        e @ StoreError::Expired { .. } => status(StatusCode::GONE, "Expired", e.to_string()),
        e => status(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", e.to_string()),
    }
}

/// `{"apiVersion":…,"items":[…],"kind":"…List","metadata":{…}}`, keys in the order
/// serde_json writes them (sorted), so the answer is byte for byte what serializing it whole
/// would be.
fn json_list<T: AsRef<str> + Send + Unpin + 'static>(resource: &Resource, list: List<T>) -> Response {
    let quoted = |s: &str| Value::from(s).to_string();
    let head = format!(r#"{{"apiVersion":{},"items":["#, quoted(&resource.api_version()));
    let continue_ = list.continue_token.map(|t| format!(r#""continue":{},"#, quoted(&t))).unwrap_or_default();
    let tail = format!(
        r#"],"kind":{},"metadata":{{{continue_}"resourceVersion":{}}}}}"#,
        quoted(&format!("{}List", resource.kind)),
        quoted(&list.revision.to_string())
    );
    let body = ListBody::new(head, list.items, tail);
    let mut response = Body::new(body).into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// A list's JSON, copied out of its head, items and tail a chunk at a time; its exact length
/// goes ahead as Content-Length. Items are freed as they are sent.
struct ListBody<T> {
    head: Option<String>,
    items: std::vec::IntoIter<T>,
    first: bool,
    tail: Option<String>,
    remaining: u64,
}

impl<T: AsRef<str>> ListBody<T> {
    fn new(head: String, items: Vec<T>, tail: String) -> ListBody<T> {
        let commas = items.len().saturating_sub(1);
        let length = head.len() + items.iter().map(|i| i.as_ref().len()).sum::<usize>() + commas + tail.len();
        ListBody { head: Some(head), items: items.into_iter(), first: true, tail: Some(tail), remaining: length as u64 }
    }

    fn next_chunk(&mut self) -> Option<Bytes> {
        let mut chunk = Vec::with_capacity(CHUNK);
        if let Some(head) = self.head.take() {
            chunk.extend_from_slice(head.as_bytes());
        }
        while chunk.len() < CHUNK {
            match self.items.next() {
                Some(item) => {
                    if !std::mem::take(&mut self.first) {
                        chunk.push(b',');
                    }
                    chunk.extend_from_slice(item.as_ref().as_bytes());
                }
                None => {
                    if let Some(tail) = self.tail.take() {
                        chunk.extend_from_slice(tail.as_bytes());
                    }
                    break;
                }
            }
        }
        self.remaining = self.remaining.saturating_sub(chunk.len() as u64);
        (!chunk.is_empty()).then(|| Bytes::from(chunk))
    }
}

impl<T: AsRef<str> + Unpin> http_body::Body for ListBody<T> {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.get_mut().next_chunk().map(|chunk| Ok(Frame::data(chunk))))
    }

    fn is_end_stream(&self) -> bool {
        self.remaining == 0
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{ApiState, RESOURCES, routes};
    use super::*;
    use crate::kubelet_client::KubeletClient;
    use axum::http::Request;
    use gitplane_storage::sqlite::SqliteStore;
    use gitplane_store::Op;
    use serde_json::json;
    use std::sync::Arc;
    use tower::ServiceExt;

    /// The answer as the server built it before lists were spliced: the parsed list, filtered,
    /// masked and serialized whole.
    async fn serialized_whole(store: &dyn Store, kind: &str, options: ListOptions, fields: &str) -> Vec<u8> {
        let resource = RESOURCES.iter().find(|r| r.kind == kind).unwrap();
        let fields = FieldSelector::parse(fields).unwrap();
        let list = store.list(&resource.group_kind(), &options).await.unwrap();
        let items: Vec<Value> = list.items.into_iter().filter(|o| fields.matches(o)).map(masked).collect();
        let mut metadata = json!({"resourceVersion": list.revision.to_string()});
        if let Some(token) = list.continue_token {
            metadata["continue"] = Value::String(token);
        }
        let answer = json!({
            "apiVersion": resource.api_version(),
            "kind": format!("{}List", resource.kind),
            "metadata": metadata,
            "items": items,
        });
        serde_json::to_vec(&answer).unwrap()
    }

    async fn body(router: &axum::Router, uri: &str) -> Vec<u8> {
        let request = Request::builder().uri(uri).body(Body::empty()).unwrap();
        let response = router.clone().oneshot(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{uri}");
        let length: usize = response.headers()[header::CONTENT_LENGTH].to_str().unwrap().parse().unwrap();
        let bytes = axum::body::to_bytes(response.into_body(), 64 << 20).await.unwrap();
        assert_eq!(length, bytes.len(), "{uri}: Content-Length");
        bytes.to_vec()
    }

    #[tokio::test]
    async fn spliced_lists_are_byte_for_byte_the_serialized_ones() {
        let store = Arc::new(SqliteStore::memory().await.unwrap());
        // Enough Pods for several chunks, some with text and numbers that a careless splice or
        // a second serializer would write differently.
        let pods = (0..300).map(|i| {
            let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("p{i:03}"), "namespace": if i % 3 == 0 { "a" } else { "b" },
                             "labels": {"app": format!("web-{}", i % 4)}},
                "spec": {"nodeName": format!("n{}", i % 2), "containers": [{"name": "c", "image": "x".repeat(700)}]},
                "status": {"phase": if i % 5 == 0 { "Pending" } else { "Running" }}});
            if i == 7 {
                pod["metadata"]["annotations"] =
                    json!({"note": "é \"q\" \n\t</script> \u{1f600} \u{7f}", "ratio": "0.1"});
                pod["spec"]["priority"] = json!(12345678901234567_i64);
                pod["spec"]["overhead"] = json!({"x": 0.1, "y": -2.5e-8});
            }
            Op::Create(pod)
        });
        store.txn(pods.collect()).await.unwrap();
        let secret = json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": "s", "namespace": "a"}, "data": {"password": "aHVudGVyMg=="}});
        store.txn(vec![Op::Create(secret)]).await.unwrap();
        let state = ApiState::new(store.clone(), "repo".into(), KubeletClient::for_tests());
        let router = routes(state.clone());

        let all = ListOptions::default();
        let in_a = ListOptions { namespace: Some("a".into()), ..Default::default() };
        let labels = ListOptions { label_selector: Some("app in (web-1,web-2)".into()), ..Default::default() };
        let page = ListOptions { limit: Some(40), ..Default::default() };
        let empty = ListOptions { namespace: Some("none".into()), ..Default::default() };
        // From the store (the list cache is not filled before the first LIST of a kind), then
        // from the cache once it is.
        let cases = [
            ("/api/v1/pods", "Pod", all.clone(), ""),
            ("/api/v1/namespaces/a/pods", "Pod", in_a, ""),
            ("/api/v1/pods?labelSelector=app+in+(web-1,web-2)", "Pod", labels, ""),
            (
                "/api/v1/pods?fieldSelector=spec.nodeName%3Dn1,status.phase!%3DPending",
                "Pod",
                all.clone(),
                "spec.nodeName=n1,status.phase!=Pending",
            ),
            ("/api/v1/pods?limit=40", "Pod", page.clone(), ""),
            ("/api/v1/namespaces/none/pods", "Pod", empty, ""),
            ("/api/v1/secrets", "Secret", all.clone(), ""),
            ("/api/v1/secrets?fieldSelector=type%3DOpaque", "Secret", all, "type=Opaque"),
        ];
        for filled in [false, true] {
            if filled {
                state.cacher.wait_for("Pod", store.revision().await.unwrap()).await;
            }
            for (uri, kind, options, fields) in cases.clone() {
                let expected = serialized_whole(store.as_ref(), kind, options, fields).await;
                assert_eq!(
                    String::from_utf8(body(&router, uri).await).unwrap(),
                    String::from_utf8(expected).unwrap(),
                    "{uri} (list cache filled: {filled})"
                );
            }
        }
        // The following pages, through the continue token the first gave.
        let first: Value = serde_json::from_slice(&body(&router, "/api/v1/pods?limit=40").await).unwrap();
        let token = first["metadata"]["continue"].as_str().unwrap().to_owned();
        let next = ListOptions { continue_token: Some(token.clone()), ..page };
        let expected = serialized_whole(store.as_ref(), "Pod", next, "").await;
        let got = body(&router, &format!("/api/v1/pods?limit=40&continue={token}")).await;
        assert_eq!(String::from_utf8(got).unwrap(), String::from_utf8(expected).unwrap());
        assert!(!String::from_utf8(body(&router, "/api/v1/secrets").await).unwrap().contains("aHVudGVyMg=="));
    }
}
