//! The AVX-512 tiers' entry to the INT4 kernel of `avx2_int4.rs`: 16
//! output rows a zmm register instead of 8 a ymm register.
//!
//! The `qweight` words of 16 consecutive output rows are one 64-byte load.
//! Per nibble, the AVX2 width spends a mask and a convert to turn the codes
//! into floats; here one `vpermps` looks them up in the table `0.0 ..= 15.0`
//! (the permute reads only each lane's low 4 bits, so no mask): half the
//! vectors and fewer operations per weight. The scales widen from f16 by
//! `vcvtph2ps`, exact as `read_f16`. Each lane computes what the AVX2
//! lane for its row does, in the kernel's one order, so the bits are the
//! AVX2 tier's. A row range whose length is an odd multiple of 8 leaves
//! its last 8 rows to the AVX2 width.

use std::arch::x86_64::*;
use std::ops::Range;

use super::super::job::Job;
use super::avx2_int4::{Int4Lanes, Ymm, run_rows_with};
use crate::formats::read_u32;

/// 16 rows a zmm register (AVX-512F).
struct Zmm;

impl Int4Lanes for Zmm {
    const LANES: usize = 16;
    type F = __m512;
    type I = __m512i;
    #[inline(always)]
    unsafe fn zero() -> __m512 {
        // SAFETY: AVX-512F (the contract).
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn splat(v: f32) -> __m512 {
        // SAFETY: AVX-512F (the contract).
        unsafe { _mm512_set1_ps(v) }
    }
    #[inline(always)]
    unsafe fn fmadd(a: __m512, b: __m512, c: __m512) -> __m512 {
        // SAFETY: AVX-512F (the contract).
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn fnmadd(a: __m512, b: __m512, c: __m512) -> __m512 {
        // SAFETY: AVX-512F (the contract).
        unsafe { _mm512_fnmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn add(a: __m512, b: __m512) -> __m512 {
        // SAFETY: AVX-512F (the contract).
        unsafe { _mm512_add_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn load_words(p: *const u8) -> __m512i {
        // SAFETY: AVX-512F; 64 readable bytes at p (the contract).
        unsafe { _mm512_loadu_si512(p.cast()) }
    }
    #[inline(always)]
    unsafe fn low_nibbles(words: __m512i) -> __m512 {
        // SAFETY: AVX-512F (the contract).
        unsafe {
            let codes_as_floats = _mm512_setr_ps(
                0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0,
                15.0,
            );
            _mm512_permutexvar_ps(words, codes_as_floats)
        }
    }
    #[inline(always)]
    unsafe fn next_nibbles(words: __m512i) -> __m512i {
        // SAFETY: AVX-512F (the contract).
        unsafe { _mm512_srli_epi32::<4>(words) }
    }
    #[inline(always)]
    unsafe fn zero_points(qzeros: &[u8], first: usize, offset: u8) -> __m512 {
        let (low, high) = (read_u32(qzeros, first), read_u32(qzeros, first + 1));
        // SAFETY: AVX-512F (the contract).
        unsafe {
            // Lane i is row i: nibble i mod 8 of word i / 8.
            let both = _mm512_inserti64x4::<1>(
                _mm512_castsi256_si512(_mm256_set1_epi32(low as i32)),
                _mm256_set1_epi32(high as i32),
            );
            let shifts =
                _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
            let nibbles =
                _mm512_and_si512(_mm512_srlv_epi32(both, shifts), _mm512_set1_epi32(0x0F));
            _mm512_cvtepi32_ps(_mm512_add_epi32(
                nibbles,
                _mm512_set1_epi32(i32::from(offset)),
            ))
        }
    }
    #[inline(always)]
    unsafe fn scales(halves: &[u8]) -> __m512 {
        let halves = &halves[..32];
        // SAFETY: AVX-512F (the contract); `halves` is 32 readable bytes.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(halves.as_ptr().cast())) }
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: __m512) {
        // SAFETY: AVX-512F; 16 writable floats at p (the contract).
        unsafe { _mm512_storeu_ps(p, v) }
    }
}

/// Rows `rows` (multiples of 8, as the dispatcher's units are) of an INT4
/// job, 16 rows a zmm register, a last 8 by the AVX2 width.
///
/// # Safety
/// AVX2, FMA and AVX-512F are present (the AVX-512 tiers exist only after
/// run-time detection); the job's shapes were checked by `check_problem`.
#[target_feature(enable = "avx2,fma,avx512f")]
pub(super) unsafe fn run_rows(job: &Job, rows: Range<usize>) {
    // SAFETY: this function's contract, whose features Zmm and Ymm need.
    unsafe {
        let done = run_rows_with::<Zmm>(job, rows.clone());
        run_rows_with::<Ymm>(job, done..rows.end);
    }
}
