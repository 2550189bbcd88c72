//! Failover under load: 16 closed-loop writers spread over every replica; the leader is killed
//! with SIGKILL; the time from the kill to the first acknowledgement of a write *sent after* the
//! kill is the failover time. Then the killed replica restarts, the load pauses until every
//! replica reports the same revision (caught up), and the next round starts.

use crate::{
    load::{self, Api, Latencies, Writer},
    procs::{Etcd, Gitplane},
};
use anyhow::{Context as _, Result, bail};
use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

/// A replicated system the failover benchmark can kill and restart members of.
pub(crate) trait Replicated {
    fn api(&self) -> Api;
    /// Every member's client address, by id.
    fn members(&self) -> Vec<(u64, SocketAddr)>;
    async fn leader(&self) -> Option<u64>;
    fn kill9(&mut self, id: u64) -> Result<()>;
    fn restart(&mut self, id: u64) -> Result<()>;
    async fn revisions(&self) -> Vec<Option<i64>>;
}

impl Replicated for Gitplane {
    fn api(&self) -> Api {
        Api::Gitplane
    }
    fn members(&self) -> Vec<(u64, SocketAddr)> {
        self.addrs.iter().map(|(id, a)| (*id, *a)).collect()
    }
    async fn leader(&self) -> Option<u64> {
        Gitplane::leader(self).await
    }
    fn kill9(&mut self, id: u64) -> Result<()> {
        Gitplane::kill9(self, id)
    }
    fn restart(&mut self, id: u64) -> Result<()> {
        Gitplane::restart(self, id)
    }
    async fn revisions(&self) -> Vec<Option<i64>> {
        Gitplane::revisions(self).await
    }
}

impl Replicated for Etcd {
    fn api(&self) -> Api {
        Api::Etcd
    }
    fn members(&self) -> Vec<(u64, SocketAddr)> {
        self.clients.iter().map(|(id, a)| (*id, *a)).collect()
    }
    async fn leader(&self) -> Option<u64> {
        Etcd::leader(self).await
    }
    fn kill9(&mut self, id: u64) -> Result<()> {
        Etcd::kill9(self, id)
    }
    fn restart(&mut self, id: u64) -> Result<()> {
        Etcd::restart(self, id)
    }
    async fn revisions(&self) -> Vec<Option<i64>> {
        Etcd::revisions(self).await
    }
}

pub struct FailoverResult {
    /// Kill to the first acknowledged write sent after it.
    pub failover: Latencies,
    /// Kill to a surviving member reporting itself leader (polled every 20 ms).
    pub election: Latencies,
    /// Restart of the killed member to every member at the same revision (load paused).
    pub catch_up: Latencies,
}

/// Shared between the main task and the writers: nanoseconds since `base`, 0 for "not yet".
struct Clock {
    base: Instant,
    paused: AtomicBool,
    stop: AtomicBool,
    kill: AtomicU64,
    first_ack_after_kill: AtomicU64,
    acks: AtomicU64,
}

impl Clock {
    fn now(&self) -> u64 {
        (self.base.elapsed().as_nanos() as u64).max(1)
    }
}

pub(crate) async fn run<C: Replicated>(
    cluster: &mut C,
    rounds: usize,
    clients: usize,
    connections: usize,
) -> Result<FailoverResult> {
    let members = cluster.members();
    // Per connection slot, one channel to every member: a writer whose member fails moves on.
    let mut channels = Vec::new();
    for (_, addr) in &members {
        channels.push(load::connections(&[*addr], connections.div_ceil(members.len())).await?);
    }
    let clock = Arc::new(Clock {
        base: Instant::now(),
        paused: AtomicBool::new(false),
        stop: AtomicBool::new(false),
        kill: AtomicU64::new(0),
        first_ack_after_kill: AtomicU64::new(0),
        acks: AtomicU64::new(0),
    });
    let api = cluster.api();
    let mut tasks = Vec::new();
    for client in 0..clients {
        let mut writers: Vec<Writer> =
            channels.iter().map(|per_member| Writer::new(api, per_member[client % per_member.len()].clone())).collect();
        let clock = clock.clone();
        tasks.push(tokio::spawn(async move {
            let mut current = client % writers.len();
            let mut seq = 0u64;
            while !clock.stop.load(Ordering::Relaxed) {
                if clock.paused.load(Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
                seq += 1;
                let sent = clock.now();
                match writers[current].create(&format!("failover-{client}-{seq}")).await {
                    Ok(()) => {
                        let acked = clock.now();
                        clock.acks.fetch_add(1, Ordering::Relaxed);
                        let kill = clock.kill.load(Ordering::SeqCst);
                        if kill != 0 && sent >= kill {
                            let _ = clock.first_ack_after_kill.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |f| {
                                (f == 0 || acked < f).then_some(acked)
                            });
                        }
                    }
                    Err(_) => {
                        current = (current + 1) % writers.len();
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
            }
        }));
    }
    let result = rounds_loop(cluster, &clock, rounds).await;
    clock.stop.store(true, Ordering::SeqCst);
    for task in tasks {
        // A writer stuck on a dead member gives up within the write timeout.
        let _ = tokio::time::timeout(Duration::from_secs(15), task).await;
    }
    result
}

async fn rounds_loop<C: Replicated>(cluster: &mut C, clock: &Clock, rounds: usize) -> Result<FailoverResult> {
    let (mut failover, mut election, mut catch_up) = (Vec::new(), Vec::new(), Vec::new());
    for round in 1..=rounds {
        // Steady state first: a leader, and writes flowing.
        let leader = crate::procs::wait_for("a leader", Duration::from_secs(30), || cluster.leader()).await?;
        let acks = clock.acks.load(Ordering::Relaxed);
        tokio::time::sleep(Duration::from_secs(1)).await;
        if clock.acks.load(Ordering::Relaxed) == acks {
            bail!("no write was acknowledged in the second before round {round}");
        }
        clock.first_ack_after_kill.store(0, Ordering::SeqCst);
        let killed_at = Instant::now();
        clock.kill.store(clock.now(), Ordering::SeqCst);
        cluster.kill9(leader)?;
        let mut elected = None;
        let deadline = killed_at + Duration::from_secs(30);
        let acked = loop {
            let first = clock.first_ack_after_kill.load(Ordering::SeqCst);
            if elected.is_none() && cluster.leader().await.is_some_and(|l| l != leader) {
                elected = Some(killed_at.elapsed());
            }
            if first != 0 {
                break Duration::from_nanos(first.saturating_sub(clock.kill.load(Ordering::SeqCst)));
            }
            if Instant::now() >= deadline {
                bail!("round {round}: no write sent after the kill was acknowledged within 30 s");
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        clock.kill.store(0, Ordering::SeqCst);
        failover.push(acked);
        election.extend(elected);
        // Catch up with the load paused, so "the same revision" is a fixed point.
        clock.paused.store(true, Ordering::SeqCst);
        cluster.restart(leader)?;
        let restarted = Instant::now();
        crate::procs::wait_for("every member at the same revision", Duration::from_secs(120), || async {
            let revisions = cluster.revisions().await;
            let first = revisions.first().copied().flatten()?;
            revisions.iter().all(|r| *r == Some(first)).then_some(())
        })
        .await
        .with_context(|| format!("round {round}: the restarted member did not catch up"))?;
        catch_up.push(restarted.elapsed());
        clock.paused.store(false, Ordering::SeqCst);
        eprintln!(
            "  round {round}: killed leader {leader}; first write acknowledged after {:.0} ms, new leader seen after {}, caught up in {:.0} ms",
            acked.as_secs_f64() * 1e3,
            elected.map_or("-".to_owned(), |e| format!("{:.0} ms", e.as_secs_f64() * 1e3)),
            restarted.elapsed().as_secs_f64() * 1e3,
        );
    }
    Ok(FailoverResult {
        failover: Latencies::new(failover),
        election: Latencies::new(election),
        catch_up: Latencies::new(catch_up),
    })
}
