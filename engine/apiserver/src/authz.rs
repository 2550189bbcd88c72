//! Who may use the status API, checked before a handler runs (kube-apiserver's authentication
//! then authorization filters), and the audit line of every request.
//!
//! - `/healthz`, `/livez`, `/readyz` (and their sub-paths): anyone, unaudited.
//! - Everything else needs a bearer token (`authn`) with the role the request needs: `debug`
//!   for `exec`, `attach` and `portforward` subresources, `read` for the rest. No token, or
//!   one that is not in the token file: 401; a token without the role: 403 (Kubernetes'
//!   `Status` bodies, naming the user, never the token).
//! - `gitplane up` only: a request without a token from a loopback address reads as
//!   `system:anonymous` (what this machine's own users did before tokens existed).
//! - The status page (`/` and `/ui/…`, its data endpoints `/ui/api/…` included) also takes the
//!   token from the `gitplane-token` cookie its login form sets, since a browser cannot send a
//!   bearer header when it navigates; the cookie counts nowhere else, and only reads: with it,
//!   exec, attach, port-forward, any upgrade and any method but GET and HEAD are refused (403),
//!   whatever roles its token has, so a page another site or another port of this host opens
//!   cannot act with it. The form (`/ui/login`, `/ui/logout`) and the page's static assets
//!   answer everyone. A page request without credentials gets the form (401) instead of a JSON
//!   `Status`.
//! - An upgrade (exec, attach and port-forward streams, WebSocket watches) that carries an
//!   `Origin` (browsers always send one) must come from a page of this very host and port.

use crate::{
    audit::RequestInfo,
    authn::{ApiAccess, Role, User},
    listener::ClientAddr,
    page,
    rbac::Attributes,
    serviceaccount::VerifyingKeys,
};
use axum::{
    extract::{Request, State},
    http::{
        StatusCode,
        header::{AUTHORIZATION, COOKIE},
    },
    middleware::Next,
    response::Response,
};
use std::sync::Arc;

const ANONYMOUS: &str = "system:anonymous";

/// Health endpoints answer everyone, as kube-apiserver's `system:public-info-viewer` allows.
fn is_health(path: &str) -> bool {
    ["/healthz", "/livez", "/readyz"]
        .iter()
        .any(|p| path == *p || path.strip_prefix(p).is_some_and(|r| r.starts_with('/')))
}

/// The status page and its data endpoints: where the page's cookie counts.
fn is_page(path: &str) -> bool {
    path == "/" || path.starts_with("/ui/")
}

/// The page's login form and static assets, which answer everyone (they show nothing of the
/// cluster).
fn is_page_public(path: &str) -> bool {
    matches!(path, "/ui/login" | "/ui/logout") || path.starts_with("/ui/assets/")
}

/// The role a request needs.
fn required_role(info: &RequestInfo) -> Role {
    match info.subresource.as_str() {
        "exec" | "attach" | "portforward" => Role::Debug,
        _ => Role::Read,
    }
}

/// The middleware (`axum::middleware::from_fn_with_state`).
pub async fn admit(State(access): State<ApiAccess>, mut request: Request, next: Next) -> Response {
    let path = request.uri().path().to_owned();
    if is_health(&path) || is_page_public(&path) {
        return next.run(request).await;
    }
    let started = std::time::Instant::now();
    let client = request.extensions().get::<ClientAddr>().copied().unwrap_or(ClientAddr([0, 0, 0, 0].into()));
    let page = is_page(&path);
    // The page's data endpoints are the API under `/ui`: audited and authorized as the API.
    let api_path = if page { path.strip_prefix("/ui").filter(|p| p.starts_with("/api")) } else { None };
    let info = RequestInfo::new(request.method().as_str(), api_path.unwrap_or(&path), request.uri().query());
    let from_cookie = bearer(&request).is_none() && page && page_cookie(&request).is_some();
    let token = bearer(&request).or_else(|| page.then(|| page_cookie(&request)).flatten());
    if let Some(why) = cross_origin_upgrade(&request) {
        let response = crate::status(StatusCode::FORBIDDEN, "Forbidden", why);
        access.audit.record(ANONYMOUS, client.0, &info, response.status().as_u16());
        crate::metrics::request(&info, response.status().as_u16(), started.elapsed());
        return response;
    }
    let user = match token {
        Some(token) if VerifyingKeys::looks_like_jwt(token) => match &access.service_accounts {
            Some(accounts) => {
                accounts.authenticate(token).inspect_err(|why| tracing::debug!(%why, "token refused")).ok()
            }
            None => None,
        },
        Some(token) => access.tokens.authenticate(token),
        None if access.anonymous_loopback_reads && client.0.is_loopback() => {
            Some(Arc::new(User { name: ANONYMOUS.into(), roles: vec![Role::Read], ..User::default() }))
        }
        None => None,
    };
    let Some(user) = user else {
        let response = if page && api_path.is_none() {
            page::login_form(StatusCode::UNAUTHORIZED, "This page needs a token with the read role.")
        } else {
            crate::status(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized")
        };
        access.audit.record(ANONYMOUS, client.0, &info, response.status().as_u16());
        crate::metrics::request(&info, response.status().as_u16(), started.elapsed());
        return response;
    };
    let role = required_role(&info);
    let mut reason = String::new();
    let writes = !matches!(*request.method(), axum::http::Method::GET | axum::http::Method::HEAD);
    let response = if from_cookie && (role != Role::Read || writes || is_upgrade(&request)) {
        let message = format!(
            "User {:?}: the status page's cookie only reads; exec, attach, port-forward and streams need the \
             token itself (kubectl with the kubeconfig)",
            user.name
        );
        crate::status(StatusCode::FORBIDDEN, "Forbidden", message)
    } else if user.has(role) {
        // Handlers that act for a person (exec) name them.
        request.extensions_mut().insert(user.clone());
        next.run(request).await
    } else if is_service_account(&user) {
        // One decision serves the answer and the audit line.
        let allowed = rbac_reason(&access, &user, &info);
        reason = match &allowed {
            Some(why) => format!("RBAC: allowed by {why}"),
            None if writes => String::new(),
            None => "RBAC: no binding allows it".into(),
        };
        if writes || allowed.is_some() {
            // Writes answer 405 as for everyone: Git is the only writer.
            request.extensions_mut().insert(user.clone());
            next.run(request).await
        } else {
            crate::status(StatusCode::FORBIDDEN, "Forbidden", rbac_forbidden_message(&user, &info))
        }
    } else {
        crate::status(StatusCode::FORBIDDEN, "Forbidden", forbidden_message(&user, &info, role))
    };
    access.audit.record_decision(&user.name, client.0, &info, response.status().as_u16(), &reason);
    crate::metrics::request(&info, response.status().as_u16(), started.elapsed());
    response
}

/// Whether the request asks to switch protocols (WebSocket, SPDY).
fn is_upgrade(request: &Request) -> bool {
    request.headers().contains_key(axum::http::header::UPGRADE)
}

/// Why an upgrade is refused for its `Origin`: one that names another host or port than the
/// request's own (a page elsewhere opening a stream with this site's credentials).
fn cross_origin_upgrade(request: &Request) -> Option<String> {
    if !is_upgrade(request) {
        return None;
    }
    let origin = request.headers().get(axum::http::header::ORIGIN)?.to_str().unwrap_or("");
    let host = request.headers().get(axum::http::header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
    let origin_host = origin.split_once("://").map_or("", |(_, rest)| rest.trim_end_matches('/'));
    (origin_host.is_empty() || !origin_host.eq_ignore_ascii_case(host)).then(|| {
        format!("an upgrade from a page of origin {origin:?} is refused here: streams open from this site only")
    })
}

/// The token of `Authorization: Bearer <token>`, if that is what the request carries.
fn bearer(request: &Request) -> Option<&str> {
    let value = request.headers().get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// The token in the status page's cookie.
fn page_cookie(request: &Request) -> Option<&str> {
    request
        .headers()
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|pair| pair.trim().strip_prefix(page::COOKIE)?.strip_prefix('='))
        .filter(|t| !t.is_empty())
}

/// A ServiceAccount's user: RBAC decides what it may do.
fn is_service_account(user: &User) -> bool {
    user.roles.is_empty() && user.name.starts_with("system:serviceaccount:")
}

/// The binding that lets `user` make the request, if any.
fn rbac_reason(access: &ApiAccess, user: &User, info: &RequestInfo) -> Option<std::sync::Arc<str>> {
    let rbac = access.rbac.as_ref()?;
    let attributes = Attributes {
        verb: &info.verb,
        resource_request: !info.resource.is_empty(),
        api_group: &info.api_group,
        resource: &info.resource,
        subresource: &info.subresource,
        namespace: &info.namespace,
        name: &info.name,
        path: &info.path,
    };
    rbac.allows(&user.name, &user.groups, &attributes)
}

/// Kube-apiserver's RBAC refusal, word for word.
fn rbac_forbidden_message(user: &User, info: &RequestInfo) -> String {
    if info.resource.is_empty() {
        return format!("forbidden: User {:?} cannot {} path {:?}", user.name, info.verb, info.path);
    }
    let resource = if info.subresource.is_empty() {
        info.resource.clone()
    } else {
        format!("{}/{}", info.resource, info.subresource)
    };
    let object = if info.name.is_empty() { resource.clone() } else { format!("{resource} {:?}", info.name) };
    let scope = if info.namespace.is_empty() {
        " at the cluster scope".to_owned()
    } else {
        format!(" in the namespace {:?}", info.namespace)
    };
    format!(
        "{object} is forbidden: User {:?} cannot {} resource {resource:?} in API group {:?}{scope}",
        user.name, info.verb, info.api_group
    )
}

/// Kube-apiserver's wording, with the role that is missing.
fn forbidden_message(user: &User, info: &RequestInfo, role: Role) -> String {
    let what = if info.resource.is_empty() {
        format!("cannot {} path {:?}", info.verb, info.path)
    } else {
        let resource = if info.subresource.is_empty() {
            info.resource.clone()
        } else {
            format!("{}/{}", info.resource, info.subresource)
        };
        let scope =
            if info.namespace.is_empty() { String::new() } else { format!(" in the namespace {:?}", info.namespace) };
        format!("cannot {} resource {resource:?} in API group {:?}{scope}", info.verb, info.api_group)
    };
    format!("User {:?} {what}: it needs a token with the {:?} role", user.name, role.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        audit::AuditLog,
        authn::{Entry, Tokens},
    };
    use axum::{Router, body::Body, routing::get};
    use tower::ServiceExt as _;

    const READ: &str = "0123456789abcdef0123456789abcdef";
    const DEBUG: &str = "fedcba9876543210fedcba9876543210";
    const BOTH: &str = "00112233445566778899aabbccddeeff";

    fn router(anonymous_loopback_reads: bool) -> Router {
        let user = |name: &str, roles: Vec<Role>| User { name: name.into(), uid: name.into(), roles, groups: vec![] };
        let tokens = Tokens::new(&[
            Entry { token: READ.into(), user: user("alice", vec![Role::Read]), expires: None },
            Entry { token: DEBUG.into(), user: user("bob", vec![Role::Debug]), expires: None },
            Entry { token: BOTH.into(), user: user("carol", vec![Role::Read, Role::Debug]), expires: None },
        ]);
        let access = ApiAccess {
            tokens: Arc::new(tokens),
            service_accounts: None,
            rbac: None,
            anonymous_loopback_reads,
            audit: AuditLog::disabled(),
        };
        Router::new()
            .route("/healthz", get(|| async { "ok" }))
            .route("/api/{*path}", get(|| async { "objects" }))
            .route("/", get(|| async { "page" }))
            .route("/ui/api/{*path}", get(|| async { "page data" }).post(|| async { "page write" }))
            .route("/ui/login", get(|| async { "form" }))
            .layer(axum::middleware::from_fn_with_state(access, admit))
    }

    async fn code(router: &Router, path: &str, token: Option<&str>, from: [u8; 4]) -> (u16, String) {
        let mut request = Request::builder().uri(path);
        if let Some(token) = token {
            request = match token.strip_prefix("cookie:") {
                Some(cookie) => request.header("cookie", format!("theme=dark; {}={cookie}", page::COOKIE)),
                None => request.header("authorization", format!("Bearer {token}")),
            };
        }
        let mut request = request.body(Body::empty()).unwrap();
        request.extensions_mut().insert(ClientAddr(from.into()));
        let response = router.clone().oneshot(request).await.unwrap();
        let code = response.status().as_u16();
        let body = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
        (code, String::from_utf8_lossy(&body).into_owned())
    }

    #[tokio::test]
    async fn each_caller_gets_what_its_role_allows() {
        let server = router(false);
        let remote = [192, 0, 2, 9];
        let pods = "/api/v1/namespaces/default/pods";
        let cells = [
            ("/healthz", None, 200),
            // Sub-paths of health endpoints pass anonymously too (to a 404 here: no such route).
            ("/healthz/ping", None, 404),
            ("/healthzx", None, 401),
            (pods, None, 401),
            (pods, Some("wrong-token-wrong-token"), 401),
            (pods, Some(READ), 200),
            (pods, Some(DEBUG), 403),
            ("/api/v1/namespaces/default/pods/p/exec", Some(READ), 403),
            ("/api/v1/namespaces/default/pods/p/exec", Some(DEBUG), 200),
        ];
        for (path, token, expected) in cells {
            let (got, body) = code(&server, path, token, remote).await;
            assert_eq!(got, expected, "{path} with {token:?}: {body}");
            assert!(!body.contains(READ) && !body.contains(DEBUG), "{body}");
        }
        // The page's cookie counts for the page and its data endpoints, nowhere else.
        let read_cookie = format!("cookie:{READ}");
        let page_cells = [
            ("/", None, 401),
            ("/", Some(read_cookie.as_str()), 200),
            ("/ui/api/v1/namespaces/default/pods", Some(read_cookie.as_str()), 200),
            ("/ui/api/v1/namespaces/default/pods", Some("cookie:wrong-token-wrong-token"), 401),
            ("/ui/api/v1/namespaces/default/pods/p/exec", Some(read_cookie.as_str()), 403),
            (pods, Some(read_cookie.as_str()), 401),
            ("/ui/login", None, 200),
        ];
        for (path, token, expected) in page_cells {
            let (got, body) = code(&server, path, token, remote).await;
            assert_eq!(got, expected, "{path} with {token:?}: {body}");
        }
        let (_, form) = code(&server, "/", None, remote).await;
        assert!(form.contains("<form method=\"post\" action=\"/ui/login\">"), "{form}");
        let (_, body) = code(&server, pods, Some(DEBUG), remote).await;
        assert!(body.contains("\"Forbidden\"") && body.contains("User \\\"bob\\\" cannot list resource"), "{body}");
        // Anonymous loopback reads are `gitplane up`'s alone.
        assert_eq!(code(&server, pods, None, [127, 0, 0, 1]).await.0, 401);
        let appliance = router(true);
        assert_eq!(code(&appliance, pods, None, [127, 0, 0, 1]).await.0, 200);
        assert_eq!(code(&appliance, pods, None, remote).await.0, 401);
        assert_eq!(code(&appliance, pods, Some("wrong-token-wrong-token"), [127, 0, 0, 1]).await.0, 401);
    }

    /// A request to `path` with `headers`, from a remote client: its status code.
    async fn with_headers(router: &Router, method: &str, path: &str, headers: &[(&str, &str)]) -> u16 {
        let mut request = Request::builder().method(method).uri(path);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let mut request = request.body(Body::empty()).unwrap();
        request.extensions_mut().insert(ClientAddr([192, 0, 2, 9].into()));
        router.clone().oneshot(request).await.unwrap().status().as_u16()
    }

    /// The cookie only reads, whatever its token may do, and no page of another origin opens a
    /// stream.
    #[tokio::test]
    async fn the_page_cookie_only_reads_and_upgrades_come_from_this_origin() {
        let server = router(false);
        let cookie = format!("{}={BOTH}", page::COOKIE);
        let exec = "/ui/api/v1/namespaces/default/pods/p/exec";
        let pods = "/ui/api/v1/namespaces/default/pods";
        let upgrade = [("cookie", cookie.as_str()), ("upgrade", "websocket"), ("connection", "upgrade")];
        assert_eq!(with_headers(&server, "GET", pods, &[("cookie", &cookie)]).await, 200);
        assert_eq!(with_headers(&server, "GET", exec, &[("cookie", &cookie)]).await, 403, "exec with the cookie");
        assert_eq!(with_headers(&server, "POST", pods, &[("cookie", &cookie)]).await, 403, "a write with the cookie");
        assert_eq!(with_headers(&server, "GET", pods, &upgrade).await, 403, "an upgrade with the cookie");
        // The same token as a bearer may exec (kubectl), but not from a page of another origin.
        let bearer = format!("Bearer {BOTH}");
        let api_exec = "/api/v1/namespaces/default/pods/p/exec";
        assert_eq!(with_headers(&server, "GET", api_exec, &[("authorization", &bearer)]).await, 200, "routed");
        let foreign = [
            ("authorization", bearer.as_str()),
            ("upgrade", "websocket"),
            ("host", "192.0.2.1:8443"),
            ("origin", "http://192.0.2.1:9999"),
        ];
        assert_eq!(with_headers(&server, "GET", api_exec, &foreign).await, 403, "another origin");
        let same = [
            ("authorization", bearer.as_str()),
            ("upgrade", "websocket"),
            ("host", "192.0.2.1:8443"),
            ("origin", "https://192.0.2.1:8443"),
        ];
        assert_eq!(with_headers(&server, "GET", api_exec, &same).await, 200, "the same origin is routed");
    }
}
