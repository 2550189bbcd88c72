//! The kubelet's HTTP probe (`pkg/probe/http`): one GET over HTTP/1.1 on a fresh connection
//! (the kubelet disables keep-alives), over TLS for `scheme: HTTPS` without verifying the
//! certificate ([`super::tls`]), success for a status from 200 to 399. Redirects to the same host
//! are followed (at most 10, HTTP or HTTPS); a redirect elsewhere ends the probe as a success, as
//! the kubelet's `Probe terminated redirects` warning does. Only the response's head is read.
//!
//! Hand-written rather than a client crate: a probe needs one request shape and the status line,
//! and the agent links no HTTP client (hyper is there only as tonic's transport).

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use super::results::ProbeResult;

/// What a probe's `httpGet` asks for, resolved against its container (the port is a number).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpGet {
    /// `host`, else the Pod's IP.
    pub host: Option<String>,
    pub port: u16,
    /// Path and query, `/` when unset.
    pub path: String,
    /// `httpHeaders`, in order.
    pub headers: Vec<(String, String)>,
    /// `scheme: HTTPS`.
    pub https: bool,
}

/// Where one request goes.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Target {
    host: String,
    port: u16,
    path: String,
    https: bool,
}

impl Target {
    fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    fn url(&self) -> String {
        let scheme = if self.https { "https" } else { "http" };
        format!("{scheme}://{}{}", self.authority(), self.path)
    }
}

const MAX_REDIRECTS: usize = 10;
/// The most of a response's head read before giving up (Go's client allows 1 MB; a probe
/// target that sends more is broken).
const MAX_HEAD: usize = 64 * 1024;
/// The kubelet's User-Agent, for the Kubernetes version gitplane follows.
pub const USER_AGENT: &str = "kube-probe/1.33";

/// Runs the probe within `timeout`: its result and the message the kubelet would give.
/// `buf` is reused between runs.
pub async fn probe(get: &HttpGet, pod_ip: &str, timeout: Duration, buf: &mut Vec<u8>) -> (ProbeResult, String) {
    let first = Target {
        host: get.host.clone().unwrap_or_else(|| pod_ip.to_owned()),
        port: get.port,
        path: if get.path.is_empty() { "/".into() } else { get.path.clone() },
        https: get.https,
    };
    if let Some((name, _)) = get.headers.iter().find(|(n, v)| invalid(n) || invalid(v)) {
        return (ProbeResult::Unknown, format!("header {name:?} holds a line break"));
    }
    let host_override = header(&get.headers, "host").map(str::to_owned);
    let url = first.url();
    let follow = async {
        let mut target = first.clone();
        let mut host_header = host_override.clone();
        for _ in 0..=MAX_REDIRECTS {
            let (code, location) = request(&target, host_header.as_deref(), &get.headers, buf).await?;
            let Some(location) = location.filter(|_| matches!(code, 301 | 302 | 303 | 307 | 308)) else {
                return Ok(code);
            };
            let Some(next) = redirect(&target, &location) else { return Ok(code) };
            // Go's client keeps a Host override only through a relative redirect.
            if location.starts_with("http://") || location.starts_with("https://") || location.starts_with("//") {
                host_header = None;
            }
            target = next;
        }
        Err(format!("Get {:?}: stopped after {MAX_REDIRECTS} redirects", target.url()))
    };
    match tokio::time::timeout(timeout, follow).await {
        Ok(Ok(code)) if (200..300).contains(&code) => (ProbeResult::Success, String::new()),
        Ok(Ok(code)) if (300..400).contains(&code) => (ProbeResult::Success, "Probe terminated redirects".into()),
        Ok(Ok(code)) => (ProbeResult::Failure, format!("HTTP probe failed with statuscode: {code}")),
        Ok(Err(message)) => (ProbeResult::Failure, message),
        Err(_) => (
            ProbeResult::Failure,
            format!("Get {url:?}: context deadline exceeded (Client.Timeout exceeded while awaiting headers)"),
        ),
    }
}

fn invalid(text: &str) -> bool {
    text.contains(['\r', '\n'])
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
}

/// One GET: the status code and the `Location` header.
async fn request(
    target: &Target,
    host_header: Option<&str>,
    headers: &[(String, String)],
    buf: &mut Vec<u8>,
) -> Result<(u16, Option<String>), String> {
    let url = target.url();
    let address = target.authority();
    let stream = TcpStream::connect((target.host.as_str(), target.port))
        .await
        .map_err(|e| format!("Get {url:?}: dial tcp {address}: connect: {}", os_message(&e)))?;
    let _ = stream.set_nodelay(true);
    buf.clear();
    write_request(buf, target, host_header, headers);
    if target.https {
        let stream = super::tls::connect(&target.host, stream).await.map_err(|e| format!("Get {url:?}: {e}"))?;
        exchange(stream, &url, buf).await
    } else {
        exchange(stream, &url, buf).await
    }
}

/// Sends the request in `buf` and reads the response's head back into it.
async fn exchange(
    mut stream: impl AsyncRead + AsyncWrite + Unpin,
    url: &str,
    buf: &mut Vec<u8>,
) -> Result<(u16, Option<String>), String> {
    stream.write_all(buf).await.map_err(|e| format!("Get {url:?}: {}", os_message(&e)))?;
    buf.clear();
    let end = loop {
        if buf.len() >= MAX_HEAD {
            return Err(format!("Get {url:?}: the response's header is larger than {MAX_HEAD} bytes"));
        }
        let start = buf.len().saturating_sub(3);
        buf.reserve(4096);
        let n = stream.read_buf(buf).await.map_err(|e| format!("Get {url:?}: {}", os_message(&e)))?;
        if let Some(at) = buf[start..].windows(4).position(|w| w == b"\r\n\r\n") {
            break start + at;
        }
        if n == 0 {
            return Err(format!("Get {url:?}: EOF"));
        }
    };
    buf.truncate(end);
    let head = String::from_utf8_lossy(buf);
    let code = status_code(&head).ok_or_else(|| format!("Get {url:?}: malformed HTTP response"))?;
    Ok((code, location(&head).map(str::to_owned)))
}

fn write_request(buf: &mut Vec<u8>, target: &Target, host_header: Option<&str>, headers: &[(String, String)]) {
    let authority = target.authority();
    let host = host_header.unwrap_or(&authority);
    buf.extend_from_slice(format!("GET {} HTTP/1.1\r\nHost: {host}\r\n", target.path).as_bytes());
    if header(headers, "user-agent").is_none() {
        buf.extend_from_slice(format!("User-Agent: {USER_AGENT}\r\n").as_bytes());
    }
    if header(headers, "accept").is_none() {
        buf.extend_from_slice(b"Accept: */*\r\n");
    }
    for (name, value) in headers {
        // Host went first; an empty Accept means none (the kubelet removes it).
        if name.eq_ignore_ascii_case("host") || (name.eq_ignore_ascii_case("accept") && value.is_empty()) {
            continue;
        }
        buf.extend_from_slice(format!("{name}: {value}\r\n").as_bytes());
    }
    buf.extend_from_slice(b"Connection: close\r\n\r\n");
}

/// The code of a status line `HTTP/1.1 200 OK`.
fn status_code(head: &str) -> Option<u16> {
    let line = head.lines().next()?;
    let mut parts = line.split(' ');
    parts.next().filter(|v| v.starts_with("HTTP/"))?;
    parts.next()?.parse().ok().filter(|c| (100..1000).contains(c))
}

fn location(head: &str) -> Option<&str> {
    head.lines().skip(1).find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.trim().eq_ignore_ascii_case("location").then(|| value.trim())
    })
}

/// Where a redirect from `current` to `location` goes, if the kubelet follows it: over HTTP or
/// HTTPS, to the same host name (any port).
fn redirect(current: &Target, location: &str) -> Option<Target> {
    let location = location.split('#').next().unwrap_or_default();
    let absolute = match location.split_once("://") {
        Some(("http", rest)) => Some((rest, false)),
        Some(("https", rest)) => Some((rest, true)),
        _ => location.strip_prefix("//").map(|rest| (rest, current.https)),
    };
    if let Some((rest, https)) = absolute {
        let split = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, path) = rest.split_at(split);
        let authority = authority.rsplit('@').next().unwrap_or_default();
        let (host, port) = split_authority(authority, if https { 443 } else { 80 })?;
        let path = if path.is_empty() {
            "/".to_owned()
        } else if path.starts_with('?') {
            format!("/{path}")
        } else {
            path.to_owned()
        };
        return (host.eq_ignore_ascii_case(&current.host)).then(|| Target { host: host.to_owned(), port, path, https });
    }
    if location.contains("://") {
        // Another scheme: not followed, so the 3xx ends the probe.
        return None;
    }
    let path = if location.starts_with('/') {
        location.to_owned()
    } else {
        let current_path = current.path.split('?').next().unwrap_or("/");
        if location.starts_with('?') || location.is_empty() {
            format!("{current_path}{location}")
        } else {
            let dir = &current_path[..current_path.rfind('/').map_or(0, |i| i + 1)];
            format!("{}{location}", if dir.is_empty() { "/" } else { dir })
        }
    };
    Some(Target { host: current.host.clone(), port: current.port, path, https: current.https })
}

/// `host`, `host:port`, `[v6]`, `[v6]:port`; the port defaults to the scheme's.
fn split_authority(authority: &str, default_port: u16) -> Option<(&str, u16)> {
    let (host, port) = if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        (host, after.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    let port = match port {
        Some(port) => port.parse().ok()?,
        None => default_port,
    };
    (!host.is_empty()).then_some((host, port))
}

/// An I/O error as Go words the common ones (`connection refused`), else as Rust does.
pub fn os_message(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::ConnectionRefused => "connection refused".into(),
        std::io::ErrorKind::ConnectionReset => "connection reset by peer".into(),
        std::io::ErrorKind::HostUnreachable => "no route to host".into(),
        std::io::ErrorKind::NetworkUnreachable => "network is unreachable".into(),
        _ => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    fn target(path: &str) -> Target {
        Target { host: "10.244.1.5".into(), port: 8080, path: path.into(), https: false }
    }

    #[test]
    fn which_redirects_are_followed() {
        let t = |host: &str, port: u16, path: &str| {
            Some(Target { host: host.into(), port, path: path.into(), https: false })
        };
        let tls =
            |port: u16, path: &str| Some(Target { host: "10.244.1.5".into(), port, path: path.into(), https: true });
        let from = target("/a/b?x=1");
        let cases = [
            ("/healthz", t("10.244.1.5", 8080, "/healthz")),
            ("c", t("10.244.1.5", 8080, "/a/c")),
            ("?y=2", t("10.244.1.5", 8080, "/a/b?y=2")),
            ("http://10.244.1.5/ok#frag", t("10.244.1.5", 80, "/ok")),
            ("http://10.244.1.5:9090", t("10.244.1.5", 9090, "/")),
            ("//10.244.1.5:81/x", t("10.244.1.5", 81, "/x")),
            ("http://user@10.244.1.5:82?q", t("10.244.1.5", 82, "/?q")),
            ("http://10.244.1.6/", None),
            ("http://example.com/", None),
            ("https://10.244.1.5/", tls(443, "/")),
            ("https://10.244.1.5:8443/x", tls(8443, "/x")),
            ("https://example.com/", None),
            ("ftp://10.244.1.5/", None),
            ("http://10.244.1.5:http/", None),
        ];
        for (location, want) in cases {
            assert_eq!(redirect(&from, location), want, "{location}");
        }
        assert_eq!(split_authority("[fd00::1]:8080", 80), Some(("fd00::1", 8080)));
    }

    #[test]
    fn the_request_is_the_kubelets() {
        let mut buf = Vec::new();
        let headers = vec![("X-Custom".to_owned(), "a b".to_owned()), ("Accept".to_owned(), String::new())];
        write_request(&mut buf, &target("/ready?full=1"), None, &headers);
        assert_eq!(
            String::from_utf8(buf).expect("text"),
            "GET /ready?full=1 HTTP/1.1\r\nHost: 10.244.1.5:8080\r\nUser-Agent: kube-probe/1.33\r\n\
             X-Custom: a b\r\nConnection: close\r\n\r\n"
        );
        let mut buf = Vec::new();
        let headers = vec![("host".to_owned(), "web.local".to_owned()), ("User-Agent".to_owned(), "me".to_owned())];
        write_request(&mut buf, &target("/"), Some("web.local"), &headers);
        assert_eq!(
            String::from_utf8(buf).expect("text"),
            "GET / HTTP/1.1\r\nHost: web.local\r\nAccept: */*\r\nUser-Agent: me\r\nConnection: close\r\n\r\n"
        );
        assert_eq!(status_code("HTTP/1.0 404 Not Found\r\nServer: x"), Some(404));
        assert_eq!(status_code("SSH-2.0-OpenSSH"), None);
    }

    /// A server on loopback answering each connection with the next canned response; the
    /// requests it got, one per connection.
    async fn serve(responses: Vec<String>) -> (u16, tokio::task::JoinHandle<Vec<String>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("address").port();
        let handle = tokio::spawn(async move {
            let mut requests = Vec::new();
            for response in responses {
                let (mut conn, _) = listener.accept().await.expect("accept");
                let mut request = Vec::new();
                while !request.ends_with(b"\r\n\r\n") {
                    let mut byte = [0u8; 1];
                    if conn.read(&mut byte).await.expect("read") == 0 {
                        break;
                    }
                    request.push(byte[0]);
                }
                requests.push(String::from_utf8_lossy(&request).into_owned());
                conn.write_all(response.as_bytes()).await.expect("write");
            }
            requests
        });
        (port, handle)
    }

    fn get(port: u16, path: &str) -> HttpGet {
        HttpGet { host: None, port, path: path.into(), headers: Vec::new(), https: false }
    }

    #[tokio::test]
    async fn probes_against_a_real_server() {
        let second = Duration::from_secs(1);
        let mut buf = Vec::new();
        let (port, server) = serve(vec!["HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".into()]).await;
        assert_eq!(probe(&get(port, ""), "127.0.0.1", second, &mut buf).await, (ProbeResult::Success, String::new()));
        assert!(server.await.expect("server")[0].starts_with("GET / HTTP/1.1\r\nHost: 127.0.0.1:"));

        let (port, _server) = serve(vec!["HTTP/1.1 503 Service Unavailable\r\n\r\n".into()]).await;
        let failed = probe(&get(port, "/ready"), "127.0.0.1", second, &mut buf).await;
        assert_eq!(failed, (ProbeResult::Failure, "HTTP probe failed with statuscode: 503".into()));

        // Followed to the same host; the second answer decides.
        let (port, server) =
            serve(vec!["HTTP/1.1 302 Found\r\nLocation: /moved\r\n\r\n".into(), "HTTP/1.1 500 Oops\r\n\r\n".into()])
                .await;
        let moved = probe(&get(port, "/old"), "127.0.0.1", second, &mut buf).await;
        assert_eq!(moved.0, ProbeResult::Failure);
        assert!(server.await.expect("server")[1].starts_with("GET /moved HTTP/1.1"));

        // Elsewhere: not followed, a success.
        let (port, _server) = serve(vec!["HTTP/1.1 301 Moved\r\nLocation: http://192.0.2.1/\r\n\r\n".into()]).await;
        let elsewhere = probe(&get(port, "/"), "127.0.0.1", second, &mut buf).await;
        assert_eq!(elsewhere, (ProbeResult::Success, "Probe terminated redirects".into()));

        // A loop ends after ten.
        let looping = vec!["HTTP/1.1 307 Again\r\nLocation: /loop\r\n\r\n".to_owned(); MAX_REDIRECTS + 1];
        let (port, _server) = serve(looping).await;
        let (result, message) = probe(&get(port, "/loop"), "127.0.0.1", second, &mut buf).await;
        assert_eq!(result, ProbeResult::Failure);
        assert!(message.ends_with("stopped after 10 redirects"), "{message}");

        // Nobody listening; a server that never answers.
        let closed = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = closed.local_addr().expect("address").port();
        drop(closed);
        let (result, message) = probe(&get(port, "/"), "127.0.0.1", second, &mut buf).await;
        assert_eq!(result, ProbeResult::Failure);
        assert!(message.ends_with("connect: connection refused"), "{message}");
        let silent = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = silent.local_addr().expect("address").port();
        let (result, message) = probe(&get(port, "/"), "127.0.0.1", Duration::from_millis(200), &mut buf).await;
        assert_eq!(result, ProbeResult::Failure);
        assert!(message.contains("Client.Timeout exceeded"), "{message}");
    }
}
