//! The secrets a cluster makes for itself on first start, so that being safe costs no set-up
//! step: each lives in a file of the data directory (mode 0600, made once with 256 random bits,
//! never printed or logged), and the keys that never leave the replicas are derived from the
//! peer token, so every replica derives the same ones.
//!
//! - `git-token`: clone, fetch and push of hosted repositories (people, CI).
//! - `peer-token`: the replicas' shared secret for the store and Raft services.
//! - `join-token`: what a node agent presents once to join; it then holds certificates (and,
//!   joined over cleartext loopback, a node credential).
//!
//! See SECURITY.md for who holds which and how to rotate each.

use anyhow::{Context as _, bail};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use std::{
    io::Write as _,
    os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _},
    path::Path,
};

/// Whether a missing secret file may be made here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IfMissing {
    Create,
    /// Another replica makes it; this one must be given a copy.
    Refuse,
}

/// A secret from `path`, made there first if it is missing and `if_missing` allows.
pub fn load_or_create(path: &Path, if_missing: IfMissing) -> anyhow::Result<String> {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let secret = text.trim().to_owned();
            if secret.len() < 16 || !secret.bytes().all(|b| b.is_ascii_graphic()) {
                bail!(
                    "{} must hold at least 16 printable characters without spaces (e.g. `openssl rand -hex 32`)",
                    path.display()
                );
            }
            if std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o077 != 0) {
                tracing::warn!(file = %path.display(), "a secret file is readable by others: chmod 600 it");
            }
            Ok(secret)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && if_missing == IfMissing::Create => {
            let secret = hex::encode(rand::random::<[u8; 32]>());
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            }
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .with_context(|| format!("creating {}", path.display()))?;
            writeln!(file, "{secret}")?;
            file.sync_all()?;
            Ok(secret)
        }
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// Writes `text` to `path` (mode 0600: it holds a credential), replacing what was there at
/// once: a reader sees the old file or the new one, never half of one.
pub fn write_private(path: &Path, text: &str) -> anyhow::Result<()> {
    let staging = path.with_extension("new");
    let _ = std::fs::remove_file(&staging);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&staging)
        .with_context(|| format!("creating {}", staging.display()))?;
    file.write_all(text.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&staging, path).with_context(|| format!("writing {}", path.display()))
}

/// The secrets of one replica.
#[derive(Clone)]
pub struct Credentials {
    pub git_token: String,
    pub peer_token: String,
    pub join_token: String,
}

// Never print a secret.
impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Credentials(***)")
    }
}

/// Where a replica's secrets come from: files given on the command line, else the data dir.
pub struct Sources<'a> {
    pub data_dir: &'a Path,
    pub peer_token_file: Option<&'a Path>,
    pub join_token_file: Option<&'a Path>,
    /// Whether this replica makes the cluster-wide secrets when they are missing (a cluster of
    /// one, or the replica with the lowest id); the others must be given copies.
    pub makes_cluster_secrets: bool,
}

impl Credentials {
    pub fn load(sources: Sources<'_>) -> anyhow::Result<Credentials> {
        let Sources { data_dir, peer_token_file, join_token_file, makes_cluster_secrets } = sources;
        gitplane_gitops::bootstrap::private_dir(data_dir)?;
        let git_token = load_or_create(&data_dir.join("git-token"), IfMissing::Create)?;
        let cluster = |given: Option<&Path>, name: &str| -> anyhow::Result<String> {
            let (path, if_missing) = match given {
                Some(path) => (path.to_path_buf(), IfMissing::Refuse),
                None if makes_cluster_secrets => (data_dir.join(name), IfMissing::Create),
                None => (data_dir.join(name), IfMissing::Refuse),
            };
            load_or_create(&path, if_missing).with_context(|| missing_hint(&path, name))
        };
        let peer_token = cluster(peer_token_file, "peer-token")?;
        let join_token = cluster(join_token_file, "join-token")?;
        Ok(Credentials { git_token, peer_token, join_token })
    }

    /// The key that signs node credentials.
    pub fn node_key(&self) -> [u8; 32] {
        derive(&self.peer_token, "gitplane node credential v1")
    }

    /// The seed of the cluster CA's key (`tls::ClusterCa::derive`).
    pub fn ca_seed(&self) -> [u8; 32] {
        derive(&self.peer_token, "gitplane cluster ca v1")
    }

    /// The read token `authn` writes into a tokens file it makes: every replica makes the same.
    pub fn first_read_token(&self) -> String {
        hex::encode(derive(&self.peer_token, "gitplane first read token v1"))
    }

    /// The key of the digests that stand for Secret values in last-applied records.
    pub fn record_key(&self) -> [u8; 32] {
        derive(&self.peer_token, "gitplane secret record v1")
    }
}

/// The file of this replica's ServiceAccount token signing key.
pub const SERVICE_ACCOUNT_KEY: &str = "service-account-key";

/// This replica's key for ServiceAccount tokens (PKCS#8, P-256): `<data-dir>/service-account-key`
/// (base64, mode 0600), made on first start. It never leaves the replica; verifiers need only
/// its public key.
pub fn service_account_key(data_dir: &Path) -> anyhow::Result<Vec<u8>> {
    use base64::{Engine as _, engine::general_purpose::STANDARD};
    let path = data_dir.join(SERVICE_ACCOUNT_KEY);
    match std::fs::read_to_string(&path) {
        Ok(text) => STANDARD.decode(text.trim()).with_context(|| {
            format!("{} is not the base64 of a PKCS#8 key: remove it to make a new one", path.display())
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let key = gitplane_apiserver::serviceaccount::SigningKey::generate_pkcs8()?;
            write_private(&path, &format!("{}\n", STANDARD.encode(&key)))?;
            Ok(key)
        }
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

fn missing_hint(path: &Path, name: &str) -> String {
    format!(
        "the cluster's {name} ({}): a replica of a cluster of several makes it only on the replica with the \
         lowest id; copy that replica's <data-dir>/{name} here (mode 0600) before starting this one",
        path.display()
    )
}

fn derive(secret: &str, label: &str) -> [u8; 32] {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret.as_bytes()).expect("HMAC takes keys of any length");
    mac.update(label.as_bytes());
    mac.finalize().into_bytes().into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_made_once_privately_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let sources = || Sources {
            data_dir: dir.path(),
            peer_token_file: None,
            join_token_file: None,
            makes_cluster_secrets: true,
        };
        let first = Credentials::load(sources()).unwrap();
        assert_eq!(std::fs::metadata(dir.path()).unwrap().permissions().mode() & 0o777, 0o700);
        for name in ["git-token", "peer-token", "join-token"] {
            let mode = std::fs::metadata(dir.path().join(name)).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{name}");
        }
        let again = Credentials::load(sources()).unwrap();
        assert_eq!((&first.git_token, &first.peer_token), (&again.git_token, &again.peer_token));
        assert_ne!(first.node_key(), first.record_key(), "each purpose has its own key");
        assert_ne!(first.ca_seed(), first.node_key());
        assert_eq!(format!("{first:?}"), "Credentials(***)");
    }

    #[test]
    fn only_the_maker_of_cluster_secrets_makes_them() {
        let dir = tempfile::tempdir().unwrap();
        let follower = Sources {
            data_dir: dir.path(),
            peer_token_file: None,
            join_token_file: None,
            makes_cluster_secrets: false,
        };
        let error = format!("{:#}", Credentials::load(follower).unwrap_err());
        assert!(error.contains("peer-token") && error.contains("lowest id"), "{error}");
        std::fs::write(dir.path().join("peer-token"), "short\n").unwrap();
        let given = Sources {
            data_dir: dir.path(),
            peer_token_file: Some(&dir.path().join("peer-token")),
            join_token_file: None,
            makes_cluster_secrets: true,
        };
        assert!(format!("{:#}", Credentials::load(given).unwrap_err()).contains("at least 16"));
    }
}
