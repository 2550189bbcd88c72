//! A hostPath volume's `type`, checked (and for `DirectoryOrCreate` / `FileOrCreate` made)
//! before the Pod's containers start, as the kubelet's hostPath plugin does; a failed check is the
//! volume's `MountVolume.SetUp failed` with the kubelet's words.

use std::fs::{self, OpenOptions};
use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::Path;

/// Checks `path` against `type_` (empty: no check). `Err` is the kubelet's message.
pub fn check(path: &Path, type_: &str) -> Result<(), String> {
    let shown = path.display();
    let kind = || fs::metadata(path).ok().map(|m| m.file_type());
    let not = |what: &str| Err(format!("hostPath type check failed: {shown} is not {what}"));
    match type_ {
        "" => Ok(()),
        "DirectoryOrCreate" if kind().is_none() => {
            fs::create_dir_all(path).map_err(|e| format!("creating {shown}: {e}"))?;
            fs::set_permissions(path, fs::Permissions::from_mode(0o755)).map_err(|e| format!("chmod {shown}: {e}"))
        }
        "DirectoryOrCreate" | "Directory" if kind().is_some_and(|k| k.is_dir()) => Ok(()),
        "DirectoryOrCreate" | "Directory" => not("a directory"),
        // The parent directory is not made, as the kubelet does not.
        "FileOrCreate" if kind().is_none() => OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .open(path)
            .map(drop)
            .map_err(|e| format!("creating {shown}: {e}")),
        "FileOrCreate" | "File" if kind().is_some_and(|k| k.is_file()) => Ok(()),
        "FileOrCreate" | "File" => not("a file"),
        "Socket" if kind().is_some_and(|k| k.is_socket()) => Ok(()),
        "Socket" => not("a socket file"),
        "CharDevice" if kind().is_some_and(|k| k.is_char_device()) => Ok(()),
        "CharDevice" => not("a character device"),
        "BlockDevice" if kind().is_some_and(|k| k.is_block_device()) => Ok(()),
        "BlockDevice" => not("a block device"),
        other => Err(format!("{other} is an invalid volume type")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_as_the_kubelet_checks_them() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("file");
        fs::write(&file, "x").unwrap();
        let socket_path = dir.path().join("sock");
        let _socket = std::os::unix::net::UnixListener::bind(&socket_path).unwrap();
        let missing = dir.path().join("missing");
        let d = dir.path().display();
        for (path, type_, expected) in [
            (dir.path().to_owned(), "", Ok(())),
            (missing.clone(), "", Ok(())),
            (dir.path().to_owned(), "Directory", Ok(())),
            (file.clone(), "Directory", Err(format!("hostPath type check failed: {d}/file is not a directory"))),
            (missing.clone(), "Directory", Err(format!("hostPath type check failed: {d}/missing is not a directory"))),
            (file.clone(), "File", Ok(())),
            (dir.path().to_owned(), "File", Err(format!("hostPath type check failed: {d} is not a file"))),
            (file.clone(), "FileOrCreate", Ok(())),
            (
                file.clone(),
                "DirectoryOrCreate",
                Err(format!("hostPath type check failed: {d}/file is not a directory")),
            ),
            (socket_path.clone(), "Socket", Ok(())),
            (file.clone(), "Socket", Err(format!("hostPath type check failed: {d}/file is not a socket file"))),
            ("/dev/null".into(), "CharDevice", Ok(())),
            (
                file.clone(),
                "CharDevice",
                Err(format!("hostPath type check failed: {d}/file is not a character device")),
            ),
            (
                "/dev/null".into(),
                "BlockDevice",
                Err("hostPath type check failed: /dev/null is not a block device".into()),
            ),
            (file.clone(), "Pipe", Err("Pipe is an invalid volume type".into())),
        ] {
            assert_eq!(check(&path, type_), expected, "{} {type_}", path.display());
        }
        // The OrCreate types make what is missing: a directory with its parents, a file.
        let made = dir.path().join("a/b");
        assert_eq!(check(&made, "DirectoryOrCreate"), Ok(()));
        assert!(made.is_dir());
        assert_eq!(fs::metadata(&made).unwrap().permissions().mode() & 0o777, 0o755);
        let new_file = made.join("f");
        assert_eq!(check(&new_file, "FileOrCreate"), Ok(()));
        assert!(new_file.is_file());
        assert!(check(&dir.path().join("no/parent"), "FileOrCreate").unwrap_err().starts_with("creating "));
    }
}
