//! The status API over HTTPS with tokens and roles, against three real `gitplane server`
//! replicas on non-loopback addresses (192.0.2.75-77 on the loopback device of a network
//! namespace this test makes, so no traffic leaves it), with the real `curl` and `kubectl`.
//!
//! The replicas elect a leader over TLS (Raft verifies each peer against the CA every replica
//! derives from the shared peer token), then every caller (no token, a wrong one, a read
//! token, a debug-only token, a client certificate from another CA, a client that trusts
//! another CA, cleartext HTTP) is tried on every path, and the whole table is compared at once.
//! The kubeconfig the server wrote works with `kubectl --kubeconfig`; the audit log names who
//! read what; no token appears in any log.

use anyhow::{Context, Result, ensure};
use gitplane_e2e::{ForeignCa, binary, foreign_ca, wait_for};
use std::{
    path::PathBuf,
    process::{Child, Command, Output},
    time::Duration,
};

const DEADLINE: Duration = Duration::from_secs(90);
const PORT: u16 = 6443;
const READ: &str = "t75-read-token-0123456789abcdef";
const DEBUG: &str = "t75-debug-token-0123456789abcdef";
const BOTH: &str = "t75-both-token-0123456789abcdef";
const WRONG: &str = "t75-wrong-token-0123456789abcdef";

/// Three replicas in a namespace of their own; everything is removed on drop.
struct Replicas {
    netns: String,
    dir: tempfile::TempDir,
    children: Vec<Child>,
}

impl Drop for Replicas {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = Command::new("ip").args(["netns", "del", &self.netns]).status();
    }
}

impl Replicas {
    fn addr(id: u8) -> String {
        format!("192.0.2.{}", 74 + id)
    }

    fn start() -> Result<Replicas> {
        let netns = format!("gp-t75-{}", std::process::id());
        let dir = tempfile::Builder::new().prefix("gp-t75").tempdir()?;
        let mut replicas = Replicas { netns: netns.clone(), dir, children: Vec::new() };
        run(Command::new("ip").args(["netns", "add", &netns]))?;
        replicas.exec(&["ip", "link", "set", "lo", "up"])?;
        for id in 1..=3 {
            replicas.exec(&["ip", "addr", "add", &format!("{}/32", Self::addr(id)), "dev", "lo"])?;
        }
        let d = replicas.dir.path();
        std::fs::write(d.join("peer-token"), "t75-peer-token-0123456789abcdef\n")?;
        std::fs::write(d.join("join-token"), "t75-join-token-0123456789abcdef\n")?;
        std::fs::write(
            d.join("tokens.csv"),
            format!(
                "# the status API's tokens\n{READ},reader,1001,\"read\"\n{DEBUG},debugger,1002,\"debug\"\n\
                 {BOTH},operator,1003,\"read,debug\"\n"
            ),
        )?;
        gitplane_e2e::cluster::write_encryption_keys(&d.join("encryption-keys"))?;
        let addrs: std::collections::BTreeMap<u64, std::net::SocketAddr> = (1..=3)
            .map(|id| Ok((u64::from(id), format!("{}:{PORT}", Self::addr(id)).parse()?)))
            .collect::<Result<_>>()?;
        for id in 1..=3u8 {
            let log = std::fs::File::create(d.join(format!("replica-{id}.log")))?;
            let child = Command::new("ip")
                .args(["netns", "exec", &netns])
                .arg(binary("gitplane")?)
                .args(gitplane_testkit::replica::replica_args(d, u64::from(id), &addrs))
                .env("RUST_LOG", "info,openraft=warn,sqlx=warn,h2=warn")
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .context("starting gitplane server")?;
            replicas.children.push(child);
        }
        Ok(replicas)
    }

    fn data(&self, id: u8) -> PathBuf {
        self.dir.path().join(format!("replica-{id}"))
    }

    fn logs(&self) -> String {
        (1..=3)
            .map(|id| {
                let text =
                    std::fs::read_to_string(self.dir.path().join(format!("replica-{id}.log"))).unwrap_or_default();
                format!("--- replica {id}\n{text}")
            })
            .collect()
    }

    /// A command inside the namespace.
    fn command(&self, argv: &[&str]) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.netns]).args(argv);
        command
    }

    fn exec(&self, argv: &[&str]) -> Result<()> {
        run(&mut self.command(argv))
    }

    /// `curl` of `https://<replica 1><path>` with `extra` options: the HTTP code, or why the
    /// connection failed (by curl's exit code).
    fn curl(&self, path: &str, extra: &[&str]) -> Result<String> {
        let url = format!("https://{}:{PORT}{path}", Self::addr(1));
        let mut argv = vec!["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "10"];
        argv.extend_from_slice(extra);
        argv.push(&url);
        let out = self.command(&argv).output()?;
        Ok(match out.status.code() {
            Some(0) => String::from_utf8_lossy(&out.stdout).into_owned(),
            Some(60) => "untrusted-server".into(),
            // 35: the handshake failed; 55 and 56: the server ended it as the client sent or
            // read (TLS 1.3 sends its alert about the client's certificate once the client
            // thinks the handshake is done).
            Some(35 | 55 | 56) => "handshake-refused".into(),
            other => format!("curl-exit-{other:?}"),
        })
    }

    fn kubectl(&self, args: &[&str]) -> Result<Output> {
        let mut argv = vec!["kubectl", "--request-timeout=20s"];
        argv.extend_from_slice(args);
        Ok(self.command(&argv).output()?)
    }
}

/// A Register call of the node service on replica 1 with the join token, from `from` (an
/// address of the replicas' namespace): `grpc-<code> <message>`.
fn register_call(replicas: &Replicas, ca: &str, join: &str, from: &str, message: &[u8]) -> Result<String> {
    let frame = [&[0u8][..], &u32::try_from(message.len())?.to_be_bytes(), message].concat();
    let body = replicas.dir.path().join("register.grpc");
    std::fs::write(&body, frame)?;
    let url = format!("https://{}:{PORT}/gitplane.node.v1.NodeService/Register", Replicas::addr(1));
    let authorization = format!("authorization: Bearer {join}");
    let body_arg = format!("@{}", body.display());
    let argv = [
        "curl",
        "-sS",
        "-o",
        "/dev/null",
        "-D",
        "-",
        "--max-time",
        "10",
        "--http2",
        "--cacert",
        ca,
        "--interface",
        from,
        "-H",
        "content-type: application/grpc",
        "-H",
        "te: trailers",
        "-H",
        &authorization,
        "--data-binary",
        &body_arg,
        &url,
    ];
    let out = replicas.command(&argv).output()?;
    let headers = String::from_utf8_lossy(&out.stdout).to_lowercase();
    let code = headers.lines().find_map(|l| l.strip_prefix("grpc-status: ")).map(str::trim);
    let message = headers.lines().find_map(|l| l.strip_prefix("grpc-message: ")).unwrap_or_default();
    Ok(match code {
        Some(code) => format!("grpc-{code} {}", percent_decoded(message.trim())),
        None => format!("no gRPC status ({:?}): {headers} {}", out.status, String::from_utf8_lossy(&out.stderr)),
    })
}

/// A grpc-message header's text.
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|h| u8::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn run(command: &mut Command) -> Result<()> {
    let out = command.output().with_context(|| format!("{command:?}"))?;
    ensure!(out.status.success(), "{command:?}: {}", String::from_utf8_lossy(&out.stderr));
    Ok(())
}

#[test]
fn t75_the_status_api_over_https_with_tokens_and_roles() -> Result<()> {
    gitplane_e2e::require_root()?;
    let replicas = Replicas::start()?;
    let ca = replicas.data(1).join("ca.crt");
    let ca_arg = ca.to_string_lossy().into_owned();

    // The replicas share one CA without copying it (it is derived from the peer token) and
    // elect a leader over TLS.
    let ca_text = wait_for(DEADLINE, || std::fs::read_to_string(&ca).ok()).context("ca.crt")?;
    for id in 2..=3 {
        let other = wait_for(DEADLINE, || std::fs::read_to_string(replicas.data(id).join("ca.crt")).ok());
        ensure!(other.as_deref() == Some(ca_text.as_str()), "replica {id} has another CA");
    }
    let bearer = format!("Authorization: Bearer {READ}");
    let leader = wait_for(DEADLINE, || {
        (1..=3).find(|id| {
            let url = format!("https://{}:{PORT}/replica", Replicas::addr(*id));
            let out = replicas
                .command(&["curl", "-sS", "--max-time", "5", "--cacert", &ca_arg, "-H", &bearer, &url])
                .output();
            out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("\"leading\":true"))
        })
    });
    ensure!(leader.is_some(), "no leader over TLS within {DEADLINE:?}\n{}", replicas.logs());

    // The matrix: every caller on every path, over HTTPS.
    let ForeignCa { ca: other_ca, certificate: client_crt, key: client_key } =
        foreign_ca(replicas.dir.path(), "/CN=intruder")?;
    let (other_ca, client_crt, client_key) =
        (other_ca.to_string_lossy(), client_crt.to_string_lossy(), client_key.to_string_lossy());
    let header = |token: &str| format!("Authorization: Bearer {token}");
    let (h_read, h_debug, h_both, h_wrong) = (header(READ), header(DEBUG), header(BOTH), header(WRONG));
    let callers: Vec<(&str, Vec<&str>)> = vec![
        ("no token", vec!["--cacert", &ca_arg]),
        ("wrong token", vec!["--cacert", &ca_arg, "-H", &h_wrong]),
        ("read token", vec!["--cacert", &ca_arg, "-H", &h_read]),
        ("debug token", vec!["--cacert", &ca_arg, "-H", &h_debug]),
        ("read+debug token", vec!["--cacert", &ca_arg, "-H", &h_both]),
        (
            "read token, client cert of another CA",
            vec!["--cacert", &ca_arg, "-H", &h_read, "--cert", &client_crt, "--key", &client_key],
        ),
        ("read token, trusting another CA", vec!["--cacert", &other_ca, "-H", &h_read]),
    ];
    let paths = [
        "/healthz",
        "/api",
        "/api/v1/namespaces",
        "/apis/gitplane.io/v1/applications",
        "/api/v1/namespaces/default/pods/none/log",
        "/replica",
    ];
    let mut table = String::new();
    for (who, options) in &callers {
        let cells: Vec<String> = paths.iter().map(|path| replicas.curl(path, options)).collect::<Result<_>>()?;
        table.push_str(&format!("{who:<40} {}\n", cells.join(" ")));
    }
    let expected = "\
no token                                 200 401 401 401 401 401
wrong token                              200 401 401 401 401 401
read token                               200 200 200 200 404 200
debug token                              200 403 403 403 403 403
read+debug token                         200 200 200 200 404 200
read token, client cert of another CA    handshake-refused handshake-refused handshake-refused handshake-refused handshake-refused handshake-refused
read token, trusting another CA          untrusted-server untrusted-server untrusted-server untrusted-server untrusted-server untrusted-server
";
    ensure!(table == expected, "the auth matrix over {paths:?}:\n{table}\nexpected:\n{expected}");

    // Cleartext HTTP on the TLS port is told so, not served.
    let plain = format!("http://{}:{PORT}/api/v1/namespaces", Replicas::addr(1));
    let out = replicas.command(&["curl", "-sS", "--max-time", "10", "-H", &h_read, &plain]).output()?;
    ensure!(String::from_utf8_lossy(&out.stdout).contains("HTTP request to an HTTPS server"), "{out:?}");

    // kubectl: the kubeconfig the server wrote (this replica's HTTPS URL, the CA, a read token).
    let kubeconfig = replicas.data(1).join("kubeconfig");
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&kubeconfig)?.permissions());
    ensure!(mode & 0o077 == 0, "the kubeconfig holds a token: mode {mode:o}");
    let kubeconfig_arg = kubeconfig.to_string_lossy().into_owned();
    let listed = replicas.kubectl(&["--kubeconfig", &kubeconfig_arg, "get", "namespaces", "-o", "name"])?;
    let stdout = String::from_utf8_lossy(&listed.stdout);
    ensure!(
        listed.status.success() && stdout.lines().any(|l| l == "namespace/default"),
        "kubectl --kubeconfig: {stdout} {}",
        String::from_utf8_lossy(&listed.stderr)
    );
    let server = format!("https://{}:{PORT}", Replicas::addr(1));
    let refused = |args: &[&str], expected: &str| -> Result<()> {
        let mut argv = vec!["--server", &server];
        argv.extend_from_slice(args);
        argv.extend_from_slice(&["get", "namespaces"]);
        let out = replicas.kubectl(&argv)?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        ensure!(
            !out.status.success() && stderr.contains(expected),
            "kubectl {args:?}: expected {expected:?}: {stderr}"
        );
        ensure!(![READ, DEBUG, WRONG].iter().any(|t| stderr.contains(t)), "a token in kubectl's error: {stderr}");
        Ok(())
    };
    // (Without any token kubectl prompts for a user name: curl covers that row above.)
    refused(&["--certificate-authority", &ca_arg, &format!("--token={WRONG}")], "Unauthorized")?;
    refused(&["--certificate-authority", &ca_arg, &format!("--token={DEBUG}")], "Forbidden")?;
    refused(
        &["--certificate-authority", &*other_ca, &format!("--token={READ}")],
        "certificate signed by unknown authority",
    )?;

    // `gitplane token create` adds a token to the file the replicas follow and prints a
    // kubeconfig for it: it works without a restart, and `revoke` ends it the same way.
    let tokens_file = replicas.dir.path().join("tokens.csv");
    let token = |args: &[&str]| -> Result<Output> {
        Ok(Command::new(binary("gitplane")?)
            .arg("token")
            .args(args)
            .arg("--data-dir")
            .arg(replicas.data(1))
            .arg("--tokens-file")
            .arg(&tokens_file)
            .output()?)
    };
    let created = token(&["create", "--role", "read", "--user", "visitor", "--ttl", "1h"])?;
    ensure!(created.status.success(), "gitplane token create: {}", String::from_utf8_lossy(&created.stderr));
    let visitor = replicas.dir.path().join("visitor.kubeconfig");
    std::fs::write(&visitor, &created.stdout)?;
    let visitor_arg = visitor.to_string_lossy().into_owned();
    let lists = || {
        replicas
            .kubectl(&["--kubeconfig", &visitor_arg, "get", "namespaces", "-o", "name"])
            .ok()
            .filter(|out| String::from_utf8_lossy(&out.stdout).contains("namespace/default"))
    };
    wait_for(DEADLINE, lists).context("the token from `gitplane token create` never worked")?;
    let revoked = token(&["revoke", "visitor"])?;
    ensure!(revoked.status.success(), "gitplane token revoke: {}", String::from_utf8_lossy(&revoked.stderr));
    wait_for(DEADLINE, || {
        let out = replicas.kubectl(&["--kubeconfig", &visitor_arg, "get", "namespaces"]).ok()?;
        String::from_utf8_lossy(&out.stderr).contains("Unauthorized").then_some(())
    })
    .context("the revoked token still works")?;

    // A node cannot take the control plane's address: registering with the join token as
    // replica 3's address, as an address it does not register from, or at another address than
    // its first registration's, is refused; at its own address it joins.
    replicas.exec(&["ip", "addr", "add", "192.0.2.80/32", "dev", "lo"])?;
    replicas.exec(&["ip", "addr", "add", "192.0.2.81/32", "dev", "lo"])?;
    let join = std::fs::read_to_string(replicas.dir.path().join("join-token"))?;
    let register = |name: &str, address: &str, from: &str| -> Result<String> {
        let node = serde_json::json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
            "status": {"addresses": [{"type": "InternalIP", "address": address}]}});
        let request = gitplane_proto::node::RegisterRequest { node: serde_json::to_vec(&node)?, ..Default::default() };
        register_call(&replicas, &ca_arg, join.trim(), from, &prost::Message::encode_to_vec(&request))
    };
    let attempts = [
        ("as replica 3", register("mallory", &Replicas::addr(3), "192.0.2.80")?, "a control-plane replica's"),
        (
            "from replica 3's address",
            register("mallory", &Replicas::addr(3), &Replicas::addr(3))?,
            "a control-plane replica's",
        ),
        ("as another address", register("mallory", "192.0.2.81", "192.0.2.80")?, "registers from 192.0.2.80"),
        ("in the Service range", register("mallory", "10.96.0.1", "192.0.2.80")?, "in the service range"),
    ];
    for (what, got, why) in attempts {
        ensure!(got.starts_with("grpc-7 ") && got.contains(why), "registering {what}: {got}");
    }
    let own = register("honest", "192.0.2.80", "192.0.2.80")?;
    ensure!(own.starts_with("grpc-0"), "a node at its own address: {own}");
    let moved = register("honest", "192.0.2.81", "192.0.2.81")?;
    ensure!(moved.starts_with("grpc-7 ") && moved.contains("cannot move"), "a node moving elsewhere: {moved}");

    // The audit log says who read which kind, and with what answer; never a token.
    let audit = replicas.data(1).join("audit.log");
    let text = wait_for(DEADLINE, || {
        std::fs::read_to_string(&audit)
            .ok()
            .filter(|t| t.contains("\"user\":\"debugger\"") && t.contains("\"code\":403"))
    })
    .with_context(|| format!("the audit log: {:?}", std::fs::read_to_string(&audit)))?;
    let lines: Vec<serde_json::Value> = text.lines().map(serde_json::from_str).collect::<Result<_, _>>()?;
    let read_namespaces = lines
        .iter()
        .any(|l| l["user"] == "reader" && l["verb"] == "list" && l["resource"] == "namespaces" && l["code"] == 200);
    ensure!(read_namespaces, "no line for the reader's list of namespaces:\n{text}");
    ensure!(lines.iter().any(|l| l["user"] == "system:anonymous" && l["code"] == 401), "no 401 line:\n{text}");
    ensure!(!lines.iter().any(|l| l["path"] == "/healthz"), "health checks are not audited:\n{text}");

    let logs = replicas.logs();
    for token in [READ, DEBUG, BOTH, WRONG, "t75-peer-token", "t75-join-token"] {
        ensure!(!logs.contains(token) && !text.contains(token), "a token in the logs");
    }
    Ok(())
}
