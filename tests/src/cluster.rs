//! Control-plane replicas as separate `gitplane server` processes on loopback, for failover
//! tests: start, find the leader, kill -9, restart.

use crate::{binary, wait_for};
use anyhow::{Context, Result};
use gitplane_storage::remote::{PeerToken, RemoteStore};
use gitplane_testkit::replica::replica_args;
use serde_json::Value;
use std::{
    collections::BTreeMap,
    fs::File,
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    path::PathBuf,
    process::{Child, Command},
    time::Duration,
};

/// A cluster of `gitplane server` processes, sharing a peer token and a join token as a
/// deployment would.
pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub addrs: BTreeMap<u64, SocketAddr>,
    children: BTreeMap<u64, Child>,
    extra_args: Vec<String>,
    token: String,
}

/// The status API token (role `read`) of every [`Cluster`], from the token file it is given.
pub const READ_TOKEN: &str = "e2e-read-token-0123456789abcdef";
/// `Authorization` with [`READ_TOKEN`].
pub const READ_BEARER: (&str, &str) = ("Authorization", "Bearer e2e-read-token-0123456789abcdef");

/// `GET path` on loopback with [`READ_TOKEN`]; the body of a 2xx answer.
pub fn loopback_get(addr: SocketAddr, path: &str) -> Result<String> {
    gitplane_testkit::http_get(addr, path, Some(READ_TOKEN), Duration::from_secs(5))
}

/// An HTTP request on loopback; the status code and the body.
pub fn loopback_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut head = format!("{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Length: {}\r\n", body.len());
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let code = head.lines().next().and_then(|l| l.split(' ').nth(1)).and_then(|c| c.parse().ok()).unwrap_or(0);
    Ok((code, body.to_owned()))
}

/// One encryption key file for every replica of a cluster (`--encryption-key-file`), as the
/// operator copies it (mode 0600 like theirs): replicas but the lowest-id one refuse to start
/// without it.
pub fn write_encryption_keys(path: &std::path::Path) -> Result<()> {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos();
    std::fs::write(path, format!("e2e-1 {nanos:064x}\n"))?;
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    Ok(())
}

impl Cluster {
    /// Starts `n` replicas; `extra_args` go to every `gitplane server`.
    pub fn start(n: u64, extra_args: &[&str]) -> Result<Cluster> {
        let addrs = (1..=n).map(|id| Ok((id, gitplane_testkit::free_port()?))).collect::<Result<_>>()?;
        let dir = tempfile::tempdir()?;
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos();
        let token = format!("e2e-{}-{nanos:x}", std::process::id());
        std::fs::write(dir.path().join("peer-token"), &token)?;
        std::fs::write(dir.path().join("join-token"), format!("join-{token}"))?;
        std::fs::write(dir.path().join("tokens.csv"), format!("{READ_TOKEN},e2e,e2e,\"read\"\n"))?;
        write_encryption_keys(&dir.path().join("encryption-keys"))?;
        let mut cluster = Cluster {
            dir,
            addrs,
            children: BTreeMap::new(),
            extra_args: extra_args.iter().map(|s| s.to_string()).collect(),
            token,
        };
        for id in 1..=n {
            cluster.launch(id)?;
        }
        Ok(cluster)
    }

    fn launch(&mut self, id: u64) -> Result<()> {
        let log = File::options().create(true).append(true).open(self.log_path(id))?;
        let child = Command::new(binary("gitplane")?)
            .args(replica_args(self.dir.path(), id, &self.addrs))
            .args(&self.extra_args)
            .env("RUST_LOG", "info,openraft=warn,sqlx=warn,h2=warn")
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting gitplane server")?;
        self.children.insert(id, child);
        Ok(())
    }

    pub fn log_path(&self, id: u64) -> PathBuf {
        self.dir.path().join(format!("replica-{id}.log"))
    }

    pub fn logs(&self) -> String {
        self.addrs
            .keys()
            .map(|id| format!("--- replica {id}\n{}", std::fs::read_to_string(self.log_path(*id)).unwrap_or_default()))
            .collect()
    }

    /// A replica's `/replica` status, if it answers.
    pub fn status(&self, id: u64) -> Option<Value> {
        serde_json::from_str(&loopback_get(self.addrs[&id], "/replica").ok()?).ok()
    }

    /// The acting leader among the running replicas, once there is one.
    pub fn leader(&self, timeout: Duration) -> Result<u64> {
        wait_for(timeout, || {
            self.children.keys().copied().find(|id| self.status(*id).is_some_and(|s| s["leading"] == true))
        })
        .with_context(|| format!("no leader within {timeout:?}\n{}", self.logs()))
    }

    /// SIGKILL: no shutdown, no flush.
    pub fn kill(&mut self, id: u64) -> Result<()> {
        if let Some(mut child) = self.children.remove(&id) {
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }

    pub fn restart(&mut self, id: u64) -> Result<()> {
        self.kill(id)?;
        self.launch(id)
    }

    pub fn running(&self) -> Vec<u64> {
        self.children.keys().copied().collect()
    }

    /// A client of every replica.
    pub fn client(&self) -> Result<RemoteStore> {
        let endpoints: Vec<String> = self.addrs.values().map(|a| format!("http://{a}")).collect();
        Ok(RemoteStore::with_token(&endpoints, PeerToken::new(&self.token)?)?)
    }

    /// A client of one replica only (to read what that replica holds).
    pub fn replica_client(&self, id: u64) -> Result<RemoteStore> {
        Ok(RemoteStore::with_token(&[format!("http://{}", self.addrs[&id])], PeerToken::new(&self.token)?)?)
    }

    /// A client with a token that is not the cluster's (which every replica must refuse).
    pub fn client_with_wrong_token(&self) -> Result<RemoteStore> {
        let endpoints: Vec<String> = self.addrs.values().map(|a| format!("http://{a}")).collect();
        Ok(RemoteStore::with_token(&endpoints, PeerToken::new("not-the-cluster-s-peer-token")?)?)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for child in self.children.values_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
