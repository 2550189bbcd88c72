//! Hosted repositories over Git's smart HTTP protocol, served by real git (`git http-backend`).
//!
//! `GET /git/<name>.git/info/refs?service=git-upload-pack|git-receive-pack`,
//! `POST /git/<name>.git/git-upload-pack` (clone, fetch) and
//! `POST /git/<name>.git/git-receive-pack` (push) run `git http-backend` as a CGI program: the
//! request body streams to its stdin, its headers (`Status:`, `Content-Type:`, …) become the
//! response's and its stdout streams back as the body. Nothing is buffered whole, so pushes of any
//! size up to [`MAX_PUSH_BYTES`] pass; gzip'd request bodies (git sends them) are inflated by
//! http-backend itself. A push's ref advertisement is written here without a process
//! ([`advertise`]) unless the repository's settings change what git would advertise. A push is synchronous: when `git push` returns, the branch has moved, and
//! the source controller sees it through inotify on `refs/heads`. [`blob`] is a read-only file
//! view for browsers (`GET /git/<name>.git/blob/<commit>/<path>#L<line>`), under the same rules.
//!
//! Rules this module keeps:
//! - **Names, not paths.** `<name>` is `[A-Za-z0-9._-]+`, not starting with `.`; anything else,
//!   and any name that is not an existing bare repository directory (not a symlink) directly in
//!   the repositories directory, is 404. Repositories are never created over HTTP.
//! - **Everything needs the token.** Clone, fetch and push, ref advertisements included, need the
//!   token: `Authorization: Bearer <token>`, or HTTP Basic with the token as the password and any
//!   user name (`git clone http://git:<token>@host/git/demo.git`): the repositories hold Secrets.
//!   A repository whose own config says `gitplane.anonymousRead = true` (an explicit opt-in,
//!   `git config -f repos/<name>.git/config gitplane.anonymousRead true`) can be cloned and
//!   fetched without it. Tokens are compared in constant time (as SHA-256 digests, so their
//!   length does not leak either). A missing or wrong token is 401 with
//!   `WWW-Authenticate: Basic realm="gitplane"`, so git asks its credential helper; the answer is
//!   the same whether the repository exists or not. An empty configured token disables the
//!   service (403), it never matches an empty password.
//! - **git runs with a clean environment**: only the CGI variables, `PATH`, and configuration
//!   passed as `GIT_CONFIG_*` (`http.receivepack` only for authenticated pushes, no dumb-protocol
//!   file access, `receive.fsckObjects`, `receive.maxInputSize`); no system or user git config.
//! - **No stray processes.** Each http-backend runs in its own process group. A client that
//!   disconnects or stalls mid-transfer gets its process group stopped and reaped: its pipes are
//!   closed, so git sees the end of its input and exits cleaning up its quarantined objects;
//!   SIGTERM and then SIGKILL follow [`TERMINATE_GRACE`] apart if it does not. So does one that
//!   runs longer than [`MAX_RUN`], and one whose client stops reading the response for
//!   [`IDLE_TIMEOUT`] (so slow readers cannot hold the process slots). At most [`MAX_PROCESSES`]
//!   authenticated requests run at once; further ones wait up to [`QUEUE_TIMEOUT`], then get 503.
//!   Slots are taken only after authentication, and anonymous reads (of opted-in repositories)
//!   have slots of their own ([`MAX_ANONYMOUS`], [`MAX_ANONYMOUS_PER_CLIENT`] per client address,
//!   503 at once when full), so no number of anonymous clients can make a push wait.

mod advertise;
mod blob;

use axum::{
    Router,
    body::{Body, Bytes},
    extract::{Path, RawQuery, State},
    http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use base64::Engine as _;
use futures::StreamExt as _;
use gitplane_apiserver::listener::{ClientAddr, Held, PerClient};
use sha2::{Digest, Sha256};
use std::{
    path::PathBuf,
    process::Stdio,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};
use subtle::ConstantTimeEq;
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    process::{Child, ChildStderr, ChildStdin, ChildStdout},
    sync::{Notify, OwnedSemaphorePermit, Semaphore},
};

/// git http-backend processes that run at the same time for authenticated requests.
pub const MAX_PROCESSES: usize = 16;
/// … and for anonymous reads of opted-in repositories, in all and per client address.
pub const MAX_ANONYMOUS: usize = 4;
pub const MAX_ANONYMOUS_PER_CLIENT: usize = 2;
/// How long a request waits for a free process slot before 503.
pub const QUEUE_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest a client may stall: not sending its request body, or not reading the response.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// The longest one http-backend may run.
pub const MAX_RUN: Duration = Duration::from_secs(3600);
/// Between SIGTERM and SIGKILL when a process is stopped.
pub const TERMINATE_GRACE: Duration = Duration::from_secs(2);
/// The largest pack a push may send (git's `receive.maxInputSize`).
pub const MAX_PUSH_BYTES: u64 = 1 << 30;
/// The longest http-backend may take to print its headers.
const HEAD_TIMEOUT: Duration = Duration::from_secs(60);
const MAX_HEAD: usize = 64 << 10;
const CHUNK: usize = 64 << 10;
const REALM: &str = "Basic realm=\"gitplane\"";

/// Who may read and push.
#[derive(Clone)]
pub struct GitAuth {
    /// The token every request must present (but anonymous reads of opted-in repositories);
    /// empty disables the service.
    pub push_token: String,
}

/// Shows whether a token is set, never the token.
impl std::fmt::Debug for GitAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GitAuth").field("push_token", &if self.push_token.is_empty() { "" } else { "***" }).finish()
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Service {
    UploadPack,
    ReceivePack,
}

impl Service {
    fn name(self) -> &'static str {
        match self {
            Service::UploadPack => "git-upload-pack",
            Service::ReceivePack => "git-receive-pack",
        }
    }

    fn from_query(query: &str) -> Option<Service> {
        query.split('&').find_map(|pair| match pair {
            "service=git-upload-pack" => Some(Service::UploadPack),
            "service=git-receive-pack" => Some(Service::ReceivePack),
            _ => None,
        })
    }
}

#[derive(Clone)]
struct GitState {
    repos_dir: Arc<std::path::Path>,
    /// `git`, found on PATH once: with an absolute program (and a PATH of its own) the process
    /// is started by posix_spawn instead of a fork of this large process.
    git: Arc<std::path::Path>,
    /// SHA-256 of the push token; `None` when the service is disabled.
    token: Option<[u8; 32]>,
    processes: Arc<Semaphore>,
    anonymous: Arc<Semaphore>,
    anonymous_per_client: PerClient,
    /// The pre-receive hook that asks for push verdicts; `None`: pushes are not judged.
    hook: Option<Arc<crate::prereceive::Hook>>,
    /// When each repository's housekeeping last ran ([`maintain`]).
    maintained: Arc<std::sync::Mutex<std::collections::HashMap<String, Instant>>>,
}

/// The path of `program` in a directory of PATH; the bare name when none has it.
fn find_program(program: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path).map(|dir| dir.join(program)).find(|p| p.is_file()).unwrap_or_else(|| program.into())
}

/// The smart HTTP router for the bare repositories in `repos_dir`; pushes run `hook`.
pub fn router(repos_dir: PathBuf, auth: GitAuth, hook: Option<Arc<crate::prereceive::Hook>>) -> Router {
    let repos_dir = std::path::absolute(&repos_dir).unwrap_or(repos_dir);
    if auth.push_token.is_empty() {
        tracing::warn!("no push token is configured: Git over HTTP is disabled");
    }
    let state = GitState {
        repos_dir: repos_dir.into(),
        git: find_program("git").into(),
        token: (!auth.push_token.is_empty()).then(|| Sha256::digest(auth.push_token.as_bytes()).into()),
        processes: Arc::new(Semaphore::new(MAX_PROCESSES)),
        anonymous: Arc::new(Semaphore::new(MAX_ANONYMOUS)),
        anonymous_per_client: PerClient::new(MAX_ANONYMOUS_PER_CLIENT),
        hook,
        maintained: Arc::default(),
    };
    Router::new()
        .route("/git/{repo}/info/refs", get(info_refs))
        .route("/git/{repo}/blob/{*rest}", get(blob::serve))
        .route(
            "/git/{repo}/git-upload-pack",
            post(|s: State<GitState>, c: ClientAddr, r: Path<String>, h: HeaderMap, b: Body| {
                rpc(s, c, r, h, b, Service::UploadPack)
            }),
        )
        .route(
            "/git/{repo}/git-receive-pack",
            post(|s: State<GitState>, c: ClientAddr, r: Path<String>, h: HeaderMap, b: Body| {
                rpc(s, c, r, h, b, Service::ReceivePack)
            }),
        )
        .with_state(state)
}

fn text(code: StatusCode, message: impl std::fmt::Display) -> Response {
    (code, [(header::CONTENT_TYPE, "text/plain; charset=utf-8")], format!("{message}\n")).into_response()
}

fn not_found(repo: &str) -> Response {
    text(StatusCode::NOT_FOUND, format!("repository {repo:?} not found"))
}

fn unauthorized(message: &str) -> Response {
    let mut response = text(StatusCode::UNAUTHORIZED, message);
    response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static(REALM));
    response
}

async fn info_refs(
    State(state): State<GitState>,
    client: ClientAddr,
    Path(repo): Path<String>,
    RawQuery(query): RawQuery,
    method: Method,
    headers: HeaderMap,
) -> Response {
    let query = query.unwrap_or_default();
    let Some(service) = Service::from_query(&query) else {
        return text(
            StatusCode::FORBIDDEN,
            "only Git's smart HTTP protocol is served: use git 1.6.6 or later (info/refs?service=git-upload-pack)",
        );
    };
    serve(&state, client, &repo, service, Call::Advertise { query, method }, headers, None).await
}

async fn rpc(
    State(state): State<GitState>,
    client: ClientAddr,
    Path(repo): Path<String>,
    headers: HeaderMap,
    body: Body,
    service: Service,
) -> Response {
    serve(&state, client, &repo, service, Call::Rpc, headers, Some(body)).await
}

/// Which of the two smart HTTP requests this is.
enum Call {
    /// `GET info/refs?service=…`: the ref advertisement.
    Advertise { query: String, method: Method },
    /// `POST git-upload-pack` or `POST git-receive-pack`.
    Rpc,
}

/// The validated directory name (`demo.git`) of an existing bare repository, or `None`.
fn repository(state: &GitState, repo: &str) -> Option<String> {
    let name = repo.strip_suffix(".git")?;
    let plain = !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if !plain {
        return None;
    }
    let dir = state.repos_dir.join(repo);
    let bare = std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir())
        && dir.join("HEAD").is_file()
        && dir.join("objects").is_dir()
        && dir.join("refs").is_dir();
    bare.then(|| repo.to_owned())
}

/// The user a valid token came with: `Ok(None)` without credentials, `Err` for wrong ones.
fn authenticate(state: &GitState, headers: &HeaderMap) -> Result<Option<String>, &'static str> {
    let Some(value) = headers.get(header::AUTHORIZATION) else {
        return Ok(None);
    };
    let value = value.to_str().map_err(|_| "malformed Authorization header")?;
    let (user, token) = if let Some(token) = value.strip_prefix("Bearer ") {
        ("token".to_owned(), token.trim().to_owned())
    } else if let Some(encoded) = value.strip_prefix("Basic ") {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(encoded.trim())
            .map_err(|_| "malformed Basic credentials")?;
        let decoded = String::from_utf8(decoded).map_err(|_| "malformed Basic credentials")?;
        let (user, password) = decoded.split_once(':').ok_or("malformed Basic credentials")?;
        (user.to_owned(), password.to_owned())
    } else {
        return Err("unsupported Authorization scheme: use Basic (any user, the push token as password) or Bearer");
    };
    let Some(expected) = &state.token else {
        return Err("no push token is configured on this server");
    };
    if !bool::from(Sha256::digest(token.as_bytes()).ct_eq(expected)) {
        return Err("wrong push token");
    }
    let plain_user = !user.is_empty()
        && user.len() <= 64
        && user.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '@'));
    Ok(Some(if plain_user { user } else { "git".to_owned() }))
}

/// Whether the repository's own config opts it in to anonymous clone and fetch.
fn anonymous_read(dir: &std::path::Path) -> bool {
    git2::Config::open(&dir.join("config")).and_then(|c| c.get_bool("gitplane.anonymousread")).unwrap_or(false)
}

/// Whether pushes to the repository are judged before they land (`gitplane.pushVerdicts`,
/// default yes).
fn push_verdicts(dir: &std::path::Path) -> bool {
    git2::Config::open(&dir.join("config")).and_then(|c| c.get_bool("gitplane.pushverdicts")).unwrap_or(true)
}

fn busy(retry_after: &'static str) -> Response {
    let mut response = text(StatusCode::SERVICE_UNAVAILABLE, "too many Git requests at once; retry later");
    response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static(retry_after));
    response
}

#[allow(clippy::too_many_arguments)]
async fn serve(
    state: &GitState,
    client: ClientAddr,
    repo: &str,
    service: Service,
    call: Call,
    headers: HeaderMap,
    body: Option<Body>,
) -> Response {
    let syntax_ok = repo.strip_suffix(".git").is_some_and(|n| !n.is_empty() && !n.starts_with('.'));
    if !syntax_ok {
        return not_found(repo);
    }
    if state.token.is_none() {
        return text(StatusCode::FORBIDDEN, "Git over HTTP is disabled: no token is configured on this server");
    }
    let user = match authenticate(state, &headers) {
        Ok(user) => user,
        Err(why) => return unauthorized(why),
    };
    let dir_name = repository(state, repo);
    // Anonymous callers learn nothing about which repositories exist: one 401 for all.
    let anonymous_ok = service == Service::UploadPack
        && dir_name.as_ref().is_some_and(|name| anonymous_read(&state.repos_dir.join(name)));
    if user.is_none() && !anonymous_ok {
        return unauthorized(
            "this needs gitplane's token: git clone http://git:<token>@<host>/git/<name>.git \
             (the token is in <data-dir>/git-token)",
        );
    }
    let Some(dir_name) = dir_name else {
        return not_found(repo);
    };
    let content_encoding = headers.get(header::CONTENT_ENCODING).and_then(|v| v.to_str().ok()).map(str::to_owned);
    if let Some(encoding) = &content_encoding
        && !matches!(encoding.as_str(), "gzip" | "x-gzip" | "identity")
    {
        return text(StatusCode::UNSUPPORTED_MEDIA_TYPE, format!("unsupported Content-Encoding {encoding:?}"));
    }
    // A push's ref advertisement needs no process (unless the repository's settings change it).
    if let (Call::Advertise { .. }, Service::ReceivePack, Some(_)) = (&call, service, &user) {
        let protocol = headers.get("git-protocol").and_then(|v| v.to_str().ok());
        if let Some(body) = advertise::receive_pack(&state.repos_dir.join(&dir_name), protocol) {
            return advertisement(body);
        }
    }
    // Slots are taken only now, after authentication; anonymous reads never wait for one.
    let permit = if user.is_some() {
        match tokio::time::timeout(QUEUE_TIMEOUT, state.processes.clone().acquire_owned()).await {
            Ok(Ok(permit)) => Slot { _permit: permit, _client: None },
            _ => return busy("5"),
        }
    } else {
        let (Some(held), Ok(permit)) =
            (state.anonymous_per_client.try_take(client), state.anonymous.clone().try_acquire_owned())
        else {
            return busy("1");
        };
        Slot { _permit: permit, _client: Some(held) }
    };

    let (method, path_info, query) = match call {
        Call::Advertise { query, method } => (method, format!("/{dir_name}/info/refs"), query),
        Call::Rpc => (Method::POST, format!("/{dir_name}/{}", service.name()), String::new()),
    };
    let mut command = tokio::process::Command::new(&*state.git);
    command
        .arg("http-backend")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into()))
        .env("GIT_PROJECT_ROOT", &*state.repos_dir)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GATEWAY_INTERFACE", "CGI/1.1")
        .env("SERVER_PROTOCOL", "HTTP/1.1")
        .env("REQUEST_METHOD", method.as_str())
        .env("PATH_INFO", &path_info)
        .env("QUERY_STRING", &query)
        .current_dir(&*state.repos_dir)
        .stdin(if body.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .process_group(0);
    let push = service == Service::ReceivePack;
    let mut config: Vec<(&str, String)> = vec![
        ("http.receivepack", push.to_string()),
        ("http.uploadpack", "true".into()),
        ("http.getanyfile", "false".into()),
        ("receive.fsckObjects", "true".into()),
        ("receive.maxInputSize", MAX_PUSH_BYTES.to_string()),
        // Housekeeping runs after the push has answered, not before (`maintain`).
        ("receive.autogc", "false".into()),
    ];
    // The push verdict: git's pre-receive hook, which asks this replica (unless the repository
    // turned it off).
    if let (true, Some(hook)) = (push && user.is_some(), &state.hook)
        && push_verdicts(&state.repos_dir.join(&dir_name))
    {
        config.push(hook.git_config());
        command.envs(hook.env());
    }
    command.env("GIT_CONFIG_COUNT", config.len().to_string());
    for (i, (key, value)) in config.iter().enumerate() {
        command.env(format!("GIT_CONFIG_KEY_{i}"), key).env(format!("GIT_CONFIG_VALUE_{i}"), value);
    }
    if let Some(user) = &user {
        command.env("REMOTE_USER", user);
    }
    let header_value = |name: HeaderName| headers.get(name).and_then(|v| v.to_str().ok());
    if let Some(content_type) = header_value(header::CONTENT_TYPE) {
        command.env("CONTENT_TYPE", content_type);
    }
    // No CONTENT_LENGTH on purpose: without it http-backend hands its stdin to receive-pack (or
    // reads it to the end), and the end of the input is how a cut-off request ends cleanly. With
    // it, http-backend (git 2.47) loops forever on a body that ends short, and git only cleans up
    // its quarantined objects on a clean exit, not on a signal. hyper has already enforced the
    // request's Content-Length: the stream ends exactly there or fails, and a failure closes stdin.
    if let Some(encoding) = content_encoding.filter(|e| e != "identity") {
        command.env("HTTP_CONTENT_ENCODING", encoding);
    }
    if let Some(protocol) = header_value(HeaderName::from_static("git-protocol"))
        .filter(|p| p.len() <= 256 && p.bytes().all(|b| b.is_ascii_graphic()))
    {
        command.env("HTTP_GIT_PROTOCOL", protocol);
    }

    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            tracing::error!(error = %e, "cannot run git http-backend: is git installed and on PATH?");
            return text(StatusCode::INTERNAL_SERVER_ERROR, "the server cannot run git");
        }
    };
    let (stdin, stdout, stderr) = (child.stdin.take(), child.stdout.take(), child.stderr.take());
    let kill = Arc::new(Notify::new());
    let label = format!("{} {dir_name}", service.name());
    let reader = Arc::new(Reader::new());
    let pushed = (push && method == Method::POST).then(|| (state.clone(), dir_name.clone()));
    let (reaped_kill, reaped_reader, reaped_label) = (kill.clone(), reader.clone(), label.clone());
    tokio::spawn(async move {
        let succeeded = reap(child, stderr, reaped_kill, reaped_reader, permit, reaped_label, user).await;
        if let (true, Some((state, dir_name))) = (succeeded, pushed) {
            maintain(&state, &dir_name).await;
        }
    });
    // From here on, dropping the guard (the client went away) stops the process group.
    let guard = KillOnDrop(Some(kill.clone()));
    if let (Some(body), Some(stdin)) = (body, stdin) {
        tokio::spawn(feed(body, stdin, kill));
    }
    let Some(mut stdout) = stdout else {
        return text(StatusCode::INTERNAL_SERVER_ERROR, "git http-backend has no output");
    };
    let (head, rest) = match tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut stdout)).await {
        Ok(Ok(head)) => head,
        Ok(Err(why)) => {
            tracing::warn!(request = %label, why, "git http-backend answered no CGI headers");
            return text(StatusCode::BAD_GATEWAY, "git http-backend failed; see the server log");
        }
        Err(_) => return text(StatusCode::GATEWAY_TIMEOUT, "git http-backend did not answer"),
    };
    let output = Output { stdout, first: Some(rest), guard, reader };
    let stream = futures::stream::unfold(Some(output), |output| async move {
        let mut output = output?;
        output.reader.asking();
        if let Some(first) = output.first.take().filter(|b| !b.is_empty()) {
            output.reader.handed_over();
            return Some((Ok(first), Some(output)));
        }
        let mut buf = Vec::with_capacity(CHUNK);
        match output.stdout.read_buf(&mut buf).await {
            Ok(0) => {
                output.guard.disarm();
                None
            }
            Ok(_) => {
                output.reader.handed_over();
                Some((Ok(Bytes::from(buf)), Some(output)))
            }
            Err(e) => Some((Err(e), None)),
        }
    });
    let mut response = Response::new(Body::from_stream(stream));
    *response.status_mut() = head.status;
    response.headers_mut().extend(head.headers);
    response
}

/// A push's ref advertisement, with the headers `git http-backend` gives it.
fn advertisement(body: Vec<u8>) -> Response {
    let headers = [
        (header::CONTENT_TYPE, "application/x-git-receive-pack-advertisement"),
        (header::EXPIRES, "Fri, 01 Jan 1980 00:00:00 GMT"),
        (header::PRAGMA, "no-cache"),
        (header::CACHE_CONTROL, "no-cache, max-age=0, must-revalidate"),
    ];
    (StatusCode::OK, headers, body).into_response()
}

/// A process slot, held until git exits.
struct Slot {
    _permit: OwnedSemaphorePermit,
    _client: Option<Held>,
}

/// Stops the request's git process group when dropped before being disarmed.
struct KillOnDrop(Option<Arc<Notify>>);

impl KillOnDrop {
    fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(kill) = self.0.take() {
            kill.notify_one();
        }
    }
}

/// Whether the client is keeping up with the response: the time a chunk was handed to it and it
/// has not asked for the next one since.
struct Reader {
    epoch: Instant,
    /// Milliseconds since `epoch`, plus one; 0 while the client is not the one being waited for.
    waiting_since: AtomicU64,
}

impl Reader {
    fn new() -> Reader {
        Reader { epoch: Instant::now(), waiting_since: AtomicU64::new(0) }
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX - 1) + 1
    }

    fn handed_over(&self) {
        self.waiting_since.store(self.now(), Ordering::Relaxed);
    }

    fn asking(&self) {
        self.waiting_since.store(0, Ordering::Relaxed);
    }

    /// Resolves once the client has not asked for the next chunk for [`IDLE_TIMEOUT`].
    async fn stalled(&self) {
        let limit = u64::try_from(IDLE_TIMEOUT.as_millis()).unwrap_or(u64::MAX);
        loop {
            tokio::time::sleep(IDLE_TIMEOUT / 4).await;
            let since = self.waiting_since.load(Ordering::Relaxed);
            if since != 0 && self.now().saturating_sub(since) > limit {
                return;
            }
        }
    }
}

/// The response body's source.
struct Output {
    stdout: ChildStdout,
    /// Body bytes read together with the CGI headers.
    first: Option<Bytes>,
    guard: KillOnDrop,
    reader: Arc<Reader>,
}

/// Streams the request body into git's stdin. A client that fails or stalls stops git.
async fn feed(body: Body, mut stdin: ChildStdin, kill: Arc<Notify>) {
    let mut stream = body.into_data_stream();
    loop {
        match tokio::time::timeout(IDLE_TIMEOUT, stream.next()).await {
            Ok(Some(Ok(chunk))) => {
                if stdin.write_all(&chunk).await.is_err() {
                    // git stopped reading; its answer says why.
                    return;
                }
            }
            Ok(None) => break,
            Ok(Some(Err(_))) | Err(_) => {
                tracing::debug!("the client went away or stalled mid-request; stopping git");
                // The end of its input is what lets git stop cleanly.
                drop(stdin);
                kill.notify_one();
                return;
            }
        }
    }
    let _ = stdin.shutdown().await;
}

/// The CGI response head.
struct Head {
    status: StatusCode,
    headers: HeaderMap,
}

/// Reads the CGI headers; returns them and the body bytes read after them.
async fn read_head(stdout: &mut ChildStdout) -> Result<(Head, Bytes), &'static str> {
    let mut buf = Vec::with_capacity(8 << 10);
    loop {
        let end = [&b"\r\n\r\n"[..], b"\n\n"]
            .iter()
            .filter_map(|sep| buf.windows(sep.len()).position(|w| w == *sep).map(|at| (at, sep.len())))
            .min();
        if let Some((at, len)) = end {
            let head = parse_head(&buf[..at]);
            return Ok((head, Bytes::copy_from_slice(&buf[at + len..])));
        }
        if buf.len() > MAX_HEAD {
            return Err("CGI headers too long");
        }
        match stdout.read_buf(&mut buf).await {
            Ok(0) => return Err("output ended before the CGI headers"),
            Ok(_) => {}
            Err(_) => return Err("reading the output failed"),
        }
    }
}

fn parse_head(head: &[u8]) -> Head {
    let mut status = StatusCode::OK;
    let mut headers = HeaderMap::new();
    for line in head.split(|b| *b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(colon) = line.iter().position(|b| *b == b':') else {
            continue;
        };
        let (name, value) = (&line[..colon], line[colon + 1..].trim_ascii());
        if name.eq_ignore_ascii_case(b"status") {
            if let Some(code) = value.get(..3).and_then(|c| StatusCode::from_bytes(c).ok()) {
                status = code;
            }
        } else if let (Ok(name), Ok(value)) = (HeaderName::from_bytes(name), HeaderValue::from_bytes(value)) {
            headers.append(name, value);
        }
    }
    Head { status, headers }
}

/// Waits for the process (always reaping it), logs how it ended, and stops its process group
/// when asked to or when it runs too long.
async fn reap(
    mut child: Child,
    stderr: Option<ChildStderr>,
    kill: Arc<Notify>,
    reader: Arc<Reader>,
    _permit: Slot,
    label: String,
    user: Option<String>,
) -> bool {
    let finished = {
        let run = async { tokio::join!(child.wait(), stderr_excerpt(stderr)) };
        tokio::select! {
            outcome = run => Some(outcome),
            () = kill.notified() => None,
            () = reader.stalled() => None,
            () = tokio::time::sleep(MAX_RUN) => None,
        }
    };
    match finished {
        Some((Ok(status), _)) if status.success() => {
            if label.starts_with(Service::ReceivePack.name()) {
                tracing::info!(request = %label, user = user.as_deref().unwrap_or("-"), "push received");
            }
            return true;
        }
        Some((Ok(status), stderr)) => {
            tracing::warn!(request = %label, %status, stderr = %stderr.trim(), "git http-backend failed");
        }
        Some((Err(e), _)) => tracing::warn!(request = %label, error = %e, "waiting for git http-backend failed"),
        None => {
            terminate(&mut child).await;
            tracing::info!(request = %label, "stopped git: the client went away, stalled, or ran too long");
        }
    }
    false
}

/// Between two runs of a repository's housekeeping.
const MAINTENANCE_INTERVAL: Duration = Duration::from_secs(60);

/// git's housekeeping of a repository that was pushed to (`git maintenance run --auto`: packs
/// loose objects once there are many), at most every [`MAINTENANCE_INTERVAL`]: what
/// receive-pack would run before answering each push (`receive.autogc`), run after it answered.
async fn maintain(state: &GitState, dir_name: &str) {
    {
        let mut maintained = state.maintained.lock().unwrap_or_else(|e| e.into_inner());
        if maintained.get(dir_name).is_some_and(|at| at.elapsed() < MAINTENANCE_INTERVAL) {
            return;
        }
        maintained.insert(dir_name.to_owned(), Instant::now());
    }
    let run = tokio::process::Command::new(&*state.git)
        .args(["maintenance", "run", "--auto", "--quiet"])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into()))
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_DIR", state.repos_dir.join(dir_name))
        .current_dir(&*state.repos_dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(MAX_RUN, run).await {
        Ok(Ok(output)) if output.status.success() => {}
        Ok(Ok(output)) => tracing::warn!(repository = dir_name, status = %output.status,
            stderr = %String::from_utf8_lossy(&output.stderr).trim(), "git maintenance failed"),
        Ok(Err(e)) => tracing::warn!(repository = dir_name, error = %e, "git maintenance did not run"),
        Err(_) => tracing::warn!(repository = dir_name, "git maintenance ran too long and was stopped"),
    }
}

/// The first few KiB of what git printed to stderr (the rest is drained, so git never blocks).
async fn stderr_excerpt(stderr: Option<ChildStderr>) -> String {
    let Some(mut stderr) = stderr else {
        return String::new();
    };
    let mut excerpt = Vec::new();
    let _ = (&mut stderr).take(4096).read_to_end(&mut excerpt).await;
    let _ = tokio::io::copy(&mut stderr, &mut tokio::io::sink()).await;
    String::from_utf8_lossy(&excerpt).into_owned()
}

/// Stops the process group: first by closing its pipes (done by the time this runs), after
/// which git notices the end of its input or output and exits by itself, cleaning up its
/// quarantined objects; then SIGTERM; then SIGKILL. Always reaps.
async fn terminate(child: &mut Child) {
    if tokio::time::timeout(TERMINATE_GRACE, child.wait()).await.is_ok() {
        return;
    }
    // `id()` is `None` once the child is reaped, so the group id below was never reused.
    if let Some(pgid) = child.id().and_then(|id| i32::try_from(id).ok()) {
        // SAFETY: kill(2) has no memory-safety preconditions; -pgid addresses the child's own group.
        unsafe { libc::kill(-pgid, libc::SIGTERM) };
        if tokio::time::timeout(TERMINATE_GRACE, child.wait()).await.is_err() {
            // SAFETY: as above; the leader is not reaped yet, so the group is still ours.
            unsafe { libc::kill(-pgid, libc::SIGKILL) };
        }
    }
    let _ = child.start_kill();
    let _ = child.wait().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mirror::tests::wait_for;
    use std::{path::Path as FsPath, process::Output as ProcessOutput};
    use tower::ServiceExt as _;

    const TOKEN: &str = "t0ken-for-tests";

    struct Server {
        dir: tempfile::TempDir,
        port: u16,
        router: Router,
    }

    impl Server {
        /// `repos/demo.git` with one commit on `main`, served on a random loopback port.
        async fn start(anonymous_read: bool) -> Server {
            let dir = tempfile::tempdir().unwrap();
            let repos = dir.path().join("repos");
            let repo = git2::Repository::init_bare(repos.join("demo.git")).unwrap();
            repo.set_head("refs/heads/main").unwrap();
            let mut tree = repo.treebuilder(None).unwrap();
            tree.insert("cm.yaml", repo.blob(b"a: 1\n").unwrap(), 0o100644).unwrap();
            let tree = repo.find_tree(tree.write().unwrap()).unwrap();
            let sig = git2::Signature::now("t", "t@localhost").unwrap();
            repo.commit(Some("refs/heads/main"), &sig, &sig, "first", &tree, &[]).unwrap();
            if anonymous_read {
                repo.config().unwrap().set_bool("gitplane.anonymousRead", true).unwrap();
            }
            let router = router(repos, GitAuth { push_token: TOKEN.into() }, None);
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = listener.local_addr().unwrap().port();
            let app = router.clone();
            tokio::spawn(async move { axum::serve(listener, app).await });
            Server { dir, port, router }
        }

        fn repo(&self) -> PathBuf {
            self.dir.path().join("repos/demo.git")
        }

        fn url(&self, credentials: &str) -> String {
            format!("http://{credentials}127.0.0.1:{}/git/demo.git", self.port)
        }

        fn main(&self) -> git2::Oid {
            git2::Repository::open_bare(self.repo()).unwrap().refname_to_id("refs/heads/main").unwrap()
        }

        /// Real git, isolated from the machine's configuration and unable to prompt.
        async fn git(&self, cwd: &FsPath, args: &[&str]) -> ProcessOutput {
            tokio::process::Command::new("git")
                .args(["-c", "user.name=t", "-c", "user.email=t@localhost", "-c", "credential.helper="])
                .args(args)
                .current_dir(cwd)
                .env("HOME", self.dir.path())
                .env("GIT_CONFIG_NOSYSTEM", "1")
                .env("GIT_TERMINAL_PROMPT", "0")
                .env_remove("GIT_ASKPASS")
                .env_remove("SSH_ASKPASS")
                .output()
                .await
                .unwrap()
        }

        /// A clone of demo.git in `name`, with one new commit of `file`.
        async fn clone_and_commit(&self, name: &str, file: &str, content: &[u8]) -> PathBuf {
            let work = self.dir.path().join(name);
            let out = self.git(self.dir.path(), &["clone", &self.url(""), name]).await;
            assert!(out.status.success(), "clone: {}", String::from_utf8_lossy(&out.stderr));
            std::fs::write(work.join(file), content).unwrap();
            for args in [&["add", "."][..], &["commit", "-q", "-m", "change"]] {
                let out = self.git(&work, args).await;
                assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
            }
            work
        }

        async fn call(&self, method: Method, uri: &str, headers: &[(&str, &str)]) -> Response {
            let mut request = axum::http::Request::builder().method(method).uri(uri);
            for (name, value) in headers {
                request = request.header(*name, *value);
            }
            self.router.clone().oneshot(request.body(Body::empty()).unwrap()).await.unwrap()
        }
    }

    fn head_of(work: &FsPath) -> git2::Oid {
        git2::Repository::open(work).unwrap().head().unwrap().target().unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn t50_clone_anonymously_and_push_with_the_token() {
        let server = Server::start(true).await;
        let work = server.clone_and_commit("work", "cm.yaml", b"a: 2\n").await;
        assert_eq!(std::fs::read(work.join("cm.yaml")).unwrap(), b"a: 2\n");
        let before = server.main();

        let out = server.git(&work, &["push", &server.url(""), "HEAD:main"]).await;
        assert!(!out.status.success(), "a push without the token fails");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("could not read Username") || stderr.contains("401"), "{stderr}");
        let out = server.git(&work, &["push", &server.url("x:wrong@"), "HEAD:main"]).await;
        assert!(!out.status.success(), "a push with a wrong token fails");
        assert!(String::from_utf8_lossy(&out.stderr).contains("Authentication failed"));
        assert_eq!(server.main(), before, "refused pushes change nothing");

        let started = Instant::now();
        let out = server.git(&work, &["push", &server.url(&format!("x:{TOKEN}@")), "HEAD:main"]).await;
        let pushed = started.elapsed();
        assert!(out.status.success(), "push: {}", String::from_utf8_lossy(&out.stderr));
        let returned = Instant::now();
        let mut updated = None;
        assert!(
            wait_for(Duration::from_secs(10), || {
                updated = Some(returned.elapsed());
                server.main() == head_of(&work)
            })
            .await
        );
        println!(
            "push latency: git push took {pushed:?}; the ref was updated {:?} after it returned (it is synchronous)",
            updated.unwrap_or_default()
        );
        assert_eq!(server.main(), head_of(&work), "the ref is updated when git push returns");

        // Pushing with the token as a Bearer header works too (git's http.extraHeader).
        std::fs::write(work.join("cm.yaml"), b"a: 3\n").unwrap();
        assert!(server.git(&work, &["commit", "-qam", "three"]).await.status.success());
        let bearer = format!("http.extraHeader=Authorization: Bearer {TOKEN}");
        let out = server.git(&work, &["-c", &bearer, "push", &server.url(""), "HEAD:main"]).await;
        assert!(out.status.success(), "bearer push: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(server.main(), head_of(&work));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn t50_large_pushes_stream_and_fetches_send_gzip() {
        let server = Server::start(true).await;
        // 8 MiB that do not compress: git sends it chunked, without Content-Length.
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let noise: Vec<u8> = (0..8 << 20)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        let work = server.clone_and_commit("big", "blob.bin", &noise).await;
        let out = server.git(&work, &["push", &server.url(&format!("x:{TOKEN}@")), "HEAD:main"]).await;
        assert!(out.status.success(), "large push: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(server.main(), head_of(&work));

        // A fetch with many local commits sends a negotiation over 1 KiB, which git gzips.
        let other = server.clone_and_commit("other", "x.yaml", b"x: 1\n").await;
        for i in 0..40 {
            std::fs::write(other.join("x.yaml"), format!("x: {i}\n")).unwrap();
            assert!(server.git(&other, &["commit", "-qam", "local"]).await.status.success());
        }
        std::fs::write(work.join("cm.yaml"), b"a: 3\n").unwrap();
        assert!(server.git(&work, &["commit", "-qam", "three"]).await.status.success());
        let out = server.git(&work, &["push", &server.url(&format!("x:{TOKEN}@")), "HEAD:main"]).await;
        assert!(out.status.success(), "push: {}", String::from_utf8_lossy(&out.stderr));
        let out = tokio::process::Command::new("git")
            .args(["-c", "credential.helper=", "fetch", &server.url(""), "main"])
            .current_dir(&other)
            .env("HOME", server.dir.path())
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_TRACE_CURL", "1")
            .env("GIT_TRACE_CURL_NO_DATA", "1")
            .output()
            .await
            .unwrap();
        let trace = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "fetch: {trace}");
        assert!(trace.contains("Content-Encoding: gzip"), "the fetch request was not gzip'd");
        let fetched = git2::Repository::open(&other).unwrap().refname_to_id("FETCH_HEAD").unwrap();
        assert_eq!(fetched, server.main());
    }

    #[tokio::test]
    async fn t10_names_tokens_and_status_codes() {
        let server = Server::start(true).await;
        let advertise = "/git/demo.git/info/refs?service=git-receive-pack";
        let response = server.call(Method::GET, advertise, &[]).await;
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "the push advertisement needs the token");
        assert_eq!(response.headers()[header::WWW_AUTHENTICATE], REALM);
        let wrong = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode("x:nope"));
        assert_eq!(server.call(Method::GET, advertise, &[("authorization", &wrong)]).await.status(), 401);
        for bad in ["Basic !!!", "Bearer ", "Digest x", "Bearer t0ken-for-test"] {
            assert_eq!(server.call(Method::GET, advertise, &[("authorization", bad)]).await.status(), 401, "{bad}");
        }
        let basic = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("any:{TOKEN}")));
        let bearer = format!("Bearer {TOKEN}");
        for auth in [&basic, &bearer] {
            let response = server.call(Method::GET, advertise, &[("authorization", auth)]).await;
            assert_eq!(response.status(), StatusCode::OK);
            assert_eq!(response.headers()[header::CONTENT_TYPE], "application/x-git-receive-pack-advertisement");
            let body = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
            assert!(body.starts_with(b"001f# service=git-receive-pack\n"), "{body:?}");
        }
        let response = server.call(Method::POST, "/git/demo.git/git-receive-pack", &[]).await;
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);

        let upload = server.call(Method::GET, "/git/demo.git/info/refs?service=git-upload-pack", &[]).await;
        assert_eq!(upload.status(), StatusCode::OK, "reading is anonymous where the repository opts in");
        let dumb = server.call(Method::GET, "/git/demo.git/info/refs", &[]).await;
        assert_eq!(dumb.status(), StatusCode::FORBIDDEN);

        std::fs::create_dir(server.dir.path().join("repos/not-a-repo.git")).unwrap();
        std::os::unix::fs::symlink(server.repo(), server.dir.path().join("repos/link.git")).unwrap();
        for path in [
            "/git/../info/refs",
            "/git/..%2Frepos%2Fdemo.git/info/refs",
            "/git/%2E%2E/info/refs",
            "/git/.git/info/refs",
            "/git/.demo.git/info/refs",
            "/git/demo/info/refs",
            "/git/nope.git/info/refs",
            "/git/not-a-repo.git/info/refs",
            "/git/link.git/info/refs",
            "/git/de%00mo.git/info/refs",
        ] {
            let response = server
                .call(Method::GET, &format!("{path}?service=git-upload-pack"), &[("authorization", &bearer)])
                .await;
            assert!(matches!(response.status().as_u16(), 404 | 400), "{path}: {}", response.status());
            let anonymous = server.call(Method::GET, &format!("{path}?service=git-upload-pack"), &[]).await;
            assert!(matches!(anonymous.status().as_u16(), 401 | 404 | 400), "{path}: {}", anonymous.status());
            let push = server
                .call(Method::GET, &format!("{path}?service=git-receive-pack"), &[("authorization", &bearer)])
                .await;
            assert!(matches!(push.status().as_u16(), 404 | 400), "{path}: {}", push.status());
        }
        assert!(!server.dir.path().join("repos/nope.git").exists(), "nothing is created over HTTP");

        let private = Server::start(false).await;
        let response = private.call(Method::GET, "/git/demo.git/info/refs?service=git-upload-pack", &[]).await;
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "reading needs the token by default");
        let response = private.call(Method::GET, "/git/nope.git/info/refs?service=git-upload-pack", &[]).await;
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "and unknown names do not tell what exists");

        let disabled = router(server.dir.path().join("repos"), GitAuth { push_token: String::new() }, None);
        let request =
            axum::http::Request::get(advertise).header("authorization", "Basic eDo=").body(Body::empty()).unwrap();
        assert_eq!(disabled.clone().oneshot(request).await.unwrap().status(), 403, "an empty token matches nothing");
        let request = axum::http::Request::get(advertise).body(Body::empty()).unwrap();
        assert_eq!(disabled.oneshot(request).await.unwrap().status(), 403, "no token: the service is disabled");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn t50_a_mirror_fetches_over_http_with_the_credentials_in_its_url() {
        use crate::mirror::{Mirrors, tests::head_of as mirror_head};
        let server = Server::start(false).await;
        let mirrors = Mirrors::new(server.dir.path().join("mirrors"), Duration::from_secs(3600), true);
        let url = server.url(&format!("git:{TOKEN}@"));
        let path = mirrors.track(&url).unwrap();
        assert!(wait_for(Duration::from_secs(30), || mirror_head(&path, "main") == Some(server.main())).await);

        let wrong = server.url("git:not-the-t0ken@");
        mirrors.track(&wrong).unwrap();
        assert!(wait_for(Duration::from_secs(30), || mirrors.status(&wrong).is_some_and(|s| s.fetches > 0)).await);
        let error = mirrors.status(&wrong).unwrap().last_error.unwrap_or_default();
        assert!(error.contains(&server.url("git:***@")) && error.contains("refused the credentials"), "{error}");
        assert!(!error.contains("not-the-t0ken") && !error.contains(TOKEN), "{error}");
    }

    /// Processes whose working directory is `dir` (git http-backend and its children chdir into
    /// the repository).
    fn processes_in(dir: &FsPath) -> Vec<u32> {
        let dir = dir.canonicalize().unwrap();
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|cwd| cwd == dir))
            .collect()
    }

    /// Zombie children of this process.
    fn zombies() -> Vec<u32> {
        let me = std::process::id().to_string();
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| {
                let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
                let after_comm = &stat[stat.rfind(')')? + 2..];
                let mut fields = after_comm.split(' ');
                let (state, ppid) = (fields.next()?, fields.next()?);
                (state == "Z" && ppid == me).then(|| e.file_name().to_str()?.parse().ok())?
            })
            .collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn t50_a_client_that_disconnects_mid_push_leaves_no_process() {
        use tokio::io::AsyncWriteExt as _;
        let server = Server::start(true).await;
        let before = server.main();
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", server.port)).await.unwrap();
        let command = format!("{before} {} refs/heads/main\0report-status\n", "1".repeat(40));
        let pkt = format!("{:04x}{command}0000", command.len() + 4);
        let pack_start = [&b"PACK"[..], &2u32.to_be_bytes(), &1000u32.to_be_bytes(), &[0x95, 0x0a][..]].concat();
        let head = format!(
            "POST /git/demo.git/git-receive-pack HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN}\r\n\
             Content-Type: application/x-git-receive-pack-request\r\nContent-Length: 10000000\r\n\r\n"
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        stream.write_all(pkt.as_bytes()).await.unwrap();
        stream.write_all(&pack_start).await.unwrap();
        stream.flush().await.unwrap();
        let repo = server.repo();
        assert!(
            wait_for(Duration::from_secs(10), || processes_in(&repo).len() >= 2).await,
            "git http-backend and receive-pack are working on the push"
        );
        drop(stream);
        assert!(
            wait_for(Duration::from_secs(10), || processes_in(&repo).is_empty()).await,
            "processes left: {:?}",
            processes_in(&repo)
        );
        assert!(wait_for(Duration::from_secs(10), || zombies().is_empty()).await, "zombies: {:?}", zombies());
        assert_eq!(server.main(), before, "an interrupted push changes nothing");
        let leftovers: Vec<_> = std::fs::read_dir(repo.join("objects"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains("incoming") || n.starts_with("tmp"))
            .collect();
        assert!(leftovers.is_empty(), "quarantined objects left behind: {leftovers:?}");
    }
}
