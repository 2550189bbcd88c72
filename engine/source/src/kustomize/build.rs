//! Runs kustomize (`kubectl kustomize`) on a private copy of the files a kustomization reads:
//! files only (no symlinks), kustomize's own load restrictor on, no plugins, no Helm, no network
//! (remote bases are refused before), a time limit and a bound on its output.

use crate::{Limits, ManifestError};
use serde_yaml::Value as Yaml;
use std::{
    io::Read,
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

/// How long one build may take: kustomize renders the published kustomizations in 0.1-0.2 s.
const TIMEOUT: Duration = Duration::from_secs(20);

/// What kustomize may say on stderr that is kept for an error.
const MAX_STDERR: u64 = 16 << 10;

/// Builds the kustomization `root_file` (in the directory `root`) from `files` (repository
/// paths and contents): kustomize's YAML output, every object annotated with its origin.
pub(crate) fn build(
    root: &str,
    root_file: &str,
    files: &[(String, Vec<u8>)],
    limits: &Limits,
) -> Result<String, Box<ManifestError>> {
    let failed = |message: String| Box::new(ManifestError::new(root_file, message));
    let tmp = tempfile::Builder::new()
        .prefix("gitplane-kustomize-")
        .tempdir()
        .map_err(|e| failed(format!("cannot make a directory for kustomize: {e}")))?;
    for (path, content) in files {
        let content = match path == root_file {
            true => with_origin_annotations(root_file, content)?,
            false => content.clone(),
        };
        let target = tmp.path().join(path);
        let written =
            target.parent().map_or(Ok(()), std::fs::create_dir_all).and_then(|()| std::fs::write(&target, content));
        written.map_err(|e| failed(format!("cannot copy {path} for kustomize: {e}")))?;
    }
    let dir = if root.is_empty() { tmp.path().to_owned() } else { tmp.path().join(root) };
    run(&dir, tmp.path(), limits).map_err(failed)
}

/// The root kustomization with `buildMetadata: [originAnnotations]`, so that each object says
/// which file it came from.
fn with_origin_annotations(file: &str, content: &[u8]) -> Result<Vec<u8>, Box<ManifestError>> {
    let invalid = |e: serde_yaml::Error| Box::new(ManifestError::new(file, format!("is not a kustomization: {e}")));
    let mut kustomization: Yaml = serde_yaml::from_slice(content).map_err(invalid)?;
    let Some(map) = kustomization.as_mapping_mut() else {
        return Err(Box::new(ManifestError::new(file, "is not a kustomization: it is not a YAML mapping")));
    };
    let metadata = map.entry("buildMetadata".into()).or_insert_with(|| Yaml::Sequence(Vec::new()));
    if let Some(list) = metadata.as_sequence_mut()
        && !list.iter().any(|v| v.as_str() == Some("originAnnotations"))
    {
        list.push("originAnnotations".into());
    }
    serde_yaml::to_string(&Yaml::Mapping(std::mem::take(map))).map(String::into_bytes).map_err(invalid)
}

/// `kubectl kustomize DIR`, inside `home`, bounded in time and output.
fn run(dir: &Path, home: &Path, limits: &Limits) -> Result<String, String> {
    let mut child = Command::new("timeout")
        .args(["--kill-after=2", &TIMEOUT.as_secs().to_string(), "kubectl", "kustomize"])
        .args(["--load-restrictor", "LoadRestrictionsRootOnly"])
        .arg(dir)
        .env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("HOME", home)
        .current_dir(home)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run kubectl kustomize (is kubectl installed?): {e}"))?;
    let stderr = child.stderr.take();
    let errors = std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(stderr) = stderr {
            // What does not fit is dropped: the first lines say what went wrong.
            let _ = stderr.take(MAX_STDERR).read_to_string(&mut text);
        }
        text
    });
    let mut output = Vec::new();
    let read = child.stdout.take().map(|out| out.take(limits.max_total_bytes + 1).read_to_end(&mut output));
    if output.len() as u64 > limits.max_total_bytes {
        let _ = child.kill();
        let _ = child.wait();
        let limit = crate::human_bytes(limits.max_total_bytes);
        return Err(format!("kustomize renders more than {limit}: split the kustomization across Applications"));
    }
    let status = child.wait().map_err(|e| format!("kubectl kustomize: {e}"))?;
    let stderr = errors.join().unwrap_or_default();
    match status.code() {
        Some(0) => {}
        Some(124 | 137) => return Err(format!("kustomize took more than {} s: make it smaller", TIMEOUT.as_secs())),
        _ => return Err(format!("kustomize: {}", message(&stderr, home))),
    }
    if let Some(Err(e)) = read {
        return Err(format!("reading kustomize's output: {e}"));
    }
    String::from_utf8(output).map_err(|_| "kustomize's output is not UTF-8".into())
}

/// kustomize's error without its log prefix and with paths relative to the repository.
fn message(stderr: &str, home: &Path) -> String {
    let home = format!("{}/", home.display());
    let line = stderr
        .lines()
        .filter(|l| !l.starts_with("# Warning"))
        .find(|l| !l.trim().is_empty())
        .unwrap_or("it failed without saying why");
    let line = match line.split_once("err=\"") {
        Some((_, err)) => err.strip_suffix('"').unwrap_or(err).replace("\\\"", "\"").replace("\\'", "'"),
        None => line.to_owned(),
    };
    line.replace(&home, "").replace(home.trim_end_matches('/'), ".")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kustomize::ORIGIN;

    #[test]
    fn t10_origin_annotations_are_added_once() {
        for (text, expected) in [
            ("resources: [a.yaml]\n", "resources:\n- a.yaml\nbuildMetadata:\n- originAnnotations\n"),
            ("buildMetadata: [originAnnotations]\n", "buildMetadata:\n- originAnnotations\n"),
        ] {
            let out = with_origin_annotations("k.yaml", text.as_bytes()).unwrap();
            assert_eq!(String::from_utf8(out).unwrap(), expected);
        }
        assert!(with_origin_annotations("k.yaml", b"- a\n").is_err());
    }

    #[test]
    fn t10_error_messages_drop_the_log_prefix_and_the_copy() {
        let home = Path::new("/tmp/gitplane-kustomize-x");
        let stderr = "# Warning: 'bases' is deprecated.\nE1207 08:27:01.678469    4973 run.go:72] \"command failed\" \
                      err=\"accumulating resources: accumulation err='accumulating resources from 'web.yaml': \
                      open /tmp/gitplane-kustomize-x/app/web.yaml: no such file or directory'\"\n";
        assert_eq!(
            message(stderr, home),
            "accumulating resources: accumulation err='accumulating resources from 'web.yaml': open app/web.yaml: \
             no such file or directory'"
        );
    }

    /// kustomize itself, on a base and an overlay: the names it gives, and the origins.
    #[test]
    fn t10_kubectl_kustomize_builds_with_origins() {
        let files = vec![
            ("base/kustomization.yaml".to_owned(), b"resources: [web.yaml]\n".to_vec()),
            (
                "base/web.yaml".to_owned(),
                b"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: web}\ndata: {a: '1'}\n".to_vec(),
            ),
            ("app/kustomization.yaml".to_owned(), b"namePrefix: prod-\nresources: [../base]\n".to_vec()),
        ];
        let out = build("app", "app/kustomization.yaml", &files, &Limits::default()).unwrap();
        assert!(out.contains("name: prod-web"), "{out}");
        assert!(out.contains(&format!("{ORIGIN}: |\n      path: ../base/web.yaml")), "{out}");
    }
}
