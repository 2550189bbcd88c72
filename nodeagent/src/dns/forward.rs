//! Where names outside the cluster go: the node's resolvers, or per-domain servers from the
//! `kube-system/kube-dns` ConfigMap (kube-dns' format, which CoreDNS' migration also reads):
//!
//! ```yaml
//! data:
//!   stubDomains: '{"acme.local": ["10.0.0.53", "10.0.0.54:5353"]}'
//!   upstreamNameservers: '["192.0.2.1"]'
//! ```

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use hickory_proto::rr::Name;
use k8s_openapi::api::core::v1::ConfigMap;

use super::resolv::ResolvConf;

/// The ConfigMap's namespace and name.
pub const CONFIG_MAP_NAMESPACE: &str = "kube-system";
pub const CONFIG_MAP_NAME: &str = "kube-dns";
/// kube-dns takes at most three upstream nameservers, as a resolv.conf does.
const MAX_UPSTREAMS: usize = 3;

/// What is wrong with the ConfigMap; the previous forwarding stays in force.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigMapError {
    #[error("{CONFIG_MAP_NAMESPACE}/{CONFIG_MAP_NAME} data.{key}: {reason}")]
    Json { key: &'static str, reason: String },
    #[error("{CONFIG_MAP_NAMESPACE}/{CONFIG_MAP_NAME} data.stubDomains: {domain:?} is not a domain name: {reason}")]
    Domain { domain: String, reason: String },
    #[error(
        "{CONFIG_MAP_NAMESPACE}/{CONFIG_MAP_NAME} data.stubDomains: {domain:?} is inside the cluster domain {cluster_domain}, whose names this server answers itself"
    )]
    ClusterDomain { domain: String, cluster_domain: String },
    #[error("{CONFIG_MAP_NAMESPACE}/{CONFIG_MAP_NAME} data.stubDomains: {domain:?} lists no nameserver")]
    NoNameserver { domain: String },
    #[error(
        "{CONFIG_MAP_NAMESPACE}/{CONFIG_MAP_NAME} data.{key}: {value:?} is not an IP address with an optional port (10.0.0.53, 10.0.0.53:5353, [fd00::53]:53)"
    )]
    Nameserver { key: &'static str, value: String },
    #[error(
        "{CONFIG_MAP_NAMESPACE}/{CONFIG_MAP_NAME} data.upstreamNameservers: at most {MAX_UPSTREAMS} nameservers, found {0}"
    )]
    TooManyUpstreams(usize),
}

/// The forwarding table: the longest matching stub domain wins, else the upstreams.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Forwarding {
    upstreams: Arc<[SocketAddr]>,
    /// Lowercase FQDNs, the most specific first.
    stubs: Vec<(Name, Arc<[SocketAddr]>)>,
}

impl Forwarding {
    pub fn new(upstreams: Vec<SocketAddr>) -> Forwarding {
        Forwarding { upstreams: upstreams.into(), stubs: Vec::new() }
    }

    /// The node's resolvers, as the kubelet hands them to `dnsPolicy: Default` Pods.
    pub fn from_resolv_conf(host: &ResolvConf) -> Forwarding {
        Forwarding::new(host.upstreams())
    }

    /// The node's resolvers overridden by a kube-dns ConfigMap.
    pub fn from_config_map(
        host: &ResolvConf,
        config_map: &ConfigMap,
        cluster_domain: &Name,
    ) -> Result<Forwarding, ConfigMapError> {
        let data = config_map.data.as_ref();
        let field = |key: &str| data.and_then(|d| d.get(key)).map(String::as_str).filter(|v| !v.trim().is_empty());
        let mut upstreams = Vec::new();
        if let Some(json) = field("upstreamNameservers") {
            let list: Vec<String> = serde_json::from_str(json)
                .map_err(|e| ConfigMapError::Json { key: "upstreamNameservers", reason: e.to_string() })?;
            if list.len() > MAX_UPSTREAMS {
                return Err(ConfigMapError::TooManyUpstreams(list.len()));
            }
            upstreams = list.iter().map(|s| nameserver("upstreamNameservers", s)).collect::<Result<_, _>>()?;
        }
        // Absent or empty: the node's resolvers, as kube-dns does.
        if upstreams.is_empty() {
            upstreams = host.upstreams();
        }
        let mut stubs = Vec::new();
        if let Some(json) = field("stubDomains") {
            let map: BTreeMap<String, Vec<String>> = serde_json::from_str(json)
                .map_err(|e| ConfigMapError::Json { key: "stubDomains", reason: e.to_string() })?;
            for (domain, servers) in map {
                let zone = stub_domain(&domain)?;
                if cluster_domain.zone_of(&zone) {
                    return Err(ConfigMapError::ClusterDomain { domain, cluster_domain: cluster_domain.to_ascii() });
                }
                if servers.is_empty() {
                    return Err(ConfigMapError::NoNameserver { domain });
                }
                let servers: Vec<SocketAddr> =
                    servers.iter().map(|s| nameserver("stubDomains", s)).collect::<Result<_, _>>()?;
                stubs.push((zone, servers.into()));
            }
        }
        stubs.sort_by_key(|(zone, _)| std::cmp::Reverse(zone.num_labels()));
        Ok(Forwarding { upstreams: upstreams.into(), stubs })
    }

    /// The servers to ask about `name` (empty: nowhere to forward).
    pub fn upstreams_for(&self, name: &Name) -> Arc<[SocketAddr]> {
        let stub = self.stubs.iter().find(|(zone, _)| zone.zone_of(name));
        stub.map_or(&self.upstreams, |(_, servers)| servers).clone()
    }
}

fn stub_domain(domain: &str) -> Result<Name, ConfigMapError> {
    let invalid = |reason: &str| ConfigMapError::Domain { domain: domain.to_string(), reason: reason.to_string() };
    let trimmed = domain.trim_end_matches('.');
    if trimmed.is_empty() {
        return Err(invalid("empty (forward everything with upstreamNameservers instead)"));
    }
    let label_ok =
        |l: &str| (1..=63).contains(&l.len()) && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if trimmed.len() > 253 || !trimmed.split('.').all(label_ok) {
        return Err(invalid("labels of 1-63 letters, digits, '-' or '_', at most 253 characters"));
    }
    Name::from_ascii(format!("{trimmed}.")).map(|n| n.to_lowercase()).map_err(|e| invalid(&e.to_string()))
}

fn nameserver(key: &'static str, value: &str) -> Result<SocketAddr, ConfigMapError> {
    let value = value.trim();
    value
        .parse::<SocketAddr>()
        .or_else(|_| value.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, 53)))
        .map_err(|_| ConfigMapError::Nameserver { key, value: value.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_map(pairs: &[(&str, &str)]) -> ConfigMap {
        ConfigMap {
            data: Some(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
            ..Default::default()
        }
    }

    fn cluster() -> Name {
        Name::from_ascii("cluster.local.").unwrap()
    }

    fn host() -> ResolvConf {
        ResolvConf::parse("nameserver 192.0.2.1\nnameserver 192.0.2.2\n")
    }

    fn addrs(list: &[&str]) -> Arc<[SocketAddr]> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    fn name(s: &str) -> Name {
        Name::from_ascii(s).unwrap()
    }

    #[test]
    fn t10_stub_domains_and_upstreams() {
        let cm = config_map(&[
            ("stubDomains", r#"{"acme.local": ["10.0.0.53", "10.0.0.54:5353"], "eu.acme.local.": ["[fd00::53]:53"]}"#),
            ("upstreamNameservers", r#"["192.0.2.9"]"#),
        ]);
        let fwd = Forwarding::from_config_map(&host(), &cm, &cluster()).unwrap();
        assert_eq!(fwd.upstreams_for(&name("www.acme.local.")), addrs(&["10.0.0.53:53", "10.0.0.54:5353"]));
        assert_eq!(fwd.upstreams_for(&name("ACME.local.")), addrs(&["10.0.0.53:53", "10.0.0.54:5353"]));
        assert_eq!(fwd.upstreams_for(&name("db.EU.acme.local.")), addrs(&["[fd00::53]:53"]));
        assert_eq!(fwd.upstreams_for(&name("example.com.")), addrs(&["192.0.2.9:53"]));
        assert_eq!(fwd.upstreams_for(&name("notacme.local.")), addrs(&["192.0.2.9:53"]));
    }

    #[test]
    fn t10_without_config_map_the_node_resolvers() {
        let fwd = Forwarding::from_config_map(&host(), &ConfigMap::default(), &cluster()).unwrap();
        assert_eq!(fwd, Forwarding::from_resolv_conf(&host()));
        assert_eq!(fwd.upstreams_for(&name("example.com.")), addrs(&["192.0.2.1:53", "192.0.2.2:53"]));
        for upstreams in ["", "[]"] {
            let blank = config_map(&[("stubDomains", " "), ("upstreamNameservers", upstreams)]);
            assert_eq!(Forwarding::from_config_map(&host(), &blank, &cluster()).unwrap(), fwd);
        }
    }

    #[test]
    fn t10_bad_config_maps_say_what_is_wrong() {
        let err = |pairs: &[(&str, &str)]| {
            Forwarding::from_config_map(&host(), &config_map(pairs), &cluster()).unwrap_err().to_string()
        };
        let cases = [
            (
                ("stubDomains", r#"{"acme.local": "10.0.0.53"}"#),
                "kube-system/kube-dns data.stubDomains: invalid type: string \"10.0.0.53\", expected a sequence at line 1 column 26",
            ),
            (
                ("stubDomains", r#"{"acme.local": ["#),
                "kube-system/kube-dns data.stubDomains: EOF while parsing a list at line 1 column 16",
            ),
            (
                ("stubDomains", r#"{"acme.local": ["dns.acme"]}"#),
                "kube-system/kube-dns data.stubDomains: \"dns.acme\" is not an IP address with an optional port (10.0.0.53, 10.0.0.53:5353, [fd00::53]:53)",
            ),
            (
                ("stubDomains", r#"{"acme.local": []}"#),
                "kube-system/kube-dns data.stubDomains: \"acme.local\" lists no nameserver",
            ),
            (
                ("stubDomains", r#"{"a b": ["10.0.0.1"]}"#),
                "kube-system/kube-dns data.stubDomains: \"a b\" is not a domain name: labels of 1-63 letters, digits, '-' or '_', at most 253 characters",
            ),
            (
                ("stubDomains", r#"{".": ["10.0.0.1"]}"#),
                "kube-system/kube-dns data.stubDomains: \".\" is not a domain name: empty (forward everything with upstreamNameservers instead)",
            ),
            (
                ("stubDomains", r#"{"svc.Cluster.local": ["10.0.0.1"]}"#),
                "kube-system/kube-dns data.stubDomains: \"svc.Cluster.local\" is inside the cluster domain cluster.local., whose names this server answers itself",
            ),
            (
                ("upstreamNameservers", r#"["1.1.1.1", "1.0.0.1", "8.8.8.8", "8.8.4.4"]"#),
                "kube-system/kube-dns data.upstreamNameservers: at most 3 nameservers, found 4",
            ),
            (
                ("upstreamNameservers", r#"["1.1.1.1:99999"]"#),
                "kube-system/kube-dns data.upstreamNameservers: \"1.1.1.1:99999\" is not an IP address with an optional port (10.0.0.53, 10.0.0.53:5353, [fd00::53]:53)",
            ),
            (
                ("upstreamNameservers", "{}"),
                "kube-system/kube-dns data.upstreamNameservers: invalid type: map, expected a sequence at line 1 column 0",
            ),
        ];
        for ((key, value), want) in cases {
            assert_eq!(err(&[(key, value)]), want, "{key}: {value}");
        }
    }
}
