//! The Node object this agent registers: capacity read from the host.

use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeStatus, NodeSystemInfo};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::BTreeMap;

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

/// The Node as this host describes it.
pub fn describe(name: &str, address: Option<&str>, runtime_version: &str) -> Node {
    let (kernel, machine) = uname();
    let mut capacity = BTreeMap::new();
    capacity.insert("cpu".to_owned(), Quantity(cpu_count().to_string()));
    if let Some(bytes) = memory_bytes() {
        capacity.insert("memory".to_owned(), Quantity(format!("{}Ki", bytes / 1024)));
    }
    capacity.insert("pods".to_owned(), Quantity(MAX_PODS.to_string()));
    let labels = BTreeMap::from([
        ("kubernetes.io/hostname".to_owned(), name.to_owned()),
        ("kubernetes.io/os".to_owned(), "linux".to_owned()),
        ("kubernetes.io/arch".to_owned(), go_arch(&machine).to_owned()),
    ]);
    let mut addresses = vec![NodeAddress { type_: "Hostname".into(), address: name.into() }];
    if let Some(ip) = address {
        addresses.insert(0, NodeAddress { type_: "InternalIP".into(), address: ip.into() });
    }
    Node {
        metadata: ObjectMeta { name: Some(name.to_owned()), labels: Some(labels), ..Default::default() },
        spec: None,
        status: Some(NodeStatus {
            allocatable: Some(capacity.clone()),
            capacity: Some(capacity),
            addresses: Some(addresses),
            node_info: Some(NodeSystemInfo {
                architecture: go_arch(&machine).to_owned(),
                kernel_version: kernel,
                os_image: os_image(),
                operating_system: "linux".into(),
                container_runtime_version: runtime_version.to_owned(),
                kubelet_version: format!("gitplane-agent/{}", env!("CARGO_PKG_VERSION")),
                ..Default::default()
            }),
            ..Default::default()
        }),
    }
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
    fn describes_capacity_and_labels() {
        let node = describe("n1", Some("10.0.0.2"), "containerd://1.6.20");
        let status = node.status.unwrap();
        let capacity = status.capacity.unwrap();
        assert!(capacity.contains_key("cpu") && capacity.contains_key("pods"));
        assert_eq!(status.addresses.unwrap()[0].address, "10.0.0.2");
        assert_eq!(node.metadata.labels.unwrap()["kubernetes.io/hostname"], "n1");
    }
}
