//! A CRI v1 client over containerd's unix socket. The generated wire types stay in this crate
//! (`pb`); the rest of the agent speaks Kubernetes objects through [`crate::kubelet::runtime`].

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
}
