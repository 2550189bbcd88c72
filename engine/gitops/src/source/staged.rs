//! A sync in steps ([`hooks::steps`]: hooks, waves): each reconcile of the Application runs
//! the steps whose predecessors are done and returns while one waits (for its objects' health,
//! its hooks' end); the loop reconciles it again soon. How far it got is kept in memory: a new
//! commit, or a new leader, starts the sync over.

use super::{SourceController, SyncError, app_id, app_key, apply, graceful, hooks, now};
use gitplane_api::health;
use gitplane_api::hooks::{DeletePolicy, Phase, delete_policies};
use gitplane_api::object::resource_version;
use gitplane_source::Manifest;
use gitplane_store::{
    ObjectKey, Op,
    informer::{Cache, Informer},
};
use serde_json::Value;
use std::{
    collections::{BTreeSet, HashSet},
    sync::Arc,
};

/// How far a sync in steps is, between reconciles.
pub(super) struct Staging {
    commit: String,
    /// When it started (Unix seconds): generated hook names carry it, as Argo CD's do.
    started: i64,
    /// The step running.
    step: usize,
    /// Whether the running step's wave is applied and its hooks created.
    begun: bool,
    /// The hooks the running step created, with their delete policies.
    hooks: Vec<(ObjectKey, Vec<DeletePolicy>)>,
    /// What the steps applied so far.
    applied: Option<apply::Plan>,
}

/// Where a sync in steps stands after a reconcile.
pub(super) enum Stepped {
    /// A step waits for this.
    Waiting(String),
    /// Every step is done: what they applied.
    Done(apply::Plan),
}

impl SourceController {
    /// Runs the steps of the sync of `commit` as far as they can go now.
    pub(super) async fn sync_in_steps(
        &self,
        app: &gitplane_api::Application,
        commit: &str,
        manifests: &[Arc<Manifest>],
        steps: &hooks::Steps,
        inventory: &mut apply::Inventory,
        informer: &Informer,
    ) -> Result<Stepped, SyncError> {
        let key = app_key(app);
        let kept = self.staging.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
        let mut staging = kept.filter(|s| s.commit == commit).unwrap_or_else(|| Staging {
            commit: commit.to_owned(),
            started: now().as_second(),
            step: 0,
            begun: false,
            hooks: Vec::new(),
            applied: None,
        });
        let result = self.advance(app, &mut staging, manifests, steps, inventory, informer).await;
        // A step that waits, or failed for a reason that may heal, goes on at the next reconcile.
        if matches!(result, Ok(Stepped::Waiting(_)) | Err(SyncError::Store(_) | SyncError::Transient(_))) {
            self.staging.lock().unwrap_or_else(|e| e.into_inner()).insert(key, staging);
        }
        result
    }

    async fn advance(
        &self,
        app: &gitplane_api::Application,
        staging: &mut Staging,
        manifests: &[Arc<Manifest>],
        steps: &hooks::Steps,
        inventory: &mut apply::Inventory,
        informer: &Informer,
    ) -> Result<Stepped, SyncError> {
        loop {
            let Some(step) = steps.steps.get(staging.step) else {
                return Ok(Stepped::Done(staging.applied.take().unwrap_or_default()));
            };
            if !staging.begun {
                // This wave with every earlier one; what left Git is pruned once the last is in.
                let wanted: HashSet<&ObjectKey> =
                    steps.steps[..=staging.step].iter().flat_map(|s| &s.resources).collect();
                let last = steps.steps[staging.step + 1..].iter().all(|s| s.resources.is_empty());
                let keep = |k: &ObjectKey| wanted.contains(k);
                let (plan, ..) =
                    self.apply(app, manifests, None, inventory, informer, &|_, _| None, Some((&keep, last))).await?;
                match &mut staging.applied {
                    Some(applied) => applied.absorb(plan),
                    None => staging.applied = Some(plan),
                }
                staging.hooks = self
                    .create_hooks(app, step.phase, &step.hooks, (&staging.commit, staging.started), informer)
                    .await?;
                staging.begun = true;
            }
            match step_progress(step, &staging.hooks, informer.cache()) {
                hooks::Outcome::Running(why) => {
                    return Ok(Stepped::Waiting(format!(
                        "syncing commit {}: {} wave {}: waiting for {why}",
                        super::short(&staging.commit),
                        step.phase.as_str(),
                        step.wave
                    )));
                }
                hooks::Outcome::Failed(why) => {
                    self.delete_ended(&staging.hooks, &hooks::Outcome::Failed(why.clone()), informer.cache()).await;
                    let failed = self
                        .create_hooks(
                            app,
                            Phase::SyncFail,
                            &steps.on_failure,
                            (&staging.commit, staging.started),
                            informer,
                        )
                        .await;
                    if let Err(e) = failed {
                        tracing::warn!(application = %app_id(app), error = %e, "the SyncFail hooks could not be created");
                    }
                    let applied = match step.phase {
                        Phase::PreSync => "nothing of the commit was applied".to_owned(),
                        phase => format!(
                            "the objects of the waves before stay applied ({} wave {})",
                            phase.as_str(),
                            step.wave
                        ),
                    };
                    return Err(SyncError::Hook(format!("{} {why}: {applied}", step.phase.as_str())));
                }
                hooks::Outcome::Succeeded => {
                    self.delete_ended(&staging.hooks, &hooks::Outcome::Succeeded, informer.cache()).await;
                    staging.step += 1;
                    staging.begun = false;
                    staging.hooks.clear();
                }
            }
        }
    }

    /// Creates the hooks of a phase: one that exists from an earlier sync is deleted first when
    /// its policy is BeforeHookCreation (the default), else it stands (a named hook runs once).
    async fn create_hooks(
        &self,
        app: &gitplane_api::Application,
        phase: Phase,
        manifests: &[Arc<Manifest>],
        (commit, started): (&str, i64),
        informer: &Informer,
    ) -> Result<Vec<(ObjectKey, Vec<DeletePolicy>)>, SyncError> {
        let id = app_id(app);
        let (mut created, mut deletes, mut creates) = (Vec::new(), Vec::new(), Vec::new());
        for m in manifests {
            let name = hooks::hook_name(m, commit, phase, started);
            let (key, object) = hooks::hook_object(m, &name, &id);
            let policies = delete_policies(&m.value);
            match informer.cache().get(&key) {
                Some(current) if hooks::hook_of(&current) != Some(id.as_str()) => {
                    return Err(SyncError::Hook(format!(
                        "{} hook {key} cannot be created: an object of that name exists and is not a hook of this \
                         Application; rename the hook in {}:{}",
                        phase.as_str(),
                        m.file,
                        m.line
                    )));
                }
                Some(current) if policies.contains(&DeletePolicy::BeforeHookCreation) => {
                    deletes.push(Op::Delete { key: key.clone(), revision: resource_version(&current) });
                    creates.push(Op::Create(object));
                }
                Some(_) => {}
                None => creates.push(Op::Create(object)),
            }
            created.push((key, policies));
        }
        for ops in [graceful(&deletes, informer.cache()), creates] {
            if !ops.is_empty() {
                let committed = self.store.txn(ops).await?;
                informer.wait_for(committed.revision).await;
            }
        }
        if !created.is_empty() {
            let names: Vec<String> = created.iter().map(|(k, _)| k.to_string()).collect();
            let message = format!("{} hooks created: {}", phase.as_str(), names.join(", "));
            self.record_event(&app_key(app), informer.cache(), gitplane_api::events::NORMAL, "HooksCreated", &message);
        }
        Ok(created)
    }

    /// Deletes the hooks whose policies say so, now that they ended with `outcome`.
    async fn delete_ended(&self, created: &[(ObjectKey, Vec<DeletePolicy>)], outcome: &hooks::Outcome, cache: &Cache) {
        let ops: Vec<Op> = created
            .iter()
            .filter(|(_, policies)| hooks::deleted_after(policies, outcome))
            .filter_map(|(key, _)| Some(Op::Delete { key: key.clone(), revision: resource_version(&*cache.get(key)?) }))
            .collect();
        if ops.is_empty() {
            return;
        }
        if let Err(e) = self.store.txn(graceful(&ops, cache)).await {
            tracing::warn!(error = %e, "deleting ended hooks failed");
        }
    }
}

/// How far a step is, from the cache.
fn step_progress(step: &hooks::Step, created: &[(ObjectKey, Vec<DeletePolicy>)], cache: &Cache) -> hooks::Outcome {
    let namespaces: BTreeSet<&str> =
        step.resources.iter().filter(|k| k.kind == "Service").map(|k| k.namespace.as_str()).collect();
    let pods: Vec<Arc<Value>> = namespaces.into_iter().flat_map(|ns| cache.list("Pod", Some(ns))).collect();
    let pods = health::Pods::new(&pods);
    let short = |kind: &str| kind.split_once('.').map_or(kind, |(k, _)| k).to_owned();
    let resources = step.resources.iter().map(|k| (k, cache.get(k).map(|o| health::of(&short(&k.kind), &o, &pods))));
    let hooks = created.iter().map(|(k, _)| (k, cache.get(k).map(|o| hooks::outcome(&k.kind, &o))));
    hooks::progress(resources, hooks)
}
