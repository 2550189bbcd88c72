//! The status API's WATCH under churn: many watches of Pods over HTTP/1.1 (one connection each,
//! spread over loopback source addresses, since the API allows 256 watches per client address)
//! on one `gitplane server`, while one writer creates Pods at a fixed rate through the store API
//! (open loop: a slow write does not delay the next). For every (write, watcher) pair: the time
//! from the write being sent to the watcher reading its event off the socket. Baseline, same
//! run and rate: the store's own gRPC watch (the `store` bench's fan-out row, ConfigMaps).

use crate::{
    load::{self, Api, Latencies},
    procs::{self, Gitplane},
    watch,
};
use anyhow::{Context as _, Result, bail};
use gitplane_storage::remote::pb;
use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader};

#[derive(clap::Args)]
pub struct ApiWatchArgs {
    /// The gitplane binary (default: the one next to this binary).
    #[arg(long)]
    gitplane: Option<PathBuf>,
    /// Concurrent watches.
    #[arg(long, default_value_t = 1000)]
    watchers: usize,
    /// Pods created per second.
    #[arg(long, default_value_t = 100)]
    rate: u32,
    /// Seconds of churn.
    #[arg(long, default_value_t = 20.0)]
    duration: f64,
}

/// Source addresses the watches come from (127.0.0.1 to 127.0.0.8).
const SOURCES: u8 = 8;
const NAME_MARK: &str = "\"name\":\"churn-";

fn pod(seq: usize) -> String {
    format!(
        r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"churn-{seq}","namespace":"default","labels":{{"app":"churn"}}}},"spec":{{"containers":[{{"name":"c","image":"gitplane.local/httpd:1"}}]}}}}"#
    )
}

pub fn main(args: ApiWatchArgs) -> Result<()> {
    let binary = procs::prepare(args.gitplane.as_deref(), None)?;
    if !binary.exists() {
        bail!("no gitplane binary at {}: build it (cargo build --release --bin gitplane)", binary.display());
    }
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(async {
        let duration = Duration::from_secs_f64(args.duration);
        let cluster = Gitplane::start(&binary, 1, &[]).await?;
        let addr = cluster.addrs[&1];
        eprintln!("baseline: {} store watches over gRPC, {} ConfigMaps/s for {duration:?}", args.watchers, args.rate);
        let connections = args.watchers.div_ceil(100).max(1);
        let store = watch::run(Api::Gitplane, addr, addr, args.watchers, connections, args.rate, duration).await?;
        eprintln!("status API: {} watches over HTTP/1.1, {} Pods/s for {duration:?}", args.watchers, args.rate);
        let (api, expected, errors) = run(addr, args.watchers, args.rate, duration).await?;
        let ms = |d: Option<Duration>| d.map_or("-".into(), |d| format!("{:.1} ms", d.as_secs_f64() * 1e3));
        let ratio = |a: Option<Duration>, b: Option<Duration>| match (a, b) {
            (Some(a), Some(b)) if !b.is_zero() => format!("{:.2}x", a.as_secs_f64() / b.as_secs_f64()),
            _ => "-".into(),
        };
        println!(
            "| watch ({} watchers, {} writes/s, {duration:?}) | delivered | p50 | p99 | max | p99 vs store |",
            args.watchers, args.rate
        );
        println!("|---|---|---|---|---|---|");
        let store_p99 = store.delivery.quantile(0.99);
        println!(
            "| store watch over gRPC (baseline, ConfigMaps) | {} of {} | {} | {} | {} | 1.00x |",
            store.delivery.len(),
            store.expected,
            ms(store.delivery.quantile(0.5)),
            ms(store_p99),
            ms(store.delivery.max())
        );
        println!(
            "| status API `?watch=1` over HTTP/1.1 (Pods) | {} of {expected}{} | {} | {} | {} | {} |",
            api.len(),
            if errors > 0 { format!(", {errors} write errors") } else { String::new() },
            ms(api.quantile(0.5)),
            ms(api.quantile(0.99)),
            ms(api.max()),
            ratio(api.quantile(0.99), store_p99)
        );
        drop(cluster);
        Ok(())
    })
}

/// Nanoseconds since `base` plus one (0: not sent).
struct Sent {
    base: Instant,
    at: Vec<AtomicU64>,
}

impl Sent {
    fn now(&self) -> u64 {
        self.base.elapsed().as_nanos() as u64 + 1
    }
}

/// Opens one watch from `source`; the reader after the response head.
async fn open(source: IpAddr, server: SocketAddr, from: i64) -> Result<BufReader<tokio::net::TcpStream>> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(source, 0))?;
    let mut stream = socket.connect(server).await?;
    let request = format!(
        "GET /api/v1/namespaces/default/pods?watch=1&resourceVersion={from}&timeoutSeconds=3600 HTTP/1.1\r\nHost: {server}\r\nAuthorization: Bearer {}\r\n\r\n",
        crate::procs::READ_TOKEN
    );
    stream.write_all(request.as_bytes()).await?;
    let mut reader = BufReader::new(stream);
    let mut status = String::new();
    reader.read_line(&mut status).await?;
    if !status.contains(" 200 ") {
        bail!("the watch was refused: {status}");
    }
    Ok(reader)
}

async fn run(server: SocketAddr, watchers: usize, rate: u32, duration: Duration) -> Result<(Latencies, u64, u64)> {
    let writes = (rate as f64 * duration.as_secs_f64()).round() as usize;
    let mut client = procs::store_client(load::connect(server).await?);
    let from = client.revision(pb::Empty {}).await?.into_inner().index as i64;
    let mut readers = Vec::with_capacity(watchers);
    for i in 0..watchers {
        let source = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1 + (i % SOURCES as usize) as u8));
        readers.push(open(source, server, from).await.with_context(|| format!("watch {i}"))?);
    }
    let sent = Arc::new(Sent { base: Instant::now(), at: (0..writes).map(|_| AtomicU64::new(0)).collect() });
    let done = Instant::now() + Duration::from_secs(1) + duration + Duration::from_secs(15);
    let mut receivers = Vec::with_capacity(watchers);
    for mut reader in readers {
        let sent = sent.clone();
        receivers.push(tokio::spawn(async move {
            // (write, when read); the first event of each Pod only (the scheduler's status
            // writes follow as MODIFIED).
            let mut seen = vec![false; writes];
            let mut received = Vec::with_capacity(writes);
            let mut line = Vec::new();
            let receive = async {
                while received.len() < writes {
                    line.clear();
                    if reader.read_until(b'\n', &mut line).await? == 0 {
                        break;
                    }
                    let now = sent.now();
                    // Chunk-size lines and trailers carry no name; an event is one chunk.
                    let Some(at) = find(&line, NAME_MARK.as_bytes()) else { continue };
                    let digits = &line[at + NAME_MARK.len()..];
                    let end = digits.iter().position(|b| !b.is_ascii_digit()).unwrap_or(digits.len());
                    let seq = std::str::from_utf8(&digits[..end]).ok().and_then(|s| s.parse::<usize>().ok());
                    if let Some(seq) = seq.filter(|s| *s < writes && !seen[*s]) {
                        seen[seq] = true;
                        received.push((seq, now));
                    }
                }
                anyhow::Ok(())
            };
            let outcome = tokio::time::timeout_at(done.into(), receive).await;
            (received, outcome.ok().and_then(Result::err).map(|e| e.to_string()))
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let errors = Arc::new(AtomicU64::new(0));
    let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
    let mut in_flight = Vec::with_capacity(writes);
    for seq in 0..writes {
        ticks.tick().await;
        let (sent, errors, mut client) = (sent.clone(), errors.clone(), client.clone());
        in_flight.push(tokio::spawn(async move {
            sent.at[seq].store(sent.now(), Ordering::SeqCst);
            let json = format!(r#"[{{"Create":{}}}]"#, pod(seq)).into_bytes();
            let reply = client.txn(tonic::Request::new(pb::Payload { json, data: Vec::new() })).await;
            let committed =
                matches!(reply.map(|r| r.into_inner().outcome), Ok(Some(pb::txn_reply::Outcome::Committed(_))));
            if !committed {
                errors.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for write in in_flight {
        let _ = write.await;
    }
    let mut delivery = Vec::with_capacity(writes * watchers);
    for receiver in receivers {
        let (received, error) = receiver.await.context("a watcher panicked")?;
        if let Some(e) = error {
            eprintln!("  a watcher failed: {e}");
        }
        for (seq, at) in received {
            let from = sent.at[seq].load(Ordering::SeqCst);
            delivery.push(Duration::from_nanos(at.saturating_sub(from)));
        }
    }
    Ok((Latencies::new(delivery), (writes * watchers) as u64, errors.load(Ordering::Relaxed)))
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}
