//! One control-plane replica: the replicated store, every service on one listener (status API,
//! node service, store service, Raft), the leader-only control plane, and compaction.

use crate::{backend::Backend, controlplane, credentials::Credentials};
use anyhow::Context as _;
use axum::{Json, routing::get};
use gitplane_apiserver::{
    authn, authz,
    kubelet_client::KubeletClient,
    listener::{self, Transport},
    page,
    serviceaccount::{SigningKey, VerifyingKeys},
};
use gitplane_gitops::{
    githttp,
    mirror::Mirrors,
    prereceive,
    source::{allocate::ServiceRanges, apply::RecordKey, verdict::Verdicts},
    webhook,
};
use gitplane_nodeservice::{
    NodeIdentity, NodeService,
    tls::{ClusterCa, ReplicaCertificate},
    tokens::TokenIssuer,
};
use gitplane_store::{Store, informer::SharedInformerFactory};
use std::{
    collections::HashMap,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};
use tokio::task::JoinHandle;

/// Revisions of history kept for watchers; older ones are compacted away.
const HISTORY: i64 = 10_000;
const COMPACTION_PERIOD: Duration = Duration::from_secs(300);

/// How a replica serves Git: hosted repositories over HTTP (with the Git token), webhooks, and
/// the mirrors of remote repositories.
pub struct GitServing {
    pub repos_dir: PathBuf,
    /// The pre-receive hook's script and socket (`<data-dir>/hooks`).
    pub hooks_dir: PathBuf,
    pub mirrors: Mirrors,
    pub webhook_secret: Option<String>,
    /// The hosted repository of the root Application (app-of-apps), made by the leader if absent.
    pub root: Option<String>,
}

impl GitServing {
    /// The webhook secret lives in a file of the operator's, never on the command line.
    /// `file_urls`: whether Applications may name `file://` repositories (`--allow-file-urls`).
    pub fn load(
        data_dir: &Path,
        repos_dir: PathBuf,
        webhook_secret_file: Option<&Path>,
        file_urls: bool,
    ) -> anyhow::Result<GitServing> {
        let webhook_secret = match webhook_secret_file {
            None => None,
            Some(path) => {
                let meta = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
                if meta.permissions().mode() & 0o077 != 0 {
                    tracing::warn!(file = %path.display(), "the webhook secret file is readable by others: chmod 600 it");
                }
                let secret = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
                Some(secret.trim_end().to_owned()).filter(|s| !s.is_empty())
            }
        };
        let mirrors = Mirrors::new(data_dir.join("mirrors"), gitplane_gitops::mirror::DEFAULT_POLL, file_urls);
        Ok(GitServing { repos_dir, hooks_dir: data_dir.join("hooks"), mirrors, webhook_secret, root: None })
    }
}

/// A replica's TLS: the CA (which signs the nodes' certificates) and its own certificate (which
/// it presents to the kubelet endpoints).
pub struct ReplicaTls {
    pub ca: Arc<ClusterCa>,
    pub certificate: ReplicaCertificate,
}

/// The store and Raft services over TLS admit only peers presenting a replica's certificate
/// (mutual TLS, as etcd's peers); cleartext comes from loopback only, where the peer token
/// (checked by the services themselves, as everywhere) is what there is.
async fn require_replica(request: axum::extract::Request, next: axum::middleware::Next) -> axum::response::Response {
    let peer_service = request.uri().path().starts_with("/gitplane.store.v1.");
    match request.extensions().get::<Transport>() {
        Some(Transport::Tls(subject)) if peer_service && !subject.as_ref().is_some_and(|s| s.is_replica()) => {
            tonic::Status::unauthenticated(
                "the store and Raft services over TLS need a replica's client certificate from the cluster CA",
            )
            .into_http()
        }
        _ => next.run(request).await,
    }
}

/// How a replica issues and checks ServiceAccount tokens.
pub struct ServiceAccountTokens {
    /// This replica's signing key (PKCS#8, `credentials::service_account_key`).
    pub key: Vec<u8>,
    /// The longest a token lives (`--service-account-max-token-expiration`); none: as asked.
    pub max_expiration: Option<Duration>,
}

pub struct Replica {
    pub backend: Backend,
    tasks: Vec<JoinHandle<()>>,
}

impl Replica {
    /// Starts the replica, serving everything on each of `listeners` (each with its own
    /// connection limits); `push_hint` is what the read-only API tells writers; `nodes_netns`,
    /// the network namespace to reach the nodes' kubelet endpoints from (`gitplane up --nodes`);
    /// `access`, who may use the status API; `replica_addresses`, every replica's, which no
    /// node may take.
    #[allow(clippy::too_many_arguments)]
    pub async fn start(
        backend: Backend,
        listeners: Vec<listener::Listener>,
        access: gitplane_apiserver::authn::ApiAccess,
        credentials: &Credentials,
        tls: ReplicaTls,
        git: GitServing,
        push_hint: String,
        service_ranges: ServiceRanges,
        controllers: controlplane::LoopSettings,
        event_ttl: Duration,
        nodes_netns: Option<PathBuf>,
        replica_addresses: Vec<std::net::IpAddr>,
        tokens: ServiceAccountTokens,
    ) -> anyhow::Result<Replica> {
        crate::metrics::register();
        let shared: Arc<dyn Store> = Arc::new(crate::metrics::MeteredStore(backend.store()));
        let identity = NodeIdentity::new(&credentials.join_token, credentials.node_key());
        let kubelet = KubeletClient::new(tls.ca.kubelet_client_config(&tls.certificate)?, nodes_netns);
        let mut controllers = controllers;
        controllers.controllers.pod_metrics =
            Some(Arc::new(crate::pod_metrics::KubeletPodMetrics { store: shared.clone(), kubelet: kubelet.clone() }));
        if let Some(pool) = &service_ranges.external_ips
            && let Some(ip) =
                replica_addresses.iter().find(|ip| matches!(ip, std::net::IpAddr::V4(v4) if pool.contains(*v4)))
        {
            anyhow::bail!(
                "--external-ip-pool {pool} holds the control plane's address {ip}: a Service listing it would take that \
                 address's traffic on every node; give a pool of addresses nothing else uses"
            );
        }
        let reserved = gitplane_nodeservice::addresses::Reserved {
            replicas: replica_addresses,
            services: (service_ranges.network, service_ranges.prefix),
            pods: service_ranges.pods,
            load_balancers: controllers.controllers.load_balancer_pool,
        };
        let key = SigningKey::from_pkcs8(&tokens.key).context("the ServiceAccount token key")?;
        let public_key = key.public_key();
        let verifying = VerifyingKeys::new([public_key.clone()]);
        let issuer = Arc::new(TokenIssuer { key, max_expiration: tokens.max_expiration });
        let nodes = NodeService::new(shared.clone(), identity, tls.ca.clone(), reserved)
            .with_token_issuer(issuer)
            .into_server();
        let grpc =
            backend.routes().add_service(nodes).into_axum_router().layer(axum::middleware::from_fn(require_replica));
        let info = backend.clone();
        let auth = githttp::GitAuth { push_token: credentials.git_token.clone() };
        let record_key = RecordKey::new(credentials.record_key());
        let informers = Arc::new(
            SharedInformerFactory::new(shared.clone(), controlplane::watched_kinds())
                .unannounced(gitplane_controllers::unannounced()),
        );
        let verdicts =
            Arc::new(Verdicts::new(shared.clone(), informers.clone(), record_key.clone(), service_ranges.clone()));
        let plans = verdicts.plans();
        let hook = match prereceive::Hook::start(&git.hooks_dir, &git.repos_dir, verdicts) {
            Ok(hook) => Some(Arc::new(hook)),
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "pushes will not be judged before they land");
                None
            }
        };
        let mut access = access;
        // The Pods and ServiceAccounts tokens are bound to, from this replica's informer.
        access.service_accounts = Some(Arc::new(authn::ServiceAccountTokens::new(verifying, informers.informer())));
        access.rbac = Some(Arc::new(gitplane_apiserver::rbac::RbacAuthorizer::new(informers.informer())));
        let secrets = webhook::WebhookSecrets { default: git.webhook_secret.clone(), per_url: HashMap::new() };
        let api = gitplane_apiserver::router(shared.clone(), push_hint, kubelet);
        let page = page::router(shared.clone(), informers.clone(), git.repos_dir.clone(), access.clone());
        let http = api
            .clone()
            .merge(gitplane_apiserver::head::router(shared.clone(), git.repos_dir.clone()))
            // The status page, and the API again under `/ui` as its data endpoints, where the
            // page's cookie counts (`authz`).
            .merge(page)
            .nest("/ui", api)
            .merge(gitplane_apiserver::health::router(crate::backend::health_observer(backend.clone())))
            .merge(crate::metrics::router(backend.clone()))
            .route(
                "/replica",
                get(move || {
                    let info = info.clone();
                    async move { Json(info.status().await) }
                }),
            )
            // Git and webhooks, merged below, authenticate on their own.
            .layer(axum::middleware::from_fn_with_state(access, authz::admit))
            .merge(githttp::router(git.repos_dir.clone(), auth, hook))
            .merge(webhook::router(git.mirrors.clone(), secrets))
            .fallback(gitplane_apiserver::not_found);
        let mut tasks: Vec<JoinHandle<()>> = listeners
            .into_iter()
            .map(|l| tokio::spawn(listener::serve(l, grpc.clone(), http.clone(), listener::Limits::default())))
            .collect();
        let settings = controlplane::Settings {
            repos_dir: git.repos_dir,
            mirrors: git.mirrors,
            root: git.root,
            record_key,
            service_ranges,
            controllers,
            event_ttl,
            informers,
            plans,
        };
        tasks.push(tokio::spawn(controlplane::run_while_leading(backend.leading(), shared.clone(), settings)));
        tasks.push(tokio::spawn(crate::encryption::reencryptor(backend.clone(), shared.clone())));
        tasks.push(tokio::spawn(publish_key(shared.clone(), public_key)));
        tasks.push(tokio::spawn(compactor(shared)));
        Ok(Replica { backend, tasks })
    }

    /// Waits until some replica leads (the cluster can take writes).
    pub async fn wait_for_leader(&self, timeout: Duration) -> bool {
        let mut leading = self.backend.leading();
        match &self.backend {
            Backend::Raft(store) => {
                let mut metrics = store.raft().metrics();
                tokio::time::timeout(timeout, metrics.wait_for(|m| m.current_leader.is_some())).await.is_ok()
            }
            Backend::Postgres(_) => tokio::time::timeout(timeout, leading.wait_for(|l| *l)).await.is_ok(),
        }
    }

    pub async fn shutdown(self) {
        for task in &self.tasks {
            task.abort();
        }
        self.backend.shutdown().await;
    }
}

/// Adds this replica's public key to the ConfigMap every replica verifies tokens with, retrying
/// until it is there (the store may have no leader yet).
async fn publish_key(store: Arc<dyn Store>, public_key: Vec<u8>) {
    use base64::{Engine as _, engine::general_purpose::STANDARD};
    use gitplane_apiserver::serviceaccount::{PUBLISHED_KEYS_NAME, PUBLISHED_KEYS_NAMESPACE, key_id};
    let key = gitplane_store::ObjectKey::new("ConfigMap", PUBLISHED_KEYS_NAMESPACE, PUBLISHED_KEYS_NAME);
    let (kid, encoded) = (key_id(&public_key), STANDARD.encode(&public_key));
    let mut retry = Duration::from_millis(200);
    loop {
        let op = match store.get(&key).await {
            Ok(Some(current)) if current["data"][&kid] == encoded.as_str() => return,
            Ok(Some(mut current)) => {
                current["data"][&kid] = serde_json::json!(encoded);
                gitplane_store::Op::Update(current)
            }
            Ok(None) => gitplane_store::Op::Create(serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": PUBLISHED_KEYS_NAME, "namespace": PUBLISHED_KEYS_NAMESPACE},
                "data": {kid.clone(): encoded.clone()}})),
            Err(_) => {
                tokio::time::sleep(retry).await;
                continue;
            }
        };
        match store.txn(vec![op]).await {
            Ok(_) => return,
            Err(e) => tracing::debug!(error = %e, "publishing the ServiceAccount token key, retrying"),
        }
        tokio::time::sleep(retry).await;
        retry = (retry * 2).min(Duration::from_secs(10));
    }
}

/// Keeps [`HISTORY`] revisions of watch history on this replica.
async fn compactor(store: Arc<dyn Store>) {
    let mut tick = tokio::time::interval(COMPACTION_PERIOD);
    loop {
        tick.tick().await;
        if let Ok(revision) = store.revision().await
            && revision > HISTORY
            && let Err(e) = store.compact(revision - HISTORY).await
        {
            tracing::warn!(error = %e, "compaction failed");
        }
    }
}
