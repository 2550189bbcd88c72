//! The placed Pods as the plugins that look at the whole cluster ask about them, kept up to
//! date as Pods are counted and uncounted: their distinct inter-Pod affinity terms, each with
//! its Pods counted per topology domain, and the Pods grouped by namespace and labels, counted
//! per node. A cycle matches each distinct term and each distinct set of labels once, instead
//! of every placed Pod on every node; Pods of one controller share both. Pure.

use crate::terms::{Term, required_terms, scoring_terms};
use gitplane_api::labels::Labels;
use k8s_openapi::api::core::v1::Pod;
use std::collections::HashMap;

/// A Pod bound to a node, as far as other Pods' placement depends on it: what inter-Pod
/// affinity and topology spreading match, and its own inter-Pod affinity terms.
#[derive(Clone, Debug)]
pub struct PodInfo {
    pub namespace: String,
    pub name: String,
    pub labels: Labels,
    /// Its required anti-affinity terms (which hold for Pods placed after it too).
    pub required_anti_affinity: Vec<Term>,
    /// Its terms that weigh on the score of Pods placed after it: preferred affinity and
    /// anti-affinity, and required affinity with the hard weight.
    pub scoring: Vec<Term>,
}

impl PodInfo {
    pub fn new(pod: &Pod) -> Self {
        let namespace = pod.metadata.namespace.clone().unwrap_or_else(|| "default".into());
        let labels = pod.metadata.labels.clone().unwrap_or_default();
        let affinity = pod.spec.as_ref().and_then(|s| s.affinity.as_ref());
        let (pod_affinity, anti) =
            (affinity.and_then(|a| a.pod_affinity.as_ref()), affinity.and_then(|a| a.pod_anti_affinity.as_ref()));
        let required_anti = anti.and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref());
        PodInfo {
            required_anti_affinity: required_terms(required_anti, &namespace, &labels),
            scoring: scoring_terms(pod_affinity, anti, &namespace, &labels, true),
            name: pod.metadata.name.clone().unwrap_or_default(),
            namespace,
            labels,
        }
    }
}

/// The placed Pods holding one term: how many, and how many on the nodes of each domain (the
/// values of the term's topology key; Pods on nodes without it are in no domain).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TermPods {
    holders: i64,
    pub by_domain: HashMap<String, i64>,
}

/// Pods on each node, by node name.
pub type OnNodes = HashMap<String, i64>;

#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodIndex {
    required_anti_affinity: HashMap<Term, TermPods>,
    scoring: HashMap<Term, TermPods>,
    /// Namespace, then labels.
    groups: HashMap<String, HashMap<Labels, OnNodes>>,
}

impl PodIndex {
    /// Counts a Pod on the node `node` with these labels.
    pub fn add(&mut self, pod: &PodInfo, node: &str, node_labels: Option<&Labels>) {
        self.change(pod, node, node_labels, 1);
    }

    /// Takes back what [`PodIndex::add`] counted, with the node's labels as they were then.
    pub fn remove(&mut self, pod: &PodInfo, node: &str, node_labels: Option<&Labels>) {
        self.change(pod, node, node_labels, -1);
    }

    fn change(&mut self, pod: &PodInfo, node: &str, node_labels: Option<&Labels>, delta: i64) {
        let domain = |key: &str| node_labels.and_then(|l| l.get(key));
        for (terms, index) in
            [(&pod.required_anti_affinity, &mut self.required_anti_affinity), (&pod.scoring, &mut self.scoring)]
        {
            for term in terms {
                let entry = match index.get_mut(term) {
                    Some(entry) => entry,
                    None => index.entry(term.clone()).or_default(),
                };
                entry.holders += delta;
                if let Some(value) = domain(&term.topology_key) {
                    add_count(&mut entry.by_domain, value, delta);
                }
                if entry.holders == 0 {
                    index.remove(term);
                }
            }
        }
        let namespace = match self.groups.get_mut(&pod.namespace) {
            Some(namespace) => namespace,
            None => self.groups.entry(pod.namespace.clone()).or_default(),
        };
        let group = match namespace.get_mut(&pod.labels) {
            Some(group) => group,
            None => namespace.entry(pod.labels.clone()).or_default(),
        };
        add_count(group, node, delta);
        if group.is_empty() {
            namespace.remove(&pod.labels);
        }
        if namespace.is_empty() {
            self.groups.remove(&pod.namespace);
        }
    }

    /// The distinct required anti-affinity terms of the placed Pods.
    pub fn required_anti_affinity(&self) -> impl Iterator<Item = (&Term, &TermPods)> {
        self.required_anti_affinity.iter()
    }

    /// The distinct terms of the placed Pods that weigh on scores (see [`PodInfo::scoring`]).
    pub fn scoring(&self) -> impl Iterator<Item = (&Term, &TermPods)> {
        self.scoring.iter()
    }

    /// The placed Pods by namespace and labels: (namespace, labels, Pods per node).
    pub fn groups(&self) -> impl Iterator<Item = (&str, &Labels, &OnNodes)> {
        let namespaces = self.groups.iter();
        namespaces
            .flat_map(|(namespace, groups)| groups.iter().map(move |(labels, on)| (namespace.as_str(), labels, on)))
    }

    /// The placed Pods of one namespace by labels.
    pub fn groups_in(&self, namespace: &str) -> impl Iterator<Item = (&Labels, &OnNodes)> {
        self.groups.get(namespace).into_iter().flatten()
    }
}

/// Adds `delta` to `key`'s count, leaving out counts of 0 (so that equal contents compare equal).
fn add_count(counts: &mut HashMap<String, i64>, key: &str, delta: i64) {
    let count = match counts.get_mut(key) {
        Some(count) => count,
        None => counts.entry(key.to_owned()).or_default(),
    };
    *count += delta;
    if *count == 0 {
        counts.remove(key);
    }
}
