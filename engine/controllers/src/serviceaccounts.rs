//! What every namespace holds from the start, as kube-controller-manager's ServiceAccount
//! controller and root CA certificate publisher make it: a ServiceAccount `default` and the
//! ConfigMap `kube-root-ca.crt` holding the cluster CA (`ca.crt`), which Pods use to verify the
//! API server at `kubernetes.default.svc`.
//!
//! They are the control plane's, not Git's: they carry no Application annotation, so the source
//! neither prunes them nor reports them as drift. One that an Application owns (Git names it)
//! is left to Git; one that is deleted or changed is made again.

use crate::{Action, Context, ReconcileError, Reconciler};
use gitplane_api::object::{APPLICATION_ANNOTATION, kind_of};
use gitplane_store::{Event, ObjectKey, Op, informer::Cache};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ServiceAccount};
use serde_json::{Value, json};

/// The ServiceAccount every namespace has, and Pods without `serviceAccountName` run as.
pub const DEFAULT_SERVICE_ACCOUNT: &str = "default";
/// The ConfigMap holding the cluster CA in every namespace.
pub const ROOT_CA_CONFIG_MAP: &str = "kube-root-ca.crt";
const DESCRIPTION: &str = "Contains a CA bundle that can be used to verify the kube-apiserver when using internal \
                           endpoints such as the internal service IP or kubernetes.default.svc. No other usage is \
                           guaranteed across distributions of Kubernetes clusters.";

pub struct ServiceAccountsController {
    /// The cluster CA (PEM) published as `kube-root-ca.crt`; none: no ConfigMap is made.
    pub root_ca: Option<String>,
}

/// The writes that give `namespace` its ServiceAccount and CA ConfigMap, from what is stored
/// of them (`None`: absent).
pub fn plan(namespace: &str, account: Option<&Value>, config_map: Option<&Value>, root_ca: Option<&str>) -> Vec<Op> {
    let mut ops = Vec::new();
    if account.is_none() {
        ops.push(Op::Create(json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": DEFAULT_SERVICE_ACCOUNT, "namespace": namespace}})));
    }
    let Some(ca) = root_ca else { return ops };
    let desired = json!({"ca.crt": ca});
    match config_map {
        None => ops.push(Op::Create(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": ROOT_CA_CONFIG_MAP, "namespace": namespace,
                         "annotations": {"kubernetes.io/description": DESCRIPTION}},
            "data": desired}))),
        // The stored resourceVersion stays: the update compares-and-swaps on what was read.
        Some(current) if !from_git(current) && current["data"] != desired => {
            let mut updated = current.clone();
            updated["data"] = desired;
            ops.push(Op::Update(updated));
        }
        Some(_) => {}
    }
    ops
}

fn from_git(object: &Value) -> bool {
    object["metadata"]["annotations"][APPLICATION_ANNOTATION].is_string()
}

fn namespace_key(name: &str) -> ObjectKey {
    ObjectKey::of::<Namespace>("", name)
}

#[async_trait::async_trait]
impl Reconciler for ServiceAccountsController {
    fn name(&self) -> &'static str {
        "serviceaccount"
    }

    fn keys_for(&self, event: &Event, _: &Cache) -> Vec<ObjectKey> {
        let key = &event.key;
        if key.kind == kind_of::<Namespace>() {
            return vec![key.clone()];
        }
        let ours = (key.kind == kind_of::<ServiceAccount>() && key.name == DEFAULT_SERVICE_ACCOUNT)
            || (key.kind == kind_of::<ConfigMap>() && key.name == ROOT_CA_CONFIG_MAP);
        if ours { vec![namespace_key(&key.namespace)] } else { Vec::new() }
    }

    fn all_keys(&self, cache: &Cache) -> Vec<ObjectKey> {
        crate::runtime::all_of::<Namespace>(cache)
    }

    async fn reconcile(&self, key: &ObjectKey, ctx: &Context) -> Result<Action, ReconcileError> {
        let cache = ctx.cache();
        let Some(namespace) = cache.get(key) else { return Ok(Action::await_change()) };
        if namespace["metadata"]["deletionTimestamp"].is_string() {
            return Ok(Action::await_change());
        }
        let name = &key.name;
        let account = cache.get(&ObjectKey::of::<ServiceAccount>(name, DEFAULT_SERVICE_ACCOUNT));
        let config_map = cache.get(&ObjectKey::of::<ConfigMap>(name, ROOT_CA_CONFIG_MAP));
        let ops = plan(name, account.as_deref(), config_map.as_deref(), self.root_ca.as_deref());
        if ops.is_empty() {
            return Ok(Action::await_change());
        }
        tracing::info!("making the namespace's default ServiceAccount and CA ConfigMap");
        match ctx.commit(ops).await {
            Err(e) if e.is_already_exists() => Ok(Action::requeue(std::time::Duration::from_secs(1))),
            other => other.map(|_| Action::await_change()).map_err(Into::into),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds_and_names(ops: &[Op]) -> Vec<(String, String)> {
        ops.iter()
            .map(|op| {
                let verb = match op {
                    Op::Create(_) => "create",
                    Op::Update(_) | Op::UpdateWithStatus(_) => "update",
                    Op::UpdateStatus(_) => "status",
                    Op::Delete { .. } => "delete",
                };
                let key = op.key().unwrap();
                (verb.to_owned(), format!("{} {}/{}", key.kind, key.namespace, key.name))
            })
            .collect()
    }

    #[test]
    fn every_namespace_gets_its_account_and_ca() {
        let stale = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": ROOT_CA_CONFIG_MAP, "namespace": "a"}, "data": {"ca.crt": "old"}});
        let current = json!({"metadata": {"name": ROOT_CA_CONFIG_MAP, "namespace": "a"}, "data": {"ca.crt": "CA"}});
        let git = json!({"metadata": {"name": ROOT_CA_CONFIG_MAP, "namespace": "a",
                         "annotations": {APPLICATION_ANNOTATION: "gitplane-system/x"}}, "data": {"ca.crt": "mine"}});
        let account = json!({"metadata": {"name": "default", "namespace": "a"}});
        type Case<'a> = (&'a str, Option<&'a Value>, Option<&'a Value>, Option<&'a str>, Vec<(&'a str, &'a str)>);
        let cases: Vec<Case> = vec![
            (
                "empty namespace",
                None,
                None,
                Some("CA"),
                vec![("create", "ServiceAccount a/default"), ("create", "ConfigMap a/kube-root-ca.crt")],
            ),
            ("no CA known", None, None, None, vec![("create", "ServiceAccount a/default")]),
            ("all there", Some(&account), Some(&current), Some("CA"), vec![]),
            ("CA changed", Some(&account), Some(&stale), Some("CA"), vec![("update", "ConfigMap a/kube-root-ca.crt")]),
            ("Git's is left to Git", Some(&account), Some(&git), Some("CA"), vec![]),
        ];
        for (name, account, config_map, ca, want) in cases {
            let got = kinds_and_names(&plan("a", account, config_map, ca));
            let want: Vec<(String, String)> = want.into_iter().map(|(v, k)| (v.to_owned(), k.to_owned())).collect();
            assert_eq!(got, want, "{name}");
        }
    }
}
