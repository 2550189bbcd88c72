//! From the replicas the metrics ask for to the replicas set, as upstream's HPA normalization:
//! the stabilization windows (the highest recommendation of the last 300 s on a scale-down by
//! default, the lowest of the scale-up window on a scale-up), the rate policies (`Pods` or
//! `Percent` per `periodSeconds`, `selectPolicy` Max, Min or Disabled), then minReplicas and
//! maxReplicas. The conditions it sets say which of these decided. Pure: the history of
//! recommendations and scale events is the caller's, the time is given.

use k8s_openapi::{
    api::autoscaling::v2::{HPAScalingRules, HorizontalPodAutoscalerBehavior},
    jiff::Timestamp,
};
use std::time::Duration;

/// The scale-down window without `behavior` (`--horizontal-pod-autoscaler-downscale-stabilization`).
pub const DOWNSCALE_STABILIZATION: Duration = Duration::from_secs(300);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Select {
    Max,
    Min,
    Disabled,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    Pods { value: i32, period: Duration },
    Percent { value: i32, period: Duration },
}

impl Policy {
    fn period(&self) -> Duration {
        match self {
            Policy::Pods { period, .. } | Policy::Percent { period, .. } => *period,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rules {
    pub stabilization_window: Duration,
    pub select: Select,
    pub policies: Vec<Policy>,
}

/// `spec.behavior` with upstream's defaults filled in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Behavior {
    pub scale_up: Rules,
    pub scale_down: Rules,
}

fn seconds(n: i32) -> Duration {
    Duration::from_secs(n.max(0) as u64)
}

fn rules(given: Option<&HPAScalingRules>, window: i32, defaults: &[Policy]) -> Rules {
    let given = given.cloned().unwrap_or_default();
    let policies = match given.policies {
        Some(policies) if !policies.is_empty() => policies
            .iter()
            .map(|p| match p.type_.as_str() {
                "Pods" => Policy::Pods { value: p.value, period: seconds(p.period_seconds) },
                _ => Policy::Percent { value: p.value, period: seconds(p.period_seconds) },
            })
            .collect(),
        _ => defaults.to_vec(),
    };
    let select = match given.select_policy.as_deref() {
        Some("Min") => Select::Min,
        Some("Disabled") => Select::Disabled,
        _ => Select::Max,
    };
    Rules { stabilization_window: seconds(given.stabilization_window_seconds.unwrap_or(window)), select, policies }
}

impl Behavior {
    /// The behavior of an HPA that sets one (upstream's `GenerateHPAScaleUpRules` and
    /// `GenerateHPAScaleDownRules`); none without.
    pub fn of(spec: Option<&HorizontalPodAutoscalerBehavior>) -> Option<Behavior> {
        let spec = spec?;
        let fifteen = seconds(15);
        Some(Behavior {
            scale_up: rules(
                spec.scale_up.as_ref(),
                0,
                &[Policy::Pods { value: 4, period: fifteen }, Policy::Percent { value: 100, period: fifteen }],
            ),
            scale_down: rules(spec.scale_down.as_ref(), 300, &[Policy::Percent { value: 100, period: fifteen }]),
        })
    }
}

/// What one HPA's past decisions were: its recommendations and its scale events, with when.
#[derive(Clone, Debug, Default)]
pub struct History {
    recommendations: Vec<(Timestamp, i32)>,
    scale_ups: Vec<(Timestamp, i32)>,
    scale_downs: Vec<(Timestamp, i32)>,
}

fn ago(now: Timestamp, d: Duration) -> Timestamp {
    now.checked_sub(d).unwrap_or(now)
}

impl History {
    /// A first evaluation (a new HPA, a new leader) recommends the current replicas, so nothing
    /// is scaled down before a whole window has passed, as upstream.
    pub fn seed(&mut self, current: i32, now: Timestamp) {
        if self.recommendations.is_empty() {
            self.recommendations.push((now, current));
        }
    }

    /// Remembers a rescale from `old` to `new`, for the rate policies; events older than the
    /// longest policy period are forgotten.
    pub fn record_scale(&mut self, behavior: Option<&Behavior>, old: i32, new: i32, now: Timestamp) {
        let Some(behavior) = behavior else { return };
        let (events, rules, change) = if new > old {
            (&mut self.scale_ups, &behavior.scale_up, new - old)
        } else {
            (&mut self.scale_downs, &behavior.scale_down, old - new)
        };
        let longest = rules.policies.iter().map(Policy::period).max().unwrap_or_default();
        events.retain(|(at, _)| *at > ago(now, longest));
        events.push((now, change));
    }

    /// Replaces a recommendation older than every window, or adds one.
    fn remember(&mut self, recommendation: i32, older_than: Timestamp, now: Timestamp) {
        match self.recommendations.iter_mut().find(|(at, _)| *at < older_than) {
            Some(old) => *old = (now, recommendation),
            None => self.recommendations.push((now, recommendation)),
        }
    }

    fn changed_within(events: &[(Timestamp, i32)], period: Duration, now: Timestamp) -> i32 {
        events.iter().filter(|(at, _)| *at > ago(now, period)).map(|(_, n)| n).sum()
    }
}

/// A condition the normalization sets: (reason, message).
pub type Reason = (&'static str, &'static str);

/// The replicas to set and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Normalized {
    pub replicas: i32,
    /// The AbleToScale condition's reason and message.
    pub able_to_scale: Reason,
    /// Whether ScalingLimited is True, and its reason and message.
    pub limited: (bool, Reason),
}

const READY: Reason = ("ReadyForNewScale", "recommended size matches current size");
const DOWN_STABILIZED: Reason = (
    "ScaleDownStabilized",
    "recent recommendations were higher than current one, applying the highest recent recommendation",
);
const UP_STABILIZED: Reason = (
    "ScaleUpStabilized",
    "recent recommendations were lower than current one, applying the lowest recent recommendation",
);
const WITHIN: Reason = ("DesiredWithinRange", "the desired count is within the acceptable range");
const TOO_FEW: Reason = ("TooFewReplicas", "the desired replica count is less than the minimum replica count");
const TOO_MANY: Reason = ("TooManyReplicas", "the desired replica count is more than the maximum replica count");
const UP_LIMIT: Reason = ("ScaleUpLimit", "the desired replica count is increasing faster than the maximum scale rate");
const DOWN_LIMIT: Reason =
    ("ScaleDownLimit", "the desired replica count is decreasing faster than the maximum scale rate");

/// The replicas to set for `proposed` (what the metrics ask) with `current` now.
pub fn normalize(
    history: &mut History,
    behavior: Option<&Behavior>,
    current: i32,
    proposed: i32,
    (min, max): (i32, i32),
    now: Timestamp,
) -> Normalized {
    match behavior {
        None => legacy(history, current, proposed, (min, max), now),
        Some(behavior) => with_behavior(history, behavior, current, proposed, (min, max), now),
    }
}

/// Without `behavior`: the scale-down window, then at most double (at least 4) per step.
fn legacy(history: &mut History, current: i32, proposed: i32, (min, max): (i32, i32), now: Timestamp) -> Normalized {
    let cutoff = ago(now, DOWNSCALE_STABILIZATION);
    let stabilized =
        history.recommendations.iter().filter(|(at, _)| *at >= cutoff).map(|(_, r)| *r).fold(proposed, i32::max);
    history.remember(proposed, cutoff, now);
    let able_to_scale = if stabilized != proposed { DOWN_STABILIZED } else { READY };
    let scale_up_limit = current.saturating_mul(2).max(4);
    let (upper, upper_reason) = if max > scale_up_limit { (scale_up_limit, UP_LIMIT) } else { (max, TOO_MANY) };
    let lower = if min == 0 { 1 } else { min };
    let (replicas, reason) = if stabilized < lower {
        (lower, TOO_FEW)
    } else if stabilized > upper {
        (upper, upper_reason)
    } else {
        (stabilized, WITHIN)
    };
    Normalized { replicas, able_to_scale, limited: (replicas != stabilized, reason) }
}

fn with_behavior(
    history: &mut History,
    behavior: &Behavior,
    current: i32,
    proposed: i32,
    (min, max): (i32, i32),
    now: Timestamp,
) -> Normalized {
    let up_cutoff = ago(now, behavior.scale_up.stabilization_window);
    let down_cutoff = ago(now, behavior.scale_down.stabilization_window);
    let (mut up, mut down) = (proposed, proposed);
    for (at, r) in &history.recommendations {
        if *at > up_cutoff {
            up = up.min(*r);
        }
        if *at > down_cutoff {
            down = down.max(*r);
        }
    }
    history.remember(proposed, up_cutoff.min(down_cutoff), now);
    let stabilized = current.max(up).min(down);
    let able_to_scale = match () {
        _ if stabilized == proposed => READY,
        _ if proposed >= current => UP_STABILIZED,
        _ => DOWN_STABILIZED,
    };
    let (replicas, reason) = rate_limited(history, behavior, current, stabilized, (min, max), now);
    Normalized { replicas, able_to_scale, limited: (replicas != stabilized, reason) }
}

/// The replicas the rate policies and the bounds allow: upstream's
/// `convertDesiredReplicasWithBehaviorRate`.
fn rate_limited(
    history: &History,
    behavior: &Behavior,
    current: i32,
    desired: i32,
    (min, max): (i32, i32),
    now: Timestamp,
) -> (i32, Reason) {
    // What a policy allows from the replicas at the start of its period.
    let start_of = |period| {
        current - History::changed_within(&history.scale_ups, period, now)
            + History::changed_within(&history.scale_downs, period, now)
    };
    if desired > current {
        let rules = &behavior.scale_up;
        let limit = match rules.select {
            Select::Disabled => current,
            select => {
                let proposals = rules.policies.iter().map(|p| match *p {
                    Policy::Pods { value, period } => start_of(period).saturating_add(value),
                    Policy::Percent { value, period } => {
                        (f64::from(start_of(period)) * (1.0 + f64::from(value) / 100.0)).ceil() as i32
                    }
                });
                if select == Select::Min { proposals.min() } else { proposals.max() }.unwrap_or(current)
            }
        }
        .max(current);
        let (upper, reason) = if max > limit { (limit, UP_LIMIT) } else { (max, TOO_MANY) };
        if desired > upper {
            return (upper, reason);
        }
    } else if desired < current {
        let rules = &behavior.scale_down;
        let limit = match rules.select {
            Select::Disabled => current,
            select => {
                let proposals = rules.policies.iter().map(|p| match *p {
                    Policy::Pods { value, period } => start_of(period).saturating_sub(value),
                    Policy::Percent { value, period } => {
                        (f64::from(start_of(period)) * (1.0 - f64::from(value) / 100.0)) as i32
                    }
                });
                // The smallest change is the highest count on the way down.
                if select == Select::Min { proposals.max() } else { proposals.min() }.unwrap_or(current)
            }
        }
        .min(current);
        let (lower, reason) = if min < limit { (limit, DOWN_LIMIT) } else { (min, TOO_FEW) };
        if desired < lower {
            return (lower, reason);
        }
    }
    (desired, WITHIN)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn t(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).unwrap()
    }

    fn behavior(spec: serde_json::Value) -> Behavior {
        Behavior::of(Some(&serde_json::from_value(spec).unwrap())).unwrap()
    }

    #[test]
    fn defaults_fill_what_behavior_leaves_out() {
        let b = behavior(json!({"scaleDown": {"stabilizationWindowSeconds": 10}}));
        assert_eq!(b.scale_down.stabilization_window, Duration::from_secs(10));
        assert_eq!(b.scale_down.policies, [Policy::Percent { value: 100, period: Duration::from_secs(15) }]);
        assert_eq!((b.scale_up.stabilization_window, b.scale_up.select), (Duration::ZERO, Select::Max));
        assert_eq!(b.scale_up.policies.len(), 2);
        assert_eq!(Behavior::of(None), None);
    }

    /// (seconds, current replicas, proposed replicas)
    type Step = (i64, i32, i32);
    /// (replicas set, AbleToScale reason, ScalingLimited reason)
    type Outcome = (i32, &'static str, &'static str);

    /// Runs a sequence of (seconds, current, proposed) through one history, recording each
    /// rescale as the controller does; the replicas set and the reasons, in order.
    fn run(behavior: Option<&Behavior>, bounds: (i32, i32), steps: &[Step]) -> Vec<Outcome> {
        let mut history = History::default();
        steps
            .iter()
            .map(|&(at, current, proposed)| {
                let n = normalize(&mut history, behavior, current, proposed, bounds, t(at));
                if n.replicas != current {
                    history.record_scale(behavior, current, n.replicas, t(at));
                }
                (n.replicas, n.able_to_scale.0, n.limited.1.0)
            })
            .collect()
    }

    #[test]
    fn without_behavior_table() {
        #[rustfmt::skip]
        /// (name, (minReplicas, maxReplicas), steps, outcomes)
        type Case<'a> = (&'a str, (i32, i32), Vec<Step>, Vec<Outcome>);
        let cases: Vec<Case> = vec![
            (
                "up at once, at most double or 4",
                (1, 10),
                vec![(0, 1, 9), (15, 4, 9)],
                vec![(4, "ReadyForNewScale", "ScaleUpLimit"), (8, "ReadyForNewScale", "ScaleUpLimit")],
            ),
            (
                "down only after 300 s of lower recommendations",
                (1, 10),
                vec![(0, 5, 5), (15, 5, 1), (299, 5, 1), (301, 5, 1)],
                vec![
                    (5, "ReadyForNewScale", "DesiredWithinRange"),
                    (5, "ScaleDownStabilized", "DesiredWithinRange"),
                    (5, "ScaleDownStabilized", "DesiredWithinRange"),
                    (1, "ReadyForNewScale", "DesiredWithinRange"),
                ],
            ),
            (
                "bounds",
                (2, 3),
                vec![(0, 2, 9), (1, 3, 0)],
                vec![(3, "ReadyForNewScale", "TooManyReplicas"), (3, "ScaleDownStabilized", "TooManyReplicas")],
            ),
            ("below the minimum", (2, 5), vec![(0, 2, 1)], vec![(2, "ReadyForNewScale", "TooFewReplicas")]),
        ];
        for (name, bounds, steps, want) in cases {
            assert_eq!(run(None, bounds, &steps), want, "{name}");
        }
    }

    #[test]
    fn with_behavior_table() {
        let defaults = behavior(json!({}));
        let quick_down = behavior(json!({"scaleDown": {"stabilizationWindowSeconds": 30}}));
        let slow_up = behavior(
            json!({"scaleUp": {"stabilizationWindowSeconds": 60, "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}]}}),
        );
        let min_policy = behavior(json!({"scaleDown": {"stabilizationWindowSeconds": 0, "selectPolicy": "Min",
            "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}, {"type": "Percent", "value": 50, "periodSeconds": 60}]}}));
        let disabled = behavior(json!({"scaleDown": {"selectPolicy": "Disabled"}}));
        #[rustfmt::skip]
        /// (name, behavior, (minReplicas, maxReplicas), steps, outcomes)
        type Case<'a> = (&'a str, &'a Behavior, (i32, i32), Vec<Step>, Vec<Outcome>);
        let cases: Vec<Case> = vec![
            (
                "defaults: up by max(4 Pods, 100%) per 15 s",
                &defaults,
                (1, 20),
                vec![(0, 1, 20), (5, 5, 20), (16, 5, 20)],
                vec![
                    (5, "ReadyForNewScale", "ScaleUpLimit"),
                    (5, "ReadyForNewScale", "ScaleUpLimit"),
                    (10, "ReadyForNewScale", "ScaleUpLimit"),
                ],
            ),
            (
                "defaults: down after 300 s",
                &defaults,
                (1, 20),
                vec![(0, 4, 4), (10, 4, 1), (301, 4, 1)],
                vec![
                    (4, "ReadyForNewScale", "DesiredWithinRange"),
                    (4, "ScaleDownStabilized", "DesiredWithinRange"),
                    (1, "ReadyForNewScale", "DesiredWithinRange"),
                ],
            ),
            (
                "a short scale-down window",
                &quick_down,
                (1, 20),
                vec![(0, 4, 4), (10, 4, 1), (41, 4, 1)],
                vec![
                    (4, "ReadyForNewScale", "DesiredWithinRange"),
                    (4, "ScaleDownStabilized", "DesiredWithinRange"),
                    (1, "ReadyForNewScale", "DesiredWithinRange"),
                ],
            ),
            (
                "a scale-up window takes the lowest",
                &slow_up,
                (1, 20),
                vec![(0, 2, 2), (10, 2, 6), (61, 2, 6), (62, 3, 6), (122, 3, 6)],
                vec![
                    (2, "ReadyForNewScale", "DesiredWithinRange"),
                    (2, "ScaleUpStabilized", "DesiredWithinRange"),
                    (3, "ReadyForNewScale", "ScaleUpLimit"),
                    (3, "ReadyForNewScale", "ScaleUpLimit"),
                    (4, "ReadyForNewScale", "ScaleUpLimit"),
                ],
            ),
            (
                "selectPolicy Min: the smaller step down",
                &min_policy,
                (1, 20),
                vec![(0, 10, 1), (30, 9, 1), (61, 9, 1)],
                vec![
                    (9, "ReadyForNewScale", "ScaleDownLimit"),
                    (9, "ReadyForNewScale", "ScaleDownLimit"),
                    (8, "ReadyForNewScale", "ScaleDownLimit"),
                ],
            ),
            (
                "selectPolicy Disabled: never down",
                &disabled,
                (1, 20),
                vec![(0, 5, 1), (400, 5, 1)],
                vec![(5, "ReadyForNewScale", "ScaleDownLimit"), (5, "ReadyForNewScale", "ScaleDownLimit")],
            ),
            ("the maximum", &defaults, (1, 3), vec![(0, 2, 9)], vec![(3, "ReadyForNewScale", "TooManyReplicas")]),
        ];
        for (name, b, bounds, steps, want) in cases {
            assert_eq!(run(Some(b), bounds, &steps), want, "{name}");
        }
    }
}
