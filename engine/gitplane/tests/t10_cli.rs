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
