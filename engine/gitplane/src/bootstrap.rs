//! What `gitplane up` makes on first start: the system namespaces, the demo repository and the
//! demo Application. Each step leaves existing state alone.

use anyhow::Context as _;
use gitplane_api::{
    Application, ApplicationSpec,
    object::{DEFAULT_NAMESPACE, NODE_LEASE_NAMESPACE, SYSTEM_NAMESPACE},
};
use gitplane_store::{Api, Store, StoreError};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

/// The demo Application's name and repository.
pub const DEMO: &str = "demo";
const DEMO_FILES: &[(&str, &str)] = &[("web.yaml", include_str!("../demo/web.yaml"))];

fn ignore_exists<T>(result: Result<T, StoreError>) -> Result<(), StoreError> {
    match result {
        Err(e) if !e.is_already_exists() => Err(e),
        _ => Ok(()),
    }
}

/// `default`, `kube-system`, `kube-node-lease` and `gitplane-system`.
pub async fn namespaces(store: &Arc<dyn Store>) -> Result<(), StoreError> {
    let api = Api::<Namespace>::new(store.clone());
    for name in [DEFAULT_NAMESPACE, "kube-system", NODE_LEASE_NAMESPACE, SYSTEM_NAMESPACE] {
        if api.get("", name).await?.is_none() {
            let ns = Namespace {
                metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
                ..Default::default()
            };
            ignore_exists(api.create(&ns).await)?;
        }
    }
    Ok(())
}

/// Creates `repos/demo.git` (bare, branch `main`) with the demo manifests, if absent.
pub fn demo_repo(repos_dir: &Path) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(repos_dir).with_context(|| format!("creating {}", repos_dir.display()))?;
    let path = repos_dir.canonicalize()?.join(format!("{DEMO}.git"));
    if path.exists() {
        return Ok(path);
    }
    let mut options = git2::RepositoryInitOptions::new();
    options.bare(true).initial_head("main");
    let repo = git2::Repository::init_opts(&path, &options).with_context(|| format!("creating {}", path.display()))?;
    let mut tree = repo.treebuilder(None)?;
    for (name, content) in DEMO_FILES {
        tree.insert(name, repo.blob(content.as_bytes())?, 0o100644)?;
    }
    let tree = repo.find_tree(tree.write()?)?;
    let signature = git2::Signature::now("gitplane", "gitplane@localhost")?;
    repo.commit(Some("refs/heads/main"), &signature, &signature, "Demo: web Deployment and its Service", &tree, &[])?;
    Ok(path)
}

/// The Application that syncs the demo repository into `default`, if absent.
pub async fn demo_application(store: &Arc<dyn Store>) -> Result<(), StoreError> {
    let api = Api::<Application>::new(store.clone());
    if api.get(SYSTEM_NAMESPACE, DEMO).await?.is_some() {
        return Ok(());
    }
    let mut app = Application::new(
        DEMO,
        ApplicationSpec {
            repo: DEMO.into(),
            branch: "main".into(),
            path: String::new(),
            namespace: Some(DEFAULT_NAMESPACE.into()),
            prune: true,
            values: Default::default(),
            depends_on: Vec::new(),
            values_files: Vec::new(),
            allow_empty: false,
        },
    );
    app.metadata.namespace = Some(SYSTEM_NAMESPACE.into());
    ignore_exists(api.create(&app).await)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_repo_is_made_once_with_valid_manifests() {
        let dir = tempfile::tempdir().unwrap();
        let path = demo_repo(dir.path()).unwrap();
        let commit = gitplane_source::read_commit(&path, "main", "", &Default::default()).unwrap();
        assert_eq!(commit.files.len(), 1);
        let validator = gitplane_source::Validator::new();
        let manifests = gitplane_source::load(&commit.files, &validator, "default", &Default::default()).unwrap();
        let kinds: Vec<_> = manifests.iter().map(|m| m.key.to_string()).collect();
        assert_eq!(kinds, ["Deployment.apps default/web", "Service default/web"]);
        assert_eq!(demo_repo(dir.path()).unwrap(), path, "an existing repository is kept");
        assert_eq!(commit.id, gitplane_source::read_commit(&path, "main", "", &Default::default()).unwrap().id);
    }
}
