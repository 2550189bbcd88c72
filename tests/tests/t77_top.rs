//! `kubectl top nodes` and `kubectl top pods` against the real `gitplane up --nodes 1`: the
//! metrics API is answered from the node's CRI stats, and the figures are real: a container
//! spinning under a 200m CPU limit and holding 16 MB shows tens to hundreds of millicores and
//! more than 10 MiB, an idle one next to nothing.

use anyhow::{Context, Result, ensure};
use gitplane_e2e::{LocalCluster, Worktree, require_root, wait_for};
use std::{process::Command, time::Duration};

const DEADLINE: Duration = Duration::from_secs(120);

const WORKLOAD: &str = "apiVersion: v1
kind: Pod
metadata:
  name: spinner
  labels: {app: top}
spec:
  containers:
  - name: spin
    image: gitplane.local/httpd:1
    imagePullPolicy: IfNotPresent
    command: [sh, -c, 'x=$(head -c 16000000 /dev/zero | tr -c a a); while :; do :; done']
    resources:
      limits: {cpu: 200m, memory: 64Mi}
---
apiVersion: v1
kind: Pod
metadata:
  name: idler
  labels: {app: top}
spec:
  containers:
  - name: web
    image: gitplane.local/httpd:1
    imagePullPolicy: IfNotPresent
";

/// `kubectl --server <api> top <args>`: stdout, or the failure with stderr.
fn top(cluster: &LocalCluster, args: &[&str]) -> Result<String> {
    let out = Command::new("kubectl")
        .arg("--server")
        .arg(format!("http://{}", cluster.listen))
        .arg("top")
        .args(args)
        .output()
        .context("running kubectl (apt-get install kubectl)")?;
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    ensure!(out.status.success(), "kubectl top {args:?}: {}", text(&out.stderr));
    Ok(text(&out.stdout))
}

/// Millicores in a `kubectl top` CPU column (`199m`, `1`).
fn millicores(cell: &str) -> Option<u64> {
    match cell.strip_suffix('m') {
        Some(m) => m.parse().ok(),
        None => cell.parse::<u64>().ok().map(|cores| cores * 1000),
    }
}

/// The row of `name` in a `kubectl top` table, split on whitespace.
fn row(table: &str, name: &str) -> Option<Vec<String>> {
    table.lines().map(|l| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>()).find(|c| c[0] == name)
}

#[test]
fn t77_kubectl_top_shows_real_usage() -> Result<()> {
    require_root()?;
    let cluster = LocalCluster::up("gp77", 1)?;
    let node = cluster.nodes[0].clone();
    let work_dir = tempfile::tempdir()?;
    let work = Worktree::clone(cluster.demo_repo(), work_dir.path().join("demo"))?;
    work.remove("web.yaml")?;
    work.write("top.yaml", WORKLOAD)?;
    work.commit_and_push("a spinning and an idle Pod")?;
    wait_for(DEADLINE, || cluster.running_pods("app=top").ok().filter(|p| p.len() == 2))
        .with_context(|| format!("2 Running Pods:\n{}", cluster.log_text()))?;

    let nodes = top(&cluster, &["nodes"])?;
    println!("{nodes}");
    let header = nodes.lines().next().unwrap_or_default();
    ensure!(header.contains("CPU(cores)") && header.contains("MEMORY(bytes)"), "{nodes}");
    let node_row = row(&nodes, &node).with_context(|| format!("no row for {node}:\n{nodes}"))?;
    ensure!(node_row[2].ends_with('%') && node_row[3].ends_with("Mi"), "{node_row:?}");

    // The spinner's first figures may come before it has run a whole window: poll.
    let spinning = wait_for(DEADLINE, || {
        let pods = top(&cluster, &["pods", "-l", "app=top"]).ok()?;
        let spin = millicores(&row(&pods, "spinner")?[1])?;
        let idle = millicores(&row(&pods, "idler")?[1])?;
        (spin >= 50).then_some((pods, spin, idle))
    });
    let (pods, spin, idle) = spinning.with_context(|| {
        format!("the spinner never showed 50m or more:\n{:?}", top(&cluster, &["pods", "-l", "app=top"]))
    })?;
    println!("{pods}");
    ensure!(spin <= 400, "a 200m limit cannot give {spin}m:\n{pods}");
    ensure!(idle < 30, "an idle httpd at {idle}m:\n{pods}");
    let memory = row(&pods, "spinner").context("spinner")?[2].clone();
    let mib: u64 = memory.strip_suffix("Mi").and_then(|m| m.parse().ok()).context(memory.clone())?;
    ensure!((10..=64).contains(&mib), "the spinner holds 16 MB under a 64Mi limit, shown as {memory}:\n{pods}");

    let containers = top(&cluster, &["pods", "spinner", "--containers"])?;
    ensure!(row(&containers, "spinner").is_some_and(|r| r[1] == "spin"), "{containers}");
    // A Pod that does not exist, and a malformed selector, are refused.
    ensure!(top(&cluster, &["pods", "nope"]).is_err(), "metrics of a missing Pod");
    ensure!(top(&cluster, &["pods", "-l", "app in (("]).is_err(), "a malformed selector");
    cluster.stop(DEADLINE)?;
    Ok(())
}
