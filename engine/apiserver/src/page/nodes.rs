//! `/ui/nodes`: each node's capacity, what its Pods request of it ([`Allocated`], kept from the
//! watch) and how many Pods it runs, a page of nodes at a time; `/ui/nodes/{name}`: one node and
//! its Pods, a page at a time.

use super::{
    PAGE, PageQuery, PageState, View, allocated::NodePods, badge, document, enc, esc, failure, html, pod_href, render,
    str_at,
};
use axum::{
    extract::{Path, Query, State},
    http::StatusCode,
    response::Response,
};
use gitplane_api::quantity;
use gitplane_scheduler::resources::Resources;
use gitplane_store::{ListOptions, ObjectKey};
use serde_json::Value;
use std::{fmt::Write as _, ops::Bound, time::Duration};

/// How long a view waits for the Pod index to hold every Pod change committed before the
/// request; past that it renders what the index has, at the index's revision, and the page's
/// watch brings the rest.
const CATCH_UP: Duration = Duration::from_secs(2);

fn percent(used: i128, of: i128) -> String {
    if of <= 0 { "—".to_owned() } else { format!("{}%", used * 100 / of) }
}

fn ready(node: &Value) -> &'static str {
    let ready = node
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
        .and_then(|c| c["status"].as_str());
    if ready == Some("True") { "Ready" } else { "NotReady" }
}

fn node_href(name: &str) -> String {
    format!("/ui/nodes/{}", enc(name))
}

/// A node's allocatable (its capacity when it reports none): milli-CPU, bytes.
fn allocatable(node: &Value) -> (i128, i128) {
    let of = |resource: &str, parse: fn(&str) -> Option<i128>| {
        let allocatable = str_at(node, &format!("/status/allocatable/{resource}"));
        let value =
            if allocatable.is_empty() { str_at(node, &format!("/status/capacity/{resource}")) } else { allocatable };
        parse(value).unwrap_or(0)
    };
    (of("cpu", quantity::parse_milli), of("memory", quantity::parse_units))
}

fn cpu_cell(allocated: &Resources, node: &Value) -> String {
    let (cpu, _) = allocatable(node);
    format!("{}m of {}m ({})", allocated.cpu_milli, cpu, percent(allocated.cpu_milli, cpu))
}

fn memory_cell(allocated: &Resources, node: &Value) -> String {
    let (_, memory) = allocatable(node);
    format!("{} MiB of {} MiB ({})", allocated.memory >> 20, memory >> 20, percent(allocated.memory, memory))
}

/// Waits for the index to see the store's latest commit; the revision the view is rendered at.
async fn catch_up(state: &PageState) -> Result<i64, gitplane_store::StoreError> {
    state.allocated().caught_up(state.store.as_ref(), CATCH_UP).await
}

/// `/ui/nodes`: a page of nodes with their allocation.
pub(super) async fn nodes(State(state): State<PageState>, Query(q): Query<PageQuery>) -> Response {
    let revision = match catch_up(&state).await {
        Ok(revision) => revision,
        Err(e) => return failure(e),
    };
    let options = ListOptions { limit: Some(PAGE), continue_token: q.continue_token.clone(), ..Default::default() };
    let list = match state.store.list("Node", &options).await {
        Ok(list) => list,
        Err(e) => return failure(e),
    };
    let index = state.allocated();
    let mut body = String::new();
    body.push_str(
        "<table><caption>Nodes</caption><thead><tr><th scope=\"col\">Node</th><th scope=\"col\">Ready</th>\
         <th scope=\"col\">CPU requested</th><th scope=\"col\">Memory requested</th><th scope=\"col\">Pods</th></tr></thead><tbody>",
    );
    for node in &list.items {
        let name = str_at(node, "/metadata/name");
        let (allocated, pods) =
            index.read(name, |on| on.map_or((Resources::default(), 0), |on| (on.allocated.clone(), on.pods.len())));
        let _ = write!(
            body,
            "<tr><th scope=\"row\"><a href=\"{href}\">{name}</a></th><td data-label=\"Ready\">{ready}</td>\
             <td data-label=\"CPU\">{cpu}</td><td data-label=\"Memory\">{memory}</td>\
             <td data-label=\"Pods\">{running} of {capacity}<span class=\"muted\">{listed}</span></td></tr>",
            href = esc(&node_href(name)),
            name = esc(name),
            ready = badge(ready(node)),
            cpu = cpu_cell(&allocated, node),
            memory = memory_cell(&allocated, node),
            running = allocated.pods,
            capacity = esc(str_at(node, "/status/capacity/pods")),
            listed = if pods as i128 > allocated.pods {
                format!(" ({} finished)", pods as i128 - allocated.pods)
            } else {
                String::new()
            },
        );
    }
    body.push_str("</tbody></table>");
    if let Some(token) = &list.continue_token {
        let _ = write!(
            body,
            "<nav aria-label=\"Pages\"><a rel=\"next\" href=\"/ui/nodes?continue={}\">Next page</a></nav>",
            esc(&enc(token))
        );
    }
    let waiting = index.read("", |on| on.map_or(0, |on| on.pods.len()));
    if waiting > 0 {
        let _ = write!(body, "<p>{waiting} Pod(s) wait for a node.</p>");
    }
    let watches = vec!["/ui/api/v1/nodes?watch=1".to_owned(), "/ui/api/v1/pods?watch=1".to_owned()];
    render(View { title: "Nodes".into(), body, revision, watches, after: String::new() }, q.fragment.is_some())
}

/// One Pod of a node's page: its (namespace, name) and summary.
type PodEntry<'a> = (&'a (String, String), &'a super::allocated::PodSummary);

/// The page of `pods` after the continue token (`namespace/name` of the last one shown).
fn pods_page<'a>(on: &'a NodePods, after: Option<&str>) -> (Vec<PodEntry<'a>>, bool) {
    let start = match after.and_then(|a| a.split_once('/')) {
        Some((ns, name)) => Bound::Excluded((ns.to_owned(), name.to_owned())),
        None => Bound::Unbounded,
    };
    let mut page: Vec<_> = on.pods.range((start, Bound::Unbounded)).take(PAGE + 1).collect();
    let more = page.len() > PAGE;
    page.truncate(PAGE);
    (page, more)
}

/// `/ui/nodes/{name}`: one node, its allocation and a page of its Pods.
pub(super) async fn node(
    State(state): State<PageState>,
    Path(name): Path<String>,
    Query(q): Query<PageQuery>,
) -> Response {
    let revision = match catch_up(&state).await {
        Ok(revision) => revision,
        Err(e) => return failure(e),
    };
    let node = match state.store.get(&ObjectKey::new("Node", "", &name)).await {
        Ok(Some(node)) => node,
        Ok(None) => {
            return html(StatusCode::NOT_FOUND, document("Not found", &format!("<p>No node {}.</p>", esc(&name))));
        }
        Err(e) => return failure(e),
    };
    let mut body = String::new();
    state.allocated().read(&name, |on| {
        let allocated = on.map_or(Resources::default(), |on| on.allocated.clone());
        let _ = write!(
            body,
            "<dl class=\"facts\"><dt>Ready</dt><dd>{}</dd><dt>Kubelet</dt><dd>{}</dd>\
             <dt>CPU requested</dt><dd>{}</dd><dt>Memory requested</dt><dd>{}</dd><dt>Pods</dt><dd>{} of {}</dd></dl>",
            badge(ready(&node)),
            esc(str_at(&node, "/status/nodeInfo/kubeletVersion")),
            cpu_cell(&allocated, &node),
            memory_cell(&allocated, &node),
            allocated.pods,
            esc(str_at(&node, "/status/capacity/pods")),
        );
        let _ = write!(body, "<section aria-labelledby=\"pods\"><h2 id=\"pods\">Pods on {}</h2>", esc(&name));
        let (page, more) = on.map_or((Vec::new(), false), |on| pods_page(on, q.continue_token.as_deref()));
        if page.is_empty() {
            body.push_str("<p class=\"muted\">No Pods.</p>");
        } else {
            body.push_str(
                "<table><caption>Pods</caption><thead><tr><th scope=\"col\">Pod</th><th scope=\"col\">Namespace</th>\
                 <th scope=\"col\">Phase</th><th scope=\"col\">CPU requested</th><th scope=\"col\">Memory requested</th>\
                 </tr></thead><tbody>",
            );
            for ((ns, pod), summary) in &page {
                let phase = if summary.phase.is_empty() { "Pending" } else { &summary.phase };
                let _ = write!(
                    body,
                    "<tr><th scope=\"row\"><a href=\"{}\">{}</a></th><td data-label=\"Namespace\">{}</td>\
                     <td data-label=\"Phase\">{}</td><td data-label=\"CPU\">{}m</td><td data-label=\"Memory\">{} MiB</td></tr>",
                    esc(&pod_href(ns, pod)),
                    esc(pod),
                    esc(ns),
                    badge(phase),
                    summary.requests.cpu_milli,
                    summary.requests.memory >> 20,
                );
            }
            body.push_str("</tbody></table>");
        }
        if let (true, Some(((ns, pod), _))) = (more, page.last()) {
            let _ = write!(
                body,
                "<nav aria-label=\"Pages\"><a rel=\"next\" href=\"{}?continue={}\">Next page</a></nav>",
                esc(&node_href(&name)),
                esc(&enc(&format!("{ns}/{pod}")))
            );
        }
        body.push_str("</section>");
    });
    let watches = vec![
        format!("/ui/api/v1/nodes?watch=1&fieldSelector=metadata.name%3D{}", enc(&name)),
        format!("/ui/api/v1/pods?watch=1&fieldSelector=spec.nodeName%3D{}", enc(&name)),
    ];
    render(View { title: format!("Node {name}"), body, revision, watches, after: String::new() }, q.fragment.is_some())
}
