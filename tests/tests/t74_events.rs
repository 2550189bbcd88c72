//! Events from every component on `gitplane up --nodes 1`, read with the real
//! `kubectl get events -o json` and `kubectl describe`: the scheduler's Scheduled and
//! FailedScheduling (with the per-plugin reasons), the deployment and ReplicaSet controllers'
//! ScalingReplicaSet and SuccessfulCreate, the job controller's Completed, the kubelet's Pulled,
//! Created and Started, FailedMount for a Secret volume whose Secret is missing and for nfs
//! volumes (in the Pod, and behind a claim bound to a static volume), which no node can mount
//! (the source's UnmountableVolume warning at sync), Killing for the
//! container of a Pod the ReplicaSet deleted when the Deployment scaled down, one BackOff Event
//! for a crash-looping container whose count grows (not one Event per back-off), the source's
//! Synced; and Events older than `--event-ttl` go. A second test: no Event carries a Secret's
//! value (the node service masks those of the Secrets a Pod references in the Pod's Events);
//! there the kubelet's Pulling, Unhealthy, Killing (a failed liveness probe) and BackOff appear.

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
  name: mountless
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: c
      image: gitplane.local/httpd:1
      command: [/bin/busybox, sleep, "3600"]
      volumeMounts: [{name: s, mountPath: /etc/missing}]
  volumes:
    - name: s
      secret: {secretName: not-there}
---
apiVersion: v1
kind: Pod
metadata:
  name: inline-nfs
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: c
      image: gitplane.local/httpd:1
      volumeMounts: [{name: data, mountPath: /data}]
  volumes:
    - name: data
      nfs: {server: nfs.invalid, path: /exports}
---
apiVersion: v1
kind: PersistentVolume
metadata:
  name: events-nfs
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteMany]
  storageClassName: manual
  nfs: {server: nfs.invalid, path: /exports}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: nfs-claim
spec:
  accessModes: [ReadWriteMany]
  storageClassName: manual
  resources: {requests: {storage: 1Gi}}
---
apiVersion: v1
kind: Pod
metadata:
  name: claimed-nfs
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: c
      image: gitplane.local/httpd:1
      volumeMounts: [{name: data, mountPath: /data}]
  volumes:
    - name: data
      persistentVolumeClaim: {claimName: nfs-claim}
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

/// Every Event of the cluster, as `kubectl get events -A -o json` prints them.
fn events(cluster: &LocalCluster) -> Result<Vec<Value>> {
    let list: Value = serde_json::from_str(&cluster.kubectl(&["get", "events", "-A", "-o", "json"])?)?;
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
    let described = cluster.kubectl(&["describe", "pod", &pod_name])?;
    let section = described.split("Events:").nth(1).with_context(|| format!("no Events in:\n{described}"))?;
    for line in ["Scheduled", "Successfully assigned", "Pulled", "Created", "Started", "Started container web"] {
        ensure!(section.contains(line), "kubectl describe pod has no {line:?}:\n{described}");
    }
    let described = cluster.kubectl(&["describe", "deployment", "events-web"])?;
    ensure!(described.contains("ScalingReplicaSet"), "kubectl describe deployment:\n{described}");

    // A Secret volume whose Secret is missing: FailedMount.
    let mount = wait_event(&cluster, "Pod", "mountless", "FailedMount", |_| true)?;
    ensure!(mount["type"] == "Warning" && message(&mount).contains("not-there"), "{mount}");
    // nfs volumes: accepted with a warning, as the API server accepts them; the kubelet has no
    // plugin, so the Pods wait in ContainerCreating, in the Pod or behind a bound claim.
    let warned = wait_event(&cluster, "Pod", "inline-nfs", "UnmountableVolume", |_| true)?;
    ensure!(warned["type"] == "Warning" && message(&warned).contains("/spec/volumes/0/nfs"), "{warned}");
    for (pod, says) in
        [("inline-nfs", "cannot mount an nfs volume"), ("claimed-nfs", "\"events-nfs\" is an nfs volume")]
    {
        let mount = wait_event(&cluster, "Pod", pod, "FailedMount", |_| true)?;
        ensure!(message(&mount).contains("no volume plugin matched") && message(&mount).contains(says), "{mount}");
        let status = cluster.kubectl(&[
            "get",
            "pod",
            pod,
            "-o",
            "jsonpath={.status.phase} {.status.containerStatuses[0].state.waiting.reason}",
        ])?;
        ensure!(status.trim() == "Pending ContainerCreating", "{pod}: {status}");
    }
    let bound = cluster.kubectl(&["get", "pv", "events-nfs", "-o", "jsonpath={.status.phase}"])?;
    ensure!(bound.trim() == "Bound", "the static nfs volume binds: {bound}");

    // Scaled down: the ReplicaSet deletes a Pod, and the kubelet says it stops its container,
    // although the Pod is gone by the time the Event arrives.
    work.write("objects.yaml", &OBJECTS.replacen("replicas: 2", "replicas: 1", 1))?;
    work.commit_and_push("one replica")?;
    let killing = wait_event(&cluster, "Pod", "events-web-", "Killing", |_| true)?;
    ensure!(message(&killing) == "Stopping container web", "{killing}");
    ensure!(killing["source"]["component"] == "kubelet", "{killing}");

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

/// A value no Event may carry: the Secret's, in clear and as stored (base64).
const SECRET_VALUE: &str = "t74-Sup3r-s3cret-9f1c0d";

const SECRET_OBJECTS: &str = r#"apiVersion: v1
kind: Secret
metadata:
  name: t74-secret
stringData:
  password: t74-Sup3r-s3cret-9f1c0d
---
apiVersion: v1
kind: Pod
metadata:
  name: secret-pull
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: c
      image: gitplane.local/not-there:1
      imagePullPolicy: IfNotPresent
      env:
        - name: PASSWORD
          valueFrom: {secretKeyRef: {name: t74-secret, key: password}}
      volumeMounts: [{name: s, mountPath: /etc/secret}]
  volumes:
    - name: s
      secret: {secretName: t74-secret}
---
apiVersion: v1
kind: Pod
metadata:
  name: secret-probe
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: c
      image: gitplane.local/httpd:1
      imagePullPolicy: IfNotPresent
      command: [/bin/busybox, sleep, "3600"]
      env:
        - name: PASSWORD
          valueFrom: {secretKeyRef: {name: t74-secret, key: password}}
      volumeMounts: [{name: s, mountPath: /etc/secret}]
      livenessProbe:
        exec:
          command: [/bin/busybox, sh, -c, 'echo "env $PASSWORD"; echo "file $(cat /etc/secret/password)"; exit 1']
        periodSeconds: 2
        failureThreshold: 2
  volumes:
    - name: s
      secret: {secretName: t74-secret}
---
apiVersion: v1
kind: Pod
metadata:
  name: secret-crash
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: c
      image: gitplane.local/httpd:1
      imagePullPolicy: IfNotPresent
      command: [/bin/busybox, sh, -c, 'echo "$PASSWORD"; cat /etc/secret/password >&2; exit 3']
      env:
        - name: PASSWORD
          valueFrom: {secretKeyRef: {name: t74-secret, key: password}}
      volumeMounts: [{name: s, mountPath: /etc/secret}]
  volumes:
    - name: s
      secret: {secretName: t74-secret}
"#;

/// Secret masking in Events: Pods that read a Secret through env and a volume fail to
/// pull, fail a liveness probe whose output prints the value, and crash after printing it; the
/// Events they cause (read with `kubectl get events -o json` and followed with a watch) never
/// carry the value, in clear or in base64.
#[test]
fn t74_no_event_carries_a_secret_value() -> Result<()> {
    require_root()?;
    let cluster = LocalCluster::up("gp74s", 1)?;
    let work_dir = tempfile::tempdir()?;
    let work = Worktree::clone(cluster.demo_repo(), work_dir.path().join("demo"))?;
    work.remove("web.yaml")?;
    work.write("secret.yaml", SECRET_OBJECTS)?;
    // Every Event as the watch delivers it, from before the push (ended below, by its PID).
    let watched = work_dir.path().join("watch.json");
    let mut watch = Command::new("curl")
        .args(["-sSN", "--max-time", "600"])
        .arg(format!("http://{}/api/v1/events?watch=1&timeoutSeconds=600", cluster.listen))
        .stdout(std::fs::File::create(&watched)?)
        .spawn()
        .context("running curl")?;
    work.commit_and_push("Pods that use a Secret and fail")?;

    let result = (|| -> Result<()> {
        // The probe's output had the value: the Event says it masked.
        let unhealthy = wait_event(&cluster, "Pod", "secret-probe", "Unhealthy", |e| message(e).contains("<masked>"))?;
        ensure!(message(&unhealthy).contains("env <masked>"), "{unhealthy}");
        wait_event(&cluster, "Pod", "secret-probe", "Killing", |_| true)?;
        wait_event(&cluster, "Pod", "secret-crash", "BackOff", |_| true)?;
        let pulling = wait_event(&cluster, "Pod", "secret-pull", "Pulling", |_| true)?;
        ensure!(message(&pulling).contains("gitplane.local/not-there:1"), "{pulling}");
        wait_for(DEADLINE, || {
            let events = events(&cluster).ok()?;
            events.iter().any(|e| e["involvedObject"]["name"] == "secret-pull" && e["type"] == "Warning").then_some(())
        })
        .context("a Warning Event about the failed pull")?;
        Ok(())
    })();
    let _ = watch.kill();
    let _ = watch.wait();
    result?;

    let encoded = base64_of(SECRET_VALUE);
    let listed = cluster.kubectl(&["get", "events", "-A", "-o", "json"])?;
    let watched = std::fs::read_to_string(&watched)?;
    ensure!(watched.contains("secret-probe") && watched.contains("Unhealthy"), "the watch saw the Events: {watched}");
    for (how, text) in [("kubectl get events -o json", &listed), ("the watch", &watched)] {
        ensure!(!text.contains(SECRET_VALUE), "{how} carries the Secret's value:\n{text}");
        ensure!(!text.contains(&encoded), "{how} carries the Secret's value in base64:\n{text}");
    }
    let described = cluster.kubectl(&["describe", "pod", "secret-probe"])?;
    ensure!(!described.contains(SECRET_VALUE), "kubectl describe carries the Secret's value:\n{described}");
    cluster.stop(DEADLINE)?;
    Ok(())
}

/// Standard base64, as a Secret's `data` holds the value.
fn base64_of(text: &str) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in text.as_bytes().chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            out.push(if i <= chunk.len() { ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char } else { '=' });
        }
    }
    out
}
