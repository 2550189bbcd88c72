//! What a node says about itself, from its agent's flags and its host, and what the scheduler
//! makes of it, on the real `gitplane up --nodes 1`: labels and a taint from the flags, allocatable
//! less the reserve, the images present, and a pressure condition (made True here by a threshold
//! no host meets) that taints the node. Pods that do not tolerate a taint stay Pending with the
//! scheduler's reason; a Pod that tolerates them runs.

use anyhow::{Context, Result, ensure};
use gitplane_e2e::{LocalCluster, Worktree, require_root, wait_for};
use serde_json::Value;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(120);

fn pod(name: &str, tolerations: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  tolerations: {tolerations}\n  containers:\n  \
         - name: web\n    image: gitplane.local/httpd:1\n    imagePullPolicy: IfNotPresent\n"
    )
}

fn condition<'a>(object: &'a Value, type_: &str) -> Option<&'a Value> {
    object["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == type_)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t68_labels_taints_reserves_and_pressure_reach_the_scheduler() -> Result<()> {
    require_root()?;
    let flags = [
        "--agent-arg=--node-labels=disk=ssd",
        "--agent-arg=--register-with-taints=dedicated=gp:NoSchedule",
        "--agent-arg=--system-reserved=cpu=500m",
        // Fewer PIDs in use than all of them: always true, so PIDPressure is True.
        "--agent-arg=--eviction-hard=pid.available<100%",
    ];
    let cluster = tokio::task::block_in_place(|| LocalCluster::up_with("gp68", 1, &flags))?;
    let name = cluster.nodes[0].clone();
    let node_path = format!("/api/v1/nodes/{name}");

    // The node as the flags and the host describe it, once its first status report arrived.
    let node = tokio::task::block_in_place(|| {
        wait_for(DEADLINE, || {
            let node = cluster.get(&node_path).ok()?;
            let tainted =
                node["spec"]["taints"].as_array()?.iter().any(|t| t["key"] == "node.kubernetes.io/pid-pressure");
            tainted.then_some(node)
        })
    })
    .with_context(|| format!("node {name} never got its pid-pressure taint: {:?}", cluster.get(&node_path)))?;
    ensure!(node["metadata"]["labels"]["disk"] == "ssd", "labels: {}", node["metadata"]["labels"]);
    let taints: Vec<&str> =
        node["spec"]["taints"].as_array().into_iter().flatten().filter_map(|t| t["key"].as_str()).collect();
    ensure!(taints.contains(&"dedicated"), "taints: {taints:?}");
    let pid = condition(&node, "PIDPressure").context("PIDPressure condition")?;
    ensure!(pid["status"] == "True" && pid["reason"] == "KubeletHasInsufficientPID", "{pid}");
    let memory = condition(&node, "MemoryPressure").context("MemoryPressure condition")?;
    ensure!(memory["status"] == "False", "{memory}");
    ensure!(condition(&node, "Ready").is_some_and(|c| c["status"] == "True"), "{}", node["status"]["conditions"]);
    let cpus: i64 = node["status"]["capacity"]["cpu"].as_str().context("cpu capacity")?.parse()?;
    ensure!(
        node["status"]["allocatable"]["cpu"] == format!("{}m", cpus * 1000 - 500).as_str(),
        "allocatable {} for capacity {cpus}",
        node["status"]["allocatable"]
    );
    ensure!(node["status"]["capacity"]["ephemeral-storage"].is_string(), "{}", node["status"]["capacity"]);
    let images = node["status"]["images"].to_string();
    ensure!(images.contains("gitplane.local/httpd:1"), "images: {images}");

    // Only a Pod that tolerates both taints runs.
    let work_dir = tempfile::tempdir()?;
    let work = Worktree::clone(cluster.demo_repo(), work_dir.path().join("demo"))?;
    work.remove("web.yaml")?;
    work.write("half.yaml", &pod("half", "[{key: dedicated, operator: Exists}]"))?;
    work.write("all.yaml", &pod("all", "[{operator: Exists}]"))?;
    work.commit_and_push("two Pods, one tolerating every taint")?;
    let all = "/api/v1/namespaces/default/pods/all";
    tokio::task::block_in_place(|| {
        wait_for(DEADLINE, || cluster.get(all).ok().filter(|p| p["status"]["phase"] == "Running"))
    })
    .with_context(|| format!("the tolerating Pod never ran: {:?}", cluster.get(all)))?;
    let half = "/api/v1/namespaces/default/pods/half";
    let pending = tokio::task::block_in_place(|| {
        wait_for(DEADLINE, || {
            let pod = cluster.get(half).ok()?;
            let scheduled = condition(&pod, "PodScheduled")?;
            (scheduled["status"] == "False").then(|| scheduled["message"].as_str().unwrap_or_default().to_owned())
        })
    })
    .with_context(|| format!("no scheduling verdict on the half-tolerating Pod: {:?}", cluster.get(half)))?;
    ensure!(pending.contains("untolerated taint {node.kubernetes.io/pid-pressure: }"), "unexpected reason: {pending}");
    ensure!(cluster.get(half)?["spec"]["nodeName"].is_null(), "the Pod was bound");
    cluster.stop(Duration::from_secs(60))?;
    Ok(())
}
