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
//!
//! Then every call of a node is admitted against the stored Node ([`admit`]), as Kubernetes'
//! node authorizer consults its graph: the Node must still exist (a node removed from the
//! cluster is refused whatever it holds, and its streams end), a certificate must carry that
//! Node's uid (one issued to an earlier Node of the same name counts for nothing), and over TLS
//! a credential counts only until the node has been issued certificates over TLS
//! ([`CERTIFICATES_ANNOTATION`]): a stolen credential cannot outlive the migration.

use gitplane_apiserver::listener::Transport;
use hmac::{Hmac, Mac};
use k8s_openapi::api::core::v1::Node;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tonic::{Request, Status, service::Interceptor};

const NODE_PREFIX: &str = "node:";

/// Set on a Node once a registration over TLS issued it certificates: from then on its
/// credential is refused over TLS.
pub const CERTIFICATES_ANNOTATION: &str = "gitplane.io/client-certificates";

/// The authenticated caller of a node service request (a request extension).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Caller {
    /// Holds the join token: may register a new node (or one whose agent is gone).
    Joiner,
    /// Proves to be this node.
    Node { name: String, proof: Proof },
}

/// How a node proved its name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Proof {
    /// A client certificate of the cluster CA, with the uid of the Node it was issued for (none
    /// in certificates issued before they carried it).
    Certificate { uid: Option<String> },
    /// The node credential, and whether it came over TLS.
    Credential { over_tls: bool },
}

impl Caller {
    #[cfg(test)]
    pub fn node(name: &str) -> Caller {
        Caller::Node { name: name.into(), proof: Proof::Credential { over_tls: false } }
    }
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
        if let Some(subject) = transport.and_then(Transport::client)
            && let Some(node) = subject.node()
        {
            return Ok(Caller::Node { name: node.to_owned(), proof: Proof::Certificate { uid: subject.uid.clone() } });
        }
        let over_tls = matches!(transport, Some(Transport::Tls(_)));
        let token =
            authorization.and_then(|v| v.strip_prefix(b"Bearer ")).ok_or_else(|| Status::unauthenticated(NO_TOKEN))?;
        if let Some(rest) = token.strip_prefix(NODE_PREFIX.as_bytes())
            && let Some(colon) = rest.iter().rposition(|b| *b == b':')
        {
            let (name, mac) = (&rest[..colon], &rest[colon + 1..]);
            let name = std::str::from_utf8(name).map_err(|_| Status::unauthenticated(BAD_CREDENTIAL))?;
            let mac = hex::decode(mac).map_err(|_| Status::unauthenticated(BAD_CREDENTIAL))?;
            return match self.mac(name).verify_slice(&mac) {
                Ok(()) => Ok(Caller::Node { name: name.to_owned(), proof: Proof::Credential { over_tls } }),
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

/// The node name a request may act for, and its proof: never the joiner's.
pub fn node_of<T>(request: &Request<T>) -> Result<(String, Proof), Status> {
    match caller(request)? {
        Caller::Node { name, proof } => Ok((name, proof)),
        Caller::Joiner => {
            Err(Status::permission_denied("the join token only registers nodes: use the node credential it returned"))
        }
    }
}

/// Whether a node that proved its name with `proof` may act as `node` (the stored Node of that
/// name, if any). `registering`: a certificate from before certificates carried a uid may still
/// register (and so trade itself for one that does), and nothing else.
pub fn admit(name: &str, proof: &Proof, node: Option<&Node>, registering: bool) -> Result<(), Status> {
    let Some(node) = node else {
        return Err(Status::unauthenticated(format!(
            "node {name} is not part of the cluster (removed?): its certificates and credential are no longer \
             accepted; join again with the join token"
        )));
    };
    let uid = node.metadata.uid.as_deref();
    match proof {
        Proof::Certificate { uid: Some(issued) } if Some(issued.as_str()) != uid => {
            Err(Status::unauthenticated(format!(
                "this certificate was issued to an earlier node {name} (removed since): join again with the join token"
            )))
        }
        Proof::Certificate { uid: None } if !registering => Err(Status::unauthenticated(format!(
            "this certificate of node {name} names no Node uid (issued before they did): register again to renew it"
        ))),
        Proof::Credential { over_tls: true }
            if node.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(CERTIFICATES_ANNOTATION)) =>
        {
            Err(Status::unauthenticated(format!(
                "node {name} holds client certificates: its credential is no longer accepted over TLS"
            )))
        }
        _ => Ok(()),
    }
}

/// Whether store event `event` removes node `name` (its Node deleted): its streams then end.
pub fn removes(event: &gitplane_store::Event, name: &str) -> bool {
    event.event_type == gitplane_store::EventType::Deleted && event.key.kind == "Node" && event.key.name == name
}

/// The error that ends the stream of a node whose Node was deleted.
pub fn removed(name: &str) -> Status {
    Status::unauthenticated(format!("node {name} was removed from the cluster"))
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
        assert_eq!(identity.authenticate(None, Some(&bearer(&a))).unwrap(), Caller::node("node-a"));
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
            let uid = Some("u1".into());
            Transport::Tls(Some(Subject { common_name: Some(cn.into()), organizations: vec![o.into()], uid }))
        };
        let node = tls("system:node:n1", NODES_GROUP);
        let n1 = Caller::Node { name: "n1".into(), proof: Proof::Certificate { uid: Some("u1".into()) } };
        assert_eq!(identity.authenticate(Some(&node), None).unwrap(), n1);
        // The certificate wins over a token for another name.
        let b = bearer(&identity.credential("n2"));
        assert_eq!(identity.authenticate(Some(&node), Some(&b)).unwrap(), n1);
        // A credential says whether it came over TLS.
        let b = bearer(&identity.credential("n2"));
        let over_tls = Caller::Node { name: "n2".into(), proof: Proof::Credential { over_tls: true } };
        assert_eq!(identity.authenticate(Some(&Transport::Tls(None)), Some(&b)).unwrap(), over_tls);
        for other in [tls("gitplane replica", REPLICAS_GROUP), tls("system:node:n1", "x"), Transport::Tls(None)] {
            assert_eq!(identity.authenticate(Some(&other), None).unwrap_err().code(), tonic::Code::Unauthenticated);
        }
    }

    #[test]
    fn only_a_current_node_is_admitted() {
        let stored = |annotated: bool| {
            let mut node = Node::default();
            node.metadata.uid = Some("u1".into());
            if annotated {
                node.metadata.annotations = Some([(CERTIFICATES_ANNOTATION.to_owned(), "true".to_owned())].into());
            }
            node
        };
        let certificate = |uid: Option<&str>| Proof::Certificate { uid: uid.map(Into::into) };
        let credential = |over_tls| Proof::Credential { over_tls };
        let (plain, annotated) = (stored(false), stored(true));
        let cases = [
            (certificate(Some("u1")), Some(&annotated), false, true),
            (certificate(Some("u0")), Some(&annotated), false, false),
            (certificate(Some("u1")), None, false, false),
            (certificate(None), Some(&annotated), false, false),
            (certificate(None), Some(&annotated), true, true),
            (certificate(None), None, true, false),
            (credential(true), Some(&plain), false, true),
            (credential(true), Some(&annotated), true, false),
            (credential(false), Some(&annotated), false, true),
            (credential(false), None, true, false),
        ];
        for (proof, node, registering, admitted) in cases {
            let result = admit("n1", &proof, node, registering);
            assert_eq!(
                result.is_ok(),
                admitted,
                "{proof:?} {:?} registering {registering}: {result:?}",
                node.map(|n| &n.metadata)
            );
            if let Err(status) = result {
                assert_eq!(status.code(), tonic::Code::Unauthenticated);
            }
        }
    }
}
