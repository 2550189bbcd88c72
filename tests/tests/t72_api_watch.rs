//! WATCH and field selectors on the status API, through the clients people use: real `kubectl`
//! (`get -w`, `get NAME -w`, `rollout status`, `wait`, `--field-selector`) and Debian's Python
//! `kubernetes` client (list, and a watch that sees a push made while it runs), against a real
//! `gitplane server` fed by real git pushes. No nodes: Deployments, ReplicaSets and (Pending)
//! Pods are all the control plane makes on its own, which is what these reads need.

use anyhow::{Context, Result, ensure};
use gitplane_e2e::{
    Worktree,
    cluster::{Cluster, READ_TOKEN},
    manifests, wait_for,
};
use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::Duration,
};

const DEADLINE: Duration = Duration::from_secs(120);

/// A client process running for the length of the test, its output in files; killed (by its
/// PID) when dropped, also when the test fails.
struct Running {
    child: Child,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl Running {
    fn start(command: &mut Command, dir: &Path, name: &str) -> Result<Running> {
        let (stdout, stderr) = (dir.join(format!("{name}.out")), dir.join(format!("{name}.err")));
        let child = command
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout)?)
            .stderr(std::fs::File::create(&stderr)?)
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        Ok(Running { child, stdout, stderr })
    }

    fn out(&self) -> String {
        std::fs::read_to_string(&self.stdout).unwrap_or_default()
    }

    fn err(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Waits for the process to exit on its own.
    fn finished(&mut self, timeout: Duration) -> Result<std::process::ExitStatus> {
        wait_for(timeout, || self.child.try_wait().ok().flatten())
            .with_context(|| format!("still running\nstdout: {}\nstderr: {}", self.out(), self.err()))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// kubectl with the kubeconfig the replica wrote (HTTPS with the cluster CA and a read token).
fn kubectl(kubeconfig: &str) -> Command {
    let mut command = Command::new("kubectl");
    command.args(["--kubeconfig", kubeconfig, "--request-timeout", "0", "-n", "default"]);
    command
}

fn run(command: &mut Command) -> Result<Output> {
    command.output().context("running kubectl")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

const PYTHON_WATCH: &str = r#"
import sys
from kubernetes import client, watch
configuration = client.Configuration()
configuration.host = sys.argv[1]
configuration.ssl_ca_cert = sys.argv[2]
configuration.api_key = {"authorization": "Bearer " + sys.argv[3]}
v1 = client.CoreV1Api(client.ApiClient(configuration))
pods = v1.list_namespaced_pod("default")
print("LIST", pods.metadata.resource_version, " ".join(sorted(p.metadata.name for p in pods.items)), flush=True)
w = watch.Watch()
for event in w.stream(v1.list_namespaced_pod, "default", resource_version=pods.metadata.resource_version, timeout_seconds=300):
    print(event["type"], event["object"].metadata.name, flush=True)
    if event["object"].metadata.name.startswith("late-"):
        w.stop()
print("DONE", flush=True)
"#;

#[test]
fn t72_watch_and_field_selectors_through_kubectl_and_the_python_client() -> Result<()> {
    let cluster = Cluster::start(1, &["--bootstrap", "bootstrap"])?;
    cluster.leader(DEADLINE)?;
    let addr = cluster.addrs[&1];
    let dir = cluster.dir.path();
    let server = dir.join("replica-1/kubeconfig").to_string_lossy().into_owned();
    let https = format!("https://{addr}");
    let ca = dir.join("replica-1/ca.crt").to_string_lossy().into_owned();
    let token = std::fs::read_to_string(dir.join("replica-1/git-token"))?.trim().to_owned();
    let git = |repo: &str| format!("http://git:{token}@{addr}/git/{repo}.git");
    wait_for(DEADLINE, || dir.join("repos/bootstrap.git/HEAD").exists().then_some(()))
        .context("the bootstrap repository")?;
    let apps = Worktree::clone(git("bootstrap"), dir.join("apps"))?;
    apps.write("watched.yaml", &manifests::application("watched", "watched"))?;
    apps.commit("the watched Application")?;
    apps.push(&git("bootstrap"))?;
    wait_for(DEADLINE, || dir.join("repos/watched.git/HEAD").exists().then_some(()))
        .with_context(|| format!("the watched repository is made\n{}", cluster.logs()))?;
    let work = wait_for(DEADLINE, || Worktree::clone(git("watched"), dir.join("watched")).ok())
        .context("cloning the watched repository")?;

    // `kubectl get pods -w` (Table rows in watch events) sees the objects of a later push.
    // (Listed or watched, the first push's Pods show; the second push's can only come by watch.)
    let pods = Running::start(kubectl(&server).args(["get", "pods", "-w"]), dir, "pods-w")?;
    work.write("web.yaml", &manifests::deployment("web", 2))?;
    work.write("idle.yaml", &manifests::deployment("idle", 0))?;
    work.commit("web and idle")?;
    work.push(&git("watched"))?;
    wait_for(DEADLINE, || pods.out().lines().filter(|l| l.starts_with("web-")).nth(1).map(|_| ()))
        .with_context(|| format!("kubectl get pods -w saw the pushed Pods\n{}\n{}", pods.out(), pods.err()))?;
    ensure!(pods.out().contains("Pending"), "the rows carry the Pods' status: {}", pods.out());

    // Field selectors: the ones Kubernetes supports filter, an unsupported one is a 400.
    let pending =
        run(kubectl(&server).args(["get", "pods", "--field-selector", "status.phase=Pending", "-o", "name"]))?;
    let listed = text(&pending.stdout);
    ensure!(pending.status.success() && listed.lines().count() >= 2, "Pending Pods: {listed}{}", text(&pending.stderr));
    ensure!(listed.lines().all(|l| l.starts_with("pod/web-")), "only Pending Pods: {listed}");
    let running =
        run(kubectl(&server).args(["get", "pods", "--field-selector", "status.phase=Running", "-o", "name"]))?;
    ensure!(
        running.status.success() && text(&running.stdout).trim().is_empty(),
        "no Pod runs without nodes: {}{}",
        text(&running.stdout),
        text(&running.stderr)
    );
    let named = run(kubectl(&server).args(["get", "deploy", "--field-selector", "metadata.name=idle", "-o", "name"]))?;
    ensure!(text(&named.stdout).trim() == "deployment.apps/idle", "by name: {}", text(&named.stdout));
    let unsupported = run(kubectl(&server).args(["get", "pods", "--field-selector", "spec.containers=x"]))?;
    let refused = text(&unsupported.stderr);
    ensure!(!unsupported.status.success(), "an unsupported field selector must fail: {}", text(&unsupported.stdout));
    ensure!(
        refused.contains("BadRequest") && refused.contains("field label not supported: spec.containers"),
        "the refusal names the field: {refused}"
    );

    // resourceVersionMatch on a list (`kubectl get --raw`): Exact is served at that revision,
    // NotOlderThan at one at least as new, and a match without a resourceVersion is invalid.
    let raw = |path: &str| -> Result<(bool, String, String)> {
        let out = run(kubectl(&server).args(["get", "--raw", path]))?;
        Ok((out.status.success(), text(&out.stdout), text(&out.stderr)))
    };
    let (_, listed, _) = raw("/apis/apps/v1/namespaces/default/deployments")?;
    let listed: serde_json::Value = serde_json::from_str(&listed)?;
    let at: i64 = listed["metadata"]["resourceVersion"].as_str().context("a resourceVersion")?.parse()?;
    let path = |rv: i64, matching: &str| {
        format!("/apis/apps/v1/namespaces/default/deployments?resourceVersion={rv}&resourceVersionMatch={matching}")
    };
    let (ok, exact, error) = raw(&path(at, "Exact"))?;
    let exact: serde_json::Value = serde_json::from_str(&exact).with_context(|| format!("Exact: {error}"))?;
    let served_at = exact["metadata"]["resourceVersion"].as_str().and_then(|v| v.parse::<i64>().ok());
    ensure!(ok && served_at == Some(at), "Exact at {at}: {exact}");
    ensure!(exact["items"] == listed["items"], "Exact at {at} lists what the list at {at} did: {exact}");
    let (ok, newer, error) = raw(&path(at, "NotOlderThan"))?;
    let newer: serde_json::Value = serde_json::from_str(&newer).with_context(|| format!("NotOlderThan: {error}"))?;
    let served: i64 = newer["metadata"]["resourceVersion"].as_str().unwrap_or_default().parse()?;
    ensure!(ok && served >= at, "NotOlderThan {at} was served at {served}");
    let (ok, _, refused) = raw("/apis/apps/v1/namespaces/default/deployments?resourceVersionMatch=Exact")?;
    ensure!(
        !ok && refused.contains("resourceVersionMatch is forbidden unless resourceVersion is provided"),
        "a match without a resourceVersion: {refused}"
    );

    // `rollout status` follows the Deployment with a watch to the end, without a watch error.
    let rollout = run(kubectl(&server).args(["rollout", "status", "deployment/idle", "--timeout=90s"]))?;
    ensure!(
        rollout.status.success() && text(&rollout.stdout).contains("successfully rolled out"),
        "rollout status: {}{}",
        text(&rollout.stdout),
        text(&rollout.stderr)
    );
    ensure!(
        !text(&rollout.stderr).to_lowercase().contains("watch"),
        "rollout status stderr: {}",
        text(&rollout.stderr)
    );

    // One object watched by name, `wait` and the Python client's watch, all across a push.
    let jsonpath = r#"jsonpath={.metadata.name} {.spec.replicas}{"\n"}"#;
    let deploy =
        Running::start(kubectl(&server).args(["get", "deploy", "web", "-w", "-o", jsonpath]), dir, "deploy-w")?;
    wait_for(DEADLINE, || deploy.out().contains("web 2").then_some(()))
        .with_context(|| format!("kubectl get deploy web -w: {}{}", deploy.out(), deploy.err()))?;
    let mut wait = Running::start(
        kubectl(&server).args(["wait", "--for=jsonpath={.status.replicas}=3", "deployment/web", "--timeout=110s"]),
        dir,
        "wait",
    )?;
    let mut python = Running::start(
        Command::new("/usr/bin/python3").args(["-c", PYTHON_WATCH, &https, &ca, READ_TOKEN]),
        dir,
        "python",
    )?;
    let listed = wait_for(DEADLINE, || python.out().lines().find(|l| l.starts_with("LIST")).map(str::to_owned))
        .with_context(|| format!("the Python client lists Pods: {}{}", python.out(), python.err()))?;
    ensure!(listed.matches(" web-").count() == 2, "the Python list: {listed}");

    work.write("web.yaml", &manifests::deployment("web", 3))?;
    work.write("late.yaml", &manifests::deployment("late", 1))?;
    work.commit("web scaled, late added")?;
    work.push(&git("watched"))?;

    ensure!(python.finished(DEADLINE)?.success(), "the Python watch: {}{}", python.out(), python.err());
    let events = python.out();
    ensure!(events.lines().any(|l| l.starts_with("ADDED late-")), "the Python watch saw the push: {events}");
    ensure!(
        events.matches("ADDED web-").count() <= 1,
        "a watch from the list's revision sends only what follows: {events}"
    );
    let status = wait.finished(DEADLINE)?;
    ensure!(status.success(), "kubectl wait: {}{}", wait.out(), wait.err());
    ensure!(!wait.err().to_lowercase().contains("watch"), "kubectl wait stderr: {}", wait.err());
    wait_for(DEADLINE, || deploy.out().contains("web 3").then_some(()))
        .with_context(|| format!("kubectl get deploy web -w saw the scale: {}{}", deploy.out(), deploy.err()))?;
    ensure!(!deploy.out().contains("idle"), "a watch by name shows that object only: {}", deploy.out());
    wait_for(DEADLINE, || pods.out().lines().any(|l| l.starts_with("late-")).then_some(()))
        .with_context(|| format!("kubectl get pods -w saw the second push: {}", pods.out()))?;
    for client in [&pods, &deploy] {
        ensure!(!client.err().to_lowercase().contains("error"), "watch stderr: {}", client.err());
    }
    Ok(())
}
