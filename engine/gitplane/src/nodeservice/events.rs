//! `CreateEvents`: the kubelet's Events, admitted as Kubernetes' NodeRestriction admits them. A
//! node records Events only about the Pods bound to it and about its own Node; the reference is
//! rebuilt from the stored object (the node's copy is not trusted), the source is `kubelet` on the
//! node's own name, and the time is the replica's.

use super::store_status;
use gitplane_api::events::{NORMAL, Record, Source, WARNING, reference};
use gitplane_proto::node::NodeEvent;
use gitplane_store::{Api, Store};
use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod};
use std::{collections::HashMap, sync::Arc};
use tonic::Status;

/// The most Events one call may carry.
pub(super) const MAX_EVENTS: usize = 256;

/// The batch's records, or a refusal of the whole batch naming the first Event not allowed.
pub(super) async fn authorize(store: Arc<dyn Store>, node: &str, batch: Vec<NodeEvent>) -> Result<Vec<Record>, Status> {
    if batch.len() > MAX_EVENTS {
        return Err(Status::invalid_argument(format!("at most {MAX_EVENTS} events per call, not {}", batch.len())));
    }
    let source = Source { component: "kubelet".into(), host: node.to_owned() };
    let pods = Api::<Pod>::new(store.clone());
    let mut bound: HashMap<(String, String), ObjectReference> = HashMap::new();
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
        let reference = match involved.kind.as_deref() {
            Some("Node") if name == node => ObjectReference {
                kind: Some("Node".into()),
                api_version: Some("v1".into()),
                name: Some(name),
                uid: node_uid(store.clone(), node).await?,
                ..Default::default()
            },
            Some("Pod") => match bound.get(&(namespace.clone(), name.clone())) {
                Some(r) => r.clone(),
                None => {
                    let pod = pods.get(&namespace, &name).await.map_err(store_status)?;
                    // Said the same way whether the Pod is elsewhere or nowhere: no probing.
                    let Some(pod) = pod.filter(|p| {
                        p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
                            && (involved.uid.is_none() || p.metadata.uid == involved.uid)
                    }) else {
                        return Err(Status::permission_denied(format!(
                            "node {node} may not record events about pod {namespace}/{name}: it is not bound to it"
                        )));
                    };
                    let r = reference(&pod);
                    bound.insert((namespace, name), r.clone());
                    r
                }
            },
            kind => {
                return Err(Status::permission_denied(format!(
                    "node {node} may record events only about its Pods and its own Node, not {} {namespace}/{name}",
                    kind.unwrap_or("an object without a kind")
                )));
            }
        };
        records.push(Record::new(source.clone(), reference, &event.r#type, &event.reason, &event.message));
    }
    Ok(records)
}

async fn node_uid(store: Arc<dyn Store>, node: &str) -> Result<Option<String>, Status> {
    let node = Api::<Node>::new(store).get("", node).await.map_err(store_status)?;
    Ok(node.and_then(|n| n.metadata.uid))
}
