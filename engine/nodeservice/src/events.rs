//! `CreateEvents`: the kubelet's Events, admitted as Kubernetes' NodeRestriction admits them. A
//! node records Events only about the Pods bound to it, about its own Node and about the cluster
//! DNS ConfigMap (`kube-system/kube-dns`, which every node applies and may refuse); the reference is
//! rebuilt from the stored object (the node's copy is not trusted), the source is `kubelet` on the
//! node's own name, and the time is the replica's. A Pod deleted since the node saw it still
//! counts as bound (its Killing Events come after it is gone) when the store's history shows
//! its deletion from this node. A Pod's Event never carries a value of the
//! Secrets the Pod references (a probe's output or a container's message may quote one): each
//! is replaced by `<masked>` before the Event is stored.

use super::store_status;
use base64::Engine as _;
use futures::StreamExt as _;
use gitplane_api::{
    events::{NORMAL, Record, Source, WARNING, reference},
    kubedns,
    podrefs::{ConfigKind, config_refs},
};
use gitplane_proto::node::NodeEvent;
use gitplane_store::{Api, EventType, ObjectKey, Store, WatchOptions};
use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod};
use std::{cmp::Reverse, collections::HashMap, sync::Arc};
use tonic::Status;

/// The most Events one call may carry.
pub(super) const MAX_EVENTS: usize = 256;

/// A Pod's reference and the values of the Secrets it references.
type BoundPod = (ObjectReference, Arc<Vec<String>>);

/// The batch's records, or a refusal of the whole batch naming the first Event not allowed.
pub(super) async fn authorize(store: Arc<dyn Store>, node: &str, batch: Vec<NodeEvent>) -> Result<Vec<Record>, Status> {
    if batch.len() > MAX_EVENTS {
        return Err(Status::invalid_argument(format!("at most {MAX_EVENTS} events per call, not {}", batch.len())));
    }
    let source = Source { component: "kubelet".into(), host: node.to_owned() };
    let pods = Api::<Pod>::new(store.clone());
    let mut bound: HashMap<(String, String), BoundPod> = HashMap::new();
    let mut records = Vec::with_capacity(batch.len());
    for event in batch {
        let involved: ObjectReference = serde_json::from_slice(&event.involved_object)
            .map_err(|e| Status::invalid_argument(format!("an event's involvedObject is not valid JSON: {e}")))?;
        if event.r#type != NORMAL && event.r#type != WARNING {
            return Err(Status::invalid_argument(format!(
                "event type {:?} is neither Normal nor Warning",
                event.r#type
            )));
        }
        if event.reason.is_empty() {
            return Err(Status::invalid_argument("an event needs a reason"));
        }
        let namespace = involved.namespace.clone().unwrap_or_default();
        let name = involved.name.clone().unwrap_or_default();
        let (reference, secrets) = match involved.kind.as_deref() {
            Some("Node") if name == node => {
                let reference = ObjectReference {
                    kind: Some("Node".into()),
                    api_version: Some("v1".into()),
                    name: Some(name),
                    uid: node_uid(store.clone(), node).await?,
                    ..Default::default()
                };
                (reference, Arc::default())
            }
            Some("Pod") => match bound.get(&(namespace.clone(), name.clone())) {
                Some(r) => r.clone(),
                None => {
                    let bound_here = |p: &Pod| {
                        p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
                            && (involved.uid.is_none() || p.metadata.uid == involved.uid)
                    };
                    let pod = match pods.get(&namespace, &name).await.map_err(store_status)? {
                        Some(pod) => Some(pod).filter(bound_here),
                        None => deleted_pod(store.as_ref(), &involved).await.filter(bound_here),
                    };
                    // Said the same way whether the Pod is elsewhere or nowhere: no probing.
                    let Some(pod) = pod else {
                        return Err(Status::permission_denied(format!(
                            "node {node} may not record events about pod {namespace}/{name}: it is not bound to it"
                        )));
                    };
                    let bound_pod = (reference(&pod), Arc::new(secret_values(store.as_ref(), &pod).await?));
                    bound.insert((namespace, name), bound_pod.clone());
                    bound_pod
                }
            },
            Some("ConfigMap") if namespace == kubedns::NAMESPACE && name == kubedns::NAME => {
                let key = ObjectKey::new("ConfigMap", &namespace, &name);
                let stored = store.get(&key).await.map_err(store_status)?;
                let reference = ObjectReference {
                    kind: Some("ConfigMap".into()),
                    api_version: Some("v1".into()),
                    namespace: Some(namespace),
                    name: Some(name),
                    uid: stored.as_ref().and_then(|c| c["metadata"]["uid"].as_str().map(str::to_owned)),
                    ..Default::default()
                };
                (reference, Arc::default())
            }
            kind => {
                return Err(Status::permission_denied(format!(
                    "node {node} may record events only about its Pods, its own Node and {}/{}, not {} {namespace}/{name}",
                    kubedns::NAMESPACE,
                    kubedns::NAME,
                    kind.unwrap_or("an object without a kind")
                )));
            }
        };
        let message = mask(&event.message, &secrets);
        records.push(Record::new(source.clone(), reference, &event.r#type, &event.reason, &message));
    }
    Ok(records)
}

/// What stands for a Secret's value in an Event, as in every output of gitplane.
const MASK: &str = "<masked>";
/// Shorter values are not masked: they would mask ordinary words of every message.
const MIN_MASKED: usize = 4;
/// The shortest prefix of a value masked where it ends a message.
const MIN_MASKED_PREFIX: usize = 8;

/// The values of the Secrets `pod` references, decoded and as stored (base64).
async fn secret_values(store: &dyn Store, pod: &Pod) -> Result<Vec<String>, Status> {
    let mut values = Vec::new();
    for r in config_refs(pod).into_iter().filter(|r| r.kind == ConfigKind::Secret) {
        let key = ObjectKey::new(ConfigKind::Secret.as_str(), &r.namespace, &r.name);
        let Some(secret) = store.get(&key).await.map_err(store_status)? else { continue };
        for (field, encoded) in [("data", true), ("stringData", false)] {
            for value in secret[field].as_object().into_iter().flat_map(|m| m.values()).filter_map(|v| v.as_str()) {
                values.push(value.to_owned());
                if encoded && let Ok(bytes) = base64::engine::general_purpose::STANDARD.decode(value) {
                    values.push(String::from_utf8_lossy(&bytes).into_owned());
                }
            }
        }
    }
    Ok(values)
}

/// `message` with every one of `values` replaced by [`MASK`]: whole, each of its lines, and a
/// prefix of one that ends the message (the sender may have cut the message there).
fn mask(message: &str, values: &[String]) -> String {
    let mut needles: Vec<&str> = values
        .iter()
        .flat_map(|v| std::iter::once(v.as_str()).chain(v.lines().map(str::trim)))
        .filter(|n| n.len() >= MIN_MASKED)
        .collect();
    needles.sort_by_key(|n| (Reverse(n.len()), *n));
    needles.dedup();
    let mut out = message.to_owned();
    for needle in &needles {
        if out.contains(needle) {
            out = out.replace(needle, MASK);
        }
    }
    // A longer prefix than a whole value's minimum: a short one would be any word.
    let cut = needles.iter().find_map(|needle| {
        (MIN_MASKED_PREFIX..needle.len()).rev().find(|k| needle.is_char_boundary(*k) && out.ends_with(&needle[..*k]))
    });
    if let Some(k) = cut {
        out.truncate(out.len() - k);
        out.push_str(MASK);
    }
    out
}

/// The last state of a Pod deleted since the node saw it (`involved`'s resourceVersion and uid),
/// from the store's history: the node's Events about stopping it (Killing) come after the Pod
/// is gone, as gitplane deletes Pods at once (no graceful deletion). `None` when the history no
/// longer reaches that far, or holds no such deletion (looked for at most [`HISTORY_SCAN`]).
async fn deleted_pod(store: &dyn Store, involved: &ObjectReference) -> Option<Pod> {
    let seen: i64 = involved.resource_version.as_deref()?.parse().ok()?;
    let uid = involved.uid.as_deref()?;
    let (namespace, name) = (involved.namespace.as_deref().unwrap_or_default(), involved.name.as_deref()?);
    let now = store.revision().await.ok()?;
    let options = WatchOptions { kinds: Some(vec!["Pod".into()]), bookmarks: false, ..Default::default() };
    let mut history = store.watch(seen, options).await.ok()?;
    let scan = async {
        while let Some(Ok(event)) = history.next().await {
            if event.revision > now {
                break;
            }
            if event.event_type == EventType::Deleted && event.key.namespace == namespace && event.key.name == name {
                let pod: Pod = serde_json::from_value(event.object.as_ref().clone()).ok()?;
                return (pod.metadata.uid.as_deref() == Some(uid)).then_some(pod);
            }
        }
        None
    };
    tokio::time::timeout(HISTORY_SCAN, scan).await.ok().flatten()
}

/// How long the history is searched for a deleted Pod.
const HISTORY_SCAN: std::time::Duration = std::time::Duration::from_secs(2);

async fn node_uid(store: Arc<dyn Store>, node: &str) -> Result<Option<String>, Status> {
    let node = Api::<Node>::new(store).get("", node).await.map_err(store_status)?;
    Ok(node.and_then(|n| n.metadata.uid))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_values_are_masked_whole_by_line_and_cut() {
        let values = vec!["hunter2-secret".to_owned(), "line one\nsecond-line".to_owned(), "abc".to_owned()];
        assert_eq!(
            mask("Liveness probe failed: pw=hunter2-secret, hunter2-secret", &values),
            "Liveness probe failed: pw=<masked>, <masked>"
        );
        assert_eq!(mask("out: second-line", &values), "out: <masked>");
        assert_eq!(mask("cut at the end: hunter2-se", &values), "cut at the end: <masked>");
        // Too short to mask without masking ordinary words.
        assert_eq!(mask("abc is fine", &values), "abc is fine");
        assert_eq!(mask("a word at the end: line", &values), "a word at the end: line");
        assert_eq!(mask("nothing here", &values), "nothing here");
    }
}
