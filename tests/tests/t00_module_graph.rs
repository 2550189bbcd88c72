//! The module rules ARCHITECTURE.md promises, read from the sources: no two files of a crate
//! import each other, directly or around a circle (except the circles named below, each with
//! its reason), and the modules it calls pure do no I/O.
//!
//! An edge is a path through `crate::`, `super::` or `self::` (in `use` trees or in code) that
//! names another file's module; a child naming its parent is not an import circle by itself
//! (the parent only declares it). Unit tests (`#[cfg(test)] mod tests`) are left out.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

/// The workspace's crates, by their source directory.
const CRATES: &[&str] = &[
    "engine/api",
    "engine/apiserver",
    "engine/controllers",
    "engine/gitops",
    "engine/kubelet",
    "engine/gitplane",
    "engine/metrics",
    "engine/nodeservice",
    "engine/proto",
    "engine/scheduler",
    "engine/source",
    "engine/storage",
    "engine/store",
    "engine/testkit",
    "engine/workqueue",
    "nodeagent",
];

/// Import circles that stay, each with its reason (ARCHITECTURE.md, Invariants): the crate,
/// the circle's files, sorted.
const NAMED: &[(&str, &[&str])] = &[];

/// Modules ARCHITECTURE.md calls pure, and what they must not name.
const PURE: &[&str] = &[
    "engine/api/src/defaults.rs",
    "engine/api/src/events.rs",
    "engine/api/src/health.rs",
    "engine/api/src/hooks.rs",
    "engine/api/src/ingress.rs",
    "engine/api/src/kubedns.rs",
    "engine/api/src/labels.rs",
    "engine/api/src/network.rs",
    "engine/api/src/nodeaffinity.rs",
    "engine/api/src/quantity.rs",
    "engine/api/src/taints.rs",
    "engine/api/src/volumes.rs",
    "engine/apiserver/src/fields.rs",
    "engine/gitops/src/source/allocate.rs",
    "engine/gitops/src/source/hooks.rs",
    "engine/gitops/src/source/reach.rs",
    "engine/nodeservice/src/addresses.rs",
    "engine/scheduler/src/volume_binding.rs",
    "nodeagent/src/hollow/addresses.rs",
    "nodeagent/src/kubelet/admission.rs",
    "nodeagent/src/kubelet/credentialprovider.rs",
    "nodeagent/src/kubelet/eviction/local_storage.rs",
    "nodeagent/src/kubelet/logs/cri_log.rs",
    "nodeagent/src/kubelet/node/pressure.rs",
    "nodeagent/src/kubelet/prober/results.rs",
    "nodeagent/src/kubelet/registries.rs",
    "nodeagent/src/kubelet/runtime/actions.rs",
    "nodeagent/src/kubelet/runtime/failures.rs",
    "nodeagent/src/kubelet/runtime/hosts.rs",
    "nodeagent/src/kubelet/runtime/spec.rs",
    "nodeagent/src/kubelet/runtime/status.rs",
    "nodeagent/src/kubelet/runtime/volumes/projection.rs",
    "nodeagent/src/network/dns/message.rs",
    "nodeagent/src/network/dns/records.rs",
    "nodeagent/src/network/policy/allows.rs",
    "nodeagent/src/network/policy/desired.rs",
    "nodeagent/src/network/policy/nft.rs",
    "nodeagent/src/network/proxy/desired.rs",
    "nodeagent/src/network/proxy/iptables.rs",
    "nodeagent/src/network/proxy/nft.rs",
];
/// The nft layouts build netfilter's netlink messages (`netfilter::netlink`'s `Transaction`,
/// `Data`): bytes, not I/O. Opening or using a socket is what they must not do.
const IMPURE: &[&str] = &[
    "tokio",
    "std::process",
    "std::fs",
    "std::net::Tcp",
    "std::net::Udp",
    "rtnetlink",
    "netlink_sys",
    "socket2",
    "OwnedFd",
    "libc::socket",
    "File::",
];

/// A crate's files: module path (`["source", "apply"]`) -> source text without its tests.
fn modules(krate: &str) -> BTreeMap<Vec<String>, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(krate).join("src");
    let mut out = BTreeMap::new();
    let mut dirs = vec![root.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let relative = path.strip_prefix(&root).expect("under src").with_extension("");
                let mut parts: Vec<String> =
                    relative.iter().map(|p| p.to_str().expect("UTF-8 path").to_owned()).collect();
                if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
                    parts.pop();
                }
                out.insert(parts, without_tests(&std::fs::read_to_string(&path).expect("readable source")));
            }
        }
    }
    out
}

fn without_tests(source: &str) -> String {
    let cut = source.find("#[cfg(test)]\nmod tests").unwrap_or(source.len());
    source[..cut].lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n")
}

/// `a::{b, c::{d}}` -> `a::b`, `a::c::d`.
fn expand(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else { return vec![tree.to_owned()] };
    let close = tree.rfind('}').filter(|c| *c > open).unwrap_or(tree.len());
    let (prefix, body) = (&tree[..open], &tree[open + 1..close]);
    let (mut items, mut depth, mut current) = (Vec::new(), 0, String::new());
    for c in body.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    items.push(current);
    items.iter().filter(|i| !i.trim().is_empty()).flat_map(|i| expand(i)).map(|e| format!("{prefix}{e}")).collect()
}

/// Every `crate::`/`super::`/`self::` path of a source text, `use` trees expanded.
fn paths(source: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut offset = 0;
    for line in source.split_inclusive('\n') {
        let trimmed = line.trim_start();
        let tree = ["use ", "pub use ", "pub(crate) use "].iter().find_map(|p| trimmed.strip_prefix(p));
        if let Some(tree) = tree {
            let start = offset + (line.len() - tree.len());
            let end = source[start..].find(';').map_or(source.len(), |e| start + e);
            out.extend(expand(&source[start..end]));
        }
        offset += line.len();
    }
    for anchor in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(at) = source[from..].find(anchor) {
            let start = from + at;
            let before = source[..start].chars().last();
            if !before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                let end = source[start..]
                    .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                    .map_or(source.len(), |e| start + e);
                out.push(source[start..end].to_owned());
            }
            from = start + anchor.len();
        }
    }
    out
}

/// The files each file's paths name.
fn edges(files: &BTreeMap<Vec<String>, String>) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let resolve = |path: &[String]| (1..=path.len()).rev().map(|n| path[..n].to_vec()).find(|p| files.contains_key(p));
    files
        .iter()
        .map(|(module, source)| {
            let mut to = BTreeSet::new();
            for path in paths(source) {
                let path = path.split(" as ").next().unwrap_or("").trim().to_owned();
                let mut segments: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
                let mut base: Vec<String> = match segments.first() {
                    Some(&"crate") => Vec::new(),
                    Some(&"self" | &"super") => module.clone(),
                    _ => continue,
                };
                if segments[0] == "crate" || segments[0] == "self" {
                    segments.remove(0);
                }
                while segments.first() == Some(&"super") {
                    segments.remove(0);
                    base.pop();
                }
                base.extend(segments.iter().map(|s| s.to_string()));
                if let Some(target) = resolve(&base)
                    && target != *module
                    && !module.starts_with(&target)
                {
                    to.insert(target);
                }
            }
            (module.clone(), to)
        })
        .collect()
}

/// The strongly connected components of more than one file.
fn circles(edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<Vec<String>> {
    let reaches = |from: &Vec<String>| {
        let mut seen = BTreeSet::from([from.clone()]);
        let mut stack = vec![from.clone()];
        while let Some(at) = stack.pop() {
            for next in &edges[&at] {
                if seen.insert(next.clone()) {
                    stack.push(next.clone());
                }
            }
        }
        seen
    };
    let reach: BTreeMap<_, _> = edges.keys().map(|m| (m.clone(), reaches(m))).collect();
    let mut out: BTreeSet<Vec<String>> = BTreeSet::new();
    for module in edges.keys() {
        let circle: Vec<String> =
            reach[module].iter().filter(|other| reach[*other].contains(module)).map(|m| m.join("/")).collect();
        if circle.len() > 1 {
            out.insert(circle);
        }
    }
    out.into_iter().collect()
}

#[test]
fn no_two_files_of_a_crate_import_each_other_but_the_named_ones() {
    let mut found = Vec::new();
    for krate in CRATES {
        for circle in circles(&edges(&modules(krate))) {
            let named = NAMED.iter().any(|(k, files)| k == krate && circle.iter().eq(files.iter()));
            if !named {
                found.push(format!("{krate}: {}", circle.join(", ")));
            }
        }
    }
    assert!(found.is_empty(), "import circles ARCHITECTURE.md does not name:\n  {}", found.join("\n  "));
}

#[test]
fn the_modules_called_pure_do_no_io() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut found = Vec::new();
    for file in PURE {
        let source = without_tests(&std::fs::read_to_string(root.join(file)).unwrap_or_else(|e| panic!("{file}: {e}")));
        for word in IMPURE {
            if source.contains(word) {
                found.push(format!("{file} names {word}"));
            }
        }
    }
    assert!(found.is_empty(), "modules ARCHITECTURE.md calls pure do I/O:\n  {}", found.join("\n  "));
}

#[test]
fn the_reader_finds_paths_in_use_trees_and_code() {
    let source = "use crate::{a::{b, c as d}, e};\nuse super::f;\nfn x() { crate::g::h(); self::i(); }";
    let found = paths(source);
    for wanted in ["crate::a::b", "crate::a::c as d", "crate::e", "super::f", "crate::g::h", "self::i"] {
        assert!(found.iter().any(|p| p.trim() == wanted), "{wanted} in {found:?}");
    }
    let files: BTreeMap<Vec<String>, String> = [
        (vec![], "mod a; mod b;".to_owned()),
        (vec!["a".to_owned()], "use crate::b::x;".to_owned()),
        (vec!["b".to_owned()], "use super::a::y;".to_owned()),
        (vec!["b".to_owned(), "c".to_owned()], "use super::z;".to_owned()),
    ]
    .into();
    assert_eq!(circles(&edges(&files)), [vec!["a".to_owned(), "b".to_owned()]]);
}
