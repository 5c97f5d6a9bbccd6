//! A MoE layer's experts as the backends receive them: the weights read
//! from the checkpoint, the router and the activation between projections.

use crate::checkpoint::linear::{LinearWeight, VectorWeight};

/// How a layer's router turns logits into expert weights.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RouterKind {
    /// qwen3_moe: softmax over all experts, top-k, optionally renormalised.
    SoftmaxTopK { renormalize: bool },
    /// gpt_oss: top-k logits, softmax over those k.
    TopKSoftmax,
}

/// The nonlinearity between an expert's gate/up and down projections.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ExpertActivation {
    /// qwen3_moe: `silu(gate) · up`.
    SiluMul,
    /// gpt_oss: `gate = min(gate, limit)`, `up = clamp(up, −limit, limit)`,
    /// `(up + 1) · gate · sigmoid(alpha · gate)`.
    ClampedSwiglu { limit: f32, alpha: f32 },
}

/// Gate and up projections of a layer's experts.
pub enum GateUp<'w> {
    /// Separate `[I, H]` gate and up matrices per expert (qwen3_moe).
    Split {
        gate: Vec<LinearWeight<'w>>,
        up: Vec<LinearWeight<'w>>,
    },
    /// One `[2I, H]` matrix per expert, gate rows even and up rows odd, with
    /// a `[2I]` bias (gpt_oss).
    Interleaved {
        gate_up: Vec<LinearWeight<'w>>,
        bias: Vec<VectorWeight<'w>>,
    },
}

/// Everything one MoE layer's experts need, as read from the checkpoint.
pub struct ExpertsSpec<'w> {
    pub gate_up: GateUp<'w>,
    /// `[H, I]` per expert.
    pub down: Vec<LinearWeight<'w>>,
    /// `[H]` per expert (gpt_oss), else empty.
    pub down_bias: Vec<VectorWeight<'w>>,
    pub activation: ExpertActivation,
    pub hidden_size: usize,
    pub intermediate_size: usize,
}

impl ExpertsSpec<'_> {
    pub fn num_experts(&self) -> usize {
        self.down.len()
    }
}
