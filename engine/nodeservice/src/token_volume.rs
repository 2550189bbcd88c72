//! The ServiceAccount admission plugin's token volume, on the copy of a Pod its node receives:
//! unless the Pod (or else its ServiceAccount) sets `automountServiceAccountToken: false`, a
//! projected volume `kube-api-access-<suffix>` (a bound token, the cluster CA from
//! `kube-root-ca.crt`, the namespace) mounted read-only at
//! `/var/run/secrets/kubernetes.io/serviceaccount` in every container that mounts nothing there.
//!
//! Upstream adds it to the stored Pod at creation; here the stored Pod stays as Git wrote it, so
//! that the source's drift check compares it with Git alone, and the node sees what a kubelet
//! would. The suffix comes from the Pod's uid, so every copy of one Pod is the same.

use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

/// Where the token, `ca.crt` and `namespace` are in a container.
pub const MOUNT_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The ConfigMap holding the cluster CA in every namespace.
const ROOT_CA: &str = "kube-root-ca.crt";

/// Whether the Pod gets the volume: its own setting, else its ServiceAccount's, else yes.
pub fn automounts(pod: &Value, account_automount: Option<bool>) -> bool {
    pod["spec"]["automountServiceAccountToken"].as_bool().or(account_automount).unwrap_or(true)
}

/// The ServiceAccount the Pod runs as: `default` when it names none.
pub fn service_account_name(pod: &Value) -> &str {
    pod["spec"]["serviceAccountName"].as_str().filter(|n| !n.is_empty()).unwrap_or("default")
}

/// Adds the volume and its mounts to `pod` (and names the ServiceAccount, as admission does).
pub fn mount(pod: &mut Value, account_automount: Option<bool>) {
    let account = service_account_name(pod).to_owned();
    let automount = automounts(pod, account_automount);
    let uid = pod["metadata"]["uid"].as_str().unwrap_or_default().to_owned();
    let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) else { return };
    spec.insert("serviceAccountName".into(), json!(account));
    if !automount {
        return;
    }
    let name = format!("kube-api-access-{}", &hex::encode(Sha256::digest(uid.as_bytes()))[..5]);
    let volumes = spec.entry("volumes").or_insert_with(|| json!([]));
    let Some(volumes) = volumes.as_array_mut() else { return };
    if volumes.iter().any(|v| v["name"] == name.as_str()) {
        return;
    }
    volumes.push(json!({"name": name, "projected": {"defaultMode": 0o644, "sources": [
        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
        {"configMap": {"name": ROOT_CA, "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace",
                                     "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
    ]}}));
    for list in ["initContainers", "containers"] {
        for container in spec.get_mut(list).and_then(Value::as_array_mut).into_iter().flatten() {
            let Some(container) = container.as_object_mut() else { continue };
            let mounts = container.entry("volumeMounts").or_insert_with(|| json!([]));
            let Some(mounts) = mounts.as_array_mut() else { continue };
            if mounts.iter().any(|m| m["mountPath"].as_str().map(|p| p.trim_end_matches('/')) == Some(MOUNT_PATH)) {
                continue;
            }
            mounts.push(json!({"name": name, "mountPath": MOUNT_PATH, "readOnly": true}));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(extra: Value) -> Value {
        let mut pod = json!({"metadata": {"name": "web", "namespace": "shop", "uid": "u-1"},
            "spec": {"containers": [{"name": "a", "image": "i"},
                                    {"name": "b", "image": "i", "volumeMounts": [{"name": "own", "mountPath": MOUNT_PATH}]}],
                     "initContainers": [{"name": "init", "image": "i"}]}});
        for (k, v) in extra.as_object().unwrap() {
            pod["spec"][k] = v.clone();
        }
        pod
    }

    fn mounted(pod: &Value) -> Vec<String> {
        ["initContainers", "containers"]
            .iter()
            .flat_map(|l| pod["spec"][l].as_array().unwrap())
            .filter(|c| {
                c["volumeMounts"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|m| m["name"].as_str().is_some_and(|n| n.starts_with("kube-api-access-")))
            })
            .map(|c| c["name"].as_str().unwrap().to_owned())
            .collect()
    }

    #[test]
    fn the_token_volume_follows_automount() {
        let cases: Vec<(&str, Value, Option<bool>, Vec<&str>)> = vec![
            ("by default", json!({}), None, vec!["init", "a"]),
            ("the account says no", json!({}), Some(false), vec![]),
            (
                "the Pod says yes over its account",
                json!({"automountServiceAccountToken": true}),
                Some(false),
                vec!["init", "a"],
            ),
            ("the Pod says no", json!({"automountServiceAccountToken": false}), Some(true), vec![]),
        ];
        for (name, extra, account, want) in cases {
            let mut p = pod(extra);
            mount(&mut p, account);
            assert_eq!(mounted(&p), want, "{name}");
            assert_eq!(p["spec"]["serviceAccountName"], "default", "{name}");
            let again = p.clone();
            mount(&mut p, account);
            assert_eq!(p, again, "{name}: mounting twice changes nothing");
        }
        let mut p = pod(json!({"serviceAccountName": "reader"}));
        mount(&mut p, None);
        let volume = &p["spec"]["volumes"][0];
        assert_eq!(p["spec"]["serviceAccountName"], "reader");
        assert_eq!(volume["projected"]["sources"][0]["serviceAccountToken"]["path"], "token");
        assert_eq!(volume["projected"]["sources"][1]["configMap"]["name"], "kube-root-ca.crt");
        let mut other = pod(json!({}));
        other["metadata"]["uid"] = json!("u-2");
        mount(&mut other, None);
        assert_ne!(other["spec"]["volumes"][0]["name"], volume["name"], "named after the Pod's uid");
    }
}
