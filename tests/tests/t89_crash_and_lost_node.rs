//! The appliance itself fails, then one of its nodes: on the real `gitplane up --nodes 2`.
//!
//! `gitplane up` is killed with SIGKILL and started again with the same data: it takes up the
//! nodes it left (their agents and containerds are replaced, their Pods adopted): every Pod runs
//! on with its first container, none is duplicated or lost, and pushes are applied again.
//!
//! Then node 2's network namespace is deleted (`ip netns del`): the node is removed, the control
//! plane finds it unreachable (`--node-monitor-grace-period=12s` here), and its Pods, which
//! tolerate that for 2 s (`--default-unreachable-toleration-seconds=2`), are made anew on node 1.

use anyhow::{Context, Result, ensure};
use gitplane_e2e::{LocalCluster, RunningPod, Worktree, manifests, require_root, wait_for};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(120);

/// Each Pod as (name, node, first container).
fn placed(pods: &[RunningPod]) -> BTreeSet<(String, String, String)> {
    pods.iter().map(|p| (p.name.clone(), p.node.clone(), p.container.clone())).collect()
}

/// Whether every node's containerd runs exactly the Pods bound to it, each once.
async fn runtimes_match(cluster: &LocalCluster, nodes: &[String]) -> Result<()> {
    for node in nodes {
        let (running, bound) = (cluster.runtime_pods(node).await?, cluster.bound_pods(node)?);
        ensure!(running == bound, "{node}'s containerd runs {running:?}, the Pods bound to it are {bound:?}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t89_a_killed_appliance_takes_its_pods_up_again_and_a_lost_nodes_pods_move() -> Result<()> {
    require_root()?;
    let flags = ["--default-unreachable-toleration-seconds=2", "--node-monitor-grace-period=12s"];
    let mut cluster = tokio::task::block_in_place(|| LocalCluster::up_with("gp89", 2, &flags))?;
    let nodes = cluster.nodes.clone();
    let work_dir = tempfile::tempdir()?;
    let work = Worktree::clone(cluster.demo_repo(), work_dir.path().join("demo"))?;
    work.remove("web.yaml")?;
    work.write("steady.yaml", &manifests::deployment("steady", 4))?;
    work.commit_and_push("four steady Pods")?;
    let before = tokio::task::block_in_place(|| {
        wait_for(DEADLINE, || {
            let pods = cluster.running_pods("app=steady").ok()?;
            let on: BTreeSet<&str> = pods.iter().map(|p| p.node.as_str()).collect();
            (pods.len() == 4 && on.len() == 2).then_some(pods)
        })
    })
    .with_context(|| format!("4 Pods on both nodes: {:?}", cluster.running_pods("app=steady")))?;

    // The appliance dies and comes back.
    tokio::task::block_in_place(|| cluster.kill())?;
    let killed = Instant::now();
    tokio::task::block_in_place(|| cluster.restart())?;
    println!("gitplane up was up again, every node Ready, {:.1} s after it was killed", killed.elapsed().as_secs_f64());
    work.write("later.yaml", &manifests::pod("later"))?;
    work.commit_and_push("a Pod after the restart")?;
    tokio::task::block_in_place(|| {
        wait_for(DEADLINE, || cluster.running_pods("app=later").ok().filter(|p| p.len() == 1))
    })
    .with_context(|| format!("the restarted appliance never ran a new Pod:\n{}", cluster.log_text()))?;
    let after = cluster.running_pods("app=steady")?;
    ensure!(placed(&after) == placed(&before), "the Pods changed across the restart: {before:?} -> {after:?}");
    let list = cluster.get("/api/v1/namespaces/default/pods?labelSelector=app%3Dsteady")?;
    for pod in list["items"].as_array().into_iter().flatten() {
        let restarts = &pod["status"]["containerStatuses"][0]["restartCount"];
        ensure!(restarts == 0, "{} restarted: {restarts}", pod["metadata"]["name"]);
    }
    runtimes_match(&cluster, &nodes).await?;

    // Node 2 loses its network namespace: its Pods move to node 1.
    let lost = &nodes[1];
    let moved = after.iter().filter(|p| &p.node == lost).count();
    gitplane_e2e::stdout_of(std::process::Command::new("ip").args(["netns", "del", lost]))?;
    let deleted = Instant::now();
    let node_path = format!("/api/v1/nodes/{lost}");
    tokio::task::block_in_place(|| {
        wait_for(DEADLINE, || {
            let node = cluster.get(&node_path).ok()?;
            let conditions = node["status"]["conditions"].as_array()?;
            conditions.iter().any(|c| c["type"] == "Ready" && c["status"] == "Unknown").then_some(())
        })
    })
    .with_context(|| format!("{lost} never went NotReady: {:?}", cluster.get(&node_path)))?;
    println!("{lost} NotReady {:.1} s after its network namespace was deleted", deleted.elapsed().as_secs_f64());
    tokio::task::block_in_place(|| {
        wait_for(DEADLINE, || {
            let pods = cluster.running_pods("app=steady").ok()?;
            (pods.len() == 4 && pods.iter().all(|p| p.node == nodes[0])).then_some(())
        })
    })
    .with_context(|| format!("{lost}'s Pods never moved: {:?}", cluster.running_pods("app=steady")))?;
    println!("{moved} Pods of {lost} ran on {} {:.1} s after", nodes[0], deleted.elapsed().as_secs_f64());
    runtimes_match(&cluster, &nodes[..1]).await?;

    let took = tokio::task::block_in_place(|| cluster.stop_within(Duration::from_secs(10)))?;
    println!("gitplane up --nodes 2 stopped in {:.1} s", took.as_secs_f64());
    Ok(())
}
