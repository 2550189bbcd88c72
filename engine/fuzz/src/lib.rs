//! A mutation fuzzer small enough to run on stable Rust inside `cargo test`, for every parser
//! that faces outside input (manifests, templates, webhook payloads, label selectors, continue
//! tokens, query parameters). Each crate fuzzes its own parsers from its tests with [`fuzz`], so
//! private entry points can be reached without widening any API.
//!
//! It is not coverage-guided: it mutates a corpus of real inputs (bit flips, interesting bytes,
//! insertions, deletions, duplications, splices between corpus entries, and the target's
//! dictionary of tokens, such as YAML indicators or selector operators) for a bounded time,
//! `GITPLANE_FUZZ_SECONDS` per target (default 2), from `GITPLANE_FUZZ_SEED` or a fresh seed.
//! A panic is a failure: the test fails with the seed, the input (escaped), and a copy of the
//! input under `$TMPDIR/gitplane-fuzz/`, to become a regression case.

use std::{
    panic::{AssertUnwindSafe, catch_unwind},
    time::{Duration, Instant},
};

/// What one target is fed from.
pub struct Target<'a> {
    pub name: &'a str,
    /// Real, valid inputs to start from.
    pub seeds: &'a [&'a [u8]],
    /// Tokens that mean something to the parser.
    pub dictionary: &'a [&'a [u8]],
    /// Inputs larger than this are cut (the parsers' own limits are tested elsewhere).
    pub max_len: usize,
}

/// xorshift64*: fast, seedable, and enough for choosing mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        if n == 0 { 0 } else { (self.next() % n as u64) as usize }
    }
}

const INTERESTING: &[u8] = &[0, 1, 0x7f, 0x80, 0xff, b'\n', b'\r', b'\t', b' ', b'"', b'\'', b'\\', b'%', b'{', b'}'];

fn mutate(rng: &mut Rng, input: &mut Vec<u8>, target: &Target<'_>) {
    for _ in 0..1 + rng.below(4) {
        let len = input.len();
        match rng.below(9) {
            0 if len > 0 => {
                let at = rng.below(len);
                input[at] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let at = rng.below(len);
                input[at] = INTERESTING[rng.below(INTERESTING.len())];
            }
            2 => {
                let at = rng.below(len + 1);
                let n = 1 + rng.below(8);
                let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                input.splice(at..at, bytes);
            }
            3 if len > 0 => {
                let at = rng.below(len);
                let n = 1 + rng.below((len - at).min(64));
                input.drain(at..at + n);
            }
            4 if len > 0 => {
                let at = rng.below(len);
                let n = 1 + rng.below((len - at).min(64));
                let copy = input[at..at + n].to_vec();
                let to = rng.below(len + 1);
                input.splice(to..to, copy);
            }
            5 if !target.seeds.is_empty() => {
                let other = target.seeds[rng.below(target.seeds.len())];
                let (from, to) = (rng.below(other.len() + 1), rng.below(len + 1));
                let n = rng.below(other.len() - from + 1);
                input.splice(to..to, other[from..from + n].iter().copied());
            }
            6 | 7 if !target.dictionary.is_empty() => {
                let token = target.dictionary[rng.below(target.dictionary.len())];
                let at = rng.below(len + 1);
                input.splice(at..at, token.iter().copied());
            }
            _ if len > 1 => {
                // Cut at a random point: truncated input is what a stalled peer sends.
                input.truncate(rng.below(len));
            }
            _ => input.push(rng.next() as u8),
        }
    }
    input.truncate(target.max_len);
}

thread_local! {
    static FUZZING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The expected panics of a fuzzing thread are not printed; other threads' (tests running in
/// parallel) still are.
fn silence_panics_on_this_thread() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let print = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !FUZZING.with(|f| f.get()) {
                print(info);
            }
        }));
    });
    FUZZING.with(|f| f.set(true));
}

fn budget() -> Duration {
    let seconds = std::env::var("GITPLANE_FUZZ_SECONDS").ok().and_then(|s| s.parse::<f64>().ok()).unwrap_or(2.0);
    Duration::from_secs_f64(seconds.clamp(0.0, 86_400.0))
}

fn seed() -> u64 {
    std::env::var("GITPLANE_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        (nanos as u64) | 1
    })
}

/// Runs `check` on the seeds, then on mutants of them until the time budget is spent; panics
/// (failing the test) with a reproducible report when `check` panics. Returns how many inputs ran.
pub fn fuzz(target: Target<'_>, check: impl Fn(&[u8])) -> u64 {
    let seed = seed();
    let mut rng = Rng(seed);
    let deadline = Instant::now() + budget();
    let mut runs = 0u64;
    let mut corpus: Vec<Vec<u8>> = target.seeds.iter().map(|s| s.to_vec()).collect();
    if corpus.is_empty() {
        corpus.push(Vec::new());
    }
    let mut next = |runs: u64, rng: &mut Rng| -> Vec<u8> {
        if (runs as usize) < corpus.len() {
            return corpus[runs as usize].clone();
        }
        let mut input = corpus[rng.below(corpus.len())].clone();
        mutate(rng, &mut input, &target);
        // Keep some mutants as new starting points, so mutations compound.
        if rng.below(16) == 0 && corpus.len() < 4096 {
            corpus.push(input.clone());
        }
        input
    };
    silence_panics_on_this_thread();
    let mut failure = None;
    while runs < target.seeds.len() as u64 || Instant::now() < deadline {
        let input = next(runs, &mut rng);
        runs += 1;
        if let Err(panic) = catch_unwind(AssertUnwindSafe(|| check(&input))) {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            failure = Some((input, message));
            break;
        }
    }
    FUZZING.with(|f| f.set(false));
    if let Some((input, message)) = failure {
        let dir = std::env::temp_dir().join("gitplane-fuzz");
        let file = dir.join(format!("{}-{seed}", target.name));
        let saved = std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&file, &input));
        panic!(
            "fuzz target {} panicked after {runs} inputs (GITPLANE_FUZZ_SEED={seed}): {message}\ninput ({} bytes{}): {}",
            target.name,
            input.len(),
            if saved.is_ok() { format!(", saved to {}", file.display()) } else { String::new() },
            input.escape_ascii(),
        );
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_planted_bug_and_reports_the_input() {
        let target = Target { name: "planted", seeds: &[b"hello"], dictionary: &[b"BUG"], max_len: 64 };
        let found = catch_unwind(|| {
            fuzz(target, |input| {
                if input.windows(3).any(|w| w == b"BUG") {
                    panic!("planted");
                }
            })
        });
        let message = found.expect_err("the planted bug is found").downcast::<String>().unwrap();
        assert!(message.contains("planted") && message.contains("GITPLANE_FUZZ_SEED="), "{message}");
    }

    #[test]
    fn mutants_stay_within_the_length_bound() {
        let target = Target { name: "bound", seeds: &[&[b'x'; 10]], dictionary: &[&[b'y'; 40]], max_len: 32 };
        let mut rng = Rng(7);
        let mut input = target.seeds[0].to_vec();
        for _ in 0..10_000 {
            mutate(&mut rng, &mut input, &target);
            assert!(input.len() <= 32);
        }
    }
}
