//! Portable kernels: plain Rust, written so that the compiler can vectorise
//! the inner loops (fixed lane counts, independent accumulators). They run
//! where no SIMD path exists and serve as building blocks for the others.

use std::ops::Range;

use super::job::Job;
use crate::checkpoint::linear::{LinearWeight, WeightData, int4_element};
use crate::formats::{E2M1, E4M3, E8M0, MXFP4_GROUP, NVFP4_GROUP, fp8_value, read_bf16, read_f32};

/// Columns decoded at a time into a stack buffer.
const BLOCK: usize = 256;

/// `a·b + c`, fused where fusing is free (aarch64 has FMA in its baseline; on
/// x86-64 without the feature `mul_add` would be a slow library call).
#[inline(always)]
pub fn fmadd(a: f32, b: f32, c: f32) -> f32 {
    #[cfg(target_arch = "aarch64")]
    {
        a.mul_add(b, c)
    }
    #[cfg(not(target_arch = "aarch64"))]
    {
        a * b + c
    }
}

/// Σ a·b with 8 independent partial sums.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f32; 8];
    let mut chunks_a = a.chunks_exact(8);
    let mut chunks_b = b.chunks_exact(8);
    for (ca, cb) in (&mut chunks_a).zip(&mut chunks_b) {
        for l in 0..8 {
            acc[l] = fmadd(ca[l], cb[l], acc[l]);
        }
    }
    let mut tail = 0.0f32;
    for (&x, &y) in chunks_a.remainder().iter().zip(chunks_b.remainder()) {
        tail = fmadd(x, y, tail);
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// Decodes `W[row, start..start + out.len()]` into `out`.
pub fn decode_row(w: &LinearWeight, row: usize, start: usize, out: &mut [f32]) {
    let base = row * w.cols + start;
    match w.data {
        WeightData::F32(bytes) => {
            for (i, o) in out.iter_mut().enumerate() {
                *o = read_f32(bytes, base + i);
            }
        }
        WeightData::Bf16(bytes) => {
            for (i, o) in out.iter_mut().enumerate() {
                *o = read_bf16(bytes, base + i);
            }
        }
        WeightData::Nvfp4 {
            packed,
            scales,
            global,
        } => decode_fp4(packed, base, out, |c| {
            E4M3[scales[row * (w.cols / NVFP4_GROUP) + (start + c) / NVFP4_GROUP] as usize] * global
        }),
        WeightData::Mxfp4 { blocks, scales } => decode_fp4(blocks, base, out, |c| {
            E8M0[scales[row * (w.cols / MXFP4_GROUP) + (start + c) / MXFP4_GROUP] as usize]
        }),
        WeightData::Fp8 { values, scales } => {
            for (i, o) in out.iter_mut().enumerate() {
                *o = fp8_value(values[base + i], scales.at(row, start + i, w.cols));
            }
        }
        // GPTQ stores the matrix input-major: a row is gathered word by word
        // (slow, but this is the reference-shaped fallback; AVX2 has its own).
        WeightData::Int4 {
            qweight,
            qzeros,
            scales,
            group,
            zero_offset,
        } => {
            for (i, o) in out.iter_mut().enumerate() {
                *o = int4_element(
                    qweight,
                    qzeros,
                    scales,
                    group,
                    zero_offset,
                    w.rows,
                    row,
                    start + i,
                );
            }
        }
    }
}

/// FP4 codes from element `base` on, times `scale(i)` for the i-th output.
#[inline(always)]
fn decode_fp4(codes: &[u8], base: usize, out: &mut [f32], scale: impl Fn(usize) -> f32) {
    for (i, o) in out.iter_mut().enumerate() {
        let e = base + i;
        let byte = codes[e / 2];
        let code = if e.is_multiple_of(2) {
            byte & 0x0F
        } else {
            byte >> 4
        };
        *o = E2M1[code as usize] * scale(i);
    }
}

/// Computes rows `rows` of a job: decode a block of a row once, dot it with
/// every token's matching block.
pub(super) fn run_rows(job: &Job, rows: Range<usize>) {
    let w = &job.weight;
    let (cols, n_rows) = (w.cols, w.rows);
    let mut buf = [0.0f32; BLOCK];
    for r in rows {
        for t in 0..job.tokens {
            // SAFETY: r < rows and t < tokens, and this unit owns row r.
            unsafe { *job.out.0.add(t * n_rows + r) = 0.0 };
        }
        let mut start = 0;
        while start < cols {
            let len = BLOCK.min(cols - start);
            decode_row(w, r, start, &mut buf[..len]);
            for t in 0..job.tokens {
                let xs = &job.x[t * cols + start..t * cols + start + len];
                let partial = dot(&buf[..len], xs);
                // SAFETY: as above.
                unsafe { *job.out.0.add(t * n_rows + r) += partial };
            }
            start += len;
        }
    }
}
