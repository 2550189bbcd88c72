//! The kubelet's volume ownership management (`SetVolumeOwnership`): every file of a volume
//! gets the Pod's `fsGroup` as its group and group read (and write, unless the volume is
//! read-only); directories get the setgid bit too, so what containers create inherits the group.
//! `OnRootMismatch` skips the walk when the volume's root already has the group and the bits.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

const RW_MASK: u32 = 0o660;
const RO_MASK: u32 = 0o440;
const EXEC_MASK: u32 = 0o110;
const SETGID: u32 = 0o2000;

/// `fsGroupChangePolicy`: `Always` (the default) or `OnRootMismatch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangePolicy {
    Always,
    OnRootMismatch,
}

impl ChangePolicy {
    pub fn of(policy: Option<&str>) -> Self {
        match policy {
            Some("OnRootMismatch") => ChangePolicy::OnRootMismatch,
            _ => ChangePolicy::Always,
        }
    }
}

/// The mode a file gets (its permission bits, setgid included): `None` for a symlink, whose
/// mode is left alone.
pub fn mode_for(mode: u32, is_dir: bool, is_symlink: bool, read_only: bool) -> Option<u32> {
    if is_symlink {
        return None;
    }
    let mut mask = if read_only { RO_MASK } else { RW_MASK };
    if is_dir {
        mask |= SETGID | EXEC_MASK;
    }
    Some((mode & 0o7777) | mask)
}

/// The kubelet's `requiresPermissionChange`: whether a volume's root (`gid`, `mode`) is not yet
/// what ownership management makes it.
pub fn requires_change(gid: u32, mode: u32, is_dir: bool, fs_group: u32, read_only: bool) -> bool {
    if gid != fs_group || !is_dir {
        return true;
    }
    let wanted = if read_only { RO_MASK } else { RW_MASK } | EXEC_MASK;
    mode & wanted != wanted || mode & SETGID == 0
}

/// Gives the volume at `root` to `fs_group` as `policy` says.
pub fn set_volume_ownership(root: &Path, fs_group: u32, policy: ChangePolicy, read_only: bool) -> std::io::Result<()> {
    if policy == ChangePolicy::OnRootMismatch {
        let meta = std::fs::metadata(root)?;
        if !requires_change(meta.gid(), meta.mode(), meta.is_dir(), fs_group, read_only) {
            return Ok(());
        }
    }
    walk(root, fs_group, read_only)
}

/// Changes `path` and, for a directory, everything under it; symlinks are not followed.
fn walk(path: &Path, fs_group: u32, read_only: bool) -> std::io::Result<()> {
    let meta = std::fs::symlink_metadata(path)?;
    std::os::unix::fs::lchown(path, None, Some(fs_group))?;
    let kind = meta.file_type();
    if let Some(mode) = mode_for(meta.mode(), kind.is_dir(), kind.is_symlink(), read_only) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    }
    if kind.is_dir() {
        for entry in std::fs::read_dir(path)? {
            walk(&entry?.path(), fs_group, read_only)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_follow_the_kubelet() {
        let cases = [
            // (mode, dir, symlink, read-only) -> mode
            ((0o644, false, false, false), Some(0o664)),
            ((0o644, false, false, true), Some(0o644)),
            ((0o600, false, false, true), Some(0o640)),
            ((0o755, true, false, false), Some(0o2775)),
            ((0o777, true, false, false), Some(0o2777)),
            ((0o700, true, false, true), Some(0o2750)),
            ((0o40755, true, false, false), Some(0o2775)),
            ((0o777, false, true, false), None),
        ];
        for ((mode, dir, symlink, read_only), expected) in cases {
            assert_eq!(mode_for(mode, dir, symlink, read_only), expected, "{mode:o} {dir} {symlink} {read_only}");
        }
    }

    #[test]
    fn on_root_mismatch_looks_at_the_root_only() {
        let cases = [
            // (gid, mode, dir, read-only) -> change
            ((2000, 0o2775, true, false), false),
            ((2000, 0o2777, true, false), false),
            ((0, 0o2775, true, false), true),
            ((2000, 0o775, true, false), true),
            ((2000, 0o2755, true, false), true),
            ((2000, 0o2750, true, true), false),
            ((2000, 0o2664, false, false), true),
        ];
        for ((gid, mode, dir, read_only), expected) in cases {
            assert_eq!(requires_change(gid, mode, dir, 2000, read_only), expected, "{gid} {mode:o} {dir} {read_only}");
        }
        assert_eq!(ChangePolicy::of(Some("OnRootMismatch")), ChangePolicy::OnRootMismatch);
        assert_eq!(ChangePolicy::of(None), ChangePolicy::Always);
    }
}
