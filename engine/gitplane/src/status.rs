//! `gitplane status`: the status page's summary in the terminal, read over the status API —
//! the Applications with sync, health and applied commit (and every error of a rejected
//! commit), then the nodes with what their Pods request. `--wait` polls until every
//! Application has synced the commit its branch points at now and is Healthy, and every node
//! is Ready (exit 0), showing progress while a sync or rollout runs; the rejection of that
//! commit, or `--timeout` passing, exits 1 with the reason. The branch's head comes from the
//! server ([`crate::apiserver::head`]), as Flux's `reconcile --with-source` compares the
//! applied revision with the source's: the status alone still shows the previous commit
//! Synced for a moment after a push. Colour only on a terminal, and never with `NO_COLOR` set.

use anyhow::{Context as _, bail};
use base64::Engine as _;
use bytes::Bytes;
use futures::StreamExt as _;
use gitplane_api::quantity;
use http_body_util::{BodyExt as _, Empty};
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use std::{
    collections::BTreeMap,
    fmt::Write as _,
    io::{IsTerminal as _, Write as _},
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

#[derive(clap::Args)]
pub struct StatusArgs {
    /// The kubeconfig to read the server, CA and token from [default: <data-dir>/kubeconfig].
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// The server's data directory, where `gitplane up` and `gitplane server` write the
    /// kubeconfig.
    #[arg(long, default_value = "/var/lib/gitplane")]
    data_dir: PathBuf,
    /// The status API's URL instead of the kubeconfig's (`http://127.0.0.1:6443`).
    #[arg(long)]
    server: Option<String>,
    /// A token with the read role, for `--server`.
    #[arg(long, env = "GITPLANE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// The cluster CA certificate (PEM), for an `https://` `--server`.
    #[arg(long)]
    certificate_authority: Option<PathBuf>,
    /// Wait until every Application has synced the current head of its branch and everything
    /// is healthy (exit 0); exit 1 with the reason when that commit is rejected or when
    /// `--timeout` passes.
    #[arg(long)]
    wait: bool,
    /// How long `--wait` waits (`90s`, `5m`, `1h`).
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    timeout: Duration,
}

/// A command-line duration: `90s`, `5m`, `1h`, `7d` (seconds without a unit).
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let (number, unit) = text.split_at(text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len()));
    let n: u64 = number.parse().map_err(|_| format!("{text:?} is not a duration like 90s, 5m, 1h or 7d"))?;
    let unit = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("{text:?}: the unit is s, m, h or d")),
    };
    n.checked_mul(unit).map(Duration::from_secs).ok_or_else(|| format!("{text:?} is too long"))
}

/// Where and how to reach the API.
struct Api {
    scheme_https: bool,
    host: String,
    port: u16,
    token: Option<String>,
    tls: Option<tokio_rustls::TlsConnector>,
}

/// A PEM certificate's DER bytes.
fn pem_der(pem: &str) -> anyhow::Result<Vec<u8>> {
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    base64::engine::general_purpose::STANDARD.decode(body.trim()).context("the CA certificate is not PEM")
}

pub fn tls_connector(ca_pem: &str) -> anyhow::Result<tokio_rustls::TlsConnector> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(rustls::pki_types::CertificateDer::from(pem_der(ca_pem)?)).context("the CA certificate")?;
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// A kubeconfig's current context: (server, CA PEM, token).
fn read_kubeconfig(path: &std::path::Path) -> anyhow::Result<(String, Option<String>, Option<String>)> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading {} (pass --kubeconfig, --data-dir or --server)", path.display()))?;
    let config: Value =
        serde_yaml::from_str(&text).with_context(|| format!("{} is not a kubeconfig", path.display()))?;
    let named = |list: &str, name: &str| {
        config[list].as_array().and_then(|l| l.iter().find(|e| e["name"] == name)).cloned().unwrap_or(Value::Null)
    };
    let context = match config["current-context"].as_str() {
        Some(name) => named("contexts", name),
        None => config["contexts"][0].clone(),
    };
    let cluster = named("clusters", context["context"]["cluster"].as_str().unwrap_or(""));
    let user = named("users", context["context"]["user"].as_str().unwrap_or(""));
    let server = cluster["cluster"]["server"].as_str().context("the kubeconfig names no server")?.to_owned();
    let ca = match cluster["cluster"]["certificate-authority-data"].as_str() {
        Some(data) => Some(String::from_utf8(base64::engine::general_purpose::STANDARD.decode(data.trim())?)?),
        None => None,
    };
    Ok((server, ca, user["user"]["token"].as_str().map(str::to_owned)))
}

impl Api {
    fn new(args: &StatusArgs) -> anyhow::Result<Api> {
        let (server, ca, token) = match &args.server {
            Some(server) => {
                let ca = match &args.certificate_authority {
                    Some(path) => {
                        Some(std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?)
                    }
                    None => None,
                };
                (server.clone(), ca, args.token.clone())
            }
            None => {
                let path = args.kubeconfig.clone().unwrap_or_else(|| args.data_dir.join("kubeconfig"));
                let (server, ca, token) = read_kubeconfig(&path)?;
                (server, ca, args.token.clone().or(token))
            }
        };
        let uri: hyper::Uri = server.parse().with_context(|| format!("{server:?} is not a URL"))?;
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => bail!("{server:?}: the server's URL starts with http:// or https://"),
        };
        let host = uri.host().context("the server's URL has no host")?.trim_matches(['[', ']']).to_owned();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let tls = match (https, ca) {
            (true, Some(ca)) => Some(tls_connector(&ca)?),
            (true, None) => {
                bail!("{server} is HTTPS: give the cluster CA (--certificate-authority, or a kubeconfig with it)")
            }
            (false, _) => None,
        };
        Ok(Api { scheme_https: https, host, port, token, tls })
    }

    /// `GET path`, as JSON; a Kubernetes `Status` answer becomes its message.
    async fn get(&self, path: &str) -> anyhow::Result<Value> {
        let address = format!(
            "{}:{}",
            if self.host.contains(':') { format!("[{}]", self.host) } else { self.host.clone() },
            self.port
        );
        let stream = tokio::time::timeout(Duration::from_secs(10), tokio::net::TcpStream::connect(&address))
            .await
            .with_context(|| format!("{address} did not answer within 10 s"))?
            .with_context(|| format!("connecting to {address}"))?;
        let mut request =
            Request::get(path).header(hyper::header::HOST, &address).header(hyper::header::ACCEPT, "application/json");
        if let Some(token) = &self.token {
            request = request.header(hyper::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let request = request.body(Empty::<Bytes>::new())?;
        let response = match (&self.tls, self.scheme_https) {
            (Some(tls), true) => {
                let name = rustls::pki_types::ServerName::try_from(self.host.clone())?;
                let stream = tls.connect(name, stream).await.with_context(|| format!("TLS with {address}"))?;
                send(TokioIo::new(stream), request).await?
            }
            _ => send(TokioIo::new(stream), request).await?,
        };
        let (code, body) = response;
        let value: Value = serde_json::from_slice(&body).with_context(|| format!("{path}: the answer is not JSON"))?;
        if code != StatusCode::OK {
            bail!("{path}: {code}: {}", value["message"].as_str().unwrap_or(""));
        }
        Ok(value)
    }

    /// The commit the Application's branch points at now, as the server reads it; `None` when
    /// it does not know one (a remote repository, no commit yet, an older server).
    async fn head(&self, app: &Value) -> Option<String> {
        let path = format!(
            "/apis/gitplane.io/v1/namespaces/{}/applications/{}/head",
            s(app, "/metadata/namespace"),
            s(app, "/metadata/name")
        );
        let head = self.get(&path).await.ok()?;
        (head["kind"] == gitplane_apiserver::head::KIND).then(|| head["revision"].as_str().map(str::to_owned)).flatten()
    }

    /// Every item of a list, page by page.
    async fn list(&self, path: &str) -> anyhow::Result<Vec<Value>> {
        let mut items = Vec::new();
        let mut token = String::new();
        loop {
            let page = self.get(&format!("{path}?limit=500&continue={token}")).await?;
            items.extend(page["items"].as_array().cloned().unwrap_or_default());
            match page["metadata"]["continue"].as_str().filter(|t| !t.is_empty()) {
                Some(next) => {
                    token = next.replace('%', "%25").replace('+', "%2B").replace('=', "%3D").replace('/', "%2F")
                }
                None => return Ok(items),
            }
        }
    }
}

async fn send<T>(io: TokioIo<T>, request: Request<Empty<Bytes>>) -> anyhow::Result<(StatusCode, Bytes)>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let response = tokio::time::timeout(Duration::from_secs(60), sender.send_request(request))
        .await
        .context("the API did not answer within 60 s")??;
    let code = response.status();
    let body = response.into_body().collect().await?.to_bytes();
    Ok((code, body))
}

/// Colours, or none.
#[derive(Clone, Copy)]
struct Paint(bool);

impl Paint {
    fn state(self, text: &str) -> String {
        let code = match text {
            "Synced" | "Healthy" | "Ready" => "32",
            "Progressing" | "OutOfSync" | "Missing" | "" => "33",
            _ => "31",
        };
        let text = if text.is_empty() { "-" } else { text };
        if self.0 { format!("\x1b[{code}m{text}\x1b[0m") } else { text.to_owned() }
    }

    fn bold(self, text: &str) -> String {
        if self.0 { format!("\x1b[1m{text}\x1b[0m") } else { text.to_owned() }
    }
}

fn s<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

/// Columns padded to their widest cell; colour codes do not count.
fn table(paint: Paint, header: &[&str], rows: &[Vec<String>]) -> String {
    let visible = |cell: &str| {
        let mut n = 0;
        let mut escape = false;
        for c in cell.chars() {
            match (escape, c) {
                (false, '\x1b') => escape = true,
                (true, 'm') => escape = false,
                (false, _) => n += 1,
                _ => {}
            }
        }
        n
    };
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(visible(cell));
        }
    }
    let mut out = String::new();
    let line = |cells: Vec<String>, out: &mut String| {
        let last = cells.len() - 1;
        for (i, cell) in cells.iter().enumerate() {
            out.push_str(cell);
            if i < last {
                out.push_str(&" ".repeat(widths[i] - visible(cell) + 2));
            }
        }
        out.push('\n');
    };
    line(header.iter().map(|h| paint.bold(h)).collect(), &mut out);
    for row in rows {
        line(row.clone(), &mut out);
    }
    out
}

/// What `--wait` decides from the Applications and nodes.
#[derive(Debug, PartialEq)]
enum Verdict {
    Done,
    /// Still running: what is not there yet.
    Waiting(String),
    /// Will not get there by waiting: why.
    Failed(String),
}

/// `heads[i]`: the commit `apps[i]`'s branch points at now, if the server knows it (a hosted
/// repository's branch with a commit).
fn verdict(apps: &[Value], heads: &[Option<String>], nodes: &[Value]) -> Verdict {
    let mut failed = Vec::new();
    let mut waiting = Vec::new();
    for (i, app) in apps.iter().enumerate() {
        let name = format!("{}/{}", s(app, "/metadata/namespace"), s(app, "/metadata/name"));
        let sync = s(app, "/status/sync/status");
        let health = s(app, "/status/health/status");
        let handled = match (sync, heads.get(i).and_then(Option::as_deref)) {
            (_, None) => true,
            ("Failed", Some(head)) => s(app, "/status/sync/attemptedRevision") == head,
            (_, Some(head)) => s(app, "/status/sync/revision") == head,
        };
        if !handled {
            let head = heads[i].as_deref().unwrap_or("");
            let synced = s(app, "/status/sync/revision");
            let synced = if synced.is_empty() { "nothing" } else { synced.get(..8).unwrap_or(synced) };
            waiting.push(format!(
                "{name}: its branch is at {}, the source has synced {synced}",
                head.get(..8).unwrap_or(head)
            ));
        } else if sync == "Failed" {
            let errors: Vec<&str> = app
                .pointer("/status/sync/errors")
                .and_then(Value::as_array)
                .map(|e| e.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            let why = if errors.is_empty() { s(app, "/status/sync/message").to_owned() } else { errors.join("; ") };
            failed.push(format!(
                "Application {name}: commit {} was rejected: {why}",
                s(app, "/status/sync/attemptedRevision").get(..8).unwrap_or("")
            ));
        } else if sync != "Synced" || health != "Healthy" {
            let detail = app
                .pointer("/status/health/resources")
                .and_then(Value::as_array)
                .and_then(|r| r.first())
                .map(|r| format!(": {} {}: {}", s(r, "/kind"), s(r, "/name"), s(r, "/message")))
                .or_else(|| app.pointer("/status/sync/message").and_then(Value::as_str).map(|m| format!(": {m}")))
                .unwrap_or_default();
            let sync = if sync.is_empty() { "not synced yet" } else { sync };
            let health = if health.is_empty() { "health unknown" } else { health };
            waiting.push(format!("{name} {sync}, {health}{detail}"));
        }
    }
    for node in nodes {
        if !node_ready(node) {
            waiting.push(format!("node {} is not Ready", s(node, "/metadata/name")));
        }
    }
    if !failed.is_empty() {
        Verdict::Failed(failed.join("\n"))
    } else if waiting.is_empty() {
        Verdict::Done
    } else {
        Verdict::Waiting(waiting.join("; "))
    }
}

fn node_ready(node: &Value) -> bool {
    node.pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
}

fn summary(paint: Paint, apps: &[Value], nodes: &[Value], pods: &[Value]) -> String {
    let mut out = String::new();
    let rows: Vec<Vec<String>> = apps
        .iter()
        .map(|app| {
            let revision = s(app, "/status/sync/revision");
            vec![
                format!("{}/{}", s(app, "/metadata/namespace"), s(app, "/metadata/name")),
                paint.state(s(app, "/status/sync/status")),
                paint.state(s(app, "/status/health/status")),
                revision.get(..8).unwrap_or(revision).to_owned(),
                s(app, "/status/sync/commitSubject").chars().filter(|c| !c.is_control()).take(60).collect(),
            ]
        })
        .collect();
    if rows.is_empty() {
        out.push_str("No Applications.\n");
    } else {
        out.push_str(&table(paint, &["APPLICATION", "SYNC", "HEALTH", "REVISION", "COMMIT"], &rows));
    }
    for app in apps {
        let errors = app.pointer("/status/sync/errors").and_then(Value::as_array).cloned().unwrap_or_default();
        if !errors.is_empty() {
            let _ = writeln!(
                out,
                "\n{} errors in commit {}:",
                paint.bold(s(app, "/metadata/name")),
                s(app, "/status/sync/attemptedRevision").get(..8).unwrap_or("")
            );
            for e in errors.iter().filter_map(Value::as_str) {
                let clean: String = e.chars().filter(|c| !c.is_control()).collect();
                let _ = writeln!(out, "  {clean}");
            }
        }
    }
    let mut per_node: BTreeMap<&str, (usize, i128, i128)> = BTreeMap::new();
    for pod in pods {
        let entry = per_node.entry(s(pod, "/spec/nodeName")).or_default();
        entry.0 += 1;
        for c in pod.pointer("/spec/containers").and_then(Value::as_array).into_iter().flatten() {
            entry.1 += c["resources"]["requests"]["cpu"].as_str().and_then(quantity::parse_milli).unwrap_or(0);
            entry.2 += c["resources"]["requests"]["memory"].as_str().and_then(quantity::parse_units).unwrap_or(0);
        }
    }
    let rows: Vec<Vec<String>> = nodes
        .iter()
        .map(|node| {
            let name = s(node, "/metadata/name");
            let (count, cpu, memory) = per_node.get(name).copied().unwrap_or_default();
            let cpu_of = quantity::parse_milli(s(node, "/status/allocatable/cpu")).unwrap_or(0);
            let memory_of = quantity::parse_units(s(node, "/status/allocatable/memory")).unwrap_or(0);
            vec![
                name.to_owned(),
                paint.state(if node_ready(node) { "Ready" } else { "NotReady" }),
                format!("{cpu}m/{cpu_of}m"),
                format!("{}Mi/{}Mi", memory >> 20, memory_of >> 20),
                format!("{count}/{}", s(node, "/status/capacity/pods")),
            ]
        })
        .collect();
    out.push('\n');
    out.push_str(&table(paint, &["NODE", "STATUS", "CPU REQUESTS", "MEMORY REQUESTS", "PODS"], &rows));
    out
}

/// Shows what `--wait` waits for: on a terminal one line rewritten in place, elsewhere a line
/// each time it changes. Returns what was shown.
fn waiting(tty: bool, started: Instant, what: &str, shown: &str) -> String {
    let line = format!("waiting ({} s): {what}", started.elapsed().as_secs());
    if tty {
        let cut: String = line.chars().take(160).collect();
        eprint!("\r\x1b[K{cut}");
    } else if what != shown {
        eprintln!("{line}");
    }
    what.to_owned()
}

/// Whether `error` says the cluster is not there yet: its kubeconfig not written, its listener
/// refusing or dropping connections. Anything else (a token refused, a bad file) ends `--wait`.
fn not_yet(error: &anyhow::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset, NotFound};
    error.chain().any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|e| matches!(e.kind(), NotFound | ConnectionRefused | ConnectionReset | ConnectionAborted))
    })
}

/// Branch heads fetched concurrently by `--wait`.
const HEADS_AT_ONCE: usize = 16;

/// `gitplane status`.
pub async fn status(args: StatusArgs) -> anyhow::Result<()> {
    let tty = std::io::stdout().is_terminal();
    let paint = Paint(tty && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()));
    let started = Instant::now();
    let mut shown = String::new();
    // `gitplane up & gitplane status --wait`: the kubeconfig appears with the replica.
    let api = loop {
        match Api::new(&args) {
            Err(e) if args.wait && started.elapsed() < args.timeout && not_yet(&e) => {
                shown = waiting(tty, started, &format!("{e:#}"), &shown);
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            api => break api?,
        }
    };
    let outcome = loop {
        let listed = async {
            Ok::<_, anyhow::Error>((
                api.list("/apis/gitplane.io/v1/applications").await?,
                api.list("/api/v1/nodes").await?,
            ))
        };
        let (apps, nodes) = match listed.await {
            Ok(listed) => listed,
            // Not answering yet (starting, or restarting): part of what `--wait` waits for.
            Err(e) if args.wait && started.elapsed() < args.timeout && not_yet(&e) => {
                shown = waiting(tty, started, &format!("{e:#}"), &shown);
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        if !args.wait {
            break (apps, nodes, Verdict::Done);
        }
        // A few at a time: one connection each, and a thousand Applications should not wait
        // for a thousand round trips in a row.
        let heads: Vec<Option<String>> =
            futures::stream::iter(&apps).map(|app| api.head(app)).buffered(HEADS_AT_ONCE).collect().await;
        match verdict(&apps, &heads, &nodes) {
            Verdict::Waiting(what) if started.elapsed() < args.timeout => {
                shown = waiting(tty, started, &what, &shown);
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Verdict::Waiting(what) => {
                let why = format!("not synced and healthy within {} s: {what}", args.timeout.as_secs());
                break (apps, nodes, Verdict::Failed(why));
            }
            other => break (apps, nodes, other),
        }
    };
    if tty && args.wait {
        eprint!("\r\x1b[K");
    }
    let (apps, nodes, verdict) = outcome;
    let pods = api.list("/api/v1/pods").await?;
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(summary(paint, &apps, &nodes, &pods).as_bytes())?;
    match verdict {
        Verdict::Failed(why) => {
            drop(stdout);
            eprintln!("\n{why}");
            std::process::exit(1);
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn app(sync: &str, health: &str, errors: &[&str]) -> Value {
        json!({"metadata": {"namespace": "gitplane-system", "name": "demo"},
               "status": {"sync": {"status": sync, "errors": errors, "attemptedRevision": "0123456789abcdef"},
                          "health": {"status": health}}})
    }

    #[test]
    fn only_a_cluster_not_there_yet_is_waited_for() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(not_yet(&anyhow::Error::new(refused).context("connecting to 127.0.0.1:8080")));
        let missing = std::io::Error::from(std::io::ErrorKind::NotFound);
        assert!(not_yet(&anyhow::Error::new(missing).context("reading /tmp/x/kubeconfig")));
        assert!(!not_yet(&anyhow::anyhow!("/api/v1/nodes: 401 Unauthorized: Unauthorized")));
        let denied = std::io::Error::from(std::io::ErrorKind::PermissionDenied);
        assert!(!not_yet(&anyhow::Error::new(denied).context("reading /tmp/x/kubeconfig")));
    }

    #[test]
    fn waits_until_synced_and_healthy_and_fails_on_a_rejected_commit() {
        let ready =
            json!({"metadata": {"name": "n1"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        let nodes = std::slice::from_ref(&ready);
        assert_eq!(verdict(&[app("Synced", "Healthy", &[])], &[None], nodes), Verdict::Done);
        assert!(matches!(verdict(&[app("Synced", "Progressing", &[])], &[None], nodes), Verdict::Waiting(_)));
        assert!(
            matches!(verdict(&[app("Synced", "Healthy", &[])], &[None], &[json!({"metadata": {"name": "n1"}})]), Verdict::Waiting(w) if w.contains("n1"))
        );
        let Verdict::Failed(why) = verdict(&[app("Failed", "Healthy", &["a.yaml:3: bad"])], &[None], nodes) else {
            panic!()
        };
        assert!(why.contains("01234567") && why.contains("a.yaml:3: bad"), "{why}");
    }

    #[test]
    fn only_the_branch_head_counts() {
        let head = |h: &str| vec![Some(h.to_owned())];
        let mut synced = app("Synced", "Healthy", &[]);
        synced["status"]["sync"]["revision"] = json!("0123456789abcdef");
        assert_eq!(verdict(std::slice::from_ref(&synced), &head("0123456789abcdef"), &[]), Verdict::Done);
        // Pushed since: the source has not synced it yet, whatever the status says.
        let Verdict::Waiting(why) = verdict(std::slice::from_ref(&synced), &head("fedcba9876543210"), &[]) else {
            panic!()
        };
        assert!(why.contains("at fedcba98") && why.contains("synced 01234567"), "{why}");
        // A rejection counts only for the commit the branch is at.
        let rejected = app("Failed", "Healthy", &["a.yaml:3: bad"]);
        assert!(matches!(verdict(std::slice::from_ref(&rejected), &head("0123456789abcdef"), &[]), Verdict::Failed(_)));
        assert!(matches!(verdict(&[rejected], &head("fedcba9876543210"), &[]), Verdict::Waiting(_)));
    }

    #[test]
    fn tables_align_and_colour_only_when_asked() {
        let rows =
            vec![vec!["demo".to_owned(), Paint(true).state("Synced")], vec!["a-longer-name".to_owned(), "x".into()]];
        let text = table(Paint(false), &["NAME", "SYNC"], &rows);
        assert!(text.starts_with("NAME           SYNC\ndemo           \x1b[32mSynced\x1b[0m\n"), "{text:?}");
        assert_eq!(Paint(false).state("Failed"), "Failed");
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert!(parse_duration("5x").is_err());
    }
}
