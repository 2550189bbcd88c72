//! `gitplane server`: one control-plane replica of a cluster of 1, 3 or 5.

use crate::{
    backend::Backend,
    controlplane,
    credentials::{Credentials, Sources},
    encryption::load_keys,
    replica::{GitServing, Replica, ReplicaTls, ServiceAccountTokens},
    security::{self, Security},
};
use anyhow::{Context as _, bail};
use gitplane_controllers::loadbalancer::AddressPool;
use gitplane_gitops::source::allocate::ServiceRanges;
use gitplane_storage::{
    postgres::PostgresReplica,
    raft::{NodeId, ReplicaConfig},
    remote::PeerToken,
};
use std::{collections::BTreeMap, net::SocketAddr, path::PathBuf, time::Duration};

#[derive(clap::Args)]
pub struct ServerArgs {
    /// This replica's id in --peers.
    #[arg(long)]
    id: NodeId,
    /// Every replica of the cluster, this one included: `1=10.0.0.1:8080,2=10.0.0.2:8080,...`.
    #[arg(long, value_delimiter = ',', required = true)]
    peers: Vec<String>,
    /// Where this replica keeps its store, Raft log and snapshots.
    #[arg(long, default_value = "/var/lib/gitplane")]
    data_dir: PathBuf,
    /// Where the hosted bare repositories live (shared by the replicas).
    #[arg(long, default_value = "repos")]
    repos_dir: PathBuf,
    /// The address to listen on; defaults to this replica's address in --peers.
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Raft heartbeat, and the range of election timeouts, in milliseconds.
    #[arg(long, default_value_t = 100)]
    heartbeat_ms: u64,
    #[arg(long, default_value_t = 300)]
    election_timeout_min_ms: u64,
    #[arg(long, default_value_t = 500)]
    election_timeout_max_ms: u64,
    /// Take a Raft snapshot every this many log entries, keeping this many behind it.
    #[arg(long, default_value_t = 100_000)]
    snapshot_every: u64,
    #[arg(long, default_value_t = 5_000)]
    logs_to_keep: u64,
    /// Where the state lives: each replica's SQLite replicated with Raft, or one shared Postgres.
    #[arg(long, value_enum, default_value_t = StoreKind::Sqlite)]
    store: StoreKind,
    /// The shared database, e.g. `postgres://gitplane@/gitplane?host=/run/postgresql`.
    #[arg(long, env = "GITPLANE_POSTGRES_URL", required_if_eq("store", "postgres"))]
    postgres_url: Option<String>,
    /// A file holding the shared secret of webhooks from Git hosts (none: webhooks are refused).
    #[arg(long)]
    webhook_secret_file: Option<PathBuf>,
    /// The hosted repository of the cluster's Applications (app-of-apps): the leader makes it
    /// (empty) and the root Application that applies it, if absent.
    #[arg(long)]
    bootstrap: Option<String>,
    /// With Postgres: how long the leader lease lasts without renewal (renewed every third).
    #[arg(long, default_value_t = 1500)]
    lease_ms: u64,
    /// The secret the replicas share (the same on each): the store and Raft services require it
    /// and the replicas present it to each other. Default: `<data-dir>/peer-token`, made on
    /// first start by a single replica or the one with the lowest id; copy it to the others.
    #[arg(long)]
    peer_token_file: Option<PathBuf>,
    /// The token node agents present to join (the same on each replica). Default:
    /// `<data-dir>/join-token`, made like the peer token.
    #[arg(long)]
    join_token_file: Option<PathBuf>,
    /// The keys that encrypt Secrets at rest (the same file on each replica; the first key
    /// encrypts, all decrypt; followed while running). Default: `<data-dir>/encryption-keys`,
    /// made like the peer token.
    #[arg(long)]
    encryption_key_file: Option<PathBuf>,
    /// The range Services get their ClusterIPs from; the tenth address is cluster DNS's.
    #[arg(long, default_value = "10.96.0.0/12")]
    service_cidr: String,
    #[command(flatten)]
    controllers: crate::controlplane::ControllerArgs,
    /// The longest a ServiceAccount token the nodes ask for lives (kube-apiserver's flag of this
    /// name), e.g. 1h; tests shorten it to watch tokens rotate. None: as long as asked.
    #[arg(long, value_parser = crate::events::parse_ttl)]
    service_account_max_token_expiration: Option<Duration>,
    /// The addresses Services may list in `spec.externalIPs`, e.g. 198.51.100.0/28. None: every
    /// external IP is refused (Kubernetes' DenyServiceExternalIPs), as any node's own traffic
    /// to such an address would go to the Service's Pods.
    #[arg(long, value_parser = AddressPool::parse)]
    external_ip_pool: Option<AddressPool>,
    /// Let Applications name `file://` repositories on this machine (tests, single-user
    /// machines): whoever writes Applications could then read any repository here.
    #[arg(long)]
    allow_file_urls: bool,
    /// The status API's bearer tokens, `token,user,uid,"role,…"` per line (roles: read, debug;
    /// kube-apiserver's --token-auth-file). Default: `<data-dir>/tokens.csv`, made on first
    /// start with one read token (written into `<data-dir>/kubeconfig`).
    #[arg(long)]
    tokens_file: Option<PathBuf>,
    /// More names (addresses or DNS names) for this replica's serving certificate, which holds
    /// its listen address, its address in --peers, the host name and loopback already.
    #[arg(long, value_delimiter = ',')]
    tls_san: Vec<String>,
    /// How long an Event is kept after its last occurrence (kube-apiserver's --event-ttl).
    #[arg(long, default_value = "1h", value_parser = crate::events::parse_ttl)]
    event_ttl: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum StoreKind {
    Sqlite,
    Postgres,
}

fn parse_peers(peers: &[String]) -> anyhow::Result<BTreeMap<NodeId, String>> {
    let mut map = BTreeMap::new();
    for peer in peers {
        let (id, addr) = peer.split_once('=').with_context(|| format!("--peers entry {peer:?} is not id=host:port"))?;
        let id: NodeId =
            id.trim().parse().with_context(|| format!("--peers entry {peer:?}: the id is not a number"))?;
        if map.insert(id, addr.trim().to_owned()).is_some() {
            bail!("--peers names replica {id} twice");
        }
    }
    if !matches!(map.len(), 1 | 3 | 5) {
        bail!("--peers lists {} replicas: run 1, 3 or 5 (an even count tolerates no more failures)", map.len());
    }
    Ok(map)
}

pub async fn server(args: ServerArgs) -> anyhow::Result<()> {
    let peers = parse_peers(&args.peers)?;
    let own = peers.get(&args.id).with_context(|| format!("--id {} is not in --peers", args.id))?;
    let listen: SocketAddr = match args.listen {
        Some(l) => l,
        None => own.parse().with_context(|| format!("this replica's address {own:?} is not host:port"))?,
    };
    let makes_cluster_secrets = peers.keys().next() == Some(&args.id);
    let credentials = Credentials::load(Sources {
        data_dir: &args.data_dir,
        peer_token_file: args.peer_token_file.as_deref(),
        join_token_file: args.join_token_file.as_deref(),
        makes_cluster_secrets,
    })?;
    let secrets = load_keys(&args.data_dir, args.encryption_key_file.as_deref(), makes_cluster_secrets)?;
    let security = Security::load(&args.data_dir, &credentials, args.tokens_file.as_deref(), false)?;
    let tcp = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("listening on {listen}"))?;
    let own_address = own.parse::<SocketAddr>().ok();
    let own_host = own.rsplit_once(':').map_or(own.as_str(), |(host, _)| host).to_owned();
    let names = security::serving_names(listen, &[&[own_host][..], &args.tls_san].concat());
    // Every replica's address, and this one's names: no node may take them.
    let peer_hosts = peers.values().map(|p| p.rsplit_once(':').map_or(p.as_str(), |(host, _)| host));
    let replica_addresses: Vec<std::net::IpAddr> = peer_hosts
        .chain(names.iter().map(String::as_str))
        .filter_map(|host| host.trim_start_matches('[').trim_end_matches(']').parse().ok())
        .collect();
    let mut ranges = ServiceRanges::with_cidr(&args.service_cidr).map_err(anyhow::Error::msg)?;
    ranges.external_ips = args.external_ip_pool;
    ranges.pods = args.controllers.pod_ranges(&ranges)?;
    let certificate =
        security.ca.replica_certificate(&[&names[..], &controlplane::kubernetes_service_names(&ranges)].concat())?;
    let listener = security.listener(tcp, &certificate)?;
    let (chain, key) = certificate.pem();
    let peer_token = PeerToken::new(&credentials.peer_token)
        .context("the peer token")?
        .with_ca(&security.ca.pem())
        .with_identity(&chain, &key);
    let backend = match args.store {
        StoreKind::Sqlite => {
            let mut config = ReplicaConfig::new(args.id, peers, args.data_dir.join("store"), peer_token);
            config.heartbeat = Duration::from_millis(args.heartbeat_ms);
            config.election_timeout = (
                Duration::from_millis(args.election_timeout_min_ms),
                Duration::from_millis(args.election_timeout_max_ms),
            );
            config.snapshot_every = args.snapshot_every;
            config.logs_to_keep = args.logs_to_keep;
            config.secrets = secrets;
            Backend::raft(config).await?
        }
        StoreKind::Postgres => {
            let url = args.postgres_url.as_deref().context("--store postgres needs --postgres-url")?;
            let lease = Duration::from_millis(args.lease_ms);
            Backend::Postgres(PostgresReplica::start(url, args.id, &peers, lease, peer_token, secrets).await?)
        }
    };
    let hint = format!(
        "{}/git/<repository>.git (token in {})",
        security::url(listen),
        args.data_dir.join("git-token").display()
    );
    let kubeconfig = security.write_kubeconfig(listen)?;
    let mut git =
        GitServing::load(&args.data_dir, args.repos_dir, args.webhook_secret_file.as_deref(), args.allow_file_urls)?;
    git.root = args.bootstrap;
    let mut controllers = args.controllers.settings()?;
    controllers.controllers.root_ca = Some(security.ca.pem());
    controllers.controllers.api_endpoints =
        controlplane::api_endpoints(&ranges, &[listen].into_iter().chain(own_address).collect::<Vec<_>>());
    let access = security.access.clone();
    let tls = ReplicaTls { ca: security.ca.clone(), certificate };
    let replica = Replica::start(
        backend,
        vec![listener],
        access,
        &credentials,
        tls,
        git,
        hint,
        ranges,
        controllers,
        args.event_ttl,
        None,
        replica_addresses,
        ServiceAccountTokens {
            key: crate::credentials::service_account_key(&args.data_dir)?,
            max_expiration: args.service_account_max_token_expiration,
        },
    )
    .await?;
    let kubeconfig = kubeconfig.map(|p| p.display().to_string()).unwrap_or_default();
    tracing::info!(id = args.id, url = %security::url(listen), %kubeconfig, "replica started");
    gitplane_nodeagent::cli::stop_signal().await;
    tracing::info!("stopping");
    replica.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_are_checked() {
        let ok = parse_peers(&["1=127.0.0.1:1".into(), "2=127.0.0.1:2".into(), "3=127.0.0.1:3".into()]).unwrap();
        assert_eq!(ok[&2], "127.0.0.1:2");
        assert!(parse_peers(&["1=a".into(), "2=b".into()]).unwrap_err().to_string().contains("1, 3 or 5"));
        assert!(parse_peers(&["x=a".into()]).unwrap_err().to_string().contains("not a number"));
        assert!(parse_peers(&["1=a".into(), "1=b".into(), "2=c".into()]).unwrap_err().to_string().contains("twice"));
    }
}
