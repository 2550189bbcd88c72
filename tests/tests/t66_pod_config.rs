//! Configuration reaching containers, on the real `gitplane up --nodes 1`: a Pod reads a
//! ConfigMap and a Secret as env (valueFrom and envFrom) and as files (items, modes, the Secret
//! on a tmpfs) and its labels through a downwardAPI volume; a push that changes the ConfigMap and
//! the Secret changes the files inside the running container, without a restart; a Pod whose
//! volume names a ConfigMap that does not exist waits with a message naming it, and starts by
//! itself once the ConfigMap is pushed; the Pod's /etc/hosts is the kubelet's managed file with
//! its hostAliases. A Pod with an `fsGroup`, running as a user that is not root, has the group and
//! writes into its emptyDir, whose files (and the ConfigMap volume's) belong to that group; a
//! `runAsNonRoot` Pod on an image that runs as root waits with the kubelet's
//! CreateContainerConfigError and an Event saying so.

use anyhow::{Context, Result, ensure};
use gitplane_e2e::{LocalCluster, RunningPod, Worktree, require_root, wait_for};
use serde_json::Value;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(90);

fn objects(mode: &str, password: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: ConfigMap
metadata:
  name: app-config
data:
  mode: {mode}
  greeting: hello
---
apiVersion: v1
kind: Secret
metadata:
  name: db
stringData:
  password: {password}
"#
    )
}

/// A container that only sleeps, and answers TERM at once.
const SLEEPER: &str = r#"
      image: gitplane.local/httpd:1
      command: ["/bin/busybox", "sh", "-c", "trap 'exit 0' TERM; while true; do /bin/busybox sleep 1; done"]"#;

fn pods() -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: reader
  labels:
    app: reader
    tier: web
spec:
  terminationGracePeriodSeconds: 1
  securityContext:
    seccompProfile: {{type: RuntimeDefault}}
  hostAliases:
    - {{ip: 10.1.2.3, hostnames: [foo.local, bar.local]}}
  containers:
    - name: reader{SLEEPER}
      env:
        - name: MODE
          valueFrom:
            configMapKeyRef: {{name: app-config, key: mode}}
        - name: PASSWORD
          valueFrom:
            secretKeyRef: {{name: db, key: password}}
        - name: MEMORY_MI
          valueFrom:
            resourceFieldRef: {{resource: limits.memory, divisor: 1Mi}}
      envFrom:
        - configMapRef: {{name: app-config}}
          prefix: CFG_
      resources:
        limits: {{memory: 32Mi}}
      volumeMounts:
        - {{name: config, mountPath: /etc/config}}
        - {{name: secret, mountPath: /etc/secret}}
        - {{name: podinfo, mountPath: /etc/podinfo}}
  volumes:
    - name: config
      configMap:
        name: app-config
        items:
          - {{key: mode, path: settings/mode, mode: 384}}
    - name: secret
      secret:
        secretName: db
        defaultMode: 256
    - name: podinfo
      downwardAPI:
        items:
          - {{path: labels, fieldRef: {{fieldPath: metadata.labels}}}}
---
apiVersion: v1
kind: Pod
metadata:
  name: waiter
  labels:
    app: waiter
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: waiter{SLEEPER}
      volumeMounts:
        - {{name: late, mountPath: /etc/late}}
  volumes:
    - name: late
      configMap:
        name: late-config
---
apiVersion: v1
kind: Pod
metadata:
  name: grouped
  labels:
    app: grouped
spec:
  terminationGracePeriodSeconds: 1
  securityContext: {{runAsUser: 1000, runAsGroup: 1000, fsGroup: 2000, fsGroupChangePolicy: OnRootMismatch}}
  containers:
    - name: grouped
      image: gitplane.local/httpd:1
      command: ["/bin/busybox", "sh", "-c", "echo written > /scratch/file && trap 'exit 0' TERM; while true; do /bin/busybox sleep 1; done"]
      volumeMounts:
        - {{name: scratch, mountPath: /scratch}}
        - {{name: config, mountPath: /etc/config}}
  volumes:
    - {{name: scratch, emptyDir: {{}}}}
    - {{name: config, configMap: {{name: app-config}}}}
---
apiVersion: v1
kind: Pod
metadata:
  name: nonroot
spec:
  terminationGracePeriodSeconds: 1
  securityContext: {{runAsNonRoot: true}}
  containers:
    - name: nonroot{SLEEPER}
"#
    )
}

const LATE: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: late-config\ndata:\n  ready: \"yes\"\n";

fn one_running(cluster: &LocalCluster, app: &str) -> Option<RunningPod> {
    cluster.running_pods(&format!("app={app}")).ok()?.into_iter().next()
}

fn pod(cluster: &LocalCluster, name: &str) -> Result<Value> {
    cluster.get(&format!("/api/v1/namespaces/default/pods/{name}"))
}

/// `cat` of a file inside the reader, trimmed.
fn read(cluster: &LocalCluster, reader: &RunningPod, path: &str) -> Result<String> {
    Ok(cluster.exec(&reader.node, &reader.container, &["/bin/busybox", "cat", path])?.trim().to_owned())
}

fn mode_of(cluster: &LocalCluster, reader: &RunningPod, path: &str) -> Result<String> {
    let out = cluster.exec(&reader.node, &reader.container, &["/bin/busybox", "stat", "-L", "-c", "%a", path])?;
    Ok(out.trim().to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t66_config_maps_and_secrets_reach_containers_and_update_in_place() -> Result<()> {
    require_root()?;
    let cluster = tokio::task::block_in_place(|| LocalCluster::up("gp66", 1))?;
    let work_dir = tempfile::tempdir()?;
    let work = Worktree::clone(cluster.demo_repo(), work_dir.path().join("demo"))?;
    work.remove("web.yaml")?;
    work.write("objects.yaml", &objects("fast", "hunter2"))?;
    work.write("pods.yaml", &pods())?;
    work.commit_and_push("a reader of app-config and db, and a waiter for late-config")?;

    let reader = tokio::task::block_in_place(|| wait_for(DEADLINE, || one_running(&cluster, "reader")))
        .with_context(|| format!("reader is not Running: {:?}\n{}", pod(&cluster, "reader"), cluster.log_text()))?;

    // Env: valueFrom, resourceFieldRef and envFrom (with its prefix).
    // `ctr tasks exec` can lose the output of a command that exits at once: read until some came.
    let hosts = tokio::task::block_in_place(|| {
        wait_for(DEADLINE, || read(&cluster, &reader, "/etc/hosts").ok().filter(|hosts| !hosts.is_empty()))
    })
    .context("/etc/hosts is empty")?;
    let ip = pod(&cluster, "reader")?["status"]["podIP"].as_str().unwrap_or_default().to_owned();
    for line in [
        "# Kubernetes-managed hosts file.",
        "127.0.0.1\tlocalhost",
        &format!("{ip}\treader"),
        "10.1.2.3\tfoo.local\tbar.local",
    ] {
        ensure!(hosts.lines().any(|l| l == line), "/etc/hosts lacks {line:?}:\n{hosts}");
    }
    let env = cluster.exec(&reader.node, &reader.container, &["/bin/busybox", "env"])?;
    for expected in ["MODE=fast", "PASSWORD=hunter2", "CFG_mode=fast", "CFG_greeting=hello", "MEMORY_MI=32"] {
        ensure!(env.lines().any(|l| l == expected), "{expected} is not in the environment:\n{env}");
    }

    // Files: the item at its path and mode, the Secret with its defaultMode on a tmpfs, labels.
    ensure!(read(&cluster, &reader, "/etc/config/settings/mode")? == "fast");
    ensure!(mode_of(&cluster, &reader, "/etc/config/settings/mode")? == "600");
    let listing = cluster.exec(&reader.node, &reader.container, &["/bin/busybox", "ls", "-a", "/etc/config"])?;
    ensure!(listing.contains("..data") && !listing.contains("greeting"), "only the item is projected: {listing}");
    ensure!(read(&cluster, &reader, "/etc/secret/password")? == "hunter2");
    ensure!(mode_of(&cluster, &reader, "/etc/secret/password")? == "400");
    let mounts = read(&cluster, &reader, "/proc/mounts")?;
    ensure!(
        mounts.lines().any(|l| l.split(' ').nth(1) == Some("/etc/secret") && l.split(' ').nth(2) == Some("tmpfs")),
        "the secret volume is not a tmpfs:\n{mounts}"
    );
    // containerd's default seccomp profile, from the Pod's securityContext (mode 2: filter).
    let status = read(&cluster, &reader, "/proc/self/status")?;
    ensure!(status.lines().any(|l| l == "Seccomp:\t2"), "RuntimeDefault is not applied:\n{status}");
    let labels = read(&cluster, &reader, "/etc/podinfo/labels")?;
    ensure!(labels == "app=\"reader\"\ntier=\"web\"", "downwardAPI labels: {labels:?}");

    // fsGroup: the container's groups, its emptyDir's and ConfigMap volume's files.
    let grouped = tokio::task::block_in_place(|| wait_for(DEADLINE, || one_running(&cluster, "grouped")))
        .with_context(|| format!("grouped is not Running: {:?}", pod(&cluster, "grouped")))?;
    let id = cluster.exec(&grouped.node, &grouped.container, &["/bin/busybox", "id"])?;
    ensure!(id.contains("uid=1000") && id.contains("gid=1000") && id.contains("2000"), "id: {id}");
    let stat = |path: &str| -> Result<String> {
        let out =
            cluster.exec(&grouped.node, &grouped.container, &["/bin/busybox", "stat", "-L", "-c", "%g %a", path])?;
        Ok(out.trim().to_owned())
    };
    ensure!(read(&cluster, &grouped, "/scratch/file")? == "written", "the emptyDir was not written");
    ensure!(stat("/scratch")? == "2000 2777", "the emptyDir: {}", stat("/scratch")?);
    ensure!(stat("/scratch/file")?.starts_with("2000 "), "the written file: {}", stat("/scratch/file")?);
    ensure!(stat("/etc/config/greeting")? == "2000 644", "the ConfigMap's file: {}", stat("/etc/config/greeting")?);
    ensure!(read(&cluster, &grouped, "/etc/config/greeting")? == "hello");

    // runAsNonRoot on an image that runs as root: the kubelet's message, in status and an Event.
    let uid = pod(&cluster, "nonroot")?["metadata"]["uid"].as_str().unwrap_or_default().to_owned();
    let expected = format!(
        "container has runAsNonRoot and image will run as root (pod: \"nonroot_default({uid})\", container: nonroot)"
    );
    let waiting = tokio::task::block_in_place(|| {
        wait_for(DEADLINE, || {
            let state = pod(&cluster, "nonroot").ok()?["status"]["containerStatuses"][0]["state"]["waiting"].clone();
            (state["reason"] == "CreateContainerConfigError").then_some(state)
        })
    })
    .with_context(|| format!("nonroot does not wait: {:?}", pod(&cluster, "nonroot")))?;
    ensure!(waiting["message"] == expected.as_str(), "nonroot's waiting state: {waiting}");
    // Events are recorded apart from the status: the Event may come a moment after it.
    let said = tokio::task::block_in_place(|| {
        wait_for(DEADLINE, || {
            let events = cluster.get("/api/v1/namespaces/default/events").ok()?;
            events["items"]
                .as_array()?
                .iter()
                .any(|e| {
                    e["involvedObject"]["name"] == "nonroot"
                        && e["reason"] == "Failed"
                        && e["message"] == format!("Error: {expected}").as_str()
                })
                .then_some(())
        })
    });
    said.with_context(|| {
        format!("no Failed Event for nonroot: {:?}", cluster.get("/api/v1/namespaces/default/events"))
    })?;

    // A volume that names a missing ConfigMap: the Pod waits, saying which.
    let waiting = tokio::task::block_in_place(|| {
        wait_for(DEADLINE, || {
            let state = pod(&cluster, "waiter").ok()?["status"]["containerStatuses"][0]["state"]["waiting"].clone();
            state["message"].as_str().is_some_and(|m| m.contains("late-config")).then_some(state)
        })
    })
    .with_context(|| format!("waiter does not say what it waits for: {:?}", pod(&cluster, "waiter")))?;
    let message = waiting["message"].as_str().unwrap_or_default();
    ensure!(
        waiting["reason"] == "ContainerCreating"
            && message.contains("volume \"late\"")
            && message.contains("not found"),
        "waiter's waiting state: {waiting}"
    );
    println!("waiter waits: {waiting}");

    // A push changes the files inside the running container, atomically, without a restart.
    work.write("objects.yaml", &objects("slow", "correct-horse"))?;
    work.write("late.yaml", LATE)?;
    work.commit_and_push("app-config: slow; db: a new password; late-config")?;
    tokio::task::block_in_place(|| {
        wait_for(DEADLINE, || {
            let mode = read(&cluster, &reader, "/etc/config/settings/mode").ok()?;
            let password = read(&cluster, &reader, "/etc/secret/password").ok()?;
            (mode == "slow" && password == "correct-horse").then_some(())
        })
    })
    .with_context(|| {
        format!(
            "the files did not change in place: mode {:?}, password {:?}",
            read(&cluster, &reader, "/etc/config/settings/mode"),
            read(&cluster, &reader, "/etc/secret/password")
        )
    })?;
    let status = pod(&cluster, "reader")?["status"]["containerStatuses"][0].clone();
    ensure!(status["restartCount"] == 0, "the reader was restarted: {status}");
    let still = one_running(&cluster, "reader").context("the reader is Running")?;
    ensure!(still.container == reader.container, "the reader's container was replaced");
    ensure!(mode_of(&cluster, &reader, "/etc/config/settings/mode")? == "600", "the mode survives the update");
    // Env is read when a container starts, as in Kubernetes: unchanged.
    let env = cluster.exec(&reader.node, &reader.container, &["/bin/busybox", "env"])?;
    ensure!(env.lines().any(|l| l == "MODE=fast"), "env changed without a restart:\n{env}");

    // The waiter starts by itself now that its ConfigMap exists.
    let waiter = tokio::task::block_in_place(|| wait_for(DEADLINE, || one_running(&cluster, "waiter")))
        .with_context(|| format!("waiter did not start: {:?}", pod(&cluster, "waiter")))?;
    ensure!(read(&cluster, &waiter, "/etc/late/ready")? == "yes");

    let status = tokio::task::block_in_place(|| cluster.stop(DEADLINE))?;
    ensure!(status.success(), "gitplane up --nodes exited with {status}");
    Ok(())
}
