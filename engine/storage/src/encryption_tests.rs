//! Secrets at rest, against the real backends: the bytes on disk (SQLite files with their WAL,
//! the Raft log and snapshots) and the rows of Postgres hold no Secret in clear, a ConfigMap's
//! value is found by the same scan (so the scan works), a rotation while a writer goes on loses
//! nothing, and a value under a missing key is a clear error.

use crate::{
    encryption::{self, AtRest, Key, Keyring},
    postgres::{PostgresStore, testing::PgCluster},
    raft::{RaftStore, ReplicaConfig, log_store::LogStore},
    remote::PeerToken,
    sqlite::{Durability, SqliteStore},
};
use base64::{Engine as _, engine::general_purpose::STANDARD as BASE64};
use futures::StreamExt as _;
use gitplane_store::{ListOptions, ObjectKey, Op, Store, StoreError, WatchOptions};
use serde_json::{Value, json};
use std::{
    collections::{BTreeMap, HashMap},
    path::Path,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

/// What a Secret holds, in clear: in `data` (base64, as stored) and in an annotation (metadata
/// is sealed too).
const SECRET_MARK: &str = "hunter2-SECRET-PLAINTEXT-0f3c";
const CONFIG_MARK: &str = "configmap-CLEAR-TEXT-7a91";

fn keyring(names: &[&str]) -> Keyring {
    Keyring::new(names.iter().map(|n| Key::generate(n).unwrap()).collect())
}

fn secret(name: &str, value: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
           "metadata": {"name": name, "namespace": "a", "annotations": {"note": SECRET_MARK}},
           "data": {"password": BASE64.encode(value)}})
}

fn config_map(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "a"},
           "data": {"greeting": CONFIG_MARK}})
}

/// The strings whose presence would mean a Secret in clear.
fn secret_needles() -> Vec<String> {
    vec![SECRET_MARK.to_owned(), BASE64.encode(SECRET_MARK)]
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// Every file under `dir`, with its bytes.
fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(files(&path));
        } else if let Ok(bytes) = std::fs::read(&path) {
            out.push((path.display().to_string(), bytes));
        }
    }
    out
}

/// Asserts that no file under `dir` holds a Secret in clear, that some file holds the
/// ConfigMap's value, and that `expected` files were scanned.
fn assert_no_plaintext_on_disk(dir: &Path, expected: &[&str]) {
    let files = files(dir);
    for name in expected {
        assert!(files.iter().any(|(path, bytes)| path.ends_with(name) && !bytes.is_empty()), "{name} was scanned");
    }
    for (path, bytes) in &files {
        for needle in secret_needles() {
            assert!(!contains(bytes, &needle), "{path} holds a Secret in clear ({needle})");
        }
    }
    assert!(files.iter().any(|(_, bytes)| contains(bytes, CONFIG_MARK)), "the scan finds a ConfigMap's value");
}

/// The API sees plaintext objects exactly as without encryption: get, list, watch.
async fn assert_reads_are_plaintext(store: &dyn Store) {
    let key = ObjectKey::new("Secret", "a", "db");
    let got = store.get(&key).await.unwrap().expect("the Secret");
    assert_eq!(got["data"]["password"], BASE64.encode("v3"));
    assert_eq!(got["metadata"]["annotations"]["note"], SECRET_MARK);
    let list = store.list("Secret", &ListOptions::default()).await.unwrap();
    assert_eq!(list.items.len(), 2);
    // A list at a past revision reads the history.
    let old = ListOptions { at_revision: Some(list.revision - 1), ..ListOptions::default() };
    assert!(!store.list("Secret", &old).await.unwrap().items.is_empty());
    let mut watch =
        store.watch(0, WatchOptions { kinds: Some(vec!["Secret".into()]), ..Default::default() }).await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(30), watch.next()).await.unwrap().unwrap().unwrap();
    assert_eq!(first.object["data"]["password"], BASE64.encode("v1"), "the history, opened");
}

/// Writes Secrets (a create, updates, a delete: every row kind) and a ConfigMap.
async fn write_objects(store: &dyn Store) {
    store.txn(vec![Op::Create(secret("db", "v1")), Op::Create(config_map("greeting"))]).await.unwrap();
    for version in ["v2", "v3"] {
        store.txn(vec![Op::Update(secret("db", version))]).await.unwrap();
    }
    store.txn(vec![Op::Create(secret("gone", SECRET_MARK))]).await.unwrap();
    store.txn(vec![Op::Create(secret("other", SECRET_MARK))]).await.unwrap();
    store.txn(vec![Op::Delete { key: ObjectKey::new("Secret", "a", "gone"), revision: None }]).await.unwrap();
}

#[tokio::test]
async fn the_sqlite_file_and_its_wal_hold_no_secret_in_clear() {
    let dir = tempfile::tempdir().unwrap();
    let store =
        SqliteStore::open_encrypted(&dir.path().join("store.db"), Durability::Full, keyring(&["k1"])).await.unwrap();
    write_objects(&store).await;
    assert_reads_are_plaintext(&store).await;
    // In the WAL now; after a checkpoint, in the database file.
    assert_no_plaintext_on_disk(dir.path(), &["store.db-wal"]);
    sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)").execute(store.pool()).await.unwrap();
    assert_no_plaintext_on_disk(dir.path(), &["store.db"]);
    let at_rest = store.at_rest().await.unwrap();
    assert_eq!((at_rest.stale_objects, at_rest.stale_history), (0, 0), "every version is sealed under k1");

    // The control: without keys, the same writes are on disk in clear.
    let clear = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(&clear.path().join("store.db"), Durability::Full).await.unwrap();
    write_objects(&store).await;
    assert!(files(clear.path()).iter().any(|(_, b)| contains(b, SECRET_MARK)), "the scan would see a Secret");
}

#[tokio::test]
async fn the_raft_log_and_snapshots_hold_no_secret_in_clear() {
    let dir = tempfile::tempdir().unwrap();
    let peers = BTreeMap::from([(1, "127.0.0.1:9".to_owned())]);
    let mut config = ReplicaConfig::new(1, peers, dir.path().to_path_buf(), PeerToken::new(&"t".repeat(32)).unwrap());
    let k1 = Key::generate("k1").unwrap();
    config.secrets = Keyring::new(vec![k1.clone()]);
    let store = RaftStore::start(config).await.unwrap();
    write_objects(&store).await;
    assert_reads_are_plaintext(&store).await;
    store.raft().trigger().snapshot().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_dir(dir.path().join("snapshots"))
        .unwrap()
        .flatten()
        .any(|e| e.path().extension().is_some_and(|x| x == "db"))
    {
        assert!(Instant::now() < deadline, "no snapshot was built");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    store.shutdown().await;
    assert_no_plaintext_on_disk(dir.path(), &["raft.db-wal", "store.db-wal"]);
    for (path, bytes) in files(dir.path()) {
        if path.ends_with(".db") && path.contains("snapshots") {
            assert!(contains(&bytes, CONFIG_MARK), "the snapshot was scanned");
        }
    }
    drop(store);
    // A new write key: the log re-seals itself under it, and then opens without the old key.
    let raft_db = dir.path().join("raft.db");
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", raft_db.display())).await.unwrap();
    let count = |pattern: &'static str| {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM log WHERE entry LIKE ?").bind(pattern).fetch_one(&pool)
    };
    // Counted before the new key exists: the re-sealing starts as soon as the log opens with it.
    assert!(count("%gitplane:enc:v1:k1:%").await.unwrap() > 3, "the log holds entries sealed under k1");
    let k2 = Key::generate("k2").unwrap();
    let _rotating = LogStore::open(&raft_db, Keyring::new(vec![k2.clone(), k1])).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while count("%gitplane:enc:v1:k1:%").await.unwrap() > 0 {
        assert!(Instant::now() < deadline, "the log was not re-sealed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The log read back from disk (not from memory) opens with k2 alone.
    let mut log = LogStore::open(&raft_db, Keyring::new(vec![k2])).await.unwrap();
    let mut reader = openraft::storage::RaftLogStorage::get_log_reader(&mut log).await;
    let entries = openraft::RaftLogReader::try_get_log_entries(&mut reader, 0..100).await.unwrap();
    assert!(entries.len() > 5, "{} entries", entries.len());
}

#[tokio::test]
async fn postgres_rows_hold_no_secret_in_clear() {
    let pg = PgCluster::start();
    let options = pg.empty_database().await;
    let store = PostgresStore::open(options, Duration::from_millis(100), keyring(&["k1"])).await.unwrap();
    write_objects(&store).await;
    assert_reads_are_plaintext(&store).await;
    let pool = store.pool();
    for table in ["objects", "events"] {
        let rows: Vec<(String, String)> =
            sqlx::query_as(&format!("SELECT kind, value FROM {table}")).fetch_all(pool).await.unwrap();
        assert!(rows.iter().any(|(kind, _)| kind == "Secret"), "{table} holds Secrets");
        for (kind, value) in &rows {
            for needle in secret_needles() {
                assert!(!value.contains(&needle), "a {kind} row of {table} holds a Secret in clear");
            }
            if kind == "Secret" {
                assert_eq!(encryption::sealed_with(value), Some("k1"), "{table}");
            }
        }
        assert!(rows.iter().any(|(_, v)| v.contains(CONFIG_MARK)), "the scan finds a ConfigMap's value in {table}");
    }
}

/// Reads a Secret's password as the writer wrote it.
fn password(object: &Value) -> String {
    String::from_utf8(BASE64.decode(object["data"]["password"].as_str().unwrap()).unwrap()).unwrap()
}

/// Rotates from k1 to k2 while a writer updates and creates Secrets, then checks every write
/// the writer saw committed is there, every Secret and every version of the history is under
/// k2, and the store works without k1.
async fn rotate_while_writing(store: Arc<dyn Store>, at_rest: impl AsyncFn() -> AtRest, secrets: Keyring, k1: Key) {
    for i in 0..100 {
        store.txn(vec![Op::Create(secret(&format!("s{i}"), "0"))]).await.unwrap();
    }
    // name -> the last password the writer saw committed.
    let committed: Arc<Mutex<HashMap<String, String>>> =
        Arc::new(Mutex::new((0..100).map(|i| (format!("s{i}"), "0".to_owned())).collect()));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (store, committed, stop) = (store.clone(), committed.clone(), stop.clone());
        tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::SeqCst) {
                n += 1;
                let name = format!("s{}", n % 120);
                let key = ObjectKey::new("Secret", "a", &name);
                let op = match store.get(&key).await.unwrap() {
                    // A compare-and-swap on the version read, as every writer does.
                    Some(mut current) => {
                        current["data"]["password"] = BASE64.encode(n.to_string()).into();
                        Op::Update(current)
                    }
                    None => Op::Create(secret(&name, &n.to_string())),
                };
                match store.txn(vec![op]).await {
                    Ok(_) => {
                        committed.lock().unwrap().insert(name, n.to_string());
                    }
                    Err(e) if e.is_conflict() => {}
                    Err(e) => panic!("the writer failed: {e}"),
                }
            }
            n
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await; // the writer is going (not a wait for a condition)
    // k2 seals from now on; k1 still opens.
    let k2 = Key::generate("k2").unwrap();
    secrets.set(vec![k2.clone(), k1]);
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut rounds = 0;
    loop {
        let state = at_rest().await;
        if state.stale.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "the rotation did not finish: {state:?}");
        encryption::rewrite(store.as_ref(), &state.stale).await.unwrap();
        rounds += 1;
    }
    stop.store(true, Ordering::SeqCst);
    let writes = writer.await.unwrap();
    assert!(writes > 100 && rounds >= 1, "the writer wrote ({writes}) during the rotation ({rounds} rounds)");
    let committed = committed.lock().unwrap().clone();
    for (name, want) in &committed {
        let got = store.get(&ObjectKey::new("Secret", "a", name)).await.unwrap().expect(name);
        assert_eq!(&password(&got), want, "{name}: a committed write was lost");
    }
    let state = at_rest().await;
    assert!(state.stale.is_empty() && state.write_key.as_deref() == Some("k2"), "{state:?}");
    // Compacting drops the history under older keys; then k1 can go.
    store.compact(store.revision().await.unwrap()).await.unwrap();
    assert_eq!(at_rest().await.stale_history, 0);
    secrets.set(vec![k2]);
    let list = store.list("Secret", &ListOptions::default()).await.unwrap();
    assert_eq!(list.items.len(), committed.len(), "every Secret opens without k1");
    let mut watch = store.watch(0, WatchOptions::default()).await;
    if let Ok(watch) = &mut watch {
        // Whatever history is left opens without k1 too.
        while let Ok(Some(event)) = tokio::time::timeout(Duration::from_millis(500), watch.next()).await {
            event.unwrap();
        }
    }
}

#[tokio::test]
async fn rotating_while_a_writer_goes_on_loses_nothing_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let k1 = Key::generate("k1").unwrap();
    let secrets = Keyring::new(vec![k1.clone()]);
    let store =
        SqliteStore::open_encrypted(&dir.path().join("store.db"), Durability::Full, secrets.clone()).await.unwrap();
    let probe = store.clone();
    rotate_while_writing(Arc::new(store), async move || probe.at_rest().await.unwrap(), secrets, k1).await;
}

#[tokio::test]
async fn rotating_while_a_writer_goes_on_loses_nothing_postgres() {
    let pg = PgCluster::start();
    let k1 = Key::generate("k1").unwrap();
    let secrets = Keyring::new(vec![k1.clone()]);
    let store =
        PostgresStore::open(pg.empty_database().await, Duration::from_millis(100), secrets.clone()).await.unwrap();
    let probe = store.clone();
    rotate_while_writing(Arc::new(store), async move || probe.at_rest().await.unwrap(), secrets, k1).await;
}

#[tokio::test]
async fn a_secret_under_a_missing_key_is_a_clear_error_not_garbage() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.db");
    let store = SqliteStore::open_encrypted(&path, Durability::Full, keyring(&["gone"])).await.unwrap();
    store.txn(vec![Op::Create(secret("db", "v1")), Op::Create(config_map("greeting"))]).await.unwrap();
    drop(store);
    let store = SqliteStore::open_encrypted(&path, Durability::Full, keyring(&["k2"])).await.unwrap();
    let key = ObjectKey::new("Secret", "a", "db");
    let e = store.get(&key).await.unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, StoreError::Backend(_)), "{e:?}");
    assert!(text.contains("Secret a/db") && text.contains("\"gone\"") && text.contains("keys: k2"), "{text}");
    assert!(!text.contains(SECRET_MARK));
    assert!(store.list("Secret", &ListOptions::default()).await.unwrap_err().to_string().contains("\"gone\""));
    // A write that touches it is refused on its own; the rest of the store works.
    let refused = store.txn(vec![Op::Update(secret("db", "v2"))]).await.unwrap_err().to_string();
    assert!(refused.contains("Secret a/db") && refused.contains("\"gone\""), "{refused}");
    assert!(store.get(&ObjectKey::new("ConfigMap", "a", "greeting")).await.unwrap().is_some());
    store.txn(vec![Op::Create(secret("new", "v1"))]).await.unwrap();
}
