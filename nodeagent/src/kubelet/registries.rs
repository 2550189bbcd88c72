//! Registry mirrors and credentials for the whole node from one file, k3s' `registries.yaml`:
//!
//! ```yaml
//! mirrors:
//!   docker.io: {endpoint: ["http://172.29.0.1:5000"]}
//!   "*": {endpoint: ["https://mirror.example"]}      # every registry without its own entry
//!   registry.example:5000: {endpoint: ["http://registry.example:5000"]}  # plain HTTP
//! configs:
//!   mirror.example: {auth: {username: u, password: p}, tls: {ca_file: /etc/ca.pem}}
//! ```
//!
//! Pure: the file's text in, containerd's `hosts.toml` files (its `config_path` layout) and the
//! CRI pull credentials out. As in k3s, a registry's own default endpoint stays the last resort
//! after its mirrors, and an endpoint on the registry's own host replaces that default (how a
//! plain-HTTP registry is named).

use std::collections::BTreeMap;

/// The wildcard mirror: every registry without a mirror of its own.
pub const WILDCARD: &str = "*";

/// A `registries.yaml`.
#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Registries {
    /// Registry host (or `*`) -> where its images are pulled from, in order.
    #[serde(default)]
    pub mirrors: BTreeMap<String, Mirror>,
    /// Registry or endpoint host -> its credentials and TLS.
    #[serde(default)]
    pub configs: BTreeMap<String, RegistryConfig>,
}

#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mirror {
    #[serde(default)]
    pub endpoint: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistryConfig {
    pub auth: Option<Auth>,
    pub tls: Option<Tls>,
}

#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Auth {
    #[serde(default)]
    pub username: String,
    #[serde(default)]
    pub password: String,
    /// `base64(username:password)`, as in a Docker config.
    #[serde(default)]
    pub auth: String,
    #[serde(default)]
    pub identity_token: String,
}

#[derive(Clone, Debug, Default, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tls {
    pub ca_file: Option<String>,
    pub cert_file: Option<String>,
    pub key_file: Option<String>,
    #[serde(default)]
    pub insecure_skip_verify: bool,
}

/// What CRI PullImage is given to authenticate (CRI's `AuthConfig`). An empty
/// `server_address` lets the runtime send it to whichever host it pulls from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuthConfig {
    pub username: String,
    pub password: String,
    pub auth: String,
    pub server_address: String,
    pub identity_token: String,
}

#[derive(Debug, thiserror::Error, PartialEq)]
#[error("registries file {file}: {why}")]
pub struct RegistriesError {
    pub file: String,
    pub why: String,
}

impl Registries {
    /// Parses and checks `text`, the contents of `file`; errors name the file and the key.
    pub fn parse(file: &str, text: &str) -> Result<Registries, RegistriesError> {
        let error = |why: String| RegistriesError { file: file.to_owned(), why };
        // An empty file is a file with no mirrors.
        let registries: Registries = match serde_yaml::from_str::<Option<Registries>>(text) {
            Ok(parsed) => parsed.unwrap_or_default(),
            Err(e) => return Err(error(e.to_string())),
        };
        for (registry, mirror) in &registries.mirrors {
            if registry.is_empty() || registry.contains(['/', ' ']) {
                return Err(error(format!("mirrors.{registry:?}: not a registry host (host[:port], or \"*\")")));
            }
            for (i, endpoint) in mirror.endpoint.iter().enumerate() {
                if endpoint_host(endpoint).is_none() {
                    return Err(error(format!(
                        "mirrors.{registry:?}.endpoint[{i}]: {endpoint:?} is not an http:// or https:// URL with a host"
                    )));
                }
            }
        }
        for (host, config) in &registries.configs {
            if host == WILDCARD || host.is_empty() || host.contains(['/', ' ']) {
                return Err(error(format!("configs.{host:?}: not a registry or endpoint host (host[:port])")));
            }
            if let Some(tls) = &config.tls
                && tls.cert_file.is_some() != tls.key_file.is_some()
            {
                return Err(error(format!("configs.{host:?}.tls: cert_file and key_file go together")));
            }
        }
        Ok(registries)
    }

    /// containerd's `config_path` directory: (directory name, `hosts.toml` text) for each
    /// registry with a mirror or a TLS setting (`_default` for the wildcard).
    pub fn hosts_files(&self) -> Vec<(String, String)> {
        let mut files = Vec::new();
        for (registry, mirror) in &self.mirrors {
            let dir = if registry == WILDCARD { "_default".to_owned() } else { registry.clone() };
            files.push((dir, self.hosts_toml(registry, &mirror.endpoint)));
        }
        for (host, config) in &self.configs {
            if config.tls.is_some() && !self.mirrors.contains_key(host) {
                files.push((host.clone(), self.hosts_toml(host, &[])));
            }
        }
        files
    }

    /// One registry's `hosts.toml`: its mirrors in order, then its own endpoint (`server`).
    fn hosts_toml(&self, registry: &str, endpoints: &[String]) -> String {
        let own = |endpoint: &&String| registry != WILDCARD && endpoint_host(endpoint) == Some(registry);
        let server = match endpoints.iter().find(own) {
            Some(server) => Some(server.trim_end_matches('/').to_owned()),
            None if registry != WILDCARD => Some(format!("https://{}", default_endpoint(registry))),
            None => None,
        };
        let mut hosts: Vec<&str> = endpoints.iter().filter(|e| !own(e)).map(|e| e.trim_end_matches('/')).collect();
        // containerd 1.6 takes a hosts.toml without `[host]` tables for a broken file and falls
        // back to HTTPS on the registry's host: the server is then its one `[host]` too.
        if hosts.is_empty() {
            hosts.extend(server.as_deref());
        }
        let mut text = String::new();
        if let Some(server) = &server {
            text.push_str(&format!("server = {}\n", quote(server)));
            text.push_str(&self.tls_lines(registry, ""));
        }
        for endpoint in hosts {
            text.push_str(&format!("\n[host.{}]\n", quote(endpoint)));
            text.push_str("  capabilities = [\"pull\", \"resolve\"]\n");
            text.push_str(&self.tls_lines(endpoint_host(endpoint).unwrap_or_default(), "  "));
        }
        text
    }

    fn tls_lines(&self, host: &str, indent: &str) -> String {
        let Some(tls) = self.configs.get(host).and_then(|c| c.tls.as_ref()) else { return String::new() };
        let mut lines = String::new();
        if let Some(ca) = &tls.ca_file {
            lines.push_str(&format!("{indent}ca = {}\n", quote(ca)));
        }
        if let (Some(cert), Some(key)) = (&tls.cert_file, &tls.key_file) {
            lines.push_str(&format!("{indent}client = [[{}, {}]]\n", quote(cert), quote(key)));
        }
        if tls.insecure_skip_verify {
            lines.push_str(&format!("{indent}skip_verify = true\n"));
        }
        lines
    }

    /// The credentials of the first host `image` is pulled from (its mirrors in order, then
    /// its registry) that has `auth` in `configs`, bound to that host. CRI takes one set per
    /// pull, so later hosts are pulled from anonymously.
    pub fn auth_for(&self, image: &str) -> Option<AuthConfig> {
        let registry = image_registry(image);
        let mirror = self.mirrors.get(registry).or_else(|| self.mirrors.get(WILDCARD));
        let hosts = mirror.into_iter().flat_map(|m| m.endpoint.iter().filter_map(|e| endpoint_host(e)));
        hosts.chain([registry]).find_map(|host| {
            let auth = self.configs.get(host)?.auth.as_ref()?;
            Some(AuthConfig {
                username: auth.username.clone(),
                password: auth.password.clone(),
                auth: auth.auth.clone(),
                identity_token: auth.identity_token.clone(),
                server_address: default_endpoint(host).to_owned(),
            })
        })
    }
}

/// Where a registry is served when no endpoint says otherwise (Docker Hub's API host).
fn default_endpoint(registry: &str) -> &str {
    if registry == "docker.io" { "registry-1.docker.io" } else { registry }
}

/// The `host[:port]` of an `http://` or `https://` endpoint URL.
fn endpoint_host(endpoint: &str) -> Option<&str> {
    let rest = endpoint.strip_prefix("https://").or_else(|| endpoint.strip_prefix("http://"))?;
    let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
    (!host.is_empty() && !host.contains(['@', ' '])).then_some(host)
}

/// The registry host an image reference names, as Docker normalises it: the first path
/// component when it looks like a host (has `.` or `:`, or is `localhost`), else `docker.io`.
pub fn image_registry(image: &str) -> &str {
    match image.split_once('/') {
        Some((first, _)) if first.contains(['.', ':']) || first == "localhost" => first,
        _ => "docker.io",
    }
}

/// A TOML basic string (JSON's string syntax is one).
fn quote(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "/etc/gitplane/registries.yaml";

    fn parse(text: &str) -> Registries {
        Registries::parse(FILE, text).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn hosts_files_put_mirrors_before_the_registry_itself() {
        let cases: &[(&str, &[(&str, &str)])] = &[
            ("", &[]),
            (
                "mirrors: {docker.io: {endpoint: [\"http://172.29.0.1:5000/\"]}}",
                &[(
                    "docker.io",
                    "server = \"https://registry-1.docker.io\"\n\n[host.\"http://172.29.0.1:5000\"]\n  capabilities = [\"pull\", \"resolve\"]\n",
                )],
            ),
            // An endpoint on the registry's own host is its server: plain HTTP, no fallback.
            (
                "mirrors: {\"172.29.0.1:5001\": {endpoint: [\"http://172.29.0.1:5001\"]}}",
                &[(
                    "172.29.0.1:5001",
                    "server = \"http://172.29.0.1:5001\"\n\n[host.\"http://172.29.0.1:5001\"]\n  capabilities = [\"pull\", \"resolve\"]\n",
                )],
            ),
            (
                "mirrors: {\"*\": {endpoint: [\"https://m.example\"]}}\nconfigs: {m.example: {tls: {insecure_skip_verify: true}}}",
                &[
                    (
                        "_default",
                        "\n[host.\"https://m.example\"]\n  capabilities = [\"pull\", \"resolve\"]\n  skip_verify = true\n",
                    ),
                    (
                        "m.example",
                        "server = \"https://m.example\"\nskip_verify = true\n\n[host.\"https://m.example\"]\n  capabilities = [\"pull\", \"resolve\"]\n  skip_verify = true\n",
                    ),
                ],
            ),
            (
                "configs: {r.example: {tls: {ca_file: /ca.pem, cert_file: /c.pem, key_file: /k.pem}}}",
                &[(
                    "r.example",
                    "server = \"https://r.example\"\nca = \"/ca.pem\"\nclient = [[\"/c.pem\", \"/k.pem\"]]\n\n\
                     [host.\"https://r.example\"]\n  capabilities = [\"pull\", \"resolve\"]\n  ca = \"/ca.pem\"\n  client = [[\"/c.pem\", \"/k.pem\"]]\n",
                )],
            ),
        ];
        for (text, want) in cases {
            let want: Vec<(String, String)> = want.iter().map(|(d, t)| (d.to_string(), t.to_string())).collect();
            assert_eq!(parse(text).hosts_files(), want, "{text}");
        }
    }

    #[test]
    fn auth_goes_to_the_first_host_pulled_from_that_has_it() {
        let registries = parse(
            "mirrors:\n  docker.io: {endpoint: [\"http://m1:5000\", \"https://m2\"]}\n  \"*\": {endpoint: [\"https://any\"]}\n\
             configs:\n  m2: {auth: {username: u2, password: p2}}\n  docker.io: {auth: {auth: dTpw}}\n  any: {auth: {identity_token: t}}\n  q.example: {auth: {username: q, password: qp}}\n",
        );
        let cases: &[(&str, Option<(&str, &str)>)] = &[
            ("nginx:1.27", Some(("m2", "u2"))),
            ("docker.io/library/nginx", Some(("m2", "u2"))),
            ("quay.io/x/y:1", Some(("any", ""))),
            ("q.example/app", Some(("any", ""))),
            ("localhost/app", Some(("any", ""))),
        ];
        for (image, want) in cases {
            let got = registries.auth_for(image);
            assert_eq!(got.as_ref().map(|a| (a.server_address.as_str(), a.username.as_str())), *want, "{image}");
        }
        let plain =
            parse("configs:\n  docker.io: {auth: {auth: dTpw}}\n  q.example: {auth: {username: q, password: qp}}\n");
        assert_eq!(
            plain.auth_for("nginx").map(|a| (a.server_address, a.auth)),
            Some(("registry-1.docker.io".into(), "dTpw".into()))
        );
        assert_eq!(plain.auth_for("q.example/app").map(|a| a.password), Some("qp".into()));
        assert_eq!(plain.auth_for("quay.io/app"), None);
    }

    #[test]
    fn image_registry_follows_dockers_normalisation() {
        let cases = [
            ("nginx", "docker.io"),
            ("library/nginx:1", "docker.io"),
            ("registry.k8s.io/nginx-slim:0.8", "registry.k8s.io"),
            ("localhost/app", "localhost"),
            ("172.29.0.1:5000/app@sha256:ab", "172.29.0.1:5000"),
            ("user/app", "docker.io"),
        ];
        for (image, want) in cases {
            assert_eq!(image_registry(image), want, "{image}");
        }
    }

    #[test]
    fn bad_files_are_refused_naming_the_key() {
        let cases = [
            ("mirrors: {docker.io: {endpont: []}}", "unknown field `endpont`"),
            ("mirrors: {docker.io: {endpoint: [\"ftp://x\"]}}", "mirrors.\"docker.io\".endpoint[0]: \"ftp://x\""),
            ("mirrors: {\"a/b\": {endpoint: []}}", "mirrors.\"a/b\": not a registry host"),
            ("configs: {\"*\": {auth: {username: u}}}", "configs.\"*\": not a registry"),
            ("configs: {r: {tls: {cert_file: /c}}}", "configs.\"r\".tls: cert_file and key_file go together"),
            ("mirrors: [1]", "invalid type"),
        ];
        for (text, want) in cases {
            let e = Registries::parse(FILE, text).expect_err(text).to_string();
            assert!(e.starts_with(&format!("registries file {FILE}: ")) && e.contains(want), "{text}: {e}");
        }
    }
}
