//! Helpers shared by the AVX2 matmul kernels (`avx2.rs` and `avx2_mxfp4.rs`):
//! the fixed lane reduction of their summation order, and the lockstep walk
//! over a work unit's rows.

use std::arch::x86_64::*;
use std::ops::Range;

/// Step 2 of the summation order (see avx2.rs): `((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7))`.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) fn reduce(v: __m256) -> f32 {
    let h = _mm256_hadd_ps(v, v); // l0+l1, l2+l3, .. | l4+l5, l6+l7, ..
    let h = _mm256_hadd_ps(h, h);
    _mm_cvtss_f32(_mm_add_ss(
        _mm256_castps256_ps128(h),
        _mm256_extractf128_ps(h, 1),
    ))
}

/// The unit's rows cut into `R` contiguous shares walked in lockstep (each
/// share one sequential stream the prefetchers follow): `set` gets row `i`
/// of every share, then `single` each leftover row.
#[inline]
pub(super) fn in_lockstep<const R: usize>(
    rows: Range<usize>,
    mut set: impl FnMut([usize; R]),
    mut single: impl FnMut(usize),
) {
    let share = rows.len() / R;
    for i in 0..share {
        set(std::array::from_fn(|s| rows.start + s * share + i));
    }
    for r in rows.start + R * share..rows.end {
        single(r);
    }
}
