//! Anonymous clients are bounded: for each way an anonymous caller could starve the others (one
//! test per class), the abuse runs against a real `gitplane server` while an authenticated or
//! ordinary client is still served within a bound. Abusers connect from 127.0.0.2 (a client
//! address of their own, as another host would be); the served client from 127.0.0.1.

use anyhow::{Context, Result, ensure};
use gitplane_e2e::{
    Worktree,
    cluster::{Cluster, READ_BEARER, loopback_get, loopback_request},
    wait_for,
};
use std::{
    net::{Ipv4Addr, SocketAddr},
    time::{Duration, Instant},
};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{TcpSocket, TcpStream},
};

const DEADLINE: Duration = Duration::from_secs(60);
/// What an ordinary request may take while the abuse goes on (generous for a loaded machine).
const SERVED_WITHIN: Duration = Duration::from_secs(5);
const ABUSER: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

async fn connect_from(source: Ipv4Addr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::from((source, 0)))?;
    socket.connect(to).await
}

/// An ordinary read from 127.0.0.1 answers, and within [`SERVED_WITHIN`].
fn served(addr: SocketAddr, what: &str) -> Result<()> {
    let started = Instant::now();
    let answer = loopback_get(addr, "/api/v1/namespaces").with_context(|| format!("an ordinary read {what}"))?;
    ensure!(answer.contains("NamespaceList"), "{what}: {answer}");
    ensure!(started.elapsed() < SERVED_WITHIN, "an ordinary read {what} took {:?}", started.elapsed());
    Ok(())
}

/// Whether the server has closed `stream` (EOF or reset), waiting at most `within`.
async fn closed(stream: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 1024];
    let read = async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => continue,
            }
        }
    };
    tokio::time::timeout(within, read).await.is_ok()
}

fn start() -> Result<Cluster> {
    gitplane_e2e::require_root()?;
    let cluster = Cluster::start(1, &[])?;
    cluster.leader(DEADLINE)?;
    Ok(cluster)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t30_huge_list_limits_are_clamped_and_hold_no_connection() -> Result<()> {
    let cluster = tokio::task::block_in_place(start)?;
    let addr = cluster.addrs[&1];
    let huge = "/api/v1/pods?limit=18446744073709551615";
    let abusers: Vec<_> = (0..8)
        .map(|_| tokio::task::spawn_blocking(move || loopback_request(addr, "GET", huge, &[READ_BEARER], b"")))
        .collect();
    tokio::task::block_in_place(|| served(addr, "during 8 lists with a huge limit"))?;
    for abuser in abusers {
        let (code, body) = abuser.await??;
        ensure!(code == 200 && body.contains("PodList"), "a huge limit is a page, not an error: {code} {body}");
    }
    for nonsense in ["-1", "1e3", "x", "99999999999999999999999"] {
        let (code, body) =
            loopback_request(addr, "GET", &format!("/api/v1/pods?limit={nonsense}"), &[READ_BEARER], b"")?;
        ensure!(code == 400 && body.contains("BadRequest"), "limit={nonsense}: {code} {body}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t30_connections_that_never_finish_their_headers_are_closed() -> Result<()> {
    let cluster = tokio::task::block_in_place(start)?;
    let addr = cluster.addrs[&1];
    // Partial HTTP/1 heads, a trickled HTTP/2 preface, and silence.
    let mut slow = Vec::new();
    for i in 0..300 {
        let Ok(mut stream) = connect_from(ABUSER, addr).await else { continue };
        let start: &[u8] = match i % 3 {
            0 => b"GET /api/v1/pods HTTP/1.1\r\nHost: x\r\n",
            1 => b"PRI * HTTP/2.0\r\n",
            _ => b"",
        };
        if stream.write_all(start).await.is_ok() {
            slow.push(stream);
        }
    }
    tokio::task::block_in_place(|| served(addr, "during 300 connections from one client that never send a request"))?;
    // The per-client limit (256) closed the excess at once; the header timeout (10 s) the rest.
    let started = Instant::now();
    let mut open = 0;
    for stream in &mut slow {
        if !closed(stream, Duration::from_secs(30).saturating_sub(started.elapsed())).await {
            open += 1;
        }
    }
    ensure!(open == 0, "{open} of {} stalled connections were still open after 30 s", slow.len());
    tokio::task::block_in_place(|| served(addr, "after the stalled connections"))?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t30_stalled_anonymous_fetches_do_not_delay_a_push() -> Result<()> {
    let cluster = tokio::task::block_in_place(|| -> Result<Cluster> {
        gitplane_e2e::require_root()?;
        let cluster = Cluster::start(1, &["--bootstrap", "bootstrap"])?;
        cluster.leader(DEADLINE)?;
        Ok(cluster)
    })?;
    let addr = cluster.addrs[&1];
    let repo = cluster.dir.path().join("repos/bootstrap.git");
    wait_for(DEADLINE, || repo.join("HEAD").exists().then_some(())).context("the bootstrap repository")?;
    let status = std::process::Command::new("git")
        .arg("config")
        .arg("-f")
        .arg(repo.join("config"))
        .args(["gitplane.anonymousRead", "true"])
        .status()?;
    ensure!(status.success(), "opting the repository in to anonymous reads");

    // 16 anonymous fetches that announce a body and never send it: each would hold a git
    // process for the idle timeout (60 s).
    let mut stalled = Vec::new();
    let mut refused = 0;
    for _ in 0..16 {
        let mut stream = connect_from(ABUSER, addr).await?;
        let head = "POST /git/bootstrap.git/git-upload-pack HTTP/1.1\r\nHost: x\r\n\
                    Content-Type: application/x-git-upload-pack-request\r\nContent-Length: 100000\r\n\r\n0032want ";
        stream.write_all(head.as_bytes()).await?;
        let mut first = [0u8; 12];
        match tokio::time::timeout(Duration::from_millis(500), stream.read(&mut first)).await {
            Ok(Ok(n)) if first[..n].starts_with(b"HTTP/1.1 503") => refused += 1,
            _ => stalled.push(stream),
        }
    }
    ensure!(refused >= 14, "anonymous reads get 2 process slots per client: {refused} of 16 were refused");

    let token = std::fs::read_to_string(cluster.dir.path().join("replica-1/git-token"))?.trim().to_owned();
    let url = format!("http://git:{token}@{addr}/git/bootstrap.git");
    let push = tokio::task::block_in_place(|| -> Result<Duration> {
        let work = Worktree::clone(&url, cluster.dir.path().join("work"))?;
        work.write("note.yaml", "# a comment only\n")?;
        work.commit("a push while anonymous fetches stall")?;
        let started = Instant::now();
        work.push(&url)?;
        Ok(started.elapsed())
    })?;
    ensure!(push < SERVED_WITHIN, "the authenticated push took {push:?} while anonymous fetches stalled");
    drop(stalled);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t30_trickled_unsigned_webhooks_do_not_block_a_signed_one() -> Result<()> {
    use hmac::{Hmac, Mac};
    use sha2::Sha256;
    const SECRET: &str = "webhook-secret-for-t30";
    gitplane_e2e::require_root()?;
    let secrets = tempfile::tempdir()?;
    let secret_file = secrets.path().join("webhook-secret");
    std::fs::write(&secret_file, SECRET)?;
    let secret_arg = secret_file.to_string_lossy().into_owned();
    let cluster = tokio::task::block_in_place(|| -> Result<Cluster> {
        let cluster = Cluster::start(1, &["--webhook-secret-file", &secret_arg])?;
        cluster.leader(DEADLINE)?;
        Ok(cluster)
    })?;
    let addr = cluster.addrs[&1];

    // 64 clients that claim a signature and trickle their bodies: a body can only be checked
    // once it is read, so these hold what an unauthenticated read may hold, and no more.
    let mut trickling = Vec::new();
    for _ in 0..64 {
        let mut stream = connect_from(ABUSER, addr).await?;
        let head = format!(
            "POST /hooks/github HTTP/1.1\r\nHost: x\r\nX-GitHub-Event: push\r\nX-Hub-Signature-256: sha256={}\r\n\
             Content-Length: 900000\r\n\r\n{{",
            "0".repeat(64)
        );
        stream.write_all(head.as_bytes()).await?;
        trickling.push(stream);
    }
    let body = br#"{"repository": {"clone_url": "https://example.com/o/r.git"}}"#;
    let mut mac = Hmac::<Sha256>::new_from_slice(SECRET.as_bytes())?;
    mac.update(body);
    let signature = format!("sha256={}", hex::encode(mac.finalize().into_bytes()));
    let started = Instant::now();
    let (code, answer) = tokio::task::block_in_place(|| {
        loopback_request(
            addr,
            "POST",
            "/hooks/github",
            &[("X-GitHub-Event", "push"), ("X-Hub-Signature-256", &signature)],
            body,
        )
    })?;
    ensure!(code == 202, "a signed webhook during 64 trickled ones: {code} {answer}");
    ensure!(started.elapsed() < SERVED_WITHIN, "it took {:?}", started.elapsed());
    drop(trickling);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t30_unrouted_paths_answer_a_kubernetes_404() -> Result<()> {
    let cluster = tokio::task::block_in_place(start)?;
    let addr = cluster.addrs[&1];
    for path in ["/nope", "/gitplane.store.v1.StoreService/Txn", "/gitplane.node.v1.NodeService/Register"] {
        let (code, body) = loopback_request(addr, "GET", path, &[], b"")?;
        let status: serde_json::Value = serde_json::from_str(&body).with_context(|| format!("{path}: {body}"))?;
        ensure!(code == 404 && status["kind"] == "Status" && status["code"] == 404, "{path}: {code} {body}");
    }
    // `/` is the status page: without a token, its sign-in form (t85 drives the page itself).
    let (code, body) = loopback_request(addr, "GET", "/", &[], b"")?;
    ensure!(code == 401 && body.contains("/ui/login"), "/: {code} {body}");
    Ok(())
}
