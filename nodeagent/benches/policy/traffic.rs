//! `--packet-rate`: what the policy table costs traffic. A client namespace reaches a Pod
//! namespace through a node namespace (veth, bridge: the forward hook, as between nodes); a
//! tiny HTTP server in the Pod answers `hey` (a new connection per request: each SYN is a
//! policy lookup) and `wrk` (keep-alive: only conntrack's established check). Measured with no
//! table, with the whole world's table (the Pod selected by ten of its policies and allowed
//! from the client by one more), and with no table again.

use gitplane_nodeagent::network::policy::{CompiledPolicy, Policier, PolicyPod, desired::TCP};
use gitplane_testkit::topology::{Outcome, Topology, connect, in_netns};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use serde_json::json;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

const PORT: u16 = 80;

/// A tiny HTTP/1.1 server on port 80 of a namespace: a thread per connection, keep-alive
/// unless the request says `Connection: close`. Stops on drop.
struct Server {
    ns: String,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

fn enter(ns: &str) {
    let file = std::fs::File::open(format!("/run/netns/{ns}")).expect("opening the namespace");
    // SAFETY: setns on a valid namespace fd changes only this thread's network namespace.
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns {ns}: {}", std::io::Error::last_os_error());
}

impl Server {
    fn start(ns: &str) -> Server {
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (flag, name) = (stop.clone(), ns.to_owned());
        let thread = std::thread::spawn(move || {
            enter(&name);
            let listener = TcpListener::bind(("0.0.0.0", PORT)).expect("binding the server");
            ready_tx.send(()).expect("the bench waits");
            for conn in listener.incoming() {
                if flag.load(Ordering::Relaxed) {
                    break;
                }
                if let Ok(conn) = conn {
                    std::thread::spawn(move || answer(conn));
                }
            }
        });
        ready_rx.recv_timeout(Duration::from_secs(10)).expect("the server did not start");
        Server { ns: ns.to_owned(), stop, thread: Some(thread) }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // One more connection wakes the accept loop up to see `stop`.
        in_netns(&self.ns, || TcpStream::connect(("127.0.0.1", PORT)).ok());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Answers each request of one connection with `ok`.
fn answer(mut conn: TcpStream) {
    let _ = conn.set_nodelay(true);
    let mut buf = [0u8; 4096];
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let n = match conn.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        pending.extend_from_slice(&buf[..n]);
        while let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&pending[..end]).to_ascii_lowercase();
            let close = head.contains("connection: close");
            pending.drain(..end + 4);
            let response: &[u8] = if close {
                b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n"
            } else {
                b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n"
            };
            if conn.write_all(response).is_err() || close {
                return;
            }
        }
    }
}

/// Runs a load generator in the client namespace; its `Requests/sec` and whether it saw
/// errors or non-2xx answers.
fn load(client: &str, args: &[&str]) -> (f64, bool) {
    let out = Command::new("ip")
        .args(["netns", "exec", client])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", args[0]));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{} failed: {text}{}", args[0], String::from_utf8_lossy(&out.stderr));
    let rate = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Requests/sec:"))
        .and_then(|r| r.trim().parse().ok())
        .unwrap_or_else(|| panic!("no Requests/sec from {}: {text}", args[0]));
    let errors = ["Error distribution", "Non-2xx", "Socket errors"].iter().any(|e| text.contains(e));
    (rate, errors)
}

/// New connections/s (hey, no keep-alive) and requests/s over kept-alive connections (wrk).
fn measure(client: &str, seconds: u64) -> [(f64, bool); 2] {
    let url = format!("http://{}:{PORT}/", Topology::pod_ip(1));
    let duration = format!("{seconds}s");
    [
        load(client, &["hey", "-z", &duration, "-c", "16", "-t", "5", "-disable-keepalive", &url]),
        load(client, &["wrk", "-t", "1", "-c", "16", "-d", &duration, &url]),
    ]
}

/// The Pod the server stands for, like the world's Pod 0 (selected by ten policies), and the
/// policy that lets the client reach it on port 80.
fn server_pod_and_policy() -> (PolicyPod, CompiledPolicy) {
    let pod = PolicyPod {
        namespace: "ns-0".into(),
        name: "bench-server".into(),
        labels: [("app".to_string(), "app-0".to_string()), ("tier".to_string(), "t0".to_string())].into(),
        node: crate::NODE.into(),
        ip: Topology::pod_ip(1),
        ports: vec![("http".into(), TCP, 8080)],
    };
    let policy: NetworkPolicy = serde_json::from_value(json!({
        "metadata": {"name": "allow-bench-client", "namespace": "ns-0"},
        "spec": {"podSelector": {"matchLabels": {"app": "app-0"}}, "ingress": [{
            "from": [{"ipBlock": {"cidr": "192.168.50.0/24"}}], "ports": [{"port": PORT}]}]}
    }))
    .expect("a NetworkPolicy");
    (pod, CompiledPolicy::new(&policy))
}

fn cell((rate, errors): (f64, bool), base: Option<f64>) -> String {
    let mut s = format!("{rate:.0}/s");
    if let Some(base) = base {
        s.push_str(&format!(" ({:+.1}%)", (rate / base - 1.0) * 100.0));
    }
    if errors {
        s.push_str(" (errors)");
    }
    s
}

pub fn run(mut policier: Policier, seconds: u64) {
    let topo = Topology::new(1);
    in_netns(&topo.client, || {
        // Many short connections: room for them in the client's port range.
        for (key, value) in [("net/ipv4/ip_local_port_range", "1024 65535"), ("net/ipv4/tcp_tw_reuse", "1")] {
            std::fs::write(format!("/proc/sys/{key}"), value).unwrap_or_else(|e| panic!("{key}: {e}"));
        }
    });
    // The client reaches Pods through the node, as another node's traffic does.
    let route = ["-n", &topo.client, "route", "add", "10.244.0.0/16", "via", "192.168.50.2"];
    assert!(Command::new("ip").args(route).status().is_ok_and(|s| s.success()), "ip {route:?}");
    let server = Server::start(topo.pod(1));
    let before = measure(&topo.client, seconds);

    let (pod, policy) = server_pod_and_policy();
    policier.policies.set_pod(pod.key(), Some(pod));
    policier.policies.set_policy(("ns-0".into(), "allow-bench-client".into()), Some(policy));
    let report = in_netns(&topo.node, || policier.sync()).expect("full sync");
    // The table is in force: the Pod's port 8080 (the topology's own listener) is not allowed.
    let denied = SocketAddr::from((Topology::pod_ip(1), 8080));
    assert_eq!(in_netns(&topo.client, || connect(denied)), Outcome::TimedOut, "port 8080 must be denied");
    let with = measure(&topo.client, seconds);

    in_netns(&topo.node, || policier.remove_rules()).expect("removing the table");
    let after = measure(&topo.client, seconds);
    drop(server);
    drop(topo);

    println!(
        "\n| packet rate, {seconds} s each; table: {} elements over {} Pods | no table | the table | no table again |",
        report.elements, report.pods
    );
    println!("|---|---|---|---|");
    let what = ["new connections/s (hey -c 16, no keep-alive)", "requests/s on kept-alive connections (wrk -c 16)"];
    for (i, what) in what.iter().enumerate() {
        let base = (before[i].0 + after[i].0) / 2.0;
        println!("| {what} | {} | {} | {} |", cell(before[i], None), cell(with[i], Some(base)), cell(after[i], None));
    }
}
