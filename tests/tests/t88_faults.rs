//! The whole appliance under faults: on the real `gitplane up --nodes 3`, a stream of pushes
//! rolls a Deployment of five Pods forward while, one after another, node 1's agent, node 2's
//! containerd and a Pod's shim on node 3 are killed with SIGKILL. Afterwards the last pushed
//! commit is applied, the Deployment runs five ready Pods of it and no other, every node's
//! containerd runs exactly the Pods bound to it (each once), and a stop within 10 s leaves no
//! namespace, mount, process or cgroup behind.
//!
//! Then each fault alone, right after a push, against a push without one: how long after the
//! fault the cluster converged on that push. It prints these times (BENCHMARKS.md, "Faults":
//! the goal is under 10 s).

use anyhow::{Context, Result, ensure};
use gitplane_e2e::{LocalCluster, Worktree, require_root, wait_for_async};
use serde_json::Value;
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(120);
const REPLICAS: usize = 5;
const PUSHES: u32 = 6;
/// Between two pushes of the stream.
const PUSH_EVERY: Duration = Duration::from_millis(1500);

/// The Deployment at push `n`: its Pods carry `n` in an annotation, so every push rolls them.
fn web(n: u32) -> String {
    format!(
        "apiVersion: apps/v1
kind: Deployment
metadata: {{name: web, labels: {{app: web}}}}
spec:
  replicas: {REPLICAS}
  selector: {{matchLabels: {{app: web}}}}
  template:
    metadata:
      labels: {{app: web}}
      annotations: {{example.com/push: \"{n}\"}}
    spec:
      containers: [{{name: web, image: gitplane.local/httpd:1, imagePullPolicy: IfNotPresent}}]
"
    )
}

/// What is killed with SIGKILL.
#[derive(Clone, Copy, Debug)]
enum Fault {
    None,
    /// Node 1's agent.
    Agent,
    /// Node 2's containerd.
    Containerd,
    /// A shim of node 3 (of whichever Pod it runs), else of the next node that runs one.
    Shim,
}

fn inject(cluster: &LocalCluster, fault: Fault) -> Result<()> {
    let nodes = &cluster.nodes;
    match fault {
        Fault::None => Ok(()),
        Fault::Agent => kill(cluster.agent_pid(&nodes[0]).context("node 1's agent")?, &format!("{}'s agent", nodes[0])),
        Fault::Containerd => {
            let pid = cluster.containerd_pid(&nodes[1]).context("node 2's containerd")?;
            kill(pid, &format!("{}'s containerd", nodes[1]))
        }
        Fault::Shim => {
            let shim = nodes.iter().rev().find_map(|node| Some((node, *cluster.shim_pids(node).first()?)));
            let (node, pid) = shim.context("no shim runs")?;
            kill(pid, &format!("a shim of {node}"))
        }
    }
}

fn kill(pid: i32, what: &str) -> Result<()> {
    // SAFETY: kill(2) on a process of the cluster this test runs.
    ensure!(
        unsafe { libc::kill(pid, libc::SIGKILL) } == 0,
        "kill -9 {what} ({pid}): {}",
        std::io::Error::last_os_error()
    );
    Ok(())
}

/// Why the cluster has not converged on push `n` (committed as `head`), or `None` once it has.
async fn not_converged(cluster: &LocalCluster, n: u32, head: &str) -> Result<Option<String>> {
    let app = cluster.get("/apis/gitplane.io/v1/namespaces/gitplane-system/applications/demo")?;
    let sync = &app["status"]["sync"];
    if sync["revision"] != head || sync["status"] != "Synced" {
        return Ok(Some(format!("the Application is at {} ({})", sync["revision"], sync["status"])));
    }
    let pods = cluster.get("/api/v1/namespaces/default/pods?labelSelector=app%3Dweb")?;
    let pods: Vec<&Value> = pods["items"].as_array().context("PodList has items")?.iter().collect();
    let current = |p: &&Value| {
        p["metadata"]["annotations"]["example.com/push"] == n.to_string().as_str()
            && p["status"]["phase"] == "Running"
            && p["status"]["containerStatuses"][0]["ready"] == true
    };
    if pods.len() != REPLICAS || !pods.iter().all(current) {
        let seen: Vec<String> = pods
            .iter()
            .map(|p| {
                let push = p["metadata"]["annotations"]["example.com/push"].as_str().unwrap_or("?");
                format!("{} push {push} {} on {}", p["metadata"]["name"], p["status"]["phase"], p["spec"]["nodeName"])
            })
            .collect();
        return Ok(Some(format!("Pods: {seen:?}")));
    }
    for node in &cluster.nodes {
        let (running, bound) = (cluster.runtime_pods(node).await?, cluster.bound_pods(node)?);
        if running != bound {
            return Ok(Some(format!("{node}'s containerd runs {running:?}, bound to it: {bound:?}")));
        }
    }
    Ok(None)
}

/// Waits until the cluster converged on push `n` (committed as `head`); how long after `since`.
async fn converge(cluster: &LocalCluster, n: u32, head: &str, since: Instant) -> Result<Duration> {
    let converged = wait_for_async(DEADLINE, || async {
        not_converged(cluster, n, head).await.ok().flatten().is_none().then(|| since.elapsed())
    })
    .await;
    match converged {
        Some(took) => Ok(took),
        None => {
            let why = not_converged(cluster, n, head).await?;
            anyhow::bail!("the cluster never converged on push {n}: {why:?}\n{}", cluster.log_text())
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t88_a_push_stream_survives_agent_runtime_and_shim_kills() -> Result<()> {
    require_root()?;
    let cluster = tokio::task::block_in_place(|| LocalCluster::up("gp88", 3))?;
    let work_dir = tempfile::tempdir()?;
    let work = Worktree::clone(cluster.demo_repo(), work_dir.path().join("demo"))?;
    let push = |n: u32| -> Result<String> {
        work.write("web.yaml", &web(n))?;
        work.commit_and_push(&format!("push {n}"))?;
        work.head()
    };
    let head = push(0)?;
    converge(&cluster, 0, &head, Instant::now()).await?;

    // The stream, a fault every other push, the last right after the last push.
    let mut last_fault = Instant::now();
    for n in 1..=PUSHES {
        push(n)?;
        let fault = match n {
            2 => Fault::Agent,
            4 => Fault::Containerd,
            PUSHES => Fault::Shim,
            _ => Fault::None,
        };
        inject(&cluster, fault)?;
        if n == PUSHES {
            last_fault = Instant::now();
        } else {
            tokio::time::sleep(PUSH_EVERY).await;
        }
    }
    let head = work.head()?;
    let took = converge(&cluster, PUSHES, &head, last_fault).await?;
    println!(
        "push stream with agent, containerd and shim kills: converged {:.1} s after the last fault",
        took.as_secs_f64()
    );

    // Each fault alone, right after a push.
    for (i, fault) in [Fault::None, Fault::Agent, Fault::Containerd, Fault::Shim].into_iter().enumerate() {
        let n = PUSHES + 1 + i as u32;
        let head = push(n)?;
        inject(&cluster, fault)?;
        let took = converge(&cluster, n, &head, Instant::now()).await?;
        let what = match fault {
            Fault::None => "a push alone".to_owned(),
            fault => format!("a push, then {fault:?} killed"),
        };
        println!("{what}: converged {:.1} s after the fault", took.as_secs_f64());
    }
    ensure!(cluster.ready_nodes()?.len() == 3, "a node is not Ready: {:?}", cluster.ready_nodes());

    let stopped = tokio::task::block_in_place(|| cluster.stop_within(Duration::from_secs(10)))?;
    println!("gitplane up --nodes 3 stopped in {:.1} s", stopped.as_secs_f64());
    Ok(())
}
