//! LoadBalancer controller: gives each LoadBalancer Service one address from the pool given on
//! the command line (`--load-balancer-pool`) and reports it in `status.loadBalancer.ingress`,
//! as MetalLB's controller does for a bare-metal cluster (its IPAM, layer 2 style: the address
//! is only allocated here; node agents answer for it).
//!
//! State lives in the Services' status, nowhere else (MetalLB's controller also keeps none of
//! its own: it re-learns allocations from the Services when it starts): an address is held while
//! its Service exists and is a LoadBalancer, and is free again once the Service is deleted or
//! changes type. A `spec.loadBalancerIP` is honoured when it is in the pool and free; otherwise
//! the Service stays `<pending>` and the reason is logged. Services of another
//! `loadBalancerClass` are left to their implementation. Without a pool the controller does not
//! run, and LoadBalancer Services stay `<pending>`, as on a cluster without a cloud provider.

use crate::{Action, Context, ReconcileError, Reconciler};
use gitplane_api::object::{from_value, kind_of};
use gitplane_store::{Event, EventType, ObjectKey, informer::Cache};
use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::Value;
use std::{
    collections::{BTreeSet, HashMap, HashSet},
    fmt,
    net::Ipv4Addr,
    sync::Mutex,
};

/// The addresses LoadBalancer Services are given: an IPv4 network. Its network and broadcast
/// addresses are left out (but for a /31 or /32, which have none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddressPool {
    network: Ipv4Addr,
    prefix: u8,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{given:?} is not an IPv4 network like 192.0.2.0/28: {reason}")]
pub struct PoolError {
    pub given: String,
    pub reason: &'static str,
}

impl AddressPool {
    /// Parses a CIDR such as `192.0.2.0/28` (a /8 to a /32, host bits zero).
    pub fn parse(cidr: &str) -> Result<AddressPool, PoolError> {
        let fail = |reason| PoolError { given: cidr.to_owned(), reason };
        let (ip, prefix) = cidr.split_once('/').ok_or_else(|| fail("no /prefix"))?;
        let network: Ipv4Addr = ip.parse().map_err(|_| fail("not an IPv4 address"))?;
        let prefix: u8 = prefix.parse().map_err(|_| fail("the prefix is not a number"))?;
        if !(8..=32).contains(&prefix) {
            return Err(fail("the prefix must be /8 to /32"));
        }
        if u32::from(network) & !mask(prefix) != 0 {
            return Err(fail("the host bits must be zero"));
        }
        Ok(AddressPool { network, prefix })
    }

    /// The first and last address handed out.
    fn bounds(&self) -> (u32, u32) {
        let (first, last) = (u32::from(self.network), u32::from(self.network) | !mask(self.prefix));
        if self.prefix >= 31 { (first, last) } else { (first + 1, last - 1) }
    }

    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        let (first, last) = self.bounds();
        (first..=last).contains(&u32::from(ip))
    }

    fn addresses(&self) -> impl Iterator<Item = Ipv4Addr> {
        let (first, last) = self.bounds();
        (first..=last).map(Ipv4Addr::from)
    }
}

impl fmt::Display for AddressPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

fn mask(prefix: u8) -> u32 {
    u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0)
}

/// What a Service's `status.loadBalancer` should hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Allocation {
    /// Another `loadBalancerClass`'s Service: its status is not this controller's.
    Foreign,
    /// No address: not a LoadBalancer Service, or none it may have yet (then why).
    Pending(Option<String>),
    Address(Ipv4Addr),
}

/// Who keeps an address two Services both claim (after a restore, or a pool change): the
/// older Service, then the first by namespace and name, so that every reconcile agrees.
type Rank = (Option<Time>, String, String);

fn rank(service: &Service) -> Rank {
    let meta = &service.metadata;
    (meta.creation_timestamp.clone(), meta.namespace.clone().unwrap_or_default(), meta.name.clone().unwrap_or_default())
}

fn is_foreign(service: &Service) -> bool {
    service.spec.as_ref().and_then(|s| s.load_balancer_class.as_deref()).is_some_and(|c| !c.is_empty())
}

fn is_load_balancer(service: &Service) -> bool {
    service.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("LoadBalancer")
}

/// The pool addresses in a Service's `status.loadBalancer.ingress`.
fn held(service: &Service, pool: &AddressPool) -> Vec<Ipv4Addr> {
    let ingress = service.status.as_ref().and_then(|s| s.load_balancer.as_ref()).and_then(|l| l.ingress.as_ref());
    ingress
        .into_iter()
        .flatten()
        .filter_map(|i| i.ip.as_deref()?.parse().ok())
        .filter(|ip| pool.contains(*ip))
        .collect()
}

/// The address `service` should have, given the addresses the `others` hold.
pub fn plan(service: &Service, pool: &AddressPool, others: &[Service]) -> Allocation {
    if is_foreign(service) {
        return Allocation::Foreign;
    }
    if !is_load_balancer(service) {
        return Allocation::Pending(None);
    }
    let me = rank(service);
    let mut taken: HashMap<Ipv4Addr, (Rank, String)> = HashMap::new();
    for other in others.iter().filter(|o| is_load_balancer(o) && !is_foreign(o) && rank(o) != me) {
        let owner = format!(
            "{}/{}",
            other.metadata.namespace.as_deref().unwrap_or(""),
            other.metadata.name.as_deref().unwrap_or("")
        );
        for ip in held(other, pool) {
            let claim = (rank(other), owner.clone());
            taken.entry(ip).and_modify(|c| *c = std::cmp::min(c.clone(), claim.clone())).or_insert(claim);
        }
    }
    // An address this Service holds stays its own unless an older Service claims it too.
    let keeps = |ip: &Ipv4Addr| taken.get(ip).is_none_or(|(other, _)| me < *other);
    let current = held(service, pool).into_iter().find(keeps);
    let requested = service.spec.as_ref().and_then(|s| s.load_balancer_ip.as_deref()).filter(|ip| !ip.is_empty());
    if let Some(requested) = requested {
        let Ok(ip) = requested.parse::<Ipv4Addr>() else {
            return Allocation::Pending(Some(format!("spec.loadBalancerIP {requested:?} is not an IPv4 address")));
        };
        if !pool.contains(ip) {
            return Allocation::Pending(Some(format!("spec.loadBalancerIP {ip} is outside the pool {pool}")));
        }
        if current == Some(ip) {
            return Allocation::Address(ip);
        }
        return match taken.get(&ip) {
            Some((_, owner)) => {
                Allocation::Pending(Some(format!("spec.loadBalancerIP {ip} is already the address of {owner}")))
            }
            None => Allocation::Address(ip),
        };
    }
    if let Some(ip) = current {
        return Allocation::Address(ip);
    }
    match pool.addresses().find(|ip| !taken.contains_key(ip)) {
        Some(ip) => Allocation::Address(ip),
        None => Allocation::Pending(Some(format!("the pool {pool} has no free address left"))),
    }
}

/// The status for an allocation, or `None` when the stored one is already right.
pub fn status(service: &Service, allocation: &Allocation) -> Option<LoadBalancerStatus> {
    let current = service.status.as_ref().and_then(|s| s.load_balancer.clone()).unwrap_or_default();
    let ingress = match allocation {
        Allocation::Foreign => return None,
        Allocation::Pending(_) => Vec::new(),
        Allocation::Address(ip) => vec![LoadBalancerIngress {
            ip: Some(ip.to_string()),
            // What the API server defaults it to: traffic to it is delivered to the Service.
            ip_mode: Some("VIP".into()),
            ..Default::default()
        }],
    };
    let desired = LoadBalancerStatus { ingress: (!ingress.is_empty()).then_some(ingress) };
    (current.ingress.as_deref().unwrap_or_default() != desired.ingress.as_deref().unwrap_or_default())
        .then_some(desired)
}

fn has_ingress(service: &Value) -> bool {
    service["status"]["loadBalancer"]["ingress"].as_array().is_some_and(|i| !i.is_empty())
}

fn wants_address(service: &Value) -> bool {
    service["spec"]["type"] == "LoadBalancer" && service["spec"]["loadBalancerClass"].as_str().is_none_or(str::is_empty)
}

/// Which Services hold addresses and which wait for one, so that an address given back wakes
/// the waiting ones (an event carries only the new state of a Service).
#[derive(Default)]
struct Index {
    holders: HashSet<ObjectKey>,
    waiting: BTreeSet<ObjectKey>,
}

impl Index {
    /// Records a Service's new state (`None`: deleted); whether it gave an address back.
    fn observe(&mut self, key: &ObjectKey, service: Option<&Value>) -> bool {
        if service.is_some_and(|s| wants_address(s) && !has_ingress(s)) {
            self.waiting.insert(key.clone());
        } else {
            self.waiting.remove(key);
        }
        if service.is_some_and(has_ingress) {
            self.holders.insert(key.clone());
            false
        } else {
            self.holders.remove(key)
        }
    }
}

pub struct LoadBalancerController {
    pool: AddressPool,
    index: Mutex<Index>,
}

impl LoadBalancerController {
    pub fn new(pool: AddressPool) -> Self {
        LoadBalancerController { pool, index: Mutex::default() }
    }
}

#[async_trait::async_trait]
impl Reconciler for LoadBalancerController {
    fn name(&self) -> &'static str {
        "loadbalancer"
    }

    fn keys_for(&self, event: &Event, _: &Cache) -> Vec<ObjectKey> {
        if event.key.kind != kind_of::<Service>() {
            return Vec::new();
        }
        let service = (event.event_type != EventType::Deleted).then_some(&*event.object);
        let mut index = self.index.lock().unwrap_or_else(|e| e.into_inner());
        let freed = index.observe(&event.key, service);
        let mut keys: Vec<ObjectKey> = if freed { index.waiting.iter().cloned().collect() } else { Vec::new() };
        if service.is_some_and(|s| wants_address(s) || has_ingress(s)) && !keys.contains(&event.key) {
            keys.push(event.key.clone());
        }
        keys
    }

    fn all_keys(&self, cache: &Cache) -> Vec<ObjectKey> {
        let mut index = Index::default();
        let mut keys = Vec::new();
        for service in cache.list(&kind_of::<Service>(), None) {
            let Ok(key) = ObjectKey::from_value(&service) else { continue };
            index.observe(&key, Some(&service));
            if wants_address(&service) || has_ingress(&service) {
                keys.push(key);
            }
        }
        *self.index.lock().unwrap_or_else(|e| e.into_inner()) = index;
        keys
    }

    async fn reconcile(&self, key: &ObjectKey, ctx: &Context) -> Result<Action, ReconcileError> {
        let Some(value) = ctx.cache().get(key) else { return Ok(Action::await_change()) };
        let service: Service = from_value((*value).clone()).map_err(|e| ReconcileError::Invalid(e.to_string()))?;
        let others: Vec<Service> = ctx.cache().list_typed_where(None, has_ingress);
        let allocation = plan(&service, &self.pool, &others);
        let Some(load_balancer) = status(&service, &allocation) else { return Ok(Action::await_change()) };
        match &allocation {
            Allocation::Address(ip) => tracing::info!(%ip, "assigning the load balancer address"),
            Allocation::Pending(Some(reason)) => tracing::warn!(%reason, "no load balancer address"),
            _ => tracing::info!("releasing the load balancer address"),
        }
        let mut updated = service;
        updated.status.get_or_insert_with(Default::default).load_balancer = Some(load_balancer);
        ctx.update_status(&updated).await?;
        Ok(Action::await_change())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pool() -> AddressPool {
        AddressPool::parse("192.0.2.0/29").unwrap()
    }

    /// A Service created at second `created`, of `type`, holding `ip` in its status (if any).
    fn service(name: &str, created: i64, type_: &str, ip: Option<&str>, spec: Value) -> Service {
        let mut value = json!({
            "metadata": {"name": name, "namespace": "default",
                         "creationTimestamp": k8s_openapi::jiff::Timestamp::from_second(created).unwrap().to_string()},
            "spec": {"type": type_, "ports": [{"port": 80}]},
        });
        for (k, v) in spec.as_object().into_iter().flatten() {
            value["spec"][k] = v.clone();
        }
        if let Some(ip) = ip {
            value["status"] = json!({"loadBalancer": {"ingress": [{"ip": ip, "ipMode": "VIP"}]}});
        }
        serde_json::from_value(value).unwrap()
    }

    fn lb(name: &str, created: i64, ip: Option<&str>) -> Service {
        service(name, created, "LoadBalancer", ip, json!({}))
    }

    fn addr(ip: &str) -> Allocation {
        Allocation::Address(ip.parse().unwrap())
    }

    #[test]
    fn pools_parse_and_skip_network_and_broadcast() {
        let p = pool();
        assert_eq!(p.to_string(), "192.0.2.0/29");
        assert_eq!(p.addresses().map(|a| a.to_string()).collect::<Vec<_>>().len(), 6);
        assert!(!p.contains("192.0.2.0".parse().unwrap()) && !p.contains("192.0.2.7".parse().unwrap()));
        assert_eq!(AddressPool::parse("192.0.2.9/32").unwrap().addresses().count(), 1);
        for bad in ["192.0.2.0", "192.0.2.1/29", "192.0.2.0/33", "::1/128", "10.0.0.0/4"] {
            assert!(AddressPool::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn plan_table() {
        let full: Vec<Service> = (1..=6).map(|i| lb(&format!("s{i}"), i, Some(&format!("192.0.2.{i}")))).collect();
        #[rustfmt::skip]
        let cases: Vec<(&str, Service, Vec<Service>, Allocation)> = vec![
            ("the first free address", lb("a", 10, None), vec![lb("b", 1, Some("192.0.2.1"))], addr("192.0.2.2")),
            ("an address is kept", lb("a", 10, Some("192.0.2.5")), vec![lb("b", 1, Some("192.0.2.1"))], addr("192.0.2.5")),
            ("a requested address that is free",
             service("a", 10, "LoadBalancer", None, json!({"loadBalancerIP": "192.0.2.4"})), vec![], addr("192.0.2.4")),
            ("a requested address moves the Service there",
             service("a", 10, "LoadBalancer", Some("192.0.2.1"), json!({"loadBalancerIP": "192.0.2.4"})), vec![], addr("192.0.2.4")),
            ("a requested address that is taken",
             service("a", 10, "LoadBalancer", None, json!({"loadBalancerIP": "192.0.2.1"})), vec![lb("b", 1, Some("192.0.2.1"))],
             Allocation::Pending(Some("spec.loadBalancerIP 192.0.2.1 is already the address of default/b".into()))),
            ("a requested address outside the pool",
             service("a", 10, "LoadBalancer", None, json!({"loadBalancerIP": "198.51.100.1"})), vec![],
             Allocation::Pending(Some("spec.loadBalancerIP 198.51.100.1 is outside the pool 192.0.2.0/29".into()))),
            ("an exhausted pool", lb("a", 10, None), full.clone(),
             Allocation::Pending(Some("the pool 192.0.2.0/29 has no free address left".into()))),
            ("a contested address stays with the older Service", lb("a", 10, Some("192.0.2.1")), full.clone(),
             Allocation::Pending(Some("the pool 192.0.2.0/29 has no free address left".into()))),
            ("the older one keeps it", lb("a", 0, Some("192.0.2.1")), full, addr("192.0.2.1")),
            ("an address outside a changed pool is replaced", lb("a", 10, Some("198.51.100.1")), vec![], addr("192.0.2.1")),
            ("not a LoadBalancer any more", service("a", 10, "ClusterIP", Some("192.0.2.1"), json!({})), vec![],
             Allocation::Pending(None)),
            ("another class's Service",
             service("a", 10, "LoadBalancer", None, json!({"loadBalancerClass": "example.com/lb"})), vec![], Allocation::Foreign),
            ("another class's addresses are not ours",
             lb("a", 10, None), vec![service("b", 1, "LoadBalancer", Some("192.0.2.1"), json!({"loadBalancerClass": "x/y"}))],
             addr("192.0.2.1")),
        ];
        for (what, service, others, expected) in cases {
            assert_eq!(plan(&service, &pool(), &others), expected, "{what}");
        }
    }

    #[test]
    fn status_is_written_only_when_it_changes() {
        let holding = lb("a", 1, Some("192.0.2.1"));
        assert_eq!(status(&holding, &addr("192.0.2.1")), None);
        let moved = status(&holding, &addr("192.0.2.2")).unwrap();
        assert_eq!(serde_json::to_value(&moved).unwrap(), json!({"ingress": [{"ip": "192.0.2.2", "ipMode": "VIP"}]}));
        assert_eq!(status(&holding, &Allocation::Pending(None)), Some(LoadBalancerStatus::default()));
        assert_eq!(status(&lb("b", 1, None), &Allocation::Pending(None)), None);
        assert_eq!(status(&holding, &Allocation::Foreign), None);
    }

    #[test]
    fn an_address_given_back_wakes_the_waiting_services() {
        let controller = LoadBalancerController::new(pool());
        let event = |name: &str, event_type, object: Value| Event {
            revision: 1,
            event_type,
            key: ObjectKey::of::<Service>("default", name),
            object: std::sync::Arc::new(object),
        };
        let cache = Cache::default();
        let waiting = json!({"spec": {"type": "LoadBalancer"}});
        let holding =
            json!({"spec": {"type": "LoadBalancer"}, "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}}});
        assert_eq!(controller.keys_for(&event("w", EventType::Added, waiting), &cache).len(), 1);
        assert_eq!(controller.keys_for(&event("h", EventType::Added, holding.clone()), &cache).len(), 1);
        let keys = controller.keys_for(&event("h", EventType::Deleted, holding), &cache);
        assert_eq!(keys, [ObjectKey::of::<Service>("default", "w")]);
        let plain = json!({"spec": {"type": "ClusterIP"}});
        assert!(controller.keys_for(&event("c", EventType::Added, plain), &cache).is_empty());
    }
}
