//! The kubelet's gRPC probe (`pkg/probe/grpc`): `grpc.health.v1.Health/Check` with the probe's
//! `service` over a fresh plain-text connection; SERVING is a success. The two messages are
//! written out here rather than generated: they are all of the health protocol a probe needs.

use std::time::Duration;

use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Endpoint;
use tonic::{Code, Request};
use tonic_prost::ProstCodec;

use super::http::USER_AGENT;
use super::results::ProbeResult;

#[derive(Clone, PartialEq, prost::Message)]
pub struct HealthCheckRequest {
    #[prost(string, tag = "1")]
    pub service: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct HealthCheckResponse {
    #[prost(enumeration = "ServingStatus", tag = "1")]
    pub status: i32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum ServingStatus {
    Unknown = 0,
    Serving = 1,
    NotServing = 2,
    ServiceUnknown = 3,
}

impl ServingStatus {
    /// As the protocol names it (`NOT_SERVING`), which the kubelet's message quotes.
    fn name(status: i32) -> &'static str {
        match ServingStatus::try_from(status) {
            Ok(ServingStatus::Serving) => "SERVING",
            Ok(ServingStatus::NotServing) => "NOT_SERVING",
            Ok(ServingStatus::ServiceUnknown) => "SERVICE_UNKNOWN",
            _ => "UNKNOWN",
        }
    }
}

const CHECK: &str = "/grpc.health.v1.Health/Check";

/// Runs the probe against `ip:port` within `timeout`: its result and the kubelet's message.
pub async fn probe(ip: &str, port: u16, service: &str, timeout: Duration) -> (ProbeResult, String) {
    let addr = if ip.contains(':') { format!("[{ip}]:{port}") } else { format!("{ip}:{port}") };
    let endpoint = match Endpoint::from_shared(format!("http://{addr}")).and_then(|e| e.user_agent(USER_AGENT)) {
        Ok(endpoint) => endpoint.connect_timeout(timeout).timeout(timeout),
        Err(e) => return (ProbeResult::Unknown, format!("{addr:?} is not an address: {e}")),
    };
    let channel = match tokio::time::timeout(timeout, endpoint.connect()).await {
        Ok(Ok(channel)) => channel,
        Ok(Err(e)) => {
            let cause = std::error::Error::source(&e).map_or_else(|| e.to_string(), ToString::to_string);
            return (ProbeResult::Failure, format!("error: failed to connect service at {addr:?}: {cause}"));
        }
        Err(_) => {
            return (
                ProbeResult::Failure,
                format!("timeout: failed to connect service {addr:?} within {timeout:?}: context deadline exceeded"),
            );
        }
    };
    let mut grpc = tonic::client::Grpc::new(channel);
    let check = async {
        grpc.ready().await.map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let request = Request::new(HealthCheckRequest { service: service.to_owned() });
        grpc.unary::<_, HealthCheckResponse, _>(request, PathAndQuery::from_static(CHECK), ProstCodec::default()).await
    };
    match tokio::time::timeout(timeout, check).await {
        Ok(Ok(response)) => match response.into_inner().status {
            status if status == ServingStatus::Serving as i32 => (ProbeResult::Success, "service healthy".into()),
            status => {
                (ProbeResult::Failure, format!("service unhealthy (responded with {:?})", ServingStatus::name(status)))
            }
        },
        Ok(Err(status)) => match status.code() {
            Code::Unimplemented => (
                ProbeResult::Failure,
                format!(
                    "error: this server does not implement the grpc health protocol (grpc.health.v1.Health): {}",
                    status.message()
                ),
            ),
            Code::DeadlineExceeded => {
                (ProbeResult::Failure, format!("timeout: health rpc did not complete within {timeout:?}"))
            }
            _ => (ProbeResult::Failure, format!("error: health rpc probe failed: {status}")),
        },
        Err(_) => (ProbeResult::Failure, format!("timeout: health rpc did not complete within {timeout:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;
    use std::task::{Context, Poll};
    use tonic::body::Body;
    use tonic::codegen::{BoxFuture, http};
    use tonic::server::{NamedService, UnaryService};

    /// A health server that answers every Check with one status, or Unimplemented for `None`.
    #[derive(Clone)]
    struct Health(Option<ServingStatus>);

    impl NamedService for Health {
        const NAME: &'static str = "grpc.health.v1.Health";
    }

    struct Check(ServingStatus);

    impl UnaryService<HealthCheckRequest> for Check {
        type Response = HealthCheckResponse;
        type Future = BoxFuture<tonic::Response<HealthCheckResponse>, tonic::Status>;
        fn call(&mut self, request: Request<HealthCheckRequest>) -> Self::Future {
            let status = if request.get_ref().service == "other" { ServingStatus::ServiceUnknown } else { self.0 };
            Box::pin(async move { Ok(tonic::Response::new(HealthCheckResponse { status: status as i32 })) })
        }
    }

    impl tower::Service<http::Request<Body>> for Health {
        type Response = http::Response<Body>;
        type Error = Infallible;
        type Future = BoxFuture<Self::Response, Infallible>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, request: http::Request<Body>) -> Self::Future {
            let answer = self.0;
            Box::pin(async move {
                let Some(status) = answer.filter(|_| request.uri().path() == CHECK) else {
                    return Ok(tonic::Status::unimplemented("no health here").into_http());
                };
                let mut grpc = tonic::server::Grpc::new(ProstCodec::default());
                Ok(grpc.unary(Check(status), request).await)
            })
        }
    }

    async fn serve(health: Health) -> u16 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("address").port();
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        tokio::spawn(tonic::transport::Server::builder().add_service(health).serve_with_incoming(incoming));
        port
    }

    #[tokio::test]
    async fn probes_against_a_real_health_server() {
        let second = Duration::from_secs(1);
        let serving = serve(Health(Some(ServingStatus::Serving))).await;
        assert_eq!(probe("127.0.0.1", serving, "", second).await, (ProbeResult::Success, "service healthy".into()));
        assert_eq!(
            probe("127.0.0.1", serving, "other", second).await,
            (ProbeResult::Failure, "service unhealthy (responded with \"SERVICE_UNKNOWN\")".into())
        );
        let not_serving = serve(Health(Some(ServingStatus::NotServing))).await;
        assert_eq!(
            probe("127.0.0.1", not_serving, "", second).await,
            (ProbeResult::Failure, "service unhealthy (responded with \"NOT_SERVING\")".into())
        );
        let none = serve(Health(None)).await;
        let (result, message) = probe("127.0.0.1", none, "", second).await;
        assert_eq!(result, ProbeResult::Failure);
        assert!(message.starts_with("error: this server does not implement the grpc health protocol"), "{message}");

        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = closed.local_addr().expect("address").port();
        drop(closed);
        let (result, message) = probe("127.0.0.1", port, "", second).await;
        assert_eq!(result, ProbeResult::Failure);
        assert!(message.starts_with("error: failed to connect service at \"127.0.0.1:"), "{message}");
    }
}
