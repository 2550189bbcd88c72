//! Who owns an object, for the 405 that answers a write: the Application that applies it from
//! Git (its `gitplane.io/application` annotation, written by the source controller), reached
//! directly or up the object's controller `ownerReferences` (a Pod of a ReplicaSet of a
//! Deployment in Git); a controller whose chain reaches nothing in Git; or nothing at all (what
//! the cluster keeps itself: Nodes, Events, Leases).

use gitplane_api::{
    ApplicationSpec,
    object::{APPLICATION_ANNOTATION, group_kind},
};
use gitplane_store::{ObjectKey, Store};
use serde_json::Value;

/// The longest ownerReferences chain followed (Pod → ReplicaSet → Deployment is two).
const MAX_DEPTH: usize = 8;

/// One step up an ownerReferences chain.
#[derive(Debug, Clone, PartialEq)]
pub struct Link {
    pub kind: String,
    pub name: String,
}

/// Where an Application takes its objects from; `None` when the Application is gone.
#[derive(Debug, Clone, PartialEq)]
pub struct Source {
    /// `namespace/name`.
    pub application: String,
    pub repo: Option<(String, String, String)>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Owner {
    /// Applied from Git by an Application, itself or the last of `chain` (its controllers).
    Git { chain: Vec<Link>, source: Source },
    /// Made by the controllers of `chain`, whose last is not from Git.
    Controller { chain: Vec<Link> },
    /// Nothing in Git or the controllers owns it.
    Cluster,
}

fn chain_text(chain: &[Link]) -> String {
    chain.iter().map(|l| format!("{} {}", l.kind, l.name)).collect::<Vec<_>>().join(", which is made by ")
}

/// The 405's message for a write to `what` (`Deployment default/web`).
pub fn message(what: &str, owner: &Owner) -> String {
    const READ_ONLY: &str = "gitplane's API is read-only: desired state comes only from Git";
    match owner {
        Owner::Git { chain, source } => {
            let by = match chain.as_slice() {
                [] => format!("{what} is applied from Git"),
                chain => format!("{what} is made by {}, which is applied from Git", chain_text(chain)),
            };
            let target = chain.last().map_or_else(|| "it".to_owned(), |l| format!("{} {}", l.kind, l.name));
            match &source.repo {
                Some((repo, branch, path)) => {
                    let path = if path.is_empty() { String::new() } else { format!(", path {path}") };
                    format!(
                        "{by} by Application {} (repository {repo}, branch {branch}{path}). {READ_ONLY}: change {target} there and push",
                        source.application
                    )
                }
                None => format!(
                    "{by} by Application {}, which no longer exists. {READ_ONLY}: {target} is pruned or adopted with it",
                    source.application
                ),
            }
        }
        Owner::Controller { chain } => format!(
            "{what} is made by {}, and nothing in Git owns it. {READ_ONLY}: it follows its owner",
            chain_text(chain)
        ),
        Owner::Cluster => format!(
            "nothing in Git owns {what}: the cluster keeps it itself (the node agents and controllers). {READ_ONLY}"
        ),
    }
}

fn annotation(object: &Value) -> Option<&str> {
    object["metadata"]["annotations"][APPLICATION_ANNOTATION].as_str()
}

/// The controller reference of `object`, else its first owner reference.
fn owner_reference(object: &Value) -> Option<&Value> {
    let refs = object["metadata"]["ownerReferences"].as_array()?;
    refs.iter().find(|r| r["controller"] == true).or_else(|| refs.first())
}

/// Who owns `object`, read from the store (a failed read ends the chain where it is).
pub async fn resolve(store: &dyn Store, object: &Value) -> Owner {
    let mut chain = Vec::new();
    let mut current = object.clone();
    for _ in 0..MAX_DEPTH {
        if let Some(application) = annotation(&current) {
            return Owner::Git { source: source(store, application).await, chain };
        }
        let Some(reference) = owner_reference(&current) else { break };
        let (Some(api_version), Some(kind), Some(name)) =
            (reference["apiVersion"].as_str(), reference["kind"].as_str(), reference["name"].as_str())
        else {
            break;
        };
        chain.push(Link { kind: kind.to_owned(), name: name.to_owned() });
        let namespace = current["metadata"]["namespace"].as_str().unwrap_or("").to_owned();
        let key = ObjectKey::new(group_kind(api_version, kind), &namespace, name);
        match store.get(&key).await {
            Ok(Some(owner)) => current = owner,
            _ => break,
        }
    }
    if chain.is_empty() { Owner::Cluster } else { Owner::Controller { chain } }
}

async fn source(store: &dyn Store, application: &str) -> Source {
    let (namespace, name) = application.split_once('/').unwrap_or(("", application));
    let key = ObjectKey::new(group_kind("gitplane.io/v1", "Application"), namespace, name);
    let repo = match store.get(&key).await {
        // Typed, so that what Git left out reads as its default (`branch: main`).
        Ok(Some(app)) => match serde_json::from_value::<ApplicationSpec>(app["spec"].clone()) {
            Ok(spec) => Some((spec.repo, spec.branch, spec.path)),
            Err(_) => None,
        },
        _ => None,
    };
    Source { application: application.to_owned(), repo }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gitplane_storage::sqlite::SqliteStore;
    use gitplane_store::Op;
    use serde_json::json;

    fn link(kind: &str, name: &str) -> Link {
        Link { kind: kind.into(), name: name.into() }
    }

    fn demo() -> Source {
        Source {
            application: "gitplane-system/demo".into(),
            repo: Some(("demo".into(), "main".into(), "apps/web".into())),
        }
    }

    #[test]
    fn the_message_names_the_owner() {
        let direct = message("Deployment default/web", &Owner::Git { chain: vec![], source: demo() });
        assert_eq!(
            direct,
            "Deployment default/web is applied from Git by Application gitplane-system/demo (repository demo, \
             branch main, path apps/web). gitplane's API is read-only: desired state comes only from Git: change it there and push"
        );
        let pod = message(
            "Pod default/web-7c9-x2",
            &Owner::Git { chain: vec![link("ReplicaSet", "web-7c9"), link("Deployment", "web")], source: demo() },
        );
        assert!(
            pod.starts_with(
                "Pod default/web-7c9-x2 is made by ReplicaSet web-7c9, which is made by Deployment web, which is applied from Git by Application gitplane-system/demo (repository demo"
            ),
            "{pod}"
        );
        assert!(pod.ends_with("change Deployment web there and push"), "{pod}");
        let root =
            Source { application: "a/b".into(), repo: Some(("https://x/y.git".into(), "main".into(), String::new())) };
        assert!(
            message("ConfigMap a/c", &Owner::Git { chain: vec![], source: root })
                .contains("(repository https://x/y.git, branch main)")
        );
        let gone = message(
            "ConfigMap a/c",
            &Owner::Git { chain: vec![], source: Source { application: "a/b".into(), repo: None } },
        );
        assert!(gone.contains("Application a/b, which no longer exists"), "{gone}");
        let orphan = message("Pod a/p", &Owner::Controller { chain: vec![link("ReplicaSet", "rs")] });
        assert!(orphan.starts_with("Pod a/p is made by ReplicaSet rs, and nothing in Git owns it"), "{orphan}");
        assert!(
            message("Node n1", &Owner::Cluster).starts_with("nothing in Git owns Node n1: the cluster keeps it itself")
        );
    }

    #[tokio::test]
    async fn the_owner_is_found_up_the_controller_chain() {
        let store = SqliteStore::memory().await.unwrap();
        let app = json!({"apiVersion": "gitplane.io/v1", "kind": "Application", "metadata": {"name": "demo", "namespace": "gitplane-system"},
                         "spec": {"repo": "demo", "path": "apps/web"}});
        let deployment = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "default",
                                "annotations": {APPLICATION_ANNOTATION: "gitplane-system/demo"}}});
        let rs = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "web-7c9", "namespace": "default",
                        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": "u1", "controller": true}]}});
        let orphan = json!({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "lost", "namespace": "default",
                            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "gone", "uid": "u2", "controller": true}]}});
        store.txn(vec![Op::Create(app), Op::Create(deployment), Op::Create(rs), Op::Create(orphan)]).await.unwrap();
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web-7c9-x2", "namespace": "default",
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-7c9", "uid": "u3", "controller": true}]}});
        assert_eq!(
            resolve(&store, &pod).await,
            Owner::Git { chain: vec![link("ReplicaSet", "web-7c9"), link("Deployment", "web")], source: demo() }
        );
        let lost = json!({"metadata": {"name": "p", "namespace": "default",
                          "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "lost", "uid": "u4"}]}});
        assert_eq!(
            resolve(&store, &lost).await,
            Owner::Controller { chain: vec![link("ReplicaSet", "lost"), link("Deployment", "gone")] }
        );
        assert_eq!(resolve(&store, &json!({"metadata": {"name": "n1"}})).await, Owner::Cluster);
    }
}
