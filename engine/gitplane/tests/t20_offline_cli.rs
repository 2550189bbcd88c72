//! `gitplane validate` and `gitplane render` as users call them: exit codes, what goes to stdout
//! and stderr, values and templates, Secrets masked.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

fn gitplane(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_gitplane")).current_dir(dir).args(args).output().unwrap()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A Git work tree (a `.git` directory is all the CLI looks for) holding `files`.
fn work_tree(files: &[(&str, &str)]) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("repo");
    std::fs::create_dir_all(root.join(".git")).unwrap();
    for (path, text) in files {
        let path = root.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    (tmp, root)
}

const DEPLOYMENT: &str = "\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: {{ replicas }}
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: web, image: \"httpd:{{ tag }}\"}]
";
const SERVICE: &str = "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec:\n  ports: [{port: 80}]\n";
const SECRET: &str = "apiVersion: v1\nkind: Secret\nmetadata: {name: creds}\nstringData: {password: hunter2}\n";

fn app() -> (tempfile::TempDir, PathBuf) {
    work_tree(&[
        ("deploy/web.yaml.j2", DEPLOYMENT),
        ("deploy/svc.yaml", SERVICE),
        ("deploy/secret.yaml", SECRET),
        ("deploy/values.yaml", "replicas: 2\ntag: \"1\"\n"),
        ("values/prod.yaml", "replicas: 5\n"),
        ("README.md", "not a manifest"),
    ])
}

#[test]
fn t20_validate_accepts_a_good_directory() {
    let (_tmp, root) = app();
    let cases: &[&[&str]] = &[
        &["validate", "deploy", "--values", "deploy/values.yaml"],
        &["validate", "deploy", "--values", "deploy/values.yaml", "--values", "values/prod.yaml", "--set", "tag=2"],
        &["validate", "deploy", "--set", "replicas=3", "--set", "tag=v1", "--values", "deploy/values.yaml"],
    ];
    for args in cases {
        let out = gitplane(&root, args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        // The values file is not a manifest: three objects.
        assert_eq!(stdout(&out), "3 objects valid\n", "{args:?}");
    }
}

#[test]
fn t20_validate_prints_every_error_and_exits_1() {
    let broken_service = "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec:\n  ports: [{port: 80}]\n---\n\
                          apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndatta: {}\n";
    let (_tmp, root) = work_tree(&[
        ("deploy/web.yaml.j2", DEPLOYMENT),
        ("deploy/svc.yaml", broken_service),
        ("deploy/secret.yaml", &SECRET.replace("stringData: {password: hunter2}", "stringData: {password: 7}")),
    ]);
    let out = gitplane(&root, &["validate", "deploy", "--set", "replicas=two"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stdout(&out), "");
    assert_eq!(
        stderr(&out),
        "deploy/secret.yaml:4: Secret creds: /stringData/password: <masked> is not of type \"string\"\n\
         deploy/svc.yaml:10 (document 2): ConfigMap c: unknown field \"datta\" (did you mean \"data\"?)\n\
         deploy/web.yaml.j2:11: undefined value: `tag` is undefined: set it in the Application's values or \
         valuesFiles, or give a default: {{ name | default(\"x\") }}\n\
         3 errors: the server would reject this commit\n"
    );

    // The template renders once the value is there; its error is then at the template line.
    let out = gitplane(&root, &["validate", "deploy", "--set", "replicas=two", "--set", "tag=1"]);
    let stderr = stderr(&out);
    assert!(
        stderr.contains("deploy/web.yaml.j2:6: Deployment web: /spec/replicas: \"two\" is not of type \"integer\"\n"),
        "{stderr}"
    );

    // Run from inside the directory, without a work tree: names are relative to it.
    let out = gitplane(&root.join("deploy"), &["validate", "."]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("deploy/svc.yaml:10 (document 2)"), "in a work tree");
    std::fs::remove_dir(root.join(".git")).unwrap();
    let out = gitplane(&root.join("deploy"), &["validate", "."]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("\nsvc.yaml:10 (document 2)"), "{out:?}");
}

#[test]
fn t20_validate_refuses_what_the_server_refuses() {
    let (_tmp, root) = app();
    std::os::unix::fs::symlink("../../outside.yaml", root.join("deploy/link.yaml")).unwrap();
    std::fs::write(root.parent().unwrap().join("outside.yaml"), SERVICE).unwrap();
    let out = gitplane(&root, &["validate", "deploy", "--values", "deploy/values.yaml"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).starts_with("link.yaml is a symlink to ../../outside.yaml, which is outside"), "{out:?}");

    let cases: &[(&[&str], &str)] = &[
        (&["validate", "nowhere"], "nowhere"),
        (&["validate", "deploy", "--set", "novalue"], "--set \"novalue\" is not key=value"),
        (&["validate", "deploy", "--values", "../outside.yaml"], "the server reads values files from the repository"),
    ];
    for (args, expected) in cases {
        let out = gitplane(&root, args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert!(stderr(&out).contains(expected), "{args:?}: {}", stderr(&out));
    }
}

#[test]
fn t20_render_prints_the_objects_with_secrets_masked() {
    let (_tmp, root) = app();
    let out = gitplane(&root, &["render", "deploy", "--values", "deploy/values.yaml", "--namespace", "prod"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let documents: Vec<&str> = text.split("---\n").filter(|d| !d.is_empty()).collect();
    assert_eq!(documents.len(), 3, "{text}");
    assert_eq!(
        documents[0],
        "# Source: deploy/secret.yaml\napiVersion: v1\nkind: Secret\nmetadata:\n  name: creds\n  namespace: prod\n\
         data:\n  password: <masked>\n",
        "stringData is merged into data, as the API server does"
    );
    assert!(documents[2].starts_with("# Source: deploy/web.yaml.j2\napiVersion: apps/v1\nkind: Deployment\n"));
    assert!(documents[2].contains("  replicas: 2\n") && documents[2].contains("httpd:1"), "{}", documents[2]);
    assert!(!text.contains("hunter2") && !text.contains("aHVudGVyMg"));

    let out = gitplane(&root, &["render", "deploy", "--values", "deploy/values.yaml", "--show-secrets"]);
    assert!(stdout(&out).contains("  password: aHVudGVyMg==\n"));

    let out = gitplane(&root, &["render", "deploy"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stdout(&out), "", "nothing is printed when anything is wrong");
}
