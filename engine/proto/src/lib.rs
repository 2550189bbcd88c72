//! The wire format of the control plane <-> node agent contract: generated gRPC code for the
//! node service (`proto/node.proto`). Apart from `gitplane-api` so that what only needs the
//! object model (the store's contract, the scheduler, the controllers) links no gRPC.

#![allow(clippy::all, missing_docs)]

pub mod node {
    tonic::include_proto!("gitplane.node.v1");
}
