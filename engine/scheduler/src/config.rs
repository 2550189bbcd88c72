//! `gitplane up --scheduler-config FILE`: a small YAML modelled on kube-scheduler's
//! `KubeSchedulerConfiguration`, of which only `percentageOfNodesToScore` (at the top or in the
//! profile, which wins) and `profiles[0].plugins.score.enabled[{name, weight}]` are read. A
//! plugin listed there gets its weight; the others keep their defaults (kube-scheduler's).
//! Anything else in the file is refused with its path, so that no setting is silently ignored.

use crate::framework::{Profile, ScheduleError};
use crate::plugins::{DEFAULT_PLUGINS, Plugin, registry};
use serde::{Deserialize, de::IgnoredAny};

/// What the scheduler runs with: its plugins with their score weights, and how many of the
/// nodes a cycle looks at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SchedulerConfig {
    pub plugins: Vec<(&'static str, i64)>,
    /// percentageOfNodesToScore, 0 for the adaptive default.
    pub percentage_of_nodes_to_score: u32,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig { plugins: DEFAULT_PLUGINS.to_vec(), percentage_of_nodes_to_score: 0 }
    }
}

impl SchedulerConfig {
    pub fn profile(&self) -> Result<Profile, ScheduleError> {
        Ok(Profile::from_names(&self.plugins)?.with_percentage_of_nodes_to_score(self.percentage_of_nodes_to_score))
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Configuration {
    #[serde(default, rename = "apiVersion")]
    _api_version: Option<IgnoredAny>,
    #[serde(default, rename = "kind")]
    _kind: Option<IgnoredAny>,
    #[serde(default)]
    percentage_of_nodes_to_score: Option<i64>,
    #[serde(default)]
    profiles: Vec<ProfileConfig>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ProfileConfig {
    #[serde(default, rename = "schedulerName")]
    _scheduler_name: Option<IgnoredAny>,
    #[serde(default)]
    percentage_of_nodes_to_score: Option<i64>,
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

/// The configuration `yaml` gives (`file` names it in errors): the default profile's plugins
/// with its weights, and its percentageOfNodesToScore.
pub fn from_yaml(file: &str, yaml: &str) -> Result<SchedulerConfig, String> {
    let config: Configuration = serde_yaml::from_str(yaml).map_err(|e| {
        format!("{file}: {e}: write percentageOfNodesToScore and profiles[0].plugins.score.enabled[{{name, weight}}]")
    })?;
    if config.profiles.len() > 1 {
        return Err(format!("{file}: profiles: gitplane runs one scheduler profile; keep only the first"));
    }
    let profile = config.profiles.into_iter().next();
    let percentage = match profile.as_ref().and_then(|p| p.percentage_of_nodes_to_score) {
        Some(p) => (p, "profiles[0].percentageOfNodesToScore"),
        None => (config.percentage_of_nodes_to_score.unwrap_or(0), "percentageOfNodesToScore"),
    };
    let percentage_of_nodes_to_score = match percentage {
        (p @ 0..=100, _) => p as u32,
        (p, at) => {
            return Err(format!(
                "{file}: {at}: {p} is out of range: give 1 to 100, or 0 (or nothing) for the adaptive default"
            ));
        }
    };
    let enabled = profile.and_then(|p| p.plugins?.score);
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
    Ok(SchedulerConfig { plugins, percentage_of_nodes_to_score })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_from_a_configuration() {
        let yaml = "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nprofiles:\n- schedulerName: default-scheduler\n  plugins:\n    score:\n      enabled:\n      - {name: NodeAffinity, weight: 10}\n      - {name: NodeResourcesFit, weight: 5}\n      - {name: ImageLocality}\n";
        let config = from_yaml("s.yaml", yaml).unwrap();
        assert_eq!(config.percentage_of_nodes_to_score, 0);
        let (_, scores) = config.profile().unwrap().plugins();
        let weight = |name: &str| scores.iter().find(|(n, _)| *n == name).map(|(_, w)| *w);
        assert_eq!(weight("NodeAffinity"), Some(10));
        assert_eq!(weight("LeastAllocated"), Some(5));
        assert_eq!(weight("ImageLocality"), Some(1));
        assert_eq!(weight("TaintToleration"), Some(3));
        assert_eq!(weight("InterPodAffinity"), Some(2));
    }

    #[test]
    fn percentage_of_nodes_to_score() {
        for (yaml, expected) in [
            ("{}", 0),
            ("percentageOfNodesToScore: 30", 30),
            ("profiles: [{percentageOfNodesToScore: 100}]", 100),
            ("percentageOfNodesToScore: 30\nprofiles: [{percentageOfNodesToScore: 60}]", 60),
            ("percentageOfNodesToScore: 0", 0),
        ] {
            assert_eq!(from_yaml("s.yaml", yaml).unwrap().percentage_of_nodes_to_score, expected, "{yaml}");
        }
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
            ("percentageOfNodesToScore: 101", "s.yaml: percentageOfNodesToScore: 101 is out of range"),
            ("profiles: [{percentageOfNodesToScore: -1}]", "s.yaml: profiles[0].percentageOfNodesToScore: -1 is out"),
            ("percentageOfNodesToScore: all", "percentageOfNodesToScore"),
        ] {
            let err = from_yaml("s.yaml", yaml).unwrap_err();
            assert!(err.contains(expected), "{yaml}: {err}");
        }
    }
}
