//! x86-64 AVX2 + FMA matmul kernels.
//!
//! Weights are decoded in *chunks* (8 values for F32, 16 for BF16, 64 for the
//! FP4 formats) into 8-lane f32 vectors in whatever order the cheapest
//! decoding produces (see `BF16_ORDER`, `FP4_ORDER`). The activations are
//! copied once per call into that same order, so a decoded vector lines up
//! with a plain vector load of x. Columns past the last whole chunk keep
//! their natural order and are computed one by one.
//!
//! - GEMV path (few tokens): each weight row is streamed once from memory and
//!   dotted with every token; memory bandwidth is the limit.
//! - Panel path (many tokens): blocks of `PANELS` × `MR` rows are decoded
//!   into k-major f32 panels on the stack (L2-resident), and a 6-row ×
//!   16-token microkernel (12 accumulators, 2 loads + 6 broadcasts per 12
//!   FMAs) runs over the tokens, which are transposed into groups of 8
//!   (`[group][k][8]`); each pair of groups is reused by all panels of the
//!   block. Arithmetic is the limit.
//!
//! Every `unsafe fn` here requires AVX2 and FMA; the module is only entered
//! through `Isa::Avx2`, which exists only after runtime detection.

use std::arch::x86_64::*;
use std::ops::Range;

use rayon::prelude::*;

use super::formats::{E2M1, E4M3, E8M0, read_bf16, read_f32, read_nibble};
use super::matmul::{Job, Path};
use crate::checkpoint::linear::{LinearWeight, WeightData};

/// Problems with at most this many tokens take the GEMV path (measured: up
/// to 8 tokens, two passes of 4 over cache-resident rows beat packing).
pub(super) const GEMV_MAX_TOKENS: usize = 8;
/// Rows of the panel microkernel.
const MR: usize = 6;
/// Tokens per transposed group (one vector).
const TG: usize = 8;
/// Longest k range a panel holds (a multiple of every chunk length); longer
/// rows are done in several passes that add into `out`.
const KC: usize = 1024;
/// Panels decoded together (PANELS × MR × KC floats: 96 KiB, L2-resident).
const PANELS: usize = 4;

/// BF16: a 32-byte load holds 16 values; even ones come out first.
const BF16_ORDER: [u8; 16] = [0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15];
/// FP4: the natural index of each of the 64 decoded positions (see `fp4_codes`).
const FP4_ORDER: [u8; 64] = fp4_order();
const F32_ORDER: [u8; 8] = [0, 1, 2, 3, 4, 5, 6, 7];

/// Decoded vector v, lane l holds element 32·(l/4) + 16·(v/4) + 4·(l%4) +
/// 2·(v%2) + (v%4)/2 of the chunk: lanes 0-3 come from the first 16 bytes,
/// 4-7 from the last 16 (AVX2 shuffles stay within 128-bit halves).
const fn fp4_order() -> [u8; 64] {
    let mut order = [0u8; 64];
    let mut v = 0;
    while v < 8 {
        let mut l = 0;
        while l < 8 {
            order[v * 8 + l] =
                (32 * (l / 4) + 16 * (v / 4) + 4 * (l % 4) + 2 * (v % 2) + (v % 4) / 2) as u8;
            l += 1;
        }
        v += 1;
    }
    order
}

pub(super) fn choose_path(tokens: usize) -> Path {
    if tokens <= GEMV_MAX_TOKENS {
        Path::Gemv
    } else {
        Path::Panel
    }
}

fn chunk_order(w: &LinearWeight) -> &'static [u8] {
    match w.data {
        WeightData::F32(_) => &F32_ORDER,
        WeightData::Bf16(_) => &BF16_ORDER,
        WeightData::Nvfp4 { .. } | WeightData::Mxfp4 { .. } => &FP4_ORDER,
    }
}

pub(super) fn prep_len(path: Path, w: &LinearWeight, tokens: usize) -> usize {
    match path {
        Path::Gemv => tokens * w.cols,
        Path::Panel => tokens.div_ceil(TG) * TG * w.cols,
    }
}

/// Copies x into the kernel's order: GEMV keeps `[tokens][cols]` with each
/// whole chunk permuted; Panel transposes into `[groups][cols][8]` (same
/// column order, missing tokens zero).
pub(super) fn prepare(path: Path, w: &LinearWeight, x: &[f32], tokens: usize, dst: &mut [f32]) {
    let cols = w.cols;
    let order = chunk_order(w);
    let chunk = order.len();
    let whole = cols / chunk * chunk;
    match path {
        Path::Gemv => {
            for (xs, ds) in x.chunks_exact(cols).zip(dst.chunks_exact_mut(cols)) {
                for (c, d) in ds[..whole].chunks_exact_mut(chunk).enumerate() {
                    let src = &xs[c * chunk..(c + 1) * chunk];
                    for (d, &o) in d.iter_mut().zip(order) {
                        *d = src[o as usize];
                    }
                }
                ds[whole..].copy_from_slice(&xs[whole..]);
            }
        }
        Path::Panel => {
            let transpose_group = |(g, block): (usize, &mut [f32])| {
                for i in 0..TG {
                    let t = g * TG + i;
                    if t >= tokens {
                        for k in 0..cols {
                            block[k * TG + i] = 0.0;
                        }
                        continue;
                    }
                    let xs = &x[t * cols..(t + 1) * cols];
                    for c in 0..whole / chunk {
                        let base = c * chunk;
                        for (p, &o) in order.iter().enumerate() {
                            block[(base + p) * TG + i] = xs[base + o as usize];
                        }
                    }
                    for k in whole..cols {
                        block[k * TG + i] = xs[k];
                    }
                }
            };
            // Big inputs (long prefills) are transposed by all threads.
            if dst.len() >= 1 << 18 {
                dst.par_chunks_exact_mut(cols * TG)
                    .enumerate()
                    .for_each(transpose_group);
            } else {
                dst.chunks_exact_mut(cols * TG)
                    .enumerate()
                    .for_each(transpose_group);
            }
        }
    }
}

pub(super) fn run_rows(job: &Job, rows: Range<usize>) {
    let w = &job.weight;
    let cols = w.cols;
    // SAFETY (all arms): Job shapes were checked by `check_problem`, and this
    // module is only reached through Isa::Avx2, i.e. with AVX2 and FMA present.
    unsafe {
        match w.data {
            WeightData::F32(bytes) => run_format(&F32Dec { bytes, cols }, job, rows),
            WeightData::Bf16(bytes) => run_format(&Bf16Dec { bytes, cols }, job, rows),
            WeightData::Nvfp4 {
                packed,
                scales,
                global,
            } => {
                let mut table = [0.0f32; 256];
                for (t, &s) in table.iter_mut().zip(E4M3.iter()) {
                    *t = s * global;
                }
                let dec = Nvfp4Dec {
                    codes: packed,
                    scales,
                    cols,
                    table,
                };
                run_format(&dec, job, rows)
            }
            WeightData::Mxfp4 { blocks, scales } => {
                let dec = Mxfp4Dec {
                    codes: blocks,
                    scales,
                    cols,
                };
                run_format(&dec, job, rows)
            }
        }
    }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn run_format<D: Decoder>(dec: &D, job: &Job, rows: Range<usize>) {
    // SAFETY: same contract as this function's.
    unsafe {
        match job.path {
            Path::Gemv => gemv_rows(dec, job, rows),
            Path::Panel => panel_rows(dec, job, rows),
        }
    }
}

/// Turns weight chunks into f32 vectors (in the format's chunk order).
trait Decoder {
    /// Values per chunk (a multiple of 8).
    const CHUNK: usize;
    /// Vectors per chunk.
    const VECS: usize = Self::CHUNK / 8;
    /// Decodes chunk `chunk` of row `row` into `out[..VECS]`.
    /// Safety: AVX2+FMA, and the chunk lies inside the matrix.
    unsafe fn decode(&self, row: usize, chunk: usize, out: &mut [__m256; 8]);
    /// `W[row, col]` for the columns after the last whole chunk.
    fn scalar(&self, row: usize, col: usize) -> f32;
    /// Where chunk `chunk` of row `row` starts (may lie past the matrix: it
    /// is only prefetched, never read).
    fn chunk_address(&self, row: usize, chunk: usize) -> *const u8;
    /// Block-scaled formats: decodes the chunk unscaled and returns the scales
    /// of vectors 0-3 and 4-7, so a single token can apply them to partial
    /// sums instead of to every weight. `None`: not a block-scaled format.
    /// Safety: as `decode`.
    unsafe fn decode_unscaled(
        &self,
        row: usize,
        chunk: usize,
        out: &mut [__m256; 8],
    ) -> Option<[__m256; 2]> {
        let _ = (row, chunk, out);
        None
    }
}

struct F32Dec<'a> {
    bytes: &'a [u8],
    cols: usize,
}

impl Decoder for F32Dec<'_> {
    const CHUNK: usize = 8;
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn decode(&self, row: usize, chunk: usize, out: &mut [__m256; 8]) {
        let offset = (row * self.cols + chunk * 8) * 4;
        // SAFETY: in bounds per the contract; loadu has no alignment need.
        out[0] = unsafe { _mm256_loadu_ps(self.bytes.as_ptr().add(offset) as *const f32) };
    }
    fn scalar(&self, row: usize, col: usize) -> f32 {
        read_f32(self.bytes, row * self.cols + col)
    }
    fn chunk_address(&self, row: usize, chunk: usize) -> *const u8 {
        self.bytes
            .as_ptr()
            .wrapping_add((row * self.cols + chunk * 8) * 4)
    }
}

struct Bf16Dec<'a> {
    bytes: &'a [u8],
    cols: usize,
}

impl Decoder for Bf16Dec<'_> {
    const CHUNK: usize = 16;
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn decode(&self, row: usize, chunk: usize, out: &mut [__m256; 8]) {
        let offset = (row * self.cols + chunk * 16) * 2;
        // SAFETY: in bounds per the contract; loadu has no alignment need.
        let v = unsafe { _mm256_loadu_si256(self.bytes.as_ptr().add(offset) as *const __m256i) };
        // A bf16 is the top half of an f32: shift the even ones up, mask the odd.
        out[0] = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
        out[1] = _mm256_castsi256_ps(_mm256_and_si256(
            v,
            _mm256_set1_epi32(0xFFFF_0000u32 as i32),
        ));
    }
    fn scalar(&self, row: usize, col: usize) -> f32 {
        read_bf16(self.bytes, row * self.cols + col)
    }
    fn chunk_address(&self, row: usize, chunk: usize) -> *const u8 {
        self.bytes
            .as_ptr()
            .wrapping_add((row * self.cols + chunk * 16) * 2)
    }
}

/// Decodes the 64 FP4 codes at `p` (32 bytes) to unscaled f32 in FP4_ORDER.
/// Two byte lookups give each value's bf16 bits (low and high byte), which
/// are zipped to 16-bit words and widened like BF16.
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
    let nibble = _mm256_set1_epi8(0x0F);
    let odd_words = _mm256_set1_epi32(0xFFFF_0000u32 as i32);
    // SAFETY: the caller guarantees 32 readable bytes at p.
    let bytes = unsafe { _mm256_loadu_si256(p as *const __m256i) };
    let codes = [
        _mm256_and_si256(bytes, nibble), // even elements
        _mm256_and_si256(_mm256_srli_epi16(bytes, 4), nibble), // odd elements
    ];
    for (n, idx) in codes.into_iter().enumerate() {
        let lo = _mm256_shuffle_epi8(low_bytes, idx);
        let hi = _mm256_shuffle_epi8(high_bytes, idx);
        let first = _mm256_unpacklo_epi8(lo, hi); // bytes 0-7 | 16-23
        let second = _mm256_unpackhi_epi8(lo, hi); // bytes 8-15 | 24-31
        out[2 * n] = _mm256_castsi256_ps(_mm256_slli_epi32(first, 16));
        out[2 * n + 1] = _mm256_castsi256_ps(_mm256_and_si256(first, odd_words));
        out[4 + 2 * n] = _mm256_castsi256_ps(_mm256_slli_epi32(second, 16));
        out[4 + 2 * n + 1] = _mm256_castsi256_ps(_mm256_and_si256(second, odd_words));
    }
}

/// Two per-128-bit-half scales as one vector.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn halves(low: f32, high: f32) -> __m256 {
    _mm256_setr_m128(_mm_set1_ps(low), _mm_set1_ps(high))
}

struct Nvfp4Dec<'a> {
    codes: &'a [u8],
    scales: &'a [u8],
    cols: usize,
    /// e4m3 scale byte → scale × global.
    table: [f32; 256],
}

impl Decoder for Nvfp4Dec<'_> {
    const CHUNK: usize = 64;
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn decode(&self, row: usize, chunk: usize, out: &mut [__m256; 8]) {
        let first = row * self.cols + chunk * 64;
        // SAFETY: in bounds per the contract.
        unsafe { fp4_codes(self.codes.as_ptr().add(first / 2), out) };
        let [even, odd] = self.chunk_scales(first);
        for v in 0..4 {
            out[v] = _mm256_mul_ps(out[v], even);
            out[v + 4] = _mm256_mul_ps(out[v + 4], odd);
        }
    }
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn decode_unscaled(
        &self,
        row: usize,
        chunk: usize,
        out: &mut [__m256; 8],
    ) -> Option<[__m256; 2]> {
        let first = row * self.cols + chunk * 64;
        // SAFETY: in bounds per the contract.
        unsafe { fp4_codes(self.codes.as_ptr().add(first / 2), out) };
        Some(self.chunk_scales(first))
    }
    fn scalar(&self, row: usize, col: usize) -> f32 {
        let scale = self.table[self.scales[(row * self.cols + col) / 16] as usize];
        E2M1[read_nibble(self.codes, row * self.cols + col)] * scale
    }
    fn chunk_address(&self, row: usize, chunk: usize) -> *const u8 {
        self.codes
            .as_ptr()
            .wrapping_add((row * self.cols + chunk * 64) / 2)
    }
}

impl Nvfp4Dec<'_> {
    /// Vectors 0-3 hold 16-blocks 0 | 2 of the chunk, vectors 4-7 blocks 1 | 3.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn chunk_scales(&self, first: usize) -> [__m256; 2] {
        let s = &self.scales[first / 16..first / 16 + 4];
        let t = |i: usize| self.table[s[i] as usize];
        [halves(t(0), t(2)), halves(t(1), t(3))]
    }
}

struct Mxfp4Dec<'a> {
    codes: &'a [u8],
    scales: &'a [u8],
    cols: usize,
}

impl Decoder for Mxfp4Dec<'_> {
    const CHUNK: usize = 64;
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn decode(&self, row: usize, chunk: usize, out: &mut [__m256; 8]) {
        let first = row * self.cols + chunk * 64;
        // SAFETY: in bounds per the contract.
        unsafe { fp4_codes(self.codes.as_ptr().add(first / 2), out) };
        let scale = self.chunk_scale(first);
        for o in out.iter_mut() {
            *o = _mm256_mul_ps(*o, scale);
        }
    }
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    unsafe fn decode_unscaled(
        &self,
        row: usize,
        chunk: usize,
        out: &mut [__m256; 8],
    ) -> Option<[__m256; 2]> {
        let first = row * self.cols + chunk * 64;
        // SAFETY: in bounds per the contract.
        unsafe { fp4_codes(self.codes.as_ptr().add(first / 2), out) };
        let scale = self.chunk_scale(first);
        Some([scale, scale])
    }
    fn scalar(&self, row: usize, col: usize) -> f32 {
        let scale = E8M0[self.scales[(row * self.cols + col) / 32] as usize];
        E2M1[read_nibble(self.codes, row * self.cols + col)] * scale
    }
    fn chunk_address(&self, row: usize, chunk: usize) -> *const u8 {
        self.codes
            .as_ptr()
            .wrapping_add((row * self.cols + chunk * 64) / 2)
    }
}

impl Mxfp4Dec<'_> {
    /// Lanes 0-3 come from the first 32-block, lanes 4-7 from the second.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn chunk_scale(&self, first: usize) -> __m256 {
        let s = &self.scales[first / 32..first / 32 + 2];
        halves(E8M0[s[0] as usize], E8M0[s[1] as usize])
    }
}

#[target_feature(enable = "avx2,fma")]
#[inline]
fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)))
}

/// GEMV path: rows in blocks of ROW_BLOCK, each block against every token
/// group of at most TOKEN_GROUP (a block's rows stay in cache between groups,
/// so memory is read once however many groups there are).
#[target_feature(enable = "avx2,fma")]
unsafe fn gemv_rows<D: Decoder>(dec: &D, job: &Job, rows: Range<usize>) {
    const ROW_BLOCK: usize = 12;
    const TOKEN_GROUP: usize = 4;
    let (cols, n_rows) = (job.weight.cols, job.weight.rows);
    let mut block = rows.start;
    while block < rows.end {
        let block_end = (block + ROW_BLOCK).min(rows.end);
        let mut t0 = 0;
        while t0 < job.tokens {
            let tn = (job.tokens - t0).min(TOKEN_GROUP);
            // SAFETY: token group t0..t0+tn is inside x and out.
            let (x, out) = unsafe { (job.x.as_ptr().add(t0 * cols), job.out.0.add(t0 * n_rows)) };
            let rows = block..block_end;
            // SAFETY: same contract; x/out cover tn tokens from here.
            unsafe {
                match tn {
                    1 => {
                        for r in rows {
                            *out.add(r) = gemv_row(dec, r, cols, x);
                        }
                    }
                    2 => gemv_block_rows::<D, 2, 2, 2>(dec, rows, cols, x, out, n_rows),
                    3 => gemv_block_rows::<D, 2, 3, 1>(dec, rows, cols, x, out, n_rows),
                    _ => gemv_block_rows::<D, 2, 4, 1>(dec, rows, cols, x, out, n_rows),
                }
            }
            t0 += tn;
        }
        block = block_end;
    }
}

/// One row against one token. The row is read as a single sequential stream
/// (interleaving several rows defeats the hardware prefetchers on rows of a
/// few KiB: measured 1.6× slower at 1 KiB rows); alternating two chunks
/// between two accumulator pairs hides the FMA latency.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn gemv_row<D: Decoder>(dec: &D, row: usize, cols: usize, x: *const f32) -> f32 {
    let chunks = cols / D::CHUNK;
    let mut even = [_mm256_setzero_ps(); 2];
    let mut odd = [_mm256_setzero_ps(); 2];
    let mut ch = 0;
    // SAFETY (all calls): chunks below `chunks` are whole and inside the row;
    // x holds cols values.
    while ch + 2 <= chunks {
        unsafe { chunk_dot(dec, row, ch, x, &mut even) };
        unsafe { chunk_dot(dec, row, ch + 1, x, &mut odd) };
        ch += 2;
    }
    if ch < chunks {
        unsafe { chunk_dot(dec, row, ch, x, &mut even) };
    }
    let v = _mm256_add_ps(
        _mm256_add_ps(even[0], even[1]),
        _mm256_add_ps(odd[0], odd[1]),
    );
    let mut sum = hsum(v);
    for c in chunks * D::CHUNK..cols {
        // SAFETY: c < cols.
        sum += dec.scalar(row, c) * unsafe { *x.add(c) };
    }
    sum
}

/// acc += chunk `ch` of `row` · the matching x values, into two accumulators.
/// Block-scaled formats scale the partial sums of each half (4 vectors).
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn chunk_dot<D: Decoder>(
    dec: &D,
    row: usize,
    ch: usize,
    x: *const f32,
    acc: &mut [__m256; 2],
) {
    let mut w = [_mm256_setzero_ps(); 8];
    let xo = ch * D::CHUNK;
    // SAFETY: the caller guarantees the chunk and its x values exist.
    let xv = |v: usize| unsafe { _mm256_loadu_ps(x.add(xo + 8 * v)) };
    if let Some(scales) = unsafe { dec.decode_unscaled(row, ch, &mut w) } {
        for (half, scale) in scales.into_iter().enumerate() {
            let v = 4 * half;
            let p = _mm256_mul_ps(w[v], xv(v));
            let p = _mm256_fmadd_ps(w[v + 1], xv(v + 1), p);
            let p = _mm256_fmadd_ps(w[v + 2], xv(v + 2), p);
            let p = _mm256_fmadd_ps(w[v + 3], xv(v + 3), p);
            acc[half] = _mm256_fmadd_ps(p, scale, acc[half]);
        }
        return;
    }
    unsafe { dec.decode(row, ch, &mut w) };
    for (v, wv) in w.iter().enumerate().take(D::VECS) {
        acc[v % 2] = _mm256_fmadd_ps(*wv, xv(v), acc[v % 2]);
    }
}

/// Rows in groups of R, the remainder one by one.
#[target_feature(enable = "avx2,fma")]
unsafe fn gemv_block_rows<D: Decoder, const R: usize, const T: usize, const A: usize>(
    dec: &D,
    rows: Range<usize>,
    cols: usize,
    x: *const f32,
    out: *mut f32,
    out_stride: usize,
) {
    let mut r = rows.start;
    // SAFETY (both loops): rows are inside the matrix, x/out cover T tokens.
    while r + R <= rows.end {
        unsafe { gemv::<D, R, T, A>(dec, r, cols, x, out, out_stride) };
        r += R;
    }
    while r < rows.end {
        unsafe { gemv::<D, 1, T, A>(dec, r, cols, x, out, out_stride) };
        r += 1;
    }
}

/// R rows × T tokens, A accumulators per pair (to hide FMA latency).
/// `x` is `[T][cols]` in chunk order; writes `out[t·out_stride + row]`.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn gemv<D: Decoder, const R: usize, const T: usize, const A: usize>(
    dec: &D,
    row0: usize,
    cols: usize,
    x: *const f32,
    out: *mut f32,
    out_stride: usize,
) {
    let chunks = cols / D::CHUNK;
    let mut acc = [[[_mm256_setzero_ps(); A]; T]; R];
    let mut w = [_mm256_setzero_ps(); 8];
    for ch in 0..chunks {
        let xo = ch * D::CHUNK;
        for (r, acc_r) in acc.iter_mut().enumerate() {
            // Rows are short streams (1.5-8 KiB) that hardware prefetchers
            // pick up late: fetch the same chunk of the next block's row.
            _mm_prefetch::<_MM_HINT_T0>(dec.chunk_address(row0 + r + R, ch) as *const i8);
            if T == 1 && A == 2 {
                // One token of a block-scaled format: scale the two partial
                // sums of 4 vectors instead of all 8 weight vectors.
                // SAFETY: chunk ch of row row0+r is inside the matrix.
                if let Some(scales) = unsafe { dec.decode_unscaled(row0 + r, ch, &mut w) } {
                    for (half, scale) in scales.into_iter().enumerate() {
                        // SAFETY: x holds cols values (T == 1).
                        let xv = |v: usize| unsafe { _mm256_loadu_ps(x.add(xo + 8 * v)) };
                        let v = 4 * half;
                        let p = _mm256_mul_ps(w[v], xv(v));
                        let p = _mm256_fmadd_ps(w[v + 1], xv(v + 1), p);
                        let p = _mm256_fmadd_ps(w[v + 2], xv(v + 2), p);
                        let p = _mm256_fmadd_ps(w[v + 3], xv(v + 3), p);
                        acc_r[0][half] = _mm256_fmadd_ps(p, scale, acc_r[0][half]);
                    }
                    continue;
                }
            }
            // SAFETY: chunk ch of row row0+r is inside the matrix.
            unsafe { dec.decode(row0 + r, ch, &mut w) };
            for (t, acc_rt) in acc_r.iter_mut().enumerate() {
                for (v, wv) in w.iter().enumerate().take(D::VECS) {
                    // SAFETY: x holds T rows of cols values.
                    let xv = unsafe { _mm256_loadu_ps(x.add(t * cols + xo + 8 * v)) };
                    acc_rt[v % A] = _mm256_fmadd_ps(*wv, xv, acc_rt[v % A]);
                }
            }
        }
    }
    for (r, acc_r) in acc.iter().enumerate() {
        for (t, acc_rt) in acc_r.iter().enumerate() {
            let mut v = acc_rt[0];
            for a in acc_rt.iter().skip(1) {
                v = _mm256_add_ps(v, *a);
            }
            let mut sum = hsum(v);
            for c in chunks * D::CHUNK..cols {
                // SAFETY: c < cols, t < T.
                sum += dec.scalar(row0 + r, c) * unsafe { *x.add(t * cols + c) };
            }
            // SAFETY: the caller owns this output.
            unsafe { *out.add(t * out_stride + row0 + r) = sum };
        }
    }
}

/// Panel path. For each block of PANELS × MR rows and each k range of at
/// most KC: decode the block's panels, then for each pair of token groups run
/// the microkernel against every panel, so the pair (2 × KC × 8 floats) is
/// reused from L2 by all panels instead of streamed again per panel.
#[target_feature(enable = "avx2,fma")]
unsafe fn panel_rows<D: Decoder>(dec: &D, job: &Job, rows: Range<usize>) {
    let (cols, n_rows, tokens) = (job.weight.cols, job.weight.rows, job.tokens);
    let groups = tokens.div_ceil(TG);
    if cols == 0 {
        // An empty sum: no k pass would write the outputs.
        for t in 0..tokens {
            for r in rows.clone() {
                // SAFETY: t < tokens, r < n_rows, and the unit owns row r.
                unsafe { *job.out.0.add(t * n_rows + r) = 0.0 };
            }
        }
        return;
    }
    let mut panels: [Panel; PANELS] = [[0.0f32; MR * KC + 8]; PANELS];
    let mut block = rows.start;
    while block < rows.end {
        let block_rows = (PANELS * MR).min(rows.end - block);
        let n_panels = block_rows.div_ceil(MR);
        let mut k0 = 0;
        while k0 < cols {
            let kc = KC.min(cols - k0);
            let stores: [Store; PANELS] = std::array::from_fn(|p| Store {
                out: job.out.0,
                n_rows,
                tokens,
                row0: block + p * MR,
                nr: MR.min(block_rows.saturating_sub(p * MR)),
                add: k0 > 0,
            });
            for (panel, store) in panels.iter_mut().zip(&stores).take(n_panels) {
                // SAFETY: the panel's rows and columns k0..k0+kc are inside the matrix.
                unsafe { pack_panel(dec, store.row0, store.nr, k0, kc, cols, panel) };
            }
            let xt = |g: usize| job.x[(g * cols + k0) * TG..].as_ptr();
            let mut g = 0;
            while g + 1 < groups {
                for (panel, store) in panels.iter().zip(&stores).take(n_panels) {
                    // SAFETY: groups g, g+1 hold kc·TG values from k0; panel holds MR·kc.
                    let acc = unsafe { kernel_6x16(panel.as_ptr(), kc, xt(g), xt(g + 1)) };
                    let halves: [[__m256; MR]; 2] = [
                        std::array::from_fn(|r| acc[r][0]),
                        std::array::from_fn(|r| acc[r][1]),
                    ];
                    for (half, acc_h) in halves.iter().enumerate() {
                        // SAFETY: the unit owns these rows of every token.
                        unsafe { store.write(g + half, acc_h) };
                    }
                }
                g += 2;
            }
            if g < groups {
                for (panel, store) in panels.iter().zip(&stores).take(n_panels) {
                    // SAFETY: as above, one group.
                    let acc = unsafe { kernel_6x8(panel.as_ptr(), kc, xt(g)) };
                    unsafe { store.write(g, &acc) };
                }
            }
            k0 += kc;
        }
        block += block_rows;
    }
}

/// A panel: `MR` rows × up to `KC` columns, k-major (`panel[k·MR + r]`, so
/// the microkernel's broadcasts walk one stream), plus slack for the
/// overlapping stores of `pack_panel`.
type Panel = [f32; MR * KC + 8];

/// Decodes rows `r0..r0+nr`, columns `k0..k0+kc` into `panel[(k − k0)·MR + r]`
/// (chunk order; rows nr..MR zero). Each decoded vector of the MR rows is
/// transposed in registers (8×8, two zero rows) and stored as 8 overlapping
/// groups of MR.
#[target_feature(enable = "avx2,fma")]
unsafe fn pack_panel<D: Decoder>(
    dec: &D,
    r0: usize,
    nr: usize,
    k0: usize,
    kc: usize,
    cols: usize,
    panel: &mut Panel,
) {
    let whole = cols / D::CHUNK * D::CHUNK;
    let chunk_end = whole.min(k0 + kc);
    let mut rows = [[_mm256_setzero_ps(); 8]; MR];
    let mut k = k0;
    while k < chunk_end {
        for (r, w) in rows.iter_mut().enumerate().take(nr) {
            // SAFETY: the chunk starting at k (k0 is a multiple of CHUNK) is whole.
            unsafe { dec.decode(r0 + r, k / D::CHUNK, w) };
        }
        // v picks the same vector of every row: a transpose, clearer indexed.
        #[allow(clippy::needless_range_loop)]
        for v in 0..D::VECS {
            let columns = transpose_8x8(std::array::from_fn(|r| {
                if r < MR {
                    rows[r][v]
                } else {
                    _mm256_setzero_ps()
                }
            }));
            let at = (k - k0 + 8 * v) * MR;
            for (i, column) in columns.iter().enumerate() {
                // SAFETY: at + i·MR + 8 <= MR·kc + 8, inside the panel's slack;
                // later stores overwrite the 2 spare lanes of earlier ones.
                unsafe { _mm256_storeu_ps(panel.as_mut_ptr().add(at + i * MR), *column) };
            }
        }
        k += D::CHUNK;
    }
    for c in chunk_end..k0 + kc {
        for r in 0..MR {
            panel[(c - k0) * MR + r] = if r < nr { dec.scalar(r0 + r, c) } else { 0.0 };
        }
    }
}

/// Rows → columns of an 8×8 block: `out[i][j] = rows[j][i]`.
#[target_feature(enable = "avx2,fma")]
#[inline]
fn transpose_8x8(r: [__m256; 8]) -> [__m256; 8] {
    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
    let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    [
        _mm256_permute2f128_ps::<0x20>(u0, u4),
        _mm256_permute2f128_ps::<0x20>(u1, u5),
        _mm256_permute2f128_ps::<0x20>(u2, u6),
        _mm256_permute2f128_ps::<0x20>(u3, u7),
        _mm256_permute2f128_ps::<0x31>(u0, u4),
        _mm256_permute2f128_ps::<0x31>(u1, u5),
        _mm256_permute2f128_ps::<0x31>(u2, u6),
        _mm256_permute2f128_ps::<0x31>(u3, u7),
    ]
}

/// MR rows × 2 token groups over kc columns.
#[target_feature(enable = "avx2,fma")]
unsafe fn kernel_6x16(
    panel: *const f32,
    kc: usize,
    xa: *const f32,
    xb: *const f32,
) -> [[__m256; 2]; MR] {
    let mut acc = [[_mm256_setzero_ps(); 2]; MR];
    for k in 0..kc {
        // SAFETY: k < kc; the caller sized panel and both groups.
        let (a, b) = unsafe {
            (
                _mm256_loadu_ps(xa.add(k * TG)),
                _mm256_loadu_ps(xb.add(k * TG)),
            )
        };
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let w = unsafe { _mm256_broadcast_ss(&*panel.add(k * MR + r)) };
            acc_r[0] = _mm256_fmadd_ps(w, a, acc_r[0]);
            acc_r[1] = _mm256_fmadd_ps(w, b, acc_r[1]);
        }
    }
    acc
}

/// MR rows × 1 token group over kc columns.
#[target_feature(enable = "avx2,fma")]
unsafe fn kernel_6x8(panel: *const f32, kc: usize, xa: *const f32) -> [__m256; MR] {
    let mut acc = [_mm256_setzero_ps(); MR];
    for k in 0..kc {
        // SAFETY: k < kc; the caller sized panel and the group.
        let a = unsafe { _mm256_loadu_ps(xa.add(k * TG)) };
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let w = unsafe { _mm256_broadcast_ss(&*panel.add(k * MR + r)) };
            *acc_r = _mm256_fmadd_ps(w, a, *acc_r);
        }
    }
    acc
}

/// Where a microkernel's `[row][token lane]` results go.
struct Store {
    out: *mut f32,
    n_rows: usize,
    tokens: usize,
    row0: usize,
    nr: usize,
    /// Add to `out` (later k passes) instead of overwriting it.
    add: bool,
}

impl Store {
    /// Writes group g's lanes of rows `row0..row0+nr` (tokens past the end skipped).
    /// Safety: the caller owns those outputs.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn write(&self, g: usize, acc: &[__m256; MR]) {
        for (r, v) in acc.iter().enumerate().take(self.nr) {
            let mut lanes = [0.0f32; TG];
            // SAFETY: lanes has 8 floats.
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), *v) };
            for (i, &value) in lanes.iter().enumerate() {
                let t = g * TG + i;
                if t >= self.tokens {
                    break;
                }
                // SAFETY: t < tokens, row0 + r < n_rows: inside out.
                let o = unsafe { &mut *self.out.add(t * self.n_rows + self.row0 + r) };
                *o = if self.add { *o + value } else { value };
            }
        }
    }
}
