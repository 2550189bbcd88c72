//! Applications as their authors publish them (`tests/corpus`, sources in `SOURCES.tsv`) go
//! through `gitplane validate` unchanged. Those gitplane still refuses are listed with the reason
//! in `REFUSED.tsv`; an application on that list that validates fails the test too, so the list
//! shrinks as gitplane learns what they need.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
};

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/corpus")
}

/// Every application of the corpus: a directory under `plain/`, or a directory holding a
/// `kustomization.yaml` under `kustomize/`, named by its path under the corpus.
fn applications(corpus: &Path) -> Vec<String> {
    let mut apps = Vec::new();
    for entry in std::fs::read_dir(corpus.join("plain")).unwrap() {
        apps.push(format!("plain/{}", entry.unwrap().file_name().to_string_lossy()));
    }
    let mut stack = vec![corpus.join("kustomize")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.file_name().is_some_and(|n| n == "kustomization.yaml") {
                let dir = path.parent().unwrap().strip_prefix(corpus).unwrap();
                apps.push(dir.to_string_lossy().into_owned());
            }
        }
    }
    apps.sort();
    apps
}

/// `REFUSED.tsv`: application, then why gitplane refuses it.
fn refused(corpus: &Path) -> BTreeMap<String, String> {
    std::fs::read_to_string(corpus.join("REFUSED.tsv"))
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (app, why) = l.split_once('\t').unwrap_or((l, ""));
            (app.to_owned(), why.to_owned())
        })
        .collect()
}

#[test]
fn t20_published_applications_validate_as_published() {
    let corpus = corpus();
    let apps = applications(&corpus);
    let refused = refused(&corpus);
    for app in refused.keys() {
        assert!(apps.contains(app), "REFUSED.tsv names {app}, which is not in the corpus");
    }
    let mut wrong = Vec::new();
    let mut accepted = 0;
    for app in &apps {
        let out = Command::new(env!("CARGO_BIN_EXE_gitplane"))
            .current_dir(&corpus)
            .args(["validate", app.as_str()])
            .output()
            .unwrap();
        let output = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        accepted += usize::from(out.status.success());
        match (out.status.success(), refused.get(app)) {
            (true, Some(why)) => wrong.push(format!("{app} validates now: take it off REFUSED.tsv ({why})")),
            (false, None) => wrong.push(format!("{app} is refused:\n{output}")),
            _ => {}
        }
    }
    println!("{accepted} of {} published applications validate as published", apps.len());
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
