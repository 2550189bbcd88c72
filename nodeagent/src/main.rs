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
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
    cli::run(Args::parse().agent).await?;
    Ok(())
}
