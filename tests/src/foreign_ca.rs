//! Someone else's CA and a client certificate it signed, made with the real `openssl`: what an
//! attacker presents to show that only the cluster's own CA counts.

use crate::stdout_of;
use anyhow::Result;
use std::path::{Path, PathBuf};
use std::process::Command;

pub struct ForeignCa {
    pub ca: PathBuf,
    pub certificate: PathBuf,
    pub key: PathBuf,
}

/// Writes `other-ca.{crt,key}` and `client.{crt,key}` (for `subject`, e.g.
/// `/O=gitplane:replicas/CN=gitplane replica`) into `dir`; EC P-256, valid two days.
pub fn foreign_ca(dir: &Path, subject: &str) -> Result<ForeignCa> {
    let p = |name: &str| dir.join(name).to_string_lossy().into_owned();
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
    let ca = ["-keyout", &p("other-ca.key"), "-out", &p("other-ca.crt"), "-subj", "/CN=another CA", "-days", "2"];
    stdout_of(Command::new("openssl").args(["req", "-x509"]).args(ec).args(ca))?;
    let request = ["-keyout", &p("client.key"), "-out", &p("client.csr"), "-subj", subject];
    stdout_of(Command::new("openssl").arg("req").args(ec).args(request))?;
    let sign = ["-in", &p("client.csr"), "-CA", &p("other-ca.crt"), "-CAkey", &p("other-ca.key"), "-CAcreateserial"];
    stdout_of(Command::new("openssl").args(["x509", "-req"]).args(sign).args([
        "-out",
        &p("client.crt"),
        "-days",
        "2",
    ]))?;
    Ok(ForeignCa { ca: dir.join("other-ca.crt"), certificate: dir.join("client.crt"), key: dir.join("client.key") })
}
