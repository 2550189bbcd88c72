//! The ref advertisement of a push (`GET info/refs?service=git-receive-pack`) written here from
//! the repository's refs, as `git receive-pack --http-backend-info-refs` writes it (protocol v0),
//! instead of starting `git http-backend` and `git receive-pack` for it: the first of a push's
//! two requests then starts no process.
//!
//! It is only an advertisement: the push itself still runs `git receive-pack`, which checks
//! every ref's old value under its lock and accepts any capability advertised here (all of them
//! are receive-pack's defaults). A repository whose configuration changes what receive-pack
//! advertises (hidden refs, push options, push certificates, a SHA-256 object format,
//! alternates) or a client asking for protocol v1 gets git's own advertisement ([`None`]).

use std::{fmt::Write as _, path::Path};

/// What `git receive-pack` advertises by default (git 2.47), but its agent.
const CAPABILITIES: &str =
    "report-status report-status-v2 delete-refs side-band-64k quiet atomic ofs-delta object-format=sha1 agent=gitplane";

/// Configuration that makes receive-pack advertise something else (lower case, as git2 reads
/// names case-insensitively only for the section and key).
const CHANGES_ADVERTISEMENT: [&str; 10] = [
    "receive.hiderefs",
    "transfer.hiderefs",
    "receive.advertisepushoptions",
    "receive.advertiseatomic",
    "receive.certnonceseed",
    "repack.usedeltabaseoffset",
    "transfer.advertisesid",
    "extensions.objectformat",
    "core.alternaterefscommand",
    "core.alternaterefsprefixes",
];

/// The body of the advertisement of the bare repository at `dir` (`# service=` line included),
/// or `None` when git must write it.
pub fn receive_pack(dir: &Path, git_protocol: Option<&str>) -> Option<Vec<u8>> {
    if git_protocol.is_some_and(|p| p.split(':').any(|v| v == "version=1")) {
        return None;
    }
    if dir.join("objects/info/alternates").exists() {
        return None;
    }
    let git = git2::Repository::open_bare(dir).ok()?;
    let config = git.config().ok()?;
    let mut entries = config.entries(None).ok()?;
    while let Some(entry) = entries.next() {
        let name = entry.ok()?.name()?.to_ascii_lowercase();
        if CHANGES_ADVERTISEMENT.contains(&name.as_str()) {
            return None;
        }
    }
    let mut refs = Vec::new();
    for reference in git.references().ok()? {
        let reference = reference.ok()?;
        // A name that is not UTF-8: git writes the advertisement.
        let name = reference.name().map(str::to_owned)?;
        // A symbolic ref is advertised at its target's id; a broken one not at all, as git does.
        if let Some(id) = reference.resolve().ok().and_then(|r| r.target()) {
            refs.push((name, id));
        }
    }
    refs.sort();
    Some(pkt_lines(&refs))
}

/// The advertisement of `refs` (sorted by name).
fn pkt_lines(refs: &[(String, git2::Oid)]) -> Vec<u8> {
    let mut out = Vec::new();
    pkt(&mut out, "# service=git-receive-pack\n");
    out.extend_from_slice(b"0000");
    match refs.split_first() {
        None => pkt(&mut out, &format!("{} capabilities^{{}}\0{CAPABILITIES}\n", git2::Oid::zero())),
        Some(((name, id), rest)) => {
            pkt(&mut out, &format!("{id} {name}\0{CAPABILITIES}\n"));
            for (name, id) in rest {
                pkt(&mut out, &format!("{id} {name}\n"));
            }
        }
    }
    out.extend_from_slice(b"0000");
    out
}

fn pkt(out: &mut Vec<u8>, line: &str) {
    let mut length = String::new();
    let _ = write!(length, "{:04x}", line.len() + 4);
    out.extend_from_slice(length.as_bytes());
    out.extend_from_slice(line.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    /// git's own advertisement of `dir` (as `git http-backend` sends it), its agent replaced
    /// by ours.
    fn git_advertisement(dir: &Path) -> Vec<u8> {
        let output = Command::new("git")
            .args(["receive-pack", "--http-backend-info-refs", "--stateless-rpc", "."])
            .current_dir(dir)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env_remove("HOME")
            .output()
            .unwrap();
        assert!(output.status.success());
        // `git http-backend` writes the service line before receive-pack's output.
        let (mut body, mut out) = (&output.stdout[..], b"001f# service=git-receive-pack\n0000".to_vec());
        while !body.is_empty() {
            let n = usize::from_str_radix(std::str::from_utf8(&body[..4]).unwrap(), 16).unwrap();
            if n == 0 {
                out.extend_from_slice(b"0000");
                body = &body[4..];
                continue;
            }
            let line = std::str::from_utf8(&body[4..n]).unwrap();
            match line.split_once(" agent=") {
                Some((before, after)) => {
                    pkt(&mut out, &format!("{before} agent=gitplane{}", &after[after.find('\n').unwrap()..]))
                }
                None => pkt(&mut out, line),
            }
            body = &body[n..];
        }
        out
    }

    fn git(dir: &Path, args: &[&str]) {
        let status = Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@localhost"])
            .args(args)
            .current_dir(dir)
            .status()
            .unwrap();
        assert!(status.success(), "git {args:?}");
    }

    #[test]
    fn the_advertisement_is_gits_own() {
        let root = tempfile::tempdir().unwrap();
        let bare = root.path().join("r.git");
        let work = root.path().join("work");
        std::fs::create_dir_all(&work).unwrap();
        git(root.path(), &["init", "-q", "--bare", "r.git"]);
        // (what the repository holds, whether git writes the advertisement)
        assert_eq!(receive_pack(&bare, None), Some(git_advertisement(&bare)), "an empty repository");
        git(&work, &["init", "-q", "-b", "main"]);
        git(&work, &["commit", "-q", "--allow-empty", "-m", "one"]);
        git(&work, &["tag", "-a", "-m", "t", "v1"]);
        git(&work, &["push", "-q", bare.to_str().unwrap(), "main", "main:refs/heads/a-branch", "v1"]);
        git(&bare, &["pack-refs", "--all"]);
        git(&work, &["commit", "-q", "--allow-empty", "-m", "two"]);
        git(&work, &["push", "-q", bare.to_str().unwrap(), "main:refs/heads/z"]);
        git(&bare, &["symbolic-ref", "refs/heads/link", "refs/heads/main"]);
        assert_eq!(receive_pack(&bare, None), Some(git_advertisement(&bare)), "packed, loose and symbolic refs");
        assert_eq!(receive_pack(&bare, Some("version=2")), Some(git_advertisement(&bare)), "v2 is v0 for a push");
        assert_eq!(receive_pack(&bare, Some("version=1")), None, "v1 is git's");
        git(&bare, &["config", "receive.advertisePushOptions", "true"]);
        assert_eq!(receive_pack(&bare, None), None, "a setting that changes the advertisement is git's");
    }
}
