//! A node whose container runtime dies says so, and comes back when the runtime does: the real
//! `gitplane up` in a network-namespace host, running its node on a containerd this test owns
//! (`--containerd-socket`), which it kills with SIGKILL and starts again.
//!
//! While containerd is down the node is `Ready=False` (`KubeletNotReady`, "container runtime is
//! down") within 10 s and tainted `node.kubernetes.io/not-ready` (NoSchedule and NoExecute); a
//! Pod that tolerates that taint for 2 s is evicted (Terminating until the runtime is back to stop
//! it) and its replacement is not scheduled there,
//! while a Pod that says nothing stays (DefaultTolerationSeconds: 300 s). A Pod bound to the
//! node meanwhile (by `nodeName`, as no scheduler would) says within seconds why it does not
//! start: a `FailedCreatePodSandBox` Event and its PodReadyToStartContainers condition. Once
//! containerd runs again the node is Ready within 10 s, the taints go, the replacement and the
//! bound Pod run, and the Pod that stayed still runs its first container (containerd kept it;
//! the agent adopted it).

use anyhow::{Context, Result, ensure};
use gitplane_e2e::{Gitplane, NetnsHost, Worktree, manifests, netns_host, require_root, wait_for};
use gitplane_nodeagent::kubelet::containerd::{Containerd, ContainerdConfig};
use serde_json::Value;
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(90);
/// How soon the node must say what happened to its runtime.
const NODE_STATUS_WITHIN: Duration = Duration::from_secs(10);
const NODE: &str = "gp61";

/// A Pod bound to the node by its manifest.
fn pinned() -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: pinned, labels: {{app: pinned}}}}\nspec:\n  nodeName: {NODE}\n  \
         containers: [{{name: web, image: gitplane.local/httpd:1, imagePullPolicy: IfNotPresent}}]\n"
    )
}

/// A Deployment of one Pod that leaves a node that is not ready after 2 s.
const BRIEF: &str = "apiVersion: apps/v1
kind: Deployment
metadata: {name: brief}
spec:
  replicas: 1
  selector: {matchLabels: {app: brief}}
  template:
    metadata: {labels: {app: brief}}
    spec:
      tolerations:
      - {key: node.kubernetes.io/not-ready, operator: Exists, effect: NoExecute, tolerationSeconds: 2}
      containers: [{name: web, image: gitplane.local/httpd:1, imagePullPolicy: IfNotPresent}]
";

fn containerd_config(host: &NetnsHost) -> ContainerdConfig {
    let mut cfg = gitplane_testkit::node::containerd_config(host, host.dir());
    // Where `gitplane up --containerd-socket` writes the node's conflist.
    cfg.cni_conf_dir = host.dir().join("data/cni/net.d");
    cfg
}

fn condition<'a>(object: &'a Value, type_: &str) -> Option<&'a Value> {
    object["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == type_)
}

fn taints(node: &Value) -> Vec<String> {
    let taints = node["spec"]["taints"].as_array().into_iter().flatten();
    taints.map(|t| format!("{}:{}", t["key"].as_str().unwrap_or(""), t["effect"].as_str().unwrap_or(""))).collect()
}

/// What the test reads of a Pod.
struct Seen {
    name: String,
    phase: String,
    /// The first container's id.
    container: String,
    restarts: i64,
    node: String,
    terminating: bool,
}

/// The Pods of `app`.
fn pods(gp: &Gitplane, host: &NetnsHost, app: &str) -> Result<Vec<Seen>> {
    let list = gp.get(host, &format!("/api/v1/namespaces/default/pods?labelSelector=app%3D{app}"))?;
    Ok(list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            let text = |v: &Value| v.as_str().unwrap_or("").to_owned();
            let status = &p["status"]["containerStatuses"][0];
            Seen {
                name: text(&p["metadata"]["name"]),
                phase: text(&p["status"]["phase"]),
                container: text(&status["containerID"]),
                restarts: status["restartCount"].as_i64().unwrap_or(0),
                node: text(&p["spec"]["nodeName"]),
                terminating: p["metadata"]["deletionTimestamp"].is_string(),
            }
        })
        .collect())
}

/// The one Pod of `app` when it runs: its name, container and restarts.
fn running(gp: &Gitplane, host: &NetnsHost, app: &str) -> Option<(String, String, i64)> {
    let pods = pods(gp, host, app).ok()?;
    match pods.as_slice() {
        [pod] if pod.phase == "Running" && !pod.container.is_empty() => {
            Some((pod.name.clone(), pod.container.clone(), pod.restarts))
        }
        _ => None,
    }
}

impl std::fmt::Debug for Seen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let terminating = if self.terminating { ", terminating" } else { "" };
        write!(f, "{} {} on {:?} ({}){terminating}", self.name, self.phase, self.node, self.container)
    }
}

fn kill(containerd: &Containerd) -> Result<()> {
    let pid = libc::pid_t::try_from(containerd.pid().context("containerd's pid")?)?;
    // SAFETY: kill(2) on the containerd this test started.
    ensure!(unsafe { libc::kill(pid, libc::SIGKILL) } == 0, "kill -9 {pid}: {}", std::io::Error::last_os_error());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t61_a_node_whose_runtime_dies_says_so_and_comes_back() -> Result<()> {
    require_root()?;
    let host = netns_host("gp61")?;
    let containerd = Containerd::start(containerd_config(&host)).await?;
    let socket = containerd.socket().to_string_lossy().into_owned();
    let gp = tokio::task::block_in_place(|| Gitplane::up_with(&host, NODE, &["--containerd-socket", &socket]))?;
    let node_path = format!("/api/v1/nodes/{NODE}");

    let work_dir = tempfile::tempdir()?;
    let work = Worktree::clone(gp.demo_repo(), work_dir.path().join("demo"))?;
    work.remove("web.yaml")?;
    work.write("steady.yaml", &manifests::deployment("steady", 1))?;
    work.write("brief.yaml", BRIEF)?;
    work.commit_and_push("a Pod that stays on a node that is not ready, one that leaves it")?;
    let (steady, steady_container, _) = tokio::task::block_in_place(|| {
        wait_for(DEADLINE, || running(&gp, &host, "steady").filter(|_| running(&gp, &host, "brief").is_some()))
    })
    .with_context(|| format!("both Pods Running: {:?}\n{}", pods(&gp, &host, "brief"), gp.log_text()))?;
    let (brief, _, _) = running(&gp, &host, "brief").context("brief runs")?;
    ensure!(taints(&gp.get(&host, &node_path)?).is_empty(), "a Ready node has no taints");

    // The runtime dies: the node says so.
    kill(&containerd)?;
    drop(containerd);
    let killed = Instant::now();
    let ready = tokio::task::block_in_place(|| {
        wait_for(DEADLINE, || {
            let node = gp.get(&host, &node_path).ok()?;
            condition(&node, "Ready").filter(|c| c["status"] == "False").cloned()
        })
    })
    .with_context(|| format!("the node never went NotReady: {:?}", gp.get(&host, &node_path)))?;
    let said = killed.elapsed();
    println!("Ready=False {:.1} s after containerd was killed", said.as_secs_f64());
    ensure!(said < NODE_STATUS_WITHIN, "the node said it {said:?} after the runtime died");
    ensure!(ready["reason"] == "KubeletNotReady", "{ready}");
    ensure!(ready["message"] == "container runtime is down", "{ready}");
    let tainted = tokio::task::block_in_place(|| {
        wait_for(DEADLINE, || {
            let taints = taints(&gp.get(&host, &node_path).ok()?);
            (taints.len() == 2).then_some(taints)
        })
    })
    .context("the not-ready taints never came")?;
    ensure!(
        tainted == ["node.kubernetes.io/not-ready:NoSchedule", "node.kubernetes.io/not-ready:NoExecute"],
        "{tainted:?}"
    );

    // The Pod that tolerates it for 2 s is evicted: it stays Terminating, as its node cannot stop
    // it without a runtime; its replacement waits for a node.
    let replacement = tokio::task::block_in_place(|| {
        wait_for(DEADLINE, || {
            let pods = pods(&gp, &host, "brief").ok()?;
            let [evicted, pod] = pods.as_slice() else { return None };
            let (evicted, pod) = if evicted.name == brief { (evicted, pod) } else { (pod, evicted) };
            (evicted.name == brief && evicted.terminating && !pod.terminating && pod.node.is_empty())
                .then(|| pod.name.clone())
        })
    })
    .with_context(|| format!("brief was not evicted and replaced: {:?}", pods(&gp, &host, "brief")))?;
    let evicted = |events: &Value| {
        events["items"].as_array().into_iter().flatten().any(|e| {
            e["reason"] == "TaintManagerEviction"
                && e["involvedObject"]["name"] == brief.as_str()
                && e["message"] == format!("Marking for deletion Pod default/{brief}").as_str()
        })
    };
    tokio::task::block_in_place(|| {
        wait_for(DEADLINE, || gp.get(&host, "/api/v1/namespaces/default/events").ok().filter(evicted).map(drop))
    })
    .with_context(|| format!("no TaintManagerEviction Event for {brief}"))?;
    let path = format!("/api/v1/namespaces/default/pods/{replacement}");
    let unscheduled = tokio::task::block_in_place(|| {
        wait_for(DEADLINE, || {
            let pod = gp.get(&host, &path).ok()?;
            condition(&pod, "PodScheduled").filter(|c| c["status"] == "False").cloned()
        })
    })
    .context("no scheduling verdict on the replacement")?;
    ensure!(unscheduled["message"].as_str().is_some_and(|m| m.contains("not ready")), "{unscheduled}");
    ensure!(running(&gp, &host, "steady").is_some_and(|(name, _, _)| name == steady), "steady was evicted");

    // A Pod bound to the node now says why it does not start.
    work.write("pinned.yaml", &pinned())?;
    work.commit_and_push("a Pod bound to the node")?;
    let pushed = Instant::now();
    let pinned_path = "/api/v1/namespaces/default/pods/pinned";
    let told = tokio::task::block_in_place(|| {
        wait_for(DEADLINE, || {
            let pod = gp.get(&host, pinned_path).ok()?;
            condition(&pod, "PodReadyToStartContainers").filter(|c| c["reason"] == "FailedCreatePodSandBox").cloned()
        })
    })
    .with_context(|| format!("the bound Pod never said why: {:?}", gp.get(&host, pinned_path)))?;
    println!("the bound Pod said why {:.1} s after the push", pushed.elapsed().as_secs_f64());
    ensure!(told["status"] == "False", "{told}");
    let message = told["message"].as_str().unwrap_or_default().to_owned();
    ensure!(message.starts_with("Failed to create pod sandbox: ") && message.contains("Connection refused"), "{told}");
    ensure!(gp.get(&host, pinned_path)?["status"]["phase"] == "Pending", "the bound Pod is not Pending");
    let failed_event = |events: &Value| {
        events["items"].as_array().into_iter().flatten().any(|e| {
            e["reason"] == "FailedCreatePodSandBox" && e["involvedObject"]["name"] == "pinned" && e["type"] == "Warning"
        })
    };
    tokio::task::block_in_place(|| {
        wait_for(DEADLINE, || gp.get(&host, "/api/v1/namespaces/default/events").ok().filter(failed_event).map(drop))
    })
    .context("no FailedCreatePodSandBox Event on the bound Pod")?;

    // The runtime comes back: so does the node, and everything runs.
    let containerd = Containerd::start(containerd_config(&host)).await?;
    let restarted = Instant::now();
    tokio::task::block_in_place(|| {
        wait_for(DEADLINE, || {
            let node = gp.get(&host, &node_path).ok()?;
            condition(&node, "Ready").filter(|c| c["status"] == "True").map(drop)
        })
    })
    .with_context(|| format!("the node never came back: {:?}", gp.get(&host, &node_path)))?;
    let back = restarted.elapsed();
    println!("Ready=True {:.1} s after containerd was started again", back.as_secs_f64());
    ensure!(back < NODE_STATUS_WITHIN, "the node came back {back:?} after the runtime did");
    tokio::task::block_in_place(|| {
        wait_for(DEADLINE, || taints(&gp.get(&host, &node_path).ok()?).is_empty().then_some(()))
    })
    .context("the not-ready taints stayed")?;
    tokio::task::block_in_place(|| wait_for(DEADLINE, || running(&gp, &host, "brief")))
        .with_context(|| format!("the replacement never ran: {:?}", pods(&gp, &host, "brief")))?;
    tokio::task::block_in_place(|| wait_for(DEADLINE, || running(&gp, &host, "pinned")))
        .with_context(|| format!("the bound Pod never ran: {:?}", gp.get(&host, pinned_path)))?;
    let (name, container, restarts) = running(&gp, &host, "steady").context("steady runs")?;
    ensure!(
        (name.as_str(), container.as_str(), restarts) == (steady.as_str(), steady_container.as_str(), 0),
        "steady's first container should have kept running: {steady} {steady_container} -> {name} {container} ({restarts} restarts)"
    );

    let status = tokio::task::block_in_place(|| gp.stop(DEADLINE))?;
    ensure!(status.success(), "gitplane up exited with {status}");
    containerd.stop().await?;
    Ok(())
}
