//! The source controller: turns each Application's branch head into stored objects.
//!
//! A push (the repository's refs change, seen through inotify) or the periodic resync queues the
//! Applications of that repository. A sync reads the commit (gitplane-source: Git object
//! database, parse, strict validation), checks what needs the store (namespaces, nodes, who owns
//! an object), and applies the whole commit as one transaction: creates, updates, prunes. Any
//! error rejects the commit whole; the last good revision stays applied and the Application's
//! status says why, file by file.

use gitplane_api::{
    Application, ApplicationStatus, SyncStatus,
    kinds::accepted,
    object::{APPLICATION_ANNOTATION, kind_of, resource_version, to_value},
};
use gitplane_source::{Limits, Manifest, ManifestError, Validator};
use gitplane_store::{
    Api, EventType, ListOptions, ObjectKey, Op, Store, StoreError,
    informer::{Informer, Notification},
};
use k8s_openapi::api::core::v1::{Namespace, Node};
use notify::Watcher;
use serde_json::Value;
use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};
use tokio::sync::{broadcast::error::RecvError, mpsc};

/// Metadata the store manages; never compared with Git.
const SERVER_FIELDS: [&str; 5] = ["resourceVersion", "uid", "creationTimestamp", "generation", "managedFields"];
/// How often a transaction is retried when a concurrent writer (a controller's status write)
/// moved an object between planning and committing.
const CONFLICT_RETRIES: usize = 5;

pub struct SourceController {
    store: Arc<dyn Store>,
    repos_dir: PathBuf,
    validator: Arc<Validator>,
    limits: Limits,
    resync: Duration,
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

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .round(k8s_openapi::jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// The object without what the server manages, for comparing Git with the store.
fn desired_part(value: &Value) -> Value {
    let mut v = value.clone();
    if let Some(obj) = v.as_object_mut() {
        obj.remove("status");
        if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            for field in SERVER_FIELDS {
                meta.remove(field);
            }
        }
    }
    v
}

fn error_at(manifest: &Manifest, path: &str, message: String) -> ManifestError {
    ManifestError {
        file: manifest.file.clone(),
        line: Some(manifest.line),
        column: None,
        document: Some(manifest.index),
        object: Some(format!("{} {}", manifest.value["kind"].as_str().unwrap_or(""), manifest.key.name)),
        path: Some(path.to_owned()),
        message,
    }
}

impl SourceController {
    pub fn new(store: Arc<dyn Store>, repos_dir: PathBuf) -> Self {
        SourceController {
            store,
            repos_dir,
            validator: Arc::new(Validator::new()),
            limits: Limits::default(),
            resync: Duration::from_secs(60),
        }
    }

    /// A hosted repository's bare directory. Names are plain (`demo`), never paths.
    fn repo_path(&self, repo: &str) -> Result<PathBuf, SyncError> {
        let plain = !repo.is_empty() && repo.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if !plain || repo.starts_with('.') {
            return Err(SyncError::Spec(format!(
                "spec.repo {repo:?} is not the name of a hosted repository (like `demo` for repos/demo.git); remote URLs are not supported yet"
            )));
        }
        Ok(self.repos_dir.join(format!("{repo}.git")))
    }

    pub async fn run(self) {
        let informer = Informer::spawn(self.store.clone(), vec![kind_of::<Application>()]);
        let mut notifications = informer.subscribe();
        informer.wait_synced().await;
        let (pushed_tx, mut pushed) = mpsc::unbounded_channel::<PathBuf>();
        let mut watchers: HashMap<PathBuf, notify::RecommendedWatcher> = HashMap::new();
        let mut queue: BTreeSet<ObjectKey> = BTreeSet::new();
        let mut seen: HashMap<ObjectKey, Option<i64>> = HashMap::new();
        let mut resync = tokio::time::interval(self.resync);
        let apps = |informer: &Informer| -> Vec<Application> { informer.cache().list_typed::<Application>(None) };
        loop {
            for app in apps(&informer) {
                if let Ok(path) = self.repo_path(&app.spec.repo)
                    && !watchers.contains_key(&path)
                    && let Some(w) = watch_refs(&path, pushed_tx.clone())
                {
                    watchers.insert(path, w);
                }
            }
            while let Some(key) = queue.pop_first() {
                // From the store, not the cache: the cache may not show our last status write yet,
                // and the status says which commit was already handled.
                match Api::<Application>::new(self.store.clone()).get(&key.namespace, &key.name).await {
                    Ok(Some(app)) => self.sync(&app).await,
                    Ok(None) => {}
                    Err(e) => tracing::warn!(application = %key, error = %e, "reading the Application failed"),
                }
            }
            tokio::select! {
                n = notifications.recv() => match n {
                    Ok(Notification::Changed(e)) => {
                        // Our own status writes do not need a sync; spec changes bump generation.
                        let generation = e.object["metadata"]["generation"].as_i64();
                        if e.event_type == EventType::Deleted || seen.insert(e.key.clone(), generation) != Some(generation) {
                            queue.insert(e.key.clone());
                        }
                    }
                    Ok(Notification::Resync) | Err(RecvError::Lagged(_)) => queue.extend(keys(&apps(&informer))),
                    Err(RecvError::Closed) => return,
                },
                Some(path) = pushed.recv() => {
                    let mut paths = HashSet::from([path]);
                    while let Ok(p) = pushed.try_recv() { paths.insert(p); }
                    let changed = apps(&informer).into_iter()
                        .filter(|a| self.repo_path(&a.spec.repo).is_ok_and(|p| paths.contains(&p)));
                    queue.extend(keys(&changed.collect::<Vec<_>>()));
                }
                _ = resync.tick() => queue.extend(keys(&apps(&informer))),
            }
        }
    }

    /// One sync of one Application; the outcome goes to its status and the log.
    async fn sync(&self, app: &Application) {
        let id = app_id(app);
        let started = Instant::now();
        let last = app.status.as_ref().and_then(|s| s.sync.clone()).unwrap_or_default();
        let result = self.sync_commit(app, &last).await;
        let status = match result {
            Ok(None) => return, // this commit was already handled
            Ok(Some((commit, changes))) => {
                tracing::info!(application = %id, %commit, changes, elapsed = ?started.elapsed(), "synced");
                SyncStatus {
                    status: "Synced".into(),
                    revision: Some(commit.clone()),
                    attempted_revision: Some(commit),
                    errors: Vec::new(),
                    finished_at: Some(now()),
                }
            }
            Err((commit, e)) => {
                let errors: Vec<String> = match &e {
                    SyncError::Invalid(errors) => errors.iter().map(ToString::to_string).collect(),
                    other => vec![other.to_string()],
                };
                tracing::error!(application = %id, commit = commit.as_deref().unwrap_or("-"),
                    "commit rejected, {} stays applied:\n  {}", last.revision.as_deref().unwrap_or("nothing"), errors.join("\n  "));
                // Only a rejected commit is final; anything else is retried at the next resync.
                let attempted = if matches!(e, SyncError::Invalid(_)) { commit } else { None };
                SyncStatus {
                    status: "Failed".into(),
                    revision: last.revision.clone(),
                    attempted_revision: attempted,
                    errors,
                    finished_at: Some(now()),
                }
            }
        };
        let mut updated = app.clone();
        updated.metadata.resource_version = None;
        updated.status = Some(ApplicationStatus { sync: Some(status) });
        if let Err(e) = self.store.txn(vec![Op::UpdateStatus(to_value(&updated))]).await {
            tracing::warn!(application = %id, error = %e, "could not record the sync status");
        }
    }

    /// Applies the branch head; `Ok(None)` when that commit was already synced or rejected.
    async fn sync_commit(
        &self,
        app: &Application,
        last: &SyncStatus,
    ) -> Result<Option<(String, usize)>, (Option<String>, SyncError)> {
        let repo = self.repo_path(&app.spec.repo).map_err(|e| (None, e))?;
        let (branch, dir, limits) = (app.spec.branch.clone(), app.spec.path.clone(), self.limits.clone());
        let commit = tokio::task::spawn_blocking(move || gitplane_source::read_commit(&repo, &branch, &dir, &limits))
            .await
            .map_err(|e| (None, SyncError::Spec(format!("reading the repository failed: {e}"))))?
            .map_err(|e| (None, e.into()))?;
        if last.attempted_revision.as_deref() == Some(commit.id.as_str()) {
            return Ok(None);
        }
        let default_namespace = app.spec.namespace.as_deref().unwrap_or(gitplane_api::object::DEFAULT_NAMESPACE);
        let fail = |e: SyncError| (Some(commit.id.clone()), e);
        let manifests = gitplane_source::load(&commit.files, &self.validator, default_namespace, &self.limits)
            .map_err(|errors| fail(SyncError::Invalid(errors)))?;
        for _ in 0..CONFLICT_RETRIES {
            let ops = self.plan(app, &manifests).await.map_err(fail)?;
            let changes = ops.len();
            if ops.is_empty() {
                return Ok(Some((commit.id, 0)));
            }
            match self.store.txn(ops).await {
                Ok(_) => return Ok(Some((commit.id, changes))),
                Err(e) if e.is_conflict() => continue,
                Err(e) => return Err(fail(e.into())),
            }
        }
        Err(fail(SyncError::Spec("objects kept changing while applying; will retry".into())))
    }

    /// The ops that make the store match the manifests, or every reason it cannot.
    async fn plan(&self, app: &Application, manifests: &[Manifest]) -> Result<Vec<Op>, SyncError> {
        let id = app_id(app);
        let mut stored: BTreeMap<ObjectKey, Value> = BTreeMap::new();
        for kind in accepted() {
            for item in self.store.list(&kind.group_kind(), &ListOptions::default()).await?.items {
                if let Ok(key) = ObjectKey::from_value(&item) {
                    stored.insert(key, item);
                }
            }
        }
        let namespaces: HashSet<String> = stored
            .keys()
            .filter(|k| k.kind == kind_of::<Namespace>())
            .map(|k| k.name.clone())
            .chain(manifests.iter().filter(|m| m.key.kind == kind_of::<Namespace>()).map(|m| m.key.name.clone()))
            .collect();
        let nodes: HashSet<String> = self
            .store
            .list(&kind_of::<Node>(), &ListOptions::default())
            .await?
            .items
            .iter()
            .filter_map(|n| n["metadata"]["name"].as_str().map(str::to_owned))
            .collect();

        let mut errors = Vec::new();
        let mut ops = Vec::new();
        for m in manifests {
            let ns = &m.key.namespace;
            if !ns.is_empty() && !namespaces.contains(ns) {
                errors.push(error_at(
                    m,
                    "/metadata/namespace",
                    format!(
                        "namespace {ns:?} does not exist: add a Namespace manifest for it or use an existing namespace"
                    ),
                ));
            }
            if let Some(node) = m.value["spec"]["nodeName"].as_str()
                && m.key.kind == "Pod"
                && !nodes.contains(node)
            {
                errors.push(error_at(
                    m,
                    "/spec/nodeName",
                    format!("node {node:?} does not exist: remove spec.nodeName and let the scheduler place the Pod"),
                ));
            }
            let mut desired = m.value.clone();
            desired["metadata"]["annotations"][APPLICATION_ANNOTATION] = Value::String(id.clone());
            match stored.get(&m.key) {
                None => ops.push(Op::Create(desired)),
                Some(current) => {
                    let owner = current["metadata"]["annotations"][APPLICATION_ANNOTATION].as_str();
                    if owner != Some(id.as_str()) {
                        let by = owner.map_or("nothing in Git (it was made by the cluster)".to_owned(), |o| {
                            format!("Application {o}")
                        });
                        errors.push(error_at(m, "/metadata/name", format!(
                            "{} already exists and is managed by {by}: rename the object or remove it from the other source",
                            m.key
                        )));
                        continue;
                    }
                    if desired_part(current) != desired_part(&desired) {
                        desired["metadata"]["resourceVersion"] =
                            Value::String(resource_version(current).unwrap_or(0).to_string());
                        ops.push(Op::Update(desired));
                    }
                }
            }
        }
        if !errors.is_empty() {
            return Err(SyncError::Invalid(errors));
        }
        if app.spec.prune {
            let wanted: HashSet<&ObjectKey> = manifests.iter().map(|m| &m.key).collect();
            for (key, current) in &stored {
                let owned = current["metadata"]["annotations"][APPLICATION_ANNOTATION].as_str() == Some(id.as_str());
                if owned && !wanted.contains(key) {
                    ops.push(Op::Delete { key: key.clone(), revision: resource_version(current) });
                }
            }
        }
        Ok(ops)
    }
}

fn keys(apps: &[Application]) -> Vec<ObjectKey> {
    apps.iter()
        .map(|a| {
            ObjectKey::of::<Application>(
                a.metadata.namespace.as_deref().unwrap_or(""),
                a.metadata.name.as_deref().unwrap_or(""),
            )
        })
        .collect()
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
    use gitplane_store::sqlite::SqliteStore;
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
            let mut tree = repo.treebuilder(None).unwrap();
            for (name, content) in files {
                tree.insert(name, repo.blob(content.as_bytes()).unwrap(), 0o100644).unwrap();
            }
            let tree = repo.find_tree(tree.write().unwrap()).unwrap();
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
            store.txn(vec![Op::Create(ns)]).await.unwrap();
        }
        let repo = Repo::new();
        let controller = SourceController::new(store.clone(), repo.dir.path().to_path_buf());
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
        let current = api.get("gitplane-system", name).await.unwrap().unwrap();
        controller.sync(&current).await;
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
}
