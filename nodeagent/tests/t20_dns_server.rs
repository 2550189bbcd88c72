//! The DNS server on loopback with real queries: every record type, forwarding to fake
//! upstream servers the test runs (nothing leaves the machine), stub domains from the
//! ConfigMap, TCP after truncation, malformed packets, updates seen by the next query, and
//! recursion refused to clients outside the allowed ranges (from another loopback address).

use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gitplane_nodeagent::network::dns::{Dns, Forwarding, Listeners, ResolvConf, Server, ServerConfig, ZoneConfig};
use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{Name, RData, Record, RecordType};
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const DEADLINE: Duration = Duration::from_secs(10);

fn service(ns: &str, name: &str, spec: serde_json::Value) -> Service {
    serde_json::from_value(serde_json::json!({"metadata": {"namespace": ns, "name": name}, "spec": spec})).unwrap()
}

fn slice(ns: &str, name: &str, svc: &str, endpoints: serde_json::Value, ports: serde_json::Value) -> EndpointSlice {
    serde_json::from_value(serde_json::json!({
        "metadata": {"namespace": ns, "name": name, "labels": {"kubernetes.io/service-name": svc}},
        "addressType": "IPv4", "endpoints": endpoints, "ports": ports,
    }))
    .unwrap()
}

fn query_message(name: &str, qtype: RecordType, edns: bool) -> Message {
    let mut q = Message::new(rand_id(), MessageType::Query, OpCode::Query);
    q.metadata.recursion_desired = true;
    q.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
    if edns {
        let mut e = Edns::new();
        e.set_max_payload(1232);
        q.set_edns(e);
    }
    q
}

fn rand_id() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(100);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Sends a datagram and waits for the reply with the same id; resends until the deadline.
fn udp_exchange(server: SocketAddr, packet: &[u8], id: u16) -> Option<Message> {
    udp_exchange_from(Ipv4Addr::LOCALHOST, server, packet, id).map(|(msg, _)| msg)
}

/// As `udp_exchange`, from the address `source`; the reply and its size.
fn udp_exchange_from(source: Ipv4Addr, server: SocketAddr, packet: &[u8], id: u16) -> Option<(Message, usize)> {
    let socket = UdpSocket::bind((source, 0)).unwrap();
    socket.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
    let start = Instant::now();
    let mut buf = [0u8; 65535];
    while start.elapsed() < DEADLINE {
        socket.send_to(packet, server).unwrap();
        while let Ok((len, _)) = socket.recv_from(&mut buf) {
            if let Ok(msg) = Message::from_vec(&buf[..len])
                && msg.id == id
            {
                return Some((msg, len));
            }
        }
    }
    None
}

fn udp(server: SocketAddr, name: &str, qtype: RecordType) -> Message {
    let q = query_message(name, qtype, true);
    udp_exchange(server, &q.to_vec().unwrap(), q.id).unwrap_or_else(|| panic!("no answer to {name} {qtype}"))
}

async fn tcp(server: SocketAddr, name: &str, qtype: RecordType) -> Message {
    tcp_from(Ipv4Addr::LOCALHOST, server, name, qtype).await
}

async fn tcp_from(source: Ipv4Addr, server: SocketAddr, name: &str, qtype: RecordType) -> Message {
    let q = query_message(name, qtype, false).to_vec().unwrap();
    let exchange = async {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind((source, 0).into()).unwrap();
        let mut stream = socket.connect(server).await.unwrap();
        stream.write_all(&(q.len() as u16).to_be_bytes()).await.unwrap();
        stream.write_all(&q).await.unwrap();
        let len = stream.read_u16().await.unwrap();
        let mut buf = vec![0u8; len.into()];
        stream.read_exact(&mut buf).await.unwrap();
        Message::from_vec(&buf).unwrap()
    };
    tokio::time::timeout(DEADLINE, exchange).await.expect("TCP answer in time")
}

fn shown(msg: &Message) -> Vec<String> {
    msg.answers.iter().map(ToString::to_string).collect()
}

/// A resolver the test runs: answers A queries with `answer`, and over UDP answers names
/// starting with "big." truncated (TC, no records) and over TCP with 100 records.
struct FakeUpstream {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<String>>>,
}

impl FakeUpstream {
    async fn start(answer: [u8; 4]) -> FakeUpstream {
        let udp = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = udp.local_addr().unwrap();
        let tcp = tokio::net::TcpListener::bind(addr).await.unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let respond = {
            let seen = seen.clone();
            move |packet: &[u8], over_tcp: bool| -> Vec<u8> {
                let q = Message::from_vec(packet).unwrap();
                let question = q.queries[0].clone();
                seen.lock().unwrap().push(format!("{} {}", question.name(), if over_tcp { "tcp" } else { "udp" }));
                let mut r = Message::new(q.id, MessageType::Response, OpCode::Query);
                r.metadata.recursion_available = true;
                r.add_query(question.clone());
                let big = question.name().to_string().starts_with("big.");
                if big && !over_tcp {
                    r.metadata.truncation = true;
                } else {
                    let count = if big { 100 } else { 1 };
                    for i in 0..count {
                        let ip = [answer[0], answer[1], answer[2], answer[3].wrapping_add(i)];
                        r.add_answer(Record::from_rdata(
                            question.name().clone(),
                            60,
                            RData::A(A(std::net::Ipv4Addr::from(ip))),
                        ));
                    }
                }
                r.to_vec().unwrap()
            }
        };
        let on_udp = respond.clone();
        tokio::spawn(async move {
            let mut buf = [0u8; 4096];
            while let Ok((len, peer)) = udp.recv_from(&mut buf).await {
                let _ = udp.send_to(&on_udp(&buf[..len], false), peer).await;
            }
        });
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = tcp.accept().await {
                let respond = respond.clone();
                tokio::spawn(async move {
                    let len = stream.read_u16().await.unwrap();
                    let mut buf = vec![0u8; len.into()];
                    stream.read_exact(&mut buf).await.unwrap();
                    let reply = respond(&buf, true);
                    stream.write_all(&(reply.len() as u16).to_be_bytes()).await.unwrap();
                    stream.write_all(&reply).await.unwrap();
                });
            }
        });
        FakeUpstream { addr, seen }
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

fn cluster(upstream: SocketAddr) -> (Dns, Server) {
    cluster_serving(upstream, ServerConfig::default().allow_recursion)
}

/// The test's zone, forwarding to `upstream` for the clients in `allow_recursion`.
fn cluster_serving(upstream: SocketAddr, allow_recursion: Vec<ipnet::IpNet>) -> (Dns, Server) {
    let dns = Dns::new(ZoneConfig::default(), Forwarding::new(vec![upstream])).unwrap();
    dns.apply_service(&service(
        "shop",
        "web",
        serde_json::json!({"clusterIP": "10.96.0.20", "ports": [{"name": "http", "port": 80}]}),
    ))
    .unwrap();
    dns.apply_service(&service(
        "shop",
        "db",
        serde_json::json!({"clusterIP": "None", "ports": [{"name": "pg", "port": 5432}]}),
    ))
    .unwrap();
    dns.apply_slice(&slice(
        "shop",
        "db-1",
        "db",
        serde_json::json!([{"addresses": ["10.244.1.5"], "hostname": "db-0"}, {"addresses": ["10.244.2.6"], "hostname": "db-1"}]),
        serde_json::json!([{"name": "pg", "port": 5432, "protocol": "TCP"}]),
    ))
    .unwrap();
    dns.apply_service(&service(
        "shop",
        "ext",
        serde_json::json!({"type": "ExternalName", "externalName": "www.example.com"}),
    ))
    .unwrap();
    let endpoints: Vec<_> = (1..=150).map(|i| serde_json::json!({"addresses": [format!("10.244.3.{i}")]})).collect();
    dns.apply_service(&service("shop", "many", serde_json::json!({"clusterIP": "None"}))).unwrap();
    dns.apply_slice(&slice("shop", "many-1", "many", serde_json::Value::Array(endpoints), serde_json::json!([])))
        .unwrap();
    let listeners = Listeners::bind(&["127.0.0.1:0".parse().unwrap()]).unwrap();
    let cfg = ServerConfig {
        udp_threads: 2,
        upstream_timeout: Duration::from_millis(500),
        allow_recursion,
        ..ServerConfig::default()
    };
    let server = dns.serve(listeners, cfg).unwrap();
    (dns, server)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t20_every_record_type_over_udp_and_tcp() {
    let upstream = FakeUpstream::start([192, 0, 2, 10]).await;
    let (_dns, server) = cluster(upstream.addr);
    let at = server.udp_addrs()[0];
    assert_eq!(server.tcp_addrs()[0], at, "UDP and TCP share the port");
    let cases: &[(&str, RecordType, &[&str])] = &[
        ("web.shop.svc.cluster.local.", RecordType::A, &["web.shop.svc.cluster.local. 5 IN A 10.96.0.20"]),
        (
            "_http._tcp.web.shop.svc.cluster.local.",
            RecordType::SRV,
            &["_http._tcp.web.shop.svc.cluster.local. 5 IN SRV 0 100 80 web.shop.svc.cluster.local."],
        ),
        (
            "db.shop.svc.cluster.local.",
            RecordType::A,
            &["db.shop.svc.cluster.local. 5 IN A 10.244.1.5", "db.shop.svc.cluster.local. 5 IN A 10.244.2.6"],
        ),
        ("db-1.db.shop.svc.cluster.local.", RecordType::A, &["db-1.db.shop.svc.cluster.local. 5 IN A 10.244.2.6"]),
        (
            "_pg._tcp.db.shop.svc.cluster.local.",
            RecordType::SRV,
            &[
                "_pg._tcp.db.shop.svc.cluster.local. 5 IN SRV 0 100 5432 db-0.db.shop.svc.cluster.local.",
                "_pg._tcp.db.shop.svc.cluster.local. 5 IN SRV 0 100 5432 db-1.db.shop.svc.cluster.local.",
            ],
        ),
        (
            "20.0.96.10.in-addr.arpa.",
            RecordType::PTR,
            &["20.0.96.10.in-addr.arpa. 5 IN PTR web.shop.svc.cluster.local."],
        ),
        (
            "6.2.244.10.in-addr.arpa.",
            RecordType::PTR,
            &["6.2.244.10.in-addr.arpa. 5 IN PTR db-1.db.shop.svc.cluster.local."],
        ),
        (
            "10-244-7-8.shop.pod.cluster.local.",
            RecordType::A,
            &["10-244-7-8.shop.pod.cluster.local. 5 IN A 10.244.7.8"],
        ),
        ("dns-version.cluster.local.", RecordType::TXT, &["dns-version.cluster.local. 5 IN TXT 1.1.0"]),
        // ExternalName: the CNAME, then the target's address from the upstream.
        (
            "ext.shop.svc.cluster.local.",
            RecordType::A,
            &["ext.shop.svc.cluster.local. 5 IN CNAME www.example.com.", "www.example.com. 60 IN A 192.0.2.10"],
        ),
    ];
    for (name, qtype, want) in cases {
        let r = udp(at, name, *qtype);
        assert_eq!(
            (r.response_code, shown(&r)),
            (ResponseCode::NoError, want.iter().map(|s| s.to_string()).collect()),
            "{name} {qtype} over UDP"
        );
        let r = tcp(at, name, *qtype).await;
        assert_eq!(shown(&r), want.iter().map(|s| s.to_string()).collect::<Vec<_>>(), "{name} {qtype} over TCP");
    }
    let r = udp(at, "_pg._tcp.db.shop.svc.cluster.local.", RecordType::SRV);
    assert_eq!(r.additionals.len(), 2, "SRV targets' addresses come along");

    let r = udp(at, "nope.shop.svc.cluster.local.", RecordType::A);
    assert_eq!(
        (r.response_code, r.answers.len(), r.authorities[0].record_type()),
        (ResponseCode::NXDomain, 0, RecordType::SOA)
    );
    let r = udp(at, "web.shop.svc.cluster.local.", RecordType::AAAA);
    assert_eq!(
        (r.response_code, r.answers.len(), r.authorities[0].record_type()),
        (ResponseCode::NoError, 0, RecordType::SOA)
    );
    // The search path's tries of an outside name stay here; only the name itself goes out.
    let r = udp(at, "www.example.com.shop.svc.cluster.local.", RecordType::A);
    assert_eq!(r.response_code, ResponseCode::NXDomain);
    assert_eq!(upstream.seen(), ["www.example.com. udp", "www.example.com. tcp"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t20_forwarding_and_stub_domains_from_the_config_map() {
    let upstream = FakeUpstream::start([192, 0, 2, 10]).await;
    let stub = FakeUpstream::start([198, 51, 100, 7]).await;
    let (dns, server) = cluster(upstream.addr);
    let at = server.udp_addrs()[0];
    let r = udp(at, "www.acme.corp.", RecordType::A);
    assert_eq!(shown(&r), ["www.acme.corp. 60 IN A 192.0.2.10"]);
    assert!(r.recursion_available && !r.authoritative);

    let host = ResolvConf::parse(&format!("nameserver {}\n", upstream.addr.ip()));
    let cm: ConfigMap = serde_json::from_value(
        serde_json::json!({"metadata": {"namespace": "kube-system", "name": "kube-dns"}, "data": {
            "stubDomains": format!(r#"{{"acme.corp": ["{}"]}}"#, stub.addr),
            "upstreamNameservers": format!(r#"["{}"]"#, upstream.addr),
        }}),
    )
    .unwrap();
    dns.apply_config_map(&host, &cm).unwrap();
    let r = udp(at, "www.ACME.corp.", RecordType::A);
    assert_eq!(shown(&r), ["www.ACME.corp. 60 IN A 198.51.100.7"], "the stub domain's server answers");
    assert_eq!(shown(&udp(at, "www.example.org.", RecordType::A)), ["www.example.org. 60 IN A 192.0.2.10"]);
    assert_eq!(stub.seen(), ["www.ACME.corp. udp"]);

    // A bad ConfigMap changes nothing.
    let bad: ConfigMap =
        serde_json::from_value(serde_json::json!({"data": {"stubDomains": "{\"acme.corp\": [\"nameserver\"]}"}}))
            .unwrap();
    assert!(dns.apply_config_map(&host, &bad).is_err());
    assert_eq!(shown(&udp(at, "db.acme.corp.", RecordType::A)), ["db.acme.corp. 60 IN A 198.51.100.7"]);

    // Nobody answers: SERVFAIL once the upstream timeout has passed, not silence.
    let silent = UdpSocket::bind("127.0.0.1:0").unwrap();
    dns.set_forwarding(Forwarding::new(vec![silent.local_addr().unwrap()]));
    let r = udp(at, "www.example.org.", RecordType::A);
    assert_eq!(r.response_code, ResponseCode::ServFail);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t20_truncation_then_tcp() {
    let upstream = FakeUpstream::start([192, 0, 2, 10]).await;
    let (_dns, server) = cluster(upstream.addr);
    let at = server.udp_addrs()[0];
    // 150 endpoints do not fit in 1232 bytes: TC over UDP, everything over TCP.
    let r = udp(at, "many.shop.svc.cluster.local.", RecordType::A);
    assert!(r.truncation && r.answers.is_empty());
    let r = tcp(at, "many.shop.svc.cluster.local.", RecordType::A).await;
    assert_eq!((r.truncation, r.answers.len()), (false, 150));
    // A truncated upstream answer reaches the client truncated; its TCP retry goes out over TCP.
    let r = udp(at, "big.example.com.", RecordType::A);
    assert!(r.truncation && r.answers.is_empty());
    let r = tcp(at, "big.example.com.", RecordType::A).await;
    assert_eq!((r.truncation, r.answers.len()), (false, 100));
    assert_eq!(upstream.seen(), ["big.example.com. udp", "big.example.com. tcp"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t20_malformed_packets_are_survived() {
    let upstream = FakeUpstream::start([192, 0, 2, 10]).await;
    let (_dns, server) = cluster(upstream.addr);
    let at = server.udp_addrs()[0];
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    client.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
    let mut buf = [0u8; 4096];
    // Too short for a header, or a response: no answer at all.
    for packet in [&b""[..], &[0xab; 5], &[0x12, 0x34, 0x80, 0, 0, 1, 0, 0, 0, 0, 0, 0]] {
        client.send_to(packet, at).unwrap();
        assert!(client.recv_from(&mut buf).is_err(), "{packet:?} answered");
    }
    // A header with a broken question: FORMERR with the id.
    let q = query_message("web.shop.svc.cluster.local.", RecordType::A, false).to_vec().unwrap();
    let r = udp_exchange(at, &q[..q.len() - 2], Message::from_vec(&q).unwrap().id).expect("FORMERR");
    assert_eq!(r.response_code, ResponseCode::FormErr);
    // Garbage of every size, then the server still answers.
    for i in 0..2000u32 {
        let len = (i as usize * 7) % 600;
        let packet: Vec<u8> =
            (0..len).map(|j| (i.wrapping_mul(2_654_435_761).wrapping_add(j as u32 * 40_503) >> 11) as u8).collect();
        client.send_to(&packet, at).unwrap();
    }
    let mut stream = tokio::net::TcpStream::connect(at).await.unwrap();
    stream.write_all(&[0, 40, 1, 2, 3]).await.unwrap();
    drop(stream);
    assert_eq!(
        shown(&udp(at, "web.shop.svc.cluster.local.", RecordType::A)),
        ["web.shop.svc.cluster.local. 5 IN A 10.96.0.20"]
    );
    assert_eq!(
        shown(&tcp(at, "web.shop.svc.cluster.local.", RecordType::A).await),
        ["web.shop.svc.cluster.local. 5 IN A 10.96.0.20"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t20_an_update_is_seen_by_the_next_query() {
    let upstream = FakeUpstream::start([192, 0, 2, 10]).await;
    let (dns, server) = cluster(upstream.addr);
    let at = server.udp_addrs()[0];
    assert_eq!(udp(at, "new.shop.svc.cluster.local.", RecordType::A).response_code, ResponseCode::NXDomain);
    dns.apply_service(&service("shop", "new", serde_json::json!({"clusterIP": "10.96.0.99"}))).unwrap();
    assert_eq!(
        shown(&udp(at, "new.shop.svc.cluster.local.", RecordType::A)),
        ["new.shop.svc.cluster.local. 5 IN A 10.96.0.99"]
    );
    dns.apply_slice(&slice(
        "shop",
        "db-1",
        "db",
        serde_json::json!([{"addresses": ["10.244.9.9"]}]),
        serde_json::json!([]),
    ))
    .unwrap();
    assert_eq!(
        shown(&udp(at, "db.shop.svc.cluster.local.", RecordType::A)),
        ["db.shop.svc.cluster.local. 5 IN A 10.244.9.9"]
    );
    dns.delete_service("shop", "new");
    assert_eq!(udp(at, "new.shop.svc.cluster.local.", RecordType::A).response_code, ResponseCode::NXDomain);
    // Stopping frees the port.
    server.shutdown();
    let rebound = UdpSocket::bind(at);
    assert!(rebound.is_ok(), "the port is free once the server is shut down: {rebound:?}");
}

/// The node (127.0.0.1 here) and the Pod range get recursion; 127.0.0.2 is anyone else.
fn node_and_pods() -> Vec<ipnet::IpNet> {
    vec!["127.0.0.1/32".parse().unwrap(), "10.244.0.0/16".parse().unwrap()]
}

const NODE: Ipv4Addr = Ipv4Addr::LOCALHOST;
const OUTSIDE: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

fn udp_from(source: Ipv4Addr, at: SocketAddr, name: &str, qtype: RecordType, edns: bool) -> (Message, usize, usize) {
    let q = query_message(name, qtype, edns);
    let packet = q.to_vec().unwrap();
    let (reply, len) = udp_exchange_from(source, at, &packet, q.id).unwrap_or_else(|| panic!("no answer to {name}"));
    (reply, packet.len(), len)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t20_recursion_is_refused_outside_the_pods_and_the_node() {
    let upstream = FakeUpstream::start([192, 0, 2, 10]).await;
    let (_dns, server) = cluster_serving(upstream.addr, node_and_pods());
    let at = server.udp_addrs()[0];
    // Anyone else: REFUSED for outside names, over UDP and TCP, and nothing reaches the upstream.
    let (r, _, _) = udp_from(OUTSIDE, at, "www.example.com.", RecordType::A, true);
    assert_eq!((r.response_code, r.recursion_available, r.answers.len()), (ResponseCode::Refused, false, 0));
    let r = tcp_from(OUTSIDE, at, "www.example.com.", RecordType::A).await;
    assert_eq!(r.response_code, ResponseCode::Refused);
    let (r, _, _) = udp_from(OUTSIDE, at, "9.2.0.192.in-addr.arpa.", RecordType::PTR, false);
    assert_eq!(r.response_code, ResponseCode::Refused, "reverse names outside the cluster's ranges");
    // ... but cluster names, reverse ones of the Service and Pod ranges included.
    let (r, _, _) = udp_from(OUTSIDE, at, "web.shop.svc.cluster.local.", RecordType::A, true);
    assert_eq!(shown(&r), ["web.shop.svc.cluster.local. 5 IN A 10.96.0.20"]);
    let (r, _, _) = udp_from(OUTSIDE, at, "20.0.96.10.in-addr.arpa.", RecordType::PTR, false);
    assert_eq!(shown(&r), ["20.0.96.10.in-addr.arpa. 5 IN PTR web.shop.svc.cluster.local."]);
    let (r, _, _) = udp_from(OUTSIDE, at, "6.2.244.10.in-addr.arpa.", RecordType::PTR, false);
    assert_eq!(shown(&r), ["6.2.244.10.in-addr.arpa. 5 IN PTR db-1.db.shop.svc.cluster.local."]);
    let (r, _, _) = udp_from(OUTSIDE, at, "nope.shop.svc.cluster.local.", RecordType::A, false);
    assert_eq!(r.response_code, ResponseCode::NXDomain);
    // An ExternalName's CNAME, without its outside target.
    let r = tcp_from(OUTSIDE, at, "ext.shop.svc.cluster.local.", RecordType::A).await;
    assert_eq!(
        (r.response_code, shown(&r)),
        (ResponseCode::NoError, vec!["ext.shop.svc.cluster.local. 5 IN CNAME www.example.com.".to_string()])
    );
    assert!(upstream.seen().is_empty(), "nothing was forwarded for anyone else: {:?}", upstream.seen());
    // The node gets everything, forwarded.
    let (r, _, _) = udp_from(NODE, at, "www.example.com.", RecordType::A, true);
    assert_eq!((shown(&r), r.recursion_available), (vec!["www.example.com. 60 IN A 192.0.2.10".to_string()], true));
    assert_eq!(upstream.seen(), ["www.example.com. udp"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t20_answers_to_anyone_else_amplify_at_most_three_times() {
    let upstream = FakeUpstream::start([192, 0, 2, 10]).await;
    let (dns, server) = cluster_serving(upstream.addr, node_and_pods());
    // 60 endpoints: an answer of about 1,000 bytes, which fits in one UDP datagram.
    let endpoints: Vec<_> = (1..=60).map(|i| serde_json::json!({"addresses": [format!("10.244.4.{i}")]})).collect();
    dns.apply_service(&service("shop", "some", serde_json::json!({"clusterIP": "None"}))).unwrap();
    dns.apply_slice(&slice("shop", "some-1", "some", serde_json::Value::Array(endpoints), serde_json::json!([])))
        .unwrap();
    let at = server.udp_addrs()[0];
    let queries: &[(&str, RecordType)] = &[
        ("x.cluster.local.", RecordType::A),
        ("web.shop.svc.cluster.local.", RecordType::A),
        ("nope.shop.svc.cluster.local.", RecordType::A),
        ("web.shop.svc.cluster.local.", RecordType::AAAA),
        ("_pg._tcp.db.shop.svc.cluster.local.", RecordType::SRV),
        ("some.shop.svc.cluster.local.", RecordType::A),
        ("many.shop.svc.cluster.local.", RecordType::A),
        ("20.0.96.10.in-addr.arpa.", RecordType::PTR),
        ("dns-version.cluster.local.", RecordType::TXT),
        ("ext.shop.svc.cluster.local.", RecordType::A),
        ("www.example.com.", RecordType::A),
        ("a.", RecordType::A),
    ];
    println!("| Query | EDNS | the node: bytes out / in | ratio | anyone else: bytes out / in | ratio | rcode |");
    println!("|---|---|---|---|---|---|---|");
    let mut worst = 0f64;
    for (name, qtype) in queries {
        for edns in [false, true] {
            let (_, node_in, node_out) = udp_from(NODE, at, name, *qtype, edns);
            let (r, sent, got) = udp_from(OUTSIDE, at, name, *qtype, edns);
            let ratio = got as f64 / sent as f64;
            worst = worst.max(ratio);
            println!(
                "| {name} {qtype} | {edns} | {node_out} / {node_in} | {:.2} | {got} / {sent} | {ratio:.2} | {}{} |",
                node_out as f64 / node_in as f64,
                r.response_code,
                if r.truncation { ", TC" } else { "" }
            );
        }
    }
    println!("worst ratio for anyone else: {worst:.2}");
    assert!(worst <= 3.0, "an answer to anyone else was {worst:.2} times its query");
}
