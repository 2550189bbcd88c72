//! Who may call the agent's kubelet endpoint: the control plane's replicas. They present
//! `Authorization: Bearer <hex HMAC-SHA256(key = node credential, "gitplane kubelet api v1")>`.
//!
//! The node credential is a secret only its node and the replicas know (a replica derives any
//! node's credential from the cluster's peer token and the node name), so the agent checks a
//! caller without storing anything, and the token it accepts is good for this node only and
//! for nothing else: it is not the credential itself, which the node service accepts.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// What the token is a MAC of: a label of its own, so it serves no other purpose.
const PURPOSE: &[u8] = b"gitplane kubelet api v1";

fn mac(credential: &str) -> Hmac<Sha256> {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(credential.as_bytes()).expect("HMAC takes keys of any length");
    mac.update(PURPOSE);
    mac
}

/// The token a replica presents to the node whose credential is `credential`.
pub fn token(credential: &str) -> String {
    hex::encode(mac(credential).finalize().into_bytes())
}

/// Whether `authorization` (the header's value) is `Bearer <token(credential)>`, compared in
/// constant time.
pub fn verify(credential: &str, authorization: Option<&[u8]>) -> bool {
    let Some(hex_mac) = authorization.and_then(|v| v.strip_prefix(b"Bearer ")) else { return false };
    let Ok(given) = hex::decode(hex_mac) else { return false };
    mac(credential).verify_slice(&given).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_token_of_this_nodes_credential_passes() {
        let credential = "node:n1:00aa";
        let good = format!("Bearer {}", token(credential));
        assert!(verify(credential, Some(good.as_bytes())));
        assert_eq!(token(credential).len(), 64);
        let other_node = format!("Bearer {}", token("node:n2:00aa"));
        let upper = good.to_uppercase().replace("BEARER", "Bearer");
        let cut = &good[..good.len() - 2];
        let credential_itself = format!("Bearer {credential}");
        for bad in [
            other_node.as_str(),
            cut,
            &credential_itself,
            "Bearer ",
            "Bearer zz",
            "",
            good.trim_start_matches("Bearer "),
        ] {
            assert!(!verify(credential, Some(bad.as_bytes())), "{bad:?}");
        }
        // Hex is case-insensitive: the same MAC passes.
        assert!(verify(credential, Some(upper.as_bytes())));
        assert!(!verify(credential, None));
    }
}
