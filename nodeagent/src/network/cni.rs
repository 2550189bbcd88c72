//! The CNI network configuration that containerd's CRI plugin runs for every pod sandbox:
//! a `bridge` with host-local IPAM over the node's podCIDR, then `portmap` for hostPorts. The
//! bridge does not masquerade (`ipMasq: false`): the agent's own rule does, for traffic that
//! leaves the cluster's ranges only (`routes::masquerade`).

use std::io;
use std::path::{Path, PathBuf};

use minijinja::context;

const CONFLIST_TEMPLATE: &str = include_str!("../../../templates/cni-conflist.json.j2");

/// The file name containerd finds first (it loads only one: `max_conf_num = 1`).
pub const CONFLIST_FILE: &str = "10-gitplane.conflist";

#[derive(Debug, thiserror::Error)]
pub enum CniError {
    #[error("podCIDR {pod_cidr:?} is not an IP network in CIDR notation (e.g. 10.244.1.0/24)")]
    InvalidPodCidr { pod_cidr: String },
    #[error("bridge name {bridge:?} is not a Linux interface name (1-15 characters, no '/' or spaces)")]
    InvalidBridge { bridge: String },
    #[error("writing CNI conflist {path}: {source}")]
    Write { path: PathBuf, source: io::Error },
}

/// The conflist for a node whose pods get addresses from `pod_cidr` on bridge `bridge`;
/// host-local keeps its allocations in `data_dir`.
pub fn render_conflist(network_name: &str, bridge: &str, pod_cidr: &str, data_dir: &Path) -> String {
    let ctx = context! {
        network_name,
        bridge,
        pod_cidr,
        data_dir => data_dir.to_string_lossy(),
    };
    // The template is embedded and every variable is given: failure is a bug, not input.
    crate::template::render("cni-conflist.json.j2", CONFLIST_TEMPLATE, ctx)
        .expect("embedded CNI conflist template renders")
}

/// Validates the inputs and replaces `conf_dir/10-gitplane.conflist` atomically (temp file +
/// rename), so containerd never loads a half-written network config.
pub fn write_conflist(
    conf_dir: &Path,
    network_name: &str,
    bridge: &str,
    pod_cidr: &str,
    data_dir: &Path,
) -> Result<PathBuf, CniError> {
    if !is_cidr(pod_cidr) {
        return Err(CniError::InvalidPodCidr { pod_cidr: pod_cidr.to_string() });
    }
    if bridge.is_empty() || bridge.len() > 15 || bridge.contains(['/', ' ', '\0']) {
        return Err(CniError::InvalidBridge { bridge: bridge.to_string() });
    }
    let path = conf_dir.join(CONFLIST_FILE);
    let text = render_conflist(network_name, bridge, pod_cidr, data_dir);
    write_atomic(&path, text.as_bytes()).map_err(|source| CniError::Write { path: path.clone(), source })?;
    Ok(path)
}

/// Writes `path` through a temp file in the same directory and a rename.
pub(crate) fn write_atomic(path: &Path, contents: &[u8]) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp{}", std::process::id()));
    std::fs::write(&tmp, contents)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

fn is_cidr(text: &str) -> bool {
    let Some((addr, prefix)) = text.split_once('/') else {
        return false;
    };
    let Ok(prefix) = prefix.parse::<u8>() else {
        return false;
    };
    match addr.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(_)) => prefix <= 32,
        Ok(std::net::IpAddr::V6(_)) => prefix <= 128,
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    #[test]
    fn conflist_is_bridge_then_portmap() {
        let text = render_conflist("gitplane", "gp0", "10.244.1.0/24", Path::new("/var/lib/gp/cni"));
        let conf: Value = serde_json::from_str(&text).expect("conflist is JSON");
        assert_eq!(
            conf,
            json!({
                "cniVersion": "1.0.0",
                "name": "gitplane",
                "plugins": [
                    {
                        "type": "bridge",
                        "bridge": "gp0",
                        "isGateway": true,
                        "ipMasq": false,
                        "hairpinMode": true,
                        "ipam": {
                            "type": "host-local",
                            "ranges": [[{ "subnet": "10.244.1.0/24" }]],
                            "routes": [{ "dst": "0.0.0.0/0" }],
                            "dataDir": "/var/lib/gp/cni"
                        }
                    },
                    { "type": "portmap", "capabilities": { "portMappings": true } }
                ]
            })
        );
    }

    #[test]
    fn odd_paths_stay_valid_json() {
        let text = render_conflist("n\"1", "gp0", "10.244.1.0/24", Path::new("/tmp/a \"b\\c"));
        let conf: Value = serde_json::from_str(&text).expect("conflist is JSON");
        assert_eq!(conf["name"], "n\"1");
        assert_eq!(conf["plugins"][0]["ipam"]["dataDir"], "/tmp/a \"b\\c");
    }

    #[test]
    fn write_is_validated_and_replaces() {
        let dir = std::env::temp_dir().join(format!("gp-cni-test-{}", std::process::id()));
        let data = dir.join("data");
        assert!(matches!(
            write_conflist(&dir, "gitplane", "gp0", "10.244.1.0", &data),
            Err(CniError::InvalidPodCidr { .. })
        ));
        assert!(matches!(
            write_conflist(&dir, "gitplane", "a-very-long-bridge-name", "10.244.1.0/24", &data),
            Err(CniError::InvalidBridge { .. })
        ));
        let path = write_conflist(&dir, "gitplane", "gp0", "10.244.1.0/24", &data).expect("written");
        write_conflist(&dir, "gitplane", "gp0", "10.244.2.0/24", &data).expect("rewritten");
        let conf: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("JSON");
        assert_eq!(conf["plugins"][0]["ipam"]["ranges"][0][0]["subnet"], "10.244.2.0/24");
        let names: Vec<_> = std::fs::read_dir(&dir).expect("dir").flatten().map(|e| e.file_name()).collect();
        assert_eq!(names, [CONFLIST_FILE], "no temp file left behind");
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
