//! The wire format of the control plane <-> node agent contract: generated gRPC code for the
//! node service (`proto/node.proto`), and what its certificates say (`x509`). Apart from
//! `gitplane-api` so that what only needs the object model (the store's contract, the
//! scheduler, the controllers) links no gRPC.

pub mod node {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("gitplane.node.v1");
}

pub mod x509;
