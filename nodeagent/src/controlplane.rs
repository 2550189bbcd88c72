//! The agent's side of the control plane: the node service's replicas (an agent moves to the
//! next when one fails), the client certificate its calls present over TLS, and the token they
//! carry otherwise.

use crate::certificate::KeyAndCertificate;
use gitplane_proto::node::{ObjectEvent, PodEvent, node_service_client::NodeServiceClient};
use std::{
    path::{Path, PathBuf},
    sync::{Arc, PoisonError, RwLock},
    time::Duration,
};
use tokio::sync::watch;
use tonic::{
    Code, Request, Status, Streaming,
    metadata::{Ascii, MetadataValue},
    service::{Interceptor, interceptor::InterceptedService},
    transport::{Certificate, Channel, ClientTlsConfig, Identity},
};

/// Why the control plane cannot be called.
#[derive(Debug, thiserror::Error)]
pub enum ControlPlaneError {
    #[error("control plane address {server:?}: {source}")]
    Server { server: String, source: tonic::transport::Error },
    #[error("no control plane address given")]
    NoServers,
    #[error(
        "control plane address {server:?} is HTTPS: give the cluster CA's certificate \
         (--certificate-authority; it is <data-dir>/ca.crt on a control-plane replica)"
    )]
    NoCertificateAuthority { server: String },
    #[error(
        "no way to join: {file} holds no node credential and no join token was given \
         (--join-token-file; the token is <data-dir>/join-token on a control-plane replica)"
    )]
    NoCredential { file: PathBuf },
    #[error("the token in {file} is not usable: {why}")]
    BadToken { file: PathBuf, why: String },
}

/// How the node authenticates before it holds a client certificate.
#[derive(Clone, Debug)]
pub(crate) struct Credentials {
    /// The cluster's join token, for the first registration (or after losing the credential).
    pub join_token: Option<String>,
    /// Where the node credential is kept once registration returned it.
    pub credential_file: PathBuf,
}

/// Retry delays for calls to the control plane.
pub(crate) const RETRY_MIN: Duration = Duration::from_millis(200);
pub(crate) const RETRY_MAX: Duration = Duration::from_secs(5);

/// Sleeps with exponential backoff; `true` when shut down meanwhile.
pub(crate) async fn sleep_or_shutdown(delay: &mut Duration, shutdown: &mut watch::Receiver<bool>) -> bool {
    let wait = *delay;
    *delay = (*delay * 2).min(RETRY_MAX);
    tokio::select! {
        _ = shutdown.wait_for(|s| *s) => true,
        _ = tokio::time::sleep(wait) => false,
    }
}

/// The bearer token the agent presents on every call: its node credential once it has one,
/// before that the join token; none when its client certificate authenticates it.
#[derive(Clone)]
pub(crate) struct Token(Arc<RwLock<Option<MetadataValue<Ascii>>>>);

fn bearer(token: &str, file: &Path) -> Result<MetadataValue<Ascii>, ControlPlaneError> {
    format!("Bearer {}", token.trim())
        .parse()
        .map_err(|_| ControlPlaneError::BadToken { file: file.to_owned(), why: "not printable ASCII".into() })
}

impl Token {
    /// The kept credential, else the join token.
    pub(crate) fn load(cfg: &Credentials) -> Result<Token, ControlPlaneError> {
        let kept = match std::fs::read_to_string(&cfg.credential_file) {
            Ok(text) => Some(text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                return Err(ControlPlaneError::BadToken { file: cfg.credential_file.clone(), why: e.to_string() });
            }
        };
        let token = kept
            .or_else(|| cfg.join_token.clone())
            .ok_or_else(|| ControlPlaneError::NoCredential { file: cfg.credential_file.clone() })?;
        Ok(Token(Arc::new(RwLock::new(Some(bearer(&token, &cfg.credential_file)?)))))
    }

    /// No bearer token: the client certificate speaks for the node.
    pub(crate) fn none() -> Token {
        Token(Arc::default())
    }

    /// Presents no token from now on (the node holds a client certificate).
    pub(crate) fn clear(&self) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// Uses `credential` from now on and keeps it in `file` (written aside, then renamed).
    pub(crate) fn keep(&self, credential: &str, file: &Path) -> Result<(), ControlPlaneError> {
        let value = bearer(credential, file)?;
        let write = || -> std::io::Result<()> {
            use std::{io::Write as _, os::unix::fs::OpenOptionsExt as _};
            if let Some(dir) = file.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let aside = file.with_extension("new");
            let _ = std::fs::remove_file(&aside);
            let mut out = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&aside)?;
            out.write_all(credential.as_bytes())?;
            out.sync_all()?;
            std::fs::rename(&aside, file)
        };
        write().map_err(|e| ControlPlaneError::BadToken { file: file.to_owned(), why: format!("writing it: {e}") })?;
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = Some(value);
        Ok(())
    }

    /// Presents the join token again (when the control plane refused the credential); whether
    /// there is one.
    pub(crate) fn fall_back_to_join(&self, cfg: &Credentials) -> bool {
        let Some(value) = cfg.join_token.as_deref().and_then(|t| bearer(t, &cfg.credential_file).ok()) else {
            return false;
        };
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = Some(value);
        true
    }
}

impl Interceptor for Token {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(value) = self.0.read().unwrap_or_else(PoisonError::into_inner).clone() {
            request.metadata_mut().insert("authorization", value);
        }
        Ok(request)
    }
}

pub(crate) type Client = NodeServiceClient<InterceptedService<Channel, Token>>;

/// The control plane's replicas; calls go to one until it fails, then to the next. Clones
/// share the clients, so a renewed client certificate ([`Servers::present`]) reaches every
/// caller at once.
#[derive(Clone)]
pub(crate) struct Servers {
    addresses: Arc<Vec<String>>,
    token: Token,
    ca: Option<Arc<str>>,
    clients: Arc<RwLock<Arc<Vec<Client>>>>,
    current: Arc<std::sync::atomic::AtomicUsize>,
}

/// Connections to `servers`; `https://` ones trust the CA `ca` only and are shown `identity`.
/// A channel is one HTTP/2 connection that its clones share.
pub(crate) fn channels(
    servers: &[String],
    ca: Option<&str>,
    identity: Option<&KeyAndCertificate>,
) -> Result<Vec<Channel>, ControlPlaneError> {
    servers
        .iter()
        .map(|server| {
            let mut endpoint = tonic::transport::Endpoint::from_shared(server.clone())
                .map_err(|source| ControlPlaneError::Server { server: server.clone(), source })?;
            if server.starts_with("https://") {
                let ca = ca.ok_or_else(|| ControlPlaneError::NoCertificateAuthority { server: server.clone() })?;
                let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
                if let Some(identity) = identity {
                    tls = tls.identity(Identity::from_pem(&identity.certificate, &identity.key));
                }
                endpoint = endpoint
                    .tls_config(tls)
                    .map_err(|source| ControlPlaneError::Server { server: server.clone(), source })?;
            }
            Ok(endpoint
                .connect_timeout(Duration::from_secs(5))
                .http2_keep_alive_interval(Duration::from_secs(10))
                .keep_alive_while_idle(true)
                .connect_lazy())
        })
        .collect()
}

/// Clients of `servers`, showing `identity` to the `https://` ones.
fn clients(
    servers: &[String],
    token: &Token,
    ca: Option<&str>,
    identity: Option<&KeyAndCertificate>,
) -> Result<Vec<Client>, ControlPlaneError> {
    Ok(with_token(channels(servers, ca, identity)?, token))
}

fn with_token(channels: Vec<Channel>, token: &Token) -> Vec<Client> {
    channels.into_iter().map(|channel| NodeServiceClient::with_interceptor(channel, token.clone())).collect()
}

impl Servers {
    /// Clients of `servers`; `https://` ones trust the CA `ca` only and are shown `identity`,
    /// the node's client certificate, if it has one.
    pub(crate) fn new(
        servers: &[String],
        token: Token,
        ca: Option<&str>,
        identity: Option<&KeyAndCertificate>,
    ) -> Result<Servers, ControlPlaneError> {
        if servers.is_empty() {
            return Err(ControlPlaneError::NoServers);
        }
        let clients = clients(servers, &token, ca, identity)?;
        Ok(Servers {
            addresses: Arc::new(servers.to_vec()),
            token,
            ca: ca.map(Arc::from),
            clients: Arc::new(RwLock::new(Arc::new(clients))),
            current: Default::default(),
        })
    }

    /// Shows `identity` on every call from now on. Calls and streams under way keep their
    /// connections (a TLS session is authenticated once, at its handshake); later calls open
    /// new ones, and a stream opens its next one when it reconnects.
    /// [`Servers::new`], on `shared` connections (one per server, made by [`channels`]
    /// without an identity) when no server would be shown `identity`: every server is
    /// cleartext, where the bearer token speaks for the node on each call, or there is no
    /// identity. A client certificate is presented once per TLS connection, so a node showing
    /// one has connections of its own.
    pub(crate) fn connect(
        servers: &[String],
        token: Token,
        ca: Option<&str>,
        identity: Option<&KeyAndCertificate>,
        shared: Option<&[Channel]>,
    ) -> Result<Servers, ControlPlaneError> {
        let shown = identity.is_some() && servers.iter().any(|s| s.starts_with("https://"));
        match shared {
            Some(channels) if !shown && !servers.is_empty() && channels.len() == servers.len() => Ok(Servers {
                addresses: Arc::new(servers.to_vec()),
                clients: Arc::new(RwLock::new(Arc::new(with_token(channels.to_vec(), &token)))),
                token,
                ca: ca.map(Arc::from),
                current: Default::default(),
            }),
            _ => Servers::new(servers, token, ca, identity),
        }
    }

    pub(crate) fn present(&self, identity: &KeyAndCertificate) -> Result<(), ControlPlaneError> {
        let clients = clients(&self.addresses, &self.token, self.ca.as_deref(), Some(identity))?;
        *self.clients.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(clients);
        Ok(())
    }

    pub(crate) fn get(&self) -> (usize, Client) {
        let clients = self.clients.read().unwrap_or_else(PoisonError::into_inner).clone();
        let i = self.current.load(std::sync::atomic::Ordering::Relaxed) % clients.len();
        (i, clients[i].clone())
    }

    /// Moves on from `server` unless another call already did.
    pub(crate) fn failed(&self, server: usize) {
        let next = (server + 1) % self.addresses.len();
        let _ = self.current.compare_exchange(
            server,
            next,
            std::sync::atomic::Ordering::Relaxed,
            std::sync::atomic::Ordering::Relaxed,
        );
    }
}

/// A stream the node service sends from a revision (`WatchPods`, `WatchNetwork`), and what to do
/// with it: what [`follow`] drives.
pub(crate) trait Follower {
    type Event: Revisioned;
    /// What the stream is, for the log.
    const WHAT: &'static str;
    /// Opens the stream from `from` (0: list everything first).
    fn open(&self, client: Client, from: i64) -> impl Future<Output = Result<Streaming<Self::Event>, Status>> + Send;
    /// A stream from `from` was opened: a fresh list begins when `from` is 0.
    fn started(&mut self, from: i64);
    fn observe(&mut self, event: Self::Event) -> impl Future<Output = ()> + Send;
}

/// An event that carries the revision it brings the follower to.
pub(crate) trait Revisioned {
    fn revision(&self) -> i64;
}

impl Revisioned for PodEvent {
    fn revision(&self) -> i64 {
        self.resource_version
    }
}

impl Revisioned for ObjectEvent {
    fn revision(&self) -> i64 {
        self.resource_version
    }
}

/// Follows `follower`'s stream until `shutdown`: when a replica fails, moves to the next one and
/// resumes from the last revision seen; after a compaction, lists everything again.
pub(crate) async fn follow<F: Follower>(follower: &mut F, servers: &Servers, shutdown: &mut watch::Receiver<bool>) {
    let mut revision = 0;
    let mut delay = RETRY_MIN;
    loop {
        let (server, client) = servers.get();
        let opened = tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return,
            r = follower.open(client, revision) => r,
        };
        let mut stream = match opened {
            Ok(stream) => stream,
            Err(status) => {
                tracing::warn!(error = %status.message(), "{} failed, retrying", F::WHAT);
                servers.failed(server);
                if sleep_or_shutdown(&mut delay, shutdown).await {
                    return;
                }
                continue;
            }
        };
        follower.started(revision);
        loop {
            let message = tokio::select! {
                _ = shutdown.wait_for(|s| *s) => return,
                m = stream.message() => m,
            };
            match message {
                Ok(Some(event)) => {
                    delay = RETRY_MIN;
                    revision = revision.max(event.revision());
                    follower.observe(event).await;
                }
                Ok(None) => {
                    tracing::info!("{} ended, reconnecting", F::WHAT);
                    servers.failed(server);
                    break;
                }
                Err(status) => {
                    if status.code() == Code::OutOfRange {
                        revision = 0; // compacted: list again
                    }
                    tracing::warn!(error = %status.message(), "{} broke, reconnecting", F::WHAT);
                    servers.failed(server);
                    break;
                }
            }
        }
        if sleep_or_shutdown(&mut delay, shutdown).await {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_https_server_needs_the_cluster_ca() {
        let cfg = Credentials {
            join_token: Some("join-0123456789abcdef".into()),
            credential_file: "/nonexistent/node-credential".into(),
        };
        let token = Token::load(&cfg).unwrap();
        let https = ["https://192.0.2.1:8080".to_owned()];
        let refused = Servers::new(&https, token.clone(), None, None).map(|_| ()).unwrap_err();
        assert!(matches!(refused, ControlPlaneError::NoCertificateAuthority { .. }), "{refused}");
        assert!(refused.to_string().contains("--certificate-authority"), "{refused}");
        let ca = "-----BEGIN CERTIFICATE-----\nMA==\n-----END CERTIFICATE-----\n";
        assert!(Servers::new(&https, token.clone(), Some(ca), None).is_ok());
        assert!(Servers::new(&["http://127.0.0.1:8080".to_owned()], token, None, None).is_ok());
    }
}
