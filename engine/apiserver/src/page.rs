//! The status page every replica serves at `/`: Applications with sync and health, their
//! errors linked to the line in the hosted repository's file view, a resource tree and a sync
//! timeline per Application, the nodes, and a Pod's logs followed live.
//!
//! Server-rendered HTML (plain Rust formatting, every outside string escaped by [`esc`]) and one
//! small script ([`ASSETS`], embedded in the binary). The script keeps the page live without
//! a reload: it follows the API's watch for what the view shows (under `/ui/api…`, where the
//! page's cookie counts, see `authz`) and, on any event, fetches the view again as an HTML
//! fragment (`?fragment=1`) and swaps it in. [`login`] is the sign-in form and its cookie;
//! [`tree`] builds an Application's resource tree. Lists are paged on the server ([`PAGE`] items,
//! continue tokens), so a page stays small with thousands of Applications and Pods.

mod allocated;
mod login;
mod nodes;
mod tree;

pub use login::{COOKIE, login_form};

use crate::table;
use axum::{
    Router,
    extract::{Path, Query, State},
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use gitplane_api::health::Health;
use gitplane_store::{
    ListOptions, ObjectKey, Store,
    informer::{Informer, SharedInformerFactory},
};
use k8s_openapi::jiff::Timestamp;
use serde_json::Value;
use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    fmt::Write as _,
    path::PathBuf,
    sync::Arc,
};

/// Items per page of a list view.
pub const PAGE: usize = 50;
/// Events read for an Application's timeline.
const EVENTS_READ: usize = 500;

const CSS: &str = include_str!("page/page.css");
const JS: &str = include_str!("page/page.js");

#[derive(Clone)]
pub(crate) struct PageState {
    store: Arc<dyn Store>,
    /// The hosted repositories, for commit authors.
    repos_dir: Arc<std::path::Path>,
    /// Who may read, and where sign-ins are audited.
    pub(crate) access: crate::authn::ApiAccess,
    /// Wrong tokens at the login form, per client.
    login_throttle: Arc<login::Throttle>,
    /// The nodes view's Pod index, started by the page's first visitor (a replica nobody looks
    /// at follows no Pods for it).
    allocated: Arc<std::sync::OnceLock<allocated::Allocated>>,
    /// The replica's shared informer, for what an Application applied (its owner index spans
    /// every accepted kind and namespace); held from the first visit to an Application.
    informers: Arc<SharedInformerFactory>,
    informer: Arc<std::sync::OnceLock<Informer>>,
}

impl PageState {
    fn allocated(&self) -> &allocated::Allocated {
        self.allocated.get_or_init(|| allocated::Allocated::spawn(self.store.clone()))
    }

    fn informer(&self) -> &Informer {
        self.informer.get_or_init(|| self.informers.informer())
    }
}

/// The page's routes; `authz::admit` guards them (but the login form and the assets).
pub fn router(
    store: Arc<dyn Store>,
    informers: Arc<SharedInformerFactory>,
    repos_dir: PathBuf,
    access: crate::authn::ApiAccess,
) -> Router {
    let state = PageState {
        store,
        repos_dir: repos_dir.into(),
        access,
        login_throttle: Default::default(),
        allocated: Default::default(),
        informers,
        informer: Default::default(),
    };
    Router::new()
        .route("/", get(applications))
        .route("/ui/applications/{namespace}/{name}", get(application))
        .route("/ui/nodes", get(nodes::nodes))
        .route("/ui/nodes/{name}", get(nodes::node))
        .route("/ui/pods/{namespace}/{name}", get(pod))
        .route("/ui/login", get(|| async { login_form(StatusCode::OK, "") }).post(login::login))
        .route("/ui/logout", axum::routing::post(login::logout))
        .route("/ui/assets/page.css", get(|| async { asset("text/css; charset=utf-8", CSS) }))
        .route("/ui/assets/page.js", get(|| async { asset("text/javascript; charset=utf-8", JS) }))
        .with_state(state)
}

/// `&`, `<`, `>`, `"` and `'` as entities: safe in text and in quoted attributes.
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A path segment or query value percent-encoded (everything but unreserved characters).
fn enc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// Headers every page answer carries: no caching, no framing, scripts only from here.
pub(crate) fn secure_headers(response: &mut Response) {
    let headers = response.headers_mut();
    let set = [
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; \
             form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
        ),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::CACHE_CONTROL, "no-store"),
    ];
    for (name, value) in set {
        headers.insert(name, HeaderValue::from_static(value));
    }
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut response = ([(header::CONTENT_TYPE, content_type)], body).into_response();
    secure_headers(&mut response);
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("max-age=300"));
    response
}

pub(crate) fn html(code: StatusCode, body: String) -> Response {
    let mut response = (code, [(header::CONTENT_TYPE, "text/html; charset=utf-8")], body).into_response();
    secure_headers(&mut response);
    response
}

/// A view: its title, its HTML, the revision it was read at and the watches that change it.
struct View {
    title: String,
    body: String,
    revision: i64,
    watches: Vec<String>,
    /// Outside the part that is swapped on updates (a log being followed).
    after: String,
}

#[derive(serde::Deserialize, Default)]
struct PageQuery {
    #[serde(default)]
    fragment: Option<String>,
    #[serde(rename = "continue", default)]
    continue_token: Option<String>,
    #[serde(default)]
    container: Option<String>,
}

/// The whole document, or with `?fragment=1` only the live part the script swaps in.
fn render(view: View, fragment: bool) -> Response {
    let live = format!(
        "<div id=\"view\" data-rv=\"{}\" data-watch=\"{}\">{}</div>",
        view.revision,
        esc(&view.watches.join(" ")),
        view.body
    );
    if fragment {
        return html(StatusCode::OK, live);
    }
    html(StatusCode::OK, document(&view.title, &format!("{live}{}", view.after)))
}

fn document(title: &str, main: &str) -> String {
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{title} · gitplane</title><link rel=\"stylesheet\" href=\"/ui/assets/page.css\">\
         <script src=\"/ui/assets/page.js\" defer></script></head><body>\
         <header><a class=\"skip\" href=\"#main\">Skip to content</a><span class=\"brand\">gitplane</span>\
         <nav aria-label=\"Main\"><a href=\"/\">Applications</a><a href=\"/ui/nodes\">Nodes</a></nav>\
         <form method=\"post\" action=\"/ui/logout\"><button type=\"submit\">Sign out</button></form></header>\
         <main id=\"main\" tabindex=\"-1\"><h1>{title}</h1>{main}</main>\
         <footer><p id=\"live\" role=\"status\">Live: updates as the cluster changes.</p></footer></body></html>\n",
        title = esc(title)
    )
}

fn failure(e: impl std::fmt::Display) -> Response {
    html(
        StatusCode::SERVICE_UNAVAILABLE,
        document("Unavailable", &format!("<p class=\"error\">{}</p>", esc(&e.to_string()))),
    )
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

/// A coloured badge that says its state in words too.
fn badge(state: &str) -> String {
    let class = match state {
        "Healthy" | "Synced" | "Running" | "Succeeded" | "Ready" | "True" | "Normal" => "ok",
        "Progressing" | "OutOfSync" | "Pending" | "Unknown" | "Terminating" => "busy",
        "" => "none",
        _ => "bad",
    };
    let text = if state.is_empty() { "—" } else { state };
    format!("<span class=\"badge {class}\">{}</span>", esc(text))
}

fn short(revision: &str) -> &str {
    revision.get(..8).unwrap_or(revision)
}

/// A hosted repository's name (`demo`), not a mirrored URL.
fn hosted(repo: &str) -> Option<&str> {
    let plain = !repo.is_empty()
        && !repo.starts_with('.')
        && repo.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    plain.then_some(repo)
}

/// An error line's file and line (`deploy.yaml:12:3: …`).
fn error_location(error: &str) -> Option<(&str, u32)> {
    let (file, rest) = error.split_once(':')?;
    let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
    Some((file, rest[..digits].parse().ok()?))
}

/// Where the file view shows `file` (relative to the Application's path) at `line`.
fn blob_link(repo: &str, revision: &str, app_path: &str, file: &str, line: u32) -> Option<String> {
    let repo = hosted(repo)?;
    if revision.is_empty() || !revision.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let base = app_path.trim_matches('/').trim_start_matches("./");
    let full = if base.is_empty() || base == "." { file.to_owned() } else { format!("{base}/{file}") };
    let path: Vec<String> = full.split('/').filter(|s| !s.is_empty() && *s != ".").map(enc).collect();
    Some(format!("/git/{}.git/blob/{revision}/{}#L{line}", enc(repo), path.join("/")))
}

/// One error, linked to its line when the repository is hosted.
fn error_item(app: &Value, error: &str) -> String {
    let revision = str_at(app, "/status/sync/attemptedRevision");
    let link = error_location(error)
        .and_then(|(file, line)| blob_link(str_at(app, "/spec/repo"), revision, str_at(app, "/spec/path"), file, line));
    match link {
        Some(href) => format!("<li><a href=\"{}\">{}</a></li>", esc(&href), esc(error)),
        None => format!("<li>{}</li>", esc(error)),
    }
}

/// A commit's subject and author, read from the hosted repository.
struct Commit {
    subject: String,
    author: String,
}

/// The commits asked for, read in one pass per repository (off the async threads).
async fn commits(
    repos_dir: Arc<std::path::Path>,
    wanted: BTreeSet<(String, String)>,
) -> HashMap<(String, String), Commit> {
    tokio::task::spawn_blocking(move || {
        let mut found = HashMap::new();
        let mut by_repo: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (repo, revision) in &wanted {
            by_repo.entry(repo).or_default().push(revision);
        }
        for (repo, revisions) in by_repo {
            let Ok(git) = git2::Repository::open_bare(repos_dir.join(format!("{repo}.git"))) else { continue };
            for revision in revisions {
                let Some(commit) = git2::Oid::from_str(revision).ok().and_then(|oid| git.find_commit(oid).ok()) else {
                    continue;
                };
                let subject = commit.summary().unwrap_or("").to_owned();
                let author = commit.author().name().unwrap_or("").to_owned();
                found.insert((repo.to_owned(), revision.to_owned()), Commit { subject, author });
            }
        }
        found
    })
    .await
    .unwrap_or_default()
}

fn app_href(app: &Value) -> String {
    format!("/ui/applications/{}/{}", enc(str_at(app, "/metadata/namespace")), enc(str_at(app, "/metadata/name")))
}

fn commit_cell(app: &Value, commits: &HashMap<(String, String), Commit>) -> String {
    let repo = str_at(app, "/spec/repo");
    let revision = str_at(app, "/status/sync/revision");
    let found = commits.get(&(repo.to_owned(), revision.to_owned()));
    let subject = found.map(|c| c.subject.as_str()).unwrap_or(str_at(app, "/status/sync/commitSubject"));
    let author = found.map(|c| c.author.as_str()).unwrap_or("");
    if revision.is_empty() {
        return "<span class=\"muted\">none applied</span>".to_owned();
    }
    let by =
        if author.is_empty() { String::new() } else { format!(" <span class=\"muted\">by {}</span>", esc(author)) };
    format!("<code>{}</code> {}{by}", esc(short(revision)), esc(subject))
}

fn wanted_commits(apps: &[Value]) -> BTreeSet<(String, String)> {
    apps.iter()
        .filter_map(|app| Some((hosted(str_at(app, "/spec/repo"))?.to_owned(), str_at(app, "/status/sync/revision"))))
        .filter(|(_, rev)| !rev.is_empty())
        .map(|(repo, rev)| (repo, rev.to_owned()))
        .collect()
}

const APPLICATIONS: &str = "Application.gitplane.io";

/// `/`: a page of Applications.
async fn applications(State(state): State<PageState>, Query(q): Query<PageQuery>) -> Response {
    state.allocated();
    let options = ListOptions { limit: Some(PAGE), continue_token: q.continue_token.clone(), ..Default::default() };
    let list = match state.store.list(APPLICATIONS, &options).await {
        Ok(list) => list,
        Err(e) => return failure(e),
    };
    let commits = commits(state.repos_dir.clone(), wanted_commits(&list.items)).await;
    let mut body = String::new();
    if list.items.is_empty() {
        body.push_str(
            "<p>No Applications yet: commit one under <code>applications/</code> of the root repository and push.</p>",
        );
    } else {
        body.push_str(
            "<table class=\"apps\"><caption>Applications</caption><thead><tr><th scope=\"col\">Application</th>\
             <th scope=\"col\">Sync</th><th scope=\"col\">Health</th><th scope=\"col\">Applied commit</th>\
             <th scope=\"col\">Errors</th></tr></thead><tbody>",
        );
        for app in &list.items {
            let errors: Vec<&str> = app
                .pointer("/status/sync/errors")
                .and_then(Value::as_array)
                .map(|e| e.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let mut error_cell = String::new();
            if !errors.is_empty() {
                error_cell.push_str("<ul class=\"errors\">");
                for error in errors.iter().take(3) {
                    error_cell.push_str(&error_item(app, error));
                }
                error_cell.push_str("</ul>");
                if errors.len() > 3 {
                    let _ = write!(error_cell, "<a href=\"{}\">{} more</a>", esc(&app_href(app)), errors.len() - 3);
                }
            } else if let Some(message) = app.pointer("/status/sync/message").and_then(Value::as_str) {
                let _ = write!(error_cell, "<span class=\"muted\">{}</span>", esc(message));
            }
            let _ = write!(
                body,
                "<tr><th scope=\"row\"><a href=\"{href}\">{name}</a><span class=\"muted\"> {ns}</span></th>\
                 <td data-label=\"Sync\">{sync}</td><td data-label=\"Health\">{health}</td>\
                 <td data-label=\"Commit\">{commit}</td><td data-label=\"Errors\">{error_cell}</td></tr>",
                href = esc(&app_href(app)),
                name = esc(str_at(app, "/metadata/name")),
                ns = esc(str_at(app, "/metadata/namespace")),
                sync = badge(str_at(app, "/status/sync/status")),
                health = badge(str_at(app, "/status/health/status")),
                commit = commit_cell(app, &commits),
            );
        }
        body.push_str("</tbody></table>");
    }
    if let Some(token) = &list.continue_token {
        let _ = write!(
            body,
            "<nav aria-label=\"Pages\"><a rel=\"next\" href=\"/?continue={}\">Next page</a></nav>",
            esc(&enc(token))
        );
    }
    let watches = vec!["/ui/apis/gitplane.io/v1/applications?watch=1".to_owned()];
    let view = View { title: "Applications".into(), body, revision: list.revision, watches, after: String::new() };
    render(view, q.fragment.is_some())
}

fn health_class(health: Health) -> &'static str {
    health.as_str()
}

fn pod_href(namespace: &str, name: &str) -> String {
    format!("/ui/pods/{}/{}", enc(namespace), enc(name))
}

/// The tree as nested lists; objects outside the Application's `target` namespace show theirs.
fn tree_html(nodes: &[tree::Node], target: &str, out: &mut String) {
    out.push_str("<ul>");
    for node in nodes {
        let shown = match node.namespace.as_str() {
            "" => node.name.clone(),
            ns if ns == target => node.name.clone(),
            ns => format!("{ns}/{}", node.name),
        };
        let name = if node.kind == "Pod" {
            format!("<a href=\"{}\">{}</a>", esc(&pod_href(&node.namespace, &node.name)), esc(&shown))
        } else {
            esc(&shown)
        };
        let message = if node.message.is_empty() {
            String::new()
        } else {
            format!(" <span class=\"muted\">{}</span>", esc(&node.message))
        };
        let _ = write!(
            out,
            "<li><span class=\"kind\">{}</span> {name} {}{message}",
            esc(&node.kind),
            badge(health_class(node.health))
        );
        if !node.children.is_empty() {
            tree_html(&node.children, target, out);
        }
        out.push_str("</li>");
    }
    out.push_str("</ul>");
}

/// How long a visit waits for the replica's informer to list everything once.
const INFORMER_SYNC: std::time::Duration = std::time::Duration::from_secs(10);

/// `/ui/applications/{namespace}/{name}`: one Application, its errors, tree and timeline.
async fn application(
    State(state): State<PageState>,
    Path((namespace, name)): Path<(String, String)>,
    Query(q): Query<PageQuery>,
) -> Response {
    let store = state.store.as_ref();
    let app = match store.get(&ObjectKey::new(APPLICATIONS, &namespace, &name)).await {
        Ok(Some(app)) => app,
        Ok(None) => {
            return html(
                StatusCode::NOT_FOUND,
                document("Not found", &format!("<p>No Application {}/{}.</p>", esc(&namespace), esc(&name))),
            );
        }
        Err(e) => return failure(e),
    };
    let owner = format!("{namespace}/{name}");
    let target = app.pointer("/spec/namespace").and_then(Value::as_str).unwrap_or("default").to_owned();
    let informer = state.informer();
    if tokio::time::timeout(INFORMER_SYNC, informer.wait_synced()).await.is_err() {
        return html(
            StatusCode::SERVICE_UNAVAILABLE,
            document("Not ready", "<p>This replica is still reading the cluster; reload in a moment.</p>"),
        );
    }
    let cache = informer.cache();
    let revision = informer.revision();
    // Everything it applied, of any kind and in any namespace (its annotation names it); the
    // ReplicaSets, Jobs, Pods and EndpointSlices under them from those namespaces.
    let mut objects = tree::Objects::default();
    let mut namespaces: BTreeSet<String> = BTreeSet::from([target.clone()]);
    for (key, object) in cache.owned_by(&owner) {
        if !key.namespace.is_empty() {
            namespaces.insert(key.namespace.clone());
        }
        let mut object = (*object).clone();
        object["kind"] = Value::String(key.kind.split('.').next().unwrap_or(&key.kind).to_owned());
        objects.applied.push(object);
    }
    for ns in &namespaces {
        for (kind, into) in [
            ("ReplicaSet.apps", &mut objects.replica_sets),
            ("Job.batch", &mut objects.jobs),
            ("Pod", &mut objects.pods),
            ("EndpointSlice.discovery.k8s.io", &mut objects.endpoint_slices),
        ] {
            into.extend(cache.list(kind, Some(ns)).into_iter().map(|o| (*o).clone()));
        }
    }
    let events = store
        .list(
            "Event",
            &ListOptions { namespace: Some(namespace.clone()), limit: Some(EVENTS_READ), ..Default::default() },
        )
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    let mut wanted = wanted_commits(std::slice::from_ref(&app));
    let attempted = str_at(&app, "/status/sync/attemptedRevision").to_owned();
    if let Some(repo) = hosted(str_at(&app, "/spec/repo")) {
        if !attempted.is_empty() {
            wanted.insert((repo.to_owned(), attempted.clone()));
        }
        for h in app.pointer("/status/history").and_then(Value::as_array).into_iter().flatten() {
            wanted.insert((repo.to_owned(), h["revision"].as_str().unwrap_or("").to_owned()));
        }
    }
    let commits = commits(state.repos_dir.clone(), wanted).await;
    let repo = str_at(&app, "/spec/repo").to_owned();
    let author_of = |rev: &str| {
        commits
            .get(&(repo.clone(), rev.to_owned()))
            .map(|c| format!(" <span class=\"muted\">by {}</span>", esc(&c.author)))
            .unwrap_or_default()
    };

    let mut body = String::new();
    let _ = write!(
        body,
        "<section aria-labelledby=\"summary\"><h2 id=\"summary\">Summary</h2><dl class=\"facts\">\
         <dt>Sync</dt><dd>{sync}</dd><dt>Health</dt><dd>{health} <span class=\"muted\">{hmsg}</span></dd>\
         <dt>Source</dt><dd><code>{repo}</code> branch <code>{branch}</code> path <code>{path}</code></dd>\
         <dt>Applied commit</dt><dd>{commit}</dd></dl>",
        sync = badge(str_at(&app, "/status/sync/status")),
        health = badge(str_at(&app, "/status/health/status")),
        hmsg = esc(str_at(&app, "/status/health/message")),
        repo = esc(&repo),
        branch = esc(str_at(&app, "/spec/branch")),
        path = esc(match str_at(&app, "/spec/path") {
            "" => "/",
            p => p,
        }),
        commit = commit_cell(&app, &commits),
    );
    if let Some(message) = app.pointer("/status/sync/message").and_then(Value::as_str) {
        let _ = write!(body, "<p class=\"muted\">{}</p>", esc(message));
    }
    body.push_str("</section>");
    let errors: Vec<&str> = app
        .pointer("/status/sync/errors")
        .and_then(Value::as_array)
        .map(|e| e.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if !errors.is_empty() {
        let subject = commits.get(&(repo.clone(), attempted.clone())).map(|c| c.subject.as_str()).unwrap_or("");
        let _ = write!(
            body,
            "<section aria-labelledby=\"errors\"><h2 id=\"errors\">Errors in <code>{}</code> {}{}</h2><ul class=\"errors\">",
            esc(short(&attempted)),
            esc(subject),
            author_of(&attempted)
        );
        for error in &errors {
            body.push_str(&error_item(&app, error));
        }
        body.push_str("</ul></section>");
    }
    body.push_str("<section aria-labelledby=\"tree\"><h2 id=\"tree\">Resources</h2>");
    let roots = tree::build(&objects);
    if roots.is_empty() {
        body.push_str("<p class=\"muted\">No objects applied.</p>");
    } else {
        body.push_str("<div class=\"tree\" role=\"region\" aria-label=\"Resource tree\">");
        tree_html(&roots, &target, &mut body);
        body.push_str("</div>");
    }
    body.push_str("</section>");
    timeline(&app, &events, &name, &author_of, &mut body);
    let mut watches = vec![format!(
        "/ui/apis/gitplane.io/v1/namespaces/{}/applications?watch=1&fieldSelector=metadata.name%3D{}",
        enc(&namespace),
        enc(&name)
    )];
    for ns in &namespaces {
        watches.push(format!("/ui/api/v1/namespaces/{}/pods?watch=1", enc(ns)));
    }
    let view = View { title: format!("Application {name}"), body, revision, watches, after: String::new() };
    render(view, q.fragment.is_some())
}

/// Commits, verdicts and durations: the latest attempt, the applied history, the Events.
fn timeline(app: &Value, events: &[Value], name: &str, author_of: &dyn Fn(&str) -> String, body: &mut String) {
    body.push_str(
        "<section aria-labelledby=\"timeline\"><h2 id=\"timeline\">Sync timeline</h2><ol class=\"timeline\">",
    );
    if let Some(sync) = app.pointer("/status/sync") {
        let revision = sync["attemptedRevision"].as_str().or(sync["revision"].as_str()).unwrap_or("");
        let duration = sync["durationMs"].as_u64().map(|ms| format!(" in {ms} ms")).unwrap_or_default();
        let changes = sync["changes"]
            .as_object()
            .map(|c| {
                format!(
                    ": {} created, {} updated, {} pruned",
                    c.get("created").and_then(Value::as_u64).unwrap_or(0),
                    c.get("updated").and_then(Value::as_u64).unwrap_or(0),
                    c.get("pruned").and_then(Value::as_u64).unwrap_or(0)
                )
            })
            .unwrap_or_default();
        let _ = write!(
            body,
            "<li><time>{}</time> latest attempt <code>{}</code>{} {}{duration}{changes}</li>",
            esc(sync["finishedAt"].as_str().or(sync["startedAt"].as_str()).unwrap_or("")),
            esc(short(revision)),
            author_of(revision),
            badge(sync["status"].as_str().unwrap_or("")),
        );
    }
    for h in app.pointer("/status/history").and_then(Value::as_array).into_iter().flatten() {
        let revision = h["revision"].as_str().unwrap_or("");
        let _ = write!(
            body,
            "<li><time>{}</time> applied <code>{}</code> {}{}</li>",
            esc(h["appliedAt"].as_str().unwrap_or("")),
            esc(short(revision)),
            esc(h["commitSubject"].as_str().unwrap_or("")),
            author_of(revision)
        );
    }
    let mut mine: Vec<&Value> = events
        .iter()
        .filter(|e| e["involvedObject"]["kind"] == "Application" && e["involvedObject"]["name"] == name)
        .collect();
    mine.sort_by(|a, b| str_at(b, "/lastTimestamp").cmp(str_at(a, "/lastTimestamp")));
    for e in mine.iter().take(20) {
        let _ = write!(
            body,
            "<li><time>{}</time> event {} <strong>{}</strong> {}</li>",
            esc(str_at(e, "/lastTimestamp")),
            badge(if str_at(e, "/type") == "Warning" { "Warning" } else { "Normal" }),
            esc(str_at(e, "/reason")),
            esc(str_at(e, "/message"))
        );
    }
    body.push_str("</ol></section>");
}

/// `/ui/pods/{namespace}/{name}`: a Pod's state and its logs, followed live.
async fn pod(
    State(state): State<PageState>,
    Path((namespace, name)): Path<(String, String)>,
    Query(q): Query<PageQuery>,
) -> Response {
    let pod = match state.store.get(&ObjectKey::new("Pod", &namespace, &name)).await {
        Ok(Some(pod)) => pod,
        Ok(None) => {
            return html(
                StatusCode::NOT_FOUND,
                document("Not found", &format!("<p>No Pod {}/{}.</p>", esc(&namespace), esc(&name))),
            );
        }
        Err(e) => return failure(e),
    };
    let revision = pod["metadata"]["resourceVersion"].as_str().and_then(|r| r.parse().ok()).unwrap_or(0);
    let containers: Vec<&str> = pod
        .pointer("/spec/containers")
        .and_then(Value::as_array)
        .map(|c| c.iter().filter_map(|c| c["name"].as_str()).collect())
        .unwrap_or_default();
    let container = q.container.clone().filter(|c| containers.contains(&c.as_str()));
    let container = container.as_deref().or(containers.first().copied()).unwrap_or("");
    let row = table::table("Pod", std::slice::from_ref(&pod), "", Timestamp::now(), table::IncludeObject::Metadata);
    let cells = row.pointer("/rows/0/cells").and_then(Value::as_array).cloned().unwrap_or_default();
    let cell = |i: usize| cells.get(i).map(|c| c.to_string().trim_matches('"').to_owned()).unwrap_or_default();
    let (health, message) = gitplane_api::health::pod(&pod);
    let mut body = String::new();
    let _ = write!(
        body,
        "<dl class=\"facts\"><dt>Namespace</dt><dd>{}</dd><dt>Health</dt><dd>{} <span class=\"muted\">{}</span></dd>\
         <dt>Phase</dt><dd>{}</dd><dt>Status</dt><dd>{}</dd><dt>Ready</dt><dd>{}</dd><dt>Restarts</dt><dd>{}</dd>\
         <dt>Node</dt><dd>{}</dd><dt>IP</dt><dd>{}</dd></dl>",
        esc(&namespace),
        badge(health.as_str()),
        esc(&message),
        badge(str_at(&pod, "/status/phase")),
        badge(&cell(2)),
        esc(&cell(1)),
        esc(&cell(3)),
        esc(str_at(&pod, "/spec/nodeName")),
        esc(str_at(&pod, "/status/podIP")),
    );
    let watches = vec![format!(
        "/ui/api/v1/namespaces/{}/pods?watch=1&fieldSelector=metadata.name%3D{}",
        enc(&namespace),
        enc(&name)
    )];
    let mut after = String::new();
    if containers.len() > 1 {
        after.push_str("<nav aria-label=\"Containers\">");
        for c in &containers {
            let _ = write!(
                after,
                "<a href=\"{}?container={}\">{}</a> ",
                esc(&pod_href(&namespace, &name)),
                esc(&enc(c)),
                esc(c)
            );
        }
        after.push_str("</nav>");
    }
    let source = format!(
        "/ui/api/v1/namespaces/{}/pods/{}/log?follow=true&tailLines=1000&container={}",
        enc(&namespace),
        enc(&name),
        enc(container)
    );
    let _ = write!(
        after,
        "<section aria-labelledby=\"logs\"><h2 id=\"logs\">Logs of {}</h2>\
         <pre id=\"log\" class=\"log\" tabindex=\"0\" data-src=\"{}\" aria-label=\"Log output\"></pre></section>",
        esc(container),
        esc(&source)
    );
    render(View { title: format!("Pod {name}"), body, revision, watches, after }, q.fragment.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outside_text_is_inert() {
        let subject = "<script>alert(1)</script>\"'&";
        assert_eq!(esc(subject), "&lt;script&gt;alert(1)&lt;/script&gt;&quot;&#39;&amp;");
        assert_eq!(enc("a b/<c>"), "a%20b%2F%3Cc%3E");
    }

    #[test]
    fn errors_link_to_their_line() {
        assert_eq!(error_location("cm.yaml:5: ConfigMap settings: bad"), Some(("cm.yaml", 5)));
        assert_eq!(error_location("web/d.yaml:12:3 (document 2): x"), Some(("web/d.yaml", 12)));
        assert_eq!(error_location("big.yaml: too large"), None);
        let rev = "0123456789abcdef0123456789abcdef01234567";
        assert_eq!(
            blob_link("demo", rev, "apps/web", "d.yaml", 7).as_deref(),
            Some("/git/demo.git/blob/0123456789abcdef0123456789abcdef01234567/apps/web/d.yaml#L7")
        );
        assert_eq!(
            blob_link("demo", rev, "", "a b.yaml", 1).unwrap(),
            format!("/git/demo.git/blob/{rev}/a%20b.yaml#L1")
        );
        assert_eq!(blob_link("https://example.com/x.git", rev, "", "d.yaml", 1), None);
        assert_eq!(blob_link("demo", "main\"><x", "", "d.yaml", 1), None);
    }
}
