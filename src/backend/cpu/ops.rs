//! Element-wise and per-row ops of the forward pass (f32 math; the compiler
//! vectorises these loops, and they are a small share of a step's time).

use super::kernels;
use crate::checkpoint::linear::{VectorData, VectorWeight};

/// `out = x · rsqrt(mean(x²) + eps) · w`, the sum of squares in f32 as
/// transformers computes it (SIMD kernel for bf16 weights).
pub fn rmsnorm(x: &[f32], w: &VectorWeight<'_>, eps: f32, out: &mut [f32]) {
    if let (VectorData::Bf16(bytes), 0.0) = (w.data, w.offset) {
        return kernels::ops::rmsnorm(x, bytes, eps, out);
    }
    let scale = inverse_rms(x, eps);
    for (i, (o, &v)) in out.iter_mut().zip(x).enumerate() {
        *o = v * scale * w.get(i);
    }
}

/// `residual += delta; out = rmsnorm(residual) · w`.
pub fn add_rmsnorm(
    residual: &mut [f32],
    delta: &[f32],
    w: &VectorWeight<'_>,
    eps: f32,
    out: &mut [f32],
) {
    if let (VectorData::Bf16(bytes), 0.0) = (w.data, w.offset) {
        return kernels::ops::add_rmsnorm(residual, delta, bytes, eps, out);
    }
    for (r, d) in residual.iter_mut().zip(delta) {
        *r += d;
    }
    rmsnorm(residual, w, eps, out);
}

/// [`rmsnorm`] in place (q/k norm of one head).
pub fn rmsnorm_in_place(x: &mut [f32], w: &VectorWeight<'_>, eps: f32) {
    let scale = inverse_rms(x, eps);
    for (i, v) in x.iter_mut().enumerate() {
        *v = *v * scale * w.get(i);
    }
}

fn inverse_rms(x: &[f32], eps: f32) -> f32 {
    let sum_sq: f32 = x.iter().map(|v| v * v).sum();
    1.0 / (sum_sq / x.len() as f32 + eps).sqrt()
}

/// Neox rotary embedding of one head: halves `(a, b)` become
/// `(a·cos − b·sin, b·cos + a·sin)`.
pub fn rotate_half(head: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = head.len() / 2;
    let (a, b) = head.split_at_mut(half);
    for j in 0..half {
        let (x1, x2) = (a[j], b[j]);
        a[j] = x1 * cos[j] - x2 * sin[j];
        b[j] = x2 * cos[j] + x1 * sin[j];
    }
}

/// `gate = silu(gate) · up`.
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = silu(*g) * u;
    }
}

#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `x = rmsnorm(x) · w · silu(z)` of one group (transformers'
/// RMSNormGated: the norm before the gate).
pub fn gated_rmsnorm(x: &mut [f32], z: &[f32], w: &VectorWeight<'_>, eps: f32) {
    let scale = inverse_rms(x, eps);
    for (i, (v, &g)) in x.iter_mut().zip(z).enumerate() {
        *v = *v * scale * w.get(i) * silu(g);
    }
}

/// Adds `bias` to every row of `out` (rows of `bias.len`).
pub fn add_bias(out: &mut [f32], bias: &VectorWeight<'_>) {
    for row in out.chunks_mut(bias.len) {
        for (i, o) in row.iter_mut().enumerate() {
            *o += bias.get(i);
        }
    }
}
