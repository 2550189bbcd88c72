//! The GitOps source end to end against a real `gitplane server` on loopback: Applications from
//! a bootstrap repository pushed over HTTP (the token is required), templates with values, a
//! remote repository synced on a signed webhook, and hostile or broken commits rejected whole
//! while the last good state stays.

use anyhow::{Context, Result, ensure};
use gitplane_e2e::{
    Worktree,
    cluster::{Cluster, loopback_get, loopback_request},
    wait_for,
};
use hmac::{Hmac, Mac};
use serde_json::Value;
use sha2::Sha256;
use std::time::{Duration, Instant};

const DEADLINE: Duration = Duration::from_secs(60);
const SECRET: &str = "webhook-secret-for-tests";

fn get(cluster: &Cluster, path: &str) -> Option<Value> {
    serde_json::from_str(&loopback_get(cluster.addrs[&1], path).ok()?).ok()
}

fn app_status(cluster: &Cluster, name: &str) -> Value {
    get(cluster, &format!("/apis/gitplane.io/v1/namespaces/gitplane-system/applications/{name}"))
        .map(|a| a["status"].clone())
        .unwrap_or(Value::Null)
}

fn wait_app(cluster: &Cluster, name: &str, what: &str, check: impl Fn(&Value) -> bool) -> Result<Value> {
    wait_for(DEADLINE, || Some(app_status(cluster, name)).filter(|s| check(s))).with_context(|| {
        format!("Application {name}: {what}; status {}\n{}", app_status(cluster, name), cluster.logs())
    })
}

fn config_map(cluster: &Cluster, name: &str) -> Option<Value> {
    get(cluster, &format!("/api/v1/namespaces/default/configmaps/{name}")).filter(|v| v["kind"] == "ConfigMap")
}

fn application(name: &str, repo: &str, extra: &str) -> String {
    format!(
        "apiVersion: gitplane.io/v1\nkind: Application\nmetadata:\n  name: {name}\n  namespace: gitplane-system\nspec:\n  repo: {repo}\n  namespace: default\n{extra}"
    )
}

fn sign(body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(SECRET.as_bytes()).expect("any key length");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

#[test]
fn t80_gitops_over_http_templates_webhooks_and_bad_commits() -> Result<()> {
    let secrets = tempfile::tempdir()?;
    let secret_file = secrets.path().join("webhook-secret");
    std::fs::write(&secret_file, SECRET)?;
    let secret_arg = secret_file.to_string_lossy().into_owned();
    let cluster =
        Cluster::start(1, &["--bootstrap", "bootstrap", "--webhook-secret-file", &secret_arg, "--allow-file-urls"])?;
    cluster.leader(DEADLINE)?;
    let addr = cluster.addrs[&1];
    let token = std::fs::read_to_string(cluster.dir.path().join("replica-1/git-token"))?.trim().to_owned();
    let anonymous = format!("http://{addr}/git");
    let authenticated = format!("http://git:{token}@{addr}/git");
    wait_for(DEADLINE, || std::path::Path::new(&cluster.dir.path().join("repos/bootstrap.git")).exists().then_some(()))
        .context("the leader makes the bootstrap repository")?;

    // Applications come from the bootstrap repository; cloning and pushing need the token.
    let refused = Worktree::clone(format!("{anonymous}/bootstrap.git"), cluster.dir.path().join("nope"));
    ensure!(refused.is_err(), "an anonymous clone of a hosted repository is refused");
    let apps = Worktree::clone(format!("{authenticated}/bootstrap.git"), cluster.dir.path().join("apps"))?;
    apps.write("web.yaml", &application("web", "web", "  values:\n    greeting: hello\n"))?;
    apps.commit("the web Application")?;
    let refused = apps.push(&format!("{anonymous}/bootstrap.git")).unwrap_err().to_string();
    let asked = |e: &str| e.contains("401") || e.contains("Authentication") || e.contains("Username");
    ensure!(asked(&refused), "push without a token: {refused}");
    let wrong = apps.push(&format!("http://git:wrong@{addr}/git/bootstrap.git")).unwrap_err().to_string();
    ensure!(asked(&wrong), "push with a wrong token: {wrong}");
    apps.push(&format!("{authenticated}/bootstrap.git"))?;
    wait_app(&cluster, "web", "created from Git", |s| !s.is_null())?;

    // The web repository was made for it; a template rendered with the Application's values.
    let web =
        wait_for(DEADLINE, || Worktree::clone(format!("{authenticated}/web.git"), cluster.dir.path().join("web")).ok())
            .context("cloning the web repository")?;
    // This test is about the sync's verdict: the push's own (t83) lets invalid commits through.
    let config = cluster.dir.path().join("repos/web.git/config");
    let off = std::process::Command::new("git")
        .args(["config", "-f"])
        .arg(&config)
        .args(["gitplane.refuseInvalidPushes", "false"])
        .status()?;
    ensure!(off.success(), "turning push refusal off");
    web.write(
        "settings.yaml.j2",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  greeting: \"{{ greeting }}\"\n",
    )?;
    web.commit("settings from a template")?;
    let pushed = Instant::now();
    web.push(&format!("{authenticated}/web.git"))?;
    let cm = wait_for(DEADLINE, || config_map(&cluster, "settings")).context("the rendered ConfigMap")?;
    println!("push-to-applied over HTTP: {:?}", pushed.elapsed());
    ensure!(cm["data"]["greeting"] == "hello", "rendered: {cm}");

    // An undefined template variable rejects the commit, naming file and line; the last good stays.
    web.write(
        "settings.yaml.j2",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  greeting: \"{{ greting }}\"\n",
    )?;
    web.commit("a typo")?;
    web.push(&format!("{authenticated}/web.git"))?;
    let failed = wait_app(&cluster, "web", "the typo rejected", |s| s["sync"]["status"] == "Failed")?;
    let errors = failed["sync"]["errors"].to_string();
    ensure!(errors.contains("settings.yaml.j2") && errors.contains("greting"), "errors: {errors}");
    ensure!(config_map(&cluster, "settings").is_some_and(|c| c["data"]["greeting"] == "hello"), "the last good stays");

    // A symlink that leaves the repository is refused, naming the file.
    web.write(
        "settings.yaml.j2",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  greeting: \"{{ greeting }}\"\n",
    )?;
    std::os::unix::fs::symlink("../../../etc/passwd.yaml", web.dir.join("leak.yaml"))?;
    web.commit("a symlink out")?;
    web.push(&format!("{authenticated}/web.git"))?;
    let leak = wait_app(&cluster, "web", "the symlink rejected", |s| {
        s["sync"]["status"] == "Failed" && s["sync"]["errors"].to_string().contains("leak.yaml")
    })?;
    println!("symlink: {}", leak["sync"]["errors"][0]);

    // A kustomization (an overlay on a base, a generated ConfigMap) is built by kustomize; one
    // with a remote base is refused by the push itself, naming the kustomization.
    apps.write("kust.yaml", &application("kust", "kust", "  path: overlays/prod\n"))?;
    apps.commit("a kustomized Application")?;
    apps.push(&format!("{authenticated}/bootstrap.git"))?;
    let kust = wait_for(DEADLINE, || {
        Worktree::clone(format!("{authenticated}/kust.git"), cluster.dir.path().join("kust")).ok()
    })
    .context("cloning the kust repository")?;
    std::fs::create_dir_all(kust.dir.join("base"))?;
    std::fs::create_dir_all(kust.dir.join("overlays/prod"))?;
    kust.write("base/kustomization.yaml", "resources: [settings.yaml]\n")?;
    kust.write(
        "base/settings.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  tier: base\n",
    )?;
    kust.write(
        "overlays/prod/kustomization.yaml",
        "namePrefix: prod-\nresources: [../../base]\nconfigMapGenerator:\n- name: flags\n  literals: [debug=false]\n",
    )?;
    kust.commit("an overlay on a base")?;
    kust.push(&format!("{authenticated}/kust.git"))?;
    let built = wait_for(DEADLINE, || config_map(&cluster, "prod-settings")).context("the overlay's ConfigMap")?;
    ensure!(built["data"]["tier"] == "base", "built: {built}");
    let status = wait_app(&cluster, "kust", "synced", |s| s["sync"]["status"] == "Synced")?;
    ensure!(status["sync"]["changes"]["created"] == 2, "the overlay's ConfigMap and the generated one: {status}");
    let names =
        get(&cluster, "/api/v1/namespaces/default/configmaps").map(|l| l["items"].to_string()).unwrap_or_default();
    ensure!(names.contains("\"prod-flags-"), "the generated ConfigMap, named with its hash: {names}");
    kust.write("overlays/prod/kustomization.yaml", "resources: [github.com/example/base?ref=v1]\n")?;
    kust.commit("a remote base")?;
    let refused = kust.push(&format!("{authenticated}/kust.git")).unwrap_err().to_string();
    ensure!(
        refused.contains("overlays/prod/kustomization.yaml") && refused.contains("remote base"),
        "the push names the remote base: {refused}"
    );

    // `..` in an Application's path is refused.
    apps.write("escape.yaml", &application("escape", "web", "  path: ../web\n"))?;
    apps.commit("an escaping path")?;
    apps.push(&format!("{authenticated}/bootstrap.git"))?;
    let escape = wait_app(&cluster, "escape", "the path refused", |s| s["sync"]["status"] == "Failed")?;
    ensure!(escape["sync"]["errors"].to_string().contains(".."), "escape: {escape}");

    // A remote repository, fetched when its host sends a signed webhook.
    let remote_dir = cluster.dir.path().join("remote");
    let remote = Worktree::clone(format!("{authenticated}/web.git"), remote_dir.clone())?;
    std::fs::remove_file(remote.dir.join("leak.yaml")).ok();
    std::fs::remove_file(remote.dir.join("settings.yaml.j2")).ok();
    remote.write("remote.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: remote\ndata:\n  v: \"1\"\n")?;
    remote.commit("remote v1")?;
    let url = format!("file://{}", remote_dir.join(".git").display());
    apps.write("remote.yaml", &application("remote", &url, ""))?;
    apps.commit("a remote Application")?;
    apps.push(&format!("{authenticated}/bootstrap.git"))?;
    wait_for(DEADLINE, || config_map(&cluster, "remote")).context("the remote repository synced")?;
    remote.write("remote.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: remote\ndata:\n  v: \"2\"\n")?;
    remote.commit("remote v2")?;
    let body = serde_json::to_vec(&serde_json::json!({"repository": url}))?;
    let (code, _) = loopback_request(addr, "POST", "/hooks/generic", &[("X-Gitplane-Signature", "sha256=00")], &body)?;
    ensure!(code == 401, "a bad signature: {code}");
    let signature = sign(&body);
    let hooked = Instant::now();
    let (code, answer) = loopback_request(
        addr,
        "POST",
        "/hooks/generic",
        &[("X-Gitplane-Signature", &signature), ("X-Gitplane-Delivery", "d-1"), ("Content-Type", "application/json")],
        &body,
    )?;
    ensure!(code == 202, "a good webhook: {code} {answer}");
    wait_for(DEADLINE, || config_map(&cluster, "remote").filter(|c| c["data"]["v"] == "2"))
        .context("the webhook's commit applied")?;
    println!("webhook-to-applied: {:?}", hooked.elapsed());
    let (code, _) = loopback_request(
        addr,
        "POST",
        "/hooks/generic",
        &[("X-Gitplane-Signature", &signature), ("X-Gitplane-Delivery", "d-1"), ("Content-Type", "application/json")],
        &body,
    )?;
    ensure!(code == 409, "a replayed delivery: {code}");
    Ok(())
}
