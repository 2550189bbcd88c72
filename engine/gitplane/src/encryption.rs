//! Secrets at rest: the key file every replica seals Secrets with (made on first start like the
//! peer token), and `gitplane secrets`, which rotates its keys while the cluster runs.
//! The envelope itself is `gitplane_storage::encryption`'s.

use crate::backend::Backend;
use anyhow::{Context as _, bail};
use gitplane_gitops::bootstrap::private_dir;
use gitplane_storage::encryption::{self, Keyring};
use gitplane_store::Store;
use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// The key file's name in the data directory.
pub const KEY_FILE: &str = "encryption-keys";

/// The keys this replica seals Secrets with: `given`, else `<data-dir>/encryption-keys`, made
/// with one fresh key if missing and `makes_cluster_secrets` (a single replica, or the one with
/// the lowest id: the others must be given a copy, as with the peer token). The file is followed:
/// a changed write key takes effect within a second, without a restart.
pub fn load_keys(data_dir: &Path, given: Option<&Path>, makes_cluster_secrets: bool) -> anyhow::Result<Keyring> {
    let path = given.map(Path::to_path_buf).unwrap_or_else(|| data_dir.join(KEY_FILE));
    if given.is_none() && makes_cluster_secrets && !path.exists() {
        private_dir(data_dir)?;
        encryption::create_key_file(&path)?;
    }
    if !path.exists() {
        bail!(
            "the cluster's Secret encryption keys ({}): a replica of a cluster of several makes them only on the \
             replica with the lowest id; copy that replica's <data-dir>/{KEY_FILE} here (mode 0600) before \
             starting this one",
            path.display()
        );
    }
    let keys = Keyring::load(&path)?;
    keys.follow_file(path, encryption::RELOAD_PERIOD);
    Ok(keys)
}

/// How often a replica checks that every Secret is sealed under the write key (and at once
/// when the write key or the leadership changes).
const CHECK_PERIOD: Duration = Duration::from_secs(10);

/// Re-encrypts in the background: whenever Secrets (or versions of them in the history) are not
/// sealed under the write key, the leader rewrites them through the store, compare-and-swap
/// on each one's revision so concurrent writes are never lost, and each replica compacts its own
/// history once none of its current Secrets is stale, so no older version remains. Level
/// triggered: a restart or a change of leader mid-way just carries on.
pub async fn reencryptor(backend: Backend, store: Arc<dyn Store>) {
    let secrets = backend.secrets();
    let mut key_changes = secrets.write_key_changes();
    let mut leading = backend.leading();
    loop {
        let lead = *leading.borrow_and_update();
        if let Err(e) = reencrypt_once(&backend, &store, lead).await {
            tracing::warn!(error = %e, "re-encrypting Secrets failed; retrying");
        }
        // A closed channel (shutting down) must not spin this loop.
        tokio::select! {
            Ok(()) = key_changes.changed() => {}
            Ok(()) = leading.changed() => {}
            _ = tokio::time::sleep(CHECK_PERIOD) => {}
        }
    }
}

async fn reencrypt_once(backend: &Backend, store: &Arc<dyn Store>, leading: bool) -> anyhow::Result<()> {
    let at_rest = backend.at_rest().await?;
    let Some(key) = at_rest.write_key else { return Ok(()) };
    if leading && !at_rest.stale.is_empty() {
        tracing::info!(secrets = at_rest.stale.len(), %key, "re-encrypting Secrets under the write key");
        let (rewritten, _) = encryption::rewrite(store.as_ref(), &at_rest.stale).await?;
        tracing::info!(rewritten, %key, "re-encrypted Secrets");
        return Ok(());
    }
    if at_rest.stale.is_empty() && at_rest.stale_history > 0 {
        let revision = store.revision().await?;
        store.compact(revision).await?;
        tracing::info!(revision, versions = at_rest.stale_history, "compacted the history of Secrets under older keys");
    }
    Ok(())
}

#[derive(clap::Args)]
pub struct SecretsArgs {
    #[command(subcommand)]
    command: SecretsCommand,
}

#[derive(clap::Subcommand)]
enum SecretsCommand {
    /// Rotate the key that encrypts Secrets at rest: put a new key first in the key file (every
    /// replica takes it up within a second), then follow each replica given in --server while
    /// the leader re-encrypts every Secret in the background (writes go on) and the history of
    /// older versions is compacted. With several replicas, copy the key file to every replica
    /// (`--no-new-key` then follows them once it is there).
    Rotate(RotateArgs),
    /// Remove every key but the first from the key file, once `rotate` is done. With several
    /// replicas, copy the file to every replica's data directory.
    RemoveOldKeys(KeyFileArgs),
}

#[derive(clap::Args)]
struct KeyFileArgs {
    /// The replica's data directory (holds encryption-keys).
    #[arg(long, default_value = "/var/lib/gitplane")]
    data_dir: PathBuf,
    /// The key file, if not `<data-dir>/encryption-keys`.
    #[arg(long)]
    encryption_key_file: Option<PathBuf>,
}

impl KeyFileArgs {
    fn path(&self) -> PathBuf {
        self.encryption_key_file.clone().unwrap_or_else(|| self.data_dir.join(KEY_FILE))
    }
}

#[derive(clap::Args)]
struct RotateArgs {
    #[command(flatten)]
    keys: KeyFileArgs,
    /// Every replica, `host:port` of its listener (repeat it).
    #[arg(long = "server", default_value = "127.0.0.1:8080")]
    servers: Vec<String>,
    /// The status API token file holding a `read` token to ask the replicas with (default:
    /// `<data-dir>/tokens.csv`, as the replica makes it).
    #[arg(long)]
    tokens_file: Option<PathBuf>,
    /// The cluster CA's certificate, to verify replicas not on loopback (HTTPS) against
    /// (default: `<data-dir>/ca.crt`).
    #[arg(long)]
    certificate_authority: Option<PathBuf>,
    /// Follow the replicas to the key file's first key without adding a new one.
    #[arg(long)]
    no_new_key: bool,
    /// How long to wait for every replica to finish.
    #[arg(long, default_value_t = 600)]
    wait_seconds: u64,
}

pub async fn secrets(args: SecretsArgs) -> anyhow::Result<()> {
    match args.command {
        SecretsCommand::Rotate(args) => rotate(args).await,
        SecretsCommand::RemoveOldKeys(keys) => {
            let path = keys.path();
            let removed = encryption::remove_old_keys(&path)?;
            println!("{}: removed {removed:?}", path.display());
            Ok(())
        }
    }
}

async fn rotate(args: RotateArgs) -> anyhow::Result<()> {
    let path = args.keys.path();
    let tokens = args.tokens_file.clone().unwrap_or_else(|| args.keys.data_dir.join("tokens.csv"));
    let token = gitplane_apiserver::authn::load_or_create(&tokens, "", false)?
        .into_iter()
        .find(|e| e.user.has(gitplane_apiserver::authn::Role::Read))
        .map(|e| e.token)
        .with_context(|| format!("{} holds no read token to ask the replicas with", tokens.display()))?;
    let write = if args.no_new_key {
        encryption::read_key_file(&path)?[0].name().to_owned()
    } else {
        let name = encryption::add_key(&path)?;
        println!("{}: key {name} now encrypts every write; the older keys still decrypt", path.display());
        if args.servers.len() > 1 {
            println!("copy {} to every replica's data directory now", path.display());
        }
        name
    };
    let ca = args.certificate_authority.clone().unwrap_or_else(|| args.keys.data_dir.join("ca.crt"));
    let tls = match args.servers.iter().any(|s| gitplane_storage::remote::serves_tls(host_of(s))) {
        true => Some(https_client(&ca)?),
        false => None,
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(args.wait_seconds);
    for server in &args.servers {
        let mut last = None;
        loop {
            let status = replica_encryption(server, &token, tls.as_ref()).await?;
            let done = status.write_key.as_deref() == Some(write.as_str())
                && status.stale_objects == 0
                && status.stale_history == 0;
            if last.as_ref() != Some(&status) {
                println!(
                    "{server}: write key {:?}, {} Secrets and {} older versions still under another key",
                    status.write_key.as_deref().unwrap_or("none"),
                    status.stale_objects,
                    status.stale_history
                );
            }
            if done {
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                bail!("the replica at {server} did not finish re-encrypting with key {write:?} in time");
            }
            last = Some(status);
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    println!(
        "done: every Secret is encrypted with key {write}. A Raft snapshot taken before now keeps older keys' \
         values until the next one; then `gitplane secrets remove-old-keys` (and copy the file to every replica)."
    );
    Ok(())
}

/// What a replica reports in its `/replica` status about encryption.
#[derive(Debug, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Status {
    write_key: Option<String>,
    stale_objects: usize,
    stale_history: i64,
}

/// The host of `host:port` (brackets kept off an IPv6 address).
fn host_of(server: &str) -> &str {
    let host = server.rsplit_once(':').map_or(server, |(host, _)| host);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// A TLS client that trusts the cluster CA in `ca` only.
fn https_client(ca: &Path) -> anyhow::Result<tokio_rustls::TlsConnector> {
    let pem = std::fs::read_to_string(ca)
        .with_context(|| format!("reading the cluster CA's certificate {} (--certificate-authority)", ca.display()))?;
    let mut roots = rustls::RootCertStore::empty();
    for der in gitplane_proto::x509::pem_blocks(&pem, "CERTIFICATE") {
        roots.add(der.into()).with_context(|| format!("{} holds no usable certificate", ca.display()))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// `/replica`: over HTTPS verified against the cluster CA, or cleartext to a replica on
/// loopback (which never leaves this machine).
async fn replica_encryption(
    server: &str,
    token: &str,
    tls: Option<&tokio_rustls::TlsConnector>,
) -> anyhow::Result<Status> {
    let read = async {
        let conn = tokio::net::TcpStream::connect(server).await?;
        let request = format!("GET /replica HTTP/1.0\r\nHost: {server}\r\nAuthorization: Bearer {token}\r\n\r\n");
        let mut response = Vec::new();
        match tls.filter(|_| gitplane_storage::remote::serves_tls(host_of(server))) {
            Some(tls) => {
                let name = rustls::pki_types::ServerName::try_from(host_of(server).to_owned())
                    .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
                let mut conn = tls.connect(name, conn).await?;
                conn.write_all(request.as_bytes()).await?;
                // A replica may close without TLS's close_notify after an HTTP/1.0 answer.
                let _ = conn.take(1 << 20).read_to_end(&mut response).await;
            }
            None => {
                let mut conn = conn;
                conn.write_all(request.as_bytes()).await?;
                conn.take(1 << 20).read_to_end(&mut response).await?;
            }
        }
        Ok::<_, std::io::Error>(response)
    };
    let response = tokio::time::timeout(Duration::from_secs(10), read)
        .await
        .with_context(|| format!("asking the replica at {server} for its status: timed out"))?
        .with_context(|| format!("asking the replica at {server} for its status"))?;
    let text = String::from_utf8_lossy(&response);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or_default();
    let status: serde_json::Value = serde_json::from_str(body)
        .with_context(|| format!("the replica at {server} answered /replica with something else than its status"))?;
    serde_json::from_value(status["encryption"].clone())
        .with_context(|| format!("the replica at {server} reports no encryption status: is it older?"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[tokio::test]
    async fn the_key_file_is_made_once_privately_and_only_by_the_maker() {
        let dir = tempfile::tempdir().unwrap();
        let follower = load_keys(dir.path(), None, false).unwrap_err().to_string();
        assert!(follower.contains("encryption-keys") && follower.contains("lowest id"), "{follower}");
        let keys = load_keys(dir.path(), None, true).unwrap();
        let path = dir.path().join(KEY_FILE);
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let text = std::fs::read_to_string(&path).unwrap();
        let again = load_keys(dir.path(), None, true).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), text, "made once");
        assert_eq!(keys.write_key(), again.write_key());
        // A replica given the file uses it as it is.
        let other = tempfile::tempdir().unwrap();
        let given = load_keys(other.path(), Some(&path), false).unwrap();
        assert_eq!(given.names(), keys.names());
        assert!(!other.path().join(KEY_FILE).exists());
    }
}
