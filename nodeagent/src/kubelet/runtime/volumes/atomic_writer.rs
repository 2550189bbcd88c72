//! The kubelet's AtomicWriter (`pkg/volume/util/atomic_writer.go`): a volume's files are written
//! into a fresh timestamped directory, then the `..data` symlink is swapped to it with one
//! rename, and the paths users see are symlinks through `..data`. A container that reads the
//! volume sees the old set of files or the new one, never a mix, and a change is seen in place
//! (the container mounts the volume's directory, not the files).
//!
//! ```text
//! <volume>/..2026_12_03_16_15_34.000000001/key   the data
//! <volume>/..data -> ..2026_12_03_16_15_34.000000001
//! <volume>/key -> ..data/key
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Component, Path};
use std::time::SystemTime;

const DATA_DIR: &str = "..data";
const DATA_DIR_TMP: &str = "..data_tmp";

/// One file of a volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileProjection {
    pub data: Vec<u8>,
    pub mode: u32,
}

/// A volume's files by relative path.
pub type Payload = BTreeMap<String, FileProjection>;

/// Why a path cannot be a file of a volume (the API server's `validateLocalDescendingPath`).
pub fn check_path(path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err("a path must not be empty".into());
    }
    if path.starts_with('/') {
        return Err(format!("path {path:?} must be relative"));
    }
    if path.split('/').any(|part| part == "..") {
        return Err(format!("path {path:?} must not contain '..'"));
    }
    if path.starts_with("..") {
        return Err(format!("path {path:?} must not start with '..'"));
    }
    Ok(())
}

/// The first component of each path: what users see at the volume's top, each a symlink into
/// `..data`.
pub fn user_visible(paths: impl IntoIterator<Item = impl AsRef<str>>) -> BTreeSet<String> {
    paths
        .into_iter()
        .filter_map(|p| {
            Path::new(p.as_ref()).components().find_map(|c| match c {
                Component::Normal(name) => Some(name.to_string_lossy().into_owned()),
                _ => None,
            })
        })
        .collect()
}

/// The data directory's name for `now` (the kubelet's `..2006_01_02_15_04_05.` prefix), with
/// nanoseconds so two writes in one second differ.
fn data_dir_name(now: SystemTime) -> String {
    let since = now.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let secs = i64::try_from(since.as_secs()).unwrap_or(0);
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!(
        "..{y:04}_{m:02}_{d:02}_{:02}_{:02}_{:02}.{:09}",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60,
        since.subsec_nanos()
    )
}

/// Days since 1970-01-01 to (year, month, day), Howard Hinnant's algorithm.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// The files under `dir`, by path relative to it.
fn read_tree(dir: &Path) -> io::Result<Payload> {
    fn walk(root: &Path, dir: &Path, out: &mut Payload) -> io::Result<()> {
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let kind = entry.file_type()?;
            if kind.is_dir() {
                walk(root, &entry.path(), out)?;
            } else if kind.is_file() {
                let path = entry.path();
                let relative = path.strip_prefix(root).unwrap_or(&path).to_string_lossy().into_owned();
                let mode = entry.metadata()?.permissions().mode() & 0o7777;
                out.insert(relative, FileProjection { data: std::fs::read(&path)?, mode });
            }
        }
        Ok(())
    }
    let mut out = Payload::new();
    walk(dir, dir, &mut out)?;
    Ok(out)
}

/// Makes `dir` hold exactly `payload`, atomically; whether anything was written. Paths must have
/// passed [`check_path`].
pub fn write(dir: &Path, payload: &Payload, now: SystemTime) -> io::Result<bool> {
    for path in payload.keys() {
        check_path(path).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    }
    std::fs::create_dir_all(dir)?;
    let old = std::fs::read_link(dir.join(DATA_DIR)).ok().map(|target| dir.join(target));
    let old_payload = match &old {
        Some(old) => read_tree(old).ok(),
        None => None,
    };
    if old_payload.as_ref() == Some(payload) {
        return Ok(false);
    }

    let new_name = data_dir_name(now);
    let new_dir = dir.join(&new_name);
    std::fs::create_dir(&new_dir)?;
    std::fs::set_permissions(&new_dir, std::fs::Permissions::from_mode(0o755))?;
    for (path, file) in payload {
        let target = new_dir.join(path);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&target, &file.data)?;
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(file.mode & 0o7777))?;
    }

    // The swap: a new symlink renamed over the old one is one atomic step.
    let tmp = dir.join(DATA_DIR_TMP);
    let _ = std::fs::remove_file(&tmp);
    symlink(&new_name, &tmp)?;
    std::fs::rename(&tmp, dir.join(DATA_DIR))?;

    let visible = user_visible(payload.keys());
    for top in &visible {
        let link = dir.join(top);
        if std::fs::symlink_metadata(&link).is_err() {
            symlink(Path::new(DATA_DIR).join(top), &link)?;
        }
    }
    if let Some(old_payload) = &old_payload {
        for stale in user_visible(old_payload.keys()).difference(&visible) {
            let link = dir.join(stale);
            if std::fs::symlink_metadata(&link).is_ok_and(|m| m.file_type().is_symlink()) {
                std::fs::remove_file(link)?;
            }
        }
    }
    if let Some(old) = old.filter(|old| *old != new_dir) {
        std::fs::remove_dir_all(old)?;
    }
    Ok(true)
}

/// Whether `dir` was written at least once (its `..data` exists).
pub fn written(dir: &Path) -> bool {
    std::fs::symlink_metadata(dir.join(DATA_DIR)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn payload(files: &[(&str, &str, u32)]) -> Payload {
        files
            .iter()
            .map(|(p, d, m)| (p.to_string(), FileProjection { data: d.as_bytes().to_vec(), mode: *m }))
            .collect()
    }

    fn scratch() -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("gp-atomic-{}-{}", std::process::id(), rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        names.sort();
        names
    }

    #[test]
    fn paths_stay_inside_the_volume() {
        assert!(check_path("a/b.txt").is_ok());
        for bad in ["", "/etc/passwd", "../x", "a/../../x", "..x", "a/.."] {
            assert!(check_path(bad).is_err(), "{bad}");
        }
        assert_eq!(user_visible(["a/b", "a/c", "d"]), BTreeSet::from(["a".to_string(), "d".to_string()]));
    }

    #[test]
    fn data_directories_are_named_by_their_time() {
        let t = SystemTime::UNIX_EPOCH + Duration::new(1_764_778_534, 7);
        assert_eq!(data_dir_name(t), "..2025_12_03_16_15_34.000000007");
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }

    #[test]
    fn writes_swap_the_data_directory_and_keep_links_through_it() {
        let dir = scratch();
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_764_778_534);
        let first = payload(&[("mode", "fast", 0o644), ("conf/app.ini", "[a]", 0o400)]);
        assert!(write(&dir, &first, t0).unwrap());
        assert_eq!(entries(&dir), ["..2025_12_03_16_15_34.000000000", "..data", "conf", "mode"]);
        assert_eq!(std::fs::read_link(dir.join("mode")).unwrap(), Path::new("..data/mode"));
        assert_eq!(std::fs::read_to_string(dir.join("conf/app.ini")).unwrap(), "[a]");
        let mode = std::fs::metadata(dir.join("conf/app.ini")).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o400);
        assert!(!write(&dir, &first, t0 + Duration::from_secs(1)).unwrap(), "the same files: nothing written");

        let second = payload(&[("mode", "slow", 0o644), ("level", "debug", 0o600)]);
        assert!(write(&dir, &second, t0 + Duration::from_secs(2)).unwrap());
        assert_eq!(entries(&dir), ["..2025_12_03_16_15_36.000000000", "..data", "level", "mode"]);
        assert_eq!(std::fs::read_to_string(dir.join("mode")).unwrap(), "slow");
        assert_eq!(std::fs::read_to_string(dir.join("level")).unwrap(), "debug");
        assert!(write(&dir, &Payload::new(), t0 + Duration::from_secs(3)).unwrap());
        assert_eq!(entries(&dir), ["..2025_12_03_16_15_37.000000000", "..data"]);
        assert!(written(&dir));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
