//! The `gitplane` binary as a library: wiring only. It assembles a replica from the API server,
//! the GitOps side, the node service, the store and the controllers, and holds the command
//! line (`server`, `up`, `status`, `token`, the offline commands) and `gitplane up`'s local
//! nodes.

mod backend;
mod controlplane;
mod credentials;
pub mod encryption;
mod events;
mod kubeconfig;
mod metrics;
mod nodes;
mod pod_metrics;
mod replica;
mod security;
pub mod server;
pub mod status;
pub mod token;
pub mod up;
