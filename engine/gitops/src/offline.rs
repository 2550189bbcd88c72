//! `gitplane validate DIR` and `gitplane render DIR`: the server's rendering and validation of
//! an Application's manifests, offline, on a directory: for pre-commit hooks and CI.
//!
//! It runs the code the server runs ([`gitplane_source::load_dir`]: the same templates, values,
//! schemas, limits and messages), with the Application's settings given as flags: `DIR` is its
//! `spec.path`, `--values` its `spec.valuesFiles`, `--set` its `spec.values`, `--namespace` its
//! `spec.namespace`. When `DIR` is inside a Git work tree, files are named from the work tree's
//! root, as the server names them; values files may then sit anywhere in the work tree, as
//! `valuesFiles` may sit anywhere in the repository. What it cannot know offline, it does not
//! check: whether namespaces exist, or objects belong to another Application.

use anyhow::{Context as _, bail};
use gitplane_source::{
    AppSource, Limits, LoadError, Manifest, SourceCache, Validator, load_dir, manifest::to_yaml, redacted, set_value,
};
use std::{
    collections::BTreeMap,
    io::Write as _,
    path::{Path, PathBuf},
    sync::Arc,
};

/// What both commands take: an Application, offline.
#[derive(clap::Args, Debug)]
pub struct OfflineArgs {
    /// The directory of the manifests (the Application's spec.path).
    dir: PathBuf,
    /// A values file for the templates, as in spec.valuesFiles; repeat to merge several in
    /// order. Relative to the current directory.
    #[arg(long = "values", value_name = "FILE")]
    values: Vec<PathBuf>,
    /// A value over those of the files, as in spec.values: KEY.PATH=VALUE, the value read as
    /// YAML (`3`, `true`, `[a, b]`, else a string); repeatable.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// The namespace of namespaced objects that name none (spec.namespace).
    #[arg(long, default_value = gitplane_api::object::DEFAULT_NAMESPACE)]
    namespace: String,
}

/// `gitplane render`: the flags of `validate`, and whether to show Secrets.
#[derive(clap::Args, Debug)]
pub struct RenderArgs {
    #[command(flatten)]
    offline: OfflineArgs,
    /// Print the values of Secrets' data and stringData instead of <masked>.
    #[arg(long)]
    show_secrets: bool,
}

/// Validates, prints every error (stderr) or `N objects valid` (stdout); exits 1 on any error.
pub fn validate(args: OfflineArgs) -> anyhow::Result<()> {
    let manifests = load(&args)?;
    println!("{} valid", plural(manifests.len(), "object"));
    Ok(())
}

/// Prints the rendered, validated objects as YAML documents; exits 1 on any error.
pub fn render(args: RenderArgs) -> anyhow::Result<()> {
    let manifests = load(&args.offline)?;
    let mut out = std::io::stdout().lock();
    for m in &manifests {
        let value = if args.show_secrets { std::borrow::Cow::Borrowed(&m.value) } else { redacted(&m.value) };
        let document = if m.index > 0 { format!(" (document {})", m.index + 1) } else { String::new() };
        write!(out, "---\n# Source: {}{document}\n{}", m.file, to_yaml(&value)?)?;
    }
    out.flush()?;
    Ok(())
}

/// Loads the objects as the server would, or prints why not and exits 1.
fn load(args: &OfflineArgs) -> anyhow::Result<Vec<Arc<Manifest>>> {
    let dir = std::fs::canonicalize(&args.dir).with_context(|| format!("{}", args.dir.display()))?;
    if !dir.is_dir() {
        bail!("{} is not a directory: point at the directory that holds the manifests", args.dir.display());
    }
    // Named from the work tree's root, as the server names files from the repository's.
    let root = work_tree_root(&dir).unwrap_or_else(|| dir.clone());
    let path = relative(&root, &dir).unwrap_or_default();
    let mut values = BTreeMap::new();
    for assignment in &args.set {
        set_value(&mut values, assignment).map_err(|e| anyhow::anyhow!("--set {e}"))?;
    }
    let values_files =
        args.values.iter().map(|file| values_file(&root, &path, file)).collect::<anyhow::Result<Vec<_>>>()?;
    let app = AppSource { path, default_namespace: args.namespace.clone(), values_files, values };
    let loaded = load_dir(&root, &app, &Validator::new(), &Limits::default(), &mut SourceCache::new());
    let errors: Vec<String> = match loaded {
        Ok(manifests) => {
            // What the server would accept and change silently, on stderr as the errors.
            let mut err = std::io::stderr().lock();
            for warning in manifests.iter().flat_map(|m| &m.warnings) {
                writeln!(err, "warning: {warning}")?;
            }
            return Ok(manifests);
        }
        Err(LoadError::Invalid(errors)) => errors.iter().map(ToString::to_string).collect(),
        Err(LoadError::Source(e)) => vec![e.to_string()],
    };
    let mut err = std::io::stderr().lock();
    for error in &errors {
        writeln!(err, "{error}")?;
    }
    writeln!(err, "{}: the server would reject this commit", plural(errors.len(), "error"))?;
    err.flush()?;
    std::process::exit(1);
}

/// The root of the Git work tree that holds `dir`, if any.
fn work_tree_root(dir: &Path) -> Option<PathBuf> {
    dir.ancestors().find(|d| d.join(".git").exists()).map(Path::to_path_buf)
}

/// `a/b` for `root/a/b`, `/`-separated; `None` if `path` is not under `root`.
fn relative(root: &Path, path: &Path) -> Option<String> {
    let rest = path.strip_prefix(root).ok()?;
    let parts: Option<Vec<&str>> = rest.components().map(|c| c.as_os_str().to_str()).collect();
    Some(parts?.join("/"))
}

/// A `--values` file (relative to the current directory) as `spec.valuesFiles` names it:
/// relative to the Application's path, inside the repository.
fn values_file(root: &Path, path: &str, file: &Path) -> anyhow::Result<String> {
    let real = std::fs::canonicalize(file).with_context(|| format!("--values {}", file.display()))?;
    let Some(inside) = relative(root, &real) else {
        bail!(
            "--values {}: the file is outside {}; the server reads values files from the repository",
            file.display(),
            root.display()
        );
    };
    let up = path.split('/').filter(|p| !p.is_empty()).map(|_| "../").collect::<String>();
    Ok(format!("{up}{inside}"))
}

fn plural(n: usize, what: &str) -> String {
    if n == 1 { format!("1 {what}") } else { format!("{n} {what}s") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offline_values_files_are_named_from_the_application_path() {
        let root = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(root.path()).unwrap();
        std::fs::create_dir_all(root.join("deploy/app")).unwrap();
        std::fs::create_dir_all(root.join("values")).unwrap();
        std::fs::write(root.join("values/prod.yaml"), "a: 1\n").unwrap();
        std::fs::write(root.join("deploy/app/v.yaml"), "a: 1\n").unwrap();
        let named = |file: &str| values_file(&root, "deploy/app", &root.join(file));
        assert_eq!(named("values/prod.yaml").unwrap(), "../../values/prod.yaml");
        assert_eq!(named("deploy/app/v.yaml").unwrap(), "../../deploy/app/v.yaml");
        assert!(named("missing.yaml").is_err());
        assert_eq!(relative(&root, &root.join("deploy/app")).as_deref(), Some("deploy/app"));
        assert_eq!(relative(&root, &root).as_deref(), Some(""));
        assert_eq!(plural(1, "error"), "1 error");
        assert_eq!(plural(2, "error"), "2 errors");
    }
}
