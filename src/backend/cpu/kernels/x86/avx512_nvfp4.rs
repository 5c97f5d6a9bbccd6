//! The NVFP4 decoder of the AVX-512 tiers, for the f32 matmul kernels of
//! `avx2.rs` (which keep their one summation order).
//!
//! A 16-value block has only 16 possible weights: `E2M1[code] × scale`. The
//! decoder multiplies the two 8-entry halves of `E2M1` by the block's scale
//! (the positive codes 0-7 and the negative ones 8-15), and one `vpermi2ps`
//! per 8 codes looks the weights up in that two-vector table, its index
//! lanes being the codes shifted into place by one `vpsrlvd` from a
//! broadcast 32-bit load. The AVX2 decoder (`avx2.rs`) spends about 20 byte
//! shuffles per 64 codes, all on the shuffle ports, and then multiplies
//! every vector by its scale; this one spends 8 permutes and 8 shifts.
//!
//! **The same bits as AVX2.** Every table entry is the one f32 product
//! `E2M1[code] × scale` the AVX2 decoder computes for that code, so each
//! decoded chunk is bitwise the AVX2 one (the tests hold them equal for every
//! code and scale byte), and so is every sum the kernels make of them: the
//! tier can be the default without moving a logit.
//!
//! The decoder needs AVX-512F/VL, so the f32 kernels that call it are
//! the AVX-512 build of `avx2.rs` (`run_format_avx512`), whose 32 vector
//! registers also let the GEMV walk 4 rows in lockstep without spilling.
//! On a Sapphire Rapids-class Xeon (2 vCPUs) the NVFP4 GEMV went from
//! 32-51% to 69-87% of the read bandwidth the same run measured
//! (`cargo bench --bench kernels`, README).

use std::arch::x86_64::*;

use super::avx2_nvfp4::Nvfp4Dec;
use super::lanes::Decoder;
use crate::formats::{E2M1, NVFP4_GROUP};

/// The AVX2 decoder's matrix (its fields, scale table and `scalar`),
/// decoded by table permutes.
pub(super) struct Nvfp4TableDec<'a>(pub(super) Nvfp4Dec<'a>);

impl Decoder for Nvfp4TableDec<'_> {
    const CHUNK: usize = 64;
    /// Built only with AVX-512's 32 registers, where 4 rows' decoded chunks
    /// fit: 4 FMA chains instead of 2 at one token (2 rows were
    /// latency-bound at ~4 weights per cycle, `benches/kernels.rs`).
    const FOUR_ROWS_IN_LOCKSTEP: bool = true;
    /// [`Decoder::decode`] for NVFP4: per 16-block, the scaled table; per 8
    /// codes, one broadcast load, one shift and one table permute.
    ///
    /// # Safety
    ///
    /// As [`Decoder::decode`] (AVX2 and FMA, the chunk inside the matrix:
    /// 32 readable bytes of `codes` from byte `(row · cols + 64 · chunk) / 2`;
    /// the scales are read bounds-checked), and the CPU supports AVX-512F
    /// and AVX-512VL (the decoder is built only for `Isa::Avx512` and
    /// `Isa::Avx512Bf16`, which exist only after run-time detection).
    #[target_feature(enable = "avx2,fma,avx512f,avx512vl")]
    #[inline]
    unsafe fn decode(&self, row: usize, chunk: usize, out: &mut [__m256; 8]) {
        let m = &self.0;
        let first = row * m.cols + chunk * Self::CHUNK;
        // SAFETY: in bounds per the contract.
        let codes = unsafe { m.codes.as_ptr().add(first / 2) };
        // SAFETY: E2M1 holds 16 f32: codes 0-7, then their negatives 8-15.
        let (positive, negative) = unsafe {
            (
                _mm256_loadu_ps(E2M1.as_ptr()),
                _mm256_loadu_ps(E2M1.as_ptr().add(8)),
            )
        };
        // Lane l takes code l of a 32-bit word: bits 4l .. 4l + 3.
        let shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
        let blocks = &m.scales[first / NVFP4_GROUP..][..Self::CHUNK / NVFP4_GROUP];
        for (b, &byte) in blocks.iter().enumerate() {
            let scale = _mm256_set1_ps(m.table[byte as usize]);
            let low = _mm256_mul_ps(positive, scale);
            let high = _mm256_mul_ps(negative, scale);
            for v in [2 * b, 2 * b + 1] {
                // SAFETY: bytes 4v .. 4v + 4 of the chunk's 32 (v < 8).
                let word = unsafe { (codes.add(4 * v) as *const i32).read_unaligned() };
                let index = _mm256_srlv_epi32(_mm256_set1_epi32(word), shifts);
                // SAFETY: AVX-512F and AVX-512VL are present (this
                // function's contract).
                out[v] = unsafe { permute_two_tables(index, low, high) };
            }
        }
    }
    fn scalar(&self, row: usize, col: usize) -> f32 {
        self.0.scalar(row, col)
    }
    fn row_bytes(&self, row: usize) -> &[u8] {
        self.0.row_bytes(row)
    }
}

/// `vpermi2ps`: lane `l` of the result is `low[index_l & 7]` when bit 3 of
/// `index_l` is clear, else `high[index_l & 7]`; the index's higher bits are
/// ignored, so the codes need no mask.
///
/// # Safety
///
/// The CPU supports AVX2, AVX-512F and AVX-512VL.
#[target_feature(enable = "avx2,fma,avx512f,avx512vl")]
#[inline]
unsafe fn permute_two_tables(index: __m256i, low: __m256, high: __m256) -> __m256 {
    _mm256_permutex2var_ps(low, index, high)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::kernels::Isa;

    /// Row `row`'s one chunk as decoded by `dec`, as bits.
    ///
    /// # Safety
    ///
    /// As `dec`'s [`Decoder::decode`] for chunk 0 of `row`.
    #[target_feature(enable = "avx2,fma,avx512f,avx512vl")]
    unsafe fn chunk_bits<D: Decoder>(dec: &D, row: usize) -> Vec<u32> {
        let mut out = [_mm256_setzero_ps(); 8];
        // SAFETY: the caller's contract.
        unsafe { dec.decode(row, 0, &mut out) };
        let mut values = [0.0f32; 64];
        for (v, lane) in out.iter().enumerate() {
            // SAFETY: 8 f32 fit at 8v < 64.
            unsafe { _mm256_storeu_ps(values.as_mut_ptr().add(8 * v), *lane) };
        }
        values.iter().map(|x| x.to_bits()).collect()
    }

    /// The table decoder's chunk and the AVX2 decoder's (the reference).
    fn both_chunks(codes: &[u8], scales: &[u8], global: f32, row: usize) -> [Vec<u32>; 2] {
        let shuffles = Nvfp4Dec::new(codes, scales, global, 64);
        let table = Nvfp4TableDec(Nvfp4Dec::new(codes, scales, global, 64));
        // SAFETY: AVX2, FMA and AVX-512F/VL are present (the callers check
        // Isa::Avx512); the row's one chunk is inside the matrix.
        unsafe { [chunk_bits(&table, row), chunk_bits(&shuffles, row)] }
    }

    #[test]
    fn every_code_under_every_scale_byte_decodes_as_avx2() {
        if !Isa::Avx512.is_available() {
            eprintln!("skipped: this CPU lacks AVX-512F/VL");
            return;
        }
        // 16 rows of 64 codes: row r's bytes cycle through all 256 code
        // pairs; its 4 blocks take scale bytes 16r .. 16r + 4 of 0..=255 in
        // turn (so every scale byte, NaN and subnormal ones included, scales
        // every code over the 4 passes).
        let codes: Vec<u8> = (0..16 * 32).map(|i| (i * 7 % 256) as u8).collect();
        for pass in 0..4 {
            let scales: Vec<u8> = (0..16 * 4).map(|i| (i * 4 + pass) as u8).collect();
            for global in [1.0, 0.0123, 3.0e-39, 6.5e37, -2.0, f32::NAN] {
                for row in 0..16 {
                    let [table, shuffles] = both_chunks(&codes, &scales, global, row);
                    assert_eq!(table, shuffles, "pass {pass} global {global} row {row}");
                }
            }
        }
    }

    #[test]
    fn the_index_shift_puts_code_l_in_lane_l() {
        if !Isa::Avx512.is_available() {
            eprintln!("skipped: this CPU lacks AVX-512F/VL");
            return;
        }
        // Codes 0..16 once each in a row, scale 1: the decoded values are E2M1.
        let codes: Vec<u8> = (0..32)
            .map(|j| ((2 * j % 16) | ((2 * j + 1) % 16) << 4) as u8)
            .collect();
        let scales = [0x38u8; 4]; // E4M3 1.0
        let [table, _] = both_chunks(&codes, &scales, 1.0, 0);
        let want: Vec<u32> = (0..64).map(|c| E2M1[c % 16].to_bits()).collect();
        assert_eq!(table, want);
    }
}
