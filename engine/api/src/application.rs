//! `Application` (gitplane.io/v1): which Git repository, branch and path feed which namespace.

use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The desired state of an Application: where its manifests live in Git and how they are applied.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "gitplane.io",
    version = "v1",
    kind = "Application",
    namespaced,
    status = "ApplicationStatus",
    crates(
        kube_core = "::kube_core",
        k8s_openapi = "::k8s_openapi",
        schemars = "::schemars",
        serde = "::serde",
        serde_json = "::serde_json"
    )
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApplicationSpec {
    /// A hosted repository's name (`demo` for `repos/demo.git`) or a remote Git URL.
    pub repo: String,
    /// The branch whose head is applied.
    #[serde(default = "default_branch")]
    pub branch: String,
    /// The directory inside the repository that holds the manifests; empty for the root.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub path: String,
    /// The namespace of namespaced objects that do not name one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Delete objects that this Application created and Git no longer holds.
    #[serde(default = "default_true")]
    pub prune: bool,
    /// Values for the repository's templates (`*.yaml.j2`), over those of `valuesFiles`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "free_form_map")]
    pub values: BTreeMap<String, serde_json::Value>,
    /// YAML files in the repository (relative to `path`; `..` may reach beside it, never out of
    /// the repository) whose values the templates get, merged in order: e.g.
    /// `values/common.yaml`, `../values/prod.yaml`. They are not manifests.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values_files: Vec<String>,
    /// Allow a commit that renders no objects at all to prune everything this Application made.
    /// Off by default: an empty render is more often a mistake (a wrong path) than an intent.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_empty: bool,
    /// Applications (same namespace) that must be synced and healthy before this one syncs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub depends_on: Vec<String>,
}

/// What the source last did with an Application, and how its objects are doing.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync: Option<SyncStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<HealthStatus>,
    /// The last applied revisions, newest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<RevisionHistory>,
}

/// The outcome of the latest sync attempt.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SyncStatus {
    /// `Synced` (the store matches the applied commit), `OutOfSync` (a newer commit waits, e.g.
    /// for its dependencies) or `Failed` (the latest commit was rejected or could not be applied).
    pub status: String,
    /// The commit that is applied (the last good one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// The applied commit's subject line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit_subject: Option<String>,
    /// The commit of the latest attempt, applied or rejected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempted_revision: Option<String>,
    /// One line per problem of a rejected commit: file, line, object, JSON path and what is wrong.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
    /// Why the latest commit is not applied yet, when it is waiting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// RFC 3339 times of the latest attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// How long the latest attempt took, from reading the commit to committing the store.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// Objects created, updated and pruned by the latest applied sync, and drift corrected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changes: Option<SyncChanges>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SyncChanges {
    pub created: u32,
    pub updated: u32,
    pub pruned: u32,
    pub drift_corrected: u32,
}

/// The worst health of the Application's objects.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HealthStatus {
    /// `Healthy`, `Progressing`, `Degraded` or `Missing`.
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The objects that are not healthy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<ResourceHealth>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResourceHealth {
    pub kind: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    pub name: String,
    pub status: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// One applied revision.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RevisionHistory {
    pub revision: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub commit_subject: String,
    pub applied_at: String,
}

fn default_branch() -> String {
    "main".to_owned()
}

fn default_true() -> bool {
    true
}

fn free_form_map(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({ "type": "object", "additionalProperties": true })
}
