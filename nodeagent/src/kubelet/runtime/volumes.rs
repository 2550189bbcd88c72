//! The kubelet's volume manager for the volumes whose content the node makes: configMap, secret,
//! downwardAPI and projected (written with the [`atomic_writer`], again on every sync, so a
//! change in Git, or a renewed ServiceAccount token, reaches running containers in place) and
//! emptyDir with `medium: Memory` (a tmpfs). They live in `<pod_dir>/<uid>/volumes/<plugin>/<name>`;
//! secret and projected volumes are on a tmpfs too, as the kubelet keeps Secrets and tokens off
//! the node's disk.
//!
//! Mounts are made in the agent's mount namespace, which is containerd's (the agent runs in its
//! node's pinned mount namespace, see `host`), so the bind mount CRI makes of the directory
//! carries the tmpfs. [`tear_down`] unmounts them before the Pod's directory is removed.
//!
//! With a Pod `fsGroup`, the volumes that support ownership management (emptyDir, the content
//! volumes, claims on `local` volumes; not hostPath) are given to that group ([`ownership`]).

pub mod atomic_writer;
pub mod host_path;
pub mod ownership;
pub mod projection;

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use gitplane_api::{
    quantity::parse_units,
    volumes::{source_with_article, unmountable_source},
};
use k8s_openapi::api::core::v1::{Pod, Volume};

use super::config::RuntimeConfig;
use super::env::ConfigSource;
use super::fields::{SpecError, pod_namespace, safe_name};

const CONFIG_MAP: &str = "kubernetes.io~configmap";
const SECRET: &str = "kubernetes.io~secret";
const DOWNWARD_API: &str = "kubernetes.io~downward-api";
const PROJECTED: &str = "kubernetes.io~projected";
const EMPTY_DIR: &str = "kubernetes.io~empty-dir";

/// Why a volume could not be set up: the kubelet's `MountVolume.SetUp failed` message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("MountVolume.SetUp failed for volume {volume:?}: {message}")]
pub struct VolumeError {
    pub volume: String,
    pub message: String,
}

/// The node directory of a configMap, secret, downwardAPI or projected volume; `None` for other
/// kinds.
pub fn host_path(cfg: &RuntimeConfig, uid: &str, volume: &Volume) -> Result<Option<PathBuf>, SpecError> {
    let plugin = if volume.config_map.is_some() {
        CONFIG_MAP
    } else if volume.secret.is_some() {
        SECRET
    } else if volume.downward_api.is_some() {
        DOWNWARD_API
    } else if volume.projected.is_some() {
        PROJECTED
    } else {
        return Ok(None);
    };
    let name = safe_name("volume name", &volume.name)?;
    Ok(Some(cfg.pod_dir.join(uid).join("volumes").join(plugin).join(name)))
}

/// The directory a claim's volume is, on this node.
pub struct ClaimVolume {
    pub path: PathBuf,
    /// Made if absent (`hostPath.type: DirectoryOrCreate`, as local-path provisions them).
    pub create: bool,
    /// A `local` volume, whose ownership the kubelet manages (a `hostPath` one it leaves alone).
    pub local: bool,
}

/// The directory of the volume bound to claim `namespace/name` (its `hostPath` or `local`
/// path), or why there is none yet.
pub fn claim_volume(namespace: &str, name: &str, objects: &dyn ConfigSource) -> Result<ClaimVolume, String> {
    let claim = objects
        .persistent_volume_claim(namespace, name)
        .ok_or_else(|| format!("persistentvolumeclaim \"{name}\" not found"))?;
    let volume_name = claim.spec.as_ref().and_then(|s| s.volume_name.as_deref()).filter(|v| !v.is_empty());
    let volume_name = volume_name.ok_or_else(|| format!("persistentvolumeclaim \"{name}\" is not bound yet"))?;
    let volume = objects
        .persistent_volume(volume_name)
        .ok_or_else(|| format!("persistentvolume \"{volume_name}\" not found"))?;
    let spec = volume.spec.as_ref();
    if let Some(host) = spec.and_then(|s| s.host_path.as_ref()) {
        let create = host.type_.as_deref() == Some("DirectoryOrCreate");
        return Ok(ClaimVolume { path: PathBuf::from(&host.path), create, local: false });
    }
    if let Some(local) = spec.and_then(|s| s.local.as_ref()) {
        return Ok(ClaimVolume { path: PathBuf::from(&local.path), create: false, local: true });
    }
    let source = spec.and_then(|s| serde_json::to_value(s).ok()).and_then(|s| unmountable_source(&s));
    Err(match source {
        Some(source) => format!(
            "persistentvolume \"{volume_name}\" is {}: no volume plugin matched (gitplane's nodes mount hostPath \
             and local volumes); use a claim of the default local-path StorageClass instead",
            source_with_article(source)
        ),
        None => {
            format!("persistentvolume \"{volume_name}\" has neither hostPath nor local: this node mounts only those")
        }
    })
}

/// Why this node cannot mount `volume`, when it has no plugin for its source (an nfs, csi or
/// cloud disk volume): the kubelet's "no volume plugin matched", which keeps the Pod waiting.
pub fn missing_plugin(volume: &Volume) -> Option<String> {
    let mounted = volume.persistent_volume_claim.is_some()
        || volume.config_map.is_some()
        || volume.secret.is_some()
        || volume.downward_api.is_some()
        || volume.projected.is_some()
        || volume.empty_dir.is_some()
        || volume.host_path.is_some();
    if mounted {
        return None;
    }
    let what = match serde_json::to_value(volume).ok().as_ref().and_then(unmountable_source) {
        Some(source) => source_with_article(source),
        None => "a volume of this type".to_owned(),
    };
    Some(format!(
        "no volume plugin matched: gitplane's nodes cannot mount {what}; use a persistentVolumeClaim of the default \
         local-path StorageClass, or a hostPath volume"
    ))
}

/// Whether the pod has a volume this module sets up (or, for a typed hostPath, checks).
pub fn has_volumes(pod: &Pod) -> bool {
    pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()).any(|v| {
        v.persistent_volume_claim.is_some()
            || v.config_map.is_some()
            || v.secret.is_some()
            || v.downward_api.is_some()
            || v.projected.is_some()
            || v.empty_dir.is_some()
            || v.host_path.as_ref().is_some_and(|h| h.type_.as_deref().is_some_and(|t| !t.is_empty()))
            || missing_plugin(v).is_some()
    })
}

/// Makes every such volume of `pod` hold what it should now. A volume that fails keeps what it
/// held (the kubelet does not empty a volume whose ConfigMap went away); the error is returned
/// only for a volume that was never set up, which the Pod must wait for. `mounted(volume)` says
/// whether the volume was set up for this Pod before (in this process); a first set up is the
/// kubelet's mount, which manages ownership. Returns the volumes set up for the first time.
pub fn set_up(
    pod: &Pod,
    uid: &str,
    cfg: &RuntimeConfig,
    objects: &dyn ConfigSource,
    mounted: &dyn Fn(&str) -> bool,
) -> Result<Vec<String>, VolumeError> {
    let namespace = pod_namespace(pod);
    let security = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let fs_group = security.and_then(|s| s.fs_group).and_then(|g| u32::try_from(g).ok());
    let policy = ownership::ChangePolicy::of(security.and_then(|s| s.fs_group_change_policy.as_deref()));
    let own = |dir: &Path, policy, read_only| match fs_group {
        Some(group) => ownership::set_volume_ownership(dir, group, policy, read_only)
            .map_err(|e| format!("giving {} to fsGroup {group}: {e}", dir.display())),
        None => Ok(()),
    };
    let mut mount_table: Option<Vec<PathBuf>> = None;
    let mut mounting = Vec::new();
    for volume in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
        let fail = |message: String| VolumeError { volume: volume.name.clone(), message };
        let name = safe_name("volume name", &volume.name).map_err(|e| fail(e.to_string()))?;
        if let Some(message) = missing_plugin(volume) {
            return Err(fail(message));
        }
        let first = !mounted(name);
        if first {
            mounting.push(name.to_owned());
        }
        if let Some(claim) = &volume.persistent_volume_claim {
            let bound = claim_volume(namespace, &claim.claim_name, objects).map_err(fail)?;
            if bound.create && !bound.path.is_dir() {
                make_shared_dir(&bound.path).map_err(|e| fail(format!("creating {}: {e}", bound.path.display())))?;
            } else if !bound.path.is_dir() {
                return Err(fail(format!("{} is not a directory on this node", bound.path.display())));
            }
            if bound.local && first {
                own(&bound.path, policy, claim.read_only.unwrap_or(false)).map_err(fail)?;
            }
            continue;
        }
        if let Some(host) = &volume.host_path {
            host_path::check(Path::new(&host.path), host.type_.as_deref().unwrap_or_default()).map_err(fail)?;
            continue;
        }
        if let Some(empty) = volume.empty_dir.as_ref().filter(|e| e.medium.as_deref() == Some("Memory")) {
            let dir = cfg.pod_dir.join(uid).join("volumes").join(EMPTY_DIR).join(name);
            let size = match &empty.size_limit {
                Some(q) => {
                    Some(parse_units(&q.0).ok_or_else(|| fail(format!("sizeLimit {:?} is not a quantity", q.0)))?)
                }
                None => None,
            };
            ensure_tmpfs(&dir, size, mount_table.get_or_insert_with(mount_points))
                .map_err(|e| fail(format!("mounting a tmpfs on {}: {e}", dir.display())))?;
            if first {
                own(&dir, policy, false).map_err(fail)?;
            }
            continue;
        }
        if volume.empty_dir.is_some() {
            let dir = cfg.pod_dir.join(uid).join("volumes").join(EMPTY_DIR).join(name);
            if !dir.is_dir() {
                make_shared_dir(&dir).map_err(|e| fail(format!("creating {}: {e}", dir.display())))?;
            }
            if first {
                own(&dir, policy, false).map_err(fail)?;
            }
            continue;
        }
        let Some(dir) = host_path(cfg, uid, volume).map_err(|e| fail(e.to_string()))? else { continue };
        let payload = if let Some(source) = &volume.config_map {
            projection::config_map(source, objects.config_map(namespace, &source.name).as_deref(), namespace)
        } else if let Some(source) = &volume.secret {
            on_tmpfs(pod, volume, &dir, mount_table.get_or_insert_with(mount_points)).map_err(fail)?;
            let name = source.secret_name.as_deref().unwrap_or_default();
            projection::secret(source, objects.secret(namespace, name).as_deref(), namespace)
        } else if let Some(source) = &volume.downward_api {
            projection::downward_api(source, pod, cfg)
        } else if let Some(source) = &volume.projected {
            on_tmpfs(pod, volume, &dir, mount_table.get_or_insert_with(mount_points)).map_err(fail)?;
            projection::projected(source, pod, cfg, objects)
        } else {
            continue;
        };
        let result = payload.and_then(|payload| {
            let changed =
                atomic_writer::write(&dir, &payload, SystemTime::now()).map_err(|e| format!("writing {}: {e}", dir.display()))?;
            if changed {
                tracing::info!(pod = ?pod.metadata.name, volume = %volume.name, files = payload.len(), "volume written");
            }
            // As the kubelet, after each write of these read-only volumes, whatever the policy.
            if first || changed {
                own(&dir, ownership::ChangePolicy::Always, true)?;
            }
            Ok(())
        });
        if let Err(message) = result {
            if !atomic_writer::written(&dir) {
                return Err(fail(message));
            }
            tracing::warn!(pod = ?pod.metadata.name, volume = %volume.name, error = %message, "volume kept as it was");
        }
    }
    Ok(mounting)
}

/// Makes `dir` and a tmpfs on it, for files that must stay off the node's disk; without the
/// tmpfs they are still served, from the disk, and the log says so.
fn on_tmpfs(pod: &Pod, volume: &Volume, dir: &Path, mounted: &mut Vec<PathBuf>) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    if let Err(e) = ensure_tmpfs(dir, None, mounted) {
        tracing::warn!(pod = ?pod.metadata.name, volume = %volume.name, error = %e,
            "no tmpfs for the volume; its files are on the node's disk");
    }
    Ok(())
}

/// A provisioned volume's or an emptyDir's directory: 0777, as local-path-provisioner and the
/// kubelet make them, so a container running as any user can write its data.
fn make_shared_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777))
}

/// Mounts a tmpfs on `dir` unless one is there.
fn ensure_tmpfs(dir: &Path, size: Option<i128>, mounted: &mut Vec<PathBuf>) -> std::io::Result<()> {
    if mounted.iter().any(|m| m == dir) {
        return Ok(());
    }
    std::fs::create_dir_all(dir)?;
    let mut options = String::from("mode=0755");
    if let Some(size) = size.filter(|s| *s > 0) {
        options.push_str(&format!(",size={size}"));
    }
    mount_tmpfs(dir, &options)?;
    mounted.push(dir.to_owned());
    Ok(())
}

fn c_path(path: &Path) -> std::io::Result<std::ffi::CString> {
    use std::os::unix::ffi::OsStrExt;
    std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(std::io::Error::other)
}

fn mount_tmpfs(dir: &Path, options: &str) -> std::io::Result<()> {
    let target = c_path(dir)?;
    let data = std::ffi::CString::new(options).map_err(std::io::Error::other)?;
    // SAFETY: mount(2) with NUL-terminated strings that outlive the call.
    let rc = unsafe {
        libc::mount(
            c"tmpfs".as_ptr(),
            target.as_ptr(),
            c"tmpfs".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            data.as_ptr().cast(),
        )
    };
    if rc == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}

/// The mount points of this mount namespace (`/proc/self/mountinfo`'s fifth field, unescaped).
fn mount_points() -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines().filter_map(|line| line.split(' ').nth(4)).map(|p| PathBuf::from(unescape_mount_path(p))).collect()
}

/// mountinfo writes space, tab, newline and backslash as octal escapes (`\040`).
fn unescape_mount_path(path: &str) -> String {
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && let Ok(code) = u8::from_str_radix(std::str::from_utf8(&bytes[i + 1..i + 4]).unwrap_or("x"), 8)
        {
            out.push(code);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Unmounts everything mounted under `pod_dir` (deepest first), so that the directory can be
/// removed without reaching into a tmpfs that something still holds.
pub fn tear_down(pod_dir: &Path) -> std::io::Result<()> {
    let mut under: Vec<PathBuf> =
        mount_points().into_iter().filter(|m| m.starts_with(pod_dir) && m != pod_dir).collect();
    under.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
    under.dedup();
    for point in under {
        let target = c_path(&point)?;
        // SAFETY: umount2(2) with a NUL-terminated path.
        if unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) } != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINVAL) && e.raw_os_error() != Some(libc::ENOENT) {
                return Err(e);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume, PersistentVolumeClaim, Secret};
    use std::sync::Arc;

    #[test]
    fn mountinfo_paths_are_unescaped() {
        assert_eq!(unescape_mount_path("/var/lib/a\\040b"), "/var/lib/a b");
        assert_eq!(unescape_mount_path("/plain"), "/plain");
        assert_eq!(unescape_mount_path("/odd\\"), "/odd\\");
    }

    #[test]
    fn volumes_live_under_the_pod_by_plugin() {
        let cfg = RuntimeConfig { pod_dir: "/pods".into(), ..Default::default() };
        let volume: Volume =
            serde_json::from_value(serde_json::json!({"name": "conf", "configMap": {"name": "x"}})).unwrap();
        assert_eq!(
            host_path(&cfg, "u", &volume).unwrap(),
            Some(PathBuf::from("/pods/u/volumes/kubernetes.io~configmap/conf"))
        );
        let volume: Volume =
            serde_json::from_value(serde_json::json!({"name": "s", "secret": {"secretName": "x"}})).unwrap();
        assert_eq!(
            host_path(&cfg, "u", &volume).unwrap(),
            Some(PathBuf::from("/pods/u/volumes/kubernetes.io~secret/s"))
        );
        let volume: Volume = serde_json::from_value(serde_json::json!({"name": "..", "downwardAPI": {}})).unwrap();
        assert!(host_path(&cfg, "u", &volume).is_err());
    }

    /// A claim and its volume, as the agent's informer holds them.
    struct Claims(PersistentVolume);

    impl ConfigSource for Claims {
        fn config_map(&self, _: &str, _: &str) -> Option<Arc<ConfigMap>> {
            None
        }
        fn secret(&self, _: &str, _: &str) -> Option<Arc<Secret>> {
            None
        }
        fn persistent_volume_claim(&self, namespace: &str, name: &str) -> Option<Arc<PersistentVolumeClaim>> {
            let claim = serde_json::json!({"metadata": {"name": name, "namespace": namespace},
                "spec": {"volumeName": self.0.metadata.name}});
            Some(Arc::new(serde_json::from_value(claim).unwrap()))
        }
        fn persistent_volume(&self, name: &str) -> Option<Arc<PersistentVolume>> {
            (self.0.metadata.name.as_deref() == Some(name)).then(|| Arc::new(self.0.clone()))
        }
    }

    /// A volume whose plugin the node lacks keeps the Pod waiting with the kubelet's "no volume
    /// plugin matched", whether in the Pod or behind its claim; nothing is created for it.
    #[test]
    fn volumes_without_a_plugin_fail_to_mount() {
        let instead = "use a persistentVolumeClaim of the default local-path StorageClass, or a hostPath volume";
        let claim = "use a claim of the default local-path StorageClass instead";
        let cases = [
            (
                serde_json::json!({"name": "data", "nfs": {"server": "s", "path": "/x"}}),
                serde_json::json!({"hostPath": {"path": "/"}}),
                Some(format!(
                    "MountVolume.SetUp failed for volume \"data\": no volume plugin matched: gitplane's nodes cannot \
                     mount an nfs volume; {instead}"
                )),
            ),
            (
                serde_json::json!({"name": "disk", "awsElasticBlockStore": {"volumeID": "v"}}),
                serde_json::json!({"hostPath": {"path": "/"}}),
                Some(format!(
                    "MountVolume.SetUp failed for volume \"disk\": no volume plugin matched: gitplane's nodes cannot \
                     mount an awsElasticBlockStore volume; {instead}"
                )),
            ),
            (
                serde_json::json!({"name": "data", "persistentVolumeClaim": {"claimName": "c"}}),
                serde_json::json!({"nfs": {"server": "s", "path": "/x"}}),
                Some(format!(
                    "MountVolume.SetUp failed for volume \"data\": persistentvolume \"pv\" is an nfs volume: no \
                     volume plugin matched (gitplane's nodes mount hostPath and local volumes); {claim}"
                )),
            ),
            (
                serde_json::json!({"name": "data", "persistentVolumeClaim": {"claimName": "c"}}),
                serde_json::json!({"hostPath": {"path": "/"}}),
                None,
            ),
        ];
        let dir = std::env::temp_dir().join(format!("gp-volumes-{}", std::process::id()));
        let cfg = RuntimeConfig { pod_dir: dir.clone(), ..Default::default() };
        for (volume, source, expected) in cases {
            let pod: Pod = serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p", "namespace": "default", "uid": "u"},
                "spec": {"containers": [{"name": "c", "image": "i"}], "volumes": [volume]}}))
            .unwrap();
            let pv = serde_json::json!({"metadata": {"name": "pv"}, "spec": source});
            let objects = Claims(serde_json::from_value(pv).unwrap());
            assert!(has_volumes(&pod), "{volume}");
            let got = set_up(&pod, "u", &cfg, &objects, &|_| false);
            assert_eq!(got.err().map(|e| e.to_string()), expected, "{volume}");
        }
        assert!(!dir.exists(), "nothing is made for a volume that cannot be mounted");
    }
}
