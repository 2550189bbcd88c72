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
use gitplane_store::{Event, ObjectKey, informer::Cache};
use k8s_openapi::api::{
    core::v1::{Node, Secret, Service},
    networking::v1::{Ingress, IngressClass, IngressLoadBalancerIngress, IngressLoadBalancerStatus, IngressStatus},
};
use std::sync::Mutex;

const COMPONENT: &str = "ingress-controller";

#[derive(Default)]
pub struct IngressController {
    /// The node addresses last seen: a Node change that keeps them touches no Ingress.
    addresses: Mutex<Vec<String>>,
}

/// The InternalIPs of every node, sorted.
fn node_addresses(cache: &Cache) -> Vec<String> {
    let mut addresses: Vec<String> = cache
        .list_typed::<Node>(None)
        .iter()
        .flat_map(|n| n.status.iter().flat_map(|s| s.addresses.iter().flatten()))
        .filter(|a| a.type_ == "InternalIP")
        .map(|a| a.address.clone())
        .collect();
    addresses.sort();
    addresses.dedup();
    addresses
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
            let now = node_addresses(cache);
            let mut seen = self.addresses.lock().unwrap_or_else(|e| e.into_inner());
            if *seen != now {
                *seen = now;
                return ingresses(None);
            }
        }
        Vec::new()
    }

    fn all_keys(&self, cache: &Cache) -> Vec<ObjectKey> {
        *self.addresses.lock().unwrap_or_else(|e| e.into_inner()) = node_addresses(cache);
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
        let desired = desired_status(&node_addresses(ctx.cache()));
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
