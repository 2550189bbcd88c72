//! The node's networking, fed from the control plane's view of the network ([`view`]): Service
//! rules ([`proxy`]), NetworkPolicy ([`policy`]), cluster DNS ([`dns`]), the Ingress data plane
//! ([`ingress`]), routes to other nodes' Pods and the masquerade ([`routes`]), the CNI
//! configuration ([`cni`]), and the one owner of packet-filter programs ([`netfilter`]).

pub mod cidr;
pub mod cni;
pub mod dns;
pub mod follow;
pub mod ingress;
pub mod netfilter;
pub mod policy;
pub mod proxy;
pub mod routes;
pub mod view;
