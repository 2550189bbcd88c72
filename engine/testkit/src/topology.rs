//! Network-namespace topologies for the proxy's root tests and benchmarks, with no containerd
//! and no agent: Pods are bare namespaces with a TCP listener. Everything lives in namespaces
//! made here and removed on drop (even when the test panics); nothing touches the host's own.
//!
//! ```text
//!  client ns 192.168.50.10 ──veth── node ns 192.168.50.2 (node address, NodePorts)
//!                                       │ bridge 10.244.1.1/24, hairpin on every port
//!                          pod ns 10.244.1.11, .12, ... (one TCP listener each, on :8080)
//! ```

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

pub const NODE_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 50, 2);
pub const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 50, 10);
pub const BACKEND_PORT: u16 = 8080;

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("running ip");
    assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

/// Runs `f` on a thread that has entered namespace `ns`; children it spawns live there too.
pub fn in_netns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            enter(ns);
            f()
        })
        .join()
        .expect("thread in namespace panicked")
    })
}

fn enter(ns: &str) {
    let file = std::fs::File::open(format!("/run/netns/{ns}")).expect("opening the namespace");
    // SAFETY: setns on a valid namespace fd changes only this thread's network namespace.
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns {ns}: {}", std::io::Error::last_os_error());
}

/// A TCP server in a Pod's namespace that answers each connection with the Pod's name.
struct Backend {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(ns: String, name: String) -> Backend {
    let stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let flag = stop.clone();
    let thread = std::thread::spawn(move || {
        enter(&ns);
        let listener = TcpListener::bind(("0.0.0.0", BACKEND_PORT)).expect("binding the backend");
        listener.set_nonblocking(true).unwrap();
        ready_tx.send(()).unwrap();
        while !flag.load(Ordering::Relaxed) {
            match listener.accept() {
                Ok((mut conn, peer)) => {
                    let _ = conn.set_nonblocking(false);
                    let _ = conn.write_all(format!("{name} {}\n", peer.ip()).as_bytes());
                }
                // Polling is how this thread notices `stop`; connections wait in the backlog.
                Err(_) => std::thread::sleep(Duration::from_millis(2)),
            }
        }
    });
    ready_rx.recv_timeout(Duration::from_secs(10)).expect("backend did not start");
    Backend { stop, thread: Some(thread) }
}

/// How one connection attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The backend's name and the source address it saw.
    Answered {
        backend: String,
        seen_source: String,
    },
    Refused,
    TimedOut,
    Other(String),
}

/// One connection from the current namespace to `addr`, with a short time-out.
pub fn connect(addr: SocketAddr) -> Outcome {
    match TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
        Ok(mut s) => {
            let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
            let mut buf = String::new();
            match s.read_to_string(&mut buf) {
                Ok(_) => {
                    let mut parts = buf.split_whitespace();
                    Outcome::Answered {
                        backend: parts.next().unwrap_or_default().to_owned(),
                        seen_source: parts.next().unwrap_or_default().to_owned(),
                    }
                }
                Err(e) => Outcome::Other(e.to_string()),
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Outcome::Refused,
        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => Outcome::TimedOut,
        Err(e) => Outcome::Other(e.to_string()),
    }
}

static COUNTER: AtomicUsize = AtomicUsize::new(0);

/// A node namespace with Pods on a bridge and an external client; removed on drop.
pub struct Topology {
    pub node: String,
    pub client: String,
    pods: Vec<String>,
    backends: Vec<Backend>,
}

impl Topology {
    /// `pods` Pods named `pod-1`.. at 10.244.1.11.., each serving on :8080.
    pub fn new(pods: usize) -> Topology {
        let id = format!("gpt{}x{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed));
        let mut t = Topology {
            node: format!("{id}-node"),
            client: format!("{id}-client"),
            pods: Vec::new(),
            backends: Vec::new(),
        };
        ip(&["netns", "add", &t.node]);
        ip(&["netns", "add", &t.client]);
        let n = t.node.clone();
        ip(&["-n", &n, "link", "set", "lo", "up"]);
        ip(&["-n", &n, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &n, "addr", "add", "10.244.1.1/24", "dev", "br0"]);
        ip(&["-n", &n, "link", "set", "br0", "up"]);
        ip(&["-n", &n, "link", "add", "ext0", "type", "veth", "peer", "name", "eth0", "netns", &t.client]);
        ip(&["-n", &n, "addr", "add", &format!("{NODE_IP}/24"), "dev", "ext0"]);
        ip(&["-n", &n, "link", "set", "ext0", "up"]);
        // A default route makes unmatched Service traffic reach the forward hook, as on a real node.
        ip(&["-n", &n, "route", "add", "default", "via", &CLIENT_IP.to_string()]);
        ip(&["-n", &t.client, "link", "set", "lo", "up"]);
        ip(&["-n", &t.client, "addr", "add", &format!("{CLIENT_IP}/24"), "dev", "eth0"]);
        ip(&["-n", &t.client, "link", "set", "eth0", "up"]);
        in_netns(&n, || {
            for (key, value) in [("net/ipv4/ip_forward", "1"), ("net/bridge/bridge-nf-call-iptables", "1")] {
                std::fs::write(format!("/proc/sys/{key}"), value).unwrap_or_else(|e| panic!("{key}: {e}"));
            }
        });
        for i in 1..=pods {
            t.add_pod(i);
        }
        t
    }

    pub fn pod_ip(i: usize) -> Ipv4Addr {
        Ipv4Addr::new(10, 244, 1, 10 + i as u8)
    }

    /// The namespace of Pod `i` (from 1).
    pub fn pod(&self, i: usize) -> &str {
        &self.pods[i - 1]
    }

    fn add_pod(&mut self, i: usize) {
        let ns = format!("{}-p{i}", self.node.trim_end_matches("-node"));
        ip(&["netns", "add", &ns]);
        self.pods.push(ns.clone());
        let n = self.node.clone();
        let port = format!("v{i}");
        ip(&["-n", &n, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", &ns]);
        ip(&["-n", &n, "link", "set", &port, "master", "br0"]);
        ip(&["-n", &n, "link", "set", &port, "type", "bridge_slave", "hairpin", "on"]);
        ip(&["-n", &n, "link", "set", &port, "up"]);
        ip(&["-n", &ns, "link", "set", "lo", "up"]);
        ip(&["-n", &ns, "addr", "add", &format!("{}/24", Self::pod_ip(i)), "dev", "eth0"]);
        ip(&["-n", &ns, "link", "set", "eth0", "up"]);
        ip(&["-n", &ns, "route", "add", "default", "via", "10.244.1.1"]);
        self.backends.push(serve(ns, format!("pod-{i}")));
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        self.backends.clear();
        for ns in self.pods.iter().chain([&self.client, &self.node]) {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}
