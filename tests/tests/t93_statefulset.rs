//! The Kubernetes documentation's StatefulSet basics tutorial, on `gitplane up --nodes 3`: its
//! `web` StatefulSet and headless `nginx` Service as published, pushed to Git. web-0 is Running
//! and Ready before web-1 is created, each with its claim bound by the local provisioner; each
//! Pod's hostname is its name and its /etc/hosts names it `web-N.nginx.default.svc.cluster.local`;
//! cluster DNS answers that name, and `web-0.nginx` (through the search path) reaches web-0 from
//! a client Pod; kubectl prints the set as upstream's; scaling up adds web-2 and scaling down to
//! none removes the highest ordinals first and keeps the claims, so web-0 comes back serving the
//! page the tutorial wrote into its volume; a rolling update with a partition replaces only the
//! Pods at or above it, and without one every Pod, the status naming both revisions, which
//! `kubectl rollout history` lists. Images come from the test kit's registry (stand-ins of the
//! published nginx-slim).

use anyhow::{Context, Result, ensure};
use gitplane_e2e::{LocalCluster, RunningPod, Worktree, manifests::shell_pod, require_root, wait_for};
use gitplane_testkit::registry::{self, Registry, StandIn};
use serde_json::Value;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(180);
const NGINX_SLIM: &str = "registry.k8s.io/nginx-slim:0.21";
/// The image the tutorial's rolling update sets.
const NGINX_SLIM_NEXT: &str = "registry.k8s.io/nginx-slim:0.24";

/// `content/en/examples/application/web/web.yaml` of kubernetes/website, as the tutorial
/// publishes it.
const PUBLISHED: &str = r#"apiVersion: v1
kind: Service
metadata:
  name: nginx
  labels:
    app: nginx
spec:
  ports:
  - port: 80
    name: web
  clusterIP: None
  selector:
    app: nginx
---
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: web
spec:
  serviceName: "nginx"
  replicas: 2
  selector:
    matchLabels:
      app: nginx
  template:
    metadata:
      labels:
        app: nginx
    spec:
      containers:
      - name: nginx
        image: registry.k8s.io/nginx-slim:0.21
        ports:
        - containerPort: 80
          name: web
        volumeMounts:
        - name: www
          mountPath: /usr/share/nginx/html
  volumeClaimTemplates:
  - metadata:
      name: www
    spec:
      accessModes: [ "ReadWriteOnce" ]
      resources:
        requests:
          storage: 1Gi
"#;

/// The tutorial's set with `replicas`, a RollingUpdate `partition`, and from revision 2 on the
/// image the tutorial's rolling update sets.
fn web(replicas: u32, partition: u32, revision: u32) -> String {
    let set = PUBLISHED.replace(
        "  replicas: 2\n",
        &format!(
            "  replicas: {replicas}\n  updateStrategy:\n    type: RollingUpdate\n    rollingUpdate:\n      partition: {partition}\n"
        ),
    );
    if revision < 2 { set } else { set.replace(NGINX_SLIM, NGINX_SLIM_NEXT) }
}

/// The set's Pods by name.
fn pods(cluster: &LocalCluster) -> Result<Vec<Value>> {
    let list = cluster.get("/api/v1/namespaces/default/pods?labelSelector=app%3Dnginx")?;
    Ok(list["items"].as_array().cloned().unwrap_or_default())
}

fn names(pods: &[Value]) -> Vec<String> {
    pods.iter().filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned)).collect()
}

fn set(cluster: &LocalCluster) -> Result<Value> {
    cluster.get("/apis/apps/v1/namespaces/default/statefulsets/web")
}

/// Waits until the set's Pods are exactly `wanted`, all Running and Ready, and the set's
/// status says so.
fn settled(cluster: &LocalCluster, wanted: &[&str]) -> Result<Vec<RunningPod>> {
    let ready = || -> Option<Vec<RunningPod>> {
        let running = cluster.running_pods("app=nginx").ok()?;
        let all = pods(cluster).ok()?;
        let ready = all.iter().filter(|p| {
            p["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        });
        let status = &set(cluster).ok()?["status"];
        (names(&all) == wanted
            && ready.count() == wanted.len()
            && running.len() == wanted.len()
            && status["readyReplicas"].as_u64().unwrap_or(0) == wanted.len() as u64
            && status["replicas"].as_u64() == Some(wanted.len() as u64))
        .then_some(running)
    };
    tokio::task::block_in_place(|| wait_for(DEADLINE, ready)).with_context(|| {
        format!(
            "the set's Pods never settled on {wanted:?}: {:?}\n{}",
            pods(cluster).map(|p| names(&p)),
            cluster.log_tail()
        )
    })
}

fn pod<'a>(running: &'a [RunningPod], name: &str) -> Result<&'a RunningPod> {
    running.iter().find(|p| p.name == name).with_context(|| format!("{name} is not running"))
}

/// The `controller-revision-hash` of each of the set's Pods, by name.
fn revisions(cluster: &LocalCluster) -> Result<Vec<(String, String)>> {
    Ok(pods(cluster)?
        .iter()
        .map(|p| {
            let label = p["metadata"]["labels"]["controller-revision-hash"].as_str().unwrap_or("");
            (p["metadata"]["name"].as_str().unwrap_or("").to_owned(), label.to_owned())
        })
        .collect())
}

/// The messages of the Events about the set, in the order they were written.
fn set_events(cluster: &LocalCluster) -> Result<Vec<String>> {
    let list = cluster.get("/api/v1/namespaces/default/events")?;
    let mut events: Vec<(i64, String)> = list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| e["involvedObject"]["kind"] == "StatefulSet" && e["involvedObject"]["name"] == "web")
        .map(|e| {
            let written = e["metadata"]["resourceVersion"].as_str().and_then(|v| v.parse().ok()).unwrap_or(0);
            (written, e["message"].as_str().unwrap_or("").to_owned())
        })
        .collect();
    events.sort();
    Ok(events.into_iter().map(|(_, message)| message).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t93_statefulset_basics() -> Result<()> {
    require_root()?;
    let work_dir = tempfile::tempdir()?;
    let mirror = registry::address(5000);
    let file = registry::write_registries_file(work_dir.path(), mirror, &[mirror])?;
    let cluster =
        tokio::task::block_in_place(|| LocalCluster::up_with("gp93", 3, &["--registries", &file.to_string_lossy()]))?;
    let registry = tokio::task::block_in_place(|| -> Result<Registry> {
        let registry = Registry::start(&work_dir.path().join("mirror"), &cluster, mirror, None)?;
        for image in [NGINX_SLIM, NGINX_SLIM_NEXT] {
            registry.push_stand_in(image, &StandIn::nginx())?;
        }
        Ok(registry)
    })?;
    let work = Worktree::clone(cluster.demo_repo(), work_dir.path().join("demo"))?;
    work.remove("web.yaml")?;
    work.write("client.yaml", &shell_pod("client", "exec /bin/busybox sleep 3600"))?;
    work.write("nginx.yaml", PUBLISHED)?;
    work.commit_and_push("the StatefulSet basics tutorial's web and nginx")?;

    // Created in order: web-1 only once web-0 is Running and Ready.
    let running = settled(&cluster, &["web-0", "web-1"])?;
    let all = pods(&cluster)?;
    let ready_since = all[0]["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Ready")
        .and_then(|c| c["lastTransitionTime"].as_str())
        .context("web-0's Ready condition")?;
    let web1_created = all[1]["metadata"]["creationTimestamp"].as_str().context("web-1's creationTimestamp")?;
    ensure!(
        web1_created >= ready_since,
        "web-1 was created at {web1_created}, before web-0 was Ready at {ready_since}"
    );
    // Events are written in batches: wait for both.
    let created = || -> Option<Vec<String>> {
        let events = set_events(&cluster).ok()?;
        let created: Vec<String> = events.into_iter().filter(|m| m.starts_with("create Pod")).collect();
        (created.len() >= 2).then_some(created)
    };
    let created = tokio::task::block_in_place(|| wait_for(DEADLINE, created)).context("two create Pod Events")?;
    ensure!(
        created == ["create Pod web-0 in StatefulSet web successful", "create Pod web-1 in StatefulSet web successful"],
        "{created:?}"
    );
    let table = cluster.kubectl(&["get", "statefulset", "-o", "wide"])?;
    println!("{table}");
    let row: Vec<&str> = table.lines().nth(1).unwrap_or("").split_whitespace().collect();
    ensure!(
        row.len() == 5 && row[..2] == ["web", "2/2"] && row[3] == "nginx",
        "kubectl get statefulset -o wide: {table}"
    );

    // Identity: the hostname is the Pod's name, /etc/hosts names it in its subdomain, and
    // cluster DNS answers web-0.nginx from another Pod.
    let web0 = pod(&running, "web-0")?;
    let hostname = cluster.exec(&web0.node, &web0.container, &["/bin/busybox", "hostname"])?;
    ensure!(hostname.trim() == "web-0", "hostname in web-0: {hostname:?}");
    let hosts = cluster.exec(&web0.node, &web0.container, &["/bin/busybox", "cat", "/etc/hosts"])?;
    ensure!(hosts.contains(&format!("{}\tweb-0.nginx.default.svc.cluster.local\tweb-0", web0.ip)), "{hosts}");
    let client = tokio::task::block_in_place(|| {
        wait_for(DEADLINE, || cluster.running_pods("").ok()?.into_iter().find(|p| p.name == "client"))
    })
    .context("the client Pod never ran")?;
    // busybox's nslookup ignores the search path: the short name as a program resolves it.
    let ip = web0.ip.to_string();
    let lookup = |name: &str| cluster.exec(&client.node, &client.container, &["/bin/busybox", "nslookup", name]);
    let fetch = |url: &str| {
        // Before the tutorial writes its page, the volume is empty and the answer a 404.
        let script = format!("/bin/busybox wget -O /dev/null {url} 2>&1; true");
        cluster.exec(&client.node, &client.container, &["/bin/busybox", "sh", "-c", &script])
    };
    let fqdn = "web-0.nginx.default.svc.cluster.local";
    let answer =
        tokio::task::block_in_place(|| wait_for(DEADLINE, || lookup(fqdn).ok().filter(|out| out.contains(&ip))))
            .with_context(|| format!("nslookup {fqdn} never gave {ip}: {:?}", lookup(fqdn)))?;
    println!("nslookup {fqdn}:\n{answer}");
    let connecting = format!("Connecting to web-0.nginx ({ip}:80)");
    let fetched = tokio::task::block_in_place(|| {
        wait_for(DEADLINE, || fetch("http://web-0.nginx/").ok().filter(|out| out.contains(&connecting)))
    })
    .with_context(|| format!("wget http://web-0.nginx/ never connected to {ip}: {:?}", fetch("http://web-0.nginx/")))?;
    println!("wget http://web-0.nginx/:\n{fetched}");

    // Each Pod has its claim, bound by the local provisioner; the tutorial writes each Pod's
    // hostname into its volume, and web-0.nginx serves it.
    let bound = || -> Option<Vec<String>> {
        let list = cluster.get("/api/v1/namespaces/default/persistentvolumeclaims").ok()?;
        let claims: Vec<String> = list["items"]
            .as_array()?
            .iter()
            .filter(|c| c["status"]["phase"] == "Bound")
            .filter_map(|c| c["metadata"]["name"].as_str().map(str::to_owned))
            .collect();
        (claims.len() >= 2).then_some(claims)
    };
    let claims = tokio::task::block_in_place(|| wait_for(DEADLINE, bound)).with_context(|| {
        format!("the claims were never Bound: {:?}", cluster.get("/api/v1/namespaces/default/persistentvolumeclaims"))
    })?;
    ensure!(claims == ["www-web-0", "www-web-1"], "claims: {claims:?}");
    for name in ["web-0", "web-1"] {
        let p = pod(&running, name)?;
        let write = "echo \"$(hostname)\" > /usr/share/nginx/html/index.html";
        cluster.exec(&p.node, &p.container, &["/bin/sh", "-c", write])?;
    }
    let page = |url: &str| {
        let script = format!("/bin/busybox wget -q -O - {url}");
        cluster.exec(&client.node, &client.container, &["/bin/busybox", "sh", "-c", &script])
    };
    let served = tokio::task::block_in_place(|| {
        wait_for(DEADLINE, || page("http://web-0.nginx/").ok().filter(|p| p.trim() == "web-0"))
    });
    ensure!(served.is_some(), "web-0.nginx served {:?}", page("http://web-0.nginx/"));

    // Scale up to 3, then down to 0: web-2 goes before web-1, web-1 before web-0, and every
    // claim stays.
    work.write("nginx.yaml", &web(3, 0, 1))?;
    work.commit_and_push("web: 3 replicas")?;
    settled(&cluster, &["web-0", "web-1", "web-2"])?;
    work.write("nginx.yaml", &web(0, 0, 1))?;
    work.commit_and_push("web: 0 replicas")?;
    // The deletions may fall in one batch of Events: the Pods seen on the way down tell the
    // order instead. No Pod goes while a higher one is still there.
    let mut seen: Vec<Vec<String>> = Vec::new();
    let down = tokio::task::block_in_place(|| {
        wait_for(DEADLINE, || {
            let now = names(&pods(&cluster).ok()?);
            if seen.last() != Some(&now) {
                seen.push(now.clone());
            }
            now.is_empty().then_some(())
        })
    });
    ensure!(down.is_some(), "web never came down to no Pods: {seen:?}");
    let in_order = |pods: &Vec<String>| {
        ["web-0", "web-1", "web-2"]
            .into_iter()
            .skip_while(|p| pods.iter().any(|n| n == p))
            .all(|p| !pods.iter().any(|n| n == p))
    };
    ensure!(seen.iter().all(in_order), "a Pod went before a higher one: {seen:?}");
    settled(&cluster, &[])?;
    let list = cluster.get("/api/v1/namespaces/default/persistentvolumeclaims")?;
    ensure!(names(list["items"].as_array().context("claims")?) == ["www-web-0", "www-web-1", "www-web-2"], "{list}");

    // A rolling update with partition 2 of 3 replaces web-2 only; partition 0 then the rest,
    // from the highest ordinal down, and the update revision becomes the current one.
    work.write("nginx.yaml", &web(3, 0, 1))?;
    work.commit_and_push("web: 3 replicas again")?;
    settled(&cluster, &["web-0", "web-1", "web-2"])?;
    // web-0 came back with its claim: what was written before is there.
    let served = tokio::task::block_in_place(|| {
        wait_for(DEADLINE, || page("http://web-0.nginx/").ok().filter(|p| p.trim() == "web-0"))
    });
    ensure!(served.is_some(), "web-0 came back without its page: {:?}", page("http://web-0.nginx/"));
    let before = set(&cluster)?["status"]["currentRevision"].as_str().unwrap_or("").to_owned();
    work.write("nginx.yaml", &web(3, 2, 2))?;
    work.commit_and_push("web: nginx-slim:0.24 from partition 2")?;
    let partitioned = || -> Option<(String, Vec<(String, String)>)> {
        let status = set(&cluster).ok()?["status"].clone();
        let update = status["updateRevision"].as_str()?.to_owned();
        let revisions = revisions(&cluster).ok()?;
        let done = update != before
            && status["updatedReplicas"] == 1
            && status["readyReplicas"] == 3
            && revisions.iter().map(|(_, r)| r.as_str()).collect::<Vec<_>>() == [&before, &before, &update];
        done.then_some((update, revisions))
    };
    let (update, _) = tokio::task::block_in_place(|| wait_for(DEADLINE, partitioned))
        .with_context(|| format!("partition 2 never updated web-2 alone: {:?}", revisions(&cluster)))?;
    ensure!(set(&cluster)?["status"]["currentRevision"] == before.as_str());
    let history = cluster.kubectl(&["get", "controllerrevisions"])?;
    let rows: Vec<Vec<&str>> = history.lines().skip(1).map(|l| l.split_whitespace().take(3).collect()).collect();
    ensure!(rows.contains(&vec![update.as_str(), "statefulset.apps/web", "2"]), "{history}");
    let shown = cluster.kubectl(&["rollout", "history", "statefulset/web"])?;
    let numbers: Vec<&str> = shown.lines().skip(2).filter_map(|l| l.split_whitespace().next()).collect();
    ensure!(numbers == ["1", "2"], "kubectl rollout history:\n{shown}");

    work.write("nginx.yaml", &web(3, 0, 2))?;
    work.commit_and_push("web: partition 0")?;
    // From the highest ordinal down: the Pods at the update revision are always the highest.
    let mut seen: Vec<Vec<(String, String)>> = Vec::new();
    let rolled = tokio::task::block_in_place(|| {
        wait_for(DEADLINE, || {
            let now = revisions(&cluster).ok()?;
            if seen.last() != Some(&now) {
                seen.push(now.clone());
            }
            let status = set(&cluster).ok()?["status"].clone();
            let all_updated = now.len() == 3 && now.iter().all(|(_, r)| *r == update);
            (all_updated
                && status["currentRevision"] == update.as_str()
                && status["updatedReplicas"] == 3
                && status["readyReplicas"] == 3)
                .then_some(())
        })
    });
    ensure!(rolled.is_some(), "the rollout never finished: {seen:?}");
    for pods in &seen {
        let updated: Vec<bool> = pods.iter().map(|(_, r)| *r == update).collect();
        ensure!(updated.windows(2).all(|w| !w[0] || w[1]), "a lower ordinal was updated first: {seen:?}");
    }
    let status = cluster.kubectl(&["rollout", "status", "statefulset/web", "--timeout=60s"])?;
    println!("{status}");
    drop(registry);
    tokio::task::block_in_place(|| cluster.stop(Duration::from_secs(120)))?;
    Ok(())
}
