//! A container's environment, as the kubelet's `makeEnvironmentVariables` makes it: envFrom
//! sources first (later ones win; keys that are not variable names are skipped), then `env` in
//! order, each value with `$(VAR)` references to what came before expanded, and valueFrom
//! resolved: fieldRef (the downward API), resourceFieldRef, configMapKeyRef and secretKeyRef.
//! The `kubernetes` Service's variables come last, unless the container defines them itself,
//! and `$(VAR)` may refer to them; they are set whatever `enableServiceLinks` says, as the
//! kubelet sets the master Service's.
//! Pure: the ConfigMaps and Secrets come from a [`ConfigSource`].

use std::collections::HashMap;
use std::sync::Arc;

use gitplane_api::quantity::{parse_milli, parse_units};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, PersistentVolume, PersistentVolumeClaim, Pod, ResourceFieldSelector, Secret,
};

use super::config::RuntimeConfig;
use super::fields::{SpecError, expand, field_value, pod_namespace};

/// Where the runtime reads the ConfigMaps, Secrets and claims its Pods reference, and the
/// volumes of those claims.
pub trait ConfigSource: Send + Sync {
    fn config_map(&self, namespace: &str, name: &str) -> Option<Arc<ConfigMap>>;
    fn secret(&self, namespace: &str, name: &str) -> Option<Arc<Secret>>;
    /// The token of `pod`'s ServiceAccount for `audience` (empty: the API server's), or why
    /// there is none yet.
    fn service_account_token(&self, _pod: &Pod, _audience: &str, _expiration_seconds: i64) -> Result<String, String> {
        Err("this node is given no ServiceAccount tokens".into())
    }
    fn persistent_volume_claim(&self, _namespace: &str, _name: &str) -> Option<Arc<PersistentVolumeClaim>> {
        None
    }
    fn persistent_volume(&self, _name: &str) -> Option<Arc<PersistentVolume>> {
        None
    }
}

/// No objects at all (a runtime without a control plane, as in the runtime tests).
pub struct NoConfig;

impl ConfigSource for NoConfig {
    fn config_map(&self, _: &str, _: &str) -> Option<Arc<ConfigMap>> {
        None
    }
    fn secret(&self, _: &str, _: &str) -> Option<Arc<Secret>> {
        None
    }
}

/// Kubernetes' `IsEnvVarName`: `[-._a-zA-Z][-._a-zA-Z0-9]*`.
pub fn is_env_var_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_alphabetic() || matches!(b, b'-' | b'.' | b'_'))
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
}

/// A Secret's value as the container sees it.
fn secret_text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// What a missing object or key tells the user: the object, the key, and what to do.
fn missing(kind: &str, namespace: &str, name: &str, what: &str) -> SpecError {
    SpecError::MissingConfig {
        message: format!(
            "{kind} \"{namespace}/{name}\" not found ({what}): add it in Git, or mark the reference optional: true"
        ),
    }
}

fn missing_key(kind: &str, namespace: &str, name: &str, key: &str, what: &str) -> SpecError {
    SpecError::MissingConfig {
        message: format!(
            "couldn't find key {key} in {kind} {namespace}/{name} ({what}): add the key in Git, or mark the \
             reference optional: true"
        ),
    }
}

/// The variables of the `default/kubernetes` Service at `ip`, port 443 `https`, as the
/// kubelet's `envvars.FromServices` names them.
pub fn kubernetes_service_env(ip: std::net::Ipv4Addr) -> Vec<(String, String)> {
    let url = format!("tcp://{ip}:443");
    [
        ("KUBERNETES_SERVICE_HOST", ip.to_string()),
        ("KUBERNETES_SERVICE_PORT", "443".into()),
        ("KUBERNETES_SERVICE_PORT_HTTPS", "443".into()),
        ("KUBERNETES_PORT", url.clone()),
        ("KUBERNETES_PORT_443_TCP", url),
        ("KUBERNETES_PORT_443_TCP_PROTO", "tcp".into()),
        ("KUBERNETES_PORT_443_TCP_PORT", "443".into()),
        ("KUBERNETES_PORT_443_TCP_ADDR", ip.to_string()),
    ]
    .map(|(k, v)| (k.to_owned(), v))
    .into()
}

/// The container's environment in order (a later definition of a name replaces its value in
/// place).
pub fn environment(
    pod: &Pod,
    container: &Container,
    cfg: &RuntimeConfig,
    pod_ips: &[String],
    objects: &dyn ConfigSource,
) -> Result<Vec<(String, String)>, SpecError> {
    let namespace = pod_namespace(pod);
    let service_env = cfg.kubernetes_service.map(kubernetes_service_env).unwrap_or_default();
    let mut envs: Vec<(String, String)> = Vec::new();
    let set =
        |envs: &mut Vec<(String, String)>, name: String, value: String| match envs.iter_mut().find(|(k, _)| *k == name)
        {
            Some(slot) => slot.1 = value,
            None => envs.push((name, value)),
        };

    for (i, source) in container.env_from.iter().flatten().enumerate() {
        let prefix = source.prefix.as_deref().unwrap_or("");
        let mut pairs: Vec<(String, String)> = Vec::new();
        let what = format!("container {:?} envFrom[{i}]", container.name);
        if let Some(r) = &source.config_map_ref {
            match objects.config_map(namespace, &r.name) {
                Some(cm) => pairs.extend(cm.data.iter().flatten().map(|(k, v)| (k.clone(), v.clone()))),
                None if r.optional == Some(true) => {}
                None => return Err(missing("configmap", namespace, &r.name, &what)),
            }
        } else if let Some(r) = &source.secret_ref {
            match objects.secret(namespace, &r.name) {
                Some(s) => pairs.extend(s.data.iter().flatten().map(|(k, v)| (k.clone(), secret_text(&v.0)))),
                None if r.optional == Some(true) => {}
                None => return Err(missing("secret", namespace, &r.name, &what)),
            }
        }
        let mut skipped = Vec::new();
        for (key, value) in pairs {
            let name = format!("{prefix}{key}");
            if is_env_var_name(&name) {
                set(&mut envs, name, value);
            } else {
                skipped.push(name);
            }
        }
        if !skipped.is_empty() {
            tracing::warn!(pod = ?pod.metadata.name, container = %container.name, ?skipped,
                "keys from envFrom were skipped since they are not valid environment variable names");
        }
    }

    for var in container.env.iter().flatten() {
        let what = format!("env {:?}", var.name);
        let value = match (&var.value, &var.value_from) {
            (Some(value), _) if !value.is_empty() => {
                let known: HashMap<&str, &str> =
                    service_env.iter().chain(&envs).map(|(k, v)| (k.as_str(), v.as_str())).collect();
                expand(value, |name| known.get(name).copied())
            }
            (_, Some(from)) => {
                if let Some(field) = &from.field_ref {
                    field_value(pod, &field.field_path, cfg, pod_ips).ok_or_else(|| SpecError::Unsupported {
                        what: format!("{what}: fieldRef {:?}", field.field_path),
                    })?
                } else if let Some(selector) = &from.resource_field_ref {
                    resource_value(pod, container, selector, cfg)?
                } else if let Some(r) = &from.config_map_key_ref {
                    let optional = r.optional == Some(true);
                    let Some(cm) = objects.config_map(namespace, &r.name) else {
                        if optional {
                            continue;
                        }
                        return Err(missing(
                            "configmap",
                            namespace,
                            &r.name,
                            &format!("{what} reads its key {:?}", r.key),
                        ));
                    };
                    match cm.data.as_ref().and_then(|d| d.get(&r.key)) {
                        Some(value) => value.clone(),
                        None if optional => continue,
                        None => return Err(missing_key("ConfigMap", namespace, &r.name, &r.key, &what)),
                    }
                } else if let Some(r) = &from.secret_key_ref {
                    let optional = r.optional == Some(true);
                    let Some(secret) = objects.secret(namespace, &r.name) else {
                        if optional {
                            continue;
                        }
                        return Err(missing(
                            "secret",
                            namespace,
                            &r.name,
                            &format!("{what} reads its key {:?}", r.key),
                        ));
                    };
                    match secret.data.as_ref().and_then(|d| d.get(&r.key)) {
                        Some(value) => secret_text(&value.0),
                        None if optional => continue,
                        None => return Err(missing_key("Secret", namespace, &r.name, &r.key, &what)),
                    }
                } else {
                    String::new()
                }
            }
            _ => String::new(),
        };
        set(&mut envs, var.name.clone(), value);
    }
    for (name, value) in service_env {
        if !envs.iter().any(|(k, _)| *k == name) {
            envs.push((name, value));
        }
    }
    Ok(envs)
}

/// A container resource as the downward API gives it (`resourceFieldRef`): the quantity divided
/// by the divisor (default 1), rounded up. A limit the container does not set is the node's
/// allocatable, as the kubelet merges it; a request it does not set is its limit if it has one
/// (the API server's defaulting), else 0.
pub fn resource_value(
    pod: &Pod,
    container: &Container,
    selector: &ResourceFieldSelector,
    cfg: &RuntimeConfig,
) -> Result<String, SpecError> {
    let target = match selector.container_name.as_deref().filter(|n| !n.is_empty()) {
        Some(name) => pod
            .spec
            .iter()
            .flat_map(|s| s.containers.iter().chain(s.init_containers.iter().flatten()))
            .find(|c| c.name == name)
            .ok_or_else(|| SpecError::Unsupported {
                what: format!("resourceFieldRef of unknown container {name:?}"),
            })?,
        None => container,
    };
    let bad = |what: String| SpecError::Unsupported { what };
    let (list, resource) = selector
        .resource
        .split_once('.')
        .ok_or_else(|| bad(format!("resourceFieldRef resource {:?}", selector.resource)))?;
    let cpu = match resource {
        "cpu" => true,
        "memory" => false,
        _ => return Err(bad(format!("resourceFieldRef resource {:?}", selector.resource))),
    };
    let parse = |text: &str| if cpu { parse_milli(text) } else { parse_units(text) };
    let quantity_of = |list: &str| -> Result<Option<i128>, SpecError> {
        let resources = target.resources.as_ref();
        let map = match list {
            "limits" => resources.and_then(|r| r.limits.as_ref()),
            _ => resources.and_then(|r| r.requests.as_ref()),
        };
        match map.and_then(|m| m.get(resource)) {
            Some(q) => parse(&q.0)
                .map(Some)
                .ok_or_else(|| SpecError::InvalidQuantity { field: format!("{list}.{resource}"), value: q.0.clone() }),
            None => Ok(None),
        }
    };
    let node = if cpu { cfg.node_cpu_milli.map(i128::from) } else { cfg.node_memory_bytes.map(i128::from) };
    let value = match list {
        "limits" => quantity_of("limits")?.or(node).unwrap_or(0),
        "requests" => quantity_of("requests")?.or(quantity_of("limits")?).unwrap_or(0),
        _ => return Err(bad(format!("resourceFieldRef resource {:?}", selector.resource))),
    };
    let divisor = match selector.divisor.as_ref().map(|d| d.0.as_str()).filter(|d| !d.is_empty()) {
        Some(text) => parse(text).filter(|d| *d > 0).ok_or_else(|| SpecError::InvalidQuantity {
            field: format!("resourceFieldRef {} divisor", selector.resource),
            value: text.to_owned(),
        })?,
        None if cpu => 1000,
        None => 1,
    };
    Ok(((value + divisor - 1).div_euclid(divisor)).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use serde_json::json;
    use std::collections::BTreeMap;

    #[derive(Default)]
    struct Objects {
        config_maps: HashMap<String, Arc<ConfigMap>>,
        secrets: HashMap<String, Arc<Secret>>,
    }

    impl ConfigSource for Objects {
        fn config_map(&self, namespace: &str, name: &str) -> Option<Arc<ConfigMap>> {
            self.config_maps.get(&format!("{namespace}/{name}")).cloned()
        }
        fn secret(&self, namespace: &str, name: &str) -> Option<Arc<Secret>> {
            self.secrets.get(&format!("{namespace}/{name}")).cloned()
        }
    }

    fn objects() -> Objects {
        let cm = ConfigMap {
            data: Some(BTreeMap::from([
                ("mode".into(), "fast".into()),
                ("LEVEL".into(), "debug".into()),
                ("1bad".into(), "skipped".into()),
            ])),
            ..Default::default()
        };
        let secret = Secret {
            data: Some(BTreeMap::from([("password".into(), ByteString(b"hunter2".to_vec()))])),
            ..Default::default()
        };
        Objects {
            config_maps: HashMap::from([("shop/app".into(), Arc::new(cm))]),
            secrets: HashMap::from([("shop/db".into(), Arc::new(secret))]),
        }
    }

    fn pod(container: serde_json::Value) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "u-1"},
            "spec": {"containers": [container]},
        }))
        .unwrap()
    }

    fn env_of(container: serde_json::Value, cfg: &RuntimeConfig) -> Result<Vec<(String, String)>, String> {
        let pod = pod(container);
        let c = &pod.spec.as_ref().unwrap().containers[0];
        environment(&pod, c, cfg, &[], &objects()).map_err(|e| e.to_string())
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn env_from_then_env_with_references() {
        let got = env_of(
            json!({"name": "c", "image": "i", "envFrom": [
                {"configMapRef": {"name": "app"}},
                {"secretRef": {"name": "db"}, "prefix": "DB_"},
                {"configMapRef": {"name": "absent", "optional": true}}
            ], "env": [
                {"name": "PW", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}},
                {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "app", "key": "mode"}}},
                {"name": "URL", "value": "db://$(DB_password)@$(MODE)"},
                {"name": "GONE", "valueFrom": {"configMapKeyRef": {"name": "app", "key": "nope", "optional": true}}},
                {"name": "NONE", "valueFrom": {"secretKeyRef": {"name": "absent", "key": "k", "optional": true}}},
                {"name": "LEVEL", "value": "info"}
            ]}),
            &RuntimeConfig::default(),
        )
        .unwrap();
        assert_eq!(
            got,
            pairs(&[
                ("LEVEL", "info"),
                ("mode", "fast"),
                ("DB_password", "hunter2"),
                ("PW", "hunter2"),
                ("MODE", "fast"),
                ("URL", "db://hunter2@fast"),
            ])
        );
    }

    #[test]
    fn the_kubernetes_service_comes_last_unless_defined() {
        let cfg =
            RuntimeConfig { kubernetes_service: Some(std::net::Ipv4Addr::new(10, 96, 0, 1)), ..Default::default() };
        let cases = [
            (json!([]), vec![], "10.96.0.1"),
            (
                json!([{"name": "API", "value": "https://$(KUBERNETES_SERVICE_HOST):$(KUBERNETES_SERVICE_PORT)"}]),
                vec![("API", "https://10.96.0.1:443")],
                "10.96.0.1",
            ),
            (
                json!([{"name": "KUBERNETES_SERVICE_HOST", "value": "api.example"}]),
                vec![("KUBERNETES_SERVICE_HOST", "api.example")],
                "api.example",
            ),
        ];
        for (env, first, host) in cases {
            let got = env_of(json!({"name": "c", "image": "i", "env": env}), &cfg).unwrap();
            assert_eq!(got[..first.len()], pairs(&first)[..], "{env}");
            let value = |name: &str| got.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
            assert_eq!(value("KUBERNETES_SERVICE_HOST"), Some(host), "{env}");
            assert_eq!(value("KUBERNETES_PORT_443_TCP"), Some("tcp://10.96.0.1:443"), "{env}");
            assert_eq!(value("KUBERNETES_SERVICE_PORT_HTTPS"), Some("443"), "{env}");
            assert_eq!(got.len(), first.len() + 8 - usize::from(host != "10.96.0.1"), "{env}");
        }
        assert!(env_of(json!({"name": "c", "image": "i"}), &RuntimeConfig::default()).unwrap().is_empty());
    }

    #[test]
    fn missing_objects_and_keys_name_what_is_missing() {
        let cfg = RuntimeConfig::default();
        let err = env_of(
            json!({"name": "c", "env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "nope", "key": "k"}}}]}),
            &cfg,
        )
        .unwrap_err();
        assert!(err.starts_with("configmap \"shop/nope\" not found (env \"X\" reads its key \"k\")"), "{err}");
        let err = env_of(
            json!({"name": "c", "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "db", "key": "user"}}}]}),
            &cfg,
        )
        .unwrap_err();
        assert!(err.starts_with("couldn't find key user in Secret shop/db (env \"X\")"), "{err}");
        assert!(!err.contains("hunter2"));
        let err = env_of(json!({"name": "c", "envFrom": [{"secretRef": {"name": "nope"}}]}), &cfg).unwrap_err();
        assert!(err.starts_with("secret \"shop/nope\" not found (container \"c\" envFrom[0])"), "{err}");
    }

    #[test]
    fn resource_fields_divide_and_default_to_the_node() {
        let cfg = RuntimeConfig { node_cpu_milli: Some(2000), node_memory_bytes: Some(8 << 30), ..Default::default() };
        let got = env_of(
            json!({"name": "c", "resources": {"limits": {"memory": "64Mi"}, "requests": {"cpu": "250m"}}, "env": [
                {"name": "CPU_LIMIT", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
                {"name": "CPU_REQ", "valueFrom": {"resourceFieldRef": {"resource": "requests.cpu"}}},
                {"name": "CPU_REQ_M", "valueFrom": {"resourceFieldRef": {"resource": "requests.cpu", "divisor": "1m"}}},
                {"name": "MEM_LIMIT_MI", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
                {"name": "MEM_REQ", "valueFrom": {"resourceFieldRef": {"resource": "requests.memory"}}}
            ]}),
            &cfg,
        )
        .unwrap();
        assert_eq!(
            got,
            pairs(&[
                ("CPU_LIMIT", "2"),
                ("CPU_REQ", "1"),
                ("CPU_REQ_M", "250"),
                ("MEM_LIMIT_MI", "64"),
                ("MEM_REQ", "67108864"),
            ])
        );
    }

    #[test]
    fn variable_names() {
        for good in ["A", "a_b", "-x", ".x", "A1.b-c"] {
            assert!(is_env_var_name(good), "{good}");
        }
        for bad in ["", "1a", "a b", "a=b", "ä"] {
            assert!(!is_env_var_name(bad), "{bad}");
        }
    }
}
