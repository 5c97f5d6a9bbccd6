//! The decoder of FP8 E4M3 weights (ModelOpt per-tensor or block-wise
//! scales) for the f32 matmul kernels of `avx2.rs`, in their paired
//! summation order: a chunk is 64 columns, 8 vectors of 8 (AVX2) or 4 of 16
//! (the AVX-512 build, `decode_wide`), the same values.
//!
//! E4M3 bytes become f32 by bit arithmetic rather than a gather from
//! `crate::formats::E4M3` (8 loads per vector); the unit tests below hold
//! both paths to that table for all 256 bytes, NaN and subnormals
//! included, and the kernel tests hold them to `fp8_value`.

use std::arch::x86_64::*;

use super::lanes::Decoder;
use crate::checkpoint::linear::Fp8Scales;
use crate::formats::{FP8_BLOCK, fp8_value};

/// An FP8 matrix: `values` `[rows, cols]` E4M3 bytes and their scales.
pub(super) struct Fp8Dec<'a> {
    pub values: &'a [u8],
    pub scales: Fp8Scales<'a>,
    pub cols: usize,
}

// A chunk never straddles two scale blocks: blocks start every 128 columns.
const _: () = assert!(FP8_BLOCK.is_multiple_of(Fp8Dec::CHUNK));

/// 2^120: an E4M3 byte whose bits are moved into an f32's top bits (sign
/// to bit 31, exponent and mantissa below it) reads as its value × 2^-120.
pub(super) const REBIAS: f32 = f32::from_bits((127 + 120) << 23);

impl Decoder for Fp8Dec<'_> {
    const CHUNK: usize = 64;
    /// FP8 sums in the paired order: the fast path's steps, 16 bytes a zmm
    /// (half the instructions of two ymm decodes; the FP8 GEMV was bound by
    /// them, `benches/kernels.rs`).
    const PAIRED: bool = true;
    /// [`Decoder::decode`] for FP8: 64 bytes widened to f32 and multiplied
    /// by the chunk's scale (one rounding, as `fp8_value`).
    ///
    /// The fast path moves each byte's bits to the top of an f32
    /// (`S.EEEE.MMM` → `S.000EEEE.MMM0…`, an f32 of value × 2^-120,
    /// subnormal bytes becoming f32 subnormals, exactly) and folds 2^120
    /// into the scale,
    /// whose product is exact: the one rounding is the multiply's, as in
    /// `fp8_value`. A chunk holding a NaN byte, or a scale too large to
    /// take the 2^120, goes through [`e4m3_lanes`] instead.
    ///
    /// # Safety
    ///
    /// As [`Decoder::decode`]: AVX2 and FMA, and the chunk inside the matrix,
    /// i.e. 64 readable bytes of `values` from byte `row · cols + 64 · chunk`
    /// (the block scale is read bounds-checked).
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn decode(&self, row: usize, chunk: usize, out: &mut [__m256; 8]) {
        let col = chunk * Self::CHUNK;
        let scale = self.scales.at(row, col, self.cols);
        // SAFETY: bytes first .. first + 64 are the chunk's (the contract).
        let p = unsafe { self.values.as_ptr().add(row * self.cols + col) };
        // SAFETY: as above; AVX2 is present.
        let Some(scale) = (unsafe { fast_scale(p, scale) }) else {
            let scale = _mm256_set1_ps(scale);
            for (v, lane) in out.iter_mut().enumerate().take(Self::VECS) {
                // SAFETY: bytes 8v .. 8v + 8 of the chunk.
                let bytes = unsafe { _mm_loadl_epi64(p.add(8 * v) as *const __m128i) };
                // SAFETY: AVX2 is present (this function's contract).
                *lane = _mm256_mul_ps(unsafe { e4m3_lanes(_mm256_cvtepu8_epi32(bytes)) }, scale);
            }
            return;
        };
        let scale = _mm256_set1_ps(scale);
        let keep = _mm256_set1_epi32(KEEP);
        for (v, lane) in out.iter_mut().enumerate().take(Self::VECS) {
            // SAFETY: bytes 8v .. 8v + 8 of the chunk.
            let bytes = unsafe { _mm_loadl_epi64(p.add(8 * v) as *const __m128i) };
            let bits = _mm256_and_si256(_mm256_slli_epi32::<20>(_mm256_cvtepi8_epi32(bytes)), keep);
            *lane = _mm256_mul_ps(_mm256_castsi256_ps(bits), scale);
        }
    }
    /// [`Decoder::decode_wide`] for FP8: [`Decoder::decode`]'s values, 16 a
    /// zmm.
    ///
    /// # Safety
    ///
    /// As [`Decoder::decode`], and the CPU supports AVX-512F (the AVX-512
    /// tiers' build calls it).
    #[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512dq")]
    #[inline]
    unsafe fn decode_wide(&self, row: usize, chunk: usize, out: &mut [__m512; 4]) {
        let col = chunk * Self::CHUNK;
        let scale = self.scales.at(row, col, self.cols);
        // SAFETY: bytes first .. first + 64 are the chunk's (the contract).
        let p = unsafe { self.values.as_ptr().add(row * self.cols + col) };
        // SAFETY: as above; AVX2 is present. (A 64-byte load and a byte
        // compare into a mask register was slower here, benches/kernels.rs.)
        let Some(scale) = (unsafe { fast_scale(p, scale) }) else {
            let mut narrow = [_mm256_setzero_ps(); 8];
            // SAFETY: the contract (the exact path, rare: NaN bytes or a
            // huge scale).
            unsafe { self.decode(row, chunk, &mut narrow) };
            for (j, wide) in out.iter_mut().enumerate() {
                *wide = _mm512_insertf32x8::<1>(
                    _mm512_castps256_ps512(narrow[2 * j]),
                    narrow[2 * j + 1],
                );
            }
            return;
        };
        let scale = _mm512_set1_ps(scale);
        let keep = _mm512_set1_epi32(KEEP);
        for (j, wide) in out.iter_mut().enumerate() {
            // SAFETY: bytes 16j .. 16j + 16 of the chunk.
            let bytes = unsafe { _mm_loadu_si128(p.add(16 * j) as *const __m128i) };
            let bits = _mm512_and_si512(_mm512_slli_epi32::<20>(_mm512_cvtepi8_epi32(bytes)), keep);
            *wide = _mm512_mul_ps(_mm512_castsi512_ps(bits), scale);
        }
    }
    fn scalar(&self, row: usize, col: usize) -> f32 {
        fp8_value(
            self.values[row * self.cols + col],
            self.scales.at(row, col, self.cols),
        )
    }
    fn row_bytes(&self, row: usize) -> &[u8] {
        super::lanes::row_slice(self.values, row, self.cols)
    }
}

/// Sign-extended, a byte `S.EEEE.MMM` shifted left by 20 has S in bit 31
/// and EEEE.MMM in bits 23..=26 and 20..=22; this mask clears the sign's
/// copies in between.
const KEEP: i32 = 0x87F0_0000u32 as i32;

/// The multiplier of the fast decode for the 64-byte chunk at `p` under
/// `scale` (`scale × 2^120`), or `None` where the chunk needs the exact
/// path: a NaN byte, or a scale too large (or NaN) to take the 2^120.
///
/// # Safety
///
/// AVX2 is present; 64 bytes are readable at `p`.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn fast_scale(p: *const u8, scale: f32) -> Option<f32> {
    // SAFETY: 64 readable bytes (the contract); loadu has no alignment need.
    let (a, b) = unsafe {
        (
            _mm256_loadu_si256(p as *const __m256i),
            _mm256_loadu_si256(p.add(32) as *const __m256i),
        )
    };
    // NaN bytes are S.1111.111: with the sign set, 0xFF, the largest byte,
    // so the two halves' lane-wise maximum is 0xFF where either is.
    let sign = _mm256_set1_epi8(0x80u8 as i8);
    let nan = _mm256_cmpeq_epi8(
        _mm256_max_epu8(_mm256_or_si256(a, sign), _mm256_or_si256(b, sign)),
        _mm256_set1_epi8(-1),
    );
    (_mm256_movemask_epi8(nan) == 0 && scale.abs() < 128.0).then_some(scale * REBIAS)
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
pub(super) unsafe fn e4m3_lanes(bytes: __m256i) -> __m256 {
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

    #[test]
    fn decoded_chunks_are_fp8_value_bit_for_bit() {
        if !Isa::Avx2.is_available() {
            eprintln!("skipped: no AVX2 on this CPU");
            return;
        }
        // Every byte once: 4 rows of one chunk; rows 1 and 3 hold the NaNs.
        let values: Vec<u8> = (0..=255u8).collect();
        // Scales on the fast path, at its edge and past it (2^7 and more).
        for scale in [1.0, 0.0371, 3.0e-30, 127.9, 128.0, 1.0e30, f32::NAN] {
            let dec = Fp8Dec {
                values: &values,
                scales: Fp8Scales::Tensor(scale),
                cols: 64,
            };
            for row in 0..4 {
                let mut got = [0.0f32; 64];
                // SAFETY: AVX2 is present; row < 8 and the chunk is the row.
                unsafe {
                    let mut out = [_mm256_setzero_ps(); 8];
                    dec.decode(row, 0, &mut out);
                    for (v, lane) in out.iter().enumerate() {
                        _mm256_storeu_ps(got.as_mut_ptr().add(8 * v), *lane);
                    }
                }
                for (c, &g) in got.iter().enumerate() {
                    let want = fp8_value(values[row * 64 + c], scale);
                    assert!(
                        g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                        "byte {:#04x} × {scale}: {g} vs {want}",
                        row * 64 + c
                    );
                }
            }
        }
    }
}
