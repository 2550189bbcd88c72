//! etcd's v3 API, the subset in `proto/etcd.proto`: clients for puts, member status and watches.

#![allow(clippy::all, missing_docs)]

pub mod pb {
    tonic::include_proto!("etcdserverpb");
}

use anyhow::Result;
use std::{net::SocketAddr, time::Duration};

pub async fn channel(addr: SocketAddr) -> Result<tonic::transport::Channel> {
    Ok(tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
        .connect_timeout(Duration::from_secs(2))
        .tcp_nodelay(true)
        .connect()
        .await?)
}

/// One member's Maintenance.Status.
pub async fn status(addr: SocketAddr) -> Result<pb::StatusResponse> {
    let mut client = pb::maintenance_client::MaintenanceClient::new(channel(addr).await?);
    let mut request = tonic::Request::new(pb::StatusRequest {});
    request.set_timeout(Duration::from_secs(2));
    Ok(client.status(request).await?.into_inner())
}
