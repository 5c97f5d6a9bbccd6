//! Small vector ops of the forward pass, f32 throughout. Each dispatches to
//! AVX2 on x86-64 when present; the portable versions are written with
//! fixed-width lanes so the compiler vectorises them (NEON on aarch64).
//!
//! `exp` (in `math.rs`) is a Cephes-style polynomial shared by the SIMD and
//! portable paths.
//!
//! Every function panics on mismatched lengths (a caller bug, not data).

pub use super::math::exp;
use super::portable::dot as dot_portable;
use super::portable::fmadd;
#[cfg(target_arch = "x86_64")]
use super::{isa::Isa, x86::avx2_ops};
use crate::formats::{bf16_to_f32, f32_to_bf16, read_bf16};

#[cfg(target_arch = "x86_64")]
#[inline]
fn avx2() -> bool {
    Isa::best().runs_avx2()
}

/// Runs `$simd` (an `unsafe` AVX2 call) when AVX2 is the best ISA, else `$portable`.
macro_rules! dispatch {
    ($simd:expr, $portable:expr) => {{
        #[cfg(target_arch = "x86_64")]
        if avx2() {
            // SAFETY: Isa::best() runs AVX2 only when AVX2 and FMA were detected.
            return unsafe { $simd };
        }
        $portable
    }};
}

/// Σ a·b.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot: lengths differ");
    dispatch!(avx2_ops::dot(a, b), dot_portable(a, b))
}

/// Σ a·b with `b` in bf16 (e.g. a key row of a bf16 KV cache).
pub fn dot_bf16(a: &[f32], b: &[u16]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot_bf16: lengths differ");
    dispatch!(avx2_ops::dot_bf16(a, b), {
        let mut acc = [0.0f32; 8];
        let mut ca = a.chunks_exact(8);
        let mut cb = b.chunks_exact(8);
        for (x, y) in (&mut ca).zip(&mut cb) {
            for l in 0..8 {
                acc[l] = fmadd(x[l], bf16_to_f32(y[l]), acc[l]);
            }
        }
        let tail: f32 = ca
            .remainder()
            .iter()
            .zip(cb.remainder())
            .fold(0.0, |s, (&x, &y)| fmadd(x, bf16_to_f32(y), s));
        acc.iter().sum::<f32>() + tail
    })
}

/// y += alpha · x.
pub fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "axpy: lengths differ");
    dispatch!(avx2_ops::axpy(alpha, x, y), {
        for (yv, &xv) in y.iter_mut().zip(x) {
            *yv = fmadd(alpha, xv, *yv);
        }
    })
}

/// y += alpha · x with `x` in bf16 (e.g. a value row of a bf16 KV cache).
pub fn axpy_bf16(alpha: f32, x: &[u16], y: &mut [f32]) {
    assert_eq!(x.len(), y.len(), "axpy_bf16: lengths differ");
    dispatch!(avx2_ops::axpy_bf16(alpha, x, y), {
        for (yv, &xv) in y.iter_mut().zip(x) {
            *yv = fmadd(alpha, bf16_to_f32(xv), *yv);
        }
    })
}

/// bf16 row → f32 row (exact).
pub fn bf16_to_f32_row(src: &[u16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "bf16_to_f32_row: lengths differ");
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = bf16_to_f32(s);
    }
}

/// f32 row → bf16 row, round to nearest even.
pub fn f32_to_bf16_row(src: &[f32], dst: &mut [u16]) {
    assert_eq!(src.len(), dst.len(), "f32_to_bf16_row: lengths differ");
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = f32_to_bf16(s);
    }
}

/// Index of the largest value (the first one on ties; NaNs are skipped).
/// Panics on an empty slice.
pub fn argmax(x: &[f32]) -> usize {
    assert!(!x.is_empty(), "argmax of nothing");
    let mut best = 0;
    let mut best_value = f32::NEG_INFINITY;
    let mut seen = false;
    for (i, &v) in x.iter().enumerate() {
        if v > best_value || (!seen && !v.is_nan()) {
            best = i;
            best_value = v;
            seen = true;
        }
    }
    best
}

/// RMSNorm of each `dim`-long row of `x` (dim = weight length):
/// `out = x · 1/sqrt(mean(x²) + eps) · w`, `w` as little-endian bf16 bytes.
pub fn rmsnorm(x: &[f32], weight_bf16: &[u8], eps: f32, out: &mut [f32]) {
    let dim = weight_bf16.len() / 2;
    assert!(
        dim > 0 && weight_bf16.len().is_multiple_of(2),
        "rmsnorm: bad weight"
    );
    assert!(
        x.len().is_multiple_of(dim) && x.len() == out.len(),
        "rmsnorm: bad lengths"
    );
    for (xs, os) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        let inv = inv_rms(sum_squares(xs), dim, eps);
        scale_by_weight(xs, inv, weight_bf16, os);
    }
}

/// Fused residual add and RMSNorm: `residual += x; out = rmsnorm(residual)`.
pub fn add_rmsnorm(residual: &mut [f32], x: &[f32], weight_bf16: &[u8], eps: f32, out: &mut [f32]) {
    assert_eq!(residual.len(), x.len(), "add_rmsnorm: lengths differ");
    let dim = weight_bf16.len() / 2;
    assert!(
        dim > 0 && residual.len().is_multiple_of(dim),
        "add_rmsnorm: bad lengths"
    );
    assert_eq!(out.len(), residual.len(), "add_rmsnorm: lengths differ");
    for ((rs, xs), os) in residual
        .chunks_exact_mut(dim)
        .zip(x.chunks_exact(dim))
        .zip(out.chunks_exact_mut(dim))
    {
        let ss = add_sum_squares(rs, xs);
        scale_by_weight(rs, inv_rms(ss, dim, eps), weight_bf16, os);
    }
}

fn inv_rms(sum_squares: f32, dim: usize, eps: f32) -> f32 {
    1.0 / (sum_squares / dim as f32 + eps).sqrt()
}

fn sum_squares(x: &[f32]) -> f32 {
    dispatch!(avx2_ops::dot(x, x), dot_portable(x, x))
}

/// r += x, returning Σ r² of the result.
fn add_sum_squares(r: &mut [f32], x: &[f32]) -> f32 {
    dispatch!(avx2_ops::add_sum_squares(r, x), {
        for (rv, &xv) in r.iter_mut().zip(x) {
            *rv += xv;
        }
        dot_portable(r, r)
    })
}

/// out = (x · inv) · w.
fn scale_by_weight(x: &[f32], inv: f32, weight_bf16: &[u8], out: &mut [f32]) {
    dispatch!(avx2_ops::scale_by_weight(x, inv, weight_bf16, out), {
        for (i, (o, &v)) in out.iter_mut().zip(x).enumerate() {
            *o = v * inv * read_bf16(weight_bf16, i);
        }
    })
}

/// out = silu(gate) · up, silu(g) = g / (1 + e^-g).
pub fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert!(
        gate.len() == up.len() && up.len() == out.len(),
        "silu_mul: lengths differ"
    );
    dispatch!(avx2_ops::silu_mul(gate, up, out), {
        for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
            *o = g / (1.0 + exp(-g)) * u;
        }
    })
}

/// Softmax of one row, in place (max subtracted first).
pub fn softmax_inplace(x: &mut [f32]) {
    if x.is_empty() {
        return;
    }
    dispatch!(avx2_ops::softmax_inplace(x), {
        let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let mut sum = 0.0f32;
        for v in x.iter_mut() {
            *v = exp(*v - max);
            sum += *v;
        }
        let inv = 1.0 / sum;
        for v in x.iter_mut() {
            *v *= inv;
        }
    })
}

/// Attention scores of a block of queries against a block of keys:
/// `out[i·nk + j] = scale · Σ_d q[i·hd + d] · k[j·hd + d]` (`q` is
/// `[nq, hd]`, `k` is `[nk, hd]`). Each score is summed in an order fixed by
/// `hd` alone, whatever `nq` and `nk`.
pub fn attention_scores(q: &[f32], k: &[f32], hd: usize, scale: f32, out: &mut [f32]) {
    assert!(
        hd > 0 && q.len().is_multiple_of(hd) && k.len().is_multiple_of(hd),
        "attention_scores: rows are not hd long"
    );
    let (nq, nk) = (q.len() / hd, k.len() / hd);
    assert_eq!(out.len(), nq * nk, "attention_scores: bad output length");
    if nk == 0 {
        return;
    }
    dispatch!(avx2_ops::attention_scores(q, k, hd, scale, out), {
        for (qs, os) in q.chunks_exact(hd).zip(out.chunks_exact_mut(nk)) {
            for (o, ks) in os.iter_mut().zip(k.chunks_exact(hd)) {
                *o = scale * dot_portable(qs, ks);
            }
        }
    })
}

/// `o[i·hd + d] += Σ_j p[i·nk + j] · v[j·hd + d]` (`p` is `[nq, nk]`, `v`
/// is `[nk, hd]`, `o` is `[nq, hd]`): every element summed over the keys in
/// order, one multiply-add at a time.
pub fn attention_values(p: &[f32], v: &[f32], hd: usize, o: &mut [f32]) {
    assert!(
        hd > 0 && v.len().is_multiple_of(hd) && o.len().is_multiple_of(hd),
        "attention_values: rows are not hd long"
    );
    let (nq, nk) = (o.len() / hd, v.len() / hd);
    assert_eq!(p.len(), nq * nk, "attention_values: bad weights length");
    dispatch!(avx2_ops::attention_values(p, v, hd, o), {
        for (os, ps) in o.chunks_exact_mut(hd).zip(p.chunks_exact(nk.max(1))) {
            for (&w, vs) in ps.iter().zip(v.chunks_exact(hd)) {
                for (ov, &vv) in os.iter_mut().zip(vs) {
                    *ov = fmadd(w, vv, *ov);
                }
            }
        }
    })
}

/// In place `s := e^(s − max)`, 0 where `s` is −∞ (a masked score), and
/// returns the sum in an order fixed by `s.len()`.
pub fn exp_block(s: &mut [f32], max: f32) -> f32 {
    dispatch!(avx2_ops::exp_block(s, max), {
        let mut acc = [0.0f32; 8];
        let mut chunks = s.chunks_exact_mut(8);
        for chunk in &mut chunks {
            for (a, x) in acc.iter_mut().zip(chunk.iter_mut()) {
                *x = if *x == f32::NEG_INFINITY {
                    0.0
                } else {
                    exp(*x - max)
                };
                *a += *x;
            }
        }
        let mut sum =
            ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
        for x in chunks.into_remainder() {
            *x = if *x == f32::NEG_INFINITY {
                0.0
            } else {
                exp(*x - max)
            };
            sum += *x;
        }
        sum
    })
}
