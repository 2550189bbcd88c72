//! The masquerade of Pod traffic that leaves the cluster: one nftables table of the agent's own
//! (`ip gitplane-nat`, rendered from `templates/nft-masquerade.nft.j2`), in place of the bridge
//! plugin's `ipMasq`, which would masquerade traffic to other nodes' Pods too.

use crate::network::{
    cidr::Ipv4Cidr,
    netfilter::{self, CommandError},
};
use minijinja::context;

/// The agent's nftables table (the Service proxy has its own).
pub const TABLE: &str = "gitplane-nat";
const TEMPLATE: &str = include_str!("../../../../templates/nft-masquerade.nft.j2");

#[derive(Debug, thiserror::Error)]
pub enum MasqueradeError {
    #[error("running nft (is the nftables package installed? apt-get install nftables): {0}")]
    Spawn(#[source] std::io::Error),
    #[error("nft -f refused the {TABLE} table ({status}): {stderr}")]
    Refused { status: String, stderr: String },
}

impl From<CommandError> for MasqueradeError {
    fn from(error: CommandError) -> Self {
        match error {
            CommandError::Spawn { source, .. } => MasqueradeError::Spawn(source),
            CommandError::Command { status, stderr, .. } => {
                MasqueradeError::Refused { status, stderr: stderr.trim_start().to_owned() }
            }
        }
    }
}

/// The ranges the masquerade is made of.
#[derive(Clone, Copy, Debug)]
pub struct Ranges {
    /// This node's podCIDR.
    pub pod_cidr: Ipv4Cidr,
    pub cluster_cidr: Ipv4Cidr,
    pub service_cidr: Ipv4Cidr,
}

/// The rule set: Pods of this node going anywhere but the cluster's Pod and Service ranges leave
/// with the node's address.
pub fn render(cfg: &Ranges) -> String {
    let ctx = context! {
        table => TABLE,
        pod_cidr => cfg.pod_cidr.to_string(),
        cluster_cidr => cfg.cluster_cidr.to_string(),
        service_cidr => cfg.service_cidr.to_string(),
    };
    // The template is embedded and every variable is given: failure is a bug, not input.
    crate::template::render("nft-masquerade.nft.j2", TEMPLATE, ctx).expect("embedded masquerade template renders")
}

/// Replaces the table with [`render`]'s, in one nftables transaction.
pub async fn apply(cfg: &Ranges) -> Result<(), MasqueradeError> {
    nft(render(cfg)).await
}

/// Removes the table (nothing when it is not there).
pub async fn remove() -> Result<(), MasqueradeError> {
    nft(netfilter::table_removal(TABLE)).await
}

async fn nft(rules: String) -> Result<(), MasqueradeError> {
    let applied = tokio::task::spawn_blocking(move || netfilter::nft(&rules)).await;
    Ok(applied.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_traffic_leaving_the_cluster_ranges_is_masqueraded() {
        let cfg = Ranges {
            pod_cidr: "10.244.3.0/24".parse().unwrap(),
            cluster_cidr: "10.244.0.0/16".parse().unwrap(),
            service_cidr: "10.96.0.0/12".parse().unwrap(),
        };
        let text = render(&cfg);
        let rules: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).map(str::trim).collect();
        assert_eq!(
            rules,
            [
                "add table ip gitplane-nat",
                "delete table ip gitplane-nat",
                "table ip gitplane-nat {",
                "chain postrouting {",
                "type nat hook postrouting priority srcnat; policy accept;",
                "ip saddr 10.244.3.0/24 ip daddr != 10.244.0.0/16 ip daddr != 10.96.0.0/12 masquerade",
                "}",
                "}",
            ]
        );
    }
}
