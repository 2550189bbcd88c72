//! The Node object this agent registers and keeps up to date: capacity read from the host,
//! allocatable after the reserves and the hard eviction thresholds, labels and taints from the
//! agent's flags, the pressure conditions ([`pressure`]) and the images present.

pub mod pressure;

use gitplane_api::quantity::{parse_milli, parse_units};
use gitplane_api::volumes::LOCAL_PATH_DIR;
use k8s_openapi::api::core::v1::{
    ContainerImage, Node, NodeAddress, NodeCondition, NodeSpec, NodeStatus, NodeSystemInfo, Taint,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use pressure::{EvictionHard, Signals};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// How many images a Node lists, largest first (the kubelet's nodeStatusMaxImages).
const MAX_IMAGES: usize = 50;

/// What the node's flags say about it.
#[derive(Clone, Debug, Default)]
pub struct NodeConfig {
    /// `--node-labels`, on top of the well-known labels the agent sets.
    pub labels: BTreeMap<String, String>,
    /// `--register-with-taints`: set when the Node is first registered.
    pub taints: Vec<Taint>,
    /// `--system-reserved` and `--kube-reserved`, added up.
    pub reserved: Reserved,
    pub eviction_hard: EvictionHard,
    /// The file system that holds Pods' data (nodefs): ephemeral storage and DiskPressure.
    pub nodefs: PathBuf,
    /// Where the volumes gitplane.io/local-path provisions on this node live, reported on the
    /// Node for the provisioner.
    pub local_path_dir: PathBuf,
    /// `--extended-resources`: counts of resources the node advertises (`nvidia.com/gpu`).
    pub extended_resources: BTreeMap<String, u64>,
}

/// Resources kept back from Pods (the kubelet's `--system-reserved` / `--kube-reserved`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Reserved {
    pub cpu_milli: u64,
    pub memory: u64,
    pub ephemeral_storage: u64,
}

impl std::ops::Add for Reserved {
    type Output = Reserved;
    fn add(self, o: Reserved) -> Reserved {
        Reserved {
            cpu_milli: self.cpu_milli + o.cpu_milli,
            memory: self.memory + o.memory,
            ephemeral_storage: self.ephemeral_storage + o.ephemeral_storage,
        }
    }
}

impl std::str::FromStr for Reserved {
    type Err = String;

    /// `cpu=100m,memory=256Mi,ephemeral-storage=1Gi` (the kubelet's syntax).
    fn from_str(text: &str) -> Result<Self, String> {
        let mut out = Reserved::default();
        for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (name, value) =
                item.split_once('=').ok_or_else(|| format!("{item:?}: expected <resource>=<quantity>"))?;
            let bad = || format!("{item:?}: {value:?} is not a non-negative quantity");
            let parse = |milli: bool| {
                let v = if milli { parse_milli(value) } else { parse_units(value) };
                v.and_then(|v| u64::try_from(v).ok()).ok_or_else(bad)
            };
            match name {
                "cpu" => out.cpu_milli = parse(true)?,
                "memory" => out.memory = parse(false)?,
                "ephemeral-storage" => out.ephemeral_storage = parse(false)?,
                other => return Err(format!("{other:?}: reserve cpu, memory or ephemeral-storage")),
            }
        }
        Ok(out)
    }
}

/// `key=value` pairs, comma-separated (`--node-labels`).
pub fn parse_labels(text: &str) -> Result<BTreeMap<String, String>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|i| !i.is_empty())
        .map(|item| {
            let (k, v) = item.split_once('=').ok_or_else(|| format!("{item:?}: expected <key>=<value>"))?;
            Ok((k.to_owned(), v.to_owned()))
        })
        .collect()
}

/// `domain/name=count` items, comma-separated (`--extended-resources`): names as the API
/// server allows extended resources (a domain outside kubernetes.io), whole counts.
pub fn parse_extended_resources(text: &str) -> Result<BTreeMap<String, u64>, String> {
    let mut resources = BTreeMap::new();
    for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (name, count) =
            item.split_once('=').ok_or_else(|| format!("{item:?}: expected <domain>/<name>=<count>"))?;
        let (domain, short) = name.split_once('/').unwrap_or_default();
        let valid_name = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-._".contains(c));
        if !valid_name(domain) || !valid_name(short) || !domain.contains('.') {
            return Err(format!("{item:?}: name an extended resource as <domain>/<name>, e.g. example.com/foo"));
        }
        if domain == "kubernetes.io" || domain.ends_with(".kubernetes.io") {
            return Err(format!("{item:?}: the kubernetes.io domain is Kubernetes' own; use a domain of yours"));
        }
        let count = count.parse().map_err(|_| format!("{item:?}: {count:?} is not a whole count"))?;
        resources.insert(name.to_owned(), count);
    }
    Ok(resources)
}

/// `key[=value]:Effect` items, comma-separated (`--register-with-taints`).
pub fn parse_taints(text: &str) -> Result<Vec<Taint>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|i| !i.is_empty())
        .map(|item| {
            let (kv, effect) =
                item.rsplit_once(':').ok_or_else(|| format!("{item:?}: expected <key>[=<value>]:<effect>"))?;
            if !["NoSchedule", "PreferNoSchedule", "NoExecute"].contains(&effect) {
                return Err(format!("{item:?}: the effect is NoSchedule, PreferNoSchedule or NoExecute"));
            }
            let (key, value) = match kv.split_once('=') {
                Some((k, v)) => (k, Some(v.to_owned())),
                None => (kv, None),
            };
            if key.is_empty() {
                return Err(format!("{item:?}: the taint has no key"));
            }
            Ok(Taint { key: key.to_owned(), value, effect: effect.to_owned(), time_added: None })
        })
        .collect()
}

/// Pods per node, as the kubelet's default `maxPods`.
const MAX_PODS: i64 = 110;

/// The host name, the default node name.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_owned()).unwrap_or_else(|_| "node".into())
}

/// The host's online CPUs.
pub fn cpu_count() -> i64 {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    if n > 0 { n as i64 } else { 1 }
}

/// `MemTotal` of /proc/meminfo in bytes.
pub fn memory_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_mem_total(&meminfo)
}

fn parse_mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

fn uname() -> (String, String) {
    // SAFETY: utsname is plain data filled in by the kernel.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    if unsafe { libc::uname(&mut u) } != 0 {
        return (String::new(), String::new());
    }
    let field = |f: &[libc::c_char]| {
        let bytes: Vec<u8> = f.iter().take_while(|c| **c != 0).map(|c| *c as u8).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    (field(&u.release), field(&u.machine))
}

fn os_image() -> String {
    std::fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("PRETTY_NAME=").map(|v| v.trim_matches('"').to_owned())))
        .unwrap_or_else(|| "Linux".into())
}

/// Go's GOARCH names, which Kubernetes uses in `kubernetes.io/arch`.
fn go_arch(machine: &str) -> &str {
    match machine {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// The Node as this host describes it when it registers.
pub fn describe(name: &str, address: Option<&str>, runtime_version: &str, cfg: &NodeConfig) -> Node {
    let (_, machine) = uname();
    let mut labels = cfg.labels.clone();
    labels.insert("kubernetes.io/hostname".to_owned(), name.to_owned());
    labels.insert("kubernetes.io/os".to_owned(), "linux".to_owned());
    labels.insert("kubernetes.io/arch".to_owned(), go_arch(&machine).to_owned());
    let mut addresses = vec![NodeAddress { type_: "Hostname".into(), address: name.into() }];
    if let Some(ip) = address {
        addresses.insert(0, NodeAddress { type_: "InternalIP".into(), address: ip.into() });
    }
    let mut status =
        status(cfg, &host_signals(&cfg.nodefs), &[], Vec::new(), Time(k8s_openapi::jiff::Timestamp::now()));
    status.addresses = Some(addresses);
    status.node_info = Some(node_info(runtime_version));
    Node {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(labels),
            annotations: Some([(LOCAL_PATH_DIR.to_owned(), cfg.local_path_dir.to_string_lossy().into_owned())].into()),
            ..Default::default()
        },
        spec: Some(NodeSpec { taints: Some(cfg.taints.clone()).filter(|t| !t.is_empty()), ..Default::default() }),
        status: Some(status),
    }
}

fn node_info(runtime_version: &str) -> NodeSystemInfo {
    let (kernel, machine) = uname();
    NodeSystemInfo {
        architecture: go_arch(&machine).to_owned(),
        kernel_version: kernel,
        os_image: os_image(),
        operating_system: "linux".into(),
        container_runtime_version: runtime_version.to_owned(),
        kubelet_version: format!("gitplane-agent/{}", env!("CARGO_PKG_VERSION")),
        ..Default::default()
    }
}

/// What the node reports of itself: capacity, allocatable (capacity less the reserves and the
/// hard eviction thresholds, as the kubelet computes it), the pressure conditions (keeping the
/// times of unchanged ones from `previous`) and its images, largest first.
pub fn status(
    cfg: &NodeConfig,
    signals: &Signals,
    previous: &[NodeCondition],
    mut images: Vec<ContainerImage>,
    now: Time,
) -> NodeStatus {
    let cpu_milli = cpu_count() as u64 * 1000;
    let mut capacity = BTreeMap::new();
    let mut allocatable = BTreeMap::new();
    let reserved = cfg.reserved;
    capacity.insert("cpu".to_owned(), Quantity(cpu_count().to_string()));
    allocatable.insert("cpu".to_owned(), Quantity(format!("{}m", cpu_milli.saturating_sub(reserved.cpu_milli))));
    if let Some(memory) = signals.memory_capacity {
        let evict = cfg.eviction_hard.memory_available.amount(memory);
        capacity.insert("memory".to_owned(), Quantity(format!("{}Ki", memory / 1024)));
        let left = memory.saturating_sub(reserved.memory).saturating_sub(evict);
        allocatable.insert("memory".to_owned(), Quantity(format!("{}Ki", left / 1024)));
    }
    if let Some(disk) = signals.nodefs_capacity {
        let evict = cfg.eviction_hard.nodefs_available.amount(disk);
        capacity.insert("ephemeral-storage".to_owned(), Quantity(format!("{}Ki", disk / 1024)));
        let left = disk.saturating_sub(reserved.ephemeral_storage).saturating_sub(evict);
        allocatable.insert("ephemeral-storage".to_owned(), Quantity(left.to_string()));
    }
    capacity.insert("pods".to_owned(), Quantity(MAX_PODS.to_string()));
    allocatable.insert("pods".to_owned(), Quantity(MAX_PODS.to_string()));
    for (name, count) in &cfg.extended_resources {
        capacity.insert(name.clone(), Quantity(count.to_string()));
        allocatable.insert(name.clone(), Quantity(count.to_string()));
    }
    images.sort_by(|a, b| b.size_bytes.cmp(&a.size_bytes).then_with(|| a.names.cmp(&b.names)));
    images.truncate(MAX_IMAGES);
    NodeStatus {
        capacity: Some(capacity),
        allocatable: Some(allocatable),
        conditions: Some(pressure::conditions(signals, &cfg.eviction_hard, previous, now)),
        images: Some(images).filter(|i| !i.is_empty()),
        ..Default::default()
    }
}

/// The eviction signals of this host: MemAvailable, the free space of the file system holding
/// `nodefs`, and the PIDs left.
pub fn host_signals(nodefs: &Path) -> Signals {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let kib = |field: &str| -> Option<u64> {
        let line = meminfo.lines().find(|l| l.starts_with(field))?;
        Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
    };
    let (nodefs_available, nodefs_capacity) = statvfs(nodefs).unzip();
    let pid_capacity =
        std::fs::read_to_string("/proc/sys/kernel/pid_max").ok().and_then(|s| s.trim().parse::<u64>().ok());
    // /proc/loadavg's fourth field: running/total scheduling entities (threads), each holding a PID.
    let in_use = std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().nth(3)?.split_once('/')?.1.parse::<u64>().ok());
    Signals {
        memory_available: kib("MemAvailable:"),
        memory_capacity: kib("MemTotal:"),
        nodefs_available,
        nodefs_capacity,
        pid_available: pid_capacity.zip(in_use).map(|(max, used)| max.saturating_sub(used)),
        pid_capacity,
    }
}

/// Free (for unprivileged users) and total bytes of the file system holding `path`, or of its
/// nearest existing ancestor.
fn statvfs(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let existing = path.ancestors().find(|p| p.exists())?;
    let c_path = std::ffi::CString::new(existing.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs is plain data filled in by the kernel; the path is NUL-terminated.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c_path.as_ptr(), &mut st) } != 0 {
        return None;
    }
    let block = st.f_frsize as u64;
    Some((st.f_bavail as u64 * block, st.f_blocks as u64 * block))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_mem_total() {
        assert_eq!(parse_mem_total("MemTotal:       24576000 kB\nMemFree: 1 kB\n"), Some(24576000 * 1024));
        assert_eq!(parse_mem_total("nothing"), None);
    }

    #[test]
    fn describes_capacity_labels_and_taints() {
        let cfg = NodeConfig {
            labels: parse_labels("disk=ssd,kubernetes.io/hostname=spoofed").unwrap(),
            taints: parse_taints("dedicated=db:NoSchedule").unwrap(),
            ..Default::default()
        };
        let node = describe("n1", Some("10.0.0.2"), "containerd://1.6.20", &cfg);
        let status = node.status.unwrap();
        let capacity = status.capacity.unwrap();
        assert!(capacity.contains_key("cpu") && capacity.contains_key("pods"));
        assert_eq!(status.addresses.unwrap()[0].address, "10.0.0.2");
        let labels = node.metadata.labels.unwrap();
        assert_eq!((labels["kubernetes.io/hostname"].as_str(), labels["disk"].as_str()), ("n1", "ssd"));
        assert_eq!(node.spec.unwrap().taints.unwrap()[0].key, "dedicated");
        assert!(node.metadata.annotations.unwrap().contains_key(LOCAL_PATH_DIR));
    }

    #[test]
    fn allocatable_is_capacity_less_reserves_and_eviction() {
        let cfg = NodeConfig {
            reserved: "cpu=500m,memory=1Gi".parse::<Reserved>().unwrap() + "memory=1Gi".parse().unwrap(),
            ..Default::default()
        };
        let signals = Signals {
            memory_capacity: Some(8 << 30),
            memory_available: Some(4 << 30),
            nodefs_capacity: Some(100 << 30),
            nodefs_available: Some(50 << 30),
            ..Default::default()
        };
        let image = |name: &str, size| ContainerImage { names: Some(vec![name.into()]), size_bytes: Some(size) };
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let status = status(&cfg, &signals, &[], vec![image("small", 1), image("big", 9)], now);
        let allocatable = status.allocatable.unwrap();
        let cpu = (cpu_count() * 1000 - 500).to_string() + "m";
        assert_eq!(allocatable["cpu"].0, cpu);
        // 8 GiB - 2 GiB reserved - 100 MiB hard eviction threshold.
        assert_eq!(allocatable["memory"].0, format!("{}Ki", ((6u64 << 30) - (100 << 20)) / 1024));
        // 100 GiB - 1 GiB hard eviction threshold.
        assert_eq!(allocatable["ephemeral-storage"].0, (99u64 << 30).to_string());
        assert_eq!(status.images.unwrap()[0].names.as_ref().unwrap()[0], "big");
    }

    #[test]
    fn flags_are_checked() {
        assert!("gpu=1".parse::<Reserved>().is_err());
        assert!("memory=-1Gi".parse::<Reserved>().is_err());
        assert!(parse_labels("nokey").is_err());
        assert!(parse_taints("a=b:Sometimes").is_err());
        assert!(parse_taints(":NoSchedule").is_err());
        let t = parse_taints("gpu:NoExecute").unwrap();
        assert_eq!((t[0].key.as_str(), t[0].value.as_deref(), t[0].effect.as_str()), ("gpu", None, "NoExecute"));
    }

    #[test]
    fn extended_resources_are_counted_in_capacity_and_allocatable() {
        let parsed = parse_extended_resources("nvidia.com/gpu=1, example.com/foo=4").unwrap();
        assert_eq!(parsed, [("example.com/foo".into(), 4), ("nvidia.com/gpu".into(), 1)].into());
        for (bad, why) in [
            ("gpu=1", "<domain>/<name>"),
            ("nvidia.com/gpu=1.5", "not a whole count"),
            ("kubernetes.io/foo=1", "Kubernetes' own"),
            ("nvidia.com/gpu", "expected"),
        ] {
            assert!(parse_extended_resources(bad).unwrap_err().contains(why), "{bad}");
        }
        let cfg = NodeConfig { extended_resources: parsed, ..Default::default() };
        let status = status(&cfg, &Signals::default(), &[], Vec::new(), Time(k8s_openapi::jiff::Timestamp::now()));
        for list in [status.capacity.unwrap(), status.allocatable.unwrap()] {
            assert_eq!(list["nvidia.com/gpu"].0, "1");
            assert_eq!(list["example.com/foo"].0, "4");
        }
    }
}
