//! Documents into objects gitplane accepts: known kind, strict schema, Kubernetes names and
//! scope, no server-managed fields, no duplicates, the namespace defaulted.

mod admission_webhooks;
mod autoscaling;
mod config_refs;
mod cron_job;
mod ingress;
mod network_policy;
mod pod;
mod removed;
mod resource_limits;
mod service;
mod storage;

pub(crate) use config_refs::missing_keys;
pub(crate) use service::{selected_service_endpoints, unknown_target_ports};

use crate::{
    ManifestError,
    error::{MASK, is_secret, show_value},
    locate::escape,
    manifest::{Document, Locator},
};
use base64::{
    Engine, alphabet,
    engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig},
};
use gitplane_api::{
    hooks,
    kinds::{self, KindInfo},
    kubedns,
    object::ObjectKey,
};
use jsonschema::error::ValidationErrorKind;
use serde_json::{Map, Value};
use std::{
    collections::{
        BTreeMap, HashMap,
        hash_map::{Entry, RandomState},
    },
    fmt,
    hash::{BuildHasher, BuildHasherDefault, Hasher},
    sync::Arc,
};

/// Fields of `metadata` that the server sets: a value for them in Git is a mistake (often a
/// `kubectl get -o yaml` pasted into the repository); `null` is no value (`drop_null_fields`).
const SERVER_MANAGED: [&str; 8] = [
    "resourceVersion",
    "uid",
    "creationTimestamp",
    "generation",
    "managedFields",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "selfLink",
];

/// Messages longer than this quote no value: an `anyOf` error would print a whole object.
const MAX_MESSAGE: usize = 240;

/// An object accepted from Git, ready to apply.
#[derive(Clone, PartialEq)]
pub struct Manifest {
    pub file: String,
    /// 0-based position of the document in its file.
    pub index: usize,
    /// 1-based line where the document starts.
    pub line: usize,
    pub key: ObjectKey,
    /// The object as written, with its namespace defaulted (namespaced kinds) and without
    /// `status` or fields set to `null`.
    pub value: Value,
    /// What the API server accepts and changes silently (a cluster-scoped object's namespace,
    /// which it clears), or accepts though it cannot work here (a volume the nodes cannot
    /// mount): shown as warnings, never refused.
    pub warnings: Vec<ManifestWarning>,
}

/// A warning about an object accepted from Git: where and what, and the reason of the Warning
/// Event each sync records on the object.
#[derive(Clone, Debug, PartialEq)]
pub struct ManifestWarning {
    pub reason: &'static str,
    pub detail: ManifestError,
}

impl fmt::Display for ManifestWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.detail.fmt(f)
    }
}

/// Reasons of the warnings.
const FIELD_IGNORED: &str = "FieldIgnored";
const UNMOUNTABLE_VOLUME: &str = "UnmountableVolume";
const REPEATED_RESOURCE: &str = "RepeatedResourceWarning";
const METRICS_UNAVAILABLE: &str = "MetricsUnavailable";
const WEBHOOK_NOT_CALLED: &str = "WebhookNotCalled";

impl fmt::Debug for Manifest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Manifest")
            .field("file", &self.file)
            .field("index", &self.index)
            .field("line", &self.line)
            .field("key", &self.key)
            .field("value", &crate::redacted(&self.value))
            .field("warnings", &self.warnings)
            .finish()
    }
}

/// The compiled schemas of the accepted kinds: build once, share (it is `Send + Sync`).
pub struct Validator {
    kinds: Vec<Kind>,
}

struct Kind {
    info: &'static KindInfo,
    validator: jsonschema::Validator,
    /// The schema itself, to suggest the field meant by an unknown one.
    schema: Value,
}

impl Default for Validator {
    fn default() -> Self {
        Self::new()
    }
}

/// One thing wrong in a document, before its line is known.
struct Problem {
    /// Shown as the error's path.
    pointer: Option<String>,
    /// Where the line is looked up, when more precise than `pointer` (an unknown field).
    at: Option<String>,
    message: String,
}

impl Problem {
    fn at(pointer: impl Into<String>, message: impl Into<String>) -> Self {
        Problem { pointer: Some(pointer.into()), at: None, message: message.into() }
    }

    fn whole(message: impl Into<String>) -> Self {
        Problem { pointer: None, at: None, message: message.into() }
    }
}

impl Validator {
    /// Compiles the schema of every accepted kind.
    ///
    /// # Panics
    /// If a schema of `gitplane-api` does not compile: the schemas are fixed at build time and a
    /// test compiles them all, so this is a bug of gitplane, never of the input.
    pub fn new() -> Self {
        let kinds = kinds::accepted()
            .iter()
            .map(|info| {
                let schema = info.schema();
                match jsonschema::validator_for(&schema) {
                    Ok(validator) => Kind { info, validator, schema },
                    Err(e) => panic!("the schema of {} does not compile: {e}", info.kind),
                }
            })
            .collect();
        Validator { kinds }
    }

    /// Validates parsed documents. Every error of every document is returned; on success the
    /// objects come in the order of the documents.
    pub fn validate(&self, docs: Vec<Document>, default_namespace: &str) -> Result<Vec<Manifest>, Vec<ManifestError>> {
        let mut accepted = Vec::with_capacity(docs.len());
        let mut errors = Vec::new();
        for doc in docs {
            match self.check_document(doc, default_namespace) {
                Ok(manifest) => accepted.push(manifest),
                Err(more) => errors.extend(more),
            }
        }
        let keys = RandomState::new();
        let accepted: Vec<Accepted> = accepted
            .into_iter()
            .map(|(manifest, locator)| Accepted {
                key_hash: keys.hash_one(&manifest.key),
                manifest: Arc::new(manifest),
                locator,
            })
            .collect();
        let (all, repeated) = last_definitions(accepted.iter().collect());
        errors.extend(unknown_target_ports(&all).into_iter().map(|(_, error)| error));
        errors.extend(selected_service_endpoints(&all).into_iter().map(|(_, error)| error));
        errors.extend(missing_keys(&all).into_iter().map(|(_, error)| error));
        if !errors.is_empty() {
            return Err(errors);
        }
        let manifests = with_warnings(all, repeated);
        drop(accepted);
        // Nothing else holds the objects: unwrapping does not copy them.
        Ok(manifests.into_iter().map(|m| Arc::try_unwrap(m).unwrap_or_else(|m| (*m).clone())).collect())
    }

    /// Checks one document on its own (everything but duplicates, which need all of them): the
    /// object with where to find its lines later, or every error of the document.
    pub(crate) fn check_document(
        &self,
        mut doc: Document,
        default_namespace: &str,
    ) -> Result<(Manifest, Locator), Vec<ManifestError>> {
        match self.check(&mut doc.value, default_namespace) {
            Ok((key, warnings)) => {
                // Warning path only, as the error path: valid documents index no lines.
                let warnings = if warnings.is_empty() { Vec::new() } else { located_warnings(&doc, warnings) };
                let locator = doc.locator();
                let manifest =
                    Manifest { file: doc.file, index: doc.index, line: doc.line, key, value: doc.value, warnings };
                Ok((manifest, locator))
            }
            // Error path only: the label and the lines cost nothing to valid documents.
            Err(problems) => Err(located(&doc, problems)),
        }
    }

    /// Checks one object and normalizes it (status dropped, namespace defaulted): its key and
    /// what the API server would change silently, or everything wrong with it.
    #[allow(clippy::type_complexity)]
    fn check(
        &self,
        value: &mut Value,
        default_namespace: &str,
    ) -> Result<(ObjectKey, Vec<(&'static str, Problem)>), Vec<Problem>> {
        let Some(object) = value.as_object_mut() else {
            return Err(vec![Problem::whole(not_an_object(value))]);
        };
        let (api_version, kind) = match (type_field(object, "apiVersion"), type_field(object, "kind")) {
            (Ok(api_version), Ok(kind)) => (api_version, kind),
            (api_version, kind) => return Err([api_version.err(), kind.err()].into_iter().flatten().collect()),
        };
        let Some(found) = self.kinds.iter().find(|k| k.info.api_version == api_version && k.info.kind == kind) else {
            return Err(vec![self.unknown_kind(api_version, kind)]);
        };
        let info = found.info;
        // Status is the server's: Kubernetes ignores it on create and update, and so do we.
        object.remove("status");
        drop_null_fields(object);

        // A hook named by generateName is checked as the name its sync gives it.
        let generated = hook_generate_name(value);
        if let Some(prefix) = &generated {
            value["metadata"]["name"] = Value::String(format!("{prefix}{GENERATED_EXAMPLE}"));
        }
        // The compiled validator's yes/no answer is much cheaper than collecting its errors.
        let mut problems = match found.validator.is_valid(value) {
            true => Vec::new(),
            false => schema_problems(&found.validator, &found.schema, value, &info.kind),
        };
        problems.extend(metadata_problems(value, info));
        problems.extend(kind_problems(value, info, default_namespace));
        if !problems.is_empty() {
            return Err(problems);
        }
        let mut warnings: Vec<_> = ignored_namespace(value, info).into_iter().map(|p| (FIELD_IGNORED, p)).collect();
        warnings.extend(kind_warnings(value, info));
        let key = normalize(value, info, default_namespace)?;
        match generated {
            Some(prefix) => {
                if let Some(metadata) = value["metadata"].as_object_mut() {
                    metadata.remove("name");
                }
                Ok((ObjectKey::new(key.kind, key.namespace, prefix), warnings))
            }
            None => Ok((key, warnings)),
        }
    }

    fn unknown_kind(&self, api_version: &str, kind: &str) -> Problem {
        if let Some(message) = removed::message(api_version, kind) {
            return Problem::at("/apiVersion", message);
        }
        if let Some(Kind { info, .. }) = self.kinds.iter().find(|k| k.info.kind == kind) {
            return Problem::at(
                "/apiVersion",
                format!(
                    "{kind} is accepted as apiVersion {}, not {api_version}: set apiVersion: {}",
                    info.api_version, info.api_version
                ),
            );
        }
        let accepted: Vec<_> = self.kinds.iter().map(|k| format!("{} ({})", k.info.kind, k.info.api_version)).collect();
        Problem::at(
            "/kind",
            format!("kind {kind} (apiVersion {api_version}) is not accepted; accepted kinds: {}", accepted.join(", ")),
        )
    }
}

/// An object that passed the checks of its own document, with what the checks across documents
/// need: where its lines are, and the hash of its key (computed once, when its file is validated).
pub(crate) struct Accepted {
    pub(crate) manifest: Arc<Manifest>,
    pub(crate) locator: Locator,
    pub(crate) key_hash: u64,
}

/// A hasher for keys hashed already: the hash is the key's `key_hash`.
#[derive(Default)]
struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used; fold anything else in rather than lose it.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// Objects defined more than once keep their last definition in the order files are read, as
/// `kubectl apply -f DIR` applies each in turn and Argo CD applies the last
/// (RepeatedResourceWarning): the objects to apply, and for each one defined more than once, by
/// its position among them, a warning naming the other definitions. Runs on the keys' hashes: no
/// object is validated or hashed again.
pub(crate) fn last_definitions(accepted: Vec<&Accepted>) -> (Vec<&Accepted>, Vec<(usize, ManifestWarning)>) {
    let mut first: HashMap<u64, usize, BuildHasherDefault<Prehashed>> =
        HashMap::with_capacity_and_hasher(accepted.len(), Default::default());
    // Keys whose hash equals that of another key: practically never, but then compared in full.
    let mut collided: HashMap<&ObjectKey, usize> = HashMap::new();
    // Every definition of a key defined more than once, by the position of its first.
    let mut repeated: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (position, a) in accepted.iter().enumerate() {
        let earlier = match first.entry(a.key_hash) {
            Entry::Vacant(entry) => {
                entry.insert(position);
                continue;
            }
            Entry::Occupied(entry) if accepted[*entry.get()].manifest.key == a.manifest.key => *entry.get(),
            Entry::Occupied(_) => match collided.entry(&a.manifest.key) {
                Entry::Vacant(entry) => {
                    entry.insert(position);
                    continue;
                }
                Entry::Occupied(entry) => *entry.get(),
            },
        };
        repeated.entry(earlier).or_insert_with(|| vec![earlier]).push(position);
    }
    if repeated.is_empty() {
        return (accepted, Vec::new());
    }
    let mut warned: HashMap<usize, ManifestWarning> = HashMap::new();
    let mut dropped = vec![false; accepted.len()];
    for positions in repeated.values() {
        let Some((&last, before)) = positions.split_last() else { continue };
        // Warning path only: index the documents now.
        let at = |p: usize| {
            format!("{}:{}", accepted[p].manifest.file, accepted[p].locator.lines().line_of("/metadata/name"))
        };
        let others: Vec<String> = before.iter().map(|&p| at(p)).collect();
        let m = &accepted[last].manifest;
        let detail = ManifestError {
            file: m.file.clone(),
            line: Some(accepted[last].locator.lines().line_of("/metadata/name")),
            column: None,
            document: Some(m.index),
            object: object_label(&m.value),
            path: Some("/metadata/name".into()),
            message: format!(
                "{} is also defined at {}: the last definition read, this one, is applied, as kubectl apply -f \
                 would; keep only one of them",
                m.key,
                others.join(", ")
            ),
        };
        warned.insert(last, ManifestWarning { reason: REPEATED_RESOURCE, detail });
        before.iter().for_each(|&p| dropped[p] = true);
    }
    let mut kept = Vec::with_capacity(accepted.len());
    let mut warnings = Vec::new();
    for (position, a) in accepted.into_iter().enumerate() {
        if dropped[position] {
            continue;
        }
        if let Some(warning) = warned.remove(&position) {
            warnings.push((kept.len(), warning));
        }
        kept.push(a);
    }
    (kept, warnings)
}

/// The objects to apply, with the warnings [`last_definitions`] gave them.
pub(crate) fn with_warnings(kept: Vec<&Accepted>, warnings: Vec<(usize, ManifestWarning)>) -> Vec<Arc<Manifest>> {
    let mut manifests: Vec<Arc<Manifest>> = kept.into_iter().map(|a| Arc::clone(&a.manifest)).collect();
    for (position, warning) in warnings {
        Arc::make_mut(&mut manifests[position]).warnings.push(warning);
    }
    manifests
}

/// Problems of a document at their lines, in line order.
fn located(doc: &Document, problems: Vec<Problem>) -> Vec<ManifestError> {
    located_with(doc, problems.into_iter().map(|p| ((), p)).collect()).into_iter().map(|(_, e)| e).collect()
}

/// Warnings of a document at their lines, in line order.
fn located_warnings(doc: &Document, warnings: Vec<(&'static str, Problem)>) -> Vec<ManifestWarning> {
    located_with(doc, warnings).into_iter().map(|(reason, detail)| ManifestWarning { reason, detail }).collect()
}

fn located_with<T>(doc: &Document, problems: Vec<(T, Problem)>) -> Vec<(T, ManifestError)> {
    let lines = doc.lines();
    let mut located: Vec<_> = problems
        .into_iter()
        .map(|(tag, p)| {
            let at = p.at.as_deref().or(p.pointer.as_deref()).unwrap_or("");
            (lines.line_of(at), tag, p)
        })
        .collect();
    located.sort_by_key(|(line, _, _)| *line);
    let object = object_label(&doc.value);
    located
        .into_iter()
        .map(|(line, tag, problem)| {
            let error = ManifestError {
                file: doc.file.clone(),
                line: Some(line),
                column: None,
                document: Some(doc.index),
                object: object.clone(),
                path: problem.pointer.filter(|p| !p.is_empty()),
                message: problem.message,
            };
            (tag, error)
        })
        .collect()
}

/// `Deployment web`, as far as the object says.
fn object_label(value: &Value) -> Option<String> {
    let kind = value.get("kind")?.as_str()?;
    match value.get("metadata").and_then(|m| m.get("name")).and_then(Value::as_str) {
        Some(name) => Some(format!("{kind} {name}")),
        None => Some(kind.to_owned()),
    }
}

fn not_an_object(value: &Value) -> String {
    let what = match value {
        Value::Array(_) => {
            return "the document is a list, not an object: write each object as its own YAML document, separated by ---"
                .into();
        }
        Value::String(_) => "a string",
        Value::Number(_) => "a number",
        Value::Bool(_) => "a boolean",
        Value::Null | Value::Object(_) => "empty",
    };
    format!("the document is {what}, not an object: a manifest is a mapping with apiVersion, kind and metadata")
}

/// The string of `apiVersion` or `kind`, which decide the schema and so come before it.
fn type_field<'a>(object: &'a Map<String, Value>, field: &str) -> Result<&'a str, Problem> {
    let pointer = format!("/{field}");
    match object.get(field) {
        Some(Value::String(s)) if !s.is_empty() => Ok(s),
        None | Some(Value::Null) | Some(Value::String(_)) => Err(Problem::whole(format!(
            "{field} is missing: every object needs apiVersion and kind, e.g. apiVersion: apps/v1 and kind: Deployment"
        ))),
        Some(other) => {
            let shown = show_value(None, &pointer, other);
            Err(Problem::at(pointer, format!("{shown} is not a valid {field}: write a string")))
        }
    }
}

fn schema_problems(validator: &jsonschema::Validator, schema: &Value, value: &Value, kind: &str) -> Vec<Problem> {
    let mut problems = Vec::new();
    for e in validator.iter_errors(value) {
        let pointer = e.instance_path().to_string();
        if let ValidationErrorKind::AdditionalProperties { unexpected } = e.kind() {
            // The known fields sit beside `additionalProperties` in the schema.
            let known = e
                .schema_path()
                .as_str()
                .strip_suffix("/additionalProperties")
                .and_then(|at| schema.pointer(&format!("{at}/properties")))
                .and_then(Value::as_object);
            // One error per field, each on its own line.
            for field in unexpected {
                let message = match pod::newer_field(field) {
                    Some(message) => message.to_owned(),
                    None => match known.and_then(|known| closest(field, known.keys())) {
                        Some(meant) => format!("unknown field {field:?} (did you mean {meant:?}?)"),
                        None => format!("unknown field {field:?}"),
                    },
                };
                problems.push(Problem {
                    at: Some(format!("{pointer}/{}", escape(field))),
                    pointer: Some(pointer.clone()),
                    message,
                });
            }
            continue;
        }
        let message = if is_secret(Some(kind), &pointer) {
            e.masked_with(MASK).to_string()
        } else {
            let message = e.to_string();
            if message.len() > MAX_MESSAGE { e.masked_with("the value").to_string() } else { message }
        };
        problems.push(Problem::at(pointer, message));
    }
    problems
}

/// The known field closest to a misspelt one, if close enough to be what was meant.
fn closest<'a>(field: &str, known: impl Iterator<Item = &'a String>) -> Option<&'a str> {
    // Long keys are not typos, and the distance is quadratic.
    if field.len() > 64 {
        return None;
    }
    let max = (field.chars().count() / 3).max(1);
    known.map(|k| (edit_distance(field, k), k.as_str())).filter(|(d, _)| *d <= max).min().map(|(_, k)| k)
}

/// Optimal string alignment distance: Levenshtein plus transpositions (`lables` for `labels`).
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.to_lowercase().chars().collect(), b.to_lowercase().chars().collect());
    let mut rows = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in rows.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in rows[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut d = (rows[i - 1][j] + 1).min(rows[i][j - 1] + 1).min(rows[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                d = d.min(rows[i - 2][j - 2] + 1);
            }
            rows[i][j] = d;
        }
    }
    rows[a.len()][b.len()]
}

/// "a" or "an" before a field's name, by its first letter ("an azureDisk volume").
fn indefinite_article(word: &str) -> &'static str {
    match word.chars().next() {
        Some('a' | 'e' | 'i' | 'o' | 'u' | 'A' | 'E' | 'I' | 'O' | 'U') => "an",
        _ => "a",
    }
}

/// A field set to `null` is a field not set: the API server decodes it so (`data: null` in a
/// published ConfigMap, `creationTimestamp: null` from `kubectl create --dry-run -o yaml`).
/// Items of lists stay: a `null` item is an error there too.
fn drop_null_fields(object: &mut Map<String, Value>) {
    object.retain(|_, value| !value.is_null());
    for value in object.values_mut() {
        match value {
            Value::Object(inner) => drop_null_fields(inner),
            Value::Array(items) => items.iter_mut().filter_map(Value::as_object_mut).for_each(drop_null_fields),
            _ => {}
        }
    }
}

/// What stands for the suffix of a generated name while a hook is checked: as long as the
/// part Argo CD appends (seven characters of the commit, the phase, the time).
const GENERATED_EXAMPLE: &str = "0123abc-presync-1700000000";

/// The `generateName` of an object that has no name, if it is a hook (only hooks get a name
/// per sync; anything else without a name is the schema's error).
fn hook_generate_name(value: &Value) -> Option<String> {
    let metadata = &value["metadata"];
    let prefix = metadata["generateName"].as_str().filter(|p| !p.is_empty())?;
    (metadata.get("name").is_none_or(Value::is_null) && hooks::is_hook(value)).then(|| prefix.to_owned())
}

/// What the schema cannot say about metadata: name syntax, scope, server-managed fields,
/// Argo CD's hook and wave annotations.
fn metadata_problems(value: &Value, info: &KindInfo) -> Vec<Problem> {
    let mut problems = Vec::new();
    let Some(metadata) = value.get("metadata").and_then(Value::as_object) else {
        return problems;
    };
    for (name, message) in hooks::problems(value) {
        problems.push(Problem::at(format!("/metadata/annotations/{}", escape(name)), message));
    }
    if metadata.get("name").is_none() && metadata.get("generateName").is_some_and(Value::is_string) {
        problems.push(Problem::at(
            "/metadata/generateName",
            "generateName makes a new object at every sync, which only an Argo CD hook \
             (argocd.argoproj.io/hook) may do: set metadata.name, or make the object a hook",
        ));
    }
    let kind = Some(info.kind.as_str());
    if let Some(Value::String(name)) = metadata.get("name") {
        let syntax = match info.kind.as_str() {
            "Namespace" => DnsName::Label,
            // Kubernetes: Service names become DNS labels and must start with a letter.
            "Service" => DnsName::Rfc1035Label,
            "Role" | "ClusterRole" | "RoleBinding" | "ClusterRoleBinding" => DnsName::PathSegment,
            _ => DnsName::Subdomain,
        };
        if let Err(why) = syntax.check(name) {
            let shown = show_value(kind, "/metadata/name", &Value::String(name.clone()));
            problems.push(Problem::at("/metadata/name", format!("{shown} is not a valid {} name: {why}", info.kind)));
        }
    }
    // A cluster-scoped object's namespace is dropped with a warning (`ignored_namespace`).
    if let Some(Value::String(namespace)) = metadata.get("namespace").filter(|ns| !is_empty_namespace(ns))
        && info.namespaced
        && let Err(why) = DnsName::Label.check(namespace)
    {
        let shown = show_value(kind, "/metadata/namespace", &Value::String(namespace.clone()));
        problems.push(Problem::at("/metadata/namespace", format!("{shown} is not a valid namespace: {why}")));
    }
    for field in SERVER_MANAGED {
        if metadata.contains_key(field) {
            problems.push(Problem::at(format!("/metadata/{field}"), "remove it: the server manages it"));
        }
    }
    problems
}

/// The one aggregated API gitplane accepts is the resource metrics API, which it serves itself
/// (metrics-server's manifests declare it); any other would name an API nothing serves.
fn api_service_problems(value: &Value) -> Vec<Problem> {
    const METRICS: &str = "v1beta1.metrics.k8s.io";
    let name = value["metadata"]["name"].as_str().unwrap_or("");
    let (group, version) = (value["spec"]["group"].as_str(), value["spec"]["version"].as_str());
    if name == METRICS && group == Some("metrics.k8s.io") && version == Some("v1beta1") {
        return Vec::new();
    }
    vec![Problem::at(
        "/metadata/name",
        format!(
            "only the APIService {METRICS} (group metrics.k8s.io, version v1beta1) is accepted: gitplane serves that \
             API itself and aggregates no other; remove this APIService (it is {name:?})"
        ),
    )]
}

/// What the API server refuses of a kind beyond its schema, and what gitplane's node agent
/// cannot run of a Pod.
fn kind_problems(value: &Value, info: &KindInfo, default_namespace: &str) -> Vec<Problem> {
    let mut problems = match info.kind.as_str() {
        "Job" => job_restart_policy(value, "/spec/template/spec/restartPolicy").into_iter().collect(),
        "CronJob" => cron_job::problems(value)
            .into_iter()
            .chain(job_restart_policy(value, "/spec/jobTemplate/spec/template/spec/restartPolicy"))
            .collect(),
        "HorizontalPodAutoscaler" => autoscaling::problems(value),
        "StatefulSet" => stateful_set_problems(value),
        "Secret" => secret_problems(value),
        "Ingress" => ingress::problems(value),
        "IngressClass" => ingress::class_problems(value),
        "NetworkPolicy" => network_policy::problems(value),
        "PersistentVolumeClaim" => storage::claim_problems(value),
        "PersistentVolume" => storage::volume_problems(value),
        "StorageClass" => storage::class_problems(value),
        "APIService" => api_service_problems(value),
        "ValidatingWebhookConfiguration" => admission_webhooks::problems(value, false),
        "MutatingWebhookConfiguration" => admission_webhooks::problems(value, true),
        "LimitRange" => resource_limits::limit_range_problems(value),
        "ResourceQuota" => resource_limits::resource_quota_problems(value),
        "ConfigMap" => kube_dns_problems(value, default_namespace),
        _ => Vec::new(),
    };
    if let Some(at) = pod::pod_spec_pointer(&info.kind)
        && let Some(spec) = value.pointer(at)
    {
        // A StatefulSet's claim templates are volumes of its Pods.
        let claims: Vec<&str> = value["spec"]["volumeClaimTemplates"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["metadata"]["name"].as_str())
            .collect();
        problems.extend(pod::problems(spec, at, &claims));
    }
    problems
}

/// What the API server accepts but gitplane warns of, with the warning's reason: volume sources
/// the nodes cannot mount (they fail at mount, as on a kubelet without the plugin), HPA metrics
/// no metrics API serves here, admission webhooks gitplane does not call.
fn kind_warnings(value: &Value, info: &KindInfo) -> Vec<(&'static str, Problem)> {
    let mut warnings = Vec::new();
    if info.kind == "PersistentVolume" {
        warnings.extend(storage::unmountable(value).map(|p| (UNMOUNTABLE_VOLUME, p)));
    }
    if info.kind == "HorizontalPodAutoscaler" {
        warnings.extend(autoscaling::warnings(value).into_iter().map(|p| (METRICS_UNAVAILABLE, p)));
    }
    if matches!(info.kind.as_str(), "ValidatingWebhookConfiguration" | "MutatingWebhookConfiguration") {
        warnings.extend(admission_webhooks::not_called(value).map(|p| (WEBHOOK_NOT_CALLED, p)));
    }
    if let Some(at) = pod::pod_spec_pointer(&info.kind)
        && let Some(spec) = value.pointer(at)
    {
        warnings.extend(pod::unmountable_volumes(spec, at).into_iter().map(|p| (UNMOUNTABLE_VOLUME, p)));
    }
    warnings
}

/// What the API server refuses of a StatefulSet beyond its schema: the policies' values, a
/// negative partition or first ordinal, Pods that may end, a claim template without a name.
fn stateful_set_problems(value: &Value) -> Vec<Problem> {
    let spec = &value["spec"];
    let mut problems = Vec::new();
    let one_of = |pointer: &str, allowed: &[&str], problems: &mut Vec<Problem>| {
        if let Some(v) = spec.pointer(pointer).and_then(Value::as_str)
            && !allowed.contains(&v)
        {
            problems.push(Problem::at(
                format!("/spec{pointer}"),
                format!("{v:?} is not one of {}: use one of them", allowed.join(", ")),
            ));
        }
    };
    one_of("/podManagementPolicy", &["OrderedReady", "Parallel"], &mut problems);
    one_of("/updateStrategy/type", &["RollingUpdate", "OnDelete"], &mut problems);
    one_of("/persistentVolumeClaimRetentionPolicy/whenDeleted", &["Retain", "Delete"], &mut problems);
    one_of("/persistentVolumeClaimRetentionPolicy/whenScaled", &["Retain", "Delete"], &mut problems);
    if spec["updateStrategy"]["type"] == "OnDelete" && !spec["updateStrategy"]["rollingUpdate"].is_null() {
        problems.push(Problem::at("/spec/updateStrategy/rollingUpdate", "only for type RollingUpdate: remove it"));
    }
    for pointer in ["/replicas", "/updateStrategy/rollingUpdate/partition", "/ordinals/start", "/minReadySeconds"] {
        if spec.pointer(pointer).and_then(Value::as_i64).is_some_and(|n| n < 0) {
            problems.push(Problem::at(format!("/spec{pointer}"), "must not be negative"));
        }
    }
    if let Some(policy) = spec["template"]["spec"]["restartPolicy"].as_str()
        && policy != "Always"
    {
        problems.push(Problem::at(
            "/spec/template/spec/restartPolicy",
            format!("a StatefulSet's Pods run until deleted: set restartPolicy to Always (it is {policy:?})"),
        ));
    }
    for (i, claim) in spec["volumeClaimTemplates"].as_array().into_iter().flatten().enumerate() {
        if claim["metadata"]["name"].as_str().is_none_or(str::is_empty) {
            problems.push(Problem::at(
                format!("/spec/volumeClaimTemplates/{i}/metadata/name"),
                "a claim template needs a name: its claims are <name>-<set>-<ordinal>",
            ));
        }
    }
    problems
}

/// A Job's Pods must end; `Always` (the Pod default) would run them forever.
fn job_restart_policy(value: &Value, at: &str) -> Option<Problem> {
    match value.pointer(at).and_then(Value::as_str) {
        Some("Never" | "OnFailure") => None,
        other => Some(Problem::at(
            at,
            format!(
                "a Job's Pods must end: set restartPolicy to Never or OnFailure (it is {})",
                other.map_or("not set, which means Always".to_owned(), |p| format!("{p:?}"))
            ),
        )),
    }
}

/// The cluster DNS ConfigMap, judged by the parser every node agent applies it with: a
/// ConfigMap the nodes would refuse is refused at push time instead of on each node.
fn kube_dns_problems(value: &Value, default_namespace: &str) -> Vec<Problem> {
    let namespace = value["metadata"]["namespace"].as_str().unwrap_or(default_namespace);
    if namespace != kubedns::NAMESPACE || value["metadata"]["name"] != kubedns::NAME {
        return Vec::new();
    }
    // Non-string values are the schema's error.
    let Ok(data) = serde_json::from_value::<Option<BTreeMap<String, String>>>(value["data"].clone()) else {
        return Vec::new();
    };
    match kubedns::parse(data.as_ref(), kubedns::DEFAULT_CLUSTER_DOMAIN) {
        Ok(_) => Vec::new(),
        Err(e) => vec![Problem::at(
            format!("/data/{}", e.key()),
            format!(
                "{e}: the node agents would refuse it and keep forwarding as before; see the README's \"Cluster DNS\" for the syntax"
            ),
        )],
    }
}

/// How the API server decodes a Secret's `data` (Go's `base64.StdEncoding`): padding required,
/// stray bits after the last byte ignored, and line breaks skipped (by the caller).
const SECRET_BASE64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_decode_allow_trailing_bits(true)
        .with_decode_padding_mode(DecodePaddingMode::RequireCanonical),
);

/// A Secret's `data` values must be base64, as the API server requires. The message never
/// quotes the value, nor the decoder's error (which names the offending byte).
fn secret_problems(value: &Value) -> Vec<Problem> {
    let mut problems = Vec::new();
    for (key, data) in value["data"].as_object().into_iter().flatten() {
        let Some(text) = data.as_str() else { continue }; // the schema's error
        let text: String = text.chars().filter(|c| !matches!(c, '\r' | '\n')).collect();
        if SECRET_BASE64.decode(text.as_bytes()).is_err() {
            problems.push(Problem::at(
                format!("/data/{}", escape(key)),
                "the value is not valid base64: encode it (e.g. with base64 -w0), or move it to stringData as plain text",
            ));
        }
    }
    problems
}

/// The API server's write of `stringData`: each value is base64-encoded into `data`, replacing
/// a value of the same key there, and `stringData` itself is not stored.
fn merge_string_data(object: &mut Map<String, Value>) {
    let Some(Value::Object(string_data)) = object.remove("stringData") else { return };
    if string_data.is_empty() {
        return;
    }
    let data = object.entry("data").or_insert_with(|| Value::Object(Map::new()));
    if !data.is_object() {
        *data = Value::Object(Map::new()); // null: the schema allows nothing else
    }
    if let Value::Object(data) = data {
        for (key, text) in string_data {
            if let Value::String(text) = text {
                data.insert(key, Value::String(SECRET_BASE64.encode(text)));
            }
        }
    }
}

fn is_empty_namespace(namespace: &Value) -> bool {
    namespace.is_null() || namespace.as_str() == Some("")
}

/// The warning for a cluster-scoped object written with a namespace: the API server clears it
/// without a word (`rest.BeforeCreate`), and so does [`normalize`]; saying so costs nothing.
fn ignored_namespace(value: &Value, info: &KindInfo) -> Option<Problem> {
    let namespace = value["metadata"]["namespace"].as_str().filter(|ns| !ns.is_empty())?;
    (!info.namespaced).then(|| {
        Problem::at(
            "/metadata/namespace",
            format!(
                "{} is cluster-scoped: its namespace {namespace:?} is ignored, as the API server ignores it; \
                 remove metadata.namespace",
                info.kind
            ),
        )
    })
}

/// Defaults the namespace and returns the key. Runs on an object that passed its schema and the
/// metadata checks.
fn normalize(value: &mut Value, info: &KindInfo, default_namespace: &str) -> Result<ObjectKey, Vec<Problem>> {
    let Some(metadata) = value.get_mut("metadata").and_then(Value::as_object_mut) else {
        return Err(vec![Problem::whole("metadata is missing")]);
    };
    if !info.namespaced || metadata.get("namespace").is_some_and(is_empty_namespace) {
        metadata.remove("namespace");
    }
    if info.namespaced && !metadata.contains_key("namespace") {
        metadata.insert("namespace".into(), Value::String(default_namespace.to_owned()));
    }
    let namespace = metadata.get("namespace").and_then(Value::as_str).unwrap_or("").to_owned();
    let Some(name) = metadata.get("name").and_then(Value::as_str) else {
        return Err(vec![Problem::at("/metadata", "\"name\" is a required property")]);
    };
    let key = ObjectKey::new(info.group_kind(), namespace, name);
    if info.kind == "Secret"
        && let Some(object) = value.as_object_mut()
    {
        merge_string_data(object);
    }
    if (info.api_version.as_str(), info.kind.as_str()) == ("autoscaling/v1", "HorizontalPodAutoscaler") {
        autoscaling::to_v2(value);
    }
    Ok(key)
}

/// The syntaxes of Kubernetes names, with Kubernetes' own explanations.
#[derive(Clone, Copy)]
enum DnsName {
    /// RFC 1123 subdomain: most object names.
    Subdomain,
    /// RFC 1123 label: namespaces.
    Label,
    /// RFC 1035 label: Service names.
    Rfc1035Label,
    /// A URL path segment: RBAC names, which Kubernetes lets hold ':' (`system:metrics-server`).
    PathSegment,
}

impl DnsName {
    fn check(self, name: &str) -> Result<(), String> {
        let (max, valid, rule) = match self {
            DnsName::Subdomain => (
                253,
                name.split('.').all(is_label),
                "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', \
                 and must start and end with an alphanumeric character (e.g. 'example.com')",
            ),
            DnsName::Label => (
                63,
                is_label(name),
                "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', \
                 and must start and end with an alphanumeric character (e.g. 'my-name', or '123-abc')",
            ),
            DnsName::Rfc1035Label => (
                63,
                is_label(name) && name.starts_with(|c: char| c.is_ascii_lowercase()),
                "a DNS-1035 label must consist of lower case alphanumeric characters or '-', \
                 start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name', or 'abc-123')",
            ),
            DnsName::PathSegment => (
                usize::MAX,
                name != "." && name != ".." && !name.contains(['/', '%']),
                "may not be '.' or '..' and may not contain '/' or '%'",
            ),
        };
        if name.len() > max {
            Err(format!("must be no more than {max} characters"))
        } else if valid {
            Ok(())
        } else {
            Err(rule.to_owned())
        }
    }
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`
fn is_label(s: &str) -> bool {
    let alnum = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    s.starts_with(alnum) && s.ends_with(alnum) && s.chars().all(|c| alnum(c) || c == '-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn t10_only_the_metrics_api_service_is_accepted() {
        let service = |name: &str, group: &str| {
            json!({"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService", "metadata": {"name": name},
                   "spec": {"group": group, "version": "v1beta1", "service": {"name": "metrics-server", "namespace": "kube-system"}}})
        };
        assert!(api_service_problems(&service("v1beta1.metrics.k8s.io", "metrics.k8s.io")).is_empty());
        let refused = api_service_problems(&service("v1beta1.custom.metrics.k8s.io", "custom.metrics.k8s.io"));
        assert_eq!(refused.len(), 1);
        assert!(refused[0].message.starts_with("only the APIService v1beta1.metrics.k8s.io"), "{}", refused[0].message);
    }

    use crate::{Limits, ManifestFile, load};
    use serde_json::json;
    use std::sync::LazyLock;

    static VALIDATOR: LazyLock<Validator> = LazyLock::new(Validator::new);

    fn file(path: &str, content: &str) -> ManifestFile {
        ManifestFile::new(path, content.as_bytes().to_vec())
    }

    fn check(files: &[(&str, &str)]) -> Result<Vec<Manifest>, Vec<String>> {
        let files: Vec<_> = files.iter().map(|(path, content)| file(path, content)).collect();
        load(&files, &VALIDATOR, "default", &Limits::default()).map_err(|e| e.iter().map(ToString::to_string).collect())
    }

    fn errors(files: &[(&str, &str)]) -> Vec<String> {
        match check(files) {
            Ok(manifests) => panic!("valid: {manifests:?}"),
            Err(errors) => errors,
        }
    }

    const DEMO_DEPLOYMENT: &str = "\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 2
  selector:
    matchLabels:
      app: web
  template:
    metadata:
      labels:
        app: web
    spec:
      containers:
        - name: web
          image: gitplane.local/httpd:1
          ports:
            - containerPort: 80
          resources:
            requests:
              cpu: 100m
              memory: 32Mi
";

    const DEMO_SERVICE: &str = "\
apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  selector:
    app: web
  ports:
    - port: 80
      targetPort: 80
";

    #[test]
    fn t10_validator_is_shared() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<Validator>();
        assert_eq!(VALIDATOR.kinds.len(), kinds::accepted().len());
    }

    #[test]
    fn t10_the_demo_validates() {
        let manifests = check(&[("deploy.yaml", DEMO_DEPLOYMENT), ("service.yaml", DEMO_SERVICE)]).unwrap();
        let keys: Vec<_> = manifests.iter().map(|m| m.key.to_string()).collect();
        assert_eq!(keys, ["Deployment.apps default/web", "Service default/web"]);
        assert_eq!(manifests[0].value["metadata"], json!({"name": "web", "namespace": "default"}));
        assert_eq!(manifests[0].value["spec"]["replicas"], json!(2));
        assert_eq!((manifests[1].file.as_str(), manifests[1].line), ("service.yaml", 1));
    }

    #[test]
    fn t10_messages_as_users_see_them() {
        let deployment = |spec: &str| {
            format!(
                "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\nspec:\n  selector: {{matchLabels: {{app: web}}}}\n{spec}\
                 \n  template:\n    metadata: {{labels: {{app: web}}}}\n    spec:\n      containers: [{{name: web, image: httpd}}]\n"
            )
        };
        let cases: Vec<(String, &[&str])> = vec![
            (
                deployment("  replicas: \"two\""),
                &[r#"deploy.yaml:7: Deployment web: /spec/replicas: "two" is not of type "integer""#],
            ),
            (
                deployment("  replicass: 2"),
                &[r#"deploy.yaml:7: Deployment web: /spec: unknown field "replicass" (did you mean "replicas"?)"#],
            ),
            (
                "apiVersion: v1\nkind: Foo\nmetadata: {name: web}\n".into(),
                &["deploy.yaml:2: Foo web: /kind: kind Foo (apiVersion v1) is not accepted; accepted kinds: \
                   Namespace (v1), ConfigMap (v1), Secret (v1), ServiceAccount (v1), Pod (v1), Service (v1), Endpoints (v1), LimitRange (v1), ResourceQuota (v1), ReplicaSet (apps/v1), Deployment (apps/v1), StatefulSet (apps/v1), \
                   DaemonSet (apps/v1), ReplicationController (v1), Job (batch/v1), CronJob (batch/v1), \
                   HorizontalPodAutoscaler (autoscaling/v2), HorizontalPodAutoscaler (autoscaling/v1), Ingress (networking.k8s.io/v1), \
                   IngressClass (networking.k8s.io/v1), NetworkPolicy (networking.k8s.io/v1), PodDisruptionBudget (policy/v1), \
                   Role (rbac.authorization.k8s.io/v1), ClusterRole (rbac.authorization.k8s.io/v1), RoleBinding (rbac.authorization.k8s.io/v1), \
                   ClusterRoleBinding (rbac.authorization.k8s.io/v1), \
                   PersistentVolumeClaim (v1), PersistentVolume (v1), StorageClass (storage.k8s.io/v1), \
                   APIService (apiregistration.k8s.io/v1), \
                   ValidatingWebhookConfiguration (admissionregistration.k8s.io/v1), \
                   MutatingWebhookConfiguration (admissionregistration.k8s.io/v1), Application (gitplane.io/v1)"],
            ),
            (
                "apiVersion: policy/v1beta1\nkind: PodDisruptionBudget\nmetadata: {name: web}\n".into(),
                &[
                    "deploy.yaml:1: PodDisruptionBudget web: /apiVersion: no matches for kind \"PodDisruptionBudget\" in \
                   version \"policy/v1beta1\"; use policy/v1 (policy/v1beta1 PodDisruptionBudget was removed in Kubernetes 1.25)",
                ],
            ),
            (
                "apiVersion: extensions/v1beta1\nkind: Deployment\nmetadata: {name: web}\n".into(),
                &["deploy.yaml:1: Deployment web: /apiVersion: no matches for kind \"Deployment\" in version \
                   \"extensions/v1beta1\"; use apps/v1 (extensions/v1beta1 Deployment was removed in Kubernetes 1.16)"],
            ),
            (
                "apiVersion: apps/v1beta3\nkind: Deployment\nmetadata: {name: web}\n".into(),
                &["deploy.yaml:1: Deployment web: /apiVersion: Deployment is accepted as apiVersion apps/v1, \
                   not apps/v1beta3: set apiVersion: apps/v1"],
            ),
            (
                "# no kind\nmetadata: {name: web}\n".into(),
                &[
                    "deploy.yaml:2: apiVersion is missing: every object needs apiVersion and kind, e.g. apiVersion: apps/v1 and kind: Deployment",
                    "deploy.yaml:2: kind is missing: every object needs apiVersion and kind, e.g. apiVersion: apps/v1 and kind: Deployment",
                ],
            ),
            ("apiVersion: v1\nkind: 7\n".into(), &["deploy.yaml:2: /kind: 7 is not a valid kind: write a string"]),
            (
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: kube-dns\n  namespace: kube-system\ndata:\n  \
                 upstreamNameservers: '[\"192.0.2.1\"]'\n  stubDomains: '{\"acme.local\": \"10.0.0.53\"}'\n"
                    .into(),
                &["deploy.yaml:8: ConfigMap kube-dns: /data/stubDomains: kube-system/kube-dns \
                   data.stubDomains: invalid type: string \"10.0.0.53\", expected a sequence at line 1 column 26: the \
                   node agents would refuse it and keep forwarding as before; see the README's \"Cluster DNS\" for \
                   the syntax"],
            ),
            (
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  labels: {app: web}\n".into(),
                &[r#"deploy.yaml:3: ConfigMap: /metadata: "name" is a required property"#],
            ),
            (
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: Web_1\n".into(),
                &["deploy.yaml:4: ConfigMap Web_1: /metadata/name: \"Web_1\" is not a valid ConfigMap name: \
                   a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', \
                   and must start and end with an alphanumeric character (e.g. 'example.com')"],
            ),
            (
                "apiVersion: v1\nkind: Service\nmetadata:\n  name: 1web\n  namespace: Prod\n".into(),
                &[
                    "deploy.yaml:4: Service 1web: /metadata/name: \"1web\" is not a valid Service name: a DNS-1035 label \
                     must consist of lower case alphanumeric characters or '-', start with an alphabetic character, \
                     and end with an alphanumeric character (e.g. 'my-name', or 'abc-123')",
                    "deploy.yaml:5: Service 1web: /metadata/namespace: \"Prod\" is not a valid namespace: a lowercase \
                     RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end \
                     with an alphanumeric character (e.g. 'my-name', or '123-abc')",
                ],
            ),
            (
                "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata:\n  name: a/b\n\
                 roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: view}\n"
                    .into(),
                &["deploy.yaml:4: ClusterRoleBinding a/b: /metadata/name: \"a/b\" is not a valid ClusterRoleBinding \
                   name: may not be '.' or '..' and may not contain '/' or '%'"],
            ),
            (
                format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {}\n", "a".repeat(64)),
                &["deploy.yaml:4: Namespace aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa: \
                   /metadata/name: \"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\" \
                   is not a valid Namespace name: must be no more than 63 characters"],
            ),
            (
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n  uid: 1b4e28ba\n  resourceVersion: \"42\"\n"
                    .into(),
                &[
                    "deploy.yaml:5: ConfigMap c: /metadata/uid: remove it: the server manages it",
                    "deploy.yaml:6: ConfigMap c: /metadata/resourceVersion: remove it: the server manages it",
                ],
            ),
            (
                "apiVersion: v1\nkind: Service\nmetadata: {name: db}\nspec:\n  selector: {app: db}\n  ports: [{port: 5432}]\n---\n\
                 apiVersion: v1\nkind: Endpoints\nmetadata: {name: db}\nsubsets:\n- addresses: [{ip: 192.0.2.10}]\n  ports: [{port: 5432}]\n"
                    .into(),
                &[
                    "deploy.yaml:11 (document 2): Endpoints db: /subsets: Service db has a selector, so its Endpoints are the selected Pods' \
                     (Kubernetes' endpoints controller overwrites these addresses): remove this Endpoints, or the Service's \
                     selector to route to these addresses",
                ],
            ),
            (
                "- apiVersion: v1\n  kind: ConfigMap\n".into(),
                &[
                    "deploy.yaml:1: the document is a list, not an object: write each object as its own YAML document, separated by ---",
                ],
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(errors(&[("deploy.yaml", &text)]), expected, "{text}");
        }
    }

    /// The API server clears a cluster-scoped object's namespace (`rest.BeforeCreate`): so does
    /// gitplane, saying so.
    #[test]
    fn t10_cluster_scoped_objects_lose_their_namespace_with_a_warning() {
        let cases = [
            (
                "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: prod\n  namespace: default\n",
                "Namespace prod",
                &["deploy.yaml:5: Namespace prod: /metadata/namespace: Namespace is cluster-scoped: its namespace \
                   \"default\" is ignored, as the API server ignores it; remove metadata.namespace"][..],
            ),
            (
                "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata:\n  name: reader\n  \
                 labels: {a: b}\n  namespace: kubernetes-dashboard\nrules: []\n",
                "ClusterRole.rbac.authorization.k8s.io reader",
                &["deploy.yaml:6: ClusterRole reader: /metadata/namespace: ClusterRole is cluster-scoped: its \
                   namespace \"kubernetes-dashboard\" is ignored, as the API server ignores it; remove \
                   metadata.namespace"],
            ),
            ("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: prod\n  namespace: \"\"\n", "Namespace prod", &[]),
            ("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n  namespace: prod\n", "ConfigMap prod/c", &[]),
        ];
        for (yaml, key, warnings) in cases {
            let manifests = check(&[("deploy.yaml", yaml)]).unwrap_or_else(|e| panic!("{yaml}: {e:?}"));
            let m = &manifests[0];
            assert_eq!(m.key.to_string(), key);
            let namespace = m.value["metadata"].get("namespace");
            assert_eq!(namespace.is_some(), key.contains('/'), "{:?}", m.value);
            let got: Vec<String> = m.warnings.iter().map(ToString::to_string).collect();
            assert_eq!(got, warnings);
        }
    }

    /// Webhook configurations are accepted as the API server accepts them, each with a warning
    /// that gitplane does not call it; their schema and the API server's rules still refuse.
    #[test]
    fn t10_webhook_configurations_are_accepted_with_a_warning_and_not_called() {
        let configuration = |kind: &str, webhooks: &str| {
            format!(
                "apiVersion: admissionregistration.k8s.io/v1\nkind: {kind}\nmetadata:\n  name: hooks\nwebhooks:\n{webhooks}"
            )
        };
        let service = "- name: validate.nginx.ingress.kubernetes.io\n  admissionReviewVersions: [v1]\n  sideEffects: None\n  \
                       clientConfig:\n    service: {name: admission, namespace: ingress-nginx, port: 443}\n";
        let url = "- name: mutate.example.com\n  admissionReviewVersions: [v1]\n  sideEffects: None\n  \
                   reinvocationPolicy: IfNeeded\n  clientConfig: {url: \"https://hooks.example.com/mutate\"}\n";
        let not_called = "stored but not called: gitplane calls no admission webhooks: objects its rules match are \
                          checked by gitplane's schemas and built-in admission only; the webhook's Service still runs";
        // The document, then its warnings or its errors.
        type Outcome = Result<Vec<String>, Vec<String>>;
        let cases: Vec<(String, Outcome)> = vec![
            (
                configuration("ValidatingWebhookConfiguration", service),
                Ok(vec![format!(
                    "h.yaml:5: ValidatingWebhookConfiguration hooks: /webhooks: {not_called} \
                     (webhook validate.nginx.ingress.kubernetes.io: Service ingress-nginx/admission)"
                )]),
            ),
            (
                configuration("MutatingWebhookConfiguration", url),
                Ok(vec![format!(
                    "h.yaml:5: MutatingWebhookConfiguration hooks: /webhooks: {not_called} \
                     (webhook mutate.example.com: https://hooks.example.com/mutate)"
                )]),
            ),
            // No webhook, nothing left uncalled.
            (configuration("ValidatingWebhookConfiguration", "  []\n"), Ok(vec![])),
            (
                configuration("ValidatingWebhookConfiguration", &format!("{service}  timeoutSeconds: ten\n")),
                Err(vec!["h.yaml:11: ValidatingWebhookConfiguration hooks: /webhooks/0/timeoutSeconds: \"ten\" is not of type \"integer\"".to_owned()]),
            ),
            (
                configuration("MutatingWebhookConfiguration", &url.replace("sideEffects", "sideEffect")),
                Err(vec![
                    "h.yaml:6: MutatingWebhookConfiguration hooks: /webhooks/0: \"sideEffects\" is a required property"
                        .to_owned(),
                    "h.yaml:8: MutatingWebhookConfiguration hooks: /webhooks/0: unknown field \"sideEffect\" (did you \
                     mean \"sideEffects\"?)"
                        .to_owned(),
                ]),
            ),
            (
                configuration(
                    "ValidatingWebhookConfiguration",
                    &format!("{service}  timeoutSeconds: 60\n  failurePolicy: Retry\n{service}")
                        .replace("clientConfig:\n", "clientConfig:\n    url: https://a.example.com\n"),
                ),
                Err(vec![
                    "h.yaml:9: ValidatingWebhookConfiguration hooks: /webhooks/0/clientConfig: exactly one of url or \
                     service is required"
                        .to_owned(),
                    "h.yaml:12: ValidatingWebhookConfiguration hooks: /webhooks/0/timeoutSeconds: the timeout value must \
                     be between 1 and 30 seconds"
                        .to_owned(),
                    "h.yaml:13: ValidatingWebhookConfiguration hooks: /webhooks/0/failurePolicy: Unsupported value: \
                     \"Retry\": supported values: \"Ignore\", \"Fail\""
                        .to_owned(),
                    "h.yaml:14: ValidatingWebhookConfiguration hooks: /webhooks/1/name: Duplicate value: \
                     \"validate.nginx.ingress.kubernetes.io\""
                        .to_owned(),
                    "h.yaml:17: ValidatingWebhookConfiguration hooks: /webhooks/1/clientConfig: exactly one of url or \
                     service is required"
                        .to_owned(),
                ]),
            ),
            (
                configuration(
                    "MutatingWebhookConfiguration",
                    "- name: hook\n  admissionReviewVersions: [v2]\n  sideEffects: Some\n  reinvocationPolicy: Always\n  \
                     clientConfig: {service: {name: s, namespace: n, port: 0}}\n",
                ),
                Err(vec![
                    "h.yaml:6: MutatingWebhookConfiguration hooks: /webhooks/0/name: \"hook\" is not a fully qualified \
                     webhook name: use a domain with at least three segments, e.g. validate.example.com"
                        .to_owned(),
                    "h.yaml:7: MutatingWebhookConfiguration hooks: /webhooks/0/admissionReviewVersions: must include at \
                     least one of v1, v1beta1: add v1"
                        .to_owned(),
                    "h.yaml:8: MutatingWebhookConfiguration hooks: /webhooks/0/sideEffects: Unsupported value: \"Some\": \
                     supported values: \"None\", \"NoneOnDryRun\""
                        .to_owned(),
                    "h.yaml:9: MutatingWebhookConfiguration hooks: /webhooks/0/reinvocationPolicy: Unsupported value: \
                     \"Always\": supported values: \"Never\", \"IfNeeded\""
                        .to_owned(),
                    "h.yaml:10: MutatingWebhookConfiguration hooks: /webhooks/0/clientConfig/service/port: must be \
                     between 1 and 65535"
                        .to_owned(),
                ]),
            ),
        ];
        for (yaml, expected) in cases {
            let got = check(&[("h.yaml", &yaml)]).map(|manifests| {
                assert!(manifests[0].warnings.iter().all(|w| w.reason == "WebhookNotCalled"));
                assert!(
                    manifests[0].key.to_string().contains("WebhookConfiguration.admissionregistration.k8s.io hooks")
                );
                manifests[0].warnings.iter().map(ToString::to_string).collect::<Vec<_>>()
            });
            assert_eq!(got, expected, "{yaml}");
        }
    }

    /// Volume sources the nodes cannot mount are accepted with a warning each, as the API server
    /// accepts them and the kubelet fails at mount; their fields are still checked.
    #[test]
    fn t10_volumes_the_nodes_cannot_mount_are_accepted_with_a_warning() {
        let pod = |volumes: &str| {
            format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: p}}\nspec:\n  containers: [{{name: c, image: i}}]\n  \
                 volumes:\n{volumes}"
            )
        };
        let instead = "the Pod will not start (FailedMount); use a persistentVolumeClaim of the default local-path \
                       StorageClass, or a hostPath volume";
        let cases = [
            (
                pod("  - {name: a, nfs: {server: s, path: /x}}\n  - {name: b, emptyDir: {}}\n"),
                vec![format!(
                    "v.yaml:7: Pod p: /spec/volumes/0/nfs: gitplane's nodes cannot mount an nfs volume: {instead}"
                )],
            ),
            (
                pod("  - {name: a, awsElasticBlockStore: {volumeID: v, fsType: ext4}}\n  - {name: b, csi: {driver: d}}\n"),
                vec![
                    format!(
                        "v.yaml:7: Pod p: /spec/volumes/0/awsElasticBlockStore: gitplane's nodes cannot mount an \
                         awsElasticBlockStore volume: {instead}"
                    ),
                    format!("v.yaml:8: Pod p: /spec/volumes/1/csi: gitplane's nodes cannot mount a csi volume: {instead}"),
                ],
            ),
            (
                "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\nspec:\n  selector: {matchLabels: {a: b}}\n  \
                 template:\n    metadata: {labels: {a: b}}\n    spec:\n      containers: [{name: c, image: i}]\n      \
                 volumes: [{name: g, glusterfs: {endpoints: e, path: p}}]\n"
                    .to_owned(),
                vec![format!(
                    "v.yaml:10: Deployment d: /spec/template/spec/volumes/0/glusterfs: gitplane's nodes cannot mount a \
                     glusterfs volume: {instead}"
                )],
            ),
            (
                "apiVersion: v1\nkind: PersistentVolume\nmetadata: {name: pv}\nspec:\n  capacity: {storage: 1Gi}\n  \
                 accessModes: [ReadWriteMany]\n  rbd: {monitors: [m], image: i}\n"
                    .to_owned(),
                vec![
                    "v.yaml:7: PersistentVolume pv: /spec/rbd: gitplane's nodes cannot mount an rbd volume: a Pod using \
                     this volume will not start (FailedMount); use hostPath or local (a directory on the node), or a \
                     persistentVolumeClaim of the default local-path StorageClass"
                        .to_owned(),
                ],
            ),
            (pod("  - {name: a, hostPath: {path: /x}}\n"), vec![]),
        ];
        for (yaml, expected) in cases {
            let manifests = check(&[("v.yaml", &yaml)]).unwrap_or_else(|e| panic!("{yaml}: {e:?}"));
            let got: Vec<String> = manifests[0].warnings.iter().map(ToString::to_string).collect();
            assert_eq!(got, expected, "{yaml}");
            assert!(manifests[0].warnings.iter().all(|w| w.reason == "UnmountableVolume"));
        }
        // Their fields are the schema's as any other.
        let misspelt = pod("  - {name: a, rbd: {monitors: [m], image: i, imageformat: \"2\"}}\n");
        assert_eq!(
            errors(&[("v.yaml", &misspelt)]),
            ["v.yaml:7: Pod p: /spec/volumes/0/rbd: unknown field \"imageformat\""]
        );
    }

    /// resizePolicy and Pod-level requests are accepted; Pod-level limits, fields of a newer
    /// Kubernetes and image volumes get one message each, saying what to do instead.
    #[test]
    fn t10_resize_policy_pod_level_resources_and_newer_fields() {
        let container = "{name: c, image: i, resources: {requests: {cpu: 250m, memory: 64Mi}}}";
        #[rustfmt::skip]
        let cases: Vec<(String, Vec<String>)> = vec![
            ("containers: [{name: c, image: i, resizePolicy: [{resourceName: cpu, restartPolicy: NotRequired}, {resourceName: memory, restartPolicy: RestartContainer}]}]".into(), vec![]),
            (
                "containers: [{name: c, image: i, resizePolicy: [{resourceName: cpu, restartPolicy: Sometimes}, {resourceName: cpu, restartPolicy: NotRequired}, {resourceName: pods, restartPolicy: NotRequired}]}]".into(),
                vec![
                    "/spec/containers/0/resizePolicy/0/restartPolicy: \"Sometimes\" is not a resize restart policy: use NotRequired or RestartContainer".into(),
                    "/spec/containers/0/resizePolicy/1/resourceName: cpu has a resize policy already: keep one".into(),
                    "/spec/containers/0/resizePolicy/2/resourceName: \"pods\" cannot be resized: use cpu or memory".into(),
                ],
            ),
            (
                "initContainers: [{name: i, image: i, resizePolicy: [{resourceName: cpu, restartPolicy: NotRequired}]}]\n  containers: [{name: c, image: i}]".into(),
                vec!["/spec/initContainers/0/resizePolicy: resizePolicy is not allowed on an init container (only on containers and sidecars): remove it".into()],
            ),
            (format!("resources: {{requests: {{cpu: 500m, memory: 128Mi}}}}\n  containers: [{container}, {{name: d, image: i}}]"), vec![]),
            (
                format!("resources: {{requests: {{cpu: 400m}}}}\n  initContainers: [{{name: s, image: i, restartPolicy: Always, resources: {{requests: {{cpu: 200m}}}}}}]\n  containers: [{container}]"),
                vec!["/spec/resources/requests/cpu: the Pod's cpu request \"400m\" is less than its containers' 450m together: raise it, or lower theirs".into()],
            ),
            (
                format!("resources: {{limits: {{cpu: \"1\"}}, requests: {{nvidia.com/gpu: 1}}}}\n  containers: [{container}]"),
                vec![
                    "/spec/resources/limits: Pod-level limits are not supported by gitplane's node agent: containerd 1.6's CRI on the nodes enforces limits per container only; set limits on each container instead (Pod-level requests are supported)".into(),
                    "/spec/resources/requests/nvidia.com~1gpu: Pod-level resources take cpu and memory only: set nvidia.com/gpu on the containers instead".into(),
                ],
            ),
            (
                "containers: [{name: c, image: i}]\n  initContainers: [{name: w, image: i, restartPolicy: Always, restartPolicyRules: [{action: RestartAllContainers, exitCodes: {operator: In, values: [88]}}]}]".into(),
                vec!["/spec/initContainers/0: container restart rules (restartPolicyRules, Kubernetes 1.34) are not supported by gitplane: remove them; to start the Pod afresh when a container exits, let the exit fail the Pod (restartPolicy: Never) and run it from a Job or a Deployment, which makes a new Pod".into()],
            ),
            (
                "containers: [{name: c, image: i}]\n  volumes: [{name: cert, projected: {sources: [{podCertificate: {signerName: example.com/x, keyType: ED25519, credentialBundlePath: b.pem}}]}}]".into(),
                vec!["/spec/volumes/0/projected/sources/0: projected podCertificate sources (Pod certificates, Kubernetes 1.34) are not supported by gitplane: remove it; mount the certificate and key from a Secret of type kubernetes.io/tls instead".into()],
            ),
            (
                "containers: [{name: c, image: i}]\n  volumes: [{name: v, image: {reference: quay.io/crio/artifact:v2, pullPolicy: IfNotPresent}}]".into(),
                vec!["/spec/volumes/0/image: an image volume is not supported: the nodes' containerd (1.6) has no image volumes; copy the files out of the image into an emptyDir with an init container instead (image: the volume's reference, command: [cp, -a, <dir>/., /out], mounting the emptyDir at /out)".into()],
            ),
        ];
        for (spec, expected) in cases {
            let pod = format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: p}}\nspec:\n  {spec}\n");
            let got = match check(&[("pod.yaml", &pod)]) {
                Ok(_) => Vec::new(),
                // Without the `pod.yaml:N: Pod p: ` prefix: the lines are the other tests' concern.
                Err(errors) => errors.iter().map(|e| e.splitn(3, ": ").nth(2).unwrap_or(e).to_owned()).collect(),
            };
            assert_eq!(got, expected, "{pod}");
        }
    }

    #[test]
    fn t10_a_job_must_end() {
        let job = |policy: &str| {
            format!(
                "apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: migrate\nspec:\n  template:\n    spec:\n{policy}      \
                 containers:\n        - {{name: m, image: gitplane.local/busybox:1}}\n"
            )
        };
        assert!(check(&[("job.yaml", &job("      restartPolicy: Never\n"))]).is_ok());
        assert_eq!(
            errors(&[("job.yaml", &job("      restartPolicy: Always\n"))]),
            [
                r#"job.yaml:8: Job migrate: /spec/template/spec/restartPolicy: a Job's Pods must end: set restartPolicy to Never or OnFailure (it is "Always")"#
            ]
        );
        assert_eq!(errors(&[("job.yaml", &job(""))]).len(), 1, "unset means Always");
    }

    #[test]
    fn t10_argo_cd_hooks_may_be_named_by_generate_name_and_their_annotations_are_checked() {
        let job = |metadata: &str| {
            format!(
                "apiVersion: batch/v1\nkind: Job\nmetadata:\n{metadata}spec:\n  template:\n    spec:\n      \
                 restartPolicy: Never\n      containers:\n        - {{name: m, image: gitplane.local/busybox:1}}\n"
            )
        };
        let hook = job("  generateName: upgrade-sql-schema-\n  annotations:\n    argocd.argoproj.io/hook: PreSync\n");
        let manifests = check(&[("job.yaml", &hook)]).unwrap();
        assert_eq!(manifests[0].key.to_string(), "Job.batch default/upgrade-sql-schema-");
        assert!(manifests[0].value["metadata"].get("name").is_none(), "the sync names it");
        let cases = [
            (
                job("  generateName: migrate-\n"),
                vec![
                    r#"job.yaml:3: Job: /metadata: "name" is a required property"#,
                    "job.yaml:4: Job: /metadata/generateName: generateName makes a new object at every sync, which only \
                     an Argo CD hook (argocd.argoproj.io/hook) may do: set metadata.name, or make the object a hook",
                ],
            ),
            (
                job("  name: m\n  annotations:\n    argocd.argoproj.io/sync-wave: soon\n"),
                vec![
                    r#"job.yaml:6: Job m: /metadata/annotations/argocd.argoproj.io~1sync-wave: "soon" is not a wave: write an integer, such as "-1" or "2""#,
                ],
            ),
            (
                job(
                    "  name: m\n  annotations:\n    argocd.argoproj.io/hook: Sync\n    argocd.argoproj.io/hook-delete-policy: Never\n",
                ),
                vec![
                    r#"job.yaml:7: Job m: /metadata/annotations/argocd.argoproj.io~1hook-delete-policy: "Never" is not a delete policy: use HookSucceeded, HookFailed or BeforeHookCreation"#,
                ],
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(errors(&[("job.yaml", &text)]), expected, "{text}");
        }
    }

    /// What the agent runs since: hostAliases, typed hostPath volumes, HTTPS probes, requests and
    /// limits of ephemeral storage (evicted over them, as emptyDirs over their sizeLimit) and
    /// extended resources.
    #[test]
    fn host_aliases_host_path_types_and_https_probes_are_accepted() {
        let pod = |volume_type: &str| {
            format!(
                "\
apiVersion: v1
kind: Pod
metadata: {{name: p}}
spec:
  hostAliases: [{{ip: 10.1.2.3, hostnames: [foo.local]}}]
  volumes: [{{name: run, hostPath: {{path: /run/app, type: {volume_type}}}}}, {{name: cache, emptyDir: {{sizeLimit: 10Mi}}}}]
  containers:
    - name: web
      image: i
      readinessProbe: {{httpGet: {{port: 443, scheme: HTTPS}}}}
      volumeMounts: [{{name: run, mountPath: /run/app}}]
      resources:
        requests: {{ephemeral-storage: 1Gi, nvidia.com/gpu: 1}}
        limits: {{ephemeral-storage: 2Gi, nvidia.com/gpu: 1}}
"
            )
        };
        for volume_type in
            ["DirectoryOrCreate", "Directory", "FileOrCreate", "File", "Socket", "CharDevice", "BlockDevice", "\"\""]
        {
            assert!(check(&[("pod.yaml", &pod(volume_type))]).is_ok(), "{volume_type}");
        }
        assert_eq!(
            errors(&[("pod.yaml", &pod("Pipe"))]),
            ["pod.yaml:6: Pod p: /spec/volumes/0/hostPath/type: \"Pipe\" is not a hostPath type: use one of \
              DirectoryOrCreate, Directory, FileOrCreate, File, Socket, CharDevice, BlockDevice, or \"\" for no check"]
        );
        let extended = "\
apiVersion: v1
kind: Pod
metadata: {name: p}
spec:
  containers:
    - name: web
      image: i
      resources:
        requests: {example.com/foo: 1, nvidia.com/gpu: 500m, hugepages-2Mi: 1Mi}
        limits: {example.com/foo: 2}
";
        let at = "pod.yaml:{}: Pod p: /spec/containers/0/resources/";
        let mut got = errors(&[("pod.yaml", extended)]);
        got.sort();
        assert_eq!(
            got,
            [
                format!(
                    "{}requests/example.com~1foo: example.com/foo cannot be overcommitted: set limits.example.com/foo to the same count as the request",
                    at.replace("{}", "9")
                ),
                format!(
                    "{}requests/hugepages-2Mi: resource hugepages-2Mi is not supported by gitplane's node agent yet (it supports cpu, memory, ephemeral-storage and extended resources such as example.com/foo)",
                    at.replace("{}", "9")
                ),
                format!(
                    "{}requests/nvidia.com~1gpu: \"500m\" is not a whole number of nvidia.com/gpu: use a whole count",
                    at.replace("{}", "9")
                ),
            ]
        );
    }

    #[test]
    fn t10_cron_jobs_are_validated_as_kube_apiserver_does() {
        let cron_job = |name: &str, spec: &str, policy: &str| {
            format!(
                "apiVersion: batch/v1\nkind: CronJob\nmetadata:\n  name: {name}\nspec:\n{spec}  jobTemplate:\n    spec:\n      template:\n        \
                 spec:\n          restartPolicy: {policy}\n          containers: [{{name: m, image: gitplane.local/busybox:1}}]\n"
            )
        };
        let ok = "  schedule: \"*/5 * * * *\"\n  timeZone: Europe/Berlin\n";
        assert!(check(&[("cron.yaml", &cron_job("hello", ok, "OnFailure"))]).is_ok());
        assert!(check(&[("cron.yaml", &cron_job("hello", "  schedule: \"@hourly\"\n", "Never"))]).is_ok());
        let long = "a".repeat(53);
        #[rustfmt::skip]
        let cases: Vec<(String, &str)> = vec![
            (cron_job("hello", "  schedule: \"61 * * * *\"\n", "Never"),
             r#"cron.yaml:6: CronJob hello: /spec/schedule: invalid schedule "61 * * * *": end of range (61) above maximum (59): 61 (minute)"#),
            (cron_job("hello", "  schedule: \"@fortnightly\"\n", "Never"),
             r#"cron.yaml:6: CronJob hello: /spec/schedule: invalid schedule "@fortnightly": unrecognized descriptor: @fortnightly"#),
            (cron_job("hello", "  schedule: \"* * * *\"\n", "Never"),
             r#"cron.yaml:6: CronJob hello: /spec/schedule: invalid schedule "* * * *": expected exactly 5 fields, found 4: * * * *"#),
            (cron_job("hello", "  schedule: \"@daily\"\n  timeZone: Mars/Olympus\n", "Never"),
             r#"cron.yaml:7: CronJob hello: /spec/timeZone: unknown time zone "Mars/Olympus": use an IANA name such as Europe/Berlin or Etc/UTC"#),
            (cron_job("hello", "  schedule: \"@daily\"\n  concurrencyPolicy: Sometimes\n", "Never"),
             r#"cron.yaml:7: CronJob hello: /spec/concurrencyPolicy: unsupported value "Sometimes": use "Allow", "Forbid" or "Replace""#),
            (cron_job("hello", "  schedule: \"@daily\"\n  startingDeadlineSeconds: -1\n", "Never"),
             "cron.yaml:7: CronJob hello: /spec/startingDeadlineSeconds: must be greater than or equal to 0"),
            (cron_job("hello", "  schedule: \"@daily\"\n", "Always"),
             r#"cron.yaml:11: CronJob hello: /spec/jobTemplate/spec/template/spec/restartPolicy: a Job's Pods must end: set restartPolicy to Never or OnFailure (it is "Always")"#),
            (cron_job(&long, "  schedule: \"@daily\"\n", "Never"),
             "a CronJob's name must be no more than 52 characters (it has 53): shorten it"),
        ];
        for (text, want) in cases {
            let errors = errors(&[("cron.yaml", &text)]);
            assert!(errors.len() == 1 && errors[0].ends_with(want), "{errors:?}\nwant {want}");
        }
    }

    #[test]
    fn t10_horizontal_pod_autoscalers_are_read_as_autoscaling_v2() {
        let v1 = "apiVersion: autoscaling/v1\nkind: HorizontalPodAutoscaler\nmetadata:\n  name: php-apache\nspec:\n  \
                  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: php-apache}\n  minReplicas: 1\n  maxReplicas: 10\n  \
                  targetCPUUtilizationPercentage: 50\n";
        let manifests = check(&[("hpa.yaml", v1)]).unwrap();
        let value = &manifests[0].value;
        assert_eq!(value["apiVersion"], "autoscaling/v2");
        assert_eq!(manifests[0].key.kind, "HorizontalPodAutoscaler.autoscaling");
        assert_eq!(
            value["spec"]["metrics"],
            serde_json::json!([{"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 50}}}])
        );
        assert!(value["spec"].get("targetCPUUtilizationPercentage").is_none());
        let v2 = |spec: &str| {
            format!(
                "apiVersion: autoscaling/v2\nkind: HorizontalPodAutoscaler\nmetadata:\n  name: web\nspec:\n  \
                 scaleTargetRef: {{apiVersion: apps/v1, kind: Deployment, name: web}}\n{spec}"
            )
        };
        let ok = "  maxReplicas: 5\n  metrics:\n  - type: Resource\n    resource: {name: memory, target: {type: AverageValue, averageValue: 64Mi}}\n";
        assert!(check(&[("hpa.yaml", &v2(ok))]).is_ok());
        #[rustfmt::skip]
        let cases: Vec<(String, &str)> = vec![
            (v2("  minReplicas: 3\n  maxReplicas: 2\n"),
             "hpa.yaml:8: HorizontalPodAutoscaler web: /spec/maxReplicas: must be greater than or equal to minReplicas (3) and to 1 (it is 2)"),
            (v2("  maxReplicas: 5\n  metrics:\n  - type: External\n    external: {metric: {name: queue}, target: {type: Value}}\n"),
             "hpa.yaml:10: HorizontalPodAutoscaler web: /spec/metrics/0/external/target/value: a Value target needs value (a quantity, e.g. 100 or 1k)"),
            (v2("  maxReplicas: 5\n  metrics:\n  - type: Pods\n    pods: {metric: {name: rps}, target: {type: Value, value: 1}}\n"),
             "hpa.yaml:10: HorizontalPodAutoscaler web: /spec/metrics/0/pods/target/type: unsupported value \"Value\" for a Pods metric: use \"AverageValue\""),
            (v2("  maxReplicas: 5\n  metrics:\n  - type: Object\n"),
             "hpa.yaml:9: HorizontalPodAutoscaler web: /spec/metrics/0/object: an Object metric must populate object"),
            (v2("  maxReplicas: 5\n  metrics:\n  - type: Resource\n    resource: {name: cpu, target: {type: Utilization}}\n"),
             "hpa.yaml:10: HorizontalPodAutoscaler web: /spec/metrics/0/resource/target/averageUtilization: a Utilization target needs averageUtilization greater than 0"),
            (v2("  maxReplicas: 5\n").replace("kind: Deployment", "kind: Job").replace("apps/v1", "batch/v1"),
             "hpa.yaml:6: HorizontalPodAutoscaler web: /spec/scaleTargetRef: Job (batch/v1) has no scale gitplane can set: target a Deployment, StatefulSet or ReplicaSet (apiVersion apps/v1)"),
        ];
        for (text, want) in cases {
            let errors = errors(&[("hpa.yaml", &text)]);
            assert_eq!(errors, [want], "{text}");
        }
        // Metrics of a custom or external metrics API are accepted with a warning each.
        let then_resource = "it scales on the Resource metrics alone, up but not down while this one cannot be read";
        let pods = "  - type: Pods\n    pods: {metric: {name: rps}, target: {type: AverageValue, averageValue: 1k}}\n";
        let external =
            "  - type: External\n    external: {metric: {name: queue}, target: {type: Value, value: \"30\"}}\n";
        let cpu =
            "  - type: Resource\n    resource: {name: cpu, target: {type: Utilization, averageUtilization: 50}}\n";
        let warned = |line: usize, i: usize, type_: &str, api: &str, reason: &str, then: &str| {
            format!(
                "hpa.yaml:{line}: HorizontalPodAutoscaler web: /spec/metrics/{i}/type: {type_} metrics need {api} \
                 metrics API, which gitplane does not serve: the HorizontalPodAutoscaler will report ScalingActive False \
                 ({reason}) and {then}; use type Resource (cpu or memory) to scale on usage"
            )
        };
        let cases = [
            (
                format!("{pods}{external}"),
                vec![
                    warned(9, 0, "Pods", "a custom", "FailedGetPodsMetric", "the replicas stay as they are"),
                    warned(
                        11,
                        1,
                        "External",
                        "an external",
                        "FailedGetExternalMetric",
                        "the replicas stay as they are",
                    ),
                ],
            ),
            (format!("{cpu}{pods}"), vec![warned(11, 1, "Pods", "a custom", "FailedGetPodsMetric", then_resource)]),
            (cpu.to_owned(), vec![]),
        ];
        for (metrics, expected) in cases {
            let text = v2(&format!("  maxReplicas: 5\n  metrics:\n{metrics}"));
            let manifests = check(&[("hpa.yaml", &text)]).unwrap_or_else(|e| panic!("{text}: {e:?}"));
            let got: Vec<String> = manifests[0].warnings.iter().map(ToString::to_string).collect();
            assert_eq!(got, expected, "{text}");
        }
    }

    #[test]
    fn t10_pod_fields_the_node_agent_cannot_run_are_refused() {
        let deployment = "\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      initContainers: [{name: init, image: busybox, restartPolicy: OnFailure}]
      volumes:
        - {name: scratch, emptyDir: {}}
        - name: settings
          configMap: {name: settings, defaultMode: 1000, items: [{key: a, path: ../a}]}
        - {name: tokens, projected: {sources: [{clusterTrustBundle: {signerName: example.com/x, path: b}}]}}
      containers:
        - name: web
          image: httpd
          env:
            - name: PASSWORD
              valueFrom:
                resourceFieldRef: {resource: limits.ephemeral-storage}
            - {name: NODE, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}
            - {name: LIMIT, valueFrom: {fieldRef: {fieldPath: status.phase}}}
          envFrom: [{configMapRef: {name: settings}}]
          livenessProbe: {httpGet: {port: 80}}
          resources: {limits: {cpu: lots, ephemeral-storage: 1Gi}}
          volumeMounts:
            - {name: scratch, mountPath: /tmp}
            - {name: data, mountPath: /data, subPath: ../etc}
";
        let not_yet = "is not supported by gitplane's node agent yet";
        let at = "deploy.yaml:{}: Deployment web: /spec/template/spec";
        let expected = [
            (
                10,
                "/initContainers/0/restartPolicy".to_owned(),
                "restartPolicy \"OnFailure\" is not allowed on an init container: set Always (a sidecar) or remove it"
                    .to_owned(),
            ),
            (
                14,
                "/volumes/1/configMap/defaultMode".into(),
                "mode 1000 is out of range: write a value between 0 and 0777 (octal), e.g. 0644".into(),
            ),
            (
                14,
                "/volumes/1/configMap/items/0/path".into(),
                "path \"../a\" must not contain '..' nor start with '..': files stay inside their volume".into(),
            ),
            (
                15,
                "/volumes/2/projected/sources/0/clusterTrustBundle".into(),
                format!(
                    "a projected clusterTrustBundle source {not_yet} (it supports configMap, secret, downwardAPI, \
                     serviceAccountToken)"
                ),
            ),
            (
                22,
                "/containers/0/env/0/valueFrom/resourceFieldRef/resource".into(),
                format!(
                    "resource \"limits.ephemeral-storage\" {not_yet}: use one of limits.cpu, limits.memory, \
                     requests.cpu, requests.memory"
                ),
            ),
            (
                24,
                "/containers/0/env/2/valueFrom/fieldRef/fieldPath".into(),
                format!(
                    "fieldRef.fieldPath \"status.phase\" {not_yet}: use one of metadata.name, metadata.namespace, metadata.uid, spec.nodeName, spec.serviceAccountName, status.hostIP, status.hostIPs, status.podIP, status.podIPs, metadata.labels['<key>'], metadata.annotations['<key>']"
                ),
            ),
            (
                27,
                "/containers/0/resources/limits/cpu".into(),
                "\"lots\" is not a quantity: write e.g. 250m or 0.5 (cpu), 64Mi or 1G (memory)".into(),
            ),
            (
                30,
                "/containers/0/volumeMounts/1/name".into(),
                "\"data\" names no volume of the Pod: add it to spec.volumes, or fix the name".into(),
            ),
            (
                30,
                "/containers/0/volumeMounts/1/subPath".into(),
                "\"../etc\" must be a relative path inside the volume, without '..'".into(),
            ),
        ];
        let mut expected: Vec<String> = expected
            .into_iter()
            .map(|(line, path, message)| format!("{}{path}: {message}", at.replace("{}", &line.to_string())))
            .collect();
        let mut got = errors(&[("deploy.yaml", deployment)]);
        got.sort();
        expected.sort();
        assert_eq!(got, expected);

        // The same rules for bare Pods, ReplicaSets and Jobs, at their Pod spec.
        let pod = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers: [{name: c, image: i, lifecycle: {preStop: {httpGet: {port: 80}}}}]\n";
        assert_eq!(
            errors(&[("pod.yaml", pod)]),
            [format!(
                "pod.yaml:5: Pod p: /spec/containers/0/lifecycle/preStop/httpGet: a preStop httpGet hook {not_yet} (it supports exec)"
            )]
        );
        let job = "apiVersion: batch/v1\nkind: Job\nmetadata: {name: j}\nspec:\n  template:\n    spec:\n      restartPolicy: Never\n      enableServiceLinks: true\n      containers: [{name: c, image: i}]\n";
        assert_eq!(
            errors(&[("job.yaml", job)]),
            [format!(
                "job.yaml:8: Job j: /spec/template/spec/enableServiceLinks: enableServiceLinks (no Service variables are set) true {not_yet}: remove it, or set it to false"
            )]
        );
        // Seccomp and AppArmor profiles as the API server judges them; the node runs every type.
        let profiles = |pod_sc: &str, container_sc: &str| {
            format!(
                "apiVersion: apps/v1\nkind: ReplicaSet\nmetadata: {{name: r}}\nspec:\n  selector: {{matchLabels: {{a: b}}}}\n  template:\n    metadata: {{labels: {{a: b}}}}\n    spec:\n      securityContext: {pod_sc}\n      containers: [{{name: c, image: i, securityContext: {container_sc}}}]\n"
            )
        };
        let at = "rs.yaml:9: ReplicaSet r: /spec/template/spec";
        let cases = [
            (
                "{seccompProfile: {type: Localhost, localhostProfile: profiles/audit.json}}",
                "{appArmorProfile: {type: RuntimeDefault}}",
                vec![],
            ),
            (
                "{appArmorProfile: {type: Localhost, localhostProfile: k8s-deny-write}}",
                "{seccompProfile: {type: Unconfined}}",
                vec![],
            ),
            (
                "{seccompProfile: {type: Localhost, localhostProfile: ../../etc/x.json}}",
                "{}",
                vec![format!(
                    "{at}/securityContext/seccompProfile/localhostProfile: localhostProfile \"../../etc/x.json\" must not contain '..': the profile stays inside the node's seccomp profile directory"
                )],
            ),
            (
                "{seccompProfile: {type: Localhost}}",
                "{seccompProfile: {type: RuntimeDefault, localhostProfile: a.json}}",
                vec![
                    format!(
                        "{at}/securityContext/seccompProfile/localhostProfile: localhostProfile \"\" must be set with type Localhost"
                    ),
                    format!(
                        "rs.yaml:10: ReplicaSet r: /spec/template/spec/containers/0/securityContext/seccompProfile/localhostProfile: localhostProfile is for type Localhost only: remove it or set type: Localhost"
                    ),
                ],
            ),
            (
                "{appArmorProfile: {type: Enforcing}}",
                "{}",
                vec![format!(
                    "{at}/securityContext/appArmorProfile/type: appArmorProfile.type \"Enforcing\" is not one of RuntimeDefault, Unconfined, Localhost"
                )],
            ),
        ];
        for (pod_sc, container_sc, expected) in cases {
            let got = check(&[("rs.yaml", &profiles(pod_sc, container_sc))]).err().unwrap_or_default();
            assert_eq!(got, expected, "{pod_sc} {container_sc}");
        }
        let groups = "apiVersion: v1\nkind: Pod\nmetadata: {name: g}\nspec:\n  securityContext: {fsGroup: 2000, fsGroupChangePolicy: Sometimes, supplementalGroupsPolicy: Strict}\n  containers: [{name: c, image: i}]\n";
        assert_eq!(
            errors(&[("groups.yaml", groups)]),
            [
                format!(
                    "groups.yaml:5: Pod g: /spec/securityContext/fsGroupChangePolicy: securityContext.fsGroupChangePolicy \"Sometimes\" {not_yet}: remove it, or set it to \"Always\" or \"OnRootMismatch\""
                ),
                format!(
                    "groups.yaml:5: Pod g: /spec/securityContext/supplementalGroupsPolicy: securityContext.supplementalGroupsPolicy (containerd 1.6's CRI on the node always adds the groups the image's /etc/group lists) \"Strict\" {not_yet}: remove it, or set it to \"Merge\""
                ),
            ]
        );
    }

    #[test]
    fn t10_stateful_sets_as_the_api_server_judges_them() {
        let published = "apiVersion: apps/v1\nkind: StatefulSet\nmetadata:\n  name: web\nspec:\n  serviceName: \"nginx\"\n  \
                         replicas: 2\n  selector:\n    matchLabels:\n      app: nginx\n  template:\n    metadata:\n      labels:\n        \
                         app: nginx\n    spec:\n      containers:\n      - name: nginx\n        image: registry.k8s.io/nginx-slim:0.21\n        \
                         volumeMounts:\n        - name: www\n          mountPath: /usr/share/nginx/html\n  volumeClaimTemplates:\n  \
                         - metadata:\n      name: www\n    spec:\n      accessModes: [ \"ReadWriteOnce\" ]\n";
        assert!(check(&[("web.yaml", published)]).is_ok(), "a claim template is a volume of the Pods");
        let bad = "apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {name: db}\nspec:\n  podManagementPolicy: Random\n  \
                   updateStrategy: {type: RollingUpdate, rollingUpdate: {partition: -1}}\n  selector: {matchLabels: {a: b}}\n  \
                   template:\n    metadata: {labels: {a: b}}\n    spec:\n      restartPolicy: Never\n      subdomain: Db_0\n      \
                   containers: [{name: c, image: i}]\n";
        assert_eq!(
            errors(&[("db.yaml", bad)]),
            [
                "db.yaml:5: StatefulSet db: /spec/podManagementPolicy: \"Random\" is not one of OrderedReady, Parallel: use one of them",
                "db.yaml:6: StatefulSet db: /spec/updateStrategy/rollingUpdate/partition: must not be negative",
                "db.yaml:11: StatefulSet db: /spec/template/spec/restartPolicy: a StatefulSet's Pods run until deleted: set restartPolicy to Always (it is \"Never\")",
                "db.yaml:12: StatefulSet db: /spec/template/spec/subdomain: subdomain \"Db_0\" is not a DNS label: at most 63 lower case letters, digits or '-', starting and ending with a letter or digit, e.g. 'web-0'",
            ]
        );
    }

    #[test]
    fn t10_pod_fields_the_node_agent_runs_pass() {
        let pod = "\
apiVersion: v1
kind: Pod
metadata: {name: p}
spec:
  automountServiceAccountToken: false
  enableServiceLinks: false
  os: {name: linux}
  hostname: p1
  subdomain: db
  securityContext:
    runAsUser: 1000
    runAsNonRoot: true
    fsGroup: 2000
    fsGroupChangePolicy: OnRootMismatch
    supplementalGroups: [3000]
    supplementalGroupsPolicy: Merge
    sysctls: [{name: net.core.somaxconn, value: \"1024\"}]
  volumes:
    - {name: scratch, emptyDir: {}}
    - {name: etc, hostPath: {path: /etc/gp}}
    - {name: fast, emptyDir: {medium: Memory, sizeLimit: 64Mi}}
    - {name: conf, configMap: {name: app, defaultMode: 0o644, items: [{key: a, path: conf/a.ini, mode: 256}]}}
    - {name: tls, secret: {secretName: tls, optional: true}}
    - name: info
      downwardAPI:
        items:
          - {path: labels, fieldRef: {fieldPath: metadata.labels}}
          - {path: mem, resourceFieldRef: {containerName: c, resource: limits.memory, divisor: 1Mi}}
  containers:
    - name: c
      image: i
      command: [/bin/sh, -c, echo $(NAME)]
      envFrom: [{configMapRef: {name: app}, prefix: APP_}, {secretRef: {name: tls, optional: true}}]
      env:
        - {name: NAME, value: x}
        - {name: MODE, valueFrom: {configMapKeyRef: {name: app, key: mode, optional: true}}}
        - {name: PW, valueFrom: {secretKeyRef: {name: db, key: password}}}
        - {name: CPUS, valueFrom: {resourceFieldRef: {resource: limits.cpu, divisor: 1m}}}
        - {name: IP, valueFrom: {fieldRef: {fieldPath: status.podIP}}}
        - {name: APP, valueFrom: {fieldRef: {fieldPath: \"metadata.labels['app']\"}}}
      ports: [{name: http, containerPort: 80, hostPort: 8080}]
      resources: {requests: {cpu: 100m, memory: 32Mi}, limits: {cpu: 1, memory: 64Mi}}
      securityContext: {allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}, readOnlyRootFilesystem: true}
      terminationMessagePath: /dev/termination-log
      terminationMessagePolicy: File
      volumeMounts:
        - {name: scratch, mountPath: /tmp, subPath: a/b}
        - {name: etc, mountPath: /etc/gp, readOnly: true}
      startupProbe: {tcpSocket: {port: http}, failureThreshold: 30, periodSeconds: 1}
      livenessProbe: {exec: {command: [cat, /tmp/ok]}, terminationGracePeriodSeconds: 5, successThreshold: 1}
      readinessProbe:
        httpGet: {port: 80, path: /ready, scheme: HTTP, httpHeaders: [{name: X-Probe, value: yes}]}
        initialDelaySeconds: 0
        successThreshold: 2
    - name: d
      image: i
      livenessProbe: {grpc: {port: 9000, service: health}, periodSeconds: 0}
";
        assert!(check(&[("pod.yaml", pod)]).is_ok(), "{:?}", check(&[("pod.yaml", pod)]));
        assert!(check(&[("deploy.yaml", DEMO_DEPLOYMENT)]).is_ok());
    }

    #[test]
    fn t10_init_containers_exec_hooks_and_the_grace_period() {
        let pod = |spec: &str| format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: p}}\nspec:\n{spec}");
        let runs = pod("  terminationGracePeriodSeconds: 0
  initContainers:
    - {name: init, image: i, command: [sh, -c, 'true'], resources: {limits: {memory: 16Mi}}}
    - name: sidecar
      image: i
      restartPolicy: Always
      startupProbe: {exec: {command: ['true']}}
      readinessProbe: {tcpSocket: {port: 80}}
      lifecycle: {postStart: {exec: {command: ['true']}}, preStop: {exec: {command: [sleep, '1']}}}
  containers:
    - name: c
      image: i
      lifecycle: {postStart: {exec: {command: [sh, -c, 'true']}}, preStop: {exec: {command: [sleep, '1']}}}
");
        assert!(check(&[("pod.yaml", &runs)]).is_ok(), "{:?}", check(&[("pod.yaml", &runs)]));

        let refused = pod("  terminationGracePeriodSeconds: -5
  initContainers:
    - name: init
      image: i
      livenessProbe: {exec: {command: ['true']}}
      resources: {limits: {memory: lots}}
  containers:
    - name: c
      image: i
      lifecycle: {preStop: {httpGet: {port: 80}}, postStart: {sleep: {seconds: 1}}}
");
        let not_yet = "is not supported by gitplane's node agent yet";
        let mut got = errors(&[("pod.yaml", &refused)]);
        got.sort();
        let mut expected = [
            "pod.yaml:5: Pod p: /spec/terminationGracePeriodSeconds: -5 is negative: give the seconds a Pod may take to stop (0 or more; 30 if unset)".to_string(),
            "pod.yaml:9: Pod p: /spec/initContainers/0/livenessProbe: livenessProbe is not allowed in an init container: remove it".into(),
            "pod.yaml:10: Pod p: /spec/initContainers/0/resources/limits/memory: \"lots\" is not a quantity: write e.g. 250m or 0.5 (cpu), 64Mi or 1G (memory)".into(),
            format!("pod.yaml:14: Pod p: /spec/containers/0/lifecycle/postStart/sleep: a postStart sleep hook {not_yet} (it supports exec)"),
            format!("pod.yaml:14: Pod p: /spec/containers/0/lifecycle/preStop/httpGet: a preStop httpGet hook {not_yet} (it supports exec)"),
        ];
        expected.sort();
        assert_eq!(got, expected);
    }

    #[test]
    fn t10_probes_the_node_agent_cannot_run_are_refused() {
        let pod = "\
apiVersion: v1
kind: Pod
metadata: {name: p}
spec:
  containers:
    - name: web
      image: i
      ports: [{name: http, containerPort: 80}]
      livenessProbe: {httpGet: {port: htp}, successThreshold: 2, periodSeconds: -1}
      readinessProbe: {exec: {command: [cat]}, tcpSocket: {port: 80}, terminationGracePeriodSeconds: 3}
      startupProbe: {failureThreshold: -3, terminationGracePeriodSeconds: 0}
    - name: side
      image: i
      livenessProbe: {tcpSocket: {port: 0}, failureThreshold: 3}
      readinessProbe: {httpGet: {port: 443, scheme: SPDY}}
      startupProbe: {exec: {command: []}}
";
        let at = "pod.yaml:{}: Pod p: /spec/containers/";
        let expected = [
            (
                9,
                "0/livenessProbe/httpGet/port",
                "\"htp\" names no port of container \"web\": add a port named htp to its ports, or use the port's number",
            ),
            (
                9,
                "0/livenessProbe/periodSeconds",
                "periodSeconds must not be negative (it is -1): set a positive number, or remove it for the default (10)",
            ),
            (
                9,
                "0/livenessProbe/successThreshold",
                "successThreshold must be 1 for a livenessProbe (it is 2): remove it, or set it to 1",
            ),
            (10, "0/readinessProbe", "readinessProbe has 2 handlers (exec, tcpSocket): keep one"),
            (
                10,
                "0/readinessProbe/terminationGracePeriodSeconds",
                "terminationGracePeriodSeconds is for liveness and startup probes only (readiness kills nothing): remove it",
            ),
            (11, "0/startupProbe", "startupProbe has no handler: set one of exec, httpGet, tcpSocket, grpc"),
            (
                11,
                "0/startupProbe/failureThreshold",
                "failureThreshold must not be negative (it is -3): set a positive number, or remove it for the default (3)",
            ),
            (
                11,
                "0/startupProbe/terminationGracePeriodSeconds",
                "terminationGracePeriodSeconds must be greater than 0 (it is 0): set a positive number, or remove it for the Pod's",
            ),
            (14, "1/livenessProbe/tcpSocket/port", "0 is not a port number: use one from 1 to 65535"),
            (15, "1/readinessProbe/httpGet/scheme", "scheme \"SPDY\" is not a probe scheme: use HTTP or HTTPS"),
            (16, "1/startupProbe/exec/command", "exec needs a command: set exec.command, e.g. [cat, /tmp/healthy]"),
        ];
        let mut expected: Vec<String> = expected
            .into_iter()
            .map(|(line, path, message)| format!("{}{path}: {message}", at.replace("{}", &line.to_string())))
            .collect();
        let mut got = errors(&[("pod.yaml", pod)]);
        got.sort();
        expected.sort();
        assert_eq!(got, expected);
    }

    #[test]
    fn t10_ingresses_are_validated_as_kube_apiserver_does() {
        let good = "\
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: shop}
spec:
  tls: [{hosts: [shop.example, '*.shop.example'], secretName: shop-tls}]
  rules:
    - host: '*.shop.example'
      http:
        paths:
          - {path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}
          - {path: /api, pathType: Exact, backend: {service: {name: api, port: {name: http}}}}
          - {pathType: ImplementationSpecific, backend: {resource: {kind: Bucket, name: b}}}
";
        assert!(check(&[("i.yaml", good)]).is_ok(), "{:?}", check(&[("i.yaml", good)]));
        let bad = "\
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: shop}
spec:
  rules:
    - host: 'shop.*.example'
      http:
        paths:
          - {path: /, backend: {service: {name: web, port: {number: 80}}}}
          - {path: api, pathType: Prefix, backend: {service: {name: web, port: {number: 80, name: http}}}}
          - {path: /a//b, pathType: Exact, backend: {service: {name: web, port: {}}, resource: {kind: K, name: n}}}
    - host: 10.0.0.1
      http:
        paths:
          - {path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 0}}}}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: empty}
spec: {}
";
        let mut got = errors(&[("i.yaml", bad)]);
        got.sort();
        let at = "i.yaml:{}: Ingress shop: /spec/rules/";
        let mut expected: Vec<String> = [
            (6, "0/host: \"shop.*.example\": a wildcard is allowed only as the whole first label, as in *.example.com"),
            (9, "0/http/paths/0: \"pathType\" is a required property"),
            (10, "0/http/paths/1/path: \"api\" must be an absolute path (begin with /) for pathType Prefix"),
            (10, "0/http/paths/1/backend/service/port: a Service port is a number or a name, not both: remove one"),
            (11, "0/http/paths/2/path: \"/a//b\" must not contain \"//\" for pathType Exact"),
            (11, "0/http/paths/2/backend: a backend is either a service or a resource, not both: remove one"),
            (12, "1/host: \"10.0.0.1\" is an IP address: a host must be a DNS name (leave it out to match every host)"),
            (15, "1/http/paths/0/backend/service/port/number: 0 is not a port number: use 1 to 65535"),
        ]
        .into_iter()
        .map(|(line, rest)| format!("{}{rest}", at.replace("{}", &line.to_string())))
        .collect();
        expected.push(
            "i.yaml:20 (document 2): Ingress empty: /spec: either defaultBackend or rules must be specified: add a \
             rule with a host and paths, or a defaultBackend"
                .into(),
        );
        expected.sort();
        assert_eq!(got, expected);
    }

    #[test]
    fn t10_claims_volumes_and_classes_are_validated_as_kube_apiserver_does() {
        let good = "\
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data}
spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}
---
apiVersion: v1
kind: PersistentVolume
metadata: {name: task-pv-volume}
spec: {capacity: {storage: 10Gi}, accessModes: [ReadWriteOnce], storageClassName: manual, hostPath: {path: /mnt/data}}
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {name: fast}
provisioner: gitplane.io/local-path
volumeBindingMode: WaitForFirstConsumer
";
        assert!(check(&[("s.yaml", good)]).is_ok(), "{:?}", check(&[("s.yaml", good)]));
        let cases: &[(&str, &[&str])] = &[
            (
                "kind: PersistentVolumeClaim\nspec: {accessModes: [ReadWriteAll], resources: {requests: {storage: 0}}}",
                &[
                    "/spec/accessModes/0: Unsupported value: \"ReadWriteAll\": supported values: \"ReadWriteOnce\", \
                     \"ReadOnlyMany\", \"ReadWriteMany\", \"ReadWriteOncePod\"",
                    "/spec/resources/requests/storage: 0 is not a positive quantity: write e.g. 1Gi",
                ],
            ),
            (
                "kind: PersistentVolumeClaim\nspec: {}",
                &[
                    "/spec/accessModes: at least 1 access mode is required: ReadWriteOnce for one node's Pods",
                    "/spec/resources/requests/storage: a storage request is required, e.g. 1Gi",
                ],
            ),
            (
                "kind: PersistentVolume\nspec: {capacity: {storage: 1Gi}, accessModes: [ReadWriteOnce], nfs: {server: s, \
                 path: /x, readonly: true}}",
                &["/spec/nfs: unknown field \"readonly\" (did you mean \"readOnly\"?)"],
            ),
            (
                "kind: PersistentVolume\nspec: {capacity: {storage: 1Gi}, accessModes: [ReadWriteOnce], local: {path: data}}",
                &[
                    "/spec/local/path: \"data\" must be an absolute path",
                    "/spec/nodeAffinity: a local volume requires node affinity: set nodeAffinity.required to the node \
                     that holds the directory",
                ],
            ),
            (
                "kind: PersistentVolume\nspec: {capacity: {storage: 1Gi}, accessModes: [ReadWriteOnce]}",
                &["/spec: a volume needs a source: set hostPath or local (the path on the node)"],
            ),
        ];
        for (yaml, want) in cases {
            let yaml = format!("apiVersion: v1\nmetadata: {{name: x}}\n{yaml}\n");
            let got: Vec<String> = errors(&[("s.yaml", &yaml)])
                .into_iter()
                .map(|e| e.split_once(" x: ").map_or(e.clone(), |(_, rest)| rest.to_owned()))
                .collect();
            assert_eq!(got, *want, "{yaml}");
        }
    }

    #[test]
    fn t10_secret_data_must_be_base64_and_is_never_quoted() {
        let secret = |data: &str| format!("apiVersion: v1\nkind: Secret\nmetadata:\n  name: creds\ndata:\n{data}");
        assert_eq!(
            errors(&[("secret.yaml", &secret("  user: YWRtaW4=\n  password: hunter2!\n"))]),
            [
                "secret.yaml:7: Secret creds: /data/password: the value is not valid base64: encode it (e.g. with base64 -w0), or move it to stringData as plain text"
            ]
        );
        assert_eq!(errors(&[("secret.yaml", &secret("  a: YWRtaW4\n"))]).len(), 1, "padding is required");
        // Line breaks are skipped, as the API server does; empty is valid.
        let folded = secret("  cert: |\n    YWRt\n    aW4=\n  empty: \"\"\n");
        let manifests = check(&[("secret.yaml", &folded)]).unwrap();
        assert_eq!(manifests[0].value["data"]["empty"], "");
    }

    #[test]
    fn t10_string_data_is_merged_into_data() {
        let secret = "apiVersion: v1\nkind: Secret\nmetadata:\n  name: creds\ndata:\n  user: YWRtaW4=\n  password: b2xk\nstringData:\n  password: hunter2\n  token: t\n";
        let manifests = check(&[("secret.yaml", secret)]).unwrap();
        let value = &manifests[0].value;
        assert_eq!(value.get("stringData"), None);
        assert_eq!(value["data"], json!({"user": "YWRtaW4=", "password": "aHVudGVyMg==", "token": "dA=="}));
        let only = "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\nstringData: {a: b}\n";
        assert_eq!(check(&[("s.yaml", only)]).unwrap()[0].value["data"], json!({"a": "Yg=="}));
        // The manifest's Debug output masks the merged values too.
        let shown = format!("{:?}", manifests[0]);
        assert!(!shown.contains("aHVudGVyMg") && !shown.contains("hunter2"), "{shown}");
    }

    #[test]
    fn t10_unknown_fields_each_on_their_line() {
        let text = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n  lables: {}\ndata: {}\ndatta: {}\nzzz: 1\n";
        assert_eq!(
            errors(&[("cm.yaml", text)]),
            [
                r#"cm.yaml:5: ConfigMap c: /metadata: unknown field "lables" (did you mean "labels"?)"#,
                r#"cm.yaml:7: ConfigMap c: unknown field "datta" (did you mean "data"?)"#,
                r#"cm.yaml:8: ConfigMap c: unknown field "zzz""#,
            ]
        );
    }

    #[test]
    fn t10_defaults_and_normalization() {
        let text = "\
apiVersion: v1
kind: ConfigMap
metadata:
  name: a
  creationTimestamp: null
  labels: {app: null}
data: null
status: {}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: b, namespace: prod}
---
apiVersion: v1
kind: Namespace
metadata: {name: prod, namespace: \"\"}
";
        let manifests = check(&[("all.yaml", text)]).unwrap();
        let keys: Vec<_> = manifests.iter().map(|m| (m.key.to_string(), m.index, m.line)).collect();
        assert_eq!(
            keys,
            [
                ("ConfigMap default/a".into(), 0, 1),
                ("ConfigMap prod/b".into(), 1, 10),
                ("Namespace prod".into(), 2, 14)
            ]
        );
        assert_eq!(
            manifests[0].value,
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "namespace": "default", "labels": {}}})
        );
        assert_eq!(manifests[2].value["metadata"], json!({"name": "prod"}));
    }

    /// The last definition read wins, as with kubectl apply -f DIR; it is warned of, naming the
    /// others, and the object is applied once.
    #[test]
    fn t10_repeated_objects_keep_the_last_definition_with_a_warning() {
        let cm = |ns: &str, v: &str| {
            format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n{ns}data: {{v: '{v}'}}\n")
        };
        let first = cm("", "1");
        let second = format!("# again\n{}", cm("  namespace: default\n", "2"));
        let other = format!("---\n{}", cm("  namespace: other\n", "3"));
        let third = cm("", "4");
        let also = "the last definition read, this one, is applied, as kubectl apply -f would; keep only one of them";
        let cases = [
            (
                vec![("a.yaml", &first), ("b.yaml", &second), ("c.yaml", &other)],
                vec![("ConfigMap default/c", "2"), ("ConfigMap other/c", "3")],
                vec![format!(
                    "b.yaml:5: ConfigMap c: /metadata/name: ConfigMap default/c is also defined at a.yaml:4: {also}"
                )],
            ),
            (
                vec![("a.yaml", &first), ("b.yaml", &second), ("c.yaml", &other), ("d.yaml", &third)],
                vec![("ConfigMap other/c", "3"), ("ConfigMap default/c", "4")],
                vec![format!(
                    "d.yaml:4: ConfigMap c: /metadata/name: ConfigMap default/c is also defined at a.yaml:4, \
                     b.yaml:5: {also}"
                )],
            ),
            (
                vec![("a.yaml", &first), ("c.yaml", &other)],
                vec![("ConfigMap default/c", "1"), ("ConfigMap other/c", "3")],
                vec![],
            ),
        ];
        for (files, objects, warnings) in cases {
            let files: Vec<(&str, &str)> = files.into_iter().map(|(f, t)| (f, t.as_str())).collect();
            let manifests = check(&files).unwrap_or_else(|e| panic!("{e:?}"));
            let got: Vec<_> =
                manifests.iter().map(|m| (m.key.to_string(), m.value["data"]["v"].as_str().unwrap())).collect();
            let objects: Vec<_> = objects.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
            assert_eq!(got, objects);
            let got: Vec<String> = manifests.iter().flat_map(|m| &m.warnings).map(ToString::to_string).collect();
            assert_eq!(got, warnings);
            assert!(manifests.iter().flat_map(|m| &m.warnings).all(|w| w.reason == "RepeatedResourceWarning"));
        }
    }

    #[test]
    fn t10_a_named_target_port_no_selected_pod_declares_is_an_error() {
        let deployment = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec:\n  selector: {matchLabels: {app: web}}\n  \
                          template:\n    metadata: {labels: {app: web}}\n    spec:\n      containers:\n        - name: c\n          \
                          image: i\n          ports: [{name: http, containerPort: 8080}]\n";
        let service = |target: &str, app: &str| {
            format!(
                "apiVersion: v1\nkind: Service\nmetadata: {{name: web}}\nspec:\n  selector: {{app: {app}}}\n  ports:\n    \
                 - port: 80\n      targetPort: {target}\n"
            )
        };
        assert_eq!(
            errors(&[("d.yaml", deployment), ("s.yaml", &service("htp", "web"))]),
            [
                "s.yaml:8: Service web: /spec/ports/0/targetPort: targetPort \"htp\" is not the name of a container port of \
                 the Pods this Service selects (their named ports: http): name the port in the Pod template, or use its number"
            ]
        );
        assert!(check(&[("d.yaml", deployment), ("s.yaml", &service("http", "web"))]).is_ok());
        assert!(check(&[("d.yaml", deployment), ("s.yaml", &service("8080", "web"))]).is_ok());
        // Pods from elsewhere: nothing here to check against.
        assert!(check(&[("d.yaml", deployment), ("s.yaml", &service("htp", "other"))]).is_ok());
    }

    #[test]
    fn t10_a_missing_key_of_a_config_map_or_secret_in_the_commit_is_an_error() {
        let objects = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: app}\ndata: {mode: fast}\n---\n\
                       apiVersion: v1\nkind: Secret\nmetadata: {name: db}\nstringData: {password: hunter2}\n";
        let pod = |env_key: &str, item_key: &str, optional: bool| {
            format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: p}}\nspec:\n  containers:\n    - name: c\n      image: i\n      \
                 env:\n        - {{name: A, valueFrom: {{configMapKeyRef: {{name: app, key: {env_key}, optional: {optional}}}}}}}\n        \
                 - {{name: B, valueFrom: {{secretKeyRef: {{name: elsewhere, key: x}}}}}}\n  volumes:\n    \
                 - {{name: s, secret: {{secretName: db, items: [{{key: {item_key}, path: pw}}]}}}}\n"
            )
        };
        assert_eq!(
            errors(&[("o.yaml", objects), ("p.yaml", &pod("mdoe", "passwd", false))]),
            [
                "p.yaml:9: Pod p: /spec/containers/0/env/0/valueFrom/configMapKeyRef/key: ConfigMap app (in this commit) has \
                 no key \"mdoe\" (its keys: mode): add the key, fix the name, or mark the reference optional: true",
                "p.yaml:12: Pod p: /spec/volumes/0/secret/items/0/key: Secret db (in this commit) has no key \"passwd\" \
                 (its keys: password): add the key, fix the name, or mark the reference optional: true",
            ]
        );
        assert!(check(&[("o.yaml", objects), ("p.yaml", &pod("mode", "password", false))]).is_ok());
        assert!(check(&[("o.yaml", objects), ("p.yaml", &pod("mdoe", "password", true))]).is_ok(), "optional");
    }

    #[test]
    fn t10_all_errors_of_all_files() {
        let files = [
            ("a.yaml", "apiVersion: v1\nkind: Foo\nmetadata: {name: x}\n---\nkey: [\n"),
            (
                "b.yaml",
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: B}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: 1}\n",
            ),
            ("c.yaml", DEMO_SERVICE),
        ];
        let errors = errors(&files);
        let short: Vec<_> = errors.iter().map(|e| e.split(": ").take(2).collect::<Vec<_>>().join(": ")).collect();
        assert_eq!(
            short,
            [
                "a.yaml:2: Foo x",
                "a.yaml:6:1 (document 2): did not find expected node content, while parsing a flow node",
                "b.yaml:3: ConfigMap B",
                "b.yaml:8 (document 2): Pod p"
            ],
            "{errors:#?}"
        );
    }

    #[test]
    fn t10_secret_values_never_in_messages() {
        let schema = json!({"properties": {"data": {"additionalProperties": {"type": "string"}}}});
        let validator = jsonschema::validator_for(&schema).unwrap();
        let secret = json!({"data": {"password": 1234567}});
        let messages: Vec<_> =
            schema_problems(&validator, &schema, &secret, "Secret").into_iter().map(|p| p.message).collect();
        assert_eq!(messages, [r#"<masked> is not of type "string""#]);
        let messages: Vec<_> =
            schema_problems(&validator, &schema, &secret, "ConfigMap").into_iter().map(|p| p.message).collect();
        assert_eq!(messages, [r#"1234567 is not of type "string""#]);
    }

    #[test]
    fn t10_suggestions() {
        let known: Vec<String> =
            ["replicas", "selector", "template", "labels", "containerPort"].map(String::from).into();
        let cases = [
            ("replicass", Some("replicas")),
            ("lables", Some("labels")),
            ("containerport", Some("containerPort")),
            ("spec", None),
            ("x", None),
        ];
        for (field, meant) in cases {
            assert_eq!(closest(field, known.iter()), meant, "{field}");
        }
    }

    #[test]
    fn t10_dns_names() {
        let cases = [
            (DnsName::Subdomain, "web", true),
            (DnsName::Subdomain, "web.example-1.com", true),
            (DnsName::Subdomain, "web..x", false),
            (DnsName::Subdomain, "-web", false),
            (DnsName::Subdomain, "", false),
            (DnsName::Label, "9lives", true),
            (DnsName::Label, "a.b", false),
            (DnsName::Label, "web-", false),
            (DnsName::Rfc1035Label, "9lives", false),
            (DnsName::Rfc1035Label, "web-9", true),
        ];
        for (syntax, name, valid) in cases {
            assert_eq!(syntax.check(name).is_ok(), valid, "{name}");
        }
        assert!(DnsName::Subdomain.check(&"a".repeat(253)).is_ok());
        assert!(DnsName::Subdomain.check(&"a".repeat(254)).is_err());
    }
}
