//! The crate dependency edges ARCHITECTURE.md promises, checked on the resolved graph of
//! `cargo metadata` (normal dependencies only: what a crate links, not what its tests or build
//! scripts use). Features are unified over the workspace there, so the graph can only be larger
//! than what one crate builds with: a pass is never a false one.

use serde_json::Value;
use std::collections::{BTreeMap, HashMap, VecDeque};

/// Crate names by package id, and each package's normal dependencies.
struct Graph {
    names: HashMap<String, String>,
    deps: HashMap<String, Vec<String>>,
}

impl Graph {
    fn load() -> Graph {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml");
        let output = std::process::Command::new(&cargo)
            .args(["metadata", "--format-version", "1", "--manifest-path", manifest])
            .output()
            .unwrap_or_else(|e| panic!("running {cargo} metadata: {e}"));
        assert!(output.status.success(), "cargo metadata failed: {}", String::from_utf8_lossy(&output.stderr));
        let metadata: Value = serde_json::from_slice(&output.stdout).expect("cargo metadata prints JSON");
        let names = metadata["packages"]
            .as_array()
            .expect("packages")
            .iter()
            .map(|p| (p["id"].as_str().expect("id").to_owned(), p["name"].as_str().expect("name").to_owned()))
            .collect();
        let deps = metadata["resolve"]["nodes"]
            .as_array()
            .expect("resolve.nodes")
            .iter()
            .map(|node| {
                let normal = node["deps"]
                    .as_array()
                    .expect("deps")
                    .iter()
                    // `kind` is null for a normal dependency, "dev" or "build" otherwise.
                    .filter(|d| d["dep_kinds"].as_array().is_some_and(|k| k.iter().any(|k| k["kind"].is_null())))
                    .map(|d| d["pkg"].as_str().expect("pkg").to_owned())
                    .collect();
                (node["id"].as_str().expect("id").to_owned(), normal)
            })
            .collect();
        Graph { names, deps }
    }

    fn id(&self, name: &str) -> &str {
        let ids: Vec<&String> = self.names.iter().filter(|(_, n)| *n == name).map(|(id, _)| id).collect();
        assert_eq!(ids.len(), 1, "one package named {name} in the workspace graph");
        ids[0]
    }

    /// For each crate of `forbidden` that `from` links, the chain of crates that brings it in.
    fn paths(&self, from: &str, forbidden: &[&str]) -> BTreeMap<String, Vec<String>> {
        let start = self.id(from).to_owned();
        let mut parent: HashMap<String, String> = HashMap::new();
        let mut queue = VecDeque::from([start.clone()]);
        let mut found = BTreeMap::new();
        while let Some(id) = queue.pop_front() {
            let name = &self.names[&id];
            if forbidden.contains(&name.as_str()) && !found.contains_key(name) {
                let mut chain = vec![name.clone()];
                let mut at = &id;
                while let Some(p) = parent.get(at) {
                    chain.push(self.names[p].clone());
                    at = p;
                }
                chain.reverse();
                found.insert(name.clone(), chain);
            }
            for dep in self.deps.get(&id).into_iter().flatten() {
                if *dep != start && !parent.contains_key(dep) {
                    parent.insert(dep.clone(), id.clone());
                    queue.push_back(dep.clone());
                }
            }
        }
        found
    }

    fn assert_never_links(&self, from: &str, forbidden: &[&str]) {
        let found = self.paths(from, forbidden);
        let report: Vec<String> = found.values().map(|chain| chain.join(" -> ")).collect();
        assert!(
            found.is_empty(),
            "{from} must not link {forbidden:?} (ARCHITECTURE.md, Invariants), but it does:\n  {}",
            report.join("\n  ")
        );
    }
}

#[test]
fn crates_link_only_what_architecture_md_promises() {
    let graph = Graph::load();
    // The walk finds what is there: these edges exist on purpose.
    assert_eq!(graph.paths("gitplane-storage", &["sqlx"])["sqlx"], ["gitplane-storage", "sqlx"]);
    assert!(graph.paths("gitplane-nodeagent", &["tonic"]).contains_key("tonic"));

    graph
        .assert_never_links("gitplane-nodeagent", &["sqlx", "git2", "openraft", "gitplane-storage", "gitplane-source"]);
    for controller in ["gitplane-scheduler", "gitplane-controllers"] {
        graph.assert_never_links(controller, &["gitplane-storage", "sqlx", "openraft", "tonic"]);
    }
    graph.assert_never_links("gitplane-store", &["gitplane-storage", "sqlx", "openraft", "tonic", "prost"]);
    graph.assert_never_links("gitplane-api", &["sqlx", "git2", "openraft", "tonic"]);

    // The control plane's crates by role, layered: the API server below the GitOps side and the
    // node service, and only the `gitplane` binary above them all.
    graph.assert_never_links("gitplane-apiserver", &["gitplane-gitops", "gitplane-nodeservice", "gitplane"]);
    graph.assert_never_links("gitplane-gitops", &["gitplane-nodeservice", "gitplane"]);
    graph.assert_never_links("gitplane-nodeservice", &["gitplane-gitops", "gitplane", "gitplane-source"]);

    // The kubelet endpoint's contract stays light: the API server links it without the agent.
    graph.assert_never_links("gitplane-kubelet", &["gitplane-nodeagent", "tonic", "prost", "rtnetlink", "rustls"]);
    for control_plane in ["gitplane-apiserver", "gitplane-gitops", "gitplane-nodeservice"] {
        graph.assert_never_links(control_plane, &["gitplane-nodeagent"]);
    }
}
