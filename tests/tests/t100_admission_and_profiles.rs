//! Security profiles and admission on the real `gitplane up --nodes 1`:
//! - a `Localhost` seccomp profile (the seccomp tutorial's format, under the node's
//!   `<data dir>/seccomp`) is enforced: the syscall it denies fails in the container, the rest
//!   runs; a profile file that is not there is the container's CreateContainerError;
//! - AppArmor `RuntimeDefault` on a node without AppArmor is rejected as the kubelet rejects it
//!   (Failed, reason AppArmor, "Cannot enforce AppArmor: ..."); on a node with it, it runs;
//! - a normal Pod start records no Warning Event from the kubelet;
//! - a LimitRange's defaults are on the Pods a Deployment makes; a ResourceQuota's
//!   `status.used` counts them and the ReplicaSet's Pod over it is not created (FailedCreate,
//!   "exceeded quota"); a bare Pod from Git over it is refused with the push.

use anyhow::{Context, Result, ensure};
use gitplane_e2e::{LocalCluster, Worktree, require_root, wait_for};
use serde_json::Value;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(120);

/// A profile in the seccomp tutorial's format: everything allowed but making directories.
const NO_MKDIR: &str = r#"{
    "defaultAction": "SCMP_ACT_ALLOW",
    "syscalls": [
        {
            "names": ["mkdir", "mkdirat"],
            "action": "SCMP_ACT_ERRNO"
        }
    ]
}
"#;

const PROFILES: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: no-mkdir
  labels: {app: no-mkdir}
spec:
  terminationGracePeriodSeconds: 1
  securityContext:
    seccompProfile:
      type: Localhost
      localhostProfile: profiles/no-mkdir.json
  containers:
    - name: main
      image: gitplane.local/httpd:1
      command: [/bin/busybox, sh, -c, "/bin/busybox mkdir /tmp/made || echo mkdir refused; exec /bin/busybox sleep 100000"]
---
apiVersion: v1
kind: Pod
metadata:
  name: missing-profile
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: main
      image: gitplane.local/httpd:1
      command: [/bin/busybox, sleep, "100000"]
      securityContext:
        seccompProfile:
          type: Localhost
          localhostProfile: profiles/missing.json
---
apiVersion: v1
kind: Pod
metadata:
  name: apparmor-default
spec:
  terminationGracePeriodSeconds: 1
  securityContext:
    appArmorProfile: {type: RuntimeDefault}
  containers:
    - name: main
      image: gitplane.local/httpd:1
      command: [/bin/busybox, sleep, "100000"]
"#;

const LIMITED: &str = r#"apiVersion: v1
kind: Namespace
metadata:
  name: limited
---
apiVersion: v1
kind: LimitRange
metadata:
  name: cpu-defaults
  namespace: limited
spec:
  limits:
    - type: Container
      defaultRequest: {cpu: 100m, memory: 16Mi}
      default: {cpu: 200m, memory: 32Mi}
---
apiVersion: v1
kind: ResourceQuota
metadata:
  name: two-pods
  namespace: limited
spec:
  hard:
    pods: "2"
    requests.cpu: "1"
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: capped
  namespace: limited
spec:
  replicas: 3
  selector:
    matchLabels: {app: capped}
  template:
    metadata:
      labels: {app: capped}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
        - name: main
          image: gitplane.local/httpd:1
          command: [/bin/busybox, sleep, "100000"]
"#;

const EXTRA: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: extra
  namespace: limited
spec:
  containers:
    - name: main
      image: gitplane.local/httpd:1
      command: [/bin/busybox, sleep, "100000"]
"#;

fn explain(cluster: &LocalCluster) -> String {
    let rows = cluster.kubectl(&["get", "pods,events", "-o", "wide"]).unwrap_or_else(|e| e.to_string());
    format!("{rows}\n{}", cluster.log_tail())
}

fn pod(cluster: &LocalCluster, name: &str) -> Option<Value> {
    cluster.get(&format!("/api/v1/namespaces/default/pods/{name}")).ok().filter(|p| p["kind"] == "Pod")
}

/// The kubelet's Warning Events about Pod `name`.
fn warnings(cluster: &LocalCluster, name: &str) -> Result<Vec<String>> {
    let events = cluster.get("/api/v1/namespaces/default/events")?;
    Ok(events["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["type"] == "Warning" && e["involvedObject"]["kind"] == "Pod")
        .filter(|e| e["source"]["component"] == "kubelet")
        .filter(|e| e["involvedObject"]["name"] == name)
        .map(|e| format!("{}: {}", e["reason"].as_str().unwrap_or(""), e["message"].as_str().unwrap_or("")))
        .collect())
}

#[test]
fn t100_security_profiles_and_admission() -> Result<()> {
    require_root()?;
    let dir = tempfile::tempdir()?;
    let cluster = LocalCluster::up("gp100", 1)?;
    let node = cluster.ready_nodes()?.into_iter().next().context("a Ready node")?;
    let profiles = cluster.data_dir.join("nodes").join(&node).join("seccomp/profiles");
    std::fs::create_dir_all(&profiles)?;
    std::fs::write(profiles.join("no-mkdir.json"), NO_MKDIR)?;

    // Over HTTP with the Git token, as a user pushes: each push gets its verdict.
    let token = std::fs::read_to_string(cluster.data_dir.join("git-token"))?.trim().to_owned();
    let work = Worktree::clone(format!("http://git:{token}@{}/git/demo.git", cluster.listen), dir.path().join("demo"))?;
    work.write("profiles.yaml", PROFILES)?;
    work.commit_and_push("seccomp and AppArmor profiles")?;

    // The Localhost profile: the denied syscall fails, the container runs on.
    let running = wait_for(DEADLINE, || cluster.running_pods("app=no-mkdir").ok()?.into_iter().next())
        .with_context(|| format!("no-mkdir never runs\n{}", explain(&cluster)))?;
    let said = wait_for(DEADLINE, || cluster.kubectl(&["logs", "no-mkdir"]).ok().filter(|l| l.contains("refused")));
    // The denied call's error (stderr) and the echo (stdout), in either order.
    let said = said.unwrap_or_default();
    ensure!(
        said.contains("mkdir: can't create directory '/tmp/made': Operation not permitted\n")
            && said.contains("mkdir refused\n"),
        "no-mkdir's log: {said:?}"
    );
    let mkdir =
        cluster.exec(&node, &running.container, &["/bin/busybox", "sh", "-c", "/bin/busybox mkdir /tmp/x; echo $?"])?;
    ensure!(mkdir.trim() != "0", "mkdir succeeded under the profile: {mkdir:?}");
    let touch =
        cluster.exec(&node, &running.container, &["/bin/busybox", "sh", "-c", "/bin/busybox touch /tmp/y; echo $?"])?;
    ensure!(touch.trim() == "0", "the profile denied more than mkdir: {touch:?}");

    // A profile that is not on the node: the container waits, saying why.
    let waiting = wait_for(DEADLINE, || {
        let pod = pod(&cluster, "missing-profile")?;
        let waiting = pod["status"]["containerStatuses"][0]["state"]["waiting"].clone();
        (waiting["reason"] == "CreateContainerError").then_some(waiting)
    })
    .with_context(|| format!("missing-profile never waits with CreateContainerError\n{}", explain(&cluster)))?;
    let message = waiting["message"].as_str().unwrap_or_default();
    let path = profiles.join("missing.json");
    ensure!(message.contains(&*path.to_string_lossy()), "the error names no profile file: {message}");

    // AppArmor: the kubelet's admission on a node without it.
    let apparmor = std::fs::read_to_string("/sys/module/apparmor/parameters/enabled").is_ok_and(|e| e.starts_with('Y'));
    if apparmor {
        wait_for(DEADLINE, || pod(&cluster, "apparmor-default").filter(|p| p["status"]["phase"] == "Running"))
            .with_context(|| format!("apparmor-default never runs\n{}", explain(&cluster)))?;
    } else {
        let status = wait_for(DEADLINE, || {
            pod(&cluster, "apparmor-default").map(|p| p["status"].clone()).filter(|s| s["phase"] == "Failed")
        })
        .with_context(|| format!("apparmor-default is never rejected\n{}", explain(&cluster)))?;
        let expected = "Cannot enforce AppArmor: AppArmor is not enabled on the host";
        ensure!(
            status["reason"] == "AppArmor" && status["message"].as_str().is_some_and(|m| m.ends_with(expected)),
            "apparmor-default's status: {status}"
        );
        let rejected = wait_for(DEADLINE, || warnings(&cluster, "apparmor-default").ok().filter(|w| !w.is_empty()));
        ensure!(rejected == Some(vec![format!("AppArmor: {expected}")]), "apparmor-default's Events: {rejected:?}");
    }

    // A normal start says nothing alarming.
    ensure!(
        warnings(&cluster, "no-mkdir")?.is_empty(),
        "no-mkdir's Warning Events: {:?}",
        warnings(&cluster, "no-mkdir")?
    );
    for web in cluster.running_pods("app=web")? {
        ensure!(
            warnings(&cluster, &web.name)?.is_empty(),
            "{}'s Warning Events: {:?}",
            web.name,
            warnings(&cluster, &web.name)?
        );
    }

    // LimitRange and ResourceQuota on a Deployment's Pods.
    work.write("limited.yaml", LIMITED)?;
    work.commit_and_push("a namespace with limits and a quota")?;
    let quota = wait_for(DEADLINE, || {
        let q = cluster.get("/api/v1/namespaces/limited/resourcequotas/two-pods").ok()?;
        (q["status"]["used"]["pods"] == "2").then_some(q)
    })
    .with_context(|| format!("the quota never counts 2 Pods\n{}", explain(&cluster)))?;
    ensure!(quota["status"]["used"]["requests.cpu"] == "200m", "the quota's status: {}", quota["status"]);
    let resources = cluster.kubectl(&[
        "get",
        "pods",
        "-n",
        "limited",
        "-o",
        "jsonpath={range .items[*]}{.spec.containers[0].resources}{\"\\n\"}{end}",
    ])?;
    let defaulted = r#"{"limits":{"cpu":"200m","memory":"32Mi"},"requests":{"cpu":"100m","memory":"16Mi"}}"#;
    ensure!(resources.lines().collect::<Vec<_>>() == [defaulted; 2], "the Pods' resources:\n{resources}");
    let failed = wait_for(DEADLINE, || {
        let events = cluster.get("/api/v1/namespaces/limited/events").ok()?;
        let items = events["items"].as_array()?.clone();
        items.into_iter().find(|e| e["reason"] == "FailedCreate" && e["involvedObject"]["kind"] == "ReplicaSet")
    })
    .with_context(|| format!("no FailedCreate Event\n{}", explain(&cluster)))?;
    let message = failed["message"].as_str().unwrap_or_default();
    ensure!(
        failed["type"] == "Warning"
            && message
                .contains("is forbidden: exceeded quota: two-pods, requested: pods=1, used: pods=2, limited: pods=2"),
        "the FailedCreate Event: {failed}"
    );

    // A bare Pod from Git over the quota: refused with the push, as the API server refuses it.
    work.write("extra.yaml", EXTRA)?;
    work.commit("one Pod too many")?;
    let refused = work.push("origin").err().map(|e| format!("{e:#}")).unwrap_or_default();
    ensure!(
        refused
            .contains("extra.yaml:1: Pod extra: /metadata/name: pods \"extra\" is forbidden: exceeded quota: two-pods"),
        "the push of a Pod over the quota: {refused:?}\n{}",
        explain(&cluster)
    );

    cluster.stop_within(Duration::from_secs(30))?;
    Ok(())
}
