//! An agent that dies (SIGKILL) and is started again adopts the Pods it finds in containerd: no
//! container is restarted, no sandbox is duplicated, and the new agent goes on running new Pods.
//! Then containerd dies (SIGKILL) and is started again: the Pods kept running in their shims,
//! the agent reconnects and relists, and still no container is restarted. On the real
//! `gitplane up --nodes 1`, which starts a failed agent or containerd again. At the end a Pod
//! that ignores SIGTERM runs: a stop (Ctrl-C) still ends within 10 s and leaves no namespace,
//! mount, process or cgroup of the cluster behind.

use anyhow::{Context, Result, ensure};
use gitplane_e2e::{LocalCluster, Worktree, manifests, require_root, wait_for};
use gitplane_nodeagent::kubelet::cri::{Cri, pb};
use std::collections::BTreeSet;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(120);

/// Every sandbox and container id in the node's containerd, with its state.
async fn runtime_objects(cri: &Cri) -> Result<BTreeSet<(String, i32)>> {
    let sandboxes = cri.runtime().list_pod_sandbox(pb::ListPodSandboxRequest { filter: None }).await?.into_inner();
    let containers = cri.runtime().list_containers(pb::ListContainersRequest { filter: None }).await?.into_inner();
    Ok(sandboxes
        .items
        .into_iter()
        .map(|s| (format!("sandbox {}", s.id), s.state))
        .chain(containers.containers.into_iter().map(|c| (format!("container {}", c.id), c.state)))
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t69_a_restarted_agent_or_runtime_adopts_its_pods() -> Result<()> {
    require_root()?;
    let cluster = tokio::task::block_in_place(|| LocalCluster::up("gp69", 1))?;
    let node = cluster.nodes[0].clone();
    let work_dir = tempfile::tempdir()?;
    let work = Worktree::clone(cluster.demo_repo(), work_dir.path().join("demo"))?;
    work.remove("web.yaml")?;
    work.write("steady.yaml", &manifests::deployment("steady", 2))?;
    work.commit_and_push("two steady Pods")?;
    let before = tokio::task::block_in_place(|| {
        wait_for(DEADLINE, || cluster.running_pods("app=steady").ok().filter(|p| p.len() == 2))
    })
    .with_context(|| format!("2 Running Pods: {:?}\n{}", cluster.running_pods("app=steady"), cluster.log_text()))?;
    let cri = Cri::connect(&cluster.containerd_socket(&node)).await?;
    // Once the demo's Pods are gone, only the two steady Pods are left in containerd.
    let started = std::time::Instant::now();
    let objects = loop {
        let objects = runtime_objects(&cri).await?;
        if objects.iter().filter(|(id, _)| id.starts_with("sandbox")).count() == 2 {
            break objects;
        }
        ensure!(started.elapsed() < DEADLINE, "the demo's Pods were not removed: {objects:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    let killed = cluster.agent_pid(&node).context("the agent's pid")?;
    // SAFETY: kill(2) on the agent process `gitplane up` (our child) runs for the node.
    unsafe { libc::kill(killed, libc::SIGKILL) };
    tokio::task::block_in_place(|| wait_for(DEADLINE, || cluster.agent_pid(&node).filter(|pid| *pid != killed)))
        .context("the agent was not started again")?;

    // The new agent runs a new Pod: it has listed its Pods and synced them by then.
    work.write("later.yaml", &manifests::pod("later"))?;
    work.commit_and_push("one more Pod")?;
    tokio::task::block_in_place(|| {
        wait_for(DEADLINE, || cluster.running_pods("app=later").ok().filter(|p| p.len() == 1))
    })
    .with_context(|| format!("the new agent never ran the new Pod:\n{}", cluster.log_text()))?;

    let ids = |pods: &[gitplane_e2e::RunningPod]| {
        pods.iter().map(|p| (p.name.clone(), p.container.clone())).collect::<BTreeSet<_>>()
    };
    let no_restarts = || -> Result<()> {
        let list = cluster.get("/api/v1/namespaces/default/pods?labelSelector=app%3Dsteady")?;
        for pod in list["items"].as_array().into_iter().flatten() {
            let restarts = &pod["status"]["containerStatuses"][0]["restartCount"];
            ensure!(restarts == 0, "{} restarted: {restarts}", pod["metadata"]["name"]);
        }
        Ok(())
    };
    let after = cluster.running_pods("app=steady")?;
    ensure!(ids(&after) == ids(&before), "the steady Pods' containers changed: {before:?} -> {after:?}");
    let now = runtime_objects(&cri).await?;
    let kept: BTreeSet<_> = now.intersection(&objects).collect();
    ensure!(kept.len() == objects.len(), "sandboxes or containers were replaced or stopped: {objects:?} -> {now:?}");
    ensure!(
        now.iter().filter(|(id, _)| id.starts_with("sandbox")).count() == 3,
        "a sandbox was duplicated (2 steady and 1 later expected): {now:?}"
    );
    no_restarts()?;

    // containerd dies: gitplane up starts it again, and it finds the Pods in their shims.
    let objects = now;
    let killed = cluster.containerd_pid(&node).context("containerd's pid")?;
    // SAFETY: kill(2) on the containerd `gitplane up` (our child) runs for the node.
    unsafe { libc::kill(killed, libc::SIGKILL) };
    tokio::task::block_in_place(|| wait_for(DEADLINE, || cluster.containerd_pid(&node).filter(|pid| *pid != killed)))
        .context("containerd was not started again")?;
    // PID 1 of a container ignores SIGTERM unless it handles it: this one waits out its grace.
    let stubborn = manifests::shell_pod("last", "exec /bin/busybox sleep 3600")
        .replace("terminationGracePeriodSeconds: 1", "terminationGracePeriodSeconds: 30")
        .replace("metadata:\n  name: last\n", "metadata:\n  name: last\n  labels: {app: last}\n");
    work.write("last.yaml", &stubborn)?;
    work.commit_and_push("a Pod after containerd's restart")?;
    tokio::task::block_in_place(|| {
        wait_for(DEADLINE, || cluster.running_pods("app=last").ok().filter(|p| p.len() == 1))
    })
    .with_context(|| format!("the agent never ran a Pod on the new containerd:\n{}", cluster.log_text()))?;
    ensure!(cluster.ready_nodes()? == [node.clone()], "the node is not Ready again");
    let cri = Cri::connect(&cluster.containerd_socket(&node)).await?;
    let after = cluster.running_pods("app=steady")?;
    ensure!(ids(&after) == ids(&before), "containerd's restart changed the steady Pods: {before:?} -> {after:?}");
    let now = runtime_objects(&cri).await?;
    let kept: BTreeSet<_> = now.intersection(&objects).collect();
    ensure!(kept.len() == objects.len(), "containerd's restart replaced or stopped some: {objects:?} -> {now:?}");
    no_restarts()?;
    let took = tokio::task::block_in_place(|| cluster.stop_within(Duration::from_secs(10)))?;
    println!("gitplane up --nodes 1 stopped in {:.1} s", took.as_secs_f64());
    Ok(())
}
