//! Removal of a pod's cgroup directories, which runc leaves behind (kubelet's pod cgroup
//! cleanup does the same).

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The mount points of every cgroup v1 hierarchy and cgroup2 in a `/proc/<pid>/mountinfo`.
pub fn hierarchies(mountinfo: &str) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = Vec::new();
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let fstype = right.split(' ').next().unwrap_or("");
        let Some(mount_point) = left.split(' ').nth(4) else {
            continue;
        };
        if matches!(fstype, "cgroup" | "cgroup2") {
            let path = PathBuf::from(unescape(mount_point));
            if !found.contains(&path) {
                found.push(path);
            }
        }
    }
    found
}

/// mountinfo escapes space, tab, newline and backslash as octal (`\040`).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && let Some(code) = field.get(i + 1..i + 4).and_then(|o| u8::from_str_radix(o, 8).ok())
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

/// Removes `cgroup` (e.g. `/gitplane/pod<uid>`) and whatever runc left below it, in every
/// hierarchy of this process's mount namespace. Directories whose last tasks are still exiting
/// are busy for a moment, so busy ones are retried until `patience` runs out.
pub fn remove_cgroup(cgroup: &str, patience: Duration) -> io::Result<()> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    let relative = cgroup.trim_start_matches('/');
    let deadline = Instant::now() + patience;
    let mut first_error = None;
    for root in hierarchies(&mountinfo) {
        let dir = root.join(relative);
        loop {
            match remove_tree(&dir) {
                Ok(()) => break,
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => {
                    first_error.get_or_insert(io::Error::new(e.kind(), format!("{}: {e}", dir.display())));
                    break;
                }
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// The uids of the pod cgroups (`pod<uid>`) below `parent` in any hierarchy.
pub fn pod_cgroup_uids(parent: &str) -> io::Result<Vec<String>> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    let relative = parent.trim_start_matches('/');
    let mut uids: Vec<String> = hierarchies(&mountinfo)
        .into_iter()
        .filter_map(|root| std::fs::read_dir(root.join(relative)).ok())
        .flat_map(|entries| entries.flatten())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().to_str()?.strip_prefix("pod").map(str::to_owned))
        .collect();
    uids.sort();
    uids.dedup();
    Ok(uids)
}

/// rmdir bottom-up: cgroup directories only disappear with rmdir, never with unlink.
fn remove_tree(dir: &Path) -> io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            remove_tree(&entry.path())?;
        }
    }
    match std::fs::remove_dir(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_v1_hierarchies_and_cgroup2() {
        let mountinfo = "\
23 27 0:22 / /sys rw,relatime - sysfs sysfs rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
42 31 0:38 / /mnt/odd\\040dir rw,relatime shared:5 - cgroup2 cgroup2 rw
";
        assert_eq!(
            hierarchies(mountinfo),
            [
                PathBuf::from("/sys/fs/cgroup/cpu"),
                PathBuf::from("/sys/fs/cgroup/systemd"),
                PathBuf::from("/sys/fs/cgroup/unified"),
                PathBuf::from("/mnt/odd dir"),
            ]
        );
    }

    #[test]
    fn remove_tree_is_bottom_up_and_tolerates_absence() {
        let dir = std::env::temp_dir().join(format!("gp-cgroup-test-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("a/b")).expect("mkdir");
        remove_tree(&dir).expect("removed");
        assert!(!dir.exists());
        remove_tree(&dir).expect("absent is fine");
    }
}
