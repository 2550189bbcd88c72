//! The score weights of `gitplane up --scheduler-config FILE`: a small YAML modelled on
//! kube-scheduler's `KubeSchedulerConfiguration`, of which only
//! `profiles[0].plugins.score.enabled[{name, weight}]` is read. A plugin listed there gets its
//! weight; the others keep their defaults (kube-scheduler's). Anything else in the file is
//! refused with its path, so that no setting is silently ignored.

use crate::plugins::{DEFAULT_PLUGINS, Plugin, registry};
use serde::{Deserialize, de::IgnoredAny};

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Configuration {
    #[serde(default, rename = "apiVersion")]
    _api_version: Option<IgnoredAny>,
    #[serde(default, rename = "kind")]
    _kind: Option<IgnoredAny>,
    #[serde(default)]
    profiles: Vec<ProfileConfig>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ProfileConfig {
    #[serde(default, rename = "schedulerName")]
    _scheduler_name: Option<IgnoredAny>,
    #[serde(default)]
    plugins: Option<Plugins>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Plugins {
    #[serde(default)]
    score: Option<PluginSet>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PluginSet {
    #[serde(default)]
    enabled: Vec<PluginRef>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PluginRef {
    name: String,
    #[serde(default)]
    weight: Option<i64>,
}

/// kube-scheduler's names of the score plugins gitplane names after their strategy.
fn score_plugin_name(name: &str) -> &str {
    match name {
        "NodeResourcesFit" => "LeastAllocated",
        "NodeResourcesBalancedAllocation" => "BalancedAllocation",
        other => other,
    }
}

/// The default profile's plugins with the weights `yaml` gives (`file` names it in errors), for
/// `Profile::from_names`.
pub fn plugins_from_yaml(file: &str, yaml: &str) -> Result<Vec<(&'static str, i64)>, String> {
    let config: Configuration = serde_yaml::from_str(yaml)
        .map_err(|e| format!("{file}: {e}: write profiles[0].plugins.score.enabled[{{name, weight}}]"))?;
    if config.profiles.len() > 1 {
        return Err(format!("{file}: profiles: gitplane runs one scheduler profile; keep only the first"));
    }
    let enabled = config.profiles.into_iter().next().and_then(|p| p.plugins?.score);
    let mut plugins = DEFAULT_PLUGINS.to_vec();
    for (i, plugin) in enabled.into_iter().flat_map(|s| s.enabled).enumerate() {
        let at = format!("{file}: profiles[0].plugins.score.enabled[{i}]");
        let name = score_plugin_name(&plugin.name);
        let scores = matches!(registry(name), Some(Plugin::Score(_) | Plugin::FilterAndScore(..)));
        let Some(slot) = plugins.iter_mut().find(|(n, _)| *n == name).filter(|_| scores) else {
            let known: Vec<&str> = DEFAULT_PLUGINS
                .iter()
                .map(|(n, _)| *n)
                .filter(|n| matches!(registry(n), Some(Plugin::Score(_) | Plugin::FilterAndScore(..))))
                .collect();
            return Err(format!("{at}: {:?} is not a score plugin: use one of {}", plugin.name, known.join(", ")));
        };
        match plugin.weight {
            Some(weight) if !(1..=100).contains(&weight) => {
                return Err(format!(
                    "{at}: weight {weight} is out of range: give 1 to 100, or leave it out for {}",
                    slot.1
                ));
            }
            Some(weight) => slot.1 = weight,
            None => {}
        }
    }
    Ok(plugins)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_from_a_configuration() {
        let yaml = "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nprofiles:\n- schedulerName: default-scheduler\n  plugins:\n    score:\n      enabled:\n      - {name: NodeAffinity, weight: 10}\n      - {name: NodeResourcesFit, weight: 5}\n      - {name: ImageLocality}\n";
        let plugins = plugins_from_yaml("s.yaml", yaml).unwrap();
        let (_, scores) = crate::Profile::from_names(&plugins).unwrap().plugins();
        let weight = |name: &str| scores.iter().find(|(n, _)| *n == name).map(|(_, w)| *w);
        assert_eq!(weight("NodeAffinity"), Some(10));
        assert_eq!(weight("LeastAllocated"), Some(5));
        assert_eq!(weight("ImageLocality"), Some(1));
        assert_eq!(weight("TaintToleration"), Some(3));
        assert_eq!(weight("InterPodAffinity"), Some(2));
    }

    #[test]
    fn bad_files_say_what_to_write() {
        for (yaml, expected) in [
            (
                "profiles: [{plugins: {score: {enabled: [{name: Nope, weight: 1}]}}}]",
                "s.yaml: profiles[0].plugins.score.enabled[0]: \"Nope\" is not a score plugin: use one of NodeAffinity, TaintToleration, PodTopologySpread, InterPodAffinity, LeastAllocated, BalancedAllocation, ImageLocality",
            ),
            ("profiles: [{plugins: {score: {enabled: [{name: NodePorts}]}}}]", "\"NodePorts\" is not a score plugin"),
            (
                "profiles: [{plugins: {score: {enabled: [{name: NodeAffinity, weight: 0}]}}}]",
                "weight 0 is out of range: give 1 to 100, or leave it out for 2",
            ),
            ("profiles: [{plugins: {filter: {disabled: [{name: NodePorts}]}}}]", "unknown field `filter`"),
            ("profiles: [{}, {}]", "gitplane runs one scheduler profile"),
        ] {
            let err = plugins_from_yaml("s.yaml", yaml).unwrap_err();
            assert!(err.contains(expected), "{yaml}: {err}");
        }
    }
}
