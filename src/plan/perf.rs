//! The compute side of bench's performance model, checkable on paper:
//! FLOPs per prefill token from the geometry, and the published peaks of
//! the GPUs sparkrt targets. The byte side (weights and KV read per decode
//! step) is in `plan::memory`, with every other size.

use serde::Serialize;

use crate::geometry::{LayerAttention, ModelGeometry};

/// Weights one token is multiplied by, counted as parameters (not bytes:
/// a quantized weight is still one multiply-add): per layer the q, k, v, o
/// projections `2·q_dim·H + 2·kv_dim·H`; on MoE layers the router `E·H`
/// and `top_k` experts of `3·H·I` (gate, up, down; gpt_oss' fused gate_up
/// is the same `2·I·H`); on the others the dense MLP `3·H·I_dense`. Not
/// lm_head (prefill computes the last row's logits only), not the
/// embedding (a lookup), not biases or norms (O(H), negligible).
pub fn activated_params_per_token(g: &ModelGeometry) -> u64 {
    let h = g.hidden_size as u64;
    let q_dim = (g.num_attention_heads * g.head_dim) as u64;
    let kv_dim = (g.num_kv_heads * g.head_dim) as u64;
    let attention = 2 * q_dim * h + 2 * kv_dim * h;
    let moe = g.num_experts as u64 * h + g.top_k as u64 * 3 * h * g.moe_intermediate_size as u64;
    let dense = 3 * h * g.intermediate_size as u64;
    (0..g.num_layers)
        .map(|i| attention + if g.is_moe_layer(i) { moe } else { dense })
        .sum()
}

/// Keys a prompt token attends to, averaged over a causal prompt of `len`
/// tokens: token `t` (1-based) sees `min(t, window)`, so `(len + 1) / 2`
/// without a window (or `len ≤ window`), else
/// `(W·(W + 1)/2 + (len − W)·W) / len`.
pub fn mean_keys_attended(len: usize, window: Option<usize>) -> f64 {
    if len == 0 {
        return 0.0;
    }
    let (n, w) = (len as f64, window.unwrap_or(len).min(len) as f64);
    (w * (w + 1.0) / 2.0 + (n - w) * w) / n
}

/// Attention FLOPs of one prompt token, averaged over a prompt of `len`:
/// per layer `QKᵀ` and `PV` each take `2·heads·head_dim` FLOPs per key
/// attended ([`mean_keys_attended`], the window on sliding layers).
pub fn attention_flops_per_prompt_token(g: &ModelGeometry, len: usize) -> f64 {
    let per_key = 4.0 * (g.num_attention_heads * g.head_dim) as f64;
    (0..g.num_layers)
        .map(|i| {
            let window = match g.layer_attention(i) {
                LayerAttention::SlidingAttention => g.sliding_window,
                LayerAttention::FullAttention => None,
                // A Gated DeltaNet attends to no keys (its state's FLOPs are
                // in its projections' share).
                LayerAttention::LinearAttention => return 0.0,
            };
            per_key * mean_keys_attended(len, window)
        })
        .sum()
}

/// FLOPs of one prompt token at prompt length `len`: a multiply-add (2
/// FLOPs) per activated parameter, plus attention.
pub fn prefill_flops_per_token(g: &ModelGeometry, len: usize) -> f64 {
    2.0 * activated_params_per_token(g) as f64 + attention_flops_per_prompt_token(g, len)
}

/// A GPU's published peaks.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct DevicePeaks {
    /// The name it is matched by (a substring of the device's name).
    pub model: &'static str,
    pub bandwidth_bytes_s: f64,
    /// Dense (no 2:4 sparsity) BF16 tensor-core FLOP/s, FP32 accumulate.
    pub bf16_dense_flops: f64,
}

/// Peaks by device name, from NVIDIA's published figures; the first whose
/// `model` the name contains wins (so the longer names come first).
const PEAKS: [DevicePeaks; 5] = [
    // H200 NVL datasheet: 4.8 TB/s; BF16 1,671 TFLOPS with sparsity.
    DevicePeaks {
        model: "H200 NVL",
        bandwidth_bytes_s: 4.8e12,
        bf16_dense_flops: 835e12,
    },
    // H200 SXM datasheet: 4.8 TB/s HBM3e; BF16 tensor core 1,979 TFLOPS
    // "with sparsity", so 989 dense.
    DevicePeaks {
        model: "H200",
        bandwidth_bytes_s: 4.8e12,
        bf16_dense_flops: 989e12,
    },
    // H100 PCIe datasheet: 2.0 TB/s; 1,513 TFLOPS BF16 with sparsity.
    DevicePeaks {
        model: "H100 PCIe",
        bandwidth_bytes_s: 2.0e12,
        bf16_dense_flops: 756e12,
    },
    // H100 SXM datasheet: 3.35 TB/s; 1,979 TFLOPS BF16 with sparsity.
    DevicePeaks {
        model: "H100",
        bandwidth_bytes_s: 3.35e12,
        bf16_dense_flops: 989e12,
    },
    // DGX Spark (GB10) product page / hardware guide: 273 GB/s LPDDR5x and
    // "up to 1 PFLOP FP4 with sparsity"; NVIDIA publishes no BF16 figure.
    // Blackwell tensor cores halve the rate per doubling of operand width,
    // so 1000 / 2 (sparsity) / 4 (FP4 → BF16) = 125 TFLOPS dense BF16: an
    // upper bound (GeForce Blackwell runs BF16 with FP32 accumulate at half
    // that), so the fractions quoted against it are not flattered.
    DevicePeaks {
        model: "GB10",
        bandwidth_bytes_s: 273e9,
        bf16_dense_flops: 125e12,
    },
];

/// The published peaks of the GPU named `name` (as the driver reports it,
/// e.g. "NVIDIA H200" or "NVIDIA GB10"), if it is one in the table.
pub fn device_peaks(name: &str) -> Option<DevicePeaks> {
    PEAKS.iter().copied().find(|p| name.contains(p.model))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::geometry::{Architecture, Quantization};

    /// 2 layers (layer 1 MoE, layer 0 dense), H = 8, 2 heads and 1 KV head
    /// of 4, 4 experts of I = 2, top-2, dense I = 6.
    fn small() -> ModelGeometry {
        ModelGeometry {
            architecture: Architecture::Qwen3Moe,
            quantization: Quantization::Bf16,
            attention_quantization: Quantization::Bf16,
            lm_head_quantization: Quantization::Bf16,
            quant_group_size: 0,
            num_layers: 2,
            hidden_size: 8,
            num_attention_heads: 2,
            num_kv_heads: 1,
            head_dim: 4,
            vocab_size: 100,
            num_experts: 4,
            top_k: 2,
            moe_intermediate_size: 2,
            intermediate_size: 6,
            mlp_only_layers: vec![0],
            decoder_sparse_step: 1,
            tie_word_embeddings: false,
            attention_bias: false,
            layer_types: vec![
                LayerAttention::FullAttention,
                LayerAttention::SlidingAttention,
            ],
            sliding_window: Some(3),
            linear_num_key_heads: 0,
            linear_num_value_heads: 0,
            linear_key_head_dim: 0,
            linear_value_head_dim: 0,
            linear_conv_kernel_dim: 0,
            shared_expert_intermediate_size: 0,
            mtp_layers: 0,
        }
    }

    #[test]
    fn activated_params_by_hand() {
        // attention per layer: 2·8·8 + 2·4·8 = 192; dense layer 0: 3·8·6 =
        // 144; MoE layer 1: router 4·8 = 32 + 2 experts × 3·8·2 = 96.
        assert_eq!(
            activated_params_per_token(&small()),
            192 + 144 + 192 + 32 + 96
        );
    }

    #[test]
    fn mean_keys_by_hand() {
        assert_eq!(mean_keys_attended(4, None), 2.5); // (1+2+3+4)/4
        assert_eq!(mean_keys_attended(5, Some(3)), 2.4); // (1+2+3+3+3)/5
        assert_eq!(mean_keys_attended(2, Some(3)), 1.5);
        assert_eq!(mean_keys_attended(0, None), 0.0);
    }

    #[test]
    fn prefill_flops_by_hand() {
        let g = small();
        // 4·q_dim = 32 FLOPs per key; prompt of 5: full layer 3 keys on
        // average, sliding (window 3) 2.4.
        assert_eq!(
            attention_flops_per_prompt_token(&g, 5),
            32.0 * 3.0 + 32.0 * 2.4
        );
        let expected = 2.0 * 656.0 + 32.0 * 3.0 + 32.0 * 2.4;
        assert!((prefill_flops_per_token(&g, 5) - expected).abs() < 1e-9);
    }

    #[test]
    fn peaks_by_device_name() {
        assert_eq!(
            device_peaks("NVIDIA H200").map(|p| p.bandwidth_bytes_s),
            Some(4.8e12)
        );
        assert_eq!(
            device_peaks("NVIDIA H200").map(|p| p.bf16_dense_flops),
            Some(989e12)
        );
        assert_eq!(
            device_peaks("NVIDIA H200 NVL").map(|p| p.bf16_dense_flops),
            Some(835e12)
        );
        assert_eq!(
            device_peaks("NVIDIA H100 PCIe").map(|p| p.model),
            Some("H100 PCIe")
        );
        assert_eq!(
            device_peaks("NVIDIA H100 80GB HBM3").map(|p| p.model),
            Some("H100")
        );
        assert_eq!(
            device_peaks("NVIDIA GB10").map(|p| p.bandwidth_bytes_s),
            Some(273e9)
        );
        assert_eq!(device_peaks("NVIDIA GeForce RTX 4090"), None);
    }
}
