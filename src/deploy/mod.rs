//! Deploying sparkrt: the objects a cluster runs it from.

pub mod k8s;
pub mod node;
