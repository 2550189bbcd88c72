pub mod agent;
pub mod cni;
pub mod containerd;
pub mod cri;
pub mod dns;
pub mod images;
pub mod node;
pub mod runtime;
mod template;
