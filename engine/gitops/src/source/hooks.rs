//! A sync in phases and waves, as Argo CD runs one, decided purely: which objects and hooks
//! each step applies, in what order, what a hook is named and whether it ended, and how far a
//! step is. The source controller runs the steps ([`super::SourceController`]).
//!
//! Steps run by phase (PreSync, Sync, PostSync), then wave (lowest first), each once the one
//! before is done: its objects healthy, its hooks ended well. The objects of the desired state
//! are applied in the Sync phase, in their waves, with that phase's hooks. SyncFail hooks are
//! created when a step fails. A commit without hooks and with every object in wave 0 has no
//! steps: it is applied in one transaction.

use gitplane_api::health::{self, Health};
use gitplane_api::hooks::{self, DeletePolicy, Phase, Role};
use gitplane_source::Manifest;
use gitplane_store::ObjectKey;
use serde_json::Value;
use std::{collections::BTreeMap, sync::Arc};

/// On a hook object: the Application (`namespace/name`) whose sync created it. Hooks carry no
/// inventory annotation, so they are never pruned nor compared with Git.
pub const HOOK_OF_ANNOTATION: &str = "gitplane.io/hook-of";

/// One step of a sync.
#[derive(Debug)]
pub struct Step {
    pub phase: Phase,
    pub wave: i64,
    /// The objects of the desired state this step applies, in Argo CD's kind order.
    pub resources: Vec<ObjectKey>,
    /// The hooks it creates, in the same order.
    pub hooks: Vec<Arc<Manifest>>,
}

/// The steps of a commit's sync, and the hooks created if it fails.
#[derive(Debug)]
pub struct Steps {
    pub steps: Vec<Step>,
    pub on_failure: Vec<Arc<Manifest>>,
}

/// `Deployment` of `Deployment.apps`.
fn short_kind(kind: &str) -> &str {
    kind.split_once('.').map_or(kind, |(k, _)| k)
}

fn order(key: &ObjectKey) -> (usize, &ObjectKey) {
    (hooks::kind_order(short_kind(&key.kind)), key)
}

/// The steps of a sync of `manifests`, or `None` when it needs none (no hook, every object in
/// wave 0).
pub fn steps(manifests: &[Arc<Manifest>]) -> Option<Steps> {
    let mut steps: BTreeMap<(Phase, i64), Step> = BTreeMap::new();
    let mut on_failure = Vec::new();
    let mut staged = false;
    fn step(steps: &mut BTreeMap<(Phase, i64), Step>, phase: Phase, wave: i64) -> &mut Step {
        steps.entry((phase, wave)).or_insert_with(|| Step { phase, wave, resources: vec![], hooks: vec![] })
    }
    for m in manifests {
        let wave = hooks::wave(&m.value);
        match hooks::role(&m.value) {
            Role::Resource => {
                staged |= wave != 0;
                step(&mut steps, Phase::Sync, wave).resources.push(m.key.clone());
            }
            Role::Skip => {}
            Role::Hook(phases) => {
                staged = true;
                for phase in phases {
                    match phase {
                        Phase::SyncFail => on_failure.push(m.clone()),
                        phase => step(&mut steps, phase, wave).hooks.push(m.clone()),
                    }
                }
            }
        }
    }
    if !staged {
        return None;
    }
    let mut steps: Vec<Step> = steps.into_values().collect();
    for step in &mut steps {
        step.resources.sort_by(|a, b| order(a).cmp(&order(b)));
        step.hooks.sort_by(|a, b| order(&a.key).cmp(&order(&b.key)));
    }
    on_failure.sort_by(|a, b| order(&a.key).cmp(&order(&b.key)));
    Some(Steps { steps, on_failure })
}

/// The steps as lines for the pusher (a push's verdict): what each runs, in order.
pub fn describe(steps: &Steps) -> Vec<String> {
    let hook = |m: &Arc<Manifest>| {
        let generated = if m.value["metadata"]["name"].is_string() { "" } else { "…" };
        format!("hook {}{generated}", m.key)
    };
    let mut lines = vec!["in steps, each once the one before is healthy (Argo CD hooks and sync waves):".to_owned()];
    for step in &steps.steps {
        let mut parts: Vec<String> = step.hooks.iter().map(hook).collect();
        match step.resources.len() {
            0 => {}
            1 => parts.insert(0, step.resources[0].to_string()),
            n => parts.insert(0, format!("{n} objects")),
        }
        lines.push(format!("  {} wave {}: {}", step.phase.as_str(), step.wave, parts.join(", ")));
    }
    if !steps.on_failure.is_empty() {
        let hooks: Vec<String> = steps.on_failure.iter().map(hook).collect();
        lines.push(format!("  if the sync fails, SyncFail: {}", hooks.join(", ")));
    }
    lines
}

/// The name a hook gets in the sync of `commit` started at `started` (Unix seconds): its own,
/// or for one named by `generateName`, the name Argo CD gives it: the prefix, then the commit's
/// first seven characters, the phase and the start, so each sync creates its own.
pub fn hook_name(m: &Manifest, commit: &str, phase: Phase, started: i64) -> String {
    match m.value["metadata"]["name"].as_str() {
        Some(name) => name.to_owned(),
        None => {
            let commit = commit.get(..7).unwrap_or(commit);
            format!("{}{commit}-{}-{started}", m.key.name, phase.as_str().to_lowercase()).to_lowercase()
        }
    }
}

/// The hook object as the sync of Application `app` creates it, named `name`.
pub fn hook_object(m: &Manifest, name: &str, app: &str) -> (ObjectKey, Value) {
    let mut object = m.value.clone();
    object["metadata"]["name"] = Value::String(name.to_owned());
    object["metadata"]["annotations"][HOOK_OF_ANNOTATION] = Value::String(app.to_owned());
    (ObjectKey::new(m.key.kind.clone(), m.key.namespace.clone(), name), object)
}

/// The Application whose sync created a hook object, if it is one.
pub fn hook_of(object: &Value) -> Option<&str> {
    object["metadata"]["annotations"][HOOK_OF_ANNOTATION].as_str()
}

/// Where a hook is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Running(String),
    Succeeded,
    Failed(String),
}

/// How a hook of `kind` (`Job.batch`) has done, as Argo CD judges hooks: a Job by its
/// conditions, a Pod by its phase, anything else once it exists.
pub fn outcome(kind: &str, object: &Value) -> Outcome {
    let (health, message) = match kind {
        "Job.batch" => health::job(object),
        "Pod" => match object["status"]["phase"].as_str() {
            Some("Succeeded") => (Health::Healthy, String::new()),
            Some("Failed") => health::pod(object),
            other => (Health::Progressing, format!("pod is {}", other.unwrap_or("Pending"))),
        },
        _ => (Health::Healthy, String::new()),
    };
    match health {
        Health::Healthy => Outcome::Succeeded,
        Health::Degraded => Outcome::Failed(message),
        Health::Progressing | Health::Missing => Outcome::Running(message),
    }
}

/// Whether a hook that ended so is deleted now, by its delete policies.
pub fn deleted_after(policies: &[DeletePolicy], outcome: &Outcome) -> bool {
    match outcome {
        Outcome::Succeeded => policies.contains(&DeletePolicy::HookSucceeded),
        Outcome::Failed(_) => policies.contains(&DeletePolicy::HookFailed),
        Outcome::Running(_) => false,
    }
}

/// How far a step is, from its objects' health and its hooks' outcomes (`None`: not in the
/// cluster). A failed hook fails the step; an object not yet healthy keeps it running, as in
/// Argo CD (a degraded one too: it may recover, and the next commit starts a new sync).
pub fn progress<'a>(
    resources: impl IntoIterator<Item = (&'a ObjectKey, Option<(Health, String)>)>,
    hooks: impl IntoIterator<Item = (&'a ObjectKey, Option<Outcome>)>,
) -> Outcome {
    let mut running = None;
    for (key, outcome) in hooks {
        match outcome {
            None => return Outcome::Failed(format!("hook {key} was deleted before it ended")),
            Some(Outcome::Failed(why)) => return Outcome::Failed(format!("hook {key} failed: {why}")),
            Some(Outcome::Running(why)) => {
                running.get_or_insert_with(|| format!("hook {key}: {}", if why.is_empty() { "running" } else { &why }));
            }
            Some(Outcome::Succeeded) => {}
        }
    }
    for (key, health) in resources {
        let why = match health {
            None => "not created yet".to_owned(),
            Some((Health::Healthy, _)) => continue,
            Some((health, why)) if why.is_empty() => health.as_str().to_owned(),
            Some((health, why)) => format!("{}: {why}", health.as_str()),
        };
        running.get_or_insert_with(|| format!("{key}: {why}"));
    }
    running.map_or(Outcome::Succeeded, Outcome::Running)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn manifest(kind: &str, name: &str, annotations: Value) -> Arc<Manifest> {
        let (api_version, group_kind) = match kind {
            "Job" => ("batch/v1", "Job.batch".to_owned()),
            "ReplicaSet" => ("apps/v1", "ReplicaSet.apps".to_owned()),
            other => ("v1", other.to_owned()),
        };
        let value = json!({"apiVersion": api_version, "kind": kind,
                           "metadata": {"name": name, "namespace": "default", "annotations": annotations}});
        Arc::new(Manifest {
            file: "f.yaml".into(),
            index: 0,
            line: 1,
            key: ObjectKey::new(group_kind, "default", name),
            value,
            warnings: Vec::new(),
        })
    }

    /// Each step as `Phase/wave: objects | hooks`.
    fn shown(steps: &Steps) -> Vec<String> {
        steps
            .steps
            .iter()
            .map(|s| {
                let names = |keys: Vec<&ObjectKey>| keys.iter().map(|k| k.name.as_str()).collect::<Vec<_>>().join(" ");
                let hooks = names(s.hooks.iter().map(|m| &m.key).collect());
                format!("{}/{}: {} | {hooks}", s.phase.as_str(), s.wave, names(s.resources.iter().collect()))
            })
            .collect()
    }

    #[test]
    fn steps_run_by_phase_then_wave_then_kind() {
        let wave = |w: &str| json!({hooks::SYNC_WAVE: w});
        let hook = |h: &str, w: &str| json!({hooks::HOOK: h, hooks::SYNC_WAVE: w});
        type Case<'a> = (&'a str, Vec<Arc<Manifest>>, Option<Vec<&'a str>>, usize);
        let cases: Vec<Case> = vec![
            (
                "plain objects need no steps",
                vec![manifest("ConfigMap", "c", json!({})), manifest("Service", "s", json!({}))],
                None,
                0,
            ),
            (
                "a skipped object alone needs none either",
                vec![manifest("ConfigMap", "c", json!({hooks::HOOK: "Skip"}))],
                None,
                0,
            ),
            (
                // Argo CD's own example, tests/corpus/plain/argocd-sync-waves.
                "the sync-waves example",
                vec![
                    manifest("Job", "upgrade-sql-schema", json!({hooks::HOOK: "PreSync"})),
                    manifest("ReplicaSet", "backend", json!({})),
                    manifest("Service", "backend", json!({})),
                    manifest("Job", "maint-page-up", hook("Sync", "1")),
                    manifest("ReplicaSet", "frontend", wave("2")),
                    manifest("Service", "frontend", wave("2")),
                    manifest("Job", "maint-page-down", hook("Sync", "3")),
                ],
                Some(vec![
                    "PreSync/0:  | upgrade-sql-schema",
                    "Sync/0: backend backend | ",
                    "Sync/1:  | maint-page-up",
                    "Sync/2: frontend frontend | ",
                    "Sync/3:  | maint-page-down",
                ]),
                0,
            ),
            (
                "negative waves first, namespaces before what goes in them, PostSync last, SyncFail aside",
                vec![
                    manifest("ConfigMap", "late", wave("5")),
                    manifest("Deployment", "web", wave("-1")),
                    manifest("Namespace", "team", wave("-1")),
                    manifest("Pod", "smoke", hook("PostSync", "0")),
                    manifest("Pod", "alert", json!({hooks::HOOK: "SyncFail"})),
                    manifest("Pod", "twice", json!({hooks::HOOK: "PreSync,PostSync"})),
                ],
                Some(vec![
                    "PreSync/0:  | twice",
                    "Sync/-1: team web | ",
                    "Sync/5: late | ",
                    "PostSync/0:  | smoke twice",
                ]),
                1,
            ),
        ];
        for (case, manifests, expected, failing) in cases {
            let planned = steps(&manifests);
            assert_eq!(
                planned.as_ref().map(shown),
                expected.map(|e| e.iter().map(|s| s.to_string()).collect()),
                "{case}"
            );
            assert_eq!(planned.map_or(0, |s| s.on_failure.len()), failing, "{case}");
        }
    }

    #[test]
    fn a_verdict_describes_the_steps() {
        let mut presync = (*manifest("Job", "migrate-", json!({hooks::HOOK: "PreSync"}))).clone();
        presync.value["metadata"].as_object_mut().unwrap().remove("name");
        let manifests = [
            Arc::new(presync),
            manifest("ConfigMap", "c", json!({})),
            manifest("Service", "s", json!({})),
            manifest("ReplicaSet", "web", json!({hooks::SYNC_WAVE: "1"})),
            manifest("Pod", "alert", json!({hooks::HOOK: "SyncFail"})),
        ];
        assert_eq!(
            describe(&steps(&manifests).unwrap()),
            [
                "in steps, each once the one before is healthy (Argo CD hooks and sync waves):",
                "  PreSync wave 0: hook Job.batch default/migrate-…",
                "  Sync wave 0: 2 objects",
                "  Sync wave 1: ReplicaSet.apps default/web",
                "  if the sync fails, SyncFail: hook Pod default/alert",
            ]
        );
    }

    #[test]
    fn generated_names_are_argo_cds_and_hooks_are_marked() {
        let mut named_by_prefix = (*manifest("Job", "upgrade-sql-schema", json!({hooks::HOOK: "PreSync"}))).clone();
        named_by_prefix.value["metadata"].as_object_mut().unwrap().remove("name");
        named_by_prefix.value["metadata"]["generateName"] = json!("upgrade-sql-schema");
        let commit = "9a1009e5d2c0";
        assert_eq!(
            hook_name(&named_by_prefix, commit, Phase::PreSync, 1765108000),
            "upgrade-sql-schema9a1009e-presync-1765108000"
        );
        let named = manifest("Job", "maint-page-up", json!({hooks::HOOK: "Sync"}));
        assert_eq!(hook_name(&named, commit, Phase::Sync, 1765108000), "maint-page-up");
        let (key, object) = hook_object(&named_by_prefix, "upgrade-sql-schemax", "gitplane-system/app");
        assert_eq!(key, ObjectKey::new("Job.batch", "default", "upgrade-sql-schemax"));
        assert_eq!(hook_of(&object), Some("gitplane-system/app"));
        assert_eq!(object["metadata"]["name"], "upgrade-sql-schemax");
    }

    #[test]
    fn outcomes_and_delete_policies() {
        use DeletePolicy::*;
        let job = |condition: &str| json!({"status": {"conditions": [{"type": condition, "status": "True", "message": "m"}]}});
        let cases = [
            ("Job.batch", job("Complete"), Outcome::Succeeded),
            ("Job.batch", job("Failed"), Outcome::Failed("m".into())),
            ("Job.batch", json!({"spec": {}, "status": {}}), Outcome::Running("0 of 1 completions".into())),
            ("Pod", json!({"status": {"phase": "Succeeded"}}), Outcome::Succeeded),
            ("Pod", json!({"status": {"phase": "Running"}}), Outcome::Running("pod is Running".into())),
            ("Pod", json!({"status": {"phase": "Failed", "message": "oom"}}), Outcome::Failed("oom".into())),
            ("ConfigMap", json!({}), Outcome::Succeeded),
        ];
        for (kind, object, expected) in cases {
            assert_eq!(outcome(kind, &object), expected, "{kind} {object}");
        }
        let deletes = [
            (vec![BeforeHookCreation], Outcome::Succeeded, false),
            (vec![HookSucceeded], Outcome::Succeeded, true),
            (vec![HookSucceeded], Outcome::Failed(String::new()), false),
            (vec![HookFailed], Outcome::Failed(String::new()), true),
            (vec![HookSucceeded, HookFailed], Outcome::Running(String::new()), false),
        ];
        for (policies, outcome, deleted) in deletes {
            assert_eq!(deleted_after(&policies, &outcome), deleted, "{policies:?} {outcome:?}");
        }
    }

    #[test]
    fn a_step_is_done_when_its_objects_are_healthy_and_its_hooks_succeeded() {
        let (rs, job) =
            (ObjectKey::new("ReplicaSet.apps", "default", "web"), ObjectKey::new("Job.batch", "default", "j"));
        let healthy = Some((Health::Healthy, String::new()));
        let progressing = Some((Health::Progressing, "1 of 2 ready".to_owned()));
        let cases = [
            (healthy.clone(), Some(Outcome::Succeeded), Outcome::Succeeded),
            (
                progressing,
                Some(Outcome::Succeeded),
                Outcome::Running("ReplicaSet.apps default/web: Progressing: 1 of 2 ready".into()),
            ),
            (None, Some(Outcome::Succeeded), Outcome::Running("ReplicaSet.apps default/web: not created yet".into())),
            (
                healthy.clone(),
                Some(Outcome::Running(String::new())),
                Outcome::Running("hook Job.batch default/j: running".into()),
            ),
            (
                healthy.clone(),
                Some(Outcome::Failed("BackoffLimitExceeded".into())),
                Outcome::Failed("hook Job.batch default/j failed: BackoffLimitExceeded".into()),
            ),
            (healthy, None, Outcome::Failed("hook Job.batch default/j was deleted before it ended".into())),
        ];
        for (health, hook, expected) in cases {
            assert_eq!(progress([(&rs, health.clone())], [(&job, hook.clone())]), expected, "{health:?} {hook:?}");
        }
    }
}
