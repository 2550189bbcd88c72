//! Generated gRPC code for the control plane <-> node agent service (`proto/node.proto`).

#![allow(clippy::all, missing_docs)]

pub mod node {
    tonic::include_proto!("gitplane.node.v1");
}
