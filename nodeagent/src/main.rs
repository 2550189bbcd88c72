//! `gitplane-agent`: the node agent as a standalone process, for nodes beyond the one that
//! `gitplane up` runs in-process.

use anyhow::Context as _;
use clap::Parser;
use gitplane_nodeagent::agent::{self, AgentConfig};
use std::path::PathBuf;

#[derive(Parser)]
#[command(version, about = "gitplane node agent: runs the Pods bound to this node through CRI")]
struct Args {
    /// The control plane's replicas, comma-separated; the agent fails over between them.
    #[arg(long, value_delimiter = ',', default_value = "http://127.0.0.1:8080")]
    server: Vec<String>,
    /// This node's name; defaults to the host name.
    #[arg(long)]
    node_name: Option<String>,
    /// This node's address (InternalIP, and the Pods' hostIP).
    #[arg(long)]
    node_ip: Option<String>,
    /// containerd's CRI socket.
    #[arg(long, default_value = "/run/containerd/containerd.sock")]
    containerd_socket: PathBuf,
    /// Where containerd reads its CNI conflist.
    #[arg(long, default_value = "/etc/gitplane/cni/net.d")]
    cni_conf_dir: PathBuf,
    /// Where host-local keeps its address allocations.
    #[arg(long, default_value = "/var/lib/gitplane/cni")]
    cni_data_dir: PathBuf,
    /// The bridge Pods attach to.
    #[arg(long, default_value = "gitplane0")]
    bridge: String,
    /// Stop and remove every Pod of this node when the agent exits.
    #[arg(long)]
    remove_pods_on_exit: bool,
    /// A file holding the cluster's join token (`<data-dir>/join-token` on a control-plane
    /// replica), needed until the node holds its credential.
    #[arg(long)]
    join_token_file: Option<PathBuf>,
    /// Where the node's credential is kept (mode 0600) once it has joined.
    #[arg(long, default_value = "/var/lib/gitplane/node-credential")]
    credential_file: PathBuf,
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_owned()).unwrap_or_else(|_| "node".into())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
    let args = Args::parse();
    let mut cfg = AgentConfig::new(args.server, args.node_name.unwrap_or_else(hostname), args.containerd_socket);
    cfg.node_ip = args.node_ip;
    cfg.cni_conf_dir = args.cni_conf_dir;
    cfg.cni_data_dir = args.cni_data_dir;
    cfg.bridge = args.bridge;
    cfg.remove_pods_on_exit = args.remove_pods_on_exit;
    cfg.credential_file = args.credential_file;
    if let Some(file) = &args.join_token_file {
        let token = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        cfg.join_token = Some(token.trim().to_owned());
    }
    let (stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        wait_for_signal().await;
        let _ = stop.send(true);
    });
    agent::run(cfg, stopped).await?;
    Ok(())
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        return std::future::pending().await;
    };
    tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
}
