//! The scheduler: binds each pending Pod to a Ready node that fits it.
//!
//! As in Kubernetes' scheduling framework, a pure core ([`framework`]) runs named Filter and
//! Score plugins ([`plugins`]) over a snapshot of the nodes; the thin loop in [`scheduler`]
//! builds snapshots from the informer cache and writes bindings. The scheduler writes nothing
//! but a Pod's `spec.nodeName` and its `PodScheduled` condition; [`metrics`] are kube-scheduler's
//! attempt counts and latencies.

pub mod config;
pub mod framework;
pub mod metrics;
pub mod plugins;
pub mod resources;
pub mod scheduler;
pub mod terms;

pub use framework::{Cluster, NamespaceLabels, NodeInfo, Profile, ScheduleError};
pub use scheduler::Scheduler;
