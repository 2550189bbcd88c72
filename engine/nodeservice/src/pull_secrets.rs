//! The ServiceAccount admission plugin's image pull Secrets, on the copy of a Pod its node
//! receives: a Pod that names none gets its ServiceAccount's `imagePullSecrets`. As with the
//! token volume ([`super::token_volume`]), the stored Pod stays as Git wrote it; the node's pod
//! config (the node authorizer) counts the same Secrets as the Pod's references.

use serde_json::Value;

/// Whether the Pod names image pull Secrets of its own.
pub fn has_own(pod: &Value) -> bool {
    pod["spec"]["imagePullSecrets"].as_array().is_some_and(|s| !s.is_empty())
}

/// The names of the account's `imagePullSecrets` the Pod takes: none if it has its own.
pub fn inherited<'a>(pod: &Value, account: Option<&'a Value>) -> Vec<&'a str> {
    if has_own(pod) {
        return Vec::new();
    }
    let secrets = account.and_then(|a| a["imagePullSecrets"].as_array());
    secrets.into_iter().flatten().filter_map(|s| s["name"].as_str()).filter(|n| !n.is_empty()).collect()
}

/// Copies the account's `imagePullSecrets` into a Pod that names none.
pub fn copy(pod: &mut Value, account: Option<&Value>) {
    let names: Vec<Value> = inherited(pod, account).into_iter().map(|name| serde_json::json!({"name": name})).collect();
    if names.is_empty() {
        return;
    }
    if let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) {
        spec.insert("imagePullSecrets".into(), Value::Array(names));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_pod_without_its_own_takes_its_accounts() {
        let account = json!({"imagePullSecrets": [{"name": "registry"}, {"name": ""}, {"name": "mirror"}]});
        let cases = [
            ("none of its own", json!({}), Some(account.clone()), json!([{"name": "registry"}, {"name": "mirror"}])),
            (
                "an empty list",
                json!({"imagePullSecrets": []}),
                Some(account.clone()),
                json!([{"name": "registry"}, {"name": "mirror"}]),
            ),
            (
                "its own win",
                json!({"imagePullSecrets": [{"name": "own"}]}),
                Some(account.clone()),
                json!([{"name": "own"}]),
            ),
            ("an account with none", json!({}), Some(json!({})), Value::Null),
            ("no account", json!({}), None, Value::Null),
        ];
        for (name, spec, account, want) in cases {
            let mut pod = json!({"metadata": {"name": "p"}, "spec": spec});
            copy(&mut pod, account.as_ref());
            assert_eq!(pod["spec"]["imagePullSecrets"], want, "{name}");
        }
    }
}
