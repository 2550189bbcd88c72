//! `gitplane-bench encryption`: what sealing Secrets at rest costs a write. The same SQLite
//! store (a file, fsync on every commit, as a single replica runs) takes Secret updates with and
//! without keys, in alternating rounds so both see the same machine; plus the seal and open of
//! one Secret on their own.

use anyhow::Result;
use gitplane_storage::{
    encryption::{Key, Keyring},
    sqlite::{Durability, SqliteStore},
};
use gitplane_store::{ObjectKey, Op, Store};
use serde_json::json;
use std::{
    sync::Arc,
    time::{Duration, Instant},
};

#[derive(clap::Args)]
pub struct EncryptionArgs {
    /// Writes per round and mode.
    #[arg(long, default_value_t = 2000)]
    writes: usize,
    /// Rounds of each mode, alternating.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Concurrent writers (each on its own Secrets).
    #[arg(long, default_value_t = 1)]
    clients: usize,
}

pub fn main(args: EncryptionArgs) -> Result<()> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(run(args))
}

/// A Secret of about 1 KiB of data.
fn secret(name: &str, n: usize) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name, "namespace": "bench"},
           "data": {"value": format!("{n:08}{}", "QUJD".repeat(256))}})
}

async fn round(store: Arc<SqliteStore>, writes: usize, clients: usize) -> Result<Vec<Duration>> {
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut times = Vec::with_capacity(writes / clients);
                for n in 0..writes / clients {
                    let name = format!("s{c}-{}", n % 100);
                    let key = ObjectKey::new("Secret", "bench", &name);
                    let op = if store.get(&key).await?.is_some() {
                        Op::Update(secret(&name, n))
                    } else {
                        Op::Create(secret(&name, n))
                    };
                    let start = Instant::now();
                    store.txn(vec![op]).await?;
                    times.push(start.elapsed());
                }
                anyhow::Ok(times)
            })
        })
        .collect();
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await??);
    }
    Ok(all)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

async fn run(args: EncryptionArgs) -> Result<()> {
    let dir = tempfile::Builder::new().prefix("gitplane-bench-encryption-").tempdir()?;
    let keys = Keyring::new(vec![Key::generate("bench")?]);
    let plain = Arc::new(SqliteStore::open(&dir.path().join("plain.db"), Durability::Full).await?);
    let sealed =
        Arc::new(SqliteStore::open_encrypted(&dir.path().join("sealed.db"), Durability::Full, keys.clone()).await?);
    let (mut without, mut with) = (Vec::new(), Vec::new());
    for r in 0..args.rounds {
        eprintln!("round {}/{}", r + 1, args.rounds);
        without.extend(round(plain.clone(), args.writes, args.clients).await?);
        with.extend(round(sealed.clone(), args.writes, args.clients).await?);
    }
    without.sort();
    with.sort();
    // Seal and open alone, on the same 1 KiB Secret.
    let key = ObjectKey::new("Secret", "bench", "s");
    let text = secret("s", 0).to_string();
    let n = 20_000;
    let start = Instant::now();
    let mut stored = String::new();
    for _ in 0..n {
        stored = keys.seal(&key, text.clone());
    }
    let seal = start.elapsed() / n;
    let start = Instant::now();
    for _ in 0..n {
        keys.open(&key, &stored).map_err(anyhow::Error::from)?;
    }
    let open = start.elapsed() / n;
    println!(
        "| Secret write (SQLite file, fsync, {} client(s), {} writes each) | p50 | p99 |",
        args.clients,
        without.len()
    );
    println!("|---|---|---|");
    for (name, times) in [("without encryption", &without), ("with encryption", &with)] {
        println!("| {name} | {:.2?} | {:.2?} |", percentile(times, 0.5), percentile(times, 0.99));
    }
    let ratio = percentile(&with, 0.5).as_secs_f64() / percentile(&without, 0.5).as_secs_f64();
    println!("| ratio (p50) | {ratio:.2}x | |");
    println!();
    println!("seal of one {} B Secret: {seal:.2?}; open: {open:.2?} ({} B stored)", text.len(), stored.len());
    Ok(())
}
