//! The pre-receive hook of hosted repositories: git's own hook, calling back into the replica
//! that serves the push for its verdict ([`crate::source::verdict`]).
//!
//! Each replica writes a private directory, `<data-dir>/hooks` (mode 0700), holding
//! `pre-receive`, a symbolic link to this very binary (which runs the hook when started under
//! that name: no shell between git and the hook, [`invoked_as_hook`]), and a unix socket the
//! replica listens on. A replica killed without a chance to clean up leaves them for
//! its next start to reuse, not a directory in `/tmp` per start; a start that finds the socket
//! answering leaves it alone (another replica runs on this data directory) and judges no push.
//! `git http-backend` gets `core.hooksPath` pointing there (as
//! configuration in its environment, only for pushes), so the bare repositories themselves
//! are not touched, and the socket's path and a per-process secret in its environment, which
//! receive-pack passes to the hook. The hook reads the ref updates (`<old> <new> <ref>` lines)
//! and `GIT_QUARANTINE_PATH` (the push's objects, not yet in the repository), sends them with
//! the repository's path, prints the answer on stderr (git relays it as `remote:` lines) and
//! exits non-zero to refuse: git then leaves every ref as it was and drops the quarantine.
//!
//! The replica trusts the request only after the secret matched, and only for a bare
//! repository directly in its repositories directory, with a quarantine inside that
//! repository's `objects`. A hook that cannot reach the replica accepts the push with a warning:
//! the sync judges every commit again.

use crate::source::verdict::{RefUpdate, Verdicts};
use anyhow::Context as _;
use serde::{Deserialize, Serialize};
use std::{
    io::{BufRead as _, Read as _, Write as _},
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};
use subtle::ConstantTimeEq as _;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _};

/// The hook's file name, which git runs: a link to the gitplane binary.
pub const HOOK_NAME: &str = "pre-receive";
const SOCKET_ENV: &str = "GITPLANE_VERDICT_SOCKET";
const SECRET_ENV: &str = "GITPLANE_VERDICT_SECRET";
/// The largest request a hook may send (ref updates of one push).
const MAX_REQUEST: u64 = 4 << 20;
/// The longest a verdict may take before the hook gives up and accepts with a warning.
const VERDICT_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Serialize, Deserialize)]
struct Request {
    secret: String,
    git_dir: PathBuf,
    quarantine: Option<PathBuf>,
    /// `<old> <new> <ref>` lines as git gave them.
    refs: Vec<String>,
}

#[derive(Serialize, Deserialize)]
struct Response {
    accept: bool,
    output: String,
}

/// The hook directory and the socket of one replica.
pub struct Hook {
    dir: PathBuf,
    socket: PathBuf,
    secret: String,
}

impl Hook {
    /// Writes the hook into `dir`, listens on its socket and judges pushes to repositories in
    /// `repos_dir`.
    pub fn start(dir: &Path, repos_dir: &Path, verdicts: Arc<Verdicts>) -> anyhow::Result<Hook> {
        std::fs::create_dir_all(dir).with_context(|| format!("making the hook directory {}", dir.display()))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        let exe = std::env::current_exe().context("finding the gitplane binary for the pre-receive hook")?;
        let hook = dir.join(HOOK_NAME);
        // A previous start's (or an older version's script).
        let _ = std::fs::remove_file(&hook);
        std::os::unix::fs::symlink(&exe, &hook)
            .with_context(|| format!("linking the pre-receive hook {} to {}", hook.display(), exe.display()))?;
        let socket = dir.join("verdict.sock");
        if std::os::unix::net::UnixStream::connect(&socket).is_ok() {
            anyhow::bail!("{} answers: another gitplane runs on this data directory", socket.display());
        }
        // A previous run's, killed before it could remove it.
        let _ = std::fs::remove_file(&socket);
        let listener = tokio::net::UnixListener::bind(&socket)
            .with_context(|| format!("binding the hook socket {}", socket.display()))?;
        let secret = hex::encode(rand::random::<[u8; 32]>());
        let repos_dir = std::fs::canonicalize(repos_dir).unwrap_or_else(|_| repos_dir.to_path_buf());
        let expected = secret.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                let (verdicts, repos_dir, expected) = (verdicts.clone(), repos_dir.clone(), expected.clone());
                tokio::spawn(async move {
                    if let Err(e) = answer(stream, &verdicts, &repos_dir, &expected).await {
                        tracing::warn!(error = %e, "a pre-receive hook's request failed");
                    }
                });
            }
        });
        Ok(Hook { dir: dir.to_path_buf(), socket, secret })
    }

    /// Configuration for `git http-backend` of a push.
    pub fn git_config(&self) -> (&'static str, String) {
        ("core.hooksPath", self.dir.to_string_lossy().into_owned())
    }

    /// Environment for `git http-backend` of a push, which its hooks inherit.
    pub fn env(&self) -> [(&'static str, String); 2] {
        [(SOCKET_ENV, self.socket.to_string_lossy().into_owned()), (SECRET_ENV, self.secret.clone())]
    }
}

async fn answer(
    stream: tokio::net::UnixStream,
    verdicts: &Verdicts,
    repos_dir: &Path,
    expected: &str,
) -> anyhow::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    tokio::time::timeout(
        Duration::from_secs(10),
        tokio::io::BufReader::new(read.take(MAX_REQUEST)).read_line(&mut line),
    )
    .await
    .context("the hook sent nothing")??;
    let request: Request = serde_json::from_str(&line).context("a malformed request")?;
    anyhow::ensure!(bool::from(request.secret.as_bytes().ct_eq(expected.as_bytes())), "a wrong secret");
    let repo = std::fs::canonicalize(&request.git_dir).context("the repository")?;
    let hosted = repo.parent() == Some(repos_dir)
        && repo.extension().is_some_and(|e| e == "git")
        && repo.join("objects").is_dir();
    anyhow::ensure!(hosted, "{} is not a hosted repository", repo.display());
    let quarantine = match &request.quarantine {
        Some(q) => {
            let q = std::fs::canonicalize(q).context("the quarantine")?;
            anyhow::ensure!(q.starts_with(repo.join("objects")), "the quarantine is outside the repository");
            Some(q)
        }
        None => None,
    };
    let mut refs = Vec::new();
    for line in &request.refs {
        let mut parts = line.split_whitespace();
        let (Some(old), Some(new), Some(name)) = (parts.next(), parts.next(), parts.next()) else {
            anyhow::bail!("a malformed ref update {line:?}");
        };
        refs.push(RefUpdate { old: old.parse()?, new: new.parse()?, name: name.to_owned() });
    }
    let started = std::time::Instant::now();
    let verdict = verdicts.judge(&repo, quarantine.as_deref(), &refs).await;
    crate::metrics::verdict(verdict.accept, started.elapsed());
    let p = &verdict.phases;
    tracing::info!(
        repo = %repo.display(),
        accept = verdict.accept,
        elapsed = ?started.elapsed(),
        informer = ?p.informer,
        open = ?p.open,
        parent = ?p.parent,
        walk = ?p.walk,
        read = ?p.read,
        render = ?p.render,
        validate = ?p.validate,
        inventory = ?p.inventory,
        plan = ?p.plan,
        output = ?p.output,
        files = p.files,
        processed = p.processed,
        "push verdict"
    );
    let mut body = serde_json::to_vec(&Response { accept: verdict.accept, output: verdict.output })?;
    body.push(b'\n');
    write.write_all(&body).await?;
    write.shutdown().await?;
    Ok(())
}

/// Whether this process was started as the hook (`argv[0]` names [`HOOK_NAME`]).
pub fn invoked_as_hook(arg0: &std::ffi::OsStr) -> bool {
    Path::new(arg0).file_name().is_some_and(|name| name == HOOK_NAME)
}

/// The hook (`gitplane hook pre-receive`, or the binary run as [`HOOK_NAME`]), run by git in
/// the repository: asks the replica, prints its answer, exits 1 to refuse.
pub fn run_pre_receive() -> anyhow::Result<()> {
    let mut refs = Vec::new();
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        if !line.trim().is_empty() {
            refs.push(line);
        }
    }
    let warn = |why: String| {
        eprintln!("gitplane: warning: the push was not judged ({why}); the sync will judge it");
        Ok(())
    };
    let (Some(socket), Some(secret)) = (std::env::var_os(SOCKET_ENV), std::env::var(SECRET_ENV).ok()) else {
        return warn("this hook runs only under gitplane's Git service".into());
    };
    let cwd = std::env::current_dir()?;
    let git_dir = std::env::var_os("GIT_DIR").map_or_else(|| cwd.clone(), |d| cwd.join(d));
    let quarantine = std::env::var_os("GIT_QUARANTINE_PATH").map(|q| cwd.join(q));
    let request = serde_json::to_vec(&Request { secret, git_dir, quarantine, refs })?;
    let asked = (|| -> std::io::Result<Response> {
        let mut stream = std::os::unix::net::UnixStream::connect(&socket)?;
        stream.set_read_timeout(Some(VERDICT_TIMEOUT))?;
        stream.write_all(&request)?;
        stream.write_all(b"\n")?;
        let mut answer = Vec::new();
        stream.take(MAX_REQUEST).read_to_end(&mut answer)?;
        serde_json::from_slice(&answer).map_err(std::io::Error::other)
    })();
    match asked {
        Ok(response) => {
            eprint!("{}", response.output);
            if !response.accept {
                std::process::exit(1);
            }
            Ok(())
        }
        Err(e) => warn(format!("the server did not answer: {e}")),
    }
}
