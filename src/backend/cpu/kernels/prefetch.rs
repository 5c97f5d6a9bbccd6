//! Software prefetch: a hint that brings a cache line in ahead of the
//! reads that need it. It never changes a value.
//!
//! Why: the kernels and the bandwidth probe read several sequential streams
//! at once (the GEMV's rows in lockstep, one stream per share of a work
//! unit), and on the machines measured the hardware prefetchers pick each
//! stream up late, page after page. Asking for every line 1 KiB ahead took
//! the batch-1 GEMVs of `benches/kernels.rs` on a Sapphire Rapids-class
//! Xeon (2 vCPUs) from 10-12 to 15-17 GB/s in FP8, 10-14 to 13-15 in
//! NVFP4, 11-13 to 16-20 in MXFP4 and 18.5 to 21.6 in BF16 (512 and 2048
//! bytes did no better; asking for NVFP4's scale stream too did nothing).
//! Only x86-64 asks; elsewhere the hint is a no-op (not measured there).

/// Bytes the CPU fetches at a time.
pub(in crate::backend::cpu::kernels) const LINE: usize = 64;

/// How far ahead of its reads a stream asks for its bytes.
pub(in crate::backend::cpu::kernels) const STREAM_AHEAD: usize = 1024;

/// Asks for the cache line holding byte `at` of the bytes from `start`.
/// The address may lie past the data: it is computed with `wrapping_add`
/// and never dereferenced, and a prefetch never faults.
#[inline(always)]
pub(in crate::backend::cpu::kernels) fn prefetch_line(start: *const u8, at: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing architecturally and never faults,
    // whatever the address; SSE, which it needs, is part of x86-64.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
            start.wrapping_add(at).cast(),
        )
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (start, at);
}
