//! The kubelet's token manager: the ServiceAccount tokens of this node's Pods, asked of the
//! control plane (`RequestServiceAccountToken`) and kept until 80% of their life has passed,
//! then asked for again while the old one is still served, so a projected token file is
//! replaced before it expires. The volume code reads them synchronously ([`TokenManager::get`]);
//! a fetch runs in the background and wakes the Pod's worker when it lands, and again when the
//! token it brought is due. A Pod's worker first waits for its tokens ([`TokenManager::wait_for`]),
//! as the kubelet's projected volume asks for its token while it sets the volume up, so a normal
//! start never finds its volume waiting for a token.

use crate::controlplane::Servers;
use gitplane_proto::node::ServiceAccountTokenRequest;
use k8s_openapi::api::core::v1::Pod;
use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
    time::{SystemTime, UNIX_EPOCH},
};

/// What one token is for: the Pod's uid, its ServiceAccount, the audience, the life asked for.
type Key = (String, String, String, i64);

#[derive(Clone, Debug, Default)]
struct Entry {
    token: Option<String>,
    issued: i64,
    expires: i64,
    fetching: bool,
    /// The last refusal, said while no token is held.
    error: Option<String>,
}

/// Whether a token issued at `issued` and expiring at `expires` is due for renewal at `now`:
/// past 80% of its life, as the kubelet renews.
pub fn needs_refresh(issued: i64, expires: i64, now: i64) -> bool {
    now >= issued + (expires - issued) * 4 / 5
}

/// Wakes a Pod's worker by uid.
pub type Wake = Arc<dyn Fn(&str) + Send + Sync>;

pub struct TokenManager {
    servers: Servers,
    entries: Arc<Mutex<HashMap<Key, Entry>>>,
    wake: Wake,
    /// Bumped whenever a fetch ends, with a token or a refusal.
    landed: Arc<tokio::sync::watch::Sender<u64>>,
}

/// Why a Pod has no token yet.
enum Missing {
    /// A fetch is under way.
    Waiting(String),
    /// The control plane refused the last one.
    Refused(String),
}

/// The (audience, expirationSeconds) of every ServiceAccount token `pod`'s projected volumes hold.
pub fn projected_tokens(pod: &Pod) -> Vec<(String, i64)> {
    let volumes = pod.spec.iter().flat_map(|s| s.volumes.iter().flatten());
    let sources = volumes.filter_map(|v| v.projected.as_ref()).flat_map(|p| p.sources.iter().flatten());
    sources
        .filter_map(|s| s.service_account_token.as_ref())
        .map(|t| (t.audience.clone().unwrap_or_default(), t.expiration_seconds.unwrap_or(3607)))
        .collect()
}

fn now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

impl TokenManager {
    pub(crate) fn new(servers: Servers, wake: Wake) -> TokenManager {
        TokenManager { servers, entries: Arc::default(), wake, landed: Arc::new(tokio::sync::watch::channel(0).0) }
    }

    /// Asks for every token `pod`'s projected volumes hold and waits, at most `timeout`, until
    /// each is here or refused.
    pub async fn wait_for(&self, pod: &Pod, timeout: std::time::Duration) {
        let tokens = projected_tokens(pod);
        if tokens.is_empty() {
            return;
        }
        let mut landed = self.landed.subscribe();
        let all_answered = async {
            loop {
                let pending = tokens.iter().any(|(audience, expiration)| {
                    matches!(self.lookup(pod, audience, *expiration), Err(Missing::Waiting(_)))
                });
                if !pending || landed.changed().await.is_err() {
                    return;
                }
            }
        };
        if tokio::time::timeout(timeout, all_answered).await.is_err() {
            tracing::warn!(pod = ?pod.metadata.name, "the Pod's ServiceAccount token did not arrive in time");
        }
    }

    /// The token of `pod`'s ServiceAccount for `audience` (empty: the API server), or why there
    /// is none yet. Starts a fetch when none is held or the held one is due.
    pub fn get(&self, pod: &Pod, audience: &str, expiration_seconds: i64) -> Result<String, String> {
        self.lookup(pod, audience, expiration_seconds).map_err(|(Missing::Waiting(m) | Missing::Refused(m))| m)
    }

    fn lookup(&self, pod: &Pod, audience: &str, expiration_seconds: i64) -> Result<String, Missing> {
        let namespace = pod.metadata.namespace.clone().unwrap_or_else(|| "default".into());
        let name = pod.metadata.name.clone().unwrap_or_default();
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let account = pod
            .spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone())
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "default".into());
        let key: Key = (uid.clone(), account.clone(), audience.to_owned(), expiration_seconds);
        let now = now();
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        // Tokens of Pods gone for a while go with them.
        entries.retain(|_, e| e.fetching || e.token.is_none() || e.expires > now - 60);
        let entry = entries.entry(key.clone()).or_default();
        let held = entry.token.clone().filter(|_| entry.expires > now);
        let due = held.is_none() || needs_refresh(entry.issued, entry.expires, now);
        if due && !entry.fetching {
            entry.fetching = true;
            let request = ServiceAccountTokenRequest {
                namespace: namespace.clone(),
                pod_name: name.clone(),
                pod_uid: uid.clone(),
                service_account: account.clone(),
                audiences: if audience.is_empty() { Vec::new() } else { vec![audience.to_owned()] },
                expiration_seconds,
            };
            let (servers, entries, wake) = (self.servers.clone(), self.entries.clone(), self.wake.clone());
            let landed = self.landed.clone();
            let (pod, account) = (format!("{namespace}/{name}"), account.clone());
            tokio::spawn(async move {
                let result = fetch(&servers, request).await;
                {
                    let mut entries = entries.lock().unwrap_or_else(PoisonError::into_inner);
                    let entry = entries.entry(key).or_default();
                    entry.fetching = false;
                    match result {
                        Ok((token, issued, expires)) => {
                            tracing::info!(%pod, %account, expires, "service account token");
                            *entry = Entry { token: Some(token), issued, expires, fetching: false, error: None };
                            // The Pod's worker is woken when the token is due, to write the next.
                            let due = issued + (expires - issued) * 4 / 5 - self::now();
                            let (wake, uid) = (wake.clone(), uid.clone());
                            tokio::spawn(async move {
                                let due = std::time::Duration::from_secs(u64::try_from(due).unwrap_or(0));
                                tokio::time::sleep(due).await;
                                wake(&uid);
                            });
                        }
                        Err(message) => {
                            tracing::warn!(%pod, %account, error = %message,
                                "requesting the service account token failed");
                            entry.error = Some(message);
                        }
                    }
                }
                landed.send_modify(|n| *n += 1);
                wake(&uid);
            });
        }
        held.ok_or_else(|| match &entry.error {
            Some(error) if !entry.fetching => {
                Missing::Refused(format!("requesting the token of ServiceAccount {namespace}/{account}: {error}"))
            }
            _ => Missing::Waiting(format!("waiting for the token of ServiceAccount {namespace}/{account}")),
        })
    }
}

async fn fetch(servers: &Servers, request: ServiceAccountTokenRequest) -> Result<(String, i64, i64), String> {
    let mut last = String::new();
    for _ in 0..2 {
        let (server, mut client) = servers.get();
        match client.request_service_account_token(request.clone()).await {
            Ok(answer) => {
                let answer = answer.into_inner();
                return Ok((answer.token, answer.issued_unix_seconds, answer.expiration_unix_seconds));
            }
            Err(status) => {
                last = status.message().to_owned();
                if matches!(
                    status.code(),
                    tonic::Code::PermissionDenied | tonic::Code::NotFound | tonic::Code::InvalidArgument
                ) {
                    break; // another replica answers the same
                }
                servers.failed(server);
            }
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_renewed_past_four_fifths_of_their_life() {
        let cases = [
            (1_000, 2_000, 1_000, false),
            (1_000, 2_000, 1_799, false),
            (1_000, 2_000, 1_800, true),
            (1_000, 2_000, 2_500, true),
            (0, 3_607, 2_885, true),
            (0, 3_607, 2_884, false),
        ];
        for (issued, expires, now, due) in cases {
            assert_eq!(needs_refresh(issued, expires, now), due, "issued {issued}, expires {expires}, now {now}");
        }
    }
}
