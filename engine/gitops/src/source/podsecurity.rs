//! Kubernetes' Pod Security Standards, enforced at push time per namespace with the same labels
//! as Pod Security Admission (`pod-security.kubernetes.io/enforce|warn|audit: privileged |
//! baseline | restricted`). A Pod that runs privileged, shares the node's namespaces or mounts
//! its files is root on that node: such a Pod runs only in a namespace whose manifest in Git
//! says so. gitplane's default is `baseline` for `enforce` (Kubernetes' is `privileged`); `warn`
//! and `audit` default to nothing. Pure: a Pod spec and a level in, violations out.

use serde_json::Value;

/// A Pod Security Standard.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Privileged,
    Baseline,
    Restricted,
}

impl Level {
    pub fn parse(text: &str) -> Option<Level> {
        match text {
            "privileged" => Some(Level::Privileged),
            "baseline" => Some(Level::Baseline),
            "restricted" => Some(Level::Restricted),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Level::Privileged => "privileged",
            Level::Baseline => "baseline",
            Level::Restricted => "restricted",
        }
    }
}

/// The label prefix of Pod Security Admission's modes.
pub const LABEL: &str = "pod-security.kubernetes.io/";
/// The Event reason of a Pod its namespace's `warn` level forbids.
pub const WARNING_REASON: &str = "PodSecurityWarning";
/// The level enforced where a namespace sets none.
pub const DEFAULT_ENFORCE: Level = Level::Baseline;

/// A namespace's levels: (enforce, warn) from its labels; `audit` counts as `warn`, since
/// gitplane's audit trail of a push is what it prints and records.
pub fn levels(namespace_labels: &Value) -> (Level, Option<Level>) {
    let label = |mode: &str| namespace_labels[format!("{LABEL}{mode}")].as_str().and_then(Level::parse);
    let warn = match (label("warn"), label("audit")) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    };
    (label("enforce").unwrap_or(DEFAULT_ENFORCE), warn)
}

/// One thing the Pod spec at `at` does that `level` forbids: (JSON path, what).
pub type Violation = (String, String);

/// Capabilities `baseline` lets a container add (Docker's defaults).
const BASELINE_CAPABILITIES: [&str; 13] = [
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// Sysctls `baseline` allows (namespaced and isolated from the node).
const SAFE_SYSCTLS: [&str; 9] = [
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
];

/// Volume types `restricted` allows.
const RESTRICTED_VOLUMES: [&str; 8] =
    ["configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"];

/// Everything in the Pod spec at `at` (a JSON pointer into its manifest) that `level` forbids.
pub fn violations(spec: &Value, at: &str, level: Level) -> Vec<Violation> {
    let mut out = Vec::new();
    if level == Level::Privileged {
        return out;
    }
    let pod_context = &spec["securityContext"];
    for field in ["hostNetwork", "hostPID", "hostIPC"] {
        if spec[field] == true {
            out.push((format!("{at}/{field}"), format!("{field}: true shares the node's namespace")));
        }
    }
    for (i, volume) in spec["volumes"].as_array().into_iter().flatten().enumerate() {
        if volume.get("hostPath").is_some() {
            out.push((format!("{at}/volumes/{i}/hostPath"), "a hostPath volume mounts the node's files".into()));
        } else if level == Level::Restricted
            && let Some(kind) = volume.as_object().and_then(|v| v.keys().find(|k| *k != "name"))
            && !RESTRICTED_VOLUMES.contains(&kind.as_str())
        {
            out.push((format!("{at}/volumes/{i}/{kind}"), format!("a {kind} volume")));
        }
    }
    for (i, sysctl) in pod_context["sysctls"].as_array().into_iter().flatten().enumerate() {
        let name = sysctl["name"].as_str().unwrap_or_default();
        if !SAFE_SYSCTLS.contains(&name) {
            out.push((format!("{at}/securityContext/sysctls/{i}"), format!("the sysctl {name:?} is not a safe one")));
        }
    }
    profiles(pod_context, &format!("{at}/securityContext"), &mut out);
    if pod_context["windowsOptions"]["hostProcess"] == true {
        out.push((format!("{at}/securityContext/windowsOptions/hostProcess"), "a host process".into()));
    }
    let pod_non_root = pod_context["runAsNonRoot"] == true;
    let pod_seccomp = confined(&pod_context["seccompProfile"]["type"]);
    for list in ["initContainers", "containers", "ephemeralContainers"] {
        for (i, container) in spec[list].as_array().into_iter().flatten().enumerate() {
            let base = format!("{at}/{list}/{i}");
            let context = &container["securityContext"];
            let here = format!("{base}/securityContext");
            if context["privileged"] == true {
                out.push((format!("{here}/privileged"), "privileged: true is root on the node".into()));
            }
            if context["windowsOptions"]["hostProcess"] == true {
                out.push((format!("{here}/windowsOptions/hostProcess"), "a host process".into()));
            }
            if context["procMount"].as_str().is_some_and(|m| m != "Default") {
                out.push((format!("{here}/procMount"), "an unmasked /proc".into()));
            }
            profiles(context, &here, &mut out);
            for (j, port) in container["ports"].as_array().into_iter().flatten().enumerate() {
                if port["hostPort"].as_i64().is_some_and(|p| p != 0) {
                    out.push((format!("{base}/ports/{j}/hostPort"), "a hostPort takes a port of the node".into()));
                }
            }
            let added = context["capabilities"]["add"].as_array().map(Vec::as_slice).unwrap_or_default();
            for (j, cap) in added.iter().enumerate() {
                let cap = cap.as_str().unwrap_or_default();
                let name = cap.trim_start_matches("CAP_");
                let allowed = match level {
                    Level::Restricted => name == "NET_BIND_SERVICE",
                    _ => BASELINE_CAPABILITIES.contains(&name),
                };
                if !allowed {
                    out.push((format!("{here}/capabilities/add/{j}"), format!("the capability {cap}")));
                }
            }
            if level < Level::Restricted {
                continue;
            }
            if context["allowPrivilegeEscalation"] != false {
                out.push((format!("{here}/allowPrivilegeEscalation"), "allowPrivilegeEscalation must be false".into()));
            }
            let drops_all = context["capabilities"]["drop"].as_array().is_some_and(|d| d.iter().any(|c| c == "ALL"));
            if !drops_all {
                out.push((format!("{here}/capabilities/drop"), "capabilities must drop ALL".into()));
            }
            let non_root = match context["runAsNonRoot"].as_bool() {
                Some(set) => set,
                None => pod_non_root,
            };
            if !non_root {
                out.push((format!("{here}/runAsNonRoot"), "runAsNonRoot must be true (here or for the Pod)".into()));
            }
            if context["runAsUser"] == 0 || (context["runAsUser"].is_null() && pod_context["runAsUser"] == 0) {
                out.push((format!("{here}/runAsUser"), "runAsUser 0 is root".into()));
            }
            let seccomp = match context["seccompProfile"]["type"].as_str() {
                Some(_) => confined(&context["seccompProfile"]["type"]),
                None => pod_seccomp,
            };
            if !seccomp {
                out.push((
                    format!("{here}/seccompProfile/type"),
                    "seccompProfile.type must be RuntimeDefault or Localhost (here or for the Pod)".into(),
                ));
            }
        }
    }
    out
}

/// Whether a seccomp profile type confines the container.
fn confined(kind: &Value) -> bool {
    matches!(kind.as_str(), Some("RuntimeDefault" | "Localhost"))
}

/// `baseline`'s rules on a security context's seccomp, AppArmor and SELinux settings.
fn profiles(context: &Value, at: &str, out: &mut Vec<Violation>) {
    if context["seccompProfile"]["type"] == "Unconfined" {
        out.push((format!("{at}/seccompProfile/type"), "an Unconfined seccomp profile".into()));
    }
    if context["appArmorProfile"]["type"] == "Unconfined" {
        out.push((format!("{at}/appArmorProfile/type"), "an Unconfined AppArmor profile".into()));
    }
    let selinux = &context["seLinuxOptions"];
    if let Some(kind) = selinux["type"].as_str()
        && !matches!(kind, "" | "container_t" | "container_init_t" | "container_kvm_t" | "container_engine_t")
    {
        out.push((format!("{at}/seLinuxOptions/type"), format!("the SELinux type {kind:?}")));
    }
    for field in ["user", "role"] {
        if selinux[field].as_str().is_some_and(|v| !v.is_empty()) {
            out.push((format!("{at}/seLinuxOptions/{field}"), format!("a custom SELinux {field}")));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn paths(spec: Value, level: Level) -> Vec<String> {
        violations(&spec, "/spec", level).into_iter().map(|(p, _)| p).collect()
    }

    #[test]
    fn a_pod_that_is_root_on_its_node_breaks_baseline() {
        let root = json!({"hostPID": true, "hostNetwork": true,
            "volumes": [{"name": "all", "hostPath": {"path": "/"}}, {"name": "tmp", "emptyDir": {}}],
            "containers": [{"name": "c", "securityContext": {"privileged": true,
                "capabilities": {"add": ["NET_ADMIN", "CHOWN"]}}, "ports": [{"containerPort": 80, "hostPort": 80}]}]});
        assert_eq!(
            paths(root.clone(), Level::Baseline),
            [
                "/spec/hostNetwork",
                "/spec/hostPID",
                "/spec/volumes/0/hostPath",
                "/spec/containers/0/securityContext/privileged",
                "/spec/containers/0/ports/0/hostPort",
                "/spec/containers/0/securityContext/capabilities/add/0",
            ]
        );
        assert!(paths(root, Level::Privileged).is_empty());
        let plain =
            json!({"containers": [{"name": "c", "image": "httpd"}], "volumes": [{"name": "v", "emptyDir": {}}]});
        assert!(paths(plain.clone(), Level::Baseline).is_empty(), "an ordinary Pod is fine");
        assert_eq!(
            paths(json!({"securityContext": {"seccompProfile": {"type": "Unconfined"}}}), Level::Baseline),
            ["/spec/securityContext/seccompProfile/type"]
        );
        // restricted asks more of the same ordinary Pod.
        assert_eq!(
            paths(plain, Level::Restricted),
            [
                "/spec/containers/0/securityContext/allowPrivilegeEscalation",
                "/spec/containers/0/securityContext/capabilities/drop",
                "/spec/containers/0/securityContext/runAsNonRoot",
                "/spec/containers/0/securityContext/seccompProfile/type",
            ]
        );
        let hardened = json!({"securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "c", "securityContext": {"allowPrivilegeEscalation": false,
                "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}}]});
        assert!(paths(hardened, Level::Restricted).is_empty());
    }

    #[test]
    fn a_namespace_says_its_levels_with_admissions_labels() {
        assert_eq!(levels(&json!({})), (Level::Baseline, None));
        let labels = json!({"pod-security.kubernetes.io/enforce": "privileged",
                            "pod-security.kubernetes.io/warn": "baseline",
                            "pod-security.kubernetes.io/audit": "restricted"});
        assert_eq!(levels(&labels), (Level::Privileged, Some(Level::Restricted)));
        assert_eq!(levels(&json!({"pod-security.kubernetes.io/enforce": "nonsense"})), (Level::Baseline, None));
    }
}
