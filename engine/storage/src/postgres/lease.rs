//! The leader lease and the write fence (see the module docs of `postgres` for the protocol).

use crate::db;
use gitplane_store::{Result, StoreError};
use sqlx::{PgConnection, PgPool};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Whom a fenced store writes as: a lease holder and the token it was granted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fence {
    pub holder: String,
    pub token: u64,
}

impl Fence {
    pub fn new(holder: impl Into<String>, token: u64) -> Self {
        Fence { holder: holder.into(), token }
    }
}

/// The lease row as the database sees it now.
#[derive(Clone, Debug, PartialEq)]
pub struct LeaseState {
    /// Empty when nobody ever held it or the last holder released it.
    pub holder: String,
    pub token: u64,
    /// Until the lease expires by the database's clock; `None` when it is free to take.
    pub expires_in: Option<Duration>,
}

/// One replica's handle on the leader lease: a unique `holder` name (one per process
/// incarnation, e.g. host name and a random suffix) and how long a grant or renewal lasts.
#[derive(Clone, Debug)]
pub struct LeaderLease {
    pool: PgPool,
    holder: String,
    ttl: Duration,
}

fn corrupt(what: &str) -> StoreError {
    StoreError::Corrupt { key: "leader lease".into(), source: serde::de::Error::custom(what) }
}

fn token(stored: i64) -> Result<u64> {
    u64::try_from(stored).map_err(|_| corrupt(&format!("negative lease token {stored}")))
}

impl LeaderLease {
    pub fn new(pool: PgPool, holder: impl Into<String>, ttl: Duration) -> Result<Self> {
        let holder = holder.into();
        if holder.is_empty() || holder.contains('\0') {
            return Err(StoreError::BadRequest(format!("invalid lease holder name {holder:?}")));
        }
        if ttl < Duration::from_millis(1) {
            return Err(StoreError::BadRequest(format!("a lease of {ttl:?} expires before it is granted")));
        }
        Ok(LeaderLease { pool, holder, ttl })
    }

    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// Takes the lease if it is free or expired: the new token, one more than any before.
    pub async fn try_acquire(&self) -> Result<Option<u64>> {
        let granted: Option<i64> = sqlx::query_scalar(
            "UPDATE leader SET holder = $1, token = token + 1, renewed_at = now(),
                 expires_at = now() + make_interval(secs => $2)
             WHERE id = 1 AND (holder = '' OR expires_at <= now())
             RETURNING token",
        )
        .bind(&self.holder)
        .bind(self.ttl.as_secs_f64())
        .fetch_optional(&self.pool)
        .await
        .map_err(db)?;
        granted.map(token).transpose()
    }

    /// Extends the lease held with `token`; `false` when another holder has it now.
    pub async fn renew(&self, token: u64) -> Result<bool> {
        let Ok(token) = i64::try_from(token) else { return Ok(false) };
        let renewed = sqlx::query(
            "UPDATE leader SET renewed_at = now(), expires_at = now() + make_interval(secs => $3)
             WHERE id = 1 AND holder = $1 AND token = $2",
        )
        .bind(&self.holder)
        .bind(token)
        .bind(self.ttl.as_secs_f64())
        .execute(&self.pool)
        .await
        .map_err(db)?;
        Ok(renewed.rows_affected() == 1)
    }

    /// Gives the lease up at once (if still held with `token`), so a successor need not wait for
    /// it to expire. Writes fenced with it are refused from now on.
    pub async fn release(&self, token: u64) -> Result<()> {
        let Ok(token) = i64::try_from(token) else { return Ok(()) };
        sqlx::query("UPDATE leader SET holder = '', expires_at = now() WHERE id = 1 AND holder = $1 AND token = $2")
            .bind(&self.holder)
            .bind(token)
            .execute(&self.pool)
            .await
            .map_err(db)?;
        Ok(())
    }

    /// Who holds the lease now.
    pub async fn state(pool: &PgPool) -> Result<LeaseState> {
        let row: Option<(String, i64, f64)> = sqlx::query_as(
            "SELECT holder, token, EXTRACT(EPOCH FROM GREATEST(expires_at, now()) - now())::float8
             FROM leader WHERE id = 1",
        )
        .fetch_optional(pool)
        .await
        .map_err(db)?;
        let (holder, stored, seconds) = row.ok_or_else(|| corrupt("the lease row is missing"))?;
        let expires_in = (seconds > 0.0 && !holder.is_empty())
            .then(|| Duration::try_from_secs_f64(seconds).unwrap_or(Duration::MAX));
        Ok(LeaseState { holder, token: token(stored)?, expires_in })
    }

    /// Campaigns for the lease until every receiver is dropped (then releases it): acquires it
    /// when free or expired, renews it every `renew_every` while held. The receiver holds the
    /// token while this process is the leader and `None` otherwise; it turns `None` when a
    /// renewal finds another holder, or when renewals fail until the lease would have expired
    /// (measured from before each renewal was sent, so this process steps down no later than
    /// the database lets another take over).
    pub fn campaign(
        pool: PgPool,
        holder: impl Into<String>,
        ttl: Duration,
        renew_every: Duration,
    ) -> Result<watch::Receiver<Option<u64>>> {
        let lease = LeaderLease::new(pool, holder, ttl)?;
        if renew_every.is_zero() || renew_every >= ttl {
            return Err(StoreError::BadRequest(format!(
                "renewing a lease of {ttl:?} every {renew_every:?} lets it expire: renew more often than it lasts"
            )));
        }
        let (tokens, receiver) = watch::channel(None);
        tokio::spawn(lease.run(renew_every, tokens));
        Ok(receiver)
    }

    async fn run(self, renew_every: Duration, tokens: watch::Sender<Option<u64>>) {
        // (token, when our hold lapses by our clock)
        let mut held: Option<(u64, Instant)> = None;
        loop {
            let started = Instant::now();
            held = match held {
                None => match tokio::time::timeout(self.ttl, self.try_acquire()).await {
                    Ok(Ok(Some(token))) => {
                        tracing::info!(holder = %self.holder, token, "acquired the leader lease");
                        tokens.send_replace(Some(token));
                        Some((token, started + self.ttl))
                    }
                    Ok(Ok(None)) => None,
                    Ok(Err(e)) => {
                        tracing::warn!(holder = %self.holder, error = %e, "campaigning for the leader lease failed");
                        None
                    }
                    Err(_) => None,
                },
                Some((token, deadline)) => {
                    let left = deadline.saturating_duration_since(started);
                    match tokio::time::timeout(left, self.renew(token)).await {
                        Ok(Ok(true)) => Some((token, started + self.ttl)),
                        Ok(Ok(false)) => {
                            tracing::warn!(holder = %self.holder, token, "lost the leader lease to another replica");
                            tokens.send_replace(None);
                            None
                        }
                        Ok(Err(e)) => {
                            tracing::warn!(holder = %self.holder, error = %e, "renewing the leader lease failed");
                            Some((token, deadline))
                        }
                        Err(_) => Some((token, deadline)),
                    }
                }
            };
            let wake = match held {
                Some((_, deadline)) => (started + renew_every).min(deadline),
                None => started + renew_every,
            };
            tokio::select! {
                _ = tokio::time::sleep_until(wake.into()) => {}
                _ = tokens.closed() => {
                    if let Some((token, _)) = held
                        && let Err(e) = self.release(token).await
                    {
                        tracing::warn!(holder = %self.holder, error = %e, "releasing the leader lease failed");
                    }
                    return;
                }
            }
            if let Some((token, deadline)) = held
                && Instant::now() >= deadline
            {
                tracing::warn!(holder = %self.holder, token, "the leader lease lapsed before it could be renewed");
                tokens.send_replace(None);
                held = None;
            }
        }
    }
}

/// The fence check, first in a write transaction: locks the lease row until the transaction
/// ends, so no takeover can commit between this check and the write.
pub(super) async fn check(conn: &mut PgConnection, fence: &Fence) -> Result<()> {
    let row: Option<(String, i64)> = sqlx::query_as("SELECT holder, token FROM leader WHERE id = 1 FOR UPDATE")
        .fetch_optional(conn)
        .await
        .map_err(db)?;
    let (current_holder, current) = row.ok_or_else(|| corrupt("the lease row is missing"))?;
    let current_token = token(current)?;
    if current_holder != fence.holder || current_token != fence.token {
        return Err(StoreError::Fenced {
            holder: fence.holder.clone(),
            token: fence.token,
            current_holder,
            current_token,
        });
    }
    Ok(())
}
