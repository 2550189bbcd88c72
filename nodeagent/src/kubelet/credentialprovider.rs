//! The kubelet's credential keyring (`pkg/credentialprovider`): the image pull Secrets of a Pod
//! (`kubernetes.io/dockerconfigjson`, `kubernetes.io/dockercfg`) as registry keys with their
//! credentials, and the credentials whose key matches an image: the host (with `*` globs per
//! label, and the port) and then a path prefix, most specific key first. Pure.

use base64::Engine as _;
use k8s_openapi::api::core::v1::Secret;
use std::collections::BTreeMap;

use super::registries::AuthConfig;

const DOCKER_CONFIG_JSON: &str = "kubernetes.io/dockerconfigjson";
const DOCKER_CONFIG_JSON_KEY: &str = ".dockerconfigjson";
const DOCKERCFG: &str = "kubernetes.io/dockercfg";
const DOCKERCFG_KEY: &str = ".dockercfg";
/// Docker Hub's key in Docker config files, and the host the kubelet files it under.
const DEFAULT_REGISTRY_HOST: &str = "index.docker.io";

/// One entry of a Docker config file.
#[derive(Debug, Default, serde::Deserialize)]
struct Entry {
    #[serde(default)]
    username: String,
    #[serde(default)]
    password: String,
    #[serde(default)]
    auth: String,
}

#[derive(Debug, serde::Deserialize)]
struct DockerConfigJson {
    #[serde(default)]
    auths: BTreeMap<String, Entry>,
}

/// Registry keys (`host[:port][/path]`) and their credentials.
#[derive(Debug, Default)]
pub struct Keyring {
    creds: BTreeMap<String, Vec<AuthConfig>>,
}

impl Keyring {
    /// The keyring of a Pod's pull Secrets, in order; Secrets of other types add nothing. An
    /// error names the Secret whose data is not a Docker config.
    pub fn from_secrets<'a>(secrets: impl IntoIterator<Item = &'a Secret>) -> Result<Keyring, String> {
        let mut keyring = Keyring::default();
        for secret in secrets {
            let name = secret.metadata.name.as_deref().unwrap_or_default();
            let data = |key: &str| secret.data.as_ref().and_then(|d| d.get(key)).map(|b| b.0.as_slice());
            let entries = match (secret.type_.as_deref(), data(DOCKER_CONFIG_JSON_KEY), data(DOCKERCFG_KEY)) {
                (Some(DOCKER_CONFIG_JSON), Some(json), _) => serde_json::from_slice::<DockerConfigJson>(json)
                    .map(|c| c.auths)
                    .map_err(|e| format!("Secret {name:?}: {DOCKER_CONFIG_JSON_KEY} is not a Docker config: {e}"))?,
                (Some(DOCKERCFG), _, Some(json)) => serde_json::from_slice::<BTreeMap<String, Entry>>(json)
                    .map_err(|e| format!("Secret {name:?}: {DOCKERCFG_KEY} is not a Docker config: {e}"))?,
                _ => continue,
            };
            for (location, entry) in entries {
                let auth = credentials(entry).map_err(|why| format!("Secret {name:?}: {location:?}: {why}"))?;
                keyring.creds.entry(key_of(&location)).or_default().push(auth);
            }
        }
        Ok(keyring)
    }

    /// The credentials for `image`, most specific key first; Docker Hub's for an image on Docker
    /// Hub when no key matches.
    pub fn lookup(&self, image: &str) -> Vec<AuthConfig> {
        // Reverse order puts `host/path` before `host`, as the kubelet sorts its index.
        let matched: Vec<AuthConfig> = self
            .creds
            .iter()
            .rev()
            .filter(|(key, _)| urls_match(key, image))
            .flat_map(|(_, creds)| creds.iter().cloned())
            .collect();
        if !matched.is_empty() {
            return matched;
        }
        match is_default_registry(image) {
            true => self.creds.get(DEFAULT_REGISTRY_HOST).cloned().unwrap_or_default(),
            false => Vec::new(),
        }
    }
}

/// An entry's username and password, from `auth` (`base64(user:password)`) when it has one.
fn credentials(entry: Entry) -> Result<AuthConfig, String> {
    let (mut username, mut password) = (entry.username, entry.password);
    if !entry.auth.is_empty() {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(entry.auth.trim())
            .map_err(|_| "auth is not base64".to_owned())?;
        let decoded = String::from_utf8(decoded).map_err(|_| "auth is not text".to_owned())?;
        let (user, pass) = decoded.split_once(':').ok_or("auth is not base64(username:password)")?;
        (username, password) = (user.to_owned(), pass.to_owned());
    }
    Ok(AuthConfig { username, password, ..AuthConfig::default() })
}

/// A Docker config location as the kubelet files it: no scheme, `/v1/` and `/v2/` meaning the
/// host itself.
fn key_of(location: &str) -> String {
    let rest = location.strip_prefix("https://").or_else(|| location.strip_prefix("http://")).unwrap_or(location);
    let (host, path) = rest.split_once('/').map_or((rest, ""), |(host, path)| (host, path));
    let path = path.strip_prefix("v1/").or_else(|| path.strip_prefix("v2/")).unwrap_or(path);
    match path.trim_end_matches('/') {
        "" => host.to_owned(),
        path => format!("{host}/{path}"),
    }
}

/// The kubelet's `URLsMatchStr`: same number of host labels, each matching its glob, the same
/// port, and the key's path a prefix of the image's.
fn urls_match(key: &str, image: &str) -> bool {
    let split = |url: &str| {
        let (host, path) = url.split_once('/').map_or((url, String::new()), |(h, p)| (h, format!("/{p}")));
        let (host, port) = host.split_once(':').map_or((host, ""), |(h, p)| (h, p));
        (host.to_owned(), port.to_owned(), path)
    };
    let ((key_host, key_port, key_path), (host, port, path)) = (split(key), split(image));
    let (globs, labels): (Vec<&str>, Vec<&str>) = (key_host.split('.').collect(), host.split('.').collect());
    globs.len() == labels.len()
        && globs.iter().zip(&labels).all(|(glob, label)| glob_match(glob, label))
        && key_port == port
        && path.starts_with(&key_path)
}

/// `*` matches any run of characters within one label (`filepath.Match` without classes).
fn glob_match(glob: &str, text: &str) -> bool {
    match glob.split_once('*') {
        None => glob == text,
        Some((head, tail)) => {
            let Some(rest) = text.strip_prefix(head) else { return false };
            (0..=rest.len()).filter(|i| rest.is_char_boundary(*i)).any(|i| glob_match(tail, &rest[i..]))
        }
    }
}

/// Whether `image` lives on Docker Hub (no host in its first component).
fn is_default_registry(image: &str) -> bool {
    match image.split_once('/') {
        None => !image.is_empty(),
        Some((first, _)) => first == "docker.io" || !first.contains(['.', ':']),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;

    fn secret(name: &str, type_: &str, key: &str, json: &str) -> Secret {
        Secret {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            type_: Some(type_.into()),
            data: Some([(key.to_owned(), ByteString(json.as_bytes().to_vec()))].into()),
            ..Default::default()
        }
    }

    fn users(creds: Vec<AuthConfig>) -> Vec<String> {
        creds.into_iter().map(|c| format!("{}:{}", c.username, c.password)).collect()
    }

    #[test]
    fn lookup_matches_host_then_path_prefix() {
        let config = r#"{"auths": {
            "https://index.docker.io/v1/": {"auth": "aHViOmh1YnBhc3M="},
            "registry.example:5000": {"username": "r", "password": "rp"},
            "registry.example:5000/team": {"username": "team", "password": "tp"},
            "*.mirror.example": {"username": "glob", "password": "gp"}
        }}"#;
        let cfg = r#"{"old.example": {"username": "old", "password": "op"}}"#;
        let secrets = [
            secret("json", DOCKER_CONFIG_JSON, DOCKER_CONFIG_JSON_KEY, config),
            secret("cfg", DOCKERCFG, DOCKERCFG_KEY, cfg),
            secret("opaque", "Opaque", DOCKER_CONFIG_JSON_KEY, "not json"),
        ];
        let keyring = Keyring::from_secrets(&secrets).expect("keyring");
        let cases: &[(&str, &[&str])] = &[
            ("registry.example:5000/team/app:1", &["team:tp", "r:rp"]),
            ("registry.example:5000/other/app", &["r:rp"]),
            ("registry.example/app", &[]),
            ("registry.example:5001/app", &[]),
            ("eu.mirror.example/app", &["glob:gp"]),
            ("a.eu.mirror.example/app", &[]),
            ("old.example/app", &["old:op"]),
            ("nginx:1.27", &["hub:hubpass"]),
            ("bitnami/redis", &["hub:hubpass"]),
            ("docker.io/library/nginx", &["hub:hubpass"]),
            ("quay.io/app", &[]),
        ];
        for (image, want) in cases {
            assert_eq!(users(keyring.lookup(image)), *want, "{image}");
        }
    }

    #[test]
    fn a_secret_that_is_not_a_docker_config_is_named() {
        let cases = [
            (secret("bad", DOCKER_CONFIG_JSON, DOCKER_CONFIG_JSON_KEY, "{"), "Secret \"bad\": .dockerconfigjson"),
            (
                secret("bad64", DOCKER_CONFIG_JSON, DOCKER_CONFIG_JSON_KEY, r#"{"auths": {"r": {"auth": "%%"}}}"#),
                "Secret \"bad64\": \"r\": auth is not base64",
            ),
            (
                secret("nocolon", DOCKERCFG, DOCKERCFG_KEY, r#"{"r": {"auth": "dXNlcg=="}}"#),
                "Secret \"nocolon\": \"r\": auth is not base64(username:password)",
            ),
        ];
        for (secret, want) in cases {
            let e = Keyring::from_secrets([&secret]).expect_err(want);
            assert!(e.starts_with(want), "{e}");
        }
    }

    #[test]
    fn keys_drop_the_scheme_and_api_version() {
        let cases = [
            ("https://index.docker.io/v1/", "index.docker.io"),
            ("http://r.example:5000/v2/", "r.example:5000"),
            ("r.example/team/", "r.example/team"),
            ("r.example", "r.example"),
        ];
        for (location, key) in cases {
            assert_eq!(key_of(location), key, "{location}");
        }
    }
}
