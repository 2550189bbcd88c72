//! gitplane's object model and wire contracts, shared by the control plane and the node agent.
//!
//! This crate stays light (no storage, no Git, no Raft) so the node agent can link it.

pub mod application;
pub mod kinds;
pub mod object;
pub mod proto;
pub mod quantity;
pub mod schema;

pub use application::{
    Application, ApplicationSpec, ApplicationStatus, HealthStatus, ResourceHealth, RevisionHistory, SyncChanges,
    SyncStatus,
};
pub use k8s_openapi;
pub use kube_core;
pub use object::{ObjectError, ObjectKey};
