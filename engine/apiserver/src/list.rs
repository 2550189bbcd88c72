//! LIST answers. A JSON list is spliced from the objects' stored JSON text
//! ([`Store::list_json`]): no object is parsed or serialized again unless a field selector must
//! read it or it is a Secret (masked), and the answer is copied out a chunk at a time behind an
//! exact Content-Length instead of being built whole. The stored text is what `Value::to_string`
//! gives for the object, so the bytes are the same as serializing the parsed list would give
//! (the tests hold the two against each other). The same splice serves the list cache's texts
//! ([`super::cacher`]): [`from_cache`]. A Table from the cache is spliced too, from the rows the
//! cache made as each object arrived, only the durations printed per request; a Table from the
//! store is rendered from parsed objects.

use super::{Resource, cacher::Cached, fields::FieldSelector, masked, status};
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
        Ok(list) => from_text(resource, list, fields),
        Err(e) => error(e),
    }
}

/// A list from the list cache (never Secrets), filtered by `fields` and answered as JSON or as
/// a Table at `now`, both spliced.
pub(super) fn from_cache(
    resource: &Resource,
    list: List<Cached>,
    fields: &FieldSelector,
    as_table: Option<table::IncludeObject>,
    now: Timestamp,
) -> Response {
    let Some(include) = as_table else { return from_text(resource, list, fields) };
    let List { revision, items, continue_token } = list;
    let items = match filter(resource, items, fields) {
        Ok(items) => items,
        Err(e) => return error(e),
    };
    let quoted = |s: &str| Value::from(s).to_string();
    // The keys in serde_json's order, as `table::table` serialized would have them.
    let head = format!(
        r#"{{"apiVersion":"meta.k8s.io/v1","columnDefinitions":{},"kind":"Table","metadata":{{{}"resourceVersion":{}}},"rows":["#,
        table::column_definitions(resource.kind),
        continue_token.map(|t| format!(r#""continue":{},"#, quoted(&t))).unwrap_or_default(),
        quoted(&revision.to_string()),
    );
    let rows = items
        .into_iter()
        .map(|object| {
            let mut cells = String::with_capacity(128);
            object.row().write(now, &mut cells);
            TableRow { cells, object, include }
        })
        .collect();
    body(head, rows, "]}".to_owned())
}

/// A list of stored JSON texts (the store's or the list cache's, never Secrets), filtered by
/// `fields` and spliced.
fn from_text<T: AsRef<str> + Send + Unpin + 'static>(
    resource: &Resource,
    mut list: List<T>,
    fields: &FieldSelector,
) -> Response {
    list.items = match filter(resource, list.items, fields) {
        Ok(items) => items,
        Err(e) => return error(e),
    };
    json_list(resource, list)
}

/// The texts whose objects `fields` selects (all of them, unparsed, without a field selector).
fn filter<T: AsRef<str>>(resource: &Resource, texts: Vec<T>, fields: &FieldSelector) -> Result<Vec<T>, StoreError> {
    if fields.is_empty() {
        return Ok(texts);
    }
    let mut kept = Vec::new();
    for text in texts {
        match serde_json::from_str::<Value>(text.as_ref()) {
            Ok(object) if fields.matches(&object) => kept.push(text),
            Ok(_) => {}
            // As `list` answers a stored object that is not JSON.
            Err(source) => return Err(StoreError::Corrupt { key: format!("a {}", resource.group_kind()), source }),
        }
    }
    Ok(kept)
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
fn json_list<T: Splice + Send + Unpin + 'static>(resource: &Resource, list: List<T>) -> Response {
    let quoted = |s: &str| Value::from(s).to_string();
    let head = format!(r#"{{"apiVersion":{},"items":["#, quoted(&resource.api_version()));
    let continue_ = list.continue_token.map(|t| format!(r#""continue":{},"#, quoted(&t))).unwrap_or_default();
    let tail = format!(
        r#"],"kind":{},"metadata":{{{continue_}"resourceVersion":{}}}}}"#,
        quoted(&format!("{}List", resource.kind)),
        quoted(&list.revision.to_string())
    );
    body(head, list.items, tail)
}

fn body<T: Splice + Send + Unpin + 'static>(head: String, items: Vec<T>, tail: String) -> Response {
    let mut response = Body::new(ListBody::new(head, items, tail)).into_response();
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// An item of a list body: its JSON, of a length known before it is copied.
trait Splice {
    fn len(&self) -> usize;
    fn write(&self, out: &mut Vec<u8>);
}

/// A stored object's text.
impl<T: AsRef<str>> Splice for T {
    fn len(&self) -> usize {
        self.as_ref().len()
    }

    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(self.as_ref().as_bytes());
    }
}

/// A Table row from the list cache: its cells printed for this request, and the object (or its
/// metadata) spliced from the cached text when the copy reaches it.
struct TableRow {
    cells: String,
    object: Cached,
    include: table::IncludeObject,
}

/// A row's `object` under `includeObject=Metadata`, around the object's metadata.
const PARTIAL_OBJECT_METADATA: &str = r#"{"apiVersion":"meta.k8s.io/v1","kind":"PartialObjectMetadata","metadata":"#;

impl TableRow {
    /// The row's parts, in order: `{"cells":[…],"object":…}`.
    fn parts(&self) -> [&str; 6] {
        let (before, object, after) = match self.include {
            table::IncludeObject::None => ("", "", ""),
            table::IncludeObject::Metadata => (PARTIAL_OBJECT_METADATA, self.object.metadata(), "}"),
            table::IncludeObject::Object => ("", self.object.as_ref(), ""),
        };
        let key = if object.is_empty() { "" } else { r#","object":"# };
        [r#"{"cells":"#, &self.cells, key, before, object, after]
    }
}

impl Splice for TableRow {
    fn len(&self) -> usize {
        self.parts().iter().map(|p| p.len()).sum::<usize>() + 1
    }

    fn write(&self, out: &mut Vec<u8>) {
        for part in self.parts() {
            out.extend_from_slice(part.as_bytes());
        }
        out.push(b'}');
    }
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

impl<T: Splice> ListBody<T> {
    fn new(head: String, items: Vec<T>, tail: String) -> ListBody<T> {
        let commas = items.len().saturating_sub(1);
        let length = head.len() + items.iter().map(Splice::len).sum::<usize>() + commas + tail.len();
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
                    item.write(&mut chunk);
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

impl<T: Splice + Unpin> http_body::Body for ListBody<T> {
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
    use super::super::resource_version::ListRevision;
    use super::super::{ApiState, RESOURCES, routes};
    use super::*;
    use crate::kubelet_client::KubeletClient;
    use axum::http::Request;
    use gitplane_storage::sqlite::SqliteStore;
    use gitplane_store::{ObjectKey, Op};
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

    /// Objects of several kinds, in shapes that move a row's cells: restarts and their time,
    /// init containers, deletion, running and finished Jobs, Event series, cluster-scoped ones,
    /// text that needs escaping and numbers a second serializer could write differently.
    fn varied_objects() -> Vec<Value> {
        let pod = |namespace: &str, name: &str, status: Value| {
            json!({"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": name, "namespace": namespace, "creationTimestamp": "2026-01-01T00:00:00Z",
                                "labels": {"app": "web"}},
                   "spec": {"nodeName": "n1", "containers": [{"name": "a", "image": "httpd"}, {"name": "b"}]},
                   "status": status})
        };
        let mut objects: Vec<Value> = (0..25)
            .map(|i| {
                let phase = if i % 4 == 0 { "Pending" } else { "Running" };
                pod(["a", "b"][i % 2], &format!("p{i:02}"), json!({"phase": phase, "podIP": format!("10.244.0.{i}")}))
            })
            .collect();
        objects.push(pod(
            "a",
            "restarts",
            json!({"phase": "Running", "containerStatuses": [
                {"name": "a", "ready": true, "restartCount": 3, "state": {"running": {}},
                 "lastState": {"terminated": {"exitCode": 1, "finishedAt": "2026-01-01T00:55:00.5Z"}}},
                {"name": "b", "restartCount": 1, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                 "lastState": {"terminated": {"exitCode": 2, "finishedAt": "2026-01-01T00:58:00Z"}}}]}),
        ));
        let mut init = pod(
            "a",
            "init",
            json!({"phase": "Pending", "initContainerStatuses": [
                {"name": "i", "restartCount": 0, "state": {"waiting": {"reason": "ErrImagePull"}}}]}),
        );
        init["spec"]["initContainers"] = json!([{"name": "i"}]);
        objects.push(init);
        let mut deleting = pod(
            "b",
            "deleting",
            json!({"phase": "Running", "podIPs": [{"ip": "10.244.1.9"}], "nominatedNodeName": "n2",
                   "conditions": [{"type": "example.com/lb", "status": "True"}]}),
        );
        deleting["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:59:00Z");
        deleting["spec"]["readinessGates"] = json!([{"conditionType": "example.com/lb"}]);
        objects.push(deleting);
        let mut odd = pod("b", "odd", json!({}));
        odd["metadata"].as_object_mut().unwrap().remove("creationTimestamp");
        odd["metadata"]["annotations"] = json!({"note": "é \"q\" \n\t</script> \u{1f600} \u{7f}", "ratio": "0.1"});
        odd["spec"]["priority"] = json!(12345678901234567_i64);
        odd["spec"]["overhead"] = json!({"x": 0.1, "y": -2.5e-8});
        objects.push(odd);
        let job = |name: &str, status: Value| {
            json!({"apiVersion": "batch/v1", "kind": "Job",
                   "metadata": {"name": name, "namespace": "a", "creationTimestamp": "2025-12-31T22:00:00Z"},
                   "spec": {"completions": 2, "selector": {"matchLabels": {"job": name}},
                            "template": {"spec": {"containers": [{"name": "m", "image": "busybox"}]}}},
                   "status": status})
        };
        objects.push(job("running", json!({"startTime": "2026-01-01T00:58:00Z", "succeeded": 1})));
        objects.push(job(
            "done",
            json!({"startTime": "2026-01-01T00:50:00Z", "completionTime": "2026-01-01T00:50:42Z", "succeeded": 2,
                   "conditions": [{"type": "Complete", "status": "True"}]}),
        ));
        objects.push(job("unstarted", json!({})));
        let event = |name: &str, extra: Value| {
            let mut event = json!({"apiVersion": "v1", "kind": "Event",
                "metadata": {"name": name, "namespace": "a", "creationTimestamp": "2026-01-01T00:40:00Z"},
                "involvedObject": {"kind": "Pod", "name": "p01", "fieldPath": "spec.containers{a}"},
                "type": "Warning", "reason": "BackOff", "message": "Back-off restarting", "source": {"component": "kubelet", "host": "n1"}});
            event.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            event
        };
        objects.push(event(
            "plain",
            json!({"firstTimestamp": "2026-01-01T00:41:00Z", "lastTimestamp": "2026-01-01T00:59:30Z", "count": 12}),
        ));
        objects.push(event(
            "series",
            json!({"eventTime": "2026-01-01T00:42:00Z", "series": {"count": 5, "lastObservedTime": "2026-01-01T00:59:59Z"}}),
        ));
        objects.push(event("timeless", json!({})));
        objects.push(json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "a", "creationTimestamp": "2025-12-01T00:00:00Z"},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                     "template": {"spec": {"containers": [{"name": "web", "image": "httpd:1"}]}}},
            "status": {"readyReplicas": 2, "updatedReplicas": 3, "availableReplicas": 2}}));
        objects.push(json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "namespace": "a", "creationTimestamp": "2026-01-01T00:30:00Z"},
            "spec": {"type": "NodePort", "clusterIP": "10.96.0.7", "selector": {"app": "web"},
                     "ports": [{"port": 80, "nodePort": 30080}]}}));
        objects.push(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "namespace": "b", "creationTimestamp": "2026-01-01T00:00:01Z"},
            "data": {"a": "1", "b": "2"}}));
        objects.push(json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "n1", "creationTimestamp": "2025-06-01T00:00:00Z", "labels": {"node-role.kubernetes.io/control-plane": ""}},
            "status": {"conditions": [{"type": "Ready", "status": "True"}],
                       "nodeInfo": {"kubeletVersion": "v1.33.0"}}}));
        objects
    }

    /// A Table answer from the list cache is, byte for byte, the Table the store path renders
    /// from the parsed objects at the same `now`: every kind, every `includeObject`, pages and
    /// their continue tokens, field selectors, objects from the fill and from the watch.
    #[tokio::test]
    async fn cached_tables_are_byte_for_byte_the_rendered_ones() {
        let store = Arc::new(SqliteStore::memory().await.unwrap());
        store.txn(varied_objects().into_iter().map(Op::Create).collect()).await.unwrap();
        let state = ApiState::new(store.clone(), "repo".into(), KubeletClient::for_tests());
        let kinds = ["Pod", "Job", "Event", "Deployment", "Service", "ConfigMap", "Node"];
        let resource = |kind: &str| RESOURCES.iter().find(|r| r.kind == kind).unwrap();
        let revision = store.revision().await.unwrap();
        for kind in kinds {
            state.cacher.wait_for(&resource(kind).group_kind(), revision).await;
        }
        // Changes the cache learns from the watch: an update that moves a restart's time, a
        // create, a delete.
        let mut objects = varied_objects();
        let restarts = objects.iter_mut().find(|o| o["metadata"]["name"] == "restarts").unwrap();
        restarts["status"]["containerStatuses"][0]["restartCount"] = json!(4);
        restarts["status"]["containerStatuses"][0]["lastState"]["terminated"]["finishedAt"] =
            json!("2026-01-01T00:59:10Z");
        let mut created = restarts.clone();
        created["metadata"]["name"] = json!("restarts-2");
        store.txn(vec![Op::Update(restarts.clone()), Op::Create(created)]).await.unwrap();
        store.txn(vec![Op::Delete { key: ObjectKey::new("Pod", "a", "p02"), revision: None }]).await.unwrap();
        let mut job = objects.iter().find(|o| o["metadata"]["name"] == "running").unwrap().clone();
        job["metadata"]["name"] = json!("running-2");
        store.txn(vec![Op::Create(job)]).await.unwrap();

        let nows: [Timestamp; 2] =
            ["2026-01-01T01:00:00Z".parse().unwrap(), "2026-06-01T00:00:00.25Z".parse().unwrap()];
        let includes = [table::IncludeObject::None, table::IncludeObject::Metadata, table::IncludeObject::Object];
        let options = |namespace: Option<&str>, limit: Option<usize>| ListOptions {
            namespace: namespace.map(str::to_owned),
            limit,
            ..Default::default()
        };
        let mut cases = vec![];
        for kind in kinds {
            cases.push((kind, options(None, None), ""));
            cases.push((kind, options(None, Some(4)), ""));
        }
        cases.push(("Pod", options(Some("a"), Some(7)), ""));
        cases.push(("Pod", options(None, Some(5)), "status.phase!=Pending"));
        cases.push(("Pod", ListOptions { label_selector: Some("app=web".into()), ..options(Some("b"), None) }, ""));
        let mut pages = 0;
        for (kind, options, fields) in cases {
            let resource = resource(kind);
            let fields = FieldSelector::parse(fields).unwrap();
            for include in includes {
                for now in nows {
                    let mut options = options.clone();
                    loop {
                        let cached = state
                            .cacher
                            .list(&resource.group_kind(), &options, ListRevision::MostRecent)
                            .await
                            .expect("served from the cache");
                        let response = from_cache(resource, cached, &fields, Some(include), now);
                        let length = http_body::Body::size_hint(response.body()).exact().unwrap();
                        let got = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
                        assert_eq!(length, got.len() as u64, "Content-Length");

                        // The store path: the parsed page, filtered, masked and rendered.
                        let list = store.list(&resource.group_kind(), &options).await.unwrap();
                        let items: Vec<Value> =
                            list.items.into_iter().filter(|o| fields.matches(o)).map(masked).collect();
                        let mut t = table::table(kind, &items, &list.revision.to_string(), now, include);
                        if let Some(token) = &list.continue_token {
                            t["metadata"]["continue"] = Value::String(token.clone());
                        }
                        assert_eq!(
                            String::from_utf8(got.to_vec()).unwrap(),
                            t.to_string(),
                            "{kind} {options:?} {include:?} at {now}"
                        );
                        pages += 1;
                        match list.continue_token {
                            Some(token) => options.continue_token = Some(token),
                            None => break,
                        }
                    }
                }
            }
        }
        assert!(pages > 100, "{pages} pages compared");

        // Secrets never come from the cache, so their Tables keep being masked, whole objects
        // included.
        let secret = json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": "s", "namespace": "a"}, "data": {"password": "aHVudGVyMg=="}});
        store.txn(vec![Op::Create(secret)]).await.unwrap();
        let router = routes(state.clone());
        for uri in ["/api/v1/secrets?includeObject=Object", "/api/v1/secrets?includeObject=Object&resourceVersion=0"] {
            for _ in 0..2 {
                let request = Request::builder()
                    .uri(uri)
                    .header(header::ACCEPT, "application/json;as=Table;v=v1;g=meta.k8s.io,application/json")
                    .body(Body::empty())
                    .unwrap();
                let response = router.clone().oneshot(request).await.unwrap();
                let table =
                    String::from_utf8(axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap().to_vec())
                        .unwrap();
                assert!(table.contains(r#""password":"<masked>""#) && !table.contains("aHVudGVyMg=="), "{table}");
            }
        }
    }
}
