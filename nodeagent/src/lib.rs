pub mod agent;
pub mod cni;
pub mod containerd;
pub mod cri;
pub mod images;
pub mod node;
pub mod proxy;
pub mod runtime;
mod template;
