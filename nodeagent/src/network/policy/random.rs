//! Repeatable random changes for the property tests: Pods, policies and Namespaces coming,
//! changing and going in a small world where addresses, labels and named ports collide often.

use super::desired::{CompiledPolicy, Policies, PolicyPod, TCP, UDP};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use serde_json::{Value, json};

pub const NODE: &str = "n1";

/// A small xorshift: the randomized tests must be repeatable.
pub struct Random(pub u64);

impl Random {
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

const NAMESPACES: [&str; 3] = ["a", "b", "c"];

/// Every kind of peer, port and policy type, over the world's labels.
fn specs() -> Vec<Value> {
    vec![
        json!({"podSelector": {}}),
        json!({"podSelector": {"matchLabels": {"app": "web"}}, "ingress": [{"from": [
            {"podSelector": {"matchLabels": {"role": "client"}}},
            {"namespaceSelector": {"matchLabels": {"team": "x"}}, "podSelector": {"matchLabels": {"app": "db"}}}],
            "ports": [{"port": 80}, {"port": 8000, "endPort": 8100}, {"port": "http"}]}]}),
        json!({"podSelector": {}, "ingress": [{"from": [{"namespaceSelector": {}}]}, {"ports": [{"port": "dns", "protocol": "UDP"}]}]}),
        json!({"podSelector": {"matchExpressions": [{"key": "role", "operator": "DoesNotExist"}]}, "ingress": [{"from": [
            {"ipBlock": {"cidr": "10.244.0.0/16", "except": ["10.244.1.0/24"]}},
            {"podSelector": {"matchLabels": {"app": "web"}}}]}]}),
        json!({"podSelector": {"matchLabels": {"app": "web"}}, "policyTypes": ["Egress"], "egress": [
            {"ports": [{"port": 53, "protocol": "UDP"}]},
            {"to": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "b"}}}], "ports": [{"port": "http"}]},
            {"to": [{"ipBlock": {"cidr": "10.244.2.0/24"}}], "ports": [{"port": "http"}, {"port": 9000}]}]}),
        json!({"podSelector": {"matchLabels": {"app": "db"}}, "policyTypes": ["Ingress", "Egress"], "egress": [
            {"to": [{"podSelector": {}}]}, {"ports": [{"port": "http"}]}],
            "ingress": [{"from": [{"namespaceSelector": {"matchLabels": {"team": "y"}}}], "ports": [{"port": "http"}, {"protocol": "SCTP"}]}]}),
        json!({"podSelector": {}, "policyTypes": []}),
    ]
}

fn pod(random: &mut Random, name: &str) -> PolicyPod {
    let mut labels = std::collections::BTreeMap::new();
    labels.insert("app".to_string(), random.pick(&["web", "db"]).to_string());
    if random.below(3) == 0 {
        labels.insert("role".to_string(), "client".to_string());
    }
    let all_ports = [("http", TCP, 8080), ("dns", UDP, 53), ("http", TCP, 9090)];
    let ports =
        all_ports.iter().filter(|_| random.below(2) == 0).map(|(n, p, port)| (n.to_string(), *p, *port)).collect();
    PolicyPod {
        namespace: random.pick(&NAMESPACES).to_string(),
        name: name.to_owned(),
        labels,
        node: random.pick(&[NODE, NODE, "n2", "n3"]).to_string(),
        // Two subnets, few addresses: some Pods share one, some sit in the blocks above.
        ip: [10, 244, 1 + random.below(2) as u8, 2 + random.below(6) as u8].into(),
        ports,
    }
}

/// One random change: mostly Pods, sometimes a policy, rarely a Namespace.
pub fn change(policies: &mut Policies, random: &mut Random) {
    match random.below(20) {
        0..=13 => {
            // Pods named p0..p11, each in at most one namespace: one comes, goes or changes.
            let name = format!("p{}", random.below(12));
            let mut new = pod(random, &name);
            match policies.pod_keys().into_iter().find(|(_, n)| *n == name) {
                Some(key) if random.below(3) == 0 => policies.set_pod(key, None),
                Some(key) => {
                    new.namespace = key.0.clone();
                    policies.set_pod(key, Some(new));
                }
                None => policies.set_pod(new.key(), Some(new)),
            }
        }
        14..=18 => {
            let specs = specs();
            let namespace = random.pick(&NAMESPACES).to_string();
            let name = format!("np{}", random.below(5));
            let key = (namespace.clone(), name.clone());
            if random.below(4) == 0 {
                return policies.set_policy(key, None);
            }
            let policy: NetworkPolicy = serde_json::from_value(json!({
                "metadata": {"namespace": namespace, "name": name},
                "spec": random.pick(&specs).clone(),
            }))
            .expect("a NetworkPolicy");
            policies.set_policy(key, Some(CompiledPolicy::new(&policy)));
        }
        _ => {
            let name = random.pick(&NAMESPACES);
            let labels = match random.below(4) {
                0 => None,
                n => Some([("team".to_string(), ["x", "y", "z"][n as usize - 1].to_string())].into()),
            };
            policies.set_namespace(name, labels);
        }
    }
}
