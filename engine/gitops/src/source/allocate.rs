//! Service addresses and ports, allocated where Git leaves them out and checked where Git sets
//! them: the API server's allocators, run inside a sync's plan so that a conflict rejects the
//! commit, with file and line, before anything is written.
//!
//! A ClusterIP comes from the Service range (10.96.0.1 is kept for the `default/kubernetes`
//! Service the control plane makes, 10.96.0.10 for cluster DNS) and a nodePort
//! from 30000-32767 for NodePort and LoadBalancer Services; headless (`clusterIP: None`) and
//! ExternalName Services get neither. What is allocated is stored with the Service and is not
//! Git's, so it is not in the last-applied record: the three-way merge keeps the stored
//! clusterIP, and [`carry_over`] puts nodePorts back into Git's ports list (lists are replaced
//! whole). A Service that leaves Git frees its allocations with its deletion.
//!
//! The allocations in use are read from the stored Services: the source controller is their
//! only writer, and it plans each commit against a cache that holds its own earlier writes.
//!
//! `spec.externalIPs` make every node send the listed addresses' traffic to the Service's Pods,
//! the nodes' own connections included (the class of CVE-2020-8554): refused, as Kubernetes'
//! DenyServiceExternalIPs admission refuses them, unless the operator gives a pool
//! (`--external-ip-pool`), and never an address of the Service or Pod ranges or a node's.

use gitplane_api::network::PodRanges;
use gitplane_controllers::loadbalancer::AddressPool;
use gitplane_store::ObjectKey;
use serde_json::{Value, json};
use std::{collections::HashMap, net::Ipv4Addr, ops::RangeInclusive};

/// The ranges Services are given addresses and ports from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceRanges {
    pub network: Ipv4Addr,
    pub prefix: u8,
    pub node_ports: RangeInclusive<u16>,
    /// Where `spec.externalIPs` may point; none: nowhere.
    pub external_ips: Option<AddressPool>,
    /// The cluster Pod range, which no external IP may be in.
    pub pods: PodRanges,
}

impl Default for ServiceRanges {
    fn default() -> Self {
        ServiceRanges {
            network: Ipv4Addr::new(10, 96, 0, 0),
            prefix: 12,
            node_ports: 30000..=32767,
            external_ips: None,
            pods: PodRanges::default(),
        }
    }
}

impl ServiceRanges {
    /// Parses `--service-cidr` (an IPv4 network of /8 to /28).
    pub fn with_cidr(cidr: &str) -> Result<ServiceRanges, String> {
        let bad = || format!("--service-cidr {cidr:?} is not an IPv4 network like 10.96.0.0/12");
        let (ip, prefix) = cidr.split_once('/').ok_or_else(bad)?;
        let (ip, prefix): (Ipv4Addr, u8) = (ip.parse().map_err(|_| bad())?, prefix.parse().map_err(|_| bad())?);
        if !(8..=28).contains(&prefix) || u32::from(ip) & !mask(prefix) != 0 {
            return Err(format!("{}: the prefix must be /8 to /28 and the host bits zero", bad()));
        }
        Ok(ServiceRanges { network: ip, prefix, ..ServiceRanges::default() })
    }

    pub fn cidr(&self) -> String {
        format!("{}/{}", self.network, self.prefix)
    }

    /// The address cluster DNS answers on: the tenth of the range, as kubeadm makes it.
    pub fn dns(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.network) + 10)
    }

    /// The address of the `default/kubernetes` Service: the first of the range, as
    /// kube-apiserver gives it.
    pub fn kubernetes(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.network) + 1)
    }

    /// The first and last addresses Services may get: not the network's, not its broadcast.
    fn hosts(&self) -> (u32, u32) {
        (u32::from(self.network) + 1, (u32::from(self.network) | !mask(self.prefix)) - 1)
    }

    /// Whether a Service may be given `ip` (in the range, not the network or broadcast address).
    fn assignable(&self, ip: Ipv4Addr) -> bool {
        let (first, last) = self.hosts();
        (first..=last).contains(&u32::from(ip))
    }

    /// Whether `ip` is in the Service range at all.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        u32::from(ip) & mask(self.prefix) == u32::from(self.network)
    }
}

/// What is wrong with a Service's `spec.externalIPs`, given the nodes' addresses.
pub fn external_ip_problems(service: &Value, ranges: &ServiceRanges, nodes: &[Ipv4Addr]) -> Vec<Problem> {
    let listed = service["spec"]["externalIPs"].as_array().map(Vec::as_slice).unwrap_or_default();
    let mut problems = Vec::new();
    for (i, ip) in listed.iter().enumerate() {
        let path = format!("/spec/externalIPs/{i}");
        let Some(text) = ip.as_str() else { continue }; // the schema's error
        let Ok(ip) = text.parse::<Ipv4Addr>() else {
            problems.push((path, format!("{text:?} is not an IPv4 address")));
            continue;
        };
        let why = if ranges.contains(ip) {
            "it is in the Service range".to_owned()
        } else if ranges.pods.contains(ip) {
            "it is in the Pod range".to_owned()
        } else if nodes.contains(&ip) {
            "it is a node's address, whose own traffic it would take".to_owned()
        } else {
            match &ranges.external_ips {
                Some(pool) if pool.contains(ip) => continue,
                Some(pool) => format!("it is outside the external IP pool {pool}"),
                None => "external IPs are refused, as Kubernetes' DenyServiceExternalIPs does: they take the \
                         listed address's traffic on every node (CVE-2020-8554); use a LoadBalancer Service, or \
                         start gitplane with --external-ip-pool CIDR to allow a pool you own"
                    .to_owned(),
            }
        };
        problems.push((path, format!("{ip} cannot be an external IP: {why}")));
    }
    problems
}

fn mask(prefix: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0)
}

/// What is in use, and by which Service.
#[derive(Debug, Default)]
pub struct Allocations {
    ips: HashMap<Ipv4Addr, ObjectKey>,
    node_ports: HashMap<u16, ObjectKey>,
    /// Where the search for a free address and port resumes.
    next_ip: u32,
    next_port: u16,
}

/// One thing wrong with a Service's addresses: the JSON path and the message.
pub type Problem = (String, String);

fn service_type(service: &Value) -> &str {
    service["spec"]["type"].as_str().unwrap_or("ClusterIP")
}

fn wants_node_ports(service: &Value) -> bool {
    matches!(service_type(service), "NodePort" | "LoadBalancer")
}

impl Allocations {
    /// The allocations of the stored Services.
    pub fn of<'a>(services: impl IntoIterator<Item = &'a Value>) -> Allocations {
        let mut allocations = Allocations::default();
        for service in services {
            let Ok(key) = ObjectKey::from_value(service) else { continue };
            if let Some(ip) = service["spec"]["clusterIP"].as_str().and_then(|ip| ip.parse().ok()) {
                allocations.ips.insert(ip, key.clone());
            }
            for port in service["spec"]["ports"].as_array().into_iter().flatten() {
                if let Some(node_port) = port["nodePort"].as_u64().and_then(|p| u16::try_from(p).ok()) {
                    allocations.node_ports.insert(node_port, key.clone());
                }
            }
        }
        allocations
    }

    /// Frees what `key` holds (before it is assigned again, or when it leaves Git).
    pub fn release(&mut self, key: &ObjectKey) {
        self.ips.retain(|_, owner| owner != key);
        self.node_ports.retain(|_, owner| owner != key);
    }

    /// Completes `desired` (Git's Service, or it merged with the stored one) with its ClusterIP
    /// and nodePorts: kept from `stored`, taken from Git after checking, or allocated.
    pub fn assign(
        &mut self,
        key: &ObjectKey,
        desired: &mut Value,
        stored: Option<&Value>,
        ranges: &ServiceRanges,
    ) -> Result<(), Vec<Problem>> {
        self.release(key);
        let mut problems = Vec::new();
        if let Err(problem) = self.assign_cluster_ip(key, desired, stored, ranges) {
            problems.push(problem);
        }
        problems.extend(self.assign_node_ports(key, desired, stored, ranges));
        if problems.is_empty() { Ok(()) } else { Err(problems) }
    }

    fn assign_cluster_ip(
        &mut self,
        key: &ObjectKey,
        desired: &mut Value,
        stored: Option<&Value>,
        ranges: &ServiceRanges,
    ) -> Result<(), Problem> {
        let path = "/spec/clusterIP".to_owned();
        let given = desired["spec"]["clusterIP"].as_str().filter(|ip| !ip.is_empty()).map(str::to_owned);
        let kept = stored.and_then(|s| s["spec"]["clusterIP"].as_str()).filter(|ip| !ip.is_empty());
        if service_type(desired) == "ExternalName" {
            return match given {
                Some(ip) if ip != "None" => {
                    Err((path, format!("an ExternalName Service has no clusterIP; remove {ip:?}")))
                }
                _ => Ok(()),
            };
        }
        if given.as_deref() == Some("None") {
            if kept.is_some_and(|k| k != "None") {
                return Err((path, immutable(kept.unwrap_or_default(), "None")));
            }
            set_cluster_ip(desired, "None");
            return Ok(());
        }
        let ip = match (&given, kept) {
            (Some(given), Some(kept)) if given != kept => return Err((path, immutable(kept, given))),
            (Some(given), _) => {
                let ip: Ipv4Addr = given
                    .parse()
                    .map_err(|_| (path.clone(), format!("{given:?} is not an IPv4 address (or None for headless)")))?;
                if !ranges.assignable(ip) {
                    return Err((
                        path,
                        format!(
                            "{ip} is outside the Service range {} (or is its network or broadcast address): \
                             remove it to have one allocated",
                            ranges.cidr()
                        ),
                    ));
                }
                if ip == ranges.dns() && !(key.namespace == "kube-system" && key.name == "kube-dns") {
                    return Err((path, format!("{ip} is kept for cluster DNS (kube-system/kube-dns): remove it")));
                }
                if ip == ranges.kubernetes() && kept != Some(given.as_str()) {
                    return Err((
                        path,
                        format!("{ip} is kept for the API server's Service (default/kubernetes): remove it"),
                    ));
                }
                ip
            }
            (None, Some(kept)) => {
                kept.parse().map_err(|_| (path.clone(), format!("the stored {kept:?} is not IPv4")))?
            }
            (None, None) => self.free_ip(ranges).ok_or_else(|| {
                (path.clone(), format!("the Service range {} has no free address left", ranges.cidr()))
            })?,
        };
        if let Some(owner) = self.ips.get(&ip).filter(|owner| *owner != key) {
            return Err((path, format!("{ip} is already the clusterIP of {owner}: choose another or remove it")));
        }
        self.ips.insert(ip, key.clone());
        set_cluster_ip(desired, &ip.to_string());
        Ok(())
    }

    /// The next free address after the last one handed out, wrapping around (so a freed address
    /// is not reused at once), never DNS's or the API server's.
    fn free_ip(&mut self, ranges: &ServiceRanges) -> Option<Ipv4Addr> {
        let (first, last) = ranges.hosts();
        let start = self.next_ip.clamp(first, last);
        let kept = [ranges.dns(), ranges.kubernetes()];
        let free = |ip: &u32| !self.ips.contains_key(&Ipv4Addr::from(*ip)) && !kept.contains(&Ipv4Addr::from(*ip));
        let ip = (start..=last).chain(first..start).find(free)?;
        self.next_ip = ip.saturating_add(1);
        Some(Ipv4Addr::from(ip))
    }

    fn assign_node_ports(
        &mut self,
        key: &ObjectKey,
        desired: &mut Value,
        stored: Option<&Value>,
        ranges: &ServiceRanges,
    ) -> Vec<Problem> {
        let mut problems = Vec::new();
        let wanted = wants_node_ports(desired);
        let Some(ports) = desired["spec"]["ports"].as_array_mut() else { return problems };
        for (i, port) in ports.iter_mut().enumerate() {
            let path = format!("/spec/ports/{i}/nodePort");
            let given = port.get("nodePort").and_then(Value::as_u64);
            if !wanted {
                if let Some(p) = given {
                    problems.push((path, format!("nodePort {p} needs type NodePort or LoadBalancer: remove it")));
                }
                continue;
            }
            let node_port = match given {
                Some(p) => match u16::try_from(p).ok().filter(|p| ranges.node_ports.contains(p)) {
                    Some(p) => p,
                    None => {
                        let (lo, hi) = (ranges.node_ports.start(), ranges.node_ports.end());
                        problems.push((
                            path,
                            format!("nodePort {p} is outside {lo}-{hi}: remove it to have one allocated"),
                        ));
                        continue;
                    }
                },
                None => match stored.and_then(|s| stored_node_port(s, port)) {
                    Some(p) => p,
                    None => match self.free_node_port(ranges) {
                        Some(p) => p,
                        None => {
                            problems.push((path, "the nodePort range has no free port left".into()));
                            continue;
                        }
                    },
                },
            };
            if let Some(owner) = self.node_ports.get(&node_port).filter(|owner| *owner != key) {
                problems.push((
                    path,
                    format!("nodePort {node_port} is already used by {owner}: choose another or remove it"),
                ));
                continue;
            }
            if given.is_some() && self.node_ports.get(&node_port) == Some(key) {
                problems.push((path, format!("nodePort {node_port} is given twice in this Service")));
                continue;
            }
            self.node_ports.insert(node_port, key.clone());
            port["nodePort"] = json!(node_port);
        }
        problems
    }

    fn free_node_port(&mut self, ranges: &ServiceRanges) -> Option<u16> {
        let (lo, hi) = (*ranges.node_ports.start(), *ranges.node_ports.end());
        let start = self.next_port.clamp(lo, hi);
        let port = (start..=hi).chain(lo..start).find(|p| !self.node_ports.contains_key(p))?;
        self.next_port = port.saturating_add(1);
        Some(port)
    }
}

fn set_cluster_ip(service: &mut Value, ip: &str) {
    service["spec"]["clusterIP"] = json!(ip);
    service["spec"]["clusterIPs"] = json!([ip]);
}

fn immutable(kept: &str, given: &str) -> String {
    format!(
        "spec.clusterIP is immutable: the Service has {kept}, Git now says {given}; remove the field to keep {kept}, \
         or rename the Service to get a new one"
    )
}

/// The nodePort the stored Service has for the same port (by port number and protocol).
fn stored_node_port(stored: &Value, port: &Value) -> Option<u16> {
    let protocol = |p: &Value| p["protocol"].as_str().unwrap_or("TCP").to_owned();
    stored["spec"]["ports"]
        .as_array()?
        .iter()
        .find(|s| s["port"] == port["port"] && protocol(s) == protocol(port))?["nodePort"]
        .as_u64()
        .and_then(|p| u16::try_from(p).ok())
}

/// Git's Service with what the stored one has allocated: the object to compare and to write.
pub fn carry_over(git: &Value, stored: &Value) -> Value {
    let mut desired = git.clone();
    if let Some(ip) = stored["spec"]["clusterIP"].as_str().filter(|ip| !ip.is_empty())
        && desired["spec"]["clusterIP"].as_str().is_none_or(str::is_empty)
        && service_type(&desired) != "ExternalName"
    {
        set_cluster_ip(&mut desired, ip);
    }
    if wants_node_ports(&desired)
        && let Some(ports) = desired["spec"]["ports"].as_array_mut()
    {
        for port in ports.iter_mut().filter(|p| p.get("nodePort").is_none()) {
            if let Some(p) = stored_node_port(stored, port) {
                port["nodePort"] = json!(p);
            }
        }
    }
    desired
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn external_ips_need_a_pool_and_never_take_the_clusters_own_addresses() {
        let service = |ips: &[&str]| json!({"spec": {"externalIPs": ips}});
        let nodes: Vec<Ipv4Addr> = vec!["172.29.0.11".parse().unwrap()];
        let problems = |ranges: &ServiceRanges, ips: &[&str]| -> Vec<String> {
            external_ip_problems(&service(ips), ranges, &nodes).into_iter().map(|(p, m)| format!("{p}: {m}")).collect()
        };
        let refused = problems(&ServiceRanges::default(), &["198.51.100.5"]);
        assert_eq!(refused.len(), 1);
        assert!(
            refused[0]
                .starts_with("/spec/externalIPs/0: 198.51.100.5 cannot be an external IP: external IPs are refused")
        );
        let pool = ServiceRanges {
            external_ips: Some(AddressPool::parse("198.51.100.0/24").unwrap()),
            ..ServiceRanges::default()
        };
        assert_eq!(problems(&pool, &["198.51.100.5"]), Vec::<String>::new());
        let cases = [
            ("203.0.113.1", "outside the external IP pool 198.51.100.0/24"),
            ("10.96.0.1", "in the Service range"),
            ("10.244.1.9", "in the Pod range"),
            ("172.29.0.11", "a node's address"),
            ("not-an-ip", "is not an IPv4 address"),
        ];
        for (ip, why) in cases {
            let got = problems(&pool, &[ip]);
            assert!(got.len() == 1 && got[0].contains(why), "{ip}: {got:?}");
        }
    }

    fn service(name: &str, spec: Value) -> (ObjectKey, Value) {
        let value = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "default"}, "spec": spec});
        (ObjectKey::from_value(&value).unwrap(), value)
    }

    #[test]
    fn allocates_keeps_and_checks_cluster_ips() {
        let ranges = ServiceRanges::default();
        let mut allocations = Allocations::default();
        let (a, mut a_svc) = service("a", json!({"ports": [{"port": 80}]}));
        allocations.assign(&a, &mut a_svc, None, &ranges).unwrap();
        assert_eq!(a_svc["spec"]["clusterIP"], "10.96.0.2");
        assert_eq!(a_svc["spec"]["clusterIPs"], json!(["10.96.0.2"]));

        // Kept when Git leaves it out, on a later sync.
        let (_, mut again) = service("a", json!({"ports": [{"port": 80}]}));
        allocations.assign(&a, &mut again, Some(&a_svc), &ranges).unwrap();
        assert_eq!(again["spec"]["clusterIP"], "10.96.0.2");

        // A second Service gets the next; DNS's and the API server's addresses are never
        // handed out.
        let (b, mut b_svc) = service("b", json!({}));
        allocations.assign(&b, &mut b_svc, None, &ranges).unwrap();
        assert_eq!(b_svc["spec"]["clusterIP"], "10.96.0.3");
        let used: Vec<String> = (0..20)
            .map(|i| {
                let (k, mut v) = service(&format!("s{i}"), json!({}));
                allocations.assign(&k, &mut v, None, &ranges).unwrap();
                v["spec"]["clusterIP"].as_str().unwrap().to_owned()
            })
            .collect();
        assert!(!used.contains(&"10.96.0.10".to_owned()) && !used.contains(&"10.96.0.1".to_owned()));

        let errors = |spec: Value, allocations: &mut Allocations| {
            let (k, mut v) = service("c", spec);
            allocations.assign(&k, &mut v, None, &ranges).unwrap_err()
        };
        let taken = errors(json!({"clusterIP": "10.96.0.2"}), &mut allocations);
        assert!(taken[0].1.contains("Service default/a") && taken[0].0 == "/spec/clusterIP", "{taken:?}");
        let outside = errors(json!({"clusterIP": "192.168.1.1"}), &mut allocations);
        assert!(outside[0].1.contains("outside the Service range 10.96.0.0/12"), "{outside:?}");
        let dns = errors(json!({"clusterIP": "10.96.0.10"}), &mut allocations);
        assert!(dns[0].1.contains("cluster DNS"), "{dns:?}");
        let api = errors(json!({"clusterIP": "10.96.0.1"}), &mut allocations);
        assert!(api[0].1.contains("default/kubernetes"), "{api:?}");
        assert!(errors(json!({"clusterIP": "nope"}), &mut allocations)[0].1.contains("not an IPv4"));

        // Immutable once allocated; headless and ExternalName get nothing.
        let (_, mut moved) = service("a", json!({"clusterIP": "10.96.0.99"}));
        let immutable = allocations.assign(&a, &mut moved, Some(&a_svc), &ranges).unwrap_err();
        assert!(immutable[0].1.contains("immutable"), "{immutable:?}");
        let (h, mut headless) = service("h", json!({"clusterIP": "None"}));
        allocations.assign(&h, &mut headless, None, &ranges).unwrap();
        assert_eq!(headless["spec"]["clusterIP"], "None");
        let (e, mut external) = service("e", json!({"type": "ExternalName", "externalName": "example.com"}));
        allocations.assign(&e, &mut external, None, &ranges).unwrap();
        assert!(external["spec"].get("clusterIP").is_none());
    }

    #[test]
    fn node_ports_are_allocated_kept_across_list_replacement_and_unique() {
        let ranges = ServiceRanges::default();
        let mut allocations = Allocations::default();
        let spec = json!({"type": "NodePort", "ports": [{"port": 80}, {"port": 443, "nodePort": 30443}]});
        let (a, mut a_svc) = service("a", spec.clone());
        allocations.assign(&a, &mut a_svc, None, &ranges).unwrap();
        assert_eq!(a_svc["spec"]["ports"][0]["nodePort"], 30000);
        assert_eq!(a_svc["spec"]["ports"][1]["nodePort"], 30443);

        // Git's ports list replaces the stored one whole: the allocated port is carried over.
        let (_, git) = service("a", spec);
        let merged = carry_over(&git, &a_svc);
        assert_eq!(merged["spec"]["ports"][0]["nodePort"], 30000);
        let mut again = merged.clone();
        allocations.assign(&a, &mut again, Some(&a_svc), &ranges).unwrap();
        assert_eq!(again, merged, "nothing moves on a re-sync");

        let (b, mut b_svc) = service("b", json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": 30443}]}));
        let taken = allocations.assign(&b, &mut b_svc, None, &ranges).unwrap_err();
        assert!(taken[0].1.contains("Service default/a") && taken[0].0 == "/spec/ports/0/nodePort", "{taken:?}");
        let (c, mut c_svc) = service("c", json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": 80}]}));
        assert!(allocations.assign(&c, &mut c_svc, None, &ranges).unwrap_err()[0].1.contains("outside 30000-32767"));
        let (d, mut d_svc) = service("d", json!({"ports": [{"port": 80, "nodePort": 30100}]}));
        assert!(allocations.assign(&d, &mut d_svc, None, &ranges).unwrap_err()[0].1.contains("needs type NodePort"));

        // Released with the Service: another may take the port.
        allocations.release(&a);
        let (e, mut e_svc) = service("e", json!({"type": "NodePort", "ports": [{"port": 80, "nodePort": 30443}]}));
        allocations.assign(&e, &mut e_svc, None, &ranges).unwrap();
    }

    #[test]
    fn stored_services_are_read_back() {
        let (_, a) = service(
            "a",
            json!({"clusterIP": "10.96.0.7", "type": "NodePort", "ports": [{"port": 80, "nodePort": 30007}]}),
        );
        let mut allocations = Allocations::of([&a]);
        let (b, mut b_svc) = service("b", json!({"clusterIP": "10.96.0.7"}));
        assert!(allocations.assign(&b, &mut b_svc, None, &ServiceRanges::default()).is_err());
        assert!(ServiceRanges::with_cidr("10.96.0.0/12").is_ok());
        assert!(ServiceRanges::with_cidr("10.96.0.1/12").is_err());
        assert!(ServiceRanges::with_cidr("10.96.0.0/30").is_err());
        assert_eq!(ServiceRanges::with_cidr("172.20.0.0/16").unwrap().dns(), Ipv4Addr::new(172, 20, 0, 10));
    }
}
