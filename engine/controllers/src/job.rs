//! Job controller: runs Pods of the template until `completions` of them succeed, at most
//! `parallelism` at a time, and gives up after `backoffLimit` failed Pods; the Job's status
//! says which (the Complete or Failed condition), as the upstream controller's non-indexed mode.

use crate::{
    Action, Context, ReconcileError, Reconciler, names,
    owner::{controller_ref, controllers_of, is_controlled_by},
    replicaset::{is_active, phase},
    runtime::all_of,
};
use gitplane_api::object::{kind_of, revision_of, to_value};
use gitplane_store::{Event, ObjectKey, Op, informer::Cache};
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
    fn of(pods: &[Pod]) -> Counts {
        let mut counts = Counts::default();
        for pod in pods {
            match phase(pod) {
                "Succeeded" => counts.succeeded += 1,
                "Failed" => counts.failed += 1,
                _ => counts.active += 1,
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

#[async_trait::async_trait]
impl Reconciler for JobController {
    fn name(&self) -> &'static str {
        "job"
    }

    fn keys_for(&self, event: &Event, _: &Cache) -> Vec<ObjectKey> {
        if event.key.kind == kind_of::<Job>() {
            return vec![event.key.clone()];
        }
        if event.key.kind == kind_of::<Pod>() {
            return controllers_of::<Job>(event);
        }
        Vec::new()
    }

    fn all_keys(&self, cache: &Cache) -> Vec<ObjectKey> {
        all_of::<Job>(cache)
    }

    async fn reconcile(&self, key: &ObjectKey, ctx: &Context) -> Result<Action, ReconcileError> {
        let Some(job) = ctx.cache().get_typed::<Job>(&key.namespace, &key.name) else {
            return Ok(Action::AwaitChange); // gone: the garbage collector removes its Pods
        };
        if finished(&job) {
            return Ok(Action::AwaitChange); // a finished Job keeps its Pods and its status
        }
        let uid = job.metadata.uid.clone().unwrap_or_default();
        let owned = |cache: &Cache| cache.list_typed_where::<Pod>(Some(&key.namespace), |p| is_controlled_by(p, &uid));
        let spec = job.spec.clone().unwrap_or_default();
        let pods = owned(ctx.cache());
        let step = next_step(spec.completions, spec.parallelism, spec.backoff_limit, Counts::of(&pods));
        let delete = |count: usize| -> Vec<Op> {
            pods.iter()
                .filter(|p| is_active(p))
                .take(count)
                .map(|p| Op::Delete {
                    key: ObjectKey::of::<Pod>(&key.namespace, p.metadata.name.as_deref().unwrap_or("")),
                    revision: revision_of(p),
                })
                .collect()
        };
        let ops = match &step {
            Step::Run(n) if *n > 0 => {
                (0..*n).map(|_| new_pod(&job).map(|p| Op::Create(to_value(&p)))).collect::<Result<_, _>>()?
            }
            Step::Run(n) => delete(n.unsigned_abs() as usize),
            // Whatever still runs is stopped, as upstream does once a Job is finished.
            Step::Complete | Step::Failed(..) => delete(usize::MAX),
        };
        ctx.commit(ops).await?;

        let counts = Counts::of(&owned(ctx.cache()));
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let old = job.status.clone().unwrap_or_default();
        let mut status = JobStatus {
            active: Some(counts.active),
            succeeded: Some(counts.succeeded),
            failed: Some(counts.failed),
            start_time: old.start_time.clone().or_else(|| Some(now.clone())),
            conditions: old.conditions.clone(),
            completion_time: old.completion_time.clone(),
            ..Default::default()
        };
        match step {
            Step::Complete => {
                status.conditions.get_or_insert_with(Vec::new).push(condition("Complete", None, None, &now));
                status.completion_time = Some(now.clone());
                tracing::info!(succeeded = counts.succeeded, "job complete");
            }
            Step::Failed(reason, message) => {
                tracing::info!(failed = counts.failed, "job failed: {message}");
                status.conditions.get_or_insert_with(Vec::new).push(condition(
                    "Failed",
                    Some(reason),
                    Some(message),
                    &now,
                ));
            }
            Step::Run(_) => {}
        }
        if job.status.as_ref() != Some(&status) {
            let mut updated = job.clone();
            updated.status = Some(status);
            ctx.commit(vec![Op::UpdateStatus(to_value(&updated))]).await?;
        }
        Ok(Action::AwaitChange)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
