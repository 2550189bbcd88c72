//! `gitplane diff`: what a sync of a directory, a branch or a commit range would change in the
//! live cluster, printed as `kubectl diff` prints it (`diff -u -N` of each object's YAML, live
//! against merged), or as JSON for bots that comment on pull requests.
//!
//! The desired objects are loaded by the code the server runs ([`gitplane_source`]); the plan is
//! the sync's own ([`crate::source::apply::plan`]) against the objects read over the status API
//! (a read token: `--kubeconfig`, default `$KUBECONFIG` or `~/.kube/config`, or `--server` and
//! `--token`). The read API masks Secret values, so a diff shows Secrets' keys and every other
//! field, never a value; a changed value of an existing key cannot be seen from outside the
//! server (the push verdict, which runs inside it, says "secret value changed").
//! Exit codes as kubectl diff: 0 no differences, 1 differences, 2 an error.

use crate::source::{
    allocate::ServiceRanges,
    apply::{self, LAST_APPLIED_ANNOTATION, RecordKey},
};
use anyhow::{Context as _, bail};
use gitplane_api::{Application, kinds::stored, object::APPLICATION_ANNOTATION};
use gitplane_source::{
    AppSource, Limits, LoadError, Manifest, ManifestFile, SourceCache, Validator, manifest::to_yaml, redacted,
    set_value,
};
use gitplane_store::{ObjectKey, Op};
use serde_json::{Value, json};
use std::{
    collections::{BTreeMap, BTreeSet, HashSet},
    path::{Path, PathBuf},
    sync::Arc,
};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

#[derive(clap::Args, Debug)]
pub struct DiffArgs {
    /// The directory of the manifests (as `gitplane validate`); with --app, any directory of
    /// the work tree (the Application's spec.path is used).
    #[arg(default_value = ".")]
    dir: PathBuf,
    /// A branch or commit of the repository that holds DIR, or a range A..B (only what B
    /// changes since A), instead of the files on disk.
    #[arg(long)]
    rev: Option<String>,
    /// The Application (NAME in gitplane-system, or NAMESPACE/NAME): its path, namespace,
    /// values and prune are read from the cluster, and what it would prune is shown.
    #[arg(long)]
    app: Option<String>,
    /// Without --app: a values file (repeatable), as spec.valuesFiles.
    #[arg(long = "values", value_name = "FILE")]
    values: Vec<String>,
    /// Without --app: KEY.PATH=VALUE over the values, as spec.values (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Without --app: the namespace of objects that name none.
    #[arg(long, default_value = gitplane_api::object::DEFAULT_NAMESPACE)]
    namespace: String,
    /// The kubeconfig to reach the cluster with (a replica writes `<data-dir>/kubeconfig`).
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// The API server URL (instead of a kubeconfig), e.g. http://127.0.0.1:8080.
    #[arg(long, requires = "token")]
    server: Option<String>,
    /// A bearer token with the read role.
    #[arg(long)]
    token: Option<String>,
    /// `diff` (unified, as kubectl diff) or `json`.
    #[arg(long, short = 'o', default_value = "diff")]
    output: String,
}

/// Runs the command; `Ok(true)` when there are differences.
pub fn diff(args: DiffArgs) -> anyhow::Result<bool> {
    if !matches!(args.output.as_str(), "diff" | "json") {
        bail!("--output {:?}: use diff or json", args.output);
    }
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(run(args))
}

async fn run(args: DiffArgs) -> anyhow::Result<bool> {
    let api = Api::from_args(&args)?;
    let app = match &args.app {
        Some(name) => {
            let (ns, name) = name.split_once('/').unwrap_or(("gitplane-system", name));
            let value = api
                .get(&format!("/apis/gitplane.io/v1/namespaces/{ns}/applications/{name}"))
                .await?
                .with_context(|| format!("Application {ns}/{name} not found"))?;
            Some(serde_json::from_value::<Application>(value).context("reading the Application")?)
        }
        None => None,
    };
    let dir = std::fs::canonicalize(&args.dir).with_context(|| args.dir.display().to_string())?;
    let root = dir.ancestors().find(|d| d.join(".git").exists()).map(Path::to_path_buf).unwrap_or_else(|| dir.clone());
    let source = match &app {
        Some(app) => AppSource::from_spec(&app.spec),
        None => {
            let mut values = BTreeMap::new();
            for assignment in &args.set {
                set_value(&mut values, assignment).map_err(|e| anyhow::anyhow!("--set {e}"))?;
            }
            let path = dir.strip_prefix(&root).unwrap_or(Path::new("")).to_string_lossy().into_owned();
            AppSource { path, default_namespace: args.namespace.clone(), values_files: args.values.clone(), values }
        }
    };
    let (desired, changed) = load(&root, args.rev.as_deref(), &source)?;

    // The live cluster, as the plan sees the store.
    let mut live: BTreeMap<ObjectKey, Arc<Value>> = BTreeMap::new();
    for kind in stored() {
        let path = if kind.api_version == "v1" {
            format!("/api/v1/{}", kind.plural)
        } else {
            format!("/apis/{}/{}", kind.api_version, kind.plural)
        };
        let list = api.get(&path).await?.unwrap_or_default();
        for mut item in list["items"].as_array().cloned().unwrap_or_default() {
            // List items carry no kind in Kubernetes' lists.
            item["apiVersion"] = json!(kind.api_version);
            item["kind"] = json!(kind.kind);
            if let Ok(key) = ObjectKey::from_value(&item) {
                live.insert(key, Arc::new(item));
            }
        }
    }
    let names = |list: Option<Value>| -> HashSet<String> {
        list.unwrap_or_default()["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|o| o["metadata"]["name"].as_str().map(str::to_owned))
            .collect()
    };
    let namespaces = names(api.get("/api/v1/namespaces").await?);
    let nodes = names(api.get("/api/v1/nodes").await?);
    // Without --app: the Application that reads this directory of this repository, else the
    // owner of the first of these objects already in the cluster. Its prune setting decides
    // whether deleted files show as prunes; either way the user is told which one it is.
    let owner = match app {
        Some(app) => Some((app, "named by --app")),
        None => {
            let apps: Vec<Application> = api
                .get("/apis/gitplane.io/v1/applications")
                .await?
                .and_then(|list| serde_json::from_value::<Vec<Application>>(list["items"].clone()).ok())
                .unwrap_or_default();
            let origin = origin_url(&root);
            let reading: Vec<&Application> = apps
                .iter()
                .filter(|a| a.spec.path.trim_matches('/') == source.path.trim_matches('/'))
                .filter(|a| origin.as_deref().is_some_and(|url| same_repository(&a.spec.repo, url)))
                .collect();
            let owning = desired.iter().find_map(|m| {
                live.get(&m.key)?["metadata"]["annotations"][APPLICATION_ANNOTATION].as_str().map(str::to_owned)
            });
            match (reading.as_slice(), owning) {
                ([one], _) => Some(((*one).clone(), "it reads this directory of this repository")),
                (_, Some(id)) => {
                    apps.into_iter().find(|a| app_id(a) == id).map(|a| (a, "it owns these objects in the cluster"))
                }
                _ => None,
            }
        }
    };
    let id = owner.as_ref().map(|(a, _)| app_id(a)).unwrap_or_default();
    match &owner {
        Some((a, why)) => eprintln!(
            "gitplane diff: against Application {id} ({why}); prune is {}",
            if a.spec.prune { "on: objects it made that Git no longer holds show as deleted" } else { "off" }
        ),
        None => eprintln!(
            "gitplane diff: no Application reads this directory or owns these objects: only creations are shown \
             (--app NAME to compare with one)"
        ),
    }
    // The cluster's record key stays in the cluster: Secrets are compared on what the API shows.
    let record_key = RecordKey::new([0; 32]);
    let policy = apply::Policy {
        app: &id,
        prune: owner.as_ref().is_some_and(|(a, _)| a.spec.prune),
        allow_empty: owner.as_ref().is_some_and(|(a, _)| a.spec.allow_empty),
        record_key: &record_key,
    };
    let inventory = apply::Inventory::default();
    let ranges = ServiceRanges::default();
    let cluster = apply::Cluster {
        stored: &live,
        inventory: &inventory,
        namespaces: &namespaces,
        nodes: &nodes,
        service_ranges: &ranges,
    };
    let plan = apply::plan(&desired, &cluster, &policy).map_err(|errors| {
        let lines: Vec<String> = errors.iter().map(ToString::to_string).collect();
        anyhow::anyhow!("the sync would reject this:\n{}", lines.join("\n"))
    })?;

    for warning in &plan.warnings {
        eprintln!("gitplane diff: warning: {}", warning.message);
    }
    let mut objects = Vec::new();
    for op in &plan.ops {
        let (key, before, after) = match op {
            Op::Create(v) => (ObjectKey::from_value(v)?, None, Some(v.clone())),
            Op::Update(v) | Op::UpdateWithStatus(v) => {
                let key = ObjectKey::from_value(v)?;
                (key.clone(), live.get(&key).map(|l| (**l).clone()), Some(v.clone()))
            }
            Op::Delete { key, .. } => (key.clone(), live.get(key).map(|l| (**l).clone()), None),
            Op::UpdateStatus(_) => continue,
        };
        if changed.as_ref().is_some_and(|c| !c.contains(&key)) {
            continue;
        }
        let before = before.map(|v| shown(&v)).transpose()?.unwrap_or_default();
        let after = after.map(|v| shown(&v)).transpose()?.unwrap_or_default();
        if before == after {
            continue;
        }
        let action = match op {
            Op::Create(_) => "create",
            Op::Delete { .. } => "prune",
            _ => "update",
        };
        objects.push((key, action, before, after));
    }
    let mut out = String::new();
    if args.output == "json" {
        let items: Vec<Value> = objects
            .iter()
            .map(|(key, action, before, after)| {
                json!({"kind": key.kind, "namespace": key.namespace, "name": key.name, "action": action,
                       "diff": unified(&file_name(key, "LIVE"), &file_name(key, "MERGED"), before, after)})
            })
            .collect();
        let summary = |a: &str| objects.iter().filter(|o| o.1 == a).count();
        let report = json!({"application": id, "create": summary("create"), "update": summary("update"),
                            "prune": summary("prune"), "objects": items});
        out = serde_json::to_string_pretty(&report)? + "\n";
    } else {
        for (key, _, before, after) in &objects {
            let (a, b) = (file_name(key, "LIVE"), file_name(key, "MERGED"));
            out.push_str(&format!("diff -u -N {a} {b}\n"));
            out.push_str(&unified(&a, &b, before, after));
        }
    }
    print!("{out}");
    Ok(!objects.is_empty())
}

/// `namespace/name` of an Application, as its objects' inventory annotation names it.
fn app_id(app: &Application) -> String {
    format!("{}/{}", app.metadata.namespace.as_deref().unwrap_or(""), app.metadata.name.as_deref().unwrap_or(""))
}

/// The URL of the `origin` remote of the repository at `root`, if any.
fn origin_url(root: &Path) -> Option<String> {
    let repo = git2::Repository::open(root).ok()?;
    let remote = repo.find_remote("origin").ok()?;
    remote.url().map(str::to_owned)
}

/// Whether an Application's `repo` (a hosted repository's name, or a remote URL) is the one a
/// clone's `origin` points at: the same URL, or a hosted repository's `.../git/<name>.git`.
fn same_repository(repo: &str, origin: &str) -> bool {
    let trimmed = |u: &str| u.trim_end_matches('/').trim_end_matches(".git").to_owned();
    if repo.contains('/') || repo.contains(':') {
        return trimmed(repo) == trimmed(origin);
    }
    trimmed(origin).rsplit('/').next() == Some(repo)
}

/// `/tmp/LIVE/v1.ConfigMap.default.settings`, as kubectl diff names its files.
fn file_name(key: &ObjectKey, side: &str) -> String {
    let kind = key.kind.split_once('.').map_or(key.kind.clone(), |(k, g)| format!("{g}.{k}"));
    let kind = if key.kind.contains('.') { kind } else { format!("v1.{kind}") };
    if key.namespace.is_empty() {
        format!("/tmp/{side}/{kind}.{}", key.name)
    } else {
        format!("/tmp/{side}/{kind}.{}.{}", key.namespace, key.name)
    }
}

/// The YAML an object is compared as: without what the server manages, Secrets masked.
fn shown(value: &Value) -> anyhow::Result<String> {
    let mut v = redacted(value).into_owned();
    if let Some(obj) = v.as_object_mut() {
        obj.remove("status");
        if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            for field in ["resourceVersion", "uid", "creationTimestamp", "generation", "managedFields"] {
                meta.remove(field);
            }
            if let Some(annotations) = meta.get_mut("annotations").and_then(Value::as_object_mut) {
                annotations.remove(LAST_APPLIED_ANNOTATION);
                if annotations.is_empty() {
                    meta.remove("annotations");
                }
            }
        }
    }
    Ok(to_yaml(&v)?)
}

/// The desired objects, and for a range the keys it changes.
type Loaded = (Vec<Arc<Manifest>>, Option<BTreeSet<ObjectKey>>);

fn load(root: &Path, rev: Option<&str>, source: &AppSource) -> anyhow::Result<Loaded> {
    let (validator, limits) = (Validator::new(), Limits::default());
    let invalid = |e: LoadError| match e {
        LoadError::Invalid(errors) => {
            let lines: Vec<String> = errors.iter().map(ToString::to_string).collect();
            anyhow::anyhow!("{} error(s); the server would reject this commit:\n{}", errors.len(), lines.join("\n"))
        }
        LoadError::Source(e) => anyhow::anyhow!("{e}"),
    };
    let Some(rev) = rev else {
        let loaded = gitplane_source::load_dir(root, source, &validator, &limits, &mut SourceCache::new());
        return Ok((loaded.map_err(invalid)?, None));
    };
    let repository = git2::Repository::discover(root).context("--rev needs a Git repository")?;
    let git_dir = repository.path().to_path_buf();
    let at = |oid: git2::Oid| -> anyhow::Result<Vec<Arc<Manifest>>> {
        let head = gitplane_source::head_at(&repository, &git_dir, oid)?;
        gitplane_source::load_commit_in(&repository, &head, source, &validator, &limits, &mut SourceCache::new())
            .map_err(invalid)
    };
    let spec = repository.revparse(rev).with_context(|| format!("--rev {rev}"))?;
    let commit = |o: Option<&git2::Object>| -> anyhow::Result<git2::Oid> {
        Ok(o.context("an empty side of the range")?.peel_to_commit()?.id())
    };
    if spec.mode().contains(git2::RevparseMode::RANGE) {
        let (from, to) = (commit(spec.from())?, commit(spec.to())?);
        let (before, after) = (at(from)?, at(to)?);
        let old: BTreeMap<&ObjectKey, &Value> = before.iter().map(|m| (&m.key, &m.value)).collect();
        let mut changed: BTreeSet<ObjectKey> =
            after.iter().filter(|m| old.get(&m.key) != Some(&&m.value)).map(|m| m.key.clone()).collect();
        let now: HashSet<&ObjectKey> = after.iter().map(|m| &m.key).collect();
        changed.extend(before.iter().filter(|m| !now.contains(&m.key)).map(|m| m.key.clone()));
        return Ok((after, Some(changed)));
    }
    Ok((at(commit(spec.from())?)?, None))
}

/// A unified diff of two texts (3 lines of context), empty when they are equal.
pub fn unified(a_name: &str, b_name: &str, a: &str, b: &str) -> String {
    let (a, b): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
    // Longest common subsequence, by table: objects are hundreds of lines at most.
    let (n, m) = (a.len(), b.len());
    let mut lcs = vec![vec![0u32; m + 1]; n + 1];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            lcs[i][j] = if a[i] == b[j] { lcs[i + 1][j + 1] + 1 } else { lcs[i + 1][j].max(lcs[i][j + 1]) };
        }
    }
    // (tag, line in a, line in b, text)
    let mut edits: Vec<(char, usize, usize, &str)> = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < n || j < m {
        if i < n && j < m && a[i] == b[j] {
            edits.push((' ', i, j, a[i]));
            (i, j) = (i + 1, j + 1);
        } else if i < n && (j == m || lcs[i + 1][j] >= lcs[i][j + 1]) {
            // Removals first, as diff -u prints them.
            edits.push(('-', i, j, a[i]));
            i += 1;
        } else {
            edits.push(('+', i, j, b[j]));
            j += 1;
        }
    }
    if edits.iter().all(|e| e.0 == ' ') {
        return String::new();
    }
    let mut out = format!("--- {a_name}\n+++ {b_name}\n");
    const CONTEXT: usize = 3;
    let changes: Vec<usize> = edits.iter().enumerate().filter(|(_, e)| e.0 != ' ').map(|(k, _)| k).collect();
    let mut k = 0;
    while k < changes.len() {
        let start = changes[k].saturating_sub(CONTEXT);
        let mut end = changes[k];
        while k + 1 < changes.len() && changes[k + 1] <= end + 2 * CONTEXT + 1 {
            k += 1;
            end = changes[k];
        }
        let end = (end + CONTEXT + 1).min(edits.len());
        let hunk = &edits[start..end];
        let (a_start, b_start) = (hunk[0].1, hunk[0].2);
        let a_len = hunk.iter().filter(|e| e.0 != '+').count();
        let b_len = hunk.iter().filter(|e| e.0 != '-').count();
        let range = |s: usize, l: usize| if l == 0 { format!("{s},0") } else { format!("{},{l}", s + 1) };
        out.push_str(&format!("@@ -{} +{} @@\n", range(a_start, a_len), range(b_start, b_len)));
        for (tag, _, _, text) in hunk {
            out.push_str(&format!("{tag}{text}\n"));
        }
        k += 1;
    }
    out
}

/// The status API, read with a bearer token, over HTTP (loopback) or HTTPS with the cluster CA.
struct Api {
    host: String,
    port: u16,
    tls: Option<tokio_rustls::TlsConnector>,
    token: String,
}

impl Api {
    fn from_args(args: &DiffArgs) -> anyhow::Result<Api> {
        let (server, token, ca) = match (&args.server, &args.token) {
            (Some(server), Some(token)) => (server.clone(), token.clone(), None),
            _ => {
                let path = args
                    .kubeconfig
                    .clone()
                    .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".kube/config")))
                    .context("no --kubeconfig, --server or $HOME")?;
                let (server, token, ca) = kubeconfig(&path)?;
                (server, args.token.clone().unwrap_or(token), ca)
            }
        };
        let (scheme, rest) = server.split_once("://").context("the server is not a URL")?;
        let authority = rest.split('/').next().unwrap_or(rest);
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_owned(), p.parse().context("the server's port")?),
            None => (authority.to_owned(), if scheme == "https" { 443 } else { 80 }),
        };
        let tls = match scheme {
            "http" => None,
            "https" => {
                use rustls::pki_types::{CertificateDer, pem::PemObject as _};
                let mut roots = rustls::RootCertStore::empty();
                for cert in CertificateDer::pem_slice_iter(ca.as_deref().unwrap_or_default()) {
                    roots.add(cert.context("the CA certificate")?)?;
                }
                let provider = Arc::new(rustls::crypto::ring::default_provider());
                let config = rustls::ClientConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()?
                    .with_root_certificates(roots)
                    .with_no_client_auth();
                Some(tokio_rustls::TlsConnector::from(Arc::new(config)))
            }
            other => bail!("the server's scheme {other:?} is neither http nor https"),
        };
        Ok(Api { host: host.trim_matches(['[', ']']).to_owned(), port, tls, token })
    }

    /// GET `path`: the JSON body, `None` on 404.
    async fn get(&self, path: &str) -> anyhow::Result<Option<Value>> {
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {}\r\nAccept: application/json\r\n\
             Connection: close\r\n\r\n",
            self.host, self.token
        );
        let tcp = tokio::net::TcpStream::connect((self.host.as_str(), self.port))
            .await
            .with_context(|| format!("connecting to {}:{}", self.host, self.port))?;
        let mut response = Vec::new();
        match &self.tls {
            None => {
                let mut tcp = tcp;
                tcp.write_all(request.as_bytes()).await?;
                tcp.take(1 << 30).read_to_end(&mut response).await?;
            }
            Some(tls) => {
                let name = rustls::pki_types::ServerName::try_from(self.host.clone())?;
                let mut stream = tls.connect(name, tcp).await.context("TLS to the API server")?;
                stream.write_all(request.as_bytes()).await?;
                // A server may close without close_notify; what was read is the answer.
                let _ = stream.read_to_end(&mut response).await;
            }
        }
        let at = response.windows(4).position(|w| w == b"\r\n\r\n").context("a malformed HTTP answer")?;
        let head = String::from_utf8_lossy(&response[..at]).into_owned();
        let mut body = response[at + 4..].to_vec();
        if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
            body = dechunk(&body)?;
        }
        let status: u16 = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        match status {
            200..=299 => Ok(Some(serde_json::from_slice(&body).with_context(|| format!("GET {path}"))?)),
            404 => Ok(None),
            401 | 403 => bail!("GET {path}: {status}: the token was refused (it needs the read role)"),
            _ => bail!("GET {path}: {status}: {}", String::from_utf8_lossy(&body).trim()),
        }
    }
}

fn dechunk(mut body: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let at = body.windows(2).position(|w| w == b"\r\n").context("a malformed chunk")?;
        let size =
            usize::from_str_radix(String::from_utf8_lossy(&body[..at]).split(';').next().unwrap_or("").trim(), 16)?;
        body = &body[at + 2..];
        if size == 0 {
            return Ok(out);
        }
        out.extend_from_slice(body.get(..size).context("a short chunk")?);
        body = body.get(size + 2..).unwrap_or_default();
    }
}

/// The current context's server, token and CA (PEM) of a kubeconfig.
fn kubeconfig(path: &Path) -> anyhow::Result<(String, String, Option<Vec<u8>>)> {
    use base64::Engine as _;
    let text = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let file = ManifestFile::new(path.display().to_string(), text);
    let documents = gitplane_source::parse(&[file], &Limits::default()).map_err(|e| {
        anyhow::anyhow!("{}: {}", path.display(), e.first().map(ToString::to_string).unwrap_or_default())
    })?;
    let config = documents.into_iter().next().map(|d| d.value).unwrap_or_default();
    let current = config["current-context"].as_str().unwrap_or_default();
    let named = |list: &str, name: &str| -> Value {
        let items = config[list].as_array().cloned().unwrap_or_default();
        items.iter().find(|i| i["name"] == name).or(items.first()).cloned().unwrap_or_default()
    };
    let context = named("contexts", current);
    let cluster = named("clusters", context["context"]["cluster"].as_str().unwrap_or_default());
    let user = named("users", context["context"]["user"].as_str().unwrap_or_default());
    let server = cluster["cluster"]["server"].as_str().context("the kubeconfig names no server")?.to_owned();
    let token = user["user"]["token"].as_str().context("the kubeconfig's user has no token")?.to_owned();
    let ca = cluster["cluster"]["certificate-authority-data"]
        .as_str()
        .map(|b64| base64::engine::general_purpose::STANDARD.decode(b64))
        .transpose()
        .context("certificate-authority-data")?;
    Ok((server, token, ca))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clone_names_its_application_repository() {
        assert!(same_repository("demo", "http://git:t@127.0.0.1:8080/git/demo.git"));
        assert!(same_repository("demo", "https://10.0.0.1:6443/git/demo"));
        assert!(!same_repository("demo", "http://127.0.0.1:8080/git/demo2.git"));
        assert!(same_repository("https://example.com/org/app.git", "https://example.com/org/app"));
        assert!(!same_repository("https://example.com/org/app.git", "https://example.com/org/other.git"));
    }

    #[test]
    fn unified_diffs_as_diff_u_does() {
        let a = "a\nb\nc\nd\ne\nf\ng\nh\n";
        let b = "a\nb\nc\nD\ne\nf\ng\nh\ni\n";
        assert_eq!(unified("x", "y", a, b), "--- x\n+++ y\n@@ -1,8 +1,9 @@\n a\n b\n c\n-d\n+D\n e\n f\n g\n h\n+i\n");
        assert_eq!(unified("x", "y", "", "a\n"), "--- x\n+++ y\n@@ -0,0 +1,1 @@\n+a\n");
        assert_eq!(unified("x", "y", "a\n", ""), "--- x\n+++ y\n@@ -1,1 +0,0 @@\n-a\n");
        assert_eq!(unified("x", "y", "a\n", "a\n"), "");
    }

    #[test]
    fn file_names_follow_kubectl_diff() {
        let key = ObjectKey::from_value(&json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "default"}})).unwrap();
        assert_eq!(file_name(&key, "LIVE"), "/tmp/LIVE/apps.Deployment.default.web");
        let key = ObjectKey::from_value(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}}))
            .unwrap();
        assert_eq!(file_name(&key, "MERGED"), "/tmp/MERGED/v1.Namespace.x");
    }
}
