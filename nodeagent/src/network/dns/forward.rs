//! Where names outside the cluster go: the node's resolvers, or per-domain servers from the
//! `kube-system/kube-dns` ConfigMap, as [`gitplane_api::kubedns`] parses it.

use std::net::SocketAddr;
use std::sync::Arc;

use gitplane_api::kubedns;
pub use gitplane_api::kubedns::ConfigMapError;
use hickory_proto::rr::Name;
use k8s_openapi::api::core::v1::ConfigMap;

use super::resolv::ResolvConf;

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
        let parsed = kubedns::parse(config_map.data.as_ref(), &cluster_domain.to_ascii())?;
        // Absent or empty: the node's resolvers, as kube-dns does.
        let upstreams = if parsed.upstreams.is_empty() { host.upstreams() } else { parsed.upstreams };
        let mut stubs = parsed
            .stubs
            .into_iter()
            .map(|(domain, servers)| {
                let zone = Name::from_ascii(format!("{domain}."))
                    .map_err(|e| ConfigMapError::Domain { domain: domain.clone(), reason: e.to_string() })?;
                Ok((zone, servers.into()))
            })
            .collect::<Result<Vec<_>, ConfigMapError>>()?;
        stubs.sort_by_key(|(zone, _): &(Name, Arc<[SocketAddr]>)| std::cmp::Reverse(zone.num_labels()));
        Ok(Forwarding { upstreams: upstreams.into(), stubs })
    }

    /// The servers to ask about `name` (empty: nowhere to forward).
    pub fn upstreams_for(&self, name: &Name) -> Arc<[SocketAddr]> {
        let stub = self.stubs.iter().find(|(zone, _)| zone.zone_of(name));
        stub.map_or(&self.upstreams, |(_, servers)| servers).clone()
    }
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
    fn t10_a_bad_config_map_is_refused_whole() {
        let cm = config_map(&[("stubDomains", r#"{"acme.local": "10.0.0.53"}"#)]);
        let error = Forwarding::from_config_map(&host(), &cm, &cluster()).unwrap_err();
        assert_eq!(error.key(), "stubDomains");
    }
}
