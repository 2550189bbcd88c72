//! Label selectors in Kubernetes' string form: `app=web,tier!=db,env in (a,b),!legacy,track`.

use serde_json::Value;
use std::collections::BTreeSet;

/// One requirement of a selector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, BTreeSet<String>),
    NotIn(String, BTreeSet<String>),
    Exists(String),
    DoesNotExist(String),
}

/// A parsed selector: every requirement must hold. The empty selector matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selector(pub Vec<Requirement>);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid label selector {selector:?}: {reason}")]
pub struct SelectorError {
    pub selector: String,
    pub reason: String,
}

fn valid_key(key: &str) -> bool {
    let name = key.rsplit_once('/').map_or(key, |(_, n)| n);
    !name.is_empty()
        && name.len() <= 63
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

fn valid_value(value: &str) -> bool {
    value.len() <= 63 && value.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// Splits on commas that are not inside parentheses.
fn split_top(text: &str) -> Vec<&str> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

impl Selector {
    pub fn parse(text: &str) -> Result<Selector, SelectorError> {
        let fail = |reason: &str| SelectorError { selector: text.to_owned(), reason: reason.to_owned() };
        if text.trim().is_empty() {
            return Ok(Selector::default());
        }
        let mut requirements = Vec::new();
        for part in split_top(text) {
            let part = part.trim();
            let requirement = if let Some(key) = part.strip_prefix('!') {
                Requirement::DoesNotExist(key.trim().to_owned())
            } else if let Some((key, value)) = part.split_once("!=") {
                Requirement::NotEquals(key.trim().to_owned(), value.trim().to_owned())
            } else if let Some((key, value)) = part.split_once("==").or_else(|| part.split_once('=')) {
                Requirement::Equals(key.trim().to_owned(), value.trim().to_owned())
            } else if let Some((key, set, negated)) = set_requirement(part) {
                let values: BTreeSet<String> = set.split(',').map(|v| v.trim().to_owned()).collect();
                if values.iter().any(|v| !valid_value(v)) {
                    return Err(fail(&format!("invalid value in {part:?}")));
                }
                if negated { Requirement::NotIn(key, values) } else { Requirement::In(key, values) }
            } else {
                Requirement::Exists(part.to_owned())
            };
            let (key, value) = match &requirement {
                Requirement::Equals(k, v) | Requirement::NotEquals(k, v) => (k, Some(v)),
                Requirement::In(k, _)
                | Requirement::NotIn(k, _)
                | Requirement::Exists(k)
                | Requirement::DoesNotExist(k) => (k, None),
            };
            if !valid_key(key) {
                return Err(fail(&format!("invalid label key {key:?}")));
            }
            if value.is_some_and(|v| !valid_value(v)) {
                return Err(fail(&format!("invalid label value in {part:?}")));
            }
            requirements.push(requirement);
        }
        Ok(Selector(requirements))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether an object's `metadata.labels` satisfy every requirement.
    pub fn matches(&self, object: &Value) -> bool {
        let labels = &object["metadata"]["labels"];
        let label = |k: &str| labels.get(k).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            Requirement::Equals(k, v) => label(k) == Some(v.as_str()),
            Requirement::NotEquals(k, v) => label(k) != Some(v.as_str()),
            Requirement::In(k, vs) => label(k).is_some_and(|l| vs.contains(l)),
            Requirement::NotIn(k, vs) => label(k).is_none_or(|l| !vs.contains(l)),
            Requirement::Exists(k) => label(k).is_some(),
            Requirement::DoesNotExist(k) => label(k).is_none(),
        })
    }
}

/// `key in (a,b)` / `key notin (a,b)` -> (key, "a,b", negated).
fn set_requirement(part: &str) -> Option<(String, &str, bool)> {
    let open = part.find('(')?;
    let inner = part[open + 1..].strip_suffix(')')?;
    let head = part[..open].trim();
    let (key, negated) =
        if let Some(k) = head.strip_suffix(" notin") { (k, true) } else { (head.strip_suffix(" in")?, false) };
    Some((key.trim().to_owned(), inner, negated))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"labels": labels}})
    }

    #[test]
    fn parses_and_matches_every_form() {
        let s = Selector::parse("app=web, tier!=db,env in (prod, staging),!legacy,track,x==y").unwrap();
        assert_eq!(s.0.len(), 6);
        assert!(s.matches(&obj(json!({"app": "web", "tier": "front", "env": "prod", "track": "1", "x": "y"}))));
        assert!(!s.matches(&obj(json!({"app": "web", "env": "dev", "track": "1", "x": "y"}))));
        assert!(!s.matches(&obj(json!({"app": "web", "env": "prod", "track": "1", "x": "y", "legacy": "true"}))));
        let notin = Selector::parse("env notin (prod)").unwrap();
        assert!(notin.matches(&obj(json!({}))) && !notin.matches(&obj(json!({"env": "prod"}))));
        assert!(Selector::parse("").unwrap().matches(&json!({})));
    }

    #[test]
    fn rejects_malformed_selectors() {
        for bad in ["a=b c", "=x", "a in (b c)", "app=web!"] {
            assert!(Selector::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(
            Selector::parse("=x").unwrap_err().to_string(),
            "invalid label selector \"=x\": invalid label key \"\""
        );
    }
}
