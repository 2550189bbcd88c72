//! How an op turns into the stored object: the server-managed metadata (`resourceVersion`,
//! `uid`, `creationTimestamp`, `generation`), the spec/status split, and the API server's
//! defaults ([`gitplane_api::defaults`]) on every create and update. Pure functions, shared by
//! every backend.

use gitplane_store::{MAX_OBJECT_BYTES, ObjectKey, Rejection, Revision};

type Result<T> = std::result::Result<T, Rejection>;
use serde_json::{Map, Value};

/// Fields of `metadata` that only the store sets.
const MANAGED: [&str; 4] = ["resourceVersion", "uid", "creationTimestamp", "generation"];
/// Fields of `metadata` that a graceful delete sets and no later update takes back.
const DELETION: [&str; 2] = ["deletionTimestamp", "deletionGracePeriodSeconds"];

fn metadata_mut(value: &mut Value) -> Result<&mut Map<String, Value>> {
    value
        .get_mut("metadata")
        .and_then(Value::as_object_mut)
        .ok_or_else(|| Rejection::Invalid("object has no metadata".into()))
}

/// A new object: fresh uid and creation time, generation 1, defaults filled in.
pub fn create(mut value: Value, revision: Revision, uid: String, now: &str) -> Result<Value> {
    gitplane_api::defaults::apply(&mut value);
    let meta = metadata_mut(&mut value)?;
    meta.insert("resourceVersion".into(), revision.to_string().into());
    meta.insert("uid".into(), uid.into());
    meta.insert("creationTimestamp".into(), now.into());
    meta.insert("generation".into(), 1.into());
    Ok(value)
}

/// The stored revision an update expects, if it carries one.
pub fn expected_revision(value: &Value) -> Option<Revision> {
    gitplane_api::object::resource_version(value)
}

/// An update of metadata and spec: keeps the stored status and managed metadata, fills in the
/// defaults, bumps `generation` when anything but metadata and status changed.
pub fn update(old: &Value, mut new: Value, revision: Revision) -> Result<Value> {
    gitplane_api::defaults::apply(&mut new);
    replace(old, new, old.get("status").cloned(), revision)
}

/// An update of metadata, spec and status in one write (a Pod's binding sets `spec.nodeName` and
/// its PodScheduled condition together): as [`update`], but the status is the new object's.
pub fn update_with_status(old: &Value, mut new: Value, revision: Revision) -> Result<Value> {
    gitplane_api::defaults::apply(&mut new);
    let status = new.as_object_mut().and_then(|obj| obj.remove("status"));
    replace(old, new, status, revision)
}

/// `new` (defaulted) with the managed metadata of `old` and `status`.
fn replace(old: &Value, mut new: Value, status: Option<Value>, revision: Revision) -> Result<Value> {
    let spec_changed = !same_apart_from(old, &new, &["metadata", "status"]);
    let generation = old["metadata"]["generation"].as_i64().unwrap_or(1) + i64::from(spec_changed);
    copy_managed(old, &mut new)?;
    let meta = metadata_mut(&mut new)?;
    meta.insert("generation".into(), generation.into());
    meta.insert("resourceVersion".into(), revision.to_string().into());
    match (new.as_object_mut(), status) {
        (Some(obj), Some(status)) => {
            obj.insert("status".into(), status);
        }
        (Some(obj), None) => {
            obj.remove("status");
        }
        (None, _) => return Err(Rejection::Invalid("object is not a JSON object".into())),
    }
    Ok(new)
}

/// A status write: only `status` changes; generation stays.
pub fn update_status(old: &Value, new: &Value, revision: Revision) -> Result<Value> {
    let old = old.as_object().ok_or_else(|| Rejection::Invalid("stored object is not a JSON object".into()))?;
    // Everything but the status, which is replaced: copied once.
    let mut stored: Map<String, Value> =
        old.iter().filter(|(k, _)| k.as_str() != "status").map(|(k, v)| (k.clone(), v.clone())).collect();
    if let Some(status) = new.get("status") {
        stored.insert("status".into(), status.clone());
    }
    let mut stored = Value::Object(stored);
    metadata_mut(&mut stored)?.insert("resourceVersion".into(), revision.to_string().into());
    Ok(stored)
}

/// The last state of a deleted object, stamped with the deleting revision.
pub fn delete(old: &Value, revision: Revision) -> Result<Value> {
    let mut last = old.clone();
    metadata_mut(&mut last)?.insert("resourceVersion".into(), revision.to_string().into());
    Ok(last)
}

/// Refuses objects over [`MAX_OBJECT_BYTES`] once serialized.
pub fn check_size(key: &ObjectKey, serialized: &str) -> Result<()> {
    if serialized.len() > MAX_OBJECT_BYTES {
        return Err(Rejection::TooLarge { key: key.clone(), size: serialized.len(), limit: MAX_OBJECT_BYTES });
    }
    Ok(())
}

fn copy_managed(old: &Value, new: &mut Value) -> Result<()> {
    let old_meta = old["metadata"].as_object();
    let meta = metadata_mut(new)?;
    for field in MANAGED {
        match old_meta.and_then(|m| m.get(field)) {
            Some(v) => meta.insert(field.into(), v.clone()),
            None => meta.remove(field),
        };
    }
    if old["metadata"]["deletionTimestamp"].is_string() {
        for field in DELETION {
            if let Some(v) = old_meta.and_then(|m| m.get(field)) {
                meta.insert(field.into(), v.clone());
            }
        }
    }
    Ok(())
}

/// Whether two objects are equal in every top-level field but `fields` (compared in place: an
/// update of a large object copies nothing to find out whether its spec changed).
fn same_apart_from(a: &Value, b: &Value, fields: &[&str]) -> bool {
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else { return a == b };
    let kept = |(k, _): &(&String, &Value)| !fields.contains(&k.as_str());
    a.iter().filter(kept).count() == b.iter().filter(kept).count()
        && a.iter().filter(kept).all(|(k, v)| b.get(k) == Some(v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn deployment(replicas: i64) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "default"},
               "spec": {"replicas": replicas}})
    }

    #[test]
    fn create_stamps_managed_metadata() {
        let v = create(deployment(1), 7, "u-1".into(), "2026-01-01T00:00:00Z").unwrap();
        assert_eq!(v["metadata"]["resourceVersion"], "7");
        assert_eq!(v["metadata"]["uid"], "u-1");
        assert_eq!(v["metadata"]["generation"], 1);
    }

    #[test]
    fn generation_follows_spec_only() {
        let mut old = create(deployment(1), 7, "u-1".into(), "t").unwrap();
        old["status"] = json!({"replicas": 1});
        let mut relabeled = deployment(1);
        relabeled["metadata"]["labels"] = json!({"a": "b"});
        let same = update(&old, relabeled, 8).unwrap();
        assert_eq!(same["metadata"]["generation"], 1);
        assert_eq!(same["metadata"]["labels"]["a"], "b");
        assert_eq!(same["status"]["replicas"], 1, "update keeps the stored status");
        let scaled = update(&old, deployment(3), 9).unwrap();
        assert_eq!(scaled["metadata"]["generation"], 2);
        assert_eq!(scaled["metadata"]["uid"], "u-1");
        assert_eq!(scaled["metadata"]["resourceVersion"], "9");
    }

    #[test]
    fn a_graceful_delete_is_never_taken_back() {
        let mut old = create(deployment(1), 7, "u-1".into(), "t").unwrap();
        let fresh = update(&old, deployment(1), 8).unwrap();
        assert!(fresh["metadata"].get("deletionTimestamp").is_none());
        old["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:30Z");
        old["metadata"]["deletionGracePeriodSeconds"] = json!(30);
        let rewritten = update(&old, deployment(1), 9).unwrap();
        assert_eq!(rewritten["metadata"]["deletionTimestamp"], "2026-01-01T00:00:30Z");
        assert_eq!(rewritten["metadata"]["deletionGracePeriodSeconds"], 30);
    }

    #[test]
    fn status_write_keeps_spec_and_generation() {
        let old = create(deployment(1), 7, "u-1".into(), "t").unwrap();
        let mut new = deployment(5);
        new["status"] = json!({"readyReplicas": 1});
        let v = update_status(&old, &new, 8).unwrap();
        assert_eq!(v["spec"]["replicas"], 1);
        assert_eq!(v["status"]["readyReplicas"], 1);
        assert_eq!(v["metadata"]["generation"], 1);
    }
}
