//! A hollow node's Pods: each bound to it is reported Running and Ready at once, with an address
//! from its podCIDR, through the same status the kubelet's runtime translation builds
//! (`runtime::status::pod_status`) from a runtime that holds every container running (init
//! containers done) and no probe results (probes count as passed). A Pod being deleted is
//! stopped at once: its delete is finalized through the node service, as a pod worker does.

use super::addresses::PodAddresses;
use crate::{
    controlplane::{Client, Follower, RETRY_MAX, RETRY_MIN, Servers},
    kubelet::{
        prober::pod::PodProbes,
        runtime::{
            actions::{ContainerRunState, RuntimeContainer, RuntimePod, RuntimeSandbox},
            spec::is_sidecar,
            status::{keep_transition_times, pod_status},
        },
    },
};
use gitplane_proto::node::{DeletePodRequest, EventType, PodEvent, UpdatePodStatusRequest, WatchPodsRequest};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use std::{collections::HashMap, net::Ipv4Addr, time::Duration};
use tonic::{Code, Status, Streaming};

/// How often a failed status report or delete is tried before the Pod waits for its next event.
const ATTEMPTS: u32 = 5;

pub struct HollowPods {
    pub node_name: String,
    pub client: Servers,
    pub addresses: PodAddresses,
    /// By uid, the Pods reported Running, with their address.
    pub running: HashMap<String, Ipv4Addr>,
}

/// What the runtime would hold for `pod` once it runs in a sandbox with address `ip`, every
/// container started at `now` (nanoseconds): init containers exited 0, sidecars and app
/// containers running.
pub fn running(pod: &Pod, ip: Ipv4Addr, now: i64) -> RuntimePod {
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let sandbox_id = format!("hollow-{uid}");
    let spec = pod.spec.as_ref();
    let init = spec.and_then(|s| s.init_containers.as_deref()).unwrap_or_default();
    let app = spec.map(|s| s.containers.as_slice()).unwrap_or_default();
    let containers = init
        .iter()
        .map(|c| (c, !is_sidecar(c)))
        .chain(app.iter().map(|c| (c, false)))
        .map(|(c, done)| RuntimeContainer {
            id: format!("{sandbox_id}-{}", c.name),
            sandbox_id: sandbox_id.clone(),
            name: c.name.clone(),
            state: if done { ContainerRunState::Exited } else { ContainerRunState::Running },
            created_at: now,
            started_at: now,
            finished_at: if done { now } else { 0 },
            reason: if done { "Completed".into() } else { String::new() },
            image_ref: c.image.clone().unwrap_or_default(),
            ..Default::default()
        })
        .collect();
    let sandbox =
        RuntimeSandbox { id: sandbox_id, attempt: 0, ready: true, created_at: now, ips: vec![ip.to_string()] };
    RuntimePod { sandboxes: vec![sandbox], containers }
}

/// The delay before attempt `n` (from 1) again.
fn backoff(n: u32) -> Duration {
    (RETRY_MIN * 2u32.saturating_pow(n)).min(RETRY_MAX)
}

impl HollowPods {
    /// Reports `pod` Running and Ready with a new address; `false` when it could not.
    async fn start(&mut self, pod: &Pod, uid: &str) -> bool {
        let Some(ip) = self.addresses.take() else {
            tracing::warn!(node = %self.node_name, pod = ?pod.metadata.name, "the podCIDR is full");
            return false;
        };
        let now = Timestamp::now();
        let runtime = running(pod, ip, now.as_nanosecond().try_into().unwrap_or(i64::MAX));
        let mut status = pod_status(pod, &runtime, &HashMap::new(), None, &PodProbes::default());
        keep_transition_times(None, &mut status, Time(now));
        let request = UpdatePodStatusRequest {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid: uid.to_owned(),
            status: serde_json::to_vec(&status).unwrap_or_default(),
        };
        for attempt in 1..=ATTEMPTS {
            let (server, mut client) = self.client.get();
            match client.update_pod_status(request.clone()).await {
                Ok(_) => {
                    self.running.insert(uid.to_owned(), ip);
                    return true;
                }
                Err(s) if s.code() == Code::NotFound => break, // deleted meanwhile
                Err(s) => {
                    tracing::warn!(pod = %request.name, error = %s.message(), "status report failed");
                    self.client.failed(server);
                    tokio::time::sleep(backoff(attempt)).await;
                }
            }
        }
        self.addresses.release(ip);
        false
    }

    /// Finalizes the delete of terminating `pod` (its containers stop at once).
    async fn stop(&mut self, pod: &Pod, uid: &str) {
        let request = DeletePodRequest {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid: uid.to_owned(),
        };
        for attempt in 1..=ATTEMPTS {
            let (server, mut client) = self.client.get();
            match client.delete_pod(request.clone()).await {
                Ok(_) => break,
                Err(s) if matches!(s.code(), Code::NotFound | Code::PermissionDenied) => break,
                Err(s) => {
                    tracing::warn!(pod = %request.name, error = %s.message(), "deleting the pod failed");
                    self.client.failed(server);
                    tokio::time::sleep(backoff(attempt)).await;
                }
            }
        }
        self.forget(uid);
    }

    fn forget(&mut self, uid: &str) {
        if let Some(ip) = self.running.remove(uid) {
            self.addresses.release(ip);
        }
    }
}

impl Follower for HollowPods {
    type Event = PodEvent;
    const WHAT: &'static str = "hollow node's Pod watch";

    async fn open(&self, mut client: Client, from: i64) -> Result<Streaming<PodEvent>, Status> {
        let request = WatchPodsRequest { node_name: self.node_name.clone(), resource_version: from };
        Ok(client.watch_pods(request).await?.into_inner())
    }

    fn started(&mut self, _: i64) {}

    async fn observe(&mut self, event: PodEvent) {
        let kind = EventType::try_from(event.r#type).unwrap_or(EventType::Unspecified);
        if matches!(kind, EventType::Bookmark | EventType::Unspecified) {
            return;
        }
        let pod: Pod = match serde_json::from_slice(&event.pod) {
            Ok(pod) => pod,
            Err(error) => {
                return tracing::warn!(node = %self.node_name, %error, "a Pod the node service sent is unreadable");
            }
        };
        let Some(uid) = pod.metadata.uid.clone() else { return };
        if kind == EventType::Deleted {
            return self.forget(&uid);
        }
        if pod.metadata.deletion_timestamp.is_some() {
            return self.stop(&pod, &uid).await;
        }
        if self.running.contains_key(&uid) {
            return;
        }
        // Reported by this node's last run: kept, with its address.
        let status = pod.status.as_ref();
        let reported = status.and_then(|s| s.pod_ip.as_deref()).and_then(|ip| ip.parse::<Ipv4Addr>().ok());
        if let Some(ip) = reported.filter(|_| status.and_then(|s| s.phase.as_deref()) == Some("Running"))
            && self.addresses.keep(ip)
        {
            self.running.insert(uid, ip);
            return;
        }
        self.start(&pod, &uid).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_running_pod_is_ready_with_its_address_and_its_init_containers_done() {
        struct Case {
            pod: serde_json::Value,
            containers: &'static [(&'static str, bool)],
            init: &'static [(&'static str, bool)],
        }
        let cases = [
            Case {
                pod: json!({"metadata": {"name": "a", "uid": "u1"}, "spec": {"containers": [
                    {"name": "web", "image": "nginx", "readinessProbe": {"httpGet": {"port": 80}}}
                ]}}),
                containers: &[("web", true)],
                init: &[],
            },
            Case {
                pod: json!({"metadata": {"name": "b", "uid": "u2"}, "spec": {
                    "initContainers": [{"name": "setup", "image": "busybox"},
                                       {"name": "proxy", "image": "envoy", "restartPolicy": "Always"}],
                    "containers": [{"name": "app", "image": "app"}]}}),
                containers: &[("app", true)],
                init: &[("setup", true), ("proxy", true)],
            },
        ];
        for case in cases {
            let pod: Pod = serde_json::from_value(case.pod).unwrap();
            let ip = Ipv4Addr::new(10, 244, 1, 2);
            let status = pod_status(&pod, &running(&pod, ip, 1), &HashMap::new(), None, &PodProbes::default());
            let name = pod.metadata.name.as_deref().unwrap();
            assert_eq!(status.phase.as_deref(), Some("Running"), "{name}");
            assert_eq!(status.pod_ip.as_deref(), Some("10.244.1.2"), "{name}");
            let ready = status.conditions.iter().flatten().find(|c| c.type_ == "Ready").unwrap();
            assert_eq!(ready.status, "True", "{name}");
            let of = |statuses: &Option<Vec<k8s_openapi::api::core::v1::ContainerStatus>>| -> Vec<(String, bool)> {
                statuses.iter().flatten().map(|s| (s.name.clone(), s.ready)).collect()
            };
            let owned =
                |l: &[(&str, bool)]| -> Vec<(String, bool)> { l.iter().map(|(n, r)| (n.to_string(), *r)).collect() };
            assert_eq!(of(&status.container_statuses), owned(case.containers), "{name}");
            assert_eq!(of(&status.init_container_statuses), owned(case.init), "{name}");
        }
    }
}
