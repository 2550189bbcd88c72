//! podCIDR allocation, as kube-controller-manager's range allocator: each new node gets the next
//! free range of the cluster Pod range (`--cluster-cidr`, `--node-cidr-mask-size`), round-robin,
//! and no two nodes ever get the same one.
//!
//! Each allocated range is one small record, a ConfigMap named after the range
//! ([`gitplane_api::network::range_object_name`]), created in the same transaction as its Node:
//! the create fails if the range is taken, so two registrations through any replicas never get
//! the same range, and a registration costs the same at 5,000 nodes as at 5. Which ranges are free
//! is a bitmap in memory, only a hint: built from the store at the first registration, marked at
//! each allocation, and built again when the round reaches the end of the range. That is when the
//! ranges the node IPAM controller released (their Node deleted) are seen free again here.

use gitplane_api::network::{
    PodRanges, RANGE_LABEL, RANGE_NAMESPACE, RANGE_NODE_KEY, range_object_name, range_of_object,
};
use gitplane_api::object::{kind_of, to_value};
use gitplane_store::{Api, ListOptions, Op, Store, StoreError};
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::{net::Ipv4Addr, sync::Arc};

/// Which node ranges are taken, and where the round goes on.
#[derive(Debug)]
struct Bitmap {
    used: Vec<u64>,
    count: u32,
    next: u32,
}

impl Bitmap {
    fn new(count: u32) -> Bitmap {
        Bitmap { used: vec![0; count.div_ceil(64) as usize], count, next: 0 }
    }

    fn is_used(&self, index: u32) -> bool {
        self.used[(index / 64) as usize] & (1 << (index % 64)) != 0
    }

    fn mark(&mut self, index: u32) {
        self.used[(index / 64) as usize] |= 1 << (index % 64);
    }

    fn clear(&mut self, index: u32) {
        self.used[(index / 64) as usize] &= !(1 << (index % 64));
    }

    /// The first free range from where the round is, marked; `None` at the end of the round.
    fn take_next(&mut self) -> Option<u32> {
        while self.next < self.count {
            let word = self.used[(self.next / 64) as usize] | ((1u64 << (self.next % 64)) - 1);
            if word == u64::MAX {
                self.next = (self.next / 64 + 1) * 64;
                continue;
            }
            let index = (self.next / 64) * 64 + word.trailing_ones();
            if index >= self.count {
                break;
            }
            self.mark(index);
            self.next = index + 1;
            return Some(index);
        }
        self.next = self.count;
        None
    }
}

/// Allocates the node ranges of one cluster Pod range.
pub struct Allocator {
    pub ranges: PodRanges,
    free: tokio::sync::Mutex<Option<Bitmap>>,
}

/// A range reserved for a node: the op that records it (to commit with the Node) and the range.
pub struct Reservation {
    pub record: Op,
    pub cidr: String,
    index: u32,
}

impl Allocator {
    pub fn new(ranges: PodRanges) -> Allocator {
        Allocator { ranges, free: tokio::sync::Mutex::new(None) }
    }

    /// The next free range for `node`. A racing registration elsewhere may take it first: the
    /// record's create then fails, and the caller asks again.
    pub async fn reserve(&self, store: &Arc<dyn Store>, node: &str) -> Result<Reservation, StoreError> {
        let mut free = self.free.lock().await;
        let taken = match free.as_mut().and_then(Bitmap::take_next) {
            Some(index) => Some(index),
            None => {
                // The first registration, or the end of a round: what the store says is taken.
                let bitmap = free.insert(self.load(store).await?);
                bitmap.take_next()
            }
        };
        let index = taken.ok_or_else(|| {
            StoreError::Unavailable(format!(
                "the cluster Pod range {} has no free /{} left for node {node}: start the control plane with a \
                 larger --cluster-cidr or a longer --node-cidr-mask-size",
                self.ranges, self.ranges.node_mask
            ))
        })?;
        let cidr = self.ranges.range(index);
        Ok(Reservation { record: Op::Create(to_value(&record(&cidr, node))), cidr, index })
    }

    /// The reservation was not committed, and not because another node holds the range.
    pub async fn unreserve(&self, reservation: &Reservation) {
        if let Some(bitmap) = self.free.lock().await.as_mut() {
            bitmap.clear(reservation.index);
        }
    }

    /// The taken ranges: the records, and the Nodes registered before records were kept (each
    /// gets its record now).
    async fn load(&self, store: &Arc<dyn Store>) -> Result<Bitmap, StoreError> {
        let mut bitmap = Bitmap::new(self.ranges.count());
        // The records first: every Node committed with its record, so a list of Nodes read
        // afterwards holds each record's Node.
        let options = ListOptions {
            namespace: Some(RANGE_NAMESPACE.into()),
            label_selector: Some(RANGE_LABEL.into()),
            ..Default::default()
        };
        let records = store.list(&kind_of::<ConfigMap>(), &options).await?;
        for name in records.items.iter().filter_map(|r| r["metadata"]["name"].as_str()) {
            if let Some(index) = range_of_object(name).and_then(|cidr| self.ranges.index_of(&cidr)) {
                bitmap.mark(index);
            }
        }
        let (nodes, _) = Api::<Node>::new(store.clone()).list(None).await?;
        for node in nodes {
            let (Some(name), Some(cidr)) = (node.metadata.name, node.spec.and_then(|s| s.pod_cidr)) else { continue };
            // A range outside the configured one (the flags changed) is the node's still, and
            // no other node can get it.
            let Some(index) = self.ranges.index_of(&cidr) else { continue };
            if !bitmap.is_used(index) {
                bitmap.mark(index);
                match store.txn(vec![Op::Create(to_value(&record(&cidr, &name)))]).await {
                    Err(e) if !e.is_already_exists() => return Err(e),
                    _ => {}
                }
            }
        }
        Ok(bitmap)
    }
}

/// The record of `cidr`, held by `node`.
fn record(cidr: &str, node: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(range_object_name(cidr)),
            namespace: Some(RANGE_NAMESPACE.into()),
            labels: Some([(RANGE_LABEL.to_owned(), "true".to_owned())].into()),
            ..Default::default()
        },
        data: Some([(RANGE_NODE_KEY.to_owned(), node.to_owned())].into()),
        ..Default::default()
    }
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
    use gitplane_storage::sqlite::SqliteStore;

    /// Ranges, taken beforehand, where the round is, what take_next gives in turn.
    type Case<'a> = (u32, &'a [u32], u32, &'a [Option<u32>]);

    #[test]
    fn rounds_through_the_bitmap() {
        let cases: [Case; 5] = [
            (4, &[], 0, &[Some(0), Some(1), Some(2), Some(3), None]),
            (4, &[1, 2], 0, &[Some(0), Some(3), None]),
            (130, &[], 127, &[Some(127), Some(128), Some(129), None]),
            (130, &(0..64).collect::<Vec<_>>(), 0, &[Some(64)]),
            (128, &[0, 127], 126, &[Some(126), None, None]),
        ];
        for (count, taken, next, want) in cases {
            let mut bitmap = Bitmap::new(count);
            taken.iter().for_each(|i| bitmap.mark(*i));
            bitmap.next = next;
            let got: Vec<_> = want.iter().map(|_| bitmap.take_next()).collect();
            assert_eq!(got, want, "{count} ranges, {taken:?} taken, from {next}");
        }
    }

    async fn store() -> Arc<dyn Store> {
        Arc::new(SqliteStore::memory().await.unwrap())
    }

    /// Commits `node`'s Node with its reservation, as registration does.
    async fn register(store: &Arc<dyn Store>, allocator: &Allocator, node: &str) -> Result<String, StoreError> {
        let r = allocator.reserve(store, node).await?;
        let spec = k8s_openapi::api::core::v1::NodeSpec { pod_cidr: Some(r.cidr.clone()), ..Default::default() };
        let object = Node {
            metadata: ObjectMeta { name: Some(node.into()), ..Default::default() },
            spec: Some(spec),
            ..Default::default()
        };
        match store.txn(vec![r.record.clone(), Op::Create(to_value(&object))]).await {
            Ok(_) => Ok(r.cidr),
            Err(e) => {
                if !e.is_already_exists() {
                    allocator.unreserve(&r).await;
                }
                Err(e)
            }
        }
    }

    async fn delete(store: &Arc<dyn Store>, node: &str, cidr: &str) {
        Api::<Node>::new(store.clone()).delete("", node, None).await.unwrap();
        Api::<ConfigMap>::new(store.clone()).delete(RANGE_NAMESPACE, &range_object_name(cidr), None).await.unwrap();
    }

    #[tokio::test]
    async fn allocates_round_robin_releases_and_rebuilds() {
        let ranges = PodRanges::new("10.244.0.0/24", 26).unwrap(); // 4 ranges
        let store = store().await;
        let one = Allocator::new(ranges);
        let mut got = Vec::new();
        for n in ["a", "b", "c", "d"] {
            got.push(register(&store, &one, n).await.unwrap());
        }
        assert_eq!(got, ["10.244.0.0/26", "10.244.0.64/26", "10.244.0.128/26", "10.244.0.192/26"]);
        // Exhausted: the error names the flags to change.
        let full = register(&store, &one, "e").await.unwrap_err().to_string();
        assert!(full.contains("no free /26 left for node e") && full.contains("--cluster-cidr"), "{full}");
        // Released (the Node deleted): free again once the round starts over.
        delete(&store, "b", "10.244.0.64/26").await;
        assert_eq!(register(&store, &one, "e").await.unwrap(), "10.244.0.64/26");
        // A control plane started again rebuilds from the store: the same ranges are taken.
        delete(&store, "c", "10.244.0.128/26").await;
        let again = Allocator::new(ranges);
        assert_eq!(register(&store, &again, "f").await.unwrap(), "10.244.0.128/26");
        assert!(register(&store, &again, "g").await.is_err());
    }

    #[tokio::test]
    async fn two_allocators_never_share_a_range() {
        // Two replicas' allocators over one store, each with a stale hint of the other's.
        let ranges = PodRanges::new("10.244.0.0/24", 27).unwrap(); // 8 ranges
        let store = store().await;
        let (one, two) = (Allocator::new(ranges), Allocator::new(ranges));
        let mut tasks = Vec::new();
        for i in 0..8 {
            let (store, allocators) = (store.clone(), [&one, &two]);
            let allocator = allocators[i % 2];
            tasks.push(async move {
                // Until it commits: the other allocator may take its range first.
                loop {
                    match register(&store, allocator, &format!("n{i}")).await {
                        Err(e) if e.is_already_exists() => continue,
                        other => return other,
                    }
                }
            });
        }
        let mut got: Vec<String> = futures::future::join_all(tasks).await.into_iter().map(Result::unwrap).collect();
        got.sort();
        got.dedup();
        assert_eq!(got.len(), 8, "{got:?}");
    }

    #[tokio::test]
    async fn nodes_without_records_keep_their_ranges() {
        // Nodes registered before the records: their ranges are theirs, and get a record.
        let store = store().await;
        let node = serde_json::json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "old"},
                                       "spec": {"podCIDR": "10.244.0.0/24"}});
        store.txn(vec![Op::Create(node)]).await.unwrap();
        let allocator = Allocator::new(PodRanges::default());
        assert_eq!(register(&store, &allocator, "new").await.unwrap(), "10.244.1.0/24");
        let kept = Api::<ConfigMap>::new(store.clone()).get(RANGE_NAMESPACE, "pod-cidr-10.244.0.0-24").await.unwrap();
        assert_eq!(kept.and_then(|c| c.data).unwrap()[RANGE_NODE_KEY], "old");
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
