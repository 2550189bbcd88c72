//! What the files of configMap, secret, downwardAPI and projected volumes hold (the kubelet's
//! volume plugins' `MakePayload` / `CollectData`). Pure: objects and tokens come from a
//! [`ConfigSource`].

use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapVolumeSource, DownwardAPIVolumeSource, KeyToPath, Pod, ProjectedVolumeSource, Secret,
    SecretVolumeSource,
};
use std::collections::BTreeMap;

use super::atomic_writer::{FileProjection, Payload, check_path};
use crate::kubelet::runtime::config::RuntimeConfig;
use crate::kubelet::runtime::env::{ConfigSource, resource_value};
use crate::kubelet::runtime::fields::pod_namespace;

/// The API's default file mode of these volumes.
pub const DEFAULT_MODE: i32 = 0o644;

fn mode(mode: Option<i32>, default: Option<i32>) -> Result<u32, String> {
    let mode = mode.or(default).unwrap_or(DEFAULT_MODE);
    u32::try_from(mode).ok().filter(|m| *m <= 0o777).ok_or_else(|| format!("mode {mode} is not between 0 and 0777"))
}

/// Every key, or the `items` asked for; `kind` names the object in messages.
fn project(
    kind: &str,
    data: BTreeMap<&str, &[u8]>,
    items: Option<&Vec<KeyToPath>>,
    default_mode: Option<i32>,
    optional: bool,
) -> Result<Payload, String> {
    let mut payload = Payload::new();
    match items.filter(|i| !i.is_empty()) {
        None => {
            for (key, value) in data {
                check_path(key)?;
                payload
                    .insert(key.to_owned(), FileProjection { data: value.to_vec(), mode: mode(None, default_mode)? });
            }
        }
        Some(items) => {
            for item in items {
                let Some(value) = data.get(item.key.as_str()) else {
                    if optional {
                        continue;
                    }
                    return Err(format!("{kind} references non-existent {kind} key: {}", item.key));
                };
                check_path(&item.path)?;
                let file = FileProjection { data: value.to_vec(), mode: mode(item.mode, default_mode)? };
                payload.insert(item.path.clone(), file);
            }
        }
    }
    Ok(payload)
}

/// A configMap volume's files; a missing ConfigMap is an error unless the volume is optional.
pub fn config_map(
    source: &ConfigMapVolumeSource,
    object: Option<&ConfigMap>,
    namespace: &str,
) -> Result<Payload, String> {
    let optional = source.optional == Some(true);
    let Some(cm) = object else {
        return if optional {
            Ok(Payload::new())
        } else {
            Err(format!(
                "configmap \"{namespace}/{}\" not found: add it in Git, or mark the volume optional",
                source.name
            ))
        };
    };
    let mut data: BTreeMap<&str, &[u8]> = BTreeMap::new();
    for (k, v) in cm.binary_data.iter().flatten() {
        data.insert(k, &v.0);
    }
    for (k, v) in cm.data.iter().flatten() {
        data.insert(k, v.as_bytes());
    }
    project("configmap", data, source.items.as_ref(), source.default_mode, optional)
}

/// A secret volume's files; a missing Secret is an error unless the volume is optional.
pub fn secret(source: &SecretVolumeSource, object: Option<&Secret>, namespace: &str) -> Result<Payload, String> {
    let optional = source.optional == Some(true);
    let name = source.secret_name.as_deref().unwrap_or_default();
    let Some(secret) = object else {
        return if optional {
            Ok(Payload::new())
        } else {
            Err(format!("secret \"{namespace}/{name}\" not found: add it in Git, or mark the volume optional"))
        };
    };
    let data: BTreeMap<&str, &[u8]> = secret.data.iter().flatten().map(|(k, v)| (k.as_str(), v.0.as_slice())).collect();
    project("secret", data, source.items.as_ref(), source.default_mode, optional)
}

/// Labels or annotations as the downward API writes them: `key="value"` lines, sorted.
fn format_map(map: Option<&BTreeMap<String, String>>) -> String {
    let lines: Vec<String> = map.into_iter().flatten().map(|(k, v)| format!("{k}={v:?}")).collect();
    lines.join("\n")
}

/// A downwardAPI volume's files: Pod metadata and container resources.
pub fn downward_api(source: &DownwardAPIVolumeSource, pod: &Pod, cfg: &RuntimeConfig) -> Result<Payload, String> {
    let meta = &pod.metadata;
    let mut payload = Payload::new();
    for item in source.items.iter().flatten() {
        check_path(&item.path)?;
        let text = if let Some(field) = &item.field_ref {
            let path = field.field_path.as_str();
            let keyed = |prefix: &str| path.strip_prefix(prefix).and_then(|k| k.strip_suffix("']"));
            if let Some(key) = keyed("metadata.labels['") {
                meta.labels.as_ref().and_then(|l| l.get(key)).cloned().unwrap_or_default()
            } else if let Some(key) = keyed("metadata.annotations['") {
                meta.annotations.as_ref().and_then(|a| a.get(key)).cloned().unwrap_or_default()
            } else {
                match path {
                    "metadata.labels" => format_map(meta.labels.as_ref()),
                    "metadata.annotations" => format_map(meta.annotations.as_ref()),
                    "metadata.name" => meta.name.clone().unwrap_or_default(),
                    "metadata.namespace" => pod_namespace(pod).to_owned(),
                    "metadata.uid" => meta.uid.clone().unwrap_or_default(),
                    other => return Err(format!("fieldRef {other:?} is not supported in a downwardAPI volume")),
                }
            }
        } else if let Some(selector) = &item.resource_field_ref {
            let name = selector.container_name.as_deref().unwrap_or_default();
            let container = pod
                .spec
                .iter()
                .flat_map(|s| s.containers.iter())
                .find(|c| c.name == name)
                .ok_or_else(|| format!("resourceFieldRef of {:?} names no container ({name:?})", item.path))?;
            resource_value(pod, container, selector, cfg).map_err(|e| e.to_string())?
        } else {
            return Err(format!("item {:?} has neither fieldRef nor resourceFieldRef", item.path));
        };
        payload.insert(
            item.path.clone(),
            FileProjection { data: text.into_bytes(), mode: mode(item.mode, source.default_mode)? },
        );
    }
    Ok(payload)
}

/// A projected volume's files: each source's, in order, under the volume's defaultMode. A
/// serviceAccountToken source is the token of the Pod's ServiceAccount (default an hour).
pub fn projected(
    source: &ProjectedVolumeSource,
    pod: &Pod,
    cfg: &RuntimeConfig,
    objects: &dyn ConfigSource,
) -> Result<Payload, String> {
    let namespace = pod_namespace(pod);
    let default_mode = source.default_mode;
    let mut payload = Payload::new();
    for (i, projection) in source.sources.iter().flatten().enumerate() {
        let part = if let Some(cm) = &projection.config_map {
            let as_volume = ConfigMapVolumeSource {
                name: cm.name.clone(),
                items: cm.items.clone(),
                optional: cm.optional,
                default_mode,
            };
            config_map(&as_volume, objects.config_map(namespace, &cm.name).as_deref(), namespace)?
        } else if let Some(secret_source) = &projection.secret {
            let as_volume = SecretVolumeSource {
                secret_name: Some(secret_source.name.clone()),
                items: secret_source.items.clone(),
                optional: secret_source.optional,
                default_mode,
            };
            secret(&as_volume, objects.secret(namespace, &secret_source.name).as_deref(), namespace)?
        } else if let Some(downward) = &projection.downward_api {
            downward_api(&DownwardAPIVolumeSource { items: downward.items.clone(), default_mode }, pod, cfg)?
        } else if let Some(token) = &projection.service_account_token {
            check_path(&token.path)?;
            let expiration = token.expiration_seconds.unwrap_or(3607);
            let audience = token.audience.as_deref().unwrap_or_default();
            let data = objects.service_account_token(pod, audience, expiration)?.into_bytes();
            Payload::from([(token.path.clone(), FileProjection { data, mode: mode(None, default_mode)? })])
        } else {
            return Err(format!("source {i} of the projected volume is of a kind the node does not project"));
        };
        payload.extend(part);
    }
    Ok(payload)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use serde_json::json;

    fn text(payload: &Payload) -> Vec<(String, String, u32)> {
        payload.iter().map(|(p, f)| (p.clone(), String::from_utf8_lossy(&f.data).into_owned(), f.mode)).collect()
    }

    fn row(path: &str, data: &str, mode: u32) -> (String, String, u32) {
        (path.into(), data.into(), mode)
    }

    #[test]
    fn config_map_files_all_keys_or_items_with_modes() {
        let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "app"}, "data": {"a": "1", "b": "2"},
            "binaryData": {"bin": "AAE="}}))
        .unwrap();
        let all: ConfigMapVolumeSource = serde_json::from_value(json!({"name": "app", "defaultMode": 0o440})).unwrap();
        let got = text(&config_map(&all, Some(&cm), "ns").unwrap());
        assert_eq!(got, [row("a", "1", 0o440), row("b", "2", 0o440), row("bin", "\u{0}\u{1}", 0o440)]);
        let items: ConfigMapVolumeSource = serde_json::from_value(json!({"name": "app", "items": [
            {"key": "a", "path": "conf/a.txt", "mode": 0o600}, {"key": "b", "path": "b.txt"}]}))
        .unwrap();
        let got = text(&config_map(&items, Some(&cm), "ns").unwrap());
        assert_eq!(got, [row("b.txt", "2", 0o644), row("conf/a.txt", "1", 0o600)]);

        let missing_key: ConfigMapVolumeSource =
            serde_json::from_value(json!({"name": "app", "items": [{"key": "zz", "path": "z"}]})).unwrap();
        assert_eq!(
            config_map(&missing_key, Some(&cm), "ns").unwrap_err(),
            "configmap references non-existent configmap key: zz"
        );
        let err = config_map(&all, None, "ns").unwrap_err();
        assert!(err.starts_with("configmap \"ns/app\" not found"), "{err}");
        let optional: ConfigMapVolumeSource = serde_json::from_value(json!({"name": "app", "optional": true})).unwrap();
        assert!(config_map(&optional, None, "ns").unwrap().is_empty());
        let escape: ConfigMapVolumeSource =
            serde_json::from_value(json!({"name": "app", "items": [{"key": "a", "path": "../../etc/x"}]})).unwrap();
        assert!(config_map(&escape, Some(&cm), "ns").unwrap_err().contains("'..'"));
    }

    #[test]
    fn secret_files_carry_the_bytes() {
        let object = Secret {
            data: Some(BTreeMap::from([("tls.key".into(), ByteString(b"k3y".to_vec()))])),
            ..Default::default()
        };
        let source: SecretVolumeSource =
            serde_json::from_value(json!({"secretName": "tls", "defaultMode": 0o400})).unwrap();
        assert_eq!(text(&secret(&source, Some(&object), "ns").unwrap()), [row("tls.key", "k3y", 0o400)]);
        let err = secret(&source, None, "ns").unwrap_err();
        assert!(err.starts_with("secret \"ns/tls\" not found"), "{err}");
    }

    #[test]
    fn downward_api_files_as_the_kubelet_writes_them() {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "u-1",
                         "labels": {"app": "web", "tier": "front \"end\""}, "annotations": {"a": "b"}},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"memory": "32Mi"}}}]}
        }))
        .unwrap();
        let source: DownwardAPIVolumeSource = serde_json::from_value(json!({"items": [
            {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
            {"path": "app", "fieldRef": {"fieldPath": "metadata.labels['app']"}},
            {"path": "meta/name", "fieldRef": {"fieldPath": "metadata.name"}, "mode": 0o400},
            {"path": "mem", "resourceFieldRef": {"containerName": "c", "resource": "limits.memory", "divisor": "1Mi"}}
        ]}))
        .unwrap();
        let got = text(&downward_api(&source, &pod, &RuntimeConfig::default()).unwrap());
        assert_eq!(
            got,
            [
                row("app", "web", 0o644),
                row("labels", "app=\"web\"\ntier=\"front \\\"end\\\"\"", 0o644),
                row("mem", "32", 0o644),
                row("meta/name", "web", 0o400),
            ]
        );
    }
}
