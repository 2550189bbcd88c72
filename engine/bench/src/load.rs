//! The load generator, the same for every system: a fixed number of HTTP/2 connections (tonic
//! channels), clients spread over them round-robin, each client issuing its next write when the
//! previous one is acknowledged (a closed loop). A write is a 1 KiB Kubernetes ConfigMap under a
//! name never used before: for gitplane a `Txn` of one `Op::Create`, for etcd a `Put` of the same
//! JSON under `/registry/configmaps/<namespace>/<name>` (as the Kubernetes API server lays keys).

use crate::etcd::pb as etcdpb;
use anyhow::{Context as _, Result};
use gitplane_storage::remote::pb;
use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};
use tonic::transport::Channel;

/// The bytes of a ConfigMap's `data` value.
pub const VALUE_BYTES: usize = 1024;
pub const NAMESPACE: &str = "bench";
/// How long one write may take before it counts as failed.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// The ConfigMap JSON of a write: what a GitOps sync would create.
pub fn config_map(name: &str) -> String {
    // Varied content: nothing on the way may win by compressing or deduplicating it.
    let filler: String = name.bytes().cycle().map(|b| (b'a' + b % 26) as char).take(VALUE_BYTES).collect();
    format!(
        r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"{name}","namespace":"{NAMESPACE}"}},"data":{{"payload":"{filler}"}}}}"#
    )
}

/// The etcd key the Kubernetes API server would store a ConfigMap under.
pub fn etcd_key(name: &str) -> String {
    format!("/registry/configmaps/{NAMESPACE}/{name}")
}

pub async fn connect(addr: SocketAddr) -> Result<Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
        .connect_timeout(Duration::from_secs(2))
        .tcp_nodelay(true)
        .connect()
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    Ok(channel)
}

/// `count` connections, round-robin over `addrs`.
pub async fn connections(addrs: &[SocketAddr], count: usize) -> Result<Vec<Channel>> {
    let mut channels = Vec::with_capacity(count);
    for i in 0..count {
        channels.push(connect(addrs[i % addrs.len()]).await?);
    }
    Ok(channels)
}

/// Which API the writes go through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    Gitplane,
    Etcd,
}

/// Writes over one connection.
#[derive(Clone)]
pub enum Writer {
    Gitplane(crate::procs::StoreClient),
    Etcd(etcdpb::kv_client::KvClient<Channel>),
}

impl Writer {
    pub fn new(api: Api, channel: Channel) -> Writer {
        match api {
            Api::Gitplane => Writer::Gitplane(crate::procs::store_client(channel)),
            Api::Etcd => Writer::Etcd(etcdpb::kv_client::KvClient::new(channel)),
        }
    }

    /// Creates the ConfigMap `name`; `Ok` once the system acknowledged it as committed.
    pub async fn create(&mut self, name: &str) -> Result<(), String> {
        let object = config_map(name);
        match self {
            Writer::Gitplane(client) => {
                // The JSON of `vec![Op::Create(object)]`, without a parse/serialize round trip.
                let json = format!(r#"[{{"Create":{object}}}]"#).into_bytes();
                let mut request = tonic::Request::new(pb::Payload { json, data: Vec::new() });
                request.set_timeout(WRITE_TIMEOUT);
                let reply = client.txn(request).await.map_err(|s| format!("{:?}: {}", s.code(), s.message()))?;
                match reply.into_inner().outcome {
                    Some(pb::txn_reply::Outcome::Committed(_)) => Ok(()),
                    Some(pb::txn_reply::Outcome::Rejected(r)) => {
                        Err(format!("rejected: {}", String::from_utf8_lossy(&r)))
                    }
                    None => Err("empty reply".into()),
                }
            }
            Writer::Etcd(client) => {
                let put = etcdpb::PutRequest {
                    key: etcd_key(name).into_bytes(),
                    value: object.into_bytes(),
                    ..Default::default()
                };
                let mut request = tonic::Request::new(put);
                request.set_timeout(WRITE_TIMEOUT);
                client.put(request).await.map_err(|s| format!("{:?}: {}", s.code(), s.message()))?;
                Ok(())
            }
        }
    }
}

/// A sorted sample of latencies.
#[derive(Clone, Debug, Default)]
pub struct Latencies(Vec<Duration>);

impl Latencies {
    pub fn new(mut samples: Vec<Duration>) -> Latencies {
        samples.sort_unstable();
        Latencies(samples)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The samples, sorted.
    pub fn samples(&self) -> &[Duration] {
        &self.0
    }

    /// The `q` quantile (nearest rank), `None` when empty.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        if self.0.is_empty() {
            return None;
        }
        let rank = ((q * self.0.len() as f64).ceil() as usize).clamp(1, self.0.len());
        Some(self.0[rank - 1])
    }

    pub fn max(&self) -> Option<Duration> {
        self.0.last().copied()
    }
}

/// The outcome of one closed-loop measurement.
#[derive(Debug)]
pub struct Measured {
    pub writes_per_second: f64,
    pub latencies: Latencies,
    pub errors: u64,
    pub first_error: Option<String>,
    /// CPU time of the servers during the window, per acknowledged write.
    pub server_cpu_per_write: Option<Duration>,
    /// CPU time of this load generator during the window, per acknowledged write.
    pub client_cpu_per_write: Option<Duration>,
}

/// One closed-loop client: `write` sends its next write and returns once it is acknowledged.
pub trait LoopClient: Send + 'static {
    fn write(&mut self) -> impl Future<Output = Result<(), String>> + Send;
}

/// A client creating ConfigMaps `<prefix>-<client>-<seq>`.
pub struct Creates {
    pub writer: Writer,
    pub name: String,
    pub seq: u64,
}

impl LoopClient for Creates {
    async fn write(&mut self) -> Result<(), String> {
        self.seq += 1;
        let name = format!("{}-{}", self.name, self.seq);
        self.writer.create(&name).await
    }
}

/// `clients` ConfigMap creators spread over `channels`, named after `prefix`.
pub fn creates(api: Api, channels: &[Channel], clients: usize, prefix: &str) -> Vec<Creates> {
    (0..clients)
        .map(|c| Creates {
            writer: Writer::new(api, channels[c % channels.len()].clone()),
            name: format!("{prefix}-{c}"),
            seq: 0,
        })
        .collect()
}

struct ClientResult {
    latencies: Vec<Duration>,
    errors: u64,
    first_error: Option<String>,
}

/// Runs the clients in a closed loop for `warmup`, then measures for `window`: every write
/// acknowledged inside the window counts, with its latency. The clients come back with it.
pub async fn closed_loop<C: LoopClient>(
    clients: Vec<C>,
    warmup: Duration,
    window: Duration,
    server_pids: &[u32],
) -> Result<(Measured, Vec<C>)> {
    let start = Instant::now();
    let window_start = start + warmup;
    let end = window_start + window;
    let mut tasks = Vec::with_capacity(clients.len());
    for mut client in clients {
        tasks.push(tokio::spawn(async move {
            let mut result = ClientResult { latencies: Vec::new(), errors: 0, first_error: None };
            loop {
                let sent = Instant::now();
                if sent >= end {
                    return (result, client);
                }
                let outcome = client.write().await;
                let acked = Instant::now();
                match outcome {
                    Ok(()) => {
                        if acked >= window_start && acked <= end {
                            result.latencies.push(acked - sent);
                        }
                    }
                    Err(e) => {
                        result.errors += 1;
                        result.first_error.get_or_insert(e);
                        // A failing system is not hammered in a tight loop.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
        }));
    }
    tokio::time::sleep_until(window_start.into()).await;
    let (server_before, client_before) = (crate::procs::cpu_time(server_pids), own_cpu());
    tokio::time::sleep_until(end.into()).await;
    let (server_after, client_after) = (crate::procs::cpu_time(server_pids), own_cpu());
    let mut latencies = Vec::new();
    let mut errors = 0;
    let mut first_error = None;
    let mut clients = Vec::with_capacity(tasks.len());
    for task in tasks {
        let (r, client) = task.await.context("a load client panicked")?;
        latencies.extend(r.latencies);
        errors += r.errors;
        first_error = first_error.or(r.first_error);
        clients.push(client);
    }
    let writes = latencies.len();
    let per_write = |d: Duration| (writes > 0).then(|| d / writes as u32);
    let measured = Measured {
        writes_per_second: writes as f64 / window.as_secs_f64(),
        latencies: Latencies::new(latencies),
        errors,
        first_error,
        server_cpu_per_write: per_write(server_after.saturating_sub(server_before)),
        client_cpu_per_write: per_write(client_after.saturating_sub(client_before)),
    };
    Ok((measured, clients))
}

/// CPU time (user + system) of this process so far.
pub fn own_cpu() -> Duration {
    // SAFETY: getrusage fills the struct we pass.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}
