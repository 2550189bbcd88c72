//! `WatchPodConfig`: the ConfigMaps, Secrets and PersistentVolumeClaims a node may read, which
//! are exactly those its own Pods reference, and the PersistentVolumes those claims hold
//! (Kubernetes' node authorizer, whose graph has an edge from each Pod to what it references,
//! from a claim to its volume and from the Pod to its node). The reference set is kept per
//! stream from the node's Pods and claims and recomputed on each of their changes. Besides,
//! the volumes gitplane.io/local-path provisioned on the node itself, whose directories it
//! holds (and removes once they are deleted). The stream carries nothing else.
//!
//! A volume no Pod of the node references any more is not retracted: the node keeps what it
//! read, and a provisioned volume's deletion must reach it.
//!
//! [`References`] is the pure bookkeeping (which objects are referenced, and which revision of
//! each was sent); [`watch`] is the stream over the store.

use super::{ObjectEventStream, references::ReferenceCounts, store_status};
use futures::StreamExt;
use gitplane_api::podrefs::{ConfigKind, ConfigRef, claim_volume, config_refs};
use gitplane_proto::node::{EventType as WireEventType, ObjectEvent};
use gitplane_store::{Event, EventType, ListOptions, ObjectKey, Store, WatchOptions, WatchStream};
use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use tonic::Status;

/// Which objects one node's Pods reference, and the revision of each that the stream sent.
#[derive(Debug, Default)]
pub(super) struct References {
    /// (namespace, name) of each Pod of the node -> what it references, counted per object.
    pods: ReferenceCounts<(String, String), ConfigRef>,
    /// (namespace, name) of each referenced claim -> the volume it holds.
    claims: ReferenceCounts<(String, String), ConfigRef>,
    /// The revision of each referenced object last sent (its write, or its deletion).
    sent: HashMap<ConfigRef, i64>,
}

impl References {
    /// Pod `pod` (of this node; `None`: gone or not this node's) now references `refs`: the
    /// objects that became referenced, and those no Pod of the node references any more.
    pub(super) fn set_pod(
        &mut self,
        pod: (String, String),
        refs: BTreeSet<ConfigRef>,
    ) -> (Vec<ConfigRef>, Vec<ConfigRef>) {
        let (added, removed) = self.pods.set(pod, refs);
        for r in &removed {
            self.sent.remove(r);
        }
        (added, removed)
    }

    /// Claim `claim` (referenced, or `refs` empty: no longer) now holds the volumes `refs`.
    fn set_claim(&mut self, claim: (String, String), refs: BTreeSet<ConfigRef>) -> (Vec<ConfigRef>, Vec<ConfigRef>) {
        let (added, removed) = self.claims.set(claim, refs);
        for r in &removed {
            self.sent.remove(r);
        }
        (added, removed)
    }

    fn is_referenced(&self, r: &ConfigRef) -> bool {
        self.pods.is_referenced(r) || self.claims.is_referenced(r)
    }

    /// Whether a write of `r` at `revision` goes out: it is referenced and newer than what was
    /// sent (an object read when it became referenced may be newer than the watch's events).
    pub(super) fn take(&mut self, r: &ConfigRef, revision: i64) -> bool {
        if !self.is_referenced(r) || self.sent.get(r).is_some_and(|sent| *sent >= revision) {
            return false;
        }
        self.sent.insert(r.clone(), revision);
        true
    }
}

fn config_ref(key: &ObjectKey) -> Option<ConfigRef> {
    Some(ConfigRef {
        kind: ConfigKind::from_kind(&key.kind)?,
        namespace: key.namespace.clone(),
        name: key.name.clone(),
    })
}

/// A volume gitplane.io/local-path provisioned on `node`: the node holds its directory.
fn provisioned_on(volume: &Value, node: &str) -> bool {
    use gitplane_api::volumes::{LOCAL_PATH_PROVISIONER, PROVISIONED_BY};
    let terms = volume["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"].as_array();
    volume["metadata"]["annotations"][PROVISIONED_BY] == LOCAL_PATH_PROVISIONER
        && terms.into_iter().flatten().any(|t| {
            t["matchExpressions"].as_array().into_iter().flatten().any(|e| {
                e["key"] == "kubernetes.io/hostname"
                    && e["operator"] == "In"
                    && e["values"].as_array().is_some_and(|v| v.iter().any(|v| v == node))
            })
        })
}

fn claim_key(r: &ConfigRef) -> (String, String) {
    (r.namespace.clone(), r.name.clone())
}

fn revision_of(object: &Value) -> i64 {
    object["metadata"]["resourceVersion"].as_str().and_then(|rv| rv.parse().ok()).unwrap_or(0)
}

fn event(kind: WireEventType, revision: i64, group_kind: &str, object: &Value) -> ObjectEvent {
    ObjectEvent {
        r#type: kind as i32,
        resource_version: revision,
        kind: group_kind.to_owned(),
        object: serde_json::to_vec(object).unwrap_or_default(),
    }
}

fn bookmark(revision: i64) -> ObjectEvent {
    ObjectEvent { r#type: WireEventType::Bookmark as i32, resource_version: revision, ..Default::default() }
}

/// What a node's Pod references (its ServiceAccount's image pull Secrets included, which the
/// node's copy of the Pod names), or nothing when `pod` is not bound to `node`.
async fn pod_refs(store: &Arc<dyn Store>, pod: &Value, node: &str) -> Result<BTreeSet<ConfigRef>, Status> {
    if pod["spec"]["nodeName"].as_str() != Some(node) {
        return Ok(BTreeSet::new());
    }
    let mut refs = serde_json::from_value::<Pod>(pod.clone()).map(|p| config_refs(&p)).unwrap_or_default();
    if !super::pull_secrets::has_own(pod) {
        let account = super::service_account(store, pod).await.map_err(store_status)?;
        let namespace = pod["metadata"]["namespace"].as_str().unwrap_or_default();
        for name in super::pull_secrets::inherited(pod, account.as_ref()) {
            refs.insert(ConfigRef { kind: ConfigKind::Secret, namespace: namespace.to_owned(), name: name.to_owned() });
        }
    }
    Ok(refs)
}

fn pod_key(pod: &Value) -> (String, String) {
    let field = |f: &str| pod["metadata"][f].as_str().unwrap_or_default().to_owned();
    (field("namespace"), field("name"))
}

/// One stream's state.
struct Follow {
    store: Arc<dyn Store>,
    node: String,
    refs: References,
    events: WatchStream,
    out: VecDeque<Result<ObjectEvent, Status>>,
    done: bool,
}

impl Follow {
    /// Sends the objects that became referenced (as read now) and forgets the others; a claim
    /// brings its volume along, and takes its edge away with it.
    async fn changed(
        &mut self,
        revision: i64,
        mut added: Vec<ConfigRef>,
        mut removed: Vec<ConfigRef>,
    ) -> Result<(), Status> {
        while let Some(r) = added.pop() {
            let key = ObjectKey::new(r.kind.as_str(), r.namespace.clone(), r.name.clone());
            if let Some(object) = self.store.get(&key).await.map_err(store_status)? {
                let written = revision_of(&object);
                if self.refs.take(&r, written) {
                    self.out.push_back(Ok(event(
                        WireEventType::Added,
                        revision.max(written),
                        r.kind.as_str(),
                        &object,
                    )));
                }
                if r.kind == ConfigKind::PersistentVolumeClaim {
                    let (more, fewer) = self.refs.set_claim(claim_key(&r), claim_volume(&object).into_iter().collect());
                    added.extend(more);
                    removed.extend(fewer);
                }
            }
        }
        for r in removed {
            if r.kind == ConfigKind::PersistentVolumeClaim {
                self.refs.set_claim(claim_key(&r), BTreeSet::new());
            }
            // A volume stays: its deletion is what the node must see (see the module's note).
            if r.kind == ConfigKind::PersistentVolume {
                continue;
            }
            let gone = serde_json::json!({
                "apiVersion": "v1", "kind": r.kind.as_str(),
                "metadata": {"name": r.name, "namespace": r.namespace},
            });
            self.out.push_back(Ok(event(WireEventType::Deleted, revision, r.kind.as_str(), &gone)));
        }
        Ok(())
    }

    async fn handle(&mut self, event: Event) -> Result<(), Status> {
        if event.event_type == EventType::Bookmark {
            self.out.push_back(Ok(bookmark(event.revision)));
            return Ok(());
        }
        if event.key.kind == "Pod" {
            let was_ours = self.refs.pods.holds(&pod_key(&event.object));
            let refs = if event.event_type == EventType::Deleted {
                BTreeSet::new()
            } else {
                pod_refs(&self.store, &event.object, &self.node).await?
            };
            if !was_ours && refs.is_empty() && event.object["spec"]["nodeName"].as_str() != Some(&self.node) {
                return Ok(()); // another node's Pod
            }
            let (added, removed) = self.refs.set_pod(pod_key(&event.object), refs);
            self.changed(event.revision, added, removed).await?;
            self.out.push_back(Ok(bookmark(event.revision)));
            return Ok(());
        }
        let Some(r) = config_ref(&event.key) else { return Ok(()) };
        let provisioned_here = r.kind == ConfigKind::PersistentVolume && provisioned_on(&event.object, &self.node);
        if self.refs.take(&r, event.revision) || provisioned_here {
            let kind = match event.event_type {
                EventType::Added => WireEventType::Added,
                EventType::Modified => WireEventType::Modified,
                _ => WireEventType::Deleted,
            };
            self.out.push_back(Ok(super::object_event(kind, event.revision, &event.key.kind, &event.object)));
        }
        if r.kind == ConfigKind::PersistentVolumeClaim && self.refs.pods.is_referenced(&r) {
            let volume = match event.event_type {
                EventType::Deleted => None,
                _ => claim_volume(&event.object),
            };
            let (added, removed) = self.refs.set_claim(claim_key(&r), volume.into_iter().collect());
            self.changed(event.revision, added, removed).await?;
        }
        Ok(())
    }
}

/// The stream of what `node`'s Pods reference (see `WatchPodConfig` in `node.proto`).
pub(super) async fn watch(store: Arc<dyn Store>, node: String) -> Result<ObjectEventStream, Status> {
    let pods = store.list("Pod", &ListOptions::default()).await.map_err(store_status)?;
    // Its own Node too: the stream ends when the node is removed.
    let at_pods = ListOptions { at_revision: Some(pods.revision), ..Default::default() };
    let volumes = store.list("PersistentVolume", &at_pods).await.map_err(store_status)?;
    let kinds =
        ["Pod", "ConfigMap", "Secret", "PersistentVolumeClaim", "PersistentVolume", "Node"].map(String::from).to_vec();
    let bookmark_interval = Some(super::watch_cache::BOOKMARK_INTERVAL);
    let options = WatchOptions { kinds: Some(kinds), bookmarks: true, bookmark_interval };
    let events = store.watch(pods.revision, options).await.map_err(store_status)?;
    let mut follow = Follow { store, node, refs: References::default(), events, out: VecDeque::new(), done: false };
    let mut added = Vec::new();
    for pod in &pods.items {
        let refs = pod_refs(&follow.store, pod, &follow.node).await?;
        if !refs.is_empty() {
            added.extend(follow.refs.set_pod(pod_key(pod), refs).0);
        }
    }
    follow.changed(pods.revision, added, Vec::new()).await?;
    for volume in volumes.items.iter().filter(|v| provisioned_on(v, &follow.node)) {
        follow.out.push_back(Ok(event(WireEventType::Added, pods.revision, "PersistentVolume", volume)));
    }
    follow.out.push_back(Ok(bookmark(pods.revision)));
    tracing::info!(node = %follow.node, objects = follow.refs.pods.len(), "pod config watch started");
    Ok(Box::pin(futures::stream::unfold(follow, |mut follow| async move {
        loop {
            if let Some(next) = follow.out.pop_front() {
                return Some((next, follow));
            }
            if follow.done {
                return None;
            }
            match follow.events.next().await {
                None => return None,
                Some(Err(e)) => {
                    follow.done = true;
                    follow.out.push_back(Err(store_status(e)));
                }
                Some(Ok(event)) if super::identity::removes(&event, &follow.node) => {
                    follow.done = true;
                    follow.out.push_back(Err(super::identity::removed(&follow.node)));
                }
                Some(Ok(event)) => {
                    if let Err(status) = follow.handle(event).await {
                        follow.done = true;
                        follow.out.push_back(Err(status));
                    }
                }
            }
        }
    })))
}

#[cfg(test)]
mod tests {
    use super::super::{Caller, NodeIdentity, NodeService};
    use super::*;
    use gitplane_proto::node::{WatchPodConfigRequest, node_service_server::NodeService as _};
    use gitplane_store::Op;
    use serde_json::json;
    use std::time::Duration;
    use tonic::Request;

    fn object(kind: &str, name: &str) -> Value {
        json!({"apiVersion": "v1", "kind": kind, "metadata": {"name": name, "namespace": "default"}, "data": {"k": "dg=="}})
    }

    fn bound_pod(name: &str, node: &str, secret: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
               "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i:1",
                 "env": [{"name": "S", "valueFrom": {"secretKeyRef": {"name": secret, "key": "k"}}}]}],
                 "volumes": [{"name": "v", "configMap": {"name": "shared"}}]}})
    }

    /// "kind name" of every object event until the next bookmark.
    async fn until_bookmark(stream: &mut ObjectEventStream) -> Vec<String> {
        let mut seen = Vec::new();
        loop {
            let next = tokio::time::timeout(Duration::from_secs(10), stream.next()).await.unwrap().unwrap().unwrap();
            if next.r#type == WireEventType::Bookmark as i32 {
                return seen;
            }
            let o: Value = serde_json::from_slice(&next.object).unwrap();
            let kind = WireEventType::try_from(next.r#type).unwrap().as_str_name();
            seen.push(format!("{kind} {} {}", next.kind, o["metadata"]["name"].as_str().unwrap()));
        }
    }

    #[tokio::test]
    async fn a_node_reads_only_what_its_own_pods_reference() {
        let store: Arc<dyn Store> = Arc::new(gitplane_storage::sqlite::SqliteStore::memory().await.unwrap());
        let service = NodeService::new(
            store.clone(),
            NodeIdentity::new("join-token-for-tests-0123", [9; 32]),
            Arc::new(crate::tls::ClusterCa::derive([9; 32]).unwrap()),
            Default::default(),
        );
        let ops = [
            object("ConfigMap", "shared"),
            object("Secret", "mine"),
            object("Secret", "theirs"),
            object("Secret", "unused"),
            object("Secret", "registry"),
            // Its Pods name no image pull Secrets: they take their ServiceAccount's.
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default", "namespace": "default"},
                   "imagePullSecrets": [{"name": "registry"}]}),
            bound_pod("a1", "a", "mine"),
            bound_pod("b1", "b", "theirs"),
            // Registered nodes: a node's calls are admitted only while its Node exists.
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "a"}}),
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "b"}}),
        ];
        store.txn(ops.into_iter().map(Op::Create).collect()).await.unwrap();
        let request = |node: &str, caller: &str| {
            let mut request = Request::new(WatchPodConfigRequest { node_name: node.into() });
            request.extensions_mut().insert(Caller::node(caller));
            request
        };
        let denied = service.watch_pod_config(request("b", "a")).await.err().unwrap();
        assert_eq!(denied.code(), tonic::Code::PermissionDenied);
        let mut stream = service.watch_pod_config(request("a", "a")).await.unwrap().into_inner();
        let mut listed = until_bookmark(&mut stream).await;
        listed.sort();
        assert_eq!(
            listed,
            ["ADDED ConfigMap shared", "ADDED Secret mine", "ADDED Secret registry"],
            "not B's Secret, not an unused one"
        );

        // Changes: only of referenced objects; a newly bound Pod brings what it references.
        let mut theirs = object("Secret", "theirs");
        theirs["data"]["k"] = json!("dzI=");
        store.txn(vec![Op::Update(theirs)]).await.unwrap();
        let mut mine = object("Secret", "mine");
        mine["data"]["k"] = json!("dzI=");
        store.txn(vec![Op::Update(mine)]).await.unwrap();
        store.txn(vec![Op::Create(bound_pod("a2", "a", "unused"))]).await.unwrap();
        let mut seen = Vec::new();
        while seen.len() < 2 {
            seen.extend(until_bookmark(&mut stream).await);
        }
        assert_eq!(seen, ["MODIFIED Secret mine", "ADDED Secret unused"]);
        // The Pod goes: what only it referenced is withdrawn.
        store.txn(vec![Op::Delete { key: ObjectKey::new("Pod", "default", "a2"), revision: None }]).await.unwrap();
        let mut seen = Vec::new();
        while seen.is_empty() {
            seen.extend(until_bookmark(&mut stream).await);
        }
        assert_eq!(seen, ["DELETED Secret unused"]);
    }

    fn r(kind: ConfigKind, name: &str) -> ConfigRef {
        ConfigRef { kind, namespace: "default".into(), name: name.into() }
    }

    fn pod(name: &str) -> (String, String) {
        ("default".into(), name.into())
    }

    #[test]
    fn an_object_is_referenced_while_any_pod_references_it() {
        let mut refs = References::default();
        let (cm, secret) = (r(ConfigKind::ConfigMap, "cm"), r(ConfigKind::Secret, "s"));
        let (added, removed) = refs.set_pod(pod("a"), [cm.clone(), secret.clone()].into());
        assert_eq!((added, removed), (vec![cm.clone(), secret.clone()], vec![]));
        let (added, _) = refs.set_pod(pod("b"), [cm.clone()].into());
        assert!(added.is_empty(), "already referenced");
        assert!(refs.take(&cm, 5));
        assert!(!refs.take(&cm, 5) && !refs.take(&cm, 4), "never an older write after a newer one");
        assert!(refs.take(&cm, 6));
        assert!(!refs.take(&r(ConfigKind::Secret, "other"), 7), "not referenced: never sent");
        let (added, removed) = refs.set_pod(pod("a"), BTreeSet::new());
        assert_eq!((added, removed), (vec![], vec![secret.clone()]));
        assert!(!refs.take(&secret, 8), "no longer referenced");
        let (_, removed) = refs.set_pod(pod("b"), BTreeSet::new());
        assert_eq!(removed, std::slice::from_ref(&cm));
        refs.set_pod(pod("c"), [cm.clone()].into());
        assert!(refs.take(&cm, 3), "referenced again: sent again from its current state");
    }
}
