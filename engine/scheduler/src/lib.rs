//! The scheduler: binds each pending Pod to a Ready node that fits it.
//!
//! As in Kubernetes' scheduling framework, a pure core ([`framework`]) runs named Filter and
//! Score plugins ([`plugins`]) over a snapshot of the nodes; the thin loop in [`scheduler`]
//! builds snapshots from the informer cache and writes bindings; [`volume_binding`] is the
//! VolumeBinding plugin, made per Pod from its claims. The scheduler writes nothing but a Pod's
//! `spec.nodeName` and its `PodScheduled` condition, and the selected node on the claims that
//! wait for it; [`metrics`] are kube-scheduler's attempt counts and latencies.

pub mod config;
pub mod framework;
pub mod metrics;
pub mod plugins;
pub mod resources;
pub mod scheduler;
pub mod snapshot;
pub mod terms;
pub mod volume_binding;

pub use framework::{Cluster, NamespaceLabels, NodeInfo, Profile, ScheduleError};
pub use scheduler::Scheduler;
