//! Events as client-go's `record.EventRecorder` makes them, the pure part: what a component
//! reports ([`Record`]), client-go's `EventCorrelator` ([`Correlator`]: the spam filter, the
//! aggregation of similar events and the deduplication that counts repeats on one Event), and the
//! TTL decision of the garbage pass ([`expired`]). The writers (the store's `events::Recorder`,
//! the agent's batch to the node service) do the I/O.
//!
//! The Events are core/v1 (what `kubectl describe` reads), named after their deduplication key
//! (`<object>.<hash>`) rather than client-go's `<object>.<unix nanos>`: whichever replica or
//! process writes a repeat finds the Event it counts on under the same name.

use k8s_openapi::{
    Metadata, Resource,
    api::core::v1::{Event, EventSource, ObjectReference},
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time},
    jiff::Timestamp,
};
use std::{collections::HashMap, time::Duration};

pub const NORMAL: &str = "Normal";
pub const WARNING: &str = "Warning";

/// Longest message kept (events.k8s.io's note limit); longer ones are cut on a character boundary.
pub const MAX_MESSAGE_BYTES: usize = 1024;
/// Longest reason kept.
pub const MAX_REASON_BYTES: usize = 128;
/// How long an Event lives after its last occurrence (kube-apiserver's `--event-ttl`).
pub const DEFAULT_TTL: Duration = Duration::from_secs(3600);

/// Who reports: `source.component` (`default-scheduler`, `kubelet`, …) and, for a node's agent,
/// `source.host` (the node's name).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Source {
    pub component: String,
    pub host: String,
}

impl Source {
    pub fn component(component: &str) -> Source {
        Source { component: component.to_owned(), host: String::new() }
    }
}

/// One occurrence, as a component reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    pub source: Source,
    pub involved: ObjectReference,
    /// [`NORMAL`] or [`WARNING`].
    pub type_: String,
    pub reason: String,
    pub message: String,
    pub time: Timestamp,
}

impl Record {
    /// Cuts the reason and message to their limits.
    pub fn new(source: Source, involved: ObjectReference, type_: &str, reason: &str, message: &str) -> Record {
        Record {
            source,
            involved,
            type_: type_.to_owned(),
            reason: truncate(reason, MAX_REASON_BYTES).to_owned(),
            message: truncate(message, MAX_MESSAGE_BYTES).to_owned(),
            time: Timestamp::now(),
        }
    }
}

/// The reference an Event names its object by (kind, apiVersion, namespace, name, uid,
/// resourceVersion), as client-go's `reference.GetReference`.
pub fn reference<K: Resource + Metadata<Ty = ObjectMeta>>(object: &K) -> ObjectReference {
    let meta = object.metadata();
    ObjectReference {
        api_version: Some(K::API_VERSION.to_owned()),
        kind: Some(K::KIND.to_owned()),
        namespace: meta.namespace.clone(),
        name: meta.name.clone(),
        uid: meta.uid.clone(),
        resource_version: meta.resource_version.clone(),
        field_path: None,
    }
}

fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The Event's namespace: its object's, or `default` for a cluster-scoped object (a Node), as
/// the kubelet records them.
pub fn namespace_of(involved: &ObjectReference) -> &str {
    involved.namespace.as_deref().filter(|n| !n.is_empty()).unwrap_or("default")
}

/// client-go's `getSpamKey`: the source and the object.
fn spam_key(r: &Record) -> String {
    let i = &r.involved;
    [
        r.source.component.as_str(),
        &r.source.host,
        i.kind.as_deref().unwrap_or(""),
        i.namespace.as_deref().unwrap_or(""),
        i.name.as_deref().unwrap_or(""),
        i.uid.as_deref().unwrap_or(""),
        i.api_version.as_deref().unwrap_or(""),
    ]
    .join("\x1f")
}

/// client-go's `EventAggregatorByReasonFunc`: the spam key plus type and reason (the message
/// apart).
fn aggregate_key(r: &Record) -> String {
    format!("{}\x1f{}\x1f{}", spam_key(r), r.type_, r.reason)
}

/// client-go's `getEventKey`: everything but the time.
fn event_key(r: &Record) -> String {
    format!("{}\x1f{}", aggregate_key(r), r.message)
}

/// FNV-1a, 64 bits: a stable name suffix (no need to resist collisions made on purpose: a node
/// may only name its own objects, and a collision only merges two counts).
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

/// The Event's name for a deduplication key.
pub fn event_name(involved: &ObjectReference, key: &str) -> String {
    let object = truncate(involved.name.as_deref().unwrap_or("unknown"), 200);
    format!("{object}.{:016x}", fnv(key.as_bytes()))
}

/// The correlator's settings; the defaults are client-go's.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Events one object may burst before the spam filter limits it.
    pub burst: u32,
    /// Then one Event per this long (client-go: qps 1/300).
    pub refill: Duration,
    /// Distinct messages of one (object, type, reason) within `aggregate_window` after which they
    /// are combined into one Event.
    pub aggregate_after: usize,
    pub aggregate_window: Duration,
    /// Entries of each cache (client-go's LRU size).
    pub cache_entries: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            burst: 25,
            refill: Duration::from_secs(300),
            aggregate_after: 10,
            aggregate_window: Duration::from_secs(600),
            cache_entries: 4096,
        }
    }
}

/// What became of a [`Record`].
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Over the object's rate: dropped (client-go's spam filter).
    Dropped,
    /// The Event to write: `count` 1 for a first occurrence, else the repeat's count with its
    /// `firstTimestamp` kept. The Event is named by its key, so writing it replaces the last.
    Write(Box<Event>),
}

#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens: f64,
    at: Timestamp,
}

#[derive(Clone, Debug)]
struct Aggregate {
    messages: Vec<String>,
    first: Timestamp,
}

#[derive(Clone, Debug)]
struct Seen {
    count: i32,
    first: Timestamp,
    last: Timestamp,
}

/// client-go's `EventCorrelator`: filter, aggregate, count. Pure: time comes with each record.
#[derive(Debug, Default)]
pub struct Correlator {
    options: Options,
    buckets: HashMap<String, Bucket>,
    aggregates: HashMap<String, Aggregate>,
    seen: HashMap<String, Seen>,
}

impl Correlator {
    pub fn new(options: Options) -> Correlator {
        Correlator { options, ..Default::default() }
    }

    /// Whether the record's object may record one more Event now (takes a token if so).
    pub fn allow(&mut self, record: &Record) -> bool {
        let Options { burst, refill, cache_entries, .. } = self.options;
        let key = spam_key(record);
        let now = record.time;
        let bucket = self.buckets.entry(key).or_insert(Bucket { tokens: f64::from(burst), at: now });
        let elapsed = now.duration_since(bucket.at).as_secs_f64().max(0.0);
        bucket.tokens = (bucket.tokens + elapsed / refill.as_secs_f64()).min(f64::from(burst));
        bucket.at = now;
        let allowed = bucket.tokens >= 1.0;
        if allowed {
            bucket.tokens -= 1.0;
        }
        evict(&mut self.buckets, cache_entries, |b| b.at);
        allowed
    }

    /// The spam filter, then aggregation, then the count.
    pub fn observe(&mut self, record: &Record) -> Outcome {
        if !self.allow(record) {
            return Outcome::Dropped;
        }
        let (key, message) = self.aggregate(record);
        let cache_entries = self.options.cache_entries;
        let now = record.time;
        let seen = self
            .seen
            .entry(key.clone())
            .and_modify(|s| {
                s.count = s.count.saturating_add(1);
                s.last = now;
            })
            .or_insert(Seen { count: 1, first: now, last: now })
            .clone();
        evict(&mut self.seen, cache_entries, |s| s.last);
        Outcome::Write(Box::new(event(record, &key, message, seen.count, seen.first)))
    }

    /// client-go's `EventAggregate`: the key and message to count under. Once `aggregate_after`
    /// distinct messages of one (object, type, reason) came within the window, they count on
    /// one Event whose message is the latest, marked as combined.
    fn aggregate(&mut self, record: &Record) -> (String, String) {
        let Options { aggregate_after, aggregate_window, cache_entries, .. } = self.options;
        let key = aggregate_key(record);
        let now = record.time;
        let entry = self.aggregates.entry(key.clone()).or_insert(Aggregate { messages: Vec::new(), first: now });
        if now.duration_since(entry.first).as_secs_f64() > aggregate_window.as_secs_f64() {
            *entry = Aggregate { messages: Vec::new(), first: now };
        }
        if !entry.messages.contains(&record.message) {
            entry.messages.push(record.message.clone());
        }
        let combined = entry.messages.len() >= aggregate_after;
        evict(&mut self.aggregates, cache_entries, |a| a.first);
        if combined {
            let message = format!("(combined from similar events): {}", record.message);
            (key, truncate(&message, MAX_MESSAGE_BYTES).to_owned())
        } else {
            (event_key(record), record.message.clone())
        }
    }
}

/// Drops the stalest entry once a cache is over its size (rare: a scan is fine).
fn evict<V>(map: &mut HashMap<String, V>, max: usize, at: impl Fn(&V) -> Timestamp) {
    if map.len() <= max {
        return;
    }
    if let Some(oldest) = map.iter().min_by_key(|(_, v)| at(v)).map(|(k, _)| k.clone()) {
        map.remove(&oldest);
    }
}

/// The core/v1 Event for a key's `count`-th occurrence.
fn event(record: &Record, key: &str, message: String, count: i32, first: Timestamp) -> Event {
    let reporting_instance = if record.source.host.is_empty() { &record.source.component } else { &record.source.host };
    Event {
        metadata: ObjectMeta {
            name: Some(event_name(&record.involved, key)),
            namespace: Some(namespace_of(&record.involved).to_owned()),
            ..Default::default()
        },
        involved_object: record.involved.clone(),
        reason: Some(record.reason.clone()),
        message: Some(message),
        type_: Some(record.type_.clone()),
        source: Some(EventSource {
            component: Some(record.source.component.clone()),
            host: (!record.source.host.is_empty()).then(|| record.source.host.clone()),
        }),
        reporting_component: Some(record.source.component.clone()),
        reporting_instance: Some(reporting_instance.clone()),
        first_timestamp: Some(Time(first)),
        last_timestamp: Some(Time(record.time)),
        count: Some(count),
        ..Default::default()
    }
}

/// Merges `ours` (what this writer counted since it started) into an Event a previous writer
/// left under the same name: the counts add up and the first occurrence stays the earliest.
/// `base` is what the stored Event held when this writer first met it.
pub fn adopt(ours: &mut Event, base: &Event) {
    ours.count = Some(base.count.unwrap_or(1).saturating_add(ours.count.unwrap_or(1)));
    if let (Some(Time(theirs)), Some(Time(mine))) = (&base.first_timestamp, &ours.first_timestamp)
        && theirs < mine
    {
        ours.first_timestamp = base.first_timestamp.clone();
    }
}

/// When an Event last happened: its last timestamp, series or event time, else its creation.
pub fn last_seen(event: &Event) -> Option<Timestamp> {
    [
        event.last_timestamp.as_ref().map(|t| t.0),
        event.series.as_ref().and_then(|s| s.last_observed_time.as_ref()).map(|t| t.0),
        event.event_time.as_ref().map(|t| t.0),
        event.metadata.creation_timestamp.as_ref().map(|t| t.0),
    ]
    .into_iter()
    .flatten()
    .max()
}

/// Whether the garbage pass deletes an Event: nothing happened to it for `ttl` (as etcd's lease
/// on an Event, renewed by every write). An Event with no time at all is garbage.
pub fn expired(event: &Event, now: Timestamp, ttl: Duration) -> bool {
    match last_seen(event) {
        Some(last) => now.duration_since(last).as_secs_f64() >= ttl.as_secs_f64(),
        None => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;

    fn pod() -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("web-1".into()),
                namespace: Some("shop".into()),
                uid: Some("u1".into()),
                resource_version: Some("7".into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + seconds).unwrap()
    }

    fn record(reason: &str, message: &str, seconds: i64) -> Record {
        Record {
            time: at(seconds),
            ..Record::new(Source::component("kubelet"), reference(&pod()), WARNING, reason, message)
        }
    }

    fn written(outcome: Outcome) -> Event {
        match outcome {
            Outcome::Write(e) => *e,
            Outcome::Dropped => panic!("dropped"),
        }
    }

    #[test]
    fn reference_names_the_object_as_client_go() {
        let r = reference(&pod());
        assert_eq!(r.kind.as_deref(), Some("Pod"));
        assert_eq!(r.api_version.as_deref(), Some("v1"));
        assert_eq!((r.namespace.as_deref(), r.name.as_deref()), (Some("shop"), Some("web-1")));
        assert_eq!((r.uid.as_deref(), r.resource_version.as_deref()), (Some("u1"), Some("7")));
    }

    #[test]
    fn repeats_count_on_one_event() {
        let mut c = Correlator::new(Options::default());
        let first = written(c.observe(&record("BackOff", "Back-off restarting failed container", 0)));
        let third = {
            c.observe(&record("BackOff", "Back-off restarting failed container", 10));
            written(c.observe(&record("BackOff", "Back-off restarting failed container", 20)))
        };
        assert_eq!(first.metadata.name, third.metadata.name, "the same key, the same Event");
        assert_eq!((first.count, third.count), (Some(1), Some(3)));
        assert_eq!(third.first_timestamp, Some(Time(at(0))));
        assert_eq!(third.last_timestamp, Some(Time(at(20))));
        assert_eq!(third.metadata.namespace.as_deref(), Some("shop"));
        assert_eq!(third.source.as_ref().and_then(|s| s.component.as_deref()), Some("kubelet"));
        assert!(third.metadata.name.as_deref().unwrap().starts_with("web-1."));
    }

    #[test]
    fn a_different_message_reason_type_or_source_is_another_event() {
        let mut c = Correlator::new(Options::default());
        let name = |o| written(o).metadata.name.unwrap();
        let base = name(c.observe(&record("Pulled", "image a", 0)));
        assert_ne!(base, name(c.observe(&record("Pulled", "image b", 0))));
        assert_ne!(base, name(c.observe(&record("Created", "image a", 0))));
        let mut normal = record("Pulled", "image a", 0);
        normal.type_ = NORMAL.into();
        assert_ne!(base, name(c.observe(&normal)));
        let mut other_node = record("Pulled", "image a", 0);
        other_node.source.host = "node-2".into();
        assert_ne!(base, name(c.observe(&other_node)));
    }

    #[test]
    fn the_spam_filter_allows_a_burst_then_one_per_refill() {
        let mut c = Correlator::new(Options::default());
        // Distinct messages, so aggregation would not hide a drop: every one costs a token.
        let outcomes: Vec<_> = (0..30).map(|i| c.observe(&record("BackOff", &format!("m{i}"), 0))).collect();
        assert_eq!(outcomes.iter().filter(|o| matches!(o, Outcome::Write(_))).count(), 25);
        assert_eq!(c.observe(&record("BackOff", "later", 299)), Outcome::Dropped);
        assert!(matches!(c.observe(&record("BackOff", "later", 301)), Outcome::Write(_)));
        // Another object has its own bucket.
        let mut other = record("BackOff", "m", 0);
        other.involved.name = Some("web-2".into());
        assert!(matches!(c.observe(&other), Outcome::Write(_)));
    }

    #[test]
    fn many_messages_of_one_reason_are_combined() {
        let mut c = Correlator::new(Options::default());
        let events: Vec<Event> =
            (0..12).map(|i| written(c.observe(&record("Unhealthy", &format!("m{i}"), i)))).collect();
        assert!(events[8].message.as_deref() == Some("m8"), "nine distinct messages stay apart");
        assert_eq!(events[9].message.as_deref(), Some("(combined from similar events): m9"));
        assert_eq!(events[11].message.as_deref(), Some("(combined from similar events): m11"));
        assert_eq!(events[9].metadata.name, events[11].metadata.name);
        assert_eq!((events[9].count, events[11].count), (Some(1), Some(3)));
        // After the window, messages stand alone again.
        let later = written(c.observe(&record("Unhealthy", "m0", 1000)));
        assert_eq!(later.message.as_deref(), Some("m0"));
    }

    #[test]
    fn caches_stay_bounded() {
        let mut c = Correlator::new(Options { cache_entries: 8, ..Options::default() });
        for i in 0..100 {
            let mut r = record("Pulled", "x", i);
            r.involved.name = Some(format!("pod-{i}"));
            c.observe(&r);
        }
        assert!(c.seen.len() <= 8 && c.buckets.len() <= 8 && c.aggregates.len() <= 8);
    }

    #[test]
    fn long_messages_are_cut_on_a_character_boundary() {
        let r = Record::new(Source::component("x"), reference(&pod()), NORMAL, "R", &"é".repeat(1000));
        assert!(r.message.len() <= MAX_MESSAGE_BYTES && r.message.chars().all(|c| c == 'é'));
    }

    #[test]
    fn cluster_scoped_objects_record_in_default() {
        let node = ObjectReference { kind: Some("Node".into()), name: Some("n1".into()), ..Default::default() };
        let e = written(Correlator::default().observe(&Record {
            time: at(0),
            ..Record::new(Source { component: "kubelet".into(), host: "n1".into() }, node, NORMAL, "Starting", "x")
        }));
        assert_eq!(e.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(e.reporting_instance.as_deref(), Some("n1"));
    }

    #[test]
    fn adopting_a_stored_event_adds_counts_and_keeps_the_first_time() {
        let mut c = Correlator::new(Options::default());
        let mut ours = written(c.observe(&record("BackOff", "m", 100)));
        let mut stored = ours.clone();
        stored.count = Some(5);
        stored.first_timestamp = Some(Time(at(0)));
        adopt(&mut ours, &stored);
        assert_eq!(ours.count, Some(6));
        assert_eq!(ours.first_timestamp, Some(Time(at(0))));
        assert_eq!(ours.last_timestamp, Some(Time(at(100))));
    }

    #[test]
    fn events_expire_a_ttl_after_their_last_occurrence() {
        let mut c = Correlator::new(Options::default());
        c.observe(&record("BackOff", "m", 0));
        let e = written(c.observe(&record("BackOff", "m", 3000)));
        let ttl = Duration::from_secs(3600);
        assert!(!expired(&e, at(6599), ttl), "the TTL runs from the last occurrence");
        assert!(expired(&e, at(6600), ttl));
        assert!(expired(&Event::default(), at(0), ttl), "no time at all: garbage");
    }
}
