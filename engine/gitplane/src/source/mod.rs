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
//! health ([`health`]) is the worst of its objects'.

pub mod apply;
mod health;

use crate::{
    mirror::{self, MirrorStatus, Mirrors, is_url},
    source::health::Health,
};
use gitplane_api::{
    Application, ApplicationStatus, HealthStatus, ResourceHealth, RevisionHistory, SyncChanges, SyncStatus,
    kinds::accepted,
    object::{APPLICATION_ANNOTATION, kind_of, resource_version},
};
use gitplane_source::{AppSource, Limits, LoadError, ManifestError, SourceCache, Validator};
use gitplane_store::{
    Api, EventType, ObjectKey, Store, StoreError,
    informer::{Cache, Informer, Notification},
};
use k8s_openapi::api::{
    apps::v1::ReplicaSet,
    core::v1::{Event, Namespace, Node, ObjectReference},
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use notify::Watcher;
use serde_json::Value;
use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};
use tokio::sync::{broadcast::error::RecvError, mpsc};

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

/// Why an Application is queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Reason {
    /// A new commit may be there: sync it unless it was already handled.
    Commit,
    /// Objects may differ from Git (drift, a resync): plan again even for the same commit.
    Reconcile,
}

pub struct SourceController {
    store: Arc<dyn Store>,
    repos_dir: PathBuf,
    mirrors: Mirrors,
    validator: Arc<Validator>,
    limits: Limits,
    resync: Duration,
    /// Each Application's parsed and validated files, by blob: a commit re-reads only changes.
    caches: std::sync::Mutex<HashMap<ObjectKey, SourceCache>>,
    /// What each Application owns and applied last (see [`apply::Inventory`]).
    inventories: std::sync::Mutex<HashMap<ObjectKey, apply::Inventory>>,
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
fn watched_kinds() -> Vec<String> {
    let mut kinds: Vec<String> = accepted().iter().map(|k| k.group_kind()).collect();
    kinds.push(kind_of::<Node>());
    kinds.push(kind_of::<ReplicaSet>());
    kinds
}

impl SourceController {
    pub fn new(store: Arc<dyn Store>, repos_dir: PathBuf, mirrors: Mirrors) -> Self {
        SourceController {
            store,
            repos_dir,
            mirrors,
            validator: Arc::new(Validator::new()),
            limits: Limits::default(),
            resync: Duration::from_secs(60),
            caches: Default::default(),
            inventories: Default::default(),
        }
    }

    /// The bare repository an Application reads: a hosted one (`demo` for repos/demo.git) or the
    /// local mirror of a remote URL. `Ok(None)` while a new mirror has not fetched yet.
    fn repo_path(&self, repo: &str) -> Result<Option<PathBuf>, SyncError> {
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
                Some(MirrorStatus { last_error: Some(error), .. }) => Err(SyncError::Spec(error)),
                _ => Ok(None),
            };
        }
        let plain = !repo.is_empty() && repo.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if !plain || repo.starts_with('.') {
            return Err(SyncError::Spec(format!(
                "spec.repo {repo:?} is neither a hosted repository's name (like `demo` for repos/demo.git) nor a URL"
            )));
        }
        let path = self.repos_dir.join(format!("{repo}.git"));
        if !path.exists() {
            // An Application names a hosted repository that does not exist yet: make it empty, so
            // its first push has somewhere to go.
            crate::bootstrap::empty_repo(&self.repos_dir, repo).map_err(|e| SyncError::Spec(format!("{e:#}")))?;
            tracing::info!(%repo, "created an empty hosted repository");
        }
        Ok(Some(path))
    }

    pub async fn run(self) {
        let informer = Informer::spawn(self.store.clone(), watched_kinds());
        let mut notifications = informer.subscribe();
        informer.wait_synced().await;
        let cache = informer.cache().clone();
        let (pushed_tx, mut pushed) = mpsc::unbounded_channel::<PathBuf>();
        let mut watchers: HashMap<PathBuf, notify::RecommendedWatcher> = HashMap::new();
        let mut queue: BTreeMap<ObjectKey, Reason> = BTreeMap::new();
        let mut unhealthy: BTreeSet<ObjectKey> = BTreeSet::new();
        let mut generations: HashMap<ObjectKey, Option<i64>> = HashMap::new();
        let mut resync = tokio::time::interval(self.resync);
        let mut health_tick = tokio::time::interval(HEALTH_DEBOUNCE);
        let apps = |cache: &Cache| cache.list_typed::<Application>(None);
        let mut fetched = self.mirrors.changes();
        loop {
            let current = apps(&cache);
            for app in &current {
                if !is_url(&app.spec.repo)
                    && let Ok(Some(path)) = self.repo_path(&app.spec.repo)
                    && !watchers.contains_key(&path)
                    && let Some(w) = watch_refs(&path, pushed_tx.clone())
                {
                    watchers.insert(path, w);
                }
            }
            // Stop fetching what no Application names any more.
            for url in self.mirrors.tracked() {
                if !current.iter().any(|a| a.spec.repo == url) {
                    self.mirrors.untrack(&url);
                }
            }
            while let Some((key, reason)) = queue.pop_first() {
                // From the store, not the cache: the cache may not show our last status write
                // yet, and the status says which commit was already handled.
                match Api::<Application>::new(self.store.clone()).get(&key.namespace, &key.name).await {
                    Ok(Some(app)) => {
                        if self.sync(&app, reason, &informer).await {
                            unhealthy.insert(key);
                        }
                    }
                    Ok(None) => {}
                    Err(e) => tracing::warn!(application = %key, error = %e, "reading the Application failed"),
                }
            }
            tokio::select! {
                n = notifications.recv() => match n {
                    Ok(Notification::Changed(e)) => self.observe(&e, &cache, &mut queue, &mut unhealthy, &mut generations),
                    Ok(Notification::Resync) | Err(RecvError::Lagged(_)) => {
                        // Events were missed: no inventory can vouch for the store any more.
                        self.inventories.lock().unwrap_or_else(|e| e.into_inner()).values_mut().for_each(apply::Inventory::distrust);
                        for app in apps(&cache) {
                            queue.insert(app_key(&app), Reason::Reconcile);
                        }
                    }
                    Err(RecvError::Closed) => return,
                },
                Some(path) = pushed.recv() => {
                    let mut paths = HashSet::from([path]);
                    while let Ok(p) = pushed.try_recv() {
                        paths.insert(p);
                    }
                    for app in apps(&cache) {
                        if !is_url(&app.spec.repo) && self.repo_path(&app.spec.repo).is_ok_and(|p| p.is_some_and(|p| paths.contains(&p))) {
                            queue.entry(app_key(&app)).or_insert(Reason::Commit);
                        }
                    }
                }
                Ok(url) = fetched.recv() => {
                    for app in apps(&cache) {
                        if app.spec.repo == url {
                            queue.entry(app_key(&app)).or_insert(Reason::Commit);
                        }
                    }
                }
                _ = resync.tick() => {
                    for app in apps(&cache) {
                        queue.insert(app_key(&app), Reason::Reconcile);
                    }
                }
                _ = health_tick.tick(), if !unhealthy.is_empty() => {
                    for key in std::mem::take(&mut unhealthy) {
                        self.assess_health(&key, &cache).await;
                    }
                }
            }
        }
    }

    /// Maps a change to the Applications it concerns.
    fn observe(
        &self,
        event: &gitplane_store::Event,
        cache: &Cache,
        queue: &mut BTreeMap<ObjectKey, Reason>,
        unhealthy: &mut BTreeSet<ObjectKey>,
        generations: &mut HashMap<ObjectKey, Option<i64>>,
    ) {
        if event.key.kind == kind_of::<Application>() {
            // Our own status writes need no sync; spec changes bump the generation.
            let generation = event.object["metadata"]["generation"].as_i64();
            let deleted = event.event_type == EventType::Deleted;
            if deleted {
                self.caches.lock().unwrap_or_else(|e| e.into_inner()).remove(&event.key);
                self.inventories.lock().unwrap_or_else(|e| e.into_inner()).remove(&event.key);
            }
            if deleted || generations.insert(event.key.clone(), generation) != Some(generation) {
                queue.entry(event.key.clone()).or_insert(Reason::Commit);
                unhealthy.insert(event.key.clone());
            }
            // Applications that depend on this one may go now.
            for app in cache.list_typed::<Application>(Some(&event.key.namespace)) {
                if app.spec.depends_on.contains(&event.key.name) {
                    queue.entry(app_key(&app)).or_insert(Reason::Commit);
                }
            }
            return;
        }
        // Whoever wrote it (an inventory skips its own writes): by key, as the write may also
        // have changed the inventory annotation.
        let revision = (event.event_type != EventType::Deleted).then(|| resource_version(&event.object)).flatten();
        for inventory in self.inventories.lock().unwrap_or_else(|e| e.into_inner()).values_mut() {
            inventory.touched(&event.key, revision);
        }
        if let Some(owner) =
            event.object["metadata"]["annotations"][APPLICATION_ANNOTATION].as_str().and_then(owner_key)
        {
            let changed_outside = event.event_type == EventType::Deleted || apply::drifted(&event.object);
            if changed_outside {
                queue.insert(owner.clone(), Reason::Reconcile);
            }
            // Other kinds are healthy once they exist: a ConfigMap's change changes no health.
            if event.event_type == EventType::Deleted || health::assessed(&event.key.kind) {
                unhealthy.insert(owner);
            }
        } else if matches!(event.key.kind.as_str(), "Pod" | "ReplicaSet.apps") {
            // Pods and ReplicaSets carry no inventory annotation: assess the Applications of
            // that namespace's workloads.
            for app in cache.list_typed::<Application>(None) {
                if app.spec.namespace.as_deref().unwrap_or(gitplane_api::object::DEFAULT_NAMESPACE)
                    == event.key.namespace
                {
                    unhealthy.insert(app_key(&app));
                }
            }
        }
    }

    /// One sync of one Application; the outcome goes to its status, Events and the log. Whether
    /// the Application's health may have changed: its sync status did, or objects with a
    /// health rule were written.
    async fn sync(&self, app: &Application, reason: Reason, informer: &Informer) -> bool {
        let id = app_id(app);
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
            return true;
        }
        let started = Instant::now();
        let started_at = rfc3339();
        let outcome = self.sync_commit(app, &last, reason, informer).await;
        let elapsed = started.elapsed();
        let duration_ms = Some(elapsed.as_millis() as u64);
        match outcome {
            Ok(None) => false,
            Ok(Some(applied)) => {
                tracing::info!(application = %id, commit = %applied.commit, created = applied.plan.created,
                    updated = applied.plan.updated, pruned = applied.plan.pruned,
                    drift = applied.plan.drifted.len(), ?elapsed, "synced");
                for key in &applied.plan.drifted {
                    self.record_event(
                        key,
                        "Warning",
                        "DriftCorrected",
                        &format!("{key} was changed outside Git; restored to commit {}", short(&applied.commit)),
                    )
                    .await;
                }
                let new_revision = last.revision.as_deref() != Some(applied.commit.as_str());
                self.update_status(app, |s| {
                    if new_revision {
                        s.history.insert(
                            0,
                            RevisionHistory {
                                revision: applied.commit.clone(),
                                commit_subject: applied.subject.clone(),
                                applied_at: rfc3339(),
                            },
                        );
                        s.history.truncate(HISTORY);
                    }
                    s.sync = Some(SyncStatus {
                        status: "Synced".into(),
                        revision: Some(applied.commit.clone()),
                        commit_subject: Some(applied.subject.clone()),
                        attempted_revision: Some(applied.commit.clone()),
                        errors: Vec::new(),
                        message: None,
                        started_at: Some(started_at.clone()),
                        finished_at: Some(rfc3339()),
                        duration_ms,
                        changes: Some(SyncChanges {
                            created: applied.plan.created as u32,
                            updated: applied.plan.updated as u32,
                            pruned: applied.plan.pruned as u32,
                            drift_corrected: applied.plan.drifted.len() as u32,
                        }),
                    });
                })
                .await;
                last.status != "Synced"
                    || applied.plan.ops.iter().any(|op| op.key().is_ok_and(|k| health::assessed(&k.kind)))
            }
            Err((commit, e)) => {
                let errors: Vec<String> = match &e {
                    SyncError::Invalid(errors) => errors.iter().map(ToString::to_string).collect(),
                    other => vec![other.to_string()],
                };
                tracing::error!(application = %id, commit = commit.as_deref().unwrap_or("-"),
                    "commit rejected, {} stays applied:\n  {}", last.revision.as_deref().unwrap_or("nothing"), errors.join("\n  "));
                self.record_event(
                    &app_key(app),
                    "Warning",
                    "SyncFailed",
                    &format!(
                        "commit {} rejected: {} error(s), the first: {}",
                        commit.as_deref().map(short).unwrap_or("-"),
                        errors.len(),
                        errors.first().map(String::as_str).unwrap_or("")
                    ),
                )
                .await;
                // Only a rejected commit is final; anything else is retried at the next resync.
                let attempted = if matches!(e, SyncError::Invalid(_)) { commit } else { None };
                self.update_status(app, |s| {
                    let sync = s.sync.get_or_insert_with(Default::default);
                    sync.status = "Failed".into();
                    sync.attempted_revision = attempted.clone();
                    sync.errors = errors.clone();
                    sync.message = None;
                    sync.started_at = Some(started_at.clone());
                    sync.finished_at = Some(rfc3339());
                    sync.duration_ms = duration_ms;
                })
                .await;
                true
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
    ) -> Result<Option<Applied>, (Option<String>, SyncError)> {
        let Some(repo) = self.repo_path(&app.spec.repo).map_err(|e| (None, e))? else {
            return Ok(None); // the mirror's first fetch is still running; its change will queue us
        };
        let branch = app.spec.branch.clone();
        let head = tokio::task::spawn_blocking(move || gitplane_source::read_head(&repo, &branch))
            .await
            .map_err(|e| (None, SyncError::Spec(format!("reading the repository failed: {e}"))))?
            .map_err(|e| (None, e.into()))?;
        let handled = last.attempted_revision.as_deref() == Some(head.id.as_str());
        if handled && (reason == Reason::Commit || last.status == "Failed") {
            return Ok(None);
        }
        let commit = CommitInfo { id: head.id.clone(), subject: head.subject.clone() };
        let fail = |e: SyncError| (Some(commit.id.clone()), e);
        // Only the files that changed since the last load are rendered and validated again.
        let key = app_key(app);
        let mut cache = self.caches.lock().unwrap_or_else(|e| e.into_inner()).remove(&key).unwrap_or_default();
        let (source, validator, limits) =
            (AppSource::from_spec(&app.spec), self.validator.clone(), self.limits.clone());
        let (loaded, cache) = tokio::task::spawn_blocking(move || {
            let loaded = gitplane_source::load_commit(&head, &source, &validator, &limits, &mut cache);
            (loaded, cache)
        })
        .await
        .map_err(|e| fail(SyncError::Spec(format!("loading the commit failed: {e}"))))?;
        self.caches.lock().unwrap_or_else(|e| e.into_inner()).insert(key.clone(), cache);
        let manifests = loaded.map_err(|e| match e {
            LoadError::Invalid(errors) => fail(SyncError::Invalid(errors)),
            LoadError::Source(e) => fail(e.into()),
        })?;
        let mut inventory = self.inventories.lock().unwrap_or_else(|e| e.into_inner()).remove(&key).unwrap_or_default();
        if reason == Reason::Reconcile {
            inventory.distrust();
        }
        let applied = self.apply(app, &manifests, &mut inventory, informer).await;
        self.inventories.lock().unwrap_or_else(|e| e.into_inner()).insert(key, inventory);
        match applied {
            Ok(plan) if plan.ops.is_empty() && handled => Ok(None),
            Ok(plan) => Ok(Some(Applied { commit: commit.id.clone(), subject: commit.subject.clone(), plan })),
            Err(e) => Err(fail(e)),
        }
    }

    /// Plans the manifests against the store and commits the plan as one transaction, planning
    /// again (in full) when a concurrent writer got in between; `inventory` follows.
    async fn apply(
        &self,
        app: &Application,
        manifests: &[Arc<gitplane_source::Manifest>],
        inventory: &mut apply::Inventory,
        informer: &Informer,
    ) -> Result<apply::Plan, SyncError> {
        let id = app_id(app);
        let policy = apply::Policy { app: &id, prune: app.spec.prune, allow_empty: app.spec.allow_empty };
        let mut last_conflict = None;
        for _ in 0..CONFLICT_RETRIES {
            let plan = {
                let (namespaces, nodes) = names(informer.cache());
                let stored = Accepted(informer.cache());
                let cluster = apply::Cluster { stored: &stored, inventory, namespaces: &namespaces, nodes: &nodes };
                apply::plan(manifests, &cluster, &policy).map_err(SyncError::Invalid)?
            };
            if plan.ops.is_empty() {
                inventory.record(&plan, [], policy.prune);
                return Ok(plan);
            }
            match self.store.txn(plan.ops.clone()).await {
                Ok(committed) => {
                    inventory.record(&plan, &committed.objects, policy.prune);
                    informer.wait_for(committed.revision).await;
                    return Ok(plan);
                }
                Err(e) if e.is_conflict() || e.is_already_exists() || e.is_not_found() => {
                    last_conflict = Some(e.to_string());
                    // The cache was behind: wait until it has caught up with the store, then plan
                    // again, looking at everything.
                    inventory.distrust();
                    if let Ok(revision) = self.store.revision().await {
                        informer.wait_for(revision).await;
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
        Err(SyncError::Spec(format!("objects kept changing while applying ({last}); will retry")))
    }

    /// Recomputes the health of one Application from the cache.
    async fn assess_health(&self, key: &ObjectKey, cache: &Cache) {
        let Some(app) = cache.get_typed::<Application>(&key.namespace, &key.name) else { return };
        let id = app_id(&app);
        let pods = cache.list("Pod", None);
        let pods = health::Pods::new(&pods);
        let mut worst = Health::Healthy;
        let mut resources = Vec::new();
        let mut unhealthy = 0;
        for kind in accepted() {
            for object in cache.list(&kind.group_kind(), None) {
                if !apply::owned_by(&object, &id) {
                    continue;
                }
                let (health, message) = match kind.kind.as_str() {
                    "Deployment" => health::deployment(&object),
                    "Job" => health::job(&object),
                    "Pod" => health::pod(&object),
                    "Service" => health::service(&object, &pods),
                    _ => (Health::Healthy, String::new()),
                };
                worst = worst.max(health);
                if health != Health::Healthy {
                    unhealthy += 1;
                    if resources.len() < MAX_LISTED_RESOURCES {
                        resources.push(ResourceHealth {
                            kind: kind.kind.clone(),
                            namespace: object["metadata"]["namespace"].as_str().unwrap_or("").to_owned(),
                            name: object["metadata"]["name"].as_str().unwrap_or("").to_owned(),
                            status: health.as_str().to_owned(),
                            message,
                        });
                    }
                }
            }
        }
        // Objects of the applied commit that are not in the store are Missing.
        let synced = app.status.as_ref().and_then(|s| s.sync.as_ref()).is_some_and(|s| s.status == "Synced");
        if !synced && app.status.as_ref().and_then(|s| s.sync.as_ref()).and_then(|s| s.revision.as_ref()).is_none() {
            worst = worst.max(Health::Missing);
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
        let wanted = HealthStatus { status: worst.as_str().to_owned(), message, resources };
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

    /// Creates or bumps an Event about `involved`, as the API server aggregates repeated events.
    async fn record_event(&self, involved: &ObjectKey, event_type: &str, reason: &str, message: &str) {
        let namespace = if involved.namespace.is_empty() { "default" } else { involved.namespace.as_str() };
        let name = format!(
            "{}.{}",
            gitplane_controllers::names::truncate(&involved.name, 200),
            gitplane_controllers::names::hash(format!("{}/{}/{}", involved.kind, involved.name, reason).as_bytes())
        );
        let api = Api::<Event>::new(self.store.clone());
        let time = Time(now());
        for _ in 0..CONFLICT_RETRIES {
            let result = match api.get(namespace, &name).await {
                Ok(Some(mut existing)) => {
                    existing.count = Some(existing.count.unwrap_or(1) + 1);
                    existing.last_timestamp = Some(time.clone());
                    existing.message = Some(message.to_owned());
                    api.update(&existing).await.map(|_| ())
                }
                Ok(None) => {
                    let (kind, api_version) = match involved.kind.split_once('.') {
                        Some((kind, group)) => (kind.to_owned(), format!("{group}/v1")),
                        None => (involved.kind.clone(), "v1".to_owned()),
                    };
                    let event = Event {
                        metadata: ObjectMeta {
                            name: Some(name.clone()),
                            namespace: Some(namespace.to_owned()),
                            ..Default::default()
                        },
                        involved_object: ObjectReference {
                            kind: Some(kind),
                            api_version: Some(api_version),
                            namespace: (!involved.namespace.is_empty()).then(|| involved.namespace.clone()),
                            name: Some(involved.name.clone()),
                            ..Default::default()
                        },
                        reason: Some(reason.to_owned()),
                        message: Some(message.to_owned()),
                        type_: Some(event_type.to_owned()),
                        count: Some(1),
                        first_timestamp: Some(time.clone()),
                        last_timestamp: Some(time.clone()),
                        event_time: Some(MicroTime(now())),
                        reporting_component: Some("gitplane-source".into()),
                        ..Default::default()
                    };
                    api.create(&event).await.map(|_| ())
                }
                Err(e) => Err(e),
            };
            match result {
                Err(e) if e.is_conflict() || e.is_already_exists() => continue,
                Err(e) => {
                    tracing::warn!(error = %e, reason, "recording an event failed");
                    return;
                }
                Ok(()) => return,
            }
        }
    }
}

/// The commit a sync reads.
struct CommitInfo {
    id: String,
    subject: String,
}

/// A sync that committed (or found nothing to change for a new commit).
struct Applied {
    commit: String,
    subject: String,
    plan: apply::Plan,
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

    fn owned_by(&self, app: &str) -> Vec<(ObjectKey, Arc<Value>)> {
        accepted()
            .iter()
            .flat_map(|kind| self.0.list(&kind.group_kind(), None))
            .filter(|o| apply::owned_by(o, app))
            .filter_map(|o| Some((ObjectKey::from_value(&o).ok()?, o)))
            .collect()
    }
}

/// The names of the namespaces and of the nodes, which a plan checks references against.
fn names(cache: &Cache) -> (HashSet<String>, HashSet<String>) {
    let names = |kind: String| -> HashSet<String> {
        cache.list(&kind, None).iter().filter_map(|o| o["metadata"]["name"].as_str().map(str::to_owned)).collect()
    };
    (names(kind_of::<Namespace>()), names(kind_of::<Node>()))
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
                && event.paths.iter().any(|p| p.starts_with(&heads) || *p == packed)
            {
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

#[cfg(test)]
mod tests {
    use super::*;
    use gitplane_storage::sqlite::SqliteStore;
    use k8s_openapi::api::core::v1::{ConfigMap, Pod};

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
            // An in-memory index builds the nested trees of paths like `first/deploy.yaml`.
            let mut index = git2::Index::new().unwrap();
            for (name, content) in files {
                let entry = git2::IndexEntry {
                    ctime: git2::IndexTime::new(0, 0),
                    mtime: git2::IndexTime::new(0, 0),
                    dev: 0,
                    ino: 0,
                    mode: 0o100644,
                    uid: 0,
                    gid: 0,
                    file_size: content.len() as u32,
                    id: repo.blob(content.as_bytes()).unwrap(),
                    flags: 0,
                    flags_extended: 0,
                    path: name.as_bytes().to_vec(),
                };
                index.add(&entry).unwrap();
            }
            let tree = repo.find_tree(index.write_tree_to(&repo).unwrap()).unwrap();
            let sig = git2::Signature::now("t", "t@localhost").unwrap();
            let parent = repo.find_reference("refs/heads/main").ok().and_then(|r| r.peel_to_commit().ok());
            let parents: Vec<&git2::Commit> = parent.iter().collect();
            repo.commit(Some("refs/heads/main"), &sig, &sig, "change", &tree, &parents).unwrap().to_string()
        }
    }

    async fn setup() -> (Arc<dyn Store>, SourceController, Repo) {
        let store: Arc<dyn Store> = Arc::new(SqliteStore::memory().await.unwrap());
        for ns in ["default", "gitplane-system"] {
            let ns = serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
            store.txn(vec![gitplane_store::Op::Create(ns)]).await.unwrap();
        }
        let repo = Repo::new();
        let mirrors = Mirrors::new(repo.dir.path().join("mirrors"), mirror::DEFAULT_POLL);
        let controller = SourceController::new(store.clone(), repo.dir.path().to_path_buf(), mirrors);
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

    const CM: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  a: \"1\"\n";

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
        let loop_ = tokio::spawn(controller.run());
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

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn drift_is_corrected_and_reported() {
        let (store, controller, repo) = setup().await;
        repo.commit(&[("cm.yaml", CM)]);
        Api::<Application>::new(store.clone()).create(&app("a")).await.unwrap();
        let loop_ = tokio::spawn(controller.run());
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
        let (events, _) = Api::<Event>::new(store.clone()).list(Some("default")).await.unwrap();
        let drift =
            events.iter().find(|e| e.reason.as_deref() == Some("DriftCorrected")).expect("a DriftCorrected event");
        assert!(drift.message.as_deref().unwrap().contains("ConfigMap default/settings"), "{drift:?}");
        loop_.abort();
    }
}
