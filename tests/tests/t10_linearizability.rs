//! The linearizability checker on hand-made and generated histories (pure: no cluster, no root).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use gitplane_e2e::linearizability::{
    CheckError, CheckOptions, CheckStats, History, KvInput, KvModel, KvOutput, Operation, Outcome, Value, Violation,
    check, load_operations, operations_from_json, operations_to_json, save_operations,
};

type Op = Operation<KvInput, KvOutput>;
type Checked = Result<CheckStats, CheckError<KvInput, KvOutput>>;

/// Builds histories by hand, times in nanoseconds.
#[derive(Default)]
struct Ops(Vec<Op>);

impl Ops {
    fn push(&mut self, client: u64, call_ns: u64, return_ns: Option<u64>, input: KvInput, outcome: Outcome<KvOutput>) {
        let id = self.0.len() as u64;
        self.0.push(Operation { id, client, input, call_ns, return_ns, outcome });
    }

    fn ok(mut self, client: u64, call: u64, ret: u64, input: KvInput, output: KvOutput) -> Self {
        self.push(client, call, Some(ret), input, Outcome::Ok(output));
        self
    }

    fn fail(mut self, client: u64, call: u64, ret: u64, input: KvInput) -> Self {
        self.push(client, call, Some(ret), input, Outcome::Fail);
        self
    }

    fn unknown(mut self, client: u64, call: u64, input: KvInput) -> Self {
        self.push(client, call, Some(call + 1_000), input, Outcome::Unknown);
        self
    }

    fn check(&self) -> Checked {
        check(&KvModel, &self.0, &CheckOptions::default())
    }
}

fn got(value: &str) -> KvOutput {
    KvOutput::Got(Some(value.into()))
}

fn some(value: &str) -> Option<Value> {
    Some(value.into())
}

#[track_caller]
fn assert_linearizable(ops: &Ops) {
    if let Err(error) = ops.check() {
        panic!("expected a linearizable history, got:\n{error}");
    }
}

/// Asserts a violation on `key` that names the operations `ids`, and returns it.
#[track_caller]
fn assert_violation(ops: &Ops, key: &str, ids: &[u64]) -> Violation<KvInput, KvOutput> {
    match ops.check() {
        Err(CheckError::Violation(violation)) => {
            println!("{}", violation.explanation);
            assert_eq!(violation.key, key);
            let named: Vec<u64> = violation.ops.iter().map(|op| op.id).collect();
            for id in ids {
                assert!(named.contains(id), "violation should name #{id}, names {named:?}");
                assert!(violation.explanation.contains(&format!("#{id} ")), "explanation should show #{id}");
            }
            violation
        }
        other => panic!("expected a violation on {key:?}, got {other:?}"),
    }
}

// --- accepted -----------------------------------------------------------------------------

#[test]
fn sequential_history_is_linearizable() {
    let ops = Ops::default()
        .ok(0, 0, 10, KvInput::get("k"), KvOutput::Got(None))
        .ok(0, 20, 30, KvInput::put("k", "v1"), KvOutput::PutOk)
        .ok(1, 40, 50, KvInput::get("k"), got("v1"))
        .ok(1, 60, 70, KvInput::compare_and_put("k", some("v1"), 7), KvOutput::CasOk)
        .ok(0, 80, 90, KvInput::compare_and_put("k", some("v1"), "v3"), KvOutput::CasFailed)
        .ok(2, 100, 110, KvInput::get("k"), KvOutput::Got(Some(Value::Version(7))))
        .ok(2, 120, 130, KvInput::delete("k"), KvOutput::Deleted)
        .ok(1, 140, 150, KvInput::compare_and_put("k", None, "v4"), KvOutput::CasOk)
        .ok(0, 160, 170, KvInput::get("k"), got("v4"));
    let stats = ops.check().unwrap();
    assert_eq!((stats.partitions, stats.operations), (1, 9));
}

#[test]
fn reads_overlapping_concurrent_puts_may_see_either_value() {
    // put v1 [0, 100] and put v2 [10, 110] overlap; so do both reads, which see them in
    // opposite orders: v2, then v1 (put v2, read, put v1, read).
    let ops = Ops::default()
        .ok(0, 0, 100, KvInput::put("k", "v1"), KvOutput::PutOk)
        .ok(1, 10, 110, KvInput::put("k", "v2"), KvOutput::PutOk)
        .ok(2, 20, 120, KvInput::get("k"), got("v2"))
        .ok(3, 30, 130, KvInput::get("k"), got("v1"))
        .ok(2, 140, 150, KvInput::get("k"), got("v1"));
    assert_linearizable(&ops);

    // The same with the last read seeing v2: also fine, puts are concurrent.
    let ops = Ops::default()
        .ok(0, 0, 100, KvInput::put("k", "v1"), KvOutput::PutOk)
        .ok(1, 10, 110, KvInput::put("k", "v2"), KvOutput::PutOk)
        .ok(2, 20, 120, KvInput::get("k"), got("v1"))
        .ok(2, 140, 150, KvInput::get("k"), got("v2"));
    assert_linearizable(&ops);
}

#[test]
fn once_both_puts_returned_reads_agree_on_the_winner() {
    let ops = Ops::default()
        .ok(0, 0, 100, KvInput::put("k", "v1"), KvOutput::PutOk)
        .ok(1, 10, 110, KvInput::put("k", "v2"), KvOutput::PutOk)
        .ok(2, 200, 210, KvInput::get("k"), got("v2"))
        .ok(3, 220, 230, KvInput::get("k"), got("v1"));
    assert_violation(&ops, "k", &[3]);
}

#[test]
fn unknown_put_may_take_effect_and_be_observed_later() {
    // The client gave up on v2 at 31 µs; the new leader applied it much later.
    let ops = Ops::default()
        .ok(0, 0, 10, KvInput::put("k", "v1"), KvOutput::PutOk)
        .unknown(0, 30_000, KvInput::put("k", "v2"))
        .ok(1, 40_000, 50_000, KvInput::get("k"), got("v1"))
        .ok(1, 5_000_000, 5_000_010, KvInput::get("k"), got("v2"))
        .ok(2, 6_000_000, 6_000_010, KvInput::get("k"), got("v2"));
    assert_linearizable(&ops);
}

#[test]
fn unknown_put_may_never_take_effect() {
    let ops = Ops::default()
        .ok(0, 0, 10, KvInput::put("k", "v1"), KvOutput::PutOk)
        .unknown(0, 20, KvInput::put("k", "v2"))
        .unknown(3, 25, KvInput::compare_and_put("k", some("v1"), "v3"))
        .unknown(4, 26, KvInput::delete("k"))
        .ok(1, 40_000, 50_000, KvInput::get("k"), got("v1"))
        .ok(2, 60_000, 70_000, KvInput::compare_and_put("k", some("v1"), "v4"), KvOutput::CasOk);
    assert_linearizable(&ops);
}

#[test]
fn an_unknown_put_once_observed_cannot_be_undone() {
    let ops = Ops::default()
        .ok(0, 0, 10, KvInput::put("k", "v1"), KvOutput::PutOk)
        .unknown(0, 20, KvInput::put("k", "v2"))
        .ok(1, 100, 110, KvInput::get("k"), got("v2"))
        .ok(1, 120, 130, KvInput::get("k"), got("v1"));
    assert_violation(&ops, "k", &[3]);
}

#[test]
fn failed_operations_are_ignored() {
    let ops = Ops::default()
        .ok(0, 0, 10, KvInput::put("k", "v1"), KvOutput::PutOk)
        .fail(1, 20, 30, KvInput::put("k", "v2"))
        .fail(1, 35, 38, KvInput::delete("k"))
        .ok(2, 40, 50, KvInput::get("k"), got("v1"));
    assert_linearizable(&ops);

    // A failed put is definitely not applied: seeing its value is a violation.
    let ops = Ops::default()
        .ok(0, 0, 10, KvInput::put("k", "v1"), KvOutput::PutOk)
        .fail(1, 20, 30, KvInput::put("k", "v2"))
        .ok(2, 40, 50, KvInput::get("k"), got("v2"));
    assert_violation(&ops, "k", &[2]);
}

#[test]
fn keys_are_checked_independently() {
    // Interleaved in time, but per key each is fine.
    let ops = Ops::default()
        .ok(0, 0, 10, KvInput::put("a", "a1"), KvOutput::PutOk)
        .ok(1, 5, 15, KvInput::put("b", "b1"), KvOutput::PutOk)
        .ok(0, 20, 30, KvInput::get("b"), got("b1"))
        .ok(1, 25, 35, KvInput::get("a"), got("a1"))
        .ok(2, 40, 50, KvInput::get("c"), KvOutput::Got(None));
    let stats = ops.check().unwrap();
    assert_eq!((stats.partitions, stats.operations), (3, 5));
}

// --- rejected -----------------------------------------------------------------------------

#[test]
fn stale_read_after_failover_is_a_violation() {
    // v2 is acknowledged at 30 µs; a read starting later (served by a deposed leader) sees v1.
    let ops = Ops::default()
        .ok(0, 0, 10_000, KvInput::put("k", "v1"), KvOutput::PutOk)
        .ok(1, 20_000, 30_000, KvInput::put("k", "v2"), KvOutput::PutOk)
        .ok(2, 40_000, 50_000, KvInput::get("other"), KvOutput::Got(None))
        .ok(2, 60_000, 70_000, KvInput::get("k"), got("v1"));
    let violation = assert_violation(&ops, "k", &[1, 3]);
    assert_eq!((violation.longest_prefix, violation.acknowledged), (2, 3));
    let text = &violation.explanation;
    assert!(text.contains(r#"impossible in state Some("v2")"#), "{text}");
    assert!(text.contains("0.000020000s .. 0.000030000s"), "times are shown: {text}");
    assert!(text.contains("(last to change the state)"), "{text}");
}

#[test]
fn read_of_a_value_never_written_is_a_violation() {
    let ops = Ops::default().ok(0, 0, 10, KvInput::put("k", "v1"), KvOutput::PutOk).ok(
        1,
        5,
        50,
        KvInput::get("k"),
        got("ghost"),
    );
    assert_violation(&ops, "k", &[1]);
}

#[test]
fn lost_acknowledged_write_is_a_violation() {
    // v2 acknowledged, leader killed, the new leader never had it: reads return v1 until v3.
    let ops = Ops::default()
        .ok(0, 0, 10, KvInput::put("k", "v1"), KvOutput::PutOk)
        .ok(0, 20, 30, KvInput::put("k", "v2"), KvOutput::PutOk)
        .unknown(1, 25, KvInput::put("k", "v9"))
        .ok(2, 40, 50, KvInput::get("k"), got("v1"))
        .ok(0, 60, 70, KvInput::put("k", "v3"), KvOutput::PutOk)
        .ok(2, 80, 90, KvInput::get("k"), got("v3"));
    assert_violation(&ops, "k", &[1, 3]);

    // Seen through a compare-and-put instead of a read.
    let ops = Ops::default()
        .ok(0, 0, 10, KvInput::put("k", "v1"), KvOutput::PutOk)
        .ok(0, 20, 30, KvInput::put("k", "v2"), KvOutput::PutOk)
        .ok(1, 40, 50, KvInput::compare_and_put("k", some("v2"), "v3"), KvOutput::CasFailed);
    assert_violation(&ops, "k", &[1, 2]);
}

#[test]
fn compare_and_put_that_should_have_failed_is_a_violation() {
    let ops = Ops::default()
        .ok(0, 0, 10, KvInput::put("k", "v1"), KvOutput::PutOk)
        .ok(1, 20, 30, KvInput::put("k", "v2"), KvOutput::PutOk)
        .ok(2, 40, 50, KvInput::compare_and_put("k", some("v1"), "v3"), KvOutput::CasOk);
    assert_violation(&ops, "k", &[1, 2]);

    // Concurrent with the put of v2 it may have come first: fine.
    let ops = Ops::default()
        .ok(0, 0, 10, KvInput::put("k", "v1"), KvOutput::PutOk)
        .ok(1, 20, 30, KvInput::put("k", "v2"), KvOutput::PutOk)
        .ok(2, 25, 50, KvInput::compare_and_put("k", some("v1"), "v3"), KvOutput::CasOk)
        .ok(2, 60, 70, KvInput::get("k"), got("v2"));
    assert_linearizable(&ops);

    // Two leaders both granting the same compare-and-put (a lease taken twice).
    let ops = Ops::default()
        .ok(0, 0, 10, KvInput::put("lease", "free"), KvOutput::PutOk)
        .ok(1, 20, 100, KvInput::compare_and_put("lease", some("free"), "node-a"), KvOutput::CasOk)
        .ok(2, 30, 110, KvInput::compare_and_put("lease", some("free"), "node-b"), KvOutput::CasOk);
    assert_violation(&ops, "lease", &[]);
}

// --- fixtures -------------------------------------------------------------------------------

#[test]
fn recorded_history_round_trips_through_json() {
    let history: History = History::new();
    let recorder = history.clone();
    let id = recorder.invoke(1, KvInput::put("k", "v1"));
    recorder.ok(id, KvOutput::PutOk);
    let id = recorder.invoke(2, KvInput::compare_and_put("k", Some(Value::Version(3)), 4));
    recorder.ok(id, KvOutput::CasFailed);
    let id = recorder.invoke(3, KvInput::put("k", 5));
    recorder.unknown(id);
    let id = recorder.invoke(4, KvInput::delete("k"));
    recorder.fail(id);
    let _pending = recorder.invoke(5, KvInput::get("k"));
    let id = recorder.invoke(1, KvInput::get("k"));
    recorder.ok(id, KvOutput::Got(Some(Value::Version(5))));

    let ops = history.operations();
    assert_eq!(ops.len(), 6);
    assert!(ops.windows(2).all(|w| w[0].call_ns <= w[1].call_ns));
    assert!(ops.iter().all(|op| op.return_ns.is_none_or(|ret| ret >= op.call_ns)));
    assert_eq!(ops[4].return_ns, None, "pending");
    assert_eq!(ops[4].outcome, Outcome::Unknown);

    let json = history.to_json().unwrap();
    println!("{json}");
    let loaded: Vec<Op> = operations_from_json(&json).unwrap();
    assert_eq!(loaded, ops);
    check(&KvModel, &loaded, &CheckOptions::default()).unwrap();

    let path = std::env::temp_dir().join(format!("gitplane-t10-history-{}.json", std::process::id()));
    save_operations(&path, &ops).unwrap();
    let loaded: Result<Vec<Op>, _> = load_operations(&path);
    std::fs::remove_file(&path).unwrap();
    assert_eq!(loaded.unwrap(), ops);
    assert_eq!(operations_to_json(&ops).unwrap(), json);
}

#[test]
fn malformed_fixtures_are_errors_not_panics() {
    let op = |extra: &str| {
        format!(
            r#"{{"format":"gitplane-history/v1","operations":[{{"id":0,"client":0,"input":{{"op":"get","key":"k"}},{extra}}}]}}"#
        )
    };
    let cases = [
        ("not JSON", String::from("{")),
        ("empty", String::new()),
        ("wrong format", r#"{"format":"jepsen","operations":[]}"#.to_owned()),
        ("missing operations", r#"{"format":"gitplane-history/v1"}"#.to_owned()),
        ("unknown field", op(r#""call_ns":1,"return_ns":2,"outcome":"fail","extra":1"#)),
        ("unknown op", op(r#""call_ns":1,"return_ns":2,"outcome":{"ok":{"frobbed":1}}"#)),
        (
            "unknown input field",
            r#"{"format":"gitplane-history/v1","operations":[{"id":0,"client":0,"input":{"op":"get","key":"k","x":1},"call_ns":1,"return_ns":2,"outcome":"fail"}]}"#.to_owned(),
        ),
        ("not an object", r#"{"format":"gitplane-history/v1","operations":[7]}"#.to_owned()),
        ("huge number", op(r#""call_ns":1e400,"return_ns":2,"outcome":"fail""#)),
        ("deep nesting", "[".repeat(100_000)),
        ("negative time", op(r#""call_ns":-1,"return_ns":2,"outcome":"fail""#)),
        ("return before call", op(r#""call_ns":5,"return_ns":2,"outcome":{"ok":"deleted"}"#)),
        ("answer without return", op(r#""call_ns":5,"return_ns":null,"outcome":{"ok":{"got":null}}"#)),
        ("float value", op(r#""call_ns":1,"return_ns":2,"outcome":{"ok":{"got":1.5}}"#)),
        (
            "duplicate id",
            r#"{"format":"gitplane-history/v1","operations":[
                {"id":0,"client":0,"input":{"op":"get","key":"k"},"call_ns":1,"return_ns":2,"outcome":"fail"},
                {"id":0,"client":0,"input":{"op":"get","key":"k"},"call_ns":1,"return_ns":2,"outcome":"fail"}]}"#
                .to_owned(),
        ),
    ];
    for (what, json) in cases {
        match operations_from_json::<KvInput, KvOutput>(&json) {
            Ok(ops) => panic!("{what}: accepted {ops:?}"),
            Err(error) => println!("{what}: {error}"),
        }
    }
    let missing = std::env::temp_dir().join("gitplane-t10-no-such-history.json");
    assert!(load_operations::<KvInput, KvOutput>(&missing).is_err());

    // The checker validates hand-built histories too.
    let ops = Ops::default().ok(0, 50, 10, KvInput::get("k"), KvOutput::Got(None));
    assert!(matches!(ops.check(), Err(CheckError::InvalidHistory { id: 0, .. })));
}

#[test]
#[should_panic(expected = "not pending")]
fn completing_an_operation_twice_is_a_bug_in_the_test() {
    let history: History = History::new();
    let id = history.invoke(0, KvInput::get("k"));
    history.ok(id, KvOutput::Got(None));
    history.unknown(id);
}

// --- generated histories ----------------------------------------------------------------------

/// SplitMix64: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn percent(&mut self, p: u64) -> bool {
        self.below(100) < p
    }
}

#[derive(Clone, Copy)]
enum Fate {
    Answered,
    Failed,
    /// Timed out, but the store applied it (possibly after the client gave up).
    TimedOutApplied,
    TimedOutLost,
}

struct Planned {
    client: u64,
    input: KvInput,
    call: u64,
    /// When the store applied it, if it did.
    applied_at: Option<u64>,
    ret: u64,
    fate: Fate,
}

const MS: u64 = 1_000_000;

struct Workload {
    clients: u64,
    operations: usize,
    keys: u64,
    /// Of `keys`, how many get `hot_percent` of the traffic.
    hot_keys: u64,
    hot_percent: u64,
    failed_percent: u64,
    timed_out_percent: u64,
    /// Operations that take up to 50 ms to take effect and as long to answer, instead of 2 ms.
    slow_percent: u64,
}

/// 16 clients, 100 keys of which 5 are hot (a fifth of the traffic, so up to 16 concurrent
/// operations on one key), 1% failures, 1% timeouts.
const MIXED: Workload = Workload {
    clients: 16,
    operations: 20_000,
    keys: 100,
    hot_keys: 5,
    hot_percent: 20,
    failed_percent: 1,
    timed_out_percent: 1,
    slow_percent: 1,
};

/// A linearizable key-value service simulated in time: each operation takes effect at one
/// instant inside its interval (or, for a timed-out one, maybe later or never). Latencies of up
/// to 2 ms, with 1% slow ones of up to 50 ms; timeouts after 100 ms.
fn generate(seed: u64, workload: &Workload) -> Vec<Op> {
    let Workload {
        clients,
        operations: total,
        keys,
        hot_keys,
        hot_percent,
        failed_percent,
        timed_out_percent,
        slow_percent,
    } = *workload;
    let mut rng = Rng(seed);
    let mut next_free: Vec<u64> = (0..clients).map(|_| rng.below(MS)).collect();
    let mut written: HashMap<String, Vec<Value>> = HashMap::new();
    let mut planned = Vec::with_capacity(total);
    let mut seq = 0u64;
    for _ in 0..total {
        let client = (0..clients).min_by_key(|&c| next_free[c as usize]).unwrap_or(0);
        let key = if rng.percent(hot_percent) || hot_keys == keys {
            format!("hot-{}", rng.below(hot_keys))
        } else {
            format!("key-{}", rng.below(keys - hot_keys))
        };
        seq += 1;
        let value = if seq.is_multiple_of(2) { Value::Version(seq) } else { Value::Str(format!("v{seq}")) };
        let history = written.entry(key.clone()).or_default();
        let input = match rng.below(100) {
            0..50 => KvInput::Get { key },
            50..78 => KvInput::Put { key, value: value.clone() },
            78..83 => KvInput::Delete { key },
            _ => {
                let expected = match (history.len(), rng.below(3)) {
                    (0, _) | (_, 0) => None,
                    (n, 1) => history.get(n - 1).cloned(),
                    (n, _) => history.get(n - 1 - rng.below(n as u64).min(3) as usize).cloned(),
                };
                KvInput::CompareAndPut { key, expected, value: value.clone() }
            }
        };
        if matches!(input, KvInput::Put { .. } | KvInput::CompareAndPut { .. }) {
            history.push(value);
        }
        let call = next_free[client as usize] + rng.below(MS / 5);
        let slow = if rng.percent(slow_percent) { 50 * MS } else { 2 * MS };
        let applied = call + rng.below(slow);
        let answered = applied + rng.below(slow);
        let fate = rng.below(100);
        let (fate, applied_at, ret) = if fate < failed_percent {
            (Fate::Failed, None, answered)
        } else if fate >= failed_percent + timed_out_percent {
            (Fate::Answered, Some(applied), answered)
        } else if rng.percent(50) {
            (Fate::TimedOutApplied, Some(call + rng.below(200 * MS)), call + 100 * MS)
        } else {
            (Fate::TimedOutLost, None, call + 100 * MS)
        };
        next_free[client as usize] = ret;
        planned.push(Planned { client, input, call, applied_at, ret, fate });
    }

    // Apply in the order the store applied them, to compute the outputs.
    let mut order: Vec<usize> = (0..planned.len()).filter(|&i| planned[i].applied_at.is_some()).collect();
    order.sort_by_key(|&i| (planned[i].applied_at, i));
    let mut store: HashMap<String, Value> = HashMap::new();
    let mut outputs: Vec<Option<KvOutput>> = vec![None; planned.len()];
    for i in order {
        outputs[i] = Some(match &planned[i].input {
            KvInput::Get { key } => KvOutput::Got(store.get(key).cloned()),
            KvInput::Put { key, value } => {
                store.insert(key.clone(), value.clone());
                KvOutput::PutOk
            }
            KvInput::Delete { key } => {
                store.remove(key);
                KvOutput::Deleted
            }
            KvInput::CompareAndPut { key, expected, value } => {
                if store.get(key) == expected.as_ref() {
                    store.insert(key.clone(), value.clone());
                    KvOutput::CasOk
                } else {
                    KvOutput::CasFailed
                }
            }
        });
    }

    let mut ops: Vec<Op> = planned
        .into_iter()
        .zip(outputs)
        .map(|(p, output)| Operation {
            id: 0,
            client: p.client,
            input: p.input,
            call_ns: p.call,
            return_ns: Some(p.ret),
            outcome: match (p.fate, output) {
                (Fate::Answered, Some(output)) => Outcome::Ok(output),
                (Fate::Failed, _) => Outcome::Fail,
                _ => Outcome::Unknown,
            },
        })
        .collect();
    ops.sort_by_key(|op| op.call_ns);
    for (id, op) in ops.iter_mut().enumerate() {
        op.id = id as u64;
    }
    ops
}

/// Makes one read in the second half stale: it returns a value `q` wrote although a put `p`
/// of another value started after `q` returned and returned before the read started. Values are
/// unique, so no linearization can explain it. Returns the read's id and key.
fn make_one_read_stale(ops: &mut [Op]) -> (u64, String) {
    let acked_put = |op: &Op| match (&op.input, &op.outcome) {
        (KvInput::Put { key, value }, Outcome::Ok(_)) => Some((key.clone(), value.clone(), op.call_ns, op.return_ns?)),
        _ => None,
    };
    let puts: Vec<_> = ops.iter().filter_map(acked_put).collect();
    for read in ops.len() / 2..ops.len() {
        let (KvInput::Get { key }, Outcome::Ok(_), call) = (&ops[read].input, &ops[read].outcome, ops[read].call_ns)
        else {
            continue;
        };
        let stale = puts
            .iter()
            .filter(|p| &p.0 == key && p.3 < call)
            .find_map(|p| puts.iter().find(|q| &q.0 == key && q.3 < p.2 && q.1 != p.1).map(|q| q.1.clone()));
        if let Some(stale) = stale {
            let key = key.clone();
            ops[read].outcome = Outcome::Ok(KvOutput::Got(Some(stale)));
            return (ops[read].id, key);
        }
    }
    panic!("no read to make stale");
}

#[test]
fn generated_20000_operation_history_is_accepted_and_a_stale_read_in_it_is_caught() {
    let ops = generate(0x5EED_0001, &MIXED);
    let count = |f: fn(&Outcome<KvOutput>) -> bool| ops.iter().filter(|op| f(&op.outcome)).count();
    println!(
        "generated {} operations: {} answered, {} failed, {} unknown",
        ops.len(),
        count(|o| matches!(o, Outcome::Ok(_))),
        count(|o| matches!(o, Outcome::Fail)),
        count(|o| matches!(o, Outcome::Unknown)),
    );
    let hot = ops.iter().filter(|op| op.input.key().starts_with("hot-")).count();
    assert!(hot > 3_000, "hot keys get concurrent traffic: {hot}");

    let started = Instant::now();
    let stats = match check(&KvModel, &ops, &CheckOptions::default()) {
        Ok(stats) => stats,
        Err(error) => panic!("a linearizable service's history was rejected:\n{error}"),
    };
    println!(
        "checked {} operations in {} partitions: {} search steps, {:.1?}",
        stats.operations,
        stats.partitions,
        stats.steps,
        started.elapsed()
    );
    assert_eq!(stats.partitions, 100);

    let mut mutated = ops.clone();
    let (read, key) = make_one_read_stale(&mut mutated);
    let started = Instant::now();
    match check(&KvModel, &mutated, &CheckOptions::default()) {
        Err(CheckError::Violation(violation)) => {
            println!("mutated history rejected in {:.1?}:\n{}", started.elapsed(), violation.explanation);
            assert_eq!(violation.key, key);
            assert!(violation.ops.iter().any(|op| op.id == read), "the stale read #{read} is named");
        }
        other => panic!("stale read #{read} on {key} not caught: {other:?}"),
    }
}

#[test]
fn generated_histories_of_many_seeds_are_accepted() {
    for seed in 1..=20 {
        let ops = generate(seed, &Workload { operations: 2_000, ..MIXED });
        if let Err(error) = check(&KvModel, &ops, &CheckOptions::default()) {
            panic!("seed {seed}: {error}");
        }
        let mut mutated = ops;
        let (read, key) = make_one_read_stale(&mut mutated);
        match check(&KvModel, &mutated, &CheckOptions::default()) {
            Err(CheckError::Violation(violation)) => assert_eq!(violation.key, key, "seed {seed}"),
            other => panic!("seed {seed}: stale read #{read} not caught: {other:?}"),
        }
    }
}

#[test]
fn exhausted_budget_is_inconclusive_not_a_hang() {
    let ops = generate(7, &Workload { operations: 2_000, ..MIXED });
    let options = CheckOptions { max_steps_per_partition: 3, ..CheckOptions::default() };
    match check(&KvModel, &ops, &options) {
        Err(CheckError::Inconclusive(inconclusive)) => {
            println!("{}", CheckError::<KvInput, KvOutput>::Inconclusive(inconclusive.clone()));
            assert!(inconclusive.steps > 3);
        }
        other => panic!("expected inconclusive, got {other:?}"),
    }
}

/// Real threads against a store behind a mutex (linearizable by construction), recorded with
/// [`History`]: the recorder's timestamps must bracket each operation's real effect.
#[test]
fn threads_recorded_against_a_locked_map_are_linearizable() {
    let history: History = History::new();
    let store: Arc<Mutex<HashMap<String, Value>>> = Arc::default();
    let threads: Vec<_> = (0..8u64)
        .map(|client| {
            let (history, store) = (history.clone(), Arc::clone(&store));
            std::thread::spawn(move || {
                let mut rng = Rng(client + 100);
                for i in 0..1_500u64 {
                    let key = format!("k{}", rng.below(4));
                    let value = Value::Version(client * 1_000_000 + i);
                    let input = match rng.below(10) {
                        0..5 => KvInput::Get { key },
                        5..8 => KvInput::Put { key, value },
                        8 => KvInput::Delete { key },
                        _ => {
                            let expected = store.lock().unwrap().get(&key).cloned();
                            KvInput::CompareAndPut { key, expected, value }
                        }
                    };
                    let id = history.invoke(client, input.clone());
                    let fate = rng.below(100);
                    if fate == 0 {
                        history.fail(id);
                        continue;
                    }
                    let output = if fate == 1 && rng.percent(50) { None } else { Some(apply(&store, &input)) };
                    match output {
                        Some(output) if fate > 1 => history.ok(id, output),
                        _ => history.unknown(id),
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let ops = history.operations();
    let started = Instant::now();
    let stats = check(&KvModel, &ops, &CheckOptions::default()).unwrap();
    println!("{} recorded operations checked in {:.1?} ({} steps)", ops.len(), started.elapsed(), stats.steps);
}

fn apply(store: &Mutex<HashMap<String, Value>>, input: &KvInput) -> KvOutput {
    let mut store = store.lock().unwrap();
    match input {
        KvInput::Get { key } => KvOutput::Got(store.get(key).cloned()),
        KvInput::Put { key, value } => {
            store.insert(key.clone(), value.clone());
            KvOutput::PutOk
        }
        KvInput::Delete { key } => {
            store.remove(key);
            KvOutput::Deleted
        }
        KvInput::CompareAndPut { key, expected, value } => {
            if store.get(key) == expected.as_ref() {
                store.insert(key.clone(), value.clone());
                KvOutput::CasOk
            } else {
                KvOutput::CasFailed
            }
        }
    }
}

#[test]
fn one_hot_key_with_16_concurrent_clients() {
    // Every operation on one key, 16 clients, with failures, timeouts and slow operations.
    let workload = Workload { operations: 1_000, keys: 1, hot_keys: 1, ..MIXED };
    let ops = generate(3, &workload);
    let started = Instant::now();
    let stats = check(&KvModel, &ops, &CheckOptions::default()).unwrap();
    println!("one key, {} operations: {} steps, {:.1?}", stats.operations, stats.steps, started.elapsed());

    let mut mutated = ops;
    let (read, _) = make_one_read_stale(&mut mutated);
    let started = Instant::now();
    match check(&KvModel, &mutated, &CheckOptions::default()) {
        Err(CheckError::Violation(violation)) => {
            println!("stale read #{read} caught in {:.1?}", started.elapsed());
            assert!(violation.ops.iter().any(|op| op.id == read));
        }
        other => panic!("stale read #{read} not caught: {other:?}"),
    }
}

// --- differential ---------------------------------------------------------------------------

/// Every order of every subset of the unknown operations, without any pruning: the definition.
fn brute_force(ops: &[Op]) -> bool {
    use gitplane_e2e::linearizability::Model;

    fn search(ops: &[&Op], placed: &mut [bool], state: &Option<Value>) -> bool {
        let known_left = ops.iter().zip(placed.iter()).any(|(op, &p)| !p && matches!(op.outcome, Outcome::Ok(_)));
        if !known_left {
            return true;
        }
        for x in 0..ops.len() {
            if placed[x] {
                continue;
            }
            // x may come next unless an unplaced answered operation returned before x's call.
            let blocked = (0..ops.len()).any(|y| {
                y != x
                    && !placed[y]
                    && matches!(ops[y].outcome, Outcome::Ok(_))
                    && ops[y].return_ns.is_some_and(|ret| ret < ops[x].call_ns)
            });
            if blocked {
                continue;
            }
            let next = match &ops[x].outcome {
                Outcome::Ok(output) => KvModel.step(state, &ops[x].input, output),
                _ => KvModel.step_unknown(state, &ops[x].input),
            };
            if let Some(next) = next {
                placed[x] = true;
                let found = search(ops, placed, &next);
                placed[x] = false;
                if found {
                    return true;
                }
            }
        }
        false
    }

    let mut keys: Vec<&str> = ops.iter().map(|op| op.input.key()).collect();
    keys.sort_unstable();
    keys.dedup();
    keys.iter().all(|key| {
        let part: Vec<&Op> =
            ops.iter().filter(|op| op.input.key() == *key && !matches!(op.outcome, Outcome::Fail)).collect();
        search(&part, &mut vec![false; part.len()], &None)
    })
}

fn random_small_history(rng: &mut Rng) -> Vec<Op> {
    let values = ["a", "b", "c"];
    let value = |rng: &mut Rng| -> Option<Value> {
        let i = rng.below(4) as usize;
        values.get(i).map(|&v| v.into())
    };
    let n = 1 + rng.below(7);
    (0..n)
        .map(|id| {
            let key = if rng.percent(85) { "k" } else { "j" }.to_owned();
            let (input, output) = match rng.below(4) {
                0 => (KvInput::Get { key }, KvOutput::Got(value(rng))),
                1 => (KvInput::Put { key, value: value(rng).unwrap_or_else(|| "a".into()) }, KvOutput::PutOk),
                2 => (KvInput::Delete { key }, KvOutput::Deleted),
                _ => {
                    let input = KvInput::CompareAndPut {
                        key,
                        expected: value(rng),
                        value: value(rng).unwrap_or_else(|| "b".into()),
                    };
                    (input, if rng.percent(50) { KvOutput::CasOk } else { KvOutput::CasFailed })
                }
            };
            let call_ns = rng.below(20);
            let return_ns = call_ns + rng.below(8);
            let outcome = match rng.below(100) {
                0..70 => Outcome::Ok(output),
                70..85 => Outcome::Unknown,
                _ => Outcome::Fail,
            };
            Operation { id, client: id, input, call_ns, return_ns: Some(return_ns), outcome }
        })
        .collect()
}

#[test]
fn agrees_with_brute_force_on_small_random_histories() {
    let mut rng = Rng(42);
    let (mut linearizable, mut not) = (0, 0);
    for round in 0..30_000 {
        let ops = random_small_history(&mut rng);
        let expected = brute_force(&ops);
        match (check(&KvModel, &ops, &CheckOptions::default()), expected) {
            (Ok(_), true) => linearizable += 1,
            (Err(CheckError::Violation(_)), false) => not += 1,
            (got, _) => panic!("round {round}: brute force says {expected}, checker says {got:?} for {ops:#?}"),
        }
    }
    println!("{linearizable} linearizable, {not} not");
    assert!(linearizable > 5_000 && not > 5_000, "{linearizable} linearizable, {not} not");
}
