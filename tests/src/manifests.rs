//! Manifests the tests push, as a user writes them: Deployments and Pods of the demo image, and
//! Applications of hosted repositories.

/// One container `web` of the demo image, in YAML's flow style.
const CONTAINERS: &str = "[{name: web, image: gitplane.local/httpd:1, imagePullPolicy: IfNotPresent}]";

/// A Deployment `name` of `replicas` Pods of the demo image (container `web`), its Pods labelled
/// and selected by `app: <name>`.
pub fn deployment(name: &str, replicas: u32) -> String {
    format!(
        "apiVersion: apps/v1
kind: Deployment
metadata:
  name: {name}
  labels: {{app: {name}}}
spec:
  replicas: {replicas}
  selector:
    matchLabels: {{app: {name}}}
  template:
    metadata:
      labels: {{app: {name}}}
    spec:
      containers: {CONTAINERS}
"
    )
}

/// A bare Pod `name` of the demo image (container `web`), labelled `app: <name>`.
pub fn pod(name: &str) -> String {
    format!(
        "apiVersion: v1
kind: Pod
metadata:
  name: {name}
  labels: {{app: {name}}}
spec:
  containers: {CONTAINERS}
"
    )
}

/// A bare Pod `name` whose container `main` (the demo image) runs `script` with busybox's
/// `sh -c`, and is killed a second after it is asked to stop.
pub fn shell_pod(name: &str, script: &str) -> String {
    format!(
        "apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: gitplane.local/httpd:1
    command: [/bin/busybox, sh, -c, {script:?}]
"
    )
}

/// An Application `name` in `gitplane-system` that applies hosted repository `repo` into the
/// namespace `default`.
pub fn application(name: &str, repo: &str) -> String {
    format!(
        "apiVersion: gitplane.io/v1
kind: Application
metadata:
  name: {name}
  namespace: gitplane-system
spec:
  repo: {repo}
  namespace: default
"
    )
}
