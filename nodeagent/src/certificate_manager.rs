//! Renews the node's certificates while the agent runs (the kubelet's certificate manager).
//!
//! At a jittered 70-90% of the lifetime of whichever of its two certificates expires first, the
//! agent makes a new key and asks the node service to sign it (`RenewCertificates`, authenticated
//! as the node it is), keeps the pair next to the credential file, shows the new client
//! certificate on new connections to the control plane and serves the new serving certificate
//! on new kubelet endpoint connections. Connections already open keep theirs (a TLS session is
//! authenticated once, at its handshake), so the streams the agent follows are not interrupted.
//! A refused renewal (the node was removed from the cluster) is retried with back-off and
//! logged; the agent then holds certificates the control plane no longer accepts.

use crate::{
    certificate::{self, KeyAndCertificate},
    controlplane::{RETRY_MIN, Servers, sleep_or_shutdown},
    kubelet::server::auth::{self, ServingTls},
};
use gitplane_proto::{node::RenewCertificatesRequest, x509};
use std::{sync::PoisonError, time::SystemTime};
use tokio::sync::watch;

/// The node's certificates, and where they are used.
pub(crate) struct Manager {
    pub node_name: String,
    pub files: certificate::Files,
    /// The cluster CA's certificate (PEM): the kubelet endpoint verifies its callers with it.
    pub certificate_authority: String,
    pub servers: Servers,
    pub serving_tls: ServingTls,
    pub client: Option<KeyAndCertificate>,
    pub serving: Option<KeyAndCertificate>,
}

/// When to renew a certificate valid from `not_before` to `not_after`: at 70% of its lifetime,
/// plus `jitter` (0 to 1) of another 20%, so that nodes that joined together do not all renew
/// at once (client-go's certificate manager does the same).
pub(crate) fn deadline(not_before: SystemTime, not_after: SystemTime, jitter: f64) -> SystemTime {
    let lifetime = not_after.duration_since(not_before).unwrap_or_default();
    not_before + lifetime.mul_f64(0.7 + 0.2 * jitter.clamp(0.0, 1.0))
}

impl Manager {
    /// Renews the certificates whenever they are due, until `shutdown`.
    pub(crate) async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        loop {
            let Some(due) = self.due() else {
                tracing::info!("the node holds no certificate: nothing to renew");
                return;
            };
            let wait = due.duration_since(SystemTime::now()).unwrap_or_default();
            tracing::info!(node = %self.node_name, in_seconds = wait.as_secs(), "node certificates renew");
            tokio::select! {
                _ = shutdown.wait_for(|s| *s) => return,
                _ = tokio::time::sleep(wait) => {}
            }
            let mut delay = RETRY_MIN;
            loop {
                match self.renew().await {
                    Ok(()) => break,
                    Err(why) => {
                        tracing::warn!(node = %self.node_name, error = %why, "renewing the node certificates failed, retrying")
                    }
                }
                if sleep_or_shutdown(&mut delay, &mut shutdown).await {
                    return;
                }
            }
        }
    }

    /// When the certificate that expires first is due for renewal.
    fn due(&self) -> Option<SystemTime> {
        [&self.client, &self.serving]
            .into_iter()
            .flatten()
            .filter_map(|pair| x509::validity(&pair.certificate_der()?))
            .map(|(not_before, not_after)| deadline(not_before, not_after, rand::random()))
            .min()
    }

    async fn renew(&mut self) -> Result<(), String> {
        let (key, csr) = certificate::request(&self.node_name).map_err(|e| e.to_string())?;
        let (server, mut client) = self.servers.get();
        let response = match client.renew_certificates(RenewCertificatesRequest { csr }).await {
            Ok(response) => response.into_inner(),
            Err(status) => {
                if status.code() == tonic::Code::Unavailable {
                    self.servers.failed(server);
                }
                return Err(status.message().to_owned());
            }
        };
        let client = certificate::with_key(response.client_certificate, &key);
        let serving = certificate::with_key(response.serving_certificate, &key);
        for (path, pair) in [(&self.files.client, &client), (&self.files.serving, &serving)] {
            certificate::store(path, pair).map_err(|e| format!("writing {}: {e}", path.display()))?;
        }
        self.servers.present(&client).map_err(|e| e.to_string())?;
        if let Some(acceptor) = auth::acceptor(&self.certificate_authority, Some(serving.clone())) {
            *self.serving_tls.write().unwrap_or_else(PoisonError::into_inner) = Some(acceptor);
        }
        tracing::info!(node = %self.node_name, "node certificates renewed");
        (self.client, self.serving) = (Some(client), Some(serving));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn renews_at_70_to_90_percent_of_the_lifetime() {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let end = start + Duration::from_secs(1000);
        assert_eq!(deadline(start, end, 0.0), start + Duration::from_secs(700));
        assert_eq!(deadline(start, end, 1.0), start + Duration::from_secs(900));
        assert_eq!(deadline(start, end, 0.5), start + Duration::from_secs(800));
        assert_eq!(deadline(start, end, 7.0), start + Duration::from_secs(900), "jitter is clamped");
        // An expired (or backwards) certificate is due at once.
        assert_eq!(deadline(end, start, 0.5), end);
    }
}
