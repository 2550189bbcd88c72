//! The Summary API (`GET /stats/summary`), the subset `kubectl top` needs: what the node agent
//! answers and the API server's `metrics.k8s.io` reads.

use serde::{Deserialize, Serialize};

/// The Summary API's answer (the subset `kubectl top` needs), with the window the CPU rates
/// were measured over.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub node: NodeStats,
    pub pods: Vec<PodStats>,
    /// Milliseconds between the two samples the CPU rates come from.
    pub window_milliseconds: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStats {
    pub node_name: String,
    pub cpu: Option<CpuStats>,
    pub memory: Option<MemoryStats>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStats {
    pub pod_ref: PodReference,
    pub containers: Vec<ContainerStats>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PodReference {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStats {
    pub name: String,
    pub cpu: Option<CpuStats>,
    pub memory: Option<MemoryStats>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CpuStats {
    /// RFC 3339.
    pub time: String,
    /// Core-nanoseconds per second over the window.
    pub usage_nano_cores: u64,
    pub usage_core_nano_seconds: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryStats {
    pub time: String,
    pub working_set_bytes: u64,
}
