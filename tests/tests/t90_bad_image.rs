//! One Deployment with an image no registry serves must not flood the store.
//! The agent reports ErrImagePull, then ImagePullBackOff, pulling again on the kubelet's back-off
//! (10 s doubling to 5 min); each status write is a fresh message, and nothing else wakes the
//! Pod's worker. Also item 9's last clause: the Application of that Deployment is not Healthy.

use anyhow::{Context, Result, ensure};
use gitplane_e2e::{Gitplane, NetnsHost, Worktree, netns_host, require_root, wait_for};
use serde_json::Value;
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(60);
/// How long the Pod's writes are counted, from its creation.
const WINDOW: Duration = Duration::from_secs(60);

/// The writes of the Pod in WINDOW, from the back-off arithmetic: pulls fail at once (no
/// registry is reachable) at about 0 s, 10 s and 30 s, the next at 70 s (10 s doubling, each
/// start up to one 2 s resync late); each pull makes two status changes (ErrImagePull, then
/// ImagePullBackOff at the next resync): 6 writes by the agent. Others write the Pod too: the
/// scheduler (an Unschedulable mark if the node is not ready yet, then the binding) and the
/// agent before its first pull fails (a sync that stopped after the sandbox): 2 + 2 more.
/// Before the fix the agent wrote about 30 to 70 times a second.
const MAX_WRITES: usize = 10;

/// Growth of the store's files in WINDOW. The idle appliance and at most MAX_WRITES copies of
/// one Pod (a few KiB each, also kept in the watch history) need well under this; before the
/// fix the store grew by hundreds of MB a minute.
const MAX_STORE_GROWTH: u64 = 4 << 20;

const BAD: &str = "apiVersion: apps/v1
kind: Deployment
metadata:
  name: bad
spec:
  replicas: 1
  selector:
    matchLabels:
      app: bad
  template:
    metadata:
      labels:
        app: bad
    spec:
      terminationGracePeriodSeconds: 1
      containers:
        - name: web
          image: nginx:1.27
";

/// The one Pod of app `bad`, if there is one.
fn bad_pod(up: &Gitplane, host: &NetnsHost) -> Option<Value> {
    let list = up.get(host, "/api/v1/namespaces/default/pods").ok()?;
    list["items"].as_array()?.iter().find(|p| p["metadata"]["labels"]["app"] == "bad").cloned()
}

/// The store's revision: every write anywhere bumps it once.
fn revision(up: &Gitplane, host: &NetnsHost) -> Result<u64> {
    let list = up.get(host, "/api/v1/namespaces/default/pods")?;
    list["metadata"]["resourceVersion"].as_str().and_then(|v| v.parse().ok()).context("a list has a resourceVersion")
}

/// The store's database with its write-ahead log.
fn store_bytes(up: &Gitplane) -> u64 {
    let dir = up.data_dir.join("store");
    ["store.db", "store.db-wal"].iter().map(|f| std::fs::metadata(dir.join(f)).map_or(0, |m| m.len())).sum()
}

fn waiting(pod: &Value) -> (String, String) {
    let state = &pod["status"]["containerStatuses"][0]["state"]["waiting"];
    let s = |v: &Value| v.as_str().unwrap_or("").to_owned();
    (s(&state["reason"]), s(&state["message"]))
}

#[test]
fn an_unpullable_image_does_not_flood_the_store() -> Result<()> {
    require_root()?;
    let host = netns_host("gp90")?;
    let up = Gitplane::up(&host, "node-1")?;
    let work = Worktree::clone(up.demo_repo(), host.dir().join("work"))?;
    work.write("bad.yaml", BAD)?;
    work.commit_and_push("a Deployment whose image cannot be pulled")?;

    let first = wait_for(DEADLINE, || bad_pod(&up, &host))
        .with_context(|| format!("the Pod of the bad Deployment never appeared\n{}", up.log_text()))?;
    let start = Instant::now();
    let store_at_start = store_bytes(&up);
    let revision_at_start = revision(&up, &host)?;
    let name = first["metadata"]["name"].as_str().context("the Pod has a name")?.to_owned();
    let path = format!("/api/v1/namespaces/default/pods/{name}");

    // Every resourceVersion the Pod goes through; polled far more often than the agent may
    // write (at most once a second), so none is missed.
    let mut versions = vec![(first["metadata"]["resourceVersion"].clone(), waiting(&first).0)];
    let mut seen_reasons = Vec::new();
    let mut longest_message = 0;
    let mut app_healthy = false;
    let mut next_app_check = start;
    while start.elapsed() < WINDOW {
        if let Ok(pod) = up.get(&host, &path) {
            let version = pod["metadata"]["resourceVersion"].clone();
            let (reason, message) = waiting(&pod);
            if versions.last().is_none_or(|(last, _)| *last != version) {
                versions.push((version, reason.clone()));
            }
            longest_message = longest_message.max(message.len());
            if !reason.is_empty() && seen_reasons.last() != Some(&reason) {
                seen_reasons.push(reason);
            }
        }
        if Instant::now() >= next_app_check {
            next_app_check += Duration::from_secs(1);
            let app = up.get(&host, "/apis/gitplane.io/v1/namespaces/gitplane-system/applications/demo")?;
            app_healthy |= app["status"]["health"]["status"] == "Healthy";
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let writes = versions.len() - 1;
    let growth = store_bytes(&up).saturating_sub(store_at_start);
    let revisions = revision(&up, &host)?.saturating_sub(revision_at_start);
    println!(
        "in {WINDOW:?}: {writes} writes of the Pod seen, {revisions} store writes in all, store grew by {growth} bytes, \
         reasons {seen_reasons:?}, longest message {longest_message} bytes"
    );
    if writes <= 20 {
        println!("(resourceVersion, waiting reason) of the Pod: {versions:?}");
    }

    ensure!(
        seen_reasons.iter().any(|r| r == "ErrImagePull") && seen_reasons.iter().any(|r| r == "ImagePullBackOff"),
        "the Pod should show ErrImagePull and ImagePullBackOff: {seen_reasons:?}\n{}",
        up.log_text()
    );
    ensure!(longest_message < 1024, "the waiting message grew to {longest_message} bytes");
    ensure!(
        writes <= MAX_WRITES,
        "the Pod was written {writes} times in {WINDOW:?} (at most {MAX_WRITES} expected): {:?}",
        &versions[..versions.len().min(20)]
    );
    ensure!(growth <= MAX_STORE_GROWTH, "the store grew by {growth} bytes in {WINDOW:?}");
    ensure!(!app_healthy, "the demo Application was Healthy while its Deployment had no available replica");
    let app = up.get(&host, "/apis/gitplane.io/v1/namespaces/gitplane-system/applications/demo")?;
    ensure!(app["status"]["health"]["status"] != "Healthy", "demo health: {}", app["status"]["health"]);

    let status = up.stop(DEADLINE)?;
    ensure!(status.success(), "gitplane up exited with {status}");
    Ok(())
}
