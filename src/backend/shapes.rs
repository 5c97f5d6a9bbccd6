//! The shapes of the layers the ops run: attention's and a Gated
//! DeltaNet's.

/// Attention of one layer.
#[derive(Clone, Copy, Debug)]
pub struct AttentionShape {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// Leading dims of each head RoPE rotates (`head_dim` unless partial).
    pub rotary_dim: usize,
    pub scale: f32,
    /// Sliding-window span in tokens (`i − W < j ≤ i`), `None` for full attention.
    pub window: Option<usize>,
}

/// A Gated DeltaNet layer's shape and its place in the recurrent-state pool.
pub use crate::geometry::DeltaNetShape;
