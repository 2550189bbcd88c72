//! Argo CD's resource hooks and sync waves, read from an object's annotations as Argo CD reads
//! them (gitops-engine's `hook` and `syncwaves` packages), Helm's hook annotations mapped the way
//! Argo CD maps them. Pure: the source validates with it, the sync orders with it.

use serde_json::Value;

pub const SYNC_WAVE: &str = "argocd.argoproj.io/sync-wave";
pub const HOOK: &str = "argocd.argoproj.io/hook";
pub const HOOK_DELETE_POLICY: &str = "argocd.argoproj.io/hook-delete-policy";
pub const HELM_HOOK: &str = "helm.sh/hook";
pub const HELM_HOOK_WEIGHT: &str = "helm.sh/hook-weight";
pub const HELM_HOOK_DELETE_POLICY: &str = "helm.sh/hook-delete-policy";

/// The phases of a sync, in the order they run; `SyncFail` only when the sync fails.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Phase {
    PreSync,
    Sync,
    PostSync,
    SyncFail,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::PreSync => "PreSync",
            Phase::Sync => "Sync",
            Phase::PostSync => "PostSync",
            Phase::SyncFail => "SyncFail",
        }
    }
}

/// When a hook object is deleted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeletePolicy {
    /// Once it succeeded.
    HookSucceeded,
    /// Once it failed.
    HookFailed,
    /// Before the next sync creates it again (the default).
    BeforeHookCreation,
}

/// What the annotations make of an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    /// Part of the desired state, applied in its wave of the Sync phase.
    Resource,
    /// A hook: created at these phases (none: a Helm hook Argo CD does not run), never part of
    /// the desired state.
    Hook(Vec<Phase>),
    /// `hook: Skip`: not applied at all.
    Skip,
}

fn annotation<'a>(object: &'a Value, name: &str) -> Option<&'a str> {
    object["metadata"]["annotations"][name].as_str()
}

/// The items of a comma-separated annotation, trimmed.
fn items(text: &str) -> impl Iterator<Item = &str> {
    text.split(',').map(str::trim).filter(|s| !s.is_empty())
}

/// An Argo CD hook type; `Err` names what is wrong with it.
fn argo_hook(item: &str) -> Result<Option<Phase>, String> {
    match item {
        "PreSync" => Ok(Some(Phase::PreSync)),
        "Sync" => Ok(Some(Phase::Sync)),
        "PostSync" => Ok(Some(Phase::PostSync)),
        "SyncFail" => Ok(Some(Phase::SyncFail)),
        "Skip" => Ok(None),
        "PreDelete" | "PostDelete" => Err(format!(
            "{item} hooks run when an Application is deleted, which gitplane does not do through hooks: remove it"
        )),
        other => Err(format!("{other:?} is not a hook type: use PreSync, Sync, PostSync, SyncFail or Skip")),
    }
}

/// The phase Argo CD runs a Helm hook at; `None` for the ones it ignores (delete, rollback, test).
fn helm_hook(item: &str) -> Option<Phase> {
    match item {
        "pre-install" | "pre-upgrade" => Some(Phase::PreSync),
        "post-install" | "post-upgrade" => Some(Phase::PostSync),
        _ => None,
    }
}

/// The role the annotations give `object` (an Argo CD hook annotation wins over Helm's; Helm's
/// `crd-install` is an ordinary resource, as in Argo CD). Unknown hook types are ignored here:
/// [`problems`] reports them.
pub fn role(object: &Value) -> Role {
    if let Some(hooks) = annotation(object, HOOK) {
        let parsed: Vec<Option<Phase>> = items(hooks).filter_map(|i| argo_hook(i).ok()).collect();
        if parsed.contains(&None) {
            return Role::Skip;
        }
        let mut phases: Vec<Phase> = parsed.into_iter().flatten().collect();
        phases.sort();
        phases.dedup();
        return Role::Hook(phases);
    }
    if let Some(hooks) = annotation(object, HELM_HOOK).filter(|h| items(h).any(|i| i != "crd-install")) {
        let mut phases: Vec<Phase> = items(hooks).filter_map(helm_hook).collect();
        phases.sort();
        phases.dedup();
        return Role::Hook(phases);
    }
    Role::Resource
}

/// Whether the object is a hook (or skipped): not part of the desired state.
pub fn is_hook(object: &Value) -> bool {
    role(object) != Role::Resource
}

/// The object's wave: `sync-wave`, else for a Helm hook `hook-weight`, else 0.
pub fn wave(object: &Value) -> i64 {
    let helm = || annotation(object, HELM_HOOK).and(annotation(object, HELM_HOOK_WEIGHT));
    annotation(object, SYNC_WAVE).or_else(helm).and_then(|w| w.trim().parse().ok()).unwrap_or(0)
}

/// A hook's delete policies (BeforeHookCreation when it names none).
pub fn delete_policies(object: &Value) -> Vec<DeletePolicy> {
    let argo = annotation(object, HOOK_DELETE_POLICY).map(|p| items(p).filter_map(argo_policy).collect::<Vec<_>>());
    let helm = || annotation(object, HELM_HOOK_DELETE_POLICY).map(|p| items(p).filter_map(helm_policy).collect());
    let policies = argo.or_else(helm).unwrap_or_default();
    if policies.is_empty() { vec![DeletePolicy::BeforeHookCreation] } else { policies }
}

fn argo_policy(item: &str) -> Option<DeletePolicy> {
    match item {
        "HookSucceeded" => Some(DeletePolicy::HookSucceeded),
        "HookFailed" => Some(DeletePolicy::HookFailed),
        "BeforeHookCreation" => Some(DeletePolicy::BeforeHookCreation),
        _ => None,
    }
}

fn helm_policy(item: &str) -> Option<DeletePolicy> {
    match item {
        "hook-succeeded" => Some(DeletePolicy::HookSucceeded),
        "hook-failed" => Some(DeletePolicy::HookFailed),
        "before-hook-creation" => Some(DeletePolicy::BeforeHookCreation),
        _ => None,
    }
}

/// What is wrong with the object's hook and wave annotations, by annotation name.
pub fn problems(object: &Value) -> Vec<(&'static str, String)> {
    let mut problems = Vec::new();
    for name in [SYNC_WAVE, HELM_HOOK_WEIGHT] {
        if let Some(w) = annotation(object, name)
            && w.trim().parse::<i64>().is_err()
        {
            problems.push((name, format!("{w:?} is not a wave: write an integer, such as \"-1\" or \"2\"")));
        }
    }
    if let Some(hooks) = annotation(object, HOOK) {
        problems.extend(items(hooks).filter_map(|i| argo_hook(i).err()).map(|e| (HOOK, e)));
    }
    if let Some(policies) = annotation(object, HOOK_DELETE_POLICY) {
        for item in items(policies).filter(|i| argo_policy(i).is_none()) {
            problems.push((
                HOOK_DELETE_POLICY,
                format!("{item:?} is not a delete policy: use HookSucceeded, HookFailed or BeforeHookCreation"),
            ));
        }
    }
    problems
}

/// Argo CD's order of kinds within a wave: namespaces first, then what others refer to
/// (policies, accounts, configuration, storage, CRDs, RBAC), Services, then workloads. Kinds
/// not named come last.
const KIND_ORDER: [&str; 30] = [
    "Namespace",
    "NetworkPolicy",
    "ResourceQuota",
    "LimitRange",
    "PodSecurityPolicy",
    "PodDisruptionBudget",
    "ServiceAccount",
    "Secret",
    "ConfigMap",
    "StorageClass",
    "PersistentVolume",
    "PersistentVolumeClaim",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "Service",
    "DaemonSet",
    "Pod",
    "ReplicationController",
    "ReplicaSet",
    "Deployment",
    "HorizontalPodAutoscaler",
    "StatefulSet",
    "Job",
    "CronJob",
    "IngressClass",
    "Ingress",
    "APIService",
];

/// Where `kind` (`Deployment`, not `Deployment.apps`) comes in a wave.
pub fn kind_order(kind: &str) -> usize {
    KIND_ORDER.iter().position(|k| *k == kind).unwrap_or(KIND_ORDER.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn annotated(annotations: Value) -> Value {
        json!({"metadata": {"annotations": annotations}})
    }

    #[test]
    fn roles_waves_and_policies_as_argo_cd_reads_them() {
        use DeletePolicy::*;
        use Phase::*;
        let cases = [
            (json!({}), Role::Resource, 0, vec![BeforeHookCreation]),
            (json!({SYNC_WAVE: "-2"}), Role::Resource, -2, vec![BeforeHookCreation]),
            (json!({HOOK: "PreSync"}), Role::Hook(vec![PreSync]), 0, vec![BeforeHookCreation]),
            (
                json!({HOOK: "PostSync, PreSync", SYNC_WAVE: "3", HOOK_DELETE_POLICY: "HookSucceeded,HookFailed"}),
                Role::Hook(vec![PreSync, PostSync]),
                3,
                vec![HookSucceeded, HookFailed],
            ),
            (json!({HOOK: "Skip"}), Role::Skip, 0, vec![BeforeHookCreation]),
            (
                json!({HELM_HOOK: "pre-install,pre-upgrade", HELM_HOOK_WEIGHT: "-5", HELM_HOOK_DELETE_POLICY: "hook-succeeded"}),
                Role::Hook(vec![PreSync]),
                -5,
                vec![HookSucceeded],
            ),
            (json!({HELM_HOOK: "post-install"}), Role::Hook(vec![PostSync]), 0, vec![BeforeHookCreation]),
            (json!({HELM_HOOK: "pre-delete"}), Role::Hook(vec![]), 0, vec![BeforeHookCreation]),
            (json!({HELM_HOOK: "crd-install"}), Role::Resource, 0, vec![BeforeHookCreation]),
            // A weight outside a Helm hook is no wave; Argo CD's annotation wins over Helm's.
            (json!({HELM_HOOK_WEIGHT: "4"}), Role::Resource, 0, vec![BeforeHookCreation]),
            (
                json!({HOOK: "SyncFail", HELM_HOOK: "pre-install"}),
                Role::Hook(vec![SyncFail]),
                0,
                vec![BeforeHookCreation],
            ),
        ];
        for (annotations, expected_role, expected_wave, expected_policies) in cases {
            let object = annotated(annotations.clone());
            assert_eq!(role(&object), expected_role, "{annotations}");
            assert_eq!(wave(&object), expected_wave, "{annotations}");
            assert_eq!(delete_policies(&object), expected_policies, "{annotations}");
            assert!(problems(&object).is_empty(), "{annotations}");
        }
    }

    #[test]
    fn wrong_annotations_are_named() {
        let cases = [
            (json!({SYNC_WAVE: "first"}), SYNC_WAVE, "is not a wave"),
            (json!({HOOK: "PreSync,Later"}), HOOK, "is not a hook type"),
            (json!({HOOK: "PreDelete"}), HOOK, "when an Application is deleted"),
            (json!({HOOK: "Sync", HOOK_DELETE_POLICY: "Never"}), HOOK_DELETE_POLICY, "is not a delete policy"),
            (json!({HELM_HOOK: "pre-install", HELM_HOOK_WEIGHT: "1.5"}), HELM_HOOK_WEIGHT, "is not a wave"),
        ];
        for (annotations, name, message) in cases {
            let found = problems(&annotated(annotations.clone()));
            assert_eq!(found.len(), 1, "{annotations}: {found:?}");
            assert_eq!(found[0].0, name);
            assert!(found[0].1.contains(message), "{annotations}: {found:?}");
        }
    }

    #[test]
    fn kinds_order_namespaces_first_and_unknown_last() {
        let mut kinds = ["Deployment", "Widget", "Service", "Namespace", "ConfigMap", "Job"];
        kinds.sort_by_key(|k| kind_order(k));
        assert_eq!(kinds, ["Namespace", "ConfigMap", "Service", "Deployment", "Job", "Widget"]);
    }
}
