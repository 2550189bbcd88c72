//! `kubectl get` columns: objects rendered as a `meta.k8s.io/v1` Table, the way the API server's
//! table convertors render each kind. Pure: objects in, a Table out.

use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

fn column(name: &str, kind: &str, description: &str) -> Value {
    let format = if name == "Name" { "name" } else { "" };
    json!({"name": name, "type": kind, "format": format, "description": description, "priority": 0})
}

/// `5s`, `12m`, `3h4m`, `2d` as `kubectl` prints ages.
pub fn age(created: Option<&str>, now: Timestamp) -> String {
    let Some(created) = created.and_then(|c| c.parse::<Timestamp>().ok()) else { return "<unknown>".into() };
    let s = now.duration_since(created).as_secs().max(0);
    match s {
        0..120 => format!("{s}s"),
        120..600 => format!("{}m{}s", s / 60, s % 60),
        600..10_800 => format!("{}m", s / 60),
        10_800..172_800 => format!("{}h{}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d", s / 86_400),
    }
}

fn text(v: &Value) -> String {
    v.as_str().unwrap_or("").to_owned()
}

fn int(v: &Value) -> i64 {
    v.as_i64().unwrap_or(0)
}

/// The columns after Name for a kind, and a row's cells for them.
fn columns(kind: &str) -> Vec<Value> {
    let cols: &[(&str, &str)] = match kind {
        "Pod" => &[
            ("Ready", "string"),
            ("Status", "string"),
            ("Restarts", "integer"),
            ("Age", "string"),
            ("IP", "string"),
            ("Node", "string"),
        ],
        "Deployment" => &[("Ready", "string"), ("Up-to-date", "integer"), ("Available", "integer"), ("Age", "string")],
        "ReplicaSet" => &[("Desired", "integer"), ("Current", "integer"), ("Ready", "integer"), ("Age", "string")],
        "Job" => &[("Status", "string"), ("Completions", "string"), ("Age", "string")],
        "Service" => &[
            ("Type", "string"),
            ("Cluster-IP", "string"),
            ("External-IP", "string"),
            ("Port(s)", "string"),
            ("Age", "string"),
        ],
        "Endpoints" => &[("Endpoints", "string"), ("Age", "string")],
        "EndpointSlice" => {
            &[("AddressType", "string"), ("Ports", "string"), ("Endpoints", "string"), ("Age", "string")]
        }
        "Node" => &[("Status", "string"), ("Age", "string"), ("Version", "string"), ("Pod-CIDR", "string")],
        "Application" => &[("Sync", "string"), ("Health", "string"), ("Revision", "string"), ("Age", "string")],
        "Event" => &[("Type", "string"), ("Reason", "string"), ("Object", "string"), ("Message", "string")],
        _ => &[("Age", "string")],
    };
    std::iter::once(column("Name", "string", "Name of the object"))
        .chain(cols.iter().map(|(n, t)| column(n, t, "")))
        .collect()
}

/// kubectl's status of a Pod still initializing: `Init:<reason>` for the first init container
/// that failed or waits for a reason, else `Init:<done>/<total>`; `None` once all succeeded.
fn init_reason(statuses: &[Value], total: usize) -> Option<String> {
    for (i, c) in statuses.iter().enumerate() {
        let (waiting, terminated) = (&c["state"]["waiting"], &c["state"]["terminated"]);
        if terminated.is_object() && int(&terminated["exitCode"]) == 0 {
            continue;
        }
        let reason = match (terminated["reason"].as_str(), waiting["reason"].as_str()) {
            (Some(reason), _) if !reason.is_empty() => format!("Init:{reason}"),
            _ if terminated.is_object() => format!("Init:ExitCode:{}", int(&terminated["exitCode"])),
            (_, Some(reason)) if !reason.is_empty() && reason != "PodInitializing" => format!("Init:{reason}"),
            _ => format!("Init:{i}/{total}"),
        };
        return Some(reason);
    }
    None
}

fn cells(kind: &str, o: &Value, now: Timestamp) -> Vec<Value> {
    let age = age(o["metadata"]["creationTimestamp"].as_str(), now);
    let (spec, status) = (&o["spec"], &o["status"]);
    let mut cells = vec![json!(text(&o["metadata"]["name"]))];
    match kind {
        "Pod" => {
            let containers = status["containerStatuses"].as_array().cloned().unwrap_or_default();
            let total = spec["containers"].as_array().map_or(0, Vec::len);
            let ready = containers.iter().filter(|c| c["ready"] == true).count();
            let init = status["initContainerStatuses"].as_array().cloned().unwrap_or_default();
            let restarts: i64 = containers.iter().chain(&init).map(|c| int(&c["restartCount"])).sum();
            // As kubectl: a waiting or terminated reason says more than the phase.
            let reason = init_reason(&init, spec["initContainers"].as_array().map_or(0, Vec::len))
                .or_else(|| {
                    containers
                        .iter()
                        .find_map(|c| {
                            c["state"]["waiting"]["reason"].as_str().or(c["state"]["terminated"]["reason"].as_str())
                        })
                        .map(str::to_owned)
                })
                .unwrap_or_else(|| status["phase"].as_str().unwrap_or("Pending").to_owned());
            let ip = status["podIP"].as_str().unwrap_or("<none>");
            let node = spec["nodeName"].as_str().unwrap_or("<none>");
            cells.extend([
                json!(format!("{ready}/{total}")),
                json!(reason),
                json!(restarts),
                json!(age),
                json!(ip),
                json!(node),
            ]);
        }
        "Deployment" => {
            let want = spec["replicas"].as_i64().unwrap_or(1);
            cells.extend([
                json!(format!("{}/{want}", int(&status["readyReplicas"]))),
                json!(int(&status["updatedReplicas"])),
                json!(int(&status["availableReplicas"])),
                json!(age),
            ]);
        }
        "ReplicaSet" => {
            cells.extend([
                json!(int(&spec["replicas"])),
                json!(int(&status["replicas"])),
                json!(int(&status["readyReplicas"])),
                json!(age),
            ]);
        }
        "Job" => {
            let finished = status["conditions"].as_array().into_iter().flatten().find_map(|c| {
                (c["status"] == "True")
                    .then(|| c["type"].as_str())
                    .flatten()
                    .filter(|t| matches!(*t, "Complete" | "Failed"))
            });
            let state = finished.unwrap_or(if int(&status["active"]) > 0 { "Running" } else { "Pending" });
            let completions = spec["completions"].as_i64().unwrap_or(1);
            cells.extend([json!(state), json!(format!("{}/{completions}", int(&status["succeeded"]))), json!(age)]);
        }
        "Service" => {
            // As kubectl prints them: `80:30080/TCP` when a nodePort is allocated.
            let ports: Vec<String> = spec["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|p| {
                    let protocol = p["protocol"].as_str().unwrap_or("TCP");
                    match p["nodePort"].as_i64() {
                        Some(node_port) => format!("{}:{node_port}/{protocol}", int(&p["port"])),
                        None => format!("{}/{protocol}", int(&p["port"])),
                    }
                })
                .collect();
            let kind = spec["type"].as_str().unwrap_or("ClusterIP");
            let ingress: Vec<&str> = status["loadBalancer"]["ingress"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|i| i["ip"].as_str().or(i["hostname"].as_str()))
                .chain(spec["externalIPs"].as_array().into_iter().flatten().filter_map(Value::as_str))
                .collect();
            let external = match kind {
                "ExternalName" => spec["externalName"].as_str().unwrap_or("<none>").to_owned(),
                _ if !ingress.is_empty() => ingress.join(","),
                "LoadBalancer" => "<pending>".to_owned(),
                _ => "<none>".to_owned(),
            };
            cells.extend([
                json!(kind),
                json!(spec["clusterIP"].as_str().unwrap_or("<none>")),
                json!(external),
                json!(if ports.is_empty() { "<none>".to_owned() } else { ports.join(",") }),
                json!(age),
            ]);
        }
        "Endpoints" => cells.extend([json!(endpoints(o)), json!(age)]),
        "EndpointSlice" => {
            let ports = array(&o["ports"]).map(|p| match (p["port"].as_i64(), p["name"].as_str()) {
                (Some(port), _) => port.to_string(),
                (None, Some(name)) => name.to_owned(),
                (None, None) => "*".to_owned(),
            });
            let addresses = array(&o["endpoints"]).flat_map(|e| array(&e["addresses"]).map(text).collect::<Vec<_>>());
            cells.extend([
                json!(text(&o["addressType"])),
                json!(at_most_three(ports, "<unset>")),
                json!(at_most_three(addresses, "<unset>")),
                json!(age),
            ]);
        }
        "Node" => {
            let ready = status["conditions"].as_array().into_iter().flatten().find(|c| c["type"] == "Ready");
            let state = match ready.and_then(|c| c["status"].as_str()) {
                Some("True") => "Ready",
                _ => "NotReady",
            };
            cells.extend([
                json!(state),
                json!(age),
                json!(text(&status["nodeInfo"]["kubeletVersion"])),
                json!(spec["podCIDR"].as_str().unwrap_or("<none>")),
            ]);
        }
        "Application" => {
            let revision = status["sync"]["revision"].as_str().map(|r| r.get(..12).unwrap_or(r)).unwrap_or("<none>");
            cells.extend([
                json!(status["sync"]["status"].as_str().unwrap_or("Unknown")),
                json!(status["health"]["status"].as_str().unwrap_or("Unknown")),
                json!(revision),
                json!(age),
            ]);
        }
        "Event" => {
            let object =
                format!("{}/{}", text(&o["involvedObject"]["kind"]).to_lowercase(), text(&o["involvedObject"]["name"]));
            cells.extend([
                json!(text(&o["type"])),
                json!(text(&o["reason"])),
                json!(object),
                json!(text(&o["message"])),
            ]);
        }
        _ => cells.push(json!(age)),
    }
    cells
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

/// The Table for `items` of `kind`, each row carrying its object's metadata (what
/// `kubectl get -A` reads the namespace from).
pub fn table(kind: &str, items: &[Value], resource_version: &str, now: Timestamp) -> Value {
    let rows: Vec<Value> = items
        .iter()
        .map(|o| {
            json!({
                "cells": cells(kind, o, now),
                "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"].clone()},
            })
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

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> Timestamp {
        "2026-01-01T01:00:00Z".parse().unwrap()
    }

    #[test]
    fn ages_read_like_kubectl() {
        assert_eq!(age(Some("2026-01-01T00:59:30Z"), now()), "30s");
        assert_eq!(age(Some("2026-01-01T00:55:00Z"), now()), "5m0s");
        assert_eq!(age(Some("2026-01-01T00:00:00Z"), now()), "60m");
        assert_eq!(age(Some("2025-12-25T01:00:00Z"), now()), "7d");
        assert_eq!(age(None, now()), "<unknown>");
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
        assert_eq!(names, ["Name", "Ready", "Status", "Restarts", "Age", "IP", "Node"]);
        assert_eq!(t["rows"][0]["cells"], json!(["web-1", "1/2", "CrashLoopBackOff", 3, "60s", "10.244.0.5", "n1"]));
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
            (row[2].as_str().unwrap_or_default().to_owned(), row[3].as_i64().unwrap_or(-1))
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
            json!(["demo", "Synced", "Healthy", "0123456789ab", "<unknown>"])
        );
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
            json!(["s", "NodePort", "10.96.0.7", "<none>", "80:30080/TCP", "<unknown>"])
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
}
