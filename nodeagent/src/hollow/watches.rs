//! A hollow node's network and Pod config watches (kubemark's hollow proxy): opened, resumed and
//! read as an agent's are, so the control plane serves every node's three streams, but what
//! they carry is dropped: a hollow node programs no rules and mounts nothing.

use crate::controlplane::{Client, Follower};
use gitplane_proto::node::{ObjectEvent, WatchNetworkRequest, WatchPodConfigRequest};
use tonic::{Status, Streaming};

/// `WatchNetwork`, resumed from the last revision read.
pub struct Network;

impl Follower for Network {
    type Event = ObjectEvent;
    const WHAT: &'static str = "hollow node's network watch";

    async fn open(&self, mut client: Client, from: i64) -> Result<Streaming<ObjectEvent>, Status> {
        Ok(client.watch_network(WatchNetworkRequest { resource_version: from }).await?.into_inner())
    }

    fn started(&mut self, _: i64) {}

    async fn observe(&mut self, _: ObjectEvent) {}
}

/// `WatchPodConfig` of one node, which lists again whenever it is opened.
pub struct PodConfig {
    pub node_name: String,
}

impl Follower for PodConfig {
    type Event = ObjectEvent;
    const WHAT: &'static str = "hollow node's pod config watch";

    async fn open(&self, mut client: Client, _: i64) -> Result<Streaming<ObjectEvent>, Status> {
        let request = WatchPodConfigRequest { node_name: self.node_name.clone() };
        Ok(client.watch_pod_config(request).await?.into_inner())
    }

    fn started(&mut self, _: i64) {}

    async fn observe(&mut self, _: ObjectEvent) {}
}
