//! `GET /apis/gitplane.io/v1/namespaces/{namespace}/applications/{name}/head`: the commit the
//! Application's branch points at now, read from its hosted repository (`repos/`, which every
//! replica shares). An Application's status says what the source synced last; the source sees
//! a push a moment after `git push` returns, so only the two together tell "synced" from
//! "synced the commit before the push just made" (`gitplane status --wait`).
//!
//! `revision` is null while the branch has no commit, and for a remote repository: its mirror
//! is where the source reads it, fetched on a poll or webhook, so there is no newer head this
//! replica could know of.

use super::status;
use axum::{
    Json, Router,
    extract::{Path, State},
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::get,
};
use gitplane_api::Application;
use gitplane_store::{Api, Store};
use serde_json::json;
use std::{path::PathBuf, sync::Arc};

pub const KIND: &str = "ApplicationHead";

#[derive(Clone)]
struct HeadState {
    store: Arc<dyn Store>,
    repos_dir: Arc<std::path::Path>,
}

/// The route, for the status API's listener (behind its authorization: the read role).
pub fn router(store: Arc<dyn Store>, repos_dir: PathBuf) -> Router {
    Router::new()
        .route("/apis/gitplane.io/v1/namespaces/{namespace}/applications/{name}/head", get(head))
        .with_state(HeadState { store, repos_dir: repos_dir.into() })
}

async fn head(State(state): State<HeadState>, Path((namespace, name)): Path<(String, String)>) -> Response {
    let app = match Api::<Application>::new(state.store.clone()).get(&namespace, &name).await {
        Ok(Some(app)) => app,
        Ok(None) => {
            let message = format!("applications.gitplane.io \"{name}\" not found");
            return status(StatusCode::NOT_FOUND, "NotFound", message);
        }
        Err(e) => return status(StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable", e.to_string()),
    };
    let (repo, branch) = (app.spec.repo.clone(), app.spec.branch.clone());
    let repos_dir = state.repos_dir.clone();
    let revision = tokio::task::spawn_blocking(move || hosted_head(&repos_dir, &repo, &branch)).await.ok().flatten();
    Json(json!({
        "apiVersion": "gitplane.io/v1",
        "kind": KIND,
        "metadata": {"namespace": namespace, "name": name},
        "repo": app.spec.repo,
        "branch": app.spec.branch,
        "revision": revision,
    }))
    .into_response()
}

/// Where `refs/heads/<branch>` of the hosted repository `repo` points; `None` for a URL, a name
/// that is not a hosted repository's, or a branch without a commit.
fn hosted_head(repos_dir: &std::path::Path, repo: &str, branch: &str) -> Option<String> {
    let plain = !repo.is_empty()
        && !repo.starts_with('.')
        && repo.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !plain {
        return None;
    }
    let repository = git2::Repository::open_bare(repos_dir.join(format!("{repo}.git"))).ok()?;
    let id = repository.refname_to_id(&format!("refs/heads/{branch}")).ok()?;
    Some(id.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_hosted_repositories_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let repo = git2::Repository::init_bare(dir.path().join("web.git")).unwrap();
        assert_eq!(hosted_head(dir.path(), "web", "main"), None, "no commit yet");
        let tree = repo.treebuilder(None).unwrap().write().unwrap();
        let tree = repo.find_tree(tree).unwrap();
        let me = git2::Signature::now("t", "t@localhost").unwrap();
        let commit = repo.commit(Some("refs/heads/main"), &me, &me, "first", &tree, &[]).unwrap();
        assert_eq!(hosted_head(dir.path(), "web", "main"), Some(commit.to_string()));
        assert_eq!(hosted_head(dir.path(), "web", "other"), None);
        for name in ["../web", ".web", "https://example.com/web.git", ""] {
            assert_eq!(hosted_head(dir.path(), name, "main"), None, "{name}");
        }
    }
}
