//! Ingress controller, the control plane's half (every node's agent serves the routes): writes
//! each served Ingress's `status.loadBalancer.ingress` with the nodes' InternalIPs (every node
//! answers on ports 80 and 443), and reports as Events what the routing core finds wrong with it
//! (a conflict with an older Ingress, a missing Service or port) and a TLS Secret that is missing
//! or holds no usable certificate, so `kubectl describe ingress` says why a route does not work.

use crate::{Action, Context, ReconcileError, Reconciler};
use gitplane_api::{
    events::WARNING,
    ingress::{self, Inputs, RouteTable},
    object::{from_value, kind_of},
};
use gitplane_store::{Event, EventType, ObjectKey, informer::Cache};
use k8s_openapi::api::{
    core::v1::{Node, Secret, Service},
    networking::v1::{Ingress, IngressClass, IngressLoadBalancerIngress, IngressLoadBalancerStatus, IngressStatus},
};
use serde_json::Value;
use std::{collections::BTreeMap, sync::Mutex};

const COMPONENT: &str = "ingress-controller";

#[derive(Default)]
pub struct IngressController {
    /// Each node's InternalIPs, kept from its events: a Node change that keeps them touches no
    /// Ingress, and neither an event nor a reconcile decodes every Node.
    addresses: Mutex<BTreeMap<String, Vec<String>>>,
}

/// A Node's InternalIPs, read from its JSON.
fn internal_ips(node: &Value) -> Vec<String> {
    let addresses = node["status"]["addresses"].as_array().into_iter().flatten();
    addresses.filter(|a| a["type"] == "InternalIP").filter_map(|a| a["address"].as_str().map(str::to_owned)).collect()
}

impl IngressController {
    fn known(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Vec<String>>> {
        self.addresses.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records a Node's addresses (none: it is gone); true when they changed.
    fn observe_node(&self, name: &str, addresses: Option<Vec<String>>) -> bool {
        let mut known = self.known();
        let old = match &addresses {
            Some(new) => known.insert(name.to_owned(), new.clone()),
            None => known.remove(name),
        };
        old.unwrap_or_default() != addresses.unwrap_or_default()
    }

    /// The InternalIPs of every node, sorted.
    fn node_addresses(&self) -> Vec<String> {
        let mut addresses: Vec<String> = self.known().values().flatten().cloned().collect();
        addresses.sort();
        addresses.dedup();
        addresses
    }
}

/// The status an Ingress should have: every node's address.
fn desired_status(addresses: &[String]) -> IngressLoadBalancerStatus {
    let ingress: Vec<IngressLoadBalancerIngress> =
        addresses.iter().map(|ip| IngressLoadBalancerIngress { ip: Some(ip.clone()), ..Default::default() }).collect();
    IngressLoadBalancerStatus { ingress: (!ingress.is_empty()).then_some(ingress) }
}

#[async_trait::async_trait]
impl Reconciler for IngressController {
    fn name(&self) -> &'static str {
        "ingress"
    }

    fn keys_for(&self, event: &Event, cache: &Cache) -> Vec<ObjectKey> {
        let kind = &event.key.kind;
        if *kind == kind_of::<Ingress>() {
            return vec![event.key.clone()];
        }
        let ingresses = |namespace: Option<&str>| {
            cache.list(&kind_of::<Ingress>(), namespace).iter().filter_map(|v| ObjectKey::from_value(v).ok()).collect()
        };
        if *kind == kind_of::<IngressClass>() {
            return ingresses(None);
        }
        if *kind == kind_of::<Service>() {
            return ingresses(Some(&event.key.namespace));
        }
        if *kind == kind_of::<Node>() {
            let addresses = (event.event_type != EventType::Deleted).then(|| internal_ips(&event.object));
            if self.observe_node(&event.key.name, addresses) {
                return ingresses(None);
            }
        }
        Vec::new()
    }

    fn all_keys(&self, cache: &Cache) -> Vec<ObjectKey> {
        let nodes = cache.list(&kind_of::<Node>(), None);
        *self.known() =
            nodes.iter().filter_map(|n| Some((n["metadata"]["name"].as_str()?.to_owned(), internal_ips(n)))).collect();
        crate::runtime::all_of::<Ingress>(cache)
    }

    async fn reconcile(&self, key: &ObjectKey, ctx: &Context) -> Result<Action, ReconcileError> {
        let Some(value) = ctx.cache().get(key) else { return Ok(Action::await_change()) };
        let ingress: Ingress = from_value((*value).clone()).map_err(|e| ReconcileError::Invalid(e.to_string()))?;
        let classes: Vec<IngressClass> = ctx.cache().list_typed(None);
        if !ingress::is_ours(&ingress, &classes) {
            return Ok(Action::await_change());
        }
        // The whole table: a conflict is between this Ingress and any other.
        let ingresses: Vec<Ingress> = ctx.cache().list_typed(None);
        let services: Vec<Service> = ctx.cache().list_typed(None);
        let mut inputs =
            Inputs { ingresses: ingresses.iter().collect(), classes: classes.iter().collect(), ..Default::default() };
        services.iter().for_each(|s| inputs.add_service(s));
        let table = RouteTable::build(&inputs);
        let own = (key.namespace.clone(), key.name.clone());
        for problem in table.problems.iter().filter(|p| p.ingress == own) {
            tracing::warn!(reason = problem.reason, "{}", problem.message);
            ctx.event(COMPONENT, &ingress, WARNING, problem.reason, &problem.message);
        }
        for secret_name in
            ingress.spec.iter().flat_map(|s| s.tls.iter().flatten()).filter_map(|t| t.secret_name.as_ref())
        {
            let secret_key = ObjectKey::of::<Secret>(&key.namespace, secret_name);
            let found = ctx.store.get(&secret_key).await?;
            let (reason, why) = match found.map(from_value::<Secret>) {
                None => ("TLSSecretNotFound", "not found".to_owned()),
                Some(Err(e)) => ("InvalidTLSSecret", format!("does not decode: {e}")),
                Some(Ok(secret)) => match ingress::certified_key(&secret) {
                    Ok(_) => continue,
                    Err(why) => ("InvalidTLSSecret", why),
                },
            };
            let message = format!("TLS Secret {}/{secret_name} {why}: its hosts are served without TLS", key.namespace);
            tracing::warn!(reason, "{message}");
            ctx.event(COMPONENT, &ingress, WARNING, reason, &message);
        }
        let desired = desired_status(&self.node_addresses());
        let current = ingress.status.as_ref().and_then(|s| s.load_balancer.clone()).unwrap_or_default();
        if current != desired {
            tracing::info!(addresses = ?desired.ingress.iter().flatten().filter_map(|i| i.ip.as_deref()).collect::<Vec<_>>(), "ingress addresses");
            let mut updated = ingress;
            updated.status = Some(IngressStatus { load_balancer: Some(desired) });
            ctx.update_status(&updated).await?;
        }
        Ok(Action::await_change())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(ips: &[&str]) -> Value {
        let addresses: Vec<Value> = ips.iter().map(|ip| json!({"type": "InternalIP", "address": ip})).collect();
        let mut with_hostname = addresses.clone();
        with_hostname.push(json!({"type": "Hostname", "address": "n"}));
        json!({"metadata": {"name": "n"}, "status": {"addresses": with_hostname}})
    }

    #[test]
    fn only_a_change_of_a_nodes_addresses_counts() {
        let c = IngressController::default();
        // (node, its InternalIPs or None when deleted, whether that changed them, every node's)
        type Step<'a> = (&'a str, Option<&'a [&'a str]>, bool, &'a [&'a str]);
        let steps: [Step; 7] = [
            ("a", Some(&[]), false, &[]),
            ("a", Some(&["10.0.0.2"]), true, &["10.0.0.2"]),
            ("a", Some(&["10.0.0.2"]), false, &["10.0.0.2"]),
            ("b", Some(&["10.0.0.1", "10.0.0.2"]), true, &["10.0.0.1", "10.0.0.2"]),
            ("a", None, true, &["10.0.0.1", "10.0.0.2"]),
            ("a", None, false, &["10.0.0.1", "10.0.0.2"]),
            ("b", Some(&[]), true, &[]),
        ];
        for (i, (name, addresses, changed, all)) in steps.into_iter().enumerate() {
            let addresses = addresses.map(|ips| internal_ips(&node(ips)));
            assert_eq!(c.observe_node(name, addresses), changed, "step {i}");
            assert_eq!(c.node_addresses(), all, "step {i}");
        }
    }
}
