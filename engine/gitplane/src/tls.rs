//! TLS on the listener and between the cluster's parts: the cluster CA, each replica's
//! certificate, and the certificates the CA signs for nodes.
//!
//! The CA is **derived from the peer token** (an Ed25519 key from a labelled HMAC of it, and a
//! certificate with fixed fields, so its bytes are the same on every replica), as the node key
//! is: the replicas of a cluster share one CA without a second secret to copy, and the CA key
//! is never written anywhere. Whoever holds the peer token controls the store already, so the
//! CA adds no new secret to guard. Rotating the peer token rotates the CA (agents and users
//! then need the new `ca.crt`).
//!
//! Each replica signs a fresh certificate (ECDSA P-256, one year) for its addresses on every
//! start, in group `gitplane:replicas`, good for serving and as a client: it serves the
//! listener, and it is what the replica presents to its peers (Raft, forwarded writes) and to
//! the nodes' kubelet endpoints. Only the CA's certificate is written out (`<data-dir>/ca.crt`),
//! for agents, kubeconfigs and curl. A listener on loopback serves plain HTTP (what `gitplane
//! up` shows); every other one serves TLS 1.2/1.3 with ALPN `h2` and `http/1.1`, so gRPC and
//! kubectl share it. A client may present a certificate; one the cluster CA did not sign fails
//! the handshake; one it signed says who the client is ([`gitplane_proto::x509::Subject`]).
//!
//! Nodes get two certificates at registration ([`ClusterCa::sign_node`]) for the key of their
//! certificate signing request, which never leaves the node: a client certificate and the
//! serving certificate of their kubelet endpoint (the kubelet's TLS bootstrapping, with the
//! registration as the approval). Both carry the uid of the Node they were issued for, and the
//! agent renews them before they expire (the kubelet's certificate rotation).
//!
//! **Architecture Invariant**: the cluster CA signs no certificate a node can serve with. A
//! node's serving certificate comes from a second issuer, the kubelet CA (derived alike, from
//! another label), which only the replicas trust, and only to reach kubelet endpoints. Agents,
//! peers and users trust the cluster CA alone, so a node that serves its certificate at a
//! replica's address is refused by every client of the control plane: a node cannot become
//! the control plane, whatever address it reports. The node's client certificate is the
//! cluster CA's (client-only usage: it cannot serve).

use anyhow::Context as _;
use gitplane_proto::x509::{self, NODE_USER_PREFIX, NODES_GROUP, REPLICAS_GROUP};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SerialNumber,
};
use rustls::{
    ClientConfig, RootCertStore, ServerConfig,
    pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, alg_id},
    server::WebPkiClientVerifier,
};
use std::{io::Write as _, net::IpAddr, os::unix::fs::OpenOptionsExt as _, path::Path, sync::Arc, time::Duration};

/// PKCS#8 v1 of an Ed25519 private key, less its 32-byte seed (RFC 8410).
const ED25519_PKCS8_PREFIX: [u8; 16] =
    [0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20];
/// How long a replica's or a node's certificate lasts; both get new ones at every start, and
/// agents renew theirs while they run.
const VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);
/// Overrides how long nodes' certificates last, in seconds (at least 60): for tests of their
/// rotation only.
pub const NODE_CERTIFICATE_SECONDS_ENV: &str = "GITPLANE_NODE_CERTIFICATE_SECONDS";

/// How long the node certificates signed now last: [`VALIDITY`] unless a test overrides it.
fn node_validity() -> Duration {
    let Ok(text) = std::env::var(NODE_CERTIFICATE_SECONDS_ENV) else { return VALIDITY };
    match text.parse::<u64>() {
        Ok(seconds) if (60..=VALIDITY.as_secs()).contains(&seconds) => Duration::from_secs(seconds),
        _ => {
            tracing::warn!(value = %text, "{NODE_CERTIFICATE_SECONDS_ENV} is not 60..31536000 seconds: ignored");
            VALIDITY
        }
    }
}

/// The cluster's certificate authority, and the kubelet CA beside it.
pub struct ClusterCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
    /// Signs nodes' serving certificates, and nothing else.
    kubelets: CertifiedIssuer<'static, KeyPair>,
}

/// A replica's certificate (the CA's after it) and key: what it serves and presents.
pub struct ReplicaCertificate {
    chain: Vec<CertificateDer<'static>>,
    key: Vec<u8>,
}

impl ReplicaCertificate {
    fn key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key.clone()))
    }

    /// The certificate chain and the key, PEM (what tonic's client identity takes).
    pub fn pem(&self) -> (String, String) {
        let chain: String = self.chain.iter().map(|c| x509::pem("CERTIFICATE", c)).collect();
        (chain, x509::pem("PRIVATE KEY", &self.key))
    }
}

/// A node's certificates, PEM, for the key of its request.
#[derive(Debug)]
pub struct NodeCertificates {
    pub client: String,
    pub serving: String,
}

/// Why a node's certificate signing request was refused.
#[derive(Debug, thiserror::Error)]
pub enum CsrError {
    #[error("the certificate signing request is not DER PKCS#10")]
    Malformed,
    #[error(
        "the certificate signing request's key must be ECDSA P-256, signed with SHA-256 (what gitplane agent makes)"
    )]
    Algorithm,
    #[error("the certificate signing request's signature does not verify with its own key")]
    Signature,
    #[error("signing the node's certificate: {0}")]
    Signing(#[from] rcgen::Error),
}

/// A public key taken from a certificate signing request.
struct RequestedKey(Vec<u8>);

impl rcgen::PublicKeyData for RequestedKey {
    fn der_bytes(&self) -> &[u8] {
        &self.0
    }

    fn algorithm(&self) -> &'static rcgen::SignatureAlgorithm {
        &rcgen::PKCS_ECDSA_P256_SHA256
    }
}

/// The key of `csr`, once its signature proves the requester holds it.
fn requested_key(csr: &[u8]) -> Result<RequestedKey, CsrError> {
    let request = x509::certification_request(csr).ok_or(CsrError::Malformed)?;
    if request.public_key_algorithm != alg_id::ECDSA_P256.as_ref()
        || request.signature_algorithm != alg_id::ECDSA_SHA256.as_ref()
    {
        return Err(CsrError::Algorithm);
    }
    let provider = rustls::crypto::ring::default_provider();
    let verifier = provider
        .signature_verification_algorithms
        .all
        .iter()
        .find(|a| a.public_key_alg_id() == alg_id::ECDSA_P256 && a.signature_alg_id() == alg_id::ECDSA_SHA256)
        .ok_or(CsrError::Algorithm)?;
    verifier.verify_signature(request.public_key, request.info, request.signature).map_err(|_| CsrError::Signature)?;
    Ok(RequestedKey(request.public_key.to_vec()))
}

fn subject(common_name: &str, group: &str) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    name.push(DnType::OrganizationName, group);
    name
}

/// Validity from a little ago (clocks a little behind this one: an hour, or a tenth of a short
/// lifetime) for `validity`.
fn valid_from_now(params: &mut CertificateParams, validity: Duration) {
    let now = std::time::SystemTime::now();
    params.not_before = (now - (validity / 10).min(Duration::from_secs(3600))).into();
    params.not_after = (now + validity).into();
}

/// The common name of the kubelet CA's certificate.
pub const KUBELET_CA_NAME: &str = "gitplane kubelet CA";

/// A self-signed CA whose Ed25519 key is `seed`: every replica holding it makes the same bytes.
fn derive_issuer(seed: [u8; 32], common_name: &str) -> anyhow::Result<CertifiedIssuer<'static, KeyPair>> {
    let mut pkcs8 = ED25519_PKCS8_PREFIX.to_vec();
    pkcs8.extend_from_slice(&seed);
    let key = KeyPair::from_pkcs8_der_and_sign_algo(&PrivatePkcs8KeyDer::from(pkcs8), &rcgen::PKCS_ED25519)
        .context("deriving the CA's key")?;
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    // Fixed fields, so every replica's copy is the same bytes (Ed25519 signs deterministically).
    params.not_before = rcgen::date_time_ymd(2025, 1, 1);
    params.not_after = rcgen::date_time_ymd(2125, 1, 1);
    params.serial_number = Some(SerialNumber::from_slice(&seed[..8].iter().map(|b| b & 0x7f).collect::<Vec<_>>()));
    CertifiedIssuer::self_signed(params, key).context("making the CA's certificate")
}

impl ClusterCa {
    /// The CA every replica holding `seed` (derived from the peer token) derives alike, and the
    /// kubelet CA (from a labelled HMAC of the same seed).
    pub fn derive(seed: [u8; 32]) -> anyhow::Result<ClusterCa> {
        let issuer = derive_issuer(seed, "gitplane cluster CA").context("the cluster CA")?;
        let kubelet_seed: [u8; 32] = {
            use hmac::Mac as _;
            let mut mac =
                <hmac::Hmac<sha2::Sha256> as hmac::Mac>::new_from_slice(&seed).expect("HMAC takes keys of any length");
            mac.update(b"gitplane kubelet CA");
            mac.finalize().into_bytes().into()
        };
        let kubelets = derive_issuer(kubelet_seed, KUBELET_CA_NAME).context("the kubelet CA")?;
        Ok(ClusterCa { issuer, kubelets })
    }

    /// The CA's certificate, PEM.
    pub fn pem(&self) -> String {
        x509::pem("CERTIFICATE", self.issuer.der())
    }

    /// The kubelet CA's certificate, PEM: what verifies a node's kubelet endpoint.
    pub fn kubelet_pem(&self) -> String {
        x509::pem("CERTIFICATE", self.kubelets.der())
    }

    fn roots(&self) -> anyhow::Result<Arc<RootCertStore>> {
        root_store(&self.issuer)
    }

    /// Writes the CA's certificate (public: mode 0644) to `path`, and the kubelet CA's beside it
    /// (`kubelet-ca.crt`, for an operator's `openssl s_client` to a kubelet endpoint).
    pub fn write_certificate(&self, path: &Path) -> anyhow::Result<()> {
        write_public(path, &self.pem())?;
        write_public(&path.with_file_name("kubelet-ca.crt"), &self.kubelet_pem())
    }

    /// A replica's certificate for `names` (addresses or DNS names): serving, and client of
    /// its peers and of the kubelet endpoints.
    pub fn replica_certificate(&self, names: &[String]) -> anyhow::Result<ReplicaCertificate> {
        let key = KeyPair::generate().context("making the replica's key")?;
        let mut params = CertificateParams::new(names.to_vec()).context("the replica certificate's names")?;
        params.distinguished_name = subject("gitplane replica", REPLICAS_GROUP);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        valid_from_now(&mut params, VALIDITY);
        let cert = params.signed_by(&key, &self.issuer).context("signing the replica's certificate")?;
        Ok(ReplicaCertificate { chain: vec![cert.der().clone(), self.issuer.der().clone()], key: key.serialize_der() })
    }

    /// The TLS configuration of a listener serving `replica`'s certificate. Client
    /// certificates are optional (kubectl and curl present none); one the CA did not sign fails
    /// the handshake.
    pub fn server_config(&self, replica: &ReplicaCertificate) -> anyhow::Result<Arc<ServerConfig>> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let clients = WebPkiClientVerifier::builder_with_provider(self.roots()?, provider.clone())
            .allow_unauthenticated()
            .build()
            .context("the client certificate verifier")?;
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .context("TLS versions")?
            .with_client_cert_verifier(clients)
            .with_single_cert(replica.chain.clone(), replica.key())
            .context("the serving certificate")?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    /// How a replica calls the kubelet endpoints: it trusts the kubelet CA only and presents its
    /// own certificate (kube-apiserver's `--kubelet-certificate-authority` and
    /// `--kubelet-client-certificate`).
    pub fn kubelet_client_config(&self, replica: &ReplicaCertificate) -> anyhow::Result<Arc<ClientConfig>> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .context("TLS versions")?
            .with_root_certificates(root_store(&self.kubelets)?)
            .with_client_auth_cert(replica.chain.clone(), replica.key())
            .context("the replica's client certificate")?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    /// Checks a certificate signing request as [`ClusterCa::sign_node`] will, before anything
    /// is written for it.
    pub fn check_request(csr: &[u8]) -> Result<(), CsrError> {
        requested_key(csr).map(drop)
    }

    /// Node `node`'s client and serving certificates for the key of `csr` (DER PKCS#10), whose
    /// signature must verify. The names are the CA's to decide, not the request's: CN
    /// `system:node:<node>`, O `system:nodes`, UID the Node object's `uid`, and for serving the
    /// SAN `address` (where the replicas reach its kubelet endpoint). The client certificate is
    /// the cluster CA's, the serving one the kubelet CA's.
    pub fn sign_node(&self, csr: &[u8], node: &str, uid: &str, address: IpAddr) -> Result<NodeCertificates, CsrError> {
        let key = requested_key(csr)?;
        let validity = node_validity();
        let sign = |usage: ExtendedKeyUsagePurpose, names: Vec<String>| -> Result<String, CsrError> {
            let issuer = if usage == ExtendedKeyUsagePurpose::ServerAuth { &self.kubelets } else { &self.issuer };
            let mut params = CertificateParams::new(names)?;
            params.distinguished_name = subject(&format!("{NODE_USER_PREFIX}{node}"), NODES_GROUP);
            params.distinguished_name.push(DnType::CustomDnType(x509::OID_UID.to_vec()), uid);
            params.extended_key_usages = vec![usage];
            params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
            valid_from_now(&mut params, validity);
            Ok(x509::pem("CERTIFICATE", params.signed_by(&key, issuer)?.der()))
        };
        Ok(NodeCertificates {
            client: sign(ExtendedKeyUsagePurpose::ClientAuth, Vec::new())?,
            serving: sign(ExtendedKeyUsagePurpose::ServerAuth, vec![address.to_string()])?,
        })
    }
}

fn root_store(issuer: &CertifiedIssuer<'static, KeyPair>) -> anyhow::Result<Arc<RootCertStore>> {
    let mut roots = RootCertStore::empty();
    roots.add(issuer.der().clone()).context("a CA's certificate")?;
    Ok(Arc::new(roots))
}

/// Writes a public file (mode 0644) to `path`, replacing what was there at once.
fn write_public(path: &Path, text: &str) -> anyhow::Result<()> {
    let staging = path.with_extension("new");
    let _ = std::fs::remove_file(&staging);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(&staging)
        .with_context(|| format!("creating {}", staging.display()))?;
    file.write_all(text.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&staging, path).with_context(|| format!("writing {}", path.display()))
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
    add(gitplane_nodeagent::kubelet::node::hostname());
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
        let names = serving_names("192.0.2.1:8443".parse().unwrap(), &["node-a".into()]);
        let replica = ca.replica_certificate(&names).unwrap();
        let config = ca.server_config(&replica).unwrap();
        assert_eq!(config.alpn_protocols, [b"h2".to_vec(), b"http/1.1".to_vec()]);
        let subject = x509::subject(&replica.chain[0]).unwrap();
        assert!(subject.is_replica() && subject.node().is_none(), "{subject:?}");
        assert!(ca.kubelet_client_config(&replica).is_ok());
    }

    fn csr(key: &KeyPair) -> Vec<u8> {
        let mut params = CertificateParams::default();
        params.distinguished_name = subject("system:node:whatever", NODES_GROUP);
        params.serialize_request(key).unwrap().der().to_vec()
    }

    #[test]
    fn a_node_gets_certificates_for_its_own_key_and_the_names_the_ca_decides() {
        let ca = ClusterCa::derive([1; 32]).unwrap();
        let key = KeyPair::generate().unwrap();
        let signed = ca.sign_node(&csr(&key), "n1", "uid-1", "192.0.2.9".parse().unwrap()).unwrap();
        for pem in [&signed.client, &signed.serving] {
            let der = &x509::pem_blocks(pem, "CERTIFICATE")[0];
            let subject = x509::subject(der).unwrap();
            assert_eq!(subject.node(), Some("n1"), "{subject:?}");
            assert_eq!(subject.uid.as_deref(), Some("uid-1"), "{subject:?}");
            let (not_before, not_after) = x509::validity(der).unwrap();
            let lifetime = not_after.duration_since(not_before).unwrap();
            assert_eq!(lifetime, VALIDITY + Duration::from_secs(3600), "an hour's allowance for clocks behind");
            // The certificate holds the requester's key.
            let raw = key.public_key_raw();
            assert!(der.windows(raw.len()).any(|w| w == raw));
        }

        let mut tampered = csr(&key);
        let at = tampered.len() / 2;
        tampered[at] ^= 1;
        let refused = ca.sign_node(&tampered, "n1", "u", "192.0.2.9".parse().unwrap()).unwrap_err();
        assert!(matches!(refused, CsrError::Signature | CsrError::Malformed), "{refused}");
        let ed25519 = KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
        let refused = ca.sign_node(&csr(&ed25519), "n1", "u", "192.0.2.9".parse().unwrap()).unwrap_err();
        assert!(matches!(refused, CsrError::Algorithm), "{refused}");
        assert!(matches!(ca.sign_node(b"", "n1", "u", "192.0.2.9".parse().unwrap()), Err(CsrError::Malformed)));
    }

    /// The attack this layout stops: a node that registered with a replica's address serves
    /// the certificate it got there. No client of the control plane accepts it; only a
    /// replica reaching a kubelet endpoint does.
    #[test]
    fn a_node_serving_certificate_is_refused_by_every_client_of_the_control_plane() {
        use rustls::client::danger::ServerCertVerifier as _;
        let ca = ClusterCa::derive([3; 32]).unwrap();
        let key = KeyPair::generate().unwrap();
        let replica_address: IpAddr = "192.0.2.3".parse().unwrap();
        let signed = ca.sign_node(&csr(&key), "n1", "uid-1", replica_address).unwrap();
        let serving = x509::pem_blocks(&signed.serving, "CERTIFICATE").remove(0);
        let name = rustls::pki_types::ServerName::from(replica_address);
        let now = rustls::pki_types::UnixTime::now();
        let verify = |roots: Arc<RootCertStore>| {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let verifier =
                rustls::client::WebPkiServerVerifier::builder_with_provider(roots, provider).build().unwrap();
            verifier.verify_server_cert(&CertificateDer::from(serving.clone()), &[], &name, &[], now)
        };
        // Agents, peers, the CLI and kubectl trust the cluster CA (ca.crt): refused.
        let refused = verify(ca.roots().unwrap()).unwrap_err();
        assert!(matches!(refused, rustls::Error::InvalidCertificate(_)), "{refused:?}");
        // Replicas reaching the node's kubelet endpoint trust the kubelet CA: accepted.
        verify(root_store(&ca.kubelets).unwrap()).unwrap();
        // The client certificate is the cluster CA's, and cannot serve.
        let client = x509::pem_blocks(&signed.client, "CERTIFICATE").remove(0);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier =
            rustls::client::WebPkiServerVerifier::builder_with_provider(ca.roots().unwrap(), provider).build().unwrap();
        assert!(verifier.verify_server_cert(&CertificateDer::from(client), &[], &name, &[], now).is_err());
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
