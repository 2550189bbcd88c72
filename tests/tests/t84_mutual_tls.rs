//! Certificates instead of bearer credentials, on the real `gitplane up --nodes 1`: the agent
//! joins over TLS and gets a client certificate and its kubelet endpoint's serving certificate
//! from the cluster CA (checked with the real `openssl`); the node keeps no bearer credential;
//! the kubelet endpoint serves the CA's certificate (`openssl s_client`) and answers only the
//! replicas; a client certificate of another CA is refused by the replica's node service and
//! peer (store, Raft) endpoints and by the kubelet endpoint, and a node's own certificate opens
//! neither the peer endpoints nor the kubelet endpoint; and the cluster works end to end after:
//! a Pod runs and `kubectl logs` reads it through the replica, which reaches the node over
//! mutual TLS. An agent that registered before certificates (a credential, no certificate)
//! trades its credential for certificates when started again; `gitplane secrets rotate` asks
//! the replica over HTTPS. Every request is made from the node's network namespace (`ip netns
//! exec`).

use anyhow::{Context, Result, ensure};
use gitplane_e2e::{LocalCluster, foreign_ca, require_root, stdout_of, wait_for};
use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

const DEADLINE: Duration = Duration::from_secs(120);

/// `curl` from the node's namespace: the gRPC status of a gRPC call (`grpc-<code>`), else the
/// HTTP code, or `handshake-refused` when the TLS handshake failed.
fn curl(node: &str, url: &str, grpc: bool, extra: &[&str]) -> Result<String> {
    let mut command = Command::new("ip");
    command.args(["netns", "exec", node, "curl", "-sS", "-o", "/dev/null", "-D", "-", "--max-time", "10"]);
    if grpc {
        let headers = ["-H", "content-type: application/grpc", "-H", "te: trailers", "--http2"];
        command.args(headers).args(["--data-binary", ""]);
    }
    let out = command.args(extra).arg(url).output()?;
    let headers = String::from_utf8_lossy(&out.stdout).to_lowercase();
    Ok(match out.status.code() {
        Some(0) => match headers.lines().find_map(|l| l.strip_prefix("grpc-status: ")) {
            Some(code) => {
                let message = headers.lines().find_map(|l| l.strip_prefix("grpc-message: ")).unwrap_or_default();
                format!("grpc-{} {}", code.trim(), message.trim())
            }
            None => headers.split(' ').nth(1).unwrap_or_default().to_owned(),
        },
        // 35: the handshake failed; 55 and 56: the server ended it as the client sent or read
        // (TLS 1.3 sends its alert about the client's certificate after the client finished).
        Some(35 | 55 | 56) => "handshake-refused".into(),
        other => format!("curl-exit-{other:?}: {}", String::from_utf8_lossy(&out.stderr)),
    })
}

/// `openssl x509` fields of the certificate in `file`.
fn x509(file: &Path, field: &str) -> Result<String> {
    let file = file.to_string_lossy();
    Ok(stdout_of(Command::new("openssl").args(["x509", "-noout", field, "-in", &file]))?.trim().to_owned())
}

#[test]
fn t84_nodes_and_replicas_authenticate_with_certificates() -> Result<()> {
    require_root()?;
    let cluster = LocalCluster::up("gp84", 1)?;
    let node = cluster.nodes[0].clone();
    let node_dir: PathBuf = cluster.data_dir.join("nodes").join(&node);
    let ca = cluster.data_dir.join("ca.crt");
    let ca_arg = ca.to_string_lossy().into_owned();

    // The agent joined over TLS and holds certificates signed for its key: the client one by
    // the cluster CA, the serving one by the kubelet CA, which no client of the control plane
    // trusts (a node serving it at a replica's address is refused).
    let client = node_dir.join("kubelet-client.pem");
    let serving = node_dir.join("kubelet-server.pem");
    let kubelet_ca = cluster.data_dir.join("kubelet-ca.crt");
    let kubelet_ca_arg = kubelet_ca.to_string_lossy().into_owned();
    for (file, issuer, ca_file) in
        [(&client, "gitplane cluster CA", &ca_arg), (&serving, "gitplane kubelet CA", &kubelet_ca_arg)]
    {
        // The Node is Ready once registered, a moment before the agent has the answer.
        let metadata = wait_for(DEADLINE, || std::fs::metadata(file).ok()).with_context(|| {
            let listed: Vec<_> =
                std::fs::read_dir(&node_dir).into_iter().flatten().flatten().map(|e| e.file_name()).collect();
            let agent = std::fs::read_to_string(node_dir.join("agent.log")).unwrap_or_default();
            format!("{}: {listed:?}\n{agent}", file.display())
        })?;
        let mode = std::os::unix::fs::PermissionsExt::mode(&metadata.permissions());
        ensure!(mode & 0o077 == 0, "{} holds a key: mode {mode:o}", file.display());
        ensure!(x509(file, "-issuer")? == format!("issuer=CN = {issuer}"), "{}", x509(file, "-issuer")?);
        let subject = x509(file, "-subject")?;
        let uid =
            cluster.get(&format!("/api/v1/nodes/{node}"))?["metadata"]["uid"].as_str().unwrap_or_default().to_owned();
        ensure!(subject == format!("subject=CN = system:node:{node}, O = system:nodes, UID = {uid}"), "{subject}");
        let verified = stdout_of(Command::new("openssl").args(["verify", "-CAfile", ca_file]).arg(file))?;
        ensure!(verified.trim().ends_with(": OK"), "{verified}");
    }
    let refused = Command::new("openssl").args(["verify", "-CAfile", &ca_arg]).arg(&serving).output()?;
    ensure!(!refused.status.success(), "the cluster CA verifies a node's serving certificate");
    ensure!(
        !node_dir.join("node-credential").exists(),
        "a node that joined over TLS keeps no bearer credential: its certificate replaces it"
    );

    // The kubelet endpoint serves the certificate the CA signed for the node's address.
    let node_object = cluster.get(&format!("/api/v1/nodes/{node}"))?;
    let ip = node_object["status"]["addresses"]
        .as_array()
        .and_then(|a| a.iter().find(|a| a["type"] == "InternalIP"))
        .and_then(|a| a["address"].as_str())
        .context("the node's InternalIP")?
        .to_owned();
    let kubelet = format!("{ip}:10250");
    let s_client = Command::new("ip")
        .args(["netns", "exec", &node, "timeout", "20", "openssl", "s_client", "-connect", &kubelet])
        .args(["-CAfile", &kubelet_ca_arg, "-verify_ip", &ip])
        .stdin(std::process::Stdio::null())
        .output()?;
    let shown = String::from_utf8_lossy(&s_client.stdout);
    ensure!(shown.contains("issuer=CN = gitplane kubelet CA"), "openssl s_client: {shown}");
    ensure!(shown.contains(&format!("subject=CN = system:node:{node}, O = system:nodes, UID = ")), "{shown}");
    ensure!(shown.contains("Verify return code: 0 (ok)"), "openssl s_client: {shown}");

    // Who is refused where.
    let port = cluster.listen.port();
    let replica = |path: &str| format!("https://172.29.0.1:{port}{path}");
    // Named as a replica would be, to show that names from another CA count for nothing.
    let foreign = foreign_ca(node_dir.parent().context("nodes dir")?, "/O=gitplane:replicas/CN=gitplane replica")?;
    let (other_crt, other_key) = (foreign.certificate.to_string_lossy(), foreign.key.to_string_lossy());
    let client_arg = client.to_string_lossy().into_owned();
    let other = ["--cacert", &ca_arg, "--cert", &other_crt, "--key", &other_key];
    let own = ["--cacert", &ca_arg, "--cert", &client_arg];
    // A kubelet endpoint is verified against the kubelet CA, as the replicas verify it.
    let other_at_kubelet = ["--cacert", &kubelet_ca_arg, "--cert", &other_crt, "--key", &other_key];
    let own_at_kubelet = ["--cacert", &kubelet_ca_arg, "--cert", &client_arg];
    let logs_path = format!("https://{kubelet}/stats/summary");
    let cells = [
        ("node service, another CA", curl(&node, &replica("/gitplane.node.v1.NodeService/Heartbeat"), true, &other)?),
        ("store service, another CA", curl(&node, &replica("/gitplane.store.v1.StoreService/Get"), true, &other)?),
        ("Raft service, another CA", curl(&node, &replica("/gitplane.store.v1.RaftService/Vote"), true, &other)?),
        ("kubelet endpoint, another CA", curl(&node, &logs_path, false, &other_at_kubelet)?),
        ("kubelet endpoint, no certificate", curl(&node, &logs_path, false, &["--cacert", &kubelet_ca_arg])?),
        ("kubelet endpoint, the node's own", curl(&node, &logs_path, false, &own_at_kubelet)?),
        ("store service, the node's own", curl(&node, &replica("/gitplane.store.v1.StoreService/Get"), true, &own)?),
        ("Raft service, the node's own", curl(&node, &replica("/gitplane.store.v1.RaftService/Vote"), true, &own)?),
    ];
    let table: String = cells.iter().map(|(who, got)| format!("{who:<36} {got}\n")).collect();
    let needs_replica = "grpc-16 the%20store%20and%20raft%20services%20over%20tls%20need%20a%20replica's%20client%20certificate%20from%20the%20cluster%20ca";
    let expected = format!(
        "\
node service, another CA             handshake-refused
store service, another CA            handshake-refused
Raft service, another CA             handshake-refused
kubelet endpoint, another CA         handshake-refused
kubelet endpoint, no certificate     handshake-refused
kubelet endpoint, the node's own     403
store service, the node's own        {needs_replica}
Raft service, the node's own         {needs_replica}
"
    );
    ensure!(table == expected, "who is refused where:\n{table}\nexpected:\n{expected}");

    // End to end: a Pod runs and its log is read through the replica, which calls the node's
    // kubelet endpoint over mutual TLS.
    let work_dir = tempfile::tempdir()?;
    gitplane_e2e::run_printing_pod(&cluster, work_dir.path(), "talker", "hello over mutual TLS")?;
    let summary = cluster.get("/apis/metrics.k8s.io/v1beta1/nodes");
    ensure!(summary.is_ok(), "metrics through the kubelet endpoint: {summary:?}");

    // Migration: an agent that registered before certificates holds a node credential and no
    // certificate, and its Node no mark of certificates issued over TLS (which this one has,
    // so it is taken off here). Started again, it registers with the credential and gets
    // certificates, which replace the credential, and its Node is marked again.
    let peer_token = std::fs::read_to_string(cluster.data_dir.join("peer-token"))?;
    ensure!(
        node_object["metadata"]["annotations"]["gitplane.io/client-certificates"] == "true",
        "a Node whose certificates were issued over TLS is marked: {node_object}"
    );
    let unmark = async {
        use gitplane_store::Store as _;
        let token = gitplane_storage::remote::PeerToken::new(peer_token.trim())?;
        let store = gitplane_storage::remote::RemoteStore::with_token(&[format!("http://{}", cluster.listen)], token)?;
        let key = gitplane_api::ObjectKey::new("Node", "", &node);
        // Compare-and-swap: the node writes its status meanwhile.
        for _ in 0..10 {
            let mut stored = store.get(&key).await?.context("the Node")?;
            let annotations = stored["metadata"]["annotations"].as_object_mut().context("annotations")?;
            annotations.remove("gitplane.io/client-certificates");
            match store.txn(vec![gitplane_store::Op::Update(stored)]).await {
                Err(e) if e.is_conflict() => continue,
                other => return other.map(drop).map_err(anyhow::Error::from),
            }
        }
        anyhow::bail!("the Node kept changing")
    };
    tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(unmark)?;
    let node_key = hmac(peer_token.trim().as_bytes(), b"gitplane node credential v1");
    let credential = format!("node:{node}:{}", hex::encode(hmac(&node_key, node.as_bytes())));
    let credential_file = node_dir.join("node-credential");
    std::fs::write(&credential_file, credential)?;
    std::fs::set_permissions(&credential_file, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    std::fs::remove_file(&client)?;
    std::fs::remove_file(&serving)?;
    let killed = cluster.agent_pid(&node).context("the agent's pid")?;
    // SAFETY: kill(2) on the agent process `gitplane up` (our child) runs for the node; it
    // starts the agent again.
    unsafe { libc::kill(killed, libc::SIGKILL) };
    wait_for(DEADLINE, || (client.exists() && serving.exists() && !credential_file.exists()).then_some(()))
        .with_context(|| format!("the restarted agent did not trade its credential:\n{}", cluster.log_text()))?;
    ensure!(cluster.agent_pid(&node).is_some_and(|pid| pid != killed));
    wait_for(DEADLINE, || cluster.kubectl_logs("talker").filter(|out| out.contains("hello over mutual TLS")))
        .context("kubectl logs talker after the agent's migration")?;

    // `gitplane secrets rotate` asks the replica over HTTPS, verified with the cluster CA.
    let data = cluster.data_dir.to_string_lossy().into_owned();
    let server = format!("172.29.0.1:{port}");
    let rotate = Command::new("ip")
        .args(["netns", "exec", &node])
        .arg(gitplane_e2e::binary("gitplane")?)
        .args(["secrets", "rotate", "--data-dir", &data, "--server", &server, "--wait-seconds", "60"])
        .output()?;
    let printed = String::from_utf8_lossy(&rotate.stdout);
    ensure!(
        rotate.status.success() && printed.contains("done: every Secret is encrypted"),
        "gitplane secrets rotate over HTTPS: {printed} {}",
        String::from_utf8_lossy(&rotate.stderr)
    );
    Ok(())
}

fn hmac(key: &[u8], message: &[u8]) -> Vec<u8> {
    use hmac::Mac as _;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(message);
    mac.finalize().into_bytes().to_vec()
}
