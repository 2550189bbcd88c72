//! CronJobs and HorizontalPodAutoscalers on the real `gitplane up --nodes 1`, pushed with real
//! git and read back with real kubectl:
//! - a CronJob `*/1 * * * *` runs a Job each minute (named after its scheduled minute, with the
//!   scheduled-timestamp annotation); with `successfulJobsHistoryLimit: 1` the older finished Job
//!   is deleted once the next one succeeds;
//! - the Kubernetes documentation's HPA walkthrough (`php-apache`: Deployment, Service and the
//!   published HPA) with a stand-in image (busybox httpd whose index is a CGI script that burns
//!   CPU per request) and the walkthrough's load generator as a Pod: the HPA scales the
//!   Deployment up under load; a commit that sets `replicas: 1` in Git gets the push warning and
//!   leaves the HPA's count alone; without load it scales back down. The published HPA has no
//!   `behavior`, so its scale-down waits the default 300 s: the scale-down is checked with the
//!   same HPA plus `behavior.scaleDown.stabilizationWindowSeconds: 15`.

use anyhow::{Context, Result, ensure};
use gitplane_e2e::{LocalCluster, Worktree, require_root, wait_for};
use serde_json::Value;
use std::{path::Path, process::Command, time::Duration};

const CRON_JOB: &str = "apiVersion: batch/v1
kind: CronJob
metadata:
  name: hello
spec:
  schedule: \"*/1 * * * *\"
  successfulJobsHistoryLimit: 1
  jobTemplate:
    spec:
      template:
        spec:
          restartPolicy: OnFailure
          containers:
          - name: hello
            image: gitplane.local/httpd:1
            imagePullPolicy: IfNotPresent
            command: [/bin/busybox, sh, -c, date; echo Hello from the Kubernetes cluster]
";

/// The walkthrough's `php-apache.yaml`, its image replaced by busybox httpd serving a CGI index
/// that burns CPU on each request, as the walkthrough's PHP page does (and a short grace period:
/// httpd as PID 1 ignores SIGTERM).
fn php_apache(extra_spec: &str, extra_label: &str) -> String {
    format!(
        "apiVersion: apps/v1
kind: Deployment
metadata:
  name: php-apache
  labels: {{app: php-apache{extra_label}}}
spec:
{extra_spec}  selector:
    matchLabels:
      run: php-apache
  template:
    metadata:
      labels:
        run: php-apache
    spec:
      terminationGracePeriodSeconds: 2
      containers:
      - name: php-apache
        image: gitplane.local/httpd:1
        imagePullPolicy: IfNotPresent
        command:
        - /bin/busybox
        - sh
        - -c
        - |
          rm -f /www/index.html
          mkdir -p /www/cgi-bin
          cat > /www/cgi-bin/index.cgi <<'EOF'
          #!/bin/sh
          i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done
          printf 'Content-Type: text/plain\\r\\n\\r\\nOK!'
          EOF
          chmod +x /www/cgi-bin/index.cgi
          exec /bin/busybox httpd -f -p 80 -h /www
        ports:
        - containerPort: 80
        resources:
          limits:
            cpu: 500m
          requests:
            cpu: 200m
---
apiVersion: v1
kind: Service
metadata:
  name: php-apache
  labels:
    run: php-apache
spec:
  ports:
  - port: 80
  selector:
    run: php-apache
"
    )
}

/// The walkthrough's published HPA (`hpa/php-apache.yaml`), plus `behavior` when given.
fn hpa(behavior: &str) -> String {
    format!(
        "apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata:
  name: php-apache
spec:
  scaleTargetRef:
    apiVersion: apps/v1
    kind: Deployment
    name: php-apache
  minReplicas: 1
  maxReplicas: 10
  metrics:
  - type: Resource
    resource:
      name: cpu
      target:
        type: Utilization
        averageUtilization: 50
{behavior}"
    )
}

/// The walkthrough's `kubectl run load-generator`, as a Pod in Git.
const LOAD: &str = "apiVersion: v1
kind: Pod
metadata:
  name: load-generator
spec:
  restartPolicy: Never
  containers:
  - name: load-generator
    image: gitplane.local/httpd:1
    imagePullPolicy: IfNotPresent
    command: [/bin/busybox, sh, -c, 'while sleep 0.01; do /bin/busybox timeout 5 /bin/busybox wget -q -O- http://php-apache; done']
";

const SHORT_SCALE_DOWN: &str = "  behavior:
    scaleDown:
      stabilizationWindowSeconds: 15
";

/// Commits everything and pushes, returning what git printed (the verdict's `remote:` lines).
fn push(work: &Worktree, dir: &Path, message: &str) -> Result<String> {
    work.commit(message)?;
    let out = Command::new("git").arg("-C").arg(dir).args(["push", "origin", "HEAD:main"]).output()?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    ensure!(out.status.success(), "git push: {text}");
    Ok(text)
}

/// The CronJob's Jobs: (name, complete).
fn jobs(cluster: &LocalCluster) -> Result<Vec<(String, bool)>> {
    let list = cluster.get("/apis/batch/v1/namespaces/default/jobs")?;
    Ok(list["items"]
        .as_array()
        .context("JobList has items")?
        .iter()
        .filter(|j| j["metadata"]["ownerReferences"][0]["kind"] == "CronJob")
        .map(|j| {
            let complete = j["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Complete" && c["status"] == "True");
            (j["metadata"]["name"].as_str().unwrap_or_default().to_owned(), complete)
        })
        .collect())
}

fn deployment(cluster: &LocalCluster) -> Result<Value> {
    cluster.get("/apis/apps/v1/namespaces/default/deployments/php-apache")
}

fn replicas(cluster: &LocalCluster) -> Option<i64> {
    deployment(cluster).ok()?["spec"]["replicas"].as_i64()
}

#[test]
fn t95_cronjobs_run_on_schedule_and_the_hpa_walkthrough_scales() -> Result<()> {
    require_root()?;
    let cluster = LocalCluster::up("gp95", 1)?;
    let work_dir = tempfile::tempdir()?;
    let dir = work_dir.path().join("demo");
    // Over HTTP with the Git token, as a user pushes: each push gets its verdict.
    let token = std::fs::read_to_string(cluster.data_dir.join("git-token"))?.trim().to_owned();
    let work = Worktree::clone(format!("http://git:{token}@{}/git/demo.git", cluster.listen), dir.clone())?;
    work.remove("web.yaml")?;
    work.write("hello.yaml", CRON_JOB)?;
    work.write("php-apache.yaml", &php_apache("", ""))?;
    work.write("hpa.yaml", &hpa(""))?;
    push(&work, &dir, "a CronJob, and the HPA walkthrough")?;
    wait_for(Duration::from_secs(120), || cluster.running_pods("run=php-apache").ok().filter(|p| p.len() == 1))
        .with_context(|| format!("php-apache Running:\n{}", cluster.log_tail()))?;

    // Load: the HPA scales up.
    work.write("load.yaml", LOAD)?;
    push(&work, &dir, "the load generator")?;
    let up = wait_for(Duration::from_secs(240), || replicas(&cluster).filter(|r| *r > 1));
    let hpa_table = cluster.kubectl(&["get", "hpa"]).unwrap_or_else(|e| e.to_string());
    let up = up.with_context(|| format!("no scale-up under load:\n{hpa_table}\n{}", cluster.log_tail()))?;
    println!("scaled up to {up}\n{hpa_table}");
    ensure!(
        hpa_table.split_whitespace().take(7).eq([
            "NAME",
            "REFERENCE",
            "TARGETS",
            "MINPODS",
            "MAXPODS",
            "REPLICAS",
            "AGE"
        ]),
        "{hpa_table}"
    );
    ensure!(hpa_table.contains("Deployment/php-apache") && hpa_table.contains("cpu: "), "{hpa_table}");
    let hpa_object = cluster.get("/apis/autoscaling/v2/namespaces/default/horizontalpodautoscalers/php-apache")?;
    ensure!(hpa_object["status"]["lastScaleTime"].is_string(), "{hpa_object}");

    // Git sets replicas too: the push says the HPA wins, and the sync leaves its count.
    work.write("php-apache.yaml", &php_apache("  replicas: 1\n", ", tier: web"))?;
    let verdict = push(&work, &dir, "replicas in Git")?;
    println!("{verdict}");
    ensure!(verdict.contains("the HorizontalPodAutoscaler's count wins"), "no warning in the verdict:\n{verdict}");
    let synced = wait_for(Duration::from_secs(60), || {
        let d = deployment(&cluster).ok()?;
        (d["metadata"]["labels"]["tier"] == "web").then_some(d)
    })
    .context("the replicas commit synced")?;
    ensure!(synced["spec"]["replicas"].as_i64() > Some(1), "Git's replicas reverted the HPA's: {}", synced["spec"]);

    // The CronJob ran meanwhile; its second successful Job deletes the first.
    let two_runs = wait_for(Duration::from_secs(150), || {
        let cron_job = cluster.get("/apis/batch/v1/namespaces/default/cronjobs/hello").ok()?;
        let scheduled = cron_job["status"]["lastScheduleTime"].as_str()?.to_owned();
        let succeeded = cron_job["status"]["lastSuccessfulTime"].as_str()?.to_owned();
        let jobs = jobs(&cluster).ok()?;
        // One Job kept, complete, and it is the one of the last schedule that succeeded (both
        // times have whole seconds: a quick Job succeeds within its scheduled second).
        let minute = scheduled.parse::<k8s_openapi::jiff::Timestamp>().ok()?.as_second() / 60;
        (jobs.len() == 1
            && jobs[0].1
            && jobs[0].0 == format!("hello-{minute}")
            && succeeded >= scheduled
            && minute > first_minute(&cluster)?)
        .then_some((jobs, cron_job))
    });
    let (kept, cron_job) = two_runs
        .with_context(|| format!("two runs and the history limit: {:?}\n{}", jobs(&cluster), cluster.log_tail()))?;
    println!("kept {kept:?}, status {}", cron_job["status"]);
    let job = cluster.get(&format!("/apis/batch/v1/namespaces/default/jobs/{}", kept[0].0))?;
    ensure!(
        job["metadata"]["annotations"]["batch.kubernetes.io/cronjob-scheduled-timestamp"]
            == cron_job["status"]["lastScheduleTime"],
        "{}",
        job["metadata"]
    );
    let cron_table = cluster.kubectl(&["get", "cronjobs"])?;
    println!("{cron_table}");
    ensure!(
        cron_table
            .split_whitespace()
            .take(8)
            .eq(["NAME", "SCHEDULE", "TIMEZONE", "SUSPEND", "ACTIVE", "LAST", "SCHEDULE", "AGE"]),
        "{cron_table}"
    );
    ensure!(cron_table.contains("*/1 * * * *") && cron_table.contains("False"), "{cron_table}");

    // No load, and a short scale-down window: back to one replica.
    work.remove("load.yaml")?;
    work.write("hpa.yaml", &hpa(SHORT_SCALE_DOWN))?;
    push(&work, &dir, "no load, a short scale-down window")?;
    wait_for(Duration::from_secs(240), || (replicas(&cluster) == Some(1)).then_some(()))
        .with_context(|| format!("no scale-down:\n{:?}", cluster.kubectl(&["get", "hpa"])))?;
    cluster.stop(Duration::from_secs(60))?;
    Ok(())
}

/// The minute of the first Job the CronJob made, from its first SuccessfulCreate Event.
fn first_minute(cluster: &LocalCluster) -> Option<i64> {
    let events = cluster.get("/api/v1/namespaces/default/events").ok()?;
    events["items"]
        .as_array()?
        .iter()
        .filter(|e| e["reason"] == "SuccessfulCreate" && e["involvedObject"]["kind"] == "CronJob")
        .filter_map(|e| e["message"].as_str()?.strip_prefix("Created job hello-")?.parse().ok())
        .min()
}
