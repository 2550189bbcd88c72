//! The ConfigMaps, Secrets and claims this node's Pods reference and the volumes of those
//! claims, followed from the control plane's `WatchPodConfig` (the kubelet's configmap and
//! secret managers, with the watch strategy): the runtime reads them ([`ConfigSource`]) for env
//! and volumes, and a change wakes the workers of the Pods that reference the object, which
//! update their volumes in place or start containers that waited for it. A deleted volume that
//! gitplane.io/local-path provisioned under this node's directory has its directory removed
//! (the provisioner's delete).

use crate::controlplane::{Client, Follower, Servers, follow};
use crate::kubelet::runtime::env::ConfigSource;
use crate::kubelet::token_manager::{TokenManager, Wake};
use gitplane_api::podrefs::{ConfigKind, ConfigRef, config_refs};
use gitplane_proto::node::{EventType, ObjectEvent, WatchPodConfigRequest};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume, PersistentVolumeClaim, Pod, Secret};
use std::{
    collections::{BTreeSet, HashMap},
    path::{Path, PathBuf},
    sync::{Arc, Mutex, PoisonError, RwLock},
    time::Duration,
};
use tokio::sync::{Notify, watch};
use tonic::{Response, Status, Streaming};

/// How long a Pod waits for the objects it references to arrive before it starts without them
/// (and waits with CreateContainerConfigError, naming what is missing).
pub const ARRIVAL_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone, Debug, Default)]
struct Objects {
    config_maps: HashMap<(String, String), Arc<ConfigMap>>,
    secrets: HashMap<(String, String), Arc<Secret>>,
    claims: HashMap<(String, String), Arc<PersistentVolumeClaim>>,
    volumes: HashMap<String, Arc<PersistentVolume>>,
}

impl Objects {
    /// Applies one event; the object it concerns.
    fn apply(&mut self, event: &ObjectEvent) -> Result<Option<ConfigRef>, serde_json::Error> {
        let deleted = match EventType::try_from(event.r#type).unwrap_or(EventType::Unspecified) {
            EventType::Added | EventType::Modified => false,
            EventType::Deleted => true,
            _ => return Ok(None),
        };
        let Some(kind) = ConfigKind::from_kind(&event.kind) else { return Ok(None) };
        let value: serde_json::Value = serde_json::from_slice(&event.object)?;
        let name = |f: &str| value["metadata"][f].as_str().unwrap_or_default().to_owned();
        let key = (name("namespace"), name("name"));
        let r = ConfigRef { kind, namespace: key.0.clone(), name: key.1.clone() };
        match (kind, deleted) {
            (ConfigKind::ConfigMap, false) => {
                self.config_maps.insert(key, Arc::new(serde_json::from_value(value)?));
            }
            (ConfigKind::Secret, false) => {
                self.secrets.insert(key, Arc::new(serde_json::from_value(value)?));
            }
            (ConfigKind::ConfigMap, true) => {
                self.config_maps.remove(&key);
            }
            (ConfigKind::Secret, true) => {
                self.secrets.remove(&key);
            }
            (ConfigKind::PersistentVolumeClaim, false) => {
                self.claims.insert(key, Arc::new(serde_json::from_value(value)?));
            }
            (ConfigKind::PersistentVolumeClaim, true) => {
                self.claims.remove(&key);
            }
            (ConfigKind::PersistentVolume, false) => {
                self.volumes.insert(key.1, Arc::new(serde_json::from_value(value)?));
            }
            (ConfigKind::PersistentVolume, true) => {
                self.volumes.remove(&key.1);
            }
        }
        Ok(Some(r))
    }
}

/// What a Pod references, and its worker's wake-up.
type Interest = (BTreeSet<ConfigRef>, Arc<Notify>);

/// The followed objects, the revision the stream reached, and who to wake on a change; and the
/// Pods' ServiceAccount tokens, where the control plane gives them.
pub struct PodConfig {
    objects: RwLock<Objects>,
    tokens: std::sync::OnceLock<TokenManager>,
    revision: watch::Sender<i64>,
    /// pod uid -> (what it references, its worker's wake-up).
    interested: Mutex<HashMap<String, Interest>>,
    /// Where local-path volumes of this node live (`None`: no directory is ever removed).
    local_path_dir: Option<PathBuf>,
}

impl Default for PodConfig {
    fn default() -> Self {
        PodConfig {
            objects: RwLock::default(),
            tokens: std::sync::OnceLock::new(),
            revision: watch::channel(0).0,
            interested: Mutex::default(),
            local_path_dir: None,
        }
    }
}

impl ConfigSource for PodConfig {
    fn config_map(&self, namespace: &str, name: &str) -> Option<Arc<ConfigMap>> {
        let objects = self.objects.read().unwrap_or_else(PoisonError::into_inner);
        objects.config_maps.get(&(namespace.to_owned(), name.to_owned())).cloned()
    }

    fn secret(&self, namespace: &str, name: &str) -> Option<Arc<Secret>> {
        let objects = self.objects.read().unwrap_or_else(PoisonError::into_inner);
        objects.secrets.get(&(namespace.to_owned(), name.to_owned())).cloned()
    }

    fn service_account_token(&self, pod: &Pod, audience: &str, expiration_seconds: i64) -> Result<String, String> {
        match self.tokens.get() {
            Some(tokens) => tokens.get(pod, audience, expiration_seconds),
            None => Err("this node is given no ServiceAccount tokens".into()),
        }
    }

    fn persistent_volume_claim(&self, namespace: &str, name: &str) -> Option<Arc<PersistentVolumeClaim>> {
        let objects = self.objects.read().unwrap_or_else(PoisonError::into_inner);
        objects.claims.get(&(namespace.to_owned(), name.to_owned())).cloned()
    }

    fn persistent_volume(&self, name: &str) -> Option<Arc<PersistentVolume>> {
        self.objects.read().unwrap_or_else(PoisonError::into_inner).volumes.get(name).cloned()
    }
}

/// The directory of a deleted volume that local-path provisioned under `dir`, if it is one.
fn provisioned_dir(event: &ObjectEvent, dir: &Path) -> Option<PathBuf> {
    use gitplane_api::volumes::{LOCAL_PATH_PROVISIONER, PROVISIONED_BY};
    if event.r#type != EventType::Deleted as i32 || event.kind != "PersistentVolume" {
        return None;
    }
    let volume: serde_json::Value = serde_json::from_slice(&event.object).ok()?;
    if volume["metadata"]["annotations"][PROVISIONED_BY] != LOCAL_PATH_PROVISIONER {
        return None;
    }
    let path = PathBuf::from(volume["spec"]["hostPath"]["path"].as_str()?);
    // Only a directory right under ours: a volume never names another place to remove.
    (path.parent() == Some(dir) && path.file_name().is_some_and(|n| n.to_string_lossy().starts_with("pvc-")))
        .then_some(path)
}

impl PodConfig {
    /// Removes the directories of provisioned volumes deleted under `dir`.
    pub fn with_local_path_dir(dir: PathBuf) -> Self {
        PodConfig { local_path_dir: Some(dir), ..Default::default() }
    }

    /// From now on, Pods' ServiceAccount tokens are asked of `servers`; a token that arrives
    /// wakes its Pod's worker.
    pub(crate) fn request_tokens_from(self: &Arc<Self>, servers: Servers) {
        let config = Arc::downgrade(self);
        let wake: Wake = Arc::new(move |uid: &str| {
            if let Some(config) = config.upgrade() {
                let interested = config.interested.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some((_, wake)) = interested.get(uid) {
                    wake.notify_one();
                }
            }
        });
        let _ = self.tokens.set(TokenManager::new(servers, wake));
    }

    /// Pod `uid`'s worker is woken by `wake` when an object `pod` references changes.
    pub fn register(&self, uid: &str, pod: &Pod, wake: Arc<Notify>) {
        let refs = config_refs(pod);
        let mut interested = self.interested.lock().unwrap_or_else(PoisonError::into_inner);
        if refs.is_empty() {
            interested.remove(uid);
        } else {
            interested.insert(uid.to_owned(), (refs, wake));
        }
    }

    pub fn unregister(&self, uid: &str) {
        self.interested.lock().unwrap_or_else(PoisonError::into_inner).remove(uid);
    }

    /// Waits (at most [`ARRIVAL_TIMEOUT`] each) until the stream has caught up with `pod`'s own
    /// revision, so that what `pod` references is here if it exists, and until the
    /// ServiceAccount tokens its volumes project are here or refused.
    pub async fn wait_for(&self, pod: &Pod) {
        let tokens = async {
            if let Some(tokens) = self.tokens.get() {
                tokens.wait_for(pod, ARRIVAL_TIMEOUT).await;
            }
        };
        tokio::join!(tokens, self.wait_for_revision(pod));
    }

    async fn wait_for_revision(&self, pod: &Pod) {
        let Some(revision) = pod.metadata.resource_version.as_deref().and_then(|rv| rv.parse::<i64>().ok()) else {
            return;
        };
        if config_refs(pod).is_empty() {
            return;
        }
        let mut reached = self.revision.subscribe();
        if tokio::time::timeout(ARRIVAL_TIMEOUT, reached.wait_for(|r| *r >= revision)).await.is_err() {
            tracing::warn!(pod = ?pod.metadata.name, revision, "the Pod's ConfigMaps and Secrets did not arrive in time");
        }
    }

    /// Follows the control plane until `shutdown`.
    pub(crate) async fn follow(&self, servers: Servers, node_name: String, mut shutdown: watch::Receiver<bool>) {
        follow(&mut Following { config: self, node_name, listing: None }, &servers, &mut shutdown).await;
    }

    fn wake(&self, changed: impl Fn(&ConfigRef) -> bool) {
        let interested = self.interested.lock().unwrap_or_else(PoisonError::into_inner);
        for (refs, wake) in interested.values() {
            if refs.iter().any(&changed) {
                wake.notify_one();
            }
        }
    }

    fn observe(&self, event: &ObjectEvent, listing: &mut Option<Objects>) {
        let bookmark = event.r#type == EventType::Bookmark as i32;
        if let Some(objects) = listing {
            if let Err(e) = objects.apply(event) {
                tracing::warn!(kind = %event.kind, error = %e, "undecodable object in the pod config watch, skipped");
            }
            if bookmark && let Some(objects) = listing.take() {
                *self.objects.write().unwrap_or_else(PoisonError::into_inner) = objects;
                self.revision.send_replace(event.resource_version);
                self.wake(|_| true);
            }
            return;
        }
        if let Some(path) = self.local_path_dir.as_deref().and_then(|dir| provisioned_dir(event, dir)) {
            match std::fs::remove_dir_all(&path) {
                Ok(()) => tracing::info!(path = %path.display(), "removed the directory of a deleted volume"),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => tracing::warn!(path = %path.display(), error = %e, "removing a deleted volume's directory"),
            }
        }
        let changed = self.objects.write().unwrap_or_else(PoisonError::into_inner).apply(event);
        match changed {
            // A volume is reached through claims: wake every Pod that mounts one.
            Ok(Some(r)) if r.kind == ConfigKind::PersistentVolume => {
                self.wake(|x| x.kind == ConfigKind::PersistentVolumeClaim)
            }
            Ok(Some(r)) => self.wake(|x| *x == r),
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(kind = %event.kind, error = %e, "undecodable object in the pod config watch, skipped")
            }
        }
        self.revision.send_if_modified(|r| {
            let newer = event.resource_version > *r;
            *r = (*r).max(event.resource_version);
            newer
        });
    }
}

/// One follow: the server always lists first, collected aside and swapped in at its bookmark.
struct Following<'a> {
    config: &'a PodConfig,
    node_name: String,
    listing: Option<Objects>,
}

impl Follower for Following<'_> {
    type Event = ObjectEvent;
    const WHAT: &'static str = "pod config watch";

    async fn open(&self, mut client: Client, _from: i64) -> Result<Streaming<ObjectEvent>, Status> {
        let request = WatchPodConfigRequest { node_name: self.node_name.clone() };
        client.watch_pod_config(request).await.map(Response::into_inner)
    }

    fn started(&mut self, _from: i64) {
        self.listing = Some(Objects::default());
    }

    async fn observe(&mut self, event: ObjectEvent) {
        self.config.observe(&event, &mut self.listing);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(kind: EventType, revision: i64, group_kind: &str, object: serde_json::Value) -> ObjectEvent {
        ObjectEvent {
            r#type: kind as i32,
            resource_version: revision,
            kind: group_kind.into(),
            object: serde_json::to_vec(&object).unwrap(),
        }
    }

    fn bookmark(revision: i64) -> ObjectEvent {
        ObjectEvent { r#type: EventType::Bookmark as i32, resource_version: revision, ..Default::default() }
    }

    #[tokio::test]
    async fn changes_wake_the_pods_that_reference_them() {
        let config = PodConfig::default();
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "default", "uid": "u", "resourceVersion": "9"},
            "spec": {"containers": [], "volumes": [{"name": "v", "configMap": {"name": "cm"}}]}
        }))
        .unwrap();
        let wake = Arc::new(Notify::new());
        config.register("u", &pod, wake.clone());
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm", "namespace": "default"}, "data": {"a": "1"}});
        let other = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s", "namespace": "default"}});
        let mut listing = Some(Objects::default());
        config.observe(&event(EventType::Added, 5, "ConfigMap", cm.clone()), &mut listing);
        assert!(config.config_map("default", "cm").is_none(), "nothing shows before the list is complete");
        config.observe(&bookmark(5), &mut listing);
        assert_eq!(config.config_map("default", "cm").unwrap().data.as_ref().unwrap()["a"], "1");
        tokio::time::timeout(Duration::from_secs(1), wake.notified()).await.expect("woken by the list");

        config.observe(&event(EventType::Added, 7, "Secret", other), &mut listing);
        assert!(tokio::time::timeout(Duration::from_millis(50), wake.notified()).await.is_err(), "not its object");
        config.observe(&event(EventType::Deleted, 8, "ConfigMap", cm), &mut listing);
        tokio::time::timeout(Duration::from_secs(1), wake.notified()).await.expect("woken by its object");
        assert!(config.config_map("default", "cm").is_none());

        // The Pod (at revision 9) waits for the stream to reach its revision.
        let waiting = config.wait_for(&pod);
        tokio::pin!(waiting);
        assert!(tokio::time::timeout(Duration::from_millis(50), &mut waiting).await.is_err());
        config.observe(&bookmark(9), &mut listing);
        tokio::time::timeout(Duration::from_secs(1), waiting).await.expect("caught up");
    }
}
