//! TokenRequest for the nodes: a token of a Pod's ServiceAccount, bound to that Pod, for a node
//! that runs it (NodeRestriction admits a kubelet's TokenRequest only for a Pod bound to it, as
//! the ServiceAccount that Pod runs as).

use gitplane_apiserver::serviceaccount::{
    Binding, Claims, DEFAULT_EXPIRATION_SECONDS, ISSUER, MIN_EXPIRATION_SECONDS, Ref, SigningKey,
};
use k8s_openapi::api::core::v1::{Node, Pod, ServiceAccount};
use std::time::Duration;
use tonic::Status;

/// Signs the tokens.
pub struct TokenIssuer {
    pub key: SigningKey,
    /// The longest a token lives (`--service-account-max-token-expiration`); none: as asked.
    pub max_expiration: Option<Duration>,
}

/// What a node asks for.
pub struct Asked<'a> {
    pub namespace: &'a str,
    pub pod_name: &'a str,
    pub pod_uid: &'a str,
    pub service_account: &'a str,
    pub audiences: Vec<String>,
    pub expiration_seconds: i64,
}

/// The ServiceAccount a Pod runs as (`default` when it names none).
pub fn service_account_of(pod: &Pod) -> &str {
    pod.spec.as_ref().and_then(|s| s.service_account_name.as_deref()).filter(|n| !n.is_empty()).unwrap_or("default")
}

/// How long the token lives: as asked (default an hour, at least ten minutes), at most the
/// maximum.
pub fn expiration(asked: i64, max: Option<Duration>) -> Result<i64, Status> {
    let asked = if asked == 0 { DEFAULT_EXPIRATION_SECONDS } else { asked };
    if asked < MIN_EXPIRATION_SECONDS {
        return Err(Status::invalid_argument(format!(
            "expirationSeconds {asked} is less than {MIN_EXPIRATION_SECONDS}: ask for at least ten minutes"
        )));
    }
    let max = max.map_or(i64::MAX, |m| i64::try_from(m.as_secs()).unwrap_or(i64::MAX));
    Ok(asked.min(max))
}

impl TokenIssuer {
    /// The claims of a token for `asked`, from the calling node `node` and the stored Pod and
    /// ServiceAccount, or why NodeRestriction refuses it.
    pub fn claims(
        &self,
        node: &Node,
        asked: &Asked,
        pod: Option<&Pod>,
        account: Option<&ServiceAccount>,
        now: i64,
    ) -> Result<Claims, Status> {
        let node_name = node.metadata.name.as_deref().unwrap_or_default();
        let what = format!("pod {}/{}", asked.namespace, asked.pod_name);
        let pod = pod.ok_or_else(|| Status::not_found(format!("{what} no longer exists")))?;
        if pod.metadata.uid.as_deref() != Some(asked.pod_uid) {
            return Err(Status::not_found(format!("{what} is another Pod now (its uid changed)")));
        }
        if pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(node_name) {
            return Err(Status::permission_denied(format!(
                "node {node_name} cannot request a token for {what}: it is not bound to this node"
            )));
        }
        if service_account_of(pod) != asked.service_account {
            return Err(Status::permission_denied(format!(
                "node {node_name} cannot request a token of ServiceAccount {:?} for {what}: it runs as {:?}",
                asked.service_account,
                service_account_of(pod)
            )));
        }
        let account = account.ok_or_else(|| {
            Status::not_found(format!(
                "serviceaccount \"{}/{}\" not found: add it in Git, or run the Pod as another ServiceAccount",
                asked.namespace, asked.service_account
            ))
        })?;
        let ttl = expiration(asked.expiration_seconds, self.max_expiration)?;
        let audiences = if asked.audiences.is_empty() { vec![ISSUER.to_owned()] } else { asked.audiences.clone() };
        let uid =
            |meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| meta.uid.clone().unwrap_or_default();
        let binding = Binding {
            namespace: asked.namespace.to_owned(),
            pod: Ref { name: asked.pod_name.to_owned(), uid: asked.pod_uid.to_owned() },
            serviceaccount: Ref { name: asked.service_account.to_owned(), uid: uid(&account.metadata) },
            node: Some(Ref { name: node_name.to_owned(), uid: uid(&node.metadata) }),
        };
        Ok(Claims::new(binding, audiences, now, ttl))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(node: &str, account: Option<&str>) -> Pod {
        let mut spec = json!({"nodeName": node, "containers": [{"name": "c", "image": "i"}]});
        if let Some(account) = account {
            spec["serviceAccountName"] = json!(account);
        }
        serde_json::from_value(json!({"metadata": {"name": "web", "namespace": "shop", "uid": "p-1"}, "spec": spec}))
            .unwrap()
    }

    #[test]
    fn only_a_node_running_the_pod_gets_its_token() {
        let issuer = TokenIssuer {
            key: SigningKey::from_pkcs8(&SigningKey::generate_pkcs8().unwrap()).unwrap(),
            max_expiration: Some(Duration::from_secs(900)),
        };
        let node: Node = serde_json::from_value(json!({"metadata": {"name": "n1", "uid": "n-1"}})).unwrap();
        let account: ServiceAccount =
            serde_json::from_value(json!({"metadata": {"name": "reader", "namespace": "shop", "uid": "s-1"}})).unwrap();
        let default: ServiceAccount =
            serde_json::from_value(json!({"metadata": {"name": "default", "namespace": "shop", "uid": "s-0"}}))
                .unwrap();
        let asked = |account: &'static str, uid: &'static str, expiration_seconds: i64| Asked {
            namespace: "shop",
            pod_name: "web",
            pod_uid: uid,
            service_account: account,
            audiences: Vec::new(),
            expiration_seconds,
        };
        let (on_n1, elsewhere, as_default) = (pod("n1", Some("reader")), pod("n2", Some("reader")), pod("n1", None));
        type Case<'a> =
            (&'a str, Asked<'a>, Option<&'a Pod>, Option<&'a ServiceAccount>, Result<(&'a str, i64), &'a str>);
        let cases: Vec<Case> = vec![
            ("its own Pod, capped", asked("reader", "p-1", 3607), Some(&on_n1), Some(&account), Ok(("s-1", 900))),
            ("the default account", asked("default", "p-1", 0), Some(&as_default), Some(&default), Ok(("s-0", 900))),
            (
                "another node's Pod",
                asked("reader", "p-1", 3607),
                Some(&elsewhere),
                Some(&account),
                Err("not bound to this node"),
            ),
            (
                "another account",
                asked("admin", "p-1", 3607),
                Some(&on_n1),
                Some(&account),
                Err("it runs as \"reader\""),
            ),
            ("a replaced Pod", asked("reader", "p-0", 3607), Some(&on_n1), Some(&account), Err("uid changed")),
            ("a deleted Pod", asked("reader", "p-1", 3607), None, Some(&account), Err("no longer exists")),
            (
                "no such account",
                asked("reader", "p-1", 3607),
                Some(&on_n1),
                None,
                Err("serviceaccount \"shop/reader\" not found"),
            ),
            ("too short", asked("reader", "p-1", 60), Some(&on_n1), Some(&account), Err("at least ten minutes")),
        ];
        for (name, asked, pod, account, want) in cases {
            let got = issuer.claims(&node, &asked, pod, account, 1_000);
            match (got, want) {
                (Ok(claims), Ok((uid, ttl))) => {
                    assert_eq!(claims.kubernetes.serviceaccount.uid, uid, "{name}");
                    assert_eq!(claims.exp - claims.iat, ttl, "{name}");
                    assert_eq!(claims.kubernetes.pod, Ref { name: "web".into(), uid: "p-1".into() }, "{name}");
                    assert_eq!(claims.kubernetes.node.as_ref().map(|n| n.name.as_str()), Some("n1"), "{name}");
                    assert_eq!(claims.aud, [ISSUER], "{name}");
                }
                (Err(status), Err(message)) => assert!(status.message().contains(message), "{name}: {status:?}"),
                (got, want) => panic!("{name}: got {got:?}, want {want:?}"),
            }
        }
    }
}
