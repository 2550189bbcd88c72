//! The ServiceAccount side of `gitplane-bench api`: a ServiceAccount that a ClusterRoleBinding
//! lets list Pods, among the bindings a real cluster has beside it (the discovery roles every
//! authenticated user is bound to, controllers' ClusterRoleBindings, applications'
//! RoleBindings); its token, signed with the replica's key written before the server starts
//! (`<data-dir>/service-account-key`) and bound to a stored Pod; and the cost of one RBAC
//! decision on the snapshot the API server builds of those objects.

use anyhow::{Context as _, Result};
use gitplane_apiserver::{
    rbac::{Attributes, Snapshot},
    serviceaccount::{self, Binding, Claims, Ref, SigningKey},
};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use serde_json::{Value, json};
use std::{
    path::Path,
    time::{Duration, Instant},
};

/// The reader's namespace and name; its token is bound to the first stored Pod, in this
/// namespace too.
pub const NAMESPACE: &str = "ns-0";
pub const ACCOUNT: &str = "reader";
/// Bindings of controllers and applications beside the reader's and the discovery ones.
const OTHERS: usize = 40;

fn cluster_role(name: &str, rules: Value) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name}, "rules": rules})
}

fn role_ref(name: &str) -> Value {
    json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name})
}

fn cluster_binding(name: &str, role: &str, subjects: Value) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
           "roleRef": role_ref(role), "subjects": subjects})
}

fn account(namespace: &str, name: &str) -> Value {
    json!({"kind": "ServiceAccount", "name": name, "namespace": namespace})
}

/// The reader's ServiceAccount and every RBAC object of the run: 44 bindings in all.
pub fn objects() -> Vec<Value> {
    let mut objects = vec![
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": ACCOUNT, "namespace": NAMESPACE}}),
        cluster_role(
            "pod-reader",
            json!([{"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["get", "list", "watch"]}]),
        ),
        cluster_binding("pod-reader", "pod-reader", json!([account(NAMESPACE, ACCOUNT)])),
    ];
    // What kube-apiserver binds to every authenticated user.
    let authenticated =
        json!([{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:authenticated"}]);
    for (name, rules) in [
        (
            "system:discovery",
            json!([{"nonResourceURLs": ["/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi",
                                        "/openapi/*", "/readyz", "/version", "/version/"], "verbs": ["get"]}]),
        ),
        (
            "system:basic-user",
            json!([{"apiGroups": ["authorization.k8s.io"], "resources": ["selfsubjectaccessreviews",
                    "selfsubjectrulesreviews"], "verbs": ["create"]},
                   {"apiGroups": ["authentication.k8s.io"], "resources": ["selfsubjectreviews"], "verbs": ["create"]}]),
        ),
        (
            "system:public-info-viewer",
            json!([{"nonResourceURLs": ["/healthz", "/livez", "/readyz", "/version", "/version/"], "verbs": ["get"]}]),
        ),
    ] {
        objects.push(cluster_role(name, rules));
        objects.push(cluster_binding(name, name, authenticated.clone()));
    }
    for i in 0..OTHERS {
        let role = format!("app-{i}");
        objects.push(cluster_role(
            &role,
            json!([{"apiGroups": ["", "apps"], "resources": ["configmaps", "services", "deployments", "replicasets"],
                    "verbs": ["get", "list", "watch"]},
                   {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]}]),
        ));
        if i % 2 == 0 {
            let controller = format!("controller-{i}");
            objects.push(cluster_binding(&controller, &role, json!([account("kube-system", &controller)])));
        } else {
            // An application's RoleBinding, to its account and to every account of its namespace.
            let namespace = format!("ns-{}", i % 100);
            let group = format!("system:serviceaccounts:{namespace}");
            objects.push(json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": role, "namespace": namespace}, "roleRef": role_ref(&role),
                "subjects": [account(&namespace, "app"), {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}],
            }));
        }
    }
    objects
}

/// Writes a new ServiceAccount key where `gitplane server` reads it, and returns it (PKCS#8).
pub fn write_key(data_dir: &Path) -> Result<Vec<u8>> {
    use base64::{Engine as _, engine::general_purpose::STANDARD};
    use std::os::unix::fs::PermissionsExt as _;
    let key = SigningKey::generate_pkcs8()?;
    let path = data_dir.join("service-account-key");
    std::fs::write(&path, format!("{}\n", STANDARD.encode(&key)))?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    Ok(key)
}

/// The reader's token for a day, bound to `pod` and `account` as stored (their uids).
pub fn token(key: &[u8], pod: &Value, account: &Value) -> Result<String> {
    let reference = |v: &Value| Ref {
        name: v["metadata"]["name"].as_str().unwrap_or_default().to_owned(),
        uid: v["metadata"]["uid"].as_str().unwrap_or_default().to_owned(),
    };
    let binding =
        Binding { namespace: NAMESPACE.into(), pod: reference(pod), serviceaccount: reference(account), node: None };
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs() as i64;
    let claims = Claims::new(binding, vec![serviceaccount::ISSUER.into()], now, 24 * 3600);
    SigningKey::from_pkcs8(key).context("the ServiceAccount key")?.sign(&claims)
}

/// One RBAC decision's mean time on the snapshot of `objects`, as the API server decides for
/// the reader: allowed (its ClusterRoleBinding), and denied (every grant of the user and its
/// groups scanned). Rows of the table's form.
pub fn decision_rows(objects: &[Value], decisions: usize) -> Result<Vec<String>> {
    fn of<T: serde::de::DeserializeOwned>(objects: &[Value], kind: &str) -> Result<Vec<T>> {
        objects
            .iter()
            .filter(|o| o["kind"] == kind)
            .map(|o| serde_json::from_value(o.clone()).with_context(|| format!("a {kind}")))
            .collect()
    }
    let snapshot = Snapshot::build(
        &of::<Role>(objects, "Role")?,
        &of::<ClusterRole>(objects, "ClusterRole")?,
        &of::<RoleBinding>(objects, "RoleBinding")?,
        &of::<ClusterRoleBinding>(objects, "ClusterRoleBinding")?,
    );
    let user = serviceaccount::username(NAMESPACE, ACCOUNT);
    let groups = serviceaccount::groups(NAMESPACE);
    let bindings = objects.iter().filter(|o| o["kind"].as_str().is_some_and(|k| k.ends_with("Binding"))).count();
    let list = Attributes {
        verb: "list",
        resource_request: true,
        resource: "pods",
        path: "/api/v1/pods",
        ..Default::default()
    };
    let secret = Attributes {
        verb: "get",
        resource_request: true,
        resource: "secrets",
        namespace: "ns-1",
        name: "db",
        path: "/api/v1/namespaces/ns-1/secrets/db",
        ..Default::default()
    };
    let mut rows = Vec::new();
    for (what, attributes, allowed) in [
        ("allowed: list pods (its ClusterRoleBinding)", &list, true),
        ("denied: get a secret (every grant of the user and its groups)", &secret, false),
    ] {
        anyhow::ensure!(snapshot.allows(&user, &groups, attributes).is_some() == allowed, "{what}: not {allowed}");
        let started = Instant::now();
        for _ in 0..decisions {
            std::hint::black_box(snapshot.allows(std::hint::black_box(&user), &groups, attributes));
        }
        let mean = started.elapsed() / decisions as u32;
        rows.push(format!("| One RBAC decision, {what}; {bindings} bindings | {decisions} | {} |", ns(mean)));
    }
    Ok(rows)
}

fn ns(d: Duration) -> String {
    format!("{} ns", d.as_nanos())
}
