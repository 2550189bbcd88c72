//! `gitplane-bench podstart`: how long the node agent's runtime manager (the kubelet's SyncPod)
//! takes from a bound Pod to Running with its image present, against the floor: the same CRI
//! calls made bare (RunPodSandbox, CreateContainer, StartContainer with the very configs the
//! agent would send), on the same containerd in the same run. Pods start one by one, then all
//! at once; each phase's CRI calls are counted per operation.
//!
//! The node is a network-namespace host with its own containerd, as in the end-to-end tests;
//! everything is removed at the end, also on failure.

use anyhow::{Context as _, Result, bail, ensure};
use gitplane_nodeagent::{
    host::NetnsHost,
    kubelet::containerd::Containerd,
    kubelet::cri::{Cri, pb},
    kubelet::images::{HTTPD_IMAGE, ensure_images},
    kubelet::prober::PodProbes,
    kubelet::runtime::{
        RuntimeConfig, RuntimeManager, calls::CallStats, container_config, env::NoConfig, sandbox_config,
    },
    network::cni::write_conflist,
};
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;
use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

#[derive(clap::Args, Clone)]
pub struct PodStartArgs {
    /// Pods per phase.
    #[arg(long, default_value_t = 30)]
    pods: usize,
}

const POD_CIDR: &str = "10.244.7.0/24";

pub fn main(args: PodStartArgs) -> Result<()> {
    ensure!(unsafe { libc::geteuid() } == 0, "podstart needs root (network namespaces, containerd, cgroups)");
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(run(args))
}

/// One phase's pod start times and the CRI calls it made.
struct Phase {
    name: &'static str,
    starts: Vec<Duration>,
    calls: BTreeMap<&'static str, CallStats>,
}

async fn run(args: PodStartArgs) -> Result<()> {
    let name = format!("gpbps{}", std::process::id());
    let dir = std::env::temp_dir().join("gitplane-bench").join(&name);
    let host = NetnsHost::create(&name, dir, format!("/gitplane-bench-{name}"))?;
    let cfg = gitplane_testkit::node::containerd_config(&host, host.dir());
    write_conflist(&cfg.cni_conf_dir, "gitplane", "gp0", POD_CIDR, &host.dir().join("cni/ipam"))?;
    let containerd = Containerd::start(cfg).await?;
    let result = measure(&args, &host, &containerd).await;
    containerd.stop().await?;
    drop(host);
    let phases = result?;
    print_tables(&args, &phases);
    Ok(())
}

async fn measure(args: &PodStartArgs, host: &NetnsHost, containerd: &Containerd) -> Result<Vec<Phase>> {
    let socket = containerd.socket();
    let cri = Cri::connect(&socket).await?;
    ensure_images(&cri, &socket, &host.dir().join("images")).await?;
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
    let mut phases = Vec::new();
    let mut serial = 0;
    let mut next_pods = |what: &str, n: usize| -> Result<Vec<Pod>> {
        (0..n)
            .map(|_| {
                serial += 1;
                pod(&format!("{what}-{serial}"))
            })
            .collect()
    };

    // Warm-up: the first sandbox of a containerd is slower (snapshots, CNI cache).
    let warm = next_pods("warm", 2)?;
    for pod in &warm {
        run_until_running(&runtime, pod).await?;
    }
    kill_all(&runtime, &warm).await?;

    eprintln!("agent, one by one");
    let pods = next_pods("serial", args.pods)?;
    let before = runtime.cri_calls();
    let mut starts = Vec::new();
    for pod in &pods {
        starts.push(run_until_running(&runtime, pod).await?);
    }
    phases.push(Phase { name: "agent, one by one", starts, calls: diff(&runtime.cri_calls(), &before) });
    kill_all(&runtime, &pods).await?;

    eprintln!("agent, {} at once", args.pods);
    let pods = next_pods("burst", args.pods)?;
    let before = runtime.cri_calls();
    // Every Pod's clock starts at once: the futures are first polled together.
    let starts = futures::future::try_join_all(pods.iter().map(|pod| run_until_running(&runtime, pod))).await?;
    phases.push(Phase { name: "agent, at once", starts, calls: diff(&runtime.cri_calls(), &before) });
    kill_all(&runtime, &pods).await?;

    for (name, at_once) in [("bare CRI, one by one", false), ("bare CRI, at once", true)] {
        eprintln!("{name}");
        let pods = next_pods("bare", args.pods)?;
        let phase = bare(&cri, runtime.config(), &pods, at_once).await;
        kill_all(&runtime, &pods).await?;
        let (starts, calls) = phase?;
        phases.push(Phase { name, starts, calls });
    }
    Ok(phases)
}

/// A Pod of the httpd image (present), bound to this node.
fn pod(name: &str) -> Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "uid": format!("bench-{name}")},
        "spec": {
            "nodeName": "bench",
            "containers": [{
                "name": "web",
                "image": HTTPD_IMAGE,
                "imagePullPolicy": "IfNotPresent",
                "resources": {"limits": {"cpu": "100m", "memory": "64Mi"}}
            }]
        }
    }))?)
}

/// SyncPod until the Pod is Running with an IP: the time from the first call.
async fn run_until_running(runtime: &RuntimeManager, pod: &Pod) -> Result<Duration> {
    let started = Instant::now();
    loop {
        let status = runtime.sync_pod(pod, &PodProbes::default()).await?;
        if status.phase.as_deref() == Some("Running") && status.pod_ip.is_some() {
            return Ok(started.elapsed());
        }
        if started.elapsed() > Duration::from_secs(120) {
            bail!("{:?} not Running after 120 s: {status:?}", pod.metadata.name);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The floor: RunPodSandbox, CreateContainer, StartContainer with the agent's own configs.
async fn bare(
    cri: &Cri,
    cfg: &RuntimeConfig,
    pods: &[Pod],
    at_once: bool,
) -> Result<(Vec<Duration>, BTreeMap<&'static str, CallStats>)> {
    let calls = gitplane_nodeagent::kubelet::runtime::calls::CriCalls::default();
    let start = |pod: &Pod| {
        let calls = &calls;
        let pod = pod.clone();
        async move {
            let started = Instant::now();
            let config = sandbox_config(&pod, cfg, 0)?;
            std::fs::create_dir_all(&config.log_directory)?;
            let t = Instant::now();
            let req = pb::RunPodSandboxRequest { config: Some(config.clone()), runtime_handler: String::new() };
            let sandbox = cri.runtime().run_pod_sandbox(req).await?.into_inner().pod_sandbox_id;
            calls.record("RunPodSandbox", t.elapsed());
            let container = &pod.spec.as_ref().context("spec")?.containers[0];
            let plan = container_config(&pod, container, cfg, 0, &[], &NoConfig)?;
            let t = Instant::now();
            let req = pb::CreateContainerRequest {
                pod_sandbox_id: sandbox,
                config: Some(plan.config),
                sandbox_config: Some(config),
            };
            let id = cri.runtime().create_container(req).await?.into_inner().container_id;
            calls.record("CreateContainer", t.elapsed());
            let t = Instant::now();
            cri.runtime().start_container(pb::StartContainerRequest { container_id: id }).await?;
            calls.record("StartContainer", t.elapsed());
            anyhow::Ok(started.elapsed())
        }
    };
    let starts = if at_once {
        let started = Instant::now();
        futures::future::try_join_all(pods.iter().map(|p| {
            let run = start(p);
            async move {
                run.await?;
                anyhow::Ok(started.elapsed())
            }
        }))
        .await?
    } else {
        let mut starts = Vec::new();
        for pod in pods {
            starts.push(start(pod).await?);
        }
        starts
    };
    Ok((starts, calls.snapshot()))
}

async fn kill_all(runtime: &RuntimeManager, pods: &[Pod]) -> Result<()> {
    for pod in pods {
        let uid = pod.metadata.uid.as_deref().context("uid")?;
        runtime.kill_pod(uid, Duration::from_secs(1), &[]).await?;
    }
    Ok(())
}

fn diff(
    after: &BTreeMap<&'static str, CallStats>,
    before: &BTreeMap<&'static str, CallStats>,
) -> BTreeMap<&'static str, CallStats> {
    after
        .iter()
        .map(|(op, stats)| (*op, stats.since(before.get(op).unwrap_or(&CallStats::default()))))
        .filter(|(_, stats)| stats.count > 0)
        .collect()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

fn print_tables(args: &PodStartArgs, phases: &[Phase]) {
    println!("Pod start, bound to Running, image present, {} Pods per phase, one node\n", args.pods);
    println!("| path | p50 | p99 | max | p99 / floor p99 |");
    println!("|---|---|---|---|---|");
    let stats = |p: &Phase| {
        let mut sorted = p.starts.clone();
        sorted.sort();
        (percentile(&sorted, 0.5), percentile(&sorted, 0.99), *sorted.last().unwrap_or(&Duration::ZERO))
    };
    for phase in phases {
        let (p50, p99, max) = stats(phase);
        let floor = phases
            .iter()
            .find(|f| f.name.starts_with("bare") && f.name.ends_with(phase.name.split(", ").nth(1).unwrap_or("")));
        let ratio = floor
            .map(|f| format!("{:.2}x", p99.as_secs_f64() / stats(f).1.as_secs_f64().max(1e-9)))
            .unwrap_or_default();
        println!("| {} | {} | {} | {} | {ratio} |", phase.name, ms(p50), ms(p99), ms(max));
    }
    println!("\nCRI calls per Pod start (count per Pod, mean time per call)\n");
    let ops: std::collections::BTreeSet<&str> = phases.iter().flat_map(|p| p.calls.keys().copied()).collect();
    print!("| CRI call |");
    for phase in phases {
        print!(" {} |", phase.name);
    }
    println!();
    println!("|---|{}", "---|".repeat(phases.len()));
    for op in ops {
        print!("| {op} |");
        for phase in phases {
            match phase.calls.get(op) {
                Some(s) if s.count > 0 => print!(
                    " {:.1} x {:.1} ms |",
                    s.count as f64 / phase.starts.len() as f64,
                    s.total.as_secs_f64() * 1000.0 / s.count as f64
                ),
                _ => print!(" |"),
            }
        }
        println!();
    }
}
