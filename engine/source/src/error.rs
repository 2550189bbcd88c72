//! Errors of the source: [`SourceError`] for the repository and its limits, [`ManifestError`]
//! for what is wrong in a manifest, located by file, line, object and JSON pointer.

use serde_json::Value;
use std::{borrow::Cow, fmt, path::PathBuf};

/// What stops a commit (or a directory) from being read at all.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("no Git repository at {}: create one with git init --bare {}", repo.display(), repo.display())]
    RepositoryNotFound {
        repo: PathBuf,
        #[source]
        source: git2::Error,
    },
    #[error("cannot open Git repository {}: {source}", repo.display())]
    OpenRepository {
        repo: PathBuf,
        #[source]
        source: git2::Error,
    },
    #[error("{branch:?} is not a valid branch name: use a name like main")]
    InvalidBranch { branch: String },
    #[error("repository {repo} has no branch {branch}: push one with git push <url> {branch}")]
    NoBranch { repo: String, branch: String },
    #[error("{dir:?} is not a valid directory: use a path inside the repository, without .. (empty for the root)")]
    InvalidDir { dir: String },
    #[error("commit {commit} of {repo} has no directory {dir}: create it, or fix the path")]
    DirNotFound { repo: String, commit: String, dir: String },
    #[error("{dir} in commit {commit} of {repo} is not a directory: point the path at a directory")]
    NotADirectory { repo: String, commit: String, dir: String },
    #[error("{} is not a directory: point at the directory that holds the manifests", dir.display())]
    NotADirectoryOnDisk { dir: PathBuf },
    #[error(
        "{file} is {}, over the limit of {} per manifest file: split it into smaller files",
        crate::human_bytes(*size),
        crate::human_bytes(*limit)
    )]
    FileTooLarge { file: String, size: u64, limit: u64 },
    #[error(
        "the manifests add up to more than {} at {file}: split them across Applications",
        crate::human_bytes(*limit)
    )]
    TotalTooLarge { file: String, limit: u64 },
    #[error("more than {limit} manifest files in {dir}: split them across Applications")]
    TooManyFiles { dir: String, limit: usize },
    #[error("more than {limit} files and directories in {dir}: point the path at the directory of the manifests")]
    TooManyEntries { dir: String, limit: usize },
    #[error("{file} is a symlink to {target}, which is outside {dir}: point it inside, or copy the file")]
    SymlinkEscapes { file: String, target: String, dir: String },
    #[error("{file} is a symlink to the absolute path {target}: use a relative target inside {dir}")]
    SymlinkAbsolute { file: String, target: String, dir: String },
    #[error("{file} is a symlink to {target}, which does not exist: fix or remove the link")]
    SymlinkBroken { file: String, target: String },
    #[error("{file} is a symlink to {target}, which is not a regular file: link to a manifest file")]
    SymlinkNotFile { file: String, target: String },
    #[error("{file} is a symlink through more than {hops} links: point it at the file directly")]
    SymlinkLoop { file: String, hops: usize },
    #[error("the path {file} is not UTF-8: rename it")]
    NonUtf8Path { file: String },
    #[error("reading {what} from {repo}: {source}")]
    Git {
        repo: String,
        /// The file or object being read.
        what: String,
        #[source]
        source: git2::Error,
    },
    #[error("reading {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl SourceError {
    /// Whether reading the repository failed rather than the commit being wrong: the same
    /// commit may read fine on a later try (a repository being made, the disk, a lock).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            SourceError::RepositoryNotFound { .. }
                | SourceError::OpenRepository { .. }
                | SourceError::Git { .. }
                | SourceError::Io { .. }
        )
    }
}

/// One thing wrong in a manifest.
///
/// Displays as `deploy.yaml:9: Deployment web: /spec/replicas: "two" is not of type "integer"`,
/// leaving out the parts that are not known. An error in the second or a later document of a
/// file names it: `deploy.yaml:30 (document 2): Service web: ...`; no document shown means the
/// file's first one.
///
/// Every line is a line of a file in Git: an error in the output of a template (`*.yaml.j2`) is
/// reported at the template line that produced the offending rendered line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManifestError {
    pub file: String,
    /// 1-based line in the file: of the offending value, or its nearest existing parent.
    pub line: Option<usize>,
    /// 1-based column, for YAML syntax errors.
    pub column: Option<usize>,
    /// 0-based position of the document in its file (of a template: in its rendered output).
    pub document: Option<usize>,
    /// The object, as `Deployment web`.
    pub object: Option<String>,
    /// JSON pointer to the offending value, as `/spec/replicas`.
    pub path: Option<String>,
    pub message: String,
}

impl ManifestError {
    pub(crate) fn new(file: &str, message: impl Into<String>) -> Self {
        ManifestError {
            file: file.to_owned(),
            line: None,
            column: None,
            document: None,
            object: None,
            path: None,
            message: message.into(),
        }
    }
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.file)?;
        match (self.line, self.column) {
            (Some(line), Some(column)) => write!(f, ":{line}:{column}")?,
            (Some(line), None) => write!(f, ":{line}")?,
            (None, _) => {}
        }
        // The struct is built by literal outside this crate (`error_at` of the apply step), so
        // whether the file holds several documents cannot be a field of its own: the first
        // document goes unnamed, which keeps single-document files as they always read.
        if let Some(document) = self.document.filter(|d| *d > 0) {
            write!(f, " (document {})", document + 1)?;
        }
        if let Some(object) = &self.object {
            write!(f, ": {object}")?;
        }
        if let Some(path) = &self.path {
            write!(f, ": {path}")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ManifestError {}

/// What stands for a masked value.
pub(crate) const MASK: &str = "<masked>";

/// Whether the value at `pointer` in an object of `kind` is secret and must never be shown:
/// the values under a Secret's `data` and `stringData`.
pub(crate) fn is_secret(kind: Option<&str>, pointer: &str) -> bool {
    kind == Some("Secret")
        && ["/data", "/stringData"]
            .iter()
            .any(|p| pointer.strip_prefix(p).is_some_and(|rest| rest.is_empty() || rest.starts_with('/')))
}

/// The value at `pointer` as an error message shows it: JSON, or masked where secret. Every
/// message that quotes a value of a manifest goes through here or through [`is_secret`].
pub(crate) fn show_value(kind: Option<&str>, pointer: &str, value: &Value) -> String {
    if is_secret(kind, pointer) { MASK.to_owned() } else { value.to_string() }
}

/// The object with its secret values masked, for logs and `Debug` output: a Secret's `data`
/// and `stringData` values become `<masked>`; other objects are returned as they are.
pub fn redacted(value: &Value) -> Cow<'_, Value> {
    if value.get("kind").and_then(Value::as_str) != Some("Secret") {
        return Cow::Borrowed(value);
    }
    let mut masked = value.clone();
    for field in ["data", "stringData"] {
        match masked.get_mut(field) {
            Some(Value::Object(map)) => map.values_mut().for_each(|v| *v = Value::String(MASK.into())),
            Some(Value::Null) | None => {}
            Some(other) => *other = Value::String(MASK.into()),
        }
    }
    Cow::Owned(masked)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn t10_display_leaves_out_unknown_parts() {
        let mut e = ManifestError::new("deploy.yaml", "\"two\" is not of type \"integer\"");
        assert_eq!(e.to_string(), "deploy.yaml: \"two\" is not of type \"integer\"");
        e.document = Some(1);
        assert_eq!(e.to_string(), "deploy.yaml (document 2): \"two\" is not of type \"integer\"");
        e.line = Some(9);
        e.object = Some("Deployment web".into());
        e.path = Some("/spec/replicas".into());
        assert_eq!(
            e.to_string(),
            "deploy.yaml:9 (document 2): Deployment web: /spec/replicas: \"two\" is not of type \"integer\""
        );
        e.column = Some(3);
        assert_eq!(
            e.to_string(),
            "deploy.yaml:9:3 (document 2): Deployment web: /spec/replicas: \"two\" is not of type \"integer\""
        );
        // The first document of a file is not named: single-document files read as they did.
        e.document = Some(0);
        assert_eq!(
            e.to_string(),
            "deploy.yaml:9:3: Deployment web: /spec/replicas: \"two\" is not of type \"integer\""
        );
    }

    #[test]
    fn t10_secret_values_are_masked() {
        let cases = [
            (Some("Secret"), "/data/password", true),
            (Some("Secret"), "/stringData", true),
            (Some("Secret"), "/stringData/token", true),
            (Some("Secret"), "/dataset", false),
            (Some("Secret"), "/metadata/name", false),
            (Some("ConfigMap"), "/data/password", false),
            (None, "/data/password", false),
        ];
        for (kind, pointer, secret) in cases {
            assert_eq!(is_secret(kind, pointer), secret, "{kind:?} {pointer}");
        }
        assert_eq!(show_value(Some("Secret"), "/data/a", &json!("hunter2")), "<masked>");
        assert_eq!(show_value(Some("ConfigMap"), "/data/a", &json!("x")), "\"x\"");

        let secret = json!({"kind": "Secret", "metadata": {"name": "s"}, "data": {"a": "aHVudGVyMg=="}, "stringData": {"b": "hunter2"}});
        let shown = redacted(&secret).to_string();
        assert!(!shown.contains("hunter2") && !shown.contains("aHVudGVyMg"), "{shown}");
        assert!(shown.contains(r#""a":"<masked>""#), "{shown}");
        let config = json!({"kind": "ConfigMap", "data": {"a": "b"}});
        assert!(matches!(redacted(&config), Cow::Borrowed(_)));
    }
}
