//! The Kubernetes documentation's DaemonSet (`fluentd-elasticsearch`, as published on
//! kubernetes.io/docs/concepts/workloads/controllers/daemonset) on the real
//! `gitplane up --nodes 3`, its image a stand-in served by the test kit's registry: a Pod on
//! each node, placed by the scheduler through the node
//! affinity the controller pins it with; a template change rolls them over one node at a time
//! (maxUnavailable 1, the default), each template a ControllerRevision that `kubectl get
//! controllerrevisions` and `kubectl rollout history` show; a daemon Pod evicted (its emptyDir
//! over its sizeLimit) is deleted with a `FailedDaemonPod` Warning Event; PodDisruptionBudgets
//! over a ReplicationController and a Deployment count what they allow, and one over the
//! DaemonSet holds its next rollout with a Warning Event; a fourth node that joins gets a daemon
//! Pod too.
//!
//! The DaemonSet mounts the node's `/var/log` (a hostPath volume), which Pod Security's
//! `baseline` refuses; `kube-system` is `privileged`, as the cluster makes it.

use anyhow::{Context, Result, ensure};
use gitplane_e2e::{LocalCluster, Worktree, require_root, wait_for};
use gitplane_testkit::registry::{self, Registry, StandIn};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(180);

/// content/en/examples/controllers/daemonset.yaml of kubernetes/website, as published.
const FLUENTD: &str = "apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: fluentd-elasticsearch
  namespace: kube-system
  labels:
    k8s-app: fluentd-logging
spec:
  selector:
    matchLabels:
      name: fluentd-elasticsearch
  template:
    metadata:
      labels:
        name: fluentd-elasticsearch
    spec:
      tolerations:
      # these tolerations are to have the daemonset runnable on control plane nodes
      # remove them if your control plane nodes should not run pods
      - key: node-role.kubernetes.io/control-plane
        operator: Exists
        effect: NoSchedule
      - key: node-role.kubernetes.io/master
        operator: Exists
        effect: NoSchedule
      containers:
      - name: fluentd-elasticsearch
        image: quay.io/fluentd_elasticsearch/fluentd:v5.0.1
        resources:
          limits:
            memory: 200Mi
          requests:
            cpu: 100m
            memory: 200Mi
        volumeMounts:
        - name: varlog
          mountPath: /var/log
      # it may be desirable to set a high priority class to ensure that a DaemonSet Pod
      # preempts running Pods
      # priorityClassName: important
      terminationGracePeriodSeconds: 30
      volumes:
      - name: varlog
        hostPath:
          path: /var/log
";

/// fluentd's stand-in: a process that runs until it is asked to stop.
fn fluentd() -> StandIn {
    let script = "#!/bin/sh\n# fluentd's stand-in: runs until asked to stop.\n\
                  trap 'exit 0' TERM INT\nwhile :; do /bin/busybox sleep 1 & wait $!; done\n";
    StandIn {
        entrypoint: vec!["fluentd".into()],
        scripts: vec![("fluentd".into(), script.into())],
        ..StandIn::default()
    }
}

/// A ReplicationController of three and a Deployment of two, each under a budget.
const BUDGETED: &str = "apiVersion: v1
kind: ReplicationController
metadata:
  name: nginx
spec:
  replicas: 3
  selector:
    app: nginx
  template:
    metadata:
      labels:
        app: nginx
    spec:
      containers:
      - name: nginx
        image: gitplane.local/httpd:1
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: nginx
spec:
  minAvailable: 2
  selector:
    matchLabels:
      app: nginx
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 2
  selector:
    matchLabels:
      app: web
  template:
    metadata:
      labels:
        app: web
    spec:
      containers:
      - name: web
        image: gitplane.local/httpd:1
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: web
spec:
  maxUnavailable: 0
  selector:
    matchLabels:
      app: web
";

/// A DaemonSet whose Pods fill their emptyDir past its sizeLimit: the kubelet evicts them, so
/// they end Failed.
const FILLER: &str = "apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: filler
spec:
  selector:
    matchLabels:
      app: filler
  template:
    metadata:
      labels:
        app: filler
    spec:
      containers:
      - name: filler
        image: gitplane.local/httpd:1
        command: [/bin/busybox, sh, -c, '/bin/busybox dd if=/dev/zero of=/cache/fill bs=1M count=8 && exec /bin/busybox sleep 3600']
        volumeMounts:
        - name: cache
          mountPath: /cache
      volumes:
      - name: cache
        emptyDir:
          sizeLimit: 1Mi
";

/// A budget that lets none of fluentd's Pods go.
const FLUENTD_BUDGET: &str = "apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: fluentd-elasticsearch
  namespace: kube-system
spec:
  maxUnavailable: 0
  selector:
    matchLabels:
      name: fluentd-elasticsearch
";

/// The messages of the Warning Events `reason` about DaemonSet `name`.
fn warnings(cluster: &LocalCluster, namespace: &str, name: &str, reason: &str) -> Result<Vec<String>> {
    let list = cluster.get(&format!("/api/v1/namespaces/{namespace}/events"))?;
    let items = list["items"].as_array().context("EventList has items")?;
    Ok(items
        .iter()
        .filter(|e| e["type"] == "Warning" && e["reason"] == reason)
        .filter(|e| e["involvedObject"]["kind"] == "DaemonSet" && e["involvedObject"]["name"] == name)
        .filter_map(|e| e["message"].as_str().map(str::to_owned))
        .collect())
}

/// A budget's (expectedPods, desiredHealthy, currentHealthy, disruptionsAllowed, its
/// DisruptionAllowed condition's status).
fn budget(cluster: &LocalCluster, name: &str) -> Option<(i64, i64, i64, i64, String)> {
    let pdb = cluster.get(&format!("/apis/policy/v1/namespaces/default/poddisruptionbudgets/{name}")).ok()?;
    let s = &pdb["status"];
    let n = |f: &str| s[f].as_i64().unwrap_or(-1);
    let condition = s["conditions"].as_array()?.iter().find(|c| c["type"] == "DisruptionAllowed")?;
    let allowed = condition["status"].as_str()?.to_owned();
    Some((n("expectedPods"), n("desiredHealthy"), n("currentHealthy"), n("disruptionsAllowed"), allowed))
}

/// A daemon Pod as the test sees it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Daemon {
    name: String,
    node: String,
    revision: String,
    ready: bool,
}

fn daemons(cluster: &LocalCluster) -> Result<Vec<Daemon>> {
    let list = cluster.get("/api/v1/namespaces/kube-system/pods?labelSelector=name%3Dfluentd-elasticsearch")?;
    let items = list["items"].as_array().context("PodList has items")?;
    Ok(items
        .iter()
        .map(|p| Daemon {
            name: p["metadata"]["name"].as_str().unwrap_or_default().to_owned(),
            node: p["spec"]["nodeName"].as_str().unwrap_or_default().to_owned(),
            revision: p["metadata"]["labels"]["controller-revision-hash"].as_str().unwrap_or_default().to_owned(),
            ready: p["status"]["phase"] == "Running"
                && p["status"]["conditions"]
                    .as_array()
                    .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True")),
        })
        .collect())
}

/// Whether each of `nodes` runs exactly one ready daemon Pod, and nothing else runs.
fn one_ready_per_node(pods: &[Daemon], nodes: &[String]) -> bool {
    let on: BTreeSet<&str> = pods.iter().filter(|p| p.ready).map(|p| p.node.as_str()).collect();
    pods.len() == nodes.len() && on == nodes.iter().map(String::as_str).collect()
}

/// What the cluster says about the push and the DaemonSet, for a failure's message.
fn explain(cluster: &LocalCluster) -> String {
    let get = |path: &str| cluster.get(path).map_or_else(|e| e.to_string(), |v| v.to_string());
    format!(
        "Application: {}\nDaemonSet: {}\nEvents: {}\n{}",
        get("/apis/gitplane.io/v1/namespaces/gitplane-system/applications/demo"),
        get("/apis/apps/v1/namespaces/kube-system/daemonsets/fluentd-elasticsearch"),
        get("/api/v1/namespaces/kube-system/events"),
        cluster.log_tail()
    )
}

fn status(cluster: &LocalCluster) -> Result<Value> {
    Ok(cluster.get("/apis/apps/v1/namespaces/kube-system/daemonsets/fluentd-elasticsearch")?["status"].clone())
}

#[test]
fn t94_the_documented_daemonset_runs_on_every_node_and_rolls_one_node_at_a_time() -> Result<()> {
    require_root()?;
    let dir = tempfile::tempdir()?;
    let mirror = registry::address(5000);
    let file = registry::write_registries_file(dir.path(), mirror, &[])?;
    let mut cluster = LocalCluster::up_with("gp94", 3, &["--registries", &file.to_string_lossy()])?;
    let registry = Registry::start(&dir.path().join("mirror"), &cluster, mirror, None)?;
    registry.push_stand_in("quay.io/fluentd_elasticsearch/fluentd:v5.0.1", &fluentd())?;
    let work = Worktree::clone(cluster.demo_repo(), dir.path().join("demo"))?;
    work.remove("web.yaml")?;
    work.write("fluentd.yaml", FLUENTD)?;
    work.commit_and_push("the documentation's fluentd-elasticsearch DaemonSet")?;

    // A Pod on each of the three nodes.
    let nodes = cluster.nodes.clone();
    let first = wait_for(DEADLINE, || daemons(&cluster).ok().filter(|p| one_ready_per_node(p, &nodes)))
        .with_context(|| format!("not one ready Pod per node: {:?}\n{}", daemons(&cluster), explain(&cluster)))?;
    let counted = wait_for(DEADLINE, || {
        let s = status(&cluster).ok()?;
        let n = |f: &str| s[f].as_i64().unwrap_or(-1);
        let counts = ["desiredNumberScheduled", "currentNumberScheduled", "numberReady", "updatedNumberScheduled"];
        (counts.iter().all(|f| n(f) == 3) && n("numberAvailable") == 3 && n("numberMisscheduled") == 0).then_some(s)
    });
    ensure!(counted.is_some(), "the DaemonSet's status never counted 3 nodes:\n{}", explain(&cluster));

    // A template change rolls over: never more than one node without a ready Pod.
    let restarted = FLUENTD.replace(
        "        name: fluentd-elasticsearch\n    spec:",
        "        name: fluentd-elasticsearch\n      annotations:\n        kubectl.kubernetes.io/restartedAt: \"2026-01-01T00:00:00Z\"\n    spec:",
    );
    ensure!(restarted.contains("restartedAt"), "the template was not changed");
    work.write("fluentd.yaml", &restarted)?;
    let pushed = Instant::now();
    work.commit_and_push("restart the DaemonSet's Pods")?;
    let old: BTreeSet<String> = first.iter().map(|p| p.revision.clone()).collect();
    let mut fewest_ready = nodes.len();
    let mut replaced_in_order: Vec<String> = Vec::new();
    let rolled = wait_for(DEADLINE, || {
        let pods = daemons(&cluster).ok()?;
        fewest_ready = fewest_ready.min(pods.iter().filter(|p| p.ready).count());
        for p in pods.iter().filter(|p| !old.contains(&p.revision) && p.ready) {
            if !replaced_in_order.contains(&p.node) {
                replaced_in_order.push(p.node.clone());
            }
        }
        (one_ready_per_node(&pods, &nodes) && pods.iter().all(|p| !old.contains(&p.revision))).then_some(pods)
    })
    .with_context(|| format!("the rollout never finished: {:?}\n{}", daemons(&cluster), explain(&cluster)))?;
    let took = pushed.elapsed();
    println!(
        "DaemonSet rollout over 3 nodes: {:.1} s from push to all updated and ready (nodes in order {replaced_in_order:?})",
        took.as_secs_f64()
    );
    ensure!(fewest_ready >= nodes.len() - 1, "{fewest_ready} ready Pods at one point: more than one node at a time");
    ensure!(rolled.iter().all(|p| first.iter().all(|f| f.name != p.name)), "every Pod was replaced");

    // Each template is a ControllerRevision named after the hash its Pods carry, numbered.
    let (old, new) = (first[0].revision.as_str(), rolled[0].revision.as_str());
    let listed = cluster.kubectl(&["-n", "kube-system", "get", "controllerrevisions"])?;
    let rows: Vec<Vec<&str>> = listed.lines().skip(1).map(|l| l.split_whitespace().take(3).collect()).collect();
    for (hash, number) in [(old, "1"), (new, "2")] {
        let row =
            vec![format!("fluentd-elasticsearch-{hash}"), "daemonset.apps/fluentd-elasticsearch".into(), number.into()];
        ensure!(rows.iter().any(|r| *r == row), "no revision {number} ({hash}) in:\n{listed}");
    }
    let history = cluster.kubectl(&["-n", "kube-system", "rollout", "history", "daemonset/fluentd-elasticsearch"])?;
    let numbers: Vec<&str> = history.lines().skip(2).filter_map(|l| l.split_whitespace().next()).collect();
    ensure!(numbers == ["1", "2"], "kubectl rollout history:\n{history}");
    let template = |n: &str| {
        let revision = format!("--revision={n}");
        cluster.kubectl(&["-n", "kube-system", "rollout", "history", "daemonset/fluentd-elasticsearch", &revision])
    };
    let (first_template, second_template) = (template("1")?, template("2")?);
    ensure!(
        !first_template.contains("restartedAt") && second_template.contains("kubectl.kubernetes.io/restartedAt"),
        "each revision's template:\n{first_template}\n{second_template}"
    );

    // Budgets over a ReplicationController's three Pods (minAvailable 2: one may go) and a
    // Deployment's two (maxUnavailable 0: none may).
    work.write("budgeted.yaml", BUDGETED)?;
    work.write("filler.yaml", FILLER)?;
    work.commit_and_push(
        "a ReplicationController and a Deployment, each with a PodDisruptionBudget; a DaemonSet whose Pods get evicted",
    )?;
    let expected = [("nginx", (3, 2, 3, 1, "True")), ("web", (2, 2, 2, 0, "False"))];
    for (name, (pods, desired, healthy, allowed, condition)) in expected {
        let want = (pods, desired, healthy, allowed, condition.to_owned());
        wait_for(DEADLINE, || budget(&cluster, name).filter(|b| *b == want)).with_context(|| {
            format!("PodDisruptionBudget {name}: {:?}, not {want:?}\n{}", budget(&cluster, name), explain(&cluster))
        })?;
    }
    let rc = cluster.get("/api/v1/namespaces/default/replicationcontrollers/nginx")?;
    ensure!(rc["status"]["readyReplicas"] == 3, "the ReplicationController's status: {}", rc["status"]);

    // The filler's Pods, evicted, end Failed: each is deleted with a Warning Event, paced by a
    // back-off per node, and replaced.
    let failed = wait_for(DEADLINE, || {
        warnings(&cluster, "default", "filler", "FailedDaemonPod").ok().filter(|w| !w.is_empty())
    })
    .with_context(|| format!("no FailedDaemonPod Event for the filler\n{}", explain(&cluster)))?;
    ensure!(
        failed
            .iter()
            .all(|m| m.starts_with("Found failed daemon pod default/filler-") && m.ends_with("will try to kill it")),
        "{failed:?}"
    );

    // A budget that lets none of fluentd's Pods go holds its next rollout: a Warning Event with
    // the eviction API's refusal, and every Pod stays at its revision.
    work.write("fluentd-budget.yaml", FLUENTD_BUDGET)?;
    work.write("fluentd.yaml", &restarted.replace("2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"))?;
    work.remove("filler.yaml")?;
    work.commit_and_push("fluentd under a budget that lets none go, and a new template")?;
    let held = wait_for(DEADLINE, || {
        warnings(&cluster, "kube-system", "fluentd-elasticsearch", "DisruptionBudget").ok().filter(|w| !w.is_empty())
    })
    .with_context(|| format!("no DisruptionBudget Event for the held rollout\n{}", explain(&cluster)))?;
    let refusal = "Cannot evict pod as it would violate the pod's disruption budget. \
                   The disruption budget fluentd-elasticsearch needs";
    ensure!(held.iter().all(|m| m.starts_with(refusal)), "{held:?}");
    let pods = daemons(&cluster)?;
    ensure!(pods.len() == 3 && pods.iter().all(|p| p.revision == new), "a Pod went despite the budget: {pods:?}");

    // A fourth node joins (the appliance started again with one node more): it gets one too.
    cluster.kill()?;
    cluster.nodes.push(format!("{}-4", cluster.base));
    cluster.restart()?;
    let four = cluster.nodes.clone();
    wait_for(DEADLINE, || daemons(&cluster).ok().filter(|p| one_ready_per_node(p, &four)))
        .with_context(|| format!("the fourth node got no Pod: {:?}\n{}", daemons(&cluster), explain(&cluster)))?;
    let per_node: BTreeMap<String, usize> = daemons(&cluster)?.into_iter().fold(BTreeMap::new(), |mut m, p| {
        *m.entry(p.node).or_default() += 1;
        m
    });
    ensure!(per_node.values().all(|n| *n == 1), "{per_node:?}");

    drop(registry);
    cluster.stop_within(Duration::from_secs(30))?;
    Ok(())
}
