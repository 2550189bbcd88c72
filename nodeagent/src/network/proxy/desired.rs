//! The pure core: Services and EndpointSlices in, what this node must do with each Service port
//! out. No I/O, no rule syntax: both appliers render the same [`ServicePort`]s, so the
//! Kubernetes semantics (which endpoints, which policy, reject or drop) live only here.

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use std::collections::BTreeMap;
use std::fmt;
use std::net::Ipv4Addr;

pub use crate::network::cidr::Ipv4Cidr;

/// The label an EndpointSlice names its Service with.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// kube-proxy's default session affinity timeout (3 hours).
pub const DEFAULT_AFFINITY_TIMEOUT: u32 = 10_800;

/// What the proxy needs to know about the node it runs on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeContext {
    /// Endpoints whose `nodeName` is this are local (externalTrafficPolicy / internalTrafficPolicy Local).
    pub node_name: String,
    /// NodePorts answer on these addresses.
    pub node_ips: Vec<Ipv4Addr>,
    /// The cluster's Pod range: traffic to a ClusterIP from outside it is masqueraded, and Pods in
    /// it reach an externalTrafficPolicy Local Service's external addresses through all endpoints.
    pub cluster_cidr: Ipv4Cidr,
    /// The Service range: a new connection to an address in it that no rule translated is refused.
    pub service_cidr: Ipv4Cidr,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    Tcp,
    Udp,
    Sctp,
}

impl Protocol {
    /// The name nft and iptables use.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }

    fn parse(s: Option<&str>) -> Option<Protocol> {
        match s.unwrap_or("TCP") {
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            "SCTP" => Some(Protocol::Sctp),
            _ => None,
        }
    }
}

/// One backend of a Service port, as an EndpointSlice lists it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Endpoint {
    pub ip: Ipv4Addr,
    pub port: u16,
    /// On this node (its `nodeName` is ours).
    pub local: bool,
}

/// `namespace/name:port` as kube-proxy names a Service port (the port name may be empty).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServicePortName {
    pub namespace: String,
    pub name: String,
    pub port: String,
}

impl fmt::Display for ServicePortName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)?;
        if !self.port.is_empty() {
            write!(f, ":{}", self.port)?;
        }
        Ok(())
    }
}

/// `Cluster` or `Local`, for externalTrafficPolicy and internalTrafficPolicy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    Cluster,
    Local,
}

/// Where traffic of one kind goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route<'a> {
    /// Spread equally over these endpoints (never empty).
    Endpoints(&'a [Endpoint]),
    /// The Service has no usable endpoint at all: refuse at once.
    Reject,
    /// A Local policy and no local endpoint while others exist elsewhere: kube-proxy drops.
    Drop,
}

/// What this node does with one port of one Service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePort {
    pub name: ServicePortName,
    pub protocol: Protocol,
    pub cluster_ip: Ipv4Addr,
    pub port: u16,
    /// `spec.externalIPs` and the Service's `status.loadBalancer.ingress` addresses, in order.
    pub external_ips: Vec<Ipv4Addr>,
    pub node_port: Option<u16>,
    /// sessionAffinity ClientIP: its timeout in seconds.
    pub affinity_timeout: Option<u32>,
    pub internal_policy: Policy,
    pub external_policy: Policy,
    /// Ready endpoints; the serving-and-terminating ones when none is ready. Sorted.
    pub cluster_endpoints: Vec<Endpoint>,
    /// The local subset by the same rule (ready local ones, else serving-terminating local ones).
    pub local_endpoints: Vec<Endpoint>,
}

impl ServicePort {
    fn has_endpoints(&self) -> bool {
        !self.cluster_endpoints.is_empty() || !self.local_endpoints.is_empty()
    }

    fn route(&self, policy: Policy) -> Route<'_> {
        if !self.has_endpoints() {
            return Route::Reject;
        }
        let endpoints = match policy {
            Policy::Cluster => &self.cluster_endpoints,
            Policy::Local => &self.local_endpoints,
        };
        if endpoints.is_empty() { Route::Drop } else { Route::Endpoints(endpoints) }
    }

    /// Traffic to the ClusterIP.
    pub fn internal_route(&self) -> Route<'_> {
        self.route(self.internal_policy)
    }

    /// Traffic from outside the cluster to an external address or the NodePort. With
    /// externalTrafficPolicy Local, Pods and the node itself still use [`Self::cluster_route`].
    pub fn external_route(&self) -> Route<'_> {
        self.route(self.external_policy)
    }

    /// All endpoints, whatever the policies say.
    pub fn cluster_route(&self) -> Route<'_> {
        self.route(Policy::Cluster)
    }

    /// Whether anything reaches this port from outside the cluster.
    pub fn has_external(&self) -> bool {
        !self.external_ips.is_empty() || self.node_port.is_some()
    }
}

/// The desired rules for one Service: its ports, or why it has none.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceRules {
    pub ports: Vec<ServicePort>,
    /// Non-fatal problems (a port without a known protocol, an IPv6 address...).
    pub warnings: Vec<String>,
}

fn parse_ip(s: &str) -> Option<Ipv4Addr> {
    s.parse().ok()
}

fn u16_port(p: i32) -> Option<u16> {
    u16::try_from(p).ok().filter(|p| *p != 0)
}

/// The ports of `service` with endpoints from `slices` (the slices of this Service; others are
/// ignored). Headless and ExternalName Services, and Services without an IPv4 ClusterIP, have no
/// rules.
pub fn service_rules(node: &NodeContext, service: &Service, slices: &[&EndpointSlice]) -> ServiceRules {
    let mut out = ServiceRules::default();
    let Some(spec) = service.spec.as_ref() else { return out };
    let namespace = service.metadata.namespace.clone().unwrap_or_else(|| "default".into());
    let name = service.metadata.name.clone().unwrap_or_default();
    let type_ = spec.type_.as_deref().unwrap_or("ClusterIP");
    if type_ == "ExternalName" {
        return out;
    }
    let cluster_ip = match spec.cluster_ip.as_deref() {
        None | Some("") | Some("None") => return out,
        Some(ip) => match parse_ip(ip) {
            Some(ip) => ip,
            None => {
                out.warnings.push(format!("clusterIP {ip:?} is not IPv4; only IPv4 is programmed"));
                return out;
            }
        },
    };
    let mut external_ips = Vec::new();
    for ip in spec.external_ips.iter().flatten() {
        match parse_ip(ip) {
            Some(ip) => external_ips.push(ip),
            None => out.warnings.push(format!("externalIP {ip:?} is not IPv4")),
        }
    }
    if type_ == "LoadBalancer" {
        let ingress = service.status.as_ref().and_then(|s| s.load_balancer.as_ref()).and_then(|lb| lb.ingress.as_ref());
        // ipMode Proxy: the load balancer delivers to the node, not to this address (as kube-proxy).
        for ing in ingress.into_iter().flatten().filter(|i| i.ip_mode.as_deref() != Some("Proxy")) {
            if let Some(ip) = ing.ip.as_deref() {
                match parse_ip(ip) {
                    Some(ip) => external_ips.push(ip),
                    None => out.warnings.push(format!("load balancer address {ip:?} is not IPv4")),
                }
            }
        }
    }
    external_ips.dedup();
    let affinity_timeout = (spec.session_affinity.as_deref() == Some("ClientIP")).then(|| {
        spec.session_affinity_config
            .as_ref()
            .and_then(|c| c.client_ip.as_ref())
            .and_then(|c| c.timeout_seconds)
            .and_then(|t| u32::try_from(t).ok())
            .filter(|t| *t > 0)
            .unwrap_or(DEFAULT_AFFINITY_TIMEOUT)
    });
    let policy = |p: Option<&str>| if p == Some("Local") { Policy::Local } else { Policy::Cluster };
    let internal_policy = policy(spec.internal_traffic_policy.as_deref());
    let external_policy = policy(spec.external_traffic_policy.as_deref());
    let with_node_ports = matches!(type_, "NodePort" | "LoadBalancer");

    for sp in spec.ports.iter().flatten() {
        let port_name = sp.name.clone().unwrap_or_default();
        let Some(protocol) = Protocol::parse(sp.protocol.as_deref()) else {
            out.warnings.push(format!("port {port_name:?}: protocol {:?} is not supported", sp.protocol));
            continue;
        };
        let Some(port) = u16_port(sp.port) else {
            out.warnings.push(format!("port {port_name:?}: {} is not a port number", sp.port));
            continue;
        };
        let node_port = if with_node_ports { sp.node_port.and_then(u16_port) } else { None };
        let (cluster_endpoints, local_endpoints) = endpoints_of(node, &port_name, protocol, slices);
        out.ports.push(ServicePort {
            name: ServicePortName { namespace: namespace.clone(), name: name.clone(), port: port_name },
            protocol,
            cluster_ip,
            port,
            external_ips: external_ips.clone(),
            node_port,
            affinity_timeout,
            internal_policy,
            external_policy,
            cluster_endpoints,
            local_endpoints,
        });
    }
    out
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Condition {
    /// Neither ready nor serving: never used.
    Unusable,
    ServingTerminating,
    Ready,
}

/// The (cluster, local) endpoints of one Service port. Named target ports are already resolved
/// per slice: the slice's port of the same name and protocol gives its endpoints' port.
fn endpoints_of(
    node: &NodeContext,
    port_name: &str,
    protocol: Protocol,
    slices: &[&EndpointSlice],
) -> (Vec<Endpoint>, Vec<Endpoint>) {
    // An endpoint listed by several slices (during a move between slices) counts once, at its best.
    let mut all: BTreeMap<(Ipv4Addr, u16), (Condition, bool)> = BTreeMap::new();
    for slice in slices.iter().filter(|s| s.address_type == "IPv4") {
        let port = slice
            .ports
            .iter()
            .flatten()
            .find(|p| {
                p.name.as_deref().unwrap_or("") == port_name && Protocol::parse(p.protocol.as_deref()) == Some(protocol)
            })
            .and_then(|p| p.port)
            .and_then(u16_port);
        let Some(port) = port else { continue };
        for ep in &slice.endpoints {
            let Some(ip) = ep.addresses.first().and_then(|a| parse_ip(a)) else { continue };
            let c = ep.conditions.as_ref();
            // API semantics: an unset ready or serving means ready; an unset terminating means not.
            let ready = c.and_then(|c| c.ready).unwrap_or(true);
            let serving = c.and_then(|c| c.serving).unwrap_or(ready);
            let terminating = c.and_then(|c| c.terminating).unwrap_or(false);
            let condition = if ready && !terminating {
                Condition::Ready
            } else if serving && terminating {
                Condition::ServingTerminating
            } else {
                Condition::Unusable
            };
            let local = ep.node_name.as_deref() == Some(node.node_name.as_str());
            let entry = all.entry((ip, port)).or_insert((condition, local));
            entry.0 = entry.0.max(condition);
            entry.1 |= local;
        }
    }
    let pick = |only_local: bool| {
        let candidates = || all.iter().filter(move |(_, (_, local))| !only_local || *local);
        let best = candidates().map(|(_, (c, _))| *c).max().unwrap_or(Condition::Unusable);
        if best == Condition::Unusable {
            return Vec::new();
        }
        candidates()
            .filter(|(_, (c, _))| *c == best)
            .map(|((ip, port), (_, local))| Endpoint { ip: *ip, port: *port, local: *local })
            .collect::<Vec<_>>()
    };
    (pick(false), pick(true))
}

/// Key of a Service or EndpointSlice: (namespace, name).
pub type ObjectKey = (String, String);

/// The key of `service`.
pub fn service_key(service: &Service) -> ObjectKey {
    (
        service.metadata.namespace.clone().unwrap_or_else(|| "default".into()),
        service.metadata.name.clone().unwrap_or_default(),
    )
}

/// The Service an EndpointSlice belongs to, from its `kubernetes.io/service-name` label.
pub fn slice_service(slice: &EndpointSlice) -> Option<ObjectKey> {
    let name = slice.metadata.labels.as_ref()?.get(SERVICE_NAME_LABEL)?;
    Some((slice.metadata.namespace.clone().unwrap_or_else(|| "default".into()), name.clone()))
}

/// Every Service's ports by Service: the whole desired state at once, as the [`super::Proxier`]
/// computes it piecemeal (only for Services that changed).
pub fn desired(
    node: &NodeContext,
    services: &[Service],
    slices: &[EndpointSlice],
) -> BTreeMap<ObjectKey, Vec<ServicePort>> {
    let mut by_service: BTreeMap<ObjectKey, Vec<&EndpointSlice>> = BTreeMap::new();
    for slice in slices {
        if let Some(key) = slice_service(slice) {
            by_service.entry(key).or_default().push(slice);
        }
    }
    let mut out = BTreeMap::new();
    for s in services {
        let key = service_key(s);
        let slices = by_service.get(&key).map(Vec::as_slice).unwrap_or(&[]);
        let ports = service_rules(node, s, slices).ports;
        if !ports.is_empty() {
            out.insert(key, ports);
        }
    }
    out
}
