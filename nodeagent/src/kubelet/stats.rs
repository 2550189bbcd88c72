//! Resource usage for `kubectl top`: the kubelet's stats provider and its Summary API
//! (`GET /stats/summary` on the kubelet endpoint), which the control plane turns into the
//! `metrics.k8s.io` API as metrics-server does.
//!
//! The node's CPU and memory come from the host (`/proc/stat`, `/proc/meminfo`: with
//! `gitplane up --nodes`, nodes share one machine and each reports it whole); each running
//! container's from CRI `ListContainerStats` (cumulative CPU time and the working set of its
//! cgroup). CPU usage is a rate, so it takes two samples: the provider keeps the last one it
//! took and, when it has none from the last [`MAX_WINDOW`], takes a first one and a second
//! [`MIN_WINDOW`] later. Nothing is sampled while nobody asks, so `kubectl top` costs an idle
//! node nothing.

use crate::{
    kubelet::cri::{Cri, pb},
    kubelet::runtime::spec::{LABEL_CONTAINER_NAME, LABEL_POD_NAME, LABEL_POD_NAMESPACE, LABEL_POD_UID},
};
use gitplane_kubelet::stats::{ContainerStats, CpuStats, MemoryStats, NodeStats, PodReference, PodStats, Summary};
use k8s_openapi::jiff::Timestamp;
use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

/// The shortest window a CPU rate is measured over.
pub const MIN_WINDOW: Duration = Duration::from_secs(1);
/// An older sample is not used as the start of a window.
pub const MAX_WINDOW: Duration = Duration::from_secs(60);

/// Why usage could not be read.
#[derive(Debug, thiserror::Error)]
pub enum StatsError {
    #[error("reading {file}: {source}")]
    Host { file: &'static str, source: std::io::Error },
    #[error("{file} has no {what}")]
    Unparsable { file: &'static str, what: &'static str },
    #[error("the container runtime's ListContainerStats: {0}")]
    Runtime(String),
}

/// One container at one moment.
#[derive(Clone, Debug, PartialEq)]
pub struct ContainerSample {
    pub pod: PodReference,
    pub name: String,
    pub cpu_core_nano_seconds: u64,
    pub working_set_bytes: u64,
}

/// Everything at one moment.
#[derive(Clone, Debug)]
pub struct Sample {
    pub taken: Instant,
    pub node_cpu_core_nano_seconds: u64,
    pub node_working_set_bytes: u64,
    /// By container id.
    pub containers: BTreeMap<String, ContainerSample>,
}

/// Busy CPU time of the whole machine from `/proc/stat`'s first line, in core-nanoseconds
/// (USER_HZ is 100 on Linux: a tick is 10 ms). Idle and iowait are not busy; guest time is
/// already counted in user.
pub fn proc_stat_busy(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let ticks: Vec<u64> = line.split_whitespace().skip(1).map(|v| v.parse().ok()).collect::<Option<_>>()?;
    let at = |i: usize| ticks.get(i).copied().unwrap_or(0);
    // user nice system idle iowait irq softirq steal
    let busy = at(0) + at(1) + at(2) + at(5) + at(6) + at(7);
    Some(busy * 10_000_000)
}

/// Memory in use from `/proc/meminfo`: MemTotal - MemAvailable, in bytes.
pub fn meminfo_used(text: &str) -> Option<u64> {
    let field = |name: &str| {
        text.lines().find_map(|l| l.strip_prefix(name)?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
    };
    Some(field("MemTotal:")?.saturating_sub(field("MemAvailable:")?) * 1024)
}

fn rate(before: u64, after: u64, window: Duration) -> u64 {
    let nanos = window.as_nanos().max(1);
    u64::try_from(u128::from(after.saturating_sub(before)) * 1_000_000_000 / nanos).unwrap_or(u64::MAX)
}

/// The Summary between two samples. A container without a sample in `before` (it started
/// within the window) has no CPU rate yet, and its Pod is left out until it has one, as
/// metrics-server leaves it out.
pub fn summarize(node_name: &str, before: &Sample, after: &Sample, time: &str) -> Summary {
    let window = after.taken.saturating_duration_since(before.taken);
    let cpu = |b: u64, a: u64| CpuStats {
        time: time.to_owned(),
        usage_nano_cores: rate(b, a, window),
        usage_core_nano_seconds: a,
    };
    let memory = |bytes: u64| MemoryStats { time: time.to_owned(), working_set_bytes: bytes };
    let mut pods: BTreeMap<PodReference, Option<Vec<ContainerStats>>> = BTreeMap::new();
    for (id, c) in &after.containers {
        let entry = pods.entry(c.pod.clone()).or_insert_with(|| Some(Vec::new()));
        match (before.containers.get(id), entry.as_mut()) {
            (Some(b), Some(containers)) => containers.push(ContainerStats {
                name: c.name.clone(),
                cpu: Some(cpu(b.cpu_core_nano_seconds, c.cpu_core_nano_seconds)),
                memory: Some(memory(c.working_set_bytes)),
            }),
            _ => *entry = None,
        }
    }
    Summary {
        node: NodeStats {
            node_name: node_name.to_owned(),
            cpu: Some(cpu(before.node_cpu_core_nano_seconds, after.node_cpu_core_nano_seconds)),
            memory: Some(memory(after.node_working_set_bytes)),
        },
        pods: pods
            .into_iter()
            .filter_map(|(pod_ref, containers)| Some(PodStats { pod_ref, containers: containers? }))
            .collect(),
        window_milliseconds: u64::try_from(window.as_millis()).unwrap_or(u64::MAX),
    }
}

/// Takes samples on demand and keeps the last.
#[derive(Default)]
pub struct StatsProvider {
    last: tokio::sync::Mutex<Option<Sample>>,
}

impl StatsProvider {
    /// Usage now, over a window of at least [`MIN_WINDOW`].
    pub async fn summary(&self, cri: &Cri, node_name: &str) -> Result<Summary, StatsError> {
        // One caller samples at a time; the others then reuse its sample as their start.
        let mut last = self.last.lock().await;
        let before = match last.take().filter(|s| s.taken.elapsed() < MAX_WINDOW) {
            Some(before) => before,
            None => sample(cri).await?,
        };
        tokio::time::sleep(MIN_WINDOW.saturating_sub(before.taken.elapsed())).await;
        let after = sample(cri).await?;
        let summary = summarize(node_name, &before, &after, &Timestamp::now().to_string());
        *last = Some(after);
        Ok(summary)
    }
}

async fn read(file: &'static str) -> Result<String, StatsError> {
    tokio::fs::read_to_string(file).await.map_err(|source| StatsError::Host { file, source })
}

async fn sample(cri: &Cri) -> Result<Sample, StatsError> {
    let request = pb::ListContainerStatsRequest { filter: None };
    let stats = cri
        .runtime()
        .list_container_stats(request)
        .await
        .map_err(|s| StatsError::Runtime(s.message().to_owned()))?
        .into_inner()
        .stats;
    let taken = Instant::now();
    let node_cpu = proc_stat_busy(&read("/proc/stat").await?)
        .ok_or(StatsError::Unparsable { file: "/proc/stat", what: "cpu line" })?;
    let node_memory = meminfo_used(&read("/proc/meminfo").await?)
        .ok_or(StatsError::Unparsable { file: "/proc/meminfo", what: "MemTotal and MemAvailable" })?;
    let containers = stats
        .into_iter()
        .filter_map(|s| {
            let attributes = s.attributes?;
            let label = |key: &str| attributes.labels.get(key).cloned();
            let pod = PodReference {
                namespace: label(LABEL_POD_NAMESPACE)?,
                name: label(LABEL_POD_NAME)?,
                uid: label(LABEL_POD_UID)?,
            };
            let sample = ContainerSample {
                pod,
                name: label(LABEL_CONTAINER_NAME)?,
                cpu_core_nano_seconds: s.cpu?.usage_core_nano_seconds?.value,
                working_set_bytes: s.memory.and_then(|m| m.working_set_bytes).map_or(0, |w| w.value),
            };
            Some((attributes.id, sample))
        })
        .collect();
    Ok(Sample { taken, node_cpu_core_nano_seconds: node_cpu, node_working_set_bytes: node_memory, containers })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_host() {
        let stat = "cpu  100 5 50 1000 20 3 2 1 7 0\ncpu0 50 2 25 500 10 1 1 0 0 0\n";
        assert_eq!(proc_stat_busy(stat), Some((100 + 5 + 50 + 3 + 2 + 1) * 10_000_000));
        assert_eq!(proc_stat_busy("intr 1 2 3\n"), None);
        assert_eq!(proc_stat_busy("cpu  1 x 3\n"), None);
        let meminfo = "MemTotal:       16000 kB\nMemFree:  1000 kB\nMemAvailable:   12000 kB\n";
        assert_eq!(meminfo_used(meminfo), Some(4000 * 1024));
        assert_eq!(meminfo_used("MemTotal: 5 kB\n"), None);
    }

    fn container(pod: &str, name: &str, cpu: u64) -> ContainerSample {
        let pod = PodReference { namespace: "default".into(), name: pod.into(), uid: format!("uid-{pod}") };
        ContainerSample { pod, name: name.into(), cpu_core_nano_seconds: cpu, working_set_bytes: 4096 }
    }

    #[test]
    fn rates_come_from_two_samples() {
        let start = Instant::now();
        let before = Sample {
            taken: start,
            node_cpu_core_nano_seconds: 1_000_000_000,
            node_working_set_bytes: 1 << 30,
            containers: BTreeMap::from([("a".into(), container("web", "httpd", 10_000_000))]),
        };
        let after = Sample {
            taken: start + Duration::from_secs(2),
            node_cpu_core_nano_seconds: 2_000_000_000,
            node_working_set_bytes: 2 << 30,
            containers: BTreeMap::from([
                ("a".into(), container("web", "httpd", 110_000_000)),
                ("b".into(), container("new", "httpd", 5_000_000)),
            ]),
        };
        let summary = summarize("n1", &before, &after, "2026-12-03T00:00:00Z");
        assert_eq!(summary.window_milliseconds, 2000);
        let node_cpu = summary.node.cpu.clone().unwrap();
        // 1 s of CPU over 2 s: half a core.
        assert_eq!(node_cpu.usage_nano_cores, 500_000_000);
        assert_eq!(summary.node.memory.as_ref().unwrap().working_set_bytes, 2 << 30);
        // The Pod that started within the window has no rate yet and is left out.
        assert_eq!(summary.pods.len(), 1, "{summary:?}");
        let web = &summary.pods[0];
        assert_eq!(web.pod_ref.name, "web");
        assert_eq!(web.containers[0].cpu.as_ref().unwrap().usage_nano_cores, 50_000_000);
        // A counter that went backwards (a restarted container) is no negative usage.
        let restarted = Sample { containers: BTreeMap::from([("a".into(), container("web", "httpd", 1))]), ..after };
        let summary = summarize("n1", &before, &restarted, "t");
        assert_eq!(summary.pods[0].containers[0].cpu.as_ref().unwrap().usage_nano_cores, 0);
    }
}
