//! AVX2 + FMA versions of the small ops (see `kernels/ops.rs` for their meaning).
//! Every function requires AVX2 and FMA; lengths were checked by the caller.

use std::arch::x86_64::*;

use crate::backend::cpu::kernels::math::{EXP_MAX, EXP_MIN, EXP_POLY, LN2_HI, LN2_LO, LOG2E, exp};
use crate::formats::{bf16_to_f32, read_bf16};

#[target_feature(enable = "avx2,fma")]
#[inline]
fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)))
}

#[target_feature(enable = "avx2,fma")]
#[inline]
fn hmax(v: __m256) -> f32 {
    let s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_max_ss(s, _mm_shuffle_ps(s, s, 1)))
}

/// 8 bf16 at p → f32.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn load_bf16(p: *const u16) -> __m256 {
    // SAFETY: the caller guarantees 8 readable values at p.
    let words = unsafe { _mm_loadu_si128(p as *const __m128i) };
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(words), 16))
}

/// The same polynomial as `math::exp`, 8 lanes at a time.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn exp8(x: __m256) -> __m256 {
    let x = _mm256_min_ps(
        _mm256_max_ps(x, _mm256_set1_ps(EXP_MIN)),
        _mm256_set1_ps(EXP_MAX),
    );
    let n = _mm256_round_ps(
        _mm256_mul_ps(x, _mm256_set1_ps(LOG2E)),
        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
    );
    let r = _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(LN2_HI)));
    let r = _mm256_sub_ps(r, _mm256_mul_ps(n, _mm256_set1_ps(LN2_LO)));
    let mut p = _mm256_set1_ps(EXP_POLY[0]);
    for &c in &EXP_POLY[1..] {
        p = _mm256_add_ps(_mm256_mul_ps(p, r), _mm256_set1_ps(c));
    }
    let y = _mm256_add_ps(
        _mm256_add_ps(_mm256_mul_ps(_mm256_mul_ps(p, r), r), r),
        _mm256_set1_ps(1.0),
    );
    let two_n = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)),
        23,
    );
    _mm256_mul_ps(y, _mm256_castsi256_ps(two_n))
}

#[target_feature(enable = "avx2,fma")]
pub(in crate::backend::cpu::kernels) unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len();
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (j, acc_j) in acc.iter_mut().enumerate() {
            // SAFETY: i + 32 <= n, so both loads are inside both slices.
            let (x, y) = unsafe {
                (
                    _mm256_loadu_ps(pa.add(i + 8 * j)),
                    _mm256_loadu_ps(pb.add(i + 8 * j)),
                )
            };
            *acc_j = _mm256_fmadd_ps(x, y, *acc_j);
        }
        i += 32;
    }
    while i + 8 <= n {
        // SAFETY: i + 8 <= n, so both loads are inside both slices.
        let (x, y) = unsafe { (_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i))) };
        acc[0] = _mm256_fmadd_ps(x, y, acc[0]);
        i += 8;
    }
    let sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    let mut s = hsum(sum);
    for j in i..n {
        s += a[j] * b[j];
    }
    s
}

#[target_feature(enable = "avx2,fma")]
pub(in crate::backend::cpu::kernels) unsafe fn dot_bf16(a: &[f32], b: &[u16]) -> f32 {
    let n = a.len();
    let mut acc = [_mm256_setzero_ps(); 2];
    let mut i = 0;
    while i + 16 <= n {
        for (j, acc_j) in acc.iter_mut().enumerate() {
            // SAFETY: i + 16 <= n, so both loads are inside both slices.
            let (x, y) = unsafe {
                (
                    _mm256_loadu_ps(a.as_ptr().add(i + 8 * j)),
                    load_bf16(b.as_ptr().add(i + 8 * j)),
                )
            };
            *acc_j = _mm256_fmadd_ps(x, y, *acc_j);
        }
        i += 16;
    }
    while i + 8 <= n {
        // SAFETY: i + 8 <= n, so both loads are inside both slices.
        let (x, y) = unsafe {
            (
                _mm256_loadu_ps(a.as_ptr().add(i)),
                load_bf16(b.as_ptr().add(i)),
            )
        };
        acc[0] = _mm256_fmadd_ps(x, y, acc[0]);
        i += 8;
    }
    let mut s = hsum(_mm256_add_ps(acc[0], acc[1]));
    for j in i..n {
        s += a[j] * bf16_to_f32(b[j]);
    }
    s
}

#[target_feature(enable = "avx2,fma")]
pub(in crate::backend::cpu::kernels) unsafe fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
    let n = x.len();
    let va = _mm256_set1_ps(alpha);
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n, inside both slices.
        unsafe {
            let yp = y.as_mut_ptr().add(i);
            let v = _mm256_fmadd_ps(va, _mm256_loadu_ps(x.as_ptr().add(i)), _mm256_loadu_ps(yp));
            _mm256_storeu_ps(yp, v);
        }
        i += 8;
    }
    for j in i..n {
        y[j] = alpha.mul_add(x[j], y[j]);
    }
}

#[target_feature(enable = "avx2,fma")]
pub(in crate::backend::cpu::kernels) unsafe fn axpy_bf16(alpha: f32, x: &[u16], y: &mut [f32]) {
    let n = x.len();
    let va = _mm256_set1_ps(alpha);
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n, inside both slices.
        unsafe {
            let yp = y.as_mut_ptr().add(i);
            let v = _mm256_fmadd_ps(va, load_bf16(x.as_ptr().add(i)), _mm256_loadu_ps(yp));
            _mm256_storeu_ps(yp, v);
        }
        i += 8;
    }
    for j in i..n {
        y[j] = alpha.mul_add(bf16_to_f32(x[j]), y[j]);
    }
}

/// r += x; returns Σ r².
#[target_feature(enable = "avx2,fma")]
pub(in crate::backend::cpu::kernels) unsafe fn add_sum_squares(r: &mut [f32], x: &[f32]) -> f32 {
    let n = r.len();
    let mut acc = [_mm256_setzero_ps(); 2];
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n, inside both slices.
        unsafe {
            let rp = r.as_mut_ptr().add(i);
            let v = _mm256_add_ps(_mm256_loadu_ps(rp), _mm256_loadu_ps(x.as_ptr().add(i)));
            _mm256_storeu_ps(rp, v);
            acc[(i / 8) % 2] = _mm256_fmadd_ps(v, v, acc[(i / 8) % 2]);
        }
        i += 8;
    }
    let mut s = hsum(_mm256_add_ps(acc[0], acc[1]));
    for j in i..n {
        r[j] += x[j];
        s += r[j] * r[j];
    }
    s
}

/// out = (x · inv) · w, w as bf16 bytes (possibly misaligned).
#[target_feature(enable = "avx2,fma")]
pub(in crate::backend::cpu::kernels) unsafe fn scale_by_weight(
    x: &[f32],
    inv: f32,
    w: &[u8],
    out: &mut [f32],
) {
    let n = x.len();
    let vinv = _mm256_set1_ps(inv);
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n; w holds 2n bytes; load_bf16 reads unaligned.
        unsafe {
            let wv = load_bf16(w.as_ptr().add(2 * i) as *const u16);
            let v = _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x.as_ptr().add(i)), vinv), wv);
            _mm256_storeu_ps(out.as_mut_ptr().add(i), v);
        }
        i += 8;
    }
    for j in i..n {
        out[j] = x[j] * inv * read_bf16(w, j);
    }
}

#[target_feature(enable = "avx2,fma")]
pub(in crate::backend::cpu::kernels) unsafe fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
    let n = gate.len();
    let one = _mm256_set1_ps(1.0);
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n, inside all three slices.
        unsafe {
            let g = _mm256_loadu_ps(gate.as_ptr().add(i));
            let e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
            let s = _mm256_div_ps(g, _mm256_add_ps(one, e));
            let v = _mm256_mul_ps(s, _mm256_loadu_ps(up.as_ptr().add(i)));
            _mm256_storeu_ps(out.as_mut_ptr().add(i), v);
        }
        i += 8;
    }
    for j in i..n {
        out[j] = gate[j] / (1.0 + exp(-gate[j])) * up[j];
    }
}

#[target_feature(enable = "avx2,fma")]
pub(in crate::backend::cpu::kernels) unsafe fn softmax_inplace(x: &mut [f32]) {
    let n = x.len();
    let p = x.as_mut_ptr();
    let mut vmax = _mm256_set1_ps(f32::NEG_INFINITY);
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n.
        vmax = _mm256_max_ps(vmax, unsafe { _mm256_loadu_ps(p.add(i)) });
        i += 8;
    }
    let mut max = hmax(vmax);
    for &v in &x[i..] {
        max = max.max(v);
    }
    let vm = _mm256_set1_ps(max);
    let mut vsum = _mm256_setzero_ps();
    i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n.
        unsafe {
            let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p.add(i)), vm));
            _mm256_storeu_ps(p.add(i), e);
            vsum = _mm256_add_ps(vsum, e);
        }
        i += 8;
    }
    let mut sum = hsum(vsum);
    for v in &mut x[i..] {
        *v = exp(*v - max);
        sum += *v;
    }
    let inv = _mm256_set1_ps(1.0 / sum);
    i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n.
        unsafe { _mm256_storeu_ps(p.add(i), _mm256_mul_ps(_mm256_loadu_ps(p.add(i)), inv)) };
        i += 8;
    }
    let inv = 1.0 / sum;
    for v in &mut x[i..] {
        *v *= inv;
    }
}

/// `((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))` of four vectors at once.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn reduce4(a: __m256, b: __m256, c: __m256, d: __m256) -> __m128 {
    let abcd = _mm256_hadd_ps(_mm256_hadd_ps(a, b), _mm256_hadd_ps(c, d));
    _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1))
}

/// Attention scores (see `ops::attention_scores`): tiles of 3 queries × 4
/// keys, 8-lane accumulators over the head dimension reduced by `reduce4`'s
/// tree (a lone score takes the same tree), the dimensions past the last
/// vector added one by one, then the scale.
#[target_feature(enable = "avx2,fma")]
pub(in crate::backend::cpu::kernels) unsafe fn attention_scores(
    q: &[f32],
    k: &[f32],
    hd: usize,
    scale: f32,
    out: &mut [f32],
) {
    let (nq, nk) = (q.len() / hd, k.len() / hd);
    let mut qi = 0;
    while qi < nq {
        let qn = (nq - qi).min(3);
        let mut kj = 0;
        while kj < nk {
            let kn = (nk - kj).min(4);
            // SAFETY: queries qi..qi+qn and keys kj..kj+kn exist.
            unsafe {
                match qn {
                    3 => scores_tile::<3>(q, k, hd, scale, qi, kj, kn, nk, out),
                    2 => scores_tile::<2>(q, k, hd, scale, qi, kj, kn, nk, out),
                    _ => scores_tile::<1>(q, k, hd, scale, qi, kj, kn, nk, out),
                }
            }
            kj += kn;
        }
        qi += qn;
    }
}

/// `Q` queries from `qi` × keys `kj..kj + kn` (kn ≤ 4; missing keys are
/// computed on key `kj` and dropped).
#[target_feature(enable = "avx2,fma")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn scores_tile<const Q: usize>(
    q: &[f32],
    k: &[f32],
    hd: usize,
    scale: f32,
    qi: usize,
    kj: usize,
    kn: usize,
    nk: usize,
    out: &mut [f32],
) {
    let vec_end = hd / 8 * 8;
    let key = |j: usize| k[(kj + j.min(kn - 1)) * hd..].as_ptr();
    let keys = [key(0), key(1), key(2), key(3)];
    let queries: [*const f32; Q] = std::array::from_fn(|i| q[(qi + i) * hd..].as_ptr());
    let mut acc = [[_mm256_setzero_ps(); 4]; Q];
    let mut d = 0;
    while d < vec_end {
        // SAFETY: d + 8 <= hd: inside every query and key row.
        let kv: [__m256; 4] = std::array::from_fn(|j| unsafe { _mm256_loadu_ps(keys[j].add(d)) });
        for (acc_i, qp) in acc.iter_mut().zip(&queries) {
            // SAFETY: as above.
            let qv = unsafe { _mm256_loadu_ps(qp.add(d)) };
            for (a, kvj) in acc_i.iter_mut().zip(&kv) {
                *a = _mm256_fmadd_ps(qv, *kvj, *a);
            }
        }
        d += 8;
    }
    for (i, acc_i) in acc.iter().enumerate() {
        let mut sums = [0.0f32; 4];
        // SAFETY: sums holds 4 floats.
        unsafe {
            _mm_storeu_ps(
                sums.as_mut_ptr(),
                reduce4(acc_i[0], acc_i[1], acc_i[2], acc_i[3]),
            )
        };
        for (j, s) in sums.iter().enumerate().take(kn) {
            let mut s = *s;
            for dd in vec_end..hd {
                // SAFETY: dd < hd.
                s += unsafe { *queries[i].add(dd) * *keys[j].add(dd) };
            }
            out[(qi + i) * nk + kj + j] = scale * s;
        }
    }
}

/// `o += p · v` for a block (see `ops::attention_values`): tiles of 4
/// queries × 16 dimensions held in registers over all keys, each element
/// summed over the keys in order by fused multiply-add.
#[target_feature(enable = "avx2,fma")]
pub(in crate::backend::cpu::kernels) unsafe fn attention_values(
    p: &[f32],
    v: &[f32],
    hd: usize,
    o: &mut [f32],
) {
    let nq = o.len() / hd;
    let nk = v.len() / hd;
    let mut qi = 0;
    while qi < nq {
        let qn = (nq - qi).min(4);
        // SAFETY: queries qi..qi+qn exist.
        unsafe {
            match qn {
                4 => values_tile::<4>(p, v, hd, nk, qi, o),
                3 => values_tile::<3>(p, v, hd, nk, qi, o),
                2 => values_tile::<2>(p, v, hd, nk, qi, o),
                _ => values_tile::<1>(p, v, hd, nk, qi, o),
            }
        }
        qi += qn;
    }
}

#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn values_tile<const Q: usize>(
    p: &[f32],
    v: &[f32],
    hd: usize,
    nk: usize,
    qi: usize,
    o: &mut [f32],
) {
    let op = o[qi * hd..].as_mut_ptr();
    let pp = p[qi * nk..].as_ptr();
    let vp = v.as_ptr();
    let mut d = 0;
    while d + 16 <= hd {
        // SAFETY: d + 16 <= hd: inside every output row and value row.
        unsafe {
            let mut acc: [[__m256; 2]; Q] = std::array::from_fn(|i| {
                [
                    _mm256_loadu_ps(op.add(i * hd + d)),
                    _mm256_loadu_ps(op.add(i * hd + d + 8)),
                ]
            });
            for j in 0..nk {
                let v0 = _mm256_loadu_ps(vp.add(j * hd + d));
                let v1 = _mm256_loadu_ps(vp.add(j * hd + d + 8));
                for (i, acc_i) in acc.iter_mut().enumerate() {
                    let w = _mm256_broadcast_ss(&*pp.add(i * nk + j));
                    acc_i[0] = _mm256_fmadd_ps(w, v0, acc_i[0]);
                    acc_i[1] = _mm256_fmadd_ps(w, v1, acc_i[1]);
                }
            }
            for (i, acc_i) in acc.iter().enumerate() {
                _mm256_storeu_ps(op.add(i * hd + d), acc_i[0]);
                _mm256_storeu_ps(op.add(i * hd + d + 8), acc_i[1]);
            }
        }
        d += 16;
    }
    while d + 8 <= hd {
        // SAFETY: d + 8 <= hd.
        unsafe {
            let mut acc: [__m256; Q] = std::array::from_fn(|i| _mm256_loadu_ps(op.add(i * hd + d)));
            for j in 0..nk {
                let v0 = _mm256_loadu_ps(vp.add(j * hd + d));
                for (i, a) in acc.iter_mut().enumerate() {
                    *a = _mm256_fmadd_ps(_mm256_broadcast_ss(&*pp.add(i * nk + j)), v0, *a);
                }
            }
            for (i, a) in acc.iter().enumerate() {
                _mm256_storeu_ps(op.add(i * hd + d), *a);
            }
        }
        d += 8;
    }
    for dd in d..hd {
        for i in 0..Q {
            // SAFETY: dd < hd, query qi + i and every key exist.
            unsafe {
                let mut acc = *op.add(i * hd + dd);
                for j in 0..nk {
                    acc = (*pp.add(i * nk + j)).mul_add(*vp.add(j * hd + dd), acc);
                }
                *op.add(i * hd + dd) = acc;
            }
        }
    }
}

/// `s := exp(s − max)` (0 where s is −∞), returning the sum: 8-lane
/// partial sums in order, `reduce4`'s tree, then the tail one by one.
#[target_feature(enable = "avx2,fma")]
pub(in crate::backend::cpu::kernels) unsafe fn exp_block(s: &mut [f32], max: f32) -> f32 {
    let n = s.len();
    let p = s.as_mut_ptr();
    let vm = _mm256_set1_ps(max);
    let minus_inf = _mm256_set1_ps(f32::NEG_INFINITY);
    let mut acc = _mm256_setzero_ps();
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n.
        unsafe {
            let x = _mm256_loadu_ps(p.add(i));
            let live = _mm256_cmp_ps::<_CMP_NEQ_OQ>(x, minus_inf);
            let e = _mm256_and_ps(exp8(_mm256_sub_ps(x, vm)), live);
            _mm256_storeu_ps(p.add(i), e);
            acc = _mm256_add_ps(acc, e);
        }
        i += 8;
    }
    let zero = _mm256_setzero_ps();
    let mut sum = _mm_cvtss_f32(reduce4(acc, zero, zero, zero));
    for x in &mut s[i..] {
        *x = if *x == f32::NEG_INFINITY {
            0.0
        } else {
            exp(*x - max)
        };
        sum += *x;
    }
    sum
}
