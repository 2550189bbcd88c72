//! gitplane's object model, shared by the control plane and the node agent (the node service's wire
//! format is `gitplane-proto`'s).
//!
//! This crate stays light (no storage, no Git, no Raft, no gRPC) so the node agent and the store's
//! contract can link it.

pub mod application;
pub mod cron;
pub mod defaults;
pub mod events;
pub mod health;
pub mod hooks;
pub mod ingress;
pub mod kinds;
pub mod kubedns;
pub mod labels;
pub mod limitrange;
pub mod network;
pub mod nodeaffinity;
pub mod object;
pub mod openapi;
pub mod podrefs;
pub mod quantity;
pub mod quota;
pub mod schema;
pub mod taints;
pub mod volumes;

pub use application::{
    Application, ApplicationSpec, ApplicationStatus, HealthStatus, ResourceHealth, RevisionHistory, SyncChanges,
    SyncStatus,
};
pub use k8s_openapi;
pub use kube_core;
pub use object::{ObjectError, ObjectKey};
