//! Linearizability checking of client histories (etcd's robustness tests, Porcupine, Knossos).
//!
//! A fault-injection test records what every client did while the cluster was being hurt: with
//! [`History::invoke`] before a request is sent and [`History::ok`], [`History::fail`] or
//! [`History::unknown`] once its fate is known. [`check`] then decides whether the system could
//! have executed the operations one at a time, each at some instant between its call and its
//! return, such that every output is what a sequential [`Model`] (here [`KvModel`], per-key
//! registers) returns. That is linearizability: the guarantee a Raft store claims, and the one
//! a kill -9 of the leader is most likely to break (stale reads from a deposed leader, lost
//! acknowledged writes, double-applied compare-and-puts).
//!
//! # Use
//!
//! ```
//! use gitplane_e2e::linearizability::{CheckOptions, History, KvInput, KvModel, KvOutput, check};
//!
//! let history: History = History::new(); // clone it into every client task
//! let id = history.invoke(1, KvInput::put("k", "v1"));
//! history.ok(id, KvOutput::PutOk); // or fail(id), or unknown(id) after a timeout
//! let id = history.invoke(2, KvInput::get("k"));
//! history.ok(id, KvOutput::Got(Some("v1".into())));
//!
//! let ops = history.operations();
//! if let Err(error) = check(&KvModel, &ops, &CheckOptions::default()) {
//!     history.save(std::path::Path::new("history.json")).unwrap(); // a fixture for later
//!     panic!("{error}");
//! }
//! ```
//!
//! # The algorithm
//!
//! Wing & Gong's search as improved by Lowe ("Testing for linearizability", 2017) and
//! implemented by Porcupine:
//!
//! * **P-compositionality.** An object is linearizable iff each independent part is, so the
//!   history is split with [`Model::partition`] (per key for [`KvModel`]) and each part is
//!   checked on its own: a few hundred operations instead of tens of thousands.
//! * **A doubly linked list of call and return events**, sorted by time (a call before a return
//!   at the same instant: they overlap). An operation may be linearized next iff its call comes
//!   before the first return still in the list, as every operation that returned before it was
//!   called must come first. Linearizing it unlinks its call and return; backtracking relinks
//!   them in reverse order, in O(1) ("dancing links").
//! * **Depth-first search with backtracking**: a stack of (operation, state before it).
//! * **A cache of visited configurations** (the set of linearized operations as a bitset, the
//!   model state): the rest of the search depends on nothing else, so a configuration seen once
//!   is never explored again. This is what makes the search practical.
//!
//! One addition: an *observation* ([`Model::is_observation`]: a read, a failed compare-and-put)
//! that may come next and fits the current state is linearized at once, without trying other
//! orders. Moving it there changes no other operation's outcome and breaks no real-time order,
//! so nothing is lost; without it, every subset of a batch of concurrent reads that see the same
//! value is a different configuration, and one hot key read by 16 clients takes millions of
//! steps instead of thousands.
//!
//! # Operations with an unknown outcome
//!
//! A client that times out, or loses its connection to a leader that is then killed, does not
//! know whether its write was committed: Raft may have replicated the entry before the crash
//! and the new leader will apply it, possibly long after the client gave up. Such an operation
//! (recorded with [`History::unknown`]) may therefore take effect at any instant after its call,
//! or never. Porcupine gives it a return time of +infinity and a model that accepts any output.
//! Here it is *optional* instead: it has a call event but no return event (so nothing ever
//! forces it to be linearized), the search succeeds once every acknowledged operation is, and
//! when it is linearized its effect comes from [`Model::step_unknown`]. The two views agree (an
//! operation nobody waits for can always be placed last, where it changes nothing anyone saw),
//! but the optional view lets the search leave it out.
//!
//! Optional operations are the usual source of exponential blow-up: each one doubles the
//! configurations (linearized or not), and it stays a candidate for the rest of the history.
//! What keeps that in check:
//!
//! * They sit in a list of their own and are tried only after every acknowledged candidate.
//! * The cache *subsumes*: a configuration with the same acknowledged set and state as a visited
//!   one, and a superset of its optional operations, is pruned, as the visited one had every
//!   option it has. For the same reason an optional operation that would leave the state as it
//!   is (an unanswered read, a compare-and-put that would fail) is never linearized.
//! * Two searches: first with only the optional operations that [`Model::may_explain`] some
//!   answer (for [`KvModel`]: whose written value someone read); if that finds a
//!   linearization, it is one of the whole history in which the others never took effect.
//!   Only if it fails does a second search take all of them, so the verdict never depends on
//!   the hint. Violations are always reported from that complete search.
//!
//! Operations that definitely did not take effect ([`History::fail`]: a rejected precondition,
//! an error the server guarantees came before any effect) are dropped before the search.
//!
//! # Cost
//!
//! 20,000 operations over 100 keys with 16 clients check in well under a second, violations
//! included; so does a single key with 16 concurrent clients and a few timeouts. The search is
//! exponential in the worst case, though, and the expensive case is a *violation* on a key with
//! many unknown outcomes (dozens of never-observed timeouts on one key), where every subset of
//! them must be ruled out. A search that exceeds [`CheckOptions`]' budget ends with
//! [`CheckError::Inconclusive`] instead of hanging a test run.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

// ---------------------------------------------------------------------------------------------
// Recording
// ---------------------------------------------------------------------------------------------

/// One client operation as recorded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Operation<I, O> {
    /// Unique within the history; the order of [`History::invoke`] calls.
    pub id: u64,
    /// The client (connection, task) that issued it. A client issues one operation at a time.
    pub client: u64,
    pub input: I,
    /// Nanoseconds since the history started, taken before the request was sent.
    pub call_ns: u64,
    /// Nanoseconds since the history started, taken after the outcome was known (for
    /// [`Outcome::Unknown`]: when the client gave up). `None` while the operation is pending;
    /// a pending operation counts as [`Outcome::Unknown`].
    pub return_ns: Option<u64>,
    pub outcome: Outcome<O>,
}

/// What a client learned about its operation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome<O> {
    /// The server answered with this output: the operation took effect between call and return.
    Ok(O),
    /// The operation definitely did not take effect; the checker ignores it.
    Fail,
    /// It may have taken effect at any time after its call, or never (timeout, lost connection).
    Unknown,
}

/// Identifies an operation of a [`History`] between [`History::invoke`] and its completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OpId(u64);

impl OpId {
    pub fn get(self) -> u64 {
        self.0
    }
}

/// A history recorder shared by concurrent clients; clones share the same history.
///
/// Timestamps come from one monotonic clock ([`Instant`]) and are taken outside the lock: a call
/// is stamped before the request can have been sent, a return after the answer arrived, so each
/// recorded interval contains the real one (which can only make the checker more lenient).
pub struct History<I = KvInput, O = KvOutput> {
    inner: Arc<Recorder<I, O>>,
}

struct Recorder<I, O> {
    start: Instant,
    ops: Mutex<Vec<Operation<I, O>>>,
}

impl<I, O> Clone for History<I, O> {
    fn clone(&self) -> Self {
        History { inner: Arc::clone(&self.inner) }
    }
}

impl<I, O> Default for History<I, O> {
    fn default() -> Self {
        Self::new()
    }
}

impl<I, O> fmt::Debug for History<I, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("History").field("operations", &self.lock().len()).finish()
    }
}

impl<I, O> History<I, O> {
    /// An empty history whose clock starts now.
    pub fn new() -> Self {
        History { inner: Arc::new(Recorder { start: Instant::now(), ops: Mutex::new(Vec::new()) }) }
    }

    /// Records that `client` is about to send `input`. Call it *before* sending.
    pub fn invoke(&self, client: u64, input: I) -> OpId {
        let call_ns = self.now();
        let mut ops = self.lock();
        let id = ops.len() as u64;
        ops.push(Operation { id, client, input, call_ns, return_ns: None, outcome: Outcome::Unknown });
        OpId(id)
    }

    /// The operation took effect and the server answered `output`.
    ///
    /// # Panics
    /// If `id` is not pending in this history (completed twice, or from another history).
    pub fn ok(&self, id: OpId, output: O) {
        self.complete(id, Outcome::Ok(output));
    }

    /// The operation definitely did not take effect.
    ///
    /// # Panics
    /// As [`History::ok`].
    pub fn fail(&self, id: OpId) {
        self.complete(id, Outcome::Fail);
    }

    /// The client gave up without knowing whether the operation took effect.
    ///
    /// # Panics
    /// As [`History::ok`].
    pub fn unknown(&self, id: OpId) {
        self.complete(id, Outcome::Unknown);
    }

    /// Everything recorded so far, in invocation order; pending operations count as unknown.
    pub fn operations(&self) -> Vec<Operation<I, O>>
    where
        I: Clone,
        O: Clone,
    {
        self.lock().clone()
    }

    /// The history in the fixture format of [`operations_from_json`].
    pub fn to_json(&self) -> Result<String, HistoryError>
    where
        I: Serialize,
        O: Serialize,
    {
        operations_to_json(&self.lock())
    }

    /// Writes the history to `path` (e.g. when a check failed, to keep it as a fixture).
    pub fn save(&self, path: &Path) -> Result<(), HistoryError>
    where
        I: Serialize,
        O: Serialize,
    {
        save_operations(path, &self.lock())
    }

    fn now(&self) -> u64 {
        u64::try_from(self.inner.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Operation<I, O>>> {
        // A client that panicked while holding the lock must not cost us the history.
        self.inner.ops.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn complete(&self, id: OpId, outcome: Outcome<O>) {
        let return_ns = self.now();
        let mut ops = self.lock();
        let op = usize::try_from(id.0).ok().and_then(|index| ops.get_mut(index));
        match op {
            Some(op) if op.return_ns.is_none() => {
                op.return_ns = Some(return_ns.max(op.call_ns));
                op.outcome = outcome;
            }
            _ => {
                drop(ops);
                panic!("history: operation #{} is not pending (completed twice, or from another history)", id.0);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Fixtures
// ---------------------------------------------------------------------------------------------

/// The `format` field of a saved history.
pub const HISTORY_FORMAT: &str = "gitplane-history/v1";

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HistoryFileIn<I, O> {
    format: String,
    operations: Vec<Operation<I, O>>,
}

/// Why a history could not be saved or loaded.
#[derive(Debug)]
pub enum HistoryError {
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// An input or output type failed to serialize.
    Encode {
        source: serde_json::Error,
    },
    /// Not JSON, or not the shape of a history of these input and output types.
    Json {
        origin: String,
        source: serde_json::Error,
    },
    /// Well-formed, but not a history that could have been recorded.
    Invalid {
        origin: String,
        reason: String,
    },
}

impl fmt::Display for HistoryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HistoryError::Io { path, source } => write!(f, "history file {}: {source}", path.display()),
            HistoryError::Encode { source } => write!(f, "cannot serialize the history: {source}"),
            HistoryError::Json { origin, source } => {
                write!(f, "{origin}: not a {HISTORY_FORMAT} history: {source}")
            }
            HistoryError::Invalid { origin, reason } => {
                write!(f, "{origin}: invalid history: {reason}; fix or re-record the fixture")
            }
        }
    }
}

impl std::error::Error for HistoryError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            HistoryError::Io { source, .. } => Some(source),
            HistoryError::Encode { source } | HistoryError::Json { source, .. } => Some(source),
            HistoryError::Invalid { .. } => None,
        }
    }
}

/// Serializes operations as `{"format": "gitplane-history/v1", "operations": [...]}`, one
/// operation per line so fixture diffs stay readable.
pub fn operations_to_json<I: Serialize, O: Serialize>(ops: &[Operation<I, O>]) -> Result<String, HistoryError> {
    let json_error = |source| HistoryError::Encode { source };
    let mut out =
        format!("{{\"format\":{},\"operations\":[", serde_json::to_string(HISTORY_FORMAT).map_err(json_error)?);
    for (i, op) in ops.iter().enumerate() {
        out.push_str(if i == 0 { "\n" } else { ",\n" });
        out.push_str(&serde_json::to_string(op).map_err(json_error)?);
    }
    out.push_str("\n]}\n");
    Ok(out)
}

/// Parses and validates a history saved by [`operations_to_json`]. Never panics on bad input.
pub fn operations_from_json<I: DeserializeOwned, O: DeserializeOwned>(
    json: &str,
) -> Result<Vec<Operation<I, O>>, HistoryError> {
    parse_history(json, "history JSON")
}

pub fn save_operations<I: Serialize, O: Serialize>(path: &Path, ops: &[Operation<I, O>]) -> Result<(), HistoryError> {
    let json = operations_to_json(ops)?;
    std::fs::write(path, json).map_err(|source| HistoryError::Io { path: path.to_owned(), source })
}

pub fn load_operations<I: DeserializeOwned, O: DeserializeOwned>(
    path: &Path,
) -> Result<Vec<Operation<I, O>>, HistoryError> {
    let json = std::fs::read_to_string(path).map_err(|source| HistoryError::Io { path: path.to_owned(), source })?;
    parse_history(&json, &path.display().to_string())
}

fn parse_history<I: DeserializeOwned, O: DeserializeOwned>(
    json: &str,
    origin: &str,
) -> Result<Vec<Operation<I, O>>, HistoryError> {
    let file: HistoryFileIn<I, O> =
        serde_json::from_str(json).map_err(|source| HistoryError::Json { origin: origin.to_owned(), source })?;
    let invalid = |reason: String| HistoryError::Invalid { origin: origin.to_owned(), reason };
    if file.format != HISTORY_FORMAT {
        return Err(invalid(format!("format is {:?}, expected {HISTORY_FORMAT:?}", file.format)));
    }
    let mut ids = HashSet::new();
    for op in &file.operations {
        if !ids.insert(op.id) {
            return Err(invalid(format!("operation id {} appears twice", op.id)));
        }
        validate(op).map_err(|reason| invalid(format!("operation #{}: {reason}", op.id)))?;
    }
    Ok(file.operations)
}

fn validate<I, O>(op: &Operation<I, O>) -> Result<(), String> {
    match (op.return_ns, &op.outcome) {
        (None, Outcome::Ok(_) | Outcome::Fail) => Err("an answered operation needs return_ns".to_owned()),
        (Some(ret), _) if ret < op.call_ns => Err(format!("returns at {ret} ns, before its call at {} ns", op.call_ns)),
        _ => Ok(()),
    }
}

// ---------------------------------------------------------------------------------------------
// Models
// ---------------------------------------------------------------------------------------------

/// A sequential specification (Porcupine's `Model`).
pub trait Model {
    type State: Clone + Eq + Hash + fmt::Debug;
    type Input: fmt::Debug;
    type Output: fmt::Debug;

    /// The state before any operation.
    fn init(&self) -> Self::State;

    /// The state after `input` took effect in `state` and answered `output`, or `None` if the
    /// model cannot answer `output` there.
    fn step(&self, state: &Self::State, input: &Self::Input, output: &Self::Output) -> Option<Self::State>;

    /// The state after `input` took effect in `state` with an output nobody saw (an operation
    /// with an unknown outcome), or `None` if it cannot take effect there. An operation without
    /// effect in `state` (a read, a compare-and-put that would fail) returns `state`; the
    /// checker then never linearizes it there, since leaving it out is the same.
    fn step_unknown(&self, state: &Self::State, input: &Self::Input) -> Option<Self::State>;

    /// Whether `input` answered with `output` leaves every state it fits unchanged: `step`
    /// returns `None` or the state it was given, whatever the state (a read, a failed
    /// compare-and-put). Such an operation is linearized as soon as it may come next and fits,
    /// without trying other orders: placing it there changes no other operation's outcome and
    /// breaks no real-time order, so if any linearization exists, one with it there does. This
    /// keeps concurrent reads from multiplying the search. Claiming it wrongly makes the
    /// checker miss linearizations; the default claims nothing.
    fn is_observation(&self, _input: &Self::Input, _output: &Self::Output) -> bool {
        false
    }

    /// A hint for speed that never changes the verdict: whether an operation with an unknown
    /// outcome could explain some of the `answered` operations of its partition (for
    /// [`KvModel`]: whether some answer shows what it writes). The checker first searches with
    /// only the unknown operations this accepts: a linearization found then is one of the whole
    /// history, in which the others never took effect. Only if that search fails does it
    /// search again with all of them. The default accepts all, so there is one search.
    fn may_explain(&self, _unknown: &Self::Input, _answered: &[(&Self::Input, &Self::Output)]) -> bool {
        true
    }

    /// Operations with different partition keys act on independent state and are checked
    /// separately (P-compositionality). The default puts everything in one partition.
    fn partition(&self, _input: &Self::Input) -> String {
        String::new()
    }
}

/// A value held by a key: a string, or a version tag. In JSON: a string or a number.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Value {
    Version(u64),
    Str(String),
}

impl fmt::Debug for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Version(version) => write!(f, "{version}"),
            Value::Str(s) => write!(f, "{s:?}"),
        }
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::Str(s.to_owned())
    }
}

impl From<String> for Value {
    fn from(s: String) -> Self {
        Value::Str(s)
    }
}

impl From<u64> for Value {
    fn from(version: u64) -> Self {
        Value::Version(version)
    }
}

/// A request to the key-value store.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum KvInput {
    Put {
        key: String,
        value: Value,
    },
    Get {
        key: String,
    },
    Delete {
        key: String,
    },
    /// Puts `value` iff the key's current value is `expected` (`None`: the key is absent).
    CompareAndPut {
        key: String,
        expected: Option<Value>,
        value: Value,
    },
}

impl KvInput {
    pub fn key(&self) -> &str {
        match self {
            KvInput::Put { key, .. }
            | KvInput::Get { key }
            | KvInput::Delete { key }
            | KvInput::CompareAndPut { key, .. } => key,
        }
    }

    pub fn put(key: &str, value: impl Into<Value>) -> Self {
        KvInput::Put { key: key.to_owned(), value: value.into() }
    }

    pub fn get(key: &str) -> Self {
        KvInput::Get { key: key.to_owned() }
    }

    pub fn delete(key: &str) -> Self {
        KvInput::Delete { key: key.to_owned() }
    }

    pub fn compare_and_put(key: &str, expected: Option<Value>, value: impl Into<Value>) -> Self {
        KvInput::CompareAndPut { key: key.to_owned(), expected, value: value.into() }
    }
}

/// The store's answer.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KvOutput {
    PutOk,
    Got(Option<Value>),
    Deleted,
    CasOk,
    /// The key's value was not `expected`; nothing changed.
    CasFailed,
}

/// Independent registers, one per key, each holding an optional [`Value`]. Partitioned by key,
/// so its state is the value of the one key a partition is about.
#[derive(Clone, Copy, Debug, Default)]
pub struct KvModel;

impl Model for KvModel {
    type State = Option<Value>;
    type Input = KvInput;
    type Output = KvOutput;

    fn init(&self) -> Option<Value> {
        None
    }

    fn step(&self, state: &Option<Value>, input: &KvInput, output: &KvOutput) -> Option<Option<Value>> {
        match (input, output) {
            (KvInput::Put { value, .. }, KvOutput::PutOk) => Some(Some(value.clone())),
            (KvInput::Get { .. }, KvOutput::Got(got)) => (got == state).then(|| state.clone()),
            (KvInput::Delete { .. }, KvOutput::Deleted) => Some(None),
            (KvInput::CompareAndPut { expected, value, .. }, KvOutput::CasOk) => {
                (expected == state).then(|| Some(value.clone()))
            }
            (KvInput::CompareAndPut { expected, .. }, KvOutput::CasFailed) => {
                (expected != state).then(|| state.clone())
            }
            _ => None,
        }
    }

    fn step_unknown(&self, state: &Option<Value>, input: &KvInput) -> Option<Option<Value>> {
        match input {
            KvInput::Put { value, .. } => Some(Some(value.clone())),
            KvInput::Get { .. } => Some(state.clone()),
            KvInput::Delete { .. } => Some(None),
            KvInput::CompareAndPut { expected, value, .. } => {
                Some(if expected == state { Some(value.clone()) } else { state.clone() })
            }
        }
    }

    fn is_observation(&self, input: &KvInput, output: &KvOutput) -> bool {
        matches!(
            (input, output),
            (KvInput::Get { .. }, KvOutput::Got(_)) | (KvInput::CompareAndPut { .. }, KvOutput::CasFailed)
        )
    }

    /// Whether some answer shows the value `unknown` writes (a read, or the expectation of a
    /// successful compare-and-put). Ignores failed compare-and-puts, which an overwrite could
    /// also explain: the second search covers them.
    fn may_explain(&self, unknown: &KvInput, answered: &[(&KvInput, &KvOutput)]) -> bool {
        let written = match unknown {
            KvInput::Get { .. } => return false,
            KvInput::Put { value, .. } | KvInput::CompareAndPut { value, .. } => Some(value),
            KvInput::Delete { .. } => None,
        };
        answered.iter().any(|(input, output)| match (input, output) {
            (_, KvOutput::Got(got)) => got.as_ref() == written,
            (KvInput::CompareAndPut { expected, .. }, KvOutput::CasOk) => expected.as_ref() == written,
            _ => false,
        })
    }

    fn partition(&self, input: &KvInput) -> String {
        input.key().to_owned()
    }
}

// ---------------------------------------------------------------------------------------------
// Checking
// ---------------------------------------------------------------------------------------------

/// The search budget of each partition (shared by its two searches, see the module docs).
#[derive(Clone, Debug)]
pub struct CheckOptions {
    /// Search steps (each looks at one candidate operation or backtracks one) before giving up.
    /// Deterministic, unlike the timeout.
    pub max_steps_per_partition: u64,
    /// Wall-clock time before giving up.
    pub timeout_per_partition: Duration,
}

impl Default for CheckOptions {
    fn default() -> Self {
        CheckOptions { max_steps_per_partition: 50_000_000, timeout_per_partition: Duration::from_secs(30) }
    }
}

/// What a successful check looked at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckStats {
    pub partitions: usize,
    /// Operations searched: acknowledged and unknown ones (failed ones are dropped).
    pub operations: usize,
    /// Search steps over all partitions (see [`CheckOptions::max_steps_per_partition`]).
    pub steps: u64,
    pub elapsed: Duration,
}

/// Why a history was not shown to be linearizable. `Debug` prints the readable explanation, so
/// `check(..).unwrap()` fails a test with it.
pub enum CheckError<I, O> {
    /// No linearization exists.
    Violation(Violation<I, O>),
    /// The budget ran out first; nothing is known (and no violation was found elsewhere).
    Inconclusive(Inconclusive),
    /// The history itself is malformed.
    InvalidHistory { id: u64, reason: String },
}

/// A partition (key) whose operations cannot be linearized.
#[derive(Clone, Debug)]
pub struct Violation<I, O> {
    /// The partition; for [`KvModel`] the key. Empty for a model that does not partition.
    pub key: String,
    /// Which operations could not be ordered, with their times and values.
    pub explanation: String,
    /// The operations the explanation is about, sorted by id: the one that last changed the
    /// state in the longest linearizable prefix found, and those that could not come next.
    pub ops: Vec<Operation<I, O>>,
    /// How many acknowledged operations of the partition the longest linearizable prefix holds.
    pub longest_prefix: usize,
    /// Acknowledged operations in the partition.
    pub acknowledged: usize,
}

/// A partition whose search exceeded the budget.
#[derive(Clone, Debug)]
pub struct Inconclusive {
    /// The partition; for [`KvModel`] the key.
    pub key: String,
    /// Acknowledged and unknown operations in the partition.
    pub operations: usize,
    pub steps: u64,
    pub elapsed: Duration,
}

impl<I, O> fmt::Display for CheckError<I, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CheckError::Violation(violation) => f.write_str(&violation.explanation),
            CheckError::Inconclusive(Inconclusive { key, operations, steps, elapsed }) => write!(
                f,
                "key {key:?}: linearizability check inconclusive: {operations} operations, budget exhausted after \
                 {steps} steps in {elapsed:.2?}; raise the CheckOptions budget, or spread the load over more keys \
                 (many unknown outcomes on one key are what makes the search expensive)"
            ),
            CheckError::InvalidHistory { id, reason } => write!(f, "invalid history: operation #{id}: {reason}"),
        }
    }
}

impl<I, O> fmt::Debug for CheckError<I, O> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl<I, O> std::error::Error for CheckError<I, O> {}

/// Checks `ops` for linearizability against `model`, partition by partition (in key order).
///
/// Returns the first violation found; if there is none but some partition ran out of budget,
/// [`CheckError::Inconclusive`]; [`CheckError::InvalidHistory`] if an answered operation has no
/// return time or returns before its call.
pub fn check<M: Model>(
    model: &M,
    ops: &[Operation<M::Input, M::Output>],
    options: &CheckOptions,
) -> Result<CheckStats, CheckError<M::Input, M::Output>>
where
    M::Input: Clone,
    M::Output: Clone,
{
    let start = Instant::now();
    let mut partitions: BTreeMap<String, Vec<&OperationOf<M>>> = BTreeMap::new();
    for op in ops {
        validate(op).map_err(|reason| CheckError::InvalidHistory { id: op.id, reason })?;
        if !matches!(op.outcome, Outcome::Fail) {
            partitions.entry(model.partition(&op.input)).or_default().push(op);
        }
    }
    let mut stats = CheckStats { partitions: partitions.len(), operations: 0, steps: 0, elapsed: Duration::ZERO };
    let mut inconclusive = None;
    for (key, part) in partitions {
        stats.operations += part.len();
        let mut budget = Budget::new(options);
        let searched = check_partition(model, &part, &mut budget);
        stats.steps += budget.steps;
        match searched {
            Searched::Linearizable => {}
            Searched::Violation(deepest) => return Err(CheckError::Violation(explain(model, key, &part, &deepest))),
            Searched::Inconclusive => {
                let elapsed = budget.start.elapsed();
                inconclusive.get_or_insert(Inconclusive { key, operations: part.len(), steps: budget.steps, elapsed });
            }
        }
    }
    match inconclusive {
        Some(inconclusive) => Err(CheckError::Inconclusive(inconclusive)),
        None => {
            stats.elapsed = start.elapsed();
            Ok(stats)
        }
    }
}

type OperationOf<M> = Operation<<M as Model>::Input, <M as Model>::Output>;

/// Searches first without the unknown operations that [`Model::may_explain`] rules out: a
/// linearization of that sub-history is one of the whole (those operations never took
/// effect). Only a failure there needs the search with all of them.
fn check_partition<M: Model>(model: &M, part: &[&OperationOf<M>], budget: &mut Budget) -> Searched<M::State> {
    let answered: Vec<(&M::Input, &M::Output)> = part
        .iter()
        .filter_map(|op| match &op.outcome {
            Outcome::Ok(output) => Some((&op.input, output)),
            Outcome::Fail | Outcome::Unknown => None,
        })
        .collect();
    let likely: Vec<&OperationOf<M>> = part
        .iter()
        .copied()
        .filter(|op| !matches!(op.outcome, Outcome::Unknown) || model.may_explain(&op.input, &answered))
        .collect();
    if likely.len() < part.len() {
        match Search::new(model, &likely).run(budget) {
            Searched::Violation(_) => {}
            linearizable_or_inconclusive => return linearizable_or_inconclusive,
        }
    }
    Search::new(model, part).run(budget)
}

struct Budget {
    start: Instant,
    deadline: Option<Instant>,
    steps: u64,
    max_steps: u64,
}

impl Budget {
    fn new(options: &CheckOptions) -> Self {
        let start = Instant::now();
        let deadline = start.checked_add(options.timeout_per_partition);
        Budget { start, deadline, steps: 0, max_steps: options.max_steps_per_partition }
    }

    /// Counts a step; true once the budget is spent.
    fn exhausted(&mut self) -> bool {
        self.steps += 1;
        self.steps > self.max_steps
            || (self.steps.is_multiple_of(4096) && self.deadline.is_some_and(|deadline| Instant::now() > deadline))
    }
}

const NIL: usize = usize::MAX;

/// A call or return event in a doubly linked list; node 0 is the head sentinel.
struct Node {
    /// Index into the partition's operations.
    op: usize,
    time: u64,
    is_return: bool,
    /// For the call of an acknowledged operation: its return node. Otherwise NIL.
    partner: usize,
    prev: usize,
    next: usize,
}

struct EventList {
    nodes: Vec<Node>,
}

impl EventList {
    /// `events` are (time, is_return, op), sorted; a call comes before a return at the same
    /// instant, which is the lenient reading (the operations overlap).
    fn new(events: &[(u64, bool, usize)], ops: usize) -> Self {
        let mut nodes = Vec::with_capacity(events.len() + 1);
        nodes.push(Node { op: NIL, time: 0, is_return: false, partner: NIL, prev: NIL, next: NIL });
        let mut return_node = vec![NIL; ops];
        for (i, &(time, is_return, op)) in events.iter().enumerate() {
            let n = i + 1;
            let next = if n < events.len() { n + 1 } else { NIL };
            nodes.push(Node { op, time, is_return, partner: NIL, prev: n - 1, next });
            if is_return {
                return_node[op] = n;
            }
        }
        nodes[0].next = if events.is_empty() { NIL } else { 1 };
        for node in nodes.iter_mut().skip(1) {
            if !node.is_return {
                node.partner = return_node[node.op];
            }
        }
        EventList { nodes }
    }

    fn first(&self) -> usize {
        self.nodes[0].next
    }

    fn unlink(&mut self, n: usize) {
        let (prev, next) = (self.nodes[n].prev, self.nodes[n].next);
        self.nodes[prev].next = next;
        if next != NIL {
            self.nodes[next].prev = prev;
        }
    }

    /// Undoes `unlink(n)`; valid because links are restored in reverse order of removal.
    fn relink(&mut self, n: usize) {
        let (prev, next) = (self.nodes[n].prev, self.nodes[n].next);
        self.nodes[prev].next = n;
        if next != NIL {
            self.nodes[next].prev = n;
        }
    }

    fn lift(&mut self, call: usize) {
        self.unlink(call);
        let ret = self.nodes[call].partner;
        if ret != NIL {
            self.unlink(ret);
        }
    }

    fn unlift(&mut self, call: usize) {
        let ret = self.nodes[call].partner;
        if ret != NIL {
            self.relink(ret);
        }
        self.relink(call);
    }

    /// The calls before the first return, and that return's node (NIL if none).
    fn window(&self) -> (Vec<usize>, usize) {
        let mut calls = Vec::new();
        let mut n = self.first();
        while n != NIL && !self.nodes[n].is_return {
            calls.push(n);
            n = self.nodes[n].next;
        }
        (calls, n)
    }
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct Bitset(Box<[u64]>);

impl Bitset {
    fn new(bits: usize) -> Self {
        Bitset(vec![0; bits.div_ceil(64)].into_boxed_slice())
    }

    fn set(&mut self, bit: usize) {
        self.0[bit / 64] |= 1 << (bit % 64);
    }

    fn clear(&mut self, bit: usize) {
        self.0[bit / 64] &= !(1 << (bit % 64));
    }

    fn is_subset_of(&self, other: &Bitset) -> bool {
        self.0.iter().zip(other.0.iter()).all(|(a, b)| a & !b == 0)
    }
}

struct CacheEntry<S> {
    acknowledged: Bitset,
    state: S,
    unknown: Bitset,
}

/// Visited configurations, bucketed by a hash of (acknowledged set, state).
struct Cache<S> {
    buckets: HashMap<u64, Vec<CacheEntry<S>>>,
}

impl<S: Clone + Eq + Hash> Cache<S> {
    /// Records the configuration unless one that subsumes it was visited: same acknowledged set
    /// and state, a subset of the unknown operations (so at least the same options left).
    fn insert_if_new(&mut self, acknowledged: &Bitset, unknown: &Bitset, state: &S) -> bool {
        let mut hasher = DefaultHasher::new();
        acknowledged.hash(&mut hasher);
        state.hash(&mut hasher);
        let bucket = self.buckets.entry(hasher.finish()).or_default();
        let seen = bucket.iter().any(|entry| {
            entry.acknowledged == *acknowledged && entry.state == *state && entry.unknown.is_subset_of(unknown)
        });
        if !seen {
            bucket.push(CacheEntry {
                acknowledged: acknowledged.clone(),
                state: state.clone(),
                unknown: unknown.clone(),
            });
        }
        !seen
    }
}

struct Frame<S> {
    /// The call node, in the unknown list if `unknown`, else in the acknowledged list.
    call: usize,
    unknown: bool,
    before: S,
    /// An observation linearized without trying alternatives: backtracking goes past it.
    forced: bool,
}

/// The search's position: the configuration and how it got there.
struct Walk<S> {
    state: S,
    done: Bitset,
    done_unknown: Bitset,
    cache: Cache<S>,
    stack: Vec<Frame<S>>,
    /// Acknowledged operations not linearized yet.
    remaining: usize,
}

/// The dead end with the most acknowledged operations linearized: what a violation reports.
struct Deepest<S> {
    depth: usize,
    /// Linearized operations, in order.
    prefix: Vec<usize>,
    /// Position in `prefix` of the last operation that changed the state.
    setter: Option<usize>,
    state: S,
    /// Operations that could have come next (calls before the first return).
    window: Vec<usize>,
    /// The operation whose return ended the window.
    blocker: Option<usize>,
}

enum Searched<S> {
    Linearizable,
    Violation(Deepest<S>),
    Inconclusive,
}

struct SearchOp<'a, M: Model> {
    input: &'a M::Input,
    /// `None` for an unknown outcome.
    output: Option<&'a M::Output>,
    /// Bit in the acknowledged or the unknown set.
    slot: usize,
    /// Acknowledged, and never changes the state (see [`Model::is_observation`]).
    observation: bool,
}

struct Search<'m, 'a, M: Model> {
    model: &'m M,
    ops: Vec<SearchOp<'a, M>>,
    /// Calls and returns of acknowledged operations.
    answered: EventList,
    /// Calls of operations with an unknown outcome: they have no return, so they never close
    /// the window of operations that may come next, and acknowledged ones are tried first.
    unknown: EventList,
    acknowledged_count: usize,
    unknown_count: usize,
}

impl<'m, 'a, M: Model> Search<'m, 'a, M> {
    fn new(model: &'m M, part: &[&'a Operation<M::Input, M::Output>]) -> Self {
        let (mut acknowledged_count, mut unknown_count) = (0, 0);
        let mut ops = Vec::with_capacity(part.len());
        let mut answered = Vec::with_capacity(2 * part.len());
        let mut unknown = Vec::new();
        for (index, op) in part.iter().enumerate() {
            let (output, slot) = match (&op.outcome, op.return_ns) {
                (Outcome::Ok(output), Some(return_ns)) => {
                    answered.push((op.call_ns, false, index));
                    answered.push((return_ns, true, index));
                    acknowledged_count += 1;
                    (Some(output), acknowledged_count - 1)
                }
                // check() drops failed operations and validate() rejects answers without a
                // return; anything else may or may not have taken effect.
                _ => {
                    unknown.push((op.call_ns, false, index));
                    unknown_count += 1;
                    (None, unknown_count - 1)
                }
            };
            let observation = output.is_some_and(|output| model.is_observation(&op.input, output));
            ops.push(SearchOp { input: &op.input, output, slot, observation });
        }
        answered.sort_unstable();
        unknown.sort_unstable();
        Search {
            model,
            answered: EventList::new(&answered, ops.len()),
            unknown: EventList::new(&unknown, ops.len()),
            ops,
            acknowledged_count,
            unknown_count,
        }
    }

    fn run(mut self, budget: &mut Budget) -> Searched<M::State> {
        let mut walk = Walk {
            state: self.model.init(),
            done: Bitset::new(self.acknowledged_count),
            done_unknown: Bitset::new(self.unknown_count),
            cache: Cache { buckets: HashMap::new() },
            stack: Vec::new(),
            remaining: self.acknowledged_count,
        };
        walk.cache.insert_if_new(&walk.done, &walk.done_unknown, &walk.state);
        let mut deepest: Option<Deepest<M::State>> = None;
        // Scanning the window of acknowledged operations, or (after it) of unknown ones, which
        // ends at the first return of an acknowledged operation.
        let mut unknown_phase = false;
        let mut entry = self.answered.first();
        let mut unknown_until = 0;
        // Whether `walk` has just reached a configuration not looked at yet.
        let mut fresh = true;
        loop {
            if walk.remaining == 0 {
                return Searched::Linearizable;
            }
            if budget.exhausted() {
                return Searched::Inconclusive;
            }

            let dead_end;
            if std::mem::take(&mut fresh)
                && let Some(call) = self.observation_that_fits(&walk.state)
            {
                // Linearizing it now is as good as any later point, so no alternative is tried.
                let next = walk.state.clone();
                if self.linearize(&mut walk, call, false, next, true) {
                    entry = self.answered.first();
                    fresh = true;
                    continue;
                }
                dead_end = true;
            } else if !unknown_phase {
                if entry == NIL || self.answered.nodes[entry].is_return {
                    // Recorded before unknown operations are tried, so that the report shows
                    // the simplest prefix.
                    let depth = self.acknowledged_count - walk.remaining;
                    if deepest.as_ref().is_none_or(|d| depth > d.depth) {
                        deepest = Some(self.snapshot(depth, &walk));
                    }
                    if self.unknown_count > 0 {
                        unknown_phase = true;
                        unknown_until = self.first_return_time();
                        entry = self.unknown.first();
                        continue;
                    }
                    dead_end = true;
                } else {
                    let op = &self.ops[self.answered.nodes[entry].op];
                    if let Some(output) = op.output
                        && let Some(next) = self.model.step(&walk.state, op.input, output)
                        && self.linearize(&mut walk, entry, false, next, false)
                    {
                        entry = self.answered.first();
                        fresh = true;
                        continue;
                    }
                    entry = self.answered.nodes[entry].next;
                    continue;
                }
            } else if entry == NIL || self.unknown.nodes[entry].time > unknown_until {
                dead_end = true;
            } else {
                let op = &self.ops[self.unknown.nodes[entry].op];
                // An unknown operation that would leave the state as it is changes nothing.
                if let Some(next) = self.model.step_unknown(&walk.state, op.input)
                    && next != walk.state
                    && self.linearize(&mut walk, entry, true, next, false)
                {
                    unknown_phase = false;
                    entry = self.answered.first();
                    fresh = true;
                    continue;
                }
                entry = self.unknown.nodes[entry].next;
                continue;
            }

            debug_assert!(dead_end);
            // Backtrack to the last choice that had alternatives.
            loop {
                let Some(frame) = walk.stack.pop() else {
                    return Searched::Violation(deepest.unwrap_or_else(|| self.snapshot(0, &walk)));
                };
                let list = if frame.unknown { &mut self.unknown } else { &mut self.answered };
                list.unlift(frame.call);
                let op = &self.ops[list.nodes[frame.call].op];
                if frame.unknown {
                    walk.done_unknown.clear(op.slot);
                } else {
                    walk.done.clear(op.slot);
                    walk.remaining += 1;
                }
                walk.state = frame.before;
                if !frame.forced {
                    unknown_phase = frame.unknown;
                    entry = list.nodes[frame.call].next;
                    if unknown_phase {
                        unknown_until = self.first_return_time();
                    }
                    break;
                }
            }
        }
    }

    /// The time of the first return still in the list: unknown operations called later cannot
    /// come next.
    fn first_return_time(&self) -> u64 {
        let (_, ret) = self.answered.window();
        if ret == NIL { u64::MAX } else { self.answered.nodes[ret].time }
    }

    /// An acknowledged observation (see [`Model::is_observation`]) that may come next and fits
    /// `state`.
    fn observation_that_fits(&self, state: &M::State) -> Option<usize> {
        let mut n = self.answered.first();
        while n != NIL && !self.answered.nodes[n].is_return {
            let op = &self.ops[self.answered.nodes[n].op];
            if let Some(output) = op.output
                && op.observation
                && self.model.step(state, op.input, output).is_some()
            {
                return Some(n);
            }
            n = self.answered.nodes[n].next;
        }
        None
    }

    /// Linearizes the operation of `call` (a node of the unknown list if `unknown`), leading to
    /// state `next`, unless that configuration has been explored before.
    fn linearize(
        &mut self,
        walk: &mut Walk<M::State>,
        call: usize,
        unknown: bool,
        next: M::State,
        forced: bool,
    ) -> bool {
        let list = if unknown { &mut self.unknown } else { &mut self.answered };
        let slot = self.ops[list.nodes[call].op].slot;
        let set = if unknown { &mut walk.done_unknown } else { &mut walk.done };
        set.set(slot);
        if !walk.cache.insert_if_new(&walk.done, &walk.done_unknown, &next) {
            let set = if unknown { &mut walk.done_unknown } else { &mut walk.done };
            set.clear(slot);
            return false;
        }
        if !unknown {
            walk.remaining -= 1;
        }
        walk.stack.push(Frame { call, unknown, before: std::mem::replace(&mut walk.state, next), forced });
        list.lift(call);
        true
    }

    fn snapshot(&self, depth: usize, walk: &Walk<M::State>) -> Deepest<M::State> {
        let prefix: Vec<usize> = walk
            .stack
            .iter()
            .map(|frame| {
                let list = if frame.unknown { &self.unknown } else { &self.answered };
                list.nodes[frame.call].op
            })
            .collect();
        let mut setter = None;
        let mut after = &walk.state;
        for (position, frame) in walk.stack.iter().enumerate().rev() {
            if frame.before != *after {
                setter = Some(position);
                break;
            }
            after = &frame.before;
        }
        let (calls, ret) = self.answered.window();
        let mut window: Vec<usize> = calls.iter().map(|&n| self.answered.nodes[n].op).collect();
        let until = self.first_return_time();
        let mut n = self.unknown.first();
        while n != NIL && self.unknown.nodes[n].time <= until {
            window.push(self.unknown.nodes[n].op);
            n = self.unknown.nodes[n].next;
        }
        let blocker = (ret != NIL).then(|| self.answered.nodes[ret].op);
        Deepest { depth, prefix, setter, state: walk.state.clone(), window, blocker }
    }
}

fn fmt_ns(ns: u64) -> String {
    format!("{}.{:09}s", ns / 1_000_000_000, ns % 1_000_000_000)
}

fn describe<I: fmt::Debug, O: fmt::Debug>(op: &Operation<I, O>) -> String {
    let ret = match (&op.outcome, op.return_ns) {
        (Outcome::Ok(_) | Outcome::Fail, Some(ret)) => fmt_ns(ret),
        _ => "?".to_owned(),
    };
    let outcome = match &op.outcome {
        Outcome::Ok(output) => format!("{output:?}"),
        Outcome::Fail => "failed".to_owned(),
        Outcome::Unknown => "unknown outcome".to_owned(),
    };
    format!("#{} client {} [{} .. {}] {:?} -> {}", op.id, op.client, fmt_ns(op.call_ns), ret, op.input, outcome)
}

fn explain<M: Model>(
    model: &M,
    key: String,
    part: &[&OperationOf<M>],
    deepest: &Deepest<M::State>,
) -> Violation<M::Input, M::Output>
where
    M::Input: Clone,
    M::Output: Clone,
{
    use std::fmt::Write as _;

    let acknowledged = part.iter().filter(|op| matches!(op.outcome, Outcome::Ok(_))).count();
    let unknown = part.len() - acknowledged;
    let mut text = format!(
        "key {key:?}: not linearizable: no order of its {acknowledged} acknowledged operations{} is consistent \
         with real time and the model; the longest consistent prefix has {} of them.\n",
        if unknown == 0 {
            String::new()
        } else {
            format!(" (and {unknown} with unknown outcome, each taking effect anywhere after its call, or never)")
        },
        deepest.depth
    );
    let mut relevant = Vec::new();
    if deepest.prefix.is_empty() {
        let _ = writeln!(text, "No operation can be the first; the initial state is {:?}.", model.init());
    } else {
        let from = deepest.setter.unwrap_or(deepest.prefix.len()).min(deepest.prefix.len().saturating_sub(3));
        let _ = writeln!(text, "It ends with:");
        if from > 0 {
            let _ = writeln!(text, "  ... {from} earlier operations");
        }
        for (position, &op) in deepest.prefix.iter().enumerate().skip(from) {
            let mark = if Some(position) == deepest.setter { "  (last to change the state)" } else { "" };
            let _ = writeln!(text, "  {}{mark}", describe(part[op]));
        }
        let _ = writeln!(text, "leaving the state at {:?}.", deepest.state);
        if let Some(setter) = deepest.setter {
            relevant.push(deepest.prefix[setter]);
        }
    }
    let _ = writeln!(text, "None of the operations that may come next fits:");
    // Unknown operations stay candidates for the rest of the history: show the latest few.
    const UNKNOWN_SHOWN: usize = 5;
    let pending_unknown = deepest.window.iter().filter(|&&op| !matches!(part[op].outcome, Outcome::Ok(_))).count();
    let mut unknown_skipped = pending_unknown.saturating_sub(UNKNOWN_SHOWN);
    for &op in &deepest.window {
        let operation = part[op];
        let why = match &operation.outcome {
            Outcome::Ok(output) => match model.step(&deepest.state, &operation.input, output) {
                None => format!("impossible in state {:?}", deepest.state),
                Some(_) => "possible here, but then the remaining operations cannot be ordered".to_owned(),
            },
            Outcome::Fail | Outcome::Unknown if unknown_skipped > 0 => {
                unknown_skipped -= 1;
                continue;
            }
            Outcome::Fail | Outcome::Unknown => "taking effect here (or later, or never) does not help".to_owned(),
        };
        let _ = writeln!(text, "  {}: {why}", describe(operation));
        relevant.push(op);
    }
    if pending_unknown > UNKNOWN_SHOWN {
        let _ = writeln!(
            text,
            "  (and {} earlier operations with unknown outcome, which do not help either)",
            pending_unknown - UNKNOWN_SHOWN
        );
    }
    if let Some(blocker) = deepest.blocker {
        let operation = part[blocker];
        if let Some(ret) = operation.return_ns {
            let _ = writeln!(
                text,
                "#{} returned at {}, so it must take effect before anything called after that.",
                operation.id,
                fmt_ns(ret)
            );
        }
        relevant.push(blocker);
    }
    relevant.sort_unstable();
    relevant.dedup();
    let mut ops: Vec<OperationOf<M>> = relevant.iter().map(|&op| part[op].clone()).collect();
    ops.sort_by_key(|op| op.id);
    Violation { key, explanation: text, ops, longest_prefix: deepest.depth, acknowledged }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lift_and_unlift_restore_the_list() {
        // Operation 0 is called at 0 and returns at 10, operation 1 is called at 5, returns at 15.
        let mut list = EventList::new(&[(0, false, 0), (5, false, 1), (10, true, 0), (15, true, 1)], 2);
        let order = |list: &EventList| {
            let mut seen = Vec::new();
            let mut n = list.first();
            while n != NIL {
                seen.push((list.nodes[n].op, list.nodes[n].is_return));
                n = list.nodes[n].next;
            }
            seen
        };
        let before = order(&list);
        assert_eq!(before, [(0, false), (1, false), (0, true), (1, true)]);
        let (first, second) = (list.first(), list.nodes[list.first()].next);
        assert_eq!(list.window(), (vec![first, second], 3));
        list.lift(first);
        assert_eq!(order(&list), [(1, false), (1, true)]);
        list.lift(second);
        assert_eq!(order(&list), []);
        list.unlift(second);
        list.unlift(first);
        assert_eq!(order(&list), before);
    }

    #[test]
    fn cache_subsumes_configurations_with_more_optional_operations() {
        let mut cache = Cache { buckets: HashMap::new() };
        let acknowledged = Bitset::new(3);
        let mut unknown = Bitset::new(2);
        assert!(cache.insert_if_new(&acknowledged, &unknown, &Some(1)));
        unknown.set(1);
        assert!(!cache.insert_if_new(&acknowledged, &unknown, &Some(1)), "superset of unknowns is subsumed");
        assert!(cache.insert_if_new(&acknowledged, &unknown, &Some(2)), "other state");
        let mut other = Bitset::new(3);
        other.set(0);
        assert!(cache.insert_if_new(&other, &Bitset::new(2), &Some(1)), "other acknowledged set");
    }
}
