//! The status API's WATCH under churn: many watches of Pods on one `gitplane server`, while one
//! writer creates Pods at a fixed rate through the store API (open loop: a slow write does not
//! delay the next). For every (write, watcher) pair: the time from the write being sent to the
//! watcher reading its event off the socket. Two shapes of client, one after the other:
//! - one HTTP/1.1 connection per watch (a thousand separate clients, the worst case), spread
//!   over loopback source addresses, since the API allows 256 watches per client address;
//! - HTTP/2, a hundred watches multiplexed on each connection, as client-go multiplexes the
//!   watches of one process and as the baseline's gRPC watches are.
//!
//! Baseline, same run and rate: the store's own gRPC watch (the `store` bench's fan-out row,
//! ConfigMaps), and etcd's watch the same way when `--etcd` exists: the fan-out kube-apiserver
//! itself builds on, on the same machine.

use crate::{
    load::{self, Api},
    procs::{self, Gitplane},
    watch::{self, SendTimes, WatchResult},
};
use anyhow::{Context as _, Result, bail};
use gitplane_storage::remote::pb;
use http_body_util::BodyExt as _;
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
    /// The `etcd` binary for the anchor row (skipped when absent).
    #[arg(long, default_value = "/usr/bin/etcd")]
    etcd: PathBuf,
    /// The rows to run, in this order: `store`, `etcd`, `http1`, `http2` (all by default).
    #[arg(long, value_delimiter = ',', default_value = "store,etcd,http1,http2")]
    rows: Vec<Row>,
}

#[derive(Clone, Copy, PartialEq, clap::ValueEnum)]
enum Row {
    Store,
    Etcd,
    Http1,
    Http2,
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
        let connections = args.watchers.div_ceil(100).max(1);
        let mut store = None;
        let mut etcd = None;
        let mut api = None;
        let mut api2 = None;
        for row in &args.rows {
            match row {
                Row::Store => {
                    eprintln!("baseline: {} store watches over gRPC, {} ConfigMaps/s for {duration:?}", args.watchers, args.rate);
                    store = Some(watch::run(Api::Gitplane, addr, addr, args.watchers, connections, args.rate, duration).await?);
                }
                Row::Etcd if !args.etcd.exists() => eprintln!("no etcd at {}: no anchor row", args.etcd.display()),
                Row::Etcd => {
                    eprintln!("anchor: {} etcd watches over gRPC, {} ConfigMaps/s", args.watchers, args.rate);
                    let etcd_server = procs::Etcd::start(&args.etcd, 1).await?;
                    let addr = etcd_server.clients[&1];
                    etcd = Some(watch::run(Api::Etcd, addr, addr, args.watchers, connections, args.rate, duration).await?);
                }
                Row::Http1 => {
                    eprintln!("status API: {} watches over HTTP/1.1, {} Pods/s for {duration:?}", args.watchers, args.rate);
                    api = Some(run(addr, Transport::Http1, args.watchers, args.rate, duration).await?);
                }
                Row::Http2 => {
                    eprintln!("status API: {} watches over HTTP/2 ({connections} connections), {} Pods/s", args.watchers, args.rate);
                    api2 = Some(run(addr, Transport::Http2 { connections }, args.watchers, args.rate, duration).await?);
                }
            }
        }
        let ms = |d: Option<Duration>| d.map_or("-".into(), |d| format!("{:.1} ms", d.as_secs_f64() * 1e3));
        let store_p99 = store.as_ref().and_then(|s| s.delivery.quantile(0.99));
        println!(
            "| watch ({} watchers, {} writes/s, {duration:?}) | delivered | p50 | p99 | max | p99 vs store | the write's commit p50 / p99 | delivery after its acknowledgement p50 / p99 |",
            args.watchers, args.rate
        );
        println!("|---|---|---|---|---|---|---|---|");
        let rows = [
            ("etcd 3.4 watch over gRPC (anchor, ConfigMaps)".to_owned(), &etcd),
            ("store watch over gRPC (baseline, ConfigMaps)".to_owned(), &store),
            ("status API `?watch=1` over HTTP/1.1, a connection per watch (Pods)".to_owned(), &api),
            (format!("status API `?watch=1` over HTTP/2, {connections} connections (Pods)"), &api2),
        ];
        for (name, r) in rows.iter().filter_map(|(name, r)| Some((name, r.as_ref()?))) {
            let p99 = r.delivery.quantile(0.99);
            let ratio = match (p99, store_p99) {
                (Some(a), Some(b)) if !b.is_zero() => format!("{:.2}x", a.as_secs_f64() / b.as_secs_f64()),
                _ => "-".into(),
            };
            println!(
                "| {name} | {} of {}{} | {} | {} | {} | {ratio} | {} / {} | {} / {} |",
                r.delivery.len(),
                r.expected,
                if r.write_errors > 0 { format!(", {} write errors", r.write_errors) } else { String::new() },
                ms(r.delivery.quantile(0.5)),
                ms(p99),
                ms(r.delivery.max()),
                ms(r.commit.quantile(0.5)),
                ms(r.commit.quantile(0.99)),
                ms(r.after_ack.quantile(0.5)),
                ms(r.after_ack.quantile(0.99)),
            );
        }
        drop(cluster);
        Ok(())
    })
}

/// How the watches reach the server.
#[derive(Clone, Copy)]
pub(crate) enum Transport {
    Http1,
    Http2 { connections: usize },
}

fn watch_path(from: i64) -> String {
    format!("/api/v1/namespaces/default/pods?watch=1&resourceVersion={from}&timeoutSeconds=3600")
}

/// A watch's event lines as they arrive.
enum Watch {
    /// The raw socket after the response head: chunk-size lines come through too.
    Http1(BufReader<tokio::net::TcpStream>),
    Http2 {
        body: hyper::body::Incoming,
        buffer: Vec<u8>,
    },
}

impl Watch {
    /// The next line into `line` (cleared first); false at the end of the stream.
    async fn line(&mut self, line: &mut Vec<u8>) -> Result<bool> {
        line.clear();
        match self {
            Watch::Http1(reader) => Ok(reader.read_until(b'\n', line).await? > 0),
            Watch::Http2 { body, buffer } => loop {
                if let Some(end) = buffer.iter().position(|b| *b == b'\n') {
                    line.extend(buffer.drain(..=end));
                    return Ok(true);
                }
                let Some(frame) = body.frame().await else { return Ok(false) };
                if let Ok(data) = frame?.into_data() {
                    buffer.extend_from_slice(&data);
                }
            },
        }
    }
}

/// Opens `watchers` watches over HTTP/2, `per_connection` on each connection.
async fn open_http2(server: SocketAddr, watchers: usize, connections: usize, from: i64) -> Result<Vec<Watch>> {
    let mut watches = Vec::with_capacity(watchers);
    let per_connection = watchers.div_ceil(connections.max(1));
    for c in 0..connections {
        let source = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1 + (c % SOURCES as usize) as u8));
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.bind(SocketAddr::new(source, 0))?;
        let stream = socket.connect(server).await?;
        stream.set_nodelay(true)?;
        let (sender, connection) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(stream),
        )
        .await?;
        tokio::spawn(connection);
        for _ in 0..per_connection.min(watchers - watches.len()) {
            let request = hyper::Request::get(format!("http://{server}{}", watch_path(from)))
                .header("authorization", format!("Bearer {}", crate::procs::READ_TOKEN))
                .body(http_body_util::Empty::<bytes::Bytes>::new())?;
            let response = sender.clone().send_request(request).await?;
            if response.status() != hyper::StatusCode::OK {
                bail!("the watch was refused: {}", response.status());
            }
            watches.push(Watch::Http2 { body: response.into_body(), buffer: Vec::new() });
        }
    }
    Ok(watches)
}

/// Opens one watch from `source`; the reader after the response head.
async fn open(source: IpAddr, server: SocketAddr, from: i64) -> Result<BufReader<tokio::net::TcpStream>> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(source, 0))?;
    let mut stream = socket.connect(server).await?;
    let request = format!(
        "GET {} HTTP/1.1\r\nHost: {server}\r\nAuthorization: Bearer {}\r\n\r\n",
        watch_path(from),
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

/// `watchers` watches of the default namespace's Pods while Pods are created there at `rate`
/// for `duration`: each creation's delivery to each watch.
pub(crate) async fn run(
    server: SocketAddr,
    transport: Transport,
    watchers: usize,
    rate: u32,
    duration: Duration,
) -> Result<WatchResult> {
    let writes = (rate as f64 * duration.as_secs_f64()).round() as usize;
    let mut client = procs::store_client(load::connect(server).await?);
    let from = client.revision(pb::Empty {}).await?.into_inner().index as i64;
    // Each run creates its own Pods: name them past the previous run's.
    let first = from as usize;
    let readers = match transport {
        Transport::Http1 => {
            let mut readers = Vec::with_capacity(watchers);
            for i in 0..watchers {
                let source = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1 + (i % SOURCES as usize) as u8));
                readers.push(Watch::Http1(open(source, server, from).await.with_context(|| format!("watch {i}"))?));
            }
            readers
        }
        Transport::Http2 { connections } => open_http2(server, watchers, connections, from).await?,
    };
    let sent = Arc::new(SendTimes::new(writes));
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
                    if !reader.line(&mut line).await? {
                        break;
                    }
                    let now = sent.now();
                    // Chunk-size lines and trailers carry no name; an event is one chunk.
                    let Some(at) = find(&line, NAME_MARK.as_bytes()) else { continue };
                    let digits = &line[at + NAME_MARK.len()..];
                    let end = digits.iter().position(|b| !b.is_ascii_digit()).unwrap_or(digits.len());
                    let seq = std::str::from_utf8(&digits[..end]).ok().and_then(|s| s.parse::<usize>().ok());
                    let seq = seq.and_then(|s| s.checked_sub(first));
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
            sent.sent(seq);
            let json = format!(r#"[{{"Create":{}}}]"#, pod(first + seq)).into_bytes();
            let reply = client.txn(tonic::Request::new(pb::Payload { json, data: Vec::new() })).await;
            let committed =
                matches!(reply.map(|r| r.into_inner().outcome), Ok(Some(pb::txn_reply::Outcome::Committed(_))));
            if committed {
                sent.acked(seq);
            } else {
                errors.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for write in in_flight {
        let _ = write.await;
    }
    let mut received = Vec::with_capacity(writes * watchers);
    for receiver in receivers {
        let (pairs, error) = receiver.await.context("a watcher panicked")?;
        if let Some(e) = error {
            eprintln!("  a watcher failed: {e}");
        }
        received.extend(pairs);
    }
    Ok(sent.result(received, watchers, errors.load(Ordering::Relaxed)))
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}
