//! `gitplane status --wait` right after a real `git push` to a real `gitplane server`: it must
//! not exit 0 before the source has synced the pushed commit (the Application's status still
//! shows the previous commit Synced and Healthy for a moment after `git push` returns), and it
//! exits 1 with the errors when that commit is rejected, not 0 on the commit before it.

use anyhow::{Context, Result, ensure};
use gitplane_e2e::{Worktree, cluster::Cluster, cluster::loopback_get, wait_for};
use serde_json::Value;
use std::{fmt::Write as _, process::Command, time::Duration};

const DEADLINE: Duration = Duration::from_secs(60);
/// ConfigMaps in the commit pushed before waiting: enough that its sync takes a while after
/// `git push` returns, so a `--wait` that trusts the status alone would exit 0 on the last one.
const OBJECTS: usize = 1500;

fn app_sync(cluster: &Cluster) -> Value {
    loopback_get(cluster.addrs[&1], "/apis/gitplane.io/v1/namespaces/gitplane-system/applications/web")
        .ok()
        .and_then(|body| serde_json::from_str::<Value>(&body).ok())
        .map(|a| a["status"]["sync"].clone())
        .unwrap_or(Value::Null)
}

fn head(work: &Worktree) -> Result<String> {
    let out = Command::new("git").arg("-C").arg(&work.dir).args(["rev-parse", "HEAD"]).output()?;
    Ok(String::from_utf8(out.stdout)?.trim().to_owned())
}

fn cm(name: &str, value: &str) -> String {
    format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n  a: \"{value}\"\n")
}

#[test]
fn t87_status_wait_waits_for_the_pushed_commit() -> Result<()> {
    let cluster = Cluster::start(1, &["--bootstrap", "bootstrap"])?;
    cluster.leader(DEADLINE)?;
    let addr = cluster.addrs[&1];
    let token = std::fs::read_to_string(cluster.dir.path().join("replica-1/git-token"))?.trim().to_owned();
    let base = format!("http://git:{token}@{addr}/git");
    wait_for(DEADLINE, || cluster.dir.path().join("repos/bootstrap.git").exists().then_some(()))
        .context("the bootstrap repository")?;
    let apps = Worktree::clone(format!("{base}/bootstrap.git"), cluster.dir.path().join("apps"))?;
    apps.write(
        "web.yaml",
        "apiVersion: gitplane.io/v1\nkind: Application\nmetadata:\n  name: web\n  namespace: gitplane-system\n\
         spec:\n  repo: web\n  namespace: default\n",
    )?;
    apps.commit_and_push("the web Application")?;
    let url = format!("{base}/web.git");
    let work = wait_for(DEADLINE, || Worktree::clone(&url, cluster.dir.path().join("web")).ok())
        .context("cloning the web repository")?;

    let kubeconfig = cluster.dir.path().join("replica-1/kubeconfig");
    let gitplane = gitplane_e2e::binary("gitplane")?;
    let status_wait = || -> Result<(Option<i32>, String)> {
        let out = Command::new(&gitplane)
            .args(["status", "--wait", "--timeout", "120s", "--kubeconfig"])
            .arg(&kubeconfig)
            .output()?;
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        Ok((out.status.code(), text))
    };

    work.write("settings.yaml", &cm("settings", "1"))?;
    work.commit_and_push("first")?;
    let first = head(&work)?;
    let (code, out) = status_wait()?;
    ensure!(code == Some(0), "status --wait after the first push exited {code:?}:\n{out}");
    let sync = app_sync(&cluster);
    ensure!(sync["revision"] == first.as_str(), "exited 0 before {first} was synced: {sync}\n{out}");

    // Many objects: the source is still applying them when `git push` has returned.
    let mut many = String::new();
    for i in 0..OBJECTS {
        let _ = write!(many, "---\n{}", cm(&format!("many-{i:04}"), "1"));
    }
    work.write("many.yaml", &many)?;
    work.commit_and_push("many")?;
    let pushed = head(&work)?;
    let (code, out) = status_wait()?;
    let sync = app_sync(&cluster);
    ensure!(code == Some(0), "status --wait after the second push exited {code:?}:\n{out}\n{sync}");
    ensure!(
        sync["revision"] == pushed.as_str() && sync["status"] == "Synced",
        "status --wait exited 0 before {pushed} was synced: {sync}\n{out}"
    );
    ensure!(out.contains(&pushed[..8]), "the summary shows the synced commit:\n{out}");

    // An invalid commit let through (refusal off): exit 1 with its errors, not 0 on the last
    // good commit.
    let set = Command::new("git")
        .args(["config", "-f"])
        .arg(cluster.dir.path().join("repos/web.git/config"))
        .args(["gitplane.refuseInvalidPushes", "false"])
        .status()?;
    ensure!(set.success(), "git config");
    work.write("broken.yaml", &cm("broken", "1").replace("\ndata:", "\ndta:"))?;
    work.commit_and_push("invalid")?;
    let invalid = head(&work)?;
    let (code, out) = status_wait()?;
    let sync = app_sync(&cluster);
    ensure!(code == Some(1), "status --wait on a rejected commit exited {code:?}:\n{out}\n{sync}");
    ensure!(
        out.contains("broken.yaml") && out.contains(&invalid[..8]),
        "the reason names the file and the commit:\n{out}"
    );
    ensure!(sync["attemptedRevision"] == invalid.as_str(), "judged {invalid}: {sync}");
    ensure!(sync["revision"] == pushed.as_str(), "the last good commit stays applied: {sync}");
    Ok(())
}
