//! `resourceVersion` and `resourceVersionMatch` on LIST, with Kubernetes' semantics
//! (api-concepts "Semantics for list"): which revision a list may be served from, the
//! combinations Kubernetes refuses, and waiting for a revision this replica has not reached.
//!
//! | resourceVersionMatch | limit / continue | unset | `"0"` | `"N"` |
//! |---|---|---|---|---|
//! | unset | no limit | most recent | any | not older than N |
//! | unset | limit, no continue | most recent | any | exactly N |
//! | unset | continue | the token's | the token's | 400 |
//! | `NotOlderThan` | no continue | 422 | any | not older than N |
//! | `Exact` | no continue | 422 | 422 | exactly N |
//! | either | continue | 422 | 422 | 422 |
//!
//! "Exactly N" is served at N if the store still holds it, else 410 Gone (compacted); a list
//! "not older than N" is served at the latest revision. A revision newer than this replica's
//! (a follower behind, or a client ahead) is waited for, up to [`FRESHNESS_WAIT`], then 504 with
//! Kubernetes' "Too large resource version", as kube-apiserver's watch cache answers.

use gitplane_store::{Revision, Store, StoreError};
use std::{collections::HashMap, time::Duration};

/// How long a list waits for the store to reach a requested revision (kube-apiserver: 3 s).
pub const FRESHNESS_WAIT: Duration = Duration::from_secs(3);

/// From which revision a list is served.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ListRevision {
    /// The latest (a consistent read): no `resourceVersion`.
    #[default]
    MostRecent,
    /// Whatever this replica has: `resourceVersion=0`.
    Any,
    /// The latest, once it is at least this.
    NotOlderThan(Revision),
    /// This one, or 410 Gone.
    Exact(Revision),
}

/// Why list parameters were refused.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// 400 BadRequest: a value that does not parse, or `continue` with a `resourceVersion`.
    BadRequest(String),
    /// 422 Invalid (`ListOptions.meta.k8s.io "" is invalid: ...`), as kube-apiserver's
    /// validation of list options answers.
    Invalid(String),
}

/// The revision a LIST (or, with `watch`, a WATCH, which only checks the match) is served from.
pub fn list_revision(params: &HashMap<String, String>, watch: bool) -> Result<ListRevision, Refusal> {
    let version = params.get("resourceVersion").map(String::as_str).filter(|v| !v.is_empty());
    let matching = params.get("resourceVersionMatch").map(String::as_str).filter(|m| !m.is_empty());
    let has = |name: &str| params.get(name).is_some_and(|v| !v.is_empty());
    let (limit, continuing) = (has("limit") && params.get("limit").is_some_and(|l| l != "0"), has("continue"));
    let invalid =
        |why: &str| Refusal::Invalid(format!("ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: {why}"));
    if let Some(m) = matching {
        if !matches!(m, "Exact" | "NotOlderThan") {
            return Err(invalid(&format!("Unsupported value: \"{m}\": supported values: \"Exact\", \"NotOlderThan\"")));
        }
        if watch {
            // A watch takes a match only with sendInitialEvents (streaming lists), and then
            // only NotOlderThan, with or without a resourceVersion.
            if !has("sendInitialEvents") {
                return Err(invalid(
                    "Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
                ));
            }
            if m != "NotOlderThan" {
                return Err(invalid(
                    "Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                ));
            }
            return Ok(ListRevision::MostRecent); // the watch reads resourceVersion itself
        }
        if version.is_none() {
            return Err(invalid("Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided"));
        }
        if continuing {
            return Err(invalid("Forbidden: resourceVersionMatch is forbidden when continue is provided"));
        }
        if m == "Exact" && version == Some("0") {
            return Err(invalid("Forbidden: resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\""));
        }
    }
    if watch {
        return Ok(ListRevision::MostRecent); // the watch reads resourceVersion itself
    }
    let Some(version) = version else { return Ok(ListRevision::MostRecent) };
    if version == "0" {
        return Ok(ListRevision::Any);
    }
    let revision = version
        .parse::<Revision>()
        .ok()
        .filter(|r| *r > 0)
        .ok_or_else(|| Refusal::BadRequest(format!("resourceVersion {version:?} is not a positive integer")))?;
    if continuing {
        return Err(Refusal::BadRequest("specifying resource version is not allowed when using continue".into()));
    }
    Ok(match matching {
        Some("Exact") => ListRevision::Exact(revision),
        Some(_) => ListRevision::NotOlderThan(revision),
        None if limit => ListRevision::Exact(revision),
        None => ListRevision::NotOlderThan(revision),
    })
}

/// Why a revision could not be served.
#[derive(Debug)]
pub enum Unservable {
    /// 504: the store did not reach it in time.
    TooLarge {
        requested: Revision,
        current: Revision,
    },
    Store(StoreError),
}

/// Waits until `store` holds `revision` (at most [`FRESHNESS_WAIT`]).
pub async fn reach(store: &dyn Store, revision: Revision) -> Result<(), Unservable> {
    let deadline = tokio::time::Instant::now() + FRESHNESS_WAIT;
    loop {
        let current = store.revision().await.map_err(Unservable::Store)?;
        if current >= revision {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Unservable::TooLarge { requested: revision, current });
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

impl Refusal {
    pub fn response(self) -> axum::response::Response {
        use axum::http::StatusCode;
        match self {
            Refusal::BadRequest(message) => super::status(StatusCode::BAD_REQUEST, "BadRequest", message),
            Refusal::Invalid(message) => super::status(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", message),
        }
    }
}

impl Unservable {
    pub fn response(self) -> axum::response::Response {
        use axum::{Json, http::StatusCode, response::IntoResponse};
        match self {
            Unservable::TooLarge { requested, current } => {
                let message = format!("Too large resource version: {requested}, current: {current}");
                let mut body = super::status_body(StatusCode::GATEWAY_TIMEOUT, "Timeout", message);
                body["details"] = serde_json::json!({
                    "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
                    "retryAfterSeconds": 1,
                });
                (StatusCode::GATEWAY_TIMEOUT, Json(body)).into_response()
            }
            Unservable::Store(e) => super::status(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(query: &str, watch: bool) -> Result<ListRevision, Refusal> {
        let params = query
            .split('&')
            .filter(|p| !p.is_empty())
            .filter_map(|p| p.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        list_revision(&params, watch)
    }

    #[test]
    fn kubernetes_semantics_for_list() {
        use ListRevision::*;
        let ok = [
            ("", MostRecent),
            ("limit=5", MostRecent),
            ("resourceVersion=0", Any),
            ("resourceVersion=0&resourceVersionMatch=NotOlderThan", Any),
            ("resourceVersion=7", NotOlderThan(7)),
            ("resourceVersion=7&limit=0", NotOlderThan(7)),
            ("resourceVersion=7&limit=5", Exact(7)),
            ("resourceVersion=7&resourceVersionMatch=NotOlderThan&limit=5", NotOlderThan(7)),
            ("resourceVersion=7&resourceVersionMatch=Exact", Exact(7)),
            ("resourceVersion=0&continue=abc", Any),
            ("continue=abc", MostRecent),
        ];
        for (query, want) in ok {
            assert_eq!(parse(query, false), Ok(want), "{query}");
        }
        let invalid = [
            "resourceVersionMatch=Exact",
            "resourceVersionMatch=NotOlderThan",
            "resourceVersion=0&resourceVersionMatch=Exact",
            "resourceVersion=7&resourceVersionMatch=Exact&continue=abc",
            "resourceVersion=7&resourceVersionMatch=exact",
            "resourceVersion=7&resourceVersionMatch=Newest",
        ];
        for query in invalid {
            assert!(matches!(parse(query, false), Err(Refusal::Invalid(_))), "{query}: {:?}", parse(query, false));
        }
        for query in ["resourceVersion=abc", "resourceVersion=-3", "resourceVersion=7&continue=abc"] {
            assert!(matches!(parse(query, false), Err(Refusal::BadRequest(_))), "{query}");
        }
        assert!(matches!(parse("resourceVersion=7&resourceVersionMatch=Exact", true), Err(Refusal::Invalid(_))));
        assert_eq!(parse("resourceVersion=7", true), Ok(MostRecent));
        let streaming = "sendInitialEvents=true&resourceVersionMatch=NotOlderThan";
        assert_eq!(parse(streaming, true), Ok(MostRecent));
        assert!(matches!(parse("sendInitialEvents=true&resourceVersionMatch=Exact", true), Err(Refusal::Invalid(_))));
        let Err(Refusal::Invalid(message)) = parse("resourceVersionMatch=Exact", false) else { unreachable!() };
        assert_eq!(
            message,
            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: resourceVersionMatch is \
             forbidden unless resourceVersion is provided"
        );
    }

    #[tokio::test]
    async fn waits_for_a_revision_then_gives_up() {
        let store = gitplane_storage::sqlite::SqliteStore::memory().await.unwrap();
        let current = store.revision().await.unwrap();
        assert!(reach(&store, current).await.is_ok());
        match reach(&store, current + 100).await {
            Err(Unservable::TooLarge { requested, current: c }) => assert_eq!((requested, c), (current + 100, current)),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_list_is_served_at_the_revision_asked_or_refused_as_kubernetes_does() {
        use axum::{body::Body, http::StatusCode};
        use gitplane_store::Op;
        use std::sync::Arc;
        use tower::ServiceExt as _;
        let store = Arc::new(gitplane_storage::sqlite::SqliteStore::memory().await.unwrap());
        let config = |name: &str| serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "a"}});
        let first = store.txn(vec![Op::Create(config("one"))]).await.unwrap().revision;
        let second = store.txn(vec![Op::Create(config("two"))]).await.unwrap().revision;
        store.txn(vec![Op::Create(config("three"))]).await.unwrap();
        let router =
            super::super::router(store.clone(), "repo".into(), crate::kubelet_client::KubeletClient::for_tests());
        let call = |query: String| {
            let router = router.clone();
            async move {
                let uri = format!("/api/v1/namespaces/a/configmaps?{query}");
                let response =
                    router.oneshot(axum::http::Request::get(uri).body(Body::empty()).unwrap()).await.unwrap();
                let code = response.status();
                let bytes = axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap();
                (code, serde_json::from_slice::<serde_json::Value>(&bytes).unwrap())
            }
        };
        let names = |list: &serde_json::Value| list["items"].as_array().unwrap().len();

        let (code, exact) = call(format!("resourceVersion={second}&resourceVersionMatch=Exact")).await;
        assert_eq!((code, names(&exact)), (StatusCode::OK, 2), "{exact}");
        assert_eq!(exact["metadata"]["resourceVersion"], second.to_string());
        // Without a match, a limit makes it exact too (the legacy rule).
        let (code, paged) = call(format!("resourceVersion={first}&limit=10")).await;
        assert_eq!((code, names(&paged)), (StatusCode::OK, 1), "{paged}");
        let (code, newer) = call(format!("resourceVersion={first}&resourceVersionMatch=NotOlderThan")).await;
        assert_eq!((code, names(&newer)), (StatusCode::OK, 3), "{newer}");

        let (code, invalid) = call("resourceVersionMatch=Exact".into()).await;
        assert_eq!(
            (code, invalid["reason"].as_str()),
            (StatusCode::UNPROCESSABLE_ENTITY, Some("Invalid")),
            "{invalid}"
        );
        let (code, bad) = call("resourceVersion=x&resourceVersionMatch=Exact".into()).await;
        assert_eq!((code, bad["reason"].as_str()), (StatusCode::BAD_REQUEST, Some("BadRequest")), "{bad}");

        // Compacted: too old, 410.
        store.compact(second).await.unwrap();
        let (code, gone) = call(format!("resourceVersion={first}&resourceVersionMatch=Exact")).await;
        assert_eq!((code, gone["reason"].as_str()), (StatusCode::GONE, Some("Expired")), "{gone}");
        // Ahead of the store: waited for, then 504 with Kubernetes' cause.
        let (code, ahead) = call(format!("resourceVersion={}&resourceVersionMatch=NotOlderThan", second + 100)).await;
        assert_eq!(code, StatusCode::GATEWAY_TIMEOUT, "{ahead}");
        assert_eq!(ahead["details"]["causes"][0]["reason"], "ResourceVersionTooLarge");
    }
}
