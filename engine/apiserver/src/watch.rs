//! WATCH on the status API (`?watch=1`), as kube-apiserver serves it: a chunked stream of
//! newline-delimited `{"type": "ADDED|MODIFIED|DELETED|BOOKMARK|ERROR", "object": ...}`.
//!
//! - `resourceVersion` unset or `"0"`: the current state as synthetic ADDED events, then the
//!   changes after it ("Get State and Start at Most Recent", "Any"). A revision `N`: the changes
//!   after `N`; older than the store's compacted history, an ERROR event carrying a 410 Gone
//!   Status (reason `Expired`), which is how kube-apiserver answers a watch it has accepted.
//! - Label and field selectors filter events; an object that stops matching arrives as DELETED
//!   (its previous state at the new revision) and one that starts matching as ADDED, as kube's
//!   watch cache does. That needs the previous state of every matching object, so a watch with
//!   selectors keeps the keys and states of its matching objects (and nothing otherwise).
//! - `allowWatchBookmarks=true`: a BOOKMARK with the latest revision every [`BOOKMARK_INTERVAL`]
//!   and once more as the stream times out; never without it.
//! - `timeoutSeconds` ends the stream (at most [`MAX_TIMEOUT`]); unset, a random 30-60 min as
//!   kube's `--min-request-timeout`, so that reconnects of many clients spread out.
//!
//! Each watch follows the store's own `watch(from)`, which reads the backend's shared in-memory
//! watch cache (one ring for all watchers, no connection held per watcher). The stream is pulled
//! by hyper as the client reads: a slow client holds its place in the store's history, not a
//! growing buffer, and a client that goes away drops the stream, its store watch and its slot of
//! [`MAX_WATCHES_PER_CLIENT`].
//!
//! A body frame carries every line that is ready when it is written, up to [`FRAME_BYTES`], as
//! kube-apiserver flushes only when no event is queued: a watcher that has fallen behind catches
//! up in fewer, larger writes (HTTP/2 DATA frames or HTTP/1.1 chunks) instead of one per event.

use super::{Resource, fields::FieldSelector, masked, status, status_body};
use crate::{listener::Held, table};
use axum::{
    body::{Body, Bytes},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
};
use bytes::BytesMut;
use futures::{FutureExt as _, StreamExt};
use gitplane_store::{
    Event, EventType, ListOptions, Revision, Store, StoreError, WatchOptions, WatchStream, selector::Selector,
};
use k8s_openapi::jiff::Timestamp;
use rand::Rng;
use serde_json::{Value, json};
use std::{
    collections::{HashMap, VecDeque},
    pin::Pin,
    sync::Arc,
    time::Duration,
};
use tokio::time::{Instant, Interval, MissedTickBehavior, Sleep};

/// How often a watch that allows bookmarks gets one: kube-apiserver's watch cache sends them
/// about once a minute. More often buys a resuming client nothing it needs (a relist is avoided
/// as long as the bookmark is newer than the compaction, which keeps 10,000 revisions) and
/// costs a write to every idle watcher.
pub const BOOKMARK_INTERVAL: Duration = Duration::from_secs(60);
/// The longest a watch may ask to run; reconnecting is cheap and bounds what a stream holds.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(60 * 60);
/// Kube's `--min-request-timeout` default: unset timeouts are random in [this, 2x this].
const MIN_REQUEST_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// What one body frame gathers of the lines that are ready (a frame may pass it by one line).
const FRAME_BYTES: usize = 64 * 1024;
/// Open watches one client address may hold (a watch holds its selector state and a place in
/// the store's history; the listener allows 256 connections per client).
pub const MAX_WATCHES_PER_CLIENT: usize = 256;

/// Where a watch starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// The current state as ADDED events, then the changes (resourceVersion unset or "0").
    State,
    /// The changes after the latest revision, without the current state.
    Latest,
    /// The changes after this revision.
    After(Revision),
}

/// What a watch request asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Params {
    pub start: Start,
    pub bookmarks: bool,
    /// `sendInitialEvents=true`: end the initial ADDED events with the `initial-events-end`
    /// bookmark (client-go's streaming list).
    pub initial_events_end: bool,
    /// `None`: the randomized default.
    pub timeout: Option<Duration>,
}

/// Kubernetes' boolean query values (Go's `strconv.ParseBool`); the empty value is false.
fn boolean(params: &HashMap<String, String>, name: &str) -> Result<bool, String> {
    match params.get(name).map(String::as_str) {
        None | Some("") => Ok(false),
        Some("1" | "t" | "T" | "true" | "TRUE" | "True") => Ok(true),
        Some("0" | "f" | "F" | "false" | "FALSE" | "False") => Ok(false),
        Some(other) => Err(format!("{name}={other:?} is not a boolean: use true or false")),
    }
}

/// `?resourceVersion=`: unset (or empty) is `None`, otherwise a non-negative revision.
pub fn resource_version(params: &HashMap<String, String>) -> Result<Option<Revision>, String> {
    match params.get("resourceVersion").map(String::as_str) {
        None | Some("") => Ok(None),
        Some(rv) => match rv.parse::<Revision>() {
            Ok(r) if r >= 0 => Ok(Some(r)),
            _ => Err(format!(
                "resourceVersion {rv:?} is not a resource version: pass one from an object or a list, or leave it out"
            )),
        },
    }
}

/// The watch parameters, or `None` when the request is not a watch. Validates `timeoutSeconds`
/// and `resourceVersion` for every request.
pub fn params(params: &HashMap<String, String>) -> Result<Option<Params>, String> {
    let rv = resource_version(params)?;
    let timeout = match params.get("timeoutSeconds").map(String::as_str) {
        None | Some("") => None,
        Some(t) => match t.parse::<u64>() {
            // Zero means "the default", as in Kubernetes.
            Ok(0) => None,
            Ok(s) => Some(Duration::from_secs(s).min(MAX_TIMEOUT)),
            Err(_) => return Err(format!("timeoutSeconds {t:?} is not a non-negative number of seconds")),
        },
    };
    let bookmarks = boolean(params, "allowWatchBookmarks")?;
    let initial_events = match params.get("sendInitialEvents").map(String::as_str) {
        None | Some("") => None,
        Some(_) => Some(boolean(params, "sendInitialEvents")?),
    };
    if !boolean(params, "watch")? {
        return Ok(None);
    }
    let start = match (initial_events, rv) {
        (Some(true), _) | (None, None | Some(0)) => Start::State,
        (Some(false), None | Some(0)) => Start::Latest,
        (_, Some(rv)) => Start::After(rv),
    };
    let timeout = timeout.or_else(|| {
        let min = MIN_REQUEST_TIMEOUT.as_secs();
        Some(Duration::from_secs(rand::thread_rng().gen_range(min..=2 * min)))
    });
    Ok(Some(Params { start, bookmarks, initial_events_end: initial_events == Some(true), timeout }))
}

/// What one watch selects and how it renders.
pub struct Target {
    pub resource: &'static Resource,
    pub namespace: Option<String>,
    pub labels: Option<String>,
    pub fields: FieldSelector,
    /// `Accept: ...;as=Table`: every event's object a one-row Table, its row carrying this.
    pub table: Option<table::IncludeObject>,
}

/// Serves one watch; `held` is the client's slot, released when the stream ends or is dropped.
pub async fn serve(store: Arc<dyn Store>, held: Held, target: Target, params: Params) -> Response {
    let labels = match Selector::parse(target.labels.as_deref().unwrap_or("")) {
        Ok(s) => s,
        Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", e.to_string()),
    };
    let filter = Filter { namespace: target.namespace.clone(), labels, fields: target.fields.clone() };
    let render = Render { resource: target.resource, table: target.table };
    let timeout = params.timeout.unwrap_or(MIN_REQUEST_TIMEOUT);
    let mut watcher = Watcher {
        events: None,
        pending: VecDeque::new(),
        initial: VecDeque::new(),
        initial_end: params.initial_events_end && params.bookmarks,
        matching: (!filter.labels.is_empty() || !filter.fields.is_empty()).then(HashMap::new),
        revision: 0,
        deadline: Box::pin(tokio::time::sleep(timeout)),
        bookmarks: params.bookmarks.then(|| {
            let mut every = tokio::time::interval_at(Instant::now() + BOOKMARK_INTERVAL, BOOKMARK_INTERVAL);
            every.set_missed_tick_behavior(MissedTickBehavior::Delay);
            every
        }),
        filter,
        render,
        _held: held,
        _open: crate::metrics::WatchOpen::new(target.resource.group, target.resource.plural),
    };
    match watcher.start(store.as_ref(), &target, params.start).await {
        Ok(()) => {}
        Err(StoreError::Expired { .. }) => {
            // Accepted, then expired: a 200 stream with one ERROR event, as kube-apiserver.
            watcher.pending.push_back(watcher.render.error(StatusCode::GONE, "Expired", too_old(&params)));
            watcher.initial.clear();
            watcher.initial_end = false;
        }
        Err(e @ (StoreError::BadRequest(_) | StoreError::Rejected(_))) => {
            return status(StatusCode::BAD_REQUEST, "BadRequest", e.to_string());
        }
        Err(e) => return status(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", e.to_string()),
    }
    let stream = futures::stream::unfold(watcher, |mut w| async move {
        let first = w.next().await?;
        let frame = w.gather(first);
        Some((Ok::<_, std::convert::Infallible>(frame), w))
    });
    ([(header::CONTENT_TYPE, "application/json")], Body::from_stream(stream)).into_response()
}

fn too_old(params: &Params) -> String {
    match params.start {
        Start::After(rv) => format!("too old resource version: {rv}: list again and watch from the list's revision"),
        _ => "too old resource version: list again and watch from the list's revision".into(),
    }
}

struct Filter {
    namespace: Option<String>,
    labels: Selector,
    fields: FieldSelector,
}

impl Filter {
    fn matches(&self, object: &Value) -> bool {
        self.labels.matches(object) && self.fields.matches(object)
    }
}

struct Render {
    resource: &'static Resource,
    table: Option<table::IncludeObject>,
}

/// `{"type":"...","object":...}` and a newline, the object serialized in place (not copied into
/// a wrapper value: every watcher renders every event it gets).
fn line(event_type: &str, object: &Value) -> Bytes {
    let mut out = Vec::with_capacity(512);
    out.extend_from_slice(b"{\"type\":\"");
    out.extend_from_slice(event_type.as_bytes());
    out.extend_from_slice(b"\",\"object\":");
    // Writing a `Value` into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut out, object);
    out.extend_from_slice(b"}\n");
    out.into()
}

/// Lines of store events kept for other watchers of the same event.
const SHARED_LINES: usize = 4096;

/// Each store event's JSON line, rendered once and shared by every watcher that sends it: with
/// a thousand watches of a kind, an event costs one serialization, not a thousand. Keyed by the
/// address of the event's object, which the store shares among its watchers; an entry holds
/// the object, so the address cannot be reused while it is a key. The oldest entries go first;
/// a watcher far behind renders its own line again.
#[derive(Default)]
struct SharedLines {
    lines: HashMap<(usize, &'static str), (Arc<Value>, Bytes)>,
    order: VecDeque<(usize, &'static str)>,
}

static SHARED: std::sync::LazyLock<std::sync::Mutex<SharedLines>> = std::sync::LazyLock::new(Default::default);

fn shared_line(event_type: &'static str, object: &Arc<Value>) -> Bytes {
    // Nothing is left half-done under the lock: a panic elsewhere does not spoil it.
    let shared = || SHARED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let key = (Arc::as_ptr(object) as usize, event_type);
    if let Some((_, line)) = shared().lines.get(&key) {
        return line.clone();
    }
    // Rendered outside the lock: watchers of other events are not held up by this one.
    let rendered = line(event_type, object);
    let mut s = shared();
    if s.lines.insert(key, (object.clone(), rendered.clone())).is_none() {
        s.order.push_back(key);
    }
    while s.order.len() > SHARED_LINES {
        if let Some(oldest) = s.order.pop_front() {
            s.lines.remove(&oldest);
        }
    }
    rendered
}

impl Render {
    /// `shared`: the object is a store event's, which other watchers send too.
    fn event(&self, event_type: &'static str, object: &Arc<Value>, shared: bool) -> Bytes {
        // Secrets are masked exactly as list and get mask them; other kinds go out as stored.
        if object["kind"] == "Secret" {
            return self.render(event_type, &masked((**object).clone()));
        }
        if shared && self.table.is_none() {
            return shared_line(event_type, object);
        }
        self.render(event_type, object)
    }

    fn render(&self, event_type: &str, object: &Value) -> Bytes {
        if let Some(include) = self.table {
            // A Table's Age column is as of now: every watcher renders its own.
            let revision = object["metadata"]["resourceVersion"].as_str().unwrap_or("");
            let row =
                table::table(self.resource.kind, std::slice::from_ref(object), revision, Timestamp::now(), include);
            return line(event_type, &row);
        }
        line(event_type, object)
    }

    fn bookmark(&self, revision: Revision, initial_events_end: bool) -> Bytes {
        let mut metadata = json!({"resourceVersion": revision.to_string()});
        if initial_events_end {
            metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let object = if self.table.is_some() {
            json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": metadata, "columnDefinitions": [], "rows": []})
        } else {
            json!({"kind": self.resource.kind, "apiVersion": self.resource.api_version(), "metadata": metadata})
        };
        line("BOOKMARK", &object)
    }

    fn error(&self, code: StatusCode, reason: &str, message: String) -> Bytes {
        line("ERROR", &status_body(code, reason, message))
    }
}

struct Watcher {
    /// `None` once the stream is over.
    events: Option<WatchStream>,
    pending: VecDeque<Bytes>,
    /// The current state to send as ADDED, rendered as the client reads.
    initial: VecDeque<Arc<Value>>,
    /// Send the `initial-events-end` bookmark after `initial`.
    initial_end: bool,
    /// With selectors: the matching objects' last states by (namespace, name).
    matching: Option<HashMap<(String, String), Arc<Value>>>,
    /// Every commit up to here has been seen.
    revision: Revision,
    /// Registered with the timer once, not once per event.
    deadline: Pin<Box<Sleep>>,
    bookmarks: Option<Interval>,
    filter: Filter,
    render: Render,
    _held: Held,
    /// `apiserver_longrunning_requests`, while the watch is open.
    _open: crate::metrics::WatchOpen,
}

enum Step {
    TimedOut,
    Bookmark,
    Event(Option<gitplane_store::Result<Event>>),
}

impl Watcher {
    /// Reads the state the watch starts from and opens the store's watch after it.
    async fn start(&mut self, store: &dyn Store, target: &Target, start: Start) -> gitplane_store::Result<()> {
        let kind = target.resource.group_kind();
        let options = |at_revision| ListOptions {
            namespace: target.namespace.clone(),
            label_selector: target.labels.clone(),
            at_revision,
            ..Default::default()
        };
        let from = match start {
            Start::State => {
                let list = store.list(&kind, &options(None)).await?;
                let fields = self.filter.fields.clone();
                for object in list.items.into_iter().filter(|o| fields.matches(o)) {
                    let object = Arc::new(object);
                    self.track(&object);
                    self.initial.push_back(object);
                }
                list.revision
            }
            Start::Latest => store.revision().await?,
            Start::After(rv) => {
                if self.matching.is_some() {
                    // Which objects matched at `rv`, so that one that stops matching later is
                    // sent as DELETED. A revision ahead of the store starts from the latest.
                    let at = rv.min(store.revision().await?);
                    let list = store.list(&kind, &options(Some(at))).await?;
                    let fields = self.filter.fields.clone();
                    for object in list.items.into_iter().filter(|o| fields.matches(o)) {
                        self.track(&Arc::new(object));
                    }
                }
                rv
            }
        };
        self.revision = from;
        // The store's bookmarks only feed this watch's own, which the client may not want.
        let options =
            WatchOptions { kinds: Some(vec![kind]), bookmarks: self.bookmarks.is_some(), ..Default::default() };
        self.events = Some(store.watch(from, options).await?);
        Ok(())
    }

    /// `first` and the lines that are ready now (without waiting), up to [`FRAME_BYTES`].
    /// `next` is cancel-safe: a line not ready is left where it was.
    fn gather(&mut self, first: Bytes) -> Bytes {
        let mut frame: Option<BytesMut> = None;
        while frame.as_ref().map_or(first.len(), |f| f.len()) < FRAME_BYTES {
            let Some(Some(line)) = self.next().now_or_never() else { break };
            let frame = frame.get_or_insert_with(|| {
                let mut frame = BytesMut::with_capacity(FRAME_BYTES);
                frame.extend_from_slice(&first);
                frame
            });
            frame.extend_from_slice(&line);
        }
        frame.map_or(first, BytesMut::freeze)
    }

    fn track(&mut self, object: &Arc<Value>) {
        if let Some(matching) = &mut self.matching {
            let id = (text(object, "namespace"), text(object, "name"));
            matching.insert(id, object.clone());
        }
    }

    /// The next line for the client; `None` ends the stream.
    async fn next(&mut self) -> Option<Bytes> {
        loop {
            if let Some(line) = self.pending.pop_front() {
                return Some(line);
            }
            if let Some(object) = self.initial.pop_front() {
                if self.initial.is_empty() && self.initial_end {
                    self.initial_end = false;
                    self.pending.push_back(self.render.bookmark(self.revision, true));
                }
                return Some(self.render.event("ADDED", &object, false));
            }
            if std::mem::take(&mut self.initial_end) {
                return Some(self.render.bookmark(self.revision, true));
            }
            let events = self.events.as_mut()?;
            let bookmarks = &mut self.bookmarks;
            let step = tokio::select! {
                _ = self.deadline.as_mut() => Step::TimedOut,
                _ = async { bookmarks.as_mut()?.tick().await; Some(()) }, if bookmarks.is_some() => Step::Bookmark,
                event = events.next() => Step::Event(event),
            };
            match step {
                Step::TimedOut => {
                    self.events = None;
                    if self.bookmarks.is_some() {
                        return Some(self.render.bookmark(self.revision, false));
                    }
                    return None;
                }
                Step::Bookmark => return Some(self.render.bookmark(self.revision, false)),
                Step::Event(None) => {
                    self.events = None; // the store shut down
                    return None;
                }
                Step::Event(Some(Err(e))) => {
                    self.events = None;
                    let error = match e {
                        StoreError::Expired { requested, .. } => self.render.error(
                            StatusCode::GONE,
                            "Expired",
                            format!(
                                "too old resource version: {requested}: list again and watch from the list's revision"
                            ),
                        ),
                        e => self.render.error(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", e.to_string()),
                    };
                    return Some(error);
                }
                Step::Event(Some(Ok(event))) => {
                    self.revision = self.revision.max(event.revision);
                    if let Some((event_type, object)) = self.transition(&event) {
                        let shared = Arc::ptr_eq(&object, &event.object);
                        return Some(self.render.event(event_type, &object, shared));
                    }
                }
            }
        }
    }

    /// What the client sees of a store event, if anything.
    fn transition(&mut self, event: &Event) -> Option<(&'static str, Arc<Value>)> {
        if event.event_type == EventType::Bookmark {
            return None;
        }
        if self.filter.namespace.as_ref().is_some_and(|ns| *ns != event.key.namespace) {
            return None;
        }
        let Some(matching) = &mut self.matching else {
            return Some((event.event_type.as_str(), event.object.clone()));
        };
        let id = (event.key.namespace.clone(), event.key.name.clone());
        let now = event.event_type != EventType::Deleted && self.filter.matches(&event.object);
        match (matching.contains_key(&id), now) {
            (false, false) => None,
            (false, true) => {
                matching.insert(id, event.object.clone());
                Some(("ADDED", event.object.clone()))
            }
            (true, true) => {
                matching.insert(id, event.object.clone());
                Some(("MODIFIED", event.object.clone()))
            }
            (true, false) => {
                let previous = matching.remove(&id)?;
                if event.event_type == EventType::Deleted {
                    return Some(("DELETED", event.object.clone()));
                }
                // Stopped matching: its previous state, at the revision that changed it.
                let mut gone = (*previous).clone();
                gone["metadata"]["resourceVersion"] = Value::String(event.revision.to_string());
                Some(("DELETED", Arc::new(gone)))
            }
        }
    }
}

fn text(object: &Value, field: &str) -> String {
    object["metadata"][field].as_str().unwrap_or("").to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubelet_client::KubeletClient;
    use axum::{Router, body::BodyDataStream};
    use gitplane_storage::sqlite::SqliteStore;
    use gitplane_store::{ObjectKey, Op};
    use tower::ServiceExt;

    fn query(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn a_store_events_line_is_rendered_once_for_all_watchers() {
        let object = Arc::new(json!({"kind": "Pod", "metadata": {"name": "p", "resourceVersion": "3"}}));
        let first = shared_line("ADDED", &object);
        let again = shared_line("ADDED", &object.clone());
        assert_eq!(first, line("ADDED", &object));
        assert_eq!(first.as_ptr(), again.as_ptr(), "the second watcher reuses the first one's bytes");
        // Another type of the same object, and an equal object elsewhere, are other lines.
        assert_eq!(shared_line("DELETED", &object), line("DELETED", &object));
        let twin = Arc::new((*object).clone());
        assert_ne!(shared_line("ADDED", &twin).as_ptr(), first.as_ptr());
        // A Secret is masked, never shared as stored.
        let render = Render { resource: &super::super::RESOURCES[4], table: None };
        let secret = Arc::new(json!({"kind": "Secret", "data": {"k": "c2VjcmV0"}}));
        assert!(!String::from_utf8_lossy(&render.event("ADDED", &secret, true)).contains("c2VjcmV0"));
    }

    #[test]
    fn parses_resource_versions_and_watch_parameters() {
        assert_eq!(params(&query(&[])).unwrap(), None);
        assert_eq!(params(&query(&[("watch", "false"), ("resourceVersion", "5")])).unwrap(), None);
        let p = params(&query(&[("watch", "1")])).unwrap().unwrap();
        assert_eq!((p.start, p.bookmarks), (Start::State, false));
        let t = p.timeout.unwrap();
        assert!(t >= MIN_REQUEST_TIMEOUT && t <= 2 * MIN_REQUEST_TIMEOUT, "{t:?}");
        let p = params(&query(&[("watch", "true"), ("resourceVersion", "0")])).unwrap().unwrap();
        assert_eq!(p.start, Start::State);
        let p = params(&query(&[("watch", "true"), ("resourceVersion", "42"), ("allowWatchBookmarks", "true")]))
            .unwrap()
            .unwrap();
        assert_eq!((p.start, p.bookmarks), (Start::After(42), true));
        let p = params(&query(&[("watch", "1"), ("timeoutSeconds", "7")])).unwrap().unwrap();
        assert_eq!(p.timeout, Some(Duration::from_secs(7)));
        let p = params(&query(&[("watch", "1"), ("timeoutSeconds", "99999999")])).unwrap().unwrap();
        assert_eq!(p.timeout, Some(MAX_TIMEOUT));
        let p = params(&query(&[("watch", "1"), ("sendInitialEvents", "true"), ("resourceVersion", "9")]))
            .unwrap()
            .unwrap();
        assert!(p.initial_events_end && p.start == Start::State);
        let p = params(&query(&[("watch", "1"), ("sendInitialEvents", "false")])).unwrap().unwrap();
        assert_eq!(p.start, Start::Latest);
        assert_eq!(resource_version(&query(&[("resourceVersion", "")])).unwrap(), None);
    }

    #[test]
    fn refuses_malformed_parameters() {
        for bad in [
            [("watch", "maybe"), ("x", "")],
            [("watch", "1"), ("resourceVersion", "abc")],
            [("watch", "1"), ("resourceVersion", "-3")],
            [("watch", "1"), ("resourceVersion", "99999999999999999999999")],
            [("watch", "1"), ("timeoutSeconds", "-1")],
            [("watch", "1"), ("timeoutSeconds", "soon")],
            [("watch", "1"), ("allowWatchBookmarks", "yes")],
            [("resourceVersion", "1.5"), ("x", "")],
        ] {
            assert!(params(&query(&bad)).is_err(), "{bad:?}");
        }
    }

    /// A watch's body, read a line at a time.
    struct Lines {
        body: BodyDataStream,
        buffer: Vec<u8>,
    }

    impl Lines {
        /// The next event; `None` when the stream ends.
        async fn next(&mut self) -> Option<Value> {
            loop {
                if let Some(at) = self.buffer.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = self.buffer.drain(..=at).collect();
                    return Some(serde_json::from_slice(&line).unwrap());
                }
                let chunk = tokio::time::timeout(Duration::from_secs(10), self.body.next()).await.expect("an event");
                match chunk {
                    Some(chunk) => self.buffer.extend_from_slice(&chunk.unwrap()),
                    // A plain answer (a Status) ends without a newline.
                    None if !self.buffer.is_empty() => self.buffer.push(b'\n'),
                    None => return None,
                }
            }
        }
    }

    async fn open(router: &Router, uri: &str, accept: Option<&str>) -> (StatusCode, Lines) {
        let mut request = axum::http::Request::builder().uri(uri);
        if let Some(accept) = accept {
            request = request.header("accept", accept);
        }
        let response = router.clone().oneshot(request.body(Body::empty()).unwrap()).await.unwrap();
        (response.status(), Lines { body: response.into_body().into_data_stream(), buffer: Vec::new() })
    }

    fn pod(name: &str, phase: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "a", "labels": {"app": "web"}},
               "spec": {}, "status": {"phase": phase}})
    }

    async fn setup() -> (Arc<SqliteStore>, Router) {
        let store = Arc::new(SqliteStore::memory().await.unwrap());
        let kubelet = KubeletClient::for_tests();
        (store.clone(), super::super::router(store, "repo".into(), kubelet))
    }

    fn summary(event: &Value) -> (String, String) {
        (
            event["type"].as_str().unwrap().to_owned(),
            event["object"]["metadata"]["name"].as_str().unwrap_or("").to_owned(),
        )
    }

    #[tokio::test]
    async fn lines_that_are_ready_share_a_frame_of_at_most_frame_bytes_plus_one_line() {
        let (store, router) = setup().await;
        let pods = 400; // about 90 KiB of ADDED lines: more than one frame
        let padded = |i: usize| {
            let mut p = pod(&format!("p{i:03}"), "Pending");
            p["metadata"]["annotations"] = json!({"pad": "x".repeat(150)});
            Op::Create(p)
        };
        store.txn((0..pods).map(padded).collect()).await.unwrap();
        let request = axum::http::Request::get("/api/v1/namespaces/a/pods?watch=1").body(Body::empty()).unwrap();
        let mut body = router.oneshot(request).await.unwrap().into_body().into_data_stream();
        let (mut frames, mut names, mut buffer, mut longest) = (Vec::new(), Vec::new(), Vec::new(), 0);
        while names.len() < pods {
            let frame = tokio::time::timeout(Duration::from_secs(10), body.next()).await.unwrap().unwrap().unwrap();
            frames.push(frame.len());
            buffer.extend_from_slice(&frame);
            while let Some(at) = buffer.iter().position(|b| *b == b'\n') {
                longest = longest.max(at + 1);
                let event: Value = serde_json::from_slice(&buffer.drain(..=at).collect::<Vec<_>>()).unwrap();
                names.push(summary(&event).1);
            }
        }
        let expected: Vec<String> = (0..pods).map(|i| format!("p{i:03}")).collect();
        assert_eq!(names, expected, "every line whole, in order");
        assert!(frames.len() >= 2 && frames.len() < pods / 10, "the initial state in a few frames: {frames:?}");
        assert!(
            frames.iter().all(|f| *f < FRAME_BYTES + longest),
            "a frame passes FRAME_BYTES by one line at most: {frames:?}"
        );

        // A change after the state arrives on its own, at once.
        store.txn(vec![Op::UpdateStatus(pod("p000", "Running"))]).await.unwrap();
        let frame = tokio::time::timeout(Duration::from_secs(10), body.next()).await.unwrap().unwrap().unwrap();
        let event: Value = serde_json::from_slice(&frame).unwrap();
        assert_eq!(summary(&event), ("MODIFIED".into(), "p000".into()));
    }

    #[tokio::test]
    async fn state_then_changes_with_selectors_turning_into_added_and_deleted() {
        let (store, router) = setup().await;
        store.txn(vec![Op::Create(pod("p1", "Pending")), Op::Create(pod("p2", "Running"))]).await.unwrap();

        let (code, mut all) = open(&router, "/api/v1/namespaces/a/pods?watch=1", None).await;
        assert_eq!(code, StatusCode::OK);
        let (code, mut pending) =
            open(&router, "/api/v1/pods?watch=true&fieldSelector=status.phase%3DPending", None).await;
        assert_eq!(code, StatusCode::OK);
        let (_, mut other_ns) = open(&router, "/api/v1/namespaces/b/pods?watch=1&resourceVersion=0", None).await;
        let (_, mut one) = open(&router, "/api/v1/namespaces/a/pods/p2?watch=1", None).await;
        for expected in ["p1", "p2"] {
            assert_eq!(summary(&all.next().await.unwrap()), ("ADDED".into(), expected.into()));
        }
        assert_eq!(summary(&pending.next().await.unwrap()), ("ADDED".into(), "p1".into()));
        assert_eq!(summary(&one.next().await.unwrap()), ("ADDED".into(), "p2".into()));

        // p1 starts running: it leaves the Pending watch as DELETED; p2 enters it as ADDED.
        let committed = store.txn(vec![Op::UpdateStatus(pod("p1", "Running"))]).await.unwrap();
        store.txn(vec![Op::UpdateStatus(pod("p2", "Pending"))]).await.unwrap();
        let gone = pending.next().await.unwrap();
        assert_eq!(summary(&gone), ("DELETED".into(), "p1".into()));
        assert_eq!(gone["object"]["status"]["phase"], "Pending", "the last state that matched");
        assert_eq!(gone["object"]["metadata"]["resourceVersion"], committed.revision.to_string());
        assert_eq!(summary(&pending.next().await.unwrap()), ("ADDED".into(), "p2".into()));
        assert_eq!(summary(&all.next().await.unwrap()), ("MODIFIED".into(), "p1".into()));
        assert_eq!(summary(&one.next().await.unwrap()), ("MODIFIED".into(), "p2".into()));

        // A watch from a revision sees only what came after it, selectors applied at that revision.
        let uri = format!("/api/v1/pods?watch=1&labelSelector=app%3Dweb&resourceVersion={}", committed.revision);
        let (_, mut labelled) = open(&router, &uri, None).await;
        store.txn(vec![Op::Delete { key: ObjectKey::new("Pod", "a", "p2"), revision: None }]).await.unwrap();
        assert_eq!(summary(&labelled.next().await.unwrap()), ("MODIFIED".into(), "p2".into()));
        assert_eq!(summary(&labelled.next().await.unwrap()), ("DELETED".into(), "p2".into()));
        assert_eq!(summary(&pending.next().await.unwrap()), ("DELETED".into(), "p2".into()));

        store
            .txn(vec![Op::Create(
                json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "b1", "namespace": "b"}}),
            )])
            .await
            .unwrap();
        assert_eq!(summary(&other_ns.next().await.unwrap()), ("ADDED".into(), "b1".into()));
    }

    #[tokio::test]
    async fn secrets_are_masked_and_tables_have_one_row_per_event() {
        let (store, router) = setup().await;
        let (_, mut secrets) = open(&router, "/api/v1/secrets?watch=1", None).await;
        let table = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";
        let (_, mut rows) = open(&router, "/api/v1/namespaces/a/pods?watch=1", Some(table)).await;
        let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": "a"},
                            "data": {"password": "aHVudGVyMg=="}});
        store.txn(vec![Op::Create(secret), Op::Create(pod("p", "Pending"))]).await.unwrap();
        let event = secrets.next().await.unwrap();
        assert_eq!(event["object"]["data"]["password"], super::super::MASK);
        assert!(!event.to_string().contains("aHVudGVyMg=="));
        let event = rows.next().await.unwrap();
        assert_eq!((event["type"].as_str(), event["object"]["kind"].as_str()), (Some("ADDED"), Some("Table")));
        assert_eq!(event["object"]["rows"].as_array().unwrap().len(), 1);
        assert_eq!(event["object"]["rows"][0]["cells"][0], "p");
        assert_eq!(event["object"]["rows"][0]["object"]["metadata"]["name"], "p");
    }

    #[tokio::test]
    async fn a_compacted_revision_gets_410_gone_as_an_error_event() {
        let (store, router) = setup().await;
        for i in 0..3 {
            store.txn(vec![Op::Create(pod(&format!("p{i}"), "Pending"))]).await.unwrap();
        }
        let latest = store.revision().await.unwrap();
        store.compact(latest - 1).await.unwrap();
        let (code, mut old) = open(&router, "/api/v1/pods?watch=1&resourceVersion=1", None).await;
        assert_eq!(code, StatusCode::OK, "accepted, then expired, as kube-apiserver");
        let error = old.next().await.unwrap();
        assert_eq!(error["type"], "ERROR");
        assert_eq!(
            (error["object"]["code"].as_u64(), error["object"]["reason"].as_str()),
            (Some(410), Some("Expired"))
        );
        assert!(error["object"]["message"].as_str().unwrap().contains("too old resource version"), "{error}");
        assert!(old.next().await.is_none(), "the stream ends after the error");
        // The same with a label selector (the matching state is read at the revision).
        let (_, mut selected) = open(&router, "/api/v1/pods?watch=1&resourceVersion=1&labelSelector=app", None).await;
        assert_eq!(selected.next().await.unwrap()["object"]["code"], 410);
        let (_, mut fresh) = open(&router, &format!("/api/v1/pods?watch=1&resourceVersion={latest}"), None).await;
        store.txn(vec![Op::Create(pod("p9", "Pending"))]).await.unwrap();
        assert_eq!(summary(&fresh.next().await.unwrap()), ("ADDED".into(), "p9".into()));
    }

    #[tokio::test]
    async fn timeouts_end_the_stream_with_a_bookmark_only_when_allowed() {
        let (store, router) = setup().await;
        store.txn(vec![Op::Create(pod("p", "Pending"))]).await.unwrap();
        let revision = store.revision().await.unwrap();
        let (_, mut plain) = open(&router, "/api/v1/pods?watch=1&timeoutSeconds=1", None).await;
        assert_eq!(summary(&plain.next().await.unwrap()), ("ADDED".into(), "p".into()));
        assert!(plain.next().await.is_none(), "ends at the timeout, without a bookmark");
        let uri = "/api/v1/pods?watch=1&timeoutSeconds=1&allowWatchBookmarks=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan";
        let (_, mut marked) = open(&router, uri, None).await;
        assert_eq!(summary(&marked.next().await.unwrap()), ("ADDED".into(), "p".into()));
        let end = marked.next().await.unwrap();
        assert_eq!(end["type"], "BOOKMARK");
        assert_eq!(end["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"], "true");
        let last = marked.next().await.unwrap();
        assert_eq!((last["type"].as_str(), last["object"]["kind"].as_str()), (Some("BOOKMARK"), Some("Pod")));
        assert_eq!(last["object"]["metadata"]["resourceVersion"], revision.to_string());
        assert!(marked.next().await.is_none());
    }

    #[tokio::test]
    async fn bad_selectors_and_parameters_get_400_and_watches_per_client_are_bounded() {
        let (_, router) = setup().await;
        let bad = [
            "/api/v1/pods?watch=maybe",
            "/api/v1/pods?watch=1&resourceVersion=abc",
            "/api/v1/pods?watch=1&timeoutSeconds=-5",
            "/api/v1/pods?resourceVersion=x",
            "/api/v1/pods?fieldSelector=spec.containers%3Dx",
            "/api/v1/pods?watch=1&fieldSelector=spec.containers%3Dx",
            "/api/v1/configmaps?fieldSelector=status.phase%3DPending",
            "/api/v1/pods?fieldSelector=status.phase",
            "/api/v1/pods?watch=1&labelSelector=%3Dx",
        ];
        for uri in bad {
            let (code, mut body) = open(&router, uri, None).await;
            let status = body.next().await.unwrap();
            assert_eq!((code, status["reason"].as_str()), (StatusCode::BAD_REQUEST, Some("BadRequest")), "{uri}");
        }
        let (_, mut body) = open(&router, "/api/v1/pods?fieldSelector=spec.containers%3Dx", None).await;
        let message = body.next().await.unwrap()["message"].as_str().unwrap().to_owned();
        assert!(message.contains("spec.containers") && message.contains("status.phase"), "{message}");

        let mut open_watches = Vec::new();
        for _ in 0..MAX_WATCHES_PER_CLIENT {
            let (code, lines) = open(&router, "/api/v1/pods?watch=1", None).await;
            assert_eq!(code, StatusCode::OK);
            open_watches.push(lines);
        }
        let (code, _) = open(&router, "/api/v1/pods?watch=1", None).await;
        assert_eq!(code, StatusCode::TOO_MANY_REQUESTS);
        open_watches.pop();
        let (code, _) = open(&router, "/api/v1/pods?watch=1", None).await;
        assert_eq!(code, StatusCode::OK, "a closed watch frees its slot");
    }
}
