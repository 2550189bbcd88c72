//! What kubectl reads about the server, with the real `kubectl` against a real `gitplane
//! server` on loopback that applied a pushed repository: `version`, `api-resources` (short
//! names, verbs, categories), `get all` and short names, `explain` (OpenAPI v3), `-o wide`
//! columns for several kinds, writes refused with 405 naming the Application and repository
//! that own the object, `/metrics`, the health endpoints, and a Kubernetes 404 Status for any
//! path nothing serves. Then readiness is truthful: a replica that lost its quorum answers
//! `/readyz` with 500 and names the failing check, while `/livez` stays ok.

use anyhow::{Context, Result, ensure};
use gitplane_e2e::{
    Worktree,
    cluster::{Cluster, READ_BEARER, loopback_get, loopback_request},
    manifests, wait_for,
};
use serde_json::Value;
use std::{process::Command, time::Duration};

const DEADLINE: Duration = Duration::from_secs(90);

const WORKLOADS: &str = r#"apiVersion: apps/v1
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
        - name: httpd
          image: gitplane.local/httpd:1
---
apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  selector:
    app: web
  ports:
    - port: 80
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
data:
  greeting: hello
---
apiVersion: batch/v1
kind: Job
metadata:
  name: migrate
spec:
  template:
    spec:
      restartPolicy: Never
      containers:
        - name: migrate
          image: gitplane.local/busybox:1
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: web-admission
webhooks:
  - name: validate.web.example.com
    admissionReviewVersions: [v1]
    sideEffects: None
    clientConfig:
      service: {name: web, namespace: default, port: 80}
"#;

/// The real kubectl with the replica's kubeconfig (HTTPS, the cluster CA, a read token), with
/// its own discovery cache.
struct Kubectl {
    kubeconfig: String,
    cache: tempfile::TempDir,
}

impl Kubectl {
    fn run(&self, args: &[&str]) -> Result<(bool, String, String)> {
        let out = Command::new("kubectl")
            .args(["--kubeconfig", &self.kubeconfig, "--cache-dir"])
            .arg(self.cache.path())
            .args(args)
            .output()
            .context("running kubectl (apt-get install kubectl)")?;
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        Ok((out.status.success(), text(&out.stdout), text(&out.stderr)))
    }

    /// A kubectl command that must succeed: its stdout.
    fn ok(&self, args: &[&str]) -> Result<String> {
        let (ok, stdout, stderr) = self.run(args)?;
        ensure!(ok, "kubectl {}: {stderr}{stdout}", args.join(" "));
        Ok(stdout)
    }
}

/// The whitespace-separated words of each line.
fn rows(text: &str) -> Vec<Vec<&str>> {
    text.lines().map(|l| l.split_whitespace().collect()).collect()
}

fn header_has(output: &str, columns: &[&str]) -> Result<()> {
    let header = output.lines().next().unwrap_or("");
    for column in columns {
        ensure!(header.contains(column), "no {column} column in:\n{output}");
    }
    Ok(())
}

#[test]
fn t73_kubectl_discovers_explains_and_prints_wide_tables() -> Result<()> {
    let cluster = Cluster::start(1, &["--bootstrap", "bootstrap"])?;
    cluster.leader(DEADLINE)?;
    let addr = cluster.addrs[&1];
    let token = std::fs::read_to_string(cluster.dir.path().join("replica-1/git-token"))?.trim().to_owned();
    let remote = |repo: &str| format!("http://git:{token}@{addr}/git/{repo}.git");
    let apps = wait_for(DEADLINE, || Worktree::clone(remote("bootstrap"), cluster.dir.path().join("apps")).ok())
        .context("cloning the bootstrap repository")?;
    apps.write("web.yaml", &manifests::application("web", "web"))?;
    apps.commit("the web Application")?;
    apps.push(&remote("bootstrap"))?;
    let web = wait_for(DEADLINE, || Worktree::clone(remote("web"), cluster.dir.path().join("web")).ok())
        .context("cloning the web repository")?;
    web.write("web.yaml", WORKLOADS)?;
    web.commit("web")?;
    web.push(&remote("web"))?;
    let pods = || -> Option<usize> {
        let list: Value = serde_json::from_str(&loopback_get(addr, "/api/v1/namespaces/default/pods").ok()?).ok()?;
        list["items"].as_array().map(Vec::len)
    };
    wait_for(DEADLINE, || pods().filter(|n| *n >= 3)).with_context(|| {
        format!("the Deployment's and the Job's Pods are created; {:?}\n{}", pods(), cluster.logs())
    })?;

    let kubeconfig = cluster.dir.path().join("replica-1/kubeconfig").to_string_lossy().into_owned();
    let kubectl = Kubectl { kubeconfig, cache: tempfile::tempdir()? };
    let version = kubectl.ok(&["version"])?;
    ensure!(version.contains("Server Version: v1.33.0-gitplane."), "kubectl version: {version}");

    // Short names, verbs and categories come from aggregated discovery.
    let resources = kubectl.ok(&["api-resources", "-o", "wide"])?;
    let table = rows(&resources);
    for (plural, short) in [
        ("pods", "po"),
        ("services", "svc"),
        ("endpoints", "ep"),
        ("configmaps", "cm"),
        ("namespaces", "ns"),
        ("nodes", "no"),
        ("events", "ev"),
        ("deployments", "deploy"),
        ("replicasets", "rs"),
    ] {
        let row =
            table.iter().find(|r| r.first() == Some(&plural)).with_context(|| format!("{plural}:\n{resources}"))?;
        ensure!(row.get(1) == Some(&short), "{plural} has short name {short}: {row:?}");
        ensure!(row.contains(&"get,list,watch"), "{plural} verbs: {row:?}");
    }
    let category = |plural: &str| table.iter().find(|r| r.first() == Some(&plural)).and_then(|r| r.last().copied());
    ensure!(category("pods") == Some("all"), "pods are in the all category:\n{resources}");
    ensure!(category("configmaps") == Some("get,list,watch"), "configmaps are in no category:\n{resources}");

    let all = kubectl.ok(&["get", "all", "-n", "default"])?;
    for name in ["pod/web-", "service/web", "deployment.apps/web", "replicaset.apps/web-", "job.batch/migrate"] {
        ensure!(all.contains(name), "kubectl get all lists {name}:\n{all}");
    }
    let short = kubectl.ok(&["get", "po,svc,deploy,rs", "-n", "default"])?;
    ensure!(short.contains("pod/web-") && short.contains("deployment.apps/web"), "short names:\n{short}");
    let more = kubectl.ok(&["get", "cm,ns,no,ev", "-A"])?;
    ensure!(more.contains("configmap/settings") && more.contains("namespace/default"), "cm,ns,no,ev:\n{more}");
    // Stored and served, though gitplane calls no admission webhooks.
    let webhooks = kubectl.ok(&["get", "validatingwebhookconfigurations"])?;
    header_has(&webhooks, &["NAME", "WEBHOOKS", "AGE"])?;
    ensure!(
        rows(&webhooks).iter().any(|r| r.starts_with(&["web-admission", "1"])),
        "webhook configurations:\n{webhooks}"
    );

    // Every write answers 405 naming what owns the object: its Application and repository,
    // up the controller chain for a Pod, or that nothing in Git owns it.
    let refused = |args: &[&str], wanted: &[&str]| -> Result<()> {
        let (ok, stdout, stderr) = kubectl.run(args)?;
        ensure!(!ok && stderr.contains("(MethodNotAllowed)"), "kubectl {}: {stdout}{stderr}", args.join(" "));
        for part in wanted {
            ensure!(stderr.contains(part), "kubectl {}: no {part:?} in {stderr}", args.join(" "));
        }
        Ok(())
    };
    let owned = "applied from Git by Application gitplane-system/web (repository web, branch main)";
    refused(&["delete", "configmap", "settings", "-n", "default"], &["ConfigMap default/settings is", owned])?;
    refused(&["scale", "deployment", "web", "-n", "default", "--replicas=5"], &["Deployment default/web is", owned])?;
    let pod =
        kubectl.ok(&["get", "pods", "-n", "default", "-l", "app=web", "-o", "jsonpath={.items[0].metadata.name}"])?;
    refused(
        &["delete", "pod", &pod, "-n", "default"],
        &[
            &format!("Pod default/{pod} is made by ReplicaSet web-"),
            ", which is made by Deployment web, which is",
            owned,
        ],
    )?;
    refused(&["label", "namespace", "default", "x=y"], &["nothing in Git owns Namespace default"])?;

    // explain reads the OpenAPI v3 documents.
    let replicas = kubectl.ok(&["explain", "deployment.spec.replicas"])?;
    ensure!(replicas.contains("Number of desired pods") && replicas.contains("<integer>"), "explain: {replicas}");
    let pods_doc = kubectl.ok(&["explain", "pods"])?;
    ensure!(pods_doc.contains("KIND:       Pod") && pods_doc.contains("spec\t<PodSpec>"), "explain pods: {pods_doc}");
    let app = kubectl.ok(&["explain", "application.spec.repo"])?;
    ensure!(app.contains("gitplane.io") && app.contains("hosted repository"), "explain application: {app}");

    // -o wide adds the priority-1 columns, as against Kubernetes.
    let wide = kubectl.ok(&["get", "pods", "-n", "default", "-o", "wide"])?;
    header_has(
        &wide,
        &["NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE", "NOMINATED NODE", "READINESS GATES"],
    )?;
    let narrow = kubectl.ok(&["get", "pods", "-n", "default"])?;
    ensure!(
        !narrow.lines().next().unwrap_or("").contains("NOMINATED NODE"),
        "wide columns only with -o wide:\n{narrow}"
    );
    let deployments = kubectl.ok(&["get", "deploy", "-n", "default", "-o", "wide"])?;
    header_has(&deployments, &["READY", "UP-TO-DATE", "AVAILABLE", "CONTAINERS", "IMAGES", "SELECTOR"])?;
    ensure!(deployments.contains("gitplane.local/httpd:1") && deployments.contains("app=web"), "{deployments}");
    let services = kubectl.ok(&["get", "svc", "web", "-n", "default", "-o", "wide"])?;
    header_has(&services, &["TYPE", "CLUSTER-IP", "EXTERNAL-IP", "PORT(S)", "SELECTOR"])?;
    ensure!(services.contains("80/TCP") && services.contains("app=web"), "{services}");
    // --sort-by sorts on each row's whole object (includeObject=Object), not its metadata.
    let sorted = kubectl.ok(&["get", "deploy", "-n", "default", "--sort-by=.spec.replicas"])?;
    ensure!(rows(&sorted).iter().any(|r| r.first() == Some(&"web")), "get --sort-by:\n{sorted}");
    let jobs = kubectl.ok(&["get", "jobs", "-n", "default", "-o", "wide"])?;
    header_has(&jobs, &["STATUS", "COMPLETIONS", "DURATION", "CONTAINERS", "IMAGES", "SELECTOR"])?;
    let cms = kubectl.ok(&["get", "cm", "settings", "-n", "default"])?;
    ensure!(rows(&cms).get(1).is_some_and(|r| r.get(1) == Some(&"1")), "a ConfigMap's DATA count:\n{cms}");
    let events = kubectl.ok(&["get", "events", "-A", "-o", "wide"])?;
    ensure!(events.is_empty() || events.lines().next().unwrap_or("").contains("SOURCE"), "{events}");

    // Health, and 404 with a Status for what nothing serves.
    let ready = kubectl.ok(&["get", "--raw", "/readyz?verbose"])?;
    ensure!(ready.contains("[+]leader ok") && ready.ends_with("readyz check passed\n"), "readyz: {ready}");
    ensure!(kubectl.ok(&["get", "--raw", "/livez"])? == "ok", "livez");
    let metrics = kubectl.ok(&["get", "--raw", "/metrics"])?;
    ensure!(metrics.contains("# TYPE apiserver_request_total counter"), "/metrics: {metrics}");
    for path in ["/openapi/v9", "/no/such/path", "/apis/widgets.example.com", "/readyz/etcd"] {
        let (code, body) = loopback_request(addr, "GET", path, &[READ_BEARER], b"")?;
        ensure!(code == 404, "{path}: {code} {body}");
        if !path.starts_with("/readyz") {
            let status: Value = serde_json::from_str(&body).with_context(|| format!("{path}: {body}"))?;
            ensure!(status["kind"] == "Status" && status["code"] == 404, "{path}: {body}");
        }
    }
    Ok(())
}

#[test]
fn t73_readyz_fails_on_a_replica_without_a_quorum() -> Result<()> {
    let mut cluster = Cluster::start(3, &[])?;
    let leader = cluster.leader(DEADLINE)?;
    let readyz = |cluster: &Cluster, id: u64| loopback_request(cluster.addrs[&id], "GET", "/readyz?verbose", &[], b"");
    for id in 1..=3 {
        wait_for(DEADLINE, || readyz(&cluster, id).ok().filter(|(code, _)| *code == 200))
            .with_context(|| format!("replica {id} ready: {:?}", readyz(&cluster, id)))?;
    }
    // Two of three gone: the one left can neither lead nor follow a leader.
    let survivor = (1..=3).find(|id| *id != leader).context("a follower")?;
    for id in (1..=3).filter(|id| *id != survivor) {
        cluster.kill(id)?;
    }
    let (_, body) = wait_for(DEADLINE, || readyz(&cluster, survivor).ok().filter(|(code, _)| *code == 500))
        .with_context(|| format!("replica {survivor} not ready: {:?}", readyz(&cluster, survivor)))?;
    ensure!(body.contains("[-]leader failed") && body.ends_with("readyz check failed\n"), "{body}");
    let (code, one) = loopback_request(cluster.addrs[&survivor], "GET", "/readyz/leader", &[], b"")?;
    ensure!(code == 500 && one.contains("internal server error"), "{code} {one}");
    let (code, live) = loopback_request(cluster.addrs[&survivor], "GET", "/livez", &[], b"")?;
    ensure!(code == 200 && live == "ok", "a replica without a quorum is still live: {code} {live}");
    Ok(())
}
