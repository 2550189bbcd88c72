//! CronJob controller, as upstream's CronJob controller v2: at each scheduled time (in the
//! CronJob's `timeZone`, UTC when unset) it creates a Job named `<cronjob>-<scheduled time in
//! minutes since the epoch>` from the template, unless the start is later than
//! `startingDeadlineSeconds` allows or `concurrencyPolicy` says otherwise (Forbid skips while a
//! Job runs, Replace deletes the running ones first); it keeps `status.active`,
//! `lastScheduleTime` and `lastSuccessfulTime`, deletes the oldest finished Jobs beyond the
//! history limits, and requeues itself for the next scheduled time instead of polling.
//!
//! The plan (Job creations and deletions and the new status) is pure and committed as one
//! transaction that compare-and-swaps on the CronJob, so a Job is never created twice for one
//! scheduled time.

use crate::{
    Action, Context, ReconcileError, Reconciler,
    owner::{controller_ref, owner_keys_for},
    plan::Op,
    runtime::all_of,
};
use gitplane_api::cron::{self, Schedule};
use gitplane_api::events::{NORMAL, WARNING};
use gitplane_store::{Event, ObjectKey, informer::Cache};
use k8s_openapi::{
    api::{
        batch::v1::{CronJob, CronJobStatus, Job},
        core::v1::ObjectReference,
    },
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
    jiff::{Timestamp, tz::TimeZone},
};
use std::time::Duration;

pub struct CronJobController;

/// The annotation each Job carries with the time it was scheduled for, in the CronJob's zone.
pub const SCHEDULED_TIMESTAMP_ANNOTATION: &str = "batch.kubernetes.io/cronjob-scheduled-timestamp";

/// More missed start times than this since the last one (or the deadline) earns a Warning.
const MANY_MISSED: usize = 100;

/// Requeue a little after the scheduled time, as upstream's `nextScheduleDelta`, so the clock
/// has surely passed it.
const NEXT_SCHEDULE_DELTA: Duration = Duration::from_millis(100);

/// The most recent scheduled time after `earliest` and no later than `now`, and whether more
/// than [`MANY_MISSED`] of them passed: upstream's `mostRecentScheduleTime`, counting exactly
/// instead of by the interval between the first two times (which is wrong for irregular
/// schedules such as `0 9 * * 1-5`).
pub fn most_recent(
    schedule: &Schedule,
    tz: &TimeZone,
    earliest: Timestamp,
    now: Timestamp,
) -> (Option<Timestamp>, bool) {
    let Some(first) = schedule.next(earliest, tz).filter(|t| *t <= now) else { return (None, false) };
    let (mut recent, mut count) = (first, 1);
    loop {
        match schedule.next(recent, tz) {
            Some(t) if t <= now && count <= MANY_MISSED => (recent, count) = (t, count + 1),
            Some(t) if t <= now => break,
            _ => return (Some(recent), count > MANY_MISSED),
        }
    }
    // Too many to walk: look back from now over a window that doubles until it holds a time.
    let mut window = (now.as_second() - recent.as_second()).clamp(1, 60) * 2;
    loop {
        let from = Timestamp::from_second(now.as_second() - window).unwrap_or(recent).max(recent);
        if let Some(mut t) = schedule.next(from, tz).filter(|t| *t <= now) {
            while let Some(later) = schedule.next(t, tz).filter(|l| *l <= now) {
                t = later;
            }
            return (Some(t), true);
        }
        window = window.saturating_mul(2);
    }
}

/// The Job's name for a scheduled time: the same time always gives the same name.
pub fn job_name(cron_job: &str, scheduled: Timestamp) -> String {
    format!("{cron_job}-{}", scheduled.as_second().div_euclid(60))
}

fn is_finished(job: &Job) -> Option<&'static str> {
    let conditions = job.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.into_iter().flatten().filter(|c| c.status == "True").find_map(|c| match c.type_.as_str() {
        "Complete" => Some("Complete"),
        "Failed" => Some("Failed"),
        _ => None,
    })
}

fn reference(job: &Job) -> ObjectReference {
    ObjectReference {
        api_version: Some("batch/v1".into()),
        kind: Some("Job".into()),
        namespace: job.metadata.namespace.clone(),
        name: job.metadata.name.clone(),
        uid: job.metadata.uid.clone(),
        ..Default::default()
    }
}

/// A Job of the template for `scheduled`.
fn new_job(cron_job: &CronJob, scheduled: Timestamp, tz: &TimeZone) -> Job {
    let template = cron_job.spec.as_ref().map(|s| s.job_template.clone()).unwrap_or_default();
    let meta = template.metadata.unwrap_or_default();
    let mut annotations = meta.annotations.unwrap_or_default();
    let at = scheduled.to_zoned(tz.clone()).strftime("%Y-%m-%dT%H:%M:%S%:z").to_string();
    annotations.insert(SCHEDULED_TIMESTAMP_ANNOTATION.into(), at.replace("+00:00", "Z"));
    Job {
        metadata: ObjectMeta {
            name: Some(job_name(cron_job.metadata.name.as_deref().unwrap_or(""), scheduled)),
            namespace: cron_job.metadata.namespace.clone(),
            labels: meta.labels,
            annotations: Some(annotations),
            owner_references: Some(vec![controller_ref("batch/v1", "CronJob", &cron_job.metadata)]),
            ..Default::default()
        },
        spec: template.spec,
        status: None,
    }
}

/// An Event the plan records once it is committed: (type, reason, message).
pub type Note = (&'static str, &'static str, String);

/// What a reconcile decides.
#[derive(Debug, Default)]
pub struct Plan {
    /// Jobs to create and delete.
    pub ops: Vec<Op<Job>>,
    pub status: CronJobStatus,
    pub events: Vec<Note>,
    /// When the next scheduled time comes; none: nothing is scheduled (suspended, no next time).
    pub requeue_after: Option<Duration>,
}

/// The CronJob's next step from its Jobs (`jobs`: the ones it controls) at `now`.
pub fn plan(cron_job: &CronJob, jobs: &[Job], now: Timestamp) -> Plan {
    let mut plan = Plan { status: cron_job.status.clone().unwrap_or_default(), ..Default::default() };
    let spec = cron_job.spec.clone().unwrap_or_default();

    // The active list: Jobs it started that still run (found by name; the uid once known).
    let active = plan.status.active.take().unwrap_or_default();
    let mut still_active = Vec::new();
    for entry in active {
        let job =
            jobs.iter().find(|j| j.metadata.name == entry.name && (entry.uid.is_none() || j.metadata.uid == entry.uid));
        match job {
            None => plan.events.push((
                NORMAL,
                "MissingJob",
                format!("Active job went missing: {}", entry.name.as_deref().unwrap_or("")),
            )),
            Some(job) => match is_finished(job) {
                Some(condition) => plan.events.push((
                    NORMAL,
                    "SawCompletedJob",
                    format!(
                        "Saw completed job: {}, condition: {condition}",
                        job.metadata.name.as_deref().unwrap_or("")
                    ),
                )),
                None => still_active.push(reference(job)),
            },
        }
    }
    for job in jobs.iter().filter(|j| is_finished(j) == Some("Complete")) {
        let completed = job.status.as_ref().and_then(|s| s.completion_time.clone());
        if completed.is_some() && completed > plan.status.last_successful_time {
            plan.status.last_successful_time = completed;
        }
    }
    let deleted_ops = history_cleanup(&spec, jobs);
    let is_deleted =
        |name: &Option<String>| deleted_ops.iter().any(|op| matches!(op, Op::Delete(j) if &j.metadata.name == name));
    plan.events.extend(deleted_ops.iter().filter_map(|op| match op {
        Op::Delete(j) => Some((NORMAL, "SuccessfulDelete", format!("Deleted job {}", j.metadata.name.as_deref()?))),
        _ => None,
    }));
    plan.ops.extend(deleted_ops.clone());

    let finish = |mut plan: Plan, active: Vec<ObjectReference>| {
        plan.status.active = (!active.is_empty()).then_some(active);
        plan
    };
    if cron_job.metadata.deletion_timestamp.is_some() || spec.suspend == Some(true) {
        return finish(plan, still_active);
    }
    let tz = match cron::time_zone(spec.time_zone.as_deref()) {
        Ok(tz) => tz,
        Err(why) => {
            plan.events.push((WARNING, "UnknownTimeZone", why));
            return finish(plan, still_active);
        }
    };
    let schedule = match cron::parse(&spec.schedule) {
        Ok(schedule) => schedule,
        Err(why) => {
            plan.events.push((
                WARNING,
                "UnparseableSchedule",
                format!("unparseable schedule: {:?} : {why}", spec.schedule),
            ));
            return finish(plan, still_active);
        }
    };

    let created = cron_job.metadata.creation_timestamp.as_ref().map_or(now, |t| t.0);
    let last = plan.status.last_schedule_time.as_ref().map(|t| t.0);
    let earliest = last.unwrap_or(created);
    // Nothing is started before the deadline: the most recent time after it is the candidate.
    let floor = spec
        .starting_deadline_seconds
        .and_then(|d| Timestamp::from_second(now.as_second().saturating_sub(d)).ok())
        .map_or(earliest, |deadline| deadline.max(earliest));
    // The next scheduled time after the most recent one is the first after now.
    plan.requeue_after = schedule.next(now, &tz).map(|next| {
        Duration::from_millis((next.as_millisecond() - now.as_millisecond()).max(0) as u64) + NEXT_SCHEDULE_DELTA
    });
    let (scheduled, many_missed) = most_recent(&schedule, &tz, floor, now);
    if many_missed {
        plan.events.push((
            WARNING,
            "TooManyMissedTimes",
            "too many missed start times. Set or decrease .spec.startingDeadlineSeconds or check clock skew".into(),
        ));
    }
    let Some(scheduled) = scheduled else { return finish(plan, still_active) };
    if let Some(deadline) = spec.starting_deadline_seconds
        && scheduled.as_second().saturating_add(deadline) < now.as_second()
    {
        plan.events.push((WARNING, "MissSchedule", format!("Missed scheduled time to start a job: {scheduled}")));
        return finish(plan, still_active);
    }
    let name = job_name(cron_job.metadata.name.as_deref().unwrap_or(""), scheduled);
    let done = still_active.iter().any(|r| r.name.as_deref() == Some(name.as_str()))
        || jobs.iter().any(|j| j.metadata.name.as_deref() == Some(name.as_str()))
        || last == Some(scheduled);
    if done {
        return finish(plan, still_active);
    }
    match spec.concurrency_policy.as_deref() {
        Some("Forbid") if !still_active.is_empty() => {
            plan.events.push((
                NORMAL,
                "JobAlreadyActive",
                "Not starting job because prior execution is running and concurrency policy is Forbid".into(),
            ));
            return finish(plan, still_active);
        }
        Some("Replace") => {
            for entry in still_active.drain(..) {
                if let Some(job) = jobs.iter().find(|j| j.metadata.name == entry.name)
                    && !is_deleted(&job.metadata.name)
                {
                    plan.ops.push(Op::Delete(job.clone()));
                    plan.events.push((
                        NORMAL,
                        "SuccessfulDelete",
                        format!("Deleted job {}", entry.name.unwrap_or_default()),
                    ));
                }
            }
        }
        _ => {}
    }
    let job = new_job(cron_job, scheduled, &tz);
    plan.events.push((NORMAL, "SuccessfulCreate", format!("Created job {name}")));
    still_active.push(reference(&job));
    plan.ops.push(Op::Create(job));
    plan.status.last_schedule_time = Some(Time(scheduled));
    finish(plan, still_active)
}

/// The oldest finished Jobs beyond `successfulJobsHistoryLimit` and `failedJobsHistoryLimit`,
/// by start time then name, as upstream's `removeOldestJobs`.
fn history_cleanup(spec: &k8s_openapi::api::batch::v1::CronJobSpec, jobs: &[Job]) -> Vec<Op<Job>> {
    let mut ops = Vec::new();
    for (outcome, limit) in
        [("Complete", spec.successful_jobs_history_limit), ("Failed", spec.failed_jobs_history_limit)]
    {
        let Some(limit) = limit else { continue };
        let mut finished: Vec<&Job> = jobs.iter().filter(|j| is_finished(j) == Some(outcome)).collect();
        let excess = finished.len().saturating_sub(limit.max(0) as usize);
        // No start time sorts last, as upstream's byJobStartTime.
        finished.sort_by_key(|j| {
            let start = j.status.as_ref().and_then(|s| s.start_time.as_ref()).map(|t| t.0);
            (start.is_none(), start, j.metadata.name.clone())
        });
        ops.extend(finished.into_iter().take(excess).map(|j| Op::Delete(j.clone())));
    }
    ops
}

#[async_trait::async_trait]
impl Reconciler for CronJobController {
    fn name(&self) -> &'static str {
        "cronjob"
    }

    fn keys_for(&self, event: &Event, _: &Cache) -> Vec<ObjectKey> {
        owner_keys_for::<CronJob, Job>(event)
    }

    fn all_keys(&self, cache: &Cache) -> Vec<ObjectKey> {
        all_of::<CronJob>(cache)
    }

    async fn reconcile(&self, key: &ObjectKey, ctx: &Context) -> Result<Action, ReconcileError> {
        let Some(cron_job) = ctx.cache().get_typed::<CronJob>(&key.namespace, &key.name) else {
            return Ok(Action::await_change()); // gone: the garbage collector removes its Jobs
        };
        let uid = cron_job.metadata.uid.clone().unwrap_or_default();
        let jobs = ctx.cache().controlled_by::<Job>(&key.namespace, &uid);
        let now = Timestamp::now();
        let plan = plan(&cron_job, &jobs, now);
        let mut ops: Vec<gitplane_store::Op> = plan.ops.into_iter().filter_map(|op| op.into_store_op(now)).collect();
        if cron_job.status.as_ref().unwrap_or(&CronJobStatus::default()) != &plan.status {
            let mut updated = cron_job.clone();
            updated.status = Some(plan.status);
            ops.push(gitplane_store::Op::UpdateStatus(gitplane_api::object::to_value(&updated)));
        }
        if let Err(e) = ctx.commit(ops).await {
            if !e.is_conflict() {
                ctx.event(
                    "cronjob-controller",
                    &cron_job,
                    WARNING,
                    "FailedCreate",
                    &format!("Error creating job: {e}"),
                );
            }
            return Err(e.into());
        }
        for (type_, reason, message) in &plan.events {
            ctx.event("cronjob-controller", &cron_job, type_, reason, message);
        }
        Ok(plan.requeue_after.map_or(Action::await_change(), Action::requeue))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn ts(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    fn utc() -> TimeZone {
        TimeZone::UTC
    }

    #[test]
    fn most_recent_table() {
        let every_minute = cron::parse("*/1 * * * *").unwrap();
        let weekdays = cron::parse("0 9 * * 1-5").unwrap();
        #[rustfmt::skip]
        /// (name, schedule, earliest, now, the most recent time, more than 100 missed)
        type Case<'a> = (&'a str, &'a Schedule, &'a str, &'a str, Option<&'a str>, bool);
        let cases: Vec<Case> = vec![
            ("before the first time", &every_minute, "2026-01-01T00:00:10Z", "2026-01-01T00:00:50Z", None, false),
            (
                "at the first time",
                &every_minute,
                "2026-01-01T00:00:10Z",
                "2026-01-01T00:01:00Z",
                Some("2026-01-01T00:01:00Z"),
                false,
            ),
            (
                "one missed",
                &every_minute,
                "2026-01-01T00:00:10Z",
                "2026-01-01T00:02:30Z",
                Some("2026-01-01T00:02:00Z"),
                false,
            ),
            (
                "100 missed",
                &every_minute,
                "2026-01-01T00:00:00Z",
                "2026-01-01T01:40:30Z",
                Some("2026-01-01T01:40:00Z"),
                false,
            ),
            (
                "101 missed",
                &every_minute,
                "2026-01-01T00:00:00Z",
                "2026-01-01T01:41:30Z",
                Some("2026-01-01T01:41:00Z"),
                true,
            ),
            (
                "a year missed",
                &every_minute,
                "2025-01-01T00:00:00Z",
                "2026-01-01T00:00:30Z",
                Some("2026-01-01T00:00:00Z"),
                true,
            ),
            (
                "irregular: weekend skipped",
                &weekdays,
                "2026-01-02T09:00:00Z",
                "2026-01-05T10:00:00Z",
                Some("2026-01-05T09:00:00Z"),
                false,
            ),
            (
                "irregular, many missed",
                &weekdays,
                "2025-01-01T00:00:00Z",
                "2026-01-04T12:00:00Z",
                Some("2026-01-02T09:00:00Z"),
                true,
            ),
        ];
        for (name, schedule, earliest, now, want, many) in cases {
            assert_eq!(most_recent(schedule, &utc(), ts(earliest), ts(now)), (want.map(ts), many), "{name}");
        }
    }

    #[test]
    fn job_names_are_minutes_since_the_epoch() {
        assert_eq!(job_name("hello", ts("2026-01-01T00:01:00Z")), "hello-29453761");
    }

    fn cron_job(spec: Value, status: Value) -> CronJob {
        let mut spec_value = json!({"schedule": "*/1 * * * *", "concurrencyPolicy": "Allow", "suspend": false,
            "successfulJobsHistoryLimit": 3, "failedJobsHistoryLimit": 1,
            "jobTemplate": {"metadata": {"labels": {"app": "hello"}},
                            "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i"}]}}}}});
        for (k, v) in spec.as_object().unwrap() {
            spec_value[k] = v.clone();
        }
        serde_json::from_value(json!({
            "metadata": {"name": "hello", "namespace": "default", "uid": "cj-1", "resourceVersion": "5",
                         "creationTimestamp": "2026-01-01T00:00:10Z"},
            "spec": spec_value, "status": status,
        }))
        .unwrap()
    }

    /// A Job of the CronJob for the minute `m` after 00:00 (2026-01-01): `R` running, `C`
    /// complete, `F` failed.
    fn job(m: i64, state: char) -> Job {
        let scheduled = Timestamp::from_second(ts("2026-01-01T00:00:00Z").as_second() + m * 60).unwrap();
        let conditions = match state {
            'C' => json!([{"type": "Complete", "status": "True"}]),
            'F' => json!([{"type": "Failed", "status": "True"}]),
            _ => json!([]),
        };
        let completion = (state == 'C').then(|| Timestamp::from_second(scheduled.as_second() + 5).unwrap().to_string());
        serde_json::from_value(json!({
            "metadata": {"name": job_name("hello", scheduled), "namespace": "default", "uid": format!("j{m}"), "resourceVersion": "7"},
            "status": {"startTime": scheduled.to_string(), "completionTime": completion, "conditions": conditions},
        }))
        .unwrap()
    }

    fn active(ms: &[i64]) -> Value {
        let refs: Vec<Value> = ms.iter().map(|m| json!({"name": format!("hello-{}", 29453760 + m)})).collect();
        json!(refs)
    }

    fn describe(plan: &Plan) -> (Vec<String>, Vec<String>, Option<String>) {
        let ops = plan
            .ops
            .iter()
            .map(|op| match op {
                Op::Create(j) => format!("create {}", j.metadata.name.as_deref().unwrap()),
                Op::Update(j) => format!("update {}", j.metadata.name.as_deref().unwrap()),
                Op::Delete(j) => format!("delete {}", j.metadata.name.as_deref().unwrap()),
            })
            .collect();
        let active = plan.status.active.iter().flatten().map(|r| r.name.clone().unwrap()).collect();
        let last = plan.status.last_schedule_time.as_ref().map(|t| t.0.to_string());
        (ops, active, last)
    }

    #[test]
    fn plan_table() {
        let at = |m: i64, s: i64| Timestamp::from_second(ts("2026-01-01T00:00:00Z").as_second() + m * 60 + s).unwrap();
        let last = |m: i64| json!({"lastScheduleTime": at(m, 0).to_string(), "active": active(&[m])});
        #[rustfmt::skip]
        /// (name, CronJob, its Jobs, now, ops, active Jobs, lastScheduleTime, Event reasons)
        type Case<'a> = (&'a str, CronJob, Vec<Job>, Timestamp, Vec<&'a str>, Vec<&'a str>, Option<&'a str>, &'a str);
        let cases: Vec<Case> = vec![
            ("not yet", cron_job(json!({}), json!({})), vec![], at(0, 50), vec![], vec![], None, ""),
            (
                "the first time",
                cron_job(json!({}), json!({})),
                vec![],
                at(1, 2),
                vec!["create hello-29453761"],
                vec!["hello-29453761"],
                Some("2026-01-01T00:01:00Z"),
                "SuccessfulCreate",
            ),
            (
                "already started",
                cron_job(json!({}), last(1)),
                vec![job(1, 'R')],
                at(1, 30),
                vec![],
                vec!["hello-29453761"],
                Some("2026-01-01T00:01:00Z"),
                "",
            ),
            (
                "Allow: runs beside the running one",
                cron_job(json!({}), last(1)),
                vec![job(1, 'R')],
                at(2, 1),
                vec!["create hello-29453762"],
                vec!["hello-29453761", "hello-29453762"],
                Some("2026-01-01T00:02:00Z"),
                "SuccessfulCreate",
            ),
            (
                "Forbid: skips while one runs",
                cron_job(json!({"concurrencyPolicy": "Forbid"}), last(1)),
                vec![job(1, 'R')],
                at(2, 1),
                vec![],
                vec!["hello-29453761"],
                Some("2026-01-01T00:01:00Z"),
                "JobAlreadyActive",
            ),
            (
                "Forbid: starts once it ended",
                cron_job(json!({"concurrencyPolicy": "Forbid"}), last(1)),
                vec![job(1, 'C')],
                at(2, 1),
                vec!["create hello-29453762"],
                vec!["hello-29453762"],
                Some("2026-01-01T00:02:00Z"),
                "SawCompletedJob,SuccessfulCreate",
            ),
            (
                "Replace: the running one goes",
                cron_job(json!({"concurrencyPolicy": "Replace"}), last(1)),
                vec![job(1, 'R')],
                at(2, 1),
                vec!["delete hello-29453761", "create hello-29453762"],
                vec!["hello-29453762"],
                Some("2026-01-01T00:02:00Z"),
                "SuccessfulDelete,SuccessfulCreate",
            ),
            ("suspended", cron_job(json!({"suspend": true}), json!({})), vec![], at(5, 0), vec![], vec![], None, ""),
            (
                "missed ones: only the most recent starts",
                cron_job(json!({}), json!({})),
                vec![],
                at(5, 30),
                vec!["create hello-29453765"],
                vec!["hello-29453765"],
                Some("2026-01-01T00:05:00Z"),
                "SuccessfulCreate",
            ),
            (
                "within startingDeadlineSeconds",
                cron_job(json!({"startingDeadlineSeconds": 40}), json!({})),
                vec![],
                at(5, 30),
                vec!["create hello-29453765"],
                vec!["hello-29453765"],
                Some("2026-01-01T00:05:00Z"),
                "SuccessfulCreate",
            ),
            (
                "past startingDeadlineSeconds",
                cron_job(json!({"startingDeadlineSeconds": 20}), json!({})),
                vec![],
                at(5, 30),
                vec![],
                vec![],
                None,
                "",
            ),
            (
                "too many missed",
                cron_job(json!({}), json!({})),
                vec![],
                at(200, 10),
                vec!["create hello-29453960"],
                vec!["hello-29453960"],
                Some("2026-01-01T03:20:00Z"),
                "TooManyMissedTimes,SuccessfulCreate",
            ),
            (
                "a deadline bounds what counts as missed",
                cron_job(json!({"startingDeadlineSeconds": 600}), json!({})),
                vec![],
                at(200, 10),
                vec!["create hello-29453960"],
                vec!["hello-29453960"],
                Some("2026-01-01T03:20:00Z"),
                "SuccessfulCreate",
            ),
            (
                "a vanished active Job is dropped",
                cron_job(json!({}), last(1)),
                vec![],
                at(1, 30),
                vec![],
                vec![],
                Some("2026-01-01T00:01:00Z"),
                "MissingJob",
            ),
            (
                "history: the oldest successful beyond 3 goes",
                cron_job(json!({}), last(4)),
                vec![job(1, 'C'), job(2, 'C'), job(3, 'C'), job(4, 'C')],
                at(4, 30),
                vec!["delete hello-29453761"],
                vec![],
                Some("2026-01-01T00:04:00Z"),
                "SawCompletedJob,SuccessfulDelete",
            ),
            (
                "history: one failed kept",
                cron_job(json!({"successfulJobsHistoryLimit": 1}), json!({"lastScheduleTime": at(4, 0).to_string()})),
                vec![job(1, 'F'), job(2, 'C'), job(3, 'F'), job(4, 'C')],
                at(4, 30),
                vec!["delete hello-29453762", "delete hello-29453761"],
                vec![],
                Some("2026-01-01T00:04:00Z"),
                "SuccessfulDelete,SuccessfulDelete",
            ),
        ];
        for (name, cron_job, jobs, now, ops, active, last, reasons) in cases {
            let plan = plan(&cron_job, &jobs, now);
            let want = (
                ops.iter().map(|s| s.to_string()).collect(),
                active.iter().map(|s| s.to_string()).collect(),
                last.map(str::to_owned),
            );
            assert_eq!(describe(&plan), want, "{name}");
            let got: Vec<&str> = plan.events.iter().map(|e| e.1).collect();
            assert_eq!(got.join(","), reasons, "{name}");
        }
    }

    #[test]
    fn plan_requeues_at_the_next_scheduled_time() {
        let now = ts("2026-01-01T00:01:20Z");
        let plan = plan(&cron_job(json!({}), json!({})), &[], now);
        assert_eq!(plan.requeue_after, Some(Duration::from_secs(40) + NEXT_SCHEDULE_DELTA));
        let hourly = plan_of(json!({"schedule": "@hourly"}), now);
        assert_eq!(hourly.requeue_after, Some(Duration::from_secs(58 * 60 + 40) + NEXT_SCHEDULE_DELTA));
        assert_eq!(
            plan_of(json!({"suspend": true}), now).requeue_after,
            None,
            "a suspended CronJob waits for a change"
        );
        let bad = plan_of(json!({"timeZone": "Mars/Olympus"}), now);
        assert_eq!((bad.requeue_after, bad.events[0].1), (None, "UnknownTimeZone"));
    }

    fn plan_of(spec: Value, now: Timestamp) -> Plan {
        plan(&cron_job(spec, json!({})), &[], now)
    }

    #[test]
    fn jobs_carry_the_template_the_owner_and_the_scheduled_time() {
        let plan = plan_of(json!({"timeZone": "Europe/Berlin"}), ts("2026-01-01T00:01:02Z"));
        let Op::Create(job) = &plan.ops[0] else { panic!("{:?}", plan.ops) };
        assert_eq!(job.metadata.labels.as_ref().unwrap()["app"], "hello");
        let annotations = job.metadata.annotations.as_ref().unwrap();
        assert_eq!(annotations[SCHEDULED_TIMESTAMP_ANNOTATION], "2026-01-01T01:01:00+01:00");
        let owner = &job.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!((owner.kind.as_str(), owner.uid.as_str(), owner.controller), ("CronJob", "cj-1", Some(true)));
        assert_eq!(job.spec.as_ref().unwrap().template.spec.as_ref().unwrap().restart_policy.as_deref(), Some("Never"));
        let utc = plan_of(json!({}), ts("2026-01-01T00:01:02Z"));
        let Op::Create(job) = &utc.ops[0] else { panic!() };
        assert_eq!(job.metadata.annotations.as_ref().unwrap()[SCHEDULED_TIMESTAMP_ANNOTATION], "2026-01-01T00:01:00Z");
    }

    #[test]
    fn the_last_successful_time_is_the_latest_completion() {
        let plan =
            plan(&cron_job(json!({}), json!({})), &[job(1, 'C'), job(2, 'C'), job(3, 'F')], ts("2026-01-01T00:03:30Z"));
        assert_eq!(plan.status.last_successful_time.map(|t| t.0), Some(ts("2026-01-01T00:02:05Z")));
    }
}
