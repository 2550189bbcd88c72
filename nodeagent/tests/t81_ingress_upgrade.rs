//! The Ingress proxy passes an HTTP/1.1 Upgrade (a WebSocket handshake) through: a client on
//! loopback asks shop.example's route for `Upgrade: websocket`, an endpoint on loopback (standing
//! in for the Pod) switches protocols, and bytes then flow both ways through the proxy. An
//! endpoint that declines the upgrade answers as usual, and plain requests keep working.

use gitplane_api::ObjectKey;
use gitplane_nodeagent::{
    network::ingress::{Routes, Snapshot, proxy::Proxy, table},
    network::view::View,
};
use serde_json::json;
use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

const DEADLINE: Duration = Duration::from_secs(10);

/// Routes `shop.example` to the endpoint at `endpoint`.
fn routes(endpoint: SocketAddr) -> Arc<Routes> {
    let mut view = View::default();
    let service = json!({"metadata": {"name": "chat", "namespace": "default"},
                         "spec": {"ports": [{"name": "http", "port": 80}]}});
    let slice = json!({"metadata": {"name": "chat-x", "namespace": "default",
                                    "labels": {"kubernetes.io/service-name": "chat"}},
        "addressType": "IPv4", "ports": [{"name": "http", "port": endpoint.port()}],
        "endpoints": [{"addresses": [endpoint.ip().to_string()], "conditions": {"ready": true}}]});
    let ingress = json!({"metadata": {"name": "chat", "namespace": "default"},
        "spec": {"rules": [{"host": "shop.example", "http": {"paths": [{"path": "/", "pathType": "Prefix",
            "backend": {"service": {"name": "chat", "port": {"number": 80}}}}]}}]}});
    view.services
        .insert(ObjectKey::new("Service", "default", "chat"), Arc::new(serde_json::from_value(service).unwrap()));
    view.slices
        .insert(ObjectKey::new("EndpointSlice", "default", "chat-x"), Arc::new(serde_json::from_value(slice).unwrap()));
    view.ingresses.insert(
        ObjectKey::new("Ingress.networking.k8s.io", "default", "chat"),
        Arc::new(serde_json::from_value(ingress).unwrap()),
    );
    let routes = Arc::new(Routes::default());
    routes.store(Snapshot { table: table(&view), certificates: Default::default() });
    routes
}

/// Reads up to the end of an HTTP head.
async fn read_head(stream: &mut TcpStream) -> String {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8];
        let n = stream.read(&mut byte).await.unwrap();
        assert_eq!(n, 1, "the connection closed within the head: {}", String::from_utf8_lossy(&head));
        head.push(byte[0]);
    }
    String::from_utf8(head).unwrap()
}

/// An endpoint that switches to an echo protocol when asked (saying "hello" first) and answers
/// other requests with a 200; the heads it received are kept.
async fn endpoint(heads: Arc<Mutex<Vec<String>>>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let heads = heads.clone();
            tokio::spawn(async move {
                loop {
                    let head = read_head(&mut stream).await.to_lowercase();
                    heads.lock().unwrap().push(head.clone());
                    if head.contains("upgrade: websocket") && !head.contains("x-decline") {
                        let switch = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\nhello";
                        stream.write_all(switch.as_bytes()).await.unwrap();
                        let mut buf = [0u8; 1024];
                        loop {
                            match stream.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => stream.write_all(&buf[..n]).await.unwrap(),
                            }
                        }
                    }
                    stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n").await.unwrap();
                }
            });
        }
    });
    addr
}

async fn proxy(routes: Arc<Routes>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    // Kept for the life of the test process: the proxy serves until then.
    std::mem::forget(stop);
    tokio::spawn(Proxy::new(routes).serve_http(listener, stopped));
    addr
}

const HANDSHAKE: &str = "GET /chat HTTP/1.1\r\nHost: shop.example\r\nConnection: keep-alive, Upgrade\r\n\
                         Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
                         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n";

#[tokio::test]
async fn a_websocket_upgrade_is_passed_through_both_ways() {
    let heads = Arc::new(Mutex::new(Vec::new()));
    let addr = proxy(routes(endpoint(heads.clone()).await)).await;
    tokio::time::timeout(DEADLINE, async {
        let mut client = TcpStream::connect(addr).await.unwrap();
        client.write_all(format!("{HANDSHAKE}\r\n").as_bytes()).await.unwrap();
        let head = read_head(&mut client).await.to_lowercase();
        assert!(head.starts_with("http/1.1 101"), "{head}");
        assert!(head.contains("upgrade: websocket") && head.contains("connection: upgrade"), "{head}");
        let mut hello = [0u8; 5];
        client.read_exact(&mut hello).await.unwrap();
        assert_eq!(&hello, b"hello", "the endpoint's first bytes reach the client");
        for message in ["ping", "a longer message, both ways"] {
            client.write_all(message.as_bytes()).await.unwrap();
            let mut echo = vec![0u8; message.len()];
            client.read_exact(&mut echo).await.unwrap();
            assert_eq!(echo, message.as_bytes());
        }
        let seen = heads.lock().unwrap()[0].clone();
        for wanted in ["connection: upgrade", "upgrade: websocket", "sec-websocket-key:", "x-forwarded-for: 127.0.0.1"]
        {
            assert!(seen.contains(wanted), "the endpoint got no {wanted:?}: {seen}");
        }
    })
    .await
    .expect("the upgrade was not passed through in time");
}

#[tokio::test]
async fn a_declined_upgrade_and_plain_requests_are_answered_as_usual() {
    let heads = Arc::new(Mutex::new(Vec::new()));
    let addr = proxy(routes(endpoint(heads.clone()).await)).await;
    tokio::time::timeout(DEADLINE, async {
        let mut client = TcpStream::connect(addr).await.unwrap();
        client.write_all(format!("{HANDSHAKE}X-Decline: 1\r\n\r\n").as_bytes()).await.unwrap();
        let head = read_head(&mut client).await.to_lowercase();
        assert!(head.starts_with("http/1.1 200"), "{head}");
        let mut body = [0u8; 3];
        client.read_exact(&mut body).await.unwrap();
        // The same client connection goes on with a plain request, which carries no Upgrade.
        client.write_all(b"GET /plain HTTP/1.1\r\nHost: shop.example\r\n\r\n").await.unwrap();
        let head = read_head(&mut client).await.to_lowercase();
        assert!(head.starts_with("http/1.1 200"), "{head}");
        let plain = heads.lock().unwrap().iter().find(|h| h.starts_with("get /plain")).cloned().unwrap();
        assert!(!plain.contains("upgrade"), "a plain request is forwarded without Upgrade: {plain}");
    })
    .await
    .expect("the requests were not answered in time");
}
