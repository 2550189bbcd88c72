//! The kubelet's container log manager: keeps each container's logs within
//! `max_size` x `max_files` so that a chatty container cannot fill the node's disk.
//!
//! Every [`CHECK_PERIOD`] (one CRI list and a `stat` per container, so cheap): the file of a
//! running container that reached `max_size` is renamed to `<attempt>.log.<timestamp>` and
//! the runtime asked to reopen its log (CRI `ReopenContainerLog`; renamed back if it cannot);
//! the oldest rotated files go so that at most `max_files` remain, the current one included;
//! and the files of runs the runtime no longer holds (the runtime keeps one previous run per
//! container, for `--previous`) are removed, as the kubelet's container GC does.

use super::{container_log_path, read::rotated_files};
use crate::kubelet::cri::{Cri, pb};
use crate::kubelet::runtime::spec::{LABEL_CONTAINER_NAME, LABEL_POD_NAME, LABEL_POD_NAMESPACE, LABEL_POD_UID};
use k8s_openapi::jiff::Timestamp;
use std::{
    collections::HashSet,
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

/// How often the sizes are checked (the kubelet's `containerLogMonitorInterval`).
pub const CHECK_PERIOD: Duration = Duration::from_secs(10);
/// A log file of no known run is removed only once it is this old, so that a run being created
/// while the runtime is listed never loses its file.
const STALE_AFTER: Duration = Duration::from_secs(60);

/// The kubelet's `containerLogMaxSize` and `containerLogMaxFiles`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogRotation {
    /// A running container's file is rotated once it holds this many bytes.
    pub max_size: u64,
    /// Files kept per container run, the current one included (at least 2).
    pub max_files: usize,
}

impl Default for LogRotation {
    fn default() -> Self {
        LogRotation { max_size: 10 << 20, max_files: 5 }
    }
}

/// The rotated files to remove (oldest first) so that, with the current file and `rotating`
/// (one more rotated file about to be made), at most `max_files` remain.
pub fn excess(rotated: &[PathBuf], max_files: usize, rotating: bool) -> &[PathBuf] {
    let keep = max_files.max(2) - 1 - usize::from(rotating);
    &rotated[..rotated.len().saturating_sub(keep)]
}

/// The name a rotated file gets: `<path>.<YYYYMMDD-HHMMSS>` (UTC), the kubelet's format.
pub fn rotated_name(path: &Path, now: Timestamp) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{}", now.strftime("%Y%m%d-%H%M%S")));
    PathBuf::from(name)
}

/// The run (`attempt`) a file of a container's log directory belongs to: `<attempt>.log` or
/// `<attempt>.log.<timestamp>`.
pub fn attempt_of(file_name: &str) -> Option<u32> {
    let (attempt, rest) = file_name.split_once(".log")?;
    let rotated = rest.strip_prefix('.').is_some_and(super::read::is_rotation_suffix);
    (rest.is_empty() || rotated).then(|| attempt.parse().ok()).flatten()
}

/// One log file found under the pod log directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogFile {
    pub uid: String,
    pub container: String,
    pub attempt: u32,
    pub path: PathBuf,
    pub modified: SystemTime,
}

/// The files of runs the runtime does not hold, among pods it holds (`live`: (uid, container,
/// attempt) of every container), old enough not to be a run being created.
pub fn stale<'a>(
    files: &'a [LogFile],
    live: &HashSet<(String, String, u32)>,
    now: SystemTime,
) -> impl Iterator<Item = &'a LogFile> {
    let pods: HashSet<&str> = live.iter().map(|(uid, _, _)| uid.as_str()).collect();
    files.iter().filter(move |f| {
        pods.contains(f.uid.as_str())
            && !live.contains(&(f.uid.clone(), f.container.clone(), f.attempt))
            && now.duration_since(f.modified).is_ok_and(|age| age >= STALE_AFTER)
    })
}

/// Every container log file under `pod_log_dir` (`<ns>_<name>_<uid>/<container>/<file>`).
fn log_files(pod_log_dir: &Path) -> Vec<LogFile> {
    let mut found = Vec::new();
    let entries = |dir: &Path| std::fs::read_dir(dir).into_iter().flatten().flatten();
    for pod in entries(pod_log_dir) {
        let Some(uid) = pod.file_name().to_str().and_then(|n| n.rsplit_once('_')).map(|(_, uid)| uid.to_owned()) else {
            continue;
        };
        for container in entries(&pod.path()) {
            let Some(name) = container.file_name().to_str().map(str::to_owned) else { continue };
            for file in entries(&container.path()) {
                let (Some(attempt), Ok(meta)) = (file.file_name().to_str().and_then(attempt_of), file.metadata())
                else {
                    continue;
                };
                found.push(LogFile {
                    uid: uid.clone(),
                    container: name.clone(),
                    attempt,
                    path: file.path(),
                    modified: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                });
            }
        }
    }
    found
}

/// Runs the container log manager until dropped.
pub async fn run(cri: Cri, pod_log_dir: PathBuf, rotation: LogRotation) {
    let mut tick = tokio::time::interval(CHECK_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(e) = check(&cri, &pod_log_dir, rotation).await {
            tracing::warn!(error = %e, "checking container log sizes failed");
        }
    }
}

/// One pass: rotate, trim, and remove the files of runs that are gone.
pub async fn check(cri: &Cri, pod_log_dir: &Path, rotation: LogRotation) -> Result<(), tonic::Status> {
    // Files first, then the runtime: a file listed belongs to a run created before the list.
    let dir = pod_log_dir.to_path_buf();
    let files = tokio::task::spawn_blocking(move || log_files(&dir)).await.unwrap_or_default();
    let listed = cri.runtime().list_containers(pb::ListContainersRequest { filter: None }).await?.into_inner();
    let mut live = HashSet::new();
    for container in listed.containers {
        let label = |key: &str| container.labels.get(key).map(String::as_str).unwrap_or_default();
        let (namespace, pod, uid, name) =
            (label(LABEL_POD_NAMESPACE), label(LABEL_POD_NAME), label(LABEL_POD_UID), label(LABEL_CONTAINER_NAME));
        if uid.is_empty() || name.is_empty() {
            continue; // not one of ours
        }
        let attempt = container.metadata.as_ref().map_or(0, |m| m.attempt);
        live.insert((uid.to_owned(), name.to_owned(), attempt));
        let path = container_log_path(pod_log_dir, namespace, pod, uid, name, attempt);
        let running = container.state == pb::ContainerState::ContainerRunning as i32;
        let size = tokio::fs::metadata(&path).await.map(|m| m.len()).unwrap_or(0);
        let rotating = running && size >= rotation.max_size;
        let rotated = rotated_files(&path);
        for old in excess(&rotated, rotation.max_files, rotating) {
            remove(old).await;
        }
        if rotating {
            rotate(cri, &container.id, &path).await;
        }
    }
    for file in stale(&files, &live, SystemTime::now()) {
        remove(&file.path).await;
    }
    Ok(())
}

async fn remove(path: &Path) {
    match tokio::fs::remove_file(path).await {
        Ok(()) => tracing::debug!(file = %path.display(), "removed container log file"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(file = %path.display(), error = %e, "removing a container log file failed"),
    }
}

/// The kubelet's `rotateLatestLog`: rename, then the runtime reopens the file at `path`.
async fn rotate(cri: &Cri, id: &str, path: &Path) {
    let rotated = rotated_name(path, Timestamp::now());
    if let Err(e) = tokio::fs::rename(path, &rotated).await {
        tracing::warn!(file = %path.display(), error = %e, "rotating a container log failed");
        return;
    }
    let request = pb::ReopenContainerLogRequest { container_id: id.to_owned() };
    if let Err(status) = cri.runtime().reopen_container_log(request).await {
        // The container keeps writing to the renamed file: give it its name back.
        tracing::warn!(container = %id, error = %status.message(), "the runtime did not reopen the container's log");
        if let Err(e) = tokio::fs::rename(&rotated, path).await {
            tracing::warn!(file = %rotated.display(), error = %e, "renaming a rotated log back failed");
        }
        return;
    }
    tracing::info!(container = %id, file = %rotated.display(), "rotated container log");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_at_most_max_files_with_the_current_one() {
        let rotated: Vec<PathBuf> = ["0.log.20261203-160000", "0.log.20261203-160010", "0.log.20261203-160020"]
            .iter()
            .map(PathBuf::from)
            .collect();
        assert_eq!(excess(&rotated, 5, false), &[] as &[PathBuf]);
        assert_eq!(excess(&rotated, 4, false), &[] as &[PathBuf]);
        assert_eq!(excess(&rotated, 4, true), &rotated[..1]);
        assert_eq!(excess(&rotated, 2, true), &rotated[..]);
        assert_eq!(excess(&rotated, 2, false), &rotated[..2]);
        // Fewer than 2 is taken as 2: the current file and the one rotated last.
        assert_eq!(excess(&rotated, 0, false), &rotated[..2]);
    }

    #[test]
    fn names_rotated_files_as_the_kubelet() {
        let now: Timestamp = "2026-12-03T16:15:34.5Z".parse().unwrap();
        assert_eq!(rotated_name(Path::new("/l/p/c/3.log"), now), PathBuf::from("/l/p/c/3.log.20261203-161534"));
        assert_eq!(attempt_of("3.log"), Some(3));
        assert_eq!(attempt_of("3.log.20261203-161534"), Some(3));
        for other in ["3.log.tmp", "x.log", "3.txt", "3.log.20261203161534", ".log"] {
            assert_eq!(attempt_of(other), None, "{other}");
        }
    }

    #[test]
    fn removes_only_old_files_of_runs_the_runtime_dropped() {
        let now = SystemTime::now();
        let old = now - Duration::from_secs(600);
        let file = |uid: &str, attempt: u32, modified| LogFile {
            uid: uid.into(),
            container: "app".into(),
            attempt,
            path: PathBuf::from(format!("{uid}/app/{attempt}.log")),
            modified,
        };
        let files =
            [file("u1", 0, old), file("u1", 1, old), file("u1", 2, old), file("u1", 5, now), file("u2", 0, old)];
        let live = HashSet::from([("u1".to_owned(), "app".to_owned(), 1), ("u1".to_owned(), "app".to_owned(), 2)]);
        let gone: Vec<u32> = stale(&files, &live, now).map(|f| f.attempt).collect();
        // Run 0 is gone; run 5 is too new to judge; pod u2 is not the runtime's (kill_pod's).
        assert_eq!(gone, [0]);
    }
}
