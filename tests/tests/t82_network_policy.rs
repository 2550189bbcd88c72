//! NetworkPolicy as a truth table on `gitplane up --nodes 3`: three namespaces of three Pods
//! each (busybox httpd on ports 80 and 8080), spread over the nodes; for each set of policies
//! pushed to Git, every Pod connects to every Pod on both ports (from inside the client Pod's
//! network namespace, all probes in parallel) and the whole matrix must equal what the
//! Kubernetes semantics say; a mismatch prints the matrix of differences. Then a policy with
//! an invalid CIDR is rejected with file, line and path while the last good policies stay
//! enforced. All traffic stays in the namespaces `gitplane up` made.

use anyhow::{Context, Result, bail, ensure};
use gitplane_e2e::{LocalCluster, Worktree, require_root, wait_for};
use std::{
    collections::{BTreeMap, BTreeSet},
    net::{Ipv4Addr, SocketAddr, TcpStream, UdpSocket},
    path::PathBuf,
    process::Command,
    time::Duration,
};

const DEADLINE: Duration = Duration::from_secs(120);
/// How long an allowed connection may take to open; a dropped one takes this long to fail.
const CONNECT: Duration = Duration::from_millis(1500);
const NAMESPACES: [&str; 3] = ["np-a", "np-b", "np-c"];
const APPS: [&str; 3] = ["web", "db", "client"];
const PORTS: [u16; 2] = [80, 8080];
/// Cluster DNS on every node's loopback.
const CLUSTER_DNS: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::new(10, 96, 0, 10)), 53);

/// A Pod of the table: `np-a/web`.
#[derive(Clone, Debug)]
struct Target {
    namespace: String,
    app: String,
    node: String,
    ip: Ipv4Addr,
    /// The network namespace of its sandbox (`/proc/<pid>/ns/net` of its container).
    netns: PathBuf,
}

impl Target {
    fn id(&self) -> String {
        format!("{}/{}", self.namespace, self.app)
    }
}

fn workload() -> String {
    let mut out = String::new();
    for (i, ns) in NAMESPACES.iter().enumerate() {
        let team = ["a", "b", ""][i];
        let labels = if team.is_empty() { String::new() } else { format!("\n  labels:\n    team: {team}") };
        out.push_str(&format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {ns}{labels}\n---\n"));
        for app in APPS {
            let role = if app == "client" { "\n    role: client" } else { "" };
            out.push_str(&format!(
                r#"apiVersion: v1
kind: Pod
metadata:
  name: {app}
  namespace: {ns}
  labels:
    app: {app}{role}
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: httpd
      image: gitplane.local/httpd:1
      command:
        - /bin/busybox
        - sh
        - -c
        - |
          /bin/busybox mkdir -p /www
          echo {ns}/{app} > /www/index.html
          /bin/busybox httpd -p 80 -h /www
          exec /bin/busybox httpd -f -p 8080 -h /www
      ports:
        - name: http
          containerPort: 80
        - name: alt
          containerPort: 8080
      resources:
        requests:
          cpu: 200m
          memory: 16Mi
---
"#
            ));
        }
    }
    out
}

fn policy(namespace: &str, name: &str, spec: &str) -> String {
    format!(
        "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata:\n  name: {name}\n  namespace: {namespace}\nspec:\n{spec}---\n"
    )
}

/// Every Pod of the table, once all nine run.
fn targets(cluster: &LocalCluster) -> Result<Vec<Target>> {
    let list = cluster.get("/api/v1/pods")?;
    let mut found = Vec::new();
    for p in list["items"].as_array().context("PodList has items")? {
        let namespace = p["metadata"]["namespace"].as_str().unwrap_or_default();
        if !NAMESPACES.contains(&namespace) || p["status"]["phase"] != "Running" {
            continue;
        }
        let node = p["spec"]["nodeName"].as_str().context("nodeName")?.to_owned();
        let container = p["status"]["containerStatuses"][0]["containerID"]
            .as_str()
            .and_then(|c| c.strip_prefix("containerd://"))
            .context("containerID")?;
        let pid = task_pid(cluster, &node, container)?;
        found.push(Target {
            namespace: namespace.to_owned(),
            app: p["metadata"]["name"].as_str().context("name")?.to_owned(),
            node,
            ip: p["status"]["podIP"].as_str().context("podIP")?.parse()?,
            netns: PathBuf::from(format!("/proc/{pid}/ns/net")),
        });
    }
    found.sort_by_key(Target::id);
    Ok(found)
}

/// The pid of a container's task, from its node's containerd.
fn task_pid(cluster: &LocalCluster, node: &str, container: &str) -> Result<u32> {
    let out = Command::new("ctr")
        .arg("-a")
        .arg(cluster.containerd_socket(node))
        .args(["-n", "k8s.io", "tasks", "ls"])
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.starts_with(container)).with_context(|| format!("task {container}: {text}"))?;
    Ok(line.split_whitespace().nth(1).context("pid column")?.parse()?)
}

/// (client, server, port) -> connected.
type Matrix = BTreeMap<(String, String, u16), bool>;

/// Every client to every server on every port, in parallel, from the client's netns.
fn probe(targets: &[Target]) -> Matrix {
    std::thread::scope(|scope| {
        let handles: Vec<_> = targets
            .iter()
            .flat_map(|from| targets.iter().flat_map(move |to| PORTS.iter().map(move |port| (from, to, *port))))
            .map(|(from, to, port)| {
                let handle = scope.spawn(move || {
                    gitplane_kubelet::netns::in_netns(&from.netns, || {
                        TcpStream::connect_timeout(&SocketAddr::from((to.ip, port)), CONNECT)
                    })
                    .is_ok()
                });
                ((from.id(), to.id(), port), handle)
            })
            .collect();
        handles.into_iter().map(|(key, h)| (key, h.join().unwrap_or(false))).collect()
    })
}

/// Whether cluster DNS answers the client (any answer: the query got through).
fn dns_answers(client: &Target) -> bool {
    // A query for `kubernetes.default.svc.cluster.local`, type A.
    let mut query = vec![0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in ["kubernetes", "default", "svc", "cluster", "local"] {
        query.push(label.len() as u8);
        query.extend_from_slice(label.as_bytes());
    }
    query.extend_from_slice(&[0, 0, 1, 0, 1]);
    gitplane_kubelet::netns::in_netns(&client.netns, || {
        let socket = UdpSocket::bind("0.0.0.0:0")?;
        socket.set_read_timeout(Some(CONNECT))?;
        socket.send_to(&query, CLUSTER_DNS)?;
        let mut buf = [0u8; 512];
        socket.recv(&mut buf).map(|n| n >= 12 && buf[..2] == [0x12, 0x34])
    })
    .unwrap_or(false)
}

/// The matrix of differences: one row per client, `.` as expected, `+` open but should be
/// closed, `-` closed but should be open; columns are servers x ports.
fn diff(targets: &[Target], got: &Matrix, want: &Matrix) -> String {
    let mut out = format!("{:>12} ", "from \\ to");
    for t in targets {
        out.push_str(&format!("{:>11} ", t.id()));
    }
    out.push('\n');
    for from in targets {
        out.push_str(&format!("{:>12} ", from.id()));
        for to in targets {
            let cell: String = PORTS
                .iter()
                .map(|p| {
                    let key = (from.id(), to.id(), *p);
                    match (got.get(&key), want.get(&key)) {
                        (Some(g), Some(w)) if g == w => '.',
                        (Some(true), _) => '+',
                        _ => '-',
                    }
                })
                .collect();
            out.push_str(&format!("{cell:>11} "));
        }
        out.push('\n');
    }
    out
}

/// The expected matrix: `allowed(from, to, port)` for every pair, a Pod always reaching itself.
fn expect(targets: &[Target], allowed: impl Fn(&Target, &Target, u16) -> bool) -> Matrix {
    let mut m = Matrix::new();
    for from in targets {
        for to in targets {
            for port in PORTS {
                let ok = from.id() == to.id() || allowed(from, to, port);
                m.insert((from.id(), to.id(), port), ok);
            }
        }
    }
    m
}

/// Polls until the probed matrix equals `want` (policies take effect asynchronously).
fn assert_matrix(what: &str, targets: &[Target], want: &Matrix) -> Result<()> {
    let mut last = Matrix::new();
    let matched = wait_for(DEADLINE, || {
        last = probe(targets);
        (last == *want).then_some(())
    });
    if matched.is_none() {
        bail!(
            "{what}: the matrix differs (+ open but should be closed, - closed but should be open):\n{}",
            diff(targets, &last, want)
        );
    }
    println!("{what}: {} of {} connections open, as expected", want.values().filter(|v| **v).count(), want.len());
    Ok(())
}

fn push(work: &Worktree, policies: &str, message: &str) -> Result<()> {
    if policies.is_empty() {
        work.remove("policies.yaml")?;
    } else {
        work.write("policies.yaml", policies)?;
    }
    work.commit_and_push(message)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t82_network_policy_truth_table() -> Result<()> {
    require_root()?;
    tokio::task::block_in_place(truth_table)
}

fn truth_table() -> Result<()> {
    let cluster = LocalCluster::up("gp82", 3)?;
    let work_dir = tempfile::tempdir()?;
    let work = Worktree::clone(cluster.demo_repo(), work_dir.path().join("demo"))?;
    work.remove("web.yaml")?;
    work.write("table.yaml", &workload())?;
    work.commit_and_push("three namespaces of three Pods")?;
    let targets = wait_for(DEADLINE, || targets(&cluster).ok().filter(|t| t.len() == 9))
        .with_context(|| format!("9 Running Pods: {:?}\n{}", targets(&cluster), cluster.log_text()))?;
    let nodes: BTreeSet<&str> = targets.iter().map(|t| t.node.as_str()).collect();
    println!("Pods: {:?}", targets.iter().map(|t| format!("{} {} {}", t.id(), t.node, t.ip)).collect::<Vec<_>>());
    ensure!(nodes.len() >= 2, "the Pods are not spread over the nodes: {targets:?}");

    let ns = |t: &Target, n: &str| t.namespace == n;
    let everything = expect(&targets, |_, _, _| true);
    assert_matrix("no policy", &targets, &everything)?;

    let deny_ingress_a = policy("np-a", "deny-ingress", "  podSelector: {}\n  policyTypes: [Ingress]\n");
    push(&work, &deny_ingress_a, "default deny ingress in np-a")?;
    assert_matrix("default deny ingress in np-a", &targets, &expect(&targets, |_, to, _| !ns(to, "np-a")))?;

    push(
        &work,
        &policy("np-a", "deny-egress", "  podSelector: {}\n  policyTypes: [Egress]\n"),
        "default deny egress in np-a",
    )?;
    assert_matrix("default deny egress in np-a", &targets, &expect(&targets, |from, _, _| !ns(from, "np-a")))?;

    let from_team_b = format!(
        "{deny_ingress_a}{}",
        policy(
            "np-a",
            "from-team-b",
            "  podSelector: {}\n  ingress:\n    - from:\n        - namespaceSelector:\n            matchLabels:\n              team: b\n"
        )
    );
    push(&work, &from_team_b, "np-a: only from namespaces labelled team=b")?;
    assert_matrix(
        "np-a allows from namespace team=b",
        &targets,
        &expect(&targets, |from, to, _| !ns(to, "np-a") || ns(from, "np-b")),
    )?;

    let both = policy(
        "np-a",
        "db-from-b-clients",
        "  podSelector:\n    matchLabels:\n      app: db\n  ingress:\n    - from:\n        - namespaceSelector:\n            matchLabels:\n              team: b\n          podSelector:\n            matchLabels:\n              role: client\n",
    );
    push(&work, &both, "np-a/db: only from clients of namespace team=b")?;
    assert_matrix(
        "np-a/db allows from pods role=client in namespace team=b",
        &targets,
        &expect(&targets, |from, to, _| to.id() != "np-a/db" || from.id() == "np-b/client"),
    )?;

    // Every Pod address but those of one node's podCIDR.
    let excluded_node = targets.iter().find(|t| t.id() == "np-a/client").context("np-a/client")?.node.clone();
    let pod_cidr = cluster.get(&format!("/api/v1/nodes/{excluded_node}"))?["spec"]["podCIDR"]
        .as_str()
        .context("podCIDR")?
        .to_owned();
    let block = policy(
        "np-b",
        "from-block",
        &format!(
            "  podSelector: {{}}\n  ingress:\n    - from:\n        - ipBlock:\n            cidr: 10.244.0.0/16\n            except:\n              - {pod_cidr}\n"
        ),
    );
    push(&work, &block, "np-b: from 10.244.0.0/16 except one node's podCIDR")?;
    assert_matrix(
        &format!("np-b allows from 10.244.0.0/16 except {pod_cidr}"),
        &targets,
        &expect(&targets, |from, to, _| !ns(to, "np-b") || from.node != excluded_node),
    )?;

    let ports = format!(
        "{}{}",
        policy(
            "np-c",
            "web-named-port",
            "  podSelector:\n    matchLabels:\n      app: web\n  ingress:\n    - ports:\n        - port: alt\n"
        ),
        policy(
            "np-c",
            "db-port-range",
            "  podSelector:\n    matchLabels:\n      app: db\n  ingress:\n    - ports:\n        - port: 8000\n          endPort: 8100\n"
        ),
    );
    push(&work, &ports, "np-c: web on its port named alt, db on 8000-8100")?;
    assert_matrix(
        "np-c/web by the named port alt, np-c/db by the range 8000-8100",
        &targets,
        &expect(&targets, |_, to, port| !matches!(to.id().as_str(), "np-c/web" | "np-c/db") || port == 8080),
    )?;

    let dns_only = policy(
        "np-b",
        "egress-dns-only",
        "  podSelector: {}\n  policyTypes: [Egress]\n  egress:\n    - ports:\n        - port: 53\n          protocol: UDP\n        - port: 53\n          protocol: TCP\n",
    );
    push(&work, &dns_only, "np-b: egress only to DNS")?;
    assert_matrix("np-b egress only to DNS", &targets, &expect(&targets, |from, _, _| !ns(from, "np-b")))?;
    let b_client = targets.iter().find(|t| t.id() == "np-b/client").context("np-b/client")?;
    ensure!(
        wait_for(DEADLINE, || dns_answers(b_client).then_some(())).is_some(),
        "np-b/client gets no DNS answer, which its egress policy allows"
    );

    let egress_to_b = policy(
        "np-a",
        "egress-to-team-b",
        "  podSelector: {}\n  egress:\n    - to:\n        - namespaceSelector:\n            matchLabels:\n              team: b\n",
    );
    push(&work, &egress_to_b, "np-a: egress only to namespace team=b (ingress denied too)")?;
    assert_matrix(
        "np-a sends only to team=b and takes nothing",
        &targets,
        &expect(&targets, |from, to, _| !ns(to, "np-a") && (!ns(from, "np-a") || ns(to, "np-b"))),
    )?;
    let a_client = targets.iter().find(|t| t.id() == "np-a/client").context("np-a/client")?;
    ensure!(!dns_answers(a_client), "np-a/client got a DNS answer, which its egress policy denies");

    let allow_all =
        format!("{deny_ingress_a}{}", policy("np-a", "allow-all", "  podSelector: {}\n  ingress:\n    - {}\n"));
    push(&work, &allow_all, "np-a: deny all, and allow all")?;
    assert_matrix("np-a denies all and allows all: the union allows all", &targets, &everything)?;

    push(&work, &from_team_b, "np-a: only from namespaces labelled team=b, again")?;
    assert_matrix(
        "np-a allows from namespace team=b, again",
        &targets,
        &expect(&targets, |from, to, _| !ns(to, "np-a") || ns(from, "np-b")),
    )?;
    bad_cidr(&cluster, &work, &from_team_b, &targets)?;

    push(&work, "", "no policies")?;
    assert_matrix("every policy removed", &targets, &everything)?;

    let status = cluster.stop(DEADLINE)?;
    ensure!(status.success(), "gitplane up --nodes exited with {status}");
    Ok(())
}

/// A policy with an invalid CIDR: the commit is rejected with file, line and path, and the
/// policies of the last good commit stay enforced.
fn bad_cidr(cluster: &LocalCluster, work: &Worktree, good: &str, targets: &[Target]) -> Result<()> {
    let app = || cluster.get("/apis/gitplane.io/v1/namespaces/gitplane-system/applications/demo");
    let synced = wait_for(DEADLINE, || app().ok().filter(|a| a["status"]["sync"]["status"] == "Synced"))
        .context("the demo Application is not Synced")?;
    let good_revision = synced["status"]["sync"]["revision"].clone();
    let bad = policy(
        "np-c",
        "bad-cidr",
        "  podSelector: {}\n  ingress:\n    - from:\n        - ipBlock:\n            cidr: 10.244.0.0/33\n",
    );
    let content = format!("{good}{bad}");
    let line = 1 + content.lines().position(|l| l.contains("10.244.0.0/33")).context("the bad line")?;
    push(work, &content, "a policy with an invalid CIDR")?;
    let failed = wait_for(DEADLINE, || {
        let sync = app().ok()?["status"]["sync"].clone();
        (sync["status"] == "Failed").then_some(sync)
    })
    .with_context(|| format!("the invalid CIDR was not rejected: {:?}", app().map(|a| a["status"].clone())))?;
    let errors = failed["errors"].to_string();
    for part in [&format!("policies.yaml:{line} "), "/spec/ingress/0/from/0/ipBlock/cidr", "10.244.0.0/33"] {
        ensure!(errors.contains(part), "the rejection does not name {part}: {errors}");
    }
    ensure!(failed["revision"] == good_revision, "the last good revision must stay: {failed}");
    println!("invalid CIDR rejected: {errors}");
    assert_matrix(
        "after the rejected commit, np-a still allows only from team=b",
        targets,
        &expect(targets, |from, to, _| to.namespace != "np-a" || from.namespace == "np-b"),
    )?;
    push(work, good, "remove the invalid policy")
}
