//! Who may call the agent's kubelet endpoint: the control plane's replicas, by their client
//! certificates (mutual TLS). The endpoint serves the certificate the cluster CA signed for
//! this node at registration and requires a client certificate from the same CA; of those,
//! only a replica's (group `gitplane:replicas`) is answered, never a node's.

use crate::certificate::{self, KeyAndCertificate};
use gitplane_proto::x509::{self, Subject};
use std::sync::Arc;

/// The endpoint's TLS, replaced when the node's serving certificate is renewed (connections
/// open keep theirs).
pub type ServingTls = Arc<std::sync::RwLock<Option<tokio_rustls::TlsAcceptor>>>;

/// The endpoint's TLS: `serving` (this node's serving certificate) and clients verified
/// against the CA `ca` (PEM). `None` (and a warning) without a serving certificate: the
/// endpoint then answers no one.
pub fn acceptor(ca: &str, serving: Option<KeyAndCertificate>) -> Option<tokio_rustls::TlsAcceptor> {
    let config = (|| -> Result<rustls::ServerConfig, String> {
        let serving = serving.ok_or("the control plane issued no serving certificate (is it older than the agent?)")?;
        let certificate = serving.certificate_der().ok_or("the serving certificate is not PEM")?;
        let key = serving.key_der().ok_or("the serving key is not PEM")?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_client_cert_verifier(certificate::client_verifier(ca).map_err(|e| format!("the cluster CA: {e}"))?)
            .with_single_cert(vec![certificate], key)
            .map_err(|e| e.to_string())?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(config)
    })();
    match config {
        Ok(config) => Some(tokio_rustls::TlsAcceptor::from(Arc::new(config))),
        Err(why) => {
            tracing::warn!(%why, "the kubelet endpoint has no TLS: it answers no one");
            None
        }
    }
}

/// Whether the verified client certificate `certificate` (DER) is a replica's.
pub fn authorized(certificate: Option<&[u8]>) -> bool {
    certificate.and_then(x509::subject).as_ref().is_some_and(Subject::is_replica)
}
