//! Container logs (the kubelet's `kuberuntime/logs` and `logs` container log manager): the CRI
//! log files containerd writes for each container
//! (`<pod_log_dir>/<namespace>_<name>_<uid>/<container>/<attempt>.log`, lines of
//! `<RFC3339Nano> <stdout|stderr> <F|P> <text>`), read for `kubectl logs` and rotated by size.
//!
//! - [`cri_log`]: the pure core: a record parsed, partial records (`P`) joined into lines,
//!   `sinceTime`, `timestamps` and `limitBytes` applied ([`cri_log::LogWriter`]), and where the
//!   last `tailLines` lines start ([`cri_log::tail_start`]).
//! - [`read`]: the I/O: the rotated files then the current one, and `follow` (a 250 ms poll of
//!   the open file while it has nothing new: the agent has no inotify dependency, and a
//!   quarter-second poll of one file costs nothing measurable; a file rotated meanwhile is
//!   drained, then the new one opened; it ends when the container stops or the reader goes).
//! - [`rotate`]: the container log manager: every 10 s a running container's file larger
//!   than `--container-log-max-size` is renamed to `<attempt>.log.<timestamp>` and the runtime
//!   reopens it (CRI `ReopenContainerLog`); at most `--container-log-max-files` files are kept
//!   per container; log files of runs the runtime no longer holds are removed.

pub mod cri_log;
pub mod read;
pub mod rotate;

use std::path::{Path, PathBuf};

/// A container run's log file: `<pod_log_dir>/<namespace>_<name>_<uid>/<container>/<attempt>.log`
/// (what `runtime::spec` gives CRI as the sandbox's log directory and the container's log path).
pub fn container_log_path(
    pod_log_dir: &Path,
    namespace: &str,
    pod: &str,
    uid: &str,
    container: &str,
    attempt: u32,
) -> PathBuf {
    pod_log_dir.join(format!("{namespace}_{pod}_{uid}")).join(container).join(format!("{attempt}.log"))
}
