//! A Pod's lifecycle through CRI against a real containerd, inside a network-namespace host, at
//! the runtime layer (as `t50_runtime`): init containers in order, the crash-loop back-off's
//! timing, graceful termination with preStop hooks, OOMKilled and the exit reasons.
//!
//! A pod worker is stood in for by a task that syncs the Pod every 250 ms, as the agent's worker
//! does when woken by the relist.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result, bail, ensure};
use gitplane_e2e::{NetnsHost, netns_host, require_root, wait_for_async};
use gitplane_nodeagent::kubelet::containerd::Containerd;
use gitplane_nodeagent::kubelet::cri::{Cri, pb};
use gitplane_nodeagent::kubelet::images::HTTPD_IMAGE;
use gitplane_nodeagent::kubelet::prober::PodProbes;
use gitplane_nodeagent::kubelet::runtime::{RuntimeConfig, RuntimeManager};
use gitplane_nodeagent::network::cni::write_conflist;
use gitplane_testkit::node::{containerd_config, start_containerd};
use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodStatus};
use serde_json::{Value, json};
use tokio::sync::watch;

const POD_CIDR: &str = "10.244.3.0/24";

/// A node's runtime layer in `host`: containerd, images, CNI config, the runtime manager.
async fn start_node(host: &NetnsHost) -> Result<(Containerd, Cri, Arc<RuntimeManager>)> {
    let cfg = containerd_config(host, host.dir());
    write_conflist(&cfg.cni_conf_dir, "gitplane", "gp0", POD_CIDR, &host.dir().join("cni/ipam"))?;
    let (containerd, cri) = start_containerd(host.name(), cfg, &host.dir().join("images")).await?;
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
    Ok((containerd, cri, Arc::new(runtime)))
}

fn pod(name: &str, host: &NetnsHost, spec: Value) -> Result<Pod> {
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "namespace": "default", "uid": format!("{}-{name}", host.name()) },
        "spec": spec,
    });
    pod["spec"]["nodeName"] = json!("node-1");
    Ok(serde_json::from_value(pod)?)
}

/// A container of the busybox image running `script` under `sh -c`.
fn sh(name: &str, script: &str) -> Value {
    json!({ "name": name, "image": HTTPD_IMAGE, "imagePullPolicy": "IfNotPresent", "command": ["sh", "-c", script] })
}

/// Syncs `pod` every 250 ms in the background, publishing each status; stops when dropped.
struct Worker {
    statuses: watch::Receiver<Option<PodStatus>>,
    task: tokio::task::JoinHandle<()>,
}

impl Worker {
    fn start(runtime: &Arc<RuntimeManager>, pod: &Pod) -> Worker {
        let (tx, statuses) = watch::channel(None);
        let (runtime, pod) = (runtime.clone(), pod.clone());
        let task = tokio::spawn(async move {
            loop {
                match runtime.sync_pod(&pod, &PodProbes::default()).await {
                    Ok(status) => {
                        tx.send_replace(Some(status));
                    }
                    Err(e) => println!("sync failed: {e}"),
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
        Worker { statuses, task }
    }

    /// Waits for a status that `accept` maps to `Some`; every status seen goes to `seen` first.
    async fn wait<T>(
        &mut self,
        timeout: Duration,
        mut seen: impl FnMut(&PodStatus),
        mut accept: impl FnMut(&PodStatus) -> Option<T>,
    ) -> Result<T> {
        let deadline = Instant::now() + timeout;
        let mut last = None;
        loop {
            if let Some(status) = self.statuses.borrow_and_update().clone() {
                seen(&status);
                if let Some(value) = accept(&status) {
                    return Ok(value);
                }
                last = Some(status);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || tokio::time::timeout(left, self.statuses.changed()).await.is_err() {
                bail!("no status as expected within {timeout:?}; the last: {last:#?}");
            }
        }
    }

    /// Stops syncing (the pod is then killed by the test).
    async fn stop(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

fn container<'a>(status: &'a PodStatus, name: &str) -> Option<&'a ContainerStatus> {
    let all = status.container_statuses.iter().flatten().chain(status.init_container_statuses.iter().flatten());
    all.into_iter().find(|c| c.name == name)
}

fn waiting_reason(c: &ContainerStatus) -> Option<&str> {
    c.state.as_ref()?.waiting.as_ref()?.reason.as_deref()
}

/// (reason, exit code) of a terminated container.
fn terminated(c: &ContainerStatus) -> Option<(String, i32)> {
    let t = c.state.as_ref()?.terminated.as_ref()?;
    Some((t.reason.clone().unwrap_or_default(), t.exit_code))
}

fn condition(status: &PodStatus, type_: &str) -> Option<String> {
    status.conditions.iter().flatten().find(|c| c.type_ == type_).map(|c| c.status.clone())
}

fn nanos(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> i128 {
    t.0.as_nanosecond()
}

fn modified(path: &Path) -> Result<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).with_context(|| format!("{} was not written", path.display()))
}

/// Kills the pod as the agent does: again after a failure (a container containerd is still
/// starting cannot be removed yet), up to 5 times.
async fn kill(runtime: &RuntimeManager, cri: &Cri, pod: &Pod, grace: Duration) -> Result<Duration> {
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let started = Instant::now();
    let mut attempt = 1;
    while let Err(e) = runtime.kill_pod(&uid, grace, &[]).await {
        println!("kill_pod {uid} (attempt {attempt}): {e}");
        ensure!(attempt < 5, "kill_pod {uid} failed {attempt} times: {e}");
        attempt += 1;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let took = started.elapsed();
    let filter = pb::ContainerFilter {
        label_selector: [("io.kubernetes.pod.uid".to_string(), uid.clone())].into(),
        ..Default::default()
    };
    let left = cri.runtime().list_containers(pb::ListContainersRequest { filter: Some(filter) }).await?;
    ensure!(left.into_inner().containers.is_empty(), "containers of {uid} left after kill_pod");
    Ok(took)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t64_init_containers_run_in_order_before_the_app() -> Result<()> {
    require_root()?;
    let host = netns_host("gp64i")?;
    let (containerd, cri, runtime) = start_node(&host).await?;

    // The second init container sees what the first wrote; the app sees both.
    let with_work = |mut c: Value| {
        c["volumeMounts"] = json!([{ "name": "work", "mountPath": "/work" }]);
        c
    };
    let web = pod(
        "init",
        &host,
        json!({
            "volumes": [{ "name": "work", "emptyDir": {} }],
            "initContainers": [
                with_work(sh("first", "sleep 2; echo first >> /work/log")),
                with_work(sh("second", "grep -q first /work/log && echo second >> /work/log")),
            ],
            "containers": [with_work(sh("app", "echo app >> /work/log; exec sleep 3600"))],
        }),
    )?;

    let mut worker = Worker::start(&runtime, &web);
    // While the first one runs: Pending, the app PodInitializing, not Initialized.
    worker
        .wait(
            Duration::from_secs(60),
            |_| {},
            |s| {
                let first = container(s, "first")?;
                let initializing = first.state.as_ref()?.running.is_some()
                    && s.phase.as_deref() == Some("Pending")
                    && waiting_reason(container(s, "second")?) == Some("PodInitializing")
                    && waiting_reason(container(s, "app")?) == Some("PodInitializing")
                    && condition(s, "Initialized").as_deref() == Some("False");
                initializing.then_some(())
            },
        )
        .await
        .context("the first init container running, the rest waiting")?;
    let mut order = Vec::new();
    let status = worker
        .wait(
            Duration::from_secs(60),
            |s| {
                for name in ["first", "second", "app"] {
                    let started = container(s, name).is_some_and(|c| c.container_id.is_some());
                    if started && !order.contains(&name) {
                        order.push(name);
                    }
                }
            },
            |s| (s.phase.as_deref() == Some("Running")).then(|| s.clone()),
        )
        .await?;
    ensure!(order == ["first", "second", "app"], "containers started in the order {order:?}");
    for name in ["first", "second"] {
        let c = container(&status, name).context(name)?;
        ensure!(terminated(c) == Some(("Completed".into(), 0)) && c.ready, "{c:#?}");
    }
    ensure!(container(&status, "app").is_some_and(|c| c.ready), "{status:#?}");
    for type_ in ["Initialized", "ContainersReady", "Ready"] {
        ensure!(condition(&status, type_).as_deref() == Some("True"), "{type_}: {status:#?}");
    }
    let log = host.dir().join(format!("pods/{}-init/volumes/kubernetes.io~empty-dir/work/log", host.name()));
    // Running means the app's process started, not that its first command has run yet.
    let expected = "first\nsecond\napp\n";
    let app_wrote = wait_for_async(Duration::from_secs(30), || async {
        std::fs::read_to_string(&log).ok().filter(|w| w == expected)
    });
    if app_wrote.await.is_none() {
        let written = std::fs::read_to_string(&log).with_context(|| log.display().to_string())?;
        bail!("{}: {written:?}, expected {expected:?}", log.display());
    }
    // Once initialized, a sync changes nothing: the init containers do not run again.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let again = runtime.sync_pod(&web, &PodProbes::default()).await?;
    ensure!(again.init_container_statuses == status.init_container_statuses, "{again:#?}");
    worker.stop().await;
    kill(&runtime, &cri, &web, Duration::from_secs(2)).await?;

    // A failed init container under restartPolicy Never fails the Pod; the app never runs.
    let failing = pod(
        "init-fails",
        &host,
        json!({
            "restartPolicy": "Never",
            "initContainers": [sh("setup", "exit 3")],
            "containers": [sh("app", "exec sleep 3600")],
        }),
    )?;
    let mut worker = Worker::start(&runtime, &failing);
    let status = worker
        .wait(Duration::from_secs(60), |_| {}, |s| (s.phase.as_deref() == Some("Failed")).then(|| s.clone()))
        .await?;
    let setup = container(&status, "setup").context("setup")?;
    ensure!(terminated(setup) == Some(("Error".into(), 3)), "{setup:#?}");
    let app = container(&status, "app").context("app")?;
    ensure!(app.container_id.is_none() && waiting_reason(app) == Some("PodInitializing"), "{app:#?}");
    ensure!(condition(&status, "Initialized").as_deref() == Some("False"), "{status:#?}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let again = runtime.sync_pod(&failing, &PodProbes::default()).await?;
    ensure!(
        again.phase.as_deref() == Some("Failed") && again.pod_ip.is_none(),
        "the failed pod runs again: {again:#?}"
    );
    worker.stop().await;
    kill(&runtime, &cri, &failing, Duration::from_secs(2)).await?;
    containerd.stop().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t64_crash_loop_back_off_doubles() -> Result<()> {
    require_root()?;
    let host = netns_host("gp64c")?;
    let (containerd, cri, runtime) = start_node(&host).await?;
    let crashing = pod("crash", &host, json!({ "containers": [sh("crash", "sleep 1; exit 1")] }))?;

    let mut worker = Worker::start(&runtime, &crashing);
    // Each run's (startedAt, finishedAt) by restartCount, and the back-off messages seen.
    let mut runs: std::collections::BTreeMap<i32, (i128, i128)> = Default::default();
    let mut messages = std::collections::BTreeSet::new();
    let started = Instant::now();
    worker
        .wait(
            Duration::from_secs(60),
            |s| {
                let Some(c) = container(s, "crash") else { return };
                if waiting_reason(c) == Some("CrashLoopBackOff") {
                    let message = c.state.as_ref().and_then(|s| s.waiting.as_ref()?.message.clone());
                    messages.insert(message.unwrap_or_default());
                    assert_eq!(s.phase.as_deref(), Some("Running"), "{s:#?}");
                    let last = c.last_state.as_ref().and_then(|l| l.terminated.as_ref());
                    if let Some(t) = last
                        && let (Some(from), Some(to)) = (&t.started_at, &t.finished_at)
                    {
                        assert_eq!((t.exit_code, t.reason.as_deref()), (1, Some("Error")));
                        runs.insert(c.restart_count, (nanos(from), nanos(to)));
                    }
                }
            },
            // The third run has crashed: the runs before it are recorded.
            |s| {
                let c = container(s, "crash")?;
                (c.restart_count >= 2 && waiting_reason(c) == Some("CrashLoopBackOff")).then_some(())
            },
        )
        .await
        .context("three crashes")?;
    println!("three crashes in {:?}: {runs:?}", started.elapsed());
    let delay = |n: i32| Duration::from_nanos(u64::try_from(runs[&n].0 - runs[&(n - 1)].1).unwrap_or(0));
    let (first, second) = (delay(1), delay(2));
    println!("restart delays: {first:?}, {second:?}");
    ensure!(first >= Duration::from_secs(10) && first < Duration::from_secs(15), "first delay {first:?}");
    ensure!(second >= Duration::from_secs(20) && second < Duration::from_secs(25), "second delay {second:?}");
    let expected: std::collections::BTreeSet<String> =
        ["10s", "20s", "40s"].iter().map(|b| format!("back-off {b} restarting failed container=crash")).collect();
    ensure!(messages == expected, "CrashLoopBackOff messages: {messages:?}");
    worker.stop().await;
    kill(&runtime, &cri, &crashing, Duration::from_secs(2)).await?;
    containerd.stop().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t64_graceful_termination_honours_the_grace_period() -> Result<()> {
    require_root()?;
    let host = netns_host("gp64g")?;
    let (containerd, cri, runtime) = start_node(&host).await?;
    let data = host.dir().join("data");
    std::fs::create_dir_all(&data)?;
    let volume = json!([{ "name": "data", "hostPath": { "path": data } }]);
    let mount = json!([{ "name": "data", "mountPath": "/data" }]);

    // Stops on SIGTERM: killed well before its long grace period ends. Its preStop hook runs
    // (and takes 2 s of the grace period) before the SIGTERM; its postStart hook ran at start.
    let mut polite = sh("polite", "trap 'echo > /data/polite-term; exit 0' TERM; while true; do sleep 0.1; done");
    polite["volumeMounts"] = mount.clone();
    polite["lifecycle"] = json!({
        "postStart": { "exec": { "command": ["sh", "-c", "echo > /data/polite-post-start"] } },
        "preStop": { "exec": { "command": ["sh", "-c", "echo > /data/polite-pre-stop; sleep 2"] } },
    });
    let polite_pod = pod(
        "polite",
        &host,
        json!({ "terminationGracePeriodSeconds": 30, "volumes": volume, "containers": [polite] }),
    )?;
    // Ignores SIGTERM: killed once its grace period is over.
    let mut stubborn = sh("stubborn", "trap 'echo > /data/stubborn-term' TERM; while true; do sleep 0.1; done");
    stubborn["volumeMounts"] = mount;
    let stubborn_pod = pod(
        "stubborn",
        &host,
        json!({ "terminationGracePeriodSeconds": 4, "volumes": volume, "containers": [stubborn] }),
    )?;

    for pod in [&polite_pod, &stubborn_pod] {
        let mut worker = Worker::start(&runtime, pod);
        worker
            .wait(Duration::from_secs(60), |_| {}, |s| (condition(s, "Ready").as_deref() == Some("True")).then_some(()))
            .await?;
        worker.stop().await;
    }
    modified(&data.join("polite-post-start")).context("the postStart hook")?;
    // The traps are set once the shells run their first line.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let before = SystemTime::now();
    let polite_took = kill(&runtime, &cri, &polite_pod, Duration::from_secs(30)).await?;
    let pre_stop = modified(&data.join("polite-pre-stop")).context("the preStop hook")?;
    let term = modified(&data.join("polite-term")).context("SIGTERM")?;
    println!(
        "polite: stopped in {polite_took:?}; preStop {:?}, SIGTERM {:?} after the kill began",
        pre_stop.duration_since(before),
        term.duration_since(before)
    );
    ensure!(
        pre_stop >= before && term >= pre_stop + Duration::from_secs(2),
        "SIGTERM came before the preStop hook ended"
    );
    ensure!(polite_took < Duration::from_secs(15), "a container that exits on SIGTERM took {polite_took:?} to stop");

    let stubborn_took = kill(&runtime, &cri, &stubborn_pod, Duration::from_secs(4)).await?;
    modified(&data.join("stubborn-term")).context("SIGTERM to the stubborn container")?;
    println!("stubborn: killed after {stubborn_took:?}");
    ensure!(
        stubborn_took >= Duration::from_secs(4) && stubborn_took < Duration::from_secs(15),
        "a container that ignores SIGTERM was killed after {stubborn_took:?}, not after its 4 s grace period"
    );
    containerd.stop().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t64_exit_reasons_and_oom_killed() -> Result<()> {
    require_root()?;
    let host = netns_host("gp64o")?;
    let (containerd, cri, runtime) = start_node(&host).await?;
    let mut hog = sh("hog", "x=$(head -c 64m /dev/zero | tr '\\0' a); echo survived ${#x}");
    hog["resources"] = json!({ "limits": { "memory": "16Mi" } });
    let mut failed_hook = sh("failed-hook", "exec sleep 3600");
    failed_hook["lifecycle"] = json!({ "postStart": { "exec": { "command": ["sh", "-c", "echo no >&2; exit 7"] } } });
    let ending = pod(
        "ending",
        &host,
        json!({
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 2,
            "containers": [sh("ok", "true"), sh("fails", "exit 3"), hog, failed_hook],
        }),
    )?;
    let mut worker = Worker::start(&runtime, &ending);
    let status = worker
        .wait(Duration::from_secs(60), |_| {}, |s| (s.phase.as_deref() == Some("Failed")).then(|| s.clone()))
        .await?;
    let outcome = |name: &str| container(&status, name).and_then(terminated);
    ensure!(outcome("ok") == Some(("Completed".into(), 0)), "{status:#?}");
    ensure!(outcome("fails") == Some(("Error".into(), 3)), "{status:#?}");
    ensure!(outcome("hog") == Some(("OOMKilled".into(), 137)), "the memory hog: {:#?}", container(&status, "hog"));
    // A failed postStart hook kills the container (after its grace period: `sleep` as PID 1
    // does not die of SIGTERM).
    let hooked = outcome("failed-hook").context("the container whose postStart failed")?;
    ensure!(hooked.1 != 0, "{status:#?}");
    ensure!(condition(&status, "Ready").as_deref() == Some("False"), "{status:#?}");
    worker.stop().await;
    kill(&runtime, &cri, &ending, Duration::from_secs(2)).await?;
    containerd.stop().await?;
    Ok(())
}

/// What the node holds of pod `uid`: sandboxes and containers in containerd, its cgroups, and
/// its directories (emptyDirs, logs).
async fn left_of(host: &NetnsHost, cri: &Cri, uid: &str) -> Result<Vec<String>> {
    let selector: std::collections::HashMap<String, String> =
        [("io.kubernetes.pod.uid".to_string(), uid.to_string())].into();
    let filter = pb::PodSandboxFilter { label_selector: selector.clone(), ..Default::default() };
    let sandboxes = cri.runtime().list_pod_sandbox(pb::ListPodSandboxRequest { filter: Some(filter) }).await?;
    let filter = pb::ContainerFilter { label_selector: selector, ..Default::default() };
    let containers = cri.runtime().list_containers(pb::ListContainersRequest { filter: Some(filter) }).await?;
    let mut left: Vec<String> = sandboxes.into_inner().items.into_iter().map(|s| format!("sandbox {}", s.id)).collect();
    left.extend(containers.into_inner().containers.into_iter().map(|c| format!("container {}", c.id)));
    for hierarchy in std::fs::read_dir("/sys/fs/cgroup")?.flatten() {
        let dir = hierarchy.path().join(host.cgroup_parent().trim_start_matches('/')).join(format!("pod{uid}"));
        if dir.exists() {
            left.push(dir.display().to_string());
        }
    }
    let pod_dir = host.dir().join("pods").join(uid);
    if pod_dir.exists() {
        left.push(pod_dir.display().to_string());
    }
    for entry in std::fs::read_dir(host.dir().join("logs")).into_iter().flatten().flatten() {
        if entry.file_name().to_string_lossy().ends_with(uid) {
            left.push(entry.path().display().to_string());
        }
    }
    Ok(left)
}

/// A Pod deleted while its sandbox is being created: its pod worker finishes that sync, then
/// kills (the agent serializes both per Pod); a sync cut off mid-way (the agent stopping, a CRI
/// deadline) leaves what containerd finished to the kill after it. Either way nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t64_pod_deleted_while_its_sandbox_is_created_leaves_nothing() -> Result<()> {
    require_root()?;
    let host = netns_host("gp64d")?;
    let (containerd, cri, runtime) = start_node(&host).await?;
    for (name, cut_after) in
        [("finished", None), ("cut-10ms", Some(10)), ("cut-100ms", Some(100)), ("cut-300ms", Some(300))]
    {
        let mut app = sh("app", "exec sleep 3600");
        app["volumeMounts"] = json!([{ "name": "scratch", "mountPath": "/scratch" }]);
        let doomed =
            pod(name, &host, json!({ "volumes": [{ "name": "scratch", "emptyDir": {} }], "containers": [app] }))?;
        let uid = doomed.metadata.uid.clone().unwrap_or_default();
        let sync = {
            let (runtime, doomed) = (runtime.clone(), doomed.clone());
            tokio::spawn(async move { runtime.sync_pod(&doomed, &PodProbes::default()).await })
        };
        match cut_after {
            // The deletion arrives once the sandbox exists; the worker's sync runs to its end.
            None => {
                let seen = gitplane_e2e::wait_for_async(Duration::from_secs(30), || async {
                    left_of(&host, &cri, &uid).await.ok().filter(|l| l.iter().any(|s| s.starts_with("sandbox")))
                })
                .await;
                ensure!(seen.is_some(), "no sandbox of {uid} appeared");
                sync.await??;
            }
            Some(ms) => {
                tokio::time::sleep(Duration::from_millis(ms)).await;
                sync.abort();
                let _ = sync.await;
            }
        }
        kill(&runtime, &cri, &doomed, Duration::from_secs(2)).await?;
        // Nothing is left, and nothing turns up later from a call containerd was still making:
        // a pod cgroup that such a call makes after the kill is the agent's housekeeping's to
        // remove (the kubelet's orphaned pod cgroup cleanup), which runs here each round.
        for _ in 0..3 {
            runtime.remove_orphaned_cgroups(&std::collections::HashSet::new()).await?;
            let left = left_of(&host, &cri, &uid).await?;
            ensure!(left.is_empty(), "{name}: left behind: {left:?}");
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
    containerd.stop().await?;
    Ok(())
}
