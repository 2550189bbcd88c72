//! TLS on the listener: the cluster CA and each replica's serving certificate.
//!
//! The CA is **derived from the peer token** (an Ed25519 key from a labelled HMAC of it, and a
//! certificate with fixed fields, so its bytes are the same on every replica), as the node key
//! is: the replicas of a cluster share one CA without a second secret to copy, and the CA key
//! is never written anywhere. Whoever holds the peer token controls the store already, so the
//! CA adds no new secret to guard. Rotating the peer token rotates the CA (agents and users
//! then need the new `ca.crt`).
//!
//! Each replica signs a fresh serving certificate (ECDSA P-256, one year) for its addresses on
//! every start; only the CA's certificate is written out (`<data-dir>/ca.crt`), for agents,
//! kubeconfigs and curl. A listener on loopback serves plain HTTP (what `gitplane up` shows);
//! every other one serves TLS 1.2/1.3 with ALPN `h2` and `http/1.1`, so gRPC and kubectl share
//! it. A client may present a certificate; one the cluster CA did not sign fails the
//! handshake (none is needed: requests authenticate with bearer tokens).

use anyhow::Context as _;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SerialNumber,
};
use rustls::{
    RootCertStore, ServerConfig,
    pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer},
    server::WebPkiClientVerifier,
};
use std::{io::Write as _, os::unix::fs::OpenOptionsExt as _, path::Path, sync::Arc, time::Duration};

/// PKCS#8 v1 of an Ed25519 private key, less its 32-byte seed (RFC 8410).
const ED25519_PKCS8_PREFIX: [u8; 16] =
    [0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20];
/// How long a serving certificate lasts; a replica makes a new one at every start.
const SERVING_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);

/// The cluster's certificate authority.
pub struct ClusterCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl ClusterCa {
    /// The CA every replica holding `seed` (derived from the peer token) derives alike.
    pub fn derive(seed: [u8; 32]) -> anyhow::Result<ClusterCa> {
        let mut pkcs8 = ED25519_PKCS8_PREFIX.to_vec();
        pkcs8.extend_from_slice(&seed);
        let key = KeyPair::from_pkcs8_der_and_sign_algo(&PrivatePkcs8KeyDer::from(pkcs8), &rcgen::PKCS_ED25519)
            .context("deriving the cluster CA's key")?;
        let mut params = CertificateParams::default();
        let mut name = DistinguishedName::new();
        name.push(DnType::CommonName, "gitplane cluster CA");
        params.distinguished_name = name;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        // Fixed fields, so every replica's copy is the same bytes (Ed25519 signs deterministically).
        params.not_before = rcgen::date_time_ymd(2025, 1, 1);
        params.not_after = rcgen::date_time_ymd(2125, 1, 1);
        params.serial_number = Some(SerialNumber::from_slice(&seed[..8].iter().map(|b| b & 0x7f).collect::<Vec<_>>()));
        let issuer = CertifiedIssuer::self_signed(params, key).context("making the cluster CA's certificate")?;
        Ok(ClusterCa { issuer })
    }

    /// The CA's certificate, PEM (written here: rcgen's `pem` brings a second base64).
    pub fn pem(&self) -> String {
        use base64::Engine as _;
        let text = base64::engine::general_purpose::STANDARD.encode(self.issuer.der());
        let lines: Vec<&str> = text.as_bytes().chunks(64).map(|l| std::str::from_utf8(l).unwrap_or_default()).collect();
        format!("-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n", lines.join("\n"))
    }

    /// Writes the CA's certificate (public: mode 0644) to `path`, replacing what was there.
    pub fn write_certificate(&self, path: &Path) -> anyhow::Result<()> {
        let staging = path.with_extension("crt.new");
        let _ = std::fs::remove_file(&staging);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&staging)
            .with_context(|| format!("creating {}", staging.display()))?;
        file.write_all(self.pem().as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&staging, path).with_context(|| format!("writing {}", path.display()))
    }

    /// A serving certificate for `names` (addresses or DNS names) and its key.
    fn serving(&self, names: &[String]) -> anyhow::Result<(CertificateDer<'static>, PrivateKeyDer<'static>)> {
        let key = KeyPair::generate().context("making a serving key")?;
        let mut params = CertificateParams::new(names.to_vec()).context("the serving certificate's names")?;
        let mut name = DistinguishedName::new();
        name.push(DnType::CommonName, "gitplane replica");
        params.distinguished_name = name;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        let now = std::time::SystemTime::now();
        // An hour of slack for clocks a little behind this one.
        params.not_before = (now - Duration::from_secs(3600)).into();
        params.not_after = (now + SERVING_VALIDITY).into();
        let cert = params.signed_by(&key, &self.issuer).context("signing the serving certificate")?;
        Ok((cert.der().clone(), PrivateKeyDer::Pkcs8(key.serialize_der().into())))
    }

    /// The TLS configuration of a listener serving `names`.
    pub fn server_config(&self, names: &[String]) -> anyhow::Result<Arc<ServerConfig>> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = RootCertStore::empty();
        roots.add(self.issuer.der().clone()).context("the cluster CA's certificate")?;
        let clients = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
            .allow_unauthenticated()
            .build()
            .context("the client certificate verifier")?;
        let (cert, key) = self.serving(names)?;
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .context("TLS versions")?
            .with_client_cert_verifier(clients)
            .with_single_cert(vec![cert, self.issuer.der().clone()], key)
            .context("the serving certificate")?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// Whether a listener on `addr` serves TLS: every address but loopback.
pub fn serves_tls(addr: std::net::SocketAddr) -> bool {
    gitplane_storage::remote::serves_tls(&addr.ip().to_string())
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
    add(gitplane_nodeagent::node::hostname());
    add("localhost".into());
    add("127.0.0.1".into());
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_replica_derives_the_same_ca_and_another_seed_another() {
        let a = ClusterCa::derive([7; 32]).unwrap();
        let b = ClusterCa::derive([7; 32]).unwrap();
        assert_eq!(a.pem(), b.pem());
        assert_ne!(a.pem(), ClusterCa::derive([8; 32]).unwrap().pem());
        assert!(a.pem().starts_with("-----BEGIN CERTIFICATE-----\n"));
        assert!(a.pem().lines().all(|l| l.len() <= 64), "{}", a.pem());
    }

    #[test]
    fn a_serving_config_offers_h2_and_http1() {
        let ca = ClusterCa::derive([1; 32]).unwrap();
        let config = ca.server_config(&serving_names("192.0.2.1:8443".parse().unwrap(), &["node-a".into()])).unwrap();
        assert_eq!(config.alpn_protocols, [b"h2".to_vec(), b"http/1.1".to_vec()]);
    }

    #[test]
    fn names_hold_the_addresses_once() {
        let names = serving_names("0.0.0.0:8443".parse().unwrap(), &["192.0.2.1".into(), "127.0.0.1".into()]);
        assert_eq!(names[0], "192.0.2.1");
        assert_eq!(names.iter().filter(|n| *n == "127.0.0.1").count(), 1);
        assert!(!names.contains(&"0.0.0.0".to_owned()));
    }

    #[test]
    fn loopback_is_plain_and_every_other_address_tls() {
        assert!(!serves_tls("127.0.0.1:8080".parse().unwrap()));
        assert!(!serves_tls("[::1]:8080".parse().unwrap()));
        assert!(serves_tls("192.0.2.1:8080".parse().unwrap()));
        assert!(serves_tls("0.0.0.0:8080".parse().unwrap()));
    }
}
