//! The agent's command line. (Building this test also builds the `gitplane-agent` binary.)

use std::process::Command;

#[test]
fn help_names_the_flags() {
    let out = Command::new(env!("CARGO_BIN_EXE_gitplane-agent")).arg("--help").output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in ["--server", "--node-name", "--containerd-socket", "--cni-conf-dir"] {
        assert!(help.contains(flag), "{flag} missing from:\n{help}");
    }
}

#[test]
fn an_unreachable_runtime_is_a_clear_error() {
    let dir = std::env::temp_dir().join(format!("gitplane-agent-cli-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_gitplane-agent"))
        .arg("--containerd-socket")
        .arg(dir.join("missing.sock"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("missing.sock"), "{stderr}");
}
