//! Events from every component on `gitplane up --nodes 1` (issue 14 item 3), read with the real
//! `kubectl get events -o json` and `kubectl describe`: the scheduler's Scheduled and
//! FailedScheduling (with the per-plugin reasons), the deployment and ReplicaSet controllers'
//! ScalingReplicaSet and SuccessfulCreate, the job controller's Completed, the kubelet's Pulled,
//! Created and Started, one BackOff Event for a crash-looping container whose count grows
//! (not one Event per back-off), the source's Synced; and Events older than `--event-ttl` go.

use anyhow::{Context, Result, ensure};
use gitplane_e2e::{LocalCluster, Worktree, require_root, wait_for};
use serde_json::Value;
use std::{process::Command, time::Duration};

const DEADLINE: Duration = Duration::from_secs(180);
/// Long enough for the checks before it, short enough to wait out.
const TTL_SECONDS: u64 = 90;

const OBJECTS: &str = r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: events-web
spec:
  replicas: 2
  selector:
    matchLabels:
      app: events-web
  template:
    metadata:
      labels:
        app: events-web
    spec:
      terminationGracePeriodSeconds: 1
      containers:
        - name: web
          image: gitplane.local/httpd:1
          command: [/bin/busybox, sleep, "3600"]
---
apiVersion: v1
kind: Pod
metadata:
  name: crasher
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: crasher
      image: gitplane.local/httpd:1
      command: [/bin/busybox, sh, -c, "exit 1"]
---
apiVersion: v1
kind: Pod
metadata:
  name: nowhere
spec:
  nodeSelector:
    disk: none-has-this
  containers:
    - name: c
      image: gitplane.local/httpd:1
---
apiVersion: batch/v1
kind: Job
metadata:
  name: once
spec:
  template:
    spec:
      restartPolicy: Never
      terminationGracePeriodSeconds: 1
      containers:
        - name: c
          image: gitplane.local/httpd:1
          command: [/bin/busybox, "true"]
"#;

fn kubectl(cluster: &LocalCluster, args: &[&str]) -> Result<String> {
    let out = Command::new("kubectl")
        .arg("--server")
        .arg(format!("http://{}", cluster.listen))
        .args(args)
        .output()
        .context("running kubectl (apt-get install kubectl)")?;
    ensure!(out.status.success(), "kubectl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Every Event of the cluster, as `kubectl get events -A -o json` prints them.
fn events(cluster: &LocalCluster) -> Result<Vec<Value>> {
    let list: Value = serde_json::from_str(&kubectl(cluster, &["get", "events", "-A", "-o", "json"])?)?;
    Ok(list["items"].as_array().cloned().unwrap_or_default())
}

/// The Events about `kind/name` with `reason`.
fn about<'a>(events: &'a [Value], kind: &str, name_prefix: &str, reason: &str) -> Vec<&'a Value> {
    events
        .iter()
        .filter(|e| {
            e["involvedObject"]["kind"] == kind
                && e["involvedObject"]["name"].as_str().is_some_and(|n| n.starts_with(name_prefix))
                && e["reason"] == reason
        })
        .collect()
}

/// Waits until some Event about `kind/name…` with `reason` satisfies `check`; returns it.
fn wait_event(
    cluster: &LocalCluster,
    kind: &str,
    name_prefix: &str,
    reason: &str,
    check: impl Fn(&Value) -> bool,
) -> Result<Value> {
    wait_for(DEADLINE, || {
        let events = events(cluster).ok()?;
        about(&events, kind, name_prefix, reason).into_iter().find(|e| check(e)).cloned()
    })
    .with_context(|| {
        let agents: String = cluster
            .nodes
            .iter()
            .map(|n| {
                std::fs::read_to_string(cluster.data_dir.join("nodes").join(n).join("agent.log")).unwrap_or_default()
            })
            .collect();
        format!(
            "no {reason} event about {kind} {name_prefix}…; agents' logs:\n{agents}\nevents: {:#?}\n{}",
            events(cluster).map(|e| e
                .iter()
                .map(|e| format!("{} {} {}", e["involvedObject"]["name"], e["reason"], e["message"]))
                .collect::<Vec<_>>()),
            cluster.log_text()
        )
    })
}

fn message(event: &Value) -> &str {
    event["message"].as_str().unwrap_or_default()
}

#[test]
fn t74_events_from_every_component() -> Result<()> {
    require_root()?;
    let ttl = format!("--event-ttl={TTL_SECONDS}s");
    let cluster = LocalCluster::up_with("gp74", 1, &[&ttl])?;
    let node = cluster.nodes[0].clone();
    let work_dir = tempfile::tempdir()?;
    let work = Worktree::clone(cluster.demo_repo(), work_dir.path().join("demo"))?;
    work.remove("web.yaml")?;
    work.write("objects.yaml", OBJECTS)?;
    work.commit_and_push("objects that make events")?;

    // The controllers: the Deployment scaled its new ReplicaSet up, which created the Pods.
    let scaled = wait_event(&cluster, "Deployment", "events-web", "ScalingReplicaSet", |_| true)?;
    ensure!(
        message(&scaled).starts_with("Scaled up replica set events-web-") && message(&scaled).ends_with("from 0 to 2"),
        "{scaled}"
    );
    ensure!(scaled["source"]["component"] == "deployment-controller", "{scaled}");
    let created = wait_event(&cluster, "ReplicaSet", "events-web-", "SuccessfulCreate", |_| true)?;
    ensure!(message(&created).starts_with("Created pod: events-web-"), "{created}");

    // The scheduler and the kubelet, about a Pod of the Deployment; kubectl describe shows them.
    let pod_name = message(&created).trim_start_matches("Created pod: ").to_owned();
    let scheduled = wait_event(&cluster, "Pod", &pod_name, "Scheduled", |_| true)?;
    ensure!(message(&scheduled) == format!("Successfully assigned default/{pod_name} to {node}"), "{scheduled}");
    ensure!(scheduled["source"]["component"] == "default-scheduler", "{scheduled}");
    for reason in ["Pulled", "Created", "Started"] {
        let event = wait_event(&cluster, "Pod", &pod_name, reason, |_| true)?;
        ensure!(event["source"]["component"] == "kubelet" && event["source"]["host"] == node.as_str(), "{event}");
        ensure!(
            event["involvedObject"]["uid"].as_str().is_some_and(|u| !u.is_empty()),
            "describe needs the uid: {event}"
        );
    }
    let described = kubectl(&cluster, &["describe", "pod", &pod_name])?;
    let section = described.split("Events:").nth(1).with_context(|| format!("no Events in:\n{described}"))?;
    for line in ["Scheduled", "Successfully assigned", "Pulled", "Created", "Started", "Started container web"] {
        ensure!(section.contains(line), "kubectl describe pod has no {line:?}:\n{described}");
    }
    let described = kubectl(&cluster, &["describe", "deployment", "events-web"])?;
    ensure!(described.contains("ScalingReplicaSet"), "kubectl describe deployment:\n{described}");

    // An unschedulable Pod: FailedScheduling with the reason per plugin.
    let failed = wait_event(&cluster, "Pod", "nowhere", "FailedScheduling", |_| true)?;
    ensure!(failed["type"] == "Warning", "{failed}");
    ensure!(message(&failed).starts_with("0/1 nodes are available: 1 node(s) didn't match"), "{failed}");

    // The Job ran to completion.
    wait_event(&cluster, "Job", "once", "Completed", |_| true)?;
    wait_event(&cluster, "Job", "once", "SuccessfulCreate", |_| true)?;
    // The source synced the commit.
    wait_event(&cluster, "Application", "", "Synced", |e| message(e).contains("synced commit"))?;

    // A crash-looping container: one BackOff Event, counted, not one per back-off.
    let backoff = wait_event(&cluster, "Pod", "crasher", "BackOff", |e| e["count"].as_i64() >= Some(3))?;
    ensure!(
        backoff["type"] == "Warning" && message(&backoff).contains("Back-off restarting failed container crasher"),
        "{backoff}"
    );
    ensure!(backoff["firstTimestamp"] != backoff["lastTimestamp"], "a count of several has two times: {backoff}");
    let all = events(&cluster)?;
    let backoffs = about(&all, "Pod", "crasher", "BackOff");
    ensure!(backoffs.len() == 1, "one BackOff Event, not {}: {backoffs:#?}", backoffs.len());
    // The store holds a bounded number of Events although the container keeps crashing.
    ensure!(all.len() < 100, "{} events", all.len());

    // The TTL: the Scheduled Event happened once; it goes after the TTL.
    let scheduled_name = scheduled["metadata"]["name"].as_str().context("a name")?.to_owned();
    let gone = wait_for(Duration::from_secs(TTL_SECONDS) + DEADLINE, || {
        let events = events(&cluster).ok()?;
        (!events.iter().any(|e| e["metadata"]["name"] == scheduled_name.as_str())).then_some(())
    });
    ensure!(gone.is_some(), "the Scheduled event {scheduled_name} outlived --event-ttl={TTL_SECONDS}s");
    Ok(())
}
