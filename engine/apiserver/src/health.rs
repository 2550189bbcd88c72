//! `/healthz`, `/livez` and `/readyz` as the API server answers them: `ok`, or with `?verbose`
//! one `[+]check ok` / `[-]check failed: reason` line per check and `readyz check passed`;
//! any failing check makes the answer 500 and lists every check. `/readyz/{check}` runs one,
//! `?exclude={check}` leaves one out. Open to anyone, as load balancers and probes call them.
//!
//! The checks say the truth about the replica: it is live while its store answers and Raft
//! runs; it is ready while, in addition, a leader is known (and, when it is this replica, a
//! quorum acknowledged it within its lease) and its store has applied what its log holds.

use axum::{
    Router,
    extract::{Path, RawQuery},
    http::StatusCode,
    response::{IntoResponse, Response},
    routing::get,
};
use futures::future::BoxFuture;
use std::{sync::Arc, time::Duration};

/// Log entries a replica may hold unapplied and still call its store caught up.
pub const MAX_UNAPPLIED: u64 = 1_000;
/// How long a check of the store may take before it counts as failed.
pub const CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// Gathers what the replica knows of itself, once per request: the replica's backend (Raft or
/// Postgres) knows how, the API server only answers.
pub type Observe = Arc<dyn Fn() -> BoxFuture<'static, ReplicaHealth> + Send + Sync>;

/// What a replica knows of itself, gathered for one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaHealth {
    /// The local store answered a read, or why not.
    pub store: Result<(), String>,
    /// The replication engine runs, or why it stopped.
    pub replication: Result<(), String>,
    /// A leader is known and, when it is this replica, holds its lease; or why not.
    pub leader: Result<(), String>,
    /// Log entries this replica holds but has not applied to its store.
    pub unapplied: u64,
}

/// The three endpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Healthz,
    Livez,
    Readyz,
}

impl Endpoint {
    fn name(self) -> &'static str {
        match self {
            Endpoint::Healthz => "healthz",
            Endpoint::Livez => "livez",
            Endpoint::Readyz => "readyz",
        }
    }

    /// The checks of this endpoint, in the order they print.
    fn checks(self) -> &'static [&'static str] {
        match self {
            // As in Kubernetes, healthz (deprecated) is what livez is.
            Endpoint::Healthz | Endpoint::Livez => &["ping", "store", "replication"],
            Endpoint::Readyz => &["ping", "store", "replication", "leader", "store-caught-up"],
        }
    }
}

/// The outcome of check `name`, or `None` for a check this module does not know.
pub fn check(name: &str, h: &ReplicaHealth) -> Option<Result<(), String>> {
    Some(match name {
        "ping" => Ok(()),
        "store" => h.store.clone(),
        "replication" => h.replication.clone(),
        "leader" => h.leader.clone(),
        "store-caught-up" if h.unapplied > MAX_UNAPPLIED => {
            Err(format!("{} log entries are not applied to the store yet", h.unapplied))
        }
        "store-caught-up" => Ok(()),
        _ => return None,
    })
}

/// The answer of `endpoint` with the raw query string `query` (`verbose`, `exclude=…`).
pub fn answer(endpoint: Endpoint, query: Option<&str>, h: &ReplicaHealth) -> (StatusCode, String) {
    let params: Vec<(&str, &str)> = query
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| p.split_once('=').unwrap_or((p, "")))
        .collect();
    let verbose = params.iter().any(|(k, v)| *k == "verbose" && *v != "false" && *v != "0");
    let excluded: Vec<&str> = params.iter().filter(|(k, _)| *k == "exclude").map(|(_, v)| *v).collect();
    let mut lines = String::new();
    let mut failed = false;
    for name in endpoint.checks() {
        if excluded.contains(name) {
            lines.push_str(&format!("[+]{name} excluded: ok\n"));
            continue;
        }
        match check(name, h).unwrap_or(Ok(())) {
            Ok(()) => lines.push_str(&format!("[+]{name} ok\n")),
            Err(reason) => {
                failed = true;
                lines.push_str(&format!("[-]{name} failed: {reason}\n"));
            }
        }
    }
    if failed {
        lines.push_str(&format!("{} check failed\n", endpoint.name()));
        return (StatusCode::INTERNAL_SERVER_ERROR, lines);
    }
    if verbose {
        lines.push_str(&format!("{} check passed\n", endpoint.name()));
        return (StatusCode::OK, lines);
    }
    (StatusCode::OK, "ok".to_owned())
}

/// `/{endpoint}/{check}`: one check alone.
pub fn answer_one(endpoint: Endpoint, name: &str, h: &ReplicaHealth) -> (StatusCode, String) {
    if !endpoint.checks().contains(&name) {
        return (StatusCode::NOT_FOUND, format!("{} has no check {name:?}\n", endpoint.name()));
    }
    match check(name, h) {
        Some(Err(reason)) => (StatusCode::INTERNAL_SERVER_ERROR, format!("internal server error: {reason}\n")),
        _ => (StatusCode::OK, "ok".to_owned()),
    }
}

fn respond((code, body): (StatusCode, String)) -> Response {
    let mut response = (code, body).into_response();
    response
        .headers_mut()
        .insert(axum::http::header::CONTENT_TYPE, axum::http::HeaderValue::from_static("text/plain; charset=utf-8"));
    response.headers_mut().insert(axum::http::header::CACHE_CONTROL, axum::http::HeaderValue::from_static("no-cache"));
    response
}

/// The health endpoints of a replica whose state `observe` gathers.
pub fn router(observe: Observe) -> Router {
    let mut router = Router::new();
    for endpoint in [Endpoint::Healthz, Endpoint::Livez, Endpoint::Readyz] {
        let (all, one) = (observe.clone(), observe.clone());
        router = router
            .route(
                &format!("/{}", endpoint.name()),
                get(move |RawQuery(query): RawQuery| async move {
                    respond(answer(endpoint, query.as_deref(), &all().await))
                }),
            )
            .route(
                &format!("/{}/{{check}}", endpoint.name()),
                get(move |Path(name): Path<String>| async move { respond(answer_one(endpoint, &name, &one().await)) }),
            );
    }
    router
}

#[cfg(test)]
mod tests {
    use super::*;

    fn healthy() -> ReplicaHealth {
        ReplicaHealth { store: Ok(()), replication: Ok(()), leader: Ok(()), unapplied: 0 }
    }

    #[test]
    fn healthy_replicas_answer_ok_and_list_checks_when_verbose() {
        assert_eq!(answer(Endpoint::Readyz, None, &healthy()), (StatusCode::OK, "ok".into()));
        let (code, body) = answer(Endpoint::Readyz, Some("verbose"), &healthy());
        assert_eq!(code, StatusCode::OK);
        assert_eq!(
            body,
            "[+]ping ok\n[+]store ok\n[+]replication ok\n[+]leader ok\n[+]store-caught-up ok\nreadyz check passed\n"
        );
        let (_, body) = answer(Endpoint::Livez, Some("verbose=true"), &healthy());
        assert!(body.ends_with("[+]replication ok\nlivez check passed\n"), "{body}");
    }

    #[test]
    fn readyz_fails_without_a_leader_or_while_behind_and_names_the_check() {
        let leaderless = ReplicaHealth { leader: Err("no leader is known in term 4".into()), ..healthy() };
        let (code, body) = answer(Endpoint::Readyz, None, &leaderless);
        assert_eq!(code, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(body.contains("[-]leader failed: no leader is known in term 4\n"), "{body}");
        assert!(body.ends_with("readyz check failed\n"));
        // Liveness does not depend on a leader: restarting the replica would not bring one.
        assert_eq!(answer(Endpoint::Livez, None, &leaderless).0, StatusCode::OK);
        assert_eq!(answer_one(Endpoint::Readyz, "leader", &leaderless).0, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(answer_one(Endpoint::Readyz, "ping", &leaderless), (StatusCode::OK, "ok".into()));
        let (code, body) = answer(Endpoint::Readyz, Some("verbose&exclude=leader"), &leaderless);
        assert_eq!(code, StatusCode::OK, "{body}");
        assert!(body.contains("[+]leader excluded: ok"));

        let behind = ReplicaHealth { unapplied: MAX_UNAPPLIED + 1, ..healthy() };
        let (code, body) = answer(Endpoint::Readyz, Some("verbose"), &behind);
        assert_eq!(code, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(body.contains("[-]store-caught-up failed: 1001 log entries"), "{body}");
        assert_eq!(
            answer(Endpoint::Readyz, None, &ReplicaHealth { unapplied: MAX_UNAPPLIED, ..healthy() }).0,
            StatusCode::OK
        );

        let broken = ReplicaHealth { store: Err("database is locked".into()), ..healthy() };
        assert_eq!(answer(Endpoint::Livez, None, &broken).0, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(answer(Endpoint::Healthz, None, &broken).0, StatusCode::INTERNAL_SERVER_ERROR);
    }

    #[test]
    fn unknown_checks_are_not_found() {
        assert_eq!(answer_one(Endpoint::Livez, "leader", &healthy()).0, StatusCode::NOT_FOUND);
        assert_eq!(answer_one(Endpoint::Readyz, "etcd", &healthy()).0, StatusCode::NOT_FOUND);
    }
}
