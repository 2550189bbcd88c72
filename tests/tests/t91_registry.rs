//! Images pulled from real registries, on the real `gitplane up --nodes 1 --registries FILE`:
//! a Deployment exactly as published (`registry.k8s.io/nginx-slim:0.8`) runs the stand-in the
//! node pulled through its mirror, and an image the registry lacks fails with ErrImagePull and
//! the registry's reason. A registry that requires a password (htpasswd): a Pod whose
//! imagePullSecrets hold it runs, and so does one naming none whose ServiceAccount's hold it;
//! one whose pull Secret does not exist gets a warning Event, pulls without it and fails with
//! ErrImagePull and the registry's 401.

use anyhow::{Context, Result, ensure};
use gitplane_e2e::{LocalCluster, RunningPod, Worktree, require_root, wait_for};
use gitplane_testkit::registry::{self, Credentials, Registry, StandIn};
use serde_json::Value;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(120);

/// As published (the Kubernetes documentation's nginx-slim).
const NGINX: &str = "apiVersion: apps/v1
kind: Deployment
metadata:
  name: nginx
  labels:
    app: nginx
spec:
  replicas: 1
  selector:
    matchLabels:
      app: nginx
  template:
    metadata:
      labels:
        app: nginx
    spec:
      containers:
      - name: nginx
        image: registry.k8s.io/nginx-slim:0.8
        ports:
        - containerPort: 80
          name: web
";

fn pod_pulling(name: &str, image: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  terminationGracePeriodSeconds: 1\n  \
         containers:\n    - name: app\n      image: {image}\n"
    )
}

/// A pull Secret for `registry`, a ServiceAccount naming it, and three Pods of its private image:
/// one with the Secret, one of the ServiceAccount without pull Secrets of its own, one whose
/// pull Secret does not exist.
fn private_pods(registry: &str) -> String {
    let config = format!(r#"{{"auths": {{"{registry}": {{"username": "alice", "password": "s3cret"}}}}}}"#);
    // Always: an image another Pod pulled is on the node, and IfNotPresent would not ask.
    let pod = |name: &str, pulls_with: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  labels:\n    app: {name}\nspec:\n  \
             {pulls_with}\n  containers:\n    - name: app\n      \
             image: {registry}/private/app:1\n      imagePullPolicy: Always\n"
        )
    };
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: regcred\ntype: kubernetes.io/dockerconfigjson\n\
         stringData:\n  .dockerconfigjson: '{config}'\n---\napiVersion: v1\nkind: ServiceAccount\nmetadata:\n  \
         name: puller\nimagePullSecrets:\n  - name: regcred\n---\n{}---\n{}---\n{}",
        pod("private", "imagePullSecrets: [{name: regcred}]"),
        pod("inherits", "serviceAccountName: puller"),
        pod("stranger", "imagePullSecrets: [{name: absent}]")
    )
}

fn one_running(cluster: &LocalCluster, app: &str) -> Option<RunningPod> {
    cluster.running_pods(&format!("app={app}")).ok()?.into_iter().next()
}

fn pod(cluster: &LocalCluster, name: &str) -> Result<Value> {
    cluster.get(&format!("/api/v1/namespaces/default/pods/{name}"))
}

/// The reason and message of a Pod's waiting container, once its message contains `needle`.
fn waiting_with(cluster: &LocalCluster, name: &str, needle: &str) -> Result<(String, String)> {
    wait_for(DEADLINE, || {
        let state = pod(cluster, name).ok()?["status"]["containerStatuses"][0]["state"]["waiting"].clone();
        let message = state["message"].as_str()?;
        message.contains(needle).then(|| (state["reason"].as_str().unwrap_or_default().to_owned(), message.to_owned()))
    })
    .with_context(|| format!("{name} never waited with {needle:?}: {:?}", pod(cluster, name)))
}

#[test]
fn t91_published_images_come_from_the_registry() -> Result<()> {
    require_root()?;
    let dir = tempfile::tempdir()?;
    let mirror = registry::address(5000);
    let private = registry::address(5001);
    let file = registry::write_registries_file(dir.path(), mirror, &[mirror, private])?;
    let cluster = LocalCluster::up_with("gp91", 1, &["--registries", &file.to_string_lossy()])?;
    let registry = Registry::start(&dir.path().join("mirror"), &cluster, mirror, None)?;
    registry.push_stand_in("registry.k8s.io/nginx-slim:0.8", &StandIn::nginx())?;
    let alice = Credentials { username: "alice".into(), password: "s3cret".into() };
    let private_registry = Registry::start(&dir.path().join("private"), &cluster, private, Some(alice))?;
    private_registry.push_stand_in(&format!("{private}/private/app:1"), &StandIn::nginx())?;

    let work = Worktree::clone(cluster.demo_repo(), dir.path().join("demo"))?;
    work.remove("web.yaml")?;
    work.write("nginx.yaml", NGINX)?;
    work.write("missing.yaml", &pod_pulling("missing", &format!("{mirror}/missing/app:1")))?;
    work.write("private.yaml", &private_pods(&private.to_string()))?;
    work.commit_and_push("nginx-slim as published, an image the registry lacks, a private image")?;

    // The published manifest runs the stand-in, pulled through the mirror.
    let nginx = wait_for(DEADLINE, || one_running(&cluster, "nginx")).with_context(|| {
        format!(
            "nginx is not Running: {:?}\n{}\n{}",
            cluster.get("/api/v1/namespaces/default/pods"),
            registry.log(),
            cluster.log_tail()
        )
    })?;
    let page =
        gitplane_testkit::http_get_in(&cluster.netns(&nginx.node), (nginx.ip, 80).into(), "/", Duration::from_secs(5))?;
    ensure!(page.contains("Welcome to nginx!"), "nginx answered: {page}");

    // What the registry lacks: ErrImagePull with the registry's reason.
    let (reason, message) = waiting_with(&cluster, "missing", "not found")?;
    ensure!(reason == "ErrImagePull" || reason == "ImagePullBackOff", "missing waits with {reason}: {message}");
    println!("missing waits: {reason}: {message}");

    // imagePullSecrets: the Secret's credentials reach the registry.
    wait_for(DEADLINE, || one_running(&cluster, "private")).with_context(|| {
        format!("private is not Running: {:?}\n{}", pod(&cluster, "private"), private_registry.log())
    })?;
    // The ServiceAccount's imagePullSecrets, for a Pod that names none.
    wait_for(DEADLINE, || one_running(&cluster, "inherits")).with_context(|| {
        format!("inherits is not Running: {:?}\n{}", pod(&cluster, "inherits"), private_registry.log())
    })?;
    // A pull Secret that does not exist: a warning, then an anonymous pull the registry refuses.
    let (reason, message) = waiting_with(&cluster, "stranger", "401 Unauthorized")?;
    ensure!(reason == "ErrImagePull" || reason == "ImagePullBackOff", "stranger waits with {reason}: {message}");
    println!("stranger waits: {reason}: {message}");
    let warned = wait_for(DEADLINE, || {
        let events = cluster.get("/api/v1/namespaces/default/events").ok()?;
        events["items"].as_array()?.iter().find(|e| e["reason"] == "FailedToRetrieveImagePullSecret").cloned()
    })
    .context("no FailedToRetrieveImagePullSecret Event")?;
    ensure!(
        warned["type"] == "Warning"
            && warned["involvedObject"]["name"] == "stranger"
            && warned["message"].as_str().is_some_and(|m| m.contains("(absent)")),
        "the Event: {warned}"
    );

    drop((registry, private_registry));
    let status = cluster.stop(DEADLINE)?;
    ensure!(status.success(), "gitplane up --nodes exited with {status}");
    Ok(())
}
