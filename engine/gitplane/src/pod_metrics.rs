//! The HorizontalPodAutoscaler controller's Pod usage: the nodes' Summary API through the API
//! server's kubelet client, the same figures metrics.k8s.io serves.

use gitplane_apiserver::{kubelet_client::KubeletClient, resource_metrics};
use gitplane_controllers::horizontal::{PodMetrics, PodUsage};
use gitplane_store::{ObjectKey, Store};
use k8s_openapi::{
    api::core::v1::{Node, Pod},
    jiff::Timestamp,
};
use std::{
    collections::{BTreeSet, HashMap},
    sync::Arc,
    time::Duration,
};

pub struct KubeletPodMetrics {
    pub store: Arc<dyn Store>,
    pub kubelet: KubeletClient,
}

#[async_trait::async_trait]
impl PodMetrics for KubeletPodMetrics {
    async fn pod_usage(&self, pods: &[Pod]) -> Result<HashMap<String, PodUsage>, String> {
        let on: BTreeSet<&str> = pods.iter().filter_map(|p| p.spec.as_ref()?.node_name.as_deref()).collect();
        let mut nodes = Vec::new();
        for name in on {
            let node = self.store.get(&ObjectKey::new("Node", "", name)).await.map_err(|e| e.to_string())?;
            nodes.extend(node.and_then(|n| serde_json::from_value::<Node>(n).ok()));
        }
        let summaries = resource_metrics::summaries(&self.kubelet, &nodes).await;
        if summaries.is_empty() && !nodes.is_empty() {
            return Err("no node running the Pods answered for their usage".into());
        }
        let uids: HashMap<(&str, &str), &str> = pods
            .iter()
            .filter_map(|p| {
                let m = &p.metadata;
                Some(((m.namespace.as_deref()?, m.name.as_deref()?), m.uid.as_deref()?))
            })
            .collect();
        let mut usage = HashMap::new();
        for (_, summary) in &summaries {
            let window = Duration::from_millis(summary.window_milliseconds);
            for pod in &summary.pods {
                let r = &pod.pod_ref;
                // A Pod of the same name but another uid was replaced meanwhile: not this one.
                if uids.get(&(r.namespace.as_str(), r.name.as_str())) != Some(&r.uid.as_str()) {
                    continue;
                }
                let cpu = pod.containers.iter().filter_map(|c| c.cpu.as_ref());
                let timestamp = cpu.clone().next().and_then(|c| c.time.parse::<Timestamp>().ok());
                let Some(timestamp) = timestamp else { continue }; // no CPU rate yet
                let memory = pod.containers.iter().filter_map(|c| c.memory.as_ref());
                usage.insert(
                    r.name.clone(),
                    PodUsage {
                        cpu_nano_cores: cpu.map(|c| c.usage_nano_cores).sum(),
                        memory_working_set_bytes: memory.map(|m| m.working_set_bytes).sum(),
                        timestamp,
                        window,
                    },
                );
            }
        }
        Ok(usage)
    }
}
