//! Push-time verdicts against a real `gitplane server` on loopback, with real `git push` over
//! HTTP: an invalid commit is refused with every error (file, line, object, path) as `remote:`
//! lines and the branch stays where it was; a valid one prints the plan (create, update with its
//! fields, prune; Secret values never shown); a repository that turns refusal off takes the
//! commit with warnings; pushes racing to one branch are each judged on their own commit; a
//! push whose parent's sync is pending is planned against that parent.

use anyhow::{Context, Result, ensure};
use gitplane_e2e::{Worktree, cluster::Cluster, cluster::loopback_get, wait_for};
use serde_json::Value;
use std::{path::Path, process::Command, time::Duration};

const DEADLINE: Duration = Duration::from_secs(60);

fn get(cluster: &Cluster, path: &str) -> Option<Value> {
    serde_json::from_str(&loopback_get(cluster.addrs[&1], path).ok()?).ok()
}

fn app_sync(cluster: &Cluster) -> Value {
    get(cluster, "/apis/gitplane.io/v1/namespaces/gitplane-system/applications/web")
        .map(|a| a["status"]["sync"].clone())
        .unwrap_or(Value::Null)
}

fn config_map(cluster: &Cluster, name: &str) -> Option<Value> {
    get(cluster, &format!("/api/v1/namespaces/default/configmaps/{name}")).filter(|v| v["kind"] == "ConfigMap")
}

/// The Event with `reason` about Application web.
fn event_about_web(cluster: &Cluster, reason: &str) -> Option<Value> {
    let events = get(cluster, "/api/v1/namespaces/gitplane-system/events")?;
    events["items"]
        .as_array()?
        .iter()
        .find(|e| {
            e["reason"] == reason
                && e["involvedObject"]["kind"] == "Application"
                && e["involvedObject"]["name"] == "web"
        })
        .cloned()
}

fn git(dir: &Path) -> Command {
    let mut command = Command::new("git");
    command
        .arg("-C")
        .arg(dir)
        .env("GIT_AUTHOR_NAME", "e2e")
        .env("GIT_AUTHOR_EMAIL", "e2e@localhost")
        .env("GIT_COMMITTER_NAME", "e2e")
        .env("GIT_COMMITTER_EMAIL", "e2e@localhost")
        .env("GIT_TERMINAL_PROMPT", "0");
    command
}

/// `git push url HEAD:main`: whether it succeeded, and what it printed.
fn push(work: &Worktree, url: &str) -> Result<(bool, String)> {
    let out = git(&work.dir).args(["push", url, "HEAD:main"]).output()?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    Ok((out.status.success(), text))
}

fn head(work: &Worktree) -> Result<String> {
    let out = git(&work.dir).args(["rev-parse", "HEAD"]).output()?;
    Ok(String::from_utf8(out.stdout)?.trim().to_owned())
}

/// The branch as the server has it (`git ls-remote`).
fn remote_main(url: &str) -> Result<String> {
    let out = Command::new("git").args(["ls-remote", url, "refs/heads/main"]).output()?;
    ensure!(out.status.success(), "ls-remote: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8(out.stdout)?.split_whitespace().next().unwrap_or("").to_owned())
}

fn cm(name: &str, value: &str) -> String {
    format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\ndata:\n  a: \"{value}\"\n")
}

fn secret(password_b64: &str) -> String {
    format!("apiVersion: v1\nkind: Secret\nmetadata:\n  name: db\ndata:\n  password: {password_b64}\n")
}

fn wait_synced(cluster: &Cluster, commit: &str) -> Result<()> {
    wait_for(DEADLINE, || {
        let sync = app_sync(cluster);
        (sync["status"] == "Synced" && sync["revision"] == commit).then_some(())
    })
    .with_context(|| format!("web did not sync {commit}: {}\n{}", app_sync(cluster), cluster.logs()))
}

#[test]
fn t83_push_verdicts_refuse_invalid_commits_and_print_the_plan() -> Result<()> {
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
    apps.commit("the web Application")?;
    let (ok, out) = push(&apps, &format!("{base}/bootstrap.git"))?;
    ensure!(ok, "bootstrap push: {out}");
    ensure!(out.contains("+ Application.gitplane.io gitplane-system/web"), "the root's plan: {out}");
    let url = format!("{base}/web.git");
    let work = wait_for(DEADLINE, || Worktree::clone(&url, cluster.dir.path().join("web")).ok())
        .context("cloning the web repository")?;

    // A valid first commit: everything to create.
    work.write("settings.yaml", &cm("settings", "1"))?;
    work.write("old.yaml", &cm("old", "1"))?;
    work.write("secret.yaml", &secret("aHVudGVyMg=="))?;
    work.commit("first")?;
    let (ok, out) = push(&work, &url)?;
    ensure!(ok, "a valid push is accepted: {out}");
    for line in
        ["3 to create, 0 to update, 0 to prune", "remote:   + ConfigMap default/settings", "+ Secret default/db"]
    {
        ensure!(out.contains(line), "the plan should say {line:?}:\n{out}");
    }
    let good = head(&work)?;
    wait_synced(&cluster, &good)?;

    // A schema error and a YAML syntax error: refused, every error named, nothing changes.
    work.write("settings.yaml", &cm("settings", "2").replace("\ndata:", "\ndta:"))?;
    work.write("broken.yaml", "a: [\n")?;
    work.commit("invalid")?;
    let (ok, out) = push(&work, &url)?;
    ensure!(!ok, "an invalid push must fail:\n{out}");
    for part in [
        "remote: gitplane: error: main ",
        "Application gitplane-system/web (path .) would reject this commit, 2 errors:",
        "remote:   broken.yaml:2:1: did not find expected node content",
        "remote:   settings.yaml:5: ConfigMap settings: ",
        "unknown field \"dta\"",
        "push refused",
        "pre-receive hook declined",
    ] {
        ensure!(out.contains(part), "the refusal should say {part:?}:\n{out}");
    }
    // The way out names the repository's own config file, ready to paste.
    let config = cluster.dir.path().join("repos/web.git/config");
    let hint = format!("git config -f {} gitplane.refuseInvalidPushes false", config.display());
    ensure!(out.contains(&hint), "the refusal should say {hint:?}:\n{out}");
    // The refusal stays on the Application's timeline as a Warning Event.
    let refused = wait_for(DEADLINE, || event_about_web(&cluster, "PushRefused"));
    let refused = refused.context("no PushRefused Event on Application web")?;
    ensure!(refused["type"] == "Warning", "{refused}");
    let message = refused["message"].as_str().unwrap_or("");
    ensure!(message.starts_with("push of main ") && message.contains("refused: 2 errors, the first: "), "{message}");
    // Both kinds of verdict so far are in the replica's metrics.
    let metrics = loopback_get(cluster.addrs[&1], "/metrics")?;
    for result in ["accepted", "refused"] {
        let name = format!("gitplane_push_verdict_duration_seconds_count{{result=\"{result}\"}} ");
        let count = metrics.lines().find_map(|l| l.strip_prefix(name.as_str())?.parse::<u64>().ok());
        ensure!(count.is_some_and(|c| c >= 1), "/metrics should count {result} verdicts: {count:?}");
    }
    ensure!(remote_main(&url)? == good, "the branch moved after a refused push");
    ensure!(config_map(&cluster, "settings").is_some_and(|c| c["data"]["a"] == "1"), "nothing is applied");
    ensure!(app_sync(&cluster)["revision"] == good.as_str(), "the sync never saw it: {}", app_sync(&cluster));

    // Fixed on top: one to create, two to update (the Secret's value never shown), one to prune.
    work.write("settings.yaml", &cm("settings", "2"))?;
    work.write("secret.yaml", &secret("c2VjcmV0LXR3bw=="))?;
    work.write("new.yaml", &cm("new", "1"))?;
    work.remove("broken.yaml")?;
    work.remove("old.yaml")?;
    work.commit("fixed")?;
    let (ok, out) = push(&work, &url)?;
    ensure!(ok, "the fixed push is accepted:\n{out}");
    for line in [
        "1 to create, 2 to update, 1 to prune",
        "remote:   + ConfigMap default/new",
        "remote:   ~ ConfigMap default/settings",
        "remote:       /data/a: \"1\" → \"2\"",
        "remote:   ~ Secret default/db",
        "remote:       /data/password: (secret value changed)",
        "remote:   - ConfigMap default/old",
    ] {
        ensure!(out.contains(line), "the plan should say {line:?}:\n{out}");
    }
    for secret in ["aHVudGVyMg==", "hunter2", "c2VjcmV0LXR3bw==", "secret-two"] {
        ensure!(!out.contains(secret), "a Secret value was printed:\n{out}");
    }
    let fixed = head(&work)?;
    wait_synced(&cluster, &fixed)?;
    println!("plan of the fixed push:\n{out}");

    // Refusal turned off for the repository: accepted with warnings; the sync rejects it.
    let set = |value: &str| -> Result<()> {
        let status = Command::new("git")
            .args(["config", "-f"])
            .arg(&config)
            .args(["gitplane.refuseInvalidPushes", value])
            .status()?;
        ensure!(status.success(), "git config");
        Ok(())
    };
    set("false")?;
    work.write("settings.yaml", &cm("settings", "3").replace("\ndata:", "\ndta:"))?;
    work.commit("invalid, let through")?;
    let (ok, out) = push(&work, &url)?;
    ensure!(ok, "with refusal off the push is accepted:\n{out}");
    ensure!(out.contains("gitplane: warning: main ") && out.contains("settings.yaml:5"), "warnings:\n{out}");
    let let_through = head(&work)?;
    ensure!(remote_main(&url)? == let_through, "the branch moved");
    let warned = wait_for(DEADLINE, || event_about_web(&cluster, "InvalidPushAccepted"));
    ensure!(
        warned.is_some_and(|e| e["message"].as_str().is_some_and(|m| m.contains("accepted: 1 error"))),
        "no InvalidPushAccepted Event on Application web"
    );
    wait_for(DEADLINE, || {
        let sync = app_sync(&cluster);
        (sync["status"] == "Failed" && sync["attemptedRevision"] == let_through.as_str()).then_some(())
    })
    .with_context(|| format!("the sync should reject it: {}", app_sync(&cluster)))?;
    ensure!(config_map(&cluster, "settings").is_some_and(|c| c["data"]["a"] == "2"), "the last good stays");
    set("true")?;
    work.write("settings.yaml", &cm("settings", "2"))?;
    work.commit("valid again")?;
    let (ok, out) = push(&work, &url)?;
    ensure!(ok, "{out}");
    let valid = head(&work)?;
    wait_synced(&cluster, &valid)?;

    // Two pushes race from the same parent: the invalid one is refused on its own commit,
    // the valid one lands.
    let clone = |name: &str| Worktree::clone(&url, cluster.dir.path().join(name));
    let (a, b) = (clone("race-a")?, clone("race-b")?);
    a.write("a.yaml", &cm("race-a", "1"))?;
    a.commit("a: valid")?;
    b.write("b.yaml", &cm("race-b", "1").replace("\ndata:", "\ndta:"))?;
    b.commit("b: invalid")?;
    let (ra, rb) = std::thread::scope(|s| {
        let ta = s.spawn(|| push(&a, &url));
        let tb = s.spawn(|| push(&b, &url));
        (ta.join().expect("push a"), tb.join().expect("push b"))
    });
    let ((ok_a, out_a), (ok_b, out_b)) = (ra?, rb?);
    ensure!(ok_a && out_a.contains("+ ConfigMap default/race-a") && !out_a.contains("race-b"), "a:\n{out_a}");
    ensure!(!ok_b, "b must fail:\n{out_b}");
    ensure!(!out_b.contains("race-a"), "b is judged on its own commit, not a's:\n{out_b}");
    ensure!(out_b.contains("b.yaml:5") || out_b.contains("fetch first") || out_b.contains("moved to"), "b:\n{out_b}");
    ensure!(remote_main(&url)? == head(&a)?, "a's commit is the branch");

    // Both valid from the same parent: git's compare-and-swap lets one through; each was judged
    // on its own commit.
    let a_head = head(&a)?;
    wait_synced(&cluster, &a_head)?;
    let (c, d) = (clone("race-c")?, clone("race-d")?);
    c.write("c.yaml", &cm("race-c", "1"))?;
    c.commit("c")?;
    d.write("d.yaml", &cm("race-d", "1"))?;
    d.commit("d")?;
    let (rc, rd) = std::thread::scope(|s| {
        let tc = s.spawn(|| push(&c, &url));
        let td = s.spawn(|| push(&d, &url));
        (tc.join().expect("push c"), td.join().expect("push d"))
    });
    let ((ok_c, out_c), (ok_d, out_d)) = (rc?, rd?);
    ensure!(ok_c != ok_d, "exactly one of two racing pushes lands:\nc: {out_c}\nd: {out_d}");
    ensure!(!out_c.contains("race-d") && !out_d.contains("race-c"), "each judged alone:\nc: {out_c}\nd: {out_d}");
    let winner = if ok_c { head(&c)? } else { head(&d)? };
    ensure!(remote_main(&url)? == winner, "the winner's commit is the branch");
    println!("race: c {ok_c}, d {ok_d}\nc:\n{out_c}\nd:\n{out_d}");
    wait_synced(&cluster, &winner)?;

    // `gitplane diff` of a work tree against the live cluster: create, update, prune and a
    // Secret change (its values masked).
    let work = clone("diff")?;
    work.write("settings.yaml", &cm("settings", "5"))?;
    work.write("created.yaml", &cm("created", "1"))?;
    work.remove("new.yaml")?;
    work.write("secret.yaml", &format!("{}  user: YWRtaW4=\n", secret("c2VjcmV0LXRocmVl")))?;
    let kubeconfig = cluster.dir.path().join("replica-1/kubeconfig");
    let gitplane = gitplane_e2e::binary("gitplane")?;
    let diff = |extra: &[&str]| -> Result<(Option<i32>, String, String)> {
        let out = Command::new(&gitplane)
            .arg("diff")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(extra)
            .current_dir(&work.dir)
            .output()?;
        Ok((out.status.code(), String::from_utf8(out.stdout)?, String::from_utf8_lossy(&out.stderr).into_owned()))
    };
    let (code, out, err) = diff(&["--app", "web"])?;
    ensure!(code == Some(1), "differences exit 1, not {code:?}: {err}\n{out}");
    ensure!(out == DIFF, "gitplane diff printed:\n{out}\nexpected:\n{DIFF}");
    for secret in ["c2VjcmV0LXRocmVl", "YWRtaW4=", "c2VjcmV0LXR3bw=="] {
        ensure!(!out.contains(secret), "a Secret value was printed:\n{out}");
    }
    let (code, json, err) = diff(&["--app", "web", "--output", "json"])?;
    ensure!(code == Some(1), "{err}");
    let report: Value = serde_json::from_str(&json)?;
    ensure!(report["create"] == 1 && report["update"] == 2 && report["prune"] == 1, "{report}");
    ensure!(report["application"] == "gitplane-system/web", "{report}");
    // Without --app: the Application that reads this directory of this repository is found and
    // named, and what it would prune shows.
    let (code, out, err) = diff(&[])?;
    ensure!(code == Some(1) && out == DIFF, "without --app: {code:?} {err}\n{out}");
    ensure!(err.contains("against Application gitplane-system/web"), "which Application: {err}");

    // The committed branch, and no differences once it is synced.
    work.commit("diffed")?;
    let (code, out, err) = diff(&["--app", "web", "--rev", "HEAD"])?;
    ensure!(code == Some(1) && out == DIFF, "--rev HEAD: {code:?} {err}\n{out}");
    let (ok, pushed) = push(&work, &url)?;
    ensure!(ok, "{pushed}");
    wait_synced(&cluster, &head(&work)?)?;
    let (code, out, err) = diff(&["--app", "web"])?;
    ensure!(code == Some(0) && out.is_empty(), "no differences after the sync: {code:?} {err}\n{out}");
    let (code, _, err) = diff(&["--app", "gitplane-system/nope"])?;
    ensure!(code == Some(2) && err.contains("not found"), "an error exits 2: {code:?} {err}");

    // A parent whose sync is pending (this Application waits for a dependency that does not
    // exist, so it never syncs): the push is planned against the cluster as the parent's sync
    // will leave it, without waiting for that sync; a parent its sync will reject leaves the
    // cluster as it is, and the plan says so.
    apps.write(
        "held.yaml",
        "apiVersion: gitplane.io/v1\nkind: Application\nmetadata:\n  name: held\n  namespace: gitplane-system\n\
         spec:\n  repo: held\n  namespace: default\n  prune: true\n  dependsOn: [gate]\n",
    )?;
    apps.commit("the held Application")?;
    let (ok, out) = push(&apps, &format!("{base}/bootstrap.git"))?;
    ensure!(ok, "bootstrap push: {out}");
    let held_url = format!("{base}/held.git");
    let held = wait_for(DEADLINE, || Worktree::clone(&held_url, cluster.dir.path().join("held")).ok())
        .context("cloning the held repository")?;
    held.write("a.yaml", &cm("held-a", "1"))?;
    held.write("b.yaml", &cm("held-b", "1"))?;
    held.commit("held: first")?;
    let (ok, out) = push(&held, &held_url)?;
    ensure!(ok && out.contains("2 to create, 0 to update, 0 to prune"), "held's first push:\n{out}");
    held.write("a.yaml", &cm("held-a", "2"))?;
    held.remove("b.yaml")?;
    held.write("c.yaml", &cm("held-c", "1"))?;
    held.commit("held: second")?;
    let (ok, out) = push(&held, &held_url)?;
    ensure!(ok, "held's second push:\n{out}");
    for line in [
        "1 to create, 1 to update, 1 to prune",
        "remote:   ~ ConfigMap default/held-a",
        "remote:       /data/a: \"1\" → \"2\"",
        "remote:   - ConfigMap default/held-b",
        "remote:   + ConfigMap default/held-c",
    ] {
        ensure!(out.contains(line), "planned against its parent, the plan should say {line:?}:\n{out}");
    }
    let held_config = cluster.dir.path().join("repos/held.git/config");
    let refuse = |value: &str| -> Result<()> {
        let status = Command::new("git")
            .args(["config", "-f"])
            .arg(&held_config)
            .args(["gitplane.refuseInvalidPushes", value])
            .status()?;
        ensure!(status.success(), "git config");
        Ok(())
    };
    refuse("false")?;
    held.write("a.yaml", &cm("held-a", "3").replace("\ndata:", "\ndta:"))?;
    held.commit("held: invalid, let through")?;
    let (ok, out) = push(&held, &held_url)?;
    ensure!(ok && out.contains("a.yaml:5"), "with refusal off the push is accepted:\n{out}");
    let invalid = head(&held)?;
    refuse("true")?;
    held.write("a.yaml", &cm("held-a", "3"))?;
    held.commit("held: valid again")?;
    let (ok, out) = push(&held, &held_url)?;
    ensure!(ok, "held's valid push:\n{out}");
    let note = format!("(the sync of {} is pending and will reject it", &invalid[..10]);
    ensure!(out.contains(&note) && out.contains("2 to create, 0 to update, 0 to prune"), "{note}:\n{out}");
    ensure!(config_map(&cluster, "held-a").is_none(), "held never synced, yet held-a exists");

    // What gives root on a node or takes an address is refused with the field and why: a Pod
    // that shares the node's PID namespace and mounts its root, a Service with externalIPs. A
    // NetworkPolicy that shuts the Ingress out is a warning. In a namespace whose manifest in
    // Git says privileged, the Pod is accepted.
    let rooted = clone("rooted")?;
    rooted.write("rooted.yaml", &rooted_pod("default"))?;
    rooted.write("taken.yaml", TAKEN)?;
    rooted.commit("root on the node")?;
    let (ok, out) = push(&rooted, &url)?;
    ensure!(!ok, "a Pod that is root on its node must be refused:\n{out}");
    for part in [
        "Pod rooted: /spec/hostPID: hostPID: true shares the node's namespace is not allowed by the Pod Security \
         Standard \"baseline\", which namespace default enforces",
        "Pod rooted: /spec/volumes/0/hostPath: a hostPath volume mounts the node's files",
        "Service taken: /spec/externalIPs/0: 198.51.100.7 cannot be an external IP: external IPs are refused",
    ] {
        ensure!(out.contains(part), "the refusal should say {part:?}:\n{out}");
    }
    rooted.remove("taken.yaml")?;
    rooted.write("rooted.yaml", &format!("{TOOLS}---\n{}", rooted_pod("tools")))?;
    rooted.write("shut.yaml", SHUT)?;
    rooted.commit("root on the node, where the namespace allows it")?;
    let (ok, out) = push(&rooted, &url)?;
    ensure!(ok && out.contains("+ Pod tools/rooted"), "a privileged namespace's Pod is accepted:\n{out}");
    ensure!(
        out.contains("gitplane: warning: ")
            && out.contains("NetworkPolicy default/shut isolates the Pods of Service shop"),
        "a policy that shuts the Ingress out is a warning:\n{out}"
    );
    Ok(())
}

/// A Pod in `namespace` that shares the node's PID namespace and mounts its root.
fn rooted_pod(namespace: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: rooted\n  namespace: {namespace}\nspec:\n  hostPID: true\n  \
         volumes: [{{name: root, hostPath: {{path: /}}}}]\n  containers: [{{name: c, image: gitplane.local/httpd:1}}]\n"
    )
}

/// A Service that lists an external IP.
const TAKEN: &str = "apiVersion: v1\nkind: Service\nmetadata:\n  name: taken\nspec:\n  ports: [{port: 80}]\n  \
                     externalIPs: [198.51.100.7]\n";

/// A namespace whose Pods may be privileged.
const TOOLS: &str = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: tools\n  labels: {pod-security.kubernetes.io/enforce: privileged}\n";

/// An Ingress to Pods a NetworkPolicy isolates without letting the nodes in.
const SHUT: &str = "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: shop}\nspec:\n  replicas: 0\n  \
    selector: {matchLabels: {app: shop}}\n  template:\n    metadata: {labels: {app: shop}}\n    \
    spec: {containers: [{name: c, image: gitplane.local/httpd:1}]}\n---\napiVersion: v1\nkind: Service\n\
    metadata: {name: shop}\nspec:\n  selector: {app: shop}\n  ports: [{port: 80}]\n---\n\
    apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: shop}\nspec:\n  rules: [{http: {paths: \
    [{path: /, pathType: Prefix, backend: {service: {name: shop, port: {number: 80}}}}]}}]\n---\n\
    apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: shut}\nspec:\n  \
    podSelector: {matchLabels: {app: shop}}\n  policyTypes: [Ingress]\n";

/// What `gitplane diff` prints for the change above (nothing in it varies between runs).
const DIFF: &str = "\
diff -u -N /tmp/LIVE/v1.ConfigMap.default.created /tmp/MERGED/v1.ConfigMap.default.created
--- /tmp/LIVE/v1.ConfigMap.default.created
+++ /tmp/MERGED/v1.ConfigMap.default.created
@@ -0,0 +1,9 @@
+apiVersion: v1
+kind: ConfigMap
+metadata:
+  annotations:
+    gitplane.io/application: gitplane-system/web
+  name: created
+  namespace: default
+data:
+  a: '1'
diff -u -N /tmp/LIVE/v1.Secret.default.db /tmp/MERGED/v1.Secret.default.db
--- /tmp/LIVE/v1.Secret.default.db
+++ /tmp/MERGED/v1.Secret.default.db
@@ -7,4 +7,5 @@
   namespace: default
 data:
   password: <masked>
+  user: <masked>
 type: Opaque
diff -u -N /tmp/LIVE/v1.ConfigMap.default.settings /tmp/MERGED/v1.ConfigMap.default.settings
--- /tmp/LIVE/v1.ConfigMap.default.settings
+++ /tmp/MERGED/v1.ConfigMap.default.settings
@@ -6,4 +6,4 @@
   name: settings
   namespace: default
 data:
-  a: '2'
+  a: '5'
diff -u -N /tmp/LIVE/v1.ConfigMap.default.new /tmp/MERGED/v1.ConfigMap.default.new
--- /tmp/LIVE/v1.ConfigMap.default.new
+++ /tmp/MERGED/v1.ConfigMap.default.new
@@ -1,9 +0,0 @@
-apiVersion: v1
-kind: ConfigMap
-metadata:
-  annotations:
-    gitplane.io/application: gitplane-system/web
-  name: new
-  namespace: default
-data:
-  a: '1'
";
