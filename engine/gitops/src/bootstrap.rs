//! What `gitplane up` makes on first start: the system namespaces, the default StorageClass, the demo repository, the
//! bootstrap repository holding the demo Application (app-of-apps), and the root Application
//! that syncs the bootstrap repository. Each step leaves existing state alone.

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

/// The demo repository.
pub const DEMO: &str = "demo";
const DEMO_FILES: &[(&str, &str)] = &[("web.yaml", include_str!("../demo/web.yaml"))];
/// The repository of Applications, and the root Application that applies it.
pub const BOOTSTRAP: &str = "bootstrap";
const BOOTSTRAP_FILES: &[(&str, &str)] = &[("demo.yaml", include_str!("../bootstrap/demo.yaml"))];

fn ignore_exists<T>(result: Result<T, StoreError>) -> Result<(), StoreError> {
    match result {
        Err(e) if !e.is_already_exists() => Err(e),
        _ => Ok(()),
    }
}

const KUBE_SYSTEM: &str = "kube-system";

/// `default`, `kube-system`, `kube-node-lease` and `gitplane-system`. `kube-system` enforces
/// Pod Security's `privileged`, as clusters exempt it: the node daemons that live there (log
/// shippers, network agents) mount the node's files.
pub async fn namespaces(store: &Arc<dyn Store>) -> Result<(), StoreError> {
    let api = Api::<Namespace>::new(store.clone());
    for name in [DEFAULT_NAMESPACE, KUBE_SYSTEM, NODE_LEASE_NAMESPACE, SYSTEM_NAMESPACE] {
        if api.get("", name).await?.is_none() {
            let labels = (name == KUBE_SYSTEM)
                .then(|| [(format!("{}enforce", crate::source::podsecurity::LABEL), "privileged".to_owned())].into());
            let ns = Namespace {
                metadata: ObjectMeta { name: Some(name.into()), labels, ..Default::default() },
                ..Default::default()
            };
            ignore_exists(api.create(&ns).await)?;
        }
    }
    Ok(())
}

/// The built-in default StorageClass `local-path`, if absent, as k3s deploys its local-storage
/// add-on at every start: claims that name no class get it, and each of its volumes is a
/// directory on the node of the claim's first Pod.
pub async fn storage_class(store: &Arc<dyn Store>) -> Result<(), StoreError> {
    use gitplane_api::volumes::{DEFAULT_CLASS, LOCAL_PATH_CLASS, LOCAL_PATH_PROVISIONER, WAIT_FOR_FIRST_CONSUMER};
    use k8s_openapi::api::storage::v1::StorageClass;
    let api = Api::<StorageClass>::new(store.clone());
    if api.get("", LOCAL_PATH_CLASS).await?.is_some() {
        return Ok(());
    }
    let class = StorageClass {
        metadata: ObjectMeta {
            name: Some(LOCAL_PATH_CLASS.into()),
            annotations: Some([(DEFAULT_CLASS.to_owned(), "true".to_owned())].into()),
            ..Default::default()
        },
        provisioner: LOCAL_PATH_PROVISIONER.into(),
        reclaim_policy: Some("Delete".into()),
        volume_binding_mode: Some(WAIT_FOR_FIRST_CONSUMER.into()),
        ..Default::default()
    };
    ignore_exists(api.create(&class).await)
}

/// Creates `repos/demo.git` (bare, branch `main`) with the demo manifests, if absent.
pub fn demo_repo(repos_dir: &Path) -> anyhow::Result<PathBuf> {
    hosted_repo(repos_dir, DEMO, DEMO_FILES, "Demo: web Deployment and its Service")
}

/// Creates `repos/bootstrap.git` with the demo Application, if absent.
pub fn bootstrap_repo(repos_dir: &Path) -> anyhow::Result<PathBuf> {
    hosted_repo(repos_dir, BOOTSTRAP, BOOTSTRAP_FILES, "Bootstrap: the demo Application")
}

/// Creates an empty hosted repository (bare, HEAD on `main`) if absent, for a first push.
pub fn empty_repo(repos_dir: &Path, name: &str) -> anyhow::Result<PathBuf> {
    hosted_repo(repos_dir, name, &[], "")
}

fn hosted_repo(repos_dir: &Path, name: &str, files: &[(&str, &str)], message: &str) -> anyhow::Result<PathBuf> {
    private_dir(repos_dir)?;
    let path = repos_dir.canonicalize()?.join(format!("{name}.git"));
    if path.exists() {
        return Ok(path);
    }
    // Made under a hidden name (never served) and renamed into place, so a client or the ref
    // watcher never sees a half-made repository.
    let staging = tempfile::Builder::new()
        .prefix(&format!(".{name}.git-"))
        .tempdir_in(path.parent().unwrap_or(repos_dir))
        .with_context(|| format!("creating {}", path.display()))?;
    // As `git init` leaves it, not the temporary directory's 0700.
    std::fs::set_permissions(staging.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let mut options = git2::RepositoryInitOptions::new();
    options.bare(true).initial_head("main");
    let repo = git2::Repository::init_opts(staging.path(), &options)
        .with_context(|| format!("creating {}", path.display()))?;
    if !files.is_empty() {
        let mut tree = repo.treebuilder(None)?;
        for (file, content) in files {
            tree.insert(file, repo.blob(content.as_bytes())?, 0o100644)?;
        }
        let tree = repo.find_tree(tree.write()?)?;
        let signature = git2::Signature::now("gitplane", "gitplane@localhost")?;
        repo.commit(Some("refs/heads/main"), &signature, &signature, message, &tree, &[])?;
    }
    drop(repo);
    match std::fs::rename(staging.path(), &path) {
        Ok(()) => {
            let _kept = staging.keep();
            Ok(path)
        }
        // Made by someone else meanwhile: theirs stands, ours is removed with `staging`.
        Err(_) if path.join("HEAD").is_file() => Ok(path),
        Err(e) => Err(e).with_context(|| format!("creating {}", path.display())),
    }
}

/// The root Application, which applies the Applications of `repos/bootstrap.git`, if absent.
/// It is the one object not from Git: the installer's, as in Argo CD's app-of-apps.
pub async fn root_application(store: &Arc<dyn Store>, repo: &str) -> Result<(), StoreError> {
    let api = Api::<Application>::new(store.clone());
    if api.get(SYSTEM_NAMESPACE, BOOTSTRAP).await?.is_some() {
        return Ok(());
    }
    let mut app = Application::new(
        BOOTSTRAP,
        ApplicationSpec {
            repo: repo.into(),
            branch: "main".into(),
            path: String::new(),
            namespace: Some(SYSTEM_NAMESPACE.into()),
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

/// Makes `dir` (and its parents) if missing, and keeps it to its owner (mode 0700): the data
/// directory holds the store (Secrets included) and the credentials, the repositories directory
/// Git's copy of the Secrets.
pub fn private_dir(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .with_context(|| format!("making {} private (mode 0700)", dir.display()))
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

    #[test]
    fn the_bootstrap_repo_holds_a_valid_demo_application() {
        let dir = tempfile::tempdir().unwrap();
        let path = bootstrap_repo(dir.path()).unwrap();
        let commit = gitplane_source::read_commit(&path, "main", "", &Default::default()).unwrap();
        let validator = gitplane_source::Validator::new();
        let manifests =
            gitplane_source::load(&commit.files, &validator, SYSTEM_NAMESPACE, &Default::default()).unwrap();
        let keys: Vec<_> = manifests.iter().map(|m| m.key.to_string()).collect();
        assert_eq!(keys, ["Application.gitplane.io gitplane-system/demo"]);
    }
}
