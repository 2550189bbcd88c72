//! Pod traffic between nodes (host-gw): a route to every other node's podCIDR through that
//! node's InternalIP, and the masquerade of Pod traffic that leaves the cluster's ranges, so
//! Pods reach Pods on any node by pod IP without NAT.
//!
//! A pure core ([`desired`]: Nodes -> routes; [`plan`]: desired x installed -> ops) and thin
//! appliers: [`netlink::Netlink`] for the routing table, [`masquerade`] for the nftables table.
//! The routes gitplane owns carry a protocol number of their own ([`RTPROT_GITPLANE`], `ip route
//! show proto 103`): a reconcile lists and changes those only, so a route someone else made is
//! never replaced or removed, and the routes a previous run of the agent left are found again
//! and repaired. [`PodNetwork::run`] reconciles at start, on every change of a Node (or a fresh
//! list) and every [`RESYNC`].

pub mod masquerade;
pub mod netlink;

use crate::network::cidr::Ipv4Cidr;
use crate::network::view::{Change, Network};
use k8s_openapi::api::core::v1::Node;
use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    net::Ipv4Addr,
    time::Duration,
};
use tokio::sync::{broadcast::error::RecvError, watch};

/// The routing protocol number of gitplane's routes (unassigned in `/etc/iproute2/rt_protos`).
pub const RTPROT_GITPLANE: u8 = 103;
/// How often routes and the masquerade are checked and repaired without being told.
pub const RESYNC: Duration = Duration::from_secs(60);
/// The first and longest wait before a failed reconcile is tried again.
const RETRY_MIN: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// What this node's Pod networking is made of.
#[derive(Clone, Debug)]
pub struct PodNetworkConfig {
    pub node_name: String,
    /// This node's podCIDR: its Pods' addresses, on its own bridge (no route needed).
    pub pod_cidr: Ipv4Cidr,
    /// Every node's podCIDR lies in it; a podCIDR outside it gets no route.
    pub cluster_cidr: Ipv4Cidr,
    /// Services' ClusterIPs: Pod traffic to them is not masqueraded either.
    pub service_cidr: Ipv4Cidr,
}

impl PodNetworkConfig {
    fn masquerade(&self) -> masquerade::Ranges {
        masquerade::Ranges { pod_cidr: self.pod_cidr, cluster_cidr: self.cluster_cidr, service_cidr: self.service_cidr }
    }
}

/// A route to one node's Pods.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodRoute {
    pub dst: Ipv4Cidr,
    pub gateway: Ipv4Addr,
    pub node: String,
}

/// Why a Node gets no route.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Skipped {
    NoPodCidr,
    NoInternalIp,
    BadPodCidr(String),
    OutsideCluster(Ipv4Cidr),
    /// Overlaps the podCIDR of this node or of a node earlier by name.
    Overlaps {
        pod_cidr: Ipv4Cidr,
        node: String,
    },
}

/// The routes this node should have, by destination, and the Nodes left out.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Desired {
    pub routes: BTreeMap<Ipv4Cidr, PodRoute>,
    pub skipped: Vec<(String, Skipped)>,
}

fn internal_ip(node: &Node) -> Option<Ipv4Addr> {
    let addresses = node.status.as_ref()?.addresses.as_ref()?;
    addresses.iter().filter(|a| a.type_ == "InternalIP").find_map(|a| a.address.parse().ok())
}

/// The pure core: a route per other Node with a podCIDR inside the cluster's range and an IPv4
/// InternalIP. A podCIDR that overlaps this node's, or one already routed, gets none: a route
/// must never take a range from another node.
pub fn desired<'a>(cfg: &PodNetworkConfig, nodes: impl IntoIterator<Item = &'a Node>) -> Desired {
    let mut out = Desired::default();
    for node in nodes {
        let name = node.metadata.name.clone().unwrap_or_default();
        if name == cfg.node_name {
            continue;
        }
        let mut skip = |why| out.skipped.push((name.clone(), why));
        let Some(text) = node.spec.as_ref().and_then(|s| s.pod_cidr.as_deref()) else {
            skip(Skipped::NoPodCidr);
            continue;
        };
        let Ok(pod_cidr) = text.parse::<Ipv4Cidr>() else {
            skip(Skipped::BadPodCidr(text.to_owned()));
            continue;
        };
        if !cfg.cluster_cidr.covers(&pod_cidr) {
            skip(Skipped::OutsideCluster(pod_cidr));
            continue;
        }
        let Some(gateway) = internal_ip(node) else {
            skip(Skipped::NoInternalIp);
            continue;
        };
        let taken = if pod_cidr.overlaps(&cfg.pod_cidr) {
            Some(cfg.node_name.clone())
        } else {
            out.routes.values().find(|r| r.dst.overlaps(&pod_cidr)).map(|r| r.node.clone())
        };
        if let Some(node) = taken {
            skip(Skipped::Overlaps { pod_cidr, node });
            continue;
        }
        out.routes.insert(pod_cidr, PodRoute { dst: pod_cidr, gateway, node: name });
    }
    out
}

/// A route of gitplane's protocol in the main table, as the kernel has it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Installed {
    pub dst: Ipv4Cidr,
    pub gateway: Option<Ipv4Addr>,
    /// The metric; gitplane's routes have 0.
    pub priority: u32,
}

/// One change to the routing table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RouteOp {
    Add(PodRoute),
    /// A route of ours to the same destination with another gateway (the node's address changed).
    Replace(PodRoute),
    Delete(Installed),
}

impl fmt::Display for RouteOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let via = |gw: Option<Ipv4Addr>| gw.map(|g| format!(" via {g}")).unwrap_or_default();
        match self {
            RouteOp::Add(r) => write!(f, "add route {} via {} (node {})", r.dst, r.gateway, r.node),
            RouteOp::Replace(r) => write!(f, "replace route {} via {} (node {})", r.dst, r.gateway, r.node),
            RouteOp::Delete(r) => write!(f, "delete route {}{} metric {}", r.dst, via(r.gateway), r.priority),
        }
    }
}

/// The ops that turn `installed` (ours only) into `desired`: deletions first, then
/// replacements, then additions; nothing for a route that is right already.
pub fn plan(desired: &BTreeMap<Ipv4Cidr, PodRoute>, installed: &[Installed]) -> Vec<RouteOp> {
    let (mut deletes, mut replaces, mut adds) = (Vec::new(), Vec::new(), Vec::new());
    let mut kept = BTreeSet::new();
    for route in installed {
        match desired.get(&route.dst) {
            // One route per destination is kept; any other (another metric) goes.
            Some(want) if route.priority == 0 && kept.insert(route.dst) => {
                if route.gateway != Some(want.gateway) {
                    replaces.push(RouteOp::Replace(want.clone()));
                }
            }
            _ => deletes.push(RouteOp::Delete(route.clone())),
        }
    }
    adds.extend(desired.values().filter(|r| !kept.contains(&r.dst)).cloned().map(RouteOp::Add));
    deletes.into_iter().chain(replaces).chain(adds).collect()
}

#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    #[error("opening a netlink socket for the routing table: {0}")]
    Socket(#[source] std::io::Error),
    #[error("listing routes over netlink: {0}")]
    List(#[source] std::io::Error),
    #[error("{op}: {source}")]
    Apply { op: RouteOp, source: std::io::Error },
    #[error("enabling IPv4 forwarding (/proc/sys/net/ipv4/ip_forward): {0}")]
    Forwarding(#[source] std::io::Error),
}

/// Where routes are kept: the kernel's main table ([`netlink::Netlink`]), or a fake in tests.
pub trait RouteTable {
    /// gitplane's routes (its protocol, the main table, IPv4).
    fn installed(&self) -> impl Future<Output = Result<Vec<Installed>, RouteError>> + Send;
    fn apply(&self, op: &RouteOp) -> impl Future<Output = Result<(), RouteError>> + Send;
}

/// What one reconcile did.
#[derive(Debug, Default)]
pub struct Outcome {
    pub applied: Vec<RouteOp>,
    pub failed: Vec<RouteError>,
}

/// Lists the installed routes and applies the plan; a failed op does not stop the others.
pub async fn reconcile<T: RouteTable>(table: &T, desired: &BTreeMap<Ipv4Cidr, PodRoute>) -> Outcome {
    let mut outcome = Outcome::default();
    let installed = match table.installed().await {
        Ok(installed) => installed,
        Err(e) => {
            outcome.failed.push(e);
            return outcome;
        }
    };
    for op in plan(desired, &installed) {
        match table.apply(&op).await {
            Ok(()) => outcome.applied.push(op),
            Err(e) => outcome.failed.push(e),
        }
    }
    outcome
}

enum Wake {
    Stop,
    /// A change that concerns no route.
    Idle,
    Sync,
    /// A sync that also puts the masquerade back.
    Resync,
}

/// The node's Pod networking beyond its own bridge.
pub struct PodNetwork<T> {
    cfg: PodNetworkConfig,
    table: T,
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Masquerade(#[from] masquerade::MasqueradeError),
    #[error(transparent)]
    Routes(#[from] RouteError),
}

impl<T: RouteTable> PodNetwork<T> {
    pub fn new(cfg: PodNetworkConfig, table: T) -> Self {
        PodNetwork { cfg, table }
    }

    /// Brings the routes to what `nodes` ask for, and logs what changed and what failed; whether
    /// everything succeeded.
    pub async fn sync<'a>(&self, nodes: impl IntoIterator<Item = &'a Node>) -> bool {
        let desired = desired(&self.cfg, nodes);
        for (node, why) in &desired.skipped {
            tracing::debug!(%node, ?why, "no route to this node's Pods");
        }
        let outcome = reconcile(&self.table, &desired.routes).await;
        for op in &outcome.applied {
            tracing::info!(%op, "pod route changed");
        }
        for error in &outcome.failed {
            tracing::warn!(%error, "pod route not changed; retrying");
        }
        outcome.failed.is_empty()
    }

    /// Follows the Nodes in `network` until `shutdown`: a reconcile once the first list is in,
    /// then after each change of a Node, each fresh list, each failure (with back-off) and every
    /// [`RESYNC`] (which also puts the masquerade back).
    pub async fn run(&self, network: &Network, mut shutdown: watch::Receiver<bool>) {
        let mut changes = network.subscribe();
        tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return,
            _ = network.synced() => {}
        }
        let mut resync = tokio::time::interval_at(tokio::time::Instant::now() + RESYNC, RESYNC);
        resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut retry = RETRY_MIN;
        let mut next_retry: Option<tokio::time::Instant> = None;
        let mut wake = Wake::Sync;
        loop {
            match wake {
                Wake::Stop => return,
                Wake::Idle => {}
                Wake::Sync | Wake::Resync => {
                    if matches!(wake, Wake::Resync)
                        && let Err(error) = masquerade::apply(&self.cfg.masquerade()).await
                    {
                        tracing::warn!(%error, "putting the masquerade back failed");
                    }
                    let nodes: Vec<_> = network.view().nodes.values().cloned().collect();
                    if self.sync(nodes.iter().map(|n| &**n)).await {
                        (retry, next_retry) = (RETRY_MIN, None);
                    } else {
                        next_retry = Some(tokio::time::Instant::now() + retry);
                        retry = (retry * 2).min(RETRY_MAX);
                    }
                }
            }
            let far = tokio::time::Instant::now() + RESYNC;
            wake = tokio::select! {
                _ = shutdown.wait_for(|s| *s) => Wake::Stop,
                _ = tokio::time::sleep_until(next_retry.unwrap_or(far)), if next_retry.is_some() => Wake::Sync,
                _ = resync.tick() => Wake::Resync,
                change = changes.recv() => match change {
                    Ok(batch) if batch.iter().any(|c| matches!(c, Change::Node(_) | Change::Relisted)) => Wake::Sync,
                    Ok(_) => Wake::Idle,
                    Err(RecvError::Lagged(_)) => Wake::Sync,
                    Err(RecvError::Closed) => Wake::Stop,
                },
            };
        }
    }

    /// Removes gitplane's routes and its masquerade table (the node stops running Pods).
    pub async fn clean_up(&self) {
        if !self.sync(std::iter::empty()).await {
            tracing::warn!("some pod routes could not be removed");
        }
        if let Err(error) = masquerade::remove().await {
            tracing::warn!(%error, "removing the masquerade table failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::Mutex;

    fn cidr(text: &str) -> Ipv4Cidr {
        text.parse().unwrap()
    }

    fn cfg() -> PodNetworkConfig {
        PodNetworkConfig {
            node_name: "n1".into(),
            pod_cidr: cidr("10.244.0.0/24"),
            cluster_cidr: cidr("10.244.0.0/16"),
            service_cidr: cidr("10.96.0.0/12"),
        }
    }

    fn node(name: &str, pod_cidr: Option<&str>, ip: Option<&str>) -> Node {
        let mut addresses = vec![json!({"type": "Hostname", "address": name})];
        addresses.extend(ip.map(|ip| json!({"type": "InternalIP", "address": ip})));
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"podCIDR": pod_cidr},
            "status": {"addresses": addresses},
        }))
        .unwrap()
    }

    fn route(dst: &str, gateway: &str, node: &str) -> PodRoute {
        PodRoute { dst: cidr(dst), gateway: gateway.parse().unwrap(), node: node.into() }
    }

    fn installed(dst: &str, gateway: &str, priority: u32) -> Installed {
        Installed { dst: cidr(dst), gateway: Some(gateway.parse().unwrap()), priority }
    }

    #[test]
    fn every_other_node_with_a_pod_cidr_and_an_address_gets_a_route() {
        let nodes = [
            node("n1", Some("10.244.0.0/24"), Some("172.29.0.11")),
            node("n2", Some("10.244.1.0/24"), Some("172.29.0.12")),
            node("n3", Some("10.244.2.0/24"), Some("172.29.0.13")),
            node("no-cidr", None, Some("172.29.0.14")),
            node("no-ip", Some("10.244.4.0/24"), None),
            node("bad", Some("10.244.5.1/24"), Some("172.29.0.16")),
            node("outside", Some("192.168.0.0/24"), Some("172.29.0.17")),
            node("everything", Some("0.0.0.0/0"), Some("172.29.0.18")),
            node("mine", Some("10.244.0.0/25"), Some("172.29.0.19")),
            node("twin", Some("10.244.2.0/24"), Some("172.29.0.20")),
        ];
        let desired = desired(&cfg(), &nodes);
        assert_eq!(
            desired.routes.values().cloned().collect::<Vec<_>>(),
            [route("10.244.1.0/24", "172.29.0.12", "n2"), route("10.244.2.0/24", "172.29.0.13", "n3")]
        );
        assert_eq!(
            desired.skipped,
            [
                ("no-cidr".into(), Skipped::NoPodCidr),
                ("no-ip".into(), Skipped::NoInternalIp),
                ("bad".into(), Skipped::BadPodCidr("10.244.5.1/24".into())),
                ("outside".into(), Skipped::OutsideCluster(cidr("192.168.0.0/24"))),
                ("everything".into(), Skipped::OutsideCluster(cidr("0.0.0.0/0"))),
                ("mine".into(), Skipped::Overlaps { pod_cidr: cidr("10.244.0.0/25"), node: "n1".into() }),
                ("twin".into(), Skipped::Overlaps { pod_cidr: cidr("10.244.2.0/24"), node: "n3".into() }),
            ]
        );
    }

    #[test]
    fn plan_touches_only_what_differs() {
        let desired: BTreeMap<_, _> = [
            route("10.244.1.0/24", "172.29.0.12", "n2"),
            route("10.244.2.0/24", "172.29.0.13", "n3"),
            route("10.244.3.0/24", "172.29.0.14", "n4"),
        ]
        .into_iter()
        .map(|r| (r.dst, r))
        .collect();
        let installed = [
            installed("10.244.1.0/24", "172.29.0.12", 0),  // right: kept
            installed("10.244.2.0/24", "172.29.0.99", 0),  // the node moved: replaced
            installed("10.244.1.0/24", "172.29.0.12", 50), // a second one: deleted
            installed("10.244.9.0/24", "172.29.0.19", 0),  // its node left: deleted
        ];
        assert_eq!(
            plan(&desired, &installed),
            [
                RouteOp::Delete(installed[2].clone()),
                RouteOp::Delete(installed[3].clone()),
                RouteOp::Replace(route("10.244.2.0/24", "172.29.0.13", "n3")),
                RouteOp::Add(route("10.244.3.0/24", "172.29.0.14", "n4")),
            ]
        );
        assert_eq!(plan(&BTreeMap::new(), &installed[..1]), [RouteOp::Delete(installed[0].clone())]);
        assert!(plan(&BTreeMap::new(), &[]).is_empty());
    }

    /// A routing table in memory; `refuse` makes adds of that destination fail.
    #[derive(Default)]
    struct FakeTable {
        routes: Mutex<Vec<Installed>>,
        refuse: Mutex<Option<Ipv4Cidr>>,
    }

    impl RouteTable for FakeTable {
        async fn installed(&self) -> Result<Vec<Installed>, RouteError> {
            Ok(self.routes.lock().unwrap().clone())
        }

        async fn apply(&self, op: &RouteOp) -> Result<(), RouteError> {
            let mut routes = self.routes.lock().unwrap();
            match op {
                RouteOp::Add(r) | RouteOp::Replace(r) => {
                    if *self.refuse.lock().unwrap() == Some(r.dst) {
                        let source = std::io::Error::from_raw_os_error(libc::ENETUNREACH);
                        return Err(RouteError::Apply { op: op.clone(), source });
                    }
                    routes.retain(|i| !(i.dst == r.dst && i.priority == 0));
                    routes.push(Installed { dst: r.dst, gateway: Some(r.gateway), priority: 0 });
                }
                RouteOp::Delete(d) => routes.retain(|i| i != d),
            }
            Ok(())
        }
    }

    #[tokio::test]
    async fn sync_repairs_what_a_previous_run_left_and_follows_nodes() {
        let table = FakeTable::default();
        // Left by a previous run: a node that has gone since, and a route someone changed.
        table.routes.lock().unwrap().extend([installed("10.244.7.0/24", "172.29.0.17", 0)]);
        table.routes.lock().unwrap().push(installed("10.244.1.0/24", "172.29.0.99", 0));
        let net = PodNetwork::new(cfg(), table);
        let n2 = node("n2", Some("10.244.1.0/24"), Some("172.29.0.12"));
        let n3 = node("n3", Some("10.244.2.0/24"), Some("172.29.0.13"));
        assert!(net.sync([&n2, &n3]).await);
        let mut now = net.table.installed().await.unwrap();
        now.sort_by_key(|r| r.dst);
        assert_eq!(now, [installed("10.244.1.0/24", "172.29.0.12", 0), installed("10.244.2.0/24", "172.29.0.13", 0)]);

        // A node that cannot be routed to makes the sync fail (the loop retries), the rest holds.
        *net.table.refuse.lock().unwrap() = Some(cidr("10.244.3.0/24"));
        let n4 = node("n4", Some("10.244.3.0/24"), Some("192.0.2.4"));
        assert!(!net.sync([&n2, &n3, &n4]).await);
        assert_eq!(net.table.installed().await.unwrap().len(), 2);

        // n3 leaves.
        *net.table.refuse.lock().unwrap() = None;
        assert!(net.sync([&n2]).await);
        assert_eq!(net.table.installed().await.unwrap(), [installed("10.244.1.0/24", "172.29.0.12", 0)]);
        assert!(net.sync([]).await);
        assert!(net.table.installed().await.unwrap().is_empty());
    }
}
