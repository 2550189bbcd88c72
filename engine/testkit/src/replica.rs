//! `gitplane server` replicas on loopback, as the failover tests and the store benchmarks run
//! them: one command line, so both exercise the flags a deployment uses.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;

/// Replica `id` of the cluster whose replicas listen on `addrs`: its data in `dir/replica-<id>`,
/// the repositories in `dir/repos`, and the secrets every replica shares, as an operator copies
/// them, in `dir` (`peer-token`, `join-token`, `tokens.csv`, `encryption-keys`).
pub fn replica_command(binary: &Path, dir: &Path, id: u64, addrs: &BTreeMap<u64, SocketAddr>) -> Command {
    let peers: Vec<String> = addrs.iter().map(|(id, a)| format!("{id}={a}")).collect();
    let mut command = Command::new(binary);
    command
        .arg("server")
        .args(["--id", &id.to_string(), "--peers", &peers.join(",")])
        .arg("--data-dir")
        .arg(dir.join(format!("replica-{id}")))
        .arg("--repos-dir")
        .arg(dir.join("repos"))
        .arg("--peer-token-file")
        .arg(dir.join("peer-token"))
        .arg("--join-token-file")
        .arg(dir.join("join-token"))
        .arg("--tokens-file")
        .arg(dir.join("tokens.csv"))
        .arg("--encryption-key-file")
        .arg(dir.join("encryption-keys"));
    command
}
