//! The Event settings of a replica (`--event-ttl`), and the tests of the Event writer and its
//! garbage pass against a real store (`gitplane_store::events`, which links no backend).

use std::time::Duration;

/// A Go duration as kube-apiserver's `--event-ttl` takes it: `1h`, `90s`, `1h30m`, `500ms`.
pub fn parse_ttl(text: &str) -> Result<Duration, String> {
    let bad = || format!("{text:?} is not a duration such as 1h, 30m, 90s or 1h30m");
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err(bad());
    }
    let mut total = Duration::ZERO;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
        let value: u64 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit()).unwrap_or(rest.len());
        let unit = match &rest[..unit_len] {
            "h" => Duration::from_secs(3600),
            "m" => Duration::from_secs(60),
            "s" => Duration::from_secs(1),
            "ms" => Duration::from_millis(1),
            _ => return Err(bad()),
        };
        total = unit
            .checked_mul(u32::try_from(value).map_err(|_| bad())?)
            .and_then(|d| total.checked_add(d))
            .ok_or_else(bad)?;
        rest = &rest[unit_len..];
    }
    if total.is_zero() {
        return Err(format!("{text:?}: an event TTL must be more than zero"));
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gitplane_api::events::{NORMAL, Source, WARNING, reference};
    use gitplane_storage::sqlite::SqliteStore;
    use gitplane_store::{
        Api, Store,
        events::{Recorder, collect_garbage},
    };
    use k8s_openapi::api::core::v1::{Event, Pod};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use k8s_openapi::jiff::Timestamp;
    use std::sync::Arc;

    #[test]
    fn ttls_read_as_go_durations() {
        assert_eq!(parse_ttl("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_ttl("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_ttl("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_ttl("1500ms"), Ok(Duration::from_millis(1500)));
        for bad in ["", "h", "5", "5d", "-1s", "0s", "1h 5m"] {
            assert!(parse_ttl(bad).is_err(), "{bad}");
        }
    }

    async fn store() -> Arc<dyn Store> {
        Arc::new(SqliteStore::memory().await.unwrap())
    }

    fn pod() -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("default".into()),
                uid: Some("u1".into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    async fn events_of(store: &Arc<dyn Store>, reason: &str, min_count: i32) -> Vec<Event> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let (events, _) = Api::<Event>::new(store.clone()).list(None).await.unwrap();
            let matching: Vec<Event> = events.into_iter().filter(|e| e.reason.as_deref() == Some(reason)).collect();
            if matching.iter().any(|e| e.count.unwrap_or(0) >= min_count) {
                return matching;
            }
            assert!(tokio::time::Instant::now() < deadline, "no {reason} event counted {min_count}: {matching:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    #[tokio::test]
    async fn repeats_are_one_event_written_once_per_flush() {
        let store = store().await;
        let before = store.revision().await.unwrap();
        let recorder = Recorder::spawn(store.clone(), Source::component("kubelet"));
        for _ in 0..20 {
            recorder.event(reference(&pod()), WARNING, "BackOff", "Back-off restarting failed container");
        }
        let events = events_of(&store, "BackOff", 20).await;
        assert_eq!(events.len(), 1, "{events:?}");
        assert!(store.revision().await.unwrap() - before <= 2, "twenty records, at most two writes");
        // A later repeat updates the same Event; a new writer (another process) adds to its count.
        let again = Recorder::spawn(store.clone(), Source::component("kubelet"));
        again.event(reference(&pod()), WARNING, "BackOff", "Back-off restarting failed container");
        let events = events_of(&store, "BackOff", 21).await;
        assert_eq!(events.len(), 1);
        let e = &events[0];
        assert_eq!(e.involved_object.uid.as_deref(), Some("u1"));
        assert!(e.first_timestamp < e.last_timestamp || e.count == Some(21));
    }

    #[tokio::test]
    async fn a_flood_from_one_object_is_cut_by_the_spam_filter() {
        let store = store().await;
        let recorder = Recorder::spawn(store.clone(), Source::component("kubelet"));
        for i in 0..200 {
            recorder.event(reference(&pod()), NORMAL, "Pulled", &format!("message {i}"));
        }
        // Distinct messages: nine Events on their own, then the combined one; 25 in all counted.
        let events = events_of(&store, "Pulled", 1).await;
        tokio::time::sleep(Duration::from_millis(1500)).await; // proves nothing more arrives
        let (events_later, _) = Api::<Event>::new(store.clone()).list(None).await.unwrap();
        assert!(events.len() <= 10 && events_later.len() <= 10, "{}", events_later.len());
        let counted: i32 = events_later.iter().map(|e| e.count.unwrap_or(0)).sum();
        assert_eq!(counted, 25, "client-go's burst");
    }

    #[tokio::test]
    async fn the_garbage_pass_deletes_what_outlived_its_ttl() {
        let store = store().await;
        let recorder = Recorder::spawn(store.clone(), Source::component("kubelet"));
        recorder.event(reference(&pod()), NORMAL, "Pulled", "image pulled");
        events_of(&store, "Pulled", 1).await;
        let ttl = Duration::from_secs(60);
        assert_eq!(collect_garbage(&*store, ttl, Timestamp::now()).await.unwrap(), 0, "young events stay");
        let later = Timestamp::now() + Duration::from_secs(61);
        assert_eq!(collect_garbage(&*store, ttl, later).await.unwrap(), 1);
        let (events, _) = Api::<Event>::new(store.clone()).list(None).await.unwrap();
        assert!(events.is_empty());
        // The writer still believes the Event exists: its next repeat creates it again.
        recorder.event(reference(&pod()), NORMAL, "Pulled", "image pulled");
        assert_eq!(events_of(&store, "Pulled", 2).await.len(), 1);
    }
}
