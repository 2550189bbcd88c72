//! `kubectl get` columns: objects rendered as a `meta.k8s.io/v1` Table, the way the API server's
//! table convertors render each kind. Pure: objects in, a Table out. A row's cells are worked
//! out without the clock ([`Cell`]): the cells that count time from a timestamp keep the
//! timestamp, so a [`Row`] made once (by the list cache) is printed at any `now` for the price
//! of those durations.

use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

/// One column: its name, type and priority (1: shown only by `kubectl get -o wide`).
fn column(name: &str, kind: &str, priority: u8) -> Value {
    let format = if name == "Name" { "name" } else { "" };
    json!({"name": name, "type": kind, "format": format, "description": "", "priority": priority})
}

/// One cell of a row before `now` is known.
#[derive(Clone)]
enum Cell {
    Value(Value),
    /// The time from `at` to `now` as the API server prints it (Age, a Pod's last restart, a
    /// running Job's duration, an Event's first and last seen), between `prefix` and `suffix`.
    Since {
        at: Timestamp,
        prefix: String,
        suffix: &'static str,
    },
}

impl Cell {
    fn since(at: Timestamp) -> Cell {
        Cell::Since { at, prefix: String::new(), suffix: "" }
    }

    fn at(self, now: Timestamp) -> Value {
        match self {
            Cell::Value(v) => v,
            Cell::Since { at, prefix, suffix } => Value::String(format!("{prefix}{}{suffix}", ago(at, now))),
        }
    }
}

fn cell(v: impl Into<Value>) -> Cell {
    Cell::Value(v.into())
}

/// AGE as the API server prints it: `<unknown>` without a creation time.
fn age(created: Option<&str>) -> Cell {
    match created.and_then(|c| c.parse::<Timestamp>().ok()) {
        Some(at) => Cell::since(at),
        None => cell("<unknown>"),
    }
}

/// `5s`, `12m`, `3h4m`, `2d5h` since `at` (apimachinery's `HumanDuration`).
fn ago(at: Timestamp, now: Timestamp) -> String {
    human_duration(now.duration_since(at).as_secs())
}

fn human_duration(s: i64) -> String {
    if s < -1 {
        return "<invalid>".into();
    }
    let s = s.max(0);
    let (m, h) = (s / 60, s / 3600);
    let (d, y) = (h / 24, h / (24 * 365));
    let unit =
        |n: i64, u: &str, rest: i64, ru: &str| if rest == 0 { format!("{n}{u}") } else { format!("{n}{u}{rest}{ru}") };
    match () {
        _ if s < 120 => format!("{s}s"),
        _ if m < 10 => unit(m, "m", s % 60, "s"),
        _ if m < 180 => format!("{m}m"),
        _ if h < 8 => unit(h, "h", m % 60, "m"),
        _ if h < 48 => format!("{h}h"),
        _ if h < 24 * 8 => unit(d, "d", h % 24, "h"),
        _ if h < 24 * 365 * 2 => format!("{d}d"),
        _ if h < 24 * 365 * 8 => unit(y, "y", d % 365, "d"),
        _ => format!("{y}y"),
    }
}

fn text(v: &Value) -> String {
    v.as_str().unwrap_or("").to_owned()
}

fn or_none(v: &Value) -> String {
    v.as_str().filter(|s| !s.is_empty()).unwrap_or("<none>").to_owned()
}

fn int(v: &Value) -> i64 {
    v.as_i64().unwrap_or(0)
}

const S: &str = "string";
const I: &str = "integer";

/// The columns of a kind, as the API server's printers define them (`-o wide` adds the
/// priority 1 ones); the Name column is first unless the kind puts it elsewhere (Event).
fn columns(kind: &str) -> Vec<Value> {
    let workload = [("Containers", S, 1), ("Images", S, 1), ("Selector", S, 1)];
    let cols: Vec<(&str, &str, u8)> = match kind {
        "Pod" => vec![
            ("Name", S, 0),
            ("Ready", S, 0),
            ("Status", S, 0),
            ("Restarts", S, 0),
            ("Age", S, 0),
            ("IP", S, 1),
            ("Node", S, 1),
            ("Nominated Node", S, 1),
            ("Readiness Gates", S, 1),
        ],
        "Deployment" => [("Name", S, 0), ("Ready", S, 0), ("Up-to-date", I, 0), ("Available", I, 0), ("Age", S, 0)]
            .into_iter()
            .chain(workload)
            .collect(),
        "ReplicaSet" => [("Name", S, 0), ("Desired", I, 0), ("Current", I, 0), ("Ready", I, 0), ("Age", S, 0)]
            .into_iter()
            .chain(workload)
            .collect(),
        "ReplicationController" => {
            [("Name", S, 0), ("Desired", I, 0), ("Current", I, 0), ("Ready", I, 0), ("Age", S, 0)]
                .into_iter()
                .chain(workload)
                .collect()
        }
        "PodDisruptionBudget" => vec![
            ("Name", S, 0),
            ("Min Available", S, 0),
            ("Max Unavailable", S, 0),
            ("Allowed Disruptions", I, 0),
            ("Age", S, 0),
        ],
        "DaemonSet" => [
            ("Name", S, 0),
            ("Desired", I, 0),
            ("Current", I, 0),
            ("Ready", I, 0),
            ("Up-to-date", I, 0),
            ("Available", I, 0),
            ("Node Selector", S, 0),
            ("Age", S, 0),
        ]
        .into_iter()
        .chain(workload)
        .collect(),
        // As kubectl prints a StatefulSet: no selector column.
        "StatefulSet" => vec![("Name", S, 0), ("Ready", S, 0), ("Age", S, 0), ("Containers", S, 1), ("Images", S, 1)],
        "Job" => [("Name", S, 0), ("Status", S, 0), ("Completions", S, 0), ("Duration", S, 0), ("Age", S, 0)]
            .into_iter()
            .chain(workload)
            .collect(),
        "CronJob" => vec![
            ("Name", S, 0),
            ("Schedule", S, 0),
            ("Timezone", S, 0),
            ("Suspend", "boolean", 0),
            ("Active", I, 0),
            ("Last Schedule", S, 0),
            ("Age", S, 0),
            ("Containers", S, 1),
            ("Images", S, 1),
            ("Selector", S, 1),
        ],
        "HorizontalPodAutoscaler" => vec![
            ("Name", S, 0),
            ("Reference", S, 0),
            ("Targets", S, 0),
            ("MinPods", S, 0),
            ("MaxPods", I, 0),
            ("Replicas", I, 0),
            ("Age", S, 0),
        ],
        "Service" => vec![
            ("Name", S, 0),
            ("Type", S, 0),
            ("Cluster-IP", S, 0),
            ("External-IP", S, 0),
            ("Port(s)", S, 0),
            ("Age", S, 0),
            ("Selector", S, 1),
        ],
        "Endpoints" => vec![("Name", S, 0), ("Endpoints", S, 0), ("Age", S, 0)],
        "EndpointSlice" => {
            vec![("Name", S, 0), ("AddressType", S, 0), ("Ports", S, 0), ("Endpoints", S, 0), ("Age", S, 0)]
        }
        "Node" => vec![
            ("Name", S, 0),
            ("Status", S, 0),
            ("Roles", S, 0),
            ("Age", S, 0),
            ("Version", S, 0),
            ("Internal-IP", S, 1),
            ("External-IP", S, 1),
            ("OS-Image", S, 1),
            ("Kernel-Version", S, 1),
            ("Container-Runtime", S, 1),
        ],
        "Namespace" => vec![("Name", S, 0), ("Status", S, 0), ("Age", S, 0)],
        "ConfigMap" => vec![("Name", S, 0), ("Data", I, 0), ("Age", S, 0)],
        "Secret" => vec![("Name", S, 0), ("Type", S, 0), ("Data", I, 0), ("Age", S, 0)],
        "ServiceAccount" => vec![("Name", S, 0), ("Secrets", I, 0), ("Age", S, 0)],
        "Role" | "ClusterRole" | "LimitRange" => vec![("Name", S, 0), ("Created At", S, 0)],
        "ResourceQuota" => vec![("Name", S, 0), ("Age", S, 0), ("Request", S, 0), ("Limit", S, 0)],
        "RoleBinding" | "ClusterRoleBinding" => vec![
            ("Name", S, 0),
            ("Role", S, 0),
            ("Age", S, 0),
            ("Users", S, 1),
            ("Groups", S, 1),
            ("ServiceAccounts", S, 1),
        ],
        "Lease" => vec![("Name", S, 0), ("Holder", S, 0), ("Age", S, 0)],
        "ControllerRevision" => vec![("Name", S, 0), ("Controller", S, 0), ("Revision", I, 0), ("Age", S, 0)],
        "Ingress" => {
            vec![("Name", S, 0), ("Class", S, 0), ("Hosts", S, 0), ("Address", S, 0), ("Ports", S, 0), ("Age", S, 0)]
        }
        "IngressClass" => vec![("Name", S, 0), ("Controller", S, 0), ("Parameters", S, 0), ("Age", S, 0)],
        "APIService" => vec![("Name", S, 0), ("Service", S, 0), ("Available", S, 0), ("Age", S, 0)],
        "ValidatingWebhookConfiguration" | "MutatingWebhookConfiguration" => {
            vec![("Name", S, 0), ("Webhooks", I, 0), ("Age", S, 0)]
        }
        "NetworkPolicy" => vec![("Name", S, 0), ("Pod-Selector", S, 0), ("Age", S, 0)],
        "PersistentVolumeClaim" => vec![
            ("Name", S, 0),
            ("Status", S, 0),
            ("Volume", S, 0),
            ("Capacity", S, 0),
            ("Access Modes", S, 0),
            ("StorageClass", S, 0),
            ("VolumeAttributesClass", S, 0),
            ("Age", S, 0),
            ("VolumeMode", S, 1),
        ],
        "PersistentVolume" => vec![
            ("Name", S, 0),
            ("Capacity", S, 0),
            ("Access Modes", S, 0),
            ("Reclaim Policy", S, 0),
            ("Status", S, 0),
            ("Claim", S, 0),
            ("StorageClass", S, 0),
            ("VolumeAttributesClass", S, 0),
            ("Reason", S, 0),
            ("Age", S, 0),
            ("VolumeMode", S, 1),
        ],
        "StorageClass" => vec![
            ("Name", S, 0),
            ("Provisioner", S, 0),
            ("ReclaimPolicy", S, 0),
            ("VolumeBindingMode", S, 0),
            ("AllowVolumeExpansion", S, 0),
            ("Age", S, 0),
        ],
        "Event" => vec![
            ("Last Seen", S, 0),
            ("Type", S, 0),
            ("Reason", S, 0),
            ("Object", S, 0),
            ("Subobject", S, 1),
            ("Source", S, 1),
            ("Message", S, 0),
            ("First Seen", S, 1),
            ("Count", I, 1),
            ("Name", S, 1),
        ],
        "Application" => vec![
            ("Name", S, 0),
            ("Sync", S, 0),
            ("Health", S, 0),
            ("Revision", S, 0),
            ("Age", S, 0),
            ("Repo", S, 1),
            ("Branch", S, 1),
            ("Path", S, 1),
        ],
        _ => vec![("Name", S, 0), ("Age", S, 0)],
    };
    cols.into_iter().map(|(n, t, p)| column(n, t, p)).collect()
}

/// A terminated container's reason, or its signal or exit code when it gives none.
fn terminated_reason(t: &Value, prefix: &str) -> String {
    match t["reason"].as_str().filter(|r| !r.is_empty()) {
        Some(reason) => format!("{prefix}{reason}"),
        None if int(&t["signal"]) != 0 => format!("{prefix}Signal:{}", int(&t["signal"])),
        None => format!("{prefix}ExitCode:{}", int(&t["exitCode"])),
    }
}

fn condition_true(status: &Value, kind: &str) -> bool {
    array(&status["conditions"]).any(|c| c["type"] == kind && c["status"] == "True")
}

/// The later of `latest` and the time a container last terminated.
fn last_termination(latest: Option<Timestamp>, c: &Value) -> Option<Timestamp> {
    let finished = c["lastState"]["terminated"]["finishedAt"].as_str().and_then(|t| t.parse::<Timestamp>().ok());
    latest.max(finished)
}

/// A Pod's READY, STATUS and RESTARTS as the API server's printer works them out: init
/// containers first (`Init:1/2`, `Init:CrashLoopBackOff`), then the app containers' waiting or
/// terminated reasons over the phase, `Terminating` while deleted.
fn pod_state(o: &Value) -> (String, String, Cell) {
    let (spec, status) = (&o["spec"], &o["status"]);
    let init_specs: Vec<&Value> = array(&spec["initContainers"]).collect();
    let restartable = |name: &Value| init_specs.iter().any(|c| c["name"] == *name && c["restartPolicy"] == "Always");
    let mut total =
        array(&spec["containers"]).count() + init_specs.iter().filter(|c| c["restartPolicy"] == "Always").count();
    if total == 0 {
        total = array(&status["containerStatuses"]).count();
    }
    let mut ready = 0;
    let mut restarts = 0;
    let mut last_restart = None;
    let (mut sidecar_restarts, mut sidecar_last_restart) = (0, None);
    let phase = status["phase"].as_str().unwrap_or("Pending");
    let mut reason = status["reason"].as_str().filter(|r| !r.is_empty()).unwrap_or(phase).to_owned();
    if array(&status["conditions"]).any(|c| c["type"] == "PodScheduled" && c["reason"] == "SchedulingGated") {
        reason = "SchedulingGated".into();
    }
    let mut initializing = false;
    for (i, c) in array(&status["initContainerStatuses"]).enumerate() {
        restarts += int(&c["restartCount"]);
        last_restart = last_termination(last_restart, c);
        if restartable(&c["name"]) {
            sidecar_restarts += int(&c["restartCount"]);
            sidecar_last_restart = last_termination(sidecar_last_restart, c);
        }
        let (terminated, waiting) = (&c["state"]["terminated"], &c["state"]["waiting"]);
        if terminated.is_object() && int(&terminated["exitCode"]) == 0 {
            continue;
        }
        if restartable(&c["name"]) && c["started"] == true {
            ready += usize::from(c["ready"] == true);
            continue;
        }
        reason = match waiting["reason"].as_str() {
            _ if terminated.is_object() => terminated_reason(terminated, "Init:"),
            Some(r) if !r.is_empty() && r != "PodInitializing" => format!("Init:{r}"),
            _ => format!("Init:{i}/{}", init_specs.len()),
        };
        initializing = true;
        break;
    }
    if !initializing || condition_true(status, "Initialized") {
        restarts = sidecar_restarts;
        last_restart = sidecar_last_restart;
        let mut running = false;
        for c in array(&status["containerStatuses"]).collect::<Vec<_>>().into_iter().rev() {
            restarts += int(&c["restartCount"]);
            last_restart = last_termination(last_restart, c);
            let (terminated, waiting) = (&c["state"]["terminated"], &c["state"]["waiting"]);
            if let Some(r) = waiting["reason"].as_str().filter(|r| !r.is_empty()) {
                reason = r.to_owned();
            } else if terminated.is_object() {
                reason = terminated_reason(terminated, "");
            } else if c["ready"] == true && c["state"]["running"].is_object() {
                running = true;
                ready += 1;
            }
        }
        if reason == "Completed" && running {
            reason = if condition_true(status, "Ready") { "Running" } else { "NotReady" }.into();
        }
    }
    if o["metadata"]["deletionTimestamp"].is_string() {
        if status["reason"] == "NodeLost" {
            reason = "Unknown".into();
        } else if !matches!(phase, "Succeeded" | "Failed") {
            reason = "Terminating".into();
        }
    }
    let restarts = match last_restart {
        Some(at) if restarts != 0 => Cell::Since { at, prefix: format!("{restarts} ("), suffix: " ago)" },
        _ => cell(restarts.to_string()),
    };
    (format!("{ready}/{total}"), reason, restarts)
}

/// `app=web,tier in (db,web)`: a label selector as the API server prints one.
fn selector(s: &Value) -> String {
    let mut requirements: Vec<(String, String)> = s["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.clone(), format!("{k}={}", text(v))))
        .collect();
    for e in array(&s["matchExpressions"]) {
        let key = text(&e["key"]);
        let mut values: Vec<String> = array(&e["values"]).map(text).collect();
        values.sort();
        let r = match e["operator"].as_str().unwrap_or("") {
            "In" => format!("{key} in ({})", values.join(",")),
            "NotIn" => format!("{key} notin ({})", values.join(",")),
            "Exists" => key.clone(),
            "DoesNotExist" => format!("!{key}"),
            other => format!("{key} {other}"),
        };
        requirements.push((key, r));
    }
    requirements.sort();
    let printed: Vec<String> = requirements.into_iter().map(|(_, r)| r).collect();
    if printed.is_empty() { "<none>".into() } else { printed.join(",") }
}

/// `app=web,tier=db`: a label map (a Service's selector) as the API server prints it.
fn labels(m: &Value) -> String {
    let printed: Vec<String> = m.as_object().into_iter().flatten().map(|(k, v)| format!("{k}={}", text(v))).collect();
    if printed.is_empty() { "<none>".into() } else { printed.join(",") }
}

/// A workload's wide cells: the template's container names, their images, the selector.
fn workload(spec: &Value) -> [Cell; 3] {
    let containers: Vec<&Value> = array(&spec["template"]["spec"]["containers"]).collect();
    let names: Vec<String> = containers.iter().map(|c| text(&c["name"])).collect();
    let images: Vec<String> = containers.iter().map(|c| text(&c["image"])).collect();
    [cell(names.join(",")), cell(images.join(",")), cell(selector(&spec["selector"]))]
}

/// An HPA's metrics as kubectl prints them: `cpu: 250%/50%`, `memory: 32Mi/64Mi`; the first
/// four, then how many more.
fn hpa_targets(spec: &Value, status: &Value) -> String {
    let current = array(&status["currentMetrics"]).collect::<Vec<_>>();
    let printed: Vec<String> = array(&spec["metrics"])
        .enumerate()
        .map(|(i, m)| {
            let resource = &m["resource"];
            if m["type"] != "Resource" {
                return format!("<{}>", text(&m["type"]));
            }
            let now = current.get(i).map(|c| &c["resource"]["current"]);
            let (current, target) = match resource["target"]["averageValue"].as_str() {
                Some(value) => {
                    (now.and_then(|c| c["averageValue"].as_str()).unwrap_or("<unknown>").to_owned(), value.to_owned())
                }
                None => (
                    now.and_then(|c| c["averageUtilization"].as_i64())
                        .map_or("<unknown>".to_owned(), |u| format!("{u}%")),
                    resource["target"]["averageUtilization"].as_i64().map_or("<auto>".to_owned(), |u| format!("{u}%")),
                ),
            };
            format!("{}: {current}/{target}", text(&resource["name"]))
        })
        .collect();
    match printed.len() {
        0 => "<none>".into(),
        n if n > 4 => format!("{} + {} more...", printed[..4].join(", "), n - 4),
        _ => printed.join(", "),
    }
}

fn since(t: &Value) -> Option<Cell> {
    t.as_str().and_then(|t| t.parse::<Timestamp>().ok()).map(Cell::since)
}

fn cells(kind: &str, o: &Value) -> Vec<Cell> {
    let age = age(o["metadata"]["creationTimestamp"].as_str());
    let (spec, status) = (&o["spec"], &o["status"]);
    let name = cell(text(&o["metadata"]["name"]));
    match kind {
        "Pod" => {
            let (ready, reason, restarts) = pod_state(o);
            let ip = array(&status["podIPs"]).next().map(|i| text(&i["ip"])).unwrap_or_else(|| text(&status["podIP"]));
            let gates: Vec<&Value> = array(&spec["readinessGates"]).collect();
            let gates = if gates.is_empty() {
                "<none>".to_owned()
            } else {
                let met =
                    gates.iter().filter(|g| condition_true(status, g["conditionType"].as_str().unwrap_or(""))).count();
                format!("{met}/{}", gates.len())
            };
            vec![
                name,
                cell(ready),
                cell(reason),
                restarts,
                age,
                cell(if ip.is_empty() { "<none>".to_owned() } else { ip }),
                cell(or_none(&spec["nodeName"])),
                cell(or_none(&status["nominatedNodeName"])),
                cell(gates),
            ]
        }
        "Deployment" => {
            let want = spec["replicas"].as_i64().unwrap_or(1);
            let mut row = vec![
                name,
                cell(format!("{}/{want}", int(&status["readyReplicas"]))),
                cell(int(&status["updatedReplicas"])),
                cell(int(&status["availableReplicas"])),
                age,
            ];
            row.extend(workload(spec));
            row
        }
        "ReplicaSet" => {
            let mut row = vec![
                name,
                cell(spec["replicas"].as_i64().unwrap_or(1)),
                cell(int(&status["replicas"])),
                cell(int(&status["readyReplicas"])),
                age,
            ];
            row.extend(workload(spec));
            row
        }
        "ReplicationController" => {
            let mut row = vec![
                name,
                cell(spec["replicas"].as_i64().unwrap_or(1)),
                cell(int(&status["replicas"])),
                cell(int(&status["readyReplicas"])),
                age,
            ];
            let [containers, images, _] = workload(spec);
            row.extend([containers, images, cell(labels(&spec["selector"]))]);
            row
        }
        "PodDisruptionBudget" => {
            // An IntOrString as kubectl prints it: the number or the percentage, else N/A.
            let bound = |v: &Value| match v {
                Value::Number(n) => n.to_string(),
                Value::String(s) => s.clone(),
                _ => "N/A".to_owned(),
            };
            vec![
                name,
                cell(bound(&spec["minAvailable"])),
                cell(bound(&spec["maxUnavailable"])),
                cell(int(&status["disruptionsAllowed"])),
                age,
            ]
        }
        "DaemonSet" => {
            let mut row = vec![
                name,
                cell(int(&status["desiredNumberScheduled"])),
                cell(int(&status["currentNumberScheduled"])),
                cell(int(&status["numberReady"])),
                cell(int(&status["updatedNumberScheduled"])),
                cell(int(&status["numberAvailable"])),
                cell(labels(&spec["template"]["spec"]["nodeSelector"])),
                age,
            ];
            row.extend(workload(spec));
            row
        }
        "StatefulSet" => {
            let want = spec["replicas"].as_i64().unwrap_or(1);
            let [containers, images, _] = workload(spec);
            vec![name, cell(format!("{}/{want}", int(&status["readyReplicas"]))), age, containers, images]
        }
        "Job" => {
            let state = if condition_true(status, "Complete") {
                "Complete"
            } else if condition_true(status, "Failed") {
                "Failed"
            } else if o["metadata"]["deletionTimestamp"].is_string() {
                "Terminating"
            } else if condition_true(status, "Suspended") {
                "Suspended"
            } else if condition_true(status, "FailureTarget") {
                "FailureTarget"
            } else if condition_true(status, "SuccessCriteriaMet") {
                "SuccessCriteriaMet"
            } else {
                "Running"
            };
            let succeeded = int(&status["succeeded"]);
            let completions = match (spec["completions"].as_i64(), spec["parallelism"].as_i64().unwrap_or(1)) {
                (Some(c), _) => format!("{succeeded}/{c}"),
                (None, p) if p > 1 => format!("{succeeded}/1 of {p}"),
                (None, _) => format!("{succeeded}/1"),
            };
            let start = status["startTime"].as_str().and_then(|t| t.parse::<Timestamp>().ok());
            let end = status["completionTime"].as_str().and_then(|t| t.parse::<Timestamp>().ok());
            // A running Job's duration runs until now.
            let duration = match (start, end) {
                (Some(start), Some(end)) => cell(ago(start, end)),
                (Some(start), None) => Cell::since(start),
                (None, _) => cell(""),
            };
            let mut row = vec![name, cell(state), cell(completions), duration, age];
            row.extend(workload(spec));
            row
        }
        "CronJob" => {
            let suspend = match spec["suspend"].as_bool() {
                Some(true) => "True",
                Some(false) => "False",
                None => "<unset>",
            };
            let last = since(&status["lastScheduleTime"]).unwrap_or_else(|| cell("<none>"));
            let active = status["active"].as_array().map_or(0, Vec::len);
            let mut row = vec![
                name,
                cell(text(&spec["schedule"])),
                cell(or_none(&spec["timeZone"])),
                cell(suspend),
                cell(active),
                last,
                age,
            ];
            row.extend(workload(&spec["jobTemplate"]["spec"]));
            row
        }
        "HorizontalPodAutoscaler" => {
            let target = &spec["scaleTargetRef"];
            let reference = format!("{}/{}", text(&target["kind"]), text(&target["name"]));
            let min = spec["minReplicas"].as_i64().map_or("<unset>".to_owned(), |m| m.to_string());
            vec![
                name,
                cell(reference),
                cell(hpa_targets(spec, status)),
                cell(min),
                cell(int(&spec["maxReplicas"])),
                cell(int(&status["currentReplicas"])),
                age,
            ]
        }
        "Service" => {
            // As kubectl prints them: `80:30080/TCP` when a nodePort is allocated.
            let ports: Vec<String> = array(&spec["ports"])
                .map(|p| {
                    let protocol = p["protocol"].as_str().unwrap_or("TCP");
                    match p["nodePort"].as_i64() {
                        Some(node_port) => format!("{}:{node_port}/{protocol}", int(&p["port"])),
                        None => format!("{}/{protocol}", int(&p["port"])),
                    }
                })
                .collect();
            let kind = spec["type"].as_str().unwrap_or("ClusterIP");
            let ingress: Vec<&str> = array(&status["loadBalancer"]["ingress"])
                .filter_map(|i| i["ip"].as_str().or(i["hostname"].as_str()))
                .chain(array(&spec["externalIPs"]).filter_map(Value::as_str))
                .collect();
            let external = match kind {
                "ExternalName" => spec["externalName"].as_str().unwrap_or("<none>").to_owned(),
                _ if !ingress.is_empty() => ingress.join(","),
                "LoadBalancer" => "<pending>".to_owned(),
                _ => "<none>".to_owned(),
            };
            vec![
                name,
                cell(kind),
                cell(or_none(&spec["clusterIP"])),
                cell(external),
                cell(if ports.is_empty() { "<none>".to_owned() } else { ports.join(",") }),
                age,
                cell(labels(&spec["selector"])),
            ]
        }
        "Endpoints" => vec![name, cell(endpoints(o)), age],
        "Ingress" => {
            // As kubectl prints them: `*` for a rule without a host, the first four hosts, and
            // 443 beside 80 when the Ingress terminates TLS.
            let hosts: Vec<&str> = array(&spec["rules"]).map(|r| r["host"].as_str().unwrap_or("*")).collect();
            let shown = match hosts.len() {
                0 => "*".to_owned(),
                n if n > 4 => format!("{} + {} more...", hosts[..4].join(","), n - 4),
                _ => hosts.join(","),
            };
            let address: Vec<&str> = array(&status["loadBalancer"]["ingress"])
                .filter_map(|i| i["ip"].as_str().or(i["hostname"].as_str()))
                .collect();
            let ports = if array(&spec["tls"]).next().is_some() { "80, 443" } else { "80" };
            vec![name, cell(or_none(&spec["ingressClassName"])), cell(shown), cell(address.join(",")), cell(ports), age]
        }
        "IngressClass" => {
            let p = &spec["parameters"];
            let parameters = match p["name"].as_str() {
                Some(n) => format!("{}/{}", p["kind"].as_str().unwrap_or(""), n),
                None => "<none>".to_owned(),
            };
            vec![name, cell(or_none(&spec["controller"])), cell(parameters), age]
        }
        // gitplane answers the one APIService it accepts, metrics.k8s.io, itself.
        "APIService" => {
            let service = &spec["service"];
            let service = match service["name"].as_str() {
                Some(n) => format!("{}/{n}", service["namespace"].as_str().unwrap_or("")),
                None => "Local".to_owned(),
            };
            vec![name, cell(service), cell("True".to_owned()), age]
        }
        "EndpointSlice" => {
            let ports = array(&o["ports"]).map(|p| match (p["port"].as_i64(), p["name"].as_str()) {
                (Some(port), _) => port.to_string(),
                (None, Some(name)) => name.to_owned(),
                (None, None) => "*".to_owned(),
            });
            let addresses = array(&o["endpoints"]).flat_map(|e| array(&e["addresses"]).map(text).collect::<Vec<_>>());
            vec![
                name,
                cell(text(&o["addressType"])),
                cell(at_most_three(ports, "<unset>")),
                cell(at_most_three(addresses, "<unset>")),
                age,
            ]
        }
        "Node" => {
            let mut state: Vec<String> = array(&status["conditions"])
                .filter(|c| c["type"] == "Ready")
                .map(|c| if c["status"] == "True" { "Ready".into() } else { "NotReady".into() })
                .collect();
            if state.is_empty() {
                state.push("Unknown".into());
            }
            if spec["unschedulable"] == true {
                state.push("SchedulingDisabled".into());
            }
            let mut roles: Vec<String> = o["metadata"]["labels"]
                .as_object()
                .into_iter()
                .flatten()
                .filter_map(|(k, v)| match k.strip_prefix("node-role.kubernetes.io/") {
                    Some(role) => Some(role.to_owned()),
                    None if k == "kubernetes.io/role" => Some(text(v)),
                    None => None,
                })
                .filter(|r| !r.is_empty())
                .collect();
            roles.sort();
            roles.dedup();
            let address = |kind: &str| {
                array(&status["addresses"])
                    .find(|a| a["type"] == kind)
                    .map(|a| text(&a["address"]))
                    .unwrap_or("<none>".into())
            };
            let info = &status["nodeInfo"];
            let or_unknown = |v: &Value| v.as_str().filter(|s| !s.is_empty()).unwrap_or("<unknown>").to_owned();
            vec![
                name,
                cell(state.join(",")),
                cell(if roles.is_empty() { "<none>".to_owned() } else { roles.join(",") }),
                age,
                cell(text(&info["kubeletVersion"])),
                cell(address("InternalIP")),
                cell(address("ExternalIP")),
                cell(or_unknown(&info["osImage"])),
                cell(or_unknown(&info["kernelVersion"])),
                cell(or_unknown(&info["containerRuntimeVersion"])),
            ]
        }
        "Namespace" => vec![name, cell(status["phase"].as_str().unwrap_or("Active")), age],
        "ValidatingWebhookConfiguration" | "MutatingWebhookConfiguration" => {
            vec![name, cell(array(&o["webhooks"]).count()), age]
        }
        "ConfigMap" => {
            let count = |v: &Value| v.as_object().map_or(0, |m| m.len());
            vec![name, cell(count(&o["data"]) + count(&o["binaryData"])), age]
        }
        "Secret" => {
            let data = o["data"].as_object().map_or(0, |m| m.len());
            vec![name, cell(o["type"].as_str().unwrap_or("Opaque")), cell(data), age]
        }
        "ServiceAccount" => vec![name, cell(o["secrets"].as_array().map_or(0, Vec::len)), age],
        "Role" | "ClusterRole" | "LimitRange" => {
            vec![name, cell(o["metadata"]["creationTimestamp"].as_str().unwrap_or(""))]
        }
        "ResourceQuota" => {
            let (request, limit) = quota_columns(status);
            vec![name, age, cell(request), cell(limit)]
        }
        "RoleBinding" | "ClusterRoleBinding" => {
            let subjects = |kind: &str| {
                let names: Vec<String> = o["subjects"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|s| s["kind"] == kind)
                    .map(|s| match (kind, s["namespace"].as_str()) {
                        ("ServiceAccount", Some(ns)) => format!("{ns}/{}", s["name"].as_str().unwrap_or("")),
                        _ => s["name"].as_str().unwrap_or("").to_owned(),
                    })
                    .collect();
                cell(names.join(", "))
            };
            let role = format!(
                "{}/{}",
                o["roleRef"]["kind"].as_str().unwrap_or(""),
                o["roleRef"]["name"].as_str().unwrap_or("")
            );
            vec![name, cell(role), age, subjects("User"), subjects("Group"), subjects("ServiceAccount")]
        }
        "Lease" => vec![name, cell(spec["holderIdentity"].as_str().unwrap_or("<unknown>")), age],
        "ControllerRevision" => {
            // As kubectl: `statefulset.apps/web`, the controller owner's kind and group.
            let controller = array(&o["metadata"]["ownerReferences"])
                .find(|r| r["controller"] == true)
                .map(|r| {
                    let group =
                        text(&r["apiVersion"]).rsplit_once('/').map(|(g, _)| format!(".{g}")).unwrap_or_default();
                    format!("{}{group}/{}", text(&r["kind"]).to_lowercase(), text(&r["name"]))
                })
                .unwrap_or_else(|| "<none>".into());
            vec![name, cell(controller), cell(int(&o["revision"])), age]
        }
        "NetworkPolicy" => vec![name, cell(selector(&spec["podSelector"])), age],
        "PersistentVolumeClaim" => {
            // Capacity and access modes are the bound volume's, shown once a volume is named.
            let bound = spec["volumeName"].as_str().is_some_and(|v| !v.is_empty());
            let (capacity, modes) = match bound {
                true => (text(&status["capacity"]["storage"]), access_modes(&status["accessModes"])),
                false => (String::new(), String::new()),
            };
            let class = o["metadata"]["annotations"][BETA_STORAGE_CLASS]
                .as_str()
                .map_or_else(|| text(&spec["storageClassName"]), str::to_owned);
            vec![
                name,
                cell(terminating_or(o, &status["phase"])),
                cell(text(&spec["volumeName"])),
                cell(capacity),
                cell(modes),
                cell(class),
                cell(or_unset(&spec["volumeAttributesClassName"])),
                age,
                cell(or_unset(&spec["volumeMode"])),
            ]
        }
        "PersistentVolume" => {
            let claim = &spec["claimRef"];
            let claim = match claim.is_object() {
                true => format!("{}/{}", text(&claim["namespace"]), text(&claim["name"])),
                false => String::new(),
            };
            let class = o["metadata"]["annotations"][BETA_STORAGE_CLASS]
                .as_str()
                .map_or_else(|| text(&spec["storageClassName"]), str::to_owned);
            vec![
                name,
                cell(text(&spec["capacity"]["storage"])),
                cell(access_modes(&spec["accessModes"])),
                cell(text(&spec["persistentVolumeReclaimPolicy"])),
                cell(terminating_or(o, &status["phase"])),
                cell(claim),
                cell(class),
                cell(or_unset(&spec["volumeAttributesClassName"])),
                cell(text(&status["reason"])),
                age,
                cell(or_unset(&spec["volumeMode"])),
            ]
        }
        "StorageClass" => {
            let default = o["metadata"]["annotations"][DEFAULT_CLASS] == "true"
                || o["metadata"]["annotations"][BETA_DEFAULT_CLASS] == "true";
            let name = match default {
                true => cell(format!("{} (default)", text(&o["metadata"]["name"]))),
                false => name,
            };
            vec![
                name,
                cell(text(&o["provisioner"])),
                cell(o["reclaimPolicy"].as_str().unwrap_or("Delete")),
                cell(o["volumeBindingMode"].as_str().unwrap_or("Immediate")),
                cell(o["allowVolumeExpansion"].as_bool().unwrap_or(false)),
                age,
            ]
        }
        "Application" => {
            let revision = status["sync"]["revision"].as_str().map(|r| r.get(..12).unwrap_or(r)).unwrap_or("<none>");
            vec![
                name,
                cell(status["sync"]["status"].as_str().unwrap_or("Unknown")),
                cell(status["health"]["status"].as_str().unwrap_or("Unknown")),
                cell(revision),
                age,
                cell(text(&spec["repo"])),
                cell(spec["branch"].as_str().unwrap_or("main")),
                cell(or_none(&spec["path"])),
            ]
        }
        "Event" => {
            let involved = &o["involvedObject"];
            let kind = text(&involved["kind"]).to_lowercase();
            let object = match involved["name"].as_str().filter(|n| !n.is_empty()) {
                Some(n) => format!("{kind}/{n}"),
                None => kind,
            };
            let first =
                since(&o["firstTimestamp"]).or_else(|| since(&o["eventTime"])).unwrap_or_else(|| cell("<unknown>"));
            let (last, count) = match o["series"].is_object() {
                true => (
                    since(&o["series"]["lastObservedTime"]).unwrap_or_else(|| first.clone()),
                    int(&o["series"]["count"]),
                ),
                false => (since(&o["lastTimestamp"]).unwrap_or_else(|| first.clone()), int(&o["count"]).max(1)),
            };
            let first_non_empty =
                |a: &Value, b: &Value| a.as_str().filter(|s| !s.is_empty()).or(b.as_str()).unwrap_or("").to_owned();
            let component = first_non_empty(&o["source"]["component"], &o["reportingComponent"]);
            let instance = first_non_empty(&o["source"]["host"], &o["reportingInstance"]);
            let source = if instance.is_empty() { component } else { format!("{component}, {instance}") };
            vec![
                last,
                cell(text(&o["type"])),
                cell(text(&o["reason"])),
                cell(object),
                cell(text(&involved["fieldPath"])),
                cell(source),
                cell(text(&o["message"]).trim()),
                first,
                cell(count),
                name,
            ]
        }
        _ => vec![name, age],
    }
}

/// The annotation older claims and volumes name their class by, ahead of `storageClassName`.
const BETA_STORAGE_CLASS: &str = "volume.beta.kubernetes.io/storage-class";
const DEFAULT_CLASS: &str = "storageclass.kubernetes.io/is-default-class";
const BETA_DEFAULT_CLASS: &str = "storageclass.beta.kubernetes.io/is-default-class";

/// Access modes as kubectl abbreviates them, in its fixed order (`RWO,ROX`).
fn access_modes(modes: &Value) -> String {
    let has = |mode: &str| array(modes).any(|m| m == mode);
    [("ReadWriteOnce", "RWO"), ("ReadOnlyMany", "ROX"), ("ReadWriteMany", "RWX"), ("ReadWriteOncePod", "RWOP")]
        .into_iter()
        .filter(|(mode, _)| has(mode))
        .map(|(_, short)| short)
        .collect::<Vec<_>>()
        .join(",")
}

/// A phase, or `Terminating` once the object is being deleted.
fn terminating_or(o: &Value, phase: &Value) -> String {
    match o["metadata"]["deletionTimestamp"].is_string() {
        true => "Terminating".to_owned(),
        false => text(phase),
    }
}

fn or_unset(v: &Value) -> String {
    v.as_str().unwrap_or("<unset>").to_owned()
}

fn array(v: &Value) -> impl Iterator<Item = &Value> {
    v.as_array().into_iter().flatten()
}

/// kubectl's lists of ports and addresses: the first three, then how many more
/// (`10.244.0.5:80,10.244.1.7:80,10.244.2.3:80 + 2 more...`), `empty` for none.
fn at_most_three(items: impl Iterator<Item = String>, empty: &str) -> String {
    let items: Vec<String> = items.collect();
    match items.len() {
        0 => empty.to_owned(),
        1..=3 => items.join(","),
        n => format!("{} + {} more...", items[..3].join(","), n - 3),
    }
}

/// A ResourceQuota's REQUEST and LIMIT as kubectl prints them: `resource: used/hard` for each
/// hard resource in name order, the `limits.*` ones under LIMIT.
fn quota_columns(status: &Value) -> (String, String) {
    let (mut request, mut limit) = (Vec::new(), Vec::new());
    let hard = status["hard"].as_object().into_iter().flatten();
    let mut hard: Vec<(&String, &Value)> = hard.collect();
    hard.sort_by_key(|(name, _)| *name);
    for (name, quantity) in hard {
        let used = status["used"][name.as_str()].as_str().unwrap_or("0");
        let column =
            if name.split('.').next() == Some("limits") && name.contains('.') { &mut limit } else { &mut request };
        column.push(format!("{name}: {used}/{}", text(quantity)));
    }
    (request.join(", "), limit.join(", "))
}

/// The ENDPOINTS of an Endpoints object as kubectl prints it: the ready addresses with each
/// port of their subset (an address alone when the subset has no ports); `<none>` without
/// subsets, nothing when no address is ready.
fn endpoints(o: &Value) -> String {
    let subsets: Vec<&Value> = array(&o["subsets"]).collect();
    if subsets.is_empty() {
        return "<none>".to_owned();
    }
    let host_port = |ip: &str, port: i64| {
        if ip.contains(':') { format!("[{ip}]:{port}") } else { format!("{ip}:{port}") }
    };
    let items = subsets.into_iter().flat_map(|subset| {
        let addresses: Vec<String> = array(&subset["addresses"]).map(|a| text(&a["ip"])).collect();
        let ports: Vec<i64> = array(&subset["ports"]).map(|p| int(&p["port"])).collect();
        if ports.is_empty() {
            return addresses;
        }
        ports.iter().flat_map(|port| addresses.iter().map(|ip| host_port(ip, *port)).collect::<Vec<_>>()).collect()
    });
    at_most_three(items, "")
}

/// What each row of a Table carries besides its cells: `?includeObject=` of a Table request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IncludeObject {
    None,
    /// The default: the metadata `kubectl get -A` reads the namespace from.
    #[default]
    Metadata,
    /// The whole object, which `kubectl get --sort-by` and `-o custom-columns` read.
    Object,
}

impl IncludeObject {
    /// Kubernetes' three values; anything else is the caller's error.
    pub fn parse(value: &str) -> Result<Self, String> {
        match value {
            "None" => Ok(Self::None),
            "" | "Metadata" => Ok(Self::Metadata),
            "Object" => Ok(Self::Object),
            other => Err(format!("includeObject {other:?} is not one of None, Metadata, Object")),
        }
    }
}

/// The Table for `items` of `kind`, each row carrying what `include` asks for.
pub fn table(kind: &str, items: &[Value], resource_version: &str, now: Timestamp, include: IncludeObject) -> Value {
    let rows: Vec<Value> = items
        .iter()
        .map(|o| {
            let cells: Vec<Value> = cells(kind, o).into_iter().map(|c| c.at(now)).collect();
            let mut row = json!({"cells": cells});
            match include {
                IncludeObject::None => {}
                IncludeObject::Metadata => {
                    row["object"] = json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"].clone()});
                }
                IncludeObject::Object => row["object"] = o.clone(),
            }
            row
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": columns(kind),
        "rows": rows,
    })
}

/// The `columnDefinitions` of `kind`'s Table.
pub fn column_definitions(kind: &str) -> Value {
    Value::Array(columns(kind))
}

/// An object's row cells as the JSON text of an array, made once and printed at any `now`: the
/// text with the place of each duration and the time it counts from (a Pod row has one or two).
/// What `table` gives for the object, cell for cell.
pub struct Row {
    text: Box<str>,
    /// Byte offsets into `text`, ascending, inside the quotes of their cells.
    since: Box<[(usize, Timestamp)]>,
}

impl Row {
    pub fn new(kind: &str, object: &Value) -> Row {
        let mut text = String::from("[");
        let mut since = Vec::new();
        for (i, cell) in cells(kind, object).into_iter().enumerate() {
            if i > 0 {
                text.push(',');
            }
            match cell {
                Cell::Value(v) => text.push_str(&v.to_string()),
                Cell::Since { at, prefix, suffix } => {
                    // The duration is ASCII that needs no escaping; the text around it may.
                    let quoted = |s: &str| Value::from(s).to_string();
                    let prefix = quoted(&prefix);
                    text.push_str(&prefix[..prefix.len() - 1]);
                    since.push((text.len(), at));
                    text.push_str(&quoted(suffix)[1..]);
                }
            }
        }
        text.push(']');
        Row { text: text.into(), since: since.into() }
    }

    /// The cells' JSON at `now`, appended to `out`.
    pub fn write(&self, now: Timestamp, out: &mut String) {
        let mut from = 0;
        for &(to, at) in &self.since {
            out.push_str(&self.text[from..to]);
            out.push_str(&ago(at, now));
            from = to;
        }
        out.push_str(&self.text[from..]);
    }

    /// The bytes it holds on the heap, for the cache's accounting.
    pub fn heap_size(&self) -> usize {
        self.text.len() + size_of_val(&*self.since)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> Timestamp {
        "2026-01-01T01:00:00Z".parse().unwrap()
    }

    #[test]
    fn rows_carry_what_include_object_asks_for() {
        let pod = json!({"kind": "Pod", "metadata": {"name": "a", "namespace": "n"}, "spec": {"nodeName": "n1"}});
        let row = |include| super::table("Pod", std::slice::from_ref(&pod), "1", now(), include)["rows"][0].clone();
        assert_eq!(row(IncludeObject::Object)["object"], pod);
        assert_eq!(row(IncludeObject::Metadata)["object"]["kind"], "PartialObjectMetadata");
        assert_eq!(row(IncludeObject::Metadata)["object"]["metadata"], pod["metadata"]);
        assert!(row(IncludeObject::None).get("object").is_none());
        assert_eq!(IncludeObject::parse(""), Ok(IncludeObject::Metadata));
        assert_eq!(IncludeObject::parse("Object"), Ok(IncludeObject::Object));
        assert!(IncludeObject::parse("object").is_err(), "the values are case-sensitive, as Kubernetes'");
    }

    /// A Table as kubectl's default `get` asks for it.
    fn table(kind: &str, items: &[Value], resource_version: &str, now: Timestamp) -> Value {
        super::table(kind, items, resource_version, now, IncludeObject::Metadata)
    }

    /// The columns `kubectl get -o wide` adds.
    fn wide(t: &Value) -> Vec<&str> {
        t["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["priority"] == 1)
            .map(|c| c["name"].as_str().unwrap())
            .collect()
    }

    fn names(t: &Value) -> Vec<&str> {
        t["columnDefinitions"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect()
    }

    fn row(kind: &str, object: Value) -> Vec<Value> {
        let t = table(kind, &[object], "1", now());
        let cells = t["rows"][0]["cells"].as_array().unwrap().clone();
        assert_eq!(cells.len(), names(&t).len(), "{kind}: a cell per column");
        cells
    }

    #[test]
    fn ages_read_like_kubectl() {
        assert_eq!(age(Some("2026-01-01T00:59:30Z")).at(now()), "30s");
        assert_eq!(age(Some("2026-01-01T00:55:00Z")).at(now()), "5m");
        assert_eq!(age(Some("2026-01-01T00:54:30Z")).at(now()), "5m30s");
        assert_eq!(age(Some("2026-01-01T00:00:00Z")).at(now()), "60m");
        assert_eq!(age(Some("2025-12-31T21:30:00Z")).at(now()), "3h30m");
        assert_eq!(age(Some("2025-12-31T13:00:00Z")).at(now()), "12h");
        assert_eq!(age(Some("2025-12-28T22:00:00Z")).at(now()), "3d3h");
        assert_eq!(age(Some("2025-12-10T01:00:00Z")).at(now()), "22d");
        assert_eq!(age(Some("2023-01-02T01:00:00Z")).at(now()), "3y");
        assert_eq!(age(None).at(now()), "<unknown>");
    }

    /// A row made once prints, at any `now`, the cells `table` renders then, byte for byte.
    #[test]
    fn rows_made_once_print_the_tables_cells_at_any_time() {
        let pod = json!({
            "metadata": {"name": "p \"é\"\n", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"containers": [{"name": "a"}, {"name": "b"}]},
            "status": {"phase": "Running", "containerStatuses": [
                {"name": "a", "ready": true, "restartCount": 2, "state": {"running": {}},
                 "lastState": {"terminated": {"exitCode": 1, "finishedAt": "2026-01-01T00:55:00Z"}}},
                {"name": "b", "restartCount": 0, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}
        });
        let job = json!({"metadata": {"name": "j", "creationTimestamp": "2025-12-31T00:00:00Z"},
                         "spec": {"completions": 1}, "status": {"startTime": "2026-01-01T00:58:00Z"}});
        let event = json!({"metadata": {"name": "e"}, "involvedObject": {"kind": "Pod", "name": "p"},
                           "eventTime": "2026-01-01T00:40:00Z", "series": {"count": 3, "lastObservedTime": "2026-01-01T00:59:00Z"}});
        let node = json!({"metadata": {"name": "n1", "creationTimestamp": "not a time"}});
        for (kind, object) in [("Pod", pod), ("Job", job), ("Event", event), ("Node", node), ("Widget", json!({}))] {
            let row = Row::new(kind, &object);
            for now in [now(), "2026-03-01T12:34:56.5Z".parse().unwrap(), "2025-01-01T00:00:00Z".parse().unwrap()] {
                let mut written = String::new();
                row.write(now, &mut written);
                let t = super::table(kind, std::slice::from_ref(&object), "1", now, IncludeObject::None);
                assert_eq!(written, t["rows"][0]["cells"].to_string(), "{kind} at {now}");
            }
        }
    }

    #[test]
    fn pod_rows_have_kubectls_columns() {
        let pod = json!({
            "metadata": {"name": "web-1", "namespace": "default", "creationTimestamp": "2026-01-01T00:59:00Z"},
            "spec": {"nodeName": "n1", "containers": [{"name": "a"}, {"name": "b"}]},
            "status": {"phase": "Running", "podIP": "10.244.0.5", "containerStatuses": [
                {"name": "a", "ready": true, "restartCount": 1, "state": {"running": {}}},
                {"name": "b", "ready": false, "restartCount": 2, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}
        });
        let t = table("Pod", &[pod], "7", now());
        let names: Vec<&str> =
            t["columnDefinitions"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
        assert_eq!(
            names,
            ["Name", "Ready", "Status", "Restarts", "Age", "IP", "Node", "Nominated Node", "Readiness Gates"]
        );
        assert_eq!(wide(&t), ["IP", "Node", "Nominated Node", "Readiness Gates"]);
        assert_eq!(
            t["rows"][0]["cells"],
            json!(["web-1", "1/2", "CrashLoopBackOff", "3", "60s", "10.244.0.5", "n1", "<none>", "<none>"])
        );
        assert_eq!(t["rows"][0]["object"]["metadata"]["namespace"], "default");
    }

    #[test]
    fn initializing_pods_show_init_progress_as_kubectl() {
        let status = |init: Value| {
            let pod = json!({
                "metadata": {"name": "p"},
                "spec": {"initContainers": [{"name": "i1"}, {"name": "i2"}], "containers": [{"name": "a"}]},
                "status": {"phase": "Pending", "initContainerStatuses": init, "containerStatuses": [
                    {"name": "a", "restartCount": 0, "state": {"waiting": {"reason": "PodInitializing"}}}]}
            });
            let row = &table("Pod", &[pod], "1", now())["rows"][0]["cells"];
            (row[2].as_str().unwrap_or_default().to_owned(), row[3].as_str().unwrap_or_default().parse().unwrap_or(-1))
        };
        let done = json!({"restartCount": 0, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}});
        let waiting =
            |reason: &str, restarts: i64| json!({"restartCount": restarts, "state": {"waiting": {"reason": reason}}});
        let running = json!({"restartCount": 0, "state": {"running": {}}});
        assert_eq!(status(json!([running, waiting("PodInitializing", 0)])), ("Init:0/2".into(), 0));
        assert_eq!(status(json!([done, running])), ("Init:1/2".into(), 0));
        assert_eq!(status(json!([done, waiting("CrashLoopBackOff", 3)])), ("Init:CrashLoopBackOff".into(), 3));
        let failed = json!({"restartCount": 0, "state": {"terminated": {"exitCode": 3, "reason": "Error"}}});
        assert_eq!(status(json!([failed, waiting("PodInitializing", 0)])), ("Init:Error".into(), 0));
        assert_eq!(status(json!([done, done])), ("PodInitializing".into(), 0));
    }

    #[test]
    fn applications_show_sync_and_health() {
        let app = json!({"metadata": {"name": "demo"}, "status": {
            "sync": {"status": "Synced", "revision": "0123456789abcdef"}, "health": {"status": "Healthy"}}});
        assert_eq!(
            table("Application", &[app], "1", now())["rows"][0]["cells"],
            json!(["demo", "Synced", "Healthy", "0123456789ab", "<unknown>", "", "main", "<none>"])
        );
    }

    #[test]
    fn ingress_rows_show_class_hosts_address_and_ports_as_kubectl() {
        let row = |spec: Value, status: Value| {
            let ingress = json!({"metadata": {"name": "shop"}, "spec": spec, "status": status});
            table("Ingress", &[ingress], "1", now())["rows"][0]["cells"].clone()
        };
        let tls = json!({"ingressClassName": "gitplane", "rules": [{"host": "shop.example"}, {}],
                         "tls": [{"hosts": ["shop.example"], "secretName": "shop-tls"}]});
        let address = json!({"loadBalancer": {"ingress": [{"ip": "172.29.0.2"}, {"ip": "172.29.0.3"}]}});
        assert_eq!(
            row(tls, address),
            json!(["shop", "gitplane", "shop.example,*", "172.29.0.2,172.29.0.3", "80, 443", "<unknown>"])
        );
        let many = json!({"rules": (0..6).map(|i| json!({"host": format!("h{i}")})).collect::<Vec<_>>()});
        assert_eq!(row(many, json!({})), json!(["shop", "<none>", "h0,h1,h2,h3 + 2 more...", "", "80", "<unknown>"]));
    }

    #[test]
    fn service_rows_show_addresses_and_node_ports_as_kubectl() {
        let row = |spec: Value, status: Value| {
            let service = json!({"metadata": {"name": "s"}, "spec": spec, "status": status});
            table("Service", &[service], "1", now())["rows"][0]["cells"].clone()
        };
        assert_eq!(
            row(
                json!({"type": "NodePort", "clusterIP": "10.96.0.7", "ports": [{"port": 80, "nodePort": 30080}]}),
                json!({})
            ),
            json!(["s", "NodePort", "10.96.0.7", "<none>", "80:30080/TCP", "<unknown>", "<none>"])
        );
        let pending = row(
            json!({"type": "LoadBalancer", "clusterIP": "10.96.0.8", "ports": [{"port": 53, "protocol": "UDP"}]}),
            json!({}),
        );
        assert_eq!(pending[3], "<pending>");
        let lb = row(json!({"type": "LoadBalancer"}), json!({"loadBalancer": {"ingress": [{"ip": "192.0.2.7"}]}}));
        assert_eq!(lb[3], "192.0.2.7");
        let external = row(json!({"type": "ExternalName", "externalName": "db.example.com"}), json!({}));
        assert_eq!((external[2].as_str(), external[3].as_str()), (Some("<none>"), Some("db.example.com")));
    }

    #[test]
    fn endpoints_rows_list_addresses_as_kubectl() {
        let row = |kind: &str, object: Value| table(kind, &[object], "1", now())["rows"][0]["cells"].clone();
        let address = |ip: &str| json!({"ip": ip});
        let five = json!({"metadata": {"name": "web"}, "subsets": [
            {"addresses": [address("10.244.0.5"), address("10.244.1.7")], "ports": [{"port": 80}]},
            {"addresses": [address("10.244.2.3"), address("10.244.2.4"), address("10.244.2.5")],
             "notReadyAddresses": [address("10.244.2.6")], "ports": [{"port": 80}]}]});
        assert_eq!(
            row("Endpoints", five),
            json!(["web", "10.244.0.5:80,10.244.1.7:80,10.244.2.3:80 + 2 more...", "<unknown>"])
        );
        assert_eq!(row("Endpoints", json!({"metadata": {"name": "web"}}))[1], "<none>");
        let not_ready = json!({"metadata": {"name": "web"}, "subsets": [{"notReadyAddresses": [address("10.244.0.5")], "ports": [{"port": 80}]}]});
        assert_eq!(row("Endpoints", not_ready)[1], "");
        let headless = json!({"metadata": {"name": "db"}, "subsets": [{"addresses": [address("10.244.0.5")]}]});
        assert_eq!(row("Endpoints", headless)[1], "10.244.0.5");

        let slice = json!({"metadata": {"name": "web-x2k9f"}, "addressType": "IPv4",
                           "ports": [{"name": "http", "port": 8080}, {"name": "https", "port": 8443}],
                           "endpoints": [{"addresses": ["10.244.0.5"]}, {"addresses": ["10.244.1.7"]}]});
        let t = table("EndpointSlice", &[slice], "1", now());
        let names: Vec<&str> =
            t["columnDefinitions"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["Name", "AddressType", "Ports", "Endpoints", "Age"]);
        assert_eq!(
            t["rows"][0]["cells"],
            json!(["web-x2k9f", "IPv4", "8080,8443", "10.244.0.5,10.244.1.7", "<unknown>"])
        );
        let placeholder = json!({"metadata": {"name": "web-abcde"}, "addressType": "IPv4", "endpoints": []});
        assert_eq!(row("EndpointSlice", placeholder), json!(["web-abcde", "IPv4", "<unset>", "<unset>", "<unknown>"]));
    }

    #[test]
    fn pods_show_restarts_ago_terminating_and_readiness_gates() {
        let pod = json!({
            "metadata": {"name": "p", "creationTimestamp": "2026-01-01T00:00:00Z", "deletionTimestamp": "2026-01-01T00:59:00Z"},
            "spec": {"containers": [{"name": "a"}], "readinessGates": [{"conditionType": "example.com/lb"}]},
            "status": {"phase": "Running", "podIPs": [{"ip": "10.244.0.9"}], "nominatedNodeName": "n2",
                       "conditions": [{"type": "example.com/lb", "status": "True"}],
                       "containerStatuses": [{"name": "a", "ready": true, "restartCount": 2, "state": {"running": {}},
                           "lastState": {"terminated": {"exitCode": 1, "finishedAt": "2026-01-01T00:55:00Z"}}}]}
        });
        assert_eq!(
            json!(row("Pod", pod)),
            json!(["p", "1/1", "Terminating", "2 (5m ago)", "60m", "10.244.0.9", "<none>", "n2", "1/1"])
        );
        let done = json!({"metadata": {"name": "j"}, "spec": {"containers": [{"name": "a"}]}, "status": {"phase": "Succeeded",
            "containerStatuses": [{"name": "a", "restartCount": 0, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}]}});
        assert_eq!(row("Pod", done)[1..3], [json!("0/1"), json!("Completed")]);
        let killed = json!({"metadata": {"name": "k"}, "spec": {"containers": [{"name": "a"}]}, "status": {"phase": "Running",
            "containerStatuses": [{"name": "a", "restartCount": 0, "state": {"terminated": {"exitCode": 137, "signal": 9}}}]}});
        assert_eq!(row("Pod", killed)[2], "Signal:9");
    }

    #[test]
    fn workloads_show_containers_images_and_selector_when_wide() {
        let template =
            json!({"spec": {"containers": [{"name": "web", "image": "httpd:1"}, {"name": "log", "image": "busybox"}]}});
        let selector = json!({"matchLabels": {"app": "web"}, "matchExpressions": [{"key": "tier", "operator": "In", "values": ["web", "db"]}]});
        let deployment = json!({"metadata": {"name": "web"}, "spec": {"replicas": 3, "selector": selector, "template": template},
                                "status": {"readyReplicas": 2, "updatedReplicas": 3, "availableReplicas": 2}});
        let t = table("Deployment", &[deployment], "1", now());
        assert_eq!(names(&t), ["Name", "Ready", "Up-to-date", "Available", "Age", "Containers", "Images", "Selector"]);
        assert_eq!(wide(&t), ["Containers", "Images", "Selector"]);
        assert_eq!(
            t["rows"][0]["cells"],
            json!(["web", "2/3", 3, 2, "<unknown>", "web,log", "httpd:1,busybox", "app=web,tier in (db,web)"])
        );
        let rs = json!({"metadata": {"name": "web-5d4f"}, "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}}, "template": template},
                        "status": {"replicas": 3, "readyReplicas": 1}});
        let t = table("ReplicaSet", &[rs], "1", now());
        assert_eq!(names(&t), ["Name", "Desired", "Current", "Ready", "Age", "Containers", "Images", "Selector"]);
        assert_eq!(
            t["rows"][0]["cells"],
            json!(["web-5d4f", 3, 3, 1, "<unknown>", "web,log", "httpd:1,busybox", "app=web"])
        );
        let sts = json!({"metadata": {"name": "web"}, "spec": {"replicas": 2, "template": template}, "status": {"readyReplicas": 1}});
        let t = table("StatefulSet", &[sts], "1", now());
        assert_eq!(names(&t), ["Name", "Ready", "Age", "Containers", "Images"]);
        assert_eq!(wide(&t), ["Containers", "Images"]);
        assert_eq!(t["rows"][0]["cells"], json!(["web", "1/2", "<unknown>", "web,log", "httpd:1,busybox"]));
        let revision = json!({"metadata": {"name": "web-7bd9f5c8d6", "ownerReferences": [
            {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "web", "uid": "s1", "controller": true}]}, "revision": 2});
        let t = table("ControllerRevision", &[revision], "1", now());
        assert_eq!(t["rows"][0]["cells"], json!(["web-7bd9f5c8d6", "statefulset.apps/web", 2, "<unknown>"]));
    }

    #[test]
    fn replication_controllers_and_disruption_budgets() {
        let rc = json!({"metadata": {"name": "nginx"}, "spec": {"replicas": 3, "selector": {"app": "nginx"},
                        "template": {"spec": {"containers": [{"name": "nginx", "image": "nginx"}]}}},
                        "status": {"replicas": 3, "readyReplicas": 2}});
        let t = table("ReplicationController", &[rc], "1", now());
        assert_eq!(names(&t), ["Name", "Desired", "Current", "Ready", "Age", "Containers", "Images", "Selector"]);
        assert_eq!(t["rows"][0]["cells"], json!(["nginx", 3, 3, 2, "<unknown>", "nginx", "nginx", "app=nginx"]));
        let pdb =
            json!({"metadata": {"name": "web"}, "spec": {"minAvailable": "50%"}, "status": {"disruptionsAllowed": 1}});
        let t = table("PodDisruptionBudget", &[pdb], "1", now());
        assert_eq!(names(&t), ["Name", "Min Available", "Max Unavailable", "Allowed Disruptions", "Age"]);
        assert_eq!(t["rows"][0]["cells"], json!(["web", "50%", "N/A", 1, "<unknown>"]));
    }

    #[test]
    fn daemon_sets_show_their_nodes_counts_and_node_selector() {
        let template =
            json!({"spec": {"nodeSelector": {"disk": "ssd"}, "containers": [{"name": "agent", "image": "a:1"}]}});
        let ds = json!({"metadata": {"name": "agent"}, "spec": {"selector": {"matchLabels": {"app": "agent"}}, "template": template},
                        "status": {"desiredNumberScheduled": 3, "currentNumberScheduled": 3, "numberReady": 2,
                                   "updatedNumberScheduled": 1, "numberAvailable": 2}});
        let t = table("DaemonSet", &[ds], "1", now());
        assert_eq!(
            names(&t),
            [
                "Name",
                "Desired",
                "Current",
                "Ready",
                "Up-to-date",
                "Available",
                "Node Selector",
                "Age",
                "Containers",
                "Images",
                "Selector"
            ]
        );
        assert_eq!(
            t["rows"][0]["cells"],
            json!(["agent", 3, 3, 2, 1, 2, "disk=ssd", "<unknown>", "agent", "a:1", "app=agent"])
        );
        let everywhere = json!({"metadata": {"name": "all"}, "spec": {"template": {"spec": {}}}});
        assert_eq!(table("DaemonSet", &[everywhere], "1", now())["rows"][0]["cells"][6], "<none>");
    }

    #[test]
    fn cron_jobs_show_schedule_time_zone_suspend_active_and_last_schedule() {
        let template = json!({"spec": {"template": {"spec": {"containers": [{"name": "hello", "image": "busybox"}]}}}});
        let cron_job = json!({"metadata": {"name": "hello"}, "spec": {"schedule": "*/1 * * * *", "suspend": false, "jobTemplate": template},
                              "status": {"active": [{"name": "hello-29000000"}], "lastScheduleTime": "2026-01-01T00:59:00Z"}});
        let t = table("CronJob", &[cron_job], "1", now());
        assert_eq!(
            names(&t),
            [
                "Name",
                "Schedule",
                "Timezone",
                "Suspend",
                "Active",
                "Last Schedule",
                "Age",
                "Containers",
                "Images",
                "Selector"
            ]
        );
        assert_eq!(
            t["rows"][0]["cells"],
            json!(["hello", "*/1 * * * *", "<none>", "False", 1, "60s", "<unknown>", "hello", "busybox", "<none>"])
        );
        let never = json!({"metadata": {"name": "tz"}, "spec": {"schedule": "@daily", "timeZone": "Europe/Berlin"}});
        assert_eq!(
            row("CronJob", never)[1..6],
            [json!("@daily"), json!("Europe/Berlin"), json!("<unset>"), json!(0), json!("<none>")]
        );
    }

    #[test]
    fn horizontal_pod_autoscalers_show_reference_targets_and_replicas() {
        let cpu = json!({"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 50}}});
        let memory = json!({"type": "Resource", "resource": {"name": "memory", "target": {"type": "AverageValue", "averageValue": "64Mi"}}});
        let hpa = json!({"metadata": {"name": "php-apache"},
            "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "php-apache"}, "minReplicas": 1, "maxReplicas": 10, "metrics": [cpu, memory]},
            "status": {"currentReplicas": 4, "currentMetrics": [{"type": "Resource", "resource": {"name": "cpu", "current": {"averageUtilization": 250}}}]}});
        let t = table("HorizontalPodAutoscaler", &[hpa], "1", now());
        assert_eq!(names(&t), ["Name", "Reference", "Targets", "MinPods", "MaxPods", "Replicas", "Age"]);
        assert_eq!(
            t["rows"][0]["cells"],
            json!([
                "php-apache",
                "Deployment/php-apache",
                "cpu: 250%/50%, memory: <unknown>/64Mi",
                "1",
                10,
                4,
                "<unknown>"
            ])
        );
        let fresh = json!({"metadata": {"name": "h"}, "spec": {"scaleTargetRef": {"kind": "Deployment", "name": "web"}, "maxReplicas": 3}});
        assert_eq!(
            row("HorizontalPodAutoscaler", fresh)[2..6],
            [json!("<none>"), json!("<unset>"), json!(3), json!(0)]
        );
    }

    #[test]
    fn jobs_show_status_completions_and_duration() {
        let job = |status: Value| {
            json!({"metadata": {"name": "migrate"}, "spec": {"completions": 2, "template": {"spec": {"containers": [{"name": "m", "image": "busybox"}]}},
                                          "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": "u1"}}}, "status": status})
        };
        let t = table("Job", &[job(json!({}))], "1", now());
        assert_eq!(names(&t), ["Name", "Status", "Completions", "Duration", "Age", "Containers", "Images", "Selector"]);
        assert_eq!(
            t["rows"][0]["cells"],
            json!([
                "migrate",
                "Running",
                "0/2",
                "",
                "<unknown>",
                "m",
                "busybox",
                "batch.kubernetes.io/controller-uid=u1"
            ])
        );
        let complete = row(
            "Job",
            job(json!({"succeeded": 2, "startTime": "2026-01-01T00:50:00Z", "completionTime": "2026-01-01T00:50:42Z",
                                              "conditions": [{"type": "Complete", "status": "True"}]})),
        );
        assert_eq!(complete[1..4], [json!("Complete"), json!("2/2"), json!("42s")]);
        let failed = row(
            "Job",
            job(json!({"startTime": "2026-01-01T00:58:00Z", "conditions": [{"type": "Failed", "status": "True"}]})),
        );
        assert_eq!(failed[1..4], [json!("Failed"), json!("0/2"), json!("2m")]);
    }

    #[test]
    fn nodes_show_roles_and_wide_system_info() {
        let node = json!({"metadata": {"name": "n1", "labels": {"node-role.kubernetes.io/control-plane": "", "kubernetes.io/role": "worker"}},
                          "spec": {"unschedulable": true},
                          "status": {"conditions": [{"type": "Ready", "status": "True"}],
                                     "addresses": [{"type": "InternalIP", "address": "172.29.0.2"}, {"type": "Hostname", "address": "n1"}],
                                     "nodeInfo": {"kubeletVersion": "v1.33.0-gitplane.0.1.0", "osImage": "Debian GNU/Linux 13",
                                                  "kernelVersion": "6.12.0", "containerRuntimeVersion": "containerd://1.6.20"}}});
        let t = table("Node", &[node], "1", now());
        assert_eq!(wide(&t), ["Internal-IP", "External-IP", "OS-Image", "Kernel-Version", "Container-Runtime"]);
        assert_eq!(
            t["rows"][0]["cells"],
            json!([
                "n1",
                "Ready,SchedulingDisabled",
                "control-plane,worker",
                "<unknown>",
                "v1.33.0-gitplane.0.1.0",
                "172.29.0.2",
                "<none>",
                "Debian GNU/Linux 13",
                "6.12.0",
                "containerd://1.6.20"
            ])
        );
        assert_eq!(row("Node", json!({"metadata": {"name": "n2"}}))[1..3], [json!("Unknown"), json!("<none>")]);
    }

    #[test]
    fn namespaces_config_maps_secrets_and_leases_have_their_columns() {
        let t =
            table("Namespace", &[json!({"metadata": {"name": "default"}, "status": {"phase": "Active"}})], "1", now());
        assert_eq!(
            (names(&t), &t["rows"][0]["cells"]),
            (vec!["Name", "Status", "Age"], &json!(["default", "Active", "<unknown>"]))
        );
        let cm = json!({"metadata": {"name": "c"}, "data": {"a": "1", "b": "2"}, "binaryData": {"c": "AA=="}});
        assert_eq!(json!(row("ConfigMap", cm)), json!(["c", 3, "<unknown>"]));
        let secret = json!({"metadata": {"name": "s"}, "type": "kubernetes.io/tls", "data": {"tls.crt": "<masked>", "tls.key": "<masked>"}});
        let t = table("Secret", &[secret], "1", now());
        assert_eq!(names(&t), ["Name", "Type", "Data", "Age"]);
        assert_eq!(t["rows"][0]["cells"], json!(["s", "kubernetes.io/tls", 2, "<unknown>"]));
        let lease =
            json!({"metadata": {"name": "n1", "namespace": "kube-node-lease"}, "spec": {"holderIdentity": "n1"}});
        assert_eq!(json!(row("Lease", lease)), json!(["n1", "n1", "<unknown>"]));
        let t = table("ServiceAccount", &[json!({"metadata": {"name": "default"}})], "1", now());
        assert_eq!(
            (names(&t), &t["rows"][0]["cells"]),
            (vec!["Name", "Secrets", "Age"], &json!(["default", 0, "<unknown>"]))
        );
        let binding = json!({"metadata": {"name": "readers"}, "roleRef": {"kind": "Role", "name": "pod-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "app", "namespace": "shop"}, {"kind": "Group", "name": "ops"}]});
        assert_eq!(
            json!(row("RoleBinding", binding)),
            json!(["readers", "Role/pod-reader", "<unknown>", "", "ops", "shop/app"])
        );
    }

    #[test]
    fn network_policies_print_their_pod_selector() {
        let t =
            table("NetworkPolicy", &[json!({"metadata": {"name": "deny"}, "spec": {"podSelector": {}}})], "1", now());
        assert_eq!(
            (names(&t), &t["rows"][0]["cells"]),
            (vec!["Name", "Pod-Selector", "Age"], &json!(["deny", "<none>", "<unknown>"]))
        );
        let web = json!({"metadata": {"name": "web"}, "spec": {"podSelector": {"matchLabels": {"app": "web"},
                        "matchExpressions": [{"key": "tier", "operator": "In", "values": ["b", "a"]}]}}});
        assert_eq!(row("NetworkPolicy", web)[1], json!("app=web,tier in (a,b)"));
    }

    #[test]
    fn storage_rows_read_like_kubectl() {
        let claim = |volume: &str| {
            json!({"metadata": {"name": "data"}, "spec": {"volumeName": volume, "storageClassName": "local-path",
                "volumeMode": "Filesystem", "resources": {"requests": {"storage": "1Gi"}}},
                "status": {"phase": if volume.is_empty() { "Pending" } else { "Bound" },
                    "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany", "ReadWriteOnce"]}})
        };
        let volume = json!({"metadata": {"name": "pv-1", "deletionTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"capacity": {"storage": "5Gi"}, "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain", "claimRef": {"namespace": "default", "name": "data"}},
            "status": {"phase": "Bound"}});
        let class = json!({"metadata": {"name": "local-path",
            "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
            "provisioner": "gitplane.io/local-path", "volumeBindingMode": "WaitForFirstConsumer"});
        let cases: Vec<(&str, Value, Vec<Value>)> = vec![
            (
                "PersistentVolumeClaim",
                claim("pv-1"),
                vec![
                    json!("data"),
                    json!("Bound"),
                    json!("pv-1"),
                    json!("1Gi"),
                    json!("RWO,RWX"),
                    json!("local-path"),
                    json!("<unset>"),
                ],
            ),
            (
                "PersistentVolumeClaim",
                claim(""),
                vec![
                    json!("data"),
                    json!("Pending"),
                    json!(""),
                    json!(""),
                    json!(""),
                    json!("local-path"),
                    json!("<unset>"),
                ],
            ),
            (
                "PersistentVolume",
                volume,
                vec![
                    json!("pv-1"),
                    json!("5Gi"),
                    json!("RWO"),
                    json!("Retain"),
                    json!("Terminating"),
                    json!("default/data"),
                    json!(""),
                    json!("<unset>"),
                    json!(""),
                ],
            ),
            (
                "StorageClass",
                class,
                vec![
                    json!("local-path (default)"),
                    json!("gitplane.io/local-path"),
                    json!("Delete"),
                    json!("WaitForFirstConsumer"),
                    json!(false),
                ],
            ),
        ];
        for (kind, object, want) in cases {
            let cells = row(kind, object);
            assert_eq!(cells[..want.len()], want[..], "{kind}");
        }
    }

    #[test]
    fn events_show_last_seen_object_and_wide_source_and_count() {
        let event = json!({"metadata": {"name": "web-1.17f0"}, "type": "Normal", "reason": "Scheduled",
                           "involvedObject": {"kind": "Pod", "name": "web-1", "fieldPath": "spec.containers{web}"},
                           "source": {"component": "default-scheduler"}, "message": " Successfully assigned default/web-1 to n1 ",
                           "firstTimestamp": "2026-01-01T00:50:00Z", "lastTimestamp": "2026-01-01T00:58:00Z", "count": 4});
        let t = table("Event", &[event], "1", now());
        assert_eq!(
            names(&t),
            ["Last Seen", "Type", "Reason", "Object", "Subobject", "Source", "Message", "First Seen", "Count", "Name"]
        );
        assert_eq!(wide(&t), ["Subobject", "Source", "First Seen", "Count", "Name"]);
        assert_eq!(
            t["rows"][0]["cells"],
            json!([
                "2m",
                "Normal",
                "Scheduled",
                "pod/web-1",
                "spec.containers{web}",
                "default-scheduler",
                "Successfully assigned default/web-1 to n1",
                "10m",
                4,
                "web-1.17f0"
            ])
        );
        let series = json!({"metadata": {"name": "e"}, "involvedObject": {"kind": "Node", "name": "n1"}, "reportingComponent": "kubelet",
                            "reportingInstance": "n1", "eventTime": "2026-01-01T00:40:00Z",
                            "series": {"count": 7, "lastObservedTime": "2026-01-01T00:59:00Z"}});
        let cells = row("Event", series);
        assert_eq!(
            (&cells[0], &cells[5], &cells[7], &cells[8]),
            (&json!("60s"), &json!("kubelet, n1"), &json!("20m"), &json!(7))
        );
    }

    #[test]
    fn every_served_kind_has_a_row_per_column() {
        for kind in [
            "Pod",
            "Service",
            "Endpoints",
            "ConfigMap",
            "Secret",
            "ServiceAccount",
            "LimitRange",
            "ResourceQuota",
            "Role",
            "ClusterRole",
            "RoleBinding",
            "ClusterRoleBinding",
            "Event",
            "Node",
            "Namespace",
            "Deployment",
            "ReplicaSet",
            "DaemonSet",
            "ReplicationController",
            "PodDisruptionBudget",
            "StatefulSet",
            "ControllerRevision",
            "Job",
            "EndpointSlice",
            "Lease",
            "NetworkPolicy",
            "PersistentVolumeClaim",
            "PersistentVolume",
            "StorageClass",
            "Application",
        ] {
            let t = table(kind, &[json!({"metadata": {"name": "x"}})], "1", now());
            assert_eq!(t["rows"][0]["cells"].as_array().unwrap().len(), names(&t).len(), "{kind}");
            assert!(names(&t).contains(&"Name"), "{kind}");
        }
    }
}
