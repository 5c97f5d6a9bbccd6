//! The block scales of the integer FP4 kernels (`avx2_fp4.rs`): how each
//! format's scale bytes become the f32 scales of the kernels' lanes, and the
//! lane patterns the activations' scales share (MXFP4's E8M0 per 32 values,
//! NVFP4's E4M3 times the tensor's global scale per 16).

use std::arch::x86_64::*;

use super::avx2_fp8::{REBIAS, e4m3_lanes};
use crate::backend::cpu::kernels::quantize::{BLOCK, CODE_UNSCALE, SCALE_GROUP, code_scale};
use crate::formats::{E4M3, E8M0_NAN, MXFP4_GROUP, NVFP4_GROUP};

/// Values of one group of scales: 8 activation blocks, 4 pairs.
pub(super) const GROUP_VALUES: usize = SCALE_GROUP * BLOCK;

/// How a format's block scales become the lane scales of a pair.
pub(super) trait BlockScales: Sync {
    /// FP4 values one scale covers.
    const VALUES: usize;
    /// The decoded scales of one group (`GROUP_VALUES` values).
    type Group: Copy;
    /// Decodes the group's scale bytes at `bytes` (`GROUP_VALUES / VALUES`).
    ///
    /// # Safety
    ///
    /// AVX2 and FMA; `GROUP_VALUES / VALUES` readable bytes at `bytes`.
    unsafe fn decode_group(&self, bytes: *const u8) -> Self::Group;
    /// Stores a decoded group as `GROUP_VALUES / VALUES` f32 at `dst`.
    ///
    /// # Safety
    ///
    /// AVX2 and FMA; room for those f32 at `dst`.
    unsafe fn store_group(group: Self::Group, dst: *mut f32);
    /// Loads what [`BlockScales::store_group`] stored.
    ///
    /// # Safety
    ///
    /// AVX2 and FMA; that many readable f32 at `src`.
    unsafe fn load_group(src: *const f32) -> Self::Group;
    /// The weight scales of lane 0-7 for pair `k` (0..4) of a group.
    ///
    /// # Safety
    ///
    /// AVX2 and FMA.
    unsafe fn pair_lanes(group: Self::Group, k: usize) -> __m256;
    /// The weight scales of lanes 0-15 for couple `j` (0..2) of a group:
    /// pair `2j`'s lanes, then pair `2j + 1`'s.
    ///
    /// # Safety
    ///
    /// AVX2, FMA and AVX-512F.
    unsafe fn couple_lanes(group: Self::Group, j: usize) -> __m512;
    /// One block's scale (× 1/512) from its byte.
    fn scale(&self, byte: u8) -> f32;
    /// The lane scales of a pair outside whole groups, from its blocks'
    /// scales in order (`64 / VALUES` of them); of a lone last block (the
    /// first `32 / VALUES`), lanes 4-7 zero.
    ///
    /// # Safety
    ///
    /// AVX2 and FMA.
    unsafe fn lanes_of(scales: [f32; 4], lone: bool) -> __m256;
}

/// MXFP4: one E8M0 scale per 32 values; a group's 8 in lanes 0 2 4 6 1 3 5 7.
pub(super) struct Mxfp4Scales;

impl BlockScales for Mxfp4Scales {
    const VALUES: usize = MXFP4_GROUP;
    type Group = __m256;
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn decode_group(&self, bytes: *const u8) -> __m256 {
        // SAFETY: the caller's contract (8 bytes).
        unsafe { decode_group_scales(bytes) }
    }
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn store_group(group: __m256, dst: *mut f32) {
        // SAFETY: the caller's contract (8 f32).
        unsafe { _mm256_storeu_ps(dst, group) }
    }
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn load_group(src: *const f32) -> __m256 {
        // SAFETY: the caller's contract (8 f32).
        unsafe { _mm256_loadu_ps(src) }
    }
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn pair_lanes(group: __m256, k: usize) -> __m256 {
        pair_scales(group, k)
    }
    #[target_feature(enable = "avx2,fma,avx512f")]
    #[inline]
    unsafe fn couple_lanes(group: __m256, j: usize) -> __m512 {
        couple_lanes_0246(group, j)
    }
    fn scale(&self, byte: u8) -> f32 {
        code_scale(byte)
    }
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn lanes_of(s: [f32; 4], lone: bool) -> __m256 {
        let high = if lone { 0.0 } else { s[1] };
        _mm256_set_m128(_mm_set1_ps(high), _mm_set1_ps(s[0]))
    }
}

/// NVFP4: one E4M3 scale per 16 values, times the tensor's global scale; a
/// group's 16 in order, 8 per vector.
pub(super) struct Nvfp4Scales {
    /// The global scale × 1/512 (the codes' 512), applied after the E4M3
    /// value: a scale is `E4M3[byte] · unscale`, one rounding.
    unscale: f32,
    /// `unscale × 2^120`, where finite (see `decode_group`).
    rebiased: Option<f32>,
}

impl Nvfp4Scales {
    pub(super) fn new(global: f32) -> Nvfp4Scales {
        let unscale = global * CODE_UNSCALE;
        Nvfp4Scales {
            unscale,
            rebiased: (unscale.abs() < 256.0).then_some(unscale * REBIAS),
        }
    }
}

impl BlockScales for Nvfp4Scales {
    const VALUES: usize = NVFP4_GROUP;
    type Group = [__m256; 2];
    /// 16 E4M3 bytes → `E4M3[byte] · unscale`, as `avx2_fp8.rs` decodes FP8
    /// weights: each byte's bits moved to the top of an f32 read as its
    /// value × 2^-120 (subnormals too, exactly), times `unscale × 2^120`:
    /// the one rounding is the multiply's. A group holding a NaN byte, or an
    /// `unscale` too large to take the 2^120, goes through `e4m3_lanes`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn decode_group(&self, bytes: *const u8) -> [__m256; 2] {
        // SAFETY: the caller's contract (16 bytes); loadu needs no alignment.
        let raw = unsafe { _mm_loadu_si128(bytes as *const __m128i) };
        let magnitude = _mm_and_si128(raw, _mm_set1_epi8(0x7F));
        let nan = _mm_movemask_epi8(_mm_cmpeq_epi8(magnitude, _mm_set1_epi8(0x7F)));
        let halves = [raw, _mm_srli_si128::<8>(raw)];
        match self.rebiased {
            Some(rebiased) if nan == 0 => {
                let scale = _mm256_set1_ps(rebiased);
                // Sign-extended and shifted left by 20: S in bit 31,
                // EEEE.MMM in bits 20..=26; the mask clears the sign's copies.
                let keep = _mm256_set1_epi32(0x87F0_0000u32 as i32);
                halves.map(|h| {
                    let bits =
                        _mm256_and_si256(_mm256_slli_epi32::<20>(_mm256_cvtepi8_epi32(h)), keep);
                    _mm256_mul_ps(_mm256_castsi256_ps(bits), scale)
                })
            }
            _ => {
                let unscale = _mm256_set1_ps(self.unscale);
                // SAFETY: AVX2 is present (this function's contract).
                halves
                    .map(|h| unsafe { _mm256_mul_ps(e4m3_lanes(_mm256_cvtepu8_epi32(h)), unscale) })
            }
        }
    }
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn store_group(group: [__m256; 2], dst: *mut f32) {
        // SAFETY: the caller's contract (16 f32).
        unsafe {
            _mm256_storeu_ps(dst, group[0]);
            _mm256_storeu_ps(dst.add(8), group[1]);
        }
    }
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn load_group(src: *const f32) -> [__m256; 2] {
        // SAFETY: the caller's contract (16 f32).
        unsafe { [_mm256_loadu_ps(src), _mm256_loadu_ps(src.add(8))] }
    }
    /// Pair k covers scales 4k .. 4k + 3, each for two lanes.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn pair_lanes(group: [__m256; 2], k: usize) -> __m256 {
        let index = if k.is_multiple_of(2) {
            _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3)
        } else {
            _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7)
        };
        _mm256_permutevar8x32_ps(group[k / 2], index)
    }
    /// Couple j covers scales 8j .. 8j + 7, each for two lanes.
    #[target_feature(enable = "avx2,fma,avx512f")]
    #[inline]
    unsafe fn couple_lanes(group: [__m256; 2], j: usize) -> __m512 {
        let index = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
        _mm512_permutexvar_ps(index, _mm512_castps256_ps512(group[j]))
    }
    fn scale(&self, byte: u8) -> f32 {
        E4M3[byte as usize] * self.unscale
    }
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn lanes_of(s: [f32; 4], lone: bool) -> __m256 {
        let (c, d) = if lone { (0.0, 0.0) } else { (s[2], s[3]) };
        _mm256_setr_ps(s[0], s[0], s[1], s[1], c, c, d, d)
    }
}

/// Lanes 0-15 of couple `j` (0..2) from a group's 8 scales in the order
/// 0 2 4 6 1 3 5 7 (the activations', and MXFP4's): blocks 4j .. 4j + 3,
/// four lanes each.
#[target_feature(enable = "avx2,fma,avx512f")]
#[inline]
pub(super) fn couple_lanes_0246(s: __m256, j: usize) -> __m512 {
    let (a, b) = (2 * j as i32, 2 * j as i32 + 1);
    let index = _mm512_setr_epi32(
        a,
        a,
        a,
        a,
        a + 4,
        a + 4,
        a + 4,
        a + 4,
        b,
        b,
        b,
        b,
        b + 4,
        b + 4,
        b + 4,
        b + 4,
    );
    _mm512_permutexvar_ps(index, _mm512_castps256_ps512(s))
}

/// 8 E8M0 bytes at `p` → their scales × 1/512, in lanes 0 2 4 6 1 3 5 7
/// (`crate::formats::e8m0_to_f32`'s rule): the exponent byte shifted into
/// place is the f32 2^(e − 127), except e = 0 (2^-127 is a subnormal) and
/// e = 0xFF (NaN); × 1/512 is exact.
///
/// # Safety
///
/// The CPU supports AVX2 and FMA (callers are reached only through `Isa::Avx2`,
/// which exists only after runtime detection). `p` points to at least 8
/// readable bytes (no alignment needed).
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) unsafe fn decode_group_scales(p: *const u8) -> __m256 {
    // SAFETY: the caller's contract.
    let bytes = unsafe { _mm_loadl_epi64(p as *const __m128i) };
    let order = _mm_setr_epi8(0, 2, 4, 6, 1, 3, 5, 7, -1, -1, -1, -1, -1, -1, -1, -1);
    let e = _mm256_cvtepu8_epi32(_mm_shuffle_epi8(bytes, order));
    let bits = _mm256_slli_epi32(e, 23);
    let is_zero = _mm256_cmpeq_epi32(e, _mm256_setzero_si256());
    let bits = _mm256_blendv_epi8(bits, _mm256_set1_epi32(0x0040_0000), is_zero);
    let is_nan = _mm256_cmpeq_epi32(e, _mm256_set1_epi32(i32::from(E8M0_NAN)));
    let bits = _mm256_blendv_epi8(bits, _mm256_set1_epi32(f32::NAN.to_bits() as i32), is_nan);
    _mm256_mul_ps(_mm256_castsi256_ps(bits), _mm256_set1_ps(CODE_UNSCALE))
}

/// Lanes 0-3 ← lane k, lanes 4-7 ← lane 4 + k: pair k's scales of a group.
#[target_feature(enable = "avx2,fma")]
#[inline]
pub(super) fn pair_scales(s: __m256, k: usize) -> __m256 {
    match k {
        0 => _mm256_permute_ps::<0x00>(s),
        1 => _mm256_permute_ps::<0x55>(s),
        2 => _mm256_permute_ps::<0xAA>(s),
        _ => _mm256_permute_ps::<0xFF>(s),
    }
}
