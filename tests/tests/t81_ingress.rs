//! The seed's walkthrough through the front door, on `gitplane up --nodes 2`: a Deployment of
//! busybox httpd, its Service and an Ingress for `shop.example` pushed to Git; curl from a client
//! namespace (the bridge's, which is no node) with `--resolve shop.example:80:<node address>`
//! reaches the Pod through the other node's Ingress controller (its Service's port has no name,
//! as most published ones); a second Service by path and port name; the
//! Ingress's status lists both node addresses; HTTPS with a certificate and Secret the test
//! makes (openssl), checked with `curl --cacert`; bad input (an Ingress naming a missing Service
//! and a TLS Secret with a broken certificate) gives Warning Events on that Ingress while
//! shop.example keeps answering over HTTP and HTTPS; and a route change pushed while a load
//! generator runs gives zero non-2xx answers. All traffic stays in namespaces `gitplane up` made.

use anyhow::{Context, Result, bail, ensure};
use gitplane_e2e::{LocalCluster, Worktree, require_root, wait_for};
use std::{
    io::{Read, Write},
    net::{Ipv4Addr, SocketAddr, TcpStream},
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

const DEADLINE: Duration = Duration::from_secs(120);

/// An httpd Deployment answering `<name> <pod>` at `/` and (for path routing) at `/<name>/`, its
/// Pod's name at /cgi-bin/host, and a Service `name` on port 80 in front of it. Only `api`'s
/// port has a name: most published single-port Services, the seed's own among them, have none.
fn app(name: &str) -> String {
    let port = if name == "api" {
        "- name: http\n      port: 80\n      targetPort: http"
    } else {
        "- port: 80\n      targetPort: 8080"
    };
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: {name}
spec:
  replicas: 1
  selector:
    matchLabels:
      app: {name}
  template:
    metadata:
      labels:
        app: {name}
    spec:
      terminationGracePeriodSeconds: 2
      containers:
        - name: httpd
          image: gitplane.local/httpd:1
          command:
            - /bin/busybox
            - sh
            - -c
            - |
              /bin/busybox mkdir -p /www/cgi-bin /www/{name}
              echo "{name} $(/bin/busybox hostname)" > /www/index.html
              echo "{name} $(/bin/busybox hostname)" > /www/{name}/index.html
              /bin/busybox printf '#!/bin/sh\necho Content-Type: text/plain\necho\n/bin/busybox hostname\n' > /www/cgi-bin/host
              /bin/busybox chmod 755 /www/cgi-bin/host
              trap 'kill $pid; exit 0' TERM INT
              /bin/busybox httpd -f -p 8080 -h /www & pid=$!
              wait $pid
          ports:
            - name: http
              containerPort: 8080
          readinessProbe:
            tcpSocket:
              port: http
            periodSeconds: 1
---
apiVersion: v1
kind: Service
metadata:
  name: {name}
spec:
  selector:
    app: {name}
  ports:
    {port}
"#
    )
}

/// The shop's Ingress: `/` to `root` (by port number), `/api` to the api Service (by port
/// name), and TLS from `shop-tls` when `tls`.
fn shop_ingress(root: &str, tls: bool) -> String {
    let tls = if tls { "  tls:\n    - hosts: [shop.example]\n      secretName: shop-tls\n" } else { "" };
    format!(
        r#"apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: shop
spec:
{tls}  rules:
    - host: shop.example
      http:
        paths:
          - path: /
            pathType: Prefix
            backend:
              service:
                name: {root}
                port:
                  number: 80
          - path: /api
            pathType: Prefix
            backend:
              service:
                name: api
                port:
                  name: http
"#
    )
}

/// An Ingress whose Service does not exist and whose TLS Secret holds no certificate.
const BROKEN: &str = r#"apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: broken
spec:
  tls:
    - hosts: [broken.example]
      secretName: broken-tls
  rules:
    - host: broken.example
      http:
        paths:
          - path: /
            pathType: Prefix
            backend:
              service:
                name: nosuch
                port:
                  number: 80
---
apiVersion: v1
kind: Secret
metadata:
  name: broken-tls
type: kubernetes.io/tls
stringData:
  tls.crt: "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n"
  tls.key: "-----BEGIN PRIVATE KEY-----\nbm90IGEga2V5\n-----END PRIVATE KEY-----\n"
"#;

fn tls_secret(crt: &str, key: &str) -> String {
    let indent = |pem: &str| pem.lines().map(|l| format!("    {l}\n")).collect::<String>();
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: shop-tls\ntype: kubernetes.io/tls\nstringData:\n  \
         tls.crt: |\n{}  tls.key: |\n{}",
        indent(crt),
        indent(key)
    )
}

/// curl from the client namespace; its stdout, or why it failed (status >= 400 included).
fn curl(netns: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new("ip")
        .args(["netns", "exec"])
        .arg(netns.file_name().context("netns name")?)
        .args(["curl", "-sS", "--fail", "--max-time", "5"])
        .args(args)
        .output()?;
    if !out.status.success() {
        bail!("curl {args:?}: {} {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn node_ip(cluster: &LocalCluster, node: &str) -> Result<Ipv4Addr> {
    let node = cluster.get(&format!("/api/v1/nodes/{node}"))?;
    node["status"]["addresses"]
        .as_array()
        .and_then(|a| a.iter().find(|a| a["type"] == "InternalIP"))
        .and_then(|a| a["address"].as_str()?.parse().ok())
        .context("the node's InternalIP")
}

/// Waits until `probe` answers something containing `wanted`.
fn until_answers(what: &str, wanted: &str, probe: impl Fn() -> Result<String>) -> Result<String> {
    tokio::task::block_in_place(|| wait_for(DEADLINE, || probe().ok().filter(|out| out.contains(wanted))))
        .with_context(|| format!("{what} never answered {wanted:?}; last: {:?}", probe()))
}

/// What the log says of Ingresses, for a failure's message.
fn ingress_log(cluster: &LocalCluster) -> String {
    let mut log = cluster.log_text();
    for node in &cluster.nodes {
        let agent = cluster.data_dir.join("nodes").join(node).join("agent.log");
        log.push_str(&std::fs::read_to_string(agent).unwrap_or_default());
    }
    let lines: Vec<&str> =
        log.lines().filter(|l| l.to_lowercase().contains("ingress") || l.contains("panicked")).collect();
    lines.join("\n")
}

/// Warning Events on Ingress `name`: (reason, message).
fn warnings(cluster: &LocalCluster, name: &str) -> Result<Vec<(String, String)>> {
    let events = cluster.get("/api/v1/namespaces/default/events")?;
    Ok(events["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["involvedObject"]["kind"] == "Ingress" && e["involvedObject"]["name"] == name)
        .filter(|e| e["type"] == "Warning")
        .map(|e| (e["reason"].as_str().unwrap_or("").to_owned(), e["message"].as_str().unwrap_or("").to_owned()))
        .collect())
}

/// A load generator in the client namespace: threads sending `GET /` for shop.example to the
/// ingress, each on its own connection, counting 2xx answers and anything else.
struct Load {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    last_failure: Arc<std::sync::Mutex<String>>,
    bodies: Arc<std::sync::Mutex<std::collections::BTreeSet<String>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start(netns: PathBuf, addr: SocketAddr, threads: usize) -> Load {
        let mut load = Load {
            stop: Arc::default(),
            ok: Arc::default(),
            failed: Arc::default(),
            last_failure: Arc::default(),
            bodies: Arc::default(),
            threads: Vec::new(),
        };
        load.threads = (0..threads)
            .map(|_| {
                let (stop, ok, failed) = (load.stop.clone(), load.ok.clone(), load.failed.clone());
                let (last_failure, bodies, netns) = (load.last_failure.clone(), load.bodies.clone(), netns.clone());
                std::thread::spawn(move || {
                    let Ok(file) = std::fs::File::open(&netns) else { return };
                    // SAFETY: setns on an open netns fd; it only affects this thread.
                    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                        *last_failure.lock().unwrap() = format!("setns: {}", std::io::Error::last_os_error());
                        failed.fetch_add(1, Ordering::Relaxed);
                        return;
                    }
                    while !stop.load(Ordering::Relaxed) {
                        match get(addr) {
                            Ok((200..=299, body)) => {
                                ok.fetch_add(1, Ordering::Relaxed);
                                bodies.lock().unwrap().insert(body.split(' ').next().unwrap_or("").to_owned());
                            }
                            Ok((status, body)) => {
                                failed.fetch_add(1, Ordering::Relaxed);
                                *last_failure.lock().unwrap() = format!("{status}: {body}");
                            }
                            Err(e) => {
                                failed.fetch_add(1, Ordering::Relaxed);
                                *last_failure.lock().unwrap() = e.to_string();
                            }
                        }
                    }
                })
            })
            .collect();
        load
    }

    fn finish(mut self) -> (u64, u64, String) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        let last = self.last_failure.lock().unwrap().clone();
        (self.ok.load(Ordering::Relaxed), self.failed.load(Ordering::Relaxed), last)
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// One `GET /` for shop.example: (status, body).
fn get(addr: SocketAddr) -> std::io::Result<(u16, String)> {
    let timeout = Duration::from_secs(10);
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    write!(stream, "GET / HTTP/1.1\r\nHost: shop.example\r\nConnection: close\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let status = response.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.trim().to_owned()).unwrap_or_default();
    Ok((status, body))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t81_ingress_walkthrough() -> Result<()> {
    require_root()?;
    let cluster = tokio::task::block_in_place(|| LocalCluster::up("gp81", 2))?;
    let client = cluster.netns(&format!("{}-net", cluster.base));
    let work_dir = tempfile::tempdir()?;
    let work = Worktree::clone(cluster.demo_repo(), work_dir.path().join("demo"))?;
    work.remove("web.yaml")?;
    work.write("shop.yaml", &format!("{}---\n{}---\n{}", app("front"), app("api"), shop_ingress("front", false)))?;
    work.commit_and_push("shop: front and api behind an Ingress")?;

    let front = tokio::task::block_in_place(|| wait_for(DEADLINE, || cluster.running_pods("app=front").ok()?.pop()))
        .with_context(|| format!("a Running front Pod\n{}", cluster.log_text()))?;
    // The node the Pod does not run on: its Ingress controller sends the request across.
    let other = cluster.nodes.iter().find(|n| **n != front.node).context("a second node")?.clone();
    let ip = node_ip(&cluster, &other)?;
    let resolve = format!("shop.example:80:{ip}");
    let body = until_answers("http://shop.example/cgi-bin/host", &front.name, || {
        curl(&client, &["--resolve", &resolve, "http://shop.example/cgi-bin/host"])
    })
    .with_context(|| ingress_log(&cluster))?;
    println!(
        "http://shop.example/cgi-bin/host through {other} ({ip}) reached {} on {}: {body}",
        front.name, front.node
    );

    // Path routing: /api to the api Service, by its port's name.
    let api = until_answers("http://shop.example/api/", "api ", || {
        curl(&client, &["--resolve", &resolve, "http://shop.example/api/"])
    })?;
    println!("/api/ answered {api:?}");
    ensure!(curl(&client, &["--resolve", &resolve, "http://shop.example/"])?.starts_with("front "), "/ is front's");
    // No rule for another host: 404.
    let other_host = curl(&client, &["--resolve", &format!("other.example:80:{ip}"), "http://other.example/"]);
    ensure!(other_host.as_ref().is_err_and(|e| e.to_string().contains("404")), "other.example: {other_host:?}");

    // The Ingress's status lists both nodes' addresses.
    let mut addresses: Vec<String> = Vec::new();
    for node in &cluster.nodes {
        addresses.push(node_ip(&cluster, node)?.to_string());
    }
    addresses.sort();
    let status = tokio::task::block_in_place(|| {
        wait_for(DEADLINE, || {
            let ingress = cluster.get("/apis/networking.k8s.io/v1/namespaces/default/ingresses/shop").ok()?;
            let mut ips: Vec<String> = ingress["status"]["loadBalancer"]["ingress"]
                .as_array()?
                .iter()
                .filter_map(|i| i["ip"].as_str().map(str::to_owned))
                .collect();
            ips.sort();
            (ips == addresses).then_some(ips)
        })
    })
    .with_context(|| format!("the Ingress status never listed {addresses:?}"))?;
    println!("Ingress shop status: {status:?}");

    // TLS with a certificate made here.
    let tls_dir = tempfile::tempdir()?;
    let (crt, key) = (tls_dir.path().join("tls.crt"), tls_dir.path().join("tls.key"));
    let made = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=shop.example"])
        .args(["-addext", "subjectAltName=DNS:shop.example", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&crt)
        .output()?;
    ensure!(made.status.success(), "openssl: {}", String::from_utf8_lossy(&made.stderr));
    let secret = tls_secret(&std::fs::read_to_string(&crt)?, &std::fs::read_to_string(&key)?);
    work.write("shop-tls.yaml", &secret)?;
    work.write("shop.yaml", &format!("{}---\n{}---\n{}", app("front"), app("api"), shop_ingress("front", true)))?;
    work.commit_and_push("shop: HTTPS")?;
    let resolve_tls = format!("shop.example:443:{ip}");
    let cacert = crt.to_str().context("path")?.to_owned();
    let https =
        || curl(&client, &["--cacert", &cacert, "--resolve", &resolve_tls, "https://shop.example/cgi-bin/host"]);
    until_answers("https://shop.example/cgi-bin/host", &front.name, https)?;
    println!("https://shop.example answered with the test's certificate");

    // Bad input: a missing Service and a broken certificate, each a Warning Event on the Ingress.
    work.write("broken.yaml", BROKEN)?;
    work.commit_and_push("an Ingress with a missing Service and a broken TLS Secret")?;
    let found = tokio::task::block_in_place(|| {
        wait_for(DEADLINE, || {
            let w = warnings(&cluster, "broken").ok()?;
            let has = |reason: &str, text: &str| w.iter().any(|(r, m)| r == reason && m.contains(text));
            (has("ServiceNotFound", "default/nosuch") && has("InvalidTLSSecret", "default/broken-tls")).then_some(w)
        })
    })
    .with_context(|| format!("no Warning Events on Ingress broken: {:?}", warnings(&cluster, "broken")))?;
    println!("Events on Ingress broken: {found:?}");
    let broken = curl(&client, &["--resolve", &format!("broken.example:80:{ip}"), "http://broken.example/"]);
    ensure!(broken.as_ref().is_err_and(|e| e.to_string().contains("503")), "broken.example: {broken:?}");
    ensure!(https()?.contains(&front.name), "HTTPS for shop.example must keep working");
    ensure!(
        curl(&client, &["--resolve", &resolve, "http://shop.example/cgi-bin/host"])?.contains(&front.name),
        "HTTP for shop.example must keep working"
    );

    // A route change under load: / moves from front to api; no request may fail meanwhile.
    let load = Load::start(client.clone(), SocketAddr::from((ip, 80)), 4);
    // Answers before the change too, so the load spans it.
    tokio::task::block_in_place(|| wait_for(DEADLINE, || (load.ok.load(Ordering::Relaxed) >= 20).then_some(())))
        .with_context(|| {
            format!("the load got no answers: {}", load.last_failure.lock().map(|l| l.clone()).unwrap_or_default())
        })?;
    work.write("shop.yaml", &format!("{}---\n{}---\n{}", app("front"), app("api"), shop_ingress("api", true)))?;
    work.commit_and_push("shop: / to api")?;
    let moved = tokio::task::block_in_place(|| {
        wait_for(DEADLINE, || load.bodies.lock().ok().filter(|b| b.contains("api")).map(|b| b.clone()))
    });
    let seen = load.bodies.lock().map(|b| b.clone()).unwrap_or_default();
    let (ok, failed, last) = load.finish();
    println!("under load: {ok} answers 2xx, {failed} not; bodies {seen:?}");
    ensure!(moved.is_some(), "the route change never took effect: {seen:?}");
    ensure!(seen.contains("front"), "the load did not run before the change: {seen:?}");
    ensure!(failed == 0, "{failed} of {} requests failed during the route change; last: {last}", ok + failed);

    let status = tokio::task::block_in_place(|| cluster.stop(DEADLINE))?;
    ensure!(status.success(), "gitplane up --nodes exited with {status}");
    Ok(())
}
