//! Pure translation of a Pod into CRI sandbox and container configs (kubelet's
//! `kuberuntime_sandbox.go` / `kuberuntime_container.go` generate*Config).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use gitplane_api::quantity::{parse_milli, parse_units};
use k8s_openapi::api::core::v1::{Container, LifecycleHandler, Pod, PodSpec};

use super::config::RuntimeConfig;
use super::fields::{SpecError, expand, pod_namespace, safe_name};
use crate::kubelet::cri::pb;

/// Labels kubelet puts on sandboxes and containers; they are how pods are found again in the
/// runtime (also after an agent restart), and what crictl and friends show.
pub const LABEL_POD_UID: &str = "io.kubernetes.pod.uid";
pub const LABEL_POD_NAME: &str = "io.kubernetes.pod.name";
pub const LABEL_POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
pub const LABEL_CONTAINER_NAME: &str = "io.kubernetes.container.name";
/// A hash of the container's spec: a running container whose spec changed is replaced.
pub const ANNOTATION_CONTAINER_HASH: &str = "io.kubernetes.container.hash";
pub const ANNOTATION_RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
pub const ANNOTATION_GRACE_PERIOD: &str = "io.kubernetes.pod.terminationGracePeriod";
/// The container's preStop hook (its LifecycleHandler as JSON), kept on the container as kubelet
/// does: a Pod killed without its spec (deleted while the agent was away) still runs it.
pub const ANNOTATION_PRE_STOP: &str = "io.kubernetes.container.preStopHandler";
/// The crash-loop back-off waited before this run (seconds): the next one doubles it.
pub const ANNOTATION_RESTART_BACKOFF: &str = "gitplane.io/crash-loop-back-off-seconds";

/// The identity kubelet gives a pod in logs and errors: `namespace/name`.
pub fn pod_key(pod: &Pod) -> String {
    format!("{}/{}", pod_namespace(pod), pod.metadata.name.as_deref().unwrap_or(""))
}

pub fn pod_uid(pod: &Pod) -> Result<&str, SpecError> {
    let uid = pod.metadata.uid.as_deref().filter(|u| !u.is_empty()).ok_or(SpecError::MissingUid)?;
    safe_name("metadata.uid", uid)
}

pub fn pod_spec(pod: &Pod) -> Result<&PodSpec, SpecError> {
    pod.spec.as_ref().ok_or(SpecError::MissingSpec)
}

/// `Always` unless the pod says otherwise (the API default).
pub fn restart_policy(pod: &Pod) -> &str {
    pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref()).unwrap_or("Always")
}

/// A native sidecar: an init container with `restartPolicy: Always`, started in order among the
/// init containers and kept running beside the app containers.
pub fn is_sidecar(container: &Container) -> bool {
    container.restart_policy.as_deref() == Some("Always")
}

/// The names of the pod's sidecars, in the order of the spec.
pub fn sidecar_names(pod: &Pod) -> Vec<String> {
    let init = pod.spec.as_ref().and_then(|s| s.init_containers.as_deref()).unwrap_or_default();
    init.iter().filter(|c| is_sidecar(c)).map(|c| c.name.clone()).collect()
}

/// The command of an exec lifecycle hook, the kind the agent runs (validation refuses others).
pub fn exec_hook(handler: Option<&LifecycleHandler>) -> Option<Vec<String>> {
    handler?.exec.as_ref()?.command.clone().filter(|c| !c.is_empty())
}

/// The preStop exec hook a container was created with.
pub fn pre_stop_hook(annotations: &HashMap<String, String>) -> Option<Vec<String>> {
    let handler: LifecycleHandler = serde_json::from_str(annotations.get(ANNOTATION_PRE_STOP)?).ok()?;
    exec_hook(Some(&handler))
}

/// The pod's cgroup under the node's parent, named as kubelet's cgroupfs driver does.
pub fn pod_cgroup(cfg: &RuntimeConfig, uid: &str) -> String {
    format!("{}/pod{uid}", cfg.cgroup_parent.trim_end_matches('/'))
}

/// kubelet's pod log directory: `<pod_log_dir>/<namespace>_<name>_<uid>`.
pub fn pod_log_directory(cfg: &RuntimeConfig, pod: &Pod) -> Result<PathBuf, SpecError> {
    let name = safe_name("metadata.name", pod.metadata.name.as_deref().unwrap_or(""))?;
    let namespace = safe_name("metadata.namespace", pod_namespace(pod))?;
    Ok(cfg.pod_log_dir.join(format!("{namespace}_{name}_{}", pod_uid(pod)?)))
}

/// Where an emptyDir volume of the pod lives on the node.
pub fn empty_dir_path(cfg: &RuntimeConfig, uid: &str, volume: &str) -> PathBuf {
    cfg.pod_dir.join(uid).join("volumes/kubernetes.io~empty-dir").join(volume)
}

/// The container's imagePullPolicy, or the API server's default for its image.
pub fn image_pull_policy(container: &Container) -> &str {
    match container.image_pull_policy.as_deref() {
        Some(policy) => policy,
        None => gitplane_api::defaults::image_pull_policy(container.image.as_deref().unwrap_or("")),
    }
}

/// A stable hash of the container spec (FNV-1a over its JSON): a change replaces the container.
pub fn container_hash(container: &Container) -> String {
    let json = serde_json::to_vec(container).unwrap_or_default();
    let hash = json.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3));
    format!("{hash:016x}")
}

fn namespace_options(spec: &PodSpec) -> pb::NamespaceOption {
    let mode = |node: Option<bool>, pod: bool| {
        if node == Some(true) {
            pb::NamespaceMode::Node
        } else if pod {
            pb::NamespaceMode::Pod
        } else {
            pb::NamespaceMode::Container
        }
    };
    pb::NamespaceOption {
        network: mode(spec.host_network, true) as i32,
        pid: mode(spec.host_pid, spec.share_process_namespace == Some(true)) as i32,
        ipc: mode(spec.host_ipc, true) as i32,
        target_id: String::new(),
    }
}

fn dns_config(pod: &Pod, cfg: &RuntimeConfig) -> Option<pb::DnsConfig> {
    let dns = crate::network::dns::pod_dns(pod, &cfg.cluster_dns, &cfg.cluster_domain, cfg.host_dns.as_ref())?;
    Some(pb::DnsConfig { servers: dns.servers, searches: dns.searches, options: dns.options })
}

fn protocol(name: Option<&str>) -> pb::Protocol {
    match name {
        Some("UDP") => pb::Protocol::Udp,
        Some("SCTP") => pb::Protocol::Sctp,
        _ => pb::Protocol::Tcp,
    }
}

/// The sandbox config for the pod's `attempt`-th sandbox. CreateContainer gets the same config,
/// so it must be rebuilt identically for an existing sandbox.
pub fn sandbox_config(pod: &Pod, cfg: &RuntimeConfig, attempt: u32) -> Result<pb::PodSandboxConfig, SpecError> {
    let spec = pod_spec(pod)?;
    let uid = pod_uid(pod)?;
    let name = pod.metadata.name.clone().unwrap_or_default();
    let namespace = pod_namespace(pod).to_string();

    let mut labels: HashMap<String, String> = pod.metadata.labels.clone().unwrap_or_default().into_iter().collect();
    labels.insert(LABEL_POD_UID.into(), uid.into());
    labels.insert(LABEL_POD_NAME.into(), name.clone());
    labels.insert(LABEL_POD_NAMESPACE.into(), namespace.clone());
    let annotations = pod.metadata.annotations.clone().unwrap_or_default().into_iter().collect();

    // Only ports with a hostPort need portmap; the others are reachable on the pod IP anyway.
    let port_mappings = spec
        .containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            let host_port = p.host_port.filter(|h| *h > 0)?;
            Some(pb::PortMapping {
                protocol: protocol(p.protocol.as_deref()) as i32,
                container_port: p.container_port,
                host_port,
                host_ip: p.host_ip.clone().unwrap_or_default(),
            })
        })
        .collect();

    let pod_sc = spec.security_context.as_ref();
    let sysctls = pod_sc
        .and_then(|sc| sc.sysctls.as_ref())
        .into_iter()
        .flatten()
        .map(|s| (s.name.clone(), s.value.clone()))
        .collect();
    let hostname = if spec.host_network == Some(true) { String::new() } else { pod_hostname(pod) };

    Ok(pb::PodSandboxConfig {
        metadata: Some(pb::PodSandboxMetadata { name, uid: uid.into(), namespace, attempt }),
        hostname,
        log_directory: pod_log_directory(cfg, pod)?.to_string_lossy().into_owned(),
        dns_config: dns_config(pod, cfg),
        port_mappings,
        labels,
        annotations,
        linux: Some(pb::LinuxPodSandboxConfig {
            cgroup_parent: pod_cgroup(cfg, uid),
            security_context: Some(pb::LinuxSandboxSecurityContext {
                namespace_options: Some(namespace_options(spec)),
                run_as_user: pod_sc.and_then(|sc| sc.run_as_user).map(|value| pb::Int64Value { value }),
                run_as_group: pod_sc.and_then(|sc| sc.run_as_group).map(|value| pb::Int64Value { value }),
                supplemental_groups: supplemental_groups(spec),
                readonly_rootfs: false,
                privileged: spec
                    .containers
                    .iter()
                    .any(|c| c.security_context.as_ref().and_then(|sc| sc.privileged) == Some(true)),
            }),
            sysctls,
        }),
    })
}

/// The Pod's hostname: `spec.hostname`, else its name, at most 63 characters.
fn pod_hostname(pod: &Pod) -> String {
    let spec = pod.spec.as_ref();
    let base = spec.and_then(|s| s.hostname.clone()).or_else(|| pod.metadata.name.clone()).unwrap_or_default();
    base.chars().take(63).collect::<String>().trim_end_matches(['-', '.']).to_string()
}

/// What CreateContainer needs for one container, plus the host directories (emptyDir volumes,
/// the container's log directory) that must exist first and the Pod's hosts file to write.
#[derive(Clone, Debug, PartialEq)]
pub struct ContainerPlan {
    pub config: pb::ContainerConfig,
    pub host_dirs: Vec<PathBuf>,
    pub hosts_file: Option<(PathBuf, super::hosts::EtcHosts)>,
}

/// The container config for the `attempt`-th run of `container`. `pod_ips` come from the
/// sandbox (for `status.podIP` field references).
pub fn container_config(
    pod: &Pod,
    container: &Container,
    cfg: &RuntimeConfig,
    attempt: u32,
    pod_ips: &[String],
    objects: &dyn super::env::ConfigSource,
) -> Result<ContainerPlan, SpecError> {
    let spec = pod_spec(pod)?;
    let uid = pod_uid(pod)?;
    safe_name("container name", &container.name)?;
    let image = container
        .image
        .clone()
        .filter(|i| !i.is_empty())
        .ok_or_else(|| SpecError::MissingImage { container: container.name.clone() })?;
    let envs = super::env::environment(pod, container, cfg, pod_ips, objects)?;
    let lookup: HashMap<&str, &str> = envs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let expand_all = |v: &Option<Vec<String>>| -> Vec<String> {
        v.iter().flatten().map(|s| expand(s, |name| lookup.get(name).copied())).collect()
    };
    let command = expand_all(&container.command);
    let args = expand_all(&container.args);

    let (mut mounts, mut host_dirs) = mounts(pod, container, cfg, uid, objects)?;
    let hosts_file = super::hosts::mounted_on(container, pod_ips).then(|| {
        let path = super::hosts::path(cfg, uid);
        mounts.push(pb::Mount {
            container_path: super::hosts::CONTAINER_PATH.into(),
            host_path: path.to_string_lossy().into_owned(),
            readonly: false,
            selinux_relabel: false,
            propagation: pb::MountPropagation::PropagationPrivate as i32,
        });
        (path, super::hosts::hosts_file(pod, pod_ips, &pod_hostname(pod), &cfg.cluster_domain))
    });
    let log_dir = pod_log_directory(cfg, pod)?;
    host_dirs.push(log_dir.join(&container.name));

    let mut labels = HashMap::new();
    labels.insert(LABEL_POD_UID.to_string(), uid.to_string());
    labels.insert(LABEL_POD_NAME.to_string(), pod.metadata.name.clone().unwrap_or_default());
    labels.insert(LABEL_POD_NAMESPACE.to_string(), pod_namespace(pod).to_string());
    labels.insert(LABEL_CONTAINER_NAME.to_string(), container.name.clone());
    let mut annotations = HashMap::new();
    annotations.insert(ANNOTATION_CONTAINER_HASH.to_string(), container_hash(container));
    annotations.insert(ANNOTATION_RESTART_COUNT.to_string(), attempt.to_string());
    annotations
        .insert(ANNOTATION_GRACE_PERIOD.to_string(), spec.termination_grace_period_seconds.unwrap_or(30).to_string());
    if let Some(pre_stop) = container.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref()) {
        annotations.insert(ANNOTATION_PRE_STOP.to_string(), serde_json::to_string(pre_stop).unwrap_or_default());
    }

    let config = pb::ContainerConfig {
        metadata: Some(pb::ContainerMetadata { name: container.name.clone(), attempt }),
        image: Some(pb::ImageSpec { image: image.clone(), user_specified_image: image, ..Default::default() }),
        command,
        args,
        working_dir: container.working_dir.clone().unwrap_or_default(),
        envs: envs.into_iter().map(|(key, value)| pb::KeyValue { key, value: value.into_bytes() }).collect(),
        mounts,
        labels,
        annotations,
        log_path: format!("{}/{attempt}.log", container.name),
        stdin: container.stdin.unwrap_or(false),
        stdin_once: container.stdin_once.unwrap_or(false),
        tty: container.tty.unwrap_or(false),
        linux: Some(pb::LinuxContainerConfig {
            resources: Some(linux_resources(pod, container, cfg)?),
            security_context: Some(container_security_context(pod, container, cfg)?),
        }),
    };
    Ok(ContainerPlan { config, host_dirs, hosts_file })
}

fn mounts(
    pod: &Pod,
    container: &Container,
    cfg: &RuntimeConfig,
    uid: &str,
    objects: &dyn super::env::ConfigSource,
) -> Result<(Vec<pb::Mount>, Vec<PathBuf>), SpecError> {
    let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
    let mut mounts = Vec::new();
    let mut host_dirs = Vec::new();
    for mount in container.volume_mounts.iter().flatten() {
        let volume = volumes.into_iter().flatten().find(|v| v.name == mount.name).ok_or_else(|| {
            SpecError::UnknownVolume { container: container.name.clone(), volume: mount.name.clone() }
        })?;
        let mut read_only = mount.read_only.unwrap_or(false);
        let mut host_path = if let Some(host) = &volume.host_path {
            PathBuf::from(&host.path)
        } else if volume.empty_dir.is_some() {
            let dir = empty_dir_path(cfg, uid, safe_name("volume name", &volume.name)?);
            host_dirs.push(dir.clone());
            dir
        } else if let Some(dir) = super::volumes::host_path(cfg, uid, volume)? {
            dir
        } else if let Some(claim) = &volume.persistent_volume_claim {
            let bound = super::volumes::claim_volume(pod_namespace(pod), &claim.claim_name, objects)
                .map_err(|why| SpecError::UnboundClaim { volume: volume.name.clone(), why })?;
            read_only |= claim.read_only.unwrap_or(false);
            bound.path
        } else {
            // The volume source is the one field besides the name.
            let kind = serde_json::to_value(volume)
                .ok()
                .and_then(|v| v.as_object()?.keys().find(|k| *k != "name").cloned())
                .unwrap_or_else(|| "unknown".into());
            return Err(SpecError::UnsupportedVolume { volume: volume.name.clone(), kind });
        };
        if let Some(sub) = mount.sub_path.as_deref().filter(|s| !s.is_empty()) {
            if sub.starts_with('/') || sub.split('/').any(|part| part == "..") {
                return Err(SpecError::Unsupported { what: format!("volumeMount {:?}: subPath {sub:?}", mount.name) });
            }
            host_path = host_path.join(sub);
            if volume.empty_dir.is_some() {
                host_dirs.push(host_path.clone());
            }
        }
        let propagation = match mount.mount_propagation.as_deref() {
            Some("HostToContainer") => pb::MountPropagation::PropagationHostToContainer,
            Some("Bidirectional") => pb::MountPropagation::PropagationBidirectional,
            _ => pb::MountPropagation::PropagationPrivate,
        };
        mounts.push(pb::Mount {
            container_path: mount.mount_path.clone(),
            host_path: host_path.to_string_lossy().into_owned(),
            readonly: read_only,
            selinux_relabel: false,
            propagation: propagation as i32,
        });
    }
    Ok((mounts, host_dirs))
}

fn quantity(
    resources: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
    name: &str,
    field: &str,
    milli: bool,
) -> Result<Option<i128>, SpecError> {
    let Some(q) = resources.and_then(|r| r.get(name)) else {
        return Ok(None);
    };
    let parsed = if milli { parse_milli(&q.0) } else { parse_units(&q.0) };
    parsed.map(Some).ok_or_else(|| SpecError::InvalidQuantity { field: format!("{field}.{name}"), value: q.0.clone() })
}

/// kubelet's quality-of-service class of a pod: `Guaranteed`, `Burstable` or `BestEffort`.
pub fn qos_class(pod: &Pod) -> &'static str {
    let Some(spec) = pod.spec.as_ref() else {
        return "BestEffort";
    };
    let mut any = false;
    let mut guaranteed = true;
    // Pod-level resources decide the class alone when set (upstream's `GetPodQOS`).
    let pod_level = spec.resources.as_ref().filter(|r| {
        let has = |l: Option<&std::collections::BTreeMap<String, _>>| {
            l.is_some_and(|l| l.contains_key("cpu") || l.contains_key("memory"))
        };
        has(r.requests.as_ref()) || has(r.limits.as_ref())
    });
    let resources: Vec<_> = match pod_level {
        Some(r) => vec![Some(r)],
        None => spec.containers.iter().map(|c| c.resources.as_ref()).collect(),
    };
    for r in resources {
        let requests = r.and_then(|r| r.requests.as_ref());
        let limits = r.and_then(|r| r.limits.as_ref());
        for name in ["cpu", "memory"] {
            let request = requests.and_then(|r| r.get(name)).and_then(|q| parse_milli(&q.0));
            let limit = limits.and_then(|r| r.get(name)).and_then(|q| parse_milli(&q.0));
            any |= request.is_some_and(|r| r != 0) || limit.is_some_and(|l| l != 0);
            // A missing request defaults to the limit.
            guaranteed &= limit.is_some() && request.is_none_or(|r| Some(r) == limit);
        }
    }
    match (any, guaranteed) {
        (false, _) => "BestEffort",
        (true, true) => "Guaranteed",
        (true, false) => "Burstable",
    }
}

/// CPU shares, CFS quota and memory limit as kubelet computes them for cgroups v1.
fn linux_resources(
    pod: &Pod,
    container: &Container,
    cfg: &RuntimeConfig,
) -> Result<pb::LinuxContainerResources, SpecError> {
    const MIN_SHARES: i128 = 2;
    const MAX_SHARES: i128 = 262_144;
    const PERIOD: i128 = 100_000;
    const MIN_QUOTA: i128 = 1_000;
    let requests = container.resources.as_ref().and_then(|r| r.requests.as_ref());
    let limits = container.resources.as_ref().and_then(|r| r.limits.as_ref());
    let field = format!("container {:?} resources", container.name);
    let cpu_limit = quantity(limits, "cpu", &format!("{field}.limits"), true)?;
    let cpu_request = quantity(requests, "cpu", &format!("{field}.requests"), true)?.or(cpu_limit);
    let memory_limit = quantity(limits, "memory", &format!("{field}.limits"), false)?;
    let memory_request = quantity(requests, "memory", &format!("{field}.requests"), false)?.or(memory_limit);

    let shares = match cpu_request {
        Some(milli) if milli > 0 => (milli * 1024 / 1000).clamp(MIN_SHARES, MAX_SHARES),
        _ => MIN_SHARES,
    };
    let (cpu_period, cpu_quota) = match cpu_limit {
        Some(milli) if milli > 0 => (PERIOD, (milli * PERIOD / 1000).max(MIN_QUOTA)),
        _ => (0, 0),
    };
    // Containerd clamps these to its own score (restrict_oom_score_adj); still say what we mean.
    let oom_score_adj = match qos_class(pod) {
        "Guaranteed" => -997,
        "BestEffort" => 1000,
        _ => match (memory_request, cfg.node_memory_bytes) {
            (Some(request), Some(capacity)) if capacity > 0 => {
                (1000 - 1000 * request / i128::from(capacity)).clamp(2, 999)
            }
            _ => 999,
        },
    };
    let to_i64 = |v: i128| i64::try_from(v).unwrap_or(i64::MAX);
    Ok(pb::LinuxContainerResources {
        cpu_period: to_i64(cpu_period),
        cpu_quota: to_i64(cpu_quota),
        cpu_shares: to_i64(shares),
        memory_limit_in_bytes: memory_limit.map(to_i64).unwrap_or(0),
        oom_score_adj: to_i64(oom_score_adj),
        ..Default::default()
    })
}

fn container_security_context(
    pod: &Pod,
    container: &Container,
    cfg: &RuntimeConfig,
) -> Result<pb::LinuxContainerSecurityContext, SpecError> {
    let spec = pod_spec(pod)?;
    let apparmor = apparmor(pod, container);
    let pod_sc = spec.security_context.as_ref();
    let sc = container.security_context.as_ref();
    let run_as_user = sc.and_then(|s| s.run_as_user).or(pod_sc.and_then(|s| s.run_as_user));
    let run_as_group = sc.and_then(|s| s.run_as_group).or(pod_sc.and_then(|s| s.run_as_group));
    let capabilities = sc.and_then(|s| s.capabilities.as_ref()).map(|c| pb::Capability {
        add_capabilities: c.add.clone().unwrap_or_default(),
        drop_capabilities: c.drop.clone().unwrap_or_default(),
    });
    Ok(pb::LinuxContainerSecurityContext {
        capabilities,
        privileged: sc.and_then(|s| s.privileged).unwrap_or(false),
        // Containers join the sandbox's namespaces only if told so, again, here.
        namespace_options: Some(namespace_options(spec)),
        run_as_user: run_as_user.map(|value| pb::Int64Value { value }),
        run_as_group: run_as_group.map(|value| pb::Int64Value { value }),
        run_as_username: String::new(),
        readonly_rootfs: sc.and_then(|s| s.read_only_root_filesystem).unwrap_or(false),
        supplemental_groups: supplemental_groups(spec),
        no_new_privs: sc.and_then(|s| s.allow_privilege_escalation) == Some(false),
        seccomp: Some(seccomp(spec, container, &cfg.seccomp_profile_root)?),
        apparmor_profile: apparmor.as_ref().map(deprecated_apparmor_profile).unwrap_or_default(),
        apparmor,
    })
}

/// The Pod's groups every container joins besides its primary one: `fsGroup` first, then
/// `supplementalGroups`, as the kubelet lists them (the runtime adds the image's own groups:
/// the `Merge` policy).
fn supplemental_groups(spec: &PodSpec) -> Vec<i64> {
    let sc = spec.security_context.as_ref();
    sc.and_then(|s| s.fs_group)
        .into_iter()
        .chain(sc.and_then(|s| s.supplemental_groups.clone()).into_iter().flatten())
        .collect()
}

/// Whether the container's user must be checked against its image's (`runAsNonRoot` without a
/// `runAsUser`): the caller then asks the runtime for the image's user.
pub fn needs_image_user(spec: &PodSpec, container: &Container) -> bool {
    let (non_root, run_as_user) = non_root_and_user(spec, container);
    non_root && run_as_user.is_none()
}

fn non_root_and_user(spec: &PodSpec, container: &Container) -> (bool, Option<i64>) {
    let pod_sc = spec.security_context.as_ref();
    let sc = container.security_context.as_ref();
    let non_root = sc.and_then(|s| s.run_as_non_root).or(pod_sc.and_then(|s| s.run_as_non_root)) == Some(true);
    (non_root, sc.and_then(|s| s.run_as_user).or(pod_sc.and_then(|s| s.run_as_user)))
}

/// The kubelet's `verifyRunAsNonRoot`: with `runAsNonRoot`, the container's `runAsUser`, else
/// the image's user (`image_uid`, or a `username` that is not a number; neither: root), must
/// not be root.
pub fn verify_run_as_non_root(
    pod: &Pod,
    container: &Container,
    image_uid: Option<i64>,
    username: &str,
) -> Result<(), SpecError> {
    let (non_root, run_as_user) = non_root_and_user(pod_spec(pod)?, container);
    if !non_root {
        return Ok(());
    }
    // format.Pod: name_namespace(uid).
    let who = format!(
        "{}_{}({})",
        pod.metadata.name.as_deref().unwrap_or_default(),
        pod_namespace(pod),
        pod.metadata.uid.as_deref().unwrap_or_default()
    );
    let container = container.name.clone();
    match (run_as_user, image_uid) {
        (Some(0), _) => Err(SpecError::RunAsUserRoot { pod: who, container }),
        (Some(_), _) => Ok(()),
        (None, Some(0)) => Err(SpecError::ImageRunsAsRoot { pod: who, container }),
        (None, Some(_)) => Ok(()),
        (None, None) if !username.is_empty() => {
            Err(SpecError::NonNumericUser { user: username.to_owned(), pod: who, container })
        }
        (None, None) => Err(SpecError::ImageRunsAsRoot { pod: who, container }),
    }
}

/// The container's seccomp profile, its own or else the Pod's: containerd's default profile for
/// `RuntimeDefault`, none for `Unconfined` or nothing said (the kubelet's default), the file
/// `localhostProfile` names under `root` for `Localhost` (containerd reads it when it creates the
/// container: a missing file is its CreateContainerError, as under the kubelet).
fn seccomp(spec: &PodSpec, container: &Container, root: &Path) -> Result<pb::SecurityProfile, SpecError> {
    use pb::security_profile::ProfileType;
    let own = container.security_context.as_ref().and_then(|s| s.seccomp_profile.as_ref());
    let pod = spec.security_context.as_ref().and_then(|s| s.seccomp_profile.as_ref());
    let Some(profile) = own.or(pod) else {
        return Ok(pb::SecurityProfile { profile_type: ProfileType::Unconfined.into(), localhost_ref: String::new() });
    };
    let (profile_type, localhost_ref) = match profile.type_.as_str() {
        "RuntimeDefault" => (ProfileType::RuntimeDefault, String::new()),
        "Localhost" => {
            let relative = profile.localhost_profile.as_deref().unwrap_or_default();
            let path = localhost_profile(root, relative).ok_or_else(|| SpecError::Unsupported {
                what: format!(
                    "seccompProfile.localhostProfile {relative:?} (it must be a path below the node's seccomp \
                     profile directory, without \"..\")"
                ),
            })?;
            (ProfileType::Localhost, path.to_string_lossy().into_owned())
        }
        _ => (ProfileType::Unconfined, String::new()),
    };
    Ok(pb::SecurityProfile { profile_type: profile_type.into(), localhost_ref })
}

/// The container's AppArmor profile, as the kubelet's `getAppArmorProfile` picks it: its own
/// field, else the Pod's, else the deprecated annotation; none when nothing is said (containerd
/// then applies none). Pods that ask for one on a node without AppArmor were rejected before.
fn apparmor(pod: &Pod, container: &Container) -> Option<pb::SecurityProfile> {
    use pb::security_profile::ProfileType;
    let own = container.security_context.as_ref().and_then(|s| s.app_armor_profile.as_ref());
    let pod_level =
        pod.spec.as_ref().and_then(|s| s.security_context.as_ref()).and_then(|s| s.app_armor_profile.as_ref());
    let (profile_type, name) = match own.or(pod_level) {
        Some(p) => match p.type_.as_str() {
            "RuntimeDefault" => (ProfileType::RuntimeDefault, String::new()),
            "Localhost" => (ProfileType::Localhost, p.localhost_profile.clone().unwrap_or_default()),
            _ => (ProfileType::Unconfined, String::new()),
        },
        None => {
            let key = format!("{}{}", crate::kubelet::admission::APPARMOR_ANNOTATION_PREFIX, container.name);
            match pod.metadata.annotations.as_ref().and_then(|a| a.get(&key)).map(String::as_str) {
                Some("runtime/default") => (ProfileType::RuntimeDefault, String::new()),
                Some(value) if value.starts_with("localhost/") => {
                    (ProfileType::Localhost, value.trim_start_matches("localhost/").to_owned())
                }
                Some(_) => (ProfileType::Unconfined, String::new()),
                None => return None,
            }
        }
    };
    Some(pb::SecurityProfile { profile_type: profile_type.into(), localhost_ref: name })
}

/// The same profile in the CRI's older string field, for runtimes that read only that one.
fn deprecated_apparmor_profile(profile: &pb::SecurityProfile) -> String {
    use pb::security_profile::ProfileType;
    match ProfileType::try_from(profile.profile_type) {
        Ok(ProfileType::RuntimeDefault) => "runtime/default".into(),
        Ok(ProfileType::Localhost) => format!("localhost/{}", profile.localhost_ref),
        _ => "unconfined".into(),
    }
}

/// `relative` under `root`, if it is a descending path (the API server's
/// `validateLocalDescendingPath`: not empty, not absolute, no `..`).
pub fn localhost_profile(root: &Path, relative: &str) -> Option<PathBuf> {
    use std::path::Component;
    let path = Path::new(relative);
    let descending =
        !relative.is_empty() && path.components().all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
    descending.then(|| root.join(path))
}

#[cfg(test)]
mod tests {
    use super::super::env::NoConfig;
    use super::*;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": { "name": "web", "namespace": "shop", "uid": "u-1", "labels": { "app": "web" } },
            "spec": spec,
        }))
        .expect("valid pod")
    }

    fn cfg() -> RuntimeConfig {
        RuntimeConfig {
            cgroup_parent: "/gitplane".into(),
            pod_log_dir: "/logs".into(),
            pod_dir: "/pods".into(),
            node_ip: Some("192.168.1.10".into()),
            cluster_dns: vec!["10.96.0.10".into()],
            ..RuntimeConfig::default()
        }
    }

    fn env(config: &pb::ContainerConfig) -> Vec<(String, String)> {
        config.envs.iter().map(|kv| (kv.key.clone(), String::from_utf8_lossy(&kv.value).into_owned())).collect()
    }

    #[test]
    fn sandbox_carries_identity_cgroup_and_namespaces() {
        let pod = pod(json!({
            "containers": [{ "name": "c", "image": "i:1", "ports": [
                { "containerPort": 80, "hostPort": 8080 },
                { "containerPort": 53, "protocol": "UDP" }
            ]}],
        }));
        let config = sandbox_config(&pod, &cfg(), 2).expect("config");
        assert_eq!(
            config.metadata,
            Some(pb::PodSandboxMetadata {
                name: "web".into(),
                uid: "u-1".into(),
                namespace: "shop".into(),
                attempt: 2
            })
        );
        assert_eq!(config.labels.get(LABEL_POD_UID).map(String::as_str), Some("u-1"));
        assert_eq!(config.labels.get("app").map(String::as_str), Some("web"));
        assert_eq!(config.hostname, "web");
        assert_eq!(config.log_directory, "/logs/shop_web_u-1");
        assert_eq!(
            config.port_mappings,
            [pb::PortMapping {
                protocol: pb::Protocol::Tcp as i32,
                container_port: 80,
                host_port: 8080,
                host_ip: String::new()
            }]
        );
        let linux = config.linux.expect("linux");
        assert_eq!(linux.cgroup_parent, "/gitplane/podu-1");
        let ns = linux.security_context.and_then(|sc| sc.namespace_options).expect("namespace options");
        assert_eq!(ns.network, pb::NamespaceMode::Pod as i32);
        assert_eq!(ns.pid, pb::NamespaceMode::Container as i32);
        assert_eq!(ns.ipc, pb::NamespaceMode::Pod as i32);
        let dns = config.dns_config.expect("cluster DNS");
        assert_eq!(dns.servers, ["10.96.0.10"]);
        assert_eq!(dns.searches, ["shop.svc.cluster.local", "svc.cluster.local", "cluster.local"]);
        assert_eq!(dns.options, ["ndots:5"]);
    }

    #[test]
    fn host_network_and_dns_policies() {
        let host = pod(json!({ "hostNetwork": true, "containers": [{ "name": "c", "image": "i:1" }] }));
        let config = sandbox_config(&host, &cfg(), 0).expect("config");
        let ns = config.linux.and_then(|l| l.security_context).and_then(|s| s.namespace_options).expect("ns");
        assert_eq!(ns.network, pb::NamespaceMode::Node as i32);
        assert_eq!(config.dns_config, None, "ClusterFirst on the host network falls back to Default");
        let with_host = RuntimeConfig {
            host_dns: Some(crate::network::dns::ResolvConf::parse("nameserver 192.0.2.1\nsearch corp.example\n")),
            ..cfg()
        };
        let dns = sandbox_config(&host, &with_host, 0).expect("config").dns_config.expect("the node's resolv.conf");
        assert_eq!((dns.servers, dns.searches), (vec!["192.0.2.1".to_string()], vec!["corp.example".to_string()]));

        let custom = pod(json!({
            "dnsPolicy": "None",
            "dnsConfig": { "nameservers": ["1.2.3.4"], "options": [{ "name": "ndots", "value": "2" }, { "name": "edns0" }] },
            "containers": [{ "name": "c", "image": "i:1" }],
        }));
        let dns = sandbox_config(&custom, &cfg(), 0).expect("config").dns_config.expect("dns");
        assert_eq!(dns.servers, ["1.2.3.4"]);
        assert_eq!(dns.options, ["ndots:2", "edns0"]);
    }

    #[test]
    fn the_hosts_file_is_mounted_from_the_pods_directory() {
        let ips = ["10.244.1.5".to_owned()];
        let member =
            pod(json!({"hostname": "web-0", "subdomain": "nginx", "containers": [{"name": "c", "image": "i:1"}]}));
        let plan = container_config(&member, &member.spec.as_ref().unwrap().containers[0], &cfg(), 0, &ips, &NoConfig)
            .unwrap();
        let mount = plan.config.mounts.iter().find(|m| m.container_path == "/etc/hosts").unwrap();
        assert_eq!(mount.host_path, "/pods/u-1/etc-hosts");
        let (path, file) = plan.hosts_file.unwrap();
        assert_eq!(path, PathBuf::from("/pods/u-1/etc-hosts"));
        let text = file.content(String::new);
        assert!(text.ends_with("\n10.244.1.5\tweb-0.nginx.shop.svc.cluster.local\tweb-0\n"), "{text}");
        let none = container_config(&member, &member.spec.as_ref().unwrap().containers[0], &cfg(), 0, &[], &NoConfig);
        assert_eq!(none.unwrap().hosts_file, None, "no address yet");
    }

    #[test]
    fn container_config_translates_the_container() {
        let pod = pod(json!({
            "shareProcessNamespace": true,
            "volumes": [{ "name": "scratch", "emptyDir": {} }, { "name": "etc", "hostPath": { "path": "/etc/gp" } }],
            "containers": [{
                "name": "app",
                "image": "gitplane.local/httpd:1",
                "command": ["/bin/sh", "-c"],
                "args": ["echo $(GREETING) $(MISSING) $$(GREETING)"],
                "workingDir": "/www",
                "env": [
                    { "name": "NAME", "value": "world" },
                    { "name": "GREETING", "value": "hello $(NAME)" },
                    { "name": "POD_IP", "valueFrom": { "fieldRef": { "fieldPath": "status.podIP" } } },
                    { "name": "APP", "valueFrom": { "fieldRef": { "fieldPath": "metadata.labels['app']" } } },
                    { "name": "NAME", "value": "again" }
                ],
                "volumeMounts": [
                    { "name": "scratch", "mountPath": "/scratch" },
                    { "name": "etc", "mountPath": "/etc/gp", "readOnly": true }
                ],
                "resources": { "requests": { "cpu": "250m", "memory": "32Mi" }, "limits": { "cpu": "500m", "memory": "64Mi" } },
                "securityContext": { "allowPrivilegeEscalation": false, "capabilities": { "add": ["NET_ADMIN"] } }
            }],
        }));
        let container = &pod.spec.as_ref().expect("spec").containers[0];
        let plan = container_config(&pod, container, &cfg(), 3, &["10.244.1.7".into()], &NoConfig).expect("config");
        let config = &plan.config;
        assert_eq!(config.metadata, Some(pb::ContainerMetadata { name: "app".into(), attempt: 3 }));
        assert_eq!(config.image.as_ref().map(|i| i.image.as_str()), Some("gitplane.local/httpd:1"));
        assert_eq!(config.command, ["/bin/sh", "-c"]);
        assert_eq!(config.args, ["echo hello world $(MISSING) $(GREETING)"]);
        assert_eq!(config.working_dir, "/www");
        assert_eq!(
            env(config),
            [
                ("NAME".to_string(), "again".to_string()),
                ("GREETING".into(), "hello world".into()),
                ("POD_IP".into(), "10.244.1.7".into()),
                ("APP".into(), "web".into()),
            ]
        );
        assert_eq!(config.log_path, "app/3.log");
        assert_eq!(config.labels.get(LABEL_CONTAINER_NAME).map(String::as_str), Some("app"));
        assert_eq!(config.annotations.get(ANNOTATION_CONTAINER_HASH), Some(&container_hash(container)));

        let linux = config.linux.as_ref().expect("linux");
        let resources = linux.resources.as_ref().expect("resources");
        assert_eq!((resources.cpu_shares, resources.cpu_period, resources.cpu_quota), (256, 100_000, 50_000));
        assert_eq!(resources.memory_limit_in_bytes, 64 << 20);
        let sc = linux.security_context.as_ref().expect("security context");
        assert!(sc.no_new_privs);
        assert_eq!(sc.capabilities.as_ref().map(|c| c.add_capabilities.clone()), Some(vec!["NET_ADMIN".to_string()]));
        let ns = sc.namespace_options.as_ref().expect("container namespace options");
        assert_eq!((ns.network, ns.pid), (pb::NamespaceMode::Pod as i32, pb::NamespaceMode::Pod as i32));

        let scratch = PathBuf::from("/pods/u-1/volumes/kubernetes.io~empty-dir/scratch");
        assert_eq!(config.mounts[0].host_path, scratch.to_string_lossy());
        assert!(config.mounts[1].readonly && config.mounts[1].host_path == "/etc/gp");
        assert_eq!(plan.host_dirs, [scratch, PathBuf::from("/logs/shop_web_u-1/app")]);
    }

    #[test]
    fn seccomp_profiles_the_container_or_else_the_pod_sets() {
        use pb::security_profile::ProfileType::{Localhost, RuntimeDefault, Unconfined};
        let localhost = |p: &str| json!({"seccompProfile": {"type": "Localhost", "localhostProfile": p}});
        let cases = [
            (json!({}), json!({}), Some((Unconfined, ""))),
            (json!({"seccompProfile": {"type": "RuntimeDefault"}}), json!({}), Some((RuntimeDefault, ""))),
            (
                json!({"seccompProfile": {"type": "RuntimeDefault"}}),
                json!({"seccompProfile": {"type": "Unconfined"}}),
                Some((Unconfined, "")),
            ),
            (json!({}), json!({"seccompProfile": {"type": "RuntimeDefault"}}), Some((RuntimeDefault, ""))),
            (localhost("profiles/audit.json"), json!({}), Some((Localhost, "/seccomp/profiles/audit.json"))),
            (json!({}), localhost("./fine.json"), Some((Localhost, "/seccomp/./fine.json"))),
            (json!({}), localhost("../etc/passwd"), None),
            (json!({}), localhost("profiles/../../x.json"), None),
            (json!({}), localhost("/etc/x.json"), None),
            (json!({}), localhost(""), None),
        ];
        for (pod_sc, container_sc, expected) in cases {
            let pod = pod(json!({
                "securityContext": pod_sc,
                "containers": [{ "name": "c", "image": "i:1", "securityContext": container_sc }],
            }));
            let spec = pod.spec.as_ref().expect("spec");
            let got = seccomp(spec, &spec.containers[0], Path::new("/seccomp")).ok();
            let got = got.as_ref().map(|p| (p.profile_type, p.localhost_ref.as_str()));
            assert_eq!(got, expected.map(|(t, r)| (t as i32, r)), "{pod_sc} {container_sc}");
        }
    }

    #[test]
    fn apparmor_profiles_the_container_the_pod_or_the_annotation_sets() {
        use pb::security_profile::ProfileType::{Localhost, RuntimeDefault, Unconfined};
        let annotation = |v: &str| json!({ "container.apparmor.security.beta.kubernetes.io/c": v });
        let cases = [
            (json!({}), json!({}), json!({}), None),
            (
                json!({"appArmorProfile": {"type": "RuntimeDefault"}}),
                json!({}),
                json!({}),
                Some((RuntimeDefault, "", "runtime/default")),
            ),
            (
                json!({"appArmorProfile": {"type": "RuntimeDefault"}}),
                json!({"appArmorProfile": {"type": "Localhost", "localhostProfile": "k8s-deny-write"}}),
                json!({}),
                Some((Localhost, "k8s-deny-write", "localhost/k8s-deny-write")),
            ),
            (
                json!({}),
                json!({"appArmorProfile": {"type": "Unconfined"}}),
                annotation("runtime/default"),
                Some((Unconfined, "", "unconfined")),
            ),
            (
                json!({}),
                json!({}),
                annotation("localhost/k8s-deny-write"),
                Some((Localhost, "k8s-deny-write", "localhost/k8s-deny-write")),
            ),
            (json!({}), json!({}), annotation("unconfined"), Some((Unconfined, "", "unconfined"))),
        ];
        for (pod_sc, container_sc, annotations, expected) in cases {
            let mut pod = pod(json!({
                "securityContext": pod_sc,
                "containers": [{ "name": "c", "image": "i:1", "securityContext": container_sc }],
            }));
            pod.metadata.annotations = serde_json::from_value(annotations.clone()).expect("annotations");
            let container = &pod.spec.as_ref().expect("spec").containers[0];
            let got = apparmor(&pod, container);
            let got = got.as_ref().map(|p| (p.profile_type, p.localhost_ref.as_str(), deprecated_apparmor_profile(p)));
            let expected = expected.map(|(t, r, old)| (t as i32, r, old.to_owned()));
            assert_eq!(got, expected, "{pod_sc} {container_sc} {annotations}");
        }
    }

    #[test]
    fn fs_group_comes_first_among_the_supplemental_groups() {
        let cases = [
            (json!({}), vec![]),
            (json!({"fsGroup": 2000}), vec![2000]),
            (json!({"supplementalGroups": [3000, 4000]}), vec![3000, 4000]),
            (
                json!({"fsGroup": 2000, "supplementalGroups": [3000], "supplementalGroupsPolicy": "Merge"}),
                vec![2000, 3000],
            ),
        ];
        for (pod_sc, expected) in cases {
            let pod = pod(json!({ "securityContext": pod_sc, "containers": [{ "name": "c", "image": "i:1" }] }));
            let container = &pod.spec.as_ref().expect("spec").containers[0];
            let plan = container_config(&pod, container, &cfg(), 0, &[], &NoConfig).expect("config");
            let sc = plan.config.linux.and_then(|l| l.security_context).expect("security context");
            assert_eq!(sc.supplemental_groups, expected, "{pod_sc}");
            let sandbox = sandbox_config(&pod, &cfg(), 0).expect("sandbox");
            let sandbox_sc = sandbox.linux.and_then(|l| l.security_context).expect("sandbox security context");
            assert_eq!(sandbox_sc.supplemental_groups, expected, "{pod_sc}");
        }
    }

    #[test]
    fn run_as_non_root_is_checked_against_the_image_user() {
        let pod_ref = "pod: \"web_shop(u-1)\", container: c";
        let root = format!("container has runAsNonRoot and image will run as root ({pod_ref})");
        // (Pod's, container's security context, the image's uid, its user name) -> (asks for the
        // image's user, error)
        type Case = (serde_json::Value, serde_json::Value, Option<i64>, &'static str, bool, Option<String>);
        let cases: [Case; 9] = [
            (json!({}), json!({}), Some(0), "", false, None),
            (json!({"runAsNonRoot": false}), json!({}), None, "", false, None),
            (json!({"runAsNonRoot": true}), json!({}), Some(0), "", true, Some(root.clone())),
            (json!({"runAsNonRoot": true}), json!({}), None, "", true, Some(root.clone())),
            (json!({"runAsNonRoot": true}), json!({}), Some(65534), "", true, None),
            (
                json!({}),
                json!({"runAsNonRoot": true}),
                None,
                "nginx",
                true,
                Some(format!(
                    "container has runAsNonRoot and image has non-numeric user (nginx), cannot verify user is non-root ({pod_ref})"
                )),
            ),
            (json!({"runAsNonRoot": true, "runAsUser": 1000}), json!({}), Some(0), "", false, None),
            (
                json!({"runAsNonRoot": true}),
                json!({"runAsUser": 0}),
                Some(1000),
                "",
                false,
                Some(format!("container's runAsUser breaks non-root policy ({pod_ref})")),
            ),
            (json!({"runAsNonRoot": true}), json!({"runAsNonRoot": false}), Some(0), "", false, None),
        ];
        for (pod_sc, container_sc, uid, username, asks_image, expected) in cases {
            let pod = pod(json!({
                "securityContext": pod_sc,
                "containers": [{ "name": "c", "image": "i:1", "securityContext": container_sc }],
            }));
            let spec = pod.spec.as_ref().expect("spec");
            assert_eq!(needs_image_user(spec, &spec.containers[0]), asks_image, "{pod_sc} {container_sc}");
            let got = verify_run_as_non_root(&pod, &spec.containers[0], uid, username).err().map(|e| e.to_string());
            assert_eq!(got, expected, "{pod_sc} {container_sc} {uid:?} {username}");
        }
    }

    #[test]
    fn best_effort_gets_minimum_shares_and_no_quota() {
        let pod = pod(json!({ "containers": [{ "name": "c", "image": "i:1" }] }));
        let container = &pod.spec.as_ref().expect("spec").containers[0];
        let plan = container_config(&pod, container, &cfg(), 0, &[], &NoConfig).expect("config");
        let resources = plan.config.linux.and_then(|l| l.resources).expect("resources");
        assert_eq!((resources.cpu_shares, resources.cpu_quota, resources.memory_limit_in_bytes), (2, 0, 0));
        assert_eq!(resources.oom_score_adj, 1000);
        assert_eq!(qos_class(&pod), "BestEffort");
    }

    #[test]
    fn config_errors_name_the_problem() {
        let case = |container: serde_json::Value| {
            let pod = pod(
                json!({ "volumes": [{ "name": "cm", "nfs": { "server": "s", "path": "/" } }], "containers": [container] }),
            );
            let container = &pod.spec.as_ref().expect("spec").containers[0];
            container_config(&pod, container, &cfg(), 0, &[], &NoConfig).expect_err("must fail").to_string()
        };
        let secret = case(json!({ "name": "c", "image": "i:1", "env": [
            { "name": "PW", "valueFrom": { "secretKeyRef": { "name": "s", "key": "k" } } }
        ]}));
        assert!(secret.starts_with("secret \"shop/s\" not found (env \"PW\" reads its key \"k\")"), "{secret}");
        let volume =
            case(json!({ "name": "c", "image": "i:1", "volumeMounts": [{ "name": "cm", "mountPath": "/x" }] }));
        assert!(volume.starts_with("volume \"cm\": nfs volumes are not supported"), "{volume}");
        let unknown =
            case(json!({ "name": "c", "image": "i:1", "volumeMounts": [{ "name": "nope", "mountPath": "/x" }] }));
        assert!(unknown.contains("names no volume"), "{unknown}");
        let quantity = case(json!({ "name": "c", "image": "i:1", "resources": { "limits": { "cpu": "lots" } } }));
        assert!(quantity.contains("\"lots\" is not a quantity"), "{quantity}");
        let escape = case(json!({ "name": "..", "image": "i:1" }));
        assert!(escape.contains("cannot name a file"), "{escape}");
        let no_image = case(json!({ "name": "c" }));
        assert_eq!(no_image, "container \"c\" has no image");
    }

    #[test]
    fn pull_policy_defaults_follow_the_tag() {
        let policy = |image: &str| {
            let c = Container { name: "c".into(), image: Some(image.into()), ..Default::default() };
            image_pull_policy(&c).to_string()
        };
        assert_eq!(policy("gitplane.local/httpd:1"), "IfNotPresent");
        assert_eq!(policy("gitplane.local/httpd"), "Always");
        assert_eq!(policy("gitplane.local/httpd:latest"), "Always");
        assert_eq!(policy("localhost:5000/httpd"), "Always");
        assert_eq!(policy("localhost:5000/httpd@sha256:abc"), "IfNotPresent");
    }

    #[test]
    fn qos_classes() {
        let qos = |resources: serde_json::Value| {
            qos_class(&pod(json!({ "containers": [{ "name": "c", "image": "i:1", "resources": resources }] })))
        };
        assert_eq!(qos(json!({ "limits": { "cpu": "1", "memory": "1Gi" } })), "Guaranteed");
        assert_eq!(
            qos(json!({ "requests": { "cpu": "1000m", "memory": "1Gi" }, "limits": { "cpu": "1", "memory": "1Gi" } })),
            "Guaranteed"
        );
        assert_eq!(qos(json!({ "requests": { "cpu": "100m" } })), "Burstable");
        assert_eq!(qos(json!({})), "BestEffort");
        // Pod-level resources decide alone.
        let pod_level = |pod_level: serde_json::Value| {
            qos_class(&pod(json!({ "resources": pod_level, "containers": [{ "name": "c", "image": "i:1" }] })))
        };
        assert_eq!(pod_level(json!({ "requests": { "cpu": "500m" } })), "Burstable");
        assert_eq!(pod_level(json!({ "limits": { "cpu": "1", "memory": "1Gi" } })), "Guaranteed");
        assert_eq!(pod_level(json!({})), "BestEffort");
    }

    #[test]
    fn expansion_follows_kubernetes() {
        let lookup = |name: &str| match name {
            "A" => Some("1"),
            _ => None,
        };
        assert_eq!(expand("$(A)-$(B)-$$(A)-$$-$-$(A", lookup), "1-$(B)-$(A)-$-$-$(A");
    }
}
