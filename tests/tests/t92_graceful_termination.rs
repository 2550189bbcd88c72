//! Graceful deletion of Pods on `gitplane up --nodes 1`, seen with the real `kubectl`: a
//! scale-down by a push marks the surplus Pod terminating (`kubectl get pods` says
//! `Terminating`, its EndpointSlice endpoint `terminating: true`, the ReplicaSet no longer counts
//! it) while its container, which traps SIGTERM, finishes its work; the other Pod runs on
//! untouched; the status page says `Terminating` too; the object goes once the container has
//! exited, before its grace is over. A Pod
//! that ignores SIGTERM is killed once its grace period is over, and only then removed.

use anyhow::{Context, Result, ensure};
use gitplane_e2e::{LocalCluster, Worktree, require_root, wait_for};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::Value;
use std::{process::Command, time::Duration};

const DEADLINE: Duration = Duration::from_secs(120);

/// Exits 5 s after SIGTERM; a `sleep` in the background so that the trap runs at once.
const DRAINS: &str = "trap 'echo draining; /bin/busybox sleep 5; echo drained; exit 0' TERM; \
                      while true; do /bin/busybox sleep 1 & wait $!; done";
/// Ignores SIGTERM: only SIGKILL ends it.
const IGNORES: &str = "trap '' TERM; while true; do /bin/busybox sleep 1; done";

/// A Deployment `name` of `replicas` Pods running `script`, with `grace` seconds to stop.
fn deployment(name: &str, replicas: u32, grace: u32, script: &str) -> String {
    format!(
        "apiVersion: apps/v1
kind: Deployment
metadata:
  name: {name}
spec:
  replicas: {replicas}
  selector:
    matchLabels: {{app: {name}}}
  template:
    metadata:
      labels: {{app: {name}}}
    spec:
      terminationGracePeriodSeconds: {grace}
      containers:
      - name: main
        image: gitplane.local/httpd:1
        command: [/bin/busybox, sh, -c, {script:?}]
---
apiVersion: v1
kind: Service
metadata:
  name: {name}
spec:
  selector: {{app: {name}}}
  ports:
  - port: 80
"
    )
}

/// `kubectl get pods` as (name, STATUS) rows.
fn kubectl_pods(cluster: &LocalCluster) -> Result<Vec<(String, String)>> {
    let out = Command::new("kubectl")
        .args(["--server", &format!("http://{}", cluster.listen), "get", "pods", "--no-headers"])
        .output()
        .context("running kubectl (apt-get install kubectl)")?;
    ensure!(out.status.success(), "kubectl get pods: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let columns: Vec<&str> = l.split_whitespace().collect();
            Some((columns.first()?.to_string(), columns.get(2)?.to_string()))
        })
        .collect())
}

/// The Pods of `app` as the status API has them.
fn pods_of(cluster: &LocalCluster, app: &str) -> Result<Vec<Value>> {
    let list = cluster.get(&format!("/api/v1/namespaces/default/pods?labelSelector=app%3D{app}"))?;
    Ok(list["items"].as_array().cloned().unwrap_or_default())
}

fn name(pod: &Value) -> String {
    pod["metadata"]["name"].as_str().unwrap_or_default().to_owned()
}

/// The names of the Running, not terminating Pods of `app`, once there are `n` and nothing else.
fn wait_running(cluster: &LocalCluster, app: &str, n: usize) -> Result<Vec<String>> {
    wait_for(DEADLINE, || {
        let pods = pods_of(cluster, app).ok()?;
        let running: Vec<String> = pods
            .iter()
            .filter(|p| p["status"]["phase"] == "Running" && p["metadata"]["deletionTimestamp"].is_null())
            .map(name)
            .collect();
        (pods.len() == n && running.len() == n).then_some(running)
    })
    .with_context(|| format!("{n} Running Pods of {app}: {:?}\n{}", pods_of(cluster, app), cluster.log_tail()))
}

/// The terminating Pod of `app`, once `kubectl get pods` shows it `Terminating`.
fn wait_terminating(cluster: &LocalCluster, app: &str) -> Result<Value> {
    wait_for(DEADLINE, || {
        let pod = pods_of(cluster, app).ok()?.into_iter().find(|p| p["metadata"]["deletionTimestamp"].is_string())?;
        let shown = kubectl_pods(cluster).ok()?;
        shown.iter().any(|(n, status)| *n == name(&pod) && status == "Terminating").then_some(pod)
    })
    .with_context(|| format!("a Terminating Pod of {app}: {:?}\n{}", kubectl_pods(cluster), cluster.log_tail()))
}

/// The conditions of `pod`'s endpoint in the EndpointSlices of Service `service`.
fn endpoint_conditions(cluster: &LocalCluster, service: &str, pod: &str) -> Option<Value> {
    let path = format!(
        "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices?labelSelector=kubernetes.io%2Fservice-name%3D{service}"
    );
    let slices = cluster.get(&path).ok()?;
    slices["items"]
        .as_array()?
        .iter()
        .flat_map(|s| s["endpoints"].as_array().cloned().unwrap_or_default())
        .find(|e| e["targetRef"]["name"] == pod)
        .map(|e| e["conditions"].clone())
}

fn timestamp(v: &Value) -> Result<Timestamp> {
    v.as_str().context("a timestamp")?.parse().with_context(|| format!("{v} is not RFC 3339"))
}

/// Polls until no Pod of `app` is left: when that was seen.
fn wait_gone(cluster: &LocalCluster, app: &str) -> Result<Timestamp> {
    wait_for(DEADLINE, || pods_of(cluster, app).ok()?.is_empty().then(Timestamp::now))
        .with_context(|| format!("the Pods of {app} are never removed\n{}", cluster.log_tail()))
}

/// When the delete of `pod` was made: its deletionTimestamp is then plus its grace.
fn deleted_at(pod: &Value) -> Result<(Timestamp, Timestamp)> {
    let grace_end = timestamp(&pod["metadata"]["deletionTimestamp"])?;
    let grace = pod["metadata"]["deletionGracePeriodSeconds"].as_i64().context("deletionGracePeriodSeconds")?;
    Ok((grace_end - SignedDuration::from_secs(grace), grace_end))
}

#[test]
fn t92_pods_terminate_gracefully() -> Result<()> {
    require_root()?;
    let cluster = LocalCluster::up("gp92", 1)?;
    let work_dir = tempfile::tempdir()?;
    let work = Worktree::clone(cluster.demo_repo(), work_dir.path().join("demo"))?;
    work.remove("web.yaml")?;
    work.write("drain.yaml", &deployment("drain", 2, 30, DRAINS))?;
    work.write("stubborn.yaml", &deployment("stubborn", 1, 8, IGNORES))?;
    work.commit_and_push("two Deployments")?;
    let before = wait_running(&cluster, "drain", 2)?;
    wait_running(&cluster, "stubborn", 1)?;

    work.write("drain.yaml", &deployment("drain", 1, 30, DRAINS))?;
    work.write("stubborn.yaml", &deployment("stubborn", 0, 8, IGNORES))?;
    work.commit_and_push("scale down")?;

    std::thread::scope(|scope| -> Result<()> {
        // The Pod that ignores SIGTERM: Terminating until its 8 s are over, then killed and removed.
        let stubborn = scope.spawn(|| -> Result<(Value, Timestamp)> {
            let pod = wait_terminating(&cluster, "stubborn")?;
            Ok((pod, wait_gone(&cluster, "stubborn")?))
        });

        // The surplus Pod: Terminating in kubectl, a terminating endpoint, no longer a replica.
        let leaving = wait_terminating(&cluster, "drain")?;
        let leaving_name = name(&leaving);
        ensure!(leaving["metadata"]["deletionGracePeriodSeconds"] == 30, "{}", leaving["metadata"]);
        let (deleted, grace_end) = deleted_at(&leaving)?;
        let page = gitplane_testkit::http_get(
            cluster.listen,
            &format!("/ui/pods/default/{leaving_name}"),
            None,
            Duration::from_secs(10),
        )?;
        ensure!(page.contains(">Terminating<"), "the status page of {leaving_name} does not say Terminating:\n{page}");
        let conditions = wait_for(DEADLINE, || {
            endpoint_conditions(&cluster, "drain", &leaving_name).filter(|c| c["terminating"] == true)
        })
        .with_context(|| {
            format!("{leaving_name}'s endpoint: {:?}", endpoint_conditions(&cluster, "drain", &leaving_name))
        })?;
        ensure!(conditions["ready"] == false, "a terminating endpoint is not ready: {conditions}");
        let staying: Vec<&String> = before.iter().filter(|n| **n != leaving_name).collect();
        ensure!(staying.len() == 1, "one Pod stays: {before:?} less {leaving_name}");
        let staying = staying[0].clone();
        let counted = wait_for(DEADLINE, || {
            let d = cluster.get("/apis/apps/v1/namespaces/default/deployments/drain").ok()?;
            (d["status"]["replicas"] == 1).then_some(())
        });
        ensure!(counted.is_some(), "the Deployment still counts the terminating Pod");
        let drained = wait_for(DEADLINE, || cluster.kubectl_logs(&leaving_name).filter(|l| l.contains("draining")));
        ensure!(drained.is_some(), "{leaving_name} never got SIGTERM: {:?}", cluster.kubectl_logs(&leaving_name));

        // It goes once its container has exited, before its 30 s are over; the other runs on.
        let gone = wait_for(DEADLINE, || {
            (!pods_of(&cluster, "drain").ok()?.iter().any(|p| name(p) == leaving_name)).then(Timestamp::now)
        })
        .with_context(|| format!("{leaving_name} is never removed\n{}", cluster.log_tail()))?;
        let took = gone.duration_since(deleted).as_secs_f64();
        println!("drain (exits 5 s after SIGTERM, grace 30 s): delete to object gone {took:.1} s");
        ensure!(gone < grace_end, "{leaving_name} was removed at {gone}, after its grace ended at {grace_end}");
        ensure!(wait_running(&cluster, "drain", 1)? == [staying.clone()], "{staying} is not the one left running");
        let conditions = endpoint_conditions(&cluster, "drain", &staying);
        ensure!(
            conditions.as_ref().is_some_and(|c| c["ready"] == true && c["terminating"] == false),
            "{staying}'s endpoint: {conditions:?}"
        );

        let (pod, gone) = stubborn.join().expect("the stubborn Pod's watcher")?;
        let (deleted, grace_end) = deleted_at(&pod)?;
        let took = gone.duration_since(deleted).as_secs_f64();
        println!("stubborn (ignores SIGTERM, grace 8 s): delete to object gone {took:.1} s");
        // deletionTimestamp is in whole seconds.
        ensure!(gone + SignedDuration::from_secs(1) >= grace_end, "removed at {gone}, before its grace ended");
        Ok(())
    })
}
