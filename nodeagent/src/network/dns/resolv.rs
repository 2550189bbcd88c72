//! resolv.conf: the node's (parsed as the kubelet does) and each Pod's (computed as the
//! kubelet's `GetPodDNS` does, for CRI's sandbox `DNSConfig`).

use std::net::{IpAddr, SocketAddr};

use k8s_openapi::api::core::v1::{Pod, PodDNSConfig};

/// glibc reads three nameservers; the kubelet drops the rest.
pub const MAX_NAMESERVERS: usize = 3;
/// The kubelet's search line limits since Kubernetes 1.28 (ExpandedDNSConfig; before: 6
/// domains, 256 characters).
pub const MAX_SEARCH_PATHS: usize = 32;
pub const MAX_SEARCH_CHARS: usize = 2048;
/// A search domain longer than a DNS name makes some glibc versions abort.
const MAX_SEARCH_DOMAIN: usize = 253;
/// Beyond this a resolv.conf is not read at all (the kubelet's limit too).
pub const MAX_RESOLV_CONF_BYTES: u64 = 10 << 20;

/// The parts of a resolv.conf that Pods and forwarding use.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ResolvConf {
    pub nameservers: Vec<String>,
    pub searches: Vec<String>,
    pub options: Vec<String>,
}

/// What goes into a Pod's resolv.conf (CRI `DNSConfig`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodDns {
    pub servers: Vec<String>,
    pub searches: Vec<String>,
    pub options: Vec<String>,
}

impl ResolvConf {
    /// Parses like the kubelet: comments and unknown keywords skipped, the last `search`
    /// line wins (trailing dots dropped, "." ignored), options merged by name.
    pub fn parse(text: &str) -> ResolvConf {
        let mut conf = ResolvConf::default();
        for line in text.lines() {
            let line = line.trim();
            if line.starts_with(['#', ';']) {
                continue;
            }
            let mut fields = line.split_whitespace();
            match fields.next() {
                Some("nameserver") => conf.nameservers.extend(fields.next().map(str::to_string)),
                Some("search") => {
                    conf.searches = fields.filter(|s| *s != ".").map(|s| s.trim_end_matches('.').to_string()).collect();
                }
                Some("options") => merge_options(&mut conf.options, fields.map(str::to_string)),
                _ => {}
            }
        }
        conf
    }

    /// Reads a node's resolv.conf (refusing absurd sizes).
    pub fn read(path: &std::path::Path) -> std::io::Result<ResolvConf> {
        use std::io::Read as _;
        let mut text = String::new();
        std::fs::File::open(path)?.take(MAX_RESOLV_CONF_BYTES).read_to_string(&mut text)?;
        Ok(ResolvConf::parse(&text))
    }

    /// The nameservers as addresses to forward to (port 53); unparsable entries are skipped.
    pub fn upstreams(&self) -> Vec<SocketAddr> {
        self.nameservers
            .iter()
            .filter_map(|s| s.split('%').next()?.parse::<IpAddr>().ok())
            .map(|ip| SocketAddr::new(ip, 53))
            .take(MAX_NAMESERVERS)
            .collect()
    }
}

/// The DNS settings of a Pod's sandbox, as the kubelet computes them from `dnsPolicy`,
/// `dnsConfig`, the cluster DNS servers and domain, and the node's resolv.conf.
///
/// `None` when the Pod takes the node's settings but they are unknown: the runtime then
/// copies the node's file itself (and `dnsConfig` is not merged).
pub fn pod_dns(pod: &Pod, cluster_dns: &[String], cluster_domain: &str, host: Option<&ResolvConf>) -> Option<PodDns> {
    let spec = pod.spec.as_ref();
    let custom = spec.and_then(|s| s.dns_config.as_ref());
    let host_network = spec.and_then(|s| s.host_network) == Some(true);
    // An unknown policy is ClusterFirst, as in the kubelet (validation refuses it anyway).
    let policy = spec.and_then(|s| s.dns_policy.as_deref()).unwrap_or("ClusterFirst");
    let cluster = match policy {
        "None" => None,
        "Default" => Some(false),
        "ClusterFirst" if host_network => Some(false),
        _ => Some(true),
    };
    let mut dns = match cluster {
        None => PodDns::default(),
        Some(true) if !cluster_dns.is_empty() => {
            let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
            let domain = cluster_domain.trim_end_matches('.');
            let mut searches = Vec::new();
            if !domain.is_empty() {
                searches = vec![format!("{ns}.svc.{domain}"), format!("svc.{domain}"), domain.to_string()];
            }
            searches.extend(host.map(|h| h.searches.clone()).unwrap_or_default());
            PodDns { servers: cluster_dns.to_vec(), searches: dedup(searches), options: vec!["ndots:5".into()] }
        }
        // Default, and ClusterFirst on a node without cluster DNS: the node's own settings.
        Some(_) => match host {
            Some(h) => {
                PodDns { servers: h.nameservers.clone(), searches: h.searches.clone(), options: h.options.clone() }
            }
            None => return None,
        },
    };
    if let Some(custom) = custom {
        append_dns_config(&mut dns, custom);
    }
    dns.servers.truncate(MAX_NAMESERVERS);
    dns.searches = fit_search_limits(dns.searches);
    Some(dns)
}

fn append_dns_config(dns: &mut PodDns, custom: &PodDNSConfig) {
    dns.servers.extend(custom.nameservers.iter().flatten().cloned());
    dns.servers = dedup(std::mem::take(&mut dns.servers));
    dns.searches.extend(custom.searches.iter().flatten().cloned());
    dns.searches = dedup(std::mem::take(&mut dns.searches));
    let options = custom.options.iter().flatten().filter_map(|o| {
        let name = o.name.as_deref().filter(|n| !n.is_empty())?;
        Some(match o.value.as_deref() {
            Some(v) if !v.is_empty() => format!("{name}:{v}"),
            _ => name.to_string(),
        })
    });
    merge_options(&mut dns.options, options);
}

/// Options by name, a later value replacing an earlier one in place (`ndots:5` then `ndots:2`
/// leaves `ndots:2`).
fn merge_options(options: &mut Vec<String>, new: impl IntoIterator<Item = String>) {
    let name = |o: &str| o.split(':').next().unwrap_or("").to_string();
    for option in new {
        match options.iter_mut().find(|o| name(o) == name(&option)) {
            Some(existing) => *existing = option,
            None => options.push(option),
        }
    }
}

fn dedup(list: Vec<String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(list.len());
    for item in list {
        if !out.contains(&item) {
            out.push(item);
        }
    }
    out
}

/// The kubelet's `formDNSSearchFitsLimits`: at most `MAX_SEARCH_PATHS` domains, none longer
/// than a DNS name, and the line within `MAX_SEARCH_CHARS` by dropping domains from the end.
fn fit_search_limits(mut searches: Vec<String>) -> Vec<String> {
    searches.truncate(MAX_SEARCH_PATHS);
    searches.retain(|s| s.len() <= MAX_SEARCH_DOMAIN);
    while searches.iter().map(|s| s.len() + 1).sum::<usize>().saturating_sub(1) > MAX_SEARCH_CHARS {
        searches.pop();
    }
    searches
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOST: &str = "# generated\nnameserver 192.0.2.1\nnameserver fe80::1%eth0\n; old\nsearch corp.example. lab.example .\noptions timeout:2 attempts:3\noptions timeout:1\nsortlist 10.0.0.0\n";

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    fn host() -> ResolvConf {
        ResolvConf::parse(HOST)
    }

    fn dns(p: &Pod, host: Option<&ResolvConf>) -> Option<PodDns> {
        pod_dns(p, &["10.96.0.10".to_string()], "cluster.local", host)
    }

    fn strings(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn t10_parses_the_node_resolv_conf_as_the_kubelet() {
        let conf = host();
        assert_eq!(conf.nameservers, strings(&["192.0.2.1", "fe80::1%eth0"]));
        assert_eq!(conf.searches, strings(&["corp.example", "lab.example"]));
        assert_eq!(conf.options, strings(&["timeout:1", "attempts:3"]));
        assert_eq!(conf.upstreams(), vec!["192.0.2.1:53".parse().unwrap(), "[fe80::1]:53".parse().unwrap()]);
        assert_eq!(
            ResolvConf::parse("search a\nsearch b c\nnameserver\n"),
            ResolvConf { searches: strings(&["b", "c"]), ..Default::default() }
        );
        assert_eq!(ResolvConf::parse("\0\u{ffff}garbage\nnameserver not-an-ip\n").upstreams(), Vec::new());
    }

    #[test]
    fn t10_cluster_first() {
        let p = pod(serde_json::json!({"metadata": {"name": "a", "namespace": "shop"}, "spec": {"containers": []}}));
        let want = PodDns {
            servers: strings(&["10.96.0.10"]),
            searches: strings(&[
                "shop.svc.cluster.local",
                "svc.cluster.local",
                "cluster.local",
                "corp.example",
                "lab.example",
            ]),
            options: strings(&["ndots:5"]),
        };
        assert_eq!(dns(&p, Some(&host())), Some(want.clone()));
        let no_host = PodDns { searches: want.searches[..3].to_vec(), ..want };
        assert_eq!(dns(&p, None), Some(no_host));
    }

    #[test]
    fn t10_policies() {
        let with = |spec: serde_json::Value| {
            let mut spec = spec;
            spec["containers"] = serde_json::json!([]);
            pod(serde_json::json!({"metadata": {"name": "a", "namespace": "ns"}, "spec": spec}))
        };
        let node = PodDns { servers: host().nameservers, searches: host().searches, options: host().options };
        // ClusterFirst on the host network is Default; ClusterFirstWithHostNet is not.
        let host_net = with(serde_json::json!({"hostNetwork": true}));
        assert_eq!(dns(&host_net, Some(&host())), Some(node.clone()));
        assert_eq!(dns(&host_net, None), None, "the runtime copies the node's file");
        let with_host_net = with(serde_json::json!({"hostNetwork": true, "dnsPolicy": "ClusterFirstWithHostNet"}));
        assert_eq!(dns(&with_host_net, Some(&host())).unwrap().servers, strings(&["10.96.0.10"]));
        assert_eq!(dns(&with(serde_json::json!({"dnsPolicy": "Default"})), Some(&host())), Some(node.clone()));
        // No cluster DNS on this node: ClusterFirst falls back to Default.
        let p = with(serde_json::json!({}));
        assert_eq!(pod_dns(&p, &[], "cluster.local", Some(&host())), Some(node));

        let none = with(serde_json::json!({
            "dnsPolicy": "None",
            "dnsConfig": {"nameservers": ["1.2.3.4"], "searches": ["x.example"], "options": [{"name": "ndots", "value": "2"}, {"name": "edns0"}]},
        }));
        let want = PodDns {
            servers: strings(&["1.2.3.4"]),
            searches: strings(&["x.example"]),
            options: strings(&["ndots:2", "edns0"]),
        };
        assert_eq!(dns(&none, Some(&host())), Some(want.clone()));
        assert_eq!(dns(&none, None), Some(want));
    }

    #[test]
    fn t10_dns_config_merges_into_cluster_first() {
        let p = pod(
            serde_json::json!({"metadata": {"name": "a", "namespace": "ns"}, "spec": {"containers": [], "dnsConfig": {
                "nameservers": ["10.96.0.10", "192.0.2.7", "192.0.2.8", "192.0.2.9"],
                "searches": ["ns.svc.cluster.local", "extra.example"],
                "options": [{"name": "ndots", "value": "2"}, {"name": "single-request-reopen"}],
            }}}),
        );
        let got = dns(&p, None).unwrap();
        assert_eq!(got.servers, strings(&["10.96.0.10", "192.0.2.7", "192.0.2.8"]), "duplicates merged, then three");
        assert_eq!(
            got.searches,
            strings(&["ns.svc.cluster.local", "svc.cluster.local", "cluster.local", "extra.example"])
        );
        assert_eq!(got.options, strings(&["ndots:2", "single-request-reopen"]));
    }

    #[test]
    fn t10_search_limits() {
        let many: Vec<String> = (0..40).map(|i| format!("d{i}.example")).collect();
        let conf = ResolvConf { searches: many, ..Default::default() };
        let p = pod(serde_json::json!({"metadata": {"name": "a", "namespace": "ns"}, "spec": {"containers": []}}));
        let got = dns(&p, Some(&conf)).unwrap().searches;
        assert_eq!(got.len(), MAX_SEARCH_PATHS);
        assert_eq!(got[3], "d0.example");

        let long: Vec<String> = (0..20).map(|i| format!("{}{i:02}.example", "x".repeat(100))).collect();
        let conf = ResolvConf { searches: long, ..Default::default() };
        let got = dns(&p, Some(&conf)).unwrap().searches;
        assert!(got.join(" ").len() <= MAX_SEARCH_CHARS);
        assert_eq!(got.len(), 3 + 17, "domains dropped from the end until the line fits");

        let too_long = ResolvConf { searches: vec!["a".repeat(254), "ok.example".into()], ..Default::default() };
        let got = dns(&p, Some(&too_long)).unwrap().searches;
        assert_eq!(got[3..], strings(&["ok.example"]));
    }
}
