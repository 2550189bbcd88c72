//! The HTTPS listener's TLS: the certificate picked by the client's SNI from the current
//! routes' snapshot ([`super::tls`] keeps the certificates).

use super::Routes;
use rustls::{
    server::{ClientHello, ResolvesServerCert},
    sign::CertifiedKey,
};
use std::sync::Arc;

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
