//! The node's certificates (the kubelet's TLS bootstrapping and certificate store, simplified).
//!
//! At every registration the agent makes a new ECDSA P-256 key and sends a certificate signing
//! request for it; the key never leaves the node. The control plane answers with a client
//! certificate (CN `system:node:<name>`, O `system:nodes`) and the kubelet endpoint's serving
//! certificate, which are kept next to the credential file as the kubelet keeps
//! `kubelet-client-current.pem` and `kubelet-server-current.pem`: `kubelet-client.pem` and
//! `kubelet-server.pem`, each the certificate then the key, mode 0600. The client certificate
//! authenticates the node's calls over TLS, the next registration's included. While the agent
//! runs, `certificate_manager` renews both before they expire.

use gitplane_proto::x509::{self, NODE_USER_PREFIX, NODES_GROUP};
use rustls::{
    RootCertStore,
    pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, UnixTime},
    server::WebPkiClientVerifier,
};
use std::{
    io::Write as _,
    os::unix::fs::OpenOptionsExt as _,
    path::{Path, PathBuf},
    sync::Arc,
};

/// A certificate and its key, PEM.
#[derive(Clone)]
pub struct KeyAndCertificate {
    pub certificate: String,
    pub key: String,
}

// Never print a key.
impl std::fmt::Debug for KeyAndCertificate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyAndCertificate(***)")
    }
}

impl KeyAndCertificate {
    /// The certificate's DER (the first of the chain).
    pub fn certificate_der(&self) -> Option<CertificateDer<'static>> {
        x509::pem_blocks(&self.certificate, "CERTIFICATE").into_iter().next().map(CertificateDer::from)
    }

    pub fn key_der(&self) -> Option<PrivateKeyDer<'static>> {
        let der = x509::pem_blocks(&self.key, "PRIVATE KEY").into_iter().next()?;
        Some(PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(der)))
    }
}

/// Where the node's certificates are kept: next to its credential file.
#[derive(Clone, Debug)]
pub struct Files {
    pub client: PathBuf,
    pub serving: PathBuf,
}

impl Files {
    pub fn next_to(credential_file: &Path) -> Files {
        let dir = credential_file.parent().unwrap_or(Path::new("."));
        Files { client: dir.join("kubelet-client.pem"), serving: dir.join("kubelet-server.pem") }
    }
}

/// A new key, and a certificate signing request for it (DER) naming the node as the control
/// plane will (it decides the names itself).
pub fn request(node_name: &str) -> Result<(rcgen::KeyPair, Vec<u8>), rcgen::Error> {
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::default();
    let mut name = rcgen::DistinguishedName::new();
    name.push(rcgen::DnType::CommonName, format!("{NODE_USER_PREFIX}{node_name}"));
    name.push(rcgen::DnType::OrganizationName, NODES_GROUP);
    params.distinguished_name = name;
    let csr = params.serialize_request(&key)?.der().to_vec();
    Ok((key, csr))
}

/// The signed `certificate` (PEM) with `key`.
pub fn with_key(certificate: String, key: &rcgen::KeyPair) -> KeyAndCertificate {
    KeyAndCertificate { certificate, key: x509::pem("PRIVATE KEY", &key.serialize_der()) }
}

/// Keeps `pair` in `path` (mode 0600, written aside then renamed).
pub fn store(path: &Path, pair: &KeyAndCertificate) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let aside = path.with_extension("pem.new");
    let _ = std::fs::remove_file(&aside);
    let mut out = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&aside)?;
    out.write_all(pair.certificate.as_bytes())?;
    out.write_all(pair.key.as_bytes())?;
    out.sync_all()?;
    std::fs::rename(&aside, path)
}

/// The client certificate kept in `path`, if it is one the cluster CA `ca` (PEM) signed and
/// it has not expired: a certificate of another cluster (a rotated CA) would fail the
/// handshake, so the agent joins again instead.
pub fn load_client(path: &Path, ca: &str) -> Option<KeyAndCertificate> {
    let text = std::fs::read_to_string(path).ok()?;
    let certificate = x509::pem_blocks(&text, "CERTIFICATE").into_iter().next()?;
    let key = x509::pem_blocks(&text, "PRIVATE KEY").into_iter().next()?;
    let pair =
        KeyAndCertificate { certificate: x509::pem("CERTIFICATE", &certificate), key: x509::pem("PRIVATE KEY", &key) };
    let certificate = CertificateDer::from(certificate);
    let verifier = client_verifier(ca).ok()?;
    match verifier.verify_client_cert(&certificate, &[], UnixTime::now()) {
        Ok(_) => Some(pair),
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e, "the kept client certificate is not usable: joining again");
            None
        }
    }
}

/// The roots of the cluster CA (PEM).
pub fn roots(ca: &str) -> Result<Arc<RootCertStore>, String> {
    let mut roots = RootCertStore::empty();
    for der in x509::pem_blocks(ca, "CERTIFICATE") {
        roots.add(CertificateDer::from(der)).map_err(|e| e.to_string())?;
    }
    if roots.is_empty() {
        return Err("no certificate in it".into());
    }
    Ok(Arc::new(roots))
}

/// Verifies client certificates against the cluster CA (PEM); a client must present one.
pub fn client_verifier(ca: &str) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    WebPkiClientVerifier::builder_with_provider(roots(ca)?, provider).build().map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_names_the_node_and_a_stored_pair_loads_back_only_under_its_ca() {
        let (key, csr) = request("n1").unwrap();
        assert!(x509::certification_request(&csr).is_some());
        // A CA of this test's, standing in for the cluster's.
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::default();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let issuer = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).unwrap();
        let mut params = rcgen::CertificateParams::default();
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let signed = params.signed_by(&key, &issuer).unwrap();
        let pair = with_key(x509::pem("CERTIFICATE", signed.der()), &key);

        let dir = tempfile::tempdir().unwrap();
        let files = Files::next_to(&dir.path().join("node-credential"));
        store(&files.client, &pair).unwrap();
        let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&files.client).unwrap().permissions());
        assert_eq!(mode & 0o777, 0o600);
        let ca = x509::pem("CERTIFICATE", issuer.der());
        let loaded = load_client(&files.client, &ca).unwrap();
        assert_eq!(loaded.certificate_der(), pair.certificate_der());
        assert!(loaded.key_der().is_some());

        let other = rcgen::CertifiedIssuer::self_signed(
            rcgen::CertificateParams::default(),
            rcgen::KeyPair::generate().unwrap(),
        )
        .unwrap();
        assert!(load_client(&files.client, &x509::pem("CERTIFICATE", other.der())).is_none());
        assert!(load_client(&files.serving, &ca).is_none(), "no file");
    }
}
