//! The endpoints and load balancer controllers against a real (SQLite) store: a Service's
//! EndpointSlices and Endpoints follow its Pods' readiness and labels, a sync that changes
//! nothing writes nothing, a deleted Service takes its endpoints along, and LoadBalancer
//! Services get addresses from the pool and give them back. Nothing runs the Pods here: the test
//! writes their status as a kubelet would.

use gitplane_controllers::{Settings, endpoints::slices, loadbalancer::AddressPool};
use gitplane_storage::sqlite::SqliteStore;
use gitplane_store::{Api, Op, Store, informer::Informer};
use k8s_openapi::api::{
    core::v1::{Endpoints, Pod, Service},
    discovery::v1::EndpointSlice,
};
use serde_json::{Value, json};
use std::{sync::Arc, time::Duration};

async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(found) = check().await {
            return found;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn service(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "default"}, "spec": spec})
}

fn pod(n: u32, ready: bool) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("web-{n}"), "namespace": "default", "labels": {"app": "web"}},
        "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "i", "ports": [{"name": "http", "containerPort": 8080}]}]},
        "status": {"phase": "Running", "podIP": format!("10.244.0.{n}"),
                   "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}
    })
}

struct Cluster {
    store: Arc<dyn Store>,
    handles: Vec<tokio::task::JoinHandle<()>>,
}

impl Cluster {
    async fn start(settings: Settings) -> Cluster {
        let store: Arc<dyn Store> = Arc::new(SqliteStore::memory().await.unwrap());
        let informer = Informer::spawn(store.clone(), gitplane_controllers::watched_kinds());
        let handles = gitplane_controllers::spawn_all(store.clone(), informer, &settings);
        Cluster { store, handles }
    }

    async fn create(&self, object: Value) {
        self.store.txn(vec![Op::Create(object)]).await.unwrap();
    }

    /// The managed slices of a Service.
    async fn slices(&self, service: &str) -> Vec<EndpointSlice> {
        let (all, _) = Api::<EndpointSlice>::new(self.store.clone()).list(Some("default")).await.unwrap();
        all.into_iter()
            .filter(|s| {
                s.metadata.labels.as_ref().and_then(|l| l.get(slices::LABEL_SERVICE_NAME)).map(String::as_str)
                    == Some(service)
            })
            .collect()
    }

    async fn endpoints(&self, service: &str) -> Option<Endpoints> {
        Api::<Endpoints>::new(self.store.clone()).get("default", service).await.unwrap()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.handles.iter().for_each(|h| h.abort());
    }
}

/// (ready, not ready) endpoint addresses of a slice set, sorted.
fn addresses(slices: &[EndpointSlice]) -> (Vec<String>, Vec<String>) {
    let (mut ready, mut not_ready) = (Vec::new(), Vec::new());
    for e in slices.iter().flat_map(|s| &s.endpoints) {
        let list = if e.conditions.as_ref().and_then(|c| c.ready) == Some(true) { &mut ready } else { &mut not_ready };
        list.extend(e.addresses.iter().cloned());
    }
    ready.sort();
    not_ready.sort();
    (ready, not_ready)
}

fn legacy(endpoints: &Endpoints) -> (Vec<String>, Vec<String>) {
    let ips = |a: &Option<Vec<k8s_openapi::api::core::v1::EndpointAddress>>| {
        a.iter().flatten().map(|a| a.ip.clone()).collect::<Vec<_>>()
    };
    let subsets = endpoints.subsets.iter().flatten();
    (
        subsets.clone().flat_map(|s| ips(&s.addresses)).collect(),
        subsets.flat_map(|s| ips(&s.not_ready_addresses)).collect(),
    )
}

fn ips(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slices_and_endpoints_follow_the_pods() {
    let c = Cluster::start(Settings::default()).await;
    let pods = Api::<Pod>::new(c.store.clone());
    c.create(service(
        "web",
        json!({"clusterIP": "10.96.0.7", "selector": {"app": "web"},
                                   "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}),
    ))
    .await;
    c.create(service("external", json!({"clusterIP": "10.96.0.8", "ports": [{"port": 80}]}))).await;
    for n in 1..=3 {
        c.create(pod(n, n != 3)).await;
    }
    let want = (ips(&["10.244.0.1", "10.244.0.2"]), ips(&["10.244.0.3"]));
    let slice = eventually("a slice of 3 endpoints", || async {
        let s = c.slices("web").await;
        (s.len() == 1 && addresses(&s) == want).then(|| s[0].clone())
    })
    .await;
    assert_eq!(slice.ports.as_ref().unwrap()[0].port, Some(8080), "the named port, resolved");
    eventually("the Endpoints", || async { c.endpoints("web").await.filter(|e| legacy(e) == want) }).await;

    // A Pod change that changes no endpoint writes nothing.
    let mut touched = pods.get("default", "web-1").await.unwrap().unwrap();
    touched.metadata.annotations = Some([("note".to_owned(), "x".to_owned())].into());
    pods.update(&touched).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await; // proving that nothing happens
    assert_eq!(c.slices("web").await[0].metadata.resource_version, slice.metadata.resource_version);

    // Readiness moves an endpoint; a Pod whose labels stop matching leaves.
    let mut ready = pods.get("default", "web-3").await.unwrap().unwrap();
    ready.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].status = "True".into();
    pods.update_status(&ready).await.unwrap();
    let mut relabelled = pods.get("default", "web-2").await.unwrap().unwrap();
    relabelled.metadata.labels = Some([("app".to_owned(), "other".to_owned())].into());
    pods.update(&relabelled).await.unwrap();
    let want = (ips(&["10.244.0.1", "10.244.0.3"]), vec![]);
    eventually("endpoints after the changes", || async {
        let s = c.slices("web").await;
        let e = c.endpoints("web").await?;
        (s.len() == 1 && s[0].metadata.name == slice.metadata.name && addresses(&s) == want && legacy(&e) == want)
            .then_some(())
    })
    .await;
    assert!(c.slices("external").await.is_empty() && c.endpoints("external").await.is_none(), "no selector");

    // The Service goes, and its endpoints with it.
    c.store.txn(vec![Op::Delete { key: Api::<Service>::key("default", "web"), revision: None }]).await.unwrap();
    eventually("no endpoints", || async {
        (c.slices("web").await.is_empty() && c.endpoints("web").await.is_none()).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_balancers_get_addresses_from_the_pool_and_give_them_back() {
    let pool = AddressPool::parse("192.0.2.0/30").unwrap();
    let c = Cluster::start(Settings { load_balancer_pool: Some(pool), ..Settings::default() }).await;
    let services = Api::<Service>::new(c.store.clone());
    let lb =
        |name: &str| service(name, json!({"type": "LoadBalancer", "clusterIP": "10.96.0.9", "ports": [{"port": 80}]}));
    let address = |name: &'static str| {
        let services = services.clone();
        async move {
            let s = services.get("default", name).await.unwrap()?;
            s.status?.load_balancer?.ingress?.first()?.ip.clone()
        }
    };
    c.create(lb("a")).await;
    assert_eq!(eventually("a's address", || address("a")).await, "192.0.2.1");
    c.create(lb("b")).await;
    assert_eq!(eventually("b's address", || address("b")).await, "192.0.2.2");
    c.create(lb("c")).await;
    tokio::time::sleep(Duration::from_millis(300)).await; // proving that the exhausted pool gives none
    assert_eq!(address("c").await, None);
    c.store.txn(vec![Op::Delete { key: Api::<Service>::key("default", "a"), revision: None }]).await.unwrap();
    assert_eq!(eventually("c gets a's address", || address("c")).await, "192.0.2.1");
}
