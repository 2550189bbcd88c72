//! What gitplane's node agent can run of a Pod (a bare Pod, or the template of a Deployment,
//! ReplicaSet, StatefulSet, DaemonSet, ReplicationController, Job or CronJob): a field it would ignore, or fail on when the Pod starts, is rejected at
//! commit time instead, so that what is Synced can run.
//!
//! [`UNSUPPORTED`] is the one list of such fields. When the agent learns one, its row goes.
//! Volume sources whose plugins the nodes lack (nfs, csi, cloud disks) are the exception: the
//! API server accepts them and the kubelet fails at mount, so they are warned of instead
//! ([`unmountable_volumes`]).

use super::Problem;
use crate::locate::escape;
use gitplane_api::{
    quantity::{format_milli, parse_milli},
    volumes::{UNMOUNTABLE_SOURCES, source_with_article, unmountable_source},
};
use serde_json::Value;
use std::collections::BTreeMap;

/// Where a kind keeps its Pod spec, if it has one.
pub(super) fn pod_spec_pointer(kind: &str) -> Option<&'static str> {
    match kind {
        "Pod" => Some("/spec"),
        "Deployment" | "ReplicaSet" | "StatefulSet" | "DaemonSet" | "ReplicationController" | "Job" => {
            Some("/spec/template/spec")
        }
        "CronJob" => Some("/spec/jobTemplate/spec/template/spec"),
        _ => None,
    }
}

/// What a field may hold for the agent to run the Pod as written.
enum Allowed {
    /// Nothing: absent, null or empty.
    Nothing,
    /// One of these JSON values (as written in JSON, e.g. `false`, `"linux"`).
    Values(&'static [&'static str]),
    /// An object with only these keys; the row's `what` names the others (`{key}`).
    Keys(&'static [&'static str]),
    /// A downward API field path the agent resolves for environment variables.
    EnvFieldPath,
}

use Allowed::{EnvFieldPath, Keys, Nothing, Values};

/// A field of a Pod spec the node agent does not carry out yet. `path` is relative to the Pod
/// spec, `/`-separated, `*` standing for every item of a list; `what` names it in the message.
struct Unsupported {
    path: &'static str,
    allowed: Allowed,
    what: &'static str,
}

const fn row(path: &'static str, allowed: Allowed, what: &'static str) -> Unsupported {
    Unsupported { path, allowed, what }
}

/// Every Pod field gitplane's node agent does not support yet (scheduling fields are the
/// scheduler's and not listed). Fields not listed are carried out as Kubernetes does. Rows under
/// `containers/` hold for `initContainers/` too; a container's `restartPolicy` (native sidecars)
/// is checked by [`restart_policy_problems`].
const UNSUPPORTED: &[Unsupported] = &[
    row("ephemeralContainers", Nothing, "ephemeralContainers"),
    row("activeDeadlineSeconds", Nothing, "activeDeadlineSeconds"),
    row("enableServiceLinks", Values(&["false"]), "enableServiceLinks (no Service variables are set)"),
    row("hostUsers", Values(&["true"]), "hostUsers (user namespaces)"),
    row("os/name", Values(&["\"linux\""]), "os.name"),
    row("overhead", Nothing, "overhead"),
    row("readinessGates", Nothing, "readinessGates"),
    row("resourceClaims", Nothing, "resourceClaims"),
    row("resources/claims", Nothing, "Pod-level resources.claims"),
    row("runtimeClassName", Nothing, "runtimeClassName"),
    row("setHostnameAsFQDN", Values(&["false"]), "setHostnameAsFQDN"),
    row(
        "securityContext/fsGroupChangePolicy",
        Values(&["\"Always\"", "\"OnRootMismatch\""]),
        "securityContext.fsGroupChangePolicy",
    ),
    row("securityContext/seLinuxOptions", Nothing, "securityContext.seLinuxOptions"),
    row("securityContext/seLinuxChangePolicy", Nothing, "securityContext.seLinuxChangePolicy"),
    row(
        "securityContext/supplementalGroupsPolicy",
        Values(&["\"Merge\""]),
        "securityContext.supplementalGroupsPolicy (containerd 1.6's CRI on the node always adds the groups the \
         image's /etc/group lists)",
    ),
    row(
        "volumes/*",
        Keys(&[
            "name",
            "emptyDir",
            "hostPath",
            "configMap",
            "secret",
            "downwardAPI",
            "projected",
            "persistentVolumeClaim",
        ]),
        "a {key} volume",
    ),
    row(
        "volumes/*/projected/sources/*",
        Keys(&["configMap", "secret", "downwardAPI", "serviceAccountToken"]),
        "a projected {key} source",
    ),
    row("volumes/*/emptyDir/medium", Values(&["\"\"", "\"Memory\""]), "emptyDir.medium"),
    row("containers/*/env/*/valueFrom/fieldRef/fieldPath", EnvFieldPath, "fieldRef.fieldPath"),
    row("containers/*/lifecycle", Keys(&["postStart", "preStop"]), "lifecycle.{key}"),
    row("containers/*/lifecycle/postStart", Keys(&["exec"]), "a postStart {key} hook"),
    row("containers/*/lifecycle/preStop", Keys(&["exec"]), "a preStop {key} hook"),
    row("containers/*/resources/claims", Nothing, "resources.claims"),
    row("containers/*/securityContext/procMount", Values(&["\"Default\""]), "securityContext.procMount"),
    row("containers/*/securityContext/seLinuxOptions", Nothing, "securityContext.seLinuxOptions"),
    row("containers/*/terminationMessagePath", Values(&["\"/dev/termination-log\""]), "terminationMessagePath"),
    row("containers/*/terminationMessagePolicy", Values(&["\"File\""]), "terminationMessagePolicy"),
    row("containers/*/volumeDevices", Nothing, "volumeDevices"),
    row("containers/*/volumeMounts/*/subPathExpr", Nothing, "subPathExpr"),
    row("containers/*/volumeMounts/*/recursiveReadOnly", Values(&["\"Disabled\""]), "recursiveReadOnly"),
];

/// The downward API fields the agent resolves for environment variables (all that Kubernetes
/// allows there, besides `metadata.labels['…']` and `metadata.annotations['…']`).
const ENV_FIELD_PATHS: [&str; 9] = [
    "metadata.name",
    "metadata.namespace",
    "metadata.uid",
    "spec.nodeName",
    "spec.serviceAccountName",
    "status.hostIP",
    "status.hostIPs",
    "status.podIP",
    "status.podIPs",
];

fn env_field_path_supported(path: &str) -> bool {
    let keyed = |prefix: &str| path.strip_prefix(prefix).is_some_and(|rest| rest.ends_with("']") && rest.len() > 2);
    ENV_FIELD_PATHS.contains(&path) || keyed("metadata.labels['") || keyed("metadata.annotations['")
}

const NOT_YET: &str = "is not supported by gitplane's node agent yet";

/// Everything in the Pod spec at `at` (a JSON pointer) that the node agent cannot run as written;
/// `claims` name the volumes a StatefulSet adds from its claim templates.
pub(super) fn problems(spec: &Value, at: &str, claims: &[&str]) -> Vec<Problem> {
    let mut problems = Vec::new();
    for row in UNSUPPORTED {
        let mut segments: Vec<&str> = row.path.split('/').collect();
        for (pointer, value) in matches(spec, at.to_owned(), &segments) {
            problems.extend(check(row, pointer, value));
        }
        if segments[0] == "containers" {
            segments[0] = "initContainers";
            for (pointer, value) in matches(spec, at.to_owned(), &segments) {
                problems.extend(check(row, pointer, value));
            }
        }
    }
    problems.extend(mount_problems(spec, at, claims));
    problems.extend(quantity_problems(spec, at));
    problems.extend(resource_name_problems(spec, at));
    problems.extend(restart_policy_problems(spec, at));
    problems.extend(lifecycle_problems(spec, at));
    problems.extend(probe_problems(spec, at));
    problems.extend(volume_problems(spec, at));
    problems.extend(identity_problems(spec, at));
    problems.extend(security_profile_problems(spec, at));
    problems.extend(pod_resources_problems(spec, at));
    problems.extend(resize_policy_problems(spec, at));
    problems
}

/// The Pod's volumes whose source the nodes cannot mount: accepted, as the API server accepts
/// them, with a warning each; the node agent reports FailedMount and does not start the Pod.
pub(super) fn unmountable_volumes(spec: &Value, at: &str) -> Vec<Problem> {
    matches(spec, at.to_owned(), &["volumes", "*"])
        .into_iter()
        .filter_map(|(pointer, volume)| {
            let source = unmountable_source(volume)?;
            Some(Problem::at(
                format!("{pointer}/{source}"),
                format!(
                    "gitplane's nodes cannot mount {}: the Pod will not start (FailedMount); use a \
                     persistentVolumeClaim of the default local-path StorageClass, or a hostPath volume",
                    source_with_article(source)
                ),
            ))
        })
        .collect()
}

/// Fields of newer Kubernetes releases than the schema's, which gitplane does not carry out:
/// the schema would call them unknown, as if misspelt. Each gets one message naming the feature
/// and what to do instead.
const NEWER_FIELDS: [(&str, &str); 2] = [
    (
        "restartPolicyRules",
        "container restart rules (restartPolicyRules, Kubernetes 1.34) are not supported by gitplane: remove them; \
         to start the Pod afresh when a container exits, let the exit fail the Pod (restartPolicy: Never) and run \
         it from a Job or a Deployment, which makes a new Pod",
    ),
    (
        "podCertificate",
        "projected podCertificate sources (Pod certificates, Kubernetes 1.34) are not supported by gitplane: \
         remove it; mount the certificate and key from a Secret of type kubernetes.io/tls instead",
    ),
];

/// The message for a field of a newer Kubernetes than the schema's, if `field` is one.
pub(super) fn newer_field(field: &str) -> Option<&'static str> {
    NEWER_FIELDS.iter().find(|(name, _)| *name == field).map(|(_, message)| *message)
}

/// What to do instead of a volume type the agent cannot mount, where there is a way.
const VOLUME_ALTERNATIVES: [(&str, &str); 1] = [(
    "image",
    "the nodes' containerd (1.6) has no image volumes; copy the files out of the image into an emptyDir with \
     an init container instead (image: the volume's reference, command: [cp, -a, <dir>/., /out], mounting the \
     emptyDir at /out)",
)];

/// The resources Pod-level resources may name (upstream's, but for hugepages, which gitplane's
/// nodes do not offer).
const POD_LEVEL_RESOURCES: [&str; 2] = ["cpu", "memory"];

/// Pod-level resources (`spec.resources`, Kubernetes 1.34): the scheduler counts the requests,
/// as kube-scheduler does. Limits would be the pod cgroup's, which containerd 1.6's CRI does not
/// set (it only passes sandbox resources on as annotations) and the agent does not write.
fn pod_resources_problems(spec: &Value, at: &str) -> Vec<Problem> {
    let resources = &spec["resources"];
    let mut problems = Vec::new();
    if resources["limits"].as_object().is_some_and(|l| !l.is_empty()) {
        problems.push(Problem::at(
            format!("{at}/resources/limits"),
            "Pod-level limits are not supported by gitplane's node agent: containerd 1.6's CRI on the nodes \
             enforces limits per container only; set limits on each container instead (Pod-level requests are \
             supported)",
        ));
    }
    let Some(requests) = resources["requests"].as_object() else {
        return problems;
    };
    let aggregate = container_requests(spec);
    for (name, value) in requests {
        let here = format!("{at}/resources/requests/{}", escape(name));
        if !POD_LEVEL_RESOURCES.contains(&name.as_str()) {
            problems.push(Problem::at(
                here,
                format!("Pod-level resources take cpu and memory only: set {name} on the containers instead"),
            ));
            continue;
        }
        let Some(request) = quantity(value) else {
            problems.push(Problem::at(
                here,
                format!("{value} is not a quantity: write e.g. 250m or 0.5 (cpu), 64Mi or 1G (memory)"),
            ));
            continue;
        };
        if let Some(&sum) = aggregate.get(name.as_str())
            && request < sum
        {
            problems.push(Problem::at(
                here,
                format!(
                    "the Pod's {name} request {value} is less than its containers' {} together: raise it, or \
                     lower theirs",
                    format_milli(sum, name == "memory")
                ),
            ));
        }
    }
    problems
}

fn quantity(value: &Value) -> Option<i128> {
    match value {
        Value::String(s) => parse_milli(s),
        Value::Number(n) => parse_milli(&n.to_string()),
        _ => None,
    }
}

/// The containers' cpu and memory requests together, as upstream's validation of Pod-level
/// resources adds them: the containers and sidecars, or an init container with the sidecars
/// before it if that is more. A container without a request counts its limit.
fn container_requests(spec: &Value) -> BTreeMap<&'static str, i128> {
    let request = |c: &Value, name: &str| {
        quantity(&c["resources"]["requests"][name]).or_else(|| quantity(&c["resources"]["limits"][name]))
    };
    let mut sums = BTreeMap::new();
    for name in POD_LEVEL_RESOURCES {
        let (mut total, mut any) = (0, false);
        for c in spec["containers"].as_array().into_iter().flatten() {
            any |= request(c, name).is_some();
            total += request(c, name).unwrap_or(0);
        }
        let (mut sidecars, mut peak) = (0, 0);
        for c in spec["initContainers"].as_array().into_iter().flatten() {
            any |= request(c, name).is_some();
            let r = request(c, name).unwrap_or(0);
            if c["restartPolicy"] == "Always" {
                sidecars += r;
                peak = peak.max(sidecars);
            } else {
                peak = peak.max(sidecars + r);
            }
        }
        if any {
            sums.insert(name, (total + sidecars).max(peak));
        }
    }
    sums
}

/// A container's `resizePolicy` (in-place resize): accepted as the API server accepts it. A
/// resources change from Git restarts the container whatever the policy says (the node agent
/// has no in-place resize); see docs/decisions.md.
fn resize_policy_problems(spec: &Value, at: &str) -> Vec<Problem> {
    let mut problems = Vec::new();
    for list in ["containers", "initContainers"] {
        for (pointer, container) in matches(spec, at.to_owned(), &[list, "*"]) {
            let Some(policies) = container["resizePolicy"].as_array().filter(|p| !p.is_empty()) else {
                continue;
            };
            let here = format!("{pointer}/resizePolicy");
            if list == "initContainers" && container["restartPolicy"] != "Always" {
                problems.push(Problem::at(
                    here,
                    "resizePolicy is not allowed on an init container (only on containers and sidecars): remove it",
                ));
                continue;
            }
            let mut seen = Vec::new();
            for (i, policy) in policies.iter().enumerate() {
                if let Some(name) = policy["resourceName"].as_str() {
                    if !POD_LEVEL_RESOURCES.contains(&name) {
                        problems.push(Problem::at(
                            format!("{here}/{i}/resourceName"),
                            format!("{name:?} cannot be resized: use cpu or memory"),
                        ));
                    } else if seen.contains(&name) {
                        problems.push(Problem::at(
                            format!("{here}/{i}/resourceName"),
                            format!("{name} has a resize policy already: keep one"),
                        ));
                    }
                    seen.push(name);
                }
                if let Some(restart) = policy["restartPolicy"].as_str()
                    && !["NotRequired", "RestartContainer"].contains(&restart)
                {
                    problems.push(Problem::at(
                        format!("{here}/{i}/restartPolicy"),
                        format!("{restart:?} is not a resize restart policy: use NotRequired or RestartContainer"),
                    ));
                }
            }
        }
    }
    problems
}

/// A seccomp or AppArmor profile as the API server validates it: a known type; `Localhost` with
/// a `localhostProfile` (for seccomp a path below the node's profile directory, without `..`),
/// and no `localhostProfile` with any other type.
fn security_profile_problems(spec: &Value, at: &str) -> Vec<Problem> {
    let mut problems = Vec::new();
    let places: [&[&str]; 3] =
        [&["securityContext"], &["containers", "*", "securityContext"], &["initContainers", "*", "securityContext"]];
    for place in places {
        for (pointer, context) in matches(spec, at.to_owned(), place) {
            for field in ["seccompProfile", "appArmorProfile"] {
                let profile = &context[field];
                if profile.is_null() {
                    continue;
                }
                let at = format!("{pointer}/{field}");
                let kind = profile["type"].as_str().unwrap_or_default();
                let localhost = &profile["localhostProfile"];
                if !["RuntimeDefault", "Unconfined", "Localhost"].contains(&kind) {
                    problems.push(Problem::at(
                        format!("{at}/type"),
                        format!("{field}.type {kind:?} is not one of RuntimeDefault, Unconfined, Localhost"),
                    ));
                } else if kind != "Localhost" && !localhost.is_null() {
                    problems.push(Problem::at(
                        format!("{at}/localhostProfile"),
                        "localhostProfile is for type Localhost only: remove it or set type: Localhost".to_owned(),
                    ));
                } else if kind == "Localhost" {
                    let name = localhost.as_str().unwrap_or_default();
                    let why = if name.is_empty() {
                        Some("must be set with type Localhost")
                    } else if field == "seccompProfile" && name.starts_with('/') {
                        Some("must be a path relative to the node's seccomp profile directory")
                    } else if field == "seccompProfile" && name.split('/').any(|part| part == "..") {
                        Some("must not contain '..': the profile stays inside the node's seccomp profile directory")
                    } else {
                        None
                    };
                    if let Some(why) = why {
                        problems.push(Problem::at(
                            format!("{at}/localhostProfile"),
                            format!("localhostProfile {name:?} {why}"),
                        ));
                    }
                }
            }
        }
    }
    problems
}

/// `hostname` and `subdomain` are DNS labels, as the API server checks: the Pod is named
/// `<hostname>.<subdomain>.<namespace>.svc.<domain>` in cluster DNS.
fn identity_problems(spec: &Value, at: &str) -> Vec<Problem> {
    ["hostname", "subdomain"]
        .into_iter()
        .filter_map(|field| {
            let value = spec[field].as_str()?;
            let label = !value.is_empty()
                && value.len() <= 63
                && value.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !value.starts_with('-')
                && !value.ends_with('-');
            (!label).then(|| {
                Problem::at(
                    format!("{at}/{field}"),
                    format!(
                        "{field} {value:?} is not a DNS label: at most 63 lower case letters, digits or '-', \
                         starting and ending with a letter or digit, e.g. 'web-0'"
                    ),
                )
            })
        })
        .collect()
}

/// A container's `restartPolicy`: the API server allows it on init containers only, as `Always`
/// (a native sidecar: started in order among the init containers, kept running beside the app
/// containers, stopped after them).
fn restart_policy_problems(spec: &Value, at: &str) -> Vec<Problem> {
    let mut problems = Vec::new();
    for (pointer, policy) in matches(spec, at.to_owned(), &["containers", "*", "restartPolicy"]) {
        if !policy.is_null() {
            problems.push(Problem::at(
                pointer,
                "restartPolicy is for init containers only (the Pod's restartPolicy applies here): remove it",
            ));
        }
    }
    for (pointer, policy) in matches(spec, at.to_owned(), &["initContainers", "*", "restartPolicy"]) {
        if !policy.is_null() && policy != "Always" {
            problems.push(Problem::at(
                pointer,
                format!(
                    "restartPolicy {policy} is not allowed on an init container: set Always (a sidecar) or remove it"
                ),
            ));
        }
    }
    problems
}

/// What the API server refuses of the Pod's lifecycle: a negative grace period, and hooks or
/// probes on an init container (it runs to completion; only sidecars may have them).
fn lifecycle_problems(spec: &Value, at: &str) -> Vec<Problem> {
    let mut problems = Vec::new();
    let grace = &spec["terminationGracePeriodSeconds"];
    if grace.as_i64().is_some_and(|g| g < 0) {
        problems.push(Problem::at(
            format!("{at}/terminationGracePeriodSeconds"),
            format!("{grace} is negative: give the seconds a Pod may take to stop (0 or more; 30 if unset)"),
        ));
    }
    for field in ["lifecycle", "livenessProbe", "readinessProbe", "startupProbe"] {
        for (pointer, value) in matches(spec, at.to_owned(), &["initContainers", "*", field]) {
            // A sidecar may have them.
            let container = pointer.rsplit_once('/').and_then(|(c, _)| c.strip_prefix(at)).unwrap_or_default();
            let sidecar = spec.pointer(container).is_some_and(|c| c["restartPolicy"] == "Always");
            if !is_empty(value) && !sidecar {
                problems.push(Problem::at(pointer, format!("{field} is not allowed in an init container: remove it")));
            }
        }
    }
    problems
}

/// A file mode of a volume: 0 to 0777 (the API server's check). JSON and YAML write it in
/// decimal (YAML also as `0644`, which is octal there).
fn mode_problem(pointer: String, value: &Value) -> Option<Problem> {
    let mode = value.as_i64()?;
    (!(0..=0o777).contains(&mode)).then(|| {
        Problem::at(
            pointer,
            format!("mode {mode} is out of range: write a value between 0 and 0777 (octal), e.g. 0644"),
        )
    })
}

/// A file path of a volume item: relative, without '..' (the API server's check).
fn path_problem(pointer: String, value: &Value) -> Option<Problem> {
    let path = value.as_str()?;
    let why = if path.is_empty() {
        "must not be empty"
    } else if path.starts_with('/') {
        "must be a relative path"
    } else if path.split('/').any(|part| part == "..") || path.starts_with("..") {
        "must not contain '..' nor start with '..'"
    } else {
        return None;
    };
    Some(Problem::at(pointer, format!("path {path:?} {why}: files stay inside their volume")))
}

/// The values of a hostPath volume's `type` (the API server's).
const HOST_PATH_TYPES: [&str; 8] =
    ["", "DirectoryOrCreate", "Directory", "FileOrCreate", "File", "Socket", "CharDevice", "BlockDevice"];

/// The resources a `resourceFieldRef` may name on this node.
const RESOURCE_FIELDS: [&str; 4] = ["limits.cpu", "limits.memory", "requests.cpu", "requests.memory"];

/// The Pod fields a downwardAPI volume may hold.
fn volume_field_path_supported(path: &str) -> bool {
    let keyed = |prefix: &str| path.strip_prefix(prefix).is_some_and(|rest| rest.ends_with("']") && rest.len() > 2);
    ["metadata.name", "metadata.namespace", "metadata.uid", "metadata.labels", "metadata.annotations"].contains(&path)
        || keyed("metadata.labels['")
        || keyed("metadata.annotations['")
}

fn resource_field_problem(pointer: String, selector: &Value, needs_container: bool) -> Vec<Problem> {
    let mut problems = Vec::new();
    if let Some(resource) = selector["resource"].as_str()
        && !RESOURCE_FIELDS.contains(&resource)
    {
        problems.push(Problem::at(
            format!("{pointer}/resource"),
            format!("resource {resource:?} {NOT_YET}: use one of {}", RESOURCE_FIELDS.join(", ")),
        ));
    }
    if let Some(divisor) = selector.get("divisor") {
        let text = match divisor {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        if parse_milli(&text).is_none_or(|d| d <= 0) {
            problems.push(Problem::at(format!("{pointer}/divisor"), format!("{divisor} is not a positive quantity")));
        }
    }
    if needs_container && selector["containerName"].as_str().is_none_or(str::is_empty) {
        problems.push(Problem::at(pointer, "a downwardAPI volume's resourceFieldRef needs containerName"));
    }
    problems
}

/// Bad values in configMap, secret, downwardAPI and emptyDir volumes and in env
/// resourceFieldRefs: paths that leave the volume, modes out of range, fields the node cannot
/// give, sizes that are not quantities.
fn volume_problems(spec: &Value, at: &str) -> Vec<Problem> {
    let mut problems = Vec::new();
    for source in ["configMap", "secret", "downwardAPI"] {
        for (pointer, volume) in matches(spec, at.to_owned(), &["volumes", "*", source]) {
            problems.extend(mode_problem(format!("{pointer}/defaultMode"), &volume["defaultMode"]));
            for (i, item) in volume["items"].as_array().into_iter().flatten().enumerate() {
                let item_at = format!("{pointer}/items/{i}");
                problems.extend(path_problem(format!("{item_at}/path"), &item["path"]));
                problems.extend(mode_problem(format!("{item_at}/mode"), &item["mode"]));
                if let Some(path) = item["fieldRef"]["fieldPath"].as_str()
                    && !volume_field_path_supported(path)
                {
                    problems.push(Problem::at(
                        format!("{item_at}/fieldRef/fieldPath"),
                        format!(
                            "fieldPath {path:?} is not supported in a downwardAPI volume: use metadata.name, \
                             metadata.namespace, metadata.uid, metadata.labels, metadata.annotations or one key of them"
                        ),
                    ));
                }
                if item["resourceFieldRef"].is_object() {
                    problems.extend(resource_field_problem(
                        format!("{item_at}/resourceFieldRef"),
                        &item["resourceFieldRef"],
                        true,
                    ));
                }
            }
        }
    }
    for (pointer, type_) in matches(spec, at.to_owned(), &["volumes", "*", "hostPath", "type"]) {
        if let Some(type_) = type_.as_str()
            && !HOST_PATH_TYPES.contains(&type_)
        {
            problems.push(Problem::at(
                pointer,
                format!(
                    "{type_:?} is not a hostPath type: use one of {}, or \"\" for no check",
                    HOST_PATH_TYPES[1..].join(", ")
                ),
            ));
        }
    }
    for (pointer, size) in matches(spec, at.to_owned(), &["volumes", "*", "emptyDir", "sizeLimit"]) {
        let text = match size {
            Value::String(s) => s.clone(),
            Value::Null => continue,
            other => other.to_string(),
        };
        if parse_milli(&text).is_none() {
            problems.push(Problem::at(pointer, format!("{size} is not a quantity: write e.g. 64Mi or 1Gi")));
        }
    }
    for (pointer, selector) in
        matches(spec, at.to_owned(), &["containers", "*", "env", "*", "valueFrom", "resourceFieldRef"])
    {
        problems.extend(resource_field_problem(pointer, selector, false));
    }
    problems
}

/// The values at a row's path, each with its pointer.
fn matches<'a>(value: &'a Value, pointer: String, segments: &[&str]) -> Vec<(String, &'a Value)> {
    let Some((first, rest)) = segments.split_first() else {
        return vec![(pointer, value)];
    };
    match (*first, value) {
        ("*", Value::Array(items)) => {
            items.iter().enumerate().flat_map(|(i, item)| matches(item, format!("{pointer}/{i}"), rest)).collect()
        }
        (field, Value::Object(map)) => match map.get(field) {
            Some(child) => matches(child, format!("{pointer}/{}", escape(field)), rest),
            None => Vec::new(),
        },
        _ => Vec::new(),
    }
}

fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Array(items) => items.is_empty(),
        Value::Object(map) => map.is_empty(),
        _ => false,
    }
}

fn check(row: &Unsupported, pointer: String, value: &Value) -> Vec<Problem> {
    let what = row.what;
    match &row.allowed {
        Nothing if is_empty(value) => Vec::new(),
        Nothing => vec![Problem::at(pointer, format!("{what} {NOT_YET}: remove it"))],
        Values(allowed) if value.is_null() || allowed.contains(&value.to_string().as_str()) => Vec::new(),
        Values(allowed) => vec![Problem::at(
            pointer,
            format!("{what} {value} {NOT_YET}: remove it, or set it to {}", allowed.join(" or ")),
        )],
        Keys(allowed) => value
            .as_object()
            .into_iter()
            .flatten()
            // A field of a newer Kubernetes is the schema's to report, once; a volume the nodes
            // cannot mount is a warning (`unmountable_volumes`).
            .filter(|(key, v)| !allowed.contains(&key.as_str()) && !v.is_null() && newer_field(key).is_none())
            .filter(|(key, _)| row.path != "volumes/*" || !UNMOUNTABLE_SOURCES.contains(&key.as_str()))
            .map(|(key, _)| {
                let at = format!("{pointer}/{}", escape(key));
                let what = name_key(what, key);
                match VOLUME_ALTERNATIVES.iter().find(|(k, _)| row.path == "volumes/*" && k == key) {
                    Some((_, instead)) => Problem::at(at, format!("{what} is not supported: {instead}")),
                    None => {
                        let others: Vec<_> = allowed.iter().filter(|k| **k != "name").copied().collect();
                        Problem::at(at, format!("{what} {NOT_YET} (it supports {})", others.join(", ")))
                    }
                }
            })
            .collect(),
        EnvFieldPath => match value.as_str() {
            Some(path) if env_field_path_supported(path) => Vec::new(),
            _ => vec![Problem::at(
                pointer,
                format!(
                    "{what} {value} {NOT_YET}: use one of {}, metadata.labels['<key>'], metadata.annotations['<key>']",
                    ENV_FIELD_PATHS.join(", ")
                ),
            )],
        },
    }
}

/// What the API server refuses of volume mounts, and the agent would fail on: a mount of no
/// volume of the Pod, a subPath that leaves the volume.
fn mount_problems(spec: &Value, at: &str, claims: &[&str]) -> Vec<Problem> {
    let volumes: Vec<&str> = spec["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v["name"].as_str())
        .chain(claims.iter().copied())
        .collect();
    let mut problems = Vec::new();
    let mounts = ["containers", "initContainers"]
        .into_iter()
        .flat_map(|list| matches(spec, at.to_owned(), &[list, "*", "volumeMounts", "*"]));
    for (pointer, mount) in mounts {
        if let Some(name) = mount["name"].as_str()
            && !volumes.contains(&name)
        {
            problems.push(Problem::at(
                format!("{pointer}/name"),
                format!("{name:?} names no volume of the Pod: add it to spec.volumes, or fix the name"),
            ));
        }
        if let Some(sub) = mount["subPath"].as_str()
            && (sub.starts_with('/') || sub.split('/').any(|part| part == ".."))
        {
            problems.push(Problem::at(
                format!("{pointer}/subPath"),
                format!("{sub:?} must be a relative path inside the volume, without '..'"),
            ));
        }
    }
    problems
}

/// An extended resource's name: `<domain>/<name>` outside Kubernetes' own domain.
fn is_extended_resource(name: &str) -> bool {
    name.split_once('/').is_some_and(|(domain, short)| {
        domain.contains('.') && !short.is_empty() && domain != "kubernetes.io" && !domain.ends_with(".kubernetes.io")
    })
}

/// Resources the node cannot give or count, and extended resources as the API server checks
/// them: whole counts, limits set and equal to requests (they cannot be overcommitted).
fn resource_name_problems(spec: &Value, at: &str) -> Vec<Problem> {
    let mut problems = Vec::new();
    let quantity = |v: &Value| match v {
        Value::String(s) => parse_milli(s),
        Value::Number(n) => parse_milli(&n.to_string()),
        _ => None,
    };
    for containers in ["containers", "initContainers"] {
        for (pointer, resources) in matches(spec, at.to_owned(), &[containers, "*", "resources"]) {
            for list in ["limits", "requests"] {
                for (name, value) in resources[list].as_object().into_iter().flatten() {
                    let here = format!("{pointer}/{list}/{}", escape(name));
                    if ["cpu", "memory", "ephemeral-storage"].contains(&name.as_str()) {
                        continue;
                    }
                    if !is_extended_resource(name) {
                        problems.push(Problem::at(
                            here,
                            format!(
                                "resource {name} {NOT_YET} (it supports cpu, memory, ephemeral-storage \
                                 and extended resources such as example.com/foo)"
                            ),
                        ));
                    } else if quantity(value).is_some_and(|m| m % 1000 != 0) {
                        problems.push(Problem::at(
                            here,
                            format!("{value} is not a whole number of {name}: use a whole count"),
                        ));
                    } else if list == "requests" && quantity(value) != quantity(&resources["limits"][name]) {
                        problems.push(Problem::at(
                            here,
                            format!(
                                "{name} cannot be overcommitted: set limits.{name} to the same count as the request"
                            ),
                        ));
                    }
                }
            }
        }
    }
    problems
}

/// Container resources the agent cannot read as quantities.
fn quantity_problems(spec: &Value, at: &str) -> Vec<Problem> {
    let mut problems = Vec::new();
    let lists = ["containers", "initContainers"].into_iter().flat_map(|c| ["limits", "requests"].map(|l| (c, l)));
    for (containers, list) in lists {
        for (pointer, resources) in matches(spec, at.to_owned(), &[containers, "*", "resources", list]) {
            for (name, quantity) in resources.as_object().into_iter().flatten() {
                let text = match quantity {
                    Value::String(s) => s.clone(),
                    Value::Number(n) => n.to_string(),
                    _ => continue, // the schema's error
                };
                if parse_milli(&text).is_none() {
                    problems.push(Problem::at(
                        format!("{pointer}/{}", escape(name)),
                        format!("{quantity} is not a quantity: write e.g. 250m or 0.5 (cpu), 64Mi or 1G (memory)"),
                    ));
                }
            }
        }
    }
    problems
}

/// The probes and whether each must have `successThreshold: 1`.
const PROBES: [(&str, bool); 3] = [("livenessProbe", true), ("readinessProbe", false), ("startupProbe", true)];
const HANDLERS: [&str; 4] = ["exec", "httpGet", "tcpSocket", "grpc"];
/// Timing fields and their defaults (`0` takes the default too, as the API server defaults it).
const TIMINGS: [(&str, u32); 5] = [
    ("initialDelaySeconds", 0),
    ("timeoutSeconds", 1),
    ("periodSeconds", 10),
    ("successThreshold", 1),
    ("failureThreshold", 3),
];

/// What the API server refuses of probes (no handler or several, negative timings, a
/// successThreshold other than 1 where only 1 makes sense), and what the agent could never
/// probe: a port name the container does not declare (the API server accepts it, and the
/// kubelet's probe then fails at every period), a scheme it does not speak.
fn probe_problems(spec: &Value, at: &str) -> Vec<Problem> {
    let mut problems = Vec::new();
    for (pointer, container) in matches(spec, at.to_owned(), &["containers", "*"]) {
        let ports: Vec<&str> =
            container["ports"].as_array().into_iter().flatten().filter_map(|p| p["name"].as_str()).collect();
        let name = container["name"].as_str().unwrap_or_default();
        for (field, only_one_success) in PROBES {
            let probe = &container[field];
            if !probe.is_object() {
                continue; // absent, or the schema's error
            }
            let here = format!("{pointer}/{field}");
            let handlers: Vec<&str> = HANDLERS.iter().copied().filter(|h| !probe[*h].is_null()).collect();
            match handlers.as_slice() {
                [] => problems.push(Problem::at(
                    here.clone(),
                    format!("{field} has no handler: set one of {}", HANDLERS.join(", ")),
                )),
                [_] => {}
                several => problems.push(Problem::at(
                    here.clone(),
                    format!("{field} has {} handlers ({}): keep one", several.len(), several.join(", ")),
                )),
            }
            for (timing, default) in TIMINGS {
                if let Some(value) = probe[timing].as_i64()
                    && value < 0
                {
                    problems.push(Problem::at(
                        format!("{here}/{timing}"),
                        format!("{timing} must not be negative (it is {value}): set a positive number, or remove it for the default ({default})"),
                    ));
                }
            }
            if only_one_success
                && let Some(value) = probe["successThreshold"].as_i64()
                && value > 1
            {
                problems.push(Problem::at(
                    format!("{here}/successThreshold"),
                    format!("successThreshold must be 1 for a {field} (it is {value}): remove it, or set it to 1"),
                ));
            }
            match probe["terminationGracePeriodSeconds"].as_i64() {
                Some(_) if !only_one_success => problems.push(Problem::at(
                    format!("{here}/terminationGracePeriodSeconds"),
                    "terminationGracePeriodSeconds is for liveness and startup probes only (readiness kills nothing): remove it",
                )),
                Some(value) if value <= 0 => problems.push(Problem::at(
                    format!("{here}/terminationGracePeriodSeconds"),
                    format!("terminationGracePeriodSeconds must be greater than 0 (it is {value}): set a positive number, or remove it for the Pod's"),
                )),
                _ => {}
            }
            for handler in ["httpGet", "tcpSocket", "grpc"] {
                let port = &probe[handler]["port"];
                let at = format!("{here}/{handler}/port");
                match port {
                    Value::String(text) if handler != "grpc" && text.parse::<i64>().is_err() => {
                        if !ports.contains(&text.as_str()) {
                            problems.push(Problem::at(
                                at,
                                format!(
                                    "{text:?} names no port of container {name:?}: add a port named {text} to its ports, or use the port's number"
                                ),
                            ));
                        }
                    }
                    Value::Null => {}
                    _ => {
                        let number = port.as_i64().or_else(|| port.as_str().and_then(|t| t.parse().ok()));
                        if number.is_none_or(|n| !(1..=65535).contains(&n)) {
                            problems
                                .push(Problem::at(at, format!("{port} is not a port number: use one from 1 to 65535")));
                        }
                    }
                }
            }
            if let Some(scheme) = probe["httpGet"]["scheme"].as_str()
                && !["HTTP", "HTTPS"].contains(&scheme)
            {
                problems.push(Problem::at(
                    format!("{here}/httpGet/scheme"),
                    format!("scheme {scheme:?} is not a probe scheme: use HTTP or HTTPS"),
                ));
            }
            if probe["exec"].is_object() && probe["exec"]["command"].as_array().is_none_or(Vec::is_empty) {
                problems.push(Problem::at(
                    format!("{here}/exec/command"),
                    "exec needs a command: set exec.command, e.g. [cat, /tmp/healthy]",
                ));
            }
        }
    }
    problems
}

/// A row's `what` with its `{key}`, and "a" before it as English says it ("an image volume").
fn name_key(what: &str, key: &str) -> String {
    what.replace("a {key}", &format!("{} {key}", super::indefinite_article(key))).replace("{key}", key)
}
