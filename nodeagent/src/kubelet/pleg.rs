//! The kubelet's PLEG (pod lifecycle event generator): one relist of the runtime for the whole
//! node wakes the workers of the Pods whose sandboxes or containers changed.

use super::{pod_workers::Wakers, runtime::RuntimeManager};
use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, PoisonError},
    time::{Duration, Instant},
};
use tokio::sync::Notify;

/// How often the runtime is relisted (the kubelet's PLEG period).
pub const PLEG_PERIOD: Duration = Duration::from_secs(1);

/// The kubelet's PLEG: relists the runtime every [`PLEG_PERIOD`] and wakes the worker of every
/// Pod whose sandboxes or containers changed. A relist that fails has the runtime's health
/// checked at once (`check_runtime`), and so has the first one that works again, which also wakes
/// every worker, so Pods that could not start go on without waiting out their back-off.
pub(crate) async fn run(runtime: Arc<RuntimeManager>, wakers: Wakers, check_runtime: Arc<Notify>) {
    let mut seen: HashMap<String, u64> = HashMap::new();
    let mut tick = tokio::time::interval(PLEG_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_cleanup = Instant::now();
    let mut failing = false;
    loop {
        tick.tick().await;
        if last_cleanup.elapsed() >= ORPHAN_CLEANUP_PERIOD {
            last_cleanup = Instant::now();
            let keep: HashSet<String> = wakers.lock().unwrap_or_else(PoisonError::into_inner).keys().cloned().collect();
            match runtime.remove_orphaned_cgroups(&keep).await {
                Ok(removed) if !removed.is_empty() => tracing::info!(?removed, "removed orphaned pod cgroups"),
                Ok(_) => {}
                Err(error) => tracing::warn!(%error, "cleaning up orphaned pod cgroups failed"),
            }
        }
        let now = match runtime.relist().await {
            Ok(now) => now,
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "relisting the runtime failed");
                    failing = true;
                }
                check_runtime.notify_one();
                continue;
            }
        };
        {
            let wakers = wakers.lock().unwrap_or_else(PoisonError::into_inner);
            if std::mem::take(&mut failing) {
                tracing::info!("relisting the runtime works again");
                check_runtime.notify_one();
                wakers.values().for_each(|wake| wake.notify_one());
            }
            let changed = now.iter().filter(|(uid, print)| seen.get(*uid) != Some(print)).map(|(uid, _)| uid);
            let gone = seen.keys().filter(|uid| !now.contains_key(*uid));
            for uid in changed.chain(gone) {
                if let Some(wake) = wakers.get(uid) {
                    wake.notify_one();
                }
            }
        }
        seen = now;
    }
}

/// How often the relist also removes the cgroups of pods that are gone (the kubelet does it in
/// its housekeeping, every 2 s; cgroups left behind cost nothing but a directory).
const ORPHAN_CLEANUP_PERIOD: Duration = Duration::from_secs(30);
