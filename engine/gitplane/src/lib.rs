//! The gitplane control plane as a library: what the `gitplane` binary runs, and the pure cores
//! (the source's plan, health) that benchmarks drive directly.

mod apiserver;
mod bootstrap;
mod controlplane;
mod credentials;
pub mod encryption;
mod githttp;
mod kubelet_client;
mod listener;
mod mirror;
mod nodes;
mod nodeservice;
pub mod offline;
mod replica;
pub mod server;
pub mod source;
mod table;
pub mod up;
mod webhook;
