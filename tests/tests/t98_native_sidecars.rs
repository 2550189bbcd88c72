//! Native sidecars (init containers with `restartPolicy: Always`) on the real
//! `gitplane up --nodes 1`, with the Kubernetes documentation's two examples as published (the
//! corpus' copies, byte for byte), `alpine` a stand-in served by the test kit's registry:
//! - the Deployment's Pod is `2/2 Running` in kubectl, its sidecar in initContainerStatuses,
//!   started and ready, shipping what the main container writes;
//! - the Job completes when its main container does: the sidecar ran beside it (started before
//!   it, stopped after it) and the Pod Succeeded;
//! - deleting the Deployment stops the main container first, then the sidecar.

use anyhow::{Context, Result, ensure};
use gitplane_e2e::{LocalCluster, Worktree, require_root, wait_for};
use gitplane_nodeagent::kubelet::cri::{Cri, pb};
use gitplane_nodeagent::kubelet::runtime::spec::LABEL_POD_UID;
use gitplane_testkit::registry::{self, Registry, StandIn};
use serde_json::Value;
use std::collections::HashMap;
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(180);

/// content/en/examples/application/deployment-sidecar.yaml of kubernetes/website.
const DEPLOYMENT: &str = include_str!("../corpus/plain/k8s-deployment-sidecar/deployment-sidecar.yaml");
/// content/en/examples/application/job/job-sidecar.yaml of kubernetes/website.
const JOB: &str = include_str!("../corpus/plain/k8s-job-sidecar/job-sidecar.yaml");

fn pods(cluster: &LocalCluster, selector: &str) -> Result<Vec<Value>> {
    let list = cluster.get(&format!("/api/v1/namespaces/default/pods?labelSelector={selector}"))?;
    Ok(list["items"].as_array().cloned().unwrap_or_default())
}

fn explain(cluster: &LocalCluster) -> String {
    let rows = cluster.kubectl(&["get", "pods", "-o", "wide"]).unwrap_or_else(|e| e.to_string());
    format!("{rows}\n{}", cluster.log_tail())
}

/// The states of pod `uid`'s containers by name, as the node's containerd has them.
async fn container_states(cri: &Cri, uid: &str) -> Result<HashMap<String, i32>> {
    let filter = pb::ContainerFilter {
        label_selector: HashMap::from([(LABEL_POD_UID.to_owned(), uid.to_owned())]),
        ..Default::default()
    };
    let listed = cri.runtime().list_containers(pb::ListContainersRequest { filter: Some(filter) }).await?;
    Ok(listed.into_inner().containers.into_iter().map(|c| (c.metadata.unwrap_or_default().name, c.state)).collect())
}

#[test]
fn t98_native_sidecars_run_beside_their_containers_and_stop_after_them() -> Result<()> {
    require_root()?;
    let dir = tempfile::tempdir()?;
    let mirror = registry::address(5000);
    let file = registry::write_registries_file(dir.path(), mirror, &[])?;
    let cluster = LocalCluster::up_with("gp98", 1, &["--registries", &file.to_string_lossy()])?;
    let registry = Registry::start(&dir.path().join("mirror"), &cluster, mirror, None)?;
    registry.push_stand_in("alpine:latest", &StandIn { cmd: vec!["/bin/sh".into()], ..StandIn::default() })?;
    let work = Worktree::clone(cluster.demo_repo(), dir.path().join("demo"))?;
    work.remove("web.yaml")?;
    work.write("deployment-sidecar.yaml", DEPLOYMENT)?;
    work.write("job-sidecar.yaml", JOB)?;
    work.commit_and_push("the documentation's sidecar examples")?;

    // The Deployment: one main container and its sidecar, both counted by kubectl.
    let pod = wait_for(DEADLINE, || {
        let rows = cluster.kubectl(&["get", "pods", "-l", "app.kubernetes.io/name=myapp", "--no-headers"]).ok()?;
        let row: Vec<&str> = rows.lines().next()?.split_whitespace().collect();
        (rows.lines().count() == 1 && row.get(1..3) == Some(&["2/2", "Running"][..])).then(|| row[0].to_owned())
    })
    .with_context(|| format!("myapp's Pod is never 2/2 Running\n{}", explain(&cluster)))?;
    let object = cluster.get(&format!("/api/v1/namespaces/default/pods/{pod}"))?;
    let status = &object["status"];
    let sidecar = &status["initContainerStatuses"][0];
    ensure!(
        sidecar["name"] == "logshipper"
            && sidecar["started"] == true
            && sidecar["ready"] == true
            && sidecar["restartCount"] == 0
            && sidecar["state"]["running"].is_object(),
        "the sidecar's status: {sidecar}"
    );
    ensure!(status["containerStatuses"][0]["state"]["running"].is_object(), "{status}");
    let shipped = wait_for(DEADLINE, || {
        cluster.kubectl(&["logs", &pod, "-c", "logshipper"]).ok().filter(|l| l.contains("logging"))
    });
    ensure!(shipped.is_some(), "the sidecar never shipped the main container's lines\n{}", explain(&cluster));

    // The Job: complete once its main container is, the sidecar stopped after it.
    let job = wait_for(DEADLINE, || {
        let job = cluster.get("/apis/batch/v1/namespaces/default/jobs/myjob").ok()?;
        (job["status"]["succeeded"] == 1).then_some(job)
    })
    .with_context(|| format!("the Job never succeeded\n{}", explain(&cluster)))?;
    let complete = job["status"]["conditions"].as_array().into_iter().flatten();
    ensure!(complete.clone().any(|c| c["type"] == "Complete" && c["status"] == "True"), "{}", job["status"]);
    let job_pods = pods(&cluster, "batch.kubernetes.io%2Fjob-name%3Dmyjob")?;
    ensure!(job_pods.len() == 1 && job_pods[0]["status"]["phase"] == "Succeeded", "the Job's Pods: {job_pods:?}");
    let status = &job_pods[0]["status"];
    let (main, sidecar) = (&status["containerStatuses"][0]["state"]["terminated"], &status["initContainerStatuses"][0]);
    ensure!(main["exitCode"] == 0 && main["reason"] == "Completed", "the main container: {status}");
    let ran = &sidecar["state"]["terminated"];
    ensure!(sidecar["name"] == "logshipper" && ran.is_object(), "the sidecar was not stopped: {sidecar}");
    let time = |v: &Value| v.as_str().unwrap_or_default().parse::<k8s_openapi::jiff::Timestamp>().ok();
    ensure!(
        time(&ran["startedAt"]) <= time(&main["startedAt"]) && time(&ran["finishedAt"]) >= time(&main["finishedAt"]),
        "the sidecar did not run beside the main container: {status}"
    );
    let job_pod = job_pods[0]["metadata"]["name"].as_str().unwrap_or_default();
    let logs = cluster.kubectl(&["logs", job_pod, "-c", "logshipper"])?;
    ensure!(logs.contains("logging"), "the Job's sidecar shipped nothing: {logs:?}");

    // Deleting the Deployment: its main container stops first, then the sidecar.
    let uid = object["metadata"]["uid"].as_str().context("the Pod's uid")?.to_owned();
    let node = object["spec"]["nodeName"].as_str().context("the Pod's node")?.to_owned();
    work.remove("deployment-sidecar.yaml")?;
    work.commit_and_push("no more myapp")?;
    let running = pb::ContainerState::ContainerRunning as i32;
    let exited = pb::ContainerState::ContainerExited as i32;
    let seen: Vec<(i32, i32)> = tokio::runtime::Runtime::new()?.block_on(async {
        let cri = Cri::connect(&cluster.containerd_socket(&node)).await?;
        let started = Instant::now();
        let mut seen = Vec::new();
        loop {
            let states = container_states(&cri, &uid).await?;
            let (Some(main), Some(sidecar)) = (states.get("myapp"), states.get("logshipper")) else {
                return anyhow::Ok(seen);
            };
            if seen.last() != Some(&(*main, *sidecar)) {
                seen.push((*main, *sidecar));
            }
            ensure!(started.elapsed() < DEADLINE, "the Pod was never removed: {seen:?}\n{}", explain(&cluster));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })?;
    ensure!(seen.contains(&(exited, running)), "the sidecar was never seen running after the main container: {seen:?}");
    ensure!(!seen.contains(&(running, exited)), "the sidecar stopped before the main container: {seen:?}");
    wait_for(DEADLINE, || pods(&cluster, "app.kubernetes.io%2Fname%3Dmyapp").ok().filter(Vec::is_empty))
        .with_context(|| format!("myapp's Pod is never removed\n{}", explain(&cluster)))?;

    drop(registry);
    cluster.stop_within(Duration::from_secs(30))?;
    Ok(())
}
