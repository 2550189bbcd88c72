//! A CRI v1 client over containerd's unix socket. The generated wire types stay in this crate
//! (`pb`); the rest of the agent speaks Kubernetes objects through [`crate::runtime`].

use std::path::{Path, PathBuf};

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint};

/// The generated CRI v1 messages and clients (`runtime.v1`).
#[allow(clippy::all, missing_docs)]
pub mod pb {
    tonic::include_proto!("runtime.v1");
}

pub use pb::image_service_client::ImageServiceClient;
pub use pb::runtime_service_client::RuntimeServiceClient;

#[derive(Debug, thiserror::Error)]
pub enum CriError {
    #[error("connecting to the container runtime at {socket}: {source}")]
    Connect { socket: PathBuf, source: tonic::transport::Error },
    #[error("container runtime at {socket}: Version: {source}")]
    Version { socket: PathBuf, source: tonic::Status },
}

/// A connection to one container runtime. Cheap to clone: clones share one HTTP/2 channel.
#[derive(Clone, Debug)]
pub struct Cri {
    socket: PathBuf,
    channel: Channel,
}

impl Cri {
    /// Connects eagerly, so a missing or dead socket is an error here rather than on first use.
    pub async fn connect(socket: &Path) -> Result<Cri, CriError> {
        let path = socket.to_path_buf();
        // The URI is required by tonic but unused: every connection goes to the unix socket.
        let channel = Endpoint::from_static("http://[::]:50051")
            .connect_with_connector(tower::service_fn(move |_| {
                let path = path.clone();
                async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
            }))
            .await
            .map_err(|source| CriError::Connect { socket: socket.to_path_buf(), source })?;
        Ok(Cri { socket: socket.to_path_buf(), channel })
    }

    /// Connects and checks that the runtime answers CRI v1 `Version`.
    pub async fn connect_and_check(socket: &Path) -> Result<(Cri, pb::VersionResponse), CriError> {
        let cri = Cri::connect(socket).await?;
        let version = cri
            .runtime()
            .version(pb::VersionRequest { version: "v1".into() })
            .await
            .map_err(|source| CriError::Version { socket: socket.to_path_buf(), source })?
            .into_inner();
        Ok((cri, version))
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub fn runtime(&self) -> RuntimeServiceClient<tonic::transport::Channel> {
        RuntimeServiceClient::new(self.channel.clone())
    }

    pub fn images(&self) -> ImageServiceClient<tonic::transport::Channel> {
        ImageServiceClient::new(self.channel.clone())
    }

    /// CRI `ExecSync`: runs `cmd` in a container and waits for it (at most `timeout` seconds,
    /// enforced by the runtime; 0 means no limit).
    pub async fn exec_sync(&self, request: exec::ExecSyncRequest) -> Result<exec::ExecSyncResponse, tonic::Status> {
        let mut grpc = tonic::client::Grpc::new(self.channel.clone());
        grpc.ready().await.map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let path = tonic::codegen::http::uri::PathAndQuery::from_static("/runtime.v1.RuntimeService/ExecSync");
        let codec = tonic_prost::ProstCodec::default();
        Ok(grpc.unary(tonic::Request::new(request), path, codec).await?.into_inner())
    }
}

/// The messages of CRI's `ExecSync` (k8s.io/cri-api runtime/v1, same field numbers), written
/// out beside the generated ones.
pub mod exec {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ExecSyncRequest {
        #[prost(string, tag = "1")]
        pub container_id: String,
        #[prost(string, repeated, tag = "2")]
        pub cmd: Vec<String>,
        #[prost(int64, tag = "3")]
        pub timeout: i64,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ExecSyncResponse {
        #[prost(bytes = "vec", tag = "1")]
        pub stdout: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")]
        pub stderr: Vec<u8>,
        #[prost(int32, tag = "3")]
        pub exit_code: i32,
    }
}
