//! Timings of loading a repository of 10,000 manifests (Deployments, Services, ConfigMaps,
//! Secrets; one in ten a template): cold, warm, after one-file commits, against the bare YAML
//! parse of the same bytes. A benchmark, not a test: it asserts behaviour (one file re-validated
//! per one-file commit), never speed, and prints
//!
//! ```text
//! cargo test -p gitplane-source --release --test t80_load_10k -- --ignored --nocapture
//! ```
//!
//! Times are the CPU time of the loading thread (best of a few runs where it repeats): on a
//! shared 2-core machine, wall-clock time mostly measures the neighbours.

mod common;

use common::Repo;
use gitplane_source::{
    AppSource, Limits, ManifestFile, SourceCache, Validator, load_commit, load_files, read_commit, read_head,
};
use std::{collections::BTreeMap, path::Path, time::Duration};

const FILES: usize = 10_000;

/// The `i`th file: its path and text.
fn manifest(i: usize) -> (String, String) {
    let dir = format!("deploy/team-{:02}", i / 100);
    let text = match i % 4 {
        0 => format!(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web-{i}\n  labels:\n    app: web-{i}\n    tier: frontend\n\
             spec:\n  replicas: 2\n  selector:\n    matchLabels:\n      app: web-{i}\n  template:\n    metadata:\n      labels:\n\
             \x20       app: web-{i}\n    spec:\n      containers:\n        - name: web\n          image: gitplane.local/httpd:1\n\
             \x20         args: [\"-f\", \"-p\", \"80\"]\n          env:\n            - name: MODE\n              value: production\n\
             \x20           - name: LEVEL\n              value: info\n          ports:\n            - containerPort: 80\n\
             \x20             name: http\n          resources:\n            requests: {{cpu: 100m, memory: 32Mi}}\n\
             \x20           limits: {{cpu: 200m, memory: 64Mi}}\n          readinessProbe:\n            httpGet: {{path: /, port: 80}}\n\
             \x20           periodSeconds: 5\n"
        ),
        1 => format!(
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: web-{i}\n  labels:\n    app: web-{i}\nspec:\n  selector:\n\
             \x20   app: web-{i}\n  ports:\n    - name: http\n      port: 80\n      targetPort: 80\n      protocol: TCP\n"
        ),
        2 => {
            let data: String = (0..24)
                .map(|k| format!("  key{k}: \"value number {k} of config map {i}, padded with some text\"\n"))
                .collect();
            format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings-{i}\ndata:\n{data}")
        }
        _ => {
            let data: String =
                (0..16).map(|k| format!("  password{k}: \"s3cr3t-{k}-{i}-aaaaaaaaaaaaaaaaaaaaaaaa\"\n")).collect();
            format!("apiVersion: v1\nkind: Secret\nmetadata:\n  name: creds-{i}\ntype: Opaque\nstringData:\n{data}")
        }
    };
    // One in ten is a template: the same object, with its replicas or a label from the values.
    if i.is_multiple_of(10) {
        let text =
            text.replace("replicas: 2", "replicas: {{ replicas }}").replace("tier: frontend", "tier: {{ tier }}");
        (format!("{dir}/m{i:05}.yaml.j2"), text)
    } else {
        (format!("{dir}/m{i:05}.yaml"), text)
    }
}

/// What the templates render to with [`app`]'s values.
fn rendered(text: &str) -> String {
    text.replace("{{ replicas }}", "3").replace("{{ tier }}", "frontend")
}

fn app() -> AppSource {
    let values = BTreeMap::from([("replicas".to_owned(), 3.into()), ("tier".to_owned(), "frontend".into())]);
    AppSource { path: "deploy".into(), default_namespace: "default".into(), values, ..AppSource::default() }
}

/// CPU time of this thread.
fn cpu() -> Duration {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `t` is a valid timespec for the call to write.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    assert_eq!(rc, 0);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// The CPU time of `f`, and its result.
fn timed<T>(f: impl FnOnce() -> T) -> (Duration, T) {
    let started = cpu();
    let out = f();
    (cpu() - started, out)
}

/// The best CPU time of `runs` runs of `f`.
fn best<T>(runs: usize, mut f: impl FnMut() -> T) -> Duration {
    (0..runs).map(|_| timed(&mut f).0).min().unwrap_or_default()
}

fn ms(d: Duration) -> String {
    format!("{:7.1} ms", d.as_secs_f64() * 1000.0)
}

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    samples[((samples.len() as f64 - 1.0) * p).round() as usize]
}

fn load(repo: &Path, validator: &Validator, cache: &mut SourceCache) -> usize {
    let head = read_head(repo, "main").unwrap();
    load_commit(&head, &app(), validator, &Limits::default(), cache).unwrap().len()
}

#[test]
#[ignore = "benchmark: cargo test -p gitplane-source --release --test t80_load_10k -- --ignored --nocapture"]
fn t80_load_10k_manifests() {
    let mut files: BTreeMap<String, String> = (0..FILES).map(manifest).collect();
    let bytes: usize = files.values().map(|t| rendered(t).len()).sum();
    let validator = Validator::new();
    let limits = Limits::default();
    println!(
        "{FILES} manifests, {:.1} MiB of YAML (rendered), {} templates",
        bytes as f64 / (1 << 20) as f64,
        FILES / 10
    );

    let in_memory: Vec<ManifestFile> =
        files.iter().map(|(path, text)| ManifestFile::new(path.clone(), text.clone().into_bytes())).collect();

    // What a cache holding this commit keeps in memory (objects, and the text to find lines),
    // measured first: later runs reuse freed memory.
    let rss = || {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let kb = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).and_then(|v| v.trim().strip_suffix(" kB"));
        kb.and_then(|kb| kb.trim().parse::<u64>().ok()).unwrap_or(0)
    };
    let before = rss();
    let mut kept = SourceCache::new();
    let manifests = load_files(&in_memory, &app(), &validator, &limits, &mut kept).unwrap();
    drop(manifests);
    println!(
        "memory of a cache holding the commit:         {:7.1} MiB (resident growth)",
        (rss() - before) as f64 / 1024.0
    );
    drop(kept);

    // The baseline: serde_yaml into JSON values of the same (rendered) bytes, nothing else.
    let plain: Vec<String> = files.values().map(|t| rendered(t)).collect();
    let bare = best(5, || {
        for text in &plain {
            for document in serde_yaml::Deserializer::from_str(text) {
                let value: serde_json::Value = serde::Deserialize::deserialize(document).unwrap();
                std::hint::black_box(value);
            }
        }
    });
    let cold = best(5, || {
        let manifests = load_files(&in_memory, &app(), &validator, &limits, &mut SourceCache::new()).unwrap();
        assert_eq!(manifests.len(), FILES);
    });
    println!("bare serde_yaml parse, same bytes:            {}", ms(bare));
    println!(
        "render + parse + validate, cold (in memory):  {}  = {:.2}x the bare parse",
        ms(cold),
        cold.as_secs_f64() / bare.as_secs_f64()
    );

    // The most a hostile template costs: it runs until its fuel is spent.
    let busy = [ManifestFile::new(
        "deploy/busy.yaml.j2",
        b"{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}".to_vec(),
    )];
    let (spent, loaded) = timed(|| load_files(&busy, &app(), &validator, &limits, &mut SourceCache::new()));
    let Err(gitplane_source::LoadError::Invalid(errors)) = loaded else { panic!("the busy template rendered") };
    assert!(errors[0].message.starts_with("the template does too much work"), "{errors:?}");
    println!("a template that never ends, stopped by fuel:  {}", ms(spent));

    let repo = Repo::new();
    repo.commit(&files);
    for objects in ["loose", "packed"] {
        if objects == "packed" {
            let gc = std::process::Command::new("git").arg("-C").arg(&repo.path).args(["gc", "-q"]).status();
            if !gc.is_ok_and(|s| s.success()) {
                println!("(git gc failed: no packed timings)");
                break;
            }
        }
        let read =
            best(3, || assert_eq!(read_commit(&repo.path, "main", "deploy", &limits).unwrap().files.len(), FILES));
        let cold = best(3, || assert_eq!(load(&repo.path, &validator, &mut SourceCache::new()), FILES));
        let mut cache = SourceCache::new();
        load(&repo.path, &validator, &mut cache);
        let again = best(5, || load(&repo.path, &validator, &mut cache));
        println!("[{objects:6}] read_commit, every blob read:       {}", ms(read));
        println!("[{objects:6}] load_commit, cold:                  {}", ms(cold));
        println!("[{objects:6}] load_commit, same commit again:     {}", ms(again));

        // One-file commits, each its own file (a template one time in ten).
        let mut samples = Vec::new();
        for round in 0..30 {
            let (path, _) = manifest((round * 37 + 1) % FILES);
            files.get_mut(&path).unwrap().push_str(&format!("# edited in round {round} of the {objects} run\n"));
            repo.commit(&files);
            let before = cache.stats();
            let (took, n) = timed(|| load(&repo.path, &validator, &mut cache));
            assert_eq!(n, FILES);
            assert_eq!(cache.stats().processed - before.processed, 1, "only the changed file is validated again");
            assert_eq!(cache.stats().read - before.read, 1, "only the changed blob is read");
            samples.push(took);
        }
        println!(
            "[{objects:6}] load_commit, one-file commit:       p50 {}, p99 {} (30 commits)",
            ms(percentile(&mut samples, 0.5)),
            ms(percentile(&mut samples, 0.99))
        );
    }
}
