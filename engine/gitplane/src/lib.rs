//! The gitplane control plane as a library: what the `gitplane` binary runs, and the pure cores
//! (the source's plan, health) that benchmarks drive directly.

mod apiserver;
mod audit;
mod authn;
mod authz;
mod bootstrap;
mod controlplane;
mod credentials;
pub mod diff;
pub mod encryption;
mod events;
mod githttp;
mod kubeconfig;
mod kubelet_client;
mod listener;
mod metrics;
mod mirror;
mod nodes;
mod nodeservice;
pub mod offline;
mod page;
pub mod prereceive;
mod replica;
mod security;
pub mod server;
pub mod source;
pub mod status;
mod table;
mod tls;
pub mod token;
pub mod up;
mod webhook;
