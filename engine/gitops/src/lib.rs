//! The GitOps side of the control plane: the source controller that turns each Application's
//! branch into stored objects, Git over HTTP with the pre-receive verdicts that judge a push
//! before it lands, webhooks and the mirrors they refresh, `gitplane diff` and the offline
//! checks, and what `gitplane up` puts in Git on first start.

pub mod bootstrap;
pub mod diff;
pub mod githttp;
pub mod metrics;
pub mod mirror;
pub mod offline;
pub mod prereceive;
pub mod source;
pub mod webhook;
