//! Services across hosts, on `gitplane up --nodes 3`, with each proxy backend: a Pod on one node
//! finds a Service by name through cluster DNS on its own node, and its requests to the
//! ClusterIP reach the Service's Pods on all three nodes; a NodePort answers on another node's
//! address; a Service without endpoints refuses at once instead of timing out; after a scale-down
//! pushed to Git, traffic goes only to the Pod that is left. With nftables also: what cluster DNS
//! answers (headless Services, SRV, ExternalName, pod records, other names through the node's
//! upstream and a stub domain from the kube-dns ConfigMap, both fake servers this test runs in
//! the bridge's namespace), and commits with a bad clusterIP or a taken nodePort rejected with
//! file and path while the last good commit stays served. All traffic stays in namespaces
//! `gitplane up` made.

use anyhow::{Context, Result, ensure};
use gitplane_e2e::{LocalCluster, RunningPod, Worktree, require_root, wait_for};
use std::{
    collections::BTreeSet,
    net::{Ipv4Addr, SocketAddr, UdpSocket},
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

const DEADLINE: Duration = Duration::from_secs(120);

/// busybox httpd answering its Pod's name at /cgi-bin/host, on a named port; a Service in front
/// of it by that name, a NodePort Service, and a Service whose selector matches nothing.
fn manifests(replicas: u32) -> String {
    format!("{}{DNS_CASES}", workload(replicas))
}

/// Services only DNS answers for, and the kube-dns ConfigMap: names under `corp.test` go to
/// the stub server, any other name outside the cluster to the upstream one (fake servers in the
/// bridge's namespace, see [`FakeDns`]).
const DNS_CASES: &str = r#"---
apiVersion: v1
kind: Service
metadata:
  name: whoami-headless
spec:
  clusterIP: None
  selector:
    app: whoami
  ports:
    - name: http
      port: 8080
---
apiVersion: v1
kind: Service
metadata:
  name: docs
spec:
  type: ExternalName
  externalName: docs.corp.test
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: kube-dns
  namespace: kube-system
data:
  stubDomains: '{"corp.test": ["172.29.0.1:5353"]}'
  upstreamNameservers: '["172.29.0.1:5354"]'
"#;

fn workload(replicas: u32) -> String {
    format!(
        r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: whoami
spec:
  replicas: {replicas}
  selector:
    matchLabels:
      app: whoami
  template:
    metadata:
      labels:
        app: whoami
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
              /bin/busybox mkdir -p /www/cgi-bin
              /bin/busybox printf '#!/bin/sh\necho Content-Type: text/plain\necho\n/bin/busybox hostname\n' > /www/cgi-bin/host
              /bin/busybox chmod 755 /www/cgi-bin/host
              trap 'kill $pid; exit 0' TERM INT
              /bin/busybox httpd -f -p 8080 -h /www & pid=$!
              wait $pid
          ports:
            - name: http
              containerPort: 8080
          resources:
            requests:
              cpu: 500m
              memory: 16Mi
---
apiVersion: v1
kind: Service
metadata:
  name: whoami
spec:
  selector:
    app: whoami
  ports:
    - name: http
      port: 80
      targetPort: http
---
apiVersion: v1
kind: Service
metadata:
  name: whoami-nodeport
spec:
  type: NodePort
  selector:
    app: whoami
  ports:
    - port: 80
      targetPort: http
      nodePort: 30080
---
apiVersion: v1
kind: Service
metadata:
  name: nobody
spec:
  selector:
    app: nobody
  ports:
    - port: 80
"#
    )
}

/// Two tiny authoritative-for-everything DNS servers on the bridge's address (172.29.0.1) in
/// the bridge's network namespace: port 5353 answers every A query with [`STUB_ANSWER`], port
/// 5354 with [`UPSTREAM_ANSWER`]. Stopped on drop.
struct FakeDns {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

const STUB_ANSWER: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 7);
const UPSTREAM_ANSWER: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 8);

impl FakeDns {
    fn start(cluster: &LocalCluster) -> Result<FakeDns> {
        let netns = Path::new("/run/netns").join(format!("{}-net", cluster.base));
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for (port, answer) in [(5353, STUB_ANSWER), (5354, UPSTREAM_ANSWER)] {
            let socket = gitplane_kubelet::netns::in_netns(&netns, || UdpSocket::bind(("172.29.0.1", port)))?;
            socket.set_read_timeout(Some(Duration::from_millis(200)))?;
            let stop = stop.clone();
            threads.push(std::thread::spawn(move || {
                let mut buf = [0u8; 1500];
                while !stop.load(Ordering::Relaxed) {
                    if let Ok((n, from)) = socket.recv_from(&mut buf)
                        && let Some(reply) = answer_a(&buf[..n], answer)
                    {
                        let _ = socket.send_to(&reply, from);
                    }
                }
            }));
        }
        Ok(FakeDns { stop, threads })
    }
}

impl Drop for FakeDns {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// A reply to a one-question query: `address` for an A question, no answer for any other type.
fn answer_a(query: &[u8], address: Ipv4Addr) -> Option<Vec<u8>> {
    let mut end = 12;
    while *query.get(end)? != 0 {
        end += 1 + usize::from(query[end]);
    }
    let question_end = end + 5;
    let qtype = u16::from_be_bytes([*query.get(end + 1)?, *query.get(end + 2)?]);
    let answers: u16 = if qtype == 1 { 1 } else { 0 };
    let mut reply = Vec::from(&query[..2]);
    reply.extend_from_slice(&[0x81, 0x80, 0, 1]);
    reply.extend_from_slice(&answers.to_be_bytes());
    reply.extend_from_slice(&[0, 0, 0, 0]);
    reply.extend_from_slice(query.get(12..question_end)?);
    if qtype == 1 {
        reply.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4]);
        reply.extend_from_slice(&address.octets());
    }
    Some(reply)
}

/// What cluster DNS answers a Pod, through busybox's nslookup (the Pod's own resolv.conf).
fn dns_cases(cluster: &LocalCluster, client: &RunningPod, running: &[RunningPod]) -> Result<()> {
    let nslookup = |args: &[&str]| {
        let mut cmd = vec!["/bin/busybox", "nslookup"];
        cmd.extend_from_slice(args);
        cluster.exec(&client.node, &client.container, &cmd)
    };
    let expect = |args: &[&str], wanted: &[String]| -> Result<()> {
        let out = tokio::task::block_in_place(|| {
            wait_for(DEADLINE, || nslookup(args).ok().filter(|out| wanted.iter().all(|w| out.contains(w.as_str()))))
        });
        out.map(drop).with_context(|| format!("nslookup {args:?} should show {wanted:?}: {:?}", nslookup(args)))
    };
    // A headless Service: an A record per ready endpoint.
    let ips: Vec<String> = running.iter().map(|p| p.ip.to_string()).collect();
    expect(&["whoami-headless.default.svc.cluster.local"], &ips)?;
    // SRV for the named port.
    expect(
        &["-type=SRV", "_http._tcp.whoami.default.svc.cluster.local"],
        &["80".into(), "whoami.default.svc.cluster.local".into()],
    )?;
    // A pod record.
    let dashed = client.ip.to_string().replace('.', "-");
    expect(&[&format!("{dashed}.default.pod.cluster.local")], &[client.ip.to_string()])?;
    // ExternalName: a CNAME to docs.corp.test, which the ConfigMap's stub domain answers.
    expect(&["docs.default.svc.cluster.local"], &["docs.corp.test".into(), STUB_ANSWER.to_string()])?;
    // Any other name goes to the ConfigMap's upstream.
    expect(&["www.example.org"], &[UPSTREAM_ANSWER.to_string()])?;
    Ok(())
}

/// Commits with a clusterIP outside the range, a nodePort another Service holds, or a named
/// targetPort no selected Pod declares are rejected whole, with file and JSON path, and the last
/// good commit stays served.
fn bad_commits(cluster: &LocalCluster, work: &Worktree, client: &RunningPod, url: &str) -> Result<()> {
    let app = || cluster.get("/apis/gitplane.io/v1/namespaces/gitplane-system/applications/demo");
    let cases = [
        ("outside.yaml", "clusterIP: 192.168.7.7", "/spec/clusterIP"),
        ("taken.yaml", "type: NodePort\n  ports:\n    - port: 81\n      nodePort: 30080", "/spec/ports/0/nodePort"),
        (
            "misnamed.yaml",
            "selector:\n    app: whoami\n  ports:\n    - port: 82\n      targetPort: htp",
            "/spec/ports/0/targetPort",
        ),
    ];
    for (file, spec, path) in cases {
        let synced = tokio::task::block_in_place(|| {
            wait_for(DEADLINE, || app().ok().filter(|a| a["status"]["sync"]["status"] == "Synced"))
        });
        let good = synced.context("the demo Application is not Synced")?["status"]["sync"]["revision"].clone();
        let ports = if spec.contains("ports:") { String::new() } else { "\n  ports:\n    - port: 80".into() };
        let manifest = format!("apiVersion: v1\nkind: Service\nmetadata:\n  name: bad\nspec:\n  {spec}{ports}\n");
        work.write(file, &manifest)?;
        work.commit_and_push(&format!("a bad Service: {file}"))?;
        let failed = tokio::task::block_in_place(|| {
            wait_for(DEADLINE, || {
                let sync = app().ok()?["status"]["sync"].clone();
                (sync["status"] == "Failed" && sync["errors"].to_string().contains(file)).then_some(sync)
            })
        })
        .with_context(|| {
            format!("the commit with {file} was not rejected: {:?}", app().map(|a| a["status"].clone()))
        })?;
        let errors = failed["errors"].to_string();
        ensure!(errors.contains(path), "the rejection of {file} does not name {path}: {errors}");
        ensure!(failed["revision"] == good, "the last good revision must stay: {failed}");
        ensure!(cluster.fetch(&client.node, &client.container, url).is_ok(), "{url} stopped answering after {file}");
        println!("{file} rejected: {errors}");
        work.remove(file)?;
        work.commit_and_push(&format!("remove {file}"))?;
    }
    Ok(())
}

fn pods(cluster: &LocalCluster) -> Result<Vec<RunningPod>> {
    cluster.running_pods("app=whoami")
}

/// Pod names that answered `url` from inside `client`, over `requests` requests. An empty
/// answer (a request cut short) fails the batch as a refused one does: the caller polls again.
fn answers(cluster: &LocalCluster, client: &RunningPod, url: &str, requests: usize) -> Result<BTreeSet<String>> {
    let mut seen = BTreeSet::new();
    for _ in 0..requests {
        let answer = cluster.fetch(&client.node, &client.container, url)?.trim().to_owned();
        ensure!(!answer.is_empty(), "{url} answered with an empty body");
        seen.insert(answer);
    }
    Ok(seen)
}

/// The whole story, with the proxy backend `mode`; `everything` adds DNS and bad commits.
async fn services_across_hosts(prefix: &str, mode: &str, everything: bool) -> Result<()> {
    require_root()?;
    let flag = format!("--proxy-mode={mode}");
    let cluster = tokio::task::block_in_place(|| LocalCluster::up_with(prefix, 3, &[&flag]))?;
    let _fake_dns = FakeDns::start(&cluster)?;
    let work_dir = tempfile::tempdir()?;
    let work = Worktree::clone(cluster.demo_repo(), work_dir.path().join("demo"))?;
    work.remove("web.yaml")?;
    work.write("whoami.yaml", &manifests(3))?;
    work.commit_and_push("whoami: 3 replicas behind Services")?;
    let running = tokio::task::block_in_place(|| {
        wait_for(DEADLINE, || pods(&cluster).ok().filter(|p| p.len() == 3))
            .with_context(|| format!("3 Running whoami Pods: {:?}\n{}", pods(&cluster), cluster.log_text()))
    })?;
    let nodes: BTreeSet<&str> = running.iter().map(|p| p.node.as_str()).collect();
    ensure!(nodes.len() == 3, "the Pods are not spread over the 3 nodes: {running:?}");
    let everyone: BTreeSet<String> = running.iter().map(|p| p.name.clone()).collect();
    let service = cluster.get("/api/v1/namespaces/default/services/whoami")?;
    let cluster_ip: Ipv4Addr = service["spec"]["clusterIP"].as_str().context("whoami has a clusterIP")?.parse()?;
    let client = running.iter().find(|p| p.node == cluster.nodes[0]).context("a Pod on node 1")?.clone();

    // Cluster DNS on the client's node answers the Service's name with its ClusterIP.
    let name = "whoami.default.svc.cluster.local";
    let lookup = |name: &str| cluster.exec(&client.node, &client.container, &["/bin/busybox", "nslookup", name]);
    let answer = tokio::task::block_in_place(|| {
        wait_for(DEADLINE, || lookup(name).ok().filter(|out| out.contains(&cluster_ip.to_string())))
    })
    .with_context(|| format!("nslookup {name} never gave {cluster_ip}: {:?}", lookup(name)))?;
    println!("{mode}: nslookup {name}:\n{answer}");

    // By its short name (the Pod's search path), the ClusterIP spreads over all three Pods.
    let url = "http://whoami/cgi-bin/host";
    tokio::task::block_in_place(|| {
        let mut seen = BTreeSet::new();
        wait_for(DEADLINE, || {
            seen.extend(answers(&cluster, &client, url, 6).ok()?);
            (seen == everyone).then_some(())
        })
        .with_context(|| format!("{url} from {} reached only {seen:?} of {everyone:?}", client.name))
    })?;
    println!("{mode}: {url} from {} reached all of {everyone:?}", client.name);
    if everything {
        dns_cases(&cluster, &client, &running)?;
        bad_commits(&cluster, &work, &client, url)?;
    }

    // The NodePort answers on node 1's address, from node 2's namespace.
    let node1 = cluster.get(&format!("/api/v1/nodes/{}", cluster.nodes[0]))?;
    let node1_ip: Ipv4Addr = node1["status"]["addresses"]
        .as_array()
        .and_then(|a| a.iter().find(|a| a["type"] == "InternalIP"))
        .and_then(|a| a["address"].as_str()?.parse().ok())
        .context("node 1's InternalIP")?;
    let netns = Path::new("/run/netns").join(&cluster.nodes[1]);
    let nodeport = SocketAddr::from((node1_ip, 30080));
    let body = tokio::task::block_in_place(|| {
        wait_for(DEADLINE, || gitplane_e2e::http_get_in(&netns, nodeport, "/cgi-bin/host", Duration::from_secs(5)).ok())
    })
    .with_context(|| format!("NodePort {nodeport} from {}", cluster.nodes[1]))?;
    ensure!(everyone.iter().any(|p| body.contains(p.as_str())), "NodePort {nodeport} answered {body:?}");

    // A Service without endpoints refuses at once (a reset, not a 5 s timeout).
    let refused = cluster.fetch(&client.node, &client.container, "http://nobody/");
    let error = refused.err().context("a Service without endpoints answered")?.to_string();
    ensure!(error.contains("refused"), "a Service without endpoints should refuse the connection: {error}");

    let service_addr = SocketAddr::from((cluster_ip, 80));
    let from_node = |netns: &Path, n: usize| -> Result<BTreeSet<String>> {
        let mut seen = BTreeSet::new();
        for _ in 0..n {
            let body = gitplane_e2e::http_get_in(netns, service_addr, "/cgi-bin/host", Duration::from_secs(5))?;
            seen.insert(body.trim().to_owned());
        }
        Ok(seen)
    };
    // Node 1's agent is killed: its rules keep working meanwhile, and `gitplane up` starts it
    // again, which takes them over (the scale-down below is then its work).
    let node1_netns = Path::new("/run/netns").join(&cluster.nodes[0]);
    if everything {
        let killed = cluster.agent_pid(&cluster.nodes[0]).context("node 1's agent")?;
        // SAFETY: kill(2) on the agent process `gitplane up` (our child) runs for node 1.
        unsafe { libc::kill(killed, libc::SIGKILL) };
        let meanwhile = from_node(&node1_netns, 3).context("the ClusterIP from node 1 while its agent is down")?;
        ensure!(!meanwhile.is_empty(), "no answer from the ClusterIP while the agent was down");
        tokio::task::block_in_place(|| {
            wait_for(DEADLINE, || cluster.agent_pid(&cluster.nodes[0]).filter(|pid| *pid != killed))
        })
        .context("node 1's agent was not started again")?;
        println!("{mode}: node 1's agent killed; its rules answered meanwhile; it was started again");
    }

    // Scale down in Git: traffic to the ClusterIP, from node 1's own network namespace (the
    // client Pod may be one of those removed), goes only to the Pod that is left.
    work.write("whoami.yaml", &manifests(1))?;
    work.commit_and_push("whoami: 1 replica")?;
    let from_node = |n| from_node(&node1_netns, n);
    let left = tokio::task::block_in_place(|| {
        wait_for(DEADLINE, || {
            let pods = pods(&cluster).ok()?;
            let seen = from_node(6).ok()?;
            (pods.len() == 1 && seen.len() == 1 && seen.contains(&pods[0].name)).then_some(seen)
        })
    })
    .with_context(|| format!("after the scale-down {service_addr} still spread: {:?}", from_node(6)))?;
    println!("{mode}: after the scale-down only {left:?} answers");

    let status = tokio::task::block_in_place(|| cluster.stop(DEADLINE))?;
    ensure!(status.success(), "gitplane up --nodes exited with {status}");
    Ok(())
}

/// One backend after the other: two clusters of three nodes at once are too much for a
/// 2-core CI machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t63_services_across_hosts_with_nftables_then_iptables() -> Result<()> {
    services_across_hosts("gp63n", "nftables", true).await.context("with --proxy-mode=nftables")?;
    services_across_hosts("gp63i", "iptables", false).await.context("with --proxy-mode=iptables")
}
