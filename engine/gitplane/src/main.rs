//! `gitplane`: the control plane and its command line.

mod apiserver;
mod bootstrap;
mod nodeservice;
mod sync;
mod up;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use std::path::PathBuf;

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
    /// The JSON Schemas of the accepted kinds.
    Schemas {
        #[command(subcommand)]
        command: SchemasCommand,
    },
}

#[derive(Subcommand)]
enum SchemasCommand {
    /// Write one schema per accepted kind into DIR.
    Write {
        #[arg(long, default_value = "schemas")]
        dir: PathBuf,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Up(args) => {
            tracing_subscriber::fmt()
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_default_env()
                        .unwrap_or_else(|_| "info,sqlx=warn,tower=warn,h2=warn".into()),
                )
                .with_writer(std::io::stderr)
                .init();
            tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(up::up(args))
        }
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
