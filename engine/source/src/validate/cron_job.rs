//! What the API server refuses of a CronJob beyond its schema: a schedule the controller could
//! not read, an unknown time zone, an unknown concurrency policy, negative limits, and a name
//! too long for the Jobs named after it.

use super::Problem;
use gitplane_api::cron;
use serde_json::Value;

/// A Job is named `<cronjob>-<minutes since the epoch>` (up to 11 more characters) and must stay
/// a valid label value (63).
const MAX_NAME: usize = 52;

pub(super) fn problems(value: &Value) -> Vec<Problem> {
    let spec = &value["spec"];
    let mut problems = Vec::new();
    if let Some(name) = value["metadata"]["name"].as_str()
        && name.len() > MAX_NAME
    {
        problems.push(Problem::at(
            "/metadata/name",
            format!("a CronJob's name must be no more than {MAX_NAME} characters (it has {}): shorten it", name.len()),
        ));
    }
    if let Some(schedule) = spec["schedule"].as_str()
        && let Err(why) = cron::parse(schedule)
    {
        problems.push(Problem::at("/spec/schedule", format!("invalid schedule {schedule:?}: {why}")));
    }
    if let Some(zone) = spec.get("timeZone").and_then(Value::as_str)
        && let Err(why) = cron::time_zone(Some(zone))
    {
        problems.push(Problem::at("/spec/timeZone", why));
    }
    if let Some(policy) = spec["concurrencyPolicy"].as_str()
        && !matches!(policy, "Allow" | "Forbid" | "Replace")
    {
        problems.push(Problem::at(
            "/spec/concurrencyPolicy",
            format!("unsupported value {policy:?}: use \"Allow\", \"Forbid\" or \"Replace\""),
        ));
    }
    for field in ["startingDeadlineSeconds", "successfulJobsHistoryLimit", "failedJobsHistoryLimit"] {
        if spec[field].as_i64().is_some_and(|n| n < 0) {
            problems.push(Problem::at(format!("/spec/{field}"), "must be greater than or equal to 0"));
        }
    }
    problems
}
