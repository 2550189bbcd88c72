//! Watch fan-out: many watchers of ConfigMaps on one replica, one writer creating 1 KiB
//! ConfigMaps at a fixed rate (open loop: a slow write does not slow the next one). For every
//! (write, watcher) pair: the time from the write being sent to that watcher receiving its event,
//! and apart from it the write's own commit (sent to acknowledged) and the delivery after the
//! acknowledgement (zero when the event came first): the fan-out's share.

use crate::{
    etcd::pb as etcdpb,
    load::{self, Api, Latencies, Writer},
};
use anyhow::{Context as _, Result, bail};
use futures::StreamExt as _;
use gitplane_storage::remote::pb;
use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};
use tonic::transport::Channel;

pub struct WatchResult {
    pub delivery: Latencies,
    /// Each write, sent to acknowledged.
    pub commit: Latencies,
    /// Each delivery after its write was acknowledged (zero when the event came first).
    pub after_ack: Latencies,
    /// Writes times watchers.
    pub expected: u64,
    pub write_errors: u64,
}

const NAME_PREFIX: &str = "watch-";

/// Send and acknowledgement times of each write: nanoseconds since `base` plus one (0: not yet).
pub struct SendTimes {
    base: Instant,
    sent: Vec<AtomicU64>,
    acked: Vec<AtomicU64>,
}

impl SendTimes {
    pub fn new(writes: usize) -> SendTimes {
        let slots = || (0..writes).map(|_| AtomicU64::new(0)).collect();
        SendTimes { base: Instant::now(), sent: slots(), acked: slots() }
    }

    pub fn now(&self) -> u64 {
        self.base.elapsed().as_nanos() as u64 + 1
    }

    pub fn sent(&self, seq: usize) {
        self.sent[seq].store(self.now(), Ordering::SeqCst);
    }

    pub fn acked(&self, seq: usize) {
        self.acked[seq].store(self.now(), Ordering::SeqCst);
    }

    /// The write a received name stands for, if it was sent.
    fn seq(&self, name: &str) -> Option<usize> {
        let seq: usize = name.strip_prefix(NAME_PREFIX)?.parse().ok()?;
        (self.sent.get(seq)?.load(Ordering::SeqCst) != 0).then_some(seq)
    }

    fn between(from: u64, to: u64) -> Duration {
        Duration::from_nanos(to.saturating_sub(from))
    }

    /// The figures from every watcher's (write, when it was read) pairs.
    pub fn result(&self, received: Vec<(usize, u64)>, watchers: usize, write_errors: u64) -> WatchResult {
        let (mut delivery, mut after_ack) = (Vec::with_capacity(received.len()), Vec::with_capacity(received.len()));
        for (seq, at) in received {
            delivery.push(SendTimes::between(self.sent[seq].load(Ordering::SeqCst), at));
            let acked = self.acked[seq].load(Ordering::SeqCst);
            if acked != 0 {
                after_ack.push(SendTimes::between(acked, at));
            }
        }
        let commit = (0..self.sent.len())
            .filter_map(|seq| {
                let (sent, acked) = (self.sent[seq].load(Ordering::SeqCst), self.acked[seq].load(Ordering::SeqCst));
                (acked != 0).then(|| SendTimes::between(sent, acked))
            })
            .collect();
        WatchResult {
            delivery: Latencies::new(delivery),
            commit: Latencies::new(commit),
            after_ack: Latencies::new(after_ack),
            expected: (self.sent.len() * watchers) as u64,
            write_errors,
        }
    }
}

/// An open watch stream, yielding the names of the ConfigMaps it reports.
enum Stream {
    Gitplane(tonic::Streaming<pb::WatchEvent>),
    Etcd(tonic::Streaming<etcdpb::WatchResponse>),
}

impl Stream {
    async fn open(api: Api, channel: Channel) -> Result<Stream> {
        match api {
            Api::Gitplane => {
                let mut client = crate::procs::store_client(channel);
                // From the replica's latest revision: only what is written from now on.
                let from = client.revision(pb::Empty {}).await?.into_inner().index as i64;
                let request = pb::WatchRequest {
                    from_revision: from,
                    kinds: vec!["ConfigMap".into()],
                    bookmarks: false,
                    ..Default::default()
                };
                Ok(Stream::Gitplane(client.watch(request).await?.into_inner()))
            }
            Api::Etcd => {
                let mut client = etcdpb::watch_client::WatchClient::new(channel);
                let prefix = load::etcd_key("");
                let mut range_end = prefix.clone().into_bytes();
                if let Some(last) = range_end.last_mut() {
                    *last += 1;
                }
                let create = etcdpb::WatchRequest {
                    request_union: Some(etcdpb::watch_request::RequestUnion::CreateRequest(
                        etcdpb::WatchCreateRequest { key: prefix.into_bytes(), range_end, start_revision: 0 },
                    )),
                };
                // The request side stays open: closing it would end the watch.
                let requests = futures::stream::iter([create]).chain(futures::stream::pending());
                let mut responses = client.watch(requests).await?.into_inner();
                let first = responses.message().await?.context("the watch stream ended")?;
                if !first.created {
                    bail!("etcd did not create the watch: {}", first.cancel_reason);
                }
                Ok(Stream::Etcd(responses))
            }
        }
    }

    /// The names in the next message; `None` at the end of the stream.
    async fn next(&mut self) -> Result<Option<Vec<String>>> {
        match self {
            Stream::Gitplane(s) => Ok(s.message().await?.map(|e| vec![e.name])),
            Stream::Etcd(s) => Ok(s.message().await?.map(|r| {
                let prefix = load::etcd_key("");
                r.events
                    .into_iter()
                    .filter_map(|e| {
                        let key = String::from_utf8(e.kv?.key).ok()?;
                        key.strip_prefix(&prefix).map(str::to_owned)
                    })
                    .collect()
            })),
        }
    }
}

pub async fn run(
    api: Api,
    write_to: SocketAddr,
    watch_on: SocketAddr,
    watchers: usize,
    connections: usize,
    rate: u32,
    duration: Duration,
) -> Result<WatchResult> {
    let writes = (rate as f64 * duration.as_secs_f64()).round() as usize;
    let channels = load::connections(&[watch_on], connections).await?;
    let mut streams = Vec::with_capacity(watchers);
    for i in 0..watchers {
        streams.push(Stream::open(api, channels[i % channels.len()].clone()).await?);
    }
    let times = Arc::new(SendTimes::new(writes));
    let done = Instant::now() + Duration::from_secs(1) + duration + Duration::from_secs(10);
    let mut receivers = Vec::with_capacity(watchers);
    for mut stream in streams {
        let times = times.clone();
        receivers.push(tokio::spawn(async move {
            // (write, when received)
            let mut received = Vec::with_capacity(writes);
            let receive = async {
                while received.len() < writes {
                    let Some(names) = stream.next().await? else { break };
                    let now = times.now();
                    received.extend(names.iter().filter_map(|n| Some((times.seq(n)?, now))));
                }
                anyhow::Ok(())
            };
            let outcome = tokio::time::timeout_at(done.into(), receive).await;
            (received, outcome.ok().and_then(Result::err).map(|e| e.to_string()))
        }));
    }
    // Watches settle before the first write.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let writer = Writer::new(api, load::connect(write_to).await?);
    let errors = Arc::new(AtomicU64::new(0));
    let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
    let mut in_flight = Vec::with_capacity(writes);
    for seq in 0..writes {
        ticks.tick().await;
        let (times, errors, mut writer) = (times.clone(), errors.clone(), writer.clone());
        in_flight.push(tokio::spawn(async move {
            times.sent(seq);
            if writer.create(&format!("{NAME_PREFIX}{seq}")).await.is_err() {
                errors.fetch_add(1, Ordering::Relaxed);
            } else {
                times.acked(seq);
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
    Ok(times.result(received, watchers, errors.load(Ordering::Relaxed)))
}
