//! Small vector ops of the forward pass.
pub use super::portable::dot;
