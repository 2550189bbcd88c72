//! The status page in a real browser (Debian's headless `chromium`, over the DevTools
//! protocol) against `gitplane up --nodes 1`: the Application list, a resource tree, a Pod's
//! logs followed live, a live update after a `git push` without reloading (with an XSS payload
//! in the commit subject shown as text), an error linked to its line in the file view, the
//! nodes view and one node's Pods, keyboard navigation (Tab order; Enter follows a link from
//! the resource tree to a Pod and from the nodes list to a node) and the accessibility tree of
//! each of those views; screenshots are saved under `target/t85-screenshots/` (the path is
//! printed). Then `gitplane status --wait`: exit 0 on the
//! healthy cluster, non-zero with the reason on a broken commit; and the page's login form.

use anyhow::{Context, Result, bail, ensure};
use base64::Engine as _;
use gitplane_e2e::{LocalCluster, Worktree, binary, browser::Browser, require_root, wait_for};
use serde_json::{Value, json};
use std::{
    io::{Read, Write},
    net::TcpStream,
    path::PathBuf,
    process::Command,
    time::Duration,
};

const DEADLINE: Duration = Duration::from_secs(120);

const TALKER: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: talker
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: main
      image: gitplane.local/httpd:1
      command: [/bin/busybox, sh, -c, "i=0; while true; do i=$((i+1)); echo \"tick $i\"; /bin/busybox sleep 1; done"]
"#;

/// Kinds without a health rule and an object in another namespace: the tree shows them all.
const NETWORKING: &str = r#"apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: front
spec:
  rules:
    - host: front.example
      http:
        paths:
          - path: /
            pathType: Prefix
            backend:
              service: {name: web, port: {number: 80}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: quiet
spec:
  podSelector: {matchLabels: {app: nobody}}
  policyTypes: [Ingress]
---
apiVersion: v1
kind: Secret
metadata:
  name: hidden
stringData:
  password: s3cr3t-t85-value
---
apiVersion: v1
kind: Namespace
metadata:
  name: elsewhere
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: settings
  namespace: elsewhere
data:
  level: debug
"#;

/// A ConfigMap whose data value is not a string: rejected, with the file and line.
const BROKEN: &str =
    "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: broken\ndata:\n  fine: \"yes\"\n  key: [1, 2]\n";

const DEMO_ROW: &str =
    "document.querySelector('a[href=\"/ui/applications/gitplane-system/demo\"]').closest('tr').innerText";

const XSS: &str = "<img src=x onerror=\"window.pwned=1\"><script>window.pwned=2</script> & more";

fn screenshots() -> Result<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/t85-screenshots");
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn demo_app(cluster: &LocalCluster) -> Result<Value> {
    let list = cluster.get("/apis/gitplane.io/v1/applications")?;
    list["items"]
        .as_array()
        .and_then(|items| items.iter().find(|a| a["metadata"]["name"] == "demo").cloned())
        .context("the demo Application")
}

fn head(cluster: &LocalCluster) -> Result<String> {
    let out = Command::new("git").arg("-C").arg(cluster.demo_repo()).args(["rev-parse", "main"]).output()?;
    Ok(String::from_utf8(out.stdout)?.trim().to_owned())
}

/// `gitplane status` against the cluster's kubeconfig: (exit code, stdout + stderr).
fn status(cluster: &LocalCluster, args: &[&str]) -> Result<(i32, String)> {
    let out = Command::new(binary("gitplane")?)
        .arg("status")
        .arg("--kubeconfig")
        .arg(cluster.data_dir.join("kubeconfig"))
        .args(args)
        .env("NO_COLOR", "1")
        .output()?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    Ok((out.status.code().unwrap_or(-1), text))
}

/// A raw HTTP/1.0 exchange with the API's loopback address: (code, head, body).
fn http(cluster: &LocalCluster, request: &str) -> Result<(u16, String, String)> {
    let mut stream = TcpStream::connect(cluster.listen)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    stream.write_all(request.as_bytes())?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let code = head.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    Ok((code, head.to_owned(), body.to_owned()))
}

fn post_login(cluster: &LocalCluster, token: &str) -> Result<(u16, String, String)> {
    let body = format!("token={token}");
    http(
        cluster,
        &format!(
            "POST /ui/login HTTP/1.0\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ),
    )
}

#[test]
fn t85_status_page_in_a_browser() -> Result<()> {
    require_root()?;
    let cluster = LocalCluster::up("gp85", 1)?;
    let result = run(&cluster);
    if result.is_err() {
        eprintln!("{}", cluster.log_text());
    }
    result
}

fn run(cluster: &LocalCluster) -> Result<()> {
    let base = format!("http://{}", cluster.listen);
    let shots = screenshots()?;
    let work_dir = tempfile::tempdir()?;
    let work = Worktree::clone(cluster.demo_repo(), work_dir.path().join("demo"))?;
    work.write("talker.yaml", TALKER)?;
    work.write("networking.yaml", NETWORKING)?;
    work.commit_and_push("a pod that talks")?;
    let first = head(cluster)?;
    let healthy = wait_for(DEADLINE, || {
        let app = demo_app(cluster).ok()?;
        let ready = app["status"]["sync"]["revision"] == first.as_str()
            && app["status"]["sync"]["status"] == "Synced"
            && app["status"]["health"]["status"] == "Healthy";
        ready.then_some(())
    });
    ensure!(healthy.is_some(), "demo never became Synced and Healthy: {:?}", demo_app(cluster));

    // `gitplane status --wait` on a healthy cluster.
    let (code, out) = status(cluster, &["--wait", "--timeout=60s"])?;
    ensure!(code == 0, "gitplane status --wait on a healthy cluster exited {code}: {out}");
    ensure!(out.contains("demo") && out.contains("Synced") && out.contains("Healthy"), "{out}");

    let mut browser = Browser::start(1280, 900)?;
    // The Application list.
    browser.navigate(&format!("{base}/"))?;
    browser.wait_until(
        DEADLINE,
        "document.querySelector('table.apps a[href=\"/ui/applications/gitplane-system/demo\"]') !== null",
    )?;
    let row = browser.eval(DEMO_ROW)?;
    let row = row.as_str().unwrap_or("");
    ensure!(
        row.contains("Synced") && row.contains("Healthy") && row.contains("a pod that talks") && row.contains("by e2e"),
        "{row:?}"
    );
    browser.screenshot(&shots.join("applications.png"))?;

    // The landmarks and names of the list, and Tab reaching the main links in order.
    let tree = browser.accessibility()?;
    for (role, name) in
        [("banner", ""), ("navigation", "Main"), ("main", ""), ("contentinfo", ""), ("link", "demo"), ("link", "Nodes")]
    {
        ensure!(
            tree.iter().any(|(r, n)| r == role && (name.is_empty() || n == name)),
            "no {role} {name:?} in the accessibility tree: {tree:?}"
        );
    }
    ensure!(tree.iter().any(|(r, n)| r == "table" && n == "Applications"), "the table is not named: {tree:?}");
    let mut reached = Vec::new();
    for _ in 0..8 {
        browser.press("Tab", 9)?;
        let focused = browser.eval("document.activeElement.textContent.trim()")?;
        reached.push(focused.as_str().unwrap_or("").to_owned());
    }
    let order: Vec<usize> = ["Skip to content", "Applications", "Nodes", "demo"]
        .iter()
        .filter_map(|want| reached.iter().position(|r| r == want))
        .collect();
    ensure!(order.len() == 4 && order.windows(2).all(|w| w[0] < w[1]), "Tab order: {reached:?}");

    // A resource tree: Deployment -> ReplicaSet -> Pods, Service -> EndpointSlice -> Pods.
    browser.navigate(&format!("{base}/ui/applications/gitplane-system/demo"))?;
    let shape = browser.wait_until(
        DEADLINE,
        "(() => { const t = document.querySelector('.tree'); if (!t) return null; \
         const top = [...t.querySelectorAll(':scope > ul > li')].map(li => li.querySelector('.kind').textContent + ' ' + \
           [...li.querySelectorAll(':scope > ul > li')].map(c => c.querySelector('.kind').textContent + ':' + \
             c.querySelectorAll(':scope > ul > li').length).join(',')); \
         return top.join(' | '); })()",
    )?;
    let shape = shape.as_str().unwrap_or("");
    ensure!(
        shape.contains("Deployment ReplicaSet:2") && shape.contains("Service EndpointSlice:2") && shape.contains("Pod"),
        "resource tree: {shape:?}"
    );
    let kinds = ["Ingress", "NetworkPolicy", "Secret", "Namespace", "ConfigMap"];
    ensure!(
        kinds.iter().all(|k| shape.contains(&format!("{k} "))),
        "resource tree without all of {kinds:?}: {shape:?}"
    );
    let text = browser.eval("document.querySelector('.tree').innerText")?;
    let text = text.as_str().unwrap_or("");
    ensure!(text.contains("elsewhere") && text.contains("settings"), "the ConfigMap in namespace elsewhere: {text}");
    ensure!(!browser.eval("document.documentElement.outerHTML")?.as_str().unwrap_or("").contains("s3cr3t-t85"));
    let tree = browser.accessibility()?;
    ensure!(tree.iter().any(|(r, n)| r == "region" && n == "Resource tree"), "{tree:?}");
    ensure!(tree.iter().any(|(r, n)| r == "heading" && n == "Sync timeline"), "{tree:?}");
    ensure!(tree.iter().any(|(r, n)| r == "link" && n == "talker"), "no link to the Pod in the tree: {tree:?}");
    browser.screenshot(&shots.join("application.png"))?;

    // A Pod's logs, followed live; reached from the tree with the keyboard.
    browser.tab_to("talker", 40)?;
    browser.enter()?;
    browser.wait_until(
        DEADLINE,
        "location.pathname === '/ui/pods/default/talker' && document.readyState === 'complete' && \
         document.getElementById('log') !== null",
    )?;
    let tree = browser.accessibility()?;
    ensure!(tree.iter().any(|(r, n)| r == "heading" && n == "Pod talker"), "{tree:?}");
    ensure!(tree.iter().any(|(_, n)| n == "Log output"), "the log is not named: {tree:?}");
    browser.tab_to("Log output", 40)?;
    let ticks = "(() => { const m = [...document.getElementById('log').textContent.matchAll(/tick (\\d+)/g)]; \
                 return m.length ? Number(m[m.length - 1][1]) : 0; })()";
    let seen = browser.wait_until(DEADLINE, ticks)?.as_u64().unwrap_or(0);
    browser.wait_until(DEADLINE, &format!("{ticks} >= {}", seen + 2))?;
    browser.screenshot(&shots.join("pod-logs.png"))?;

    // The nodes view: each node's allocation, then (with the keyboard) one node and its Pods.
    let node = cluster.nodes[0].clone();
    browser.navigate(&format!("{base}/ui/nodes"))?;
    let row = browser.wait_until(
        DEADLINE,
        &format!(
            "(() => {{ const a = document.querySelector('a[href=\"/ui/nodes/{node}\"]'); \
             return a ? a.closest('tr').innerText : null; }})()"
        ),
    )?;
    let row = row.as_str().unwrap_or("");
    ensure!(row.contains("Ready") && row.contains("m of ") && row.contains("MiB of "), "node row: {row:?}");
    let tree = browser.accessibility()?;
    ensure!(tree.iter().any(|(r, n)| r == "table" && n == "Nodes"), "the nodes table is not named: {tree:?}");
    ensure!(tree.iter().any(|(r, n)| r == "link" && *n == node), "no link to {node}: {tree:?}");
    browser.screenshot(&shots.join("nodes.png"))?;
    browser.tab_to(&node, 40)?;
    browser.enter()?;
    let shown = browser.wait_until(
        DEADLINE,
        &format!(
            "location.pathname === '/ui/nodes/{node}' && document.readyState === 'complete' && \
             document.querySelector('main').innerText"
        ),
    )?;
    let shown = shown.as_str().unwrap_or("");
    ensure!(shown.contains(&format!("Pods on {node}")) && shown.contains("talker"), "{shown}");
    let tree = browser.accessibility()?;
    ensure!(tree.iter().any(|(r, n)| r == "table" && n == "Pods"), "the Pods table is not named: {tree:?}");
    ensure!(tree.iter().any(|(r, n)| r == "link" && n == "talker"), "{tree:?}");
    browser.tab_to("talker", 40)?;
    browser.screenshot(&shots.join("node.png"))?;

    // A push shows up without a reload; the subject's markup stays text.
    browser.navigate(&format!("{base}/"))?;
    browser.eval("window.samePage = 'yes'")?;
    work.write("web.yaml", &std::fs::read_to_string(work.dir.join("web.yaml"))?.replace("replicas: 2", "replicas: 1"))?;
    work.commit_and_push(XSS)?;
    let second = head(cluster)?;
    browser.wait_until(
        DEADLINE,
        &format!("document.querySelector('table.apps').innerText.includes('{}')", &second[..8]),
    )?;
    ensure!(browser.eval("window.samePage")? == json!("yes"), "the page was reloaded");
    let updates = browser.eval("Number(document.body.dataset.updates || 0)")?;
    ensure!(updates.as_u64().unwrap_or(0) >= 1, "no live update recorded");
    browser.wait_until(DEADLINE, "document.querySelector('table.apps').innerText.includes('window.pwned=2')")?;
    let inert = browser.eval(
        "window.pwned === undefined && document.querySelector('table.apps img') === null && \
         document.querySelector('table.apps script') === null",
    )?;
    ensure!(inert == json!(true), "the commit subject's markup ran or rendered");
    browser.screenshot(&shots.join("live-update.png"))?;

    // A broken commit: its error links to the line in the file view.
    work.write("broken.yaml", BROKEN)?;
    work.commit_and_push("a broken config map")?;
    let third = head(cluster)?;
    let href = browser.wait_until(
        DEADLINE,
        "(() => { const a = document.querySelector('ul.errors a'); return a ? a.getAttribute('href') : null; })()",
    )?;
    let href = href.as_str().unwrap_or("").to_owned();
    let prefix = format!("/git/demo.git/blob/{third}/broken.yaml#L");
    let line: usize =
        href.strip_prefix(&prefix).and_then(|l| l.parse().ok()).with_context(|| format!("error link {href:?}"))?;
    ensure!(line > 1 && line <= BROKEN.lines().count(), "line {line} of broken.yaml");
    browser.screenshot(&shots.join("error.png"))?;
    let (code, out) = status(cluster, &["--wait", "--timeout=30s"])?;
    ensure!(code != 0 && out.contains("broken.yaml"), "gitplane status --wait on a broken commit exited {code}: {out}");

    // The file view needs the Git token (as a clone does), then shows the line.
    let path = href.split('#').next().unwrap_or("");
    let (code, head, _) = http(cluster, &format!("GET {path} HTTP/1.0\r\n\r\n"))?;
    ensure!(code == 401 && head.contains("Basic realm"), "the file view answered without the Git token: {head}");
    let token = std::fs::read_to_string(cluster.data_dir.join("git-token"))?;
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("git:{}", token.trim()));
    browser.call("Network.setExtraHTTPHeaders", json!({"headers": {"Authorization": format!("Basic {basic}")}}))?;
    browser.navigate(&format!("{base}{href}"))?;
    let shown = browser.eval(&format!("document.getElementById('L{line}').innerText"))?;
    let expected = BROKEN.lines().nth(line - 1).unwrap_or("");
    ensure!(shown.as_str().unwrap_or("").contains(expected.trim()), "line {line} shows {shown}, not {expected:?}");
    ensure!(browser.eval("location.hash")? == json!(format!("#L{line}")), "not at the line's anchor");
    browser.screenshot(&shots.join("file-view.png"))?;
    browser.call("Network.setExtraHTTPHeaders", json!({"headers": {}}))?;

    // A phone-sized view of the list.
    browser.call(
        "Emulation.setDeviceMetricsOverride",
        json!({"width": 390, "height": 844, "deviceScaleFactor": 2, "mobile": true}),
    )?;
    browser.navigate(&format!("{base}/"))?;
    let overflow = browser.eval("document.documentElement.scrollWidth <= window.innerWidth + 1")?;
    ensure!(overflow == json!(true), "the list is wider than a phone's screen");
    browser.screenshot(&shots.join("applications-phone.png"))?;
    eprintln!("t85 screenshots: {}", shots.canonicalize()?.display());

    // The login form: a wrong token is refused; the kubeconfig's read token sets the cookie.
    let (code, _, body) = post_login(cluster, "wrong-token")?;
    ensure!(code == 401 && body.contains("not valid"), "{code} {body}");
    let kubeconfig = std::fs::read_to_string(cluster.data_dir.join("kubeconfig"))?;
    let read_token = kubeconfig
        .lines()
        .find_map(|l| l.trim().strip_prefix("token:"))
        .map(|t| t.trim().trim_matches('"').to_owned())
        .context("a token in the kubeconfig")?;
    let (code, head, _) = post_login(cluster, &read_token)?;
    let cookie = head.lines().find(|l| l.to_ascii_lowercase().starts_with("set-cookie:")).unwrap_or("");
    ensure!(
        code == 303
            && cookie.contains("gitplane-token=")
            && cookie.contains("HttpOnly")
            && cookie.contains("SameSite=Strict"),
        "{code} {head}"
    );
    ensure!(!cookie.contains("Secure"), "a cookie over plain HTTP cannot be Secure: {cookie}");
    if second == third {
        bail!("the broken commit did not move the branch");
    }
    Ok(())
}
