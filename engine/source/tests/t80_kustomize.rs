//! What a kustomization costs a push against plain YAML holding the same objects: a push is
//! judged (the verdict's load) and then synced (the sync's load), each with a cache of its own,
//! as on a server. A benchmark, not a test: it asserts behaviour (the same objects, one build
//! per changed kustomization, none for an unchanged one), never speed, and prints a table:
//!
//! ```text
//! cargo test -p gitplane-source --release --test t80_kustomize -- --ignored --nocapture
//! ```
//!
//! Times are wall-clock (kustomize runs as a child process), medians of the rounds.

mod common;

use common::Repo;
use gitplane_source::{AppSource, Limits, SourceCache, Validator, load_commit, read_head};
use std::{
    collections::BTreeMap,
    path::Path,
    time::{Duration, Instant},
};

const ROUNDS: usize = 7;

/// A kustomization as its authors keep it: its files, and the Application's path.
struct Case {
    name: String,
    files: BTreeMap<String, String>,
    path: String,
    /// A file of the kustomization a commit changes (appending a comment).
    changed: String,
}

/// A published kustomization of the corpus, with the file a commit changes.
fn published(name: &str, dir: &str, changed: &str) -> Case {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/corpus/kustomize");
    let mut files = BTreeMap::new();
    let mut stack = vec![root.join(dir)];
    while let Some(at) = stack.pop() {
        for entry in std::fs::read_dir(&at).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else {
                let relative = path.strip_prefix(&root).unwrap().to_string_lossy().into_owned();
                files.insert(relative, std::fs::read_to_string(&path).unwrap());
            }
        }
    }
    Case { name: name.into(), files, path: dir.into(), changed: format!("{dir}/{changed}") }
}

/// A base of `n` Deployments and Services (a file each) and an overlay that renames, labels,
/// re-tags and scales them: what an application's kustomization does, at size.
fn generated(n: usize) -> Case {
    let mut files = BTreeMap::new();
    let mut resources = String::from("resources:\n");
    for i in 0..n {
        files.insert(
            format!("base/web-{i}.yaml"),
            format!(
                "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web-{i}\nspec:\n  replicas: 1\n  selector:\n    \
                 matchLabels: {{app: web-{i}}}\n  template:\n    metadata:\n      labels: {{app: web-{i}}}\n    spec:\n      \
                 containers:\n      - name: web\n        image: gitplane.local/httpd:1\n        ports: [{{containerPort: 80}}]\n\
                 ---\napiVersion: v1\nkind: Service\nmetadata:\n  name: web-{i}\nspec:\n  selector: {{app: web-{i}}}\n  \
                 ports: [{{port: 80}}]\n"
            ),
        );
        resources.push_str(&format!("- web-{i}.yaml\n"));
    }
    files.insert("base/kustomization.yaml".into(), resources);
    files.insert(
        "overlays/prod/kustomization.yaml".into(),
        "resources: [../../base]\nnamePrefix: prod-\nlabels:\n- pairs: {env: prod}\nimages:\n- name: gitplane.local/httpd\n  \
         newTag: \"2\"\nconfigMapGenerator:\n- name: settings\n  literals: [mode=production]\n"
            .into(),
    );
    Case {
        name: format!("generated: base of {n} Deployments + {n} Services, overlay"),
        files,
        path: "overlays/prod".into(),
        changed: "base/web-0.yaml".into(),
    }
}

fn app(path: &str) -> AppSource {
    AppSource { path: path.into(), default_namespace: "default".into(), ..AppSource::default() }
}

/// A push's work: the verdict's load and then the sync's, each through its own cache.
fn push(repo: &Path, app: &AppSource, verdict: &mut SourceCache, sync: &mut SourceCache) -> (Duration, usize) {
    let validator = Validator::new();
    let started = Instant::now();
    let head = read_head(repo, "main").unwrap();
    let judged = load_commit(&head, app, &validator, &Limits::default(), verdict).unwrap().len();
    let synced = load_commit(&head, app, &validator, &Limits::default(), sync).unwrap().len();
    assert_eq!(judged, synced);
    (started.elapsed(), synced)
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

#[test]
#[ignore = "benchmark: cargo test -p gitplane-source --release --test t80_kustomize -- --ignored --nocapture"]
fn t80_a_kustomization_push_against_plain_yaml() {
    let cases = [
        published("Argo CD's sock-shop (kustomize)", "argocd-example-apps/sock-shop", "kustomization.yaml"),
        generated(100),
    ];
    println!(
        "| Kustomization | Objects | `kubectl kustomize` alone | plain YAML push | kustomized push, changed | ratio | \
         kustomized push, unchanged |"
    );
    println!("|---|--:|--:|--:|--:|--:|--:|");
    for case in cases {
        // The same objects as plain YAML: kustomize's own output, committed as one file.
        let dir = tempfile::TempDir::new().unwrap();
        for (path, text) in &case.files {
            let at = dir.path().join(path);
            std::fs::create_dir_all(at.parent().unwrap()).unwrap();
            std::fs::write(at, text).unwrap();
        }
        let mut alone = Vec::new();
        let mut output = String::new();
        for _ in 0..ROUNDS {
            let started = Instant::now();
            let out = std::process::Command::new("kubectl")
                .args(["kustomize", "--load-restrictor", "LoadRestrictionsRootOnly"])
                .arg(dir.path().join(&case.path))
                .output()
                .unwrap();
            alone.push(started.elapsed());
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            output = String::from_utf8(out.stdout).unwrap();
        }
        let plain = Repo::new();
        let kustomized = Repo::new();
        let (mut plain_times, mut changed_times, mut unchanged_times) = (Vec::new(), Vec::new(), Vec::new());
        let (mut plain_caches, mut kustomized_caches) =
            ((SourceCache::new(), SourceCache::new()), (SourceCache::new(), SourceCache::new()));
        let mut objects = 0;
        for round in 0..ROUNDS {
            // Each round changes one object, so kustomize has to build again.
            let mut plain_files = BTreeMap::from([("app/all.yaml".to_owned(), format!("{output}# round {round}\n"))]);
            plain.commit(&plain_files);
            let (took, n) = push(&plain.path, &app("app"), &mut plain_caches.0, &mut plain_caches.1);
            plain_times.push(took);

            let mut files = case.files.clone();
            files.get_mut(&case.changed).unwrap().push_str(&format!("# round {round}\n"));
            kustomized.commit(&files);
            let builds = kustomized_caches.0.stats().kustomize_builds + kustomized_caches.1.stats().kustomize_builds;
            let (took, k) =
                push(&kustomized.path, &app(&case.path), &mut kustomized_caches.0, &mut kustomized_caches.1);
            changed_times.push(took);
            let built = kustomized_caches.0.stats().kustomize_builds + kustomized_caches.1.stats().kustomize_builds;
            assert_eq!(built - builds, 1, "the verdict builds, the sync reuses its build");
            assert_eq!(n, k, "the same objects");
            objects = k;

            // A commit that changes nothing the kustomization reads: no build at all.
            files.insert("README.md".into(), format!("round {round}\n"));
            kustomized.commit(&files);
            let (took, _) =
                push(&kustomized.path, &app(&case.path), &mut kustomized_caches.0, &mut kustomized_caches.1);
            unchanged_times.push(took);
            let after = kustomized_caches.0.stats().kustomize_builds + kustomized_caches.1.stats().kustomize_builds;
            assert_eq!(after, built, "an unchanged kustomization is not built");
            plain_files.clear();
        }
        let (plain, changed) = (median(plain_times), median(changed_times));
        println!(
            "| {} | {objects} | {} | {} | {} | {:.1}x | {} |",
            case.name,
            ms(median(alone)),
            ms(plain),
            ms(changed),
            changed.as_secs_f64() / plain.as_secs_f64(),
            ms(median(unchanged_times)),
        );
    }
}
