//! ServiceAccounts and the in-cluster API on `gitplane up --nodes 1`: every namespace has a
//! `default` ServiceAccount and the `kube-root-ca.crt` ConfigMap; the `kubernetes` Service sits
//! at the Service range's first address with the API server's address as its endpoint; every
//! container has `KUBERNETES_SERVICE_HOST`; a Pod's bound token, `ca.crt` and `namespace` are
//! mounted at `/var/run/secrets/kubernetes.io/serviceaccount`; with a Role and RoleBinding from
//! Git granting it, its token lists Pods at `https://kubernetes.default.svc`, reading Secrets is
//! 403 with kube-apiserver's message, removing the binding in Git makes the list 403 within
//! seconds, and the token file is replaced before it expires (tokens live 30 s here).
//!
//! The built-in image has no TLS client that completes a handshake with the replicas' listener
//! (busybox 1.35's `wget` gets alert 40, handshake_failure, from rustls), so the Pod proves
//! the path with cleartext (the listener's "HTTP request to an HTTPS server" 400 comes back
//! through the kubernetes Service), and the TLS requests are curl's on the host, against the
//! same listener as `kubernetes.default.svc`, with the Pod's own `ca.crt` and token read
//! through exec.

use anyhow::{Context, Result, ensure};
use gitplane_e2e::{LocalCluster, Worktree, require_root, wait_for};
use std::{process::Command, time::Duration};

const DEADLINE: Duration = Duration::from_secs(120);

const RBAC: &str = r#"apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: pod-reader
rules:
  - apiGroups: [""]
    resources: [pods]
    verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: reader-reads-pods
subjects:
  - kind: ServiceAccount
    name: reader
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: pod-reader
"#;

const POD: &str = r#"apiVersion: v1
kind: ServiceAccount
metadata:
  name: reader
---
apiVersion: v1
kind: Pod
metadata:
  name: client
  labels: {app: t96}
spec:
  serviceAccountName: reader
  terminationGracePeriodSeconds: 1
  containers:
    - name: main
      image: gitplane.local/httpd:1
      command: [/bin/busybox, sh, -c, "exec /bin/busybox sleep 100000"]
"#;

const MOUNT: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// curl of the API server on the host's loopback, as `kubernetes.default.svc` with `ca`: the
/// status code and the body.
fn curl(cluster: &LocalCluster, ca: &std::path::Path, token: &str, path: &str) -> Result<(u16, String)> {
    let port = cluster.listen.port();
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "-w", "\n%{http_code}", "--cacert"])
        .arg(ca)
        .args(["--resolve", &format!("kubernetes.default.svc:{port}:127.0.0.1")])
        .args(["-H", &format!("Authorization: Bearer {token}")])
        .arg(format!("https://kubernetes.default.svc:{port}{path}"))
        .output()
        .context("running curl")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    ensure!(out.status.success(), "curl {path}: {text} {}", String::from_utf8_lossy(&out.stderr));
    let (body, code) = text.rsplit_once('\n').context("curl's status code")?;
    Ok((code.trim().parse().unwrap_or(0), body.to_owned()))
}

#[test]
fn t96_service_accounts_and_the_in_cluster_api() -> Result<()> {
    require_root()?;
    let dir = tempfile::tempdir()?;
    let cluster = LocalCluster::up_with("gp96", 1, &["--service-account-max-token-expiration=30s"])?;

    // What the control plane makes in every namespace, and the kubernetes Service.
    for namespace in ["default", "kube-system"] {
        wait_for(DEADLINE, || {
            cluster
                .get(&format!("/api/v1/namespaces/{namespace}/serviceaccounts/default"))
                .ok()
                .filter(|a| a["kind"] == "ServiceAccount")
        })
        .with_context(|| format!("no default ServiceAccount in {namespace}\n{}", cluster.log_tail()))?;
    }
    let ca = wait_for(DEADLINE, || {
        let cm = cluster.get("/api/v1/namespaces/default/configmaps/kube-root-ca.crt").ok()?;
        cm["data"]["ca.crt"].as_str().map(str::to_owned)
    })
    .context("no kube-root-ca.crt ConfigMap")?;
    ensure!(ca.contains("BEGIN CERTIFICATE"), "ca.crt: {ca}");
    let service = wait_for(DEADLINE, || {
        cluster.get("/api/v1/namespaces/default/services/kubernetes").ok().filter(|s| s["kind"] == "Service")
    })
    .context("no kubernetes Service")?;
    ensure!(service["spec"]["clusterIP"] == "10.96.0.1", "{service}");
    ensure!(service["spec"]["ports"][0]["port"] == 443, "{service}");
    let slice = cluster.get("/apis/discovery.k8s.io/v1/namespaces/default/endpointslices/kubernetes")?;
    ensure!(
        slice["endpoints"][0]["addresses"][0] == "172.29.0.1"
            && slice["ports"][0]["port"] == u64::from(cluster.listen.port()),
        "the slice points at the API server where the nodes reach it: {slice}"
    );
    let table = cluster.get("/api/v1/namespaces/default/serviceaccounts?includeObject=None")?;
    ensure!(table["items"].as_array().is_some_and(|i| !i.is_empty()), "{table}");

    // A Pod with its own ServiceAccount, from Git.
    let work = Worktree::clone(cluster.demo_repo(), dir.path().join("demo"))?;
    work.remove("web.yaml")?;
    work.write("client.yaml", POD)?;
    work.write("rbac.yaml", RBAC)?;
    work.commit_and_push("a client of the API")?;
    let pod = wait_for(DEADLINE, || cluster.running_pods("app=t96").ok().and_then(|p| p.into_iter().next()))
        .with_context(|| format!("the client did not run\n{}", cluster.log_tail()))?;
    let env = cluster.exec(&pod.node, &pod.container, &["/bin/busybox", "env"])?;
    for expected in
        ["KUBERNETES_SERVICE_HOST=10.96.0.1", "KUBERNETES_SERVICE_PORT=443", "KUBERNETES_SERVICE_PORT_HTTPS=443"]
    {
        ensure!(env.lines().any(|l| l == expected), "{expected} is not in the environment:\n{env}");
    }

    // Through cluster DNS and the Service rules to the API server's listener, which answers
    // cleartext with a 400.
    let fetch = || {
        let script =
            "/bin/busybox timeout 10 /bin/busybox wget -O - http://kubernetes.default.svc:443/healthz 2>&1; true";
        cluster.exec(&pod.node, &pod.container, &["/bin/busybox", "sh", "-c", script]).unwrap_or_else(|e| e.to_string())
    };
    wait_for(DEADLINE, || Some(fetch()).filter(|out| out.contains("400 Bad Request")))
        .with_context(|| format!("the Pod did not reach the API server: {}", fetch()))?;

    // The Pod's token, CA and namespace, mounted.
    let read =
        |file: &str| cluster.exec(&pod.node, &pod.container, &["/bin/busybox", "cat", &format!("{MOUNT}/{file}")]);
    let token = wait_for(DEADLINE, || read("token").ok().filter(|t| t.starts_with("eyJ")))
        .with_context(|| format!("no token mounted\n{}", cluster.log_tail()))?;
    ensure!(read("ca.crt")? == ca, "the mounted ca.crt is kube-root-ca.crt's");
    ensure!(read("namespace")? == "default", "the mounted namespace");

    // The Pod's token and CA: the CA verifies the API server as kubernetes.default.svc, the
    // token lists Pods as the RoleBinding allows, and Secrets are refused with kube-apiserver's
    // words.
    let ca_file = dir.path().join("ca.crt");
    std::fs::write(&ca_file, read("ca.crt")?)?;
    let pods = wait_for(DEADLINE, || {
        let (code, body) = curl(&cluster, &ca_file, &token, "/api/v1/namespaces/default/pods").ok()?;
        (code == 200).then_some(body)
    })
    .with_context(|| {
        format!(
            "listing Pods with the Pod's token and CA: {:?}",
            curl(&cluster, &ca_file, &token, "/api/v1/namespaces/default/pods")
        )
    })?;
    ensure!(pods.contains("\"PodList\"") && pods.contains("\"client\""), "the list holds the client: {pods}");
    let (code, body) = curl(&cluster, &ca_file, &token, "/api/v1/namespaces/default/secrets")?;
    let message = "secrets is forbidden: User \"system:serviceaccount:default:reader\" cannot list resource \"secrets\" \
                   in API group \"\" in the namespace \"default\"";
    let status: serde_json::Value = serde_json::from_str(&body).with_context(|| format!("not a Status: {body}"))?;
    ensure!(code == 403 && status["message"] == message, "listing Secrets: {code} {body}");
    let (code, _) = curl(&cluster, &ca_file, "eyJ.forged.token", "/api/v1/namespaces/default/pods")?;
    ensure!(code == 401, "a forged token: {code}");
    let audit = std::fs::read_to_string(cluster.data_dir.join("audit.log")).unwrap_or_default();
    ensure!(
        audit.lines().any(|l| l.contains("system:serviceaccount:default:reader")
            && l.contains("RoleBinding \\\"default/reader-reads-pods\\\"")),
        "the audit log names the binding that allowed the list"
    );

    // The token file is replaced before the token expires (30 s here, renewed at 80%).
    let renewed = wait_for(DEADLINE, || read("token").ok().filter(|t| t.starts_with("eyJ") && *t != token))
        .with_context(|| format!("the token was not renewed\n{}", cluster.log_tail()))?;
    let (code, _) = curl(&cluster, &ca_file, &renewed, "/api/v1/namespaces/default/pods")?;
    ensure!(code == 200, "the renewed token lists Pods: {code}");

    // Removing the binding in Git takes the right away within seconds.
    work.remove("rbac.yaml")?;
    work.commit_and_push("the reader may no longer read")?;
    let refused = wait_for(DEADLINE, || {
        let (code, body) = curl(&cluster, &ca_file, &renewed, "/api/v1/namespaces/default/pods").ok()?;
        (code == 403).then_some(body)
    })
    .context("the list was still allowed after the binding left Git")?;
    ensure!(refused.contains(r#"cannot list resource \"pods\""#), "{refused}");

    cluster.stop(Duration::from_secs(60))?;
    Ok(())
}
