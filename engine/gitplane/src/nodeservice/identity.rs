//! Who calls the node service (the kubelet's TLS bootstrapping and NodeRestriction): a node's
//! client certificate, which the cluster CA signed at registration for `system:node:<name>` in
//! `system:nodes` and the listener verified in the handshake; else a bearer token: the
//! cluster's join token (to register a node once), or a node's credential.
//!
//! A node credential is `node:<name>:<hex HMAC-SHA256(node key, name)>`: the replicas verify it
//! without storing anything, and every replica derives the same node key from the peer token.
//! Registrations over TLS get certificates instead; the credential remains for agents that
//! registered before certificates (their next registration gets them one) and for agents on
//! cleartext loopback, where no certificate can be presented. Everything is checked by an
//! interceptor, before the request body is read.

use crate::listener::Transport;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tonic::{Request, Status, service::Interceptor};

const NODE_PREFIX: &str = "node:";

/// The authenticated caller of a node service request (a request extension).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Caller {
    /// Holds the join token: may register a new node (or one whose agent is gone).
    Joiner,
    /// Holds the credential of this node.
    Node(String),
}

/// Verifies the tokens of node service calls.
#[derive(Clone)]
pub struct NodeIdentity {
    /// SHA-256 of the join token: compared in constant time whatever its length.
    join: [u8; 32],
    key: [u8; 32],
}

impl NodeIdentity {
    pub fn new(join_token: &str, node_key: [u8; 32]) -> NodeIdentity {
        NodeIdentity { join: Sha256::digest(join_token.as_bytes()).into(), key: node_key }
    }

    fn mac(&self, node: &str) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.key).expect("HMAC takes keys of any length");
        mac.update(node.as_bytes());
        mac
    }

    /// The credential of `node`.
    pub fn credential(&self, node: &str) -> String {
        format!("{NODE_PREFIX}{node}:{}", hex::encode(self.mac(node).finalize().into_bytes()))
    }

    /// Who the client certificate the connection verified (`transport`), else `authorization`
    /// (`Bearer <token>`), proves the caller is.
    pub fn authenticate(&self, transport: Option<&Transport>, authorization: Option<&[u8]>) -> Result<Caller, Status> {
        if let Some(node) = transport.and_then(Transport::client).and_then(|s| s.node()) {
            return Ok(Caller::Node(node.to_owned()));
        }
        let token =
            authorization.and_then(|v| v.strip_prefix(b"Bearer ")).ok_or_else(|| Status::unauthenticated(NO_TOKEN))?;
        if let Some(rest) = token.strip_prefix(NODE_PREFIX.as_bytes())
            && let Some(colon) = rest.iter().rposition(|b| *b == b':')
        {
            let (name, mac) = (&rest[..colon], &rest[colon + 1..]);
            let name = std::str::from_utf8(name).map_err(|_| Status::unauthenticated(BAD_CREDENTIAL))?;
            let mac = hex::decode(mac).map_err(|_| Status::unauthenticated(BAD_CREDENTIAL))?;
            return match self.mac(name).verify_slice(&mac) {
                Ok(()) => Ok(Caller::Node(name.to_owned())),
                Err(_) => Err(Status::unauthenticated(BAD_CREDENTIAL)),
            };
        }
        if bool::from(Sha256::digest(token).ct_eq(&self.join)) {
            Ok(Caller::Joiner)
        } else {
            Err(Status::unauthenticated(BAD_CREDENTIAL))
        }
    }
}

const NO_TOKEN: &str = "the node service needs a node's client certificate, or a token (authorization: Bearer \
    <token>): the cluster's join token (<data-dir>/join-token on a replica) to register";
const BAD_CREDENTIAL: &str = "the join token or node credential is not valid for this cluster: a node that lost its \
    credential registers again with the join token once its old agent is gone";

impl Interceptor for NodeIdentity {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let authorization = request.metadata().get("authorization").map(|v| v.as_bytes());
        let caller = self.authenticate(request.extensions().get::<Transport>(), authorization)?;
        request.extensions_mut().insert(caller);
        Ok(request)
    }
}

/// The caller the interceptor authenticated.
pub fn caller<T>(request: &Request<T>) -> Result<Caller, Status> {
    request.extensions().get::<Caller>().cloned().ok_or_else(|| Status::unauthenticated(NO_TOKEN))
}

/// The node name a request may act for: the credential's, never the joiner's.
pub fn node_of<T>(request: &Request<T>) -> Result<String, Status> {
    match caller(request)? {
        Caller::Node(name) => Ok(name),
        Caller::Joiner => {
            Err(Status::permission_denied("the join token only registers nodes: use the node credential it returned"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bearer(token: &str) -> Vec<u8> {
        format!("Bearer {token}").into_bytes()
    }

    #[test]
    fn credentials_bind_a_name_and_the_join_token_only_joins() {
        let identity = NodeIdentity::new("join-token-0123456789", [7; 32]);
        let a = identity.credential("node-a");
        assert_eq!(identity.authenticate(None, Some(&bearer(&a))).unwrap(), Caller::Node("node-a".into()));
        assert_eq!(identity.authenticate(None, Some(&bearer("join-token-0123456789"))).unwrap(), Caller::Joiner);

        let forged = a.replace("node-a", "node-b");
        let other_cluster = NodeIdentity::new("join-token-0123456789", [8; 32]).credential("node-a");
        for bad in [&forged, &other_cluster, "join-token-012345678", "node:", "node:x", "node:x:zz", ""] {
            let code = identity.authenticate(None, Some(&bearer(bad))).unwrap_err().code();
            assert_eq!(code, tonic::Code::Unauthenticated, "{bad:?}");
        }
        assert_eq!(identity.authenticate(None, None).unwrap_err().code(), tonic::Code::Unauthenticated);
        assert_eq!(identity.authenticate(None, Some(a.as_bytes())).unwrap_err().code(), tonic::Code::Unauthenticated);
    }

    #[test]
    fn a_node_certificate_names_the_node_and_others_name_no_one() {
        use gitplane_proto::x509::{NODES_GROUP, REPLICAS_GROUP, Subject};
        let identity = NodeIdentity::new("join-token-0123456789", [7; 32]);
        let tls = |cn: &str, o: &str| {
            Transport::Tls(Some(Subject { common_name: Some(cn.into()), organizations: vec![o.into()] }))
        };
        let node = tls("system:node:n1", NODES_GROUP);
        assert_eq!(identity.authenticate(Some(&node), None).unwrap(), Caller::Node("n1".into()));
        // The certificate wins over a token for another name.
        let b = bearer(&identity.credential("n2"));
        assert_eq!(identity.authenticate(Some(&node), Some(&b)).unwrap(), Caller::Node("n1".into()));
        for other in [tls("gitplane replica", REPLICAS_GROUP), tls("system:node:n1", "x"), Transport::Tls(None)] {
            assert_eq!(identity.authenticate(Some(&other), None).unwrap_err().code(), tonic::Code::Unauthenticated);
        }
    }
}
