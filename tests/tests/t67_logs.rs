//! Container logs on `gitplane up --nodes 1`, read with the real `kubectl logs` through the
//! status API, which streams them from the node's agent: `-c`, `--tail`, `--timestamps`,
//! `--since-time`, `--limit-bytes`, `--previous` after a restart, `-f` following new lines;
//! the Kubernetes errors (unknown pod or container, no previous run, a container waiting to
//! start, bad options); the agent's log port answers no cleartext; and rotation keeps a
//! chatty container's files bounded (max size 16Ki, 3 files).

use anyhow::{Context, Result, bail, ensure};
use gitplane_e2e::{LocalCluster, Worktree, require_root, wait_for};
use std::{
    collections::BTreeSet,
    io::{BufRead, BufReader, Read, Write},
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

const DEADLINE: Duration = Duration::from_secs(120);

const PODS: &str = r#"apiVersion: v1
kind: Pod
metadata:
  name: talker
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: main
      image: gitplane.local/httpd:1
      command:
        - /bin/busybox
        - sh
        - -c
        - |
          for i in 1 2 3 4 5; do echo "line $i"; done
          i=0
          while true; do i=$((i+1)); echo "tick $i"; /bin/busybox sleep 1; done
    - name: side
      image: gitplane.local/httpd:1
      command: [/bin/busybox, sh, -c, "echo sidecar hello; echo sidecar oops >&2; exec /bin/busybox sleep 3600"]
---
apiVersion: v1
kind: Pod
metadata:
  name: crasher
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: crasher
      image: gitplane.local/httpd:1
      command: [/bin/busybox, sh, -c, "echo crasher run $(/bin/busybox cat /proc/sys/kernel/random/uuid); echo goodbye; exit 1"]
---
apiVersion: v1
kind: Pod
metadata:
  name: chatty
spec:
  terminationGracePeriodSeconds: 1
  containers:
    - name: chatty
      image: gitplane.local/httpd:1
      command:
        - /bin/busybox
        - sh
        - -c
        - |
          l=xxxxxxxxxx; l=$l$l$l$l$l$l$l$l$l$l; l=$l$l$l$l$l$l$l$l$l$l
          while true; do echo "$l"; /bin/busybox usleep 20000; done
---
apiVersion: v1
kind: Pod
metadata:
  name: waiter
spec:
  containers:
    - name: waiter
      image: gitplane.local/missing:1
      imagePullPolicy: Never
"#;

/// `kubectl --server <api> logs <args>`: success, stdout, stderr.
fn kubectl_logs(cluster: &LocalCluster, args: &[&str]) -> Result<(bool, String, String)> {
    let out = Command::new("kubectl")
        .arg("--server")
        .arg(format!("http://{}", cluster.listen))
        .arg("logs")
        .args(args)
        .output()
        .context("running kubectl (apt-get install kubectl)")?;
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    Ok((out.status.success(), text(&out.stdout), text(&out.stderr)))
}

/// `kubectl logs` that must succeed: its stdout.
fn logs(cluster: &LocalCluster, args: &[&str]) -> Result<String> {
    let (ok, stdout, stderr) = kubectl_logs(cluster, args)?;
    ensure!(ok, "kubectl logs {args:?} failed: {stderr}");
    Ok(stdout)
}

/// `kubectl logs` that must fail: its stderr.
fn logs_error(cluster: &LocalCluster, args: &[&str]) -> Result<String> {
    let (ok, stdout, stderr) = kubectl_logs(cluster, args)?;
    ensure!(!ok, "kubectl logs {args:?} should fail, printed {stdout:?}");
    Ok(stderr)
}

/// One HTTP/1.0 request `head` to `addr` (from the network namespace `netns`, if given): the
/// status code and the body.
fn http(netns: Option<&Path>, addr: SocketAddr, head: &str) -> Result<(u16, String)> {
    let exchange = || -> std::io::Result<Vec<u8>> {
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(stream, "{head}\r\nHost: {addr}\r\nConnection: close\r\n\r\n")?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response)?;
        Ok(response)
    };
    let response = match netns {
        Some(netns) => gitplane_kubelet::netns::in_netns(netns, exchange),
        None => exchange(),
    }
    .with_context(|| format!("{head} to {addr}"))?;
    let response = String::from_utf8_lossy(&response);
    let (status, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let code = status.split(' ').nth(1).and_then(|c| c.parse().ok()).context("an HTTP status line")?;
    Ok((code, body.to_owned()))
}

/// The Pod as the status API has it.
fn pod(cluster: &LocalCluster, name: &str) -> Result<serde_json::Value> {
    cluster.get(&format!("/api/v1/namespaces/default/pods/{name}"))
}

/// The files of the chatty container's log directory.
fn chatty_files(cluster: &LocalCluster, node: &str) -> Vec<String> {
    let logs = cluster.data_dir.join("nodes").join(node).join("pods/logs");
    let Some(pod_dir) = std::fs::read_dir(&logs)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("default_chatty_")))
    else {
        return Vec::new();
    };
    let dir: PathBuf = pod_dir.join("chatty");
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .collect();
    names.sort();
    names
}

#[test]
fn t67_kubectl_logs_through_the_status_api() -> Result<()> {
    require_root()?;
    let cluster = LocalCluster::up_with("gp67", 1, &["--container-log-max-size=16Ki", "--container-log-max-files=3"])?;
    let node = cluster.nodes[0].clone();
    let work_dir = tempfile::tempdir()?;
    let work = Worktree::clone(cluster.demo_repo(), work_dir.path().join("demo"))?;
    work.remove("web.yaml")?;
    work.write("pods.yaml", PODS)?;
    work.commit_and_push("pods that print")?;

    // The Node says where its kubelet endpoint is.
    let node_object = cluster.get(&format!("/api/v1/nodes/{node}"))?;
    ensure!(
        node_object["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"] == 10250,
        "the Node does not advertise its kubelet port: {}",
        node_object["status"]
    );

    // -c, and the default container with kubectl's own choice of the first.
    let main =
        wait_for(DEADLINE, || logs(&cluster, &["talker", "-c", "main"]).ok().filter(|out| out.contains("tick 2")))
            .with_context(|| {
                format!("talker's log: {:?}\n{}", kubectl_logs(&cluster, &["talker", "-c", "main"]), cluster.log_text())
            })?;
    ensure!(main.starts_with("line 1\nline 2\nline 3\nline 4\nline 5\ntick 1\n"), "talker/main: {main:?}");
    let side = logs(&cluster, &["talker", "-c", "side"])?;
    let side_lines: BTreeSet<&str> = side.lines().collect();
    ensure!(side_lines == BTreeSet::from(["sidecar hello", "sidecar oops"]), "stdout and stderr of side: {side:?}");
    let (ok, defaulted, note) = kubectl_logs(&cluster, &["talker"])?;
    ensure!(ok && defaulted.starts_with("line 1\n"), "kubectl logs talker: {defaulted:?} {note}");
    // Without kubectl's choice, the API asks for one, naming them.
    let (code, body) = http(None, cluster.listen, "GET /api/v1/namespaces/default/pods/talker/log HTTP/1.0")?;
    ensure!(code == 400 && body.contains("choose one of: [main side]"), "{code} {body}");

    // --tail, --timestamps, --since-time, --limit-bytes.
    let tail = logs(&cluster, &["talker", "-c", "main", "--tail=2"])?;
    ensure!(tail.lines().count() == 2 && tail.lines().all(|l| l.starts_with("tick ")), "--tail=2: {tail:?}");
    let stamped = logs(&cluster, &["talker", "-c", "main", "--timestamps"])?;
    for line in stamped.lines() {
        let (time, text) = line.split_once(' ').context("a timestamp and the text")?;
        ensure!(time.parse::<k8s_openapi::jiff::Timestamp>().is_ok(), "{time:?} is not RFC 3339 in {line:?}");
        ensure!(text.starts_with("line ") || text.starts_with("tick "), "{line:?}");
    }
    let first_time = stamped.split(' ').next().unwrap_or_default().to_owned();
    let since = logs(&cluster, &["talker", "-c", "main", &format!("--since-time={first_time}")])?;
    ensure!(since.starts_with("line 1\n"), "--since-time of the first line: {since:?}");
    let future = logs(&cluster, &["talker", "-c", "main", "--since-time=2099-01-01T00:00:00Z"])?;
    ensure!(future.is_empty(), "--since-time in the future: {future:?}");
    let limited = logs(&cluster, &["talker", "-c", "main", "--limit-bytes=9"])?;
    ensure!(limited == "line 1\nli", "--limit-bytes=9: {limited:?}");

    // -f prints lines as they come; the kubectl is then killed.
    let last_tick =
        |text: &str| text.lines().filter_map(|l| l.strip_prefix("tick ")?.parse::<u64>().ok()).max().unwrap_or(0);
    let before = last_tick(&logs(&cluster, &["talker", "-c", "main"])?);
    let mut follow = Command::new("kubectl")
        .arg("--server")
        .arg(format!("http://{}", cluster.listen))
        .args(["logs", "-f", "talker", "-c", "main"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("kubectl logs -f")?;
    let stdout = follow.stdout.take().context("kubectl's stdout")?;
    let (lines, seen) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let mut followed = Vec::new();
    let newer = wait_for(Duration::from_secs(60), || {
        followed.extend(seen.try_iter());
        (last_tick(&followed.join("\n")) >= before + 3).then_some(())
    });
    let _ = follow.kill();
    let _ = follow.wait();
    ensure!(newer.is_some(), "kubectl logs -f did not print ticks after {before}: {followed:?}");
    ensure!(followed.first().map(String::as_str) == Some("line 1"), "-f starts with the log so far: {followed:?}");

    // --previous: none yet for talker; the crasher's ended run after it restarted.
    let none = logs_error(&cluster, &["talker", "-c", "main", "--previous"])?;
    ensure!(none.contains("previous terminated container \"main\" in pod \"talker\" not found"), "{none}");
    wait_for(DEADLINE, || {
        pod(&cluster, "crasher")
            .ok()
            .filter(|p| p["status"]["containerStatuses"][0]["restartCount"].as_i64() >= Some(1))
    })
    .with_context(|| format!("the crasher never restarted: {:?}", pod(&cluster, "crasher")))?;
    let previous = logs(&cluster, &["crasher", "--previous"])?;
    ensure!(previous.starts_with("crasher run ") && previous.ends_with("goodbye\n"), "--previous: {previous:?}");

    // The errors Kubernetes gives.
    let missing = logs_error(&cluster, &["nope"])?;
    ensure!(missing.contains("pods \"nope\" not found"), "{missing}");
    let unknown = logs_error(&cluster, &["talker", "-c", "db"])?;
    ensure!(unknown.contains("container db is not valid for pod talker"), "{unknown}");
    let waiting =
        wait_for(DEADLINE, || logs_error(&cluster, &["waiter"]).ok().filter(|e| e.contains("ErrImageNeverPull")))
            .with_context(|| format!("kubectl logs waiter: {:?}", kubectl_logs(&cluster, &["waiter"])))?;
    ensure!(waiting.contains("container \"waiter\" in pod \"waiter\" is waiting to start"), "{waiting}");
    let (code, body) = http(
        None,
        cluster.listen,
        "GET /api/v1/namespaces/default/pods/talker/log?container=main&tailLines=-1 HTTP/1.0",
    )?;
    ensure!(code == 422 && body.contains("tailLines: Invalid value: -1"), "{code} {body}");

    // The agent's log port.
    let ip = node_object["status"]["addresses"]
        .as_array()
        .and_then(|a| a.iter().find(|a| a["type"] == "InternalIP"))
        .and_then(|a| a["address"].as_str())
        .context("the node's InternalIP")?;
    let agent: SocketAddr = format!("{ip}:10250").parse()?;
    let bridge = Path::new("/run/netns").join(format!("{}-net", cluster.base));
    let container_id = pod(&cluster, "talker")?["status"]["containerStatuses"][0]["containerID"]
        .as_str()
        .context("talker's container ID")?
        .to_owned();
    let path = format!("/containerLogs/default/talker/main?containerID={}", container_id.replace("://", "%3A%2F%2F"));
    // It speaks mutual TLS only (t84 tries certificates): cleartext, with or without a
    // token, gets no answer at all.
    for auth in ["", "\r\nAuthorization: Bearer 00", "\r\nAuthorization: Bearer node:forged:00"] {
        let answer = http(Some(&bridge), agent, &format!("GET {path} HTTP/1.0{auth}"));
        ensure!(answer.is_err(), "cleartext to the kubelet endpoint got {answer:?}");
    }

    // Rotation: the chatty container's files stay within 3 while old rotated ones go.
    let mut rotated = BTreeSet::new();
    let bounded = wait_for(DEADLINE, || {
        let files = chatty_files(&cluster, &node);
        if files.len() > 3 {
            return Some(Err(files));
        }
        rotated.extend(files.iter().filter(|f| f.starts_with("0.log.")).cloned());
        (rotated.len() >= 3).then_some(Ok(files))
    });
    match bounded {
        Some(Ok(files)) => println!("chatty's files: {files:?}; rotated so far: {rotated:?}"),
        Some(Err(files)) => bail!("more than 3 log files for one container: {files:?}"),
        None => bail!("chatty's log was not rotated three times: {rotated:?}, now {:?}", chatty_files(&cluster, &node)),
    }
    // chatty writes 50 lines a second and a read runs from the tail's start to the end of the
    // file (as the kubelet's does), so a line written meanwhile may follow the one asked for:
    // the answer is the last line and at most the few after it, never the rotated files' rest.
    let chatty = logs(&cluster, &["chatty", "--tail=1"])?;
    let line = format!("{}\n", "x".repeat(1000));
    let lines = chatty.len() / line.len();
    ensure!((1..=10).contains(&lines) && chatty == line.repeat(lines), "the tail of a rotated log: {chatty:?}");

    let status = cluster.stop(DEADLINE)?;
    ensure!(status.success(), "gitplane up --nodes exited with {status}");
    Ok(())
}
