//! gitplane's own images. No registry is reachable, so the node builds its pause (sandbox) and
//! httpd images from the host's static busybox (`images/build-images.sh`, embedded) and imports
//! them into containerd's `k8s.io` namespace, where CRI finds them.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::process::Command;

use crate::kubelet::cri::{Cri, pb};

/// The pod sandbox image: sleeps until SIGTERM/SIGINT, then exits 0.
pub const PAUSE_IMAGE: &str = "gitplane.local/pause:1";
/// busybox httpd serving a page containing `gitplane httpd` on port 80.
pub const HTTPD_IMAGE: &str = "gitplane.local/httpd:1";
/// The builder: `sh -s OUT_DIR` writes `OUT_DIR/pause.tar` and `OUT_DIR/httpd.tar` (with
/// `STAND_IN_*` set, the stand-in of a published image that the test kit's registry serves).
pub const BUILD_SCRIPT: &str = include_str!("../../images/build-images.sh");

/// Each image and the tarball the build script makes for it.
const IMAGES: [(&str, &str); 2] = [(PAUSE_IMAGE, "pause.tar"), (HTTPD_IMAGE, "httpd.tar")];
const BUSYBOX: &str = "/bin/busybox";

#[derive(Debug, thiserror::Error)]
pub enum ImagesError {
    #[error("image {image}: ImageStatus: {source}")]
    Status { image: String, source: tonic::Status },
    #[error(
        "{BUSYBOX} is missing: it is what gitplane's images are built from; install it with `apt-get install busybox-static`"
    )]
    BusyboxMissing,
    #[error("`ctr` is missing: it imports gitplane's images; install it with `apt-get install containerd`")]
    CtrMissing,
    #[error("running {what}: {source}")]
    Io { what: String, source: std::io::Error },
    #[error("building images into {dir} failed ({status}): {stderr}")]
    Build { dir: PathBuf, status: std::process::ExitStatus, stderr: String },
    #[error("importing {tarball} into containerd at {socket} failed ({status}): {stderr}")]
    Import { tarball: PathBuf, socket: PathBuf, status: std::process::ExitStatus, stderr: String },
    #[error("image {image} was imported but the runtime's CRI does not list it")]
    NotVisible { image: String },
}

/// Makes sure gitplane's images are in the runtime: builds and imports the missing ones.
/// Returns the images it imported (empty when all were present).
pub async fn ensure_images(cri: &Cri, socket: &Path, work_dir: &Path) -> Result<Vec<&'static str>, ImagesError> {
    let mut missing = Vec::new();
    for (image, tarball) in IMAGES {
        if !image_present(cri, image).await? {
            missing.push((image, tarball));
        }
    }
    if missing.is_empty() {
        return Ok(Vec::new());
    }
    if !Path::new(BUSYBOX).is_file() {
        return Err(ImagesError::BusyboxMissing);
    }
    let ctr = find_program("ctr").ok_or(ImagesError::CtrMissing)?;

    build(work_dir).await?;
    for (image, tarball) in &missing {
        let tarball = work_dir.join(tarball);
        let started = Instant::now();
        let out = Command::new(&ctr)
            .arg("-a")
            .arg(socket)
            .args(["-n", "k8s.io", "images", "import"])
            .arg(&tarball)
            .stdin(Stdio::null())
            .output()
            .await
            .map_err(|source| ImagesError::Io { what: format!("{} images import", ctr.display()), source })?;
        if !out.status.success() {
            return Err(ImagesError::Import {
                tarball,
                socket: socket.to_path_buf(),
                status: out.status,
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        tracing::info!(image, elapsed = ?started.elapsed(), "imported image");
        // CRI learns of imported images from containerd's events, which may trail the import.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !image_present(cri, image).await? {
            if Instant::now() >= deadline {
                return Err(ImagesError::NotVisible { image: image.to_string() });
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    Ok(missing.into_iter().map(|(image, _)| image).collect())
}

async fn image_present(cri: &Cri, image: &str) -> Result<bool, ImagesError> {
    let request = pb::ImageStatusRequest {
        image: Some(pb::ImageSpec { image: image.to_string(), ..Default::default() }),
        verbose: false,
    };
    let status = cri
        .images()
        .image_status(request)
        .await
        .map_err(|source| ImagesError::Status { image: image.to_string(), source })?;
    Ok(status.into_inner().image.is_some())
}

/// Runs the embedded build script with `sh -s OUT_DIR`.
async fn build(out_dir: &Path) -> Result<(), ImagesError> {
    let io = |what: &str| {
        let what = what.to_string();
        move |source| ImagesError::Io { what, source }
    };
    std::fs::create_dir_all(out_dir).map_err(io("creating the image build directory"))?;
    let mut child = Command::new("sh")
        .arg("-s")
        .arg(out_dir)
        .env("BUSYBOX", BUSYBOX)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(io("sh (image build script)"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(BUILD_SCRIPT.as_bytes()).await.map_err(io("feeding the image build script"))?;
    }
    let out = child.wait_with_output().await.map_err(io("image build script"))?;
    if !out.status.success() {
        return Err(ImagesError::Build {
            dir: out_dir.to_path_buf(),
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into());
    std::env::split_paths(&path).map(|dir| dir.join(name)).find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The script builds both layouts, byte-identical on a second run (stable digests).
    #[test]
    fn build_script_is_reproducible() {
        if !Path::new(BUSYBOX).is_file() {
            eprintln!("skipping: {BUSYBOX} missing (apt-get install busybox-static)");
            return;
        }
        let base = std::env::temp_dir().join(format!("gp-images-test-{}", std::process::id()));
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let mut digests = Vec::new();
        for run in ["a", "b"] {
            let dir = base.join(run);
            runtime.block_on(build(&dir)).expect("build script succeeds");
            let tars: Vec<Vec<u8>> =
                IMAGES.iter().map(|(_, tarball)| std::fs::read(dir.join(tarball)).expect("tarball written")).collect();
            digests.push(tars);
        }
        std::fs::remove_dir_all(&base).expect("clean up");
        assert!(digests[0] == digests[1], "two builds differ");
        let index = tar_entry(&digests[0][1], "index.json").expect("index.json in httpd.tar");
        let index: serde_json::Value = serde_json::from_slice(&index).expect("index.json is JSON");
        let manifest = &index["manifests"][0];
        assert_eq!(manifest["annotations"]["io.containerd.image.name"], HTTPD_IMAGE);
        assert_eq!(manifest["annotations"]["org.opencontainers.image.ref.name"], "1");
        assert_eq!(manifest["platform"]["os"], "linux");
        // The httpd image's layer has every applet by name, and a wget that takes -T.
        let layer = layer_of(&digests[0][1], manifest);
        for applet in ["bin/cat", "bin/ls", "bin/nslookup", "bin/sh"] {
            assert!(tar_link(&layer, applet).as_deref() == Some("busybox"), "{applet} -> busybox");
        }
        let wget = String::from_utf8(tar_entry(&layer, "bin/wget").expect("bin/wget")).unwrap();
        assert!(wget.starts_with("#!/bin/busybox sh") && wget.contains("timeout"), "{wget}");
    }

    /// The (single) layer of the image whose index descriptor is `manifest`.
    fn layer_of(tar: &[u8], manifest: &serde_json::Value) -> Vec<u8> {
        let blob = |digest: &serde_json::Value| {
            let digest = digest.as_str().unwrap().trim_start_matches("sha256:");
            tar_entry(tar, &format!("blobs/sha256/{digest}")).expect("blob")
        };
        let image: serde_json::Value = serde_json::from_slice(&blob(&manifest["digest"])).unwrap();
        blob(&image["layers"][0]["digest"])
    }

    /// The target of one symbolic link in a tarball.
    fn tar_link(tar: &[u8], wanted: &str) -> Option<String> {
        entries(tar)
            .find(|(name, header, _)| name == wanted && header[156] == b'2')
            .map(|(_, header, _)| String::from_utf8_lossy(&header[157..257]).trim_end_matches('\0').to_string())
    }

    /// Reads one regular file out of an uncompressed ustar/GNU tarball.
    fn tar_entry(tar: &[u8], wanted: &str) -> Option<Vec<u8>> {
        entries(tar).find(|(name, header, _)| name == wanted && header[156] != b'2').map(|(_, _, body)| body.to_vec())
    }

    /// (name, header, body) of each entry of an uncompressed ustar/GNU tarball.
    fn entries(tar: &[u8]) -> impl Iterator<Item = (String, &[u8], &[u8])> {
        let mut at = 0;
        std::iter::from_fn(move || {
            let header = tar.get(at..at + 512)?;
            let name = String::from_utf8_lossy(&header[..100]).trim_end_matches('\0').to_string();
            if name.is_empty() {
                return None;
            }
            let size_field = String::from_utf8_lossy(&header[124..136]);
            let size = usize::from_str_radix(size_field.trim_matches(['\0', ' ']), 8).ok()?;
            let body = tar.get(at + 512..at + 512 + size)?;
            at += 512 + size.div_ceil(512) * 512;
            Some((name, header, body))
        })
    }
}
