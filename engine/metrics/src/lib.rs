//! Prometheus metrics: counters, gauges and histograms in families with a fixed set of label
//! names, kept in the process's one [`registry`] and written in the text exposition format
//! (version 0.0.4, what Kubernetes components serve on `/metrics`).
//!
//! Each component declares its families once (a `LazyLock` of a struct of them) and registers
//! them by forcing it when it starts, so a family shows (with no series yet, or at zero) before
//! anything happened. Label values come from a bounded set by construction (kinds, results,
//! Application names); a family still holds at most [`MAX_SERIES`] series, past which new
//! label sets are counted under [`OVERFLOW`], so no outside input grows memory without bound.

pub mod parse;

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    sync::{
        Arc, Mutex, OnceLock,
        atomic::{AtomicI64, AtomicU64, Ordering},
    },
    time::Duration,
};

/// The most series one family holds.
pub const MAX_SERIES: usize = 1_000;
/// The label value of every label of the series that takes what no longer fits.
pub const OVERFLOW: &str = "overflow";
/// The `Content-Type` of [`Registry::encode`]'s text.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Latencies of requests and writes: 1 ms to 60 s.
pub const LATENCY_BUCKETS: &[f64] =
    &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];
/// Slow operations (a sync, a fetch, a Pod start): 100 ms to 10 min.
pub const SLOW_BUCKETS: &[f64] =
    &[0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 8.0, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 120.0, 300.0, 600.0];

/// One series' value and how it is written.
pub trait Metric: Send + Sync + 'static {
    const TYPE: &'static str;
    /// Writes the series' sample lines; `labels` is `a="x",b="y"` (possibly empty).
    fn encode(&self, name: &str, labels: &str, out: &mut String);
}

/// A value that only goes up.
#[derive(Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn inc(&self) {
        self.inc_by(1);
    }

    pub fn inc_by(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

impl Metric for Counter {
    const TYPE: &'static str = "counter";
    fn encode(&self, name: &str, labels: &str, out: &mut String) {
        sample(out, name, "", labels, self.get());
    }
}

/// A value that goes up and down.
#[derive(Default)]
pub struct Gauge(AtomicI64);

impl Gauge {
    pub fn set(&self, v: i64) {
        self.0.store(v, Ordering::Relaxed);
    }

    pub fn add(&self, v: i64) {
        self.0.fetch_add(v, Ordering::Relaxed);
    }

    pub fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

impl Metric for Gauge {
    const TYPE: &'static str = "gauge";
    fn encode(&self, name: &str, labels: &str, out: &mut String) {
        sample(out, name, "", labels, self.get());
    }
}

/// Observations counted into buckets (upper bounds, ascending), with their sum.
pub struct Histogram {
    bounds: &'static [f64],
    /// Per bucket, not cumulative; the last is `+Inf`.
    counts: Box<[AtomicU64]>,
    /// An `f64`'s bits.
    sum: AtomicU64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0f64.to_bits()),
        }
    }

    pub fn observe(&self, v: f64) {
        let i = self.bounds.iter().position(|b| v <= *b).unwrap_or(self.bounds.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        let mut old = self.sum.load(Ordering::Relaxed);
        while let Err(now) = self.sum.compare_exchange_weak(
            old,
            (f64::from_bits(old) + v).to_bits(),
            Ordering::Relaxed,
            Ordering::Relaxed,
        ) {
            old = now;
        }
    }

    pub fn observe_duration(&self, d: Duration) {
        self.observe(d.as_secs_f64());
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    pub fn sum(&self) -> f64 {
        f64::from_bits(self.sum.load(Ordering::Relaxed))
    }
}

impl Metric for Histogram {
    const TYPE: &'static str = "histogram";
    fn encode(&self, name: &str, labels: &str, out: &mut String) {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0;
        for (i, count) in self.counts.iter().enumerate() {
            cumulative += count.load(Ordering::Relaxed);
            let le = self.bounds.get(i).map_or_else(|| "+Inf".to_owned(), |b| b.to_string());
            sample(out, name, "_bucket", &format!("{labels}{sep}le=\"{le}\""), cumulative);
        }
        sample(out, name, "_sum", labels, self.sum());
        sample(out, name, "_count", labels, cumulative);
    }
}

fn sample(out: &mut String, name: &str, suffix: &str, labels: &str, value: impl std::fmt::Display) {
    let _ = if labels.is_empty() {
        writeln!(out, "{name}{suffix} {value}")
    } else {
        writeln!(out, "{name}{suffix}{{{labels}}} {value}")
    };
}

/// A label value escaped as the text format wants it.
fn escape_value(v: &str) -> String {
    v.replace('\\', r"\\").replace('"', "\\\"").replace('\n', r"\n")
}

/// `a="x",b="y"`.
pub fn label_text(names: &[&str], values: &[&str]) -> String {
    names.iter().zip(values).map(|(n, v)| format!("{n}=\"{}\"", escape_value(v))).collect::<Vec<_>>().join(",")
}

/// Writes a family's `# HELP` and `# TYPE` lines.
pub fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    let help = help.replace('\\', r"\\").replace('\n', r"\n");
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// A gauge family whose values are read when it is scraped (what a component knows of its own
/// state, such as Raft's term), written after the registry's families.
pub fn gauge_text(out: &mut String, name: &str, help: &str, label_names: &[&str], series: &[(Vec<&str>, i64)]) {
    header(out, name, help, "gauge");
    for (values, v) in series {
        sample(out, name, "", &label_text(label_names, values), v);
    }
}

/// Series of one metric name, one per set of label values.
pub struct Family<M> {
    name: &'static str,
    help: &'static str,
    labels: &'static [&'static str],
    make: Box<dyn Fn() -> M + Send + Sync>,
    series: Mutex<BTreeMap<Vec<String>, Arc<M>>>,
}

impl<M: Metric> Family<M> {
    /// The series of `values` (one per label name, in order), made on first use.
    pub fn with(&self, values: &[&str]) -> Arc<M> {
        debug_assert_eq!(values.len(), self.labels.len(), "{}: label values", self.name);
        let mut key: Vec<String> = values.iter().map(|v| (*v).to_owned()).collect();
        let mut series = self.series.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = series.get(&key) {
            return m.clone();
        }
        if series.len() >= MAX_SERIES {
            key = vec![OVERFLOW.to_owned(); self.labels.len()];
        }
        series.entry(key).or_insert_with(|| Arc::new((self.make)())).clone()
    }
}

trait Collect: Send + Sync {
    fn encode(&self, out: &mut String);
}

impl<M: Metric> Collect for Family<M> {
    fn encode(&self, out: &mut String) {
        header(out, self.name, self.help, M::TYPE);
        let series = self.series.lock().unwrap_or_else(|e| e.into_inner());
        for (values, m) in series.iter() {
            let values: Vec<&str> = values.iter().map(String::as_str).collect();
            m.encode(self.name, &label_text(self.labels, &values), out);
        }
    }
}

/// Every family of the process, by name.
#[derive(Default)]
pub struct Registry {
    families: Mutex<BTreeMap<&'static str, Arc<dyn Collect>>>,
}

/// The process's registry.
pub fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(Registry::default)
}

impl Registry {
    fn register<M: Metric>(
        &self,
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
        make: Box<dyn Fn() -> M + Send + Sync>,
    ) -> Arc<Family<M>> {
        let family = Arc::new(Family { name, help, labels, make, series: Mutex::new(BTreeMap::new()) });
        // Names are declared once per process (statics); a second declaration is not exported.
        self.families.lock().unwrap_or_else(|e| e.into_inner()).entry(name).or_insert_with(|| family.clone());
        if labels.is_empty() {
            family.with(&[]);
        }
        family
    }

    /// Every family in the text exposition format, by name.
    pub fn encode(&self) -> String {
        let families: Vec<Arc<dyn Collect>> =
            self.families.lock().unwrap_or_else(|e| e.into_inner()).values().cloned().collect();
        let mut out = String::with_capacity(16 << 10);
        for family in families {
            family.encode(&mut out);
        }
        out
    }
}

/// A counter family in the process's registry.
pub fn counter(name: &'static str, help: &'static str, labels: &'static [&'static str]) -> Arc<Family<Counter>> {
    registry().register(name, help, labels, Box::new(Counter::default))
}

/// A gauge family in the process's registry.
pub fn gauge(name: &'static str, help: &'static str, labels: &'static [&'static str]) -> Arc<Family<Gauge>> {
    registry().register(name, help, labels, Box::new(Gauge::default))
}

/// A histogram family in the process's registry.
pub fn histogram(
    name: &'static str,
    help: &'static str,
    labels: &'static [&'static str],
    buckets: &'static [f64],
) -> Arc<Family<Histogram>> {
    registry().register(name, help, labels, Box::new(move || Histogram::new(buckets)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local<M: Metric>(
        name: &'static str,
        labels: &'static [&'static str],
        make: impl Fn() -> M + Send + Sync + 'static,
    ) -> (Registry, Arc<Family<M>>) {
        let registry = Registry::default();
        let family = registry.register(name, "what \"it\" counts\nsecond line", labels, Box::new(make));
        (registry, family)
    }

    #[test]
    fn writes_the_text_format() {
        let (registry, requests) = local("t_requests_total", &["verb", "code"], Counter::default);
        requests.with(&["GET", "200"]).inc_by(3);
        requests.with(&["LIST", "5\"0\\0\n"]).inc();
        let gauges = registry.register("t_depth", "depth", &[], Box::new(Gauge::default));
        gauges.with(&[]).set(-2);
        let latency = registry.register("t_seconds", "latency", &["op"], Box::new(|| Histogram::new(&[0.1, 1.0])));
        let h = latency.with(&["txn"]);
        for v in [0.05, 0.1, 0.5, 7.0] {
            h.observe(v);
        }
        assert_eq!(
            registry.encode(),
            "# HELP t_depth depth\n# TYPE t_depth gauge\nt_depth -2\n\
             # HELP t_requests_total what \"it\" counts\\nsecond line\n# TYPE t_requests_total counter\n\
             t_requests_total{verb=\"GET\",code=\"200\"} 3\n\
             t_requests_total{verb=\"LIST\",code=\"5\\\"0\\\\0\\n\"} 1\n\
             # HELP t_seconds latency\n# TYPE t_seconds histogram\n\
             t_seconds_bucket{op=\"txn\",le=\"0.1\"} 2\nt_seconds_bucket{op=\"txn\",le=\"1\"} 3\n\
             t_seconds_bucket{op=\"txn\",le=\"+Inf\"} 4\nt_seconds_sum{op=\"txn\"} 7.65\nt_seconds_count{op=\"txn\"} 4\n"
        );
        let parsed = parse::parse(&registry.encode()).unwrap();
        assert_eq!(parsed.value("t_requests_total", &[("code", "5\"0\\0\n")]), Some(1.0));
        assert_eq!(parsed.value("t_seconds_count", &[("op", "txn")]), Some(4.0));
        assert_eq!(parsed.kind("t_seconds"), Some("histogram"));
    }

    #[test]
    fn a_family_holds_a_bounded_number_of_series() {
        let (_registry, family) = local("t_bounded", &["key"], Counter::default);
        for i in 0..MAX_SERIES + 50 {
            family.with(&[&i.to_string()]).inc();
        }
        let series = family.series.lock().unwrap();
        assert_eq!(series.len(), MAX_SERIES + 1);
        assert_eq!(series[&vec![OVERFLOW.to_owned()]].get(), 50);
    }

    #[test]
    fn the_first_declaration_of_a_name_is_the_one_exported() {
        let registry = Registry::default();
        let first = registry.register("t_once", "first", &[], Box::new(Counter::default));
        let second = registry.register("t_once", "second", &[], Box::new(Counter::default));
        first.with(&[]).inc();
        second.with(&[]).inc_by(5);
        assert_eq!(registry.encode(), "# HELP t_once first\n# TYPE t_once counter\nt_once 1\n");
    }
}
