//! A push verdict's plan, handed to the sync that follows the ref update: the verdict has
//! already loaded, validated and planned the pushed commit against this replica's cache, so the
//! sync commits that plan instead of computing it again.
//!
//! A plan is kept per Application with the commit it is of, the Application's spec and the
//! cache's count of applied changes ([`gitplane_store::informer::Cache::changes`]) it was
//! planned at, read before and after planning (a plan that saw the cache change is not kept).
//! The sync uses it only for the same commit and spec while the cache still reads the same
//! count: then a fresh plan would read exactly what the verdict's read, and be the same plan.
//! Otherwise (the store moved in between, or nothing was kept) the sync plans itself.
//!
//! Only a replica that leads runs syncs; a plan nobody takes is dropped after [`KEEP`], so a
//! replica that only judges pushes holds at most one recent plan per Application.

use super::apply;
use gitplane_api::ApplicationSpec;
use gitplane_source::Manifest;
use gitplane_store::ObjectKey;
use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

/// How long a plan waits for its sync.
pub const KEEP: Duration = Duration::from_secs(30);

/// A verdict's plan of one Application at one commit.
pub struct Planned {
    pub commit: String,
    pub spec: ApplicationSpec,
    /// The cache's count of applied changes the plan read.
    pub changes: u64,
    pub manifests: Vec<Arc<Manifest>>,
    pub plan: apply::Plan,
}

/// How the syncs used the verdicts' plans.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PlanStats {
    /// Plans the verdicts kept.
    pub kept: u64,
    /// Plans a sync committed instead of planning.
    pub reused: u64,
    /// Plans of the commit a sync was about to apply, not used because the cache had moved
    /// (or the spec changed): the sync planned again.
    pub replanned: u64,
}

/// The verdicts' plans waiting for their syncs; one per replica, shared by its verdicts and
/// its source controller.
#[derive(Default)]
pub struct Plans {
    waiting: Mutex<HashMap<ObjectKey, (Instant, Planned)>>,
    stats: Mutex<PlanStats>,
}

impl Plans {
    /// Keeps `planned` for the sync of the Application `key` (replacing an older one).
    pub fn keep(&self, key: ObjectKey, planned: Planned) {
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        waiting.retain(|_, (at, _)| at.elapsed() < KEEP);
        waiting.insert(key, (Instant::now(), planned));
        self.stats.lock().unwrap_or_else(|e| e.into_inner()).kept += 1;
    }

    /// The kept plan of `key` at `commit` with `spec`, if one is there; taken either way. Its
    /// manifests are the commit's load with that spec.
    pub fn take(&self, key: &ObjectKey, commit: &str, spec: &ApplicationSpec) -> Option<Planned> {
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        waiting.retain(|_, (at, _)| at.elapsed() < KEEP);
        let (_, planned) = waiting.remove(key)?;
        if planned.commit != commit {
            return None;
        }
        if planned.spec != *spec {
            self.stats.lock().unwrap_or_else(|e| e.into_inner()).replanned += 1;
            return None;
        }
        Some(planned)
    }

    /// `plan`, made at the cache's count `planned_at`, when the cache still reads `now`;
    /// counts whether it did.
    pub fn reuse(&self, plan: apply::Plan, planned_at: u64, now: u64) -> Option<apply::Plan> {
        let mut stats = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        if planned_at == now {
            stats.reused += 1;
            Some(plan)
        } else {
            stats.replanned += 1;
            None
        }
    }

    pub fn stats(&self) -> PlanStats {
        *self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(path: &str) -> ApplicationSpec {
        serde_json::from_value(serde_json::json!({"repo": "r", "path": path})).unwrap()
    }

    fn planned(commit: &str, changes: u64) -> Planned {
        Planned { commit: commit.into(), spec: spec(""), changes, manifests: Vec::new(), plan: apply::Plan::default() }
    }

    #[test]
    fn a_plan_is_used_only_for_its_commit_spec_and_cache() {
        let key = ObjectKey::of::<gitplane_api::Application>("gitplane-system", "a");
        // (kept commit, asked commit, spec, cache changes at the sync, reused, replanned)
        let cases = [
            ("c1", "c1", spec(""), 7, true, false),
            ("c1", "c1", spec(""), 8, false, true),
            ("c1", "c1", spec("elsewhere"), 7, false, true),
            ("c1", "c2", spec(""), 7, false, false),
        ];
        for (kept, asked, spec, changes, reused, replanned) in cases {
            let plans = Plans::default();
            plans.keep(key.clone(), planned(kept, 7));
            let used = plans.take(&key, asked, &spec).and_then(|p| plans.reuse(p.plan, p.changes, changes));
            assert_eq!(used.is_some(), reused, "{kept} {asked} {changes}");
            let stats = plans.stats();
            assert_eq!((stats.kept, stats.reused, stats.replanned), (1, u64::from(reused), u64::from(replanned)));
            assert!(plans.take(&key, kept, &spec).is_none(), "taken either way");
        }
    }
}
