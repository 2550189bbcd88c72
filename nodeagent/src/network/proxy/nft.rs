//! The nftables layout and its state: [`ServicePort`]s to `nft -f` text, in full or as the
//! element changes between two states, and the elements to load into an empty table. Pure:
//! [`crate::network::netfilter`] runs the text and sends the elements.
//!
//! Layout (table `ip gitplane-proxy`): no chain per Service or per endpoint. A Service port is
//! a few elements of named maps:
//! - `service-ips` (`daddr . proto . port : verdict`) sends a ClusterIP or external address to
//!   an entry chain, and `service-nodeports` (`proto . port : verdict`) does so for the node's
//!   addresses (`nodeport-ips`);
//! - `endpoints` (`daddr . proto . port . bucket : endpoint ip . port`) holds the endpoints, one
//!   element per bucket; a shared chain `dnat-c<n>` picks `numgen random mod n` and looks the
//!   bucket up. `local-endpoints`, `nodeport-endpoints` and `nodeport-local-endpoints` do the
//!   same for local endpoints and NodePorts.
//!
//! Entry and dnat chains are parametric (named by endpoint counts and options), so there are
//! as many as there are distinct counts, not Services, and a Service's rules never change:
//! only elements do. kube-proxy's layout (a chain per Service and per endpoint with an
//! anonymous `numgen` vmap each) takes 142-150 s to load at 10,000 Services × 10 endpoints
//! here; this one about 2.6 s of CPU, most of it nft's parser, and one endpoint change is a
//! handful of element deletes and adds, about 20 ms (BENCHMARKS.md).

use super::desired::{Endpoint, Ipv4Cidr, NodeContext, ObjectKey, Policy, Route, ServicePort};
use crate::network::netfilter::netlink::{Data, Field};
use std::collections::{BTreeSet, HashMap};
use std::fmt::{self, Write};
use std::net::Ipv4Addr;
use std::sync::Arc;

/// The table this applier owns; nothing else in the kernel is touched.
pub const TABLE: &str = "gitplane-proxy";

/// The packet mark bit that asks for masquerade, as kube-proxy's.
const MASQ_MARK: &str = "0x4000";

/// The named sets and maps whose elements the layout manages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Set {
    ServiceIps,
    ServiceNodeports,
    NodeportIps,
    Endpoints,
    LocalEndpoints,
    NodeportEndpoints,
    NodeportLocalEndpoints,
    NoEndpointServices,
    NoEndpointNodeports,
    Hairpin,
    AffinityServices,
}

const SETS: [Set; 11] = [
    Set::ServiceIps,
    Set::ServiceNodeports,
    Set::NodeportIps,
    Set::Endpoints,
    Set::LocalEndpoints,
    Set::NodeportEndpoints,
    Set::NodeportLocalEndpoints,
    Set::NoEndpointServices,
    Set::NoEndpointNodeports,
    Set::Hairpin,
    Set::AffinityServices,
];

/// One set's elements as netlink loads them: (key, value) in nft syntax, with the fields they
/// are encoded as.
pub(crate) struct SetElements<'a> {
    pub set: &'static str,
    pub key: &'static [Field],
    pub data: Data,
    pub elements: Vec<(&'a str, &'a str)>,
}

/// The dynamic map of session affinity: client . service address . proto . port : endpoint.
/// Written by the packet path; a sync never flushes it, only removes entries of endpoints gone.
pub const AFFINITY_MAP: &str = "affinity";

impl Set {
    fn name(self) -> &'static str {
        match self {
            Set::ServiceIps => "service-ips",
            Set::ServiceNodeports => "service-nodeports",
            Set::NodeportIps => "nodeport-ips",
            Set::Endpoints => "endpoints",
            Set::LocalEndpoints => "local-endpoints",
            Set::NodeportEndpoints => "nodeport-endpoints",
            Set::NodeportLocalEndpoints => "nodeport-local-endpoints",
            Set::NoEndpointServices => "no-endpoint-services",
            Set::NoEndpointNodeports => "no-endpoint-nodeports",
            Set::Hairpin => "hairpin",
            Set::AffinityServices => "affinity-services",
        }
    }

    /// The type between the braces of its declaration.
    fn declaration(self) -> &'static str {
        // The numgen part only gives the key's last field its type (a 32-bit integer). `tcp
        // dport` only types the port field (the rules load it with `th dport`, any protocol):
        // nft 1.0.6 cannot read back a `typeof` with `th` after `ip` ("conflicting protocols").
        const ADDRESS_ENDPOINTS: &str =
            "typeof ip daddr . meta l4proto . tcp dport . numgen random mod 1 : ip daddr . tcp dport;";
        const NODEPORT_ENDPOINTS: &str =
            "typeof meta l4proto . tcp dport . numgen random mod 1 : ip daddr . tcp dport;";
        match self {
            Set::ServiceIps | Set::AffinityServices => "type ipv4_addr . inet_proto . inet_service : verdict;",
            Set::ServiceNodeports => "type inet_proto . inet_service : verdict;",
            Set::NodeportIps => "type ipv4_addr;",
            Set::Endpoints | Set::LocalEndpoints => ADDRESS_ENDPOINTS,
            Set::NodeportEndpoints | Set::NodeportLocalEndpoints => NODEPORT_ENDPOINTS,
            Set::NoEndpointServices => "type ipv4_addr . inet_proto . inet_service;",
            Set::NoEndpointNodeports => "type inet_proto . inet_service;",
            Set::Hairpin => "type ipv4_addr . ipv4_addr;",
        }
    }

    fn is_map(self) -> bool {
        self.declaration().contains(" : ")
    }

    fn kind(self) -> &'static str {
        if self.is_map() { "map" } else { "set" }
    }

    /// Its key and value fields, for [`crate::network::netfilter::netlink`].
    fn fields(self) -> (&'static [Field], Data) {
        use Field::{Bucket, Ipv4, Port, Proto};
        const ENDPOINT: &[Field] = &[Ipv4, Port];
        match self {
            Set::ServiceIps | Set::AffinityServices => (&[Ipv4, Proto, Port], Data::Verdict),
            Set::ServiceNodeports => (&[Proto, Port], Data::Verdict),
            Set::NodeportIps => (&[Ipv4], Data::None),
            Set::Endpoints | Set::LocalEndpoints => (&[Ipv4, Proto, Port, Bucket], Data::Value(ENDPOINT)),
            Set::NodeportEndpoints | Set::NodeportLocalEndpoints => (&[Proto, Port, Bucket], Data::Value(ENDPOINT)),
            Set::NoEndpointServices => (&[Ipv4, Proto, Port], Data::None),
            Set::NoEndpointNodeports => (&[Proto, Port], Data::None),
            Set::Hairpin => (&[Ipv4, Ipv4], Data::None),
        }
    }
}

/// Which endpoints a dnat chain picks from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Group {
    /// All usable endpoints.
    Cluster,
    /// Those on this node.
    Local,
}

/// The chains the layout may need beyond the fixed ones, named by what they do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Chain {
    /// `numgen random mod n` over a group's endpoint map.
    Dnat { nodeport: bool, group: Group, n: usize },
    /// A ClusterIP: masquerade sources outside the Pod range, then the group's endpoints.
    ClusterIp { group: Group, n: usize, affinity: bool },
    /// An external address or NodePort, externalTrafficPolicy Cluster: always masquerade.
    External { nodeport: bool, n: usize, affinity: bool },
    /// externalTrafficPolicy Local: Pods and the node itself use all `n` endpoints (the node
    /// masqueraded), other sources only the `m` local ones, or are dropped when `m` is 0.
    ExternalLocal { nodeport: bool, n: usize, m: usize, affinity: bool },
    /// internalTrafficPolicy Local without a local endpoint.
    Drop,
    /// Records a new connection's endpoint in the affinity map for `timeout` seconds.
    AffinityRecord { timeout: u32 },
}

fn prefix(nodeport: bool) -> &'static str {
    if nodeport { "nodeport-" } else { "" }
}

fn group_letter(group: Group) -> char {
    match group {
        Group::Cluster => 'c',
        Group::Local => 'l',
    }
}

fn affinity_suffix(affinity: bool) -> &'static str {
    if affinity { "-affinity" } else { "" }
}

impl fmt::Display for Chain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Chain::Dnat { nodeport, group, n } => write!(f, "{}dnat-{}{n}", prefix(nodeport), group_letter(group)),
            Chain::ClusterIp { group, n, affinity } => {
                write!(f, "clusterip-{}{n}{}", group_letter(group), affinity_suffix(affinity))
            }
            Chain::External { nodeport, n, affinity } => {
                let kind = if nodeport { "nodeport" } else { "external" };
                write!(f, "{kind}-c{n}{}", affinity_suffix(affinity))
            }
            Chain::ExternalLocal { nodeport, n, m, affinity } => {
                let kind = if nodeport { "nodeport" } else { "external" };
                write!(f, "{kind}-local-c{n}-l{m}{}", affinity_suffix(affinity))
            }
            Chain::Drop => f.write_str("no-local-endpoints"),
            Chain::AffinityRecord { timeout } => write!(f, "affinity-{timeout}s"),
        }
    }
}

const AFFINITY_LOOKUP: &str = "dnat to ip saddr . ip daddr . meta l4proto . th dport map @affinity";

impl Chain {
    /// The chains this one jumps to.
    fn needs(self) -> Vec<Chain> {
        match self {
            Chain::ClusterIp { group, n, .. } => vec![Chain::Dnat { nodeport: false, group, n }],
            Chain::External { nodeport, n, .. } => vec![Chain::Dnat { nodeport, group: Group::Cluster, n }],
            Chain::ExternalLocal { nodeport, n, m, .. } => {
                let mut v = vec![Chain::Dnat { nodeport, group: Group::Cluster, n }];
                if m > 0 {
                    v.push(Chain::Dnat { nodeport, group: Group::Local, n: m });
                }
                v
            }
            Chain::Dnat { .. } | Chain::Drop | Chain::AffinityRecord { .. } => Vec::new(),
        }
    }

    fn rules(self, node: &NodeContext) -> Vec<String> {
        let cluster = node.cluster_cidr;
        match self {
            Chain::Dnat { nodeport, group, n } => {
                let map = match (nodeport, group) {
                    (false, Group::Cluster) => Set::Endpoints,
                    (false, Group::Local) => Set::LocalEndpoints,
                    (true, Group::Cluster) => Set::NodeportEndpoints,
                    (true, Group::Local) => Set::NodeportLocalEndpoints,
                };
                let key = if nodeport { "meta l4proto . th dport" } else { "ip daddr . meta l4proto . th dport" };
                vec![format!("dnat to {key} . numgen random mod {n} map @{}", map.name())]
            }
            Chain::ClusterIp { group, n, affinity } => {
                let mut v = vec![format!("ip saddr != {cluster} jump mark-for-masquerade")];
                if affinity {
                    v.push(AFFINITY_LOOKUP.into());
                }
                v.push(format!("goto {}", Chain::Dnat { nodeport: false, group, n }));
                v
            }
            Chain::External { nodeport, n, affinity } => {
                let mut v = vec!["jump mark-for-masquerade".to_owned()];
                if affinity {
                    v.push(AFFINITY_LOOKUP.into());
                }
                v.push(format!("goto {}", Chain::Dnat { nodeport, group: Group::Cluster, n }));
                v
            }
            Chain::ExternalLocal { nodeport, n, m, affinity } => {
                let all = Chain::Dnat { nodeport, group: Group::Cluster, n };
                let mut v = vec!["fib saddr type local jump mark-for-masquerade".to_owned()];
                if affinity {
                    v.push(AFFINITY_LOOKUP.into());
                }
                v.push(format!("ip saddr {cluster} goto {all}"));
                v.push(format!("fib saddr type local goto {all}"));
                v.push(if m > 0 {
                    format!("goto {}", Chain::Dnat { nodeport, group: Group::Local, n: m })
                } else {
                    "drop".into()
                });
                v
            }
            Chain::Drop => vec!["drop".into()],
            Chain::AffinityRecord { timeout } => vec![format!(
                "meta l4proto {{ tcp, udp, sctp }} update @{AFFINITY_MAP} {{ ip saddr . ct original ip daddr . meta l4proto . ct original proto-dst timeout {timeout}s : ip daddr . th dport }}"
            )],
        }
    }
}

/// The fixed chains: (name, base chain declaration or "", rules).
fn fixed_chains(node: &NodeContext) -> Vec<(&'static str, &'static str, Vec<String>)> {
    let service_cidr: Ipv4Cidr = node.service_cidr;
    let record = "ct state new ct status dnat meta l4proto { tcp, udp, sctp } ct original ip daddr . meta l4proto . ct original proto-dst vmap @affinity-services";
    let check = "ct state new jump service-check";
    vec![
        ("nat-prerouting", "type nat hook prerouting priority -100; policy accept;", vec!["jump services".into()]),
        ("nat-output", "type nat hook output priority -100; policy accept;", vec!["jump services".into()]),
        (
            "nat-postrouting",
            "type nat hook postrouting priority 100; policy accept;",
            vec![
                format!(
                    "meta mark & {MASQ_MARK} == {MASQ_MARK} meta mark set meta mark ^ {MASQ_MARK} masquerade fully-random"
                ),
                // Hairpin: a Pod that reached itself through a Service must see the reply come
                // from the node, or it would drop its own packet as a martian.
                "ct status dnat ip saddr . ip daddr @hairpin masquerade fully-random".into(),
            ],
        ),
        (
            "services",
            "",
            vec![
                "ip daddr . meta l4proto . th dport vmap @service-ips".into(),
                "ip daddr @nodeport-ips meta l4proto . th dport vmap @service-nodeports".into(),
            ],
        ),
        ("mark-for-masquerade", "", vec![format!("meta mark set meta mark | {MASQ_MARK}")]),
        ("filter-input", "type filter hook input priority -10; policy accept;", vec![check.into()]),
        ("filter-forward", "type filter hook forward priority -10; policy accept;", vec![check.into()]),
        ("filter-output", "type filter hook output priority -10; policy accept;", vec![check.into()]),
        (
            "service-check",
            "",
            vec![
                "ip daddr . meta l4proto . th dport @no-endpoint-services goto refuse".into(),
                "ip daddr @nodeport-ips meta l4proto . th dport @no-endpoint-nodeports goto refuse".into(),
                // An address of the Service range that no rule translated: refuse rather than
                // route it towards the default gateway, unless the node holds it itself
                // (cluster DNS's address on its dummy interface).
                "fib daddr type local return".into(),
                format!("ip daddr {service_cidr} goto refuse"),
            ],
        ),
        ("refuse", "", vec!["meta l4proto tcp reject with tcp reset".into(), "reject".into()]),
        ("affinity-prerouting", "type filter hook prerouting priority -90; policy accept;", vec![record.into()]),
        ("affinity-output", "type filter hook output priority -90; policy accept;", vec![record.into()]),
    ]
}

fn affinity_declaration() -> String {
    format!(
        "add map ip {TABLE} {AFFINITY_MAP} {{ typeof ip saddr . ip daddr . meta l4proto . tcp dport : ip daddr . tcp dport; flags dynamic,timeout; timeout 3h; size 1048576; }}"
    )
}

/// Element text, shared between a Service's fragment and the element table.
type Text = Arc<str>;

/// Who contributed an element: the node (its addresses) or a Service.
type Owner = Arc<ObjectKey>;

/// What one Service (or the node) contributes: elements and the parametric chains they use.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Fragment {
    elements: Vec<(Set, Text, Text)>,
    chains: Vec<Chain>,
    /// Endpoints (`ip . port`) of its affinity Service ports.
    affinity_endpoints: Vec<String>,
}

impl Fragment {
    fn add(&mut self, set: Set, key: String, value: String) {
        self.elements.push((set, key.into(), value.into()));
    }

    fn chain(&mut self, chain: Chain) {
        for c in chain.needs() {
            self.chain(c);
        }
        self.chains.push(chain);
    }

    fn endpoints(&mut self, set: Set, key_prefix: &str, endpoints: &[Endpoint]) {
        for (bucket, ep) in endpoints.iter().enumerate() {
            self.add(set, format!("{key_prefix} . {bucket}"), format!("{} . {}", ep.ip, ep.port));
        }
    }

    /// An entry verdict: `goto <chain>`, recording the chain as used.
    fn goto(&mut self, chain: Chain) -> String {
        self.chain(chain);
        format!("goto {chain}")
    }
}

fn node_fragment(node: &NodeContext) -> Fragment {
    let mut f = Fragment::default();
    for ip in &node.node_ips {
        f.add(Set::NodeportIps, ip.to_string(), String::new());
    }
    f
}

fn service_fragment(node: &NodeContext, ports: &[ServicePort]) -> Fragment {
    let mut f = Fragment::default();
    for sp in ports {
        port_fragment(node, sp, &mut f);
    }
    // Ports of one Service may share elements (a hairpin pair): each once, in a fixed order.
    f.elements.sort();
    f.elements.dedup();
    f
}

fn port_fragment(node: &NodeContext, sp: &ServicePort, f: &mut Fragment) {
    let proto = sp.protocol.name();
    let address_key = |ip: Ipv4Addr| format!("{ip} . {proto} . {}", sp.port);
    let affinity = sp.affinity_timeout.is_some();

    // The ClusterIP.
    let key = address_key(sp.cluster_ip);
    match sp.internal_route() {
        Route::Endpoints(eps) => {
            let (group, set) = match sp.internal_policy {
                Policy::Cluster => (Group::Cluster, Set::Endpoints),
                Policy::Local => (Group::Local, Set::LocalEndpoints),
            };
            f.endpoints(set, &key, eps);
            let verdict = f.goto(Chain::ClusterIp { group, n: eps.len(), affinity });
            f.add(Set::ServiceIps, key, verdict);
        }
        Route::Reject => f.add(Set::NoEndpointServices, key, String::new()),
        Route::Drop => {
            let verdict = f.goto(Chain::Drop);
            f.add(Set::ServiceIps, key, verdict);
        }
    }

    // External addresses and the NodePort share the external route.
    let all = match sp.cluster_route() {
        Route::Endpoints(eps) => eps,
        _ => &[],
    };
    let entry = |nodeport: bool| match (sp.external_policy, sp.external_route()) {
        (_, Route::Reject) => None,
        (Policy::Cluster, _) => Some(Chain::External { nodeport, n: all.len(), affinity }),
        (Policy::Local, route) => {
            let m = if let Route::Endpoints(local) = route { local.len() } else { 0 };
            Some(Chain::ExternalLocal { nodeport, n: all.len(), m, affinity })
        }
    };
    let local = match (sp.external_policy, sp.external_route()) {
        (Policy::Local, Route::Endpoints(eps)) => eps,
        _ => &[],
    };
    for ip in &sp.external_ips {
        let key = address_key(*ip);
        match entry(false) {
            None => f.add(Set::NoEndpointServices, key, String::new()),
            Some(chain) => {
                f.endpoints(Set::Endpoints, &key, all);
                f.endpoints(Set::LocalEndpoints, &key, local);
                let verdict = f.goto(chain);
                f.add(Set::ServiceIps, key, verdict);
            }
        }
    }
    if let Some(node_port) = sp.node_port {
        let key = format!("{proto} . {node_port}");
        match entry(true) {
            None => f.add(Set::NoEndpointNodeports, key, String::new()),
            Some(chain) => {
                f.endpoints(Set::NodeportEndpoints, &key, all);
                f.endpoints(Set::NodeportLocalEndpoints, &key, local);
                let verdict = f.goto(chain);
                f.add(Set::ServiceNodeports, key, verdict);
            }
        }
    }

    if let Some(timeout) = sp.affinity_timeout {
        let verdict = f.goto(Chain::AffinityRecord { timeout });
        let mut addresses: Vec<(Ipv4Addr, u16)> = vec![(sp.cluster_ip, sp.port)];
        addresses.extend(sp.external_ips.iter().map(|ip| (*ip, sp.port)));
        if let Some(np) = sp.node_port {
            addresses.extend(node.node_ips.iter().map(|ip| (*ip, np)));
        }
        for (ip, port) in addresses {
            f.add(Set::AffinityServices, format!("{ip} . {proto} . {port}"), verdict.clone());
        }
    }

    if affinity {
        for ep in sp.cluster_endpoints.iter().chain(&sp.local_endpoints) {
            f.affinity_endpoints.push(format!("{} . {}", ep.ip, ep.port));
        }
    }

    // Hairpin: only a Pod on this node can reach itself through this node's rules.
    for ep in sp.cluster_endpoints.iter().chain(&sp.local_endpoints).filter(|e| e.local) {
        f.add(Set::Hairpin, format!("{0} . {0}", ep.ip), String::new());
    }
}

/// One element's claimants, first owner (in key order) wins: two Services claiming the same
/// address and port (an externalIP conflict) must not fail the whole transaction.
#[derive(Debug, Default)]
struct Claims {
    /// Almost every element has one claimant: kept inline, no allocation per element.
    first: Option<(Owner, Text)>,
    more: Vec<(Owner, Text)>,
}

impl Claims {
    fn push(&mut self, claim: (Owner, Text)) {
        if self.first.is_none() {
            self.first = Some(claim);
        } else {
            self.more.push(claim);
        }
    }

    fn remove(&mut self, owner: &Owner) {
        if self.first.as_ref().is_some_and(|(o, _)| o == owner) {
            self.first = self.more.pop();
        } else if let Some(i) = self.more.iter().position(|(o, _)| o == owner) {
            self.more.swap_remove(i);
        }
    }

    fn is_empty(&self) -> bool {
        self.first.is_none()
    }
}

fn effective(claims: &Claims) -> Option<&(Owner, Text)> {
    claims.first.iter().chain(&claims.more).min_by(|a, b| a.0.cmp(&b.0))
}

fn effective_value(claims: &Claims) -> Option<Text> {
    effective(claims).map(|(_, v)| v.clone())
}

/// Elements touched by an update, with the value each had before it: (set, key, value).
type Touched = Vec<(Set, Text, Option<Text>)>;

/// (key, endpoint) of each entry of an `nft -j list map` listing, both in nft's `a . b` syntax.
fn affinity_entries(listing: &str) -> Result<Vec<(String, String)>, serde_json::Error> {
    use serde_json::Value;
    fn concat(v: &Value) -> String {
        let parts = v.get("concat").and_then(Value::as_array).cloned().unwrap_or_default();
        parts
            .iter()
            .map(|p| match p {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            })
            .collect::<Vec<_>>()
            .join(" . ")
    }
    let doc: Value = serde_json::from_str(listing)?;
    let mut out = Vec::new();
    let objects = doc.get("nftables").and_then(Value::as_array).cloned().unwrap_or_default();
    for elems in objects.iter().filter_map(|o| o.get("map")?.get("elem")?.as_array().cloned()) {
        for pair in elems.iter().filter_map(Value::as_array) {
            let [key, value] = pair.as_slice() else { continue };
            // A key with a timeout comes wrapped: {"elem": {"val": <key>, "timeout": ...}}.
            let key = key.get("elem").and_then(|e| e.get("val")).unwrap_or(key);
            out.push((concat(key), concat(value)));
        }
    }
    Ok(out)
}

/// Lowers a reference count; true when it reached zero (and the entry is gone).
fn decrement<K: std::hash::Hash + Eq>(counts: &mut HashMap<K, usize>, key: &K) -> bool {
    match counts.get_mut(key) {
        Some(n) if *n > 1 => {
            *n -= 1;
            false
        }
        Some(_) => {
            counts.remove(key);
            true
        }
        None => false,
    }
}

/// The layout's state: what the kernel holds after the last rendered transaction applied.
#[derive(Debug)]
pub struct NftRules {
    node: NodeContext,
    elements: HashMap<(Set, Text), Claims>,
    chains: HashMap<Chain, usize>,
    fragments: HashMap<Owner, Fragment>,
    /// Endpoints of affinity Services, to find affinity entries left pointing at removed ones.
    affinity_endpoints: HashMap<String, usize>,
}

/// An element change for a partial sync.
struct Ops {
    delete: Vec<(Set, Text)>,
    add: Vec<(Set, Text, Text)>,
}

fn node_owner() -> Owner {
    Arc::new((String::new(), String::new()))
}

impl NftRules {
    pub fn new(node: NodeContext) -> Self {
        NftRules {
            node,
            elements: HashMap::new(),
            chains: HashMap::new(),
            fragments: HashMap::new(),
            affinity_endpoints: HashMap::new(),
        }
    }

    pub fn node(&self) -> &NodeContext {
        &self.node
    }

    /// Adds `owner`'s fragment; `touched` (None on a full sync) records what each element was.
    fn claim(&mut self, owner: &Owner, fragment: Fragment, mut touched: Option<&mut Touched>) {
        for (set, key, value) in &fragment.elements {
            let claims = self.elements.entry((*set, key.clone())).or_default();
            if let Some(t) = touched.as_deref_mut() {
                t.push((*set, key.clone(), effective_value(claims)));
            }
            claims.push((owner.clone(), value.clone()));
        }
        for chain in &fragment.chains {
            *self.chains.entry(*chain).or_default() += 1;
        }
        for ep in &fragment.affinity_endpoints {
            *self.affinity_endpoints.entry(ep.clone()).or_default() += 1;
        }
        self.fragments.insert(owner.clone(), fragment);
    }

    fn release(&mut self, owner: &Owner, touched: &mut Touched, removed_affinity: &mut Vec<String>) {
        let Some(fragment) = self.fragments.remove(owner) else { return };
        for (set, key, _) in fragment.elements {
            let k = (set, key);
            if let Some(claims) = self.elements.get_mut(&k) {
                touched.push((set, k.1.clone(), effective_value(claims)));
                claims.remove(owner);
                if claims.is_empty() {
                    self.elements.remove(&k);
                }
            }
        }
        for chain in fragment.chains {
            decrement(&mut self.chains, &chain);
        }
        for ep in fragment.affinity_endpoints {
            if decrement(&mut self.affinity_endpoints, &ep) {
                removed_affinity.push(ep);
            }
        }
    }

    /// The transaction that deletes the affinity entries that point at an endpoint no affinity
    /// Service has any more, given `nft -j list map` of the affinity map. `only` narrows the
    /// check to these endpoints (`ip . port`); `None` checks every entry (a full sync).
    pub fn stale_affinity(&self, listing: &str, only: Option<&[String]>) -> Result<String, serde_json::Error> {
        let mut out = String::new();
        for (key, endpoint) in affinity_entries(listing)? {
            let stale = match only {
                Some(only) => only.contains(&endpoint),
                None => !self.affinity_endpoints.contains_key(&endpoint),
            };
            if stale {
                let _ = writeln!(out, "delete element ip {TABLE} {AFFINITY_MAP} {{ {key} }}");
            }
        }
        Ok(out)
    }

    /// The whole rule set as one transaction that replaces whatever the table holds (except
    /// the affinity map's entries). `existing_chains` are the chains the table has now: those
    /// no longer wanted are deleted, so a restarted agent adopts its predecessor's table.
    pub fn full<'a>(
        &mut self,
        services: impl IntoIterator<Item = (&'a ObjectKey, &'a [ServicePort])>,
        existing_chains: &[String],
    ) -> String {
        self.elements.clear();
        self.chains.clear();
        self.fragments.clear();
        self.affinity_endpoints.clear();
        let node = self.node.clone();
        self.claim(&node_owner(), node_fragment(&node), None);
        for (key, ports) in services {
            let fragment = service_fragment(&node, ports);
            self.claim(&Arc::new(key.clone()), fragment, None);
        }
        self.render(existing_chains)
    }

    /// The full transaction for the current state (what [`Self::full`] returns).
    pub fn render(&self, existing_chains: &[String]) -> String {
        let mut out = self.render_structure(existing_chains);
        for (set, elems) in self.elements_by_set() {
            // Chunks keep each statement's line short enough for nft's parser and errors readable.
            for chunk in elems.chunks(1000) {
                let _ = write!(out, "add element ip {TABLE} {} {{ ", set.name());
                for (i, (k, v)) in chunk.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    out.push_str(k);
                    if set.is_map() {
                        out.push_str(" : ");
                        out.push_str(v);
                    }
                }
                out.push_str(" }\n");
            }
        }
        out
    }

    /// For a table that does not exist yet: [`Self::full`] without its elements, to run with
    /// `nft -f`, and then [`Self::set_elements`] loaded over netlink. Not one transaction, which is harmless
    /// only because there was nothing before.
    pub fn full_without_elements<'a>(
        &mut self,
        services: impl IntoIterator<Item = (&'a ObjectKey, &'a [ServicePort])>,
    ) -> String {
        self.full(services, &[]);
        self.render_structure(&[])
    }

    /// Every element of the current state by set, to load over netlink after
    /// [`Self::full_without_elements`].
    pub(crate) fn set_elements(&self) -> Vec<SetElements<'_>> {
        self.elements_by_set()
            .into_iter()
            .map(|(set, elems)| {
                let (key, data) = set.fields();
                let elements = elems.iter().map(|(k, v)| (&***k, &***v)).collect();
                SetElements { set: set.name(), key, data, elements }
            })
            .collect()
    }

    /// Each set's elements (the effective claims), in owner order: deterministic without a
    /// sort of every element.
    fn elements_by_set(&self) -> Vec<(Set, Vec<(&Text, &Text)>)> {
        let mut owners: Vec<&Owner> = self.fragments.keys().collect();
        owners.sort();
        let mut by_set: HashMap<Set, Vec<(&Text, &Text)>> = HashMap::new();
        for owner in owners {
            for (set, key, value) in &self.fragments[owner].elements {
                let winner = self.elements.get(&(*set, key.clone())).and_then(effective);
                if winner.is_some_and(|(o, v)| o == owner && v == value) {
                    by_set.entry(*set).or_default().push((key, value));
                }
            }
        }
        SETS.into_iter().filter_map(|set| by_set.remove(&set).map(|e| (set, e))).collect()
    }

    /// Tables, sets, chains and rules of the full transaction, with the flushes.
    fn render_structure(&self, existing_chains: &[String]) -> String {
        let t = TABLE;
        let fixed = fixed_chains(&self.node);
        let mut chains: Vec<Chain> = self.chains.keys().copied().collect();
        chains.sort();
        let wanted: BTreeSet<String> =
            fixed.iter().map(|(n, _, _)| (*n).to_owned()).chain(chains.iter().map(|c| c.to_string())).collect();
        let stale: Vec<&String> = existing_chains.iter().filter(|c| !wanted.contains(*c)).collect();

        let mut out = String::with_capacity(64 * self.elements.len() + 4096);
        let _ = writeln!(out, "add table ip {t}");
        for set in SETS {
            let _ = writeln!(out, "add {} ip {t} {} {{ {} }}", set.kind(), set.name(), set.declaration());
        }
        let _ = writeln!(out, "{}", affinity_declaration());
        for (name, base, _) in &fixed {
            if base.is_empty() {
                let _ = writeln!(out, "add chain ip {t} {name}");
            } else {
                let _ = writeln!(out, "add chain ip {t} {name} {{ {base} }}");
            }
        }
        for c in &chains {
            let _ = writeln!(out, "add chain ip {t} {c}");
        }
        for name in wanted.iter().chain(stale.iter().copied()) {
            let _ = writeln!(out, "flush chain ip {t} {name}");
        }
        for set in SETS {
            let _ = writeln!(out, "flush {} ip {t} {}", set.kind(), set.name());
        }
        for name in &stale {
            let _ = writeln!(out, "delete chain ip {t} {name}");
        }
        for (name, _, rules) in &fixed {
            for r in rules {
                let _ = writeln!(out, "add rule ip {t} {name} {r}");
            }
        }
        for c in &chains {
            for r in c.rules(&self.node) {
                let _ = writeln!(out, "add rule ip {t} {c} {r}");
            }
        }
        out
    }

    /// The transaction that moves the kernel from the current state to one where each of
    /// `changed` Services has these ports (none: the Service is gone). Only elements that
    /// differ are touched; chains are created before first use and deleted after last use.
    ///
    /// Also returns the endpoints that affinity Services no longer have: affinity entries that
    /// point at them must go (see [`Self::stale_affinity`]).
    pub fn update<'a>(
        &mut self,
        changed: impl IntoIterator<Item = (&'a ObjectKey, &'a [ServicePort])>,
    ) -> (String, Vec<String>) {
        let before: BTreeSet<Chain> = self.chains.keys().copied().collect();
        let mut touched = Vec::new();
        let mut removed_affinity = Vec::new();
        let node = self.node.clone();
        for (key, ports) in changed {
            let owner = Arc::new(key.clone());
            self.release(&owner, &mut touched, &mut removed_affinity);
            if !ports.is_empty() {
                self.claim(&owner, service_fragment(&node, ports), Some(&mut touched));
            }
        }
        let ops = self.ops(touched);
        let after: BTreeSet<Chain> = self.chains.keys().copied().collect();
        let text = self.render_update(
            &ops,
            after.difference(&before).copied().collect(),
            before.difference(&after).copied().collect(),
        );
        removed_affinity.retain(|ep| !self.affinity_endpoints.contains_key(ep));
        (text, removed_affinity)
    }

    fn ops(&self, touched: Touched) -> Ops {
        // The first touch of a key holds its value before this update.
        let mut first: HashMap<(Set, Text), Option<Text>> = HashMap::new();
        for (set, key, before) in touched {
            first.entry((set, key)).or_insert(before);
        }
        let mut ops = Ops { delete: Vec::new(), add: Vec::new() };
        let mut keys: Vec<_> = first.into_iter().collect();
        keys.sort();
        for ((set, key), before) in keys {
            let after = self.elements.get(&(set, key.clone())).and_then(effective_value);
            if before == after {
                continue;
            }
            if before.is_some() {
                ops.delete.push((set, key.clone()));
            }
            if let Some(v) = after {
                ops.add.push((set, key, v));
            }
        }
        ops
    }

    fn render_update(&self, ops: &Ops, new_chains: Vec<Chain>, old_chains: Vec<Chain>) -> String {
        let t = TABLE;
        let mut out = String::new();
        for c in &new_chains {
            let _ = writeln!(out, "add chain ip {t} {c}");
        }
        for c in &new_chains {
            for r in c.rules(&self.node) {
                let _ = writeln!(out, "add rule ip {t} {c} {r}");
            }
        }
        for (set, key) in &ops.delete {
            let _ = writeln!(out, "delete element ip {t} {} {{ {key} }}", set.name());
        }
        for (set, key, value) in &ops.add {
            if set.is_map() {
                let _ = writeln!(out, "add element ip {t} {} {{ {key} : {value} }}", set.name());
            } else {
                let _ = writeln!(out, "add element ip {t} {} {{ {key} }}", set.name());
            }
        }
        for c in &old_chains {
            let _ = writeln!(out, "flush chain ip {t} {c}");
        }
        for c in &old_chains {
            let _ = writeln!(out, "delete chain ip {t} {c}");
        }
        out
    }
}
