//! Incremental loading: each file's outcome (its accepted objects, or its errors) is kept by
//! (path, blob id, values digest), so that a new commit renders, parses and validates only the
//! files that changed. What spans files — the document and byte limits, duplicate objects — is
//! recomputed on every load from what the outcomes keep, over keys only.
//!
//! Invariants:
//! - A cached outcome is exactly what a cold load of the same file would give: the outcome of
//!   a file depends on its path, its bytes (the blob id), for a template the values (their
//!   digest), and the settings (default namespace, limits), which clear the cache when they
//!   change. Each file is processed on its own (so files can be processed in parallel), up to
//!   the document limit; a file cut short by it is not kept.
//! - Errors are outcomes too: a broken file that did not change is not parsed again, and its
//!   errors are still reported.
//! - The cache holds the files of the last load only, so it never grows past one commit.

use crate::{
    AppSource, Head, Limits, LoadError, Manifest, ManifestError, SourceError,
    git::Candidate,
    kustomize, manifest,
    template::{self, Values},
    validate::{self, Accepted, Validator},
};
use git2::Oid;
use serde_json::Value;
use std::{
    borrow::Cow,
    collections::{HashMap, HashSet, VecDeque, hash_map::RandomState},
    hash::BuildHasher,
    path::{Path, PathBuf},
    sync::{Arc, LazyLock, Mutex},
    time::{Duration, Instant},
};

/// What one load reuses from the previous ones: keep one per Application, across its commits.
#[derive(Default)]
pub struct SourceCache {
    /// The default namespace and limits the outcomes were made with.
    settings: Option<(String, Limits)>,
    /// Sorted by path, as candidates are: a load finds its entries by a merge, without hashing
    /// 10,000 paths.
    files: Vec<FileEntry>,
    values: HashMap<String, ValuesEntry>,
    /// Hashes object keys once, when their file is validated, for the duplicate check of every
    /// later load. Random per cache: keys come from Git.
    keys: RandomState,
    stats: CacheStats,
    /// The Application's repository, kept open: opening one reads its config and the user's
    /// and system's Git config, and lists its packs, on every sync otherwise.
    repository: Option<(PathBuf, git2::Repository)>,
}

/// kustomize builds kept for every load in this process, by the digest of every file a build
/// read: the push's verdict and the sync that follows build once, and a commit that changes
/// none of those files does not run kustomize. The newest first, bounded in count and bytes.
static BUILDS: LazyLock<Mutex<Builds>> = LazyLock::new(Default::default);
type Builds = VecDeque<([u8; 32], kustomize::Build)>;
const MAX_BUILDS: usize = 32;
const MAX_BUILD_BYTES: u64 = 64 << 20;

impl SourceCache {
    /// The kustomize build of inputs with digest `key`, if one is kept.
    pub(crate) fn kustomized(&self, key: &[u8; 32]) -> Option<kustomize::Build> {
        let builds = BUILDS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        builds.iter().find(|(k, _)| k == key).map(|(_, build)| build.clone())
    }

    /// Keeps a kustomize build just made from inputs with digest `key`.
    pub(crate) fn keep_kustomized(&mut self, key: [u8; 32], build: kustomize::Build) {
        self.stats.kustomize_builds += 1;
        let mut builds = BUILDS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        builds.push_front((key, build));
        let size = |b: &kustomize::Build| b.as_ref().map_or(0, |r| r.bytes());
        while builds.len() > MAX_BUILDS || builds.iter().map(|(_, b)| size(b)).sum::<u64>() > MAX_BUILD_BYTES {
            builds.pop_back();
        }
    }
}

/// Counters of the work loads did and avoided, and the time it took, since the cache was made.
/// Times of files processed in parallel are summed over the threads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Manifest files whose outcome was reused.
    pub hits: u64,
    /// Manifest files parsed and validated (rendered first, for templates).
    pub processed: u64,
    /// Templates rendered.
    pub rendered: u64,
    /// kustomize builds run (a kustomization whose files did not change is not built again).
    pub kustomize_builds: u64,
    /// Documents validated.
    pub validated: u64,
    /// Blobs (or files on disk) read, values files included.
    pub read: u64,
    /// Walking the commit's tree and finding the sizes of its blobs (every load walks).
    pub walking: Duration,
    /// Reading the blobs the cache did not hold.
    pub reading: Duration,
    /// Rendering templates.
    pub rendering: Duration,
    /// Parsing and validating files, and the checks across files (every load makes those).
    pub validating: Duration,
}

struct FileEntry {
    path: String,
    blob: Oid,
    size: u64,
    /// The digest of the values a template was rendered with; `None` for plain YAML.
    values: Option<[u8; 32]>,
    outcome: Arc<Outcome>,
}

struct ValuesEntry {
    blob: Oid,
    size: u64,
    parsed: Result<Value, Vec<ManifestError>>,
}

/// What one manifest file gave.
struct Outcome {
    /// Counted against [`Limits::max_total_bytes`]: a template's rendered size.
    bytes: u64,
    /// (index, line) of its non-empty documents, for [`Limits::max_documents`].
    documents: Vec<(usize, usize)>,
    manifests: Vec<Accepted>,
    errors: Vec<ManifestError>,
}

impl CacheStats {
    fn add(&mut self, other: &CacheStats) {
        self.hits += other.hits;
        self.processed += other.processed;
        self.rendered += other.rendered;
        self.kustomize_builds += other.kustomize_builds;
        self.validated += other.validated;
        self.read += other.read;
        self.walking += other.walking;
        self.reading += other.reading;
        self.rendering += other.rendering;
        self.validating += other.validating;
    }
}

impl SourceCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// The head of `branch` in `repo`, through the repository this cache keeps open.
    pub fn read_head(&mut self, repo: &Path, branch: &str) -> Result<Head, SourceError> {
        let repository = self.take_repository(repo)?;
        let head = crate::git::head_of(&repository, repo, branch);
        self.keep_repository(repo, repository);
        head
    }

    pub(crate) fn take_repository(&mut self, repo: &Path) -> Result<git2::Repository, SourceError> {
        match self.repository.take() {
            Some((path, repository)) if path == repo => Ok(repository),
            _ => crate::git::open(repo),
        }
    }

    pub(crate) fn keep_repository(&mut self, repo: &Path, repository: git2::Repository) {
        self.repository = Some((repo.to_owned(), repository));
    }

    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    pub(crate) fn walked(&mut self, took: Duration) {
        self.stats.walking += took;
    }

    /// Manifest and values files held.
    pub fn len(&self) -> usize {
        self.files.len() + self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn clear(&mut self) {
        self.settings = None;
        self.files.clear();
        self.values.clear();
    }

    /// The sizes of the `candidates` (sorted by path) whose blob the cache read already: a blob
    /// id names its bytes, so their size need not be read from Git again.
    pub(crate) fn known_sizes(&self, candidates: &[Candidate]) -> Vec<Option<u64>> {
        let mut entries = self.files.iter().peekable();
        candidates
            .iter()
            .map(|c| {
                while entries.next_if(|e| e.path < c.path).is_some() {}
                let file = entries.peek().filter(|e| e.path == c.path && e.blob == c.blob).map(|e| e.size);
                let values = || self.values.get(&c.path).filter(|e| e.blob == c.blob).map(|e| e.size);
                file.or_else(values).filter(|_| !c.blob.is_zero())
            })
            .collect()
    }

    fn prepare(&mut self, default_namespace: &str, limits: &Limits) {
        let same = self.settings.as_ref().is_some_and(|(ns, l)| ns == default_namespace && l == limits);
        if !same {
            self.clear();
            self.settings = Some((default_namespace.to_owned(), limits.clone()));
        }
    }
}

impl std::fmt::Debug for SourceCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourceCache")
            .field("files", &self.files.len())
            .field("values", &self.values.len())
            .field("stats", &self.stats)
            .finish()
    }
}

/// Loads the `candidates` (sorted by path, sizes checked) of the directory `dir` of an
/// Application, reading through `read` (given the candidate's position) only the files the cache
/// does not hold.
pub(crate) fn load<'c>(
    candidates: &'c [Candidate],
    dir: &str,
    app: &AppSource,
    validator: &Validator,
    limits: &Limits,
    cache: &mut SourceCache,
    mut read: impl FnMut(usize, &'c Candidate) -> Result<Cow<'c, [u8]>, SourceError>,
) -> Result<Vec<Arc<Manifest>>, LoadError> {
    debug_assert!(candidates.is_sorted_by(|a, b| a.path < b.path), "candidates are sorted by path");
    cache.prepare(&app.default_namespace, limits);
    let mut errors = Vec::new();
    // Values files are not manifests: they are left out even when they have errors.
    let (values, excluded) = values(candidates, dir, app, limits, cache, &mut read, &mut errors)?;

    // The entries of the previous load, merged with this load's files by path; what this load
    // does not see is dropped, so the cache follows the branch instead of accumulating. (A read
    // error stops the load: the entries not merged yet are dropped, and read again next time.)
    // Every file the cache does not hold is read first (their sizes were checked), then they
    // are processed, on every CPU when there are many, then merged in order.
    let mut previous = std::mem::take(&mut cache.files).into_iter().peekable();
    let mut slots: Vec<Slot<'c>> = Vec::with_capacity(candidates.len());
    for (position, candidate) in candidates.iter().enumerate() {
        let path = candidate.path.as_str();
        while previous.next_if(|e| e.path.as_str() < path).is_some() {}
        let entry = previous.next_if(|e| e.path == path);
        if excluded.contains(path) {
            continue;
        }
        let digest = match (template::is_template(path), &values) {
            (false, _) => None,
            (true, Some(values)) => Some(values.digest),
            // The values have errors, reported already: the templates cannot render.
            (true, None) => continue,
        };
        match entry.filter(|e| !candidate.blob.is_zero() && e.blob == candidate.blob && e.values == digest) {
            Some(entry) => {
                cache.stats.hits += 1;
                slots.push(Slot::Hit { candidate, entry });
            }
            None => {
                let started = Instant::now();
                let content = read(position, candidate)?;
                cache.stats.reading += started.elapsed();
                cache.stats.read += 1;
                slots.push(Slot::Miss { candidate, digest, content });
            }
        }
    }
    let context = Context { validator, default_namespace: &app.default_namespace, limits, keys: &cache.keys };
    let jobs: Vec<Job<'_>> = slots
        .iter()
        .filter_map(|slot| match slot {
            Slot::Miss { candidate, digest, content } => {
                Some((candidate.path.as_str(), content.as_ref(), values.as_ref().filter(|_| digest.is_some())))
            }
            Slot::Hit { .. } => None,
        })
        .collect();
    let mut processed = process_all(&jobs, &context, &mut cache.stats).into_iter();

    let too_large = |path: &str| {
        let limit = crate::human_bytes(limits.max_total_bytes);
        ManifestError::new(
            path,
            format!(
                "the manifests add up to more than {limit} here (templates counted as rendered): \
                 split them across Applications"
            ),
        )
    };
    let mut outcomes: Vec<Arc<Outcome>> = Vec::with_capacity(slots.len());
    let mut documents = 0usize;
    let mut bytes = 0u64;
    for slot in slots {
        let (path, entry) = match slot {
            Slot::Hit { candidate, entry } => (candidate.path.as_str(), Some(entry)),
            Slot::Miss { candidate, digest, .. } => {
                let Some(Some((outcome, complete))) = processed.next() else {
                    // Not processed: what was rendered already went past the total limit.
                    errors.push(too_large(&candidate.path));
                    break;
                };
                let entry = FileEntry {
                    path: candidate.path.clone(),
                    blob: candidate.blob,
                    size: candidate.size,
                    values: digest,
                    outcome: Arc::new(outcome),
                };
                // A file cut short by the document limit is not kept.
                let cacheable = complete && !candidate.blob.is_zero();
                if !cacheable {
                    outcomes.push(Arc::clone(&entry.outcome));
                }
                (candidate.path.as_str(), cacheable.then_some(entry))
            }
        };
        if let Some(entry) = entry {
            outcomes.push(Arc::clone(&entry.outcome));
            cache.files.push(entry);
        }
        // Limits over the whole commit, from what each outcome kept.
        let Some(outcome) = outcomes.last() else { continue };
        let over_documents = outcome.documents.get(limits.max_documents.saturating_sub(documents)).copied();
        documents += outcome.documents.len();
        bytes = bytes.saturating_add(outcome.bytes);
        if let Some((index, line)) = over_documents {
            errors.push(manifest::too_many_documents(path, index, line, limits.max_documents));
            break;
        }
        if bytes > limits.max_total_bytes {
            errors.push(too_large(path));
            break;
        }
    }

    for outcome in &outcomes {
        errors.extend(outcome.errors.iter().cloned());
    }
    let started = Instant::now();
    let (accepted, repeated) = validate::last_definitions(outcomes.iter().flat_map(|o| o.manifests.iter()).collect());
    let mut across = validate::unknown_target_ports(&accepted);
    across.extend(validate::selected_service_endpoints(&accepted));
    across.extend(validate::missing_keys(&accepted));
    cache.stats.validating += started.elapsed();
    if errors.is_empty() && across.is_empty() {
        return Ok(validate::with_warnings(accepted, repeated));
    }
    errors.extend(across.into_iter().map(|(_, error)| error));
    let rank: HashMap<&str, usize> = candidates.iter().enumerate().map(|(i, c)| (c.path.as_str(), i)).collect();
    errors.sort_by_key(|e| {
        (rank.get(e.file.as_str()).copied().unwrap_or(usize::MAX), e.line.unwrap_or(0), e.column.unwrap_or(0))
    });
    Err(LoadError::Invalid(errors))
}

/// A file of this load: held by the cache, or read and to be processed.
enum Slot<'c> {
    Hit { candidate: &'c Candidate, entry: FileEntry },
    Miss { candidate: &'c Candidate, digest: Option<[u8; 32]>, content: Cow<'c, [u8]> },
}

/// A file to process: its path, its bytes, the values when it is a template.
type Job<'a> = (&'a str, &'a [u8], Option<&'a Values>);

/// Below this many files to process, threads cost more than they save.
const PARALLEL_MIN_FILES: usize = 64;

/// Processes `jobs` (in order, each file on its own, so on any thread), split across the CPUs
/// when there are many: a cold load of a large repository is mostly parsing. Once what was
/// rendered adds up to more than the total limit, the rest is not processed (`None`): templates
/// may render to more than their size, and the limit bounds the work as well as the result.
fn process_all(jobs: &[Job<'_>], context: &Context<'_>, stats: &mut CacheStats) -> Vec<Option<(Outcome, bool)>> {
    let rendered = std::sync::atomic::AtomicU64::new(0);
    let run = |jobs: &[Job<'_>], stats: &mut CacheStats| -> Vec<Option<(Outcome, bool)>> {
        jobs.iter()
            .map(|(path, content, values)| {
                if rendered.load(std::sync::atomic::Ordering::Relaxed) > context.limits.max_total_bytes {
                    return None;
                }
                let processed = process(path, content, *values, context, stats);
                rendered.fetch_add(processed.0.bytes, std::sync::atomic::Ordering::Relaxed);
                Some(processed)
            })
            .collect()
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    if threads < 2 || jobs.len() < PARALLEL_MIN_FILES {
        return run(jobs, stats);
    }
    let mut chunks = jobs.chunks(jobs.len().div_ceil(threads));
    let first = chunks.next().unwrap_or_default();
    std::thread::scope(|scope| {
        let others: Vec<_> = chunks
            .map(|chunk| {
                scope.spawn(move || {
                    let mut stats = CacheStats::default();
                    (run(chunk, &mut stats), stats)
                })
            })
            .collect();
        let mut all = run(first, stats);
        for handle in others {
            // `process` does not panic on input; if it did, the panic belongs to this thread.
            let (outcomes, more) = handle.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            all.extend(outcomes);
            stats.add(&more);
        }
        all
    })
}

/// The merged values for the templates (`None` when a values file has errors, which go to
/// `errors`), and the paths of the values files.
fn values<'c>(
    candidates: &'c [Candidate],
    dir: &str,
    app: &AppSource,
    limits: &Limits,
    cache: &mut SourceCache,
    read: &mut impl FnMut(usize, &'c Candidate) -> Result<Cow<'c, [u8]>, SourceError>,
    errors: &mut Vec<ManifestError>,
) -> Result<(Option<Values>, HashSet<String>), LoadError> {
    let mut merged = Value::Object(Default::default());
    let mut failed = false;
    let mut wanted = HashSet::new();
    for file in &app.values_files {
        let Some(path) = values_path(dir, file) else {
            errors.push(ManifestError::new(
                file,
                "is not a valid values file path: write it relative to the Application's path, inside the repository",
            ));
            failed = true;
            continue;
        };
        let Ok(position) = candidates.binary_search_by(|c| c.path.as_str().cmp(&path)) else {
            let shown = if dir.is_empty() { "the repository root" } else { dir };
            errors.push(ManifestError::new(
                &path,
                format!("values file not found: valuesFiles are relative to the Application's path ({shown})"),
            ));
            failed = true;
            continue;
        };
        let candidate = &candidates[position];
        wanted.insert(path.clone());
        let cached = cache.values.get(&path).filter(|e| !candidate.blob.is_zero() && e.blob == candidate.blob);
        let parsed = match cached {
            Some(entry) => entry.parsed.clone(),
            None => {
                let started = Instant::now();
                let content = read(position, candidate)?;
                cache.stats.reading += started.elapsed();
                cache.stats.read += 1;
                let parsed = parse_values(&path, &content, limits);
                let entry = ValuesEntry { blob: candidate.blob, size: candidate.size, parsed: parsed.clone() };
                cache.values.insert(path.clone(), entry);
                parsed
            }
        };
        match parsed {
            Ok(values) => template::merge_values(&mut merged, values),
            Err(more) => {
                errors.extend(more);
                failed = true;
            }
        }
    }
    cache.values.retain(|path, _| wanted.contains(path));
    if failed {
        return Ok((None, wanted));
    }
    template::merge_values(&mut merged, Value::Object(app.values.clone().into_iter().collect()));
    Ok((Some(Values::new(&merged)), wanted))
}

/// The path in the repository of the values file `file`, relative to the Application's `dir`:
/// `deploy/values/prod.yaml` for `values/prod.yaml` under `deploy`, `values/prod.yaml` for
/// `../values/prod.yaml`. `None` for an absolute path or one that climbs out of the repository.
///
/// Values files may sit beside the manifests' directory: that is where the values of the other
/// environments go, which would be manifests (and fail) inside it.
pub(crate) fn values_path(dir: &str, file: &str) -> Option<String> {
    if file.starts_with('/') || file.contains('\0') {
        return None;
    }
    let mut parts: Vec<&str> = dir.split('/').filter(|p| !p.is_empty()).collect();
    for part in file.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            part => parts.push(part),
        }
    }
    let path = parts.join("/");
    (!path.is_empty() && path != dir).then_some(path)
}

/// A values file: one YAML mapping (or nothing).
fn parse_values(path: &str, content: &[u8], limits: &Limits) -> Result<Value, Vec<ManifestError>> {
    let text = manifest::decode(path, content, limits).map_err(|e| vec![*e])?;
    let parsed = manifest::parse_text(path, text, None, limits, 1);
    if !parsed.errors.is_empty() {
        return Err(parsed.errors);
    }
    if let Some((index, line)) = parsed.over {
        let mut error = ManifestError::new(path, "a values file holds one YAML document: merge them into one");
        (error.line, error.document) = (Some(line), Some(index));
        return Err(vec![error]);
    }
    match parsed.documents.into_iter().next() {
        None => Ok(Value::Object(Default::default())),
        Some(document) if document.value.is_object() => Ok(document.value),
        Some(document) => {
            let mut error = ManifestError::new(path, "a values file is a mapping of names to values, e.g. replicas: 2");
            error.line = Some(document.line);
            Err(vec![error])
        }
    }
}

/// What validating a file needs besides the file.
struct Context<'a> {
    validator: &'a Validator,
    default_namespace: &'a str,
    limits: &'a Limits,
    keys: &'a RandomState,
}

/// Renders (a template), parses and validates one file, stopping after the document limit: its
/// outcome, and whether it is complete (not cut short by that limit).
fn process(
    path: &str,
    content: &[u8],
    values: Option<&Values>,
    context: &Context<'_>,
    stats: &mut CacheStats,
) -> (Outcome, bool) {
    let (started, rendering) = (Instant::now(), stats.rendering);
    let processed = process_file(path, content, values, context, stats);
    // Decoding, parsing and validating: all of it but the rendering.
    stats.validating += started.elapsed().saturating_sub(stats.rendering.saturating_sub(rendering));
    processed
}

fn process_file(
    path: &str,
    content: &[u8],
    values: Option<&Values>,
    context: &Context<'_>,
    stats: &mut CacheStats,
) -> (Outcome, bool) {
    stats.processed += 1;
    let failed = |error: ManifestError, bytes: usize| {
        let outcome =
            Outcome { bytes: bytes as u64, documents: Vec::new(), manifests: Vec::new(), errors: vec![error] };
        (outcome, true)
    };
    let limits = context.limits;
    let text = match manifest::decode(path, content, limits) {
        Ok(text) => text,
        Err(error) => return failed(*error, content.len()),
    };
    let (text, map) = match values {
        Some(values) => {
            stats.rendered += 1;
            let started = Instant::now();
            let rendered = template::render(path, &text, values, limits);
            stats.rendering += started.elapsed();
            match rendered {
                Ok(rendered) => (Arc::from(rendered.text), Some(rendered.lines)),
                Err(error) => return failed(*error, content.len()),
            }
        }
        None => (text, None),
    };
    let bytes = text.len() as u64;
    let parsed = manifest::parse_text(path, text, map.as_ref(), limits, limits.max_documents);
    let mut outcome = Outcome {
        bytes,
        documents: parsed.documents.iter().map(|d| (d.index, d.line)).chain(parsed.over).collect(),
        manifests: Vec::with_capacity(parsed.documents.len()),
        errors: parsed.errors,
    };
    for document in parsed.documents {
        stats.validated += 1;
        match context.validator.check_document(document, context.default_namespace) {
            Ok((manifest, locator)) => {
                let key_hash = context.keys.hash_one(&manifest.key);
                outcome.manifests.push(Accepted { manifest: Arc::new(manifest), locator, key_hash });
            }
            Err(errors) => outcome.errors.extend(errors),
        }
    }
    (outcome, parsed.over.is_none())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Head, ManifestFile, load_commit, load_dir, load_files, read_head};
    use git2::{Repository, Signature};
    use serde_json::json;
    use std::{collections::BTreeMap, sync::LazyLock};

    static VALIDATOR: LazyLock<Validator> = LazyLock::new(Validator::new);

    fn app(values_files: &[&str], values: Value) -> AppSource {
        AppSource {
            path: "deploy".into(),
            default_namespace: "default".into(),
            values_files: values_files.iter().map(|f| (*f).to_owned()).collect(),
            values: serde_json::from_value(values).unwrap(),
        }
    }

    fn files(files: &[(&str, &str)]) -> Vec<ManifestFile> {
        files.iter().map(|(path, text)| ManifestFile::new(format!("deploy/{path}"), text.as_bytes().to_vec())).collect()
    }

    /// The objects as (key, value), or the errors as users read them.
    fn run(
        files: &[ManifestFile],
        app: &AppSource,
        cache: &mut SourceCache,
    ) -> Result<Vec<(String, Value)>, Vec<String>> {
        match load_files(files, app, &VALIDATOR, &Limits::default(), cache) {
            Ok(manifests) => Ok(manifests.iter().map(|m| (m.key.to_string(), m.value.clone())).collect()),
            Err(LoadError::Invalid(errors)) => Err(errors.iter().map(ToString::to_string).collect()),
            Err(LoadError::Source(e)) => Err(vec![e.to_string()]),
        }
    }

    fn errors(files: &[ManifestFile], app: &AppSource) -> Vec<String> {
        run(files, app, &mut SourceCache::new()).expect_err("the load fails")
    }

    const CONFIG: &str = "\
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ name }}
data:
  replicas: \"{{ replicas }}\"
  image: {{ image.repo }}:{{ image.tag }}
";
    const COMMON: &str = "name: settings\nreplicas: 1\nimage: {repo: httpd, tag: \"1\"}\n";
    const PROD: &str = "replicas: 3\nimage: {tag: \"2\"}\n";
    const SERVICE: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec:\n  ports: [{port: 80}]\n";

    #[test]
    fn t10_templates_render_with_values_files_then_values() {
        // The recommended layout: each environment's values beside the manifests' directory
        // (inside it, the values of the other environments would be manifests).
        let root = tempfile::TempDir::new().unwrap();
        let write = |path: &str, text: &str| {
            let path = root.path().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        write("deploy/config.yaml.j2", CONFIG);
        write("deploy/svc.yaml", SERVICE);
        write("deploy/values/common.yaml", COMMON);
        write("values/prod.yaml", PROD);
        write("values/staging.json", "{\"replicas\": 2}");
        // (valuesFiles, values, the ConfigMap's data): later files win, values win over files,
        // mappings merge key by key.
        let cases = [
            (vec!["values/common.yaml"], json!({}), json!({"replicas": "1", "image": "httpd:1"})),
            (
                vec!["values/common.yaml", "../values/prod.yaml"],
                json!({}),
                json!({"replicas": "3", "image": "httpd:2"}),
            ),
            (
                vec!["../values/prod.yaml", "values/common.yaml"],
                json!({}),
                json!({"replicas": "1", "image": "httpd:1"}),
            ),
            (
                vec!["values/common.yaml", "./values/../../values//prod.yaml", "../values/staging.json"],
                json!({"image": {"repo": "nginx"}}),
                json!({"replicas": "2", "image": "nginx:2"}),
            ),
        ];
        for (values_files, values, data) in cases {
            let app = app(&values_files, values);
            let loaded = load_dir(root.path(), &app, &VALIDATOR, &Limits::default(), &mut SourceCache::new()).unwrap();
            // The values files are not manifests.
            let keys: Vec<String> = loaded.iter().map(|m| m.key.to_string()).collect();
            assert_eq!(keys, ["ConfigMap default/settings", "Service default/web"], "{values_files:?}");
            assert_eq!(loaded[0].value["data"], data, "{values_files:?}");
            assert_eq!(loaded[0].file, "deploy/config.yaml.j2");
        }
        // A values file under the path that the Application does not name is a manifest.
        let e = errors(&files(&[("svc.yaml", SERVICE), ("values/common.yaml", COMMON)]), &app(&[], json!({})));
        assert!(e[0].starts_with("deploy/values/common.yaml:1: apiVersion is missing"), "{e:?}");
    }

    #[test]
    fn t10_template_errors_name_the_template_line() {
        let deployment = "\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: {{ replicas }}
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: web, image: \"{{ image }}\"}]
";
        let values =
            json!({"replicas": "two", "image": "httpd", "names": ["a", "B_2", "c"], "password": "hunter2-secret"});
        let cases: Vec<(String, Vec<&str>)> = vec![
            (
                deployment.replace("{{ image }}", "{{ imagee }}"),
                vec!["deploy/web.yaml.j2:11: undefined value: `imagee` is undefined: set it in the Application's \
                      values or valuesFiles, or give a default: {{ name | default(\"x\") }}"],
            ),
            (
                deployment.replace("{{ replicas }}", "{{ replicas }"),
                vec!["deploy/web.yaml.j2:6: template syntax error: unexpected `}`, expected end of variable block"],
            ),
            // Errors in the output are at the template line that wrote them.
            (
                deployment.to_owned(),
                vec![r#"deploy/web.yaml.j2:6: Deployment web: /spec/replicas: "two" is not of type "integer""#],
            ),
            (
                "{% for n in names %}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ n }}\n{% endfor %}\n"
                    .into(),
                vec![
                    "deploy/web.yaml.j2:6 (document 2): ConfigMap B_2: /metadata/name: \"B_2\" is not a valid \
                     ConfigMap name: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric \
                     characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com')",
                ],
            ),
            // A YAML error in the output: the template line, without the output's column.
            (
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata:\n  a: {{ names }}\n  b: [\n".into(),
                vec!["deploy/web.yaml.j2:7: did not find expected node content, while parsing a flow node"],
            ),
            // Other positions the parser names are template lines too.
            (
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata:\n{% if true %}\n  a: [{{ names | join(', ') }}\n{% endif %}\n  b: x\n"
                    .into(),
                vec!["deploy/web.yaml.j2:8: did not find expected ',' or ']', while parsing a flow sequence at template line 6"],
            ),
            (
                "{% for i in range(100000) %}{{ password * 4 }}\n{% endfor %}".into(),
                vec!["deploy/web.yaml.j2: renders to 5.4 MiB, over the limit of 4 MiB per template (4 times the \
                      limit per manifest file): split it into several templates"],
            ),
            (
                "{{ password ~ password | int }}\n{{ (password | list)[99] }}".into(),
                vec!["deploy/web.yaml.j2:1: template error: invalid float literal"],
            ),
        ];
        for (template, expected) in cases {
            let repo = files(&[("web.yaml.j2", &template)]);
            let errors = errors(&repo, &app(&[], values.clone()));
            assert_eq!(errors, expected, "{template}");
            assert!(errors.iter().all(|e| !e.contains("hunter2")), "{errors:?}");
        }
    }

    #[test]
    fn t10_values_file_errors() {
        let cases: Vec<(&str, &str, Vec<&str>)> = vec![
            (
                "values/missing.yaml",
                "",
                vec![
                    "deploy/values/missing.yaml: values file not found: valuesFiles are relative to the \
                      Application's path (deploy)",
                ],
            ),
            (
                "../../secrets.yaml",
                "",
                vec![
                    "../../secrets.yaml: is not a valid values file path: write it relative to the Application's \
                      path, inside the repository",
                ],
            ),
            (
                "values/v.yaml",
                "- a\n- b\n",
                vec!["deploy/values/v.yaml:1: a values file is a mapping of names to values, e.g. replicas: 2"],
            ),
            (
                "values/v.yaml",
                "a: 1\n---\nb: 2\n",
                vec!["deploy/values/v.yaml:3 (document 2): a values file holds one YAML document: merge them into one"],
            ),
            (
                "values/v.yaml",
                "a: [\n",
                vec!["deploy/values/v.yaml:2:1: did not find expected node content, while parsing a flow node"],
            ),
        ];
        let bad_service = SERVICE.replace("ports:", "portz:");
        for (values_file, content, mut expected) in cases {
            let repo = files(&[("config.yaml.j2", CONFIG), ("svc.yaml", &bad_service), ("values/v.yaml", content)]);
            // The template is not rendered without its values; the other files are still checked.
            expected.push(r#"deploy/svc.yaml:5: Service web: /spec: unknown field "portz" (did you mean "ports"?)"#);
            let mut errors = errors(&repo, &app(&[values_file], json!({})));
            errors.sort();
            expected.sort();
            assert_eq!(errors, expected, "{values_file}: {content}");
        }
    }

    /// A bare repository whose `main` gets one commit of the files given, per call.
    struct Repo {
        _tmp: tempfile::TempDir,
        path: std::path::PathBuf,
    }

    impl Repo {
        fn new() -> Repo {
            let tmp = tempfile::TempDir::new().unwrap();
            let path = tmp.path().join("app.git");
            Repository::init_bare(&path).unwrap();
            Repo { _tmp: tmp, path }
        }

        /// Commits `files` (paths under `deploy/`, one directory deep at most).
        fn commit(&self, files: &BTreeMap<&str, String>) -> Head {
            let repo = Repository::open_bare(&self.path).unwrap();
            let mut dirs: BTreeMap<&str, git2::TreeBuilder> = BTreeMap::new();
            let mut deploy = repo.treebuilder(None).unwrap();
            for (path, text) in files {
                let blob = repo.blob(text.as_bytes()).unwrap();
                match path.split_once('/') {
                    Some((dir, name)) => {
                        let builder = dirs.entry(dir).or_insert_with(|| repo.treebuilder(None).unwrap());
                        builder.insert(name, blob, 0o100644).unwrap();
                    }
                    None => {
                        deploy.insert(path, blob, 0o100644).unwrap();
                    }
                }
            }
            for (dir, builder) in dirs {
                deploy.insert(dir, builder.write().unwrap(), 0o040000).unwrap();
            }
            let mut root = repo.treebuilder(None).unwrap();
            root.insert("deploy", deploy.write().unwrap(), 0o040000).unwrap();
            let tree = repo.find_tree(root.write().unwrap()).unwrap();
            let sig = Signature::now("t", "t@example.com").unwrap();
            let parent = repo.find_reference("refs/heads/main").ok().and_then(|r| r.peel_to_commit().ok());
            let parents: Vec<&git2::Commit> = parent.iter().collect();
            repo.commit(Some("refs/heads/main"), &sig, &sig, "change", &tree, &parents).unwrap();
            read_head(&self.path, "main").unwrap()
        }
    }

    fn cm(name: &str, value: &str) -> String {
        format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n  value: \"{value}\"\n")
    }

    fn load_head(head: &Head, app: &AppSource, cache: &mut SourceCache) -> Result<Vec<(String, Value)>, Vec<String>> {
        match load_commit(head, app, &VALIDATOR, &Limits::default(), cache) {
            Ok(manifests) => Ok(manifests.iter().map(|m| (m.key.to_string(), m.value.clone())).collect()),
            Err(LoadError::Invalid(errors)) => Err(errors.iter().map(ToString::to_string).collect()),
            Err(LoadError::Source(e)) => Err(vec![e.to_string()]),
        }
    }

    /// (hits, processed, rendered, read)
    type Work = (u64, u64, u64, u64);

    /// Work done by the cache between two snapshots of its counters.
    fn work(before: CacheStats, after: CacheStats) -> Work {
        (
            after.hits - before.hits,
            after.processed - before.processed,
            after.rendered - before.rendered,
            after.read - before.read,
        )
    }

    #[test]
    fn t10_a_one_file_commit_validates_one_file() {
        let repo = Repo::new();
        let app = app(&["values.yaml"], json!({}));
        let mut files: BTreeMap<&str, String> = BTreeMap::from([
            ("a.yaml", cm("a", "1")),
            ("b/b.yaml", cm("b", "1")),
            ("c.yaml.j2", cm("c", "{{ v }}")),
            ("values.yaml", "v: x\n".into()),
        ]);
        let mut cache = SourceCache::new();
        let head = repo.commit(&files);
        let first = load_head(&head, &app, &mut cache).unwrap();
        // (hits, processed, rendered, read): the values file is read, not processed.
        assert_eq!(work(CacheStats::default(), cache.stats()), (0, 3, 1, 4));
        assert_eq!(first, load_head(&head, &app, &mut SourceCache::new()).unwrap());

        let cases: Vec<(&str, Option<String>, Work)> = vec![
            // The same commit again: nothing read, nothing validated.
            ("nothing", None, (3, 0, 0, 0)),
            ("a plain file", Some(cm("b", "2")), (2, 1, 0, 1)),
            ("the template", Some(cm("c", "{{ v }}-{{ v }}")), (2, 1, 1, 1)),
            // New values: the template renders again, plain files do not.
            // (The template's text is read again: the cache keeps outcomes, not sources.)
            ("the values", Some("v: y\n".into()), (2, 1, 1, 2)),
        ];
        for (change, text, expected) in cases {
            match (change, text) {
                ("a plain file", Some(text)) => files.insert("b/b.yaml", text),
                ("the template", Some(text)) => files.insert("c.yaml.j2", text),
                ("the values", Some(text)) => files.insert("values.yaml", text),
                _ => None,
            };
            let head = repo.commit(&files);
            let before = cache.stats();
            let warm = load_head(&head, &app, &mut cache).unwrap();
            assert_eq!(work(before, cache.stats()), expected, "{change}");
            // Cached or cold, the same objects.
            assert_eq!(warm, load_head(&head, &app, &mut SourceCache::new()).unwrap(), "{change}");
        }
        let head = repo.commit(&files);
        let loaded = load_head(&head, &app, &mut cache).unwrap();
        assert_eq!(loaded[1].1["data"]["value"], "2");
        assert_eq!(loaded[2].1["data"]["value"], "y-y");

        // An unchanged file gives the very same objects, not copies: the apply step can skip
        // them by pointer, and no load copies 10,000 objects.
        let before = load_commit(&head, &app, &VALIDATOR, &Limits::default(), &mut cache).unwrap();
        files.insert("b/b.yaml", cm("b", "3"));
        let after = load_commit(&repo.commit(&files), &app, &VALIDATOR, &Limits::default(), &mut cache).unwrap();
        let same: Vec<bool> = before.iter().zip(&after).map(|(b, a)| Arc::ptr_eq(b, a)).collect();
        assert_eq!(same, [true, false, true]);
    }

    #[test]
    fn t10_shared_across_threads() {
        fn send_sync<T: Send + Sync>() {}
        fn send<T: Send>() {}
        // Moved to a blocking thread for each load; it keeps a repository open, which is not Sync.
        send::<SourceCache>();
        send_sync::<Head>();
        send_sync::<AppSource>();
        send_sync::<LoadError>();
        send_sync::<Arc<Manifest>>();
    }

    #[test]
    fn t10_errors_are_cached_and_still_reported() {
        let repo = Repo::new();
        let app = app(&[], json!({}));
        let broken = cm("a", "1").replace("\ndata:", "\ndta:");
        let mut files = BTreeMap::from([("a.yaml", broken), ("b.yaml", cm("b", "1")), ("c.yaml", cm("c", "1"))]);
        let mut cache = SourceCache::new();
        let expected = [r#"deploy/a.yaml:5: ConfigMap a: unknown field "dta" (did you mean "data"?)"#];
        let head = repo.commit(&files);
        assert_eq!(load_head(&head, &app, &mut cache).unwrap_err(), expected);
        let before = cache.stats();
        assert_eq!(load_head(&head, &app, &mut cache).unwrap_err(), expected);
        assert_eq!(work(before, cache.stats()), (3, 0, 0, 0));

        // An object defined again in a later file is found over cached files too: the last wins.
        files.insert("a.yaml", cm("a", "1"));
        files.insert("c.yaml", cm("b", "2"));
        let head = repo.commit(&files);
        let before = cache.stats();
        let loaded = load_commit(&head, &app, &VALIDATOR, &Limits::default(), &mut cache).unwrap();
        assert_eq!(work(before, cache.stats()), (1, 2, 0, 2));
        let objects: Vec<_> = loaded.iter().map(|m| (m.key.to_string(), m.value["data"].clone())).collect();
        assert_eq!(
            objects,
            [
                ("ConfigMap default/a".into(), json!({"value": "1"})),
                ("ConfigMap default/b".into(), json!({"value": "2"}))
            ]
        );
        let warnings: Vec<String> = loaded.iter().flat_map(|m| &m.warnings).map(ToString::to_string).collect();
        assert_eq!(
            warnings,
            [
                "deploy/c.yaml:4: ConfigMap b: /metadata/name: ConfigMap default/b is also defined at deploy/b.yaml:4: the \
              last definition read, this one, is applied, as kubectl apply -f would; keep only one of them"
            ]
        );
        let cold = load_commit(&head, &app, &VALIDATOR, &Limits::default(), &mut SourceCache::new()).unwrap();
        assert_eq!(loaded, cold);
        files.insert("c.yaml", cm("c", "1"));
        let loaded = load_commit(&repo.commit(&files), &app, &VALIDATOR, &Limits::default(), &mut cache).unwrap();
        let keys: Vec<String> = loaded.iter().map(|m| m.key.to_string()).collect();
        assert_eq!(keys, ["ConfigMap default/a", "ConfigMap default/b", "ConfigMap default/c"]);
        assert!(loaded.iter().all(|m| m.warnings.is_empty()));
        assert_eq!(cache.len(), 3);

        // Another default namespace is another outcome: everything is validated again.
        let other = AppSource { default_namespace: "prod".into(), ..app.clone() };
        let before = cache.stats();
        let loaded = load_head(&read_head(&repo.path, "main").unwrap(), &other, &mut cache).unwrap();
        assert_eq!(work(before, cache.stats()), (0, 3, 0, 3));
        assert_eq!(loaded[0].0, "ConfigMap prod/a");
    }

    #[test]
    fn t10_the_rendered_total_bounds_the_work_of_a_parallel_load() {
        // 100 small templates that render to 3 KB each: 300 KB rendered, over a 100 KiB limit.
        let texts: Vec<(String, String)> = (0..100)
            .map(|i| {
                let body = "{% for i in range(300) %}xxxxxxxxxx{% endfor %}";
                (format!("t{i:03}.yaml.j2"), format!("{}  big: \"{body}\"\n", cm(&format!("c{i:03}"), "1")))
            })
            .collect();
        let refs: Vec<(&str, &str)> = texts.iter().map(|(p, t)| (p.as_str(), t.as_str())).collect();
        let limits = Limits { max_total_bytes: 100 << 10, ..Limits::default() };
        let mut cache = SourceCache::new();
        let Err(LoadError::Invalid(errors)) =
            load_files(&files(&refs), &app(&[], json!({})), &VALIDATOR, &limits, &mut cache)
        else {
            panic!("the rendered total is not enforced")
        };
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].message.contains("add up to more than 100 KiB"), "{errors:?}");
        assert!(cache.stats().rendered < 60, "rendering went on past the limit: {:?}", cache.stats());
    }

    #[test]
    fn t10_many_files_are_processed_in_parallel_and_kept_in_order() {
        let mut texts: Vec<(String, String)> =
            (0..100).map(|i| (format!("f{i:03}.yaml"), cm(&format!("c{i:03}"), "1"))).collect();
        texts[70].1 = "a: [\n".into();
        let as_files = |texts: &[(String, String)]| {
            let refs: Vec<(&str, &str)> = texts.iter().map(|(p, t)| (p.as_str(), t.as_str())).collect();
            files(&refs)
        };
        let app = app(&[], json!({}));
        let mut cache = SourceCache::new();
        let errors = run(&as_files(&texts), &app, &mut cache).unwrap_err();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(errors[0].starts_with("deploy/f070.yaml:2:1: "), "{errors:?}");
        texts[70].1 = cm("c070", "1");
        let names: Vec<String> =
            run(&as_files(&texts), &app, &mut cache).unwrap().into_iter().map(|(k, _)| k).collect();
        let expected: Vec<String> = (0..100).map(|i| format!("ConfigMap default/c{i:03}")).collect();
        assert_eq!(names, expected);
        assert_eq!((cache.stats().processed, cache.stats().hits), (101, 99));
    }

    #[test]
    fn t10_the_document_limit_spans_cached_files() {
        let repo = Repo::new();
        let app = app(&[], json!({}));
        let two = format!("{}---\n{}", cm("a", "1"), cm("b", "1"));
        let files = BTreeMap::from([("a.yaml", two), ("b.yaml", cm("c", "1")), ("c.yaml", cm("d", "1"))]);
        let head = repo.commit(&files);
        let limits = Limits { max_documents: 3, ..Limits::default() };
        let mut cache = SourceCache::new();
        for _ in 0..2 {
            let Err(LoadError::Invalid(errors)) = load_commit(&head, &app, &VALIDATOR, &limits, &mut cache) else {
                panic!("the limit is not enforced")
            };
            let errors: Vec<String> = errors.iter().map(ToString::to_string).collect();
            assert_eq!(
                errors,
                ["deploy/c.yaml:1: more than 3 YAML documents in the commit: split them across Applications"]
            );
        }
        // Each file's outcome is its own (the limit is applied over them): all are reused.
        assert_eq!(cache.stats().hits, 3, "the files are reused");
    }
}
