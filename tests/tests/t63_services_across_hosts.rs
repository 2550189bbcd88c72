//! Services across hosts, on `gitplane up --nodes 3`, with each proxy backend: a Pod on one node
//! finds a Service by name through cluster DNS on its own node, and its requests to the
//! ClusterIP reach the Service's Pods on all three nodes; a NodePort answers on another node's
//! address; a Service without endpoints refuses at once instead of timing out; after a scale-down
//! pushed to Git, traffic goes only to the Pod that is left. All traffic stays in namespaces
//! `gitplane up` made.

use anyhow::{Context, Result, ensure};
use gitplane_e2e::{LocalCluster, RunningPod, Worktree, require_root, wait_for};
use std::{
    collections::BTreeSet,
    net::{Ipv4Addr, SocketAddr},
    path::Path,
    time::Duration,
};

const DEADLINE: Duration = Duration::from_secs(120);

/// busybox httpd answering its Pod's name at /cgi-bin/host, on a named port; a Service in front
/// of it by that name, a NodePort Service, and a Service whose selector matches nothing.
fn manifests(replicas: u32) -> String {
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
    - port: 80
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

fn pods(cluster: &LocalCluster) -> Result<Vec<RunningPod>> {
    cluster.running_pods("app=whoami")
}

/// Pod names that answered `url` from inside `client`, over `requests` requests.
fn answers(cluster: &LocalCluster, client: &RunningPod, url: &str, requests: usize) -> Result<BTreeSet<String>> {
    let mut seen = BTreeSet::new();
    for _ in 0..requests {
        seen.insert(cluster.fetch(&client.node, &client.container, url)?.trim().to_owned());
    }
    Ok(seen)
}

/// The whole story, with the proxy backend `mode`.
async fn services_across_hosts(prefix: &str, mode: &str) -> Result<()> {
    require_root()?;
    let flag = format!("--proxy-mode={mode}");
    let cluster = tokio::task::block_in_place(|| LocalCluster::up_with(prefix, 3, &[&flag]))?;
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

    // Scale down in Git: traffic goes only to the Pod that is left.
    work.write("whoami.yaml", &manifests(1))?;
    work.commit_and_push("whoami: 1 replica")?;
    let left = tokio::task::block_in_place(|| {
        wait_for(DEADLINE, || {
            let pods = pods(&cluster).ok()?;
            let seen = answers(&cluster, &client, url, 6).ok()?;
            (pods.len() == 1 && seen.len() == 1 && seen.contains(&pods[0].name)).then_some(seen)
        })
    })
    .with_context(|| format!("after the scale-down {url} still spread: {:?}", answers(&cluster, &client, url, 6)))?;
    println!("{mode}: after the scale-down only {left:?} answers");

    let status = tokio::task::block_in_place(|| cluster.stop(DEADLINE))?;
    ensure!(status.success(), "gitplane up --nodes exited with {status}");
    Ok(())
}

/// One backend after the other: two clusters of three nodes at once are too much for a
/// 2-core CI machine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t63_services_across_hosts_with_nftables_then_iptables() -> Result<()> {
    services_across_hosts("gp63n", "nftables").await.context("with --proxy-mode=nftables")?;
    services_across_hosts("gp63i", "iptables").await.context("with --proxy-mode=iptables")
}
