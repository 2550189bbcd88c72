//! The pure part of gitplane's GitOps source: read the manifests of a commit, parse them,
//! validate them.
//!
//! This crate owns the path from a Git commit to validated objects:
//!
//! - [`git`]: the YAML files under a directory of a branch head, read from the object database
//!   (never a checkout), or from a plain directory for offline validation;
//! - [`manifest`]: multi-document YAML into JSON values, with the line of each document;
//! - [`validate`]: accepted kinds, strict schemas, names, scope, duplicates, defaulted namespace;
//! - [`error`]: errors that say where (file, line, object, JSON pointer) and what to do.
//!
//! Invariants:
//! - It never writes anything: not the repository, not the store, not the filesystem. The sync
//!   loop applies its output.
//! - Git content is hostile input: sizes are checked before reading, symlinks never leave the
//!   synced directory, nothing on this path panics on input.
//! - Secret values never appear in an error or a `Debug` output.

pub mod error;
pub mod git;
mod locate;
pub mod manifest;
pub mod validate;

pub use error::{ManifestError, SourceError, redacted};
pub use git::{Commit, read_commit, read_dir};
pub use manifest::{Document, parse};
pub use validate::{Manifest, Validator};

use std::fmt;

/// Bounds on what one commit may hold, so a hostile push cannot exhaust the control plane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest manifest file. Also bounds the values one file may expand to through YAML
    /// aliases, so a small file cannot blow up in memory.
    pub max_file_bytes: u64,
    /// All manifest files of a commit together.
    pub max_total_bytes: u64,
    /// YAML documents of a commit (and manifest files, each of which holds at least one).
    pub max_documents: usize,
    /// Entries (files and directories of any name) walked under the directory. A Git tree may
    /// name one subtree many times, so without a bound a tiny push could make the walk
    /// exponential.
    pub max_tree_entries: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_file_bytes: 1 << 20,
            max_total_bytes: 64 << 20,
            max_documents: 10_000,
            max_tree_entries: 1_000_000,
        }
    }
}

/// One manifest file as read from Git or a directory.
#[derive(Clone, PartialEq, Eq)]
pub struct ManifestFile {
    /// Relative to the repository root (or to the directory given to [`read_dir`]), `/`-separated.
    pub path: String,
    pub content: Vec<u8>,
}

// The content may hold Secret values: never print it.
impl fmt::Debug for ManifestFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManifestFile").field("path", &self.path).field("bytes", &self.content.len()).finish()
    }
}

/// Parses and validates manifest files: [`parse`] then [`Validator::validate`], with the errors
/// of both collected and sorted by file and line.
pub fn load(
    files: &[ManifestFile],
    validator: &Validator,
    default_namespace: &str,
    limits: &Limits,
) -> Result<Vec<Manifest>, Vec<ManifestError>> {
    let (documents, mut errors) = manifest::parse_all(files, limits);
    match validator.validate(documents, default_namespace) {
        Ok(manifests) if errors.is_empty() => return Ok(manifests),
        Ok(_) => {}
        Err(more) => errors.extend(more),
    }
    let rank = |file: &str| files.iter().position(|f| f.path == file).unwrap_or(usize::MAX);
    errors.sort_by_key(|e| (rank(&e.file), e.line.unwrap_or(0), e.column.unwrap_or(0)));
    Err(errors)
}

/// `1 MiB`, `1.5 KiB`, `12 bytes`: sizes in error messages.
pub(crate) fn human_bytes(bytes: u64) -> String {
    const UNITS: [(&str, u64); 3] = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (unit, size) in UNITS {
        if bytes >= size {
            let whole = bytes / size;
            let tenths = (bytes % size) * 10 / size;
            return if tenths == 0 { format!("{whole} {unit}") } else { format!("{whole}.{tenths} {unit}") };
        }
    }
    if bytes == 1 { "1 byte".into() } else { format!("{bytes} bytes") }
}

#[cfg(test)]
mod tests {
    use super::*;
    use git2::{Repository, Signature};

    /// A bare repository whose `main` holds `files` (paths one directory deep at most).
    fn commit(files: &[(&str, &str)]) -> (tempfile::TempDir, std::path::PathBuf) {
        let tmp = tempfile::TempDir::new().unwrap();
        let path = tmp.path().join("demo.git");
        let repo = Repository::init_bare(&path).unwrap();
        let mut root = repo.treebuilder(None).unwrap();
        let mut dirs: std::collections::BTreeMap<&str, git2::TreeBuilder> = Default::default();
        for (file, content) in files {
            let blob = repo.blob(content.as_bytes()).unwrap();
            match file.split_once('/') {
                Some((dir, name)) => {
                    let builder = dirs.entry(dir).or_insert_with(|| repo.treebuilder(None).unwrap());
                    builder.insert(name, blob, 0o100644).unwrap();
                }
                None => {
                    root.insert(file, blob, 0o100644).unwrap();
                }
            }
        }
        for (dir, builder) in dirs {
            root.insert(dir, builder.write().unwrap(), 0o040000).unwrap();
        }
        let tree = repo.find_tree(root.write().unwrap()).unwrap();
        let sig = Signature::now("t", "t@example.com").unwrap();
        repo.commit(Some("refs/heads/main"), &sig, &sig, "Demo", &tree, &[]).unwrap();
        (tmp, path)
    }

    const DEMO: &str = "\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 2
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
        - name: web
          image: gitplane.local/httpd:1
          ports:
            - containerPort: 80
          resources:
            requests: {cpu: 100m, memory: 32Mi}
---
apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  selector: {app: web}
  ports:
    - port: 80
      targetPort: 80
";

    #[test]
    fn t10_a_demo_commit_loads() {
        let (_tmp, repo) = commit(&[("deploy/web.yaml", DEMO), ("README.md", "hi")]);
        let limits = Limits::default();
        let commit = read_commit(&repo, "main", "deploy", &limits).unwrap();
        assert_eq!(commit.subject, "Demo");
        let manifests = load(&commit.files, &Validator::new(), "demo", &limits).unwrap();
        let keys: Vec<_> = manifests.iter().map(|m| (m.key.to_string(), m.line)).collect();
        assert_eq!(keys, [("Deployment.apps demo/web".into(), 1), ("Service demo/web".into(), 21)]);
    }

    #[test]
    fn t90_an_application_loads() {
        let app = "apiVersion: gitplane.io/v1\nkind: Application\nmetadata: {name: demo, namespace: gitplane-system}\nspec: {repo: demo, path: deploy}\n";
        let files = [ManifestFile { path: "apps/demo.yaml".into(), content: app.as_bytes().to_vec() }];
        let manifests = load(&files, &Validator::new(), "demo", &Limits::default()).unwrap();
        assert_eq!(manifests[0].key.to_string(), "Application.gitplane.io gitplane-system/demo");
    }

    #[test]
    fn t10_a_broken_commit_reports_every_error() {
        let broken = DEMO
            .replace("replicas: 2", "replicas: \"two\"")
            .replace("targetPort: 80", "targetPort: 80\n      nodePortt: 1");
        let (_tmp, repo) = commit(&[("deploy/web.yaml", &broken), ("deploy/z.yaml", "a: [\n")]);
        let commit = read_commit(&repo, "main", "deploy", &Limits::default()).unwrap();
        let errors = load(&commit.files, &Validator::new(), "default", &Limits::default()).unwrap_err();
        let errors: Vec<_> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(
            errors,
            [
                r#"deploy/web.yaml:6: Deployment web: /spec/replicas: "two" is not of type "integer""#,
                r#"deploy/web.yaml:30: Service web: /spec/ports/0: unknown field "nodePortt" (did you mean "nodePort"?)"#,
                "deploy/z.yaml:2:1: did not find expected node content, while parsing a flow node",
            ]
        );
    }

    #[test]
    fn t10_human_bytes() {
        assert_eq!(human_bytes(12), "12 bytes");
        assert_eq!(human_bytes(1 << 20), "1 MiB");
        assert_eq!(human_bytes(3 << 19), "1.5 MiB");
        assert_eq!(human_bytes(64 << 20), "64 MiB");
    }

    #[test]
    fn t10_manifest_file_debug_hides_content() {
        let file = ManifestFile { path: "s.yaml".into(), content: b"password: hunter2".to_vec() };
        assert_eq!(format!("{file:?}"), r#"ManifestFile { path: "s.yaml", bytes: 17 }"#);
    }
}
