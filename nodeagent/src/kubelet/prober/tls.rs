//! TLS for HTTPS probes, as the kubelet's prober dials them (`InsecureSkipVerify`): the
//! container's certificate is not verified (it is usually self-signed, for a name the probe
//! does not use), but the handshake's signatures still are. Scoped to probes: nothing else in
//! the agent uses this connector.

use std::sync::{Arc, LazyLock};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio::net::TcpStream;
use tokio_rustls::{TlsConnector, client::TlsStream};

/// Accepts any certificate chain for any name; checks only that the peer holds its key.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

static CONNECTOR: LazyLock<Result<TlsConnector, rustls::Error>> = LazyLock::new(|| {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
        .with_no_client_auth();
    Ok(TlsConnector::from(Arc::new(config)))
});

/// The TLS handshake over `stream` to `host` (an IP address, or a name sent as SNI). `Err` is
/// the handshake's failure, for the probe's message.
pub async fn connect(host: &str, stream: TcpStream) -> Result<TlsStream<TcpStream>, String> {
    let connector = CONNECTOR.as_ref().map_err(|e| format!("TLS is not available: {e}"))?;
    let name = ServerName::try_from(host.to_owned()).map_err(|e| format!("{host:?} is not a server name: {e}"))?;
    connector.connect(name, stream).await.map_err(|e| format!("tls: {e}"))
}

#[cfg(test)]
mod tests {
    use super::super::http::{HttpGet, probe};
    use super::super::results::ProbeResult;
    use super::*;
    use rustls::pki_types::PrivateKeyDer;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    /// A server with a self-signed certificate for another name, answering each connection
    /// with the next response.
    async fn serve(responses: Vec<&'static str>) -> u16 {
        let key = rcgen::KeyPair::generate().unwrap();
        let certificate =
            rcgen::CertificateParams::new(vec!["elsewhere.example".into()]).unwrap().self_signed(&key).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![certificate.der().clone()], PrivateKeyDer::try_from(key.serialize_der()).unwrap())
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            for response in responses {
                let (tcp, _) = listener.accept().await.unwrap();
                let Ok(mut tls) = acceptor.accept(tcp).await else { continue };
                let mut request = Vec::new();
                while !request.ends_with(b"\r\n\r\n") && tls.read_buf(&mut request).await.unwrap_or(0) > 0 {}
                let _ = tls.write_all(response.as_bytes()).await;
                let _ = tls.shutdown().await;
            }
        });
        port
    }

    #[tokio::test]
    async fn https_probes_do_not_verify_the_certificate() {
        let get = |port, https| HttpGet { host: None, port, path: "/healthz".into(), headers: Vec::new(), https };
        let mut buf = Vec::new();
        let second = Duration::from_secs(2);
        let port = serve(vec!["HTTP/1.1 200 OK\r\n\r\n", "HTTP/1.1 500 Oops\r\n\r\n"]).await;
        assert_eq!(probe(&get(port, true), "127.0.0.1", second, &mut buf).await, (ProbeResult::Success, String::new()));
        let failed = probe(&get(port, true), "127.0.0.1", second, &mut buf).await;
        assert_eq!(failed, (ProbeResult::Failure, "HTTP probe failed with statuscode: 500".into()));
        // Plain HTTP to a TLS port fails as the kubelet's does: no HTTP answer.
        let port = serve(vec![""]).await;
        let (result, message) = probe(&get(port, false), "127.0.0.1", second, &mut buf).await;
        assert_eq!(result, ProbeResult::Failure, "{message}");
        assert!(message.starts_with(&format!("Get \"http://127.0.0.1:{port}/healthz\"")), "{message}");
    }
}
