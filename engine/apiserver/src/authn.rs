//! Authentication of the status API's callers: a bearer token to a user and roles, from a
//! static token file in Kubernetes' CSV format (`--token-auth-file`):
//!
//! ```text
//! token,user,uid,"role1,role2"[,expires]
//! ```
//!
//! Roles: `read` (the status API: discovery, get, list, watch, logs) and `debug` (exec, attach
//! and port-forward). A role grants only itself: a `debug`-only token reads nothing. Lines that
//! are empty or start with `#` are skipped. The optional fifth field, an RFC 3339 time, is when
//! the token stops working (what `gitplane token create --ttl` writes). The file is read again
//! whenever it changes ([`follow`]); one that cannot be used leaves the tokens as they were.
//!
//! ServiceAccount tokens ([`crate::serviceaccount`]) authenticate as their ServiceAccount's user
//! while the Pod they are bound to exists with the same uid ([`ServiceAccountTokens`]); RBAC
//! decides what they may do.
//!
//! Tokens are kept only as SHA-256 digests and compared in constant time with every entry (no
//! early exit), so neither a token's length nor its position leaks; no error, log line or
//! answer ever quotes one.

use crate::serviceaccount::{Claims, ISSUER, TokenError, VerifyingKeys};
use anyhow::{Context as _, bail};
use gitplane_store::ObjectKey;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, ServiceAccount};
use k8s_openapi::jiff::Timestamp;
use sha2::{Digest as _, Sha256};
use std::{
    io::Write as _,
    os::unix::fs::{MetadataExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
    sync::{Arc, RwLock},
    time::Duration,
};
use subtle::ConstantTimeEq as _;

/// What a token may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Read,
    Debug,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Debug => "debug",
        }
    }

    pub fn parse(text: &str) -> Option<Role> {
        match text {
            "read" => Some(Role::Read),
            "debug" => Some(Role::Debug),
            _ => None,
        }
    }
}

/// Who made a request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub uid: String,
    pub roles: Vec<Role>,
    /// The groups RBAC's subjects may name (a ServiceAccount's; static tokens have none).
    pub groups: Vec<String>,
}

impl User {
    pub fn has(&self, role: Role) -> bool {
        self.roles.contains(&role)
    }
}

/// One line of a token file.
pub struct Entry {
    pub token: String,
    pub user: User,
    /// When the token stops working; never when `None`.
    pub expires: Option<Timestamp>,
}

// Never print a token.
impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entry").field("token", &"***").field("user", &self.user).finish()
    }
}

/// A token as kept: its digest, its user and when it expires.
type Digested = ([u8; 32], Arc<User>, Option<Timestamp>);

/// The tokens a replica accepts, replaced whole when the token file changes.
#[derive(Default)]
pub struct Tokens {
    entries: RwLock<Arc<Vec<Digested>>>,
}

impl Tokens {
    pub fn new(entries: &[Entry]) -> Tokens {
        let tokens = Tokens::default();
        tokens.replace(entries);
        tokens
    }

    /// From now on, exactly `entries`.
    pub fn replace(&self, entries: &[Entry]) {
        let digested = entries.iter().map(|e| (digest(&e.token), Arc::new(e.user.clone()), e.expires)).collect();
        *self.entries.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(digested);
    }

    /// The user `token` stands for, if any and unexpired.
    pub fn authenticate(&self, token: &str) -> Option<Arc<User>> {
        let entries = self.entries.read().unwrap_or_else(|e| e.into_inner()).clone();
        let given = digest(token);
        let mut found = None;
        for (expected, user, expires) in entries.iter() {
            if bool::from(given.ct_eq(expected)) {
                found = Some((user, *expires));
            }
        }
        let (user, expires) = found?;
        expires.is_none_or(|at| Timestamp::now() < at).then(|| user.clone())
    }
}

/// Reads the token file at `path` again whenever it changes (checked every second) while
/// `tokens` lives elsewhere too: `gitplane token create` and `revoke`, or an operator's edit,
/// take effect without a restart. A file that cannot be used keeps the tokens as they were.
pub fn follow(path: PathBuf, tokens: &Arc<Tokens>) {
    let weak = Arc::downgrade(tokens);
    let stamp = |p: &Path| std::fs::metadata(p).ok().map(|m| (m.modified().ok(), m.len(), m.ino()));
    let mut seen = stamp(&path);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            let Some(tokens) = weak.upgrade() else { return };
            let now = stamp(&path);
            if now == seen {
                continue;
            }
            seen = now;
            match std::fs::read_to_string(&path).map_err(anyhow::Error::from).and_then(|text| parse(&text, &path)) {
                Ok(entries) => {
                    tokens.replace(&entries);
                    tracing::info!(file = %path.display(), tokens = entries.len(), "token file reloaded");
                }
                Err(e) => tracing::error!(
                    file = %path.display(),
                    error = format!("{e:#}"),
                    "the token file changed but cannot be used; keeping the tokens in use"
                ),
            }
        }
    });
}

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Parses a token file's text; errors name the file and line, never the token.
pub fn parse(text: &str, file: &Path) -> anyhow::Result<Vec<Entry>> {
    let mut entries: Vec<Entry> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = || format!("{} line {}", file.display(), i + 1);
        let fields = split_csv(line).with_context(|| format!("{}: an unterminated quote", at()))?;
        if !(3..=5).contains(&fields.len()) {
            bail!("{}: expected token,user,uid[,\"role,...\"[,expires]], found {} fields", at(), fields.len());
        }
        let token = fields[0].trim();
        if token.len() < 16 || !token.bytes().all(|b| b.is_ascii_graphic()) {
            bail!("{}: the token must be at least 16 printable characters (e.g. `openssl rand -hex 32`)", at());
        }
        let (name, uid) = (fields[1].trim(), fields[2].trim());
        if name.is_empty() {
            bail!("{}: the user name is empty", at());
        }
        let mut roles = Vec::new();
        for role in fields.get(3).map(String::as_str).unwrap_or("").split(',').map(str::trim).filter(|r| !r.is_empty())
        {
            let role = Role::parse(role)
                .with_context(|| format!("{}: unknown role {role:?} (the roles are read and debug)", at()))?;
            if !roles.contains(&role) {
                roles.push(role);
            }
        }
        if let Some(earlier) = entries.iter().position(|e| e.token == token) {
            bail!("{}: the same token as entry {} (each token names one user)", at(), earlier + 1);
        }
        let expires = match fields.get(4).map(|f| f.trim()).filter(|f| !f.is_empty()) {
            Some(text) => Some(text.parse::<Timestamp>().map_err(|_| {
                anyhow::anyhow!("{}: the expiry {text:?} is not an RFC 3339 time such as 2026-01-02T15:04:05Z", at())
            })?),
            None => None,
        };
        let user = User { name: name.to_owned(), uid: uid.to_owned(), roles, groups: Vec::new() };
        entries.push(Entry { token: token.to_owned(), user, expires });
    }
    Ok(entries)
}

/// The fields of one CSV line (double quotes group, `""` is a quote).
fn split_csv(line: &str) -> Option<Vec<String>> {
    let (mut fields, mut field, mut quoted) = (Vec::new(), String::new(), false);
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                chars.next();
                field.push('"');
            }
            ('"', _) => quoted = !quoted,
            (',', false) => fields.push(std::mem::take(&mut field)),
            _ => field.push(c),
        }
    }
    if quoted {
        return None;
    }
    fields.push(field);
    Some(fields)
}

/// The entries of the token file at `path`; a missing file is made first (mode 0600) with one
/// `read` token, `first_read_token`, for the user `admin`, when `create` allows.
pub fn load_or_create(path: &Path, first_read_token: &str, create: bool) -> anyhow::Result<Vec<Entry>> {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            if std::fs::metadata(path)
                .is_ok_and(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o077 != 0)
            {
                tracing::warn!(file = %path.display(), "the token file is readable by others: chmod 600 it");
            }
            parse(&text, path)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && create => {
            let text = format!(
                "# gitplane's status API tokens: token,user,uid,\"roles\"[,expires] (roles: read, debug; expires: \
                 RFC 3339). Read again when it changes; `gitplane token create` adds one.\n\
                 {first_read_token},admin,admin,\"read\"\n"
            );
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
                .with_context(|| format!("creating {}", path.display()))?;
            file.write_all(text.as_bytes())?;
            file.sync_all()?;
            parse(&text, path)
        }
        Err(e) => Err(e).with_context(|| format!("reading the token file {}", path.display())),
    }
}

/// The most verified ServiceAccount tokens remembered, so a client's every request does not pay
/// for a signature check; past it the memory starts over.
const VERIFIED_CACHE: usize = 4096;

/// ServiceAccount tokens: signature (this replica's key, else any replica's published one),
/// issuer, audience and time checked once per token ([`VerifyingKeys::verify`], remembered by
/// digest), and at every request that the bound Pod
/// and the ServiceAccount still exist with the uids the token names (as kube-apiserver's
/// validator looks them up in its informers).
pub struct ServiceAccountTokens {
    keys: VerifyingKeys,
    /// Holds the Pods and ServiceAccounts.
    objects: gitplane_store::informer::Informer,
    verified: std::sync::Mutex<std::collections::HashMap<[u8; 32], Arc<Claims>>>,
}

impl ServiceAccountTokens {
    pub fn new(keys: VerifyingKeys, objects: gitplane_store::informer::Informer) -> ServiceAccountTokens {
        ServiceAccountTokens { keys, objects, verified: Default::default() }
    }

    /// The ServiceAccount's user, or why the token is refused (never quoting it).
    pub fn authenticate(&self, token: &str) -> Result<Arc<User>, String> {
        let now = Timestamp::now().as_second();
        let digest = digest(token);
        let remembered = self.verified.lock().unwrap_or_else(|e| e.into_inner()).get(&digest).cloned();
        let claims = match remembered {
            Some(claims) if now <= claims.exp => claims,
            Some(_) => return Err(TokenError::Expired.to_string()),
            None => {
                let claims = match self.keys.verify(token, ISSUER, now) {
                    // Another replica's, perhaps: with every published key.
                    Err(TokenError::Signature) => {
                        let published = self.objects.cache().get(&ObjectKey::of::<ConfigMap>(
                            crate::serviceaccount::PUBLISHED_KEYS_NAMESPACE,
                            crate::serviceaccount::PUBLISHED_KEYS_NAME,
                        ));
                        let keys =
                            self.keys.with(published.as_deref().map(VerifyingKeys::published).unwrap_or_default());
                        keys.verify(token, ISSUER, now)
                    }
                    other => other,
                };
                let claims = Arc::new(claims.map_err(|e| e.to_string())?);
                let mut verified = self.verified.lock().unwrap_or_else(|e| e.into_inner());
                if verified.len() >= VERIFIED_CACHE {
                    verified.clear();
                }
                verified.insert(digest, claims.clone());
                claims
            }
        };
        let bound = &claims.kubernetes;
        let cache = self.objects.cache();
        let uid_of = |key: ObjectKey| cache.get(&key).map(|o| o["metadata"]["uid"].as_str().unwrap_or("").to_owned());
        let pod = uid_of(ObjectKey::of::<Pod>(&bound.namespace, &bound.pod.name));
        if pod.as_deref() != Some(bound.pod.uid.as_str()) {
            return Err(format!("the Pod {}/{} it is bound to no longer exists", bound.namespace, bound.pod.name));
        }
        let account = uid_of(ObjectKey::of::<ServiceAccount>(&bound.namespace, &bound.serviceaccount.name));
        if account.as_deref() != Some(bound.serviceaccount.uid.as_str()) {
            return Err(format!(
                "the ServiceAccount {}/{} it names no longer exists",
                bound.namespace, bound.serviceaccount.name
            ));
        }
        Ok(Arc::new(User {
            name: claims.sub.clone(),
            uid: bound.serviceaccount.uid.clone(),
            roles: Vec::new(),
            groups: crate::serviceaccount::groups(&bound.namespace),
        }))
    }
}

/// How the status API admits requests.
#[derive(Clone)]
pub struct ApiAccess {
    pub tokens: Arc<Tokens>,
    /// ServiceAccount tokens, where the replica issues them.
    pub service_accounts: Option<Arc<ServiceAccountTokens>>,
    /// What ServiceAccounts may read (their tokens carry no roles).
    pub rbac: Option<Arc<crate::rbac::RbacAuthorizer>>,
    /// `gitplane up`: reads from loopback need no token.
    pub anonymous_loopback_reads: bool,
    pub audit: crate::audit::AuditLog,
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "# a comment\n\
        0123456789abcdef0123456789abcdef,alice,1001,\"read\"\n\
        fedcba9876543210fedcba9876543210,bob,1002,\"debug,read\"\n\
        \n\
        aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa,carol,1003,debug\n\
        bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb,dave,1004\n";

    #[test]
    fn tokens_name_users_and_their_roles() {
        let entries = parse(FILE, Path::new("tokens.csv")).unwrap();
        let tokens = Tokens::new(&entries);
        let who = |t: &str| tokens.authenticate(t).map(|u| (u.name.clone(), u.roles.clone()));
        assert_eq!(who("0123456789abcdef0123456789abcdef"), Some(("alice".into(), vec![Role::Read])));
        assert_eq!(who("fedcba9876543210fedcba9876543210"), Some(("bob".into(), vec![Role::Debug, Role::Read])));
        assert_eq!(who("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"), Some(("carol".into(), vec![Role::Debug])));
        assert_eq!(who("bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"), Some(("dave".into(), vec![])));
        assert_eq!(who("0123456789abcdef0123456789abcdeX"), None);
        assert_eq!(who(""), None);
        assert!(format!("{:?}", entries[0]).contains("***") && !format!("{:?}", entries[0]).contains("0123"));
    }

    #[test]
    fn expired_tokens_stop_working_and_a_new_file_replaces_the_old() {
        let text = "0123456789abcdef0123456789abcdef,old,1,\"read\",2001-01-01T00:00:00Z\n\
                    fedcba9876543210fedcba9876543210,new,2,\"read\",2999-01-01T00:00:00Z\n";
        let tokens = Tokens::new(&parse(text, Path::new("tokens.csv")).unwrap());
        assert_eq!(tokens.authenticate("0123456789abcdef0123456789abcdef"), None, "expired");
        assert_eq!(tokens.authenticate("fedcba9876543210fedcba9876543210").map(|u| u.name.clone()), Some("new".into()));
        tokens.replace(&parse(FILE, Path::new("tokens.csv")).unwrap());
        assert_eq!(tokens.authenticate("fedcba9876543210fedcba9876543210").map(|u| u.name.clone()), Some("bob".into()));
        let bad = parse("0123456789abcdef0123456789abcdef,a,1,read,tomorrow", Path::new("t.csv")).unwrap_err();
        assert!(format!("{bad:#}").contains("line 1: the expiry \"tomorrow\" is not an RFC 3339 time"), "{bad:#}");
    }

    #[test]
    fn bad_lines_are_named_without_their_token() {
        let secret = "0123456789abcdef0123456789abcdef";
        let cases = [
            (format!("{secret},alice,1,\"read,admin\""), "line 1: unknown role \"admin\""),
            (format!("{secret},alice"), "line 1: expected token,user,uid"),
            ("short,alice,1".to_owned(), "line 1: the token must be at least 16"),
            (format!("\n{secret},alice,1,\"read"), "line 2: an unterminated quote"),
            (format!("{secret},,1"), "line 1: the user name is empty"),
            (format!("{secret},a,1\n{secret},b,2"), "line 2: the same token as entry 1"),
        ];
        for (text, expected) in cases {
            let error = format!("{:#}", parse(&text, Path::new("t.csv")).unwrap_err());
            assert!(error.contains(expected), "{text:?}: {error}");
            assert!(!error.contains(secret), "{error}");
        }
    }

    #[test]
    fn a_missing_file_is_made_once_with_a_read_token() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.csv");
        assert!(load_or_create(&path, "0123456789abcdef0123456789abcdef", false).is_err());
        let made = load_or_create(&path, "0123456789abcdef0123456789abcdef", true).unwrap();
        assert_eq!(made.len(), 1);
        assert_eq!(made[0].user.roles, [Role::Read]);
        let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&path).unwrap().permissions());
        assert_eq!(mode & 0o777, 0o600);
        let again = load_or_create(&path, "ffffffffffffffffffffffffffffffff", true).unwrap();
        assert_eq!(again[0].token, "0123456789abcdef0123456789abcdef", "an existing file is kept");
    }
}
