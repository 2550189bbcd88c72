//! The command line as users call it. (Building this test also builds the `gitplane` binary
//! that the end-to-end tests run.)

use std::process::Command;

fn gitplane() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gitplane"))
}

#[test]
fn schemas_write_produces_the_checked_in_schemas() {
    let dir = tempfile::tempdir().unwrap();
    let out = gitplane().args(["schemas", "write", "--dir"]).arg(dir.path()).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let checked_in = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../schemas");
    for (name, _) in gitplane_api::kinds::schema_files() {
        assert_eq!(
            std::fs::read(dir.path().join(&name)).unwrap(),
            std::fs::read(checked_in.join(&name)).unwrap_or_default(),
            "{name}"
        );
    }
}

#[test]
fn unknown_commands_and_flags_are_refused_with_usage() {
    let out = gitplane().args(["up", "--no-such-flag"]).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--no-such-flag") && stderr.contains("Usage"), "{stderr}");
}

#[test]
fn status_wait_waits_for_a_kubeconfig_that_is_not_there_yet_and_status_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("kubeconfig");
    let out = gitplane().args(["status", "--kubeconfig"]).arg(&missing).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&missing.display().to_string()), "{stderr}");
    let started = std::time::Instant::now();
    let out = gitplane().args(["status", "--wait", "--timeout", "2s", "--kubeconfig"]).arg(&missing).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("waiting (") && stderr.contains(&missing.display().to_string()), "{stderr}");
    assert!(started.elapsed() >= std::time::Duration::from_secs(2), "--wait gave up before its timeout");
}
