//! The Postgres store against a real, private PostgreSQL: the conformance suite, two replicas on
//! one database, the lease and the fence.

use super::{testing::PgCluster, *};
use futures::StreamExt;
use gitplane_store::{Event, ListOptions, WatchStream};
use serde_json::json;
use std::{
    collections::BTreeMap,
    future::Future,
    time::{Duration, Instant},
};

fn pod(ns: &str, name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns}, "spec": {"containers": []}})
}

fn key(ns: &str, name: &str) -> ObjectKey {
    ObjectKey::new("Pod", ns, name)
}

async fn next(stream: &mut WatchStream) -> Event {
    match tokio::time::timeout(Duration::from_secs(10), stream.next()).await {
        Ok(Some(Ok(event))) => event,
        Ok(Some(Err(e))) => panic!("the watch failed: {e}"),
        Ok(None) => panic!("the watch ended"),
        Err(_) => panic!("no event within 10 s"),
    }
}

/// Polls `check` until it yields a value (wait, never sleep).
async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[test]
fn the_watch_cache_holds_contiguous_revisions_only() {
    // (cache end, batch start, batch revision, step)
    let cases = [
        (10, 10, 10, CacheStep::Skip),    // every transaction refused or empty
        (10, 10, 12, CacheStep::Append),  // the next revisions after the cache's end
        (10, 11, 12, CacheStep::Restart), // another replica committed 11
        (12, 10, 11, CacheStep::Skip),    // a batch that raced the writer task and lost
    ];
    for (end, start, revision, step) in cases {
        assert_eq!(cache_step(end, start, revision), step, "end {end}, batch {start}..{revision}");
    }
}

#[test]
fn notices_name_the_revision_the_writer_and_the_kinds() {
    let commits = Commits { latest: watch::channel(0).0, kinds: Arc::default(), writer: "w1".into() };
    let many: Vec<String> = (0..400).map(|i| format!("Kind{i}.example.com")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    // (kinds written, payload, kinds read back)
    type Case<'a> = (&'a [&'a str], &'a str, Option<Vec<&'a str>>);
    let cases: [Case; 3] = [
        (&["Lease.coordination.k8s.io"], "7 w1 Lease.coordination.k8s.io", Some(vec!["Lease.coordination.k8s.io"])),
        (&["Node", "Pod"], "7 w1 Node,Pod", Some(vec!["Node", "Pod"])),
        (&many, "7 w1 ", None), // too long to name: every watch wakes
    ];
    for (kinds, payload, read) in cases {
        assert_eq!(commits.notice(7, kinds), payload);
        assert_eq!(parse_notice(payload), Some(Notice { revision: 7, writer: Some("w1"), kinds: read }), "{payload}");
    }
    // (payload of another version or writer, what is read)
    let foreign = [
        ("12", Some(Notice { revision: 12, writer: None, kinds: None })),
        ("12 w2", Some(Notice { revision: 12, writer: Some("w2"), kinds: None })),
        ("", None),
        ("twelve w2 Pod", None),
    ];
    for (payload, notice) in foreign {
        assert_eq!(parse_notice(payload), notice, "{payload:?}");
    }
}

#[tokio::test]
async fn conformance() {
    let cluster = PgCluster::start();
    let started = Instant::now();
    gitplane_store::conformance::run_all(|| {
        let cluster = &cluster;
        async move { ((), PostgresStore::connect_with(cluster.empty_database().await).await.unwrap()) }
    })
    .await;
    eprintln!("postgres conformance suite: {:.2?} (an emptied database per check)", started.elapsed());
}

#[tokio::test]
async fn compaction_vacuums_the_history_it_deleted() {
    let cluster = PgCluster::start();
    let store = PostgresStore::connect_with(cluster.empty_database().await).await.unwrap();
    let pod = |i: usize| {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "a"},
               "spec": {"message": format!("{i}{}", "x".repeat(100_000))}})
    };
    store.txn(vec![Op::Create(pod(0))]).await.unwrap();
    let mut latest = 0;
    for i in 1..50 {
        latest = store.txn(vec![Op::Update(pod(i))]).await.unwrap().revision;
    }
    store.compact(latest).await.unwrap();
    let (vacuums, dead) = eventually("the vacuum in the statistics", || async {
        let row: (i64, i64) =
            sqlx::query_as("SELECT vacuum_count, n_dead_tup FROM pg_stat_user_tables WHERE relname = 'events'")
                .fetch_one(store.pool())
                .await
                .unwrap();
        (row.0 > 0).then_some(row)
    })
    .await;
    assert_eq!((vacuums, dead), (1, 0), "one vacuum, right after the compaction, and no dead row left");
}

#[tokio::test]
async fn a_commit_through_one_replica_reaches_the_watchers_of_the_other() {
    let cluster = PgCluster::start();
    let db = cluster.empty_database().await;
    // Replicas that start together migrate one after the other.
    let url = cluster.url(db.get_database().unwrap());
    let (a, b) = tokio::join!(PostgresStore::connect_with(db.clone()), PostgresStore::connect(&url));
    let (a, b) = (a.unwrap(), b.unwrap());
    let mut from_start = b.watch(0, WatchOptions::default()).await.unwrap();
    let first = a.txn(vec![Op::Create(pod("a", "p"))]).await.unwrap();
    let e = next(&mut from_start).await;
    assert_eq!((e.revision, e.key.name.as_str(), &*e.object), (first.revision, "p", &first.objects[0]));
    assert_eq!(b.get(&key("a", "p")).await.unwrap().as_ref(), Some(&first.objects[0]));
    assert_eq!(b.revision().await.unwrap(), first.revision);
    let idle: String =
        sqlx::query_scalar("SHOW idle_in_transaction_session_timeout").fetch_one(b.pool()).await.unwrap();
    assert_eq!(idle, "1min", "a stalled replica cannot hold the revision lock for long");

    // A watch that starts later replays what the other replica wrote, then follows it.
    let mut late = b.watch(0, WatchOptions::default()).await.unwrap();
    assert_eq!(next(&mut late).await.revision, first.revision);
    let second = a.txn(vec![Op::Create(pod("a", "q"))]).await.unwrap();
    assert_eq!(next(&mut late).await.revision, second.revision);
    assert_eq!(next(&mut from_start).await.revision, second.revision);
}

#[tokio::test]
async fn notifications_wake_watchers_without_the_poll() {
    let cluster = PgCluster::start();
    let db = cluster.empty_database().await;
    let writer = PostgresStore::connect_with(db.clone()).await.unwrap();
    // Polling once an hour: only a notification can deliver within the test's deadline.
    let reader = PostgresStore::open(db, Duration::from_secs(3600), Keyring::identity()).await.unwrap();
    let mut committed = reader.committed();
    let mut watch = reader.watch(0, WatchOptions::default()).await.unwrap();
    let pods = WatchOptions { kinds: Some(vec!["Pod".into()]), bookmarks: false, ..Default::default() };
    let mut of_pods = reader.watch(0, pods).await.unwrap();
    // The listener subscribes in the background; a commit before that is caught up by its
    // first poll, so keep committing until the reader has seen one through NOTIFY alone.
    let c = writer.txn(vec![Op::Create(pod("a", "p"))]).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), committed.wait_for(|r| *r >= c.revision)).await.unwrap().unwrap();
    assert_eq!(next(&mut watch).await.revision, c.revision);
    assert_eq!(next(&mut of_pods).await.revision, c.revision);
    for i in 0..5 {
        let c = writer.txn(vec![Op::Create(pod("a", &format!("n{i}")))]).await.unwrap();
        assert_eq!(next(&mut watch).await.revision, c.revision);
        assert_eq!(next(&mut of_pods).await.revision, c.revision);
    }
}

#[tokio::test]
async fn the_poll_finds_commits_whose_notification_was_lost() {
    let cluster = PgCluster::start();
    let db = cluster.empty_database().await;
    let reader = PostgresStore::open(db.clone(), Duration::from_millis(100), Keyring::identity()).await.unwrap();
    let mut watch = reader.watch(0, WatchOptions::default()).await.unwrap();
    // A commit that notifies nobody, as if the listener had been disconnected at the time.
    let mut conn = PgConnection::connect_with(&db).await.unwrap();
    let txn = Txn::new(vec![Op::Create(pod("a", "silent"))]);
    let mut tx = conn.begin().await.unwrap();
    let start: i64 = sqlx::query_scalar("SELECT value FROM meta WHERE key = 'revision' FOR UPDATE")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
    let backend::Applied { results, revision, .. } =
        backend::apply_txns(&mut *tx, &Keyring::identity(), &[txn], start).await.unwrap();
    assert!(results[0].is_ok());
    sqlx::query("UPDATE meta SET value = $1 WHERE key = 'revision'").bind(revision).execute(&mut *tx).await.unwrap();
    tx.commit().await.unwrap();
    let e = next(&mut watch).await;
    assert_eq!((e.revision, e.key.name.as_str()), (revision, "silent"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_on_two_replicas_get_distinct_revisions_in_commit_order() {
    let cluster = PgCluster::start();
    let db = cluster.empty_database().await;
    let a = PostgresStore::connect_with(db.clone()).await.unwrap();
    let b = PostgresStore::connect_with(db).await.unwrap();
    // Watchers on both replicas, reading while the writes land: a revision that committed after
    // a higher one would be skipped by them.
    let watchers: Vec<_> = [&a, &b, &a, &b]
        .into_iter()
        .enumerate()
        .map(|(i, store)| {
            let store = store.clone();
            tokio::spawn(async move {
                let kinds = (i >= 2).then(|| vec!["Pod".to_owned()]);
                let mut w =
                    store.watch(0, WatchOptions { kinds, bookmarks: false, ..Default::default() }).await.unwrap();
                let mut seen = Vec::new();
                while seen.len() < 200 {
                    let e = next(&mut w).await;
                    seen.push((e.revision, e.key.name));
                }
                seen
            })
        })
        .collect();
    let writers: Vec<_> = (0..200)
        .map(|i| {
            let store = if i % 2 == 0 { a.clone() } else { b.clone() };
            tokio::spawn(async move {
                let name = format!("p{i}");
                (store.txn(vec![Op::Create(pod("a", &name))]).await.unwrap().revision, name)
            })
        })
        .collect();
    let mut committed = BTreeMap::new();
    for w in writers {
        let (revision, name) = w.await.unwrap();
        assert!(committed.insert(revision, name).is_none(), "revision {revision} given twice");
    }
    assert_eq!(committed.keys().copied().collect::<Vec<_>>(), (1..=200).collect::<Vec<_>>());
    let expected: Vec<_> = committed.into_iter().collect();
    for w in watchers {
        assert_eq!(w.await.unwrap(), expected, "every watcher sees every commit once, in revision order");
    }
    assert_eq!(a.list("Pod", &ListOptions::default()).await.unwrap().items.len(), 200);
}

#[tokio::test]
async fn the_lease_has_one_holder_and_passes_on_after_expiry_with_a_higher_token() {
    let cluster = PgCluster::start();
    let store = PostgresStore::connect_with(cluster.empty_database().await).await.unwrap();
    let pool = store.pool().clone();
    let ttl = Duration::from_millis(600);
    let a = LeaderLease::new(pool.clone(), "a", ttl).unwrap();
    let b = LeaderLease::new(pool.clone(), "b", ttl).unwrap();
    let first = a.try_acquire().await.unwrap().expect("a free lease is granted");
    assert_eq!(b.try_acquire().await.unwrap(), None, "one holder at a time");
    assert!(a.renew(first).await.unwrap());
    let state = LeaderLease::state(&pool).await.unwrap();
    assert_eq!((state.holder.as_str(), state.token), ("a", first));
    assert!(state.expires_in.is_some_and(|left| left <= ttl));

    // a stops renewing; b takes over once the database's clock says the lease expired.
    let second = eventually("b to take the expired lease", || async { b.try_acquire().await.unwrap() }).await;
    assert!(second > first, "a new holder gets a higher token ({second} after {first})");
    assert!(!a.renew(first).await.unwrap(), "the deposed holder cannot renew");
    assert_eq!(a.try_acquire().await.unwrap(), None, "nor take it back while b holds it");

    // Campaigns: a renewing holder keeps it; when it stops, the other takes over at once.
    b.release(second).await.unwrap();
    let (ttl, renew) = (Duration::from_secs(2), Duration::from_millis(200));
    let mut campaign_a = LeaderLease::campaign(pool.clone(), "a2", ttl, renew).unwrap();
    let third = campaign_a.wait_for(Option::is_some).await.unwrap().unwrap_or_default();
    assert!(third > second);
    let mut campaign_b = LeaderLease::campaign(pool.clone(), "b2", ttl, renew).unwrap();
    // Proving something does not happen is the one use of sleep: longer than a lease lasts.
    tokio::time::sleep(ttl + ttl / 4).await;
    assert_eq!((*campaign_a.borrow(), *campaign_b.borrow()), (Some(third), None));
    drop(campaign_a); // stops campaigning and releases the lease
    let fourth = tokio::time::timeout(Duration::from_secs(10), campaign_b.wait_for(Option::is_some))
        .await
        .expect("b2 takes over after a2 resigns")
        .unwrap()
        .unwrap_or_default();
    assert!(fourth > third);
    assert_eq!(LeaderLease::state(&pool).await.unwrap().holder, "b2");
    // The campaign reports the loss when a renewal finds someone else in the row.
    sqlx::query("UPDATE leader SET holder = 'intruder', token = token + 1").execute(&pool).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), campaign_b.wait_for(Option::is_none))
        .await
        .expect("b2 notices it lost the lease")
        .unwrap();
    assert!(LeaderLease::campaign(pool, "c", ttl, ttl).is_err(), "renewing no more often than it expires is refused");
}

#[tokio::test]
async fn a_deposed_leader_can_never_write() {
    let cluster = PgCluster::start();
    let db = cluster.empty_database().await;
    let base = PostgresStore::connect_with(db.clone()).await.unwrap();
    let ttl = Duration::from_millis(300);
    let a_lease = LeaderLease::new(base.pool().clone(), "a", ttl).unwrap();
    let old = a_lease.try_acquire().await.unwrap().unwrap();
    // Replica a writes through a fenced handle of its own store.
    let a = PostgresStore::connect_with(db.clone()).await.unwrap().fenced(Fence::new("a", old));
    a.txn(vec![Op::Create(pod("a", "before"))]).await.unwrap();

    let b_lease = LeaderLease::new(base.pool().clone(), "b", ttl).unwrap();
    let new = eventually("b to take over", || async { b_lease.try_acquire().await.unwrap() }).await;
    let revision = base.revision().await.unwrap();
    match a.txn(vec![Op::Create(pod("a", "late"))]).await.unwrap_err() {
        StoreError::Fenced { holder, token, current_holder, current_token } => {
            assert_eq!((holder.as_str(), token, current_holder.as_str(), current_token), ("a", old, "b", new));
        }
        e => panic!("expected Fenced, got {e}"),
    }
    let err = a.apply_batch(&[Txn::new(vec![Op::Create(pod("a", "late"))])]).await.unwrap_err();
    assert!(err.to_string().contains("no longer the leader"), "{err}");
    assert!(matches!(a.compact(revision).await, Err(StoreError::Fenced { .. })));
    assert!(base.get(&key("a", "late")).await.unwrap().is_none(), "nothing of a fenced write is applied");
    assert_eq!(base.revision().await.unwrap(), revision);

    // The new leader writes; so does an unfenced (single-writer) store.
    let b = base.fenced(Fence::new("b", new));
    b.txn(vec![Op::Create(pod("a", "late"))]).await.unwrap();
    base.txn(vec![Op::Create(pod("a", "unfenced"))]).await.unwrap();
    // Releasing deposes too: the holder no longer matches.
    b_lease.release(new).await.unwrap();
    assert!(matches!(b.txn(vec![Op::Create(pod("a", "x"))]).await, Err(StoreError::Fenced { .. })));
}

#[tokio::test]
async fn a_takeover_waits_for_the_fenced_write_in_flight() {
    let cluster = PgCluster::start();
    let db = cluster.empty_database().await;
    let store = PostgresStore::connect_with(db.clone()).await.unwrap();
    let ttl = Duration::from_millis(100);
    let a = LeaderLease::new(store.pool().clone(), "a", ttl).unwrap();
    let token = a.try_acquire().await.unwrap().unwrap();
    // A fenced write transaction of a, past its check but not yet committed.
    let mut conn = PgConnection::connect_with(&db).await.unwrap();
    let mut tx = conn.begin().await.unwrap();
    lease::check(&mut tx, &Fence::new("a", token)).await.unwrap();
    tokio::time::sleep(ttl * 2).await; // a's lease has expired meanwhile
    let b = LeaderLease::new(store.pool().clone(), "b", ttl).unwrap();
    let takeover = tokio::spawn(async move { b.try_acquire().await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!takeover.is_finished(), "the takeover is ordered after the write that passed its check");
    tx.commit().await.unwrap();
    let new = tokio::time::timeout(Duration::from_secs(10), takeover).await.unwrap().unwrap().unwrap();
    assert_eq!(new, Some(token + 1));
}

#[tokio::test]
async fn bad_urls_and_unreachable_servers_are_clear_errors() {
    let err = PostgresStore::connect("definitely not a url").await.err().expect("an invalid URL is an error");
    assert!(matches!(err, StoreError::BadRequest(_)) && err.to_string().contains("invalid Postgres URL"), "{err}");

    let started = Instant::now();
    let url = "postgres://gitplane:secret@localhost/gitplane?host=/nonexistent/gitplane-socket";
    let err = PostgresStore::connect(url).await.err().expect("an absent server is an error");
    let message = err.to_string();
    assert!(matches!(err, StoreError::Connect { .. }), "{message}");
    assert!(message.contains("/nonexistent/gitplane-socket") && message.contains("\"gitplane\""), "{message}");
    assert!(!message.contains("secret"), "the password stays out of errors: {message}");
    assert!(started.elapsed() < Duration::from_secs(10), "fails fast, not after a pool timeout");

    let cluster = PgCluster::start();
    let err = PostgresStore::connect(&cluster.url("missing")).await.err().expect("a missing database is an error");
    assert!(err.to_string().contains("\"missing\" does not exist"), "{err}");
}

#[tokio::test]
async fn corrupt_rows_are_reported_with_their_object() {
    let cluster = PgCluster::start();
    let db = cluster.empty_database().await;
    let store = PostgresStore::connect_with(db.clone()).await.unwrap();
    store.txn(vec![Op::Create(pod("a", "p"))]).await.unwrap();
    sqlx::query("UPDATE objects SET value = '{not json'").execute(store.pool()).await.unwrap();
    let err = store.get(&key("a", "p")).await.unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { .. }) && err.to_string().contains("Pod a/p"), "{err}");
    assert!(matches!(store.list("Pod", &ListOptions::default()).await, Err(StoreError::Corrupt { .. })));
    // The store reopens at its revision.
    drop(store);
    let store = PostgresStore::connect_with(db).await.unwrap();
    assert_eq!(store.revision().await.unwrap(), 1);
}

#[tokio::test]
async fn keys_postgres_cannot_store_are_refused_alone() {
    let cluster = PgCluster::start();
    let store = PostgresStore::connect_with(cluster.empty_database().await).await.unwrap();
    let (bad, good) = (store.clone(), store.clone());
    // Queued together, so likely one batch: the NUL refuses its own transaction only.
    let (bad, good) = tokio::join!(async move { bad.txn(vec![Op::Create(pod("a", "nul\0name"))]).await }, async move {
        good.txn(vec![Op::Create(pod("a", "fine"))]).await
    });
    assert!(matches!(bad, Err(StoreError::Rejected(Rejection::Invalid(_)))), "{bad:?}");
    good.unwrap();
    assert!(store.get(&key("a", "nul\0name")).await.unwrap().is_none());
    let options = ListOptions { namespace: Some("a\0".into()), ..Default::default() };
    assert!(matches!(store.list("Pod", &options).await, Err(StoreError::BadRequest(_))));
}

/// A table's shape, as both databases describe it: (column, integer or text, NOT NULL, place in
/// the primary key).
type Columns = Vec<(String, &'static str, bool, i64)>;

fn type_class(declared: &str) -> &'static str {
    match declared.to_ascii_lowercase().as_str() {
        "integer" | "bigint" => "integer",
        "text" => "text",
        _ => "other",
    }
}

async fn sqlite_tables(pool: &sqlx::SqlitePool) -> BTreeMap<String, Columns> {
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' AND name NOT LIKE '_sqlx%'",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let mut shapes = BTreeMap::new();
    for table in tables {
        let rows: Vec<(String, String, bool, i64)> =
            sqlx::query_as("SELECT name, type, \"notnull\", pk FROM pragma_table_info(?) ORDER BY cid")
                .bind(&table)
                .fetch_all(pool)
                .await
                .unwrap();
        shapes.insert(table, rows.into_iter().map(|(c, t, n, pk)| (c, type_class(&t), n || pk > 0, pk)).collect());
    }
    shapes
}

async fn postgres_tables(pool: &PgPool) -> BTreeMap<String, Columns> {
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables
         WHERE table_schema = current_schema() AND table_name NOT LIKE '\\_sqlx%'",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let mut shapes = BTreeMap::new();
    for table in tables {
        let rows: Vec<(String, String, bool, i64)> = sqlx::query_as(
            "SELECT c.column_name::text, c.data_type::text, c.is_nullable = 'NO',
                    -- indkey's subscripts start at 0; SQLite counts from 1.
                    COALESCE((SELECT (array_position(i.indkey::int2[], a.attnum)
                                      - array_lower(i.indkey::int2[], 1) + 1)::bigint
                              FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid
                              WHERE i.indrelid = $1::regclass AND i.indisprimary AND a.attname = c.column_name), 0)
             FROM information_schema.columns c
             WHERE c.table_schema = current_schema() AND c.table_name = $1 ORDER BY c.ordinal_position",
        )
        .bind(&table)
        .fetch_all(pool)
        .await
        .unwrap();
        shapes.insert(table, rows.into_iter().map(|(c, t, n, pk)| (c, type_class(&t), n, pk)).collect());
    }
    shapes
}

#[tokio::test]
async fn the_tables_and_indexes_are_sqlites() {
    let cluster = PgCluster::start();
    let postgres = PostgresStore::connect_with(cluster.empty_database().await).await.unwrap();
    let sqlite = crate::sqlite::SqliteStore::memory().await.unwrap();
    let mut tables = postgres_tables(postgres.pool()).await;
    // The one table SQLite has no use for: Raft elects its leader.
    assert!(tables.remove("leader").is_some(), "the leader lease's table");
    assert_eq!(tables, sqlite_tables(sqlite.pool()).await, "Postgres' tables against SQLite's");
    let sqlite_index: Vec<String> =
        sqlx::query_scalar("SELECT name FROM pragma_index_info('events_by_key') ORDER BY seqno")
            .fetch_all(sqlite.pool())
            .await
            .unwrap();
    let postgres_index: Vec<String> = sqlx::query_scalar(
        "SELECT a.attname::text FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid
         AND a.attnum = ANY(i.indkey) WHERE i.indexrelid = 'events_by_key'::regclass
         ORDER BY array_position(i.indkey::int2[], a.attnum)",
    )
    .fetch_all(postgres.pool())
    .await
    .unwrap();
    assert_eq!(postgres_index, sqlite_index);
    assert_eq!(sqlite_index, ["kind", "namespace", "name", "revision", "seq"]);
}
