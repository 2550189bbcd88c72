//! Probes on `gitplane up --nodes 1`, against real containerd: exec, httpGet
//! and tcpSocket probes pass on a healthy container (a startup exec probe gates a tcpSocket
//! liveness probe and an httpGet readiness probe: the Pod becomes Ready and nothing restarts)
//! and fail where they should (each handler's failure keeps its container not ready); a failing
//! liveness probe kills the container (exit 137, Error, in lastState) and it is restarted, with
//! the agent's log saying why; a readiness probe failing, then passing, moves the Pod's endpoint
//! of its Service to not ready and back, in the EndpointSlice and in Endpoints; a probe on a
//! port name the container does not declare rejects the commit with file and path. All traffic
//! stays in the namespaces `gitplane up` made.

use anyhow::{Context, Result, bail, ensure};
use gitplane_e2e::{LocalCluster, Worktree, require_root, wait_for};
use serde_json::Value;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(90);

const PODS: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: healthy
  labels: {app: healthy}
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: web
      image: gitplane.local/httpd:1
      ports: [{name: http, containerPort: 80}]
      startupProbe:
        exec: {command: [sh, -c, "test -f /www/index.html"]}
        periodSeconds: 1
      livenessProbe:
        tcpSocket: {port: http}
        periodSeconds: 1
        failureThreshold: 1
      readinessProbe:
        httpGet: {path: /index.html, port: http}
        periodSeconds: 1
---
apiVersion: v1
kind: Pod
metadata:
  name: failing
  labels: {app: failing}
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: http
      image: gitplane.local/httpd:1
      readinessProbe:
        httpGet: {path: /missing.html, port: 80}
        periodSeconds: 1
    - name: tcp
      image: gitplane.local/httpd:1
      command: [/bin/busybox, sleep, "3600"]
      readinessProbe:
        tcpSocket: {port: 81}
        periodSeconds: 1
    - name: exec
      image: gitplane.local/httpd:1
      command: [/bin/busybox, sleep, "3600"]
      readinessProbe:
        exec: {command: [sh, -c, "exit 3"]}
        periodSeconds: 1
---
apiVersion: v1
kind: Pod
metadata:
  name: liveness
  labels: {app: liveness}
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: web
      image: gitplane.local/httpd:1
      # httpd as PID 1 has no SIGTERM handler: the kill ends in SIGKILL, exit 137.
      command: [/bin/busybox, sh, -c, "echo ok > /tmp/alive; exec /bin/busybox httpd -f -p 80 -h /www"]
      livenessProbe:
        exec: {command: [sh, -c, "test -f /tmp/alive"]}
        periodSeconds: 1
        failureThreshold: 2
---
apiVersion: v1
kind: Pod
metadata:
  name: flip
  labels: {app: flip}
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: web
      image: gitplane.local/httpd:1
      ports: [{name: http, containerPort: 80}]
      readinessProbe:
        exec: {command: [sh, -c, "test -f /tmp/ready"]}
        periodSeconds: 1
        failureThreshold: 2
---
apiVersion: v1
kind: Service
metadata:
  name: flip
spec:
  selector: {app: flip}
  ports:
    - {name: http, port: 80, targetPort: http}
"#;

const BAD_PORT: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: misnamed
spec:
  containers:
    - name: web
      image: gitplane.local/httpd:1
      ports: [{name: http, containerPort: 80}]
      readinessProbe:
        httpGet: {path: /, port: htttp}
"#;

fn pod(cluster: &LocalCluster, name: &str) -> Result<Value> {
    cluster.get(&format!("/api/v1/namespaces/default/pods/{name}"))
}

fn containers(pod: &Value) -> Vec<Value> {
    pod["status"]["containerStatuses"].as_array().cloned().unwrap_or_default()
}

fn condition(pod: &Value, type_: &str) -> String {
    let conditions = pod["status"]["conditions"].as_array().cloned().unwrap_or_default();
    conditions
        .iter()
        .find(|c| c["type"] == type_)
        .map(|c| c["status"].as_str().unwrap_or("").to_owned())
        .unwrap_or_default()
}

fn running(container: &Value) -> bool {
    container["state"]["running"].is_object()
}

/// Polls `check` on the Pod until it holds; the error shows the Pod's last status.
fn wait_pod(cluster: &LocalCluster, name: &str, what: &str, check: impl Fn(&Value) -> bool) -> Result<Value> {
    tokio::task::block_in_place(|| wait_for(DEADLINE, || pod(cluster, name).ok().filter(|p| check(p)))).with_context(
        || format!("Pod {name}: {what}; its status: {:?}", pod(cluster, name).map(|p| p["status"].clone())),
    )
}

/// The `ready` condition of the flip Service's endpoints, in its EndpointSlice and in its
/// Endpoints (`addresses` or `notReadyAddresses`), once both name the Pod's address.
fn flip_endpoint(cluster: &LocalCluster, ip: &str) -> Option<(bool, bool)> {
    let slices = cluster
        .get("/apis/discovery.k8s.io/v1/namespaces/default/endpointslices?labelSelector=kubernetes.io%2Fservice-name%3Dflip")
        .ok()?;
    let endpoint = slices["items"]
        .as_array()?
        .iter()
        .flat_map(|s| s["endpoints"].as_array().cloned().unwrap_or_default())
        .find(|e| e["addresses"].as_array().is_some_and(|a| a.iter().any(|a| a == ip)))?;
    let in_slice = endpoint["conditions"]["ready"].as_bool()?;
    let endpoints = cluster.get("/api/v1/namespaces/default/endpoints/flip").ok()?;
    let listed = |field: &str| {
        endpoints["subsets"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|s| s[field].as_array().cloned().unwrap_or_default())
            .any(|a| a["ip"] == ip)
    };
    let in_endpoints = match (listed("addresses"), listed("notReadyAddresses")) {
        (true, false) => true,
        (false, true) => false,
        _ => return None,
    };
    Some((in_slice, in_endpoints))
}

fn wait_flip(cluster: &LocalCluster, ip: &str, ready: bool) -> Result<()> {
    tokio::task::block_in_place(|| wait_for(DEADLINE, || flip_endpoint(cluster, ip).filter(|e| *e == (ready, ready))))
        .map(drop)
        .with_context(|| {
            format!(
                "flip's endpoint {ip} should be ready={ready} in its EndpointSlice and Endpoints: {:?}",
                flip_endpoint(cluster, ip)
            )
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t65_probes() -> Result<()> {
    require_root()?;
    let cluster = tokio::task::block_in_place(|| LocalCluster::up("gp65", 1))?;
    let node = cluster.nodes[0].clone();
    let work_dir = tempfile::tempdir()?;
    let work = Worktree::clone(cluster.demo_repo(), work_dir.path().join("demo"))?;
    work.remove("web.yaml")?;
    work.write("probes.yaml", PODS)?;
    work.commit_and_push("Pods with probes")?;

    // Healthy: the startup exec probe passes, then tcpSocket liveness and httpGet readiness.
    let healthy = wait_pod(&cluster, "healthy", "Ready", |p| condition(p, "Ready") == "True")?;
    let web = &containers(&healthy)[0];
    ensure!(web["ready"] == true && web["started"] == true, "healthy's container: {web}");

    // Failing: each handler's failure keeps its container not ready, while it runs.
    let failing = wait_pod(&cluster, "failing", "3 running containers, each started", |p| {
        let cs = containers(p);
        cs.len() == 3 && cs.iter().all(|c| running(c) && c["started"] == true)
    })?;
    ensure!(condition(&failing, "Ready") == "False", "failing must not be Ready: {:?}", failing["status"]);
    ensure!(condition(&failing, "ContainersReady") == "False", "{:?}", failing["status"]);

    // Liveness: the probe passes until /tmp/alive goes, then the container is killed and runs
    // again.
    let live = wait_pod(&cluster, "liveness", "Ready", |p| condition(p, "Ready") == "True")?;
    let first = containers(&live)[0]["containerID"].as_str().context("a container id")?.to_owned();
    let id = first.strip_prefix("containerd://").context("a containerd id")?;
    cluster.exec(&node, id, &["/bin/busybox", "rm", "/tmp/alive"])?;
    let restarted = wait_pod(&cluster, "liveness", "restarted after its liveness probe failed", |p| {
        let c = &containers(p)[0];
        c["restartCount"].as_i64() >= Some(1) && running(c) && c["containerID"] != first.as_str()
    })?;
    let last = &containers(&restarted)[0]["lastState"]["terminated"];
    ensure!(last["exitCode"] == 137 && last["reason"] == "Error", "the killed run's lastState: {last}");
    let log = std::fs::read_to_string(cluster.data_dir.join("nodes").join(&node).join("agent.log"))?;
    ensure!(log.contains("Liveness probe failed: "), "the agent's log says nothing of the liveness failure");
    ensure!(log.contains("Container web failed liveness probe, will be restarted"), "the agent's log names no kill");
    let again = wait_pod(&cluster, "liveness", "Ready again", |p| condition(p, "Ready") == "True")?;
    ensure!(containers(&again)[0]["restartCount"] == containers(&restarted)[0]["restartCount"], "restarted again");

    // The healthy Pod held through all of that: its liveness probe never failed.
    let healthy = pod(&cluster, "healthy")?;
    ensure!(containers(&healthy)[0]["restartCount"] == 0, "healthy restarted: {:?}", healthy["status"]);
    ensure!(condition(&healthy, "Ready") == "True", "healthy is no longer Ready: {:?}", healthy["status"]);

    // Readiness moves flip's endpoint: not ready, ready, not ready, ready.
    let flip = wait_pod(&cluster, "flip", "running with an IP", |p| {
        p["status"]["podIP"].is_string() && containers(p).first().is_some_and(running)
    })?;
    let ip = flip["status"]["podIP"].as_str().context("flip's IP")?.to_owned();
    let flip_id = containers(&flip)[0]["containerID"].as_str().context("flip's container")?.to_owned();
    let flip_id = flip_id.strip_prefix("containerd://").context("a containerd id")?.to_owned();
    wait_flip(&cluster, &ip, false)?;
    for (cmd, ready) in [("touch", true), ("rm", false), ("touch", true)] {
        cluster.exec(&node, &flip_id, &["/bin/busybox", cmd, "/tmp/ready"])?;
        wait_flip(&cluster, &ip, ready)?;
        println!("after {cmd} /tmp/ready: flip's endpoint ready={ready}");
    }

    // A probe on a port name the container lacks: the commit is refused, naming file and path.
    let app = || cluster.get("/apis/gitplane.io/v1/namespaces/gitplane-system/applications/demo");
    work.write("misnamed.yaml", BAD_PORT)?;
    work.commit_and_push("a probe on a port name the container lacks")?;
    let failed = tokio::task::block_in_place(|| {
        wait_for(DEADLINE, || {
            let sync = app().ok()?["status"]["sync"].clone();
            (sync["status"] == "Failed" && sync["errors"].to_string().contains("misnamed.yaml")).then_some(sync)
        })
    })
    .with_context(|| {
        format!("the commit with misnamed.yaml was not rejected: {:?}", app().map(|a| a["status"].clone()))
    })?;
    let errors = failed["errors"].to_string();
    for part in ["/spec/containers/0/readinessProbe/httpGet/port", "names no port of container", "htttp"] {
        ensure!(errors.contains(part), "the rejection should say {part:?}: {errors}");
    }
    println!("misnamed.yaml rejected: {errors}");
    if pod(&cluster, "misnamed").is_ok() {
        bail!("the rejected Pod exists");
    }

    let status = tokio::task::block_in_place(|| cluster.stop(DEADLINE))?;
    ensure!(status.success(), "gitplane up --nodes exited with {status}");
    Ok(())
}
