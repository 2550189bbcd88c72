//! The audit log of the status API: one JSON line per request, saying who did what to which
//! object and how it was answered (kube-apiserver's audit at level Metadata), never a value, a
//! query, a token or a body. Written by a thread of its own so that a slow disk never holds a
//! request: when its queue is full, lines are dropped and counted. The file is rotated by size
//! (`audit.log` -> `audit.log.1`, one old file kept), so it costs at most twice its limit.

use std::{
    fs::File,
    io::Write as _,
    os::unix::fs::OpenOptionsExt as _,
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
        mpsc::{SyncSender, TrySendError},
    },
};

/// The default size at which the log is rotated.
pub const MAX_BYTES: u64 = 10 << 20;
const QUEUE: usize = 4096;

/// What a request did, in Kubernetes' words (`RequestInfo`).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestInfo {
    pub verb: String,
    #[serde(skip_serializing_if = "str::is_empty")]
    pub api_group: String,
    #[serde(skip_serializing_if = "str::is_empty")]
    pub resource: String,
    #[serde(skip_serializing_if = "str::is_empty")]
    pub subresource: String,
    #[serde(skip_serializing_if = "str::is_empty")]
    pub namespace: String,
    #[serde(skip_serializing_if = "str::is_empty")]
    pub name: String,
    /// For paths that name no resource (`/api`, `/version`, …): the path itself.
    #[serde(skip_serializing_if = "str::is_empty")]
    pub path: String,
}

impl RequestInfo {
    /// Kube-apiserver's `RequestInfoFactory`, for what the status API serves: the verb from the
    /// method (and `watch`), the rest from the path. `query` is only looked at for `watch`.
    pub fn new(method: &str, path: &str, query: Option<&str>) -> RequestInfo {
        let parts: Vec<&str> = path.trim_matches('/').split('/').filter(|p| !p.is_empty()).collect();
        let (group, rest) = match parts.as_slice() {
            ["api", _version, rest @ ..] if !rest.is_empty() => ("", rest),
            ["apis", group, _version, rest @ ..] if !rest.is_empty() => (*group, rest),
            _ => {
                return RequestInfo { verb: method.to_ascii_lowercase(), path: path.to_owned(), ..Default::default() };
            }
        };
        let (namespace, rest) = match rest {
            // `namespaces/<ns>` is the Namespace itself; `namespaces/<ns>/<resource>…` is inside it.
            ["namespaces", ns, rest @ ..] if !rest.is_empty() => (*ns, rest),
            _ => ("", rest),
        };
        let resource = rest.first().copied().unwrap_or_default();
        let name = rest.get(1).copied().unwrap_or_default();
        let subresource = rest.get(2).copied().unwrap_or_default();
        let watch = query
            .is_some_and(|q| q.split('&').any(|kv| matches!(kv, "watch=1" | "watch=true" | "watch=True" | "watch")));
        let verb = match method {
            "GET" | "HEAD" if watch => "watch",
            "GET" | "HEAD" if name.is_empty() => "list",
            "GET" | "HEAD" => "get",
            "POST" => "create",
            "PUT" => "update",
            "PATCH" => "patch",
            "DELETE" if name.is_empty() => "deletecollection",
            "DELETE" => "delete",
            other => {
                return RequestInfo { verb: other.to_ascii_lowercase(), path: path.to_owned(), ..Default::default() };
            }
        };
        RequestInfo {
            verb: verb.into(),
            api_group: group.into(),
            resource: resource.into(),
            subresource: subresource.into(),
            namespace: namespace.into(),
            name: name.into(),
            path: String::new(),
        }
    }
}

/// One line of the log.
#[derive(serde::Serialize)]
struct Line<'a> {
    time: String,
    user: &'a str,
    #[serde(rename = "sourceIP")]
    source_ip: String,
    #[serde(flatten)]
    request: &'a RequestInfo,
    code: u16,
    /// Why the authorizer decided as it did (RBAC: the binding that allowed, or that none did).
    #[serde(rename = "authorizationReason", skip_serializing_if = "str::is_empty")]
    reason: &'a str,
}

/// Where the lines go; cheap to clone.
#[derive(Clone)]
pub struct AuditLog {
    lines: Option<SyncSender<String>>,
    dropped: Arc<AtomicU64>,
}

impl AuditLog {
    /// A log that records nothing (in-process tests).
    #[cfg(test)]
    pub fn disabled() -> AuditLog {
        AuditLog { lines: None, dropped: Arc::default() }
    }

    /// Appends to `path` (mode 0600), rotated at `max_bytes`.
    pub fn open(path: &Path, max_bytes: u64) -> std::io::Result<AuditLog> {
        let mut writer = Writer { path: path.to_owned(), max_bytes, file: open_append(path)?, size: 0 };
        writer.size = writer.file.metadata()?.len();
        let (lines, queue) = std::sync::mpsc::sync_channel::<String>(QUEUE);
        std::thread::Builder::new().name("audit-log".into()).spawn(move || {
            for line in queue {
                if let Err(e) = writer.write(&line) {
                    tracing::warn!(file = %writer.path.display(), error = %e, "writing the audit log failed");
                }
            }
        })?;
        Ok(AuditLog { lines: Some(lines), dropped: Arc::default() })
    }

    /// Records one answered request.
    pub fn record(&self, user: &str, source: std::net::IpAddr, request: &RequestInfo, code: u16) {
        self.record_decision(user, source, request, code, "");
    }

    /// Records one answered request with the authorizer's reason.
    pub fn record_decision(
        &self,
        user: &str,
        source: std::net::IpAddr,
        request: &RequestInfo,
        code: u16,
        reason: &str,
    ) {
        let Some(lines) = &self.lines else { return };
        let time = k8s_openapi::jiff::Timestamp::now().to_string();
        let line = Line { time, user, source_ip: source.to_string(), request, code, reason };
        let Ok(mut text) = serde_json::to_string(&line) else { return };
        text.push('\n');
        if let Err(TrySendError::Full(_)) = lines.try_send(text) {
            let dropped = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if dropped.is_power_of_two() {
                tracing::warn!(dropped, "the audit log cannot keep up: lines dropped");
            }
        }
    }
}

struct Writer {
    path: PathBuf,
    max_bytes: u64,
    file: File,
    size: u64,
}

impl Writer {
    fn write(&mut self, line: &str) -> std::io::Result<()> {
        if self.size > 0 && self.size + line.len() as u64 > self.max_bytes {
            let mut old = self.path.clone().into_os_string();
            old.push(".1");
            std::fs::rename(&self.path, &old)?;
            self.file = open_append(&self.path)?;
            self.size = 0;
        }
        self.file.write_all(line.as_bytes())?;
        self.size += line.len() as u64;
        Ok(())
    }
}

fn open_append(path: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new().create(true).append(true).mode(0o600).open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(method: &str, path: &str, query: Option<&str>) -> String {
        let i = RequestInfo::new(method, path, query);
        format!("{} {}|{}|{}|{}|{}|{}", i.verb, i.api_group, i.resource, i.subresource, i.namespace, i.name, i.path)
    }

    #[test]
    fn requests_are_named_as_kubernetes_names_them() {
        let cases = [
            ("GET", "/api/v1/pods", None, "list |pods||||"),
            ("GET", "/api/v1/namespaces/default/pods", Some("limit=5"), "list |pods||default||"),
            ("GET", "/api/v1/namespaces/default/pods", Some("watch=1&resourceVersion=3"), "watch |pods||default||"),
            ("GET", "/api/v1/namespaces/default/pods/web-1/log", Some("follow=true"), "get |pods|log|default|web-1|"),
            ("GET", "/api/v1/namespaces/kube-system", None, "get |namespaces|||kube-system|"),
            ("GET", "/apis/apps/v1/namespaces/a/deployments/web", None, "get apps|deployments||a|web|"),
            ("GET", "/apis/gitplane.io/v1/applications", None, "list gitplane.io|applications||||"),
            ("DELETE", "/api/v1/namespaces/a/secrets/s", None, "delete |secrets||a|s|"),
            ("POST", "/api/v1/namespaces/a/pods", None, "create |pods||a||"),
            ("GET", "/api", None, "get |||||/api"),
            ("GET", "/apis/apps/v1", None, "get |||||/apis/apps/v1"),
            ("GET", "/version", None, "get |||||/version"),
        ];
        for (method, path, query, expected) in cases {
            assert_eq!(info(method, path, query), expected, "{method} {path}");
        }
    }

    #[test]
    fn lines_carry_no_values_and_the_file_rotates() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let log = AuditLog::open(&path, 600).unwrap();
        let request = RequestInfo::new("GET", "/api/v1/namespaces/a/secrets/s", Some("labelSelector=secret%3Dv"));
        for _ in 0..6 {
            log.record("alice", [192, 0, 2, 7].into(), &request, 200);
        }
        let rotated = dir.path().join("audit.log.1");
        let ok = wait(|| rotated.exists() && std::fs::read_to_string(&path).is_ok_and(|t| !t.is_empty()));
        assert!(ok, "the log was not rotated");
        let text = std::fs::read_to_string(&path).unwrap() + &std::fs::read_to_string(&rotated).unwrap();
        let first: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        assert_eq!(first["user"], "alice");
        assert_eq!(first["verb"], "get");
        assert_eq!(first["resource"], "secrets");
        assert_eq!(first["namespace"], "a");
        assert_eq!(first["name"], "s");
        assert_eq!(first["code"], 200);
        assert_eq!(first["sourceIP"], "192.0.2.7");
        assert!(!text.contains("labelSelector"), "{text}");
        assert!(std::fs::metadata(&path).unwrap().len() <= 600);
    }

    pub(super) fn wait(done: impl Fn() -> bool) -> bool {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            if done() {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        false
    }
}
