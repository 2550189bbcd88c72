//! The pure part of gitplane's GitOps source: read the manifests of a commit, render its
//! templates, parse them, validate them — again only for what changed since the last commit.
//!
//! This crate owns the path from a Git commit to validated objects:
//!
//! - [`git`]: the manifest files under a directory of a branch head, read from the object
//!   database (never a checkout), or from a plain directory for offline validation;
//! - [`template`]: `*.yaml.j2` templates rendered with the Application's values (minijinja);
//! - `kustomize`: a directory with a `kustomization.yaml`, built by kustomize itself;
//! - [`manifest`]: multi-document YAML into JSON values, with the line of each document;
//! - [`validate`]: accepted kinds, strict schemas, names, scope, duplicates, defaulted namespace;
//! - [`cache`]: each file's outcome kept by (path, blob id, values digest), so that a commit
//!   costs what it changed;
//! - [`error`]: errors that say where (file, line, document, object, JSON pointer) and what to do.
//!
//! The entry points: [`load_commit`] (the server: a branch head, through a [`SourceCache`] kept
//! per Application), [`load_dir`] (`gitplane validate` / `render`: the same rules on a
//! directory), [`load_files`] (files already read).
//!
//! Invariants:
//! - It never writes anything: not the repository, not the store, not the filesystem (but for
//!   the private copy kustomize builds from, removed after). The sync loop applies its output.
//! - Git content is hostile input: sizes are checked before reading, symlinks never leave the
//!   synced directory, templates are bounded in output and work, nothing on this path panics on
//!   input.
//! - Secret values never appear in an error or a `Debug` output, and template errors never quote
//!   a value at all (values may be secrets).
//! - Offline and server loads run the same code: a directory that `gitplane validate` accepts
//!   is accepted when pushed with the same values.

pub mod cache;
pub mod error;
pub mod git;
mod kustomize;
mod locate;
pub mod manifest;
pub mod template;
pub mod validate;

pub use cache::{CacheStats, SourceCache};
pub use error::{ManifestError, SourceError, redacted};
pub use git::{Commit, Head, head_at, read_commit, read_dir, read_head};
pub use manifest::{Document, parse};
pub use template::{is_template, merge_values, set_value};
pub use validate::{Manifest, ManifestWarning, Validator};

use gitplane_api::ApplicationSpec;
use serde_json::Value;
use std::{borrow::Cow, collections::BTreeMap, fmt, path::Path, sync::Arc};

/// Bounds on what one commit may hold, so a hostile push cannot exhaust the control plane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest manifest file. Also bounds the values one file may expand to through YAML
    /// aliases, so a small file cannot blow up in memory; a template may render to 4 times it.
    pub max_file_bytes: u64,
    /// All manifest files of a commit together (templates counted as rendered).
    pub max_total_bytes: u64,
    /// YAML documents of a commit (and manifest files, each of which holds at least one).
    pub max_documents: usize,
    /// Entries (files and directories of any name) walked under the directory. A Git tree may
    /// name one subtree many times, so without a bound a tiny push could make the walk
    /// exponential.
    pub max_tree_entries: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_file_bytes: 1 << 20,
            max_total_bytes: 64 << 20,
            max_documents: 10_000,
            max_tree_entries: 1_000_000,
        }
    }
}

/// One manifest file as read from Git or a directory.
#[derive(Clone, PartialEq, Eq)]
pub struct ManifestFile {
    /// Relative to the repository root (or to the directory given to [`read_dir`]), `/`-separated.
    pub path: String,
    /// The Git blob id of `content`, which keys the [`SourceCache`] (zero: never cached).
    pub blob: git2::Oid,
    pub content: Vec<u8>,
}

impl ManifestFile {
    /// A file with the blob id Git gives its content.
    pub fn new(path: impl Into<String>, content: Vec<u8>) -> Self {
        // Hashing in memory fails only on allocation; a zero id just opts the file out of caching.
        let blob = git2::Oid::hash_object(git2::ObjectType::Blob, &content).unwrap_or_else(|_| git2::Oid::zero());
        ManifestFile { path: path.into(), blob, content }
    }
}

// The content may hold Secret values: never print it.
impl fmt::Debug for ManifestFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManifestFile").field("path", &self.path).field("bytes", &self.content.len()).finish()
    }
}

/// What of an Application shapes its objects: where its manifests are, and its values.
#[derive(Clone, Default, PartialEq)]
pub struct AppSource {
    /// The directory of the manifests, relative to the repository root (or to the directory
    /// given to [`load_dir`]); empty for the root.
    pub path: String,
    /// The namespace of namespaced objects that name none.
    pub default_namespace: String,
    /// Values files, relative to `path`, merged in order: they are not manifests.
    pub values_files: Vec<String>,
    /// Values over those of the files.
    pub values: BTreeMap<String, Value>,
}

impl AppSource {
    /// The source of an Application's spec.
    pub fn from_spec(spec: &ApplicationSpec) -> Self {
        AppSource {
            path: spec.path.clone(),
            default_namespace: spec
                .namespace
                .clone()
                .unwrap_or_else(|| gitplane_api::object::DEFAULT_NAMESPACE.to_owned()),
            values_files: spec.values_files.clone(),
            values: spec.values.clone(),
        }
    }
}

// Values may hold secrets: name them, never show them.
impl fmt::Debug for AppSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AppSource")
            .field("path", &self.path)
            .field("default_namespace", &self.default_namespace)
            .field("values_files", &self.values_files)
            .field("values", &self.values.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// Why a load gave no objects.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The repository, branch, directory or a limit on reading: nothing was validated.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// What is wrong in the manifests, every error of every file, sorted by file and line.
    #[error("{} error(s) in the manifests", .0.len())]
    Invalid(Vec<ManifestError>),
}

/// Loads the Application's objects at a branch head: walks the directory's tree, then renders,
/// parses and validates only the files `cache` does not hold (it reads no other blob).
///
/// Keep one `cache` per Application (and one `validator` for all): a one-file commit then costs
/// one file plus a walk of the tree.
pub fn load_commit(
    head: &Head,
    app: &AppSource,
    validator: &Validator,
    limits: &Limits,
    cache: &mut SourceCache,
) -> Result<Vec<Arc<Manifest>>, LoadError> {
    // Out of the cache while it is read (the load needs the cache too), then back in it.
    let repository = cache.take_repository(head.repo())?;
    let loaded = load_commit_in(&repository, head, app, validator, limits, cache);
    cache.keep_repository(head.repo(), repository);
    loaded
}

/// [`load_commit`] through a repository the caller opened: one whose object database holds
/// more than the repository's own (a push's quarantined objects, added as an alternate).
pub fn load_commit_in(
    repository: &git2::Repository,
    head: &Head,
    app: &AppSource,
    validator: &Validator,
    limits: &Limits,
    cache: &mut SourceCache,
) -> Result<Vec<Arc<Manifest>>, LoadError> {
    let dir = git::normalize_dir(&app.path)?;
    (|| {
        let started = std::time::Instant::now();
        let opened = git::Opened::new(repository, head);
        let mut candidates = opened.walk(&dir, limits)?;
        let root_file = match kustomize::root_file(candidates.iter().map(|c| c.path.as_str()), &dir) {
            Some(file) => Some(file),
            // The one name kustomize takes that the walk does not list (no .yaml).
            None => {
                let file = kustomize::join(&dir, "Kustomization");
                opened.blob_at(&file)?.map(|_| file)
            }
        };
        if let Some(root_file) = root_file {
            let mut tree = GitTree { opened: &opened };
            let dirs = kustomize::plan(&dir, &mut tree, limits).map_err(|e| LoadError::Invalid(vec![*e]))?;
            let mut files = Vec::new();
            for d in &dirs {
                files.extend(opened.walk_files(d, limits, true)?);
            }
            files.sort_by(|a, b| a.path.cmp(&b.path));
            files.dedup_by(|b, a| a.path == b.path);
            let known = cache.known_sizes(&files);
            opened.sizes(&mut files, &known, limits)?;
            let ids: Vec<(String, git2::Oid)> = files.iter().map(|c| (c.path.clone(), c.blob)).collect();
            return load_kustomization(
                &root_file,
                &dir,
                &ids,
                &mut |i| opened.read(&files[i]),
                app,
                validator,
                limits,
                cache,
            );
        }
        // Values files the walk did not list (beside the directory, or not named *.yaml).
        for path in app.values_files.iter().filter_map(|file| cache::values_path(&dir, file)) {
            if candidates.binary_search_by(|c| c.path.cmp(&path)).is_err()
                && let Some(blob) = opened.blob_at(&path)?
            {
                candidates.push(git::Candidate { path, blob, size: 0 });
                candidates.sort_by(|a, b| a.path.cmp(&b.path));
            }
        }
        let known = cache.known_sizes(&candidates);
        opened.sizes(&mut candidates, &known, limits)?;
        cache.walked(started.elapsed());
        cache::load(&candidates, &dir, app, validator, limits, cache, |_, c| opened.read(c).map(Cow::Owned))
    })()
}

/// Loads the Application's objects from a directory that stands for the repository root, by the
/// rules of [`read_dir`] and [`load_commit`]: what `gitplane validate DIR` checks.
pub fn load_dir(
    root: &Path,
    app: &AppSource,
    validator: &Validator,
    limits: &Limits,
    cache: &mut SourceCache,
) -> Result<Vec<Arc<Manifest>>, LoadError> {
    let dir = git::normalize_dir(&app.path)?;
    let root_file = kustomize::FILE_NAMES
        .iter()
        .find(|name| root.join(&dir).join(name).is_file())
        .map(|name| kustomize::join(&dir, name));
    if let Some(root_file) = root_file {
        let mut tree = DirTree { root, limits };
        let dirs = kustomize::plan(&dir, &mut tree, limits).map_err(|e| LoadError::Invalid(vec![*e]))?;
        let mut files = Vec::new();
        for d in &dirs {
            for mut file in git::read_files(&root.join(d), limits, true)? {
                if !d.is_empty() {
                    file.path = format!("{d}/{}", file.path);
                }
                files.push(file);
            }
        }
        files.sort_by(|a, b| a.path.cmp(&b.path));
        files.dedup_by(|b, a| a.path == b.path);
        let ids: Vec<(String, git2::Oid)> = files.iter().map(|f| (f.path.clone(), f.blob)).collect();
        return load_kustomization(
            &root_file,
            &dir,
            &ids,
            &mut |i| Ok(files[i].content.clone()),
            app,
            validator,
            limits,
            cache,
        );
    }
    let mut files = read_dir(&root.join(&dir), limits)?;
    if !dir.is_empty() {
        for file in &mut files {
            file.path = format!("{dir}/{}", file.path);
        }
    }
    // Values files the walk did not list (beside the directory, or not named *.yaml).
    for path in app.values_files.iter().filter_map(|file| cache::values_path(&dir, file)) {
        if !files.iter().any(|f| f.path == path)
            && let Some(content) = git::read_file_under(root, &path, limits)?
        {
            files.push(ManifestFile::new(path, content));
        }
    }
    load_files(&files, app, validator, limits, cache)
}

/// Loads the objects kustomize builds from the kustomization `root_file` in `dir`, given every
/// file its directories hold (`files`, sorted by path, read by position through `read`): built
/// once per set of inputs, then validated file by file as any manifest, each object under the
/// file it came from.
#[allow(clippy::too_many_arguments)]
fn load_kustomization(
    root_file: &str,
    dir: &str,
    files: &[(String, git2::Oid)],
    read: &mut dyn FnMut(usize) -> Result<Vec<u8>, SourceError>,
    app: &AppSource,
    validator: &Validator,
    limits: &Limits,
    cache: &mut SourceCache,
) -> Result<Vec<Arc<Manifest>>, LoadError> {
    use sha2::Digest;
    let mut digest = sha2::Sha256::new();
    for (path, blob) in files {
        digest.update(path.as_bytes());
        digest.update([0]);
        digest.update(blob.as_bytes());
    }
    let key: [u8; 32] = digest.finalize().into();
    let rendered = match cache.kustomized(&key) {
        Some(kept) => kept,
        None => {
            let mut contents = Vec::with_capacity(files.len());
            for (i, (path, _)) in files.iter().enumerate() {
                contents.push((path.clone(), read(i)?));
            }
            let source = |path: &str| contents.iter().find(|(p, _)| p == path).map(|(_, c)| c.clone());
            let built = kustomize::build(dir, root_file, &contents, limits)
                .map_err(|e| vec![*e])
                .and_then(|output| kustomize::split(&output, dir, root_file, &source, limits))
                .map(Arc::new);
            cache.keep_kustomized(key, built.clone());
            built
        }
    };
    let rendered = rendered.map_err(LoadError::Invalid)?;
    // The rendered files are what is validated: values files and templates are not kustomize's.
    let app = AppSource { path: dir.to_owned(), values_files: Vec::new(), values: BTreeMap::new(), ..app.clone() };
    let loaded = load_files(&rendered.files, &app, validator, limits, cache);
    let in_git = |file: &str, line: usize| rendered.line_in_git(file, line).unwrap_or(line);
    match loaded {
        Ok(manifests) => Ok(manifests
            .into_iter()
            .map(|m| {
                let line = in_git(&m.file, m.line);
                if line == m.line && m.warnings.is_empty() {
                    return m;
                }
                let mut m = (*m).clone();
                m.line = line;
                for w in m.warnings.iter_mut().map(|w| &mut w.detail) {
                    w.line = w.line.map(|l| in_git(&w.file, l));
                }
                Arc::new(m)
            })
            .collect()),
        Err(LoadError::Invalid(errors)) => Err(LoadError::Invalid(
            errors
                .into_iter()
                .map(|mut e| {
                    e.line = e.line.map(|line| in_git(&e.file, line));
                    (e.column, e.document) = (None, None);
                    e
                })
                .collect(),
        )),
        Err(e) => Err(e),
    }
}

/// A commit's tree, for [`kustomize::plan`].
struct GitTree<'o, 'r> {
    opened: &'o git::Opened<'r>,
}

impl kustomize::Tree for GitTree<'_, '_> {
    fn is_dir(&mut self, dir: &str) -> bool {
        self.opened.is_dir(dir)
    }

    fn read(&mut self, path: &str) -> Option<Vec<u8>> {
        let blob = self.opened.blob_at(path).ok()??;
        let candidate = git::Candidate { path: path.to_owned(), blob, size: 0 };
        self.opened.read(&candidate).ok()
    }
}

/// A directory on disk standing for the repository root, for [`kustomize::plan`].
struct DirTree<'a> {
    root: &'a Path,
    limits: &'a Limits,
}

impl kustomize::Tree for DirTree<'_> {
    fn is_dir(&mut self, dir: &str) -> bool {
        self.root.join(dir).is_dir()
    }

    fn read(&mut self, path: &str) -> Option<Vec<u8>> {
        git::read_file_under(self.root, path, self.limits).ok().flatten()
    }
}

/// Loads files already read (sorted by path, under `app.path`): renders the templates, parses
/// and validates, through `cache`.
pub fn load_files(
    files: &[ManifestFile],
    app: &AppSource,
    validator: &Validator,
    limits: &Limits,
    cache: &mut SourceCache,
) -> Result<Vec<Arc<Manifest>>, LoadError> {
    let dir = git::normalize_dir(&app.path)?;
    let mut sorted: Vec<&ManifestFile> = files.iter().collect();
    sorted.sort_by(|a, b| a.path.cmp(&b.path));
    // A path given twice would be one file to the cache: the first one wins, as in a directory.
    sorted.dedup_by(|b, a| a.path == b.path);
    let candidates: Vec<git::Candidate> = sorted
        .iter()
        .map(|f| git::Candidate { path: f.path.clone(), blob: f.blob, size: f.content.len() as u64 })
        .collect();
    cache::load(&candidates, &dir, app, validator, limits, cache, |i, _| Ok(Cow::Borrowed(&sorted[i].content)))
}

/// Parses and validates manifest files (templates rendered without values), with the errors of
/// all of them sorted by file and line. [`load_files`] with a throwaway cache, for callers that
/// want owned objects.
pub fn load(
    files: &[ManifestFile],
    validator: &Validator,
    default_namespace: &str,
    limits: &Limits,
) -> Result<Vec<Manifest>, Vec<ManifestError>> {
    let app = AppSource { default_namespace: default_namespace.to_owned(), ..AppSource::default() };
    let mut cache = SourceCache::new();
    let loaded = load_files(files, &app, validator, limits, &mut cache);
    // Dropping the cache first leaves each object with one owner: unwrapping does not copy.
    drop(cache);
    match loaded {
        Ok(manifests) => {
            Ok(manifests.into_iter().map(|m| Arc::try_unwrap(m).unwrap_or_else(|m| (*m).clone())).collect())
        }
        Err(LoadError::Invalid(errors)) => Err(errors),
        Err(LoadError::Source(e)) => Err(vec![ManifestError::new("(source)", e.to_string())]),
    }
}

/// `1 MiB`, `1.5 KiB`, `12 bytes`: sizes in error messages.
pub(crate) fn human_bytes(bytes: u64) -> String {
    const UNITS: [(&str, u64); 3] = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (unit, size) in UNITS {
        if bytes >= size {
            let whole = bytes / size;
            let tenths = (bytes % size) * 10 / size;
            return if tenths == 0 { format!("{whole} {unit}") } else { format!("{whole}.{tenths} {unit}") };
        }
    }
    if bytes == 1 { "1 byte".into() } else { format!("{bytes} bytes") }
}

#[cfg(test)]
mod tests {
    use super::*;
    use git2::{Repository, Signature};

    /// A bare repository whose `main` holds `files` (paths one directory deep at most).
    fn commit(files: &[(&str, &str)]) -> (tempfile::TempDir, std::path::PathBuf) {
        let tmp = tempfile::TempDir::new().unwrap();
        let path = tmp.path().join("demo.git");
        let repo = Repository::init_bare(&path).unwrap();
        let mut root = repo.treebuilder(None).unwrap();
        let mut dirs: std::collections::BTreeMap<&str, git2::TreeBuilder> = Default::default();
        for (file, content) in files {
            let blob = repo.blob(content.as_bytes()).unwrap();
            match file.split_once('/') {
                Some((dir, name)) => {
                    let builder = dirs.entry(dir).or_insert_with(|| repo.treebuilder(None).unwrap());
                    builder.insert(name, blob, 0o100644).unwrap();
                }
                None => {
                    root.insert(file, blob, 0o100644).unwrap();
                }
            }
        }
        for (dir, builder) in dirs {
            root.insert(dir, builder.write().unwrap(), 0o040000).unwrap();
        }
        let tree = repo.find_tree(root.write().unwrap()).unwrap();
        let sig = Signature::now("t", "t@example.com").unwrap();
        repo.commit(Some("refs/heads/main"), &sig, &sig, "Demo", &tree, &[]).unwrap();
        (tmp, path)
    }

    const DEMO: &str = "\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 2
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
        - name: web
          image: gitplane.local/httpd:1
          ports:
            - containerPort: 80
          resources:
            requests: {cpu: 100m, memory: 32Mi}
---
apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  selector: {app: web}
  ports:
    - port: 80
      targetPort: 80
";

    #[test]
    fn t10_a_demo_commit_loads() {
        let (_tmp, repo) = commit(&[("deploy/web.yaml", DEMO), ("README.md", "hi")]);
        let limits = Limits::default();
        let commit = read_commit(&repo, "main", "deploy", &limits).unwrap();
        assert_eq!(commit.subject, "Demo");
        let manifests = load(&commit.files, &Validator::new(), "demo", &limits).unwrap();
        let keys: Vec<_> = manifests.iter().map(|m| (m.key.to_string(), m.line)).collect();
        assert_eq!(keys, [("Deployment.apps demo/web".into(), 1), ("Service demo/web".into(), 21)]);
    }

    #[test]
    fn t90_an_application_loads() {
        let app = "apiVersion: gitplane.io/v1\nkind: Application\nmetadata: {name: demo, namespace: gitplane-system}\nspec: {repo: demo, path: deploy}\n";
        let files = [ManifestFile::new("apps/demo.yaml", app.as_bytes().to_vec())];
        let manifests = load(&files, &Validator::new(), "demo", &Limits::default()).unwrap();
        assert_eq!(manifests[0].key.to_string(), "Application.gitplane.io gitplane-system/demo");
    }

    #[test]
    fn t10_a_broken_commit_reports_every_error() {
        let broken = DEMO
            .replace("replicas: 2", "replicas: \"two\"")
            .replace("targetPort: 80", "targetPort: 80\n      nodePortt: 1");
        let (_tmp, repo) = commit(&[("deploy/web.yaml", &broken), ("deploy/z.yaml", "a: [\n")]);
        let commit = read_commit(&repo, "main", "deploy", &Limits::default()).unwrap();
        let errors = load(&commit.files, &Validator::new(), "default", &Limits::default()).unwrap_err();
        let errors: Vec<_> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(
            errors,
            [
                r#"deploy/web.yaml:6: Deployment web: /spec/replicas: "two" is not of type "integer""#,
                r#"deploy/web.yaml:30 (document 2): Service web: /spec/ports/0: unknown field "nodePortt" (did you mean "nodePort"?)"#,
                "deploy/z.yaml:2:1: did not find expected node content, while parsing a flow node",
            ]
        );
    }

    #[test]
    fn t10_a_kustomization_is_built_by_kustomize_and_errors_name_its_files() {
        let base = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: web}\ndata: {a: '1'}\n";
        let files = [
            ("base/kustomization.yaml", "resources: [web.yaml]\n"),
            ("base/web.yaml", base),
            ("app/kustomization.yaml", "namePrefix: prod-\nresources: [../base]\n"),
            ("app/README.md", "not a manifest"),
        ];
        let (_tmp, repo) = commit(&files);
        let app = AppSource { path: "app".into(), default_namespace: "demo".into(), ..AppSource::default() };
        let mut cache = SourceCache::new();
        let head = read_head(&repo, "main").unwrap();
        let manifests = load_commit(&head, &app, &Validator::new(), &Limits::default(), &mut cache).unwrap();
        let seen: Vec<_> = manifests.iter().map(|m| (m.key.to_string(), m.file.as_str(), m.line)).collect();
        assert_eq!(seen, [("ConfigMap demo/prod-web".to_owned(), "base/web.yaml", 1)]);
        load_commit(&head, &app, &Validator::new(), &Limits::default(), &mut cache).unwrap();
        assert_eq!(cache.stats().kustomize_builds, 1, "an unchanged kustomization is not built again");

        let broken = "# a comment\n".to_owned() + base + "immutable: \"yes\"\n";
        let (_tmp, repo) = commit(&[files[0], ("base/web.yaml", &broken), files[2]]);
        let head = read_head(&repo, "main").unwrap();
        let errors = match load_commit(&head, &app, &Validator::new(), &Limits::default(), &mut cache) {
            Err(LoadError::Invalid(errors)) => errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
            other => panic!("{other:?}"),
        };
        assert_eq!(errors, [r#"base/web.yaml:2: ConfigMap prod-web: /immutable: "yes" is not of type "boolean""#]);

        let (_tmp, repo) = commit(&[("app/kustomization.yaml", "resources: [github.com/org/repo/base]\n")]);
        let head = read_head(&repo, "main").unwrap();
        let errors = match load_commit(&head, &app, &Validator::new(), &Limits::default(), &mut cache) {
            Err(LoadError::Invalid(errors)) => errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
            other => panic!("{other:?}"),
        };
        assert!(errors[0].starts_with("app/kustomization.yaml:1: /resources/0: "), "{errors:?}");
    }

    #[test]
    fn t10_human_bytes() {
        assert_eq!(human_bytes(12), "12 bytes");
        assert_eq!(human_bytes(1 << 20), "1 MiB");
        assert_eq!(human_bytes(3 << 19), "1.5 MiB");
        assert_eq!(human_bytes(64 << 20), "64 MiB");
    }

    #[test]
    fn t10_manifest_file_debug_hides_content() {
        let file = ManifestFile::new("s.yaml", b"password: hunter2".to_vec());
        assert_eq!(format!("{file:?}"), r#"ManifestFile { path: "s.yaml", bytes: 17 }"#);
    }
}
