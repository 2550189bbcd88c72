//! A free loopback port and `GET` over HTTP/1.0: enough to read the status API, a replica's
//! `/replica` or a Pod's page without an HTTP client crate in every test and benchmark.

use crate::NetnsHost;
use anyhow::{Context as _, Result, bail};
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// A free loopback address (bound, then released: the window until the user binds it is short).
pub fn free_port() -> Result<SocketAddr> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// `GET path` on `addr`, with a status API bearer `token` if given; the body of a 2xx answer.
/// `timeout` bounds the connection and each read.
pub fn http_get(addr: SocketAddr, path: &str, token: Option<&str>, timeout: Duration) -> Result<String> {
    let response = exchange(addr, path, token, timeout).with_context(|| format!("GET http://{addr}{path}"))?;
    body_of_2xx(addr, path, &response)
}

/// [`http_get`] on the tokio runtime; `timeout` bounds the whole exchange.
pub async fn http_get_async(addr: SocketAddr, path: &str, token: Option<&str>, timeout: Duration) -> Result<String> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        stream.write_all(request(addr, path, token).as_bytes()).await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        anyhow::Ok(response)
    };
    let response = tokio::time::timeout(timeout, exchange).await.context("timed out")??;
    body_of_2xx(addr, path, &response)
}

/// [`http_get`] from inside the network namespace at `netns`, without a token.
pub fn http_get_in(netns: &Path, addr: SocketAddr, path: &str, timeout: Duration) -> Result<String> {
    let response = gitplane_kubelet::netns::in_netns(netns, || exchange(addr, path, None, timeout))
        .with_context(|| format!("GET http://{addr}{path} from {}", netns.display()))?;
    body_of_2xx(addr, path, &response)
}

/// What tests do from inside a host.
pub trait HostExt {
    /// `GET path` over HTTP/1.0 from inside the host; the body of a 2xx answer.
    fn http_get(&self, addr: SocketAddr, path: &str, timeout: Duration) -> Result<String>;
}

impl HostExt for NetnsHost {
    fn http_get(&self, addr: SocketAddr, path: &str, timeout: Duration) -> Result<String> {
        http_get_in(&self.netns_path(), addr, path, timeout)
    }
}

fn exchange(addr: SocketAddr, path: &str, token: Option<&str>, timeout: Duration) -> std::io::Result<Vec<u8>> {
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.write_all(request(addr, path, token).as_bytes())?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    Ok(response)
}

fn request(addr: SocketAddr, path: &str, token: Option<&str>) -> String {
    let authorization = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n{authorization}Connection: close\r\n\r\n")
}

fn body_of_2xx(addr: SocketAddr, path: &str, response: &[u8]) -> Result<String> {
    let response = String::from_utf8_lossy(response);
    // A CGI's own headers (busybox httpd passes them on) may end in a bare "\n\n".
    let (head, body) =
        response.split_once("\r\n\r\n").or_else(|| response.split_once("\n\n")).unwrap_or((&response, ""));
    let status = head.lines().next().unwrap_or("");
    if !status.split(' ').nth(1).is_some_and(|code| code.starts_with('2')) {
        bail!("GET http://{addr}{path}: {head}");
    }
    Ok(body.to_owned())
}
