//! Oracles of the kernels' operations (matmul, RMSNorm, SiLU·mul, softmax)
//! that the tests hold every kernel to. Written straight from the
//! definitions, element by element, summing in f64 so that their own
//! rounding is far below the kernels'. Weight elements come from
//! [`weight_at`], i.e. from `crate::formats`.

use super::weights::weight_at;
use crate::checkpoint::linear::LinearWeight;
use crate::formats::read_bf16;

/// `out[t·rows + r] = Σ_c x[t·cols + c] · W[r, c]`, plus for each output the
/// sum of |x·w| (the scale a summation-order error bound is relative to).
pub fn matmul(x: &[f32], tokens: usize, w: &LinearWeight) -> (Vec<f32>, Vec<f32>) {
    let mut out = vec![0.0f32; tokens * w.rows];
    let mut magnitude = vec![0.0f32; tokens * w.rows];
    for r in 0..w.rows {
        let row: Vec<f64> = (0..w.cols).map(|c| weight_at(w, r, c) as f64).collect();
        for t in 0..tokens {
            let xs = &x[t * w.cols..(t + 1) * w.cols];
            let (mut sum, mut abs) = (0.0f64, 0.0f64);
            for (&wv, &xv) in row.iter().zip(xs) {
                sum += wv * xv as f64;
                abs += (wv * xv as f64).abs();
            }
            out[t * w.rows + r] = sum as f32;
            magnitude[t * w.rows + r] = abs as f32;
        }
    }
    (out, magnitude)
}

/// RMSNorm of each `dim`-long row: x · rsqrt(mean(x²) + eps) · w.
pub fn rmsnorm(x: &[f32], weight_bf16: &[u8], eps: f32) -> Vec<f32> {
    let dim = weight_bf16.len() / 2;
    let mut out = vec![0.0f32; x.len()];
    for (xs, os) in x.chunks(dim).zip(out.chunks_mut(dim)) {
        let mean = xs.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / dim as f64;
        let inv = 1.0 / (mean + eps as f64).sqrt();
        for (i, (o, &v)) in os.iter_mut().zip(xs).enumerate() {
            *o = (v as f64 * inv * read_bf16(weight_bf16, i) as f64) as f32;
        }
    }
    out
}

/// silu(g) · u.
pub fn silu_mul(gate: &[f32], up: &[f32]) -> Vec<f32> {
    gate.iter()
        .zip(up)
        .map(|(&g, &u)| {
            let g = g as f64;
            (g / (1.0 + (-g).exp()) * u as f64) as f32
        })
        .collect()
}

/// Softmax of a row.
pub fn softmax(x: &[f32]) -> Vec<f32> {
    let max = x.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
    let exps: Vec<f64> = x.iter().map(|&v| (v as f64 - max).exp()).collect();
    let sum: f64 = exps.iter().sum();
    exps.iter().map(|e| (e / sum) as f32).collect()
}
