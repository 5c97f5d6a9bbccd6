//! The AVX-512 tiers' entry to the INT4 kernel of `avx2_int4.rs`: 16
//! output rows a zmm register instead of 8 a ymm register.
//!
//! The `qweight` words of 16 consecutive output rows are one 64-byte load;
//! each pair of codes meets its pair of activations in one `vpdpwssd`
//! where the CPU has AVX-512 VNNI (`vpmaddwd` and `vpaddd` otherwise: the
//! same integers). The scales widen from f16 by `vcvtph2ps`, exact as
//! `read_f16`. Each lane computes what the AVX2 lane for its row does, in
//! the kernel's one order, so the bits are the AVX2 tier's. A row range
//! whose length is an odd multiple of 8 leaves its last 8 rows to the AVX2
//! width.

use std::arch::x86_64::*;
use std::ops::Range;

use super::super::isa::has_feature;
use super::super::job::Job;
use super::super::quantize::QuantizedX;
use super::avx2_int4::{Int4Lanes, PAIR_MASK, Ymm, run_rows_with};
use crate::formats::read_u32;

/// 16 rows a zmm register (AVX-512F/BW), the pairs' products by `vpdpwssd`
/// where `VNNI`.
struct Zmm<const VNNI: bool>;

impl<const VNNI: bool> Int4Lanes for Zmm<VNNI> {
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
    unsafe fn zero_int() -> __m512i {
        // SAFETY: AVX-512F (the contract).
        unsafe { _mm512_setzero_si512() }
    }
    #[inline(always)]
    unsafe fn load_words(p: *const u8) -> __m512i {
        // SAFETY: AVX-512F; 64 readable bytes at p (the contract).
        unsafe { _mm512_loadu_si512(p.cast()) }
    }
    #[inline(always)]
    unsafe fn first_pair(words: __m512i) -> __m512i {
        // SAFETY: AVX-512F (the contract).
        unsafe { _mm512_and_si512(words, _mm512_set1_epi32(PAIR_MASK)) }
    }
    #[inline(always)]
    unsafe fn next_nibbles(words: __m512i) -> __m512i {
        // SAFETY: AVX-512F (the contract).
        unsafe { _mm512_srli_epi32::<4>(words) }
    }
    #[inline(always)]
    unsafe fn dot_pair(acc: __m512i, codes: __m512i, x_pair: i32) -> __m512i {
        // SAFETY: AVX-512F/BW, and AVX-512 VNNI where VNNI (the contract).
        unsafe {
            let x = _mm512_set1_epi32(x_pair);
            if VNNI {
                dpwssd(acc, codes, x)
            } else {
                _mm512_add_epi32(acc, _mm512_madd_epi16(codes, x))
            }
        }
    }
    #[inline(always)]
    unsafe fn add_int(a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: AVX-512F (the contract).
        unsafe { _mm512_add_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn to_float(sums: __m512i) -> __m512 {
        // SAFETY: AVX-512F (the contract).
        unsafe { _mm512_cvtepi32_ps(sums) }
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

/// `acc` plus the pairwise int16 products of `a` and `b` by one
/// `vpdpwssd`, written out: given the intrinsic, LLVM's machine combiner
/// splits chains of them into `vpmaddwd` + `vpaddd` (shorter dependency
/// chains, one more instruction a pair), and this kernel's chains are
/// short already (each row's sums are independent of the others'), while
/// its instructions are what it waits on.
///
/// # Safety
/// The CPU has AVX-512F and AVX-512 VNNI.
#[target_feature(enable = "avx512f,avx512vnni")]
#[inline]
unsafe fn dpwssd(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
    let mut acc = acc;
    // SAFETY: AVX-512 VNNI (the contract); registers only, no memory.
    unsafe {
        std::arch::asm!(
            "vpdpwssd {acc}, {a}, {b}",
            acc = inout(zmm_reg) acc,
            a = in(zmm_reg) a,
            b = in(zmm_reg) b,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    acc
}

/// Rows `rows` (multiples of 8, as the dispatcher's units are) of an INT4
/// job whose activations are `q`, 16 rows a zmm register, a last 8 by the
/// AVX2 width; by `vpdpwssd` where the CPU has AVX-512 VNNI.
///
/// # Safety
/// AVX2, FMA and AVX-512F/BW are present (the AVX-512 tiers exist only
/// after run-time detection); the job's shapes were checked by
/// `check_problem` and `q` is the job's activations quantized.
pub(super) unsafe fn run_rows(job: &Job, q: &QuantizedX, rows: Range<usize>) {
    // SAFETY: this function's contract; VNNI where detected.
    unsafe {
        if has_feature("avx512vnni") {
            run_rows_vnni(job, q, rows)
        } else {
            run_rows_plain(job, q, rows)
        }
    }
}

/// [`run_rows`] without VNNI.
///
/// # Safety
/// As [`run_rows`].
#[target_feature(enable = "avx2,fma,avx512f,avx512bw")]
unsafe fn run_rows_plain(job: &Job, q: &QuantizedX, rows: Range<usize>) {
    // SAFETY: this function's contract, whose features Zmm and Ymm need.
    unsafe {
        let done = run_rows_with::<Zmm<false>>(job, q, rows.clone());
        run_rows_with::<Ymm>(job, q, done..rows.end);
    }
}

/// [`run_rows`] with VNNI.
///
/// # Safety
/// As [`run_rows`], and the CPU has AVX-512 VNNI.
#[target_feature(enable = "avx2,fma,avx512f,avx512bw,avx512vnni")]
unsafe fn run_rows_vnni(job: &Job, q: &QuantizedX, rows: Range<usize>) {
    // SAFETY: this function's contract, whose features Zmm and Ymm need.
    unsafe {
        let done = run_rows_with::<Zmm<true>>(job, q, rows.clone());
        run_rows_with::<Ymm>(job, q, done..rows.end);
    }
}
