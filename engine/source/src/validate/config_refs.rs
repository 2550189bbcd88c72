//! A Pod's reference to a key of a ConfigMap or Secret that is in the same commit and lacks the
//! key: Kubernetes accepts it, and the Pod then waits with CreateContainerConfigError (env) or
//! cannot mount its volume; a typo is better caught at the commit. Only objects of the commit
//! are looked at (one from elsewhere may have the key), and `optional` references are left
//! alone, as the kubelet skips them.

use super::{Accepted, object_label, pod::pod_spec_pointer};
use crate::error::ManifestError;
use serde_json::Value;
use std::collections::{BTreeSet, HashMap};

/// (position in `accepted`, error) for every such reference.
pub(crate) fn missing_keys(accepted: &[&Accepted]) -> Vec<(usize, ManifestError)> {
    let mut keys: HashMap<(&str, &str, &str), BTreeSet<&str>> = HashMap::new();
    for a in accepted {
        let key = &a.manifest.key;
        let fields: &[&str] = match key.kind.as_str() {
            "ConfigMap" => &["data", "binaryData"],
            "Secret" => &["data"],
            _ => continue,
        };
        let names =
            fields.iter().filter_map(|f| a.manifest.value.get(*f).and_then(Value::as_object)).flat_map(|m| m.keys());
        keys.entry((key.kind.as_str(), key.namespace.as_str(), key.name.as_str()))
            .or_default()
            .extend(names.map(String::as_str));
    }
    // Almost every commit has no ConfigMap or Secret: nothing more to do.
    if keys.is_empty() {
        return Vec::new();
    }
    let mut errors = Vec::new();
    for (position, a) in accepted.iter().enumerate() {
        let m = &a.manifest;
        let Some(at) = pod_spec_pointer(&m.key.kind) else { continue };
        let Some(spec) = m.value.pointer(at) else { continue };
        let namespace = m.key.namespace.as_str();
        let mut report = |path: String, kind: &str, name: &str, key: &str| {
            let Some(present) = keys.get(&(kind, namespace, name)) else { return };
            if present.contains(key) {
                return;
            }
            let known = if present.is_empty() {
                "none".to_owned()
            } else {
                present.iter().copied().collect::<Vec<_>>().join(", ")
            };
            errors.push((
                position,
                ManifestError {
                    file: m.file.clone(),
                    line: Some(a.locator.lines().line_of(&path)),
                    column: None,
                    document: Some(m.index),
                    object: object_label(&m.value),
                    path: Some(path),
                    message: format!(
                        "{kind} {name} (in this commit) has no key {key:?} (its keys: {known}): add the key, fix the \
                         name, or mark the reference optional: true"
                    ),
                },
            ));
        };
        for list in ["containers", "initContainers"] {
            for (c, container) in spec.get(list).and_then(Value::as_array).into_iter().flatten().enumerate() {
                for (e, var) in container.get("env").and_then(Value::as_array).into_iter().flatten().enumerate() {
                    for (field, kind) in [("configMapKeyRef", "ConfigMap"), ("secretKeyRef", "Secret")] {
                        let r = &var["valueFrom"][field];
                        if let (Some(name), Some(key)) = (r["name"].as_str(), r["key"].as_str())
                            && r["optional"] != Value::Bool(true)
                        {
                            report(format!("{at}/{list}/{c}/env/{e}/valueFrom/{field}/key"), kind, name, key);
                        }
                    }
                }
            }
        }
        for (v, volume) in spec.get("volumes").and_then(Value::as_array).into_iter().flatten().enumerate() {
            for (field, kind, name_field) in [("configMap", "ConfigMap", "name"), ("secret", "Secret", "secretName")] {
                let source = &volume[field];
                let Some(name) = source[name_field].as_str() else { continue };
                if source["optional"] == Value::Bool(true) {
                    continue;
                }
                for (i, item) in source["items"].as_array().into_iter().flatten().enumerate() {
                    if let Some(key) = item["key"].as_str() {
                        report(format!("{at}/volumes/{v}/{field}/items/{i}/key"), kind, name, key);
                    }
                }
            }
        }
    }
    errors
}
