//! Remote repositories: one bare local mirror per URL, kept fresh by polling and webhooks.
//!
//! An Application may name a remote Git URL (`https://`, `http://`, `file://`) instead of a hosted
//! repository. [`Mirrors`] keeps a bare mirror of each tracked URL under
//! `<dir>/<sha256(url)[..16]>.git` and fetches it with git2 (`+refs/heads/*:refs/heads/*`, prune,
//! no tags, never a checkout), so the source controller reads it like a hosted repository: from
//! the object database, and learns of new commits from the mirror's `refs/heads` changing on disk.
//!
//! Rules this module keeps:
//! - **Coalesced fetches.** One worker per URL; [`Mirrors::fetch_soon`] only raises a flag. However
//!   many calls arrive while a fetch is queued or running, at most one more fetch follows, and
//!   fetches of one URL start at least [`MIN_FETCH_INTERVAL`] apart, so a flood of webhooks costs
//!   at most two fetches (and a sustained one, one fetch per interval). Polling runs every `poll` plus up to 10% jitter
//!   (so many mirrors do not fetch in lockstep), counted from the end of the last fetch.
//! - **Bounded fetches.** At most [`MAX_CONCURRENT_FETCHES`] fetches run at once, each on a
//!   blocking thread, aborted after [`FETCH_TIMEOUT`], when the server is silent for
//!   [`SERVER_TIMEOUT`], or when the received pack exceeds [`MAX_PACK_BYTES`].
//! - **Credentials never leave the URL.** A URL may carry credentials (`https://user:token@host/…`);
//!   they are used for the fetch only. Every log line, error and status shows the URL through
//!   [`redact`] (`https://user:***@host/…`) and every git error message is scrubbed of them. The
//!   fetch uses an in-memory (anonymous) remote, so the mirror's config on disk holds no URL.
//! - **Only the mirror's own directory is written**, and its name is a hash: a URL can never
//!   choose a path.
//!
//! `file://` URLs read any repository this process can read, so whoever writes Applications
//! could read the replica's own files: they are refused unless the replica allows them
//! (`--allow-file-urls`, for tests and single-user machines).

use sha2::{Digest, Sha256};
use std::{
    cell::Cell,
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex, MutexGuard, Once, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant, SystemTime},
};
use tokio::sync::{Notify, Semaphore, broadcast};

/// How often a tracked URL is fetched without a webhook, unless the caller says otherwise.
pub const DEFAULT_POLL: Duration = Duration::from_secs(60);
/// The longest one fetch may take, transfer included.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(300);
/// The longest a server may stay silent (connect, or between reads) during a fetch.
pub const SERVER_TIMEOUT: Duration = Duration::from_secs(60);
/// The largest pack a fetch may receive; bigger ones are aborted (a hostile or wrong URL).
pub const MAX_PACK_BYTES: usize = 512 << 20;
/// The shortest time between the starts of two fetches of one URL. Requests within it wait for
/// it and coalesce, so a burst of requests shorter than this costs at most two fetches.
pub const MIN_FETCH_INTERVAL: Duration = Duration::from_secs(2);
/// Fetches that run at the same time, over all URLs.
pub const MAX_CONCURRENT_FETCHES: usize = 4;
/// The refs a mirror holds: the branches, exactly as the remote has them.
const REFSPEC: &str = "+refs/heads/*:refs/heads/*";
const MAX_URL_LEN: usize = 2048;

/// Why a URL cannot be mirrored or fetched. URLs in these errors are always redacted.
#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    #[error(
        "{url:?} is not a Git URL gitplane can mirror: use https://host/path, http://host/path or file:///path \
         (ssh and git:// are not supported; put credentials in the URL, e.g. https://user:token@host/org/repo.git)"
    )]
    UnsupportedUrl { url: String },
    #[error(
        "{url:?} reads a repository on the control plane's own machine, which Applications may not do unless \
         the replicas run with --allow-file-urls: serve it over https:// or push it to a hosted repository"
    )]
    FileUrlRefused { url: String },
    #[error("creating the mirror of {url} in {}: {source}", path.display())]
    Create {
        url: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("initializing the mirror of {url} in {}: {message}", path.display())]
    Init { url: String, path: PathBuf, message: String },
    #[error("tracking {url} needs a Tokio runtime: call Mirrors::track from within the runtime")]
    NoRuntime { url: String },
    #[error("fetching {url} failed: {message}; check the URL, its credentials and that the host is reachable")]
    Fetch { url: String, message: String },
    #[error(
        "fetching {url} was stopped after {:?}: the server is too slow or silent; it is retried at the next poll",
        timeout
    )]
    Timeout { url: String, timeout: Duration },
    #[error("fetching {url} was aborted: the pack is larger than {limit} bytes; is this the right repository?")]
    TooLarge { url: String, limit: usize },
    #[error("fetching {url} was cancelled: the URL is no longer tracked")]
    Cancelled { url: String },
    #[error("fetching {url} failed: the fetch thread panicked: {message}")]
    Panicked { url: String, message: String },
}

/// What a mirror's last fetches did, for status output. Errors are redacted.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MirrorStatus {
    /// Fetches finished (with or without success) since the URL was tracked.
    pub fetches: u64,
    /// A fetch is running now.
    pub fetching: bool,
    /// When the last fetch finished.
    pub last_fetch: Option<SystemTime>,
    /// When the last successful fetch finished.
    pub last_success: Option<SystemTime>,
    /// Why the last fetch failed; `None` after a success.
    pub last_error: Option<String>,
}

/// The mirrors of remote repositories. Cheap to clone; all clones share the mirrors.
#[derive(Clone)]
pub struct Mirrors {
    inner: Arc<Inner>,
}

struct Inner {
    dir: PathBuf,
    poll: Duration,
    /// Whether `file://` URLs may be mirrored.
    file_urls: bool,
    entries: Mutex<HashMap<String, Entry>>,
    changes: broadcast::Sender<String>,
    fetch_slots: Arc<Semaphore>,
}

struct Entry {
    mirror: Arc<Mirror>,
    worker: tokio::task::JoinHandle<()>,
}

/// One tracked URL, shared by its worker and [`Mirrors`].
struct Mirror {
    /// The URL as tracked (may hold credentials: never log it, log `shown`).
    url: String,
    /// The URL as logs and errors show it.
    shown: String,
    path: PathBuf,
    /// A fetch was asked for and has not started yet.
    pending: AtomicBool,
    wake: Notify,
    untracked: AtomicBool,
    status: Mutex<MirrorStatus>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Drop for Inner {
    fn drop(&mut self) {
        for entry in lock(&self.entries).values() {
            entry.mirror.untracked.store(true, Ordering::SeqCst);
            entry.worker.abort();
        }
    }
}

impl Mirrors {
    /// Mirrors kept under `dir` (created on first use), each polled every `poll` (plus jitter).
    /// Mirrors in `dir`, each fetched every `poll`; `file_urls`: whether `file://` URLs may be
    /// mirrored (tests, single-user machines).
    pub fn new(dir: PathBuf, poll: Duration, file_urls: bool) -> Mirrors {
        set_server_timeouts();
        let (changes, _) = broadcast::channel(64);
        Mirrors {
            inner: Arc::new(Inner {
                dir,
                poll,
                file_urls,
                entries: Mutex::new(HashMap::new()),
                changes,
                fetch_slots: Arc::new(Semaphore::new(MAX_CONCURRENT_FETCHES)),
            }),
        }
    }

    /// The local bare mirror of `url`, created if needed. Idempotent; the first call starts the
    /// URL's worker, whose first fetch begins at once (asynchronously), then polls. Until that
    /// fetch succeeds the mirror has no branches.
    pub fn track(&self, url: &str) -> Result<PathBuf, MirrorError> {
        validate(url)?;
        if url.starts_with("file://") && !self.inner.file_urls {
            return Err(MirrorError::FileUrlRefused { url: redact(url) });
        }
        let mut entries = lock(&self.inner.entries);
        if let Some(entry) = entries.get(url) {
            return Ok(entry.mirror.path.clone());
        }
        let shown = redact(url);
        let runtime =
            tokio::runtime::Handle::try_current().map_err(|_| MirrorError::NoRuntime { url: shown.clone() })?;
        let path = self.inner.dir.join(format!("{}.git", &hex::encode(Sha256::digest(url.as_bytes()))[..16]));
        if !path.join("HEAD").is_file() {
            std::fs::create_dir_all(&self.inner.dir).map_err(|source| MirrorError::Create {
                url: shown.clone(),
                path: self.inner.dir.clone(),
                source,
            })?;
            git2::Repository::init_bare(&path).map_err(|e| MirrorError::Init {
                url: shown.clone(),
                path: path.clone(),
                message: e.message().to_owned(),
            })?;
        }
        if url.starts_with("http://") && userinfo(url).is_some() {
            tracing::warn!(url = %shown, "the URL sends credentials over plain HTTP; use https://");
        }
        let mirror = Arc::new(Mirror {
            url: url.to_owned(),
            shown,
            path: path.clone(),
            pending: AtomicBool::new(true),
            wake: Notify::new(),
            untracked: AtomicBool::new(false),
            status: Mutex::new(MirrorStatus::default()),
        });
        let worker = runtime.spawn(run(
            mirror.clone(),
            self.inner.poll,
            self.inner.fetch_slots.clone(),
            self.inner.changes.clone(),
        ));
        tracing::info!(url = %mirror.shown, mirror = %path.display(), "tracking a remote repository");
        entries.insert(url.to_owned(), Entry { mirror, worker });
        Ok(path)
    }

    /// Asks for a fetch of `url` soon. Coalesced: while a fetch is queued, more calls add nothing;
    /// while one runs, all calls together queue one more. False when `url` is not tracked.
    pub fn fetch_soon(&self, url: &str) -> bool {
        let entries = lock(&self.inner.entries);
        let Some(entry) = entries.get(url) else {
            return false;
        };
        if !entry.mirror.pending.swap(true, Ordering::SeqCst) {
            entry.mirror.wake.notify_one();
        }
        true
    }

    /// Stops tracking `url`: no more fetches (a running one is aborted at its next progress
    /// report). The mirror stays on disk so that tracking it again is fast. False when not tracked.
    pub fn untrack(&self, url: &str) -> bool {
        let Some(entry) = lock(&self.inner.entries).remove(url) else {
            return false;
        };
        entry.mirror.untracked.store(true, Ordering::SeqCst);
        entry.worker.abort();
        tracing::info!(url = %entry.mirror.shown, "stopped tracking a remote repository");
        true
    }

    /// The tracked URLs, as given to [`Mirrors::track`] (they may hold credentials).
    pub fn tracked(&self) -> Vec<String> {
        lock(&self.inner.entries).keys().cloned().collect()
    }

    /// The mirror's fetch history, or `None` when `url` is not tracked.
    pub fn status(&self, url: &str) -> Option<MirrorStatus> {
        lock(&self.inner.entries).get(url).map(|e| lock(&e.mirror.status).clone())
    }

    /// The URLs (as tracked) whose branches a fetch changed, as they change.
    pub fn changes(&self) -> broadcast::Receiver<String> {
        self.inner.changes.subscribe()
    }
}

/// Whether an Application's `spec.repo` names a remote URL rather than a hosted repository.
pub fn is_url(repo: &str) -> bool {
    repo.contains("://")
}

/// libgit2's network timeouts are process-wide; they are set once, before the first fetch.
fn set_server_timeouts() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let ms = i32::try_from(SERVER_TIMEOUT.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: these write two libgit2 globals that only network transports read, and only
        // Mirrors' fetches use the network; `Once` runs this before any of them can start.
        let set = unsafe {
            git2::opts::set_server_connect_timeout_in_milliseconds(ms)
                .and_then(|()| git2::opts::set_server_timeout_in_milliseconds(ms))
        };
        if let Err(e) = set {
            tracing::warn!(error = %e, "cannot set libgit2's server timeouts; fetches rely on the overall timeout");
        }
    });
}

/// The worker of one URL: fetch when asked or when the poll interval has passed.
async fn run(mirror: Arc<Mirror>, poll: Duration, slots: Arc<Semaphore>, changes: broadcast::Sender<String>) {
    let mut last_start: Option<tokio::time::Instant> = None;
    loop {
        let jitter = poll.mul_f64(rand::random::<f64>() * 0.1);
        let deadline = tokio::time::Instant::now() + poll + jitter;
        // The flag, not the notification, says whether a fetch is due: a stale wake-up re-checks.
        while !mirror.pending.load(Ordering::SeqCst) {
            tokio::select! {
                () = mirror.wake.notified() => {}
                () = tokio::time::sleep_until(deadline) => break,
            }
        }
        if let Some(last) = last_start {
            tokio::time::sleep_until(last + MIN_FETCH_INTERVAL).await;
        }
        let Ok(_slot) = slots.acquire().await else {
            return;
        };
        last_start = Some(tokio::time::Instant::now());
        mirror.pending.store(false, Ordering::SeqCst);
        lock(&mirror.status).fetching = true;
        let started = Instant::now();
        let result = fetch(&mirror).await;
        let now = SystemTime::now();
        let mut status = lock(&mirror.status);
        status.fetching = false;
        status.fetches += 1;
        status.last_fetch = Some(now);
        match result {
            Ok(changed) => {
                crate::metrics::fetched(if changed { "changed" } else { "unchanged" }, started.elapsed());
                status.last_success = Some(now);
                status.last_error = None;
                drop(status);
                tracing::debug!(url = %mirror.shown, changed, elapsed = ?started.elapsed(), "fetched");
                if changed {
                    tracing::info!(url = %mirror.shown, elapsed = ?started.elapsed(), "fetched new commits");
                    let _ = changes.send(mirror.url.clone());
                }
            }
            Err(MirrorError::Cancelled { .. }) => return,
            Err(e) => {
                crate::metrics::fetched("failed", started.elapsed());
                status.last_error = Some(e.to_string());
                drop(status);
                tracing::warn!(url = %mirror.shown, error = %e, "fetch failed");
            }
        }
    }
}

/// Why a blocking fetch stopped early.
enum Failure {
    TooLarge,
    Stopped,
    Git(git2::Error),
}

/// One fetch on a blocking thread; `Ok(true)` when branches changed.
async fn fetch(mirror: &Arc<Mirror>) -> Result<bool, MirrorError> {
    let stop = Arc::new(AtomicBool::new(false));
    let deadline = Instant::now() + FETCH_TIMEOUT;
    let task = tokio::task::spawn_blocking({
        let (mirror, stop) = (mirror.clone(), stop.clone());
        move || {
            let stopped =
                || stop.load(Ordering::SeqCst) || mirror.untracked.load(Ordering::SeqCst) || Instant::now() > deadline;
            fetch_blocking(&mirror.path, &mirror.url, MAX_PACK_BYTES, &stopped)
        }
    });
    tokio::pin!(task);
    let joined = match tokio::time::timeout(FETCH_TIMEOUT, &mut task).await {
        Ok(joined) => joined,
        Err(_) => {
            // The transfer stops at its next progress report, or when the server timeout hits;
            // waiting for that keeps two fetches from ever writing the same mirror.
            stop.store(true, Ordering::SeqCst);
            let _ = task.await;
            return Err(MirrorError::Timeout { url: mirror.shown.clone(), timeout: FETCH_TIMEOUT });
        }
    };
    let shown = mirror.shown.clone();
    match joined {
        Ok(Ok(changed)) => Ok(changed),
        Ok(Err(Failure::TooLarge)) => Err(MirrorError::TooLarge { url: shown, limit: MAX_PACK_BYTES }),
        Ok(Err(Failure::Stopped)) if mirror.untracked.load(Ordering::SeqCst) => {
            Err(MirrorError::Cancelled { url: shown })
        }
        Ok(Err(Failure::Stopped)) => Err(MirrorError::Timeout { url: shown, timeout: FETCH_TIMEOUT }),
        Ok(Err(Failure::Git(e))) => Err(MirrorError::Fetch { url: shown, message: scrub(e.message(), &mirror.url) }),
        Err(e) => Err(MirrorError::Panicked { url: shown, message: scrub(&e.to_string(), &mirror.url) }),
    }
}

/// The branches of a repository and their commits.
fn heads(repo: &git2::Repository) -> BTreeMap<String, git2::Oid> {
    let mut heads = BTreeMap::new();
    if let Ok(refs) = repo.references_glob("refs/heads/*") {
        for r in refs.flatten() {
            if let (Some(name), Some(target)) = (r.name(), r.target()) {
                heads.insert(name.to_owned(), target);
            }
        }
    }
    heads
}

fn fetch_blocking(path: &Path, url: &str, max_bytes: usize, stopped: &dyn Fn() -> bool) -> Result<bool, Failure> {
    let repo = git2::Repository::open_bare(path).map_err(Failure::Git)?;
    let before = heads(&repo);
    let mut remote = repo.remote_anonymous(url).map_err(Failure::Git)?;
    let too_large = Cell::new(false);
    let mut callbacks = git2::RemoteCallbacks::new();
    callbacks.transfer_progress(|progress| {
        if progress.received_bytes() > max_bytes {
            too_large.set(true);
            return false;
        }
        !stopped()
    });
    callbacks.sideband_progress(|_| !stopped());
    let mut offered = false;
    let credentials =
        userinfo(url).and_then(|(user, password)| Some((percent_decode(user), percent_decode(password?))));
    callbacks.credentials(move |_, _, allowed| match &credentials {
        // libgit2 asks again after a rejection: offer the URL's credentials once.
        Some((user, password)) if !offered && allowed.contains(git2::CredentialType::USER_PASS_PLAINTEXT) => {
            offered = true;
            git2::Cred::userpass_plaintext(&String::from_utf8_lossy(user), &String::from_utf8_lossy(password))
        }
        Some(_) if offered => {
            Err(git2::Error::from_str("the server refused the credentials in the URL: check the user and token"))
        }
        _ => Err(git2::Error::from_str(
            "the server asks for credentials: put a user and token in the URL (https://user:token@host/org/repo.git)",
        )),
    });
    let mut options = git2::FetchOptions::new();
    options
        .remote_callbacks(callbacks)
        .prune(git2::FetchPrune::On)
        .download_tags(git2::AutotagOption::None)
        .update_fetchhead(false);
    remote.fetch(&[REFSPEC], Some(&mut options), Some("gitplane: mirror fetch")).map_err(|e| {
        if too_large.get() {
            Failure::TooLarge
        } else if stopped() {
            Failure::Stopped
        } else {
            Failure::Git(e)
        }
    })?;
    drop(remote);
    Ok(heads(&repo) != before)
}

/// Accepts https://host/…, http://host/… and file:///…, nothing else.
fn validate(url: &str) -> Result<(), MirrorError> {
    let unsupported = || MirrorError::UnsupportedUrl { url: redact(url) };
    if url.len() > MAX_URL_LEN || url.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(unsupported());
    }
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(unsupported());
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    let path = &rest[authority.len()..];
    let ok = match scheme {
        "https" | "http" => !host.is_empty() && !host.starts_with(':'),
        "file" => authority.is_empty() && path.len() > 1,
        _ => false,
    };
    if ok { Ok(()) } else { Err(unsupported()) }
}

/// The user and password of a URL's authority, when it has them.
fn userinfo(url: &str) -> Option<(&str, Option<&str>)> {
    let (_, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let (info, _) = authority.rsplit_once('@')?;
    Some(match info.split_once(':') {
        Some((user, password)) => (user, Some(password)),
        None => (info, None),
    })
}

/// The URL with its credentials and query hidden: `https://user:***@host/path`. A user without
/// a password is hidden too (tokens are often passed as the user: `https://TOKEN@host/…`).
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.split(['?', '#']).next().unwrap_or("").to_owned();
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let authority = match authority.rsplit_once('@') {
        Some((info, host)) => match info.split_once(':') {
            Some((user, _)) => format!("{user}:***@{host}"),
            None => format!("***@{host}"),
        },
        None => authority.to_owned(),
    };
    let tail = match tail.split_once('?') {
        Some((path, _)) => format!("{path}?***"),
        None => tail.split('#').next().unwrap_or("").to_owned(),
    };
    format!("{scheme}://{authority}{tail}")
}

/// `message` with every trace of `url`'s credentials replaced.
fn scrub(message: &str, url: &str) -> String {
    let mut out = message.replace(url, &redact(url));
    if let Some((user, password)) = userinfo(url) {
        let secrets = match password {
            Some(password) => {
                vec![password.to_owned(), String::from_utf8_lossy(&percent_decode(password)).into_owned()]
            }
            None => vec![user.to_owned(), String::from_utf8_lossy(&percent_decode(user)).into_owned()],
        };
        for secret in secrets {
            if !secret.is_empty() {
                out = out.replace(&secret, "***");
            }
        }
    }
    out
}

/// Decodes `%XX` escapes (and nothing else); malformed escapes stay as they are.
pub fn percent_decode(s: &str) -> Vec<u8> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(hex) = bytes.get(i + 1..i + 3)
            && let Ok(hex) = std::str::from_utf8(hex)
            && let Ok(byte) = u8::from_str_radix(hex, 16)
        {
            out.push(byte);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A bare "upstream" repository to mirror, changed with git2.
    pub(crate) struct Upstream {
        pub dir: tempfile::TempDir,
    }

    impl Upstream {
        pub fn new() -> Upstream {
            let dir = tempfile::tempdir().unwrap();
            git2::Repository::init_bare(dir.path().join("upstream.git")).unwrap();
            Upstream { dir }
        }

        pub fn path(&self) -> PathBuf {
            self.dir.path().join("upstream.git")
        }

        pub fn url(&self) -> String {
            format!("file://{}", self.path().display())
        }

        /// A new commit on `branch` with one file; returns its id.
        pub fn commit(&self, branch: &str, content: &str) -> git2::Oid {
            let repo = git2::Repository::open_bare(self.path()).unwrap();
            let mut tree = repo.treebuilder(None).unwrap();
            tree.insert("cm.yaml", repo.blob(content.as_bytes()).unwrap(), 0o100644).unwrap();
            let tree = repo.find_tree(tree.write().unwrap()).unwrap();
            let sig = git2::Signature::now("t", "t@localhost").unwrap();
            let name = format!("refs/heads/{branch}");
            let parent = repo.find_reference(&name).ok().and_then(|r| r.peel_to_commit().ok());
            let parents: Vec<&git2::Commit> = parent.iter().collect();
            repo.commit(Some(&name), &sig, &sig, "change", &tree, &parents).unwrap()
        }
    }

    pub(crate) fn head_of(mirror: &Path, branch: &str) -> Option<git2::Oid> {
        let repo = git2::Repository::open_bare(mirror).ok()?;
        repo.find_reference(&format!("refs/heads/{branch}")).ok()?.target()
    }

    /// Polls `condition` until it holds or `timeout` passes.
    pub(crate) async fn wait_for(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if condition() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        condition()
    }

    /// Waits until no fetch is due or running, then returns the number of fetches done.
    pub(crate) async fn settled_fetches(mirrors: &Mirrors, url: &str) -> u64 {
        let idle = || {
            let entries = lock(&mirrors.inner.entries);
            let mirror = &entries[url].mirror;
            !mirror.pending.load(Ordering::SeqCst) && !lock(&mirror.status).fetching
        };
        assert!(wait_for(Duration::from_secs(30), idle).await, "the mirror never became idle");
        mirrors.status(url).unwrap().fetches
    }

    const LONG: Duration = Duration::from_secs(3600);

    #[tokio::test]
    async fn t10_mirrors_a_file_url_and_follows_new_commits_and_deleted_branches() {
        let upstream = Upstream::new();
        let first = upstream.commit("main", "a");
        upstream.commit("old", "x");
        let data = tempfile::tempdir().unwrap();
        let mirrors = Mirrors::new(data.path().join("mirrors"), LONG, true);
        let mut changes = mirrors.changes();
        let url = upstream.url();
        let path = mirrors.track(&url).unwrap();
        assert_eq!(mirrors.track(&url).unwrap(), path, "tracking is idempotent");
        assert!(path.starts_with(data.path().join("mirrors")) && path.extension().is_some_and(|e| e == "git"));
        assert!(wait_for(Duration::from_secs(30), || head_of(&path, "main") == Some(first)).await);
        assert_eq!(changes.recv().await.unwrap(), url);
        assert!(!path.join("cm.yaml").exists(), "a mirror is bare, never checked out");

        let second = upstream.commit("main", "b");
        let repo = git2::Repository::open_bare(upstream.path()).unwrap();
        repo.find_reference("refs/heads/old").unwrap().delete().unwrap();
        assert!(mirrors.fetch_soon(&url));
        assert!(wait_for(Duration::from_secs(30), || head_of(&path, "main") == Some(second)).await);
        assert!(
            wait_for(Duration::from_secs(30), || head_of(&path, "old").is_none()).await,
            "deleted branches are pruned"
        );
        assert_eq!(changes.recv().await.unwrap(), url);
        let status = mirrors.status(&url).unwrap();
        assert!(status.last_success.is_some() && status.last_error.is_none(), "{status:?}");

        assert!(mirrors.untrack(&url));
        assert!(!mirrors.fetch_soon(&url), "an untracked URL is not fetched");
        assert!(mirrors.status(&url).is_none() && mirrors.tracked().is_empty());
    }

    #[tokio::test]
    async fn t10_polling_fetches_without_being_asked() {
        let upstream = Upstream::new();
        upstream.commit("main", "a");
        let data = tempfile::tempdir().unwrap();
        let mirrors = Mirrors::new(data.path().to_path_buf(), Duration::from_millis(100), true);
        let url = upstream.url();
        let path = mirrors.track(&url).unwrap();
        assert!(wait_for(Duration::from_secs(30), || head_of(&path, "main").is_some()).await);
        let next = upstream.commit("main", "b");
        assert!(wait_for(Duration::from_secs(30), || head_of(&path, "main") == Some(next)).await);
    }

    #[tokio::test]
    async fn t10_a_burst_of_fetch_requests_costs_at_most_two_fetches() {
        let upstream = Upstream::new();
        upstream.commit("main", "a");
        let data = tempfile::tempdir().unwrap();
        let mirrors = Mirrors::new(data.path().to_path_buf(), LONG, true);
        let url = upstream.url();
        mirrors.track(&url).unwrap();
        let before = settled_fetches(&mirrors, &url).await;
        assert_eq!(before, 1, "tracking fetches once");
        for _ in 0..50 {
            assert!(mirrors.fetch_soon(&url));
        }
        let after = settled_fetches(&mirrors, &url).await;
        // Sleeping proves that nothing more happens.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let fetches = mirrors.status(&url).unwrap().fetches - before;
        println!("a burst of 50 fetch requests: {fetches} fetch(es)");
        assert!((1..=2).contains(&fetches), "{fetches} fetches");
        assert_eq!(mirrors.status(&url).unwrap().fetches, after);
    }

    #[tokio::test]
    async fn t10_an_unreachable_url_fails_without_showing_its_credentials() {
        let data = tempfile::tempdir().unwrap();
        let mirrors = Mirrors::new(data.path().to_path_buf(), LONG, true);
        // Port 1 on loopback: nothing listens there, the connection is refused at once.
        let url = "https://alice:s3cr3t-t0ken@127.0.0.1:1/org/repo.git";
        mirrors.track(url).unwrap();
        assert!(wait_for(Duration::from_secs(30), || mirrors.status(url).is_some_and(|s| s.fetches >= 1)).await);
        let error = mirrors.status(url).unwrap().last_error.unwrap();
        assert!(error.contains("https://alice:***@127.0.0.1:1/org/repo.git"), "{error}");
        assert!(!error.contains("s3cr3t"), "{error}");

        let refused = mirrors.track("ssh://bob:hunter2@example.com/repo.git").unwrap_err().to_string();
        assert!(refused.contains("ssh://bob:***@example.com/repo.git") && !refused.contains("hunter2"), "{refused}");
        for bad in ["repo", "/srv/repo.git", "git://host/repo", "https://", "file://host/x", "https://h/a b"] {
            assert!(matches!(mirrors.track(bad), Err(MirrorError::UnsupportedUrl { .. })), "{bad}");
        }
    }

    #[tokio::test]
    async fn t10_file_urls_are_refused_unless_allowed() {
        let data = tempfile::tempdir().unwrap();
        let refusing = Mirrors::new(data.path().join("a"), LONG, false);
        let refused = refusing.track("file:///etc/some-repo.git").unwrap_err();
        assert!(matches!(refused, MirrorError::FileUrlRefused { .. }), "{refused}");
        assert!(refused.to_string().contains("--allow-file-urls"), "{refused}");
        let allowing = Mirrors::new(data.path().join("b"), LONG, true);
        assert!(allowing.track("file:///etc/some-repo.git").is_ok());
    }

    #[test]
    fn t10_redaction() {
        for (url, shown) in [
            ("https://u:p@h.example/o/r.git", "https://u:***@h.example/o/r.git"),
            ("https://ghp_token@github.com/o/r", "https://***@github.com/o/r"),
            ("https://h/o/r.git?private_token=x", "https://h/o/r.git?***"),
            ("http://h:8080/r", "http://h:8080/r"),
            ("https://u:p%40ss@h", "https://u:***@h"),
            ("file:///srv/r.git", "file:///srv/r.git"),
        ] {
            assert_eq!(redact(url), shown);
        }
        let url = "https://u:p%40ss-word@h/r";
        assert_eq!(
            scrub("cannot reach https://u:p%40ss-word@h/r (p@ss-word)", url),
            "cannot reach https://u:***@h/r (***)"
        );
        assert_eq!(percent_decode("a%20b%zz%4"), b"a b%zz%4");
    }
}
