//! The scheduler: binds each pending Pod to a Ready node that fits it.
//!
//! As in Kubernetes' scheduling framework, a pure core ([`framework`]) runs named Filter and
//! Score plugins ([`plugins`]) over a snapshot of the nodes; the thin loop in [`scheduler`]
//! keeps a snapshot of the nodes from the informer cache ([`snapshot`], with the index of their
//! Pods in [`pod_index`]) and writes bindings; [`volume_binding`] is the
//! VolumeBinding plugin, made per Pod from its claims. The scheduler writes nothing but a Pod's
//! `spec.nodeName` and its `PodScheduled` condition, and the selected node on the claims that
//! wait for it; [`metrics`] are kube-scheduler's attempt counts and latencies.

pub mod config;
pub mod framework;
pub mod metrics;
pub mod plugins;
pub mod pod_index;
pub mod resources;
pub mod scheduler;
pub mod snapshot;
pub mod terms;
#[cfg(test)]
mod testing;
pub mod volume_binding;

pub use framework::{Cluster, NamespaceLabels, NodeInfo, Profile, ScheduleError, index_pods};
pub use pod_index::PodIndex;
pub use scheduler::Scheduler;
