//! Push-time verdicts: the sync's load, render, validation and plan, run on a pushed commit
//! before its ref moves (the pre-receive hook of [`crate::prereceive`] asks for them).
//!
//! For every Application that follows the pushed repository and branch, the pushed commit
//! (read by id, with the push's quarantined objects as an alternate object database: never the
//! branch, so a push racing another is judged on its own commit) goes through
//! [`gitplane_source::load_commit_in`] and [`apply::plan`] against the stored objects, exactly
//! as a sync would. A commit any Application would reject is refused (unless the repository
//! turns refusal off); an accepted one prints what each Application's sync will create, update
//! and prune, with the fields an update changes. Secret values are never printed.
//!
//! The plan is against the push's parent, never against how far the cluster's sync has got:
//! when the Application's sync has not handled the parent yet (pushes in quick succession),
//! the parent is loaded and planned too, and the pushed commit is planned against the stored
//! objects as the parent's sync will leave them ([`AfterParent`]); nothing waits for a sync.
//!
//! A push that any Application would reject leaves a Warning Event on each such Application
//! (`PushRefused`, or `InvalidPushAccepted` when refusal is off), so the sync timeline shows the
//! verdicts people met at the terminal, not only the commits that landed.
//!
//! Invariants: it writes nothing but those Events (not the objects, not the repository); a verdict that cannot be
//! reached (the store is unavailable) accepts the push with a warning, since the sync judges
//! again; files are rendered once per blob (a [`SourceCache`] per Application, as the sync's).
//!
//! A one-file push to a large repository costs O(changed), as its sync does: each Application
//! keeps an [`apply::Inventory`] of what the verdicts' plans found stored as Git wants it, and
//! only what the inventory cannot vouch for is compared. Verdicts run on every replica and the
//! sync only on the leader, so the inventory is the verdicts' own, not the sync's: the replica's
//! informer events keep it current ([`apply::Inventory::observed`]: other writers' changes,
//! objects the sync made from commits no verdict saw), and a verdict first waits until those
//! events have been applied up to the Application's own last write (the informer's own lag,
//! not a sync's), so the inventory agrees with the cache it plans against.
//!
//! An accepted plan against the stored objects (not a pending parent's) is left for the sync of
//! the commit ([`super::planned`]), which commits it if the cache has not moved since.
//!
//! Every verdict logs where its time went ([`Phases`]).

use super::{
    Accepted,
    allocate::ServiceRanges,
    app_id, app_key, apply, names, owner_key,
    planned::{Planned, Plans},
    reference,
};
use gitplane_api::events::{Source, WARNING};
use gitplane_api::object::resource_version;
use gitplane_api::{Application, object::APPLICATION_ANNOTATION};
use gitplane_source::{AppSource, CacheStats, Limits, LoadError, Manifest, ManifestError, SourceCache, Validator};
use gitplane_store::{
    EventType, ObjectKey, Op, Store,
    events::Recorder,
    informer::{Informer, Notification, SharedInformerFactory},
};
use serde_json::Value;
use std::{
    collections::{BTreeMap, HashMap},
    fmt::Write as _,
    path::Path,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};
use tokio::sync::{broadcast::error::RecvError, watch};

/// The repository setting that turns refusal off (`git config gitplane.refuseInvalidPushes
/// false` in the bare repository): invalid commits are then accepted with warnings.
pub const REFUSE_SETTING: &str = "gitplane.refuseInvalidPushes";
/// Changed fields printed per updated object.
const MAX_FIELDS: usize = 12;
/// Objects printed per Application and kind of change.
const MAX_OBJECTS: usize = 50;
/// The longest a verdict waits for this replica's view of the store on its first use.
const SYNC_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a verdict waits for the inventories to catch up with the informer's events before
/// it plans in full instead.
const EVENTS_WAIT: Duration = Duration::from_secs(2);

/// One ref a push updates, as the pre-receive hook reads it: `<old> <new> <ref>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefUpdate {
    pub old: git2::Oid,
    pub new: git2::Oid,
    pub name: String,
}

/// What to tell the pusher, and whether the ref updates may go ahead.
#[derive(Debug, PartialEq, Eq)]
pub struct Verdict {
    pub accept: bool,
    /// Lines for the client (git prints them as `remote:` lines).
    pub output: String,
    /// Where the time went, for the log.
    pub phases: Phases,
}

/// Where a verdict's time went, summed over the Applications it judged. The load's phases are
/// the pushed commit's; loading and planning a parent whose sync is pending is `parent`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Phases {
    /// Waiting for this replica's view of the cluster (long only on its first push).
    pub informer: Duration,
    /// Opening the repository with the push's quarantine.
    pub open: Duration,
    /// Waiting for the inventories to apply the informer's events up to the Application's
    /// last write.
    pub inventory: Duration,
    /// Loading and planning the parent, for an Application whose sync has not handled it.
    pub parent: Duration,
    /// Walking the commit's tree, finding blob sizes.
    pub walk: Duration,
    /// Reading the blobs the cache did not hold.
    pub read: Duration,
    pub render: Duration,
    /// Parsing and validating the files, and the checks across files.
    pub validate: Duration,
    /// Planning against the stored objects.
    pub plan: Duration,
    /// Writing the plan's lines (with each update's changed fields).
    pub output: Duration,
    /// Files of the pushed commits loaded, and of those processed (not in the cache).
    pub files: u64,
    pub processed: u64,
}

impl Phases {
    fn loaded(&mut self, before: &CacheStats, after: &CacheStats) {
        self.walk += after.walking.saturating_sub(before.walking);
        self.read += after.reading.saturating_sub(before.reading);
        self.render += after.rendering.saturating_sub(before.rendering);
        self.validate += after.validating.saturating_sub(before.validating);
        self.files += (after.hits + after.processed).saturating_sub(before.hits + before.processed);
        self.processed += after.processed.saturating_sub(before.processed);
    }
}

/// Judges pushes to hosted repositories; one per replica, shared by its pushes.
pub struct Verdicts {
    /// Where the informer comes from: the replica's one, shared with the leader's loops.
    informers: Arc<SharedInformerFactory>,
    record_key: apply::RecordKey,
    service_ranges: ServiceRanges,
    validator: Arc<Validator>,
    limits: Limits,
    /// This replica's view of the stored objects, taken on the first push and kept, and the
    /// revision of the last of its events applied to `inventories`.
    informer: tokio::sync::OnceCell<(Informer, watch::Receiver<i64>)>,
    /// Per Application: the outcome of each file, by blob, of the last commit judged.
    caches: Mutex<HashMap<ObjectKey, SourceCache>>,
    /// Per Application: what the verdicts' plans found stored as Git wants it.
    inventories: Arc<Mutex<HashMap<ObjectKey, apply::Inventory>>>,
    /// The plans of accepted commits, for their syncs.
    plans: Arc<Plans>,
    events: Recorder,
}

/// One Application's judgement of one ref update.
enum Judged {
    /// The plan, and its lines for the pusher after its summary.
    Plan {
        plan: apply::Plan,
        described: String,
    },
    Rejected(Vec<String>),
}

impl Verdicts {
    pub fn new(
        store: Arc<dyn Store>,
        informers: Arc<SharedInformerFactory>,
        record_key: apply::RecordKey,
        service_ranges: ServiceRanges,
    ) -> Verdicts {
        Verdicts {
            events: Recorder::spawn(store, Source::component("gitplane-verdict")),
            informers,
            record_key,
            service_ranges,
            validator: Arc::new(Validator::new()),
            limits: Limits::default(),
            informer: tokio::sync::OnceCell::new(),
            caches: Mutex::default(),
            inventories: Arc::default(),
            plans: Arc::default(),
        }
    }

    /// Where the verdicts leave their plans for the syncs that follow (the source controller
    /// of this replica takes them).
    pub fn plans(&self) -> Arc<Plans> {
        self.plans.clone()
    }

    async fn informer(&self) -> Option<&Informer> {
        let (informer, _) = self
            .informer
            .get_or_init(|| async {
                let informer = self.informers.informer();
                let observed = follow(&informer, self.inventories.clone());
                (informer, observed)
            })
            .await;
        tokio::time::timeout(SYNC_TIMEOUT, informer.wait_synced()).await.ok().map(|()| informer)
    }

    /// Waits until the inventories have seen every event up to `revision`; `false` if they
    /// did not within [`EVENTS_WAIT`].
    async fn observed(&self, revision: i64) -> bool {
        let Some((_, observed)) = self.informer.get() else { return false };
        let mut observed = observed.clone();
        matches!(tokio::time::timeout(EVENTS_WAIT, observed.wait_for(|r| *r >= revision)).await, Ok(Ok(_)))
    }

    /// The verdict on a push of `refs` to the hosted repository at `repo` (named `<name>.git`),
    /// whose new objects wait in `quarantine` until it is accepted.
    pub async fn judge(&self, repo: &Path, quarantine: Option<&Path>, refs: &[RefUpdate]) -> Verdict {
        let mut phases = Phases::default();
        let name = repo.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_suffix(".git")).unwrap_or("");
        let refuse = refuses(repo);
        let started = Instant::now();
        let informer = self.informer().await;
        phases.informer = started.elapsed();
        let Some(informer) = informer else {
            return Verdict {
                accept: true,
                output: "gitplane: warning: this replica's view of the cluster is not ready: the push was not \
                         judged (the sync will judge it)\n"
                    .into(),
                phases,
            };
        };
        let apps: Vec<Application> =
            informer.cache().list_typed::<Application>(None).into_iter().filter(|a| a.spec.repo == name).collect();
        let mut output = String::new();
        let mut rejected = false;
        // Per rejecting Application: the ref update, its error count and first error.
        let mut refusals = Vec::new();
        for update in refs {
            let Some(branch) = update.name.strip_prefix("refs/heads/") else { continue };
            let followers: Vec<&Application> = apps.iter().filter(|a| a.spec.branch == branch).collect();
            if followers.is_empty() {
                continue;
            }
            let range = format!("{branch} {}..{}", short_oid(update.old), short_oid(update.new));
            // Judged against the parent the push names: if another push moved the branch since,
            // git's compare-and-swap will refuse this one, and a plan against the other's state
            // would mislead.
            let current = branch_head(repo, &update.name);
            if current != update.old {
                let _ = writeln!(
                    output,
                    "gitplane: {branch} moved to {} since this push read it: fetch, rebase and push again",
                    short_oid(current)
                );
                return Verdict { accept: false, output, phases };
            }
            if update.new.is_zero() {
                let ids: Vec<String> = followers.iter().map(|a| app_id(a)).collect();
                let _ = writeln!(
                    output,
                    "gitplane: deleting branch {branch}, which Application(s) {} follow: their syncs will fail",
                    ids.join(", ")
                );
                rejected = true;
                continue;
            }
            for app in followers {
                let id = app_id(app);
                let path = if app.spec.path.is_empty() { ".".to_owned() } else { app.spec.path.clone() };
                match self.judge_one(app, repo, quarantine, update, informer, &mut phases).await {
                    Judged::Rejected(errors) => {
                        rejected = true;
                        refusals.push((
                            app_key(app),
                            range.clone(),
                            errors.len(),
                            errors.first().cloned().unwrap_or_default(),
                        ));
                        let verb = if refuse { "error" } else { "warning" };
                        let _ = writeln!(
                            output,
                            "gitplane: {verb}: {range}: Application {id} (path {path}) would reject this commit, {}:",
                            plural(errors.len(), "error")
                        );
                        for error in &errors {
                            let _ = writeln!(output, "  {error}");
                        }
                    }
                    Judged::Plan { plan, described } => {
                        let _ = writeln!(
                            output,
                            "gitplane: {range}: Application {id} (path {path}): {} to create, {} to update, {} to prune",
                            plan.created, plan.updated, plan.pruned
                        );
                        output.push_str(&described);
                        for warning in &plan.warnings {
                            let _ = writeln!(output, "gitplane: warning: {range}: {}", warning.message);
                        }
                    }
                }
            }
        }
        let (reason, outcome) = if refuse { ("PushRefused", "refused") } else { ("InvalidPushAccepted", "accepted") };
        for (key, range, count, first) in refusals {
            let message = format!("push of {range} {outcome}: {}, the first: {first}", plural(count, "error"));
            self.events.event(reference(&key, informer.cache()), WARNING, reason, &message);
        }
        if rejected {
            if refuse {
                let _ = writeln!(
                    output,
                    "gitplane: push refused: nothing changed. Fix the errors (`gitplane validate <path>` checks \
                     offline) and push again; to let such pushes through as warnings: \
                     git config -f {} {REFUSE_SETTING} false",
                    repo.join("config").display()
                );
            } else {
                let _ = writeln!(
                    output,
                    "gitplane: accepted with warnings ({REFUSE_SETTING} is false for this repository): the sync \
                     will reject the commit and keep the last good one applied"
                );
            }
        }
        Verdict { accept: !(rejected && refuse), output, phases }
    }

    async fn judge_one(
        &self,
        app: &Application,
        repo: &Path,
        quarantine: Option<&Path>,
        update: &RefUpdate,
        informer: &Informer,
        phases: &mut Phases,
    ) -> Judged {
        let key = app_key(app);
        let id = app_id(app);
        // The parent is loaded only when the sync has not handled it: once it has, the stored
        // objects are as the parent left them.
        let parent = (!update.old.is_zero() && !synced(app, update.old, informer)).then_some(update.old);
        let cache = self.caches.lock().unwrap_or_else(|e| e.into_inner()).remove(&key).unwrap_or_default();
        let (source, validator, limits) =
            (AppSource::from_spec(&app.spec), self.validator.clone(), self.limits.clone());
        let (repo, quarantine, commit) = (repo.to_path_buf(), quarantine.map(Path::to_path_buf), update.new);
        let loaded = tokio::task::spawn_blocking(move || {
            let mut cache = cache;
            let loaded = load(&repo, quarantine.as_deref(), parent, commit, &source, &validator, &limits, &mut cache);
            (loaded, cache)
        })
        .await;
        let Loads { opened, parent, commit } = match loaded {
            Ok((loaded, cache)) => {
                self.caches.lock().unwrap_or_else(|e| e.into_inner()).insert(key.clone(), cache);
                match loaded {
                    Ok(loads) => loads,
                    Err(LoadError::Invalid(errors)) => return Judged::Rejected(lines(&errors)),
                    Err(LoadError::Source(e)) => return Judged::Rejected(vec![e.to_string()]),
                }
            }
            Err(e) => return Judged::Rejected(vec![format!("loading the commit failed: {e}")]),
        };
        phases.open += opened;
        phases.loaded(&commit.before, &commit.after);
        let manifests = match commit.manifests {
            Ok(manifests) => manifests,
            Err(LoadError::Invalid(errors)) => return Judged::Rejected(lines(&errors)),
            Err(LoadError::Source(e)) => return Judged::Rejected(vec![e.to_string()]),
        };
        // The Application's last write is its sync's status, after that sync's objects: once
        // the inventory has seen it, it has seen everything that sync wrote.
        let started = Instant::now();
        let last_write = informer.cache().get(&key).and_then(|a| resource_version(&a)).unwrap_or(0);
        let caught_up = self.observed(last_write).await;
        phases.inventory += started.elapsed();
        let policy = apply::Policy {
            app: &id,
            prune: app.spec.prune,
            allow_empty: app.spec.allow_empty,
            record_key: &self.record_key,
        };
        // Read before anything the plan reads: equal after it, the plan saw one state.
        let changes = informer.cache().changes();
        let (namespaces, nodes) = names(informer.cache());
        let stored = Accepted(informer.cache());
        let mut inventories = self.inventories.lock().unwrap_or_else(|e| e.into_inner());
        let inventory = inventories.entry(key).or_default();
        if !caught_up {
            inventory.distrust();
        }
        // The stored objects as the parent's sync will leave them. A parent its sync will
        // reject leaves them as they are: the pushed commit is then planned against those.
        let mut note = String::new();
        let after_parent = parent.and_then(|(took, parent)| {
            let started = Instant::now();
            let cluster = apply::Cluster {
                stored: &stored,
                inventory,
                namespaces: &namespaces,
                nodes: &nodes,
                service_ranges: &self.service_ranges,
            };
            let planned = parent.ok().and_then(|manifests| apply::plan(&manifests, &cluster, &policy).ok());
            if planned.is_none() {
                let _ = writeln!(
                    note,
                    "  (the sync of {} is pending and will reject it: planned against the cluster as it is)",
                    short_oid(update.old)
                );
            }
            let after = planned.map(|plan| {
                // Against the stored objects, as any verdict's plan: what it found as Git
                // wants it is trusted.
                inventory.record(&plan, [], false);
                AfterParent::new(&stored, plan.ops)
            });
            phases.parent += took + started.elapsed();
            after
        });
        let started = Instant::now();
        let view: &dyn apply::Stored = match &after_parent {
            Some(after) => after,
            None => &stored,
        };
        let cluster = apply::Cluster {
            stored: view,
            inventory,
            namespaces: &namespaces,
            nodes: &nodes,
            service_ranges: &self.service_ranges,
        };
        let planned = apply::plan(&manifests, &cluster, &policy);
        if let (Ok(plan), None) = (&planned, &after_parent) {
            // Nothing is written: what the plan would write or prune stays to be compared (as
            // if the Application did not prune), what it found as Git wants it is trusted while
            // nothing else writes it. A plan against the parent's pending writes is not
            // recorded: those objects are not stored yet.
            inventory.record(plan, [], false);
        }
        drop(inventories);
        phases.plan += started.elapsed();
        match planned {
            Ok(plan) => {
                let started = Instant::now();
                let mut described = note;
                describe(&mut described, &plan, view);
                for line in super::hooks::steps(&manifests).as_ref().map(super::hooks::describe).unwrap_or_default() {
                    let _ = writeln!(described, "  {line}");
                }
                phases.output += started.elapsed();
                // The sync of this commit commits this plan unless the cache moves first. A plan
                // against a pending parent's writes is not what the store will hold.
                if after_parent.is_none() && informer.cache().changes() == changes {
                    let planned = Planned {
                        commit: update.new.to_string(),
                        spec: app.spec.clone(),
                        changes,
                        manifests: manifests.clone(),
                        plan: plan.clone(),
                    };
                    self.plans.keep(app_key(app), planned);
                }
                Judged::Plan { plan, described }
            }
            Err(errors) => Judged::Rejected(lines(&errors)),
        }
    }
}

/// Whether the Application's sync has handled `commit` (applied or rejected it), as this
/// replica's cache shows it now.
fn synced(app: &Application, commit: git2::Oid, informer: &Informer) -> bool {
    let commit = commit.to_string();
    let (ns, name) = (app.metadata.namespace.as_deref().unwrap_or(""), app.metadata.name.as_deref().unwrap_or(""));
    let current = informer.cache().get_typed::<Application>(ns, name);
    let sync = current.as_ref().and_then(|a| a.status.as_ref()).and_then(|s| s.sync.as_ref());
    sync.is_some_and(|s| s.attempted_revision.as_deref() == Some(&commit) || s.revision.as_deref() == Some(&commit))
}

/// The stored objects as a parent's sync will leave them: its plan's writes and prunes over
/// what is stored now.
struct AfterParent<'a> {
    stored: &'a dyn apply::Stored,
    /// `None`: pruned.
    written: HashMap<ObjectKey, Option<Arc<Value>>>,
}

impl<'a> AfterParent<'a> {
    fn new(stored: &'a dyn apply::Stored, ops: Vec<Op>) -> AfterParent<'a> {
        let written = ops
            .into_iter()
            .filter_map(|op| match op {
                Op::Create(v) | Op::Update(v) | Op::UpdateWithStatus(v) => {
                    Some((ObjectKey::from_value(&v).ok()?, Some(Arc::new(v))))
                }
                Op::Delete { key, .. } => Some((key, None)),
                Op::UpdateStatus(_) => None,
            })
            .collect();
        AfterParent { stored, written }
    }

    /// `objects` (stored now) with the parent's writes and prunes applied; `want` picks which
    /// of the written ones belong.
    fn merged(
        &self,
        objects: Vec<(ObjectKey, Arc<Value>)>,
        want: impl Fn(&ObjectKey, &Value) -> bool,
    ) -> Vec<(ObjectKey, Arc<Value>)> {
        let mut out: Vec<_> = objects.into_iter().filter(|(k, _)| !self.written.contains_key(k)).collect();
        out.extend(
            self.written.iter().filter_map(|(k, v)| v.as_ref().filter(|v| want(k, v)).map(|v| (k.clone(), v.clone()))),
        );
        out
    }
}

impl apply::Stored for AfterParent<'_> {
    fn get(&self, key: &ObjectKey) -> Option<Arc<Value>> {
        match self.written.get(key) {
            Some(written) => written.clone(),
            None => self.stored.get(key),
        }
    }

    fn list(&self, kind: &str) -> Vec<Arc<Value>> {
        let stored = self.stored.list(kind).into_iter().filter_map(|v| Some((ObjectKey::from_value(&v).ok()?, v)));
        self.merged(stored.collect(), |k, _| k.kind == kind).into_iter().map(|(_, v)| v).collect()
    }

    fn owned_by(&self, app: &str) -> Vec<(ObjectKey, Arc<Value>)> {
        self.merged(self.stored.owned_by(app), |_, v| apply::owned_by(v, app))
    }
}

/// Applies the informer's events to the inventories (see [`apply::Inventory::observed`]);
/// the receiver says up to which revision.
fn follow(informer: &Informer, inventories: Arc<Mutex<HashMap<ObjectKey, apply::Inventory>>>) -> watch::Receiver<i64> {
    let mut notifications = informer.subscribe();
    let (observed, receiver) = watch::channel(0);
    tokio::spawn(async move {
        loop {
            match notifications.recv().await {
                Ok(Notification::Changed(event)) => {
                    let revision =
                        (event.event_type != EventType::Deleted).then(|| resource_version(&event.object)).flatten();
                    let owner =
                        event.object["metadata"]["annotations"][APPLICATION_ANNOTATION].as_str().and_then(owner_key);
                    for (app, inventory) in inventories.lock().unwrap_or_else(|e| e.into_inner()).iter_mut() {
                        inventory.observed(&event.key, revision, owner.as_ref() == Some(app));
                    }
                    observed.send_if_modified(|r| {
                        let advanced = event.revision > *r;
                        *r = (*r).max(event.revision);
                        advanced
                    });
                }
                // Events were missed: no inventory can vouch for the store any more.
                Ok(Notification::Resync) | Err(RecvError::Lagged(_)) => {
                    inventories
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .values_mut()
                        .for_each(apply::Inventory::distrust);
                }
                Err(RecvError::Closed) => return,
            }
        }
    });
    receiver
}

/// A commit's objects as the source cache loaded them.
type Manifests = Result<Vec<Arc<Manifest>>, LoadError>;

/// What [`load`] gave: the parent's objects with the time they took (when asked for), and the
/// pushed commit's, with the cache's counters around its load.
struct Loads {
    /// Opening the repository with the push's quarantine.
    opened: Duration,
    parent: Option<(Duration, Manifests)>,
    commit: Loaded,
}

struct Loaded {
    manifests: Manifests,
    before: CacheStats,
    after: CacheStats,
}

/// Loads `commit` of the repository at `repo`, and `parent` first when given (so the cache
/// keeps the pushed commit's files, the next push's parent), reading the push's new objects
/// from `quarantine`.
#[allow(clippy::too_many_arguments)]
fn load(
    repo: &Path,
    quarantine: Option<&Path>,
    parent: Option<git2::Oid>,
    commit: git2::Oid,
    app: &AppSource,
    validator: &Validator,
    limits: &Limits,
    cache: &mut SourceCache,
) -> Result<Loads, LoadError> {
    let started = Instant::now();
    let git = |source| gitplane_source::SourceError::OpenRepository { repo: repo.to_path_buf(), source };
    let repository = git2::Repository::open_bare(repo).map_err(git)?;
    if let Some(quarantine) = quarantine.and_then(Path::to_str) {
        repository.odb().and_then(|odb| odb.add_disk_alternate(quarantine)).map_err(git)?;
    }
    let opened = started.elapsed();
    let load = |commit: git2::Oid, cache: &mut SourceCache| -> Manifests {
        let head = gitplane_source::head_at(&repository, repo, commit)?;
        gitplane_source::load_commit_in(&repository, &head, app, validator, limits, cache)
    };
    let parent = parent.map(|parent| {
        let started = Instant::now();
        let loaded = load(parent, cache);
        (started.elapsed(), loaded)
    });
    let before = cache.stats();
    let manifests = load(commit, cache);
    Ok(Loads { opened, parent, commit: Loaded { manifests, before, after: cache.stats() } })
}

/// Where `refname` points now (zero: nowhere).
fn branch_head(repo: &Path, refname: &str) -> git2::Oid {
    git2::Repository::open_bare(repo).and_then(|r| r.refname_to_id(refname)).unwrap_or_else(|_| git2::Oid::zero())
}

/// Whether the repository refuses invalid pushes (its config, default yes).
fn refuses(repo: &Path) -> bool {
    git2::Config::open(&repo.join("config")).and_then(|c| c.get_bool(REFUSE_SETTING)).unwrap_or(true)
}

fn lines(errors: &[ManifestError]) -> Vec<String> {
    errors.iter().map(ToString::to_string).collect()
}

fn short_oid(oid: git2::Oid) -> String {
    let mut hex = oid.to_string();
    hex.truncate(10);
    hex
}

fn plural(n: usize, what: &str) -> String {
    if n == 1 { format!("1 {what}") } else { format!("{n} {what}s") }
}

/// The objects of one Application's plan, as lines for the pusher; an update's fields against
/// `stored`, what the plan was made against.
fn describe(out: &mut String, plan: &apply::Plan, stored: &dyn apply::Stored) {
    let mut shown = BTreeMap::<&str, usize>::new();
    for op in &plan.ops {
        let (sign, key, desired) = match op {
            Op::Create(v) => ("+", ObjectKey::from_value(v).ok(), Some(v)),
            Op::Update(v) | Op::UpdateWithStatus(v) => ("~", ObjectKey::from_value(v).ok(), Some(v)),
            Op::Delete { key, .. } => ("-", Some(key.clone()), None),
            Op::UpdateStatus(_) => continue,
        };
        let Some(key) = key else { continue };
        let count = shown.entry(sign).or_default();
        *count += 1;
        if *count > MAX_OBJECTS {
            continue;
        }
        let _ = writeln!(out, "  {sign} {key}");
        if sign == "~"
            && let (Some(desired), Some(current)) = (desired, stored.get(&key))
        {
            let changes = field_changes(&current, desired);
            for change in changes.iter().take(MAX_FIELDS) {
                let _ = writeln!(out, "      {change}");
            }
            if changes.len() > MAX_FIELDS {
                let _ = writeln!(out, "      … and {} more fields", changes.len() - MAX_FIELDS);
            }
        }
    }
    for (sign, count) in shown {
        if count > MAX_OBJECTS {
            let _ = writeln!(out, "  {sign} … and {} more", count - MAX_OBJECTS);
        }
    }
    if !plan.drifted.is_empty() {
        let _ =
            writeln!(out, "  ({} changed outside Git, restored by this sync)", plural(plan.drifted.len(), "object"));
    }
}

/// The leaves of `value` by JSON pointer, without what the server manages.
fn leaves(value: &Value) -> BTreeMap<String, &Value> {
    fn walk<'v>(value: &'v Value, path: &mut String, out: &mut BTreeMap<String, &'v Value>) {
        let at = path.len();
        match value {
            Value::Object(map) if !map.is_empty() => {
                for (k, v) in map {
                    path.push('/');
                    path.push_str(&k.replace('~', "~0").replace('/', "~1"));
                    walk(v, path, out);
                    path.truncate(at);
                }
            }
            Value::Array(items) if !items.is_empty() => {
                for (i, v) in items.iter().enumerate() {
                    let _ = write!(path, "/{i}");
                    walk(v, path, out);
                    path.truncate(at);
                }
            }
            leaf => {
                out.insert(path.clone(), leaf);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(value, &mut String::new(), &mut out);
    const SERVER: [&str; 7] = [
        "/metadata/resourceVersion",
        "/metadata/uid",
        "/metadata/creationTimestamp",
        "/metadata/generation",
        "/metadata/managedFields",
        "/status",
        "/metadata/annotations/gitplane.io~1last-applied",
    ];
    out.retain(|path, _| !SERVER.iter().any(|s| path == s || path.starts_with(&format!("{s}/"))));
    out
}

/// `/spec/replicas: 2 → 3`, `+ /data/b: "x"`, `- /data/a` for each field that differs between
/// the stored object and what the sync will write; a Secret's values are never shown.
pub fn field_changes(current: &Value, desired: &Value) -> Vec<String> {
    let secret = desired["kind"] == "Secret";
    let masked = |path: &str| secret && (path.starts_with("/data/") || path.starts_with("/stringData/"));
    let show = |path: &str, v: &Value| {
        if masked(path) {
            return "(secret value)".to_owned();
        }
        let text = v.to_string();
        match text.char_indices().nth(60) {
            Some((at, _)) => format!("{}…", &text[..at]),
            None => text,
        }
    };
    let (before, after) = (leaves(current), leaves(desired));
    let mut changes = Vec::new();
    for (path, old) in &before {
        match after.get(path) {
            Some(new) if new == old => {}
            Some(_) if masked(path) => changes.push(format!("{path}: (secret value changed)")),
            Some(new) => changes.push(format!("{path}: {} → {}", show(path, old), show(path, new))),
            None => changes.push(format!("- {path}")),
        }
    }
    for (path, new) in &after {
        if !before.contains_key(path)
            && path != &format!("/metadata/annotations/{}", APPLICATION_ANNOTATION.replace('/', "~1"))
        {
            changes.push(format!("+ {path}: {}", show(path, new)));
        }
    }
    changes
}

#[cfg(test)]
mod tests {
    use super::*;
    use apply::Stored as _;
    use serde_json::json;
    use std::collections::HashSet;

    fn manifests(files: &[(&str, String)]) -> Vec<Arc<Manifest>> {
        let files: Vec<_> = files
            .iter()
            .map(|(path, text)| gitplane_source::ManifestFile::new(*path, text.as_bytes().to_vec()))
            .collect();
        let loaded = gitplane_source::load(&files, &Validator::new(), "default", &Limits::default());
        loaded.unwrap().into_iter().map(Arc::new).collect()
    }

    fn cm(name: &str, value: &str) -> String {
        format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n  a: \"{value}\"\n")
    }

    /// The cluster of the namespace `default`, no nodes.
    fn cluster<'a>(
        stored: &'a dyn apply::Stored,
        inventory: &'a apply::Inventory,
        names: &'a (HashSet<String>, HashSet<String>),
        ranges: &'a ServiceRanges,
    ) -> apply::Cluster<'a> {
        apply::Cluster { stored, inventory, namespaces: &names.0, nodes: &names.1, service_ranges: ranges }
    }

    #[test]
    fn a_push_is_planned_against_what_its_pending_parent_leaves() {
        // The parent's sync has not run: nothing of the Application is stored; another
        // writer's ConfigMap is.
        let other = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "other", "namespace": "default", "resourceVersion": "3"}});
        let stored = BTreeMap::from([(ObjectKey::from_value(&other).unwrap(), Arc::new(other))]);
        let (inventory, ranges, key) =
            (apply::Inventory::default(), ServiceRanges::default(), apply::RecordKey::new([1; 32]));
        let names = (HashSet::from(["default".to_owned()]), HashSet::new());
        let policy = apply::Policy { app: "gitplane-system/web", prune: true, allow_empty: false, record_key: &key };
        let parent = manifests(&[("a.yaml", cm("a", "1")), ("b.yaml", cm("b", "1"))]);
        let parent_plan = apply::plan(&parent, &cluster(&stored, &inventory, &names, &ranges), &policy).unwrap();
        assert_eq!(parent_plan.created, 2);
        let after = AfterParent::new(&stored, parent_plan.ops);
        assert_eq!(after.list("ConfigMap").len(), 3, "the stored one and the parent's two");
        assert_eq!(after.owned_by("gitplane-system/web").len(), 2);

        let pushed = manifests(&[("a.yaml", cm("a", "2")), ("c.yaml", cm("c", "1"))]);
        let plan = apply::plan(&pushed, &cluster(&after, &inventory, &names, &ranges), &policy).unwrap();
        assert_eq!((plan.created, plan.updated, plan.pruned), (1, 1, 1));
        let mut out = String::new();
        describe(&mut out, &plan, &after);
        assert_eq!(
            out,
            "  ~ ConfigMap default/a\n      /data/a: \"1\" → \"2\"\n  + ConfigMap default/c\n  - ConfigMap default/b\n"
        );
        // Against the cluster as it is, the same push would create both.
        let plan = apply::plan(&pushed, &cluster(&stored, &inventory, &names, &ranges), &policy).unwrap();
        assert_eq!((plan.created, plan.updated, plan.pruned), (2, 0, 0));
    }

    #[test]
    fn field_changes_name_each_field_and_never_a_secret_value() {
        let current = json!({"kind": "ConfigMap", "metadata": {"name": "c", "resourceVersion": "7", "uid": "u"},
            "data": {"a": "1", "gone": "x"}});
        let desired = json!({"kind": "ConfigMap", "metadata": {"name": "c", "resourceVersion": "7"},
            "data": {"a": "2", "new": "y"}});
        assert_eq!(field_changes(&current, &desired), ["/data/a: \"1\" → \"2\"", "- /data/gone", "+ /data/new: \"y\""]);
        let current =
            json!({"kind": "Secret", "metadata": {"name": "s"}, "data": {"password": "aHVudGVyMg==", "old": "eA=="}});
        let desired =
            json!({"kind": "Secret", "metadata": {"name": "s"}, "data": {"password": "c2VjcmV0", "new": "eQ=="}});
        let changes = field_changes(&current, &desired).join("\n");
        assert_eq!(changes, "- /data/old\n/data/password: (secret value changed)\n+ /data/new: (secret value)");
    }

    #[test]
    fn a_long_value_is_cut() {
        let long = "x".repeat(100);
        let changes = field_changes(
            &json!({"kind": "ConfigMap", "data": {"a": "1"}}),
            &json!({"kind": "ConfigMap", "data": {"a": long}}),
        );
        assert!(changes[0].ends_with('…') && changes[0].len() < 90, "{changes:?}");
    }
}
