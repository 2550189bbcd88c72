//! `gitplane-agent`: the node agent as a standalone process, for nodes beyond the one that
//! `gitplane up` runs in-process.

use clap::Parser;
use gitplane_nodeagent::cli::{self, AgentArgs};

#[derive(Parser)]
#[command(version, about = "gitplane node agent: runs the Pods bound to this node through CRI")]
struct Args {
    #[command(flatten)]
    agent: AgentArgs,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // Colour only on a terminal: a log file or the journal gets plain text.
    use std::io::IsTerminal;
    let colour = std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    tracing_subscriber::fmt()
        .with_ansi(colour)
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
    cli::run(Args::parse().agent).await?;
    Ok(())
}
