//! Webhooks from Git hosts: a push to a mirrored repository fetches it at once, instead of at the
//! next poll.
//!
//! `POST /hooks/github`, `/hooks/gitea`, `/hooks/gitlab`, `/hooks/generic`. Rules:
//! - **Never unauthenticated.** With no secret configured every webhook is refused (401, saying how
//!   to configure one). GitHub and Gitea sign the raw body: `X-Hub-Signature-256: sha256=<hex>`
//!   (HMAC-SHA256; Gitea's own `X-Gitea-Signature: <hex>` is accepted too); GitLab sends the
//!   secret itself in `X-Gitlab-Token`; the generic endpoint takes `X-Gitplane-Signature:
//!   sha256=<hex>` (HMAC-SHA256 of the raw body). Signatures and tokens are checked in constant
//!   time and **before the body is parsed**: an unauthenticated request never reaches the JSON
//!   parser. Missing or wrong: 401.
//! - **Per-repository secrets.** A secret in [`WebhookSecrets::per_url`] authorizes webhooks for
//!   that repository only, and only it does (the default secret does not); the default secret
//!   authorizes every other repository. Because the secret is checked before the payload is read,
//!   every configured secret is tried; the payload must then name a repository the matching
//!   secret is for, else 403.
//! - **Bounded work.** A body can only be authenticated once read, so unauthenticated reads are
//!   bounded on their own: at most [`MAX_UNVERIFIED_PER_CLIENT`] per client address and
//!   [`MAX_UNVERIFIED`] in all; more get an immediate 429 with `Retry-After`. Only then, after
//!   authentication, is one of the [`MAX_IN_FLIGHT`] slots taken, so clients that trickle bodies
//!   they cannot sign never make a genuine webhook wait. A body over [`MAX_BODY`] gets 413 without being read
//!   (by its Content-Length, or as soon as a streamed body passes the limit); a body that takes
//!   longer than [`BODY_TIMEOUT`] to arrive gets 408. Fetches are coalesced by [`Mirrors`], so a
//!   flood of valid webhooks for one repository costs at most two fetches.
//! - **Replays.** Delivery ids (`X-GitHub-Delivery`, `X-Gitea-Delivery`, `X-Gitlab-Event-UUID`,
//!   `X-Gitplane-Delivery`) of authenticated requests are remembered for [`REPLAY_WINDOW`] (at most
//!   [`REPLAY_CAPACITY`] of them, in this process only); a delivery seen again gets **409
//!   Conflict** and fetches nothing. 409 rather than a silent 202 so that a replay, a Git host's
//!   manual "redeliver" included, is visible in the host's delivery log and ours. The Git hosts'
//!   signatures do not cover these headers, so this stops naive replays only; what a replay could
//!   cause, an extra fetch, is bounded by the coalescing anyway. A request without a delivery id
//!   is handled without replay protection.
//! - **Answers.** 202 for an authenticated, well-formed webhook: the named repository is fetched
//!   soon if an Application tracks it, and nothing happens otherwise (so the answer does not tell
//!   which repositories are tracked). Events that cannot move a branch (GitHub `ping`, issues, …)
//!   get 202 and are ignored. A payload that is not JSON, or names no repository, gets 400.
//!   Repository URLs match loosely: scheme, credentials, host case, a trailing `.git` or `/`
//!   do not matter, and `git@host:org/repo.git` matches `https://host/org/repo`.
//! - Secrets never appear in answers or logs; URLs are logged through [`mirror::redact`].

use crate::mirror::{self, Mirrors};
use axum::{
    Router,
    body::{Body, Bytes},
    extract::{Request, State},
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
    routing::post,
};
use futures::StreamExt as _;
use gitplane_apiserver::listener::{ClientAddr, PerClient};
use hmac::{Hmac, Mac};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};
use subtle::ConstantTimeEq;
use tokio::sync::Semaphore;

/// The largest webhook body read; GitHub caps its payloads at 25 MB, but a push event's is small.
pub const MAX_BODY: usize = 1 << 20;
/// Authenticated webhooks handled at the same time; more are refused at once.
pub const MAX_IN_FLIGHT: usize = 64;
/// Bodies read before they are authenticated, per client address and in all.
pub const MAX_UNVERIFIED_PER_CLIENT: usize = 8;
pub const MAX_UNVERIFIED: usize = 256;
/// The longest a webhook body may take to arrive.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a delivery id is remembered.
pub const REPLAY_WINDOW: Duration = Duration::from_secs(24 * 3600);
/// How many delivery ids are remembered at most (the oldest are forgotten first).
pub const REPLAY_CAPACITY: usize = 10_000;
const MAX_DELIVERY_ID: usize = 200;

const NO_SECRET: &str = "webhooks are disabled: no webhook secret is configured. Start gitplane with \
    --webhook-secret-file FILE and enter the same secret in the Git host's webhook settings";

/// The shared secrets webhooks must prove they know. Empty secrets count as none.
#[derive(Clone, Default)]
pub struct WebhookSecrets {
    /// The secret of every repository without its own.
    pub default: Option<String>,
    /// Secrets of single repositories, by URL (matched loosely, like webhook payloads).
    pub per_url: HashMap<String, String>,
}

/// Shows which secrets are set, never what they are.
impl std::fmt::Debug for WebhookSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let urls: Vec<String> = self.per_url.keys().map(|u| mirror::redact(u)).collect();
        f.debug_struct("WebhookSecrets")
            .field("default", &self.default.as_ref().map(|_| "***"))
            .field("per_url", &urls)
            .finish()
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Provider {
    GitHub,
    Gitea,
    GitLab,
    Generic,
}

impl Provider {
    fn delivery_header(self) -> &'static str {
        match self {
            Provider::GitHub => "x-github-delivery",
            Provider::Gitea => "x-gitea-delivery",
            Provider::GitLab => "x-gitlab-event-uuid",
            Provider::Generic => "x-gitplane-delivery",
        }
    }

    /// The event header and the events that can move a branch.
    fn events(self) -> Option<(&'static str, &'static [&'static str])> {
        match self {
            Provider::GitHub => Some(("x-github-event", &["push", "create", "delete"])),
            Provider::Gitea => Some(("x-gitea-event", &["push", "create", "delete"])),
            Provider::GitLab => Some(("x-gitlab-event", &["Push Hook", "Tag Push Hook", "System Hook"])),
            Provider::Generic => None,
        }
    }
}

/// Which secret a request proved it knows.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Signer {
    Default,
    /// The index in [`Secrets::per_url`].
    Url(usize),
}

struct Secrets {
    default: Option<Vec<u8>>,
    /// (normalized URL, secret)
    per_url: Vec<(String, Vec<u8>)>,
}

impl Secrets {
    fn new(secrets: WebhookSecrets) -> Secrets {
        Secrets {
            default: secrets.default.filter(|s| !s.is_empty()).map(String::into_bytes),
            per_url: secrets
                .per_url
                .into_iter()
                .filter(|(_, s)| !s.is_empty())
                .map(|(url, s)| (normalize(&url), s.into_bytes()))
                .collect(),
        }
    }

    fn is_empty(&self) -> bool {
        self.default.is_none() && self.per_url.is_empty()
    }

    fn candidates(&self) -> impl Iterator<Item = (Signer, &[u8])> {
        let default = self.default.as_deref().map(|s| (Signer::Default, s));
        default.into_iter().chain(self.per_url.iter().enumerate().map(|(i, (_, s))| (Signer::Url(i), s.as_slice())))
    }

    /// The secret a repository's webhooks must use.
    fn signer_for(&self, normalized_url: &str) -> Option<Signer> {
        match self.per_url.iter().position(|(url, _)| url == normalized_url) {
            Some(i) => Some(Signer::Url(i)),
            None => self.default.as_ref().map(|_| Signer::Default),
        }
    }
}

/// Delivery ids seen within the replay window, oldest first.
#[derive(Default)]
struct Deliveries {
    order: VecDeque<(Instant, String)>,
    seen: HashSet<String>,
}

impl Deliveries {
    /// Remembers `id`; false when it was already remembered.
    fn first_time(&mut self, id: String, now: Instant) -> bool {
        while let Some((at, old)) = self.order.front()
            && (now.duration_since(*at) > REPLAY_WINDOW || self.order.len() >= REPLAY_CAPACITY)
        {
            self.seen.remove(old);
            self.order.pop_front();
        }
        if !self.seen.insert(id.clone()) {
            return false;
        }
        self.order.push_back((now, id));
        true
    }
}

#[derive(Clone)]
struct HookState {
    mirrors: Mirrors,
    secrets: Arc<Secrets>,
    in_flight: Arc<Semaphore>,
    unverified: Arc<Semaphore>,
    unverified_per_client: PerClient,
    deliveries: Arc<Mutex<Deliveries>>,
}

/// The webhook router: `POST /hooks/{github,gitea,gitlab,generic}`.
pub fn router(mirrors: Mirrors, secrets: WebhookSecrets) -> Router {
    let secrets = Secrets::new(secrets);
    if secrets.is_empty() {
        tracing::warn!("{NO_SECRET}");
    }
    let state = HookState {
        mirrors,
        secrets: Arc::new(secrets),
        in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
        unverified: Arc::new(Semaphore::new(MAX_UNVERIFIED)),
        unverified_per_client: PerClient::new(MAX_UNVERIFIED_PER_CLIENT),
        deliveries: Arc::new(Mutex::new(Deliveries::default())),
    };
    Router::new()
        .route(
            "/hooks/github",
            post(|s: State<HookState>, c: ClientAddr, r: Request| handle(s, c, Provider::GitHub, r)),
        )
        .route("/hooks/gitea", post(|s: State<HookState>, c: ClientAddr, r: Request| handle(s, c, Provider::Gitea, r)))
        .route(
            "/hooks/gitlab",
            post(|s: State<HookState>, c: ClientAddr, r: Request| handle(s, c, Provider::GitLab, r)),
        )
        .route(
            "/hooks/generic",
            post(|s: State<HookState>, c: ClientAddr, r: Request| handle(s, c, Provider::Generic, r)),
        )
        .with_state(state)
}

fn reply(code: StatusCode, message: impl std::fmt::Display) -> Response {
    (code, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], format!("{message}\n")).into_response()
}

fn too_many() -> Response {
    let mut response = reply(StatusCode::TOO_MANY_REQUESTS, "too many webhooks at once; retry later");
    response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    response
}

async fn handle(State(state): State<HookState>, client: ClientAddr, provider: Provider, request: Request) -> Response {
    if state.secrets.is_empty() {
        return reply(StatusCode::UNAUTHORIZED, NO_SECRET);
    }
    let (parts, body) = request.into_parts();
    let proof = match proof(provider, &parts.headers) {
        Ok(proof) => proof,
        Err(why) => return reply(StatusCode::UNAUTHORIZED, why),
    };
    let declared = parts.headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY as u64) {
        return too_large();
    }
    let (Some(reading), Ok(reading_any)) =
        (state.unverified_per_client.try_take(client), state.unverified.clone().try_acquire_owned())
    else {
        return too_many();
    };
    let body = match tokio::time::timeout(BODY_TIMEOUT, read_capped(body, MAX_BODY)).await {
        Ok(Ok(Some(body))) => body,
        Ok(Ok(None)) => return too_large(),
        Ok(Err(e)) => return reply(StatusCode::BAD_REQUEST, format!("reading the body failed: {e}")),
        Err(_) => return reply(StatusCode::REQUEST_TIMEOUT, "the body took too long to arrive"),
    };
    let signer = match verify(&proof, &body, &state.secrets) {
        Ok(signer) => signer,
        Err(why) => {
            tracing::debug!(?provider, why, "webhook refused");
            return reply(StatusCode::UNAUTHORIZED, why);
        }
    };
    drop((reading, reading_any));
    let Ok(_permit) = state.in_flight.clone().try_acquire_owned() else {
        return too_many();
    };
    if let Some((name, wanted)) = provider.events() {
        let event = parts.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("");
        if !wanted.contains(&event) {
            return reply(StatusCode::ACCEPTED, format!("event {event:?} ignored: it cannot change a branch"));
        }
    }
    if let Some(id) = parts.headers.get(provider.delivery_header()) {
        let Some(id) = id.to_str().ok().filter(|id| !id.is_empty() && id.len() <= MAX_DELIVERY_ID) else {
            return reply(
                StatusCode::BAD_REQUEST,
                format!("{} is not a valid delivery id", provider.delivery_header()),
            );
        };
        let key = format!("{provider:?}/{id}");
        let first = state.deliveries.lock().unwrap_or_else(PoisonError::into_inner).first_time(key, Instant::now());
        if !first {
            tracing::info!(?provider, delivery = id, "replayed webhook refused");
            return reply(
                StatusCode::CONFLICT,
                format!("delivery {id} was already received; it is not acted on twice"),
            );
        }
    }
    let payload = match parse(&parts.headers, &body) {
        Ok(payload) => payload,
        Err(why) => return reply(StatusCode::BAD_REQUEST, why),
    };
    let urls = repository_urls(provider, &payload);
    if urls.is_empty() {
        return reply(
            StatusCode::BAD_REQUEST,
            "the payload names no repository (expected repository.clone_url, project.git_http_url, \
             or {\"repository\": \"<url>\"} for the generic endpoint)",
        );
    }
    let named: HashSet<String> = urls.iter().map(|u| normalize(u)).collect();
    let allowed: HashSet<&String> =
        named.iter().filter(|u| state.secrets.signer_for(u).is_some_and(|expected| expected == signer)).collect();
    if allowed.is_empty() {
        return reply(StatusCode::FORBIDDEN, "the webhook's secret is not the one configured for this repository");
    }
    let mut fetching = Vec::new();
    for tracked in state.mirrors.tracked() {
        if allowed.contains(&normalize(&tracked)) && state.mirrors.fetch_soon(&tracked) {
            fetching.push(mirror::redact(&tracked));
        }
    }
    if fetching.is_empty() {
        tracing::debug!(?provider, "webhook for a repository no Application tracks");
    } else {
        tracing::info!(?provider, urls = ?fetching, "webhook: fetching");
    }
    reply(StatusCode::ACCEPTED, "accepted")
}

fn too_large() -> Response {
    reply(StatusCode::PAYLOAD_TOO_LARGE, format!("the body is larger than {MAX_BODY} bytes"))
}

/// The body, or `None` as soon as it grows past `max` (the rest is never read).
async fn read_capped(body: Body, max: usize) -> Result<Option<Bytes>, axum::Error> {
    let mut stream = body.into_data_stream();
    let mut buf = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        if buf.len() + chunk.len() > max {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(Some(Bytes::from(buf)))
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// What a request offers as proof that it knows a secret.
enum Proof {
    /// GitLab: the secret itself.
    Token(String),
    /// Everyone else: the HMAC-SHA256 of the body.
    Hmac([u8; 32]),
}

/// The proof a request carries, read from its headers before its body is read.
fn proof(provider: Provider, headers: &HeaderMap) -> Result<Proof, &'static str> {
    let hmac = |value: Option<&str>, malformed: &'static str| {
        let bytes = value.and_then(|h| hex::decode(h.trim()).ok()).ok_or(malformed)?;
        <[u8; 32]>::try_from(bytes).map(Proof::Hmac).map_err(|_| malformed)
    };
    match provider {
        Provider::GitLab => {
            header_str(headers, "x-gitlab-token").map(|t| Proof::Token(t.to_owned())).ok_or("missing X-Gitlab-Token")
        }
        Provider::GitHub | Provider::Gitea => match header_str(headers, "x-hub-signature-256") {
            Some(value) => {
                hmac(value.strip_prefix("sha256="), "malformed X-Hub-Signature-256 (expected sha256=<64 hex digits>)")
            }
            None if provider == Provider::Gitea => match header_str(headers, "x-gitea-signature") {
                Some(value) => hmac(Some(value), "malformed X-Gitea-Signature (expected 64 hex digits)"),
                None => Err("missing X-Hub-Signature-256 (or X-Gitea-Signature)"),
            },
            None => Err("missing X-Hub-Signature-256"),
        },
        Provider::Generic => match header_str(headers, "x-gitplane-signature") {
            Some(value) => {
                hmac(value.strip_prefix("sha256="), "malformed X-Gitplane-Signature (expected sha256=<64 hex digits>)")
            }
            None => Err("missing X-Gitplane-Signature"),
        },
    }
}

/// Which configured secret the proof matches. Every comparison is constant-time.
fn verify(proof: &Proof, body: &[u8], secrets: &Secrets) -> Result<Signer, &'static str> {
    let matched = match proof {
        Proof::Token(token) => {
            // Comparing digests keeps the comparison constant-time whatever the lengths.
            let given = Sha256::digest(token.as_bytes());
            secrets.candidates().find(|(_, secret)| bool::from(Sha256::digest(secret).ct_eq(&given)))
        }
        Proof::Hmac(signature) => secrets.candidates().find(|(_, secret)| {
            Hmac::<Sha256>::new_from_slice(secret).is_ok_and(|mut mac| {
                mac.update(body);
                mac.verify_slice(signature).is_ok()
            })
        }),
    };
    matched.map(|(signer, _)| signer).ok_or(match proof {
        Proof::Token(_) => "the token does not match the configured secret",
        Proof::Hmac(_) => "the signature does not match the body signed with the configured secret",
    })
}

/// The JSON payload: the body, or the `payload` field of a form-encoded body (GitHub's
/// "application/x-www-form-urlencoded" content type).
fn parse(headers: &HeaderMap, body: &[u8]) -> Result<Value, String> {
    let form = header_str(headers, "content-type").is_some_and(|t| t.starts_with("application/x-www-form-urlencoded"));
    let json = if form {
        let field = body
            .split(|b| *b == b'&')
            .find_map(|pair| pair.strip_prefix(b"payload="))
            .ok_or("the form-encoded body has no payload field")?;
        let plus_as_space: Vec<u8> = field.iter().map(|b| if *b == b'+' { b' ' } else { *b }).collect();
        mirror::percent_decode(&String::from_utf8_lossy(&plus_as_space))
    } else {
        body.to_vec()
    };
    serde_json::from_slice(&json).map_err(|e| format!("the payload is not valid JSON: {e}"))
}

/// The repository URLs a payload names.
fn repository_urls(provider: Provider, payload: &Value) -> Vec<String> {
    let pointers: &[&str] = match provider {
        Provider::GitHub | Provider::Gitea => {
            &["/repository/clone_url", "/repository/html_url", "/repository/ssh_url", "/repository/url"]
        }
        Provider::GitLab => &[
            "/project/git_http_url",
            "/project/web_url",
            "/project/git_ssh_url",
            "/repository/git_http_url",
            "/repository/homepage",
            "/repository/url",
        ],
        Provider::Generic => &["/repository", "/repository/url"],
    };
    pointers.iter().filter_map(|p| payload.pointer(p)?.as_str()).filter(|u| !u.is_empty()).map(str::to_owned).collect()
}

/// A URL reduced to `host/path` for loose matching: no scheme, credentials, query, trailing
/// `/` or `.git`; the host in lower case; `user@host:path` (scp-like ssh) read as `host/path`.
fn normalize(url: &str) -> String {
    let url = url.trim();
    let (authority, path) = match url.split_once("://") {
        Some((_, rest)) => rest.split_at(rest.find('/').unwrap_or(rest.len())),
        None => match url.split_once(':') {
            Some((authority, path)) if !authority.contains('/') => (authority, path),
            _ => ("", url),
        },
    };
    let host = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    let path = path.split(['?', '#']).next().unwrap_or("").trim_end_matches('/');
    let path = path.strip_suffix(".git").unwrap_or(path).trim_matches('/');
    format!("{}/{path}", host.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mirror::tests::{Upstream, head_of, settled_fetches, wait_for};
    use axum::http::Method;
    use tower::ServiceExt as _;

    const SECRET: &str = "It's a Secret to Everybody";

    fn sign(secret: &str, body: &[u8]) -> String {
        let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
        mac.update(body);
        format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
    }

    struct Setup {
        upstream: Upstream,
        _data: tempfile::TempDir,
        mirrors: Mirrors,
        router: Router,
    }

    impl Setup {
        /// One tracked upstream, fetched once, and the secrets made for its URL.
        async fn new(secrets: impl FnOnce(&str) -> WebhookSecrets) -> Setup {
            let upstream = Upstream::new();
            upstream.commit("main", "a");
            let data = tempfile::tempdir().unwrap();
            let mirrors = Mirrors::new(data.path().to_path_buf(), Duration::from_secs(3600), true);
            mirrors.track(&upstream.url()).unwrap();
            assert_eq!(settled_fetches(&mirrors, &upstream.url()).await, 1);
            let router = router(mirrors.clone(), secrets(&upstream.url()));
            Setup { upstream, _data: data, mirrors, router }
        }

        async fn with_default_secret() -> Setup {
            Setup::new(|_| WebhookSecrets { default: Some(SECRET.into()), per_url: HashMap::new() }).await
        }

        fn url(&self) -> String {
            self.upstream.url()
        }

        async fn fetches(&self) -> u64 {
            settled_fetches(&self.mirrors, &self.url()).await
        }

        async fn call(&self, path: &str, headers: &[(&str, String)], body: impl Into<Body>) -> (StatusCode, String) {
            let mut request = Request::builder().method(Method::POST).uri(path);
            for (name, value) in headers {
                request = request.header(*name, value);
            }
            let response = self.router.clone().oneshot(request.body(body.into()).unwrap()).await.unwrap();
            let code = response.status();
            let text = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
            (code, String::from_utf8_lossy(&text).into_owned())
        }
    }

    fn github_push(url: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "ref": "refs/heads/main",
            "repository": {"clone_url": url, "html_url": url.trim_end_matches(".git")}
        }))
        .unwrap()
    }

    fn gitlab_push(url: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "object_kind": "push", "project": {"git_http_url": url, "web_url": "https://gitlab.example.com/o/r"}
        }))
        .unwrap()
    }

    /// A delivery id no other call uses.
    fn delivery() -> String {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        format!("d-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::SeqCst))
    }

    #[tokio::test]
    async fn t10_github_and_gitea_need_a_good_signature_and_a_push_fetches() {
        let s = Setup::with_default_secret().await;
        for (path, event, delivery_header) in [
            ("/hooks/github", "x-github-event", "x-github-delivery"),
            ("/hooks/gitea", "x-gitea-event", "x-gitea-delivery"),
        ] {
            let body = github_push(&s.url());
            let before = s.fetches().await;
            let event = (event, "push".to_owned());
            let missing = s.call(path, &[event.clone(), (delivery_header, delivery())], body.clone()).await;
            assert_eq!(missing.0, StatusCode::UNAUTHORIZED, "{path}: {missing:?}");
            let wrong = sign("not the secret", &body);
            let bad = s
                .call(
                    path,
                    &[event.clone(), ("x-hub-signature-256", wrong), (delivery_header, delivery())],
                    body.clone(),
                )
                .await;
            assert_eq!(bad.0, StatusCode::UNAUTHORIZED, "{path}: {bad:?}");
            assert!(!bad.1.contains(SECRET));
            let tampered = s
                .call(
                    path,
                    &[event.clone(), ("x-hub-signature-256", sign(SECRET, b"{}")), (delivery_header, delivery())],
                    body.clone(),
                )
                .await;
            assert_eq!(tampered.0, StatusCode::UNAUTHORIZED, "{path}: a signature of another body");
            assert_eq!(s.fetches().await, before, "{path}: refused webhooks fetch nothing");

            let next = s.upstream.commit("main", path);
            let good = s
                .call(path, &[event, ("x-hub-signature-256", sign(SECRET, &body)), (delivery_header, delivery())], body)
                .await;
            assert_eq!(good.0, StatusCode::ACCEPTED, "{path}: {good:?}");
            let path_of_mirror = s.mirrors.track(&s.url()).unwrap();
            assert!(wait_for(Duration::from_secs(30), || head_of(&path_of_mirror, "main") == Some(next)).await);
            assert_eq!(s.fetches().await, before + 1, "{path}");
        }
        // Gitea's own header: the bare hex HMAC.
        let body = github_push(&s.url());
        let bare = sign(SECRET, &body).trim_start_matches("sha256=").to_owned();
        let before = s.fetches().await;
        let (code, _) =
            s.call("/hooks/gitea", &[("x-gitea-event", "push".into()), ("x-gitea-signature", bare)], body).await;
        assert_eq!(code, StatusCode::ACCEPTED);
        assert_eq!(s.fetches().await, before + 1);
    }

    #[tokio::test]
    async fn t10_gitlab_needs_the_token() {
        let s = Setup::with_default_secret().await;
        let body = gitlab_push(&format!("{}/", s.url().trim_end_matches(".git")));
        let before = s.fetches().await;
        let event = ("x-gitlab-event", "Push Hook".to_owned());
        let (code, _) = s.call("/hooks/gitlab", std::slice::from_ref(&event), body.clone()).await;
        assert_eq!(code, StatusCode::UNAUTHORIZED);
        let (code, _) =
            s.call("/hooks/gitlab", &[event.clone(), ("x-gitlab-token", "wrong".into())], body.clone()).await;
        assert_eq!(code, StatusCode::UNAUTHORIZED);
        assert_eq!(s.fetches().await, before);
        let headers = [event, ("x-gitlab-token", SECRET.into()), ("x-gitlab-event-uuid", delivery())];
        let (code, text) = s.call("/hooks/gitlab", &headers, body).await;
        assert_eq!(code, StatusCode::ACCEPTED, "{text}");
        assert_eq!(s.fetches().await, before + 1, "the URL without .git and with a trailing / still matches");
    }

    #[tokio::test]
    async fn t10_generic_hook_and_form_encoded_github_payloads() {
        let s = Setup::with_default_secret().await;
        let body = serde_json::to_vec(&serde_json::json!({"repository": s.url()})).unwrap();
        let before = s.fetches().await;
        let (code, _) = s.call("/hooks/generic", &[], body.clone()).await;
        assert_eq!(code, StatusCode::UNAUTHORIZED);
        let (code, _) = s.call("/hooks/generic", &[("x-gitplane-signature", "sha256=zz".into())], body.clone()).await;
        assert_eq!(code, StatusCode::UNAUTHORIZED);
        let (code, _) = s.call("/hooks/generic", &[("x-gitplane-signature", sign("x", &body))], body.clone()).await;
        assert_eq!(code, StatusCode::UNAUTHORIZED);
        let headers = [("x-gitplane-signature", sign(SECRET, &body)), ("x-gitplane-delivery", delivery())];
        let (code, _) = s.call("/hooks/generic", &headers, body).await;
        assert_eq!(code, StatusCode::ACCEPTED);
        assert_eq!(s.fetches().await, before + 1);

        let json = String::from_utf8(github_push(&s.url())).unwrap();
        let encoded: String = json
            .bytes()
            .map(|b| if b.is_ascii_alphanumeric() { (b as char).to_string() } else { format!("%{b:02X}") })
            .collect();
        let form = format!("payload={encoded}");
        let headers = [
            ("x-github-event", "push".into()),
            ("content-type", "application/x-www-form-urlencoded".into()),
            ("x-hub-signature-256", sign(SECRET, form.as_bytes())),
        ];
        let (code, text) = s.call("/hooks/github", &headers, form).await;
        assert_eq!(code, StatusCode::ACCEPTED, "{text}");
        assert_eq!(s.fetches().await, before + 2);
    }

    #[tokio::test]
    async fn t10_oversized_malformed_replayed_unknown_and_ignored_webhooks() {
        let s = Setup::with_default_secret().await;
        let before = s.fetches().await;
        let github = |body: &[u8], id: &str| {
            vec![
                ("x-github-event", "push".to_owned()),
                ("x-hub-signature-256", sign(SECRET, body)),
                ("x-github-delivery", id.to_owned()),
            ]
        };

        // Oversized, declared or streamed: 413 before any signature check.
        let big = vec![b' '; MAX_BODY + 1];
        let (code, _) = s.call("/hooks/github", &github(&big, &delivery()), big.clone()).await;
        assert_eq!(code, StatusCode::PAYLOAD_TOO_LARGE);
        let chunks: Vec<Result<Bytes, std::io::Error>> =
            (0..20).map(|_| Ok(Bytes::from(vec![b' '; 64 << 10]))).collect();
        let streamed = Body::from_stream(futures::stream::iter(chunks));
        let (code, _) = s.call("/hooks/github", &github(b"", &delivery()), streamed).await;
        assert_eq!(code, StatusCode::PAYLOAD_TOO_LARGE);

        // Malformed but signed: 400, never a panic.
        for body in [&b"{not json"[..], b"[]", b"null", b"{\"repository\": 5}", b"\xff\xfe"] {
            let (code, text) = s.call("/hooks/github", &github(body, &delivery()), body.to_vec()).await;
            assert_eq!(code, StatusCode::BAD_REQUEST, "{body:?}: {text}");
        }
        // Malformed and unsigned: 401, the body is not even parsed.
        let (code, _) = s.call("/hooks/github", &[("x-github-event", "push".into())], &b"{not json"[..]).await;
        assert_eq!(code, StatusCode::UNAUTHORIZED);

        // A replayed delivery: 409 and no second fetch.
        let body = github_push(&s.url());
        let id = delivery();
        let (code, _) = s.call("/hooks/github", &github(&body, &id), body.clone()).await;
        assert_eq!(code, StatusCode::ACCEPTED);
        assert_eq!(s.fetches().await, before + 1);
        let (code, text) = s.call("/hooks/github", &github(&body, &id), body.clone()).await;
        assert_eq!(code, StatusCode::CONFLICT, "{text}");

        // A repository no Application tracks: 202, nothing happens.
        let other = github_push("https://git.example.com/someone/else.git");
        let (code, _) = s.call("/hooks/github", &github(&other, &delivery()), other).await;
        assert_eq!(code, StatusCode::ACCEPTED);

        // An event that cannot move a branch.
        let mut ping = github(&body, &delivery());
        ping[0].1 = "ping".into();
        let (code, text) = s.call("/hooks/github", &ping, body.clone()).await;
        assert_eq!(code, StatusCode::ACCEPTED);
        assert!(text.contains("ignored"), "{text}");

        // Sleeping proves that nothing more is fetched.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(s.fetches().await, before + 1);
    }

    #[tokio::test]
    async fn t10_without_any_secret_every_webhook_is_refused() {
        let s = Setup::new(|_| WebhookSecrets { default: Some(String::new()), per_url: HashMap::new() }).await;
        let body = github_push(&s.url());
        let headers = [("x-github-event", "push".to_owned()), ("x-hub-signature-256", sign("", &body))];
        let (code, text) = s.call("/hooks/github", &headers, body).await;
        assert_eq!(code, StatusCode::UNAUTHORIZED);
        assert!(text.contains("--webhook-secret-file"), "{text}");
        assert_eq!(s.fetches().await, 1);
    }

    #[tokio::test]
    async fn t10_a_per_repository_secret_is_the_only_one_for_its_repository() {
        let own = "only-for-this-repo";
        // Configured with another spelling of the same URL.
        let s = Setup::new(|url| WebhookSecrets {
            default: Some(SECRET.into()),
            per_url: HashMap::from([(format!("{url}/"), own.to_owned())]),
        })
        .await;
        let body = github_push(&s.url());
        let before = s.fetches().await;
        let signed = |secret: &str, body: &[u8]| {
            vec![("x-github-event", "push".to_owned()), ("x-hub-signature-256", sign(secret, body))]
        };
        let (code, _) = s.call("/hooks/github", &signed(SECRET, &body), body.clone()).await;
        assert_eq!(code, StatusCode::FORBIDDEN, "the default secret does not cover a repository with its own");
        assert_eq!(s.fetches().await, before);
        let (code, _) = s.call("/hooks/github", &signed(own, &body), body.clone()).await;
        assert_eq!(code, StatusCode::ACCEPTED);
        assert_eq!(s.fetches().await, before + 1);
        let other = github_push("https://git.example.com/o/other");
        let (code, _) = s.call("/hooks/github", &signed(own, &other), other.clone()).await;
        assert_eq!(code, StatusCode::FORBIDDEN, "a repository's secret covers no other repository");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn t10_a_burst_of_100_valid_webhooks_costs_at_most_two_fetches() {
        let s = Setup::with_default_secret().await;
        let before = s.fetches().await;
        let next = s.upstream.commit("main", "burst");
        let body = github_push(&s.url());
        let calls = (0..100).map(|_| {
            let headers = [
                ("x-github-event", "push".to_owned()),
                ("x-hub-signature-256", sign(SECRET, &body)),
                ("x-github-delivery", delivery()),
            ];
            let (s, body) = (&s, body.clone());
            async move { s.call("/hooks/github", &headers, body).await.0 }
        });
        let codes = futures::future::join_all(calls).await;
        assert!(codes.iter().all(|c| *c == StatusCode::ACCEPTED || *c == StatusCode::TOO_MANY_REQUESTS), "{codes:?}");
        let accepted = codes.iter().filter(|c| **c == StatusCode::ACCEPTED).count();
        let mirror = s.mirrors.track(&s.url()).unwrap();
        assert!(wait_for(Duration::from_secs(30), || head_of(&mirror, "main") == Some(next)).await);
        s.fetches().await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let fetches = s.fetches().await - before;
        println!("100 webhooks ({accepted} accepted): {fetches} fetch(es)");
        assert!((1..=2).contains(&fetches), "{fetches} fetches");
    }

    #[test]
    fn t10_debug_output_hides_secrets() {
        let secrets = WebhookSecrets {
            default: Some(SECRET.into()),
            per_url: HashMap::from([("https://u:pw@h/r".to_owned(), "per-url-secret".to_owned())]),
        };
        let shown = format!("{secrets:?}");
        assert!(!shown.contains(SECRET) && !shown.contains("per-url-secret") && !shown.contains("pw@"), "{shown}");
    }

    #[test]
    fn t10_urls_match_loosely() {
        let same = [
            "https://GitHub.com/org/repo.git",
            "https://github.com/org/repo",
            "https://github.com/org/repo/",
            "http://user:pw@github.com/org/repo.git",
            "git@github.com:org/repo.git",
            "ssh://git@github.com/org/repo.git",
        ];
        for url in same {
            assert_eq!(normalize(url), "github.com/org/repo", "{url}");
        }
        assert_ne!(normalize("https://github.com/org/repo2"), normalize(same[0]));
        assert_eq!(normalize("file:///srv/repos/up.git"), "/srv/repos/up");
    }

    #[test]
    fn t10_the_replay_window_is_bounded() {
        let mut d = Deliveries::default();
        let t = Instant::now();
        assert!(d.first_time("a".into(), t));
        assert!(!d.first_time("a".into(), t));
        assert!(d.first_time("a".into(), t + REPLAY_WINDOW + Duration::from_secs(1)), "forgotten after the window");
        for i in 0..REPLAY_CAPACITY + 10 {
            d.first_time(format!("x{i}"), t + REPLAY_WINDOW * 2);
        }
        assert!(d.order.len() <= REPLAY_CAPACITY && d.seen.len() == d.order.len());
    }

    /// Webhook bodies, content types and signature headers from outside: any of them ends in an
    /// answer, never a panic. Bodies are signed right, so they reach the payload parser.
    #[test]
    fn t30_fuzz_webhooks() {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let data = tempfile::tempdir().unwrap();
        let mirrors = Mirrors::new(data.path().to_path_buf(), Duration::from_secs(3600), true);
        let router = router(mirrors, WebhookSecrets { default: Some(SECRET.into()), per_url: HashMap::new() });
        let github = github_push("https://github.com/o/r.git");
        let gitlab = gitlab_push("https://gitlab.example.com/o/r.git");
        let form = [&b"payload="[..], &github].concat();
        let generic = br#"{"repository": {"url": "ssh://git@host:22/o/r"}}"#;
        let seeds: [&[u8]; 4] = [&github, &gitlab, &form, generic];
        let dictionary: &[&[u8]] = &[
            b"\"repository\"",
            b"\"clone_url\"",
            b"{",
            b"}",
            b"[",
            b"]",
            b"\"",
            b"\\u0000",
            b"%7B",
            b"%22",
            b"+",
            b"&",
            b"payload=",
            b"git@",
            b"://",
            b"..",
            b"1e400",
            b"null",
            b":",
        ];
        let target = gitplane_fuzz::Target { name: "webhooks", seeds: &seeds, dictionary, max_len: 8 << 10 };
        gitplane_fuzz::fuzz(target, |input| {
            let (choice, body) = input.split_first().map_or((0, &[][..]), |(c, b)| (*c, b));
            let path = ["/hooks/github", "/hooks/gitea", "/hooks/gitlab", "/hooks/generic"][usize::from(choice % 4)];
            let mut request = Request::builder().method(Method::POST).uri(path);
            request = match choice % 4 {
                2 => request.header("x-gitlab-token", SECRET).header("x-gitlab-event", "Push Hook"),
                3 => request.header("x-gitplane-signature", sign(SECRET, body)),
                _ => request.header("x-hub-signature-256", sign(SECRET, body)).header("x-github-event", "push"),
            };
            if choice & 4 != 0 {
                request = request.header("content-type", "application/x-www-form-urlencoded");
            }
            if choice & 8 != 0 {
                // A signature header made of the input itself.
                let header = String::from_utf8_lossy(&body[..body.len().min(80)]).into_owned();
                if let Ok(value) = HeaderValue::from_str(&header) {
                    request =
                        request.header("x-hub-signature-256", value.clone()).header("x-gitplane-signature", value);
                }
            }
            let response = runtime.block_on(router.clone().oneshot(request.body(Body::from(body.to_vec())).unwrap()));
            let code = response.unwrap().status();
            assert!(!code.is_server_error(), "{code}");
        });
    }
}
