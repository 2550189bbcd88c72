//! TLS for Ingresses: the certificate of each `spec.tls` host, from its `kubernetes.io/tls`
//! Secret, picked by the client's SNI. A Secret that does not hold a usable certificate and
//! matching key is reported and its hosts are left without TLS (the handshake is refused), while
//! every other host keeps its certificate. [`super::sni`] picks them during the handshake.

use gitplane_api::{
    ObjectKey,
    ingress::{Problem, RouteTable, certified_key},
};
use k8s_openapi::api::core::v1::Secret;
use rustls::sign::CertifiedKey;
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
