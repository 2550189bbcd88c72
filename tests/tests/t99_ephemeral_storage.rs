//! Local ephemeral storage on the real `gitplane up --nodes 1`, seen with the real `kubectl`,
//! each Pod writing with busybox `dd`:
//! - a Deployment whose container writes past its `limits.ephemeral-storage` is evicted (a
//!   Warning `Evicted` Event with the kubelet's message) and its ReplicaSet replaces the Pod;
//! - a Pod whose emptyDir outgrows its `sizeLimit` is evicted and stays, Failed, its reason
//!   `Evicted` and its message the kubelet's, as kubectl shows them;
//! - a Pod under its limit runs on untouched meanwhile.

use anyhow::{Context, Result, ensure};
use gitplane_e2e::{LocalCluster, Worktree, require_root, wait_for};
use serde_json::Value;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(180);

/// A Deployment `name` whose container `main` writes `mib` MiB to its writable layer, under
/// `limit`, beside an idle container with a larger limit (so the Pod's total is not what it
/// goes over first).
fn deployment(name: &str, mib: u32, limit: &str) -> String {
    format!(
        "apiVersion: apps/v1
kind: Deployment
metadata:
  name: {name}
spec:
  replicas: 1
  selector:
    matchLabels: {{app: {name}}}
  template:
    metadata:
      labels: {{app: {name}}}
    spec:
      terminationGracePeriodSeconds: 30
      containers:
      - name: main
        image: gitplane.local/httpd:1
        command: [/bin/busybox, sh, -c, '/bin/busybox dd if=/dev/zero of=/fill bs=1M count={mib} && exec /bin/busybox sleep 3600']
        resources:
          limits: {{ephemeral-storage: {limit}}}
      - name: idle
        image: gitplane.local/httpd:1
        command: [/bin/busybox, sleep, '3600']
        resources:
          limits: {{ephemeral-storage: 64Mi}}
"
    )
}

/// A Pod that writes 8 MiB into an emptyDir of `sizeLimit: 4Mi`.
const CACHE_FILLER: &str = "apiVersion: v1
kind: Pod
metadata:
  name: cache-filler
spec:
  volumes:
  - name: cache
    emptyDir: {sizeLimit: 4Mi}
  containers:
  - name: main
    image: gitplane.local/httpd:1
    command: [/bin/busybox, sh, -c, '/bin/busybox dd if=/dev/zero of=/cache/fill bs=1M count=8 && exec /bin/busybox sleep 3600']
    volumeMounts: [{name: cache, mountPath: /cache}]
";

fn pods_of(cluster: &LocalCluster, app: &str) -> Result<Vec<Value>> {
    let list = cluster.get(&format!("/api/v1/namespaces/default/pods?labelSelector=app%3D{app}"))?;
    Ok(list["items"].as_array().cloned().unwrap_or_default())
}

/// Running, both its containers too.
fn running(pod: &Value) -> bool {
    let containers = pod["status"]["containerStatuses"].as_array().into_iter().flatten();
    pod["status"]["phase"] == "Running" && containers.clone().filter(|c| c["state"]["running"].is_object()).count() == 2
}

/// The Warning `Evicted` Events, as (Pod name, message).
fn evictions(cluster: &LocalCluster) -> Result<Vec<(String, String)>> {
    let list = cluster.get("/api/v1/namespaces/default/events")?;
    let events = list["items"].as_array().into_iter().flatten();
    Ok(events
        .filter(|e| e["reason"] == "Evicted" && e["type"] == "Warning")
        .map(|e| {
            let pod = e["involvedObject"]["name"].as_str().unwrap_or_default().to_owned();
            (pod, e["message"].as_str().unwrap_or_default().to_owned())
        })
        .collect())
}

fn explain(cluster: &LocalCluster) -> String {
    let rows = cluster.kubectl(&["get", "pods", "-o", "wide"]).unwrap_or_else(|e| e.to_string());
    let events = cluster.kubectl(&["get", "events"]).unwrap_or_else(|e| e.to_string());
    format!("{rows}\n{events}\n{}", cluster.log_tail())
}

#[test]
fn t99_pods_over_their_local_storage_limits_are_evicted() -> Result<()> {
    require_root()?;
    let dir = tempfile::tempdir()?;
    let cluster = LocalCluster::up("gp99", 1)?;
    let work = Worktree::clone(cluster.demo_repo(), dir.path().join("demo"))?;
    work.remove("web.yaml")?;
    work.write("quiet.yaml", &deployment("quiet", 1, "64Mi"))?;
    work.commit_and_push("a Pod well under its limit")?;
    let quiet = wait_for(DEADLINE, || pods_of(&cluster, "quiet").ok()?.into_iter().find(running))
        .with_context(|| format!("quiet never runs\n{}", explain(&cluster)))?;

    work.write("writer.yaml", &deployment("writer", 24, "8Mi"))?;
    work.write("cache-filler.yaml", CACHE_FILLER)?;
    work.commit_and_push("a container and an emptyDir over their limits")?;

    // The Deployment's Pod: evicted with the kubelet's words, and replaced by its ReplicaSet.
    let container_message = "Container main exceeded its local ephemeral storage limit \"8Mi\". ";
    let evicted = wait_for(DEADLINE, || {
        let found = evictions(&cluster).ok()?;
        found.into_iter().find(|(pod, message)| pod.starts_with("writer-") && message == container_message)
    })
    .with_context(|| format!("the writer is never evicted\n{}", explain(&cluster)))?;
    let events = cluster.kubectl(&["get", "events", "--field-selector", "reason=Evicted"])?;
    ensure!(
        events.lines().any(|l| l.contains("Warning") && l.contains(&evicted.0) && l.contains(container_message.trim())),
        "kubectl does not show the eviction: {events}"
    );
    wait_for(DEADLINE, || {
        let pods = pods_of(&cluster, "writer").ok()?;
        pods.iter().any(|p| p["metadata"]["name"] != evicted.0.as_str()).then_some(())
    })
    .with_context(|| format!("the evicted writer is never replaced\n{}", explain(&cluster)))?;

    // The bare Pod whose emptyDir outgrew its sizeLimit: Failed, Evicted, and kept.
    let emptydir_message = "Usage of EmptyDir volume \"cache\" exceeds the limit \"4Mi\". ";
    let filler = wait_for(DEADLINE, || {
        let pod = cluster.get("/api/v1/namespaces/default/pods/cache-filler").ok()?;
        (pod["status"]["phase"] == "Failed").then_some(pod)
    })
    .with_context(|| format!("cache-filler is never evicted\n{}", explain(&cluster)))?;
    let status = &filler["status"];
    ensure!(status["reason"] == "Evicted" && status["message"] == emptydir_message, "cache-filler: {status}");
    let terminated = &status["containerStatuses"][0]["state"]["terminated"];
    ensure!(terminated.is_object(), "cache-filler's container was not stopped: {status}");
    // kubectl's STATUS column says what the stopped container says, as upstream's printer does
    // for an evicted Pod; the Pod's reason and message are the eviction's.
    let shown =
        cluster.kubectl(&["get", "pod", "cache-filler", "-o", "jsonpath={.status.reason}: {.status.message}"])?;
    ensure!(shown == format!("Evicted: {emptydir_message}"), "kubectl's reason and message: {shown:?}");
    ensure!(
        evictions(&cluster)?.iter().any(|(pod, m)| pod == "cache-filler" && m == emptydir_message),
        "no Evicted Event for cache-filler\n{}",
        explain(&cluster)
    );

    // The Pod under its limit ran on through all of it.
    let quiet_name = quiet["metadata"]["name"].as_str().context("quiet's name")?;
    let now = cluster.get(&format!("/api/v1/namespaces/default/pods/{quiet_name}"))?;
    ensure!(
        running(&now) && now["metadata"]["uid"] == quiet["metadata"]["uid"],
        "quiet did not run on: {}",
        now["status"]
    );
    ensure!(now["status"]["containerStatuses"][0]["restartCount"] == 0, "quiet restarted: {}", now["status"]);
    ensure!(!evictions(&cluster)?.iter().any(|(pod, _)| pod == quiet_name), "quiet was evicted");

    cluster.stop_within(Duration::from_secs(30))?;
    Ok(())
}
