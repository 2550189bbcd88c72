//! Inter-Pod affinity terms resolved against the Pod that holds them: their selector with
//! `matchLabelKeys` and `mismatchLabelKeys` merged in, their namespaces, their weight. A placed
//! Pod's are resolved once, when it is added to its node's snapshot.

use gitplane_api::labels::{Labels, matches};
use k8s_openapi::api::core::v1::{PodAffinity, PodAffinityTerm, PodAntiAffinity, WeightedPodAffinityTerm};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use std::hash::{Hash, Hasher};

/// The labels of each namespace, by name (what a term's `namespaceSelector` selects).
pub type NamespaceLabels = std::collections::HashMap<String, Labels>;

/// kube-scheduler's `hardPodAffinityWeight`: what a placed Pod's required affinity to the
/// incoming Pod adds to the score of its domain.
const HARD_POD_AFFINITY_WEIGHT: i64 = 1;

/// A term resolved against the Pod that holds it: its selector with `matchLabelKeys` and
/// `mismatchLabelKeys` merged in, and its namespaces. Equal terms of different Pods are one
/// entry of the snapshot's index ([`crate::pod_index`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Term {
    pub topology_key: String,
    selector: Option<LabelSelector>,
    namespaces: Vec<String>,
    namespace_selector: Option<LabelSelector>,
    pub weight: i64,
}

impl Term {
    pub fn new(term: &PodAffinityTerm, owner_namespace: &str, owner_labels: &Labels, weight: i64) -> Term {
        let mut selector = term.label_selector.clone();
        let keyed = |keys: &Option<Vec<String>>, operator: &str| -> Vec<LabelSelectorRequirement> {
            let keys = keys.iter().flatten();
            keys.filter_map(|k| Some((k, owner_labels.get(k)?)))
                .map(|(key, value)| LabelSelectorRequirement {
                    key: key.clone(),
                    operator: operator.into(),
                    values: Some(vec![value.clone()]),
                })
                .collect()
        };
        let extra: Vec<_> =
            keyed(&term.match_label_keys, "In").into_iter().chain(keyed(&term.mismatch_label_keys, "NotIn")).collect();
        if let Some(selector) = selector.as_mut().filter(|_| !extra.is_empty()) {
            selector.match_expressions.get_or_insert_with(Vec::new).extend(extra);
        }
        let mut namespaces = term.namespaces.clone().unwrap_or_default();
        if namespaces.is_empty() && term.namespace_selector.is_none() {
            namespaces.push(owner_namespace.to_owned());
        }
        Term {
            topology_key: term.topology_key.clone(),
            selector,
            namespaces,
            namespace_selector: term.namespace_selector.clone(),
            weight,
        }
    }

    /// Whether a Pod (its namespace and labels) is one this term selects. A term without a
    /// label selector selects nothing; an empty namespace selector selects every namespace.
    pub fn matches(&self, namespace: &str, labels: &Labels, all: &NamespaceLabels) -> bool {
        let Some(selector) = &self.selector else { return false };
        let in_namespace = self.namespaces.iter().any(|n| n == namespace)
            || self.namespace_selector.as_ref().is_some_and(|s| {
                let empty = Labels::new();
                matches(s, all.get(namespace).unwrap_or(&empty))
            });
        in_namespace && matches(selector, labels)
    }
}

impl Eq for Term {}

impl Hash for Term {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.topology_key.hash(state);
        hash_selector(self.selector.as_ref(), state);
        self.namespaces.hash(state);
        hash_selector(self.namespace_selector.as_ref(), state);
        self.weight.hash(state);
    }
}

/// What `LabelSelector`'s derived equality compares (k8s-openapi derives no `Hash`).
fn hash_selector<H: Hasher>(selector: Option<&LabelSelector>, state: &mut H) {
    let Some(selector) = selector else { return 0u8.hash(state) };
    1u8.hash(state);
    selector.match_labels.hash(state);
    for r in selector.match_expressions.iter().flatten() {
        (&r.key, &r.operator, &r.values).hash(state);
    }
}

pub fn required_terms(terms: Option<&Vec<PodAffinityTerm>>, namespace: &str, labels: &Labels) -> Vec<Term> {
    terms.into_iter().flatten().map(|t| Term::new(t, namespace, labels, HARD_POD_AFFINITY_WEIGHT)).collect()
}

fn preferred_terms(
    terms: Option<&Vec<WeightedPodAffinityTerm>>,
    namespace: &str,
    labels: &Labels,
    sign: i64,
) -> Vec<Term> {
    let weighted = terms.into_iter().flatten();
    weighted.map(|w| Term::new(&w.pod_affinity_term, namespace, labels, sign * i64::from(w.weight))).collect()
}

/// The preferred terms of a Pod's affinity (weighed up) and anti-affinity (down), and, for a
/// placed Pod (`required`), its required affinity with the hard weight.
pub fn scoring_terms(
    affinity: Option<&PodAffinity>,
    anti: Option<&PodAntiAffinity>,
    namespace: &str,
    labels: &Labels,
    required: bool,
) -> Vec<Term> {
    let mut terms = preferred_terms(
        affinity.and_then(|a| a.preferred_during_scheduling_ignored_during_execution.as_ref()),
        namespace,
        labels,
        1,
    );
    terms.extend(preferred_terms(
        anti.and_then(|a| a.preferred_during_scheduling_ignored_during_execution.as_ref()),
        namespace,
        labels,
        -1,
    ));
    if required {
        let hard = affinity.and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref());
        terms.extend(required_terms(hard, namespace, labels));
    }
    terms
}
