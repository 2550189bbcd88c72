//! The data-driven cases under `tests/proxy/cases/<name>/case.yaml`: a node, Services and
//! EndpointSlices, and an update (objects that replace those of the same kind and name).
// Shared by several test crates, each using part of it.
#![allow(dead_code)]

use gitplane_nodeagent::network::proxy::desired::{self, Ipv4Cidr, NodeContext, ObjectKey, ServicePort};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub struct Case {
    pub name: String,
    pub dir: PathBuf,
    pub node: NodeContext,
    pub services: Vec<Service>,
    pub slices: Vec<EndpointSlice>,
    pub updated_services: Vec<Service>,
    pub updated_slices: Vec<EndpointSlice>,
}

impl Case {
    pub fn desired(&self) -> BTreeMap<ObjectKey, Vec<ServicePort>> {
        desired::desired(&self.node, &self.services, &self.slices)
    }

    pub fn desired_after_update(&self) -> BTreeMap<ObjectKey, Vec<ServicePort>> {
        desired::desired(&self.node, &self.updated_services, &self.updated_slices)
    }
}

pub fn cases_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/proxy/cases")
}

pub fn all() -> Vec<Case> {
    let mut dirs: Vec<PathBuf> =
        std::fs::read_dir(cases_dir()).unwrap().map(|e| e.unwrap().path()).filter(|p| p.is_dir()).collect();
    dirs.sort();
    dirs.into_iter().map(|d| load(&d)).collect()
}

fn key(v: &Value) -> (String, String, String) {
    let s = |p: &str| v.pointer(p).and_then(Value::as_str).unwrap_or_default().to_owned();
    (s("/kind"), s("/metadata/namespace"), s("/metadata/name"))
}

fn split(objects: &[Value]) -> (Vec<Service>, Vec<EndpointSlice>) {
    let mut services = Vec::new();
    let mut slices = Vec::new();
    for o in objects {
        match o["kind"].as_str() {
            Some("Service") => services.push(serde_json::from_value(o.clone()).unwrap()),
            Some("EndpointSlice") => slices.push(serde_json::from_value(o.clone()).unwrap()),
            other => panic!("unexpected kind {other:?}"),
        }
    }
    (services, slices)
}

pub fn load(dir: &Path) -> Case {
    let text = std::fs::read_to_string(dir.join("case.yaml")).unwrap();
    let doc: Value = serde_yaml::from_str(&text).unwrap();
    let n = &doc["node"];
    let node = NodeContext {
        node_name: n["name"].as_str().unwrap().into(),
        node_ips: n["ips"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().parse().unwrap()).collect(),
        cluster_cidr: n["clusterCIDR"].as_str().unwrap().parse::<Ipv4Cidr>().unwrap(),
        service_cidr: n["serviceCIDR"].as_str().unwrap().parse::<Ipv4Cidr>().unwrap(),
    };
    let objects = doc["objects"].as_array().cloned().unwrap_or_default();
    let update = doc["update"].as_array().cloned().unwrap_or_default();
    let mut merged = objects.clone();
    for u in &update {
        match merged.iter_mut().find(|o| key(o) == key(u)) {
            Some(o) => *o = u.clone(),
            None => merged.push(u.clone()),
        }
    }
    let (services, slices) = split(&objects);
    let (updated_services, updated_slices) = split(&merged);
    Case {
        name: dir.file_name().unwrap().to_string_lossy().into_owned(),
        dir: dir.to_owned(),
        node,
        services,
        slices,
        updated_services,
        updated_slices,
    }
}

/// The Services whose ports differ between two desired states, with their new ports.
pub fn changes<'a>(
    before: &'a BTreeMap<ObjectKey, Vec<ServicePort>>,
    after: &'a BTreeMap<ObjectKey, Vec<ServicePort>>,
) -> Vec<(&'a ObjectKey, &'a [ServicePort])> {
    let mut keys: Vec<&ObjectKey> = before.keys().chain(after.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| before.get(*k) != after.get(*k))
        .map(|k| (k, after.get(k).map(Vec::as_slice).unwrap_or(&[])))
        .collect()
}
