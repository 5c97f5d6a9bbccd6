//! AVX2 + FMA versions of the small ops (see `ops.rs` for their meaning).
//! Every function requires AVX2 and FMA; lengths were checked by the caller.

use std::arch::x86_64::*;

use super::formats::{bf16_to_f32, read_bf16};
use super::ops::{EXP_MAX, EXP_MIN, EXP_POLY, LN2_HI, LN2_LO, LOG2E, exp};

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

/// The same polynomial as `ops::exp`, 8 lanes at a time.
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
pub(super) unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len();
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    // SAFETY (loads): i + 32 <= n, resp. i + 8 <= n, inside both slices.
    while i + 32 <= n {
        for (j, acc_j) in acc.iter_mut().enumerate() {
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
pub(super) unsafe fn dot_bf16(a: &[f32], b: &[u16]) -> f32 {
    let n = a.len();
    let mut acc = [_mm256_setzero_ps(); 2];
    let mut i = 0;
    // SAFETY (loads): i + 16 <= n, resp. i + 8 <= n.
    while i + 16 <= n {
        for (j, acc_j) in acc.iter_mut().enumerate() {
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
pub(super) unsafe fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
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
pub(super) unsafe fn axpy_bf16(alpha: f32, x: &[u16], y: &mut [f32]) {
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
pub(super) unsafe fn add_sum_squares(r: &mut [f32], x: &[f32]) -> f32 {
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
pub(super) unsafe fn scale_by_weight(x: &[f32], inv: f32, w: &[u8], out: &mut [f32]) {
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
pub(super) unsafe fn silu_mul(gate: &[f32], up: &[f32], out: &mut [f32]) {
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
pub(super) unsafe fn softmax_inplace(x: &mut [f32]) {
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
