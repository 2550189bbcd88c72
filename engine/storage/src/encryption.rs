//! Encryption at rest of Secrets, as kube-apiserver's KMS v2 envelope does it: every write of a
//! Secret is sealed with AES-256-GCM under a data-encryption key (DEK) of its own, derived with
//! HKDF-SHA256 from a key-encryption key (KEK) of the key file and a random 32-byte seed kept in
//! the envelope. A DEK seals exactly one value, so the random 96-bit nonces of AES-GCM can never
//! repeat under one key, however many writes a KEK sees (kube's `HKDF_SHA256_XNONCE_AES_GCM_SEED`).
//!
//! The stored text is `gitplane:enc:v1:<key name>:` followed by the base64 of
//! `seed (32) | nonce (12) | ciphertext | tag (16)`. The prefix names the KEK, so values sealed
//! under several keys coexist: as in kube's `EncryptionConfiguration`, the first key of the key
//! file seals, every key opens, and text without the prefix is read as it is (a store written
//! before encryption was on). The authenticated data is the prefix and the object's key: a
//! sealed value moved to another object, or to another key name, fails to open.
//!
//! What is sealed: whole objects of the kinds in [`ENCRYPTED_KINDS`] (metadata included, as kube
//! does), in the `objects` and `events` tables of both backends, and the Raft log entries that
//! carry them ([`Keyring::seal_bytes`]). Their keys (kind, namespace, name) stay in clear, as in
//! etcd.

use aes_gcm::{
    Aes256Gcm, KeyInit as _, Nonce,
    aead::{Aead as _, Payload},
};
use base64::{Engine as _, engine::general_purpose::STANDARD as BASE64};
use gitplane_store::ObjectKey;
use hkdf::Hkdf;
use sha2::Sha256;
use std::{
    borrow::Cow,
    fmt,
    io::Write as _,
    os::unix::fs::{MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
    sync::{Arc, RwLock},
    time::Duration,
};
use tokio::sync::watch;

/// The kinds whose objects are sealed (kube encrypts `secrets` by default and nothing else).
pub const ENCRYPTED_KINDS: &[&str] = &["Secret"];

/// Whether objects of `kind` are sealed.
pub fn encrypts(kind: &str) -> bool {
    ENCRYPTED_KINDS.contains(&kind)
}

/// The start of every sealed value; the key name and a `:` follow.
pub const PREFIX: &str = "gitplane:enc:v1:";
const SEED: usize = 32;
const NONCE: usize = 12;
const TAG: usize = 16;
/// HKDF's `info`: binds a DEK to this envelope version and algorithm.
const INFO: &[u8] = b"gitplane envelope v1 AES-256-GCM";

/// One key-encryption key of the key file.
#[derive(Clone)]
pub struct Key {
    name: String,
    kek: [u8; 32],
}

impl Key {
    /// A fresh random key named `name`.
    pub fn generate(name: &str) -> Result<Key, KeyFileError> {
        check_name(name).map_err(|reason| KeyFileError::at(None, 0, reason))?;
        Ok(Key { name: name.to_owned(), kek: rand::random() })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The key file's line for this key.
    fn line(&self) -> String {
        format!("{} {}", self.name, hex::encode(self.kek))
    }

    fn dek(&self, seed: &[u8]) -> Aes256Gcm {
        let mut dek = [0u8; 32];
        // 32 bytes is far below HKDF-SHA256's limit of 255 * 32.
        let _ = Hkdf::<Sha256>::new(Some(seed), &self.kek).expand(INFO, &mut dek);
        Aes256Gcm::new(&dek.into())
    }
}

// Never print a key.
impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({:?}, ***)", self.name)
    }
}

fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if ok { Ok(()) } else { Err(format!("key name {name:?} must be 1 to 64 letters, digits, '-', '_' or '.'")) }
}

/// A key file that cannot be used, and where.
#[derive(Debug, thiserror::Error)]
#[error("{}{reason}", location(.path, *.line))]
pub struct KeyFileError {
    path: Option<PathBuf>,
    line: usize,
    reason: String,
}

fn location(path: &Option<PathBuf>, line: usize) -> String {
    match (path, line) {
        (Some(p), 0) => format!("{}: ", p.display()),
        (Some(p), l) => format!("{}:{l}: ", p.display()),
        (None, 0) => String::new(),
        (None, l) => format!("line {l}: "),
    }
}

impl KeyFileError {
    fn at(path: Option<&Path>, line: usize, reason: impl Into<String>) -> Self {
        KeyFileError { path: path.map(Path::to_path_buf), line, reason: reason.into() }
    }
}

/// Parses a key file: one key a line, `<name> <64 hex digits>`; `#` comments and blank lines
/// allowed. The first key seals; every key opens.
pub fn parse_keys(text: &str) -> Result<Vec<Key>, KeyFileError> {
    let mut keys: Vec<Key> = Vec::new();
    for (n, line) in text.lines().enumerate().map(|(n, l)| (n + 1, l.trim())) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, secret) = line
            .split_once(char::is_whitespace)
            .ok_or_else(|| KeyFileError::at(None, n, "expected `<name> <64 hex digits>`"))?;
        check_name(name).map_err(|reason| KeyFileError::at(None, n, reason))?;
        let mut kek = [0u8; 32];
        // Never quote the secret in the error.
        hex::decode_to_slice(secret.trim(), &mut kek).map_err(|_| {
            KeyFileError::at(
                None,
                n,
                format!("key {name:?} must be 64 hex digits (256 bits, e.g. `openssl rand -hex 32`)"),
            )
        })?;
        if keys.iter().any(|k| k.name == name) {
            return Err(KeyFileError::at(None, n, format!("key name {name:?} appears twice")));
        }
        keys.push(Key { name: name.to_owned(), kek });
    }
    if keys.is_empty() {
        return Err(KeyFileError::at(None, 0, "holds no key: the first key encrypts, so at least one is needed"));
    }
    Ok(keys)
}

const HEADER: &str = "# gitplane encryption keys for Secrets at rest: `<name> <64 hex digits>` a line.\n\
                      # The first key encrypts every write; every key decrypts. The same file on every replica.\n";

fn render(keys: &[Key]) -> String {
    let mut text = HEADER.to_owned();
    for key in keys {
        text.push_str(&key.line());
        text.push('\n');
    }
    text
}

/// Reads the key file at `path`.
pub fn read_key_file(path: &Path) -> Result<Vec<Key>, KeyFileError> {
    let text = std::fs::read_to_string(path).map_err(|e| KeyFileError::at(Some(path), 0, e.to_string()))?;
    if std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o077 != 0) {
        tracing::warn!(file = %path.display(), "the encryption key file is readable by others: chmod 600 it");
    }
    parse_keys(&text).map_err(|e| KeyFileError { path: Some(path.to_path_buf()), ..e })
}

/// Makes a key file with one fresh key at `path` (mode 0600); fails if the file exists.
pub fn create_key_file(path: &Path) -> Result<Vec<Key>, KeyFileError> {
    let keys = vec![Key::generate(&new_key_name())?];
    write_new(path, &render(&keys)).map_err(|e| KeyFileError::at(Some(path), 0, e.to_string()))?;
    Ok(keys)
}

/// Puts a fresh key first in the key file at `path` (it encrypts from then on; the others still
/// decrypt), replacing the file atomically. Returns the new key's name.
pub fn add_key(path: &Path) -> Result<String, KeyFileError> {
    let mut keys = read_key_file(path)?;
    let mut name = new_key_name();
    while keys.iter().any(|k| k.name == name) {
        name.push('x');
    }
    keys.insert(0, Key::generate(&name)?);
    replace(path, &render(&keys))?;
    Ok(name)
}

/// Removes every key but the first from the key file at `path`. Returns the removed names.
pub fn remove_old_keys(path: &Path) -> Result<Vec<String>, KeyFileError> {
    let mut keys = read_key_file(path)?;
    let removed = keys.split_off(1).into_iter().map(|k| k.name).collect();
    replace(path, &render(&keys))?;
    Ok(removed)
}

fn replace(path: &Path, text: &str) -> Result<(), KeyFileError> {
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    write_new(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| KeyFileError::at(Some(path), 0, e.to_string()))
}

fn write_new(path: &Path, text: &str) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()
}

/// `key-<UTC time>`: names sort by age and say when a key was made.
fn new_key_name() -> String {
    let now = k8s_openapi::jiff::Timestamp::now();
    format!("key-{}", now.strftime("%Y%m%dT%H%M%SZ"))
}

/// A value that cannot be opened: which object, under which key, and why. Never the value.
#[derive(Debug, thiserror::Error)]
#[error("cannot decrypt {what}: {reason}")]
pub struct DecryptError {
    what: String,
    /// The key the value names, if it names one.
    pub key: Option<String>,
    reason: String,
}

/// The keys of a store: the write key and the read keys, shared by every backend of a process
/// and replaced at once when the key file changes ([`Keyring::follow_file`]). Empty: nothing is
/// sealed (tests; a store that keeps plaintext), but sealed values still fail to open clearly.
#[derive(Clone)]
pub struct Keyring {
    keys: Arc<RwLock<Arc<[Key]>>>,
    /// The write key's name, for whoever waits for a new one.
    write: watch::Sender<Option<String>>,
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Keyring({:?})", self.names())
    }
}

impl Keyring {
    /// Seals nothing.
    pub fn identity() -> Keyring {
        Keyring::new(Vec::new())
    }

    /// The first key seals, every key opens.
    pub fn new(keys: Vec<Key>) -> Keyring {
        let (write, _) = watch::channel(keys.first().map(|k| k.name.clone()));
        Keyring { keys: Arc::new(RwLock::new(keys.into())), write }
    }

    /// The keys of the file at `path`.
    pub fn load(path: &Path) -> Result<Keyring, KeyFileError> {
        Ok(Keyring::new(read_key_file(path)?))
    }

    fn keys(&self) -> Arc<[Key]> {
        self.keys.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces the keys (every later write seals under the new first key).
    pub fn set(&self, keys: Vec<Key>) {
        let name = keys.first().map(|k| k.name.clone());
        *self.keys.write().unwrap_or_else(|e| e.into_inner()) = keys.into();
        self.write.send_if_modified(|current| std::mem::replace(current, name.clone()) != name);
    }

    /// The name of the key that seals, if any.
    pub fn write_key(&self) -> Option<String> {
        self.write.borrow().clone()
    }

    /// Follows the write key's name.
    pub fn write_key_changes(&self) -> watch::Receiver<Option<String>> {
        self.write.subscribe()
    }

    /// Every key's name, the write key first.
    pub fn names(&self) -> Vec<String> {
        self.keys().iter().map(|k| k.name.clone()).collect()
    }

    /// Re-reads the key file at `path` whenever it changes (checked every `period`) while the
    /// keyring lives, so a new write key takes effect without a restart. A file that cannot be
    /// used leaves the keys as they were (and says why).
    pub fn follow_file(&self, path: PathBuf, period: Duration) {
        let weak = Arc::downgrade(&self.keys);
        let write = self.write.clone();
        let stamp = |p: &Path| std::fs::metadata(p).ok().map(|m| (m.modified().ok(), m.len(), m.ino()));
        let mut seen = stamp(&path);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            loop {
                tick.tick().await;
                let Some(keys) = weak.upgrade() else { return };
                let now = stamp(&path);
                if now == seen {
                    continue;
                }
                seen = now;
                match read_key_file(&path) {
                    Ok(new) => {
                        let ring = Keyring { keys, write: write.clone() };
                        ring.set(new);
                        tracing::info!(write_key = ?ring.write_key(), keys = ?ring.names(), "encryption keys reloaded");
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "the encryption key file changed but cannot be used; keeping the keys in use")
                    }
                }
            }
        });
    }

    /// The text to store for `text`, the JSON of the object at `key`: sealed when its kind is
    /// and a write key exists.
    pub fn seal(&self, key: &ObjectKey, text: String) -> String {
        if !encrypts(&key.kind) {
            return text;
        }
        self.seal_bytes(&object_aad(key), text.as_bytes()).unwrap_or(text)
    }

    /// The JSON of the object at `key` from its stored text.
    pub fn open<'a>(&self, key: &ObjectKey, stored: &'a str) -> Result<Cow<'a, str>, DecryptError> {
        if !stored.starts_with(PREFIX) {
            return Ok(Cow::Borrowed(stored));
        }
        let what = || format!("{} {}", key.kind, key_display(key));
        let bytes = self.open_bytes(&object_aad(key), stored).map_err(|(k, reason)| DecryptError {
            what: what(),
            key: k,
            reason,
        })?;
        String::from_utf8(bytes).map(Cow::Owned).map_err(|_| DecryptError {
            what: what(),
            key: None,
            reason: "the decrypted value is not UTF-8".into(),
        })
    }

    /// `plaintext` sealed under the write key, bound to `aad`; `None` without a write key.
    pub fn seal_bytes(&self, aad: &[u8], plaintext: &[u8]) -> Option<String> {
        let keys = self.keys();
        let key = keys.first()?;
        let prefix = format!("{PREFIX}{}:", key.name);
        let seed: [u8; SEED] = rand::random();
        let nonce: [u8; NONCE] = rand::random();
        let aad = [prefix.as_bytes(), aad].concat();
        // Encryption fails only for plaintexts beyond AES-GCM's 64 GiB.
        let sealed = key.dek(&seed).encrypt(Nonce::from_slice(&nonce), Payload { msg: plaintext, aad: &aad }).ok()?;
        let mut body = Vec::with_capacity(SEED + NONCE + sealed.len());
        body.extend_from_slice(&seed);
        body.extend_from_slice(&nonce);
        body.extend_from_slice(&sealed);
        Some(prefix + &BASE64.encode(body))
    }

    /// Opens what [`Keyring::seal_bytes`] made with the same `aad`; on failure, the key the text
    /// names and why.
    pub fn open_bytes(&self, aad: &[u8], stored: &str) -> Result<Vec<u8>, (Option<String>, String)> {
        let rest = stored.strip_prefix(PREFIX).ok_or((None, "it is not a gitplane envelope".to_owned()))?;
        let (name, body) =
            rest.split_once(':').ok_or((None, "the envelope names no key (it is truncated or damaged)".to_owned()))?;
        let keys = self.keys();
        let key = keys.iter().find(|k| k.name == name).ok_or_else(|| {
            let known = if keys.is_empty() {
                "none".to_owned()
            } else {
                keys.iter().map(|k| k.name.as_str()).collect::<Vec<_>>().join(", ")
            };
            (
                Some(name.to_owned()),
                format!(
                    "it was encrypted with key {name:?}, which is not in the encryption key file (keys: {known}); \
                     put that key back in the file"
                ),
            )
        })?;
        let damaged = || (Some(name.to_owned()), format!("the envelope under key {name:?} is damaged or was altered"));
        let body = BASE64.decode(body).map_err(|_| damaged())?;
        if body.len() < SEED + NONCE + TAG {
            return Err(damaged());
        }
        let (seed, rest) = body.split_at(SEED);
        let (nonce, sealed) = rest.split_at(NONCE);
        let aad = [&stored.as_bytes()[..PREFIX.len() + name.len() + 1], aad].concat();
        key.dek(seed).decrypt(Nonce::from_slice(nonce), Payload { msg: sealed, aad: &aad }).map_err(|_| damaged())
    }
}

/// The name of the key a stored text is sealed under; `None` for plaintext.
pub fn sealed_with(stored: &str) -> Option<&str> {
    stored.strip_prefix(PREFIX)?.split_once(':').map(|(name, _)| name)
}

fn key_display(key: &ObjectKey) -> String {
    if key.namespace.is_empty() { key.name.clone() } else { format!("{}/{}", key.namespace, key.name) }
}

/// What a sealed object is bound to: its key, fields separated by NUL (which no key holds).
fn object_aad(key: &ObjectKey) -> Vec<u8> {
    [key.kind.as_bytes(), b"\0", key.namespace.as_bytes(), b"\0", key.name.as_bytes()].concat()
}

/// Where a store's sealed objects stand against its write key.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AtRest {
    /// The write key's name.
    pub write_key: Option<String>,
    /// Objects of the encrypted kinds not sealed under the write key (in clear, or under an
    /// older key). Empty without a write key.
    #[serde(skip)]
    pub stale: Vec<ObjectKey>,
    /// How many; `stale.len()`.
    pub stale_objects: usize,
    /// Versions of them in the watch history not sealed under the write key.
    pub stale_history: i64,
}

impl AtRest {
    /// Reads where one database's sealed objects stand against `secrets`' write key. The
    /// queries are the same text for SQLite and Postgres (both take `$n` parameters).
    pub(crate) async fn read<DB>(secrets: &Keyring, pool: &sqlx::Pool<DB>) -> gitplane_store::Result<AtRest>
    where
        DB: sqlx::Database,
        for<'q> &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
        for<'q> String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
        for<'q> <DB as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
        for<'c> &'c mut <DB as sqlx::Database>::Connection: sqlx::Executor<'c, Database = DB>,
        for<'r> (String, String): sqlx::FromRow<'r, DB::Row>,
        for<'r> (i64,): sqlx::FromRow<'r, DB::Row>,
    {
        let Some(write) = secrets.write_key() else { return Ok(AtRest::default()) };
        let prefix = prefix_of(&write);
        let mut at_rest = AtRest { write_key: Some(write), ..AtRest::default() };
        for &kind in ENCRYPTED_KINDS {
            let rows: Vec<(String, String)> = sqlx::query_as(
                "SELECT namespace, name FROM objects WHERE kind = $1 AND substr(value, 1, length($2)) <> $2",
            )
            .bind(kind)
            .bind(prefix.clone())
            .fetch_all(pool)
            .await
            .map_err(crate::db)?;
            at_rest.stale.extend(rows.into_iter().map(|(ns, name)| ObjectKey::new(kind, ns, name)));
            let history: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM events WHERE kind = $1 AND substr(value, 1, length($2)) <> $2",
            )
            .bind(kind)
            .bind(prefix.clone())
            .fetch_one(pool)
            .await
            .map_err(crate::db)?;
            at_rest.stale_history += history;
        }
        at_rest.stale_objects = at_rest.stale.len();
        Ok(at_rest)
    }
}

/// The stored prefix of values sealed under `key`.
pub fn prefix_of(key: &str) -> String {
    format!("{PREFIX}{key}:")
}

/// Writes each of `keys` back unchanged, so the store seals it under its current write key,
/// while other writes go on: each rewrite compares-and-swaps on the object's resourceVersion,
/// and when a concurrent write got there first it reads the object again and retries, so no
/// concurrent write is ever overwritten. Returns how many were rewritten and the last revision.
pub async fn rewrite(store: &dyn gitplane_store::Store, keys: &[ObjectKey]) -> gitplane_store::Result<(usize, i64)> {
    use gitplane_store::Op;
    let (mut rewritten, mut revision) = (0, 0);
    for key in keys {
        let mut current = store.get(key).await?;
        while let Some(object) = current.take() {
            match store.txn(vec![Op::Update(object)]).await {
                Ok(committed) => {
                    rewritten += 1;
                    revision = committed.revision;
                }
                Err(e) if e.is_conflict() => current = store.get(key).await?,
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok((rewritten, revision))
}

/// How often a replica looks at its key file for a change.
pub const RELOAD_PERIOD: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(names: &[&str]) -> Keyring {
        Keyring::new(names.iter().map(|n| Key::generate(n).unwrap()).collect())
    }

    fn secret() -> ObjectKey {
        ObjectKey::new("Secret", "a", "db")
    }

    const JSON: &str = r#"{"kind":"Secret","data":{"password":"aHVudGVyMg=="}}"#;

    #[test]
    fn a_secret_round_trips_and_is_not_stored_in_clear() {
        let ring = ring(&["k1"]);
        let sealed = ring.seal(&secret(), JSON.into());
        assert!(sealed.starts_with("gitplane:enc:v1:k1:"), "{sealed}");
        assert!(!sealed.contains("aHVudGVyMg"));
        assert_eq!(sealed_with(&sealed), Some("k1"));
        assert_eq!(ring.open(&secret(), &sealed).unwrap(), JSON);
    }

    #[test]
    fn other_kinds_and_an_empty_keyring_store_plaintext_and_plaintext_reads_as_is() {
        let ring = ring(&["k1"]);
        let pod = ObjectKey::new("Pod", "a", "p");
        assert_eq!(ring.seal(&pod, JSON.into()), JSON);
        assert_eq!(Keyring::identity().seal(&secret(), JSON.into()), JSON);
        assert_eq!(ring.open(&secret(), JSON).unwrap(), JSON, "a store from before encryption");
    }

    #[test]
    fn every_seal_has_its_own_seed_and_nonce() {
        let ring = ring(&["k1"]);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..1000 {
            let sealed = ring.seal(&secret(), JSON.into());
            let body = BASE64.decode(sealed.rsplit(':').next().unwrap()).unwrap();
            assert!(seen.insert(body[..SEED].to_vec()), "a seed repeated");
            assert!(seen.insert(body[SEED..SEED + NONCE].to_vec()), "a nonce repeated");
        }
    }

    #[test]
    fn tampering_moving_and_renaming_are_detected() {
        let ring = ring(&["k1", "k2"]);
        let sealed = ring.seal(&secret(), JSON.into());
        // One bit of the ciphertext flipped.
        let (head, body) = sealed.rsplit_once(':').unwrap();
        let mut bytes = BASE64.decode(body).unwrap();
        let last = bytes.len() - 20;
        bytes[last] ^= 1;
        let flipped = format!("{head}:{}", BASE64.encode(&bytes));
        let e = ring.open(&secret(), &flipped).unwrap_err().to_string();
        assert!(e.contains("Secret a/db") && e.contains("damaged or was altered"), "{e}");
        // The same envelope under another object's key.
        assert!(ring.open(&ObjectKey::new("Secret", "a", "other"), &sealed).is_err());
        // Claiming the other key of the ring.
        let renamed = sealed.replacen(":k1:", ":k2:", 1);
        assert!(ring.open(&secret(), &renamed).is_err());
        // Truncated.
        assert!(ring.open(&secret(), &sealed[..40]).is_err());
        assert!(ring.open(&secret(), "gitplane:enc:v1:k1").is_err());
        assert!(ring.open(&secret(), "gitplane:enc:v1:k1:!!!").is_err());
    }

    #[test]
    fn an_unknown_key_names_the_object_and_the_key_never_the_value() {
        let sealed = ring(&["old"]).seal(&secret(), JSON.into());
        let e = ring(&["new"]).open(&secret(), &sealed).unwrap_err();
        assert_eq!(e.key.as_deref(), Some("old"));
        let text = e.to_string();
        assert!(text.contains("Secret a/db") && text.contains("\"old\"") && text.contains("keys: new"), "{text}");
        assert!(!text.contains("aHVudGVyMg"));
        let e = Keyring::identity().open(&secret(), &sealed).unwrap_err().to_string();
        assert!(e.contains("keys: none"), "{e}");
    }

    #[test]
    fn the_first_key_seals_and_every_key_opens() {
        let old = Key::generate("old").unwrap();
        let new = Key::generate("new").unwrap();
        let before = Keyring::new(vec![old.clone()]).seal(&secret(), JSON.into());
        let ring = Keyring::new(vec![new, old]);
        assert_eq!(ring.open(&secret(), &before).unwrap(), JSON);
        let after = ring.seal(&secret(), JSON.into());
        assert_eq!(sealed_with(&after), Some("new"));
        ring.set(vec![Key::generate("newer").unwrap()]);
        assert_eq!(ring.write_key().as_deref(), Some("newer"));
        assert!(ring.open(&secret(), &before).is_err(), "the removed key opens nothing");
    }

    #[test]
    fn key_files_are_checked_and_never_quote_a_secret() {
        let hex64 = "ab".repeat(32);
        let keys = parse_keys(&format!("# comment\n\nk2 {hex64}\nk1\t{hex64}\n")).unwrap();
        assert_eq!(keys.iter().map(Key::name).collect::<Vec<_>>(), ["k2", "k1"]);
        let bad_secret = "k1 0123456789abcdefSECRETSECRET";
        for (text, want) in [
            ("", "holds no key"),
            ("k1", "expected"),
            (bad_secret, "64 hex digits"),
            (&format!("k:1 {hex64}"), "key name"),
            (&format!("k1 {hex64}\nk1 {hex64}"), "twice"),
        ] {
            let e = parse_keys(text).expect_err(text).to_string();
            assert!(e.contains(want), "{text}: {e}");
            assert!(!e.contains("SECRET") && !e.contains(&hex64), "{e}");
        }
        assert_eq!(format!("{:?}", keys[0]), "Key(\"k2\", ***)");
    }

    #[test]
    fn key_files_are_made_privately_and_rotated_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("encryption-keys");
        let first = create_key_file(&path).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert!(create_key_file(&path).is_err(), "made once");
        let name = add_key(&path).unwrap();
        let keys = read_key_file(&path).unwrap();
        assert_eq!(keys.iter().map(Key::name).collect::<Vec<_>>(), [name.as_str(), first[0].name()]);
        assert_eq!(keys[1].kek, first[0].kek, "the old key is kept for reading");
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(remove_old_keys(&path).unwrap(), [first[0].name().to_owned()]);
        assert_eq!(read_key_file(&path).unwrap().len(), 1);
    }

    #[tokio::test]
    async fn a_changed_key_file_is_followed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("encryption-keys");
        create_key_file(&path).unwrap();
        let ring = Keyring::load(&path).unwrap();
        ring.follow_file(path.clone(), Duration::from_millis(20));
        let mut changes = ring.write_key_changes();
        let name = add_key(&path).unwrap();
        tokio::time::timeout(Duration::from_secs(30), changes.wait_for(|k| k.as_deref() == Some(name.as_str())))
            .await
            .expect("the new write key is taken up")
            .unwrap();
    }
}
