//! The cluster zone: Services and EndpointSlices in, DNS answers out, without I/O.
//!
//! Follows the Kubernetes DNS specification (schema 1.1.0) plus the deprecated pod records.
//! Names are not stored one by one: a query name is split into its labels under the cluster
//! domain and resolved structurally (`<svc>.<ns>.svc`, `_<port>._<proto>.<svc>.<ns>.svc`,
//! `<endpoint>.<svc>.<ns>.svc`, `<a-b-c-d>.<ns>.pod`), so a change to one Service or slice
//! recomputes that Service alone (O(its endpoints)) and the zone holds one entry per Service.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use hickory_proto::rr::rdata::{A, AAAA, CNAME, NS, PTR, SOA, SRV, TXT};
use hickory_proto::rr::{Name, RData, Record, RecordType};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

/// The schema version served as `dns-version.<zone>` TXT.
pub const SCHEMA_VERSION: &str = "1.1.0";
/// The label that ties an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// What the zone serves and for which address ranges it answers reverse queries.
#[derive(Clone, Debug)]
pub struct ZoneConfig {
    /// The cluster domain, e.g. `cluster.local`.
    pub domain: String,
    /// Pod addresses: pod records and their PTRs are answered only inside these.
    pub pod_cidrs: Vec<IpNet>,
    /// Service addresses: PTRs inside these are answered here, never forwarded.
    pub service_cidrs: Vec<IpNet>,
    /// TTL of every record, and of negative answers (SOA minimum).
    pub ttl: u32,
    /// Where Pods reach this server (`ns.dns.<zone>`), e.g. 10.96.0.10; empty: no NS records.
    pub nameservers: Vec<IpAddr>,
}

impl Default for ZoneConfig {
    fn default() -> Self {
        ZoneConfig {
            domain: "cluster.local".into(),
            pod_cidrs: vec![IpNet::from(ipnet::Ipv4Net::new_assert(Ipv4Addr::new(10, 244, 0, 0), 16))],
            service_cidrs: vec![IpNet::from(ipnet::Ipv4Net::new_assert(Ipv4Addr::new(10, 96, 0, 0), 12))],
            ttl: 5,
            nameservers: Vec::new(),
        }
    }
}

/// Why an object or the configuration cannot be served.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecordsError {
    #[error("cluster domain {domain:?} is not a DNS name: {reason}")]
    InvalidDomain { domain: String, reason: String },
    #[error("{kind} without metadata.name or metadata.namespace")]
    MissingName { kind: &'static str },
    #[error("{kind} {namespace}/{name}: {reason}")]
    Invalid { kind: &'static str, namespace: String, name: String, reason: String },
}

/// The answer to one question, owners named as the question was asked (case kept).
#[derive(Clone, Debug, PartialEq)]
pub enum Lookup {
    /// Authoritative records; `additionals` are the addresses of SRV targets.
    Found { answers: Vec<Record>, additionals: Vec<Record> },
    /// An ExternalName Service: the CNAME, and the name whose records the server adds next.
    Alias { cname: Record, target: Name },
    /// The name exists without records of that type (NOERROR, SOA in authority).
    NoData { soa: Record },
    /// The name does not exist (SOA in authority).
    NxDomain { soa: Record },
    /// Outside every zone of this server: forward it.
    Foreign,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Port {
    /// Lowercase, without the leading underscore.
    name: String,
    proto: String,
    port: u16,
}

#[derive(Clone, Debug)]
enum SpecKind {
    ClusterIp(Vec<IpAddr>),
    Headless,
    ExternalName(Name),
}

#[derive(Clone, Debug)]
struct ServiceSpec {
    kind: SpecKind,
    ports: Vec<Port>,
    publish_not_ready: bool,
}

#[derive(Clone, Debug)]
struct SliceEndpoint {
    addrs: Vec<IpAddr>,
    hostname: Option<String>,
    ready: bool,
}

#[derive(Clone, Debug)]
struct Slice {
    ports: Arc<[Port]>,
    endpoints: Vec<SliceEndpoint>,
}

/// Everything known about one Service name: its spec (once seen) and its slices (which may
/// arrive first).
#[derive(Default)]
struct ServiceState {
    spec: Option<ServiceSpec>,
    slices: HashMap<String, Slice>,
}

/// One named endpoint of a headless Service.
#[derive(Debug)]
struct Endpoint {
    label: String,
    name: Name,
    addrs: Vec<IpAddr>,
    ports: Arc<[Port]>,
}

#[derive(Debug)]
enum ServedKind {
    ClusterIp(Vec<IpAddr>),
    /// Ready endpoints by label, and their addresses without duplicates.
    Headless {
        endpoints: Vec<Endpoint>,
        addrs: Vec<IpAddr>,
    },
    ExternalName(Name),
}

/// What queries read for one Service, rebuilt whenever its spec or one of its slices changes.
#[derive(Debug)]
struct Served {
    name: Name,
    kind: ServedKind,
    /// The Service's named ports (ClusterIP); headless endpoints carry their slice's ports.
    ports: Vec<Port>,
}

impl Served {
    fn ptrs(&self) -> Vec<(IpAddr, Name)> {
        match &self.kind {
            ServedKind::ClusterIp(ips) => ips.iter().map(|ip| (*ip, self.name.clone())).collect(),
            ServedKind::Headless { endpoints, .. } => {
                endpoints.iter().flat_map(|e| e.addrs.iter().map(|ip| (*ip, e.name.clone()))).collect()
            }
            ServedKind::ExternalName(_) => Vec::new(),
        }
    }
}

type Key = (String, String);

/// The in-memory cluster zone. Reads take `&self`; each `apply_*`/`delete_*` touches one Service.
pub struct Zone {
    cfg: ZoneConfig,
    apex: Name,
    apex_labels: usize,
    in_addr: Name,
    ip6: Name,
    mname: Name,
    rname: Name,
    serial: u32,
    state: HashMap<Key, ServiceState>,
    /// (namespace, slice) -> the Service it was filed under.
    slice_owner: HashMap<Key, String>,
    /// namespace -> Service -> records; a namespace is present while it has a Service.
    served: HashMap<String, HashMap<String, Arc<Served>>>,
    reverse: HashMap<IpAddr, Vec<Name>>,
}

impl Zone {
    pub fn new(cfg: ZoneConfig) -> Result<Zone, RecordsError> {
        let invalid = |reason: String| RecordsError::InvalidDomain { domain: cfg.domain.clone(), reason };
        let lower = cfg.domain.to_ascii_lowercase();
        let domain = lower.trim_end_matches('.');
        if domain.is_empty() || !domain.split('.').all(is_dns_label) {
            return Err(invalid("each label must be 1-63 of a-z, 0-9 and '-'".into()));
        }
        let apex = Name::from_ascii(format!("{domain}.")).map_err(|e| invalid(e.to_string()))?.to_lowercase();
        let sub = |label: &str| Name::from_ascii(label).and_then(|n| n.append_domain(&apex));
        let mname = sub("ns.dns").map_err(|e| invalid(e.to_string()))?;
        let rname = sub("hostmaster").map_err(|e| invalid(e.to_string()))?;
        let arpa = |s: &str| Name::from_ascii(s).map_err(|e| invalid(e.to_string()));
        Ok(Zone {
            apex_labels: apex.num_labels().into(),
            apex,
            in_addr: arpa("in-addr.arpa.")?,
            ip6: arpa("ip6.arpa.")?,
            mname,
            rname,
            serial: 1,
            state: HashMap::new(),
            slice_owner: HashMap::new(),
            served: HashMap::new(),
            reverse: HashMap::new(),
            cfg,
        })
    }

    pub fn config(&self) -> &ZoneConfig {
        &self.cfg
    }

    /// The cluster domain as a lowercase FQDN.
    pub fn apex(&self) -> &Name {
        &self.apex
    }

    /// Number of Services served.
    pub fn services(&self) -> usize {
        self.served.values().map(HashMap::len).sum()
    }

    /// Adds or replaces a Service. An invalid one is removed, so stale records never linger.
    pub fn apply_service(&mut self, svc: &Service) -> Result<(), RecordsError> {
        let (namespace, name) = object_key("Service", &svc.metadata)?;
        let spec = service_spec(svc).map_err(|reason| RecordsError::Invalid {
            kind: "Service",
            namespace: namespace.clone(),
            name: name.clone(),
            reason,
        });
        let key = (namespace, name);
        let result = match spec {
            Ok(spec) => {
                self.state.entry(key.clone()).or_default().spec = Some(spec);
                Ok(())
            }
            Err(e) => {
                if let Some(state) = self.state.get_mut(&key) {
                    state.spec = None;
                }
                Err(e)
            }
        };
        self.refresh(&key);
        result
    }

    pub fn delete_service(&mut self, namespace: &str, name: &str) {
        let key = (namespace.to_string(), name.to_string());
        if let Some(state) = self.state.get_mut(&key) {
            state.spec = None;
            self.refresh(&key);
        }
    }

    /// Adds or replaces an EndpointSlice; one without the service-name label is dropped.
    pub fn apply_slice(&mut self, slice: &EndpointSlice) -> Result<(), RecordsError> {
        let (namespace, slice_name) = object_key("EndpointSlice", &slice.metadata)?;
        let owner =
            slice.metadata.labels.as_ref().and_then(|l| l.get(SERVICE_NAME_LABEL)).map(|s| s.to_ascii_lowercase());
        let slice_key = (namespace.clone(), slice_name.clone());
        if let Some(previous) = self.slice_owner.get(&slice_key).cloned()
            && Some(&previous) != owner.as_ref()
        {
            self.delete_slice(&namespace, &slice_name);
        }
        let Some(owner) = owner else { return Ok(()) };
        // FQDN slices name no addresses to serve (kube-proxy and CoreDNS skip them too).
        if !matches!(slice.address_type.as_str(), "IPv4" | "IPv6") {
            self.delete_slice(&namespace, &slice_name);
            return Ok(());
        }
        let parsed = Slice {
            ports: slice
                .ports
                .iter()
                .flatten()
                .filter_map(|p| port(p.name.as_deref(), p.protocol.as_deref(), p.port?))
                .collect(),
            endpoints: slice
                .endpoints
                .iter()
                .map(|e| SliceEndpoint {
                    addrs: e.addresses.iter().filter_map(|a| a.parse().ok()).collect(),
                    hostname: e.hostname.as_deref().map(str::to_ascii_lowercase).filter(|h| is_dns_label(h)),
                    ready: e.conditions.as_ref().and_then(|c| c.ready) != Some(false),
                })
                .collect(),
        };
        let key = (namespace, owner.clone());
        self.state.entry(key.clone()).or_default().slices.insert(slice_name, parsed);
        self.slice_owner.insert(slice_key, owner);
        self.refresh(&key);
        Ok(())
    }

    pub fn delete_slice(&mut self, namespace: &str, name: &str) {
        let slice_key = (namespace.to_string(), name.to_string());
        let Some(owner) = self.slice_owner.remove(&slice_key) else { return };
        let key = (slice_key.0, owner);
        if let Some(state) = self.state.get_mut(&key) {
            state.slices.remove(name);
        }
        self.refresh(&key);
    }

    /// Recomputes one Service's records and its PTRs from its spec and slices.
    fn refresh(&mut self, key: &Key) {
        let (namespace, name) = key;
        let new = match self.state.get(key) {
            Some(state) if state.spec.is_some() => build_served(&self.apex, namespace, name, state).map(Arc::new),
            Some(state) if state.slices.is_empty() => {
                self.state.remove(key);
                None
            }
            _ => None,
        };
        let old = match &new {
            Some(served) => self.served.entry(namespace.clone()).or_default().insert(name.clone(), served.clone()),
            None => {
                let in_ns = self.served.get_mut(namespace);
                let old = in_ns.and_then(|m| m.remove(name));
                if self.served.get(namespace).is_some_and(HashMap::is_empty) {
                    self.served.remove(namespace);
                }
                old
            }
        };
        for (ip, target) in old.map(|o| o.ptrs()).unwrap_or_default() {
            if let Some(names) = self.reverse.get_mut(&ip) {
                if let Some(i) = names.iter().position(|n| *n == target) {
                    names.swap_remove(i);
                }
                if names.is_empty() {
                    self.reverse.remove(&ip);
                }
            }
        }
        for (ip, target) in new.map(|n| n.ptrs()).unwrap_or_default() {
            self.reverse.entry(ip).or_default().push(target);
        }
        self.serial = self.serial.wrapping_add(1);
    }

    /// Answers one question. `qname` is used as given for the owner of the answers.
    pub fn lookup(&self, qname: &Name, qtype: RecordType) -> Lookup {
        let lower = qname.to_lowercase();
        let labels = usize::from(lower.num_labels());
        if labels >= self.apex_labels && self.apex.zone_of(&lower) {
            return self.lookup_cluster(qname, &lower, labels - self.apex_labels, qtype);
        }
        if self.in_addr.zone_of(&lower) || self.ip6.zone_of(&lower) {
            return self.lookup_reverse(qname, &lower, qtype);
        }
        Lookup::Foreign
    }

    fn lookup_cluster(&self, qname: &Name, lower: &Name, depth: usize, qtype: RecordType) -> Lookup {
        // Nothing in the zone is deeper than `_<port>._<proto>.<svc>.<ns>.svc`.
        if depth > 5 {
            return self.nxdomain();
        }
        let mut buf = [""; 5];
        for (slot, label) in buf.iter_mut().zip(lower.iter().take(depth)) {
            match std::str::from_utf8(label) {
                Ok(s) => *slot = s,
                Err(_) => return self.nxdomain(),
            }
        }
        let wants = |t: RecordType| qtype == t || qtype == RecordType::ANY;
        let ttl = self.cfg.ttl;
        let record = |data: RData| Record::from_rdata(qname.clone(), ttl, data);
        match &buf[..depth] {
            [] => {
                let mut answers = Vec::new();
                if wants(RecordType::SOA) {
                    answers.push(self.soa(&self.apex));
                }
                if wants(RecordType::NS) && !self.cfg.nameservers.is_empty() {
                    answers.push(record(RData::NS(NS(self.mname.clone()))));
                }
                let additionals = if answers.iter().any(|r| r.record_type() == RecordType::NS) {
                    address_records(&self.mname, &self.cfg.nameservers, ttl, BOTH_FAMILIES)
                } else {
                    Vec::new()
                };
                self.found(answers, additionals)
            }
            ["dns-version"] => {
                let answers = if wants(RecordType::TXT) {
                    vec![record(RData::TXT(TXT::new(vec![SCHEMA_VERSION.into()])))]
                } else {
                    Vec::new()
                };
                self.found(answers, Vec::new())
            }
            ["svc"] | ["pod"] | [_, "pod"] => self.nodata(),
            ["dns"] if !self.cfg.nameservers.is_empty() => self.nodata(),
            ["ns", "dns"] if !self.cfg.nameservers.is_empty() => {
                self.found(address_records(qname, &self.cfg.nameservers, ttl, qtype), Vec::new())
            }
            [pod, _, "pod"] => match pod_address(pod) {
                Some(ip) if self.cfg.pod_cidrs.iter().any(|c| c.contains(&ip)) => {
                    self.found(address_records(qname, &[ip], ttl, qtype), Vec::new())
                }
                _ => self.nxdomain(),
            },
            [ns, "svc"] => {
                if self.served.contains_key(*ns) {
                    self.nodata()
                } else {
                    self.nxdomain()
                }
            }
            [svc, ns, "svc"] => match self.service(ns, svc) {
                None => self.nxdomain(),
                Some(s) => match &s.kind {
                    ServedKind::ClusterIp(ips) => self.found(address_records(qname, ips, ttl, qtype), Vec::new()),
                    ServedKind::Headless { addrs, .. } if addrs.is_empty() => self.nxdomain(),
                    ServedKind::Headless { addrs, .. } => {
                        self.found(address_records(qname, addrs, ttl, qtype), Vec::new())
                    }
                    ServedKind::ExternalName(target) => {
                        let cname = record(RData::CNAME(CNAME(target.clone())));
                        if wants(RecordType::CNAME) {
                            self.found(vec![cname], Vec::new())
                        } else {
                            Lookup::Alias { cname, target: target.clone() }
                        }
                    }
                },
            },
            [child, svc, ns, "svc"] => {
                let Some(s) = self.service(ns, svc) else { return self.nxdomain() };
                if let Some(proto) = child.strip_prefix('_') {
                    // `_<proto>.<svc>...` exists only as the parent of SRV names.
                    if s.named_ports().any(|(_, p)| p.proto == proto) { self.nodata() } else { self.nxdomain() }
                } else if let ServedKind::Headless { endpoints, .. } = &s.kind
                    && let Some(e) = endpoints.iter().find(|e| e.label == *child)
                {
                    self.found(address_records(qname, &e.addrs, ttl, qtype), Vec::new())
                } else {
                    self.nxdomain()
                }
            }
            [port_label, proto_label, svc, ns, "svc"] => {
                let (Some(port_name), Some(proto)) = (port_label.strip_prefix('_'), proto_label.strip_prefix('_'))
                else {
                    return self.nxdomain();
                };
                let Some(s) = self.service(ns, svc) else { return self.nxdomain() };
                let targets: Vec<(&Name, &Port, &[IpAddr])> = s
                    .named_ports()
                    .filter(|(_, p)| p.name == port_name && p.proto == proto)
                    .map(|(target, p)| (target.0, p, target.1))
                    .collect();
                if targets.is_empty() {
                    return self.nxdomain();
                }
                if !wants(RecordType::SRV) {
                    return self.nodata();
                }
                let answers = targets
                    .iter()
                    .map(|(target, p, _)| record(RData::SRV(SRV::new(0, 100, p.port, (*target).clone()))))
                    .collect();
                let mut additionals = Vec::new();
                let mut seen: Vec<&Name> = Vec::new();
                for (target, _, addrs) in &targets {
                    if !seen.contains(target) {
                        seen.push(target);
                        additionals.extend(address_records(target, addrs, ttl, BOTH_FAMILIES));
                    }
                }
                self.found(answers, additionals)
            }
            _ => self.nxdomain(),
        }
    }

    fn lookup_reverse(&self, qname: &Name, lower: &Name, qtype: RecordType) -> Lookup {
        let Some(ip) = reverse_address(lower) else { return Lookup::Foreign };
        let ours = self.cfg.service_cidrs.iter().chain(&self.cfg.pod_cidrs).any(|c| c.contains(&ip));
        if !ours {
            return Lookup::Foreign;
        }
        let zone = if ip.is_ipv4() { &self.in_addr } else { &self.ip6 };
        match self.reverse.get(&ip) {
            None => Lookup::NxDomain { soa: self.soa(zone) },
            Some(_) if !(qtype == RecordType::PTR || qtype == RecordType::ANY) => {
                Lookup::NoData { soa: self.soa(zone) }
            }
            Some(names) => Lookup::Found {
                answers: names
                    .iter()
                    .map(|n| Record::from_rdata(qname.clone(), self.cfg.ttl, RData::PTR(PTR(n.clone()))))
                    .collect(),
                additionals: Vec::new(),
            },
        }
    }

    fn service(&self, ns: &str, svc: &str) -> Option<&Served> {
        self.served.get(ns)?.get(svc).map(Arc::as_ref)
    }

    fn found(&self, answers: Vec<Record>, additionals: Vec<Record>) -> Lookup {
        if answers.is_empty() { self.nodata() } else { Lookup::Found { answers, additionals } }
    }

    fn nodata(&self) -> Lookup {
        Lookup::NoData { soa: self.soa(&self.apex) }
    }

    fn nxdomain(&self) -> Lookup {
        Lookup::NxDomain { soa: self.soa(&self.apex) }
    }

    fn soa(&self, zone: &Name) -> Record {
        let ttl = self.cfg.ttl;
        let soa = SOA::new(self.mname.clone(), self.rname.clone(), self.serial, 7200, 1800, 86400, ttl);
        Record::from_rdata(zone.clone(), ttl, RData::SOA(soa))
    }
}

impl Served {
    /// Every (target name with its addresses, named port) pair an SRV query can return.
    fn named_ports(&self) -> impl Iterator<Item = ((&Name, &[IpAddr]), &Port)> {
        let (service, endpoints): (&[Port], &[Endpoint]) = match &self.kind {
            ServedKind::ClusterIp(_) => (&self.ports, &[]),
            ServedKind::Headless { endpoints, .. } => (&[], endpoints),
            ServedKind::ExternalName(_) => (&[], &[]),
        };
        let ips: &[IpAddr] = match &self.kind {
            ServedKind::ClusterIp(ips) => ips,
            _ => &[],
        };
        let name = &self.name;
        service
            .iter()
            .map(move |p| ((name, ips), p))
            .chain(endpoints.iter().flat_map(|e| e.ports.iter().map(move |p| ((&e.name, e.addrs.as_slice()), p))))
    }
}

/// Extra address records (SRV targets, the NS host) are of both families.
const BOTH_FAMILIES: RecordType = RecordType::ANY;

fn address_records(owner: &Name, ips: &[IpAddr], ttl: u32, qtype: RecordType) -> Vec<Record> {
    let any = qtype == RecordType::ANY;
    ips.iter()
        .filter_map(|ip| match ip {
            IpAddr::V4(v4) if any || qtype == RecordType::A => Some(RData::A(A(*v4))),
            IpAddr::V6(v6) if any || qtype == RecordType::AAAA => Some(RData::AAAA(AAAA(*v6))),
            _ => None,
        })
        .map(|data| Record::from_rdata(owner.clone(), ttl, data))
        .collect()
}

fn object_key(
    kind: &'static str,
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Result<(String, String), RecordsError> {
    match (meta.namespace.as_deref(), meta.name.as_deref()) {
        (Some(ns), Some(name)) if !ns.is_empty() && !name.is_empty() => Ok((ns.to_string(), name.to_string())),
        _ => Err(RecordsError::MissingName { kind }),
    }
}

/// RFC 1123 label, lowercase: what Kubernetes requires of namespace, Service and host names.
fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn port(name: Option<&str>, protocol: Option<&str>, number: i32) -> Option<Port> {
    let name = name.filter(|n| !n.is_empty())?.to_ascii_lowercase();
    let port = u16::try_from(number).ok().filter(|p| *p > 0)?;
    // `_<name>` must still be a label.
    if name.len() > 62 || !is_dns_label(&name) {
        return None;
    }
    Some(Port { name, proto: protocol.unwrap_or("TCP").to_ascii_lowercase(), port })
}

fn service_spec(svc: &Service) -> Result<ServiceSpec, String> {
    let (namespace, name) =
        (svc.metadata.namespace.as_deref().unwrap_or(""), svc.metadata.name.as_deref().unwrap_or(""));
    if !is_dns_label(namespace) || !is_dns_label(name) {
        return Err("namespace and name must be DNS labels (a-z, 0-9, '-', at most 63)".into());
    }
    let spec = svc.spec.as_ref().ok_or("Service has no spec")?;
    let ports =
        spec.ports.iter().flatten().filter_map(|p| port(p.name.as_deref(), p.protocol.as_deref(), p.port)).collect();
    let kind = if spec.type_.as_deref() == Some("ExternalName") {
        let external = spec.external_name.as_deref().unwrap_or("").trim_end_matches('.');
        let target = Name::from_ascii(format!("{external}."))
            .ok()
            .filter(|n| !external.is_empty() && n.num_labels() > 0)
            .ok_or_else(|| format!("externalName {external:?} is not a DNS name"))?;
        SpecKind::ExternalName(target.to_lowercase())
    } else if spec.cluster_ip.as_deref() == Some("None") {
        SpecKind::Headless
    } else {
        let mut ips: Vec<IpAddr> =
            spec.cluster_ips.iter().flatten().chain(&spec.cluster_ip).filter_map(|ip| ip.parse().ok()).collect();
        ips.sort_unstable();
        ips.dedup();
        SpecKind::ClusterIp(ips)
    };
    Ok(ServiceSpec { kind, ports, publish_not_ready: spec.publish_not_ready_addresses == Some(true) })
}

fn build_served(apex: &Name, namespace: &str, name: &str, state: &ServiceState) -> Option<Served> {
    let spec = state.spec.as_ref()?;
    let svc_name = Name::from_labels([name, namespace, "svc"]).ok()?.append_domain(apex).ok()?;
    let kind = match &spec.kind {
        SpecKind::ClusterIp(ips) => ServedKind::ClusterIp(ips.clone()),
        SpecKind::ExternalName(target) => ServedKind::ExternalName(target.clone()),
        SpecKind::Headless => {
            let mut by_label: BTreeMap<String, Endpoint> = BTreeMap::new();
            // Slices in name order, so the answer order does not depend on hash order.
            let mut slices: Vec<(&String, &Slice)> = state.slices.iter().collect();
            slices.sort_unstable_by_key(|(n, _)| *n);
            for (_, slice) in slices {
                for ep in slice.endpoints.iter().filter(|e| e.ready || spec.publish_not_ready) {
                    for ip in &ep.addrs {
                        let label = ep.hostname.clone().unwrap_or_else(|| dashed(ip));
                        let entry = match by_label.entry(label) {
                            std::collections::btree_map::Entry::Occupied(o) => o.into_mut(),
                            std::collections::btree_map::Entry::Vacant(v) => {
                                let Ok(name) =
                                    Name::from_labels([v.key().as_str()]).and_then(|n| n.append_domain(&svc_name))
                                else {
                                    continue;
                                };
                                v.insert(Endpoint {
                                    label: String::new(),
                                    name,
                                    addrs: Vec::new(),
                                    ports: slice.ports.clone(),
                                })
                            }
                        };
                        if !entry.addrs.contains(ip) {
                            entry.addrs.push(*ip);
                        }
                    }
                }
            }
            let endpoints: Vec<Endpoint> = by_label
                .into_iter()
                .map(|(label, mut e)| {
                    e.label = label;
                    e
                })
                .collect();
            let mut addrs: Vec<IpAddr> = endpoints.iter().flat_map(|e| e.addrs.iter().copied()).collect();
            addrs.sort_unstable();
            addrs.dedup();
            ServedKind::Headless { endpoints, addrs }
        }
    };
    Some(Served { name: svc_name, kind, ports: spec.ports.clone() })
}

/// The label CoreDNS gives an endpoint without a hostname: its address with '-' for '.' / ':'.
fn dashed(ip: &IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string().replace('.', "-"),
        IpAddr::V6(v6) => v6.to_string().replace(':', "-"),
    }
}

/// `10-244-1-5` -> 10.244.1.5; `fd00--5` -> fd00::5.
fn pod_address(label: &str) -> Option<IpAddr> {
    if label.bytes().filter(|b| *b == b'-').count() == 3 && !label.contains("--") {
        label.replace('-', ".").parse::<Ipv4Addr>().ok().map(IpAddr::V4)
    } else {
        label.replace('-', ":").parse::<Ipv6Addr>().ok().map(IpAddr::V6)
    }
}

/// `5.1.244.10.in-addr.arpa.` -> 10.244.1.5, and the 32-nibble ip6.arpa form; partial names
/// (whole networks) are not addresses.
fn reverse_address(lower: &Name) -> Option<IpAddr> {
    let labels: Vec<&[u8]> = lower.iter().collect();
    match labels.as_slice() {
        [d, c, b, a, in_addr, arpa] if *in_addr == b"in-addr" && *arpa == b"arpa" => {
            let octet = |l: &[u8]| -> Option<u8> {
                let s = std::str::from_utf8(l).ok()?;
                if s.len() > 1 && s.starts_with('0') {
                    return None;
                }
                s.parse().ok()
            };
            Some(IpAddr::V4(Ipv4Addr::new(octet(a)?, octet(b)?, octet(c)?, octet(d)?)))
        }
        [nibbles @ .., ip6, arpa] if nibbles.len() == 32 && *ip6 == b"ip6" && *arpa == b"arpa" => {
            let mut value: u128 = 0;
            for label in nibbles.iter().rev() {
                let [digit] = label else { return None };
                value = (value << 4) | u128::from(char::from(*digit).to_digit(16)?);
            }
            Some(IpAddr::V6(Ipv6Addr::from(value)))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn service(ns: &str, name: &str, spec: serde_json::Value) -> Service {
        serde_json::from_value(serde_json::json!({"metadata": {"namespace": ns, "name": name}, "spec": spec})).unwrap()
    }

    pub(crate) fn slice(ns: &str, name: &str, svc: &str, body: serde_json::Value) -> EndpointSlice {
        let mut body = body;
        body["metadata"] = serde_json::json!({"namespace": ns, "name": name, "labels": {SERVICE_NAME_LABEL: svc}});
        if body.get("addressType").is_none() {
            body["addressType"] = "IPv4".into();
        }
        serde_json::from_value(body).unwrap()
    }

    /// The objects every table below is about.
    fn zone() -> Zone {
        let mut zone = Zone::new(ZoneConfig {
            nameservers: vec!["10.96.0.10".parse().unwrap()],
            service_cidrs: vec!["10.96.0.0/12".parse().unwrap(), "fd00:96::/108".parse().unwrap()],
            ..ZoneConfig::default()
        })
        .unwrap();
        let services = [
            service(
                "shop",
                "web",
                serde_json::json!({"clusterIP": "10.96.0.20", "ports": [
                {"name": "http", "port": 80}, {"name": "dns", "port": 53, "protocol": "UDP"}, {"port": 8080}]}),
            ),
            service("shop", "db", serde_json::json!({"clusterIP": "None", "ports": [{"name": "pg", "port": 5432}]})),
            service("shop", "ext", serde_json::json!({"type": "ExternalName", "externalName": "Example.COM"})),
            service("shop", "empty", serde_json::json!({"clusterIP": "None"})),
            service(
                "shop",
                "dual",
                serde_json::json!({"clusterIP": "10.96.0.21", "clusterIPs": ["10.96.0.21", "fd00:96::21"]}),
            ),
        ];
        for s in &services {
            zone.apply_service(s).unwrap();
        }
        zone.apply_slice(&slice(
            "shop",
            "db-a",
            "db",
            serde_json::json!({
            "ports": [{"name": "pg", "port": 5432, "protocol": "TCP"}],
            "endpoints": [
                {"addresses": ["10.244.1.5"], "hostname": "db-0", "conditions": {"ready": true}},
                {"addresses": ["10.244.2.6"], "hostname": "db-1"},
                {"addresses": ["10.244.3.7"], "conditions": {"ready": true}},
                {"addresses": ["10.244.4.8"], "hostname": "db-2", "conditions": {"ready": false}},
            ]}),
        ))
        .unwrap();
        zone
    }

    /// A lookup as zone-file lines: answers, then `+` additionals, or the negative answer.
    fn show(zone: &Zone, name: &str, qtype: RecordType) -> String {
        match zone.lookup(&Name::from_ascii(name).unwrap(), qtype) {
            Lookup::Found { answers, additionals } => answers
                .iter()
                .map(ToString::to_string)
                .chain(additionals.iter().map(|r| format!("+ {r}")))
                .collect::<Vec<_>>()
                .join("\n"),
            Lookup::Alias { cname, target } => format!("{cname}\nthen {target}"),
            Lookup::NoData { soa } => format!("NODATA {}", soa.name),
            Lookup::NxDomain { soa } => format!("NXDOMAIN {}", soa.name),
            Lookup::Foreign => "FOREIGN".into(),
        }
    }

    fn check(zone: &Zone, cases: &[(&str, RecordType, &str)]) {
        let mut failures = Vec::new();
        for (name, qtype, want) in cases {
            let got = show(zone, name, *qtype);
            if got != *want {
                failures.push(format!("{name} {qtype}:\n  want: {want:?}\n  got:  {got:?}"));
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    use RecordType::{A, AAAA, ANY, CNAME as Cname, PTR as Ptr, SOA as Soa, SRV as Srv, TXT as Txt};

    #[test]
    fn t10_services() {
        check(
            &zone(),
            &[
                ("web.shop.svc.cluster.local.", A, "web.shop.svc.cluster.local. 5 IN A 10.96.0.20"),
                ("WEB.Shop.svc.Cluster.LOCAL.", A, "WEB.Shop.svc.Cluster.LOCAL. 5 IN A 10.96.0.20"),
                ("web.shop.svc.cluster.local.", AAAA, "NODATA cluster.local."),
                ("web.shop.svc.cluster.local.", Txt, "NODATA cluster.local."),
                ("dual.shop.svc.cluster.local.", AAAA, "dual.shop.svc.cluster.local. 5 IN AAAA fd00:96::21"),
                (
                    "dual.shop.svc.cluster.local.",
                    ANY,
                    "dual.shop.svc.cluster.local. 5 IN A 10.96.0.21\ndual.shop.svc.cluster.local. 5 IN AAAA fd00:96::21",
                ),
                ("missing.shop.svc.cluster.local.", A, "NXDOMAIN cluster.local."),
                ("shop.svc.cluster.local.", A, "NODATA cluster.local."),
                ("other.svc.cluster.local.", A, "NXDOMAIN cluster.local."),
                ("svc.cluster.local.", A, "NODATA cluster.local."),
                ("x.web.shop.svc.cluster.local.", A, "NXDOMAIN cluster.local."),
                ("a.b.c.d.e.f.cluster.local.", A, "NXDOMAIN cluster.local."),
                // What a Pod's search path makes of an outside name: answered here, never forwarded.
                ("example.com.shop.svc.cluster.local.", A, "NXDOMAIN cluster.local."),
                ("example.com.svc.cluster.local.", A, "NXDOMAIN cluster.local."),
                ("example.com.cluster.local.", A, "NXDOMAIN cluster.local."),
                ("example.com.", A, "FOREIGN"),
                ("local.", A, "FOREIGN"),
            ],
        );
    }

    #[test]
    fn t10_srv() {
        check(
            &zone(),
            &[
                (
                    "_http._tcp.web.shop.svc.cluster.local.",
                    Srv,
                    "_http._tcp.web.shop.svc.cluster.local. 5 IN SRV 0 100 80 web.shop.svc.cluster.local.\n+ web.shop.svc.cluster.local. 5 IN A 10.96.0.20",
                ),
                (
                    "_DNS._UDP.web.shop.svc.cluster.local.",
                    Srv,
                    "_DNS._UDP.web.shop.svc.cluster.local. 5 IN SRV 0 100 53 web.shop.svc.cluster.local.\n+ web.shop.svc.cluster.local. 5 IN A 10.96.0.20",
                ),
                ("_http._udp.web.shop.svc.cluster.local.", Srv, "NXDOMAIN cluster.local."),
                ("_http._tcp.web.shop.svc.cluster.local.", A, "NODATA cluster.local."),
                ("_tcp.web.shop.svc.cluster.local.", Srv, "NODATA cluster.local."),
                ("_sctp.web.shop.svc.cluster.local.", Srv, "NXDOMAIN cluster.local."),
                ("http._tcp.web.shop.svc.cluster.local.", Srv, "NXDOMAIN cluster.local."),
                (
                    "_pg._tcp.db.shop.svc.cluster.local.",
                    Srv,
                    "_pg._tcp.db.shop.svc.cluster.local. 5 IN SRV 0 100 5432 10-244-3-7.db.shop.svc.cluster.local.\n_pg._tcp.db.shop.svc.cluster.local. 5 IN SRV 0 100 5432 db-0.db.shop.svc.cluster.local.\n_pg._tcp.db.shop.svc.cluster.local. 5 IN SRV 0 100 5432 db-1.db.shop.svc.cluster.local.\n+ 10-244-3-7.db.shop.svc.cluster.local. 5 IN A 10.244.3.7\n+ db-0.db.shop.svc.cluster.local. 5 IN A 10.244.1.5\n+ db-1.db.shop.svc.cluster.local. 5 IN A 10.244.2.6",
                ),
            ],
        );
    }

    #[test]
    fn t10_headless_and_external_name() {
        check(
            &zone(),
            &[
                (
                    "db.shop.svc.cluster.local.",
                    A,
                    "db.shop.svc.cluster.local. 5 IN A 10.244.1.5\ndb.shop.svc.cluster.local. 5 IN A 10.244.2.6\ndb.shop.svc.cluster.local. 5 IN A 10.244.3.7",
                ),
                ("db-0.db.shop.svc.cluster.local.", A, "db-0.db.shop.svc.cluster.local. 5 IN A 10.244.1.5"),
                ("10-244-3-7.db.shop.svc.cluster.local.", A, "10-244-3-7.db.shop.svc.cluster.local. 5 IN A 10.244.3.7"),
                ("db-2.db.shop.svc.cluster.local.", A, "NXDOMAIN cluster.local."),
                ("db-0.db.shop.svc.cluster.local.", AAAA, "NODATA cluster.local."),
                ("empty.shop.svc.cluster.local.", A, "NXDOMAIN cluster.local."),
                (
                    "ext.shop.svc.cluster.local.",
                    A,
                    "ext.shop.svc.cluster.local. 5 IN CNAME example.com.\nthen example.com.",
                ),
                ("ext.shop.svc.cluster.local.", Cname, "ext.shop.svc.cluster.local. 5 IN CNAME example.com."),
                ("_http._tcp.ext.shop.svc.cluster.local.", Srv, "NXDOMAIN cluster.local."),
            ],
        );
    }

    #[test]
    fn t10_reverse_pods_and_zone_records() {
        check(
            &zone(),
            &[
                ("20.0.96.10.in-addr.arpa.", Ptr, "20.0.96.10.in-addr.arpa. 5 IN PTR web.shop.svc.cluster.local."),
                ("5.1.244.10.IN-ADDR.ARPA.", Ptr, "5.1.244.10.IN-ADDR.ARPA. 5 IN PTR db-0.db.shop.svc.cluster.local."),
                (
                    "7.3.244.10.in-addr.arpa.",
                    Ptr,
                    "7.3.244.10.in-addr.arpa. 5 IN PTR 10-244-3-7.db.shop.svc.cluster.local.",
                ),
                (
                    "1.2.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.6.9.0.0.0.0.d.f.ip6.arpa.",
                    Ptr,
                    "1.2.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.6.9.0.0.0.0.d.f.ip6.arpa. 5 IN PTR dual.shop.svc.cluster.local.",
                ),
                ("20.0.96.10.in-addr.arpa.", A, "NODATA in-addr.arpa."),
                ("8.4.244.10.in-addr.arpa.", Ptr, "NXDOMAIN in-addr.arpa."),
                ("99.0.96.10.in-addr.arpa.", Ptr, "NXDOMAIN in-addr.arpa."),
                ("1.1.168.192.in-addr.arpa.", Ptr, "FOREIGN"),
                ("96.10.in-addr.arpa.", Ptr, "FOREIGN"),
                ("020.0.96.10.in-addr.arpa.", Ptr, "FOREIGN"),
                ("10-244-1-5.shop.pod.cluster.local.", A, "10-244-1-5.shop.pod.cluster.local. 5 IN A 10.244.1.5"),
                (
                    "10-244-200-9.any-namespace.pod.cluster.local.",
                    A,
                    "10-244-200-9.any-namespace.pod.cluster.local. 5 IN A 10.244.200.9",
                ),
                ("10-244-1-5.shop.pod.cluster.local.", AAAA, "NODATA cluster.local."),
                ("10-1-2-3.shop.pod.cluster.local.", A, "NXDOMAIN cluster.local."),
                ("10-244-1.shop.pod.cluster.local.", A, "NXDOMAIN cluster.local."),
                ("shop.pod.cluster.local.", A, "NODATA cluster.local."),
                ("dns-version.cluster.local.", Txt, "dns-version.cluster.local. 5 IN TXT 1.1.0"),
                ("dns-version.cluster.local.", A, "NODATA cluster.local."),
                (
                    "cluster.local.",
                    Soa,
                    "cluster.local. 5 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 7 7200 1800 86400 5",
                ),
                (
                    "cluster.local.",
                    RecordType::NS,
                    "cluster.local. 5 IN NS ns.dns.cluster.local.\n+ ns.dns.cluster.local. 5 IN A 10.96.0.10",
                ),
                ("cluster.local.", A, "NODATA cluster.local."),
                ("ns.dns.cluster.local.", A, "ns.dns.cluster.local. 5 IN A 10.96.0.10"),
            ],
        );
    }

    #[test]
    fn t10_updates_touch_one_service() {
        let mut zone = zone();
        // Slices may arrive before their Service.
        zone.apply_slice(&slice(
            "shop",
            "late-1",
            "late",
            serde_json::json!({"endpoints": [{"addresses": ["10.244.9.9"], "hostname": "l"}]}),
        ))
        .unwrap();
        check(&zone, &[("late.shop.svc.cluster.local.", A, "NXDOMAIN cluster.local.")]);
        zone.apply_service(&service("shop", "late", serde_json::json!({"clusterIP": "None"}))).unwrap();
        check(
            &zone,
            &[
                ("late.shop.svc.cluster.local.", A, "late.shop.svc.cluster.local. 5 IN A 10.244.9.9"),
                ("9.9.244.10.in-addr.arpa.", Ptr, "9.9.244.10.in-addr.arpa. 5 IN PTR l.late.shop.svc.cluster.local."),
            ],
        );
        // A changed slice replaces the endpoints and their PTRs.
        zone.apply_slice(&slice(
            "shop",
            "late-1",
            "late",
            serde_json::json!({"endpoints": [{"addresses": ["10.244.9.10"]}]}),
        ))
        .unwrap();
        check(
            &zone,
            &[
                ("late.shop.svc.cluster.local.", A, "late.shop.svc.cluster.local. 5 IN A 10.244.9.10"),
                ("9.9.244.10.in-addr.arpa.", Ptr, "NXDOMAIN in-addr.arpa."),
                (
                    "10.9.244.10.in-addr.arpa.",
                    Ptr,
                    "10.9.244.10.in-addr.arpa. 5 IN PTR 10-244-9-10.late.shop.svc.cluster.local.",
                ),
            ],
        );
        // A slice relabelled to another Service leaves the first one.
        zone.apply_slice(&slice(
            "shop",
            "late-1",
            "db",
            serde_json::json!({"endpoints": [{"addresses": ["10.244.9.10"]}]}),
        ))
        .unwrap();
        check(
            &zone,
            &[
                ("late.shop.svc.cluster.local.", A, "NXDOMAIN cluster.local."),
                (
                    "10-244-9-10.db.shop.svc.cluster.local.",
                    A,
                    "10-244-9-10.db.shop.svc.cluster.local. 5 IN A 10.244.9.10",
                ),
            ],
        );
        zone.delete_slice("shop", "late-1");
        zone.delete_slice("shop", "db-a");
        check(
            &zone,
            &[
                ("db.shop.svc.cluster.local.", A, "NXDOMAIN cluster.local."),
                ("5.1.244.10.in-addr.arpa.", Ptr, "NXDOMAIN in-addr.arpa."),
            ],
        );
        // publishNotReadyAddresses serves endpoints that are not ready.
        zone.apply_slice(&slice(
            "shop",
            "db-a",
            "db",
            serde_json::json!({"endpoints": [{"addresses": ["10.244.4.8"], "conditions": {"ready": false}}]}),
        ))
        .unwrap();
        check(&zone, &[("db.shop.svc.cluster.local.", A, "NXDOMAIN cluster.local.")]);
        zone.apply_service(&service(
            "shop",
            "db",
            serde_json::json!({"clusterIP": "None", "publishNotReadyAddresses": true}),
        ))
        .unwrap();
        check(&zone, &[("db.shop.svc.cluster.local.", A, "db.shop.svc.cluster.local. 5 IN A 10.244.4.8")]);
        // A Service that turns invalid stops resolving rather than keeping stale records.
        let bad = service("shop", "web", serde_json::json!({"type": "ExternalName", "externalName": "bad name!"}));
        assert_eq!(
            zone.apply_service(&bad).unwrap_err().to_string(),
            "Service shop/web: externalName \"bad name!\" is not a DNS name"
        );
        check(
            &zone,
            &[
                ("web.shop.svc.cluster.local.", A, "NXDOMAIN cluster.local."),
                ("20.0.96.10.in-addr.arpa.", Ptr, "NXDOMAIN in-addr.arpa."),
            ],
        );
        for name in ["db", "ext", "empty", "dual", "late"] {
            zone.delete_service("shop", name);
        }
        check(&zone, &[("shop.svc.cluster.local.", A, "NXDOMAIN cluster.local.")]);
        assert_eq!(zone.services(), 0);
        assert_eq!(zone.state.len(), 1, "a slice is kept until deleted: its Service may come back");
        zone.delete_slice("shop", "db-a");
        assert!(zone.state.is_empty() && zone.reverse.is_empty() && zone.slice_owner.is_empty(), "nothing left behind");
    }

    #[test]
    fn t10_objects_that_cannot_be_served() {
        let mut zone = zone();
        let no_name: Service = serde_json::from_value(serde_json::json!({"metadata": {"namespace": "x"}})).unwrap();
        assert_eq!(zone.apply_service(&no_name).unwrap_err(), RecordsError::MissingName { kind: "Service" });
        let upper = service("shop", "Web_1", serde_json::json!({"clusterIP": "10.96.0.30"}));
        assert!(zone.apply_service(&upper).unwrap_err().to_string().contains("must be DNS labels"));
        let no_spec: Service =
            serde_json::from_value(serde_json::json!({"metadata": {"namespace": "x", "name": "y"}})).unwrap();
        assert!(zone.apply_service(&no_spec).is_err());
        // Garbage inside a slice is skipped, not fatal.
        let odd = slice(
            "shop",
            "db-a",
            "db",
            serde_json::json!({
            "ports": [{"name": "Bad Port", "port": 1}, {"name": "ok", "port": 70000}],
            "endpoints": [{"addresses": ["not-an-ip", "10.244.1.5"], "hostname": "Not A Label"}]}),
        );
        zone.apply_slice(&odd).unwrap();
        check(
            &zone,
            &[
                ("db.shop.svc.cluster.local.", A, "db.shop.svc.cluster.local. 5 IN A 10.244.1.5"),
                ("10-244-1-5.db.shop.svc.cluster.local.", A, "10-244-1-5.db.shop.svc.cluster.local. 5 IN A 10.244.1.5"),
                ("_ok._tcp.db.shop.svc.cluster.local.", Srv, "NXDOMAIN cluster.local."),
            ],
        );
        let fqdn = slice(
            "shop",
            "db-a",
            "db",
            serde_json::json!({"addressType": "FQDN", "endpoints": [{"addresses": ["example.com"]}]}),
        );
        zone.apply_slice(&fqdn).unwrap();
        check(&zone, &[("db.shop.svc.cluster.local.", A, "NXDOMAIN cluster.local.")]);
        assert!(Zone::new(ZoneConfig { domain: "bad domain".into(), ..ZoneConfig::default() }).is_err());
    }
}
