//! A Service's named targetPort that none of the Pods it selects in the same commit declares:
//! Kubernetes accepts it and the Service silently gets no endpoints for that port; a typo is
//! better caught at the commit. Only Pods whose template is in the commit are looked at: a
//! Service that selects nothing here (its Pods come from elsewhere) is not checked.

use super::{Accepted, object_label};
use crate::error::ManifestError;
use serde_json::Value;

/// (position in `accepted`, error) for every named targetPort no selected Pod template names.
pub(crate) fn unknown_target_ports(accepted: &[&Accepted]) -> Vec<(usize, ManifestError)> {
    let named = |a: &&Accepted| {
        a.manifest.key.kind == "Service"
            && a.manifest
                .value
                .pointer("/spec/ports")
                .and_then(Value::as_array)
                .is_some_and(|ports| ports.iter().any(|p| p.get("targetPort").is_some_and(Value::is_string)))
    };
    // Almost every commit has no Service with a named port: nothing more to do.
    if !accepted.iter().any(named) {
        return Vec::new();
    }
    let templates: Vec<(&str, &Value, &Value)> = accepted.iter().filter_map(|a| pod_template(a)).collect();
    let mut errors = Vec::new();
    for (position, service) in accepted.iter().enumerate().filter(|(_, a)| named(a)) {
        let (m, namespace) = (&service.manifest, service.manifest.key.namespace.as_str());
        let Some(selector) = m.value.pointer("/spec/selector").and_then(Value::as_object).filter(|s| !s.is_empty())
        else {
            continue;
        };
        let selected: Vec<&Value> = templates
            .iter()
            .filter(|(ns, labels, _)| {
                *ns == namespace && selector.iter().all(|(k, v)| labels.get(k).is_some_and(|l| l == v))
            })
            .map(|(_, _, spec)| *spec)
            .collect();
        if selected.is_empty() {
            continue;
        }
        let declared: Vec<&str> = selected.iter().flat_map(|spec| port_names(spec)).collect();
        let ports = m.value.pointer("/spec/ports").and_then(Value::as_array).into_iter().flatten();
        for (i, port) in ports.enumerate() {
            let Some(name) = port.get("targetPort").and_then(Value::as_str) else { continue };
            if declared.contains(&name) {
                continue;
            }
            let path = format!("/spec/ports/{i}/targetPort");
            let known = if declared.is_empty() { "none".to_owned() } else { declared.join(", ") };
            errors.push((
                position,
                ManifestError {
                    file: m.file.clone(),
                    line: Some(service.locator.lines().line_of(&path)),
                    column: None,
                    document: Some(m.index),
                    object: object_label(&m.value),
                    path: Some(path),
                    message: format!(
                        "targetPort {name:?} is not the name of a container port of the Pods this Service selects \
                         (their named ports: {known}): name the port in the Pod template, or use its number"
                    ),
                },
            ));
        }
    }
    errors
}

/// (position in `accepted`, error) for every Endpoints written for a Service of the commit that
/// has a selector: Kubernetes' endpoints controller replaces such addresses with the selected
/// Pods' (and gitplane's leaves them alone, so they would route nowhere). Hand-written Endpoints
/// are for a Service without a selector.
pub(crate) fn selected_service_endpoints(accepted: &[&Accepted]) -> Vec<(usize, ManifestError)> {
    if !accepted.iter().any(|a| a.manifest.key.kind == "Endpoints") {
        return Vec::new();
    }
    let mut errors = Vec::new();
    for (position, endpoints) in accepted.iter().enumerate().filter(|(_, a)| a.manifest.key.kind == "Endpoints") {
        let key = &endpoints.manifest.key;
        let selecting = accepted.iter().any(|a| {
            a.manifest.key.kind == "Service"
                && a.manifest.key.namespace == key.namespace
                && a.manifest.key.name == key.name
                && a.manifest.value.pointer("/spec/selector").and_then(Value::as_object).is_some_and(|s| !s.is_empty())
        });
        if !selecting {
            continue;
        }
        let m = &endpoints.manifest;
        errors.push((
            position,
            ManifestError {
                file: m.file.clone(),
                line: Some(endpoints.locator.lines().line_of("/subsets")),
                column: None,
                document: Some(m.index),
                object: object_label(&m.value),
                path: Some("/subsets".into()),
                message: format!(
                    "Service {} has a selector, so its Endpoints are the selected Pods' (Kubernetes' endpoints \
                     controller overwrites these addresses): remove this Endpoints, or the Service's selector to \
                     route to these addresses",
                    key.name
                ),
            },
        ));
    }
    errors
}

/// (namespace, Pod labels, Pod spec) of a Pod or of a workload's Pod template.
fn pod_template(a: &Accepted) -> Option<(&str, &Value, &Value)> {
    let (key, value) = (&a.manifest.key, &a.manifest.value);
    let template = if key.kind == "Pod" { value } else { value.pointer("/spec/template")? };
    Some((key.namespace.as_str(), template.pointer("/metadata/labels")?, template.get("spec")?))
}

/// The names of a Pod spec's container ports (init containers too: sidecars serve).
fn port_names(spec: &Value) -> impl Iterator<Item = &str> {
    ["containers", "initContainers"]
        .into_iter()
        .filter_map(|field| spec.get(field).and_then(Value::as_array))
        .flatten()
        .filter_map(|c| c.get("ports").and_then(Value::as_array))
        .flatten()
        .filter_map(|p| p.get("name").and_then(Value::as_str))
}
