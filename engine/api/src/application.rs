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
    /// YAML files in the repository (relative to `path`) whose values the templates get, merged
    /// in order: e.g. `values/common.yaml`, `values/prod.yaml`. They are not manifests.
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

/// What the source last did with an Application.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sync: Option<SyncStatus>,
}

/// The outcome of the latest sync attempt.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SyncStatus {
    /// `Synced` or `Failed`.
    pub status: String,
    /// The commit that is applied (the last good one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// The commit of the latest attempt, applied or rejected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempted_revision: Option<String>,
    /// One line per problem of a rejected commit: file, JSON path and what is wrong.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
    /// RFC 3339 time at which the latest attempt finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
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
