//! TLS for Ingresses: the certificate of each `spec.tls` host, from its `kubernetes.io/tls`
//! Secret, picked by the client's SNI. A Secret that does not hold a usable certificate and
//! matching key is reported and its hosts are left without TLS (the handshake is refused), while
//! every other host keeps its certificate.

use super::Routes;
use gitplane_api::{
    ObjectKey,
    ingress::{Problem, RouteTable, certified_key},
};
use k8s_openapi::api::core::v1::Secret;
use rustls::{
    server::{ClientHello, ResolvesServerCert},
    sign::CertifiedKey,
};
use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

/// Host (exact, or `*.suffix`) -> certificate.
pub type Certificates = HashMap<String, Arc<CertifiedKey>>;

/// A Secret's certificate, or why it has none.
type Parsed = Result<Arc<CertifiedKey>, String>;

/// Parsed certificates by Secret, kept while the Secret's resourceVersion stays.
#[derive(Default)]
pub struct CertificateCache {
    parsed: HashMap<(String, String), (Option<String>, Parsed)>,
}

impl CertificateCache {
    /// The certificate of every TLS host of `table`, and a problem for each host whose Secret is
    /// missing or broken.
    pub fn certificates(
        &mut self,
        table: &RouteTable,
        secrets: &BTreeMap<ObjectKey, Arc<Secret>>,
    ) -> (Certificates, Vec<Problem>) {
        let mut out = Certificates::new();
        let mut problems = Vec::new();
        let mut used = HashMap::new();
        for (host, route) in &table.tls {
            let (namespace, name) = &route.secret;
            let key = ObjectKey::new("Secret", namespace.clone(), name.clone());
            let Some(secret) = secrets.get(&key) else {
                let message = format!("TLS Secret {namespace}/{name} not found: {host} is served without TLS");
                problems.push(Problem { ingress: route.ingress.clone(), reason: "TLSSecretNotFound", message });
                continue;
            };
            let version = secret.metadata.resource_version.clone();
            let entry = match self.parsed.get(&route.secret) {
                Some((v, parsed)) if *v == version => parsed.clone(),
                _ => certified_key(secret),
            };
            match &entry {
                Ok(certified) => {
                    out.insert(host.clone(), certified.clone());
                }
                Err(why) => {
                    let message = format!("TLS Secret {namespace}/{name} {why}: {host} is served without TLS");
                    problems.push(Problem { ingress: route.ingress.clone(), reason: "InvalidTLSSecret", message });
                }
            }
            used.insert(route.secret.clone(), (version, entry));
        }
        self.parsed = used;
        (out, problems)
    }
}

/// Picks the certificate for the client's server name from the current routes.
#[derive(Debug)]
pub struct Resolver(pub Arc<Routes>);

impl std::fmt::Debug for Routes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Routes").finish_non_exhaustive()
    }
}

impl ResolvesServerCert for Resolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let name = hello.server_name()?.to_ascii_lowercase();
        let snapshot = self.0.load();
        let certificates = &snapshot.certificates;
        certificates.get(&name).cloned().or_else(|| {
            let (_, suffix) = name.split_once('.')?;
            certificates.get(&format!("*.{suffix}")).cloned()
        })
    }
}

/// The server configuration of the HTTPS listener: HTTP/1.1 over TLS 1.2 or 1.3.
pub fn server_config(routes: Arc<Routes>) -> Result<rustls::ServerConfig, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(Resolver(routes)));
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}
