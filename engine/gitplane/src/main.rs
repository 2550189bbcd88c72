//! `gitplane`: the control plane and its command line.

use gitplane::{encryption, server, status, token, up};
use gitplane_gitops::{diff, offline, prereceive};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use std::path::PathBuf;

// Built without transparent huge pages (`no_thp`): mimalloc would otherwise advise them for its
// arenas, and each sparsely used 2 MiB page counted whole made the agent 20 MiB and the control
// plane 28 MiB larger at rest (BENCHMARKS.md, "the agent at rest").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(version, about = "gitplane: a GitOps appliance that is a small Kubernetes")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the whole appliance on this machine: control plane, a node agent, containerd and the
    /// demo repository. Stays in the foreground; Ctrl-C stops it and removes its pods.
    Up(up::UpArgs),
    /// Run a node agent (what `gitplane-agent` runs): joins the control plane and runs the Pods
    /// bound to this node. `gitplane up --nodes` starts one in each node's namespaces.
    Agent(gitplane_nodeagent::cli::AgentArgs),
    /// Run one control-plane replica of a cluster of 1, 3 or 5 (`--id`, `--peers`). Only the
    /// acting leader runs the source, the scheduler and the controllers; every replica serves
    /// reads, the node service and the status API, and forwards writes to the leader.
    Server(server::ServerArgs),
    /// Check an Application's manifests offline, as the server would: render the templates,
    /// parse and validate. Prints every error, one per line; exits 1 on any (for pre-commit
    /// hooks and CI).
    Validate(offline::OfflineArgs),
    /// Print an Application's objects as the server would apply them (rendered, validated,
    /// namespaces defaulted), as YAML documents; Secrets' values masked.
    Render(offline::RenderArgs),
    /// The Applications (sync, health, commit, errors) and nodes in coloured tables, read over
    /// the status API. `--wait` exits 0 once everything is synced and healthy, 1 with the reason
    /// on a rejected commit or at `--timeout` (for scripts).
    Status(status::StatusArgs),
    /// What a sync of a directory, a branch or a commit range would change in the live cluster,
    /// as `kubectl diff` prints it (or `--output json`); Secret values masked. Exits 0 without
    /// differences, 1 with, 2 on an error.
    Diff(diff::DiffArgs),
    /// Encryption of Secrets at rest: rotate the key (`gitplane secrets rotate`).
    Secrets(encryption::SecretsArgs),
    /// Tokens of the status API: `create --role read|debug [--ttl 12h]` prints a kubeconfig
    /// with a new token, `revoke USER`, `list`; each takes effect without a restart.
    Token(token::TokenArgs),
    /// Git hooks of hosted repositories, run by git under `gitplane server` (not by hand).
    #[command(hide = true)]
    Hook {
        #[command(subcommand)]
        command: HookCommand,
    },
    /// The JSON Schemas of the accepted kinds.
    Schemas {
        #[command(subcommand)]
        command: SchemasCommand,
    },
}

#[derive(Subcommand)]
enum HookCommand {
    /// Asks the replica serving the push for its verdict on the pushed commits.
    PreReceive,
}

#[derive(Subcommand)]
enum SchemasCommand {
    /// Write one schema per accepted kind into DIR.
    Write {
        #[arg(long, default_value = "schemas")]
        dir: PathBuf,
    },
}

/// Logs to stderr and runs a long-lived command on a multi-threaded runtime. Colour only on a
/// terminal: a log file or the journal gets plain text.
fn run(command: impl std::future::Future<Output = anyhow::Result<()>>) -> anyhow::Result<()> {
    use std::io::IsTerminal;
    let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    tracing_subscriber::fmt()
        .with_ansi(colour)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,sqlx=warn,tower=warn,h2=warn,openraft=warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(command)
}

fn main() -> anyhow::Result<()> {
    // git runs the pre-receive hook of hosted repositories as a link to this binary.
    if std::env::args_os().next().is_some_and(|arg0| prereceive::invoked_as_hook(&arg0)) {
        return prereceive::run_pre_receive();
    }
    let cli = Cli::parse();
    match cli.command {
        Command::Up(args) => run(up::up(args)),
        Command::Server(args) => run(server::server(args)),
        Command::Agent(args) => run(async { Ok(gitplane_nodeagent::cli::run(args).await?) }),
        Command::Secrets(args) => run(encryption::secrets(args)),
        Command::Token(args) => token::run(args),
        Command::Status(args) => {
            tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(status::status(args))
        }
        Command::Validate(args) => offline::validate(args),
        Command::Render(args) => offline::render(args),
        Command::Diff(args) => match diff::diff(args) {
            Ok(differs) => std::process::exit(i32::from(differs)),
            Err(e) => {
                eprintln!("error: {e:#}");
                std::process::exit(2);
            }
        },
        Command::Hook { command: HookCommand::PreReceive } => prereceive::run_pre_receive(),
        Command::Schemas { command: SchemasCommand::Write { dir } } => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            for (name, text) in gitplane_api::kinds::schema_files() {
                let path = dir.join(&name);
                std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
                println!("{}", path.display());
            }
            Ok(())
        }
    }
}
