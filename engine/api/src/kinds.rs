//! The kinds gitplane accepts from Git, with their scope and schema.

use crate::schema::strict_schema;
use k8s_openapi::api::{
    admissionregistration::v1::{MutatingWebhookConfiguration, ValidatingWebhookConfiguration},
    apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet},
    autoscaling::{v1, v2},
    batch::v1::{CronJob, Job},
    core::v1::{
        ConfigMap, Endpoints, LimitRange, Namespace, PersistentVolume, PersistentVolumeClaim, Pod,
        ReplicationController, ResourceQuota, Secret, Service, ServiceAccount,
    },
    networking::v1::{Ingress, IngressClass, NetworkPolicy},
    policy::v1::PodDisruptionBudget,
    rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding},
    storage::v1::StorageClass,
};
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use kube_core::Resource;
use schemars::JsonSchema;
use serde_json::Value;
use std::sync::LazyLock;

/// One accepted kind.
pub struct KindInfo {
    pub api_version: String,
    pub kind: String,
    /// The resource name on the API paths (`deployments`).
    pub plural: String,
    pub namespaced: bool,
    /// Whether objects are stored (and served) in this version; false for a version converted
    /// to another as it is read from Git.
    pub stored: bool,
    schema: fn() -> Value,
}

impl KindInfo {
    fn of<K: Resource<DynamicType = ()> + JsonSchema>(namespaced: bool) -> Self {
        KindInfo {
            api_version: K::api_version(&()).into_owned(),
            kind: K::kind(&()).into_owned(),
            plural: K::plural(&()).into_owned(),
            namespaced,
            stored: true,
            schema: strict_schema::<K>,
        }
    }

    /// A version read from Git and stored as another.
    fn converted(self) -> Self {
        KindInfo { stored: false, ..self }
    }

    /// `Deployment.apps`, the kind part of a store key.
    pub fn group_kind(&self) -> String {
        crate::object::group_kind(&self.api_version, &self.kind)
    }

    /// The strict JSON Schema of this kind (what `schemas/` holds).
    pub fn schema(&self) -> Value {
        (self.schema)()
    }

    /// The file under `schemas/`: `apps-v1-deployment.json`, `v1-pod.json`.
    pub fn schema_file_name(&self) -> String {
        format!("{}-{}.json", self.api_version.replace('/', "-"), self.kind.to_lowercase())
    }
}

static ACCEPTED: LazyLock<Vec<KindInfo>> = LazyLock::new(|| {
    vec![
        KindInfo::of::<Namespace>(false),
        KindInfo::of::<ConfigMap>(true),
        KindInfo::of::<Secret>(true),
        KindInfo::of::<ServiceAccount>(true),
        KindInfo::of::<Pod>(true),
        KindInfo::of::<Service>(true),
        // Written by hand only for a Service without a selector (external backends).
        KindInfo::of::<Endpoints>(true),
        KindInfo::of::<LimitRange>(true),
        KindInfo::of::<ResourceQuota>(true),
        KindInfo::of::<ReplicaSet>(true),
        KindInfo::of::<Deployment>(true),
        KindInfo::of::<StatefulSet>(true),
        KindInfo::of::<DaemonSet>(true),
        KindInfo::of::<ReplicationController>(true),
        KindInfo::of::<Job>(true),
        KindInfo::of::<CronJob>(true),
        KindInfo::of::<v2::HorizontalPodAutoscaler>(true),
        // Converted to autoscaling/v2 as it is read from Git: the store holds one version.
        KindInfo::of::<v1::HorizontalPodAutoscaler>(true).converted(),
        KindInfo::of::<Ingress>(true),
        KindInfo::of::<IngressClass>(false),
        KindInfo::of::<NetworkPolicy>(true),
        KindInfo::of::<PodDisruptionBudget>(true),
        KindInfo::of::<Role>(true),
        KindInfo::of::<ClusterRole>(false),
        KindInfo::of::<RoleBinding>(true),
        KindInfo::of::<ClusterRoleBinding>(false),
        KindInfo::of::<PersistentVolumeClaim>(true),
        KindInfo::of::<PersistentVolume>(false),
        KindInfo::of::<StorageClass>(false),
        KindInfo::of::<APIService>(false),
        // Stored and served, never called: gitplane calls no admission webhooks.
        KindInfo::of::<ValidatingWebhookConfiguration>(false),
        KindInfo::of::<MutatingWebhookConfiguration>(false),
        KindInfo::of::<crate::Application>(true),
    ]
});

/// Every kind accepted from Git.
pub fn accepted() -> &'static [KindInfo] {
    &ACCEPTED
}

/// The accepted kinds in the version the store holds: one per group kind.
pub fn stored() -> impl Iterator<Item = &'static KindInfo> {
    ACCEPTED.iter().filter(|k| k.stored)
}

/// The accepted kind with this apiVersion and kind, if any.
pub fn lookup(api_version: &str, kind: &str) -> Option<&'static KindInfo> {
    ACCEPTED.iter().find(|k| k.api_version == api_version && k.kind == kind)
}

/// The files of `schemas/`: (file name, pretty JSON with a trailing newline), one per kind.
pub fn schema_files() -> Vec<(String, String)> {
    accepted()
        .iter()
        .map(|k| {
            let text = serde_json::to_string_pretty(&k.schema()).expect("schemas serialize");
            (k.schema_file_name(), text + "\n")
        })
        .collect()
}
