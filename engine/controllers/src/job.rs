//! Job controller: runs Pods of the template until `completions` of them succeed, at most
//! `parallelism` at a time, and gives up after `backoffLimit` failed Pods; the Job's status
//! says which (the Complete or Failed condition), as the upstream controller's non-indexed mode.

use crate::{
    Action, Context, ReconcileError, Reconciler, names,
    owner::{controller_ref, owner_keys_for},
    plan::Op,
    replicaset::{is_active, phase},
    runtime::all_of,
};
use gitplane_api::events::{NORMAL, WARNING};
use gitplane_store::{Event, ObjectKey, informer::Cache};
use k8s_openapi::{
    api::{
        batch::v1::{Job, JobCondition, JobStatus},
        core::v1::Pod,
    },
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
};

pub struct JobController;

/// The label every Pod of a Job carries, as upstream.
pub const JOB_NAME_LABEL: &str = "batch.kubernetes.io/job-name";

/// What the Pods of a Job add up to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub active: i32,
    pub succeeded: i32,
    pub failed: i32,
}

impl Counts {
    /// A terminating Pod that has not finished counts for nothing, as upstream's active Pods
    /// leave it out: a replacement may start at once.
    pub fn of(pods: &[Pod]) -> Counts {
        let mut counts = Counts::default();
        for pod in pods {
            match phase(pod) {
                "Succeeded" => counts.succeeded += 1,
                "Failed" => counts.failed += 1,
                _ if is_active(pod) => counts.active += 1,
                _ => {}
            }
        }
        counts
    }
}

/// Where a Job stands and what it needs next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Create (positive) or delete (negative) this many active Pods.
    Run(i64),
    Complete,
    /// Failed, with the condition's reason and message.
    Failed(&'static str, String),
}

/// The next step of a Job from its settings (`completions`, `parallelism`, `backoffLimit`, with
/// upstream's defaults 1, 1, 6) and its Pods.
pub fn next_step(completions: Option<i32>, parallelism: Option<i32>, backoff_limit: Option<i32>, n: Counts) -> Step {
    let completions = completions.unwrap_or(1).max(0);
    let backoff_limit = backoff_limit.unwrap_or(6).max(0);
    if n.succeeded >= completions {
        return Step::Complete;
    }
    if n.failed > backoff_limit {
        return Step::Failed(
            "BackoffLimitExceeded",
            format!("Job has reached the specified backoff limit ({backoff_limit})"),
        );
    }
    let wanted = parallelism.unwrap_or(1).max(0).min(completions - n.succeeded);
    Step::Run(i64::from(wanted) - i64::from(n.active))
}

fn finished(job: &Job) -> bool {
    let conditions = job.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.into_iter().flatten().any(|c| matches!(c.type_.as_str(), "Complete" | "Failed") && c.status == "True")
}

fn new_pod(job: &Job) -> Result<Pod, ReconcileError> {
    let template = &job.spec.as_ref().ok_or_else(|| ReconcileError::Invalid("Job has no spec".into()))?.template;
    let template_meta = template.metadata.clone().unwrap_or_default();
    let name = job.metadata.name.clone().unwrap_or_default();
    let mut labels = template_meta.labels.unwrap_or_default();
    labels.insert(JOB_NAME_LABEL.into(), name.clone());
    Ok(Pod {
        metadata: ObjectMeta {
            name: Some(names::generate(&name)),
            namespace: job.metadata.namespace.clone(),
            labels: Some(labels),
            annotations: template_meta.annotations,
            owner_references: Some(vec![controller_ref("batch/v1", "Job", &job.metadata)]),
            ..Default::default()
        },
        spec: template.spec.clone(),
        status: None,
    })
}

fn condition(type_: &str, reason: Option<&str>, message: Option<String>, now: &Time) -> JobCondition {
    JobCondition {
        type_: type_.into(),
        status: "True".into(),
        reason: reason.map(str::to_owned),
        message,
        last_probe_time: Some(now.clone()),
        last_transition_time: Some(now.clone()),
    }
}

/// Where a Job stands (from its Pods: `owned`, the ones it controls) and the writes that take it
/// there: Pods created up to `parallelism`, surplus ones deleted, every active one deleted once
/// the Job is finished (as upstream stops what still runs).
pub fn plan(job: &Job, owned: &[Pod]) -> Result<(Step, Vec<Op<Pod>>), ReconcileError> {
    let spec = job.spec.as_ref().ok_or_else(|| ReconcileError::Invalid("Job has no spec".into()))?;
    let step = next_step(spec.completions, spec.parallelism, spec.backoff_limit, Counts::of(owned));
    let delete = |count: usize| -> Vec<Op<Pod>> {
        owned.iter().filter(|p| is_active(p)).take(count).map(|p| Op::Delete(p.clone())).collect()
    };
    let ops = match &step {
        Step::Run(n) if *n > 0 => (0..*n).map(|_| new_pod(job).map(Op::Create)).collect::<Result<_, _>>()?,
        Step::Run(n) => delete(n.unsigned_abs() as usize),
        Step::Complete | Step::Failed(..) => delete(usize::MAX),
    };
    Ok((step, ops))
}

/// The Job's status after `step`, with its Pods' `counts`; `now` stamps a finish.
pub fn status(job: &Job, step: &Step, counts: Counts, now: &Time) -> JobStatus {
    let old = job.status.clone().unwrap_or_default();
    let mut status = JobStatus {
        active: Some(counts.active),
        succeeded: Some(counts.succeeded),
        failed: Some(counts.failed),
        start_time: old.start_time.or_else(|| Some(now.clone())),
        conditions: old.conditions,
        completion_time: old.completion_time,
        ..Default::default()
    };
    match step {
        Step::Complete => {
            status.conditions.get_or_insert_with(Vec::new).push(condition("Complete", None, None, now));
            status.completion_time = Some(now.clone());
        }
        Step::Failed(reason, message) => {
            let failed = condition("Failed", Some(reason), Some(message.clone()), now);
            status.conditions.get_or_insert_with(Vec::new).push(failed);
        }
        Step::Run(_) => {}
    }
    status
}

#[async_trait::async_trait]
impl Reconciler for JobController {
    fn name(&self) -> &'static str {
        "job"
    }

    fn keys_for(&self, event: &Event, _: &Cache) -> Vec<ObjectKey> {
        owner_keys_for::<Job, Pod>(event)
    }

    fn all_keys(&self, cache: &Cache) -> Vec<ObjectKey> {
        all_of::<Job>(cache)
    }

    async fn reconcile(&self, key: &ObjectKey, ctx: &Context) -> Result<Action, ReconcileError> {
        let Some(job) = ctx.cache().get_typed::<Job>(&key.namespace, &key.name) else {
            return Ok(Action::await_change()); // gone: the garbage collector removes its Pods
        };
        if finished(&job) {
            return Ok(Action::await_change()); // a finished Job keeps its Pods and its status
        }
        let uid = job.metadata.uid.clone().unwrap_or_default();
        let owned = |cache: &Cache| cache.controlled_by::<Pod>(&key.namespace, &uid);
        let (step, ops) = plan(&job, &owned(ctx.cache()))?;
        let ops = ctx.admit_pods(ops);
        let events = crate::replicaset::pod_events(&ops);
        ctx.apply(ops).await?;
        for (reason, message) in events {
            ctx.event("job-controller", &job, NORMAL, reason, &message);
        }
        let counts = Counts::of(&owned(ctx.cache()));
        match &step {
            Step::Complete => {
                tracing::info!(succeeded = counts.succeeded, "job complete");
                ctx.event("job-controller", &job, NORMAL, "Completed", "Job completed");
            }
            Step::Failed(reason, message) => {
                tracing::info!(failed = counts.failed, "job failed: {message}");
                ctx.event("job-controller", &job, WARNING, reason, message);
            }
            Step::Run(_) => {}
        }
        let status = status(&job, &step, counts, &Time(k8s_openapi::jiff::Timestamp::now()));
        if job.status.as_ref() != Some(&status) {
            let mut updated = job.clone();
            updated.status = Some(status);
            ctx.update_status(&updated).await?;
        }
        Ok(Action::await_change())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn counts(active: i32, succeeded: i32, failed: i32) -> Counts {
        Counts { active, succeeded, failed }
    }

    #[test]
    fn a_job_runs_up_to_parallelism_until_enough_succeed() {
        assert_eq!(next_step(None, None, None, counts(0, 0, 0)), Step::Run(1));
        assert_eq!(next_step(None, None, None, counts(1, 0, 0)), Step::Run(0));
        assert_eq!(next_step(None, None, None, counts(0, 1, 0)), Step::Complete);
        assert_eq!(next_step(Some(5), Some(2), None, counts(0, 0, 0)), Step::Run(2));
        assert_eq!(next_step(Some(5), Some(2), None, counts(1, 4, 0)), Step::Run(0), "one more is running");
        assert_eq!(next_step(Some(5), Some(3), None, counts(3, 3, 0)), Step::Run(-1), "two are enough");
        assert_eq!(next_step(Some(3), Some(2), Some(1), counts(0, 1, 1)), Step::Run(2), "a failure is retried");
    }

    #[test]
    fn a_job_fails_past_its_backoff_limit() {
        assert!(matches!(next_step(None, None, Some(1), counts(0, 0, 2)), Step::Failed("BackoffLimitExceeded", _)));
        assert!(matches!(next_step(None, None, None, counts(0, 0, 7)), Step::Failed(..)), "the default limit is 6");
        assert_eq!(next_step(None, None, None, counts(0, 0, 6)), Step::Run(1));
    }

    fn job(completions: Option<i32>, parallelism: Option<i32>, backoff_limit: Option<i32>) -> Job {
        serde_json::from_value(json!({
            "metadata": {"name": "batch", "namespace": "default", "uid": "job-1"},
            "spec": {"completions": completions, "parallelism": parallelism, "backoffLimit": backoff_limit,
                     "template": {"metadata": {"labels": {"app": "batch"}},
                                  "spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "i"}]}}}
        }))
        .unwrap()
    }

    /// Pods named after their phase letter and position: `R0` Running, `S1` Succeeded, `F2` Failed,
    /// `T3` Running and terminating.
    fn pods(phases: &str) -> Vec<Pod> {
        phases
            .chars()
            .enumerate()
            .map(|(i, p)| {
                let phase = match p {
                    'R' | 'T' => "Running",
                    'S' => "Succeeded",
                    'F' => "Failed",
                    other => panic!("unknown phase {other}"),
                };
                let deleted = (p == 'T').then_some("2026-01-01T00:00:00Z");
                serde_json::from_value(json!({
                    "metadata": {"name": format!("{p}{i}"), "namespace": "default", "resourceVersion": "4",
                                 "deletionTimestamp": deleted},
                    "spec": {"containers": [{"name": "c", "image": "i"}]},
                    "status": {"phase": phase}
                }))
                .unwrap()
            })
            .collect()
    }

    fn describe(ops: &[Op<Pod>]) -> Vec<String> {
        ops.iter()
            .map(|op| match op {
                Op::Create(_) => "create".to_owned(),
                Op::Update(p) => format!("update {}", p.metadata.name.as_deref().unwrap()),
                Op::Delete(p) => format!("delete {}", p.metadata.name.as_deref().unwrap()),
            })
            .collect()
    }

    #[test]
    fn plan_table() {
        let failed = || Step::Failed("BackoffLimitExceeded", "Job has reached the specified backoff limit (1)".into());
        #[rustfmt::skip]
        let cases: Vec<(&str, Job, &str, Step, Vec<&str>)> = vec![
            ("defaults: one Pod", job(None, None, None), "", Step::Run(1), vec!["create"]),
            ("parallelism caps what runs", job(Some(5), Some(2), None), "", Step::Run(2), vec!["create"; 2]),
            ("completions cap parallelism", job(Some(2), Some(5), None), "S", Step::Run(1), vec!["create"]),
            ("running Pods count", job(Some(5), Some(2), None), "RS", Step::Run(1), vec!["create"]),
            ("no more than the completions left", job(Some(3), Some(3), None), "RRRS", Step::Run(-1), vec!["delete R0"]),
            ("a failed Pod is replaced", job(Some(2), Some(1), Some(1)), "FS", Step::Run(1), vec!["create"]),
            ("complete: what still runs is stopped", job(Some(2), Some(3), None), "SSR", Step::Complete, vec!["delete R2"]),
            ("past backoffLimit: failed, what still runs is stopped", job(Some(3), Some(2), Some(1)), "FFR", failed(), vec!["delete R2"]),
            ("at backoffLimit: still running", job(Some(3), Some(2), Some(1)), "FR", Step::Run(1), vec!["create"]),
            ("zero completions are complete at once", job(Some(0), None, None), "", Step::Complete, vec![]),
            ("a terminating Pod is replaced, not stopped again", job(Some(2), Some(1), None), "T", Step::Run(1), vec!["create"]),
            ("complete: a terminating Pod is left to its node", job(Some(1), Some(1), None), "ST", Step::Complete, vec![]),
        ];
        for (name, job, phases, step, ops) in cases {
            let (planned, planned_ops) = plan(&job, &pods(phases)).unwrap();
            assert_eq!(
                (planned, describe(&planned_ops)),
                (step, ops.iter().map(|s| s.to_string()).collect()),
                "{name}"
            );
        }
    }

    #[test]
    fn plan_makes_pods_of_the_template_that_name_their_job() {
        let (_, ops) = plan(&job(None, None, None), &[]).unwrap();
        let Op::Create(pod) = &ops[0] else { panic!("{ops:?}") };
        let labels = pod.metadata.labels.as_ref().unwrap();
        assert_eq!((labels["app"].as_str(), labels[JOB_NAME_LABEL].as_str()), ("batch", "batch"));
        assert_eq!(pod.metadata.owner_references.as_ref().unwrap()[0].uid, "job-1");
        assert!(plan(&Job::default(), &[]).is_err(), "no spec");
    }

    #[test]
    fn status_records_counts_and_the_finish() {
        let now = Time(k8s_openapi::jiff::Timestamp::from_second(100).unwrap());
        let job = job(Some(2), None, None);
        let running = status(&job, &Step::Run(1), counts(1, 1, 0), &now);
        assert_eq!((running.active, running.succeeded, running.failed), (Some(1), Some(1), Some(0)));
        assert_eq!(running.start_time.as_ref(), Some(&now));
        assert!(running.conditions.is_none() && running.completion_time.is_none());

        let mut started = job.clone();
        let earlier = Time(k8s_openapi::jiff::Timestamp::from_second(50).unwrap());
        started.status = Some(JobStatus { start_time: Some(earlier.clone()), ..Default::default() });
        let complete = status(&started, &Step::Complete, counts(0, 2, 0), &now);
        assert_eq!(complete.start_time, Some(earlier), "the start time stays");
        assert_eq!(complete.completion_time.as_ref(), Some(&now));
        let condition = &complete.conditions.unwrap()[0];
        assert_eq!((condition.type_.as_str(), condition.status.as_str()), ("Complete", "True"));

        let failed = status(&job, &Step::Failed("BackoffLimitExceeded", "too many".into()), counts(0, 0, 7), &now);
        let condition = &failed.conditions.unwrap()[0];
        assert_eq!((condition.type_.as_str(), condition.reason.as_deref()), ("Failed", Some("BackoffLimitExceeded")));
        assert!(failed.completion_time.is_none());
    }
}
