//! Label selectors (`matchLabels` and `matchExpressions`) matched against a label map, as the
//! API machinery's `LabelSelectorAsSelector` does. An empty selector matches everything; an
//! unknown operator matches nothing (the API server would have refused it).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use std::collections::BTreeMap;

pub type Labels = BTreeMap<String, String>;

pub fn matches(selector: &LabelSelector, labels: &Labels) -> bool {
    let by_labels = selector.match_labels.iter().flatten().all(|(k, v)| labels.get(k) == Some(v));
    by_labels
        && selector.match_expressions.iter().flatten().all(|e| {
            let value = labels.get(&e.key);
            let listed = || value.is_some_and(|v| e.values.iter().flatten().any(|x| x == v));
            match e.operator.as_str() {
                "In" => listed(),
                "NotIn" => !listed(),
                "Exists" => value.is_some(),
                "DoesNotExist" => value.is_none(),
                _ => false,
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn match_labels_and_expressions() {
        let labels: Labels = [("app".into(), "web".into()), ("tier".into(), "front".into())].into();
        for (selector, expected) in [
            (json!({}), true),
            (json!({"matchLabels": {"app": "web"}}), true),
            (json!({"matchLabels": {"app": "db"}}), false),
            (json!({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["front", "back"]}]}), true),
            (json!({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["front"]}]}), false),
            (json!({"matchExpressions": [{"key": "env", "operator": "NotIn", "values": ["prod"]}]}), true),
            (json!({"matchExpressions": [{"key": "env", "operator": "Exists"}]}), false),
            (json!({"matchExpressions": [{"key": "env", "operator": "DoesNotExist"}]}), true),
            (json!({"matchLabels": {"app": "web"}, "matchExpressions": [{"key": "tier", "operator": "Exists"}]}), true),
            (json!({"matchExpressions": [{"key": "app", "operator": "Gt", "values": ["1"]}]}), false),
        ] {
            let s: LabelSelector = serde_json::from_value(selector.clone()).unwrap();
            assert_eq!(matches(&s, &labels), expected, "{selector}");
        }
    }
}
