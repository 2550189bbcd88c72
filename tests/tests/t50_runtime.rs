//! The node runtime layer against a real containerd, inside a network-namespace host: images
//! built and imported, a pod run through CRI and served over HTTP on its pod IP, a pull failure
//! reported as ErrImagePull, and kill_pod leaving no sandbox and no cgroup behind.

use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use gitplane_e2e::{HostExt, NetnsHost, netns_host, require_root, wait_for};
use gitplane_nodeagent::kubelet::containerd::Containerd;
use gitplane_nodeagent::kubelet::cri::{Cri, pb};
use gitplane_nodeagent::kubelet::images::{HTTPD_IMAGE, ensure_images};
use gitplane_nodeagent::kubelet::prober::PodProbes;
use gitplane_nodeagent::kubelet::runtime::{RuntimeConfig, RuntimeManager};
use gitplane_nodeagent::network::cni::write_conflist;
use gitplane_testkit::node::containerd_config;
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use serde_json::json;

const POD_CIDR: &str = "10.244.1.0/24";

fn pod(name: &str, uid: &str, image: &str) -> Result<Pod> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "namespace": "default", "uid": uid, "labels": { "app": name } },
        "spec": {
            "nodeName": "node-1",
            "terminationGracePeriodSeconds": 5,
            "containers": [{
                "name": "web",
                "image": image,
                "imagePullPolicy": "IfNotPresent",
                "ports": [{ "containerPort": 80 }],
                "env": [{ "name": "POD_NAME", "valueFrom": { "fieldRef": { "fieldPath": "metadata.name" } } }],
                "resources": { "requests": { "cpu": "100m", "memory": "32Mi" }, "limits": { "cpu": "500m", "memory": "64Mi" } }
            }]
        }
    }))?)
}

fn waiting_reason(status: &PodStatus) -> Option<String> {
    status.container_statuses.as_ref()?.first()?.state.as_ref()?.waiting.as_ref()?.reason.clone()
}

async fn sandboxes_of(cri: &Cri, uid: &str) -> Result<Vec<pb::PodSandbox>> {
    let filter = pb::PodSandboxFilter {
        label_selector: [("io.kubernetes.pod.uid".to_string(), uid.to_string())].into(),
        ..Default::default()
    };
    Ok(cri.runtime().list_pod_sandbox(pb::ListPodSandboxRequest { filter: Some(filter) }).await?.into_inner().items)
}

/// The pod's cgroup directory in each cgroup hierarchy of this (the host's) mount namespace.
fn pod_cgroup_dirs(cgroup_parent: &str, uid: &str) -> Result<Vec<std::path::PathBuf>> {
    let mut dirs = Vec::new();
    for entry in std::fs::read_dir("/sys/fs/cgroup")? {
        let hierarchy = entry?.path();
        dirs.push(hierarchy.join(cgroup_parent.trim_start_matches('/')).join(format!("pod{uid}")));
    }
    Ok(dirs)
}

/// A node's runtime layer in `host`: containerd, images, CNI config, the runtime manager.
async fn start_node(host: &NetnsHost) -> Result<(Containerd, Cri, RuntimeManager)> {
    let cfg = containerd_config(host, host.dir());
    write_conflist(&cfg.cni_conf_dir, "gitplane", "gp0", POD_CIDR, &host.dir().join("cni/ipam"))?;
    let started = Instant::now();
    let containerd = Containerd::start(cfg).await?;
    println!("{}: containerd ({}) ready in {:?}", host.name(), containerd.version(), started.elapsed());

    let socket = containerd.socket();
    let cri = Cri::connect(&socket).await?;
    let started = Instant::now();
    let imported = ensure_images(&cri, &socket, &host.dir().join("images")).await?;
    println!("{}: images {imported:?} built and imported in {:?}", host.name(), started.elapsed());
    ensure!(ensure_images(&cri, &socket, &host.dir().join("images")).await?.is_empty(), "images imported twice");

    let runtime = RuntimeManager::new(
        cri.clone(),
        RuntimeConfig {
            cgroup_parent: host.cgroup_parent().to_owned(),
            pod_log_dir: host.dir().join("logs"),
            pod_dir: host.dir().join("pods"),
            ..RuntimeConfig::default()
        },
    )
    .await;
    Ok((containerd, cri, runtime))
}

/// Syncs until the pod is Running with an IP.
async fn run_until_running(runtime: &RuntimeManager, pod: &Pod) -> Result<(PodStatus, IpAddr, usize)> {
    let bound = Instant::now();
    let mut syncs = 0;
    loop {
        let status = runtime.sync_pod(pod, &PodProbes::default()).await?;
        syncs += 1;
        if status.phase.as_deref() == Some("Running")
            && let Some(ip) = status.pod_ip.as_deref()
        {
            let ip = ip.parse().context("pod IP")?;
            return Ok((status, ip, syncs));
        }
        if bound.elapsed() > Duration::from_secs(30) {
            bail!("pod not Running after 30 s: {status:#?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t50_pod_runs_serves_http_and_is_killed() -> Result<()> {
    require_root()?;
    let host = netns_host("gp50")?;

    let (containerd, cri, runtime) = start_node(&host).await?;

    // A pod bound to this node runs and serves its page on the pod IP.
    let uid = format!("{}-web", host.name());
    let web = pod("web", &uid, HTTPD_IMAGE)?;
    let bound = Instant::now();
    let (status, ip, syncs) = run_until_running(&runtime, &web).await?;
    println!("bound -> Running in {:?} ({syncs} sync), pod IP {ip}", bound.elapsed());
    let container = status.container_statuses.as_ref().and_then(|c| c.first()).context("container status")?;
    ensure!(container.ready && container.restart_count == 0, "{container:#?}");
    ensure!(container.container_id.as_deref().is_some_and(|id| id.starts_with("containerd://")), "{container:#?}");
    let ready = status.conditions.iter().flatten().find(|c| c.type_ == "Ready").context("Ready condition")?;
    ensure!(ready.status == "True", "{ready:#?}");
    ensure!(status.qos_class.as_deref() == Some("Burstable"), "{status:#?}");

    ensure!(ip.to_string().starts_with("10.244.1."), "pod IP {ip} outside {POD_CIDR}");
    let started = Instant::now();
    // Running means started, not yet listening (no readiness probe here): retry briefly.
    let mut last_error = None;
    let page = wait_for(Duration::from_secs(10), || {
        host.http_get(SocketAddr::new(ip, 80), "/", Duration::from_secs(2)).map_err(|e| last_error = Some(e)).ok()
    })
    .with_context(|| format!("GET http://{ip}/: {last_error:?}"))?;
    ensure!(page.contains("gitplane httpd"), "unexpected page: {page}");
    println!("GET http://{ip}/ answered in {:?}", started.elapsed());

    // Syncing again changes nothing.
    let again = runtime.sync_pod(&web, &PodProbes::default()).await?;
    ensure!(again.container_statuses == status.container_statuses, "resync changed the pod: {again:#?}");
    let cgroups = pod_cgroup_dirs(host.cgroup_parent(), &uid)?;
    ensure!(cgroups.iter().any(|d| d.is_dir()), "no pod cgroup in {cgroups:?}");
    // The container's limits reached its cgroup (the sandbox's own has none).
    let pod_memory =
        Path::new("/sys/fs/cgroup/memory").join(host.cgroup_parent().trim_start_matches('/')).join(format!("pod{uid}"));
    let limits: Vec<String> = std::fs::read_dir(&pod_memory)?
        .flatten()
        .filter_map(|e| std::fs::read_to_string(e.path().join("memory.limit_in_bytes")).ok())
        .map(|l| l.trim().to_string())
        .collect();
    ensure!(limits.iter().any(|l| l == "67108864"), "no container cgroup with the 64Mi limit: {limits:?}");

    // containerd restarts (e.g. an upgrade) without taking pods down: they live in their shims,
    // and the pinned mount namespace keeps their netns and rootfs mounts visible to it.
    let config = containerd.config().clone();
    containerd.stop().await?;
    let started = Instant::now();
    let containerd = Containerd::start(config).await?;
    // The runtime manager keeps its channel; it reconnects to the new containerd.
    let mut transient = Vec::new();
    let after = loop {
        match runtime.sync_pod(&web, &PodProbes::default()).await {
            Ok(status) => break status,
            Err(e) if started.elapsed() < Duration::from_secs(10) => transient.push(e.to_string()),
            Err(e) => bail!("no sync after the containerd restart: {e} (before: {transient:?})"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    println!("containerd restarted, pod synced again in {:?} (transient errors: {transient:?})", started.elapsed());
    ensure!(after.container_statuses == status.container_statuses, "the restart changed the pod: {after:#?}");
    ensure!(after.pod_ip == status.pod_ip, "pod IP changed: {after:#?}");
    let page = host.http_get(SocketAddr::new(ip, 80), "/", Duration::from_secs(2))?;
    ensure!(page.contains("gitplane httpd"), "unexpected page after restart: {page}");

    // A missing image fails fast as ErrImagePull with the runtime's reason.
    let nope_uid = format!("{}-nope", host.name());
    let nope = pod("nope", &nope_uid, "gitplane.local/nope:1")?;
    let started = Instant::now();
    let status = runtime.sync_pod(&nope, &PodProbes::default()).await?;
    let elapsed = started.elapsed();
    ensure!(waiting_reason(&status).as_deref() == Some("ErrImagePull"), "{status:#?}");
    ensure!(status.phase.as_deref() == Some("Pending"), "{status:#?}");
    let message =
        status.container_statuses.as_ref().and_then(|c| c[0].state.as_ref()?.waiting.as_ref()?.message.clone());
    println!(
        "ErrImagePull after {elapsed:?} (first sync: sandbox, then the failed pull): {}",
        message.unwrap_or_default()
    );
    let status = runtime.sync_pod(&nope, &PodProbes::default()).await?;
    ensure!(waiting_reason(&status).as_deref() == Some("ImagePullBackOff"), "{status:#?}");

    let mut uids = runtime.pod_uids().await?;
    uids.sort();
    ensure!(uids == [nope_uid.clone(), uid.clone()], "pod_uids: {uids:?}");

    // Killing leaves no sandbox and no cgroup.
    for id in [&uid, &nope_uid] {
        let started = Instant::now();
        runtime.kill_pod(id, Duration::from_secs(5), &[]).await?;
        println!("kill_pod {id} took {:?}", started.elapsed());
        ensure!(sandboxes_of(&cri, id).await?.is_empty(), "sandbox of {id} left");
        let left: Vec<_> = pod_cgroup_dirs(host.cgroup_parent(), id)?.into_iter().filter(|d| d.exists()).collect();
        ensure!(left.is_empty(), "cgroups left: {left:?}");
    }
    ensure!(runtime.pod_uids().await?.is_empty(), "pods left");

    let started = Instant::now();
    containerd.stop().await?;
    println!("containerd stopped in {:?}", started.elapsed());
    Ok(())
}

/// A test that fails half-way leaves nothing behind: dropping the containerd handle and the
/// host (as a panic unwinding does) ends containerd, shims and containers, and removes cgroups,
/// mounts, the directory and the netns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t50_dropped_host_leaves_nothing_behind() -> Result<()> {
    require_root()?;
    let host = netns_host("gp50d")?;
    let (name, dir, cgroup_parent) =
        (host.name().to_string(), host.dir().to_path_buf(), host.cgroup_parent().to_owned());
    let (containerd, cri, runtime) = start_node(&host).await?;
    let uid = format!("{name}-left");
    run_until_running(&runtime, &pod("left", &uid, HTTPD_IMAGE)?).await?;
    let pids: Vec<String> = pod_cgroup_dirs(&cgroup_parent, &uid)?
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flat_map(|entries| entries.flatten())
        .filter_map(|e| std::fs::read_to_string(e.path().join("cgroup.procs")).ok())
        .flat_map(|procs| procs.lines().map(str::to_string).collect::<Vec<_>>())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    ensure!(!pids.is_empty(), "no container process found");

    let started = Instant::now();
    drop((runtime, cri, containerd, host));
    println!("{name}: dropped with a running pod, cleaned up in {:?}", started.elapsed());

    ensure!(!Path::new("/run/netns").join(&name).exists(), "netns {name} left");
    ensure!(!dir.exists(), "{} left", dir.display());
    let left: Vec<_> = std::fs::read_dir("/sys/fs/cgroup")?
        .flatten()
        .map(|h| h.path().join(cgroup_parent.trim_start_matches('/')))
        .filter(|d| d.exists())
        .collect();
    ensure!(left.is_empty(), "cgroups left: {left:?}");
    // Killed processes may stay zombies for a moment, until init reaps them.
    let running = |pid: &String| {
        std::fs::read_to_string(Path::new("/proc").join(pid).join("stat"))
            .is_ok_and(|stat| stat.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')))
    };
    let alive: Vec<_> = pids.iter().filter(|pid| running(pid)).collect();
    ensure!(alive.is_empty(), "container processes left: {alive:?}");
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    ensure!(!mountinfo.contains(&name), "mounts left: {mountinfo}");
    for entry in std::fs::read_dir("/proc")?.flatten() {
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        ensure!(!cmdline.contains(&*dir.to_string_lossy()), "process left: {cmdline}");
    }
    Ok(())
}
