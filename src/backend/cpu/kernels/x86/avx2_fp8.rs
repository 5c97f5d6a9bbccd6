//! The AVX2 decoder of FP8 E4M3 weights (ModelOpt per-tensor or block-wise
//! scales) for the f32 matmul kernels of `avx2.rs`, which keep their one
//! summation order: a chunk is 32 columns, 4 vectors of 8.
//!
//! E4M3 bytes become f32 by bit arithmetic rather than a gather from
//! `crate::formats::E4M3` (8 loads per vector); the unit test below holds
//! it to that table for all 256 bytes, NaN and subnormals included.

use std::arch::x86_64::*;

use super::avx2::Decoder;
use crate::checkpoint::linear::Fp8Scales;
use crate::formats::{FP8_BLOCK, fp8_value};

/// An FP8 matrix: `values` `[rows, cols]` E4M3 bytes and their scales.
pub(super) struct Fp8Dec<'a> {
    pub values: &'a [u8],
    pub scales: Fp8Scales<'a>,
    pub cols: usize,
}

// A chunk never straddles two scale blocks: blocks start every 128 columns.
const _: () = assert!(FP8_BLOCK % Fp8Dec::CHUNK == 0);

impl Decoder for Fp8Dec<'_> {
    const CHUNK: usize = 32;
    /// [`Decoder::decode`] for FP8: 32 bytes widened to f32 and multiplied
    /// by the chunk's scale (one rounding, as `fp8_value`).
    ///
    /// # Safety
    ///
    /// As [`Decoder::decode`]: AVX2 and FMA, and the chunk inside the matrix,
    /// i.e. 32 readable bytes of `values` from byte `row · cols + 32 · chunk`
    /// (the block scale is read bounds-checked).
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn decode(&self, row: usize, chunk: usize, out: &mut [__m256; 8]) {
        let col = chunk * Self::CHUNK;
        let first = row * self.cols + col;
        let scale = _mm256_set1_ps(self.scales.at(row, col, self.cols));
        for (v, lane) in out.iter_mut().enumerate().take(Self::VECS) {
            // SAFETY: bytes first + 8v .. first + 8v + 8 lie inside the chunk.
            let bytes = unsafe {
                _mm_loadl_epi64(self.values.as_ptr().add(first + 8 * v) as *const __m128i)
            };
            // SAFETY: AVX2 is present (this function's contract).
            *lane = _mm256_mul_ps(unsafe { e4m3_lanes(_mm256_cvtepu8_epi32(bytes)) }, scale);
        }
    }
    fn scalar(&self, row: usize, col: usize) -> f32 {
        fp8_value(
            self.values[row * self.cols + col],
            self.scales.at(row, col, self.cols),
        )
    }
}

/// E4M3 bytes (one per 32-bit lane, zero-extended) → f32, exactly as
/// `crate::formats::e4m3_to_f32`: a normal byte's exponent and mantissa
/// move into place with the bias changed from 7 to 127 (+120); a
/// subnormal (exponent 0) is its mantissa × 2^-9; `S.1111.111` is NaN; the
/// sign bit moves to bit 31.
///
/// # Safety
///
/// The CPU supports AVX2 (callers are reached only through `Isa::Avx2`).
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn e4m3_lanes(bytes: __m256i) -> __m256 {
    let magnitude = _mm256_and_si256(bytes, _mm256_set1_epi32(0x7F));
    let normal = _mm256_castsi256_ps(_mm256_add_epi32(
        _mm256_slli_epi32::<20>(magnitude),
        _mm256_set1_epi32(120 << 23),
    ));
    let subnormal = _mm256_mul_ps(_mm256_cvtepi32_ps(magnitude), _mm256_set1_ps(1.0 / 512.0));
    let is_subnormal = _mm256_cmpgt_epi32(_mm256_set1_epi32(8), magnitude);
    let value = _mm256_blendv_ps(normal, subnormal, _mm256_castsi256_ps(is_subnormal));
    let is_nan = _mm256_cmpeq_epi32(magnitude, _mm256_set1_epi32(0x7F));
    let value = _mm256_blendv_ps(value, _mm256_set1_ps(f32::NAN), _mm256_castsi256_ps(is_nan));
    let sign = _mm256_slli_epi32::<24>(_mm256_and_si256(bytes, _mm256_set1_epi32(0x80)));
    _mm256_or_ps(value, _mm256_castsi256_ps(sign))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::kernels::Isa;
    use crate::formats::E4M3;

    #[test]
    fn every_e4m3_byte_decodes_as_the_formats_table() {
        if !Isa::Avx2.is_available() {
            eprintln!("skipped: no AVX2 on this CPU");
            return;
        }
        for first in (0..256).step_by(8) {
            let lanes: [i32; 8] = std::array::from_fn(|l| (first + l) as i32);
            let mut out = [0.0f32; 8];
            // SAFETY: AVX2 is present (checked above); `out` holds 8 f32.
            unsafe {
                let v = e4m3_lanes(_mm256_loadu_si256(lanes.as_ptr() as *const __m256i));
                _mm256_storeu_ps(out.as_mut_ptr(), v);
            }
            for (l, &got) in out.iter().enumerate() {
                let want = E4M3[first + l];
                assert!(
                    got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                    "byte {:#04x}: {got} vs {want}",
                    first + l
                );
            }
        }
    }
}
