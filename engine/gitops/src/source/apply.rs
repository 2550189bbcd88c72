//! Planning a sync, purely: from the manifests of a commit, the objects in the store and what
//! was applied last, decide the ops of the one transaction that makes the store match Git.
//!
//! As `kubectl apply`, the merge is three-way, so fields Git never set (set by someone else) are
//! kept and fields removed from Git are removed: for every field Git manages, the stored value
//! becomes Git's; a field in the last applied configuration that Git no longer has is deleted;
//! any other stored field stays. Mappings merge key by key; lists are replaced whole. The last
//! applied configuration is kept on each object in an annotation, with Secret values replaced by
//! keyed digests (HMAC under a key of the cluster's, [`RecordKey`]), so no secret is copied into
//! metadata and a weak value cannot be found from its record offline. A managed field that differs from Git while Git
//! did not change it is drift: it is corrected and reported.

use crate::source::{
    Warning,
    allocate::{Allocations, ServiceRanges, carry_over},
    podsecurity,
};
use gitplane_api::hooks;
use gitplane_api::object::{APPLICATION_ANNOTATION, resource_version};
use gitplane_controllers::admission::{self, Admission};
use gitplane_source::{Manifest, ManifestError};
use gitplane_store::{ObjectKey, Op, deletion};
use hmac::{Hmac, Mac};
use serde_json::{Map, Value};
use sha2::Sha256;
use std::{
    borrow::Cow,
    collections::{BTreeMap, HashMap, HashSet},
    sync::Arc,
};

/// Whether a prune deletes a claim or a volume, and what the push's plan says of it: a volume
/// and a bound claim stay unless their volume's reclaim policy is Delete, and a prune that
/// deletes a bound claim (with its volume and data) is named. Other kinds are deleted quietly.
fn storage_prune(key: &ObjectKey, current: &Value, stored: &dyn Stored) -> (bool, Option<String>) {
    let policy =
        |volume: &Value| volume["spec"]["persistentVolumeReclaimPolicy"].as_str().unwrap_or("Retain").to_owned();
    match key.kind.as_str() {
        "PersistentVolume" => match policy(current).as_str() {
            "Delete" => (true, None),
            other => (
                false,
                Some(format!(
                    "{key} stays: its reclaim policy is {other}; delete it by hand when its data is no longer needed"
                )),
            ),
        },
        "PersistentVolumeClaim" => {
            let Some(volume_name) = current["spec"]["volumeName"].as_str().filter(|v| !v.is_empty()) else {
                return (true, None);
            };
            let volume = stored.get(&ObjectKey::new("PersistentVolume", "", volume_name));
            match volume.map(|v| policy(&v)).as_deref() {
                Some("Delete") => (
                    true,
                    Some(format!(
                        "pruning bound claim {key} deletes PersistentVolume {volume_name} and its data (reclaim policy Delete)"
                    )),
                ),
                Some(other) => (
                    false,
                    Some(format!(
                        "bound claim {key} stays: PersistentVolume {volume_name}'s reclaim policy is {other}; delete the \
                         claim by hand when its data is no longer needed"
                    )),
                ),
                None => (true, None),
            }
        }
        _ => (true, None),
    }
}

/// The last configuration the source applied to an object (JSON, secrets digested).
pub const LAST_APPLIED_ANNOTATION: &str = "gitplane.io/last-applied";
/// Metadata only the server manages.
const SERVER_FIELDS: [&str; 5] = ["resourceVersion", "uid", "creationTimestamp", "generation", "managedFields"];

/// What a sync will do.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    pub ops: Vec<Op>,
    /// Objects whose managed fields were changed outside Git; the ops restore them.
    pub drifted: Vec<ObjectKey>,
    pub created: usize,
    pub updated: usize,
    pub pruned: usize,
    /// Whether every object was compared with the store, not only what changed since the
    /// inventory was last recorded.
    pub full: bool,
    /// What the commit gets wrong without the sync refusing it (a NetworkPolicy that shuts the
    /// Ingress out, a Pod its namespace's `warn` level forbids): printed by the push, recorded
    /// as Warning Events by the sync.
    pub warnings: Vec<Warning>,
    /// The manifests of the Create and Update ops.
    written: Vec<Arc<Manifest>>,
    /// Manifests compared and found as Git wants them, with the resourceVersion seen.
    unchanged: Vec<(Arc<Manifest>, i64)>,
    /// Objects of the Application that Git no longer has (deleted by the ops if it prunes).
    removed: Vec<ObjectKey>,
}

impl Plan {
    /// Objects compared and found as Git wants them.
    pub fn unchanged(&self) -> usize {
        self.unchanged.len()
    }

    /// Keeps only the writes of the objects `keep` admits, and the prunes only if `prune`: the
    /// part of a sync's plan that one wave applies.
    pub fn restrict(&mut self, keep: impl Fn(&ObjectKey) -> bool, prune: bool) {
        self.ops.retain(|op| match op {
            Op::Delete { .. } => prune,
            other => other.key().is_ok_and(|k| keep(&k)),
        });
        self.written.retain(|m| keep(&m.key));
        self.drifted.retain(|k| keep(k));
        if !prune {
            // Not deleted yet: the inventory keeps them.
            self.removed.clear();
        }
        self.created = self.ops.iter().filter(|op| matches!(op, Op::Create(_))).count();
        self.updated = self.ops.iter().filter(|op| matches!(op, Op::Update(_))).count();
        self.pruned = self.ops.iter().filter(|op| matches!(op, Op::Delete { .. })).count();
    }

    /// Adds what a later part of the same sync did, for the sync's summary (its warnings are
    /// this one's: every part plans the whole commit).
    pub fn absorb(&mut self, later: Plan) {
        self.ops.extend(later.ops);
        self.drifted.extend(later.drifted);
        self.created += later.created;
        self.updated += later.updated;
        self.pruned += later.pruned;
    }
}

/// The objects an Application owns, as this process last wrote or compared them: per object,
/// the manifest it was applied from (the source cache hands back the same `Arc` while the file
/// is unchanged) and the resourceVersion it was at. A plan trusts an entry whose manifest is
/// the same `Arc` and which nothing else has written since ([`Inventory::touched`]), without
/// looking at the stored object: that keeps a one-file commit to a large repository O(changed).
///
/// Only a full plan, which looks at every stored object, makes the inventory `complete` (every
/// object the Application owns is in it); until then, and whenever events may have been missed
/// ([`Inventory::distrust`]), plans are full.
#[derive(Debug, Default)]
pub struct Inventory {
    objects: HashMap<ObjectKey, Entry>,
    complete: bool,
}

#[derive(Debug)]
struct Entry {
    /// `None`: owned, but no longer in Git (kept when the Application does not prune).
    manifest: Option<Arc<Manifest>>,
    /// `None` once the object was written by anything else or deleted.
    revision: Option<i64>,
}

impl Inventory {
    /// A write (`Some(resourceVersion)`) or deletion (`None`) of `key` seen in the store: unless
    /// it is the write this inventory recorded, the entry is no longer trusted.
    pub fn touched(&mut self, key: &ObjectKey, revision: Option<i64>) {
        if let Some(entry) = self.objects.get_mut(key)
            && (revision.is_none() || entry.revision != revision)
        {
            entry.revision = None;
        }
    }

    /// A store event as a verdict's inventory follows it ([`super::verdict`]), which no sync of
    /// its own keeps complete: as [`Inventory::touched`]; besides, an object of the
    /// Application's that its plans never saw (written by the sync of a commit it did not judge)
    /// becomes a candidate to prune until a manifest names it, and a deleted one that no
    /// manifest names is forgotten.
    pub fn observed(&mut self, key: &ObjectKey, revision: Option<i64>, owned: bool) {
        self.touched(key, revision);
        match (self.objects.get(key), revision) {
            (Some(Entry { manifest: None, .. }), None) => {
                self.objects.remove(key);
            }
            (None, Some(_)) if owned => {
                self.objects.insert(key.clone(), Entry { manifest: None, revision: None });
            }
            _ => {}
        }
    }

    /// The next plan compares every object with the store.
    pub fn distrust(&mut self) {
        self.complete = false;
    }

    /// Records what a plan did; `committed` holds the objects its transaction wrote, with their
    /// new resourceVersions.
    pub fn record<'a>(&mut self, plan: &Plan, committed: impl IntoIterator<Item = &'a Value>, prune: bool) {
        if plan.full {
            self.objects.clear();
        }
        let written: HashMap<ObjectKey, i64> = committed
            .into_iter()
            .filter_map(|o| Some((ObjectKey::from_value(o).ok()?, resource_version(o)?)))
            .collect();
        let entries = plan.unchanged.iter().map(|(m, rv)| (m, Some(*rv)));
        for (m, revision) in entries.chain(plan.written.iter().map(|m| (m, written.get(&m.key).copied()))) {
            self.objects.insert(m.key.clone(), Entry { manifest: Some(m.clone()), revision });
        }
        for key in &plan.removed {
            if prune {
                self.objects.remove(key);
            } else {
                self.objects.insert(key.clone(), Entry { manifest: None, revision: None });
            }
        }
        self.complete = true;
    }
}

/// The stored objects a plan looks at: looked up where they are (the informer's cache), not
/// copied into a map per sync.
pub trait Stored {
    fn get(&self, key: &ObjectKey) -> Option<Arc<Value>>;
    /// Every stored object of a group kind.
    fn list(&self, kind: &str) -> Vec<Arc<Value>>;
    /// The objects whose inventory annotation names `app` (`namespace/name`).
    fn owned_by(&self, app: &str) -> Vec<(ObjectKey, Arc<Value>)>;
}

/// Whether the object's inventory annotation names `app`.
pub fn owned_by(object: &Value, app: &str) -> bool {
    object["metadata"]["annotations"][APPLICATION_ANNOTATION].as_str() == Some(app)
}

impl Stored for BTreeMap<ObjectKey, Arc<Value>> {
    fn get(&self, key: &ObjectKey) -> Option<Arc<Value>> {
        BTreeMap::get(self, key).cloned()
    }

    fn list(&self, kind: &str) -> Vec<Arc<Value>> {
        self.iter().filter(|(k, _)| k.kind == kind).map(|(_, v)| v.clone()).collect()
    }

    fn owned_by(&self, app: &str) -> Vec<(ObjectKey, Arc<Value>)> {
        self.iter().filter(|(_, v)| owned_by(v, app)).map(|(k, v)| (k.clone(), v.clone())).collect()
    }
}

/// What else a plan needs to know about the cluster.
pub struct Cluster<'a> {
    /// The stored objects of the accepted kinds.
    pub stored: &'a dyn Stored,
    /// What this Application owns and applied last.
    pub inventory: &'a Inventory,
    pub namespaces: &'a HashSet<String>,
    pub nodes: &'a HashSet<String>,
    /// Where Services get their addresses and nodePorts.
    pub service_ranges: &'a ServiceRanges,
}

/// The Application's settings that shape a plan.
pub struct Policy<'a> {
    /// `namespace/name` of the Application: the inventory annotation's value.
    pub app: &'a str,
    pub prune: bool,
    pub allow_empty: bool,
    pub record_key: &'a RecordKey,
}

/// The key of the digests that stand for Secret values in last-applied records: the records are
/// readable by anyone who may read the object's metadata, so an unkeyed digest of a weak
/// password would give it away to a dictionary.
#[derive(Clone)]
pub struct RecordKey([u8; 32]);

impl RecordKey {
    pub fn new(key: [u8; 32]) -> RecordKey {
        RecordKey(key)
    }

    fn digest(&self, value: &Value) -> String {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        mac.update(value.to_string().as_bytes());
        format!("hmac-sha256:{}", hex(&mac.finalize().into_bytes()))
    }
}

// Never print the key.
impl std::fmt::Debug for RecordKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RecordKey(***)")
    }
}

fn error_at(m: &Manifest, path: &str, message: String) -> ManifestError {
    ManifestError {
        file: m.file.clone(),
        line: Some(m.line),
        column: None,
        document: Some(m.index),
        object: Some(format!("{} {}", m.value["kind"].as_str().unwrap_or(""), m.key.name)),
        path: Some(path.to_owned()),
        message,
    }
}

/// Whether [`without_server_fields`] has anything to take out of `value`.
fn has_server_fields(value: &Value) -> bool {
    let meta = &value["metadata"];
    let annotations = &meta["annotations"];
    value.get("status").is_some()
        || SERVER_FIELDS.iter().any(|field| meta.get(field).is_some())
        || annotations.get(LAST_APPLIED_ANNOTATION).is_some()
        || annotations.as_object().is_some_and(Map::is_empty)
}

/// The object without what the server manages, and without status; Git's objects usually
/// have none of it, and are not copied then.
fn without_server_fields(value: &Value) -> Cow<'_, Value> {
    if !has_server_fields(value) {
        return Cow::Borrowed(value);
    }
    let mut v = value.clone();
    if let Some(obj) = v.as_object_mut() {
        obj.remove("status");
        if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            for field in SERVER_FIELDS {
                meta.remove(field);
            }
            if let Some(annotations) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
                annotations.remove(LAST_APPLIED_ANNOTATION);
                if annotations.is_empty() {
                    meta.remove("annotations");
                }
            }
        }
    }
    Cow::Owned(v)
}

/// The configuration recorded as last applied: Secret values replaced by their keyed digests.
pub fn last_applied_record<'a>(desired: &'a Value, key: &RecordKey) -> Cow<'a, Value> {
    let mut record = without_server_fields(desired);
    if record["kind"] == "Secret" {
        for field in ["data", "stringData"] {
            if let Some(values) = record.to_mut().get_mut(field).and_then(Value::as_object_mut) {
                for v in values.values_mut() {
                    *v = Value::String(key.digest(v));
                }
            }
        }
    }
    record
}

/// Whether `value` serializes to exactly `text`, compared as it is written, without building the
/// string: the common case of a full plan, once per object.
fn serializes_as(value: &Value, text: &str) -> bool {
    struct Compare<'a>(&'a [u8]);
    impl std::io::Write for Compare<'_> {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let rest = self.0.strip_prefix(buf).ok_or(std::io::ErrorKind::InvalidData)?;
            self.0 = rest;
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut compare = Compare(text.as_bytes());
    serde_json::to_writer(&mut compare, value).is_ok() && compare.0.is_empty()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The three-way merge of `desired` into `stored`, given the `last` applied configuration.
pub fn merge(stored: &Value, last: Option<&Value>, desired: &Value) -> Value {
    match (stored, desired) {
        (Value::Object(s), Value::Object(d)) => {
            let empty = Map::new();
            let l = last.and_then(Value::as_object).unwrap_or(&empty);
            let mut out = Map::new();
            for (k, sv) in s {
                if !d.contains_key(k) && !l.contains_key(k) {
                    out.insert(k.clone(), sv.clone()); // not Git's: keep
                }
            }
            for (k, dv) in d {
                let merged = match s.get(k) {
                    Some(sv) => merge(sv, l.get(k), dv),
                    None => dv.clone(),
                };
                out.insert(k.clone(), merged);
            }
            Value::Object(out)
        }
        _ => desired.clone(),
    }
}

/// Whether `stored` differs from `desired` in a field `desired` sets (Secret values compared
/// through the digests of the record when `desired` is a record). List items are compared the
/// same way, in order: what the server adds inside an item (an allocated nodePort, a default)
/// is not a difference, an item more or less is.
fn managed_differs(stored: &Value, desired: &Value) -> bool {
    match (stored, desired) {
        (Value::Object(s), Value::Object(d)) => {
            d.iter().any(|(k, dv)| s.get(k).is_none_or(|sv| managed_differs(sv, dv)))
        }
        (Value::Array(s), Value::Array(d)) => s.len() != d.len() || s.iter().zip(d).any(|(s, d)| managed_differs(s, d)),
        _ => stored != desired,
    }
}

/// Whether a stored object's managed fields differ from the configuration last applied to it:
/// something other than the source changed it.
pub fn drifted(stored: &Value, key: &RecordKey) -> bool {
    let last =
        stored["metadata"]["annotations"][LAST_APPLIED_ANNOTATION].as_str().and_then(|t| serde_json::from_str(t).ok());
    last.is_some_and(|last: Value| managed_differs(&last_applied_record(stored, key), &last))
}

/// The allocations of the stored Services, read once per plan. Services this commit prunes free
/// their addresses for the ones it adds.
fn services<'s>(
    slot: &'s mut Option<Allocations>,
    manifests: &[Arc<Manifest>],
    cluster: &Cluster<'_>,
    policy: &Policy<'_>,
) -> &'s mut Allocations {
    slot.get_or_insert_with(|| {
        let wanted: HashSet<&ObjectKey> = manifests.iter().map(|m| &m.key).collect();
        let stored = cluster.stored.list("Service");
        let kept = stored.iter().filter(|s| {
            !(policy.prune && owned_by(s, policy.app) && ObjectKey::from_value(s).is_ok_and(|k| !wanted.contains(&k)))
        });
        Allocations::of(kept.map(|s| &**s))
    })
}

/// The object as the source writes it: Git's, with the inventory and last-applied annotations.
fn desired(m: &Manifest, app: &str, record: &Value) -> Value {
    let mut desired = m.value.clone();
    let annotations = &mut desired["metadata"]["annotations"];
    annotations[APPLICATION_ANNOTATION] = Value::String(app.to_owned());
    annotations[LAST_APPLIED_ANNOTATION] = Value::String(record.to_string());
    desired
}

/// Where a kind keeps its Pod spec, if it has one.
fn pod_spec_pointer(kind: &str) -> Option<&'static str> {
    match kind {
        "Pod" => Some("/spec"),
        "Deployment.apps"
        | "ReplicaSet.apps"
        | "StatefulSet.apps"
        | "DaemonSet.apps"
        | "ReplicationController"
        | "Job.batch" => Some("/spec/template/spec"),
        "CronJob.batch" => Some("/spec/jobTemplate/spec/template/spec"),
        _ => None,
    }
}

/// The labels of namespace `name`: from its manifest in the commit, else as stored.
fn namespace_labels(manifests: &[Arc<Manifest>], cluster: &Cluster<'_>, name: &str) -> Value {
    match manifests.iter().find(|m| m.key.kind == "Namespace" && m.key.name == name) {
        Some(m) => m.value["metadata"]["labels"].clone(),
        None => {
            let stored = cluster.stored.get(&ObjectKey::new("Namespace", "", name));
            stored.map(|n| n["metadata"]["labels"].clone()).unwrap_or_default()
        }
    }
}

/// What the cluster refuses of an object beyond its own manifest: a namespace or node that does
/// not exist, a Pod its namespace's security level forbids (a warning for its `warn` level),
/// external IPs that are not the cluster's to give.
fn admit(
    m: &Manifest,
    manifests: &[Arc<Manifest>],
    cluster: &Cluster<'_>,
    (errors, warnings): (&mut Vec<ManifestError>, &mut Vec<Warning>),
    node_ips: &mut Option<Vec<std::net::Ipv4Addr>>,
) {
    let ns = &m.key.namespace;
    let defines_namespace = |name: &str| manifests.iter().any(|o| o.key.kind == "Namespace" && o.key.name == name);
    if !ns.is_empty() && !cluster.namespaces.contains(ns) && !defines_namespace(ns) {
        errors.push(error_at(
            m,
            "/metadata/namespace",
            format!("namespace {ns:?} does not exist: add a Namespace manifest for it or use an existing namespace"),
        ));
    }
    if let Some(node) = m.value["spec"]["nodeName"].as_str()
        && m.key.kind == "Pod"
        && !cluster.nodes.contains(node)
    {
        errors.push(error_at(
            m,
            "/spec/nodeName",
            format!("node {node:?} does not exist: remove spec.nodeName and let the scheduler place the Pod"),
        ));
    }
    if let Some(at) = pod_spec_pointer(&m.key.kind)
        && let Some(spec) = m.value.pointer(at)
    {
        let labels = namespace_labels(manifests, cluster, ns);
        let (enforce, warn) = podsecurity::levels(&labels);
        for (path, what) in podsecurity::violations(spec, at, enforce) {
            let message = format!(
                "{what} is not allowed by the Pod Security Standard {:?}, which namespace {ns} enforces: change \
                 the field, or label the Namespace's manifest in Git with {}enforce: privileged (such a Pod is \
                 root on its node)",
                enforce.as_str(),
                podsecurity::LABEL
            );
            errors.push(error_at(m, &path, message));
        }
        if let Some(warn) = warn.filter(|w| *w > enforce) {
            for (path, what) in podsecurity::violations(spec, at, warn) {
                warnings.push(Warning {
                    key: m.key.clone(),
                    reason: podsecurity::WARNING_REASON,
                    message: format!(
                        "{}:{}: {} {path}: {what} would not be allowed by the Pod Security Standard {:?}, \
                         which namespace {ns} warns about",
                        m.file,
                        m.line,
                        m.key,
                        warn.as_str()
                    ),
                });
            }
        }
    }
    if m.key.kind == "Service" && m.value["spec"]["externalIPs"].is_array() {
        let nodes = node_ips.get_or_insert_with(|| super::reach::node_ips(&cluster.stored.list("Node")));
        let problems = super::allocate::external_ip_problems(&m.value, cluster.service_ranges, nodes);
        errors.extend(problems.into_iter().map(|(path, message)| error_at(m, &path, message)));
    }
}

/// What admission reads while a commit is planned: the stored objects, but a namespace's
/// LimitRanges and ResourceQuotas as the commit leaves them (Argo CD applies them before the
/// Pods of the same sync, and kubectl's users do).
struct AfterSync<'a> {
    stored: &'a dyn Stored,
    manifests: &'a [Arc<Manifest>],
}

impl admission::Objects for AfterSync<'_> {
    fn list(&self, kind: &str, namespace: &str) -> Vec<Arc<Value>> {
        let in_namespace = |v: &Value| v["metadata"]["namespace"].as_str().unwrap_or("") == namespace;
        let mut objects: Vec<Arc<Value>> = self.stored.list(kind).into_iter().filter(|v| in_namespace(v)).collect();
        if kind == "LimitRange" || kind == "ResourceQuota" {
            let from_git: Vec<&Manifest> = self
                .manifests
                .iter()
                .filter(|m| m.key.kind == kind && m.key.namespace == namespace)
                .map(|m| &**m)
                .collect();
            objects.retain(|v| !from_git.iter().any(|m| v["metadata"]["name"].as_str() == Some(m.key.name.as_str())));
            objects.extend(from_git.into_iter().map(|m| Arc::new(m.value.clone())));
        }
        objects
    }
}

/// The ops that make the store match `manifests`, or every reason they cannot. Compares only
/// what the inventory cannot vouch for, unless it is not `complete`: then every object.
pub fn plan(
    manifests: &[Arc<Manifest>],
    cluster: &Cluster<'_>,
    policy: &Policy<'_>,
) -> Result<Plan, Vec<ManifestError>> {
    let inventory = cluster.inventory;
    let mut errors = Vec::new();
    let mut plan = Plan { full: !inventory.complete, ..Plan::default() };
    // Built on the first Service that needs it: a commit without Services reads none.
    let mut allocations: Option<Allocations> = None;
    let mut node_ips: Option<Vec<std::net::Ipv4Addr>> = None;
    let scaled = super::autoscale::scaled(manifests, cluster.stored.list(super::autoscale::HPA), policy.app);
    // The API server's LimitRanger and ResourceQuota on every create, as on the controllers'.
    let after_sync = AfterSync { stored: cluster.stored, manifests };
    let mut admission = Admission::new(&after_sync);
    // Inventory entries that a manifest still names: when that is all of them, nothing left Git.
    let mut named = 0;
    for m in manifests {
        // A hook is no part of the desired state: checked as any object, created by its phase.
        if hooks::is_hook(&m.value) {
            admit(m, manifests, cluster, (&mut errors, &mut plan.warnings), &mut node_ips);
            continue;
        }
        let entry = inventory.objects.get(&m.key);
        named += usize::from(entry.is_some());
        let applied = entry.filter(|e| e.manifest.as_ref().is_some_and(|last| Arc::ptr_eq(last, m)));
        // Applied from this very manifest, and nothing wrote the object since.
        let trusted = applied.and_then(|e| e.revision);
        if !plan.full && trusted.is_some() {
            continue;
        }
        admit(m, manifests, cluster, (&mut errors, &mut plan.warnings), &mut node_ips);
        let is_service = m.key.kind == "Service";
        // What Git manages of the object: all of it, but the replicas of what an HPA scales.
        let git = if scaled.contains_key(&m.key) {
            super::autoscale::without_replicas(&m.value)
        } else {
            Cow::Borrowed(&m.value)
        };
        let Some(current) = cluster.stored.get(&m.key) else {
            let mut object = desired(m, policy.app, &last_applied_record(&git, policy.record_key));
            if is_service
                && let Err(problems) = services(&mut allocations, manifests, cluster, policy).assign(
                    &m.key,
                    &mut object,
                    None,
                    cluster.service_ranges,
                )
            {
                errors.extend(problems.into_iter().map(|(path, message)| error_at(m, &path, message)));
                continue;
            }
            let object = match admission.admit(object) {
                Ok(object) => object,
                Err(refusal) => {
                    let message = format!(
                        "{}: raise the namespace's ResourceQuota or LimitRange, or ask for less",
                        refusal.message
                    );
                    errors.push(error_at(m, "/metadata/name", message));
                    continue;
                }
            };
            plan.ops.push(Op::Create(object));
            plan.written.push(m.clone());
            plan.created += 1;
            continue;
        };
        let revision = resource_version(&current);
        // A full plan still trusts what is stored at the very revision this process applied.
        if trusted.is_some() && trusted == revision {
            plan.unchanged.push((m.clone(), revision.unwrap_or(0)));
            continue;
        }
        let owner = current["metadata"]["annotations"][APPLICATION_ANNOTATION].as_str();
        if owner != Some(policy.app) {
            let by = owner.map_or("the cluster (it is not from Git)".to_owned(), |o| format!("Application {o}"));
            errors.push(error_at(
                m,
                "/metadata/name",
                format!(
                    "{} already exists and is managed by {by}: rename the object or remove it from the other source",
                    m.key
                ),
            ));
            continue;
        }
        let record = last_applied_record(&git, policy.record_key);
        let annotation = current["metadata"]["annotations"][LAST_APPLIED_ANNOTATION].as_str();
        // The common case, without a merge: applied as recorded, and every field Git sets as Git
        // has it. The record is Git's object without server fields (the inventory annotation
        // was checked above), except that a Secret's record holds digests: compare its values.
        let secret_fields;
        let service_fields;
        let git_fields: &Value = if m.value["kind"] == "Secret" {
            secret_fields = without_server_fields(&m.value);
            &secret_fields
        } else if is_service {
            // Git's Service with what was allocated to it, so a list replaced whole still holds
            // its nodePorts.
            service_fields = carry_over(&record, &current);
            &service_fields
        } else {
            &record
        };
        if annotation.is_some_and(|a| serializes_as(&record, a)) && !managed_differs(&current, git_fields) {
            plan.unchanged.push((m.clone(), revision.unwrap_or(0)));
            continue;
        }
        let record_text = record.to_string();
        // What the source manages: Git's object with the inventory annotation.
        let mut managed = without_server_fields(&git).into_owned();
        managed["metadata"]["annotations"][APPLICATION_ANNOTATION] = Value::String(policy.app.to_owned());
        let last: Option<Value> = annotation.and_then(|t| serde_json::from_str(t).ok());
        let current_part = without_server_fields(&current);
        let last_part = last.as_ref().map(without_server_fields).map(|l| match scaled.contains_key(&m.key) {
            true => Cow::Owned(super::autoscale::without_replicas(&l).into_owned()),
            false => l,
        });
        let mut merged = merge(&current_part, last_part.as_deref(), &managed);
        // As the store will write it: with the defaults, compared with what it holds.
        gitplane_api::defaults::apply(&mut merged);
        if is_service {
            merged = carry_over(&merged, &current);
            if let Err(problems) = services(&mut allocations, manifests, cluster, policy).assign(
                &m.key,
                &mut merged,
                Some(&current),
                cluster.service_ranges,
            ) {
                errors.extend(problems.into_iter().map(|(path, message)| error_at(m, &path, message)));
                continue;
            }
        }
        let recorded = last.as_ref() == Some(&*record);
        // Git unchanged since the last apply, yet a field Git manages changed: drift.
        if recorded && managed_differs(&current_part, &managed) {
            plan.drifted.push(m.key.clone());
        }
        if merged == *current_part && recorded {
            plan.unchanged.push((m.clone(), revision.unwrap_or(0)));
        } else {
            let mut update = merged;
            update["metadata"]["annotations"][LAST_APPLIED_ANNOTATION] = Value::String(record_text);
            update["metadata"]["resourceVersion"] = Value::String(revision.unwrap_or(0).to_string());
            plan.ops.push(Op::Update(update));
            plan.written.push(m.clone());
            plan.updated += 1;
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    // What the Application owns and Git no longer has: from the store, or from the inventory
    // (only when some entry is not named by a manifest); looked up in the store only to prune.
    let wanted = || -> HashSet<&ObjectKey> { manifests.iter().map(|m| &m.key).collect() };
    let mut gone: Vec<(ObjectKey, Option<Arc<Value>>)> = if plan.full {
        let wanted = wanted();
        cluster
            .stored
            .owned_by(policy.app)
            .into_iter()
            .filter(|(k, _)| !wanted.contains(k))
            .map(|(k, v)| (k, Some(v)))
            .collect()
    } else if named < inventory.objects.len() {
        let wanted = wanted();
        let current =
            |k: &ObjectKey| policy.prune.then(|| cluster.stored.get(k)).flatten().filter(|v| owned_by(v, policy.app));
        inventory.objects.keys().filter(|k| !wanted.contains(k)).map(|k| (k.clone(), current(k))).collect()
    } else {
        Vec::new()
    };
    gone.sort_by(|a, b| a.0.cmp(&b.0));
    for (key, current) in gone {
        // A graceful delete under way (a bare Pod's node is stopping it) is left to finish.
        if policy.prune
            && let Some(current) = current
            && !deletion::is_terminating(&current)
        {
            let (delete, warning) = storage_prune(&key, &current, cluster.stored);
            if delete {
                plan.ops.push(Op::Delete { revision: resource_version(&current), key: key.clone() });
                plan.pruned += 1;
            }
            if let Some(message) = warning {
                let reason = if delete { "PruneDeletesVolume" } else { "PruneKeepsVolume" };
                plan.warnings.push(Warning { key: key.clone(), reason, message });
            }
        }
        plan.removed.push(key);
    }
    if policy.prune && manifests.is_empty() && plan.pruned > 0 && !policy.allow_empty {
        let message = format!(
            "the commit renders no objects, which would delete all {} objects of this Application; \
             if that is intended set spec.allowEmpty: true, otherwise check spec.path",
            plan.pruned
        );
        return Err(vec![ManifestError {
            file: "(commit)".into(),
            line: None,
            column: None,
            document: None,
            object: None,
            path: None,
            message,
        }]);
    }
    // What validation accepted and changed as the API server would (a cluster-scoped object's
    // namespace), or accepted though it cannot work here: said at every plan, as the autoscaling
    // warnings are.
    plan.warnings.extend(manifests.iter().flat_map(|m| {
        m.warnings.iter().map(|w| Warning { key: m.key.clone(), reason: w.reason, message: w.to_string() })
    }));
    plan.warnings.extend(super::autoscale::warnings(manifests, &scaled));
    plan.warnings
        .extend(super::reach::ingress_blocked(manifests, || super::reach::node_ips(&cluster.stored.list("Node"))));
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pruned_claims_and_volumes_follow_their_reclaim_policy() {
        let volume =
            |policy: &str| json!({"kind": "PersistentVolume", "spec": {"persistentVolumeReclaimPolicy": policy}});
        let claim = |volume: &str| json!({"kind": "PersistentVolumeClaim", "spec": {"volumeName": volume}});
        let stored: BTreeMap<ObjectKey, Arc<Value>> = [
            (ObjectKey::new("PersistentVolume", "", "kept"), Arc::new(volume("Retain"))),
            (ObjectKey::new("PersistentVolume", "", "scratch"), Arc::new(volume("Delete"))),
        ]
        .into();
        let pv = ObjectKey::new("PersistentVolume", "", "kept");
        let pvc = ObjectKey::new("PersistentVolumeClaim", "default", "data");
        let cm = ObjectKey::new("ConfigMap", "default", "c");
        let cases = [
            (&pv, volume("Retain"), false, true),
            (&pv, volume("Delete"), true, false),
            (&pvc, claim("kept"), false, true),
            (&pvc, claim("scratch"), true, true),
            (&pvc, claim(""), true, false),
            (&cm, json!({}), true, false),
        ];
        for (key, current, delete, warned) in cases {
            let (deleted, warning) = storage_prune(key, &current, &stored);
            assert_eq!((deleted, warning.is_some()), (delete, warned), "{key} {current}");
        }
    }
    use serde_json::json;

    #[test]
    fn merge_keeps_foreign_fields_and_drops_removed_ones() {
        let stored = json!({"spec": {"replicas": 5, "paused": false, "foreign": 1}, "metadata": {"labels": {"a": "1", "b": "2"}}});
        let last = json!({"spec": {"replicas": 2, "paused": false}, "metadata": {"labels": {"a": "1", "b": "2"}}});
        let desired = json!({"spec": {"replicas": 3}, "metadata": {"labels": {"a": "1"}}});
        let merged = merge(&stored, Some(&last), &desired);
        assert_eq!(merged, json!({"spec": {"replicas": 3, "foreign": 1}, "metadata": {"labels": {"a": "1"}}}));
    }

    #[test]
    fn records_copy_only_what_has_server_fields_and_compare_as_written() {
        let plain = json!({"kind": "ConfigMap", "metadata": {"name": "c", "annotations": {"a": "1"}}});
        let key = RecordKey::new([1; 32]);
        assert!(matches!(last_applied_record(&plain, &key), Cow::Borrowed(_)));
        let served =
            json!({"kind": "ConfigMap", "metadata": {"name": "c", "uid": "u", "annotations": {}}, "status": {}});
        assert_eq!(*last_applied_record(&served, &key), json!({"kind": "ConfigMap", "metadata": {"name": "c"}}));
        let text = plain.to_string();
        assert!(serializes_as(&plain, &text));
        assert!(!serializes_as(&plain, &text[..text.len() - 1]) && !serializes_as(&plain, &format!("{text} ")));
    }

    #[test]
    fn secrets_are_recorded_as_keyed_digests() {
        let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "data": {"password": "aHVudGVyMg=="}});
        let key = RecordKey::new([1; 32]);
        let record = last_applied_record(&secret, &key).to_string();
        assert!(!record.contains("aHVudGVyMg=="), "{record}");
        assert!(record.contains("hmac-sha256:"));
        // Not the plain SHA-256 a dictionary could be checked against; another key, another digest.
        let unkeyed = hex(&<Sha256 as sha2::Digest>::digest("\"aHVudGVyMg==\"".as_bytes()));
        assert!(!record.contains(&unkeyed), "{record}");
        assert_ne!(record, last_applied_record(&secret, &RecordKey::new([2; 32])).to_string());
        assert_eq!(format!("{key:?}"), "RecordKey(***)");
    }

    fn manifest(value: Value) -> Arc<Manifest> {
        let key = ObjectKey::from_value(&value).unwrap();
        Arc::new(Manifest { file: "f.yaml".into(), index: 0, line: 1, key, value, warnings: Vec::new() })
    }

    fn cm(data: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "default"}, "data": data})
    }

    fn stored_after(plan: &Plan) -> Value {
        match &plan.ops[0] {
            Op::Create(v) | Op::Update(v) => {
                let mut v = v.clone();
                v["metadata"]["resourceVersion"] = json!("7");
                v
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn the_replicas_an_hpa_sets_are_neither_drift_nor_reverted() {
        let namespaces = HashSet::from(["default".to_owned()]);
        let nodes = HashSet::new();
        let policy =
            Policy { app: "gitplane-system/a", prune: true, allow_empty: false, record_key: &RecordKey::new([1; 32]) };
        let deployment = |replicas: i64| {
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "default"},
                   "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
                            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}})
        };
        let hpa = json!({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "web", "namespace": "default"},
                         "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"}, "maxReplicas": 10}});
        let inventory = Inventory::default();
        let plan_of = |manifests: &[Arc<Manifest>], stored: &BTreeMap<ObjectKey, Arc<Value>>| {
            let cluster = Cluster {
                stored,
                inventory: &inventory,
                namespaces: &namespaces,
                nodes: &nodes,
                service_ranges: &ServiceRanges::default(),
            };
            plan(manifests, &cluster, &policy).unwrap()
        };
        // Applied without an HPA first: Git's 2 replicas, recorded.
        let mut stored = BTreeMap::new();
        let first = plan_of(&[manifest(deployment(2))], &stored);
        let key = ObjectKey::new("Deployment.apps", "default", "web");
        stored.insert(key.clone(), Arc::new(stored_after(&first)));
        // An HPA arrives and scales to 7.
        let manifests = [manifest(deployment(2)), manifest(hpa)];
        Arc::make_mut(stored.get_mut(&key).unwrap())["spec"]["replicas"] = json!(7);
        let next = plan_of(&manifests, &stored);
        assert!(next.drifted.is_empty(), "{next:?}");
        let replicas_written = next.ops.iter().any(|op| matches!(op, Op::Update(v) if v["spec"]["replicas"] != 7));
        assert!(!replicas_written, "the HPA's count stays: {next:?}");
        assert_eq!(next.warnings.len(), 1, "Git sets replicas too: {:?}", next.warnings);
        assert!(next.warnings[0].message.contains("the HorizontalPodAutoscaler's count wins"));
        // Once the record no longer holds replicas, the HPA's next scale changes nothing.
        for op in &next.ops {
            if let Op::Update(v) = op {
                let mut v = v.clone();
                v["metadata"]["resourceVersion"] = json!("8");
                stored.insert(ObjectKey::from_value(&v).unwrap(), Arc::new(v));
            }
        }
        Arc::make_mut(stored.get_mut(&key).unwrap())["spec"]["replicas"] = json!(4);
        let later = plan_of(&manifests, &stored);
        let touches_web = later.ops.iter().any(|op| op.key().is_ok_and(|k| k == key));
        assert!(!touches_web && later.drifted.is_empty(), "{later:?}");
    }

    #[test]
    fn pods_from_git_are_admitted_as_the_api_server_admits_them() {
        let namespaces = HashSet::from(["default".to_owned()]);
        let nodes = HashSet::new();
        let policy =
            Policy { app: "gitplane-system/a", prune: true, allow_empty: false, record_key: &RecordKey::new([1; 32]) };
        let inventory = Inventory::default();
        let pod = |name: &str, resources: Value| {
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
                   "spec": {"containers": [{"name": "c", "image": "i", "resources": resources}]}})
        };
        let quota = json!({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "q", "namespace": "default"},
                           "spec": {"hard": {"pods": "2", "requests.cpu": "1"}}});
        let range = json!({"apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "r", "namespace": "default"},
                           "spec": {"limits": [{"type": "Container", "defaultRequest": {"cpu": "100m"}, "default": {"cpu": "200m"}}]}});
        let small = json!({"requests": {"cpu": "100m"}});
        let stored_pod = |name: &str| {
            let mut p = pod(name, small.clone());
            p["status"] = json!({"phase": "Running"});
            (ObjectKey::new("Pod", "default", name), Arc::new(p))
        };
        // (case, the commit's objects, the stored Pods, the created Pod's resources or the error)
        type Case<'a> = (&'a str, Vec<Value>, Vec<(ObjectKey, Arc<Value>)>, Result<Value, &'a str>);
        let cases: Vec<Case> = vec![
            ("no quota, no range", vec![pod("a", json!({}))], vec![], Ok(json!({}))),
            (
                "a range in the same commit gives its defaults",
                vec![range.clone(), pod("a", json!({}))],
                vec![],
                Ok(json!({"requests": {"cpu": "100m"}, "limits": {"cpu": "200m"}})),
            ),
            ("within the quota", vec![quota.clone(), pod("a", small.clone())], vec![], Ok(small.clone())),
            (
                "a quota on cpu needs the Pod to ask for it",
                vec![quota.clone(), pod("a", json!({}))],
                vec![],
                Err("pods \"a\" is forbidden: failed quota: q: must specify requests.cpu"),
            ),
            (
                "over the stored Pods' count",
                vec![quota.clone(), pod("c", small.clone())],
                vec![stored_pod("a"), stored_pod("b")],
                Err("pods \"c\" is forbidden: exceeded quota: q, requested: pods=1, used: pods=2, limited: pods=2"),
            ),
        ];
        for (case, objects, stored, expected) in cases {
            let manifests: Vec<_> = objects.into_iter().map(manifest).collect();
            let stored: BTreeMap<ObjectKey, Arc<Value>> = stored.into_iter().collect();
            let cluster = Cluster {
                stored: &stored,
                inventory: &inventory,
                namespaces: &namespaces,
                nodes: &nodes,
                service_ranges: &ServiceRanges::default(),
            };
            let got = plan(&manifests, &cluster, &policy)
                .map(|plan| {
                    let pod = plan.ops.iter().find_map(|op| match op {
                        Op::Create(v) if v["kind"] == "Pod" => Some(v.clone()),
                        _ => None,
                    });
                    pod.map(|p| p["spec"]["containers"][0]["resources"].clone()).unwrap_or_default()
                })
                .map_err(|errors| errors.iter().map(|e| e.message.clone()).collect::<Vec<_>>().join("; "));
            match expected {
                Ok(resources) => assert_eq!(got, Ok(resources), "{case}"),
                Err(message) => {
                    let got = got.expect_err(case);
                    assert!(got.starts_with(message), "{case}: {got}");
                }
            }
        }
    }

    #[test]
    fn a_second_sync_of_the_same_commit_changes_nothing_and_drift_is_found() {
        let namespaces = HashSet::from(["default".to_owned()]);
        let nodes = HashSet::new();
        let policy =
            Policy { app: "gitplane-system/a", prune: true, allow_empty: false, record_key: &RecordKey::new([1; 32]) };
        let manifests = [manifest(cm(json!({"k": "v"})))];
        let mut stored = BTreeMap::new();
        let inventory = Inventory::default();
        let first = plan(
            &manifests,
            &Cluster {
                stored: &stored,
                inventory: &inventory,
                namespaces: &namespaces,
                nodes: &nodes,
                service_ranges: &ServiceRanges::default(),
            },
            &policy,
        )
        .unwrap();
        assert_eq!(first.created, 1);
        let key = manifests[0].key.clone();
        stored.insert(key.clone(), Arc::new(stored_after(&first)));
        let again = plan(
            &manifests,
            &Cluster {
                stored: &stored,
                inventory: &inventory,
                namespaces: &namespaces,
                nodes: &nodes,
                service_ranges: &ServiceRanges::default(),
            },
            &policy,
        )
        .unwrap();
        assert!(again.ops.is_empty() && again.drifted.is_empty(), "{again:?}");

        // Someone changed a managed field outside Git.
        Arc::make_mut(stored.get_mut(&key).unwrap())["data"]["k"] = json!("changed");
        let fix = plan(
            &manifests,
            &Cluster {
                stored: &stored,
                inventory: &inventory,
                namespaces: &namespaces,
                nodes: &nodes,
                service_ranges: &ServiceRanges::default(),
            },
            &policy,
        )
        .unwrap();
        assert_eq!(fix.drifted, std::slice::from_ref(&key));
        assert_eq!(stored_after(&fix)["data"]["k"], "v");
    }

    #[test]
    fn an_empty_render_does_not_prune_everything_unless_allowed() {
        let namespaces = HashSet::from(["default".to_owned()]);
        let nodes = HashSet::new();
        let policy =
            Policy { app: "gitplane-system/a", prune: true, allow_empty: false, record_key: &RecordKey::new([1; 32]) };
        let mut stored = BTreeMap::new();
        let mut owned = cm(json!({}));
        owned["metadata"]["annotations"] = json!({APPLICATION_ANNOTATION: "gitplane-system/a"});
        stored.insert(ObjectKey::from_value(&owned).unwrap(), Arc::new(owned));
        let inventory = Inventory::default();
        let cluster = Cluster {
            stored: &stored,
            inventory: &inventory,
            namespaces: &namespaces,
            nodes: &nodes,
            service_ranges: &ServiceRanges::default(),
        };
        let errors = plan(&[], &cluster, &policy).unwrap_err();
        assert!(errors[0].message.contains("spec.allowEmpty"), "{errors:?}");
        let allowed = Policy { allow_empty: true, ..policy };
        assert_eq!(plan(&[], &cluster, &allowed).unwrap().pruned, 1);
    }

    /// What the store does with a plan's writes: each gets the next revision.
    fn commit(stored: &mut BTreeMap<ObjectKey, Arc<Value>>, plan: &Plan, revision: &mut i64) -> Vec<Arc<Value>> {
        let mut committed = Vec::new();
        for op in &plan.ops {
            match op {
                Op::Create(v) | Op::Update(v) => {
                    *revision += 1;
                    let mut v = v.clone();
                    v["metadata"]["resourceVersion"] = json!(revision.to_string());
                    let v = Arc::new(v);
                    stored.insert(ObjectKey::from_value(&v).unwrap(), v.clone());
                    committed.push(v);
                }
                Op::Delete { key, .. } => drop(stored.remove(key)),
                other => panic!("unexpected {other:?}"),
            }
        }
        committed
    }

    #[test]
    fn the_inventory_limits_a_plan_to_what_changed() {
        let namespaces = HashSet::from(["default".to_owned()]);
        let nodes = HashSet::new();
        let policy =
            Policy { app: "gitplane-system/a", prune: true, allow_empty: false, record_key: &RecordKey::new([1; 32]) };
        let one = manifest(cm(json!({"k": "v"})));
        let mut two_value = cm(json!({"k": "w"}));
        two_value["metadata"]["name"] = json!("d");
        let two = manifest(two_value);
        let (mut stored, mut inventory, mut revision) = (BTreeMap::new(), Inventory::default(), 0);
        let mut sync = |manifests: &[Arc<Manifest>], stored: &mut BTreeMap<_, _>, inventory: &mut Inventory| {
            let cluster = Cluster {
                stored: &*stored,
                inventory,
                namespaces: &namespaces,
                nodes: &nodes,
                service_ranges: &ServiceRanges::default(),
            };
            let plan = plan(manifests, &cluster, &policy).unwrap();
            let committed = commit(stored, &plan, &mut revision);
            inventory.record(&plan, committed.iter().map(|o| &**o), policy.prune);
            plan
        };
        let first = sync(&[one.clone(), two.clone()], &mut stored, &mut inventory);
        assert!(first.full && first.created == 2);

        // Nothing changed: nothing is even compared.
        let again = sync(&[one.clone(), two.clone()], &mut stored, &mut inventory);
        assert!(!again.full && again.ops.is_empty() && again.unchanged() == 0, "{again:?}");

        // A write by someone else is compared (and undone) at the next plan.
        let key = one.key.clone();
        Arc::make_mut(stored.get_mut(&key).unwrap())["data"]["k"] = json!("changed");
        inventory.touched(&key, Some(99));
        let fix = sync(&[one.clone(), two.clone()], &mut stored, &mut inventory);
        assert_eq!((fix.updated, fix.drifted.as_slice()), (1, std::slice::from_ref(&key)));

        // A full plan trusts objects still at the revision it recorded, compares the others.
        inventory.distrust();
        Arc::make_mut(stored.get_mut(&two.key).unwrap())["metadata"]["resourceVersion"] = json!("98");
        let full = sync(&[one.clone(), two.clone()], &mut stored, &mut inventory);
        assert!(full.full && full.ops.is_empty() && full.unchanged() == 2, "{full:?}");

        // A manifest that left Git is pruned without a scan of the store.
        let pruned = sync(std::slice::from_ref(&two), &mut stored, &mut inventory);
        assert!(!pruned.full && pruned.pruned == 1 && !stored.contains_key(&key), "{pruned:?}");
        assert!(!inventory.objects.contains_key(&key));
    }

    #[test]
    fn a_verdicts_inventory_follows_objects_its_plans_never_saw() {
        let namespaces = HashSet::from(["default".to_owned()]);
        let nodes = HashSet::new();
        let policy =
            Policy { app: "gitplane-system/a", prune: true, allow_empty: false, record_key: &RecordKey::new([1; 32]) };
        let one = manifest(cm(json!({"k": "v"})));
        let (mut stored, mut inventory, mut revision) = (BTreeMap::new(), Inventory::default(), 0);
        let plan_of = |manifests: &[Arc<Manifest>], stored: &BTreeMap<_, _>, inventory: &Inventory| {
            let cluster = Cluster {
                stored,
                inventory,
                namespaces: &namespaces,
                nodes: &nodes,
                service_ranges: &ServiceRanges::default(),
            };
            plan(manifests, &cluster, &policy).unwrap()
        };
        // The sync applied `one`; a verdict plans the same commit in full and trusts it after.
        let applied = plan_of(std::slice::from_ref(&one), &stored, &Inventory::default());
        commit(&mut stored, &applied, &mut revision);
        let first = plan_of(std::slice::from_ref(&one), &stored, &inventory);
        assert!(first.full && first.ops.is_empty());
        inventory.record(&first, [], false);
        assert_eq!(plan_of(std::slice::from_ref(&one), &stored, &inventory).unchanged(), 0);

        // The sync of a commit no verdict judged made `d`; the next commit drops it: pruned.
        let mut d = cm(json!({}));
        d["metadata"]["name"] = json!("d");
        let d = manifest(d);
        let made = plan_of(&[one.clone(), d.clone()], &stored, &Inventory::default());
        let written = commit(&mut stored, &made, &mut revision);
        for object in &written {
            inventory.observed(&ObjectKey::from_value(object).unwrap(), resource_version(object), true);
        }
        let next = plan_of(std::slice::from_ref(&one), &stored, &inventory);
        assert!(!next.full && next.pruned == 1, "{next:?}");
        // Recorded as not written: still a candidate until it is gone, then forgotten.
        inventory.record(&next, [], false);
        assert_eq!(plan_of(std::slice::from_ref(&one), &stored, &inventory).pruned, 1);
        stored.remove(&d.key);
        inventory.observed(&d.key, None, true);
        assert!(!inventory.objects.contains_key(&d.key));
        assert_eq!(plan_of(std::slice::from_ref(&one), &stored, &inventory).pruned, 0);
    }
}
