//! Argo CD's sync-waves example (argoproj/argocd-example-apps, `sync-waves/manifests.yaml`, in
//! `tests/corpus`) pushed as published to `gitplane up --nodes 1`, its images stand-ins served by
//! the test kit's registry. The PreSync Job (named by generateName) completes before the wave-0
//! objects exist; each wave starts once the one before is healthy (the maint-page-up hook after
//! the backend is ready, the frontend after that hook completed, maint-page-down after the
//! frontend is ready); the hooks are not pruned and not part of the Application's objects. A
//! second commit runs the hooks again: BeforeHookCreation replaces the named Sync hook, and a
//! HookSucceeded PreSync hook is deleted once it completed.

use anyhow::{Context, Result, ensure};
use gitplane_e2e::{LocalCluster, Worktree, require_root, wait_for};
use gitplane_testkit::registry::{self, Registry, StandIn};
use serde_json::Value;
use std::time::Duration;

const DEADLINE: Duration = Duration::from_secs(240);
const PUBLISHED: &str = include_str!("../corpus/plain/argocd-sync-waves/manifests.yaml");

fn get(cluster: &LocalCluster, path: &str) -> Option<Value> {
    cluster.get(path).ok().filter(|v| v["kind"] != "Status")
}

fn jobs(cluster: &LocalCluster) -> Vec<Value> {
    let list = get(cluster, "/apis/batch/v1/namespaces/default/jobs");
    list.and_then(|l| l["items"].as_array().cloned()).unwrap_or_default()
}

fn job(cluster: &LocalCluster, name: &str) -> Option<Value> {
    get(cluster, &format!("/apis/batch/v1/namespaces/default/jobs/{name}"))
}

/// The Jobs named by the PreSync hook's generateName.
fn schema_jobs(cluster: &LocalCluster) -> Vec<Value> {
    let generated = |j: &Value| j["metadata"]["name"].as_str().is_some_and(|n| n.starts_with("upgrade-sql-schema"));
    jobs(cluster).into_iter().filter(generated).collect()
}

fn complete(job: &Value) -> bool {
    job["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == "Complete" && c["status"] == "True")
}

fn replica_set(cluster: &LocalCluster, name: &str) -> Option<Value> {
    get(cluster, &format!("/apis/apps/v1/namespaces/default/replicasets/{name}"))
}

fn ready(rs: &Value) -> bool {
    rs["status"]["readyReplicas"].as_i64() == Some(1)
}

fn app(cluster: &LocalCluster) -> Value {
    get(cluster, "/apis/gitplane.io/v1/namespaces/gitplane-system/applications/demo").unwrap_or_default()
}

fn explain(cluster: &LocalCluster) -> String {
    let names: Vec<String> =
        jobs(cluster).iter().map(|j| format!("{} complete={}", j["metadata"]["name"], complete(j))).collect();
    format!("jobs: {names:?}\napplication status: {}\n{}", app(cluster)["status"], cluster.log_tail())
}

/// Polls the sync until the Application is Synced at `commit`; with `in_order`, checks at every
/// look that nothing ran before what it waits for. The uid of maint-page-up at the end.
fn watch_sync(cluster: &LocalCluster, commit: &str, in_order: bool) -> Result<String> {
    let mut violations = Vec::new();
    let synced = wait_for(DEADLINE, || {
        // Each check reads what comes later first: a later read can only show more progress.
        if in_order {
            let backend = replica_set(cluster, "backend");
            if backend.is_some() && !schema_jobs(cluster).iter().any(complete) {
                violations.push("the backend (wave 0) existed before the PreSync hook completed");
            }
            let up = job(cluster, "maint-page-up");
            if up.is_some() && !replica_set(cluster, "backend").as_ref().is_some_and(ready) {
                violations.push("maint-page-up (wave 1) ran before the backend (wave 0) was ready");
            }
            let frontend = replica_set(cluster, "frontend");
            if frontend.is_some() && !job(cluster, "maint-page-up").as_ref().is_some_and(complete) {
                violations.push("the frontend (wave 2) existed before maint-page-up (wave 1) completed");
            }
            let down = job(cluster, "maint-page-down");
            if down.is_some() && !replica_set(cluster, "frontend").as_ref().is_some_and(ready) {
                violations.push("maint-page-down (wave 3) ran before the frontend (wave 2) was ready");
            }
        }
        let sync = &app(cluster)["status"]["sync"];
        (sync["status"] == "Synced" && sync["revision"] == commit).then_some(())
    });
    ensure!(violations.is_empty(), "out of order: {violations:?}\n{}", explain(cluster));
    synced.with_context(|| format!("commit {commit} never synced\n{}", explain(cluster)))?;
    let down = wait_for(DEADLINE, || job(cluster, "maint-page-down").filter(complete));
    ensure!(down.is_some(), "maint-page-down never completed\n{}", explain(cluster));
    let up = job(cluster, "maint-page-up").filter(complete).context("maint-page-up completed")?;
    Ok(up["metadata"]["uid"].as_str().unwrap_or_default().to_owned())
}

#[test]
fn t97_argo_cds_sync_waves_example_runs_its_hooks_and_waves_in_order() -> Result<()> {
    require_root()?;
    let dir = tempfile::tempdir()?;
    let mirror = registry::address(5000);
    let file = registry::write_registries_file(dir.path(), mirror, &[])?;
    let cluster = LocalCluster::up_with("gp97", 1, &["--registries", &file.to_string_lossy()])?;
    let registry = Registry::start(&dir.path().join("mirror"), &cluster, mirror, None)?;
    let alpine = StandIn { cmd: vec!["/bin/sh".into()], ..StandIn::default() };
    registry.push_stand_in("alpine:latest", &alpine)?;
    registry.push_stand_in("nginx:latest", &StandIn::nginx())?;
    let work = Worktree::clone(cluster.demo_repo(), dir.path().join("demo"))?;
    work.remove("web.yaml")?;
    work.write("manifests.yaml", PUBLISHED)?;
    work.commit_and_push("Argo CD's sync-waves example")?;
    let first = work.head()?;

    let up = watch_sync(&cluster, &first, true)?;
    let presync = schema_jobs(&cluster);
    ensure!(presync.len() == 1 && complete(&presync[0]), "one completed PreSync Job: {presync:?}");
    let name = presync[0]["metadata"]["name"].as_str().unwrap_or_default();
    let expected = format!("upgrade-sql-schema{}-presync-", &first[..7]);
    ensure!(name.starts_with(&expected), "the PreSync Job is named {name}, not {expected}<start>");
    // Hooks are not the Application's objects: its health lists none and nothing pruned them.
    let status = &app(&cluster)["status"];
    ensure!(status["sync"]["changes"]["created"] == 4, "created the 4 objects of the desired state: {status}");
    let healthy =
        wait_for(DEADLINE, || Some(app(&cluster)["status"]["health"].clone()).filter(|h| h["status"] == "Healthy"));
    ensure!(healthy.is_some(), "the Application never became Healthy\n{}", explain(&cluster));

    // A second commit: the PreSync hook now deleted once it succeeded, the frontend changed.
    let second_manifests = PUBLISHED
        .replace(
            "    argocd.argoproj.io/hook: PreSync\n",
            "    argocd.argoproj.io/hook: PreSync\n    argocd.argoproj.io/hook-delete-policy: HookSucceeded\n",
        )
        .replace("  name: frontend\n  annotations:\n", "  name: frontend\n  labels: {release: two}\n  annotations:\n");
    ensure!(second_manifests.contains("HookSucceeded") && second_manifests.contains("release: two"), "edited");
    work.write("manifests.yaml", &second_manifests)?;
    work.commit_and_push("the PreSync hook is deleted once it succeeded")?;
    let second = work.head()?;
    let up_again = watch_sync(&cluster, &second, false)?;
    ensure!(up_again != up, "BeforeHookCreation replaced maint-page-up (uid {up} both times)");
    let presync = schema_jobs(&cluster);
    let names: Vec<&str> = presync.iter().filter_map(|j| j["metadata"]["name"].as_str()).collect();
    ensure!(names == [name], "the second PreSync Job is deleted (HookSucceeded), the first kept: {names:?}");
    let frontend = replica_set(&cluster, "frontend").context("the frontend")?;
    ensure!(frontend["metadata"]["labels"]["release"] == "two", "the second commit applied: {frontend}");

    drop(registry);
    cluster.stop_within(Duration::from_secs(30))?;
    Ok(())
}
