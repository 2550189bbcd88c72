//! A real image registry for end-to-end tests: Debian's `docker-registry` (the CNCF
//! distribution registry), holding stand-ins of published images so that published manifests
//! run unchanged on a [`LocalCluster`] that has no Internet.
//!
//! The registry runs in the cluster's bridge namespace (`<base>-net`, where the nodes reach the
//! control plane), on the bridge's address (`172.29.0.1:port`): every node reaches it, nothing else does. Nodes learn
//! of it from a registries file (`gitplane up --registries`, k3s' `registries.yaml`), which
//! must exist before the cluster starts, so a test goes:
//!
//! ```no_run
//! # fn main() -> anyhow::Result<()> {
//! use gitplane_testkit::{LocalCluster, registry::{self, Registry, StandIn}};
//! let dir = tempfile::tempdir()?;
//! let mirror = registry::address(5000);
//! // Every image is pulled from the registry at `mirror` first.
//! let file = registry::write_registries_file(dir.path(), mirror, &[])?;
//! let cluster = LocalCluster::up_with("web", 1, &["--registries", &file.to_string_lossy()])?;
//! let registry = Registry::start(&dir.path().join("mirror"), &cluster, mirror, None)?;
//! registry.push_stand_in("registry.k8s.io/nginx-slim:0.8", &StandIn::nginx())?;
//! // ... push a manifest with `image: registry.k8s.io/nginx-slim:0.8` as published.
//! # Ok(()) }
//! ```
//!
//! A registry with `Some(credentials)` requires them (htpasswd, bcrypt from apache2-utils'
//! `htpasswd`); give its address in `direct` so nodes pull from it over plain HTTP by its own
//! name. Dropping a [`Registry`] kills its process (by PID); drop it before the cluster.

use crate::{LocalCluster, node::GATEWAY, wait_for};
use anyhow::{Context as _, Result, bail, ensure};
use base64::Engine as _;
use serde_json::Value;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, SocketAddrV4, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// How long a registry may take to answer once started.
const START: Duration = Duration::from_secs(30);
const TIMEOUT: Duration = Duration::from_secs(30);

/// A registry address on the nodes' bridge (any port: the namespace is the cluster's own).
pub fn address(port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(GATEWAY, port)
}

/// A user and password a registry requires.
#[derive(Clone, Debug)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

/// Writes `dir/registries.yaml` for `gitplane up --registries`: every registry's images pulled
/// from the registry at `mirror` first (the wildcard mirror), and each of `direct` a registry
/// reached over plain HTTP by its own address. Returns the file's path.
pub fn write_registries_file(dir: &Path, mirror: SocketAddrV4, direct: &[SocketAddrV4]) -> Result<PathBuf> {
    let mut text = format!("mirrors:\n  \"*\": {{endpoint: [\"http://{mirror}\"]}}\n");
    for address in direct {
        text.push_str(&format!("  \"{address}\": {{endpoint: [\"http://{address}\"]}}\n"));
    }
    let path = dir.join("registries.yaml");
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// A `docker-registry` process serving `address` in a cluster's bridge namespace.
pub struct Registry {
    child: Child,
    netns: PathBuf,
    address: SocketAddrV4,
    credentials: Option<Credentials>,
    dir: PathBuf,
}

impl Registry {
    /// Starts a registry keeping its config, storage and log in `dir`, listening on `address`
    /// (see [`address`]) in `cluster`'s bridge namespace; with `credentials`, it requires them.
    /// Waits until it answers.
    pub fn start(
        dir: &Path,
        cluster: &LocalCluster,
        address: SocketAddrV4,
        credentials: Option<Credentials>,
    ) -> Result<Registry> {
        ensure!(address.ip() == &GATEWAY, "a registry listens on the nodes' bridge ({GATEWAY}), not {address}");
        std::fs::create_dir_all(dir)?;
        let dir = std::path::absolute(dir)?;
        let mut config = format!(
            "version: 0.1\nlog: {{level: warn, accesslog: {{disabled: true}}}}\n\
             storage: {{filesystem: {{rootdirectory: {:?}}}, delete: {{enabled: true}}}}\n\
             http: {{addr: \"{address}\", secret: gitplane-e2e}}\n",
            dir.join("storage")
        );
        if let Some(c) = &credentials {
            let htpasswd = dir.join("htpasswd");
            let out = Command::new("htpasswd")
                .args(["-Bbn", &c.username, &c.password])
                .output()
                .context("running htpasswd: apt-get install apache2-utils")?;
            ensure!(out.status.success(), "htpasswd: {}", String::from_utf8_lossy(&out.stderr));
            std::fs::write(&htpasswd, &out.stdout)?;
            config.push_str(&format!("auth: {{htpasswd: {{realm: gitplane-e2e, path: {htpasswd:?}}}}}\n"));
        }
        let config_file = dir.join("config.yml");
        std::fs::write(&config_file, config)?;
        let log = std::fs::File::create(dir.join("registry.log"))?;
        let netns = cluster.netns(&format!("{}-net", cluster.base));
        let child = Command::new("nsenter")
            .arg(format!("--net={}", netns.display()))
            .arg("--")
            .arg("docker-registry")
            .arg("serve")
            .arg(&config_file)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting docker-registry (apt-get install docker-registry)")?;
        let registry = Registry { child, netns, address, credentials, dir };
        let answered = wait_for(START, || {
            // 401 without credentials is an answer too.
            registry.request("GET", "/v2/", &[], &[]).ok().filter(|r| r.status == 200 || r.status == 401)
        });
        if answered.is_none() {
            bail!("docker-registry on {address} did not answer within {START:?}:\n{}", registry.log());
        }
        Ok(registry)
    }

    pub fn address(&self) -> SocketAddrV4 {
        self.address
    }

    /// What the registry logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("registry.log")).unwrap_or_default()
    }

    /// Builds `stand_in` from the host's busybox and pushes it as image `name`
    /// (`registry.k8s.io/nginx-slim:0.8`), stored as its repository path without the registry
    /// host (`nginx-slim`; `nginx` is `library/nginx`), where a mirror is asked for it.
    pub fn push_stand_in(&self, name: &str, stand_in: &StandIn) -> Result<()> {
        let (repository, tag) = repository_and_tag(name)?;
        let work = tempfile::tempdir()?;
        let layout = build(work.path(), name, stand_in)?;
        let index: Value = serde_json::from_slice(&std::fs::read(layout.join("index.json"))?)?;
        let manifest_digest = index["manifests"][0]["digest"].as_str().context("index.json has a manifest")?;
        let blob = |digest: &str| std::fs::read(layout.join("blobs/sha256").join(digest.trim_start_matches("sha256:")));
        let manifest = blob(manifest_digest)?;
        let parsed: Value = serde_json::from_slice(&manifest)?;
        let layers = parsed["layers"].as_array().context("manifest has layers")?;
        for descriptor in layers.iter().chain([&parsed["config"]]) {
            let digest = descriptor["digest"].as_str().context("descriptor has a digest")?;
            self.push_blob(&repository, digest, &blob(digest)?)?;
        }
        let content_type = ("Content-Type", "application/vnd.oci.image.manifest.v1+json");
        let response = self.request("PUT", &format!("/v2/{repository}/manifests/{tag}"), &[content_type], &manifest)?;
        ensure!(response.status == 201, "pushing manifest {name}: {}", response.describe());
        Ok(())
    }

    fn push_blob(&self, repository: &str, digest: &str, data: &[u8]) -> Result<()> {
        if self.request("HEAD", &format!("/v2/{repository}/blobs/{digest}"), &[], &[])?.status == 200 {
            return Ok(());
        }
        let started = self.request("POST", &format!("/v2/{repository}/blobs/uploads/"), &[], &[])?;
        ensure!(started.status == 202, "starting an upload to {repository}: {}", started.describe());
        let location = started.header("location").context("upload has a Location")?;
        // The Location may be absolute; the path is what is asked on the same connection.
        let path =
            location.split_once("://").and_then(|(_, rest)| rest.find('/').map(|i| &rest[i..])).unwrap_or(location);
        let separator = if path.contains('?') { '&' } else { '?' };
        let content_type = ("Content-Type", "application/octet-stream");
        let done = self.request("PUT", &format!("{path}{separator}digest={digest}"), &[content_type], data)?;
        ensure!(done.status == 201, "uploading {digest} to {repository}: {}", done.describe());
        Ok(())
    }

    /// One HTTP/1.0 exchange with the registry from inside its namespace (HTTP/1.0: no chunked
    /// answers), with its credentials if it has some.
    fn request(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Result<Response> {
        let addr = SocketAddr::V4(self.address);
        let mut stream = gitplane_kubelet::netns::in_netns(&self.netns, || TcpStream::connect_timeout(&addr, TIMEOUT))
            .with_context(|| format!("connecting to the registry at {addr}"))?;
        stream.set_read_timeout(Some(TIMEOUT))?;
        stream.set_write_timeout(Some(TIMEOUT))?;
        let mut head = format!("{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Length: {}\r\n", body.len());
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        if let Some(c) = &self.credentials {
            let basic = base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", c.username, c.password));
            head.push_str(&format!("Authorization: Basic {basic}\r\n"));
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes())?;
        stream.write_all(body)?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response)?;
        Response::parse(&response).with_context(|| format!("{method} http://{addr}{path}"))
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        // Our own child, not yet reaped: its pid is still ours.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An image that stands in for a published one: the host's static busybox with every applet by
/// name, scripts in `/bin` (the published image's programs) and other files, run as the
/// published image's Entrypoint and Cmd say, so manifests that use it run unchanged.
#[derive(Clone, Debug, Default)]
pub struct StandIn {
    pub entrypoint: Vec<String>,
    pub cmd: Vec<String>,
    /// `/bin/<name>` scripts (`#!/bin/sh` …); `PATH` is `/bin`.
    pub scripts: Vec<(String, String)>,
    /// Other files: absolute path, contents.
    pub files: Vec<(String, String)>,
    pub exposed_ports: Vec<u16>,
}

impl StandIn {
    /// nginx (`nginx`, `registry.k8s.io/nginx-slim`): `nginx -g "daemon off;"` serving
    /// `/usr/share/nginx/html` on port 80, with busybox httpd.
    pub fn nginx() -> StandIn {
        let nginx = "#!/bin/sh\n# nginx's stand-in: busybox httpd serving nginx's document root on port 80.\n\
                     trap 'kill $pid 2>/dev/null; exit 0' TERM INT QUIT\n\
                     /bin/busybox httpd -f -p 80 -h /usr/share/nginx/html & pid=$!\nwait $pid\n";
        let index = "<!DOCTYPE html>\n<html><body><h1>Welcome to nginx!</h1></body></html>\n";
        StandIn {
            cmd: ["nginx", "-g", "daemon off;"].map(String::from).to_vec(),
            scripts: vec![("nginx".into(), nginx.into())],
            files: vec![("/usr/share/nginx/html/index.html".into(), index.into())],
            exposed_ports: vec![80],
            ..StandIn::default()
        }
    }
}

/// Builds `stand_in` as image `name` with the node agent's image build script; the OCI layout's
/// directory.
fn build(work: &Path, name: &str, stand_in: &StandIn) -> Result<PathBuf> {
    let root = work.join("root");
    for (program, text) in &stand_in.scripts {
        write_file(&root.join("bin").join(program), text, 0o755)?;
    }
    for (path, text) in &stand_in.files {
        write_file(&root.join(path.trim_start_matches('/')), text, 0o644)?;
    }
    std::fs::create_dir_all(&root)?;
    let json = |list: &[String]| serde_json::to_string(list).unwrap_or_default();
    let entrypoint = if stand_in.entrypoint.is_empty() { "null".to_owned() } else { json(&stand_in.entrypoint) };
    let mut config = String::new();
    if !stand_in.cmd.is_empty() {
        config.push_str(&format!(",\"Cmd\":{}", json(&stand_in.cmd)));
    }
    if !stand_in.exposed_ports.is_empty() {
        let ports: Vec<String> = stand_in.exposed_ports.iter().map(|p| format!("\"{p}/tcp\":{{}}")).collect();
        config.push_str(&format!(",\"ExposedPorts\":{{{}}}", ports.join(",")));
    }
    let out = work.join("out");
    let mut child = Command::new("sh")
        .arg("-s")
        .arg(&out)
        .env("STAND_IN_NAME", name)
        .env("STAND_IN_ROOT", &root)
        .env("STAND_IN_ENTRYPOINT", entrypoint)
        .env("STAND_IN_CONFIG", config)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("running the image build script")?;
    child.stdin.take().context("its stdin")?.write_all(gitplane_nodeagent::kubelet::images::BUILD_SCRIPT.as_bytes())?;
    let done = child.wait_with_output()?;
    ensure!(done.status.success(), "building stand-in {name}: {}", String::from_utf8_lossy(&done.stderr));
    let layout = work.join("layout");
    std::fs::create_dir_all(&layout)?;
    let status = Command::new("tar").arg("-xf").arg(out.join("stand-in.tar")).arg("-C").arg(&layout).status()?;
    ensure!(status.success(), "unpacking stand-in {name}: tar {status}");
    Ok(layout)
}

fn write_file(path: &Path, text: &str, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    std::fs::write(path, text)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    Ok(())
}

/// An image name's repository path in a registry and its tag, as Docker normalises the name:
/// `registry.k8s.io/nginx-slim:0.8` -> (`nginx-slim`, `0.8`), `nginx` -> (`library/nginx`,
/// `latest`).
fn repository_and_tag(name: &str) -> Result<(String, String)> {
    ensure!(!name.contains('@'), "{name}: push by tag, not by digest");
    let (registry, path) = match name.split_once('/') {
        Some((first, rest)) if first.contains(['.', ':']) || first == "localhost" => (first, rest),
        _ => ("docker.io", name),
    };
    let (repository, tag) = match path.rsplit_once(':') {
        Some((repository, tag)) if !tag.contains('/') => (repository, tag),
        _ => (path, "latest"),
    };
    // Docker Hub's official images live under library/.
    let repository = match registry == "docker.io" && !repository.contains('/') {
        true => format!("library/{repository}"),
        false => repository.to_owned(),
    };
    Ok((repository, tag.to_owned()))
}

struct Response {
    status: u16,
    head: String,
    body: String,
}

impl Response {
    fn parse(raw: &[u8]) -> Result<Response> {
        let text = String::from_utf8_lossy(raw);
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status = head.split(' ').nth(1).and_then(|code| code.parse().ok()).context("no HTTP status")?;
        Ok(Response { status, head: head.to_owned(), body: body.to_owned() })
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().skip(1).find_map(|line| {
            let (key, value) = line.split_once(':')?;
            key.trim().eq_ignore_ascii_case(name).then(|| value.trim())
        })
    }

    fn describe(&self) -> String {
        format!("{} {}", self.head.lines().next().unwrap_or_default(), self.body.trim())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repositories_are_named_as_docker_normalises_them() {
        let cases = [
            ("registry.k8s.io/nginx-slim:0.8", ("nginx-slim", "0.8")),
            ("nginx", ("library/nginx", "latest")),
            ("nginx:1.27", ("library/nginx", "1.27")),
            ("bitnami/redis:7", ("bitnami/redis", "7")),
            ("172.29.0.1:5001/private/app:1", ("private/app", "1")),
            ("localhost:5000/app", ("app", "latest")),
            ("quay.io/prometheus/node-exporter:v1.8.0", ("prometheus/node-exporter", "v1.8.0")),
        ];
        for (name, (repository, tag)) in cases {
            assert_eq!(repository_and_tag(name).unwrap(), (repository.to_owned(), tag.to_owned()), "{name}");
        }
    }
}
