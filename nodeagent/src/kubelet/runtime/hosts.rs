//! The Pod's `/etc/hosts`, as the kubelet manages it (`kubelet_pods.go` ensureEtcHosts): one
//! file per Pod at `<pod_dir>/<uid>/etc-hosts`, mounted on every container that does not mount
//! `/etc/hosts` itself. A Pod on the Pod network gets localhost, its IPs under its hostname and
//! its `hostAliases`; a Pod on the host network the node's own file and its `hostAliases`.
//! Pure: the runtime writes the content before the container is created.

use std::path::PathBuf;

use k8s_openapi::api::core::v1::{Container, HostAlias, Pod};

use super::config::RuntimeConfig;

pub const CONTAINER_PATH: &str = "/etc/hosts";
/// Where the host network's file comes from.
pub const NODE_HOSTS: &str = "/etc/hosts";

/// What goes into the Pod's hosts file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EtcHosts {
    /// The whole content, for a Pod on the Pod network.
    Managed(String),
    /// The node's file first, then these hostAliases lines (host network).
    HostNetwork(String),
}

impl EtcHosts {
    /// The file's content; `node` is the node's own hosts file (read only for the host network).
    pub fn content(&self, node: impl FnOnce() -> String) -> String {
        match self {
            EtcHosts::Managed(content) => content.clone(),
            EtcHosts::HostNetwork(aliases) => {
                format!("# Kubernetes-managed hosts file (host network).\n{}{aliases}", node())
            }
        }
    }
}

/// The Pod's hosts file on the node.
pub fn path(cfg: &RuntimeConfig, uid: &str) -> PathBuf {
    cfg.pod_dir.join(uid).join("etc-hosts")
}

/// Whether the kubelet mounts the hosts file on this container: the Pod has an IP, and the
/// container mounts nothing on `/etc/hosts` itself.
pub fn mounted_on(container: &Container, pod_ips: &[String]) -> bool {
    !pod_ips.is_empty()
        && !container.volume_mounts.iter().flatten().any(|m| m.mount_path.trim_end_matches('/') == CONTAINER_PATH)
}

/// The Pod's hosts file: `hostname` is the sandbox's (the Pod's hostname or name); with a
/// subdomain, each IP names the Pod fully qualified first
/// (`web-0.nginx.default.svc.cluster.local web-0`).
pub fn hosts_file(pod: &Pod, pod_ips: &[String], hostname: &str, cluster_domain: &str) -> EtcHosts {
    let spec = pod.spec.as_ref();
    let aliases = aliases(spec.and_then(|s| s.host_aliases.as_deref()).unwrap_or_default());
    if spec.and_then(|s| s.host_network) == Some(true) {
        return EtcHosts::HostNetwork(aliases);
    }
    let mut content = String::from(
        "# Kubernetes-managed hosts file.\n\
         127.0.0.1\tlocalhost\n\
         ::1\tlocalhost ip6-localhost ip6-loopback\n\
         fe00::0\tip6-localnet\n\
         fe00::0\tip6-mcastprefix\n\
         fe00::1\tip6-allnodes\n\
         fe00::2\tip6-allrouters\n",
    );
    let subdomain = spec.and_then(|s| s.subdomain.as_deref()).filter(|s| !s.is_empty());
    for ip in pod_ips {
        match subdomain {
            Some(subdomain) => {
                let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
                let domain = cluster_domain.trim_end_matches('.');
                content.push_str(&format!("{ip}\t{hostname}.{subdomain}.{namespace}.svc.{domain}\t{hostname}\n"));
            }
            None => content.push_str(&format!("{ip}\t{hostname}\n")),
        }
    }
    content.push_str(&aliases);
    EtcHosts::Managed(content)
}

/// The kubelet's `hostsEntriesFromHostAliases`: one line per IP with its names.
fn aliases(aliases: &[HostAlias]) -> String {
    if aliases.is_empty() {
        return String::new();
    }
    let mut lines = String::from("\n# Entries added by HostAliases.\n");
    for alias in aliases {
        let names = alias.hostnames.as_deref().unwrap_or_default().join("\t");
        lines.push_str(&format!("{}\t{names}\n", alias.ip));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(json!({"metadata": {"name": "web", "uid": "u"}, "spec": spec})).unwrap()
    }

    #[test]
    fn hosts_files_as_the_kubelet_writes_them() {
        let aliases = json!([{"ip": "10.1.2.3", "hostnames": ["foo.local", "bar.local"]}, {"ip": "10.1.2.4", "hostnames": ["baz"]}]);
        let header = "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n\
                      fe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n";
        for (spec, expected) in [
            (json!({"containers": []}), format!("{header}10.244.1.5\tweb\n")),
            (
                json!({"containers": [], "hostAliases": aliases}),
                format!("{header}10.244.1.5\tweb\n\n# Entries added by HostAliases.\n10.1.2.3\tfoo.local\tbar.local\n10.1.2.4\tbaz\n"),
            ),
            (
                json!({"containers": [], "hostNetwork": true, "hostAliases": [{"ip": "10.1.2.3", "hostnames": ["foo"]}]}),
                "# Kubernetes-managed hosts file (host network).\n127.0.0.1 node\n\n# Entries added by HostAliases.\n10.1.2.3\tfoo\n"
                    .to_owned(),
            ),
        ] {
            let file = hosts_file(&pod(spec.clone()), &["10.244.1.5".into()], "web", "cluster.local");
            assert_eq!(file.content(|| "127.0.0.1 node\n".into()), expected, "{spec}");
        }
    }

    #[test]
    fn mounted_unless_the_container_mounts_its_own() {
        let container = |mounts: serde_json::Value| -> Container {
            serde_json::from_value(json!({"name": "c", "volumeMounts": mounts})).unwrap()
        };
        let ips = ["10.244.1.5".to_owned()];
        assert!(mounted_on(&container(json!([{"name": "v", "mountPath": "/data"}])), &ips));
        assert!(!mounted_on(&container(json!([{"name": "v", "mountPath": "/etc/hosts"}])), &ips));
        assert!(!mounted_on(&container(json!([])), &[]));
    }
}
