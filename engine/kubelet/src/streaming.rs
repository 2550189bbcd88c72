//! Exec, attach and port-forward streams: the options of the kubelet's `/exec`, `/attach` and
//! `/portForward` requests, and the HTTP/1.1 upgrade proxy that both hops (API server to node,
//! node to runtime) use (kube-apiserver's `UpgradeAwareHandler`).
//!
//! Each hop passes the client's upgrade request through unchanged (its `Upgrade`,
//! `Sec-WebSocket-*` and `X-Stream-Protocol-Version` headers), so the client (kubectl) and the
//! runtime's streaming server (containerd's CRI streaming server, reached at the URL CRI
//! `Exec` / `Attach` / `PortForward` returns) negotiate SPDY/3.1 or a WebSocket channel
//! protocol between themselves; after the `101 Switching Protocols` the two connections are
//! spliced byte for byte until both sides are done or nothing moves for [`IDLE_TIMEOUT`].
//! Nothing here reads the streams' contents.

use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty, Limited};
use hyper::{HeaderMap, Method, Request, Response, StatusCode, header, upgrade::OnUpgrade};
use hyper_util::rt::TokioIo;
use std::{
    pin::Pin,
    sync::{Arc, Mutex, PoisonError},
    task::{Context, Poll},
    time::Duration,
};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    time::Instant,
};

/// A stream on which nothing moved for this long is closed (the kubelet's
/// `--streaming-connection-idle-timeout`, shorter than its 4 h default).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// How long the next hop may take to answer the upgrade request.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(30);
/// Bounds of an exec command: arguments, and their bytes together.
const MAX_COMMAND_ARGS: usize = 256;
const MAX_COMMAND_BYTES: usize = 32 << 10;
/// The request headers that make up an upgrade; the only ones passed on.
const UPGRADE_HEADERS: [&str; 6] = [
    "connection",
    "upgrade",
    "sec-websocket-key",
    "sec-websocket-version",
    "sec-websocket-protocol",
    "x-stream-protocol-version",
];

/// Which stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Exec,
    Attach,
    PortForward,
}

impl Kind {
    /// The API server's subresource name.
    pub fn subresource(self) -> &'static str {
        match self {
            Kind::Exec => "exec",
            Kind::Attach => "attach",
            Kind::PortForward => "portforward",
        }
    }

    /// The kubelet's path segment.
    pub fn kubelet_path(self) -> &'static str {
        match self {
            Kind::Exec => "exec",
            Kind::Attach => "attach",
            Kind::PortForward => "portForward",
        }
    }
}

/// `PodExecOptions`, `PodAttachOptions` and `PodPortForwardOptions` from a query string.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamOptions {
    pub container: Option<String>,
    pub command: Vec<String>,
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
    pub ports: Vec<u16>,
}

/// Parses and checks the query of a `kind` request as kube-apiserver decodes and validates
/// its options (a Go `strconv.ParseBool` boolean; unknown parameters are ignored, as there).
pub fn options(kind: Kind, query: &[(String, String)]) -> Result<StreamOptions, String> {
    let last = |key: &str| query.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
    let flag = |key: &str| match last(key) {
        None | Some("") => Ok(false),
        Some("1" | "t" | "T" | "true" | "TRUE" | "True") => Ok(true),
        Some("0" | "f" | "F" | "false" | "FALSE" | "False") => Ok(false),
        Some(other) => Err(format!("{key}: {other:?} is not a boolean")),
    };
    let mut options = StreamOptions {
        container: last("container").filter(|c| !c.is_empty()).map(str::to_owned),
        ..Default::default()
    };
    if let Some(container) = &options.container
        && !valid_name(container)
    {
        return Err(format!("container: {container:?} is not a container name"));
    }
    if kind == Kind::PortForward {
        for (_, value) in query.iter().filter(|(k, _)| k == "ports") {
            for port in value.split(',').map(str::trim) {
                match port.parse::<u16>() {
                    Ok(p) if p > 0 => options.ports.push(p),
                    _ => return Err(format!("ports: {port:?} is not a port number (1-65535)")),
                }
            }
        }
        return Ok(options);
    }
    options.stdin = flag("stdin")?;
    options.stdout = flag("stdout")?;
    options.stderr = flag("stderr")?;
    options.tty = flag("tty")?;
    if !(options.stdin || options.stdout || options.stderr) {
        return Err("you must specify at least one of stdin, stdout, stderr".into());
    }
    if kind == Kind::Exec {
        options.command = query.iter().filter(|(k, _)| k == "command").map(|(_, v)| v.clone()).collect();
        if options.command.is_empty() || options.command[0].is_empty() {
            return Err("you must specify at least 1 command".into());
        }
        let bytes: usize = options.command.iter().map(String::len).sum();
        if options.command.len() > MAX_COMMAND_ARGS || bytes > MAX_COMMAND_BYTES {
            return Err(format!("command: at most {MAX_COMMAND_ARGS} arguments of {MAX_COMMAND_BYTES} bytes together"));
        }
        if options.command.iter().any(|a| a.contains('\0')) {
            return Err("command: an argument holds a NUL byte".into());
        }
    }
    Ok(options)
}

/// A DNS label (`[a-z0-9-]`, at most 63), as container names are.
fn valid_name(name: &str) -> bool {
    name.len() <= 63
        && !name.is_empty()
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// The options as the next hop's query string.
pub fn query(options: &StreamOptions) -> String {
    let mut pairs: Vec<String> = options.command.iter().map(|c| format!("command={}", encode(c))).collect();
    if let Some(container) = &options.container {
        pairs.push(format!("container={}", encode(container)));
    }
    for (key, on) in
        [("stdin", options.stdin), ("stdout", options.stdout), ("stderr", options.stderr), ("tty", options.tty)]
    {
        if on {
            pairs.push(format!("{key}=true"));
        }
    }
    for port in &options.ports {
        pairs.push(format!("ports={port}"));
    }
    pairs.join("&")
}

/// Percent-encodes all but RFC 3986's unreserved characters.
pub fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The protocols a WebSocket upgrade offers (`Sec-WebSocket-Protocol`), or `None` for another
/// kind of upgrade.
pub fn websocket_protocols(headers: &HeaderMap) -> Option<Vec<String>> {
    let upgrade = headers.get(header::UPGRADE)?.to_str().ok()?;
    if !upgrade.eq_ignore_ascii_case("websocket") {
        return None;
    }
    Some(
        headers
            .get_all(header::SEC_WEBSOCKET_PROTOCOL)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(|p| p.trim().to_owned())
            .filter(|p| !p.is_empty())
            .collect(),
    )
}

/// Whether a request asks to upgrade its connection.
pub fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case("upgrade")))
}

/// Sends the upgrade request (`method`, the upgrade headers of `headers`, `target` on `host`,
/// with `authorization`) over `io` and answers as the next hop did. On `101 Switching
/// Protocols` a task splices the client's connection (once `client` upgrades) to the next
/// hop's, keeping `hold` (a concurrency slot) until it ends. A refusal comes back with its
/// status, content type and (at most 64 KiB of) body.
#[allow(clippy::too_many_arguments)]
pub async fn proxy<I, H>(
    io: I,
    client: OnUpgrade,
    method: &Method,
    headers: &HeaderMap,
    target: &str,
    host: &str,
    authorization: Option<&str>,
    hold: H,
) -> Result<Response<Bytes>, String>
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    H: Send + 'static,
{
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(TokioIo::new(io)).await.map_err(|e| e.to_string())?;
    tokio::spawn(async move {
        if let Err(e) = connection.with_upgrades().await {
            tracing::debug!(error = %e, "stream upstream connection ended");
        }
    });
    let mut request = Request::builder().method(method.clone()).uri(target).header(header::HOST, host);
    for name in UPGRADE_HEADERS {
        for value in headers.get_all(name) {
            request = request.header(name, value);
        }
    }
    if let Some(authorization) = authorization {
        request = request.header(header::AUTHORIZATION, authorization);
    }
    let request = request.body(Empty::new()).map_err(|e| e.to_string())?;
    let response = tokio::time::timeout(RESPONSE_TIMEOUT, sender.send_request(request))
        .await
        .map_err(|_| format!("no answer within {} s", RESPONSE_TIMEOUT.as_secs()))?
        .map_err(|e| e.to_string())?;
    if response.status() != StatusCode::SWITCHING_PROTOCOLS {
        let (parts, body) = response.into_parts();
        let body = tokio::time::timeout(RESPONSE_TIMEOUT, Limited::new(body, 64 << 10).collect()).await;
        let body = match body {
            Ok(Ok(collected)) => collected.to_bytes(),
            _ => Bytes::new(),
        };
        let mut refused = Response::new(body);
        *refused.status_mut() = parts.status;
        if let Some(content_type) = parts.headers.get(header::CONTENT_TYPE) {
            refused.headers_mut().insert(header::CONTENT_TYPE, content_type.clone());
        }
        return Ok(refused);
    }
    let mut switched = Response::new(Bytes::new());
    *switched.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    for (name, value) in response.headers() {
        if name != header::CONTENT_LENGTH && name != header::TRANSFER_ENCODING {
            switched.headers_mut().append(name, value.clone());
        }
    }
    let upstream = hyper::upgrade::on(response);
    tokio::spawn(async move {
        let _hold = hold;
        match tokio::join!(client, upstream) {
            (Ok(client), Ok(upstream)) => {
                if let Err(e) = splice(TokioIo::new(client), TokioIo::new(upstream), IDLE_TIMEOUT).await {
                    tracing::debug!(error = %e, "stream ended");
                }
            }
            (Err(e), _) | (_, Err(e)) => tracing::debug!(error = %e, "a stream's upgrade failed"),
        }
    });
    Ok(switched)
}

/// Copies both ways until both directions ended (each end's EOF is passed on as a write
/// shutdown, so half-closed streams keep working), or nothing moved for `idle`.
pub async fn splice<A, B>(a: A, b: B, idle: Duration) -> std::io::Result<()>
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let last = Arc::new(Mutex::new(Instant::now()));
    let mut a = Watched { inner: a, last: last.clone() };
    let mut b = Watched { inner: b, last: last.clone() };
    let copy = tokio::io::copy_bidirectional(&mut a, &mut b);
    tokio::pin!(copy);
    loop {
        let deadline = *last.lock().unwrap_or_else(PoisonError::into_inner) + idle;
        tokio::select! {
            done = &mut copy => return done.map(drop),
            () = tokio::time::sleep_until(deadline) => {
                if last.lock().unwrap_or_else(PoisonError::into_inner).elapsed() >= idle {
                    return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "idle"));
                }
            }
        }
    }
}

/// A stream that notes when bytes last moved.
struct Watched<S> {
    inner: S,
    last: Arc<Mutex<Instant>>,
}

impl<S> Watched<S> {
    fn touch(&self) {
        *self.last.lock().unwrap_or_else(PoisonError::into_inner) = Instant::now();
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.touch();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<std::io::Result<usize>> {
        let polled = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.touch();
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::query_pairs;

    #[test]
    fn options_are_checked_and_passed_on() {
        let q = query_pairs(
            "command=sh&command=-c&command=echo+%22a+b%22&container=main&stdin=true&stdout=1&stderr=false&tty=0&x=y",
        );
        let exec = options(Kind::Exec, &q).unwrap();
        assert_eq!(exec.command, ["sh", "-c", "echo \"a b\""]);
        assert_eq!((exec.stdin, exec.stdout, exec.stderr, exec.tty), (true, true, false, false));
        assert_eq!(exec.container.as_deref(), Some("main"));
        let again = query(&exec);
        assert_eq!(again, "command=sh&command=-c&command=echo%20%22a%20b%22&container=main&stdin=true&stdout=true");
        assert_eq!(options(Kind::Exec, &query_pairs(&again)).unwrap(), exec);
        let attach = options(Kind::Attach, &query_pairs("stdout=true&command=ignored")).unwrap();
        assert!(attach.command.is_empty() && attach.stdout);
        let forward = options(Kind::PortForward, &query_pairs("ports=80,8080&ports=9090")).unwrap();
        assert_eq!(forward.ports, [80, 8080, 9090]);
        assert_eq!(query(&forward), "ports=80&ports=8080&ports=9090");
        assert_eq!(options(Kind::PortForward, &[]).unwrap(), StreamOptions::default());
        let long = format!("stdout=1&command={}", "a".repeat(MAX_COMMAND_BYTES + 1));
        for (kind, bad) in [
            (Kind::Exec, "stdout=true"),
            (Kind::Exec, "command=ls"),
            (Kind::Exec, "command=&stdout=1"),
            (Kind::Exec, "command=ls&stdout=yes"),
            (Kind::Exec, "command=ls&stdout=1&container=../x"),
            (Kind::Exec, "command=a%00b&stdout=1"),
            (Kind::Exec, long.as_str()),
            (Kind::Attach, "tty=1"),
            (Kind::PortForward, "ports=0"),
            (Kind::PortForward, "ports=65536"),
            (Kind::PortForward, "ports=http"),
        ] {
            assert!(options(kind, &query_pairs(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn upgrades_are_recognised() {
        let mut headers = HeaderMap::new();
        assert!(!is_upgrade(&headers));
        headers.insert(header::CONNECTION, "keep-alive, Upgrade".parse().unwrap());
        headers.insert(header::UPGRADE, "websocket".parse().unwrap());
        headers.insert(header::SEC_WEBSOCKET_PROTOCOL, "v5.channel.k8s.io, v4.channel.k8s.io".parse().unwrap());
        assert!(is_upgrade(&headers));
        assert_eq!(websocket_protocols(&headers).unwrap(), ["v5.channel.k8s.io", "v4.channel.k8s.io"]);
        headers.insert(header::UPGRADE, "SPDY/3.1".parse().unwrap());
        assert_eq!(websocket_protocols(&headers), None);
    }

    #[tokio::test]
    async fn splice_passes_half_closes_and_ends_when_idle() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let (mut client, a) = tokio::io::duplex(64);
        let (b, mut server) = tokio::io::duplex(64);
        let spliced = tokio::spawn(splice(a, b, Duration::from_secs(30)));
        client.write_all(b"ping").await.unwrap();
        client.shutdown().await.unwrap();
        let mut got = Vec::new();
        server.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"ping");
        server.write_all(b"pong").await.unwrap();
        drop(server);
        let mut back = Vec::new();
        client.read_to_end(&mut back).await.unwrap();
        assert_eq!(back, b"pong");
        spliced.await.unwrap().unwrap();

        let (_client, a) = tokio::io::duplex(64);
        let (b, _server) = tokio::io::duplex(64);
        let error = splice(a, b, Duration::from_millis(200)).await.unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::TimedOut);
    }
}
