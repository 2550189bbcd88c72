//! podCIDR allocation: each node gets a /24 of the cluster's Pod range, and no two nodes ever get
//! the same one.
//!
//! The allocations live in one record, the ConfigMap `kube-system/gitplane-pod-cidrs` (node name
//! -> CIDR). A registration writes the record (compare-and-swap on its resourceVersion, or a
//! create) in the same transaction as the Node, so of two registrations that race, one commits
//! and the other retries on the new record. An entry whose Node no longer exists is free again.

use gitplane_api::object::to_value;
use gitplane_store::{Api, Op, StoreError};
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::{
    collections::{BTreeMap, HashSet},
    net::Ipv4Addr,
};

pub use gitplane_api::network::CLUSTER_CIDR;
pub const RECORD_NAMESPACE: &str = "kube-system";
pub const RECORD_NAME: &str = "gitplane-pod-cidrs";

/// The /24s of the cluster range, in order.
fn subnets() -> impl Iterator<Item = String> {
    let base = u32::from(CLUSTER_CIDR.0);
    (0..1u32 << (24 - CLUSTER_CIDR.1)).map(move |i| format!("{}/24", Ipv4Addr::from(base + (i << 8))))
}

/// The record after allocating a CIDR to `node`, and that CIDR; `None` when the range is full.
/// `live` are the names of the nodes that exist (read after the record).
pub fn allocate(
    record: &BTreeMap<String, String>,
    live: &HashSet<String>,
    node: &str,
) -> Option<(BTreeMap<String, String>, String)> {
    let mut kept: BTreeMap<String, String> = record
        .iter()
        .filter(|(n, _)| live.contains(*n) && n.as_str() != node)
        .map(|(n, c)| (n.clone(), c.clone()))
        .collect();
    let used: HashSet<&String> = kept.values().collect();
    let cidr = subnets().find(|c| !used.contains(c))?;
    kept.insert(node.to_owned(), cidr.clone());
    Some((kept, cidr))
}

/// Reads the record and the live nodes, and returns the op that writes the record with a CIDR
/// for `node` (to commit with the Node), and the CIDR.
pub async fn allocation(
    configmaps: &Api<ConfigMap>,
    nodes: &Api<Node>,
    node: &str,
) -> Result<(Op, String), StoreError> {
    // The record first: every node that holds an entry of it was committed with it, so a list
    // read afterwards includes it, and no live entry is taken for an orphan.
    let stored = configmaps.get(RECORD_NAMESPACE, RECORD_NAME).await?;
    let (all, _) = nodes.list(None).await?;
    let live: HashSet<String> = all.iter().filter_map(|n| n.metadata.name.clone()).collect();
    let current: BTreeMap<String, String> = stored.as_ref().and_then(|c| c.data.clone()).unwrap_or_default();
    let (data, cidr) = allocate(&current, &live, node)
        .ok_or_else(|| StoreError::Unavailable("the cluster Pod range has no free /24 left".into()))?;
    let record = ConfigMap {
        metadata: ObjectMeta {
            name: Some(RECORD_NAME.into()),
            namespace: Some(RECORD_NAMESPACE.into()),
            resource_version: stored.as_ref().and_then(|c| c.metadata.resource_version.clone()),
            ..Default::default()
        },
        data: Some(data),
        ..Default::default()
    };
    let op = if stored.is_some() { Op::Update(to_value(&record)) } else { Op::Create(to_value(&record)) };
    Ok((op, cidr))
}

/// Whether `ip` lies in the IPv4 `cidr`.
pub fn contains(cidr: &str, ip: &str) -> bool {
    let Some((base, bits)) = cidr.split_once('/') else { return false };
    let (Ok(base), Ok(bits), Ok(ip)) = (base.parse::<Ipv4Addr>(), bits.parse::<u32>(), ip.parse::<Ipv4Addr>()) else {
        return false;
    };
    let mask = if bits == 0 { 0 } else { u32::MAX.checked_shl(32 - bits.min(32)).unwrap_or(0) };
    bits <= 32 && u32::from(base) & mask == u32::from(ip) & mask
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> HashSet<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_first_free_24_and_orphans_freed() {
        let empty = BTreeMap::new();
        let (record, cidr) = allocate(&empty, &names(&[]), "a").unwrap();
        assert_eq!(cidr, "10.244.0.0/24");
        let (record, cidr) = allocate(&record, &names(&["a"]), "b").unwrap();
        assert_eq!(cidr, "10.244.1.0/24");
        // a is gone: its /24 is free again; b keeps its own.
        let (record, cidr) = allocate(&record, &names(&["b"]), "c").unwrap();
        assert_eq!((cidr.as_str(), record.len()), ("10.244.0.0/24", 2));
        // A node that registers again gets a fresh entry, never two.
        let (record, _) = allocate(&record, &names(&["b", "c"]), "c").unwrap();
        assert_eq!(record.len(), 2);
        let full: BTreeMap<String, String> = subnets().enumerate().map(|(i, c)| (format!("n{i}"), c)).collect();
        let live: HashSet<String> = full.keys().cloned().collect();
        assert!(allocate(&full, &live, "one-more").is_none());
    }

    #[test]
    fn cidr_membership() {
        assert!(contains("10.244.3.0/24", "10.244.3.7"));
        assert!(!contains("10.244.3.0/24", "10.244.4.7"));
        assert!(!contains("10.244.3.0/24", "not an ip"));
        assert!(!contains("10.244.3.0/40", "10.244.3.7"));
        assert!(contains("0.0.0.0/0", "1.2.3.4"));
    }
}
