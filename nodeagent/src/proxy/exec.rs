//! Runs `nft` / `iptables-restore` with the rule text on standard input.

use super::ProxyError;
use std::io::Write;
use std::process::{Command, Stdio};

/// Longest stderr quoted in an error: nft echoes the failing line, which can be long.
const STDERR_LIMIT: usize = 4096;

/// Runs `program args`, feeding `stdin`, and returns its standard output.
pub(super) fn run(program: &str, args: &[&str], stdin: Option<&str>) -> Result<String, ProxyError> {
    let spawn_err = |source| ProxyError::Spawn { program: program.to_owned(), source };
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
    Err(ProxyError::Command {
        program: format!("{program} {}", args.join(" ")),
        status: out.status.to_string(),
        stderr: stderr.trim_end().to_owned(),
    })
}
