//! Ingresses into a routing table, without I/O: the pure core of gitplane's Ingress controller.
//! The node agent's proxy routes by it; the control plane's Ingress controller builds the same
//! table to report what it found wrong (a conflict, a missing Service) as Events.
//!
//! Resolution follows ingress-nginx: a request's host picks a server (an exact host, then a
//! `*.` wildcard matching one label, then the rules without a host); in it the longest matching
//! path wins (Exact before Prefix for the same path; ImplementationSpecific is Prefix); a path
//! that several Ingresses define goes to the oldest Ingress (creationTimestamp, then
//! namespace/name) and the others are reported; without a matching path, the default backend of
//! the oldest Ingress that has one answers. Backends resolve to the Service's ready endpoints,
//! which the proxy spreads requests over directly.

use k8s_openapi::{
    api::{
        core::v1::{Secret, Service, ServicePort},
        discovery::v1::EndpointSlice,
        networking::v1::{Ingress, IngressBackend, IngressClass, IngressServiceBackend},
    },
    apimachinery::pkg::apis::meta::v1::Time,
};
use rustls::{
    pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject},
    sign::CertifiedKey,
};
use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

/// The `spec.controller` of the IngressClasses gitplane implements.
pub const CONTROLLER: &str = "gitplane.io/ingress-controller";
/// The annotation that makes an IngressClass the default for Ingresses that name none.
pub const DEFAULT_CLASS: &str = "ingressclass.kubernetes.io/is-default-class";
/// The label that ties an EndpointSlice to its Service.
const SERVICE_NAME: &str = "kubernetes.io/service-name";
/// The Secret type a TLS certificate is read from.
pub const TLS_SECRET_TYPE: &str = "kubernetes.io/tls";

/// (namespace, name)
pub type Name = (String, String);

/// Whether this Ingress is gitplane's to serve: its class names a gitplane IngressClass or, when
/// it names none, there is no default class or the default is gitplane's. An Ingress of another
/// controller's class is left alone, as every controller does.
pub fn is_ours<'a>(ingress: &Ingress, classes: impl IntoIterator<Item = &'a IngressClass>) -> bool {
    let classes: Vec<&IngressClass> = classes.into_iter().collect();
    let ours = |c: &IngressClass| c.spec.as_ref().and_then(|s| s.controller.as_deref()) == Some(CONTROLLER);
    let named = ingress
        .spec
        .as_ref()
        .and_then(|s| s.ingress_class_name.as_deref())
        .or_else(|| ingress.metadata.annotations.as_ref()?.get("kubernetes.io/ingress.class").map(String::as_str));
    match named {
        Some(name) => classes.iter().any(|c| c.metadata.name.as_deref() == Some(name) && ours(c)),
        None => {
            let default = |c: &&&IngressClass| {
                c.metadata.annotations.as_ref().and_then(|a| a.get(DEFAULT_CLASS)).is_some_and(|v| v == "true")
            };
            let defaults: Vec<&&IngressClass> = classes.iter().filter(default).collect();
            defaults.is_empty() || defaults.iter().any(|c| ours(c))
        }
    }
}

/// Where a route sends requests: a Service port and its ready endpoints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Backend {
    /// `namespace/service:port`, for logs and errors.
    pub name: String,
    /// Ready endpoints; empty: the Service has none (answered 503).
    pub endpoints: Arc<[SocketAddr]>,
}

/// What a request path is compared with.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PathMatch {
    Exact(String),
    Prefix(String),
}

impl PathMatch {
    fn path(&self) -> &str {
        match self {
            PathMatch::Exact(p) | PathMatch::Prefix(p) => p,
        }
    }

    /// Prefix matches element-wise, as Kubernetes defines it: `/foo` matches `/foo` and
    /// `/foo/bar`, not `/foobar`; a trailing slash is ignored.
    pub fn matches(&self, request: &str) -> bool {
        match self {
            PathMatch::Exact(p) => request == p,
            PathMatch::Prefix(p) => {
                let p = p.trim_end_matches('/');
                p.is_empty() || request.strip_prefix(p).is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
            }
        }
    }

    /// Longest path first; Exact before Prefix for the same path.
    fn order(&self) -> (std::cmp::Reverse<usize>, u8) {
        let kind = match self {
            PathMatch::Exact(_) => 0,
            PathMatch::Prefix(_) => 1,
        };
        (std::cmp::Reverse(self.path().trim_end_matches('/').len()), kind)
    }
}

/// One path of one server.
#[derive(Clone, Debug)]
pub struct Route {
    pub path: PathMatch,
    /// Shared by every path to the same Service port (one resolution per table).
    pub backend: Arc<Backend>,
    /// The Ingress that defined it.
    pub ingress: Name,
}

/// The routes of one host (or of the rules without a host), in match order, and an index that
/// finds the first match in as many lookups as the request path has elements (a linear scan
/// would cost every request the host's whole list: 5,000 comparisons at 5,000 paths).
#[derive(Clone, Debug, Default)]
pub struct Server {
    pub routes: Vec<Route>,
    /// Exact path -> its route.
    exact: HashMap<String, usize>,
    /// Prefix path without its trailing slashes -> the first of its routes in match order.
    prefixes: HashMap<String, usize>,
}

impl Server {
    /// Sorts the routes into match order and indexes them.
    fn seal(&mut self) {
        // Stable: among equals the oldest Ingress's route stays first.
        self.routes.sort_by_key(|r| r.path.order());
        self.exact.clear();
        self.prefixes.clear();
        for (i, route) in self.routes.iter().enumerate() {
            match &route.path {
                PathMatch::Exact(p) => self.exact.entry(p.clone()).or_insert(i),
                PathMatch::Prefix(p) => self.prefixes.entry(p.trim_end_matches('/').to_owned()).or_insert(i),
            };
        }
    }

    /// The first route in match order that matches `path`, as a scan of [`Server::routes`] would
    /// find it. An Exact path equal to the request outranks every Prefix that matches it (none is
    /// longer), and the Prefixes that can match are the request cut at each `/` (element-wise),
    /// longest first, down to the empty one (`/`).
    fn find(&self, path: &str) -> Option<&Route> {
        if let Some(&i) = self.exact.get(path) {
            return Some(&self.routes[i]);
        }
        let mut end = path.len();
        loop {
            if let Some(&i) = self.prefixes.get(&path[..end]) {
                return Some(&self.routes[i]);
            }
            if end == 0 {
                return None;
            }
            end = path[..end].rfind('/').unwrap_or(0);
        }
    }
}

/// A TLS certificate a host is served with: the Secret it comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsRoute {
    pub secret: Name,
    pub ingress: Name,
}

/// Something wrong with one Ingress, reported on it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Problem {
    pub ingress: Name,
    /// An Event reason: `ServiceNotFound`, `ServicePortNotFound`, `Conflict`.
    pub reason: &'static str,
    pub message: String,
}

/// Every route of every Ingress served, as of one view of the cluster.
#[derive(Clone, Debug, Default)]
pub struct RouteTable {
    pub hosts: HashMap<String, Server>,
    /// `*.example.com` keyed by `example.com`.
    pub wildcards: HashMap<String, Server>,
    /// The rules without a host.
    pub any_host: Server,
    pub default_backend: Option<Route>,
    /// Host (exact or `*.suffix`) -> certificate.
    pub tls: BTreeMap<String, TlsRoute>,
    pub problems: Vec<Problem>,
}

/// The objects a table is built from.
#[derive(Default)]
pub struct Inputs<'a> {
    pub ingresses: Vec<&'a Ingress>,
    pub classes: Vec<&'a IngressClass>,
    pub services: HashMap<Name, &'a Service>,
    /// EndpointSlices by their Service (namespace, name).
    pub slices: HashMap<Name, Vec<&'a EndpointSlice>>,
}

impl<'a> Inputs<'a> {
    pub fn add_service(&mut self, service: &'a Service) {
        let m = &service.metadata;
        if let (Some(ns), Some(name)) = (&m.namespace, &m.name) {
            self.services.insert((ns.clone(), name.clone()), service);
        }
    }

    pub fn add_slice(&mut self, slice: &'a EndpointSlice) {
        let m = &slice.metadata;
        let service = m.labels.as_ref().and_then(|l| l.get(SERVICE_NAME));
        if let (Some(ns), Some(service)) = (&m.namespace, service) {
            self.slices.entry((ns.clone(), service.clone())).or_default().push(slice);
        }
    }
}

fn name_of(ingress: &Ingress) -> Name {
    let m = &ingress.metadata;
    (m.namespace.clone().unwrap_or_default(), m.name.clone().unwrap_or_default())
}

/// Oldest first: creationTimestamp, then namespace/name.
fn age_rank(ingress: &Ingress) -> (Option<Time>, Name) {
    (ingress.metadata.creation_timestamp.clone(), name_of(ingress))
}

impl RouteTable {
    /// Builds the table from the Ingresses gitplane serves (see [`is_ours`]).
    pub fn build(inputs: &Inputs<'_>) -> RouteTable {
        let mut ingresses: Vec<&Ingress> =
            inputs.ingresses.iter().copied().filter(|i| is_ours(i, inputs.classes.iter().copied())).collect();
        ingresses.sort_by_key(|i| age_rank(i));
        let mut table = RouteTable::default();
        // (host, path) -> the Ingress that has it, oldest first.
        let mut claimed: HashMap<(Option<String>, PathMatch), Name> = HashMap::new();
        let mut resolved = Resolved::default();
        for ingress in ingresses {
            let owner = name_of(ingress);
            let Some(spec) = &ingress.spec else { continue };
            if let Some(b) = &spec.default_backend
                && let Some(backend) = table.backend(inputs, &mut resolved, &owner, b)
            {
                match &table.default_backend {
                    Some(first) => {
                        let message = format!(
                            "the default backend of Ingress {}/{} is used, as it is older",
                            first.ingress.0, first.ingress.1
                        );
                        table.problems.push(Problem { ingress: owner.clone(), reason: "Conflict", message });
                    }
                    None => {
                        let route = Route { path: PathMatch::Prefix("/".into()), backend, ingress: owner.clone() };
                        table.default_backend = Some(route);
                    }
                }
            }
            for rule in spec.rules.iter().flatten() {
                let host = rule.host.clone().filter(|h| !h.is_empty());
                for path in rule.http.iter().flat_map(|h| &h.paths) {
                    let text = path.path.clone().filter(|p| !p.is_empty()).unwrap_or_else(|| "/".into());
                    let matcher = match path.path_type.as_str() {
                        "Exact" => PathMatch::Exact(text),
                        _ => PathMatch::Prefix(text),
                    };
                    let Some(backend) = table.backend(inputs, &mut resolved, &owner, &path.backend) else { continue };
                    let key = (host.clone(), matcher.clone());
                    if let Some(first) = claimed.get(&key) {
                        if *first != owner {
                            let message = format!(
                                "host {} path {} is already routed by Ingress {}/{}, which is older: this path is ignored",
                                host.as_deref().unwrap_or("*"),
                                matcher.path(),
                                first.0,
                                first.1
                            );
                            table.problems.push(Problem { ingress: owner.clone(), reason: "Conflict", message });
                        }
                        continue;
                    }
                    claimed.insert(key, owner.clone());
                    let route = Route { path: matcher, backend, ingress: owner.clone() };
                    let server = match host.as_deref().map(|h| (h, h.strip_prefix("*."))) {
                        Some((_, Some(suffix))) => table.wildcards.entry(suffix.to_owned()).or_default(),
                        Some((h, None)) => table.hosts.entry(h.to_owned()).or_default(),
                        None => &mut table.any_host,
                    };
                    server.routes.push(route);
                }
            }
            for tls in spec.tls.iter().flatten() {
                let Some(secret) = tls.secret_name.clone().filter(|s| !s.is_empty()) else { continue };
                for host in tls.hosts.iter().flatten() {
                    let route = TlsRoute { secret: (owner.0.clone(), secret.clone()), ingress: owner.clone() };
                    match table.tls.get(host) {
                        Some(first) if first.secret != route.secret => {
                            let message = format!(
                                "host {host} already has the certificate of Secret {}/{} (Ingress {}/{}, older): this one is ignored",
                                first.secret.0, first.secret.1, first.ingress.0, first.ingress.1
                            );
                            table.problems.push(Problem { ingress: owner.clone(), reason: "Conflict", message });
                        }
                        Some(_) => {}
                        None => {
                            table.tls.insert(host.clone(), route);
                        }
                    }
                }
            }
        }
        for server in table.hosts.values_mut().chain(table.wildcards.values_mut()).chain([&mut table.any_host]) {
            server.seal();
        }
        table.problems.sort();
        table.problems.dedup();
        table
    }

    /// Resolves a backend of `owner`, or reports why it cannot be (and the path is left out).
    fn backend(
        &mut self,
        inputs: &Inputs<'_>,
        resolved: &mut Resolved,
        owner: &Name,
        backend: &IngressBackend,
    ) -> Option<Arc<Backend>> {
        let Some(service) = &backend.service else {
            let message = "resource backends are not supported by gitplane's Ingress controller: use a Service";
            self.problems.push(Problem {
                ingress: owner.clone(),
                reason: "UnsupportedBackend",
                message: message.into(),
            });
            return None;
        };
        let wanted = service.port.as_ref();
        let key =
            (owner.0.clone(), service.name.clone(), wanted.and_then(|w| w.number), wanted.and_then(|w| w.name.clone()));
        let (backend, problem) = resolved.entry(key).or_insert_with(|| resolve(inputs, &owner.0, service));
        if let Some((reason, message)) = problem {
            self.problems.push(Problem { ingress: owner.clone(), reason, message: message.clone() });
        }
        Some(backend.clone())
    }

    /// The route for a request: its host (without port) and path.
    pub fn route(&self, host: &str, path: &str) -> Option<&Route> {
        let server = self
            .hosts
            .get(host)
            .or_else(|| host.split_once('.').and_then(|(_, suffix)| self.wildcards.get(suffix)))
            .unwrap_or(&self.any_host);
        server.find(path).or(self.default_backend.as_ref())
    }

    /// The certificate's Secret for a TLS server name: the exact host, then a wildcard.
    pub fn tls_for(&self, server_name: &str) -> Option<&TlsRoute> {
        self.tls.get(server_name).or_else(|| {
            let (_, suffix) = server_name.split_once('.')?;
            self.tls.get(&format!("*.{suffix}"))
        })
    }

    /// The TLS Secrets the table needs.
    pub fn tls_secrets(&self) -> BTreeSet<Name> {
        self.tls.values().map(|t| t.secret.clone()).collect()
    }

    /// How many paths are routed (for logs and metrics).
    pub fn len(&self) -> usize {
        self.hosts
            .values()
            .chain(self.wildcards.values())
            .chain([&self.any_host])
            .map(|s| s.routes.len())
            .sum::<usize>()
            + usize::from(self.default_backend.is_some())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Backends resolved so far in one build, by (namespace, Service, port number, port name), with
/// the problem each reports.
type Resolved = HashMap<(String, String, Option<i32>, Option<String>), (Arc<Backend>, Option<(&'static str, String)>)>;

/// A Service backend of an Ingress in `namespace`: the Service port's ready endpoints, or none
/// and why.
fn resolve(
    inputs: &Inputs<'_>,
    namespace: &str,
    service: &IngressServiceBackend,
) -> (Arc<Backend>, Option<(&'static str, String)>) {
    let key = (namespace.to_owned(), service.name.clone());
    let Some(found) = inputs.services.get(&key) else {
        let message = format!("Service {}/{} not found: its paths answer 503 until it exists", key.0, key.1);
        let name = format!("{}/{}", key.0, key.1);
        return (Arc::new(Backend { name, endpoints: Arc::from([]) }), Some(("ServiceNotFound", message)));
    };
    let wanted = service.port.as_ref();
    let ports = found.spec.as_ref().and_then(|s| s.ports.as_deref()).unwrap_or_default();
    let port: Option<&ServicePort> = ports.iter().find(|p| match wanted {
        Some(w) if w.number.is_some() => w.number == Some(p.port),
        Some(w) => w.name.is_some() && w.name == p.name,
        None => ports.len() == 1,
    });
    let shown = wanted
        .and_then(|w| w.number.map(|n| n.to_string()).or_else(|| w.name.clone()))
        .unwrap_or_else(|| "(none)".into());
    let name = format!("{}/{}:{shown}", key.0, key.1);
    let Some(port) = port else {
        let message = format!("Service {}/{} has no port {shown}: its paths answer 503", key.0, key.1);
        return (Arc::new(Backend { name, endpoints: Arc::from([]) }), Some(("ServicePortNotFound", message)));
    };
    let endpoints = ready_endpoints(inputs.slices.get(&key), port).into();
    (Arc::new(Backend { name, endpoints }), None)
}

/// The ready endpoints of a Service port, from its EndpointSlices: the slice port of the same
/// name (the Service port's; an absent name and an empty one are the same, as the EndpointSlice
/// controller writes `""` for an unnamed port), endpoints whose `ready` is not false.
fn ready_endpoints(slices: Option<&Vec<&EndpointSlice>>, port: &ServicePort) -> Vec<SocketAddr> {
    let mut out = Vec::new();
    for slice in slices.into_iter().flatten() {
        let wanted = port.name.as_deref().unwrap_or_default();
        let Some(number) =
            slice.ports.iter().flatten().find(|p| p.name.as_deref().unwrap_or_default() == wanted).and_then(|p| p.port)
        else {
            continue;
        };
        let Ok(number) = u16::try_from(number) else { continue };
        for endpoint in &slice.endpoints {
            if endpoint.conditions.as_ref().and_then(|c| c.ready) == Some(false) {
                continue;
            }
            out.extend(
                endpoint
                    .addresses
                    .iter()
                    .filter_map(|a| a.parse::<IpAddr>().ok())
                    .map(|ip| SocketAddr::new(ip, number)),
            );
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The certificate chain and key of a `kubernetes.io/tls` Secret, PEM as stored, or why not.
pub fn tls_pem(secret: &Secret) -> Result<(&[u8], &[u8]), String> {
    if secret.type_.as_deref() != Some(TLS_SECRET_TYPE) {
        return Err(format!("is of type {:?}, not {TLS_SECRET_TYPE}", secret.type_.as_deref().unwrap_or("Opaque")));
    }
    let data = secret.data.as_ref();
    let field = |key: &str| data.and_then(|d| d.get(key)).map(|b| b.0.as_slice()).filter(|b| !b.is_empty());
    match (field("tls.crt"), field("tls.key")) {
        (Some(crt), Some(key)) => Ok((crt, key)),
        (None, _) => Err("has no tls.crt".into()),
        (_, None) => Err("has no tls.key".into()),
    }
}

/// The certificate chain and key of a TLS Secret, checked to belong together (what the node's
/// HTTPS listener serves, and what the control plane checks to report a broken Secret).
pub fn certified_key(secret: &Secret) -> Result<Arc<CertifiedKey>, String> {
    let (crt, key) = tls_pem(secret)?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(crt)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("has a tls.crt that is not PEM: {e}"))?;
    if chain.is_empty() {
        return Err("has no certificate in tls.crt".into());
    }
    let key =
        PrivateKeyDer::from_pem_slice(key).map_err(|e| format!("has a tls.key that is not a PEM private key: {e}"))?;
    let signing = rustls::crypto::ring::sign::any_supported_type(&key)
        .map_err(|e| format!("has a private key that cannot sign: {e}"))?;
    let certified = CertifiedKey::new(chain, signing);
    certified
        .keys_match()
        .map_err(|e| format!("has a certificate that does not parse or does not match its key: {e}"))?;
    Ok(Arc::new(certified))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn ingress(name: &str, created: i64, spec: Value) -> Ingress {
        let created = k8s_openapi::jiff::Timestamp::from_second(created).unwrap().to_string();
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": "default", "creationTimestamp": created},
                                      "spec": spec}))
        .unwrap()
    }

    fn service(name: &str) -> Service {
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": "default"},
            "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}))
        .unwrap()
    }

    fn slice(service: &str, ips: &[(&str, bool)]) -> EndpointSlice {
        let endpoints: Vec<Value> =
            ips.iter().map(|(ip, ready)| json!({"addresses": [ip], "conditions": {"ready": ready}})).collect();
        serde_json::from_value(json!({"metadata": {"name": format!("{service}-x"), "namespace": "default",
            "labels": {SERVICE_NAME: service}}, "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080}], "endpoints": endpoints}))
        .unwrap()
    }

    fn path(path: &str, kind: &str, service: &str) -> Value {
        json!({"path": path, "pathType": kind, "backend": {"service": {"name": service, "port": {"number": 80}}}})
    }

    fn rule(host: Option<&str>, paths: Vec<Value>) -> Value {
        let mut r = json!({"http": {"paths": paths}});
        if let Some(h) = host {
            r["host"] = json!(h);
        }
        r
    }

    fn build(ingresses: &[Ingress], services: &[Service], slices: &[EndpointSlice]) -> RouteTable {
        let mut inputs = Inputs { ingresses: ingresses.iter().collect(), ..Default::default() };
        services.iter().for_each(|s| inputs.add_service(s));
        slices.iter().for_each(|s| inputs.add_slice(s));
        RouteTable::build(&inputs)
    }

    fn to(table: &RouteTable, host: &str, path: &str) -> Option<String> {
        table.route(host, path).map(|r| r.backend.name.clone())
    }

    #[test]
    fn hosts_paths_and_wildcards_resolve_as_ingress_nginx() {
        let services = ["web", "api", "static", "wild", "fallback"].map(service);
        let i = ingress(
            "shop",
            1,
            json!({"defaultBackend": {"service": {"name": "fallback", "port": {"name": "http"}}}, "rules": [
                rule(Some("shop.example"), vec![path("/", "Prefix", "web"), path("/api", "Prefix", "api"),
                                                 path("/api/v1/exact", "Exact", "static")]),
                rule(Some("*.shop.example"), vec![path("/", "ImplementationSpecific", "wild")]),
                rule(None, vec![path("/static", "Prefix", "static")]),
            ]}),
        );
        let table = build(&[i], &services, &[slice("web", &[("10.244.1.5", true), ("10.244.2.5", false)])]);
        assert!(table.problems.is_empty(), "{:?}", table.problems);
        assert_eq!(to(&table, "shop.example", "/"), Some("default/web:80".into()));
        assert_eq!(to(&table, "shop.example", "/api"), Some("default/api:80".into()));
        assert_eq!(to(&table, "shop.example", "/api/"), Some("default/api:80".into()));
        assert_eq!(to(&table, "shop.example", "/apix"), Some("default/web:80".into()), "element-wise prefix");
        assert_eq!(to(&table, "shop.example", "/api/v1/exact"), Some("default/static:80".into()));
        assert_eq!(to(&table, "shop.example", "/api/v1/exact/more"), Some("default/api:80".into()));
        assert_eq!(to(&table, "a.shop.example", "/x"), Some("default/wild:80".into()));
        assert_eq!(to(&table, "a.b.shop.example", "/static/x"), Some("default/static:80".into()), "one label only");
        assert_eq!(to(&table, "other.example", "/nothing"), Some("default/fallback:http".into()));
        let web = table.route("shop.example", "/").unwrap();
        assert_eq!(&*web.backend.endpoints, &["10.244.1.5:8080".parse().unwrap()], "only ready endpoints");
    }

    #[test]
    fn an_unnamed_service_port_reaches_the_slice_port_named_empty() {
        // As published: `ports: [{port: 80, targetPort: 8080}]`, and the EndpointSlice
        // controller's slice port `name: ""`.
        let web: Service = serde_json::from_value(json!({"metadata": {"name": "web", "namespace": "default"},
            "spec": {"ports": [{"port": 80, "targetPort": 8080}]}}))
        .unwrap();
        let mut unnamed = slice("web", &[("10.244.1.5", true)]);
        unnamed.ports = Some(vec![serde_json::from_value(json!({"name": "", "port": 8080})).unwrap()]);
        let i = ingress("shop", 1, json!({"rules": [rule(None, vec![path("/", "Prefix", "web")])]}));
        let table = build(&[i], &[web], &[unnamed.clone()]);
        let route = table.route("any", "/").unwrap();
        assert_eq!(&*route.backend.endpoints, &["10.244.1.5:8080".parse().unwrap()]);
        // A slice port whose name is absent is the same port.
        unnamed.ports = Some(vec![serde_json::from_value(json!({"port": 8080})).unwrap()]);
        let web: Service = serde_json::from_value(json!({"metadata": {"name": "web", "namespace": "default"},
            "spec": {"ports": [{"name": "", "port": 80, "targetPort": 8080}]}}))
        .unwrap();
        let i = ingress("shop", 1, json!({"rules": [rule(None, vec![path("/", "Prefix", "web")])]}));
        let table = build(&[i], &[web], &[unnamed]);
        assert_eq!(table.route("any", "/").unwrap().backend.endpoints.len(), 1);
    }

    #[test]
    fn the_index_finds_what_a_scan_in_match_order_finds() {
        let kinds = ["Prefix", "Exact", "ImplementationSpecific"];
        let texts = ["/", "/a", "/a/", "/a/b", "/a/b/", "/ab", "/a//b", "//", "/a/b/c", "/b"];
        let paths: Vec<Value> = texts
            .iter()
            .enumerate()
            .flat_map(|(i, t)| kinds.iter().take(1 + i % 3).map(|k| path(t, k, "web")))
            .collect();
        let table = build(&[ingress("i", 1, json!({"rules": [rule(Some("h"), paths)]}))], &[service("web")], &[]);
        let server = &table.hosts["h"];
        let requests =
            ["", "/", "/a", "/a/", "/a/b", "/a/b/", "/a/b/c", "/a/bc", "/ab", "/ab/", "/a//b", "//", "/x", "a"];
        for request in requests {
            let scanned = server.routes.iter().find(|r| r.path.matches(request)).map(|r| &r.path);
            assert_eq!(server.find(request).map(|r| &r.path), scanned, "request {request:?}");
        }
    }

    #[test]
    fn the_oldest_ingress_wins_a_conflict_and_the_other_is_told() {
        let services = ["old", "new"].map(service);
        let new = ingress(
            "b-new",
            20,
            json!({"rules": [rule(Some("shop.example"), vec![path("/", "Prefix", "new"),
                                                                                          path("/new", "Prefix", "new")])]}),
        );
        let old =
            ingress("z-old", 10, json!({"rules": [rule(Some("shop.example"), vec![path("/", "Prefix", "old")])]}));
        let table = build(&[new, old], &services, &[]);
        assert_eq!(to(&table, "shop.example", "/x"), Some("default/old:80".into()));
        assert_eq!(to(&table, "shop.example", "/new/x"), Some("default/new:80".into()));
        assert_eq!(table.problems.len(), 1);
        assert_eq!(table.problems[0].ingress.1, "b-new");
        assert_eq!(table.problems[0].reason, "Conflict");
        assert!(table.problems[0].message.contains("default/z-old"), "{}", table.problems[0].message);
    }

    #[test]
    fn a_missing_service_or_port_is_reported_and_answers_with_no_endpoints() {
        let i = ingress(
            "shop",
            1,
            json!({"rules": [rule(Some("shop.example"), vec![path("/gone", "Prefix", "gone"), path("/", "Prefix", "web")]),
                             rule(Some("port.example"), vec![json!({"path": "/", "pathType": "Prefix",
                                "backend": {"service": {"name": "web", "port": {"number": 81}}}})])]}),
        );
        let table = build(&[i], &[service("web")], &[]);
        let reasons: Vec<&str> = table.problems.iter().map(|p| p.reason).collect();
        assert_eq!(reasons, ["ServiceNotFound", "ServicePortNotFound"]);
        assert!(table.route("shop.example", "/gone").unwrap().backend.endpoints.is_empty());
        assert_eq!(to(&table, "shop.example", "/"), Some("default/web:80".into()));
    }

    #[test]
    fn classes_decide_which_ingresses_are_served() {
        let class = |name: &str, controller: &str, default: bool| -> IngressClass {
            serde_json::from_value(json!({"metadata": {"name": name,
                "annotations": {DEFAULT_CLASS: default.to_string()}}, "spec": {"controller": controller}}))
            .unwrap()
        };
        let named = |class: Option<&str>| ingress("i", 1, json!({"ingressClassName": class, "rules": []}));
        let ours = class("gitplane", CONTROLLER, false);
        let nginx = class("nginx", "k8s.io/ingress-nginx", true);
        assert!(is_ours(&named(Some("gitplane")), [&ours, &nginx]));
        assert!(!is_ours(&named(Some("nginx")), [&ours, &nginx]));
        assert!(!is_ours(&named(Some("missing")), [&ours]));
        assert!(is_ours(&named(None), [&ours]), "no default class: served");
        assert!(!is_ours(&named(None), [&ours, &nginx]), "another controller's default");
    }

    #[test]
    fn tls_hosts_pick_a_secret_by_server_name() {
        let i = ingress(
            "shop",
            1,
            json!({"tls": [{"hosts": ["shop.example", "*.shop.example"], "secretName": "shop-tls"}],
                                          "rules": [rule(Some("shop.example"), vec![path("/", "Prefix", "web")])]}),
        );
        let later = ingress(
            "other",
            2,
            json!({"tls": [{"hosts": ["shop.example"], "secretName": "other-tls"}],
                                               "rules": [rule(Some("x.example"), vec![path("/", "Prefix", "web")])]}),
        );
        let table = build(&[i, later], &[service("web")], &[]);
        let secret = |name: &str| table.tls_for(name).map(|t| t.secret.1.clone());
        assert_eq!(secret("shop.example"), Some("shop-tls".into()));
        assert_eq!(secret("a.shop.example"), Some("shop-tls".into()));
        assert_eq!(secret("other.example"), None);
        assert_eq!(table.problems.len(), 1, "{:?}", table.problems);
        assert_eq!(table.tls_secrets().len(), 1);
    }
}
