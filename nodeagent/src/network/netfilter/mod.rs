//! The one owner of the node's packet-filter programs: `nft` and `iptables-restore` run with
//! rule text on standard input ([`run`], [`nft`]), and set elements sent straight to the kernel
//! ([`netlink`]). The Service proxy, NetworkPolicy and the masquerade each keep a table (or
//! chains) of their own and program it through here; none runs those commands itself.

pub(crate) mod netlink;

pub use netlink::NetlinkError;
use std::io::Write;
use std::process::{Command, Stdio};

/// Why a command did not take its rules.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error("running {program} (is it installed?): {source}")]
    Spawn { program: String, source: std::io::Error },
    #[error("{program} failed ({status}): {stderr}")]
    Command { program: String, status: String, stderr: String },
}

/// Longest stderr quoted in an error: nft echoes the failing line, which can be long.
const STDERR_LIMIT: usize = 4096;

/// Runs `program args`, feeding `stdin`, and returns its standard output.
pub fn run(program: &str, args: &[&str], stdin: Option<&str>) -> Result<String, CommandError> {
    let spawn_err = |source| CommandError::Spawn { program: program.to_owned(), source };
    let mut child = Command::new(program)
        .args(args)
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(spawn_err)?;
    // Written from another thread while the output is read: a child that reports errors as it
    // reads (nft echoes each failing line) would otherwise fill its stderr pipe and wait on us
    // while we wait on its stdin. A child that fails early closes its stdin: its status and
    // stderr say why, not EPIPE.
    let pipe = child.stdin.take();
    let out = std::thread::scope(|scope| {
        if let (Some(text), Some(mut pipe)) = (stdin, pipe) {
            scope.spawn(move || {
                let _ = pipe.write_all(text.as_bytes());
            });
        }
        child.wait_with_output()
    })
    .map_err(spawn_err)?;
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    let mut stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if stderr.len() > STDERR_LIMIT {
        let mut cut = STDERR_LIMIT;
        while !stderr.is_char_boundary(cut) {
            cut -= 1;
        }
        stderr.truncate(cut);
        stderr.push_str("...");
    }
    Err(CommandError::Command {
        program: format!("{program} {}", args.join(" ")),
        status: out.status.to_string(),
        stderr: stderr.trim_end().to_owned(),
    })
}

/// Runs `nft -f -` with `text`: one transaction, all or nothing.
pub fn nft(text: &str) -> Result<(), CommandError> {
    run("nft", &["-f", "-"], Some(text)).map(drop)
}

/// The text that removes table `ip <table>`, and does nothing when it is not there.
pub fn table_removal(table: &str) -> String {
    format!("add table ip {table}\ndelete table ip {table}\n")
}
