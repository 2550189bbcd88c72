//! `gitplane server` replicas on loopback, as the failover tests and the store benchmarks run
//! them: one command line, so both exercise the flags a deployment uses.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::Path;

/// Replica `id` of the cluster whose replicas listen on `addrs`: its data in `dir/replica-<id>`,
/// the repositories in `dir/repos`, and the secrets every replica shares, as an operator copies
/// them, in `dir` (`peer-token`, `join-token`, `tokens.csv`, `encryption-keys`). The arguments
/// of `gitplane`, for a command run here or inside a host.
pub fn replica_args(dir: &Path, id: u64, addrs: &BTreeMap<u64, SocketAddr>) -> Vec<OsString> {
    let peers: Vec<String> = addrs.iter().map(|(id, a)| format!("{id}={a}")).collect();
    let mut args: Vec<OsString> =
        ["server", "--id", &id.to_string(), "--peers", &peers.join(",")].into_iter().map(OsString::from).collect();
    let files = [
        ("--data-dir", format!("replica-{id}")),
        ("--repos-dir", "repos".to_owned()),
        ("--peer-token-file", "peer-token".to_owned()),
        ("--join-token-file", "join-token".to_owned()),
        ("--tokens-file", "tokens.csv".to_owned()),
        ("--encryption-key-file", "encryption-keys".to_owned()),
    ];
    for (flag, file) in files {
        args.push(flag.into());
        args.push(dir.join(file).into());
    }
    args
}
