//! The kubelet's role on the node: the container runtime (containerd, over CRI) and what the
//! kubelet runs on it: the runtime manager, the pod workers and the PLEG, the prober, container
//! logs, the node's status and pressure, local storage eviction, resource usage and the kubelet
//! endpoint.

pub mod admission;
pub mod containerd;
pub mod credentialprovider;
pub mod cri;
pub mod eviction;
pub mod images;
pub mod logs;
pub mod node;
pub mod node_status;
pub mod pleg;
pub mod pod_workers;
pub mod podconfig;
pub mod prober;
pub mod registries;
pub mod restart;
pub mod runtime;
pub mod runtime_state;
pub mod server;
pub mod stats;
pub mod token_manager;
