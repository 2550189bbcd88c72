//! The `kube-system/kube-dns` ConfigMap: where cluster DNS forwards names outside the cluster
//! (kube-dns' format, which CoreDNS' migration also reads). The one parser of it: the node agent
//! applies what it returns, and the push verdict and `gitplane validate` refuse what it refuses.
//!
//! ```yaml
//! data:
//!   stubDomains: '{"acme.local": ["10.0.0.53", "10.0.0.54:5353"]}'
//!   upstreamNameservers: '["192.0.2.1"]'
//! ```

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};

/// The ConfigMap's namespace and name.
pub const NAMESPACE: &str = "kube-system";
pub const NAME: &str = "kube-dns";
/// The cluster domain every node agent serves unless told otherwise (`--cluster-domain`).
pub const DEFAULT_CLUSTER_DOMAIN: &str = "cluster.local";
/// kube-dns takes at most three upstream nameservers, as a resolv.conf does.
const MAX_UPSTREAMS: usize = 3;

/// What is wrong with the ConfigMap; a node keeps the forwarding in force.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigMapError {
    #[error("{NAMESPACE}/{NAME} data.{key}: {reason}")]
    Json { key: &'static str, reason: String },
    #[error("{NAMESPACE}/{NAME} data.stubDomains: {domain:?} is not a domain name: {reason}")]
    Domain { domain: String, reason: String },
    #[error(
        "{NAMESPACE}/{NAME} data.stubDomains: {domain:?} is inside the cluster domain {cluster_domain}., whose names cluster DNS answers itself"
    )]
    ClusterDomain { domain: String, cluster_domain: String },
    #[error("{NAMESPACE}/{NAME} data.stubDomains: {domain:?} lists no nameserver")]
    NoNameserver { domain: String },
    #[error(
        "{NAMESPACE}/{NAME} data.{key}: {value:?} is not an IP address with an optional port (10.0.0.53, 10.0.0.53:5353, [fd00::53]:53)"
    )]
    Nameserver { key: &'static str, value: String },
    #[error("{NAMESPACE}/{NAME} data.upstreamNameservers: at most {MAX_UPSTREAMS} nameservers, found {0}")]
    TooManyUpstreams(usize),
}

impl ConfigMapError {
    /// The `data` key the error is about.
    pub fn key(&self) -> &'static str {
        match self {
            ConfigMapError::Json { key, .. } | ConfigMapError::Nameserver { key, .. } => key,
            ConfigMapError::Domain { .. }
            | ConfigMapError::ClusterDomain { .. }
            | ConfigMapError::NoNameserver { .. } => "stubDomains",
            ConfigMapError::TooManyUpstreams(_) => "upstreamNameservers",
        }
    }
}

/// What the ConfigMap says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Forwarding {
    /// Empty: the node's own resolvers, as kube-dns does when the key is absent or empty.
    pub upstreams: Vec<SocketAddr>,
    /// (domain, lowercase, without the final dot; its nameservers), in key order.
    pub stubs: Vec<(String, Vec<SocketAddr>)>,
}

/// Parses the ConfigMap's `data` for a cluster whose domain is `cluster_domain`.
pub fn parse(data: Option<&BTreeMap<String, String>>, cluster_domain: &str) -> Result<Forwarding, ConfigMapError> {
    let field = |key: &str| data.and_then(|d| d.get(key)).map(String::as_str).filter(|v| !v.trim().is_empty());
    let mut forwarding = Forwarding::default();
    if let Some(json) = field("upstreamNameservers") {
        let list: Vec<String> = serde_json::from_str(json)
            .map_err(|e| ConfigMapError::Json { key: "upstreamNameservers", reason: e.to_string() })?;
        if list.len() > MAX_UPSTREAMS {
            return Err(ConfigMapError::TooManyUpstreams(list.len()));
        }
        forwarding.upstreams = list.iter().map(|s| nameserver("upstreamNameservers", s)).collect::<Result<_, _>>()?;
    }
    if let Some(json) = field("stubDomains") {
        let map: BTreeMap<String, Vec<String>> = serde_json::from_str(json)
            .map_err(|e| ConfigMapError::Json { key: "stubDomains", reason: e.to_string() })?;
        let cluster = cluster_domain.trim_end_matches('.').to_ascii_lowercase();
        for (domain, servers) in map {
            let zone = stub_domain(&domain)?;
            if zone == cluster || zone.ends_with(&format!(".{cluster}")) {
                return Err(ConfigMapError::ClusterDomain { domain, cluster_domain: cluster });
            }
            if servers.is_empty() {
                return Err(ConfigMapError::NoNameserver { domain });
            }
            let servers = servers.iter().map(|s| nameserver("stubDomains", s)).collect::<Result<_, _>>()?;
            forwarding.stubs.push((zone, servers));
        }
    }
    Ok(forwarding)
}

fn stub_domain(domain: &str) -> Result<String, ConfigMapError> {
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
    Ok(trimmed.to_ascii_lowercase())
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

    fn parse_pairs(pairs: &[(&str, &str)]) -> Result<Forwarding, ConfigMapError> {
        let data: BTreeMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        parse(Some(&data), DEFAULT_CLUSTER_DOMAIN)
    }

    #[test]
    fn stub_domains_and_upstreams() {
        let parsed = parse_pairs(&[
            ("stubDomains", r#"{"Acme.local": ["10.0.0.53", "10.0.0.54:5353"], "eu.acme.local.": ["[fd00::53]:53"]}"#),
            ("upstreamNameservers", r#"["192.0.2.9"]"#),
        ])
        .unwrap();
        let addrs = |list: &[&str]| list.iter().map(|s| s.parse().unwrap()).collect::<Vec<SocketAddr>>();
        assert_eq!(parsed.upstreams, addrs(&["192.0.2.9:53"]));
        assert_eq!(
            parsed.stubs,
            vec![
                ("acme.local".to_owned(), addrs(&["10.0.0.53:53", "10.0.0.54:5353"])),
                ("eu.acme.local".to_owned(), addrs(&["[fd00::53]:53"])),
            ]
        );
        for blank in ["", "[]"] {
            assert_eq!(parse_pairs(&[("stubDomains", " "), ("upstreamNameservers", blank)]), Ok(Forwarding::default()));
        }
        assert_eq!(parse(None, DEFAULT_CLUSTER_DOMAIN), Ok(Forwarding::default()));
    }

    #[test]
    fn bad_config_maps_say_what_is_wrong_and_which_key() {
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
                "kube-system/kube-dns data.stubDomains: \"svc.Cluster.local\" is inside the cluster domain cluster.local., whose names cluster DNS answers itself",
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
            let error = parse_pairs(&[(key, value)]).unwrap_err();
            assert_eq!(error.to_string(), want, "{key}: {value}");
            assert_eq!(error.key(), key);
        }
        // Not inside the cluster domain: a name that only ends with its text.
        assert!(parse_pairs(&[("stubDomains", r#"{"notcluster.local": ["10.0.0.1"]}"#)]).is_ok());
    }
}
