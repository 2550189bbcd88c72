//! Reference counting of what holders name: a node's Pods naming ConfigMaps and Secrets
//! ([`super::podconfig`]), a stream's Ingresses naming TLS Secrets ([`super::ingress_secrets`]).
//! Pure: the callers decide what a newly referenced or no longer referenced object means.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::Hash;

/// Each holder's references, and how many holders reference each object.
#[derive(Debug)]
pub(super) struct ReferenceCounts<H, R> {
    by_holder: HashMap<H, BTreeSet<R>>,
    counts: BTreeMap<R, usize>,
}

impl<H, R> Default for ReferenceCounts<H, R> {
    fn default() -> Self {
        ReferenceCounts { by_holder: HashMap::new(), counts: BTreeMap::new() }
    }
}

impl<H: Hash + Eq, R: Ord + Clone> ReferenceCounts<H, R> {
    /// `holder` now references `refs` (empty: it is gone): the objects that became referenced,
    /// and those no holder references any more.
    pub(super) fn set(&mut self, holder: H, refs: BTreeSet<R>) -> (Vec<R>, Vec<R>) {
        let old =
            if refs.is_empty() { self.by_holder.remove(&holder) } else { self.by_holder.insert(holder, refs.clone()) };
        let old = old.unwrap_or_default();
        let mut added = Vec::new();
        for r in refs.difference(&old) {
            let count = self.counts.entry(r.clone()).or_default();
            *count += 1;
            if *count == 1 {
                added.push(r.clone());
            }
        }
        let mut removed = Vec::new();
        for r in old.difference(&refs) {
            if let Some(count) = self.counts.get_mut(r) {
                *count -= 1;
                if *count == 0 {
                    self.counts.remove(r);
                    removed.push(r.clone());
                }
            }
        }
        (added, removed)
    }

    pub(super) fn holds(&self, holder: &H) -> bool {
        self.by_holder.contains_key(holder)
    }

    pub(super) fn is_referenced(&self, r: &R) -> bool {
        self.counts.contains_key(r)
    }

    /// How many objects are referenced.
    pub(super) fn len(&self) -> usize {
        self.counts.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_object_is_referenced_while_any_holder_names_it() {
        let mut refs = ReferenceCounts::default();
        assert_eq!(refs.set("a", BTreeSet::from([1, 2])), (vec![1, 2], vec![]));
        assert_eq!(refs.set("b", BTreeSet::from([2, 3])), (vec![3], vec![]));
        assert_eq!(refs.set("a", BTreeSet::from([1])), (vec![], vec![]), "2 is still b's");
        assert_eq!(refs.set("b", BTreeSet::new()), (vec![], vec![2, 3]));
        assert!(refs.holds(&"a") && !refs.holds(&"b"));
        assert!(refs.is_referenced(&1) && !refs.is_referenced(&2));
        assert_eq!(refs.len(), 1);
    }
}
