//! The kubelet's Pod admission on the node, before a Pod's first sync: a Pod the node cannot run
//! as written is rejected (phase Failed, a reason and a message, a Warning Event) instead of
//! being started without what it asked for. Today: AppArmor, as the kubelet's
//! `appArmorAdmitHandler`. Pure: what the host offers is given ([`Host`]).

use k8s_openapi::api::core::v1::{Pod, PodStatus};

/// The deprecated per-container AppArmor annotation (`<prefix><container>`).
pub const APPARMOR_ANNOTATION_PREFIX: &str = "container.apparmor.security.beta.kubernetes.io/";

/// What the node can enforce.
#[derive(Clone, Copy, Debug, Default)]
pub struct Host {
    /// The kernel's AppArmor is on (`/sys/module/apparmor/parameters/enabled` says `Y`).
    pub apparmor: bool,
}

/// Why the node does not run a Pod: the kubelet's `PodAdmitResult`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    pub reason: &'static str,
    pub message: String,
}

impl Rejection {
    /// The status the kubelet's `rejectPod` gives the Pod.
    pub fn status(&self, pod: &Pod) -> PodStatus {
        PodStatus {
            phase: Some("Failed".into()),
            reason: Some(self.reason.into()),
            message: Some(format!("Pod was rejected: {}", self.message)),
            qos_class: pod.status.as_ref().and_then(|s| s.qos_class.clone()),
            ..PodStatus::default()
        }
    }
}

/// The kubelet's admission of `pod` on `host`. Only a Pending Pod is judged: one that already
/// ran here is not checked again.
pub fn admit(pod: &Pod, host: Host) -> Result<(), Rejection> {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if phase.is_some_and(|p| p != "Pending") {
        return Ok(());
    }
    if apparmor_required(pod) && !host.apparmor {
        return Err(Rejection {
            reason: "AppArmor",
            message: "Cannot enforce AppArmor: AppArmor is not enabled on the host".into(),
        });
    }
    Ok(())
}

/// Whether a Pod this node rejected is the one before it: rejected Pods stay Failed and are
/// never started.
pub fn was_rejected(pod: &Pod) -> bool {
    let status = pod.status.as_ref();
    status.and_then(|s| s.phase.as_deref()) == Some("Failed")
        && status.and_then(|s| s.reason.as_deref()) == Some("AppArmor")
}

/// The kubelet's `isRequired`: some profile other than `Unconfined` is asked for, by the Pod's
/// or a container's `appArmorProfile` or by the deprecated annotation.
pub fn apparmor_required(pod: &Pod) -> bool {
    let confined = |p: Option<&k8s_openapi::api::core::v1::AppArmorProfile>| p.is_some_and(|p| p.type_ != "Unconfined");
    let spec = pod.spec.as_ref();
    let pod_level = confined(spec.and_then(|s| s.security_context.as_ref()).and_then(|s| s.app_armor_profile.as_ref()));
    let containers = spec.into_iter().flat_map(|s| s.containers.iter().chain(s.init_containers.iter().flatten()));
    let mut containers = containers.map(|c| c.security_context.as_ref().and_then(|s| s.app_armor_profile.as_ref()));
    let annotations = pod.metadata.annotations.iter().flatten();
    let mut annotated = annotations.filter(|(k, _)| k.starts_with(APPARMOR_ANNOTATION_PREFIX)).map(|(_, v)| v);
    pod_level || containers.any(confined) || annotated.any(|v| v != "unconfined")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn apparmor_profiles_are_rejected_where_the_host_has_no_apparmor() {
        let rejected = Err(Rejection {
            reason: "AppArmor",
            message: "Cannot enforce AppArmor: AppArmor is not enabled on the host".into(),
        });
        let container = |sc: serde_json::Value| json!([{ "name": "c", "image": "i", "securityContext": sc }]);
        let annotated = |value: &str| json!({ "container.apparmor.security.beta.kubernetes.io/c": value });
        let runtime_default = json!({ "appArmorProfile": { "type": "RuntimeDefault" } });
        let cases = [
            // (pod securityContext, containers, annotations, phase, host has AppArmor, admitted)
            (json!({}), container(json!({})), json!({}), "Pending", false, Ok(())),
            (runtime_default.clone(), container(json!({})), json!({}), "Pending", false, rejected.clone()),
            (runtime_default.clone(), container(json!({})), json!({}), "Pending", true, Ok(())),
            (runtime_default.clone(), container(json!({})), json!({}), "Running", false, Ok(())),
            (
                json!({}),
                container(json!({ "appArmorProfile": { "type": "Localhost", "localhostProfile": "k8s-deny" } })),
                json!({}),
                "Pending",
                false,
                rejected.clone(),
            ),
            (
                json!({}),
                container(json!({ "appArmorProfile": { "type": "Unconfined" } })),
                json!({}),
                "Pending",
                false,
                Ok(()),
            ),
            (json!({}), container(json!({})), annotated("runtime/default"), "Pending", false, rejected.clone()),
            (json!({}), container(json!({})), annotated("unconfined"), "Pending", false, Ok(())),
        ];
        for (pod_sc, containers, annotations, phase, apparmor, expected) in cases {
            let pod: Pod = serde_json::from_value(json!({
                "metadata": { "name": "p", "annotations": annotations },
                "spec": { "securityContext": pod_sc, "containers": containers },
                "status": { "phase": phase },
            }))
            .expect("pod");
            assert_eq!(admit(&pod, Host { apparmor }), expected, "{pod_sc} {annotations} {phase} {apparmor}");
        }
    }
}
