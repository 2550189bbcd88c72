//! The APIs Kubernetes removed, with the version each kind is served in now (the deprecated API
//! migration guide), so that a manifest written for an old cluster gets kubectl's answer and
//! the way forward rather than a list of accepted kinds.

/// (apiVersion, its kinds, the release that removed them, the apiVersion that replaces it).
const REMOVED: &[(&str, &[&str], &str, &str)] = &[
    ("extensions/v1beta1", &["Deployment", "DaemonSet", "ReplicaSet", "StatefulSet"], "1.16", "apps/v1"),
    ("apps/v1beta1", &["Deployment", "DaemonSet", "ReplicaSet", "StatefulSet"], "1.16", "apps/v1"),
    ("apps/v1beta2", &["Deployment", "DaemonSet", "ReplicaSet", "StatefulSet"], "1.16", "apps/v1"),
    ("extensions/v1beta1", &["NetworkPolicy"], "1.16", "networking.k8s.io/v1"),
    ("extensions/v1beta1", &["Ingress"], "1.22", "networking.k8s.io/v1"),
    ("networking.k8s.io/v1beta1", &["Ingress", "IngressClass"], "1.22", "networking.k8s.io/v1"),
    ("storage.k8s.io/v1beta1", &["StorageClass"], "1.22", "storage.k8s.io/v1"),
    (
        "rbac.authorization.k8s.io/v1beta1",
        &["Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"],
        "1.22",
        "rbac.authorization.k8s.io/v1",
    ),
    ("apiregistration.k8s.io/v1beta1", &["APIService"], "1.22", "apiregistration.k8s.io/v1"),
    ("batch/v1beta1", &["CronJob"], "1.25", "batch/v1"),
    ("policy/v1beta1", &["PodDisruptionBudget"], "1.25", "policy/v1"),
    ("autoscaling/v2beta1", &["HorizontalPodAutoscaler"], "1.25", "autoscaling/v2"),
    ("autoscaling/v2beta2", &["HorizontalPodAutoscaler"], "1.26", "autoscaling/v2"),
];

/// kubectl's message for a kind in a removed apiVersion, with its replacement; `None` when the
/// pair was never removed.
pub(super) fn message(api_version: &str, kind: &str) -> Option<String> {
    let (_, _, release, replacement) =
        REMOVED.iter().find(|(version, kinds, _, _)| *version == api_version && kinds.contains(&kind))?;
    Some(format!(
        "no matches for kind \"{kind}\" in version \"{api_version}\"; use {replacement} \
         ({api_version} {kind} was removed in Kubernetes {release})"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removed_apis_name_their_replacement() {
        #[rustfmt::skip]
        let cases = [
            ("policy/v1beta1", "PodDisruptionBudget", Some("use policy/v1 (policy/v1beta1 PodDisruptionBudget was removed in Kubernetes 1.25)")),
            ("batch/v1beta1", "CronJob", Some("use batch/v1 ")),
            ("extensions/v1beta1", "Deployment", Some("use apps/v1 ")),
            ("extensions/v1beta1", "DaemonSet", Some("use apps/v1 ")),
            ("apps/v1beta1", "StatefulSet", Some("use apps/v1 ")),
            ("apps/v1beta2", "ReplicaSet", Some("use apps/v1 ")),
            ("networking.k8s.io/v1beta1", "Ingress", Some("use networking.k8s.io/v1 ")),
            ("storage.k8s.io/v1beta1", "StorageClass", Some("use storage.k8s.io/v1 (storage.k8s.io/v1beta1 StorageClass was removed in Kubernetes 1.22)")),
            ("rbac.authorization.k8s.io/v1beta1", "ClusterRoleBinding", Some("use rbac.authorization.k8s.io/v1 ")),
            ("apiregistration.k8s.io/v1beta1", "APIService", Some("use apiregistration.k8s.io/v1 ")),
            ("autoscaling/v2beta1", "HorizontalPodAutoscaler", Some("use autoscaling/v2 ")),
            ("autoscaling/v2beta2", "HorizontalPodAutoscaler", Some("use autoscaling/v2 (autoscaling/v2beta2 HorizontalPodAutoscaler was removed in Kubernetes 1.26)")),
            ("apps/v1", "Deployment", None),
            ("policy/v1beta1", "Deployment", None),
        ];
        for (api_version, kind, expected) in cases {
            let got = message(api_version, kind);
            match expected {
                None => assert_eq!(got, None, "{api_version} {kind}"),
                Some(part) => {
                    let got = got.unwrap_or_default();
                    assert!(
                        got.starts_with(&format!("no matches for kind \"{kind}\" in version \"{api_version}\"; ")),
                        "{got}"
                    );
                    assert!(got.contains(part), "{got}");
                }
            }
        }
    }
}
