//! The API server's defaults (Kubernetes' `SetDefaults_*`), written into objects as they are
//! stored, so every reader (kubectl, the controllers, the nodes) sees a Deployment's strategy,
//! a Service's type and a container port's protocol as Kubernetes would show them. Only fields
//! that are absent are set, so applying the defaults twice changes nothing. Pure.

use serde_json::{Map, Value, json};

/// Fills in the defaults of `object`'s kind (by its `apiVersion` and `kind`); other kinds are
/// left as they are.
pub fn apply(object: &mut Value) {
    let text = |field: &str| object[field].as_str().unwrap_or_default().to_owned();
    let (api_version, kind) = (text("apiVersion"), text("kind"));
    if (api_version.as_str(), kind.as_str()) == ("v1", "Secret") {
        set(object.as_object_mut(), "type", json!("Opaque"));
    }
    if (api_version.as_str(), kind.as_str()) == ("storage.k8s.io/v1", "StorageClass") {
        set(object.as_object_mut(), "reclaimPolicy", json!("Delete"));
        set(object.as_object_mut(), "volumeBindingMode", json!("Immediate"));
    }
    if let ("v1", "PersistentVolumeClaim" | "PersistentVolume") = (api_version.as_str(), kind.as_str())
        && let Some(object) = object.as_object_mut()
    {
        // A new claim or volume waits to be bound; an update keeps the stored status anyway.
        set(Some(entry(object, "status")), "phase", json!("Pending"));
    }
    let Some(spec) = object.get_mut("spec").and_then(Value::as_object_mut) else { return };
    match (api_version.as_str(), kind.as_str()) {
        ("v1", "Pod") => pod_spec(spec),
        ("apps/v1", "Deployment") => {
            set(Some(spec), "replicas", json!(1));
            set(Some(spec), "revisionHistoryLimit", json!(10));
            set(Some(spec), "progressDeadlineSeconds", json!(600));
            let strategy = entry(spec, "strategy");
            set(Some(strategy), "type", json!("RollingUpdate"));
            if strategy["type"] == "RollingUpdate" {
                let rolling = entry(strategy, "rollingUpdate");
                set(Some(rolling), "maxUnavailable", json!("25%"));
                set(Some(rolling), "maxSurge", json!("25%"));
            }
            template(spec);
        }
        ("apps/v1", "ReplicaSet") => {
            set(Some(spec), "replicas", json!(1));
            template(spec);
        }
        ("v1", "ReplicationController") => {
            set(Some(spec), "replicas", json!(1));
            // The selector and the labels default to the template's labels.
            let labels = spec.get("template").map(|t| t["metadata"]["labels"].clone()).filter(Value::is_object);
            if let Some(labels) = labels {
                if spec.get("selector").and_then(Value::as_object).is_none_or(Map::is_empty) {
                    spec.insert("selector".into(), labels.clone());
                }
                let metadata = object.get_mut("metadata").and_then(Value::as_object_mut);
                if let Some(metadata) = metadata
                    && metadata.get("labels").and_then(Value::as_object).is_none_or(Map::is_empty)
                {
                    metadata.insert("labels".into(), labels);
                }
            }
            if let Some(spec) = object.get_mut("spec").and_then(Value::as_object_mut) {
                template(spec);
            }
        }
        ("apps/v1", "DaemonSet") => {
            set(Some(spec), "revisionHistoryLimit", json!(10));
            let strategy = entry(spec, "updateStrategy");
            set(Some(strategy), "type", json!("RollingUpdate"));
            if strategy["type"] == "RollingUpdate" {
                let rolling = entry(strategy, "rollingUpdate");
                set(Some(rolling), "maxUnavailable", json!(1));
                set(Some(rolling), "maxSurge", json!(0));
            }
            template(spec);
        }
        ("apps/v1", "StatefulSet") => {
            set(Some(spec), "replicas", json!(1));
            set(Some(spec), "podManagementPolicy", json!("OrderedReady"));
            set(Some(spec), "revisionHistoryLimit", json!(10));
            let strategy = entry(spec, "updateStrategy");
            set(Some(strategy), "type", json!("RollingUpdate"));
            if strategy["type"] == "RollingUpdate" {
                set(Some(entry(strategy, "rollingUpdate")), "partition", json!(0));
            }
            let retention = entry(spec, "persistentVolumeClaimRetentionPolicy");
            set(Some(retention), "whenDeleted", json!("Retain"));
            set(Some(retention), "whenScaled", json!("Retain"));
            for claim in items(spec, "volumeClaimTemplates") {
                let claim_spec = entry(claim, "spec");
                set(Some(claim_spec), "volumeMode", json!("Filesystem"));
                set(Some(claim), "apiVersion", json!("v1"));
                set(Some(claim), "kind", json!("PersistentVolumeClaim"));
                set(Some(entry(claim, "status")), "phase", json!("Pending"));
            }
            template(spec);
        }
        ("batch/v1", "Job") => {
            if spec.get("completions").is_none() && spec.get("parallelism").is_none() {
                spec.insert("completions".into(), json!(1));
                spec.insert("parallelism".into(), json!(1));
            }
            set(Some(spec), "parallelism", json!(1));
            set(Some(spec), "backoffLimit", json!(6));
            set(Some(spec), "completionMode", json!("NonIndexed"));
            set(Some(spec), "suspend", json!(false));
            template(spec);
        }
        ("batch/v1", "CronJob") => {
            set(Some(spec), "concurrencyPolicy", json!("Allow"));
            set(Some(spec), "suspend", json!(false));
            set(Some(spec), "successfulJobsHistoryLimit", json!(3));
            set(Some(spec), "failedJobsHistoryLimit", json!(1));
            // Only the Pod template's defaults: a Job's own come when the controller creates it.
            if let Some(job) =
                spec.get_mut("jobTemplate").and_then(|t| t.get_mut("spec")).and_then(Value::as_object_mut)
            {
                template(job);
            }
        }
        ("autoscaling/v2", "HorizontalPodAutoscaler") => {
            set(Some(spec), "minReplicas", json!(1));
            if spec.get("metrics").is_none_or(|m| m.as_array().is_some_and(Vec::is_empty)) {
                let cpu = json!({"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}});
                spec.insert("metrics".into(), json!([{"type": "Resource", "resource": cpu}]));
            }
            // A behavior that is set gets every rule filled in; none stays none.
            if let Some(behavior) = spec.get_mut("behavior").and_then(Value::as_object_mut) {
                let pods_and_percent = json!([{"type": "Pods", "value": 4, "periodSeconds": 15},
                                              {"type": "Percent", "value": 100, "periodSeconds": 15}]);
                let percent = json!([{"type": "Percent", "value": 100, "periodSeconds": 15}]);
                for (direction, window, policies) in [("scaleUp", 0, pods_and_percent), ("scaleDown", 300, percent)] {
                    let rules = entry(behavior, direction);
                    set(Some(rules), "stabilizationWindowSeconds", json!(window));
                    set(Some(rules), "selectPolicy", json!("Max"));
                    set(Some(rules), "policies", policies);
                }
            }
        }
        ("v1", "Service") => service_spec(spec),
        ("v1", "PersistentVolumeClaim") => set(Some(spec), "volumeMode", json!("Filesystem")),
        ("v1", "PersistentVolume") => {
            set(Some(spec), "persistentVolumeReclaimPolicy", json!("Retain"));
            set(Some(spec), "volumeMode", json!("Filesystem"));
            set(spec.get_mut("hostPath").and_then(Value::as_object_mut), "type", json!(""));
        }
        ("networking.k8s.io/v1", "NetworkPolicy") => {
            if spec.get("policyTypes").is_none() {
                let mut types = vec![json!("Ingress")];
                if spec.get("egress").is_some_and(|e| !e.is_null()) {
                    types.push(json!("Egress"));
                }
                spec.insert("policyTypes".into(), Value::Array(types));
            }
            for direction in ["ingress", "egress"] {
                for rule in items(spec, direction) {
                    for port in items(rule, "ports") {
                        set(Some(port), "protocol", json!("TCP"));
                    }
                }
            }
        }
        _ => {}
    }
}

/// The imagePullPolicy of a container that sets none: `Always` for `:latest` or an untagged
/// image, else `IfNotPresent`.
pub fn image_pull_policy(image: &str) -> &'static str {
    if image.contains('@') {
        return "IfNotPresent";
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.rsplit_once(':') {
        Some((_, "latest")) | None => "Always",
        Some(_) => "IfNotPresent",
    }
}

fn set(object: Option<&mut Map<String, Value>>, field: &str, value: Value) {
    if let Some(object) = object
        && object.get(field).is_none_or(Value::is_null)
    {
        object.insert(field.to_owned(), value);
    }
}

/// The object at `field`, made empty first if absent.
fn entry<'a>(object: &'a mut Map<String, Value>, field: &str) -> &'a mut Map<String, Value> {
    let value = object.entry(field).or_insert_with(|| json!({}));
    if !value.is_object() {
        *value = json!({});
    }
    value.as_object_mut().expect("an object was just put here")
}

/// The objects of the list at `field`.
fn items<'a>(object: &'a mut Map<String, Value>, field: &str) -> impl Iterator<Item = &'a mut Map<String, Value>> {
    object.get_mut(field).and_then(Value::as_array_mut).into_iter().flatten().filter_map(Value::as_object_mut)
}

fn template(spec: &mut Map<String, Value>) {
    if let Some(pod) = spec.get_mut("template").and_then(|t| t.get_mut("spec")).and_then(Value::as_object_mut) {
        pod_spec(pod);
    }
}

fn pod_spec(spec: &mut Map<String, Value>) {
    set(Some(spec), "restartPolicy", json!("Always"));
    set(Some(spec), "terminationGracePeriodSeconds", json!(30));
    set(Some(spec), "dnsPolicy", json!("ClusterFirst"));
    set(Some(spec), "schedulerName", json!("default-scheduler"));
    set(Some(spec), "securityContext", json!({}));
    for list in ["initContainers", "containers"] {
        for container in items(spec, list) {
            let image = container.get("image").and_then(Value::as_str).unwrap_or_default().to_owned();
            set(Some(container), "imagePullPolicy", json!(image_pull_policy(&image)));
            set(Some(container), "terminationMessagePath", json!("/dev/termination-log"));
            set(Some(container), "terminationMessagePolicy", json!("File"));
            set(Some(container), "resources", json!({}));
            for port in items(container, "ports") {
                set(Some(port), "protocol", json!("TCP"));
            }
            for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
                let Some(probe) = container.get_mut(probe).and_then(Value::as_object_mut) else { continue };
                set(Some(probe), "timeoutSeconds", json!(1));
                set(Some(probe), "periodSeconds", json!(10));
                set(Some(probe), "successThreshold", json!(1));
                set(Some(probe), "failureThreshold", json!(3));
                set(probe.get_mut("httpGet").and_then(Value::as_object_mut), "scheme", json!("HTTP"));
            }
        }
    }
    for volume in items(spec, "volumes") {
        for source in ["configMap", "secret", "projected", "downwardAPI"] {
            set(volume.get_mut(source).and_then(Value::as_object_mut), "defaultMode", json!(420));
        }
    }
}

fn service_spec(spec: &mut Map<String, Value>) {
    set(Some(spec), "type", json!("ClusterIP"));
    set(Some(spec), "sessionAffinity", json!("None"));
    let type_ = spec["type"].as_str().unwrap_or_default().to_owned();
    if type_ != "ExternalName" {
        set(Some(spec), "internalTrafficPolicy", json!("Cluster"));
    }
    if matches!(type_.as_str(), "NodePort" | "LoadBalancer") {
        set(Some(spec), "externalTrafficPolicy", json!("Cluster"));
    }
    for port in items(spec, "ports") {
        set(Some(port), "protocol", json!("TCP"));
        if let Some(number) = port.get("port").cloned() {
            set(Some(port), "targetPort", number);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deployment_as_kubectl_describes_it() {
        let mut d = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
            "spec": {"selector": {"matchLabels": {"app": "web"}}, "template": {"spec": {"containers": [
                {"name": "web", "image": "nginx", "ports": [{"containerPort": 80}],
                 "readinessProbe": {"httpGet": {"path": "/", "port": 80}}},
                {"name": "side", "image": "gitplane.local/httpd:1", "imagePullPolicy": "Never"}]}}}});
        apply(&mut d);
        assert_eq!(d["spec"]["replicas"], 1);
        assert_eq!(
            d["spec"]["strategy"],
            json!({"type": "RollingUpdate",
            "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}})
        );
        let pod = &d["spec"]["template"]["spec"];
        assert_eq!((pod["restartPolicy"].as_str(), pod["dnsPolicy"].as_str()), (Some("Always"), Some("ClusterFirst")));
        let web = &pod["containers"][0];
        assert_eq!(web["imagePullPolicy"], "Always", "untagged");
        assert_eq!(web["ports"][0]["protocol"], "TCP");
        assert_eq!(web["readinessProbe"]["httpGet"]["scheme"], "HTTP");
        assert_eq!(web["readinessProbe"]["periodSeconds"], 10);
        assert_eq!(pod["containers"][1]["imagePullPolicy"], "Never", "set fields are kept");
        let again = d.clone();
        apply(&mut d);
        assert_eq!(d, again, "applying twice changes nothing");
    }

    #[test]
    fn services_jobs_and_recreate() {
        let mut s = json!({"apiVersion": "v1", "kind": "Service", "spec": {"ports": [{"port": 80}]}});
        apply(&mut s);
        assert_eq!(s["spec"]["type"], "ClusterIP");
        assert_eq!(s["spec"]["sessionAffinity"], "None");
        assert_eq!(s["spec"]["ports"][0], json!({"port": 80, "protocol": "TCP", "targetPort": 80}));
        let mut j = json!({"apiVersion": "batch/v1", "kind": "Job", "spec": {"parallelism": 2, "template": {}}});
        apply(&mut j);
        assert_eq!((j["spec"]["parallelism"].as_i64(), j["spec"].get("completions")), (Some(2), None));
        assert_eq!(j["spec"]["backoffLimit"], 6);
        let mut c = json!({"apiVersion": "batch/v1", "kind": "CronJob",
            "spec": {"schedule": "@hourly", "successfulJobsHistoryLimit": 0, "jobTemplate": {"spec": {"template": {"spec": {}}}}}});
        apply(&mut c);
        let policy = |f: &str| c["spec"][f].clone();
        assert_eq!(
            [
                policy("concurrencyPolicy"),
                policy("suspend"),
                policy("successfulJobsHistoryLimit"),
                policy("failedJobsHistoryLimit")
            ],
            [json!("Allow"), json!(false), json!(0), json!(1)]
        );
        let job = &c["spec"]["jobTemplate"]["spec"];
        assert_eq!(
            (job["template"]["spec"]["dnsPolicy"].as_str(), job.get("backoffLimit")),
            (Some("ClusterFirst"), None)
        );
        let mut h = json!({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
            "spec": {"maxReplicas": 5, "behavior": {"scaleDown": {"stabilizationWindowSeconds": 15}}}});
        apply(&mut h);
        assert_eq!(h["spec"]["minReplicas"], 1);
        assert_eq!(h["spec"]["metrics"][0]["resource"]["target"]["averageUtilization"], 80);
        let behavior = &h["spec"]["behavior"];
        assert_eq!(
            (&behavior["scaleDown"]["stabilizationWindowSeconds"], &behavior["scaleUp"]["stabilizationWindowSeconds"]),
            (&json!(15), &json!(0))
        );
        assert_eq!(behavior["scaleUp"]["policies"].as_array().map(Vec::len), Some(2));
        let mut bare =
            json!({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "spec": {"maxReplicas": 5}});
        apply(&mut bare);
        assert!(bare["spec"].get("behavior").is_none(), "no behavior: the controller's own defaults");
        let mut d = json!({"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"strategy": {"type": "Recreate"}}});
        apply(&mut d);
        assert_eq!(d["spec"]["strategy"], json!({"type": "Recreate"}));
        let mut ds = json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "spec": {"template": {"spec": {}}}});
        apply(&mut ds);
        assert_eq!(
            (&ds["spec"]["updateStrategy"], &ds["spec"]["revisionHistoryLimit"]),
            (&json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1, "maxSurge": 0}}), &json!(10))
        );
        assert_eq!(ds["spec"]["template"]["spec"]["restartPolicy"], "Always");
        let mut on_delete =
            json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "spec": {"updateStrategy": {"type": "OnDelete"}}});
        apply(&mut on_delete);
        assert_eq!(on_delete["spec"]["updateStrategy"], json!({"type": "OnDelete"}));
        let mut rc = json!({"apiVersion": "v1", "kind": "ReplicationController", "metadata": {"name": "nginx"},
            "spec": {"template": {"metadata": {"labels": {"app": "nginx"}}, "spec": {}}}});
        apply(&mut rc);
        assert_eq!((&rc["spec"]["replicas"], &rc["spec"]["selector"]), (&json!(1), &json!({"app": "nginx"})));
        assert_eq!(rc["metadata"]["labels"], json!({"app": "nginx"}));
        let mut selected = json!({"apiVersion": "v1", "kind": "ReplicationController", "metadata": {"labels": {"x": "y"}},
            "spec": {"selector": {"app": "a"}, "template": {"metadata": {"labels": {"app": "a", "v": "1"}}}}});
        apply(&mut selected);
        assert_eq!(
            (&selected["spec"]["selector"], &selected["metadata"]["labels"]),
            (&json!({"app": "a"}), &json!({"x": "y"}))
        );
        let mut secret = json!({"apiVersion": "v1", "kind": "Secret", "data": {}});
        apply(&mut secret);
        assert_eq!(secret["type"], "Opaque");
        let mut p = json!({"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "spec": {"podSelector": {}, "egress": [{"ports": [{"port": 53}]}]}});
        apply(&mut p);
        assert_eq!(p["spec"]["policyTypes"], json!(["Ingress", "Egress"]));
        assert_eq!(p["spec"]["egress"][0]["ports"][0]["protocol"], "TCP");
    }

    #[test]
    fn a_stateful_set_as_the_api_server_stores_it() {
        let mut s = json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "spec": {"serviceName": "nginx",
            "template": {"spec": {"containers": [{"name": "nginx", "image": "registry.k8s.io/nginx-slim:0.21"}]}},
            "volumeClaimTemplates": [{"metadata": {"name": "www"}, "spec": {"accessModes": ["ReadWriteOnce"]}}]}});
        apply(&mut s);
        let spec = &s["spec"];
        assert_eq!((spec["replicas"].as_i64(), spec["revisionHistoryLimit"].as_i64()), (Some(1), Some(10)));
        assert_eq!(spec["podManagementPolicy"], "OrderedReady");
        assert_eq!(spec["updateStrategy"], json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 0}}));
        assert_eq!(
            spec["persistentVolumeClaimRetentionPolicy"],
            json!({"whenDeleted": "Retain", "whenScaled": "Retain"})
        );
        let claim = &spec["volumeClaimTemplates"][0];
        assert_eq!(
            (claim["spec"]["volumeMode"].as_str(), claim["status"]["phase"].as_str()),
            (Some("Filesystem"), Some("Pending"))
        );
        assert_eq!(spec["template"]["spec"]["restartPolicy"], "Always");
        let mut on_delete =
            json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "spec": {"updateStrategy": {"type": "OnDelete"}}});
        apply(&mut on_delete);
        assert_eq!(on_delete["spec"]["updateStrategy"], json!({"type": "OnDelete"}));
    }

    #[test]
    fn claims_volumes_and_classes() {
        let cases = [
            (
                json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "spec": {"accessModes": ["ReadWriteOnce"]}}),
                json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                    "spec": {"accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem"}, "status": {"phase": "Pending"}}),
            ),
            (
                json!({"apiVersion": "v1", "kind": "PersistentVolume", "spec": {"hostPath": {"path": "/data"}}}),
                json!({"apiVersion": "v1", "kind": "PersistentVolume", "spec": {"hostPath": {"path": "/data", "type": ""},
                    "persistentVolumeReclaimPolicy": "Retain", "volumeMode": "Filesystem"}, "status": {"phase": "Pending"}}),
            ),
            (
                json!({"apiVersion": "v1", "kind": "PersistentVolume", "spec": {"persistentVolumeReclaimPolicy": "Delete",
                    "volumeMode": "Block"}, "status": {"phase": "Bound"}}),
                json!({"apiVersion": "v1", "kind": "PersistentVolume", "spec": {"persistentVolumeReclaimPolicy": "Delete",
                    "volumeMode": "Block"}, "status": {"phase": "Bound"}}),
            ),
            (
                json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "provisioner": "x"}),
                json!({"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "provisioner": "x",
                    "reclaimPolicy": "Delete", "volumeBindingMode": "Immediate"}),
            ),
        ];
        for (mut object, want) in cases {
            apply(&mut object);
            assert_eq!(object, want);
        }
    }
}
