//! Kustomization directories, rendered by kustomize itself (`kubectl kustomize`), not by a
//! re-implementation: an Application whose directory holds a `kustomization.yaml` gets the
//! objects kustomize builds from it, validated as any manifest is.
//!
//! This module is the pure part: which directories a kustomization reads ([`plan`], refusing
//! remote bases, absolute paths, paths out of the repository and Helm charts before kustomize
//! runs), and turning kustomize's output back into files of the repository ([`split`]: each
//! object under the file it came from, by kustomize's origin annotation, with the line of its
//! document there). [`build`] runs kustomize.

mod build;

pub(crate) use build::build;

use crate::{Limits, ManifestError, ManifestFile, manifest};
use serde_json::Value;
use std::{
    collections::{BTreeSet, HashMap},
    sync::Arc,
};

/// The names kustomize looks for in a directory, in its order.
pub(crate) const FILE_NAMES: [&str; 3] = ["kustomization.yaml", "kustomization.yml", "Kustomization"];

/// The annotation `buildMetadata: [originAnnotations]` makes kustomize write on each object.
pub(crate) const ORIGIN: &str = "config.kubernetes.io/origin";

/// At most this many kustomizations (the root, its bases and components) in one build.
const MAX_KUSTOMIZATIONS: usize = 64;

/// The kustomization file of `dir` among `paths` (repository paths), if it has one.
pub(crate) fn root_file<'p>(mut paths: impl Iterator<Item = &'p str>, dir: &str) -> Option<String> {
    let names: Vec<String> = FILE_NAMES.iter().map(|name| join(dir, name)).collect();
    let found: BTreeSet<&str> = paths.by_ref().filter(|p| names.iter().any(|n| n == p)).collect();
    names.into_iter().find(|n| found.contains(n.as_str()))
}

/// What [`plan`] reads of the repository.
pub(crate) trait Tree {
    /// Whether `dir` is a directory of the repository.
    fn is_dir(&mut self, dir: &str) -> bool;
    /// The content of the file at `path`, if there is one.
    fn read(&mut self, path: &str) -> Option<Vec<u8>>;
}

/// The directories of every kustomization a build reads (the root's first), after checking
/// that each reference stays inside the repository and needs nothing kustomize would fetch or
/// run.
pub(crate) fn plan(root: &str, tree: &mut dyn Tree, limits: &Limits) -> Result<Vec<String>, Box<ManifestError>> {
    let mut dirs = vec![root.to_owned()];
    let mut seen = BTreeSet::from([root.to_owned()]);
    let mut next = 0;
    while let Some(dir) = dirs.get(next).cloned() {
        next += 1;
        let Some((file, content)) = FILE_NAMES.iter().find_map(|name| {
            let file = join(&dir, name);
            tree.read(&file).map(|content| (file, content))
        }) else {
            // kustomize says itself that a base has no kustomization.
            continue;
        };
        for reference in references(&file, &content, limits)? {
            let target = resolve(&dir, &reference.entry)
                .ok_or_else(|| reference.error(&file, "points outside the repository: keep every base inside it"))?;
            if tree.is_dir(&target) && seen.insert(target.clone()) {
                if dirs.len() >= MAX_KUSTOMIZATIONS {
                    return Err(reference.error(
                        &file,
                        &format!("makes more than {MAX_KUSTOMIZATIONS} kustomizations: merge some of them"),
                    ));
                }
                dirs.push(target);
            }
        }
    }
    Ok(dirs)
}

/// One entry of `resources`, `bases` or `components`.
struct Reference {
    entry: String,
    pointer: String,
    line: usize,
}

impl Reference {
    fn error(&self, file: &str, what: &str) -> Box<ManifestError> {
        let mut error = ManifestError::new(file, format!("{:?} {what}", self.entry));
        error.line = Some(self.line);
        error.path = Some(self.pointer.clone());
        Box::new(error)
    }
}

/// The directories and files a kustomization names, each checked on its own: no URL, no
/// absolute path; and no Helm chart, which kustomize would have to fetch and run Helm for.
fn references(file: &str, content: &[u8], limits: &Limits) -> Result<Vec<Reference>, Box<ManifestError>> {
    let text = manifest::decode(file, content, limits)?;
    let parsed = manifest::parse_text(file, text, None, limits, 1);
    if let Some(error) = parsed.errors.into_iter().next() {
        return Err(Box::new(error));
    }
    let Some(document) = parsed.documents.into_iter().next() else { return Ok(Vec::new()) };
    let lines = document.lines();
    for field in ["helmCharts", "helmChartInflationGenerator", "helmGlobals"] {
        if document.value.get(field).is_some() {
            let mut error = ManifestError::new(
                file,
                format!(
                    "{field}: Helm charts are not rendered here: render the chart into the repository \
                     (helm template NAME CHART > DIR/chart.yaml) and list that file in resources"
                ),
            );
            error.line = Some(lines.line_of(&format!("/{field}")));
            error.path = Some(format!("/{field}"));
            return Err(Box::new(error));
        }
    }
    let mut references = Vec::new();
    for field in ["resources", "bases", "components"] {
        let Some(entries) = document.value.get(field).and_then(Value::as_array) else { continue };
        for (i, entry) in entries.iter().enumerate() {
            let Some(entry) = entry.as_str() else { continue };
            let pointer = format!("/{field}/{i}");
            let reference = Reference { entry: entry.to_owned(), line: lines.line_of(&pointer), pointer };
            if is_remote(entry) {
                return Err(reference.error(
                    file,
                    "is a remote base, which is not fetched: vendor it into the repository and name its directory",
                ));
            }
            if entry.starts_with('/') {
                return Err(reference.error(file, "is an absolute path: name it relative to the kustomization"));
            }
            references.push(reference);
        }
    }
    Ok(references)
}

/// Whether kustomize would fetch `entry` over the network (a Git URL or an HTTP file).
fn is_remote(entry: &str) -> bool {
    let hosts = ["github.com/", "gitlab.com/", "bitbucket.org/"];
    entry.contains("://")
        || entry.starts_with("git@")
        || entry.starts_with("git::")
        || entry.contains("?ref=")
        || entry.contains("?version=")
        || hosts.iter().any(|h| entry.starts_with(h))
}

/// `dir` joined with the relative `entry`, normalized; `None` if it climbs above the root.
fn resolve(dir: &str, entry: &str) -> Option<String> {
    let mut parts: Vec<&str> = dir.split('/').filter(|p| !p.is_empty()).collect();
    for part in entry.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            part => parts.push(part),
        }
    }
    Some(parts.join("/"))
}

/// `dir/name`, or `name` in the root.
pub(crate) fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() { name.to_owned() } else { format!("{dir}/{name}") }
}

/// A kustomize build as kept between loads: what it gave, or why it failed.
pub(crate) type Build = Result<Arc<Rendered>, Vec<ManifestError>>;

/// kustomize's output as files of the repository: each object under the file its origin
/// annotation names (the kustomization itself for what a generator made), the annotation
/// removed; and for each such file, where its objects are in it.
pub(crate) struct Rendered {
    pub(crate) files: Vec<ManifestFile>,
    /// Per file: (first line of an object in the rendered text, line of its document in the
    /// file in Git), by rendered line.
    pub(crate) lines: HashMap<String, Vec<(usize, usize)>>,
}

impl Rendered {
    /// The bytes its files hold.
    pub(crate) fn bytes(&self) -> u64 {
        self.files.iter().map(|f| f.content.len() as u64).sum()
    }

    /// The line in Git of `line` of the rendered `file`.
    pub(crate) fn line_in_git(&self, file: &str, line: usize) -> Option<usize> {
        let starts = self.lines.get(file)?;
        let i = starts.partition_point(|&(start, _)| start <= line);
        starts.get(i.checked_sub(1)?).map(|&(_, origin)| origin)
    }
}

/// Splits kustomize's `output` for the kustomization `root_file` in `root` by origin.
/// `source` gives the content of a file of the repository, to find the lines of its documents.
pub(crate) fn split(
    output: &str,
    root: &str,
    root_file: &str,
    source: &dyn Fn(&str) -> Option<Vec<u8>>,
    limits: &Limits,
) -> Result<Rendered, Vec<ManifestError>> {
    let parsed = manifest::parse_text(root_file, output.into(), None, limits, limits.max_documents);
    if !parsed.errors.is_empty() {
        return Err(parsed.errors);
    }
    let mut groups: Vec<(String, Vec<Value>)> = Vec::new();
    for document in parsed.documents {
        let mut value = document.value;
        let origin = take_origin(&mut value)
            .and_then(|origin| {
                let path = origin.get("path").or_else(|| origin.get("configuredIn"))?.as_str()?.to_owned();
                resolve(root, &path)
            })
            .unwrap_or_else(|| root_file.to_owned());
        match groups.iter_mut().find(|(file, _)| *file == origin) {
            Some((_, values)) => values.push(value),
            None => groups.push((origin, vec![value])),
        }
    }
    let mut rendered = Rendered { files: Vec::new(), lines: HashMap::new() };
    for (file, values) in groups {
        let documents = origin_documents(&file, source, limits);
        let mut text = String::new();
        let mut starts = Vec::with_capacity(values.len());
        for value in &values {
            let yaml = manifest::to_yaml(value).map_err(|e| vec![ManifestError::new(root_file, e.to_string())])?;
            text.push_str("---\n");
            starts.push((text.lines().count() + 1, origin_line(&documents, value)));
            text.push_str(&yaml);
        }
        rendered.files.push(ManifestFile::new(file.clone(), text.into_bytes()));
        rendered.lines.insert(file, starts);
    }
    rendered.files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(rendered)
}

/// Removes kustomize's origin annotation from `value` (and `annotations` if that empties it),
/// parsed: `path: base/web.yaml`, or `configuredIn: kustomization.yaml` for a generated object.
fn take_origin(value: &mut Value) -> Option<Value> {
    let metadata = value.get_mut("metadata")?.as_object_mut()?;
    let annotations = metadata.get_mut("annotations")?.as_object_mut()?;
    let origin = annotations.remove(ORIGIN)?;
    if annotations.is_empty() {
        metadata.remove("annotations");
    }
    serde_yaml::from_str(origin.as_str()?).ok()
}

/// (kind, name, line) of each document of the file in Git.
fn origin_documents(
    file: &str,
    source: &dyn Fn(&str) -> Option<Vec<u8>>,
    limits: &Limits,
) -> Vec<(String, String, usize)> {
    let Some(content) = source(file) else { return Vec::new() };
    let Ok(text) = manifest::decode(file, &content, limits) else { return Vec::new() };
    let parsed = manifest::parse_text(file, text, None, limits, limits.max_documents);
    parsed
        .documents
        .iter()
        .map(|d| {
            let text = |pointer: &str| d.value.pointer(pointer).and_then(Value::as_str).unwrap_or("").to_owned();
            (text("/kind"), text("/metadata/name"), d.line)
        })
        .collect()
}

/// The line of the document `value` came from: same kind, and the name as written or with a
/// prefix or suffix added by kustomize; else the file's first document.
fn origin_line(documents: &[(String, String, usize)], value: &Value) -> usize {
    let kind = value.pointer("/kind").and_then(Value::as_str).unwrap_or("");
    let name = value.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("");
    let same = |(k, n, _): &&(String, String, usize)| k == kind && !n.is_empty() && name.contains(n.as_str());
    documents.iter().find(same).or(documents.first()).map_or(1, |(_, _, line)| *line)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::collections::BTreeMap;

    struct Files(BTreeMap<&'static str, &'static str>);

    impl Tree for Files {
        fn is_dir(&mut self, dir: &str) -> bool {
            self.0.keys().any(|path| path.strip_prefix(dir).is_some_and(|rest| rest.starts_with('/')))
        }
        fn read(&mut self, path: &str) -> Option<Vec<u8>> {
            self.0.get(path).map(|text| text.as_bytes().to_vec())
        }
    }

    #[test]
    fn t10_root_file() {
        let paths = ["app/kustomization.yml", "app/web.yaml", "other/kustomization.yaml"];
        assert_eq!(root_file(paths.into_iter(), "app").as_deref(), Some("app/kustomization.yml"));
        assert_eq!(root_file(paths.into_iter(), "").as_deref(), None);
        assert_eq!(root_file(["kustomization.yaml"].into_iter(), "").as_deref(), Some("kustomization.yaml"));
    }

    #[test]
    fn t10_plan_follows_bases_inside_the_repository() {
        let mut files = Files(BTreeMap::from([
            ("overlays/prod/kustomization.yaml", "resources:\n- ../../base\n- extra.yaml\ncomponents: [../../c]\n"),
            ("overlays/prod/extra.yaml", "kind: ConfigMap\n"),
            ("base/kustomization.yaml", "resources: [web.yaml]\n"),
            ("base/web.yaml", "kind: Deployment\n"),
            ("c/kustomization.yaml", "kind: Component\n"),
        ]));
        let dirs = plan("overlays/prod", &mut files, &Limits::default()).unwrap();
        assert_eq!(dirs, ["overlays/prod", "base", "c"]);
    }

    #[test]
    fn t10_plan_refuses_what_kustomize_would_fetch_or_leave_the_repository_for() {
        let cases = [
            (
                "resources:\n- github.com/org/repo//base?ref=v1\n",
                "app/kustomization.yaml:2: /resources/0: \"github.com/org/repo//base?ref=v1\" is a remote base, \
                 which is not fetched: vendor it into the repository and name its directory",
            ),
            (
                "resources:\n- https://example.com/all.yaml\n",
                "app/kustomization.yaml:2: /resources/0: \"https://example.com/all.yaml\" is a remote base, \
                 which is not fetched: vendor it into the repository and name its directory",
            ),
            (
                "bases:\n- /etc/base\n",
                "app/kustomization.yaml:2: /bases/0: \"/etc/base\" is an absolute path: name it relative to the \
                 kustomization",
            ),
            (
                "resources:\n- ../../outside\n",
                "app/kustomization.yaml:2: /resources/0: \"../../outside\" points outside the repository: keep \
                 every base inside it",
            ),
            (
                "helmCharts:\n- name: x\n",
                "app/kustomization.yaml:1: /helmCharts: helmCharts: Helm charts are not rendered here: render the \
                 chart into the repository (helm template NAME CHART > DIR/chart.yaml) and list that file in \
                 resources",
            ),
        ];
        for (kustomization, expected) in cases {
            let mut files = Files(BTreeMap::from([("app/kustomization.yaml", kustomization)]));
            let error = plan("app", &mut files, &Limits::default()).unwrap_err();
            assert_eq!(error.to_string(), expected, "{kustomization}");
        }
    }

    #[test]
    fn t10_split_puts_objects_back_in_their_files() {
        let output = "\
apiVersion: v1
kind: ConfigMap
metadata:
  annotations:
    config.kubernetes.io/origin: |
      configuredIn: kustomization.yaml
      configuredBy:
        apiVersion: builtin
        kind: ConfigMapGenerator
  name: prod-settings-8h2k
---
apiVersion: apps/v1
kind: Deployment
metadata:
  annotations:
    config.kubernetes.io/origin: |
      path: ../../base/web.yaml
    team: a
  name: prod-web
";
        let source = |path: &str| match path {
            "base/web.yaml" => Some(
                b"# web\n---\napiVersion: v1\nkind: Service\nmetadata: {name: web}\n---\n\
apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\n"
                    .to_vec(),
            ),
            _ => None,
        };
        let rendered =
            split(output, "overlays/prod", "overlays/prod/kustomization.yaml", &source, &Limits::default()).unwrap();
        let paths: Vec<_> = rendered.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, ["base/web.yaml", "overlays/prod/kustomization.yaml"]);
        let web = String::from_utf8(rendered.files[0].content.clone()).unwrap();
        let parsed: Value = serde_yaml::from_str(web.trim_start_matches("---\n")).unwrap();
        assert_eq!(parsed["metadata"], json!({"name": "prod-web", "annotations": {"team": "a"}}));
        assert_eq!(rendered.line_in_git("base/web.yaml", 2), Some(7));
        assert_eq!(rendered.line_in_git("overlays/prod/kustomization.yaml", 5), Some(1));
        assert_eq!(rendered.line_in_git("elsewhere.yaml", 5), None);
    }
}
