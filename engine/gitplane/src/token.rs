//! `gitplane token create|revoke|list`: the status API's tokens without editing `tokens.csv` by
//! hand. Each command edits the replica's token file (replaced whole, mode 0600), which the
//! replica reads again within a second: no restart, so no Pod is recreated for a new token.

use crate::{credentials, kubeconfig, status::parse_duration};
use anyhow::{Context as _, bail};
use gitplane_apiserver::authn::{self, Role};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use std::{
    path::{Path, PathBuf},
    time::Duration,
};

#[derive(clap::Args)]
pub struct TokenArgs {
    #[command(subcommand)]
    command: TokenCommand,
}

#[derive(clap::Subcommand)]
enum TokenCommand {
    /// Add a token to the replica's token file and print a kubeconfig that uses it (HTTPS, the
    /// cluster CA, the new token) on stdout. It works within a second, without a restart.
    Create(CreateArgs),
    /// Remove every token of USER from the token file; they stop working within a second.
    Revoke(RevokeArgs),
    /// The token file's users, roles and expiry (never the tokens themselves).
    List(FileArgs),
}

#[derive(clap::Args)]
struct FileArgs {
    /// The replica's data directory (holds tokens.csv, ca.crt and kubeconfig).
    #[arg(long, default_value = "/var/lib/gitplane")]
    data_dir: PathBuf,
    /// The token file, if not `<data-dir>/tokens.csv` (the replica's `--tokens-file`).
    #[arg(long)]
    tokens_file: Option<PathBuf>,
}

impl FileArgs {
    fn path(&self) -> PathBuf {
        self.tokens_file.clone().unwrap_or_else(|| self.data_dir.join("tokens.csv"))
    }

    /// The token file's text, checked: a file the replica would refuse is not edited further.
    fn read(&self) -> anyhow::Result<(PathBuf, String)> {
        let path = self.path();
        let text = std::fs::read_to_string(&path).with_context(|| {
            format!("reading the token file {} (gitplane makes it on its first start)", path.display())
        })?;
        authn::parse(&text, &path)?;
        Ok((path, text))
    }
}

#[derive(clap::Args)]
struct CreateArgs {
    #[command(flatten)]
    file: FileArgs,
    /// `read` (get, list, watch, logs) or `debug` (read, and exec, attach, port-forward).
    #[arg(long, value_parser = ["read", "debug"])]
    role: String,
    /// How long the token works (`90s`, `30m`, `12h`, `7d`); without it, until revoked.
    #[arg(long, value_parser = parse_duration)]
    ttl: Option<Duration>,
    /// The user the token stands for (in the audit log and Events); default `token-<random>`.
    #[arg(long)]
    user: Option<String>,
}

#[derive(clap::Args)]
struct RevokeArgs {
    #[command(flatten)]
    file: FileArgs,
    /// The user whose tokens stop working.
    user: String,
}

pub fn run(args: TokenArgs) -> anyhow::Result<()> {
    match args.command {
        TokenCommand::Create(args) => create(args),
        TokenCommand::Revoke(args) => revoke(args),
        TokenCommand::List(args) => list(args),
    }
}

fn create(args: CreateArgs) -> anyhow::Result<()> {
    let (path, text) = args.file.read()?;
    let user = args.user.unwrap_or_else(|| format!("token-{}", hex::encode(rand::random::<[u8; 4]>())));
    if user.is_empty() || !user.bytes().all(|b| b.is_ascii_graphic() && b != b',' && b != b'"') {
        bail!("--user {user:?}: use printable characters without commas or quotes");
    }
    let roles = match Role::parse(&args.role) {
        Some(Role::Debug) => "read,debug",
        _ => "read",
    };
    let expires = args
        .ttl
        .map(|ttl| -> anyhow::Result<Timestamp> {
            let ttl = SignedDuration::try_from(ttl).context("--ttl is too long")?;
            let at = Timestamp::now().checked_add(ttl).context("--ttl is too long")?;
            Ok(Timestamp::from_second(at.as_second())?)
        })
        .transpose()?;
    let token = hex::encode(rand::random::<[u8; 32]>());
    let mut line = format!("{token},{user},{user},\"{roles}\"");
    if let Some(at) = expires {
        line.push_str(&format!(",{at}"));
    }
    let mut updated = text;
    if !updated.is_empty() && !updated.ends_with('\n') {
        updated.push('\n');
    }
    updated.push_str(&line);
    updated.push('\n');
    authn::parse(&updated, &path)?;
    credentials::write_private(&path, &updated)?;
    print!("{}", kubeconfig::render(&server(&args.file.data_dir)?, Some(&ca(&args.file.data_dir)?), &user, &token));
    let until = expires.map_or("until revoked".to_owned(), |at| format!("until {at}"));
    eprintln!("{}: added user {user} ({roles}) {until}; revoke with `gitplane token revoke {user}`", path.display());
    Ok(())
}

fn revoke(args: RevokeArgs) -> anyhow::Result<()> {
    let (path, text) = args.file.read()?;
    let kept: Vec<&str> = text.lines().filter(|line| line_user(line) != Some(args.user.as_str())).collect();
    let removed = text.lines().count() - kept.len();
    if removed == 0 {
        bail!("{} holds no token of user {:?}", path.display(), args.user);
    }
    credentials::write_private(&path, &(kept.join("\n") + "\n"))?;
    println!("{}: removed {removed} token(s) of user {}", path.display(), args.user);
    Ok(())
}

fn list(args: FileArgs) -> anyhow::Result<()> {
    let (path, text) = args.read()?;
    let now = Timestamp::now();
    println!("{:<24} {:<12} EXPIRES", "USER", "ROLES");
    for entry in authn::parse(&text, &path)? {
        let roles: Vec<&str> = entry.user.roles.iter().map(|r| r.as_str()).collect();
        let expires = match entry.expires {
            None => "never".to_owned(),
            Some(at) if at <= now => format!("{at} (expired)"),
            Some(at) => at.to_string(),
        };
        println!("{:<24} {:<12} {expires}", entry.user.name, roles.join(","));
    }
    Ok(())
}

/// The user field of one token file line; `None` for comments and blank lines.
fn line_user(line: &str) -> Option<&str> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    line.split(',').nth(1).map(str::trim)
}

/// The server the replica's own kubeconfig names (it writes one on every start).
fn server(data_dir: &Path) -> anyhow::Result<String> {
    let path = data_dir.join("kubeconfig");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading {} for the server's address (start gitplane once)", path.display()))?;
    let config: serde_yaml::Value =
        serde_yaml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    config["clusters"][0]["cluster"]["server"]
        .as_str()
        .map(str::to_owned)
        .with_context(|| format!("{} names no server", path.display()))
}

fn ca(data_dir: &Path) -> anyhow::Result<String> {
    let path = data_dir.join("ca.crt");
    std::fs::read_to_string(&path).with_context(|| format!("reading the cluster CA {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_user_field_of_a_line() {
        assert_eq!(line_user("0123456789abcdef0123456789abcdef,alice,1,\"read\""), Some("alice"));
        assert_eq!(line_user("# a comment,bob"), None);
        assert_eq!(line_user("  "), None);
    }
}
