//! The source controller: turns each Application's branch head into stored objects, and keeps
//! them there.
//!
//! A push (the repository's refs change, seen through inotify), a change of an Application, a
//! change of an object it applied, or the periodic resync queues the Application. A sync reads
//! the commit (gitplane-source: Git object database, templates, strict validation), plans the
//! whole commit as one transaction ([`apply`]: three-way merge, prune by inventory, the
//! empty-render guard) and commits it. Any error rejects the commit whole; the last good revision
//! stays applied and the status says why. Objects changed outside Git are put back and an Event
//! says so. An Application with `dependsOn` waits until those are synced and healthy; its
//! health (`gitplane_api::health`) is the worst of its objects'.

pub mod allocate;
pub mod apply;
pub mod autoscale;
pub mod hooks;
pub mod planned;
pub mod podsecurity;
mod push;
pub mod reach;
mod staged;
pub mod verdict;

use crate::mirror::{self, MirrorStatus, Mirrors, is_url};
use futures::{Stream, StreamExt, stream};
use gitplane_api::events::{NORMAL, Source, WARNING};
use gitplane_api::health::{self, Health};
use gitplane_api::{
    Application, ApplicationStatus, HealthStatus, ResourceHealth, RevisionHistory, SyncChanges, SyncStatus,
    kinds::{accepted, stored},
    object::{APPLICATION_ANNOTATION, kind_of, resource_version},
};
use gitplane_source::{AppSource, Limits, LoadError, ManifestError, SourceCache, Validator};
use gitplane_store::{
    Api, EventType, ObjectKey, Op, Store, StoreError, deletion,
    events::Recorder,
    informer::{Cache, Informer, Notification},
};
use gitplane_workqueue::{
    Backoff, WorkQueue,
    runner::{self, Reconcile, Requeue},
};
use k8s_openapi::api::{
    apps::v1::ReplicaSet,
    core::v1::{Namespace, Node, ObjectReference},
};
use notify::Watcher;
use serde_json::Value;
use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    path::{Path, PathBuf},
    sync::Arc,
    task::Poll,
    time::{Duration, Instant},
};
use tokio::sync::{
    Notify,
    broadcast::{self, error::RecvError},
    mpsc,
};

/// A warning about one object of a commit, and the reason of its Event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Warning {
    pub key: ObjectKey,
    pub reason: &'static str,
    pub message: String,
}

/// How often a transaction is retried when a concurrent writer moved an object between planning
/// and committing.
const CONFLICT_RETRIES: usize = 5;
/// Applied revisions kept in an Application's status.
const HISTORY: usize = 10;
/// Unhealthy objects listed in an Application's health: the status of an Application of
/// thousands of objects must stay a small object (and far below the store's size limit).
const MAX_LISTED_RESOURCES: usize = 50;
/// Health is assessed at most this often per burst of changes.
const HEALTH_DEBOUNCE: Duration = Duration::from_millis(200);
/// Retries of a sync that failed for a reason that may heal by itself (the store, the disk):
/// 1 s, doubling, at most 5 minutes.
const RETRY_MIN: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(300);
/// How often a sync in steps looks again at the step it waits for.
const STEP_POLL: Duration = Duration::from_secs(1);

/// Why an Application is queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Reason {
    /// A new commit may be there: sync it unless it was already handled.
    Commit,
    /// Objects may differ from Git (drift, a resync): plan again even for the same commit.
    Reconcile,
}

/// A queued Reconcile is never lost to a Commit request: it does all a Commit does, and more.
impl gitplane_workqueue::Reason for Reason {
    fn merge(first: Self, second: Self) -> Self {
        first.max(second)
    }
}

type Queue = WorkQueue<ObjectKey, Reason>;

pub struct SourceController {
    store: Arc<dyn Store>,
    repos: Repos,
    record_key: apply::RecordKey,
    service_ranges: allocate::ServiceRanges,
    validator: Arc<Validator>,
    limits: Limits,
    resync: Duration,
    /// Each Application's parsed and validated files, by blob: a commit re-reads only changes.
    caches: std::sync::Mutex<HashMap<ObjectKey, SourceCache>>,
    /// What each Application owns and applied last (see [`apply::Inventory`]).
    inventories: std::sync::Mutex<HashMap<ObjectKey, apply::Inventory>>,
    /// The push verdicts' plans of the commits they accepted (see [`planned`]).
    plans: Arc<planned::Plans>,
    /// How far each sync in steps (hooks, waves) is.
    staging: std::sync::Mutex<HashMap<ObjectKey, staged::Staging>>,
    /// Synced, SyncFailed, Pruned and DriftCorrected.
    events: Recorder,
}

/// Why a sync did not apply a commit.
#[derive(Debug, thiserror::Error)]
enum SyncError {
    #[error("{0}")]
    Source(#[from] gitplane_source::SourceError),
    #[error("the commit has {} error(s)", .0.len())]
    Invalid(Vec<ManifestError>),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    Spec(String),
    /// Something that may heal by itself (a concurrent writer, a mirror's fetch, the disk).
    #[error("{0}")]
    Transient(String),
    /// A hook failed, or could not be created.
    #[error("{0}")]
    Hook(String),
}

impl SyncError {
    /// Whether this is the verdict on the commit (with this spec): its content or the
    /// Application's settings are wrong, so trying the same commit again can only fail again.
    /// Anything else is retried with back-off.
    fn is_verdict(&self) -> bool {
        match self {
            SyncError::Invalid(_) | SyncError::Spec(_) | SyncError::Hook(_) => true,
            SyncError::Source(e) => !e.is_transient(),
            SyncError::Store(_) | SyncError::Transient(_) => false,
        }
    }
}

/// What a sync asks of the loop.
struct SyncOutcome {
    /// The Application's health may have changed.
    assess_health: bool,
    /// It failed for a reason that may heal by itself: retry with back-off.
    retry: bool,
    /// `Synced` (a commit applied), `Unchanged`, `Waiting` (for dependencies), `Progressing`
    /// (a sync in steps waits for one) or `Failed`.
    result: &'static str,
    /// Look again after this long (a sync in steps).
    again: Option<Duration>,
}

/// The part of a plan one wave commits: which objects, and whether to prune.
type Part<'a> = (&'a (dyn Fn(&ObjectKey) -> bool + Sync), bool);

/// What a sync of a commit came to.
enum Synced {
    /// Nothing to do.
    Nothing,
    Applied(Box<Applied>),
    /// A sync in steps waits for one of them: why.
    Stepping(String),
}

/// `first` and every path already waiting in the channel.
fn drain(pushed: &mut mpsc::UnboundedReceiver<PathBuf>, first: PathBuf) -> HashSet<PathBuf> {
    let mut paths = HashSet::from([first]);
    while let Ok(p) = pushed.try_recv() {
        paths.insert(p);
    }
    paths
}

/// `namespace/name` of an Application: the value of the inventory annotation.
fn app_id(app: &Application) -> String {
    format!("{}/{}", app.metadata.namespace.as_deref().unwrap_or(""), app.metadata.name.as_deref().unwrap_or(""))
}

fn app_key(app: &Application) -> ObjectKey {
    ObjectKey::of::<Application>(
        app.metadata.namespace.as_deref().unwrap_or(""),
        app.metadata.name.as_deref().unwrap_or(""),
    )
}

/// The Application named by an inventory annotation.
fn owner_key(annotation: &str) -> Option<ObjectKey> {
    let (ns, name) = annotation.split_once('/')?;
    Some(ObjectKey::of::<Application>(ns, name))
}

fn now() -> k8s_openapi::jiff::Timestamp {
    k8s_openapi::jiff::Timestamp::now()
}

fn rfc3339() -> String {
    now().round(k8s_openapi::jiff::Unit::Second).map(|t| t.to_string()).unwrap_or_default()
}

/// The kinds the source reads from the cache: what it applies, and what health looks at.
pub fn watched_kinds() -> Vec<String> {
    let mut kinds: Vec<String> = stored().map(|k| k.group_kind()).collect();
    kinds.push(kind_of::<Node>());
    kinds.push(kind_of::<ReplicaSet>());
    kinds
}

/// Where Applications' repositories are: hosted ones in a directory, remote ones mirrored.
#[derive(Clone)]
struct Repos {
    dir: PathBuf,
    mirrors: Mirrors,
}

impl Repos {
    /// The bare repository an Application reads: a hosted one (`demo` for repos/demo.git) or the
    /// local mirror of a remote URL. `Ok(None)` while a new mirror has not fetched yet. Touches
    /// the filesystem (and may make an empty repository): call it off the async runtime.
    fn path(&self, repo: &str) -> Result<Option<PathBuf>, SyncError> {
        if is_url(repo) {
            if repo.split_once("://").is_some_and(|(_, rest)| rest.split('/').next().is_some_and(|a| a.contains('@'))) {
                return Err(SyncError::Spec(format!(
                    "spec.repo {} holds credentials: they would be stored and shown with the Application; \
                     use a URL without user or password",
                    mirror::redact(repo)
                )));
            }
            let path = self.mirrors.track(repo).map_err(|e| SyncError::Spec(e.to_string()))?;
            return match self.mirrors.status(repo) {
                Some(status) if status.last_success.is_some() => Ok(Some(path)),
                Some(MirrorStatus { last_error: Some(error), .. }) => Err(SyncError::Transient(error)),
                _ => Ok(None),
            };
        }
        let plain = !repo.is_empty() && repo.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if !plain || repo.starts_with('.') {
            return Err(SyncError::Spec(format!(
                "spec.repo {repo:?} is neither a hosted repository's name (like `demo` for repos/demo.git) nor a URL"
            )));
        }
        let path = self.dir.join(format!("{repo}.git"));
        if !path.exists() {
            // An Application names a hosted repository that does not exist yet: make it empty, so
            // its first push has somewhere to go.
            crate::bootstrap::empty_repo(&self.dir, repo).map_err(|e| SyncError::Transient(format!("{e:#}")))?;
            tracing::info!(%repo, "created an empty hosted repository");
        }
        Ok(Some(path))
    }

    /// [`Repos::path`] on a blocking thread.
    async fn path_blocking(&self, repo: &str) -> Result<Option<PathBuf>, SyncError> {
        let (repos, repo) = (self.clone(), repo.to_owned());
        tokio::task::spawn_blocking(move || repos.path(&repo))
            .await
            .unwrap_or_else(|e| Err(SyncError::Transient(format!("finding the repository failed: {e}"))))
    }
}

/// The Applications as the cache has them, indexed by the repository they name and by the
/// namespace their objects go to. Kept from the Applications' events, each read as JSON: the
/// status writes of a push's thousand syncs decode nothing here.
#[derive(Default)]
struct Registry {
    /// Each Application's `spec.repo` and default namespace.
    all: BTreeMap<ObjectKey, (String, String)>,
    /// `spec.repo` -> its Applications.
    by_repo: HashMap<String, BTreeSet<ObjectKey>>,
    /// Default namespace -> the Applications whose workloads go there.
    by_namespace: HashMap<String, BTreeSet<ObjectKey>>,
    /// A hosted repository's path -> its name in `spec.repo`.
    paths: HashMap<PathBuf, String>,
}

impl Registry {
    fn of(apps: &[Arc<Value>]) -> Registry {
        let mut registry = Registry::default();
        for app in apps {
            if let Ok(key) = ObjectKey::from_value(app) {
                registry.set(key, app);
            }
        }
        registry
    }

    /// Records an Application; whether its repository or namespace changed (or it is new).
    fn set(&mut self, key: ObjectKey, app: &Value) -> bool {
        let repo = app["spec"]["repo"].as_str().unwrap_or("");
        let namespace = app["spec"]["namespace"].as_str().unwrap_or(gitplane_api::object::DEFAULT_NAMESPACE);
        if self.all.get(&key).is_some_and(|(r, n)| r == repo && n == namespace) {
            return false;
        }
        self.remove(&key);
        self.by_repo.entry(repo.to_owned()).or_default().insert(key.clone());
        self.by_namespace.entry(namespace.to_owned()).or_default().insert(key.clone());
        self.all.insert(key, (repo.to_owned(), namespace.to_owned()));
        true
    }

    /// Forgets an Application; whether it was known.
    fn remove(&mut self, key: &ObjectKey) -> bool {
        let Some((repo, namespace)) = self.all.remove(key) else { return false };
        for (index, value) in [(&mut self.by_repo, repo), (&mut self.by_namespace, namespace)] {
            if let Some(keys) = index.get_mut(&value) {
                keys.remove(key);
                if keys.is_empty() {
                    index.remove(&value);
                }
            }
        }
        true
    }

    /// The Applications of the hosted repository at `path`.
    fn by_path(&self, path: &Path) -> impl Iterator<Item = &ObjectKey> {
        self.paths.get(path).and_then(|repo| self.by_repo.get(repo)).into_iter().flatten()
    }
}

impl SourceController {
    /// Syncs commit the push verdicts' plans left in `plans` (see [`planned`]).
    pub fn with_plans(mut self, plans: Arc<planned::Plans>) -> Self {
        self.plans = plans;
        self
    }

    /// How the syncs used the push verdicts' plans.
    pub fn plan_stats(&self) -> planned::PlanStats {
        self.plans.stats()
    }

    /// Services get their addresses and nodePorts from `ranges`.
    pub fn with_service_ranges(mut self, ranges: allocate::ServiceRanges) -> Self {
        self.service_ranges = ranges;
        self
    }

    pub fn new(store: Arc<dyn Store>, repos_dir: PathBuf, mirrors: Mirrors, record_key: apply::RecordKey) -> Self {
        SourceController {
            repos: Repos { dir: repos_dir, mirrors },
            record_key,
            service_ranges: allocate::ServiceRanges::default(),
            validator: Arc::new(Validator::new()),
            limits: Limits::default(),
            resync: Duration::from_secs(60),
            caches: Default::default(),
            inventories: Default::default(),
            plans: Default::default(),
            staging: Default::default(),
            events: Recorder::spawn(store.clone(), Source::component("gitplane-source")),
            store,
        }
    }

    /// Runs over `informer`, which caches at least [`watched_kinds`].
    pub async fn run(self, informer: Informer) {
        let notifications = informer.notifications();
        informer.wait_synced().await;
        let (pushed_tx, pushed) = mpsc::unbounded_channel::<PathBuf>();
        let health_due = Arc::new(Notify::new());
        let inputs = inputs(notifications, pushed, self.repos.mirrors.changes(), self.resync, health_due.clone());
        let queue = Queue::new(Backoff { initial: RETRY_MIN, max: RETRY_MAX }).named("source");
        let handler = SourceLoop {
            source: self,
            informer,
            pushed: pushed_tx,
            watchers: HashMap::new(),
            registry: Registry::default(),
            unhealthy: BTreeSet::new(),
            health_due,
            generations: HashMap::new(),
            moved: HashMap::new(),
        };
        runner::run(handler, queue, inputs).await;
    }

    /// One sync of one Application; the outcome goes to its status, Events and the log. Whether
    /// the Application's health may have changed: its sync status did, or objects with a
    /// health rule were written.
    async fn sync(&self, app: &Application, reason: Reason, informer: &Informer) -> SyncOutcome {
        let id = app_id(app);
        tracing::debug!(application = %id, ?reason, "sync started");
        let last = app.status.as_ref().and_then(|s| s.sync.clone()).unwrap_or_default();
        if let Some(waiting) = self.unmet_dependencies(app, informer.cache()) {
            if last.message.as_deref() != Some(waiting.as_str()) {
                self.update_status(app, |s| {
                    let sync = s.sync.get_or_insert_with(Default::default);
                    sync.status = "OutOfSync".into();
                    sync.message = Some(waiting.clone());
                })
                .await;
            }
            return SyncOutcome { assess_health: true, retry: false, result: "Waiting", again: None };
        }
        let started = Instant::now();
        let started_at = rfc3339();
        let outcome = self.sync_commit(app, &last, reason, informer, (started, &started_at)).await;
        let elapsed = started.elapsed();
        match outcome {
            Ok(Synced::Nothing) => SyncOutcome { assess_health: false, retry: false, result: "Unchanged", again: None },
            Ok(Synced::Stepping(why)) => {
                tracing::debug!(application = %id, %why, "sync in steps");
                if last.message.as_deref() != Some(why.as_str()) || last.status != "OutOfSync" {
                    self.update_status(app, |s| {
                        let sync = s.sync.get_or_insert_with(Default::default);
                        sync.status = "OutOfSync".into();
                        sync.message = Some(why.clone());
                    })
                    .await;
                }
                SyncOutcome { assess_health: true, retry: false, result: "Progressing", again: Some(STEP_POLL) }
            }
            Ok(Synced::Applied(applied)) => {
                tracing::debug!(application = %id, commit = %applied.commit.id, "applied");
                tracing::info!(application = %id, commit = %applied.commit.id, created = applied.plan.created,
                    updated = applied.plan.updated, pruned = applied.plan.pruned,
                    drift = applied.plan.drifted.len(), verdict_plan = applied.verdict_plan, ?elapsed, "synced");
                let commit = short(&applied.commit.id);
                for key in &applied.plan.drifted {
                    let message = format!("{key} was changed outside Git; restored to commit {commit}");
                    self.record_event(key, informer.cache(), WARNING, "DriftCorrected", &message);
                }
                let new_revision = last.revision.as_deref() != Some(applied.commit.id.as_str());
                let plan = &applied.plan;
                if new_revision || plan.created + plan.updated + plan.pruned > 0 {
                    let message = format!(
                        "synced commit {commit}: {} created, {} updated, {} pruned",
                        plan.created, plan.updated, plan.pruned
                    );
                    self.record_event(&app_key(app), informer.cache(), NORMAL, "Synced", &message);
                    for warning in &plan.warnings {
                        self.record_event(&warning.key, informer.cache(), WARNING, warning.reason, &warning.message);
                    }
                }
                let pruned: Vec<String> = plan
                    .ops
                    .iter()
                    .filter_map(|op| match op {
                        Op::Delete { key, .. } => Some(key.to_string()),
                        _ => None,
                    })
                    .collect();
                if !pruned.is_empty() {
                    let message = format!("pruned what commit {commit} no longer has: {}", pruned.join(", "));
                    self.record_event(&app_key(app), informer.cache(), NORMAL, "Pruned", &message);
                }
                let assess_health = health_may_change(&last, &applied.plan);
                if !applied.status_written {
                    // Written with the sync status: a Synced status beside the health of the
                    // last commit would say Healthy before anything of this one ran (and
                    // dependsOn would go). The cache holds this sync's writes already.
                    let health = assess_health.then(|| app_health(app, true, informer.cache()));
                    let duration = Some(elapsed.as_millis() as u64);
                    let (commit, plan) = (&applied.commit, &applied.plan);
                    self.update_status(app, |s| synced(s, commit, plan, health.as_ref(), &started_at, duration)).await;
                }
                tracing::debug!(application = %id, commit = %applied.commit.id, "status written");
                SyncOutcome { assess_health, retry: false, result: "Synced", again: None }
            }
            Err((commit, e)) => {
                let errors: Vec<String> = match &e {
                    SyncError::Invalid(errors) => errors.iter().map(ToString::to_string).collect(),
                    other => vec![other.to_string()],
                };
                tracing::error!(application = %id, commit = commit.as_deref().unwrap_or("-"),
                    "commit rejected, {} stays applied:\n  {}", last.revision.as_deref().unwrap_or("nothing"), errors.join("\n  "));
                let message = format!(
                    "commit {} rejected: {} error(s), the first: {}",
                    commit.as_deref().map(short).unwrap_or("-"),
                    errors.len(),
                    errors.first().map(String::as_str).unwrap_or("")
                );
                self.record_event(&app_key(app), informer.cache(), WARNING, "SyncFailed", &message);
                // The verdict on a commit is final: it is not tried again until a new commit or
                // spec comes. Anything else is retried with back-off.
                let verdict = e.is_verdict();
                let attempted = if verdict { commit } else { None };
                self.update_status(app, |s| {
                    let sync = s.sync.get_or_insert_with(Default::default);
                    sync.status = "Failed".into();
                    sync.attempted_revision = attempted.clone();
                    sync.errors = errors.clone();
                    sync.message = None;
                    sync.started_at = Some(started_at.clone());
                    sync.finished_at = Some(rfc3339());
                    sync.duration_ms = Some(elapsed.as_millis() as u64);
                })
                .await;
                SyncOutcome { assess_health: true, retry: !verdict, result: "Failed", again: None }
            }
        }
    }

    /// Why this Application must wait, if it must: a dependency not yet synced and healthy.
    fn unmet_dependencies(&self, app: &Application, cache: &Cache) -> Option<String> {
        let ns = app.metadata.namespace.as_deref().unwrap_or("");
        for dep in &app.spec.depends_on {
            let Some(other) = cache.get_typed::<Application>(ns, dep) else {
                return Some(format!("waiting for Application {ns}/{dep}, which does not exist"));
            };
            let status = other.status.unwrap_or_default();
            let synced = status.sync.as_ref().is_some_and(|s| s.status == "Synced");
            let health = status.health.as_ref().map_or("Unknown", |h| h.status.as_str()).to_owned();
            if !synced || health != "Healthy" {
                let sync = status.sync.map_or("not synced".to_owned(), |s| s.status);
                return Some(format!(
                    "waiting for Application {ns}/{dep} to be Synced and Healthy (it is {sync}, {health})"
                ));
            }
        }
        None
    }

    /// Applies the branch head; `Ok(None)` when there was nothing to do.
    async fn sync_commit(
        &self,
        app: &Application,
        last: &SyncStatus,
        reason: Reason,
        informer: &Informer,
        (started, started_at): (Instant, &str),
    ) -> Result<Synced, (Option<String>, SyncError)> {
        let Some(repo) = self.repos.path_blocking(&app.spec.repo).await.map_err(|e| (None, e))? else {
            return Ok(Synced::Nothing); // the mirror's first fetch is still running; its change will queue us
        };
        // The Application's cache keeps its repository open and the outcome of every file.
        let key = app_key(app);
        let cache = self.caches.lock().unwrap_or_else(|e| e.into_inner()).remove(&key).unwrap_or_default();
        let branch = app.spec.branch.clone();
        let (head, mut cache) = tokio::task::spawn_blocking(move || {
            let mut cache = cache;
            (cache.read_head(&repo, &branch), cache)
        })
        .await
        .map_err(|e| (None, SyncError::Transient(format!("reading the repository failed: {e}"))))?;
        let head = match head {
            Ok(head) => head,
            Err(e) => {
                self.caches.lock().unwrap_or_else(|e| e.into_inner()).insert(key, cache);
                return Err((None, e.into()));
            }
        };
        let handled = last.attempted_revision.as_deref() == Some(head.id.as_str());
        if handled && (reason == Reason::Commit || last.status == "Failed") {
            self.caches.lock().unwrap_or_else(|e| e.into_inner()).insert(key, cache);
            return Ok(Synced::Nothing);
        }
        let commit = CommitInfo { id: head.id.clone(), subject: head.subject.clone() };
        let fail = |e: SyncError| (Some(commit.id.clone()), e);
        // The push verdict of this commit loaded it (and planned it) already.
        let verdict = (reason == Reason::Commit).then(|| self.plans.take(&key, &head.id, &app.spec)).flatten();
        let (manifests, verdict_plan) = match verdict {
            Some(planned) => {
                self.caches.lock().unwrap_or_else(|e| e.into_inner()).insert(key.clone(), cache);
                (planned.manifests, Some((planned.plan, planned.changes)))
            }
            None => {
                // Only the files that changed since the last load are rendered and validated again.
                let (source, validator, limits) =
                    (AppSource::from_spec(&app.spec), self.validator.clone(), self.limits.clone());
                let (loaded, cache) = tokio::task::spawn_blocking(move || {
                    let loaded = gitplane_source::load_commit(&head, &source, &validator, &limits, &mut cache);
                    (loaded, cache)
                })
                .await
                .map_err(|e| fail(SyncError::Transient(format!("loading the commit failed: {e}"))))?;
                self.caches.lock().unwrap_or_else(|e| e.into_inner()).insert(key.clone(), cache);
                let manifests = loaded.map_err(|e| match e {
                    LoadError::Invalid(errors) => fail(SyncError::Invalid(errors)),
                    LoadError::Source(e) => fail(e.into()),
                })?;
                (manifests, None)
            }
        };
        tracing::debug!(application = %app_id(app), commit = %commit.id, manifests = manifests.len(), "commit loaded");
        let mut inventory = self.inventories.lock().unwrap_or_else(|e| e.into_inner()).remove(&key).unwrap_or_default();
        if reason == Reason::Reconcile {
            inventory.distrust();
        }
        // The status goes into the transaction of the objects (one write per sync) unless the
        // health of the new objects must be read back first, or the plan writes this
        // Application itself.
        let status = |plan: &apply::Plan, current: &Application| -> Option<Application> {
            let writes_itself = plan.ops.iter().any(|op| op.key().is_ok_and(|k| k == key));
            if (plan.ops.is_empty() && handled) || health_may_change(last, plan) || writes_itself {
                return None;
            }
            let mut updated = current.clone();
            let duration = Some(started.elapsed().as_millis() as u64);
            synced(updated.status.get_or_insert_with(Default::default), &commit, plan, None, started_at, duration);
            Some(updated)
        };
        // Hooks run and waves wait once per commit; a later reconcile of the same commit corrects
        // drift in one transaction.
        if !handled && let Some(steps) = hooks::steps(&manifests) {
            let stepped = self.sync_in_steps(app, &commit.id, &manifests, &steps, &mut inventory, informer).await;
            self.inventories.lock().unwrap_or_else(|e| e.into_inner()).insert(key, inventory);
            return match stepped {
                Ok(staged::Stepped::Waiting(why)) => Ok(Synced::Stepping(why)),
                Ok(staged::Stepped::Done(plan)) => {
                    Ok(Synced::Applied(Box::new(Applied { commit, plan, status_written: false, verdict_plan: false })))
                }
                Err(e) => Err(fail(e)),
            };
        }
        let applied = self.apply(app, &manifests, verdict_plan, &mut inventory, informer, &status, None).await;
        self.inventories.lock().unwrap_or_else(|e| e.into_inner()).insert(key, inventory);
        match applied {
            Ok((plan, ..)) if plan.ops.is_empty() && handled => Ok(Synced::Nothing),
            Ok((plan, status_written, verdict_plan)) => {
                Ok(Synced::Applied(Box::new(Applied { commit, plan, status_written, verdict_plan })))
            }
            Err(e) => Err(fail(e)),
        }
    }

    /// Plans the manifests against the store and commits the plan as one transaction, with the
    /// Application's new status when `status` gives one for the plan (written over the
    /// Application as the store has it); plans again (in full) when a concurrent writer got in
    /// between; `inventory` follows. Whether the status was written, and whether the verdict's
    /// plan was committed. `verdict`: the push verdict's plan of these manifests and the
    /// cache's count of changes it read, committed instead of a plan of its own while the cache
    /// still reads that count. With a `part` (which objects, whether to prune), only that part
    /// of the plan is committed: one wave's.
    #[allow(clippy::too_many_arguments)]
    async fn apply(
        &self,
        app: &Application,
        manifests: &[Arc<gitplane_source::Manifest>],
        mut verdict: Option<(apply::Plan, u64)>,
        inventory: &mut apply::Inventory,
        informer: &Informer,
        status: &(dyn Fn(&apply::Plan, &Application) -> Option<Application> + Sync),
        part: Option<Part<'_>>,
    ) -> Result<(apply::Plan, bool, bool), SyncError> {
        let id = app_id(app);
        let policy = apply::Policy {
            app: &id,
            prune: app.spec.prune,
            allow_empty: app.spec.allow_empty,
            record_key: &self.record_key,
        };
        let mut last_conflict = None;
        // `None` once the Application is gone: the objects are still written, as before.
        let mut current = Some(app.clone());
        for _ in 0..CONFLICT_RETRIES {
            let reused = verdict
                .take()
                .and_then(|(plan, planned_at)| self.plans.reuse(plan, planned_at, informer.cache().changes()));
            let verdict_plan = reused.is_some();
            let plan = if let Some(plan) = reused {
                plan
            } else {
                let (namespaces, nodes) = names(informer.cache());
                let stored = Accepted(informer.cache());
                let cluster = apply::Cluster {
                    stored: &stored,
                    inventory,
                    namespaces: &namespaces,
                    nodes: &nodes,
                    service_ranges: &self.service_ranges,
                };
                let mut plan = apply::plan(manifests, &cluster, &policy).map_err(SyncError::Invalid)?;
                if let Some((keep, prune)) = part {
                    plan.restrict(keep, prune);
                }
                plan
            };
            let updated = current.as_ref().and_then(|current| status(&plan, current));
            if plan.ops.is_empty() && updated.is_none() {
                inventory.record(&plan, [], policy.prune);
                return Ok((plan, false, verdict_plan));
            }
            let with_status = updated.is_some();
            let mut ops = graceful(&plan.ops, informer.cache());
            ops.extend(updated.map(|a| Op::UpdateStatus(gitplane_api::object::to_value(&a))));
            match self.store.txn(ops).await {
                Ok(committed) => {
                    tracing::debug!(application = %id, revision = committed.revision, "plan committed");
                    inventory.record(&plan, &committed.objects, policy.prune);
                    if !plan.ops.is_empty() {
                        informer.wait_for(committed.revision).await;
                    }
                    return Ok((plan, with_status, verdict_plan));
                }
                Err(e) if e.is_conflict() || e.is_already_exists() || e.is_not_found() => {
                    last_conflict = Some(e.to_string());
                    // The cache was behind: wait until it has caught up with the store, then plan
                    // again, looking at everything.
                    inventory.distrust();
                    if let Ok(revision) = self.store.revision().await {
                        informer.wait_for(revision).await;
                    }
                    // The Application itself may be what moved (its spec, another status write).
                    if with_status {
                        let api = Api::<Application>::new(self.store.clone());
                        let (ns, name) = (&app.metadata.namespace, &app.metadata.name);
                        match api.get(ns.as_deref().unwrap_or(""), name.as_deref().unwrap_or("")).await {
                            Ok(found) => current = found,
                            Err(e) => return Err(e.into()),
                        }
                    }
                }
                Err(e) => {
                    // The transaction may or may not have committed.
                    inventory.distrust();
                    return Err(e.into());
                }
            }
        }
        let last = last_conflict.unwrap_or_default();
        Err(SyncError::Transient(format!("objects kept changing while applying ({last}); will retry")))
    }

    /// Recomputes the health of one Application from the cache.
    async fn assess_health(&self, key: &ObjectKey, cache: &Cache) {
        let Some(app) = cache.get_typed::<Application>(&key.namespace, &key.name) else { return };
        let sync = app.status.as_ref().and_then(|s| s.sync.as_ref());
        let applied = sync.is_some_and(|s| s.status == "Synced" || s.revision.is_some());
        let wanted = app_health(&app, applied, cache);
        if app.status.as_ref().and_then(|s| s.health.as_ref()) != Some(&wanted) {
            self.update_status(&app, |s| s.health = Some(wanted.clone())).await;
        }
    }

    /// Read-modify-write of an Application's status, retried on conflicts.
    async fn update_status(&self, app: &Application, change: impl Fn(&mut ApplicationStatus)) {
        let api = Api::<Application>::new(self.store.clone());
        let (ns, name) =
            (app.metadata.namespace.clone().unwrap_or_default(), app.metadata.name.clone().unwrap_or_default());
        for _ in 0..CONFLICT_RETRIES {
            let current = match api.get(&ns, &name).await {
                Ok(Some(current)) => current,
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!(application = %name, error = %e, "reading the Application failed");
                    return;
                }
            };
            let mut updated = current.clone();
            change(updated.status.get_or_insert_with(Default::default));
            if updated.status == current.status {
                return;
            }
            match api.update_status(&updated).await {
                Err(e) if e.is_conflict() => continue,
                Err(e) => {
                    tracing::warn!(application = %name, error = %e, "could not record the status");
                    return;
                }
                Ok(_) => return,
            }
        }
    }

    /// Records an Event about `involved` (its uid from the cache, so `kubectl describe` finds it).
    fn record_event(&self, involved: &ObjectKey, cache: &Cache, event_type: &str, reason: &str, message: &str) {
        self.events.event(reference(involved, cache), event_type, reason, message);
    }
}

/// What the source controller's loop observes.
enum Input {
    /// A change in the cache, or its `Resync` when changes were missed.
    Informer(Notification),
    /// The refs of these hosted repositories moved: every path waiting when the first came.
    Pushed(HashSet<PathBuf>),
    /// A mirror's fetch moved the branches of this URL.
    Fetched(String),
    /// The periodic resync.
    Resync,
    /// The health debounce: some Application waits for its health to be assessed.
    Health,
}

/// The loop's inputs as one stream, which ends with the informer's notifications.
fn inputs(
    informer: impl Stream<Item = Notification> + Send + 'static,
    pushed: mpsc::UnboundedReceiver<PathBuf>,
    fetched: broadcast::Receiver<String>,
    resync: Duration,
    health_due: Arc<Notify>,
) -> impl Stream<Item = Input> + Send {
    let pushed = stream::unfold(pushed, |mut pushed| async move {
        let first = pushed.recv().await?;
        Some((Input::Pushed(drain(&mut pushed, first)), pushed))
    });
    let fetched = stream::unfold(fetched, |mut fetched| async move {
        loop {
            match fetched.recv().await {
                Ok(url) => return Some((Input::Fetched(url), fetched)),
                // The periodic resync reads every branch again.
                Err(RecvError::Lagged(_)) => continue,
                Err(RecvError::Closed) => return None,
            }
        }
    });
    // The first resync is the runner's, at the start.
    let mut resync = tokio::time::interval_at(tokio::time::Instant::now() + resync, resync);
    // Only while some health waits to be assessed: an idle loop sleeps.
    let health = stream::unfold(health_due, |due| async move {
        due.notified().await;
        tokio::time::sleep(HEALTH_DEBOUNCE).await;
        Some((Input::Health, due))
    });
    let mut others = stream::select_all([
        pushed.boxed(),
        fetched.boxed(),
        stream::poll_fn(move |cx| resync.poll_tick(cx).map(|_| Some(Input::Resync))).boxed(),
        health.boxed(),
    ]);
    let mut informer = informer.map(Input::Informer).boxed();
    // The ticks never end, so only the informer ends the stream.
    stream::poll_fn(move |cx| match informer.poll_next_unpin(cx) {
        Poll::Pending => others.poll_next_unpin(cx),
        ready => ready,
    })
}

/// The source controller on the loop runner, with what its loop keeps.
struct SourceLoop {
    source: SourceController,
    informer: Informer,
    /// Where the watchers of hosted repositories send their paths.
    pushed: mpsc::UnboundedSender<PathBuf>,
    watchers: HashMap<PathBuf, notify::RecommendedWatcher>,
    registry: Registry,
    /// Applications whose health is assessed on the next health tick.
    unhealthy: BTreeSet<ObjectKey>,
    /// Wakes the health tick once `unhealthy` holds some.
    health_due: Arc<Notify>,
    generations: HashMap<ObjectKey, Option<i64>>,
    /// When each Application's branch moved and its commit is not applied yet.
    moved: HashMap<ObjectKey, Instant>,
}

impl Reconcile for SourceLoop {
    type Key = ObjectKey;
    type Reason = Reason;
    type Notification = Input;

    async fn resync(&mut self, queue: &mut Queue) {
        self.rebuild(queue).await;
        self.arm_health();
    }

    async fn observe(&mut self, input: Input, queue: &mut Queue) {
        match input {
            Input::Informer(Notification::Changed(e)) => {
                if self.observe_change(&e, queue) {
                    self.follow_repositories().await;
                }
            }
            Input::Informer(Notification::Resync) => {
                // Events were missed: no inventory can vouch for the store any more.
                let inventories = &self.source.inventories;
                inventories.lock().unwrap_or_else(|e| e.into_inner()).values_mut().for_each(apply::Inventory::distrust);
                self.rebuild(queue).await;
            }
            // A push during a burst of syncs (a resync, another push) is queued before the next
            // sync, so what it changed goes next rather than after the burst.
            Input::Pushed(paths) => self.queue_pushed(paths, queue).await,
            Input::Fetched(url) => {
                for key in self.registry.by_repo.get(&url).into_iter().flatten() {
                    self.moved.entry(key.clone()).or_insert_with(Instant::now);
                    queue.add(key.clone(), Reason::Commit);
                }
            }
            // Hosted repositories may have been removed or made meanwhile.
            Input::Resync => self.rebuild(queue).await,
            Input::Health => {
                for key in std::mem::take(&mut self.unhealthy) {
                    self.source.assess_health(&key, self.informer.cache()).await;
                }
            }
        }
        self.arm_health();
    }

    async fn reconcile(&mut self, key: ObjectKey, reason: Reason, queue: &Queue) -> Requeue<Reason> {
        // From the store, not the cache: the cache may not show our last status write yet, and
        // the status says which commit was already handled.
        match Api::<Application>::new(self.source.store.clone()).get(&key.namespace, &key.name).await {
            Ok(Some(app)) => {
                let started = Instant::now();
                let outcome = self.source.sync(&app, reason, &self.informer).await;
                crate::metrics::sync(&key.namespace, &key.name, outcome.result, started.elapsed());
                if !outcome.retry
                    && let Some(at) = self.moved.remove(&key)
                    && outcome.result == "Synced"
                {
                    crate::metrics::applied(&key.namespace, &key.name, at);
                }
                if outcome.assess_health {
                    self.unhealthy.insert(key.clone());
                    self.arm_health();
                }
                if let Some(again) = outcome.again {
                    Requeue::After(again, Reason::Commit)
                } else if outcome.retry {
                    let delay = queue.next_backoff(&key);
                    tracing::info!(application = %key, ?delay, "retrying after a failure that may heal by itself");
                    Requeue::Backoff(Reason::Commit)
                } else {
                    Requeue::Done
                }
            }
            // Deleted meanwhile: its entry was popped, and `Done` forgets its failures.
            Ok(None) => {
                self.moved.remove(&key);
                Requeue::Done
            }
            Err(e) => {
                tracing::warn!(application = %key, error = %e, "reading the Application failed");
                Requeue::Backoff(reason)
            }
        }
    }
}

impl SourceLoop {
    /// Starts the health debounce if some Application waits for its health.
    fn arm_health(&self) {
        if !self.unhealthy.is_empty() {
            self.health_due.notify_one();
        }
    }

    /// Reads every Application again and queues each for a reconcile (at the start, after
    /// missed events, and on the periodic resync), then follows their repositories.
    async fn rebuild(&mut self, queue: &mut Queue) {
        let apps = self.informer.cache().list(&kind_of::<Application>(), None);
        self.registry = Registry::of(&apps);
        // Each is reconciled now, so the generations seen are these: their next status write is
        // no spec change. One not seen before has its health assessed.
        for app in &apps {
            if let Ok(key) = ObjectKey::from_value(app) {
                if self.generations.insert(key.clone(), app["metadata"]["generation"].as_i64()).is_none() {
                    self.unhealthy.insert(key.clone());
                }
                queue.add(key, Reason::Reconcile);
            }
        }
        self.follow_repositories().await;
    }

    /// Queues every Application of the pushed repositories: first those whose directory the
    /// push changed ([`push::changed`]), then the rest, which only record the new revision.
    async fn queue_pushed(&mut self, paths: HashSet<PathBuf>, queue: &mut Queue) {
        let cache = self.informer.cache();
        for path in paths {
            let started = Instant::now();
            let keys: Vec<ObjectKey> = self.registry.by_path(&path).cloned().collect();
            let apps: Vec<push::Following> =
                keys.iter().filter_map(|k| push::Following::of(k.clone(), &*cache.get(k)?)).collect();
            let changed = {
                let path = path.clone();
                tokio::task::spawn_blocking(move || push::changed(&path, &apps)).await.unwrap_or_default()
            };
            tracing::debug!(repo = %path.display(), applications = keys.len(), changed = changed.len(),
                took = ?started.elapsed(), "a push's Applications queued");
            for key in keys {
                self.moved.entry(key.clone()).or_insert_with(Instant::now);
                if changed.contains(&key) {
                    queue.add_first(key, Reason::Commit);
                } else {
                    queue.add(key, Reason::Commit);
                }
            }
        }
    }

    /// Watches the refs of every hosted repository an Application names (and no other), and
    /// stops mirroring remote ones no Application names any more.
    async fn follow_repositories(&mut self) {
        let SourceLoop { source, registry, watchers, pushed, .. } = self;
        registry.paths.retain(|_, repo| registry.by_repo.contains_key(repo));
        for repo in registry.by_repo.keys().filter(|r| !is_url(r)).cloned().collect::<Vec<_>>() {
            if let Ok(Some(path)) = source.repos.path_blocking(&repo).await {
                if !watchers.contains_key(&path)
                    && let Some(w) = watch_refs(&path, pushed.clone())
                {
                    watchers.insert(path.clone(), w);
                }
                registry.paths.insert(path, repo);
            }
        }
        watchers.retain(|path, _| registry.paths.contains_key(path));
        for url in source.repos.mirrors.tracked() {
            if !registry.by_repo.contains_key(&url) {
                source.repos.mirrors.untrack(&url);
            }
        }
    }

    /// Maps a change to the Applications it concerns and keeps `registry`; `true` when an
    /// Application's repository changed (or one came or went).
    fn observe_change(&mut self, event: &gitplane_store::Event, queue: &mut Queue) -> bool {
        let SourceLoop { source, informer, registry, unhealthy, generations, .. } = self;
        let cache = informer.cache();
        if event.key.kind == kind_of::<Application>() {
            // Our own status writes need no sync; spec changes bump the generation.
            let generation = event.object["metadata"]["generation"].as_i64();
            let deleted = event.event_type == EventType::Deleted;
            if deleted {
                source.caches.lock().unwrap_or_else(|e| e.into_inner()).remove(&event.key);
                source.inventories.lock().unwrap_or_else(|e| e.into_inner()).remove(&event.key);
                source.staging.lock().unwrap_or_else(|e| e.into_inner()).remove(&event.key);
            }
            if deleted {
                queue.remove(&event.key);
            } else if generations.insert(event.key.clone(), generation) != Some(generation) {
                // A new spec may change the verdict on the same commit: plan it again.
                queue.add(event.key.clone(), Reason::Reconcile);
                unhealthy.insert(event.key.clone());
            }
            // Applications that depend on this one may go now (read as JSON: nothing decoded).
            for app in cache.list(&event.key.kind, Some(&event.key.namespace)) {
                let names = app["spec"]["dependsOn"].as_array();
                if names.is_some_and(|n| n.iter().any(|n| n.as_str() == Some(event.key.name.as_str())))
                    && let Ok(key) = ObjectKey::from_value(&app)
                {
                    queue.add(key, Reason::Commit);
                }
            }
            return if deleted { registry.remove(&event.key) } else { registry.set(event.key.clone(), &event.object) };
        }
        // Whoever wrote it (an inventory skips its own writes): by key, as the write may also
        // have changed the inventory annotation.
        // A sync in steps waits for its objects and hooks: it looks again at once.
        let annotations = &event.object["metadata"]["annotations"];
        let stepping =
            annotations[APPLICATION_ANNOTATION].as_str().or(hooks::hook_of(&event.object)).and_then(owner_key);
        if let Some(owner) =
            stepping.filter(|o| source.staging.lock().unwrap_or_else(|e| e.into_inner()).contains_key(o))
        {
            queue.add(owner, Reason::Commit);
        }
        let revision = (event.event_type != EventType::Deleted).then(|| resource_version(&event.object)).flatten();
        for inventory in source.inventories.lock().unwrap_or_else(|e| e.into_inner()).values_mut() {
            inventory.touched(&event.key, revision);
        }
        if let Some(owner) =
            event.object["metadata"]["annotations"][APPLICATION_ANNOTATION].as_str().and_then(owner_key)
        {
            let changed_outside =
                event.event_type == EventType::Deleted || apply::drifted(&event.object, &source.record_key);
            if changed_outside {
                queue.add(owner.clone(), Reason::Reconcile);
            }
            // Other kinds are healthy once they exist: a ConfigMap's change changes no health.
            if event.event_type == EventType::Deleted || health::assessed(&event.key.kind) {
                unhealthy.insert(owner);
            }
        } else if matches!(event.key.kind.as_str(), "Pod" | "ReplicaSet.apps") {
            // Pods and ReplicaSets carry no inventory annotation: assess the Applications of
            // that namespace's workloads.
            unhealthy.extend(registry.by_namespace.get(&event.key.namespace).into_iter().flatten().cloned());
        }
        false
    }
}

/// An Event's reference to `involved`, with its uid from `cache`.
/// The plan's writes as the store takes them: a prune deletes as the API server does
/// ([`deletion::delete`]: a bare Pod on a node gracefully), from the object the plan was made
/// against.
fn graceful(ops: &[Op], cache: &Cache) -> Vec<Op> {
    let now = now();
    ops.iter()
        .filter_map(|op| match op {
            Op::Delete { key, revision } => match cache.get(key) {
                Some(current) if resource_version(&current) == *revision => deletion::delete(&current, now),
                _ => Some(op.clone()),
            },
            other => Some(other.clone()),
        })
        .collect()
}

fn reference(involved: &ObjectKey, cache: &Cache) -> ObjectReference {
    let (kind, api_version) = match involved.kind.split_once('.') {
        Some((kind, group)) => (kind.to_owned(), format!("{group}/v1")),
        None => (involved.kind.clone(), "v1".to_owned()),
    };
    let uid = cache.get(involved).and_then(|o| o["metadata"]["uid"].as_str().map(str::to_owned));
    ObjectReference {
        kind: Some(kind),
        api_version: Some(api_version),
        namespace: (!involved.namespace.is_empty()).then(|| involved.namespace.clone()),
        name: Some(involved.name.clone()),
        uid,
        ..Default::default()
    }
}

/// The commit a sync reads.
struct CommitInfo {
    id: String,
    subject: String,
}

/// A sync that committed (or found nothing to change for a new commit).
struct Applied {
    commit: CommitInfo,
    plan: apply::Plan,
    /// The status went into the objects' transaction.
    status_written: bool,
    /// The push verdict's plan was committed (see [`planned`]).
    verdict_plan: bool,
}

/// Whether a sync that applied `plan` may have changed the Application's health: its sync
/// status did, or objects with a health rule were written.
fn health_may_change(last: &SyncStatus, plan: &apply::Plan) -> bool {
    last.status != "Synced" || plan.ops.iter().any(|op| op.key().is_ok_and(|k| health::assessed(&k.kind)))
}

/// The status of a sync that applied a commit: Synced, with its changes and, for a new
/// revision, a history entry; `health` when it was assessed.
fn synced(
    s: &mut ApplicationStatus,
    commit: &CommitInfo,
    plan: &apply::Plan,
    health: Option<&HealthStatus>,
    started_at: &str,
    duration_ms: Option<u64>,
) {
    if let Some(health) = health {
        s.health = Some(health.clone());
    }
    if s.sync.as_ref().and_then(|s| s.revision.as_deref()) != Some(commit.id.as_str()) {
        s.history.insert(
            0,
            RevisionHistory {
                revision: commit.id.clone(),
                commit_subject: commit.subject.clone(),
                applied_at: rfc3339(),
            },
        );
        s.history.truncate(HISTORY);
    }
    s.sync = Some(SyncStatus {
        status: "Synced".into(),
        revision: Some(commit.id.clone()),
        commit_subject: Some(commit.subject.clone()),
        attempted_revision: Some(commit.id.clone()),
        errors: Vec::new(),
        message: None,
        started_at: Some(started_at.to_owned()),
        finished_at: Some(rfc3339()),
        duration_ms,
        changes: Some(SyncChanges {
            created: plan.created as u32,
            updated: plan.updated as u32,
            pruned: plan.pruned as u32,
            drift_corrected: plan.drifted.len() as u32,
        }),
    });
}

fn short(commit: &str) -> &str {
    commit.get(..12).unwrap_or(commit)
}

/// The stored objects of the accepted kinds, as a plan sees them: straight from the cache.
struct Accepted<'a>(&'a Cache);

impl apply::Stored for Accepted<'_> {
    fn get(&self, key: &ObjectKey) -> Option<Arc<Value>> {
        self.0.get(key)
    }

    fn list(&self, kind: &str) -> Vec<Arc<Value>> {
        self.0.list(kind, None)
    }

    fn owned_by(&self, app: &str) -> Vec<(ObjectKey, Arc<Value>)> {
        let kinds: HashSet<String> = accepted().iter().map(|k| k.group_kind()).collect();
        self.0.owned_by(app).into_iter().filter(|(key, _)| kinds.contains(&key.kind)).collect()
    }
}

/// The names of the namespaces and of the nodes, which a plan checks references against.
fn names(cache: &Cache) -> (HashSet<String>, HashSet<String>) {
    let names = |kind: String| -> HashSet<String> {
        cache.list(&kind, None).iter().filter_map(|o| o["metadata"]["name"].as_str().map(str::to_owned)).collect()
    };
    (names(kind_of::<Namespace>()), names(kind_of::<Node>()))
}

/// Whether a filesystem event can mean that a ref moved. Git writes a ref as `<ref>.lock` and
/// renames it into place; reading a ref (as every sync does) must not count, or each sync would
/// queue the next one.
fn moves_a_ref(kind: &notify::EventKind) -> bool {
    use notify::event::{AccessKind, AccessMode, EventKind, ModifyKind};
    match kind {
        EventKind::Create(_) | EventKind::Remove(_) => true,
        EventKind::Modify(ModifyKind::Metadata(_)) => false,
        EventKind::Modify(_) => true,
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        // Unknown kinds and overflow rescans: a spare sync is cheap, a missed push is not.
        EventKind::Any | EventKind::Other => true,
    }
}

fn is_lock(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "lock")
}

/// Watches a bare repository's branch refs (loose and packed) and reports its path on change.
fn watch_refs(repo: &Path, pushed: mpsc::UnboundedSender<PathBuf>) -> Option<notify::RecommendedWatcher> {
    let path = repo.to_path_buf();
    let heads = repo.join("refs").join("heads");
    let packed = repo.join("packed-refs");
    let handler = {
        let heads = heads.clone();
        move |event: notify::Result<notify::Event>| {
            if let Ok(event) = event
                && moves_a_ref(&event.kind)
                && event.paths.iter().any(|p| (p.starts_with(&heads) || *p == packed) && !is_lock(p))
            {
                tracing::debug!(repo = %path.display(), "a ref moved");
                let _ = pushed.send(path.clone());
            }
        }
    };
    let mut watcher = match notify::recommended_watcher(handler) {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!(repo = %repo.display(), error = %e, "cannot watch the repository; relying on the periodic resync");
            return None;
        }
    };
    let watched = watcher
        .watch(&heads, notify::RecursiveMode::Recursive)
        .and_then(|()| watcher.watch(repo, notify::RecursiveMode::NonRecursive));
    if let Err(e) = watched {
        tracing::warn!(repo = %repo.display(), error = %e, "cannot watch the repository; relying on the periodic resync");
        return None;
    }
    Some(watcher)
}

/// The health of what `app` applied, from the cache: the worst of its objects'. `applied`: a
/// commit of it is in the store (else its objects are Missing). Its objects come from the
/// cache's owner index and the Pods its Services select from their namespaces only: an
/// assessment reads what the Application owns, not every object and every Pod.
fn app_health(app: &Application, applied: bool, cache: &Cache) -> HealthStatus {
    // Objects in the order of the accepted kinds, then by namespace and name.
    let kinds: HashMap<String, (usize, String)> =
        stored().enumerate().map(|(i, k)| (k.group_kind(), (i, k.kind.clone()))).collect();
    let mut owned: Vec<(usize, &str, ObjectKey, Arc<Value>)> = cache
        .owned_by(&app_id(app))
        .into_iter()
        .filter_map(|(key, object)| {
            let (order, kind) = kinds.get(&key.kind)?;
            Some((*order, kind.as_str(), key, object))
        })
        .collect();
    owned.sort_by(|a, b| (a.0, &a.2).cmp(&(b.0, &b.2)));
    let service_namespaces: BTreeSet<&str> =
        owned.iter().filter(|o| o.1 == "Service").map(|o| o.2.namespace.as_str()).collect();
    let pods: Vec<Arc<Value>> = service_namespaces.into_iter().flat_map(|ns| cache.list("Pod", Some(ns))).collect();
    let pods = health::Pods::new(&pods);
    let mut worst = if applied { Health::Healthy } else { Health::Missing };
    let mut resources = Vec::new();
    let mut unhealthy = 0;
    for (_, kind, key, object) in &owned {
        let (health, message) = health::of(kind, object, &pods);
        worst = worst.max(health);
        if health != Health::Healthy {
            unhealthy += 1;
            if resources.len() < MAX_LISTED_RESOURCES {
                resources.push(ResourceHealth {
                    kind: (*kind).to_owned(),
                    namespace: key.namespace.clone(),
                    name: key.name.clone(),
                    status: health.as_str().to_owned(),
                    message,
                });
            }
        }
    }
    let message = resources.first().map(|r| match unhealthy {
        1 => format!("{} {}: {}", r.kind, r.name, r.message),
        n => format!(
            "{n} objects not healthy, the first {} listed; {} {}: {}",
            resources.len(),
            r.kind,
            r.name,
            r.message
        ),
    });
    HealthStatus { status: worst.as_str().to_owned(), message, resources }
}

/// Commits `files` on `refs/heads/main` after `parent`, through an in-memory index (which
/// builds the nested trees of paths like `first/deploy.yaml`): the source's tests' repositories.
#[cfg(test)]
pub(crate) fn test_commit(git: &git2::Repository, files: &[(&str, &str)], parent: Option<git2::Oid>) -> git2::Oid {
    let mut index = git2::Index::new().unwrap();
    for (path, text) in files {
        let entry = git2::IndexEntry {
            ctime: git2::IndexTime::new(0, 0),
            mtime: git2::IndexTime::new(0, 0),
            dev: 0,
            ino: 0,
            mode: 0o100644,
            uid: 0,
            gid: 0,
            file_size: text.len() as u32,
            id: git.blob(text.as_bytes()).unwrap(),
            flags: 0,
            flags_extended: 0,
            path: path.as_bytes().to_vec(),
        };
        index.add(&entry).unwrap();
    }
    let tree = git.find_tree(index.write_tree_to(git).unwrap()).unwrap();
    let sig = git2::Signature::now("t", "t@localhost").unwrap();
    let parents: Vec<git2::Commit<'_>> = parent.map(|p| git.find_commit(p).unwrap()).into_iter().collect();
    let parents: Vec<&git2::Commit<'_>> = parents.iter().collect();
    git.commit(Some("refs/heads/main"), &sig, &sig, "change", &tree, &parents).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gitplane_storage::sqlite::SqliteStore;
    use k8s_openapi::api::core::v1::{ConfigMap, Event, Pod};

    #[test]
    fn the_registry_changes_only_with_an_applications_repository_or_namespace() {
        let app = |name: &str, repo: &str, status: &str| {
            serde_json::json!({"apiVersion": "gitplane.io/v1", "kind": "Application",
                "metadata": {"name": name, "namespace": "gitplane-system"},
                "spec": {"repo": repo, "namespace": "web"}, "status": {"sync": {"status": status}}})
        };
        let mut registry = Registry::of(&[Arc::new(app("a", "r", "Synced")), Arc::new(app("b", "r", "Synced"))]);
        let key = |name: &str| ObjectKey::of::<Application>("gitplane-system", name);
        // A status write: nothing to follow.
        assert!(!registry.set(key("a"), &app("a", "r", "Failed")));
        assert!(registry.set(key("a"), &app("a", "other", "Failed")), "a new repository");
        assert_eq!(registry.by_repo["r"], BTreeSet::from([key("b")]));
        assert_eq!(registry.by_namespace["web"].len(), 2);
        assert!(registry.remove(&key("b")) && !registry.remove(&key("b")));
        assert!(!registry.by_repo.contains_key("r"), "a repository nobody names is dropped");
        assert_eq!(registry.all.keys().collect::<Vec<_>>(), [&key("a")]);
    }

    #[tokio::test]
    async fn reading_refs_is_not_a_push() {
        let dir = tempfile::tempdir().unwrap();
        let repo = git2::Repository::init_bare(dir.path().join("r.git")).unwrap();
        let tree = repo.find_tree(repo.treebuilder(None).unwrap().write().unwrap()).unwrap();
        let sig = git2::Signature::now("t", "t@localhost").unwrap();
        let first = repo.commit(Some("refs/heads/main"), &sig, &sig, "one", &tree, &[]).unwrap();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let _watcher = watch_refs(repo.path(), tx).unwrap();
        // What a sync does: open the repository and read the branch, many times.
        for _ in 0..20 {
            let opened = git2::Repository::open_bare(repo.path()).unwrap();
            opened.refname_to_id("refs/heads/main").unwrap();
            std::fs::read(repo.path().join("refs/heads/main")).unwrap();
        }
        // Sleeping only to prove that nothing arrives.
        let quiet = tokio::time::timeout(Duration::from_millis(500), rx.recv()).await;
        assert!(quiet.is_err(), "reading refs was taken for a push: {quiet:?}");
        repo.commit(
            Some("refs/heads/main"),
            &sig,
            &sig,
            "two",
            &tree,
            &[repo.find_commit(first).unwrap()].iter().collect::<Vec<_>>(),
        )
        .unwrap();
        let pushed = tokio::time::timeout(Duration::from_secs(10), rx.recv()).await;
        assert!(matches!(pushed, Ok(Some(_))), "a moved branch is a push: {pushed:?}");
    }

    /// A bare repository whose `main` is replaced by each `commit`.
    struct Repo {
        dir: tempfile::TempDir,
    }

    impl Repo {
        fn new() -> Repo {
            let dir = tempfile::tempdir().unwrap();
            git2::Repository::init_bare(dir.path().join("app.git")).unwrap();
            Repo { dir }
        }

        fn commit(&self, files: &[(&str, &str)]) -> String {
            let repo = git2::Repository::open_bare(self.dir.path().join("app.git")).unwrap();
            let parent = repo.find_reference("refs/heads/main").ok().and_then(|r| r.target());
            super::test_commit(&repo, files, parent).to_string()
        }
    }

    async fn setup() -> (Arc<dyn Store>, SourceController, Repo) {
        let store: Arc<dyn Store> = Arc::new(SqliteStore::memory().await.unwrap());
        for ns in ["default", "gitplane-system"] {
            let ns = serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
            store.txn(vec![gitplane_store::Op::Create(ns)]).await.unwrap();
        }
        let repo = Repo::new();
        let mirrors = Mirrors::new(repo.dir.path().join("mirrors"), mirror::DEFAULT_POLL, true);
        let controller = SourceController::new(
            store.clone(),
            repo.dir.path().to_path_buf(),
            mirrors,
            apply::RecordKey::new([1; 32]),
        );
        (store, controller, repo)
    }

    fn app(name: &str) -> Application {
        let mut app = Application::new(
            name,
            gitplane_api::ApplicationSpec {
                repo: "app".into(),
                branch: "main".into(),
                path: String::new(),
                namespace: Some("default".into()),
                prune: true,
                values: Default::default(),
                depends_on: Vec::new(),
                values_files: Vec::new(),
                allow_empty: false,
            },
        );
        app.metadata.namespace = Some("gitplane-system".into());
        app
    }

    /// Syncs `name` as the controller does and returns its recorded status.
    async fn sync(store: &Arc<dyn Store>, controller: &SourceController, name: &str) -> SyncStatus {
        let api = Api::<Application>::new(store.clone());
        if api.get("gitplane-system", name).await.unwrap().is_none() {
            api.create(&app(name)).await.unwrap();
        }
        let informer = Informer::spawn(store.clone(), watched_kinds());
        informer.wait_for(store.revision().await.unwrap().max(1)).await;
        let current = api.get("gitplane-system", name).await.unwrap().unwrap();
        controller.sync(&current, Reason::Commit, &informer).await;
        api.get("gitplane-system", name).await.unwrap().unwrap().status.unwrap().sync.unwrap()
    }

    #[test]
    fn a_queued_reconcile_is_not_lost_to_a_commit() {
        let key = |name: &str| ObjectKey::of::<Application>("gitplane-system", name);
        let mut queue = Queue::new(Backoff::default());
        queue.add(key("a"), Reason::Commit);
        queue.add(key("a"), Reason::Reconcile);
        queue.add(key("a"), Reason::Commit);
        queue.add(key("b"), Reason::Commit);
        let queued: Vec<_> = std::iter::from_fn(|| queue.pop()).collect();
        assert_eq!(queued, [(key("a"), Reason::Reconcile), (key("b"), Reason::Commit)]);
    }

    const CM: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  a: \"1\"\n";

    #[tokio::test]
    async fn a_commit_rejected_for_its_content_is_not_retried() {
        let (store, controller, repo) = setup().await;
        // Over the 1 MiB file limit: refused before it is read, not by schema validation.
        let huge = format!("{CM}# {}\n", "x".repeat(1_200_000));
        let bad = repo.commit(&[("big.yaml", huge.as_str())]);
        let status = sync(&store, &controller, "a").await;
        assert_eq!((status.status.as_str(), status.attempted_revision.as_deref()), ("Failed", Some(bad.as_str())));
        assert!(status.errors[0].contains("big.yaml"), "{:?}", status.errors);

        // Neither the same commit nor the periodic resync tries it again, and nothing is written.
        let informer = Informer::spawn(store.clone(), watched_kinds());
        let before = store.revision().await.unwrap();
        informer.wait_for(before).await;
        let app = Api::<Application>::new(store.clone()).get("gitplane-system", "a").await.unwrap().unwrap();
        for reason in [Reason::Commit, Reason::Reconcile] {
            let outcome = controller.sync(&app, reason, &informer).await;
            assert!(!outcome.retry && !outcome.assess_health, "{reason:?}");
        }
        assert_eq!(store.revision().await.unwrap(), before, "a final verdict is not written again");
    }

    #[test]
    fn only_failures_that_may_heal_are_retried() {
        let verdicts = [
            SyncError::Invalid(Vec::new()),
            SyncError::Spec("spec.repo holds credentials".into()),
            SyncError::Source(gitplane_source::SourceError::FileTooLarge { file: "f".into(), size: 2, limit: 1 }),
            SyncError::Source(gitplane_source::SourceError::SymlinkAbsolute {
                file: "f".into(),
                target: "/etc/passwd".into(),
                dir: String::new(),
            }),
        ];
        assert!(verdicts.iter().all(SyncError::is_verdict));
        let healing = [
            SyncError::Transient("objects kept changing".into()),
            SyncError::Store(StoreError::Unavailable("no leader".into())),
            SyncError::Source(gitplane_source::SourceError::Io {
                path: "x".into(),
                source: std::io::ErrorKind::Interrupted.into(),
            }),
        ];
        assert!(!healing.iter().any(SyncError::is_verdict));
    }

    #[tokio::test]
    async fn applies_then_prunes_and_keeps_the_last_good_commit() {
        let (store, controller, repo) = setup().await;
        let good = repo.commit(&[("cm.yaml", CM)]);
        let status = sync(&store, &controller, "a").await;
        assert_eq!((status.status.as_str(), status.revision.as_deref()), ("Synced", Some(good.as_str())));
        let cm = Api::<ConfigMap>::new(store.clone()).get("default", "settings").await.unwrap().unwrap();
        assert_eq!(cm.metadata.annotations.unwrap()[APPLICATION_ANNOTATION], "gitplane-system/a");

        let bad = repo.commit(&[("cm.yaml", &CM.replace("\ndata:", "\ndta:"))]);
        let status = sync(&store, &controller, "a").await;
        assert_eq!(status.status, "Failed");
        assert_eq!(status.revision.as_deref(), Some(good.as_str()), "the last good commit stays");
        assert_eq!(status.attempted_revision.as_deref(), Some(bad.as_str()));
        assert!(status.errors[0].starts_with("cm.yaml:5: ConfigMap settings: "), "{:?}", status.errors);

        repo.commit(&[("other.yaml", &CM.replace("settings", "other"))]);
        assert_eq!(sync(&store, &controller, "a").await.status, "Synced");
        let cms = Api::<ConfigMap>::new(store.clone()).list(Some("default")).await.unwrap().0;
        let names: Vec<_> = cms.iter().map(|c| c.metadata.name.clone().unwrap()).collect();
        assert_eq!(names, ["other"], "the object removed from Git is pruned");
    }

    #[tokio::test]
    async fn services_get_addresses_that_survive_syncs_and_conflicts_reject_the_commit() {
        use k8s_openapi::api::core::v1::Service;
        let (store, controller, repo) = setup().await;
        let svc = |name: &str, extra: &str| {
            format!(
                "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\nspec:\n  type: NodePort\n{extra}  selector:\n    app: web\n  ports:\n    - port: 80\n"
            )
        };
        repo.commit(&[("a.yaml", &svc("a", "")), ("b.yaml", &svc("b", "  clusterIP: 10.96.5.5\n"))]);
        assert_eq!(sync(&store, &controller, "a").await.status, "Synced");
        let services = Api::<Service>::new(store.clone());
        let spec = |s: Service| s.spec.unwrap();
        let a = spec(services.get("default", "a").await.unwrap().unwrap());
        let (ip, node_port) = (a.cluster_ip.clone().unwrap(), a.ports.unwrap()[0].node_port.unwrap());
        assert!(
            ip.starts_with("10.96.") && ip != "10.96.5.5" && (30000..=32767).contains(&node_port),
            "{ip} {node_port}"
        );
        assert_eq!(spec(services.get("default", "b").await.unwrap().unwrap()).cluster_ip.as_deref(), Some("10.96.5.5"));

        // A change to the Service (its ports list is replaced whole) keeps what was allocated,
        // and a re-sync of the same commit writes nothing.
        repo.commit(&[
            ("a.yaml", &svc("a", "").replace("app: web", "app: web2")),
            ("b.yaml", &svc("b", "  clusterIP: 10.96.5.5\n")),
        ]);
        assert_eq!(sync(&store, &controller, "a").await.status, "Synced");
        let again = spec(services.get("default", "a").await.unwrap().unwrap());
        assert_eq!((again.cluster_ip.unwrap(), again.ports.unwrap()[0].node_port.unwrap()), (ip.clone(), node_port));
        let informer = Informer::spawn(store.clone(), watched_kinds());
        let before = store.revision().await.unwrap();
        informer.wait_for(before).await;
        let app = Api::<Application>::new(store.clone()).get("gitplane-system", "a").await.unwrap().unwrap();
        let _ = controller.sync(&app, Reason::Reconcile, &informer).await;
        assert_eq!(store.revision().await.unwrap(), before, "nothing to write on a resync");

        // A clusterIP another Service holds rejects the commit, naming both; the last good stays.
        repo.commit(&[
            ("a.yaml", &svc("a", "")),
            ("b.yaml", &svc("b", "  clusterIP: 10.96.5.5\n")),
            ("c.yaml", &svc("c", &format!("  clusterIP: {ip}\n"))),
        ]);
        let status = sync(&store, &controller, "a").await;
        assert_eq!(status.status, "Failed");
        assert!(
            status.errors[0].starts_with("c.yaml:1: Service c: /spec/clusterIP: ")
                && status.errors[0].contains("clusterIP of Service default/a"),
            "{:?}",
            status.errors
        );
        // Pruned with its Service, the address can be given to another in the same commit.
        repo.commit(&[("c.yaml", &svc("c", &format!("  clusterIP: {ip}\n")))]);
        assert_eq!(sync(&store, &controller, "a").await.status, "Synced");
        assert_eq!(spec(services.get("default", "c").await.unwrap().unwrap()).cluster_ip, Some(ip));
    }

    #[tokio::test]
    async fn a_pod_bound_to_a_missing_node_rejects_the_commit() {
        let (store, controller, repo) = setup().await;
        let pod = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  nodeName: ghost\n  containers:\n    - name: c\n      image: i\n";
        repo.commit(&[("pod.yaml", pod), ("cm.yaml", CM)]);
        let status = sync(&store, &controller, "a").await;
        assert_eq!(status.status, "Failed");
        assert_eq!(
            status.errors,
            [
                "pod.yaml:1: Pod p: /spec/nodeName: node \"ghost\" does not exist: remove spec.nodeName and let the scheduler place the Pod"
            ]
        );
        assert!(Api::<Pod>::new(store.clone()).get("default", "p").await.unwrap().is_none());
        assert!(
            Api::<ConfigMap>::new(store.clone()).get("default", "settings").await.unwrap().is_none(),
            "nothing of the commit is applied"
        );
    }

    #[tokio::test]
    async fn missing_namespaces_and_foreign_objects_are_errors() {
        let (store, controller, repo) = setup().await;
        repo.commit(&[("cm.yaml", CM)]);
        assert_eq!(sync(&store, &controller, "a").await.status, "Synced");
        // Application b claims a's ConfigMap, and uses a namespace nobody made.
        let elsewhere = CM.replace("  name: settings\n", "  name: x\n  namespace: nowhere\n");
        repo.commit(&[("cm.yaml", CM), ("x.yaml", &elsewhere)]);
        let status = sync(&store, &controller, "b").await;
        assert_eq!(status.status, "Failed");
        let errors = status.errors.join("\n");
        assert!(errors.contains("already exists and is managed by Application gitplane-system/a"), "{errors}");
        assert!(errors.contains("namespace \"nowhere\" does not exist"), "{errors}");
    }

    /// Waits for a condition on an Application's status.
    async fn wait_status(
        store: &Arc<dyn Store>,
        name: &str,
        what: &str,
        check: impl Fn(&ApplicationStatus) -> bool,
    ) -> ApplicationStatus {
        let api = Api::<Application>::new(store.clone());
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let status = api.get("gitplane-system", name).await.unwrap().and_then(|a| a.status).unwrap_or_default();
            if check(&status) {
                return status;
            }
            assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {name}: {what}; status: {status:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    const DEPLOYMENT: &str = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\nspec:\n  replicas: 1\n  selector:\n    matchLabels: {app: web}\n  template:\n    metadata:\n      labels: {app: web}\n    spec:\n      containers:\n        - {name: web, image: gitplane.local/httpd:1}\n";

    #[tokio::test]
    async fn a_sync_reports_its_own_commits_health_not_the_last_ones() {
        let (store, controller, repo) = setup().await;
        repo.commit(&[("cm.yaml", CM)]);
        assert_eq!(sync(&store, &controller, "a").await.status, "Synced");
        // As the health loop found it: a ConfigMap is healthy once it exists.
        let api = Api::<Application>::new(store.clone());
        let mut a = api.get("gitplane-system", "a").await.unwrap().unwrap();
        a.status.as_mut().unwrap().health = Some(HealthStatus { status: "Healthy".into(), ..Default::default() });
        api.update_status(&a).await.unwrap();

        // A Deployment nothing runs yet: the status that says Synced must not say Healthy.
        let commit = repo.commit(&[("cm.yaml", CM), ("deploy.yaml", DEPLOYMENT)]);
        let synced = sync(&store, &controller, "a").await;
        assert_eq!((synced.status.as_str(), synced.revision.as_deref()), ("Synced", Some(commit.as_str())));
        let health = api.get("gitplane-system", "a").await.unwrap().unwrap().status.unwrap().health.unwrap();
        assert_eq!(health.status, "Progressing", "{health:?}");
        assert_eq!(health.message.as_deref(), Some("Deployment web: waiting for the rollout to start"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn depends_on_waits_for_synced_and_healthy() {
        let (store, controller, repo) = setup().await;
        // Nothing runs the Deployment here (no controllers), so `first` stays Progressing.
        repo.commit(&[("first/deploy.yaml", DEPLOYMENT), ("second/cm.yaml", CM)]);
        let api = Api::<Application>::new(store.clone());
        let mut second = app("second");
        second.spec.path = "second".into();
        second.spec.depends_on = vec!["first".into()];
        api.create(&second).await.unwrap();
        let loop_ = tokio::spawn(controller.run(Informer::spawn(store.clone(), watched_kinds())));
        wait_status(&store, "second", "waiting for a missing dependency", |s| {
            s.sync.as_ref().and_then(|s| s.message.as_deref()).is_some_and(|m| m.contains("does not exist"))
        })
        .await;
        let mut first = app("first");
        first.spec.path = "first".into();
        api.create(&first).await.unwrap();
        wait_status(&store, "first", "synced and progressing", |s| {
            s.sync.as_ref().is_some_and(|s| s.status == "Synced")
                && s.health.as_ref().is_some_and(|h| h.status == "Progressing")
        })
        .await;
        let waiting = wait_status(&store, "second", "waiting for health", |s| {
            s.sync.as_ref().and_then(|s| s.message.as_deref()).is_some_and(|m| m.contains("Progressing"))
        })
        .await;
        assert_eq!(waiting.sync.unwrap().status, "OutOfSync");
        // The Deployment becomes available (as its controllers would report): second goes.
        let deployments = Api::<k8s_openapi::api::apps::v1::Deployment>::new(store.clone());
        let mut d = deployments.get("default", "web").await.unwrap().unwrap();
        d.status = Some(k8s_openapi::api::apps::v1::DeploymentStatus {
            observed_generation: d.metadata.generation,
            replicas: Some(1),
            updated_replicas: Some(1),
            available_replicas: Some(1),
            ready_replicas: Some(1),
            ..Default::default()
        });
        deployments.update_status(&d).await.unwrap();
        wait_status(&store, "second", "synced after its dependency", |s| {
            s.sync.as_ref().is_some_and(|s| s.status == "Synced")
        })
        .await;
        loop_.abort();
    }

    /// A Job hook, in YAML: `metadata` lines, then a Pod that ends.
    fn hook_job(metadata: &str) -> String {
        format!(
            "apiVersion: batch/v1\nkind: Job\nmetadata:\n{metadata}spec:\n  template:\n    spec:\n      \
             restartPolicy: Never\n      containers:\n        - {{name: m, image: gitplane.local/busybox:1}}\n"
        )
    }

    /// Ends the Job whose name starts with `prefix` with condition `outcome`, as the Job
    /// controller would.
    async fn end_job(store: &Arc<dyn Store>, prefix: &str, outcome: &str) -> String {
        use k8s_openapi::api::batch::v1::{Job, JobCondition, JobStatus};
        let jobs = Api::<Job>::new(store.clone());
        let (all, _) = jobs.list(Some("default")).await.unwrap();
        let mut job = all.into_iter().find(|j| j.metadata.name.as_deref().unwrap().starts_with(prefix)).unwrap();
        let condition = JobCondition { type_: outcome.into(), status: "True".into(), ..Default::default() };
        job.status = Some(JobStatus { conditions: Some(vec![condition]), ..Default::default() });
        jobs.update_status(&job).await.unwrap();
        job.metadata.name.unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn hooks_run_at_their_phase_and_waves_wait_for_the_ones_before() {
        use k8s_openapi::api::batch::v1::Job;
        let (store, controller, repo) = setup().await;
        let presync = hook_job(
            "  generateName: migrate-\n  annotations:\n    argocd.argoproj.io/hook: PreSync\n    \
             argocd.argoproj.io/hook-delete-policy: HookSucceeded\n",
        );
        let postsync = hook_job("  name: smoke\n  annotations:\n    argocd.argoproj.io/hook: PostSync\n");
        let later = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: later\n  annotations:\n    \
                     argocd.argoproj.io/sync-wave: \"1\"\ndata: {b: \"2\"}\n";
        repo.commit(&[("cm.yaml", CM), ("hooks.yaml", &format!("{presync}---\n{postsync}")), ("later.yaml", later)]);
        let (configmaps, jobs) = (Api::<ConfigMap>::new(store.clone()), Api::<Job>::new(store.clone()));
        let message = |s: &SyncStatus| s.message.clone().unwrap_or_default();

        // PreSync: the hook runs, nothing of the commit is applied yet.
        let status = sync(&store, &controller, "a").await;
        assert_eq!(status.status, "OutOfSync");
        assert!(message(&status).contains("PreSync wave 0: waiting for hook Job.batch default/migrate-"), "{status:?}");
        assert!(configmaps.get("default", "settings").await.unwrap().is_none());
        let migrate = end_job(&store, "migrate-", "Complete").await;
        assert!(migrate.starts_with("migrate-") && migrate.contains("-presync-"), "{migrate}");

        // Its success deletes it (HookSucceeded); both waves go, then PostSync waits for its hook.
        let status = sync(&store, &controller, "a").await;
        assert!(message(&status).contains("PostSync wave 0: waiting for hook Job.batch default/smoke"), "{status:?}");
        assert!(jobs.get("default", &migrate).await.unwrap().is_none(), "HookSucceeded deletes it");
        for name in ["settings", "later"] {
            let cm = configmaps.get("default", name).await.unwrap().unwrap();
            assert!(!cm.metadata.annotations.unwrap_or_default().contains_key(hooks::HOOK_OF_ANNOTATION));
        }
        let smoke = jobs.get("default", "smoke").await.unwrap().unwrap();
        assert_eq!(smoke.metadata.annotations.unwrap()[hooks::HOOK_OF_ANNOTATION], "gitplane-system/a");
        end_job(&store, "smoke", "Complete").await;
        let status = sync(&store, &controller, "a").await;
        assert_eq!(status.status, "Synced", "{status:?}");
        assert_eq!(status.changes.map(|c| c.created), Some(2), "hooks are not the desired state");
        assert!(
            jobs.get("default", "smoke").await.unwrap().is_some(),
            "BeforeHookCreation keeps it until the next sync"
        );
        // A later sync of the same commit runs no hook again and prunes none.
        let again = sync(&store, &controller, "a").await;
        assert_eq!((again.status.as_str(), jobs.list(Some("default")).await.unwrap().0.len()), ("Synced", 1));

        // A failing PreSync hook: the commit is not applied, the sync fails and says why.
        repo.commit(&[("cm.yaml", &CM.replace("a: \"1\"", "a: \"2\"")), ("hooks.yaml", &presync)]);
        sync(&store, &controller, "a").await;
        end_job(&store, "migrate-", "Failed").await;
        let failed = sync(&store, &controller, "a").await;
        assert_eq!(failed.status, "Failed", "{failed:?}");
        assert!(failed.errors[0].contains("PreSync hook Job.batch default/migrate-"), "{failed:?}");
        assert!(failed.errors[0].contains("nothing of the commit was applied"), "{failed:?}");
        let settings = configmaps.get("default", "settings").await.unwrap().unwrap();
        assert_eq!(settings.data.unwrap()["a"], "1");
        assert!(configmaps.get("default", "later").await.unwrap().is_some(), "nothing pruned");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn drift_is_corrected_and_reported() {
        let (store, controller, repo) = setup().await;
        repo.commit(&[("cm.yaml", CM)]);
        Api::<Application>::new(store.clone()).create(&app("a")).await.unwrap();
        let loop_ = tokio::spawn(controller.run(Informer::spawn(store.clone(), watched_kinds())));
        wait_status(&store, "a", "synced", |s| s.sync.as_ref().is_some_and(|s| s.status == "Synced")).await;
        // A write that did not come from Git.
        let configmaps = Api::<ConfigMap>::new(store.clone());
        let mut cm = configmaps.get("default", "settings").await.unwrap().unwrap();
        cm.data.as_mut().unwrap().insert("a".into(), "changed by hand".into());
        configmaps.update(&cm).await.unwrap();
        let status = wait_status(&store, "a", "drift corrected", |s| {
            s.sync.as_ref().and_then(|s| s.changes.as_ref()).is_some_and(|c| c.drift_corrected == 1)
        })
        .await;
        assert_eq!(status.sync.unwrap().status, "Synced");
        let restored = configmaps.get("default", "settings").await.unwrap().unwrap();
        assert_eq!(restored.data.unwrap()["a"], "1");
        // The recorder writes once a second.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let drift = loop {
            let (events, _) = Api::<Event>::new(store.clone()).list(Some("default")).await.unwrap();
            if let Some(e) = events.into_iter().find(|e| e.reason.as_deref() == Some("DriftCorrected")) {
                break e;
            }
            assert!(tokio::time::Instant::now() < deadline, "no DriftCorrected event");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert!(drift.message.as_deref().unwrap().contains("ConfigMap default/settings"), "{drift:?}");
        assert_eq!(drift.involved_object.uid, restored.metadata.uid, "kubectl describe matches on the uid");
        assert_eq!(drift.source.and_then(|s| s.component).as_deref(), Some("gitplane-source"));
        loop_.abort();
    }
    /// A push judged, then synced: the sync commits the verdict's plan while the cache reads as
    /// the verdict's plan read it, and plans again when the store moved in between; either way
    /// a fresh full plan afterwards finds nothing to do.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_sync_commits_the_verdicts_plan_unless_the_store_moved() {
        let (store, controller, repo) = setup().await;
        let informers = Arc::new(gitplane_store::informer::SharedInformerFactory::new(store.clone(), watched_kinds()));
        let verdicts = verdict::Verdicts::new(
            store.clone(),
            informers.clone(),
            apply::RecordKey::new([1; 32]),
            allocate::ServiceRanges::default(),
        );
        let controller = controller.with_plans(verdicts.plans());
        let informer = informers.informer();
        let apps = Api::<Application>::new(store.clone());
        apps.create(&app("a")).await.unwrap();
        let git = git2::Repository::open_bare(repo.dir.path().join("app.git")).unwrap();
        let sync = |reason: Reason| {
            let (store, apps, informer, controller) = (&store, &apps, &informer, &controller);
            async move {
                informer.wait_for(store.revision().await.unwrap()).await;
                let current = apps.get("gitplane-system", "a").await.unwrap().unwrap();
                controller.sync(&current, reason, informer).await.result
            }
        };
        let mut head = repo.commit(&[("cm.yaml", CM)]).parse().unwrap();
        assert_eq!(sync(Reason::Commit).await, "Synced");
        let configmaps = Api::<ConfigMap>::new(store.clone());
        // (value pushed, whether the store moves between the verdict and the sync, stats after)
        let cases = [("2", false, (1, 1, 0)), ("3", true, (2, 1, 1))];
        for (value, moved, (kept, reused, replanned)) in cases {
            // The pushed commit, judged while the branch still points at its parent.
            let pushed = test_commit(&git, &[("cm.yaml", &CM.replace("\"1\"", &format!("\"{value}\"")))], Some(head));
            git.reference("refs/heads/main", head, true, "the push is not in yet").unwrap();
            informer.wait_for(store.revision().await.unwrap()).await;
            let update = verdict::RefUpdate { old: head, new: pushed, name: "refs/heads/main".into() };
            let judged = verdicts.judge(&repo.dir.path().join("app.git"), None, &[update]).await;
            assert!(judged.accept, "{}", judged.output);
            git.reference("refs/heads/main", pushed, true, "the push").unwrap();
            head = pushed;
            if moved {
                let other = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": "other", "namespace": "default"}});
                configmaps.create(&serde_json::from_value(other).unwrap()).await.unwrap();
            }
            assert_eq!(sync(Reason::Commit).await, "Synced", "{value}");
            let stats = controller.plan_stats();
            assert_eq!((stats.kept, stats.reused, stats.replanned), (kept, reused, replanned), "{value}");
            let cm = configmaps.get("default", "settings").await.unwrap().unwrap();
            assert_eq!(cm.data.unwrap()["a"], value);
            assert_eq!(sync(Reason::Reconcile).await, "Unchanged", "a fresh plan finds nothing to do ({value})");
        }
    }
}
