//! The Ingress proxy's bounds, with real sockets on loopback: clients come from distinct
//! loopback addresses (127.0.0.2, .3, ...) to a proxy on 127.0.0.1, in front of an endpoint
//! that answers with the length of the body it received. Each test shortens the limit it checks.

use gitplane_api::ObjectKey;
use gitplane_nodeagent::{
    network::ingress::{Routes, Snapshot, limits::Limits, proxy::Proxy, table},
    network::view::View,
};
use http_body_util::BodyExt as _;
use serde_json::json;
use std::{
    net::{Ipv4Addr, SocketAddr},
    sync::Arc,
    time::{Duration, Instant},
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpSocket, TcpStream},
};

const DEADLINE: Duration = Duration::from_secs(10);

/// Routes `shop.example` to the endpoint at `endpoint`.
fn routes(endpoint: SocketAddr) -> Arc<Routes> {
    let mut view = View::default();
    let service = json!({"metadata": {"name": "shop", "namespace": "default"},
                         "spec": {"ports": [{"name": "http", "port": 80}]}});
    let slice = json!({"metadata": {"name": "shop-x", "namespace": "default",
                                    "labels": {"kubernetes.io/service-name": "shop"}},
        "addressType": "IPv4", "ports": [{"name": "http", "port": endpoint.port()}],
        "endpoints": [{"addresses": [endpoint.ip().to_string()], "conditions": {"ready": true}}]});
    let ingress = json!({"metadata": {"name": "shop", "namespace": "default"},
        "spec": {"rules": [{"host": "shop.example", "http": {"paths": [{"path": "/", "pathType": "Prefix",
            "backend": {"service": {"name": "shop", "port": {"number": 80}}}}]}}]}});
    view.services
        .insert(ObjectKey::new("Service", "default", "shop"), Arc::new(serde_json::from_value(service).unwrap()));
    view.slices
        .insert(ObjectKey::new("EndpointSlice", "default", "shop-x"), Arc::new(serde_json::from_value(slice).unwrap()));
    view.ingresses.insert(
        ObjectKey::new("Ingress.networking.k8s.io", "default", "shop"),
        Arc::new(serde_json::from_value(ingress).unwrap()),
    );
    let routes = Arc::new(Routes::default());
    routes.store(Snapshot { table: table(&view), certificates: Default::default() });
    routes
}

/// An endpoint answering every request with `got <body length>`.
async fn endpoint() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|request: hyper::Request<hyper::body::Incoming>| async {
                    let body = request.into_body().collect().await?.to_bytes();
                    Ok::<_, hyper::Error>(hyper::Response::new(http_body_util::Full::new(bytes::Bytes::from(format!(
                        "got {}",
                        body.len()
                    )))))
                });
                let io = hyper_util::rt::TokioIo::new(stream);
                // Room for the proxy's forwarded headers on top of a client's 100.
                let mut builder = hyper::server::conn::http1::Builder::new();
                let _ = builder.max_headers(200).serve_connection(io, service).await;
            });
        }
    });
    addr
}

/// A proxy with `limits` in front of a fresh endpoint.
async fn proxy(limits: Limits) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    // Kept for the life of the test process: the proxy serves until then.
    std::mem::forget(stop);
    tokio::spawn(Proxy::with_limits(routes(endpoint().await), limits).serve_http(listener, stopped));
    addr
}

/// A connection to `to` from the loopback address 127.0.0.`host`.
async fn connect_from(host: u8, to: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::from((Ipv4Addr::new(127, 0, 0, host), 0))).unwrap();
    socket.connect(to).await.unwrap()
}

/// Reads one answer: its status and body (by Content-Length; hyper sets it for these bodies).
async fn answer(stream: &mut TcpStream) -> Option<(u16, String)> {
    let read = async {
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut byte = [0u8];
            if stream.read(&mut byte).await.ok()? == 0 {
                return None;
            }
            head.push(byte[0]);
        }
        let head = String::from_utf8(head).ok()?;
        let status = head.get(9..12)?.parse().ok()?;
        let length = head
            .lines()
            .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_owned()))
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(0);
        let mut body = vec![0u8; length];
        stream.read_exact(&mut body).await.ok()?;
        Some((status, String::from_utf8_lossy(&body).into_owned()))
    };
    tokio::time::timeout(DEADLINE, read).await.ok().flatten()
}

/// Sends `request` and reads the answer.
async fn exchange(stream: &mut TcpStream, request: &[u8]) -> Option<(u16, String)> {
    stream.write_all(request).await.ok()?;
    answer(stream).await
}

const GET: &[u8] = b"GET / HTTP/1.1\r\nHost: shop.example\r\n\r\n";

fn post(length: usize, sent: usize) -> Vec<u8> {
    let mut request = format!("POST / HTTP/1.1\r\nHost: shop.example\r\nContent-Length: {length}\r\n\r\n").into_bytes();
    request.extend(std::iter::repeat_n(b'x', sent));
    request
}

/// Whether the proxy closes `stream` (end of stream or reset, without an answer) before the
/// deadline.
async fn closed_unanswered(stream: &mut TcpStream) -> bool {
    let mut buf = [0u8; 64];
    matches!(tokio::time::timeout(DEADLINE, stream.read(&mut buf)).await, Ok(Ok(0) | Err(_)))
}

#[tokio::test]
async fn t81_one_client_holds_at_most_its_share_of_connections() {
    let limits = Limits { max_connections: 6, max_connections_per_client: 4, ..Limits::default() };
    let addr = proxy(limits).await;
    // Client .2 takes its four, each answered and kept open.
    let mut held = Vec::new();
    for _ in 0..4 {
        let mut stream = connect_from(2, addr).await;
        assert_eq!(exchange(&mut stream, GET).await, Some((200, "got 0".into())));
        held.push(stream);
    }
    let mut fifth = connect_from(2, addr).await;
    let _ = fifth.write_all(GET).await;
    assert!(closed_unanswered(&mut fifth).await, "a fifth connection of the same client is closed");
    // Another client is served meanwhile, up to the total of six.
    let mut others = Vec::new();
    for _ in 0..2 {
        let mut stream = connect_from(3, addr).await;
        assert_eq!(exchange(&mut stream, GET).await, Some((200, "got 0".into())), "client .3 is served");
        others.push(stream);
    }
    let mut seventh = connect_from(4, addr).await;
    let _ = seventh.write_all(GET).await;
    assert!(closed_unanswered(&mut seventh).await, "six connections are open in all");
    // A connection given back makes room (once the proxy has seen it close).
    drop(held.pop());
    let start = Instant::now();
    loop {
        let mut stream = connect_from(4, addr).await;
        if exchange(&mut stream, GET).await == Some((200, "got 0".into())) {
            break;
        }
        assert!(start.elapsed() < DEADLINE, "client .4 is served once a connection closed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn t81_oversized_request_heads_get_431() {
    let addr = proxy(Limits::default()).await;
    let with = |header: String| format!("GET / HTTP/1.1\r\nHost: shop.example\r\n{header}\r\n").into_bytes();
    let status = |request: Vec<u8>| async move {
        let mut stream = connect_from(2, addr).await;
        exchange(&mut stream, &request).await.map(|(status, _)| status)
    };
    // Under both limits: 60 KiB in one field, and 99 fields besides Host.
    assert_eq!(status(with(format!("X-Big: {}\r\n", "a".repeat(60 << 10)))).await, Some(200));
    let fields: String = (0..99).map(|i| format!("X-F{i}: v\r\n")).collect();
    assert_eq!(status(with(fields)).await, Some(200));
    // Over them: a 70 KiB head (hyper alone would take 400 KB), and 101 fields.
    assert_eq!(status(with(format!("X-Big: {}\r\n", "a".repeat(70 << 10)))).await, Some(431));
    let fields: String = (0..100).map(|i| format!("X-F{i}: v\r\n")).collect();
    assert_eq!(status(with(fields)).await, Some(431));
}

#[tokio::test]
async fn t81_a_slow_body_is_cut_off() {
    let limits = Limits { body_timeout: Duration::from_millis(300), ..Limits::default() };
    let addr = proxy(limits).await;
    let mut stream = connect_from(2, addr).await;
    assert_eq!(exchange(&mut stream, &post(10, 10)).await, Some((200, "got 10".into())), "a body sent at once");
    // Two bytes of ten, then nothing: 408 once the body's time is up, and the connection closes.
    let start = Instant::now();
    assert_eq!(exchange(&mut stream, &post(10, 2)).await.map(|(status, _)| status), Some(408));
    assert!(start.elapsed() >= Duration::from_millis(300));
    assert!(closed_unanswered(&mut stream).await, "the connection closes after a 408");
}

#[tokio::test]
async fn t81_idle_connections_are_closed() {
    let limits = Limits { idle_timeout: Duration::from_millis(300), ..Limits::default() };
    let addr = proxy(limits).await;
    // Idle after an answer (keep-alive).
    let mut stream = connect_from(2, addr).await;
    assert_eq!(exchange(&mut stream, GET).await, Some((200, "got 0".into())));
    assert!(closed_unanswered(&mut stream).await, "an idle keep-alive connection is closed");
    // Silent from the start, and sending a head too slowly.
    let mut silent = connect_from(2, addr).await;
    assert!(closed_unanswered(&mut silent).await, "a connection that sends nothing is closed");
    let mut slow = connect_from(2, addr).await;
    slow.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(600) {
        if slow.write_all(b"X-A: b\r\n").await.is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(closed_unanswered(&mut slow).await, "a head trickled past the timeout is cut off");
}

#[tokio::test]
async fn t81_request_bodies_held_are_bounded_in_all_and_per_client() {
    let limits = Limits { max_buffered_bodies: 3000, max_buffered_bodies_per_client: 2000, ..Limits::default() };
    let addr = proxy(limits).await;
    // Client .2 holds 1,500 bytes (a body not finished); 1,500 more would pass its 2,000.
    let mut stalled = connect_from(2, addr).await;
    stalled.write_all(&post(1500, 10)).await.unwrap();
    let start = Instant::now();
    let mut second = connect_from(2, addr).await;
    loop {
        // The first body's share is taken once the proxy has read its head.
        match exchange(&mut second, &post(1500, 1500)).await {
            Some((503, _)) => break,
            other => assert!(start.elapsed() < DEADLINE, "client .2's second body: {other:?}"),
        }
        second = connect_from(2, addr).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Another client's body is served.
    let mut other = connect_from(3, addr).await;
    assert_eq!(exchange(&mut other, &post(1000, 1000)).await, Some((200, "got 1000".into())));
    // Client .3 then holds 1,000 unfinished: 2,500 in all, so a third client's 1,000 is refused.
    let mut other_stalled = connect_from(3, addr).await;
    other_stalled.write_all(&post(1000, 1)).await.unwrap();
    let start = Instant::now();
    loop {
        let mut third = connect_from(4, addr).await;
        match exchange(&mut third, &post(1000, 1000)).await {
            Some((503, _)) => break,
            other => assert!(start.elapsed() < DEADLINE, "client .4's body: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A chunked body (no declared length) is counted as it arrives.
    let mut chunked = connect_from(5, addr).await;
    let chunk = format!("{:x}\r\n{}\r\n", 600, "c".repeat(600));
    let request = format!("POST / HTTP/1.1\r\nHost: shop.example\r\nTransfer-Encoding: chunked\r\n\r\n{chunk}{chunk}");
    assert_eq!(exchange(&mut chunked, request.as_bytes()).await.map(|(status, _)| status), Some(503));
    // Bodies given back make room again.
    drop((stalled, other_stalled));
    let start = Instant::now();
    loop {
        let mut stream = connect_from(4, addr).await;
        if exchange(&mut stream, &post(1000, 1000)).await == Some((200, "got 1000".into())) {
            break;
        }
        assert!(start.elapsed() < DEADLINE, "room again once the held bodies are gone");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
