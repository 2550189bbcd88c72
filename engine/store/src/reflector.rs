//! client-go's `Reflector`: lists some kinds at one revision into a cache, then follows the
//! store's watch of them from there. A broken watch (a replica gone, a leader change) resumes
//! from the last revision applied, without a new list; only an expired revision lists again.

use crate::{Event, ListOptions, Revision, Store, StoreError, WatchOptions};
use futures::{FutureExt as _, StreamExt as _};
use serde_json::Value;
use std::{sync::Arc, time::Duration};
use tokio::sync::watch;

/// Where a reflector puts what it lists and watches.
pub trait Reflect: Send + 'static {
    /// A fresh list: every object of each kind, in the order the kinds were given, all at
    /// `revision`. What was held before is replaced.
    fn replace(&mut self, lists: Vec<(String, Vec<Value>)>, revision: Revision);
    /// The events that arrived together (usually a whole transaction), bookmarks included.
    fn apply(&mut self, events: Vec<Event>);
}

/// How long a failed watch waits before it resumes.
const RETRY: Duration = Duration::from_millis(200);

/// Lists and watches `kinds` into `target` until the store shuts down. `reached` is the revision
/// applied: 0 until the first list is in, then at least 1, and only moved once the events that
/// arrived together are applied, so a waiter never sees half a transaction.
pub async fn run(
    what: &'static str,
    store: Arc<dyn Store>,
    kinds: Vec<String>,
    mut target: impl Reflect,
    reached: watch::Sender<Revision>,
) {
    let mut resume = None;
    loop {
        match follow(&*store, &kinds, &mut target, &reached, &mut resume).await {
            Err(StoreError::Expired { .. }) => {
                tracing::info!(what, "watch expired, listing again");
                resume = None;
            }
            Err(e) => {
                tracing::warn!(what, error = %e, ?resume, "watch failed, resuming");
                tokio::time::sleep(RETRY).await;
            }
            Ok(()) => return, // the store has shut down
        }
    }
}

async fn follow(
    store: &dyn Store,
    kinds: &[String],
    target: &mut impl Reflect,
    reached: &watch::Sender<Revision>,
    resume: &mut Option<Revision>,
) -> Result<(), StoreError> {
    let from = match *resume {
        Some(from) => from,
        None => {
            let mut at = None;
            let mut lists = Vec::with_capacity(kinds.len());
            for kind in kinds {
                let list = store.list(kind, &ListOptions { at_revision: at, ..Default::default() }).await?;
                at = Some(list.revision);
                lists.push((kind.clone(), list.items));
            }
            let listed = at.unwrap_or(0);
            target.replace(lists, listed);
            reached.send_replace(listed.max(1));
            listed
        }
    };
    *resume = Some(from);
    let options = WatchOptions { kinds: Some(kinds.to_vec()), bookmarks: true, ..Default::default() };
    let mut events = store.watch(from, options).await?;
    while let Some(event) = events.next().await {
        let mut arrived = vec![event?];
        while let Some(Some(event)) = events.next().now_or_never() {
            arrived.push(event?);
        }
        let last = arrived.last().map_or(from, |e| e.revision);
        target.apply(arrived);
        *resume = Some(last);
        reached.send_if_modified(|r| {
            let advanced = last > *r;
            *r = (*r).max(last);
            advanced
        });
    }
    Ok(())
}
