//! A private PostgreSQL server for tests, from the Debian packages' binaries
//! (`/usr/lib/postgresql/<version>/bin`, or the directory in `GITPLANE_PG_BIN`).
//!
//! Each [`PgCluster`] is its own `initdb` in a temporary directory, reachable only through a unix
//! socket inside that directory (`listen_addresses = ''`: no TCP), run as the `postgres` system
//! user when the tests run as root (Postgres refuses to run as root). Durability settings are
//! Postgres' defaults, so the tests see the fsync behaviour production does. Dropping the
//! cluster (also while a failed test unwinds) stops the server and removes the directory.

use sqlx::{Connection, PgConnection, postgres::PgConnectOptions};
use std::{
    os::unix::{fs::MetadataExt, process::CommandExt},
    path::{Path, PathBuf},
    process::{Command, Output},
};

/// Only names the socket file: the server listens on no TCP port.
const PORT: u16 = 5432;
const INSTALL: &str = "install postgresql (apt-get install postgresql)";

pub struct PgCluster {
    dir: tempfile::TempDir,
    bin: PathBuf,
    /// (uid, gid) of the `postgres` user when we are root.
    user: Option<(u32, u32)>,
}

/// The newest installed server's `bin` directory.
fn find_bin() -> PathBuf {
    if let Some(dir) = std::env::var_os("GITPLANE_PG_BIN") {
        return PathBuf::from(dir);
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("pg_ctl").exists().then_some((version, bin))
        })
        .collect();
    found.sort();
    match found.pop() {
        Some((_, bin)) => bin,
        None => panic!("no PostgreSQL server in /usr/lib/postgresql/*/bin: {INSTALL}"),
    }
}

/// The `postgres` user's ids, when we are root and must not run the server as ourselves.
fn run_as() -> Option<(u32, u32)> {
    let euid = std::fs::metadata("/proc/self").map(|m| m.uid()).expect("reading /proc/self");
    if euid != 0 {
        return None;
    }
    let passwd = std::fs::read_to_string("/etc/passwd").expect("reading /etc/passwd");
    let entry = passwd.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        (fields.first() == Some(&"postgres") && fields.len() > 3).then(|| (fields[2].parse(), fields[3].parse()))
    });
    match entry {
        Some((Ok(uid), Ok(gid))) => Some((uid, gid)),
        _ => panic!("running as root and there is no `postgres` user to run the test server as: {INSTALL}"),
    }
}

impl PgCluster {
    /// Creates and starts a server; panics (never skips) when PostgreSQL is not installed.
    pub fn start() -> PgCluster {
        let bin = find_bin();
        let user = run_as();
        let dir = tempfile::Builder::new().prefix("gitplane-pg-").tempdir().expect("creating a temp dir");
        let cluster = PgCluster { dir, bin, user };
        std::fs::create_dir(cluster.socket()).expect("creating the socket directory");
        if let Some((uid, gid)) = user {
            for path in [cluster.dir.path(), &cluster.socket()] {
                std::os::unix::fs::chown(path, Some(uid), Some(gid)).expect("handing the temp dir to postgres");
            }
        }
        let data = cluster.data();
        cluster.run("initdb", &["-D", path(&data), "-A", "trust", "-U", "postgres", "-E", "UTF8", "--locale=C"]);
        let conf = format!(
            "\nlisten_addresses = ''\nport = {PORT}\nunix_socket_directories = '{}'\n",
            cluster.socket().display()
        );
        let mut settings = std::fs::read_to_string(data.join("postgresql.conf")).expect("reading postgresql.conf");
        settings.push_str(&conf);
        std::fs::write(data.join("postgresql.conf"), settings).expect("writing postgresql.conf");
        let log = cluster.dir.path().join("server.log");
        cluster.run("pg_ctl", &["-D", path(&data), "-l", path(&log), "-w", "-t", "60", "start"]);
        cluster
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("socket")
    }

    /// Options for `database` over the private socket.
    pub fn options(&self, database: &str) -> PgConnectOptions {
        PgConnectOptions::new_without_pgpass().socket(self.socket()).port(PORT).username("postgres").database(database)
    }

    /// The URL of `database` over the private socket.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@localhost:{PORT}/{database}?host={}", self.socket().display())
    }

    /// The cluster's `postgres` database, emptied: every table, sequence and migration record
    /// dropped. Cheaper than `CREATE DATABASE`, which copies a template whose files a `fast`
    /// shutdown must then flush (seconds per database on a busy disk).
    pub async fn empty_database(&self) -> PgConnectOptions {
        let options = self.options("postgres");
        let mut conn = PgConnection::connect_with(&options).await.expect("connecting to the test server");
        sqlx::raw_sql("DROP SCHEMA public CASCADE; CREATE SCHEMA public;")
            .execute(&mut conn)
            .await
            .expect("emptying the test database");
        let _ = conn.close().await;
        options
    }

    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(self.bin.join(program));
        // The postgres user may not be allowed into our working directory.
        command.current_dir(self.dir.path()).env("LC_ALL", "C");
        if let Some((uid, gid)) = self.user {
            command.uid(uid).gid(gid);
        }
        command
    }

    fn run(&self, program: &str, args: &[&str]) -> Output {
        let output = self
            .command(program)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}: {INSTALL}", self.bin.join(program).display()));
        if !output.status.success() {
            let log = std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default();
            panic!(
                "{program} {args:?} failed ({}):\n{}{}\nserver log:\n{log}",
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        output
    }
}

fn path(p: &Path) -> &str {
    p.to_str().expect("temp paths are UTF-8")
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        if !self.data().join("postmaster.pid").exists() {
            return; // never started
        }
        let stopped = self.command("pg_ctl").args(["-D", path(&self.data()), "-m", "fast", "-w", "stop"]).output();
        match stopped {
            Ok(out) if out.status.success() => {}
            Ok(out) => eprintln!("stopping the test PostgreSQL failed: {}", String::from_utf8_lossy(&out.stderr)),
            Err(e) => eprintln!("stopping the test PostgreSQL failed: {e}"),
        }
    }
}
