//! Fuzzing the parsers a `git push` reaches: manifests (YAML, then strict validation) and
//! templates (minijinja with values, then the same). Any input must end in objects or in errors
//! that name a file, never in a panic. `GITPLANE_FUZZ_SECONDS` sets the time per target.

use gitplane_fuzz::{Target, fuzz};
use gitplane_source::{AppSource, Limits, ManifestFile, SourceCache, Validator, load_files};
use serde_json::json;

const DEMO: &[u8] = include_bytes!("../../gitops/demo/web.yaml");
const APPS: &[u8] = include_bytes!("../../gitops/bootstrap/demo.yaml");
const SECRET: &[u8] = b"apiVersion: v1\nkind: Secret\nmetadata:\n  name: s\n  namespace: a\ntype: Opaque\ndata:\n  password: aHVudGVyMg==\nstringData:\n  user: admin\n";
const JOB: &[u8] = b"apiVersion: batch/v1\nkind: Job\nmetadata:\n  name: j\nspec:\n  completions: 2\n  template:\n    spec:\n      restartPolicy: Never\n      containers:\n        - name: c\n          image: busybox\n          command: [\"true\"]\n";
const ANCHORS: &[u8] = b"a: &x [1, 2]\nb: *x\n---\n- &y {k: v}\n- *y\n";
const TEMPLATE: &[u8] = b"{% for i in range(replicas) %}\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ name }}-{{ i }}\ndata:\n  greeting: \"{{ greeting | upper }}\"\n  items: \"{{ items | join(',') }}\"\n---\n{% endfor %}\n";

const YAML_TOKENS: &[&[u8]] = &[
    b": ",
    b"- ",
    b"---\n",
    b"...\n",
    b"&a ",
    b"*a",
    b"!!str ",
    b"!!binary ",
    b"<<: *a\n",
    b"{",
    b"}",
    b"[",
    b"]",
    b"? ",
    b"|\n  ",
    b">-\n  ",
    b"\"\\u0000\"",
    b"'",
    b"#",
    b"\n  ",
    b"\t",
    b"apiVersion: v1\n",
    b"kind: Pod\n",
    b"metadata:\n  name: x\n",
    b"namespace: ",
    b"spec:\n",
    b"data:\n",
    b"%YAML 1.2\n",
    b"\xef\xbb\xbf",
    b"~",
    b"null",
    b"1e999",
    b"-0",
    b"0x10",
    b".inf",
];
const JINJA_TOKENS: &[&[u8]] = &[
    b"{{ ",
    b" }}",
    b"{% ",
    b" %}",
    b"{# ",
    b" #}",
    b"{% for x in items %}",
    b"{% endfor %}",
    b"{% if name %}",
    b"{% endif %}",
    b"{% set x = ",
    b"{% macro m() %}",
    b"{% endmacro %}",
    b"{% include 'x' %}",
    b"| tojson",
    b"| safe",
    b"range(99999999)",
    b"name",
    b"items",
    b"greeting",
    b"* 9999999",
    b"loop.index",
    b"~",
    b"(",
    b")",
];

fn check(validator: &Validator, path: &str, content: &[u8], values: bool) {
    let app = AppSource {
        default_namespace: "default".into(),
        values: if values {
            [("name", json!("web")), ("replicas", json!(2)), ("greeting", json!("hi")), ("items", json!(["a", "b"]))]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect()
        } else {
            Default::default()
        },
        ..AppSource::default()
    };
    let limits = Limits { max_file_bytes: 64 << 10, max_total_bytes: 256 << 10, ..Limits::default() };
    let files = [ManifestFile::new(path, content.to_vec())];
    if let Err(e) = load_files(&files, &app, validator, &limits, &mut SourceCache::new()) {
        let text = e.to_string();
        assert!(!text.is_empty(), "an error says something");
        assert!(!text.contains("aHVudGVyMg=="), "an error quoted a Secret value: {text}");
    }
}

#[test]
fn t30_fuzz_manifests() {
    let target = Target {
        name: "manifests",
        seeds: &[DEMO, APPS, SECRET, JOB, ANCHORS],
        dictionary: YAML_TOKENS,
        max_len: 16 << 10,
    };
    let validator = Validator::new();
    let runs = fuzz(target, |input| check(&validator, "fuzz.yaml", input, false));
    println!("manifests: {runs} inputs");
}

#[test]
fn t30_fuzz_templates() {
    let mut dictionary = YAML_TOKENS.to_vec();
    dictionary.extend_from_slice(JINJA_TOKENS);
    let target =
        Target { name: "templates", seeds: &[TEMPLATE, DEMO, SECRET], dictionary: &dictionary, max_len: 16 << 10 };
    let validator = Validator::new();
    let runs = fuzz(target, |input| check(&validator, "fuzz.yaml.j2", input, true));
    println!("templates: {runs} inputs");
}
