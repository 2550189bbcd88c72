//! The one loop that feeds a reader of the network view ([`Consumer`]): wait for the first
//! list, read it whole, then read each batch of changes. A consumer that programs the kernel
//! syncs after each read on a blocking thread; changes that arrive during a sync are taken
//! together by the next one, and a failed sync is retried with back-off.
//!
//! The proxy, NetworkPolicy, cluster DNS and the Ingress routes follow the view this way. The
//! routes to other nodes do not: they also resync on a timer and put their masquerade back,
//! so `routes::PodNetwork::run` keeps a loop of its own.

use super::view::{Change, Network, View, next_changes};
use std::time::Duration;
use tokio::{sync::watch, time::Instant};

const RETRY_MIN: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// A reader of the network view.
pub trait Consumer: Send + 'static {
    /// Whether [`Consumer::sync`] has anything to do; consumers that keep their state in memory
    /// skip the blocking thread.
    const SYNCS: bool = false;
    /// Logged with the error when a sync fails.
    const NOT_SYNCED: &'static str = "";
    type Error: std::fmt::Display + Send;

    /// Reads the whole view: at the start and after a relist.
    fn relist(&mut self, view: &View);

    /// Reads one batch of changes from the view as it is now.
    fn apply(&mut self, view: &View, batch: &[Change]);

    /// Brings the kernel in step with what was read. Blocks: it runs on a blocking thread.
    fn sync(&mut self) -> Result<(), Self::Error> {
        Ok(())
    }
}

/// Feeds `consumer` from `network` until `shutdown` or the end of the view's changes; gives it
/// back (the proxy and policy remove their rules with it when the node leaves).
pub async fn run<C: Consumer>(mut consumer: C, network: &Network, mut shutdown: watch::Receiver<bool>) -> C {
    let mut changes = network.subscribe();
    tokio::select! {
        _ = shutdown.wait_for(|s| *s) => return consumer,
        _ = network.synced() => {}
    }
    consumer.relist(&network.view());
    let mut retry = RETRY_MIN;
    loop {
        let mut next_retry = None;
        if C::SYNCS {
            let (back, result) = tokio::task::spawn_blocking(move || {
                let result = consumer.sync();
                (consumer, result)
            })
            .await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
            consumer = back;
            match result {
                Ok(()) => retry = RETRY_MIN,
                Err(error) => {
                    tracing::warn!(%error, retry_in = ?retry, "{}", C::NOT_SYNCED);
                    next_retry = Some(Instant::now() + retry);
                    retry = (retry * 2).min(RETRY_MAX);
                }
            }
        }
        let batch = tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return consumer,
            _ = tokio::time::sleep_until(next_retry.unwrap_or_else(Instant::now)), if next_retry.is_some() => continue,
            batch = next_changes(&mut changes) => batch,
        };
        let Some(batch) = batch else { return consumer };
        consumer.apply(&network.view(), &batch);
    }
}
