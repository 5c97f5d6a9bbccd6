//! The AVX2 decoder of NVFP4 weights for the f32 matmul kernels of
//! `avx2.rs`: a chunk is 64 columns (4 blocks of 16), 8 vectors of 8, each
//! weight the one f32 product `E2M1[code] × (scale × global)`. The AVX-512
//! tiers decode the same bits by table permutes (`avx512_nvfp4.rs`).

use std::arch::x86_64::*;

use super::lanes::Decoder;
use crate::formats::{E2M1, E4M3, NVFP4_GROUP, read_nibble};

/// Decodes the 64 FP4 codes at `p` (32 bytes; byte j holds element 2j in
/// its low nibble, 2j + 1 in its high one) to unscaled f32, in order.
///
/// Two byte lookups give each code's bf16 bits (low and high byte), zipped
/// into 16-bit words and widened by interleaving zeros below them. Those
/// zips work within 128-bit halves, so the bytes are first arranged so
/// that every half holds what its outputs need: 16-bit words (4 codes each)
/// even ones in the low half, odd ones in the high half.
///
/// # Safety
///
/// The CPU supports AVX2 and FMA (callers are reached only through `Isa::Avx2`,
/// which exists only after runtime detection). `p` points to at least 32
/// readable bytes (no alignment needed).
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn fp4_codes(p: *const u8, out: &mut [__m256; 8]) {
    let low_bytes = _mm256_broadcastsi128_si256(_mm_setr_epi8(
        0,
        0,
        0x80u8 as i8,
        0xC0u8 as i8,
        0,
        0x40,
        0x80u8 as i8,
        0xC0u8 as i8,
        0,
        0,
        0x80u8 as i8,
        0xC0u8 as i8,
        0,
        0x40,
        0x80u8 as i8,
        0xC0u8 as i8,
    ));
    let high_bytes = _mm256_broadcastsi128_si256(_mm_setr_epi8(
        0,
        0x3F,
        0x3F,
        0x3F,
        0x40,
        0x40,
        0x40,
        0x40,
        0x80u8 as i8,
        0xBFu8 as i8,
        0xBFu8 as i8,
        0xBFu8 as i8,
        0xC0u8 as i8,
        0xC0u8 as i8,
        0xC0u8 as i8,
        0xC0u8 as i8,
    ));
    let even_words_first = _mm256_broadcastsi128_si256(_mm_setr_epi8(
        0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15,
    ));
    let nibble = _mm256_set1_epi8(0x0F);
    let zero = _mm256_setzero_si256();
    // SAFETY: the caller guarantees 32 readable bytes at p.
    let bytes = unsafe { _mm256_loadu_si256(p as *const __m256i) };
    // Words 0 2 4 .. 14 | 1 3 5 .. 15 (word k = codes 4k .. 4k + 3).
    let bytes =
        _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_shuffle_epi8(bytes, even_words_first));
    let low = _mm256_and_si256(bytes, nibble);
    let high = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), nibble);
    // One code per byte: elements 0-3 8-11 16-19 24-27 | 4-7 12-15 20-23
    // 28-31, then the same + 32.
    let codes = [
        _mm256_unpacklo_epi8(low, high),
        _mm256_unpackhi_epi8(low, high),
    ];
    for (n, idx) in codes.into_iter().enumerate() {
        let lo = _mm256_shuffle_epi8(low_bytes, idx);
        let hi = _mm256_shuffle_epi8(high_bytes, idx);
        let first = _mm256_unpacklo_epi8(lo, hi); // 0-3 8-11 | 4-7 12-15
        let second = _mm256_unpackhi_epi8(lo, hi); // 16-19 24-27 | 20-23 28-31
        out[4 * n] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, first));
        out[4 * n + 1] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, first));
        out[4 * n + 2] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, second));
        out[4 * n + 3] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, second));
    }
}

/// An NVFP4 matrix: `codes` `[rows, cols / 2]` (element `2j` in byte `j`'s
/// low nibble), `scales` `[rows, cols / 16]` E4M3 bytes, one global scale.
pub(super) struct Nvfp4Dec<'a> {
    pub(super) codes: &'a [u8],
    pub(super) scales: &'a [u8],
    pub(super) cols: usize,
    /// e4m3 scale byte → scale × global.
    pub(super) table: [f32; 256],
}

impl<'a> Nvfp4Dec<'a> {
    pub(super) fn new(codes: &'a [u8], scales: &'a [u8], global: f32, cols: usize) -> Self {
        let mut table = [0.0f32; 256];
        for (t, &s) in table.iter_mut().zip(E4M3.iter()) {
            *t = s * global;
        }
        Nvfp4Dec {
            codes,
            scales,
            cols,
            table,
        }
    }
}

impl Decoder for Nvfp4Dec<'_> {
    const CHUNK: usize = 64;
    /// 4 rows' decoded chunks (32 vectors) spill; 2 rows ran 1.1-1.3× faster
    /// (`benches/kernels.rs` GEMV on a Zen 1 EPYC; same sums, same bits).
    const FOUR_ROWS_IN_LOCKSTEP: bool = false;
    /// [`Decoder::decode`] for NVFP4: 64 codes, then their 4 block scales.
    ///
    /// # Safety
    ///
    /// As [`Decoder::decode`]: AVX2 and FMA, and the chunk inside the matrix,
    /// i.e. 32 readable bytes of `codes` from byte
    /// `(row · cols + 64 · chunk) / 2` (the scales are read bounds-checked).
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn decode(&self, row: usize, chunk: usize, out: &mut [__m256; 8]) {
        let first = row * self.cols + chunk * 64;
        // SAFETY: in bounds per the contract.
        unsafe { fp4_codes(self.codes.as_ptr().add(first / 2), out) };
        // Vectors 2b and 2b + 1 lie in 16-block b of the chunk.
        let s = &self.scales[first / NVFP4_GROUP..][..Self::CHUNK / NVFP4_GROUP];
        for (b, &byte) in s.iter().enumerate() {
            let scale = _mm256_set1_ps(self.table[byte as usize]);
            out[2 * b] = _mm256_mul_ps(out[2 * b], scale);
            out[2 * b + 1] = _mm256_mul_ps(out[2 * b + 1], scale);
        }
    }
    fn scalar(&self, row: usize, col: usize) -> f32 {
        let scale = self.table[self.scales[(row * self.cols + col) / NVFP4_GROUP] as usize];
        E2M1[read_nibble(self.codes, row * self.cols + col)] * scale
    }
    fn row_bytes(&self, row: usize) -> &[u8] {
        super::lanes::row_slice(self.codes, row, self.cols / 2)
    }
}
