//! Which Applications a push changed: those whose directory (or a values file outside it)
//! holds a different tree at the branch head than at the commit they last synced, or that
//! follow the branch from a commit this repository does not have. A push queues every
//! Application of the repository; these go first (Argo CD's manifest-generate-paths idea used
//! for order only), so the one Application a person just changed does not wait behind a
//! thousand no-change syncs of the same repository. The others still sync: a no-change sync
//! records the new revision, its history and Event, so nothing is skipped, only ordered.

use gitplane_api::ApplicationSpec;
use gitplane_store::ObjectKey;
use serde::Deserialize as _;
use serde_json::Value;
use std::{
    collections::{HashMap, HashSet},
    path::{Component, Path, PathBuf},
};

/// What of an Application says whether a push changed it.
pub(super) struct Following {
    pub key: ObjectKey,
    branch: String,
    /// The directories and files its load reads, relative to the repository's root; `None`
    /// for one that may lie outside the repository (it counts as changed).
    inputs: Vec<Option<PathBuf>>,
    /// The commit its last sync judged (applied or rejected); `None` before any.
    judged: Option<String>,
}

/// `base/relative`, normalised; `None` when it climbs above the root.
fn join(base: &Path, relative: &str) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for part in base.join(relative).components() {
        match part {
            Component::Normal(p) => out.push(p),
            Component::CurDir | Component::RootDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

impl Following {
    /// From an Application as the cache holds it: only its spec is decoded (a push reads a
    /// thousand Applications, whose statuses are the larger part).
    pub fn of(key: ObjectKey, app: &Value) -> Option<Following> {
        let spec = ApplicationSpec::deserialize(&app["spec"]).ok()?;
        let dir = join(Path::new(""), &spec.path);
        let mut inputs = vec![dir.clone()];
        if let Some(dir) = &dir {
            inputs.extend(spec.values_files.iter().map(|f| join(dir, f)));
        }
        let sync = &app["status"]["sync"];
        let judged = sync["attemptedRevision"].as_str().or(sync["revision"].as_str()).map(str::to_owned);
        Some(Following { key, branch: spec.branch, inputs, judged })
    }
}

/// The Applications of the repository at `repo` whose inputs differ between the commit they
/// last judged and their branch head. Anything unreadable counts as changed.
pub(super) fn changed(repo: &Path, apps: &[Following]) -> HashSet<ObjectKey> {
    let Ok(git) = git2::Repository::open_bare(repo) else {
        return apps.iter().map(|a| a.key.clone()).collect();
    };
    let mut trees = Trees { git: &git, parsed: HashMap::new() };
    let mut heads: HashMap<&str, Option<git2::Oid>> = HashMap::new();
    let mut judged: HashMap<&str, Option<git2::Oid>> = HashMap::new();
    let mut changed = HashSet::new();
    for app in apps {
        let head = *heads.entry(&app.branch).or_insert_with(|| {
            git.find_reference(&format!("refs/heads/{}", app.branch))
                .and_then(|r| r.peel_to_tree())
                .ok()
                .map(|t| t.id())
        });
        let before = app.judged.as_deref().and_then(|id| {
            *judged.entry(id).or_insert_with(|| {
                let oid = git2::Oid::from_str(id).ok()?;
                git.find_commit(oid).ok().map(|c| c.tree_id())
            })
        });
        let same = match (head, before) {
            (Some(head), Some(before)) => app.inputs.iter().all(|input| match input {
                Some(path) => trees.entry(head, path) == trees.entry(before, path),
                None => false,
            }),
            _ => false,
        };
        if !same {
            changed.insert(app.key.clone());
        }
    }
    changed
}

/// Trees read once per call: libgit2 caches no tree over 4 KiB, and a repository of a thousand
/// Applications' directories has a directory of a thousand entries, which every lookup
/// would otherwise read and parse again (two per Application: half a second per push).
struct Trees<'r> {
    git: &'r git2::Repository,
    parsed: HashMap<git2::Oid, Option<git2::Tree<'r>>>,
}

impl Trees<'_> {
    /// The object at `path` in tree `root` (`root` itself for the empty path).
    fn entry(&mut self, root: git2::Oid, path: &Path) -> Option<git2::Oid> {
        let mut id = root;
        for part in path.components() {
            let git = self.git;
            let tree = self.parsed.entry(id).or_insert_with(|| git.find_tree(id).ok()).as_ref()?;
            id = tree.get_name_bytes(part.as_os_str().as_encoded_bytes())?.id();
        }
        Some(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::test_commit as commit;
    use serde_json::json;

    fn app(name: &str, path: &str, values: &[&str], judged: Option<git2::Oid>) -> Following {
        let app = json!({
            "apiVersion": "gitplane.io/v1", "kind": "Application",
            "metadata": {"name": name, "namespace": "gitplane-system"},
            "spec": {"repo": "r", "branch": "main", "path": path, "valuesFiles": values},
            "status": {"sync": {"status": "Synced", "revision": judged.map(|j| j.to_string())}},
        });
        Following::of(ObjectKey::of::<gitplane_api::Application>("gitplane-system", name), &app).unwrap()
    }

    #[test]
    fn only_applications_whose_inputs_moved_are_changed() {
        let dir = tempfile::tempdir().unwrap();
        let git = git2::Repository::init_bare(dir.path()).unwrap();
        let files = [("a/x.yaml", "1"), ("b/x.yaml", "1"), ("shared/values.yaml", "v1")];
        let first = commit(&git, &files, None);
        let second = commit(&git, &[("a/x.yaml", "2"), ("b/x.yaml", "1"), ("shared/values.yaml", "v1")], Some(first));
        let apps = [
            app("a", "a", &[], Some(first)),
            app("b", "./b/", &[], Some(first)),
            app("b-values", "b", &["../shared/values.yaml"], Some(first)),
            app("new", "b", &[], None),
            app("escapes", "b", &["../../v.yaml"], Some(first)),
            app("root", "", &[], Some(first)),
            app("a-current", "a", &[], Some(second)),
        ];
        let mut found: Vec<String> = changed(dir.path(), &apps).into_iter().map(|k| k.name).collect();
        found.sort();
        assert_eq!(found, ["a", "escapes", "new", "root"]);
        commit(&git, &[("a/x.yaml", "2"), ("b/x.yaml", "1"), ("shared/values.yaml", "v2")], Some(second));
        let found: Vec<String> = changed(dir.path(), &apps[2..3]).into_iter().map(|k| k.name).collect();
        assert_eq!(found, ["b-values"]);
    }
}
