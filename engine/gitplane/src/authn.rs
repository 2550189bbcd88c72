//! Authentication of the status API's callers: a bearer token to a user and roles, from a
//! static token file in Kubernetes' CSV format (`--token-auth-file`):
//!
//! ```text
//! token,user,uid,"role1,role2"
//! ```
//!
//! Roles: `read` (the status API: discovery, get, list, watch, logs) and `debug` (exec, attach
//! and port-forward, when they come; carried now). A role grants only itself: a `debug`-only
//! token reads nothing. Lines that are empty or start with `#` are skipped.
//!
//! Tokens are kept only as SHA-256 digests and compared in constant time with every entry (no
//! early exit), so neither a token's length nor its position leaks; no error, log line or
//! answer ever quotes one.

use anyhow::{Context as _, bail};
use sha2::{Digest as _, Sha256};
use std::{io::Write as _, os::unix::fs::OpenOptionsExt as _, path::Path, sync::Arc};
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

    fn parse(text: &str) -> Option<Role> {
        match text {
            "read" => Some(Role::Read),
            "debug" => Some(Role::Debug),
            _ => None,
        }
    }
}

/// Who made a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub uid: String,
    pub roles: Vec<Role>,
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
}

// Never print a token.
impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entry").field("token", &"***").field("user", &self.user).finish()
    }
}

/// The tokens a replica accepts.
#[derive(Default)]
pub struct Tokens {
    entries: Vec<([u8; 32], Arc<User>)>,
}

impl Tokens {
    pub fn new(entries: &[Entry]) -> Tokens {
        Tokens { entries: entries.iter().map(|e| (digest(&e.token), Arc::new(e.user.clone()))).collect() }
    }

    /// The user `token` stands for, if any.
    pub fn authenticate(&self, token: &str) -> Option<Arc<User>> {
        let given = digest(token);
        let mut found = None;
        for (expected, user) in &self.entries {
            if bool::from(given.ct_eq(expected)) {
                found = Some(user.clone());
            }
        }
        found
    }
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
        if !(3..=4).contains(&fields.len()) {
            bail!("{}: expected token,user,uid[,\"role,...\"], found {} fields", at(), fields.len());
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
        let user = User { name: name.to_owned(), uid: uid.to_owned(), roles };
        entries.push(Entry { token: token.to_owned(), user });
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
                "# gitplane's status API tokens: token,user,uid,\"roles\" (roles: read, debug). Restart to reload.\n\
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
