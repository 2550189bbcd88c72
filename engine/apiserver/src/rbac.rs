//! Kubernetes' RBAC authorizer for the read API: Roles, ClusterRoles (aggregated ones included),
//! RoleBindings and ClusterRoleBindings decide what a ServiceAccount's token may read, rule by
//! rule as `rbac.RBACAuthorizer` does (verbs, apiGroups, resources with subresources,
//! resourceNames, nonResourceURLs, `*`). The evaluation is pure ([`Snapshot::allows`]); the
//! snapshot is rebuilt from the replica's informer when an RBAC object changes
//! ([`RbacAuthorizer`]), so a request costs a few hash lookups and rule scans.

use gitplane_api::object::kind_of;
use gitplane_store::informer::{Cache, Informer, Notification};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, Subject};
use std::{
    collections::HashMap,
    sync::{
        Arc, RwLock,
        atomic::{AtomicBool, Ordering},
    },
};

/// What a request asks to do, as the authorizer sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Attributes<'a> {
    pub verb: &'a str,
    /// A resource request (`/api`, `/apis` paths naming a resource); else a non-resource URL.
    pub resource_request: bool,
    pub api_group: &'a str,
    pub resource: &'a str,
    pub subresource: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
    pub path: &'a str,
}

/// Where a binding's rules hold: everywhere, or in one namespace.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Scope {
    Cluster,
    Namespace(String),
}

/// What one binding grants: where, the rules, and which binding and role (for the audit).
type Grant = (Scope, Arc<Vec<PolicyRule>>, Arc<str>);

/// Every binding's rules, by the subject they are granted to.
#[derive(Debug, Default)]
pub struct Snapshot {
    /// `user:<name>` or `group:<name>` -> what is granted to it.
    grants: HashMap<String, Vec<Grant>>,
}

fn verb_matches(rule: &PolicyRule, verb: &str) -> bool {
    rule.verbs.iter().any(|v| v == "*" || v == verb)
}

fn group_matches(rule: &PolicyRule, group: &str) -> bool {
    rule.api_groups.iter().flatten().any(|g| g == "*" || g == group)
}

fn resource_matches(rule: &PolicyRule, resource: &str, subresource: &str) -> bool {
    rule.resources.iter().flatten().any(|r| {
        r == "*"
            || (subresource.is_empty() && r == resource)
            || (!subresource.is_empty()
                && (r.strip_prefix(resource).and_then(|s| s.strip_prefix('/')) == Some(subresource)
                    || r.strip_prefix("*/") == Some(subresource)))
    })
}

fn name_matches(rule: &PolicyRule, name: &str) -> bool {
    match rule.resource_names.as_deref() {
        None | Some([]) => true,
        Some(names) => names.iter().any(|n| n == name),
    }
}

fn url_matches(rule: &PolicyRule, path: &str) -> bool {
    rule.non_resource_urls
        .iter()
        .flatten()
        .any(|u| u == "*" || u == path || u.strip_suffix('*').is_some_and(|prefix| path.starts_with(prefix)))
}

/// Whether `rule` allows the request (`rbac.RuleAllows`).
pub fn rule_allows(rule: &PolicyRule, a: &Attributes) -> bool {
    if a.resource_request {
        verb_matches(rule, a.verb)
            && group_matches(rule, a.api_group)
            && resource_matches(rule, a.resource, a.subresource)
            && name_matches(rule, a.name)
    } else {
        verb_matches(rule, a.verb) && url_matches(rule, a.path)
    }
}

/// The subject keys a binding's subject grants to (`namespace`: the binding's, for a
/// ServiceAccount subject that names none).
fn subject_key(subject: &Subject, namespace: &str) -> Option<String> {
    match subject.kind.as_str() {
        "User" => Some(format!("user:{}", subject.name)),
        "Group" => Some(format!("group:{}", subject.name)),
        "ServiceAccount" => {
            let ns = subject.namespace.as_deref().filter(|n| !n.is_empty()).unwrap_or(namespace);
            Some(format!("user:{}", crate::serviceaccount::username(ns, &subject.name)))
        }
        _ => None,
    }
}

/// The rules of every ClusterRole, each aggregated one's being the union of the rules of the
/// ClusterRoles its selectors match (the clusterrole-aggregation controller's result).
pub fn cluster_role_rules(roles: &[ClusterRole]) -> HashMap<String, Arc<Vec<PolicyRule>>> {
    roles
        .iter()
        .map(|role| {
            let name = role.metadata.name.clone().unwrap_or_default();
            let selectors: Vec<_> =
                role.aggregation_rule.iter().flat_map(|a| a.cluster_role_selectors.iter().flatten()).collect();
            if selectors.is_empty() {
                return (name, Arc::new(role.rules.clone().unwrap_or_default()));
            }
            let mut rules: Vec<PolicyRule> = Vec::new();
            let mut sources: Vec<&ClusterRole> = roles
                .iter()
                .filter(|other| other.metadata.name != role.metadata.name)
                .filter(|other| {
                    let labels = other.metadata.labels.clone().unwrap_or_default();
                    selectors.iter().any(|s| gitplane_api::labels::matches(s, &labels))
                })
                .collect();
            sources.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
            for rule in sources.iter().flat_map(|r| r.rules.iter().flatten()) {
                if !rules.contains(rule) {
                    rules.push(rule.clone());
                }
            }
            (name, Arc::new(rules))
        })
        .collect()
}

impl Snapshot {
    pub fn build(
        roles: &[Role],
        cluster_roles: &[ClusterRole],
        bindings: &[RoleBinding],
        cluster_bindings: &[ClusterRoleBinding],
    ) -> Snapshot {
        let cluster = cluster_role_rules(cluster_roles);
        let namespaced: HashMap<(String, String), Arc<Vec<PolicyRule>>> = roles
            .iter()
            .map(|r| {
                let key =
                    (r.metadata.namespace.clone().unwrap_or_default(), r.metadata.name.clone().unwrap_or_default());
                (key, Arc::new(r.rules.clone().unwrap_or_default()))
            })
            .collect();
        let mut snapshot = Snapshot::default();
        let mut grant =
            |subjects: &[Subject], namespace: &str, scope: Scope, rules: Arc<Vec<PolicyRule>>, why: String| {
                let why: Arc<str> = why.into();
                for key in subjects.iter().filter_map(|s| subject_key(s, namespace)) {
                    snapshot.grants.entry(key).or_default().push((scope.clone(), rules.clone(), why.clone()));
                }
            };
        for binding in cluster_bindings {
            if binding.role_ref.kind != "ClusterRole" {
                continue;
            }
            let Some(rules) = cluster.get(&binding.role_ref.name) else { continue };
            let why = format!(
                "ClusterRoleBinding {:?} of ClusterRole {:?}",
                binding.metadata.name.as_deref().unwrap_or_default(),
                binding.role_ref.name
            );
            grant(binding.subjects.as_deref().unwrap_or_default(), "", Scope::Cluster, rules.clone(), why);
        }
        for binding in bindings {
            let namespace = binding.metadata.namespace.clone().unwrap_or_default();
            let rules = match binding.role_ref.kind.as_str() {
                "ClusterRole" => cluster.get(&binding.role_ref.name),
                "Role" => namespaced.get(&(namespace.clone(), binding.role_ref.name.clone())),
                _ => None,
            };
            let Some(rules) = rules else { continue };
            let why = format!(
                "RoleBinding \"{namespace}/{}\" of {} {:?}",
                binding.metadata.name.as_deref().unwrap_or_default(),
                binding.role_ref.kind,
                binding.role_ref.name
            );
            let subjects = binding.subjects.as_deref().unwrap_or_default();
            grant(subjects, &namespace, Scope::Namespace(namespace.clone()), rules.clone(), why);
        }
        snapshot
    }

    /// The binding that allows the request for `user` in `groups`, if any.
    pub fn allows(&self, user: &str, groups: &[String], a: &Attributes) -> Option<Arc<str>> {
        let keys = std::iter::once(format!("user:{user}")).chain(groups.iter().map(|g| format!("group:{g}")));
        for key in keys {
            for (scope, rules, why) in self.grants.get(&key).into_iter().flatten() {
                let in_scope = match scope {
                    Scope::Cluster => true,
                    // A RoleBinding grants resources of its namespace only.
                    Scope::Namespace(ns) => a.resource_request && a.namespace == ns,
                };
                if in_scope && rules.iter().any(|r| rule_allows(r, a)) {
                    return Some(why.clone());
                }
            }
        }
        None
    }
}

/// The RBAC kinds, as the informer names them.
fn rbac_kinds() -> [String; 4] {
    [kind_of::<Role>(), kind_of::<ClusterRole>(), kind_of::<RoleBinding>(), kind_of::<ClusterRoleBinding>()]
}

/// RBAC over the replica's informer: the snapshot is rebuilt on the first request after an RBAC
/// object changed.
pub struct RbacAuthorizer {
    informer: Informer,
    snapshot: RwLock<Arc<Snapshot>>,
    stale: Arc<AtomicBool>,
}

impl RbacAuthorizer {
    pub fn new(informer: Informer) -> RbacAuthorizer {
        let stale = Arc::new(AtomicBool::new(true));
        let mut changes = informer.subscribe();
        let flag = Arc::downgrade(&stale);
        tokio::spawn(async move {
            let kinds = rbac_kinds();
            loop {
                let relevant = match changes.recv().await {
                    Ok(Notification::Changed(event)) => kinds.contains(&event.key.kind),
                    Ok(Notification::Resync) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => true,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                };
                let Some(flag) = flag.upgrade() else { return };
                if relevant {
                    flag.store(true, Ordering::Release);
                }
            }
        });
        RbacAuthorizer { informer, snapshot: RwLock::default(), stale }
    }

    fn snapshot(&self) -> Arc<Snapshot> {
        if self.stale.swap(false, Ordering::AcqRel) {
            let fresh = Arc::new(build_from(self.informer.cache()));
            *self.snapshot.write().unwrap_or_else(|e| e.into_inner()) = fresh.clone();
            return fresh;
        }
        self.snapshot.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The binding that allows the request, if any.
    pub fn allows(&self, user: &str, groups: &[String], a: &Attributes) -> Option<Arc<str>> {
        self.snapshot().allows(user, groups, a)
    }
}

fn build_from(cache: &Cache) -> Snapshot {
    Snapshot::build(
        &cache.list_typed::<Role>(None),
        &cache.list_typed::<ClusterRole>(None),
        &cache.list_typed::<RoleBinding>(None),
        &cache.list_typed::<ClusterRoleBinding>(None),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rule(value: serde_json::Value) -> PolicyRule {
        serde_json::from_value(value).unwrap()
    }

    fn get(resource: &str, namespace: &str) -> Attributes<'static> {
        let (resource, namespace) = (resource.to_owned().leak(), namespace.to_owned().leak());
        Attributes { verb: "get", resource_request: true, resource, namespace, ..Default::default() }
    }

    #[test]
    fn rules_match_as_kubernetes_matches_them() {
        let pods = Attributes { verb: "list", resource_request: true, resource: "pods", ..Default::default() };
        let log = Attributes { subresource: "log", verb: "get", name: "web", ..pods.clone() };
        let deployments = Attributes { api_group: "apps", resource: "deployments", ..pods.clone() };
        let healthz = Attributes { verb: "get", path: "/healthz/etcd", ..Default::default() };
        let cases: Vec<(&str, serde_json::Value, &Attributes, bool)> = vec![
            ("exact", json!({"verbs": ["list"], "apiGroups": [""], "resources": ["pods"]}), &pods, true),
            ("another verb", json!({"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}), &pods, false),
            ("any verb", json!({"verbs": ["*"], "apiGroups": [""], "resources": ["pods"]}), &pods, true),
            ("another group", json!({"verbs": ["list"], "apiGroups": ["apps"], "resources": ["pods"]}), &pods, false),
            (
                "any group",
                json!({"verbs": ["list"], "apiGroups": ["*"], "resources": ["deployments"]}),
                &deployments,
                true,
            ),
            ("no group listed", json!({"verbs": ["list"], "resources": ["pods"]}), &pods, false),
            (
                "the resource is not its subresource",
                json!({"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}),
                &log,
                false,
            ),
            (
                "resource/subresource",
                json!({"verbs": ["get"], "apiGroups": [""], "resources": ["pods/log"]}),
                &log,
                true,
            ),
            ("*/subresource", json!({"verbs": ["get"], "apiGroups": [""], "resources": ["*/log"]}), &log, true),
            ("any resource", json!({"verbs": ["get"], "apiGroups": [""], "resources": ["*"]}), &log, true),
            (
                "named",
                json!({"verbs": ["get"], "apiGroups": [""], "resources": ["pods/log"], "resourceNames": ["web"]}),
                &log,
                true,
            ),
            (
                "another name",
                json!({"verbs": ["get"], "apiGroups": [""], "resources": ["pods/log"], "resourceNames": ["db"]}),
                &log,
                false,
            ),
            (
                "names never match a list",
                json!({"verbs": ["list"], "apiGroups": [""], "resources": ["pods"], "resourceNames": ["web"]}),
                &pods,
                false,
            ),
            ("a URL rule is no resource rule", json!({"verbs": ["list"], "nonResourceURLs": ["*"]}), &pods, false),
            ("URL prefix", json!({"verbs": ["get"], "nonResourceURLs": ["/healthz/*"]}), &healthz, true),
            ("URL exact only", json!({"verbs": ["get"], "nonResourceURLs": ["/healthz"]}), &healthz, false),
            (
                "a resource rule is no URL rule",
                json!({"verbs": ["get"], "apiGroups": ["*"], "resources": ["*"]}),
                &healthz,
                false,
            ),
        ];
        for (name, r, attributes, want) in cases {
            assert_eq!(rule_allows(&rule(r), attributes), want, "{name}");
        }
    }

    fn cluster_role(name: &str, labels: serde_json::Value, body: serde_json::Value) -> ClusterRole {
        let mut role = json!({"metadata": {"name": name, "labels": labels}});
        role.as_object_mut().unwrap().extend(body.as_object().unwrap().clone());
        serde_json::from_value(role).unwrap()
    }

    #[test]
    fn aggregated_cluster_roles_hold_the_rules_they_select() {
        let roles = vec![
            cluster_role(
                "view",
                json!({}),
                json!({"aggregationRule": {"clusterRoleSelectors": [
                {"matchLabels": {"rbac.authorization.k8s.io/aggregate-to-view": "true"}}]}}),
            ),
            cluster_role(
                "a",
                json!({"rbac.authorization.k8s.io/aggregate-to-view": "true"}),
                json!({"rules": [{"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]}]}),
            ),
            cluster_role(
                "b",
                json!({"rbac.authorization.k8s.io/aggregate-to-view": "true"}),
                json!({"rules": [{"verbs": ["get"], "apiGroups": [""], "resources": ["pods"]},
                                 {"verbs": ["list"], "apiGroups": ["apps"], "resources": ["deployments"]}]}),
            ),
            cluster_role("c", json!({}), json!({"rules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]}]})),
        ];
        let rules = cluster_role_rules(&roles);
        assert_eq!(rules["view"].len(), 2, "the union, each rule once: {:?}", rules["view"]);
        assert_eq!(rules["c"].len(), 1);
        let none = cluster_role(
            "empty",
            json!({}),
            json!({"aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"x": "y"}}]}}),
        );
        assert!(cluster_role_rules(&[none])["empty"].is_empty());
    }

    #[test]
    fn bindings_grant_their_subjects_in_their_scope() {
        let role: Role = serde_json::from_value(json!({"metadata": {"name": "pod-reader", "namespace": "shop"},
            "rules": [{"verbs": ["get", "list"], "apiGroups": [""], "resources": ["pods"]}]}))
        .unwrap();
        let view = cluster_role(
            "view",
            json!({}),
            json!({"rules": [{"verbs": ["get"], "apiGroups": [""], "resources": ["configmaps"]}]}),
        );
        let binding = |name: &str,
                       namespace: &str,
                       kind: &str,
                       role: &str,
                       subjects: serde_json::Value|
         -> RoleBinding {
            serde_json::from_value(json!({"metadata": {"name": name, "namespace": namespace},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role}, "subjects": subjects})).unwrap()
        };
        let bindings = vec![
            binding("readers", "shop", "Role", "pod-reader", json!([{"kind": "ServiceAccount", "name": "app"}])),
            binding(
                "viewers",
                "shop",
                "ClusterRole",
                "view",
                json!([{"kind": "Group", "name": "system:serviceaccounts:shop"}]),
            ),
            binding(
                "dangling",
                "shop",
                "Role",
                "missing",
                json!([{"kind": "User", "name": "system:serviceaccount:shop:app"}]),
            ),
        ];
        let everywhere: ClusterRoleBinding = serde_json::from_value(json!({"metadata": {"name": "ops"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
            "subjects": [{"kind": "ServiceAccount", "name": "ops", "namespace": "kube-system"}]}))
        .unwrap();
        let snapshot = Snapshot::build(&[role], &[view], &bindings, &[everywhere]);
        let groups = |ns: &str| crate::serviceaccount::groups(ns);
        let app = "system:serviceaccount:shop:app";
        type Case<'a> = (&'a str, &'a str, Vec<String>, Attributes<'a>, Option<&'a str>);
        let cases: Vec<Case> = vec![
            (
                "its Role",
                app,
                groups("shop"),
                get("pods", "shop"),
                Some("RoleBinding \"shop/readers\" of Role \"pod-reader\""),
            ),
            ("not in another namespace", app, groups("shop"), get("pods", "other"), None),
            ("not cluster-wide", app, groups("shop"), get("pods", ""), None),
            ("not what the Role lists", app, groups("shop"), get("secrets", "shop"), None),
            (
                "through its group",
                app,
                groups("shop"),
                get("configmaps", "shop"),
                Some("RoleBinding \"shop/viewers\" of ClusterRole \"view\""),
            ),
            ("another namespace's account", "system:serviceaccount:web:app", groups("web"), get("pods", "shop"), None),
            (
                "a ClusterRoleBinding holds everywhere",
                "system:serviceaccount:kube-system:ops",
                groups("kube-system"),
                get("configmaps", "any"),
                Some("ClusterRoleBinding \"ops\" of ClusterRole \"view\""),
            ),
        ];
        for (name, user, groups, attributes, want) in cases {
            assert_eq!(snapshot.allows(user, &groups, &attributes).as_deref(), want, "{name}");
        }
    }
}
