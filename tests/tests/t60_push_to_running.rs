//! The walking skeleton end to end: `gitplane up` (control plane, node agent, its own
//! containerd) inside a network-namespace host; changes pushed with real git become running
//! containers serving HTTP on their pod IPs; a bad commit is rejected whole; removing the
//! manifest removes the Pods and their sandboxes; a Job runs to completion and its Application
//! turns Healthy; SIGTERM stops everything cleanly.

use anyhow::{Context, Result, ensure};
use gitplane_e2e::{Gitplane, HostExt, NetnsHost, Worktree, netns_host, require_root, wait_for};
use gitplane_nodeagent::kubelet::cri::{Cri, pb};
use serde_json::Value;
use std::{
    net::{IpAddr, SocketAddr},
    time::{Duration, Instant},
};

const DEADLINE: Duration = Duration::from_secs(60);

fn deployment(replicas: &str) -> String {
    format!(
        "apiVersion: apps/v1
kind: Deployment
metadata:
  name: hello
spec:
  replicas: {replicas}
  selector:
    matchLabels:
      app: hello
  template:
    metadata:
      labels:
        app: hello
    spec:
      terminationGracePeriodSeconds: 5
      containers:
        - name: httpd
          image: gitplane.local/httpd:1
          ports:
            - containerPort: 80
          resources:
            requests:
              cpu: 10m
              memory: 8Mi
"
    )
}

const SERVICE: &str = "apiVersion: v1
kind: Service
metadata:
  name: hello
spec:
  selector:
    app: hello
  ports:
    - port: 80
";

const JOB: &str = "apiVersion: batch/v1
kind: Job
metadata:
  name: migrate
spec:
  backoffLimit: 0
  template:
    spec:
      restartPolicy: Never
      containers:
        - name: migrate
          image: gitplane.local/httpd:1
          command: [/bin/busybox, sh, -c, echo migrated]
";

/// Pods in `default` as (name, phase, podIP, app label).
fn pods(up: &Gitplane, host: &NetnsHost) -> Result<Vec<(String, String, String, String)>> {
    let list = up.get(host, "/api/v1/namespaces/default/pods")?;
    let items = list["items"].as_array().context("PodList has items")?;
    Ok(items
        .iter()
        .map(|p| {
            let s = |v: &Value| v.as_str().unwrap_or("").to_owned();
            (
                s(&p["metadata"]["name"]),
                s(&p["status"]["phase"]),
                s(&p["status"]["podIP"]),
                s(&p["metadata"]["labels"]["app"]),
            )
        })
        .collect())
}

/// The Running pods of app `app` with their IPs, once exactly `n` exist and no other pods do.
fn wait_running(up: &Gitplane, host: &NetnsHost, app: &str, n: usize) -> Result<Vec<(String, String)>> {
    let found = wait_for(DEADLINE, || {
        let all = pods(up, host).ok()?;
        let running: Vec<_> = all
            .iter()
            .filter(|(_, phase, ip, a)| a == app && phase == "Running" && !ip.is_empty())
            .map(|(name, _, ip, _)| (name.clone(), ip.clone()))
            .collect();
        (all.len() == n && running.len() == n).then_some(running)
    });
    found.with_context(|| {
        format!("expected {n} Running pods of {app}, have {:?}\n{}", pods(up, host).ok(), up.log_text())
    })
}

fn demo_status(up: &Gitplane, host: &NetnsHost) -> Result<Value> {
    let app = up.get(host, "/apis/gitplane.io/v1/namespaces/gitplane-system/applications/demo")?;
    Ok(app["status"]["sync"].clone())
}

async fn sandboxes(socket: &std::path::Path) -> Result<usize> {
    let cri = Cri::connect(socket).await?;
    let list = cri.runtime().list_pod_sandbox(pb::ListPodSandboxRequest::default()).await?.into_inner();
    Ok(list.items.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t60_push_to_running() -> Result<()> {
    require_root()?;
    let host = netns_host("gp60")?;
    let up = Gitplane::up(&host, "node-1")?;

    // The demo repository that `up` made runs its two web Pods.
    wait_running(&up, &host, "web", 2)?;

    // A push replaces the demo with a Deployment of 2 replicas.
    let work = Worktree::clone(up.demo_repo(), host.dir().join("work"))?;
    work.remove("web.yaml")?;
    work.write("deploy.yaml", &deployment("2"))?;
    work.write("service.yaml", SERVICE)?;
    let pushed = Instant::now();
    work.commit_and_push("hello: 2 replicas")?;
    let running = wait_running(&up, &host, "hello", 2)?;
    println!("push-to-Running for 2 Pods: {:?}", pushed.elapsed());
    let ips: std::collections::HashSet<&str> = running.iter().map(|(_, ip)| ip.as_str()).collect();
    ensure!(ips.len() == 2, "pod IPs are not distinct: {running:?}");
    for (name, ip) in &running {
        let addr = SocketAddr::new(ip.parse::<IpAddr>()?, 80);
        let page = wait_for(DEADLINE, || host.http_get(addr, "/", Duration::from_secs(2)).ok())
            .with_context(|| format!("pod {name} at {addr} never answered"))?;
        ensure!(page.contains("gitplane httpd"), "unexpected page from {name}: {page}");
    }
    // kubectl reads the same state through the status API.
    let kubectl =
        host.command("kubectl").args(["--server", "http://127.0.0.1:8080", "get", "pods", "-o", "name"]).output()?;
    let listed = String::from_utf8_lossy(&kubectl.stdout);
    ensure!(
        running.iter().all(|(name, _)| listed.contains(&format!("pod/{name}"))),
        "kubectl get pods: {listed}{}",
        String::from_utf8_lossy(&kubectl.stderr)
    );
    // The kubeconfig `up` wrote (and printed) works too; a wrong token is refused even on
    // loopback, where no token at all reads.
    let kubeconfig = up.data_dir.join("kubeconfig");
    ensure!(up.log_text().contains(&format!("kubeconfig: {}", kubeconfig.display())), "the banner names no kubeconfig");
    let with_config =
        host.command("kubectl").arg("--kubeconfig").arg(&kubeconfig).args(["get", "pods", "-o", "name"]).output()?;
    ensure!(
        with_config.stdout == kubectl.stdout,
        "kubectl --kubeconfig: {}",
        String::from_utf8_lossy(&with_config.stderr)
    );
    // (kubectl sends no token over cleartext, so curl shows the refusal.)
    let wrong = host
        .command("curl")
        .args([
            "-sS",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-H",
            "Authorization: Bearer not-a-token-of-this-cluster",
        ])
        .arg("http://127.0.0.1:8080/api/v1/pods")
        .output()?;
    ensure!(wrong.stdout == b"401", "a wrong token on loopback: {wrong:?}");
    // And the Pods' logs, from the embedded node's kubelet endpoint on loopback.
    let logs = host.command("kubectl").args(["--server", "http://127.0.0.1:8080", "logs", &running[0].0]).output()?;
    ensure!(logs.status.success(), "kubectl logs {}: {}", running[0].0, String::from_utf8_lossy(&logs.stderr));
    let synced = demo_status(&up, &host)?;
    ensure!(synced["status"] == "Synced", "status after a good push: {synced}");

    // Scaling down to one keeps one of them.
    work.write("deploy.yaml", &deployment("1"))?;
    work.commit_and_push("hello: 1 replica")?;
    let one = wait_running(&up, &host, "hello", 1)?;
    ensure!(running.iter().any(|(name, _)| *name == one[0].0), "scaling down replaced the pod");
    let good = demo_status(&up, &host)?["revision"].clone();

    // An invalid commit is rejected whole, with file and path, and nothing changes.
    work.write("deploy.yaml", &deployment("\"two\""))?;
    work.write("service.yaml", &SERVICE.replace("port: 80", "port: 81"))?;
    work.commit_and_push("hello: invalid replicas")?;
    let failed = wait_for(DEADLINE, || demo_status(&up, &host).ok().filter(|s| s["status"] == "Failed"))
        .with_context(|| format!("the invalid commit was not reported\n{}", up.log_text()))?;
    let errors = failed["errors"].to_string();
    ensure!(errors.contains("deploy.yaml") && errors.contains("/spec/replicas"), "errors: {errors}");
    ensure!(failed["revision"] == good, "the last good revision must stay: {failed}");
    ensure!(up.log_text().contains("/spec/replicas"), "the rejection is not on stderr");
    let service = up.get(&host, "/api/v1/namespaces/default/services/hello")?;
    ensure!(service["spec"]["ports"][0]["port"] == 80, "part of a rejected commit was applied: {service}");
    let still = pods(&up, &host)?;
    ensure!(still.len() == 1 && still[0].0 == one[0].0 && still[0].1 == "Running", "pods changed: {still:?}");

    // Removing the manifest removes the Pods and their sandboxes.
    work.remove("deploy.yaml")?;
    work.write("service.yaml", SERVICE)?;
    work.commit_and_push("hello: removed")?;
    wait_for(DEADLINE, || pods(&up, &host).ok().filter(|p| p.is_empty()))
        .with_context(|| format!("pods remain: {:?}", pods(&up, &host).ok()))?;
    let socket = up.data_dir.join("containerd/containerd.sock");
    let deadline = Instant::now() + DEADLINE;
    while sandboxes(&socket).await? > 0 {
        ensure!(Instant::now() < deadline, "sandboxes remain in containerd\n{}", up.log_text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A Job runs once to completion, and the Application (now just the Job) turns Healthy.
    work.remove("service.yaml")?;
    work.write("job.yaml", JOB)?;
    work.commit_and_push("migrate: a Job")?;
    let job = wait_for(DEADLINE, || {
        let job = up.get(&host, "/apis/batch/v1/namespaces/default/jobs/migrate").ok()?;
        let conditions = job["status"]["conditions"].as_array()?.clone();
        conditions.iter().any(|c| c["type"] == "Complete" && c["status"] == "True").then_some(job)
    })
    .with_context(|| format!("the Job did not complete: {:?}\n{}", pods(&up, &host).ok(), up.log_text()))?;
    ensure!(job["status"]["succeeded"] == 1 && job["status"]["failed"] == 0, "job status: {}", job["status"]);
    let health = wait_for(DEADLINE, || {
        let app = up.get(&host, "/apis/gitplane.io/v1/namespaces/gitplane-system/applications/demo").ok()?;
        (app["status"]["health"]["status"] == "Healthy").then_some(())
    });
    health.with_context(|| "the demo Application did not turn Healthy after its Job completed".to_owned())?;
    let kubectl = host.command("kubectl").args(["--server", "http://127.0.0.1:8080", "get", "jobs"]).output()?;
    let listed = String::from_utf8_lossy(&kubectl.stdout);
    ensure!(
        listed.contains("migrate") && listed.contains("Complete") && listed.contains("1/1"),
        "kubectl get jobs: {listed}"
    );

    // Ctrl-C (SIGTERM) stops gitplane cleanly.
    let status = up.stop(DEADLINE)?;
    ensure!(status.success(), "gitplane up exited with {status}");
    Ok(())
}
