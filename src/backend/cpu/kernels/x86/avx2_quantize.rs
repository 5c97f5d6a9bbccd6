//! The AVX2 activation quantizer of the integer FP4 kernels (`avx2_fp4.rs`):
//! `quantize::quantize_row` bit for bit.

use std::arch::x86_64::*;

use crate::backend::cpu::kernels::quantize::{BLOCK, block_scale, code_position, scale_position};

/// `quantize::quantize_row` with AVX2, bit for bit: the same scale, the same
/// rounding (`vcvtps2dq` rounds to nearest even, as the scalar rounder
/// does), the same saturation (`vpackssdw`, as the scalar `as i16`) and the
/// same layout.
///
/// # Safety
///
/// The CPU supports AVX2 and FMA (the caller checks
/// `Isa::Avx2.is_available()`). That is the only obligation for memory: every
/// access is bounds-checked against the slices or inside `x`'s whole blocks.
/// For the result to be right, `x.len()` is a multiple of 32, `codes` as long
/// as `x` and `scales` holding `x.len() / 32` values (a short `codes` or
/// `scales` panics).
#[target_feature(enable = "avx2,fma")]
pub(in crate::backend::cpu::kernels) unsafe fn quantize_row(
    x: &[f32],
    codes: &mut [i16],
    scales: &mut [f32],
) {
    let blocks = x.len() / BLOCK;
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
    // Within each 128-bit lane of 8 int16 (a, a+1, .., a+7): a a+4 | a+2
    // a+6 | a+1 a+5 | a+3 a+7, i.e. one 32-bit pair per group.
    let by_group = _mm256_broadcastsi128_si256(_mm_setr_epi8(
        0, 1, 8, 9, 4, 5, 12, 13, 2, 3, 10, 11, 6, 7, 14, 15,
    ));
    let pairs_in_order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for b in 0..blocks {
        // SAFETY: block b lies inside x.
        let v: [__m256; 4] =
            std::array::from_fn(|k| unsafe { _mm256_loadu_ps(x.as_ptr().add(b * BLOCK + 8 * k)) });
        let max = v.iter().fold(_mm256_setzero_ps(), |m, &v| {
            _mm256_max_ps(m, _mm256_and_ps(v, abs_mask))
        });
        let nan = v.iter().fold(_mm256_setzero_ps(), |n, &v| {
            _mm256_or_ps(n, _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v))
        });
        let max = _mm_max_ps(_mm256_castps256_ps128(max), _mm256_extractf128_ps(max, 1));
        let max = _mm_max_ps(max, _mm_movehl_ps(max, max));
        let max = _mm_max_ss(max, _mm_shuffle_ps::<1>(max, max));
        let amax = if _mm256_movemask_ps(nan) != 0 {
            f32::NAN
        } else {
            _mm_cvtss_f32(max)
        };
        let scale = block_scale(amax);
        scales[scale_position(blocks, b)] = scale;
        let start = code_position(blocks, b, 0);
        let lone = b + 1 == blocks && blocks % 2 == 1;
        let stride = if lone { 8 } else { 16 };
        let dst = codes[start..start + 3 * stride + 8].as_mut_ptr();
        if scale.is_nan() {
            for g in 0..4 {
                // SAFETY: group g's 8 codes lie inside the slice above.
                unsafe {
                    _mm_storeu_si128(dst.add(g * stride) as *mut __m128i, _mm_setzero_si128())
                };
            }
            continue;
        }
        let inverse = _mm256_set1_ps(1.0 / scale);
        let q: [__m256i; 4] =
            std::array::from_fn(|k| _mm256_cvtps_epi32(_mm256_mul_ps(v[k], inverse)));
        // int16 in natural order: values 0-15 and 16-31.
        let low = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(q[0], q[1]));
        let high = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(q[2], q[3]));
        let (low, high) = (
            _mm256_shuffle_epi8(low, by_group),
            _mm256_shuffle_epi8(high, by_group),
        );
        // Groups 0 | 1 (values ≡ 0, 2 mod 4) and 2 | 3 (≡ 1, 3 mod 4).
        let first = _mm256_permutevar8x32_epi32(_mm256_unpacklo_epi32(low, high), pairs_in_order);
        let second = _mm256_permutevar8x32_epi32(_mm256_unpackhi_epi32(low, high), pairs_in_order);
        // SAFETY: as above.
        unsafe {
            _mm_storeu_si128(dst as *mut __m128i, _mm256_castsi256_si128(first));
            _mm_storeu_si128(
                dst.add(stride) as *mut __m128i,
                _mm256_extracti128_si256::<1>(first),
            );
            _mm_storeu_si128(
                dst.add(2 * stride) as *mut __m128i,
                _mm256_castsi256_si128(second),
            );
            _mm_storeu_si128(
                dst.add(3 * stride) as *mut __m128i,
                _mm256_extracti128_si256::<1>(second),
            );
        }
    }
}
