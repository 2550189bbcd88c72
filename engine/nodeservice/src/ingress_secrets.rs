//! The Secrets `WatchNetwork` carries: only `kubernetes.io/tls` Secrets that an Ingress names in
//! `spec.tls[].secretName` (every node serves every Ingress, so every node needs them). Any other
//! Secret never leaves the control plane through this stream. [`TlsReferences`] is the pure
//! bookkeeping, per stream: which Secrets the Ingresses reference, and which were sent.

use super::references::ReferenceCounts;
use gitplane_api::ingress::TLS_SECRET_TYPE;
use gitplane_store::ObjectKey;
use serde_json::Value;
use std::collections::BTreeSet;

pub(super) const SECRET: &str = "Secret";
pub(super) const INGRESS: &str = "Ingress.networking.k8s.io";

type Name = (String, String);

/// What one stream's Ingresses reference.
#[derive(Debug, Default)]
pub(super) struct TlsReferences {
    by_ingress: ReferenceCounts<Name, Name>,
    /// Referenced Secrets that were sent (they exist and are TLS Secrets).
    sent: BTreeSet<Name>,
}

/// The Secrets an Ingress's TLS sections name, in its namespace.
pub(super) fn referenced(ingress: &Value) -> BTreeSet<Name> {
    let namespace = ingress["metadata"]["namespace"].as_str().unwrap_or_default();
    ingress["spec"]["tls"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["secretName"].as_str().filter(|s| !s.is_empty()))
        .map(|s| (namespace.to_owned(), s.to_owned()))
        .collect()
}

pub(super) fn is_tls(secret: &Value) -> bool {
    secret["type"] == TLS_SECRET_TYPE
}

fn name_of(key: &ObjectKey) -> Name {
    (key.namespace.clone(), key.name.clone())
}

impl TlsReferences {
    /// Ingress `key` (deleted: `None`) now references what it names: the Secrets that became
    /// referenced (to read and send) and those no longer referenced (to delete on the node).
    pub(super) fn set_ingress(&mut self, key: &ObjectKey, ingress: Option<&Value>) -> (Vec<Name>, Vec<Name>) {
        let refs = ingress.map(referenced).unwrap_or_default();
        let (added, unreferenced) = self.by_ingress.set(name_of(key), refs);
        let removed = unreferenced.into_iter().filter(|r| self.sent.remove(r)).collect();
        (added, removed)
    }

    /// Whether a Secret's write (or deletion, `secret` = `None`) goes to the node; a Secret that
    /// stops being a TLS Secret is deleted there.
    pub(super) fn secret_changed(&mut self, key: &ObjectKey, secret: Option<&Value>) -> Option<bool> {
        let name = name_of(key);
        if !self.by_ingress.is_referenced(&name) {
            return None;
        }
        match secret.filter(|s| is_tls(s)) {
            Some(_) => {
                self.sent.insert(name);
                Some(true)
            }
            None => self.sent.remove(&name).then_some(false),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key(kind: &str, name: &str) -> ObjectKey {
        ObjectKey { kind: kind.into(), namespace: "default".into(), name: name.into() }
    }

    #[test]
    fn only_referenced_tls_secrets_pass() {
        let mut refs = TlsReferences::default();
        let ingress = json!({"metadata": {"namespace": "default", "name": "shop"},
                             "spec": {"tls": [{"secretName": "shop-tls"}, {"hosts": ["x"]}]}});
        let tls = json!({"type": "kubernetes.io/tls"});
        let opaque = json!({"type": "Opaque"});
        assert_eq!(refs.secret_changed(&key(SECRET, "shop-tls"), Some(&tls)), None, "not referenced yet");
        let (added, removed) = refs.set_ingress(&key(INGRESS, "shop"), Some(&ingress));
        assert_eq!((added.len(), removed.len()), (1, 0));
        assert_eq!(refs.secret_changed(&key(SECRET, "shop-tls"), Some(&tls)), Some(true));
        assert_eq!(refs.secret_changed(&key(SECRET, "other"), Some(&tls)), None, "another Secret never passes");
        assert_eq!(refs.secret_changed(&key(SECRET, "shop-tls"), Some(&opaque)), Some(false), "no longer TLS");
        assert_eq!(refs.secret_changed(&key(SECRET, "shop-tls"), Some(&opaque)), None);
        assert_eq!(refs.secret_changed(&key(SECRET, "shop-tls"), Some(&tls)), Some(true));
        let (added, removed) = refs.set_ingress(&key(INGRESS, "shop"), None);
        assert_eq!((added.len(), removed), (0, vec![("default".into(), "shop-tls".into())]));
    }
}
