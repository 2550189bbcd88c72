//! Field selectors (`?fieldSelector=status.phase=Pending,spec.nodeName!=n1`), with the fields
//! Kubernetes supports per kind (its `GetAttrs` / `AddFieldLabelConversionFunc` lists). Pure:
//! parse, check against a kind, match JSON objects.
//!
//! An unsupported field is refused with the list of supported ones, as a 400: a selector that
//! silently selected everything would hand a `status.phase=Pending` caller Running Pods.

use serde_json::Value;

/// One `field=value` (or `==`) / `field!=value` term.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Requirement {
    pub field: String,
    pub value: String,
    pub equal: bool,
}

/// Every term must hold; the empty selector matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FieldSelector(pub Vec<Requirement>);

/// The fields every kind supports.
const META: &[&str] = &["metadata.name", "metadata.namespace"];

/// The fields a kind supports beyond [`META`].
fn kind_fields(kind: &str) -> &'static [&'static str] {
    match kind {
        "Pod" => &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        "Event" => &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        "Secret" => &["type"],
        "Node" => &["spec.unschedulable"],
        "Namespace" => &["status.phase"],
        "ReplicaSet" => &["status.replicas"],
        "Job" => &["status.successful"],
        _ => &[],
    }
}

fn supported(kind: &str) -> impl Iterator<Item = &'static str> {
    META.iter().chain(kind_fields(kind)).copied()
}

/// Splits on `sep` outside backslash escapes.
fn split_unescaped(text: &str, sep: char) -> Vec<&str> {
    let (mut parts, mut start, mut escaped) = (Vec::new(), 0, false);
    for (i, c) in text.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            c if c == sep => {
                parts.push(&text[start..i]);
                start = i + c.len_utf8();
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

/// `\,` `\=` `\\` -> `,` `=` `\`; any other escape is malformed, as in Kubernetes.
fn unescape(text: &str) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some(e @ (',' | '=' | '\\')) => out.push(e),
            Some(e) => return Err(format!("invalid escape sequence \\{e} in {text:?}")),
            None => return Err(format!("a trailing backslash in {text:?}")),
        }
    }
    Ok(out)
}

/// The first unescaped operator of a term: (field, operator, value).
fn split_term(term: &str) -> Option<(&str, &'static str, &str)> {
    let mut escaped = false;
    for (i, c) in term.char_indices() {
        if escaped {
            escaped = false;
            continue;
        }
        if c == '\\' {
            escaped = true;
            continue;
        }
        for op in ["!=", "==", "="] {
            if term[i..].starts_with(op) {
                return Some((&term[..i], op, &term[i + op.len()..]));
            }
        }
    }
    None
}

impl FieldSelector {
    /// The syntax only; [`FieldSelector::check`] holds it against a kind.
    pub fn parse(text: &str) -> Result<FieldSelector, String> {
        if text.trim().is_empty() {
            return Ok(FieldSelector::default());
        }
        let mut requirements = Vec::new();
        for term in split_unescaped(text, ',') {
            let Some((field, op, value)) = split_term(term) else {
                return Err(format!(
                    "invalid field selector {text:?}: {term:?} is not field=value, field==value or field!=value"
                ));
            };
            let field = field.trim();
            if field.is_empty() {
                return Err(format!("invalid field selector {text:?}: {term:?} names no field"));
            }
            let value = unescape(value).map_err(|e| format!("invalid field selector {text:?}: {e}"))?;
            requirements.push(Requirement { field: field.to_owned(), value, equal: op != "!=" });
        }
        Ok(FieldSelector(requirements))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Refuses a field `kind` does not support, naming it and the supported ones.
    pub fn check(&self, kind: &str) -> Result<(), String> {
        match self.0.iter().find(|r| !supported(kind).any(|f| f == r.field)) {
            Some(r) => Err(format!(
                "field label not supported: {} (field selectors on {kind} support {})",
                r.field,
                supported(kind).collect::<Vec<_>>().join(", ")
            )),
            None => Ok(()),
        }
    }

    /// Whether `object` (of a kind the selector was checked against) satisfies every term.
    pub fn matches(&self, object: &Value) -> bool {
        self.0.iter().all(|r| (value(object, &r.field) == r.value) == r.equal)
    }

    /// Adds `metadata.name=name` (a watch on one object's path).
    pub fn with_name(mut self, name: &str) -> FieldSelector {
        self.0.push(Requirement { field: "metadata.name".into(), value: name.into(), equal: true });
        self
    }
}

fn text(object: &Value, pointer: &str, default: &str) -> String {
    object.pointer(pointer).and_then(Value::as_str).filter(|s| !s.is_empty()).unwrap_or(default).to_owned()
}

/// A field's value as Kubernetes' field set has it: missing strings are empty (or the default the
/// API server would have stored), numbers and booleans in decimal and `true`/`false`.
fn value(object: &Value, field: &str) -> String {
    let kind = object["kind"].as_str().unwrap_or("");
    match (kind, field) {
        (_, "metadata.name") => text(object, "/metadata/name", ""),
        (_, "metadata.namespace") => text(object, "/metadata/namespace", ""),
        ("Pod", "spec.restartPolicy") => text(object, "/spec/restartPolicy", "Always"),
        ("Pod", "spec.schedulerName") => text(object, "/spec/schedulerName", "default-scheduler"),
        ("Pod", "spec.serviceAccountName") => text(object, "/spec/serviceAccountName", "default"),
        ("Pod", "status.phase") => text(object, "/status/phase", "Pending"),
        ("Event", "source") => {
            let component = text(object, "/source/component", "");
            if component.is_empty() { text(object, "/reportingComponent", "") } else { component }
        }
        ("Secret", "type") => text(object, "/type", "Opaque"),
        ("Namespace", "status.phase") => text(object, "/status/phase", "Active"),
        ("Node", "spec.unschedulable") => {
            object.pointer("/spec/unschedulable").and_then(Value::as_bool).unwrap_or(false).to_string()
        }
        ("ReplicaSet", "status.replicas") | ("Job", "status.successful") => {
            let pointer = format!("/{}", field.replace('.', "/"));
            object.pointer(&pointer).and_then(Value::as_i64).unwrap_or(0).to_string()
        }
        (_, field) => text(object, &format!("/{}", field.replace('.', "/")), ""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, phase: &str, node: &str) -> Value {
        json!({"kind": "Pod", "metadata": {"name": name, "namespace": "a"},
               "spec": {"nodeName": node}, "status": {"phase": phase}})
    }

    #[test]
    fn parses_every_operator_and_and_matches_pods() {
        let s = FieldSelector::parse("status.phase=Pending,spec.nodeName!=n2,metadata.name==p").unwrap();
        assert_eq!(s.0.len(), 3);
        s.check("Pod").unwrap();
        assert!(s.matches(&pod("p", "Pending", "n1")));
        assert!(!s.matches(&pod("p", "Running", "n1")));
        assert!(!s.matches(&pod("p", "Pending", "n2")));
        assert!(!s.matches(&pod("q", "Pending", "n1")));
        // An unscheduled Pod has the empty node name, as in Kubernetes.
        let unscheduled = FieldSelector::parse("spec.nodeName=").unwrap();
        assert!(unscheduled.matches(&json!({"kind": "Pod", "spec": {}})));
        assert!(FieldSelector::parse("").unwrap().matches(&pod("x", "Running", "n")));
    }

    #[test]
    fn defaults_numbers_booleans_and_escapes() {
        let secret = json!({"kind": "Secret", "metadata": {"name": "s"}});
        assert!(FieldSelector::parse("type=Opaque").unwrap().matches(&secret));
        let node = json!({"kind": "Node", "spec": {"unschedulable": true}});
        assert!(FieldSelector::parse("spec.unschedulable=true").unwrap().matches(&node));
        assert!(FieldSelector::parse("spec.unschedulable=false").unwrap().matches(&json!({"kind": "Node"})));
        let rs = json!({"kind": "ReplicaSet", "status": {"replicas": 3}});
        assert!(FieldSelector::parse("status.replicas=3").unwrap().matches(&rs));
        assert!(FieldSelector::parse("status.replicas!=0").unwrap().matches(&rs));
        let event = json!({"kind": "Event", "involvedObject": {"kind": "Pod", "name": "a,b"},
                           "reportingComponent": "scheduler"});
        assert!(FieldSelector::parse(r"involvedObject.name=a\,b,source=scheduler").unwrap().matches(&event));
        assert_eq!(FieldSelector::parse(r"a=x\=y").unwrap().0[0].value, "x=y");
    }

    #[test]
    fn refuses_malformed_and_unsupported_selectors_naming_the_field() {
        for bad in ["status.phase", "=Pending", "a=b,c", r"a=b\", r"a=\q", ","] {
            assert!(FieldSelector::parse(bad).is_err(), "{bad}");
        }
        let unsupported = FieldSelector::parse("spec.containers=x").unwrap().check("Pod").unwrap_err();
        assert!(unsupported.starts_with("field label not supported: spec.containers"), "{unsupported}");
        assert!(unsupported.contains("status.phase") && unsupported.contains("spec.nodeName"), "{unsupported}");
        assert!(FieldSelector::parse("status.phase=Running").unwrap().check("ConfigMap").is_err());
        FieldSelector::parse("metadata.namespace=a").unwrap().check("ConfigMap").unwrap();
        FieldSelector::parse("involvedObject.uid=u,type=Warning").unwrap().check("Event").unwrap();
    }
}
