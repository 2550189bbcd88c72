//! `kubectl exec`, `attach` and `port-forward` on `gitplane up --nodes 1`, with the real kubectl
//! over HTTPS: through the status API, the node's kubelet endpoint and containerd's streaming
//! server. A token with the `debug` role gets them: the remote command's output, stdin piped
//! through and closed, its exit code (over SPDY, kubectl's fallback, and over WebSocket
//! `v4.channel.k8s.io`), a port forwarded to the Pod's httpd, a container's output attached to
//! and its stdin written; a read-only token and anonymous loopback callers get 403; each stream
//! is an Event on the Pod naming the user, never the data sent.

use anyhow::{Context, Result, bail, ensure};
use gitplane_e2e::{LocalCluster, Worktree, require_root, wait_for};
use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

const DEADLINE: Duration = Duration::from_secs(120);
const READ: &str = "t79-read-token-0123456789abcdef";
const DEBUG: &str = "t79-debug-token-0123456789abcdef";
const STDIN: &str = "t79 stdin data that no Event may show";

const PODS: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: web
  labels: {app: t79}
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: web
      image: gitplane.local/httpd:1
      command: [/bin/busybox, sh, -c, "echo t79-index > /www/t79.html; exec /bin/busybox httpd -f -p 80 -h /www"]
---
apiVersion: v1
kind: Pod
metadata:
  name: talker
  labels: {app: t79}
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: main
      image: gitplane.local/httpd:1
      command: [/bin/busybox, sh, -c, "i=0; while true; do i=$((i+1)); echo tick $i; /bin/busybox sleep 1; done"]
---
apiVersion: v1
kind: Pod
metadata:
  name: echoer
  labels: {app: t79}
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: main
      image: gitplane.local/httpd:1
      stdin: true
      command: [/bin/busybox, sh, -c, "while read line; do echo got $line; done"]
"#;

/// kubectl with one user's kubeconfig.
struct Kubectl {
    kubeconfig: PathBuf,
    cache: PathBuf,
}

impl Kubectl {
    fn new(dir: &Path, cluster: &LocalCluster, user: &str, token: &str) -> Result<Kubectl> {
        let kubeconfig = dir.join(format!("{user}.kubeconfig"));
        let ca = cluster.data_dir.join("ca.crt");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: t79\n  cluster:\n    server: https://{}\n    certificate-authority: {}\n\
                 users:\n- name: {user}\n  user:\n    token: {token}\ncontexts:\n- name: t79\n  context:\n    cluster: t79\n    user: {user}\n\
                 current-context: t79\n",
                cluster.listen,
                ca.display()
            ),
        )?;
        Ok(Kubectl { kubeconfig, cache: dir.join(format!("{user}.cache")) })
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new("kubectl");
        command.arg("--kubeconfig").arg(&self.kubeconfig).arg("--cache-dir").arg(&self.cache).args(args);
        command
    }

    /// Runs to the end (bounded), with `stdin` piped in and then closed.
    fn run(&self, args: &[&str], stdin: &[u8]) -> Result<Output> {
        let mut child = self
            .command(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("running kubectl (apt-get install kubectl)")?;
        let mut input = child.stdin.take().context("kubectl's stdin")?;
        input.write_all(stdin)?;
        drop(input);
        let waiting = std::thread::spawn(move || child.wait_with_output());
        let deadline = Instant::now() + Duration::from_secs(60);
        while !waiting.is_finished() {
            if Instant::now() > deadline {
                bail!("kubectl {args:?} did not end within 60 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(waiting.join().map_err(|_| anyhow::anyhow!("the waiting thread panicked"))??)
    }
}

/// Kills a background kubectl (our own child) when dropped.
struct Background(Child);

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The lines a child prints, as they come.
fn lines(stdout: std::process::ChildStdout) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `curl` of a loopback URL: the status code and the body.
fn curl(url: &str, headers: &[&str], method: &str) -> Result<(u16, String)> {
    let mut command = Command::new("curl");
    command.args(["-s", "--max-time", "10", "-X", method, "-w", "\n%{http_code}"]);
    for header in headers {
        command.args(["-H", header]);
    }
    let out = command.arg(url).output().context("running curl")?;
    let out = text(&out.stdout);
    let (body, code) = out.rsplit_once('\n').context("curl's status code")?;
    Ok((code.trim().parse().unwrap_or(0), body.to_owned()))
}

/// `exec` over WebSocket `v4.channel.k8s.io`, as the Python client speaks it (each message's
/// first byte names its channel: 1 stdout, 2 stderr, 3 the final Status): stdout and the
/// Status.
fn websocket_exec(addr: SocketAddr, path: &str) -> Result<(String, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {DEBUG}\r\nConnection: Upgrade\r\n\
         Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
         Sec-WebSocket-Protocol: v4.channel.k8s.io\r\n\r\n"
    )?;
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8];
        stream.read_exact(&mut byte).context("the upgrade answer")?;
        head.push(byte[0]);
    }
    let head = text(&head).to_ascii_lowercase();
    ensure!(head.starts_with("http/1.1 101"), "no WebSocket upgrade: {head}");
    ensure!(head.contains("sec-websocket-protocol: v4.channel.k8s.io"), "the protocol chosen: {head}");
    let (mut stdout, mut status) = (String::new(), String::new());
    loop {
        let mut frame = [0u8; 2];
        if stream.read_exact(&mut frame).is_err() {
            break;
        }
        let mut len = u64::from(frame[1] & 0x7f);
        if len == 126 {
            let mut ext = [0u8; 2];
            stream.read_exact(&mut ext)?;
            len = u64::from(u16::from_be_bytes(ext));
        } else if len == 127 {
            let mut ext = [0u8; 8];
            stream.read_exact(&mut ext)?;
            len = u64::from_be_bytes(ext);
        }
        ensure!(len < 1 << 20 && frame[1] & 0x80 == 0, "a frame of {len} bytes, masked {}", frame[1] >> 7);
        let mut payload = vec![0u8; usize::try_from(len)?];
        stream.read_exact(&mut payload)?;
        match (frame[0] & 0x0f, payload.split_first()) {
            (8, _) => break,
            (1 | 2, Some((1, data))) => stdout.push_str(&text(data)),
            (1 | 2, Some((3, data))) => status.push_str(&text(data)),
            _ => {}
        }
    }
    Ok((stdout, status))
}

#[test]
fn t79_exec_attach_and_port_forward_for_debug_tokens() -> Result<()> {
    require_root()?;
    let dir = tempfile::tempdir()?;
    let tokens = dir.path().join("tokens.csv");
    std::fs::write(&tokens, format!("{READ},reader,1001,\"read\"\n{DEBUG},alice,1002,\"read,debug\"\n"))?;
    let cluster = LocalCluster::up_with("gp79", 1, &[&format!("--tokens-file={}", tokens.display())])?;
    let work = Worktree::clone(cluster.demo_repo(), dir.path().join("demo"))?;
    work.remove("web.yaml")?;
    work.write("pods.yaml", PODS)?;
    work.commit_and_push("pods to debug")?;
    wait_for(DEADLINE, || cluster.running_pods("app=t79").ok().filter(|p| p.len() == 3))
        .with_context(|| format!("the pods did not run:\n{}", cluster.log_text()))?;

    let alice = Kubectl::new(dir.path(), &cluster, "alice", DEBUG)?;
    let reader = Kubectl::new(dir.path(), &cluster, "reader", READ)?;

    // Exec: the output, stdin piped through (and its end passed on), the exit code.
    let hostname = alice.run(&["exec", "web", "--", "/bin/busybox", "cat", "/etc/hostname"], b"")?;
    ensure!(hostname.status.success(), "kubectl exec cat /etc/hostname: {}", text(&hostname.stderr));
    ensure!(text(&hostname.stdout).trim() == "web", "the pod's hostname: {:?}", text(&hostname.stdout));
    let echoed = alice.run(&["exec", "-i", "web", "--", "/bin/busybox", "cat"], STDIN.as_bytes())?;
    ensure!(echoed.status.success(), "kubectl exec -i cat: {}", text(&echoed.stderr));
    ensure!(text(&echoed.stdout) == STDIN, "stdin echoed: {:?}", text(&echoed.stdout));
    // The built-in image's applets by name, and its wget with a timeout (-T crashes Debian's
    // busybox wget; the image's /bin/wget runs it under timeout instead).
    let tools = alice.run(&["exec", "web", "--", "sh", "-c", "ls /www && cat /www/t79.html"], b"")?;
    ensure!(
        tools.status.success() && text(&tools.stdout).contains("t79.html") && text(&tools.stdout).contains("t79-index"),
        "ls and cat by name: {} {}",
        text(&tools.stdout),
        text(&tools.stderr)
    );
    let fetched =
        alice.run(&["exec", "web", "--", "wget", "-T", "5", "-q", "-O", "-", "http://127.0.0.1/t79.html"], b"")?;
    ensure!(
        fetched.status.success() && text(&fetched.stdout).contains("t79-index"),
        "wget -T by name: {} {}",
        text(&fetched.stdout),
        text(&fetched.stderr)
    );
    let exit = alice.run(&["exec", "web", "--", "sh", "-c", "echo to-stderr >&2; exit 3"], b"")?;
    ensure!(exit.status.code() == Some(3), "the remote exit code: {:?} {}", exit.status, text(&exit.stderr));
    ensure!(text(&exit.stderr).contains("to-stderr"), "stderr: {}", text(&exit.stderr));

    // WebSocket v4 (the Python client's) passes through to containerd, the exit code in the
    // Status on channel 3.
    let (stdout, status) = websocket_exec(
        cluster.listen,
        "/api/v1/namespaces/default/pods/web/exec?command=sh&command=-c&command=echo%20ws-hello%3B%20exit%203&stdout=true&stderr=true",
    )?;
    ensure!(stdout == "ws-hello\n", "stdout over WebSocket: {stdout:?}");
    ensure!(status.contains("NonZeroExitCode") && status.contains("\"3\""), "the Status over WebSocket: {status}");

    // Port-forward to the Pod's httpd.
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let forward = Background(
        alice
            .command(&["port-forward", "pod/web", &format!("{port}:80")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?,
    );
    let page = wait_for(Duration::from_secs(60), || {
        curl(&format!("http://127.0.0.1:{port}/t79.html"), &[], "GET").ok().filter(|(code, _)| *code == 200)
    })
    .context("curl through kubectl port-forward never reached the pod's httpd")?;
    ensure!(page.1.trim() == "t79-index", "the page through port-forward: {:?}", page.1);
    // A second connection through the same forward.
    let again = curl(&format!("http://127.0.0.1:{port}/t79.html"), &[], "GET")?;
    ensure!(again == (200, "t79-index\n".to_owned()), "a second request: {again:?}");
    drop(forward);

    // Attach: the running container's output.
    let mut attached = Background(
        alice.command(&["attach", "talker", "-c", "main"]).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?,
    );
    let rx = lines(attached.0.stdout.take().context("attach's stdout")?);
    let tick = rx.recv_timeout(Duration::from_secs(60)).context("kubectl attach printed nothing")?;
    ensure!(tick.starts_with("tick "), "attached output: {tick:?}");
    drop(attached);
    // Attach with stdin, to a container that reads it.
    let mut attached = Background(
        alice
            .command(&["attach", "-i", "echoer", "-c", "main"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?,
    );
    let mut input = attached.0.stdin.take().context("attach's stdin")?;
    let rx = lines(attached.0.stdout.take().context("attach's stdout")?);
    // Lines written before the stream is up are kept in kubectl's pipe until it is.
    input.write_all(b"hello\n")?;
    input.flush()?;
    let got = rx.recv_timeout(Duration::from_secs(60)).context("kubectl attach -i printed nothing")?;
    ensure!(got == "got hello", "attached with stdin: {got:?}");
    drop((input, attached));

    // A read-only token is refused all three, and so is anonymous loopback.
    for args in [
        &["exec", "web", "--", "/bin/busybox", "true"][..],
        &["attach", "talker", "-c", "main"],
        &["port-forward", "pod/web", "0:80", "--pod-running-timeout=5s"],
    ] {
        let refused = reader.run(args, b"")?;
        let stderr = text(&refused.stderr);
        ensure!(!refused.status.success(), "a read token ran {args:?}");
        ensure!(stderr.contains("User \"reader\" cannot") && stderr.contains("debug"), "{args:?}: {stderr}");
    }
    let api = format!("https://{}", cluster.listen);
    let ca = cluster.data_dir.join("ca.crt");
    for sub in ["exec?command=true&stdout=true", "attach?stdout=true", "portforward"] {
        let path = format!("/api/v1/namespaces/default/pods/web/{sub}");
        let read = format!("Authorization: Bearer {READ}");
        let out = Command::new("curl")
            .args(["-s", "--max-time", "10", "-X", "POST", "-w", "\n%{http_code}", "--cacert"])
            .arg(&ca)
            .args(["-H", &read, "-H", "Connection: Upgrade", "-H", "Upgrade: SPDY/3.1"])
            .arg(format!("{api}{path}"))
            .output()?;
        let out = text(&out.stdout);
        ensure!(out.ends_with("\n403") && out.contains("\"Forbidden\""), "read token on {sub}: {out}");
        let (code, body) =
            curl(&format!("http://{}{path}", cluster.listen), &["Connection: Upgrade", "Upgrade: SPDY/3.1"], "POST")?;
        ensure!(code == 403 && body.contains("system:anonymous"), "anonymous on {sub}: {code} {body}");
    }

    // Events name the user and the command, never the data.
    let events = wait_for(Duration::from_secs(30), || {
        let list = cluster.get("/api/v1/namespaces/default/events").ok()?;
        let items = list["items"].as_array()?.clone();
        let has = |reason: &str, message: &str| {
            items.iter().any(|e| e["reason"] == reason && e["type"] == "Normal" && e["message"] == message)
        };
        (has("Exec", "user alice started exec of [/bin/busybox cat /etc/hostname] in container web")
            && has("Exec", "user alice started exec of [/bin/busybox cat] in container web")
            && has("Exec", "user alice started exec of [sh -c echo ws-hello; exit 3] in container web")
            && has("PortForward", "user alice started port-forward to pod web")
            && has("Attach", "user alice attached to container main"))
        .then_some(list)
    })
    .with_context(|| format!("the Events: {:?}", cluster.get("/api/v1/namespaces/default/events")))?;
    ensure!(!events.to_string().contains(STDIN), "an Event shows stdin data");
    ensure!(!events.to_string().contains("reader"), "a refused stream made an Event: {events}");
    Ok(())
}
