//! The nodes as the scheduling loop counts them: built once from the informer cache, then kept
//! up to date from each change (a Node, a Namespace, a Pod that holds room) and from the loop's
//! own bindings, as kube-scheduler's cache, instead of being rebuilt (decoding every bound Pod)
//! whenever something changes.

use crate::framework::{Cluster, Counted, NamespaceLabels, NodeInfo};
use crate::pod_index::PodIndex;
use gitplane_api::object::from_value;
use gitplane_store::informer::Cache;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use serde_json::Value;
use std::{collections::HashMap, sync::Arc};

pub type PodId = (String, String);

pub fn is_terminal(pod: &Value) -> bool {
    matches!(pod["status"]["phase"].as_str(), Some("Succeeded" | "Failed"))
}

pub fn node_name(pod: &Value) -> Option<&str> {
    pod["spec"]["nodeName"].as_str().filter(|n| !n.is_empty())
}

/// Holds room on its node: bound and not finished (kube-scheduler's informer lists Pods with
/// `status.phase!=Succeeded,status.phase!=Failed`).
pub fn holds_room(pod: &Value) -> bool {
    node_name(pod).is_some() && !is_terminal(pod)
}

fn id(pod: &Pod) -> PodId {
    (pod.metadata.namespace.clone().unwrap_or_default(), pod.metadata.name.clone().unwrap_or_default())
}

#[derive(Default)]
pub struct Snapshot {
    /// Sorted by name.
    pub nodes: Vec<NodeInfo>,
    pub namespaces: NamespaceLabels,
    /// The nodes' Pods, indexed for the plugins that look at all of them.
    pub pods: PodIndex,
    /// Each Pod counted on a node, as it was counted: what to take back when it changes or goes
    /// (not the Pod: the informer holds that).
    counted: HashMap<PodId, (String, Counted)>,
}

impl Snapshot {
    /// From the cache, with the Pods bound but not yet seen there (`assumed`).
    pub fn build<'a>(cache: &Cache, assumed: impl Iterator<Item = (&'a PodId, &'a (String, Arc<Pod>))>) -> Snapshot {
        let namespaces = cache
            .list_typed::<Namespace>(None)
            .into_iter()
            .map(|n| (n.metadata.name.unwrap_or_default(), n.metadata.labels.unwrap_or_default()))
            .collect();
        let mut nodes: Vec<NodeInfo> = cache.list_typed::<Node>(None).into_iter().map(NodeInfo::new).collect();
        nodes.sort_by(|a, b| a.name().cmp(b.name()));
        let mut snapshot = Snapshot { nodes, namespaces, pods: PodIndex::default(), counted: HashMap::new() };
        let assumed: HashMap<&PodId, &(String, Arc<Pod>)> = assumed.collect();
        // Only Pods that hold room on a known node count: the others are not decoded at all.
        let known = |p: &Value| holds_room(p) && node_name(p).is_some_and(|n| snapshot.position(n).is_ok());
        for pod in cache.list_typed_where::<Pod>(None, known) {
            let pod_id = id(&pod);
            if assumed.contains_key(&pod_id) {
                continue;
            }
            let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
            snapshot.count(pod_id, node, pod);
        }
        for (pod_id, (node, pod)) in assumed {
            snapshot.count(pod_id.clone(), node.clone(), pod.clone());
        }
        snapshot
    }

    /// What a scheduling cycle sees.
    pub fn cluster(&self) -> Cluster<'_> {
        Cluster { nodes: &self.nodes, namespaces: &self.namespaces, pods: &self.pods }
    }

    fn position(&self, node: &str) -> Result<usize, usize> {
        self.nodes.binary_search_by(|n| n.name().cmp(node))
    }

    /// Counts `pod` on `node` (nothing if the node is unknown).
    pub fn count(&mut self, pod_id: PodId, node: String, pod: impl Into<Arc<Pod>>) {
        self.uncount(&pod_id);
        let pod = pod.into();
        if let Ok(at) = self.position(&node) {
            let counted = self.nodes[at].add_pod(&pod);
            let info = &self.nodes[at];
            if let Some(pod) = info.pods.last() {
                self.pods.add(pod, &node, info.labels());
            }
            self.counted.insert(pod_id, (node, counted));
        }
    }

    /// Takes back what [`Snapshot::count`] counted for the Pod.
    pub fn uncount(&mut self, pod_id: &PodId) {
        if let Some((node, counted)) = self.counted.remove(pod_id)
            && let Ok(at) = self.position(&node)
            && let Some(info) = self.nodes[at].remove_pod(&counted)
        {
            self.pods.remove(&info, &node, self.nodes[at].labels());
        }
    }

    /// A Pod changed or went (`None`): counted again where it holds room now. `assumed` is the
    /// node this loop bound it to while that binding is not in the cache yet: the Pod stays
    /// counted there until the cache shows it bound elsewhere, finished or deleted.
    pub fn pod_changed(&mut self, pod_id: &PodId, pod: Option<&Value>, assumed: Option<&str>) {
        let now = pod.filter(|p| holds_room(p)).and_then(node_name);
        let unbound = pod.is_some_and(|p| node_name(p).is_none() && !is_terminal(p));
        if assumed.is_some() && (unbound || now == assumed) {
            return;
        }
        match (now, pod) {
            (Some(node), Some(pod)) => match from_value::<Pod>(pod.clone()) {
                Ok(decoded) => self.count(pod_id.clone(), node.to_owned(), decoded),
                Err(_) => self.uncount(pod_id),
            },
            _ => self.uncount(pod_id),
        }
    }

    /// A Node was added, changed or deleted (`None`). A node new to the snapshot counts the
    /// Pods of `cache` already bound to it.
    pub fn node_changed(&mut self, name: &str, node: Option<&Value>, cache: &Cache) {
        match (self.position(name), node.map(|n| from_value::<Node>(n.clone()))) {
            (Ok(at), None | Some(Err(_))) => {
                let gone = self.nodes.remove(at);
                for pod in &gone.pods {
                    self.pods.remove(pod, name, gone.labels());
                }
                self.counted.retain(|_, (node, _)| node != name);
            }
            (Ok(at), Some(Ok(node))) => {
                // Its Pods' domains are its labels' values: counted again under the new ones.
                let relabelled = node.metadata.labels.as_ref() != self.nodes[at].labels();
                let info = &mut self.nodes[at];
                if relabelled {
                    info.pods.iter().for_each(|pod| self.pods.remove(pod, name, info.node.metadata.labels.as_ref()));
                }
                info.set_node(node);
                if relabelled {
                    info.pods.iter().for_each(|pod| self.pods.add(pod, name, info.node.metadata.labels.as_ref()));
                }
            }
            (Err(at), Some(Ok(node))) => {
                self.nodes.insert(at, NodeInfo::new(node));
                let on_it = |p: &Value| holds_room(p) && node_name(p) == Some(name);
                for pod in cache.list_typed_where::<Pod>(None, on_it) {
                    self.count(id(&pod), name.to_owned(), pod);
                }
            }
            (Err(_), None | Some(Err(_))) => {}
        }
    }

    /// A Namespace was added, changed or deleted (`None`): what `namespaceSelector`s see.
    pub fn namespace_changed(&mut self, name: &str, namespace: Option<&Value>) {
        match namespace.and_then(|n| from_value::<Namespace>(n.clone()).ok()) {
            Some(n) => self.namespaces.insert(name.to_owned(), n.metadata.labels.unwrap_or_default()),
            None => self.namespaces.remove(name),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(name: &str, zone: &str) -> Value {
        json!({"metadata": {"name": name, "labels": {"zone": zone}},
            "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}}})
    }

    fn pod(name: &str, node: Option<&str>, phase: &str) -> Value {
        json!({"metadata": {"name": name, "namespace": "default", "labels": {"app": "web"}},
            "spec": {"nodeName": node, "containers": [{"name": "c",
                "ports": [{"containerPort": 80, "hostPort": 8080}],
                "resources": {"requests": {"cpu": "100m"}}}]},
            "status": {"phase": phase}})
    }

    fn snapshot() -> Snapshot {
        let mut snapshot = Snapshot::default();
        for (name, zone) in [("n1", "a"), ("n2", "b")] {
            snapshot.node_changed(name, Some(&node(name, zone)), &Cache::default());
        }
        snapshot
    }

    /// (node, CPU requested in millicores, Pods, host ports) of each node.
    fn counts(snapshot: &Snapshot) -> Vec<(String, i128, usize, usize)> {
        let nodes = snapshot.nodes.iter();
        nodes.map(|n| (n.name().to_owned(), n.requested.cpu_milli, n.pods.len(), n.host_ports.len())).collect()
    }

    fn expected(n1: (i128, usize), n2: (i128, usize)) -> Vec<(String, i128, usize, usize)> {
        vec![("n1".into(), n1.0, n1.1, n1.1), ("n2".into(), n2.0, n2.1, n2.1)]
    }

    /// A Pod's new state (None: deleted) and the node this loop assumed it on meanwhile.
    type Change = (Option<Value>, Option<&'static str>);

    #[test]
    fn pods_are_counted_where_they_hold_room_now() {
        let id: PodId = ("default".into(), "p".into());
        // Each case: the Pod's events in order (None: deleted), each with the node this loop
        // assumed it on meanwhile, and what the nodes then count.
        let cases: Vec<(&str, Vec<Change>, _)> = vec![
            ("bound elsewhere", vec![(Some(pod("p", Some("n1"), "Pending")), None)], expected((100, 1), (0, 0))),
            (
                "moved between nodes by a re-creation",
                vec![(Some(pod("p", Some("n1"), "Running")), None), (Some(pod("p", Some("n2"), "Running")), None)],
                expected((0, 0), (100, 1)),
            ),
            (
                "status changes count once",
                vec![(Some(pod("p", Some("n1"), "Pending")), None), (Some(pod("p", Some("n1"), "Running")), None)],
                expected((100, 1), (0, 0)),
            ),
            (
                "finished frees its room",
                vec![(Some(pod("p", Some("n1"), "Running")), None), (Some(pod("p", Some("n1"), "Succeeded")), None)],
                expected((0, 0), (0, 0)),
            ),
            (
                "deleted frees its room",
                vec![(Some(pod("p", Some("n2"), "Running")), None), (None, None)],
                expected((0, 0), (0, 0)),
            ),
            (
                "bound to an unknown node counts nowhere",
                vec![(Some(pod("p", Some("n9"), "Running")), None)],
                expected((0, 0), (0, 0)),
            ),
            (
                "assumed stays counted while the binding is in flight",
                vec![(Some(pod("p", None, "Pending")), Some("n1"))],
                expected((100, 1), (0, 0)),
            ),
            (
                "assumed and shown bound where assumed",
                vec![(Some(pod("p", Some("n1"), "Pending")), Some("n1"))],
                expected((100, 1), (0, 0)),
            ),
            (
                "assumed but bound elsewhere by another writer",
                vec![(Some(pod("p", Some("n2"), "Pending")), Some("n1"))],
                expected((0, 0), (100, 1)),
            ),
            ("assumed but deleted", vec![(None, Some("n1"))], expected((0, 0), (0, 0))),
        ];
        for (name, events, want) in cases {
            let mut snapshot = snapshot();
            if let Some((_, Some(assumed))) = events.first() {
                let assumed_pod = from_value::<Pod>(pod("p", Some(assumed), "Pending")).unwrap();
                snapshot.count(id.clone(), assumed.to_string(), assumed_pod);
            }
            for (event, assumed) in &events {
                snapshot.pod_changed(&id, event.as_ref(), *assumed);
            }
            assert_eq!(counts(&snapshot), want, "{name}");
        }
    }

    #[test]
    fn nodes_keep_their_pods_when_they_change() {
        let mut snapshot = snapshot();
        let id: PodId = ("default".into(), "p".into());
        snapshot.pod_changed(&id, Some(&pod("p", Some("n1"), "Running")), None);
        snapshot.node_changed("n1", Some(&node("n1", "c")), &Cache::default());
        assert_eq!(snapshot.nodes[0].label("zone"), Some("c"));
        assert_eq!(counts(&snapshot), expected((100, 1), (0, 0)));
        snapshot.node_changed("n0", Some(&node("n0", "a")), &Cache::default());
        let names: Vec<&str> = snapshot.nodes.iter().map(NodeInfo::name).collect();
        assert_eq!(names, ["n0", "n1", "n2"]);
        snapshot.node_changed("n1", None, &Cache::default());
        snapshot.pod_changed(&id, None, None);
        let names: Vec<&str> = snapshot.nodes.iter().map(NodeInfo::name).collect();
        assert_eq!(names, ["n0", "n2"]);
        snapshot.namespace_changed("shop", Some(&json!({"metadata": {"name": "shop", "labels": {"team": "a"}}})));
        assert_eq!(snapshot.namespaces["shop"]["team"], "a");
        snapshot.namespace_changed("shop", None);
        assert!(snapshot.namespaces.is_empty());
    }
}
