//! Secrets encrypted at rest, end to end with three `gitplane server` processes (SQLite + Raft)
//! sharing one key file: no replica's files (store, WAL, Raft log) hold a Secret in clear while
//! a ConfigMap's value is found by the same scan; `gitplane secrets rotate` re-encrypts every
//! Secret under a new key while a client keeps writing Secrets, and loses none of its writes;
//! after `remove-old-keys` every replica restarts and serves every Secret without the old key.

use anyhow::{Context, Result, bail, ensure};
use gitplane_e2e::{binary, cluster::Cluster, wait_for};
use gitplane_store::{ObjectKey, Op, Store};
use serde_json::{Value, json};
use std::{
    collections::HashMap,
    path::Path,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

const DEADLINE: Duration = Duration::from_secs(120);
const SECRET_MARK: &str = "t32-SECRET-in-clear-5d2e";
const CONFIG_MARK: &str = "t32-configmap-in-clear-91ab";

fn b64(text: &str) -> String {
    use std::fmt::Write as _;
    // Kubernetes data is base64; a tiny encoder keeps this test free of another crate.
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in text.as_bytes().chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                let _ = out.write_char(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn secret(name: &str, value: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": "default",
           "annotations": {"note": SECRET_MARK}}, "data": {"password": b64(value)}})
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle.as_bytes())
}

fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(files(&path));
        } else if let Ok(bytes) = std::fs::read(&path) {
            out.push((path.display().to_string(), bytes));
        }
    }
    out
}

/// No file of a replica's store holds a Secret in clear; some holds the ConfigMap's value.
fn check_files(store_dir: &Path) -> Result<()> {
    let files = files(store_dir);
    ensure!(files.iter().any(|(p, _)| p.ends_with("raft.db-wal") || p.ends_with("raft.db")), "the Raft log is scanned");
    for (path, bytes) in &files {
        for needle in [SECRET_MARK.to_owned(), b64(SECRET_MARK)] {
            ensure!(!contains(bytes, &needle), "{path} holds a Secret in clear");
        }
    }
    ensure!(files.iter().any(|(_, b)| contains(b, CONFIG_MARK)), "the scan finds a ConfigMap's value in {store_dir:?}");
    Ok(())
}

fn gitplane(args: &[&str]) -> Result<String> {
    let out = std::process::Command::new(binary("gitplane")?).args(args).output()?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if !out.status.success() {
        bail!("gitplane {args:?} failed: {text}");
    }
    Ok(text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn t32_secrets_encrypted_at_rest_and_rotated_while_writes_go_on() -> Result<()> {
    let mut cluster = Cluster::start(3, &[])?;
    cluster.leader(DEADLINE)?;
    let client = Arc::new(cluster.client()?);
    for i in 0..40 {
        client.txn(vec![Op::Create(secret(&format!("s{i}"), "0"))]).await?;
    }
    let config = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "default"},
                        "data": {"greeting": CONFIG_MARK}});
    client.txn(vec![Op::Create(config)]).await?;
    for id in 1..=3 {
        let replica = cluster.replica_client(id)?;
        let key = ObjectKey::new("ConfigMap", "default", "c");
        let mut applied = false;
        for _ in 0..600 {
            if replica.get(&key).await?.is_some() {
                applied = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        ensure!(applied, "replica {id} applied the writes");
        let got = replica.get(&ObjectKey::new("Secret", "default", "s7")).await?.context("s7")?;
        ensure!(got["data"]["password"] == b64("0"), "replica {id} serves the Secret in clear: {got}");
        check_files(&cluster.dir.path().join(format!("replica-{id}/store")))?;
    }

    // A client keeps writing Secrets (compare-and-swap on what it read) during the rotation.
    let committed: Arc<Mutex<HashMap<String, String>>> =
        Arc::new(Mutex::new((0..40).map(|i| (format!("s{i}"), "0".to_owned())).collect()));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (client, committed, stop) = (client.clone(), committed.clone(), stop.clone());
        tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::SeqCst) {
                n += 1;
                let name = format!("s{}", n % 50);
                let key = ObjectKey::new("Secret", "default", &name);
                let op = match client.get(&key).await? {
                    Some(mut current) => {
                        current["data"]["password"] = b64(&n.to_string()).into();
                        Op::Update(current)
                    }
                    None => Op::Create(secret(&name, &n.to_string())),
                };
                match client.txn(vec![op]).await {
                    Ok(_) => {
                        committed.lock().unwrap_or_else(|e| e.into_inner()).insert(name, n.to_string());
                    }
                    Err(e) if e.is_conflict() || e.is_already_exists() => {}
                    Err(e) => return Err(anyhow::Error::from(e).context("the writer")),
                }
            }
            Ok::<u64, anyhow::Error>(n)
        })
    };
    let keys = cluster.dir.path().join("encryption-keys").display().to_string();
    let tokens = cluster.dir.path().join("tokens.csv").display().to_string();
    let servers: Vec<String> = cluster.addrs.values().map(|a| a.to_string()).collect();
    let mut args =
        vec!["secrets", "rotate", "--encryption-key-file", &keys, "--tokens-file", &tokens, "--wait-seconds", "120"];
    for server in &servers {
        args.extend(["--server", server]);
    }
    let args: Vec<String> = args.into_iter().map(str::to_owned).collect();
    let rotated =
        tokio::task::spawn_blocking(move || gitplane(&args.iter().map(String::as_str).collect::<Vec<_>>())).await??;
    stop.store(true, Ordering::SeqCst);
    let writes = writer.await??;
    ensure!(writes > 10, "the writer wrote during the rotation ({writes})");
    let new_key = gitplane_storage::encryption::read_key_file(Path::new(&keys))?[0].name().to_owned();
    ensure!(new_key != "e2e-1" && rotated.contains(&new_key), "rotate made a new key: {rotated}");
    ensure!(rotated.contains("done"), "{rotated}");
    for id in 1..=3 {
        let status = cluster.status(id).context("status")?;
        ensure!(
            status["encryption"] == json!({"writeKey": new_key, "staleObjects": 0, "staleHistory": 0}),
            "replica {id}: {status}\n{rotated}"
        );
    }

    // Old key removed; every replica restarts without it and serves every write the client saw.
    gitplane(&["secrets", "remove-old-keys", "--encryption-key-file", &keys])?;
    for id in 1..=3 {
        cluster.restart(id)?;
    }
    cluster.leader(DEADLINE)?;
    let committed = committed.lock().unwrap_or_else(|e| e.into_inner()).clone();
    for id in 1..=3 {
        let replica = cluster.replica_client(id)?;
        for (name, want) in &committed {
            let key = ObjectKey::new("Secret", "default", name);
            let mut last = None;
            let ok = wait_for(DEADLINE, || {
                let got = block_on(replica.get(&key));
                let matches =
                    got.as_ref().is_ok_and(|o| o.as_ref().is_some_and(|o| o["data"]["password"] == b64(want)));
                last = Some(format!("{got:?}"));
                matches.then_some(())
            });
            ensure!(ok.is_some(), "replica {id}: {name} lost the write {want}: {last:?}\n{}", cluster.logs());
        }
        check_files(&cluster.dir.path().join(format!("replica-{id}/store")))?;
    }
    Ok(())
}

/// Runs a store call to completion from inside `wait_for`'s synchronous probe.
fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(future))
}
