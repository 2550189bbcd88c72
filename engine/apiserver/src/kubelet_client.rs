//! How a replica calls a node's kubelet endpoint (kube-apiserver's kubelet client): HTTPS
//! (HTTP/1.1) to the node's InternalIP (loopback for a node registered without one: the
//! embedded appliance's own node) on the port its Node advertises
//! (`status.daemonEndpoints.kubeletEndpoint.Port`, 10250 when absent). The node's serving
//! certificate must come from the cluster CA, hold that address and name that node
//! (`system:node:<name>`); the replica presents its own certificate, which the endpoint requires
//! (kube-apiserver's `--kubelet-certificate-authority` and `--kubelet-client-certificate`).
//!
//! Under `gitplane up --nodes` the nodes live behind a bridge in a network namespace of their
//! own; connections to them are then made from that namespace (`netns`).

use gitplane_kubelet::{DEFAULT_PORT, streaming};
use hyper::{Request, Response, body::Incoming};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Node;
use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::PathBuf,
    time::Duration,
};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a node may take to start answering (the body may then stream for as long as it
/// follows).
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a node's kubelet endpoint could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum KubeletError {
    #[error("cannot reach node {node}'s agent at {addr}: {why}")]
    Unreachable { node: String, addr: SocketAddr, why: String },
}

/// Calls nodes' kubelet endpoints.
#[derive(Clone)]
pub struct KubeletClient {
    tls: tokio_rustls::TlsConnector,
    /// The network namespace to connect from (`gitplane up --nodes`); `None`: this process's.
    netns: Option<PathBuf>,
}

/// Where a Node's kubelet endpoint is.
pub fn kubelet_address(node: &Node) -> SocketAddr {
    let status = node.status.as_ref();
    let ip = status
        .and_then(|s| s.addresses.as_ref())
        .and_then(|a| a.iter().find(|a| a.type_ == "InternalIP"))
        .and_then(|a| a.address.parse::<IpAddr>().ok())
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
    let port = status
        .and_then(|s| s.daemon_endpoints.as_ref())
        .and_then(|d| d.kubelet_endpoint.as_ref())
        .and_then(|e| u16::try_from(e.port).ok())
        .filter(|p| *p != 0)
        .unwrap_or(DEFAULT_PORT);
    SocketAddr::new(ip, port)
}

impl KubeletClient {
    /// `tls`: the cluster CA as the only root, the replica's certificate as the client's (the
    /// node service's `ClusterCa::kubelet_client_config`).
    pub fn new(tls: std::sync::Arc<rustls::ClientConfig>, netns: Option<PathBuf>) -> Self {
        KubeletClient { tls: tokio_rustls::TlsConnector::from(tls), netns }
    }

    /// A client that trusts no node, for tests of what calls it.
    #[cfg(test)]
    pub fn for_tests() -> KubeletClient {
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        KubeletClient::new(std::sync::Arc::new(config), None)
    }

    async fn connect(&self, addr: SocketAddr) -> std::io::Result<tokio::net::TcpStream> {
        let socket = match &self.netns {
            None => tokio::net::TcpSocket::new_v4()?,
            Some(netns) => {
                // A socket keeps the namespace it was made in.
                let netns = netns.clone();
                let made = tokio::task::spawn_blocking(move || {
                    gitplane_kubelet::netns::in_netns(&netns, tokio::net::TcpSocket::new_v4)
                });
                made.await.map_err(std::io::Error::other)??
            }
        };
        tokio::time::timeout(CONNECT_TIMEOUT, socket.connect(addr))
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer within 5 s"))?
    }

    /// The upgrade request `method` `path_and_query` (with the upgrade headers of `headers`) on
    /// node `node`'s endpoint, for the client whose connection upgrades by `client`; on 101 the
    /// two are spliced, holding `hold` ([`streaming::proxy`]). The answer, whatever its status.
    pub async fn upgrade<H: Send + 'static>(
        &self,
        node: &Node,
        method: &hyper::Method,
        path_and_query: &str,
        headers: &hyper::HeaderMap,
        client: hyper::upgrade::OnUpgrade,
        hold: H,
    ) -> Result<Response<bytes::Bytes>, KubeletError> {
        let (stream, addr, unreachable) = self.connect_tls(node).await?;
        streaming::proxy(stream, client, method, headers, path_and_query, &addr.to_string(), None, hold)
            .await
            .map_err(unreachable)
    }

    /// A mutual-TLS connection to the node's kubelet endpoint whose serving certificate names
    /// that node, and the error maker for later failures on it.
    async fn connect_tls(
        &self,
        node: &Node,
    ) -> Result<
        (tokio_rustls::client::TlsStream<tokio::net::TcpStream>, SocketAddr, impl Fn(String) -> KubeletError + use<>),
        KubeletError,
    > {
        let name = node.metadata.name.clone().unwrap_or_default();
        let addr = kubelet_address(node);
        let unreachable = {
            let name = name.clone();
            move |why: String| KubeletError::Unreachable { node: name.clone(), addr, why }
        };
        let stream = self.connect(addr).await.map_err(|e| unreachable(e.to_string()))?;
        let server_name = rustls::pki_types::ServerName::IpAddress(addr.ip().into());
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, self.tls.connect(server_name, stream))
            .await
            .map_err(|_| unreachable("no TLS handshake within 5 s".into()))?
            .map_err(|e| unreachable(format!("TLS: {e}")))?;
        let serving = stream.get_ref().1.peer_certificates().and_then(|c| c.first());
        let subject = serving.and_then(|c| gitplane_proto::x509::subject(c)).unwrap_or_default();
        if subject.node() != Some(name.as_str()) {
            return Err(unreachable(format!(
                "its serving certificate is not node {name}'s (CN {:?})",
                subject.common_name.unwrap_or_default()
            )));
        }
        Ok((stream, addr, unreachable))
    }

    pub async fn get(&self, node: &Node, path_and_query: &str) -> Result<Response<Incoming>, KubeletError> {
        let (stream, addr, unreachable) = self.connect_tls(node).await?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| unreachable(e.to_string()))?;
        // Ends when the answer has been read or dropped (the reader went away).
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "kubelet endpoint connection ended");
            }
        });
        let request = Request::get(path_and_query)
            .header(hyper::header::HOST, addr.to_string())
            .body(http_body_util::Empty::<bytes::Bytes>::new())
            .map_err(|e| unreachable(e.to_string()))?;
        tokio::time::timeout(RESPONSE_TIMEOUT, sender.send_request(request))
            .await
            .map_err(|_| unreachable(format!("no answer within {} s", RESPONSE_TIMEOUT.as_secs())))?
            .map_err(|e| unreachable(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn finds_the_endpoint_in_the_node() {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "n1"},
            "status": {"addresses": [{"type": "Hostname", "address": "n1"}, {"type": "InternalIP", "address": "172.29.0.11"}],
                       "daemonEndpoints": {"kubeletEndpoint": {"Port": 10251}}}
        }))
        .unwrap();
        assert_eq!(kubelet_address(&node), "172.29.0.11:10251".parse().unwrap());
        let bare: Node = serde_json::from_value(json!({"metadata": {"name": "n1"}})).unwrap();
        assert_eq!(kubelet_address(&bare), "127.0.0.1:10250".parse().unwrap());
    }

    #[tokio::test]
    async fn an_unreachable_node_is_said_so() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "n1"}, "status": {"daemonEndpoints": {"kubeletEndpoint": {"Port": port}}}
        }))
        .unwrap();
        let client = KubeletClient::for_tests();
        let error = client.get(&node, "/containerLogs/a/b/c").await.unwrap_err().to_string();
        assert!(error.starts_with(&format!("cannot reach node n1's agent at 127.0.0.1:{port}")), "{error}");
    }
}
