//! Certificate lifetime, on the real `gitplane up --nodes 1` with node certificates that last
//! 60 s (`GITPLANE_NODE_CERTIFICATE_SECONDS`, for tests only): the agent renews its client and
//! serving certificates while it runs (new serials, the Node's uid in the subject, checked with
//! the real `openssl`), its kubelet endpoint serves the renewed one, calls with the renewed
//! client certificate succeed, and the cluster keeps working without its Pod watch reconnecting
//! (a Pod pushed after the renewal runs and `kubectl logs` reads it). Then the node credential
//! is refused over TLS (the node holds certificates), and once the Node is deleted the node's
//! certificate is refused and the agent's streams end, so the Node does not come back.

use anyhow::{Context, Result, ensure};
use gitplane_api::ObjectKey;
use gitplane_e2e::{LocalCluster, require_root, stdout_of, wait_for};
use gitplane_storage::remote::{PeerToken, RemoteStore};
use gitplane_store::{Op, Store};
use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

const DEADLINE: Duration = Duration::from_secs(120);

/// `openssl x509` field of the (first) certificate in `file`.
fn x509(file: &Path, field: &str) -> Result<String> {
    let file = file.to_string_lossy();
    Ok(stdout_of(Command::new("openssl").args(["x509", "-noout", field, "-in", &file]))?.trim().to_owned())
}

/// The gRPC status (`grpc-<code> <message>`) of a `Heartbeat` for `node`, sent with `curl` from
/// the node's namespace with `extra` arguments (a certificate, a token).
fn heartbeat(node: &str, url: &str, dir: &Path, extra: &[&str]) -> Result<String> {
    // A gRPC frame: uncompressed, its length, then HeartbeatRequest { node_name: node }.
    let message = [&[0x0a, u8::try_from(node.len())?][..], node.as_bytes()].concat();
    let frame = [&[0u8, 0, 0, 0, u8::try_from(message.len())?][..], &message].concat();
    let body = dir.join("heartbeat.grpc");
    std::fs::write(&body, frame)?;
    let out = Command::new("ip")
        .args(["netns", "exec", node, "curl", "-sS", "-o", "/dev/null", "-D", "-", "--max-time", "10", "--http2"])
        .args(["-H", "content-type: application/grpc", "-H", "te: trailers"])
        .arg("--data-binary")
        .arg(format!("@{}", body.display()))
        .args(extra)
        .arg(url)
        .output()?;
    let headers = String::from_utf8_lossy(&out.stdout).to_lowercase();
    let code = headers.lines().find_map(|l| l.strip_prefix("grpc-status: ")).map(str::trim);
    let message = headers.lines().find_map(|l| l.strip_prefix("grpc-message: ")).unwrap_or_default();
    Ok(match code {
        Some(code) => format!("grpc-{code} {}", message.trim()),
        None => format!("no gRPC status ({:?}): {headers} {}", out.status, String::from_utf8_lossy(&out.stderr)),
    })
}

/// The PEM certificate the kubelet endpoint at `address` serves, seen from the node's namespace.
fn served_certificate(node: &str, address: &str, ca: &str) -> Option<String> {
    let out = Command::new("ip")
        .args(["netns", "exec", node, "timeout", "20", "openssl", "s_client", "-connect", address, "-CAfile", ca])
        .stdin(std::process::Stdio::null())
        .output()
        .ok()?;
    let shown = String::from_utf8_lossy(&out.stdout);
    let begin = shown.find("-----BEGIN CERTIFICATE-----")?;
    let end = shown[begin..].find("-----END CERTIFICATE-----")? + begin + "-----END CERTIFICATE-----".len();
    Some(shown[begin..end].to_owned())
}

fn first_certificate(file: &Path) -> Result<String> {
    let text = std::fs::read_to_string(file)?;
    let end = text.find("-----END CERTIFICATE-----").context("no certificate")? + "-----END CERTIFICATE-----".len();
    Ok(text[..end].trim().to_owned())
}

#[test]
fn t86_agents_renew_their_certificates_and_removed_nodes_are_refused() -> Result<()> {
    require_root()?;
    // SAFETY: this binary's only test sets it before it starts any thread; `gitplane up` (and
    // its agents) inherit it.
    unsafe { std::env::set_var("GITPLANE_NODE_CERTIFICATE_SECONDS", "60") };
    let cluster = LocalCluster::up("gp86", 1)?;
    let node = cluster.nodes[0].clone();
    let node_dir: PathBuf = cluster.data_dir.join("nodes").join(&node);
    let ca = cluster.data_dir.join("ca.crt").to_string_lossy().into_owned();
    let kubelet_ca = cluster.data_dir.join("kubelet-ca.crt").to_string_lossy().into_owned();
    let (client, serving) = (node_dir.join("kubelet-client.pem"), node_dir.join("kubelet-server.pem"));
    let agent_log = || std::fs::read_to_string(node_dir.join("agent.log")).unwrap_or_default();
    let serials =
        || -> Option<(String, String)> { Some((x509(&client, "-serial").ok()?, x509(&serving, "-serial").ok()?)) };
    let first = wait_for(DEADLINE, serials).with_context(|| format!("the node's certificates:\n{}", agent_log()))?;
    let first_serving = first_certificate(&serving)?;
    let node_object = cluster.get(&format!("/api/v1/nodes/{node}"))?;
    let uid = node_object["metadata"]["uid"].as_str().context("the Node's uid")?.to_owned();
    let ip = node_object["status"]["addresses"]
        .as_array()
        .and_then(|a| a.iter().find(|a| a["type"] == "InternalIP"))
        .and_then(|a| a["address"].as_str())
        .context("the node's InternalIP")?
        .to_owned();
    // The count from the agent's first Pod watch on: the node's certificates and its Node exist
    // before that watch has started.
    let watches_started = || cluster.log_text().matches("pod watch started").count();
    let watches = wait_for(DEADLINE, || Some(watches_started()).filter(|n| *n > 0))
        .with_context(|| format!("the agent's Pod watch never started:\n{}", cluster.log_text()))?;

    // Renewed while the agent runs (at 70-90% of 60 s): both certificates, for the same Node.
    let renewed = wait_for(Duration::from_secs(150), || serials().filter(|s| s.0 != first.0 && s.1 != first.1))
        .with_context(|| format!("the agent never renewed its certificates:\n{}", agent_log()))?;
    println!("renewed: {first:?} -> {renewed:?}");
    for (file, ca) in [(&client, &ca), (&serving, &kubelet_ca)] {
        let subject = x509(file, "-subject")?;
        ensure!(subject == format!("subject=CN = system:node:{node}, O = system:nodes, UID = {uid}"), "{subject}");
        let verified = stdout_of(Command::new("openssl").args(["verify", "-CAfile", ca]).arg(file))?;
        ensure!(verified.trim().ends_with(": OK"), "{verified}");
    }
    ensure!(agent_log().contains("node certificates renewed"), "{}", agent_log());

    // New handshakes get the renewed certificates: the kubelet endpoint serves one, and the
    // node service takes the renewed client certificate.
    let kubelet = format!("{ip}:10250");
    let served =
        wait_for(DEADLINE, || served_certificate(&node, &kubelet, &kubelet_ca).filter(|c| *c != first_serving))
            .context("the kubelet endpoint still serves its first certificate")?;
    ensure!(served.starts_with("-----BEGIN CERTIFICATE-----"));
    let url = format!("https://172.29.0.1:{}/gitplane.node.v1.NodeService/Heartbeat", cluster.listen.port());
    let client_arg = client.to_string_lossy().into_owned();
    let own = ["--cacert", &ca, "--cert", &client_arg];
    let tmp = tempfile::tempdir()?;
    let answer = heartbeat(&node, &url, tmp.path(), &own)?;
    ensure!(answer.starts_with("grpc-0"), "a heartbeat with the renewed client certificate: {answer}");

    // The node keeps working: a Pod pushed now runs, its log is read through the kubelet
    // endpoint, and the Pod watch never reconnected.
    gitplane_e2e::run_printing_pod(&cluster, tmp.path(), "renewed", "hello after renewal")?;
    ensure!(watches_started() == watches, "the Pod watch reconnected:\n{}", cluster.log_text());

    // The node credential no longer counts over TLS: the node holds certificates.
    let peer_token = std::fs::read_to_string(cluster.data_dir.join("peer-token"))?;
    let node_key = hmac(peer_token.trim().as_bytes(), b"gitplane node credential v1");
    let credential = format!("authorization: Bearer node:{node}:{}", hex::encode(hmac(&node_key, node.as_bytes())));
    let answer = heartbeat(&node, &url, tmp.path(), &["--cacert", &ca, "-H", &credential])?;
    ensure!(answer.starts_with("grpc-16 ") && answer.contains("no%20longer%20accepted%20over%20tls"), "{answer}");

    // Removed from the cluster: its certificate counts for nothing and its streams end.
    let delete = async {
        let token = PeerToken::new(peer_token.trim())?;
        let store = RemoteStore::with_token(&[format!("http://{}", cluster.listen)], token)?;
        store.txn(vec![Op::Delete { key: ObjectKey::new("Node", "", &node), revision: None }]).await?;
        anyhow::Ok(())
    };
    tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(delete)?;
    let answer = heartbeat(&node, &url, tmp.path(), &own)?;
    ensure!(answer.starts_with("grpc-16 ") && answer.contains("not%20part%20of%20the%20cluster"), "{answer}");
    wait_for(DEADLINE, || agent_log().contains("was removed from the cluster").then_some(()))
        .with_context(|| format!("the agent's streams did not end:\n{}", agent_log()))?;
    // Proving that something does not happen: nothing the agent still tries brings the Node back.
    std::thread::sleep(Duration::from_secs(5));
    ensure!(cluster.get(&format!("/api/v1/nodes/{node}")).is_err(), "the removed Node came back");
    let status = cluster.stop(DEADLINE)?;
    ensure!(status.success(), "gitplane up --nodes exited with {status}");
    Ok(())
}

fn hmac(key: &[u8], message: &[u8]) -> Vec<u8> {
    use hmac::Mac as _;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(key).expect("HMAC takes keys of any length");
    mac.update(message);
    mac.finalize().into_bytes().to_vec()
}
