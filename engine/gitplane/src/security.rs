//! What a replica sets up on start to serve privately (`gitplane server` and `gitplane up`
//! alike): the cluster CA (`tls`), the status API's tokens (`authn`), its audit log (`audit`),
//! and the kubeconfig for users (`kubeconfig`).

use crate::{
    credentials::{self, Credentials},
    kubeconfig,
};
use anyhow::Context as _;
use gitplane_apiserver::{
    audit::{self, AuditLog},
    authn::ApiAccess,
    authn::{self, Role},
    listener,
};
use gitplane_nodeservice::tls::{self, ClusterCa, ReplicaCertificate};
use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
};

pub struct Security {
    pub ca: Arc<ClusterCa>,
    pub access: ApiAccess,
    /// The first `read` token of the token file and its user, for the kubeconfig.
    reader: Option<(String, String)>,
    data_dir: PathBuf,
}

impl Security {
    /// `tokens_file`: the operator's (which must exist), else `<data-dir>/tokens.csv`, made on
    /// first start with one read token (the same on every replica: it is derived from the peer
    /// token), and read again whenever it changes. `anonymous_loopback_reads`: `gitplane up`'s.
    /// Call inside a tokio runtime.
    pub fn load(
        data_dir: &Path,
        credentials: &Credentials,
        tokens_file: Option<&Path>,
        anonymous_loopback_reads: bool,
    ) -> anyhow::Result<Security> {
        let ca = Arc::new(ClusterCa::derive(credentials.ca_seed())?);
        ca.write_certificate(&data_dir.join("ca.crt"))?;
        let (path, create) = match tokens_file {
            Some(path) => (path.to_path_buf(), false),
            None => (data_dir.join("tokens.csv"), true),
        };
        let entries = authn::load_or_create(&path, &credentials.first_read_token(), create)?;
        let reader = entries.iter().find(|e| e.user.has(Role::Read)).map(|e| (e.user.name.clone(), e.token.clone()));
        let audit_path = data_dir.join("audit.log");
        let audit = AuditLog::open(&audit_path, audit::MAX_BYTES)
            .with_context(|| format!("opening the audit log {}", audit_path.display()))?;
        let tokens = Arc::new(authn::Tokens::new(&entries));
        authn::follow(path, &tokens);
        let access = ApiAccess { tokens, service_accounts: None, rbac: None, anonymous_loopback_reads, audit };
        Ok(Security { ca, access, reader, data_dir: data_dir.to_path_buf() })
    }

    /// `tcp` as a listener serving TLS with `certificate`; clients on loopback may also speak
    /// cleartext (the listener tells them apart by the first byte), so a replica bound to
    /// loopback serves both, and kubectl, which sends a bearer token only over TLS, can use it.
    pub fn listener(
        &self,
        tcp: tokio::net::TcpListener,
        certificate: &ReplicaCertificate,
    ) -> anyhow::Result<listener::Listener> {
        let tls = Some(tokio_rustls::TlsAcceptor::from(self.ca.server_config(certificate)?));
        Ok(listener::Listener { tcp, tls })
    }

    /// Writes `<data-dir>/kubeconfig` for this replica at `listen`; its path, or `None` when
    /// the token file holds no `read` token.
    pub fn write_kubeconfig(&self, listen: SocketAddr) -> anyhow::Result<Option<PathBuf>> {
        let Some((user, token)) = &self.reader else {
            tracing::warn!("the token file holds no read token: no kubeconfig written");
            return Ok(None);
        };
        // HTTPS even on loopback, where cleartext is served too: kubectl sends a bearer token
        // only over TLS, and the token is what lets a debug token exec.
        let url = https_url(listen);
        let ca = Some(self.ca.pem());
        let path = self.data_dir.join("kubeconfig");
        credentials::write_private(&path, &kubeconfig::render(&url, ca.as_deref(), user, token))?;
        Ok(Some(path))
    }
}

/// How a kubeconfig on this machine reaches a replica listening on `listen`: over TLS, which
/// every listener serves.
pub fn https_url(listen: SocketAddr) -> String {
    url(listen).replacen("http://", "https://", 1)
}

/// How this machine reaches a replica listening on `listen`: the wildcard on loopback, where
/// cleartext is served too.
pub fn url(listen: SocketAddr) -> String {
    let mut addr = listen;
    if addr.ip().is_unspecified() {
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    let scheme = if tls::serves_tls(addr) { "https" } else { "http" };
    format!("{scheme}://{addr}")
}

/// The names a replica's serving certificate carries: its listen address (unless it is the
/// wildcard), the other `addresses` it is reached at, the machine's host name, and loopback.
pub fn serving_names(listen: std::net::SocketAddr, addresses: &[String]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    let mut add = |name: String| {
        if !name.is_empty() && !names.contains(&name) {
            names.push(name);
        }
    };
    if !listen.ip().is_unspecified() {
        add(listen.ip().to_string());
    }
    for address in addresses {
        add(address.trim_start_matches('[').trim_end_matches(']').to_owned());
    }
    add(gitplane_nodeagent::kubelet::node::hostname());
    add("localhost".into());
    add("127.0.0.1".into());
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_hold_the_addresses_once() {
        let names = serving_names("0.0.0.0:8443".parse().unwrap(), &["192.0.2.1".into(), "127.0.0.1".into()]);
        assert_eq!(names[0], "192.0.2.1");
        assert_eq!(names.iter().filter(|n| *n == "127.0.0.1").count(), 1);
        assert!(!names.contains(&"0.0.0.0".to_owned()));
    }
}
